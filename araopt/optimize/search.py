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
    segments is found in closed form (roots of the derivative on every segment, vectorized).
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

import dataclasses
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

from araopt.constants import CONTRIBUTION_BUDGET, ENCODING, L1_ROUNDING, L1_ROUNDING_OF_A_FILE, MAX_COUNT_LIMIT
from araopt.errors import InvalidParameters, Unsupported, check_epsilon
from araopt.mechanism.bounding import kept_per_impression
from araopt.mechanism.noise import discrete_laplace_variance, noise_parameter
from araopt.mechanism.params import Encoding, Params, QueryParams
from araopt.optimize.corrected import CorrectedModel, corrected_objective
from araopt.optimize.error_model import rmsre_tau
from araopt.optimize.mechanisms import split_fractions
from araopt.optimize.objective import (
    check_max_count_limit,
    check_objective,
    check_taus,
    l1_sample_terms_batch,
    sample_cells,
    statistics_breakdown,
)
from araopt.optimize.statistics import SufficientStatistics

ENCODINGS = (Encoding.LINF.value, Encoding.L1.value)
"""The encodings the optimizer chooses parameters for (the baseline is Sec. 5.1's fixed rule)."""
CORRECTED = "corrected"
"""The objective of the estimates of the TRUE totals (``optimize.corrected``); L-inf only."""
OBJECTIVES = ("exact", "relaxed", CORRECTED)
PAPER_OBJECTIVE = "exact"
"""What the search minimises unless told: the paper's estimator under the exact error model (Thm. 4.2)."""
_MAX_CELLS = 4_000_000  # slices x grid points per dense block (memory bound of the search)


# ================================================================================================
# L-inf search structures
# ================================================================================================

@dataclass(frozen=True)
class _Grid:
    """Candidate thresholds of one query: all edges of occupied buckets (upper edges capped at max)."""

    points: np.ndarray
    entry_mask: np.ndarray   # entries of this query with bucket >= 1
    entry_index: np.ndarray  # grid index of each such entry's lower edge


def _grid(stats: SufficientStatistics, q: int) -> _Grid:
    layout = stats.spec.layout
    lower, upper = layout.lower_edges(), layout.upper_edges()
    mask = (stats.hist_query == q) & (stats.hist_bucket >= 1)
    occ = np.unique(stats.hist_bucket[mask])
    vmax = float(stats.value_max[q])
    if occ.size == 0:  # all values below the layout's minimum (or zero)
        pts = np.array([layout.min_value, max(2 * layout.min_value, vmax)])
        return _Grid(pts, mask, np.zeros(0, dtype=np.int64))
    lo = lower[occ]
    hi = np.maximum(np.minimum(upper[occ], vmax), lo)
    bottom = max(layout.min_value, lo[0] / 1024.0)
    pts = np.unique(np.concatenate([[bottom], lo, hi]))
    if pts.size < 2:
        pts = np.array([pts[0], pts[0] * 2.0])
    idx = np.searchsorted(pts, lower[stats.hist_bucket[mask]])
    return _Grid(pts, mask, idx)


@dataclass(frozen=True)
class _QueryModel:
    """One value query at one C: bias and rounding-count on grid segments (per-slice sums collapsed)."""

    g: np.ndarray        # (G,) grid points
    bias: np.ndarray     # (G,) mean_j pi_j (B_j + A_j(g))^2
    q1: np.ndarray       # (G-1,) segment linear coefficient of the bias (in t = c - g_i)
    q2: np.ndarray       # (G-1,) segment quadratic coefficient
    rho: np.ndarray      # (G,) mean_j pi_j N_j(values < g) over kept conversions
    p: float             # mean_j pi_j

    def locate(self, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        c = np.clip(np.asarray(c, dtype=np.float64), self.g[0], self.g[-1])
        i = np.clip(np.searchsorted(self.g, c, side="right") - 1, 0, len(self.g) - 2)
        return i, c - self.g[i]

    def _locate_scalar(self, c: float) -> tuple[int, float]:
        """``locate`` of one value without numpy's per-call overhead (the same comparisons and
        subtraction, so the same floats): the search evaluates single points thousands of times."""
        g = self.g
        c = min(max(float(c), float(g[0])), float(g[-1]))
        i = min(max(int(np.searchsorted(g, c, side="right")) - 1, 0), len(g) - 2)
        return i, c - float(g[i])

    def bias_at(self, c: np.ndarray) -> np.ndarray:
        if np.ndim(c) == 0:
            j, u = self._locate_scalar(float(c))
            return cast(np.ndarray, np.float64(self.bias[j] + self.q1[j] * u + self.q2[j] * u * u))
        i, t = self.locate(c)
        return cast(np.ndarray, self.bias[i] + self.q1[i] * t + self.q2[i] * t * t)

    def rho_at(self, c: np.ndarray) -> np.ndarray:
        if np.ndim(c) == 0:
            j, u = self._locate_scalar(float(c))
            return cast(np.ndarray, np.float64(self.rho[j] + (self.rho[j + 1] - self.rho[j]) * u
                                               / (self.g[j + 1] - self.g[j])))
        i, t = self.locate(c)
        h = self.g[i + 1] - self.g[i]
        return cast(np.ndarray, self.rho[i] + (self.rho[i + 1] - self.rho[i]) * t / h)


def _query_model(stats: SufficientStatistics, grid: _Grid, q: int, kept_ranks: int, pi: np.ndarray,
                 dropped: np.ndarray, kept_count: np.ndarray) -> _QueryModel:
    m = stats.num_slices
    g = grid.points
    G = len(g)
    sel = stats.hist_rank[grid.entry_mask] < kept_ranks
    sl = stats.hist_slice[grid.entry_mask][sel]
    gi = grid.entry_index[sel]
    cnt = stats.hist_count[grid.entry_mask][sel]
    sm = stats.hist_sum[grid.entry_mask][sel]
    bias = np.zeros(G)
    q1 = np.zeros(G - 1)
    q2 = np.zeros(G - 1)
    rho = np.zeros(G)
    h = np.diff(g)
    step = max(1, _MAX_CELLS // G)
    order = np.argsort(sl, kind="stable")
    sl, gi, cnt, sm = sl[order], gi[order], cnt[order], sm[order]
    bounds = np.searchsorted(sl, np.arange(0, m + step, step))
    for k, j0 in enumerate(range(0, m, step)):
        j1 = min(m, j0 + step)
        a, b = bounds[k], bounds[k + 1]
        mc = j1 - j0
        flat = (sl[a:b] - j0) * G + gi[a:b]
        ntail = np.bincount(flat, weights=cnt[a:b], minlength=mc * G).reshape(mc, G)
        stail = np.bincount(flat, weights=sm[a:b], minlength=mc * G).reshape(mc, G)
        ntail = np.cumsum(ntail[:, ::-1], axis=1)[:, ::-1]
        stail = np.cumsum(stail[:, ::-1], axis=1)[:, ::-1]
        y = dropped[j0:j1, None] + stail - g[None, :] * ntail  # B_j + A_j(g) >= 0
        w = pi[j0:j1, None]
        bias += (w * y * y).sum(axis=0)
        slope = np.diff(y, axis=1) / h[None, :]
        q1 += 2.0 * (w * y[:, :-1] * slope).sum(axis=0)
        q2 += (w * slope * slope).sum(axis=0)
        rho += (w * (kept_count[j0:j1, None] - ntail)).sum(axis=0)
    return _QueryModel(g, bias / m, q1 / m, q2 / m, rho / m, float(pi.mean()))


@dataclass(frozen=True)
class _LinfModel:
    """The L-inf objective at one C (sum over queries of mean_j pi MSE; divide by d+1 for R^2)."""

    count_limit: int
    kind: str
    epsilon: float
    queries: tuple[_QueryModel, ...]
    count_term: float
    contribution_budget: int = CONTRIBUTION_BUDGET
    _cache: dict[object, object] = dataclasses.field(default_factory=dict, repr=False, compare=False)
    """What the search re-reads at every step and does not depend on c or alpha: the noise variance and,
    per query, ``c_step``'s segment coefficients (computed once per model, the same floats)."""

    @property
    def d(self) -> int:
        return len(self.queries)

    def _noise_variance(self) -> float:
        v = self._cache.get("v")
        if v is None:
            v = self._cache["v"] = discrete_laplace_variance(noise_parameter(self.epsilon, self.contribution_budget))
        return cast(float, v)

    def w_coeffs(self, q: int) -> tuple[np.ndarray, np.ndarray]:
        """W(c) = w0 + w1 t on every segment, so that Var term = W(c) c^2 / alpha^2."""
        qm = self.queries[q]
        C, G = self.count_limit, self.contribution_budget
        if self.kind == "relaxed":
            w0 = np.full(len(qm.g) - 1, 2.0 * C * C * qm.p / self.epsilon**2)
            return w0, np.zeros_like(w0)
        v = self._noise_variance()
        f = (C / G) ** 2
        w0 = (v * qm.p + qm.rho[:-1] / 6.0) * f
        w1 = (np.diff(qm.rho) / 6.0 / np.diff(qm.g)) * f
        return w0, w1

    def var_factor(self, q: int, c: np.ndarray) -> np.ndarray:
        """K_q(c) = W(c) c^2."""
        qm = self.queries[q]
        C, G = self.count_limit, self.contribution_budget
        c = np.asarray(c, dtype=np.float64)
        w: float | np.ndarray
        if self.kind == "relaxed":
            w = 2.0 * C * C * qm.p / self.epsilon**2
        else:
            w = (self._noise_variance() * qm.p + qm.rho_at(c) / 6.0) * (C / G) ** 2
        return cast(np.ndarray, w * c * c)

    def value(self, c: np.ndarray, alpha: np.ndarray) -> float:
        total = self.count_term
        for q in range(self.d):
            total += float(self.queries[q].bias_at(c[q])) + float(self.var_factor(q, c[q])) / alpha[q] ** 2
        return total

    def c_step(self, q: int, alpha: float) -> tuple[float, float]:
        """Global minimiser over c of bias_q(c) + K_q(c)/alpha^2 (closed form on every segment)."""
        qm = self.queries[q]
        segments = self._cache.get(("segments", q))
        if segments is None:
            g, h = qm.g[:-1], np.diff(qm.g)
            w0, w1 = self.w_coeffs(q)
            segments = self._cache[("segments", q)] = (
                g, h, w0, w1, w1 * g * g + 2 * w0 * g, 2 * qm.q2, 4 * w1 * g + 2 * w0, 3 * w1, np.zeros_like(h))
        g, h, w0, w1, b0, q2x2, b1, b2, zeros = cast(tuple[np.ndarray, ...], segments)
        ia = 1.0 / alpha**2
        a0, a1, a2 = qm.q1 + b0 * ia, q2x2 + b1 * ia, b2 * ia
        cands = [zeros, h]
        with np.errstate(divide="ignore", invalid="ignore"):
            lin = np.where(a1 != 0, -a0 / a1, 0.0)
            disc = a1 * a1 - 4 * a2 * a0
            sq = np.sqrt(np.maximum(disc, 0.0))
            r1 = np.where(a2 > 1e-300, (-a1 + sq) / (2 * a2), lin)
            r2 = np.where(a2 > 1e-300, (-a1 - sq) / (2 * a2), lin)
        for r in (r1, r2):
            cands.append(np.clip(np.nan_to_num(r, nan=0.0, posinf=0.0, neginf=0.0), 0.0, h))
        t = np.stack(cands)  # (4, G-1)
        cc = g[None, :] + t
        val = (qm.bias[:-1][None, :] + qm.q1[None, :] * t + qm.q2[None, :] * t * t
               + (w0[None, :] + w1[None, :] * t) * cc * cc * ia)
        k = np.unravel_index(np.argmin(val), val.shape)
        return float(cc[k]), float(val[k])

    def alpha_step(self, c: np.ndarray) -> np.ndarray:
        return split_fractions(np.array([float(self.var_factor(q, c[q])) for q in range(self.d)]))

    def profile_value(self, c: np.ndarray) -> float:
        k = np.array([float(self.var_factor(q, c[q])) for q in range(self.d)])
        return (self.count_term + sum(float(self.queries[q].bias_at(c[q])) for q in range(self.d))
                + float(np.cbrt(k).sum() ** 3))


@dataclass(frozen=True)
class SearchContext:
    """Everything of the L-inf search that does not depend on epsilon or the objective kind: grids and,
    per kept-rank count K, the bias / rounding-count segment models (cached; reuse across epsilons)."""

    stats: SufficientStatistics
    taus: np.ndarray
    grids: tuple[_Grid, ...]
    truth: np.ndarray
    pis: np.ndarray
    _cache: dict[int, tuple[np.ndarray, tuple[_QueryModel, ...]]] = dataclasses.field(
        default_factory=dict, repr=False, compare=False)

    def query_models(self, kept_ranks: int) -> tuple[_QueryModel, ...]:
        if kept_ranks not in self._cache:
            kept = self.stats.kept_totals(kept_ranks)
            self._cache[kept_ranks] = (kept, tuple(
                _query_model(self.stats, self.grids[q], q, kept_ranks, self.pis[:, q + 1],
                             self.truth[:, q + 1] - kept[:, q + 1], kept[:, 0])
                for q in range(self.stats.num_queries)))
        return self._cache[kept_ranks][1]

    def kept(self, kept_ranks: int) -> np.ndarray:
        self.query_models(kept_ranks)
        return self._cache[kept_ranks][0]


def prepare_search(stats: SufficientStatistics, taus: np.ndarray | Sequence[float] | None = None) -> SearchContext:
    """Grids and cached per-C bias models for ``optimize`` / ``scipy_paper_optimize`` (pass as ``context``)."""
    tau = check_taus(stats, taus)
    truth = stats.totals()
    pis = 1.0 / np.maximum(tau[None, :], truth) ** 2
    return SearchContext(stats, tau, tuple(_grid(stats, q) for q in range(stats.num_queries)), truth, pis)


def _linf_model(ctx: SearchContext, C: int, kind: str, epsilon: float) -> _LinfModel:
    stats = ctx.stats
    gamma = stats.spec.contribution_budget
    K = kept_per_impression(C, gamma)
    queries = ctx.query_models(K)
    kept = ctx.kept(K)
    d = stats.num_queries
    if kind == "relaxed":
        var0 = 2.0 * (d + 1) * C * C / epsilon**2
    else:
        var0 = (d + 1) * discrete_laplace_variance(noise_parameter(epsilon, gamma)) / (gamma // C) ** 2
    count_term = float((ctx.pis[:, 0] * ((ctx.truth[:, 0] - kept[:, 0]) ** 2 + var0)).mean())
    return _LinfModel(C, kind, epsilon, queries, count_term, gamma)


def _alternate(model: _LinfModel, c: np.ndarray, alpha: np.ndarray,
               max_iter: int = 200) -> tuple[np.ndarray, np.ndarray, float]:
    best = model.value(c, alpha)
    for _ in range(max_iter):
        alpha = model.alpha_step(c)
        c = np.array([model.c_step(q, alpha[q])[0] for q in range(model.d)])
        val = model.value(c, alpha)
        if val >= best * (1 - 1e-12):
            best = min(best, val)
            break
        best = val
    return c, alpha, best


def _profile_polish(model: _LinfModel, c: np.ndarray, sweeps: int = 10) -> np.ndarray:
    """Coordinate search over all grid points of the profile objective (alpha eliminated)."""
    c = c.copy()
    cur = model.profile_value(c)
    for _ in range(sweeps):
        improved = False
        for q in range(model.d):
            qm = model.queries[q]
            others = sum(float(np.cbrt(model.var_factor(k, c[k]))) for k in range(model.d) if k != q)
            rest = model.count_term + sum(float(model.queries[k].bias_at(c[k])) for k in range(model.d) if k != q)
            vals = rest + qm.bias + (others + np.cbrt(model.var_factor(q, qm.g))) ** 3
            i = int(np.argmin(vals))
            if vals[i] < cur * (1 - 1e-12):
                c[q], cur, improved = qm.g[i], float(vals[i]), True
        if not improved:
            break
    return c


def _solve_linf(model: _LinfModel, starts: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, float]:
    d = model.d
    if d == 1:
        c1, val1 = model.c_step(0, 1.0)
        return np.array([c1]), np.array([1.0]), val1 + model.count_term
    best: tuple[np.ndarray | None, np.ndarray | None, float] = (None, None, np.inf)
    for c0 in starts:
        c, alpha, val = _alternate(model, np.asarray(c0, dtype=np.float64), np.full(d, 1.0 / d))
        c2 = _profile_polish(model, c)
        c2, alpha2, val2 = _alternate(model, c2, model.alpha_step(c2))
        if val2 < val:
            c, alpha, val = c2, alpha2, val2
        if val < best[2]:
            best = (c, alpha, val)
    # every start has a finite value in practice (None would fail the caller at once)
    return cast(tuple[np.ndarray, np.ndarray, float], best)


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


def _finalize_fractions(model: _LinfModel, c: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    if model.d == 1:
        return np.array([1.0])
    if model.kind == "exact":
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
    objective: str
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
    objective: str = PAPER_OBJECTIVE, taus: np.ndarray | Sequence[float] | None = None, progress: bool = True,
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
    if objective not in OBJECTIVES:
        raise InvalidParameters(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    if encoding not in ENCODINGS:
        raise InvalidParameters(f"encoding must be one of {ENCODINGS}, got {encoding!r}")
    if l1_rounding not in ("floor", "randomized"):
        raise InvalidParameters(f"l1_rounding must be 'floor' or 'randomized', got {l1_rounding!r}")
    if objective == CORRECTED and encoding != Encoding.LINF:
        raise Unsupported(f"the corrected objective is searched for encoding 'linf' only, got {encoding!r}")
    cmax = check_max_count_limit(stats, max_count_limit)
    if stats.num_conversions == 0:
        raise InvalidParameters("the statistics hold no conversions (empty history)")
    if objective == CORRECTED:
        tau = check_taus(stats, taus)
        rows, params = _corrected_candidates(stats, epsilon, cmax, tau, period_variance, slice_columns, progress)
        final = corrected_objective(stats, params, tau, "exact", period_variance)
    else:
        rows, params = _paper_candidates(stats, epsilon, encoding, cmax, objective, taus, progress, l1_rounding,
                                         slice_columns, context)
        tau = _context(stats, taus, context).taus
        final = _objective_value(stats, params, tau, objective)
    return OptimizationResult(params, final, objective, encoding, tuple(rows), tuple(float(t) for t in tau),
                              time.perf_counter() - t0)


def _paper_candidates(stats: SufficientStatistics, epsilon: float, encoding: str, cmax: int, objective: str,
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
        model = _linf_model(ctx, C, objective, epsilon)
        starts = [q99, np.array([model.c_step(q, 1.0 / d)[0] for q in range(d)]),
                  np.array([model.c_step(q, 1.0)[0] for q in range(d)])]
        if prev_c is not None:
            starts.append(prev_c)
        c, alpha, val = _solve_linf(model, starts)
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


def _objective_value(stats: SufficientStatistics, params: Params, taus: np.ndarray, objective: str) -> float:
    return rmsre_tau(statistics_breakdown(stats, params, objective), taus).combined


def _optimize_l1_samples(
    stats: SufficientStatistics, model: _LinfModel, start: np.ndarray, epsilon: float, kind: str, taus: np.ndarray,
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

    chunk = max(1, _MAX_CELLS // max(1, len(sl)))  # threshold vectors per batch (memory bound)

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
                    if kind == "relaxed":
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
    stats: SufficientStatistics, epsilon: float, max_count_limit: int = 20, objective: str = "exact",
    taus: np.ndarray | Sequence[float] | None = None, progress: bool = False, slice_columns: Sequence[str] | None = None,
    context: SearchContext | None = None,
) -> OptimizationResult:
    """The paper's reference (Sec. 4.3): per C, scipy.optimize.minimize over (C_l, alpha_l) started at
    the 99 % quantile thresholds and the equal split, on the same (L-inf) objective model."""
    t0 = time.perf_counter()
    epsilon = check_epsilon(epsilon)
    kind = check_objective(objective)
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
        model = _linf_model(ctx, C, kind, epsilon)
        if d == 1:
            def linf_value(x: npt.NDArray[np.float64], model: _LinfModel = model) -> float:
                return model.value(x, np.ones(1))

            res = sp_optimize.minimize(linf_value, x0c, method="L-BFGS-B", bounds=list(zip(lo, hi, strict=True)))
            c, alpha = np.clip(res.x, lo, hi), np.ones(1)
        else:
            amin = 2.0 * C / stats.spec.contribution_budget

            def linf_value(x: npt.NDArray[np.float64], model: _LinfModel = model) -> float:
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
