"""Discrete Laplace noise DLap(a) (Def. 2.3) for the summary report (SummaryReport, Alg. 2).

DLap(a) has pmf tanh(a/2) e^{-a|k|} = (e^a - 1)/(e^a + 1) e^{-a|k|}; it is the difference of two
independent geometric variables G on {0, 1, ...} with P(G >= k) = e^{-ak}.

The release sampler is exact and works in integer arithmetic end to end (Canonne, Kamath & Steinke,
"The Discrete Gaussian for Differential Privacy", 2020, Algorithms 1-2): the rate is the rational
a = s / 2^52 and every coin is an integer comparison on uniform integers, so the output distribution
is exactly DLap(s / 2^52): no float rounding, no missing low bits, no overflow. ``noise_parameter``
rounds eps / Gamma *down* to a multiple of 2^-52, which can only add noise (relative change of a
below 2^-16 at the epsilon floor, below 2^-30 for eps >= 1/64).

Domain: a in [2^-36, 64]. With Gamma = 65,536 that is eps in [2^-20, 64] (``params.MIN_EPSILON`` /
``MAX_EPSILON``): below the floor the noise's standard deviation exceeds 9e10 per key and the rate
would keep fewer than 16 bits; every intermediate stays below 2^62, far inside int64.

``discrete_laplace_from_uniforms`` (floats, ~1e-16 pmf error) is kept for the key-deterministic
*simulation* mode only, which is not private by construction.
"""
from __future__ import annotations

from fractions import Fraction
from typing import cast

import numpy as np

from araopt.constants import CONTRIBUTION_BUDGET
from araopt.errors import InvalidInput, InvalidParameters, check_epsilon
from araopt.mechanism.randomness import secure_generator

RATE_BITS = 52
"""a is represented as s / 2^RATE_BITS with an integer numerator s."""
MIN_NOISE_PARAMETER = 2.0**-36
MAX_NOISE_PARAMETER = 64.0
MAX_ABS_SUM = 2**62
"""Largest |true sum| the report adds noise to (the noise itself stays below 2^62 too)."""

_DENOMINATOR = 1 << RATE_BITS
_MAX_COIN_ROUNDS = (2**63 - 1) // _DENOMINATOR  # K * 2^52 must stay within int64


def noise_parameter(epsilon: float, contribution_budget: int = CONTRIBUTION_BUDGET) -> float:
    """a = eps / Gamma (SummaryReport, Alg. 2), rounded down to a multiple of 2^-52 (exactly what is sampled)."""
    eps = check_epsilon(epsilon)
    if (isinstance(contribution_budget, bool) or not isinstance(contribution_budget, (int, np.integer))
            or contribution_budget < 1):
        raise InvalidParameters(f"contribution_budget must be a positive integer, got {contribution_budget!r}")
    numerator = (Fraction(eps) * _DENOMINATOR) // int(contribution_budget)
    return _check_a(numerator / _DENOMINATOR)


def _check_a(a: float) -> float:
    if isinstance(a, (str, bytes, bool, np.bool_)) or not isinstance(a, (int, float, np.integer, np.floating)):
        raise TypeError(f"discrete Laplace parameter a must be a real number, got {type(a).__name__} {a!r}")
    a = float(a)
    if not (np.isfinite(a) and MIN_NOISE_PARAMETER <= a <= MAX_NOISE_PARAMETER):
        raise InvalidParameters(
            f"discrete Laplace parameter a must be a finite number in [2^-36, {MAX_NOISE_PARAMETER:g}] "
            f"(eps in [2^-20, 64] at Gamma = 65536), got {a!r}")
    return a


def rate_numerator(a: float) -> int:
    """s = floor(a 2^52): the sampler draws DLap(s / 2^52) (<= a: never less noise than asked)."""
    return int(Fraction(_check_a(a)) * _DENOMINATOR)


def discrete_laplace_variance(a: float) -> float:
    """Var DLap(a) = 2 e^a / (e^a - 1)^2 (Lemma 2.5), computed stably as 2 e^{-a} / expm1(-a)^2."""
    a = _check_a(a)
    return float(2.0 * np.exp(-a) / np.expm1(-a) ** 2)


def discrete_laplace_pmf(k: np.ndarray, a: float) -> np.ndarray:
    """P[DLap(a) = k] = tanh(a/2) e^{-a|k|}."""
    a = _check_a(a)
    return cast(np.ndarray, np.tanh(a / 2.0) * np.exp(-a * np.abs(np.asarray(k, dtype=np.float64))))


def discrete_laplace_cdf(k: np.ndarray, a: float) -> np.ndarray:
    """P[DLap(a) <= k] in closed form: 1 - q^{k+1}/(1+q) for k >= 0, q^{-k}/(1+q) for k < 0."""
    a = _check_a(a)
    k = np.floor(np.asarray(k, dtype=np.float64))
    q = np.exp(-a)
    pos = 1.0 - np.exp(-a * (k + 1.0)) / (1.0 + q)
    neg = np.exp(a * k) / (1.0 + q)
    return cast(np.ndarray, np.where(k >= 0, pos, neg))


def discrete_laplace_from_uniforms(a: float, u1: np.ndarray, u2: np.ndarray) -> np.ndarray:
    """SIMULATION ONLY: DLap(a) from two arrays of float uniforms on [0, 1) by inversion,
    floor(-log(1-u1) / a) - floor(-log(1-u2) / a); pmf exact up to the 53-bit uniforms."""
    a = _check_a(a)
    g1 = np.floor(-np.log1p(-np.asarray(u1, dtype=np.float64)) / a)
    g2 = np.floor(-np.log1p(-np.asarray(u2, dtype=np.float64)) / a)
    return (g1 - g2).astype(np.int64)


def _bernoulli_exp_neg(rng: np.random.Generator, numerator: np.ndarray, denominator: int) -> np.ndarray:
    """Exact Bernoulli(exp(-numerator / denominator)) per entry, 0 <= numerator <= denominator
    (CKS Alg. 1): with gamma = numerator / denominator, draw Bernoulli(gamma / k) for k = 1, 2, ...
    until one fails; the coin is 1 iff that k is odd. Entries still drawing in round k have all
    succeeded so far, so one scalar bound k * denominator serves the whole round."""
    coin = np.empty(numerator.shape[0], dtype=bool)
    active = np.arange(numerator.shape[0])
    k = 1
    while active.size:
        if k > _MAX_COIN_ROUNDS:  # reached with probability 1/2047!: never, but never wrap around
            raise OverflowError("exact Bernoulli(exp(-x)) sampler did not terminate within int64 range")
        draw = rng.integers(0, k * denominator, size=active.size, dtype=np.int64)  # uniform on [0, k * denominator)
        failed = draw >= numerator[active]
        coin[active[failed]] = bool(k & 1)
        active = active[~failed]
        k += 1
    return coin


def _geometric(rng: np.random.Generator, numerator: int, size: int) -> np.ndarray:
    """Exact G with P(G >= k) = exp(-k s / 2^52) (CKS Alg. 2), int64: X = U + 2^52 V with U uniform
    on [0, 2^52) kept w.p. exp(-U / 2^52) and V ~ Geometric(exp(-1)) has P(X = x) ~ e^{-x / 2^52};
    G = floor(X / s)."""
    out = np.empty(size, dtype=np.int64)
    pending = np.arange(size)
    while pending.size:
        uniform = rng.integers(0, _DENOMINATOR, size=pending.size, dtype=np.int64)
        accept = _bernoulli_exp_neg(rng, uniform, _DENOMINATOR)
        done, uniform = pending[accept], uniform[accept]
        pending = pending[~accept]
        whole = np.zeros(done.size, dtype=np.int64)  # V: Bernoulli(e^-1) successes before the first failure
        active = np.arange(done.size)
        while active.size:
            if int(whole[active[0]]) >= _MAX_COIN_ROUNDS - 1:  # probability e^-2046: never, but stay in int64
                raise OverflowError("geometric sample would leave int64")
            success = _bernoulli_exp_neg(rng, np.ones(active.size, dtype=np.int64), 1)
            active = active[success]
            whole[active] += 1
        out[done] = (uniform + whole * _DENOMINATOR) // numerator
    return out


def sample_discrete_laplace(a: float, size: int | tuple[int, ...], rng: np.random.Generator | None = None) -> np.ndarray:
    """Exact DLap(s / 2^52) samples, s = floor(a 2^52), int64; ``rng=None`` uses the secure generator."""
    numerator = rate_numerator(a)
    if rng is None:
        rng = secure_generator()
    shape = (size,) if isinstance(size, (int, np.integer)) else tuple(size)
    count = int(np.prod(shape, dtype=np.int64))
    return cast(np.ndarray, (_geometric(rng, numerator, count) - _geometric(rng, numerator, count)).reshape(shape))


def add_noise(histogram: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """histogram + noise in int64, refusing sums whose magnitude could leave int64 (|sum| > 2^62)."""
    hist = np.asarray(histogram)
    if hist.size and hist.dtype.kind not in "iu":
        raise InvalidInput(f"the histogram must hold integers, got dtype {hist.dtype}")
    # bounds compared on min and max (np.abs(INT64_MIN) is INT64_MIN, negative), as Python integers
    if hist.size and max(abs(int(hist.min())), abs(int(hist.max()))) > MAX_ABS_SUM:
        raise InvalidInput(f"a key's sum exceeds 2^62 in magnitude ({max(abs(int(hist.min())), abs(int(hist.max())))}): "
                           f"refusing to add noise that could overflow int64")
    noise = np.asarray(noise)
    if noise.size and noise.dtype.kind not in "iu":
        raise InvalidInput(f"the noise must hold integers, got dtype {noise.dtype}")
    if noise.size and max(abs(int(noise.min())), abs(int(noise.max()))) > MAX_ABS_SUM:
        raise OverflowError("noise magnitude exceeds 2^62")
    return hist.astype(np.int64) + noise.astype(np.int64)
