"""`araopt optimize`: choose C, clip thresholds and budget fractions on a conversion history (Alg. 6).

    araopt optimize --history 'logs/*.parquet' --slices campaignId,geography --values value \
        --epsilon 8 [--encoding linf|l1] [--max-count-limit 20] [--objective exact|relaxed] \
        --out params.json [Beam options]

Statistics (bounded, mergeable; ``araopt.statistics``) are computed by the Beam transform
``transforms.statistics.compute_statistics``; the optimizer (``araopt.optimizer``) runs on the
driver, with a progress bar over candidate C. The parameter file records the predicted training
RMSRE_tau of the result and of the paper's baselines (q = 0.95 and 0.99).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Sequence

import numpy as np
import pandas as pd

from pipelines.options import OneLineParser
from araopt.params import check_epsilon
from araopt.statistics import DEFAULT_MAX_COUNT_LIMIT, StatisticsSpec

PROG = "araopt optimize"


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Any other --option is passed to Apache Beam (e.g. --runner DataflowRunner ...).")
    parser.add_argument("--history", required=True, help="Parquet conversion log: file, directory or glob (local or gs://)")
    parser.add_argument("--slices", required=True, help="comma-separated slice columns")
    parser.add_argument("--values", required=True, help="comma-separated value (query) columns")
    parser.add_argument("--epsilon", required=True, type=float, help="privacy budget, in (0, 64]")
    parser.add_argument("--encoding", choices=("linf", "l1"), default="linf", help="Alg. 2 (linf, default) or Alg. 5 (l1)")
    parser.add_argument("--max-count-limit", type=int, default=DEFAULT_MAX_COUNT_LIMIT,
                        help="largest count limit C tried (default 20: Chrome's limit of aggregatable reports per source)")
    parser.add_argument("--objective", choices=("exact", "relaxed"), default="exact",
                        help="exact (Thm. 4.2: DLap variance, rounding, floors; default) or the paper's Relaxation 4.3")
    parser.add_argument("--l1-rounding", choices=("randomized", "floor"), default="randomized",
                        help="L1 rounding written to the file (default randomized: unbiased)")
    parser.add_argument("--out", required=True, help="output parameter file (.json)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def split_columns(text: str, what: str) -> tuple[str, ...]:
    cols = tuple(c.strip() for c in text.split(",") if c.strip())
    if not cols and what == "--values":
        raise ValueError(f"{what} must name at least one column")
    if len(set(cols)) != len(cols):
        raise ValueError(f"{what} lists a column twice: {text!r}")
    return cols


def result_table(rows: list[dict]) -> str:
    frame = pd.DataFrame(rows)
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.float_format", "{:.6g}".format):
        return frame.to_string(index=False)


def run_optimize(argv: Sequence[str] | None = None) -> int:
    from .options import cli_main

    return cli_main(_run, argv, PROG)


def _run(argv: list[str]) -> int:
    from araopt.tuning import tune
    from transforms.io import check_input

    from .history import compute_statistics, report_rejections

    args, beam_args = build_parser().parse_known_args(argv)
    epsilon = check_epsilon(args.epsilon, "--epsilon")
    if args.max_count_limit < 1:
        raise ValueError(f"--max-count-limit must be >= 1, got {args.max_count_limit}")
    slices = split_columns(args.slices, "--slices")
    values = split_columns(args.values, "--values")
    spec = StatisticsSpec(slices, values, max_count_limit=args.max_count_limit)  # validates column overlap
    inputs = check_input(args.history, slices, values)
    run = compute_statistics(inputs, spec, beam_args)
    report_rejections(PROG, run.counts)
    stats = run.statistics
    tuning = tune(stats, epsilon, encoding=args.encoding, max_count_limit=args.max_count_limit, kind=args.objective,
                  l1_rounding=args.l1_rounding, training_window=(inputs.first_time, inputs.last_time),
                  rows=run.counts.rows_valid, progress=not args.no_progress,
                  provenance={"history": args.history, "row_accounting": {
                      "rows_read": run.counts.rows_read, "rows_rejected": run.counts.rows_rejected,
                      "rows_rejected_by_reason": dict(run.counts.rejected_by_reason)}})
    result = tuning.optimization
    rows = [{"method": f"optimized {args.encoding}", "C": result.params.count_limit,
             "thresholds": ", ".join(f"{q.clip_threshold:.4g}" for q in result.params.queries),
             "fractions": ", ".join("-" if q.budget_fraction is None else f"{q.budget_fraction:.3f}" for q in result.params.queries),
             "train RMSRE_tau": result.objective, "ratio": 1.0}]
    for b in tuning.baselines:
        p = b.params
        rows.append({"method": b.name, "C": p.count_limit,
                     "thresholds": ", ".join(f"{qq.clip_threshold:.4g}" for qq in p.queries),
                     "fractions": ", ".join(f"{qq.budget_fraction:.3f}" for qq in p.queries) + f" (+count {p.count_budget_fraction:.3f})",
                     "train RMSRE_tau": b.rmsre_tau, "ratio": b.rmsre_tau / result.objective})
    tuning.params.save(args.out)
    print(f"{stats.num_conversions} conversions, {stats.num_impressions} impressions, {stats.num_slices} slices; "
          f"epsilon = {epsilon:g}, objective = {args.objective}, taus = {', '.join(f'{t:.4g}' for t in result.taus)}")
    print(result_table(rows))
    print(f"wrote {args.out}  (optimizer {result.seconds:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(run_optimize())
