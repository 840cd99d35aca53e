"""`araopt evaluate`: test RMSRE_tau of optimized L-inf, optimized L1 and the baselines (Sec. 5, Fig. experiments).

    araopt evaluate --train 'train/*.parquet' --test 'test/*.parquet' [--name synth-travel] \
        [--train ... --test ... --name ...]  --slices a,b --values v \
        --epsilons 1,2,4,8,16,32,64 --out DIR [--monte-carlo N] [--max-count-limit 20] [Beam options]

Parameters are optimized on the training statistics (Beam, ``transforms.statistics``); the test
error is the exact analytic expectation (``error_model``) on the test records, read into memory.
With --monte-carlo N the real mechanism runs N times per (epsilon, method) and the empirical
RMSRE_tau is reported beside the prediction. Also reported: the generalization gap (test error of
parameters tuned on train minus tuned on test). Writes rmsre.csv, comparison.csv,
generalization_gap.csv, count_limit.csv, rmsre.png and count_limit.png into DIR.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

import pandas as pd

from araopt.evaluation import METHODS, comparison_table, evaluate_dataset, write_outputs
from araopt.params import check_epsilon
from pipelines.options import OneLineParser
from araopt.statistics import DEFAULT_MAX_COUNT_LIMIT, StatisticsSpec, compute_statistics_in_memory

from transforms.io import check_input

from .history import compute_statistics, load_conversions, report_rejections
from .optimize import split_columns

PROG = "araopt evaluate"


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train", action="append", required=True, help="training log (repeat for several datasets)")
    parser.add_argument("--test", action="append", required=True, help="test log (one per --train)")
    parser.add_argument("--name", action="append", default=None, help="dataset name (one per --train; default: dataset1, ...)")
    parser.add_argument("--slices", required=True, help="comma-separated slice columns")
    parser.add_argument("--values", required=True, help="comma-separated value columns")
    parser.add_argument("--epsilons", default="1,2,4,8,16,32,64", help="comma-separated epsilons in (0, 64]")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--monte-carlo", type=int, default=0, help="mechanism runs per (epsilon, method); 0 = off")
    parser.add_argument("--seed", type=int, default=0, help="first simulation seed of the Monte-Carlo runs")
    parser.add_argument("--max-count-limit", type=int, default=DEFAULT_MAX_COUNT_LIMIT, help="C_max (default 20)")
    parser.add_argument("--objective", choices=("exact", "relaxed"), default="exact", help="optimizer objective")
    parser.add_argument("--methods", default=",".join(METHODS), help=f"subset of {','.join(METHODS)}")
    parser.add_argument("--no-gap", action="store_true", help="skip the generalization gap (tuning on test)")
    return parser


def parse_epsilons(text: str) -> list[float]:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise ValueError("--epsilons must list at least one value")
    return [check_epsilon(p, "--epsilons") for p in parts]


def run_evaluate(argv: Sequence[str] | None = None) -> int:
    from .options import cli_main

    return cli_main(_run, argv, PROG)


def _run(argv: list[str]) -> int:
    args, beam_args = build_parser().parse_known_args(argv)
    epsilons = parse_epsilons(args.epsilons)
    if args.max_count_limit < 1:
        raise ValueError(f"--max-count-limit must be >= 1, got {args.max_count_limit}")
    if args.monte_carlo < 0 or args.monte_carlo == 1:
        raise ValueError(f"--monte-carlo must be 0 (off) or >= 2, got {args.monte_carlo}")
    if len(args.train) != len(args.test):
        raise ValueError(f"give one --test per --train ({len(args.train)} vs {len(args.test)})")
    names = args.name or [f"dataset{i + 1}" for i in range(len(args.train))]
    if len(names) != len(args.train):
        raise ValueError(f"give one --name per --train ({len(names)} vs {len(args.train)})")
    methods = split_columns(args.methods, "--methods")
    unknown = set(methods) - set(METHODS)
    if unknown:
        raise ValueError(f"unknown --methods {sorted(unknown)}; known: {', '.join(METHODS)}")
    slices = split_columns(args.slices, "--slices")
    values = split_columns(args.values, "--values")
    spec = StatisticsSpec(slices, values, max_count_limit=args.max_count_limit)
    trains = [check_input(p, slices, values) for p in args.train]  # every input is checked before any work
    tests = [check_input(p, slices, values) for p in args.test]

    evaluations = []
    for name, train, test in zip(names, trains, tests):
        run = compute_statistics(train, spec, beam_args)
        report_rejections(f"{PROG} ({name}, train)", run.counts)
        train_stats = run.statistics
        test_conv, test_counts, _ = load_conversions(test, slices, values, what="test log")
        report_rejections(f"{PROG} ({name}, test)", test_counts)
        test_stats = compute_statistics_in_memory(test_conv, spec)
        print(f"{name}: {train_stats.num_conversions} training and {len(test_conv)} test conversions", file=sys.stderr)
        evaluations.append(evaluate_dataset(
            name, train_stats, test_conv, epsilons, test_stats=test_stats, max_count_limit=args.max_count_limit,
            kind=args.objective, monte_carlo=args.monte_carlo, seed=args.seed, methods=methods, gap=not args.no_gap,
            progress=True))
    paths = write_outputs(evaluations, args.out)
    results = pd.concat([e.results for e in evaluations], ignore_index=True)
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.float_format", "{:.4g}".format):
        print(comparison_table(results).to_string(index=False))
        if args.monte_carlo:
            cols = ["dataset", "epsilon", "method", "test_rmsre_tau", "mc_rmsre_tau", "mc_std_error", "mc_z"]
            print(results[cols].to_string(index=False))
        gaps = pd.concat([e.gaps for e in evaluations], ignore_index=True)
        if not gaps.empty:
            print(gaps.to_string(index=False))
    print("wrote " + ", ".join(os.path.basename(p) for p in paths.values()) + f" to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(run_evaluate())
