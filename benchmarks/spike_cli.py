"""The sale spike through the real commands: ``nightly`` -> ``measure`` -> ``reconstruct`` of the same
report, on ``retail_log`` written as date= partitions, as a retail team runs them.

For each release day D from the sale's first day (``--days`` of them):

    araopt nightly --history LOG --as-of D-1 --window-days 28 --lookback-days 7 --release-period 1
                   --special-days SALE --store STORE --slices campaign,geo --values revenue,items --epsilon E
    araopt measure --input LOG/date=D/ --lookback LOG/date=D-7/ ... --params STORE --output OUT/D
                   --simulation-seed S
    araopt reconstruct --summary-report OUT/D/<release>/summary_report.avro --params <the version measure used>
                   --key-map OUT/D/<release>/key_map.json --days D --output OUT/D/reconstructed.csv
    (and the same without --days, from a folder that is not date=D: what reconstruct did before)

and the coverage of each table's 95% intervals of the day's TRUE totals (per slice: conversions,
revenue and items summed from the day's partition), per query.

Run: .venv/bin/python benchmarks/spike_cli.py [--per-day 10000] [--days 2] [--epsilon 8] [--work /tmp/spike_cli]
"""
from __future__ import annotations

import argparse
import contextlib
import glob
import io
import json
import os
import shutil
import time
from datetime import date, timedelta

import pandas as pd

from pipelines import measure as measure_cli
from pipelines import nightly as nightly_cli
from pipelines.ara import run_reconstruct
from retail_log import SLICES, VALUES, retail_log, write_partitions


def quiet(fn, argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = fn(argv)
    if code != 0:
        raise SystemExit(f"{fn.__module__} {' '.join(argv)} failed ({code}): {err.getvalue()[-2000:]}")
    return code, out.getvalue()


def coverage(table: str, truth: pd.DataFrame) -> dict[str, float]:
    est = pd.read_csv(table, dtype={c: str for c in SLICES})
    out = {}
    for q in ("count",) + VALUES:
        rows = est[est["query"] == q].set_index(list(SLICES))
        t = truth[q].reindex(rows.index, fill_value=0.0)
        out[q] = float(((rows["ci_low"] <= t) & (t <= rows["ci_high"])).mean())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-day", type=int, default=10_000)
    ap.add_argument("--days", type=int, default=2, help="release days from the sale's first")
    ap.add_argument("--epsilon", type=float, default=8.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--work", default="/tmp/araopt_spike_cli")
    args = ap.parse_args()
    t0 = time.process_time()
    shutil.rmtree(args.work, ignore_errors=True)
    retail = retail_log(args.per_day, args.seed)
    root = os.path.join(args.work, "log")
    write_partitions(retail, root)
    store = os.path.join(args.work, "store")
    rows = []
    for release in retail.sale_days[:args.days]:
        day = date.fromisoformat(release)
        as_of = (day - timedelta(days=1)).isoformat()
        _, said = quiet(nightly_cli.run, [
            "--history", root, "--as-of", as_of, "--window-days", "28", "--lookback-days", "7", "--release-period", "1",
            "--special-days", ",".join(retail.sale_days), "--store", store, "--slices", ",".join(SLICES), "--values",
            ",".join(VALUES), "--epsilon", f"{args.epsilon:g}", "--allow-large-change", "--no-progress"])
        print(f"nightly --as-of {as_of}: {said.strip().splitlines()[0]}")
        out = os.path.join(args.work, "out", release)
        lookback = []
        for k in range(1, 8):
            lookback += ["--lookback", os.path.join(root, f"date={(day - timedelta(days=k)).isoformat()}")]
        _, said = quiet(measure_cli.run, ["--input", os.path.join(root, f"date={release}"), *lookback, "--params", store,
                                          "--output", out, "--simulation-seed", str(args.seed), "--no-progress"])
        notes = [line.strip() for line in said.splitlines() if "NOTE" in line]
        summary = json.load(open(os.path.join(out, "private", "run_summary.json")))
        params = summary["parameters"]["uri"]
        report = glob.glob(os.path.join(out, "*", "*summary_report.avro"))[0]  # (SIMULATION- marked)
        folder = os.path.dirname(report)
        undated = os.path.join(args.work, "undated", release)
        os.makedirs(undated, exist_ok=True)
        shutil.copy(report, os.path.join(undated, "summary_report.avro"))
        tables = {"measure": glob.glob(os.path.join(folder, "*estimates.csv"))[0]}
        for name, extra, source in (("reconstruct --days", ["--days", release], report),
                                    ("reconstruct (no days)", [], os.path.join(undated, "summary_report.avro"))):
            target = os.path.join(args.work, "rec", release, name.replace(" ", "_").replace("(", "").replace(")", "")
                                  + ".csv")
            os.makedirs(os.path.dirname(target), exist_ok=True)
            key_map = glob.glob(os.path.join(folder, "*key_map.json"))[0]
            _, said = quiet(run_reconstruct, ["--summary-report", source, "--params", params, "--key-map", key_map,
                                              "--output", target, *extra])
            notes += [f"[{name}] {line.strip()}" for line in said.splitlines() if "NOTE" in line]
            tables[name] = target
        frame = retail.frame[retail.frame["conversion_time"].dt.strftime("%Y-%m-%d") == release]
        truth = frame.groupby(list(SLICES)).agg(count=("items", "size"), revenue=("revenue", "sum"),
                                                 items=("items", "sum"))
        for name, table in tables.items():
            rows.append({"date": release, "path": name, **coverage(table, truth)})
        for note in notes:
            print(f"  {release} {note}")
        print(f"  {release} done after {time.process_time() - t0:.0f} CPU-s (this process; Beam runs in it)", flush=True)
    table = pd.DataFrame(rows)
    with pd.option_context("display.width", 200, "display.float_format", "{:.3f}".format):
        print(table.to_string(index=False))


if __name__ == "__main__":
    main()
