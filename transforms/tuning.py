"""The Beam backend of the tuning workflow (``araopt.optimize.workflow``): on a history grouped by
impression, its statistics, ``choose`` on them once (Alg. 5 and whatever the job decides), and the
calibration of the candidates ``choose`` returns, on the same grouped shards (one read, one shuffle).
The steps are the in-memory backend's combiners (``StatisticsFromShards``, ``ComputeCalibration``)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import apache_beam as beam

from araopt.optimize.statistics import StatisticsSpec, SufficientStatistics
from araopt.version import ParameterVersion

from .calibration import ComputeCalibration
from .statistics import StatisticsFromShards

ChooseWithSides = Callable[..., tuple[Any, tuple[ParameterVersion, ...]]]
"""``choose(statistics, *side_values) -> (result, candidate versions)``: picklable, run once in the job."""


class StatisticsAndCalibration(beam.PTransform):
    """Grouped history shards -> ``{"statistics", "chosen", "calibration"}`` (one element each):
    ``chosen`` is ``choose(statistics, *sides)``'s result, ``calibration`` one ``CalibrationStatistics``
    per candidate version it returned, in its order (None when it returned none). ``sides``: singleton
    side inputs (e.g. the row accounting) and plain values passed on to ``choose``."""

    def __init__(self, spec: StatisticsSpec, choose: ChooseWithSides, *sides: Any):
        super().__init__()
        self._spec = spec
        self._choose = choose
        self._sides = tuple(beam.pvalue.AsSingleton(s) if isinstance(s, beam.PCollection) else s for s in sides)

    def expand(self, grouped: beam.PCollection) -> dict[str, beam.PCollection]:
        spec = self._spec
        statistics = grouped | "Statistics" >> StatisticsFromShards(spec)
        decision = statistics | "Choose" >> beam.Map(_call, self._choose, *self._sides)
        candidates = decision | "Candidates" >> beam.Map(lambda d: d[1])
        calibration = grouped | "Calibration" >> ComputeCalibration(candidates, spec.slice_columns, spec.value_columns)
        return {"statistics": statistics, "chosen": decision | "Chosen" >> beam.Map(lambda d: d[0]),
                "calibration": calibration}


def _call(statistics: SufficientStatistics, choose: ChooseWithSides, *sides: Any
          ) -> tuple[Any, tuple[ParameterVersion, ...]]:
    return choose(statistics, *sides)
