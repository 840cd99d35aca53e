"""The error model of the corrected estimator T_hat = U / r_hat from the optimizer's
``SufficientStatistics`` for any (C, C_l, alpha_l): the objective ``corrected`` of ParameterOptimization
(Alg. 5).

L-inf (Alg. 3); L1 (Alg. 6) with d = 1 and randomized rounding is the same. MSE_lj ~= Var(U_lj) /
r_lj^2 + T_lj^2 (Var(rho_j | history) + V_period + kappa_l / N_j) / r_lj^2: the first term is the
inflated noise + rounding variance; the second the ratio error, reported as a residual bias (root mean
square, sign unknown) for the history part and a variance for the sampling part. kappa_l is computed
from the statistics' impression-size histogram and value moments assuming values i.i.d. within an
impression and independent of rank; Var(rho_j | history) by the calibration's empirical-Bayes
formulas on the slices (``calibration.fit.shrink``).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from araopt.calibration.fit import shrink
from araopt.constants import OBJECTIVE, Objective
from araopt.errors import Unsupported
from araopt.mechanism.bounding import kept_per_impression
from araopt.mechanism.noise import discrete_laplace_variance, noise_parameter
from araopt.mechanism.params import Encoding, Params
from araopt.optimize.error_model import ErrorBreakdown, rmsre_tau
from araopt.optimize.objective import statistics_breakdown
from araopt.optimize.statistics import SufficientStatistics, count_kappa, value_kappa


def _supported_for_objective(params: Params) -> None:
    if params.encoding == Encoding.LINF or (params.encoding == Encoding.L1 and params.num_queries == 1
                                     and params.l1_rounding == "randomized"):
        return
    raise Unsupported("the corrected objective supports encoding 'linf' (Alg. 3) and 'l1' (Alg. 6) with one query and "
                     f"randomized rounding; got encoding {params.encoding!r} with {params.num_queries} queries")




@dataclass(frozen=True)
class CorrectedBreakdown:
    """Error model of T_hat = U / r_hat per slice (m, d+1): truth, ratio, residual bias (rms), variance."""

    truth: np.ndarray
    ratio: np.ndarray
    residual_bias: np.ndarray
    variance: np.ndarray
    capped: ErrorBreakdown

    @property
    def mse(self) -> np.ndarray:
        return cast(np.ndarray, self.residual_bias**2 + self.variance)

    def as_error_breakdown(self) -> ErrorBreakdown:
        """For ``error_model.rmsre_tau``: expected = truth + residual bias (its rms), variance."""
        return ErrorBreakdown(truth=self.truth, expected=self.truth + self.residual_bias, variance=self.variance)


def _ratio_terms(T: np.ndarray, X: np.ndarray, N: np.ndarray, kappa: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Shrunk ratio and Var(rho | history) per slice for columns (m, G) (kappa: (G,))."""
    valid = T > 0
    r = np.where(valid, X / np.where(valid, T, 1.0), 0.0)
    s2 = kappa[None, :] / np.maximum(N, 1.0)[:, None] * np.ones_like(T)
    sh = shrink(r, s2, valid)
    return sh.ratio, sh.variance


def corrected_breakdown(stats: SufficientStatistics, params: Params, objective: Objective = OBJECTIVE.error_model,
                        period_variance: float | Sequence[float] | np.ndarray = 0.0) -> CorrectedBreakdown:
    """Predicted error of the corrected estimator for ``params`` from the optimizer's statistics.

    ``period_variance`` (scalar or d+1): V_period of the measured period (e.g. from a calibration).
    ``stats`` may be scaled to a release period (``SufficientStatistics.scaled``): truths, bias and
    the period's sampling term kappa / N follow the period's volume, the ratio's own uncertainty
    Var(rho | history) the history's (``stats.volume_scale`` says how they differ).
    """
    _supported_for_objective(params)
    capped = statistics_breakdown(stats, params, objective, period_loss=False)  # the ratio terms below model the loss
    d = params.num_queries
    K = kept_per_impression(params.count_limit, params.contribution_budget)
    pv = np.broadcast_to(np.asarray(period_variance, dtype=np.float64), (d + 1,))
    T, X = capped.truth, capped.expected
    N = T[:, 0]
    kappa = np.array([count_kappa(stats, K)]
                     + [float(value_kappa(stats, q, K, np.array([params.queries[q].clip_threshold]))[0])
                        for q in range(d)])
    ratio, post = _ratio_terms(T, X, N / stats.volume_scale, kappa)  # the ratio is learnt on the whole history
    resid = T * np.sqrt(post + pv[None, :]) / ratio
    var = capped.variance / ratio**2 + T**2 * (kappa[None, :] / np.maximum(N, 1.0)[:, None]) / ratio**2
    return CorrectedBreakdown(truth=T, ratio=ratio, residual_bias=resid, variance=var, capped=capped)


def corrected_objective(stats: SufficientStatistics, params: Params, taus: np.ndarray | Sequence[float] | None = None,
                        objective: Objective = OBJECTIVE.error_model,
                        period_variance: float | Sequence[float] | np.ndarray = 0.0) -> float:
    """Predicted RMSRE_tau (Def. 3.2) of the corrected estimator (the objective "corrected"); ``objective``:
    the paper's error model of the capped estimate it corrects ("exact" or "relaxed")."""
    t = stats.taus() if taus is None else np.asarray(taus, dtype=np.float64)
    return rmsre_tau(corrected_breakdown(stats, params, objective, period_variance).as_error_breakdown(), t).combined


def _clip_grid(stats: SufficientStatistics, q: int, size: int) -> np.ndarray:
    p = np.unique(np.concatenate([np.linspace(0.05, 0.95, size // 4),
                                  1.0 - np.logspace(-5, np.log10(0.05), size - size // 4)]))
    pts = np.array([stats.quantile(q, float(x)) for x in p] + [float(stats.value_max[q])])
    pts = np.unique(pts[pts > 0])
    return pts if pts.size else np.array([1.0])


@dataclass(frozen=True)
class CorrectedChoice:
    """The corrected objective's best thresholds at one count limit, their variance factors (for the
    budget fractions) and the model's RMSRE_tau."""

    thresholds: np.ndarray
    variance_factors: np.ndarray
    rmsre_tau: float


class CorrectedModel:
    """The corrected objective at every C, for ParameterOptimization (Alg. 5, ``optimize.search``),
    L-inf encoding (Alg. 3). Per query a grid of clip thresholds (training quantiles); for fixed
    thresholds the variance part sum_l A_l / alpha_l^2 is minimised by alpha_l ~ A_l^(1/3) (Lagrange),
    so the search is over thresholds only (exhaustive for d = 1, coordinate sweeps for d >= 2).
    Rounding variance 1/6 per unclipped kept conversion."""

    def __init__(self, stats: SufficientStatistics, epsilon: float, taus: np.ndarray,
                 period_variance: float | Sequence[float] | np.ndarray = 0.0, grid_size: int = 192) -> None:
        d = stats.num_queries
        self.stats = stats
        self.gamma = stats.spec.contribution_budget
        self.pv = np.broadcast_to(np.asarray(period_variance, dtype=np.float64), (d + 1,))
        self.vnoise = discrete_laplace_variance(noise_parameter(epsilon, self.gamma))
        self.T = stats.totals()
        self.pi = 1.0 / np.maximum(np.asarray(taus, dtype=np.float64)[None, :], self.T) ** 2
        self.N = self.T[:, 0]  # conversions per slice in the release period
        self.N_history = self.N / stats.volume_scale  # ... and in the history the ratios are learnt on
        self.grids = [_clip_grid(stats, q, grid_size) for q in range(d)]

    def at(self, C: int, sweeps: int = 4) -> CorrectedChoice:
        stats, T, N, pi, pv, gamma = self.stats, self.T, self.N, self.pi, self.pv, self.gamma
        d = stats.num_queries
        K = kept_per_impression(C, gamma)
        kept = stats.kept_totals(K)
        k0 = np.array([count_kappa(stats, K)])
        r0, post0 = _ratio_terms(T[:, :1], kept[:, :1], self.N_history, k0)
        var0 = (d + 1) * self.vnoise / (gamma // C) ** 2
        count_term = float((pi[:, 0] * (var0 + T[:, 0] ** 2 * (post0[:, 0] + pv[0] + k0[0] / np.maximum(N, 1.0)))
                            / r0[:, 0] ** 2).mean())
        A, Bq = [], []
        for q in range(d):
            c = self.grids[q]
            X, unclipped = _clipped_sums(stats, q, K, c, kept[:, q + 1], kept[:, 0])
            kq = value_kappa(stats, q, K, c)
            Tq = np.repeat(T[:, q + 1:q + 2], len(c), axis=1)
            rq, postq = _ratio_terms(Tq, X, self.N_history, kq)
            A.append((pi[:, q + 1:q + 2] * (self.vnoise + unclipped / 6.0) * (c[None, :] * C / gamma) ** 2
                      / rq**2).mean(axis=0))
            Bq.append((pi[:, q + 1:q + 2] * Tq**2 * (postq + pv[q + 1] + kq[None, :] / np.maximum(N, 1.0)[:, None])
                       / rq**2).mean(axis=0))
        idx = np.array([int(np.argmin(A[q] + Bq[q])) for q in range(d)])
        for _ in range(sweeps if d > 1 else 0):
            changed = False
            for q in range(d):
                others = sum(np.cbrt(A[o][idx[o]]) for o in range(d) if o != q)
                tot = np.array([sum(Bq[o][idx[o]] for o in range(d) if o != q)]) + Bq[q] + (others + np.cbrt(A[q])) ** 3
                new = int(np.argmin(tot))
                changed |= new != idx[q]
                idx[q] = new
            if not changed:
                break
        a_sel = np.array([A[q][idx[q]] for q in range(d)])
        value_terms = float(sum(Bq[q][idx[q]] for q in range(d)) + np.cbrt(a_sel).sum() ** 3)
        model = math.sqrt(max(count_term + value_terms, 0.0) / (d + 1))
        return CorrectedChoice(np.array([self.grids[q][idx[q]] for q in range(d)]), a_sel, model)


def _clipped_sums(stats: SufficientStatistics, q: int, kept_ranks: int, c: np.ndarray, kept_sum: np.ndarray,
                  kept_count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per slice and clip c (m, G): sum over kept conversions of min(v, c), and the kept count below c.

    A bucket counts as above c when its mean is >= c (buckets are 1.1 % wide by default).
    """
    m, G = stats.num_slices, len(c)
    e = (stats.hist_query == q) & (stats.hist_rank < kept_ranks)
    sl, cnt, sm = stats.hist_slice[e], stats.hist_count[e], stats.hist_sum[e]
    mean_b = sm / np.maximum(cnt, 1e-300)
    gidx = np.searchsorted(c, mean_b, side="right")  # entry is above c_g for g < gidx
    flat = sl * (G + 1) + gidx
    cnt_at = np.bincount(flat, weights=cnt, minlength=m * (G + 1)).reshape(m, G + 1)
    sm_at = np.bincount(flat, weights=sm, minlength=m * (G + 1)).reshape(m, G + 1)
    cnt_above = np.cumsum(cnt_at[:, ::-1], axis=1)[:, ::-1][:, 1:]
    sm_above = np.cumsum(sm_at[:, ::-1], axis=1)[:, ::-1][:, 1:]
    X = kept_sum[:, None] - sm_above + c[None, :] * cnt_above
    return X, np.maximum(kept_count[:, None] - cnt_above, 0.0)
