"""Encode + bound per shard, then a pure integer combine per key, then noise once per key (Alg. 3)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.metrics import Metrics
from apache_beam.transforms import trigger, window

from araopt import aggregate
from araopt.conversions import Conversions
from araopt.keys import KeyDomain
from araopt.mechanism import encode_and_bound
from araopt.params import Params
from araopt.report import Estimates, SummaryReport, reconstruct, summary_report

NAMESPACE = "araopt"


class _EncodeAndBound(beam.DoFn):
    """Per shard of complete impressions: Alg. 2/5 encoding, Alg. 1 bounding, per-slice sums."""

    def __init__(self, params: Params, simulation_seed: int | None):
        self._params = params
        self._seed = simulation_seed

    def setup(self):
        self._kept = Metrics.counter(NAMESPACE, "conversions_kept")
        self._capped = Metrics.counter(NAMESPACE, "conversions_capped")
        self._impressions = Metrics.counter(NAMESPACE, "impressions")

    def process(self, item: tuple[int, pa.Table]):
        _, table = item
        params = self._params
        conv = Conversions.from_table(table, params.slice_columns, params.query_columns)
        contributions, kept = encode_and_bound(conv, params, self._seed)
        sums = aggregate.slice_sums(conv, contributions, kept)
        self._kept.inc(sums.kept)
        self._capped.inc(sums.capped)
        self._impressions.inc(int(len(np.unique(conv.impression_id))))
        yield sums


class SliceSumsCombineFn(beam.CombineFn):
    """Thin Beam wrapper over the pure combiner in ``araopt.aggregate``."""

    def __init__(self, slice_columns: Sequence[str], num_columns: int):
        self._slice_columns = tuple(slice_columns)
        self._num_columns = num_columns

    def create_accumulator(self):
        return aggregate.empty(self._slice_columns, self._num_columns)

    def add_input(self, acc, sums):
        return aggregate.merge([acc, sums])

    def merge_accumulators(self, accs):
        return aggregate.merge(list(accs))

    def compact(self, acc):
        return acc

    def extract_output(self, acc):
        return acc


def check_global_windowing(pcoll) -> None:
    """Refuse windowing/triggers that could fire a key more than once (each firing = fresh noise)."""
    strategy = pcoll.windowing
    if not isinstance(strategy.windowfn, window.GlobalWindows):
        raise ValueError(f"noisy aggregation requires the global window, got {strategy.windowfn!r}")
    if not isinstance(strategy.triggerfn, trigger.DefaultTrigger):
        raise ValueError(f"noisy aggregation requires the default trigger (one firing), got {strategy.triggerfn!r}")


class EncodeBoundAndSum(beam.PTransform):
    """(shard, table of complete impressions) -> one merged ``SliceSums`` (integer, exact)."""

    def __init__(self, params: Params, simulation_seed: int | None = None):
        super().__init__()
        self._params = params
        self._seed = simulation_seed

    def expand(self, shards):
        check_global_windowing(shards)
        return (
            shards
            | "EncodeAndBound" >> beam.ParDo(_EncodeAndBound(self._params, self._seed))
            | "SumPerKey" >> beam.CombineGlobally(SliceSumsCombineFn(self._params.slice_columns, self._params.num_queries + 1))
        )


@dataclass(frozen=True)
class Release:
    """One noisy summary report over the domain, its reconstruction and the record accounting."""

    params: Params
    domain: KeyDomain
    report: SummaryReport
    estimates: Estimates
    rows_read: int
    rows_rejected: int
    rows_kept: int
    rows_capped: int
    rows_outside_domain: int
    slices_outside_domain: int
    simulation_seed: int | None


class _AddNoise(beam.DoFn):
    """Runs once, on the single combined element: lays sums over the domain, adds DLap per key."""

    def __init__(self, params: Params, domain: KeyDomain | None, simulation_seed: int | None, max_rejected_fraction: float):
        self._params = params
        self._domain = domain
        self._seed = simulation_seed
        self._max_rejected = max_rejected_fraction

    def process(self, sums: aggregate.SliceSums, counts: tuple[int, int]):
        params = self._params
        rows_read, rows_rejected = counts
        if rows_read == 0:
            raise ValueError("the input holds no conversion rows: nothing to release")
        if rows_rejected > self._max_rejected * rows_read:
            raise ValueError(
                f"{rows_rejected} of {rows_read} rows ({rows_rejected / rows_read:.1%}) failed validation, above the "
                f"{self._max_rejected:.0%} threshold: refusing to release (see the dead-letter output)"
            )
        domain = self._domain or aggregate.domain_from_sums(
            sums, params.query_columns, params.encoding == "baseline", params.conversion_slice_columns)
        laid = aggregate.histogram(sums, domain)
        report = summary_report(laid.histogram, params.epsilon, params.contribution_budget, simulation_seed=self._seed)
        Metrics.counter(NAMESPACE, "keys_released").inc(int(laid.histogram.size))
        yield Release(params, domain, report, reconstruct(report.noisy, params), rows_read, rows_rejected,
                      sums.kept - laid.rows_outside_domain, sums.capped, laid.rows_outside_domain,
                      laid.slices_outside_domain, self._seed)


class NoisyRelease(beam.PTransform):
    """Merged sums -> ``Release`` (noise exactly once per domain key, after the combine)."""

    def __init__(self, params: Params, counts: Any, domain: KeyDomain | None = None,
                 simulation_seed: int | None = None, max_rejected_fraction: float = 0.10):
        super().__init__()
        self._params = params
        self._counts = counts
        self._domain = domain
        self._seed = simulation_seed
        self._max_rejected = max_rejected_fraction

    def expand(self, merged):
        check_global_windowing(merged)
        return merged | "AddNoiseOncePerKey" >> beam.ParDo(
            _AddNoise(self._params, self._domain, self._seed, self._max_rejected), beam.pvalue.AsSingleton(self._counts))
