"""Evaluation of parameter files on test data: analytic RMSRE_tau, Monte-Carlo, generalization gap, plots.

* ``analytic_rmsre``: the exact error model (``error_model.expected_error``, Thm. 4.2 + exact bias,
  Alg. 1's kept set with the mechanism's tie-break) on test records; ``statistics`` variant: the
  optimizer's objective on test statistics.
* ``monte_carlo_rmsre``: runs the real mechanism (``mechanism.measure``, simulation seeds) N times and
  estimates RMSRE_tau^2 as the mean over runs of the per-run mean squared relative error, which is an
  unbiased estimate of the analytic RMSRE_tau^2; its standard error is the runs' standard deviation
  over sqrt(N) (reported for RMSRE_tau by the delta method).
* ``evaluate_dataset``: the Sec. 5 comparison for one dataset: optimized L-inf, optimized L1 and the
  two baselines (q = 0.95, 0.99) at every epsilon, with the generalization gap (test error of the
  parameters tuned on train minus that of parameters tuned on test) and the per-C curves.
* ``plot_rmsre`` / ``plot_count_limit``: aliases of ``araopt.evaluation.plots.rmsre_plot`` / ``count_limit_plot``,
  PNGs like the paper's Fig. (experiments) (epsilon on a log axis, one line per method, one panel per
  dataset) and the "why this C" figure.

All metrics use the training taus (tau = 5 x training median, Sec. 5.1) for every method.
"""
from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from araopt.calibration.accumulator import CalibrationStatistics
from araopt.constants import EPSILONS, OBJECTIVE, Objective
from araopt.errors import InvalidInput, InvalidParameters, check_epsilon
from araopt.evaluation import plots
from araopt.evaluation.methods import CORRECTED_METHOD, METHODS
from araopt.evaluation.metrics import realised_rmsre_tau
from araopt.io.conversions import Conversions
from araopt.io.progress import Stages
from araopt.mechanism.keys import KeyDomain
from araopt.mechanism.params import Encoding, Params
from araopt.mechanism.report import Estimates
from araopt.optimize.baselines import baselines
from araopt.optimize.error_model import (
    ErrorBreakdown,
    RmsreTau,
    default_taus,
    expected_error,
    params_taus,
    rmsre_tau,
)
from araopt.optimize.objective import predicted_rmsre_tau
from araopt.optimize.search import OptimizationResult, SearchContext, check_objective, optimize, prepare_search
from araopt.optimize.statistics import SufficientStatistics
from araopt.optimize.tune import TuningResult
from araopt.optimize.workflow import AraTuning, InMemoryBackend, TuneCandidates, tune_and_calibrate
from araopt.publication import true_totals
from araopt.release_workflow import InMemoryReleaseBackend, ReleaseSpec, release_and_publish
from araopt.version import ParameterVersion


def _domain(params: Params, conversions: Conversions) -> KeyDomain:
    """The slices of the measured period's rows (not of its lookback)."""
    period = conversions.period_mask()
    slices = {c: np.asarray(v)[period] for c, v in conversions.slices.items()}
    return KeyDomain.from_slice_values(params.slice_columns, slices, params.query_columns,
                                       baseline=params.encoding == Encoding.BASELINE,
                                       conversion_slice_columns=params.conversion_slice_columns)


def _metric_taus(params: Params, conversions: Conversions | None, taus: np.ndarray | None) -> np.ndarray:
    if taus is not None:
        return np.asarray(taus, dtype=np.float64)
    recorded = params_taus(params)
    if recorded is not None:
        return recorded
    if conversions is None:
        raise InvalidParameters("taus are needed: the parameter file records none")
    return default_taus(conversions.values, params.count_tau)


def conversions_breakdown(params: Params, conversions: Conversions,
                          kind: Objective = OBJECTIVE.error_model) -> ErrorBreakdown:
    """Exact bias / variance per slice of ``params`` on records (slices: those present in the data)."""
    if tuple(conversions.value_columns) != params.query_columns:
        raise InvalidInput(f"conversions carry value columns {conversions.value_columns}, "
                           f"params expect {params.query_columns}")
    domain = _domain(params, conversions)
    sidx = domain.slice_index(conversions.slices)
    return expected_error(conversions, sidx, domain.num_slices, params, kind, tie_breaker=conversions.record_keys())


def analytic_rmsre(params: Params, conversions: Conversions, taus: np.ndarray | None = None,
                   kind: Objective = OBJECTIVE.error_model) -> RmsreTau:
    """Expected RMSRE_tau of ``params`` on test records, from the exact error model."""
    return rmsre_tau(conversions_breakdown(params, conversions, kind), _metric_taus(params, conversions, taus))


def analytic_rmsre_from_statistics(params: Params, stats: SufficientStatistics, taus: np.ndarray | None = None,
                                   objective: Objective = OBJECTIVE.error_model) -> float:
    """Expected RMSRE_tau of ``params`` on test statistics (the optimizer's objective, <= 0.1 % off)."""
    t = np.asarray(taus, dtype=np.float64) if taus is not None else params_taus(params)
    return predicted_rmsre_tau(stats, params, t, objective)


@dataclass(frozen=True)
class MonteCarloResult:
    """Empirical RMSRE_tau over ``runs`` mechanism runs beside the analytic prediction."""

    analytic: float
    empirical: float
    std_error: float
    runs: int

    @property
    def z_score(self) -> float:
        return (self.empirical - self.analytic) / self.std_error if self.std_error > 0 else 0.0


def monte_carlo_rmsre(params: Params, conversions: Conversions, runs: int, seed: int = 0,
                      taus: np.ndarray | None = None) -> MonteCarloResult:
    """Run ``measure`` with simulation seeds seed, seed+1, ... and compare with ``analytic_rmsre``."""
    if runs < 2:
        raise InvalidParameters(f"Monte-Carlo needs at least 2 runs, got {runs}")
    t = _metric_taus(params, conversions, taus)
    domain = _domain(params, conversions)
    sidx = domain.slice_index(conversions.slices)
    model = expected_error(conversions, sidx, domain.num_slices, params, Objective.EXACT,
                           tie_breaker=conversions.record_keys())
    analytic = rmsre_tau(model, t).combined
    sq = np.empty(runs)
    for r in range(runs):
        est = release_and_publish(InMemoryReleaseBackend(conversions), ReleaseSpec(ParameterVersion(params),
                                  simulation_seed=seed + r), domain).release.estimates.estimate
        sq[r] = realised_rmsre_tau(est, model.truth, t).combined ** 2
    mean_sq = float(sq.mean())
    se_sq = float(sq.std(ddof=1) / math.sqrt(runs))
    empirical = math.sqrt(max(mean_sq, 0.0))
    return MonteCarloResult(analytic, empirical, se_sq / (2.0 * max(empirical, 1e-300)), runs)


def corrected_rmsre(version: ParameterVersion, conversions: Conversions, taus: np.ndarray | None = None,
                    period_days: Sequence[Any] | None = None) -> RmsreTau:
    """Expected RMSRE_tau of the estimates ``araopt measure`` releases for ``version`` (with its
    calibration: U / r_hat, or U when ``correction`` is none) on test records; the ratio r_hat is fixed
    by the calibration (and the calendar, for a release of ``period_days``), so E = X / r_hat and
    Var = Var(U) / r_hat^2 exactly."""
    params = version.params
    t = _metric_taus(params, conversions, taus)
    model = conversions_breakdown(params, conversions)
    if version.calibration is None or version.correction != "ratio":
        return rmsre_tau(model, t)
    domain = _domain(params, conversions)
    stub = Estimates(model.expected, np.sqrt(model.variance), model.expected, model.expected,
                     ("count",) + params.query_columns, 0.95)
    ratio = true_totals(stub, version.calibration, domain, params, calendar=version.calendar,
                        period_days=period_days).ratio
    return rmsre_tau(ErrorBreakdown(model.truth, model.expected / ratio, model.variance / ratio**2), t)


@dataclass(frozen=True)
class Coverage:
    """Empirical coverage of nominal intervals of the TRUE totals, per query (count first), over slices
    and Monte-Carlo runs; ``released`` are the intervals ``araopt measure`` publishes for the params
    (calibrated when they carry a calibration), ``capped`` Alg. 4's (the paper's)."""

    released: np.ndarray
    capped: np.ndarray
    runs: int


def interval_coverage(version: ParameterVersion, conversions: Conversions, runs: int, seed: int = 0) -> Coverage:
    """Run ``measure`` ``runs`` times (simulation seeds) and count how often each interval holds the truth
    (the intervals the release publishes: of the true totals with a calibration, else Alg. 4's)."""
    if runs < 1:
        raise InvalidParameters(f"coverage needs at least 1 run, got {runs}")
    params = version.params
    domain = _domain(params, conversions)
    truth = conversions_breakdown(params, conversions).truth.reshape(-1)
    released, capped = [], []
    for r in range(runs):
        publication = release_and_publish(InMemoryReleaseBackend(conversions), ReleaseSpec(version,
                                          simulation_seed=seed + r), domain)
        rel, frame = publication.release, publication.frame()
        released.append((frame["ci_low"].to_numpy() <= truth) & (truth <= frame["ci_high"].to_numpy()))
        capped.append((rel.estimates.ci_low.reshape(-1) <= truth) & (truth <= rel.estimates.ci_high.reshape(-1)))
    k = params.num_queries + 1
    return Coverage(np.mean(np.array(released).reshape(runs, -1, k), axis=(0, 1)),
                    np.mean(np.array(capped).reshape(runs, -1, k), axis=(0, 1)), runs)


def generalization_gap(train_stats: SufficientStatistics, test_stats: SufficientStatistics, epsilon: float,
                       test_conversions: Conversions | None = None, max_count_limit: int = 20,
                       kind: Objective = OBJECTIVE.error_model, taus: np.ndarray | None = None,
                       train_context: SearchContext | None = None,
                       test_context: SearchContext | None = None) -> dict[str, float]:
    """Test RMSRE_tau of L-inf parameters tuned on train vs tuned on test (same taus), and the gap."""
    t = train_stats.taus() if taus is None else np.asarray(taus, dtype=np.float64)
    on_train = optimize(train_stats, epsilon, "linf", max_count_limit, kind, t, progress=False, context=train_context).params
    on_test = optimize(test_stats, epsilon, "linf", max_count_limit, kind, t, progress=False, context=test_context).params
    if test_conversions is not None:
        a = analytic_rmsre(on_train, test_conversions, t).combined
        b = analytic_rmsre(on_test, test_conversions, t).combined
    else:
        a, b = predicted_rmsre_tau(test_stats, on_train, t), predicted_rmsre_tau(test_stats, on_test, t)
    return {"tuned_on_train": a, "tuned_on_test": b, "gap": a - b, "relative_gap": a / b - 1.0}


# ------------------------------------------------------------------------------------------------
# The Sec. 5 comparison
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Compared:
    """What the comparison tuned at one epsilon: per method its parameter version and training
    RMSRE_tau (in ``METHODS``' order of search), and optimized L-inf's search (its per-C curve)."""

    candidates: dict[str, tuple[ParameterVersion, float]]
    linf: OptimizationResult | None


@dataclass(frozen=True)
class ComparedMethods:
    """The Sec. 5 comparison's tuning at one ``epsilon``, as the tuning workflow's steps
    (``optimize.workflow.TuningMechanism``): ``choose`` searches for each compared method, optimized
    L-inf and L1 (Alg. 5) and the baselines (Sec. 5.1) on ``training`` (the training statistics scaled
    to one release, searched with ``context``), and with ``corrected`` the corrected method's tuning on
    the history's own statistics (``TuneCandidates``, objective corrected), whose candidates are the
    ones calibrated; ``conclude`` calibrates them (``AraTuning``: the backtest's choice)."""

    epsilon: float
    methods: tuple[str, ...]
    training: SufficientStatistics
    context: SearchContext
    taus: tuple[float, ...]
    max_count_limit: int
    kind: Objective
    progress: bool
    release_period_days: float | None
    corrected: bool

    def _corrected(self) -> AraTuning:
        return AraTuning(TuneCandidates(self.epsilon, {
            "max_count_limit": self.max_count_limit, "objective": Objective.CORRECTED, "taus": list(self.taus),
            "release_period_days": self.release_period_days}), self.release_period_days)

    def choose(self, statistics: SufficientStatistics) -> tuple[tuple[Compared, TuningResult | None],
                                                                  tuple[ParameterVersion, ...]]:
        eps, stats, taus, ctx = self.epsilon, self.training, np.asarray(self.taus), self.context
        candidates: dict[str, tuple[ParameterVersion, float]] = {}
        linf = None
        for method, encoding in (("optimized_linf", Encoding.LINF), ("optimized_l1", Encoding.L1)):
            if method in self.methods:
                res = optimize(stats, eps, encoding, self.max_count_limit, self.kind, taus, progress=self.progress,
                               context=ctx)
                candidates[method] = (ParameterVersion(res.params), res.predicted_rmsre_tau)
                linf = res if encoding == Encoding.LINF else linf
        if any(m.startswith("baseline_") for m in self.methods):
            for b in baselines(stats, eps, self.max_count_limit, taus, self.kind):
                if b.name in self.methods:
                    candidates[b.name] = (ParameterVersion(b.params), b.rmsre_tau)
        if not self.corrected:
            return (Compared(candidates, linf), None), ()
        tuning, versions = self._corrected().choose(statistics)
        return (Compared(candidates, linf), tuning), versions

    def conclude(self, chosen: tuple[Compared, TuningResult | None],
                 calibration: tuple[CalibrationStatistics, ...]) -> Compared:
        compared, tuning = chosen
        if tuning is None:
            return compared
        tuned = self._corrected().conclude(tuning, calibration)
        return Compared({**compared.candidates, CORRECTED_METHOD: (tuned.version, tuned.predicted_rmsre_tau)},
                        compared.linf)


@dataclass(frozen=True)
class DatasetEvaluation:
    """Rows per (epsilon, method), the generalization gaps and the per-C curves of optimized L-inf."""

    name: str
    results: pd.DataFrame
    gaps: pd.DataFrame
    per_count_limit: pd.DataFrame


def evaluate_dataset(
    name: str, train_stats: SufficientStatistics, test_conversions: Conversions | None = None,
    epsilons: Sequence[float] = EPSILONS, *, test_stats: SufficientStatistics | None = None,
    max_count_limit: int = 20, kind: Objective = OBJECTIVE, monte_carlo: int = 0, seed: int = 0,
    methods: Sequence[str] = METHODS, gap: bool = True, progress: bool = False,
    taus: np.ndarray | Sequence[float] | None = None, train_conversions: Conversions | None = None,
    release_period_days: float | None = None,
    stages: Stages | None = None,
) -> DatasetEvaluation:
    """Optimize on train, evaluate on test (exactly on records when given, else on test statistics).
    ``taus`` (count first) defaults to the paper's rule on the training statistics (Sec. 5.1).
    Method ``corrected`` (the released estimates of the true totals: objective "corrected" and a
    calibration fitted on ``train_conversions``) needs both train and test records; with
    ``monte_carlo`` every method also gets the coverage of its nominal 95% intervals of the true
    totals (``coverage_<query>``; the corrected method's calibrated intervals, the others' Alg. 4
    intervals).

    ``release_period_days``: every method is tuned for one release of that many days (the test
    period's length: the noise of a release is the same whatever its length, its volume is not);
    None: for a release as large as the training log (the paper's setting). ``stages`` hears of every
    (epsilon, step) as it starts (``araopt.io.progress``)."""
    if test_conversions is None and test_stats is None:
        raise InvalidParameters("evaluate_dataset needs test conversions or test statistics")
    eps_list = [check_epsilon(e) for e in epsilons]
    unknown = set(methods) - set(METHODS)
    if unknown:
        raise InvalidParameters(f"unknown methods {sorted(unknown)}; known: {METHODS}")
    kind = check_objective(kind).error_model  # the paper's estimators' error model
    taus = train_stats.taus() if taus is None else np.asarray(taus, dtype=np.float64)
    history = train_stats
    if release_period_days is not None:
        train_stats = train_stats.for_release_period(release_period_days)
    train_ctx = prepare_search(train_stats, taus)
    test_ctx = prepare_search(test_stats, taus) if test_stats is not None else None
    rows, gap_rows, curve_rows = [], [], []
    say = stages or (lambda stage: None)
    for k, eps in enumerate(eps_list, 1):
        at = f"{name}, epsilon {eps:g} ({k}/{len(eps_list)})"
        say(f"{at}: optimizing {', '.join(m for m in methods if m in METHODS)} on the training statistics")
        corrected = CORRECTED_METHOD in methods and train_conversions is not None and test_conversions is not None
        tuned = tune_and_calibrate(
            InMemoryBackend(train_conversions, history), history.spec,
            ComparedMethods(eps, tuple(methods), train_stats, train_ctx, tuple(taus.tolist()), max_count_limit, kind,
                            progress, release_period_days, corrected))
        candidates = tuned.candidates
        if tuned.linf is not None:
            for r in tuned.linf.per_count_limit:
                curve_rows.append({"dataset": name, "epsilon": eps, "C": r.count_limit, "train_rmsre_tau": r.rmsre_tau,
                                   "count_share": r.count_mse_share,
                                   "chosen": r.count_limit == tuned.linf.params.count_limit})
        say(f"{at}: test RMSRE_tau of {len(candidates)} method(s)"
            + (f", {monte_carlo} mechanism runs each" if monte_carlo and test_conversions is not None else ""))
        for method, (version, train_value) in candidates.items():
            p = version.params
            if method == CORRECTED_METHOD:
                assert test_conversions is not None  # the corrected method is only a candidate with test records
                test_value = corrected_rmsre(version, test_conversions, taus).combined
            elif test_conversions is not None:
                test_value = analytic_rmsre(p, test_conversions, taus, kind).combined
            else:
                assert test_stats is not None  # (one of the two was required on entry)
                test_value = predicted_rmsre_tau(test_stats, p, taus, kind)
            row = {"dataset": name, "epsilon": eps, "method": method, "count_limit": p.count_limit,
                   "clip_thresholds": ";".join(f"{q.clip_threshold:.6g}" for q in p.queries),
                   "budget_fractions": ";".join("" if q.budget_fraction is None else f"{q.budget_fraction:.6g}"
                                                for q in p.queries),
                   "train_rmsre_tau": train_value, "test_rmsre_tau": test_value}
            if method == CORRECTED_METHOD:
                row["correction"] = version.correction
            if monte_carlo and test_conversions is not None:
                if method != CORRECTED_METHOD:
                    mc = monte_carlo_rmsre(p, test_conversions, monte_carlo, seed=seed, taus=taus)
                    row.update({"mc_rmsre_tau": mc.empirical, "mc_std_error": mc.std_error, "mc_runs": mc.runs,
                                "mc_z": (mc.empirical - test_value) / mc.std_error if mc.std_error > 0 else 0.0})
                cov = interval_coverage(version, test_conversions, monte_carlo, seed=seed)
                for query, value in zip(("count",) + p.query_columns, cov.released, strict=True):
                    row[f"coverage_{query}"] = float(value)
            rows.append(row)
        if gap and test_stats is not None:
            say(f"{at}: generalization gap (tuning on the test log)")
            g = generalization_gap(train_stats, test_stats, eps, test_conversions, max_count_limit, kind, taus,
                                   train_ctx, test_ctx)
            gap_rows.append({"dataset": name, "epsilon": eps, **g})
    results = pd.DataFrame(rows)
    if not results.empty and "optimized_linf" in set(results["method"]):
        ref = results[results["method"] == "optimized_linf"].set_index("epsilon")["test_rmsre_tau"]
        results["ratio_to_optimized_linf"] = results["test_rmsre_tau"] / results["epsilon"].map(ref)
    return DatasetEvaluation(name, results, pd.DataFrame(gap_rows), pd.DataFrame(curve_rows))


def comparison_table(results: pd.DataFrame) -> pd.DataFrame:
    """Wide table: test RMSRE_tau per method and the baselines' ratios to optimized L-inf, per (dataset, epsilon)."""
    wide = results.pivot_table(index=["dataset", "epsilon"], columns="method", values="test_rmsre_tau")
    for b in ("baseline_q95", "baseline_q99", "optimized_l1"):
        if b in wide and "optimized_linf" in wide:
            wide[f"{b}/linf"] = wide[b] / wide["optimized_linf"]
    return wide.reset_index()


# ------------------------------------------------------------------------------------------------
# Outputs
# ------------------------------------------------------------------------------------------------

# The figures live in ``araopt.evaluation.plots``; these names stay for callers of the evaluation API.
plot_rmsre = plots.rmsre_plot
plot_count_limit = plots.count_limit_plot


def write_outputs(evaluations: Sequence[DatasetEvaluation], out_dir: str | os.PathLike[str]) -> Mapping[str, str]:
    """rmsre.csv, comparison.csv, generalization_gap.csv, count_limit.csv, rmsre.png, count_limit.png and,
    with Monte-Carlo runs, coverage.png."""
    os.makedirs(out_dir, exist_ok=True)
    results = pd.concat([e.results for e in evaluations], ignore_index=True)
    gaps = pd.concat([e.gaps for e in evaluations], ignore_index=True)
    curves = pd.concat([e.per_count_limit for e in evaluations], ignore_index=True)
    paths = {k: os.path.join(out_dir, v) for k, v in {
        "results": "rmsre.csv", "comparison": "comparison.csv", "gaps": "generalization_gap.csv",
        "curves": "count_limit.csv", "plot": "rmsre.png", "count_limit_plot": "count_limit.png"}.items()}
    results.to_csv(paths["results"], index=False)
    comparison_table(results).to_csv(paths["comparison"], index=False)
    gaps.to_csv(paths["gaps"], index=False)
    curves.to_csv(paths["curves"], index=False)
    plots.rmsre_plot(results, paths["plot"])
    if not curves.empty:
        plots.count_limit_plot(curves, paths["count_limit_plot"])
    else:
        paths.pop("count_limit_plot")
    if any(c.startswith("coverage_") for c in results.columns):
        paths["coverage_plot"] = plots.coverage_plot(results, os.path.join(out_dir, "coverage.png"))
    return paths
