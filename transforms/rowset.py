"""The set of conversions a release uses, computed in the job over the rows actually read: per batch,
vectorised (``araopt.rowset``), merged by one CombineFn, written as a Parquet row set for the
driver's release-ledger check. Feed it exactly the rows being released (any subset of validated rows).
"""
from __future__ import annotations

import apache_beam as beam
import pyarrow as pa
from apache_beam.io.filesystems import FileSystems

from araopt.rowset import RowSet, RowSetPart


class RowSetCombineFn(beam.CombineFn):
    """Validated batches -> the ``RowSet`` of their conversions (accumulator: per-batch id arrays)."""

    def create_accumulator(self) -> list[RowSetPart]:
        return []

    def add_input(self, parts: list[RowSetPart], table: pa.Table) -> list[RowSetPart]:
        parts.append(RowSetPart.of_table(table))
        return parts

    def merge_accumulators(self, accumulators) -> list[RowSetPart]:
        return [part for parts in accumulators for part in parts]

    def extract_output(self, parts: list[RowSetPart]) -> RowSet:
        return RowSet.merge(parts)


def _write(rows: RowSet, path: str) -> str:
    with FileSystems.create(path) as fh:
        fh.write(rows.to_parquet_bytes())
    return path


@beam.typehints.with_input_types(pa.Table)
@beam.typehints.with_output_types(str)
class WriteRowSet(beam.PTransform):
    """PCollection of validated batches -> their row set written to ``path`` (one Parquet file)."""

    def __init__(self, path: str):
        super().__init__()
        self._path = path

    def expand(self, batches: beam.PCollection[pa.Table]) -> beam.PCollection[str]:
        return (batches
                | "RowIds" >> beam.CombineGlobally(RowSetCombineFn()).with_output_types(RowSet)
                | "WriteRowSet" >> beam.Map(_write, self._path))
