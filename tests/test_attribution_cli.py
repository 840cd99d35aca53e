"""``araopt export-attribution`` end to end: the parameter file, the calls, and the operator-private
``private/events.jsonl`` replayed through the spec's reference implementation (``node DEST/events.js``)
against araopt's in-memory ``measure`` for the same simulation seed."""
import json
import os
import random

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from araopt.attribution.measure import measure
from araopt.attribution.params import COUNT, PARAMS_FORMAT, AttributionParams, AttributionQuery
from araopt.errors import InvalidParameters
from pipelines.cli import main
from w3c import log_parquet, random_log, run_reference, w3c_reference  # noqa: F401  (fixture)

QUERIES = (AttributionQuery(COUNT, None), AttributionQuery("value", "value", max_value=255, clip=20.0))


def _params(budget: float, lookback_days: int = 30) -> AttributionParams:
    return AttributionParams.from_paper(budget, 2, {COUNT: 0.3, "value": 0.7}, QUERIES, ("campaign",),
                                        lookback_days=lookback_days)


def _write_params(path, params: AttributionParams) -> str:
    path.write_text(json.dumps(params.to_json()))
    return str(path)


def _export(tmp_path, params, log, seed, name="out", extra=()) -> tuple[int, str]:
    out = tmp_path / name
    code = main(["export-attribution", "--params", _write_params(tmp_path / f"{name}.json", params),
                 "--output", str(out), "--conversions", log_parquet(log, tmp_path / f"{name}.parquet"),
                 "--simulation-seed", str(seed), *extra])
    return code, str(out)


# ---- the parameter file -------------------------------------------------------------------------
def test_the_parameter_file_reads_back_to_equal_parameters():
    params = AttributionParams(3.5, QUERIES, ("campaign",), ("region",), epoch_days=5, lookback_days=12,
                               credit=(0.5, 0.25))
    doc = json.loads(json.dumps(params.to_json()))
    assert doc["format"] == PARAMS_FORMAT
    assert AttributionParams.from_json(doc) == params


@given(budget=st.floats(1.0, 100.0), epsilon=st.floats(0.001, 0.5), max_value=st.integers(1, 2**32 - 1),
       clip=st.floats(1e-3, 1e6), lookback=st.integers(1, 60), credit=st.lists(st.floats(0.01, 5.0), min_size=1,
                                                                                 max_size=4))
def test_any_valid_parameters_survive_the_file_exactly(budget, epsilon, max_value, clip, lookback, credit):
    params = AttributionParams(budget, (AttributionQuery(COUNT, None, epsilon),
                                        AttributionQuery("v", "value", epsilon, max_value, clip)),
                               ("campaign",), lookback_days=lookback, credit=tuple(credit))
    assert AttributionParams.from_json(json.loads(json.dumps(params.to_json()))) == params


@pytest.mark.parametrize("change, field", [
    ({"per_site_budget": "4"}, "per_site_budget"),
    ({"epoch_days": 0}, "epoch_days"),
    ({"credit": [1, "x"]}, "credit"),
    ({"format": "ara"}, "format"),
    ({"slice_columns": "campaign"}, "slice_columns"),
    ({"surprise": 1}, "surprise"),
    ({"queries": [{"name": "count", "column": None, "epsilon": 0}]}, "epsilon"),
    ({"queries": [{"name": "v", "column": "v", "max_value": 2.5}]}, "max_value"),
    ({"queries": [{"name": "v", "max_value": 3}]}, "column"),
])
def test_a_bad_parameter_file_is_refused_naming_the_field(change, field):
    doc = {**_params(4.0).to_json(), **change}
    with pytest.raises(InvalidParameters, match=field):
        AttributionParams.from_json(doc)


def test_a_missing_field_is_named():
    doc = _params(4.0).to_json()
    del doc["per_site_budget"]
    with pytest.raises(InvalidParameters, match="missing field 'per_site_budget'"):
        AttributionParams.from_json(doc)


# ---- the export against the reference ------------------------------------------------------------
@pytest.mark.parametrize("seed, budget, lookback", [(1, 1.0, 30), (2, 4.0, 7), (3, 10.0, 30)])
def test_the_exported_events_through_the_reference_give_measures_unnoised_sums_and_refusals(
        w3c_reference, tmp_path, seed, budget, lookback):  # noqa: F811
    """Adversarial logs (many conversions per user and epoch, lookbacks across epochs, several
    impressions per user, tied times, values 0 to 50x the clip): the reference's histograms of the
    exported events, summed per (query, histogram index), are exactly ``measure``'s unnoised sums for
    the same seed; the reports that spend budget in the reference are those ``measure`` accepts, so
    the same reports are dropped for budget."""
    log = random_log(random.Random(seed), users=40)
    params = _params(budget, lookback)
    code, out = _export(tmp_path, params, log, seed)
    assert code == 0
    with open(os.path.join(out, "private", "events.jsonl")) as fh:
        cases = [json.loads(line) for line in fh]
    assert "OPERATOR-PRIVATE" in open(os.path.join(out, "private", "README.txt")).read()
    for case in cases:  # the instance's budget, epoch length and start travel with it
        assert case["config"]["perSitePrivacyBudget"] == params.budget_micro
        assert case["config"]["privacyBudgetEpochDays"] == params.epoch_days
        assert 0 <= case["config"]["epochStart"] < 1
    names = [ev["query"] for c in cases for ev in c["events"] if ev["event"] == "measureConversion"]

    result = measure(params, log, None, simulation_seed=seed)
    theirs, their_budgets = run_reference(w3c_reference, cases, tmp_path)
    assert len(theirs) == len(names) == len(result.reports.accepted)
    assert all("histogram" in row for row in theirs), [row for row in theirs if "histogram" not in row][:3]
    size = len(theirs[0]["histogram"])
    sums = {(q, 0): np.zeros(size, dtype=np.int64) for q in params.query_names}
    for name, row in zip(names, theirs, strict=True):
        sums[(name, 0)] += np.asarray(row["histogram"], dtype=np.int64)
    mismatches = sum(int((sums[k] != result.unnoised[k]).sum()) for k in result.unnoised)
    assert set(sums) == set(result.unnoised)

    # a report spends budget in the reference iff measure accepted it (every sent value is >= 1)
    spent, before, case_of = [], None, [i for i, c in enumerate(cases) for ev in c["events"]
                                        if ev["event"] == "measureConversion"]
    for i, row in enumerate(their_budgets):
        previous = [] if i == 0 or case_of[i] != case_of[i - 1] else before
        spent.append(sorted(row["budget"]) != sorted(previous))
        before = row["budget"]
    assert spent == result.reports.accepted.tolist()
    assert [any(r["histogram"]) for r in theirs] == result.reports.accepted.tolist()
    dropped = int(result.reports.refused.sum())
    their_dropped = sum(1 for i, s in enumerate(spent) if not s and result.reports.matched[i])
    print(f"log {seed} (budget {budget}, lookback {lookback}d): {len(log)} rows, {len(cases)} browsers, "
          f"{len(names)} reports, {dropped} dropped for budget (reference: {their_dropped}), "
          f"{mismatches} mismatches over {sum(v.size for v in sums.values())} sums")
    assert mismatches == 0
    assert dropped == their_dropped
    assert dropped > 0  # the log reaches the budget
    assert (log["value"] > QUERIES[1].clip).any()  # and values above the clip


def test_the_public_files_say_what_to_call_without_raw_rows(tmp_path):
    log = random_log(random.Random(5), users=5)
    params = _params(4.0)
    code, out = _export(tmp_path, params, log, 1)
    assert code == 0
    calls = json.load(open(os.path.join(out, "calls.json")))
    assert [c["query"] for c in calls["measureConversion"]] == list(params.query_names)
    assert [c["epsilon"] for c in calls["measureConversion"]] == [q.epsilon for q in params.queries]
    assert calls["saveImpression"]["lifetimeDays"] == params.lookback_days
    layout = pd.read_csv(os.path.join(out, "histogram_layout.csv"))
    assert layout["histogram_index"].tolist() == list(range(len(layout)))
    assert sorted(layout["campaign"]) == sorted(log["campaign"].unique())
    manifest = json.load(open(os.path.join(out, "_manifest.json")))
    assert manifest["command"] == "export-attribution"
    public = [f for f in os.listdir(out) if f != "private"]
    for name in public:
        text = open(os.path.join(out, name)).read()
        assert str(log["impression_time_us"].iloc[0] // 1_000_000) not in text


# ---- bad inputs: one line, exit 2 ----------------------------------------------------------------
def _one_line_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err and err.startswith("araopt export-attribution: error:")
    return err


def test_bad_inputs_are_one_line_and_exit_2(tmp_path, capsys):
    log = random_log(random.Random(6), users=3)
    good = _write_params(tmp_path / "p.json", _params(4.0))
    no_browser_time = log_parquet(log, tmp_path / "log.parquet")
    pd.read_parquet(no_browser_time).drop(columns=["impression_time"]).to_parquet(tmp_path / "noimp.parquet")
    pd.read_parquet(no_browser_time).drop(columns=["value"]).to_parquet(tmp_path / "novalue.parquet")
    base = ["export-attribution", "--params", good, "--simulation-seed", "1"]
    err = _one_line_error(capsys, [*base, "--output", str(tmp_path / "a"), "--conversions",
                                   str(tmp_path / "noimp.parquet")])
    assert "impression_time" in err
    err = _one_line_error(capsys, [*base, "--output", str(tmp_path / "b"), "--conversions",
                                   str(tmp_path / "novalue.parquet")])
    assert "value" in err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**_params(4.0).to_json(), "lookback_days": -1}))
    err = _one_line_error(capsys, ["export-attribution", "--params", str(bad), "--output", str(tmp_path / "c"),
                                   "--conversions", no_browser_time, "--simulation-seed", "1"])
    assert "lookback_days" in err and str(bad) in err
    (tmp_path / "dup.json").write_text('{"format": "x", "format": "y"}')
    err = _one_line_error(capsys, ["export-attribution", "--params", str(tmp_path / "dup.json"), "--output",
                                   str(tmp_path / "d")])
    assert "twice" in err
    assert not any(os.path.exists(tmp_path / x) for x in "abcd")
    # an existing export is replaced only with --overwrite
    argv = [*base, "--output", str(tmp_path / "e"), "--conversions", no_browser_time]
    assert main(argv) == 0
    capsys.readouterr()
    err = _one_line_error(capsys, argv)
    assert "--overwrite" in err
    assert main([*argv, "--overwrite"]) == 0


def test_a_declared_layout_indexes_the_histograms_and_counts_conversions_outside_it(tmp_path, capsys):
    log = random_log(random.Random(7), users=8)
    (tmp_path / "layout.csv").write_text("campaign\n0\n1\n")
    code, out = _export(tmp_path, _params(4.0), log, 1, extra=("--domain", str(tmp_path / "layout.csv")))
    assert code == 0
    summary = json.load(open(os.path.join(out, "export.json")))
    outside = int((log["campaign"] == 2).sum())
    assert outside > 0
    assert summary["conversions_outside_layout"] == outside
    assert summary["histogram_size"] == 2 and summary["domain_origin"] == "declared"
    assert f"{outside} conversions have impression-side slices outside" in capsys.readouterr().err
    with open(os.path.join(out, "private", "events.jsonl")) as fh:
        calls = [ev for line in fh for ev in json.loads(line)["events"] if ev["event"] == "measureConversion"]
    assert {ev["options"]["histogramSize"] for ev in calls} == {2}
