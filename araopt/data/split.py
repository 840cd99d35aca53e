"""Time-based train/test split of a conversion log (Sec. 5.1: real-world data is split by timestamp).

train holds the rows with time < cut and test the rows with time >= cut. The cut is either
given, or it is the q-quantile of the time column: with the times sorted, s_0 <= ... <= s_{n-1},
the cut is s_k for k = round(q n). The train set then has exactly k rows when there are no
ties, and fewer when other rows share the time s_k, because equal times never straddle the cut.
The default time column is conversion_time. Use impression_time, or a click time, to keep all
of an impression's conversions on one side; a time-of-conversion split can put one impression's
rows on both sides.

Streaming: finding the cut from a quantile reads only the time column into memory (8 bytes per
row; np.partition is O(n)). Writing then streams record batches into train/ and test/. With an
explicit cut, memory is bounded by one batch.
Outputs: <out>/train/part-*.parquet and <out>/test/part-*.parquet, with the input's schema, and
<out>/<split>/_manifest.json. Hive-style directory names (date=...) are not turned into
columns.
"""
from __future__ import annotations

import math
import os
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from araopt.errors import InvalidInput, InvalidParameters
from araopt.io.conversions import time_as_micros
from araopt.io.folders import OutputFolder, ParquetShardWriter, check_parent_folder


@dataclass(frozen=True)
class SplitResult:
    cut_time: datetime
    time_column: str
    train_rows: int
    test_rows: int

    def as_dict(self) -> dict[str, object]:
        return {"cut_time": self.cut_time.isoformat(), "time_column": self.time_column,
                "train_rows": self.train_rows, "test_rows": self.test_rows}


def parse_cut_time(text: str) -> datetime:
    """ISO-8601 date or datetime; a naive value is taken as UTC."""
    try:
        t = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise InvalidInput(f"cut time {text!r} is not an ISO-8601 date/time (e.g. 2024-01-15T00:00:00Z)") from None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


SPLITS = ("train", "test")


def _dataset(source: pa.Table | str | os.PathLike[str]) -> ds.Dataset:
    if isinstance(source, pa.Table):
        return ds.dataset(source)
    path = os.fspath(source)
    if not os.path.exists(path):
        raise InvalidInput(f"input {path!r} does not exist")
    return ds.dataset(path, format="parquet")


def _micros(column: pa.ChunkedArray | pa.Array, name: str) -> np.ndarray:
    if not pa.types.is_timestamp(column.type):
        raise InvalidInput(f"time column {name!r} must be a timestamp, got {column.type}")
    if column.null_count:
        raise InvalidInput(f"time column {name!r} has {column.null_count} null(s)")
    micros, ok, _ = time_as_micros(column)  # by the column's own unit (pandas writes ns), floored to the microsecond
    if not ok.all():
        raise InvalidInput(f"time column {name!r} has {int((~ok).sum())} value(s) out of the int64 microsecond range")
    return micros


def quantile_cut(source: pa.Table | str | os.PathLike[str], train_fraction: float,
                 time_column: str = "conversion_time") -> datetime:
    """The cut time s_k, k = round(train_fraction * n), over the sorted times (module docstring)."""
    q = float(train_fraction)
    if not (0.0 < q < 1.0) or math.isnan(q):
        raise InvalidParameters(f"train fraction must be strictly between 0 and 1, got {train_fraction}")
    dataset = _dataset(source)
    if time_column not in dataset.schema.names:
        raise InvalidInput(f"input has no column {time_column!r}; present: {dataset.schema.names}")
    times = _micros(dataset.to_table(columns=[time_column]).column(time_column), time_column)
    if times.size < 2:
        raise InvalidInput(f"need at least 2 rows to split, got {times.size}")
    k = min(times.size - 1, max(0, round(q * times.size)))
    cut_us = int(np.partition(times, k)[k])
    return datetime.fromtimestamp(cut_us // 1_000_000, tz=UTC).replace(microsecond=cut_us % 1_000_000)


def split_table(table: pa.Table, cut_time: datetime, time_column: str = "conversion_time") -> tuple[pa.Table, pa.Table]:
    """In-memory split: (rows with time < cut, rows with time >= cut)."""
    if time_column not in table.column_names:
        raise InvalidInput(f"input has no column {time_column!r}; present: {table.column_names}")
    early = _early_mask(table.column(time_column), cut_time, time_column)
    return table.filter(early), table.filter(pc.invert(early))


def _early_mask(column: pa.ChunkedArray | pa.Array, cut_time: datetime, name: str) -> pa.Array:
    micros = _micros(column, name)
    cut_us = _cut_micros(cut_time)
    return pa.array(micros < cut_us)


def _cut_micros(cut_time: datetime) -> int:
    if cut_time.tzinfo is None:
        cut_time = cut_time.replace(tzinfo=UTC)
    delta = cut_time - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def split_by_time(source: pa.Table | str | os.PathLike[str], out_dir: str | os.PathLike[str], *,
                  train_fraction: float | None = None, cut_time: datetime | None = None,
                  time_column: str = "conversion_time", overwrite: bool = False,
                  batch_rows: int = 1_000_000, max_rows_per_file: int = 8_000_000) -> SplitResult:
    """Write <out_dir>/train (time < cut) and <out_dir>/test (time >= cut); exactly one cut rule."""
    if (train_fraction is None) == (cut_time is None):
        raise InvalidParameters("give exactly one of a train fraction or a cut time")
    dataset = _dataset(source)
    if time_column not in dataset.schema.names:
        raise InvalidInput(f"input has no column {time_column!r}; present: {dataset.schema.names}")
    if cut_time is None:
        cut_time = quantile_cut(source, cast(float, train_fraction), time_column)  # (exactly one given: checked above)
    check_parent_folder(out_dir, SPLITS, overwrite)
    rows = {"train": 0, "test": 0}
    with ExitStack() as stack:
        folders = {s: stack.enter_context(OutputFolder.prepare(Path(out_dir) / s, overwrite, "araopt split"))
                   for s in SPLITS}
        writers = {s: ParquetShardWriter(folders[s].staging, dataset.schema, max_rows_per_file) for s in SPLITS}
        try:
            for batch in dataset.to_batches(batch_size=batch_rows):
                if batch.num_rows == 0:
                    continue
                table = pa.Table.from_batches([batch])
                early = _early_mask(table.column(time_column), cut_time, time_column)
                for s, part in (("train", table.filter(early)), ("test", table.filter(pc.invert(early)))):
                    if part.num_rows:
                        writers[s].write(part)
                        rows[s] += part.num_rows
        finally:
            for w in writers.values():
                w.close()
        result = SplitResult(cut_time, time_column, rows["train"], rows["test"])
        manifests = {}
        for s, w in writers.items():
            if not w.files:  # an empty side still gets the schema
                w.write(dataset.schema.empty_table())
                w.close()
            manifests[s] = {"schema": "conversion_log/1", "split": s, "rows": rows[s], **result.as_dict(),
                            "rule": "train: time < cut; test: time >= cut"}
        for s in SPLITS:
            folders[s].commit(manifests[s])
    return result
