"""Discrete Laplace sampler against its exact pmf, variance and tails (fixed seeds: not flaky)."""
import numpy as np
import pytest
from scipy import stats

from araopt import sample_discrete_laplace
from araopt.mechanism.noise import (
    discrete_laplace_cdf,
    discrete_laplace_from_uniforms,
    discrete_laplace_pmf,
    discrete_laplace_variance,
    noise_parameter,
)
from araopt.mechanism.randomness import Simulation, keyed_uniforms, secure_generator
from araopt.version import ParameterVersion

N = 1_000_000


def test_pmf_sums_to_one_and_variance_formula():
    for a in (0.3, 1.0, 2.5):
        k = np.arange(-400, 401)
        pmf = discrete_laplace_pmf(k, a)
        assert abs(pmf.sum() - 1) < 1e-12
        assert abs((pmf * k**2).sum() - discrete_laplace_variance(a)) < 1e-9 * discrete_laplace_variance(a)
    # small a: 2 e^a / (e^a - 1)^2 -> 2 / a^2 (and computed without cancellation)
    a = 1e-7
    assert abs(discrete_laplace_variance(a) / (2 / a**2) - 1) < 1e-6


@pytest.mark.statistical
@pytest.mark.parametrize("epsilon", [0.01, 1.0, 64.0])
def test_mean_and_variance_at_production_scales(epsilon):
    a = noise_parameter(epsilon)
    x = sample_discrete_laplace(a, N, np.random.default_rng(11))
    var = discrete_laplace_variance(a)
    assert abs(x.mean()) < 5 * np.sqrt(var / N)
    # Var(s^2) = (mu4 - sigma^4)/N and DLap with small a has kurtosis ~6 (Laplace): sd(s^2)/s^2 ~ sqrt(5/N)
    assert abs(x.var() / var - 1) < 5 * np.sqrt(5 / N)


@pytest.mark.statistical
@pytest.mark.parametrize("a", [noise_parameter(1.0), 0.05, 1.0])
def test_chi_square_on_exact_quantile_bins(a):
    x = sample_discrete_laplace(a, N, np.random.default_rng(12))
    # integer bin edges at the exact quantiles: P(bin) from the closed-form CDF, merged if duplicated
    k = np.arange(-int(60 / a), int(60 / a) + 1) if a > 0.01 else None
    qs = np.linspace(0.02, 0.98, 49)
    if k is not None:
        cdf = discrete_laplace_cdf(k, a)
        edges = np.unique(k[np.searchsorted(cdf, qs)])
    else:  # continuous-scale quantiles of the Laplace with the same rate, rounded to integers
        edges = np.unique(np.round(stats.laplace.ppf(qs, scale=1 / a)).astype(np.int64))
    probs = np.diff(np.concatenate([[0.0], discrete_laplace_cdf(edges, a), [1.0]]))
    counts = np.bincount(np.searchsorted(edges, x, side="left"), minlength=len(edges) + 1)
    chi2, p = stats.chisquare(counts, probs * N)
    assert p > 1e-4, (chi2, p)


@pytest.mark.statistical
def test_point_pmf_at_a_equal_one_where_a_k0_bug_would_show():
    a = 1.0
    x = sample_discrete_laplace(a, N, np.random.default_rng(13))
    for k in range(-6, 7):
        p = discrete_laplace_pmf(k, a)
        emp = (x == k).mean()
        assert abs(emp - p) < 5 * np.sqrt(p * (1 - p) / N), (k, emp, p)


@pytest.mark.statistical
@pytest.mark.parametrize("a", [1.0, noise_parameter(10.0)])
def test_tails(a):
    x = sample_discrete_laplace(a, N, np.random.default_rng(14))
    for t in (np.ceil(np.log(1e2) / a), np.ceil(np.log(1e4) / a)):
        p = 1 - discrete_laplace_cdf(t - 1, a) + discrete_laplace_cdf(-t, a)  # P(|X| >= t)
        emp = (np.abs(x) >= t).mean()
        assert abs(emp - p) < 5 * np.sqrt(p * (1 - p) / N) + 1e-12, (t, emp, p)


def test_secure_default_is_used_without_rng_and_is_not_repeatable():
    a = 1.0
    x1 = sample_discrete_laplace(a, 200_000)
    x2 = sample_discrete_laplace(a, 200_000)
    assert not np.array_equal(x1, x2)
    var = discrete_laplace_variance(a)
    assert abs(x1.var() / var - 1) < 6 * np.sqrt(5 / 200_000)
    g = secure_generator()
    assert type(g.bit_generator).__name__ == "AESCounter"


def test_simulation_mode_is_explicit_and_repeatable():
    sim = Simulation(seed=3)
    assert np.array_equal(sim.generator().random(5), Simulation(seed=3).generator().random(5))
    keys = np.arange(10, dtype=np.uint64)
    u = keyed_uniforms(3, keys, 0)
    assert np.array_equal(u[::-1], keyed_uniforms(3, keys[::-1], 0))  # order-independent
    assert ((u >= 0) & (u < 1)).all()
    with pytest.raises(ValueError):
        Simulation(seed=-1)


def test_keyed_uniforms_make_exact_dlap():
    a = 1.0
    keys = np.arange(N, dtype=np.uint64)
    x = discrete_laplace_from_uniforms(a, keyed_uniforms(5, keys, 1), keyed_uniforms(5, keys, 2))
    for k in range(-3, 4):
        p = discrete_laplace_pmf(k, a)
        assert abs((x == k).mean() - p) < 5 * np.sqrt(p * (1 - p) / N)


@pytest.mark.parametrize("eps", [0, -1, 64.01, float("nan"), float("inf")])
def test_bad_epsilon(eps):
    with pytest.raises(ValueError, match="epsilon"):
        noise_parameter(eps)


def test_bad_a():
    with pytest.raises(ValueError):
        sample_discrete_laplace(0.0, 3)


# ---- a tiny epsilon must never release exact sums -----------------------------------------------
EPS_FLOOR = 2.0**-20


@pytest.mark.parametrize("eps", [1e-18, 1e-14, 1e-13, 9.5e-7, 0.0, -1e-9, 64.0000001, True])
def test_epsilon_outside_floor_and_ceiling_is_refused_everywhere(eps):
    from araopt import Params, QueryParams
    from araopt.errors import check_epsilon

    with pytest.raises(ValueError, match="epsilon"):
        check_epsilon(eps)
    with pytest.raises(ValueError, match="epsilon"):
        noise_parameter(eps)
    with pytest.raises(ValueError, match="epsilon"):
        Params(count_limit=1, encoding="linf", epsilon=eps, slice_columns=("s",),
               queries=(QueryParams("v", 1.0, 1.0),))
    if not isinstance(eps, bool):
        data = ParameterVersion(Params(count_limit=1, encoding="linf", epsilon=1.0, slice_columns=("s",),
                                       queries=(QueryParams("v", 1.0, 1.0),))).to_json()
        data["epsilon"] = eps
        with pytest.raises(ValueError, match="epsilon"):
            ParameterVersion.from_json(data)


def test_floor_and_ceiling_themselves_are_accepted_and_rate_is_rounded_down():
    assert noise_parameter(EPS_FLOOR) == 2.0**-36
    assert noise_parameter(64.0) == 2.0**-10
    assert noise_parameter(1.0) == 2.0**-16
    for eps in (0.1, 0.3, 7.7, EPS_FLOOR * 1.7):
        a = noise_parameter(eps)
        assert a <= eps / 65536  # never less noise than asked for
        assert (eps / 65536 - a) / (eps / 65536) < 2.0**-16
        assert a * 2**52 == int(a * 2**52)  # exactly the rational the integer sampler draws


@pytest.mark.statistical
def test_sampler_at_the_floor_matches_variance_and_exact_quantile_bins():
    a = noise_parameter(EPS_FLOOR)
    x = sample_discrete_laplace(a, N, np.random.default_rng(21))
    assert x.dtype == np.int64
    var = discrete_laplace_variance(a)
    assert abs(x.mean()) < 5 * np.sqrt(var / N)
    assert abs(x.var() / var - 1) < 5 * np.sqrt(5 / N)
    # chi-square on quantile bins; at this scale DLap's cdf is the Laplace cdf to ~1e-11
    qs = np.linspace(0.02, 0.98, 49)
    edges = np.unique(np.round(stats.laplace.ppf(qs, scale=1 / a)).astype(np.int64))
    probs = np.diff(np.concatenate([[0.0], discrete_laplace_cdf(edges, a), [1.0]]))
    counts = np.bincount(np.searchsorted(edges, x, side="left"), minlength=len(edges) + 1)
    chi2, p = stats.chisquare(counts, probs * N)
    assert p > 1e-4, (chi2, p)


@pytest.mark.statistical
def test_low_bits_of_the_noise_are_uniform_at_the_floor():
    """The float sampler's failure: at eps = 1e-13 every draw was even. Exact integers leak no low bits."""
    x = sample_discrete_laplace(noise_parameter(EPS_FLOOR), 200_000, np.random.default_rng(22))
    residues = np.bincount(np.mod(x, 64), minlength=64)
    assert stats.chisquare(residues).pvalue > 1e-4
    assert x.min() > -(2**62) and x.max() < 2**62


def test_summary_report_at_the_floor_is_noised_and_refuses_overflowing_sums():
    from araopt.mechanism.report import summary_report

    hist = np.full((50, 2), 1_000, dtype=np.int64)
    report = summary_report(hist, EPS_FLOOR)
    assert report.noisy.dtype == np.int64
    assert (report.noisy != hist).mean() > 0.99
    assert np.abs(report.noise).max() < 2**62
    with pytest.raises(ValueError, match="2\\^62"):
        summary_report(np.array([[2**62 + 1, 0]], dtype=np.int64), 1.0)
    with pytest.raises(ValueError, match="integers"):
        summary_report(np.array([[1.5, 0.0]]), 1.0)


@pytest.mark.statistical
@pytest.mark.parametrize("a", [0.7, 64.0])
def test_exact_sampler_matches_pmf_at_large_rates(a):
    x = sample_discrete_laplace(a, N, np.random.default_rng(23))
    for k in range(-3, 4):
        p = discrete_laplace_pmf(k, a)
        emp = (x == k).mean()
        assert abs(emp - p) < 5 * np.sqrt(p * (1 - p) / N) + 1e-12, (k, emp, p)


def test_sampler_shape_and_rate_refusals():
    from araopt.mechanism.noise import rate_numerator

    assert sample_discrete_laplace(1.0, (3, 4), np.random.default_rng(1)).shape == (3, 4)
    assert sample_discrete_laplace(1.0, 0, np.random.default_rng(1)).shape == (0,)
    assert rate_numerator(2.0**-36) == 2**16
    for bad in (2.0**-37, 65.0, float("nan"), float("inf"), -1.0):
        with pytest.raises(ValueError, match="parameter a"):
            sample_discrete_laplace(bad, 3, np.random.default_rng(1))


# ---- refusals, dtypes and the rounding of the rate ------------------------------------------------
from fractions import Fraction  # noqa: E402

from araopt.mechanism.noise import add_noise, rate_numerator  # noqa: E402


@pytest.mark.parametrize("a", [float("nan"), float("inf"), float("-inf"), -1.0, 0.0, -2.0**-36, 2.0**-37, 64.5])
def test_invalid_a_is_refused_by_every_function(a):
    calls = [lambda: discrete_laplace_variance(a), lambda: discrete_laplace_pmf(np.arange(3), a),
             lambda: discrete_laplace_cdf(np.arange(3), a), lambda: rate_numerator(a),
             lambda: discrete_laplace_from_uniforms(a, np.zeros(2), np.zeros(2)),
             lambda: sample_discrete_laplace(a, 4, np.random.default_rng(0))]
    for call in calls:
        with pytest.raises(ValueError, match="discrete Laplace parameter a must be a finite number"):
            call()


def test_the_domain_ends_of_a_are_accepted():
    for a in (2.0**-36, 64.0):
        assert discrete_laplace_variance(a) > 0
        assert sample_discrete_laplace(a, 3, np.random.default_rng(0)).dtype == np.int64


def test_samples_are_int64_for_every_shape():
    rng = np.random.default_rng(2)
    for size in (1, 7, (2, 3), (0,), (2, 0, 4), np.int64(5)):
        x = sample_discrete_laplace(0.5, size, rng)
        assert x.dtype == np.int64
        assert x.shape == ((int(size),) if np.ndim(size) == 0 else tuple(size))
    u = np.array([0.1, 0.9, 0.5])
    assert discrete_laplace_from_uniforms(1.0, u, u[::-1]).dtype == np.int64


def test_rate_numerator_rounds_down_to_a_multiple_of_2_to_the_minus_52():
    """The sampler draws DLap(s / 2^52) with s = floor(a 2^52) <= a 2^52: never less noise than asked."""
    for a in (0.1, 1 / 3, 2.0**-36 * 1.7, 63.999999, 1e-5):
        s = rate_numerator(a)
        assert s == int(Fraction(a) * 2**52) == (Fraction(a) * 2**52).__floor__()
        assert Fraction(s, 2**52) <= Fraction(a) < Fraction(s + 1, 2**52)
    assert rate_numerator(0.1) == 450359962737049  # 0.1 * 2^52 = 450359962737049.6...
    assert rate_numerator(64.0) == 2**58 and rate_numerator(1.0) == 2**52


def test_noise_parameter_floors_eps_over_gamma_for_any_gamma():
    for eps, gamma in ((0.1, 65536), (1.0, 1000), (3.0, 7), (64.0, 1)):
        a = noise_parameter(eps, gamma)
        assert Fraction(a) == (Fraction(eps) * 2**52 // gamma) / Fraction(2**52)
    assert noise_parameter(1.0, 1000) == int(2**52 // 1000) / 2**52 != noise_parameter(1.0)
    assert noise_parameter(2.0, np.int64(4)) == 0.5


@pytest.mark.parametrize("gamma", [0, -1, 1.5, True, "65536", None])
def test_noise_parameter_refuses_a_bad_contribution_budget(gamma):
    with pytest.raises(ValueError, match="contribution_budget must be a positive integer"):
        noise_parameter(1.0, gamma)


def test_noise_parameter_refuses_a_rate_outside_the_sampler_domain():
    assert noise_parameter(64.0, 2**42) == 2.0**-36  # eps / Gamma at the floor of a is accepted
    for eps, gamma in ((EPS_FLOOR, 2**17), (1.0, 2**37), (64.0, 2**42 + 1)):
        with pytest.raises(ValueError, match="parameter a"):
            noise_parameter(eps, gamma)


def test_add_noise_adds_in_int64_and_refuses_what_could_overflow():
    hist = np.array([[1, 2], [3, 2**62]], dtype=np.int64)
    out = add_noise(hist, np.array([[-1, 1], [0, -(2**62)]]))
    assert out.dtype == np.int64 and out.tolist() == [[0, 3], [3, 0]]
    assert add_noise(np.array([5], dtype=np.uint32), np.array([-7])).tolist() == [-2]
    assert add_noise(np.array([-(2**62)]), np.array([2**62])).tolist() == [0]
    with pytest.raises(ValueError, match="histogram must hold integers"):
        add_noise(np.array([1.0]), np.array([0]))
    with pytest.raises(ValueError, match="histogram must hold integers"):
        add_noise(np.array([True]), np.array([0]))
    with pytest.raises(ValueError, match=r"exceeds 2\^62"):
        add_noise(np.array([2**62 + 1]), np.array([0]))
    with pytest.raises(ValueError, match=r"exceeds 2\^62"):
        add_noise(np.array([0, -(2**62) - 1]), np.array([0, 0]))
    with pytest.raises(OverflowError, match="noise magnitude"):
        add_noise(np.array([0]), np.array([2**62 + 1]))
    with pytest.raises(OverflowError, match="noise magnitude"):
        add_noise(np.array([0]), np.array([-(2**62) - 1]))
    assert add_noise(np.zeros((0, 2), dtype=np.int64), np.zeros((0, 2))).shape == (0, 2)


def test_cdf_is_the_running_sum_of_the_pmf_and_pmf_is_symmetric():
    for a in (0.3, 1.0, 5.0):
        k = np.arange(-60, 8)
        running = np.cumsum(discrete_laplace_pmf(np.arange(-4000, 8), a))[-len(k):]
        np.testing.assert_allclose(discrete_laplace_cdf(k, a), running, rtol=1e-9, atol=1e-300)
        assert np.array_equal(discrete_laplace_pmf(k, a), discrete_laplace_pmf(-k, a))
        assert discrete_laplace_pmf(0, a) == pytest.approx(np.tanh(a / 2))
        assert discrete_laplace_cdf(2.7, a) == discrete_laplace_cdf(2, a)  # floor of non-integer k


def test_variance_closed_form_at_large_and_small_a():
    for a in (64.0, 5.0, 1.0, 2.0**-16, 2.0**-36):
        want = 2 * np.exp(a) / np.expm1(a) ** 2
        assert discrete_laplace_variance(a) == pytest.approx(want, rel=1e-12)


def test_from_uniforms_is_the_difference_of_two_inverted_geometrics():
    a = 0.5
    u1, u2 = np.array([0.0, 0.5, 0.9, 0.3]), np.array([0.0, 0.0, 0.5, 0.95])
    g = lambda u: np.floor(-np.log1p(-u) / a)  # noqa: E731
    assert discrete_laplace_from_uniforms(a, u1, u2).tolist() == (g(u1) - g(u2)).astype(int).tolist()
    assert discrete_laplace_from_uniforms(a, u1, u2).tolist() == [0, 1, 3, -5]


def test_exact_bernoulli_exp_neg_coins():
    """CKS Alg. 1: P(coin) = exp(-numerator / denominator); 0 -> always 1."""
    from araopt.mechanism.noise import _bernoulli_exp_neg

    rng = np.random.default_rng(31)
    n = 200_000
    assert _bernoulli_exp_neg(rng, np.zeros(1000, dtype=np.int64), 8).all()
    for num, den in ((1, 1), (1, 2), (3, 4), (2**52, 2**52)):
        p = np.exp(-num / den)
        freq = _bernoulli_exp_neg(rng, np.full(n, num, dtype=np.int64), den).mean()
        assert abs(freq - p) < 5 * np.sqrt(p * (1 - p) / n), (num, den, freq, p)
    # per-entry numerators in one call
    nums = np.repeat(np.array([0, 2, 4], dtype=np.int64), n // 4)
    coins = _bernoulli_exp_neg(rng, nums, 4)
    for v in (0, 2, 4):
        p = np.exp(-v / 4)
        assert abs(coins[nums == v].mean() - p) < 5 * np.sqrt(max(p * (1 - p), 1e-12) / (n // 4)) + 1e-12


def test_geometric_has_the_exact_tail():
    """CKS Alg. 2: P(G >= k) = exp(-k s / 2^52)."""
    from araopt.mechanism.noise import _geometric

    n = 200_000
    for a in (0.7, 2.0**-4):
        s = rate_numerator(a)
        g = _geometric(np.random.default_rng(32), s, n)
        assert g.dtype == np.int64 and g.min() >= 0
        for k in (1, 2, 5, int(3 / a)):
            p = np.exp(-k * s / 2**52)
            assert abs((g >= k).mean() - p) < 5 * np.sqrt(p * (1 - p) / n), (a, k)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_add_noise_refuses_int64_min_and_non_integer_noise():
    """np.abs(INT64_MIN) is negative: a guard on abs().max() let -2^63 (and NaN float noise cast to
    -2^63) through, releasing hist - 2^63, from which hist is exact."""
    for hist, noise in ((np.array([12345]), np.array([-(2**63)])), (np.array([-(2**63)]), np.array([5])),
                        (np.array([12345]), np.array([np.nan])), (np.array([3]), np.array([0.9]))):
        with pytest.raises((ValueError, OverflowError)):
            add_noise(hist, noise)



def test_add_noise_returns_int64_for_unsigned_inputs_and_checks_every_entry():
    out = add_noise(np.array([5, 9], dtype=np.uint64), np.array([-7, 0]))
    assert out.dtype == np.int64 and out.tolist() == [-2, 9]  # uint64 + int64 would be float64
    out = add_noise(np.array([5, 9]), np.array([3, 0], dtype=np.uint64))
    assert out.dtype == np.int64 and out.tolist() == [8, 9]
    for noise in (np.array([0, 2**62 + 1]), np.array([-(2**62) - 1, 0]), np.array([2**62 + 1, -5])):
        with pytest.raises(OverflowError, match="noise magnitude"):  # the largest |noise| is checked
            add_noise(np.array([0, 0]), noise)
    for hist in (np.array([0, 2**62 + 1]), np.array([-(2**62) - 1, 0]), np.array([2**62 + 1, -5])):
        with pytest.raises(ValueError, match=r"exceeds 2\^62"):
            add_noise(hist, np.array([0, 0]))
    with pytest.raises(ValueError, match="noise must hold integers"):
        add_noise(np.array([0]), np.array([0.0]))
    assert add_noise(np.array([2**62, -(2**62)]), np.array([-(2**62), 2**62])).tolist() == [0, 0]


class SpyGenerator:
    """A numpy Generator that records the range of every integer draw (low, high) it is asked for."""

    def __init__(self, seed):
        self.rng, self.ranges = np.random.default_rng(seed), set()

    def integers(self, low, high=None, size=None, dtype=np.int64):
        low, high = (0, low) if high is None else (low, high)
        self.ranges.add((int(low), int(high), np.dtype(dtype).name))
        return self.rng.integers(low, high, size=size, dtype=dtype)


def test_every_coin_is_a_uniform_integer_on_0_to_k_times_2_to_the_52():
    """CKS Alg. 1-2: U uniform on [0, 2^52); Bernoulli(gamma / k) as draw < numerator with draw on [0, k 2^52) or [0, k)."""
    spy = SpyGenerator(41)
    sample_discrete_laplace(0.5, 2000, spy)
    lows = {low for low, _, _ in spy.ranges}
    assert lows == {0} and {dt for _, _, dt in spy.ranges} == {"int64"}
    highs = {high for _, high, _ in spy.ranges}
    assert 2**52 in highs and 2 * 2**52 in highs and 1 in highs and 2 in highs
    assert highs <= {k * 2**52 for k in range(1, 40)} | set(range(1, 40))


def test_geometric_is_exact_beyond_2_to_the_53():
    """X = U + 2^52 V is formed in int64: with s = 1, G = X exactly, so G >= 2^53 keeps its odd values
    (float arithmetic would round every one of them to even)."""
    from araopt.mechanism.noise import _geometric

    g = _geometric(np.random.default_rng(42), 1, 20_000)
    big = g[g >= 2**53]
    assert big.size > 1000  # P(V >= 2) = e^-2
    odd = (big % 2 == 1).mean()
    assert 0.4 < odd < 0.6
    assert g.dtype == np.int64 and g.min() >= 0


def test_add_noise_accepts_array_likes():
    assert add_noise([1, 2], [3, -4]).tolist() == [4, -2]


@pytest.mark.parametrize("bad", ["0.5", b"0.5", True, np.bool_(True), None, [0.5]])
def test_noise_parameter_must_be_a_real_number_not_a_string_or_bool(bad):
    """Mixed types: "0.5" or True is a caller bug, not a noise scale (float("0.5") would accept it)."""
    with pytest.raises(TypeError, match="must be a real number"):
        rate_numerator(bad)
    with pytest.raises(TypeError, match="must be a real number"):
        discrete_laplace_variance(bad)


def test_noise_parameter_accepts_numpy_scalars():
    assert rate_numerator(np.float64(0.5)) == rate_numerator(0.5)
    assert rate_numerator(np.int64(1)) == rate_numerator(1.0)
