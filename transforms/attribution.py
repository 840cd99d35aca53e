"""The W3C Attribution Level 1 measurement on Beam: valid rows -> complete browsers (the privacy unit
is browser instance x conversion site x epoch, so a browser's rows must meet: grouped by a stable hash
of ``browser_id``, not of the impression) -> each shard's browsers simulated (the encoder, the
per-site per-epoch budgets and the safety limits: ``araopt.attribution.measure.simulate_browsers``)
-> unnoised sums per (query, task, histogram index), summed over shards -> the aggregation service's
noise once per index and Alg. 4's estimates (``noisy_release``).

With a simulation seed every draw is keyed by row content or browser id, so the sums do not depend on
how the log is split into files, batches or shards (and equal ``export-attribution``'s event streams
replayed through the reference implementation).
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam
import pandas as pd
import pyarrow as pa

from araopt.attribution.draws import DrawKey
from araopt.attribution.lifetime import AttributionHistory
from araopt.attribution.measure import BrowserSums, data_domain, simulate_browsers, simulated_columns
from araopt.attribution.params import AttributionParams
from araopt.attribution.release import AttributionRelease, release
from araopt.io.conversions import DEFAULT_MAX_REJECTED_FRACTION, ValidationCounts
from araopt.mechanism.keys import KeyDomain
from araopt.mechanism.release import check_declared_domain
from transforms.group import GroupByImpression
from transforms.validate import period_rows


def shard_frame(table: pa.Table, slice_columns: Iterable[str]) -> pd.DataFrame:
    """A shard's valid rows as the core's frame (dictionary-encoded slice values back to plain ones)."""
    rows = table.to_pandas()
    for c in slice_columns:
        if isinstance(rows[c].dtype, pd.CategoricalDtype):
            rows[c] = rows[c].astype(object)
    return rows


class _SimulateShard(beam.DoFn):
    """(shard, table of complete browsers) -> their ``BrowserSums`` (domain as a side input). A shard
    carries its browsers' lookback rows too (``in_period`` False): the conversions earlier releases
    released, simulated again with their parameters (``history``) and the draws of ``key`` (the ledger's)."""

    def __init__(self, params: AttributionParams, simulation_seed: int | None,
                 task_domain: KeyDomain | None = None, key: DrawKey | None = None,
                 history: AttributionHistory | None = None):
        self._params = params
        self._seed = simulation_seed
        self._task_domain = task_domain
        self._key = key
        self._history = history

    def process(self, item: tuple[int, pa.Table], domain: KeyDomain) -> Iterator[BrowserSums]:
        _, table = item
        present = set(table.column_names)  # only what the simulation reads: the others' conversion costs ~10%
        table = table.select([c for c in simulated_columns(self._params) if c in present])
        rows = shard_frame(table, (*self._params.slice_columns, *self._params.conversion_slice_columns))
        sums, _ = simulate_browsers(self._params, rows, domain, task_domain=self._task_domain,
                                    simulation_seed=self._seed, key=self._key, history=self._history)
        yield sums


class _MergeSums(beam.CombineFn):
    """Sums of disjoint browser sets added (exact integers); the identity is no sums at all."""

    def create_accumulator(self) -> list[BrowserSums]:
        return []

    def add_input(self, acc: list[BrowserSums], item: BrowserSums) -> list[BrowserSums]:
        return [BrowserSums.merge([*acc, item])]

    def merge_accumulators(self, accs: Iterable[list[BrowserSums]]) -> list[BrowserSums]:
        parts = [s for acc in accs for s in acc]
        return [BrowserSums.merge(parts)] if parts else []

    def extract_output(self, acc: list[BrowserSums]) -> list[BrowserSums]:
        return acc


class _DistinctSlices(beam.CombineFn):
    """The impression-side slice values present (SIMULATION ONLY: the data-derived layout)."""

    def __init__(self, columns: tuple[str, ...]):
        self._columns = columns

    def create_accumulator(self) -> set[tuple[Any, ...]]:
        return set()

    def add_input(self, acc: set[tuple[Any, ...]], table: pa.Table) -> set[tuple[Any, ...]]:
        frame = shard_frame(table.select(list(self._columns)), self._columns).drop_duplicates()
        acc.update(map(tuple, frame.itertuples(index=False, name=None)))
        return acc

    def merge_accumulators(self, accs: Iterable[set[tuple[Any, ...]]]) -> set[tuple[Any, ...]]:
        out: set[tuple[Any, ...]] = set()
        for acc in accs:
            out |= acc
        return out

    def extract_output(self, acc: set[tuple[Any, ...]]) -> set[tuple[Any, ...]]:
        return acc


def _domain_of(values: set[tuple[Any, ...]], params: AttributionParams, simulation_seed: int | None) -> KeyDomain:
    frame = pd.DataFrame(sorted(values, key=repr), columns=list(params.slice_columns))
    return data_domain(params, frame, simulation_seed)


@beam.typehints.with_input_types(pa.Table)
class MeasureAttribution(beam.PTransform):
    """Valid batches -> one ``AttributionRelease`` (``counts``: the singleton ValidationCounts;
    ``domain``: the declared histogram layout, or None in simulation for the data's). Batches may carry
    lookback rows (``in_period`` False: ``ReadAndValidate(lookback_paths=...)``), grouped with their
    browsers and simulated again before and among the release's own (``araopt.attribution.lifetime``;
    ``history``: the ledger's releases they belong to, None in simulation; ``key``: the ledger's draw key,
    None: the seed's draws, or a fresh key)."""

    def __init__(self, params: AttributionParams, counts: beam.PCollection[ValidationCounts],
                 domain: KeyDomain | None, simulation_seed: int | None, num_shards: int, unit: str,
                 spill_dir: str | None = None, task_domain: KeyDomain | None = None,
                 max_rejected_fraction: float = DEFAULT_MAX_REJECTED_FRACTION, key: DrawKey | None = None,
                 history: AttributionHistory | None = None):
        super().__init__()
        if domain is None and simulation_seed is None:
            data_domain(params, pd.DataFrame(), None)  # refuses: a data-derived layout only in simulation
        if task_domain is not None:  # conversion-side slices of what is released: declared (simulate_release)
            check_declared_domain(task_domain, simulation_seed, "the task domain")
        self._params, self._counts, self._domain, self._seed = params, counts, domain, simulation_seed
        self._num_shards, self._unit, self._spill, self._tasks = num_shards, unit, spill_dir, task_domain
        self._max_rejected = max_rejected_fraction
        self._key, self._history = key, history

    def expand(self, valid: beam.PCollection[pa.Table]) -> beam.PCollection[AttributionRelease]:
        params, seed = self._params, self._seed
        if self._domain is not None:
            domain = valid.pipeline | "DeclaredLayout" >> beam.Create([self._domain])
        else:
            domain = (valid | "PeriodRows" >> beam.Map(period_rows).with_output_types(pa.Table)
                      | "DistinctSlices" >> beam.CombineGlobally(_DistinctSlices(params.slice_columns))
                      | "LayoutFromData" >> beam.Map(_domain_of, params, seed))
        browsers = valid | "GroupByBrowser" >> GroupByImpression(self._num_shards, self._spill, self._unit)
        simulate = _SimulateShard(params, seed, self._tasks, self._key, self._history)
        sums = (browsers | "SimulateBrowsers" >> beam.ParDo(simulate, beam.pvalue.AsSingleton(domain))
                | "SumShards" >> beam.CombineGlobally(_MergeSums()))
        num_tasks = 1 if self._tasks is None else self._tasks.num_slices
        return sums | "Noise" >> beam.Map(release, params, beam.pvalue.AsSingleton(domain),
                                          beam.pvalue.AsSingleton(self._counts), seed, num_tasks,
                                          max_rejected_fraction=self._max_rejected)
