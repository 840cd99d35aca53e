"""Correction of estimates (``correct``): T_hat = U / r_hat with its standard error and interval
(``calibration.model``'s docstring), and the measured period's length in history blocks."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pandas as pd
from scipy import special as sp_special

from araopt.calibration.calendar import Calendar
from araopt.calibration.model import MIN_RATIO, Calibration
from araopt.errors import InvalidInput, InvalidParameters
from araopt.mechanism.keys import KeyDomain, slice_value
from araopt.mechanism.params import Params
from araopt.mechanism.report import Estimates, nonnegative_interval


def period_blocks_for(calibration: Calibration, conversions: float) -> int:
    """How many history blocks a measured period with ``conversions`` conversions amounts to (>= 1):
    its size over the history's average block size."""
    per_block = float(np.sum(calibration.conversions)) / max(1, calibration.num_blocks)
    if not (per_block > 0 and np.isfinite(conversions)):
        return 1
    return max(1, int(round(float(conversions) / per_block)))



DAYS_UNKNOWN_NOTE = ("the release's days are not known (no date=YYYY-MM-DD/ partitions, no --days): the calibration's "
                     "day-of-week and special-day effects are NOT applied, so a weekend or a special day is corrected "
                     "as an average day")


@dataclass(frozen=True)
class CorrectedEstimates:
    """Estimates of the TRUE totals (m, d+1), count first, beside the paper's capped ones (Alg. 4)."""

    estimate: np.ndarray
    std_error: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    capped_estimate: np.ndarray
    capped_std_error: np.ndarray
    ratio: np.ndarray
    ratio_std_error: np.ndarray
    fallback: np.ndarray          # (m, d+1) True where the pooled ratio was used
    fallback_slices: int          # slices with a fallback in any query
    query_names: tuple[str, ...]
    confidence: float
    period_blocks: int
    retention_checksum: str
    calendar_note: str | None = None  # the calibration cannot support the period's days (console, once)
    calendar_applied: bool = False    # the period's day-type effects shifted the ratios

    def to_frame(self, slice_values: Mapping[str, Sequence[Any]] | None = None) -> pd.DataFrame:
        """Long format: one row per slice and query with estimate, std_error, ci_*, capped_*, ratio."""
        m, d1 = self.estimate.shape
        frame = pd.DataFrame({"slice": np.repeat(np.arange(m), d1), "query": np.tile(self.query_names, m)})
        if slice_values is not None:
            for c, v in slice_values.items():
                frame[c] = np.repeat(np.asarray(list(v), dtype=object), d1)
        for name in ("estimate", "std_error", "ci_low", "ci_high", "capped_estimate", "capped_std_error", "ratio",
                     "ratio_std_error", "fallback"):
            frame[name] = getattr(self, name).reshape(-1)
        frame["bias_corrected"] = True
        return frame


def _slice_rows(slices: KeyDomain | Mapping[str, Sequence[Any]], columns: tuple[str, ...], m: int) -> list[tuple[Any, ...]]:
    values = slices.slice_values() if isinstance(slices, KeyDomain) else slices
    missing = [c for c in columns if c not in values]
    if missing:
        raise InvalidInput(f"slice values lack the calibration's slice column(s) {missing}")
    cols = [list(values[c]) for c in columns]
    if any(len(c) != m for c in cols):
        raise InvalidInput(f"slice values must give one value per estimate row ({m})")
    if not columns:
        return [()] * m
    return [tuple(slice_value(v) for v in row) for row in zip(*cols, strict=True)]


def correct(estimates: Estimates, calibration: Calibration, slices: KeyDomain | Mapping[str, Sequence[Any]],
            params: Params | None = None, period_blocks: int = 1, confidence: float | None = None,
            calendar: Calendar | None = None, period_days: Sequence[Any] | None = None) -> CorrectedEstimates:
    """T_hat = U / r_hat per slice and query, with the delta-method standard error (module docstring).

    ``slices``: the domain of the estimates (``KeyDomain``) or its slice values per column, in row
    order. ``params`` (recommended) is checked against the calibration's checksum. ``period_blocks``:
    how many calibration blocks the measured period spans. Slices the calibration never saw use the
    pooled ratio with the wider unseen variance; they are counted in ``fallback_slices``. The point
    estimate divides by the calibration's ``point_ratio`` where it has one, the interval is the mean
    ratio's (``Calibration``).
    ``calendar`` and ``period_days`` (the measured period's dates, known from how it was cut, never
    from its rows): the period's day-type effects shift the ratios and their variance replaces the
    marginal period variance (``calibration.calendar``); without them the period is any P blocks and
    ``calendar_note`` says the calendar was not applied. A declared special day with fewer than
    ``MIN_SPECIAL_DAYS`` special days in the history widens the interval to the union over its
    ratio band (``CalendarAdjustment.band``). The interval is never narrower than Fieller's set of
    U / R (``fieller_interval``, ``calibration.model``'s docstring): at noise level (|U| <= se) the
    delta method's X2 = max(U^2 - se^2, 0) drops the ratio's uncertainty, Fieller's set does not.
    """
    if params is not None:
        calibration.check_params(params)
    U = np.asarray(estimates.estimate, dtype=np.float64)
    se = np.asarray(estimates.std_error, dtype=np.float64)
    if U.ndim != 2 or U.shape[1] != len(calibration.query_names):
        raise InvalidInput(f"estimates have shape {U.shape}; the calibration has {len(calibration.query_names)} queries")
    if tuple(estimates.query_names) != calibration.query_names:
        raise InvalidInput(f"estimates' queries {estimates.query_names} differ from the calibration's "
                         f"{calibration.query_names}")
    if not (np.isfinite(U).all() and np.isfinite(se).all() and (se >= 0).all()):
        raise InvalidInput("estimates and standard errors must be finite (standard errors >= 0)")
    conf = estimates.confidence if confidence is None else float(confidence)
    if not 0.0 < conf < 1.0:
        raise InvalidParameters(f"confidence must lie in (0, 1), got {confidence!r}")
    m = U.shape[0]
    rows = _slice_rows(slices, calibration.slice_columns, m)
    index = calibration.index()
    pos: np.ndarray = np.array([index.get(r, -1) for r in rows], dtype=np.int64)
    seen = pos >= 0
    safe = np.where(seen, pos, 0)
    ratio = np.where(seen[:, None], calibration.ratio[safe], calibration.pooled_ratio[None, :])
    point_source = calibration.ratio if calibration.point_ratio is None else calibration.point_ratio
    point = np.where(seen[:, None], point_source[safe], calibration.pooled_ratio[None, :])
    var_long = np.where(seen[:, None], calibration.variance[safe], calibration.unseen_variance[None, :])
    kappa = np.where(seen[:, None], calibration.kappa[safe], calibration.pooled_kappa[None, :])
    fallback = ~seen[:, None] | ~np.where(seen[:, None], calibration.observed[safe], False)
    loss_rate = np.where(seen[:, None], calibration.loss_rate[safe], calibration.pooled_loss_rate[None, :])
    period_var = calibration.period(period_blocks)
    note, applied = None, False
    adjustment = None
    if calendar is not None and period_days is None:
        note = DAYS_UNKNOWN_NOTE
    if calendar is not None and period_days is not None:
        calendar.check_calibration(calibration)
        adjustment = calendar.adjustment(period_days, calibration)
        ratio = ratio + adjustment.shift[None, :]
        point = point + adjustment.shift[None, :]
        period_var, note, applied = adjustment.variance, adjustment.note(), adjustment.effects_applied
    ratio = np.clip(ratio, MIN_RATIO, 1.0)
    point = np.clip(point, MIN_RATIO, 1.0)
    n_hat = np.maximum(U[:, 0] / ratio[:, 0], 1.0)
    var_other = (var_long + period_var[None, :]
                 + calibration.interaction_variance[None, :] / period_blocks)
    var_sampling = kappa / n_hat[:, None]
    est = U / ratio
    # the ratio terms scale with X^2; U^2 - se^2 estimates X^2 without the noise's own contribution
    # (E U^2 = X^2 + se^2), which would otherwise widen the intervals of noise-dominated slices
    X2 = np.maximum(U**2 - se**2, 0.0)
    var = se**2 / ratio**2 + X2 * (var_other + var_sampling) / ratio**4
    std = np.maximum(np.sqrt(var), se)
    tail = (1.0 - conf) / 2.0
    z = float(sp_special.ndtri(1.0 - tail))  # the normal quantile (= scipy.stats.norm.ppf; scipy.stats imports in ~1 s)
    # the loss D = T - X of the measured period (sampling part): mean U (1 - r) / r, variance from kappa,
    # no loss at all with probability exp(-expected loss events); D >= 0 (module docstring)
    pos = U > 0
    mean_loss = np.where(pos, U * (1.0 - ratio) / ratio, 0.0)
    var_loss = X2 * var_sampling / ratio**4
    zero = np.exp(-loss_rate * n_hat[:, None])
    gauss_sd = np.sqrt(se**2 / ratio**2 + X2 * var_other / ratio**4)  # noise, rounding, long-run ratio error
    w_lo, w_hi = convolved_loss_quantiles(mean_loss, var_loss, zero, gauss_sd, tail)
    ci_low = np.where(pos, est + np.minimum(w_lo - mean_loss, 0.0), est - z * std)
    ci_high = np.where(pos, est + np.maximum(w_hi - mean_loss, 0.0), est + z * std)
    noise = z * se / ratio  # never narrower than the uncorrected interval's noise part (until cut at 0)
    ci_low, ci_high = np.minimum(ci_low, est - noise), np.maximum(ci_high, est + noise)
    # never narrower than the Fieller interval of U / R: X2 above drops the ratio's uncertainty when U is at
    # noise level, where a small, uncertain ratio makes plausible true totals far above U / r (module docstring)
    # the ratio's long-run / period error as s; the count's sampling as Var(X | T) = kappa T (not kappa / N_hat:
    # N_hat = max(U / r, 1) is 1 at noise level); a value query's sampling stays in the loss convolution above
    linear = np.zeros_like(U)
    linear[:, 0] = kappa[:, 0]
    ratio_sd = np.sqrt(var_other)
    f_low, _ = fieller_interval(U, se, ratio, ratio_sd, z, linear)
    _, f_high = fieller_interval(np.maximum(U, 0.0), se, ratio, ratio_sd, z, linear)  # X >= 0: U < 0 says no less
    # only where the ratio is significantly positive (z s / r <= 0.9: Fieller's set is bounded, its floor
    # inactive); beyond, the private calibration's s of near-empty slices (synth-criteo: z ratio_std_error / r 1-16)
    # made the set ~10^3 x wider than the truth, and the convolved interval stays
    bounded = z * ratio_sd <= 0.9 * ratio
    ci_low = np.where(bounded, np.minimum(ci_low, f_low), ci_low)
    ci_high = np.where(bounded, np.maximum(ci_high, f_high), ci_high)
    # where it is not, the ratio is known up to a factor (a slice's retention or value level): the interval is
    # never narrower than ``log_ratio_interval``'s (the ratio log-normal of the same mean and variance); the
    # symmetric delta method put the upper end at (1 + z s / r) times the estimate, or z se / r at noise level,
    # below the truth of small slices whose ratio the model overstated by a factor (hetero-inverse at
    # epsilon = 1: value coverage 0.88)
    l_low, l_high = log_ratio_interval(U, se, ratio, np.sqrt(np.log1p(var_other / ratio**2)), z)
    ci_low = np.where(bounded, ci_low, np.minimum(ci_low, l_low))
    ci_high = np.where(bounded, ci_high, np.maximum(ci_high, l_high))
    std = np.maximum(std, (ci_high - ci_low) / (2.0 * z))
    if adjustment is not None and adjustment.unseen_special_weight > 0:
        # a special day unlike any in the history: the union of the intervals over its ratio band
        # (``calibration.calendar``): the interval scales by r / r' for a period ratio r'
        low_ratio, high_ratio = adjustment.band(ratio)
        low_ratio = np.maximum(low_ratio, MIN_RATIO)
        ci_high = np.maximum(ci_high, ci_high * ratio / low_ratio)
        ci_low = np.minimum(ci_low, ci_low * ratio / high_ratio)
        std = np.maximum(std, (ci_high - ci_low) / (2.0 * z))
    # the point divides by the calibration's point ratio where it has one (the typical period's, above
    # the mean ratio for a heavy-tailed value); the interval above is the mean ratio's, which covers the
    # periods that hold the tail, and never excludes the point
    est = U / point
    ci_low, ci_high = np.minimum(ci_low, est), np.maximum(ci_high, est)
    ci_low, ci_high = nonnegative_interval(ci_low, ci_high)
    return CorrectedEstimates(
        estimate=est, std_error=std, ci_low=ci_low, ci_high=ci_high,
        capped_estimate=U.copy(),
        capped_std_error=se.copy(), ratio=point, ratio_std_error=np.sqrt(var_other + var_sampling), fallback=fallback,
        fallback_slices=int(fallback.any(axis=1).sum()), query_names=calibration.query_names, confidence=conf,
        period_blocks=int(period_blocks), retention_checksum=calibration.retention_checksum,
        calendar_note=note, calendar_applied=applied,
    )


def fieller_interval(estimate: np.ndarray, std_error: np.ndarray, ratio: np.ndarray, ratio_sd: np.ndarray,
                     z: float, linear: np.ndarray | float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Fieller's confidence set of T = X / R from U ~ N(X, se^2) and r ~ N(R, s^2), independent, with an
    optional sampling variance c T of X given T (``linear`` = c; the count's kappa: Var(X | T) = kappa T):
    {T : (U - T r)^2 <= z^2 (se^2 + c T + s^2 T^2)}, i.e. a T^2 - (2 U r + z^2 c) T + (U^2 - z^2 se^2) <= 0
    with a = r^2 - z^2 s^2, b = 2 U r + z^2 c, so

        T = (b -/+ sqrt(b^2 - 4 a (U^2 - z^2 se^2))) / (2 a).

    With c = 0 and U = 0 it is +/- z se / sqrt(a), wider than z se / r by the ratio's uncertainty (the delta
    method's max(U^2 - se^2, 0) s^2 term is 0 there). When the ratio is not significantly above 0 (a <= 0)
    the set is unbounded; a retention ratio is positive with a multiplicative uncertainty there, so a is
    floored at the square of its log-scale lower bound r exp(-z s / r), which is below r^2 - z^2 s^2 whenever
    z s / r <= 0.9 (the floor only acts where Fieller's set would be near-unbounded)."""
    r = np.asarray(ratio, dtype=np.float64)
    s = np.asarray(ratio_sd, dtype=np.float64)
    U = np.asarray(estimate, dtype=np.float64)
    se = np.asarray(std_error, dtype=np.float64)
    c = np.asarray(linear, dtype=np.float64)
    # the floor underflows to 0 where z s / r is in the hundreds (a ratio at MIN_RATIO): the set is then
    # unbounded, its ends infinite (no division by 0)
    a = np.maximum(np.maximum(r * r - (z * s) ** 2, (r * np.exp(-z * s / r)) ** 2), np.finfo(np.float64).tiny)
    b = 2.0 * U * r + z * z * c
    half = np.sqrt(np.maximum(b * b - 4.0 * a * (U * U - (z * se) ** 2), 0.0))
    with np.errstate(over="ignore"):
        return (b - half) / (2.0 * a), (b + half) / (2.0 * a)


LOG_RATIO_NODES = 65
"""Grid of the ratio's log offsets over which ``log_ratio_interval`` takes the union (odd: 0 is a node)."""


def log_ratio_interval(estimate: np.ndarray, std_error: np.ndarray, ratio: np.ndarray, log_sd: np.ndarray,
                       z: float) -> tuple[np.ndarray, np.ndarray]:
    """The confidence set of T = X / R from U ~ N(X, se^2) and log r ~ N(log R, sigma^2), independent, R <= 1:
    the (X, log R) within the joint region ((U - X) / se)^2 + (d / sigma)^2 <= z^2 (d = log R - log r; its
    profile over R is Wilks' set of T at the level of z), projected on T. For each offset d with
    |d| <= z sigma, X ranges over U +/- se sqrt(z^2 - d^2 / sigma^2), so the set is the union over d of
    those X over r e^d: the upper end max_d (U + se w(d)) / (r e^d), the lower min_d max(U - se w(d), 0) /
    (r e^d), on a grid of ``LOG_RATIO_NODES`` offsets and the offset -log r (R <= 1: none above it). At sigma = 0 it
    is the noise's interval over r; where U's whole range is below 0 both ends are 0."""
    U = np.asarray(estimate, dtype=np.float64)
    se = np.asarray(std_error, dtype=np.float64)
    r = np.asarray(ratio, dtype=np.float64)
    sigma = np.maximum(np.asarray(log_sd, dtype=np.float64), 0.0)
    t = np.linspace(-1.0, 1.0, LOG_RATIO_NODES)  # d = t z sigma
    # and the offset where R = 1 (the region's edge when it lies within z sigma): d = -log r
    reach = z * sigma
    edge = np.where(reach > 0, np.minimum(-np.log(np.maximum(r, 1e-300)) / np.where(reach > 0, reach, 1.0), 1.0), 0.0)
    t = np.concatenate([np.broadcast_to(t, (*r.shape, LOG_RATIO_NODES)), edge[..., None]], axis=-1)
    d = t * reach[..., None]
    width = z * np.sqrt(np.maximum(1.0 - t * t, 0.0))  # sqrt(z^2 - d^2 / sigma^2)
    denominator = r[..., None] * np.exp(d)
    allowed = denominator <= 1.0 + 1e-12
    allowed[..., LOG_RATIO_NODES // 2] = True  # d = 0: r itself (<= 1)
    high = np.maximum(U[..., None] + se[..., None] * width, 0.0) / denominator
    low = np.maximum(U[..., None] - se[..., None] * width, 0.0) / denominator
    return (np.where(allowed, low, np.inf).min(axis=-1), np.where(allowed, high, 0.0).max(axis=-1))


_EDGES = np.concatenate([[0.0], sp_special.ndtr(np.linspace(-4.5, 4.5, 63)), [1.0]])
_LEVELS = 0.5 * (_EDGES[1:] + _EDGES[:-1])
"""Quadrature nodes (probability levels) of the gamma part: 64 cells, finer in both tails."""
_WEIGHTS = np.diff(_EDGES)


def convolved_loss_quantiles(mean: np.ndarray, variance: np.ndarray, zero_probability: np.ndarray, gauss_sd: np.ndarray,
                             tail: float) -> tuple[np.ndarray, np.ndarray]:
    """``tail`` and 1 - ``tail`` quantiles of D + G, G ~ N(0, gauss_sd^2) independent (noise, rounding,
    long-run ratio error), and D >= 0 the period's loss: D = 0 with probability ``zero_probability``,
    otherwise a gamma with the conditional mean and variance implied by (``mean``, ``variance``).

    Losses are sums of rare, large events in small slices or at a count limit well above the typical
    impression: D is then 0 most of the time and sometimes several conversions, which no symmetric
    interval covers. With many events (P(D = 0) ~ 0) D is a gamma fit (skewness 2 CV).

    CDF by quadrature over 64 gamma quantile nodes (``_LEVELS``), inverted by bisection (vectorized).
    """
    mean = np.maximum(np.asarray(mean, dtype=np.float64), 0.0)
    shape_ = mean.shape
    mean = mean.reshape(-1)
    var = (np.maximum(np.asarray(variance, dtype=np.float64), 0.0) * np.ones(shape_)).reshape(-1)
    p0 = (np.clip(np.asarray(zero_probability, dtype=np.float64), 0.0, 1.0 - 1e-9) * np.ones(shape_)).reshape(-1)
    sd = (np.maximum(np.asarray(gauss_sd, dtype=np.float64), 0.0) * np.ones(shape_)).reshape(-1)
    # work in units of the element's own scale: no under- or overflow whatever the magnitudes
    unit = np.maximum.reduce([mean, np.sqrt(var), sd])
    unit = np.where(unit > 0, unit, 1.0)
    mean, var, sd = mean / unit, (np.sqrt(var) / unit) ** 2, sd / unit
    m1 = mean / (1.0 - p0)
    vp = np.maximum((var + mean * mean) / (1.0 - p0) - m1 * m1, 1e-8 * m1 * m1 + 1e-12)
    shape = np.clip(m1 * m1 / vp, 1e-8, 1e8)
    scale = np.where(m1 > 0, m1 / shape, 0.0)
    nodes = scale[:, None] * sp_special.gammaincinv(shape[:, None], _LEVELS[None, :])  # (k, nodes)
    nodes = np.where(mean[:, None] > 0, nodes, 0.0)
    sdd = np.maximum(sd, 1e-12 * (1.0 + mean))[:, None]

    def cdf(w: np.ndarray) -> np.ndarray:
        return cast(np.ndarray, p0 * sp_special.ndtr(w / sdd[:, 0])
                    + (1.0 - p0) * (sp_special.ndtr((w[:, None] - nodes) / sdd) * _WEIGHTS[None, :]).sum(axis=1))

    span = 12.0 * (sd + np.sqrt(var + mean * mean) + nodes.max(axis=1)) + 1e-9
    out = []
    for p in (tail, 1.0 - tail):
        lo, hi = -span, span
        for _ in range(44):
            mid = 0.5 * (lo + hi)
            below = cdf(mid) < p
            lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
        out.append((0.5 * (lo + hi) * unit).reshape(shape_))
    return out[0], out[1]


