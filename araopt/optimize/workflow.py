"""Tune on a history, then calibrate the candidates: the tuning workflow written once, for either
target (``TuningMechanism``: the target's search and what its calibration makes of the candidates).

    history -> its statistics -> the search (Alg. 5 with the baselines: ``choose``) -> the candidate
    parameter versions -> per candidate its calibration statistics on the same history -> the
    target's conclusion (``conclude``) -> the tuned result; the guardrails and the decision on it are
    ``araopt.nightly``'s

ARA (``AraTuning``): the statistics are the sufficient statistics (Sec. 4.2), ``choose`` is
``TuneCandidates`` (``tune``), the calibration statistics ``CalibrationStatistics`` and ``conclude`` is
``calibrate`` (fit, calendar, backtest choice of parameters and estimator). W3C Attribution
(``optimize.attribution.AttributionTuner``): the statistics are the history's histogram layout over
its rows, ``choose`` Alg. 5 for the target (the browsers simulated) with its baselines, the calibration
the retention of each candidate on the same rows, ``conclude`` the version carrying it.

The two distributed steps (statistics; calibration of the candidates, which depend on the statistics)
are a backend's: ``InMemoryBackend`` runs ARA's on a ``Conversions`` in this process (evaluate, replay,
tests); the Beam backend (``pipelines.history.BeamBackend``: one job, ``transforms.tuning.build_history``,
built from ``transforms.statistics`` and ``transforms.calibration``) runs the same combiners over a
sharded log and passes ``choose`` the job's row accounting too (``AraTuning.choose``: it goes to the
provenance) behind the rejected-share gate (``gated_choice``); ``optimize``'s job runs the workflow on it,
``nightly``'s job runs ``araopt.nightly.nightly_tuning``'s steps in its single-element steps;
``optimize.attribution.AttributionBackend`` runs Attribution's on its rows in memory. Every backend
takes the mechanism's ``choose``, so what is tuned and what is calibrated is decided once per target.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from araopt.calibration.accumulator import CalibrationStatistics, candidates_statistics, day_blocks
from araopt.calibration.calendar import UNSEEN_LOSS_FACTOR
from araopt.errors import InvalidParameters
from araopt.io.conversions import Conversions, ValidationCounts, rejected_share_refusal
from araopt.optimize.statistics import StatisticsSpec, SufficientStatistics, compute_statistics_in_memory
from araopt.optimize.tune import TuningResult, calibrate, tune
from araopt.version import ParameterVersion

S = TypeVar("S")
T = TypeVar("T")
C = TypeVar("C")
S_contra = TypeVar("S_contra", contravariant=True)
C_contra = TypeVar("C_contra", contravariant=True)
R_co = TypeVar("R_co", covariant=True)
S_co = TypeVar("S_co", covariant=True)
T_co = TypeVar("T_co", covariant=True)
C_co = TypeVar("C_co", covariant=True)

Choose = Callable[[S], tuple[T, tuple[ParameterVersion, ...]]]
"""What a workflow makes of a history's statistics: its result and the candidate versions to calibrate."""


@dataclass(frozen=True)
class HistoryRun(Generic[S_co, T_co, C_co]):
    """A history's statistics, what ``choose`` made of them, and one calibration statistics per
    candidate (in ``choose``'s order), from one pass over the grouped history."""

    statistics: S_co
    chosen: T_co
    calibration: tuple[C_co, ...]


class TuningBackend(Protocol[S_co, C_co]):
    """Where the distributed steps of tuning run: history -> statistics, then per candidate that
    ``choose`` returns, its calibration statistics on the same history."""

    def statistics_and_calibration(self, spec: Any, choose: Choose[Any, T]) -> HistoryRun[S_co, T, C_co]: ...


class TuningMechanism(Protocol[S_contra, T, C_contra, R_co]):
    """A target's tuning steps, which the one workflow runs (``tune_and_calibrate``): ``choose`` (the
    search on the history's statistics: Alg. 5 with the baselines, and the candidate versions) and
    ``conclude`` (the candidates' calibrations on the same history -> the tuned result)."""

    def choose(self, statistics: S_contra) -> tuple[T, tuple[ParameterVersion, ...]]: ...

    def conclude(self, chosen: T, calibration: tuple[C_contra, ...]) -> R_co: ...


@dataclass(frozen=True)
class InMemoryBackend:
    """The steps on a log held in memory (every impression's conversions together; blocks are UTC days).
    ``statistics``: the log's statistics when they were computed already (e.g. by a Beam job); with
    them and no log (``conversions`` None) only a ``choose`` that returns no candidate can run."""

    conversions: Conversions | None
    statistics: SufficientStatistics | None = None

    def statistics_and_calibration(self, spec: StatisticsSpec, choose: Choose[SufficientStatistics, T]
                                   ) -> HistoryRun[SufficientStatistics, T, CalibrationStatistics]:
        if self.statistics is not None:
            statistics = self.statistics
        elif self.conversions is not None:
            statistics = compute_statistics_in_memory(self.conversions, spec)
        else:
            raise InvalidParameters("tuning in memory needs the history's conversions or its statistics")
        chosen, candidates = choose(statistics)
        if not candidates:
            return HistoryRun(statistics, chosen, ())
        if self.conversions is None:
            raise InvalidParameters("calibrating candidates needs the history's conversions, not only its statistics")
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

    def with_row_accounting(self, counts: ValidationCounts) -> TuneCandidates:
        """This search on a joined history whose rows were validated (the Beam job's ``counts``): the
        parameter version records the valid rows and the row accounting in its provenance."""
        options = dict(self.options)
        options.update(rows=counts.rows_valid, provenance={**dict(options.get("provenance") or {}), "row_accounting": {
            "rows_read": counts.rows_read, "rows_rejected": counts.rows_rejected,
            "rows_rejected_by_reason": dict(counts.rejected_by_reason)}})
        return dataclasses.replace(self, options=options)


@dataclass(frozen=True)
class AraTuning:
    """ARA's tuning steps (``TuningMechanism``): ``search`` (``TuneCandidates``) chooses, then
    ``calibrate`` attaches each candidate's calibration and keeps the one the backtest of releases of
    ``release_period_days`` prefers (``special_days``, ``special_day_loss_factor``: the calendar's)."""

    search: TuneCandidates
    release_period_days: float | None = None
    special_days: Sequence[str] = ()
    special_day_loss_factor: float = UNSEEN_LOSS_FACTOR

    def choose(self, statistics: SufficientStatistics, counts: ValidationCounts | None = None
               ) -> tuple[TuningResult, tuple[ParameterVersion, ...]]:
        """The search (Alg. 5 with the baselines) and its candidates; ``counts``: the history's row
        accounting where a backend validated its rows (the Beam job's), recorded in the provenance."""
        return (self.search if counts is None else self.search.with_row_accounting(counts))(statistics)

    def conclude(self, chosen: TuningResult, calibration: Sequence[CalibrationStatistics] | None) -> TuningResult:
        """The candidates' calibrations attached and the backtest's choice among them (``calibrate``)."""
        return calibrate(chosen, calibration, self.release_period_days, self.special_days,
                         self.special_day_loss_factor)


def tune_and_calibrate(backend: TuningBackend[S, C], spec: Any, mechanism: TuningMechanism[S, T, C, R_co]) -> R_co:
    """The tuning workflow: the backend's statistics of its history, the mechanism's search on them
    (``choose``), the candidates' calibration statistics on the same history (the backend's), and the
    mechanism's conclusion from them (``conclude``)."""
    return tune_and_calibrate_run(backend, spec, mechanism)[1]


def tune_and_calibrate_run(backend: TuningBackend[S, C], spec: Any, mechanism: TuningMechanism[S, T, C, R_co]
                           ) -> tuple[HistoryRun[S, T, C], R_co]:
    """``tune_and_calibrate`` with the backend's run beside the conclusion (for a command that reports
    the history's statistics or the backend's row accounting, e.g. ``optimize``'s Beam job)."""
    run = backend.statistics_and_calibration(spec, mechanism.choose)
    return run, mechanism.conclude(run.chosen, run.calibration)


def gated_choice(statistics: SufficientStatistics, counts: ValidationCounts,
                 choose: Callable[[SufficientStatistics, ValidationCounts], tuple[T, tuple[ParameterVersion, ...]]],
                 max_rejected_fraction: float) -> tuple[T | None, tuple[ParameterVersion, ...]]:
    """``choose`` on a history that passes the rejected-share gate (``io.conversions.rejected_share_refusal``);
    nothing (and no candidate to calibrate) on one that does not: the caller refuses it, in one line."""
    if rejected_share_refusal(counts, max_rejected_fraction, what="history") is not None:
        return None, ()
    return choose(statistics, counts)

