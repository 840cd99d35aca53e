"""ARA export and reconstruction: registrations, limits, the browser/service round trip, bad input."""
import dataclasses
import json
import os
import random

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from araopt import Conversions, KeyDomain, Params, QueryParams, encode, measure
from araopt.ara.reconstruct import estimates_from_summary_report, implausible_negative_threshold
from araopt.ara.registrations import (
    AraLimitError,
    AraRequirements,
    KeyMap,
    SourceEncoder,
    TriggerEncoder,
    aggregation_key_names,
    ara_requirements,
    check_ara_limits,
    check_ara_limits_for_cardinalities,
    validate_source_registration,
    validate_trigger_registration,
)
from araopt.ara.simulate import browser_contributions, simulate_aggregation_service, simulate_browser
from araopt.constants import MAX_CLIP_THRESHOLD
from araopt.io import avro
from araopt.mechanism.keys import DATA, DECLARED, HISTORY
from araopt.publication import estimates_frame
from araopt.version import ParameterVersion
from chrome import chrome_sums, measure_unnoised
from factories import du_penc_frame, du_penc_params, history_version
from pipelines.ara import run_export_ara, run_reconstruct

SEED = 7


# ---- fixtures --------------------------------------------------------------------------------------


def du_penc_domain(params, origin=DECLARED):
    return KeyDomain.from_slice_values(("campaign",), {"campaign": np.array(["Thanksgiving", "Christmas"])},
                                       params.query_columns, origin=origin)


def synthetic_frame(n=3000, seed=3):
    """Impression features campaign (str) and city (int), conversion feature device (str); tied times."""
    rng = np.random.default_rng(seed)
    imp = rng.integers(0, 700, n)
    campaign = np.array(["spring", "summer", "fall", "winter", "xmas"])[imp % 5]
    city = (imp // 5) % 3 + 10
    return pd.DataFrame({
        "impression_id": imp,
        "conversion_time": pd.to_datetime(rng.integers(0, 40, n), unit="h", utc=True),  # many ties per impression
        "campaign": campaign, "city": city,
        "device": rng.choice(["desktop", "mobile", "tablet"], n),
        "items": rng.poisson(2.0, n).astype(float),
        "value": np.round(rng.lognormal(3.0, 1.0, n), 2),
    })


ENCODINGS = {
    "linf": dict(encoding="linf", queries=(QueryParams("items", 4.0, 0.3), QueryParams("value", 60.0, 0.7))),
    "l1-floor": dict(encoding="l1", queries=(QueryParams("items", 4.0), QueryParams("value", 60.0))),
    "l1-randomized": dict(encoding="l1", l1_rounding="randomized",
                          queries=(QueryParams("items", 4.0), QueryParams("value", 60.0))),
    "baseline": dict(encoding="baseline", count_budget_fraction=0.2,
                     queries=(QueryParams("items", 4.0, 0.3), QueryParams("value", 60.0, 0.5))),
}


def synthetic_params(name):
    return Params(count_limit=3, epsilon=4.0, slice_columns=("campaign", "city", "device"),
                  conversion_slice_columns=("device",), **ENCODINGS[name])


# ---- the paper's worked example --------------------------------------------------------------------
def test_worked_example_source_and_trigger_json():
    params = du_penc_params()
    domain = du_penc_domain(params)
    sources = SourceEncoder(params, domain, destination="https://dupenc.example")
    assert sources.registration({"campaign": "Thanksgiving"}) == {
        "destination": "https://dupenc.example",
        "aggregation_keys": {"items": "0x100", "value": "0x100", "bottom": "0x100"},
    }
    assert sources.registration({"campaign": "Christmas"})["aggregation_keys"] == {
        "items": "0x0", "value": "0x0", "bottom": "0x0"}
    triggers = TriggerEncoder(params, domain)
    # z1 = (3 items, $21): 16384, RR(11468.8) = 11469 for a uniform below 0.8, bottom 32768 - 16384 - 11469 = 4915
    z1 = triggers.registration({"items": 3, "value": 21.0}, uniforms=[0.5, 0.5])
    assert z1 == {
        "aggregatable_trigger_data": [{"key_piece": "0x1", "source_keys": ["items"]},
                                      {"key_piece": "0x2", "source_keys": ["value"]}],
        "aggregatable_values": {"items": 16384, "value": 11469, "bottom": 4915},
    }
    assert triggers.registration({"items": 3, "value": 21.0}, uniforms=[0.5, 0.9])["aggregatable_values"]["value"] == 11468
    # the browser ORs the pieces: exactly the buckets of (Thanksgiving, q) in the key domain
    got = browser_contributions(sources.registration({"campaign": "Thanksgiving"}), z1)
    thanksgiving = domain.slice_values()["campaign"].index("Thanksgiving")
    assert got == [(domain.bucket(thanksgiving, 0), 16384), (domain.bucket(thanksgiving, 1), 11469),
                   (domain.bucket(thanksgiving, 2), 4915)]
    for reg in (sources.registration({"campaign": "Thanksgiving"}), z1):
        json.dumps(reg)
    validate_source_registration(sources.registration({"campaign": "Thanksgiving"}))
    validate_trigger_registration(z1)


def test_zero_values_are_left_out_and_values_stay_in_ara_range():
    params = du_penc_params()
    triggers = TriggerEncoder(params, du_penc_domain(params))
    nothing = triggers.registration({"items": 0, "value": 0.0}, uniforms=[0.3, 0.3])
    assert nothing["aggregatable_values"] == {"bottom": 32768} and nothing["aggregatable_trigger_data"] == []
    full = triggers.registration({"items": 9, "value": 99.0}, uniforms=[0.3, 0.3])
    assert full["aggregatable_values"] == {"items": 16384, "value": 16384}  # bottom 0 omitted
    assert sum(full["aggregatable_values"].values()) == params.per_conversion_budget


def test_key_names_are_unique_short_and_sanitised():
    queries = tuple(QueryParams(c, 1.0, 0.25) for c in
                    ("purchase value in euros (gross)", "purchase value in euros (net)", "bottom", "x"))
    params = Params(count_limit=1, encoding="linf", epsilon=1.0, slice_columns=("s",), queries=queries)
    names = aggregation_key_names(params)
    assert len(set(names)) == 5 and all(len(n) <= 25 for n in names) and names[-1] == "bottom"
    assert names[0] == "purchase_value_in_euros__" and names[1] == "purchase_value_in_euros_1" and names[2] == "bottom_1"
    baseline = Params(count_limit=1, encoding="baseline", epsilon=1.0, slice_columns=("s",), count_budget_fraction=0.5,
                      queries=(QueryParams("v", 1.0, 0.5),))
    assert aggregation_key_names(baseline) == ("v", "count")


# ---- the encoder for ad servers matches the core encoder -------------------------------------------
def assert_same_or_core_bug(got, want, params):
    """The trigger encoder equals the core encoder and stays within the budget."""
    got, want = np.asarray(got), np.asarray(want)
    assert (got >= 0).all() and (got.sum(axis=1) <= params.per_conversion_budget).all()
    assert np.array_equal(got, want)


def test_core_l1_randomized_never_exceeds_the_budget():
    """Regression: floor(budget + offset) once rounded up to budget + 1 for offsets within ~2^-39 of 1."""
    params = Params(count_limit=3, encoding="l1", l1_rounding="randomized", epsilon=1.0, slice_columns=("s",),
                    queries=(QueryParams("a", 1.0), QueryParams("b", 1.0)))
    out = encode(np.array([[5.0, 0.0]]), params, uniforms=np.array([[1.0 - 2.0**-53]]))
    assert (out >= 0).all() and out[0, :2].sum() <= params.per_conversion_budget


@pytest.mark.parametrize("name", sorted(ENCODINGS))
def test_trigger_encoder_equals_core_encode_on_rounding_boundaries(name):
    """Values on the rounding grid (omega at or 1 ulp from an integer) with uniforms 0: any difference
    in floating-point arithmetic between the two encoders changes a rounded value here."""
    from araopt.mechanism.encoding import query_scales

    rng = np.random.default_rng(11)
    d = 10  # >= 8 exercises numpy's pairwise summation in the L1 norm
    thresholds = rng.uniform(0.1, 100.0, d).round(3)
    spec = ENCODINGS[name]
    if spec["encoding"] == "l1":
        queries = tuple(QueryParams(f"q{i}", t) for i, t in enumerate(thresholds))
    else:
        share = 0.8 if spec["encoding"] == "baseline" else 1.0
        queries = tuple(QueryParams(f"q{i}", t, share / d) for i, t in enumerate(thresholds))
    params = Params(count_limit=3, encoding=spec["encoding"], epsilon=1.0, slice_columns=("s",), queries=queries,
                    **{k: v for k, v in spec.items() if k in ("l1_rounding", "count_budget_fraction")})
    scales = query_scales(params).astype(float)
    n = 3000
    grid = rng.integers(0, scales.astype(int) + 1, (n, d)) / scales * thresholds
    sparse = rng.random((n, d)) < 0.7  # L1: many rows with a small norm, so no shrinking
    values = np.where(sparse, 0.0, grid) if spec["encoding"] == "l1" else grid
    values = np.nextafter(values, np.where(rng.random((n, d)) < 0.5, 0.0, np.inf)) * (rng.random((n, d)) < 0.5) + \
        values * (rng.random((n, d)) >= 0.5)
    if spec["encoding"] == "l1":  # rows with norm N > 1 whose shrunk values u_l = k_l land on integers
        target = (params.contribution_budget / params.count_limit if params.l1_rounding == "floor"
                  else params.per_conversion_budget)
        k = rng.multinomial(params.per_conversion_budget, np.full(d, 1.0 / d), size=n // 2).astype(float)
        k[:, -1] += target - params.per_conversion_budget  # sum k_l = the scale S of Alg. 6
        norm = rng.uniform(1.0, 6.0, (n // 2, 1))
        values[: n // 2] = k * norm / target * thresholds
    values = np.abs(values)
    clipped = rng.random((n, d)) < 0.1
    values[clipped] = (thresholds * rng.choice([1.0, 1.5, 1e6], (n, d)))[clipped]  # at or above C_l
    for u in (0.0, 1.0 - 2.0**-53):
        uniforms = np.full((n, d), u)
        want = encode(values, params, uniforms=uniforms)
        if spec["encoding"] != "l1":
            assert (want >= 0).all() and (want[:, :d] <= scales).all()  # Lemma 4.1: w_l <= scale, bottom >= 0
        domain = KeyDomain.from_slice_values(("s",), {"s": np.array([0])}, params.query_columns,
                                             baseline=spec["encoding"] == "baseline")
        enc = TriggerEncoder(params, domain)
        names = params.query_columns
        got = np.array([enc.contributions(dict(zip(names, row, strict=True)), uniforms=uniforms[i])
                        for i, row in enumerate(values.tolist())])
        assert_same_or_core_bug(got, want, params)


def test_trigger_encoder_randomness_sources():
    params = du_penc_params()
    enc = TriggerEncoder(params, du_penc_domain(params))
    record = {"items": 1, "value": 21.0}
    # a numpy Generator draws the same stream encode() would
    got = [enc.contributions(record, rng=np.random.default_rng(s)) for s in range(20)]
    want = [tuple(encode(np.array([[1.0, 21.0]]), params, np.random.default_rng(s))[0]) for s in range(20)]
    assert got == want
    assert enc.contributions(record, rng=random.Random(1)) in {(8192, 11468, 13108), (8192, 11469, 13107)}
    # default: the OS CSPRNG; RR(11468.8) is 11469 about 80% of the time
    ups = sum(enc.contributions(record)[1] == 11469 for _ in range(2000))
    assert 0.8 * 2000 - 5 * 18 < ups < 0.8 * 2000 + 5 * 18
    with pytest.raises(ValueError, match="'value' is missing"):
        enc.registration({"items": 1})
    with pytest.raises(ValueError, match="finite and >= 0"):
        enc.registration({"items": -1, "value": 2})
    with pytest.raises(ValueError, match="uniforms"):
        enc.registration(record, uniforms=[0.5])


# ---- consistency: OR of the pieces = the pipeline's bucket -----------------------------------------
@given(st.data())
def test_or_of_source_and_trigger_pieces_is_the_pipeline_bucket(data):
    k_imp = data.draw(st.integers(0, 3))
    k_conv = data.draw(st.integers(0, 2))
    cols = [f"i{j}" for j in range(k_imp)] + [f"c{j}" for j in range(k_conv)]
    if not cols:
        cols = ["i0"]
        k_imp = 1
    n = data.draw(st.integers(1, 30))
    values = {c: np.array(data.draw(st.lists(st.integers(0, 40), min_size=n, max_size=n))) for c in cols}
    d = data.draw(st.integers(1, 5))
    params = Params(count_limit=2, encoding="linf", epsilon=1.0, slice_columns=tuple(cols),
                    conversion_slice_columns=tuple(cols[k_imp:]),
                    queries=tuple(QueryParams(f"q{q}", 1.0, 1.0 / d) for q in range(d)))
    domain = KeyDomain.from_slice_values(cols, values, params.query_columns,
                                         conversion_slice_columns=params.conversion_slice_columns)
    sources, triggers = SourceEncoder(params, domain), TriggerEncoder(params, domain)
    slice_values = domain.slice_values()
    for s in range(domain.num_slices):
        row = {c: slice_values[c][s] for c in cols}
        source = sources.registration(row)
        pieces = triggers.pieces(row)
        for col, name in enumerate(triggers.key_names):
            piece = int(pieces[col], 16) if pieces[col] is not None else 0
            assert int(source["aggregation_keys"][name], 16) | piece == domain.bucket(s, col)


# ---- the round trip ------------------------------------------------------------------------------
def _simulate_browser_and_service(export_dir, params, seed, tmp_path, debug=False, shuffle_seed=0):
    """Browser (OR of pieces, Alg. 1) over the exported JSON, then the Aggregation Service (sum + noise) -> Avro."""
    with open(os.path.join(export_dir, "sources.json")) as fh:
        sources = [r["registration"] for r in json.load(fh)["registrations"]]
    with open(os.path.join(export_dir, "private", "triggers.jsonl")) as fh:
        lines = [json.loads(line) for line in fh]
    for s in sources:
        validate_source_registration(s)
    for line in lines:
        validate_trigger_registration(line["registration"])
    browser = simulate_browser(sources, [x["source_index"] for x in lines], np.array([x["impression_id"] for x in lines]),
                               np.array([x["conversion_time_us"] for x in lines]), [x["registration"] for x in lines],
                               params.contribution_budget)
    domain_buckets = avro.read_output_domain(os.path.join(export_dir, "output_domain.avro"))
    key_map = KeyMap.load(os.path.join(export_dir, "key_map.json"))
    key_id = {b: i for i, b in enumerate(key_map.domain.buckets())}
    service = simulate_aggregation_service(browser.reports, domain_buckets, params.epsilon, seed, params.contribution_budget,
                                           key_ids=[key_id[b] for b in domain_buckets])
    order = np.random.default_rng(shuffle_seed).permutation(len(domain_buckets))  # the service's row order is arbitrary
    path = tmp_path / ("debug.avro" if debug else "summary.avro")
    if debug:
        tags = [["in_domain", "in_reports"] if r else ["in_domain"] for r in service.in_reports]
        avro.write_debug_report(path, [domain_buckets[i] for i in order], service.unnoised[order], service.noise[order],
                                [tags[i] for i in order])
    else:
        avro.write_summary_report(path, [domain_buckets[i] for i in order], service.noisy[order])
    return browser, service, path


@pytest.mark.parametrize("name", sorted(ENCODINGS))
def test_round_trip_export_browser_service_reconstruct_equals_measure(name, tmp_path, capsys):
    params = synthetic_params(name)
    ParameterVersion(params).save(tmp_path / "params.json")
    frame = synthetic_frame()
    frame.to_parquet(tmp_path / "log.parquet")
    export = tmp_path / "export"
    assert run_export_ara(["--params", str(tmp_path / "params.json"), "--out", str(export), "--conversions",
                           str(tmp_path / "log.parquet"), "--simulation-seed", str(SEED)]) == 0
    browser, service, report = _simulate_browser_and_service(export, params, SEED, tmp_path)
    out = tmp_path / "estimates.csv"
    assert run_reconstruct(["--summary-report", str(report), "--params", str(tmp_path / "params.json"),
                            "--key-map", str(export / "key_map.json"), "--out", str(out)]) == 0
    assert "report rows matched" in capsys.readouterr().out.strip().splitlines()[-1]  # one sentence
    summary = json.loads((tmp_path / "estimates.summary.json").read_text())
    # the core on the same data and seed
    conv = Conversions.from_table(frame, params.slice_columns, params.query_columns)
    m = measure(conv, params, simulation_seed=SEED)
    assert int(browser.kept.sum()) == int(m.kept.sum()) and m.rows_capped > 0  # Alg. 1 drops conversions here
    assert np.array_equal(service.unnoised, m.histogram.ravel())
    assert np.array_equal(service.noisy, m.report.noisy.ravel())
    got = pd.read_csv(out)
    want = estimates_frame(m.estimates, m.domain)
    assert list(got.columns) == list(want.columns)
    for c in ("campaign", "device", "query"):
        assert got[c].astype(str).tolist() == want[c].astype(str).tolist()
    assert got["city"].tolist() == want["city"].tolist()
    for c in ("estimate", "std_error", "ci_low", "ci_high"):
        assert np.array_equal(got[c].to_numpy(), want[c].to_numpy()), c
    assert summary["matched"] == m.domain.num_keys and summary["unknown_buckets"] == 0 and summary["missing_buckets"] == 0


def test_round_trip_through_the_debug_report_and_worked_example(tmp_path, capsys):
    params = du_penc_params()
    ParameterVersion(params).save(tmp_path / "params.json")
    du_penc_frame().to_parquet(tmp_path / "log.parquet")
    export = tmp_path / "export"
    assert run_export_ara(["--params", str(tmp_path / "params.json"), "--out", str(export), "--conversions",
                           str(tmp_path / "log.parquet"), "--simulation-seed", "1"]) == 0
    browser, _, report = _simulate_browser_and_service(export, params, 1, tmp_path, debug=True)
    assert browser.kept.tolist() == [True, True, True, True, False, True, True]  # z4 of impression 123 is dropped
    out = tmp_path / "est.csv"
    assert run_reconstruct(["--summary-report", str(report), "--params", str(tmp_path / "params.json"),
                            "--key-map", str(export / "key_map.json"), "--out", str(out)]) == 0
    assert json.loads((tmp_path / "est.summary.json").read_text())["report_kind"] == "DebugAggregatedFact"
    m = measure(Conversions.from_table(du_penc_frame(), ["campaign"], ["items", "value"]), params, simulation_seed=1)
    assert np.array_equal(pd.read_csv(out)["estimate"].to_numpy(), m.estimates.estimate.ravel())


# ---- limits ---------------------------------------------------------------------------------------
def _requirements(**kw):
    base = dict(keys_per_source=3, max_value=32768, max_trigger_total=32768, slice_bits=4, max_key_name_length=6,
                reports_per_source=2, reports_per_source_guaranteed=True, contribution_budget=65536, num_queries=2)
    base.update(kw)
    return AraRequirements(**base)


def test_each_limit_violation_gives_its_message():
    assert _requirements().violations() == []
    cases = {
        "aggregation keys per source: 21 (2 value queries + 1 bottom) > ARA limit 20 (exceeds by 1)":
            dict(keys_per_source=21),
        "aggregatable value: up to 70000 > ARA limit 65536 (exceeds by 4464)": dict(max_value=70000),
        "aggregatable values per trigger: total up to 65537 > ARA contribution budget 65536 (exceeds by 1)":
            dict(max_trigger_total=65537),
        "key bits: 125 slice bits + 8 query bits = 133 > ARA limit 128 (exceeds by 5)": dict(slice_bits=125),
        "aggregation key name length: 30 > ARA limit 25 (exceeds by 5)": dict(max_key_name_length=30),
        "aggregatable reports per source: count_limit C = 23 conversions per impression > ARA limit 20 reports per "
        "source (exceeds by 3)": dict(reports_per_source=23),
    }
    for message, kw in cases.items():
        (got,) = _requirements(**kw).violations()
        assert got.startswith(message), got
    assert _requirements(reports_per_source=30, reports_per_source_guaranteed=False).violations() == []
    # more than 20 baseline conversions fitting the budget is no difference: the simulation keeps 20 too
    assert _requirements(reports_per_source=30, reports_per_source_guaranteed=False).warnings() == []


def test_limits_from_parameters():
    many = tuple(QueryParams(f"q{i}", 1.0, 1 / 20) for i in range(20))
    params = Params(count_limit=2, encoding="linf", epsilon=1.0, slice_columns=("s",), queries=many)
    with pytest.raises(AraLimitError, match=r"aggregation keys per source: 21 .*exceeds by 1"):
        check_ara_limits_for_cardinalities(params, [3])
    with pytest.raises(AraLimitError,
                       match=r"key bits: 122 slice bits \+ 8 query bits = 130 > ARA limit 128 \(exceeds by 2\)"):
        check_ara_limits_for_cardinalities(du_penc_params(), [2**30] * 4 + [4])
    with pytest.raises(AraLimitError, match=r"count_limit C = 21 .*exceeds by 1"):
        check_ara_limits_for_cardinalities(du_penc_params(count_limit=21), [2])
    # a parameter file from a future ARA with a larger budget: values above 65536 (Params itself refuses it today)
    future = du_penc_params(count_limit=1)
    object.__setattr__(future, "contribution_budget", 2**17)
    with pytest.raises(AraLimitError) as err:
        check_ara_limits_for_cardinalities(future, [2])
    assert [v.split(":")[0] for v in err.value.violations] == ["aggregatable value", "aggregatable values per trigger"]
    assert "exceeds by 65536" in err.value.violations[0]
    # several violations are reported together
    with pytest.raises(AraLimitError, match=r"aggregation keys per source.*; key bits"):
        check_ara_limits_for_cardinalities(params, [2**64, 2**64])
    req = ara_requirements(du_penc_params(), [2])
    assert (req.keys_per_source, req.max_value, req.key_bits) == (3, 32768, du_penc_domain(du_penc_params()).total_bits)


def test_export_refuses_before_writing_anything(tmp_path, capsys):
    many = tuple(QueryParams(f"q{i}", 1.0, 1 / 20) for i in range(20))
    params = Params(count_limit=2, encoding="linf", epsilon=1.0, slice_columns=("campaign",), queries=many)
    ParameterVersion(params).save(tmp_path / "p.json")
    out = tmp_path / "out"
    assert run_export_ara(["--params", str(tmp_path / "p.json"), "--out", str(out), "--conversions", "missing.parquet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "aggregation keys per source: 21" in err and "exceeds by 1" in err
    assert not out.exists()
    # 121 two-valued slice columns: 121 + 8 = 129 bits
    cols = [f"c{i}" for i in range(121)]
    frame = pd.DataFrame({"impression_id": [1, 2], "conversion_time": pd.to_datetime([1, 2], unit="h", utc=True),
                          **{c: [0, 1] for c in cols}, "v": [1.0, 2.0]})
    frame.to_parquet(tmp_path / "wide.parquet")
    ParameterVersion(Params(count_limit=2, encoding="linf", epsilon=1.0, slice_columns=tuple(cols),
                            queries=(QueryParams("v", 1.0, 1.0),))).save(tmp_path / "wide.json")
    assert run_export_ara(["--params", str(tmp_path / "wide.json"), "--out", str(out), "--conversions",
                           str(tmp_path / "wide.parquet")]) == 2
    assert "key bits: 121 slice bits + 8 query bits = 129 > ARA limit 128 (exceeds by 1)" in capsys.readouterr().err
    assert not out.exists()


def test_export_without_domain_source_and_overwrite_guard(tmp_path, capsys):
    ParameterVersion(du_penc_params()).save(tmp_path / "p.json")
    assert run_export_ara(["--params", str(tmp_path / "p.json"), "--out", str(tmp_path / "o")]) == 2
    assert "needs the key domain" in capsys.readouterr().err
    du_penc_frame().to_parquet(tmp_path / "log.parquet")
    args = ["--params", str(tmp_path / "p.json"), "--out", str(tmp_path / "o"),
            "--conversions", str(tmp_path / "log.parquet")]
    # the log's slices as the output domain and its triggers: a simulation only (red team, round seventeen)
    assert run_export_ara(args) == 2
    assert "derived from the data it describes" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    args += ["--simulation-seed", "1"]
    assert run_export_ara(args) == 0
    assert run_export_ara(args) == 2 and "--overwrite" in capsys.readouterr().err
    assert run_export_ara(args + ["--overwrite"]) == 0


def test_export_with_a_declared_key_map_counts_conversions_it_cannot_register(tmp_path, capsys):
    params = du_penc_params()
    ParameterVersion(params).save(tmp_path / "p.json")
    domain = du_penc_domain(params)
    (tmp_path / "km.json").write_text(json.dumps(domain.to_json(ParameterVersion(params).checksum())))
    frame = du_penc_frame()
    frame.loc[2, "campaign"] = "Easter"  # impression 456's only conversion
    frame.to_parquet(tmp_path / "log.parquet")
    assert run_export_ara(["--params", str(tmp_path / "p.json"), "--out", str(tmp_path / "o"), "--key-map",
                           str(tmp_path / "km.json"), "--conversions", str(tmp_path / "log.parquet")]) == 0
    assert "impression_slice_not_in_domain': 1" in capsys.readouterr().err
    summary = json.loads((tmp_path / "o" / "export.json").read_text())
    assert summary["triggers"] == 6 and summary["triggers_skipped"] == {"impression_slice_not_in_domain": 1}
    assert len((tmp_path / "o" / "private" / "triggers.jsonl").read_text().splitlines()) == 6


def test_export_refuses_a_data_derived_key_map_as_measure_does(tmp_path, capsys):
    """A key map of origin data (export-ara --conversions wrote it from a log) as --key-map: the registrations
    would put a data-derived domain into the Aggregation Service's output domain; refused in one line at
    export (measure refuses it later), except in simulation."""
    params = du_penc_params()
    ParameterVersion(params).save(tmp_path / "p.json")
    du_penc_frame().to_parquet(tmp_path / "log.parquet")
    base = ["--params", str(tmp_path / "p.json"), "--key-map", str(tmp_path / "km.json")]
    (tmp_path / "km.json").write_text(json.dumps(du_penc_domain(params, DATA).to_json(ParameterVersion(params).checksum())))
    assert run_export_ara([*base, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "derived from the data" in err and f"--key-map {tmp_path / 'km.json'}" in err, err
    assert not (tmp_path / "o").exists()
    assert run_export_ara([*base, "--out", str(tmp_path / "sim"), "--conversions", str(tmp_path / "log.parquet"),
                           "--simulation-seed", "1"]) == 0, capsys.readouterr().err
    (tmp_path / "km.json").write_text(json.dumps(du_penc_domain(params).to_json(ParameterVersion(params).checksum())))
    assert run_export_ara([*base, "--out", str(tmp_path / "o")]) == 0, capsys.readouterr().err  # declared: fine


def test_export_refuses_the_triggers_of_the_versions_own_training_history(tmp_path, capsys):
    """export-ara --conversions of the log a version was learnt on, without a seed: the Aggregation
    Service would release those triggers over the output domain with parameters read from them (red team,
    round sixteen); refused in one line as measure refuses it, whatever the key map (a declared one gets
    the version's end), nothing written; in simulation, or for conversions after the end, exported."""
    params = du_penc_params()
    frame = du_penc_frame()
    frame.to_parquet(tmp_path / "log.parquet")
    end = pd.Timestamp(frame["conversion_time"].max()) + pd.Timedelta(microseconds=1)
    learnt = history_version(params, {"campaign": frame["campaign"].to_numpy()}, end)
    learnt.save(tmp_path / "learnt.json")
    (tmp_path / "km.json").write_text(json.dumps(du_penc_domain(params).to_json(learnt.checksum())))
    base = ["--params", str(tmp_path / "learnt.json"), "--conversions", str(tmp_path / "log.parquet")]
    for extra in ([], ["--key-map", str(tmp_path / "km.json")]):
        assert run_export_ara([*base, *extra, "--out", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "training history whose last conversion is at 1970-01-01T07:00:00" in err, err
        assert not (tmp_path / "o").exists()
    assert run_export_ara([*base, "--out", str(tmp_path / "sim"), "--simulation-seed", "1"]) == 0, capsys.readouterr()
    start = pd.Timestamp(frame["conversion_time"].min())  # a history that ended before these conversions
    history_version(params, {"campaign": frame["campaign"].to_numpy()}, start).save(tmp_path / "before.json")
    assert run_export_ara(["--params", str(tmp_path / "before.json"), "--conversions", str(tmp_path / "log.parquet"),
                           "--out", str(tmp_path / "o")]) == 0, capsys.readouterr().err


def test_export_triggers_are_labelled_operator_private(tmp_path, capsys):
    """triggers.jsonl carries each conversion's raw impression id and time: it is written under private/
    beside a README that says never to publish it, and the console names it operator-private."""
    ParameterVersion(du_penc_params()).save(tmp_path / "p.json")
    du_penc_frame().to_parquet(tmp_path / "log.parquet")
    assert run_export_ara(["--params", str(tmp_path / "p.json"), "--out", str(tmp_path / "o"), "--conversions",
                           str(tmp_path / "log.parquet"), "--simulation-seed", "1"]) == 0
    out = capsys.readouterr().out
    assert not (tmp_path / "o" / "triggers.jsonl").exists()
    lines = (tmp_path / "o" / "private" / "triggers.jsonl").read_text().splitlines()
    assert {json.loads(line)["impression_id"] for line in lines} == set(du_penc_frame()["impression_id"])
    assert "DO NOT PUBLISH" in (tmp_path / "o" / "private" / "README.txt").read_text()
    private_line = next(line for line in out.splitlines() if "triggers.jsonl" in line)
    assert "operator-private" in private_line and "never publish" in private_line
    assert str(tmp_path / "o" / "private" / "triggers.jsonl") in private_line


# ---- reconstruct: bad input ---------------------------------------------------------------------
def _small_release(tmp_path):
    params = du_penc_params()
    ParameterVersion(params).save(tmp_path / "p.json")
    domain = du_penc_domain(params)
    (tmp_path / "km.json").write_text(json.dumps(domain.to_json(ParameterVersion(params).checksum())))
    metrics = np.arange(1, domain.num_keys + 1, dtype=np.int64) * 1000
    return params, domain, metrics


def test_unknown_buckets_are_counted_reported_and_written(tmp_path, capsys):
    params, domain, metrics = _small_release(tmp_path)
    buckets = domain.buckets() + [0xABC00, 0xABC01]
    avro.write_summary_report(tmp_path / "r.avro", buckets, list(metrics) + [77, -5])
    frame, counters = estimates_from_summary_report(buckets, np.append(metrics, [77, -5]), params, domain)
    assert counters.unknown_buckets == 2 and counters.unknown_metric_sum == 72 and counters.matched == domain.num_keys
    assert not frame["estimate"].isna().any()
    out = tmp_path / "e.csv"
    assert run_reconstruct(["--summary-report", str(tmp_path / "r.avro"), "--params", str(tmp_path / "p.json"),
                            "--key-map", str(tmp_path / "km.json"), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "2 bucket(s) of the report are not in the key map" in captured.err
    assert json.loads((tmp_path / "e.summary.json").read_text())["unknown_buckets"] == 2
    side = pd.read_csv(tmp_path / "e.unknown_buckets.csv")
    assert side["bucket"].tolist() == [f"0x{0xABC00:032x}", f"0x{0xABC01:032x}"] and side["metric"].tolist() == [77, -5]
    # a report none of whose buckets is known: wrong key map
    avro.write_summary_report(tmp_path / "other.avro", [0xABC00], [1])
    assert run_reconstruct(["--summary-report", str(tmp_path / "other.avro"), "--params", str(tmp_path / "p.json"),
                            "--key-map", str(tmp_path / "km.json"), "--out", str(out)]) == 2
    assert "already exists; pass --overwrite" in capsys.readouterr().err  # the same overwrite rule everywhere
    assert run_reconstruct(["--summary-report", str(tmp_path / "other.avro"), "--params", str(tmp_path / "p.json"),
                            "--key-map", str(tmp_path / "km.json"), "--out", str(out), "--overwrite"]) == 2
    assert "none of the 1 buckets" in capsys.readouterr().err


def test_missing_negative_and_huge_metrics(tmp_path):
    params, domain, metrics = _small_release(tmp_path)
    buckets = domain.buckets()
    metrics = metrics.copy()
    metrics[0] = -5                       # plausible noise
    floor = implausible_negative_threshold(params.epsilon)
    metrics[1] = -(floor + 1)             # not plausible at epsilon = 8
    metrics[3] = 2**60                    # beyond 2^53: skipped, NaN
    frame, counters = estimates_from_summary_report(buckets[:-1], metrics[:-1], params, domain)  # last bucket missing
    assert counters.negative_metrics == 2 and counters.implausible_negative_metrics == 1
    assert counters.huge_metrics == 1 and counters.missing_buckets == 1 and counters.incomplete_slices == 1
    # slice 1 (Thanksgiving) lost its items metric (huge) and its bottom (missing): count and items are NaN
    nan = frame[frame["estimate"].isna()]
    assert nan["campaign"].tolist() == ["Thanksgiving"] * 2 and nan["query"].tolist() == ["count", "items"]
    assert not frame[frame["campaign"] == "Christmas"]["estimate"].isna().any()
    with pytest.raises(ValueError, match="appears 2 times"):
        estimates_from_summary_report(buckets + [buckets[0]], np.append(metrics, 1), params, domain)


def test_parameter_file_that_does_not_match_the_key_map(tmp_path, capsys):
    params, domain, metrics = _small_release(tmp_path)
    avro.write_summary_report(tmp_path / "r.avro", domain.buckets(), metrics)
    ParameterVersion(du_penc_params(count_limit=3)).save(tmp_path / "other.json")
    args = ["--summary-report", str(tmp_path / "r.avro"), "--key-map", str(tmp_path / "km.json"),
            "--out", str(tmp_path / "e.csv")]
    assert run_reconstruct(args + ["--params", str(tmp_path / "other.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not match key map" in err and "params_sha256" in err
    # a key map without the parameters' checksum cannot be checked: refused, not skipped
    wrong = KeyDomain.from_slice_values(("campaign",), {"campaign": np.array(["a"])}, ("items",))
    (tmp_path / "km2.json").write_text(json.dumps(wrong.to_json(None)))
    assert run_reconstruct(["--summary-report", str(tmp_path / "r.avro"), "--key-map", str(tmp_path / "km2.json"),
                            "--out", str(tmp_path / "e.csv"), "--params", str(tmp_path / "p.json")]) == 2
    assert "key map has no params_sha256" in capsys.readouterr().err
    # the right checksum on a structurally different key map (edited by hand)
    (tmp_path / "km3.json").write_text(json.dumps(wrong.to_json(ParameterVersion(params).checksum())))
    assert run_reconstruct(["--summary-report", str(tmp_path / "r.avro"), "--key-map", str(tmp_path / "km3.json"),
                            "--out", str(tmp_path / "e.csv"), "--params", str(tmp_path / "p.json")]) == 2
    assert "queries ['items'] != ['items', 'value']" in capsys.readouterr().err
    assert not (tmp_path / "e.csv").exists()
    with pytest.raises(ValueError, match="does not match"):
        check_ara_limits(params, wrong)


def test_reconstruct_with_the_epsilon_of_the_aggregation_job(tmp_path, capsys):
    params, domain, metrics = _small_release(tmp_path)
    avro.write_summary_report(tmp_path / "r.avro", domain.buckets(), metrics)
    base = ["--summary-report", str(tmp_path / "r.avro"), "--params", str(tmp_path / "p.json"), "--key-map",
            str(tmp_path / "km.json")]
    assert run_reconstruct(base + ["--out", str(tmp_path / "a.csv")]) == 0
    assert run_reconstruct(base + ["--out", str(tmp_path / "b.csv"), "--epsilon", "2"]) == 0  # key map of the file as is
    a, b = pd.read_csv(tmp_path / "a.csv"), pd.read_csv(tmp_path / "b.csv")
    assert np.array_equal(a["estimate"], b["estimate"]) and (b["std_error"] > a["std_error"]).all()
    # a key map recorded after an epsilon override (as measure --epsilon writes it) needs the same override
    (tmp_path / "km.json").write_text(json.dumps(domain.to_json(ParameterVersion(params.with_epsilon(2.0)).checksum())))
    assert run_reconstruct(base + ["--out", str(tmp_path / "c.csv"), "--epsilon", "2"]) == 0
    assert run_reconstruct(base + ["--out", str(tmp_path / "d.csv")]) == 2
    assert "does not match key map" in capsys.readouterr().err


def test_reconstruct_refuses_other_avro_and_needs_a_key_map(tmp_path, capsys):
    params, domain, metrics = _small_release(tmp_path)
    avro.write_output_domain(tmp_path / "domain.avro", domain.buckets())
    base = ["--params", str(tmp_path / "p.json"), "--out", str(tmp_path / "e.csv")]
    assert run_reconstruct(["--summary-report", str(tmp_path / "domain.avro"),
                            "--key-map", str(tmp_path / "km.json")] + base) == 2
    err = capsys.readouterr().err
    assert "domain.avro: Avro schema AggregationBucket" in err and err.count("\n") == 1
    avro.write_summary_report(tmp_path / "r.avro", domain.buckets(), metrics)
    assert run_reconstruct(["--summary-report", str(tmp_path / "r.avro")] + base) == 2
    assert "needs the key map" in capsys.readouterr().err
    assert run_reconstruct(["--summary-report", str(tmp_path / "r.avro"), "--key-map", str(tmp_path / "km.json"),
                            "--confidence", "1.5"] + base) == 2
    # without a key map: the domain of a conversion log's slices, whose estimates are operator-private
    du_penc_frame().to_parquet(tmp_path / "log.parquet")
    capsys.readouterr()
    assert run_reconstruct(["--summary-report", str(tmp_path / "r.avro"), "--conversions", str(tmp_path / "log.parquet")]
                           + base) == 0
    summary = json.loads((tmp_path / "e.summary.json").read_text())
    assert summary["operator_private"] is True and summary["domain_origin"] == "data"
    assert "OPERATOR-PRIVATE" in capsys.readouterr().err


@pytest.mark.parametrize("origin, private", [(DECLARED, False), (DATA, True)])
def test_reconstruct_through_a_data_derived_key_map_marks_its_estimates_operator_private(tmp_path, capsys, origin,
                                                                                         private):
    """A key map of origin data (export-ara --conversions, a simulation) lists the slices of the log it was
    derived from: reconstruct's estimates through it are marked operator-private, a declared one's are not."""
    params, _, metrics = _small_release(tmp_path)
    domain = du_penc_domain(params, origin)
    (tmp_path / "km.json").write_text(json.dumps(domain.to_json(ParameterVersion(params).checksum())))
    avro.write_summary_report(tmp_path / "r.avro", domain.buckets(), metrics)
    assert run_reconstruct(["--summary-report", str(tmp_path / "r.avro"), "--params", str(tmp_path / "p.json"),
                            "--key-map", str(tmp_path / "km.json"), "--out", str(tmp_path / "e.csv")]) == 0
    summary = json.loads((tmp_path / "e.summary.json").read_text())
    assert summary["operator_private"] is private and summary["domain_origin"] == origin
    err = capsys.readouterr().err
    assert ("OPERATOR-PRIVATE" in err and "--key-map" in err) is private, err


@pytest.mark.parametrize("days, private", [("2026-11-19,2026-11-20", True), ("2026-11-21", False), (None, True)])
def test_reconstruct_over_a_history_key_map_is_private_unless_the_report_is_after_the_history(tmp_path, capsys,
                                                                                             days, private):
    """A key map of a version's history domain (published without the history's end) read with that version:
    a summary report of days the history covers may list keys learnt from the conversions it estimates (red
    team, round fifteen: reconstruct of the training day over export-ara's key map), so its estimates are
    operator-private, as are those of unknown days; a report after the history's end is not."""
    params, _, metrics = _small_release(tmp_path)
    end = int(np.datetime64("2026-11-21", "us").astype(np.int64))  # the history's last conversion: 11-20 23:59:59.999999
    learnt = dataclasses.replace(du_penc_domain(params, HISTORY), learnt_before_us=end)
    version = ParameterVersion(params, domain=learnt)
    version.save(tmp_path / "p.json")
    (tmp_path / "km.json").write_text(json.dumps(learnt.to_json(version.checksum())))
    assert "learnt_before_us" not in json.loads((tmp_path / "km.json").read_text())  # as export-ara publishes it
    avro.write_summary_report(tmp_path / "r.avro", learnt.buckets(), metrics)
    assert run_reconstruct(["--summary-report", str(tmp_path / "r.avro"), "--params", str(tmp_path / "p.json"),
                            "--key-map", str(tmp_path / "km.json"), "--out", str(tmp_path / "e.csv"),
                            *(["--days", days] if days else [])]) == 0
    summary = json.loads((tmp_path / "e.summary.json").read_text())
    assert summary["operator_private"] is private and summary["domain_origin"] == HISTORY
    assert ("OPERATOR-PRIVATE" in capsys.readouterr().err) is private


def test_browser_report_cap_and_budget():
    source = {"destination": "https://a.example", "aggregation_keys": {"k": "0x10"}}
    triggers = [{"aggregatable_trigger_data": [{"key_piece": "0x1", "source_keys": ["k"]}],
                 "aggregatable_values": {"k": 3000}}] * 25
    result = simulate_browser([source], [0] * 25, np.zeros(25, dtype=int), np.arange(25), triggers)
    assert result.kept.sum() == 20 and all(r == ((0x11, 3000),) for r in result.reports)  # 20-report cap
    big = [{"aggregatable_values": {"k": 40000}}, {"aggregatable_values": {"k": 30000}},
           {"aggregatable_values": {"k": 25536}}]
    result = simulate_browser([source], [0] * 3, np.zeros(3, dtype=int), np.arange(3), big)
    assert result.kept.tolist() == [True, False, True]  # all or nothing, later smaller ones still fit


# ---- Chrome's own contribution logic (the WICG TypeScript) ---------------------------------------
def many_conversions_frame(seed=4):
    """Impressions with 25-30 conversions of small values: more than 20 fit the baseline's budget."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(25, 31, 40)
    imp = np.repeat(np.arange(40), sizes)
    n = len(imp)
    return pd.DataFrame({
        "impression_id": imp, "conversion_time": pd.to_datetime(rng.integers(0, 40, n), unit="h", utc=True),
        "campaign": np.array(["spring", "summer", "fall"])[imp % 3], "city": imp % 2 + 10,
        "device": rng.choice(["desktop", "mobile"], n), "items": np.zeros(n),
        "value": np.round(rng.uniform(0.01, 0.5, n), 2),
    })


CHROME_CASES = {
    **{name: (synthetic_params(name), synthetic_frame) for name in sorted(ENCODINGS)},
    "baseline-more-than-20-fit": (Params(count_limit=3, epsilon=4.0, slice_columns=("campaign", "city", "device"),
                                         conversion_slice_columns=("device",), encoding="baseline",
                                         count_budget_fraction=0.02, queries=(QueryParams("items", 4.0, 0.49),
                                                                              QueryParams("value", 60.0, 0.49))),
                                  many_conversions_frame),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CHROME_CASES))
def test_chromes_contribution_logic_on_exported_registrations_gives_measures_unnoised_sums(
        name, wicg_contrib, tmp_path, capsys):
    params, make_frame = CHROME_CASES[name]
    ParameterVersion(params).save(tmp_path / "params.json")
    make_frame().to_parquet(tmp_path / "log.parquet")
    export = tmp_path / "export"
    assert run_export_ara(["--params", str(tmp_path / "params.json"), "--out", str(export), "--conversions",
                           str(tmp_path / "log.parquet"), "--simulation-seed", str(SEED)]) == 0
    chrome, source_of, stats = chrome_sums(wicg_contrib, export, tmp_path)
    ours, summary = measure_unnoised(tmp_path, tmp_path / "log.parquet", tmp_path / "params.json",
                                      export / "key_map.json", SEED)
    assert chrome == ours
    assert stats["kept"] == summary["conversions_kept"] and summary["conversions_dropped_by_cap"] > 0
    assert all(len(s) == 1 for s in source_of.values())
    if name == "baseline-more-than-20-fit":  # Chrome's 20-report limit, not the budget, is what drops here
        assert stats["dropped"].get("excessive-reports", 0) == summary["conversions_dropped_by_cap"]
        assert summary["conversions_kept"] == 20 * 40


@pytest.mark.slow
def test_an_impression_whose_slice_changes_between_conversions_is_one_source_for_chrome_and_measure(
        wicg_contrib, tmp_path, capsys):
    params = synthetic_params("linf")
    ParameterVersion(params).save(tmp_path / "params.json")
    frame = synthetic_frame()
    imp = frame["impression_id"].value_counts().index[0]
    rows = frame.index[frame["impression_id"] == imp]
    latest = frame.loc[rows].sort_values("conversion_time").index[-2:]  # later than the first (no tie with it)
    assert frame.loc[latest, "conversion_time"].min() > frame.loc[rows, "conversion_time"].min()
    frame.loc[latest, "campaign"] = "changed"  # impression-side slice differs from the impression's first row
    frame.to_parquet(tmp_path / "log.parquet")
    export = tmp_path / "export"
    assert run_export_ara(["--params", str(tmp_path / "params.json"), "--out", str(export), "--conversions",
                           str(tmp_path / "log.parquet"), "--simulation-seed", str(SEED)]) == 0
    assert json.loads((export / "export.json").read_text())["conversions_rejected"] == {
        "impression_slice_inconsistent": 2}
    chrome, source_of, _ = chrome_sums(wicg_contrib, export, tmp_path)
    assert all(len(s) == 1 for s in source_of.values())  # a browser registers an impression once
    ours, summary = measure_unnoised(tmp_path, tmp_path / "log.parquet", tmp_path / "params.json",
                                      export / "key_map.json", SEED)
    assert chrome == ours
    assert summary["rows_rejected_by_reason"] == {"impression_slice_inconsistent": 2} and summary["accounting_closes"]


@pytest.mark.parametrize("name", sorted(ENCODINGS))
def test_trigger_encoder_equals_core_encode_for_extreme_finite_values(name):
    spec = ENCODINGS[name]
    thresholds = [1e-300, 0.5, MAX_CLIP_THRESHOLD]
    if spec["encoding"] == "l1":
        queries = tuple(QueryParams(f"q{i}", t) for i, t in enumerate(thresholds))
        extra = {"l1_rounding": spec.get("l1_rounding", "floor")}
    else:
        share = 0.75 if spec["encoding"] == "baseline" else 1.0
        queries = tuple(QueryParams(f"q{i}", t, share / 3) for i, t in enumerate(thresholds))
        extra = {"count_budget_fraction": 0.25} if spec["encoding"] == "baseline" else {}
    params = Params(count_limit=2, encoding=spec["encoding"], epsilon=1.0, slice_columns=("s",), queries=queries, **extra)
    domain = KeyDomain.from_slice_values(("s",), {"s": np.array([0])}, params.query_columns,
                                         baseline=spec["encoding"] == "baseline")
    enc = TriggerEncoder(params, domain)
    rng = np.random.default_rng(1)
    for values in ([1e308, 1e308, 1e308], [np.finfo(np.float64).max, 0.0, 1.0], [1.0, 1e308, 0.0], [5e-324, 0.0, 1e300]):
        uniforms = rng.random(3)
        got = enc.contributions({f"q{i}": v for i, v in enumerate(values)}, uniforms=uniforms)
        want = encode(np.array([values]), params, uniforms=np.array([uniforms]))
        assert list(got) == want[0].tolist(), values
        validate_trigger_registration(enc.registration({f"q{i}": v for i, v in enumerate(values)}, uniforms=uniforms))


def test_export_and_reconstruct_accept_a_parameter_store_like_measure(tmp_path, capsys):
    from araopt.io.stores import open_store

    params = history_version(du_penc_params(), {"campaign": np.array(["Thanksgiving", "Christmas"])})
    store = tmp_path / "store8"
    open_store(str(store)).publish("2026-11-20", "a1", params.to_bytes(), validate=ParameterVersion.from_bytes)
    for ref in (str(store), str(store / "versions" / "2026-11-20-a1")):
        export = tmp_path / f"export-{len(ref)}"
        assert run_export_ara(["--params", ref, "--out", str(export)]) == 0
        key_map = json.loads((export / "key_map.json").read_text())
        assert key_map["params_sha256"] == params.checksum() and key_map["origin"] == "history"
        domain = KeyMap.load(export / "key_map.json").domain
        avro.write_summary_report(tmp_path / "r.avro", domain.buckets(), np.arange(domain.num_keys) * 1000)
        out = tmp_path / f"e-{len(ref)}.csv"
        assert run_reconstruct(["--summary-report", str(tmp_path / "r.avro"), "--params", ref, "--key-map",
                                str(export / "key_map.json"), "--out", str(out)]) == 0
        assert len(pd.read_csv(out)) == domain.num_keys
    assert "Is a directory" not in capsys.readouterr().err
