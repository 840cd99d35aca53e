"""The privacy-safe tuner's model of how slices differ: value levels read from the releases' clipped
means, and the prediction that averages over what the releases cannot tell apart (each slice's own
retention: ``test_slice_retention``)."""
import dataclasses

import numpy as np
import pytest

from araopt.evaluation.metrics import realised_rmsre_tau
from araopt.mechanism.params import Params, QueryParams
from araopt.optimize.error_model import ErrorBreakdown, rmsre_tau
from araopt.optimize.heterogeneity import (
    MAX_SCALE,
    SHAPE_VARIANCE,
    SliceValues,
    ValuePool,
    ratio_elasticity,
    release_consistency,
    robust_rmsre_tau,
    shape_doubt,
    value_scales,
    within_slice_values,
)
from araopt.optimize.private import _spread, shrunk_point
from araopt.optimize.private_model import PrivateModel
from araopt.optimize.retention import MAX_SIZE, RetentionCurve
from araopt.version import ParameterVersion
from factories import fitted


def _values(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).lognormal(3.0, 0.8, n)


def test_the_clipped_mean_of_a_scaled_pool_is_exact_and_its_inverse_finds_the_scale():
    pool = ValuePool(np.array([1.0, 2.0, 4.0, 8.0]))
    assert pool.clipped_mean(1.0, 3.0) == pytest.approx((1 + 2 + 3 + 3) / 4)
    assert pool.clipped_mean(2.0, 3.0) == pytest.approx((2 + 3 + 3 + 3) / 4)
    assert pool.clipped_mean(1.0, 100.0) == pytest.approx(15 / 4)
    big = ValuePool(_values(5000, 1))
    for scale in (0.3, 1.0, 2.5):
        target = big.clipped_mean(scale, 60.0)
        assert big.scale(60.0, target) == pytest.approx(scale, rel=1e-3)


def _group(values: np.ndarray, scales: np.ndarray, counts: np.ndarray, clip: float) -> SliceValues:
    """What noiseless releases of one clip show: per slice the count and the clipped value sum."""
    pool = ValuePool(values)
    kept = np.array([pool.clipped_mean(s, clip) for s in scales]) * counts
    zeros = np.zeros(len(scales))
    return SliceValues(clip, counts.astype(float), zeros, kept, zeros)


def test_value_scales_recover_each_slices_level_from_the_releases_clipped_means():
    values = _values(20_000, 2)
    true = np.array([0.25, 0.5, 1.0, 2.0, 3.0])
    counts = np.full(5, 5000.0)
    clip = float(np.quantile(values * 3.0, 0.95))  # a clip above every slice's bulk: levels are visible
    scales, variance = value_scales([_group(values, true, counts, clip)], values, counts)
    # normalised to a conversion-weighted mean of 1: the ratios between slices are what is identified
    np.testing.assert_allclose(scales / scales[2], true / true[2], rtol=0.05)
    assert (variance > 0).all()


def test_a_clip_below_a_slices_values_bounds_its_level_from_below_without_inflating_it():
    """A saturated clipped mean measures no level but bounds it from below: the slice's level is at
    least the one at which the clip keeps 0.9 of its clipped mean's ceiling (the prior above that
    bound), neither the prior's centre (scale 1: the pseudo-history would draw the slice's values
    several-fold too low and Alg. 5 would clip them too low) nor the largest the bisection allows."""
    values = _values(20_000, 3)
    true = np.array([1.0, 1.0, 10.0])
    counts = np.array([4000.0, 4000.0, 50.0])
    clip = float(np.median(values))  # within the first slices' values, far below the third's
    scales, variance = value_scales([_group(values, true, counts, clip)], values, counts)
    bound = ValuePool(values).scale(clip, 0.9 * clip)
    assert bound > 1.3
    # the prior's mass above the bound (its centre, scale 1, was what the slice got when the bound was dropped)
    assert max(bound, 2.0) < scales[2] <= true[2] < MAX_SCALE
    # the censored slice's level is still uncertain (more than a measured slice's), but less than the prior's
    assert variance[0] < variance[2] < 1.0 + SHAPE_VARIANCE


def _slices(levels: np.ndarray, sizes: np.ndarray, sigma: float, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [level * rng.lognormal(0.0, sigma, int(n)) for level, n in zip(levels, sizes, strict=True)]


def test_the_within_slice_shape_takes_the_levels_spread_out_of_the_first_party_values():
    """First-party values mix slices whose medians differ several-fold: their log spread is a slice's
    own plus the levels'. Scaled from the mixture, a slice's clip ratio is far too low (its tail too
    heavy); scaled from the within-slice shape it is the slice's own (log-normal slices, one spread)."""
    levels = np.array([5.0, 10.0, 20.0, 40.0, 80.0])
    sizes = np.array([8000, 4000, 3000, 2000, 1000])
    slices = _slices(levels, sizes, 0.9, 5)
    pool = np.concatenate(slices)
    log_scales = np.log(levels / np.exp(np.average(np.log(levels), weights=sizes)))
    shape = within_slice_values(pool, log_scales, sizes.astype(float))
    assert np.std(np.log(shape)) == pytest.approx(0.9, abs=0.1)
    assert np.std(np.log(pool)) > 1.2
    assert shape.mean() == pytest.approx(pool.mean())  # scale 1 keeps the pool's mean
    clip = 40.0
    for values in (slices[1], slices[3]):
        true = np.minimum(values, clip).mean() / values.mean()
        for source, close in ((pool, False), (shape, True)):
            # the slice's level as a release at this clip reads it, then its ratio at that level
            p = ValuePool(source)
            s = p.scale(clip, float(np.minimum(values, clip).mean()))
            ratio = p.clipped_mean(s, clip) / (s * p.v.mean())
            assert (abs(np.log(ratio / true)) < 0.1) == close


def test_the_within_slice_shape_is_the_values_themselves_when_slices_share_a_level():
    pool = np.concatenate(_slices(np.full(4, 20.0), np.full(4, 3000), 0.9, 6))
    np.testing.assert_array_equal(within_slice_values(pool, np.zeros(4), np.ones(4)), pool)


def test_the_tail_doubt_is_what_the_mixture_and_the_within_slice_shape_disagree_on_above_the_clip():
    """At the level where both shapes keep the same clipped mean (what a release at the clip shows),
    the slice's ratio differs by their means: nothing above every value, most far below them, nothing
    when the slices share a level (the two shapes are one)."""
    levels = np.array([5.0, 10.0, 20.0, 40.0, 80.0])
    sizes = np.array([8000, 4000, 3000, 2000, 1000])
    pool = np.concatenate(_slices(levels, sizes, 0.9, 7))
    log_scales = np.log(levels / np.exp(np.average(np.log(levels), weights=sizes)))
    shape = within_slice_values(pool, log_scales, sizes.astype(float))
    scales = np.exp(log_scales)
    top = shape_doubt(pool, shape, scales, float(pool.max()) * 100)
    np.testing.assert_allclose(top, 0.0, atol=1e-12)
    low, mid = shape_doubt(pool, shape, scales, 10.0), shape_doubt(pool, shape, scales, 100.0)
    assert (low > mid).all() and (mid > 0).all()
    # the distance is the one between the two ratios at that clip
    k, clip = 3, 30.0
    kept = ValuePool(pool).clipped_mean(scales[k], clip)
    ratio_pool = kept / (scales[k] * pool.mean())
    level = ValuePool(shape).scale(clip, kept)
    ratio_within = kept / (level * shape.mean())
    assert shape_doubt(pool, shape, scales[k:k + 1], clip)[0] == pytest.approx(np.log(ratio_pool / ratio_within) ** 2)
    assert ratio_within > ratio_pool  # the mixture's tail is the heavier
    np.testing.assert_allclose(shape_doubt(pool, pool, scales, 10.0), 0.0, atol=1e-12)


def test_the_value_ratios_variance_carries_the_tail_doubt_and_the_counts_does_not():
    """``private._spread``: a value query's ratio variance adds ``shape_doubt`` times its ratio squared
    at the query's clip; the count's is the retention's only."""
    levels = np.array([5.0, 40.0])
    sizes = np.array([6000, 2000])
    values = np.concatenate(_slices(levels, sizes, 0.9, 8))[:, None]
    scales = levels / np.exp(np.average(np.log(levels), weights=sizes))
    shape = within_slice_values(values[:, 0], np.log(scales), sizes.astype(float))[:, None]
    keys = [(0,), (1,)]
    curve = RetentionCurve(np.eye(1, MAX_SIZE)[0])
    model = PrivateModel(curve, {k: np.array([float(n)]) for k, n in zip(keys, sizes, strict=True)}, values, 10,
                         value_scales={k: np.array([s]) for k, s in zip(keys, scales, strict=True)},
                         scale_variances={k: np.array([0.3]) for k in keys})
    params = Params(count_limit=2, encoding="linf", epsilon=1.0, slice_columns=("campaign",),
                    queries=(QueryParams("value", 12.0, 1.0),))
    ratio = np.array([[0.9, 0.5], [0.8, 0.3]])
    plain = _spread(model, params, ratio, keys)
    doubted = _spread(dataclasses.replace(model, value_shape=shape), params, ratio, keys)
    np.testing.assert_allclose(doubted[:, 0], plain[:, 0])
    expected = shape_doubt(values[:, 0], shape[:, 0], scales, 12.0) * ratio[:, 1] ** 2
    assert (expected > 0).all()
    np.testing.assert_allclose(doubted[:, 1] - plain[:, 1], expected)


def test_the_ratio_elasticity_is_zero_for_a_high_clip_and_one_for_a_low_clip():
    values = _values(10_000, 4)
    np.testing.assert_allclose(ratio_elasticity(values, np.array([1.0]), float(values.max()) * 10), 0.0)
    assert ratio_elasticity(values, np.array([1.0]), float(values.min()) / 10)[0] == pytest.approx(1.0)


def test_the_robust_prediction_is_the_plain_one_when_the_model_is_certain():
    truth = np.array([[10.0, 200.0], [40.0, 900.0]])
    expected = truth * 0.5
    variance = np.array([[4.0, 900.0], [9.0, 1600.0]])
    taus = np.array([5.0, 100.0])
    breakdown = ErrorBreakdown(truth, expected, variance)
    ratio = np.full_like(truth, 0.5)
    zero = np.zeros_like(truth)
    ones = np.ones(2)
    certain = [(1.0, ones, ones)]
    corrected = robust_rmsre_tau(breakdown, ratio, True, zero, taus, certain)
    assert corrected == pytest.approx(rmsre_tau(ErrorBreakdown(truth, expected / 0.5, variance / 0.25), taus).combined)
    capped = robust_rmsre_tau(breakdown, ratio, False, zero, taus, certain)
    assert capped == pytest.approx(rmsre_tau(breakdown, taus).combined)
    # per query: the count divided, the value capped
    count_only = robust_rmsre_tau(breakdown, ratio, [True, False], zero, taus, certain)
    mixed = ErrorBreakdown(truth, expected / np.array([0.5, 1.0]), variance / np.array([0.25, 1.0]))
    assert count_only == pytest.approx(rmsre_tau(mixed, taus).combined)
    # a slice whose retention may be another (its truth another for the same kept counts) never makes
    # the corrected estimate look better: the scenarios average in squares
    doubt = [(1.0, np.array([1.0, 0.8]), np.array([1.0, 1.25])), (1.0, ones, ones),
             (1.0, np.array([1.0, 1.25]), np.array([1.0, 0.8]))]
    assert robust_rmsre_tau(breakdown, ratio, True, zero, taus, doubt) > corrected
    # a point ratio (``Calibration.point_ratio``) is what the estimate divides by; the doubt of the ratio
    # (``spread``) is about the mean ratio: T_hat's variance from it is (X / ratio)^2 spread / point^2
    point = np.full_like(truth, 0.6)
    spread = np.full_like(truth, 0.01)
    got = robust_rmsre_tau(breakdown, ratio, True, spread, taus, certain, point)
    want = ErrorBreakdown(truth, expected / 0.6, variance / 0.36 + 0.01 * (expected / 0.5) ** 2 / 0.36)
    assert got == pytest.approx(rmsre_tau(want, taus).combined)
    assert robust_rmsre_tau(breakdown, ratio, [True, False], spread, taus, certain, point) == pytest.approx(
        rmsre_tau(ErrorBreakdown(truth, expected / np.array([0.6, 1.0]),
                                 variance / np.array([0.36, 1.0]) + 0.01 * (expected / 0.5) ** 2
                                 / np.array([0.36, 1.0])), taus).combined)


def test_the_model_check_grows_with_the_scatter_and_forgives_what_the_retention_admits():
    expected = np.array([100.0, 50.0, 10.0])
    noise = np.full(3, 4.0)
    assert release_consistency(expected, noise, expected, expected, 0.0) == pytest.approx(0.0)
    off = expected * np.array([1.5, 0.6, 2.0])
    strict = release_consistency(off, noise, expected, expected, 0.0)
    assert strict > 4.0
    assert release_consistency(off, noise, expected, expected, np.array([0.3, 0.3, 1.0])) < strict


def test_realised_rmsre_tau_refuses_mismatched_shapes_and_taus():
    with pytest.raises(ValueError, match="one positive tau per query"):
        realised_rmsre_tau(np.zeros((2, 2)), np.zeros((2, 2)), np.array([5.0]))
    with pytest.raises(ValueError, match="one positive tau per query"):
        realised_rmsre_tau(np.zeros((2, 2)), np.zeros((2, 2)), np.array([5.0, 0.0]))


def heterogeneous_log(days: int, per_day: int, seed: int):
    """8 slices of uneven size (Zipf), Geometric conversions per impression with a mean per slice (1 to
    12, the largest slices converting most), value medians a few times apart per slice, a few huge
    orders; conversions spread over 5 days after their impression (a steady state from day 0)."""
    from araopt.io.conversions import Conversions

    day_us = 86_400_000_000
    rng = np.random.default_rng(seed)
    m = 8
    weight = 1.0 / np.arange(1, m + 1) ** 1.3
    weight /= weight.sum()
    mean_size = np.array([12.0, 8.0, 5.0, 3.0, 2.0, 1.5, 1.2, 1.0])
    median = 24.0 * np.array([1.0, 0.3, 3.0, 0.5, 2.0, 1.0, 4.0, 0.25])
    first = 20_000
    ids, times, vals, slices = [], [], [], []
    next_id = 0
    for day in range(-6, days):
        n = rng.poisson(per_day * weight / mean_size)
        s = np.repeat(np.arange(m), n)
        size = rng.geometric(1.0 / mean_size[s])
        rep = np.repeat(np.arange(len(s)), size)
        t0 = (first + day) * day_us + rng.integers(0, day_us, len(s))
        sl = s[rep]
        value = median[sl] * rng.lognormal(0.0, 0.9, len(rep))
        huge = rng.random(len(rep)) < 0.01
        value[huge] *= 30.0
        ids.append(next_id + rep)
        times.append(t0[rep] + rng.integers(0, 5 * day_us, len(rep)))
        vals.append(value)
        slices.append(sl)
        next_id += len(s)
    t = np.concatenate(times)
    keep = (t >= first * day_us) & (t < (first + days) * day_us)
    return Conversions(np.concatenate(ids)[keep].astype(np.int64), t[keep], {"s": np.concatenate(slices)[keep]},
                       np.concatenate(vals)[keep].reshape(-1, 1), ("value",))


@pytest.mark.slow
def test_slices_that_differ_do_not_collapse_the_private_clip_below_the_cold_starts_error():
    """On a log whose slices differ in conversions per impression and value level, the privacy-safe
    tuner (which once read every slice through the pooled ratio and a pseudo-history of identical
    slices, and so moved the clip to a fraction of the values' median) publishes parameters whose
    realised error is not worse than its own cold start's, with a clip of the values' order."""
    from araopt.evaluation.replay import COLD_START, PRIVATE_SAFE, ReplayConfig, replay
    from araopt.mechanism.keys import KeyDomain

    conv = heterogeneous_log(8, 3000, seed=5)
    domain = KeyDomain.from_slice_values(("s",), {"s": np.arange(8)}, ("value",))
    frame = replay(conv, domain, ReplayConfig(1.0, window_days=4, lookback_days=10, days=4))
    private = frame[frame["method"] == PRIVATE_SAFE].set_index("day").sort_index()
    cold = frame[frame["method"] == COLD_START].set_index("day").sort_index()
    median = float(np.median(conv.values[:, 0]))
    tuned = private.iloc[1:]  # day 1 is the cold start itself
    assert (tuned["clip_value"] > 0.25 * median).all(), tuned["clip_value"].tolist()
    assert tuned["rmsre_tau"].mean() <= 1.1 * cold["rmsre_tau"].iloc[1:].mean()


def test_a_heavy_tailed_value_is_corrected_for_the_typical_day_not_the_mean_one():
    """``private.typical_day_factors``: dividing a day's clipped value by the mean ratio E[min(v, c)] / E[v]
    over-corrects the days that hold no huge order (most of a small slice's days); the ratio that
    minimises a day's mean squared relative error, E[x^2] / E[x] with x the day's clipped share, is the
    factor times the mean one: checked here against that error minimised over a grid of ratios on
    days drawn apart. Values without a tail keep the mean ratio (factor 1), large slices nearly."""
    from araopt.optimize.private import typical_day_factors

    rng = np.random.default_rng(4)
    heavy = np.where(rng.random(40_000) < 0.01, 200.0 * (1 + rng.pareto(1.5, 40_000)), rng.lognormal(3.0, 0.5, 40_000))
    clip = 40.0
    keys = [(0,), (1,), (2,)]
    model = PrivateModel(RetentionCurve(np.eye(1, MAX_SIZE)[0]),
                         {(0,): np.array([20.0]), (1,): np.array([300.0]), (2,): np.array([20.0])},
                         heavy[:, None], 10, value_scales={(0,): np.array([1.0]), (1,): np.array([1.0]),
                                                           (2,): np.array([0.5])})
    factors = typical_day_factors(model, keys, 0, clip)
    np.testing.assert_array_equal(factors, typical_day_factors(model, keys, 0, clip))  # seeded: same inputs, same bytes
    assert factors[0] > 1.15 and 1.0 < factors[1] < factors[0]  # fewer huge orders a day in a small slice
    mean = np.minimum(heavy, clip).mean() / heavy.mean()
    days = heavy[np.random.default_rng(9).integers(0, len(heavy), (4000, 20))]
    x = np.minimum(days, clip).sum(axis=1) / days.sum(axis=1)
    grid = mean * np.linspace(0.8, 3.0, 441)
    best = grid[np.argmin([np.mean((x / g - 1.0) ** 2) for g in grid])]
    assert factors[0] * mean == pytest.approx(best, rel=0.05)
    halved = np.minimum(heavy, 2 * clip).mean() / heavy.mean()  # a slice at half the level: clip 2c on the pool
    x_half = np.minimum(days, 2 * clip).sum(axis=1) / days.sum(axis=1)
    assert factors[2] * halved == pytest.approx(np.mean(x_half**2) / np.mean(x_half), rel=0.05)
    flat = dataclasses.replace(model, values=np.full((1000, 1), 25.0))
    np.testing.assert_allclose(typical_day_factors(flat, keys, 0, clip), 1.0)


def test_the_published_point_divides_by_the_ratio_that_minimises_its_expected_squared_error():
    """``private.shrunk_point``: with the slice's retention R known only to within the calibration's
    variance, U / p = R T / p has expected squared error E[(R / p - 1)^2] T^2, least at p = E[R^2] / E[R]
    = r (1 + Var(R) / r^2), not at r (dividing by r over-corrects whenever R is uncertain: hetero-retail
    at epsilon = 1 published counts biased +0.2 to +0.45). Checked against that error minimised over a
    grid on ratios drawn apart. Every query's ratio holds the retention, so the values' points (the
    typical day's) move by the count's factor, never by their own variance (the value level's and
    tail's doubt, sized for the intervals); a slice without doubt or with an unobserved count, and a
    capped release ("none"), keep their points; the interval's mean ratio is unchanged and no ratio
    exceeds 1."""
    params, cal = fitted()
    ratio = np.full_like(cal.ratio, 0.5)
    variance = np.zeros_like(cal.variance)
    variance[0] = [0.04, 0.09]  # slice 0: its retention uncertain (sd 0.2 on 0.5), its value more so
    variance[1] = [0.04, 0.0]  # slice 1: as uncertain, but its count unobserved (the pooled ratio)
    point = ratio.copy()
    point[:, 1] = 0.6  # the typical day's ratio of the value
    observed = np.ones_like(cal.observed)
    observed[1, 0] = False
    cal = dataclasses.replace(cal, ratio=ratio, variance=variance, point_ratio=point, observed=observed)
    version = ParameterVersion(params, calibration=cal, correction="ratio")
    shrunk = shrunk_point(version).calibration
    assert shrunk is not None and shrunk.point_ratio is not None
    factor = 1 + 0.04 / 0.25
    np.testing.assert_allclose(shrunk.point_ratio[0], [0.5 * factor, 0.6 * factor])
    np.testing.assert_array_equal(shrunk.point_ratio[1], point[1])
    np.testing.assert_array_equal(shrunk.ratio, cal.ratio)
    draws = np.random.default_rng(3).normal(0.5, 0.2, 200_000)
    grid = np.linspace(0.4, 0.8, 401)
    best = grid[np.argmin([np.mean((draws / p - 1.0) ** 2) for p in grid])]
    assert best == pytest.approx(0.5 * factor, abs=0.003)
    counted = shrunk_point(dataclasses.replace(version, correction="count")).calibration
    assert counted is not None and counted.point_ratio is not None
    np.testing.assert_array_equal(counted.point_ratio, shrunk.point_ratio)  # publishes the count divided alike
    capped = dataclasses.replace(version, correction="none")
    assert shrunk_point(capped) is capped
    certain = dataclasses.replace(cal, variance=np.zeros_like(variance))
    kept = shrunk_point(dataclasses.replace(version, calibration=certain)).calibration
    assert kept is not None and kept.point_ratio is not None
    np.testing.assert_array_equal(kept.point_ratio, point)
    high = dataclasses.replace(cal, ratio=np.full_like(ratio, 0.9), point_ratio=None,
                               variance=np.full_like(variance, 0.81))
    lifted = shrunk_point(dataclasses.replace(version, calibration=high)).calibration
    assert lifted is not None and lifted.point_ratio is not None
    np.testing.assert_array_equal(lifted.point_ratio[0], [1.0, 1.0])  # factor 2: never above 1
