"""The nightly job's decisions, engine-free: the guardrails (beat the best baseline; large moves need an
explicit allowance), the "same release" rule that makes a re-run a no-op, the run report, its picture
and its page, and the end of a night (publish or refuse, the report written: ``conclude_night``), for
each kind of run: tuning on a joined history (``nightly_decision``, ``with_calibration``, ``close_night``:
the Beam job's single-element steps), privacy-safe tuning (``private_night``) and the W3C Attribution
target (``attribution_night``). ``pipelines/nightly.py`` runs them; they decide, it wires.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from araopt.calibration.accumulator import CalibrationStatistics
from araopt.calibration.calendar import UNSEEN_LOSS_FACTOR
from araopt.constants import (
    ENCODING,
    MAX_COUNT_LIMIT,
    MAX_COUNT_LIMIT_CHANGE,
    MAX_REJECTED_FRACTION,
    MAX_THRESHOLD_CHANGE_FACTOR,
    OBJECTIVE,
    Objective,
)
from araopt.errors import InvalidInput
from araopt.evaluation.plots import nightly_report_png as render_nightly_report
from araopt.io.conversions import ValidationCounts, check_rejected_share
from araopt.io.folders import REPORT_FOLDER, FolderFiles, write_folder
from araopt.io.store import ParameterStore
from araopt.optimize.attribution import AttributionTuning
from araopt.optimize.error_model import recorded_without_signal
from araopt.optimize.statistics import SufficientStatistics
from araopt.optimize.tune import TuningResult
from araopt.optimize.workflow import AraTuning, TuneCandidates
from araopt.version import ParameterVersion, Provenance


@dataclass(frozen=True)
class Guardrails:
    """Publishing rules: beat the best baseline; large moves of C or thresholds need an explicit allowance.

    A change of epsilon, of the slices, queries or encoding starts a new series: the move guards
    compare like with like only (a new epsilon moves C for a reason)."""

    allow_large_change: bool = False
    max_threshold_change_factor: float = MAX_THRESHOLD_CHANGE_FACTOR
    max_count_limit_change: int = MAX_COUNT_LIMIT_CHANGE

    def check(self, new: ParameterVersion, predicted: float, baseline_values: Mapping[str, float],
              previous: ParameterVersion | None, against_baselines: bool = True) -> list[str]:
        """Reasons not to publish (empty: publish), each naming the parameter and the likely cause;
        ``against_baselines=False``: the moves only (a rule's version, not a tuned one: ``private_problems``)."""
        problems = []
        best_baseline = min(baseline_values.values(), default=math.inf)  # (none releasable: nothing to beat)
        if against_baselines and not predicted < best_baseline:
            problems.append(f"the error model's RMSRE_tau {predicted:.4g} does not beat the best baseline "
                            f"{best_baseline:.4g} (both from the error model)")
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
    if previous.api != new.api:
        return f"api changed {previous.api.value} -> {new.api.value}"
    was, will = previous.attribution, new.attribution
    if was is not None and will is not None and (was.epoch_days, was.lookback_days) != (will.epoch_days,
                                                                                       will.lookback_days):
        return (f"epoch / lookback changed {was.epoch_days} / {was.lookback_days} -> {will.epoch_days} / "
                f"{will.lookback_days} days")
    if old.epsilon != now.epsilon:
        return f"epsilon changed {old.epsilon:g} -> {now.epsilon:g}"
    if (old.slice_columns, old.query_columns, old.encoding) != (now.slice_columns, now.query_columns, now.encoding):
        return (f"slices/queries/encoding changed from {list(old.slice_columns)}/{list(old.query_columns)}/"
                f"{old.encoding} to {list(now.slice_columns)}/{list(now.query_columns)}/{now.encoding}")
    if is_cold_start(previous) and not is_cold_start(new):
        return ("the previous version is the cold start (clips from first-party values only, no release yet): the "
                "first version learnt from releases is not judged against its clips")
    old_period = previous.provenance.extra.get("release_period_days") if previous.provenance else None
    new_period = new.provenance.extra.get("release_period_days") if new.provenance else None
    if old_period is not None and new_period is not None and old_period != new_period:
        return f"release period changed {old_period:g} -> {new_period:g} days"
    return ""


def is_cold_start(version: ParameterVersion) -> bool:
    """Whether ``version`` is privacy-safe tuning's cold start (no release to learn from yet)."""
    extra = version.provenance.extra if version.provenance is not None else {}
    return extra.get("cold_start") is True or str(extra.get("tuning", "")).startswith("cold start")


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
    objective: Objective = OBJECTIVE
    guardrails: Guardrails = field(default_factory=Guardrails)
    max_rejected_fraction: float = MAX_REJECTED_FRACTION
    tau_overrides: tuple[tuple[str, float], ...] = ()
    release_period_days: float = 1.0
    lookback_days: int = 0
    special_days: tuple[str, ...] = ()  # declared special days (ISO dates): their own calendar effect
    special_day_loss_factor: float = UNSEEN_LOSS_FACTOR  # the odds band of a special day the history cannot support


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


def nightly_tuning(config: NightlyConfig, counts: ValidationCounts | None = None) -> AraTuning:
    """ARA's tuning steps for tonight (the tuning workflow's mechanism, ``optimize.workflow``): the search
    (Alg. 5 with the baselines) with the config's options and, with ``counts``, the window's row
    accounting and the run in the provenance; the conclusion (``calibrate``) for releases of the
    config's period with its declared special days."""
    accounting: dict[str, Any] = {} if counts is None else {
        "rows": counts.rows_valid,
        "provenance": {"run_id": config.run_id, "as_of": config.as_of, "rows_read": counts.rows_read,
                       "rows_rejected": counts.rows_rejected, "lookback_days": config.lookback_days}}
    search = TuneCandidates(config.epsilon, {
        "encoding": config.encoding, "max_count_limit": config.max_count_limit, "objective": config.objective,
        "slice_columns": config.slice_columns, "training_window": config.window,
        "tau_overrides": dict(config.tau_overrides), "release_period_days": config.release_period_days,
        "history_days": len(config.dates), **accounting})
    return AraTuning(search, config.release_period_days, config.special_days, config.special_day_loss_factor)


def nightly_decision(statistics: SufficientStatistics, counts: ValidationCounts, config: NightlyConfig,
                     previous: ParameterVersion | None) -> NightlyDecision:
    """Gate the history's rejected share, tune (``nightly_tuning``'s ``choose``), apply the guardrails,
    and recognise a re-run."""
    check_rejected_share(counts, config.max_rejected_fraction, what="history window")
    tuning, _ = nightly_tuning(config, counts).choose(statistics)
    if previous is not None and same_release(previous, tuning.version, config.as_of):
        return NightlyDecision(tuning, (), True)
    problems = config.guardrails.check(tuning.version, tuning.predicted_rmsre_tau, tuning.baseline_values(), previous)
    return NightlyDecision(tuning, tuple(problems), False)


def with_calibration(decision: NightlyDecision, calibration_statistics: Sequence[CalibrationStatistics] | None,
                     previous: ParameterVersion | None,
                     config: NightlyConfig) -> NightlyDecision:
    """The decision for the parameters carrying the calibration fitted on the window (``nightly_tuning``'s
    ``conclude``: the candidates replayed on the window's days), guarded again (the replay may prefer the
    other candidate); a re-run of the same as-of date on the same history is recognised with the
    calibration included."""
    tuning = nightly_tuning(config).conclude(decision.tuning, calibration_statistics)
    idempotent = previous is not None and same_release(previous, tuning.version, config.as_of)
    if idempotent:
        return NightlyDecision(tuning, (), True)
    return NightlyDecision(tuning, tuple(config.guardrails.check(tuning.version, _model_prediction(tuning),
                                                                 tuning.baseline_values(), previous)), False,
                           new_series(previous, tuning.version) if previous is not None else "")


def predicted_error(tuning: TuningResult) -> tuple[float, str]:
    """THE predicted RMSRE_tau of the chosen version and how it was made: what the version's provenance
    records (replayed on the window's days when the history allows a backtest, else the error model).
    The console, the run report, its picture and the demo all show this one number."""
    prov = tuning.version.provenance
    value = prov.predicted_rmsre_tau if prov is not None and prov.predicted_rmsre_tau is not None \
        else tuning.predicted_rmsre_tau
    how = ("replayed on the window's days" if prov is not None and "backtest" in prov.extra else "error model")
    return float(value), how


def _model_prediction(tuning: TuningResult) -> float:
    """The model's predicted RMSRE_tau (the baselines' are model predictions too)."""
    prov = tuning.version.provenance
    value = prov.extra.get("model_predicted_rmsre_tau") if prov is not None else None
    return float(value) if value is not None else tuning.predicted_rmsre_tau


REPORT_MODES = ("joined history", "privacy-safe")
"""The two kinds of nightly run: tuning on a joined history, privacy-safe tuning on past releases."""


def run_report(mode: str, as_of: str, run_id: str, epsilon: float, version: ParameterVersion,
               predicted: float | None, baselines: Mapping[str, float], previous_version: str | None,
               problems: Sequence[str], idempotent: bool, series: str, **facts: Any) -> dict[str, Any]:
    """The one schema of a nightly run report (JSON), whichever the input: the decision (guardrails'
    problems, a re-run recognised, a new series), the chosen parameters and their predicted RMSRE_tau
    against the baselines, then the ``facts`` of the mode's input (the window's rows, or the releases
    and first-party conversions learnt from). ``publish_version`` adds what was published."""
    if mode not in REPORT_MODES:
        raise ValueError(f"unknown nightly mode {mode!r}")
    return {"as_of": as_of, "run_id": run_id, "mode": mode, "epsilon": epsilon, **facts,
            "predicted_rmsre_tau": predicted, "baselines": dict(baselines), "params": version.to_json(),
            "previous_version": previous_version, "published": False, "idempotent": idempotent,
            "problems": list(problems), "new_series": series}


def nightly_report(decision: NightlyDecision, config: NightlyConfig, counts: ValidationCounts,
                   previous_version: str | None) -> dict[str, Any]:
    """The run report (JSON) of tuning on a joined history: what was decided, with the numbers behind it."""
    tuning = decision.tuning
    predicted, how = predicted_error(tuning)
    return run_report(
        "joined history", config.as_of, config.run_id, config.epsilon, tuning.version, predicted,
        tuning.baseline_values(), previous_version, decision.problems, decision.idempotent, decision.series,
        window=list(config.window), history_dates=list(config.dates), rows_read=counts.rows_read,
        rows_rejected=counts.rows_rejected, objective=str(config.objective), taus=list(tuning.taus),
        tau_rule=tuning.tau_rule, release_period_days=config.release_period_days, lookback_days=config.lookback_days,
        model_predicted_rmsre_tau=_model_prediction(tuning), prediction=how,
        predicted_without_signal=recorded_without_signal(tuning.version),
        optimizer_seconds=tuning.optimization.seconds,
        per_count_limit=tuning.optimization.table().to_dict(orient="records"))


@dataclass(frozen=True)
class PrivateDecision:
    """The privacy-safe run's decision on a version it learnt (``optimize.private``): why not to publish
    it (if anything), whether it repeats the previous release, whether it starts a new series."""

    version: ParameterVersion
    problems: tuple[str, ...]
    idempotent: bool
    series: str = ""

    @property
    def publish(self) -> bool:
        return not self.idempotent and not self.problems

    @property
    def predicted(self) -> float | None:
        provenance = self.version.provenance
        return None if provenance is None else provenance.predicted_rmsre_tau

    @property
    def baselines(self) -> dict[str, float]:
        provenance = self.version.provenance
        recorded = provenance.extra.get("baselines", {}) if provenance is not None else {}
        return {str(name): float(b["rmsre_tau"]) for name, b in recorded.items()}


def private_decision(version: ParameterVersion, previous: ParameterVersion | None, as_of: str,
                     guardrails: Guardrails) -> PrivateDecision:
    """Recognise a re-run, then apply the guardrails to a privacy-safe version as to a tuned one (its
    prediction against the baselines its provenance records); the cold start has no prediction to
    guard (no release yet)."""
    if previous is not None and same_release(previous, version, as_of):
        return PrivateDecision(version, (), True)
    return PrivateDecision(version, private_problems(version, previous, guardrails), False,
                           new_series(previous, version) if previous is not None else "")


def private_problems(version: ParameterVersion, previous: ParameterVersion | None,
                     guardrails: Guardrails) -> tuple[str, ...]:
    """The guardrails on a privacy-safe version (``nightly --private`` against the latest published
    version, ``optimize --private`` against the last release's parameters): its recorded prediction
    against its recorded baselines; none for the cold start (no release yet, no prediction) nor for the
    cold-start rule it falls back to (its capped estimates when nothing identifies the slices' retention,
    or when the releases contradict the model: the floor, a fixed public rule, which a guard must not
    block the way back to). The public schedule's probes are rules too: not held to beat the baselines
    (whose predictions divide by a retention a capped probe does not claim) nor guarded as moves."""
    unguarded = PrivateDecision(version, (), False)
    predicted, baselines = unguarded.predicted, unguarded.baselines
    if predicted is None or is_cold_start_rule(version):
        return ()
    if previous is not None and (is_scheduled_probe(version) or is_scheduled_probe(previous)):
        previous = None  # the public count-limit schedule moves C to and from a probe: not a move to guard
    # no baseline recorded (none releasable at the budget): nothing to beat, the moves are still guarded
    return tuple(guardrails.check(version, predicted, baselines, previous,
                                  against_baselines=bool(baselines) and not is_scheduled_probe(version)))


def released_on_probe_day(version: ParameterVersion, release_date: str) -> bool:
    """Whether the public count-limit schedule ``version`` was tuned under (its
    ``provenance.extra.count_limit_schedule``) probes on ``release_date`` (YYYY-MM-DD): a release of that
    day may have been a probe, which the next version moves back from (``optimize --private`` knows the
    last release's parameters only, not the version they came from)."""
    extra = version.provenance.extra if version.provenance is not None else {}
    schedule = extra.get("count_limit_schedule")
    if not isinstance(schedule, dict) or not schedule.get("period"):
        return False
    day = int(np.datetime64(release_date, "D").astype(np.int64))
    return bool(day % int(schedule["period"]) == int(schedule.get("phase", 0)))


def is_cold_start_rule(version: ParameterVersion) -> bool:
    """Whether privacy-safe tuning published ``version`` as its cold-start rule (``optimize.private``:
    ``provenance.extra.robust_prediction.candidate``)."""
    extra = version.provenance.extra if version.provenance is not None else {}
    robust = extra.get("robust_prediction")
    return isinstance(robust, dict) and robust.get("candidate") == "cold start"


def is_scheduled_probe(version: ParameterVersion) -> bool:
    """Whether ``version`` is a probe of privacy-safe tuning's public count-limit schedule
    (``optimize.private.CountLimitSchedule``)."""
    extra = version.provenance.extra if version.provenance is not None else {}
    schedule = extra.get("count_limit_schedule")
    return isinstance(schedule, dict) and str(schedule.get("decision", "")).startswith("probe")


def private_report(decision: PrivateDecision, as_of: str, run_id: str, epsilon: float, previous_version: str | None,
                   **inputs: Any) -> dict[str, Any]:
    """The run report (JSON, :func:`run_report`'s schema) of privacy-safe tuning; ``inputs``: what it
    learnt from (window, release dates, cold start, first-party rows read, refused, after the as-of date)."""
    return run_report("privacy-safe", as_of, run_id, epsilon, decision.version, decision.predicted,
                      decision.baselines, previous_version, decision.problems, decision.idempotent, decision.series,
                      **inputs)


def publish_version(store: ParameterStore, version: ParameterVersion, report: dict[str, Any], as_of: str,
                    run_id: str, expected_previous: str | None) -> dict[str, Any]:
    """Publish ``version`` (the decision said so) and record in ``report`` what was published."""
    published = store.publish(as_of, run_id, version.to_bytes(), expected_previous=expected_previous,
                              validate=ParameterVersion.from_bytes)
    report.update(published=True, version=published.version, version_uri=published.uri, sha256=published.sha256,
                  created=published.created, pointer_moved=published.moved)
    return report


def _published_versions(store: ParameterStore, limit: int) -> Iterator[tuple[str, ParameterVersion]]:
    """The last ``limit`` published versions of a parameter store (``araopt.io.store``), oldest first;
    a version that no longer parses is skipped, never fatal for a report."""
    for version in store.list_versions()[-limit:]:
        try:
            yield version, ParameterVersion.from_bytes(store.resolve(version).payload, version)
        except Exception:  # noqa: BLE001 - a bad old version must not break the report
            continue


def version_history(store: ParameterStore, limit: int = 60) -> list[tuple[str, int, float | None]]:
    """(version, C, predicted RMSRE_tau) of the last ``limit`` published versions of a parameter store."""
    return [(version, p.params.count_limit, p.provenance.predicted_rmsre_tau if p.provenance else None)
            for version, p in _published_versions(store, limit)]


def version_table(store: ParameterStore, limit: int = 60) -> list[dict[str, Any]]:
    """The last ``limit`` published versions of a parameter store, oldest first, as table rows: version,
    epsilon, C, each query's clip threshold and the predicted RMSRE_tau of one release."""
    rows = []
    for version, p in _published_versions(store, limit):
        row: dict[str, Any] = {"version": version, "epsilon": p.params.epsilon, "C": p.params.count_limit}
        row.update({f"clip {q.column}": q.clip_threshold for q in p.params.queries})
        row["predicted RMSRE_tau"] = p.provenance.predicted_rmsre_tau if p.provenance else None
        row["calibrated"] = p.calibration is not None
        rows.append(row)
    return rows


def nightly_report_png(decision: NightlyDecision, history: Sequence[tuple[str, int, float | None]]) -> bytes:
    """The run report's picture (``evaluation.plots.nightly_report_png``) for this decision."""
    tuning = decision.tuning
    names = ("count",) + tuning.params.query_columns
    period = tuning.version.provenance.extra.get("release_period_days") if tuning.version.provenance else None
    return render_nightly_report(tuning.optimization.table(), tuning.params.count_limit, tuning.baseline_values(),
                  list(zip(names, tuning.taus, strict=True)), history, decision.problems,
                  float(period) if period is not None else None, predicted_error(tuning))


def version_report_png(version: ParameterVersion, problems: Sequence[str],
                       history: Sequence[tuple[str, int, float | None]]) -> bytes | None:
    """The run report's picture from what a tuned version records in its provenance (the per-C table, the
    baselines and tau): for runs that keep no ``TuningResult``, as the privacy-safe one. None for a
    version without them (the cold start's defaults were not optimized)."""
    import pandas as pd

    extra = version.provenance.extra if version.provenance is not None else {}
    table = extra.get("per_count_limit")
    taus = extra.get("taus")
    if not table or not taus:
        return None
    baselines = {str(name): float(b["rmsre_tau"]) if isinstance(b, Mapping) else float(b)
                 for name, b in (extra.get("baselines") or {}).items()}
    names = ("count",) + version.params.query_columns
    period = extra.get("release_period_days")
    predicted = version.provenance.predicted_rmsre_tau if version.provenance is not None else None
    how = "replayed on the window's days" if "backtest" in extra else "error model"
    return render_nightly_report(pd.DataFrame(list(table)), version.params.count_limit, baselines,
                                 list(zip(names, taus, strict=True)), history, problems,
                                 float(period) if period is not None else None,
                                 (float(predicted), how) if predicted is not None else None)


def private_night(version: ParameterVersion, previous: ParameterVersion | None, as_of: str, run_id: str,
                  epsilon: float, expected_previous: str | None, guardrails: Guardrails,
                  **inputs: Any) -> tuple[PrivateDecision, dict[str, Any]]:
    """``nightly --private``'s decision on the version privacy-safe tuning learnt (``optimize.private_inputs``):
    the version stamped with the run (as-of date, run id), :func:`private_decision` against the latest
    published version ``previous``, and its run report (:func:`private_report`; ``inputs``: what it
    learnt from). The caller publishes (``publish_version``) when the decision says so."""
    provenance = version.provenance or Provenance()
    version = dataclasses.replace(version, provenance=dataclasses.replace(
        provenance, extra={**provenance.extra, "as_of": as_of, "run_id": run_id}))
    decision = private_decision(version, previous, as_of, guardrails)
    return decision, private_report(decision, as_of, run_id, epsilon, expected_previous, **inputs)


def attribution_night(tuning: AttributionTuning, previous: ParameterVersion | None, as_of: str, run_id: str,
                      budget: float, window_start: str, dates: Sequence[str], expected_previous: str | None,
                      guardrails: Guardrails, created_at: str, counts: ValidationCounts
                      ) -> tuple[PrivateDecision, dict[str, Any]]:
    """``nightly --api attribution``'s decision on the version tuned on the window
    (the tuning workflow with ``optimize.attribution.AttributionTuner``): the version stamped with the
    run (window, rows, its prediction and the baselines', as-of date, run id), then the rules every
    night applies to a version that records its prediction and baselines (:func:`private_decision`: a
    re-run recognised, the guardrails against the latest published version ``previous``, a new series)
    and its run report (:func:`run_report`'s
    schema, with the retention ratios; ``counts``: the history's rows read and rejected). The caller
    concludes it (:func:`conclude_night`)."""
    result, baselines = tuning.optimization, tuning.baselines
    version = dataclasses.replace(tuning.version, provenance=tuning.provenance(
        window_start, as_of, created_at, counts, as_of=as_of, run_id=run_id))
    decision = private_decision(version, previous, as_of, guardrails)
    assert version.retention is not None  # (the workflow fits it)
    report = run_report("joined history", as_of, run_id, budget, version, result.rmsre_tau, baselines,
                        expected_previous, decision.problems, decision.idempotent, decision.series, api="attribution",
                        baselines_not_releasable=tuning.not_releasable,
                        window=[window_start, as_of], history_dates=list(dates),
                        rows_read=counts.rows_read, rows_rejected=counts.rows_rejected,
                        taus=list(result.taus), retention=version.retention.to_json(),
                        per_count_limit=result.table().to_dict(orient="records"))
    return decision, report


def report_dir(store: str, as_of: str, run_id: str) -> str:
    """Where a night's run report goes: ``STORE/reports/<as-of>-<run id>``."""
    return FolderFiles(store).path(f"reports/{as_of}-{run_id}")


def run_report_files(report: dict[str, Any], store: ParameterStore, decision: NightlyDecision | None = None,
                     version: ParameterVersion | None = None) -> dict[str, bytes]:
    """report.json, report.png (from the decision, or from what ``version`` records of its tuning: the
    privacy-safe run; none for its cold start nor without either) and report.html, the page a person
    opens (``araopt.evaluation.report_html``), beside them."""
    from araopt.evaluation.report_html import Figure, nightly_page
    from araopt.io import jsonio

    files = {"report.json": jsonio.dumps(report, indent=1, default=str).encode()}
    figures, links = [], [("report.json (the run report)", "report.json")]
    if decision is not None:
        png: bytes | None = nightly_report_png(decision, version_history(store))
    else:
        png = None if version is None else version_report_png(version, report.get("problems", ()),
                                                               version_history(store))
    if png is not None:
        files["report.png"] = png
        figures.append(Figure("The nightly choice (report.png)", png, "report.png"))
        links.append(("report.png", "report.png"))
    if report.get("published") and report.get("version"):
        links.append((f"published parameters {report['version']}", f"../../versions/{report['version']}/params.json"))
    files["report.html"] = nightly_page(report, version_table(store), figures, links).encode("utf-8")
    return files


def write_run_report(directory: str, report: dict[str, Any], store: ParameterStore,
                     decision: NightlyDecision | None = None, version: ParameterVersion | None = None) -> None:
    """The run report's folder (:func:`run_report_files`), whole or absent like every output folder; a
    re-run with the same run id replaces its own report."""
    write_folder(directory, run_report_files(report, store, decision, version), "araopt nightly report",
                 REPORT_FOLDER, {"command": "nightly"}, overwrite=True)


def conclude_night(store: ParameterStore, store_uri: str, report: dict[str, Any], version: ParameterVersion,
                   idempotent: bool, problems: Sequence[str], as_of: str, run_id: str, expected_previous: str | None,
                   decision: NightlyDecision | None = None, figure_from: ParameterVersion | None = None) -> str:
    """The end of a night, for every kind of run: a re-run of the same as-of date names the version
    already published; a version the guardrails refuse is not published; else it is published with a
    compare-and-swap of ``latest`` (:func:`publish_version`). The run report is written either way
    (:func:`write_run_report`, its picture from ``decision`` or from what ``figure_from`` records); a
    refusal then raises (one line naming the report). Returns the report's folder."""
    directory = report_dir(store_uri, as_of, run_id)
    if idempotent:  # the same as-of date on the same history: nothing new to publish
        report.update(version=expected_previous)
    elif not problems:
        publish_version(store, version, report, as_of, run_id, expected_previous)
    write_run_report(directory, report, store, decision, figure_from)
    if problems:
        raise InvalidInput("not published: " + "; ".join(problems) + f" (report: {directory})")
    return directory


def latest_version(store: ParameterStore) -> tuple[str | None, ParameterVersion | None]:
    """The store's latest version before tonight's run, read and parsed once: its name (the publish's
    expected previous version, compare-and-swap) and the version; (None, None) before the first publish."""
    if store.read_latest_pointer() is None:
        return None, None
    resolved = store.resolve("latest")
    return resolved.version, ParameterVersion.from_bytes(resolved.payload, "previous latest")


def close_night(decision: NightlyDecision, calibration_statistics: Sequence[CalibrationStatistics] | None,
                counts: ValidationCounts, config: NightlyConfig, previous: ParameterVersion | None,
                expected_previous: str | None, store: ParameterStore) -> dict[str, Any]:
    """The nightly job's last single-element step (tuning on a joined history): the decision for the
    parameters with the window's calibration attached (:func:`with_calibration`), its run report, and the
    conclusion (:func:`conclude_night`). Returns the report."""
    decision = with_calibration(decision, calibration_statistics, previous, config)
    report = nightly_report(decision, config, counts, expected_previous)
    conclude_night(store, config.store, report, decision.tuning.version, decision.idempotent, decision.problems,
                   config.as_of, config.run_id, expected_previous, decision)
    return report
