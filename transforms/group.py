"""Group conversions by impression, batched: shard record batches by a stable hash of the impression
id, GroupByKey on the shard, and concatenate; every output table holds all conversions of each of
its impressions (however they were spread over files and batches), so Alg. 1 can run per table.
"""
from __future__ import annotations

import apache_beam as beam
import numpy as np
import pandas as pd
import pyarrow as pa

from araopt.conversions import IMPRESSION_ID


def shard_of(impression_ids: np.ndarray, num_shards: int) -> np.ndarray:
    """Stable across processes and machines (pandas' fixed-key SipHash), in [0, num_shards)."""
    ids = np.asarray(impression_ids)
    ids = ids.astype(np.int64) if ids.dtype.kind in "iu" else ids.astype(object)
    hashed = pd.util.hash_array(ids)
    return (hashed % np.uint64(num_shards)).astype(np.int64)


class _KeyByShard(beam.DoFn):
    def __init__(self, num_shards: int):
        self._num_shards = num_shards

    def process(self, table: pa.Table):
        ids = table.column(IMPRESSION_ID).to_numpy(zero_copy_only=False)
        shards = shard_of(ids, self._num_shards)
        order = np.argsort(shards, kind="stable")
        sorted_shards = shards[order]
        bounds = np.flatnonzero(np.diff(sorted_shards)) + 1
        starts = np.concatenate([[0], bounds])
        stops = np.concatenate([bounds, [len(order)]])
        for start, stop in zip(starts, stops):
            if stop > start:
                # take() copies the shard's rows; a slice() would share (and pickle) the whole batch
                yield int(sorted_shards[start]), table.take(pa.array(order[start:stop]))


def _concat(item):
    shard, tables = item
    tables = list(tables)
    return shard, pa.concat_tables(tables, promote_options="default") if len(tables) > 1 else tables[0]


class GroupByImpression(beam.PTransform):
    """PCollection[pa.Table] -> PCollection[(shard, pa.Table)] of complete impressions."""

    def __init__(self, num_shards: int):
        super().__init__()
        if num_shards < 1:
            raise ValueError(f"num_shards must be >= 1, got {num_shards}")
        self._num_shards = num_shards

    def expand(self, tables):
        return (
            tables
            | "KeyByImpressionShard" >> beam.ParDo(_KeyByShard(self._num_shards))
            | "GroupShards" >> beam.GroupByKey()
            | "ConcatShard" >> beam.Map(_concat)
        )
