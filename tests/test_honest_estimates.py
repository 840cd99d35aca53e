"""Honest estimates: parameter versions carry a validated calibration; releases estimate the TRUE
totals (U / r_hat or, where dividing adds more noise than it removes bias, U) with intervals that
include the calibration's uncertainty; without a calibration everything still works and says so."""
from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import araopt.calibration as calibration
from araopt import Params, QueryParams
from araopt.io import outputs
from araopt.io.conversions import Conversions
from araopt.publication import ESTIMATE_COLUMNS
from araopt.version import ParameterVersion

T0 = pd.Timestamp("2026-11-20", tz="UTC")


def history(n=6000, seed=0, days=7, slices=("a", "b", "c")):
    rng = np.random.default_rng(seed)
    imp = rng.integers(0, n // 3, n)
    day = imp % days
    return pd.DataFrame({
        "impression_id": imp.astype("int64"),
        "conversion_time": T0 + pd.to_timedelta(day * 86400 + rng.integers(0, 86400, n), unit="s"),
        "s": np.asarray(slices, dtype=object)[imp % len(slices)],
        "v": rng.lognormal(2, 1, n),
    })


def params(clip=20.0, count_limit=2):
    return Params(count_limit=count_limit, encoding="linf", epsilon=8.0, slice_columns=("s",),
                  queries=(QueryParams("v", clip, 1.0),))


def calibrated(p, frame) -> ParameterVersion:
    conv = Conversions.from_table(frame, ["s"], ["v"])
    return ParameterVersion(p, calibration=calibration.calibrate(conv, p, calibration.history_blocks(conv)))


def test_parameters_carry_a_validated_calibration_and_refuse_a_wrong_one():
    p = calibrated(params(), history())
    again = ParameterVersion.from_bytes(p.to_bytes())
    assert again.calibration is not None and again.to_bytes() == p.to_bytes()
    assert 0 < again.calibration.ratio.min() <= again.calibration.ratio.max() <= 1
    doc = json.loads(p.to_bytes())
    for path, bad, message in ((("slices", "ratio"), 1.5, "ratio"), (("slices", "variance"), float("nan"), "varian"),
                               (("slices", "variance"), -1.0, "varian")):
        broken = json.loads(json.dumps(doc))
        cells = broken["calibration"][path[0]][path[1]]
        cells[0][0] = bad
        with pytest.raises(ValueError, match=message):
            ParameterVersion.from_json(broken)
    other = json.loads(json.dumps(doc))
    other["queries"][0]["clip_threshold"] = 30.0  # the calibration was fitted for clip 20
    with pytest.raises(ValueError, match="calibration does not match"):
        ParameterVersion.from_json(other)
    with pytest.raises(ValueError, match="calibration does not match"):
        dataclasses.replace(p, params=dataclasses.replace(p.params, count_limit=3))


@pytest.mark.statistical
def test_corrected_estimates_are_unbiased_for_the_true_totals_in_memory():
    from araopt.mechanism.measure import measure
    from araopt.publication import publish

    train, test = history(seed=1), history(seed=2)
    p = calibrated(params(), train)
    conv = Conversions.from_table(test, ["s"], ["v"])
    truth = conv.values[:, 0]
    runs = [publish(measure(conv, p.params, simulation_seed=s).release, p) for s in range(30)]
    corrected = np.array([r.corrected.estimate for r in runs]).mean(axis=0)
    capped = np.array([r.release.estimates.estimate for r in runs]).mean(axis=0)
    slices = conv.slices["s"]
    true_count = np.array([np.sum(slices == v) for v in runs[0].domain.slice_values()["s"]])
    true_value = np.array([truth[slices == v].sum() for v in runs[0].domain.slice_values()["s"]])
    # the cap drops a visible share of conversions; the correction brings the estimates back within a few %
    truth_table = np.column_stack([true_count, true_value])
    se = runs[0].corrected.std_error  # includes the calibration's uncertainty, which averaging runs does not remove
    assert (capped < 0.97 * truth_table).all()  # the cap and the clipping lose a visible share
    assert (np.abs(corrected - truth_table) < 3 * se).all()  # the correction is right within its own error bars
    assert (np.abs(capped - truth_table) > 3 * runs[0].release.estimates.std_error).any()  # which Alg. 4's are not


def test_the_count_correction_divides_the_count_only_with_the_same_intervals_of_the_true_totals():
    """``correction: count``: the count is the capped count over its ratio, each value its capped sum (its
    std_error holding the known bias), the intervals of the true totals as with ``ratio``."""
    from araopt.mechanism.measure import measure
    from araopt.publication import publish

    p = calibrated(params(), history(seed=3))
    conv = Conversions.from_table(history(seed=4), ["s"], ["v"])
    release = measure(conv, p.params, simulation_seed=1).release
    frames = {c: publish(release, dataclasses.replace(p, correction=c)).frame() for c in ("ratio", "none", "count")}
    count = frames["count"]["query"] == "count"
    for column in ("ci_low", "ci_high"):
        np.testing.assert_array_equal(frames["count"][column], frames["ratio"][column])
    np.testing.assert_array_equal(frames["count"]["estimate"][count], frames["ratio"]["estimate"][count])
    np.testing.assert_array_equal(frames["count"]["estimate"][~count], frames["none"]["estimate"][~count])
    np.testing.assert_array_equal(frames["count"]["std_error"][~count], frames["none"]["std_error"][~count])
    assert frames["count"]["bias_corrected"].tolist() == count.tolist()
    again = ParameterVersion.from_bytes(dataclasses.replace(p, correction="count").to_bytes())
    assert again.correction == "count"
    with pytest.raises(ValueError, match="correction"):
        dataclasses.replace(p, correction="values")


def test_a_joined_historys_calibration_stays_with_the_operator_a_privacy_safe_one_is_released():
    """A calibration fitted on the joined history is that history's exact per-slice statistics (estimate /
    capped_estimate is its ratio, the same in every release): the release folder's table is Alg. 4's and the
    true totals are operator-private; privacy-safe tuning's calibration (a post-processing of DP releases and
    first-party data) is released with its true totals."""
    from araopt.mechanism.measure import measure
    from araopt.publication import publish, release_json
    from araopt.version import JOINED_HISTORY_FIELDS, PRIVACY_SAFE, Provenance

    joined = calibrated(params(), history(seed=5))
    release = measure(Conversions.from_table(history(seed=6), ["s"], ["v"]), joined.params, simulation_seed=2).release
    publication = publish(release, joined)
    table, private = publication.release_frame(), publication.private_true_totals()
    assert private is not None and private["bias_corrected"].any()
    assert not table["bias_corrected"].any()
    np.testing.assert_array_equal(table["estimate"], table["capped_estimate"])
    np.testing.assert_array_equal(table["ci_low"], release.estimates.ci_low.reshape(-1))
    assert "operator-private" in release_json(publication, "0" * 64)["estimates_of"]
    safe = dataclasses.replace(joined, provenance=Provenance(extra={"tuning": f"{PRIVACY_SAFE}: from releases"}))
    released = publish(release, safe)
    assert released.private_true_totals() is None
    pd.testing.assert_frame_equal(released.release_frame(), private)
    # a joined version whose file was edited to claim privacy-safe tuning still records its joined reading
    for field in JOINED_HISTORY_FIELDS:
        forged = dataclasses.replace(joined, provenance=Provenance(extra={"tuning": f"{PRIVACY_SAFE}: edited",
                                                                          field: "the joined history"}))
        assert not forged.provenance.privacy_safe
        assert publish(release, forged).private_true_totals() is not None


def write(frame, path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)
    return path


@pytest.mark.slow
def test_optimize_fits_the_calibration_and_measure_releases_true_totals(tmp_path, capsys):
    from pipelines import measure as measure_pipeline
    from pipelines.ara import run_reconstruct
    from pipelines.optimize import run_optimize

    write(history(n=9000, seed=3), str(tmp_path / "hist" / "part-0.parquet"))
    day = history(n=3000, seed=4, days=1)  # the day after the history (its own days are refused: release_rules)
    write(day.assign(conversion_time=day["conversion_time"] + pd.Timedelta(days=7)),
          str(tmp_path / "day" / "part-0.parquet"))
    assert run_optimize(["--history", str(tmp_path / "hist"), "--slices", "s", "--values", "v", "--epsilon", "8",
                         "--max-count-limit", "6", "--output", str(tmp_path / "p.json"), "--no-progress"]) == 0
    p = ParameterVersion.load(tmp_path / "p.json")
    assert p.calibration is not None and p.correction in ("ratio", "none")
    assert "history" in p.provenance.extra  # what marks it joined, whatever its 'tuning' is edited to say
    assert p.provenance.extra["estimator"]["correction"] == p.correction
    (tmp_path / "dom.csv").write_text("s\na\nb\nc\nnever-seen\n")  # a declared slice the history never had
    capsys.readouterr()
    assert measure_pipeline.run(["--input", str(tmp_path / "day"), "--params", str(tmp_path / "p.json"), "--output",
                                 str(tmp_path / "o"), "--domain", str(tmp_path / "dom.csv")]) == 0
    out = capsys.readouterr().out
    assert "estimates are of the TRUE totals" in out and "1 slice(s) absent from the history" in out
    # the true totals hold the joined history's per-slice ratios: operator-private; the release holds Alg. 4's
    released = pd.read_csv(tmp_path / "o" / outputs.release_file(outputs.ESTIMATES_CSV, False))
    assert not released["bias_corrected"].any()
    np.testing.assert_array_equal(released["estimate"], released["capped_estimate"])
    est = pd.read_csv(tmp_path / "o" / outputs.private_file(outputs.TRUE_TOTALS_CSV))
    np.testing.assert_array_equal(est["capped_estimate"], released["capped_estimate"])
    assert list(est.columns) == ["s", "query", *ESTIMATE_COLUMNS]
    assert est["bias_corrected"].all() == (p.correction == "ratio")
    # the interval is cut at 0 (a total is never negative); the unbiased estimate is not, so it may lie below
    point = est["estimate"].clip(lower=0.0)
    assert ((est["ci_low"] <= point) & (point <= est["ci_high"]) & (est["ci_low"] >= 0)).all()
    summary = json.loads((tmp_path / "o" / "private" / "run_summary.json").read_text())
    assert summary["calibration"]["retention_checksum"] == p.calibration.retention_checksum
    assert summary["calibration"]["fallback_slices"] == 1
    release = json.loads((tmp_path / "o" / "release" / "release.json").read_text())
    assert "true totals, calibrated on the joined history, are operator-private" in release["estimates_of"]
    # reconstruct applies the same calibration to the same report, and says its output is operator-private
    assert run_reconstruct(["--summary-report", str(tmp_path / "o" / "release" / "summary_report.avro"), "--params",
                            str(tmp_path / "p.json"), "--key-map", str(tmp_path / "o" / "release" / "key_map.json"),
                            "--output", str(tmp_path / "r.csv")]) == 0
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "r.csv"), est)
    assert "calibrated on the joined history" in capsys.readouterr().err


@pytest.mark.slow
def test_parameters_without_calibration_work_and_say_so_once(tmp_path, capsys):
    from pipelines import measure as measure_pipeline

    write(history(n=2000, seed=5, days=1), str(tmp_path / "day" / "part-0.parquet"))
    ParameterVersion(params()).save(tmp_path / "p.json")
    (tmp_path / "dom.csv").write_text("s\na\nb\nc\n")
    assert measure_pipeline.run(["--input", str(tmp_path / "day"), "--params", str(tmp_path / "p.json"), "--output",
                                 str(tmp_path / "o"), "--domain", str(tmp_path / "dom.csv")]) == 0
    out = capsys.readouterr().out
    assert out.count("carry no calibration") == 1
    est = pd.read_csv(tmp_path / "o" / outputs.release_file(outputs.ESTIMATES_CSV, False))
    assert not est["bias_corrected"].any()
    assert (est["estimate"] == est["capped_estimate"]).all() and (est["std_error"] == est["capped_std_error"]).all()
    assert json.loads((tmp_path / "o" / "private" / "run_summary.json").read_text())["calibration"] is None
