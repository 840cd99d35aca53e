"""The conversions a release uses, computed in the job over the rows actually read: per batch,
vectorised (``araopt.io.rowset``), written as a side output (one small Arrow file per batch) into a
folder the driver merges into the release's row set for the release-ledger check. Feed it exactly
the rows being released (any subset of validated rows). A retried bundle writes its batches' ids
again under new names: the driver's set semantics make that exact.
"""
from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from araopt.attribution.content import row_contents
from araopt.attribution.params import AttributionParams
from araopt.io import jsonio
from araopt.io.rowset import RowSetPart, content_ranges, fold_content, folded_content_ids, table_row_ids
from araopt.ledger.lifetime import HeldCombiner
from araopt.mechanism.lifetime import ReleaseHistory
from transforms.combine import CombinerFn


class _WriteRowIds(beam.DoFn):
    def __init__(self, directory: str):
        self._directory = directory

    def setup(self) -> None:
        self._rows = Metrics.counter("araopt", "row_ids_written")

    def process(self, table: pa.Table) -> Iterator[str]:
        if table.num_rows == 0:
            return
        path = FileSystems.join(self._directory, f"{uuid.uuid4().hex}.arrow")
        with FileSystems.create(path) as fh:
            fh.write(RowSetPart.of_table(table).sorted().to_arrow_bytes())  # a sorted run: merged streamed
        self._rows.inc(table.num_rows)
        yield path


@beam.typehints.with_input_types(pa.Table)
@beam.typehints.with_output_types(str)
class WriteRowIds(beam.PTransform):
    """Validated batches -> their conversion ids and time range, one Arrow file per batch under
    ``directory``, each identity sorted (read back with ``RowSetPart.from_arrow_bytes`` and merged with
    ``SpilledRowSet.merge_runs``, or ``RowSet.merge`` in memory)."""

    def __init__(self, directory: str):
        super().__init__()
        self._directory = directory

    def expand(self, batches: beam.PCollection[pa.Table]) -> beam.PCollection[str]:
        return batches | "WriteRowIds" >> beam.ParDo(_WriteRowIds(self._directory))


def _write_json(doc: object, path: str) -> str:
    with FileSystems.create(path) as fh:
        fh.write(jsonio.dumps(doc, indent=1).encode())
    return path


@beam.typehints.with_input_types(pa.Table)
@beam.typehints.with_output_types(str)
class CountHeldReleases(beam.PTransform):
    """Lookback batches, one per shard of complete impressions -> how many conversions of each earlier
    release (``history``: the ledger's, named by entry id) they hold, over the whole job, written as JSON
    ({entry id: count}) to ``path``: the commit checks that the lookback held each release in reach whole
    (``araopt.ledger.lifetime``). Exact under retries (a combine, not a side output)."""

    def __init__(self, history: ReleaseHistory, path: str):
        super().__init__()
        self._history = history
        self._path = path

    def expand(self, batches: beam.PCollection[pa.Table]) -> beam.PCollection[str]:
        return (batches
                | "LookbackIds" >> beam.Map(table_row_ids)
                | "HeldCounts" >> beam.CombineGlobally(CombinerFn(HeldCombiner(self._history)))
                | "WriteHeld" >> beam.Map(_write_json, self._path))



class _FoldContent(beam.CombineFn):
    """Folds of one id range (``araopt.io.rowset.fold_content``) merged: a commutative sum per row id."""

    def create_accumulator(self) -> tuple[np.ndarray, np.ndarray]:
        empty = np.empty(0, dtype=np.uint64)
        return empty, empty

    def add_input(self, acc: tuple[np.ndarray, np.ndarray], item: tuple[np.ndarray, np.ndarray]
                  ) -> tuple[np.ndarray, np.ndarray]:
        return self.merge_accumulators([acc, item])

    def merge_accumulators(self, accs: Iterable[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
        accs = list(accs)
        return fold_content(np.concatenate([a[0] for a in accs]), np.concatenate([a[1] for a in accs]), mixed=True)

    def extract_output(self, acc: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        return acc


def _content_folds(table: pa.Table, params: AttributionParams) -> Iterator[tuple[int, tuple[np.ndarray, np.ndarray]]]:
    if table.num_rows:
        yield from content_ranges(table_row_ids(table), row_contents(params, table))


def _write_range(item: tuple[int, tuple[np.ndarray, np.ndarray]], directory: str) -> str:
    index, (ids, sums) = item
    path = FileSystems.join(directory, f"range-{index:03d}.arrow")  # one name per range: a retry writes it again
    with FileSystems.create(path) as fh:
        fh.write(RowSetPart(folded_content_ids(ids, sums), None, None).to_arrow_bytes())
    return path


@beam.typehints.with_input_types(pa.Table)
@beam.typehints.with_output_types(str)
class WriteContentIds(beam.PTransform):
    """Valid W3C Attribution batches -> the content identities of their rows (``araopt.io.rowset.content_ids``
    of each row's id and the hash of what the browsers' simulation under ``params`` reads of it,
    ``araopt.attribution.content``), one Arrow file per id range under ``directory`` (read back as the
    row ids are: ``RowSetPart.from_arrow_bytes``). Every copy of a row id counts, so the fold is a combine
    per id range (exact under retries: a retried bundle's side output would count its rows twice)."""

    def __init__(self, directory: str, params: AttributionParams):
        super().__init__()
        self._directory = directory
        self._params = params

    def expand(self, batches: beam.PCollection[pa.Table]) -> beam.PCollection[str]:
        return (batches
                | "FoldContent" >> beam.FlatMap(_content_folds, self._params)
                | "FoldRanges" >> beam.CombinePerKey(_FoldContent())
                | "WriteRanges" >> beam.Map(_write_range, self._directory))
