"""Honest estimates (issue 12): RMSRE_tau and interval coverage of the TRUE totals, paper vs corrected.

For the three synthetic presets (train: one draw of 7 days, blocks = impression days; test: an
independent draw of 7 days, measured as one period of P = 7 blocks) and a day-of-week log (synth-
criteo with the Poisson rate of conversions per impression modulated by weekday; 28 days of history,
test = an independent full week, P = 7; plus a single Saturday, P = 1, with the all-days calibration
and with a Saturdays-only calibration), at every epsilon:

  * paper      : Alg. 4's estimate U with parameters from the existing optimizer (exact objective),
                 its 95 % interval read as an interval of the true total;
  * corr@paper : U / r_hat with the same parameters and the calibration fitted on train;
  * corr@cobj  : U / r_hat with parameters from ``calibration.optimize_corrected`` (corrected objective).

Test RMSRE_tau (tau = training taus, Sec. 5.1) is analytic and exact given the fitted calibration:
E(U/r - T)^2 = Var(U)/r^2 + (X/r - T)^2 per slice (``error_model`` on the test records); it is also
estimated by Monte Carlo over the noise draws. Coverage: share of (slice, draw) pairs whose interval
holds the true test total, over ``--draws`` runs of ``mechanism.measure`` with simulation seeds.

Run: .venv/bin/python benchmarks/calibration.py [--conversions 200000] [--draws 20]
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import time
from datetime import date, timedelta

import numpy as np
import pyarrow as pa

from araopt import calibration as cb
from araopt import synthetic
from araopt.conversions import Conversions
from araopt.error_model import ErrorBreakdown, rmsre_tau
from araopt.evaluation import analytic_rmsre, conversions_breakdown
from araopt.keys import KeyDomain
from araopt.mechanism import measure
from araopt.optimizer import optimize
from araopt.params import Params
from araopt.report import Estimates
from araopt.statistics import StatisticsSpec, compute_statistics_in_memory

SLICES = ("campaignId", "geography", "productCategory")
EPSILONS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
COVERAGE_EPSILONS = (1.0, 8.0, 64.0)
DAY_US = 86_400_000_000
# conversions per impression by weekday (Mon..Sun), relative to the preset's lam (mean 1)
WEEKDAY_PROFILE = np.array([0.8, 0.9, 0.95, 1.0, 1.05, 1.25, 1.05])
WEEKDAY_PROFILE = WEEKDAY_PROFILE / WEEKDAY_PROFILE.mean()


@dataclasses.dataclass
class Dataset:
    name: str
    train: Conversions
    train_blocks: np.ndarray
    test: Conversions
    period_blocks: int
    calibration_blocks: list | None = None  # fit on these train blocks only (weekday-matched)


def _conversions(table: pa.Table) -> tuple[Conversions, np.ndarray]:
    conv = Conversions.from_table(table, SLICES, ["value"])
    imp_day = table.column("impression_time").cast(pa.int64()).to_numpy() // DAY_US
    return conv, imp_day


def preset_split(name: str, target: int, split: str, seed: int, days: int = 7) -> tuple[Conversions, np.ndarray]:
    preset = synthetic.PRESETS[name]
    scale = synthetic.scale_for_target_conversions(preset, target)
    return _conversions(synthetic.generate_table(preset, seed=seed, split=split, scale=scale, days=days))


def weekday_log(total: int, split: str, seed: int, days: int, start: date,
                base: str = "synth-criteo") -> tuple[Conversions, np.ndarray]:
    """The synthetic generator (about ``total`` conversions over ``days`` days) with the Poisson rate
    lam of conversions per impression multiplied per impression day by ``WEEKDAY_PROFILE``."""
    preset = synthetic.PRESETS[base]
    scale = synthetic.scale_for_target_conversions(preset, total)
    plan = synthetic.plan_impressions(preset, seed=seed, split=split, scale=scale, days=days, start_date=start)
    tables = []
    id_base = synthetic.SPLIT_ID_OFFSET[split]
    for d in range(days):
        lam = preset.lam * WEEKDAY_PROFILE[(start + timedelta(days=d)).weekday()]
        day_plan = dataclasses.replace(plan, preset=dataclasses.replace(plan.preset, lam=float(lam)))
        cum = np.cumsum(plan.counts[d])
        n_day = int(cum[-1])
        block = synthetic._block_impressions(float(lam))
        for b, i0 in enumerate(range(0, n_day, block)):
            cols = synthetic._generate_block(day_plan, d, b, cum, i0, min(n_day, i0 + block), id_base)
            tables.append(synthetic._block_table(cols))
        id_base += n_day
    return _conversions(pa.concat_tables(tables))


def datasets(target: int, seed: int) -> list[Dataset]:
    out = []
    for name in synthetic.PRESETS:
        tr, trb = preset_split(name, target, "train", seed)
        te, _ = preset_split(name, target, "test", seed)
        out.append(Dataset(name, tr, trb, te, period_blocks=7))
    start = date(2024, 1, 1)  # a Monday
    tr, trb = weekday_log(int(1.4 * target), "train", seed, 28, start)  # 4 weeks, 10k conversions a day at 200k
    te, teb = weekday_log(int(0.35 * target), "test", seed, 7, start + timedelta(days=28))
    out.append(Dataset("day-of-week (week)", tr, trb, te, period_blocks=7))
    saturday = int(teb.min()) + 5
    sat = np.flatnonzero(teb == saturday)
    te_sat = te.take(sat)
    out.append(Dataset("day-of-week (Sat, all days)", tr, trb, te_sat, period_blocks=1))
    train_saturdays = sorted(int(b) for b in np.unique(trb) if (b - saturday) % 7 == 0)
    out.append(Dataset("day-of-week (Sat, Saturdays)", tr, trb, te_sat, period_blocks=1,
                       calibration_blocks=train_saturdays))
    return out


def _domain(params: Params, conv: Conversions) -> KeyDomain:
    return KeyDomain.from_slice_values(params.slice_columns, conv.slices, params.query_columns)


def corrected_analytic(params: Params, cal: cb.Calibration, test: Conversions, taus: np.ndarray,
                       period_blocks: int) -> float:
    """Exact test RMSRE_tau of U / r_hat (r_hat fixed by the calibration)."""
    bd = conversions_breakdown(params, test)
    dom = _domain(params, test)
    stub = Estimates(bd.expected, np.zeros_like(bd.expected), bd.expected, bd.expected,
                     ("count",) + params.query_columns, 0.95)
    r = cb.correct(stub, cal, dom, params=params, period_blocks=period_blocks).ratio
    return rmsre_tau(ErrorBreakdown(bd.truth, bd.expected / r, bd.variance / r**2), taus).combined


def monte_carlo(params: Params, cal: cb.Calibration, test: Conversions, taus: np.ndarray, draws: int,
                period_blocks: int, seed: int) -> dict[str, np.ndarray | float]:
    dom = _domain(params, test)
    truth = conversions_breakdown(params, test).truth
    denom = np.maximum(taus[None, :], truth)
    cov_p, cov_c, sq_p, sq_c, fb = [], [], [], [], 0
    for r in range(draws):
        est = measure(test, params, dom, simulation_seed=seed + r).estimates
        ce = cb.correct(est, cal, dom, params=params, period_blocks=period_blocks)
        cov_p.append((est.ci_low <= truth) & (truth <= est.ci_high))
        cov_c.append((ce.ci_low <= truth) & (truth <= ce.ci_high))
        sq_p.append((((est.estimate - truth) / denom) ** 2).mean(axis=0))
        sq_c.append((((ce.estimate - truth) / denom) ** 2).mean(axis=0))
        fb = ce.fallback_slices
    return {"cov_paper": np.mean(cov_p, axis=(0, 1)), "cov_corr": np.mean(cov_c, axis=(0, 1)),
            "mc_paper": math.sqrt(np.mean(sq_p)), "mc_corr": math.sqrt(np.mean(sq_c)), "fallback": fb}


def run(ds: Dataset, draws: int, seed: int, coverage_eps: tuple[float, ...]) -> list[dict]:
    spec = StatisticsSpec(SLICES, ("value",))
    stats = compute_statistics_in_memory(ds.train, spec)
    taus = stats.taus()
    rows = []
    for eps in EPSILONS:
        t0 = time.perf_counter()
        p = optimize(stats, eps, "linf", 20, "exact", taus, progress=False).params
        cal = cb.calibrate(ds.train, p, ds.train_blocks, blocks=ds.calibration_blocks)
        pv = cal.period(ds.period_blocks) + cal.interaction_variance / ds.period_blocks
        res = cb.optimize_corrected(stats, eps, 20, taus, period_variance=pv)
        p2 = res.params
        cal2 = cb.calibrate(ds.train, p2, ds.train_blocks, blocks=ds.calibration_blocks)
        row = {"dataset": ds.name, "epsilon": eps, "C": p.count_limit, "clip": p.queries[0].clip_threshold,
               "C_cobj": p2.count_limit, "clip_cobj": p2.queries[0].clip_threshold,
               "paper": analytic_rmsre(p, ds.test, taus).combined,
               "corr@paper": corrected_analytic(p, cal, ds.test, taus, ds.period_blocks),
               "corr@cobj": corrected_analytic(p2, cal2, ds.test, taus, ds.period_blocks),
               "cobj_predicted": res.objective}
        if eps in coverage_eps:
            a = monte_carlo(p, cal, ds.test, taus, draws, ds.period_blocks, seed)
            b = monte_carlo(p2, cal2, ds.test, taus, draws, ds.period_blocks, seed)
            row.update({"cov_paper": a["cov_paper"], "cov_corr@paper": a["cov_corr"], "cov_corr@cobj": b["cov_corr"],
                        "mc_paper": a["mc_paper"], "mc_corr@paper": a["mc_corr"], "mc_corr@cobj": b["mc_corr"],
                        "fallback": max(a["fallback"], b["fallback"])})
        row["seconds"] = time.perf_counter() - t0
        rows.append(row)
    return rows


def _fmt_cov(c: np.ndarray | None) -> str:
    return "   -   /   -  " if c is None else f"{100 * c[0]:5.1f}/{100 * c[1]:5.1f}"


def print_tables(rows: list[dict]) -> None:
    print("\nTest RMSRE_tau (analytic, exact given the fitted calibration); MC = Monte-Carlo over noise draws;\n"
          "C = paper optimizer's count limit, C* = corrected objective's; cobj/paper = corr@cobj / paper (the product)")
    print(f"{'dataset':30s} {'eps':>4s} {'C':>3s} {'paper':>8s} {'corr@paper':>10s} {'corr@cobj':>10s} {'C*':>3s} "
          f"{'cobj/paper':>10s}   {'MC paper':>8s} {'MC c@p':>8s} {'MC c@o':>8s}")
    for r in rows:
        mc = (f"{r['mc_paper']:8.4f} {r['mc_corr@paper']:8.4f} {r['mc_corr@cobj']:8.4f}" if "mc_paper" in r else "")
        print(f"{r['dataset']:30s} {r['epsilon']:4g} {r['C']:3d} {r['paper']:8.4f} {r['corr@paper']:10.4f} "
              f"{r['corr@cobj']:10.4f} {r['C_cobj']:3d} {r['corr@cobj'] / r['paper']:10.3f}   {mc}")
    print("\nCoverage of nominal 95% intervals of the TRUE test totals, count/value (%), over slices x draws")
    print(f"{'dataset':30s} {'eps':>4s} {'paper':>13s} {'corr@paper':>13s} {'corr@cobj':>13s} {'fallback':>8s}")
    for r in rows:
        if "cov_paper" in r:
            print(f"{r['dataset']:30s} {r['epsilon']:4g} {_fmt_cov(r['cov_paper']):>13s} "
                  f"{_fmt_cov(r['cov_corr@paper']):>13s} "
                  f"{_fmt_cov(r['cov_corr@cobj']):>13s} {r['fallback']:8d}")
    print("\nSummary per dataset: mean relative change of test RMSRE_tau vs paper over the 7 epsilons "
          "(negative = corrected is better); epsilons where corrected > paper")
    for name in dict.fromkeys(r["dataset"] for r in rows):
        sub = [r for r in rows if r["dataset"] == name]
        for key in ("corr@paper", "corr@cobj"):
            rel = np.array([r[key] / r["paper"] - 1.0 for r in sub])
            worse = [f"{r['epsilon']:g}" for r in sub if r[key] > r["paper"]]
            print(f"  {name:30s} {key:10s} mean {100 * rel.mean():+6.1f}%   worse at eps: {', '.join(worse) or 'none'}")
        cov = [r for r in sub if "cov_corr@cobj" in r]
        ok = all(0.90 <= c <= 0.99 for r in cov for k in ("cov_corr@paper", "cov_corr@cobj") for c in r[k])
        print(f"  {name:30s} corrected coverage within [90%, 99%] at eps {COVERAGE_EPSILONS}: {'yes' if ok else 'NO'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conversions", type=int, default=200_000, help="conversions per 7-day draw")
    parser.add_argument("--draws", type=int, default=20, help="Monte-Carlo noise draws per configuration")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--coverage-all-eps", action="store_true", help="coverage at every epsilon, not only 1, 8, 64")
    args = parser.parse_args()
    t0 = time.perf_counter()
    sets = datasets(args.conversions, args.seed)
    for ds in sets:
        print(f"{ds.name:30s} train {len(ds.train):>8,} conversions ({len(np.unique(ds.train_blocks))} blocks), "
              f"test {len(ds.test):>8,} (P = {ds.period_blocks})"
              + (f", calibration on blocks {ds.calibration_blocks}" if ds.calibration_blocks else ""))
    cov_eps = EPSILONS if args.coverage_all_eps else COVERAGE_EPSILONS
    rows = []
    for ds in sets:
        rows += run(ds, args.draws, 1000 * args.seed, cov_eps)
        print(f"  done {ds.name} ({time.perf_counter() - t0:.0f} s)", flush=True)
    print_tables(rows)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
