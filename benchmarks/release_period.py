"""Daily releases: tuned on a window of days, measured one day at a time (conversion-date periods).

Data: a synthetic log per preset (and a log with another law of conversions per impression), with
impressions over ``--days`` days and their conversions over the following attribution window, cut
by conversion date, as a data engineer exports it. For each test day D:

  * train = the ``--train-days`` days before D, with a 30-day lookback before them (rows that only
    give every conversion its lifetime rank, as Chrome caps a source over its whole life);
  * test  = day D, with the 30 days before it as its lookback (what ``measure --lookback`` reads).

Methods, tuned on train for a release of one day (``tuning.tune(..., release_period_days=1)``):
``released`` (objective corrected + the calibration fitted on train: what ``measure`` publishes),
``optimized_linf`` (the paper's estimator), the two baselines (Sec. 5.1). ``tuned_on_day``: the
released method with parameters tuned on the test day itself (an oracle; calibrated on train like the
others): the ratio train / day says how much tuning on the window costs. Test RMSRE_tau is analytic
and exact on the test day's records (``evaluation.analytic_rmsre`` / ``corrected_rmsre``), taus from
train (Sec. 5.1).

Run: .venv/bin/python benchmarks/release_period.py [--per-day 40000] [--train-days 9 28] [--epsilons 1 4 16 64]
"""
from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np
import pandas as pd

import araopt.calibration as cb
from araopt.constants import Objective
from araopt.data import synthetic
from araopt.evaluation.evaluate import _domain, analytic_rmsre, conversions_breakdown, corrected_rmsre, interval_coverage
from araopt.evaluation.metrics import realised_rmsre_tau
from araopt.io.conversions import Conversions
from araopt.mechanism.measure import measure
from araopt.optimize import tune as tuning
from araopt.optimize.statistics import StatisticsSpec, compute_statistics_in_memory
from araopt.publication import publish

SLICES = ("campaignId", "geography", "productCategory")
DAY_US = 86_400_000_000
LOOKBACK_DAYS = 30


@dataclasses.dataclass
class DailyLog:
    name: str
    conversions: Conversions
    day: np.ndarray  # UTC conversion day index, from the first impression day (0)

    def window(self, first: int, last: int, lookback_days: int = LOOKBACK_DAYS) -> Conversions:
        """Days [first, last] as the period, the ``lookback_days`` before as lookback (rows of the
        period's impressions only: the others cannot change a period row's rank)."""
        period = (self.day >= first) & (self.day <= last)
        ids = np.unique(self.conversions.impression_id[period])
        before = (self.day >= first - lookback_days) & (self.day < first)
        before &= np.isin(self.conversions.impression_id, ids)
        rows = np.flatnonzero(period | before)
        sub = self.conversions.take(rows)
        return dataclasses.replace(sub, in_period=period[rows])


def daily_log(name: str, preset: synthetic.SyntheticPreset, per_day: int, days: int, seed: int) -> DailyLog:
    total = per_day * days
    scale = synthetic.scale_for_target_conversions(preset, total)
    table = synthetic.generate_table(preset, seed=seed, scale=scale, days=days)
    conv = Conversions.from_table(table, SLICES, ["value"])
    start = int(np.floor_divide(table.column("impression_time").cast("int64").to_numpy().min(), DAY_US))
    return DailyLog(name, conv, np.floor_divide(conv.conversion_time, DAY_US) - start)


def geometric_log(per_day: int, days: int, seed: int, pareto: bool = False) -> DailyLog:
    """Conversions per impression ~ Geometric (mean 4: many singles and a long tail, where the presets
    have Poisson(10)), delays ~ Exponential(5 days) (the presets: uniform over 30 days), a weekday
    cycle in impressions, Zipf slices; values LogNormal(3, 1.3), or with ``pareto`` 20 (1 + Pareto(2.5))
    (finite variance, infinite fourth moment: a single day's error is then usually well below its
    expectation, which is what the model predicts)."""
    rng = np.random.default_rng(seed)
    mean_size = 4.0
    weekday = np.array([0.85, 0.9, 0.95, 1.0, 1.05, 1.3, 0.95])
    ids, times, vals, slice_cols = [], [], [], {c: [] for c in SLICES}
    next_id = 0
    for d in range(days):
        n_imp = rng.poisson(per_day / mean_size * weekday[d % 7])
        sizes = rng.geometric(1.0 / mean_size, n_imp)
        slice_of = np.minimum(rng.zipf(1.6, n_imp) - 1, 255)
        imp_t = d * DAY_US + rng.integers(0, DAY_US, n_imp)
        rep = np.repeat(np.arange(n_imp), sizes)
        offset = rng.exponential(5 * DAY_US, len(rep)).astype(np.int64)  # most conversions within days
        ids.append(next_id + rep)
        times.append(imp_t[rep] + np.minimum(offset, 30 * DAY_US - 1))
        vals.append((rng.pareto(2.5, len(rep)) + 1) * 20 if pareto else rng.lognormal(3.0, 1.3, len(rep)))
        for i, c in enumerate(SLICES):
            card = (16, 8, 2)[i]
            div = (16, 2, 1)[i]
            slice_cols[c].append((slice_of[rep] // div) % card)
        next_id += n_imp
    t = np.concatenate(times)
    conv = Conversions(np.concatenate(ids).astype(np.int64), t, {c: np.concatenate(v) for c, v in slice_cols.items()},
                       np.concatenate(vals).reshape(-1, 1), ("value",))
    return DailyLog("geometric-pareto" if pareto else "geometric-weekday", conv, np.floor_divide(t, DAY_US))


def tuned(stats, train: Conversions, eps: float, period_days: float | None, history_days: float,
          taus) -> tuning.TuningResult:
    """The released method tuned on ``stats``, its calibration fitted on ``train`` (the history)."""
    res = tuning.tune(stats, eps, objective=Objective.CORRECTED, taus=list(taus), release_period_days=period_days,
                      history_days=history_days)
    cals = [cb.calibration_statistics(train, v.params, cb.day_blocks(train), fitted_for=v.checksum())
            for v, _ in res.candidates]
    return tuning.calibrate(res, cals, period_days)


def run_case(log: DailyLog, test_day: int, train_days: int, epsilons, spec: StatisticsSpec,
             period: float | None = 1.0) -> list[dict]:
    train = log.window(test_day - train_days, test_day - 1)
    test = log.window(test_day, test_day)
    train_stats = compute_statistics_in_memory(train, spec)
    test_stats = compute_statistics_in_memory(test, spec)
    taus = train_stats.taus()
    rows = []
    for eps in epsilons:
        on_train = tuned(train_stats, train, eps, period, train_days, taus)
        on_day = tuned(test_stats, train, eps, 1.0, 1.0, taus)  # the day's parameters, the same calibration data
        paper = tuning.tune(train_stats, eps, objective=Objective.EXACT, taus=list(taus), release_period_days=period,
                            history_days=train_days)
        result = {
            "released": corrected_rmsre(on_train.version, test, taus).combined,
            "optimized_linf": analytic_rmsre(paper.params, test, taus).combined,
            "tuned_on_day": corrected_rmsre(on_day.version, test, taus).combined,
        }
        for b in on_train.baselines:
            result[b.name] = analytic_rmsre(b.params, test, taus).combined
        assert on_train.version.provenance is not None
        model = on_train.version.provenance.extra.get("model_predicted_rmsre_tau", on_train.predicted_rmsre_tau)
        rows.append({"dataset": log.name, "train_days": train_days, "test_day": test_day, "epsilon": eps,
                     "predicted": on_train.predicted_rmsre_tau, "model": model, "C": on_train.params.count_limit,
                     "correction": on_train.version.correction, **result})
    return rows


def nightly_case(log: DailyLog, first_test_day: int, days: int, train_days: int, eps: float, spec: StatisticsSpec,
                 coverage_runs: int, seed: int) -> list[dict]:
    """Nightly as it runs: for each of ``days`` consecutive days, tune on the ``train_days`` before it
    (with lookback) for a one-day release, predict, then release the day (with its lookback) and score
    it: the expected RMSRE_tau given the day (analytic), one simulated release's RMSRE_tau, and the
    coverage of the released 95% intervals of the true totals over ``coverage_runs`` noise draws."""
    rows = []
    for test_day in range(first_test_day, first_test_day + days):
        train = log.window(test_day - train_days, test_day - 1)
        test = log.window(test_day, test_day)
        stats = compute_statistics_in_memory(train, spec)
        taus = stats.taus()
        res = tuned(stats, train, eps, 1.0, train_days, taus)
        expected = corrected_rmsre(res.version, test, taus).combined
        cov = interval_coverage(res.version, test, coverage_runs, seed=seed + test_day)
        truth = conversions_breakdown(res.params, test).truth
        release = measure(test, res.params, _domain(res.params, test), simulation_seed=seed + test_day).release
        frame = publish(release, res.version).frame()
        est = frame["estimate"].to_numpy().reshape(truth.shape)
        once = realised_rmsre_tau(est, truth, taus).combined
        rows.append({"dataset": log.name, "epsilon": eps, "test_day": test_day, "C": res.params.count_limit,
                     "correction": res.version.correction, "predicted": res.predicted_rmsre_tau,
                     "realised_expected": expected, "realised_one_release": once,
                     **{f"coverage_{q}": float(c) for q, c in zip(("count", "value"), cov.released, strict=True)}})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-day", type=int, default=40_000, help="conversions per day (steady state)")
    ap.add_argument("--train-days", type=int, nargs="+", default=[9, 28])
    ap.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 4.0, 16.0, 64.0])
    ap.add_argument("--datasets", nargs="+", default=["synth-criteo", "synth-real-estate", "synth-travel", "geometric"])
    ap.add_argument("--test-days", type=int, default=1, help="test days per dataset (consecutive)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--tune-for-window", action="store_true",
                    help="tune for a release as large as the training window (the paper's setting; 'before')")
    ap.add_argument("--nightly-days", type=int, default=0,
                    help="instead of the table: nightly over this many consecutive days (prediction vs realised, "
                         "coverage of the released intervals)")
    ap.add_argument("--coverage-runs", type=int, default=10)
    args = ap.parse_args()
    days = LOOKBACK_DAYS + max(args.train_days) + max(args.test_days, args.nightly_days) + 1
    spec = StatisticsSpec(SLICES, ("value",))
    rows = []
    t0 = time.perf_counter()
    if args.nightly_days:
        for name in args.datasets:
            log = (geometric_log(args.per_day, days + 30, args.seed, pareto=name == "geometric-pareto")
                   if name.startswith("geometric") else
                   daily_log(name, synthetic.get_preset(name), args.per_day, days + 30, args.seed))
            for eps in args.epsilons:
                rows += nightly_case(log, LOOKBACK_DAYS + max(args.train_days) + 30, args.nightly_days,
                                     min(args.train_days), eps, spec, args.coverage_runs, args.seed)
            print(f"{name}: done after {time.perf_counter() - t0:.0f} s", flush=True)
        frame = pd.DataFrame(rows)
        frame["expected/predicted"] = frame["realised_expected"] / frame["predicted"]
        frame["one_release/predicted"] = frame["realised_one_release"] / frame["predicted"]
        summary = frame.groupby(["dataset", "epsilon"]).agg(
            days=("test_day", "size"), predicted=("predicted", "mean"), realised=("realised_expected", "mean"),
            one_release=("realised_one_release", "mean"), ratio=("expected/predicted", "mean"),
            ratio_one_release=("one_release/predicted", "mean"), coverage_count=("coverage_count", "mean"),
            coverage_value=("coverage_value", "mean"), min_coverage_count=("coverage_count", "min"),
            min_coverage_value=("coverage_value", "min")).reset_index()
        with pd.option_context("display.width", 250, "display.max_columns", 30, "display.float_format", "{:.4g}".format):
            print(summary.to_string(index=False))
        print(f"realised / predicted over all days: mean {frame['expected/predicted'].mean():.3f} (expected given "
              f"the day), {frame['one_release/predicted'].mean():.3f} (one simulated release); coverage of the released "
              f"95% intervals: count {frame['coverage_count'].mean():.3f}, value {frame['coverage_value'].mean():.3f}")
        return
    for name in args.datasets:
        if name in ("geometric", "geometric-pareto"):
            log = geometric_log(args.per_day, days + 30, args.seed, pareto=name == "geometric-pareto")
        else:
            log = daily_log(name, synthetic.get_preset(name), args.per_day, days + 30, args.seed)
        for train_days in args.train_days:
            for k in range(args.test_days):
                test_day = LOOKBACK_DAYS + max(args.train_days) + k + 30
                rows += run_case(log, test_day, train_days, args.epsilons, spec,
                                 None if args.tune_for_window else 1.0)
        print(f"{name}: done after {time.perf_counter() - t0:.0f} s", flush=True)
    frame = pd.DataFrame(rows)
    frame["best_baseline"] = frame[["baseline_q95", "baseline_q99"]].min(axis=1)
    frame["released/best_baseline"] = frame["released"] / frame["best_baseline"]
    frame["train/day"] = frame["released"] / frame["tuned_on_day"]
    frame["realised/predicted"] = frame["released"] / frame["predicted"]
    cols = ["dataset", "train_days", "epsilon", "C", "correction", "model", "predicted", "released", "optimized_linf",
            "baseline_q95", "baseline_q99", "tuned_on_day", "released/best_baseline", "train/day", "realised/predicted"]
    with pd.option_context("display.width", 250, "display.max_columns", 30, "display.float_format", "{:.4g}".format):
        print(frame[cols].to_string(index=False))
    ok_base = (frame["released/best_baseline"] <= 1.0 + 1e-9).mean()
    print(f"released <= best baseline in {ok_base:.0%} of cells; train/day: max {frame['train/day'].max():.3f}, "
          f"median {frame['train/day'].median():.3f}; realised/predicted: mean {frame['realised/predicted'].mean():.3f}")


if __name__ == "__main__":
    main()
