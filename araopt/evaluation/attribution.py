"""Evaluation of W3C Attribution Level 1 parameters on a test log (the Sec. 5 comparison for this
target): the optimized parameters (``optimize.attribution``, tuned on the training log) against the
baselines (the spec's defaults; the q95 maxValue with an equal split), per per-site budget.

* ``analytic``: RMSRE_tau (Def. 3.2) of the error model (Thm. 4.2 for this target,
  ``attribution.error``) on the test log, one simulated draw of the browsers (``simulation_seed``);
* ``monte_carlo``: the real measurement (``attribution.measure``, seeded simulation) ``runs`` times:
  the realised RMSRE_tau of Alg. 4's estimates against the true totals (``error_model.
  realised_rmsre_tau``), and the coverage of the intervals of the true totals (the estimates divided
  by the retention ratios learnt on the training log, ``attribution.calibrate``);
* the generalization ratio: the test RMSRE_tau of the parameters tuned on train over that of the
  parameters tuned on test (1 is perfect).

All metrics use the training taus (tau = 5 x training median, Sec. 5.1) for every method.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from araopt.attribution.calibrate import Retention, retention
from araopt.attribution.measure import AttributionMeasurement, measure
from araopt.attribution.params import AttributionParams
from araopt.errors import InvalidParameters
from araopt.mechanism.keys import KeyDomain
from araopt.optimize.attribution import (
    BASELINES,
    DEFAULT_MAX_COUNT_LIMIT,
    AttributionProblem,
    optimize_attribution,
    params_columns,
    predicted_rmsre_tau,
    releasable_baseline,
    training_taus,
)
from araopt.optimize.error_model import realised_rmsre_tau

OPTIMIZED = "optimized"

Interval = Callable[[AttributionMeasurement, AttributionParams], tuple[np.ndarray, np.ndarray]]
"""From a measurement: the released estimates of the true totals and their interval half widths
(slices x queries, count first)."""


def alg4_intervals(result: AttributionMeasurement, params: AttributionParams) -> tuple[np.ndarray, np.ndarray]:
    """Alg. 4's estimates and the half widths of their noise intervals (one task)."""
    estimates = [result.estimates[(q.name, 0)] for q in params.queries]
    values = np.column_stack([e.values for e in estimates])
    half = np.column_stack([np.full(len(e.values), e.half_width) for e in estimates])
    return values, half


def true_total_intervals(retention: Retention) -> Interval:
    """The estimates of the true totals and their intervals of a training ``retention``
    (``attribution.calibrate``)."""

    def intervals(result: AttributionMeasurement, params: AttributionParams) -> tuple[np.ndarray, np.ndarray]:
        parts = [retention.true_totals(i, result.estimates[(q.name, 0)]) for i, q in enumerate(params.queries)]
        return np.column_stack([v for v, _ in parts]), np.column_stack([h for _, h in parts])

    return intervals


@dataclass(frozen=True)
class MethodEvaluation:
    """One method at one budget: its parameters, analytic test RMSRE_tau and (with runs) the realised
    RMSRE_tau and the interval coverage of the true totals."""

    method: str
    params: AttributionParams | None
    analytic: float
    realised: float | None
    coverage: float | None
    note: str | None = None
    """Why a baseline was not evaluated (``params`` None: it cannot be released at this budget,
    ``optimize.attribution.releasable_baseline``)."""


def true_totals(params: AttributionParams, rows: pd.DataFrame, domain: KeyDomain) -> np.ndarray:
    """The log's true totals per histogram index and query (count first), over the domain."""
    index = domain.slice_index({c: rows[c].to_numpy() for c in params.slice_columns})
    inside = index >= 0
    out = np.zeros((domain.num_slices, len(params.queries)))
    for qi, q in enumerate(params.queries):
        v = np.ones(len(rows)) if q.column is None else rows[q.column].to_numpy(dtype=np.float64)
        out[:, qi] = np.bincount(index[inside], weights=v[inside], minlength=domain.num_slices)
    return out


def evaluate_method(method: str, params: AttributionParams, test: pd.DataFrame, domain: KeyDomain, taus: np.ndarray,
                    runs: int = 0, seed: int = 0, intervals: Interval | None = None) -> MethodEvaluation:
    """The analytic test RMSRE_tau of ``params`` and, with ``runs``, the realised RMSRE_tau of Alg. 4's
    estimates and the coverage of ``intervals`` (default: Alg. 4's noise intervals)."""
    analytic = predicted_rmsre_tau(params, test, domain, taus, seed)
    if runs <= 0:
        return MethodEvaluation(method, params, analytic, None, None)
    truth = true_totals(params, test, domain)
    squares, covered = [], []
    for run in range(runs):
        result = measure(params, test, domain, simulation_seed=seed + run)
        squares.append(realised_rmsre_tau(alg4_intervals(result, params)[0], truth, taus).per_query ** 2)
        values, half = (intervals or alg4_intervals)(result, params)
        covered.append(np.abs(values - truth) <= half)
    realised = float(np.sqrt(np.mean(np.mean(squares, axis=0))))
    return MethodEvaluation(method, params, analytic, realised, float(np.mean(covered)))


@dataclass(frozen=True)
class BudgetEvaluation:
    """One per-site budget: every method, and the generalization ratio of the optimized parameters."""

    budget: float
    methods: tuple[MethodEvaluation, ...]
    tuned_on_test: float

    @property
    def optimized(self) -> MethodEvaluation:
        return next(m for m in self.methods if m.method == OPTIMIZED)

    @property
    def best_baseline(self) -> MethodEvaluation | None:
        """The releasable baseline of the lowest analytic test RMSRE_tau (None: none is releasable)."""
        return min((m for m in self.methods if m.method != OPTIMIZED and m.params is not None),
                   key=lambda m: m.analytic, default=None)

    @property
    def ratio(self) -> float:
        """Optimized over the best baseline (analytic test RMSRE_tau; NaN without a releasable baseline)."""
        best = self.best_baseline
        return math.nan if best is None else self.optimized.analytic / best.analytic

    @property
    def generalization(self) -> float:
        """Test RMSRE_tau of the parameters tuned on train over that of the parameters tuned on test."""
        return self.optimized.analytic / self.tuned_on_test


def evaluate_attribution(train: pd.DataFrame, test: pd.DataFrame, domain: KeyDomain, value_columns: Sequence[str],
                         slice_columns: Sequence[str], budgets: Sequence[float], *, runs: int = 0, seed: int = 0,
                         lookbacks: Sequence[int] = (30,), epoch_days: int = 7,
                         level: float = 0.95, max_count_limit: int = DEFAULT_MAX_COUNT_LIMIT
                         ) -> tuple[BudgetEvaluation, ...]:
    """The comparison for every budget (module docstring); the taus are the training taus; coverage is of
    each method's intervals of the true totals at ``level``, calibrated on the training log
    (``attribution.calibrate``)."""
    if not budgets:
        raise InvalidParameters("evaluate needs at least one per-site budget")
    taus = training_taus(train, value_columns)
    out = []
    for budget in budgets:
        problem = AttributionProblem(float(budget), tuple(value_columns), tuple(slice_columns), epoch_days,
                                     tuple(lookbacks), max_count_limit)
        tuned = optimize_attribution(problem, train, domain, taus, seed)
        on_test = optimize_attribution(problem, test, domain, taus, seed)
        methods = []
        for name, params in ((OPTIMIZED, tuned.params),
                             *((b, releasable_baseline(b, problem, train)) for b in BASELINES)):
            if isinstance(params, str):  # a baseline that cannot be released at this budget: no method to run
                methods.append(MethodEvaluation(name, None, math.nan, None, None, f"not releasable: {params}"))
                continue
            released = true_total_intervals(retention(params, train, domain, seed, level)) if runs else None
            methods.append(evaluate_method(name, params, test, domain, taus, runs, seed, released))
        out.append(BudgetEvaluation(float(budget), tuple(methods),
                                    predicted_rmsre_tau(on_test.params, test, domain, taus, seed)))
    return tuple(out)


def evaluation_table(evaluations: Sequence[BudgetEvaluation]) -> pd.DataFrame:
    """One row per (budget, method): analytic and realised RMSRE_tau, coverage, the ratio to the best
    baseline and (optimized) the generalization ratio."""
    rows = []
    for e in evaluations:
        best = math.nan if e.best_baseline is None else e.best_baseline.analytic
        for m in e.methods:
            row: dict[str, Any] = {"budget": e.budget, "method": m.method, "RMSRE_tau": m.analytic,
                                   "realised": m.realised, "coverage": m.coverage,
                                   "ratio_to_best_baseline": m.analytic / best}
            if m.params is not None:
                row.update(params_columns(m.params))
            row.update({"tuned_train/test": e.generalization if m.method == OPTIMIZED else None,
                        "note": m.note or ""})
            rows.append(row)
    return pd.DataFrame(rows)
