"""The paper's objective from sufficient statistics, for any parameters: the predicted RMSRE_tau
(Def. 3.2) of Alg. 4's estimates, the quantity ParameterOptimization (Alg. 5, ``optimize.search``)
minimises.

R^2 = 1/(d+1) sum_l mean_j pi_lj E(U_lj - V_lj)^2 (eq. obj-simplified), pi_lj = 1/max(tau_l, V_lj)^2,
bias from eq. (bias-simplified), variance either Relaxation 4.5 ("relaxed": 2 C^2 C_l^2/(alpha_l^2
eps^2), 2 (d+1) C^2/eps^2) or Thm. 4.2 ("exact": exact DLap variance, the rounding variance and the
floors floor(alpha_l Gamma/C), floor(Gamma/C)). It reuses ``error_model.rmsre_tau`` and the variance
formulas of ``report.estimate_variance`` / ``error_model.relaxed_variance``.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np

from araopt.constants import CONTRIBUTION_BUDGET, OBJECTIVE, Objective
from araopt.errors import InvalidParameters
from araopt.mechanism.bounding import kept_per_impression
from araopt.mechanism.encoding import count_scale, l1_scaled, query_scales, row_sums
from araopt.mechanism.params import Encoding, Params
from araopt.mechanism.report import estimate_variance
from araopt.optimize.error_model import ErrorBreakdown, check_error_model, relaxed_variance, rmsre_tau
from araopt.optimize.statistics import SufficientStatistics, count_kappa, frac_variance, value_kappa


def check_max_count_limit(stats: SufficientStatistics, max_count_limit: int) -> int:
    if isinstance(max_count_limit, bool) or not isinstance(max_count_limit, (int, np.integer)) or max_count_limit < 1:
        raise InvalidParameters(f"max count limit C_max must be an integer >= 1, got {max_count_limit!r}")
    if int(max_count_limit) > stats.spec.max_count_limit:
        raise InvalidParameters(f"C_max = {max_count_limit} exceeds the statistics' C_max = {stats.spec.max_count_limit}")
    return int(max_count_limit)


def check_taus(stats: SufficientStatistics, taus: np.ndarray | Sequence[float] | None) -> np.ndarray:
    t = stats.taus() if taus is None else np.asarray(taus, dtype=np.float64)
    if t.shape != (stats.num_queries + 1,) or not (t > 0).all():
        raise InvalidParameters(f"taus must be {stats.num_queries + 1} positive numbers (count first), got {t}")
    return t



def _hist_terms(
    stats: SufficientStatistics, kept_ranks: int, thresholds: np.ndarray, omega_scales: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Per slice and value query: sum over kept of min(v, c) (m, d), and sum f(1-f) of RR(omega) (m, d).

    omega = omega_scale x min(v, c) / c; A_lj(c) exact at bucket edges, linear inside a bucket.
    """
    m, d = stats.num_slices, stats.num_queries
    layout = stats.spec.layout
    lower_all, upper_all = layout.lower_edges(), layout.upper_edges()
    kept = stats.kept_totals(kept_ranks)
    clipped = np.empty((m, d))
    rounding = None if omega_scales is None else np.empty((m, d))
    sel_rank = stats.hist_rank < kept_ranks
    for q in range(d):
        e = sel_rank & (stats.hist_query == q)
        c = float(thresholds[q])
        b = stats.hist_bucket[e]
        lo = lower_all[b]
        hi = np.maximum(np.minimum(upper_all[b], stats.value_max[q]), lo)
        cnt, sm, sq = stats.hist_count[e], stats.hist_sum[e], stats.hist_sumsq[e]
        width = hi - lo
        inside = (lo < c) & (c < hi)
        frac_above = np.where(lo >= c, 1.0, 0.0)
        frac_above[inside] = (hi[inside] - c) / width[inside]
        excess = np.where(lo >= c, sm - c * cnt, 0.0)
        excess[inside] = (sm[inside] - lo[inside] * cnt[inside]) * frac_above[inside]
        sl = stats.hist_slice[e]
        clipped[:, q] = kept[:, q + 1] - np.bincount(sl, weights=excess, minlength=m)
        if rounding is not None and omega_scales is not None:  # (both or neither)
            mean = sm / cnt
            sd = np.sqrt(np.maximum(sq / cnt - mean**2, 0.0))
            g = frac_variance(omega_scales[q] * mean / c, omega_scales[q] * sd / c)
            rounding[:, q] = np.bincount(sl, weights=cnt * (1.0 - frac_above) * g, minlength=m)
    return clipped, rounding


def sample_cells(stats: SufficientStatistics, kept_ranks: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Samples of kept ranks: (slice, values, Horvitz-Thompson weight = cell count / sampled)."""
    if stats.spec.sample_size == 0:
        raise InvalidParameters("these statistics hold no samples (StatisticsSpec.sample_size = 0); the L1 objective "
                         "with d >= 2 or floor rounding needs them")
    sel = stats.sample_rank < kept_ranks
    sl, rk, vals = stats.sample_slice[sel], stats.sample_rank[sel], stats.sample_values[sel]
    cell = sl * stats.max_rank + rk
    uniq, inv, n_s = np.unique(cell, return_inverse=True, return_counts=True)
    inv = inv.reshape(-1)
    weight = stats.rank_counts[uniq // stats.max_rank, uniq % stats.max_rank][inv] / n_s[inv]
    return sl, vals, weight


def l1_sample_terms(
    sl: np.ndarray, vals: np.ndarray, weight: np.ndarray, m: int, thresholds: np.ndarray, count_limit: int,
    rounding_mode: str, contribution_budget: int = CONTRIBUTION_BUDGET,
) -> tuple[np.ndarray, np.ndarray]:
    """Alg. 6 on samples: per slice E[U_l] (m, d) and rounding variance in W units (m, d)."""
    expected, rounding = l1_sample_terms_batch(sl, vals, weight, m, np.asarray(thresholds, dtype=np.float64)[None, :],
                                               count_limit, rounding_mode, contribution_budget)
    return expected[0], rounding[0]


def l1_sample_terms_batch(
    sl: np.ndarray, vals: np.ndarray, weight: np.ndarray, m: int, thresholds: np.ndarray, count_limit: int,
    rounding_mode: str, contribution_budget: int = CONTRIBUTION_BUDGET,
) -> tuple[np.ndarray, np.ndarray]:
    """``l1_sample_terms`` for k threshold vectors at once (``thresholds`` (k, d)): (k, m, d) each, equal
    bit for bit to k separate calls (same operations per element; ``np.bincount`` adds in input order)."""
    k, d = thresholds.shape
    with np.errstate(over="ignore"):
        x = vals[None, :, :] / thresholds[:, None, :]
    norm = row_sums(x)
    for i in np.flatnonzero(~np.isfinite(norm).all(axis=1)):  # overflow: Alg. 6 keeps the direction
        x[i], norm[i] = l1_scaled(vals, thresholds[i])
    shrink = 1.0 / np.maximum(1.0, norm)
    budget = contribution_budget // count_limit
    index = (sl[None, :] + m * np.arange(k)[:, None]).reshape(-1)
    expected = np.empty((k, m, d))
    rounding = np.zeros((k, m, d))

    def per_slice(w: np.ndarray) -> np.ndarray:
        return np.bincount(index, weights=w.reshape(-1), minlength=k * m).reshape(k, m)

    for q in range(d):
        xq = x[:, :, q]
        if rounding_mode == "floor":
            w = np.floor(xq * shrink * (contribution_budget / count_limit))
            expected[:, :, q] = per_slice(weight[None, :] * w) * thresholds[:, q, None] / budget
        else:
            u = xq * shrink * budget
            f = u - np.floor(u)
            expected[:, :, q] = per_slice(weight[None, :] * xq * thresholds[:, q, None] * shrink)
            rounding[:, :, q] = per_slice(weight[None, :] * f * (1.0 - f))
    return expected, rounding


def baseline_kept_ranks(stats: SufficientStatistics, params: Params) -> int:
    """Approximate kept ranks of the baseline: Gamma // (mean expected norm), capped at R (<= 20).

    Baseline norms vary per record (no bottom key), so Alg. 1 may keep more than C conversions of an
    impression, but never more than Chrome's 20 reports per source (R <= 20). From the statistics we
    take the mean expected norm over all conversions; this is an approximation (``evaluation`` uses
    the exact error model on records for reported test errors).
    """
    scales = query_scales(params).astype(float)
    mean_norm = float(count_scale(params))
    edges_hi = stats.spec.layout.upper_edges()
    for q, qp in enumerate(params.queries):
        cnt, sm = stats.global_count[q], stats.global_sum[q]
        mean_v = np.where(cnt > 0, sm / np.maximum(cnt, 1), 0.0)
        clipped = np.where(edges_hi <= qp.clip_threshold, mean_v, np.minimum(mean_v, qp.clip_threshold))
        mean_norm += scales[q] * float((cnt * clipped).sum() / max(cnt.sum(), 1.0)) / qp.clip_threshold
    k = params.contribution_budget // max(1, int(round(mean_norm)))
    return int(min(max(k, params.count_limit), stats.max_rank))


def statistics_breakdown(stats: SufficientStatistics, params: Params, objective: Objective = OBJECTIVE.error_model,
                         period_loss: bool = True) -> ErrorBreakdown:
    """Truth, E[U] and Var(U) per slice (m, d+1), count first, from statistics (cf. ``error_model.expected_error``).

    For a future release period (``stats.future_period``, with ``period_loss``) the variance also holds
    the sampling variance of the period's loss T - X (``statistics.count_kappa`` / ``value_kappa`` with
    ratio 1): the truth and what Alg. 1 keeps of it are random in a period not yet seen."""
    objective = check_error_model(objective)
    if params.query_columns != stats.value_columns:
        raise InvalidParameters(f"params queries {params.query_columns} differ from the statistics' {stats.value_columns}")
    m, d = stats.num_slices, stats.num_queries
    thresholds = np.array([q.clip_threshold for q in params.queries], dtype=np.float64)
    if params.encoding == Encoding.BASELINE:
        kept_ranks = baseline_kept_ranks(stats, params)
    else:
        kept_ranks = kept_per_impression(params.count_limit, params.contribution_budget)
    if kept_ranks > stats.max_rank:
        raise InvalidParameters(f"count limit {params.count_limit} keeps {kept_ranks} ranks; the statistics cover "
                         f"{stats.max_rank} (C_max = {stats.spec.max_count_limit})")
    kept = stats.kept_totals(kept_ranks)
    expected = np.empty((m, d + 1))
    expected[:, 0] = kept[:, 0]
    want_round = objective == Objective.EXACT
    rounding: np.ndarray | None
    if params.encoding == Encoding.L1 and (d > 1 or params.l1_rounding == "floor"):
        sl, vals, weight = sample_cells(stats, kept_ranks)
        expected[:, 1:], rounding = l1_sample_terms(sl, vals, weight, m, thresholds, params.count_limit,
                                                     params.l1_rounding, params.contribution_budget)
    else:
        scales = query_scales(params).astype(np.float64)
        expected[:, 1:], rounding = _hist_terms(stats, kept_ranks, thresholds, scales if want_round else None)
    if want_round:
        variance = estimate_variance(params, kept[:, 0], rounding)
    else:
        variance = relaxed_variance(params, m)
    truth = stats.totals()
    if stats.future_period and period_loss:
        variance = variance + loss_sampling_variance(stats, kept_ranks, thresholds, truth)
    return ErrorBreakdown(truth=truth, expected=expected, variance=variance)


def loss_sampling_variance(stats: SufficientStatistics, kept_ranks: int, thresholds: np.ndarray,
                           truth: np.ndarray) -> np.ndarray:
    """Var(T - X) per slice (m, d+1) of a period drawn like the statistics: kappa_1 T^2 / N."""
    factors = [count_kappa(stats, kept_ranks, ratio=1.0)]
    factors += [float(value_kappa(stats, q, kept_ranks, thresholds[q:q + 1], ratio=1.0)[0])
                for q in range(stats.num_queries)]
    n = np.maximum(truth[:, :1], 1.0)
    return cast(np.ndarray, np.asarray(factors)[None, :] * truth**2 / n)


def predicted_rmsre_tau(stats: SufficientStatistics, params: Params, taus: np.ndarray | Sequence[float] | None = None,
                        objective: Objective = OBJECTIVE.error_model) -> float:
    """RMSRE_tau (Def. 3.2) of ``params`` predicted from the statistics (exact or relaxed objective)."""
    return rmsre_tau(statistics_breakdown(stats, params, objective), check_taus(stats, taus)).combined
