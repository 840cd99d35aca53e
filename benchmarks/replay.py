"""Privacy-safe tuning against the fully informed nightly and the baselines: `araopt replay` on daily logs.

    python benchmarks/replay.py [--per-day 40000] [--days 28] [--epsilons 1,8] [--jobs 2] [--logs ...]
                                [--figures docs/figures/replay.md]

Four joined daily logs, written as date=YYYY-MM-DD/ partitions by conversion date: the three synthetic
presets in daily form (Poisson(10) conversions per impression, uniform delays over 30 days) and a log
with Geometric(mean 4) conversions per impression, exponential delays and a weekday cycle
(``release_period.geometric_log``), and four retail-like logs whose slices differ (``hetero_log``:
10 campaigns x 4 geographies of Zipf sizes, conversions per impression Geometric with a mean per
campaign from 1 to 30, value medians several-fold apart per slice, a few huge Pareto orders; one
with the largest slices converting least, one with a weekday cycle, one with a second value
column). Each has 30 days of warm-up (impressions of every age), the
window and the replayed days; conversions after the last replayed day are cut (a log ends today).
`araopt replay` runs on each at each epsilon; printed per (log, epsilon): the median over the last
14 replayed days of private_safe / fully_informed and / cold_start RMSRE_tau (Def. 3.2), the share of
those days private_safe is below both baselines, its intervals' coverage of the true totals (count,
every value) and their width (the median over slices of (high - low) / truth, a day's mean), the
mean of its realised / published predicted RMSRE_tau and the share of its days that probed another
count limit. ``--figures`` also writes them as the Markdown table that ``docs/private-tuning.md`` shows;
``--tables-only`` writes the table of runs already in ``--keep``.
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
from araopt.io.conversions import Conversions
from figures import markdown_table, write_figure
from release_period import DAY_US, SLICES, DailyLog, daily_log, geometric_log

WARMUP_DAYS = 30
WINDOW_DAYS = 9
LOGS = ("synth-criteo", "synth-real-estate", "synth-travel", "geometric")
HETERO_SLICES = ("campaignId", "geography")
HETERO = {
    # name: (slice-size Zipf exponent, per-campaign mean conversions per impression, spread of the slices'
    # value medians (log sd), Pareto tail index of the huge orders, share of huge orders, big slices
    # convert more (+1) / less (-1), weekday cycle, value columns)
    "hetero-retail": (1.3, (1.1, 1.3, 1.6, 2.0, 3.0, 4.0, 6.0, 9.0, 14.0, 20.0), 0.8, 1.5, 0.01, 1, False, 1),
    "hetero-inverse": (1.5, (1.05, 1.2, 1.5, 2.0, 2.5, 4.0, 6.0, 10.0, 16.0, 25.0), 1.0, 1.3, 0.02, -1, False, 1),
    "hetero-weekday": (1.1, (1.0, 1.1, 1.4, 1.8, 2.5, 3.5, 5.0, 8.0, 12.0, 30.0), 1.2, 1.2, 0.01, 1, True, 1),
    "hetero-two-values": (1.3, (1.1, 1.3, 1.6, 2.0, 3.0, 4.0, 6.0, 9.0, 14.0, 20.0), 0.9, 1.4, 0.015, -1, False, 2),
}


def hetero_log(name: str, per_day: int, days: int, seed: int) -> DailyLog:
    """A retail-like log whose slices differ: 10 campaigns x 4 geographies of very uneven size (Zipf),
    conversions per impression Geometric with a mean per campaign (1 to 30), each slice's value median
    several-fold apart (log-normal around 24), a few huge orders (Pareto tail), exponential delays
    (mean 3 days); ``HETERO[name]`` sets the laws. A second value column (when asked) is an item count
    (1 + Poisson, its level per slice too)."""
    zipf, sizes, spread, tail, huge, sign, weekly, d = HETERO[name]
    rng = np.random.default_rng(seed)
    m = 40
    weight = 1.0 / np.arange(1, m + 1) ** zipf
    weight /= weight.sum()
    campaign = np.arange(m) // 4
    geo = np.arange(m) % 4
    ranked = np.sort(np.asarray(sizes, dtype=np.float64))
    mean_size = (ranked[::-1] if sign > 0 else ranked)[campaign]  # campaign 0 holds the largest slices
    median = 24.0 * np.exp(rng.normal(0.0, spread, m))
    items = 1.0 + rng.gamma(2.0, 1.0, m)
    weekday = np.array([0.8, 0.9, 0.95, 1.0, 1.1, 1.4, 0.85]) if weekly else np.ones(7)
    imp_per_day = per_day * weight / mean_size
    ids, times, vals, slice_of = [], [], [], []
    next_id = 0
    for day in range(days):
        n = rng.poisson(imp_per_day * weekday[day % 7])
        s = np.repeat(np.arange(m), n)
        size = rng.geometric(1.0 / mean_size[s])
        t0 = day * DAY_US + rng.integers(0, DAY_US, len(s))
        rep = np.repeat(np.arange(len(s)), size)
        offset = np.minimum(rng.exponential(3 * DAY_US, len(rep)).astype(np.int64), 30 * DAY_US - 1)
        sl = s[rep]
        value = median[sl] * rng.lognormal(0.0, 0.9, len(rep))
        big = rng.random(len(rep)) < huge
        value[big] = median[sl[big]] * 20.0 * (1.0 + rng.pareto(tail, int(big.sum())))
        columns = [np.round(value, 2)]
        if d > 1:
            columns.append(1.0 + rng.poisson(items[sl]))
        ids.append(next_id + rep)
        times.append(t0[rep] + offset)
        vals.append(np.column_stack(columns))
        slice_of.append(sl)
        next_id += len(s)
    t = np.concatenate(times)
    sl = np.concatenate(slice_of)
    conv = Conversions(np.concatenate(ids).astype(np.int64), t,
                       {"campaignId": campaign[sl], "geography": geo[sl]}, np.concatenate(vals),
                       ("value", "items")[:d])
    return DailyLog(name, conv, np.floor_divide(t, DAY_US))


def log_columns(name: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The slice and value columns of a log."""
    if name in HETERO:
        return HETERO_SLICES, ("value", "items")[:HETERO[name][-1]]
    return SLICES, ("value",)


def write_log(name: str, per_day: int, days: int, seed: int, out: Path) -> None:
    """The log as date partitions of its conversion days 0 .. WARMUP + WINDOW + days - 1."""
    total = WARMUP_DAYS + WINDOW_DAYS + days
    log = (geometric_log(per_day, total + 30, seed) if name == "geometric"
           else hetero_log(name, per_day, total + 30, seed) if name in HETERO
           else daily_log(name, synthetic.get_preset(name), per_day, total + 30, seed))
    conv = log.conversions
    slices, values = log_columns(name)
    date = np.floor_divide(conv.conversion_time, DAY_US)
    for d in np.unique(date[log.day < total]):
        rows = np.flatnonzero(date == d)
        table = pa.table({
            "impression_id": conv.impression_id[rows].astype(np.int64),
            "conversion_time": pa.array(conv.conversion_time[rows], pa.timestamp("us", tz="UTC")),
            **{c: np.asarray(conv.slices[c])[rows] for c in slices},
            **{v: conv.values[rows, j] for j, v in enumerate(values)},
        })
        folder = out / f"date={np.datetime64(int(d), 'D')}"
        folder.mkdir(parents=True)
        pq.write_table(table, folder / "part-00000.parquet")


def one(name: str, epsilon: float, args: argparse.Namespace, root: Path) -> dict:
    from pipelines.replay import run

    out = root / f"out-{name}-{epsilon:g}"
    start = time.time()
    slices, values = log_columns(name)
    argv = ["--history", str(root / name), "--slices", ",".join(slices), "--values", ",".join(values), "--epsilon",
            str(epsilon), "--output", str(out), "--window-days", str(WINDOW_DAYS), "--replay-days", str(args.days),
            "--no-progress", "--overwrite", *(["--fresh-start"] if args.fresh_start else [])]
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
    parser.add_argument("--fresh-start", action="store_true",
                        help="The advertiser starts measuring on the first replayed day (araopt replay --fresh-start).")
    parser.add_argument("--keep", help="Keep the logs and outputs in this folder.")
    parser.add_argument("--figures", help="Also write the figures as a Markdown table to this file.")
    parser.add_argument("--tables-only", action="store_true",
                        help="Print (and --figures) the table of the runs already in --keep (their summary.json), "
                             "replaying nothing: a table of another commit's runs.")
    args = parser.parse_args()
    root = Path(args.keep or tempfile.mkdtemp(prefix="araopt-replay-"))
    logs = args.logs.split(",")
    cases = [(name, float(e)) for name in logs for e in args.epsilons.split(",")]
    if args.tables_only:
        if not args.keep:
            raise SystemExit("--tables-only reads the runs of --keep")
        results = [{"log": name, "epsilon": e, "seconds": 0.0,
                    **json.loads((root / f"out-{name}-{e:g}" / "summary.json").read_text())} for name, e in cases]
    else:
        for name in logs:
            if not (root / name).exists():
                write_log(name, args.per_day, args.days, args.seed, root / name)
        with ProcessPoolExecutor(args.jobs) as pool:
            results = list(pool.map(one, *zip(*cases, strict=True), [args] * len(cases), [root] * len(cases)))
    print(f"{args.per_day} conversions/day, {args.days} replayed days, window {WINDOW_DAYS} days; "
          f"last 14 days: median private_safe / fully_informed, share of days below both baselines, "
          f"median private / best baseline, private_safe coverage (count, value) of the true totals")
    for r in results:
        coverage = " ".join(f"{r[k]:.3f}" for k in r if k.startswith("private_coverage_"))
        width = " ".join(f"{r[k]:.2f}" for k in r if k.startswith("private_interval_width_"))
        print(f"{r['log']:<18} eps={r['epsilon']:<4g} median private/full {r['median_private_over_full']:.3f}  "
              f"private/cold {r.get('median_private_over_cold_start', float('nan')):.3f}  "
              f"below baselines {r['private_below_baselines']:.2f}  private/best baseline "
              f"{r['median_private_over_best_baseline']:.3f}  coverage {coverage}  width {width}  realised/predicted "
              f"{r.get('private_realised_over_predicted', float('nan')):.2f}  ({r['seconds']:.0f} s)")
    if args.figures:
        write_figure(args.figures, figure_table(results, args))
        print(f"wrote {args.figures}")
    print(f"outputs under {root}")


def figure_table(results: list[dict], args: argparse.Namespace) -> str:
    """The printed figures as the manual's table (one row per log and epsilon)."""
    def cell(r: dict, key: str) -> str:
        return f"{r[key]:.2f}" if key in r else "–"

    rows = []
    for r in results:
        coverage = [k for k in r if k.startswith("private_coverage_")]
        width = [k for k in r if k.startswith("private_interval_width_")]
        rows.append([r["log"], f"{r['epsilon']:g}", cell(r, "median_private_over_full"),
                     cell(r, "median_private_over_cold_start"), cell(r, "private_below_baselines"),
                     cell(r, coverage[0]) if coverage else "–", ", ".join(cell(r, k) for k in coverage[1:]) or "–",
                     cell(r, width[0]) if width else "–", ", ".join(cell(r, k) for k in width[1:]) or "–",
                     cell(r, "private_realised_over_predicted"), cell(r, "private_probe_days")])
    header = ["log", "ε", "private / fully informed", "private / cold start", "days below both baselines",
              "coverage count", "coverage value(s)", "width count", "width value(s)", "realised / predicted",
              "probe days"]
    return (f"{args.per_day:,} conversions a day, {args.days} replayed days, window {WINDOW_DAYS} days; medians and "
            f"shares over the last 14 replayed days.\n\n" + markdown_table(header, rows))


if __name__ == "__main__":
    main()
