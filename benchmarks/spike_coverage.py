"""Coverage of the released intervals on a sale's first day and the days after, through ``measure``
and through ``reconstruct`` of the same report.

Data: ``retail_log`` (a retail log of the team's own kind: 35 conversion days, string ids, 40
campaigns x 6 geos, revenue with a few huge orders, items as small integers, a weekday cycle, a
2-2.8x sale from day 32 with bigger baskets). The sale's days are declared (``--special-days``) in
advance, as an operator does.

For each release day D (the day before the sale, then every sale day), what ``araopt nightly
--as-of D-1 --window-days 28 --lookback-days 7 --release-period 1 --special-days SALE`` publishes
(tuned on the window with the corrected objective, calibrated on its conversion days with the
calendar and the declared special days; in memory, the same core calls), then day D released
``--draws`` times (simulation seeds) and published two ways:

  * measure: ``publication.publish(release, version, period_days=[D])`` (what ``araopt measure``
    does with the day's date= partition);
  * reconstruct: the same noisy report's buckets and metrics through
    ``ara.reconstruct.estimates_from_summary_report(..., period_days=[D])`` (``araopt reconstruct
    --days D``, or the report in a date=D/ folder);
  * reconstruct, days unknown: the same without the day (what reconstruct did before it took days).

Printed per day and query: coverage of the 95% intervals of the TRUE totals over slices x draws,
bias of the total (sum of estimates / sum of truths - 1), rms z ((estimate - truth) / std_error),
and the calendar NOTE of the day.

Run: .venv/bin/python benchmarks/spike_coverage.py [--per-day 10000] [--draws 5] [--epsilon 8] [--seed 1]
"""
from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np
import pandas as pd

import araopt.calibration as cb
from araopt.ara.reconstruct import estimates_from_summary_report
from araopt.constants import Objective
from araopt.evaluation.evaluate import _domain, conversions_breakdown
from araopt.io.conversions import Conversions
from araopt.mechanism.measure import measure
from araopt.optimize import tune as tuning
from araopt.optimize.statistics import StatisticsSpec, compute_statistics_in_memory
from araopt.publication import publish, release_buckets
from release_period import DailyLog
from retail_log import SLICES, VALUES, retail_log

WINDOW_DAYS = 28
LOOKBACK_DAYS = 7
PATHS = ("measure", "reconstruct", "reconstruct_no_days")


@dataclasses.dataclass
class RetailDays(DailyLog):
    """``release_period.DailyLog`` with the window's impressions found through integer codes of the
    string ids (``np.isin`` on Python strings sorts objects: minutes a window at this size)."""

    codes: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))

    def window(self, first: int, last: int, lookback_days: int = LOOKBACK_DAYS) -> Conversions:
        period = (self.day >= first) & (self.day <= last)
        seen = np.zeros(int(self.codes.max()) + 1, dtype=bool)
        seen[self.codes[period]] = True
        before = (self.day >= first - lookback_days) & (self.day < first) & seen[self.codes]
        rows = np.flatnonzero(period | before)
        return dataclasses.replace(self.conversions.take(rows), in_period=period[rows])


def published_version(log: DailyLog, day: int, epsilon: float, special_days: tuple[str, ...]):
    """What nightly --as-of (day - 1) publishes for a one-day release."""
    first = max(0, day - WINDOW_DAYS)
    train = log.window(first, day - 1, LOOKBACK_DAYS)
    spec = StatisticsSpec(SLICES, VALUES)
    stats = compute_statistics_in_memory(train, spec)
    res = tuning.tune(stats, epsilon, objective=Objective.CORRECTED, release_period_days=1.0, history_days=day - first)
    cals = [cb.calibration_statistics(train, v.params, cb.day_blocks(train), fitted_for=v.checksum())
            for v, _ in res.candidates]
    return tuning.calibrate(res, cals, 1.0, special_days).version


def day_rows(log: DailyLog, day: int, iso: str, version, draws: int, seed: int) -> list[dict]:
    test = log.window(day, day, LOOKBACK_DAYS)
    truth = conversions_breakdown(version.params, test).truth
    domain = _domain(version.params, test)
    queries = ("count",) + VALUES
    acc = {p: {"cov": np.zeros(3), "z2": np.zeros(3), "est": np.zeros(3), "note": None} for p in PATHS}
    for r in range(draws):
        release = measure(test, version.params, domain, simulation_seed=seed + 1000 * r).release
        buckets, metrics = release_buckets(release), release.report.noisy.ravel()
        frames = {"measure": (publish(release, version, period_days=[iso]).frame(),
                              publish(release, version, period_days=[iso]).corrected),
                  "reconstruct": estimates_from_summary_report(buckets, metrics, version, domain, period_days=[iso]),
                  "reconstruct_no_days": estimates_from_summary_report(buckets, metrics, version, domain)}
        for path, (frame, extra) in frames.items():
            est, std, low, high = (frame[c].to_numpy().reshape(truth.shape) for c in
                                   ("estimate", "std_error", "ci_low", "ci_high"))
            acc[path]["cov"] += ((low <= truth) & (truth <= high)).mean(axis=0)
            acc[path]["z2"] += (((est - truth) / np.maximum(std, 1e-12)) ** 2).mean(axis=0)
            acc[path]["est"] += est.sum(axis=0)
            acc[path]["note"] = extra.calendar_note if extra is not None else None
    rows = []
    for path in PATHS:
        for i, q in enumerate(queries):
            rows.append({"day": day + 1, "date": iso, "path": path, "query": q, "C": version.params.count_limit,
                         "clip": "" if i == 0 else f"{version.params.queries[i - 1].clip_threshold:.4g}",
                         "coverage": acc[path]["cov"][i] / draws,
                         "bias": acc[path]["est"][i] / draws / truth[:, i].sum() - 1,
                         "rms_z": np.sqrt(acc[path]["z2"][i] / draws), "note": acc[path]["note"] or ""})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-day", type=int, default=10_000, help="conversions on an ordinary day")
    ap.add_argument("--draws", type=int, default=5, help="noise draws per release day")
    ap.add_argument("--epsilon", type=float, default=8.0)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    t0 = time.process_time()
    retail = retail_log(args.per_day, args.seed)
    conv = Conversions.from_table(retail.frame, SLICES, VALUES)
    log = RetailDays("retail", conv, retail.day, pd.factorize(retail.frame["impression_id"])[0])
    first_sale = min(int(d) for d in np.unique(retail.day) if retail.date(int(d)) in retail.sale_days)
    rows = []
    for day in range(first_sale - 1, int(retail.day.max()) + 1):
        version = published_version(log, day, args.epsilon, retail.sale_days)
        rows.extend(day_rows(log, day, retail.date(day), version, args.draws, args.seed * 7919 + day))
        print(f"day {day + 1} ({retail.date(day)}): done after {time.process_time() - t0:.0f} CPU-s", flush=True)
    frame = pd.DataFrame(rows)
    table = frame.pivot_table(index=["day", "date", "C", "query", "clip"], columns="path",
                              values=["coverage", "bias", "rms_z"], sort=False)
    table = table.reindex(columns=pd.MultiIndex.from_product([["coverage", "bias", "rms_z"], PATHS]))
    with pd.option_context("display.width", 250, "display.max_columns", 30, "display.max_rows", 200,
                           "display.float_format", "{:.3f}".format):
        print(table.to_string())
    notes = frame[(frame["path"] == "measure") & (frame["query"] == "count")][["day", "date", "note"]]
    for _, r in notes.iterrows():
        if r["note"]:
            print(f"day {r['day']} ({r['date']}) NOTE: {r['note']}")
    sale = frame[frame["date"].isin(retail.sale_days)]
    for path in ("measure", "reconstruct"):
        cov = sale[sale["path"] == path]["coverage"]
        print(f"[{path}] sale days: coverage min {cov.min():.3f} (>= 0.90 in {int((cov >= 0.90).sum())} of {len(cov)} "
              f"day x query cells)")
    print(f"{time.process_time() - t0:.0f} CPU-s; {len(retail.frame):,} conversions; epsilon {args.epsilon:g}; "
          f"{args.draws} draws a day")


if __name__ == "__main__":
    main()
