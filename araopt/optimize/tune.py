"""Tuning decisions, engine-free: ParameterOptimization (Alg. 5) with the paper's baselines (Sec. 5.1)
as one typed result whose chosen parameters are a parameter version (``araopt.version``) carrying the
history's key domain and provenance; and ``calibrate``, which attaches the history's calibration and
chooses between the candidates by replaying their releases on the history's days. ``pipelines``,
``araopt.nightly`` and ``araopt.evaluation.evaluate`` call these; none of them decides anything on its own.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from araopt.calibration.accumulator import CalibrationStatistics
from araopt.calibration.backtest import backtest
from araopt.calibration.calendar import UNSEEN_LOSS_FACTOR, fit_calendar
from araopt.calibration.fit import fit_calibration
from araopt.calibration.model import retention_checksum
from araopt.constants import L1_ROUNDING, MAX_COUNT_LIMIT, OBJECTIVE, Objective
from araopt.errors import InvalidParameters
from araopt.io.files import utc_now_iso
from araopt.mechanism.params import Encoding, L1Rounding, Params
from araopt.optimize.baselines import Baseline, baselines
from araopt.optimize.corrected import corrected_objective
from araopt.optimize.error_model import PREDICTED_WITHOUT_SIGNAL, predicted_without_signal
from araopt.optimize.objective import predicted_rmsre_tau, statistics_breakdown
from araopt.optimize.search import OptimizationResult, SearchContext, check_objective, optimize
from araopt.optimize.statistics import SufficientStatistics
from araopt.version import ParameterVersion, Provenance

DEFAULT_TAU_RULE = "count 5; each value query 5 x its median per conversion in the history (Sec. 5.1)"
CORRECTION_MARGIN = 0.02
"""Switch away from the paper's estimator only if the history predicts at least this much lower error."""
MIN_BACKTEST_BLOCKS = 3
"""A backtest over fewer windows of history says too little: the model's prediction stands."""


def resolve_taus(statistics: SufficientStatistics, overrides: Mapping[str, float] | None = None
                 ) -> tuple[np.ndarray, str]:
    """The RMSRE_tau thresholds (count first, then each value query) and a sentence saying where each
    comes from: ``overrides`` (query name -> tau, "count" for the count) or the paper's default rule."""
    taus = statistics.taus()
    names = ("count",) + tuple(statistics.value_columns)
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(names))
    if unknown:
        raise InvalidParameters(f"--tau names unknown queries {unknown}; the queries are {list(names)}")
    parts = []
    for i, name in enumerate(names):
        if name in overrides:
            value = float(overrides[name])
            if not (math.isfinite(value) and value > 0):
                raise InvalidParameters(f"--tau {name} must be a finite number > 0, got {overrides[name]!r}")
            taus[i] = value
            parts.append(f"{name} {value:.4g} (--tau)")
        else:
            rule = "default" if i == 0 else "5 x median"
            parts.append(f"{name} {taus[i]:.4g} ({rule})")
    return taus, "tau: " + ", ".join(parts)


@dataclass(frozen=True)
class TuningResult:
    """The chosen parameter version (with the history's domain and provenance), the search, and the
    baselines; ``alternatives``: other finished candidates (the other objective's optimum), which
    ``calibrate`` may prefer."""

    version: ParameterVersion
    optimization: OptimizationResult
    baselines: tuple[Baseline, ...]
    tau_rule: str = ""
    alternatives: tuple[tuple[ParameterVersion, OptimizationResult], ...] = ()

    @property
    def params(self) -> Params:
        """The chosen mechanism parameters."""
        return self.version.params

    @property
    def candidates(self) -> tuple[tuple[ParameterVersion, OptimizationResult], ...]:
        """(version, search) of the model's choice first, then the alternatives."""
        return ((self.version, self.optimization),) + self.alternatives

    @property
    def predicted_rmsre_tau(self) -> float:
        return self.optimization.predicted_rmsre_tau

    @property
    def taus(self) -> tuple[float, ...]:
        return self.optimization.taus

    def baseline_values(self) -> dict[str, float]:
        return {b.name: b.rmsre_tau for b in self.baselines}

    @property
    def best_baseline(self) -> Baseline:
        return min(self.baselines, key=lambda b: b.rmsre_tau)


@dataclass(frozen=True)
class EstimatorChoice:
    """Which point estimate the history recommends for ``params``, with the predicted RMSRE_tau of each."""

    correction: str  # "ratio" (U / r_hat) or "none" (the capped estimate U)
    capped_rmsre_tau: float
    corrected_rmsre_tau: float


def corrected_model_supports(params: Params) -> bool:
    """Whether the corrected estimator's error model (``optimize.corrected``) covers ``params``."""
    return params.encoding == Encoding.LINF or (params.encoding == Encoding.L1 and params.num_queries == 1
                                                and params.l1_rounding == L1Rounding.RANDOMIZED)


def choose_correction(statistics: SufficientStatistics, params: Params, taus: Sequence[float]) -> EstimatorChoice:
    """Divide by the retention ratio only where the history predicts a lower error of the true totals
    (dividing inflates the noise by 1/r: for noise-dominated slices the capped estimate is better)."""
    t = np.asarray(taus, dtype=np.float64)
    capped = predicted_rmsre_tau(statistics, params, t, Objective.CORRECTED.error_model)
    corrected = corrected_objective(statistics, params, t)
    choice = "ratio" if corrected < capped * (1.0 - CORRECTION_MARGIN) else "none"
    return EstimatorChoice(choice, capped, corrected)


def tune(statistics: SufficientStatistics, epsilon: float, *, encoding: str = Encoding.LINF,
         max_count_limit: int = MAX_COUNT_LIMIT, objective: Objective = OBJECTIVE, l1_rounding: str = L1_ROUNDING,
         slice_columns: Sequence[str] | None = None, taus: Sequence[float] | None = None,
         tau_overrides: Mapping[str, float] | None = None, training_window: tuple[str | None, str | None] = (None, None),
         rows: int | None = None, provenance: Mapping[str, Any] | None = None, progress: bool = False,
         context: SearchContext | None = None, release_period_days: float | None = None,
         history_days: float | None = None) -> TuningResult:
    """Alg. 5 on the statistics, the baselines on the same statistics and taus, and the parameter
    version to publish: the chosen parameters with the history's key domain and their provenance.
    ``taus`` (count first) or ``tau_overrides`` (query name -> tau) replace the default rule.

    ``objective`` "corrected" (L-inf) searches for both the paper's estimator and the corrected one
    and keeps the better (the other is the alternative ``calibrate`` may prefer); "exact" and
    "relaxed" search for the paper's. ``release_period_days``: tune for releases of that many days
    (the noise of a release does not depend on its length, its volume does): the statistics are
    scaled to the expected volume of one release (``SufficientStatistics.for_release_period``;
    ``history_days`` defaults to the days with conversions in the statistics), and every prediction
    is for one such release. None: a release as large as the history (the paper's setting)."""
    hist_days = float(statistics.history_days() if history_days is None else history_days)
    if release_period_days is not None:
        statistics = statistics.for_release_period(release_period_days, hist_days)
    if taus is None:
        resolved, tau_rule = resolve_taus(statistics, tau_overrides)
        taus = resolved.tolist()
    else:
        tau_rule = "tau: " + ", ".join(f"{t:.4g}" for t in taus) + " (given)"
    objective = check_objective(objective)
    paper_objective = objective.error_model
    result = optimize(statistics, epsilon, str(encoding), max_count_limit, paper_objective, taus=taus,
                      progress=progress, l1_rounding=str(l1_rounding), slice_columns=slice_columns, context=context)
    # the corrected error model covers L-inf (and L1 with one query); other parameters correct by ratio
    choice = (choose_correction(statistics, result.params, result.taus) if corrected_model_supports(result.params)
              else None)
    alternative: tuple[OptimizationResult, EstimatorChoice | None] | None = None
    if objective == Objective.CORRECTED and str(encoding) == Encoding.LINF:
        assert choice is not None  # (L-inf is covered)
        best_capped = min(choice.capped_rmsre_tau, choice.corrected_rmsre_tau)
        corrected = optimize(statistics, epsilon, Encoding.LINF, max_count_limit, objective, taus=result.taus,
                             progress=progress, slice_columns=slice_columns)
        corrected_choice = EstimatorChoice("ratio", predicted_rmsre_tau(statistics, corrected.params,
                                                                        np.asarray(result.taus), paper_objective),
                                           corrected.predicted_rmsre_tau)
        paper_result = dataclasses.replace(result, predicted_rmsre_tau=best_capped, objective=objective)
        if corrected.predicted_rmsre_tau < best_capped * (1.0 - CORRECTION_MARGIN):
            result, choice, alternative = corrected, corrected_choice, (paper_result, choice)
        else:
            result, alternative = paper_result, (corrected, corrected_choice)
    base = baselines(statistics, epsilon, max_count_limit, result.taus, paper_objective, slice_columns)

    def finish(found: OptimizationResult, estimator: EstimatorChoice | None) -> ParameterVersion:
        domain = found.params.history_domain(statistics.slice_values())
        if statistics.time_range is not None:  # the end of the history it lists, so no release lists it over it
            domain = domain.learnt_before(statistics.time_range[1])
        extra = {"optimizer": "araopt.optimize.search.optimize (ParameterOptimization, Alg. 5)", "encoding": str(encoding),
                 "max_count_limit": max_count_limit, "baselines": {b.name: b.to_json() for b in base},
                 "per_count_limit": [{"C": r.count_limit, "rmsre_tau": r.rmsre_tau} for r in found.per_count_limit],
                 "optimizer_seconds": found.seconds, "taus": list(found.taus), "tau_rule": tau_rule,
                 "release_period_days": release_period_days if release_period_days is not None else hist_days,
                 "history_days": hist_days, "volume_scale": statistics.volume_scale,
                 **({"estimator": dataclasses.asdict(estimator)} if estimator is not None else {}),
                 PREDICTED_WITHOUT_SIGNAL: predicted_without_signal(
                     statistics_breakdown(statistics, found.params, Objective.EXACT, period_loss=False), found.params),
                 **dict(provenance or {})}
        return ParameterVersion(
            found.params, domain=domain,
            correction=estimator.correction if estimator is not None else "ratio",
            provenance=Provenance(training_start=training_window[0], training_end=training_window[1],
                                  rows=statistics.num_conversions if rows is None else rows, created_at=utc_now_iso(),
                                  predicted_rmsre_tau=found.predicted_rmsre_tau,
                                  baseline_rmsre_tau=min(b.rmsre_tau for b in base), objective=str(objective),
                                  extra=extra))

    alternatives: tuple[tuple[ParameterVersion, OptimizationResult], ...] = ()
    if alternative is not None and retention_checksum(alternative[0].params) != retention_checksum(result.params):
        alternatives = ((finish(*alternative), alternative[0]),)
    return TuningResult(finish(result, choice), result, base, tau_rule, alternatives)


def attach_calibration(version: ParameterVersion, calibration_statistics: CalibrationStatistics | None,
                       special_days: Sequence[str] = (), special_day_loss_factor: float = UNSEEN_LOSS_FACTOR
                       ) -> ParameterVersion:
    """``version`` carrying the calibration fitted on the history for exactly its bounding, and the
    history's day-of-week and ``special_days`` effects on it (``calibration.calendar``; blocks are days)."""
    if calibration_statistics is None:
        return version
    calibration = fit_calibration(calibration_statistics)
    return dataclasses.replace(version, calibration=calibration,
                               calendar=fit_calendar(calibration_statistics, calibration, special_days,
                                                     special_day_loss_factor))


def calibrate(result: TuningResult,
              calibration_statistics: CalibrationStatistics | Sequence[CalibrationStatistics] | None,
              release_period_days: float | None = None, special_days: Sequence[str] = (),
              special_day_loss_factor: float = UNSEEN_LOSS_FACTOR) -> TuningResult:
    """The tuning result with the history's calibration attached and, when the history holds at least
    ``MIN_BACKTEST_BLOCKS`` windows of one release period (calibration blocks are UTC days), the
    parameters and estimator chosen and the error predicted by replaying releases of that period on
    the history's own days (``calibration.backtest``, each day's correction learnt without it): the
    model's prediction assumes a period's truth, loss and volume vary independently; the replay does
    not. ``calibration_statistics``: one per ``result.candidates`` (or one for the chosen version),
    each accumulated with ``fitted_for`` its version's checksum; ``special_day_loss_factor``: the odds band
    of a special day the history cannot support (``calibration.calendar``); ``special_days``: the operator's declared
    special days (ISO dates), modelled as their own day type."""
    if calibration_statistics is None:
        return result
    stats_list: list[CalibrationStatistics] = (
        [calibration_statistics] if isinstance(calibration_statistics, CalibrationStatistics)
        else list(calibration_statistics))
    if not stats_list:
        return result
    candidates = result.candidates[:len(stats_list)]
    scored: list[tuple[float, ParameterVersion, OptimizationResult]] = []
    for (version, search), cal_stats in zip(candidates, stats_list, strict=True):
        version = attach_calibration(version, cal_stats, special_days, special_day_loss_factor)
        blocks = cal_stats.cells.shape[1]
        period = int(round(release_period_days)) if release_period_days is not None else blocks
        if not (1 <= period and blocks - period + 1 >= MIN_BACKTEST_BLOCKS) or version.params.encoding == Encoding.BASELINE:
            scored.append((float("nan"), version, search))
            continue
        assert version.calibration is not None and version.provenance is not None  # (attached above; tune sets it)
        taus = np.asarray(search.taus, dtype=np.float64)
        replays = {c: backtest(cal_stats, version.params, version.calibration, taus, c, period) for c in ("none", "ratio")}
        choice = min(replays, key=lambda c: replays[c].rmsre_tau)
        extra = dict(version.provenance.extra)
        extra.update(model_predicted_rmsre_tau=version.provenance.predicted_rmsre_tau, backtest={
            c: {"rmsre_tau": r.rmsre_tau, "period_days": r.period_blocks, "windows": int(len(r.per_window)),
                "per_query": [float(x) for x in r.per_query]} for c, r in replays.items()})
        provenance = dataclasses.replace(version.provenance, predicted_rmsre_tau=replays[choice].rmsre_tau, extra=extra)
        version = dataclasses.replace(version, correction=choice, provenance=provenance)
        scored.append((replays[choice].rmsre_tau, version,
                       dataclasses.replace(search, predicted_rmsre_tau=replays[choice].rmsre_tau)))
    if any(math.isnan(x[0]) for x in scored):  # no replay: the model's choice stands
        return dataclasses.replace(result, version=scored[0][1], alternatives=())
    best = min(range(len(scored)), key=lambda i: scored[i][0])
    _, version, search = scored[best]
    return dataclasses.replace(result, version=version, optimization=search, alternatives=())
