"""The release ledger: which conversions were released (the Aggregation Service's rule: each report
goes into one aggregation only; releasing the same conversions again lets averages strip the noise).

Keyed on rows, not files (``araopt.io.rowset``): a release is the set of conversions it used, whatever
files, order, compression, row groups or encodings they came in. At commit, under the run folder's
lock and before anything is moved into place, :meth:`Ledger.check_and_record` compares the release's
row set with every earlier release whose time window meets it; conversions released before refuse
the release (saying how many of how many) unless ``--allow-rerelease``, and the count is recorded.
A lossy re-export (times truncated to the millisecond or second, or the same instants in another time
zone) has other exact identities but the same coarse ones (``araopt.io.rowset.coarse_row_ids``): a
release more than ``LOSSY_OVERLAP_SHARE`` of whose coarse identities were released before (within
26 hours) is refused the same way; below that share the overlap is what different conversions of
the same impressions share by chance, and it is recorded (``coarse_rows_released_before``).
A re-export truncated (or rounded) to the minute keeps neither the exact identity nor the second;
its minute identities (``araopt.io.rowset.minute_row_ids``: the impression and its minute, matched
at the same or a neighbouring minute) are compared the same way (``minute_rows_released_before``).
The entry is appended to the ledger index by compare-and-swap (of two racing releases exactly one
appends; the other checks again and sees the first); if the commit then fails, it is taken out again.

Several stores release from the same log with several ledgers: ``measure --check-ledgers A,B`` reads
the others (read only) and warns when a release holds conversions one of them records as released.

Each entry also records the ``mechanism`` its release used (the parameter file's mechanism part:
count limit, encoding, queries, arm plan): a later release whose ``--lookback`` holds these
conversions costs them with it (:meth:`Ledger.release_history`, ``araopt.mechanism.lifetime``), as
the browser did. Entries recorded before that field existed are read through their ``params_sha256``
(today's parameters, or a version of the store with that checksum); otherwise a lookback they meet is
refused, since its budget cannot be costed.

One ledger per store: when ``--params`` names a parameter store (its root, ``STORE/versions/<v>`` or
``STORE/versions/<v>/params.json``), the ledger is ``STORE/ledger/`` and a ``--ledger`` elsewhere is
refused; else ``--ledger`` or ``$ARAOPT_LEDGER`` or ``~/.local/state/araopt``.
"""
from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from araopt.attribution.lifetime import CHARGED, ChargedWindow
from araopt.errors import InvalidParameters, PrivacyRefusal
from araopt.io.files import utc_now_iso
from araopt.io.rowset import (
    COARSE_MARGIN_US,
    LOSSY_OVERLAP_SHARE,
    MINUTE_MARGIN_US,
    Released,
    RowSet,
    RowSetPart,
    ShiftedMatch,
    SpilledRowSet,
    released_in,
    released_near,
    released_shifted,
)
from araopt.io.store import ParameterStore, StoreConflict, StoreError
from araopt.io.stores import open_store
from araopt.ledger.lifetime import (
    HELD,
    OVERLAPPING,
    HeldLookback,
    ReleasePeriod,
    held_counts,
    held_refusal,
    is_ara,
    lifetime_refusal,
    overlap_refusal,
    overlapping,
)
from araopt.mechanism.lifetime import ReleaseHistory
from araopt.mechanism.params import Params
from araopt.version import Api, ParameterVersion

RELEASE_FILES = "release_files"
"""A ledger entry's {path under release/: sha256} of the release folder's files (what its manifest lists):
a release folder read later (the privacy-safe tuner) is checked against it."""
MEASUREMENT_START = "measurement_start_us"
"""A ledger entry's declared measurement start (``measure --measurement-start``, µs since the epoch;
absent: none declared): the lifetime cap of later releases and the privacy-safe tuner read it."""


def default_ledger_root() -> str:
    return os.environ.get("ARAOPT_LEDGER") or os.path.join(os.path.expanduser("~"), ".local", "state", "araopt")


def _same_location(a: str, b: str) -> bool:
    if "://" in a or "://" in b:
        return a.rstrip("/") == b.rstrip("/")
    return os.path.realpath(a) == os.path.realpath(b)


def other_ledgers(spec: str | None, own: str | None) -> list[Ledger]:
    """``--check-ledgers A,B``: other stores' (or folders') ledgers, opened read-only before any work
    (unreachable or corrupt: one line), the release's own ledger left out."""
    roots = [r.strip() for r in (spec or "").split(",") if r.strip()]
    return [Ledger.open(r, allow_rerelease=True) for r in dict.fromkeys(roots)
            if own is None or not _same_location(r, own)]


def ledger_root(store: str | None, ledger: str | None) -> str:
    """Where releases are recorded: the parameter store's ledger, else ``--ledger`` or the default."""
    if store is None:
        return ledger or default_ledger_root()
    if ledger is not None and not _same_location(ledger, store):
        raise InvalidParameters(f"--ledger {ledger}: the parameters come from the store {store}, whose releases are "
                                f"recorded in its own ledger ({store}/ledger; one ledger per store): drop --ledger")
    return store


class LedgerRefusal(PrivacyRefusal):
    """A refusal by the release ledger: conversions of this input released before (and re-releasing
    not allowed), or a lookback holding the input's own conversions (their budget spent twice)."""


@dataclass(frozen=True)
class Recorded:
    """A release as recorded: the ledger entry, and how often its conversions had been released."""

    entry: dict[str, Any]
    rows_released_before: int
    release_number: int  # 1 + the most earlier releases any one of its conversions was in


@dataclass(frozen=True)
class Ledger:
    """A release ledger (a store's ``ledger/``) and whether re-releasing is allowed."""

    store: ParameterStore
    allow_rerelease: bool

    @classmethod
    def open(cls, root: str, allow_rerelease: bool) -> Ledger:
        """Open the ledger and read its index once: an unreachable or corrupt ledger fails before any work."""
        try:
            store = open_store(root)
            store.read_ledger()
        except (StoreError, ValueError) as exc:
            raise StoreError(f"release ledger: {exc}") from None
        return cls(store, allow_rerelease)

    def check_and_record(self, rows: RowSet | SpilledRowSet, row_set: bytes | Callable[[], bytes], entry: dict[str, Any],
                         attempts: int = 10,
                         entry_id: str | None = None, coarse: RowSet | SpilledRowSet | None = None,
                         charged: ChargedWindow | None = None, lifetime: HeldLookback | None = None,
                         minute: RowSet | SpilledRowSet | None = None,
                         carried: frozenset[str] = frozenset(),
                         content: RowSet | SpilledRowSet | None = None) -> Recorded:
        """Refuse ``rows`` if any was released before, or if more than ``LOSSY_OVERLAP_SHARE`` of them
        match released conversions by their ``coarse`` identity (a lossy re-export: the time truncated,
        or shifted by a time zone) or by their ``minute`` identity (the time truncated or rounded to the
        minute: ``released_near``; and in another time zone: ``released_shifted``, on a sample, recorded as
        ``minute_shift_*``), or (an attribution release) if the impression times its accepted
        reports used (``charged``: the matched reports' impression times) come within an epoch of an
        earlier attribution release's charged ones and that release is not one whose conversions this
        release's lookback simulated again whole (``carried``: the budget state carried, recorded as
        ``budget_carried_from``; else both would spend one epoch's budget: ``araopt.ledger.attribution``),
        unless re-releasing is allowed (the shared releases are recorded: ``epochs_shared_with``), or (an
        ARA release, ``lifetime``) if an ARA release within a source life before it is not held whole by its
        lookback, or one within a source life after it was made first (``araopt.ledger.lifetime``: never allowed, whatever
        ``allow_rerelease``; the lookback's counts are recorded: ``lookback_held``), all over the released rows' own
        first and last times, or if an ARA release of other conversions has a window meeting theirs (unless re-releasing
        is allowed: recorded as ``windows_overlap``); else append the release
        (``row_set``: its Parquet bytes, or a function making them; ``content``: an attribution release's
        rows' content identities, recorded as ``content_row_set``) with ``entry``'s fields, under
        ``entry_id`` (a new one if None; a commit names it in its pending record first). Retries when
        another release is recorded meanwhile. ``rows`` and ``coarse`` are compared range by range
        (``araopt.io.rowset.released_in``) with the earlier releases whose windows meet theirs only."""
        loaded: dict[tuple[str, str], np.ndarray] = {}

        try:
            for _ in range(attempts):
                releases, generation = self.store.read_ledger()
                if lifetime is not None:  # the lifetime cap: with the ledger as it is now, before anything else,
                    # over the released rows' own times (not the input's footers; no row spends no budget)
                    if rows.first_time_us is not None and rows.last_time_us is not None:
                        lifetime = HeldLookback(lifetime.period.exactly(rows.first_time_us, rows.last_time_us),
                                                lifetime.counts)
                    why = held_refusal(releases, lifetime, self.store.uri)
                    if why is not None:
                        raise LedgerRefusal(why)
                found, overlaps = self._released(rows, releases, loaded)
                before = found.before
                coarse_before = 0
                if coarse is not None:
                    near = _meeting(releases, coarse, "coarse_row_set", COARSE_MARGIN_US)
                    coarse_before = released_in(coarse, [self._ids(e, "coarse_row_set", loaded) for e in near]).before
                minute_before = 0
                if minute is not None:
                    near = _meeting(releases, minute, "minute_row_set", MINUTE_MARGIN_US)
                    minute_before = released_near(minute, [self._ids(e, "minute_row_set", loaded) for e in near])
                lossy = coarse is not None and coarse_before > LOSSY_OVERLAP_SHARE * max(len(coarse), 1)
                minute_rows = 0 if minute is None else len(minute)
                by_minute = minute_before > LOSSY_OVERLAP_SHARE * max(minute_rows, 1)
                shifted = None
                if minute is not None and not by_minute:
                    near = _meeting(releases, minute, "minute_row_set", COARSE_MARGIN_US)
                    if near:
                        shifted = released_shifted(minute, [self._ids(e, "minute_row_set", loaded) for e in near])
                by_shift = shifted is not None and _lossy_shift(shifted)
                shared = [] if charged is None else [e["id"] for e in releases
                                                     if shares_epochs(e, charged) and e["id"] not in carried]
                if (before or lossy or by_minute or by_shift or shared) and not self.allow_rerelease:
                    raise LedgerRefusal(self._refusal(rows, before, len(overlaps), coarse, coarse_before, lossy,
                                                      shared, (minute_before, minute_rows) if by_minute else None,
                                                      shifted if by_shift else None))
                meet = [] if lifetime is None else overlapping(releases, lifetime.period)
                if lifetime is not None and meet and not self.allow_rerelease:  # other conversions of the same hours
                    why = overlap_refusal(meet, lifetime.period, self.store.uri)
                    if why is not None:
                        raise LedgerRefusal(why)
                number = 1 + found.most
                record = {**entry, "id": entry_id or uuid.uuid4().hex, "recorded_at": utc_now_iso(), "rows": len(rows),
                          "first_time_us": rows.first_time_us, "last_time_us": rows.last_time_us,
                          "rows_released_before": before, "release_number": number, "overlaps": overlaps}
                if coarse is not None:
                    record.update(coarse_rows=len(coarse), coarse_rows_released_before=coarse_before)
                if minute is not None:
                    record.update(minute_rows=len(minute), minute_rows_released_before=minute_before)
                if shifted is not None:
                    record.update(minute_shift_sampled=shifted.sampled, minute_shift_matched=shifted.matched,
                                  minute_shift_minutes=shifted.shift_minutes)
                if charged is not None or carried:
                    record.update(epochs_shared_with=shared, budget_carried_from=sorted(carried))
                if lifetime is not None:
                    record[HELD] = held_counts(releases, lifetime)
                    if meet:  # made with --allow-rerelease only (overlap_refusal)
                        record[OVERLAPPING] = [e["id"] for e in meet]
                try:
                    recorded = self.store.append_release(record, row_set, generation,
                                                         None if coarse is None else coarse.to_parquet_bytes,
                                                         None if minute is None else minute.to_parquet_bytes,
                                                         None if content is None else content.to_parquet_bytes)
                except StoreConflict:
                    continue
                return Recorded(recorded, before, number)
        except StoreError as exc:
            raise StoreError(f"release ledger: {exc}") from None
        raise StoreConflict(f"release ledger {self.store.uri}: it kept changing during {attempts} attempts; nothing was "
                        f"released")

    def check_lifetime(self, period: ReleasePeriod) -> None:
        """Before any work: refuse (one line) a release of ``period`` whose lookback does not cover the ARA
        releases within a source life before it, or made after an ARA release within a source life after
        it (``araopt.ledger.lifetime``); checked again, exactly, at commit (``check_and_record(lifetime=)``), where
        an ARA release whose window meets the released rows' is refused too (after the re-release rules)."""
        try:
            releases, _ = self.store.read_ledger()
        except StoreError as exc:
            raise StoreError(f"release ledger: {exc}") from None
        why = lifetime_refusal(releases, period, self.store.uri)
        if why is not None:
            raise LedgerRefusal(why)

    def _ids(self, e: dict[str, Any], field: str, loaded: dict[tuple[str, str], np.ndarray]) -> np.ndarray:
        """The ids of entry ``e``'s row set ``field`` (``row_set``, ``coarse_row_set`` or ``minute_row_set``),
        read once per check."""
        if (e["id"], field) not in loaded:
            loaded[e["id"], field] = RowSet.from_parquet_bytes(self.store.read_row_set(e, field), e[field]).ids
        return loaded[e["id"], field]

    def _released(self, rows: RowSet | SpilledRowSet, releases: list[dict[str, Any]],
                  loaded: dict[tuple[str, str], np.ndarray]) -> tuple[Released, dict[str, int]]:
        """How much of ``rows`` was released in ``releases`` (entries of this ledger; only those whose
        windows meet are read), and per earlier release how many of them it held (only releases holding some)."""
        meeting = _meeting(releases, rows, "row_set", 0)
        found = released_in(rows, [self._ids(e, "row_set", loaded) for e in meeting])
        return found, {e["id"]: n for e, n in zip(meeting, found.per_set, strict=True) if n}

    def released_before(self, rows: RowSet | SpilledRowSet) -> tuple[int, int]:
        """Read only: (how many of ``rows`` this ledger records as released, in how many releases)."""
        try:
            releases, _ = self.store.read_ledger()
            found, overlaps = self._released(rows, releases, {})
        except StoreError as exc:
            raise StoreError(f"release ledger {self.store.uri}: {exc}") from None
        return found.before, len(overlaps)

    def measurement_start(self, declared_us: int | None) -> int | None:
        """The measurement's start for a release (``MEASUREMENT_START``; None: none): the ``declared_us``
        one, else the one the ledger's releases recorded (a release that declares none inherits it: one
        measurement, one start). Refused (one line) when the ledger records two, when the declared one
        differs from the recorded one, and when it is later than a recorded release's first conversion
        (``check_start``)."""
        try:
            releases, _ = self.store.read_ledger()
        except StoreError as exc:
            raise StoreError(f"release ledger: {exc}") from None
        starts = {int(e[MEASUREMENT_START]) for e in releases if e.get(MEASUREMENT_START) is not None}
        if len(starts) > 1:
            raise InvalidParameters(f"the ledger {self.store.uri} records {len(starts)} measurement starts: a "
                                    f"measurement has one start")
        start_us = declared_us if declared_us is not None else (starts.pop() if starts else None)
        check_start(releases, start_us)
        return start_us

    def release_history(self, first_time_us: int | None, last_time_us: int | None,
                        today: ParameterVersion, start_us: int | None = None) -> ReleaseHistory:
        """The earlier releases a lookback of conversion times [first, last] (None: unknown) may hold, each with the
        mechanism it released with (for Alg. 1 over the impression's life); every other recorded
        mechanism is kept as a candidate for lookback rows no release used. Refuses (one line) when an
        entry that meets the window does not say its mechanism and its ``params_sha256`` is unknown, and
        when the measurement's declared ``start_us`` (conversions before it cost nothing:
        ``ReleaseHistory.start_us``) is later than a recorded release's first conversion."""
        try:
            releases, _ = self.store.read_ledger()
            check_start(releases, start_us)
            known: dict[str, Params] = {today.checksum(): today.params}
            if any(e.get("mechanism") is None and e.get("params_sha256") not in known for e in releases):
                known = {**self._store_versions(), **known}
            pairs: list[tuple[Params, np.ndarray]] = []
            names: list[str] = []
            for entry in releases:
                window = RowSet(np.empty(0, dtype=np.uint64), entry["first_time_us"], entry["last_time_us"])
                meets = (window.may_meet(first_time_us, last_time_us) if None not in (first_time_us, last_time_us)
                         else entry["rows"] > 0)  # a lookback of unknown window may hold any release's rows
                params = self._mechanism_of(entry, known)
                if params is None and meets:
                    raise PrivacyRefusal(
                        f"the lookback holds conversions released by ledger entry {entry['id']} with parameters "
                        f"(sha256 {entry.get('params_sha256')}) that neither the ledger nor the store {self.store.uri} "
                        f"records: their budget cannot be costed; drop those days from --lookback or publish that "
                        f"parameter file in the store")
                if params is not None:  # one that does not meet the window: a candidate for unrecorded rows
                    ids = (RowSet.from_parquet_bytes(self.store.read_row_set(entry), entry["row_set"]).ids if meets
                           else np.empty(0, dtype=np.uint64))
                    pairs.append((params, ids))
                    names.append(entry["id"])
        except StoreError as exc:
            raise StoreError(f"release ledger: {exc}") from None
        return ReleaseHistory.of(pairs, names, start_us=start_us)

    @staticmethod
    def _mechanism_of(entry: dict[str, Any], known: dict[str, Params]) -> Params | None:
        """The mechanism an entry released with: its ``mechanism`` field, else its ``params_sha256``
        among the ``known`` parameter files; None when unknown."""
        if entry.get("mechanism") is not None:
            return ParameterVersion.from_json(entry["mechanism"], source=f"ledger entry {entry['id']}").params
        sha = entry.get("params_sha256")
        return known.get(sha) if isinstance(sha, str) else None

    def _store_versions(self) -> dict[str, Params]:
        """sha256 -> parameters of every readable version of the store (for entries without ``mechanism``)."""
        out: dict[str, Params] = {}
        for name in self.store.list_versions():
            try:
                resolved = self.store.resolve(name)
                out[resolved.sha256] = ParameterVersion.from_bytes(resolved.payload, resolved.uri).params
            except (StoreError, ValueError):
                continue
        return out

    def _refusal(self, rows: RowSet | SpilledRowSet, before: int, releases: int, coarse: RowSet | SpilledRowSet | None,
                 coarse_before: int, lossy: bool, shared: Sequence[str] = (),
                 by_minute: tuple[int, int] | None = None, shifted: ShiftedMatch | None = None) -> str:
        """Why a release is refused: its conversions released before, exactly and (a lossy re-export) by
        their coarse or minute identity (``by_minute``: matched, of how many), or their minute identity in
        another time zone (``shifted``); epochs an earlier attribution release charged."""
        if shared and not before and not lossy and by_minute is None and shifted is None:
            return (f"this attribution release charges the budgets of impressions less than an epoch from those "
                    f"{len(shared)} earlier attribution release(s) in the ledger {self.store.uri} charged (e.g. "
                    f"{shared[-1]}) and its lookback did not simulate their conversions again whole, so a browser's "
                    f"epoch would spend its per-site budget again: pass --lookback-days N with every day those "
                    f"releases released (or --lookback), release conversions whose impressions lie an epoch or more "
                    f"from theirs, or pass --allow-rerelease to do it anyway (it is recorded)")
        said = []
        if before:
            said.append(f"{before:,} of the {len(rows):,} conversions of this input were already released ({releases} "
                        f"earlier release(s) in the ledger {self.store.uri})")
        if lossy and coarse is not None:
            said.append(f"{coarse_before:,} of the {len(coarse):,} conversions of this input match conversions "
                        f"released before by impression id and time to the second (modulo 15 minutes), more than the "
                        f"{LOSSY_OVERLAP_SHARE:.0%} that different conversions of the same impressions share by chance: "
                        f"a re-export of released conversions at a coarser time precision or in another time zone")
        if by_minute is not None:
            said.append(f"{by_minute[0]:,} of the {by_minute[1]:,} conversions of this input match conversions "
                        f"released before by impression id and minute (the same or a neighbouring one), more than "
                        f"the {LOSSY_OVERLAP_SHARE:.0%} that different conversions of the same impressions share by "
                        f"chance: a re-export of released conversions truncated or rounded to the minute")
        if shifted is not None:
            said.append(_shift_said(shifted, "conversions released before"))
        return ("; ".join(said) + "; releasing them again lets averages strip the noise. Pass --allow-rerelease to do "
                "it anyway (it is recorded)")

    def rollback_entry(self, entry_id: str) -> bool:
        """Take release ``entry_id`` out again if it is recorded (its commit published nothing); True if it
        is not in the ledger now. A failure is logged (the run's own error is what the user must see):
        until it is taken out the ledger over-counts one release (the safe direction)."""
        try:
            self.store.remove_release(entry_id)
        except StoreError as exc:
            logging.getLogger(__name__).error(
                "release ledger: the commit failed and release %s could not be taken out of %s (%s): the ledger "
                "over-counts one release (the safe direction)", entry_id, self.store.uri, exc)
            return False
        return True


def shares_epochs(entry: dict[str, Any], charged: ChargedWindow) -> bool:
    """Whether the earlier release ``entry`` (an attribution release) may have charged an epoch of the
    impressions ``charged``. An attribution entry recorded before the charged window was kept is
    taken to have charged every impression its conversions could use (its lookback before them)."""
    if entry.get("api") != Api.ATTRIBUTION.value:
        return False
    if CHARGED in entry:
        return entry[CHARGED] is not None and ChargedWindow.from_json(entry[CHARGED]).shares_epochs_with(charged)
    if entry.get("first_time_us") is None or entry.get("last_time_us") is None:
        return False  # (no conversions: nothing charged)
    attribution = ParameterVersion.from_json(entry["mechanism"], source=f"ledger entry {entry['id']}").attribution
    if attribution is None:
        raise PrivacyRefusal(f"ledger entry {entry['id']} is an attribution release without its parameters: the "
                             f"epochs it charged cannot be known")
    day_us = 86_400_000_000
    window = ChargedWindow(int(entry["first_time_us"]) - attribution.lookback_days * day_us, int(entry["last_time_us"]),
                           attribution.epoch_days * day_us)
    return window.shares_epochs_with(charged)


class Identities(NamedTuple):
    """The exact, coarse and minute identities of some conversions (``araopt.io.rowset``;
    ``SpilledRowSet.merge_runs`` makes them on disk, :func:`identities` in memory)."""

    exact: RowSet | SpilledRowSet
    coarse: RowSet | SpilledRowSet
    minute: RowSet | SpilledRowSet


def identities(parts: Sequence[RowSetPart]) -> Identities:
    """The exact, coarse and minute identities of ``parts``, in memory."""
    return Identities(RowSet.merge(parts), RowSet.merge(p.coarse_part() for p in parts),
                      RowSet.merge(p.minute_part() for p in parts))


def _meeting(releases: Sequence[dict[str, Any]], rows: RowSet | SpilledRowSet, field: str, margin_us: int
             ) -> list[dict[str, Any]]:
    """The ledger entries that record a ``field`` row set and whose conversion-time window meets that of
    ``rows`` widened by ``margin_us``: the only ones whose row sets are read."""
    return [e for e in releases if field in e and rows.may_meet(e["first_time_us"], e["last_time_us"], margin_us)]


SHIFT_MIN_MATCHES = 10
"""Matches at the best of the ~200 time-zone shifts tried that a small release's different conversions
of the same impressions reach by chance (2 of a sample of 12 did, in a red-team run): below it a match
refuses only when most of the sample matched (a re-export matches all of it)."""


def _lossy_shift(shifted: ShiftedMatch) -> bool:
    """Whether more than ``LOSSY_OVERLAP_SHARE`` of the sample matched at one time-zone shift, and either
    ``SHIFT_MIN_MATCHES`` conversions or most of the sample did (the best of many shifts: chance)."""
    share = shifted.matched > LOSSY_OVERLAP_SHARE * max(shifted.sampled, 1)
    return share and (shifted.matched >= SHIFT_MIN_MATCHES or 2 * shifted.matched > shifted.sampled)


def _shift_said(shifted: ShiftedMatch, whose: str) -> str:
    hours, minutes = divmod(abs(shifted.shift_minutes), 60)
    sign = "+" if shifted.shift_minutes > 0 else "-"
    return (f"{shifted.matched:,} of a sample of {shifted.sampled:,} conversions of this input match {whose} by "
            f"impression id and minute shifted by {sign}{hours}h{minutes:02d}, more than the "
            f"{LOSSY_OVERLAP_SHARE:.0%} that different conversions of the same impressions share by chance: a "
            f"re-export truncated or rounded to the minute in another time zone")


def check_lookback(period: Sequence[RowSetPart] | Identities, lookback: Sequence[RowSetPart] | Identities) -> None:
    """Refuse a --lookback that holds the period's own conversions (the same rows in another file, or
    re-exported in another time zone or at a coarser time precision): Alg. 1 would spend their budget
    twice, once as lookback and once as released. By the ledger's identities: any exact match
    refuses; coarse matches (``araopt.io.rowset.coarse_row_ids``) and minute matches (``minute_row_ids``,
    a re-export truncated to the minute; ``released_shifted``: truncated to the minute in another time
    zone, on a sample) refuse above ``LOSSY_OVERLAP_SHARE`` of the period's conversions (below it they are
    different conversions of the same impressions that share a second modulo 15 minutes, or a minute, by
    chance). Compared range by range (``released_in``)."""
    (rows, coarse, minute), (earlier, coarse_earlier, minute_earlier) = (
        ids if isinstance(ids, tuple) else identities(ids) for ids in (period, lookback))
    exact = released_in(rows, [earlier]).before
    if exact:
        raise LedgerRefusal(f"--lookback holds {exact:,} of the {len(rows):,} conversions of --input (the same "
                            f"impression id and conversion time): the lookback is the days before the input, and "
                            f"counting these as both would spend their budget twice. Remove the input's own rows from "
                            f"--lookback")
    for matched, of, how, disguise in (
            (released_in(coarse, [coarse_earlier]).before, len(coarse), "time to the second (modulo 15 minutes)",
             "another time zone or time precision"),
            (released_near(minute, [minute_earlier]), len(minute), "minute (the same or a neighbouring one)",
             "truncated or rounded to the minute")):
        if matched > LOSSY_OVERLAP_SHARE * max(of, 1):
            raise LedgerRefusal(f"--lookback holds {matched:,} of the {of:,} conversions of --input by impression id "
                                f"and {how}, more than the {LOSSY_OVERLAP_SHARE:.0%} that different conversions of the "
                                f"same impressions share by chance: it looks like the input's own conversions exported "
                                f"again ({disguise}), whose budget would be spent twice. Remove them from --lookback")
    shifted = released_shifted(minute, [minute_earlier])
    if _lossy_shift(shifted):
        raise LedgerRefusal(f"--lookback: {_shift_said(shifted, 'the lookback')}, whose budget would be spent twice. "
                            f"Remove them from --lookback")


def check_start(releases: Sequence[dict[str, Any]], start_us: int | None) -> None:
    """Refuses (one line) a measurement start (``ReleaseHistory.start_us``; None: none) later than the
    first conversion of a recorded ARA release (it would cost that release's conversions nothing) or other
    than the start a recorded release declared (a measurement has one start)."""
    if start_us is None:
        return
    early = [e["id"] for e in releases if is_ara(e) and e.get("rows", 0) > 0 and e.get("first_time_us") is not None
             and e["first_time_us"] < start_us]
    if early:
        raise PrivacyRefusal(f"the declared measurement start is later than the conversions released by ledger "
                             f"entry {early[0]}: a start cannot follow a release (it would cost that release's "
                             f"conversions nothing)")
    other = [e["id"] for e in releases if e.get(MEASUREMENT_START) not in (None, start_us)]
    if other:
        raise InvalidParameters(f"ledger entry {other[0]} was released with another --measurement-start: a "
                                f"measurement has one start")
