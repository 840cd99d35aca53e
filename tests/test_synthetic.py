"""Specification of araopt.synthetic: the Sec. 5.3 generator, its sampler, writer and MLE fit.

Statistical checks use fixed seeds and tolerances of Z = 5 standard errors derived from the sample
size. For a chi-square statistic they use its 1 - 1e-6 quantile. So a correct implementation
passes for any seed with probability > 0.99999, and an error of a few percent fails.
"""
from __future__ import annotations

import json
import math
from datetime import UTC, date, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest
from scipy import stats

from araopt.data import synthetic
from araopt.data.fit import fit_log_normal, fit_power_law, fit_synthetic, fit_synthetic_report, fit_zero_truncated_poisson
from araopt.data.synthetic import (
    CONVERSION_LOG_SCHEMA,
    N_SLICES,
    PRESETS,
    PowerLaw,
    SyntheticPreset,
    expected_sizes,
    generate_table,
    get_preset,
    iter_chunks,
    load_preset,
    plan_impressions,
    save_preset,
    scale_for_target_conversions,
    write_synthetic,
)

Z = 5.0
CHI2_Q = 1 - 1e-6
SCHEMA_JSON = Path(__file__).resolve().parents[1] / "schemas" / "conversion_log.arrow.json"
WINDOW_US = 30 * 86_400_000_000


# ------------------------------------------------------------------ Step 1: the power law (Def. 5.1)

@pytest.mark.parametrize("b,k_max", [(2.88, 10_000), (1.14, 10_000), (0.06, 20)])
def test_exact_sampler_pmf_ratios_match_definition(b: float, k_max: int) -> None:
    """P(k)/P(1) = k^-b for k = 2..5, within 5 SE of log(n_k/n_1), SE^2 = 1/E[n_k] + 1/E[n_1]."""
    law = PowerLaw(b, 1, k_max)
    n = 2_000_000
    x = law.sample(np.random.default_rng(11), n)
    assert x.min() >= 1 and x.max() <= k_max and x.dtype == np.int64
    counts = np.bincount(x, minlength=6)
    p = law.pmf(np.arange(6))
    for k in range(2, 6):
        se = math.sqrt(1 / (n * p[k]) + 1 / (n * p[1]))
        assert abs(math.log(counts[k] / counts[1]) - (-b * math.log(k))) < Z * se, (k, counts[k] / counts[1], k**-b)


@pytest.mark.parametrize("b,k_min,k_max", [(2.88, 1, 10_000), (0.06, 1, 300), (1.14, 3, 50)])
def test_exact_sampler_chi_square_over_the_support(b: float, k_min: int, k_max: int) -> None:
    law = PowerLaw(b, k_min, k_max)
    n = 500_000
    x = law.sample(np.random.default_rng(5), n)
    # bins: every k with expected count >= 20, the rest pooled into one tail bin
    ks = np.arange(k_min, k_max + 1)
    expected = n * law.pmf(ks)
    head = ks[expected >= 20]
    last = head[-1]
    observed = np.append(np.bincount(x - k_min, minlength=k_max - k_min + 1)[: last - k_min + 1], np.sum(x > last))
    exp = np.append(expected[: last - k_min + 1], n - expected[: last - k_min + 1].sum())
    keep = exp > 0
    chi2 = float(np.sum((observed[keep] - exp[keep]) ** 2 / exp[keep]))
    assert chi2 < stats.chi2.ppf(CHI2_Q, keep.sum() - 1), chi2


def test_pmf_is_normalised_and_matches_definition() -> None:
    law = PowerLaw(1.14, 2, 5000)
    ks = np.arange(1, 5002)
    p = law.pmf(ks)
    assert p[0] == 0 and p[-1] == 0  # outside [k_min, k_max]
    assert p.sum() == pytest.approx(1.0, abs=1e-12)
    z = np.sum(np.arange(2, 5001, dtype=float) ** -1.14)
    assert p[1] == pytest.approx(2**-1.14 / z, rel=1e-12)
    assert law.log_normalizer() == pytest.approx(math.log(z), rel=1e-12)
    assert law.mean() == pytest.approx(np.sum(ks * p), rel=1e-12)


def test_exact_sampler_on_a_support_beyond_the_exact_head() -> None:
    """k_max - k_min >= 2^20: head exact, tail by the continuous law; both masses must be right."""
    law = PowerLaw(1.5, 1, 10**9)
    n = 1_000_000
    x = law.sample(np.random.default_rng(3), n)
    assert x.min() >= 1 and x.max() <= 10**9
    head_mass = float(np.sum(law.pmf(np.arange(1, law.head_max + 1))))
    tail_frac = np.mean(x > law.head_max)
    se = math.sqrt((1 - head_mass) * head_mass / n)
    assert abs(tail_frac - (1 - head_mass)) < Z * se + 1e-12
    c = np.bincount(x[x <= 3])
    assert abs(math.log(c[2] / c[1]) + 1.5 * math.log(2)) < Z * math.sqrt(1 / c[2] + 1 / c[1])


def test_clauset_approximation_is_eq_d6_when_unbounded() -> None:
    """Clauset et al. (2009) eq. (D.6): x = floor((k_min - 1/2)(1 - r)^(-1/(b-1)) + 1/2)."""
    r = np.random.default_rng(0).random(100_000)
    for b, k_min in ((2.88, 1), (2.2, 4)):  # (k_max/k_min)^(1-b) < 1e-17: truncation is invisible
        law = PowerLaw(b, k_min, 10**15)
        d6 = np.floor((k_min - 0.5) * (1 - r) ** (-1 / (b - 1)) + 0.5)
        got = law.ppf_clauset(r)
        small = d6 < 10**14
        assert np.array_equal(got[small], d6[small].astype(np.int64))


def test_clauset_approximation_samples_its_own_pmf_but_not_definition_5_1() -> None:
    """Why "exact" is the default: for k_min = 1, b = 2.88 the approximation gives P(2)/P(1) of 0.090,
    while Def. 5.1 gives 2^-2.88 = 0.136 (34 % off). The test detects that difference."""
    law = PowerLaw(2.88, 1, 10_000)
    n = 2_000_000
    x = law.sample(np.random.default_rng(1), n, method="clauset")
    c = np.bincount(x, minlength=3)
    q = law.clauset_pmf(np.array([1, 2]))
    se = math.sqrt(1 / (n * q[1]) + 1 / (n * q[0]))
    ratio = c[2] / c[1]
    assert abs(math.log(ratio) - math.log(q[1] / q[0])) < Z * se
    assert abs(math.log(ratio) - math.log(2**-2.88)) > 20 * se  # far outside the Def. 5.1 tolerance
    assert q[1] / q[0] == pytest.approx(0.0896, abs=5e-4)


def test_clauset_bounded_variant_works_for_b_below_one() -> None:
    law = PowerLaw(0.06, 1, 100)
    x = law.sample(np.random.default_rng(2), 200_000, method="clauset")
    assert x.min() == 1 and x.max() == 100
    with pytest.raises(ValueError, match="sampler"):
        law.sample(np.random.default_rng(2), 10, method="naive")


# ------------------------------------------------------------------ presets and validation

def test_presets_match_the_paper_table() -> None:
    assert {n: (p.b, p.lam, p.mu, p.sigma) for n, p in PRESETS.items()} == {
        "synth-criteo": (2.88, 10.0, 4.19, 1.16),
        "synth-real-estate": (0.06, 10.0, 0.87, 0.43),
        "synth-travel": (1.14, 10.0, 1.95, 1.14),
    }
    assert all((p.k_min, p.k_max, p.attribution_window_days) == (1, 10_000, 30) for p in PRESETS.values())
    assert N_SLICES == 16 * 8 * 2
    with pytest.raises(TypeError):
        PRESETS["x"] = PRESETS["synth-criteo"]  # type: ignore[index]


@pytest.mark.parametrize("kwargs,match", [
    ({"b": 0.0}, "b must be > 0"), ({"b": -1.0}, "b must be > 0"), ({"b": float("nan")}, "finite"),
    ({"lam": -0.1}, "lam must be >= 0"), ({"sigma": 0.0}, "sigma must be > 0"), ({"sigma": -1.0}, "sigma must be > 0"),
    ({"k_min": 0}, "k_min must be >= 1"), ({"k_min": 10, "k_max": 9}, "k_max must be >= k_min"),
    ({"k_max": 2.5}, "integer"), ({"attribution_window_days": 0}, "window"), ({"mu": float("inf")}, "finite"),
])
def test_invalid_parameters_raise_value_error(kwargs: dict, match: str) -> None:
    base = dict(name="x", b=1.0, lam=1.0, mu=0.0, sigma=1.0)
    with pytest.raises(ValueError, match=match):
        SyntheticPreset(**{**base, **kwargs})


def test_lam_zero_is_valid_and_generates_an_empty_log_with_the_schema(tmp_path: Path) -> None:
    preset = SyntheticPreset("none", b=1.0, lam=0.0, mu=0.0, sigma=1.0, k_max=10)
    m = write_synthetic(tmp_path / "o", preset, seed=0, splits=("train",))
    assert m["train"]["conversions"] == 0
    assert ds.dataset(tmp_path / "o" / "train").to_table().schema.equals(CONVERSION_LOG_SCHEMA)


def test_unknown_preset_and_bad_generation_arguments() -> None:
    with pytest.raises(ValueError, match="unknown preset 'nope'"):
        get_preset("nope")
    p = PRESETS["synth-travel"]
    for kwargs, match in (({"scale": 0}, "scale"), ({"scale": -1}, "scale"), ({"seed": -1}, "seed"),
                          ({"days": 0}, "days"), ({"split": "dev"}, "split"), ({"power_law_method": "x"}, "sampler")):
        with pytest.raises(ValueError, match=match):
            plan_impressions(p, **{"seed": 0, **kwargs})


def test_preset_json_round_trip_and_strict_keys(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    p = SyntheticPreset("mine", b=1.3, lam=2.5, mu=0.1, sigma=0.7, k_min=2, k_max=77, attribution_window_days=7)
    save_preset(p, path, fit={"n_slices": 3})
    assert load_preset(path) == p == get_preset(str(path))
    with pytest.raises(ValueError, match="already exists"):
        save_preset(p, path)
    data = json.loads(path.read_text())
    data["lambda"] = 3
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="unknown preset key"):
        load_preset(path)
    path.write_text(json.dumps({**p.to_dict(), "b": -2}))
    with pytest.raises(ValueError, match="b must be > 0"):
        load_preset(path)


# ------------------------------------------------------------------ scale knob

def test_scale_multiplies_the_support_and_sizes_grow_with_it() -> None:
    p = PRESETS["synth-real-estate"]
    assert (p.scaled(0.01).k_min, p.scaled(0.01).k_max) == (1, 100)
    assert (p.scaled(2.5).k_min, p.scaled(2.5).k_max) == (3, 25_000)  # floor(2.5 + 1/2) = 3
    assert (p.scaled(1e-9).k_min, p.scaled(1e-9).k_max) == (1, 1)
    assert p.scaled(1.0) is p
    e1, e2 = expected_sizes(p, 0.1), expected_sizes(p, 0.2)
    assert e2["conversions"] / e1["conversions"] == pytest.approx(2.0, rel=0.01)  # b ~ 0: ~linear
    assert e1["conversions"] == pytest.approx(N_SLICES * 10 * p.scaled(0.1).power_law.mean())


def test_target_conversions_picks_a_scale_that_hits_the_target() -> None:
    p = PRESETS["synth-real-estate"]
    s = scale_for_target_conversions(p, 300_000)
    assert expected_sizes(p, s)["conversions"] >= 300_000
    assert expected_sizes(p, s / 1.002)["conversions"] < 300_000 * 1.001
    n = generate_table(p, seed=4, scale=s).num_rows
    assert abs(n / 300_000 - 1) < 0.2  # 256 slices of a ~uniform law: CV ~ 3.6 %


# ------------------------------------------------------------------ Steps 2-3 on generated data

@pytest.fixture(scope="module")
def travel() -> tuple[pa.Table, synthetic.ImpressionPlan]:
    preset = PRESETS["synth-travel"]
    kwargs = dict(seed=7, split="train", scale=0.5, days=3)
    return generate_table(preset, **kwargs), plan_impressions(preset, **kwargs)


def test_output_schema_matches_the_contract_file(travel) -> None:
    table, _ = travel
    spec = json.loads(SCHEMA_JSON.read_text())
    assert [f["name"] for f in spec["fields"]] == table.schema.names
    for f in spec["fields"]:
        field = table.schema.field(f["name"])
        assert str(field.type) == f["type"] and field.nullable == f["nullable"], f
        if "domain" in f:
            lo, hi = f["domain"]
            assert pc.min(table[f["name"]]).as_py() >= lo and pc.max(table[f["name"]]).as_py() <= hi
    assert table.schema.equals(CONVERSION_LOG_SCHEMA)
    assert all(table[c].null_count == 0 for c in table.column_names)


def test_conversions_per_impression_are_poisson(travel) -> None:
    """Mean and variance of conversions per impression (zero-conversion impressions included)."""
    table, plan = travel
    lam = plan.preset.lam
    per_imp = table.group_by("impression_id").aggregate([([], "count_all")])["count_all"].to_numpy()
    n = plan.n_impressions
    assert per_imp.size <= n
    counts = np.concatenate([per_imp, np.zeros(n - per_imp.size)])
    assert abs(counts.mean() - lam) < Z * math.sqrt(lam / n)
    assert abs(counts.var() - lam) < Z * math.sqrt((lam + 2 * lam**2) / n)
    assert n > 50_000  # the tolerances above are meaningful (SE of the mean < 0.015)


def test_conversion_types_are_uniform(travel) -> None:
    table, _ = travel
    observed = np.bincount(table["conversionType"].to_numpy(), minlength=5)
    chi2 = float(np.sum((observed - observed.sum() / 5) ** 2 / (observed.sum() / 5)))
    assert chi2 < stats.chi2.ppf(CHI2_Q, 4)


def test_values_are_log_normal(travel) -> None:
    table, plan = travel
    logs = np.log(table["value"].to_numpy())
    n, mu, sigma = logs.size, plan.preset.mu, plan.preset.sigma
    assert abs(logs.mean() - mu) < Z * sigma / math.sqrt(n)
    assert abs(logs.std() - sigma) < Z * sigma / math.sqrt(2 * n)


def test_impressions_per_slice_follow_the_plan(travel) -> None:
    table, plan = travel
    per_imp = table.group_by(["impression_id", "campaignId", "geography", "productCategory"]).aggregate([])
    assert per_imp.num_rows == pc.count_distinct(table["impression_id"]).as_py()  # one slice per impression
    slice_index = ((per_imp["campaignId"].to_numpy() * 8 + per_imp["geography"].to_numpy()) * 2
                   + per_imp["productCategory"].to_numpy())
    seen = np.bincount(slice_index, minlength=N_SLICES)
    planned = plan.slice_counts
    assert np.all(seen <= planned)
    # every impression converts with probability 1 - exp(-lam); slices lose only a few
    assert seen.sum() == pytest.approx(planned.sum() * (1 - math.exp(-plan.preset.lam)), abs=Z * math.sqrt(planned.sum()))


def test_conversion_times_lie_in_the_attribution_window_and_are_ordered(travel) -> None:
    table, plan = travel
    imp = table["impression_id"].to_numpy()
    t_imp = table["impression_time"].cast(pa.int64()).to_numpy()
    t_conv = table["conversion_time"].cast(pa.int64()).to_numpy()
    off = t_conv - t_imp
    assert off.min() >= 0 and off.max() < WINDOW_US
    same = imp[1:] == imp[:-1]
    assert np.all(np.diff(t_conv)[same] > 0)  # strictly increasing within an impression
    assert np.all(np.diff(imp) >= 0)  # rows of an impression are contiguous
    start = int(datetime(2024, 1, 1, tzinfo=UTC).timestamp()) * 1_000_000
    assert t_imp.min() >= start and t_imp.max() < start + plan.days * 86_400_000_000
    # the offsets are uniform over the window
    assert stats.kstest(off / WINDOW_US, "uniform").pvalue > 1e-6


def test_output_does_not_depend_on_chunk_size_and_splits_are_independent(travel) -> None:
    table, plan = travel
    rechunked = pa.concat_tables([t for _, t in iter_chunks(plan, chunk_rows=1_000)])
    assert rechunked.equals(table)
    again = generate_table(PRESETS["synth-travel"], seed=7, split="train", scale=0.5, days=3)
    assert again.equals(table)
    test = generate_table(PRESETS["synth-travel"], seed=7, split="test", scale=0.5, days=3)
    assert test.num_rows != table.num_rows or not np.allclose(test["value"].to_numpy(), table["value"].to_numpy())
    assert pc.min(test["impression_id"]).as_py() >= 1 << 48


# ------------------------------------------------------------------ writer

def test_partitioned_writer_shards_ids_and_dates(tmp_path: Path) -> None:
    out = tmp_path / "out"
    m = write_synthetic(out, PRESETS["synth-travel"], seed=2, scale=0.05, days=4, start_date=date(2024, 3, 30),
                        chunk_rows=3_000, max_rows_per_file=5_000)
    for split in ("train", "test"):
        parts = sorted((out / split).glob("date=*/part-*.parquet"))
        dates = sorted({p.parent.name for p in parts})
        assert dates == ["date=2024-03-30", "date=2024-03-31", "date=2024-04-01", "date=2024-04-02"]
        assert len(parts) > 4  # several shards per day
        ids_by_day = {}
        for p in parts:
            t = ds.dataset(p).to_table()
            day = date.fromisoformat(p.parent.name[5:])
            t_imp = t["impression_time"].cast(pa.int64()).to_numpy()
            lo = int(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp()) * 1_000_000
            assert t_imp.min() >= lo and t_imp.max() < lo + 86_400_000_000  # partition = impression date
            ids_by_day.setdefault(day, set()).update(t["impression_id"].to_numpy().tolist())
        all_ids = [i for s in ids_by_day.values() for i in s]
        assert len(all_ids) == len(set(all_ids))  # unique across days and shards
        manifest = json.loads((out / split / "_manifest.json").read_text())
        assert manifest["conversions"] == ds.dataset(out / split).count_rows() == m[split]["conversions"]
        assert manifest["days"] == 4 and manifest["seed"] == 2
    # no staging folder left; the lock files stay beside the split folders (araopt.io.locks.FileLock)
    assert sorted(p.name for p in out.iterdir()) == [".test.araopt-lock", ".train.araopt-lock", "test", "train"]


def test_conversion_date_partitions_hold_each_conversion_on_its_own_day(tmp_path: Path) -> None:
    out = tmp_path / "out"
    flat = write_synthetic(tmp_path / "flat", PRESETS["synth-travel"], seed=2, scale=0.05, days=3, splits=("train",))
    m = write_synthetic(out, PRESETS["synth-travel"], seed=2, scale=0.05, days=3, splits=("train",),
                        by_conversion_date=True, chunk_rows=3_000)
    assert m["train"]["partitioned_by"] == "conversion_date"
    assert m["train"]["conversions"] == flat["train"]["conversions"]  # the same rows, partitioned otherwise
    parts = sorted((out / "train").glob("date=*/part-*.parquet"))
    assert len({p.parent.name for p in parts}) > 3  # conversions run past the impression days
    for p in parts:
        day = date.fromisoformat(p.parent.name[5:])
        lo = int(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp()) * 1_000_000
        times = ds.dataset(p).to_table()["conversion_time"].cast(pa.int64()).to_numpy()
        assert times.min() >= lo and times.max() < lo + 86_400_000_000


def test_written_data_equals_in_memory_generation(tmp_path: Path) -> None:
    p = PRESETS["synth-criteo"]
    write_synthetic(tmp_path / "o", p, seed=9, scale=3, splits=("test",), chunk_rows=500, max_rows_per_file=700)
    written = ds.dataset(tmp_path / "o" / "test").to_table().sort_by([("impression_id", "ascending"),
                                                                     ("conversion_time", "ascending")])
    assert written.equals(generate_table(p, seed=9, split="test", scale=3))
    assert not (tmp_path / "o" / "train").exists()


def test_writer_refuses_an_output_directory_that_holds_data(tmp_path: Path) -> None:
    out = tmp_path / "o"
    out.mkdir()
    (out / "something.txt").write_text("x")
    p = PRESETS["synth-criteo"]
    with pytest.raises(ValueError, match="already holds data; pass --overwrite"):
        write_synthetic(out, p, seed=0)
    write_synthetic(out, p, seed=0, overwrite=True)  # unrelated file kept, splits created
    assert (out / "something.txt").exists() and (out / "train" / "_manifest.json").exists()
    before = ds.dataset(out / "train").to_table()
    write_synthetic(out, p, seed=1, overwrite=True)
    assert not ds.dataset(out / "train").to_table().equals(before)
    (out / "test" / "_manifest.json").unlink()  # no longer recognisably ours
    with pytest.raises(ValueError, match="not an araopt output"):
        write_synthetic(out, p, seed=2, overwrite=True)


# ------------------------------------------------------------------ fit (maximum likelihood)

@pytest.mark.statistical
@pytest.mark.parametrize("name", sorted(PRESETS))
def test_fit_recovers_generating_parameters_from_one_million_conversions(name: str) -> None:
    """Stated tolerance: every estimate within 5 asymptotic standard errors (Fisher information), and
    mu, sigma, lam within 1 % (relative); b within 0.6 absolute (only 256 slices inform b)."""
    preset = PRESETS[name]
    scale = scale_for_target_conversions(preset, 1_000_000)
    table = generate_table(preset, seed=1, scale=scale)
    assert 0.8e6 < table.num_rows < 1.25e6
    fit = fit_synthetic_report(table)
    for k in ("b", "lam", "mu", "sigma"):
        assert abs(getattr(fit.preset, k) - getattr(preset, k)) < Z * fit.stderr[k], (k, getattr(fit.preset, k))
    assert fit.preset.lam == pytest.approx(preset.lam, rel=0.01)
    assert fit.preset.mu == pytest.approx(preset.mu, rel=0.01)
    assert fit.preset.sigma == pytest.approx(preset.sigma, rel=0.01)
    assert abs(fit.preset.b - preset.b) < 0.6 and fit.stderr["b"] < 0.13
    assert fit.n_slices == N_SLICES and fit.n_conversions == table.num_rows


def test_power_law_mle_with_many_slices_is_tight() -> None:
    law = PowerLaw(1.7, 1, 1000)
    x = law.sample(np.random.default_rng(8), 50_000)
    fitted, se = fit_power_law(x, 1, 1000)
    assert abs(fitted.b - 1.7) < Z * se and se < 0.01
    free, _ = fit_power_law(x)  # support from the data
    assert free.k_min == x.min() and free.k_max == x.max()
    with pytest.raises(ValueError, match="not identifiable"):
        fit_power_law(np.full(10, 4))


def test_zero_truncated_poisson_mle_corrects_for_unobserved_zeros() -> None:
    """With lam = 0.5, 61 % of impressions are unseen; the naive mean (1.27) would be badly off."""
    rng = np.random.default_rng(4)
    k = rng.poisson(0.5, 2_000_000)
    k = k[k > 0]
    lam, se = fit_zero_truncated_poisson(k)
    assert abs(lam - 0.5) < Z * se and se < 0.005
    assert k.mean() > 1.2
    assert fit_zero_truncated_poisson(np.ones(10)) == (0.0, 0.0)


def test_log_normal_mle_ignores_zero_values() -> None:
    v = np.random.default_rng(0).lognormal(1.0, 0.5, 100_000)
    mu, sigma, n = fit_log_normal(np.concatenate([v, np.zeros(500)]))
    assert n == 100_000 and abs(mu - 1) < Z * 0.5 / math.sqrt(n) and abs(sigma - 0.5) < Z * 0.5 / math.sqrt(2 * n)


def test_fit_reads_a_written_log_and_its_preset_drives_the_generator(tmp_path: Path) -> None:
    write_synthetic(tmp_path / "o", PRESETS["synth-travel"], seed=3, scale=0.1, days=2, splits=("train",))
    fitted = fit_synthetic(tmp_path / "o" / "train", name="travel-fit")
    save_preset(fitted, tmp_path / "fit.json")
    again = get_preset(str(tmp_path / "fit.json"))
    assert again == fitted and generate_table(again, seed=0).num_rows > 0


def test_fit_rejects_bad_logs() -> None:
    t = generate_table(PRESETS["synth-criteo"], seed=0)
    ids = t["impression_id"].to_numpy().copy()
    moved = t.set_column(t.schema.get_field_index("campaignId"), "campaignId",
                         pa.array(np.where(np.arange(ids.size) == 1, 15 - t["campaignId"].to_numpy(),
                                           t["campaignId"].to_numpy()), pa.int32()))
    assert ids[0] == ids[1]  # the first impression has several conversions; move one to another slice
    with pytest.raises(ValueError, match="more than one slice"):
        fit_synthetic(moved)
    with pytest.raises(ValueError, match="lacks column"):
        fit_synthetic(t.drop_columns(["value"]))
    with pytest.raises(ValueError, match="empty"):
        fit_synthetic(t.slice(0, 0))
    with pytest.raises(ValueError, match="does not exist"):
        fit_synthetic("/nonexistent/log")


def test_browsers_hold_several_impressions_of_one_day_and_are_deterministic(travel) -> None:
    """browser_id (the W3C Attribution target's users): runs of consecutive impressions in time, a
    browser's id is its smallest impression id, the mean run length is the preset's, and the column has
    its own random stream (the same seed gives the same browsers)."""
    table, _ = travel
    frame = table.select(["impression_id", "impression_time", "browser_id"]).to_pandas()
    per_browser = frame.groupby("browser_id")["impression_id"].nunique()
    assert per_browser.max() > 1 and abs(per_browser.mean() - PRESETS["synth-travel"].impressions_per_user) < 0.5
    shown = frame.groupby("impression_id")[["impression_time", "browser_id"]].first()
    smallest = shown.reset_index().groupby("browser_id")["impression_id"].min()
    assert (smallest.to_numpy() == smallest.index.to_numpy()).all()
    assert shown.groupby("browser_id")["impression_time"].agg(lambda t: t.dt.date.nunique()).max() == 1
    again = generate_table(PRESETS["synth-travel"], seed=7, split="train", scale=0.5, days=3)
    assert again.column("browser_id").equals(table.column("browser_id"))
