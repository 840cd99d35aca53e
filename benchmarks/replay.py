"""Privacy-safe tuning against the fully informed nightly and the baselines: `araopt replay` on daily logs.

    python benchmarks/replay.py [--per-day 40000] [--days 28] [--epsilons 1,8] [--jobs 2] [--logs ...]

Four joined daily logs, written as date=YYYY-MM-DD/ partitions by conversion date: the three synthetic
presets in daily form (Poisson(10) conversions per impression, uniform delays over 30 days) and a log
with Geometric(mean 4) conversions per impression, exponential delays and a weekday cycle
(``release_period.geometric_log``). Each has 30 days of warm-up (impressions of every age), the
window and the replayed days; conversions after the last replayed day are cut (a log ends today).
`araopt replay` runs on each at each epsilon; printed per (log, epsilon): the median over the last
14 replayed days of private_safe / fully_informed RMSRE_tau, the share of those days private_safe is
below both baselines, and its intervals' coverage of the true totals.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from araopt.data import synthetic
from release_period import DAY_US, SLICES, daily_log, geometric_log

WARMUP_DAYS = 30
WINDOW_DAYS = 9
LOGS = ("synth-criteo", "synth-real-estate", "synth-travel", "geometric")


def write_log(name: str, per_day: int, days: int, seed: int, out: Path) -> None:
    """The log as date partitions of its conversion days 0 .. WARMUP + WINDOW + days - 1."""
    total = WARMUP_DAYS + WINDOW_DAYS + days
    log = (geometric_log(per_day, total + 30, seed) if name == "geometric"
           else daily_log(name, synthetic.get_preset(name), per_day, total + 30, seed))
    conv = log.conversions
    date = np.floor_divide(conv.conversion_time, DAY_US)
    for d in np.unique(date[log.day < total]):
        rows = np.flatnonzero(date == d)
        table = pa.table({
            "impression_id": conv.impression_id[rows].astype(np.int64),
            "conversion_time": pa.array(conv.conversion_time[rows], pa.timestamp("us", tz="UTC")),
            **{c: np.asarray(conv.slices[c])[rows] for c in SLICES},
            "value": conv.values[rows, 0],
        })
        folder = out / f"date={np.datetime64(int(d), 'D')}"
        folder.mkdir(parents=True)
        pq.write_table(table, folder / "part-00000.parquet")


def one(name: str, epsilon: float, args: argparse.Namespace, root: Path) -> dict:
    from pipelines.replay import run

    out = root / f"out-{name}-{epsilon:g}"
    start = time.time()
    argv = ["--history", str(root / name), "--slices", ",".join(SLICES), "--values", "value", "--epsilon",
            str(epsilon), "--output", str(out), "--window-days", str(WINDOW_DAYS), "--replay-days", str(args.days),
            "--no-progress", "--overwrite"]
    if run(argv) != 0:
        raise SystemExit(f"replay failed on {name} at epsilon {epsilon}")
    summary = json.loads((out / "summary.json").read_text())
    return {"log": name, "epsilon": epsilon, "seconds": time.time() - start, **summary, "output": str(out)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--per-day", type=int, default=40_000)
    parser.add_argument("--days", type=int, default=28)
    parser.add_argument("--epsilons", default="1,8")
    parser.add_argument("--logs", default=",".join(LOGS))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--keep", help="Keep the logs and outputs in this folder.")
    args = parser.parse_args()
    root = Path(args.keep or tempfile.mkdtemp(prefix="araopt-replay-"))
    logs = args.logs.split(",")
    for name in logs:
        if not (root / name).exists():
            write_log(name, args.per_day, args.days, args.seed, root / name)
    cases = [(name, float(e)) for name in logs for e in args.epsilons.split(",")]
    with ProcessPoolExecutor(args.jobs) as pool:
        results = list(pool.map(one, *zip(*cases, strict=True), [args] * len(cases), [root] * len(cases)))
    print(f"{args.per_day} conversions/day, {args.days} replayed days, window {WINDOW_DAYS} days; "
          f"last 14 days: median private_safe / fully_informed, share of days below both baselines, "
          f"median private / best baseline, private_safe coverage (count, value) of the true totals")
    for r in results:
        print(f"{r['log']:<18} eps={r['epsilon']:<4g} median private/full {r['median_private_over_full']:.3f}  "
              f"below baselines {r['private_below_baselines']:.2f}  private/best baseline "
              f"{r['median_private_over_best_baseline']:.3f}  coverage {r['private_coverage_count']:.3f} "
              f"{r['private_coverage_value']:.3f}  ({r['seconds']:.0f} s)")
    print(f"outputs under {root}")


if __name__ == "__main__":
    main()
