"""The nightly job's decisions, engine-free: the guardrails (beat the best baseline; large moves need an
explicit allowance), the "same release" rule that makes a re-run a no-op, the run report and its
picture. ``pipelines/nightly.py`` runs them in its single-element steps; they decide, it wires.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from araopt.calibration.accumulator import CalibrationStatistics
from araopt.constants import (
    ENCODING,
    MAX_COUNT_LIMIT,
    MAX_COUNT_LIMIT_CHANGE,
    MAX_REJECTED_FRACTION,
    MAX_THRESHOLD_CHANGE_FACTOR,
    OBJECTIVE,
)
from araopt.evaluation.plots import nightly_report_png as render_nightly_report
from araopt.io.conversions import ValidationCounts, check_rejected_share
from araopt.io.store import ParameterStore
from araopt.optimize.statistics import SufficientStatistics
from araopt.optimize.tune import TuningResult, calibrate, tune
from araopt.version import ParameterVersion


@dataclass(frozen=True)
class Guardrails:
    """Publishing rules: beat the best baseline; large moves of C or thresholds need an explicit allowance.

    A change of epsilon, of the slices, queries or encoding starts a new series: the move guards
    compare like with like only (a new epsilon moves C for a reason)."""

    allow_large_change: bool = False
    max_threshold_change_factor: float = MAX_THRESHOLD_CHANGE_FACTOR
    max_count_limit_change: int = MAX_COUNT_LIMIT_CHANGE

    def check(self, new: ParameterVersion, predicted: float, baseline_values: Mapping[str, float],
              previous: ParameterVersion | None) -> list[str]:
        """Reasons not to publish (empty: publish), each naming the parameter and the likely cause."""
        problems = []
        best_baseline = min(baseline_values.values())
        if not predicted < best_baseline:
            problems.append(f"predicted RMSRE_tau {predicted:.4g} does not beat the best baseline {best_baseline:.4g}")
        if previous is None or self.allow_large_change or new_series(previous, new):
            return problems
        cause = _change_cause(previous, new)
        if abs(new.params.count_limit - previous.params.count_limit) > self.max_count_limit_change:
            problems.append(f"count limit moves {previous.params.count_limit} -> {new.params.count_limit}, more than "
                            f"{self.max_count_limit_change}{cause} (use --allow-large-change)")
        for old_q, new_q in zip(previous.params.queries, new.params.queries, strict=True):
            factor = max(new_q.clip_threshold / old_q.clip_threshold, old_q.clip_threshold / new_q.clip_threshold)
            if factor > self.max_threshold_change_factor:
                problems.append(f"clip threshold of {new_q.column} moves {old_q.clip_threshold:.4g} -> "
                                f"{new_q.clip_threshold:.4g} (x{factor:.2f} > {self.max_threshold_change_factor:g})"
                                f"{cause} (use --allow-large-change)")
        return problems


def new_series(previous: ParameterVersion, new: ParameterVersion) -> str:
    """Why ``new`` starts a new series of versions rather than continuing ``previous`` ('' if it continues)."""
    old, now = previous.params, new.params
    if old.epsilon != now.epsilon:
        return f"epsilon changed {old.epsilon:g} -> {now.epsilon:g}"
    if (old.slice_columns, old.query_columns, old.encoding) != (now.slice_columns, now.query_columns, now.encoding):
        return (f"slices/queries/encoding changed from {list(old.slice_columns)}/{list(old.query_columns)}/"
                f"{old.encoding} to {list(now.slice_columns)}/{list(now.query_columns)}/{now.encoding}")
    old_period = previous.provenance.extra.get("release_period_days") if previous.provenance else None
    new_period = new.provenance.extra.get("release_period_days") if new.provenance else None
    if old_period is not None and new_period is not None and old_period != new_period:
        return f"release period changed {old_period:g} -> {new_period:g} days"
    return ""


def _change_cause(previous: ParameterVersion, new: ParameterVersion) -> str:
    """The likely reason a parameter moved, for the guardrail's message."""
    if previous.correction != new.correction:
        return (f": the estimator switched from {previous.correction!r} to {new.correction!r} (the corrected "
                f"estimator divides by the retention ratio, so it favours other C and clips)")
    return ": the history changed"


def same_release(previous: ParameterVersion, new: ParameterVersion, as_of: str) -> bool:
    """Same as-of date and the same parameters, ignoring when and by which run they were made and
    float noise below 1e-9 relative (partial sums merge in runner-dependent order)."""
    if previous.provenance is None or previous.provenance.extra.get("as_of") != as_of:
        return False

    def stable(p: ParameterVersion) -> dict[str, Any]:
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
    encoding: str = ENCODING
    max_count_limit: int = MAX_COUNT_LIMIT
    objective: str = OBJECTIVE
    guardrails: Guardrails = field(default_factory=Guardrails)
    max_rejected_fraction: float = MAX_REJECTED_FRACTION
    tau_overrides: tuple[tuple[str, float], ...] = ()
    release_period_days: float = 1.0
    lookback_days: int = 0
    special_days: tuple[str, ...] = ()  # declared special days (ISO dates): their own calendar effect


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
                     previous: ParameterVersion | None) -> NightlyDecision:
    """Gate the history's rejected share, tune, apply the guardrails, and recognise a re-run."""
    check_rejected_share(counts, config.max_rejected_fraction, what="history window")
    tuning = tune(statistics, config.epsilon, encoding=config.encoding, max_count_limit=config.max_count_limit,
                  objective=config.objective, slice_columns=config.slice_columns, training_window=config.window,
                  tau_overrides=dict(config.tau_overrides),
                  rows=counts.rows_valid, release_period_days=config.release_period_days,
                  history_days=len(config.dates),
                  provenance={"run_id": config.run_id, "as_of": config.as_of, "rows_read": counts.rows_read,
                              "rows_rejected": counts.rows_rejected, "lookback_days": config.lookback_days})
    if previous is not None and same_release(previous, tuning.version, config.as_of):
        return NightlyDecision(tuning, (), True)
    problems = config.guardrails.check(tuning.version, tuning.predicted_rmsre_tau, tuning.baseline_values(), previous)
    return NightlyDecision(tuning, tuple(problems), False)


def with_calibration(decision: NightlyDecision, calibration_statistics: Sequence[CalibrationStatistics] | None,
                     previous: ParameterVersion | None,
                     config: NightlyConfig) -> NightlyDecision:
    """The decision for the parameters carrying the calibration fitted on the window (``calibrate``:
    the candidates replayed on the window's days), guarded again (the replay may prefer the other
    candidate); a re-run of the same as-of date on the same history is recognised with the
    calibration included."""
    tuning = calibrate(decision.tuning, calibration_statistics, config.release_period_days, config.special_days)
    idempotent = previous is not None and same_release(previous, tuning.version, config.as_of)
    if idempotent:
        return NightlyDecision(tuning, (), True)
    return NightlyDecision(tuning, tuple(config.guardrails.check(tuning.version, _model_prediction(tuning),
                                                                 tuning.baseline_values(), previous)), False,
                           new_series(previous, tuning.version) if previous is not None else "")


def _model_prediction(tuning: TuningResult) -> float:
    """The model's predicted RMSRE_tau (the baselines' are model predictions too)."""
    prov = tuning.version.provenance
    value = prov.extra.get("model_predicted_rmsre_tau") if prov is not None else None
    return float(value) if value is not None else tuning.predicted_rmsre_tau


def nightly_report(decision: NightlyDecision, config: NightlyConfig, counts: ValidationCounts,
                   previous_version: str | None) -> dict[str, Any]:
    """The run report (JSON): what was decided, with the numbers behind it."""
    tuning = decision.tuning
    return {
        "as_of": config.as_of, "run_id": config.run_id, "window": list(config.window), "history_dates": list(config.dates),
        "rows_read": counts.rows_read, "rows_rejected": counts.rows_rejected, "epsilon": config.epsilon,
        "objective": str(config.objective), "taus": list(tuning.taus), "tau_rule": tuning.tau_rule,
        "release_period_days": config.release_period_days, "lookback_days": config.lookback_days,
        "predicted_rmsre_tau": tuning.predicted_rmsre_tau, "model_predicted_rmsre_tau": _model_prediction(tuning),
        "prediction": ("replayed on the window's days" if tuning.version.provenance is not None
                       and "backtest" in tuning.version.provenance.extra else "error model"),
        "baselines": tuning.baseline_values(), "optimizer_seconds": tuning.optimization.seconds,
        "per_count_limit": tuning.optimization.table().to_dict(orient="records"), "params": tuning.version.to_json(),
        "previous_version": previous_version, "published": False, "idempotent": decision.idempotent,
        "problems": list(decision.problems), "new_series": decision.series,
    }


def version_history(store: ParameterStore, limit: int = 60) -> list[tuple[str, int, float | None]]:
    """(version, C, predicted RMSRE_tau) of the last ``limit`` published versions of a parameter store
    (``araopt.io.store``); a version that no longer parses is skipped, never fatal for a report."""
    history = []
    for version in store.list_versions()[-limit:]:
        try:
            p = ParameterVersion.from_bytes(store.resolve(version).payload, version)
        except Exception:  # noqa: BLE001 - a bad old version must not break the report
            continue
        history.append((version, p.params.count_limit, p.provenance.predicted_rmsre_tau if p.provenance else None))
    return history


def nightly_report_png(decision: NightlyDecision, history: Sequence[tuple[str, int, float | None]]) -> bytes:
    """The run report's picture (``evaluation.plots.nightly_report_png``) for this decision."""
    tuning = decision.tuning
    names = ("count",) + tuning.params.query_columns
    period = tuning.version.provenance.extra.get("release_period_days") if tuning.version.provenance else None
    return render_nightly_report(tuning.optimization.table(), tuning.params.count_limit, tuning.baseline_values(),
                  list(zip(names, tuning.taus, strict=True)), history, decision.problems,
                  float(period) if period is not None else None)
