"""ARA's lifetime cap across releases: which recorded releases a release's lookback must hold.

Chrome caps a source's (an impression's) reports over its whole life, at most
``MAX_SOURCE_LIFE_DAYS`` (30 days). A release caps an impression's conversions with Alg. 1 over its
``--lookback`` and its own period (``araopt.mechanism.lifetime``: each lookback conversion costed with
the parameters of the release that used it), so it keeps what the browser keeps only if the lookback
holds every conversion released earlier in the life of its impressions. Without it, day 1 and day 2
released one after the other each keep C reports per impression: 2C over its life.

An impression converting in a release whose first conversion is at P0 was registered after
P0 - life, so its earlier conversions lie in (P0 - life, P0). Of the ledger's ARA releases (an
Attribution release spends no source budget):

* **before**: a release whose conversions lie before P0 and after P0 - life (*in reach*) must be held by
  the lookback. Before any work (:func:`lifetime_refusal`), from the windows alone: the lookback's
  files cover the UTC days from their first conversion's through their last's (their Parquet footers:
  :class:`LookbackCover`); a release in reach whose window meets a day the lookback does not cover
  refuses the release, naming ``--lookback-days N``. At commit, exactly (:func:`held_refusal`): the job
  counts, per release in reach, how many of its conversions the lookback it read holds
  (``transforms.rowset.CountHeldReleases``); each must hold them all (a release straddling P0 - life
  too: its conversions carry no times in the ledger, so all of them, which whole-day lookbacks give).
* **later**: a release of conversions after this release's last (P1) and before P1 + life was made
  first: its kept reports were chosen without this release's earlier conversions (Alg. 1 goes in
  time order), so no lookback can make the two fit one budget: refused (release a log's days in order).
* a first release, with no ARA release in reach, needs no lookback: nothing earlier was released.

* **overlapping**: a release whose conversion window meets this release's (a day released in two parts,
  a late row of an earlier day in today's file) is refused (:func:`overlap_refusal`): Alg. 1 keeps a
  source's conversions in time order, and two releases of the same hours each chose theirs without the
  other's, so an impression could keep C reports in each. At commit, on the released rows' own times
  and after the re-release rules of ``Ledger.check_and_record`` (the same conversions again, exactly or
  by a lossy identity, are theirs to name; before the job an overlap may still be those). With
  ``--allow-rerelease`` (the operator's explicit second spend) it is made and its entry records the
  releases it meets (``OVERLAPPING``).

At commit the period is the released rows' own first and last conversion times (``RowSet``), not the
input's footers: a file without statistics, or a row outside what the footers said, cannot move the
release out of these rules.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from araopt.constants import MAX_SOURCE_LIFE_DAYS
from araopt.io.files import micros_iso as _iso  # the times in refusal messages
from araopt.io.partitions import DAY_US
from araopt.mechanism.lifetime import ReleaseHistory
from araopt.version import Api

LIFE_US = MAX_SOURCE_LIFE_DAYS * DAY_US
OVERLAPPING = "windows_overlap"
"""A ledger entry's ids of the earlier ARA releases whose conversion windows met its own (made only with
``--allow-rerelease``; see module doc)."""
HELD = "lookback_held"
"""A ledger entry's {earlier entry id: how many of its conversions this release's lookback held}, for
the releases in reach (see module doc)."""


@dataclass(frozen=True)
class LookbackCover:
    """The conversion times a lookback holds: each of its files covers the UTC days from its first
    conversion's day through its last's (a daily export's partition holds its whole day); ``spans``:
    those days merged, as half-open [start, end) intervals of microseconds, sorted."""

    spans: tuple[tuple[int, int], ...] = ()

    @classmethod
    def of_windows(cls, windows: Iterable[tuple[int | None, int | None]]) -> LookbackCover:
        """From each lookback file's (first, last) conversion time (None: its footers say nothing, and
        it covers nothing)."""
        days = sorted((first - first % DAY_US, last - last % DAY_US + DAY_US)
                      for first, last in windows if first is not None and last is not None)
        merged: list[tuple[int, int]] = []
        for start, end in days:
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], end))
            else:
                merged.append((start, end))
        return cls(tuple(merged))

    def gaps(self, start: int, end: int) -> list[tuple[int, int]]:
        """The parts of [start, end) no span covers."""
        out, at = [], start
        for lo, hi in self.spans:
            if hi <= at:
                continue
            if lo >= end:
                break
            if lo > at:
                out.append((at, lo))
            at = max(at, hi)
        if at < end:
            out.append((at, end))
        return out


@dataclass(frozen=True)
class ReleasePeriod:
    """A release's conversion times, first and last (µs; None when the input's footers do not say),
    and what its lookback covers (None: no lookback)."""

    first_us: int | None
    last_us: int | None
    cover: LookbackCover | None = None

    def held(self, counts: Mapping[str, int]) -> HeldLookback:
        """This period with ``counts``: per ledger entry id, how many of its conversions the job's lookback held."""
        return HeldLookback(self, dict(counts))

    def exactly(self, first_us: int | None, last_us: int | None) -> ReleasePeriod:
        """This period with the released rows' own first and last conversion times (``RowSet``; None: no row)."""
        return ReleasePeriod(first_us, last_us, self.cover)


@dataclass(frozen=True)
class HeldLookback:
    """What the commit checks: the period and how many conversions of each release in reach its
    lookback held (``transforms.rowset.CountHeldReleases``)."""

    period: ReleasePeriod
    counts: dict[str, int] = field(default_factory=dict)


def is_ara(entry: dict[str, Any]) -> bool:
    """Whether a ledger entry is an ARA release (entries recorded before targets existed say no api)."""
    return bool(entry.get("api", Api.ARA.value) == Api.ARA.value)


def released_ara(entries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ledger's ARA releases that released conversions (their first and last times recorded)."""
    return [e for e in entries if is_ara(e) and e.get("rows") and e.get("first_time_us") is not None]


def in_reach(entries: Sequence[dict[str, Any]], period: ReleasePeriod) -> list[dict[str, Any]]:
    """The ARA releases whose conversions lie before the period and within a source life of its first
    conversion (all ARA releases with conversions when the period's times are unknown)."""
    first = period.first_us
    return [e for e in released_ara(entries) if first is None or first - LIFE_US < e["last_time_us"] < first]


def overlapping(entries: Sequence[dict[str, Any]], period: ReleasePeriod) -> list[dict[str, Any]]:
    """The ARA releases whose conversion windows meet the period's (both ends included; none when the
    period's times are unknown: ``in_reach`` then holds every ARA release)."""
    first, last = period.first_us, period.last_us
    if first is None or last is None:
        return []
    return [e for e in released_ara(entries) if e["first_time_us"] <= last and first <= e["last_time_us"]]


def later(entries: Sequence[dict[str, Any]], period: ReleasePeriod) -> list[dict[str, Any]]:
    """The ARA releases of conversions after the period's last and within a source life of it."""
    last = period.last_us
    return [e for e in released_ara(entries) if last is not None and last < e["first_time_us"] < last + LIFE_US]


def lifetime_refusal(entries: Sequence[dict[str, Any]], period: ReleasePeriod, ledger: str) -> str | None:
    """Why the release of ``period`` may not be made with the ledger ``entries`` (``ledger``: its uri), from
    the windows alone, by the releases in reach and the later ones; None if it may (see module doc)."""
    reach = in_reach(entries, period)
    if period.first_us is None:
        if not reach:
            return None
        return (f"the input's Parquet footers do not bound its conversion times (a file, or a row group, without column "
                f"statistics), so araopt cannot tell which of the "
                f"{len(reach)} ARA release(s) in the ledger {ledger} share its impressions' budgets (ARA caps a "
                f"source over its whole life): write the input with column statistics")
    first = period.first_us
    cover = period.cover or LookbackCover()
    gaps = cover.gaps(first - LIFE_US + 1, first)
    uncovered = [e for e in reach if any(lo <= e["last_time_us"] and max(e["first_time_us"], first - LIFE_US + 1) < hi
                                         for lo, hi in gaps)]
    if uncovered:
        start = min(max(e["first_time_us"], first - LIFE_US + 1) for e in reach)
        days = (first - first % DAY_US - (start - start % DAY_US)) // DAY_US
        e = uncovered[-1]
        held = "no --lookback holds them" if period.cover is None else "--lookback does not hold them all"
        return (f"the ledger {ledger} records {len(uncovered)} release(s) of conversions less than "
                f"{MAX_SOURCE_LIFE_DAYS} days before this input's first conversion ({_iso(first)}) and {held} (e.g. "
                f"{e['id']}: {_iso(e['first_time_us'])}..{_iso(e['last_time_us'])}): ARA caps a source over its whole "
                f"life, so impressions of this input spent budget there, which Alg. 1 counts only through the "
                f"lookback (else it keeps up to C reports per impression again). "
                + (f"Pass --lookback-days {days} (the {days} day(s) before the input, beside its date= partitions) or "
                   f"--lookback with those days' conversions" if days else
                   "This input's first day was released in part before it: pass --lookback with the conversions that "
                   "release used (--lookback-days reads only the days before the input)")
                + "; releases of another log (other impressions) belong in a ledger of their own (--ledger)")
    after = later(entries, period)
    if after and period.last_us is not None:
        e = after[0]
        return (f"the ledger {ledger} records {len(after)} release(s) of later conversions, less than "
                f"{MAX_SOURCE_LIFE_DAYS} days after this input's last one ({_iso(period.last_us)}; e.g. {e['id']}: "
                f"{_iso(e['first_time_us'])}..{_iso(e['last_time_us'])}): their kept reports were chosen without this "
                f"input's conversions of the same impressions, so releasing these now spends those sources' budgets "
                f"again (Alg. 1 keeps a source's conversions in time order). Release a log's days in time order")
    return None


def held_refusal(entries: Sequence[dict[str, Any]], held: HeldLookback, ledger: str) -> str | None:
    """At commit, with the ledger's ``entries`` as they are now and ``held.period`` the released rows' own
    times (``ReleasePeriod.exactly``): :func:`lifetime_refusal`, then whether the lookback the job read
    held every conversion of each release in reach (``held.counts``)."""
    why = lifetime_refusal(entries, held.period, ledger)
    if why is not None:
        return why
    for e in in_reach(entries, held.period):
        found = held.counts.get(e["id"], 0)
        if found < e["rows"]:
            return (f"--lookback holds {found:,} of the {e['rows']:,} conversions that release {e['id']} "
                    f"({_iso(e['first_time_us'])}..{_iso(e['last_time_us'])}) released less than "
                    f"{MAX_SOURCE_LIFE_DAYS} days before this input: the budget the others spent would be spent "
                    f"again (ARA caps a source over its whole life). Give the lookback every released day whole "
                    f"(--lookback-days N over the partitions the releases were made from)")
    return None


def overlap_refusal(meet: Sequence[dict[str, Any]], period: ReleasePeriod, ledger: str) -> str | None:
    """At commit (``period``: the released rows' own times, after the re-release rules judged whether they
    are conversions released before): why the release may not be made beside ``meet``, the ledger's ARA
    releases whose windows meet its own (``overlapping``); None if there are none. ``--allow-rerelease``
    skips this check (the operator's second spend, recorded as ``OVERLAPPING``): the caller's."""
    first, last = period.first_us, period.last_us
    if not meet or first is None or last is None:
        return None
    e = meet[0]
    return (f"the ledger {ledger} records {len(meet)} ARA release(s) of other conversions within this input's window "
            f"({_iso(first)}..{_iso(last)}; e.g. {e['id']}: {_iso(e['first_time_us'])}..{_iso(e['last_time_us'])}): "
            f"Alg. 1 keeps a source's conversions in time order, so two releases of the same hours each keep up to "
            f"C reports per impression (a day released in parts, or a late row of a released day, spends its "
            f"sources' budgets twice). Release each day's conversions once, whole, in time order (--allow-rerelease "
            f"to spend the budgets again)")


def held_counts(entries: Sequence[dict[str, Any]], held: HeldLookback) -> dict[str, int]:
    """What a release records of its lookback (``HELD``): per release in reach, how many conversions it held."""
    return {e["id"]: int(held.counts.get(e["id"], 0)) for e in in_reach(entries, held.period)}


@dataclass(frozen=True)
class HeldCombiner:
    """The job's count of the releases in its lookback (``araopt.combiner`` protocol): over the lookback's
    row ids, one batch per shard of complete impressions (a conversion lies in one shard, so the
    distinct ids of each batch add up to the distinct ids of the whole), how many conversions of each
    named release of ``history`` they hold; extracted as {entry id: count}."""

    history: ReleaseHistory

    def create(self) -> np.ndarray:
        return np.zeros(len(self.history.releases), dtype=np.int64)

    def add(self, acc: np.ndarray, row_ids: np.ndarray) -> np.ndarray:
        acc += self.history.held(row_ids)
        return acc

    def merge(self, accs: Sequence[np.ndarray]) -> np.ndarray:
        out = self.create()
        for acc in accs:
            out += acc
        return out

    def compact(self, acc: np.ndarray) -> np.ndarray:
        return acc

    def extract(self, acc: np.ndarray) -> dict[str, int]:
        return {name: int(n) for name, n in zip(self.history.names, acc, strict=True)}
