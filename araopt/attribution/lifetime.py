"""A privacy unit's budget across releases (W3C Attribution Level 1).

The privacy unit is browser x conversion site x epoch, and an accepted report deducts from the epoch
of the impression it is attributed to (the encoder matches each conversion to its own impression).
Each ``measure`` simulates the browsers afresh: full per-site budgets, global budgets and quotas, and a
new epoch start per browser. Two releases whose reports use impressions of one epoch would each
spend a whole budget on it (issue: day 1 and day 2 of the same impressions released one after the
other keep twice what the browser keeps over the impression's life).

Until a release carries the browsers' budget state from the earlier ones, the rule that keeps every
unit within its budget is: no two releases charge one epoch. Two impression times less than an epoch
apart lie in one epoch under some epoch start, an epoch or more apart under none (whatever start each
release drew). So each release records the window of impression times its accepted reports charged
(:class:`ChargedWindow`), and a release whose window comes within an epoch of an earlier one's is
refused (``pipelines.ledger``). Any 7-day window of a browser's data then meets the charged windows of
at most one release: it spends at most what one release lets it spend.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from araopt.errors import InvalidInput

CHARGED = "charged_impressions"
"""Where a release's run summary and its ledger entry keep its :class:`ChargedWindow` (None: no report
was accepted, no epoch charged)."""


@dataclass(frozen=True)
class ChargedWindow:
    """The impression times (microseconds) of a release's accepted reports, first to last, and the
    browsers' epoch length: every epoch the release deducted from holds one of these times."""

    first_us: int
    last_us: int
    epoch_us: int

    def __post_init__(self) -> None:
        for name in ("first_us", "last_us", "epoch_us"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidInput(f"charged window: {name} must be an integer, got {value!r}")
        if self.last_us < self.first_us or self.epoch_us < 1:
            raise InvalidInput(f"charged window: [{self.first_us}, {self.last_us}] with epoch {self.epoch_us} µs is "
                               f"not a window")

    def shares_epochs_with(self, other: ChargedWindow) -> bool:
        """Whether an impression time of each lies less than an epoch (the longer of the two) from one
        of the other's: then some epoch start puts them in one epoch."""
        epoch = max(self.epoch_us, other.epoch_us)
        return self.first_us - other.last_us < epoch and other.first_us - self.last_us < epoch

    def to_json(self) -> dict[str, int]:
        return {"first_us": self.first_us, "last_us": self.last_us, "epoch_us": self.epoch_us}

    @classmethod
    def from_json(cls, doc: Any) -> ChargedWindow:
        if not isinstance(doc, dict) or set(doc) != {"first_us", "last_us", "epoch_us"}:
            raise InvalidInput(f"charged window: expected first_us, last_us, epoch_us, got {doc!r}")
        return cls(doc["first_us"], doc["last_us"], doc["epoch_us"])
