"""The README's main job, end to end on local defaults (DirectRunner, local files, synthetic data):

1. generate 16 days of synthetic impressions (preset synth-criteo, a 7-day attribution window) as a
   daily export: Parquet partitions by conversion date;
2. `araopt nightly` on a 7-day window (with the 7 days before it as lookback, so that every
   conversion has its lifetime rank) into a local parameter store, tuned for one day's release;
3. `araopt measure` on the next day with the store's `latest` (secure noise, as in production) and
   the 7 days before it as `--lookback` (the browser caps an impression over its whole life);
4. print estimates with error bars, the predicted vs baseline error, the predicted error of the
   day's release next to the realised one (the demo knows the synthetic truth), and name the plots and
   the report pages (measure's and nightly's report.html).

    python -m pipelines.demo [--out demo-output] [--conversions-per-day 150000] [--epsilon 8]
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import sys
from collections.abc import Sequence

import pandas as pd

from araopt.errors import InvalidParameters
from araopt.evaluation.metrics import realised_rmsre_of_estimates
from araopt.io import outputs
from araopt.publication import ESTIMATE_COLUMNS
from araopt.release_summary import estimates_line

from . import options

SLICES = "campaignId,geography,productCategory"
WINDOW = 7
"""Days of the nightly window, of its lookback, of the measured day's lookback and of the attribution window."""


def build_parser() -> argparse.ArgumentParser:
    return options.build_parser("demo")


def run(argv: Sequence[str] | None = None) -> int:
    return options.run_command("demo", _run, argv)


def _step(text: str) -> None:
    print(f"\n=== {text}", flush=True)


def _run(args: argparse.Namespace, _: list[str]) -> int:
    from pipelines import measure, nightly
    from pipelines.synth import run_synth

    out = os.path.abspath(args.output)
    for sub in ("data", "store", "measure", "plots"):
        shutil.rmtree(os.path.join(out, sub), ignore_errors=True)
    os.makedirs(out, exist_ok=True)
    if args.days < 2 * WINDOW + 1:
        raise InvalidParameters(f"--days must be at least {2 * WINDOW + 1} (a {WINDOW}-day window, its {WINDOW}-day "
                                f"lookback and the measured day), got {args.days}")
    start = dt.date(2026, 11, 1)
    days = [(start + dt.timedelta(days=i)).isoformat() for i in range(args.days)]
    as_of, today = days[-2], days[-1]
    lookback_days = days[-1 - WINDOW:-1]

    _step(f"1/4 synthetic conversion log: {args.days} days x ~{args.conversions_per_day:,} conversions (synth-criteo), "
          f"exported by conversion date")
    code = run_synth(["--preset", "synth-criteo", "--target-conversions", str(args.conversions_per_day * args.days),
                      "--seed", str(args.seed), "--output", os.path.join(out, "data"), "--days", str(args.days),
                      "--start-date", days[0], "--split", "train", "--partition-by", "conversion-date",
                      "--attribution-window-days", str(WINDOW), "--overwrite"])
    if code:
        return code
    history = os.path.join(out, "data", "train")

    _step(f"2/4 nightly re-optimization on {days[-1 - WINDOW]}..{as_of} ({WINDOW} days, {WINDOW} days of lookback), "
          f"tuned for one day's release -> parameter store")
    store = os.path.join(out, "store")
    code = nightly.run(["--history", history, "--as-of", as_of, "--window-days", str(WINDOW), "--lookback-days",
                        str(WINDOW), "--release-period", "1", "--store", store, "--slices", SLICES, "--values", "value",
                        "--epsilon", str(args.epsilon), "--run-id", "demo"])
    if code:
        return code

    _step(f"3/4 measure {today} with the store's latest parameters (secure noise) and {lookback_days[0]}.."
          f"{lookback_days[-1]} as lookback")
    result_dir = os.path.join(out, "measure")
    lookback = os.path.join(out, "lookback")
    shutil.rmtree(lookback, ignore_errors=True)
    for day in lookback_days:  # the lookback as its own folder of the days' files (links, not copies)
        os.makedirs(os.path.join(lookback, f"date={day}"))
        for name in os.listdir(os.path.join(history, f"date={day}")):
            os.symlink(os.path.join(history, f"date={day}", name), os.path.join(lookback, f"date={day}", name))
    code = measure.run(["--input", os.path.join(history, f"date={today}"), "--lookback", lookback, "--params", store,
                        "--output", result_dir, "--debug-run"])
    if code:
        return code

    _step("4/4 results")
    report_dir = os.path.join(store, "reports", f"{as_of}-demo")
    with open(os.path.join(report_dir, "report.json")) as fh:
        report = json.load(fh)
    summary_path = os.path.join(result_dir, outputs.private_file(outputs.RUN_SUMMARY))
    with open(summary_path) as fh:
        summary = json.load(fh)
    true_totals = os.path.join(result_dir, outputs.private_file(outputs.TRUE_TOTALS_PARQUET))  # (joined calibration)
    estimates = pd.read_parquet(true_totals if os.path.exists(true_totals)
                                else os.path.join(result_dir, outputs.release_file(outputs.ESTIMATES_PARQUET, False)))
    plots = copy_plots(result_dir, os.path.join(out, "plots"))
    shutil.copy(os.path.join(report_dir, "report.png"), os.path.join(out, "plots", "nightly_report.png"))
    print_results(report, summary, estimates)
    slice_cols = SLICES.split(",")
    truth = pd.read_parquet(os.path.join(history, f"date={today}"), columns=[*slice_cols, "value"]).groupby(
        slice_cols).agg(count=("value", "size"), value=("value", "sum"))
    realised = realised_rmsre_of_estimates(estimates, truth, slice_cols, ("count", "value"), report["taus"])
    print(f"\nthe day's release: predicted RMSRE_tau {report['predicted_rmsre_tau']:.4f} ({report['prediction']}), "
          f"realised {realised:.4f} (against the synthetic truth, which only a demo knows)")
    print("\noutputs:")
    for label, path in [("synthetic history", history), ("parameter store", store),
                        ("parameters used", summary["parameters"]["uri"]), ("nightly report", report_dir),
                        ("release (publishable)", os.path.join(result_dir, outputs.RELEASE_DIR)),
                        ("estimates", os.path.join(result_dir, outputs.release_file(outputs.ESTIMATES_CSV, False))),
                        ("operator-private", os.path.join(result_dir, outputs.PRIVATE_DIR)),
                        ("plots", ", ".join(plots + [os.path.join(out, "plots", "nightly_report.png")])),
                        ("report pages", ", ".join([os.path.join(result_dir, outputs.private_file(outputs.REPORT_HTML)),
                                                    os.path.join(report_dir, "report.html")]))]:
        print(f"  {label:<22} {path}")
    return 0


def print_results(report: dict, summary: dict, estimates: pd.DataFrame) -> None:
    p = report["params"]
    print(f"parameters {summary['parameters']['version']}: C = {p['count_limit']}, "
          + ", ".join(f"{q['column']}: clip {q['clip_threshold']:.1f}" for q in p["queries"]))
    base = report["baselines"]
    pred = report["predicted_rmsre_tau"]  # the one predicted error (the run report's, the console's, the plot's)
    print(f"predicted RMSRE_tau of one {report['release_period_days']:g}-day release ({report['prediction']}): "
          f"optimized {pred:.4f} | " + " | ".join(f"{k} {v:.4f} (x{v / pred:.1f} worse)" for k, v in base.items()))
    print(f"measured {summary['rows_read']:,} conversions: {summary['conversions_kept']:,} kept, "
          f"{summary['conversions_dropped_by_cap']:,} dropped by the cap, {summary['rows_rejected']:,} rejected; "
          f"{summary['keys']:,} keys at epsilon {summary['epsilon']:g}")
    slice_cols = [c for c in estimates.columns if c != "query" and c not in ESTIMATE_COLUMNS]
    print(estimates_line(summary.get("calibration")))
    wide = estimates.pivot_table(index=slice_cols, columns="query", values=["estimate", "ci_low", "ci_high",
                                                                            "capped_estimate"])
    top = wide.sort_values(("estimate", "count"), ascending=False).head(8)
    print("\nlargest slices: estimate [95% interval] (Alg. 4's capped-and-clipped estimate):")
    print(f"  {'slice':<12} {'count':>34} {'value':>46}")
    for idx, row in top.iterrows():
        name = "/".join(str(v) for v in (idx if isinstance(idx, tuple) else (idx,)))
        cells = []
        for q in ("count", "value"):
            cells.append(f"{row[('estimate', q)]:,.0f} [{row[('ci_low', q)]:,.0f}, {row[('ci_high', q)]:,.0f}] "
                         f"({row[('capped_estimate', q)]:,.0f})")
        print(f"  {name:<12} {cells[0]:>34} {cells[1]:>46}")


def copy_plots(result_dir: str, plot_dir: str) -> list[str]:
    """The figures measure wrote beside its report page (estimates.png; noisy_vs_unnoised.png with
    --debug-run), copied into ``plot_dir``."""
    os.makedirs(plot_dir, exist_ok=True)
    paths = []
    for name in ("estimates.png", "noisy_vs_unnoised.png"):
        source = os.path.join(result_dir, outputs.private_file(name))
        if os.path.exists(source):
            paths.append(shutil.copy(source, os.path.join(plot_dir, name)))
    return paths


if __name__ == "__main__":
    sys.exit(run())
