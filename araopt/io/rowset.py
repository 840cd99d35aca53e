"""The identity of a conversion and the set of conversions a release used (for the release ledger).

A conversion is identified by its impression id and its conversion time to the microsecond: the
event itself, not the file it came in, the row order, the compression, row groups, encodings, integer
widths, timestamp units or the columns a parameter file happens to use (``Conversions.record_keys``
hashes the chosen slice and value columns too, so a release with other parameters would look new).
Ids are canonical (``araopt.io.ids``: 123, "123" and "000123" are one impression), as everywhere
else. Two conversions of one impression in the same microsecond count as one (conservative: it can
only make a release look more overlapping, never less).

``conversion_row_ids`` maps (id, time) to 64 bits, vectorised: ``mix(h(id) + time)`` with ``h`` the
canonical id hash (``araopt.io.ids``: the splitmix64 finalizer ``mix`` of an integer's bits; a
string's SipHash-2-4 with pandas' fixed key, then ``mix``). Golden values in the tests pin the
function: a ledger is only as good as the stability of its hashes. At 64 bits, a release of 10^7
conversions checked against 10^9 released ones has an expected 5·10^-4 spurious matches.

A lossy re-export (times truncated to the millisecond or second, or the same instants written in
another time zone) changes every exact identity; ``coarse_row_ids`` is a second identity that
survives it: the canonical id and the second of the time modulo 15 minutes (``COARSE_PERIOD_S``).
It also collides for different conversions of one impression (1 in 900 per pair), so a coarse
overlap is judged by its share (``LOSSY_OVERLAP_SHARE``), compared only within ``COARSE_MARGIN_US``.
Truncating to the minute (``DATETIME`` formatted ``%Y-%m-%d %H:%M``, SQL Server's ``SMALLDATETIME``)
loses the second, so ``minute_row_ids`` is a third identity: the canonical id's hash with the
conversion's UTC minute in its low 24 bits (offset by the id's own hash: without the id, the set
shows only minute differences within an impression); a conversion matches when the same
impression's minute or either neighbouring minute was released (``released_near``: rounding to the
minute moves it by at most one). Different conversions of one impression match only within a
minute of each other, so across releases of disjoint periods only at their boundary. Time-zone
shifts of a minute-truncated export are not caught (only 15 minute values per quarter hour would
be left to compare).

A :class:`RowSet` is the sorted, deduplicated ids of one release plus its time window (releases
whose windows do not meet cannot share a conversion). Stored as Parquet, one ``uint64`` column with
DELTA_BINARY_PACKED encoding: about 5.9 bytes per conversion at 10^6 conversions (the entropy
of a random set of that size is 5.7); a release's coarse identities are a second row set.

Streamed, for releases of any size: ids are uniform 64-bit hashes, so a sorted id set cuts into
``2**RANGE_BITS`` ranges by its top bits (``chunks``), each a small sorted array. The workers write
their batches' ids sorted (``RowSetPart.sorted``); :meth:`SpilledRowSet.merge_runs` distributes those
sorted runs over one local file per range and deduplicates each range on its own, and
:func:`released_in` compares two sets range by range: the driver never holds more than a range of a
release (plus the earlier releases it is checked against, those whose windows meet only).
"""
from __future__ import annotations

import io
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from araopt.errors import InvalidInput
from araopt.io.conversions import IMPRESSION_ID
from araopt.io.ids import canonical_id_hash, mix_in_place, table_id_hash

TIME_US: Final = "conversion_time_us"
ROW_ID: Final = "row_id"
COARSE_ID: Final = "coarse_id"
COARSE_PERIOD_S: Final = 900
"""The coarse identity keeps the conversion time's second modulo 15 minutes: every time zone's offset
from UTC (and a daylight-saving shift) is a whole number of quarter hours, and truncating to the
millisecond (``TIMESTAMP(3)``) or the second keeps the second."""
COARSE_MARGIN_US: Final = 26 * 3_600_000_000
"""Two exports of the same instants in different time zones are at most 26 hours apart (UTC-12 to
UTC+14): coarse identities are compared with every release whose window, widened by this, meets."""
LOSSY_OVERLAP_SHARE: Final = 0.05
"""A release (or a lookback) more than this share of whose coarse identities match released conversions
(or the period's own) is a lossy re-export of them, not chance. Different conversions of the same
impressions match with probability 1/900 per pair; compared only within 26 hours (``COARSE_MARGIN_US``)
the chance share measured on synthetic daily logs (``benchmarks/ledger.py --coincidences``, 49 days,
10 and 30 conversions per impression) is at most 0.10% / 0.30% against earlier releases and 0.06% /
0.20% against a lookback, while a re-export matches (nearly) all its rows."""
MINUTE_ID: Final = "minute_id"
MINUTE_US: Final = 60_000_000
MINUTE_MARGIN_US: Final = 2 * MINUTE_US
"""Minute identities are compared with the releases whose window, widened by this, meets (a neighbouring
minute of one at either end of the window)."""
_MINUTE_BITS: Final = 24  # 2**24 minutes: 32 years, far beyond any two windows that meet
_MINUTE_LOW: Final = np.uint64((1 << _MINUTE_BITS) - 1)
_MINUTE_HIGH: Final = ~_MINUTE_LOW
_COARSE_SALT: Final = np.uint64(0x9E3779B97F4A7C15)
_CHUNK: Final = 1 << 16  # cache-sized blocks: 3x faster than whole-array passes at 10^7 rows
RANGE_BITS: Final = 6
"""A sorted id set is streamed in ``2**RANGE_BITS`` ranges of ids (by their top bits): at 3·10^7
conversions about 470k ids (3.7 MB) per range."""


def conversion_row_ids(impression_id: np.ndarray | pa.Array | pa.ChunkedArray,
                       conversion_time_us: np.ndarray | pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The 64-bit identity of each conversion (see module doc), vectorised in cache-sized blocks."""
    return _exact_ids(canonical_id_hash(impression_id), _times(conversion_time_us))


def hashed_row_ids(id_hashes: np.ndarray, conversion_time_us: np.ndarray) -> np.ndarray:
    """``conversion_row_ids`` from the ids' canonical hashes (``Conversions.id_hashes``), not consumed."""
    return _exact_ids(np.array(id_hashes, dtype=np.uint64), _times(conversion_time_us))


def coarse_row_ids(impression_id: np.ndarray | pa.Array | pa.ChunkedArray,
                   conversion_time_us: np.ndarray | pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The coarse 64-bit identity of each conversion: its canonical impression id and the second of its
    time modulo 15 minutes (``COARSE_PERIOD_S``), so that a re-export that truncated the time to the
    millisecond or second, or wrote the same instants in another time zone (naive local time), has
    the same coarse identities. Coarse identities of different conversions of one impression collide
    by chance (1 in 900 per pair): an overlap is judged by its share (``LOSSY_OVERLAP_SHARE``)."""
    return _coarse_ids(canonical_id_hash(impression_id), _times(conversion_time_us))


def minute_row_ids(impression_id: np.ndarray | pa.Array | pa.ChunkedArray,
                   conversion_time_us: np.ndarray | pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The minute identity of each conversion: the top 40 bits of its canonical impression id's hash, and
    in the low 24 bits its UTC minute plus the hash's low bits (mod 2**24), so that one impression's
    neighbouring minutes are neighbouring ids (``minute_neighbours``); without the id, the minute is hidden.
    A re-export that truncated the time to the minute, second or millisecond has the same minute
    identities; one rounded to the minute has a neighbour's (``released_near`` checks both)."""
    return _minute_ids(canonical_id_hash(impression_id), _times(conversion_time_us))


def _minute_ids(words: np.ndarray, times: np.ndarray) -> np.ndarray:
    """``minute_row_ids`` from the id hashes (consumed)."""
    if len(times) != len(words):
        raise InvalidInput(f"{len(words)} ids but {len(times)} times")
    minute = np.floor_divide(times, MINUTE_US).view(np.uint64)
    low = (minute + words) & _MINUTE_LOW
    words &= _MINUTE_HIGH
    words |= low
    return words


def minute_neighbours(ids: np.ndarray, step: int) -> np.ndarray:
    """The minute identities ``step`` minutes from ``ids`` (same impression: the top bits are kept, so a
    neighbour is in the same id range, ``RANGE_BITS``)."""
    moved = (ids + np.uint64(step % (1 << _MINUTE_BITS))) & _MINUTE_LOW
    return (ids & _MINUTE_HIGH) | moved


def _times(conversion_time_us: np.ndarray | pa.Array | pa.ChunkedArray) -> np.ndarray:
    if isinstance(conversion_time_us, pa.ChunkedArray | pa.Array):
        conversion_time_us = conversion_time_us.to_numpy(zero_copy_only=False)
    return np.ascontiguousarray(conversion_time_us, dtype=np.int64)


def _exact_ids(words: np.ndarray, times: np.ndarray) -> np.ndarray:
    """``mix(h(id) + time)`` from the id hashes (consumed: the result is computed in place)."""
    if len(times) != len(words):
        raise InvalidInput(f"{len(words)} ids but {len(times)} times")
    as_bits = times.view(np.uint64)
    tmp = np.empty(min(_CHUNK, len(words)), dtype=np.uint64)
    for start in range(0, len(words), _CHUNK):
        block = words[start:start + _CHUNK]
        block += as_bits[start:start + _CHUNK]
        mix_in_place(block, tmp[:len(block)])
    return words


def _coarse_ids(words: np.ndarray, times: np.ndarray) -> np.ndarray:
    """``mix(h(id) + second mod 900 + salt)`` from the id hashes (consumed)."""
    if len(times) != len(words):
        raise InvalidInput(f"{len(words)} ids but {len(times)} times")
    second = np.floor_divide(times, 1_000_000) % COARSE_PERIOD_S
    words += second.astype(np.uint64) + _COARSE_SALT
    mix_in_place(words, np.empty_like(words))
    return words


def table_row_ids(table: pa.Table) -> np.ndarray:
    """Row ids of a validated table (``impression_id`` and ``conversion_time_us``, as ``validate_batch``
    makes them); any subset of rows may be passed (e.g. only the rows being released)."""
    return conversion_row_ids(table.column(IMPRESSION_ID), table.column(TIME_US))


def sorted_unique(ids: np.ndarray) -> np.ndarray:
    """Sorted distinct ids (sort + neighbour mask: ``np.unique`` is much slower here)."""
    out = np.sort(np.asarray(ids, dtype=np.uint64))
    if len(out) > 1:
        keep = np.empty(len(out), dtype=bool)
        keep[0] = True
        np.not_equal(out[1:], out[:-1], out=keep[1:])
        if not keep.all():
            out = out[keep]
    return out


@dataclass(frozen=True)
class RowSetPart:
    """Ids, coarse ids and minute ids of some rows (unsorted, with repeats) and their time range: mergeable."""

    ids: np.ndarray
    first_time_us: int | None
    last_time_us: int | None
    coarse: np.ndarray | None = None
    minute: np.ndarray | None = None

    @classmethod
    def of_table(cls, table: pa.Table) -> RowSetPart:
        if table.num_rows == 0:
            empty = np.empty(0, dtype=np.uint64)
            return cls(empty, None, None, empty, empty)
        bounds = pc.min_max(table.column(TIME_US))
        words, times = table_id_hash(table, IMPRESSION_ID), _times(table.column(TIME_US))
        coarse = _coarse_ids(words.copy(), times)  # the id hashed once for all identities
        minute = _minute_ids(words.copy(), times)
        return cls(_exact_ids(words, times), bounds["min"].as_py(), bounds["max"].as_py(), coarse, minute)

    def sorted(self) -> RowSetPart:
        """The same ids, each identity sorted (a sorted run: what :meth:`SpilledRowSet.merge_runs` merges)."""
        return RowSetPart(np.sort(self.ids), self.first_time_us, self.last_time_us,
                          None if self.coarse is None else np.sort(self.coarse),
                          None if self.minute is None else np.sort(self.minute))

    def coarse_part(self) -> RowSetPart:
        """The coarse ids as a part of their own (for :meth:`RowSet.merge`)."""
        coarse = np.empty(0, dtype=np.uint64) if self.coarse is None else self.coarse
        return RowSetPart(coarse, self.first_time_us, self.last_time_us)

    def minute_part(self) -> RowSetPart:
        """The minute ids as a part of their own (for :meth:`RowSet.merge`)."""
        minute = np.empty(0, dtype=np.uint64) if self.minute is None else self.minute
        return RowSetPart(minute, self.first_time_us, self.last_time_us)

    def to_arrow_bytes(self) -> bytes:
        """An Arrow IPC file (fast to write from a worker and to read back on the driver)."""
        meta = {b"first_time_us": str(self.first_time_us).encode(), b"last_time_us": str(self.last_time_us).encode()}
        columns = {ROW_ID: pa.array(self.ids, type=pa.uint64())}
        if self.coarse is not None:
            columns[COARSE_ID] = pa.array(self.coarse, type=pa.uint64())
        if self.minute is not None:
            columns[MINUTE_ID] = pa.array(self.minute, type=pa.uint64())
        table = pa.table(columns).replace_schema_metadata(meta)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        return cast(bytes, sink.getvalue().to_pybytes())

    @classmethod
    def from_arrow_bytes(cls, data: bytes) -> RowSetPart:
        table = pa.ipc.open_file(pa.BufferReader(data)).read_all()
        first, last = (_bound(table.schema.metadata or {}, name) for name in (b"first_time_us", b"last_time_us"))
        coarse, minute = (table.column(name).to_numpy(zero_copy_only=False).astype(np.uint64, copy=False)
                          if name in table.column_names else None for name in (COARSE_ID, MINUTE_ID))
        return cls(table.column(ROW_ID).to_numpy(zero_copy_only=False).astype(np.uint64, copy=False), first, last,
                   coarse, minute)


def _bound(meta: dict[bytes, bytes], name: bytes) -> int | None:
    raw = meta.get(name, b"None").decode()
    return None if raw == "None" else int(raw)


@dataclass(frozen=True)
class RowSet:
    """The distinct conversion ids of one release (sorted) and its conversion-time window (µs)."""

    ids: np.ndarray
    first_time_us: int | None
    last_time_us: int | None

    def __len__(self) -> int:
        return len(self.ids)

    @classmethod
    def merge(cls, parts: Iterable[RowSetPart | RowSet]) -> RowSet:
        parts = list(parts)
        firsts = [p.first_time_us for p in parts if p.first_time_us is not None]
        lasts = [p.last_time_us for p in parts if p.last_time_us is not None]
        ids = np.concatenate([p.ids for p in parts]) if parts else np.empty(0, dtype=np.uint64)
        return cls(sorted_unique(ids), min(firsts) if firsts else None, max(lasts) if lasts else None)

    def may_meet(self, first_time_us: int | None, last_time_us: int | None, margin_us: int = 0) -> bool:
        """Whether a release with this time window (widened by ``margin_us`` on both sides) can share a
        conversion with this set."""
        return windows_meet(self.first_time_us, self.last_time_us, first_time_us, last_time_us, margin_us)

    def chunks(self) -> Iterator[np.ndarray]:
        """The ids range by range (``RANGE_BITS``): views, sorted, in order."""
        return range_chunks(self.ids)

    def contained_in(self, released: np.ndarray) -> np.ndarray:
        """Mask over ``ids``: which are in ``released`` (sorted distinct ids)."""
        return contained(self.ids, released)

    def to_parquet_bytes(self) -> bytes:
        buf = io.BytesIO()
        table = pa.table({ROW_ID: pa.array(self.ids, type=pa.uint64())})
        meta = {b"first_time_us": str(self.first_time_us).encode(), b"last_time_us": str(self.last_time_us).encode()}
        pq.write_table(table.replace_schema_metadata(meta), buf, use_dictionary=False, compression="none",
                       column_encoding={ROW_ID: "DELTA_BINARY_PACKED"}, write_statistics=False)
        return buf.getvalue()

    @classmethod
    def from_parquet_bytes(cls, data: bytes, source: str = "row set") -> RowSet:
        try:
            table = pq.read_table(io.BytesIO(data))
            ids = table.column(ROW_ID).to_numpy(zero_copy_only=False).astype(np.uint64, copy=False)
        except (pa.ArrowException, KeyError) as exc:
            raise InvalidInput(f"{source} is not a row set: {str(exc).splitlines()[0]}") from None
        meta = table.schema.metadata or {}
        if len(ids) > 1 and not bool(np.all(ids[1:] > ids[:-1])):
            raise InvalidInput(f"{source} is not sorted and distinct")
        return cls(ids, _bound(meta, b"first_time_us"), _bound(meta, b"last_time_us"))


def windows_meet(first: int | None, last: int | None, other_first: int | None, other_last: int | None,
                 margin_us: int = 0) -> bool:
    """Whether two conversion-time windows (µs; None: empty) meet once the second is widened by ``margin_us``."""
    if first is None or last is None or other_first is None or other_last is None:
        return False
    return other_first - margin_us <= last and first <= other_last + margin_us


def _range_offsets(sorted_ids: np.ndarray) -> np.ndarray:
    """Where each id range (``RANGE_BITS``) starts in ``sorted_ids``, and its end: 2**RANGE_BITS + 1 offsets."""
    edges = np.arange(1, 1 << RANGE_BITS, dtype=np.uint64) << np.uint64(64 - RANGE_BITS)
    return np.concatenate([[0], np.searchsorted(sorted_ids, edges), [len(sorted_ids)]]).astype(np.int64)


def range_chunks(sorted_ids: np.ndarray) -> Iterator[np.ndarray]:
    """A sorted id array range by range (``RANGE_BITS``): views."""
    offsets = _range_offsets(sorted_ids)
    for i in range(1 << RANGE_BITS):
        yield sorted_ids[offsets[i]:offsets[i + 1]]


def contained(ids: np.ndarray, released: np.ndarray) -> np.ndarray:
    """Mask over sorted ``ids``: which are in ``released`` (sorted distinct)."""
    if len(released) == 0 or len(ids) == 0:
        return np.zeros(len(ids), dtype=bool)
    where = np.searchsorted(released, ids)
    where[where == len(released)] = 0
    return cast(np.ndarray, released[where] == ids)


@dataclass(frozen=True)
class Released:
    """How much of a set was released before: ``before`` of its ids are in at least one of the earlier
    sets, ``most``: the most earlier sets one id is in, ``per_set``: per earlier set, how many it holds."""

    before: int
    most: int
    per_set: tuple[int, ...]


def released_in(rows: RowSet | SpilledRowSet, released: Sequence[np.ndarray | RowSet | SpilledRowSet]) -> Released:
    """Which of ``rows`` the ``released`` sets (sorted distinct id arrays, or sets) hold, range by range:
    never more than one range of ``rows`` in memory."""
    streams = [range_chunks(r) if isinstance(r, np.ndarray) else r.chunks() for r in released]
    before, most, per_set = 0, 0, [0] * len(released)
    for chunk in rows.chunks():
        count = np.zeros(len(chunk), dtype=np.int32)
        for i, stream in enumerate(streams):
            hit = contained(chunk, next(stream))
            per_set[i] += int(np.count_nonzero(hit))
            count += hit
        if len(chunk):
            before += int(np.count_nonzero(count))
            most = max(most, int(count.max()))
    return Released(before, most, tuple(per_set))


def released_near(minute: RowSet | SpilledRowSet, released: Sequence[np.ndarray | RowSet | SpilledRowSet]) -> int:
    """How many of the ``minute`` identities (``minute_row_ids``) the ``released`` minute sets hold, at
    the same minute or a neighbouring one (a re-export rounded, not truncated, to the minute), range by
    range: a neighbour is in the same range."""
    streams = [range_chunks(r) if isinstance(r, np.ndarray) else r.chunks() for r in released]
    before = 0
    for chunk in minute.chunks():
        hit = np.zeros(len(chunk), dtype=bool)
        for stream in streams:
            earlier = next(stream)
            for step in (0, -1, 1):
                hit |= contained(chunk if step == 0 else minute_neighbours(chunk, step), earlier)
        before += int(np.count_nonzero(hit))
    return before


SHIFT_SAMPLE: Final = 8192
"""How many of a release's minute identities :func:`released_shifted` tries at every time-zone shift (a
stride sample over their sorted ids: hash order, so any rows alike). A re-export matches (nearly) all of
them at its shift; chance matches at one shift are a few in a thousand (a share far below
``LOSSY_OVERLAP_SHARE``, whose binomial spread at this size is ~0.1 point)."""
TIME_ZONE_SHIFTS_MIN: Final = tuple(m for m in range(-26 * 60, 26 * 60 + 1, 15) if m % (24 * 60))
"""The shifts, in minutes, between two exports of the same instants in two time zones: differences of
UTC offsets (UTC-12 to UTC+14, whole quarter hours). Zero is ``released_near``'s; a whole day is left
out: it cannot be told from an impression converting again at the same minute the next day (a daily
renewal), and only zones a day apart (UTC-10 / UTC+14) make it."""


@dataclass(frozen=True)
class ShiftedMatch:
    """The time-zone shift at which most of a sample of minute identities match released ones
    (``released_shifted``): how many matched, of how many sampled."""

    matched: int
    sampled: int
    shift_minutes: int


def released_shifted(minute: RowSet | SpilledRowSet,
                     released: Sequence[np.ndarray | RowSet | SpilledRowSet]) -> ShiftedMatch:
    """The best of :data:`TIME_ZONE_SHIFTS_MIN` for a sample (``SHIFT_SAMPLE``) of the ``minute``
    identities: at which shift (and its neighbouring minutes, a rounded time) most of them are held by the
    ``released`` minute sets. A re-export truncated to the minute *and* written in another time zone keeps
    neither the second (the coarse identity) nor the UTC minute, but every row's minute moves by one
    shift: its identities are the released ones moved along their impression's minutes
    (``minute_neighbours``, in the same id range). Range by range, as :func:`released_near`."""
    stride = max(1, len(minute) // SHIFT_SAMPLE)
    streams = [range_chunks(r) if isinstance(r, np.ndarray) else r.chunks() for r in released]
    hits = np.zeros(len(TIME_ZONE_SHIFTS_MIN), dtype=np.int64)
    sampled = 0
    for chunk in minute.chunks():
        earlier = [next(stream) for stream in streams]
        sample = chunk[::stride]
        sampled += len(sample)
        if not len(sample):
            continue
        for i, shift in enumerate(TIME_ZONE_SHIFTS_MIN):
            hit = np.zeros(len(sample), dtype=bool)
            for ids in earlier:
                for step in (shift - 1, shift, shift + 1):
                    hit |= contained(minute_neighbours(sample, step), ids)
            hits[i] += int(np.count_nonzero(hit))
    best = int(np.argmax(hits))
    return ShiftedMatch(int(hits[best]), sampled, TIME_ZONE_SHIFTS_MIN[best])


def _parquet_schema_meta(first: int | None, last: int | None) -> dict[bytes, bytes]:
    return {b"first_time_us": str(first).encode(), b"last_time_us": str(last).encode()}


@dataclass(frozen=True)
class SpilledRowSet:
    """A :class:`RowSet` kept on local disk, one file of sorted distinct ids per id range (``RANGE_BITS``):
    for releases too large to hold whole. Made by :meth:`merge_runs` (the identities of all three kinds)."""

    directory: str
    sizes: tuple[int, ...]
    first_time_us: int | None
    last_time_us: int | None

    def __len__(self) -> int:
        return sum(self.sizes)

    def _path(self, i: int) -> str:
        return os.path.join(self.directory, f"range-{i:03d}.u64")

    def chunks(self) -> Iterator[np.ndarray]:
        for i in range(len(self.sizes)):
            yield np.fromfile(self._path(i), dtype=np.uint64)

    def may_meet(self, first_time_us: int | None, last_time_us: int | None, margin_us: int = 0) -> bool:
        return windows_meet(self.first_time_us, self.last_time_us, first_time_us, last_time_us, margin_us)

    def to_parquet_bytes(self) -> bytes:
        """The row set's Parquet file (as :meth:`RowSet.to_parquet_bytes`, one row group per range): built on
        disk, read back once."""
        path = os.path.join(self.directory, "row_set.parquet")
        schema = pa.schema([pa.field(ROW_ID, pa.uint64())]).with_metadata(
            _parquet_schema_meta(self.first_time_us, self.last_time_us))
        with pq.ParquetWriter(path, schema, use_dictionary=False, compression="none",
                              column_encoding={ROW_ID: "DELTA_BINARY_PACKED"}, write_statistics=False) as writer:
            for chunk in self.chunks():
                if len(chunk):
                    writer.write_table(pa.table({ROW_ID: pa.array(chunk, type=pa.uint64())}, schema=schema))
        with open(path, "rb") as fh:
            data = fh.read()
        os.remove(path)
        return data

    @classmethod
    def merge_runs(cls, runs: Iterable[RowSetPart], directory: str
                   ) -> tuple[SpilledRowSet, SpilledRowSet, SpilledRowSet]:
        """The exact, the coarse and the minute identities of ``runs`` (parts, best sorted: ``RowSetPart.sorted``),
        each merged under ``directory/exact``, ``directory/coarse`` and ``directory/minute``: every run's ids
        appended range by range to one file per range, then each range deduplicated on its own. Holds one run
        and one range at a time."""
        kinds = ("exact", "coarse", "minute")
        folders = {k: os.path.join(directory, k) for k in kinds}
        handles = {}
        for kind, folder in folders.items():
            os.makedirs(folder, exist_ok=True)
            handles[kind] = [open(os.path.join(folder, f"range-{i:03d}.u64"), "wb") for i in range(1 << RANGE_BITS)]
        firsts, lasts = [], []
        try:
            for run in runs:
                if run.first_time_us is not None:
                    firsts.append(run.first_time_us)
                if run.last_time_us is not None:
                    lasts.append(run.last_time_us)
                empty = np.empty(0, dtype=np.uint64)
                for kind, ids in (("exact", run.ids), ("coarse", empty if run.coarse is None else run.coarse),
                                  ("minute", empty if run.minute is None else run.minute)):
                    ids = np.asarray(ids, dtype=np.uint64)
                    if len(ids) > 1 and not bool(np.all(ids[1:] >= ids[:-1])):
                        ids = np.sort(ids)
                    for fh, chunk in zip(handles[kind], range_chunks(ids), strict=True):
                        chunk.tofile(fh)
        finally:
            for files in handles.values():
                for fh in files:
                    fh.close()
        first, last = (min(firsts) if firsts else None), (max(lasts) if lasts else None)
        out = []
        for kind in kinds:
            sizes = []
            for i in range(1 << RANGE_BITS):
                path = os.path.join(folders[kind], f"range-{i:03d}.u64")
                ids = sorted_unique(np.fromfile(path, dtype=np.uint64))
                ids.tofile(path)
                sizes.append(len(ids))
            out.append(cls(folders[kind], tuple(sizes), first, last))
        return out[0], out[1], out[2]



_RANGE_HIGH: Final = ~np.uint64((1 << (64 - RANGE_BITS)) - 1)
_CONTENT_SALT: Final = np.uint64(0xD6E8FEB86659FD93)


def fold_content(ids: np.ndarray, content: np.ndarray, mixed: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(sorted distinct row ids, per id the sum of its rows' mixed content hashes): the multiset of a row
    id's contents, every copy counted, in any order (``mixed``: ``content`` is already folded sums, as
    an earlier fold returned them). Folds merge by folding their concatenation again (``mixed=True``)."""
    ids, content = np.asarray(ids, dtype=np.uint64), np.array(content, dtype=np.uint64)
    if len(ids) != len(content):
        raise InvalidInput(f"{len(ids)} row ids but {len(content)} content hashes")
    if not len(ids):
        return ids, content
    if not mixed:
        mix_in_place(content, np.empty_like(content))
    order = np.argsort(ids, kind="stable")
    ids, content = ids[order], content[order]
    starts = np.flatnonzero(np.concatenate([[True], ids[1:] != ids[:-1]]))
    with np.errstate(over="ignore"):
        return ids[starts], np.add.reduceat(content, starts, dtype=np.uint64)  # (wraps: a multiset hash)


def folded_content_ids(ids: np.ndarray, sums: np.ndarray) -> np.ndarray:
    """The content identities of a fold (:func:`fold_content`), sorted distinct: see :func:`content_ids`."""
    if not len(ids):
        return np.empty(0, dtype=np.uint64)
    with np.errstate(over="ignore"):
        words = np.asarray(sums, dtype=np.uint64) + _CONTENT_SALT
        mix_in_place(words, np.empty_like(words))
        words ^= ids
        mix_in_place(words, np.empty_like(words))
    return np.sort((ids & _RANGE_HIGH) | (words & ~_RANGE_HIGH))


def content_ids(ids: np.ndarray, content: np.ndarray) -> np.ndarray:
    """The content identities of some rows (their row ids, ``conversion_row_ids``, and one content hash per
    row): per distinct row id one 64-bit id that keeps the row id's top ``RANGE_BITS`` bits (so it lies in
    the row id's range: compared range by range with :func:`released_in`) and in the others a hash of the
    row id and of the multiset of its rows' contents. Two sets of rows have the same content identity for
    a row id iff (but for 2**-58 collisions) they hold that row id the same number of times with the same
    contents. Sorted distinct."""
    return folded_content_ids(*fold_content(ids, content))


def content_ranges(ids: np.ndarray, content: np.ndarray) -> Iterator[tuple[int, tuple[np.ndarray, np.ndarray]]]:
    """A batch's fold (:func:`fold_content`) cut into its non-empty id ranges (``RANGE_BITS``): (range, fold)."""
    unique, sums = fold_content(ids, content)
    offsets = _range_offsets(unique)
    for i in range(1 << RANGE_BITS):
        if offsets[i + 1] > offsets[i]:
            yield i, (unique[offsets[i]:offsets[i + 1]], sums[offsets[i]:offsets[i + 1]])
