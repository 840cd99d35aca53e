"""Conversion records as column arrays, and the conversion-log contract checks.

Contract (``schemas/conversion_log.md``): ``impression_id`` int64 or string, non-null;
``conversion_time`` timestamp, non-null; slice columns (impression or conversion features) of any
scalar type, non-null; value columns numeric, finite and >= 0. Schema problems are a ``ValueError``
before any processing; per-row problems are returned as rejected rows with a ``reason``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

IMPRESSION_ID = "impression_id"
CONVERSION_TIME = "conversion_time"
REASON = "reason"

REJECT_REASONS = (
    "null_impression_id",
    "null_conversion_time",
    "unparseable_conversion_time",
    "null_slice_value",
    "null_value",
    "non_finite_value",
    "negative_value",
)


def check_schema(schema: pa.Schema, slice_columns: Sequence[str], value_columns: Sequence[str], source: str = "input") -> None:
    """Refuse (ValueError) a conversion log without the required columns or with wrong types."""
    names = set(schema.names)
    missing = [c for c in (IMPRESSION_ID, CONVERSION_TIME, *slice_columns, *value_columns) if c not in names]
    if missing:
        raise ValueError(f"{source}: missing required column(s) {missing}; present: {sorted(names)}")
    id_type = schema.field(IMPRESSION_ID).type
    if not (pa.types.is_integer(id_type) or pa.types.is_string(id_type) or pa.types.is_large_string(id_type)):
        raise ValueError(f"{source}: column {IMPRESSION_ID!r} must be int64 or string, got {id_type}")
    time_type = schema.field(CONVERSION_TIME).type
    if not (pa.types.is_timestamp(time_type) or pa.types.is_string(time_type) or pa.types.is_large_string(time_type)):
        raise ValueError(f"{source}: column {CONVERSION_TIME!r} must be a timestamp (or ISO-8601 string), got {time_type}")
    for c in value_columns:
        t = schema.field(c).type
        if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)):
            raise ValueError(f"{source}: value column {c!r} must be numeric, got {t}")
    for c in slice_columns:
        t = schema.field(c).type
        if not (pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_boolean(t)
                or pa.types.is_dictionary(t)):
            raise ValueError(f"{source}: slice column {c!r} must be integer, string or boolean, got {t}")


def _time_as_micros(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Timestamps (any unit / tz) or ISO strings -> int64 microseconds since epoch (null if unparseable)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        parsed = pd.to_datetime(pd.Series(column.to_pandas()), errors="coerce", utc=True, format="ISO8601")
        return pa.array(parsed.astype("int64").where(parsed.notna(), None).astype("Int64"), type=pa.int64())
    return pc.cast(pc.cast(column, pa.timestamp("us", tz=column.type.tz)), pa.int64())


def validate_table(
    table: pa.Table, slice_columns: Sequence[str], value_columns: Sequence[str],
) -> tuple[pa.Table, pa.Table]:
    """Split a batch into (valid rows, rejected rows + ``reason``), vectorized; first failing check wins.

    Valid rows get ``conversion_time`` normalised to int64 microseconds (column ``conversion_time_us``).
    """
    check_schema(table.schema, slice_columns, value_columns)
    n = table.num_rows
    reason = np.full(n, "", dtype=object)

    def flag(mask: np.ndarray, why: str) -> None:
        sel = mask & (reason == "")
        reason[sel] = why

    flag(table.column(IMPRESSION_ID).is_null().to_numpy(zero_copy_only=False), "null_impression_id")
    time_column = table.column(CONVERSION_TIME)
    micros = _time_as_micros(time_column)
    time_nulls = time_column.is_null().to_numpy(zero_copy_only=False)
    flag(time_nulls, "null_conversion_time")
    flag(micros.is_null().to_numpy(zero_copy_only=False) & ~time_nulls, "unparseable_conversion_time")
    for c in slice_columns:
        flag(table.column(c).is_null().to_numpy(zero_copy_only=False), "null_slice_value")
    for c in value_columns:
        col = table.column(c)
        nulls = col.is_null().to_numpy(zero_copy_only=False)
        flag(nulls, "null_value")
        vals = pc.cast(col, pa.float64()).to_numpy(zero_copy_only=False)
        with np.errstate(invalid="ignore"):
            flag(~nulls & ~np.isfinite(vals), "non_finite_value")
            flag(vals < 0, "negative_value")
    bad = reason != ""
    # the valid rows carry the time once, as int64 microseconds (the original column is dropped)
    with_time = table.append_column("conversion_time_us", micros).drop_columns([CONVERSION_TIME])
    good_tbl = with_time.filter(pa.array(~bad))
    rejected = table.filter(pa.array(bad))
    rejected = rejected.append_column(REASON, pa.array(reason[bad].astype(str), type=pa.string()))
    return good_tbl, rejected


@dataclass(frozen=True)
class Conversions:
    """Validated conversion records as numpy arrays (the unit of work of the core)."""

    impression_id: np.ndarray
    conversion_time: np.ndarray  # int64 microseconds since the epoch (any sortable int64 works)
    slices: Mapping[str, np.ndarray]
    values: np.ndarray  # (n, d) float64, in value_columns order
    value_columns: tuple[str, ...]

    def __post_init__(self) -> None:
        n = len(self.impression_id)
        lengths = {"conversion_time": len(self.conversion_time), "values": self.values.shape[0]}
        lengths.update({f"slice {k}": len(v) for k, v in self.slices.items()})
        bad = {k: v for k, v in lengths.items() if v != n}
        if bad:
            raise ValueError(f"mismatched array lengths: impression_id has {n}, {bad}")

    def __len__(self) -> int:
        return len(self.impression_id)

    @property
    def slice_columns(self) -> tuple[str, ...]:
        return tuple(self.slices)

    @classmethod
    def from_table(cls, table: pa.Table | pd.DataFrame, slice_columns: Sequence[str], value_columns: Sequence[str]) -> "Conversions":
        """From a validated Arrow table (or DataFrame); refuses rows that fail the contract."""
        if isinstance(table, pd.DataFrame):
            table = pa.Table.from_pandas(table, preserve_index=False)
        if "conversion_time_us" not in table.column_names:
            good, rejected = validate_table(table, slice_columns, value_columns)
            if rejected.num_rows:
                reasons = pd.Series(rejected.column(REASON).to_pylist()).value_counts().to_dict()
                raise ValueError(f"{rejected.num_rows} invalid conversion rows: {reasons}")
            table = good
        values = np.column_stack([pc.cast(table.column(c), pa.float64()).to_numpy(zero_copy_only=False)
                                  for c in value_columns]) if value_columns else np.zeros((table.num_rows, 0))
        return cls(
            impression_id=table.column(IMPRESSION_ID).to_numpy(zero_copy_only=False),
            conversion_time=table.column("conversion_time_us").to_numpy(zero_copy_only=False).astype(np.int64),
            slices={c: table.column(c).to_numpy(zero_copy_only=False) for c in slice_columns},
            values=values.reshape(table.num_rows, len(value_columns)),
            value_columns=tuple(value_columns),
        )

    def take(self, index: np.ndarray) -> "Conversions":
        return Conversions(self.impression_id[index], self.conversion_time[index],
                           {k: v[index] for k, v in self.slices.items()}, self.values[index], self.value_columns)

    def record_keys(self) -> np.ndarray:
        """A 64-bit content hash per record: the deterministic tie-break and simulation RR key."""
        frame = pd.DataFrame({"i": _normalise(self.impression_id), "t": self.conversion_time.astype(np.int64)})
        for j in range(self.values.shape[1]):
            frame[f"v{j}"] = self.values[:, j].astype(np.float64)
        for k, v in self.slices.items():
            frame[f"s_{k}"] = _normalise(v)
        return pd.util.hash_pandas_object(frame, index=False).to_numpy(dtype=np.uint64)


def _normalise(arr: np.ndarray) -> np.ndarray:
    arr = np.asarray(arr)
    if arr.dtype.kind in "iu":
        return arr.astype(np.int64)
    if arr.dtype.kind == "b":
        return arr.astype(np.int64)
    return arr.astype(object)
