"""Encode + cap per shard, a pure integer combine over the declared domain, then the release step
(noise once per key) in a single-element step. Thin Beam wrappers over ``araopt.mechanism.aggregate`` and
``araopt.mechanism.release``; the domain travels as a singleton side input (declared, or — simulation only —
derived from the data by ``DomainFromData``).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import apache_beam as beam
import pandas as pd
import pyarrow as pa
from apache_beam.metrics import Metrics
from apache_beam.transforms import trigger, window

from araopt.errors import Unsupported
from araopt.io.conversions import Conversions, ValidationCounts, check_rejected_share, concat_periods, split_periods
from araopt.mechanism import aggregate
from araopt.mechanism.keys import KeyDomain
from araopt.mechanism.lifetime import ReleaseHistory
from araopt.mechanism.measure import encode_and_bound, histogram_rows
from araopt.mechanism.params import Encoding, Params
from araopt.mechanism.release import Accounting, Release, histogram_height, noisy_release

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
    """Per shard of complete impressions: encoding (Alg. 3 / Alg. 6), capping (Alg. 1) over the
    period's rows and their lookback, per-key sums of the period's rows."""

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
        lookback_rows = 0
        if conv.in_period is not None:  # lookback rows of impressions without a period row cannot change anything
            lookback_rows = int((~conv.period_mask()).sum())
            conv = concat_periods(*split_periods(conv))
        contributions, kept = encode_and_bound(conv, params, self._seed, history=self._history)
        period = conv.period_mask()
        sums = aggregate.domain_sums(histogram_rows(conv, params, domain), contributions, kept,
                                     histogram_height(params, domain),
                                     impressions=len(pd.unique(conv.impression_sort_keys()[period])), in_period=period,
                                     rows_before_lookback=rows_before_coverage(conv, self._coverage_start))
        if conv.in_period is not None:
            sums = dataclasses.replace(sums, lookback_rows=lookback_rows)
        self._kept.inc(sums.kept)
        self._capped.inc(sums.capped)
        self._outside.inc(sums.outside_domain)
        yield sums


def rows_before_coverage(conversions: Conversions, coverage_start_us: int | None) -> int:
    """Period rows of impressions shown before ``coverage_start_us`` (the earliest conversion the job
    reads): their earlier conversions may be missing. 0 when impression times are unknown."""
    if coverage_start_us is None or conversions.impression_time is None:
        return 0
    return int((conversions.period_mask() & (conversions.impression_time < coverage_start_us)).sum())


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
    """Runs once, on the single combined element: the release step of ``araopt.mechanism.release``."""

    def __init__(self, params: Params, simulation_seed: int | None, max_rejected_fraction: float):
        self._params = params
        self._seed = simulation_seed
        self._max_rejected = max_rejected_fraction

    def process(self, sums: aggregate.DomainSums | None, counts: ValidationCounts, domain: KeyDomain,
                lookback_counts: ValidationCounts | None = None) -> Iterator[Release]:
        check_rejected_share(counts, self._max_rejected)
        if sums is None:  # every valid row was in shards that produced nothing: cannot happen with rows > 0
            sums = aggregate.empty(histogram_height(self._params, domain), domain.num_columns)
        lookback = lookback_counts or ValidationCounts()
        accounting = Accounting(counts.rows_read, counts.rows_rejected, sums.kept, sums.capped, sums.outside_domain,
                                sums.impressions, counts.rejected_by_reason, counts.times_floored,
                                lookback.rows_read, lookback.rows_rejected, sums.lookback_rows,
                                sums.rows_before_lookback)
        Metrics.counter(NAMESPACE, "keys_released").inc(domain.num_keys)
        yield noisy_release(sums, self._params, domain, accounting, simulation_seed=self._seed,
                            max_rejected_fraction=self._max_rejected)


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
