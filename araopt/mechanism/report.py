"""Summary report (Alg. 2) over a declared key domain, and reconstruction (Alg. 4) with error bars.

Histograms are (m, d+1) int64 arrays: one row per domain slice, the encoder's columns (value
queries in params order, then bottom / count). Estimates are (m, d+1) float arrays in the paper's
U order: column 0 is the count q_0, columns 1..d the value queries.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtri

from araopt.constants import CONTRIBUTION_BUDGET
from araopt.errors import InvalidInput, InvalidParameters
from araopt.mechanism.aggregate import domain_sums
from araopt.mechanism.encoding import count_scale, query_scales
from araopt.mechanism.noise import (
    add_noise,
    discrete_laplace_from_uniforms,
    discrete_laplace_variance,
    noise_parameter,
    sample_discrete_laplace,
)
from araopt.mechanism.params import Encoding, Params
from araopt.mechanism.randomness import keyed_uniforms


def key_histogram(slice_index: np.ndarray, contributions: np.ndarray, num_slices: int) -> np.ndarray:
    """Per-key integer sums over the domain: (m, d+1) int64; every domain key present (zeros too).

    Records with ``slice_index < 0`` (outside the domain) must be removed by the caller.
    """
    slice_index = np.asarray(slice_index, dtype=np.int64)
    if slice_index.size and slice_index.min() < 0:
        raise InvalidInput("slice_index outside [0, num_slices): filter records outside the domain first")
    kept = np.ones(slice_index.shape[0], dtype=bool)
    return domain_sums(slice_index, contributions, kept, num_slices).histogram


@dataclass(frozen=True)
class SummaryReport:
    """Alg. 2 output: noisy metric per key, plus (debug run only) the unnoised metric and the noise."""

    noisy: np.ndarray
    unnoised: np.ndarray
    noise: np.ndarray
    epsilon: float


def simulated_noise(seed: int, key_ids: np.ndarray, a: float) -> np.ndarray:
    """SIMULATION ONLY: DLap(a) per key from (seed, key id): identical however the data is split."""
    return discrete_laplace_from_uniforms(a, keyed_uniforms(seed, key_ids, 1001), keyed_uniforms(seed, key_ids, 1002))


def summary_report(
    histogram: np.ndarray, epsilon: float, contribution_budget: int = CONTRIBUTION_BUDGET,
    rng: np.random.Generator | None = None, simulation_seed: int | None = None,
) -> SummaryReport:
    """W = sum + DLap(eps / Gamma) on every domain key (Alg. 2), including keys with no contribution.

    Noise is drawn from the secure generator unless ``rng`` (tests) or ``simulation_seed``
    (explicit, key-deterministic simulation mode) is given.
    """
    hist = np.asarray(histogram)
    a = noise_parameter(epsilon, contribution_budget)
    if simulation_seed is not None:
        noise = simulated_noise(simulation_seed, np.arange(hist.size), a).reshape(hist.shape)
    else:
        noise = sample_discrete_laplace(a, hist.shape, rng)
    return SummaryReport(noisy=add_noise(hist, noise), unnoised=hist, noise=noise, epsilon=float(epsilon))


@dataclass(frozen=True)
class Estimates:
    """Reconstructed estimates U (Alg. 4) with standard errors and confidence intervals, (m, d+1);
    the intervals never go below 0 (``nonnegative_interval``)."""

    estimate: np.ndarray
    std_error: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    query_names: tuple[str, ...]  # ("count", q_1, ..., q_d)
    confidence: float


def estimate_variance(params: Params, kept_count: np.ndarray | float,
                      rounding_variance: np.ndarray | None = None) -> np.ndarray:
    """Var of each estimate (count, q_1..q_d) per slice from Thm. 4.2 with the exact DLap variance.

    ``rounding_variance`` (m, d) is sum f(1-f) over kept records; when unknown (reconstruction from
    a report) it is bounded by kept_count / 4, which makes the value-query variance an upper bound.
    """
    v_noise = discrete_laplace_variance(noise_parameter(params.epsilon, params.contribution_budget))
    kept = np.atleast_1d(np.asarray(kept_count, dtype=np.float64))
    m, d = kept.shape[0], params.num_queries
    if params.encoding == Encoding.L1 and params.l1_rounding == "floor":
        round_var = np.zeros((m, d))
    elif rounding_variance is None:
        round_var = np.repeat(np.maximum(kept, 0.0)[:, None] / 4.0, d, axis=1)
    else:
        round_var = np.asarray(rounding_variance, dtype=np.float64).reshape(m, d)
    thresholds = np.array([q.clip_threshold for q in params.queries])
    factor = (thresholds / query_scales(params)) ** 2
    out = np.empty((m, d + 1))
    out[:, 1:] = (round_var + v_noise) * factor[None, :]
    if params.encoding == Encoding.BASELINE:
        out[:, 0] = v_noise / count_scale(params) ** 2
    else:  # W_bottom + sum_l W_l: rounding cancels, d+1 independent noises (Thm. 4.2)
        out[:, 0] = (d + 1) * v_noise / count_scale(params) ** 2
    return out


def reconstruct(noisy: np.ndarray, params: Params, confidence: float = 0.95) -> Estimates:
    """Alg. 4: U_l = W_l C_l / floor(alpha_l Gamma / C), U_0 = (W_bottom + sum_l W_l) / floor(Gamma / C).

    For the baseline U_0 = W_count / floor(alpha_0 Gamma / C); for L1 the value divisor is floor(Gamma/C).
    """
    W = np.asarray(noisy, dtype=np.float64)
    d = params.num_queries
    if W.ndim != 2 or W.shape[1] != d + 1:
        raise InvalidInput(f"summary report must be (m, {d + 1}) for {d} queries, got {W.shape}")
    if not 0.0 < confidence < 1.0:
        raise InvalidParameters(f"confidence must lie in (0, 1), got {confidence!r}")
    thresholds = np.array([q.clip_threshold for q in params.queries])
    est = np.empty_like(W)
    est[:, 1:] = W[:, :d] * (thresholds / query_scales(params))[None, :]
    if params.encoding == Encoding.BASELINE:
        est[:, 0] = W[:, d] / count_scale(params)
    else:
        est[:, 0] = W.sum(axis=1) / count_scale(params)
    se = np.sqrt(estimate_variance(params, est[:, 0]))
    z = float(ndtri(0.5 + confidence / 2.0))  # the standard normal quantile (scipy.special: scipy.stats imports in ~1 s)
    names = ("count",) + params.query_columns
    low, high = nonnegative_interval(est - z * se, est + z * se)
    return Estimates(est, se, low, high, names, confidence)


def nonnegative_interval(low: np.ndarray, high: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """An interval of a count or a sum of non-negative values, cut at 0 (NaN stays NaN): the total
    cannot be negative, so this covers it exactly when the uncut one does. The point estimate is not
    cut (Alg. 4's is unbiased, also when negative)."""
    return np.maximum(low, 0.0), np.maximum(high, 0.0)  # (np.maximum keeps NaN)


SIGNAL_SDS = 2.0
"""A query whose Alg. 4 estimates summed over the domain are within this many standard errors of 0 is
released without signal (``queries_without_signal``)."""


def queries_without_signal(estimates: Estimates) -> list[str]:
    """The queries (the count, the values) whose Alg. 4 estimates summed over the domain's slices are within
    ``SIGNAL_SDS`` standard errors of 0: the release says nothing of them, e.g. a value query that Alg. 5
    left a single budget unit at a clip near 0 (judged unmeasurable at this epsilon: publishing about 0
    scores as well), whose corrected interval then spans [0, far above the truth]. Post-processing of the
    noised estimates and their standard errors, both published."""
    return without_signal(estimates.query_names, estimates.estimate.sum(axis=0),
                          np.sqrt(np.square(estimates.std_error).sum(axis=0)))


def without_signal(names: Sequence[str], totals: Sequence[float], std_errors: Sequence[float]) -> list[str]:
    """The ``names`` whose summed estimates ``totals`` are within ``SIGNAL_SDS`` of their ``std_errors``
    of 0 (the one comparison of both targets' ``queries_without_signal``)."""
    return [name for name, t, s in zip(names, totals, std_errors, strict=True) if t <= SIGNAL_SDS * s]
