"""The privacy-safe tuner's model of how slices differ: value levels read from the releases' clipped
means, and the prediction that averages over what the releases cannot tell apart (each slice's own
retention: ``test_slice_retention``)."""
import numpy as np
import pytest

from araopt.evaluation.metrics import realised_rmsre_tau
from araopt.optimize.error_model import ErrorBreakdown, rmsre_tau
from araopt.optimize.heterogeneity import (
    MAX_SCALE,
    SHAPE_VARIANCE,
    SliceValues,
    ValuePool,
    ratio_elasticity,
    release_consistency,
    robust_rmsre_tau,
    value_scales,
)


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
