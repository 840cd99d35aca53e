"""Calibration of retention ratios and the corrected estimates of the true totals."""
import dataclasses
import json
import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import araopt.calibration as cb
from araopt.calibration.correct import fieller_interval, log_ratio_interval
from araopt.io.conversions import Conversions
from araopt.mechanism.bounding import kept_mask
from araopt.mechanism.keys import KeyDomain
from araopt.mechanism.measure import measure
from araopt.mechanism.params import Params, QueryParams
from araopt.mechanism.report import Estimates
from araopt.optimize.corrected import corrected_breakdown, corrected_objective
from araopt.optimize.search import optimize
from araopt.optimize.statistics import StatisticsSpec, compute_statistics_in_memory, count_kappa, value_kappa
from factories import fitted, generate, linf


def conversions(imp, time, s, values) -> Conversions:
    return Conversions(np.asarray(imp, dtype=np.int64), np.asarray(time, dtype=np.int64), {"s": np.asarray(s)},
                       np.asarray(values, dtype=np.float64).reshape(-1, 1), ("value",))




# ------------------------------------------------------------------------------------------------
# Ratios on hand-made data
# ------------------------------------------------------------------------------------------------

def hand_made() -> Conversions:
    # slice 0: impression 1 has 3 conversions (the third is capped by C = 2), impression 2 one;
    # slice 1: impression 3 has 2 conversions, one clipped at C_l = 10
    return conversions([1, 1, 1, 2, 3, 3], [1, 2, 3, 1, 5, 6], [0, 0, 0, 0, 1, 1], [5, 20, 7, 4, 12, 3])


def test_ratios_are_exact_on_hand_made_data():
    params = linf()
    conv = hand_made()
    kept, retained = cb.retained_values(conv, params)
    assert kept.tolist() == [True, True, False, True, True, True]
    assert retained[:, 0].tolist() == [5, 10, 0, 4, 10, 3]
    stats = cb.calibration_statistics(conv, params, np.zeros(6, dtype=int))
    assert stats.slice_keys == ((0,), (1,))
    np.testing.assert_allclose(stats.ratios(), [[3 / 4, 19 / 36], [1.0, 13 / 15]])
    # cluster sums: slice 0 has clusters (n, k) = (3, 2), (1, 1)
    assert stats.quantity(0, "Stt")[0, 0] == 9 + 1 and stats.quantity(0, "Stx")[0, 0] == 6 + 1
    assert stats.quantity(0, "L")[0, 0] == 1 and stats.quantity(1, "L")[1, 0] == 1
    cal = cb.fit_calibration(stats)
    assert cal.observed.all() and cal.num_blocks == 1
    assert np.all((cal.ratio > 0) & (cal.ratio <= 1))
    # pooled count ratio: all kept / all = 5 / 6 when slices are weighted by their size (equal kappa)
    assert cal.pooled_ratio[0] == pytest.approx(5 / 6, rel=0.05)


def test_kept_follows_the_pipeline_tie_break():
    params = linf(count_limit=1)
    conv = conversions([7, 7, 7], [5, 5, 5], [0, 0, 0], [1.0, 2.0, 3.0])  # equal times: record_keys decide
    kept, _ = cb.retained_values(conv, params)
    assert kept.sum() == 1
    np.testing.assert_array_equal(kept, kept_mask(conv, params, conv.record_keys()))


def test_baseline_encoding_uses_the_expected_norm_decision():
    params = Params(count_limit=2, encoding="baseline", epsilon=1.0, slice_columns=("s",),
                    queries=(QueryParams("value", 10.0, 0.5),), count_budget_fraction=0.5)
    conv = hand_made()
    kept, _ = cb.retained_values(conv, params)
    np.testing.assert_array_equal(kept, kept_mask(conv, params, conv.record_keys()))
    cal = cb.calibrate(conv, params, np.zeros(6, dtype=int))
    assert cal.retention_checksum == cb.retention_checksum(params)


# ------------------------------------------------------------------------------------------------
# Shrinkage, unseen slices, period variance
# ------------------------------------------------------------------------------------------------

def test_shrinkage_tiny_slice_goes_to_pooled_and_huge_slice_keeps_its_own_ratio():
    rng = np.random.default_rng(3)
    lams = [3.0, 3.3, 3.6, 3.9, 4.2, 4.5, 6.0, 9.0]
    impressions = [3000, 3000, 3000, 3000, 3000, 3000, 20000, 1]  # slice 6 huge, slice 7 tiny
    conv, days = generate(rng, lams, impressions)
    params = linf(count_limit=3)
    stats = cb.calibration_statistics(conv, params, days)
    raw = stats.ratios()[:, 0]
    cal = cb.fit_calibration(stats)
    assert cal.between_slice_variance[0] > 0  # the slices differ: conversions per impression differ
    mu = cal.pooled_ratio[0]
    assert abs(cal.ratio[6, 0] - raw[6]) < 0.01 * abs(raw[6] - mu)  # huge slice: its own ratio
    # tiny slice (2 impressions) moves most of the way to the pooled ratio (or is already there)
    assert abs(cal.ratio[7, 0] - mu) <= 0.5 * abs(raw[7] - mu) + 1e-12
    assert cal.variance[7, 0] > cal.variance[6, 0]


def test_homogeneous_slices_shrink_to_pooled_and_unseen_slice_gets_a_wider_variance():
    rng = np.random.default_rng(5)
    conv, days = generate(rng, [4.0] * 6, [2000] * 6)
    params = linf(count_limit=3)
    cal = cb.calibrate(conv, params, days)
    assert np.all(cal.unseen_variance > cal.variance.max(axis=0))
    # estimates for a seen slice (0) and a slice the calibration never saw (99)
    U = np.array([[5000.0, 20000.0], [5000.0, 20000.0]])
    se = np.array([[3.0, 30.0], [3.0, 30.0]])
    est = Estimates(U, se, U - 1.96 * se, U + 1.96 * se, ("count", "value"), 0.95)
    ce = cb.correct(est, cal, {"s": [0, 99]}, params=params, period_blocks=7)
    assert ce.fallback_slices == 1 and ce.fallback[1].all() and not ce.fallback[0].any()
    np.testing.assert_allclose(ce.ratio[1], cal.pooled_ratio)
    assert np.all(ce.ratio_std_error[1] > ce.ratio_std_error[0])
    assert np.all(ce.ci_high[1] - ce.ci_low[1] > ce.ci_high[0] - ce.ci_low[0])


def test_period_effect_is_seen_by_day_and_cancels_over_a_whole_week():
    rng = np.random.default_rng(9)
    parts, blocks = [], []
    profile = [0.7, 0.8, 0.9, 1.0, 1.1, 1.6, 1.9]
    offset = 0
    for day in range(28):
        lam = 4.0 * profile[day % 7]
        conv, _ = generate(rng, [lam] * 4, [600] * 4, id_offset=offset)
        offset += 2400
        parts.append(conv)
        blocks.append(np.full(len(conv), day))
    conv = Conversions(np.concatenate([c.impression_id for c in parts]), np.concatenate([c.conversion_time for c in parts]),
                       {"s": np.concatenate([c.slices["s"] for c in parts])}, np.concatenate([c.values for c in parts]),
                       ("value",))
    cal = cb.calibrate(conv, linf(count_limit=3), np.concatenate(blocks))
    day, week = cal.period(1)[0], cal.period(7)[0]
    assert day > 1e-4  # the count ratio moves by several percent with the weekday
    assert week < 0.05 * day  # a whole week averages the cycle out
    assert cal.period(100)[0] > 0  # beyond the history: independent blocks


# ------------------------------------------------------------------------------------------------
# Accumulator: merged == sequential == one batch, bounded size
# ------------------------------------------------------------------------------------------------

def test_accumulator_merged_equals_sequential_equals_compacted():
    rng = np.random.default_rng(1)
    conv, days = generate(rng, [3.0, 5.0, 2.0], [300, 200, 100])
    params = linf(count_limit=3, clip=4.0)
    part = conv.impression_id % 3
    batches = [(conv.take(np.flatnonzero(part == b)), days[part == b]) for b in range(3)]
    one = cb.calibration_statistics(conv, params, days)
    seq = cb.create_accumulator(params)
    for c, d in batches:
        cb.add_conversions(seq, c, d)
    seq_out = cb.extract_output(seq)
    accs = [cb.add_conversions(cb.create_accumulator(params), c, d) for c, d in batches]
    merged = cb.extract_output(cb.merge_accumulators([accs[2], accs[0], accs[1]]))
    for other in (seq_out, merged):
        assert other.slice_keys == one.slice_keys and other.block_keys == one.block_keys
        np.testing.assert_allclose(other.cells, one.cells, rtol=1e-12)
        assert other.num_conversions == len(conv)
    compacted = cb.compact(seq)
    assert len(compacted.keys) == 1 and len(compacted.keys[0]) <= 3 * 7  # <= slices x blocks cells
    a = cb.fit_calibration(merged).to_json()
    b = cb.fit_calibration(one).to_json()
    np.testing.assert_allclose(a["slices"]["ratio"], b["slices"]["ratio"], rtol=1e-9)


def test_candidates_share_one_order_and_each_gets_its_own_kept_and_retained_sums():
    rng = np.random.default_rng(4)
    conv, days = generate(rng, [3.0, 6.0, 2.0], [200, 150, 100])
    conv = dataclasses.replace(conv, in_period=np.arange(len(conv)) % 4 != 0)  # every 4th row: lookback
    candidates = [(linf(count_limit=1, clip=2.0), "a"), (linf(count_limit=3, clip=4.0), "b"),
                  (linf(count_limit=7, clip=1.5), "c")]
    shared = cb.candidates_statistics(conv, candidates, days)
    inside = conv.period_mask()
    for (params, checksum), stats in zip(candidates, shared, strict=True):
        alone = cb.calibration_statistics(conv, params, days, fitted_for=checksum)
        assert stats.fitted_for == checksum and stats.slice_keys == alone.slice_keys
        np.testing.assert_array_equal(stats.cells, alone.cells)
        # the retained sums are this candidate's: min(v, C_l) over what Alg. 1 keeps of the period's rows
        kept = kept_mask(conv, params, conv.record_keys()) & inside
        clipped = np.minimum(conv.values[:, 0], params.queries[0].clip_threshold)
        for j, key in enumerate(stats.slice_keys):
            rows = kept & (conv.slices["s"] == key[0])
            assert stats.quantity(0, "X")[j].sum() == rows.sum()
            assert stats.quantity(1, "X")[j].sum() == pytest.approx(clipped[rows].sum(), rel=1e-12)
        assert stats.num_conversions == int(inside.sum())


def test_accumulator_refuses_bad_input():
    params = linf()
    acc = cb.create_accumulator(params)
    conv = hand_made()
    with pytest.raises(ValueError, match="one id per record"):
        cb.add_conversions(acc, conv, np.zeros(3))
    with pytest.raises(ValueError, match="null"):
        cb.add_conversions(acc, conv, np.array([0, 1, np.nan, 0, 0, 0]))
    with pytest.raises(ValueError, match="different parameters"):
        cb.merge_accumulators([acc, cb.create_accumulator(linf(count_limit=3))])
    with pytest.raises(ValueError, match="no conversions"):
        cb.fit_calibration(cb.extract_output(acc))


# ------------------------------------------------------------------------------------------------
# JSON round trip and refusals
# ------------------------------------------------------------------------------------------------


def test_json_round_trip(tmp_path):
    params, cal = fitted()
    cal.save(tmp_path / "calibration.json")
    assert cb.Calibration.load(tmp_path / "calibration.json", params=params).to_json() == cal.to_json()
    with pytest.raises(ValueError, match="cannot read calibration file"):
        cb.Calibration.load(tmp_path / "missing.json")
    data = json.loads(cal.to_bytes())
    back = cb.Calibration.from_json(data, params=params)
    assert back.to_json() == cal.to_json()
    assert cb.Calibration.from_bytes(cal.to_bytes()).slice_keys == cal.slice_keys
    # epsilon does not change what is kept: the calibration stays valid
    cb.Calibration.from_json(data, params=params.with_epsilon(1.0))


@pytest.mark.parametrize("path, value, message", [
    (("slices", "ratio", 0, 0), 0.0, r"\(0, 1\]"),
    (("slices", "ratio", 1, 1), 1.5, r"\(0, 1\]"),
    (("pooled", "ratio", 0), -0.2, r"\(0, 1\]"),
    (("slices", "variance", 0, 1), float("nan"), "NaN"),
    (("slices", "variance", 0, 0), -1e-6, "negative"),
    (("pooled", "unseen_variance", 1), -1.0, "negative"),
    (("slices", "kappa", 1, 0), float("inf"), "finite"),
    (("period_variance", 0, 0), float("nan"), "NaN"),
    (("params_checksum",), "", "sha256"),
    (("retention_checksum",), None, "sha256"),
])
def test_json_refusals(path, value, message):
    _, cal = fitted()
    data = json.loads(cal.to_bytes())
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(ValueError, match=message):
        cb.Calibration.from_json(data)


def test_refuses_missing_fields_unknown_format_and_checksum_mismatch():
    params, cal = fitted()
    data = cal.to_json()
    with pytest.raises(ValueError, match="missing field 'params_checksum'"):
        cb.Calibration.from_json({k: v for k, v in data.items() if k != "params_checksum"})
    with pytest.raises(ValueError, match="unsupported format"):
        cb.Calibration.from_json({**data, "format": "araopt.calibration/2"})
    with pytest.raises(ValueError, match="not valid JSON"):
        cb.Calibration.from_bytes(b"{not json")
    other = linf(count_limit=4, clip=4.0)
    with pytest.raises(ValueError, match="does not match the parameters"):
        cb.Calibration.from_json(data, params=other)
    est = Estimates(np.ones((1, 2)), np.ones((1, 2)), np.zeros((1, 2)), np.ones((1, 2)), ("count", "value"), 0.95)
    with pytest.raises(ValueError, match="does not match the parameters"):
        cb.correct(est, cal, {"s": [0]}, params=other)
    with pytest.raises(ValueError, match="queries"):
        cb.correct(Estimates(np.ones((1, 2)), np.ones((1, 2)), np.zeros((1, 2)), np.ones((1, 2)), ("count", "x"), 0.95),
                   cal, {"s": [0]})
    with pytest.raises(ValueError, match="one value per estimate row"):
        cb.correct(est, cal, {"s": [0, 1]})


# ------------------------------------------------------------------------------------------------
# Correction: no division by zero, never narrower than the noise part; unbiased (Monte Carlo)
# ------------------------------------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(u=st.lists(st.floats(-1e4, 1e6), min_size=2, max_size=2), se=st.lists(st.floats(0.0, 1e3), min_size=2, max_size=2),
       seen=st.booleans(), period=st.integers(1, 30))
def test_interval_never_narrower_than_the_noise_part(u, se, seen, period):
    params, cal = fitted()
    U, S = np.array([u]), np.array([se])
    est = Estimates(U, S, U - 1.96 * S, U + 1.96 * S, ("count", "value"), 0.95)
    ce = cb.correct(est, cal, {"s": [0 if seen else 42]}, params=params, period_blocks=period)
    for arr in (ce.estimate, ce.std_error, ce.ci_low, ce.ci_high):
        assert np.isfinite(arr).all()
    z = 1.959963984540054
    assert np.all(ce.std_error >= S - 1e-12)
    assert (ce.ci_low >= 0).all() and (ce.ci_high >= 0).all()  # a total is never negative: cut at 0
    assert np.all((ce.ci_low == 0) | (ce.estimate - ce.ci_low >= z * S - 1e-6 * (1 + np.abs(U))))
    assert np.all((ce.ci_high == 0) | (ce.ci_high - ce.estimate >= z * S - 1e-6 * (1 + np.abs(U))))
    np.testing.assert_array_equal(ce.capped_estimate, U)


def _fixed_ratio(cal: cb.Calibration, ratio: float, sd: float) -> cb.Calibration:
    """``cal`` with every slice's and the pooled ratio ``ratio`` and ratio variance ``sd``^2 from the long-run
    term alone (no period, interaction or sampling variance): var_other = sd^2 in ``correct``."""
    full = np.full_like(cal.ratio, ratio)
    return dataclasses.replace(
        cal, ratio=full, variance=np.full_like(cal.variance, sd * sd), kappa=np.zeros_like(cal.kappa),
        pooled_ratio=np.full_like(cal.pooled_ratio, ratio), unseen_variance=np.full_like(cal.unseen_variance, sd * sd),
        pooled_variance=np.zeros_like(cal.pooled_variance),
        interaction_variance=np.zeros_like(cal.interaction_variance), pooled_kappa=np.zeros_like(cal.pooled_kappa),
        period_variance=np.zeros_like(cal.period_variance))


def test_interval_keeps_the_ratios_uncertainty_when_the_capped_estimate_is_at_noise_level():
    """A small slice whose impressions convert many times: r_hat = 0.06 +/- 0.02, the capped estimate
    U = 0.8 at noise level (se = 0.5). A true total of 40 (R = 0.04, one sd below r_hat; X = 1.6, 1.6 se
    above U) is plausible, and Fieller's set (U - T r)^2 <= z^2 (se^2 + T^2 s^2) holds it. The delta
    method with X2 = max(U^2 - se^2, 0) gives est + z sd = 13.3 + 17.7 = 31 < 40 (fixed arrays, no draws)."""
    params, cal = fitted()
    r, s, z = 0.06, 0.02, 1.959963984540054
    cal = _fixed_ratio(cal, r, s)
    U = np.array([[0.8, 0.8], [0.0, 0.0]])
    se = np.full_like(U, 0.5)
    est = Estimates(U, se, U - z * se, U + z * se, ("count", "value"), 0.95)
    ce = cb.correct(est, cal, {"s": [0, 1]}, params=params, period_blocks=1)
    np.testing.assert_allclose(ce.ratio, r)
    # the old formula's upper bound, delta method with X2 = U^2 - se^2 (0.39): about 31
    old_sd = math.sqrt(0.25 / r**2 + (0.64 - 0.25) * s**2 / r**4)
    assert 0.8 / r + z * old_sd < 32.0
    assert (ce.ci_high[0] >= 40.0).all()
    a = r * r - (z * s) ** 2  # Fieller's roots, written out (z s / r = 0.65: the log-scale floor is inactive)
    high = (0.8 * r + math.sqrt(0.64 * (z * s) ** 2 + a * (z * 0.5) ** 2)) / a
    assert (ce.ci_high[0] >= high - 1e-9).all() and high > 40.0
    # U = 0: +/- z se / sqrt(r^2 - z^2 s^2), wider than the noise part z se / r (the old interval at U = 0)
    assert (ce.ci_high[1] >= z * 0.5 / math.sqrt(a) - 1e-9).all()
    assert (ce.ci_high[1] > 1.3 * z * 0.5 / r).all()
    assert (ce.std_error[1] >= (z * 0.5 / math.sqrt(a)) / z - 1e-9).all()


def test_fieller_interval_is_floored_where_the_ratio_is_not_significant():
    """z s / r >= 1: Fieller's set is unbounded; the denominator is the log-scale lower bound r exp(-z s / r)."""
    z = 1.959963984540054
    low, high = fieller_interval(np.array([2.0]), np.array([1.0]), np.array([0.1]),
                               np.array([0.1]), z)
    floor = 0.1 * math.exp(-z)
    half = math.sqrt(4.0 * (0.01 - floor**2) + floor**2 * z**2)
    np.testing.assert_allclose(high, (0.2 + half) / floor**2)
    np.testing.assert_allclose(low, (0.2 - half) / floor**2)
    assert np.isfinite(high).all() and high[0] > 2.0 / 0.1
    # a ratio at MIN_RATIO with z s / r in the thousands (a query given no budget): the floor underflows,
    # the set is unbounded, and no division by 0 warns
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        low, high = fieller_interval(np.array([2.0, 0.0]), np.array([1.0, 1.0]), np.full(2, 1e-6), np.full(2, 5e-3), z)
    assert (high > 1e100).all() and low[0] <= 0.0


def test_the_log_ratio_interval_is_the_joint_region_of_x_and_log_r_projected_on_t():
    """``log_ratio_interval``: the (X, d = log R - log r) with ((U - X) / se)^2 + (d / sigma)^2 <= z^2 and
    R <= 1, projected on T = X / R; against a brute-force projection of a fine grid of that region."""
    z = 1.959963984540054
    U = np.array([3.0, -1.0, 40.0, 0.5])
    se = np.array([1.0, 1.0, 5.0, 1.0])
    r = np.array([0.1, 0.1, 0.8, 0.05])
    sigma = np.array([0.94, 0.94, 0.6, 0.0])
    low, high = log_ratio_interval(U, se, r, sigma, z)
    for i in range(len(U)):
        d = np.linspace(-z * sigma[i], z * sigma[i], 2001) if sigma[i] > 0 else np.zeros(1)
        x = U[i] + se[i] * z * np.linspace(-1.0, 1.0, 2001)
        inside = ((U[i] - x[None, :]) / se[i]) ** 2 + (d[:, None] / max(sigma[i], 1e-300)) ** 2 * (sigma[i] > 0) <= z * z
        inside &= (r[i] * np.exp(d) <= 1.0)[:, None]
        t = np.maximum(x[None, :], 0.0) / (r[i] * np.exp(d))[:, None]
        assert high[i] == pytest.approx(t[inside].max(), rel=2e-3, abs=1e-9)
        assert low[i] == pytest.approx(t[inside].min(), rel=2e-3, abs=1e-9)
    # sigma = 0: the noise's interval over r; R <= 1 cuts the low end of the third (r = 0.8, e^d <= 1.25)
    assert high[3] == pytest.approx((0.5 + z) / 0.05) and low[3] == 0.0
    assert low[2] == pytest.approx((40.0 - 5.0 * z * math.sqrt(1.0 - (math.log(1.25) / (z * 0.6)) ** 2)) / 1.0,
                                   rel=1e-9)


def test_where_the_ratio_is_not_significant_the_interval_is_never_narrower_than_the_log_ratio_one():
    """z s / r > 0.9 (Fieller's set unbounded): ``correct``'s interval holds ``log_ratio_interval``'s with
    sigma^2 = log(1 + s^2 / r^2) (the log-normal of the ratio's mean and variance); at U = 3, se = 1,
    r_hat = 0.1, s = 0.12 the symmetric delta method's upper end (1 + z s / r) U / r is far below it."""
    params, cal = fitted()
    r, s = 0.1, 0.12
    cal = _fixed_ratio(cal, r, s)
    U = np.array([[3.0, 3.0], [-1.0, -1.0]])
    se = np.ones_like(U)
    z = 1.959963984540054
    ce = cb.correct(Estimates(U, se, U - z * se, U + z * se, ("count", "value"), 0.95), cal, {"s": [0, 1]},
                    params=params, period_blocks=1)
    low, high = log_ratio_interval(U, se, np.full_like(U, r), np.full_like(U, math.sqrt(math.log1p((s / r) ** 2))), z)
    assert (ce.ci_high >= high - 1e-9).all() and (ce.ci_low <= low + 1e-9).all()
    assert (3.0 / r) * (1.0 + z * s / r) < 0.5 * high[0, 0]
    assert (high[1] > (-1.0 + z) / r).all()  # U < 0 still has an upper end beyond the noise's over r


def test_intervals_cover_the_true_total_when_the_ratio_is_known_up_to_a_factor():
    """A slice whose ratio the model knows up to a factor (hetero-inverse's small slices at epsilon = 1:
    their value levels above the clip): the true ratio R = 0.05, its estimate r_hat = R exp(0.9 Z) with the
    stated sd s = r_hat sqrt(exp(0.81) - 1), the true total 2000 (X = 100), the capped estimate U = X +
    N(0, 40^2). Over 400 draws of r_hat (fixed seed) with 25 of U each, the 95% intervals cover the truth
    at least 95% of the time; where r_hat is too high by more than its sd the symmetric interval (before
    the log-normal ratio's) covered it less than half the time; over all draws it covered 0.85."""
    params, cal0 = fitted()
    rng = np.random.default_rng(20261130)
    R, total, se_value, sigma = 0.05, 2000.0, 40.0, 0.9
    z = 1.959963984540054
    covered, old_high_miss = [], []
    for _ in range(400):
        r_hat = R * math.exp(sigma * rng.normal())
        s = r_hat * math.sqrt(math.expm1(sigma**2))
        cal = _fixed_ratio(cal0, min(r_hat, 1.0), s)
        U = (total * R + se_value * rng.normal(size=25))[:, None] * np.ones((1, 2))
        se = np.full_like(U, se_value)
        ce = cb.correct(Estimates(U, se, U - z * se, U + z * se, ("count", "value"), 0.95), cal,
                        {"s": [0] * 25}, params=params, period_blocks=1)
        covered.extend(((ce.ci_low[:, 1] <= total) & (total <= ce.ci_high[:, 1])).tolist())
        if r_hat > R * math.exp(sigma):
            delta = np.sqrt(se_value**2 / r_hat**2 + np.maximum(U[:, 1]**2 - se_value**2, 0.0) * s**2 / r_hat**4)
            old_high_miss.extend((U[:, 1] / r_hat + z * delta < total).tolist())
    assert np.mean(covered) >= 0.95
    assert len(old_high_miss) > 500 and np.mean(old_high_miss) > 0.5


@pytest.mark.statistical
def test_corrected_estimate_is_unbiased_for_the_true_total_monte_carlo():
    rng = np.random.default_rng(11)
    lams = [4.0, 6.0, 3.0]
    params = linf(count_limit=3, clip=4.0, epsilon=64.0)
    errors, variances, covered = [], [], []
    for r in range(40):  # a fresh history and a fresh measured period per run: the joint distribution
        train, days = generate(rng, lams, [900, 900, 900])
        cal = cb.calibrate(train, params, days)
        test, _ = generate(rng, lams, [300, 300, 300], id_offset=10**7)
        dom = KeyDomain.from_slice_values(("s",), test.slices, ("value",))
        truth = np.column_stack([np.bincount(dom.slice_index(test.slices), weights=w, minlength=3)
                                 for w in (np.ones(len(test)), test.values[:, 0])])
        ce = cb.correct(measure(test, params, dom, simulation_seed=r).estimates, cal, dom, params=params, period_blocks=7)
        errors.append(ce.estimate - truth)
        variances.append(ce.std_error**2)
        covered.append((ce.ci_low <= truth) & (truth <= ce.ci_high))
    errors = np.array(errors)  # (runs, slices, queries)
    capped_bias = np.mean(ce.capped_estimate / truth - 1.0)
    assert capped_bias < -0.05  # the paper's estimate leans low by the capped and clipped share
    total_err = errors.sum(axis=1)  # per run, summed over slices
    mean = total_err.mean(axis=0)
    sem = total_err.std(axis=0, ddof=1) / math.sqrt(len(total_err))
    assert np.all(np.abs(mean) < 5 * sem), (mean, sem)
    # the stated standard errors match the realized spread (within a factor 1.6) and intervals cover
    realized = errors.reshape(-1, 2).std(axis=0)
    stated = np.sqrt(np.mean(np.array(variances).reshape(-1, 2), axis=0))
    assert np.all((realized < 1.6 * stated) & (stated < 1.6 * realized)), (realized, stated)
    assert 0.88 <= np.mean(covered) <= 0.995


# ------------------------------------------------------------------------------------------------
# Error model of the corrected estimator and the corrected objective
# ------------------------------------------------------------------------------------------------

def test_count_kappa_matches_the_calibration_and_optimizer_improves_on_the_paper_params():
    rng = np.random.default_rng(4)
    conv, days = generate(rng, [4.0] * 8, [1500] * 8)
    params = linf(count_limit=3, clip=4.0)
    # blocks hold whole impressions here, so the statistics' clusters are whole impressions too
    stats = compute_statistics_in_memory(conv, StatisticsSpec(("s",), ("value",), max_count_limit=8, period_days=None))
    cal = cb.calibrate(conv, params, days)
    k = count_kappa(stats, 3)
    assert k == pytest.approx(cal.pooled_kappa[0], rel=0.05)
    kv = value_kappa(stats, 0, 3, np.array([4.0]))[0]
    assert kv == pytest.approx(cal.pooled_kappa[1], rel=0.25)  # i.i.d. values within impressions
    bd = corrected_breakdown(stats, params)
    np.testing.assert_allclose(bd.ratio[:, 0], cal.ratio[:, 0], rtol=0.02)
    assert np.all(bd.mse >= bd.capped.variance - 1e-9)
    taus = stats.taus()
    base = corrected_objective(stats, params, taus)
    res = optimize(stats, 8.0, "linf", 8, "corrected", taus=taus, progress=False)
    assert res.params.encoding == "linf" and res.predicted_rmsre_tau <= base * 1.02
    assert len(res.per_count_limit) == 8
    with pytest.raises(ValueError, match="corrected objective supports"):
        corrected_breakdown(stats, Params(count_limit=2, encoding="l1", epsilon=1.0, slice_columns=("s",),
                                             queries=(QueryParams("value", 4.0),), l1_rounding="floor"))


@pytest.mark.statistical
def test_convolved_loss_quantiles_match_monte_carlo():
    rng = np.random.default_rng(0)
    cases = [(1.5, 3.75, 0.39, 0.3), (0.2, 1.0, 0.9, 0.05), (10.0, 4.0, 0.0, 0.1), (5.0, 50.0, 0.0, 0.0),
             (1.0, 2.0, 0.5, 2.0)]
    mean, var, zero, sd = (np.array(c) for c in zip(*cases, strict=True))
    lo, hi = cb.convolved_loss_quantiles(mean, var, zero, sd, 0.025)
    for i, (m, v, z, s) in enumerate(cases):
        m1 = m / (1 - z)
        vp = (v + m * m) / (1 - z) - m1 * m1
        n = 400_000
        draws = np.where(rng.random(n) < z, 0.0, rng.gamma(m1 * m1 / vp, vp / m1, n)) + rng.normal(0.0, s, n)
        q = np.quantile(draws, [0.025, 0.975])
        scale = math.sqrt(v + s * s)
        assert abs(lo[i] - q[0]) < 0.03 * scale and abs(hi[i] - q[1]) < 0.03 * scale, (i, lo[i], hi[i], q)


def test_string_and_multi_column_slices_match_the_key_domain():
    rng = np.random.default_rng(8)
    conv, days = generate(rng, [3.0, 5.0, 4.0], [300, 300, 300])
    country = np.where(conv.slices["s"] == 1, "US", "DE").astype(object)
    multi = Conversions(conv.impression_id, conv.conversion_time, {"s": conv.slices["s"], "country": country},
                        conv.values, ("value",))
    params = Params(count_limit=3, encoding="linf", epsilon=8.0, slice_columns=("s", "country"),
                    queries=(QueryParams("value", 4.0, 1.0),))
    cal = cb.calibrate(multi, params, days.astype(str))  # block ids may be strings (dates)
    assert set(cal.slice_keys) == {(0, "DE"), (1, "US"), (2, "DE")}
    assert cb.Calibration.from_bytes(cal.to_bytes()).slice_keys == cal.slice_keys
    dom = KeyDomain.from_slice_values(("s", "country"), multi.slices, ("value",))
    ce = cb.correct(measure(multi, params, dom, simulation_seed=1).estimates, cal, dom, params=params)
    assert ce.fallback_slices == 0 and ce.estimate.shape == (3, 2)
    frame = ce.to_frame(dom.slice_values())
    assert list(frame["country"][:2]) == ["DE", "DE"] and frame["bias_corrected"].all()


def test_the_point_ratio_moves_the_point_estimate_and_leaves_the_interval_the_mean_ratios():
    """``Calibration.point_ratio`` (the privacy-safe tuner's typical day of a heavy-tailed value): the point
    estimate is U / point_ratio, the interval is the one the mean ratio gives (it must still cover the days
    that hold the tail); a point outside it widens it; it round-trips through JSON and is validated."""
    params, cal = fitted()
    cal = _fixed_ratio(cal, 0.5, 0.05)
    point = cal.ratio.copy()
    point[:, 1] = 0.8
    with_point = dataclasses.replace(cal, point_ratio=point)
    z = 1.959963984540054
    U = np.array([[400.0, 900.0], [40.0, 90.0]])
    se = np.full_like(U, 3.0)
    est = Estimates(U, se, U - z * se, U + z * se, ("count", "value"), 0.95)
    mean = cb.correct(est, cal, {"s": [0, 1]}, params=params)
    typical = cb.correct(est, with_point, {"s": [0, 1]}, params=params)
    np.testing.assert_allclose(typical.estimate[:, 0], mean.estimate[:, 0])
    np.testing.assert_allclose(typical.estimate[:, 1], U[:, 1] / 0.8)
    np.testing.assert_allclose(typical.ratio[:, 1], 0.8)
    np.testing.assert_allclose(typical.ci_high, mean.ci_high)
    np.testing.assert_allclose(typical.ci_low, np.minimum(mean.ci_low, typical.estimate))
    assert (typical.ci_low <= typical.estimate).all() and (typical.estimate <= typical.ci_high).all()
    unseen = cb.correct(est, with_point, {"s": [42, 43]}, params=params)  # unseen slices: the pooled ratio
    np.testing.assert_allclose(unseen.estimate, U / 0.5)
    back = cb.Calibration.from_bytes(with_point.to_bytes(), params=params)
    np.testing.assert_array_equal(back.point_ratio, point)
    assert "point_ratio" not in json.loads(cal.to_bytes())["slices"]
    data = json.loads(with_point.to_bytes())
    data["slices"]["point_ratio"][0][1] = 1.5
    with pytest.raises(ValueError, match=r"point_ratio.*\(0, 1\]"):
        cb.Calibration.from_json(data)
    data["slices"]["point_ratio"] = [[0.5]]
    with pytest.raises(ValueError, match="point_ratio"):
        cb.Calibration.from_json(data)
