"""Encode + cap per shard, a pure integer combine over the declared domain, then the release step
(noise once per key) in a single-element step. Thin Beam wrappers over ``araopt.mechanism.aggregate`` and
``araopt.mechanism.release``; the domain travels as a singleton side input (declared, or — simulation only —
derived from the data by ``DomainFromData``).
"""
from __future__ import annotations

import dataclasses
import math
import uuid
from collections.abc import Iterable, Iterator

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.metrics import Metrics
from apache_beam.transforms import trigger, window

from araopt.errors import PrivacyRefusal, Unsupported
from araopt.io.conversions import Conversions, ValidationCounts
from araopt.io.ids import table_id_hash
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

    def __init__(self, params: Params, simulation_seed: int | None, coverage_start_us: int | None,
                 history: ReleaseHistory | None, grouping: str):
        self._params = params
        self._seed = simulation_seed
        self._coverage_start = coverage_start_us
        self._history = history
        self._grouping = grouping

    def setup(self) -> None:
        self._kept = Metrics.counter(NAMESPACE, "conversions_kept")
        self._capped = Metrics.counter(NAMESPACE, "conversions_capped")
        self._outside = Metrics.counter(NAMESPACE, "conversions_kept_outside_domain")

    def process(self, item: tuple[int, pa.Table], domain: KeyDomain) -> Iterator[aggregate.DomainSums]:
        _, table = item
        params = self._params
        conv = Conversions.from_table(table, params.slice_columns, params.query_columns, categorical_slices=True)
        sums = dataclasses.replace(shard_sums(conv, params, domain, self._seed, self._history, self._coverage_start),
                                   grouping=self._grouping)
        self._kept.inc(sums.kept)
        self._capped.inc(sums.capped)
        self._outside.inc(sums.outside_domain)
        yield sums


def shard_modulus(item: tuple[int, pa.Table]) -> tuple[int, int]:
    """(shard key, the gcd of its rows' id hash minus the key): a shard of ``GroupByImpression(N)`` holds
    every impression whose canonical id hash is the key modulo N, so N divides the gcd. 1 when a hash
    lies below the key (no modulus above the key has it); 0: no row constrains it. A key that is no
    shard number (an integer in [0, 2^63)) is refused."""
    key, table = item
    if isinstance(key, bool) or not isinstance(key, (int, np.integer)) or not 0 <= int(key) < 2**63:
        raise PrivacyRefusal(f"a shard key is GroupByImpression's shard number, an integer in [0, 2^63), got {key!r}")
    if table.num_rows == 0:
        return int(key), 0
    hashed = table_id_hash(table)
    if bool(np.any(hashed < np.uint64(key))):
        return int(key), 1
    return int(key), int(np.gcd.reduce(hashed - np.uint64(key)))


class CompleteImpressions(beam.CombineFn):
    """Whether the shards can be ``GroupByImpression``'s: distinct keys, and one modulus above every key
    that each shard's id hashes meet (the gcd of theirs, ``shard_modulus``). Alg. 1 caps an impression
    within its shard: an impression split over two shards would keep its budget once in each."""

    def create_accumulator(self) -> tuple[list[int], int]:
        return [], 0

    def add_input(self, acc: tuple[list[int], int], item: tuple[int, int]) -> tuple[list[int], int]:
        return [*acc[0], item[0]], math.gcd(acc[1], item[1])

    def merge_accumulators(self, accs: Iterable[tuple[list[int], int]]) -> tuple[list[int], int]:
        keys: list[int] = []
        modulus = 0
        for k, g in accs:
            keys += k
            modulus = math.gcd(modulus, g)
        return keys, modulus

    def extract_output(self, acc: tuple[list[int], int]) -> str | None:
        keys, modulus = acc
        if len(set(keys)) != len(keys):
            return (f"{len(keys) - len(set(keys))} shard key(s) occur more than once: the shards were not grouped by "
                    f"impression (GroupByImpression, or ReadAndValidate(num_shards=...))")
        if keys and modulus != 0 and modulus <= max(keys):
            return ("the shards' rows are not sharded by their impression's id hash (GroupByImpression, or "
                    "ReadAndValidate(num_shards=...)): an impression may lie in two shards")
        return None


def _complete(sums: aggregate.DomainSums | None, problem: str | None) -> aggregate.DomainSums | None:
    if problem is not None:
        raise PrivacyRefusal(f"Alg. 1 caps each impression within its shard, so a shard must hold all of an "
                             f"impression's conversions: {problem}")
    return sums


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
        grouping = uuid.uuid4().hex  # this application's grouping: its sums merge with no other's (the same
        # transform applied twice, to two halves of the rows, makes two)
        problem = (shards | "ShardModulus" >> beam.Map(shard_modulus)
                   | "CompleteImpressions" >> beam.CombineGlobally(CompleteImpressions()))
        return (
            shards
            | "EncodeAndBound" >> beam.ParDo(_EncodeAndBound(self._params, self._seed, self._coverage_start, self._history,
                                                             grouping), beam.pvalue.AsSingleton(self._domain))
            | "SumPerKey" >> beam.CombineGlobally(CombinerFn(aggregate.DomainSumsCombiner()))
            | "OnlyWholeImpressions" >> beam.Map(_complete, beam.pvalue.AsSingleton(problem))
        )


class _AddNoise(beam.DoFn):
    """Runs once, on one impulse, with the combined sums as a side input: the release step
    (``araopt.mechanism.release.release_step``) on the one element, refused for any other number, so
    sums flattened from two branches are not each noised (averaging two noisings halves the noise)."""

    def __init__(self, params: Params, simulation_seed: int | None, max_rejected_fraction: float):
        self._params = params
        self._seed = simulation_seed
        self._max_rejected = max_rejected_fraction

    def process(self, _: None, merged: list[aggregate.DomainSums | None], counts: ValidationCounts, domain: KeyDomain,
                lookback_counts: ValidationCounts | None = None) -> Iterator[Release]:
        if len(merged) != 1:  # (the sums themselves are unnoised: never in a message)
            raise PrivacyRefusal(f"NoisyRelease noises one merged element (EncodeBoundAndSum's combine), got "
                                 f"{len(merged)}: a graph that flattens sums would release every key more than once")
        sums = merged[0]
        if sums is not None and sums.grouping is None:  # capped by hand: no step checked its shards
            raise PrivacyRefusal("NoisyRelease releases the sums of EncodeBoundAndSum only (one grouping by "
                                 "impression whose shards were checked): these were capped outside it")
        release = release_step(sums, counts, self._params, domain, simulation_seed=self._seed,
                               max_rejected_fraction=self._max_rejected, lookback_counts=lookback_counts)
        Metrics.counter(NAMESPACE, "keys_released").inc(domain.num_keys)
        yield release


@beam.typehints.with_input_types(beam.typehints.Optional[aggregate.DomainSums])
@beam.typehints.with_output_types(Release)
class NoisyRelease(beam.PTransform):
    """Merged sums -> one ``Release`` (noise exactly once per domain key, after the combine). The merged
    sums must be one element (``EncodeBoundAndSum``'s combine): more is refused when the step runs."""

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
        side = [beam.pvalue.AsList(merged), beam.pvalue.AsSingleton(self._counts),
                beam.pvalue.AsSingleton(self._domain)]
        if self._lookback_counts is not None:
            side.append(beam.pvalue.AsSingleton(self._lookback_counts))
        return (merged.pipeline | "Once" >> beam.Create([None])
                | "AddNoiseOncePerKey" >> beam.ParDo(_AddNoise(self._params, self._seed, self._max_rejected), *side))


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
