"""``araopt measure`` for an attribution parameter version: the Beam transform (grouped by browser, the
privacy unit), its agreement with the in-memory measurement, the per-site per-epoch budgets across
shards, and the debug run's unnoised sums against the reference implementation's replay of
``export-attribution``'s events."""
import json
import os
import random

import apache_beam as beam
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that
from hypothesis import given, settings
from hypothesis import strategies as st

from araopt.attribution.measure import measure, simulate_release
from araopt.attribution.params import COUNT, AttributionParams, AttributionQuery
from araopt.io.conversions import BROWSER_ID, CONVERSION_SITE, IMPRESSION_ID, ValidationCounts
from araopt.mechanism.keys import DECLARED, KeyDomain
from araopt.targets import ATTRIBUTION
from araopt.version import ParameterVersion
from pipelines.cli import main
from transforms.attribution import MeasureAttribution
from transforms.group import split_by_shard
from w3c import log_parquet, random_log, run_reference, w3c_reference  # noqa: F401  (fixture)

QUERIES = (AttributionQuery(COUNT, None), AttributionQuery("value", "value", max_value=255, clip=20.0))


def _params(budget: float, lookback_days: int = 30) -> AttributionParams:
    return AttributionParams.from_paper(budget, 2, {COUNT: 0.3, "value": 0.7}, QUERIES, ("campaign",),
                                        lookback_days=lookback_days)


def _layout(params: AttributionParams, campaigns=range(3)) -> KeyDomain:
    return KeyDomain.from_slice_values(params.slice_columns, {"campaign": np.array(list(campaigns))},
                                       params.query_names).with_origin(DECLARED)


def _batches(log: pd.DataFrame, parts: int = 3) -> list[pa.Table]:
    return [pa.Table.from_pandas(log.iloc[i::parts], preserve_index=False) for i in range(parts)]


def _run_transform(params, log, domain, seed, check, num_shards=4, unit=BROWSER_ID):
    """The transform on ``log`` in three batches; ``check(release)`` asserts on its single release
    (through ``assert_that``, in the pipeline)."""

    def matcher(releases):
        assert len(releases) == 1
        check(releases[0])

    with TestPipeline() as p:
        counts = p | "Counts" >> beam.Create([ValidationCounts(len(log))])
        out = (p | beam.Create(_batches(log))
               | MeasureAttribution(params, counts, domain, seed, num_shards, unit))
        assert_that(out, matcher)


@pytest.mark.parametrize("budget, num_shards", [(1.0, 1), (4.0, 5), (10.0, 16)])
def test_the_beam_job_gives_the_in_memory_measurement_for_a_seed(budget, num_shards):
    """Any batching and sharding of complete browsers: the same unnoised sums, noisy histograms and
    estimates as the in-memory ``measure`` (keyed draws), and the accounting closes."""
    log = random_log(random.Random(11), users=60)
    params = _params(budget)
    domain = _layout(params)
    want = measure(params, log, domain, simulation_seed=7)
    unnoised = {k: v.tolist() for k, v in want.unnoised.items()}
    noisy = {k: v.tolist() for k, v in want.noisy.items()}
    estimates = {k: v.values.tolist() for k, v in want.estimates.items()}
    refused, browsers, rows = want.reports_refused, log[BROWSER_ID].nunique(), len(log)

    def check(rel):
        assert {k: v.tolist() for k, v in rel.sums.unnoised.items()} == unnoised
        assert {k: v.tolist() for k, v in rel.noisy.items()} == noisy
        assert {k: v.values.tolist() for k, v in rel.estimates.items()} == estimates
        assert rel.sums.reports_refused == refused > 0
        accounting = rel.accounting()
        assert accounting["accounting_closes"] and accounting["rows_read"] == rows
        assert accounting["browsers"] == browsers

    _run_transform(params, log, domain, 7, check, num_shards=num_shards)


def test_the_data_derived_layout_is_the_one_export_attribution_derives():
    log = random_log(random.Random(12), users=20)
    params = _params(4.0)
    want = {k: v.tolist() for k, v in measure(params, log, None, simulation_seed=3).unnoised.items()}
    campaigns = sorted(log["campaign"].unique().tolist())

    def check(rel):
        assert rel.domain.slice_values() == {"campaign": campaigns}
        assert {k: v.tolist() for k, v in rel.sums.unnoised.items()} == want

    _run_transform(params, log, None, 3, check)


def test_secure_mode_counts_every_conversion_the_budget_holds():
    """Without a seed (secure rounding, epoch starts and noise) a count query whose budget holds every
    report within the lookback sums exactly the conversions per campaign (by construction)."""
    rng = np.random.default_rng(0)
    n = 400
    shown = 1_767_225_600_000_000 + rng.integers(0, 10, n) * 86_400_000_000
    log = pd.DataFrame({BROWSER_ID: rng.integers(0, 50, n), IMPRESSION_ID: np.arange(n), "campaign": rng.integers(0, 3, n),
                        "impression_time_us": shown, "conversion_time_us": shown + rng.integers(0, 86_400, n) * 10**6})
    params = AttributionParams(10.0, (AttributionQuery(COUNT, None, epsilon=0.001),), ("campaign",))
    want = np.bincount(log["campaign"], minlength=3).tolist()

    def check(rel):
        assert rel.simulation_seed is None and rel.sums.reports_refused == 0
        assert rel.sums.unnoised[(COUNT, 0)].tolist() == want

    _run_transform(params, log, _layout(params), None, check)


def test_without_a_seed_a_data_derived_layout_is_refused():
    from araopt.errors import PrivacyRefusal

    with pytest.raises(PrivacyRefusal, match="declared domain"):
        MeasureAttribution(_params(4.0), None, None, None, 4, BROWSER_ID)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), budget=st.sampled_from((1.0, 4.0, 10.0)), num_shards=st.integers(1, 8),
       lookback=st.sampled_from((7, 30)))
def test_no_privacy_unit_spends_more_than_its_per_site_epoch_budget_across_shards(seed, budget, num_shards, lookback):
    """The job's sharding (complete browsers per shard) and simulation, in secure mode: what each
    (browser, conversion site, epoch) had deducted over all shards stays within the per-site budget,
    and every browser lies in exactly one shard. Grouping by impression instead would let a browser's
    parts each spend a budget."""
    log = random_log(random.Random(seed), users=15)
    params = _params(budget, lookback)
    domain = _layout(params)
    table = pa.Table.from_pandas(log, preserve_index=False)
    spent, owners = [], {}
    for shard, part in split_by_shard(table, num_shards, ATTRIBUTION.group_column(table.column_names)):
        rows = part.to_pandas()
        for b in rows[BROWSER_ID].unique():
            assert owners.setdefault(b, shard) == shard
        _, simulated = simulate_release(params, rows, domain)
        ordered, reports = simulated.rows, simulated.reports  # (the rows in the simulation's order)
        spent.append(pd.DataFrame({"browser": ordered[BROWSER_ID].to_numpy()[reports.row],
                                   "site": ordered[CONVERSION_SITE].to_numpy()[reports.row],
                                   "epoch": reports.epoch, "deducted": reports.deducted}))
    per_unit = pd.concat(spent).groupby(["browser", "site", "epoch"])["deducted"].sum()
    assert int(per_unit.max()) <= params.budget_micro
    assert set(owners) == set(log[BROWSER_ID])


# ---- the command ---------------------------------------------------------------------------------
def _measure(tmp_path, params, log, seed, name="m", extra=()):
    version = tmp_path / f"{name}.params.json"
    ParameterVersion.for_attribution(params).save(version)
    out = tmp_path / name
    code = main(["measure", "--input", log_parquet(log, tmp_path / f"{name}.parquet"), "--params", str(version),
                 "--output", str(out), "--simulation-seed", str(seed), "--debug-run", "--no-progress", *extra])
    return code, str(out)


def test_measure_writes_a_simulation_release_under_the_output_contract(tmp_path, capsys):
    log = random_log(random.Random(21), users=30)
    params = _params(4.0)
    code, out = _measure(tmp_path, params, log, 5, extra=("--api", "attribution"))
    assert code == 0, capsys.readouterr().err
    manifest = json.load(open(os.path.join(out, "simulation", "SIMULATION-MANIFEST.json")))
    listed = {e["path"] for e in manifest["files"]}
    assert {"SIMULATION-estimates.csv", "SIMULATION-release.json", "SIMULATION-key_map.json"} <= listed
    estimates = pd.read_csv(os.path.join(out, "simulation", "SIMULATION-estimates.csv"))
    want = measure(params, log, None, simulation_seed=5)
    for (name, _), est in want.estimates.items():
        got = estimates[estimates["query"] == name].sort_values("histogram_index")
        assert np.allclose(got["estimate"], est.values) and np.allclose(got["ci_high"] - got["estimate"], est.half_width)
    summary = json.load(open(os.path.join(out, "private", "run_summary.json")))
    assert summary["rows_read"] == len(log) and summary["reports_refused_for_budget"] == want.reports_refused
    assert not os.path.exists(os.path.join(out, "release"))


def test_measure_refuses_the_other_apis_version_in_one_line(tmp_path, capsys):
    log = random_log(random.Random(22), users=5)
    code, _ = _measure(tmp_path, _params(4.0), log, 5, extra=("--api", "ara"))
    err = capsys.readouterr().err.strip().splitlines()[-1]  # (after the simulation warning)
    assert code == 2 and err.startswith("araopt measure: error:") and "api 'ara'" in err


@pytest.mark.parametrize("seed, budget, lookback", [(31, 1.0, 30), (32, 4.0, 7), (33, 10.0, 30)])
def test_debug_histograms_equal_the_references_sums_of_the_exported_events(
        w3c_reference, tmp_path, capsys, seed, budget, lookback):  # noqa: F811
    """Adversarial logs: ``measure --debug-run --simulation-seed S``'s debug_histograms.csv equals, per
    (query, histogram index), the sums of the reference implementation's histograms for
    ``export-attribution --simulation-seed S``'s events.jsonl."""
    log = random_log(random.Random(seed), users=40)
    params = _params(budget, lookback)
    code, out = _measure(tmp_path, params, log, seed)
    assert code == 0, capsys.readouterr().err
    debug = pd.read_csv(os.path.join(out, "private", "debug_histograms.csv"))
    assert list(debug.columns) == ["query", "histogram_index", "unnoised_sum"]

    (tmp_path / "p.json").write_text(json.dumps(params.to_json()))
    export = tmp_path / "export"
    assert main(["export-attribution", "--params", str(tmp_path / "p.json"), "--output", str(export),
                 "--conversions", str(tmp_path / "m.parquet"), "--simulation-seed", str(seed)]) == 0
    with open(export / "private" / "events.jsonl") as fh:
        cases = [json.loads(line) for line in fh]
    names = [ev["query"] for c in cases for ev in c["events"] if ev["event"] == "measureConversion"]
    theirs, _ = run_reference(w3c_reference, cases, tmp_path)
    size = len(theirs[0]["histogram"])
    sums = {q: np.zeros(size, dtype=np.int64) for q in params.query_names}
    for name, row in zip(names, theirs, strict=True):
        sums[name] += np.asarray(row["histogram"], dtype=np.int64)
    for name in params.query_names:
        mine = debug[debug["query"] == name].sort_values("histogram_index")
        assert mine["histogram_index"].tolist() == list(range(size))
        assert mine["unnoised_sum"].tolist() == sums[name].tolist(), name
    summary = json.load(open(os.path.join(out, "private", "run_summary.json")))
    assert summary["reports_refused_for_budget"] > 0


def test_a_secure_release_is_recorded_in_the_ledger_and_not_repeated(tmp_path, capsys):
    """Without a seed (secure noise): the release goes to release/ over the version's declared layout,
    is recorded in the ledger, and the same conversions are refused a second release."""
    log = random_log(random.Random(23), users=20)
    params = _params(4.0)
    version = tmp_path / "v.json"
    ParameterVersion.for_attribution(params, domain=_layout(params)).save(version)
    argv = ["measure", "--input", log_parquet(log, tmp_path / "log.parquet"), "--params", str(version),
            "--ledger", str(tmp_path / "ledger"), "--no-progress"]
    assert main([*argv, "--output", str(tmp_path / "a")]) == 0, capsys.readouterr().err
    estimates = pd.read_csv(tmp_path / "a" / "release" / "estimates.csv")
    assert sorted(estimates["query"].unique()) == sorted(params.query_names) and len(estimates) == 6
    assert json.load(open(tmp_path / "a" / "release" / "release.json"))["simulation"] is False
    assert not (tmp_path / "a" / "private" / "debug_histograms.csv").exists()
    capsys.readouterr()
    assert main([*argv, "--output", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "already released" in err and not (tmp_path / "b").exists()


def test_check_ledgers_warns_when_another_store_released_the_same_attribution_conversions(tmp_path, capsys):
    """Two stores' ledgers, one log: the second store's attribution release reads the first's ledger
    (--check-ledgers, read only) and says how many of its conversions the other store released."""
    log = random_log(random.Random(25), users=20)
    params = _params(4.0)
    version = tmp_path / "v.json"
    ParameterVersion.for_attribution(params, domain=_layout(params)).save(version)
    data = log_parquet(log, tmp_path / "log.parquet")

    def release(name, *extra):
        return main(["measure", "--input", data, "--params", str(version), "--ledger", str(tmp_path / f"ledger-{name}"),
                     "--output", str(tmp_path / name), "--no-progress", *extra])

    assert release("a") == 0, capsys.readouterr().err
    capsys.readouterr()
    assert release("b", "--check-ledgers", str(tmp_path / "ledger-a")) == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    (released,) = json.load(open(tmp_path / "ledger-a" / "ledger" / "index.json"))["releases"]
    n = released["rows"]
    assert n > 0 and f"{n:,} of the {n:,} conversions of this input were already released from another store" in err
    summary = json.load(open(tmp_path / "b" / "private" / "run_summary.json"))
    assert list(summary["conversions_in_other_ledgers"].values()) == [n]


# ---- reconstruct ---------------------------------------------------------------------------------
def test_reconstruct_turns_aggregated_histograms_into_measures_estimates(tmp_path, capsys):
    """The noisy histograms of a simulated measurement, given to ``reconstruct`` as the aggregation
    service's output, give the same estimates and intervals as ``measure`` published."""
    log = random_log(random.Random(24), users=25)
    params = _params(4.0)
    version = tmp_path / "v.json"
    ParameterVersion.for_attribution(params, domain=_layout(params)).save(version)
    result = measure(params, log, _layout(params), simulation_seed=9)
    rows = [{"query": q, "histogram_index": i, "noisy_sum": int(v)}
            for (q, _), noisy in result.noisy.items() for i, v in enumerate(noisy)]
    pd.DataFrame(rows).to_csv(tmp_path / "histograms.csv", index=False)
    argv = ["reconstruct", "--summary-report", str(tmp_path / "histograms.csv"), "--params", str(version),
            "--output", str(tmp_path / "est.csv")]
    assert main([*argv, "--api", "attribution"]) == 0, capsys.readouterr().err
    got = pd.read_csv(tmp_path / "est.csv")
    for (name, _), est in result.estimates.items():
        mine = got[got["query"] == name].sort_values("histogram_index")
        assert mine["campaign"].tolist() == [0, 1, 2]
        assert np.allclose(mine["estimate"], est.values) and np.allclose(mine["ci_high"] - mine["estimate"], est.half_width)
    pd.DataFrame(rows + [rows[0]]).to_csv(tmp_path / "twice.csv", index=False)
    capsys.readouterr()
    assert main(["reconstruct", "--summary-report", str(tmp_path / "twice.csv"), "--params", str(version),
                 "--output", str(tmp_path / "e2.csv")]) == 2
    assert "appears twice" in capsys.readouterr().err
    pd.DataFrame(rows[1:]).to_csv(tmp_path / "short.csv", index=False)
    assert main(["reconstruct", "--summary-report", str(tmp_path / "short.csv"), "--params", str(version),
                 "--output", str(tmp_path / "e3.csv")]) == 0
    assert "1 (query, histogram index) entries are missing" in capsys.readouterr().err
    assert pd.read_csv(tmp_path / "e3.csv")["estimate"].isna().sum() == 1


def test_reconstruct_over_a_logs_layout_marks_its_estimates_operator_private(tmp_path, capsys):
    """``reconstruct --conversions LOG`` reads the histograms through the slices of LOG: the estimates list
    exactly the slices that occur in it, so they are marked operator-private (summary and console), while
    the same histograms through the version's declared layout are publishable."""
    log = random_log(random.Random(26), users=25)
    params = _params(4.0)
    result = measure(params, log, _layout(params), simulation_seed=9)
    pd.DataFrame([{"query": q, "histogram_index": i, "noisy_sum": int(v)} for (q, _), noisy in result.noisy.items()
                  for i, v in enumerate(noisy)]).to_csv(tmp_path / "histograms.csv", index=False)
    for name, layout in (("declared", _layout(params)), ("log", None)):
        version = tmp_path / f"{name}.json"
        ParameterVersion.for_attribution(params, domain=layout).save(version)
        capsys.readouterr()
        assert main(["reconstruct", "--summary-report", str(tmp_path / "histograms.csv"), "--params", str(version),
                     "--conversions", log_parquet(log, tmp_path / "log.parquet"),
                     "--output", str(tmp_path / f"{name}.csv")]) == 0, capsys.readouterr().err
        err = capsys.readouterr().err
        summary = json.load(open(tmp_path / f"{name}.summary.json"))
        private = name == "log"
        assert summary["operator_private"] is private and summary["domain_origin"] == ("data" if private else "declared")
        assert ("OPERATOR-PRIVATE" in err and "--conversions" in err) is private, err
