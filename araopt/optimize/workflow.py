"""Tune on a history, then calibrate the candidates: the tuning workflow written once.

    grouped history -> sufficient statistics (Sec. 4.2) -> ParameterOptimization (Alg. 5, ``tune``)
    -> the candidate parameter versions -> per candidate the calibration statistics on the same
    history -> ``calibrate`` (fit, calendar, backtest choice of parameters and estimator)

The two distributed steps (statistics; calibration of the candidates, which depend on the statistics)
are a backend's: ``InMemoryBackend`` runs them on a ``Conversions`` in this process (evaluate, replay,
tests); the Beam job (``pipelines.history.compute_tuned_history``, built from
``transforms.statistics`` and ``transforms.calibration``) runs the same combiners over a sharded log.
Both take the same ``choose`` (statistics -> (result, candidates)), so what is tuned and what is
calibrated is decided once, here.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from araopt.calibration.accumulator import CalibrationStatistics, candidates_statistics, day_blocks
from araopt.io.conversions import Conversions, ValidationCounts, rejected_share_refusal
from araopt.optimize.statistics import StatisticsSpec, SufficientStatistics, compute_statistics_in_memory
from araopt.optimize.tune import TuningResult, calibrate, tune
from araopt.version import ParameterVersion

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

Choose = Callable[[SufficientStatistics], tuple[T, tuple[ParameterVersion, ...]]]
"""What a workflow makes of a history's statistics: its result and the candidate versions to calibrate."""


@dataclass(frozen=True)
class HistoryRun(Generic[T_co]):
    """A history's statistics, what ``choose`` made of them, and one ``CalibrationStatistics`` per
    candidate (in ``choose``'s order), from one pass over the grouped history."""

    statistics: SufficientStatistics
    chosen: T_co
    calibration: tuple[CalibrationStatistics, ...]


class TuningBackend(Protocol):
    """Where the distributed steps of tuning run: grouped history -> statistics, then per candidate
    that ``choose`` returns, its calibration statistics on the same history."""

    def statistics_and_calibration(self, spec: StatisticsSpec, choose: Choose[T]) -> HistoryRun[T]: ...


@dataclass(frozen=True)
class InMemoryBackend:
    """The steps on a log held in memory (every impression's conversions together; blocks are UTC days).
    ``statistics``: the log's statistics when they were computed already (e.g. by a Beam job)."""

    conversions: Conversions
    statistics: SufficientStatistics | None = None

    def statistics_and_calibration(self, spec: StatisticsSpec, choose: Choose[T]) -> HistoryRun[T]:
        statistics = (compute_statistics_in_memory(self.conversions, spec) if self.statistics is None
                      else self.statistics)
        chosen, candidates = choose(statistics)
        blocks = day_blocks(self.conversions)
        calibration = tuple(candidates_statistics(self.conversions, [(v.params, v.checksum()) for v in candidates],
                                                  blocks))
        return HistoryRun(statistics, chosen, calibration)


@dataclass(frozen=True)
class TuneCandidates:
    """``choose`` for tuning: Alg. 5 with the baselines (``tune(statistics, epsilon, **options)``), then
    ``prepare`` (e.g. an exploration plan and a declared domain) on every candidate
    version; the candidates are what ``calibrate`` compares. A picklable callable (Beam runs it)."""

    epsilon: float
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    prepare: Callable[[ParameterVersion], ParameterVersion] | None = None

    def __call__(self, statistics: SufficientStatistics) -> tuple[TuningResult, tuple[ParameterVersion, ...]]:
        result = tune(statistics, self.epsilon, **dict(self.options))
        if self.prepare is not None:
            prepare = self.prepare
            result = dataclasses.replace(result, version=prepare(result.version),
                                         alternatives=tuple((prepare(v), o) for v, o in result.alternatives))
        return result, tuple(v for v, _ in result.candidates)


def tune_and_calibrate(backend: TuningBackend, spec: StatisticsSpec, choose: TuneCandidates,
                       release_period_days: float | None = None, special_days: Sequence[str] = ()) -> TuningResult:
    """Tune on the backend's history, then calibrate the candidates on it and keep the one the backtest
    prefers (``calibrate``)."""
    run = backend.statistics_and_calibration(spec, choose)
    return calibrate(run.chosen, run.calibration, release_period_days, special_days)


def gated_choice(statistics: SufficientStatistics, counts: ValidationCounts,
                 choose: Callable[[SufficientStatistics, ValidationCounts], tuple[T, tuple[ParameterVersion, ...]]],
                 max_rejected_fraction: float) -> tuple[T | None, tuple[ParameterVersion, ...]]:
    """``choose`` on a history that passes the rejected-share gate (``io.conversions.rejected_share_refusal``);
    nothing (and no candidate to calibrate) on one that does not: the caller refuses it, in one line."""
    if rejected_share_refusal(counts, max_rejected_fraction, what="history") is not None:
        return None, ()
    return choose(statistics, counts)


def tune_with_accounting(statistics: SufficientStatistics, counts: ValidationCounts, *, provenance: dict[str, Any],
                         **options: Any) -> tuple[TuningResult, tuple[ParameterVersion, ...]]:
    """``choose`` for ``optimize`` on a joined history: ``tune`` on its statistics with the row accounting
    in the parameter file's provenance, and the candidate versions to calibrate on the same history."""
    tuning = tune(statistics, rows=counts.rows_valid, provenance={**provenance, "row_accounting": {
        "rows_read": counts.rows_read, "rows_rejected": counts.rows_rejected,
        "rows_rejected_by_reason": dict(counts.rejected_by_reason)}}, **options)
    return tuning, tuple(v for v, _ in tuning.candidates)
