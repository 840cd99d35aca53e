"""Reading conversion logs (Parquet, local or gs://) as Arrow record batches through Beam IO."""
from __future__ import annotations

from typing import Sequence

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

from araopt.conversions import CONVERSION_TIME, IMPRESSION_ID, check_schema


def _is_directory(pattern: str) -> bool:
    return not any(ch in pattern for ch in "*?[") and not pattern.endswith(".parquet") and FileSystems.exists(pattern)


def input_pattern(pattern: str) -> str:
    """The glob Beam should read: a directory becomes ``dir/**.parquet``."""
    return FileSystems.join(pattern, "**.parquet") if _is_directory(pattern) else pattern


def match_files(pattern: str) -> list[str]:
    """Non-empty files matching a glob (local or gs://); a directory means every *.parquet below it."""
    patterns = [input_pattern(pattern)]
    if _is_directory(pattern):
        patterns.append(FileSystems.join(pattern, "*.parquet"))
    paths = {m.path for p in patterns for m in FileSystems.match([p])[0].metadata_list if m.size_in_bytes > 0}
    return sorted(paths)


def read_schema(path: str) -> pa.Schema:
    with FileSystems.open(path) as fh:
        return pq.read_schema(fh)


def check_input(pattern: str, slice_columns: Sequence[str], value_columns: Sequence[str]) -> tuple[list[str], pa.Schema]:
    """Driver-side check before any processing: files exist, required columns and types are right."""
    paths = match_files(pattern)
    if not paths:
        raise ValueError(f"no input files match {pattern!r}")
    schema = read_schema(paths[0])
    check_schema(schema, slice_columns, value_columns, source=paths[0])
    for p in paths[1:]:
        other = read_schema(p)
        check_schema(other, slice_columns, value_columns, source=p)
    return paths, schema


def needed_columns(slice_columns: Sequence[str], value_columns: Sequence[str]) -> list[str]:
    return [IMPRESSION_ID, CONVERSION_TIME, *slice_columns, *value_columns]


class ReadConversions(beam.PTransform):
    """Parquet files -> PCollection of ``pa.Table`` record batches with only the needed columns."""

    def __init__(self, pattern: str, columns: Sequence[str]):
        super().__init__()
        self._pattern = input_pattern(pattern)
        self._columns = list(columns)

    def expand(self, pbegin):
        return pbegin | "ReadParquetBatches" >> beam.io.ReadFromParquetBatched(self._pattern, columns=self._columns)


def check_schema_of(paths: Sequence[str], slice_columns: Sequence[str], value_columns: Sequence[str]) -> pa.Schema:
    """Schema check of an explicit file list (driver side, before any processing)."""
    if not paths:
        raise ValueError("no input files")
    schema = None
    for p in paths:
        schema = read_schema(p)
        check_schema(schema, slice_columns, value_columns, source=p)
    return schema


class ReadConversionFiles(beam.PTransform):
    """An explicit list of Parquet files (e.g. a date window) -> PCollection of ``pa.Table`` batches."""

    def __init__(self, paths: Sequence[str], columns: Sequence[str]):
        super().__init__()
        self._paths = list(paths)
        self._columns = list(columns)

    def expand(self, pbegin):
        return (
            pbegin
            | "Files" >> beam.Create(self._paths)
            | "ReadParquetBatches" >> beam.io.ReadAllFromParquetBatched(columns=self._columns)
        )


def count_rows(paths: Sequence[str]) -> int:
    """Total rows from the Parquet footers (one small read per file)."""
    total = 0
    for p in paths:
        with FileSystems.open(p) as fh:
            total += pq.ParquetFile(fh).metadata.num_rows
    return total


ROWS_PER_SHARD = 250_000
MIN_SHARDS = 16


def auto_num_shards(total_rows: int, rows_per_shard: int = ROWS_PER_SHARD) -> int:
    """Shards so that each holds about ``rows_per_shard`` rows: the per-shard working set (what bounds
    a worker's memory) then stays the same whatever the input size."""
    return max(MIN_SHARDS, -(-int(total_rows) // rows_per_shard))
