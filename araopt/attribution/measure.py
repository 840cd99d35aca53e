"""One Attribution Level 1 measurement in memory: conversion-log rows -> the browsers' reports ->
the aggregation service's noisy histograms -> estimates of the true totals (Alg. 4) with their noise
intervals.

Randomness: without ``simulation_seed`` everything (value rounding, each browser's epoch start, the
noise) comes from the secure generator. With it, value rounding is keyed by each row's content and a
browser's epoch start by its id (``keyed_uniforms``: the same row or browser gets the same draw in any
partition and in ``export``), and the noise by the seed; rows are taken in the order of their content
hash, so ties between a browser's events do not depend on how the log was split.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from araopt.attribution.config import DAY_MS, BrowserConfig
from araopt.attribution.encoder import CONVERSION_TIME_US, Schedule, browser_config, encode, schedule, to_case
from araopt.attribution.lifetime import ChargedWindow
from araopt.attribution.params import AttributionParams
from araopt.attribution.reconstruct import Estimate, aggregate, reconstruct
from araopt.attribution.simulate import Reports, report_sums, simulate_schedule
from araopt.errors import InvalidInput, PrivacyRefusal
from araopt.io.conversions import BROWSER_ID, CONVERSION_SITE, IMPRESSION_ID, IMPRESSION_SITE, IMPRESSION_TIME_US
from araopt.mechanism.keys import KeyDomain
from araopt.mechanism.randomness import Simulation, keyed_uniforms, secure_generator
from araopt.mechanism.release import check_declared_domain

EPOCH_START_STREAM = 1 << 20
"""The keyed-uniform stream of the browsers' epoch starts (value rounding uses streams 0..queries-1)."""


def row_keys(params: AttributionParams, rows: pd.DataFrame) -> np.ndarray:
    """A 64-bit content hash per row (impression, browser, conversion time, values, slices)."""
    columns = [c for c in (IMPRESSION_ID, BROWSER_ID, CONVERSION_TIME_US, *params.value_columns, *params.slice_columns,
                           *params.conversion_slice_columns) if c in rows]
    return pd.util.hash_pandas_object(rows[columns], index=False).to_numpy(dtype=np.uint64)


def browser_keys(ids: np.ndarray) -> np.ndarray:
    """A 64-bit hash per browser id: pandas' hash of the id as an object (an integer id hashes as its
    decimal string, so integer ids take that path directly, without pandas' object factorization)."""
    ids = np.asarray(ids)
    if ids.dtype.kind in "iu":
        return pd.util.hash_array(ids.astype(str).astype(object), categorize=False).astype(np.uint64)
    return pd.util.hash_array(np.asarray(ids, dtype=object)).astype(np.uint64)


def simulated_columns(params: AttributionParams) -> tuple[str, ...]:
    """Every column :func:`simulate_browsers` reads (the row hash's and the simulation's): a Beam shard
    converts only these to pandas."""
    return tuple(dict.fromkeys((IMPRESSION_ID, BROWSER_ID, CONVERSION_TIME_US, IMPRESSION_TIME_US, IMPRESSION_SITE,
                                CONVERSION_SITE, *params.value_columns, *params.slice_columns,
                                *params.conversion_slice_columns)))


def draws(params: AttributionParams, rows: pd.DataFrame, simulation_seed: int | None) -> tuple[pd.DataFrame, np.ndarray]:
    """``rows`` (the columns the simulation reads) in content-hash order and their value-rounding
    uniforms (n, queries)."""
    keys = row_keys(params, rows)
    order = np.argsort(keys, kind="stable")
    read = [c for c in simulated_columns(params) if c in rows]
    if list(rows.columns) != read:  # (a shard's frame already holds just these: no copy then)
        rows = rows[read]
    rows, keys = rows.take(order).reset_index(drop=True), keys[order]
    if simulation_seed is None:
        return rows, secure_generator().random((len(rows), len(params.queries)))
    Simulation(simulation_seed)  # validates the seed
    uniforms = np.empty((len(rows), len(params.queries)))
    for q in range(len(params.queries)):
        uniforms[:, q] = keyed_uniforms(simulation_seed, keys, q)
    return rows, uniforms


def epoch_starts(plan: Schedule, config: BrowserConfig, simulation_seed: int | None) -> np.ndarray:
    """Each browser's draw on [0, 1) of its epoch start: a whole second s of the epoch as s / length,
    a double whose product with the epoch's length in seconds is exactly s (the reference's Temporal
    refuses a fractional second)."""
    n = len(plan.browsers)
    if simulation_seed is None:
        uniforms = secure_generator().random(n)
    else:
        uniforms = keyed_uniforms(simulation_seed, browser_keys(plan.browsers), EPOCH_START_STREAM)
    period = config.epoch_ms // 1000
    seconds = np.floor(uniforms * period).astype(np.int64)
    out = seconds / period
    missed = out * period != seconds  # for ~10% of seconds s / P * P misses s by an ulp: take the next second
    while missed.any():
        seconds[missed] = (seconds[missed] + 1) % period
        out[missed] = seconds[missed] / period
        missed = out * period != seconds
    result: np.ndarray = out
    return result


@dataclass(frozen=True)
class AttributionMeasurement:
    """What one measurement produced. ``unnoised`` is private (debug runs only); ``noisy`` and
    ``estimates`` are per (query, task) over the domain's histogram indices."""

    unnoised: Mapping[tuple[str, int], np.ndarray]
    noisy: Mapping[tuple[str, int], np.ndarray]
    estimates: Mapping[tuple[str, int], Estimate]
    reports: Reports
    rows: int
    rows_outside_domain: int

    @property
    def reports_refused(self) -> int:
        """Reports whose impression matched but whose epoch budget (or safety limit) was short."""
        return int(self.reports.refused.sum())


@dataclass(frozen=True)
class BrowserSums:
    """What a set of complete browsers (all rows of each) contributes to a measurement: the unnoised
    sums per (query, task) over the histogram indices and the counts. Sums of disjoint sets of
    browsers add up (:meth:`merge`): a Beam job simulates each shard of browsers and merges.
    ``charged_first_ms`` / ``charged_last_ms``: the first and last impression time of an accepted
    report (the epochs the budgets were charged in; None without one: ``araopt.attribution.lifetime``)."""

    unnoised: Mapping[tuple[str, int], np.ndarray]
    rows: int = 0
    rows_outside_domain: int = 0
    reports: int = 0
    reports_matched: int = 0
    reports_refused: int = 0
    browsers: int = 0
    charged_first_ms: int | None = None
    charged_last_ms: int | None = None

    @staticmethod
    def merge(parts: Iterable[BrowserSums]) -> BrowserSums:
        parts = list(parts)
        if not parts:
            raise InvalidInput("no browser sums to merge")
        keys = sorted(parts[0].unnoised)
        unnoised = {k: np.asarray(np.sum([p.unnoised[k] for p in parts], axis=0, dtype=np.int64)) for k in keys}
        counts = {f: sum(getattr(p, f) for p in parts)
                  for f in ("rows", "rows_outside_domain", "reports", "reports_matched", "reports_refused", "browsers")}
        firsts = [p.charged_first_ms for p in parts if p.charged_first_ms is not None]
        lasts = [p.charged_last_ms for p in parts if p.charged_last_ms is not None]
        return BrowserSums(unnoised, **counts, charged_first_ms=min(firsts, default=None),
                           charged_last_ms=max(lasts, default=None))

    def charged_window(self, epoch_days: int) -> ChargedWindow | None:
        """The impression times the accepted reports charged, in microseconds (None: no report accepted)."""
        if self.charged_first_ms is None or self.charged_last_ms is None:
            return None
        return ChargedWindow(self.charged_first_ms * 1000, self.charged_last_ms * 1000, epoch_days * DAY_MS * 1000)


def simulate_browsers(params: AttributionParams, rows: pd.DataFrame, domain: KeyDomain, *,
                      task_domain: KeyDomain | None = None, simulation_seed: int | None = None,
                      config: BrowserConfig | None = None) -> tuple[BrowserSums, Reports]:
    """The browsers of ``rows`` (every row of each browser present) through the encoder and the budgets:
    their unnoised sums and reports. With a seed, the draws are keyed by row and browser, so any split
    of the log into sets of complete browsers gives the same sums."""
    ordered, uniforms = draws(params, rows, simulation_seed)
    plan = schedule(params, ordered, domain, uniforms, task_domain)
    config = config if config is not None else browser_config(params, domain.num_slices)
    reports = simulate_schedule(params, plan, ordered, config, epoch_starts(plan, config, simulation_seed))
    num_tasks = 1 if task_domain is None else task_domain.num_slices
    charged = plan.impression_time_ms[plan.kind == 1][reports.accepted]  # (the times the epochs were taken from)
    sums = BrowserSums(report_sums(params, reports, domain.num_slices, num_tasks), len(rows),
                       int((~plan.encoded).sum()), len(reports.query), int(reports.matched.sum()),
                       int(reports.refused.sum()), len(plan.browsers),
                       int(charged.min()) if len(charged) else None, int(charged.max()) if len(charged) else None)
    return sums, reports


def noisy_release(params: AttributionParams, unnoised: Mapping[tuple[str, int], np.ndarray],
                  simulation_seed: int | None = None, level: float = 0.95
                  ) -> tuple[dict[tuple[str, int], np.ndarray], dict[tuple[str, int], Estimate]]:
    """The aggregation service's noisy histograms (secure noise unless ``simulation_seed``) and Alg. 4's
    estimates with their noise intervals, per (query, task)."""
    simulation = None if simulation_seed is None else Simulation(simulation_seed)
    noisy, estimates = {}, {}
    for stream, (key, sums) in enumerate(sorted(unnoised.items())):
        query = params.queries[params.query_names.index(key[0])]
        noisy[key] = aggregate(sums, query, simulation, stream)
        estimates[key] = reconstruct(noisy[key], query, level)
    return noisy, estimates


def data_domain(params: AttributionParams, rows: pd.DataFrame, simulation_seed: int | None) -> KeyDomain:
    """The histogram layout of the slices in ``rows``: allowed only in simulation (a release over it
    would reveal which slices occur)."""
    if simulation_seed is None:
        raise PrivacyRefusal("a release needs a declared domain of histogram indices: deriving it from the data "
                             "being released is allowed only in simulation mode (simulation_seed)")
    return KeyDomain.from_slice_values(params.slice_columns, {c: rows[c].to_numpy() for c in params.slice_columns},
                                       params.query_names)


def measure(params: AttributionParams, rows: pd.DataFrame, domain: KeyDomain | None = None, *,
            task_domain: KeyDomain | None = None, simulation_seed: int | None = None,
            config: BrowserConfig | None = None, level: float = 0.95) -> AttributionMeasurement:
    """Simulate the browsers and the aggregation over ``rows`` (canonical log rows with
    ``impression_time_us``). ``domain`` (impression-side slices: the histogram indices) may be
    derived from the data only in simulation: a release over it would reveal which slices occur."""
    if domain is None:
        domain = data_domain(params, rows, simulation_seed)
    check_declared_domain(domain, simulation_seed)  # the release step's rule: a data-derived domain only simulated
    sums, reports = simulate_browsers(params, rows, domain, task_domain=task_domain, simulation_seed=simulation_seed,
                                      config=config)
    noisy, estimates = noisy_release(params, sums.unnoised, simulation_seed, level)
    return AttributionMeasurement(sums.unnoised, noisy, estimates, reports, sums.rows, sums.rows_outside_domain)


def export_cases(params: AttributionParams, rows: pd.DataFrame, domain: KeyDomain, *, simulation_seed: int,
                 task_domain: KeyDomain | None = None, config: BrowserConfig | None = None) -> list[dict[str, Any]]:
    """Every browser's events as one case of the spec's end-to-end format (``events.jsonl``), with the
    roundings and epoch starts that :func:`measure` draws for the same ``simulation_seed``: replayed
    by the reference implementation they give ``measure``'s unnoised sums."""
    ordered, uniforms = draws(params, rows, simulation_seed)
    plan = schedule(params, ordered, domain, uniforms, task_domain)
    streams, _ = encode(params, ordered, domain, uniforms, task_domain)
    config = config if config is not None else browser_config(params, domain.num_slices)
    starts = epoch_starts(plan, config, simulation_seed)
    return [to_case(stream, config, float(start), 0.5) for stream, start in zip(streams, starts, strict=True)]
