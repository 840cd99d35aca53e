"""Calibration side pipeline: shards of complete impressions -> ``CalibrationStatistics`` for each of
the candidate parameter versions (a singleton side input: a ``ParameterVersion`` or a tuple of them),
with the pure combiner of ``araopt.calibration.model.accumulator`` in the one generic ``CombineFn``
(``transforms.combine``). Blocks are the UTC days of the conversions (``accumulator.day_blocks``): a
release covers the conversions of its days. Lookback rows (``in_period`` False) are capped with the
rest and not counted."""
from __future__ import annotations

from collections.abc import Iterator, Sequence

import apache_beam as beam
import pyarrow as pa

from araopt.calibration.accumulator import CalibrationAccumulator, CandidatesCombiner, accumulate_candidates
from araopt.io.conversions import Conversions
from araopt.version import ParameterVersion

from .combine import CombinerFn
from .group import ShardFiles, shard_table


def _as_tuple(versions: ParameterVersion | Sequence[ParameterVersion]) -> tuple[ParameterVersion, ...]:
    return (versions,) if isinstance(versions, ParameterVersion) else tuple(versions)


class _AddCalibration(beam.DoFn):
    """Per shard: what ContributionCapping (Alg. 1) keeps of every (impression, slice, day) under each candidate."""

    def __init__(self, slice_columns: Sequence[str], value_columns: Sequence[str]):
        self._slices = tuple(slice_columns)
        self._values = tuple(value_columns)

    def process(self, item: tuple[int, pa.Table | ShardFiles], versions: ParameterVersion | Sequence[ParameterVersion]
                ) -> Iterator[tuple[CalibrationAccumulator, ...]]:
        conv = Conversions.from_table(shard_table(item[1]), self._slices, self._values, categorical_slices=True)
        yield accumulate_candidates(conv, [(v.params, v.checksum()) for v in _as_tuple(versions)], self._slices)


class ComputeCalibration(beam.PTransform):
    """(shard, table of complete impressions) -> one tuple of ``CalibrationStatistics``, one per candidate
    of ``versions`` (a singleton PCollection of a ``ParameterVersion`` or of a tuple of them: the
    candidates are often chosen inside the same pipeline)."""

    def __init__(self, versions: beam.PCollection, slice_columns: Sequence[str], value_columns: Sequence[str]):
        super().__init__()
        self._versions = versions
        self._slices = tuple(slice_columns)
        self._values = tuple(value_columns)

    def expand(self, shards: beam.PCollection) -> beam.PCollection:
        return (
            shards
            | "AddCalibration" >> beam.ParDo(_AddCalibration(self._slices, self._values),
                                             beam.pvalue.AsSingleton(self._versions))
            | "MergeCalibration" >> beam.CombineGlobally(CombinerFn(CandidatesCombiner()))
        )
