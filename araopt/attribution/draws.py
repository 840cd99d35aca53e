"""The browsers' random draws that every release of one ledger agrees on (W3C Attribution Level 1).

A browser's budget state is carried from one release to the next by simulating again, with each
release, the conversions earlier releases released (``araopt.attribution.lifetime``). That simulation
must make exactly the decisions those releases made, so their random draws must be drawn again the
same: each browser's epoch grid (keyed by its canonical id) and each report's value rounding (keyed by
the row's content). The aggregation's noise is not one of them: it is drawn afresh from the secure
generator by every release.

* In simulation (``--simulation-seed S``) the draws are ``keyed_uniforms(S, key, stream)`` (SplitMix64:
  reproducible, not secret), as before.
* A release draws them with a :class:`DrawKey`: a secret of 96 bits from the OS CSPRNG, made by a
  ledger's first attribution release and kept (operator-private) in its attribution entries, through
  SipHash-2-4 (a keyed pseudo-random function; pandas' ``hash_array`` with ``hash_key``) of the
  (key, stream) pair. Without the secret the draws are as unpredictable as fresh ones; they are not
  what the privacy of a release rests on (the noise and the budgets are), but they keep the roundings
  unbiased and the epoch starts as the browsers' are: unknown to the sites.
"""
from __future__ import annotations

import secrets
import string
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from araopt.errors import InvalidParameters
from araopt.mechanism.randomness import Simulation, keyed_uniforms

KEY_LENGTH = 16
"""pandas' SipHash key is 16 characters (bytes once UTF-8 encoded): from a 64-letter alphabet, 96 bits."""
_ALPHABET = string.ascii_letters + string.digits + "-_"
_TWO_POW_MINUS_53 = float(2.0**-53)


@dataclass(frozen=True)
class DrawKey:
    """The secret that keys a ledger's attribution draws (see module doc). Never printed (``repr``)."""

    secret: str = field(repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.secret, str) or len(self.secret) != KEY_LENGTH or set(self.secret) - set(_ALPHABET):
            raise InvalidParameters(f"an attribution draw key is {KEY_LENGTH} characters of [A-Za-z0-9_-]")

    @classmethod
    def new(cls) -> DrawKey:
        """A fresh key from the OS CSPRNG."""
        return cls("".join(secrets.choice(_ALPHABET) for _ in range(KEY_LENGTH)))

    def uniforms(self, keys: np.ndarray, stream: int) -> np.ndarray:
        """Uniforms on [0, 1) that depend only on (secret, key, stream): SipHash-2-4 of the 16 bytes of
        (key, stream) under the secret, its top 53 bits."""
        words = np.empty((len(keys), 2), dtype=np.uint64)
        words[:, 0] = np.asarray(keys, dtype=np.uint64)
        words[:, 1] = np.uint64(stream)
        # fixed-width bytes: numpy drops trailing NULs, which keeps 16-byte strings distinct
        blocks = np.ascontiguousarray(words).view("S16").ravel().astype(object)
        hashed = pd.util.hash_array(blocks, hash_key=self.secret, categorize=False).astype(np.uint64)
        out: np.ndarray = (hashed >> np.uint64(11)).astype(np.float64) * _TWO_POW_MINUS_53
        return out


Draws = int | DrawKey
"""Where a measurement's browser draws come from: a simulation seed, or a release's secret key."""


def check_draws(source: Draws) -> Draws:
    """``source`` if it is a :class:`DrawKey` or a valid simulation seed (refused otherwise)."""
    if not isinstance(source, DrawKey):
        Simulation(source)  # validates the seed
    return source


def uniforms(source: Draws, keys: np.ndarray, stream: int) -> np.ndarray:
    """The draws of ``keys`` in ``stream`` from ``source`` (see module doc)."""
    if isinstance(source, DrawKey):
        return source.uniforms(keys, stream)
    return keyed_uniforms(source, keys, stream)
