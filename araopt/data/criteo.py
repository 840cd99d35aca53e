"""Criteo Sponsored Search Conversion Log (Tallis & Yadav 2018) -> conversion-log contract (Sec. 5.2).

Input format: tab-separated text (optionally .gz/.bz2), no header, one click per line, 23 columns
in this order: Sale, SalesAmountInEuro, time_delay_for_conversion, click_timestamp,
nb_clicks_1week, product_price, product_age_group, device_type, audience_id, product_gender,
product_brand, product_category1..7, product_country, product_id, product_title, partner_id,
user_id. -1 marks a missing value. Sale is 1 if the click converted within the 30-day
attribution window, else 0. SalesAmountInEuro and time_delay_for_conversion (seconds) are -1
when there was no sale. click_timestamp is in Unix seconds. The categorical columns are hashed
strings.

Mapping, as the paper uses the data set (Sec. 5.2): partner_id is the slice, the queried
values are product_price x Sale and SalesAmountInEuro, and the count limit is 1 because each
row is one click. Output columns (schemas/conversion_log.md):
  impression_id        int64, the 1-based physical line number of the click (unique, traceable)
  conversion_time      timestamp[us, UTC]: click_timestamp + time_delay_for_conversion if Sale
                       = 1, else the click time (only present when non-converting clicks are kept)
  partner_id           string, the slice
  product_price_x_sale float64: product_price if Sale = 1, 0 if Sale = 0 (even if the price is -1)
  SalesAmountInEuro    float64: the amount if Sale = 1, 0 if Sale = 0 (where the input has -1)
  click_time           timestamp[us, UTC]; Sale int32; product_price float64 (null for -1);
  user_id, product_id  string (null for -1)
Non-converting clicks are dropped by default. An ARA summary report only holds conversions, and
the paper queries converted rows. include_non_converting=True keeps them with value 0. A row
whose value would be unknown goes to the dead-letter table with its line number and a reason;
such rows are never silently set to 0:
  an empty numeric field or partner_id; Sale not in {0, 1}; click_timestamp < 0; partner_id
  -1 (no slice); and on Sale = 1 rows: time_delay_for_conversion < 0, or a SalesAmountInEuro or
  product_price that is negative (-1 means missing) or not finite. With non-converting clicks kept, a Sale = 0 row with
  SalesAmountInEuro > 0 is contradictory and also goes there.
A line with the wrong number of columns (an empty line included), or a non-numeric value in a
numeric column, makes the file malformed: a ValueError names the line and nothing is published.
Reading streams through pyarrow.csv.open_csv. Memory is bounded by ``block_size``.
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from araopt.errors import InvalidInput
from araopt.io.folders import OutputFolder, ParquetShardWriter

CRITEO_COLUMNS: tuple[str, ...] = (
    "Sale", "SalesAmountInEuro", "time_delay_for_conversion", "click_timestamp", "nb_clicks_1week",
    "product_price", "product_age_group", "device_type", "audience_id", "product_gender", "product_brand",
    "product_category1", "product_category2", "product_category3", "product_category4", "product_category5",
    "product_category6", "product_category7", "product_country", "product_id", "product_title", "partner_id",
    "user_id",
)
_NUMERIC_TYPES: Mapping[str, pa.DataType] = MappingProxyType({
    "Sale": pa.int64(), "SalesAmountInEuro": pa.float64(), "time_delay_for_conversion": pa.int64(),
    "click_timestamp": pa.int64(), "nb_clicks_1week": pa.int64(), "product_price": pa.float64(),
})
_COLUMN_TYPES: Mapping[str, pa.DataType] = MappingProxyType(
    {c: _NUMERIC_TYPES.get(c, pa.string()) for c in CRITEO_COLUMNS})
_REQUIRED = ("Sale", "SalesAmountInEuro", "time_delay_for_conversion", "click_timestamp", "product_price", "partner_id")
_UTC_US = pa.timestamp("us", tz="UTC")

CRITEO_LOG_SCHEMA = pa.schema(
    [
        pa.field("impression_id", pa.int64(), nullable=False),
        pa.field("conversion_time", _UTC_US, nullable=False),
        pa.field("partner_id", pa.string(), nullable=False),
        pa.field("product_price_x_sale", pa.float64(), nullable=False),
        pa.field("SalesAmountInEuro", pa.float64(), nullable=False),
        pa.field("click_time", _UTC_US, nullable=False),
        pa.field("Sale", pa.int32(), nullable=False),
        pa.field("product_price", pa.float64()),
        pa.field("user_id", pa.string()),
        pa.field("product_id", pa.string()),
    ],
    metadata={"araopt.schema": "conversion_log/1", "araopt.source": "araopt.criteo"},
)
DEAD_LETTER_SCHEMA = pa.schema(
    [pa.field("line", pa.int64(), nullable=False), pa.field("reason", pa.string(), nullable=False)]
    + [pa.field(c, _COLUMN_TYPES[c]) for c in _REQUIRED]
)

REASONS: tuple[str, ...] = (
    "",  # 0 = valid
    *(f"empty field {c}" for c in _REQUIRED),
    "Sale must be 0 or 1",
    "click_timestamp missing (-1) or negative",
    "partner_id missing (-1)",
    "time_delay_for_conversion missing (-1) on a converted row",
    "SalesAmountInEuro missing (-1) or invalid on a converted row",
    "product_price missing (-1) or invalid on a converted row",
    "SalesAmountInEuro > 0 on a non-converting row",
)
_CONVERSION_ERROR = re.compile(r"In CSV column #(\d+): Row #(\d+): (.*)", re.S)


@dataclass
class CriteoStats:
    """Counts of one load (mutable accumulator while streaming)."""

    lines: int = 0
    conversions: int = 0
    non_converting_kept: int = 0
    non_converting_dropped: int = 0
    dead_letters: int = 0
    dead_letter_reasons: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"lines": self.lines, "conversions": self.conversions, "non_converting_kept": self.non_converting_kept,
                "non_converting_dropped": self.non_converting_dropped, "dead_letters": self.dead_letters,
                "dead_letter_reasons": dict(self.dead_letter_reasons)}


@dataclass(frozen=True)
class CriteoLoad:
    table: pa.Table
    dead_letters: pa.Table
    stats: CriteoStats


def _open(path: str, block_size: int, bad_rows: list[tuple[int | None, int, int]]) -> pacsv.CSVStreamingReader:
    def on_invalid(row: Any) -> str:  # exceptions raised here are swallowed by pyarrow: record instead
        bad_rows.append((row.number, row.actual_columns, row.expected_columns))
        return "skip"

    return pacsv.open_csv(
        path,
        read_options=pacsv.ReadOptions(column_names=list(CRITEO_COLUMNS), block_size=block_size,
                                       use_threads=False),  # single-threaded: physical row numbers are known
        parse_options=pacsv.ParseOptions(delimiter="\t", quote_char=False, newlines_in_values=False,
                                         ignore_empty_lines=False, invalid_row_handler=on_invalid),
        convert_options=pacsv.ConvertOptions(column_types=dict(_COLUMN_TYPES), null_values=[""],
                                             strings_can_be_null=True, quoted_strings_can_be_null=False),
    )


def _raise_bad_row(path: str, bad_rows: list[tuple[int | None, int, int]]) -> None:
    number, actual, expected = bad_rows[0]
    where = f"line {number}" if number is not None else "a line"
    raise InvalidInput(f"{path}: {where}: expected {expected} tab-separated columns, found {actual}")


def _arrow_error(path: str, e: pa.ArrowInvalid) -> ValueError:
    m = _CONVERSION_ERROR.search(str(e))
    if m:
        col = CRITEO_COLUMNS[int(m.group(1))] if int(m.group(1)) < len(CRITEO_COLUMNS) else f"#{m.group(1)}"
        return ValueError(f"{path}: line {m.group(2)}: column {col}: {m.group(3).strip()}")
    return ValueError(f"{path}: malformed Criteo file: {str(e).strip().splitlines()[0]}")


def _numpy(batch: pa.RecordBatch, name: str, fill: Any) -> np.ndarray:
    return cast(np.ndarray, batch.column(name).fill_null(fill).to_numpy(zero_copy_only=False))


def map_batch(batch: pa.RecordBatch, first_line: int, include_non_converting: bool = False
              ) -> tuple[pa.Table, pa.Table, int]:
    """Map parsed rows (lines first_line, first_line+1, ...) to (log rows, dead letters, dropped)."""
    n = batch.num_rows
    line = first_line + np.arange(n, dtype=np.int64)
    code = np.zeros(n, dtype=np.int8)

    def flag(mask: np.ndarray, reason: str) -> None:
        code[mask & (code == 0)] = REASONS.index(reason)

    sale = _numpy(batch, "Sale", -1)
    amount = _numpy(batch, "SalesAmountInEuro", -1.0)
    delay = _numpy(batch, "time_delay_for_conversion", -1)
    click = _numpy(batch, "click_timestamp", -1)
    price = _numpy(batch, "product_price", -1.0)
    for c in _REQUIRED:
        flag(batch.column(c).is_null().to_numpy(zero_copy_only=False), f"empty field {c}")
    flag(~np.isin(sale, (0, 1)), "Sale must be 0 or 1")
    drop = (code == 0) & (sale == 0) & (not include_non_converting)
    partner = batch.column("partner_id")
    flag(~drop & (click < 0), "click_timestamp missing (-1) or negative")
    flag(~drop & pc.fill_null(pc.equal(partner, "-1"), False).to_numpy(zero_copy_only=False),
         "partner_id missing (-1)")
    converted = sale == 1
    flag(converted & (delay < 0), "time_delay_for_conversion missing (-1) on a converted row")
    with np.errstate(invalid="ignore"):
        bad_amount, bad_price = ~((amount >= 0) & np.isfinite(amount)), ~((price >= 0) & np.isfinite(price))
    flag(converted & bad_amount, "SalesAmountInEuro missing (-1) or invalid on a converted row")
    flag(converted & bad_price, "product_price missing (-1) or invalid on a converted row")
    if include_non_converting:
        flag((sale == 0) & (amount > 0), "SalesAmountInEuro > 0 on a non-converting row")
    keep = (code == 0) & ~drop
    dead = code != 0

    k_sale = sale[keep]
    k_conv = k_sale == 1
    click_us = click[keep] * 1_000_000
    conv_us = click_us + np.where(k_conv, delay[keep], 0) * 1_000_000
    keep_arr = pa.array(keep)

    def nullify_missing(name: str) -> pa.Array:
        col = batch.column(name).filter(keep_arr)
        return pc.if_else(pc.fill_null(pc.equal(col, "-1"), True), pa.scalar(None, pa.string()), col)

    k_price = price[keep]
    table = pa.Table.from_arrays(
        [
            pa.array(line[keep], pa.int64()),
            pa.array(conv_us, _UTC_US),
            batch.column("partner_id").filter(keep_arr),
            pa.array(np.where(k_conv, k_price, 0.0), pa.float64()),
            pa.array(np.where(k_conv, amount[keep], 0.0), pa.float64()),
            pa.array(click_us, _UTC_US),
            pa.array(k_sale.astype(np.int32), pa.int32()),
            pa.array(k_price, pa.float64(), mask=k_price < 0),
            nullify_missing("user_id"),
            nullify_missing("product_id"),
        ],
        schema=CRITEO_LOG_SCHEMA,
    )
    dead_arr = pa.array(dead)
    reasons = np.asarray(REASONS, dtype=object)[code[dead]]
    dead_letters = pa.Table.from_arrays(
        [pa.array(line[dead], pa.int64()), pa.array(reasons.tolist(), pa.string())]
        + [batch.column(c).filter(dead_arr) for c in _REQUIRED],
        schema=DEAD_LETTER_SCHEMA,
    )
    return table, dead_letters, int(drop.sum())


def iter_criteo(path: str | os.PathLike[str], *, include_non_converting: bool = False,
                block_size: int = 1 << 24) -> Iterator[tuple[pa.Table, pa.Table, int]]:
    """Stream (log rows, dead letters, dropped non-converting count) per parsed block."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise InvalidInput(f"Criteo file {path!r} does not exist")
    bad_rows: list[tuple[int | None, int, int]] = []
    first_line = 1
    try:
        reader = _open(path, block_size, bad_rows)
    except pa.ArrowInvalid as e:
        if "Empty CSV file" in str(e):
            return
        raise _arrow_error(path, e) from None
    while True:
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            break
        except pa.ArrowInvalid as e:
            if bad_rows:
                _raise_bad_row(path, bad_rows)
            raise _arrow_error(path, e) from None
        if bad_rows:
            _raise_bad_row(path, bad_rows)
        if batch.num_rows == 0:
            continue
        _check_empty_lines(path, batch, first_line)
        yield map_batch(batch, first_line, include_non_converting)
        first_line += batch.num_rows
    if bad_rows:
        _raise_bad_row(path, bad_rows)


def _check_empty_lines(path: str, batch: pa.RecordBatch, first_line: int) -> None:
    """pyarrow parses an empty line as a row of nulls; the format has none, so it is malformed."""
    if batch.column(0).null_count == 0:
        return
    empty = np.ones(batch.num_rows, dtype=bool)
    for col in batch.columns:
        empty &= col.is_null().to_numpy(zero_copy_only=False)
    if empty.any():
        n = first_line + int(np.argmax(empty))
        raise InvalidInput(f"{path}: line {n}: expected {len(CRITEO_COLUMNS)} tab-separated columns, found 1 (empty line)")


def _account(stats: CriteoStats, table: pa.Table, dead: pa.Table, dropped: int) -> None:
    sales = pc.sum(table.column("Sale")).as_py() or 0
    stats.conversions += sales
    stats.non_converting_kept += table.num_rows - sales
    stats.non_converting_dropped += dropped
    stats.dead_letters += dead.num_rows
    stats.lines += table.num_rows + dead.num_rows + dropped
    for reason in dead.column("reason").to_pylist():
        stats.dead_letter_reasons[reason] = stats.dead_letter_reasons.get(reason, 0) + 1


def read_criteo(path: str | os.PathLike[str], *, include_non_converting: bool = False) -> CriteoLoad:
    """Load a whole Criteo file in memory (small files and tests; see ``convert_criteo``)."""
    stats = CriteoStats()
    tables, deads = [], []
    for table, dead, dropped in iter_criteo(path, include_non_converting=include_non_converting):
        _account(stats, table, dead, dropped)
        tables.append(table)
        deads.append(dead)
    table = pa.concat_tables(tables) if tables else CRITEO_LOG_SCHEMA.empty_table()
    dead = pa.concat_tables(deads) if deads else DEAD_LETTER_SCHEMA.empty_table()
    return CriteoLoad(table, dead, stats)


def convert_criteo(path: str | os.PathLike[str], out_dir: str | os.PathLike[str], *,
                   include_non_converting: bool = False, overwrite: bool = False,
                   max_rows_per_file: int = 8_000_000, block_size: int = 1 << 24) -> CriteoStats:
    """Stream a Criteo file into ``out_dir``: part-*.parquet, _dead_letters.parquet, _manifest.json.

    The folder is staged and moved into place only on success (``araopt.io.folders``: whole or absent);
    a non-empty ``out_dir`` is refused unless ``overwrite`` is set, and then only if araopt wrote it (it
    holds ``_manifest.json``).
    """
    with OutputFolder.prepare(out_dir, overwrite, "araopt load-criteo") as folder:
        stats = CriteoStats()
        writer = ParquetShardWriter(folder.staging, CRITEO_LOG_SCHEMA, max_rows_per_file)
        dead_writer = ParquetShardWriter(folder.staging, DEAD_LETTER_SCHEMA, 1 << 62, prefix="_dead_letters")
        try:
            for table, dead, dropped in iter_criteo(path, include_non_converting=include_non_converting,
                                                    block_size=block_size):
                _account(stats, table, dead, dropped)
                if table.num_rows:
                    writer.write(table)
                if dead.num_rows:
                    dead_writer.write(dead)
        finally:
            writer.close()
            dead_writer.close()
        if not writer.files:
            writer.write(CRITEO_LOG_SCHEMA.empty_table())
            writer.close()
        folder.commit({"schema": "conversion_log/1", "source": "criteo-sponsored-search", "input": os.fspath(path),
                       "include_non_converting": include_non_converting, **stats.as_dict()})
    return stats

