"""What the privacy-safe tuner knows, and does not know, about how slices differ.

The releases and the first-party conversions tell the tuner the pooled retention curve (arms pooled
over slices) and, per slice, the noised capped totals of the main release. Slices differ in two ways
that change which parameters are good:

* **value level** (a slice's orders are several times larger than another's): identified. Per slice,
  the main release's value estimate over its count estimate is the mean kept *clipped* value
  E[min(s_k v, clip)] (Alg. 3 clips before it scales), with v drawn from the first-party values and
  s_k the slice's scale; it is increasing in s_k, so s_k follows by bisection, shrunk towards 1 by its
  noise (empirical Bayes on log s_k). The pseudo-history draws slice k's values as s_k v.
* **conversions per impression** (some campaigns convert once, others many times): not identified.
  The arms are pooled over slices and the first-party data has no slice, so no input shows a slice's
  own retention r_k(K); one main count limit only shows r_k T_k. What the pooled curve does bound is
  how far apart slices can be: if every slice held impressions of one size n only, r_k = min(n, K)/n,
  and the conversion-weighted variance of that over the curve's size distribution is the largest
  between-slice variance of r consistent with the pooled curve (``max_retention_spread``). The tuner
  takes a share ``RETENTION_SPREAD_SHARE`` of it as the between-slice variance of the ratio: it goes
  into every slice's ratio variance (intervals) and into the predicted error of every candidate (a
  correction by a pooled ratio is then off by r_k / r for slice k; an uncorrected estimate by r_k).

``robust_rmsre_tau`` is the error a candidate will have with the estimator it will really publish
(pooled ratio or capped estimate, not the per-slice ratios a pseudo-history would make up) on the
pseudo-history's last day, with that between-slice variance added; the tuner publishes the candidate
(the tuned parameters, the other objective's, the cold-start rule) with the lowest, and that error is
its published prediction. ``release_consistency`` checks the model against the last release: the
releases contradict it when the main keys' estimates scatter around the model's expectations by more
than the noise, the day's sampling and the admitted heterogeneity allow.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from araopt.optimize.error_model import ErrorBreakdown, rmsre_tau
from araopt.optimize.retention import RetentionCurve

RETENTION_SPREAD_SHARE = 0.5
"""Share of the largest between-slice variance of the retention ratio that the pooled curve allows
(fully segregated sizes) taken as the slices' spread: the releases cannot measure it."""
SCALE_PRIOR_VARIANCE = 1.0
"""Prior variance of a slice's log value scale (slices' value medians differ several-fold)."""
MAX_SCALE = 20.0
"""A slice's value scale is kept in [1 / MAX_SCALE, MAX_SCALE] (a clip far below its values saturates)."""
SHAPE_VARIANCE = 0.25
"""Floor of a slice's log value-scale variance: its values' shape is the first-party values' only
approximately (a scaled pool), which no number of releases removes."""
CONTRADICTION = 4.0
"""The releases contradict the model when the last release's standardized scatter (chi-square over
degrees of freedom) exceeds this."""


def max_retention_spread(curve: RetentionCurve, kept_ranks: int) -> float:
    """The largest between-slice variance of r(K) the pooled curve allows: slices each made of
    impressions of one size n, r(n) = min(n, K) / n, weighted by their conversions n p(n)."""
    p = curve.size_distribution()
    n = np.arange(1, len(p) + 1, dtype=np.float64)
    w = n * p / float(n @ p)
    r = np.minimum(n, float(kept_ranks)) / n
    mean = float(w @ r)
    return float(w @ (r - mean) ** 2)


def retention_spread(curve: RetentionCurve, kept_ranks: int, share: float = RETENTION_SPREAD_SHARE) -> float:
    """The between-slice variance of the retention ratio the tuner admits at kept ranks K."""
    return share * max_retention_spread(curve, kept_ranks)


EXPONENT_PRIOR_VARIANCE = 1.0
"""Prior variance of a slice's retention exponent theta around 1 (r_k(K) = r(K)^theta_k)."""
MAX_EXPONENT = 3.0


@dataclass(frozen=True)
class SliceCounts:
    """The main releases of one count limit (kept ranks K), summed: per slice the kept count over the
    main share of the days' first-party conversions, its variance (noise and the slice's daily
    sampling), and the pooled curve's r(K)."""

    kept_ranks: int
    share: np.ndarray
    variance: np.ndarray
    pooled_ratio: float


def retention_exponents(groups: list[SliceCounts], prior_variance: float = EXPONENT_PRIOR_VARIANCE
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Every slice's retention exponent theta_k (r_k(K) = r(K)^theta_k: 0 when its impressions convert
    once, 1 when like the pool, > 1 when they convert more often) and its posterior variance, from the
    main releases at two count limits: the slice's share of conversions kept moves from one to the
    other as r_k does, log(s_a / s_b) = theta_k log(r(K_a) / r(K_b)). The two count limits whose pooled
    ratios differ most are compared; with one count limit only, every slice keeps theta = 1 with the
    prior variance (no input shows a slice's own retention then). Shrunk towards 1 by its noise."""
    m = len(groups[0].share) if groups else 0
    theta = np.ones(m)
    variance = np.full(m, prior_variance)
    if len(groups) < 2:
        return theta, variance
    a, b = min(groups, key=lambda g: g.pooled_ratio), max(groups, key=lambda g: g.pooled_ratio)
    step = float(np.log(max(a.pooled_ratio, 1e-6) / max(b.pooled_ratio, 1e-6)))
    if abs(step) < 0.05:
        return theta, variance
    ok = (a.share > 0) & (b.share > 0)
    raw = np.where(ok, np.log(np.where(ok, a.share, 1.0) / np.where(ok, b.share, 1.0)) / step, 1.0)
    raw_var = np.where(ok, (a.variance / np.where(ok, a.share, 1.0) ** 2
                            + b.variance / np.where(ok, b.share, 1.0) ** 2) / step**2, np.inf)
    weight = prior_variance / (prior_variance + raw_var)
    theta = np.clip(1.0 + weight * (raw - 1.0), 0.0, MAX_EXPONENT)
    variance = 1.0 / (1.0 / prior_variance + 1.0 / raw_var)
    return theta, np.asarray(variance, dtype=np.float64)


class ValuePool:
    """The first-party values of one query, sorted, for fast E[min(s v, clip)]."""

    def __init__(self, values: np.ndarray) -> None:
        self.v = np.sort(np.asarray(values, dtype=np.float64))
        self.cum = np.concatenate([[0.0], np.cumsum(self.v)])

    def clipped_mean(self, scale: float, clip: float) -> float:
        """E[min(s v, clip)] over the pool."""
        n = len(self.v)
        if n == 0:
            return 0.0
        below = int(np.searchsorted(self.v, clip / scale, side="left"))
        return float((scale * self.cum[below] + clip * (n - below)) / n)

    def scale(self, clip: float, target: float) -> float:
        """The scale s with E[min(s v, clip)] = ``target`` (bisection on log s) in [1/MAX_SCALE, MAX_SCALE]."""
        lo, hi = -float(np.log(MAX_SCALE)), float(np.log(MAX_SCALE))
        if target <= self.clipped_mean(float(np.exp(lo)), clip):
            return float(np.exp(lo))
        if target >= self.clipped_mean(float(np.exp(hi)), clip):
            return float(np.exp(hi))
        for _ in range(40):
            mid = 0.5 * (lo + hi)
            if self.clipped_mean(float(np.exp(mid)), clip) < target:
                lo = mid
            else:
                hi = mid
        return float(np.exp(0.5 * (lo + hi)))


@dataclass(frozen=True)
class SliceValues:
    """The main releases of one clip of one value query, summed: per slice the kept count and
    clipped value, their noise variances."""

    clip: float
    count: np.ndarray
    count_variance: np.ndarray
    value: np.ndarray
    value_variance: np.ndarray


def value_scales(groups: list[SliceValues], values: np.ndarray, weights: np.ndarray,
                 prior_variance: float = SCALE_PRIOR_VARIANCE) -> tuple[np.ndarray, np.ndarray]:
    """Every slice's value scale of one query (m,) from the releases of each clip (log scales
    combined by precision, shrunk towards 1 by their noise), normalised so that the conversion-
    weighted (``weights``) mean scale is 1: the first-party values are the slices' mixture. A slice
    without a positive kept count and value in any release keeps scale 1."""
    pool = ValuePool(values)
    m = len(weights)
    precision = np.zeros(m)
    weighted = np.zeros(m)
    for g in groups:
        if pool.clipped_mean(1.0, g.clip) <= 0:
            continue
        for k in range(m):
            c, v = float(g.count[k]), float(g.value[k])
            if c <= 0 or v <= 0:
                continue
            mean = min(v / c, g.clip)
            # the clipped mean's variance: both sums' noise (delta method) and the values' sampling
            var = (float(g.value_variance[k]) + mean**2 * float(g.count_variance[k])) / c**2
            var += mean * max(g.clip - mean, 0.0) / c
            if mean >= 0.9 * g.clip:  # a clip at or below the slice's values bounds its level, does not measure it
                continue
            log_var = var / mean**2
            precision[k] += 1.0 / log_var
            weighted[k] += np.log(pool.scale(g.clip, mean)) / log_var
    log_scale = np.where(precision > 0, weighted / np.maximum(precision, 1e-300), 0.0)
    shrink = precision / (precision + 1.0 / prior_variance)
    out = np.exp(shrink * log_scale)
    w = np.asarray(weights, dtype=np.float64)
    if w.sum() > 0:
        out = out / (float(w @ out) / float(w.sum()))
    posterior = 1.0 / (precision + 1.0 / prior_variance) + SHAPE_VARIANCE
    return np.asarray(np.clip(out, 1.0 / MAX_SCALE, MAX_SCALE), dtype=np.float64), posterior


def ratio_elasticity(values: np.ndarray, scales: np.ndarray, clip: float) -> np.ndarray:
    """|d log r / d log s| of a value query's clip ratio r(s) = E[min(s v, c)] / (s E[v]) per slice
    scale s: c P(s v >= c) / E[min(s v, c)], 0 when the clip is far above the slice's values (its
    level does not matter), 1 when far below (the ratio is c / (s E v): all of the level's
    uncertainty goes into it)."""
    pool = ValuePool(values)
    n = len(pool.v)
    out = np.zeros(len(scales))
    for k, s in enumerate(np.asarray(scales, dtype=np.float64)):
        kept = pool.clipped_mean(float(s), clip)
        above = n - int(np.searchsorted(pool.v, clip / s, side="left"))
        out[k] = clip * above / n / kept if kept > 0 and n else 0.0
    return out


SCENARIOS = ((-1.5, 1.0 / 3.0), (0.0, 1.0 / 3.0), (1.5, 1.0 / 3.0))
"""Retention-exponent scenarios (posterior standard deviations from the slice's theta, weight): a
three-point rule for the error's expectation over what the releases do not pin down."""


def robust_rmsre_tau(breakdown: ErrorBreakdown, ratio: np.ndarray, corrected: bool, spread: np.ndarray,
                     taus: np.ndarray, pooled: float, learnt: float, theta: np.ndarray, theta_variance: np.ndarray
                     ) -> float:
    """Predicted RMSRE_tau (Def. 3.2) of a release whose estimate is U / ratio (``corrected``) or U,
    on a pseudo-history day (``breakdown``: its truths, Alg. 4's expectations and variances, made with
    the pooled retention ``pooled`` at the candidate's count limit), averaged (in squares) over
    scenarios of each slice's retention exponent (``SCENARIOS`` around ``theta`` by its posterior
    variance). The releases the slices' totals were learnt from kept a share ``learnt`` (pooled) of
    them: under exponent t a slice's true total is the model's x learnt^(theta - t), and the
    candidate keeps r^t of it. ``spread`` (m, queries): a further variance of each slice's ratio the
    model cannot see (value levels through the clip)."""
    r = np.where(corrected, np.maximum(ratio, 1e-6), 1.0)
    sd = np.sqrt(np.maximum(theta_variance, 0.0))
    total = 0.0
    for z, weight in SCENARIOS:
        scenario = np.clip(theta + z * sd, 0.0, MAX_EXPONENT)
        size = (max(learnt, 1e-6) ** (theta - scenario))[:, None]
        kept = size * (max(pooled, 1e-6) ** (scenario - theta))[:, None]
        expected = breakdown.expected * kept
        variance = breakdown.variance * kept / r**2 + spread * (expected / np.maximum(ratio, 1e-6)) ** 2 / r**2
        total += weight * rmsre_tau(ErrorBreakdown(breakdown.truth * size, expected / r, variance), taus).combined ** 2
    return float(np.sqrt(total))


def release_consistency(observed: np.ndarray, noise_variance: np.ndarray, expected: np.ndarray,
                        sampling_variance: np.ndarray, spread: float) -> float:
    """Chi-square over degrees of freedom of the last release's main count estimates around the
    model's expectations: noise, the day's sampling and the admitted between-slice spread of the
    retention ratio in the denominator. About 1 when the model holds; large when the releases
    contradict it."""
    total = noise_variance + sampling_variance + spread * expected**2
    ok = total > 0
    if not ok.any():
        return 0.0
    return float(np.mean((observed[ok] - expected[ok]) ** 2 / total[ok]))
