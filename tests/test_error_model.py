"""Error model pieces used by ParameterOptimization (Alg. 5): which records ContributionCapping (Alg. 1)
keeps (``kept_mask``) and RMSRE_tau (Def. 3.2) per query and combined (``rmsre_tau``)."""
import numpy as np
import pytest

from araopt import Conversions, Params, QueryParams, bound_contributions, encode
from araopt.mechanism.bounding import kept_mask
from araopt.optimize.error_model import ErrorBreakdown, rmsre_tau


def conversions(impression_id, conversion_time, values):
    values = np.asarray(values, dtype=np.float64).reshape(len(impression_id), -1)
    return Conversions(np.asarray(impression_id), np.asarray(conversion_time), {}, values,
                       tuple(f"q{i}" for i in range(values.shape[1])))


def linf(count_limit, budget=65536):
    return Params(count_limit=count_limit, encoding="linf", epsilon=1.0, slice_columns=(),
                  queries=(QueryParams("q0", 10.0, 1.0),), contribution_budget=budget)


# ---- kept_mask ---------------------------------------------------------------------------------------
def test_linf_keeps_the_first_gamma_over_floor_gamma_over_c_conversions_in_time_order():
    # input order is not time order: impression 5 has times 9, 1, 4, 7 -> the two earliest (1, 4) are kept
    conv = conversions([5, 5, 8, 5, 5, 8], [9, 1, 3, 4, 7, 2], np.ones(6))
    assert kept_mask(conv, linf(2)).tolist() == [False, True, True, True, False, True]


def test_kept_mask_honours_a_non_default_budget():
    # Gamma = 10, C = 4: every contribution uses floor(10 / 4) = 2, so 10 // 2 = 5 fit (more than C)
    conv = conversions(np.zeros(7, dtype=np.int64), np.arange(7), np.ones(7))
    assert kept_mask(conv, linf(4, budget=10)).tolist() == [True] * 5 + [False] * 2
    assert kept_mask(conv, linf(4)).tolist() == [True] * 4 + [False] * 3


def test_kept_mask_uses_the_tie_breaker():
    conv = conversions([1, 1, 1], [0, 0, 0], np.ones(3))
    assert kept_mask(conv, linf(2)).tolist() == [True, True, False]
    tie = np.array([7, 3, 5], dtype=np.uint64)
    assert kept_mask(conv, linf(2), tie).tolist() == [False, True, True]


def test_baseline_decides_with_the_expected_norm():
    # C = 2: count key floor(0.5 * 65536 / 2) = 16384, value scale 16384: a clipped value uses 32768, a zero 16384
    p = Params(count_limit=2, encoding="baseline", epsilon=1.0, slice_columns=(), count_budget_fraction=0.5,
               queries=(QueryParams("q0", 10.0, 0.5),))
    conv = conversions([3, 3, 3, 4, 4, 4, 4, 4], [0, 1, 2, 0, 1, 2, 3, 4], [10, 10, 0, 0, 10, 0, 0, 0])
    assert kept_mask(conv, p).tolist() == [True, True, False, True, True, True, False, False]
    # rounded to the nearest integer norm: 0.5 units above 16384 * 3 + 16384 still fit
    conv = conversions([0, 0, 0, 0], [0, 1, 2, 3], [0.0, 0.0, 0.0, 10 * 0.4 / 16384])  # E w = 0.4 -> rint 0
    assert kept_mask(conv, p).tolist() == [True, True, True, True]
    conv = conversions([0, 0, 0, 0], [0, 1, 2, 3], [0.0, 0.0, 0.0, 10 * 0.6 / 16384])  # E w = 0.6 -> 1
    assert kept_mask(conv, p).tolist() == [True, True, True, False]


def test_kept_mask_keeps_at_most_20_conversions_per_impression_as_chrome_does():
    conv = conversions(np.repeat([1, 2], 30), np.tile(np.arange(30), 2), np.ones(60))
    for count_limit in (20, 25, 40):  # floor(Gamma / C) fits C times; Chrome sends 20 reports per source
        assert kept_mask(conv, linf(count_limit)).reshape(2, 30).tolist() == [[True] * 20 + [False] * 10] * 2
    # baseline: count key floor(0.05 * 65536 / 2) = 1638 and zero values: 40 would fit the budget, 20 are kept
    p = Params(count_limit=2, encoding="baseline", epsilon=1.0, slice_columns=(), count_budget_fraction=0.05,
               queries=(QueryParams("q0", 10.0, 0.95),))
    conv = conversions(np.zeros(30, dtype=np.int64), np.arange(30), np.zeros(30))
    assert kept_mask(conv, p).tolist() == [True] * 20 + [False] * 10


@pytest.mark.parametrize("count_limit", [1, 3, 7, 25])
def test_kept_mask_equals_the_mechanisms_alg1_for_linf(count_limit):
    rng = np.random.default_rng(count_limit)
    n = 200
    conv = conversions(rng.integers(0, 20 if count_limit < 20 else 4, n), rng.integers(0, 6, n), rng.lognormal(1, 1, n))
    tie = rng.integers(0, 2**63, n).astype(np.uint64)
    p = linf(count_limit)
    w = encode(conv.values, p, rng)
    expected = bound_contributions(conv.impression_id, conv.conversion_time, w, tie_breaker=tie)
    assert np.array_equal(kept_mask(conv, p, tie), expected)


# ---- rmsre_tau ---------------------------------------------------------------------------------------
def breakdown():
    """2 slices x 3 queries: truth V, expectation, variance (mse = bias^2 + var)."""
    truth = np.array([[2.0, 100.0, 0.0], [50.0, 4.0, 1.0]])
    expected = np.array([[3.0, 90.0, 0.5], [50.0, 6.0, 1.0]])
    variance = np.array([[1.0, 44.0, 0.75], [25.0, 0.0, 3.0]])
    return ErrorBreakdown(truth, expected, variance)


def test_rmsre_tau_per_query_averages_over_slices_with_max_tau_truth():
    """RMSRE_tau(q) = sqrt(mean_j E(U_j - V_j)^2 / max(tau, V_j)^2) (Def. 3.2), one value per query."""
    taus = np.array([5.0, 10.0, 2.0])
    got = rmsre_tau(breakdown(), taus)
    # mse: [[2, 144, 1], [25, 4, 3]]; denominators max(tau, V)^2: [[25, 10000, 4], [2500, 100, 4]]
    want = np.sqrt([(2 / 25 + 25 / 2500) / 2, (144 / 10000 + 4 / 100) / 2, (1 / 4 + 3 / 4) / 2])
    assert got.per_query.shape == (3,)
    np.testing.assert_allclose(got.per_query, want, rtol=1e-12)
    assert got.combined == pytest.approx(np.sqrt(np.mean(want**2)), rel=1e-12)


def test_rmsre_tau_of_one_slice_and_one_query():
    b = ErrorBreakdown(np.array([[4.0]]), np.array([[1.0]]), np.array([[7.0]]))
    got = rmsre_tau(b, np.array([2.0]))
    assert got.per_query.tolist() == [pytest.approx(4.0 / 4.0)]  # sqrt((9 + 7) / 16)
    assert got.combined == pytest.approx(1.0)


def test_rmsre_tau_refusals():
    b = breakdown()
    for taus in (np.array([1.0, 1.0]), np.array([1.0, 0.0, 1.0]), np.array([1.0, -2.0, 1.0]), np.ones((3, 1))):
        with pytest.raises(ValueError, match="taus must be 3 positive numbers"):
            rmsre_tau(b, taus)
    empty = ErrorBreakdown(np.zeros((0, 3)), np.zeros((0, 3)), np.zeros((0, 3)))
    with pytest.raises(ValueError, match="empty domain"):
        rmsre_tau(empty, np.ones(3))


def test_rmsre_tau_accepts_taus_as_a_list():
    got = rmsre_tau(breakdown(), [5, 10, 2])
    np.testing.assert_allclose(got.per_query, rmsre_tau(breakdown(), np.array([5.0, 10.0, 2.0])).per_query)


def test_expected_error_refusals():
    from araopt.optimize.error_model import expected_error

    conv = conversions([1, 2], [0, 0], [1.0, 2.0])
    with pytest.raises(ValueError, match="objective must be one of"):
        expected_error(conv, np.array([0, 0]), 1, linf(1), objective="approximate")
    with pytest.raises(ValueError, match="slice_index has 1 entries for 2 records"):
        expected_error(conv, np.array([0]), 1, linf(1))
    with pytest.raises(ValueError, match="outside the domain"):
        expected_error(conv, np.array([0, -1]), 1, linf(1))
