"""What a main release keeps after count-limit moves: the expected kept share of a day's conversions
given the count limits of the days before it (ContributionCapping, Alg. 1, over the impression's life).

Alg. 1 charges each conversion at the count limit of the release that used it (its day's): L-inf
costs floor(Gamma / C_d) (Lemma 4.1), a conversion is kept when it fits the impression's remaining
budget and the report limit. Under one count limit C all along, an impression of n conversions keeps
its first min(n, K(C)) (``bounding.kept_per_impression``): the retention curve's r(K). After a move
the conversions charged at the old count limit stay charged: a release keeps another share until they
age out of the attribution window (a move up keeps less than r(K), a move down more, at first).

The days before a schedule's first release were released by none of them: the release path costs
such a conversion at the dearest of every known configuration and today's (``mechanism.lifetime``:
the upper end of its interval), so here they cost floor(Gamma / C) at the schedule's lowest count
limit. A single release below every count limit before it (a probe) therefore charges every such
conversion at its own count limit until they age out of the window, whatever the releases after it. When the measurement's
start is known (``start_offset``: the days from it to the schedule's first entry;
``lifetime.ReleaseHistory.start_us``), the conversions before it registered no contribution and cost
nothing (the days between it and the schedule, released at count limits the schedule does not list,
cost its lowest): every release in the 30 days after the start keeps more than r(K), arms included.

The model. An impression's n conversions fall independently over the ``spread_days`` after it (ARA's
attribution window), uniformly (``delay_days`` None) or by an exponential law of mean ``delay_days``
truncated to the window (the releases show the delays only through how fast a move settles:
``private_model.delay_law`` chooses among ``DELAY_LAWS`` by that); impressions start uniformly in time. Per
impression size n, ``kept_table`` is the expected number of its conversions kept *given that each falls
on the target day*: sum_j P(j kept | j on the target day), by Monte Carlo over the impression's
conversion times with conversion j placed on the target day (every conversion contributes: no draw is
wasted on conversions of other days), common random numbers over every schedule and size (a model
computation seeded by a constant: not privacy noise). Under a constant schedule it is min(n, K)
exactly. A curve's kept share on the target day is then ``weights @ kept_table`` (its conversion-
normalised mixture weights, ``optimize.retention``): r(K) for a settled schedule.
"""
from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from araopt.constants import CONTRIBUTION_BUDGET, MAX_REPORTS_PER_SOURCE, MAX_SOURCE_LIFE_DAYS

SPREAD_DAYS = MAX_SOURCE_LIFE_DAYS
"""Days after its impression within which an impression's conversions fall (ARA's default attribution
window); the transient and the pseudo-history both use it."""
DELAY_LAWS: tuple[float | None, ...] = (None, 1.0, 3.0, 7.0, 15.0)
"""The delay laws the tuner chooses among: uniform over the window (None), exponential means in days."""
SIZES = (*range(1, 25), 28, 32, 40, 48, 64, 96, 128)
"""Impression sizes simulated; the table is interpolated linearly between them and held beyond the last
(an impression of 128 conversions has long used its budget at any count limit up to the report limit)."""
DRAWS = 4096
"""Simulated (impression, conversion) pairs per size (at least 16 impressions)."""
SEED = 20_260_005
"""The model's Monte-Carlo seed (common random numbers: every schedule sees the same draws)."""


def _check_law(delay_days: float | None) -> None:
    if delay_days is not None and not delay_days > 0:
        raise ValueError(f"a delay law needs a positive mean, got {delay_days!r}")


def delays(u: np.ndarray, spread_days: int, delay_days: float | None) -> np.ndarray:
    """Delays (days after the impression) of uniform draws ``u`` in [0, 1): uniform over the window, or
    exponential of mean ``delay_days`` truncated to it (inverse CDF)."""
    _check_law(delay_days)
    if delay_days is None:
        return np.asarray(u * spread_days, dtype=np.float64)
    return np.asarray(-delay_days * np.log1p(-u * -np.expm1(-spread_days / delay_days)), dtype=np.float64)


@lru_cache(maxsize=16)
def _draws(spread_days: int, delay_days: float | None = None) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """Per size n of ``SIZES``: (day, rows) with day (M, n, n) int the day (relative to the target day,
    -spread_days..0, or 1 after it) of conversion i when conversion j falls on the target day, for M
    impressions (sorted delays over the window by the law, a uniform phase within the target day)."""
    rng = np.random.default_rng(SEED)
    out = []
    for n in SIZES:
        m = max(16, DRAWS // n)
        times = np.sort(delays(rng.random((m, n)), spread_days, delay_days), axis=1)  # (M, n) after the impression
        phase = rng.random((m, n))  # conversion j at phase within the target day
        start = phase - times  # (M, j): the impression's start placing j on the target day
        day = np.floor(start[:, :, None] + times[:, None, :]).astype(np.int64)  # (M, j, i)
        out.append((np.clip(day, -spread_days, 1), np.arange(n)))
    return tuple(out)


def kept_table(schedule: Sequence[int], spread_days: int = SPREAD_DAYS, contribution_budget: int = CONTRIBUTION_BUDGET,
               max_reports: int = MAX_REPORTS_PER_SOURCE, max_size: int = 256, delay_days: float | None = None,
               start_offset: int | None = None) -> np.ndarray:
    """(max_size,) the expected kept conversions per impression of each size (1..max_size) given each
    falls on the target day, under the count limits ``schedule`` of the days up to and including the
    target day (last entry; days before the first entry: the schedule's lowest, as the release path
    costs a conversion no recorded release used; with ``start_offset``, the days from the measurement's
    start to the first entry, nothing before that start), the delays by ``delay_days``'s law. See the
    module docstring."""
    limits = np.asarray(schedule, dtype=np.int64)
    if limits.size == 0 or np.any(limits < 1):
        raise ValueError(f"a schedule needs count limits >= 1, got {schedule!r}")
    _check_law(delay_days)
    if start_offset is not None and start_offset < 0:
        raise ValueError(f"a measurement's start is before the schedule's first entry, got offset {start_offset}")
    missing = max(0, spread_days + 1 - len(limits))
    charged = missing if start_offset is None else min(missing, start_offset)
    # older to newer: the days before the start (count limit 0: free), then those between it and the schedule
    past = np.concatenate([np.zeros(missing - charged, dtype=np.int64), np.full(charged, limits.min()),
                           limits])[-(spread_days + 1):]
    return _table(tuple(int(x) for x in past), spread_days, contribution_budget, max_reports, max_size,
                  delay_days).copy()


def release_table(limits: Sequence[int], release: int, max_size: int, delay_days: float | None = None,
                  spread_days: int = SPREAD_DAYS, start_offset: int | None = None) -> np.ndarray:
    """``kept_table`` of the ``release``-th of daily releases at count limits ``limits`` (time order): the
    count limits of the ``spread_days`` before it and its own (``start_offset``: the days from the
    measurement's start to the first of ``limits``)."""
    return kept_table(limits[max(0, release - spread_days):release + 1], spread_days, max_size=max_size,
                      delay_days=delay_days, start_offset=start_offset if release - spread_days < 0 else None)


@lru_cache(maxsize=4096)
def _table(past: tuple[int, ...], spread_days: int, contribution_budget: int, max_reports: int, max_size: int,
           delay_days: float | None) -> np.ndarray:
    """``kept_table`` of the window's count limits (memoised: a pure function of its arguments, and every
    tuning day reads the same past days again)."""
    limits = np.asarray(past, dtype=np.int64)
    sizes = np.arange(1, max_size + 1, dtype=np.float64)
    if np.all(limits == limits[-1]):  # settled: Alg. 1 keeps the first K of every impression
        k = contribution_budget // (contribution_budget // int(limits[-1]))
        return np.minimum(sizes, float(min(k, max_reports)))
    # L-inf: floor(Gamma / C_d), days -spread..0 (count limit 0: a day before the measurement, free)
    cost = np.where(limits > 0, contribution_budget // np.maximum(limits, 1), 0).astype(np.int64)
    cost = np.concatenate([cost, [0]])  # day 1 (after the target day): never reached before j
    values = []
    for (day, _), n in zip(_draws(spread_days, delay_days), SIZES, strict=True):
        c = cost[day + spread_days]  # (M, j, i) the cost of conversion i
        used = np.zeros(c.shape[:2], dtype=np.int64)
        reports = np.zeros(c.shape[:2], dtype=np.int64)
        kept_j = np.zeros(c.shape[:2], dtype=bool)
        for i in range(n):  # Alg. 1 in time order, for every (impression, j) at once
            # only the placements j >= i still wait for their own conversion j: the earlier ones are decided
            cost_i, used_i, reports_i = c[:, i:, i], used[:, i:], reports[:, i:]
            take = (used_i + cost_i <= contribution_budget) & (reports_i < max_reports)
            used_i += cost_i * take  # views: updates used and reports in place
            reports_i += take & (cost_i > 0)  # a free conversion (before the measurement) is no report
            kept_j[:, i] = take[:, 0]  # placement j = i: is its own conversion kept
        values.append(float(kept_j.mean(axis=0).sum()))
    return np.asarray(np.interp(sizes, np.asarray(SIZES, dtype=np.float64), np.asarray(values)), dtype=np.float64)


def kept_share(weights: np.ndarray, schedule: Sequence[int], spread_days: int = SPREAD_DAYS,
               delay_days: float | None = None) -> np.ndarray:
    """Each curve's (rows of conversion-normalised ``weights``) expected kept share of the target day's
    conversions under ``schedule`` (``kept_table``): r(K) when the schedule is settled."""
    w = np.atleast_2d(np.asarray(weights, dtype=np.float64))
    return np.asarray(w @ kept_table(schedule, spread_days, max_size=w.shape[1], delay_days=delay_days),
                      dtype=np.float64)
