"""Statistics side pipeline: history -> validate -> group by impression -> per-slice sufficient
statistics (the pure combiner of ``araopt.statistics``, wrapped in one thin ``beam.CombineFn``)."""
from __future__ import annotations

import os
import pickle
import tempfile
import uuid
from typing import Sequence

import apache_beam as beam
import pyarrow as pa
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import GoogleCloudOptions

from araopt import statistics as stats
from araopt.conversions import Conversions, check_rejected_share

from .group import GroupByImpression
from .io import auto_num_shards, check_input
from .validate import ReadAndValidate

DEFAULT_SHARDS = 64


class StatisticsCombineFn(beam.CombineFn):
    """Thin wrapper: every method delegates to the pure combiner in ``araopt.statistics``."""

    def __init__(self, spec: stats.StatisticsSpec):
        self._spec = spec

    def create_accumulator(self):
        return stats.create_accumulator(self._spec)

    def add_input(self, acc, conversions: Conversions):
        return stats.add_conversions(acc, conversions)

    def merge_accumulators(self, accs):
        return stats.merge_accumulators(list(accs))

    def compact(self, acc):
        return stats.compact(acc)

    def extract_output(self, acc):
        return stats.extract_output(acc)


def _to_conversions(item: tuple[int, pa.Table], slice_columns: Sequence[str], value_columns: Sequence[str]) -> Conversions:
    return Conversions.from_table(item[1], slice_columns, value_columns)


class ComputeStatistics(beam.PTransform):
    """Valid conversion batches -> one ``SufficientStatistics`` (bounded size, see araopt.statistics)."""

    def __init__(self, spec: stats.StatisticsSpec, num_shards: int = DEFAULT_SHARDS, spill_dir: str | None = None):
        super().__init__()
        self._spec = spec
        self._num_shards = num_shards
        self._spill_dir = spill_dir

    def expand(self, valid_tables):
        spec = self._spec
        return (
            valid_tables
            | "GroupByImpression" >> GroupByImpression(self._num_shards, self._spill_dir)
            | "ToConversions" >> beam.Map(_to_conversions, spec.slice_columns, spec.value_columns)
            | "SufficientStatistics" >> beam.CombineGlobally(StatisticsCombineFn(spec))
        )


class _Save(beam.DoFn):
    def __init__(self, path: str):
        self._path = path

    def process(self, element):
        with FileSystems.create(self._path) as fh:
            fh.write(pickle.dumps(element, protocol=pickle.HIGHEST_PROTOCOL))
        yield self._path


def compute_statistics(
    input_pattern: str, spec: stats.StatisticsSpec, pipeline_args: Sequence[str] = (),
    max_rejected_fraction: float = 0.10, num_shards: int | None = None, shuffle: str = "auto",
) -> tuple[stats.SufficientStatistics, dict]:
    """Run the statistics pipeline and return (statistics, accounting) to the driver.

    Refuses (ValueError, before any work) missing files/columns; fails if the rejected share of rows
    exceeds ``max_rejected_fraction`` or no valid row remains.
    """
    from pipelines.options import make_runner, pipeline_options, remove_dir, spill_dir

    files = check_input(input_pattern, spec.slice_columns, spec.value_columns)
    num_shards = num_shards or auto_num_shards(files.rows)
    opts = pipeline_options(list(pipeline_args))
    shuffle_dir = spill_dir(opts, shuffle)
    temp_root = opts.view_as(GoogleCloudOptions).temp_location or tempfile.gettempdir()
    run_dir = FileSystems.join(temp_root, f"araopt-statistics-{uuid.uuid4().hex}")
    stats_path = FileSystems.join(run_dir, "statistics.pkl")
    counts_path = FileSystems.join(run_dir, "counts.pkl")
    if "://" not in run_dir:
        os.makedirs(run_dir, exist_ok=True)
    pipeline = beam.Pipeline(runner=make_runner(opts), options=opts)
    read = pipeline | "ReadHistory" >> ReadAndValidate(files.paths, spec.slice_columns, spec.value_columns)
    _ = read["counts"] | "SaveCounts" >> beam.ParDo(_Save(counts_path))
    _ = (read["valid"] | "Statistics" >> ComputeStatistics(spec, num_shards, shuffle_dir)
         | "SaveStatistics" >> beam.ParDo(_Save(stats_path)))
    try:
        result = pipeline.run()
        result.wait_until_finish()
    finally:
        remove_dir(shuffle_dir)
    with FileSystems.open(counts_path) as fh:
        counts = pickle.loads(fh.read())
    with FileSystems.open(stats_path) as fh:
        statistics = pickle.loads(fh.read())
    FileSystems.delete([run_dir])
    accounting = {"rows_read": counts.rows_read, "rows_rejected": counts.rows_rejected,
                  "rows_rejected_by_reason": dict(counts.rejected_by_reason), "rows_used": counts.rows_valid,
                  "times_floored_to_microseconds": counts.times_floored}
    check_rejected_share(counts, max_rejected_fraction, what="history")
    return statistics, accounting
