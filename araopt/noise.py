"""Discrete Laplace noise DLap(a) (Def. 2.3) and the summary-report noise of Alg. 3.

DLap(a) has pmf tanh(a/2) * exp(-a|k|) = (e^a - 1)/(e^a + 1) * e^{-a|k|}. We sample it as the
difference of two i.i.d. geometric variables on {0, 1, ...} with ratio q = e^{-a}; each geometric is
floor(E / a) with E = -log(1 - U) a standard exponential and U uniform on [0, 1) (inversion, using the
exact rate a rather than log(1 - p), so no precision is lost when a = eps / 65536 is tiny). The
only approximation is that of the uniforms (53-bit floats): pmf errors are ~1e-16 relative.
"""
from __future__ import annotations

import numpy as np

from .params import CONTRIBUTION_BUDGET, check_epsilon
from .randomness import secure_generator


def noise_parameter(epsilon: float, contribution_budget: int = CONTRIBUTION_BUDGET) -> float:
    """a = eps / Gamma, the DLap parameter the Aggregation Service uses (Alg. 3)."""
    return check_epsilon(epsilon) / float(contribution_budget)


def _check_a(a: float) -> float:
    a = float(a)
    if not np.isfinite(a) or a <= 0:
        raise ValueError(f"discrete Laplace parameter a must be a finite number > 0, got {a!r}")
    return a


def discrete_laplace_variance(a: float) -> float:
    """Var DLap(a) = 2 e^a / (e^a - 1)^2 (Lemma 2.5), computed stably as 2 e^{-a} / expm1(-a)^2."""
    a = _check_a(a)
    return float(2.0 * np.exp(-a) / np.expm1(-a) ** 2)


def discrete_laplace_pmf(k: np.ndarray, a: float) -> np.ndarray:
    """P[DLap(a) = k] = tanh(a/2) e^{-a|k|}."""
    a = _check_a(a)
    return np.tanh(a / 2.0) * np.exp(-a * np.abs(np.asarray(k, dtype=np.float64)))


def discrete_laplace_cdf(k: np.ndarray, a: float) -> np.ndarray:
    """P[DLap(a) <= k] in closed form: 1 - q^{k+1}/(1+q) for k >= 0, q^{-k}/(1+q) for k < 0."""
    a = _check_a(a)
    k = np.floor(np.asarray(k, dtype=np.float64))
    q = np.exp(-a)
    pos = 1.0 - np.exp(-a * (k + 1.0)) / (1.0 + q)
    neg = np.exp(a * k) / (1.0 + q)
    return np.where(k >= 0, pos, neg)


def discrete_laplace_from_uniforms(a: float, u1: np.ndarray, u2: np.ndarray) -> np.ndarray:
    """DLap(a) from two arrays of uniforms on [0, 1): floor(-log(1-u1) / a) - floor(-log(1-u2) / a)."""
    a = _check_a(a)
    g1 = np.floor(-np.log1p(-np.asarray(u1, dtype=np.float64)) / a)
    g2 = np.floor(-np.log1p(-np.asarray(u2, dtype=np.float64)) / a)
    return (g1 - g2).astype(np.int64)


def sample_discrete_laplace(a: float, size: int | tuple[int, ...], rng: np.random.Generator | None = None) -> np.ndarray:
    """Draw DLap(a) samples; ``rng=None`` uses the cryptographically secure generator."""
    a = _check_a(a)
    if rng is None:
        rng = secure_generator()
    return discrete_laplace_from_uniforms(a, rng.random(size), rng.random(size))
