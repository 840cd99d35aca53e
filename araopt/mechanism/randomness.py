"""Sources of randomness: a cryptographically secure default and an explicit simulation mode.

Privacy noise (Alg. 2) must come from a cryptographically secure generator: ``secure_generator``
returns a numpy ``Generator`` over an AES-128 counter-mode bit generator (randomgen's AESCounter,
AES-NI accelerated) keyed with 128 fresh bits from :mod:`secrets`. Seeded randomness exists only
through :class:`Simulation`, which says so in its name, in its ``repr`` and in the log.

``keyed_uniforms`` derives uniforms from (seed, record key) pairs with a SplitMix64 mix. It makes a
simulated run independent of how the data is partitioned (the same record or key gets the same
draw on any worker, in any order), which is how the Beam pipeline and the core library produce the
exact same histogram and noise for the same simulation seed. It is simulation-only: not secure.
"""
from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass
from typing import cast

import numpy as np
from randomgen import AESCounter

from araopt.errors import InvalidParameters

_LOG = logging.getLogger(__name__)

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_TWO_POW_MINUS_53 = float(2.0**-53)


def secure_generator() -> np.random.Generator:
    """A numpy Generator over AES-CTR keyed from the OS CSPRNG (the default for privacy noise)."""
    return np.random.Generator(AESCounter(seed=secrets.randbits(128)))


@dataclass(frozen=True)
class Simulation:
    """Explicit simulation mode: seeded, reproducible, NOT private. Never use for real releases."""

    seed: int

    def __post_init__(self) -> None:
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise InvalidParameters(f"simulation seed must be a non-negative integer, got {self.seed!r}")

    def generator(self, stream: int = 0) -> np.random.Generator:
        _LOG.warning("SIMULATION MODE: seeded randomness (seed=%d); output is not differentially private", self.seed)
        return np.random.Generator(np.random.PCG64([self.seed, stream]))

    def uniforms(self, keys: np.ndarray, stream: int) -> np.ndarray:
        return keyed_uniforms(self.seed, keys, stream)


def mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser, vectorized over uint64 (wrapping arithmetic)."""
    x = np.asarray(x, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
    return cast(np.ndarray, x ^ (x >> np.uint64(31)))


def keyed_uniforms(seed: int, keys: np.ndarray, stream: int) -> np.ndarray:
    """Uniforms on [0, 1) (like ``Generator.random``) that depend only on (seed, key, stream)."""
    base = mix64(np.array([(seed * 0x100000001B3 + stream * 0x9E3779B1) % 2**64], dtype=np.uint64))[0]
    with np.errstate(over="ignore"):
        h = mix64(mix64(np.asarray(keys, dtype=np.uint64) + base) + _GOLDEN * np.uint64(stream + 1))
    return (h >> np.uint64(11)).astype(np.float64) * _TWO_POW_MINUS_53
