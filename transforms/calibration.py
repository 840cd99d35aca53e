"""Calibration side pipeline: shards of complete impressions -> ``CalibrationStatistics`` for the chosen
parameters (a singleton side input), with the pure combiner of ``araopt.calibration`` wrapped in one
thin ``beam.CombineFn``. Blocks are impression days when the log has ``impression_time``, else
disjoint random parts of the window (``araopt.calibration.history_blocks``)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import apache_beam as beam
import pyarrow as pa

from araopt import calibration
from araopt.conversions import Conversions
from araopt.params import Params


class _AddCalibration(beam.DoFn):
    """Per shard: what ContributionCapping (Alg. 1) keeps of every (impression, slice, block) under the params."""

    def __init__(self, slice_columns: Sequence[str], value_columns: Sequence[str]):
        self._slices = tuple(slice_columns)
        self._values = tuple(value_columns)

    def process(self, item: tuple[int, pa.Table], params: Params):
        table = item[1]
        conv = Conversions.from_table(table, self._slices, self._values)
        times = None
        if calibration.IMPRESSION_TIME in table.column_names:
            column = table.column(calibration.IMPRESSION_TIME)
            times = column.cast(pa.int64()).to_numpy(zero_copy_only=False) if column.null_count == 0 else None
        acc = calibration.create_accumulator(params, self._slices)
        yield calibration.add_conversions(acc, conv, calibration.history_blocks(conv, times))


class CalibrationCombineFn(beam.CombineFn):
    """Thin wrapper: every method delegates to the pure combiner in ``araopt.calibration``."""

    def create_accumulator(self) -> Any:
        return None

    def add_input(self, acc: Any, part: Any) -> Any:
        return part if acc is None else calibration.merge_accumulators([acc, part])

    def merge_accumulators(self, accs: Any) -> Any:
        parts = [a for a in accs if a is not None]
        return calibration.merge_accumulators(parts) if parts else None

    def compact(self, acc: Any) -> Any:
        return acc if acc is None else calibration.compact(acc)

    def extract_output(self, acc: Any) -> Any:
        return None if acc is None else calibration.extract_output(acc)


class ComputeCalibration(beam.PTransform):
    """(shard, table of complete impressions) -> one ``CalibrationStatistics`` for ``params`` (a
    singleton PCollection of ``Params``: the parameters are often chosen inside the same pipeline)."""

    def __init__(self, params: beam.PCollection, slice_columns: Sequence[str], value_columns: Sequence[str]):
        super().__init__()
        self._params = params
        self._slices = tuple(slice_columns)
        self._values = tuple(value_columns)

    def expand(self, shards: beam.PCollection) -> beam.PCollection:
        return (
            shards
            | "AddCalibration" >> beam.ParDo(_AddCalibration(self._slices, self._values),
                                             beam.pvalue.AsSingleton(self._params))
            | "MergeCalibration" >> beam.CombineGlobally(CalibrationCombineFn())
        )
