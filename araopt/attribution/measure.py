"""One Attribution Level 1 measurement in memory: conversion-log rows -> the browsers' reports ->
the aggregation service's noisy histograms -> estimates of the true totals (Alg. 4) with their noise
intervals.

Randomness: the noise comes from the secure generator, or from the seed in simulation. The browsers'
draws (value rounding, each browser's epoch grid) are keyed (``araopt.attribution.draws``): by the
seed in simulation, else by a secret ``DrawKey`` (a release's ledger's, so that every release agrees;
a fresh one per measurement without one). Rounding is keyed by each row's content and the epoch grid
by the browser's canonical id: the same row or browser gets the same draw in any partition, in any
release and in ``export``; rows are taken in the order of their content hash, so ties between a
browser's events do not depend on how the log was split.

Rows flagged ``in_period`` False are a lookback (``araopt.attribution.lifetime``): the conversions of
earlier releases simulated again, with their own parameters, before and among the release's own, so
that the budgets the release sees are what the earlier ones left; they are not summed.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from araopt.attribution.config import DAY_MS, BrowserConfig
from araopt.attribution.draws import DrawKey, Draws, check_draws, uniforms
from araopt.attribution.encoder import (
    CONVERSION_TIME_US,
    Schedule,
    browser_config,
    encode_rows,
    schedule_calls,
    streams,
    to_case,
)
from araopt.attribution.lifetime import AttributionHistory, ChargedWindow, lookback_segments
from araopt.attribution.params import AttributionParams
from araopt.attribution.reconstruct import Estimate, aggregate, check_noise_rates, reconstruct
from araopt.attribution.simulate import Calls, Reports, epoch_grid, reference_draws, report_sums, simulate_schedule
from araopt.attribution.sites import site_hashes
from araopt.errors import InvalidInput, PrivacyRefusal
from araopt.io.conversions import (
    BROWSER_ID,
    CONVERSION_SITE,
    IMPRESSION_ID,
    IMPRESSION_SITE,
    IMPRESSION_TIME_US,
    IN_PERIOD,
    check_time_micros,
)
from araopt.io.ids import canonical_id_hash
from araopt.io.rowset import conversion_row_ids
from araopt.mechanism.aggregate import earliest, first_time
from araopt.mechanism.keys import KeyDomain
from araopt.mechanism.randomness import Simulation
from araopt.mechanism.release import check_declared_domain, check_learnt_window

EPOCH_START_STREAM = 1 << 20
"""The keyed-uniform stream of the browsers' epoch starts (value rounding uses streams 0..queries-1)."""


def row_keys(params: AttributionParams, rows: pd.DataFrame) -> np.ndarray:
    """A 64-bit content hash per row (impression, browser, conversion time, values, slices)."""
    columns = [c for c in (IMPRESSION_ID, BROWSER_ID, CONVERSION_TIME_US, *params.value_columns, *params.slice_columns,
                           *params.conversion_slice_columns) if c in rows]
    return pd.util.hash_pandas_object(rows[columns], index=False).to_numpy(dtype=np.uint64)


def simulated_columns(params: AttributionParams) -> tuple[str, ...]:
    """Every column :func:`simulate_browsers` reads (the row hash's and the simulation's, and the lookback
    flag): a Beam shard converts only these to pandas."""
    return tuple(dict.fromkeys((IMPRESSION_ID, BROWSER_ID, CONVERSION_TIME_US, IMPRESSION_TIME_US, IMPRESSION_SITE,
                                CONVERSION_SITE, IN_PERIOD, *params.value_columns, *params.slice_columns,
                                *params.conversion_slice_columns)))


Segment = tuple[AttributionParams, KeyDomain]
"""A parameter set of a simulation: the parameters the browsers were called with and the histogram
layout (which rows made calls); the first is the measurement's own."""


def draws(params: AttributionParams, rows: pd.DataFrame, source: Draws | None) -> tuple[pd.DataFrame, np.ndarray]:
    """``rows`` (the columns the simulation reads) in content-hash order and their value-rounding
    uniforms (n, queries): keyed by ``source`` (a seed or a key; None: a fresh secret key)."""
    ordered, _, u = _segment_draws([params], rows, np.zeros(len(rows), dtype=np.int64),
                                   DrawKey.new() if source is None else source)
    return ordered, u


def _segment_draws(params: Sequence[AttributionParams], rows: pd.DataFrame, row_set: np.ndarray,
                   source: Draws) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """(rows in content-hash order, their sets, their rounding uniforms (n, most queries)): each row hashed
    with the parameters of its set (the columns they name), as the release that called it hashed it."""
    check_draws(source)
    keys = np.zeros(len(rows), dtype=np.uint64)
    for i, p in enumerate(params):
        mask = row_set == i
        if mask.any():
            keys[mask] = row_keys(p, rows[mask])
    order = np.lexsort((*_tie_breaks(rows), keys))
    read = [c for c in simulated_columns(params[0]) if c in rows and c != IN_PERIOD]
    if list(rows.columns) != read:  # (a shard's frame already holds just these: no copy then)
        rows = rows[read]
    rows, keys, row_set = rows.take(order).reset_index(drop=True), keys[order], row_set[order]
    width = max(len(p.queries) for p in params)
    u = np.empty((len(rows), width))
    for q in range(width):
        u[:, q] = uniforms(source, keys, q)
    return rows, row_set, u


def _tie_breaks(rows: pd.DataFrame) -> list[np.ndarray]:
    """What orders rows whose draws' key (``row_keys``) is equal, least significant first: their impression
    time, conversion site and impression site (canonical: ``sites.site_hashes``). The key holds the rest of
    what the simulation reads, so the rows' order, and which of two conversions at one instant a quota or a
    budget admits, is a function of their content, not of the order a file lists them in (the content a
    ledger entry records: ``araopt.attribution.content``)."""
    out = []
    if IMPRESSION_TIME_US in rows:
        out.append(rows[IMPRESSION_TIME_US].to_numpy(dtype=np.int64, na_value=0))
    for column in (CONVERSION_SITE, IMPRESSION_SITE):
        if column in rows:
            out.append(site_hashes(rows[column].to_numpy(dtype=object)))
    return out


def epoch_starts(plan: Schedule, config: BrowserConfig, source: Draws) -> np.ndarray:
    """Each browser's epoch start (ms, ``simulate.epoch_grid``) from its draw keyed by its canonical id."""
    return epoch_grid(uniforms(source, canonical_id_hash(plan.browsers), EPOCH_START_STREAM), config)


@dataclass(frozen=True)
class Simulated:
    """One simulation of browsers: the rows in their order with their parameter sets, the schedule, the
    reports, and each browser's epoch start."""

    rows: pd.DataFrame
    row_set: np.ndarray
    plan: Schedule
    reports: Reports
    starts: np.ndarray


def simulate_segments(segments: Sequence[Segment], rows: pd.DataFrame, row_set: np.ndarray, source: Draws,
                      config: BrowserConfig, task_domain: KeyDomain | None = None) -> Simulated:
    """The browsers of ``rows`` through the encoder and the budgets, each row called with the parameters
    and layout of its segment (``row_set``; -1: a row no browser was asked for, left out)."""
    keep = np.asarray(row_set) >= 0
    if not keep.all():
        rows, row_set = rows[keep], np.asarray(row_set)[keep]
    params = [p for p, _ in segments]
    ordered, row_set, u = _segment_draws(params, rows, np.asarray(row_set, dtype=np.int64), source)
    n, width = len(ordered), u.shape[1]
    index, task = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    sent, encoded = np.zeros((n, width), dtype=np.int64), np.zeros(n, dtype=bool)
    for i, (p, layout) in enumerate(segments):
        mask = np.flatnonzero(row_set == i)
        if len(mask):
            part = encode_rows(p, ordered.iloc[mask], layout, u[mask, :len(p.queries)],
                               task_domain if i == 0 else None)
            index[mask], task[mask], sent[mask, :len(p.queries)], encoded[mask] = part
    plan = schedule_calls(ordered, index, task, sent, encoded)
    starts = epoch_starts(plan, config, source)
    reports = simulate_schedule(params[0], plan, ordered, config, starts, Calls.of(params, row_set))
    return Simulated(ordered, row_set, plan, reports, starts)


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
    sums per (query, task) over the histogram indices and the counts (of the release's own rows and
    reports; a lookback's are not counted). Sums of disjoint sets of browsers add up (:meth:`merge`): a
    Beam job simulates each shard of browsers and merges. ``charged_first_ms`` / ``charged_last_ms``:
    the first and last impression time of an accepted report (the epochs the budgets were charged in;
    None without one), ``matched_*``: of a matched report (the epochs whose budgets the release's
    decisions read): ``araopt.attribution.lifetime``."""

    unnoised: Mapping[tuple[str, int], np.ndarray]
    rows: int = 0
    rows_outside_domain: int = 0
    reports: int = 0
    reports_matched: int = 0
    reports_refused: int = 0
    browsers: int = 0
    charged_first_ms: int | None = None
    charged_last_ms: int | None = None
    matched_first_ms: int | None = None
    matched_last_ms: int | None = None
    lookback_rows: int = 0
    lookback_reports: int = 0
    simulated: bool = False
    """Simulated with a simulation seed (seeded draws, a lookback without a release history at the release's
    own parameters): such sums are noised only as a simulation (``release.release``)."""
    first_time_us: int | None = None
    """The earliest conversion time (microseconds) of the release's own rows (``NO_CONVERSION``: none;
    None: unknown, sums built by hand): the release step checks it against the layout's training window
    (``araopt.mechanism.release.check_sums_window``)."""

    @staticmethod
    def merge(parts: Iterable[BrowserSums]) -> BrowserSums:
        parts = list(parts)
        if not parts:
            raise InvalidInput("no browser sums to merge")
        if len({p.simulated for p in parts}) != 1:
            raise PrivacyRefusal("cannot merge the browser sums of a simulation with a release's")
        keys = sorted(parts[0].unnoised)
        unnoised = {k: np.asarray(np.sum([p.unnoised[k] for p in parts], axis=0, dtype=np.int64)) for k in keys}
        counts = {f: sum(getattr(p, f) for p in parts)
                  for f in ("rows", "rows_outside_domain", "reports", "reports_matched", "reports_refused", "browsers",
                            "lookback_rows", "lookback_reports")}

        def first(name: str) -> int | None:
            return min((v for p in parts if (v := getattr(p, name)) is not None), default=None)

        def last(name: str) -> int | None:
            return max((v for p in parts if (v := getattr(p, name)) is not None), default=None)

        return replace(BrowserSums(unnoised, **counts), simulated=parts[0].simulated,
                       first_time_us=earliest(p.first_time_us for p in parts),
                       charged_first_ms=first("charged_first_ms"), charged_last_ms=last("charged_last_ms"),
                       matched_first_ms=first("matched_first_ms"), matched_last_ms=last("matched_last_ms"))

    def charged_window(self, epoch_days: int) -> ChargedWindow | None:
        """The impression times the accepted reports charged, in microseconds (None: no report accepted)."""
        return _window(self.charged_first_ms, self.charged_last_ms, epoch_days)

    def matched_window(self, epoch_days: int) -> ChargedWindow | None:
        """The impression times the matched reports used, in microseconds (None: no report matched)."""
        return _window(self.matched_first_ms, self.matched_last_ms, epoch_days)


def _window(first_ms: int | None, last_ms: int | None, epoch_days: int) -> ChargedWindow | None:
    if first_ms is None or last_ms is None:
        return None
    return ChargedWindow(first_ms * 1000, last_ms * 1000, epoch_days * DAY_MS * 1000)


def _ends(times: np.ndarray) -> tuple[int | None, int | None]:
    return (int(times.min()), int(times.max())) if len(times) else (None, None)


def _of_measured_browsers(rows: pd.DataFrame, lookback: np.ndarray) -> tuple[pd.DataFrame, np.ndarray]:
    """The rows without the lookback rows of browsers with no row of their own: a browser the release does
    not measure decides nothing it publishes (its state is carried by the release that measures it)."""
    column = BROWSER_ID if BROWSER_ID in rows else IMPRESSION_ID
    units = canonical_id_hash(rows[column].to_numpy())
    keep = ~lookback | np.isin(units, units[~lookback])
    if keep.all():
        return rows, lookback
    return rows[keep], lookback[keep]


def simulate_browsers(params: AttributionParams, rows: pd.DataFrame, domain: KeyDomain, *,
                      task_domain: KeyDomain | None = None, simulation_seed: int | None = None,
                      config: BrowserConfig | None = None, key: DrawKey | None = None,
                      history: AttributionHistory | None = None) -> tuple[BrowserSums, Reports]:
    """The browsers of ``rows`` (every row of each browser present) through the encoder and the budgets:
    their unnoised sums and reports. The draws are keyed (``simulation_seed``, else ``key``, else a
    fresh key), so any split of the log into sets of complete browsers gives the same sums. Rows with
    ``in_period`` False are the lookback: each simulated with the parameters of the earlier release that
    released it (``history``; None: a simulation, the release's own), not summed, not counted."""
    sums, sim = simulate_release(params, rows, domain, task_domain=task_domain, simulation_seed=simulation_seed,
                                 config=config, key=key, history=history)
    return sums, sim.reports


def simulate_release(params: AttributionParams, rows: pd.DataFrame, domain: KeyDomain, *,
                     task_domain: KeyDomain | None = None, simulation_seed: int | None = None,
                     config: BrowserConfig | None = None, key: DrawKey | None = None,
                     history: AttributionHistory | None = None) -> tuple[BrowserSums, Simulated]:
    """:func:`simulate_browsers` with the whole simulation (the rows in its order, the schedule)."""
    for column in (CONVERSION_TIME_US, IMPRESSION_TIME_US):  # microseconds, as the windows compare them
        if column in rows:
            check_time_micros(rows[column].to_numpy(), column)
    if history is not None:  # a lookback held by earlier releases: their draws (the ledger's key)
        key = history.draw_key(key, simulation_seed is not None)
    source: Draws = simulation_seed if simulation_seed is not None else (key if key is not None else DrawKey.new())
    config = config if config is not None else browser_config(params, domain.num_slices)
    segments: list[Segment] = [(params, domain)]
    row_set = np.zeros(len(rows), dtype=np.int64)
    lookback = np.zeros(len(rows), dtype=bool)
    if IN_PERIOD in rows:
        lookback = ~rows[IN_PERIOD].to_numpy(dtype=bool)
        if lookback.any():
            rows, lookback = _of_measured_browsers(rows, lookback)
            row_set = np.zeros(len(rows), dtype=np.int64)
            ids = conversion_row_ids(rows[IMPRESSION_ID].to_numpy()[lookback],
                                     rows[CONVERSION_TIME_US].to_numpy()[lookback])
            segments, row_set[lookback] = lookback_segments(history, ids, params, domain, simulation_seed is not None)
    released_times = rows[CONVERSION_TIME_US].to_numpy()[~lookback]
    for layout, name in ((domain, "the histogram layout"), (task_domain, "the task domain")):
        if layout is not None:  # both list slices of what is released: the same release rules
            check_declared_domain(layout, simulation_seed, name)
            check_learnt_window(layout, released_times, simulation_seed is not None)
    sim = simulate_segments(segments, rows, row_set, source, config, task_domain)
    reports, plan = sim.reports, sim.plan
    num_tasks = 1 if task_domain is None else task_domain.num_slices
    own = reports.released
    imp_ms = plan.impression_time_ms[plan.kind == 1]  # (the times the epochs were taken from)
    own_rows = sim.row_set == 0
    browsers = len(np.unique(plan.browser[(plan.kind == 1) & own_rows[plan.row]]))
    sums = BrowserSums(report_sums(params, reports, domain.num_slices, num_tasks), int((~lookback).sum()),
                       int((~plan.encoded & own_rows).sum()), int(own.sum()), int((reports.matched & own).sum()),
                       int((reports.refused & own).sum()), browsers,
                       *_ends(imp_ms[reports.accepted & own]), *_ends(imp_ms[reports.matched & own]),
                       int(lookback.sum()), int((~own).sum()), simulation_seed is not None,
                       first_time(released_times))
    return sums, sim


def noisy_release(params: AttributionParams, unnoised: Mapping[tuple[str, int], np.ndarray],
                  simulation_seed: int | None = None, level: float = 0.95
                  ) -> tuple[dict[tuple[str, int], np.ndarray], dict[tuple[str, int], Estimate]]:
    """The aggregation service's noisy histograms (secure noise unless ``simulation_seed``) and Alg. 4's
    estimates with their noise intervals, per (query, task)."""
    check_noise_rates(params)  # one line naming the query, on every path (not the sampler's ARA wording)
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
            config: BrowserConfig | None = None, level: float = 0.95, key: DrawKey | None = None,
            history: AttributionHistory | None = None) -> AttributionMeasurement:
    """Simulate the browsers and the aggregation over ``rows`` (canonical log rows with
    ``impression_time_us``; ``in_period`` False marks a lookback, see :func:`simulate_browsers`).
    ``domain`` (impression-side slices: the histogram indices) may be derived from the data only in
    simulation: a release over it would reveal which slices occur."""
    if domain is None:
        domain = data_domain(params, rows if IN_PERIOD not in rows else rows[rows[IN_PERIOD]], simulation_seed)
    check_declared_domain(domain, simulation_seed)  # the release step's rule: a data-derived domain only simulated
    sums, reports = simulate_browsers(params, rows, domain, task_domain=task_domain, simulation_seed=simulation_seed,
                                      config=config, key=key, history=history)
    noisy, estimates = noisy_release(params, sums.unnoised, simulation_seed, level)
    return AttributionMeasurement(sums.unnoised, noisy, estimates, reports, sums.rows, sums.rows_outside_domain)


def export_cases(params: AttributionParams, rows: pd.DataFrame, domain: KeyDomain, *, simulation_seed: Draws,
                 task_domain: KeyDomain | None = None, config: BrowserConfig | None = None) -> list[dict[str, Any]]:
    """Every browser's events as one case of the spec's end-to-end format (``events.jsonl``), with the
    roundings and epoch grids that :func:`measure` draws for the same ``simulation_seed`` (or key):
    replayed by the reference implementation they give ``measure``'s unnoised sums."""
    config = config if config is not None else browser_config(params, domain.num_slices)
    return export_segments([(params, domain)], rows, np.zeros(len(rows), dtype=np.int64), simulation_seed, config,
                           task_domain)


def export_segments(segments: Sequence[Segment], rows: pd.DataFrame, row_set: np.ndarray, source: Draws,
                    config: BrowserConfig, task_domain: KeyDomain | None = None) -> list[dict[str, Any]]:
    """The cases of :func:`simulate_segments`'s browsers (each row called with its segment's parameters):
    each browser's ``epochStart`` is the draw that gives the reference its epoch grid (the reference
    takes the hour of its first ``measureConversion`` minus the draw: ``simulate.reference_draws``)."""
    sim = simulate_segments(segments, rows, row_set, source, config, task_domain)
    plan = sim.plan
    cases = streams(plan, sim.rows, [p for p, _ in segments], [d.num_slices for _, d in segments], sim.row_set)
    calls = np.flatnonzero(plan.kind == 1)
    first = np.zeros(len(plan.browsers), dtype=np.int64)
    firsts = calls[np.flatnonzero(np.diff(plan.browser[calls], prepend=-1) != 0)]  # events grouped by browser
    first[plan.browser[firsts]] = plan.time_ms[firsts]
    draws_ = reference_draws(sim.starts, first, config)
    return [to_case(stream, config, float(d), 0.5) for stream, d in zip(cases, draws_, strict=True)]
