"""Statistics side pipeline: valid batches -> group by impression -> per-slice sufficient statistics
(the pure combiner of ``araopt.optimize.statistics`` in the one generic ``CombineFn``, ``transforms.combine``). The job that
runs it is ``pipelines.history.compute_statistics``."""
from __future__ import annotations

import pickle
from collections.abc import Iterator, Sequence
from typing import Any

import apache_beam as beam
import pyarrow as pa
from apache_beam.io.filesystems import FileSystems

from araopt.io.conversions import Conversions
from araopt.optimize import statistics as stats

from .combine import CombinerFn
from .group import GroupByImpression, ShardFiles, shard_table

DEFAULT_SHARDS = 64


def _to_conversions(item: tuple[int, pa.Table | ShardFiles], slice_columns: Sequence[str],
                    value_columns: Sequence[str]) -> Conversions:
    return Conversions.from_table(shard_table(item[1]), slice_columns, value_columns, categorical_slices=True)


class _ShardStatistics(stats.StatisticsCombiner):
    """``StatisticsCombiner`` whose inputs are grouped shards ((shard, rows or their spill files)): each is
    read and converted inside ``add``. A separate step would hand the ``Conversions`` to the combine
    through Beam's pickling (all the window's rows, pickled and read back: a fifth of nightly's CPU)."""

    def add(self, acc: stats.StatisticsAccumulator, item: Any) -> stats.StatisticsAccumulator:
        return super().add(acc, _to_conversions(item, self.spec.slice_columns, self.spec.value_columns))


@beam.typehints.with_input_types(pa.Table)
@beam.typehints.with_output_types(stats.SufficientStatistics)
class ComputeStatistics(beam.PTransform):
    """Valid conversion batches -> one ``SufficientStatistics`` (bounded size, see araopt.statistics)."""

    def __init__(self, spec: stats.StatisticsSpec, num_shards: int = DEFAULT_SHARDS, spill_dir: str | None = None):
        super().__init__()
        self._spec = spec
        self._num_shards = num_shards
        self._spill_dir = spill_dir

    def expand(self, valid_tables: beam.PCollection[pa.Table]) -> beam.PCollection[stats.SufficientStatistics]:
        return (
            valid_tables
            | "GroupByImpression" >> GroupByImpression(self._num_shards, self._spill_dir)
            | "FromShards" >> StatisticsFromShards(self._spec)
        )


class StatisticsFromShards(beam.PTransform):
    """(shard, table of complete impressions) -> one ``SufficientStatistics`` (for pipelines that also
    use the grouped shards for something else, e.g. the calibration)."""

    def __init__(self, spec: stats.StatisticsSpec):
        super().__init__()
        self._spec = spec

    def expand(self, shards):
        spec = self._spec
        return shards | "SufficientStatistics" >> beam.CombineGlobally(CombinerFn(_ShardStatistics(spec)))


class SaveElement(beam.DoFn):
    """Pickle the (single) element to ``path``: how a job hands a small result back to its driver."""

    def __init__(self, path: str):
        self._path = path

    def process(self, element: Any) -> Iterator[str]:
        with FileSystems.create(self._path) as fh:
            fh.write(pickle.dumps(element, protocol=pickle.HIGHEST_PROTOCOL))
        yield self._path
