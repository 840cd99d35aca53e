"""Optimizer benchmark: time for all C <= 20 on statistics of 1M conversions, objective vs the scipy
reference, and the presets table (test RMSRE_tau of optimized L-inf vs both baselines, with ratios).

    python benchmarks/optimizer.py [--conversions 1000000] [--preset-conversions 50000] [--out DIR] [--monte-carlo N]
    python benchmarks/optimizer.py --quick   (every section on a few thousand conversions, scipy at eps = 8 only; CI)

Data: ``araopt.data.synthetic`` (Sec. 5.3: 256 slices, power-law impressions per slice, Poisson(10)
conversions per impression, log-normal values), scaled to the requested size.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
import pandas as pd

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from araopt.constants import EPSILONS
from araopt.data import synthetic
from araopt.evaluation.evaluate import comparison_table, evaluate_dataset, write_outputs
from araopt.io.conversions import Conversions
from araopt.optimize.search import optimize, prepare_search, scipy_paper_optimize
from araopt.optimize.statistics import StatisticsSpec, compute_statistics_in_memory

SLICES = ("campaignId", "geography", "productCategory")
PRESETS = ("synth-criteo", "synth-real-estate", "synth-travel")


def preset_conversions(name: str, target: int, split: str, seed: int = 1) -> Conversions:
    preset = synthetic.PRESETS[name]
    scale = synthetic.scale_for_target_conversions(preset, target)
    return Conversions.from_table(synthetic.generate_table(preset, seed=seed, split=split, scale=scale), SLICES, ["value"])


def click_level(n: int, d: int, seed: int = 4) -> Conversions:
    """One conversion per impression (the real-world datasets' setting)."""
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({"impression_id": np.arange(n),
                          "conversion_time": pd.to_datetime(rng.integers(0, 10**6, n), unit="s", utc=True),
                          "s": rng.zipf(1.6, n) % 200})
    for q in range(d):
        frame[f"v{q}"] = rng.lognormal(1.0 + q, 0.8 + 0.4 * q, n)
    return Conversions.from_table(frame, ["s"], [f"v{q}" for q in range(d)])


def timing(n: int, epsilons: tuple[float, ...] = (1.0, 8.0, 64.0)) -> None:
    print(f"== optimizer time, statistics of {n:,} synthetic conversions (synth-travel model), C = 1..20 ==")
    t = time.perf_counter()
    conv = preset_conversions("synth-travel", n, "train")
    t_gen = time.perf_counter() - t
    t = time.perf_counter()
    stats = compute_statistics_in_memory(conv, StatisticsSpec(SLICES, ("value",)))
    t_stats = time.perf_counter() - t
    print(f"generated {len(conv):,} conversions in {t_gen:.2f} s; statistics in {t_stats:.2f} s "
          f"({len(conv) / t_stats:,.0f} conversions/s, core combiner); size {stats.size_in_numbers():,} numbers")
    rows = []
    for eps in epsilons:
        for kind in ("exact", "relaxed"):
            ours = optimize(stats, eps, objective=kind, progress=False)
            ref = scipy_paper_optimize(stats, eps, objective=kind)
            ours_value, ref_value = ours.predicted_rmsre_tau, ref.predicted_rmsre_tau
            rows.append({"epsilon": eps, "objective": kind, "optimizer_s": ours.seconds, "scipy_s": ref.seconds,
                         "C": ours.params.count_limit, "rmsre_tau": ours_value, "scipy_C": ref.params.count_limit,
                         "scipy_rmsre_tau": ref_value, "scipy/ours": ref_value / ours_value})
    print(pd.DataFrame(rows).to_string(index=False, float_format=lambda x: f"{x:.6g}"))


def paper_workflow(n: int, epsilon: float = 8.0, max_count_limit: int = 20) -> None:
    """The paper's own workflow: per C, scipy.optimize.minimize (L-BFGS-B, from the 99% quantile)
    where every objective evaluation runs the exact error model over all raw records; vs ours
    (statistics once + Alg. 5 on them), both judged by the exact error model on the records."""
    from scipy import optimize as sp_optimize

    from araopt import KeyDomain, Params, QueryParams, expected_error, rmsre_tau
    from araopt.optimize.error_model import default_taus

    print(f"\n== the paper's workflow (scipy on raw records, {n:,} conversions, C = 1..{max_count_limit}, "
          f"eps = {epsilon:g}) vs ours ==")
    conv = preset_conversions("synth-travel", n, "train")
    domain = KeyDomain.from_slice_values(SLICES, conv.slices, ("value",))
    sidx = domain.slice_index(conv.slices)
    taus = default_taus(conv.values)
    keys = conv.record_keys()
    evaluations = 0

    def raw_objective(count_limit: int, threshold: float) -> float:
        nonlocal evaluations
        evaluations += 1
        params = Params(count_limit=count_limit, encoding="linf", epsilon=epsilon, slice_columns=SLICES,
                        queries=(QueryParams("value", max(float(threshold), 1e-6), 1.0),))
        return rmsre_tau(expected_error(conv, sidx, domain.num_slices, params, "exact", keys), taus).combined

    t = time.perf_counter()
    best = (np.inf, None)
    x0 = float(np.quantile(conv.values[:, 0], 0.99))
    for c in range(1, max_count_limit + 1):
        res = sp_optimize.minimize(lambda x, c=c: raw_objective(c, x[0]), [x0], method="L-BFGS-B", bounds=[(1e-6, None)])
        if res.fun < best[0]:
            best = (float(res.fun), (c, float(res.x[0])))
    paper_s = time.perf_counter() - t
    t = time.perf_counter()
    stats = compute_statistics_in_memory(conv, StatisticsSpec(SLICES, ("value",), max_count_limit=max_count_limit))
    ours = optimize(stats, epsilon, max_count_limit=max_count_limit, taus=taus, progress=False)
    ours_s = time.perf_counter() - t
    ours_raw = raw_objective(ours.params.count_limit, ours.params.queries[0].clip_threshold)
    print(f"paper workflow: {paper_s:7.1f} s, {evaluations:,} raw-record evaluations, best C={best[1][0]}, "
          f"C_1={best[1][1]:.4g}, exact RMSRE_tau {best[0]:.6f}")
    print(f"araopt:         {ours_s:7.2f} s (statistics + Alg. 5), C={ours.params.count_limit}, "
          f"C_1={ours.params.queries[0].clip_threshold:.4g}, exact RMSRE_tau on the records {ours_raw:.6f}")
    print(f"speed-up {paper_s / ours_s:.0f}x; objective ratio paper/ours {best[0] / ours_raw:.4f}")


def versus_scipy_click_level(n: int = 50_000, epsilons: tuple[float, ...] = EPSILONS) -> None:
    print("\n== one conversion per impression: ours vs scipy.optimize.minimize from the paper's start (same objective) ==")
    rows = []
    for d in (1, 3):
        conv = click_level(n, d)
        stats = compute_statistics_in_memory(conv, StatisticsSpec(("s",), conv.value_columns))
        ctx = prepare_search(stats)
        for eps in epsilons:
            for kind in ("exact", "relaxed"):
                ours = optimize(stats, eps, objective=kind, progress=False, context=ctx)
                ref = scipy_paper_optimize(stats, eps, objective=kind, context=ctx)
                ours_value, ref_value = ours.predicted_rmsre_tau, ref.predicted_rmsre_tau
                rows.append({"d": d, "epsilon": eps, "objective": kind, "C": ours.params.count_limit,
                             "ours": ours_value, "scipy": ref_value, "scipy/ours": ref_value / ours_value,
                             "ours_s": ours.seconds, "scipy_s": ref.seconds})
    frame = pd.DataFrame(rows)
    print(frame.to_string(index=False, float_format=lambda x: f"{x:.6g}"))
    print(f"ours <= scipy everywhere: {bool((frame['ours'] <= frame['scipy'] * (1 + 1e-9)).all())}")


def presets_table(n: int, out: str, monte_carlo: int) -> None:
    print(f"\n== presets: test RMSRE_tau (exact analytic), {n:,} train / test conversions each, optimized on train ==")
    evaluations = []
    spec = StatisticsSpec(SLICES, ("value",))
    for name in PRESETS:
        train = preset_conversions(name, n, "train")
        test = preset_conversions(name, n, "test")
        evaluations.append(evaluate_dataset(name, compute_statistics_in_memory(train, spec), test,
                                            test_stats=compute_statistics_in_memory(test, spec), monte_carlo=monte_carlo))
    results = pd.concat([e.results for e in evaluations], ignore_index=True)
    table = comparison_table(results)
    cols = ["dataset", "epsilon", "optimized_linf", "optimized_l1", "baseline_q95", "baseline_q99",
            "baseline_q95/linf", "baseline_q99/linf"]
    print(table[cols].to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    better = (table["baseline_q95/linf"] > 1) & (table["baseline_q99/linf"] > 1)
    print(f"optimized L-inf strictly below both baselines at every (preset, epsilon): {bool(better.all())}")
    lin = results[results["method"] == "optimized_linf"][["dataset", "epsilon", "count_limit"]]
    print("chosen C:", "; ".join(f"{d}: " + ",".join(str(c) for c in g["count_limit"]) for d, g in lin.groupby("dataset")))
    gaps = pd.concat([e.gaps for e in evaluations], ignore_index=True)
    print("\ngeneralization gap (test RMSRE_tau tuned on train minus tuned on test):")
    print(gaps.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    if monte_carlo:
        print("\nMonte-Carlo vs analytic:")
        print(results[["dataset", "epsilon", "method", "test_rmsre_tau", "mc_rmsre_tau", "mc_std_error", "mc_z"]]
              .to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    paths = write_outputs(evaluations, out)
    print(f"\nwrote {', '.join(os.path.basename(p) for p in paths.values())} to {out}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conversions", type=int, default=1_000_000)
    parser.add_argument("--preset-conversions", type=int, default=50_000)
    parser.add_argument("--monte-carlo", type=int, default=0)
    parser.add_argument("--paper-workflow-conversions", type=int, default=200_000,
                        help="size for the scipy-on-raw-records comparison (0 = skip)")
    parser.add_argument("--click-conversions", type=int, default=50_000,
                        help="size of each one-conversion-per-impression log compared with scipy")
    parser.add_argument("--out", default=None, help="directory for CSV/PNG (default: a temporary directory)")
    parser.add_argument("--quick", action="store_true",
                        help="a few seconds: 2,000 conversions per section, 1,000 per scipy log, scipy at eps = 8 only")
    args = parser.parse_args()
    scipy_epsilons: dict[str, tuple[float, ...]] = {}
    if args.quick:
        args.conversions, args.preset_conversions, args.paper_workflow_conversions = 2_000, 2_000, 1_000
        args.click_conversions = 1_000
        scipy_epsilons = {"epsilons": (8.0,)}
    timing(args.conversions, **scipy_epsilons)
    if args.paper_workflow_conversions:
        paper_workflow(args.paper_workflow_conversions)
    versus_scipy_click_level(args.click_conversions, **scipy_epsilons)
    presets_table(args.preset_conversions, args.out or tempfile.mkdtemp(prefix="araopt-bench-"), args.monte_carlo)
    return 0


if __name__ == "__main__":
    sys.exit(main())
