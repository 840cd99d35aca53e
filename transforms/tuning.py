"""The Beam backend of the tuning workflow (``araopt.optimize.workflow``): on a history grouped by
impression, its statistics, ``choose`` on them once (Alg. 5 and whatever the job decides), and the
calibration of the candidates ``choose`` returns, on the same grouped shards (one read, one shuffle).
The steps are the in-memory backend's combiners (``StatisticsFromShards``, ``ComputeCalibration``).
``build_history`` is ``optimize``'s job over it (run to the driver as the workflow's backend:
``pipelines.history.BeamBackend``); ``build_nightly`` is ``nightly``'s: the window read and grouped, the
decision (``araopt.nightly.nightly_decision``: the search of ``nightly_tuning``, the guardrails) and the
last single-element step (``araopt.nightly.close_night``: ``nightly_tuning``'s conclusion, reported,
published inside the job, as a Dataflow Flex Template launcher needs)."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import apache_beam as beam

from araopt.io.conversions import ValidationCounts
from araopt.nightly import NightlyConfig, NightlyDecision, close_night, nightly_decision
from araopt.optimize.statistics import StatisticsSpec, SufficientStatistics
from araopt.optimize.workflow import gated_choice
from araopt.version import ParameterVersion

from .calibration import ComputeCalibration
from .statistics import StatisticsFromShards
from .validate import ReadAndValidate

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


def _decide(statistics: SufficientStatistics, counts: ValidationCounts, config: NightlyConfig,
            previous: ParameterVersion | None) -> tuple[NightlyDecision, tuple[ParameterVersion, ...]]:
    """The single-element decision step: ``araopt.nightly.nightly_decision`` (gate, tune, guardrails),
    and the candidate versions to calibrate."""
    decision = nightly_decision(statistics, counts, config, previous)
    return decision, tuple(v for v, _ in decision.tuning.candidates)


class _CalibrateReportAndPublish(beam.DoFn):
    """The single-element publish step: ``araopt.nightly.close_night`` (the parameters with the window's
    calibration attached, the run report, the publish only if the decision says so)."""

    def __init__(self, config: NightlyConfig, previous: ParameterVersion | None, expected_previous: str | None):
        self._config = config
        self._previous = previous
        self._expected_previous = expected_previous

    def setup(self):
        from araopt.io.stores import open_store

        self._store = open_store(self._config.store)

    def process(self, decision: NightlyDecision, calibration_statistics, counts: ValidationCounts):
        yield close_night(decision, calibration_statistics, counts, self._config, self._previous, self._expected_previous,
                          self._store)


def build_nightly(pipeline: beam.Pipeline, paths: Sequence[str], lookback_paths: Sequence[str], spec: StatisticsSpec,
                  config: NightlyConfig, previous: ParameterVersion | None, expected_previous: str | None,
                  num_shards: int, shuffle_dir: str | None) -> None:
    """``nightly``'s one job: the window's files (and the lookback's, for lifetime ranks) validated and
    grouped by impression once, the statistics, the decision (gate, Alg. 5, guardrails) and the
    calibration of its candidates, then the single-element step that calibrates, reports and publishes."""
    read = pipeline | "ReadWindow" >> ReadAndValidate(paths, spec.slice_columns, spec.value_columns,
                                                      num_shards=num_shards, spill_dir=shuffle_dir,
                                                      lookback_paths=lookback_paths,
                                                      shard_files=True)  # the calibration reads the shards again
    counts = read["counts"]
    tuned = read["grouped"] | "OptimizeAndGuard" >> StatisticsAndCalibration(spec, _decide, counts, config,
                                                                             previous)
    decision, calibration = tuned["chosen"], tuned["calibration"]
    _ = decision | "CalibrateReportAndPublish" >> beam.ParDo(
        _CalibrateReportAndPublish(config, previous, expected_previous),
        beam.pvalue.AsSingleton(calibration), beam.pvalue.AsSingleton(counts))


def build_history(pipeline: beam.Pipeline, paths: Sequence[str], spec: StatisticsSpec, dead_letter: str | None,
                  num_shards: int, shuffle_dir: str | None, one_dead_letter_file: bool,
                  lookback_paths: Sequence[str] = (), choose: Callable[..., Any] | None = None,
                  max_rejected_fraction: float = 0.10) -> dict[str, beam.PCollection]:
    """``optimize``'s job over a history (``pipelines.history``): read, validate and group by impression
    once -> ``{"counts", "statistics"}``; with ``choose`` the tuning workflow's Beam backend on the same
    grouped shards (``StatisticsAndCalibration`` with ``optimize.workflow.gated_choice``: the rejected
    share gated before ``choose``) -> also ``"chosen"`` and ``"calibration"``."""
    read = pipeline | "ReadHistory" >> ReadAndValidate(paths, spec.slice_columns, spec.value_columns, dead_letter,
                                                        num_shards=num_shards, spill_dir=shuffle_dir,
                                                        one_dead_letter_file=one_dead_letter_file,
                                                        lookback_paths=lookback_paths,
                                                        shard_files=choose is not None)  # read again by the calibration
    if choose is None:
        return {"counts": read["counts"], "statistics": read["grouped"] | "Statistics" >> StatisticsFromShards(spec)}
    tuned = read["grouped"] | "Tune" >> StatisticsAndCalibration(spec, gated_choice, read["counts"], choose,
                                                                 max_rejected_fraction)
    return {"counts": read["counts"], **tuned}
