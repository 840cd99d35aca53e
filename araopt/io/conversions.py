"""Conversion records as column arrays, and the conversion-log contract checks.

Contract (``schemas/conversion_log.md``): ``impression_id`` int64 or string, non-null;
``conversion_time`` timestamp, non-null; slice columns (impression or conversion features) of any
scalar type, non-null; value columns numeric, finite and >= 0. Schema problems are a ``ValueError``
before any processing; per-row problems are returned as rejected rows with a ``reason``.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from araopt.errors import AraoptError, InvalidInput, InvalidParameters, PrivacyRefusal
from araopt.io.ids import ID_HASH, canonical_id_hash, id_sort_keys, table_id_hash, table_sort_keys

IMPRESSION_ID = "impression_id"
_SORT_KEYS = "impression_sort_keys"
_RECORD_KEYS = "record_keys"
CONVERSION_TIME = "conversion_time"
IMPRESSION_TIME = "impression_time"
"""Optional column: when the impression was shown (any timestamp unit or zone, like conversion_time)."""
IMPRESSION_TIME_US = "impression_time_us"
"""The canonical form of ``impression_time`` in valid rows: int64 microseconds since the epoch, UTC."""
BROWSER_ID = "browser_id"
"""Optional column (W3C Attribution Level 1): the browser instance (user) that saw the impression and
converted, int64 or string; the privacy unit is (browser_id, conversion site, epoch). A log without it
treats every impression as its own browser."""
IMPRESSION_SITE = "impression_site"
"""Optional string column (W3C Attribution Level 1): the site the impression was shown on."""
CONVERSION_SITE = "conversion_site"
"""Optional string column (W3C Attribution Level 1): the site that measured the conversion."""
ATTRIBUTION_COLUMNS = (BROWSER_ID, IMPRESSION_TIME, IMPRESSION_SITE, CONVERSION_SITE)
"""The optional columns of the W3C Attribution target, in contract order (``check_attribution_schema``)."""
IN_PERIOD = "in_period"
"""Canonical boolean column of valid rows: True for rows of the period being measured, False for rows
of a lookback (earlier conversions of the same impressions): they consume the per-impression budget of
ContributionCapping (Alg. 1), as in the browser, but are not counted or released."""
REASON = "reason"

REJECT_REASONS = (
    "null_impression_id",
    "impression_id_out_of_range",
    "null_conversion_time",
    "unparseable_conversion_time",
    "conversion_time_out_of_range",
    "null_slice_value",
    "slice_value_out_of_range",
    "null_value",
    "non_finite_value",
    "negative_value",
    "value_above_2pow53",
    "bad_impression_time",
    "null_browser_id",
    "null_site",
    "conversion_before_impression",
    "impression_slice_inconsistent",
)
"""Why a row goes to the dead letter (first failing check wins); each has a Beam counter. The last
one is decided once all rows of an impression are together (``impression_slice_conflicts``)."""

IMPRESSION_SLICE_INCONSISTENT = REJECT_REASONS[-1]

TIMES_FLOORED = "times_floored_to_microseconds"
"""Counter (not a rejection): rows whose timestamp had sub-microsecond digits, floored to the microsecond."""

MAX_EXACT_INTEGER = 2**53
"""Integer values above this are not exact in float64: such rows are dead-lettered, never rounded."""

_INT64_MAX = 2**63 - 1
_MICROS_PER_UNIT = {"s": 1_000_000, "ms": 1_000, "us": 1}

EARLIEST_CONVERSION_TIME_US = 0
"""1970-01-01T00:00:00Z: an earlier conversion time is a bug (a sentinel, a unit mix-up), not a conversion."""
LATEST_CONVERSION_TIME_US = 7_258_118_400_000_000
"""2200-01-01T00:00:00Z (exclusive): later times are dead-lettered (conversion_time_out_of_range), so that
every accepted time is a datetime in every library (pandas' nanoseconds end in 2262, Python's years in 9999)."""


def type_family(arrow_type: pa.DataType) -> str:
    """The comparable kind of a column type: integer, string, boolean, floating, decimal, timestamp or
    other. Two files agree on a column iff their families agree (int32 vs int64 is fine, int vs string is not)."""
    t = arrow_type.value_type if pa.types.is_dictionary(arrow_type) else arrow_type
    if pa.types.is_integer(t):
        return "integer"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_floating(t):
        return "floating"
    if pa.types.is_decimal(t):
        return "decimal"
    if pa.types.is_timestamp(t):
        return "timestamp"
    return "other"


def check_schema(schema: pa.Schema, slice_columns: Sequence[str], value_columns: Sequence[str],
                 source: str = "input") -> None:
    """Refuse (ValueError) a conversion log without the required columns or with wrong types."""
    names = set(schema.names)
    missing = [c for c in (IMPRESSION_ID, CONVERSION_TIME, *slice_columns, *value_columns) if c not in names]
    if missing:
        raise InvalidInput(f"{source}: missing required column(s) {missing}; present: {sorted(names)}")
    id_type = schema.field(IMPRESSION_ID).type
    if type_family(id_type) not in ("integer", "string"):
        raise InvalidInput(f"{source}: column {IMPRESSION_ID!r} must be int64 or string, got {id_type}")
    time_type = schema.field(CONVERSION_TIME).type
    if type_family(time_type) not in ("timestamp", "string"):
        raise InvalidInput(f"{source}: column {CONVERSION_TIME!r} must be a timestamp (or ISO-8601 string), got {time_type}")
    for c in value_columns:
        t = schema.field(c).type
        if type_family(t) not in ("integer", "floating", "decimal"):
            raise InvalidInput(f"{source}: value column {c!r} must be numeric, got {t}")
    for c in slice_columns:
        t = schema.field(c).type
        if type_family(t) not in ("integer", "string", "boolean"):
            raise InvalidInput(f"{source}: slice column {c!r} must be integer, string or boolean, got {t}")


def check_attribution_schema(schema: pa.Schema, source: str = "input") -> tuple[str, ...]:
    """The W3C Attribution columns ``schema`` has (``ATTRIBUTION_COLUMNS`` present, in contract
    order), refusing wrong types: ``browser_id`` int64 or string, ``impression_time`` a timestamp
    (or ISO-8601 string), the sites strings."""
    present = tuple(c for c in ATTRIBUTION_COLUMNS if c in schema.names)
    allowed = {BROWSER_ID: ("integer", "string"), IMPRESSION_TIME: ("timestamp", "string"),
               IMPRESSION_SITE: ("string",), CONVERSION_SITE: ("string",)}
    for column in present:
        t = schema.field(column).type
        if type_family(t) not in allowed[column]:
            raise InvalidInput(f"{source}: column {column!r} must be {' or '.join(allowed[column])}, got {t}")
    return present


def unify_schemas(schemas: Sequence[tuple[str, pa.Schema]], slice_columns: Sequence[str],
                  value_columns: Sequence[str]) -> pa.Schema:
    """Check every file's schema and that ids and slice columns have one type family across all files.

    Returns the canonical schema of the needed columns (``canonical_type``). A column typed int in
    one file and string in another would make ``1`` and ``"1"`` two impressions (each with its own
    budget) or two slices: refused up front, naming a file of each kind.
    """
    if not schemas:
        raise InvalidInput("no input files")
    for source, schema in schemas:
        check_schema(schema, slice_columns, value_columns, source=source)
    fields = []
    for column in (IMPRESSION_ID, CONVERSION_TIME, *slice_columns, *value_columns):
        seen: dict[str, tuple[str, pa.DataType]] = {}
        for source, schema in schemas:
            t = schema.field(column).type
            seen.setdefault(type_family(t), (source, t))
        strict = column == IMPRESSION_ID or column in slice_columns
        if strict and len(seen) > 1:
            kinds = "; ".join(f"{t} in {src}" for src, t in seen.values())
            raise InvalidInput(f"column {column!r} has different types across the input files ({kinds}): "
                               f"ids and slice values must have one type in every file (cast them to one type)")
        fields.append(pa.field(column, canonical_type(next(iter(seen.values()))[1], column in value_columns)))
    return pa.schema(fields)


def canonical_type(arrow_type: pa.DataType, is_value: bool = False) -> pa.DataType:
    """The one type a column is compared and processed in: integers int64, strings string, values float64."""
    family = type_family(arrow_type)
    if is_value:
        return pa.float64()
    return {"integer": pa.int64(), "string": pa.string(), "boolean": pa.bool_(),
            "timestamp": pa.int64()}.get(family, arrow_type)


def time_as_micros(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Timestamps (any unit / tz) or ISO-8601 strings -> (int64 microseconds since the epoch, ok mask,
    floored mask). Sub-microsecond digits are floored (not rejected); values that cannot be parsed or
    do not fit int64 microseconds are not ok."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    n = len(column)
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        parsed = pd.to_datetime(pd.Series(column.to_pandas()), errors="coerce", utc=True, format="ISO8601")
        ok = parsed.notna().to_numpy()
        nanos = parsed.dt.as_unit("ns").to_numpy(dtype="datetime64[ns]").view(np.int64)
        nanos = np.where(ok, nanos, 0)
        return np.floor_divide(nanos, 1000), ok, ok & (np.remainder(nanos, 1000) != 0)
    raw = pc.fill_null(column.cast(pa.int64()), 0).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    unit = column.type.unit
    if unit == "ns":
        return np.floor_divide(raw, 1000), np.ones(n, dtype=bool), np.remainder(raw, 1000) != 0
    factor = _MICROS_PER_UNIT[unit]
    ok = np.abs(raw) <= _INT64_MAX // factor
    return np.where(ok, raw, 0) * factor, ok, np.zeros(n, dtype=bool)


@dataclass(frozen=True)
class ValidatedBatch:
    """One validated batch: canonical valid rows, dead-letter rows (as text + ``reason``), counters."""

    valid: pa.Table
    rejected: pa.Table
    times_floored: int


def _as_numpy(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return cast(np.ndarray, column.to_numpy(zero_copy_only=False))


def _integer_in_int64(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Mask of entries of an integer column that fit int64 (only unsigned 64-bit ids can fail)."""
    if column.type == pa.uint64():
        too_large = pc.fill_null(pc.greater(column, pa.scalar(_INT64_MAX, pa.uint64())), False)
        return cast(np.ndarray, ~too_large.to_numpy(zero_copy_only=False))
    return np.ones(len(column), dtype=bool)


def validate_batch(table: pa.Table, slice_columns: Sequence[str], value_columns: Sequence[str],
                   passthrough: Sequence[str] = (), attribution: bool = False) -> ValidatedBatch:
    """Split a batch into canonical valid rows and dead-letter rows with a ``reason``, vectorized;
    the first failing check wins. Valid rows carry ``conversion_time_us`` (int64 microseconds; the
    original time column is dropped), ids and integer slices as int64, strings as string, values
    as float64, so that files of different widths compare equal. ``attribution``: also the W3C
    Attribution columns' rules (``schemas/conversion_log.md``; ARA runs ignore those columns): a
    ``browser_id`` and the sites are never null (the privacy unit) and no conversion precedes its
    ``impression_time``."""
    check_schema(table.schema, slice_columns, value_columns)
    n = table.num_rows
    reason = np.zeros(n, dtype=np.uint8)  # 0: valid, else 1 + index into REJECT_REASONS

    def flag(mask: np.ndarray, why: str) -> None:
        if mask.any():
            reason[mask & (reason == 0)] = REJECT_REASONS.index(why) + 1

    ids = table.column(IMPRESSION_ID)
    flag(_as_numpy(ids.is_null()), "null_impression_id")
    if type_family(ids.type) == "integer":
        flag(~_integer_in_int64(ids), "impression_id_out_of_range")
    time_column = table.column(CONVERSION_TIME)
    micros, time_ok, floored = time_as_micros(time_column)
    time_nulls = _as_numpy(time_column.is_null())
    flag(time_nulls, "null_conversion_time")
    unparseable = ("unparseable_conversion_time" if type_family(time_column.type) == "string"
                   else "conversion_time_out_of_range")
    flag(~time_ok & ~time_nulls, unparseable)
    flag((micros < EARLIEST_CONVERSION_TIME_US) | (micros >= LATEST_CONVERSION_TIME_US), "conversion_time_out_of_range")
    for c in slice_columns:
        col = table.column(c)
        flag(_as_numpy(col.is_null()), "null_slice_value")
        if type_family(col.type) == "integer":
            flag(~_integer_in_int64(col), "slice_value_out_of_range")
    imp_micros = np.zeros(0, dtype=np.int64)
    if IMPRESSION_TIME in passthrough and IMPRESSION_TIME in table.column_names:
        # by its own unit (pandas writes ns), like conversion_time; a missing impression time is a defect
        imp_column = table.column(IMPRESSION_TIME)
        if type_family(imp_column.type) not in ("timestamp", "string"):
            raise InvalidInput(f"column {IMPRESSION_TIME!r} must be a timestamp, got {imp_column.type}")
        imp_micros, imp_ok, imp_floored = time_as_micros(imp_column)
        flag(~imp_ok | _as_numpy(imp_column.is_null()), "bad_impression_time")
        floored = floored | imp_floored
    if attribution and BROWSER_ID in passthrough and BROWSER_ID in table.column_names:
        flag(_as_numpy(table.column(BROWSER_ID).is_null()), "null_browser_id")
    for site in (CONVERSION_SITE, IMPRESSION_SITE):
        if attribution and site in passthrough and site in table.column_names:
            flag(_as_numpy(table.column(site).is_null()), "null_site")
    if attribution and len(imp_micros):
        flag(micros < imp_micros, "conversion_before_impression")
    values = []
    for c in value_columns:
        col = table.column(c)
        nulls = _as_numpy(col.is_null())
        flag(nulls, "null_value")
        vals = _as_numpy(pc.fill_null(pc.cast(col, pa.float64(), safe=False), 0.0)).astype(np.float64, copy=False)
        with np.errstate(invalid="ignore"):
            flag(~nulls & ~np.isfinite(vals), "non_finite_value")
            flag(vals < 0, "negative_value")
        if col.type in (pa.int64(), pa.uint64()):  # compared as integers: the float cast would round
            flag(_as_numpy(pc.fill_null(pc.greater(col, pa.scalar(MAX_EXACT_INTEGER, col.type)), False)),
                 "value_above_2pow53")
        values.append(vals)
    bad = reason != 0
    any_bad = bool(bad.any())
    keep = pa.array(~bad)

    def kept(column: pa.ChunkedArray) -> pa.ChunkedArray:
        return column.filter(keep) if any_bad else column

    columns = {IMPRESSION_ID: pc.cast(kept(ids), canonical_type(ids.type))}
    for c in slice_columns:
        col = kept(table.column(c))
        if pa.types.is_dictionary(col.type):
            col = pc.cast(col, col.type.value_type)
        col = pc.cast(col, canonical_type(col.type))
        # strings travel dictionary-encoded (int32 codes + the batch's distinct values): cheap to shard,
        # shuffle and spill, and Conversions.from_table(categorical_slices=True) keeps them encoded
        columns[c] = pc.dictionary_encode(col) if type_family(col.type) == "string" else col
    for c, vals in zip(value_columns, values, strict=True):
        columns[c] = pa.array(vals[~bad] if any_bad else vals, type=pa.float64())
    columns["conversion_time_us"] = pa.array(micros[~bad] if any_bad else micros, type=pa.int64())
    if IMPRESSION_TIME in passthrough and IMPRESSION_TIME in table.column_names:
        columns[IMPRESSION_TIME_US] = pa.array(imp_micros[~bad] if any_bad else imp_micros, type=pa.int64())
    for c in passthrough:  # other optional columns are carried unchanged
        if c in table.column_names and c != IMPRESSION_TIME:
            columns[c] = kept(table.column(c))
    valid = pa.table(columns)
    needed = [IMPRESSION_ID, CONVERSION_TIME, *slice_columns, *value_columns]
    rejected_rows = table.select(needed).filter(pa.array(bad))
    rejected = pa.table({c: pc.cast(rejected_rows.column(c), pa.string(), safe=False) for c in needed}
                        | {REASON: pa.array(np.asarray(("",) + REJECT_REASONS, dtype=object)[reason[bad]],
                                            type=pa.string())})
    return ValidatedBatch(valid, rejected, int((floored & ~bad).sum()))


def equality_codes(column: pa.ChunkedArray | pa.Array | np.ndarray) -> np.ndarray:
    """Integers equal exactly where the column's values are equal (ints and bools as they are,
    anything else by dictionary code)."""
    if isinstance(column, np.ndarray):
        return column if column.dtype.kind in "iub" else pd.factorize(column)[0]
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_integer(column.type) or pa.types.is_boolean(column.type):
        return _as_numpy(column)
    return _as_numpy(pc.dictionary_encode(column).indices)


def dead_letter_rows(table: pa.Table, slice_columns: Sequence[str], value_columns: Sequence[str],
                     reason: str) -> pa.Table:
    """Validated (canonical) rows as dead-letter rows: the contract's columns as text, and ``reason``."""
    columns = {IMPRESSION_ID: table.column(IMPRESSION_ID),
               CONVERSION_TIME: pc.cast(table.column("conversion_time_us"), pa.timestamp("us", tz="UTC"))}
    columns |= {c: table.column(c) for c in (*slice_columns, *value_columns)}
    return pa.table({c: pc.cast(col, pa.string(), safe=False) for c, col in columns.items()}
                    | {REASON: pa.array([reason] * table.num_rows, type=pa.string())})


def dead_letter_schema(slice_columns: Sequence[str], value_columns: Sequence[str]) -> pa.Schema:
    """Dead-letter rows keep the needed columns as text (whatever their input type) plus ``reason``."""
    return pa.schema([pa.field(c, pa.string()) for c in (IMPRESSION_ID, CONVERSION_TIME, *slice_columns, *value_columns)]
                     + [pa.field(REASON, pa.string())])


def validate_table(
    table: pa.Table, slice_columns: Sequence[str], value_columns: Sequence[str], passthrough: Sequence[str] = (),
) -> tuple[pa.Table, pa.Table]:
    """(valid rows, rejected rows + ``reason``) of ``validate_batch``."""
    batch = validate_batch(table, slice_columns, value_columns, passthrough)
    return batch.valid, batch.rejected


def check_time_micros(values: Any, column: str) -> None:
    """Times given in memory (``Conversions``, the W3C measure's rows) are integer microseconds since the
    epoch before 2200 (validation's bound): what every time is compared with (a version's training
    window, the lookback, the days) is in microseconds, and nanoseconds (pandas' unit) would pass a
    training window's end by a factor of 1,000. Earlier times (a simulation's relative ones) can only
    fail such checks, so they stay allowed."""
    times = np.asarray(values)
    if times.size and (times.dtype.kind not in "iu" or int(times.max()) >= LATEST_CONVERSION_TIME_US):
        raise InvalidInput(f"{column} must be integer microseconds since the epoch, before 2200 (as validation "
                           f"requires; got dtype {times.dtype}, latest {times.max()})")


@dataclass(frozen=True)
class Conversions:
    """Validated conversion records as numpy arrays (the unit of work of the core).

    ``in_period`` (optional, bool): False marks lookback rows, earlier conversions of the same
    impressions that consume the budget of ContributionCapping (Alg. 1) but are neither counted nor
    released (``None``: every row is in the period). ``impression_time`` (optional): int64
    microseconds since the epoch, UTC.
    """

    impression_id: np.ndarray
    conversion_time: np.ndarray  # int64 microseconds since the epoch, UTC, before 2200 (validated: from 1970)
    slices: Mapping[str, np.ndarray]  # or pd.Categorical (string columns, from_table(categorical_slices=True))
    values: np.ndarray  # (n, d) float64, in value_columns order
    value_columns: tuple[str, ...]
    in_period: np.ndarray | None = None
    impression_time: np.ndarray | None = None
    _cache: dict[str, np.ndarray] = field(default_factory=dict, init=False, repr=False, compare=False)
    """``record_keys`` once computed (a read-only array): the mechanism, the statistics and the calibration
    each need them, often of the same batch."""

    def __post_init__(self) -> None:
        n = len(self.impression_id)
        lengths = {"conversion_time": len(self.conversion_time), "values": self.values.shape[0]}
        lengths.update({f"slice {k}": len(v) for k, v in self.slices.items()})
        if self.in_period is not None:
            lengths["in_period"] = len(self.in_period)
        if self.impression_time is not None:
            lengths["impression_time"] = len(self.impression_time)
        bad = {k: v for k, v in lengths.items() if v != n}
        if bad:
            raise InvalidInput(f"mismatched array lengths: impression_id has {n}, {bad}")
        if self.in_period is not None and np.asarray(self.in_period).dtype != np.bool_:
            raise InvalidInput(f"in_period must be a boolean array, got dtype {np.asarray(self.in_period).dtype}")
        check_time_micros(self.conversion_time, "conversion_time")

    def __len__(self) -> int:
        return len(self.impression_id)

    @property
    def slice_columns(self) -> tuple[str, ...]:
        return tuple(self.slices)

    def period_mask(self) -> np.ndarray:
        """Boolean mask of the rows of the measured period (all rows when there is no lookback)."""
        if self.in_period is None:
            return np.ones(len(self), dtype=bool)
        return np.asarray(self.in_period, dtype=bool)

    @property
    def has_lookback(self) -> bool:
        return self.in_period is not None and not bool(np.all(self.in_period))

    @classmethod
    def from_table(cls, table: pa.Table | pd.DataFrame, slice_columns: Sequence[str],
                   value_columns: Sequence[str], categorical_slices: bool = False) -> Conversions:
        """From a validated Arrow table (or DataFrame); refuses rows that fail the contract.

        ``categorical_slices``: dictionary-encoded slice columns (validated string slices are) become
        ``pd.Categorical`` (codes + distinct values) instead of object arrays: what reads them by value
        (``np.asarray``) still sees the values, and the record keys and the domain lookup work on the
        distinct values only."""
        if isinstance(table, pd.DataFrame):
            table = pa.Table.from_pandas(table, preserve_index=False)
        if "conversion_time_us" not in table.column_names:
            passthrough = (IMPRESSION_TIME,) if IMPRESSION_TIME in table.column_names else ()
            good, rejected = validate_table(table, slice_columns, value_columns, passthrough)
            if rejected.num_rows:
                reasons = pd.Series(rejected.column(REASON).to_pylist()).value_counts().to_dict()
                raise InvalidInput(f"{rejected.num_rows} invalid conversion rows: {reasons}")
            table = good
        values = np.column_stack([pc.cast(table.column(c), pa.float64()).to_numpy(zero_copy_only=False)
                                  for c in value_columns]) if value_columns else np.zeros((table.num_rows, 0))

        def optional(name: str, dtype: type) -> np.ndarray | None:
            if name not in table.column_names:
                return None
            return cast(np.ndarray, table.column(name).to_numpy(zero_copy_only=False).astype(dtype, copy=False))

        out = cls(
            impression_id=table.column(IMPRESSION_ID).to_numpy(zero_copy_only=False),
            conversion_time=table.column("conversion_time_us").to_numpy(zero_copy_only=False).astype(np.int64),
            slices={c: _slice_array(table.column(c), categorical_slices) for c in slice_columns},
            values=values.reshape(table.num_rows, len(value_columns)),
            value_columns=tuple(value_columns),
            in_period=optional(IN_PERIOD, np.bool_),
            impression_time=optional(IMPRESSION_TIME_US, np.int64),
        )
        if ID_HASH in table.column_names:  # hashed once, by the grouping step (``araopt.io.ids.ID_HASH``)
            out._keep(ID_HASH, table_id_hash(table))
        ids = table.column(IMPRESSION_ID)
        if table.num_rows and pa.types.is_string(ids.type):  # from Arrow's strings: no Python objects compared
            out._keep(_SORT_KEYS, table_sort_keys(table))  # ranked once per shard (``araopt.io.ids.ID_SORT_KEY``)
        return out

    def _keep(self, name: str, array: np.ndarray) -> np.ndarray:
        array.setflags(write=False)
        self._cache[name] = array
        return array

    def id_hashes(self) -> np.ndarray:
        """``canonical_id_hash`` of the impression ids (read-only), computed once per instance (or
        carried from the grouping step's column)."""
        cached = self._cache.get(ID_HASH)
        if cached is not None:
            return cached
        return self._keep(ID_HASH, canonical_id_hash(self.impression_id))

    def impression_sort_keys(self) -> np.ndarray:
        """Keys that order and group the rows as their canonical impression ids do (``araopt.io.ids.id_sort_keys``:
        integers for string ids), computed once per instance: what Alg. 1's order sorts."""
        cached = self._cache.get(_SORT_KEYS)
        if cached is not None:
            return cached
        return self._keep(_SORT_KEYS, np.array(id_sort_keys(self.impression_id)))

    def with_in_period(self, in_period: np.ndarray | None) -> Conversions:
        """The same rows with ``in_period`` replaced, keeping what was computed of them (the record keys,
        id hashes and sort keys depend on the rows' content only)."""
        out = dataclasses.replace(self, in_period=in_period)
        out._cache.update(self._cache)
        return out

    def take(self, index: np.ndarray) -> Conversions:
        out = Conversions(self.impression_id[index], self.conversion_time[index],
                          {k: v[index] for k, v in self.slices.items()}, self.values[index], self.value_columns,
                          None if self.in_period is None else self.in_period[index],
                          None if self.impression_time is None else self.impression_time[index])
        for name in (ID_HASH, _SORT_KEYS, _RECORD_KEYS):  # a subset keeps its hashes and its ids' order
            cached = self._cache.get(name)
            if cached is not None:
                out._keep(name, cached[index])
        return out

    def record_keys(self) -> np.ndarray:
        """A 64-bit content hash per record: the deterministic tie-break and simulation RR key.

        The value of ``pd.util.hash_pandas_object(frame, index=False)`` for the frame of the record's
        impression id (its canonical form, ``araopt.io.ids``), time, values and slices (in that order),
        computed column by column without building the frame; a categorical column hashes its distinct
        values once (same result). It
        hashes the record's content only (not ``in_period``): a conversion read as lookback on one day
        gets the key it had when it was released, so its rounding and its place in Alg. 1's order are
        the same. Computed once per instance (the arrays of a ``Conversions`` are not changed in place)."""
        cached = self._cache.get(_RECORD_KEYS)
        if cached is not None:
            return cached
        columns = [self.conversion_time.astype(np.int64)]
        columns += [self.values[:, j].astype(np.float64) for j in range(self.values.shape[1])]
        columns += [_normalise(v) for v in self.slices.values()]
        hashes = [self.id_hashes(), *(pd.util.hash_array(c) for c in columns)]
        return self._keep(_RECORD_KEYS, _combine_hashes(hashes, len(self)))


def _slice_array(column: pa.ChunkedArray, categorical: bool) -> np.ndarray:
    if not (categorical and pa.types.is_dictionary(column.type)):
        return cast(np.ndarray, column.to_numpy(zero_copy_only=False))
    encoded = column.unify_dictionaries().combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    values = encoded.dictionary.to_numpy(zero_copy_only=False)
    if len(pd.unique(values)) != len(values):  # a dictionary with repeated values: encode again
        encoded = pc.dictionary_encode(encoded.dictionary_decode())
        values = encoded.dictionary.to_numpy(zero_copy_only=False)
    codes = encoded.indices.to_numpy(zero_copy_only=False)
    return cast(np.ndarray, pd.Categorical.from_codes(codes, categories=pd.Index(values, dtype=object)))


def _combine_hashes(hashes: Sequence[np.ndarray], n: int) -> np.ndarray:
    """pandas' combination of per-column hashes into one per row (``hash_pandas_object`` of a frame)."""
    out = np.full(n, 0x345678, dtype=np.uint64)
    mult = np.uint64(1000003)
    for i, h in enumerate(hashes):
        inverse_i = len(hashes) - i
        out ^= h
        out *= mult
        mult += np.uint64(82520 + inverse_i + inverse_i)
    out += np.uint64(97531)
    return out


def split_periods(conversions: Conversions) -> tuple[Conversions, Conversions]:
    """(the period's rows, the lookback rows) of a batch with ``in_period`` (inverse of ``concat_periods``)."""
    mask = conversions.period_mask()
    return (conversions.take(np.flatnonzero(mask)).with_in_period(None),
            conversions.take(np.flatnonzero(~mask)).with_in_period(None))


def concat_periods(period: Conversions, lookback: Conversions) -> Conversions:
    """The rows of a measured period and of its lookback in one batch, ``in_period`` set; lookback rows
    of impressions without a conversion in the period are left out (they cannot change its ranks). An
    impression is its canonical id (``araopt.io.ids``: a lookback's ``"7"`` is the period's ``"0000007"``),
    matched by its hash (a collision keeps a lookback row of another impression, which Alg. 1 then
    groups apart: it changes no rank)."""
    if period.value_columns != lookback.value_columns or set(period.slices) != set(lookback.slices):
        raise InvalidInput("the period and its lookback must carry the same slice and value columns")
    lookback = lookback.take(np.flatnonzero(np.isin(lookback.id_hashes(), period.id_hashes())))
    both_times = period.impression_time is not None and lookback.impression_time is not None
    out = Conversions(
        np.concatenate([_normalise(period.impression_id), _normalise(lookback.impression_id)]),
        np.concatenate([period.conversion_time, lookback.conversion_time]).astype(np.int64),
        {k: np.concatenate([_normalise(v), _normalise(lookback.slices[k])]) for k, v in period.slices.items()},
        np.concatenate([period.values, lookback.values]),
        period.value_columns,
        np.concatenate([period.period_mask(), np.zeros(len(lookback), dtype=bool)]),
        np.concatenate([cast(np.ndarray, period.impression_time), cast(np.ndarray, lookback.impression_time)])
        if both_times else None,
    )
    first, second = period._cache.get(ID_HASH), lookback._cache.get(ID_HASH)
    if first is not None and second is not None:
        out._keep(ID_HASH, np.concatenate([first, second]))
    return out


def _normalise(arr: np.ndarray) -> np.ndarray:
    if isinstance(arr, pd.Categorical):
        return cast(np.ndarray, arr)
    arr = np.asarray(arr)
    if arr.dtype.kind in "iu":
        return arr.astype(np.int64)
    if arr.dtype.kind == "b":
        return arr.astype(np.int64)
    return arr.astype(object)


@dataclass(frozen=True)
class ValidationCounts:
    """Rows read and rejected (per reason), and timestamps floored to the microsecond: mergeable."""

    rows_read: int = 0
    rows_rejected: int = 0
    rejected_by_reason: Mapping[str, int] = field(default_factory=dict)
    times_floored: int = 0

    @classmethod
    def of(cls, table_rows: int, batch: ValidatedBatch) -> ValidationCounts:
        reasons: dict[str, int] = {}
        if batch.rejected.num_rows:
            names, counts = np.unique(np.asarray(batch.rejected.column(REASON).to_pylist(), dtype=object).astype(str),
                                      return_counts=True)
            reasons = {str(k): int(v) for k, v in zip(names, counts, strict=True)}
        return cls(table_rows, batch.rejected.num_rows, reasons, batch.times_floored)

    @classmethod
    def rejected(cls, rows: int, reason: str) -> ValidationCounts:
        """``rows`` rejected for ``reason`` after they were read (and counted) by validation."""
        return cls(0, rows, {reason: rows} if rows else {}, 0)

    @classmethod
    def merge(cls, parts: Iterable[ValidationCounts]) -> ValidationCounts:
        read = rejected = floored = 0
        reasons: dict[str, int] = {}
        for p in parts:
            read += p.rows_read
            rejected += p.rows_rejected
            floored += p.times_floored
            for k, v in p.rejected_by_reason.items():
                reasons[k] = reasons.get(k, 0) + v
        return cls(read, rejected, dict(sorted(reasons.items())), floored)

    @property
    def rows_valid(self) -> int:
        return self.rows_read - self.rows_rejected


DEFAULT_MAX_REJECTED_FRACTION = 0.10
"""Like the Aggregation Service (which fails a job when more than 10% of reports are bad). The gate is
sharp: with exactly 10% of the rows rejected the job goes on and releases, one more rejected row
refuses it (nothing is released); ``--max-rejected-fraction`` sets another share."""


def rejected_share_refusal(counts: ValidationCounts, max_rejected_fraction: float = DEFAULT_MAX_REJECTED_FRACTION,
                           what: str = "input") -> AraoptError | None:
    """Why an input is refused (not raised): no valid row, or more than ``max_rejected_fraction`` of rows
    rejected (exactly that share passes: whether a release happens flips on one row at the threshold);
    None if it is not."""
    if not 0.0 <= max_rejected_fraction <= 1.0:
        return InvalidParameters(f"max_rejected_fraction must lie in [0, 1], got {max_rejected_fraction!r}")
    if counts.rows_read == 0:
        return InvalidInput(f"the {what} holds no conversion rows")
    if counts.rows_valid == 0:
        return InvalidInput(f"the {what} holds no valid conversion rows (all {counts.rows_read:,} rejected: "
                            f"{dict(counts.rejected_by_reason)}; see the dead letter)")
    if counts.rows_rejected > max_rejected_fraction * counts.rows_read:
        return PrivacyRefusal(
            f"{counts.rows_rejected:,} of {counts.rows_read:,} {what} rows ({counts.rows_rejected / counts.rows_read:.1%}) "
            f"failed validation, above the {max_rejected_fraction:.0%} threshold: refusing to go on "
            f"({dict(counts.rejected_by_reason)}; see the dead letter)")
    return None


def check_rejected_share(counts: ValidationCounts, max_rejected_fraction: float = DEFAULT_MAX_REJECTED_FRACTION,
                         what: str = "input") -> None:
    """Raise :func:`rejected_share_refusal`'s refusal, if any."""
    refusal = rejected_share_refusal(counts, max_rejected_fraction, what)
    if refusal is not None:
        raise refusal
    if counts.rows_rejected > max_rejected_fraction * counts.rows_read:
        raise PrivacyRefusal(
            f"{counts.rows_rejected:,} of {counts.rows_read:,} {what} rows ({counts.rows_rejected / counts.rows_read:.1%}) "
            f"failed validation, above the {max_rejected_fraction:.0%} threshold: refusing to go on "
            f"({dict(counts.rejected_by_reason)}; see the dead letter)")
