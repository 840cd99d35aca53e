"""Encode + cap per shard, a pure integer combine over the declared domain, then the release step
(noise once per key) in a single-element step. Thin Beam wrappers over ``araopt.mechanism.aggregate`` and
``araopt.mechanism.release``; the domain travels as a singleton side input (declared, or — simulation only —
derived from the data by ``DomainFromData``).
"""
from __future__ import annotations

from collections.abc import Iterator

import apache_beam as beam
import pyarrow as pa
from apache_beam.metrics import Metrics
from apache_beam.transforms import trigger, window

from araopt.errors import Unsupported
from araopt.io.conversions import Conversions, ValidationCounts
from araopt.mechanism import aggregate
from araopt.mechanism.keys import KeyDomain
from araopt.mechanism.lifetime import ReleaseHistory
from araopt.mechanism.measure import shard_sums
from araopt.mechanism.params import Encoding, Params
from araopt.mechanism.release import Release, release_step

from .combine import CombinerFn

NAMESPACE = "araopt"


def check_global_windowing(pcoll: beam.PCollection) -> None:
    """Refuse windowing/triggers that could fire a key more than once (each firing = fresh noise)."""
    strategy = pcoll.windowing
    if not isinstance(strategy.windowfn, window.GlobalWindows):
        raise Unsupported(f"noisy aggregation requires the global window, got {strategy.windowfn!r}")
    if not isinstance(strategy.triggerfn, trigger.DefaultTrigger):
        raise Unsupported(f"noisy aggregation requires the default trigger (one firing), got {strategy.triggerfn!r}")


class _EncodeAndBound(beam.DoFn):
    """Per shard of complete impressions: the release workflow's distributed step
    (``araopt.mechanism.measure.shard_sums``: encode, cap, per-key sums), with counters."""

    def __init__(self, params: Params, simulation_seed: int | None, coverage_start_us: int | None = None,
                 history: ReleaseHistory | None = None):
        self._params = params
        self._seed = simulation_seed
        self._coverage_start = coverage_start_us
        self._history = history

    def setup(self) -> None:
        self._kept = Metrics.counter(NAMESPACE, "conversions_kept")
        self._capped = Metrics.counter(NAMESPACE, "conversions_capped")
        self._outside = Metrics.counter(NAMESPACE, "conversions_kept_outside_domain")

    def process(self, item: tuple[int, pa.Table], domain: KeyDomain) -> Iterator[aggregate.DomainSums]:
        _, table = item
        params = self._params
        conv = Conversions.from_table(table, params.slice_columns, params.query_columns, categorical_slices=True)
        sums = shard_sums(conv, params, domain, self._seed, self._history, self._coverage_start)
        self._kept.inc(sums.kept)
        self._capped.inc(sums.capped)
        self._outside.inc(sums.outside_domain)
        yield sums


@beam.typehints.with_input_types(beam.typehints.Tuple[int, pa.Table])
@beam.typehints.with_output_types(beam.typehints.Optional[aggregate.DomainSums])
class EncodeBoundAndSum(beam.PTransform):
    """(shard, table of complete impressions) -> one merged ``DomainSums`` over the domain side input.
    ``history``: the earlier releases whose configurations cost the lookback rows (Alg. 1 over the
    impression's life, ``araopt.mechanism.lifetime``)."""

    def __init__(self, params: Params, domain: beam.PCollection, simulation_seed: int | None = None,
                 coverage_start_us: int | None = None, history: ReleaseHistory | None = None):
        super().__init__()
        self._params = params
        self._domain = domain
        self._seed = simulation_seed
        self._coverage_start = coverage_start_us
        self._history = history

    def expand(self, shards: beam.PCollection[tuple[int, pa.Table]]) -> beam.PCollection[aggregate.DomainSums | None]:
        check_global_windowing(shards)
        return (
            shards
            | "EncodeAndBound" >> beam.ParDo(_EncodeAndBound(self._params, self._seed, self._coverage_start, self._history),
                                             beam.pvalue.AsSingleton(self._domain))
            | "SumPerKey" >> beam.CombineGlobally(CombinerFn(aggregate.DomainSumsCombiner()))
        )


class _AddNoise(beam.DoFn):
    """Runs once, on the single combined element: the release step (``araopt.mechanism.release.release_step``)."""

    def __init__(self, params: Params, simulation_seed: int | None, max_rejected_fraction: float):
        self._params = params
        self._seed = simulation_seed
        self._max_rejected = max_rejected_fraction

    def process(self, sums: aggregate.DomainSums | None, counts: ValidationCounts, domain: KeyDomain,
                lookback_counts: ValidationCounts | None = None) -> Iterator[Release]:
        release = release_step(sums, counts, self._params, domain, simulation_seed=self._seed,
                               max_rejected_fraction=self._max_rejected, lookback_counts=lookback_counts)
        Metrics.counter(NAMESPACE, "keys_released").inc(domain.num_keys)
        yield release


@beam.typehints.with_input_types(beam.typehints.Optional[aggregate.DomainSums])
@beam.typehints.with_output_types(Release)
class NoisyRelease(beam.PTransform):
    """Merged sums -> one ``Release`` (noise exactly once per domain key, after the combine)."""

    def __init__(self, params: Params, counts: beam.PCollection, domain: beam.PCollection,
                 simulation_seed: int | None = None, max_rejected_fraction: float = 0.10,
                 lookback_counts: beam.PCollection | None = None):
        super().__init__()
        self._params = params
        self._counts = counts
        self._domain = domain
        self._seed = simulation_seed
        self._max_rejected = max_rejected_fraction
        self._lookback_counts = lookback_counts

    def expand(self, merged: beam.PCollection[aggregate.DomainSums | None]) -> beam.PCollection[Release]:
        check_global_windowing(merged)
        side = [beam.pvalue.AsSingleton(self._counts), beam.pvalue.AsSingleton(self._domain)]
        if self._lookback_counts is not None:
            side.append(beam.pvalue.AsSingleton(self._lookback_counts))
        return merged | "AddNoiseOncePerKey" >> beam.ParDo(_AddNoise(self._params, self._seed, self._max_rejected), *side)


@beam.typehints.with_input_types(pa.Table)
@beam.typehints.with_output_types(KeyDomain)
class DomainFromData(beam.PTransform):
    """SIMULATION ONLY: valid batches -> singleton ``KeyDomain`` of the slices present (at most ``max_slices``)."""

    def __init__(self, params: Params, max_slices: int):
        super().__init__()
        self._params = params
        self._max_slices = max_slices

    def expand(self, batches: beam.PCollection[pa.Table]) -> beam.PCollection[KeyDomain]:
        params = self._params
        return (
            batches
            | "SliceColumns" >> beam.Map(lambda table: {c: table.column(c).to_numpy(zero_copy_only=False)
                                                       for c in params.slice_columns})
            | "DistinctSlices" >> beam.CombineGlobally(
                CombinerFn(aggregate.SliceSetCombiner(params.slice_columns, self._max_slices)))
            | "ToDomain" >> beam.Map(lambda s: aggregate.domain_of(
                s if s is not None else aggregate.slice_set({c: [] for c in params.slice_columns}, params.slice_columns, 1),
                params.query_columns, params.encoding == Encoding.BASELINE, params.conversion_slice_columns))
        )


__all__ = ["DomainFromData", "EncodeBoundAndSum", "NoisyRelease", "Release", "check_global_windowing"]
