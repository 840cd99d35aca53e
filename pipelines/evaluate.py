"""`araopt evaluate`: test RMSRE_tau of optimized L-inf, optimized L1 and the baselines (Sec. 5, Fig. experiments).

    araopt evaluate --train 'train/*.parquet' --test 'test/*.parquet' [--name synth-travel] \
        [--train ... --test ... --name ...]  --slices a,b --values v \
        --epsilons 1,2,4,8,16,32,64 --out DIR [--monte-carlo N] [--max-count-limit 20]

In memory, each log read once: the exact error model needs the test records, the calibration and the
test's lookback need the training records, so the training statistics are computed from the same read
(``compute_statistics_in_memory``, the combiner the Beam jobs run per shard). Parameters are optimized
on the training statistics; the test error is the exact analytic expectation (``error_model``).
With --monte-carlo N the real mechanism runs N times per (epsilon, method) and the empirical
RMSRE_tau is reported beside the prediction. Also reported: the generalization gap (test error of
parameters tuned on train minus tuned on test). Writes rmsre.csv, comparison.csv,
generalization_gap.csv, count_limit.csv, rmsre.png and count_limit.png into DIR.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from araopt.errors import InvalidParameters

from . import options
from .values import parse_tau, split_columns

PROG = "araopt evaluate"


def build_parser() -> argparse.ArgumentParser:
    return options.build_parser("evaluate")


def parse_epsilons(text: str) -> list[float]:
    from araopt.errors import check_epsilon

    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise InvalidParameters("--epsilons must list at least one value")
    return [check_epsilon(p, "--epsilons") for p in parts]


def dataset_names(args: argparse.Namespace) -> list[str]:
    """One --test and one name per --train (default dataset1, ...)."""
    if len(args.train) != len(args.test):
        raise InvalidParameters(f"give one --test per --train ({len(args.train)} vs {len(args.test)})")
    names = args.name or [f"dataset{i + 1}" for i in range(len(args.train))]
    if len(names) != len(args.train):
        raise InvalidParameters(f"give one --name per --train ({len(names)} vs {len(args.train)})")
    return list(names)


def run(argv: Sequence[str] | None = None) -> int:
    return options.run_command("evaluate", _run, argv)


run_evaluate = run


def _run(args: argparse.Namespace, _: list[str]) -> int:
    import pandas as pd

    from araopt.evaluation.evaluate import comparison_table, evaluate_dataset, write_outputs
    from araopt.evaluation.methods import METHODS
    from araopt.io.conversions import Conversions, concat_periods
    from araopt.io.folders import EVALUATION_FOLDER, OutputFolder, check_target
    from araopt.io.progress import Progress
    from araopt.optimize.statistics import StatisticsSpec, compute_statistics_in_memory
    from araopt.optimize.tune import resolve_taus
    from transforms.io import InputFiles, check_input

    from .inputs import load_conversions, refuse_ara_only, report_rejections

    epsilons = parse_epsilons(args.epsilons)
    if args.api == "attribution":
        if args.monte_carlo < 0:
            raise InvalidParameters(f"--monte-carlo must be >= 0, got {args.monte_carlo}")
        refuse_ara_only(args, PROG, ("lookback", "tau"))
    elif args.monte_carlo < 0 or args.monte_carlo == 1:
        raise InvalidParameters(f"--monte-carlo must be 0 (off) or >= 2, got {args.monte_carlo}")
    names = dataset_names(args)
    if args.api == "attribution":
        return _run_attribution(args, names, epsilons)
    check_target(args.output, args.overwrite, EVALUATION_FOLDER)  # before any work; again at commit
    tau_overrides = parse_tau(args.tau)
    methods = split_columns(args.methods, "--methods")
    unknown = set(methods) - set(METHODS)
    if unknown:
        raise InvalidParameters(f"unknown --methods {sorted(unknown)}; known: {', '.join(METHODS)}")
    slices = split_columns(args.slices, "--slices")
    values = split_columns(args.values, "--values")
    spec = StatisticsSpec(slices, values, max_count_limit=args.max_count_limit)
    trains = [check_input(p, slices, values) for p in args.train]  # every input is checked before any work
    tests = [check_input(p, slices, values) for p in args.test]
    lookback = check_input(args.lookback, slices, values) if args.lookback else None

    folder = OutputFolder.prepare(args.output, args.overwrite, PROG, EVALUATION_FOLDER)
    with folder:  # whole or absent: written into a staging folder, moved into place at the end
        progress = Progress(PROG, enabled=not args.no_progress)

        def read(inputs: InputFiles, what: str, dead_letter: str | None) -> Conversions:
            """One read of a log into memory (the same validation and gate as the jobs), its rejected rows
            to the evaluation's dead letter."""
            conversions, counts, rejected = load_conversions(inputs, slices, values, args.max_rejected_fraction,
                                                             what=what)
            path = None
            if rejected.num_rows and dead_letter is not None:
                import pyarrow.parquet as pq

                os.makedirs(os.path.join(folder.staging, "dead_letter"), exist_ok=True)
                pq.write_table(rejected, os.path.join(folder.staging, "dead_letter", dead_letter))
                path = os.path.join(args.output, "dead_letter", dead_letter)
            report_rejections(f"{PROG} ({what})", counts, path)
            return conversions

        earliest = read(lookback, "lookback", "lookback.parquet") if lookback is not None else None
        evaluations = []
        for name, train, test in zip(names, trains, tests, strict=True):
            # each log is read once: the training log gives the statistics (ranks over each impression's
            # life, with the lookback), the calibration and, as the browser caps over an impression's life,
            # the test's lookback
            progress(f"{name}: reading the training log ({len(train.paths)} file(s), {train.rows:,} rows)")
            train_conv = read(train, f"{name}, training log", f"{name}-train.parquet")
            train_full = train_conv if earliest is None else concat_periods(train_conv, earliest)
            progress(f"{name}: statistics of the training log")
            train_stats = compute_statistics_in_memory(train_full, spec)
            progress(f"{name}: reading the test log ({len(test.paths)} file(s), {test.rows:,} rows)")
            test_conv = read(test, f"{name}, test log", f"{name}-test.parquet")
            progress(f"{name}: the test log's lookback (its impressions' earlier conversions) and statistics")
            test_conv = concat_periods(test_conv, train_full)
            test_stats = compute_statistics_in_memory(test_conv, spec)
            period = float(test_stats.history_days())
            taus, tau_rule = resolve_taus(train_stats, tau_overrides)
            print(f"{name}: {tau_rule}", file=sys.stderr)
            print(f"{name}: {train_stats.num_conversions} training conversions over {train_stats.history_days()} day(s), "
                  f"{test_stats.num_conversions} test conversions over {period:g} day(s): every method is tuned for one "
                  f"release of {period:g} day(s)", file=sys.stderr)
            evaluations.append(evaluate_dataset(
                name, train_stats, test_conv, epsilons, test_stats=test_stats, max_count_limit=args.max_count_limit,
                kind=args.objective, monte_carlo=args.monte_carlo, seed=args.seed, methods=methods, gap=not args.no_gap,
                progress=not args.no_progress, taus=taus, train_conversions=train_full, release_period_days=period,
                stages=progress))
        paths = write_outputs(evaluations, folder.staging)
        folder.commit({"command": "evaluate", "datasets": list(names), "epsilons": epsilons, "methods": list(methods)})
        results = pd.concat([e.results for e in evaluations], ignore_index=True)
        with pd.option_context("display.width", 200, "display.max_columns", 20, "display.float_format", "{:.4g}".format):
            print(comparison_table(results).to_string(index=False))
            if args.monte_carlo:
                cols = ["dataset", "epsilon", "method", "test_rmsre_tau", "mc_rmsre_tau", "mc_std_error", "mc_z"]
                cols += [c for c in results.columns if c.startswith("coverage_")]  # of the TRUE totals, nominal 95%
                print(results[[c for c in cols if c in results.columns]].to_string(index=False))
            gaps = pd.concat([e.gaps for e in evaluations], ignore_index=True)
            if not gaps.empty:
                print(gaps.to_string(index=False))
    best = results.loc[results.groupby(["dataset", "epsilon"])["test_rmsre_tau"].idxmin(), "method"]
    leader = "corrected" if "corrected" in set(results["method"]) else "optimized_linf"
    wins = int((best == leader).sum())
    what = "the released (corrected) estimates have" if leader == "corrected" else "optimized linf has"
    print(f"{PROG}: {len(results)} (dataset, epsilon, method) results; {what} the lowest test RMSRE_tau "
          f"in {wins} of {len(best)} (dataset, epsilon) cases; wrote "
          + ", ".join(os.path.basename(p) for p in paths.values()) + f" to {args.output}")
    return 0


def _run_attribution(args: argparse.Namespace, names: Sequence[str], budgets: Sequence[float]) -> int:
    """``evaluate --api attribution``: per dataset and per-site budget, the optimized parameters (tuned on
    train) against the baselines on test (``evaluation.attribution``); writes ``attribution.csv``."""
    import pandas as pd

    from araopt.evaluation.attribution import evaluate_attribution, evaluation_table
    from araopt.io.folders import EVALUATION_FOLDER, OutputFolder, check_target
    from araopt.mechanism.keys import DATA
    from araopt.optimize.attribution import history_domain

    from .inputs import read_attribution_history

    slices = split_columns(args.slices, "--slices")
    values = split_columns(args.values, "--values")
    check_target(args.output, args.overwrite, EVALUATION_FOLDER)
    tables = []
    with OutputFolder.prepare(args.output, args.overwrite, PROG, EVALUATION_FOLDER) as folder:
        for name, train_path, test_path in zip(names, args.train, args.test, strict=True):
            train, _ = read_attribution_history(f"{PROG} ({name}, training log)", train_path, slices, values,
                                                args.max_rejected_fraction, "training log")
            test, _ = read_attribution_history(f"{PROG} ({name}, test log)", test_path, slices, values,
                                               args.max_rejected_fraction, "test log")
            domain = history_domain(pd.concat([train[list(slices)], test[list(slices)]]), slices, values, DATA)
            evaluations = evaluate_attribution(train, test, domain, values, slices, budgets, runs=args.monte_carlo,
                                               seed=args.seed, max_count_limit=args.max_count_limit)
            table = evaluation_table(evaluations)
            table.insert(0, "dataset", name)
            tables.append(table)
        results = pd.concat(tables, ignore_index=True)
        results.to_csv(os.path.join(folder.staging, "attribution.csv"), index=False)
        folder.commit({"command": "evaluate", "api": "attribution", "datasets": list(names),
                       "budgets": list(budgets)})
    with pd.option_context("display.width", 250, "display.max_columns", 20, "display.float_format", "{:.4g}".format):
        print(results.to_string(index=False))
    opt = results[results["method"] == "optimized"]
    ratios = opt["ratio_to_best_baseline"].dropna()  # (a cell with no releasable baseline has none)
    versus = (f"optimized / best baseline max {ratios.max():.4g}" if len(ratios)
              else "no baseline releasable at these budgets")
    print(f"{PROG}: api attribution, {len(opt)} (dataset, budget) cells: {versus}, tuned-on-train / tuned-on-test max "
          f"{opt['tuned_train/test'].max():.4g}"
          + (f", coverage of the intervals of the true totals min {opt['coverage'].min():.4g}" if args.monte_carlo else "")
          + f"; wrote attribution.csv to {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run())
