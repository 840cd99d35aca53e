"""Calibration side pipeline: shards of complete impressions -> ``CalibrationStatistics`` for each of
the candidate parameters (a singleton side input: a ``Params`` or a tuple of them), with the pure
combiner of ``araopt.calibration`` wrapped in one thin ``beam.CombineFn``. Blocks are the UTC days
of the conversions (``araopt.calibration.day_blocks``): a release covers the conversions of its
days. Lookback rows (``in_period`` False) are capped with the rest and not counted."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import apache_beam as beam
import pyarrow as pa

from araopt import calibration
from araopt.conversions import Conversions
from araopt.params import Params


def _as_tuple(params: Params | Sequence[Params]) -> tuple[Params, ...]:
    return (params,) if isinstance(params, Params) else tuple(params)


class _AddCalibration(beam.DoFn):
    """Per shard: what ContributionCapping (Alg. 1) keeps of every (impression, slice, day) under each params."""

    def __init__(self, slice_columns: Sequence[str], value_columns: Sequence[str]):
        self._slices = tuple(slice_columns)
        self._values = tuple(value_columns)

    def process(self, item: tuple[int, pa.Table], params: Params | Sequence[Params]):
        conv = Conversions.from_table(item[1], self._slices, self._values)
        blocks = calibration.day_blocks(conv)
        yield tuple(calibration.add_conversions(calibration.create_accumulator(p, self._slices), conv, blocks)
                    for p in _as_tuple(params))


class CalibrationCombineFn(beam.CombineFn):
    """Thin wrapper: every method delegates to the pure combiner in ``araopt.calibration`` (one per candidate)."""

    def create_accumulator(self) -> Any:
        return None

    def add_input(self, acc: Any, part: Any) -> Any:
        return part if acc is None else tuple(calibration.merge_accumulators([a, b]) for a, b in zip(acc, part,
                                                                                                    strict=True))

    def merge_accumulators(self, accs: Any) -> Any:
        parts = [a for a in accs if a is not None]
        if not parts:
            return None
        return tuple(calibration.merge_accumulators(list(group)) for group in zip(*parts, strict=True))

    def compact(self, acc: Any) -> Any:
        return acc if acc is None else tuple(calibration.compact(a) for a in acc)

    def extract_output(self, acc: Any) -> Any:
        return None if acc is None else tuple(calibration.extract_output(a) for a in acc)


class ComputeCalibration(beam.PTransform):
    """(shard, table of complete impressions) -> one tuple of ``CalibrationStatistics``, one per candidate
    of ``params`` (a singleton PCollection of ``Params`` or of a tuple of them: the parameters are often
    chosen inside the same pipeline)."""

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
