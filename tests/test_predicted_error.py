"""One predicted RMSRE_tau: the run report, the console, the report's picture and the demo show the
number the published version records (replayed on the window's days when the history allows it)."""
from __future__ import annotations

import numpy as np
import pytest

import araopt.calibration as cb
from araopt.constants import Objective
from araopt.evaluation.plots import nightly_report_figure
from araopt.io.conversions import ValidationCounts
from araopt.nightly import NightlyConfig, NightlyDecision, nightly_report
from araopt.optimize import tune as tuning
from araopt.optimize.statistics import StatisticsSpec, compute_statistics_in_memory
from test_calendar import daily_log


@pytest.fixture(scope="module")
def replayed():
    """A tuning on three weeks of days: the calibration's backtest replaces the model's prediction."""
    conv = daily_log(21, weekend=2.0, seed=2, per_day=2500)
    stats = compute_statistics_in_memory(conv, StatisticsSpec(("s",), ("value",)))
    res = tuning.tune(stats, 8.0, objective=Objective.CORRECTED, release_period_days=1.0, history_days=21)
    cals = [cb.calibration_statistics(conv, v.params, cb.day_blocks(conv), fitted_for=v.checksum())
            for v, _ in res.candidates]
    out = tuning.calibrate(res, cals, 1.0)
    assert out.version.provenance is not None and "backtest" in out.version.provenance.extra
    return out


def test_the_report_and_its_picture_show_the_versions_predicted_error(replayed, monkeypatch):
    import araopt.nightly as nightly

    value = replayed.version.provenance.predicted_rmsre_tau  # what the published version records
    table = replayed.optimization.table()
    at_c = float(table.loc[table["C"] == replayed.params.count_limit, "rmsre_tau"].iloc[0])
    model = float(replayed.version.provenance.extra["model_predicted_rmsre_tau"])
    assert not (np.isclose(value, at_c) and np.isclose(value, model))  # the numbers that used to disagree
    config = NightlyConfig(store="s", as_of="2025-01-27", run_id="r", epsilon=8.0, slice_columns=("s",),
                           window=("2025-01-06", "2025-01-26"), dates=())
    decision = NightlyDecision(replayed, (), False)
    report = nightly_report(decision, config, ValidationCounts(), None)
    assert report["predicted_rmsre_tau"] == value and report["prediction"] == "replayed on the window's days"
    figures = []

    def capture(*args, **kwargs):
        figures.append(nightly_report_figure(*args, **kwargs))
        return b""

    monkeypatch.setattr(nightly, "render_nightly_report", capture)
    nightly.nightly_report_png(decision, [])
    fig = figures[0]
    star = [line for line in fig.axes[0].get_lines() if line.get_marker() == "*"][0]
    assert float(star.get_ydata()[0]) == value
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any(f"= {value:.4g} (replayed on the window's days)" in t for t in labels)
    for name, b in replayed.baseline_values().items():
        assert any(t.endswith(f"{b:.4g} (\u00d7{b / value:.1f})") for t in labels), name


def test_the_demo_prints_the_reports_predicted_error_once(capsys):
    import pandas as pd

    from pipelines.demo import print_results

    report = {"params": {"count_limit": 3, "queries": [{"column": "value", "clip_threshold": 9.0}]},
              "baselines": {"baseline_q95": 0.08}, "predicted_rmsre_tau": 0.0429, "model_predicted_rmsre_tau": 0.0406,
              "prediction": "replayed on the window's days", "release_period_days": 1.0}
    summary = {"parameters": {"version": "v"}, "rows_read": 10, "conversions_kept": 9, "conversions_dropped_by_cap": 1,
               "rows_rejected": 0, "keys": 4, "epsilon": 8.0}
    estimates = pd.DataFrame({"campaign": ["a", "a"], "query": ["count", "value"], "estimate": [1.0, 2.0],
                              "ci_low": [0.0, 1.0], "ci_high": [2.0, 3.0], "capped_estimate": [1.0, 2.0],
                              "std_error": [1.0, 1.0], "capped_std_error": [1.0, 1.0], "bias_corrected": [False, False]})
    print_results(report, summary, estimates)
    out = capsys.readouterr().out
    assert "0.0429" in out and "0.0406" not in out
