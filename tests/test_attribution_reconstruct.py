"""The simulated aggregation of W3C Attribution histograms (discrete Laplace of scale 2 maxValue /
epsilon) and the reconstruction of true totals (Alg. 4: divide by the value scale), with the noise's
standard deviation and intervals."""
import math

import numpy as np
import pytest

from araopt.attribution.params import AttributionQuery
from araopt.attribution.reconstruct import (
    aggregate,
    clipping_bias,
    noise_half_width,
    noise_rate,
    reconstruct,
    rounding_variance,
)
from araopt.mechanism.noise import discrete_laplace_cdf
from araopt.mechanism.randomness import Simulation


@pytest.mark.parametrize("a", [2.0**-20, 0.001, 0.05, 0.7, 3.0])
@pytest.mark.parametrize("level", [0.5, 0.9, 0.95, 0.999])
def test_the_noise_interval_is_the_smallest_that_covers_the_level(a, level):
    k = noise_half_width(a, level)
    inside = lambda k: float(discrete_laplace_cdf(np.array([k]), a)[0] - discrete_laplace_cdf(np.array([-k - 1]), a)[0])  # noqa: E731
    assert inside(k) >= level - 1e-12
    assert k == 0 or inside(k - 1) < level


def test_the_noise_rate_is_epsilon_over_twice_max_value_rounded_down():
    query = AttributionQuery("v", "v", epsilon=0.5, max_value=255, clip=50.0)
    assert noise_rate(query) <= 0.5 / 510 < noise_rate(query) + 2.0**-52


def test_estimates_are_unbiased_with_the_stated_spread_and_coverage():
    query = AttributionQuery("v", "v", epsilon=1.0, max_value=127, clip=20.0)
    truth = np.full(40_000, 5_000, dtype=np.int64)  # one index, many independent aggregations
    noisy = aggregate(truth, query, Simulation(7))
    est = reconstruct(noisy, query, level=0.9)
    errors = est.values - truth / query.value_scale
    assert abs(errors.mean()) < 4 * est.noise_sd / math.sqrt(len(truth))
    assert errors.std() == pytest.approx(est.noise_sd, rel=0.03)
    assert np.mean(np.abs(errors) <= est.half_width) == pytest.approx(0.9, abs=0.01)
    assert est.noise_sd == pytest.approx(math.sqrt(8) * query.clip / query.epsilon, rel=0.01)  # 2 b^2 / s^2


def test_the_value_scale_cancels_in_the_noise_of_an_estimate():
    """Same C and epsilon, maxValue 7 vs 2^20 - 1: the noise in the column's unit is about the same."""
    coarse = reconstruct(np.zeros(1), AttributionQuery("v", "v", epsilon=2.0, max_value=7, clip=10.0))
    fine = reconstruct(np.zeros(1), AttributionQuery("v", "v", epsilon=2.0, max_value=2**20 - 1, clip=10.0))
    assert coarse.noise_sd == pytest.approx(fine.noise_sd, rel=0.05)


def test_the_secure_aggregation_is_the_default_and_adds_noise():
    query = AttributionQuery("v", "v", epsilon=0.1, max_value=100, clip=1.0)
    noisy = aggregate(np.zeros(1000, dtype=np.int64), query)
    assert noisy.dtype == np.int64 and np.count_nonzero(noisy) > 900  # b = 2000: zero has probability < 1e-3


def test_rounding_variance_and_clipping_bias_are_the_papers_terms():
    query = AttributionQuery("v", "v", epsilon=1.0, max_value=10, clip=5.0)  # s = 2
    values = np.array([0.25, 1.0, 7.0])  # scaled 0.5, 2.0, 10.0 (clipped)
    assert rounding_variance(values, query) == pytest.approx(0.25 / 4)
    assert clipping_bias(values, query) == pytest.approx(-2.0)
