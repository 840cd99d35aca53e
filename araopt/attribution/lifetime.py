"""A privacy unit's budget across releases (W3C Attribution Level 1).

The privacy unit is browser x conversion site x epoch, and an accepted report deducts from the epoch
of the impression it is attributed to (the encoder matches each conversion to its own impression).
A release must see every unit with what earlier releases already took from it, as the browser does
over the unit's whole life. ``measure`` carries the browsers' budget state from one release to the
next the way ARA's path carries an impression's (its lookback and Alg. 1 over the ledger's recorded
mechanisms, ``araopt.mechanism.lifetime``): with a lookback (``--lookback-days``) it simulates again,
before the release's own conversions and in time order, the lookback's conversions that earlier
releases released, each with the parameters and histogram layout of the release that released it
(:class:`AttributionHistory`, from the ledger), with the same draws (``araopt.attribution.draws``:
each browser's epoch grid, each row's value rounding). Only the release's own reports are summed.

Which earlier releases must be simulated again: every report touches one epoch (its impression's), and
a unit's state is the sequence of reports that touched its epoch. Two impression times less than an
epoch apart lie in one epoch under some epoch start, an epoch or more apart under none. So each
release records the window of impression times its accepted reports charged (:class:`ChargedWindow`),
and at commit (``araopt.ledger.attribution``) every earlier release whose charged window comes within
an epoch of the impressions this release's matched reports used must have been simulated again whole:
its conversions all in the lookback, its draws, parameters and layout known. Otherwise the release is
refused (``--lookback-days`` names the fix), or made with ``--allow-rerelease`` and recorded.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from araopt.attribution.draws import DrawKey
from araopt.attribution.params import AttributionParams
from araopt.errors import InvalidInput, PrivacyRefusal
from araopt.mechanism.keys import KeyDomain

CHARGED = "charged_impressions"
"""Where a release's run summary and its ledger entry keep its :class:`ChargedWindow` (None: no report
was accepted, no epoch charged)."""
MATCHED = "matched_impressions"
"""Where a release's run summary keeps the :class:`ChargedWindow` of its matched reports' impression times
(the epochs whose budgets its decisions read; None: no report matched)."""


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


@dataclass(frozen=True)
class EarlierRelease:
    """An attribution release recorded in the ledger: its entry id, the parameters and histogram layout
    its browsers were called with, and the sorted distinct row ids (``araopt.io.rowset``) it released."""

    entry_id: str
    params: AttributionParams
    layout: KeyDomain
    ids: np.ndarray = field(repr=False)

    def __post_init__(self) -> None:
        if not bool(np.all(self.ids[1:] > self.ids[:-1])):
            raise InvalidInput("a release's row ids must be sorted and distinct")


@dataclass(frozen=True)
class AttributionHistory:
    """The earlier releases a lookback's conversions may belong to (``releases``, in ledger order), and
    those whose conversions cannot be simulated again with why (``excluded``: (entry id, reason)), and the
    draw key they were simulated with (``key``: the ledger's; their epoch grids and roundings are its
    draws, so a lookback is simulated again only with it: ``draw_key``)."""

    releases: tuple[EarlierRelease, ...] = ()
    excluded: tuple[tuple[str, str], ...] = ()
    key: DrawKey | None = None

    def draw_key(self, key: DrawKey | None, simulation: bool) -> DrawKey | None:
        """The key a release with this history draws with (``key``: the one given, None: this history's).
        Outside a ``simulation``, a lookback held by earlier releases is simulated again only with their key:
        fresh draws would round its values and place its epochs otherwise than the browsers did, and so
        leave another budget than the one they left (a red team's: 20 of 10 spent on 9 of 20 runs)."""
        if simulation or not self.releases:
            return key
        if self.key is None or (key is not None and key != self.key):
            raise PrivacyRefusal(LOOKBACK_NEEDS_KEY)
        return self.key

    @property
    def rebuilt(self) -> frozenset[str]:
        """The entries whose conversions a release with this history simulates again."""
        return frozenset(r.entry_id for r in self.releases)

    def configurations(self) -> list[tuple[AttributionParams, KeyDomain]]:
        """The distinct (parameters, layout) of the releases, in order of first use."""
        out: list[tuple[AttributionParams, KeyDomain]] = []
        for r in self.releases:
            if (r.params, r.layout) not in out:
                out.append((r.params, r.layout))
        return out

    def segments(self, row_ids: np.ndarray) -> np.ndarray:
        """Per row id: the index in :meth:`configurations` of the earliest release that released it, -1
        for a conversion no release released (no browser was asked: it took no budget)."""
        ids = np.asarray(row_ids, dtype=np.uint64)
        out = np.full(len(ids), -1, dtype=np.int64)
        configs = self.configurations()
        for r in reversed(self.releases):  # the earliest release holding a row writes last
            if not len(r.ids):
                continue
            where = np.minimum(np.searchsorted(r.ids, ids), len(r.ids) - 1)
            out[r.ids[where] == ids] = configs.index((r.params, r.layout))
        return out


LOOKBACK_NEEDS_KEY = (
    "a lookback held by earlier releases is simulated again with the draw key those releases used (the ledger's, "
    "araopt.ledger.attribution.attribution_history records it): without it, or with another, its roundings and "
    "epochs would differ from the browsers', and so would the budgets it left")
"""Why a release whose history holds earlier releases needs their draw key (``AttributionHistory.draw_key``)."""

LOOKBACK_NEEDS_HISTORY = (
    "lookback rows spent the per-site budgets of the releases that used them: pass the release history (the "
    "ledger's, araopt.ledger.attribution) or AttributionHistory() to declare that no release used them; without "
    "one they would be simulated with today's parameters, under an earlier release's larger epsilon")
"""Why a release (no simulation seed) with lookback rows needs an ``AttributionHistory``, whatever path made it
(ARA's rule: ``araopt.mechanism.measure.LOOKBACK_NEEDS_HISTORY``)."""


def lookback_segments(history: AttributionHistory | None, row_ids: np.ndarray,
                      params: AttributionParams, layout: KeyDomain, simulation: bool
                      ) -> tuple[list[tuple[AttributionParams, KeyDomain]], np.ndarray]:
    """The parameter sets of a release's rows (0: its own, ``params`` over ``layout``) and, per lookback row
    id, its set (-1: not simulated). Without a history, only in a ``simulation`` (no ledger), every lookback
    row is taken as released with the release's own parameters; a release without one is refused."""
    if history is None and not simulation:
        raise PrivacyRefusal(LOOKBACK_NEEDS_HISTORY)
    if history is None:
        return [(params, layout), (params, layout)], np.ones(len(row_ids), dtype=np.int64)
    found = history.segments(row_ids)
    return [(params, layout), *history.configurations()], np.where(found >= 0, found + 1, -1)


def check_columns(history: Sequence[EarlierRelease], columns: Sequence[str]) -> None:
    """Refuse earlier releases whose parameters read columns a release does not read (its lookback rows
    would lack them)."""
    present = set(columns)
    for r in history:
        missing = [c for c in (*r.params.slice_columns, *r.params.value_columns) if c not in present]
        if missing:
            raise InvalidInput(f"ledger entry {r.entry_id}: its parameters read {missing}, which this release does not")
