"""Tuning decisions, engine-free: ParameterOptimization (Alg. 5) together with the paper's baselines
(Sec. 5.1) as one typed result, and the nightly job's decision logic — guardrails, the "same
release" rule and the run report. ``pipelines/optimize.py``, ``pipelines/nightly.py`` and
``araopt.evaluation`` call these; none of them decides anything on its own.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .conversions import DEFAULT_MAX_REJECTED_FRACTION, ValidationCounts, check_rejected_share
from .error_model import Objective
from .optimizer import BASELINE_QUANTILES, OptimizationResult, SearchContext, baseline_params, objective, optimize
from .params import Encoding, L1Rounding, Params, Provenance, utc_now_iso
from .statistics import DEFAULT_MAX_COUNT_LIMIT, SufficientStatistics

DEFAULT_TAU_RULE = "count 5; each value query 5 x its median per conversion in the history (Sec. 5.1)"


def resolve_taus(statistics: SufficientStatistics, overrides: Mapping[str, float] | None = None
                 ) -> tuple[np.ndarray, str]:
    """The RMSRE_tau thresholds (count first, then each value query) and a sentence saying where each
    comes from: ``overrides`` (query name -> tau, "count" for the count) or the paper's default rule."""
    taus = statistics.taus()
    names = ("count",) + tuple(statistics.value_columns)
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(names))
    if unknown:
        raise ValueError(f"--tau names unknown queries {unknown}; the queries are {list(names)}")
    parts = []
    for i, name in enumerate(names):
        if name in overrides:
            value = float(overrides[name])
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"--tau {name} must be a finite number > 0, got {overrides[name]!r}")
            taus[i] = value
            parts.append(f"{name} {value:.4g} (--tau)")
        else:
            rule = "default" if i == 0 else "5 x median"
            parts.append(f"{name} {taus[i]:.4g} ({rule})")
    return taus, "tau: " + ", ".join(parts)


def baseline_name(quantile: float) -> str:
    """One naming for the paper's baselines everywhere: ``baseline_q95`` for the 0.95 quantile."""
    return f"baseline_q{quantile * 100:g}"


@dataclass(frozen=True)
class Baseline:
    """The Sec. 5.1 baseline at one quantile and its predicted RMSRE_tau on the same statistics."""

    name: str
    quantile: float
    params: Params
    rmsre_tau: float

    def to_json(self) -> dict[str, Any]:
        return {"quantile": self.quantile, "count_limit": self.params.count_limit, "rmsre_tau": self.rmsre_tau,
                "clip_thresholds": [q.clip_threshold for q in self.params.queries]}


def baselines(statistics: SufficientStatistics, epsilon: float, max_count_limit: int, taus: np.ndarray | Sequence[float],
              kind: str = Objective.EXACT, slice_columns: Sequence[str] | None = None,
              quantiles: Sequence[float] = BASELINE_QUANTILES) -> tuple[Baseline, ...]:
    """The paper's baselines (equal fractions, quantile thresholds and count limit), evaluated."""
    taus_arr = np.asarray(taus, dtype=np.float64)
    out = []
    for q in quantiles:
        p = baseline_params(statistics, epsilon, q, max_count_limit, taus_arr, slice_columns=slice_columns)
        out.append(Baseline(baseline_name(q), float(q), p, objective(statistics, p, taus_arr, kind)))
    return tuple(out)


@dataclass(frozen=True)
class TuningResult:
    """Chosen parameters (with the history's domain and provenance), the search, and the baselines."""

    params: Params
    optimization: OptimizationResult
    baselines: tuple[Baseline, ...]
    tau_rule: str = ""
    alternatives: tuple[tuple[Params, OptimizationResult], ...] = ()
    """Other finished candidates (the other objective's optimum): ``calibrate`` may prefer one."""

    @property
    def candidates(self) -> tuple[tuple[Params, OptimizationResult], ...]:
        """(params, search) of the model's choice first, then the alternatives."""
        return ((self.params, self.optimization),) + self.alternatives

    @property
    def predicted_rmsre_tau(self) -> float:
        return self.optimization.objective

    @property
    def taus(self) -> tuple[float, ...]:
        return self.optimization.taus

    def baseline_values(self) -> dict[str, float]:
        return {b.name: b.rmsre_tau for b in self.baselines}

    @property
    def best_baseline(self) -> Baseline:
        return min(self.baselines, key=lambda b: b.rmsre_tau)


CORRECTED = "corrected"
"""Objective kind: choose parameters and estimator for the error of the TRUE totals after calibration (issue 12)."""
KINDS = (Objective.EXACT.value, Objective.RELAXED.value, CORRECTED)
CORRECTION_MARGIN = 0.02
"""Switch away from the paper's estimator only if the history predicts at least this much lower error."""


@dataclass(frozen=True)
class EstimatorChoice:
    """Which point estimate the history recommends for ``params``, with the predicted RMSRE_tau of each."""

    correction: str  # "ratio" (U / r_hat) or "none" (the capped estimate U)
    capped_rmsre_tau: float
    corrected_rmsre_tau: float


def choose_correction(statistics: SufficientStatistics, params: Params, taus: Sequence[float]) -> EstimatorChoice:
    """Divide by the retention ratio only where the history predicts a lower error of the true totals
    (dividing inflates the noise by 1/r: for noise-dominated slices the capped estimate is better)."""
    from .calibration import corrected_objective

    t = np.asarray(taus, dtype=np.float64)
    capped = objective(statistics, params, t, Objective.EXACT)
    corrected = corrected_objective(statistics, params, t)
    choice = "ratio" if corrected < capped * (1.0 - CORRECTION_MARGIN) else "none"
    return EstimatorChoice(choice, capped, corrected)


def _corrected_search(statistics: SufficientStatistics, epsilon: float, max_count_limit: int, taus: Sequence[float],
                      slice_columns: Sequence[str] | None) -> OptimizationResult:
    """Alg. 5 for the corrected objective (``calibration.optimize_corrected``) as an OptimizationResult."""
    import time

    from .calibration import optimize_corrected
    from .optimizer import CandidateResult

    t0 = time.perf_counter()
    res = optimize_corrected(statistics, epsilon, max_count_limit, taus, slice_columns=slice_columns)
    rows = tuple(CandidateResult(int(r["C"]), int(r["kept_ranks"]), float(r["corrected_rmsre_tau"]),
                                 tuple(float(r[f"C_{c}"]) for c in statistics.value_columns),
                                 tuple(float(r[f"alpha_{c}"]) for c in statistics.value_columns), float("nan"))
                 for r in res.per_count_limit.to_dict("records"))
    return OptimizationResult(res.params, res.objective, CORRECTED, "linf", rows, tuple(float(t) for t in taus),
                              time.perf_counter() - t0)


def tune(statistics: SufficientStatistics, epsilon: float, *, encoding: str = Encoding.LINF,
         max_count_limit: int = DEFAULT_MAX_COUNT_LIMIT, kind: str = Objective.EXACT,
         l1_rounding: str = L1Rounding.RANDOMIZED, slice_columns: Sequence[str] | None = None,
         taus: Sequence[float] | None = None, tau_overrides: Mapping[str, float] | None = None,
         training_window: tuple[str | None, str | None] = (None, None),
         rows: int | None = None, provenance: Mapping[str, Any] | None = None, progress: bool = False,
         context: SearchContext | None = None, release_period_days: float | None = None,
         history_days: float | None = None) -> TuningResult:
    """Alg. 5 on the statistics, the baselines on the same statistics and taus, and the parameter file
    to publish: the chosen parameters carrying the history's key domain and their provenance.
    ``taus`` (count first) or ``tau_overrides`` (query name -> tau) replace the default rule.

    ``release_period_days``: tune for releases of that many days (the noise of a release does not
    depend on its length, its volume does): the statistics are scaled to the expected volume of one
    release (``SufficientStatistics.for_release_period``; ``history_days`` defaults to the days with
    conversions in the statistics), and every prediction is for one such release. None: a release
    as large as the history (the paper's setting)."""
    hist_days = float(statistics.history_days() if history_days is None else history_days)
    if release_period_days is not None:
        statistics = statistics.for_release_period(release_period_days, hist_days)
    if taus is None:
        resolved, tau_rule = resolve_taus(statistics, tau_overrides)
        taus = resolved.tolist()
    else:
        tau_rule = "tau: " + ", ".join(f"{t:.4g}" for t in taus) + " (given)"
    if str(kind) not in KINDS:
        raise ValueError(f"objective must be one of {KINDS}, got {kind!r}")
    paper_kind = Objective.EXACT if str(kind) == CORRECTED else str(kind)
    result = optimize(statistics, epsilon, str(encoding), max_count_limit, str(paper_kind), taus=taus, progress=progress,
                      l1_rounding=str(l1_rounding), slice_columns=slice_columns, context=context)
    # the corrected error model covers L-inf (and L1 with one query); other parameters correct by ratio
    choice = (choose_correction(statistics, result.params, result.taus) if corrected_model_supports(result.params)
              else None)
    alternative: tuple[OptimizationResult, EstimatorChoice] | None = None
    if str(kind) == CORRECTED and str(encoding) == Encoding.LINF:
        assert choice is not None
        best_capped = min(choice.capped_rmsre_tau, choice.corrected_rmsre_tau)
        corrected = _corrected_search(statistics, epsilon, max_count_limit, result.taus, slice_columns)
        corrected_choice = EstimatorChoice("ratio", objective(statistics, corrected.params, np.asarray(result.taus),
                                                              Objective.EXACT), corrected.objective)
        paper_result = dataclasses.replace(result, objective=best_capped, kind=CORRECTED)
        if corrected.objective < best_capped * (1.0 - CORRECTION_MARGIN):
            result, choice, alternative = corrected, corrected_choice, (paper_result, choice)
        else:
            result, alternative = paper_result, (corrected, corrected_choice)
    base = baselines(statistics, epsilon, max_count_limit, result.taus, str(paper_kind), slice_columns)

    def finish(found: OptimizationResult, estimator: EstimatorChoice | None) -> Params:
        extra = {"optimizer": "araopt.optimizer.optimize (ParameterOptimization, Alg. 5)", "encoding": str(encoding),
                 "max_count_limit": max_count_limit, "baselines": {b.name: b.to_json() for b in base},
                 "per_count_limit": [{"C": r.count_limit, "rmsre_tau": r.objective} for r in found.per_count_limit],
                 "optimizer_seconds": found.seconds, "taus": list(found.taus), "tau_rule": tau_rule,
                 "release_period_days": release_period_days if release_period_days is not None else hist_days,
                 "history_days": hist_days, "volume_scale": statistics.volume_scale,
                 **({"estimator": dataclasses.asdict(estimator)} if estimator is not None else {}),
                 **dict(provenance or {})}
        return dataclasses.replace(
            found.params.with_domain_of(statistics.slice_values()),
            correction=estimator.correction if estimator is not None else "ratio",
            provenance=Provenance(training_start=training_window[0], training_end=training_window[1],
                                  rows=statistics.num_conversions if rows is None else rows, created_at=utc_now_iso(),
                                  predicted_rmsre_tau=found.objective,
                                  baseline_rmsre_tau=min(b.rmsre_tau for b in base), objective=str(kind),
                                  extra=extra))

    alternatives: tuple[tuple[Params, OptimizationResult], ...] = ()
    if alternative is not None and retention_key(alternative[0].params) != retention_key(result.params):
        alternatives = ((finish(*alternative), alternative[0]),)
    return TuningResult(finish(result, choice), result, base, tau_rule, alternatives)


def retention_key(params: Params) -> tuple[Any, ...]:
    """What decides what Alg. 1 keeps and how values are clipped: two parameter sets with the same key
    share a calibration."""
    return (params.encoding, params.count_limit, params.contribution_budget, params.count_budget_fraction,
            params.l1_rounding, tuple((q.column, float(q.clip_threshold), q.budget_fraction) for q in params.queries))


def corrected_model_supports(params: Params) -> bool:
    """Whether the corrected estimator's error model (``calibration.corrected_breakdown``) covers ``params``."""
    return params.encoding == Encoding.LINF or (params.encoding == Encoding.L1 and params.num_queries == 1
                                                and params.l1_rounding == L1Rounding.RANDOMIZED)


# ---- the nightly job's decisions -----------------------------------------------------------------
@dataclass(frozen=True)
class Guardrails:
    """Publishing rules: beat the best baseline; large moves of C or thresholds need an explicit allowance.

    A change of epsilon, of the slices, queries or encoding starts a new series: the move guards
    compare like with like only (a new epsilon moves C for a reason)."""

    allow_large_change: bool = False
    max_threshold_change_factor: float = 2.0
    max_count_limit_change: int = 2

    def check(self, new: Params, predicted: float, baseline_values: Mapping[str, float],
              previous: Params | None) -> list[str]:
        """Reasons not to publish (empty: publish), each naming the parameter and the likely cause."""
        problems = []
        best_baseline = min(baseline_values.values())
        if not predicted < best_baseline:
            problems.append(f"predicted RMSRE_tau {predicted:.4g} does not beat the best baseline {best_baseline:.4g}")
        if previous is None or self.allow_large_change or new_series(previous, new):
            return problems
        cause = _change_cause(previous, new)
        if abs(new.count_limit - previous.count_limit) > self.max_count_limit_change:
            problems.append(f"count limit moves {previous.count_limit} -> {new.count_limit}, more than "
                            f"{self.max_count_limit_change}{cause} (use --allow-large-change)")
        for old_q, new_q in zip(previous.queries, new.queries, strict=True):
            factor = max(new_q.clip_threshold / old_q.clip_threshold, old_q.clip_threshold / new_q.clip_threshold)
            if factor > self.max_threshold_change_factor:
                problems.append(f"clip threshold of {new_q.column} moves {old_q.clip_threshold:.4g} -> "
                                f"{new_q.clip_threshold:.4g} (x{factor:.2f} > {self.max_threshold_change_factor:g})"
                                f"{cause} (use --allow-large-change)")
        return problems


def new_series(previous: Params, new: Params) -> str:
    """Why ``new`` starts a new series of versions rather than continuing ``previous`` ('' if it continues)."""
    if previous.epsilon != new.epsilon:
        return f"epsilon changed {previous.epsilon:g} -> {new.epsilon:g}"
    if (previous.slice_columns, previous.query_columns, previous.encoding) != (
            new.slice_columns, new.query_columns, new.encoding):
        return (f"slices/queries/encoding changed from {list(previous.slice_columns)}/{list(previous.query_columns)}/"
                f"{previous.encoding} to {list(new.slice_columns)}/{list(new.query_columns)}/{new.encoding}")
    old_period = previous.provenance.extra.get("release_period_days") if previous.provenance else None
    new_period = new.provenance.extra.get("release_period_days") if new.provenance else None
    if old_period is not None and new_period is not None and old_period != new_period:
        return f"release period changed {old_period:g} -> {new_period:g} days"
    return ""


def _change_cause(previous: Params, new: Params) -> str:
    """The likely reason a parameter moved, for the guardrail's message."""
    if previous.correction != new.correction:
        return (f": the estimator switched from {previous.correction!r} to {new.correction!r} (the corrected "
                f"estimator divides by the retention ratio, so it favours other C and clips)")
    return ": the history changed"


def same_release(previous: Params, new: Params, as_of: str) -> bool:
    """Same as-of date and the same parameters, ignoring when and by which run they were made and
    float noise below 1e-9 relative (partial sums merge in runner-dependent order)."""
    if previous.provenance is None or previous.provenance.extra.get("as_of") != as_of:
        return False

    def stable(p: Params) -> dict[str, Any]:
        data = p.to_json()
        prov = dict(data.pop("provenance") or {})
        for volatile in ("created_at", "run_id", "optimizer_seconds"):
            prov.pop(volatile, None)
        data["provenance"] = prov
        if isinstance(data.get("calibration"), dict):  # it names the checksum of params with their created_at
            data["calibration"] = {k: v for k, v in data["calibration"].items() if k != "params_checksum"}
        return data

    return _close(stable(previous), stable(new))


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) or isinstance(b, float):
        if not (isinstance(a, (int, float)) and isinstance(b, (int, float))):
            return False
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return bool(a == b)


@dataclass(frozen=True)
class NightlyConfig:
    """Everything the nightly job decides with (the CLI's options, resolved)."""

    store: str
    as_of: str
    run_id: str
    epsilon: float
    slice_columns: tuple[str, ...]
    window: tuple[str, str]
    dates: tuple[str, ...]
    encoding: str = Encoding.LINF
    max_count_limit: int = DEFAULT_MAX_COUNT_LIMIT
    kind: str = Objective.EXACT
    guardrails: Guardrails = field(default_factory=Guardrails)
    max_rejected_fraction: float = DEFAULT_MAX_REJECTED_FRACTION
    tau_overrides: tuple[tuple[str, float], ...] = ()
    release_period_days: float = 1.0
    lookback_days: int = 0


@dataclass(frozen=True)
class NightlyDecision:
    """The tuning result, why not to publish it (if anything), whether it repeats the previous release."""

    tuning: TuningResult
    problems: tuple[str, ...]
    idempotent: bool
    series: str = ""  # why this run starts a new series of versions ('' if it continues the previous)

    @property
    def publish(self) -> bool:
        return not self.idempotent and not self.problems


def nightly_decision(statistics: SufficientStatistics, counts: ValidationCounts, config: NightlyConfig,
                     previous: Params | None) -> NightlyDecision:
    """Gate the history's rejected share, tune, apply the guardrails, and recognise a re-run."""
    check_rejected_share(counts, config.max_rejected_fraction, what="history window")
    tuning = tune(statistics, config.epsilon, encoding=config.encoding, max_count_limit=config.max_count_limit,
                  kind=config.kind, slice_columns=config.slice_columns, training_window=config.window,
                  tau_overrides=dict(config.tau_overrides),
                  rows=counts.rows_valid, release_period_days=config.release_period_days,
                  history_days=len(config.dates),
                  provenance={"run_id": config.run_id, "as_of": config.as_of, "rows_read": counts.rows_read,
                              "rows_rejected": counts.rows_rejected, "lookback_days": config.lookback_days})
    if previous is not None and same_release(previous, tuning.params, config.as_of):
        return NightlyDecision(tuning, (), True)
    problems = config.guardrails.check(tuning.params, tuning.predicted_rmsre_tau, tuning.baseline_values(), previous)
    return NightlyDecision(tuning, tuple(problems), False)


def with_calibration(decision: NightlyDecision, calibration_statistics: Any, previous: Params | None,
                     config: NightlyConfig) -> NightlyDecision:
    """The decision for the parameters carrying the calibration fitted on the window (``calibrate``:
    the candidates replayed on the window's days), guarded again (the replay may prefer the other
    candidate); a re-run of the same as-of date on the same history is recognised with the
    calibration included."""
    tuning = calibrate(decision.tuning, calibration_statistics, config.release_period_days)
    idempotent = previous is not None and same_release(previous, tuning.params, config.as_of)
    if idempotent:
        return NightlyDecision(tuning, (), True)
    return NightlyDecision(tuning, tuple(config.guardrails.check(tuning.params, _model_prediction(tuning),
                                                                 tuning.baseline_values(), previous)), False,
                           new_series(previous, tuning.params) if previous is not None else "")


def _model_prediction(tuning: TuningResult) -> float:
    """The model's predicted RMSRE_tau (the baselines' are model predictions too)."""
    prov = tuning.params.provenance
    value = prov.extra.get("model_predicted_rmsre_tau") if prov is not None else None
    return float(value) if value is not None else tuning.predicted_rmsre_tau


def nightly_report(decision: NightlyDecision, config: NightlyConfig, counts: ValidationCounts,
                   previous_version: str | None) -> dict[str, Any]:
    """The run report (JSON): what was decided, with the numbers behind it."""
    tuning = decision.tuning
    return {
        "as_of": config.as_of, "run_id": config.run_id, "window": list(config.window), "history_dates": list(config.dates),
        "rows_read": counts.rows_read, "rows_rejected": counts.rows_rejected, "epsilon": config.epsilon,
        "objective": str(config.kind), "taus": list(tuning.taus), "tau_rule": tuning.tau_rule,
        "release_period_days": config.release_period_days, "lookback_days": config.lookback_days,
        "predicted_rmsre_tau": tuning.predicted_rmsre_tau, "model_predicted_rmsre_tau": _model_prediction(tuning),
        "prediction": ("replayed on the window's days" if tuning.params.provenance is not None
                       and "backtest" in tuning.params.provenance.extra else "error model"),
        "baselines": tuning.baseline_values(), "optimizer_seconds": tuning.optimization.seconds,
        "per_count_limit": tuning.optimization.table().to_dict(orient="records"), "params": tuning.params.to_json(),
        "previous_version": previous_version, "published": False, "idempotent": decision.idempotent,
        "problems": list(decision.problems), "new_series": decision.series,
    }


def version_history(store: Any, limit: int = 60) -> list[tuple[str, int, float | None]]:
    """(version, C, predicted RMSRE_tau) of the last ``limit`` published versions of a parameter store
    (``araopt.store``); a version that no longer parses is skipped, never fatal for a report."""
    history = []
    for version in store.list_versions()[-limit:]:
        try:
            p = Params.from_bytes(store.resolve(version).payload, version)
        except Exception:  # noqa: BLE001 - a bad old version must not break the report
            continue
        history.append((version, p.count_limit, p.provenance.predicted_rmsre_tau if p.provenance else None))
    return history


def nightly_report_png(decision: NightlyDecision, history: Sequence[tuple[str, int, float | None]]) -> bytes:
    """The run report's picture (``araopt.plots.nightly_report_png``) for this decision."""
    from .plots import nightly_report_png as render

    tuning = decision.tuning
    names = ("count",) + tuning.params.query_columns
    period = tuning.params.provenance.extra.get("release_period_days") if tuning.params.provenance else None
    return render(tuning.optimization.table(), tuning.params.count_limit, tuning.baseline_values(),
                  list(zip(names, tuning.taus, strict=True)), history, decision.problems,
                  float(period) if period is not None else None)


def attach_calibration(params: Params, calibration_statistics: Any) -> Params:
    """``params`` carrying the calibration fitted on the history for exactly their bounding."""
    from .calibration import fit_calibration

    if calibration_statistics is None:
        return params
    fitted = fit_calibration(calibration_statistics)
    return dataclasses.replace(params, calibration=fitted)


MIN_BACKTEST_BLOCKS = 3
"""A backtest over fewer windows of history says too little: the model's prediction stands."""


def calibrate(result: TuningResult, calibration_statistics: Any | Sequence[Any],
              release_period_days: float | None = None) -> TuningResult:
    """The tuning result with the history's calibration attached and, when the history holds at least
    ``MIN_BACKTEST_BLOCKS`` windows of one release period (calibration blocks are UTC days), the
    parameters and estimator chosen and the error predicted by replaying releases of that period on
    the history's own days (``calibration.backtest``, each day's correction learnt without it): the
    model's prediction assumes a period's truth, loss and volume vary independently; the replay does
    not. ``calibration_statistics``: one per ``result.candidates`` (or one for the chosen params)."""
    from .calibration import backtest

    stats_list: list[Any] = (list(calibration_statistics) if isinstance(calibration_statistics, (list, tuple))
                             else [calibration_statistics])
    if not stats_list or stats_list[0] is None:
        return result
    candidates = result.candidates[:len(stats_list)]
    scored: list[tuple[float, Params, OptimizationResult]] = []
    for (params, search), cal_stats in zip(candidates, stats_list, strict=True):
        params = attach_calibration(params, cal_stats)
        blocks = cal_stats.cells.shape[1]
        period = int(round(release_period_days)) if release_period_days is not None else blocks
        if not (1 <= period and blocks - period + 1 >= MIN_BACKTEST_BLOCKS) or params.encoding == "baseline":
            scored.append((float("nan"), params, search))
            continue
        taus = np.asarray(search.taus, dtype=np.float64)
        replays = {c: backtest(cal_stats, params, params.calibration, taus, c, period) for c in ("none", "ratio")}
        choice = min(replays, key=lambda c: replays[c].rmsre_tau)
        assert params.provenance is not None  # (tune always sets it)
        extra = dict(params.provenance.extra)
        extra.update(model_predicted_rmsre_tau=params.provenance.predicted_rmsre_tau, backtest={
            c: {"rmsre_tau": r.rmsre_tau, "period_days": r.period_blocks, "windows": int(len(r.per_window)),
                "per_query": [float(x) for x in r.per_query]} for c, r in replays.items()})
        provenance = dataclasses.replace(params.provenance, predicted_rmsre_tau=replays[choice].rmsre_tau, extra=extra)
        params = dataclasses.replace(params, correction=choice, provenance=provenance)
        scored.append((replays[choice].rmsre_tau, params,
                       dataclasses.replace(search, objective=replays[choice].rmsre_tau)))
    if any(math.isnan(x[0]) for x in scored):  # no replay: the model's choice stands
        return dataclasses.replace(result, params=scored[0][1], alternatives=())
    best = min(range(len(scored)), key=lambda i: scored[i][0])
    _, params, search = scored[best]
    return dataclasses.replace(result, params=params, optimization=search, alternatives=())
