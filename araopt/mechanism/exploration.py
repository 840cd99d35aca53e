"""Exploration arms: a small random share of impressions capped at other count limits, so that the
noisy releases themselves show how much each count limit keeps (privacy-safe tuning).

The ad server assigns every impression an arm when it registers the source (ARA's ``filter_data``):
arm -1 is the main configuration, arm a < k is capped at ``count_limit`` C_a with the main clip
thresholds and budget fractions (HistogramContribution, Alg. 3 / Alg. 6 at C_a). An arm's
conversions are reported on keys of their own, pooled over slices: (arm, query) for every value
query and the bottom key. The release's estimates of the main keys then cover the main impressions
only, a share 1 - sum(share_a) of them, and the arms' estimates (Alg. 4 at C_a) are the kept totals
r(C_a) x share_a x T that an optimizer and a calibration learn from.

Every impression still contributes to one configuration only and Alg. 1 caps it at Gamma, so the
release stays epsilon-DP; the arms spend a share of the impressions, not extra budget: the main
estimates lose that share of their data (the cost the tuner weighs).

In simulation, and for the ad server, the arm is a keyed hash of the impression id (``salt``,
public): the same impression is in the same arm on every day of its life.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from araopt.constants import EXPLORATION_ARM_SHARE, EXPLORATION_COUNT_LIMITS
from araopt.errors import InvalidParameters, check_count_limit, is_positive_finite
from araopt.io.ids import canonical_id_hash
from araopt.mechanism.randomness import mix64

MAX_ARMS = 15
"""At most this many arms (their keys and the trigger's filtered value sets stay small)."""
MAX_EXPLORATION_SHARE = 0.25
"""The arms together take at most this share of the impressions."""
EXPLORATION_BIT = 127
"""Arm keys set the top bit of the 128-bit bucket; main keys must fit below it."""


@dataclass(frozen=True)
class ExplorationArm:
    """One arm: impressions capped at ``count_limit``, a ``share`` of all impressions."""

    count_limit: int
    share: float

    def __post_init__(self) -> None:
        if not (is_positive_finite(self.share) and self.share < 1.0):
            raise InvalidParameters(f"exploration arm share must lie in (0, 1), got {self.share!r}")
        object.__setattr__(self, "count_limit", check_count_limit(self.count_limit))


@dataclass(frozen=True)
class Exploration:
    """The arms of a parameter version and the public key of the impressions' arm assignment."""

    arms: tuple[ExplorationArm, ...]
    salt: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "arms", tuple(self.arms))
        if not self.arms or len(self.arms) > MAX_ARMS:
            raise InvalidParameters(f"exploration needs 1 to {MAX_ARMS} arms, got {len(self.arms)}")
        if not all(isinstance(a, ExplorationArm) for a in self.arms):
            raise InvalidParameters("exploration arms must be ExplorationArm instances")
        if self.total_share > MAX_EXPLORATION_SHARE + 1e-12:
            raise InvalidParameters(f"the exploration arms take {self.total_share:.3g} of the impressions, more than "
                                    f"{MAX_EXPLORATION_SHARE:g}")
        if isinstance(self.salt, bool) or not isinstance(self.salt, int) or not 0 <= self.salt < 2**32:
            raise InvalidParameters(f"exploration salt must be an integer in [0, 2^32), got {self.salt!r}")

    @property
    def num_arms(self) -> int:
        return len(self.arms)

    @property
    def total_share(self) -> float:
        return float(sum(a.share for a in self.arms))

    @property
    def main_share(self) -> float:
        """The share of impressions the main keys report."""
        return 1.0 - self.total_share

    def assign(self, impression_ids: np.ndarray) -> np.ndarray:
        """Arm of every record's impression: -1 main, else the arm's index (a keyed hash of the id's
        canonical form, ``araopt.io.ids``: 123, "123" and "000123" are in one arm)."""
        hashed = mix64(canonical_id_hash(impression_ids) ^ mix64(np.array([self.salt], dtype=np.uint64))[0])
        u = (hashed >> np.uint64(11)).astype(np.float64) / float(1 << 53)  # uniform in [0, 1)
        out = np.full(len(hashed), -1, dtype=np.int64)
        low = 0.0
        for index, arm in enumerate(self.arms):
            out[(u >= low) & (u < low + arm.share)] = index
            low += arm.share
        return out

    def bucket(self, arm: int, query_code: int) -> int:
        """The 128-bit bucket of an arm key: the exploration bit, the arm's index, the query code."""
        return (1 << EXPLORATION_BIT) | (int(arm) << 8) | int(query_code)

    def to_json(self) -> dict[str, Any]:
        return {"salt": self.salt, "arms": [{"count_limit": a.count_limit, "share": a.share} for a in self.arms]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], source: str = "exploration") -> Exploration:
        try:
            return cls(tuple(ExplorationArm(int(a["count_limit"]), float(a["share"])) for a in data["arms"]),
                       int(data["salt"]))
        except (KeyError, TypeError) as exc:
            raise InvalidParameters(f"{source}: malformed exploration ({exc!r})") from None


def exploration_rows(arm: np.ndarray, num_slices: int, slice_index: np.ndarray) -> np.ndarray:
    """Histogram row of every record: its domain slice for main records (-1 outside the domain), and
    ``num_slices + arm`` for arm records (pooled over slices)."""
    a = np.asarray(arm, dtype=np.int64)
    return np.where(a >= 0, num_slices + a, np.asarray(slice_index, dtype=np.int64))


def default_exploration(count_limits: Sequence[int] = EXPLORATION_COUNT_LIMITS, share: float = EXPLORATION_ARM_SHARE,
                        salt: int = 0x5EED) -> Exploration:
    """Seven arms of ``share`` of the impressions each (0.3%: 2.1% in all), from C = 1 to Chrome's 20 reports."""
    return Exploration(tuple(ExplorationArm(c, share) for c in count_limits), salt)
