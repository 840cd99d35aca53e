"""SummaryReport (Alg. 2) and ReconstructValues (Alg. 4) with error bars, as golden specifications.

Noiseless histograms of known contributions reconstruct exactly; standard errors are Thm. 4.2 with
the exact DLap variance 2 e^a / (e^a - 1)^2, a = eps / Gamma; intervals are estimate +- z se.
"""
import numpy as np
import pytest
from scipy import stats

from araopt import Params, QueryParams, encode
from araopt.mechanism.noise import discrete_laplace_variance, noise_parameter, sample_discrete_laplace
from araopt.mechanism.report import (
    estimate_variance,
    key_histogram,
    nonnegative_interval,
    reconstruct,
    simulated_noise,
    summary_report,
)

GAMMA = 65536


def dlap_variance(a):
    """Lemma 2.5, written independently of noise.py: 2 e^a / (e^a - 1)^2."""
    return 2.0 * np.exp(a) / np.expm1(a) ** 2


def make_params(encoding, rounding="floor", count_limit=2, epsilon=1.0, budget=GAMMA):
    """Two value queries, C_1 = 2, C_2 = 30. L-inf alpha = (0.5, 0.5); baseline (0.25, 0.25) + count 0.5."""
    fr = {"linf": (0.5, 0.5), "baseline": (0.25, 0.25)}.get(encoding, (None, None))
    qs = (QueryParams("items", 2.0, fr[0]), QueryParams("value", 30.0, fr[1]))
    return Params(count_limit=count_limit, encoding=encoding, epsilon=epsilon, slice_columns=("s",), queries=qs,
                  l1_rounding=rounding, count_budget_fraction=0.5 if encoding == "baseline" else None,
                  contribution_budget=budget)


ENCODINGS = [("linf", "floor"), ("l1", "floor"), ("l1", "randomized"), ("baseline", "floor")]
# every encoded value is an integer (no rounding), and |v|_1 <= 1 for L1 (no shrinking): exact estimates
VALUES = np.array([[1.0, 15.0], [0.5, 0.0], [0.0, 7.5], [2.0, 3.75], [0.25, 0.0], [0.0, 0.0]])
SLICE = np.array([0, 0, 1, 2, 2, 2])


@pytest.mark.parametrize("encoding, rounding", ENCODINGS)
def test_noiseless_histogram_reconstructs_exactly(encoding, rounding):
    p = make_params(encoding, rounding)
    if encoding == "l1":  # keep |v|_1 <= 1: v = (items / 2, value / 30)
        vals = np.array([[1.0, 0.0], [0.5, 7.5], [0.0, 7.5], [0.5, 3.75], [0.25, 0.0], [0.0, 0.0]])
    else:
        vals = VALUES
    w = encode(vals, p, uniforms=np.full((len(vals), 2), 0.5))
    hist = key_histogram(SLICE, w, 4)
    est = reconstruct(hist, p).estimate
    assert est[:, 0].tolist() == [2, 1, 3, 0]  # count per slice (slice 3: no record)
    sums = np.zeros((4, 2))
    np.add.at(sums, SLICE, vals)
    assert np.array_equal(est[:, 1:], sums)


def test_paper_worked_example_reconstructs_rounded_value_exactly():
    # Du & Penc: one record (3 items, $21) -> (16384, 11469, 4915): items 2 (clipped), value 11469 * 30 / 16384
    p = make_params("linf")
    est = reconstruct(np.array([[16384, 11469, 4915]]), p).estimate
    assert est.tolist() == [[1.0, 2.0, 11469 * 30 / 16384]]


def test_baseline_count_comes_from_the_count_key_alone():
    p = make_params("baseline")  # count key floor(0.5 * 65536 / 2) = 16384; value keys 8192 each
    est = reconstruct(np.array([[8192, 0, 3 * 16384], [0, 4096, 16384 + 1]]), p).estimate
    assert est.tolist() == [[3.0, 2.0, 0.0], [(16384 + 1) / 16384, 0.0, 15.0]]


def test_linf_count_sums_every_column_including_bottom():
    p = make_params("linf")  # floor(Gamma / C) = 32768
    est = reconstruct(np.array([[100, 200, 32768 * 2 - 300], [1, 1, 1]]), p).estimate
    assert est[:, 0].tolist() == [2.0, 3 / 32768]


@pytest.mark.parametrize("encoding, rounding", ENCODINGS)
@pytest.mark.parametrize("epsilon, budget, count_limit", [(1.0, GAMMA, 2), (0.3, GAMMA, 3), (2.0, 1000, 3)])
def test_std_error_is_theorem_4_2_with_the_exact_dlap_variance(encoding, rounding, epsilon, budget, count_limit):
    """Value queries: (kept/4 + Var) (C_l / floor(alpha_l Gamma / C))^2 (L1 floor: no rounding term, divisor
    floor(Gamma/C)); count: (d+1) Var / floor(Gamma/C)^2; baseline count: Var / floor(alpha_0 Gamma / C)^2."""
    p = make_params(encoding, rounding, count_limit, epsilon, budget)
    var = dlap_variance(epsilon / budget)
    per_conv = budget // count_limit
    noisy = np.array([[5 * per_conv // 4, per_conv // 3, per_conv], [0, 0, 0], [-40, 7, -3 * per_conv]])
    est = reconstruct(noisy, p)
    kept = np.maximum(est.estimate[:, 0], 0.0)
    if encoding == "l1":
        divisors = np.array([per_conv, per_conv])
    else:
        divisors = np.floor(np.array(p.budget_fractions) * budget / count_limit)
    rounding_term = np.zeros((3, 1)) if (encoding, rounding) == ("l1", "floor") else kept[:, None] / 4
    want_values = (rounding_term + var) * (np.array([2.0, 30.0]) / divisors) ** 2
    if encoding == "baseline":
        want_count = np.full(3, var / np.floor(0.5 * budget / count_limit) ** 2)
    else:
        want_count = np.full(3, 3 * var / per_conv**2)
    np.testing.assert_allclose(est.std_error[:, 1:] ** 2, want_values, rtol=1e-9)
    np.testing.assert_allclose(est.std_error[:, 0] ** 2, want_count, rtol=1e-9)
    np.testing.assert_allclose(estimate_variance(p, est.estimate[:, 0]), est.std_error**2, rtol=1e-12)


def test_known_rounding_variance_replaces_the_kept_over_4_bound():
    p = make_params("linf")
    var = dlap_variance(1.0 / GAMMA)
    rv = np.array([[0.5, 2.0], [0.0, 0.25]])
    got = estimate_variance(p, np.array([10.0, 3.0]), rv)
    np.testing.assert_allclose(got[:, 1:], (rv + var) * (np.array([2.0, 30.0]) / 16384) ** 2, rtol=1e-12)
    np.testing.assert_allclose(got[:, 0], 3 * var / 32768**2, rtol=1e-12)
    # unknown rounding variance: kept / 4 per record, negative (noisy) counts clipped at 0
    got = estimate_variance(p, np.array([8.0, -5.0]))
    np.testing.assert_allclose(got[:, 1:], (np.array([[2.0], [0.0]]) + var) * (np.array([2.0, 30.0]) / 16384) ** 2,
                               rtol=1e-12)
    assert estimate_variance(p, 4.0).shape == (1, 3)


@pytest.mark.parametrize("confidence", [0.95, 0.8, 0.5])
def test_confidence_interval_is_estimate_plus_minus_z_se_cut_at_zero(confidence):
    p = make_params("linf")
    est = reconstruct(np.array([[16384, 11469, 4915], [-7, 3, 12]]), p, confidence=confidence)
    z = stats.norm.ppf(0.5 + confidence / 2)
    np.testing.assert_allclose(est.ci_low, np.maximum(est.estimate - z * est.std_error, 0.0), rtol=1e-12)
    np.testing.assert_allclose(est.ci_high, np.maximum(est.estimate + z * est.std_error, 0.0), rtol=1e-12)
    assert (est.estimate[1] - z * est.std_error[1] < 0).all() and (est.ci_low[1] == 0).all()  # the cut is used
    assert (est.std_error > 0).all()
    assert est.confidence == confidence
    assert est.query_names == ("count", "items", "value")
    if confidence == 0.95:
        assert abs(z - 1.959963984540054) < 1e-12


def test_intervals_of_counts_and_values_never_go_below_zero_and_the_estimate_is_not_cut():
    p = make_params("linf")
    noisy = np.array([[-40000, -3000, -900], [0, 0, 0], [50, -20000, 3]])
    est = reconstruct(noisy, p)
    assert (est.ci_low >= 0).all() and (est.ci_high >= 0).all()
    assert est.estimate[0, 0] < 0 and est.ci_low[0, 0] == 0.0  # the unbiased estimate stays negative
    low, high = nonnegative_interval(np.array([-1.0, np.nan, 2.0]), np.array([-0.5, np.nan, 3.0]))
    assert low[0] == 0 and high[0] == 0 and np.isnan(low[1]) and np.isnan(high[1]) and (low[2], high[2]) == (2, 3)


def test_reconstruct_refusals():
    p = make_params("linf")
    for bad in (np.zeros((2, 2)), np.zeros((2, 4)), np.zeros(3)):
        with pytest.raises(ValueError, match="summary report must be"):
            reconstruct(bad, p)
    for conf in (0.0, 1.0, 1.5, -0.1, float("nan")):
        with pytest.raises(ValueError, match="confidence"):
            reconstruct(np.zeros((1, 3)), p, confidence=conf)


# ---- the summary report: noise on every key, int64, Gamma in the noise ---------------------------------
def test_summary_report_adds_int64_noise_to_every_key():
    hist = np.array([[0, 0, 0], [16384, 11469, 4915]], dtype=np.int64)
    report = summary_report(hist, 1.0, rng=np.random.default_rng(3))
    assert report.noisy.dtype == np.int64 and report.noise.dtype == np.int64
    assert np.array_equal(report.noisy, hist + report.noise)
    assert np.array_equal(report.unnoised, hist)
    assert report.epsilon == 1.0
    same = sample_discrete_laplace(noise_parameter(1.0), hist.shape, np.random.default_rng(3))
    assert np.array_equal(report.noise, same)
    assert (report.noise != 0).all()  # a = 2^-16: P(noise = 0) ~ 7.6e-6 per key


def test_non_default_gamma_flows_through_the_noise():
    """a = eps / Gamma: with Gamma = 1000 the noise is DLap(1 / 1000), not DLap(1 / 65536)."""
    hist = np.zeros((400, 50), dtype=np.int64)
    report = summary_report(hist, 1.0, contribution_budget=1000, rng=np.random.default_rng(4))
    same = sample_discrete_laplace(noise_parameter(1.0, 1000), hist.shape, np.random.default_rng(4))
    assert np.array_equal(report.noise, same)
    var = dlap_variance(noise_parameter(1.0, 1000))
    assert abs(report.noise.var() / var - 1) < 5 * np.sqrt(5 / hist.size)
    sim = summary_report(hist[:2], 1.0, contribution_budget=1000, simulation_seed=7)
    assert np.array_equal(sim.noise, simulated_noise(7, np.arange(hist[:2].size), noise_parameter(1.0, 1000)).reshape(2, 50))


def test_simulation_mode_is_keyed_and_repeatable():
    hist = np.arange(12, dtype=np.int64).reshape(4, 3)
    a = summary_report(hist, 2.0, simulation_seed=11)
    b = summary_report(hist, 2.0, simulation_seed=11)
    assert np.array_equal(a.noisy, b.noisy) and a.noise.dtype == np.int64
    assert np.array_equal(a.noise, simulated_noise(11, np.arange(12), noise_parameter(2.0)).reshape(4, 3))
    assert not np.array_equal(a.noise, summary_report(hist, 2.0, simulation_seed=12).noise)


def test_non_default_gamma_flows_through_the_variance():
    p = make_params("linf", count_limit=3, budget=1000)  # a = 1/1000; scales floor(0.5 * 1000 / 3) = 166
    var = dlap_variance(1.0 / 1000)
    assert var != pytest.approx(discrete_laplace_variance(noise_parameter(1.0)))
    got = estimate_variance(p, np.array([0.0]))
    np.testing.assert_allclose(got[0, 1:], var * (np.array([2.0, 30.0]) / 166) ** 2, rtol=1e-9)
    np.testing.assert_allclose(got[0, 0], 3 * var / 333**2, rtol=1e-9)
    est = reconstruct(np.array([[166, 83, 84]]), p).estimate
    assert est.tolist() == [[1.0, 2.0, 15.0]]


# ---- the histogram ---------------------------------------------------------------------------------------
def test_key_histogram_sums_integer_contributions_per_key():
    w = np.array([[2**40, 1, 0], [3, 4, 5], [2**40, 0, 1]], dtype=np.int64)
    hist = key_histogram(np.array([1, 0, 1]), w, 3)
    assert hist.dtype == np.int64
    assert hist.tolist() == [[3, 4, 5], [2**41, 1, 1], [0, 0, 0]]


def test_key_histogram_refusals():
    w = np.ones((2, 3), dtype=np.int64)
    with pytest.raises(ValueError, match="slice_index outside"):
        key_histogram(np.array([0, -1]), w, 2)
    with pytest.raises(ValueError, match="slice_index outside"):
        key_histogram(np.array([0, 2]), w, 2)
    with pytest.raises(ValueError, match="align"):
        key_histogram(np.array([0]), w, 2)


def test_released_reports_and_estimates_are_immutable():
    import dataclasses

    report = summary_report(np.zeros((1, 3), dtype=np.int64), 1.0, rng=np.random.default_rng(0))
    est = reconstruct(report.noisy, make_params("linf"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.noisy = report.unnoised  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        est.estimate = est.ci_low  # type: ignore[misc]


def test_simulated_noise_is_reproducible_across_versions():
    """Simulation mode: DLap(a) from keyed streams 1001 and 1002 of (seed, key id): a golden value
    (changing the streams silently changes every published simulation)."""
    assert simulated_noise(3, np.arange(8), 0.05).tolist() == [-1, -16, -1, -4, -20, -18, 57, 39]
    assert key_histogram([1, 0, 1], np.array([[1, 2], [3, 4], [5, 6]]), 2).tolist() == [[3, 4], [6, 8]]
