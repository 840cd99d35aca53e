"""Each slice's own retention curve, identified from main releases at several count limits
(privacy-safe tuning: the first-party data has no impression-side slice and the arms are pooled over
slices, so only the main releases show a slice's retention, and only across count limits).

The family. A slice's impressions convert n times, n - 1 negative binomial with mean mu_k - 1 and a
shape kappa shared by all slices (kappa = 1: geometric, the most spread law of a given mean; large
kappa: Poisson-like, impressions of about one size). Its curve r_k(K) = E[min(n, K)] / E[n]
(``optimize.retention``). The pool the arms measure is the slices' conversion-weighted mixture.

What identifies mu_k. A slice's expected kept main count on day d is w_k A_d r_k(K_d) / R(K_d): w_k
its share of the conversions, A_d the day's kept main count over all slices, R the pooled curve at
the day's kept ranks K_d. One count limit shows only w_k r_k (the two are confounded); two or more
count limits in the history (the count-limit schedule of ``optimize.private`` alternates them) show
how the slice's share of the kept conversions moves with K, which is mu_k. On a grid of mu
(``MEANS``), w_k is profiled out by weighted least squares and the Gaussian log-likelihood of the
slice's daily kept counts kept (variance: the release's noise plus the day's sampling of a count
clustered by impression, E[min(n, K)^2] / E[min(n, K)] per kept conversion, at the slice's rough
mean, fixed over the grid so that only the mean's movement with K identifies mu).

What identifies kappa. Two count limits show each slice's contrast, not the curve's shape; the shape
follows from the pool: the slices' curves, weighted by their conversions, must give the pooled
curve the arms and main releases measure. kappa maximises the slices' marginal likelihood plus the
pool's fit (``retention_points``: a geometric pool is a mixture of geometric slices, a Poisson-like
pool is not).

Shrinkage (empirical Bayes). log mu_k ~ N(m_g, s_w^2) within the group g of the slice (the slices
sharing a value of one slice column, e.g. a campaign's geographies), m_g ~ N(c, s_b^2) around the
slices' common fit c. The grouping column and (s_b, s_w) maximise the marginal likelihood (no
grouping is a candidate: the data choose the structure, none is assumed); with one count limit only
the likelihood is flat and every slice keeps the prior N(log mean of the pool, ``DEFAULT_SPREAD``^2).
Each slice's posterior over the grid gives its curve (the mixture of the grid's curves), the mean
and variance of r_k(K) at any K, and scenarios (posterior quantiles) for the robust prediction.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy.special import logsumexp
from scipy.stats import nbinom

from araopt.optimize.retention import MAX_SIZE, RetentionCurve

MEANS = np.exp(np.linspace(0.0, np.log(64.0), 43))
"""The grid of a slice's mean conversions per impression mu (1 to 64)."""
SHAPES = (1.0, 4.0, 16.0, 256.0)
"""The candidate shapes kappa of the slices' laws (1: geometric; 256: about Poisson)."""
SPREADS = (0.25, 0.5, 1.0, 1.5, 2.0)
"""Candidate standard deviations of log mu (between groups, within a group; slices are never taken
to be exactly alike: what a count limit's contrast cannot resolve stays in the posterior)."""
DEFAULT_SPREAD = 1.0
"""The prior standard deviation of log mu when the releases cannot measure it (one count limit):
slices may differ by a factor e in conversions per impression at one standard deviation."""
SCENARIO_QUANTILES = (1.0 / 6.0, 0.5, 5.0 / 6.0)
"""Posterior quantiles of each slice's mu for the robust prediction (equal weights)."""


@lru_cache(maxsize=8)
def family(shape: float) -> tuple[RetentionCurve, ...]:
    """The curves of the grid's means at shape kappa (n - 1 ~ NB(kappa, mean mu - 1), cut at MAX_SIZE)."""
    n = np.arange(1, MAX_SIZE + 1, dtype=np.float64)
    out = []
    for mu in MEANS:
        if mu - 1.0 < 1e-9:
            q = np.zeros(MAX_SIZE)
            q[0] = 1.0
        else:
            q = nbinom.pmf(n - 1, shape, shape / (shape + mu - 1.0))
            q = q / q.sum()
        out.append(RetentionCurve(q / float(q @ n)))
    return tuple(out)


@dataclass(frozen=True)
class SliceDays:
    """The main releases as this model reads them, one row per release: the kept ranks K_d, the
    day's kept main count over all declared slices A_d, and per slice (columns) its kept count
    estimate and that estimate's noise variance."""

    kept_ranks: np.ndarray
    pooled: np.ndarray
    kept: np.ndarray
    noise: np.ndarray

    @property
    def distinct_ranks(self) -> int:
        return len(np.unique(self.kept_ranks))


@dataclass(frozen=True)
class SlicePosterior:
    """Every slice's posterior over the grid of means (rows: slices), the shape, the grouping chosen
    (a slice column index, or -1: none), the spreads (between, within) and whether the releases
    identified anything (two count limits or more)."""

    weights: np.ndarray
    shape: float
    grouping: int
    spreads: tuple[float, float]
    identified: bool

    @property
    def curves(self) -> tuple[RetentionCurve, ...]:
        return family(self.shape)

    def ratio_table(self, kept_ranks: int) -> np.ndarray:
        """r(K) of every grid mean."""
        return np.array([float(c.ratio(kept_ranks)[0]) for c in self.curves])

    def mean_ratio(self, kept_ranks: int) -> np.ndarray:
        """Posterior mean of every slice's r_k(K)."""
        return np.asarray(self.weights @ self.ratio_table(kept_ranks), dtype=np.float64)

    def ratio_variance(self, kept_ranks: int) -> np.ndarray:
        """Posterior variance of every slice's r_k(K)."""
        table = self.ratio_table(kept_ranks)
        mean = self.weights @ table
        return np.asarray(np.maximum(self.weights @ table**2 - mean**2, 0.0), dtype=np.float64)

    def quantile_ratios(self, kept_ranks: int, quantiles: Sequence[float] = SCENARIO_QUANTILES) -> np.ndarray:
        """(slices, quantiles): r_k(K) at each slice's posterior quantiles of mu (r falls as mu grows)."""
        cdf = np.cumsum(self.weights, axis=1)
        table = self.ratio_table(kept_ranks)
        at = np.stack([np.minimum((cdf < q).sum(axis=1), len(MEANS) - 1) for q in quantiles], axis=1)
        return np.asarray(table[at], dtype=np.float64)

    def mean_size(self) -> np.ndarray:
        """Posterior mean of every slice's mu."""
        return np.asarray(self.weights @ MEANS, dtype=np.float64)

    def slice_curve(self, k: int) -> RetentionCurve:
        """Slice k's curve: the posterior mixture of the grid's curves (a mixture of r's is the mixture
        of their conversion-normalised weights)."""
        w = self.weights[k]
        keep = np.flatnonzero(w > 1e-9)
        return RetentionCurve(np.asarray(sum(float(w[i]) * self.curves[i].weights for i in keep), dtype=np.float64))


def _dispersion(curve: RetentionCurve, kept_ranks: np.ndarray) -> np.ndarray:
    """E[min(n, K)^2] / E[min(n, K)] over impressions of the curve, per K: a day's kept count is a
    sum over impressions, its variance this factor times its mean."""
    p = curve.size_distribution()
    n = np.arange(1, len(p) + 1, dtype=np.float64)
    k = np.asarray(kept_ranks, dtype=np.float64)
    kept = np.minimum(n[None, :], k[:, None])
    return np.asarray((kept**2 @ p) / np.maximum(kept @ p, 1e-12), dtype=np.float64)


def log_likelihood(days: SliceDays, curves: Sequence[RetentionCurve], pooled: RetentionCurve) -> np.ndarray:
    """(slices, grid) log-likelihood of each slice's daily kept counts at every grid curve, its
    conversion share profiled out (see the module docstring)."""
    k = np.asarray(days.kept_ranks, dtype=np.int64)
    unique = np.unique(k)
    table = np.array([[float(c.ratio(int(u))[0]) for u in unique] for c in curves])  # (G, distinct K)
    at = np.searchsorted(unique, k)
    base = np.maximum(np.array([float(pooled.ratio(int(u))[0]) for u in unique]), 1e-9)[at]
    g = table[:, at] / base[None, :]  # (G, n): the slice's kept share relative to the pool's, per day
    a = np.maximum(np.asarray(days.pooled, dtype=np.float64), 1.0)
    u = np.asarray(days.kept, dtype=np.float64)  # (n, m)
    noise = np.asarray(days.noise, dtype=np.float64)
    m = u.shape[1]
    share = np.maximum(u.sum(axis=0), 0.0) / a.sum()  # the slice's pooled share of the kept conversions
    pooled_dispersion = _dispersion(pooled, k)
    out = np.zeros((m, len(curves)))
    for j in range(m):
        mean = share[j] * a[None, :] * g  # (G, n)
        rough = int(np.argmax(_profiled(u[:, j], a, g, noise[:, j][None, :] + pooled_dispersion[None, :]
                                        * np.maximum(mean, 0.0) + 1e-9)))
        var = noise[:, j] + _dispersion(curves[rough], k) * np.maximum(mean[rough], 1e-9) + 1e-9
        out[j] = _profiled(u[:, j], a, g, np.broadcast_to(var[None, :], g.shape))
    return out


def _profiled(u: np.ndarray, a: np.ndarray, g: np.ndarray, var: np.ndarray) -> np.ndarray:
    """max over w >= 0 of the Gaussian log-likelihood of u ~ N(w a g, var), per grid row of g."""
    x = a[None, :] * g
    w = np.maximum((x * u[None, :] / var).sum(axis=1) / np.maximum((x**2 / var).sum(axis=1), 1e-300), 0.0)
    resid = u[None, :] - w[:, None] * x
    return np.asarray(-0.5 * (resid**2 / var + np.log(var)).sum(axis=1), dtype=np.float64)


def _log_prior(grid: np.ndarray, center: np.ndarray, sd: float) -> np.ndarray:
    """(len(center), G) log of a normal on the grid around each center, normalised on the grid; sd 0:
    the nearest grid point."""
    if sd <= 0:
        out = np.full((len(center), len(grid)), -np.inf)
        out[np.arange(len(center)), np.abs(grid[None, :] - center[:, None]).argmin(axis=1)] = 0.0
        return out
    z = -0.5 * ((grid[None, :] - center[:, None]) / sd) ** 2
    return np.asarray(z - logsumexp(z, axis=1, keepdims=True), dtype=np.float64)


def _hierarchy(ll: np.ndarray, groups: np.ndarray, center: float, between: float, within: float,
               posterior: bool = False) -> tuple[float, np.ndarray | None]:
    """Marginal log-likelihood of all slices and (``posterior``) every slice's log posterior over the
    grid, under log mu_k ~ N(m_g, within^2), m_g ~ N(center, between^2) (m_g on the same grid)."""
    grid = np.log(MEANS)
    top = _log_prior(grid, np.array([center]), between)[0]  # (G,)
    cond = _log_prior(grid, grid, within)  # (G_m, G): p(log mu | m)
    per = logsumexp(ll[:, None, :] + cond[None, :, :], axis=2)  # (slices, G_m)
    labels, index = np.unique(groups, return_inverse=True)
    sums = np.zeros((len(labels), per.shape[1]))
    np.add.at(sums, index, per)
    joint = top[None, :] + sums  # (groups, G_m)
    total = float(logsumexp(joint, axis=1).sum())
    if not posterior:
        return total, None
    rest = joint[index] - per  # m_g given the group's other slices, per slice
    x = ll + logsumexp(rest[:, :, None] + cond[None, :, :], axis=1)
    return total, np.asarray(x - logsumexp(x, axis=1, keepdims=True), dtype=np.float64)


def pool_misfit(posterior_weights: np.ndarray, curves: Sequence[RetentionCurve], conversions: np.ndarray,
                points: Sequence[tuple[int, float, float]]) -> float:
    """Chi-square of the retention points (K, r, variance) around the pool the slices make: their
    posterior mean curves weighted by their conversions."""
    w = np.maximum(np.asarray(conversions, dtype=np.float64), 0.0)
    if w.sum() <= 0 or not points:
        return 0.0
    mix = (w / w.sum()) @ posterior_weights  # (G,)
    total = 0.0
    for k, r, v in points:
        model = float(mix @ np.array([float(c.ratio(int(k))[0]) for c in curves]))
        total += (model - float(r)) ** 2 / max(float(v), 1e-10)
    return total


def slice_posterior(days: SliceDays, pooled: RetentionCurve, slice_groups: Sequence[np.ndarray],
                    points: Sequence[tuple[int, float, float]] = ()) -> SlicePosterior:
    """Every slice's posterior over its mean conversions per impression (see the module docstring).
    ``slice_groups``: per slice column, each slice's value code (the candidate groupings); ``points``:
    the pooled retention points the slices' mixture must reproduce."""
    m = days.kept.shape[1]
    identified = days.distinct_ranks >= 2
    grid = np.log(MEANS)
    best: tuple[float, SlicePosterior] | None = None
    for shape in SHAPES:
        curves = family(shape)
        if identified:
            ll = log_likelihood(days, curves, pooled)
            center = float(grid[int(np.argmax(ll.sum(axis=0)))])  # the slices' common fit
            options = [(-1, 0.0, w) for w in SPREADS]
            options += [(c, b, w) for c in range(len(slice_groups)) for b in SPREADS for w in SPREADS]
        else:
            ll = np.zeros((m, len(MEANS)))
            center = float(np.log(pooled.mean_size()))
            options = [(-1, 0.0, DEFAULT_SPREAD)]
        def grouping(column: int) -> np.ndarray:
            return np.zeros(m, dtype=np.int64) if column < 0 else np.asarray(slice_groups[column], dtype=np.int64)

        fits = [(_hierarchy(ll, grouping(c), center, b, w)[0], c, b, w) for c, b, w in options]
        total, column, between, within = max(fits, key=lambda f: f[0])
        post = _hierarchy(ll, grouping(column), center, between, within, posterior=True)[1]
        assert post is not None
        weights = np.exp(post)
        # each slice's conversions: its kept counts over its posterior mean ratio on each day
        ratios = weights @ np.array([[float(c.ratio(int(k))[0]) for k in days.kept_ranks] for c in curves])  # (m, n)
        conversions = np.maximum(np.asarray(days.kept, dtype=np.float64).T / np.maximum(ratios, 1e-6), 0.0).sum(axis=1)
        score = total - 0.5 * pool_misfit(weights, curves, conversions, points)
        found = SlicePosterior(weights, shape, column, (between, within), identified)
        if best is None or score > best[0] + 1e-9:
            best = (score, found)
    assert best is not None
    return best[1]
