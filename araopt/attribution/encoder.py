"""From conversion-log rows to what each browser is asked to do, and the browsers' unnoised sums.

A row is one conversion of ``impression_id`` at ``conversion_time`` (the contract of
``schemas/conversion_log.md``) with the Attribution columns ``browser_id`` (the privacy unit's
browser; absent: the impression is its own browser), ``impression_time`` (required: it decides the
epochs) and optionally ``impression_site`` / ``conversion_site``. Per browser the encoder writes an
event stream in the spec's end-to-end format:

* one ``saveImpression`` per impression at its ``impression_time``: ``histogramIndex`` = its
  impression-side slice in the declared domain, ``matchValue`` = the impression's ordinal in its
  browser, ``lifetimeDays`` = the lookback, on its ``impression_site``;
* per conversion, one ``measureConversion`` per query at ``conversion_time``, in query order:
  ``epsilon``, ``maxValue``, ``value`` = RR(s_l min(v, C_l)) (eq. 2 with the query's value scale),
  ``matchValues`` = [its impression's ordinal] (so the browser attributes it to the log's impression,
  as ARA's log does), ``lookbackDays``, ``credit``, ``histogramSize`` = the domain's size; the event
  also carries ``"query"`` and ``"task"`` (the conversion-side slice: which histogram it feeds). A
  value that rounds to 0 makes no call (the API refuses value 0; the report would add 0).

Events at the same time are ordered impressions first, then rows in log order, then queries, and
moved apart by a millisecond each: a browser's events are sequential.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from araopt.attribution.browser import Browser
from araopt.attribution.config import DEFAULT_AGGREGATION_SERVICE, MAX_UNSIGNED_LONG, BrowserConfig
from araopt.attribution.events import event_time_ms
from araopt.attribution.params import PARAMS_FORMAT, AttributionParams
from araopt.errors import InvalidInput
from araopt.io import outputs
from araopt.io.conversions import (
    BROWSER_ID,
    CONVERSION_SITE,
    CONVERSION_TIME,
    IMPRESSION_ID,
    IMPRESSION_SITE,
    IMPRESSION_TIME_US,
)
from araopt.io.ids import canonical_id_hash
from araopt.mechanism.encoding import randomized_round
from araopt.mechanism.keys import KeyDomain

CONVERSION_TIME_US = f"{CONVERSION_TIME}_us"
DEFAULT_IMPRESSION_SITE = "publisher.example"
DEFAULT_CONVERSION_SITE = "advertiser.example"


def encoded_values(params: AttributionParams, values: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """(n, queries) int64: per row and query the ``value`` sent (0: no call). The count query sends 1;
    a value query RR(s_l min(v, C_l)) with s_l = maxValue / C_l (clipping at C_l makes it <= maxValue)."""
    n = values.shape[0]
    out = np.empty((n, len(params.queries)), dtype=np.int64)
    j = 0
    for i, q in enumerate(params.queries):
        if q.column is None:
            out[:, i] = 1
            continue
        scaled = np.minimum(values[:, j], q.clip) * q.value_scale
        out[:, i] = np.minimum(randomized_round(scaled, uniforms[:, i]), q.max_value)
        j += 1
    return out


@dataclass(frozen=True)
class Schedule:
    """Every browser's events in order, as arrays (one entry per event, grouped by browser, each
    browser's in time order): ``browser`` (code, in order of first appearance), ``kind`` (0:
    saveImpression, 1: measureConversion), ``row`` (the log row: for an impression, its first row),
    ``query`` (index into the queries; 0 for an impression), ``time_ms`` (moved apart so that a
    browser's events are strictly increasing), ``ordinal`` (the impression's ordinal in its browser),
    ``impression_time_ms`` (its saveImpression's time), ``impression_row`` (its first row), and per
    row ``index``, ``task``, ``sent`` (the value per query), ``encoded`` (the mask of rows encoded),
    ``browsers`` (code -> id)."""

    browser: np.ndarray
    kind: np.ndarray
    row: np.ndarray
    query: np.ndarray
    time_ms: np.ndarray
    ordinal: np.ndarray
    impression_time_ms: np.ndarray
    impression_row: np.ndarray
    index: np.ndarray
    task: np.ndarray
    sent: np.ndarray
    encoded: np.ndarray
    browsers: np.ndarray


def schedule(params: AttributionParams, rows: pd.DataFrame, domain: KeyDomain, uniforms: np.ndarray,
             task_domain: KeyDomain | None = None) -> Schedule:
    """The browsers' events for ``rows`` (canonical: ``conversion_time_us`` and ``impression_time_us``
    int64 microseconds), vectorized. A row whose impression-side slice is not in ``domain`` (or
    conversion-side slice not in ``task_domain``) is not encoded (``encoded`` False): the caller
    counts it. ``uniforms``: (n, queries) on [0, 1) for the value rounding."""
    return schedule_calls(rows, *encode_rows(params, rows, domain, uniforms, task_domain))


def encode_rows(params: AttributionParams, rows: pd.DataFrame, domain: KeyDomain, uniforms: np.ndarray,
                task_domain: KeyDomain | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per row: (histogram index, task, the value sent per query (0: no call), encoded): what the
    browsers are asked under ``params`` (see :func:`schedule`)."""
    n = len(rows)
    index = domain.slice_index({c: rows[c].to_numpy() for c in params.slice_columns})
    if params.conversion_slice_columns:
        if task_domain is None:
            raise InvalidInput("conversion-side slices need a task domain")
        task = task_domain.slice_index({c: rows[c].to_numpy() for c in params.conversion_slice_columns})
    else:
        task = np.zeros(n, dtype=np.int64)
    encoded = (index >= 0) & (task >= 0)
    values = rows[list(params.value_columns)].to_numpy(dtype=np.float64) if params.value_columns else np.zeros((n, 0))
    sent = encoded_values(params, values, np.asarray(uniforms, dtype=np.float64).reshape(n, len(params.queries)))
    sent[~encoded] = 0
    return index, task, sent, encoded


def schedule_calls(rows: pd.DataFrame, index: np.ndarray, task: np.ndarray, sent: np.ndarray,
                   encoded: np.ndarray) -> Schedule:
    """The browsers' events for ``rows`` whose calls :func:`encode_rows` decided (``sent``: (n, queries),
    one ``measureConversion`` per positive entry, in column order), possibly under several parameter
    sets (each row's own columns of ``sent``)."""
    if IMPRESSION_TIME_US not in rows:
        raise InvalidInput("the Attribution API needs impression_time (it decides the epochs): the log has none")
    imp_ms = rows[IMPRESSION_TIME_US].to_numpy(dtype=np.int64) // 1000
    conv_ms = rows[CONVERSION_TIME_US].to_numpy(dtype=np.int64) // 1000
    if (conv_ms < imp_ms).any():
        raise InvalidInput(f"{int((conv_ms < imp_ms).sum())} rows convert before their impression_time")
    rows_in = np.flatnonzero(encoded)
    ids = (rows[BROWSER_ID].to_numpy() if BROWSER_ID in rows else rows[IMPRESSION_ID].to_numpy())[rows_in]
    codes, browsers = browser_codes(ids)
    pair = _impression_pairs(codes, rows[IMPRESSION_ID].to_numpy()[rows_in])
    # codes come in order of first appearance: a position is its impression's first row iff its code is new
    first = np.flatnonzero(pair > np.maximum.accumulate(np.concatenate([[-1], pair[:-1]])))
    pair_browser = codes[first]
    ordinal_of_pair = pd.Series(pair_browser).groupby(pair_browser).cumcount().to_numpy()
    # The events by browser, then time; ties: impressions (by first row) before conversions (by row, then
    # query), i.e. lexsort((query, row, kind, time, browser)). Two stable sorts on one (browser, time) key,
    # of the impressions and of the rows, then a merge: a row's calls follow it in query order.
    first_row = rows_in[first]
    imp_key, row_key = _browser_time_keys(codes, pair_browser, imp_ms[first_row], conv_ms[rows_in])
    by_imp = np.argsort(imp_key, kind="stable")
    by_row = np.argsort(row_key, kind="stable")
    imp_key, row_key, row_in_order = imp_key[by_imp], row_key[by_row], rows_in[by_row]
    calls = (sent > 0)[row_in_order]  # (m, queries), rows in event order (compare, then gather bytes)
    call_pos, call_q = np.nonzero(calls)
    calls_before = np.concatenate([[0], np.cumsum(calls.sum(axis=1))])
    imp_at = np.arange(len(by_imp)) + calls_before[np.searchsorted(row_key, imp_key, side="left")]
    conv_at = np.arange(len(call_pos)) + np.searchsorted(imp_key, row_key, side="right")[call_pos]
    n_events = len(imp_at) + len(conv_at)
    row_of = row_in_order[call_pos]
    browser = np.empty(n_events, dtype=np.int64)
    browser[imp_at], browser[conv_at] = pair_browser[by_imp], codes[by_row][call_pos]
    kind = np.ones(n_events, dtype=np.int8)
    kind[imp_at] = 0
    row = np.empty(n_events, dtype=rows_in.dtype)
    row[imp_at], row[conv_at] = first_row[by_imp], row_of
    query = np.zeros(n_events, dtype=np.int64)
    query[conv_at] = call_q
    time_ms = np.empty(n_events, dtype=np.int64)
    time_ms[imp_at], time_ms[conv_at] = imp_ms[first_row[by_imp]], conv_ms[row_of]
    event_pair = np.empty(n_events, dtype=np.int64)
    event_pair[imp_at], event_pair[conv_at] = by_imp, pair[by_row][call_pos]
    is_start = np.concatenate([[True], browser[1:] != browser[:-1]]) if n_events else np.zeros(0, bool)
    index_of = np.arange(n_events)
    position = index_of - np.maximum.accumulate(np.where(is_start, index_of, 0))  # position within the browser
    shifted = time_ms - position  # t_i = max(t_i, t_{i-1} + 1) is i + the running max of t_j - j within the browser
    low, span = int(shifted.min(initial=0)), int(shifted.max(initial=0)) - int(shifted.min(initial=0)) + 1
    if len(browsers) * span < 2**62:  # browsers ascending: offsetting by browser x span restarts the max per browser
        offset = browser * span
        moved = np.maximum.accumulate(offset + (shifted - low)) - offset + low + position
    else:
        moved = pd.Series(shifted).groupby(browser).cummax().to_numpy() + position
    saved_at = np.empty(len(first), dtype=np.int64)
    saved_at[by_imp] = moved[imp_at]
    return Schedule(browser, kind, row, query, moved, ordinal_of_pair[event_pair], saved_at[event_pair],
                    first_row[event_pair], index, task, sent, encoded, np.asarray(browsers))


def browser_codes(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(code per row in order of first appearance, each code's id): browsers told apart by their
    canonical id (``araopt.io.ids``: "007", "7" and 7 are one browser, as the grouping step's shard
    hash has it), each named by the first spelling it appears under. Told apart by their spelling, one
    browser's rows would be two browsers with a budget each."""
    codes, _ = pd.factorize(canonical_id_hash(ids))
    codes = codes.astype(np.int64)
    first = np.flatnonzero(codes > np.maximum.accumulate(np.concatenate([[-1], codes[:-1]])))  # a new code is the next
    return codes, np.asarray(ids)[first]


def _impression_pairs(codes: np.ndarray, impressions: np.ndarray) -> np.ndarray:
    """Codes of the distinct (browser, impression) pairs in order of first appearance: the impression's
    own code when each impression has one browser (the usual log), else a factorization of the pairs."""
    impression_codes = pd.factorize(impressions)[0].astype(np.int64)
    browser_of = np.empty(int(impression_codes.max(initial=-1)) + 1, dtype=np.int64)
    browser_of[impression_codes[::-1]] = codes[::-1]  # the last write wins: each impression's first browser
    if (browser_of[impression_codes] == codes).all():
        return impression_codes
    pair: np.ndarray = pd.factorize(codes * (int(impression_codes.max(initial=0)) + 1) + impression_codes)[0]
    return pair.astype(np.int64)


def _browser_time_keys(codes: np.ndarray, pair_browser: np.ndarray, imp_ms: np.ndarray,
                       conv_ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One int64 key per impression and per row ordering them by (browser, time): browser x span + time,
    with the times replaced by their ranks when that would overflow."""
    times = np.concatenate([imp_ms, conv_ms])
    low, span = int(times.min(initial=0)), int(times.max(initial=0)) - int(times.min(initial=0)) + 1
    browsers = int(codes.max(initial=0)) + 1
    if browsers * span >= 2**62:
        distinct, times = np.unique(times, return_inverse=True)
        low, span = 0, len(distinct)
    else:
        times = times - low
    return pair_browser * span + times[:len(imp_ms)], codes * span + times[len(imp_ms):]


@dataclass
class BrowserStream:
    """One browser's events (the spec's end-to-end format) and, per ``measureConversion``, its query
    index, task (conversion-side slice) and log row."""

    browser: Any
    events: list[dict[str, Any]] = field(default_factory=list)
    reports: list[tuple[int, int, int]] = field(default_factory=list)


def encode(params: AttributionParams, rows: pd.DataFrame, domain: KeyDomain, uniforms: np.ndarray,
           task_domain: KeyDomain | None = None) -> tuple[list[BrowserStream], np.ndarray]:
    """The browsers' event streams for ``rows`` (see :func:`schedule`), and the mask of rows encoded."""
    plan = schedule(params, rows, domain, uniforms, task_domain)
    return streams(plan, rows, (params,), (domain.num_slices,), np.zeros(len(rows), dtype=np.int64)), plan.encoded


def streams(plan: Schedule, rows: pd.DataFrame, params: Sequence[AttributionParams], histogram_sizes: Sequence[int],
            row_set: np.ndarray) -> list[BrowserStream]:
    """Every browser's events of ``plan`` in the spec's end-to-end format, each row's calls made with
    the parameters of its set (``row_set``: index into ``params`` and ``histogram_sizes``)."""
    imp_sites = rows[IMPRESSION_SITE].to_numpy() if IMPRESSION_SITE in rows else None
    conv_sites = rows[CONVERSION_SITE].to_numpy() if CONVERSION_SITE in rows else None
    out = [BrowserStream(b) for b in plan.browsers.tolist()]
    for b, kind, r, qi, t, ordinal in zip(plan.browser.tolist(), plan.kind.tolist(), plan.row.tolist(),
                                          plan.query.tolist(), plan.time_ms.tolist(), plan.ordinal.tolist(), strict=True):
        stream = out[b]
        p = params[int(row_set[r])]
        if kind == 0:
            stream.events.append({
                "event": "saveImpression", "seconds": t / 1000,
                "site": DEFAULT_IMPRESSION_SITE if imp_sites is None else str(imp_sites[r]),
                "options": {"histogramIndex": int(plan.index[r]), "matchValue": ordinal,
                            "lifetimeDays": p.lookback_days}})
            continue
        q = p.queries[qi]
        stream.events.append({
            "event": "measureConversion", "seconds": t / 1000,
            "site": DEFAULT_CONVERSION_SITE if conv_sites is None else str(conv_sites[r]),
            "options": {"aggregationService": DEFAULT_AGGREGATION_SERVICE, "epsilon": q.epsilon,
                        "histogramSize": histogram_sizes[int(row_set[r])], "value": int(plan.sent[r, qi]),
                        "maxValue": q.max_value, "lookbackDays": p.lookback_days, "matchValues": [ordinal],
                        "credit": list(p.credit)},
            "query": q.name, "task": int(plan.task[r])})
        stream.reports.append((qi, int(plan.task[r]), r))
    return out


def to_case(stream: BrowserStream, config: BrowserConfig, epoch_start: float, credit_fraction: float) -> dict[str, Any]:
    """A browser's stream as one case of the spec's end-to-end format (one line of ``events.jsonl``):
    ``config`` holds the browser's limits, its per-site budget, epoch length and the random draws of
    the instance (``epochStart``, ``fairlyAllocateCreditFraction``); each ``measureConversion`` also
    carries ``"query"`` and ``"task"``, which the reference ignores."""
    return {"config": {**config.to_e2e(), "epochStart": epoch_start, "fairlyAllocateCreditFraction": credit_fraction},
            "events": stream.events}


def browser_config(params: AttributionParams, histogram_size: int) -> BrowserConfig:
    """The browsers' configuration for ``params``: its per-site budget and epoch; the safety limits at
    their default multiples of the per-site budget (global 8x, impression-site quota 4x; at most the
    stores' 2^32 - 1 microepsilons)."""
    budget = params.budget_micro
    return BrowserConfig(per_site_budget=budget, global_budget_per_epoch=min(8 * budget, MAX_UNSIGNED_LONG),
                         impression_site_quota_per_epoch=min(4 * budget, MAX_UNSIGNED_LONG), epoch_days=params.epoch_days,
                         max_histogram_size=max(histogram_size, 1))


def simulate(stream: BrowserStream, config: BrowserConfig, epoch_start: float,
             credit_random: Callable[[], float]) -> tuple[list[tuple[int, int, tuple[int, ...], bool]], Browser]:
    """Replay a browser's stream: per ``measureConversion`` (query, task, histogram, refused for
    budget), and the browser (its budget ledgers)."""
    browser = Browser(config, epoch_start, credit_random)
    out = []
    reports = iter(stream.reports)
    for ev in stream.events:
        now = event_time_ms(ev["seconds"])
        if ev["event"] == "saveImpression":
            browser.save_impression(now, ev["site"], None, ev["options"])
        else:
            q, task, _ = next(reports)
            outcome = browser.measure_conversion(now, ev["site"], None, ev["options"])
            out.append((q, task, outcome.histogram, outcome.budget_refused))
    return out, browser


def unnoised_sums(params: AttributionParams, outcomes: Sequence[tuple[int, int, tuple[int, ...], bool]],
                  histogram_size: int) -> Mapping[tuple[str, int], np.ndarray]:
    """Per (query, task): the sum of the browsers' histograms (what the aggregation service sums
    before it adds noise)."""
    sums: dict[tuple[str, int], np.ndarray] = {}
    for q, task, histogram, _ in outcomes:
        key = (params.queries[q].name, task)
        acc = sums.setdefault(key, np.zeros(histogram_size, dtype=np.int64))
        acc += np.asarray(histogram, dtype=np.int64)
    return sums


def calls_json(params: AttributionParams, domain: KeyDomain) -> dict[str, Any]:
    """What the ad servers and the pages call (``export-attribution``'s calls.json): the saveImpression
    options per impression and the measureConversion options of each query, in call order."""
    config = browser_config(params, domain.num_slices)
    return {
        "params_format": PARAMS_FORMAT, "layout_sha256": domain.layout_checksum(),
        "saveImpression": {
            "histogramIndex": f"the impression's row of {outputs.HISTOGRAM_LAYOUT_CSV} (its values of "
                              f"{', '.join(params.slice_columns) or 'no slice column'})",
            "matchValue": "an id the conversion site can name in matchValues (export: the impression's ordinal "
                          "within its browser)",
            "lifetimeDays": params.lookback_days, "priority": 0,
            "conversionSites": "the advertiser sites that may measure it (export: omitted, every site)"},
        "measureConversion": [
            {"query": q.name, "column": q.column, "epsilon": q.epsilon, "maxValue": q.max_value, "clip": q.clip,
             "value_scale": q.value_scale,
             "value": ("1" if q.column is None else
                       f"RR({q.value_scale:g} * min({q.column}, {q.clip:g})): randomized rounding to an integer "
                       f"(eq. 2); no call when it is 0"),
             "histogramSize": domain.num_slices, "lookbackDays": params.lookback_days,
             "credit": list(params.credit), "aggregationService": dict(config.aggregation_services)}
            for q in params.queries],
        "conversion_slice_columns": list(params.conversion_slice_columns),
        "browser_config": config.to_e2e(),
    }
