"""What the privacy-safe tuner knows, and does not know, about how slices differ.

The releases and the first-party conversions tell the tuner the pooled retention curve (arms pooled
over slices) and, per slice, the noised capped totals of the main release. Slices differ in two ways
that change which parameters are good:

* **value level** (a slice's orders are several times larger than another's): identified. Per slice,
  the main release's value estimate over its count estimate is the mean kept *clipped* value
  E[min(s_k v, clip)] (Alg. 3 clips before it scales), with v drawn from the first-party values and
  s_k the slice's scale; it is increasing in s_k, so s_k follows by bisection, shrunk towards 1 by its
  noise (empirical Bayes on log s_k); a clip at or below a slice's values bounds its level from below
  (the posterior is truncated there). The pseudo-history draws slice k's values as s_k v. The
  first-party values mix every slice, so their log spread is the slices' own plus that of their
  levels: a slice scaled from the mixture has too heavy a tail (on hetero-retail its clip ratio at
  clip 40 read 0.17 where the slice kept 0.39). How much that matters at a clip is measured against
  the values with the levels' spread taken out (``within_slice_values``), whose tail is too heavy
  only where a sparse tail cannot be placed (``shape_doubt``), and enters the value ratios' variance.
* **conversions per impression** (some campaigns convert once, others many times): identified only
  across count limits (``optimize.slice_retention``: the arms are pooled over slices and the
  first-party data has no slice, so one count limit shows only r_k T_k). The posterior uncertainty of
  each slice's retention enters its ratio variance (intervals) and the scenarios below.

``robust_rmsre_tau`` is the error a candidate will have with the estimator it will really publish
(divided by the ratios it will publish, or capped) on the pseudo-history's last day, averaged over
scenarios of every slice's retention (its posterior quantiles: under another retention the same kept
totals mean other true totals, and the candidate keeps another share of them); the tuner publishes
the candidate with the lowest, and that error is its published prediction. ``release_consistency``
checks the model against the last release: the releases contradict it when the main keys' estimates
scatter around the model's expectations by more than the noise, the day's sampling and the slices'
retention uncertainty allow.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from araopt.optimize.error_model import ErrorBreakdown, rmsre_tau

SCALE_PRIOR_VARIANCE = 1.0
"""Prior variance of a slice's log value scale (slices' value medians differ several-fold)."""
MAX_SCALE = 20.0
"""A slice's value scale is kept in [1 / MAX_SCALE, MAX_SCALE] (a clip far below its values saturates)."""
SHAPE_VARIANCE = 0.25
"""Floor of a slice's log value-scale variance: its values' shape is the first-party values' only
approximately (a scaled pool), which no number of releases removes."""
CENSOR_SD = 2.0
"""A slice's clipped mean at its clip bounds its level from below at this many noise sd under it."""
SHAPE_BIN = 0.05
"""The log-value grid the values' within-slice shape is deconvolved on."""
SHAPE_ITERATIONS = 60
"""Richardson-Lucy iterations of that deconvolution (few: each sharpens the shape, and noise with it)."""
CONTRADICTION = 4.0
"""The releases contradict the model when the last release's standardized scatter (chi-square over
degrees of freedom) exceeds this."""


class ValuePool:
    """The first-party values of one query, sorted, for fast E[min(s v, clip)]."""

    def __init__(self, values: np.ndarray) -> None:
        self.v = np.sort(np.asarray(values, dtype=np.float64))
        self.cum = np.concatenate([[0.0], np.cumsum(self.v)])

    def clipped_means(self, scales: np.ndarray, clip: float) -> np.ndarray:
        """E[min(s v, clip)] over the pool for every scale s of ``scales``."""
        s = np.asarray(scales, dtype=np.float64)
        n = len(self.v)
        if n == 0:
            return np.zeros(s.shape)
        below = np.searchsorted(self.v, clip / s, side="left")
        return np.asarray((s * self.cum[below] + clip * (n - below)) / n, dtype=np.float64)

    def clipped_mean(self, scale: float, clip: float) -> float:
        """E[min(s v, clip)] over the pool."""
        return float(self.clipped_means(np.array([scale], dtype=np.float64), clip)[0])

    def scales(self, clip: float, targets: np.ndarray) -> np.ndarray:
        """For every target, the scale s with E[min(s v, clip)] = target (bisection on log s, all at once)
        in [1/MAX_SCALE, MAX_SCALE]."""
        t = np.asarray(targets, dtype=np.float64)
        edge = float(np.log(MAX_SCALE))
        lo, hi = np.full(t.shape, -edge), np.full(t.shape, edge)
        for _ in range(40):
            mid = 0.5 * (lo + hi)
            below = self.clipped_means(np.exp(mid), clip) < t
            lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
        out = np.exp(0.5 * (lo + hi))
        out = np.where(t >= self.clipped_mean(float(np.exp(edge)), clip), float(np.exp(edge)), out)
        return np.asarray(np.where(t <= self.clipped_mean(float(np.exp(-edge)), clip), float(np.exp(-edge)), out),
                          dtype=np.float64)

    def scale(self, clip: float, target: float) -> float:
        """The scale s with E[min(s v, clip)] = ``target`` (bisection on log s) in [1/MAX_SCALE, MAX_SCALE]."""
        return float(self.scales(clip, np.array([target], dtype=np.float64))[0])


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
    weighted (``weights``) mean scale is 1: the first-party values are the slices' mixture. A release
    whose clipped mean is at its clip (>= 0.9 of it) bounds the level from below only: the slice's
    log scale is then the posterior truncated at that bound. A slice without a
    positive kept count and value in any release keeps scale 1. Returns the scales and their log
    variances (with the ``SHAPE_VARIANCE`` floor)."""
    pool = ValuePool(values)
    m = len(weights)
    precision = np.zeros(m)
    weighted = np.zeros(m)
    floor = np.full(m, -np.inf)
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
            if mean >= 0.9 * g.clip:
                # a clip at or below the slice's values bounds its level from below, does not measure it:
                # the level is at least the one whose clipped mean is the mean's lower bound (at most
                # 0.9 of the clip: the clipped mean is flat in the level near the clip)
                low = min(mean - CENSOR_SD * float(np.sqrt(var)), 0.9 * g.clip)
                if low > 0:
                    floor[k] = max(floor[k], float(np.log(pool.scale(g.clip, low))))
                continue
            log_var = var / mean**2
            precision[k] += 1.0 / log_var
            weighted[k] += np.log(pool.scale(g.clip, mean)) / log_var
    log_scale = np.where(precision > 0, weighted / np.maximum(precision, 1e-300), 0.0)
    variance = 1.0 / (precision + 1.0 / prior_variance)
    mean_log = precision / (precision + 1.0 / prior_variance) * log_scale
    cut = np.isfinite(floor)
    if cut.any():  # the posterior N(mean, variance) truncated to [floor, inf)
        sd = np.sqrt(variance[cut])
        law = stats.truncnorm((floor[cut] - mean_log[cut]) / sd, np.inf, loc=mean_log[cut], scale=sd)
        mean_log[cut], variance[cut] = law.mean(), law.var()
    out = np.exp(mean_log)
    w = np.asarray(weights, dtype=np.float64)
    if w.sum() > 0:
        out = out / (float(w @ out) / float(w.sum()))
    return np.asarray(np.clip(out, 1.0 / MAX_SCALE, MAX_SCALE), dtype=np.float64), variance + SHAPE_VARIANCE


def within_slice_values(values: np.ndarray, log_scales: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The first-party values of one query with the slices' spread of levels taken out: what one
    slice's values look like at scale 1, if every slice's values are its scale times one shape.

    The positive values' logs x are the slices' log levels plus the shape's: their density is the
    shape's convolved with the levels' law (the slices' log scales, ``log_scales``: posterior means,
    shrunk, so if anything too alike; weighted by ``weights``, the slices' conversions). The shape's
    density is deconvolved on a grid of ``SHAPE_BIN`` in log by Richardson-Lucy (multiplicative EM
    updates: it stays a density and keeps the values' tail where a slice's level puts it), then
    every value is moved to the shape's quantile at its rank and all are scaled so their mean is the
    values' own (scale 1 keeps the pool's mean, as ``value_scales`` normalises). Values <= 0 stay."""
    v = np.asarray(values, dtype=np.float64)
    positive = v > 0
    w = np.clip(np.asarray(weights, dtype=np.float64), 0.0, None)
    if positive.sum() < 4 or w.sum() <= 0:
        return v.copy()
    x = np.log(v[positive])
    ls = np.asarray(log_scales, dtype=np.float64)
    shift = np.round((ls - float(w @ ls) / float(w.sum())) / SHAPE_BIN).astype(np.int64)
    low, high = int(shift.min()), int(shift.max())
    if low == high:
        return v.copy()
    kernel = np.bincount(shift - low, weights=w, minlength=high - low + 1) / float(w.sum())
    start = float(x.min()) - (high + 1) * SHAPE_BIN
    bins = int(np.ceil((float(x.max()) - low * SHAPE_BIN + SHAPE_BIN - start) / SHAPE_BIN)) + 1
    observed = np.bincount(np.minimum(((x - start) / SHAPE_BIN).astype(np.int64), bins - 1),
                           minlength=bins).astype(np.float64)
    observed /= observed.sum()
    shape = observed.copy()
    for _ in range(SHAPE_ITERATIONS):
        blurred = np.convolve(shape, kernel)[-low:-low + bins]  # the values' density the shape implies
        ratio = np.divide(observed, blurred, out=np.zeros(bins), where=blurred > 0)
        shape *= np.convolve(ratio, kernel[::-1])[high:high + bins]
        shape /= shape.sum()
    edges = start + SHAPE_BIN * np.arange(bins + 1)
    ranks = (stats.rankdata(x, method="ordinal") - 0.5) / len(x)
    moved = np.exp(np.interp(ranks, np.concatenate([[0.0], np.cumsum(shape)]), edges))
    out = v.copy()
    out[positive] = moved * (float(v[positive].sum()) / float(moved.sum()))
    return out


def shape_doubt(values: np.ndarray, shape: np.ndarray, scales: np.ndarray, clip: float) -> np.ndarray:
    """Per slice (``scales``: its level against the first-party ``values``), the squared log distance
    between its clip ratio E[min(s v, c)] / (s E[v]) with its values scaled from the first-party
    values and with them scaled from ``shape`` (``within_slice_values``) at the level whose clipped
    mean is the same: the two agree on what a release at this clip shows of the slice and differ in
    the tail above the clip, which no clipped release shows. 0 where the clip is above the slice's
    values or the two shapes are one (slices of one level)."""
    pool, within = ValuePool(values), ValuePool(shape)
    mean_pool = float(pool.v.mean()) if len(pool.v) else 0.0
    mean_within = float(within.v.mean()) if len(within.v) else 0.0
    s = np.asarray(scales, dtype=np.float64)
    if mean_pool <= 0 or mean_within <= 0:
        return np.zeros(len(s))
    kept = pool.clipped_means(s, clip)
    ok = kept > 0
    level = within.scales(clip, np.where(ok, kept, 1.0))
    return np.where(ok, np.log(np.where(ok, level * mean_within / (s * mean_pool), 1.0)) ** 2, 0.0)


def ratio_elasticity(values: np.ndarray, scales: np.ndarray, clip: float) -> np.ndarray:
    """|d log r / d log s| of a value query's clip ratio r(s) = E[min(s v, c)] / (s E[v]) per slice
    scale s: c P(s v >= c) / E[min(s v, c)], 0 when the clip is far above the slice's values (its
    level does not matter), 1 when far below (the ratio is c / (s E v): all of the level's
    uncertainty goes into it)."""
    pool = ValuePool(values)
    n = len(pool.v)
    s = np.asarray(scales, dtype=np.float64)
    if n == 0:
        return np.zeros(len(s))
    kept = pool.clipped_means(s, clip)
    above = n - np.searchsorted(pool.v, clip / s, side="left")
    return np.asarray(np.where(kept > 0, clip * above / n / np.where(kept > 0, kept, 1.0), 0.0), dtype=np.float64)


def robust_rmsre_tau(breakdown: ErrorBreakdown, ratio: np.ndarray, corrected: bool | Sequence[bool],
                     spread: np.ndarray, taus: np.ndarray,
                     scenarios: Sequence[tuple[float, np.ndarray, np.ndarray]], point: np.ndarray | None = None
                     ) -> float:
    """Predicted RMSRE_tau (Def. 3.2) of a release whose estimate is U / point (``corrected``: for every
    query, or per query) or U, on a pseudo-history day (``breakdown``: its truths, Alg. 4's
    expectations and variances), averaged (in squares) over ``scenarios`` (weight, truth factor, kept
    factor) per slice: under a scenario a slice's true total is the model's times its truth factor and
    the release keeps the expectation times both factors. ``spread`` (m, queries): a further variance
    of each slice's mean ``ratio`` the model cannot see (value levels through the clip). ``point``: the
    ratio the estimate divides by where it is not the mean ratio (``Calibration.point_ratio``)."""
    divisor = ratio if point is None else point
    r = np.where(np.asarray(corrected, dtype=bool), np.maximum(divisor, 1e-6), 1.0)
    total = 0.0
    weights = 0.0
    for weight, size, kept in scenarios:
        s = np.asarray(size, dtype=np.float64)[:, None]
        expected = breakdown.expected * s * np.asarray(kept, dtype=np.float64)[:, None]
        variance = (breakdown.variance * s * np.asarray(kept, dtype=np.float64)[:, None] / r**2
                    + spread * (expected / np.maximum(ratio, 1e-6)) ** 2 / r**2)
        total += weight * rmsre_tau(ErrorBreakdown(breakdown.truth * s, expected / r, variance), taus).combined ** 2
        weights += weight
    return float(np.sqrt(total / max(weights, 1e-300)))


def release_consistency(observed: np.ndarray, noise_variance: np.ndarray, expected: np.ndarray,
                        sampling_variance: np.ndarray, spread: np.ndarray | float) -> float:
    """Chi-square over degrees of freedom of the last release's main count estimates around the
    model's expectations: noise, the day's sampling and the retention ratio's relative variance
    (``spread``, per slice) in the denominator. About 1 when the model holds; large when the releases
    contradict it."""
    total = noise_variance + sampling_variance + spread * expected**2
    ok = total > 0
    if not ok.any():
        return 0.0
    return float(np.mean((observed[ok] - expected[ok]) ** 2 / total[ok]))
