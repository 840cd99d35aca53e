"""Replay: what each tuning method would have released, day by day, on a joined daily log.

For every replayed day, in order, each method measures the day (the mechanism in simulation mode:
Alg. 3 / 6, Alg. 1 with the impressions' earlier conversions as lookback, Alg. 2, Alg. 4) with the
parameters it chose from what it was allowed to see before that day, and its released estimates are
scored against the day's true totals over the declared domain (RMSRE_tau, Def. 3.2, with taus fixed
for the whole replay from first-party values before its first day). Each method's lookback rows cost
what its own earlier replayed releases spent (their count limits and arm plans; the days before the
first replayed day were never released: any of them, or today's); see ``mechanism.lifetime``. With
``ReplayConfig.fresh_start`` the measurement begins on the first replayed day instead: a conversion
before it registered no contribution and costs nothing, for every method alike.

- ``private_safe``: privacy-safe tuning (``optimize.private``) on its own previous releases and the
  advertiser's first-party conversions; day 1 is the cold start; its public count-limit schedule
  probes other count limits on some days (``count_limit_probe``).
- ``fully_informed``: the nightly tuning on the raw joined history of the ``window_days`` before the
  day (Alg. 5 for a one-day release, calibrated and backtested on the window).
- ``cold_start``: the privacy-safe mode's day-1 rule every day (L-inf at its default count limit,
  clips at the first-party values' 95% quantile of the window before the day, uncorrected): what
  the privacy-safe tuner must never do worse than.
- ``baseline_q95``, ``baseline_q99``: the Sec. 5.1 baselines on the same raw window.

The replay reads the joined log (it needs the truth): it is an operator-private backtest, never a
release, and its noise is seeded (simulation).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from araopt.constants import MAX_COUNT_LIMIT, Objective
from araopt.errors import InvalidInput, InvalidParameters
from araopt.evaluation.metrics import realised_relative_bias, realised_rmsre_tau
from araopt.io.conversions import Conversions
from araopt.io.rowset import hashed_row_ids
from araopt.mechanism.exploration import Exploration, default_exploration
from araopt.mechanism.keys import KeyDomain
from araopt.mechanism.lifetime import ReleaseHistory
from araopt.mechanism.params import Params
from araopt.mechanism.report import queries_without_signal
from araopt.optimize.private import (
    DAY_US,
    FirstParty,
    ReleaseRecord,
    cold_start,
    first_party_taus,
    private_tune,
)
from araopt.optimize.statistics import StatisticsSpec
from araopt.optimize.tune import TuningResult
from araopt.optimize.workflow import AraTuning, InMemoryBackend, TuneCandidates, tune_and_calibrate
from araopt.release_workflow import InMemoryReleaseBackend, ReleaseSpec, release_and_publish
from araopt.version import ParameterVersion

PRIVATE_SAFE = "private_safe"
FULLY_INFORMED = "fully_informed"
BASELINE_Q95 = "baseline_q95"
BASELINE_Q99 = "baseline_q99"
COLD_START = "cold_start"
METHODS = (PRIVATE_SAFE, COLD_START, FULLY_INFORMED, BASELINE_Q95, BASELINE_Q99)


@dataclass(frozen=True)
class ReplayConfig:
    """What to replay: ``epsilon`` per release, the raw window the fully informed tuner sees, the
    lookback of Alg. 1 (an impression's earlier conversions), the privacy-safe mode's arms, and the
    simulation seed of the mechanism's noise and rounding."""

    epsilon: float
    window_days: int = 9
    lookback_days: int = 30
    days: int | None = None
    exploration: Exploration = field(default_factory=default_exploration)
    max_count_limit: int = MAX_COUNT_LIMIT
    seed: int = 0
    fresh_start: bool = False
    """The advertiser starts measuring on the first replayed day: conversions before it registered no
    contribution (``ReleaseHistory.start_us``), and the privacy-safe tuner knows its records begin there.
    False: they may have cost any configuration a method released (the release path's rule when the
    start is unknown)."""

    def __post_init__(self) -> None:
        if self.window_days < 1 or self.lookback_days < 0 or (self.days is not None and self.days < 1):
            raise InvalidParameters(f"replay needs window_days >= 1, lookback_days >= 0 and days >= 1, got {self}")


@dataclass(frozen=True)
class DailyLog:
    """A joined conversion log cut into UTC conversion days (days since the epoch)."""

    conversions: Conversions
    day: np.ndarray

    @classmethod
    def of(cls, conversions: Conversions) -> DailyLog:
        log = conversions.with_in_period(None)
        log.record_keys()  # hashed once for the whole log: every window (a subset) carries its rows' keys
        log.impression_sort_keys()
        return cls(log, np.floor_divide(conversions.conversion_time, DAY_US).astype(np.int64))

    @property
    def days(self) -> np.ndarray:
        return np.unique(self.day)

    def window(self, first: int, last: int, lookback_days: int) -> Conversions:
        """Days [first, last] as the period; the ``lookback_days`` before them as lookback rows of the
        period's impressions (the only earlier rows that change a period row's rank in Alg. 1)."""
        period = (self.day >= first) & (self.day <= last)
        before = (self.day >= first - lookback_days) & (self.day < first)
        keys = self.conversions.impression_sort_keys()  # integers equal exactly where the canonical ids are
        before &= np.isin(keys, keys[period])
        rows = np.flatnonzero(period | before)
        return self.conversions.take(rows).with_in_period(period[rows])

    def first_party(self, first: int, last: int | None = None) -> FirstParty:
        """What the advertiser knows of days [first, last] without the impression join: its conversions'
        values (their count and sums)."""
        last = first if last is None else last
        rows = (self.day >= first) & (self.day <= last)
        return FirstParty.of(str(np.datetime64(int(last), "D")), self.conversions.values[rows])


def true_totals(conversions: Conversions, domain: KeyDomain) -> np.ndarray:
    """Count and value sums of the period's conversions per declared slice (m, d + 1)."""
    period = conversions.period_mask()
    index = domain.slice_index({c: np.asarray(v)[period] for c, v in conversions.slices.items()})
    inside = index >= 0
    columns: list[np.ndarray] = [np.bincount(index[inside], minlength=domain.num_slices).astype(np.float64)]
    values = conversions.values[period][inside]
    columns += [np.bincount(index[inside], weights=values[:, j], minlength=domain.num_slices)
                for j in range(values.shape[1])]
    return np.column_stack(columns)


@dataclass(frozen=True)
class _Released:
    estimate: np.ndarray
    low: np.ndarray | None
    high: np.ndarray | None
    without_signal: tuple[str, ...] = ()  # the release's queries_without_signal (mechanism.report)


def _released(conversions: Conversions, version: ParameterVersion, domain: KeyDomain, seed: int,
              earlier: list[tuple[Params, np.ndarray]] | None = None,
              start_us: int | None = None) -> tuple[_Released, Any]:
    """The day's published estimates (of the true totals when the version is calibrated) and the release.
    ``earlier``: the method's earlier replayed releases (parameters, released row ids): the lookback
    rows cost what those releases spent (Alg. 1 over the impression's life); this day is added to it.
    ``start_us``: the measurement's start (lookback rows before it cost nothing)."""
    history = (None if earlier is None and start_us is None
               else ReleaseHistory.of(earlier or [], start_us=start_us))
    publication = release_and_publish(InMemoryReleaseBackend(conversions),
                                      ReleaseSpec(version, simulation_seed=seed, history=history), domain)
    release = publication.release
    if earlier is not None:
        period = conversions.period_mask()
        earlier.append((version.params, hashed_row_ids(conversions.id_hashes()[period],
                                                       conversions.conversion_time[period])))
    frame = publication.frame()
    shape = release.estimates.estimate.shape
    point = frame["estimate"].to_numpy().reshape(shape)
    silent = tuple(queries_without_signal(release.estimates))
    if publication.corrected is None:
        return _Released(point, None, None, silent), release
    return _Released(point, frame["ci_low"].to_numpy().reshape(shape),
                     frame["ci_high"].to_numpy().reshape(shape), silent), release


def _fully_informed(log: DailyLog, day: int, config: ReplayConfig, spec: StatisticsSpec, taus: np.ndarray
                    ) -> TuningResult:
    train = log.window(day - config.window_days, day - 1, config.lookback_days)
    choose = TuneCandidates(config.epsilon, {
        "objective": Objective.CORRECTED, "taus": list(taus), "release_period_days": 1.0, "history_days": config.window_days,
        "max_count_limit": config.max_count_limit, "slice_columns": spec.slice_columns})
    return tune_and_calibrate(InMemoryBackend(train), spec, AraTuning(choose, 1.0))


def _row(day: int, method: str, version: ParameterVersion | Params, released: _Released, truth: np.ndarray,
         taus: np.ndarray, query_names: Sequence[str]) -> dict[str, Any]:
    params = version.params if isinstance(version, ParameterVersion) else version
    realised = realised_rmsre_tau(released.estimate, truth, taus)
    per_query = realised.per_query
    row: dict[str, Any] = {"day": str(np.datetime64(int(day), "D")), "method": method,
                           "rmsre_tau": realised.combined, "count_limit": params.count_limit,
                           "encoding": params.encoding,
                           "exploration_share": 0.0 if params.exploration is None else params.exploration.total_share}
    for name, value in zip(query_names, per_query, strict=True):
        row[f"rmsre_tau_{name}"] = float(value)
    for name, value in zip(query_names, realised_relative_bias(released.estimate, truth, taus), strict=True):
        row[f"bias_{name}"] = float(value)  # the part of the error shared by the slices
    for query in params.queries:
        row[f"clip_{query.column}"] = query.clip_threshold
    row["calibrated"] = released.low is not None
    row["without_signal"] = ";".join(released.without_signal)  # what the release says it holds no signal for
    low, high = released.low, released.high
    for j, name in enumerate(query_names):  # coverage says nothing without the width it is bought with
        has = truth[:, j] > 0
        row[f"coverage_{name}"] = (float(np.mean((low[:, j] <= truth[:, j]) & (truth[:, j] <= high[:, j])))
                                   if low is not None and high is not None else float("nan"))
        row[f"interval_width_{name}"] = (float(np.median((high[has, j] - low[has, j]) / truth[has, j]))
                                         if low is not None and high is not None and has.any() else float("nan"))
    if isinstance(version, ParameterVersion) and version.provenance is not None:
        row["predicted_rmsre_tau"] = version.provenance.predicted_rmsre_tau
        extra = version.provenance.extra
        schedule = extra.get("count_limit_schedule")
        if isinstance(schedule, dict):  # privacy-safe tuning: whether the day probed another count limit
            row["count_limit_probe"] = str(schedule.get("decision", "")).startswith("probe")
        robust = extra.get("robust_prediction")
        if isinstance(robust, dict):  # privacy-safe tuning: which candidate it published, and why
            row["candidate"] = f"{robust.get('candidate')} ({robust.get('correction')})"
        if "predicted_without_signal" in extra:  # privacy-safe tuning: what it predicted the release would say
            row["predicted_without_signal"] = ";".join(str(q) for q in extra["predicted_without_signal"])
        if "model_check" in extra:
            row["model_check_fallback"] = str(extra["model_check"]).startswith("fallback")
        retention = extra.get("slice_retention")
        if isinstance(retention, dict):
            row["slices_identified"] = bool(retention.get("identified"))
    return row


def replay(conversions: Conversions, domain: KeyDomain, config: ReplayConfig,
           progress: Callable[[str], None] | None = None) -> pd.DataFrame:
    """One row per (replayed day, method) with RMSRE_tau (combined and per query), the parameters used,
    the share of impressions spent on exploration and the coverage of the released intervals of the
    true totals. Replayed days: the last ``config.days`` days of the log (default every day with
    ``window_days`` days before it)."""
    log = DailyLog.of(conversions)
    all_days = log.days
    if len(all_days) == 0:
        raise InvalidInput("the log has no conversions to replay")
    first_day = int(all_days[0])
    candidates = [int(d) for d in all_days if d - config.window_days >= first_day]
    if config.days is not None:
        candidates = candidates[-config.days:]
    if not candidates:
        raise InvalidInput(f"the log spans {int(all_days[-1]) - first_day + 1} day(s): replaying needs more than "
                         f"--window-days={config.window_days} days of history before the first replayed day")
    before = log.first_party(candidates[0] - config.window_days, candidates[0] - 1)
    if len(before.values) == 0:
        raise InvalidInput("no conversions before the first replayed day to fix the taus and the cold start")
    taus = np.asarray(first_party_taus(before.values), dtype=np.float64)
    spec = StatisticsSpec(domain.slice_columns, tuple(conversions.value_columns), max_count_limit=config.max_count_limit)
    baseline_domain = dataclasses.replace(domain, baseline=True)
    query_names = ("count", *conversions.value_columns)
    records: list[ReleaseRecord] = []
    rows: list[dict[str, Any]] = []
    earlier: dict[str, list[tuple[Params, np.ndarray]]] = {}  # per method: its replayed releases
    start = int(candidates[0]) * DAY_US if config.fresh_start else None
    if progress is not None:
        progress(f"replaying {len(candidates)} day(s), {np.datetime64(candidates[0], 'D')} to "
                 f"{np.datetime64(candidates[-1], 'D')} ({config.window_days}-day window, "
                 f"{config.lookback_days}-day lookback)")
    for number, day in enumerate(candidates):
        test = log.window(day, day, config.lookback_days)
        truth = true_totals(test, domain)
        seed = config.seed * 1_000_003 + day
        if records:
            private = private_tune(records, config.epsilon, domain, conversions.value_columns,
                                   window=config.window_days, max_count_limit=config.max_count_limit,
                                   exploration=config.exploration, taus=taus.tolist()).version
        else:
            private = cold_start(before, config.epsilon, domain, conversions.value_columns, config.exploration)
        released, release = _released(test, private, domain, seed, earlier.setdefault(PRIVATE_SAFE, []), start)
        record = ReleaseRecord.of(release, log.first_party(day))
        # the measurement's start is the first replayed day (its lookback cost nothing: ``start``)
        records.append(dataclasses.replace(record, days_since_start=None if start is None else number))
        rows.append(_row(day, PRIVATE_SAFE, private, released, truth, taus, query_names))

        cold = cold_start(log.first_party(day - config.window_days, day - 1), config.epsilon, domain,
                          conversions.value_columns, config.exploration)
        released, _ = _released(test, cold, domain, seed, start_us=start)
        rows.append(_row(day, COLD_START, cold, released, truth, taus, query_names))

        informed = _fully_informed(log, day, config, spec, taus)
        released, _ = _released(test, informed.version, domain, seed, earlier.setdefault(FULLY_INFORMED, []), start)
        rows.append(_row(day, FULLY_INFORMED, informed.version, released, truth, taus, query_names))
        for baseline in informed.baselines:
            released, _ = _released(test, ParameterVersion(baseline.params, domain=baseline_domain), baseline_domain, seed,
                                    earlier.setdefault(baseline.name, []), start)
            rows.append(_row(day, baseline.name, baseline.params, released, truth, taus, query_names))
        if progress is not None:
            got = {r["method"]: r["rmsre_tau"] for r in rows if r["day"] == rows[-1]["day"]}
            progress(f"day {number + 1}/{len(candidates)} {rows[-1]['day']}: "
                     + ", ".join(f"{m} {v:.4f}" for m, v in got.items()))
    return pd.DataFrame(rows)


def summary(frame: pd.DataFrame, last: int = 14) -> dict[str, float]:
    """Over the last ``last`` replayed days: the median of private_safe / fully_informed RMSRE_tau (and
    / cold_start), the share of days private_safe is below both baselines, private_safe's mean
    interval coverage per query, the mean of its days' median interval width relative to the truth
    (over the slices with a positive true total) and of its days' mean signed relative error, the
    share of its days that probed another count limit (its public schedule), the mean of its
    realised / published predicted RMSRE_tau, the share of its days whose release held no signal for
    some query and the share of its tuned days on which the tuner predicted exactly the queries its
    release said so of (``error_model.predicted_without_signal``)."""
    wide = frame.pivot(index="day", columns="method", values="rmsre_tau").sort_index().tail(last)
    out = {"days": float(len(wide))}
    if PRIVATE_SAFE in wide and FULLY_INFORMED in wide:
        out["median_private_over_full"] = float((wide[PRIVATE_SAFE] / wide[FULLY_INFORMED]).median())
    if PRIVATE_SAFE in wide and COLD_START in wide:
        out["median_private_over_cold_start"] = float((wide[PRIVATE_SAFE] / wide[COLD_START]).median())
    for method in (PRIVATE_SAFE, COLD_START, FULLY_INFORMED):
        if method in wide:
            out[f"median_rmsre_tau_{method}"] = float(wide[method].median())
    baselines = [m for m in (BASELINE_Q95, BASELINE_Q99) if m in wide]
    if PRIVATE_SAFE in wide and baselines:
        out["private_below_baselines"] = float((wide[PRIVATE_SAFE] < wide[baselines].min(axis=1)).mean())
        out["median_private_over_best_baseline"] = float((wide[PRIVATE_SAFE] / wide[baselines].min(axis=1)).median())
    private = frame[(frame["method"] == PRIVATE_SAFE) & frame["day"].isin(wide.index)]
    for column in [c for c in frame.columns if c.startswith(("coverage_", "interval_width_", "bias_"))]:
        out[f"private_{column}"] = float(private[column].mean())
    if "without_signal" in private:
        silent = private["without_signal"].fillna("").astype(str)
        out["private_without_signal_days"] = float((silent != "").mean())
        if "predicted_without_signal" in private:  # the cold start's day predicts nothing: not counted
            said = private["predicted_without_signal"]
            known = said.notna()
            if known.any():
                out["private_without_signal_predicted"] = float((said[known].astype(str) == silent[known]).mean())
    if "count_limit_probe" in private:
        out["private_probe_days"] = float(private["count_limit_probe"].fillna(False).astype(bool).mean())
    if "predicted_rmsre_tau" in private:
        predicted = pd.to_numeric(private["predicted_rmsre_tau"], errors="coerce")
        ratio = (private["rmsre_tau"] / predicted)[predicted > 0]
        if len(ratio):
            out["private_realised_over_predicted"] = float(ratio.mean())
    return out
