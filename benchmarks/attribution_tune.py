"""W3C Attribution Level 1: ParameterOptimization (Alg. 5, ``araopt.optimize.attribution``) against the
baselines (the spec's defaults; the q95 maxValue with an equal split) on the three synthetic presets
with users and two logs of our own, per per-site budget. Prints, per (log, budget): every method's
analytic test RMSRE_tau, its realised RMSRE_tau and interval coverage over --runs seeded measurements,
the optimized / best-baseline ratio and tuned-on-train / tuned-on-test; then the checks
(ratio <= 1 in every cell, coverage >= 0.90, generalization <= 1.25).

Own logs: ``heavy-users`` (synth-travel's values, 10 impressions per browser: many conversions per
browser and epoch, the budget binds) and ``whales`` (heavy-tailed values, mu 3, sigma 2, 5 impressions
per browser). Train and test are the generator's independent splits of one seed.

Run: .venv/bin/python benchmarks/attribution_tune.py [--conversions N] [--runs R] [--budgets 1,4,10]
"""
from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np
import pandas as pd

from araopt.data import synthetic
from araopt.evaluation.attribution import OPTIMIZED, evaluate_attribution, evaluation_table
from araopt.io.conversions import ATTRIBUTION_COLUMNS, validate_batch
from araopt.mechanism.keys import KeyDomain

SLICES = ("campaignId",)
VALUES = ("value",)


def logs() -> dict[str, synthetic.SyntheticPreset]:
    presets = dict(synthetic.PRESETS)
    presets["heavy-users"] = dataclasses.replace(presets["synth-travel"], name="heavy-users", impressions_per_user=10.0)
    presets["whales"] = dataclasses.replace(presets["synth-criteo"], name="whales", mu=3.0, sigma=2.0,
                                            impressions_per_user=5.0)
    return presets


def rows(preset: synthetic.SyntheticPreset, split: str, conversions: float, seed: int) -> pd.DataFrame:
    scale = synthetic.scale_for_target_conversions(preset, conversions)
    table = synthetic.generate_table(preset, seed=seed, split=split, scale=scale)
    batch = validate_batch(table, SLICES, VALUES, passthrough=ATTRIBUTION_COLUMNS)
    return batch.valid.to_pandas()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--conversions", type=float, default=20_000, help="target conversions per split")
    parser.add_argument("--runs", type=int, default=20, help="seeded measurements per method (coverage)")
    parser.add_argument("--budgets", default="1,4,10")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--logs", default=",".join(logs()))
    args = parser.parse_args()
    budgets = [float(b) for b in args.budgets.split(",")]
    checks = []
    pd.set_option("display.width", 250)
    pd.set_option("display.max_columns", 20)
    for name in args.logs.split(","):
        preset = logs()[name]
        start = time.process_time()
        train, test = (rows(preset, s, args.conversions, args.seed) for s in ("train", "test"))
        domain = KeyDomain.from_slice_values(SLICES, {"campaignId": np.arange(16)}, ("count", *VALUES))
        evaluations = evaluate_attribution(train, test, domain, VALUES, SLICES, budgets, runs=args.runs,
                                           seed=args.seed)
        per_browser = train.groupby("browser_id").size().mean()
        print(f"\n== {name}: {len(train):,} train / {len(test):,} test conversions, {per_browser:.1f} conversions per "
              f"browser, {time.process_time() - start:.0f} s CPU")
        print(evaluation_table(evaluations).to_string(index=False, float_format="{:.4g}".format))
        for e in evaluations:
            opt = e.optimized
            checks.append((name, e.budget, e.ratio, opt.coverage, e.generalization))
    print("\n== checks (ratio: optimized / best baseline, analytic test RMSRE_tau; coverage of the optimized "
          "parameters' intervals of the true totals; generalization: tuned on train / tuned on test)")
    print(pd.DataFrame(checks, columns=["log", "budget", "ratio", "coverage", "generalization"]).to_string(
        index=False, float_format="{:.4f}".format))
    ok_ratio = all(c[2] <= 1.0 for c in checks)
    ok_cov = all(c[3] is None or c[3] >= 0.90 for c in checks)
    ok_gen = all(c[4] <= 1.25 for c in checks)
    print(f"optimized <= best baseline in every cell: {ok_ratio}; coverage >= 0.90: {ok_cov}; "
          f"generalization <= 1.25: {ok_gen} ({OPTIMIZED} over {len(checks)} cells)")


if __name__ == "__main__":
    main()
