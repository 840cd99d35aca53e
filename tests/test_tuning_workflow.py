"""Specification of the tuning workflow written once (``araopt.optimize.workflow``): its two backends,
in memory and the Beam job (``pipelines.history.BeamBackend``: one job over
``transforms.tuning.StatisticsAndCalibration``), give the same statistics, the same candidates and the
same calibration on the same seeded history (equal up to the order floats are merged in), and so the
same calibrated parameters."""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from araopt.calibration.accumulator import CalibrationStatistics
from araopt.constants import Objective
from araopt.optimize.statistics import StatisticsSpec, SufficientStatistics
from araopt.optimize.workflow import (
    AraTuning,
    InMemoryBackend,
    TuneCandidates,
    tune_and_calibrate,
    tune_and_calibrate_run,
)
from araopt.version import ParameterVersion
from factories import write_history

SLICES = ("campaign", "geo")
VALUES = ("value",)
DAYS = tuple(f"2026-11-{d:02d}" for d in range(10, 16))


def _close(a: Any, b: Any, where: str) -> None:
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        assert type(a) is type(b), where
        for f in dataclasses.fields(a):
            _close(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    elif isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, f"{where}[{i}]")
    elif isinstance(a, np.ndarray):
        assert a.shape == b.shape, where
        if a.dtype.kind in "fc":
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9, err_msg=where)
        else:
            np.testing.assert_array_equal(a, b, err_msg=where)
    elif isinstance(a, float):
        assert a == pytest.approx(b, rel=1e-9), where
    else:
        assert a == b, where


def assert_same_statistics(a: SufficientStatistics | CalibrationStatistics,
                           b: SufficientStatistics | CalibrationStatistics) -> None:
    for f in dataclasses.fields(a):
        _close(getattr(a, f.name), getattr(b, f.name), f.name)


@pytest.mark.slow
def test_the_in_memory_and_the_beam_backends_tune_and_calibrate_alike(tmp_path):
    from pipelines.history import BeamBackend, TunedHistoryRun
    from pipelines.inputs import load_conversions
    from transforms.io import check_input

    root = write_history(tmp_path / "history", days=DAYS, n=1500, seed=3)
    inputs = check_input(str(root) + "/date=*/*.parquet", SLICES, VALUES)
    conversions, _, _ = load_conversions(inputs, SLICES, VALUES)
    spec = StatisticsSpec(SLICES, VALUES, max_count_limit=8)
    choose = TuneCandidates(8.0, {"objective": Objective.CORRECTED, "max_count_limit": 8, "slice_columns": SLICES,
                                  "release_period_days": 1.0})

    memory = InMemoryBackend(conversions).statistics_and_calibration(spec, choose)
    job, on_beam = tune_and_calibrate_run(BeamBackend(inputs, num_shards=3), spec, AraTuning(choose, 1.0))
    assert isinstance(job, TunedHistoryRun) and job.counts.rows_rejected == 0

    assert_same_statistics(memory.statistics, job.statistics)
    assert len(memory.chosen.candidates) == len(job.calibration) >= 1
    for (v_mem, _), (v_job, _) in zip(memory.chosen.candidates, job.chosen.candidates, strict=True):
        _close(v_mem.params, v_job.params, "candidate")  # (tau: the last digit may differ)
    for run in (memory, job):  # each backend calibrates exactly the candidates its choice returned
        assert [c.fitted_for for c in run.calibration] == [v.checksum() for v, _ in run.chosen.candidates]
    for c_mem, c_job in zip(memory.calibration, job.calibration, strict=True):
        _close(c_mem.params, c_job.params, "calibrated")
        for name in ("slice_columns", "slice_keys", "block_keys", "cells", "num_conversions"):
            _close(getattr(c_mem, name), getattr(c_job, name), name)
    # the calibrated decision: the same parameters, estimator and backtest on both
    in_memory = tune_and_calibrate(InMemoryBackend(conversions), spec, AraTuning(choose, 1.0))
    _close(in_memory.version.params, on_beam.version.params, "decision")
    assert in_memory.version.correction == on_beam.version.correction
    assert in_memory.predicted_rmsre_tau == pytest.approx(on_beam.predicted_rmsre_tau, rel=1e-9)
    assert "backtest" in in_memory.version.provenance.extra  # six days: the candidates were replayed
    # the Beam backend gives the search its row accounting (the provenance's), the in-memory one has none
    assert on_beam.version.provenance.extra["row_accounting"] == {
        "rows_read": job.counts.rows_read, "rows_rejected": 0, "rows_rejected_by_reason": {}}
    assert "row_accounting" not in in_memory.version.provenance.extra


def test_the_search_records_the_row_accounting_it_is_given():
    # optimize's Beam job validates the history's rows: AraTuning.choose(statistics, counts) tunes with the
    # valid rows and the accounting in the provenance; the candidates it returns (what is calibrated)
    # carry it too, and without counts nothing of it is recorded
    from araopt.io.conversions import ValidationCounts
    from araopt.optimize.statistics import compute_statistics_in_memory
    from factories import small_d2

    conv = small_d2()
    statistics = compute_statistics_in_memory(conv, StatisticsSpec(conv.slice_columns, conv.value_columns,
                                                                   max_count_limit=4))
    mechanism = AraTuning(TuneCandidates(4.0, {"objective": Objective.CORRECTED, "max_count_limit": 4,
                                               "provenance": {"history": "h"}}))
    counts = ValidationCounts(rows_read=1000, rows_rejected=7, rejected_by_reason={"null_value": 7})
    accounted, candidates = mechanism.choose(statistics, counts)
    plain, _ = mechanism.choose(statistics)
    for version in (accounted.version, *candidates):
        assert version.provenance.rows == 993
        assert version.provenance.extra["history"] == "h"
        assert version.provenance.extra["row_accounting"] == {
            "rows_read": 1000, "rows_rejected": 7, "rows_rejected_by_reason": {"null_value": 7}}
    assert plain.version.provenance.rows == statistics.num_conversions != 993
    assert "row_accounting" not in plain.version.provenance.extra
    assert mechanism.search.options["provenance"] == {"history": "h"}  # the mechanism itself is unchanged


def test_prepare_is_applied_to_every_candidate_before_calibration():
    from factories import small_d2

    conv = small_d2()
    seen: list[str] = []

    def mark(version: ParameterVersion) -> ParameterVersion:
        seen.append(version.checksum())
        return dataclasses.replace(version, correction="none")

    spec = StatisticsSpec(conv.slice_columns, conv.value_columns, max_count_limit=4)
    choose = TuneCandidates(4.0, {"objective": Objective.CORRECTED, "max_count_limit": 4}, mark)
    run = InMemoryBackend(conv).statistics_and_calibration(spec, choose)
    assert len(seen) == len(run.chosen.candidates) == len(run.calibration)
    assert all(v.correction == "none" for v, _ in run.chosen.candidates)
    assert [c.fitted_for for c in run.calibration] == [v.checksum() for v, _ in run.chosen.candidates]


def test_the_evaluation_tunes_every_compared_method_through_the_workflow():
    # evaluate's comparison at one epsilon is the workflow with its steps (ComparedMethods): the
    # searched methods are not calibrated, the corrected method's candidates are, and its version is
    # the backtest's choice among them (AraTuning), as when it is tuned on its own.
    from araopt.evaluation.evaluate import ComparedMethods
    from araopt.evaluation.methods import CORRECTED_METHOD
    from araopt.optimize.search import prepare_search
    from araopt.optimize.statistics import compute_statistics_in_memory
    from factories import small_d2

    conv = small_d2()
    spec = StatisticsSpec(conv.slice_columns, conv.value_columns, max_count_limit=4)
    stats = compute_statistics_in_memory(conv, spec)
    taus = tuple(stats.taus().tolist())
    methods = ("optimized_linf", "baseline_q95", CORRECTED_METHOD)

    def compared(corrected: bool) -> ComparedMethods:
        return ComparedMethods(4.0, methods, stats, prepare_search(stats, np.asarray(taus)), taus, 4, "exact",
                               False, None, corrected)

    both = tune_and_calibrate(InMemoryBackend(conv, stats), spec, compared(True))
    assert list(both.candidates) == list(methods)
    assert both.linf is not None and both.candidates["optimized_linf"][0].params == both.linf.params
    assert all(v.calibration is None for m, (v, _) in both.candidates.items() if m != CORRECTED_METHOD)
    alone = tune_and_calibrate(InMemoryBackend(conv, stats), spec, AraTuning(TuneCandidates(4.0, {
        "max_count_limit": 4, "objective": Objective.CORRECTED, "taus": list(taus), "release_period_days": None})))
    version, value = both.candidates[CORRECTED_METHOD]
    assert version.calibration is not None and version.params == alone.version.params
    fitted = [{k: v for k, v in c.to_json().items() if k != "params_checksum"}  # (the version's: its created_at)
              for c in (version.calibration, alone.version.calibration)]
    assert fitted[0] == fitted[1]
    assert version.correction == alone.version.correction and value == alone.predicted_rmsre_tau
    # the statistics alone serve the searched methods; calibrating a candidate needs the log
    searched = tune_and_calibrate(InMemoryBackend(None, stats), spec, compared(False))
    assert list(searched.candidates) == list(methods[:2])
    with pytest.raises(ValueError, match="needs the history's conversions"):
        tune_and_calibrate(InMemoryBackend(None, stats), spec, compared(True))
