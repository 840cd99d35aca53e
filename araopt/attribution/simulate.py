"""Many browsers at once: the browser model of :mod:`araopt.attribution.browser`, vectorized over
the event streams the encoder schedules (:func:`araopt.attribution.encoder.schedule`).

The encoder's streams are a special case of the API that admits arrays: every ``measureConversion``
matches at most its own impression (``matchValues`` = the impression's ordinal), so it uses at most
one epoch (the impression's) and its histogram is its whole value at the impression's index; no
browser clears state or is disabled. What stays sequential is the budgets: within a browser, reports
are accepted in event order while they fit. A report whose units could take every matched report of
those units is accepted at once (no order can refuse it); the others are processed by their rank
within their browser, all browsers at once per rank (a rank touches each browser's units once, so
the updates never collide). ``test_attribution_simulate.py`` checks it report by report against ``Browser``.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from araopt.attribution.config import DAY_MS, HOUR_MS, MICROEPSILONS, BrowserConfig
from araopt.attribution.encoder import Schedule
from araopt.attribution.errors import ApiError
from araopt.attribution.params import AttributionParams
from araopt.attribution.sites import parse_site
from araopt.errors import InvalidInput
from araopt.io.conversions import CONVERSION_SITE, IMPRESSION_SITE

_EXACT = 2.0**53


@dataclass(frozen=True)
class Reports:
    """One entry per ``measureConversion`` of the schedule, in its order: ``query``, ``task``,
    ``index``, ``value``, ``row``; ``matched`` (its impression was in lifetime and lookback),
    ``accepted`` (its budget checks passed: the value is in the histogram), ``refused`` (matched but
    refused for budget: an all-zero report), ``deducted`` (microepsilons from its site-epoch), ``epoch``
    (the epoch it uses, its impression's, counted from its browser's epoch start: with the row's
    browser and conversion site, the privacy unit it spends), ``segment`` (its row's parameter set,
    :class:`Calls`: 0 the release's own, others earlier releases' conversions simulated again)."""

    query: np.ndarray
    task: np.ndarray
    index: np.ndarray
    value: np.ndarray
    row: np.ndarray
    matched: np.ndarray
    accepted: np.ndarray
    deducted: np.ndarray
    epoch: np.ndarray
    segment: np.ndarray

    @property
    def released(self) -> np.ndarray:
        """The reports of the release's own conversions (segment 0)."""
        out: np.ndarray = self.segment == 0
        return out

    @property
    def refused(self) -> np.ndarray:
        out: np.ndarray = self.matched & ~self.accepted
        return out


def _unit_ids(*columns: np.ndarray) -> np.ndarray:
    """Ids in [0, size) of the distinct rows of integer ``columns``, equal iff the rows are equal: their
    mixed-radix value in int64 when that stays within a few times the number of rows (an index into
    the budget arrays as it is), else its dense factorization (a hash pass)."""
    if not len(columns[0]):
        return np.zeros(0, dtype=np.int64)
    key = np.zeros(len(columns[0]), dtype=np.int64)
    span = 1
    for column in columns:
        c = np.asarray(column, dtype=np.int64)
        low, size = int(c.min()), int(c.max()) - int(c.min()) + 1
        span *= size
        if span >= 2**62:
            raise InvalidInput("too many distinct privacy units to index in int64")
        key = key * size + (c - low)
    if span <= max(4 * len(key), 1 << 16):
        return key
    return np.asarray(pd.factorize(key)[0], dtype=np.int64)


def site_codes(values: np.ndarray, column: str) -> np.ndarray:
    """Codes equal exactly where the values name one site (the registrable domain the browser budgets:
    ``sites.parse_site``, so "www.ADV.example" and "adv.example" are one site; told apart by spelling,
    each would get a budget of its own). A value that is no site is refused in one line."""
    codes, distinct = pd.factorize(values)
    try:
        sites = [parse_site(v) for v in distinct.tolist()]
    except ApiError as exc:
        raise InvalidInput(f"{column}: {exc}") from None
    canonical: np.ndarray = pd.factorize(np.asarray(sites, dtype=object))[0][codes]
    return canonical


def _fits(units: np.ndarray, deductions: np.ndarray, budgets: np.ndarray) -> np.ndarray:
    """Per report: whether its unit's budget covers the deductions of all the unit's reports (float sums
    of integers: exact below 2^53, and any larger sum exceeds every budget)."""
    totals = np.bincount(units, weights=deductions.astype(np.float64), minlength=len(budgets))
    out: np.ndarray = (totals <= budgets)[units]
    return out


@dataclass(frozen=True)
class Calls:
    """What the ``measureConversion`` calls of each parameter set of a schedule ask (0: the release's;
    others: earlier releases' whose conversions are simulated again, ``araopt.attribution.lifetime``):
    per set each query's noise scale 2 maxValue / epsilon (``noise_scale``, (sets, queries), unused
    queries 0) and ``lookback_days``; ``row_set``: per row of the schedule, its set."""

    noise_scale: np.ndarray
    lookback_days: np.ndarray
    row_set: np.ndarray

    @classmethod
    def of(cls, params: Sequence[AttributionParams], row_set: np.ndarray) -> Calls:
        width = max(len(p.queries) for p in params)
        scale = np.zeros((len(params), width))
        for i, p in enumerate(params):
            scale[i, :len(p.queries)] = [(2 * q.max_value) / q.epsilon for q in p.queries]
        return cls(scale, np.array([p.lookback_days for p in params], dtype=np.int64),
                   np.asarray(row_set, dtype=np.int64))


def epoch_grid(draws: np.ndarray, config: BrowserConfig) -> np.ndarray:
    """Each browser's epoch start (ms since the Unix epoch, an hour): from its draw on [0, 1), the hour
    of the epoch its epochs start at. The grid depends on the draw alone, so every release that
    simulates a browser agrees on its epochs whatever conversions it holds (the spec's browser fixes
    the hour of its first need minus its draw: ``reference_draws`` gives the same grid)."""
    u = np.asarray(draws, dtype=np.float64)
    if len(u) and not ((u >= 0) & (u < 1)).all():
        raise InvalidInput("epoch draws must lie on [0, 1)")
    out: np.ndarray = np.floor(u * (config.epoch_ms // HOUR_MS)).astype(np.int64) * HOUR_MS
    return out


def reference_draws(starts_ms: np.ndarray, first_ms: np.ndarray, config: BrowserConfig) -> np.ndarray:
    """The spec's ``epochStart`` draw per browser that makes its epochs those of ``starts_ms`` (grid
    starts) when ``first_ms`` is the time of its first ``measureConversion`` (the browser then takes
    the hour of first - draw x epoch length): a whole second s of the epoch as s / length, a double
    whose product with the length in seconds is exactly s (the reference's Temporal refuses a
    fractional second)."""
    period, period_s = config.epoch_ms, config.epoch_ms // 1000
    since = np.mod(np.asarray(first_ms, dtype=np.int64) - np.asarray(starts_ms, dtype=np.int64), period)
    seconds = since // 1000  # first - s lies in the grid's epoch start hour: s x 1000 in (since - 1 h, since]
    out = seconds / period_s
    missed = out * period_s != seconds  # for ~10% of s, s / P * P misses s by an ulp: a second earlier
    while missed.any():
        seconds[missed] = (seconds[missed] - 1) % period_s
        out[missed] = seconds[missed] / period_s
        missed = out * period_s != seconds
    result: np.ndarray = out
    return result


def simulate_schedule(params: AttributionParams, plan: Schedule, rows: pd.DataFrame, config: BrowserConfig,
                      starts: np.ndarray, calls: Calls | None = None) -> Reports:
    """Every browser of ``plan`` through the budget logic; ``starts``: per browser (code) its epoch start
    (:func:`epoch_grid`); ``calls``: the parameter set of each row (default: all ``params``)."""
    m = plan.kind == 1
    b, r, q, now, imp_t = plan.browser[m], plan.row[m], plan.query[m], plan.time_ms[m], plan.impression_time_ms[m]
    value = np.ravel(plan.sent)[r * plan.sent.shape[1] + q]  # = plan.sent[r, q], one flat gather (several x faster)
    start = np.asarray(starts, dtype=np.int64)
    if start.shape != (len(plan.browsers),):
        raise InvalidInput("starts must hold one epoch start per browser")
    if calls is None:
        calls = Calls.of((params,), np.zeros(len(rows), dtype=np.int64))
    period = config.epoch_ms
    row_set = calls.row_set[r]
    lookback = np.minimum(calls.lookback_days[row_set], config.max_lookback_days) * DAY_MS  # lifetimeDays too

    browser_start = start[b]

    def epoch(t: np.ndarray) -> np.ndarray:
        out: np.ndarray = np.floor_divide(t - browser_start, period)
        return out

    imp_epoch, current = epoch(imp_t), epoch(now)
    # the impression's lifetimeDays is the lookback of the parameters its first row was called with
    lifetime = np.minimum(calls.lookback_days[calls.row_set[plan.impression_row[m]]], config.max_lookback_days) * DAY_MS
    matched = (now <= imp_t + np.minimum(lookback, lifetime)) & (imp_epoch >= epoch(now - config.max_lookback_days * DAY_MS))
    single = epoch(now - lookback) == current
    noise_scale = calls.noise_scale[row_set, q]
    l1_deduction = np.ceil((value.astype(np.float64) / noise_scale) * MICROEPSILONS).astype(np.int64)
    value_deduction = np.ceil(((2 * value).astype(np.float64) / noise_scale) * MICROEPSILONS).astype(np.int64)
    site_deduction = np.where(single, l1_deduction, value_deduction)

    # a log without sites has one of each (the encoder's DEFAULT_CONVERSION_SITE / DEFAULT_IMPRESSION_SITE)
    global_unit = _unit_ids(b, imp_epoch)
    site_unit = global_unit
    if CONVERSION_SITE in rows:
        site_unit = _unit_ids(global_unit, site_codes(rows[CONVERSION_SITE].to_numpy(), CONVERSION_SITE)[r])
    quota_unit = global_unit
    if IMPRESSION_SITE in rows:
        quota_unit = _unit_ids(global_unit,
                               site_codes(rows[IMPRESSION_SITE].to_numpy(), IMPRESSION_SITE)[plan.impression_row[m]])
    site_left = np.full(int(site_unit.max(initial=-1)) + 1, config.per_site_budget, dtype=np.int64)
    global_left = np.full(int(global_unit.max(initial=-1)) + 1, config.global_budget_per_epoch, dtype=np.int64)
    quota_left = np.full(int(quota_unit.max(initial=-1)) + 1, config.impression_site_quota_per_epoch, dtype=np.int64)

    # A report whose three units could take the deductions of all their matched reports is accepted in
    # any order; the units of the others are each either such a unit (its check passes whatever comes
    # first) or one that only the others use: they alone go through the budgets in order.
    candidates = np.flatnonzero(matched)
    fits = (_fits(site_unit[candidates], site_deduction[candidates], site_left)
            & _fits(global_unit[candidates], value_deduction[candidates], global_left)
            & _fits(quota_unit[candidates], value_deduction[candidates], quota_left))
    accepted = np.zeros(len(b), dtype=bool)
    accepted[candidates[fits]] = True
    candidates = candidates[~fits]
    cb = b[candidates]
    group_start = np.flatnonzero(np.diff(cb, prepend=-1) != 0)
    rank = np.arange(len(candidates)) - np.repeat(group_start, np.diff(np.append(group_start, len(cb))))
    rank_type = np.int16 if rank.max(initial=0) < 2**15 else np.int64  # small ints: numpy's stable sort is a radix sort
    by_rank = candidates[np.argsort(rank.astype(rank_type), kind="stable")]
    bounds = np.concatenate([[0], np.cumsum(np.bincount(rank, minlength=1))])
    for k in range(len(bounds) - 1):
        sel = by_rank[bounds[k]:bounds[k + 1]]
        su, gu, qu = site_unit[sel], global_unit[sel], quota_unit[sel]
        ok = ((site_deduction[sel] <= site_left[su]) & (value_deduction[sel] <= global_left[gu])
              & (value_deduction[sel] <= quota_left[qu]))
        take = sel[ok]
        site_left[site_unit[take]] -= site_deduction[take]
        global_left[global_unit[take]] -= value_deduction[take]
        quota_left[quota_unit[take]] -= value_deduction[take]
        accepted[take] = True
    return Reports(q, plan.task[r], plan.index[r], value, r, matched, accepted, np.where(accepted, site_deduction, 0),
                   imp_epoch, row_set)


def report_sums(params: AttributionParams, reports: Reports, histogram_size: int,
                num_tasks: int = 1) -> Mapping[tuple[str, int], np.ndarray]:
    """Per (query, task): the sum of the release's accepted reports' values per index (what the
    aggregation service sums before it adds noise; earlier releases' reports are not summed)."""
    keys = (reports.query * num_tasks + reports.task) * histogram_size + reports.index
    keys = np.where(reports.released, keys, 0)  # (an earlier release's index may lie outside this layout)
    weights = np.where(reports.accepted & reports.released, reports.value, 0).astype(np.float64)
    flat = np.bincount(keys, weights=weights, minlength=len(params.queries) * num_tasks * histogram_size)
    if flat.size and flat.max() >= _EXACT:
        raise InvalidInput("a histogram sum reaches 2^53: not exact in float64")
    table = flat.astype(np.int64).reshape(len(params.queries), num_tasks, histogram_size)
    return {(qq.name, t): table[i, t] for i, qq in enumerate(params.queries) for t in range(num_tasks)}
