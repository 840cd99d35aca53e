"""Privacy-safe tuning: parameters and a calibration learnt only from differentially private releases
and the advertiser's first-party conversions (no impression join), for campaigns without a joined
history (the paper's conclusion: tune "based solely on the outputs of privacy-preserving APIs").

What it reads, per past release period (a day): the release's published, noised numbers (Alg. 4's
capped estimates of every main key, and of every exploration arm's pooled keys) with the public
parameters they were made with; the advertiser's first-party conversions of that day (their count,
value sums and values: it knows every purchase, not which impression caused it); and the declared
domain. What it never reads: a joined impression -> conversion log, impression-side slices of a
conversion, or any exact count of a release.

How. (1) Exploration arms (``mechanism.exploration``): a small keyed share of impressions is capped
at other count limits C_a and reported on pooled keys, so each release shows r(C_a) = U_a / (share_a T)
with T the day's conversions from first-party data; the main release shows r(C0) the same way. (2)
The retention curve r(K) (``optimize.retention``) is fitted to these points; it is the impression-
size distribution the paper's Sec. 5.3 model draws from, without assuming its law. (3) Each slice's own
retention (``optimize.slice_retention``: from the main releases at the count limits the schedule
alternates, shrunk by empirical Bayes) and per-slice daily truths, the main releases' estimates
divided by the slice's ratio (``optimize.private_model``). (4) A pseudo-history is drawn from the
model (impressions per slice, sizes from the curve, conversions spread over the attribution window,
values from the first-party conversions; seeded by the inputs' digest: model sampling, not privacy
noise) and the usual tuning runs on it: Alg. 5 for one release period (``optimize.tune``), its
candidates calibrated and replayed (``calibration.backtest``). (5) The calibration's count ratio is the
main releases' own pooled ratio, sum U / sum T over past days at the same count limit and arms (exact
first-party T, noise-dominated error), else the model's, times each slice's retention relative to
the pool's; its variance adds the posterior variance of the slice's retention. (6) Candidates are
judged by the error they will really have, averaged over scenarios of what the releases do not pin
down (``heterogeneity.robust_rmsre_tau``), and the model is checked against the last release. (7) The
chosen version's point estimates divide by the ratio that minimises their expected squared error under
the retention's doubt (``shrunk_point``); its intervals stay the mean ratio's.

Everything it outputs is a function of DP releases, first-party facts, the declared domain and public
parameters: post-processing (the releases stay epsilon-DP; the first-party data is the advertiser's
own). Day 1 (``cold_start``) has no release yet: L-inf at a default count limit with clips at the
first-party values' 95% quantile, with the arms switched on.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from araopt.calibration import MIN_RATIO, Calibration, retention_checksum
from araopt.constants import COUNT_TAU, MAX_COUNT_LIMIT, PRIVATE_WINDOW_DAYS, Objective
from araopt.errors import InvalidInput, InvalidParameters
from araopt.io.conversions import Conversions
from araopt.mechanism.bounding import kept_per_impression
from araopt.mechanism.exploration import Exploration, default_exploration
from araopt.mechanism.keys import KeyDomain, slice_key
from araopt.mechanism.params import Params, QueryParams
from araopt.optimize.error_model import (
    PREDICTED_WITHOUT_SIGNAL,
    ErrorBreakdown,
    expected_error,
    predicted_without_signal,
)
from araopt.optimize.heterogeneity import (
    CONTRADICTION,
    ValuePool,
    ratio_elasticity,
    release_consistency,
    robust_rmsre_tau,
    shape_doubt,
)
from araopt.optimize.private_model import (
    DAY_US,
    SLICE_HISTORY,
    FirstParty,
    PrivateModel,
    ReleaseRecord,
    first_party_taus,
    inputs_seed,
    learn,
    pseudo_history,
    retention_points,
    same_count,
)
from araopt.optimize.retention import CurveBootstrap
from araopt.optimize.search import CandidateResult, candidate_params
from araopt.optimize.statistics import StatisticsSpec, SufficientStatistics
from araopt.optimize.transient import SPREAD_DAYS
from araopt.optimize.tune import TuningResult
from araopt.optimize.workflow import AraTuning, InMemoryBackend, TuneCandidates
from araopt.version import CORRECTIONS, PRIVACY_SAFE, ParameterVersion, Provenance, divided_queries

__all__ = ["DAY_US", "CountLimitSchedule", "FirstParty", "ReleaseRecord", "cold_start", "first_party_taus", "learn",
           "private_tune", "pseudo_history", "retention_points", "typical_day_factors", "with_release_ratios"]

COLD_START_COUNT_LIMIT = 5
"""Day 1's count limit, before any release shows how many conversions an impression has."""
WINDOW = PRIVATE_WINDOW_DAYS


@dataclass(frozen=True)
class CountLimitSchedule:
    """The public schedule of the main release's count limit, the channel that identifies each slice's
    own retention (``optimize.slice_retention``: one count limit shows only r_k T_k).

    On the days whose number (days since the epoch) is ``phase`` modulo ``period`` the release probes:
    its count limit is the best candidate (by the robust prediction) at kept ranks at least ``factor``
    times above or below the tuned one's, when the slices' unknown retention matters (the tuned
    candidate's robust prediction exceeds its central scenario's by more than ``min_uncertainty``, or
    no two count limits have been released yet) and the probe costs at most ``max_cost`` of the tuned
    candidate's predicted error. Every other day publishes the tuned candidate. Each day's release is
    a full release at its own count limit (Alg. 1 charges the lifetime budget at the parameters of the
    release that used each conversion: ``mechanism.lifetime``). ``period`` 0: no probes."""

    period: int = 3
    phase: int = 0
    factor: float = 2.0
    min_uncertainty: float = 0.01
    max_cost: float = 0.25

    def __post_init__(self) -> None:
        if self.period < 0 or not 0 <= self.phase < max(self.period, 1) or self.factor <= 1.0 or self.max_cost < 0:
            raise InvalidParameters(f"a count-limit schedule needs period >= 0, 0 <= phase < period, factor > 1 and "
                                    f"max_cost >= 0, got {self}")

    def probes(self, day: int) -> bool:
        """Whether the release of day ``day`` (days since the epoch) probes."""
        return self.period > 0 and day % self.period == self.phase

    def far(self, kept_ranks: int, tuned: int) -> bool:
        """Whether kept ranks K are far enough from the tuned candidate's to show a contrast."""
        return kept_ranks >= self.factor * tuned or kept_ranks * self.factor <= tuned

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


DEFAULT_SCHEDULE = CountLimitSchedule()


def cold_start(first_party: FirstParty, epsilon: float, domain: KeyDomain, value_columns: Sequence[str],
               exploration: Exploration | None = None, count_limit: int = COLD_START_COUNT_LIMIT) -> ParameterVersion:
    """Day 1: L-inf at ``count_limit``, clips at the first-party values' 95% quantile, equal fractions,
    taus by the paper's rule on the first-party values, the arms on."""
    values = first_party.values
    if len(values) == 0:
        raise InvalidInput("the cold start needs first-party conversions to set the clip thresholds")
    q95 = np.quantile(values, 0.95, axis=0)
    taus = first_party_taus(values)
    d = len(value_columns)
    params = Params(count_limit=count_limit, encoding="linf", epsilon=epsilon, slice_columns=domain.slice_columns,
                    queries=tuple(QueryParams(c, float(max(q95[i], 1e-9)), 1.0 / d, taus[i + 1])
                                  for i, c in enumerate(value_columns)),
                    count_tau=COUNT_TAU, conversion_slice_columns=domain.conversion_slice_columns,
                    ).with_exploration(exploration if exploration is not None else default_exploration())
    return ParameterVersion(params, domain=domain, provenance=Provenance(extra={
        "tuning": "cold start: no release yet; clips from first-party values only",
        "exploration_share": params.exploration.total_share if params.exploration is not None else 0.0}))


@dataclass(frozen=True)
class _Candidates:
    """What privacy-safe tuning's ``choose`` made of the pseudo-history: the tuning, the cold-start rule,
    and the candidate versions with the search each came from (in the calibration's order)."""

    result: TuningResult
    cold: ParameterVersion
    versions: tuple[ParameterVersion, ...]
    searches: tuple[Any, ...]


@dataclass(frozen=True)
class _Scored:
    """A calibrated candidate with its estimator: its robust and central-scenario predictions for
    tomorrow, and its robust one over the days ahead were its count limit kept (``ahead``:
    ``MOVE_HORIZON``; computed on probe days only, which alone read it: else tomorrow's)."""

    error: float
    centre: float
    order: int
    cold: bool
    version: ParameterVersion
    ahead: float
    over: Callable[[np.ndarray], float] | None = None
    """Its robust error (in squares, averaged) over days on which it keeps tomorrow's share times each
    of the given growths; None: ``ahead`` for any."""

    @property
    def kept_ranks(self) -> int:
        return kept_per_impression(self.version.params.count_limit)


def _probe_candidates(stats: SufficientStatistics, result: TuningResult, epsilon: float, taus: Sequence[float],
                      slice_columns: Sequence[str], schedule: CountLimitSchedule) -> list[ParameterVersion]:
    """The schedule's probes: Alg. 5's best row (its per-C table) at kept ranks far above and far below
    the tuned candidate's, each with that row's clips and budget fractions."""
    if schedule.period == 0:
        return []
    tuned = kept_per_impression(result.version.params.count_limit)
    out = []
    for above in (True, False):
        rows = [r for r in result.optimization.per_count_limit
                if schedule.far(r.kept_ranks, tuned) and (r.kept_ranks > tuned) == above and np.isfinite(r.rmsre_tau)]
        if not rows:
            continue
        out.append(_row_version(stats, result, epsilon, taus, slice_columns, rows))
    return out


def _row_version(stats: SufficientStatistics, result: TuningResult, epsilon: float, taus: Sequence[float],
                 slice_columns: Sequence[str], rows: Sequence[CandidateResult]) -> ParameterVersion:
    """The tuned version with the parameters of the best of Alg. 5's per-C ``rows`` (its clips and
    budget fractions)."""
    row = min(rows, key=lambda r: (r.rmsre_tau, r.count_limit))
    params = candidate_params(stats, result.version.params.encoding, epsilon, row.count_limit,
                              np.asarray(row.thresholds), None if row.fractions is None else np.asarray(row.fractions),
                              np.asarray(taus, dtype=np.float64), slice_columns)
    return dataclasses.replace(result.version, params=params)


def _staying_candidate(stats: SufficientStatistics, result: TuningResult, epsilon: float, taus: Sequence[float],
                       slice_columns: Sequence[str], recent: Sequence[ReleaseRecord]) -> list[ParameterVersion]:
    """Alg. 5's best row (its per-C table) at the latest releases' count limit (``_usual_ranks``) when
    no tuned candidate is there: the day's search on a fresh pseudo-history may pick another C by less
    than its own noise, and staying (``STICKINESS``) needs a candidate to stay with."""
    usual = _usual_ranks(recent)
    tuned = {kept_per_impression(v.params.count_limit) for v, _ in result.candidates} | {
        kept_per_impression(result.version.params.count_limit)}
    rows = [r for r in result.optimization.per_count_limit if r.kept_ranks == usual and np.isfinite(r.rmsre_tau)]
    if usual is None or usual in tuned or not rows:
        return []
    return [_row_version(stats, result, epsilon, taus, slice_columns, rows)]


def _usual_ranks(recent: Sequence[ReleaseRecord]) -> int | None:
    """The kept ranks of the latest releases: the most frequent of the last three (a tie: the latest's)."""
    ranks = [kept_per_impression(r.count_limit) for r in recent[-3:]]
    if not ranks:
        return None
    return max(reversed(ranks), key=ranks.count)


STICKINESS = 0.05
"""A candidate at the count limit of the latest releases is kept unless another predicts an error this
share lower: moving the count limit has a cost the steady-state pseudo-history does not show (the
releases after it keep another share while the conversions charged at the old count limit age out)."""


MOVE_HORIZON = tuple(range(1, SPREAD_DAYS + 1, 5))
"""The days ahead (1 = tomorrow) over which a candidate's predicted error is averaged (in squares), were
its count limit kept from tomorrow on (``_Scored.ahead``): Alg. 1 charges each conversion at its
release's count limit, so a release keeps another share for the attribution window after a move
(``optimize.transient``). It prices a probe (``_lasting_cost``); the tuned candidate is still chosen by
tomorrow's error (choosing by this one moved hetero-retail and hetero-weekday at epsilon = 1 to count
limits the model's steady state favoured and the truth did not: docs/private-tuning.md). The published
prediction is tomorrow's."""


def _over(breakdown: ErrorBreakdown, ratio: np.ndarray, divide: Sequence[bool], spread: np.ndarray, taus: np.ndarray,
          scenarios: Sequence[tuple[float, np.ndarray, np.ndarray]], tomorrow: float, point: np.ndarray
          ) -> Callable[[np.ndarray], float]:
    """A candidate's robust error (``heterogeneity.robust_rmsre_tau``) over days on which its release
    keeps tomorrow's share times each growth (and its calibration divides by the ratio moved alike),
    averaged in squares; ``tomorrow`` at growth 1."""
    def over(growth: np.ndarray) -> float:
        return float(np.sqrt(np.mean([
            tomorrow**2 if abs(g - 1.0) < 1e-9 else
            robust_rmsre_tau(dataclasses.replace(breakdown, expected=breakdown.expected * g), ratio * g, divide,
                             spread, taus, scenarios, point * g) ** 2 for g in np.asarray(growth, dtype=np.float64)])))
    return over


def horizon_growth(model: PrivateModel, count_limit: int, first: Sequence[int] = ()) -> np.ndarray:
    """The pool's kept share on each day of ``MOVE_HORIZON`` were ``count_limit`` released from tomorrow
    on (after the releases at count limits ``first``, e.g. a probe's), over tomorrow's share at
    ``count_limit`` alone (the model's transient after its schedule); ones without a schedule."""
    if not model.schedule:
        return np.ones(len(MOVE_HORIZON))
    base = max(model.pooled_share(model.kept_table(ahead=(count_limit,))), MIN_RATIO)
    shares = np.array([model.pooled_share(model.kept_table(ahead=(*first, *(count_limit,) * h))) for h in MOVE_HORIZON])
    return np.asarray(shares / base, dtype=np.float64)


STEP_OUT = 1.25
"""A tuned candidate's kept ranks may lie up to this factor beyond those released (a step the next
release then measures); farther is the retention family's extrapolation, where only a probe goes."""


def _incumbent(scored: Sequence[_Scored], recent: Sequence[ReleaseRecord], released: Sequence[ReleaseRecord]
               ) -> _Scored:
    """The best candidate whose count limit lies within those ``released``, or a step (``STEP_OUT``)
    beyond them (the slices' retention is measured there, farther it is the family's extrapolation:
    only a probe goes there), or the best at the latest releases' count limit (the most frequent of the
    last three) when it is within ``STICKINESS`` of it."""
    known = [kept_per_impression(r.count_limit) for r in released]
    inside = ([x for x in scored if min(known) / STEP_OUT <= x.kept_ranks <= max(known) * STEP_OUT]
              if known else [])
    best = min(inside or scored, key=lambda x: (x.error, x.order))
    usual = _usual_ranks(recent)
    same = [x for x in scored if x.kept_ranks == usual and not x.cold]
    if same:
        stay = min(same, key=lambda x: (x.error, x.order))
        if stay.error <= (1.0 + STICKINESS) * best.error:
            return stay
    return best


def _lasting_cost(probe: _Scored, tuned: _Scored, model: PrivateModel) -> float:
    """What a one-day probe adds to the tuned candidate's errors on the days after it, summed over the
    attribution window: its conversions stay charged at the probe's count limit, and below every count
    limit released so far it also charges each conversion no release used (the days before the first:
    ``mechanism.lifetime``, ``optimize.transient``) for every release after it until they age out. 0
    when the probe's own count limit is predicted at least as good over the days ahead (the tuner may
    then stay there) or no schedule is known."""
    if not model.schedule or probe.ahead <= tuned.ahead or tuned.over is None:
        return 0.0
    growth = horizon_growth(model, tuned.version.params.count_limit, first=(probe.version.params.count_limit,))
    return max(0.0, SPREAD_DAYS * (tuned.over(growth) - tuned.ahead))


def _scheduled(scored: Sequence[_Scored], tuned: _Scored, schedule: CountLimitSchedule, day: int,
               model: PrivateModel) -> tuple[ParameterVersion, str]:
    """The version the schedule publishes on ``day`` and why (``CountLimitSchedule``)."""
    if not schedule.probes(day):
        return tuned.version, "tuned (not a probe day)"
    uncertainty = tuned.error / max(tuned.centre, 1e-12) - 1.0
    identified = model.slices is not None and model.slices.identified
    if identified and uncertainty <= schedule.min_uncertainty:
        return tuned.version, (f"tuned: the slices' retention is known well enough (robust / central prediction "
                               f"{1 + uncertainty:.3f})")
    far = [x for x in scored if schedule.far(x.kept_ranks, tuned.kept_ranks) and not x.cold]
    if not far:
        return tuned.version, "tuned: no candidate at a count limit far enough from the tuned one"
    costs = [(x.error - tuned.error + _lasting_cost(x, tuned, model), x.order, x) for x in far]
    cost, _, probe = min(costs, key=lambda t: (t[0], t[1]))
    if cost > schedule.max_cost * tuned.error:
        return tuned.version, (f"tuned: the best probe (C = {probe.version.params.count_limit}) would cost "
                               f"{cost / tuned.error:.0%} of the tuned candidate's error (its day and the "
                               f"window after it)")
    return probe.version, (f"probe: C = {probe.version.params.count_limit} instead of the tuned "
                           f"{tuned.version.params.count_limit} (robust / central prediction {1 + uncertainty:.3f})")


def private_tune(records: Sequence[ReleaseRecord], epsilon: float, domain: KeyDomain, value_columns: Sequence[str], *,
                 window: int = WINDOW, max_count_limit: int = MAX_COUNT_LIMIT, release_period_days: float = 1.0,
                 exploration: Exploration | None = None, taus: Sequence[float] | None = None,
                 spread_days: int = SPREAD_DAYS, schedule: CountLimitSchedule = DEFAULT_SCHEDULE,
                 release_day: int | None = None) -> TuningResult:
    """The parameter version for the release of ``release_day`` (days since the epoch; default the day
    after the last record's) from the last ``window`` records (and the last ``SLICE_HISTORY`` for the
    slices' own retention only).

    Candidates: the tuned parameters (Alg. 5 on the pseudo-history, both objectives) and the cold-start
    rule, each calibrated on the pseudo-history with the ratios the releases show
    (``with_release_ratios``), each with the estimator it would publish (capped or divided by the
    ratio); the one with the lowest error robust to what the releases do not pin down of the slices'
    retention (``heterogeneity.robust_rmsre_tau``) is published with that error as its prediction.
    On the ``schedule``'s probe days a candidate at a count limit far from the tuned one is published
    instead (``CountLimitSchedule``; the version's provenance says so) when its cost, its own day's
    and what it leaves charged for the window after it (``_lasting_cost``), is within ``max_cost``. When the last release
    contradicts the model (``heterogeneity.release_consistency``), the cold-start rule is published
    and the version's provenance says why."""
    recent = list(records)[-window:]
    older = list(records)[-SLICE_HISTORY:-window] if len(records) > window else []
    plan = exploration if exploration is not None else (recent[-1].exploration or default_exploration())
    model = learn(recent, domain, older)
    pseudo = pseudo_history(model, domain.slice_columns, value_columns, inputs_seed(recent), spread_days)
    if taus is None:
        taus = first_party_taus(model.values)
    taus = list(taus)

    def explored(version: ParameterVersion) -> ParameterVersion:
        params = dataclasses.replace(version.params, conversion_slice_columns=domain.conversion_slice_columns,
                                     exploration=None).with_exploration(plan)
        provenance = version.provenance
        if provenance is not None:  # no clock readings: the same inputs give the same file
            provenance = dataclasses.replace(provenance, created_at=None, extra={
                k: v for k, v in provenance.extra.items() if k != "optimizer_seconds"})
        return dataclasses.replace(version, params=params, domain=domain, provenance=provenance)

    # ARA's tuning steps (``optimize.workflow.AraTuning``): the search on the pseudo-history, and each
    # candidate's calibration concluded on its own (the robust score below chooses among them)
    ara = AraTuning(TuneCandidates(epsilon, {
        "objective": Objective.CORRECTED, "taus": taus, "release_period_days": release_period_days,
        "history_days": model.days, "slice_columns": domain.slice_columns, "max_count_limit": max_count_limit,
        "provenance": {"tuning": f"{PRIVACY_SAFE}: DP releases and first-party conversions only",
                       "releases": len(recent), "exploration_share": plan.total_share}}), release_period_days)

    def choose(stats: SufficientStatistics) -> tuple[_Candidates, tuple[ParameterVersion, ...]]:
        """Alg. 5 on the pseudo-history's statistics; with the cold-start rule, the candidates the
        tuning workflow calibrates on the pseudo-history."""
        result, _ = ara.choose(stats)
        pooled_first_party = FirstParty.of(recent[-1].first_party.day, model.values)
        cold = cold_start(pooled_first_party, epsilon, domain, value_columns, plan)
        cold = dataclasses.replace(cold, params=dataclasses.replace(
            cold.params, queries=tuple(dataclasses.replace(q, tau=float(t))
                                       for q, t in zip(cold.params.queries, taus[1:], strict=True))))
        tuned = explored(result.version).provenance
        if tuned is not None:  # the cold-start rule as a candidate of this tuning: it carries the tuning's record
            cold = dataclasses.replace(cold, provenance=dataclasses.replace(tuned, extra={
                **tuned.extra, "tuning": f"{PRIVACY_SAFE}: the cold-start rule, chosen against the tuned candidates"}))
        probes = _probe_candidates(stats, result, epsilon, taus, domain.slice_columns, schedule)
        probes += _staying_candidate(stats, result, epsilon, taus, domain.slice_columns, recent)
        versions = tuple([explored(v) for v, _ in result.candidates] + [explored(v) for v in probes] + [cold])
        searches = tuple([o for _, o in result.candidates] + [result.optimization] * len(probes)
                         + [result.optimization])
        return _Candidates(result, cold, versions, searches), versions

    # the tuning workflow's two distributed steps on the pseudo-history (``optimize.workflow``): its
    # statistics -> ``choose``, then the calibration of every candidate on it
    spec = StatisticsSpec(domain.slice_columns, tuple(value_columns), max_count_limit=max_count_limit)
    run = InMemoryBackend(pseudo).statistics_and_calibration(spec, choose)
    result, cold = run.chosen.result, run.chosen.cold
    candidates = list(zip(run.chosen.versions, run.chosen.searches, run.calibration, strict=True))
    day = last_pseudo_day(pseudo)
    day_index = domain.slice_index(day.slices)
    keys = [slice_key(list(k)) for k in _domain_keys(domain)]
    taus_arr = np.asarray(taus, dtype=np.float64)
    learnt = [kept_per_impression(r.count_limit) for r in recent]
    day_number = (int(np.datetime64(recent[-1].first_party.day, "D").astype(np.int64)) + 1 if release_day is None
                  else int(release_day))
    probe_day = schedule.probes(day_number)  # only a probe reads the errors over the days ahead
    bootstrap = CurveBootstrap(model.curve)  # its refits shared by every candidate's count limit
    scored: list[_Scored] = []
    for number, (version, search, cal) in enumerate(candidates):
        one = ara.conclude(dataclasses.replace(result, version=version, optimization=search, alternatives=()), [cal])
        released = with_release_ratios(one.version, recent, model, bootstrap)
        if released.calibration is None:
            continue
        ratio = _domain_ratio(released.calibration, keys, point=False)
        point = _domain_ratio(released.calibration, keys)
        spread = _spread(model, released.params, ratio, keys)
        value_spread = spread - _spread(model, released.params, ratio, keys, values=False)
        breakdown = expected_error(day, day_index, domain.num_slices, released.params, Objective.EXACT,
                                   tie_breaker=day.record_keys())
        # the pseudo-history keeps its steady state; the release keeps what the count limits before it leave
        mixing, _ = mixing_factor(recent, released.params, model)
        breakdown = dataclasses.replace(breakdown, expected=breakdown.expected * mixing)
        silent = predicted_without_signal(breakdown, released.params)
        scenarios = _scenarios(model, keys, kept_per_impression(released.params.count_limit), learnt)
        central = [scenarios[len(scenarios) // 2]]
        growth = horizon_growth(model, released.params.count_limit) if probe_day else np.ones(1)
        for correction in CORRECTIONS:
            divide = divided_queries(correction, len(taus_arr))
            error = robust_rmsre_tau(breakdown, ratio, divide, value_spread, taus_arr, scenarios, point)
            centre = robust_rmsre_tau(breakdown, ratio, divide, value_spread, taus_arr, central, point)
            over = _over(breakdown, ratio, divide, value_spread, taus_arr, scenarios, error, point)
            ahead = over(growth)
            provenance = released.provenance
            if provenance is not None:
                extra = dict(provenance.extra)
                extra.update(robust_prediction={"candidate": "cold start" if version is cold else f"tuned {number}",
                                                "correction": correction, "rmsre_tau": error,
                                                **({"rmsre_tau_ahead": ahead} if probe_day else {}),
                                                "retention_spread": float(np.median(spread[:, 0]))},
                             **{PREDICTED_WITHOUT_SIGNAL: silent})
                provenance = dataclasses.replace(provenance, predicted_rmsre_tau=error, extra=extra)
            scored.append(_Scored(error, centre, len(scored), version is cold,
                                  dataclasses.replace(released, correction=correction, provenance=provenance), ahead,
                                  over))
    if not scored:
        raise InvalidInput("no candidate of the privacy-safe tuning could be calibrated on its pseudo-history")
    if model.slices is None or not model.slices.identified:
        # one count limit released: no input shows how the slices' retention differs, so no ratio is trusted
        # per slice; the cold-start rule's capped estimates (what the tuner must not do worse than), and the
        # schedule's probes (capped too) to release a second count limit
        last = kept_per_impression(recent[-1].count_limit)
        scored = [x for x in scored if x.version.correction == "none"
                  and (x.cold or schedule.far(x.kept_ranks, last))] or scored
    tuned = _incumbent(scored, recent, [*older, *recent])
    chosen, schedule_note = _scheduled(scored, tuned, schedule, day_number, model)
    check = _consistency(recent[-1], model)
    if check > CONTRADICTION:
        fallback = [x for x in scored if x.cold]
        if fallback:
            chosen = min(fallback, key=lambda x: (x.error, x.order)).version
        note = (f"fallback to the cold-start rule: the last release contradicts the model (standardized scatter "
                f"{check:.3g} > {CONTRADICTION:g})")
    else:
        note = f"the last release agrees with the model (standardized scatter {check:.3g} <= {CONTRADICTION:g})"
    if chosen.provenance is not None:
        slices = model.slices
        described = {} if slices is None else {"slice_retention": {
            "identified": slices.identified, "spreads": list(slices.spreads),
            "grouping": domain.slice_columns[slices.grouping] if slices.grouping >= 0 else None}}
        chosen = dataclasses.replace(chosen, provenance=dataclasses.replace(
            chosen.provenance, extra={**chosen.provenance.extra, "model_check": note, **described,
                                      "excess_ratio_variance": model.excess,
                                      "delay_law_days": model.delay_days,
                                      "count_limit_schedule": {**schedule.to_json(), "day": day_number,
                                                               "decision": schedule_note}}))
    return dataclasses.replace(result, version=shrunk_point(chosen), alternatives=())


def shrunk_point(version: ParameterVersion) -> ParameterVersion:
    """The version whose point estimates divide by E[R^2] / E[R] = r (1 + Var(R) / r^2) instead of r: the
    divisor that minimises the expected squared error of U / p when the slice's retention R is known
    only to within the calibration's count variance (the posterior of the slices' retention, which the
    candidates' scenarios model). Every query's ratio holds the retention, so a value's point (its
    typical day's, ``typical_day_factors``) moves by the count's factor, never by its own variance: that
    also holds the value level's and tail's doubt, sized to make the intervals cover, and shrunk by it
    the values were biased by -0.33 to -0.46 (synth-criteo and hetero-retail, docs/private-tuning-log.md).
    The interval stays the mean ratio's (``calibration.correct``); a capped release ("none") is unchanged."""
    cal = version.calibration
    if cal is None or version.correction == "none":
        return version
    base = np.asarray(cal.ratio if cal.point_ratio is None else cal.point_ratio, dtype=np.float64)
    count = np.maximum(cal.ratio[:, 0], MIN_RATIO)
    factor = (1.0 + cal.variance[:, 0] / count**2)[:, None]  # the retention's relative doubt, every query's
    point = np.where(cal.observed & cal.observed[:, :1], np.clip(base * factor, MIN_RATIO, 1.0), base)
    return dataclasses.replace(version, calibration=dataclasses.replace(cal, point_ratio=point))


def last_pseudo_day(pseudo: Conversions) -> Conversions:
    """The pseudo-history's last day as the period, its earlier rows of the same impressions as lookback."""
    last = int(np.floor_divide(int(pseudo.conversion_time.max()), DAY_US))
    period = np.floor_divide(pseudo.conversion_time, DAY_US) == last
    keys = pseudo.impression_sort_keys()  # integers equal where the ids are: np.isin on objects is quadratic
    rows = np.flatnonzero(period | np.isin(keys, np.unique(keys[period])))
    return pseudo.take(rows).with_in_period(period[rows])


def _domain_keys(domain: KeyDomain) -> list[tuple[Any, ...]]:
    values = domain.slice_values()
    return [tuple(values[c][i] for c in domain.slice_columns) for i in range(domain.num_slices)]


def _domain_ratio(cal: Calibration, keys: Sequence[tuple[Any, ...]], point: bool = True) -> np.ndarray:
    """The ratio the calibration's point estimate divides by per declared slice (its ``point_ratio``
    where it has one; ``point`` False: the mean ratio; rows in ``keys`` order; unseen slices: pooled)."""
    at = {slice_key(list(k)): i for i, k in enumerate(cal.slice_keys)}
    out = np.tile(np.asarray(cal.pooled_ratio, dtype=np.float64), (len(keys), 1))
    point_ratio = cal.ratio if cal.point_ratio is None or not point else cal.point_ratio
    for row, key in enumerate(keys):
        i = at.get(key)
        if i is not None:
            out[row] = np.where(cal.observed[i], point_ratio[i], cal.pooled_ratio)
    return out


def _scenarios(model: PrivateModel, keys: Sequence[tuple[Any, ...]], kept_ranks: int, learnt: Sequence[int]
               ) -> list[tuple[float, np.ndarray, np.ndarray]]:
    """(weight, truth factor, kept factor) per scenario of every slice's retention (its posterior
    quantiles, ``slice_retention.SCENARIO_QUANTILES``): under a slice's scenario retention r^z, the
    kept counts the releases showed (at their kept ranks ``learnt``) mean true totals r / r^z times the
    model's, and the candidate keeps r^z / r of what the pseudo-history kept at ``kept_ranks``."""
    ones = np.ones(len(keys))
    slices = model.slices
    if slices is None:
        return [(1.0, ones, ones)]
    rows = {k: i for i, k in enumerate(model.slice_keys)}
    index = np.array([rows.get(k, -1) for k in keys])
    known = index >= 0

    def at(values: np.ndarray, fill: float) -> np.ndarray:
        out = np.full((len(keys),) + values.shape[1:], fill)
        out[known] = values[index[known]]
        return out

    now = at(slices.quantile_ratios(kept_ranks), 1.0)
    now_mean = at(slices.mean_ratio(kept_ranks), 1.0)
    log_size = np.zeros_like(now)
    for k in sorted(set(learnt)):
        share = learnt.count(k) / len(learnt)
        log_size += share * (np.log(np.maximum(at(slices.mean_ratio(k), 1.0), MIN_RATIO))[:, None]
                             - np.log(np.maximum(at(slices.quantile_ratios(k), 1.0), MIN_RATIO)))
    weight = 1.0 / now.shape[1]
    return [(weight, np.exp(log_size[:, z]), now[:, z] / np.maximum(now_mean, MIN_RATIO)) for z in range(now.shape[1])]


def _spread(model: PrivateModel, params: Params, ratio: np.ndarray, keys: Sequence[tuple[Any, ...]],
            values: bool = True) -> np.ndarray:
    """The variance of every slice's ratio (rows: ``keys``; ``ratio`` its ratios, count first) that the
    calibration does not hold: the posterior variance of the slice's retention at the parameters' kept
    ranks, as a share of its ratio (every query's ratio holds it), and for a value query the
    uncertainty of the slice's value level through the clip (``heterogeneity.ratio_elasticity``
    squared times its log scale's variance) and of its values' tail above the clip
    (``heterogeneity.shape_doubt``: the first-party values mix the slices' levels)."""
    k = kept_per_impression(params.count_limit)
    r = np.asarray(ratio, dtype=np.float64)
    mean = model.ratios_of(keys, k)
    relative = model.ratio_variances(keys, k) / np.maximum(mean, MIN_RATIO) ** 2 + model.excess
    out = relative[:, None] * r**2
    if values and model.value_scales is not None and model.scale_variances is not None:
        for j, query in enumerate(params.queries):
            scales = np.array([float(model.value_scales.get(k, np.ones(len(params.queries)))[j]) for k in keys])
            var = np.array([float(model.scale_variances.get(k, np.full(len(params.queries), 1.0))[j]) for k in keys])
            e = ratio_elasticity(model.values[:, j], scales, query.clip_threshold)
            doubt = (np.zeros(len(keys)) if model.value_shape is None else
                     shape_doubt(model.values[:, j], model.value_shape[:, j], scales, query.clip_threshold))
            out[:, j + 1] += (e**2 * var + doubt) * r[:, j + 1] ** 2
    return np.asarray(out, dtype=np.float64)


def _consistency(record: ReleaseRecord, model: PrivateModel) -> float:
    """``heterogeneity.release_consistency`` of the last release's main count estimates around the
    model's: each slice's share of the day's kept count (its model total times its retention, over
    all slices') times that kept count, the posterior variance of its retention admitted. Relative to
    the day's own kept count, so that only how slices differ is checked (the pool's kept share that
    day is the release's, whatever the count limits before it charged)."""
    k = kept_per_impression(record.count_limit)
    at = {key: i for i, key in enumerate(record.slice_keys)}
    keys = [k2 for k2 in model.slice_totals if k2 in at]
    if not keys:
        return 0.0
    rows = np.array([at[k2] for k2 in keys])
    mean = model.ratios_of(keys, k)
    relative = model.ratio_variances(keys, k) / np.maximum(mean, MIN_RATIO) ** 2
    weight = np.array([float(model.slice_totals[k2][0]) for k2 in keys]) * mean
    kept = float(np.maximum(record.main[rows, 0], 0.0).sum())
    expected = kept * weight / max(float(weight.sum()), 1e-300)
    p = model.curve.size_distribution()
    n = np.arange(1, len(p) + 1, dtype=np.float64)
    cluster = float(p @ n**2) / float(p @ n)  # a day's count of a slice is a sum over impressions
    return release_consistency(record.main[rows, 0], record.main_variance[rows, 0], expected, expected * cluster,
                               relative)


def mixing_factor(records: Sequence[ReleaseRecord], params: Params, model: PrivateModel
                  ) -> tuple[float, list[ReleaseRecord]]:
    """The pooled kept share the release at ``params`` will have tomorrow over the model's steady-state
    one, and the releases it is read from. Alg. 1 charges each conversion at the count limit of the
    release that used it, so after days at other count limits a release keeps another share than its
    count limit's curve (lower after lower count limits); the pseudo-history is in the steady state.
    Tomorrow's share: the latest ``SAME_COUNT_RELEASES`` main releases' at ``params``' count limit and
    arms, moved by the model's transient (``optimize.transient``: its pooled kept share tomorrow, after
    the schedule and this count limit, over its shares on those releases' days); none: the model's
    transient share over its steady one. ``records``: the tail of the model's schedule."""
    kept = kept_per_impression(params.count_limit)
    steady = model.pooled_ratio(kept)
    tomorrow = model.pooled_share(model.kept_table(count_limit=params.count_limit)) if model.schedule else steady
    same = same_count(records, params.count_limit, params.exploration)
    if not same:
        return float(tomorrow / max(steady, MIN_RATIO)), []
    main_share = 1.0 if params.exploration is None else params.exploration.main_share
    fps = np.array([float(r.first_party.totals[0]) for r in same])
    observed = sum(float(r.main[:, 0].sum()) for r in same) / fps.sum()
    if model.schedule:
        position = {id(r): i - len(records) for i, r in enumerate(records)}
        then = np.array([model.pooled_share(model.kept_table(release=position[id(r)])) for r in same])
        observed *= tomorrow / max(float(fps @ then / fps.sum()), MIN_RATIO)
    return float(np.clip(observed, MIN_RATIO, 1.0) / max(main_share * steady, MIN_RATIO)), same


def released_value_shares(records: Sequence[ReleaseRecord], params: Params, values: np.ndarray) -> np.ndarray:
    """Per value query of ``params``: the ``records``' kept value per kept conversion over the true
    value per conversion (first-party totals, exact), each release's clip moved to the query's by the
    first-party values' clipped means; the query's ratio over the count's at ``params``' count limit.
    Read from the releases, not the pseudo-history: Alg. 1 keeps an impression's first conversions,
    and where values go with conversions per impression the kept ones are not the values' average (on
    synth-travel the pseudo-history's value ratio was 1.5x the releases'). NaN where no record states
    its clips or none kept a conversion."""
    out = np.full(len(params.queries), np.nan)
    known = [r for r in records if len(r.clips) == len(params.queries)]
    kept_count = sum(float(r.main[:, 0].sum()) for r in known)
    true_count = sum(float(r.first_party.totals[0]) for r in known)
    if not known or kept_count <= 0 or true_count <= 0:
        return out
    for j, query in enumerate(params.queries):
        pool = ValuePool(values[:, j])
        target = pool.clipped_mean(1.0, query.clip_threshold)
        kept = sum(float(r.main[:, j + 1].sum()) * target / max(pool.clipped_mean(1.0, float(r.clips[j])), 1e-300)
                   for r in known)
        true = sum(float(r.first_party.totals[j + 1]) for r in known)
        if kept > 0 and true > 0:
            out[j] = (kept / true) / (kept_count / true_count)
    return out


TYPICAL_DRAWS = 200
"""Days drawn per slice by ``typical_day_factors``."""
TYPICAL_MAX_CONVERSIONS = 1000
"""Conversions a drawn day holds at most (a larger slice's day is close to the mean: factor ~1)."""


def typical_day_factors(model: PrivateModel, keys: Sequence[tuple[Any, ...]], column: int, clip: float) -> np.ndarray:
    """Per slice, the clipped value ratio that minimises a day's expected squared relative error over
    the mean ratio the calibration holds: with x a day's sum of clipped values over its sum of values
    (its conversions drawn from the first-party values at the slice's level), E[x^2] / E[x] over
    E[min(v, c)] / E[v]. A heavy tail makes them differ: the mean ratio is pulled down by the rare huge
    orders, which most of a small slice's days do not hold, so dividing by it over-corrects the typical
    day (RMSRE_tau, Def. 3.2, scores each day's relative error: on hetero-retail at epsilon = 1 the
    published value was biased by -0.70 to +0.53 day to day). 1 for large slices and values without a
    tail; seeded by the values (the same inputs, the same parameters)."""
    values = np.asarray(model.values, dtype=np.float64).reshape(len(model.values), -1)[:, column]
    values = values[np.isfinite(values) & (values > 0)]
    out = np.ones(len(keys))
    if len(values) == 0 or not clip > 0:
        return out
    rng = np.random.default_rng(len(values))
    for i, key in enumerate(keys):
        total = model.slice_totals.get(key)
        if total is None or not float(total[0]) >= 1:
            continue
        scale = 1.0
        if model.value_scales is not None and key in model.value_scales:
            scale = float(np.asarray(model.value_scales[key]).reshape(-1)[column])
        cut = clip / max(scale, 1e-300)
        n = int(min(round(float(total[0])), TYPICAL_MAX_CONVERSIONS))
        draws = values[rng.integers(0, len(values), (TYPICAL_DRAWS, n))]
        x = np.minimum(draws, cut).sum(axis=1) / draws.sum(axis=1)
        mean = float(np.minimum(values, cut).mean() / values.mean())
        if mean > 0 and x.mean() > 0:
            out[i] = float((x**2).mean() / x.mean()) / mean
    return out


def with_release_ratios(version: ParameterVersion, records: Sequence[ReleaseRecord],
                        model: PrivateModel, bootstrap: CurveBootstrap | None = None) -> ParameterVersion:
    """The version's calibration with the ratios the releases themselves show: the count's is sum U /
    sum T of past main releases at the same count limit and arms (exact first-party T), else the
    model's, times each slice's retention relative to the pool's (``private_model.PrivateModel``); a
    value query's is the pseudo-history's per-slice ratio (the slices' value levels and retention come
    from the releases), rescaled to the releases' pooled one when these very parameters were released;
    its pooled ratio (for slices the pseudo-history did not see) the releases' at its count limit.
    Every slice's variance adds what the calibration does not hold (``_spread``: the posterior variance
    of its retention, its value level's through the clip): the intervals carry what the model cannot
    see. ``bootstrap``: the model's curve's (``CurveBootstrap(model.curve)``, fitted once for every
    candidate of a tuning)."""
    cal = version.calibration
    if cal is None:
        return version
    params = version.params
    same = [r for r in records if r.retention == retention_checksum(params)]
    if same:
        totals = sum(r.first_party.totals for r in same)
        ratio = np.clip(sum(r.main.sum(axis=0) for r in same) / totals, MIN_RATIO, 1.0)
        variance = sum(r.main_variance.sum(axis=0) for r in same) / totals**2
    else:
        ratio = np.asarray(cal.pooled_ratio, dtype=np.float64)
        k = kept_per_impression(params.count_limit)
        bootstrap = CurveBootstrap(model.curve) if bootstrap is None else bootstrap
        variance = np.full(len(ratio), float(bootstrap.ratio_variance([k])[0]))
    ratio = np.array(ratio, dtype=np.float64)  # a copy: the calibration given is not changed
    variance = np.array(variance, dtype=np.float64)
    m = cal.ratio.shape[0]
    keys = [slice_key(list(k)) for k in cal.slice_keys]
    kept = kept_per_impression(params.count_limit)
    pooled_model = model.pooled_ratio(kept)
    # the count's pooled ratio: the latest main releases' at the same count limit and arms (the count's
    # retention does not depend on the clips; what the count limits before them charged is in it), else the
    # model's (conversion-weighted, as the releases' is); the values' pooled ratios move with it
    main_share = 1.0 if params.exploration is None else params.exploration.main_share
    mixing, same_releases = mixing_factor(records, params, model)
    if same_releases:
        fp = sum(float(r.first_party.totals[0]) for r in same_releases)
        ratio[0] = float(np.clip(mixing * main_share * pooled_model, MIN_RATIO, 1.0))  # their share, moved to tomorrow
        variance[0] = sum(float(r.main_variance[:, 0].sum()) for r in same_releases) / fp**2
        if not same:  # the values' ratios over the count's as those releases kept them (clips moved to these)
            anchored = released_value_shares(same_releases, params, model.values)
            ratio[1:] = np.clip(np.where(np.isfinite(anchored), ratio[0] * anchored, ratio[1:] * mixing),
                                MIN_RATIO, 1.0)
    else:
        ratio[0] = float(np.clip(mixing * main_share * pooled_model, MIN_RATIO, 1.0))
    # the slice's own kept share tomorrow relative to the pool's (after the schedule's moves: ``optimize.transient``)
    table = model.kept_table(count_limit=params.count_limit) if model.schedule else None
    tilt = (model.ratios_of(keys, kept) / pooled_model if table is None
            else model.kept_shares(keys, table) / model.pooled_share(table))
    per_slice = np.tile(ratio, (m, 1))
    per_slice[:, 0] = np.clip(ratio[0] * tilt, MIN_RATIO, 1.0)
    per_variance = np.tile(variance, (m, 1))
    pseudo_pooled = np.maximum(np.asarray(cal.pooled_ratio, dtype=np.float64), MIN_RATIO)
    point = per_slice.copy()
    # a slice's value ratio is the pseudo-history's (its own retention, level and clip, in the steady
    # state), rescaled to the releases' pooled one only when these very parameters were released: the
    # pseudo-history's pooled ratio is the slices' shrinkage mean, not the releases' conversion-weighted
    # share (hetero-retail at C = 1: 0.385 against 0.116); moved by the count's transient, the values
    # lost on hetero-retail and hetero-weekday at epsilon = 1 (docs/private-tuning-log.md)
    scale = ratio / pseudo_pooled if same else np.ones(len(ratio))
    for q in range(1, len(ratio)):
        seen = cal.observed[:, q]
        per_slice[seen, q] = np.clip(cal.ratio[seen, q] * scale[q], MIN_RATIO, 1.0)
        per_variance[seen, q] += cal.variance[seen, q]
        # the point divides a value by the typical day's ratio, the interval stays the mean ratio's (``Calibration``)
        typical = typical_day_factors(model, keys, q - 1, float(params.queries[q - 1].clip_threshold))
        point[seen, q] = np.clip(per_slice[seen, q] * typical[seen], MIN_RATIO, 1.0)
    per_variance += _spread(model, params, per_slice, keys)
    pooled_spread = _spread(model, params, ratio[None, :], [()])[0]
    calibration = dataclasses.replace(
        cal, ratio=per_slice, variance=per_variance, pooled_ratio=ratio, pooled_variance=variance + pooled_spread,
        unseen_variance=np.maximum(cal.unseen_variance, variance + pooled_spread),
        point_ratio=point if (point != per_slice).any() else None)
    return dataclasses.replace(version, calibration=calibration)
