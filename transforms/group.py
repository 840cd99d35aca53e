"""Group conversions by impression, batched: shard record batches by a stable hash of the impression
id, GroupByKey on the shard, and concatenate; every output table holds all conversions of each of
its impressions (however they were spread over files and batches), so Alg. 1 can run per table.

Two shuffles, same result:

* ``memory``: the record batches themselves go through the GroupByKey. Right for Dataflow, whose
  shuffle service keeps them out of worker memory.
* ``files``: each batch's shard slices are written as Arrow IPC files under a spill directory and
  only their paths go through the GroupByKey (the barrier); each shard is then read back from its
  files. Beam's local runner holds a GroupByKey's whole input in memory, so this is what keeps a
  local run's memory at the size of a shard and a batch instead of the input's. File names are
  random: a retried bundle writes new files, and only the paths of committed bundles are read.

With ``as_files=True`` (and a spill directory) a shard is not read back: its element is the list of
its spill files (``ShardFiles``) and every consumer reads the rows itself (``shard_table``). A job
whose grouped shards feed two stages (nightly's statistics, then the calibration of the parameters
chosen from them) then holds only file names between the stages, not the whole grouped history.
"""
from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.io.filesystems import FileSystems

from araopt.errors import InvalidParameters
from araopt.io.conversions import IMPRESSION_ID
from araopt.io.ids import ID_SORT_KEY, canonical_id_hash, with_id_hash


def shard_of(impression_ids: np.ndarray, num_shards: int) -> np.ndarray:
    """Stable across processes and machines (the canonical id hash, ``araopt.io.ids``), in [0, num_shards)."""
    return _shards(canonical_id_hash(impression_ids), num_shards)


def _shards(hashed: np.ndarray, num_shards: int) -> np.ndarray:
    return (hashed % np.uint64(num_shards)).astype(np.int64)


def split_by_shard(table: pa.Table, num_shards: int, column: str = IMPRESSION_ID) -> Iterator[tuple[int, pa.Table]]:
    """(shard, rows of that shard) for every shard present in the batch, sharded by the id in ``column``
    (the impression; the browser for the Attribution API): zero-copy slices of one reordered copy of the
    batch. Arrow IPC (the spill files, and the shuffle's coder, ``transforms.coders``) writes only a
    slice's rows; a pickled slice would carry the whole batch.

    Sharded by the impression, the rows carry their id hash (``araopt.io.ids.ID_HASH``) from here on:
    the id is hashed once per row, for the shard, the record keys and the ledger's identities."""
    if column == IMPRESSION_ID:
        table, hashed = with_id_hash(table, IMPRESSION_ID)
        shards = _shards(hashed, num_shards)
    else:
        shards = shard_of(table.column(column).to_numpy(zero_copy_only=False), num_shards)
    small = np.int16 if num_shards <= np.iinfo(np.int16).max else np.int32  # a stable sort of small ints is a radix sort
    order = np.argsort(shards.astype(small), kind="stable")
    sorted_shards = shards[order]
    ordered = table.take(pa.array(order))
    bounds = np.flatnonzero(np.diff(sorted_shards)) + 1
    for start, stop in zip(np.concatenate([[0], bounds]), np.concatenate([bounds, [len(order)]]), strict=True):
        if stop > start:
            yield int(sorted_shards[start]), ordered.slice(start, stop - start)


@dataclass(frozen=True)
class ShardFiles:
    """One shard of complete impressions as the Arrow IPC spill files that hold it (read in name order).
    ``sort_keys``: a spill file of the rows' ``araopt.io.ids.ID_SORT_KEY`` in that order (written by the
    impression-slice check, which ranks the shard's ids once for every consumer), added as a column."""

    paths: tuple[str, ...]
    sort_keys: str | None = None

    def read(self) -> pa.Table:
        tables = [_read_ipc(path) for path in sorted(self.paths)]
        table = pa.concat_tables(tables, promote_options="default") if len(tables) > 1 else tables[0]
        if self.sort_keys is not None:
            table = table.append_column(ID_SORT_KEY, _read_ipc(self.sort_keys).column(ID_SORT_KEY))
        return table


def _read_ipc(path: str) -> pa.Table:
    with FileSystems.open(path) as fh:
        return pa.ipc.open_file(pa.BufferReader(fh.read())).read_all()


def shard_table(value: pa.Table | ShardFiles) -> pa.Table:
    """The rows of a grouped shard's value, whether the rows themselves or their spill files."""
    return value.read() if isinstance(value, ShardFiles) else value


def write_spill(spill_dir: str, shard: int, table: pa.Table) -> str:
    """Write ``table`` (rows of ``shard``) as a new Arrow IPC file under ``spill_dir``; its path. Its
    chunks share one dictionary per column (an IPC file allows no other)."""
    if any(col.num_chunks > 1 and pa.types.is_dictionary(col.type) for col in table.columns):
        table = table.unify_dictionaries()
    path = FileSystems.join(spill_dir, f"shard-{shard:05d}", f"{uuid.uuid4().hex}.arrow")
    with FileSystems.create(path) as fh:
        with pa.ipc.new_file(fh, table.schema) as writer:
            writer.write_table(table)
    return path


class _KeyByShard(beam.DoFn):
    def __init__(self, num_shards: int, column: str = IMPRESSION_ID):
        self._num_shards = num_shards
        self._column = column

    def process(self, table: pa.Table) -> Iterator[tuple[int, pa.Table]]:
        yield from split_by_shard(table, self._num_shards, self._column)


class _SpillByShard(beam.DoFn):
    """Write each shard slice of a batch to ``spill_dir/shard-<5 digits>/<random>.arrow``; emit (shard, path)."""

    def __init__(self, num_shards: int, spill_dir: str, column: str = IMPRESSION_ID):
        self._num_shards = num_shards
        self._spill_dir = spill_dir
        self._column = column

    def process(self, table: pa.Table) -> Iterator[tuple[int, str]]:
        for shard, part in split_by_shard(table, self._num_shards, self._column):
            yield shard, write_spill(self._spill_dir, shard, part)


def _read_shard(item: tuple[int, Iterable[str]]) -> tuple[int, pa.Table]:
    shard, paths = item
    return shard, ShardFiles(tuple(paths)).read()


def _shard_files(item: tuple[int, Iterable[str]]) -> tuple[int, ShardFiles]:
    shard, paths = item
    return shard, ShardFiles(tuple(sorted(paths)))


def _concat(item: tuple[int, Iterable[pa.Table]]) -> tuple[int, pa.Table]:
    shard, tables = item
    tables = list(tables)
    return shard, pa.concat_tables(tables, promote_options="default") if len(tables) > 1 else tables[0]


@beam.typehints.with_input_types(pa.Table)
@beam.typehints.with_output_types(beam.typehints.Tuple[int, beam.typehints.Any])  # pa.Table or ShardFiles
class GroupByImpression(beam.PTransform):
    """PCollection[pa.Table] (or a tuple of them, e.g. a period and its lookback) ->
    PCollection[(shard, pa.Table)] of complete impressions over all the inputs.

    ``spill_dir``: shuffle through Arrow files there (see module docstring); None: in memory.
    ``column``: the id that groups (the impression; ``browser_id`` groups the Attribution API's
    privacy units, complete browsers). ``as_files`` (with ``spill_dir``): (shard, ``ShardFiles``)
    instead, read by each consumer (``shard_table``).
    """

    def __init__(self, num_shards: int, spill_dir: str | None = None, column: str = IMPRESSION_ID,
                 as_files: bool = False):
        super().__init__()
        if num_shards < 1:
            raise InvalidParameters(f"num_shards must be >= 1, got {num_shards}")
        self._num_shards = num_shards
        self._spill_dir = spill_dir
        self._column = column
        self._as_files = as_files

    def expand(self, tables: beam.PCollection[pa.Table] | tuple[beam.PCollection[pa.Table], ...]
               ) -> beam.PCollection[tuple[int, pa.Table]]:
        inputs = tables if isinstance(tables, tuple) else (tables,)
        if self._spill_dir is not None:
            # each input spills on its own and only the (shard, path) pairs are flattened: the local
            # runner materialises a multi-input Flatten, which must not hold the rows themselves
            spill = _SpillByShard(self._num_shards, self._spill_dir, self._column)
            spilled = [part | f"SpillByImpressionShard{i or ''}" >> beam.ParDo(spill).with_output_types(
                beam.typehints.Tuple[int, str]) for i, part in enumerate(inputs)]
            paths = spilled[0] if len(spilled) == 1 else tuple(spilled) | "AllShardFiles" >> beam.Flatten()
            files = paths | "GroupShardFiles" >> beam.GroupByKey()
            if self._as_files:
                return files | "ShardFiles" >> beam.Map(_shard_files).with_output_types(
                    beam.typehints.Tuple[int, ShardFiles])
            return files | "ReadShard" >> beam.Map(_read_shard).with_output_types(beam.typehints.Tuple[int, pa.Table])
        rows = inputs[0] if len(inputs) == 1 else inputs | "AllTables" >> beam.Flatten().with_output_types(pa.Table)
        return (
            rows
            | "KeyByImpressionShard" >> beam.ParDo(_KeyByShard(self._num_shards, self._column)).with_output_types(
                beam.typehints.Tuple[int, pa.Table])
            | "GroupShards" >> beam.GroupByKey()
            | "ConcatShard" >> beam.Map(_concat).with_output_types(beam.typehints.Tuple[int, pa.Table])
        )
