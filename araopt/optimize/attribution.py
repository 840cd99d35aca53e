"""ParameterOptimization (Alg. 5) for the W3C Attribution Level 1 target (``araopt.attribution``):
the per-query epsilon split of a stated per-site epoch budget, the clip thresholds C_l with their
maxValue and value scale, and the count limit, minimising the expected RMSRE_tau (Def. 3.2) of
Alg. 4's estimates on a training log.

The paper's terms (``araopt.attribution.params``): C is the number of full reports (every query at
maxValue) that fit in one site-epoch budget; the budget fractions alpha_l split epsilon_site between
the queries (epsilon_l = 2 alpha_l epsilon_site / C: a report matching one impression, as the encoder
deducts 2 ``value * epsilon_l / (2 maxValue)`` when its lookback spans several epochs, as a 30-day
lookback in 7-day epochs always does, so epsilon_l = alpha_l epsilon_site / C; a lookback inside one
epoch deducts half); the count is a query of its own. The error
model is Thm. 4.2 for this target (``araopt.attribution.error``): bias (reports refused for budget,
clipping) from one simulated draw of the browsers (their epoch starts and the roundings, keyed by a
seed), variance (the aggregation's noise, the rounding). The objective is ``error_model.rmsre_tau``
with ``error_model.default_taus``, as for ARA.

Search, per C = 1..C_max, as the paper's alternating minimisation (Alg. 5, Theorem 4.7), with the
noise of Relaxation 4.5 from the target's ``mechanisms.NoiseModel``:

* starts: C_l at the 99% training quantile with an equal split (the paper's), and the best point of
  the smaller C;
* clip step: with the reports the last simulation accepted held fixed, each query's C_l minimises
  mean_j pi_lj (bias_lj(C_l)^2 + Var_l(C_l)) over a grid of training quantiles (and the maximum);
* split step: alpha_l ~ K_l^(1/3) (``mechanisms.split_fractions``), K_l = mean_j pi_lj C^2 C_l^2;
* each step's parameters are simulated again and scored by the exact error model; the best scored
  parameters over all C win. C stops growing once four consecutive C score worse than the best.

maxValue is 2^n - 1 (the natural bound of Prio3L1BoundSum's proof), with the smallest n whose
rounding variance is at most 1% of the noise variance in every slice (a larger maxValue changes
nothing else: the value scale cancels in the noise). The lookback is chosen among ``lookbacks`` for
the winning parameters (a shorter lookback loses the late conversions but does not spend their
budget). Everything is deterministic in ``simulation_seed``.

Its steps in the one tuning workflow (``optimize.workflow.tune_and_calibrate``), for ``optimize``,
``nightly`` and ``evaluate`` with ``--api attribution`` (docs/attribution.md): ``AttributionBackend``
(the history's rows in memory -> their histogram layout; per candidate its retention calibration on the
same rows, ``attribution.calibrate``: measure then publishes estimates of the true totals) and
``AttributionTuner`` (Alg. 5 as above with the baselines scored on the same history, for the guardrails
of ``araopt.nightly`` and the console; the parameter version, api attribution, carrying its retention).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from araopt.attribution.browser import DEFAULT_CONVERSION_EPSILON
from araopt.attribution.calibrate import Retention, retention
from araopt.attribution.encoder import CONVERSION_TIME_US
from araopt.attribution.error import Simulated, error_terms, simulate_log
from araopt.attribution.params import COUNT, AttributionParams, AttributionQuery
from araopt.attribution.reconstruct import check_noise_rates
from araopt.constants import MAX_CLIP_THRESHOLD, MIN_ATTRIBUTION_CLIP
from araopt.errors import InvalidParameters
from araopt.io.conversions import BROWSER_ID, CONVERSION_SITE, ValidationCounts
from araopt.mechanism.keys import HISTORY, KeyDomain
from araopt.optimize.error_model import ErrorBreakdown, default_taus, rmsre_tau
from araopt.optimize.mechanisms import ATTRIBUTION, split_fractions
from araopt.optimize.workflow import Choose, HistoryRun
from araopt.version import ParameterVersion, Provenance

CLIP_QUANTILES = (0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.93, 0.95, 0.97, 0.98, 0.99, 0.995, 0.999, 1.0)
"""The clip step's grid: training quantiles of each value column."""
START_QUANTILE = 0.99
"""The paper's start: thresholds at the 99% quantile, equal split."""
SEARCH_MAX_VALUE = (1 << 20) - 1
"""maxValue while searching (rounding negligible); the final one is chosen by ``value_bits``."""
ROUNDING_SHARE = 0.01
"""The rounding variance allowed per slice, as a share of the noise variance (maxValue's rule)."""
DEFAULT_MAX_COUNT_LIMIT = 32
PATIENCE = 4
ROUNDS = 3


@dataclass(frozen=True)
class AttributionProblem:
    """What is tuned for: the stated per-site epoch budget, the value columns (one query each, after
    the count), the impression-side slices (the histogram index), the browsers' epoch, the lookbacks
    to choose from (the first is the default) and C_max."""

    per_site_budget: float
    value_columns: tuple[str, ...]
    slice_columns: tuple[str, ...]
    epoch_days: int = 7
    lookbacks: tuple[int, ...] = (30,)
    max_count_limit: int = DEFAULT_MAX_COUNT_LIMIT

    def __post_init__(self) -> None:
        if not self.lookbacks or not all(isinstance(x, int) and x >= 1 for x in self.lookbacks):
            raise InvalidParameters(f"lookbacks must be positive integers (days), got {self.lookbacks!r}")
        if isinstance(self.max_count_limit, bool) or not isinstance(self.max_count_limit, int) \
                or self.max_count_limit < 1:
            raise InvalidParameters(f"max count limit must be an integer >= 1, got {self.max_count_limit!r}")
        if COUNT in self.value_columns:
            raise InvalidParameters(f"a value column may not be named {COUNT!r} (the count query's name)")


def build_params(problem: AttributionProblem, count_limit: int, fractions: Sequence[float] | np.ndarray,
                 clips: Sequence[float] | np.ndarray,
                 max_values: Sequence[int] | None = None, lookback: int | None = None) -> AttributionParams:
    """The parameters of (C, alpha_l, C_l) (count first in ``fractions``; ``clips`` and ``max_values``
    per value column): epsilon_l = alpha_l epsilon_site / C (``AttributionParams.from_paper``: C full
    reports across epochs fit a site-epoch budget)."""
    if len(fractions) != len(problem.value_columns) + 1 or len(clips) != len(problem.value_columns):
        raise InvalidParameters("one fraction per query (count first) and one clip per value column")
    bounds = [SEARCH_MAX_VALUE] * len(clips) if max_values is None else list(max_values)
    queries = (AttributionQuery(COUNT, None),) + tuple(
        AttributionQuery(c, c, max_value=int(m), clip=float(t))
        for c, t, m in zip(problem.value_columns, clips, bounds, strict=True))
    names = (COUNT, *problem.value_columns)
    return AttributionParams.from_paper(
        problem.per_site_budget, count_limit, dict(zip(names, (float(f) for f in fractions), strict=True)), queries,
        problem.slice_columns, multi_epoch=True, epoch_days=problem.epoch_days,
        lookback_days=problem.lookbacks[0] if lookback is None else lookback)


def breakdown(params: AttributionParams, rows: pd.DataFrame, domain: KeyDomain, simulation_seed: int,
              simulated: Simulated | None = None) -> ErrorBreakdown:
    """The error model (Thm. 4.2, ``attribution.error``) as the optimizer's breakdown (slices x queries)."""
    terms = error_terms(params, rows, domain, simulation_seed, simulated)
    return ErrorBreakdown(truth=terms.truth.T, expected=(terms.truth + terms.bias).T, variance=terms.variance.T)


def predicted_rmsre_tau(params: AttributionParams, rows: pd.DataFrame, domain: KeyDomain, taus: np.ndarray,
                        simulation_seed: int = 0) -> float:
    """RMSRE_tau (Def. 3.2) of ``params`` on ``rows`` under the error model (one simulated draw)."""
    return rmsre_tau(breakdown(params, rows, domain, simulation_seed), taus).combined


def training_taus(rows: pd.DataFrame, value_columns: Sequence[str]) -> np.ndarray:
    """tau = (5, 5 median(v_1), ...) over the training rows (Sec. 5.1; ``error_model.default_taus``)."""
    return default_taus(rows[list(value_columns)].to_numpy(dtype=np.float64)
                        if value_columns else np.zeros((len(rows), 0)))


def value_bits(count_limit: int, clip: float, fraction: float, budget: float, accepted_per_slice: float) -> int:
    """The smallest n (maxValue 2^n - 1) whose rounding variance (at most 1/4 per accepted report,
    over s^2 = (maxValue / C_l)^2) is at most ROUNDING_SHARE of the noise variance in every slice."""
    noise = float(ATTRIBUTION.variance(count_limit, np.array([clip]), np.array([fraction]), budget)[0])
    for n in range(1, 33):
        scale = ((1 << n) - 1) / clip
        if accepted_per_slice / 4.0 / scale**2 <= ROUNDING_SHARE * noise:
            return n
    return 32


@dataclass(frozen=True)
class Candidate:
    """One scored point of the search: C, the split (count first), the clips and its RMSRE_tau."""

    count_limit: int
    fractions: tuple[float, ...]
    clips: tuple[float, ...]
    rmsre_tau: float


@dataclass(frozen=True)
class AttributionOptimization:
    """The chosen parameters, their predicted training RMSRE_tau, the taus and every scored candidate."""

    params: AttributionParams
    rmsre_tau: float
    taus: tuple[float, ...]
    candidates: tuple[Candidate, ...]

    def table(self) -> pd.DataFrame:
        """One row per count limit C scored: its best point (lowest RMSRE_tau, the first scored on a
        tie, NaN last) and how many points the search scored at that C (the nightly report's per-C table)."""
        best: dict[int, Candidate] = {}
        points: dict[int, int] = {}
        for c in self.candidates:
            points[c.count_limit] = points.get(c.count_limit, 0) + 1
            held = best.get(c.count_limit)
            if held is None or c.rmsre_tau < held.rmsre_tau or (np.isnan(held.rmsre_tau) and not np.isnan(c.rmsre_tau)):
                best[c.count_limit] = c
        return pd.DataFrame([{"C": c.count_limit, "fractions": ", ".join(f"{f:.3f}" for f in c.fractions),
                              "clips": ", ".join(f"{t:.4g}" for t in c.clips), "RMSRE_tau": c.rmsre_tau,
                              "points scored": points[c.count_limit]}
                             for _, c in sorted(best.items())],
                            columns=["C", "fractions", "clips", "RMSRE_tau", "points scored"])


class _Search:
    """The alternating search's state on one training log (module docstring)."""

    def __init__(self, problem: AttributionProblem, rows: pd.DataFrame, domain: KeyDomain, taus: np.ndarray,
                 seed: int) -> None:
        self.problem, self.rows, self.domain, self.taus, self.seed = problem, rows, domain, taus, seed
        self.grids = []
        for col in problem.value_columns:
            v = rows[col].to_numpy(dtype=np.float64)
            v = v[v > 0]
            grid = np.unique(np.quantile(v, CLIP_QUANTILES)) if v.size else np.array([1.0])
            grid = grid[grid > 0] if (grid > 0).any() else np.array([1.0])
            self.grids.append(np.unique(clip_range(grid)))
        self.scored: list[Candidate] = []

    def score(self, count_limit: int, fractions: np.ndarray, clips: np.ndarray) -> tuple[float, Simulated]:
        params = build_params(self.problem, count_limit, fractions, clips)
        sim = simulate_log(params, self.rows, self.domain, self.seed)
        value = rmsre_tau(breakdown(params, self.rows, self.domain, self.seed, sim), self.taus).combined
        self.scored.append(Candidate(count_limit, tuple(float(f) for f in fractions), tuple(float(c) for c in clips),
                                     value))
        return value, sim

    def weights(self, sim: Simulated) -> tuple[np.ndarray, np.ndarray]:
        """Per query, the true totals per slice and pi_lj = 1 / max(tau_l, V_lj)^2."""
        m = self.domain.num_slices
        truth = np.array([np.bincount(sim.index[sim.encoded], weights=sim.values[q][sim.encoded], minlength=m)
                          for q in range(len(sim.values))])
        return truth, 1.0 / np.maximum(self.taus[:, None], truth) ** 2

    def clip_step(self, count_limit: int, fractions: np.ndarray, sim: Simulated) -> np.ndarray:
        m = self.domain.num_slices
        truth, pi = self.weights(sim)
        clips = []
        for q, grid in enumerate(self.grids, start=1):
            rows = sim.accepted_rows(q)
            idx, v = sim.index[rows], sim.values[q][rows]
            expected = np.stack([np.bincount(idx, weights=np.minimum(v, c), minlength=m) for c in grid])
            bias = ((expected - truth[q][None, :]) ** 2 * pi[q][None, :]).mean(axis=1)
            noise = ATTRIBUTION.variance(count_limit, grid, np.full(len(grid), fractions[q]),
                                         self.problem.per_site_budget) * pi[q].mean()
            clips.append(float(grid[int(np.argmin(bias + noise))]))
        return np.array(clips)

    def split_step(self, count_limit: int, clips: np.ndarray, sim: Simulated) -> np.ndarray:
        _, pi = self.weights(sim)
        k = pi.mean(axis=1) * np.concatenate([[1.0], clips]) ** 2 * count_limit**2
        return split_fractions(k)

    def start(self) -> tuple[np.ndarray, np.ndarray]:
        """The paper's start: the 99% quantiles and an equal split."""
        d = len(self.problem.value_columns)
        clips = np.array([float(np.quantile(v, START_QUANTILE)) for v in self._start_values()])
        return np.full(d + 1, 1.0 / (d + 1)), clip_range(clips)

    def run(self, count_limit: int, starts: Sequence[tuple[np.ndarray, np.ndarray]]
            ) -> tuple[float, np.ndarray, np.ndarray]:
        """The alternating search at one C from each start; the best scored point. A point whose split
        gives a query less than one microepsilon per report at this C (``from_paper`` refuses it) is no
        candidate: a start ends there, a step ends its start's rounds; with no point that fits, the refusal."""
        best: tuple[float, np.ndarray, np.ndarray] | None = None
        refusal: InvalidParameters | None = None
        for fractions, clips in starts:
            try:
                value, current = self.score(count_limit, fractions, clips)
            except InvalidParameters as error:
                refusal = error
                continue
            if best is None or value < best[0]:
                best = (value, fractions, clips)
            for _ in range(ROUNDS if self.problem.value_columns else 0):
                clips = self.clip_step(count_limit, fractions, current)
                fractions = split_fractions_safe(self.split_step(count_limit, clips, current))
                try:
                    value, current = self.score(count_limit, fractions, clips)
                except InvalidParameters:
                    break
                if value < best[0]:
                    best = (value, fractions, clips)
                else:
                    break
        if best is None:
            assert refusal is not None
            raise refusal
        return best

    def _start_values(self) -> list[np.ndarray]:
        out = []
        for col in self.problem.value_columns:
            v = self.rows[col].to_numpy(dtype=np.float64)
            out.append(v[v > 0] if (v > 0).any() else np.array([1.0]))
        return out


def clip_range(clips: np.ndarray) -> np.ndarray:
    """Clips the search may try: within the range a parameter file holds ([MIN_ATTRIBUTION_CLIP,
    MAX_CLIP_THRESHOLD]); values beyond it (finite, valid input) are clipped there, not an error about a
    clip the user never set."""
    return np.clip(np.asarray(clips, dtype=np.float64), MIN_ATTRIBUTION_CLIP, MAX_CLIP_THRESHOLD)


def split_fractions_safe(fractions: np.ndarray) -> np.ndarray:
    """Fractions rounded to 1e-6 and renormalised (so that ``from_paper``'s sum check and the JSON
    round trip stay exact enough), each at least 1e-6."""
    f = np.maximum(np.round(fractions, 6), 1e-6)
    f[-1] = 1.0 - f[:-1].sum()
    return f


def optimize_attribution(problem: AttributionProblem, rows: pd.DataFrame, domain: KeyDomain,
                         taus: np.ndarray | Sequence[float] | None = None,
                         simulation_seed: int = 0) -> AttributionOptimization:
    """Alg. 5 for this target on a training log (canonical rows with ``impression_time_us``, every row
    in ``domain``); the module docstring has the search."""
    tau = training_taus(rows, problem.value_columns) if taus is None else np.asarray(taus, dtype=np.float64)
    if tau.shape != (len(problem.value_columns) + 1,) or not (tau > 0).all():
        raise InvalidParameters(f"taus must be {len(problem.value_columns) + 1} positive numbers (count first), "
                                f"got {tau.tolist()}")
    if not len(rows):
        raise InvalidParameters("the training log is empty")
    search = _Search(problem, rows, domain, tau, simulation_seed)
    best: tuple[float, int, np.ndarray, np.ndarray] | None = None
    worse = 0
    for count_limit in range(1, problem.max_count_limit + 1):
        starts = [search.start()] + ([] if best is None else [(best[2], best[3])])  # and the best so far
        try:
            value, fractions, clips = search.run(count_limit, starts)
        except InvalidParameters:  # no split fits the budget at this C (below one microepsilon): nor above it
            if best is None:
                raise
            break
        if best is None or value < best[0]:
            best, worse = (value, count_limit, fractions, clips), 0
        else:
            worse += 1
            if worse >= PATIENCE:
                break
    assert best is not None
    _, count_limit, fractions, clips = best
    params = build_params(problem, count_limit, fractions, clips)
    sim = simulate_log(params, rows, domain, simulation_seed)
    bits = []
    for q in range(1, len(fractions)):
        accepted = np.bincount(sim.index[sim.accepted_rows(q)], minlength=domain.num_slices)
        bits.append(value_bits(count_limit, float(clips[q - 1]), float(fractions[q]), problem.per_site_budget,
                               float(accepted.max()) if accepted.size else 0.0))
    max_values = [(1 << n) - 1 for n in bits]
    chosen = None
    for lookback in problem.lookbacks:
        candidate = build_params(problem, count_limit, fractions, clips, max_values, lookback)
        value = predicted_rmsre_tau(candidate, rows, domain, tau, simulation_seed)
        if chosen is None or value < chosen[0]:
            chosen = (value, candidate)
    assert chosen is not None
    check_noise_rates(chosen[1])  # what is chosen must be releasable (one line, naming the query)
    return AttributionOptimization(chosen[1], chosen[0], tuple(float(t) for t in tau), tuple(search.scored))


# ----------------------------------------------------------------------------------------- baselines

SPEC_DEFAULTS = "spec_defaults"
EQUAL_Q95 = "baseline_q95"


def privacy_unit_quantile(rows: pd.DataFrame, epoch_days: int, quantile: float) -> int:
    """The ``quantile`` of conversions per privacy unit (browser x conversion site x epoch), epochs
    approximated by ``epoch_days`` windows of conversion time from the epoch (not the browsers' random
    starts)."""
    window = rows[CONVERSION_TIME_US].to_numpy() // (epoch_days * 86_400_000_000)
    keys = [rows[BROWSER_ID].to_numpy() if BROWSER_ID in rows else np.arange(len(rows)), window]
    if CONVERSION_SITE in rows:
        keys.append(pd.factorize(rows[CONVERSION_SITE])[0])
    sizes = pd.DataFrame({str(i): k for i, k in enumerate(keys)}).value_counts().to_numpy()
    return max(1, math.ceil(float(np.quantile(sizes, quantile)))) if sizes.size else 1


def baseline_params(name: str, problem: AttributionProblem, rows: pd.DataFrame) -> AttributionParams:
    """The baselines: ``spec_defaults``: every query a call with the spec's default epsilon = 1
    (an equal split when the queries' sum exceeds the budget), maxValue 1 (count only: a value query
    sends its value in units of its training mean, RR(min(v, mean) / mean) in {0, 1});
    ``baseline_q95``: clip = maxValue at the 95% training quantile, equal split, C = the 95% quantile
    of conversions per privacy unit (Sec. 5.1's baseline for this target)."""
    d = len(problem.value_columns)
    lookback = problem.lookbacks[0]
    if name == SPEC_DEFAULTS:
        epsilon = min(DEFAULT_CONVERSION_EPSILON, problem.per_site_budget / (d + 1))
        queries = (AttributionQuery(COUNT, None, epsilon),) + tuple(
            AttributionQuery(c, c, epsilon, 1, _positive_mean(rows[c])) for c in problem.value_columns)
        return AttributionParams(problem.per_site_budget, queries, problem.slice_columns,
                                 epoch_days=problem.epoch_days, lookback_days=lookback)
    if name == EQUAL_Q95:
        count_limit = privacy_unit_quantile(rows, problem.epoch_days, 0.95)
        clips = [_positive_quantile(rows[c], 0.95) for c in problem.value_columns]
        params = build_params(problem, count_limit, [1.0 / (d + 1)] * (d + 1), clips)
        return replace(params, queries=tuple(
            q if q.column is None else AttributionQuery(q.name, q.column, q.epsilon, (1 << 16) - 1, q.clip)
            for q in params.queries))
    raise InvalidParameters(f"unknown baseline {name!r} (known: {SPEC_DEFAULTS}, {EQUAL_Q95})")


BASELINES = (SPEC_DEFAULTS, EQUAL_Q95)


def _positive_mean(values: pd.Series) -> float:
    """The positive values' mean, within the clip range (a baseline's clip, as the search's)."""
    v = values.to_numpy(dtype=np.float64)
    mean = float(v[v > 0].mean()) if (v > 0).any() else 1.0
    return float(clip_range(np.array([mean]))[0])


def _positive_quantile(values: pd.Series, quantile: float) -> float:
    """The positive values' ``quantile``, within the clip range (a baseline's clip, as the search's)."""
    v = values.to_numpy(dtype=np.float64)
    q = float(np.quantile(v[v > 0], quantile)) if (v > 0).any() else 1.0
    return float(clip_range(np.array([q]))[0])


# ------------------------------------------------------------------- the tuning workflow's steps

def history_domain(rows: pd.DataFrame, slices: Sequence[str], values: Sequence[str], origin: str = HISTORY
                   ) -> KeyDomain:
    """The histogram layout of the history's impression-side slices (as ARA's optimize takes the
    history's key domain: origin ``history``, which a release may use as its declared domain, as ARA's
    ``Params.history_domain``; ``data`` for slices of the data a simulation measures)."""
    domain = KeyDomain.from_slice_values(tuple(slices), {c: rows[c].to_numpy() for c in slices}, (COUNT, *values),
                                         origin=origin)
    if origin == HISTORY and CONVERSION_TIME_US in rows and len(rows):  # the end of the history it lists
        domain = domain.learnt_before(int(rows[CONVERSION_TIME_US].max()))
    return domain


@dataclass(frozen=True)
class AttributionSpec:
    """The history's columns: the impression-side slices (the layout) and the value queries."""

    slice_columns: tuple[str, ...]
    value_columns: tuple[str, ...]


@dataclass(frozen=True)
class AttributionStatistics:
    """What this target's search reads of a history: its valid rows and their histogram layout."""

    rows: pd.DataFrame
    domain: KeyDomain
    spec: AttributionSpec


@dataclass(frozen=True)
class AttributionBackend:
    """The workflow's steps on a history's valid ``rows`` in memory: their layout, then per candidate
    version its retention calibration on the same rows (``attribution.calibrate.retention``, the
    browsers' draws keyed by ``seed``); ``what`` names the history in the empty history's refusal."""

    rows: pd.DataFrame
    seed: int
    what: str = "the history"

    def statistics_and_calibration(self, spec: AttributionSpec, choose: Choose[AttributionStatistics, Any]
                                   ) -> HistoryRun[AttributionStatistics, Any, Retention]:
        if not len(self.rows):
            raise InvalidParameters(f"{self.what} has no valid rows")
        statistics = AttributionStatistics(self.rows, history_domain(self.rows, spec.slice_columns,
                                                                     spec.value_columns), spec)
        chosen, candidates = choose(statistics)
        calibration = tuple(retention(_attribution_of(v), self.rows, statistics.domain, self.seed) for v in candidates)
        return HistoryRun(statistics, chosen, calibration)


def _attribution_of(version: ParameterVersion) -> AttributionParams:
    assert version.attribution is not None  # (the tuner's candidates are attribution versions)
    return version.attribution


@dataclass(frozen=True)
class AttributionSearch:
    """``AttributionTuner.choose``'s result: the optimization, its problem, the history's statistics and
    the comparison with the baselines on them."""

    optimization: AttributionOptimization
    problem: AttributionProblem
    statistics: AttributionStatistics
    comparison: pd.DataFrame


@dataclass(frozen=True)
class AttributionTuning:
    """One tuning on a history: the optimization, its problem, the history's size and layout, and the
    parameter version that carries the chosen parameters and their retention calibration."""

    optimization: AttributionOptimization
    problem: AttributionProblem
    rows: int
    domain: KeyDomain
    version: ParameterVersion
    comparison: pd.DataFrame  # the chosen parameters and the baselines on the history (``comparison``)

    @property
    def baselines(self) -> dict[str, float]:
        """Each baseline's predicted training RMSRE_tau (the guardrails' bar)."""
        return {str(r["method"]): float(r["train RMSRE_tau"]) for _, r in self.comparison.iterrows()
                if r["method"] != "optimized" and np.isfinite(r["train RMSRE_tau"])}  # (releasable ones only)

    @property
    def not_releasable(self) -> dict[str, str]:
        """The baselines that cannot be released at the budget, with why (``releasable_baseline``)."""
        return {str(r["method"]): str(r["note"]) for _, r in self.comparison.iterrows() if r["note"]}

    def provenance(self, training_start: str | None, training_end: str | None, created_at: str | None,
                   counts: ValidationCounts, **extra: Any) -> Provenance:
        """What a version tuned here records (``optimize`` and ``nightly --api attribution``): the training
        window, the rows trained on and the history's row accounting (a joined history's reading: such a
        version is operator-private, ``version.JOINED_HISTORY_FIELDS``), its predicted RMSRE_tau and the
        releasable baselines' (the guardrails' bar), the others with why; ``extra``: the run's own."""
        result, baselines = self.optimization, self.baselines
        return Provenance(
            training_start=training_start, training_end=training_end, rows=self.rows, created_at=created_at,
            predicted_rmsre_tau=result.rmsre_tau, baseline_rmsre_tau=min(baselines.values(), default=None),
            objective="rmsre_tau",
            extra={**extra, "api": "attribution", "taus": list(result.taus),
                   "baselines": {k: {"rmsre_tau": v} for k, v in baselines.items()},
                   "baselines_not_releasable": self.not_releasable,
                   "row_accounting": {"rows_read": counts.rows_read, "rows_rejected": counts.rows_rejected,
                                      "rejected_by_reason": dict(counts.rejected_by_reason)}})


@dataclass(frozen=True)
class AttributionTuner:
    """This target's tuning steps (``optimize.workflow.TuningMechanism``): ``choose`` runs Alg. 5
    (``optimize_attribution``) for a per-site ``budget`` and counts up to ``max_count_limit`` and scores
    the baselines on the same history; ``conclude`` builds the version (api attribution) carrying the
    chosen parameters' retention calibration."""

    budget: float
    max_count_limit: int
    seed: int

    def choose(self, statistics: AttributionStatistics) -> tuple[AttributionSearch, tuple[ParameterVersion, ...]]:
        spec, rows, domain = statistics.spec, statistics.rows, statistics.domain
        problem = AttributionProblem(self.budget, spec.value_columns, spec.slice_columns,
                                     max_count_limit=self.max_count_limit)
        result = optimize_attribution(problem, rows, domain, simulation_seed=self.seed)
        search = AttributionSearch(result, problem, statistics, comparison(result, problem, rows, domain))
        return search, (ParameterVersion.for_attribution(result.params, domain=domain),)

    def conclude(self, chosen: AttributionSearch, calibration: tuple[Retention, ...]) -> AttributionTuning:
        result, domain = chosen.optimization, chosen.statistics.domain
        version = ParameterVersion.for_attribution(result.params, domain=domain, retention=calibration[0])
        return AttributionTuning(result, chosen.problem, len(chosen.statistics.rows), domain, version,
                                 chosen.comparison)


def releasable_baseline(name: str, problem: AttributionProblem, rows: pd.DataFrame) -> AttributionParams | str:
    """``baseline_params``, or why that baseline cannot be released at this budget (a query's share below one
    microepsilon per report, or a noise rate outside the sampler's domain: ``check_noise_rates``). Such a
    baseline is no method a user could run: it is listed as not releasable, never scored as if it were, and
    it stops nothing (a tiny budget's q95 baseline at C = 25 stopped optimize and nightly)."""
    try:
        params = baseline_params(name, problem, rows)
        check_noise_rates(params)
    except InvalidParameters as error:
        return str(error)
    return params


def params_columns(p: AttributionParams) -> dict[str, Any]:
    """How a table shows a parameter set: C and, per query, epsilon, maxValue and clip."""
    return {"C": p.count_limit(multi_epoch=True), "epsilons": ", ".join(f"{q.epsilon:.4g}" for q in p.queries),
            "max_values": ", ".join(str(q.max_value) for q in p.queries),
            "clips": ", ".join(f"{q.clip:.4g}" for q in p.queries)}


def comparison(result: AttributionOptimization, problem: AttributionProblem, rows: pd.DataFrame,
               domain: KeyDomain) -> pd.DataFrame:
    """The chosen parameters and the baselines on the history (predicted RMSRE_tau, ratio to optimized); a
    baseline that cannot be released at this budget has no score, and its ``note`` says why."""
    def row(name: str, p: AttributionParams, value: float) -> dict[str, Any]:
        return {"method": name, **params_columns(p), "lookback_days": p.lookback_days,
                "train RMSRE_tau": value, "ratio": value / result.rmsre_tau, "note": ""}

    out = [row("optimized", result.params, result.rmsre_tau)]
    for name in BASELINES:
        p = releasable_baseline(name, problem, rows)
        out.append(row(name, p, predicted_rmsre_tau(p, rows, domain, np.array(result.taus)))
                   if not isinstance(p, str) else
                   {"method": name, "train RMSRE_tau": np.nan, "ratio": np.nan, "note": f"not releasable: {p}"})
    return pd.DataFrame(out)
