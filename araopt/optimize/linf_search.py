"""The L-inf search of ParameterOptimization (Alg. 5) at one count limit C, on sufficient statistics:
the objective of the paper's estimator (``optimize.objective``, exact or relaxed) as a model on the
grid of each query's bucket edges, and its minimisation over the thresholds and budget fractions
(``optimize.search`` runs it for every C; its module doc states the method).

* ``QueryModel``: one query's bias and rounding count on the grid segments (quadratic and linear in
  c on every segment); ``LinfModel``: the objective at one C, sum_l bias_l(c_l) + K_l(c_l) / alpha_l^2
  with K_l = W_l(C_l) C_l^2 the variance factor.
* ``LinfModel.c_step``: for a fixed alpha, the global minimiser over c of one query's term, in closed
  form on every segment (the roots of the derivative); ``c_steps`` the same for many (start, query)
  pairs in one pass (bit for bit: tested against ``c_step``).
* ``solve_linf``: alternating minimisation (Theorem 4.7: each block step globally optimal) from
  several starts, run in lockstep, then a profile coordinate search and a second alternation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from araopt.constants import CONTRIBUTION_BUDGET, Objective
from araopt.mechanism.bounding import kept_per_impression
from araopt.mechanism.noise import discrete_laplace_variance, noise_parameter
from araopt.optimize.mechanisms import split_fractions
from araopt.optimize.objective import check_taus
from araopt.optimize.statistics import SufficientStatistics

MAX_CELLS = 4_000_000  # slices x grid points per dense block (memory bound of the search)


@dataclass(frozen=True)
class Grid:
    """Candidate thresholds of one query: all edges of occupied buckets (upper edges capped at max)."""

    points: np.ndarray
    entry_mask: np.ndarray   # entries of this query with bucket >= 1
    entry_index: np.ndarray  # grid index of each such entry's lower edge


def query_grid(stats: SufficientStatistics, q: int) -> Grid:
    layout = stats.spec.layout
    lower, upper = layout.lower_edges(), layout.upper_edges()
    mask = (stats.hist_query == q) & (stats.hist_bucket >= 1)
    occ = np.unique(stats.hist_bucket[mask])
    vmax = float(stats.value_max[q])
    if occ.size == 0:  # all values below the layout's minimum (or zero)
        pts = np.array([layout.min_value, max(2 * layout.min_value, vmax)])
        return Grid(pts, mask, np.zeros(0, dtype=np.int64))
    lo = lower[occ]
    hi = np.maximum(np.minimum(upper[occ], vmax), lo)
    bottom = max(layout.min_value, lo[0] / 1024.0)
    pts = np.unique(np.concatenate([[bottom], lo, hi]))
    if pts.size < 2:
        pts = np.array([pts[0], pts[0] * 2.0])
    idx = np.searchsorted(pts, lower[stats.hist_bucket[mask]])
    return Grid(pts, mask, idx)


@dataclass(frozen=True)
class QueryModel:
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

    def terms(self, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(``bias_at(c)``, ``rho_at(c)``) of an array of points, located once (the same floats)."""
        g = self.g
        c = np.minimum(np.maximum(np.asarray(c, dtype=np.float64), g[0]), g[-1])  # ``np.clip`` without its overhead
        i = np.minimum(np.maximum(np.searchsorted(g, c, side="right") - 1, 0), len(g) - 2)
        t = c - g[i]
        rho = self.rho[i] + (self.rho[i + 1] - self.rho[i]) * t / (g[i + 1] - g[i])
        return self.bias[i] + self.q1[i] * t + self.q2[i] * t * t, rho

    def rho_at(self, c: np.ndarray) -> np.ndarray:
        if np.ndim(c) == 0:
            j, u = self._locate_scalar(float(c))
            return cast(np.ndarray, np.float64(self.rho[j] + (self.rho[j + 1] - self.rho[j]) * u
                                               / (self.g[j + 1] - self.g[j])))
        i, t = self.locate(c)
        h = self.g[i + 1] - self.g[i]
        return cast(np.ndarray, self.rho[i] + (self.rho[i + 1] - self.rho[i]) * t / h)


def query_model(stats: SufficientStatistics, grid: Grid, q: int, kept_ranks: int, pi: np.ndarray,
                 dropped: np.ndarray, kept_count: np.ndarray) -> QueryModel:
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
    step = max(1, MAX_CELLS // G)
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
    return QueryModel(g, bias / m, q1 / m, q2 / m, rho / m, float(pi.mean()))


_SIGNS = np.array([1.0, -1.0])[:, None, None]  # the two roots of c_step's quadratic


def _squares(x: np.ndarray) -> np.ndarray:
    """x * x element by element, as the one-point steps square a budget fraction: one IEEE product,
    the same float on every platform and numpy version (``pow(x, 2)`` is not: libm's differs from
    ``x * x`` in the last bit for ~0.1 % of values, numpy 2.4's vectorised ``np.power`` for ~5 %), so
    the batched search steps give exactly the floats of the one-point steps."""
    x = np.asarray(x, dtype=np.float64)
    return cast(np.ndarray, x * x)


@dataclass(frozen=True)
class Segments:
    """``c_step``'s per-segment coefficients of every query, concatenated (query q: ``offsets[q]`` on)."""

    lengths: np.ndarray   # (d,): the number of segments of each query
    offsets: np.ndarray   # (d,): where each query's segments start
    position: np.ndarray  # (L,): 0, 1, ..., L - 1
    g: np.ndarray
    h: np.ndarray
    w0: np.ndarray
    w1: np.ndarray
    b0: np.ndarray
    q2x2: np.ndarray
    b1: np.ndarray
    b2: np.ndarray
    q1: np.ndarray
    q2: np.ndarray
    bias: np.ndarray
    bias_ends: np.ndarray  # (2, L): the bias at the segment's start and end (c_step's t = 0 and t = h)
    p_ends: np.ndarray     # (2, L): the variance term's alpha-free factor there, W(c) c^2
    end_points: np.ndarray  # (2, L): c_step's c at t = 0 and t = h, g + 0.0 and g + h


@dataclass(frozen=True)
class LinfModel:
    """The L-inf objective at one C (sum over queries of mean_j pi MSE; divide by d+1 for R^2)."""

    count_limit: int
    kind: Objective
    epsilon: float
    queries: tuple[QueryModel, ...]
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
        if self.kind == Objective.RELAXED:
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
        if self.kind == Objective.RELAXED:
            w = 2.0 * C * C * qm.p / self.epsilon**2
        else:
            w = (self._noise_variance() * qm.p + qm.rho_at(c) / 6.0) * (C / G) ** 2
        return cast(np.ndarray, w * c * c)

    def value(self, c: np.ndarray, alpha: np.ndarray) -> float:
        total = self.count_term
        for q in range(self.d):
            total += float(self.queries[q].bias_at(c[q])) + float(self.var_factor(q, c[q])) / (alpha[q] * alpha[q])
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
        ia = 1.0 / (alpha * alpha)  # as ``_squares``
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

    def _segments(self) -> Segments:
        """Every query's ``c_step`` coefficients side by side (one row of segments per model, cached),
        with the parts of the segment ends' values that do not depend on alpha."""
        flat = self._cache.get("flat")
        if flat is None:
            parts = []
            for q, qm in enumerate(self.queries):
                g, h = qm.g[:-1], np.diff(qm.g)
                w0, w1 = self.w_coeffs(q)
                bias, q1, q2 = qm.bias[:-1], qm.q1, qm.q2
                end = g + h
                parts.append((g, h, w0, w1, w1 * g * g + 2 * w0 * g, 2 * q2, 4 * w1 * g + 2 * w0, 3 * w1, q1, q2, bias,
                              w0 * g * g, bias + q1 * h + q2 * h * h, (w0 + w1 * h) * end * end))
            columns = [np.concatenate(column) for column in zip(*parts, strict=True)]
            g, h, w0, w1, b0, q2x2, b1, b2, q1, q2, bias, p0, bias_end, p_end = columns
            lengths = np.array([len(part[0]) for part in parts])
            flat = self._cache["flat"] = Segments(
                lengths, np.concatenate([[0], np.cumsum(lengths)[:-1]]),
                np.arange(len(g)), g, h, w0, w1, b0, q2x2, b1, b2, q1, q2, bias, np.stack([bias, bias_end]),
                np.stack([p0, p_end]), np.stack([g + 0.0, g + h]))
        return cast(Segments, flat)

    def c_steps(self, alpha: np.ndarray) -> np.ndarray:
        """``c_step(q, alpha[i, q])[0]`` for every row i of ``alpha`` (k, d) and every query q in one pass
        over all the segments (the alternations from several starts run in lockstep): exactly the
        floats of ``c_step``. Of its four candidates per segment, the segment's ends take their values
        with the alpha-free parts computed once (the same floats), and the two roots count only
        strictly inside the segment (a root clipped to an end has the value of that end, which comes
        first in ``c_step``'s (candidate, segment) order and so wins any tie). The least value per
        (row, query), ties to the first in that order: the same choice as ``c_step``'s argmin."""
        seg = self._segments()
        rows = np.arange(len(alpha))[:, None]
        ia = np.repeat(1.0 / _squares(alpha), seg.lengths, axis=1)  # (k, L)
        a0, a1, a2 = seg.q1 + seg.b0 * ia, seg.q2x2 + seg.b1 * ia, seg.b2 * ia
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            lin = np.where(a1 != 0, -a0 / a1, 0.0)
            disc = a1 * a1 - 4 * a2 * a0
            sq = np.sqrt(np.maximum(disc, 0.0))
            roots = np.where(a2 > 1e-300, (-a1 + _SIGNS * sq) / (2 * a2), lin)  # (2, k, L): -a1 + (-sq) is -a1 - sq
            inside = (roots > 0) & (roots < seg.h)  # NaN and infinite roots are not (``c_step`` clips them to 0)
            t = np.where(inside, roots, 0.0)
            cc = seg.g + t
            val = np.concatenate([seg.bias_ends[:, None, :] + seg.p_ends[:, None, :] * ia,
                                  np.where(inside, seg.bias + seg.q1 * t + seg.q2 * t * t
                                           + (seg.w0 + seg.w1 * t) * cc * cc * ia, np.inf)])  # (4, k, L)
        least = np.minimum.reduceat(val, seg.offsets, axis=2)  # (4, k, d)
        if np.isnan(least).any():  # c_step's argmin takes the first NaN: one point at a time
            return np.array([[self.c_step(q, float(a[q]))[0] for q in range(self.d)] for a in alpha])
        which = np.argmin(least, axis=0)  # (k, d): the first candidate with the least value
        position = np.where(val == np.repeat(least, seg.lengths, axis=2), seg.position, len(seg.position))
        first = np.minimum.reduceat(position, seg.offsets, axis=2)[which, rows, np.arange(self.d)]  # its first segment
        root = np.maximum(which - 2, 0)
        return cast(np.ndarray, np.where(which >= 2, seg.g[first] + t[root, rows, first],
                                         seg.end_points[np.minimum(which, 1), first]))

    def terms(self, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(``bias_at``, ``var_factor``) of every query at every row of ``c`` (k, d): the same floats."""
        bias, factor = np.empty(c.shape), np.empty(c.shape)
        for q, qm in enumerate(self.queries):
            cq = c[:, q]
            bias[:, q], rho = qm.terms(cq)
            w: float | np.ndarray
            if self.kind == Objective.RELAXED:
                w = 2.0 * self.count_limit * self.count_limit * qm.p / self.epsilon**2
            else:
                w = (self._noise_variance() * qm.p + rho / 6.0) * (self.count_limit / self.contribution_budget) ** 2
            factor[:, q] = w * cq * cq
        return bias, factor

    def total(self, bias: np.ndarray, factor: np.ndarray, alpha: np.ndarray) -> np.ndarray:
        """``value`` per row from ``terms``: the same floats (the same sums in the same order)."""
        out = np.full(len(bias), self.count_term)
        for q in range(self.d):
            out = out + (bias[:, q] + factor[:, q] / _squares(alpha[:, q]))
        return out

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
    grids: tuple[Grid, ...]
    truth: np.ndarray
    pis: np.ndarray
    _cache: dict[int, tuple[np.ndarray, tuple[QueryModel, ...]]] = dataclasses.field(
        default_factory=dict, repr=False, compare=False)

    def query_models(self, kept_ranks: int) -> tuple[QueryModel, ...]:
        if kept_ranks not in self._cache:
            kept = self.stats.kept_totals(kept_ranks)
            self._cache[kept_ranks] = (kept, tuple(
                query_model(self.stats, self.grids[q], q, kept_ranks, self.pis[:, q + 1],
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
    return SearchContext(stats, tau, tuple(query_grid(stats, q) for q in range(stats.num_queries)), truth, pis)


def linf_model(ctx: SearchContext, C: int, kind: Objective, epsilon: float) -> LinfModel:
    stats = ctx.stats
    gamma = stats.spec.contribution_budget
    K = kept_per_impression(C, gamma)
    queries = ctx.query_models(K)
    kept = ctx.kept(K)
    d = stats.num_queries
    if kind == Objective.RELAXED:
        var0 = 2.0 * (d + 1) * C * C / epsilon**2
    else:
        var0 = (d + 1) * discrete_laplace_variance(noise_parameter(epsilon, gamma)) / (gamma // C) ** 2
    count_term = float((ctx.pis[:, 0] * ((ctx.truth[:, 0] - kept[:, 0]) ** 2 + var0)).mean())
    return LinfModel(C, kind, epsilon, queries, count_term, gamma)


def split_rows(factor: np.ndarray) -> np.ndarray:
    """``split_fractions`` of every row of ``factor`` (k, d): alpha_step of each start."""
    r = np.cbrt(np.maximum(factor, 1e-300))
    return cast(np.ndarray, r / r.sum(axis=1, keepdims=True))


def alternate(model: LinfModel, c: np.ndarray, alpha: np.ndarray,
               max_iter: int = 200) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The alternating minimisation (Theorem 4.7: alpha step, then every query's exact c step) from
    every row of ``c`` and ``alpha`` (k, d) at once, each row stopping when its value no longer
    decreases (relative 1e-12): (c, alpha, value) per row, each exactly what that start alone gives."""
    c, alpha = np.array(c, dtype=np.float64), np.array(alpha, dtype=np.float64)
    bias, factor = model.terms(c)
    best = model.total(bias, factor, alpha)
    active = np.arange(len(c))
    for _ in range(max_iter):
        if not active.size:
            break
        new_alpha = split_rows(factor[active])
        new_c = model.c_steps(new_alpha)
        bias, new_factor = model.terms(new_c)
        val = model.total(bias, new_factor, new_alpha)
        alpha[active], c[active], factor[active] = new_alpha, new_c, new_factor
        stop = val >= best[active] * (1 - 1e-12)
        best[active] = np.where(stop, np.minimum(best[active], val), val)
        active = active[~stop]
    return c, alpha, best


def profile_polish(model: LinfModel, c: np.ndarray, sweeps: int = 10) -> np.ndarray:
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


def solve_linf(model: LinfModel, starts: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, float]:
    """The best of the alternations from every start (each followed by a profile polish and a second
    alternation): the first start with the lowest value wins."""
    d = model.d
    if d == 1:
        c1, val1 = model.c_step(0, 1.0)
        return np.array([c1]), np.array([1.0]), val1 + model.count_term
    c, alpha, val = alternate(model, np.array(starts, dtype=np.float64), np.full((len(starts), d), 1.0 / d))
    polished = np.array([profile_polish(model, row) for row in c])
    c2, alpha2, val2 = alternate(model, polished, split_rows(model.terms(polished)[1]))
    best: tuple[np.ndarray | None, np.ndarray | None, float] = (None, None, np.inf)
    for s in range(len(starts)):
        if val2[s] < val[s]:
            c[s], alpha[s], val[s] = c2[s], alpha2[s], val2[s]
        if val[s] < best[2]:
            best = (c[s], alpha[s], float(val[s]))
    # every start has a finite value in practice (None would fail the caller at once)
    return cast(tuple[np.ndarray, np.ndarray, float], best)
