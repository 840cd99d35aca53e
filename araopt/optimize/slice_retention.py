"""Each slice's own retention curve, identified from main releases at several count limits
(privacy-safe tuning: the first-party data has no impression-side slice and the arms are pooled over
slices, so only the main releases show a slice's retention, and only across count limits).

The family. A slice's impressions convert n times, n geometric with mean mu_k (the most spread law
of a given mean), but anchored to the pool the arms measure: the slice's curve is the pooled
curve's mixture weights t_j (``optimize.retention``) reweighted by its geometric law over the
slices' conversion-weighted geometric mixture, t_kj ~ t_j g_mu_k(j) / sum_i w_i g_mu_i(j). The
slices' mixture is then the measured pool whatever the pool's law, and slices that are alike have
exactly the pooled curve (a Poisson-like pool stays Poisson-like); only how slices differ comes from
the family.

What identifies mu_k. A slice's expected kept main count on day d is w_k A_d r_k(K_d) / R(K_d): w_k
its share of the conversions, A_d the day's kept main count over all slices, R the pooled curve at
the day's kept ranks K_d; after a count-limit move r_k(K_d) and R(K_d) are the kept shares given
the count limits of the days before (``SliceDays.tables``, ``optimize.transient``: Alg. 1 charges
over the impression's life), so a release in a transient identifies mu_k as a settled one does.
One count limit shows only w_k r_k (the two are confounded); two or more
count limits in the history (the count-limit schedule of ``optimize.private`` alternates them) show
how the slice's share of the kept conversions moves with K, which is mu_k. On a grid of mu
(``MEANS``), w_k is profiled out by weighted least squares and the Gaussian log-likelihood of the
slice's daily kept counts kept (variance: the release's noise plus the day's sampling of a count
clustered by impression, E[min(n, K)^2] / E[min(n, K)] per kept conversion, at the slice's rough
mean, fixed over the grid so that only the mean's movement with K identifies mu).

Shrinkage (hierarchical). log mu_k ~ N(m_g, s_w^2) within the group g of the slice (the slices
sharing a value of one slice column, e.g. a campaign's geographies), m_g ~ N(c, s_b^2) around the
slices' common fit c. The posterior averages over the grouping column and (s_b, s_w) by their
marginal likelihood (no grouping is a candidate: the data choose the structure, none is assumed;
weak data keep wide spreads in play, strong data settle on the spreads they show); with one count limit only
the likelihood is flat and every slice keeps the prior N(log mean of the pool, ``DEFAULT_SPREAD``^2).
The likelihood is computed twice: with the bare geometric curves, then with the curves anchored to
the pool through the first pass's mixture. Each slice's posterior over the grid gives its curve
(the mixture of the grid's curves), the mean and variance of r_k(K) at any K, and scenarios
(posterior quantiles) for the robust prediction.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from araopt.optimize.logspace import logsumexp
from araopt.optimize.retention import MAX_SIZE, RetentionCurve

MEANS = np.exp(np.linspace(0.0, np.log(64.0), 43))
"""The grid of a slice's mean conversions per impression mu (1 to 64)."""
SPREADS = (0.1, 0.25, 0.5, 1.0, 1.5, 2.0)
"""Candidate standard deviations of log mu (between groups, within a group; slices are never taken
to be exactly alike: what a count limit's contrast cannot resolve stays in the posterior)."""
DEFAULT_SPREAD = 1.0
"""The prior standard deviation of log mu when the releases cannot measure it (one count limit):
slices may differ by a factor e in conversions per impression at one standard deviation."""
SCENARIO_QUANTILES = (1.0 / 6.0, 0.5, 5.0 / 6.0)
"""Posterior quantiles of each slice's mu for the robust prediction (equal weights)."""


def geometric_log_weights() -> np.ndarray:
    """(grid, MAX_SIZE) the log of the conversion-normalised mixture weights (``RetentionCurve.weights``)
    of geometric impression sizes of every grid mean (cut at MAX_SIZE), in logs: far tails underflow."""
    n = np.arange(1, MAX_SIZE + 1, dtype=np.float64)
    out = np.full((len(MEANS), MAX_SIZE), -np.inf)
    for g, mu in enumerate(MEANS):
        if mu - 1.0 < 1e-9:
            out[g, 0] = 0.0
            continue
        log_q = -np.log(mu) + (n - 1.0) * np.log1p(-1.0 / mu)
        log_q -= logsumexp(log_q)
        out[g] = log_q - logsumexp(log_q + np.log(n))
    return out


def anchored_weights(pooled: RetentionCurve, log_family: np.ndarray, shares: np.ndarray) -> np.ndarray:
    """(grid, MAX_SIZE) the family's curves anchored to the pool: the pooled weights times each grid
    curve's over the slices' mixture (``shares``: each grid curve's conversion weight in it),
    renormalised to one conversion per unit (see the module docstring). Where the pool has no mass a
    curve has none; a curve left with no mass keeps its bare family weights."""
    n = np.arange(1, MAX_SIZE + 1, dtype=np.float64)
    t = np.zeros(MAX_SIZE)
    t[: min(len(pooled.weights), MAX_SIZE)] = np.asarray(pooled.weights, dtype=np.float64)[:MAX_SIZE]
    t = t / max(float(t @ n), 1e-300)
    present = shares > 0
    log_mix = logsumexp(log_family[present] + np.log(shares[present])[:, None], axis=0)
    log_tilt = np.where(np.isfinite(log_family), log_family - log_mix[None, :], -np.inf)
    top = np.max(np.where(t[None, :] > 0, log_tilt, -np.inf), axis=1, keepdims=True)
    log_tilt = log_tilt - np.where(np.isfinite(top), top, 0.0)
    out = t[None, :] * np.exp(np.minimum(log_tilt, 0.0))
    mass = out @ n
    bare = ~(mass > 1e-300)
    out[bare] = np.exp(log_family[bare])
    return np.asarray(out / np.where(bare, 1.0, mass)[:, None], dtype=np.float64)


@dataclass(frozen=True)
class SliceDays:
    """The main releases as this model reads them, one row per release: the kept ranks K_d, the
    day's kept main count over all declared slices A_d, and per slice (columns) its kept count
    estimate and that estimate's noise variance."""

    kept_ranks: np.ndarray
    pooled: np.ndarray
    kept: np.ndarray
    noise: np.ndarray
    tables: np.ndarray | None = None
    """(MAX_SIZE, releases) the kept conversions per impression of each size on each release's day
    given the count limits before it (``optimize.transient.kept_table``); None: min(n, K_d), every
    release settled at its count limit."""
    conversions: np.ndarray | None = None
    """(releases,) the conversions each main release measured, exact (first-party, times the main
    arm's share): what the slices' kept counts over their retention must add up to (``balanced_center``);
    None: unknown."""

    def kept_tables(self) -> np.ndarray:
        """(MAX_SIZE, releases) what each release keeps of an impression of each size."""
        if self.tables is not None:
            return np.asarray(self.tables, dtype=np.float64)
        n = np.arange(1, MAX_SIZE + 1, dtype=np.float64)
        return np.minimum(n[:, None], np.asarray(self.kept_ranks, dtype=np.float64)[None, :])

    @property
    def distinct_ranks(self) -> int:
        return len(np.unique(self.kept_ranks))


@dataclass(frozen=True)
class SlicePosterior:
    """Every slice's posterior over the grid of means (rows: slices) and the grid's curves (anchored
    to the pool), the grouping chosen (a slice column index, or -1: none), the spreads (between,
    within) and whether the releases identified anything (two count limits or more)."""

    weights: np.ndarray
    grid_weights: np.ndarray
    grouping: int
    spreads: tuple[float, float]
    identified: bool

    def ratio_table(self, kept_ranks: int) -> np.ndarray:
        """r(K) of every grid curve."""
        n = np.arange(1, self.grid_weights.shape[1] + 1, dtype=np.float64)
        return np.asarray(self.grid_weights @ np.minimum(n, float(kept_ranks)), dtype=np.float64)

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
        at = np.stack([np.minimum((cdf < q).sum(axis=1), len(MEANS) - 1) for q in quantiles], axis=1)
        return np.asarray(self.ratio_table(kept_ranks)[at], dtype=np.float64)

    def family_mean(self) -> np.ndarray:
        """Posterior mean of every slice's geometric mean mu: the family's parameter, not the mean
        conversions per impression of the slice's curve (``slice_curve(k).mean_size()``), which the
        anchoring to the pool moves (what the tuner uses is the curve)."""
        return np.asarray(self.weights @ MEANS, dtype=np.float64)

    def dispersion(self, kept_ranks: np.ndarray) -> np.ndarray:
        """(slices, days) E[min(n, K)^2] / E[min(n, K)] over each slice's impressions (its posterior
        curve) at every day's kept ranks: a count summed over impressions varies by this times its mean."""
        return _dispersion(self.weights @ self.grid_weights, kept_ranks)

    def slice_curve(self, k: int) -> RetentionCurve:
        """Slice k's curve: the posterior mixture of the grid's curves (a mixture of r's is the mixture
        of their conversion-normalised weights)."""
        return RetentionCurve(np.asarray(self.weights[k] @ self.grid_weights, dtype=np.float64))


def _dispersion(weights: np.ndarray, kept_ranks: np.ndarray) -> np.ndarray:
    """(curves, days) E[min(n, K)^2] / E[min(n, K)] over impressions of each curve (rows of
    conversion-normalised ``weights``) at each day's K: a day's kept count is a sum over impressions,
    its variance this factor times its mean."""
    n = np.arange(1, weights.shape[1] + 1, dtype=np.float64)
    p = weights / n[None, :]  # impressions, up to a constant per curve
    kept = np.minimum(n[:, None], np.asarray(kept_ranks, dtype=np.float64)[None, :])  # (sizes, days)
    return np.asarray((p @ kept**2) / np.maximum(p @ kept, 1e-300), dtype=np.float64)


def log_likelihood(days: SliceDays, grid_weights: np.ndarray, pooled: RetentionCurve) -> np.ndarray:
    """(slices, grid) log-likelihood of each slice's daily kept counts at every grid curve, its
    conversion share profiled out (see the module docstring)."""
    k = np.asarray(days.kept_ranks, dtype=np.float64)
    table = days.kept_tables()[: grid_weights.shape[1]]
    pool = np.zeros(grid_weights.shape[1])
    pool[: min(len(pooled.weights), len(pool))] = np.asarray(pooled.weights, dtype=np.float64)[: len(pool)]
    base = np.maximum(pool @ table, 1e-9)  # the pool's kept share on each release's day (its transient)
    g = (grid_weights @ table) / base[None, :]  # (G, days): relative to the pool
    a = np.maximum(np.asarray(days.pooled, dtype=np.float64), 1.0)
    u = np.asarray(days.kept, dtype=np.float64)  # (days, slices)
    noise = np.asarray(days.noise, dtype=np.float64)
    share = np.maximum(u.sum(axis=0), 0.0) / a.sum()  # each slice's pooled share of the kept conversions
    pool_weights = np.asarray(pooled.weights, dtype=np.float64)[None, :MAX_SIZE]
    pooled_dispersion = _dispersion(pool_weights, k)[0]
    dispersion = _dispersion(grid_weights, k)  # (G, days)
    out = np.zeros((u.shape[1], len(grid_weights)))
    for j in range(u.shape[1]):
        mean = share[j] * a[None, :] * g  # (G, days)
        rough = int(np.argmax(_profiled(u[:, j], a, g, noise[:, j][None, :] + pooled_dispersion[None, :]
                                        * np.maximum(mean, 0.0) + 1e-9)))
        var = noise[:, j] + dispersion[rough] * np.maximum(mean[rough], 1e-9) + 1e-9
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


def _within_terms(ll: np.ndarray, within: float) -> tuple[np.ndarray, np.ndarray]:
    """p(log mu | m) on the grid (G_m, G) and every slice's log-likelihood at each group mean m
    (slices, G_m), the mean integrated out: they depend on the within-group spread only, so
    ``_posterior`` computes them once per spread for every grouping and between-group spread."""
    grid = np.log(MEANS)
    cond = _log_prior(grid, grid, within)  # (G_m, G): p(log mu | m)
    per = logsumexp(ll[:, None, :] + cond[None, :, :], axis=2)  # (slices, G_m)
    return cond, np.asarray(per, dtype=np.float64)


def _hierarchy(ll: np.ndarray, groups: np.ndarray, center: float, between: float,
               terms: tuple[np.ndarray, np.ndarray], posterior: bool = False) -> tuple[float, np.ndarray | None]:
    """Marginal log-likelihood of all slices and (``posterior``) every slice's log posterior over the
    grid, under log mu_k ~ N(m_g, within^2), m_g ~ N(center, between^2) (m_g on the same grid;
    ``terms``: ``_within_terms`` of ``ll`` at the within-group spread)."""
    grid = np.log(MEANS)
    top = _log_prior(grid, np.array([center]), between)[0]  # (G,)
    cond, per = terms
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


def _posterior(ll: np.ndarray, center: float, slice_groups: Sequence[np.ndarray], identified: bool
               ) -> tuple[np.ndarray, int, float, float]:
    """Every slice's posterior weights, averaged over the groupings and spreads by their marginal
    likelihood (a flat hyperprior: weak data keep wide spreads in play instead of collapsing onto the
    smallest), and the most likely grouping and spreads."""
    m = ll.shape[0]

    def grouping(column: int) -> np.ndarray:
        return np.zeros(m, dtype=np.int64) if column < 0 else np.asarray(slice_groups[column], dtype=np.int64)

    options = [(-1, 0.0, DEFAULT_SPREAD)]
    if identified:
        options = [(-1, 0.0, w) for w in SPREADS]
        options += [(c, b, w) for c in range(len(slice_groups)) for b in SPREADS for w in SPREADS]
    terms = {w: _within_terms(ll, w) for w in dict.fromkeys(w for _, _, w in options)}
    totals = np.array([_hierarchy(ll, grouping(c), center, b, terms[w])[0] for c, b, w in options])
    evidence = np.exp(totals - totals.max())
    evidence /= evidence.sum()
    weights = np.zeros_like(ll)
    for share, (c, b, w) in zip(evidence, options, strict=True):
        if share < 1e-4:
            continue
        post = _hierarchy(ll, grouping(c), center, b, terms[w], posterior=True)[1]
        assert post is not None
        weights += share * np.exp(post)
    weights /= weights.sum(axis=1, keepdims=True)
    column, between, within = options[int(np.argmax(totals))]
    return weights, column, between, within


BALANCE_Z = 2.0
"""How many standard deviations of noise the slices' implied conversions may miss the exact total by
before ``balanced_center`` moves the prior's center."""


def implied_conversions(weights: np.ndarray, curves: np.ndarray, days: SliceDays) -> tuple[float, float]:
    """The conversions the releases' slices stand for, sum over releases and slices of the kept count
    over the slice's posterior mean kept share that day, and that sum's noise variance."""
    ratios = np.maximum(weights @ (curves @ days.kept_tables()[: curves.shape[1]]), 1e-6)  # (slices, days)
    kept = np.asarray(days.kept, dtype=np.float64).T
    return float((kept / ratios).sum()), float((np.asarray(days.noise, dtype=np.float64).T / ratios**2).sum())


def balanced_center(ll: np.ndarray, center: float, days: SliceDays, curves: np.ndarray,
                    slice_groups: Sequence[np.ndarray], steps: int = 12) -> float:
    """The hierarchy's center c moved (bisection on log mu) until the slices' implied conversions
    (``implied_conversions``) meet the exact ones the releases measured (``SliceDays.conversions``).

    Why. The kept counts identify mu_k only for slices the releases measure well; the rest keep the
    hierarchical prior around c, the common fit of the measured ones. When the slices the releases
    cannot measure differ from the measured ones (small slices whose impressions convert many times),
    that prior gives them the measured slices' retention: the conversions their kept counts stand for
    fall short of the first-party total (exact), the pool's many-conversion impressions are spread by
    the anchoring over every slice, and the measured slices' retention is understated too. The total
    is a fact about all slices together: c moves until the slices' conversions add up to it, which
    moves mainly the slices the likelihood leaves to the prior. Unchanged when no total is known or
    the gap is within ``BALANCE_Z`` standard deviations of the kept counts' noise."""
    if days.conversions is None:
        return center
    target = float(np.sum(days.conversions))
    grid = np.log(MEANS)

    def gap(c: float) -> tuple[float, float]:
        weights = _posterior(ll, c, slice_groups, True)[0]
        implied, variance = implied_conversions(weights, curves, days)
        return implied - target, variance

    here, variance = gap(center)
    if abs(here) <= BALANCE_Z * np.sqrt(variance) or target <= 0:
        return center
    # more conversions than the slices stand for: heavier slices (lower retention) at a higher c
    low, high = (center, float(grid[-1])) if here < 0 else (float(grid[0]), center)
    end, _ = gap(high if here < 0 else low)
    if (end < 0) == (here < 0):  # the grid's end does not meet the total either: go as far as it allows
        return high if here < 0 else low
    for _ in range(steps):
        mid = 0.5 * (low + high)
        if (gap(mid)[0] < 0) == (here < 0):
            low, high = (mid, high) if here < 0 else (low, mid)
        else:
            low, high = (low, mid) if here < 0 else (mid, high)
    return 0.5 * (low + high)


def slice_posterior(days: SliceDays, pooled: RetentionCurve, slice_groups: Sequence[np.ndarray]) -> SlicePosterior:
    """Every slice's posterior over its mean conversions per impression, on curves anchored to the
    pool (see the module docstring). ``slice_groups``: per slice column, each slice's value code (the
    candidate groupings)."""
    m = days.kept.shape[1]
    identified = days.distinct_ranks >= 2
    grid = np.log(MEANS)
    log_family = geometric_log_weights()
    curves = np.exp(log_family)
    weights = np.zeros((m, len(MEANS)))
    column, between, within = -1, 0.0, DEFAULT_SPREAD
    for _ in range(2):  # the bare family, then the family anchored to the pool through the first pass
        if identified:
            ll = log_likelihood(days, curves, pooled)
            center = float(grid[int(np.argmax(ll.sum(axis=0)))])  # the slices' common fit
            center = balanced_center(ll, center, days, curves, slice_groups)
        else:
            ll = np.zeros((m, len(MEANS)))
            center = float(np.log(pooled.mean_size()))
        weights, column, between, within = _posterior(ll, center, slice_groups, identified)
        ratios = weights @ (curves @ days.kept_tables())
        conversions = np.maximum(np.asarray(days.kept, dtype=np.float64).T / np.maximum(ratios, 1e-6), 0.0).sum(axis=1)
        share = conversions / conversions.sum() if conversions.sum() > 0 else np.full(m, 1.0 / m)
        curves = anchored_weights(pooled, log_family, share @ weights)
    return SlicePosterior(weights, curves, column, (between, within), identified)
