"""ParameterOptimization (Alg. 5) on sufficient statistics, the one search: L-inf (Alg. 3), L1 (Alg. 6),
for the paper's objective (``optimize.objective``: "exact" or "relaxed", Alg. 4's estimates) or the
corrected one ("corrected": the estimates of the true totals, ``optimize.corrected``); one result type.

Search (L-inf), for every C = 1..C_max (Alg. 5), kept ranks K(C) = Gamma // floor(Gamma/C):
  * For fixed thresholds, sum_l K_l/alpha_l^2 subject to sum alpha_l = 1 is minimised by
    alpha_l ~ K_l^(1/3) (Lagrange), with K_l = W_l(C_l) C_l^2 the variance factor.
  * For fixed alpha_l, each query is a 1-D problem. A_lj(c) is linear in c between consecutive
    grid points (the bucket edges of the statistics: exact between data values in empty gaps,
    interpolated inside a bucket), so the bias term is a quadratic in c on every segment and the
    variance term W(c) c^2 / alpha^2 a cubic (relaxed: quadratic). The global minimum over all
    segments is found in closed form (roots of the derivative on every segment, vectorized; the
    model and its minimisation at one C: ``optimize.linf_search``).
  * d = 1: this is the global optimum of the model. d >= 2: alternating minimisation (each block
    step is globally optimal, Theorem 4.7 biconvexity) from several starts (the paper's start:
    99 % quantiles and equal split; per-query optima; the previous C's optimum), then a profile
    coordinate search over all grid points with alpha eliminated in closed form:
    min_c sum_l bias_l(c_l) + (sum_l K_l(c_l)^(1/3))^3.
  * Exact objective: the search uses continuous alpha (s_l = alpha_l Gamma / C) and rounding
    variance 1/6 per unclipped kept conversion; the result is floored to integer scales
    (leftover units assigned greedily) and its objective recomputed (``objective.predicted_rmsre_tau``).

Corrected objective (L-inf): per C, thresholds on a grid of training quantiles with the fractions
in closed form (``corrected.CorrectedModel``), the same integer scales; the chosen parameters'
objective recomputed by ``corrected.corrected_objective``.

L1 (Alg. 6): d = 1 with randomized rounding is L-inf with alpha = 1 (exact). Otherwise the objective
is evaluated on the statistics' per-(slice, rank) samples (exact for small cells, unbiased
otherwise) and the thresholds are found by a coordinate search on a log grid (local optimum).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import numpy.typing as npt
import pandas as pd
from scipy import optimize as sp_optimize
from tqdm import tqdm

from araopt.constants import ENCODING, L1_ROUNDING, L1_ROUNDING_OF_A_FILE, MAX_COUNT_LIMIT, OBJECTIVE, Objective
from araopt.errors import InvalidParameters, Unsupported, check_epsilon
from araopt.mechanism.bounding import kept_per_impression
from araopt.mechanism.noise import discrete_laplace_variance, noise_parameter
from araopt.mechanism.params import Encoding, Params, QueryParams
from araopt.optimize.corrected import CorrectedModel, corrected_objective
from araopt.optimize.error_model import check_error_model, rmsre_tau
from araopt.optimize.linf_search import MAX_CELLS, LinfModel, linf_model, solve_linf
from araopt.optimize.linf_search import SearchContext as SearchContext  # re-exported: the callers' one search module
from araopt.optimize.linf_search import prepare_search as prepare_search
from araopt.optimize.objective import (
    check_max_count_limit,
    check_taus,
    l1_sample_terms_batch,
    sample_cells,
    statistics_breakdown,
)
from araopt.optimize.statistics import SufficientStatistics

ENCODINGS = (Encoding.LINF.value, Encoding.L1.value)
"""The encodings the optimizer chooses parameters for (the baseline is Sec. 5.1's fixed rule)."""


def check_objective(objective: str) -> Objective:
    """``objective`` as an ``Objective`` (any of them: the paper's error models or CORRECTED)."""
    if objective not in tuple(Objective):
        raise InvalidParameters(f"objective must be one of {tuple(map(str, Objective))}, got {str(objective)!r}")
    return Objective(objective)




# ================================================================================================
# Building parameter files
# ================================================================================================

def _integer_fractions(k: np.ndarray, count_limit: int, gamma: int) -> np.ndarray:
    """Budget fractions whose floors floor(alpha Gamma/C) minimise sum K_l / s_l^2 near alpha ~ K^(1/3)."""
    d = len(k)
    units = gamma // count_limit
    if units < d:
        raise InvalidParameters(f"count limit {count_limit} leaves {units} budget units for {d} queries")
    r = np.cbrt(np.maximum(k, 1e-300))
    s = np.maximum(1, np.floor(r / r.sum() * units)).astype(np.int64)
    while s.sum() > units:
        s[int(np.argmax(s))] -= 1
    for _ in range(int(units - s.sum())):
        gain = k * (1.0 / s**2 - 1.0 / (s + 1.0) ** 2)
        s[int(np.argmax(gain))] += 1
    alpha = s * count_limit / gamma
    slack = gamma - units * count_limit  # < C: floor(alpha Gamma / C) is unchanged by adding it to one query
    alpha[int(np.argmax(s))] += slack / gamma
    return cast(np.ndarray, alpha)


def candidate_params(
    stats: SufficientStatistics, encoding: str, epsilon: float, count_limit: int, thresholds: np.ndarray,
    fractions: np.ndarray | None, taus: np.ndarray, slice_columns: Sequence[str] | None, l1_rounding: str = "randomized",
    count_fraction: float | None = None,
) -> Params:
    queries = tuple(
        QueryParams(col, float(thresholds[q]), None if fractions is None else float(fractions[q]), float(taus[q + 1]))
        for q, col in enumerate(stats.value_columns)
    )
    return Params(count_limit=int(count_limit), encoding=encoding, epsilon=epsilon,
                  slice_columns=tuple(stats.slice_columns if slice_columns is None else slice_columns),
                  queries=queries, count_budget_fraction=count_fraction, count_tau=float(taus[0]),
                  l1_rounding=l1_rounding if encoding == Encoding.L1 else L1_ROUNDING_OF_A_FILE,
                  contribution_budget=stats.spec.contribution_budget)


def _finalize_fractions(model: LinfModel, c: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    if model.d == 1:
        return np.array([1.0])
    if model.kind == Objective.EXACT:
        k = np.array([float(model.var_factor(q, c[q])) for q in range(model.d)])
        return _integer_fractions(k, model.count_limit, model.contribution_budget)
    a = np.maximum(alpha, 2.0 * model.count_limit / model.contribution_budget)
    return cast(np.ndarray, a / a.sum())


# ================================================================================================
# Results
# ================================================================================================

@dataclass(frozen=True)
class CandidateResult:
    """Best parameters for one count limit C (a row of Alg. 5's loop) and the model's RMSRE_tau of them."""

    count_limit: int
    kept_ranks: int
    rmsre_tau: float
    thresholds: tuple[float, ...]
    fractions: tuple[float, ...] | None
    count_mse_share: float  # share of the count query in the objective (bias of dropped conversions + noise)


@dataclass(frozen=True)
class OptimizationResult:
    """The chosen parameters, their predicted RMSRE_tau under ``objective``, the per-C table and timing."""

    params: Params
    predicted_rmsre_tau: float
    objective: Objective
    encoding: str
    per_count_limit: tuple[CandidateResult, ...]
    taus: tuple[float, ...]
    seconds: float

    def table(self) -> pd.DataFrame:
        rows = []
        for r in self.per_count_limit:
            row = {"C": r.count_limit, "kept_ranks": r.kept_ranks, "rmsre_tau": r.rmsre_tau,
                   "count_share": r.count_mse_share}
            for name, t in zip(self.params.query_columns, r.thresholds, strict=True):
                row[f"C_{name}"] = t
            if r.fractions is not None:
                for name, a in zip(self.params.query_columns, r.fractions, strict=True):
                    row[f"alpha_{name}"] = a
            rows.append(row)
        return pd.DataFrame(rows)


def _progress(iterable: range, progress: bool, desc: str) -> tqdm[int]:
    enabled = bool(progress) and sys.stderr.isatty()
    return tqdm(iterable, desc=desc, unit="C", file=sys.stderr, disable=not enabled, leave=False)


# ================================================================================================
# Public optimizers
# ================================================================================================

def optimize(
    stats: SufficientStatistics, epsilon: float, encoding: str = ENCODING, max_count_limit: int = MAX_COUNT_LIMIT,
    objective: Objective = OBJECTIVE.error_model, taus: np.ndarray | Sequence[float] | None = None, progress: bool = True,
    l1_rounding: str = L1_ROUNDING, slice_columns: Sequence[str] | None = None, context: SearchContext | None = None,
    period_variance: float | Sequence[float] | np.ndarray = 0.0,
) -> OptimizationResult:
    """Alg. 5 over C = 1..C_max on sufficient statistics; returns the best Params and the per-C table.

    ``objective``: "exact" or "relaxed" (the paper's estimator, ``optimize.objective``) or "corrected"
    (the estimates of the true totals, L-inf only; ``period_variance``: V_period of the measured
    period, scalar or d+1). ``context`` (from ``prepare_search`` with the same statistics and taus)
    reuses the per-C bias models of the paper's objective across calls, e.g. over epsilons."""
    t0 = time.perf_counter()
    epsilon = check_epsilon(epsilon)
    objective = check_objective(objective)
    if encoding not in ENCODINGS:
        raise InvalidParameters(f"encoding must be one of {ENCODINGS}, got {encoding!r}")
    if l1_rounding not in ("floor", "randomized"):
        raise InvalidParameters(f"l1_rounding must be 'floor' or 'randomized', got {l1_rounding!r}")
    if objective == Objective.CORRECTED and encoding != Encoding.LINF:
        raise Unsupported(f"the corrected objective is searched for encoding 'linf' only, got {encoding!r}")
    cmax = check_max_count_limit(stats, max_count_limit)
    if stats.num_conversions == 0:
        raise InvalidParameters("the statistics hold no conversions (empty history)")
    if objective == Objective.CORRECTED:
        tau = check_taus(stats, taus)
        rows, params = _corrected_candidates(stats, epsilon, cmax, tau, period_variance, slice_columns, progress)
        final = corrected_objective(stats, params, tau, objective.error_model, period_variance)
    else:
        rows, params = _paper_candidates(stats, epsilon, encoding, cmax, objective, taus, progress, l1_rounding,
                                         slice_columns, context)
        tau = _context(stats, taus, context).taus
        final = _objective_value(stats, params, tau, objective)
    return OptimizationResult(params, final, objective, encoding, tuple(rows), tuple(float(t) for t in tau),
                              time.perf_counter() - t0)


def _paper_candidates(stats: SufficientStatistics, epsilon: float, encoding: str, cmax: int, objective: Objective,
                      taus: np.ndarray | Sequence[float] | None, progress: bool, l1_rounding: str,
                      slice_columns: Sequence[str] | None, context: SearchContext | None
                      ) -> tuple[list[CandidateResult], Params]:
    """Alg. 5's loop for the paper's objective: the best parameters at every C, and the best of all."""
    ctx = _context(stats, taus, context)
    tau = ctx.taus
    d = stats.num_queries
    grids = ctx.grids
    q99 = np.array([stats.quantile(q, 0.99) for q in range(d)])
    q99 = np.where(q99 > 0, q99, [g.points[-1] for g in grids])
    use_samples = encoding == Encoding.L1 and (d > 1 or l1_rounding == "floor")
    rows: list[CandidateResult] = []
    best: tuple[float, Params | None] = (np.inf, None)
    params: Params | None
    prev_c = None
    for C in _progress(range(1, cmax + 1), progress, f"optimize {encoding}"):
        model = linf_model(ctx, C, objective, epsilon)
        starts = [q99, *model.c_steps(np.array([[1.0 / d] * d, [1.0] * d]))]
        if prev_c is not None:
            starts.append(prev_c)
        c, alpha, val = solve_linf(model, starts)
        prev_c = c
        if use_samples:
            prev_l1 = None if not rows or rows[-1].fractions is not None else np.array(rows[-1].thresholds)
            params = _optimize_l1_samples(stats, model, c / alpha, epsilon, objective, tau, l1_rounding, slice_columns,
                                          prev_l1)
            value = _objective_value(stats, params, tau, objective)
            fractions = None
        else:
            fractions = _finalize_fractions(model, c, alpha) if encoding == Encoding.LINF else None
            params = candidate_params(stats, encoding, epsilon, C, c, fractions, tau, slice_columns, l1_rounding)
            # a future period's loss varies with C: the choice of C weighs it (the inner search does not)
            value = (_objective_value(stats, params, tau, objective) if stats.future_period
                     else math.sqrt(max(val, 0.0) / (d + 1)))
        rows.append(CandidateResult(C, kept_per_impression(C, stats.spec.contribution_budget), value,
                                    tuple(float(x) for x in (params.queries[q].clip_threshold for q in range(d))),
                                    None if fractions is None else tuple(float(a) for a in fractions),
                                    model.count_term / max(val, 1e-300) if not use_samples else float("nan")))
        if value < best[0]:
            best = (value, params)
    assert best[1] is not None  # C = 1 always gives a finite value
    return rows, best[1]


def _corrected_candidates(stats: SufficientStatistics, epsilon: float, cmax: int, tau: np.ndarray,
                          period_variance: float | Sequence[float] | np.ndarray, slice_columns: Sequence[str] | None,
                          progress: bool) -> tuple[list[CandidateResult], Params]:
    """Alg. 5's loop for the corrected objective (``corrected.CorrectedModel``), with the same integer
    budget scales as the paper's."""
    model = CorrectedModel(stats, epsilon, tau, period_variance)
    gamma = stats.spec.contribution_budget
    d = stats.num_queries
    rows: list[CandidateResult] = []
    best: tuple[float, Params | None] = (np.inf, None)
    for C in _progress(range(1, cmax + 1), progress, "optimize corrected"):
        choice = model.at(C)
        fractions = (np.array([1.0]) if d == 1
                     else _integer_fractions(np.maximum(choice.variance_factors, 1e-300), C, gamma))
        params = candidate_params(stats, Encoding.LINF, epsilon, C, choice.thresholds, fractions, tau, slice_columns)
        rows.append(CandidateResult(C, kept_per_impression(C, gamma), choice.rmsre_tau,
                                    tuple(float(x) for x in choice.thresholds), tuple(float(a) for a in fractions),
                                    float("nan")))
        if choice.rmsre_tau < best[0]:
            best = (choice.rmsre_tau, params)
    assert best[1] is not None
    return rows, best[1]


def _context(stats: SufficientStatistics, taus: np.ndarray | Sequence[float] | None,
             context: SearchContext | None) -> SearchContext:
    if context is None:
        return prepare_search(stats, taus)
    if context.stats is not stats or (taus is not None
                                      and not np.array_equal(np.asarray(taus, dtype=np.float64), context.taus)):
        raise InvalidParameters("context was prepared for other statistics or taus")
    return context


def _objective_value(stats: SufficientStatistics, params: Params, taus: np.ndarray, objective: Objective) -> float:
    return rmsre_tau(statistics_breakdown(stats, params, objective), taus).combined


def _optimize_l1_samples(
    stats: SufficientStatistics, model: LinfModel, start: np.ndarray, epsilon: float, kind: Objective, taus: np.ndarray,
    l1_rounding: str, slice_columns: Sequence[str] | None, previous: np.ndarray | None = None, sweeps: int = 3,
) -> Params:
    """Coordinate search of the L1 thresholds on a log grid, objective evaluated on the samples."""
    C = model.count_limit
    d = stats.num_queries
    m = stats.num_slices
    K = kept_per_impression(C, stats.spec.contribution_budget)
    sl, vals, weight = sample_cells(stats, K)
    truth = stats.totals()
    pis = 1.0 / np.maximum(taus[None, :], truth) ** 2
    gamma = stats.spec.contribution_budget
    units = gamma // C
    vnoise = discrete_laplace_variance(noise_parameter(epsilon, gamma))
    count_term = model.count_term

    chunk = max(1, MAX_CELLS // max(1, len(sl)))  # threshold vectors per batch (memory bound)

    def values(cs: np.ndarray) -> np.ndarray:
        """The objective of every row of ``cs`` (k, d), one pass over the samples per batch of rows."""
        out = np.empty(len(cs))
        for b in range(0, len(cs), chunk):
            exps, rnds = l1_sample_terms_batch(sl, vals, weight, m, cs[b:b + chunk], C, l1_rounding, gamma)
            for i, (exp, rnd) in enumerate(zip(exps, rnds, strict=True)):
                c = cs[b + i]
                total = count_term
                for q in range(d):
                    bias = ((exp[:, q] - truth[:, q + 1]) ** 2 * pis[:, q + 1]).mean()
                    if kind == Objective.RELAXED:
                        var = pis[:, q + 1].mean() * 2.0 * C * C * c[q] ** 2 / epsilon**2
                    else:
                        var = (pis[:, q + 1] * (rnd[:, q] + vnoise)).mean() * (c[q] / units) ** 2
                    total += bias + var
                out[b + i] = total
        return out

    def value(c: np.ndarray) -> float:
        return float(values(c[None, :])[0])

    starts = [np.maximum(start, 1e-12), np.array([stats.quantile(q, 0.99) for q in range(d)]) * d]
    if previous is not None:
        starts.append(previous)
    best_c: np.ndarray | None = None
    best_v = np.inf
    for c in starts:
        c = np.where(c > 0, c, 1.0).astype(np.float64)
        cur = value(c)
        for _ in range(sweeps):
            improved = False
            for q in range(d):
                for span in (3.0, 0.4, 0.05, 0.007):
                    cands = c[q] * np.exp2(np.linspace(-span, span, 13))
                    batch = np.repeat(c[None, :], len(cands), axis=0)
                    batch[:, q] = cands
                    trial = values(batch)
                    i = int(np.argmin(trial))
                    if trial[i] < cur * (1 - 1e-12):
                        c[q], cur, improved = cands[i], float(trial[i]), True
            if not improved:
                break
        if cur < best_v:
            best_c, best_v = c.copy(), cur
    assert best_c is not None
    return candidate_params(stats, "l1", epsilon, C, best_c, None, taus, slice_columns, l1_rounding)


def scipy_paper_optimize(
    stats: SufficientStatistics, epsilon: float, max_count_limit: int = 20, objective: Objective = OBJECTIVE.error_model,
    taus: np.ndarray | Sequence[float] | None = None, progress: bool = False, slice_columns: Sequence[str] | None = None,
    context: SearchContext | None = None,
) -> OptimizationResult:
    """The paper's reference (Sec. 4.3): per C, scipy.optimize.minimize over (C_l, alpha_l) started at
    the 99 % quantile thresholds and the equal split, on the same (L-inf) objective model."""
    t0 = time.perf_counter()
    epsilon = check_epsilon(epsilon)
    kind = check_error_model(objective)
    cmax = check_max_count_limit(stats, max_count_limit)
    ctx = _context(stats, taus, context)
    tau = ctx.taus
    d = stats.num_queries
    grids = ctx.grids
    lo = np.array([g.points[0] for g in grids])
    hi = np.array([g.points[-1] for g in grids])
    x0c = np.clip([stats.quantile(q, 0.99) for q in range(d)], lo, hi)
    rows: list[CandidateResult] = []
    best: tuple[float, Params | None] = (np.inf, None)
    params: Params | None
    for C in _progress(range(1, cmax + 1), progress, "scipy reference"):
        model = linf_model(ctx, C, kind, epsilon)
        if d == 1:
            def linf_value(x: npt.NDArray[np.float64], model: LinfModel = model) -> float:
                return model.value(x, np.ones(1))

            res = sp_optimize.minimize(linf_value, x0c, method="L-BFGS-B", bounds=list(zip(lo, hi, strict=True)))
            c, alpha = np.clip(res.x, lo, hi), np.ones(1)
        else:
            amin = 2.0 * C / stats.spec.contribution_budget

            def linf_value(x: npt.NDArray[np.float64], model: LinfModel = model) -> float:
                return model.value(x[:d], x[d:])

            def fractions_sum_to_one(x: npt.NDArray[np.float64]) -> np.float64:
                return np.sum(x[d:]) - 1.0

            res = sp_optimize.minimize(
                linf_value, np.concatenate([x0c, np.full(d, 1.0 / d)]), method="SLSQP",
                bounds=list(zip(lo, hi, strict=True)) + [(amin, 1.0)] * d,
                constraints=[{"type": "eq", "fun": fractions_sum_to_one}])
            c, alpha = np.clip(res.x[:d], lo, hi), np.maximum(res.x[d:], amin)
            alpha = alpha / alpha.sum()
        val = model.value(c, alpha)
        fractions = _finalize_fractions(model, c, alpha)
        params = candidate_params(stats, "linf", epsilon, C, c, fractions, tau, slice_columns)
        value = math.sqrt(max(val, 0.0) / (d + 1))
        rows.append(CandidateResult(C, kept_per_impression(C, stats.spec.contribution_budget), value,
                                    tuple(float(x) for x in c), tuple(float(a) for a in fractions),
                                    model.count_term / max(val, 1e-300)))
        if value < best[0]:
            best = (value, params)
    params = best[1]
    assert params is not None
    final = _objective_value(stats, params, tau, kind)
    return OptimizationResult(params, final, kind, "linf", tuple(rows), tuple(float(t) for t in tau),
                              time.perf_counter() - t0)
