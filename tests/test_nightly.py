"""The nightly job: window selection, publish + idempotency, guardrails, measure consuming `latest`,
and history read from gs:// through Beam (gcp-storage-emulator)."""
from __future__ import annotations

import dataclasses
import json
import os

import pandas as pd
import pytest

from araopt import Params
from araopt.io.stores import open_store
from araopt.mechanism.params import QueryParams
from araopt.nightly import Guardrails
from araopt.version import ParameterVersion
from factories import nightly_args, write_history
from pipelines import measure as measure_pipeline
from pipelines import nightly
from pipelines.nightly import select_window

pytestmark = pytest.mark.slow  # whole jobs end to end: `make test` runs them, `make test-fast` does not

SLICES = "campaign,geo"


def test_window_selection(tmp_path):
    hist = write_history(tmp_path / "h", n=50)
    files, dates, lookback = select_window(hist, "2026-11-22", 2)
    assert dates == ["2026-11-21", "2026-11-22"] and len(files) == 2 and lookback == []
    files, dates, lookback = select_window(hist, "2026-11-22", 1, lookback_days=1)
    assert dates == ["2026-11-22"] and len(files) == 1 and len(lookback) == 1 and "date=2026-11-21" in lookback[0]
    with pytest.raises(Exception, match="no history in the window"):
        select_window(hist, "2026-12-30", 3)
    with pytest.raises(Exception, match="window-days"):
        select_window(hist, "2026-11-22", 0)


def test_publish_then_measure_with_latest_then_idempotent_rerun(tmp_path, capsys):
    hist = write_history(tmp_path / "h", days=("2026-11-20", "2026-11-21", "2026-11-22", "2026-11-23"))
    store_uri = str(tmp_path / "store")
    assert nightly.run(nightly_args(hist, store_uri, extra=["--run-id", "r1"])) == 0
    store = open_store(store_uri)
    assert store.list_versions() == ["2026-11-22-r1"]
    params = ParameterVersion.from_bytes(store.resolve().payload)
    assert params.provenance.training_start == "2026-11-20" and params.provenance.training_end == "2026-11-22"
    report = json.loads((tmp_path / "store" / "reports" / "2026-11-22-r1" / "report.json").read_text())
    assert report["published"] and report["predicted_rmsre_tau"] < min(report["baselines"].values())
    # the tuned version measures every query (error_model.predicted_without_signal), and says so
    assert report["predicted_without_signal"] == params.provenance.extra["predicted_without_signal"] == []
    assert "no signal" not in capsys.readouterr().out
    assert (tmp_path / "store" / "reports" / "2026-11-22-r1" / "report.png").stat().st_size > 1000
    page = (tmp_path / "store" / "reports" / "2026-11-22-r1" / "report.html").read_text()  # beside the PNG
    assert "PUBLISHED 2026-11-22-r1" in page and "Published parameter versions over time" in page
    assert 'href="report.png"' in page and 'href="../../versions/2026-11-22-r1/params.json"' in page
    # re-running the same as-of on the same history publishes nothing new
    assert nightly.run(nightly_args(hist, store_uri, extra=["--run-id", "r2"])) == 0
    assert store.list_versions() == ["2026-11-22-r1"]
    assert "idempotent" in capsys.readouterr().out
    # the version carries the history's key domain: a real (secure) release needs no --domain
    assert params.domain is not None and params.domain.num_slices == len(report_slices(hist))
    # the measurement job resolves `latest` and records the version it used (on the day after its window:
    # a release of the window's own days over the history's domain is refused, test_release_rules)
    out = tmp_path / "out"
    assert measure_pipeline.run(["--input", os.path.join(hist, "date=2026-11-23"), "--params", store_uri,
                                 "--output", str(out)]) == 0
    summary = json.loads((out / "private" / "run_summary.json").read_text())
    assert summary["parameters"]["version"] == "2026-11-22-r1" and summary["domain"] == "the parameter version"
    assert summary["parameters"]["sha256"] == store.resolve().sha256
    assert summary["release_number_of_this_input"] == 1 and summary["ledger"] == store.uri
    # the run's page and figure are operator-private (exact counts beside the released numbers)
    manifest = json.loads((out / "private" / "run_manifest.json").read_text())
    private_files = {f["path"] for f in manifest["files"]}
    assert {"private/report.html", "private/estimates.png"} <= private_files
    assert not any(name.endswith((".html", ".png")) for name in os.listdir(out / "release"))
    page = (out / "private" / "report.html").read_text()
    assert "2026-11-22-r1" in page and 'href="estimates.png"' in page and "Accounting" in page
    assert 'href="../../store/reports/2026-11-22-r1/report.html"' in page  # the night that chose the parameters
    assert f"report (operator-private): {out}/private/report.html" in capsys.readouterr().out
    releases, _ = store.read_ledger()
    assert [e["id"] for e in releases] == [summary["ledger_entry"]] and releases[0]["rows"] == summary["rows_read"]


def report_slices(hist):
    frame = pd.read_parquet(hist)
    return frame.groupby(["campaign", "geo"]).size()


def test_guardrail_large_change_needs_flag(tmp_path, capsys, monkeypatch):
    hist = write_history(tmp_path / "h")
    store_uri = str(tmp_path / "store")
    assert nightly.run(nightly_args(hist, store_uri, extra=["--run-id", "a"])) == 0
    # the next day, values are 20x larger: thresholds move by far more than a factor 2
    write_history(tmp_path / "h", days=("2026-11-23",), seed=5, scale=20.0)
    args = nightly_args(hist, store_uri, as_of="2026-11-23", window=1, extra=["--run-id", "b"])
    parsed: list[str] = []  # the previous version is parsed once, on the driver; the job's steps take it
    from_bytes = ParameterVersion.from_bytes.__func__
    monkeypatch.setattr(ParameterVersion, "from_bytes", classmethod(
        lambda cls, raw, source="parameter file": (parsed.append(source), from_bytes(cls, raw, source))[1]))
    assert nightly.run(args) == 2
    assert parsed.count("previous latest") == 1
    err = capsys.readouterr().err
    assert "not published" in err and "clip threshold of value moves" in err
    assert open_store(store_uri).resolve().version == "2026-11-22-a"
    report = json.loads((tmp_path / "store" / "reports" / "2026-11-23-b" / "report.json").read_text())
    assert report["published"] is False and report["problems"]
    page = (tmp_path / "store" / "reports" / "2026-11-23-b" / "report.html").read_text()
    assert "NOT PUBLISHED: clip threshold of value moves" in page
    assert nightly.run(args + ["--allow-large-change"]) == 0
    assert open_store(store_uri).resolve().version == "2026-11-23-b"


def test_result_not_better_than_baseline_is_not_published(tmp_path, monkeypatch, capsys):
    from araopt.optimize import tune as tuning
    from araopt.optimize.baselines import baseline_params
    from araopt.optimize.objective import predicted_rmsre_tau
    from araopt.optimize.search import optimize as real_optimize

    hist = write_history(tmp_path / "h")
    store_uri = str(tmp_path / "store")

    def worse_than_baseline(statistics, epsilon, *args, **kwargs):
        result = real_optimize(statistics, epsilon, *args, **kwargs)
        base = baseline_params(statistics, epsilon, 0.95, 8, taus=result.taus)
        worse = predicted_rmsre_tau(statistics, base, result.taus, "exact") * 1.5
        return type(result)(result.params, worse, result.objective, result.encoding, result.per_count_limit, result.taus,
                            result.seconds)

    monkeypatch.setattr(tuning, "optimize", worse_than_baseline)
    assert nightly.run(nightly_args(hist, store_uri, extra=["--run-id", "w", "--objective", "exact"])) == 2
    assert "does not beat the best baseline" in capsys.readouterr().err
    assert open_store(store_uri).list_versions() == []


def test_guardrails_unit():
    from araopt import QueryParams

    def p(c, t):
        return ParameterVersion(Params(count_limit=c, encoding="linf", epsilon=1, slice_columns=("s",),
                                       queries=(QueryParams("v", t, 1.0),)))

    g = Guardrails()
    assert g.check(p(3, 10), 0.1, {"b": 0.2}, p(3, 12)) == []
    assert any("baseline" in x for x in g.check(p(3, 10), 0.3, {"b": 0.2}, None))
    assert any("count limit" in x for x in g.check(p(8, 10), 0.1, {"b": 0.2}, p(3, 10)))
    assert any("x3.00" in x for x in g.check(p(3, 30), 0.1, {"b": 0.2}, p(3, 10)))
    assert Guardrails(allow_large_change=True).check(p(8, 30), 0.1, {"b": 0.2}, p(3, 10)) == []


def test_guardrails_name_the_cause_and_a_new_epsilon_starts_a_new_series():
    import dataclasses

    from araopt import QueryParams
    from araopt.nightly import new_series

    def p(c, t, eps=1.0, correction="none"):
        return ParameterVersion(Params(count_limit=c, encoding="linf", epsilon=eps, slice_columns=("s",),
                                       queries=(QueryParams("v", t, 1.0),)), correction=correction)

    g = Guardrails()
    switched = g.check(p(8, 30, correction="ratio"), 0.1, {"b": 0.2}, p(3, 10, correction="none"))
    assert len(switched) == 2 and all("estimator switched from 'none' to 'ratio'" in x for x in switched)
    assert all("history changed" in x for x in g.check(p(8, 30), 0.1, {"b": 0.2}, p(3, 10)))
    # a new epsilon is a new series: C 20 -> 2 is expected, not a large change
    assert g.check(p(2, 10, eps=64.0), 0.1, {"b": 0.2}, p(20, 10, eps=1.0)) == []
    assert new_series(p(20, 10, eps=1.0), p(2, 10, eps=64.0)) == "epsilon changed 1 -> 64"
    assert new_series(p(3, 10), p(3, 11)) == ""
    day, week = (dataclasses.replace(p(3, 10), provenance=dataclasses.replace(
        p(3, 10).provenance or __import__("araopt").Provenance(), extra={"release_period_days": d})) for d in (1.0, 7.0))
    assert new_series(day, week) == "release period changed 1 -> 7 days"


def test_refused_report_figure_says_not_published():
    from araopt.evaluation.plots import nightly_report_figure

    table = pd.DataFrame({"C": [1, 2, 3], "rmsre_tau": [0.3, 0.2, 0.25]})
    fig = nightly_report_figure(table, 2, {"baseline_q95": 0.4}, [("count", 5.0)], [], refused=["count limit moves"],
                                release_period_days=1.0)
    assert fig._suptitle is not None and fig._suptitle.get_text().startswith("NOT PUBLISHED: count limit moves")
    assert "one release of 1 day(s)" in fig.axes[0].get_ylabel()
    published = nightly_report_figure(table, 2, {"baseline_q95": 0.4}, [("count", 5.0)], [])
    assert not published._suptitle.get_text().startswith("NOT PUBLISHED")


def test_bad_input_before_work(tmp_path, capsys):
    hist = write_history(tmp_path / "h", n=100)
    assert nightly.run(nightly_args(hist, "s3://bucket/x")) == 2
    assert "unknown store scheme" in capsys.readouterr().err
    assert nightly.run(nightly_args(hist, str(tmp_path / "s"), as_of="2027-01-01")) == 2
    assert "no history in the window" in capsys.readouterr().err
    assert nightly.run(nightly_args(hist, str(tmp_path / "s"), window=0)) == 2
    assert nightly.run(nightly_args(hist, str(tmp_path / "s"), epsilon=70)) == 2


def test_history_from_gcs_through_beam(tmp_path, gcp_storage_emulator):
    """The nightly job reads its history from gs:// through Beam IO (gcp-storage-emulator)."""
    local = write_history(tmp_path / "h", n=800)
    client = gcp_storage_emulator.client()
    bucket = client.bucket(gcp_storage_emulator.bucket)
    for root, _, names in os.walk(local):
        for name in names:
            path = os.path.join(root, name)
            bucket.blob(os.path.relpath(path, local)).upload_from_filename(path)
    history = f"gs://{gcp_storage_emulator.bucket}/date=*/*.parquet"
    store_uri = str(tmp_path / "store")
    assert nightly.run(nightly_args(history, store_uri, extra=["--run-id", "g"])) == 0
    assert open_store(store_uri).list_versions() == ["2026-11-22-g"]


def test_measure_refuses_corrupt_latest_or_params_naming_the_file(tmp_path, capsys):
    hist = write_history(tmp_path / "h", n=500)
    store_uri = str(tmp_path / "store")
    assert nightly.run(nightly_args(hist, store_uri, extra=["--run-id", "c"])) == 0
    measure_args = ["--input", os.path.join(hist, "date=2026-11-22"), "--params", store_uri, "--simulation-seed", "1"]
    latest = tmp_path / "store" / "latest"
    good = latest.read_bytes()
    latest.write_bytes(good[: len(good) // 2])  # truncated pointer
    assert measure_pipeline.run(measure_args + ["--output", str(tmp_path / "o1")]) == 2
    err = capsys.readouterr().err
    (line,) = [ln for ln in err.splitlines() if ln.startswith("araopt measure: error:")]
    assert "latest" in line and "Traceback" not in err
    latest.write_bytes(good)
    params_file = tmp_path / "store" / "versions" / "2026-11-22-c" / "params.json"
    params_file.write_bytes(params_file.read_bytes().replace(b'"count_limit": ', b'"count_limit": 1'))  # tampered
    assert measure_pipeline.run(measure_args + ["--output", str(tmp_path / "o2")]) == 2
    assert "params.json" in capsys.readouterr().err
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()
    bad_file = tmp_path / "bad.json"
    bad_file.write_text('{"format_version": "1.0", "epsilon": 8')
    assert measure_pipeline.run(["--input", hist, "--params", str(bad_file), "--output", str(tmp_path / "o3")]) == 2
    assert "bad.json" in capsys.readouterr().err


def test_idempotency_ignores_float_noise_but_not_real_changes():
    from araopt import QueryParams
    from araopt.nightly import same_release as _same_release
    from araopt.version import Provenance

    def p(threshold, run_id):
        return ParameterVersion(Params(count_limit=3, encoding="linf", epsilon=1, slice_columns=("s",),
                                       queries=(QueryParams("v", threshold, 1.0),)),
                                provenance=Provenance(created_at=run_id, extra={"as_of": "2026-11-22", "run_id": run_id}))

    assert _same_release(p(10.0, "a"), p(10.0 * (1 + 1e-13), "b"), "2026-11-22")
    assert not _same_release(p(10.0, "a"), p(10.001, "b"), "2026-11-22")
    assert not _same_release(p(10.0, "a"), p(10.0, "b"), "2026-11-23")


# ---- the privacy-safe run's decision and the one report schema -------------------------------------------
def _learnt(params: Params, predicted: float | None, baseline: float | None) -> ParameterVersion:
    from araopt.version import Provenance

    extra = {"as_of": "2026-11-22"} if baseline is None else {
        "as_of": "2026-11-22", "baselines": {"baseline_q95": {"rmsre_tau": baseline}}}
    return ParameterVersion(params, provenance=Provenance(predicted_rmsre_tau=predicted, extra=extra))


def test_the_privacy_safe_decision_is_guarded_like_a_tuned_one():
    """``private_decision``: a version whose recorded prediction does not beat its recorded baseline is
    refused, one that does is published, a large move of C needs the allowance, the cold start (no
    prediction) is not guarded, and a re-run of the same day is recognised."""
    from araopt.nightly import private_decision

    base = Params(count_limit=2, encoding="linf", epsilon=8.0, slice_columns=("s",),
                  queries=(QueryParams("v", 20.0, 1.0),))
    assert private_decision(_learnt(base, 0.3, 0.4), None, "2026-11-22", Guardrails()).publish
    worse = private_decision(_learnt(base, 0.5, 0.4), None, "2026-11-22", Guardrails())
    assert not worse.publish and "does not beat the best baseline" in worse.problems[0]
    previous = _learnt(base, 0.3, 0.4)
    moved = _learnt(dataclasses.replace(base, count_limit=12), 0.3, 0.4)
    assert "count limit moves 2 -> 12" in private_decision(moved, previous, "2026-11-22", Guardrails()).problems[0]
    assert private_decision(moved, previous, "2026-11-22", Guardrails(allow_large_change=True)).publish
    cold = private_decision(_learnt(base, None, None), None, "2026-11-22", Guardrails())
    assert cold.publish and cold.problems == ()
    rerun = private_decision(previous, previous, "2026-11-22", Guardrails())
    assert rerun.idempotent and not rerun.publish


def test_both_nightly_modes_write_one_report_schema():
    """The joined-history report and the privacy-safe one: ``run_report``'s keys, each with its mode and
    the facts of its input."""
    from araopt.nightly import PrivateDecision, private_report, run_report

    version = _learnt(Params(count_limit=2, encoding="linf", epsilon=8.0, slice_columns=("s",),
                             queries=(QueryParams("v", 20.0, 1.0),)), 0.3, 0.4)
    common = set(run_report("joined history", "d", "r", 8.0, version, 0.3, {}, None, (), False, ""))
    report = private_report(PrivateDecision(version, ("x",), False), "d", "r", 8.0, "v1", cold_start=False)
    assert common <= set(report) and report["mode"] == "privacy-safe" and report["problems"] == ["x"]
    assert report["baselines"] == {"baseline_q95": 0.4} and report["predicted_rmsre_tau"] == 0.3
    assert report["previous_version"] == "v1" and report["cold_start"] is False
    with pytest.raises(ValueError, match="unknown nightly mode"):
        run_report("other", "d", "r", 8.0, version, 0.3, {}, None, (), False, "")


def test_the_night_tunes_and_calibrates_with_the_workflow_steps_and_records_the_run():
    # nightly's in-job steps are the tuning workflow's (araopt.nightly.nightly_tuning): the decision is its
    # choose (the window's rows and the run in the provenance), the publish step its conclude (calibrate)
    from araopt.calibration.accumulator import candidates_statistics, day_blocks
    from araopt.io.conversions import ValidationCounts
    from araopt.nightly import NightlyConfig, nightly_decision, nightly_tuning, with_calibration
    from araopt.optimize.statistics import StatisticsSpec, compute_statistics_in_memory
    from factories import small_d2

    conv = small_d2()
    statistics = compute_statistics_in_memory(conv, StatisticsSpec(conv.slice_columns, conv.value_columns,
                                                                   max_count_limit=4))
    config = NightlyConfig(store="unused", as_of="2026-11-22", run_id="r1", epsilon=4.0,
                           slice_columns=conv.slice_columns, window=("2026-11-20", "2026-11-22"),
                           dates=("2026-11-20", "2026-11-21", "2026-11-22"), max_count_limit=4, lookback_days=2)
    counts = ValidationCounts(rows_read=500, rows_rejected=5, rejected_by_reason={"null_value": 5})
    decision = nightly_decision(statistics, counts, config, None)
    provenance = decision.tuning.version.provenance
    assert provenance.rows == 495 and provenance.extra["history_days"] == 3
    assert {k: provenance.extra[k] for k in ("run_id", "as_of", "rows_read", "rows_rejected", "lookback_days")} == {
        "run_id": "r1", "as_of": "2026-11-22", "rows_read": 500, "rows_rejected": 5, "lookback_days": 2}
    assert nightly_tuning(config, counts).choose(statistics)[0].version.params == decision.tuning.version.params
    calibration = candidates_statistics(conv, [(v.params, v.checksum()) for v, _ in decision.tuning.candidates],
                                        day_blocks(conv))
    closed = with_calibration(decision, calibration, None, config)
    assert closed.tuning.version.calibration is not None  # the conclusion attached the window's calibration
    expected = nightly_tuning(config).conclude(decision.tuning, tuple(calibration))
    assert closed.tuning.version.to_json() == expected.version.to_json()


def test_the_nightly_line_names_a_query_the_version_leaves_without_signal(capsys):
    """``print_report`` adds the NOTE for the queries the report predicts silent."""
    from pipelines.nightly import print_report

    report = {"as_of": "2026-11-22", "window": ["2026-11-20", "2026-11-22"], "rows_read": 10,
              "params": {"count_limit": 3, "queries": [{"column": "v", "clip_threshold": 1e-5, "budget_fraction": 1e-4}]},
              "baselines": {"baseline_q95": 0.9}, "predicted_rmsre_tau": 0.8, "version": "v"}
    print_report(report, 1.0, "r/report.json")
    assert "no signal" not in capsys.readouterr().out
    print_report({**report, "predicted_without_signal": ["v"]}, 1.0, "r/report.json")
    lines = [line for line in capsys.readouterr().out.splitlines() if "no signal" in line]
    assert len(lines) == 1 and "NOTE: predicted to hold no signal for v" in lines[0]
