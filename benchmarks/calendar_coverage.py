"""Calendar-aware calibration: coverage of the released intervals on every day of the week.

Data (``weekday_log``): a daily log with a weekly cycle in what the calibration corrects. Impressions
every day (slightly fewer at weekends), each with a gamma-distributed propensity to convert (many
impressions with one or two conversions, a tail with dozens: the count limit C bites), conversions
over the next 30 days with exponential delays, and at weekends (Saturday, Sunday) ``--weekend``
times more conversions per impression (a thinned Poisson process: weekend days keep every
candidate conversion, weekdays 1 / weekend of them) and ``--weekend`` times the value per
conversion (revenue, log-normal; items, 1 + Poisson). 30 slices (campaign x device, impression
side, Zipf sizes). Conversion days are UTC days; the log is cut by conversion date.

For each held-out day D (``--weeks`` consecutive weeks: every weekday ``--weeks`` times, per seed):

  * train = the 28 days before D with a 30-day lookback (``release_period.DailyLog.window``): the
    parameters tuned for a one-day release (objective corrected), the calibration fitted on the
    window's conversion days with day-of-week effects, the estimator chosen by the backtest (what
    ``araopt nightly`` does);
  * test = day D with its 30-day lookback (what ``araopt measure --lookback`` reads), released
    ``--draws`` times (simulation seeds) with the day's date known (``measure``: the partition's date).

Printed per weekday of D, epsilon, log variant (with and without ``impression_time``) and model
(``marginal``: the release's days unknown, the period is any day -- what the calibration did before
day types; ``calendar``: the day's date given, as ``measure`` reads it from a ``date=`` partition):
coverage of the released 95% intervals of the TRUE totals (count and each value query, over slices x
draws x weeks x seeds), the root-mean-square z of the point estimate ((estimate - truth) / std_error),
and the test RMSRE_tau (analytic, given the day) of the released estimates beside the paper's (Alg. 4
with the paper-objective parameters) and Alg. 4 with the released parameters. The calibration's
blocks are conversion days (what ``nightly`` / ``optimize`` accumulate) whether or not the log carries
``impression_time``, so both variants go through the same calibration; the variant shows it.

Run: .venv/bin/python benchmarks/calendar_coverage.py [--quick] [--per-day 20000] [--weeks 2] [--seeds 1 2]
     [--draws 10] [--epsilons 1 8 64] [--variants with without]
"""
from __future__ import annotations

import argparse
import time
from datetime import date, timedelta

import numpy as np
import pandas as pd

import araopt.calibration as cb
from araopt.constants import Objective
from araopt.evaluation.evaluate import _domain, analytic_rmsre, conversions_breakdown, corrected_rmsre
from araopt.io.conversions import Conversions
from araopt.mechanism.measure import measure
from araopt.optimize import tune as tuning
from araopt.optimize.statistics import StatisticsSpec, compute_statistics_in_memory
from araopt.publication import publish
from release_period import DAY_US, LOOKBACK_DAYS, DailyLog

SLICES = ("campaign", "device")
VALUES = ("revenue", "items")
WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
START = date(2025, 1, 6)  # a Monday: day index 0 of every log
TRAIN_DAYS = 28
EPSILONS = (1.0, 8.0, 64.0)


def weekday_log(per_day: int, days: int, seed: int, weekend: float = 1.5, with_impression_time: bool = True
                ) -> DailyLog:
    """The log of the module docstring: about ``per_day`` conversions a day (steady state) over ``days``
    days of conversions from ``START``; ``weekend``: the weekend factor of conversions per impression
    and of the value per conversion."""
    rng = np.random.default_rng(seed)
    start_us = int((pd.Timestamp(START, tz="UTC").value) // 1000)
    mean_conversions = 3.0  # per impression, before thinning
    shape = 0.6  # gamma shape of the propensity: overdispersed (a few impressions convert a lot)
    horizon = 30 * DAY_US
    mean_delay = 4.0 * DAY_US
    # weekday of a day index from START (a Monday); the weekend keeps every candidate conversion
    keep = np.where(np.arange(7) >= 5, 1.0, 1.0 / weekend)
    impressions_by_weekday = np.array([1.0, 1.0, 1.0, 1.0, 1.0, 0.85, 0.85])
    ids, times, imp_times, revenue, items, campaign, device = [], [], [], [], [], [], []
    next_id = 0
    kept_share = float(keep.mean())
    for d in range(-30, days):  # impressions from 30 days before the first conversion day
        n_imp = rng.poisson(per_day / (mean_conversions * kept_share) * impressions_by_weekday[d % 7])
        propensity = rng.gamma(shape, mean_conversions / shape, n_imp)
        sizes = rng.poisson(propensity)
        slice_of = (rng.zipf(1.4, n_imp) - 1) % 30
        t_imp = start_us + d * DAY_US + rng.integers(0, DAY_US, n_imp)
        rep = np.repeat(np.arange(n_imp), sizes)
        t = t_imp[rep] + np.minimum(rng.exponential(mean_delay, len(rep)).astype(np.int64), horizon - 1)
        day = np.floor_divide(t - start_us, DAY_US)
        weekday = np.mod(day, 7)
        accept = rng.random(len(rep)) < keep[weekday]
        rep, t, weekday = rep[accept], t[accept], weekday[accept]
        is_weekend = weekday >= 5
        factor = np.where(is_weekend, weekend, 1.0)
        ids.append(next_id + rep)
        times.append(t)
        imp_times.append(t_imp[rep])
        revenue.append(np.round(rng.lognormal(3.0, 1.0, len(rep)) * factor, 2))
        items.append(1.0 + rng.poisson(2.0 * factor - 1.0))  # mean 2 on weekdays, 1 + 2 weekend - 1 at weekends
        campaign.append(slice_of[rep] // 3)
        device.append(slice_of[rep] % 3)
        next_id += n_imp
    t = np.concatenate(times)
    inside = (t >= start_us) & (t < start_us + days * DAY_US)  # the log's days (START and after)
    cat = {"campaign": np.concatenate(campaign)[inside], "device": np.concatenate(device)[inside]}
    conv = Conversions(np.concatenate(ids).astype(np.int64)[inside], t[inside], cat,
                       np.column_stack([np.concatenate(revenue), np.concatenate(items)])[inside], VALUES,
                       impression_time=np.concatenate(imp_times)[inside] if with_impression_time else None)
    name = "weekday (impression_time)" if with_impression_time else "weekday (no impression_time)"
    return DailyLog(name, conv, np.floor_divide(t[inside] - start_us, DAY_US))


def day_date(day: int) -> date:
    return START + timedelta(days=int(day))


def released_version(train: Conversions, eps: float, spec: StatisticsSpec, taus: np.ndarray):
    """What nightly publishes for a one-day release: tuned on the window, calibrated on its conversion days."""
    stats = compute_statistics_in_memory(train, spec)
    res = tuning.tune(stats, eps, objective=Objective.CORRECTED, taus=list(taus), release_period_days=1.0,
                      history_days=TRAIN_DAYS)
    cals = [cb.calibration_statistics(train, v.params, cb.day_blocks(train), fitted_for=v.checksum())
            for v, _ in res.candidates]
    paper = tuning.tune(stats, eps, objective=Objective.EXACT, taus=list(taus), release_period_days=1.0,
                        history_days=TRAIN_DAYS)
    return tuning.calibrate(res, cals, 1.0), paper


MODELS = ("marginal", "calendar")
"""marginal: the period is any day (no dates given: what the calibration did before day types);
calendar: the day's date is given, its day-type effect and variance are used."""


def held_out_day(log: DailyLog, test_day: int, eps: float, spec: StatisticsSpec, draws: int, seed: int) -> list[dict]:
    train = log.window(test_day - TRAIN_DAYS, test_day - 1, LOOKBACK_DAYS)
    test = log.window(test_day, test_day, LOOKBACK_DAYS)
    taus = compute_statistics_in_memory(train, spec).taus()
    res, paper = released_version(train, eps, spec, taus)
    version = res.version
    truth = conversions_breakdown(version.params, test).truth
    domain = _domain(version.params, test)
    k = truth.shape[1]
    days = {"marginal": None, "calendar": [day_date(test_day)]}
    covered = {m: np.zeros(k) for m in MODELS}
    z2 = {m: np.zeros(k) for m in MODELS}
    n = 0
    for r in range(draws):
        release = measure(test, version.params, domain, simulation_seed=seed + 1000 * r).release
        for model in MODELS:
            frame = publish(release, version, period_days=days[model]).frame()
            est = frame["estimate"].to_numpy().reshape(truth.shape)
            std = frame["std_error"].to_numpy().reshape(truth.shape)
            low = frame["ci_low"].to_numpy().reshape(truth.shape)
            high = frame["ci_high"].to_numpy().reshape(truth.shape)
            covered[model] += ((low <= truth) & (truth <= high)).sum(axis=0)
            z2[model] += (((est - truth) / np.maximum(std, 1e-12)) ** 2).sum(axis=0)
        n += truth.shape[0]
    paper_rmsre = analytic_rmsre(paper.params, test, taus).combined
    alg4_same = analytic_rmsre(version.params, test, taus).combined
    return [{"dataset": log.name, "model": model, "epsilon": eps, "day": test_day, "weekday": WEEKDAYS[test_day % 7],
             "correction": version.correction, "C": version.params.count_limit, "cells": n,
             **{f"covered_{q}": covered[model][i] for i, q in enumerate(("count",) + VALUES)},
             **{f"z2_{q}": z2[model][i] for i, q in enumerate(("count",) + VALUES)},
             "released": corrected_rmsre(version, test, taus, period_days=days[model]).combined,
             "alg4_same_params": alg4_same, "paper": paper_rmsre} for model in MODELS]


def summarise(frame: pd.DataFrame) -> pd.DataFrame:
    queries = ("count",) + VALUES
    agg = frame.groupby(["dataset", "model", "epsilon", "weekday"], sort=False).agg(
        days=("day", "size"), cells=("cells", "sum"),
        **{f"cov_{q}": (f"covered_{q}", "sum") for q in queries}, **{f"z2_{q}": (f"z2_{q}", "sum") for q in queries},
        released=("released", "mean"), paper=("paper", "mean"), alg4_same=("alg4_same_params", "mean"),
        ratio_days=("correction", lambda c: int((c == "ratio").sum()))).reset_index()
    for q in queries:
        agg[f"cov_{q}"] = agg[f"cov_{q}"] / agg["cells"]
        agg[f"rmsz_{q}"] = np.sqrt(agg[f"z2_{q}"] / agg["cells"])
    agg["released/paper"] = agg["released"] / agg["paper"]
    order = {w: i for i, w in enumerate(WEEKDAYS)}
    agg = agg.sort_values(["dataset", "model", "epsilon", "weekday"],
                          key=lambda s: s.map(order) if s.name == "weekday" else s)
    return agg[["dataset", "model", "epsilon", "weekday", "days", *(f"cov_{q}" for q in queries),
                *(f"rmsz_{q}" for q in queries), "released", "alg4_same", "paper", "released/paper", "ratio_days"]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-day", type=int, default=20_000, help="conversions per day (steady state)")
    ap.add_argument("--weeks", type=int, default=2, help="held-out weeks per seed (every weekday once a week)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--epsilons", type=float, nargs="+", default=list(EPSILONS))
    ap.add_argument("--draws", type=int, default=10, help="noise draws per held-out day")
    ap.add_argument("--weekend", type=float, default=1.5)
    ap.add_argument("--quick", action="store_true",
                    help="a few minutes: 10k conversions a day, one week, one seed, 4 draws")
    ap.add_argument("--variants", nargs="+", default=["with", "without"], choices=["with", "without"],
                    help="the log with impression_time, and the same log without it")
    args = ap.parse_args()
    if args.quick:
        args.per_day, args.weeks, args.seeds, args.draws = 10_000, 1, args.seeds[:1], 4
    spec = StatisticsSpec(SLICES, VALUES)
    first_test = LOOKBACK_DAYS + TRAIN_DAYS
    days = first_test + 7 * args.weeks
    rows = []
    t0 = time.perf_counter()
    for seed in args.seeds:
        for variant in args.variants:
            log = weekday_log(args.per_day, days, seed, args.weekend, with_impression_time=variant == "with")
            for test_day in range(first_test, days):
                for eps in args.epsilons:
                    rows.extend(held_out_day(log, test_day, eps, spec, args.draws, seed * 7919 + test_day))
            print(f"seed {seed}, {log.name}: {days - first_test} held-out days after {time.perf_counter() - t0:.0f} s",
                  flush=True)
    frame = pd.DataFrame(rows)
    table = summarise(frame)
    with pd.option_context("display.width", 250, "display.max_columns", 30, "display.max_rows", 500,
                           "display.float_format", "{:.3f}".format):
        print(table.to_string(index=False))
    for model in MODELS:
        part = table[table["model"] == model]
        cov = part[[c for c in part.columns if c.startswith("cov_")]].to_numpy()
        rmsz = part[[c for c in part.columns if c.startswith("rmsz_")]].to_numpy()
        print(f"[{model}] coverage of the released 95% intervals: min {cov.min():.3f}, max {cov.max():.3f}, cells in "
              f"[0.90, 0.99]: {int(((cov >= 0.90) & (cov <= 0.99)).sum())}/{cov.size}; rms z: min {rmsz.min():.2f}, "
              f"max {rmsz.max():.2f}, cells in [0.8, 1.2]: {int(((rmsz >= 0.8) & (rmsz <= 1.2)).sum())}/{rmsz.size}")
        worse = part[part["released"] > part["paper"] * (1 + 1e-9)]
        days = frame[frame["model"] == model]
        print(f"[{model}] test RMSRE_tau released vs the paper's: worse in {len(worse)} of {len(part)} cells; "
              f"released/paper median {part['released/paper'].median():.3f}, max {part['released/paper'].max():.3f}; "
              f"per held-out day worse in {int((days['released'] > days['paper'] * (1 + 1e-9)).sum())} of {len(days)}")
    print(f"{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
