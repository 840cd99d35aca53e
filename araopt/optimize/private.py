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
size distribution the paper's Sec. 5.3 model draws from, without assuming its law. (3) Per-slice daily
truths are the main releases' estimates divided by their ratio. (4) A pseudo-history is drawn from the
model (impressions per slice, sizes from the curve, conversions spread over the attribution window,
values from the first-party conversions; seeded by the inputs' digest: model sampling, not privacy
noise) and the usual tuning runs on it: Alg. 5 for one release period (``optimize.tune``), its
candidates calibrated and replayed (``calibration.backtest``). (5) The calibration's ratio is the
main releases' own pooled ratio, sum U / sum T over past days with the same retention checksum (exact
first-party T, noise-dominated error), else the model's; the slices share it (the releases cannot
tell slices' ratios apart) and its variance is its noise or the curve's bootstrap variance.

Everything it outputs is a function of DP releases, first-party facts, the declared domain and public
parameters: post-processing (the releases stay epsilon-DP; the first-party data is the advertiser's
own). Day 1 (``cold_start``) has no release yet: L-inf at a default count limit with clips at the
first-party values' 95% quantile, with the arms switched on.
"""
from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from araopt.calibration import MIN_RATIO, Calibration, retention_checksum
from araopt.constants import COUNT_TAU, MAX_COUNT_LIMIT, PRIVATE_WINDOW_DAYS
from araopt.errors import InvalidInput
from araopt.io.conversions import Conversions
from araopt.mechanism.bounding import kept_per_impression
from araopt.mechanism.exploration import Exploration, default_exploration
from araopt.mechanism.keys import KeyDomain, slice_key
from araopt.mechanism.params import Params, QueryParams
from araopt.mechanism.release import Release
from araopt.optimize.error_model import default_taus, expected_error
from araopt.optimize.heterogeneity import (
    CONTRADICTION,
    EXPONENT_PRIOR_VARIANCE,
    SliceCounts,
    SliceValues,
    ratio_elasticity,
    release_consistency,
    retention_exponents,
    retention_spread,
    robust_rmsre_tau,
    value_scales,
)
from araopt.optimize.retention import RetentionCurve, fit_retention_curve, ratio_variance
from araopt.optimize.search import CORRECTED
from araopt.optimize.statistics import StatisticsSpec, SufficientStatistics, compute_statistics_in_memory
from araopt.optimize.tune import TuningResult, calibrate, tune
from araopt.optimize.workflow import InMemoryBackend
from araopt.version import ParameterVersion, Provenance

DAY_US = 86_400_000_000
COLD_START_COUNT_LIMIT = 5
"""Day 1's count limit, before any release shows how many conversions an impression has."""
SPREAD_DAYS = 30
"""Days after its impression over which a pseudo-history impression's conversions fall (ARA's default
attribution window: the releases do not show the delays)."""
WINDOW = PRIVATE_WINDOW_DAYS
EXPONENT_HISTORY = 60
"""Releases the slices' retention exponents are learnt from (the window's and older ones)."""


@dataclass(frozen=True)
class FirstParty:
    """The advertiser's own conversions of one release period: their count and value sums (count
    first), and the values themselves (n, d): no impression, no impression-side slice."""

    day: str
    totals: np.ndarray
    values: np.ndarray

    @classmethod
    def of(cls, day: str, values: np.ndarray) -> FirstParty:
        v = np.asarray(values, dtype=np.float64)
        v = v[:, None] if v.ndim == 1 else v
        # in a canonical order (rows sorted): the pool values are drawn from by position and the sums
        # (the pseudo-history's seed) must not depend on how the rows came in
        v = v[np.lexsort(v.T[::-1])] if v.size else v
        return cls(day, np.concatenate([[float(len(v))], v.sum(axis=0)]), v)


@dataclass(frozen=True)
class ReleaseRecord:
    """One past release as the privacy-safe tuner sees it: the public facts of its parameters (count
    limit, exploration arms, retention checksum), the noised capped estimates of the main keys per
    domain slice and of the exploration arms (Alg. 4, with their variances), and the advertiser's
    first-party facts of its period."""

    count_limit: int
    exploration: Exploration | None
    retention: str
    slice_keys: tuple[tuple[Any, ...], ...]
    main: np.ndarray
    main_variance: np.ndarray
    arms: np.ndarray
    arms_variance: np.ndarray
    first_party: FirstParty
    clips: tuple[float, ...] = ()
    """The main release's clip thresholds per value query (public parameters; empty: unknown)."""

    @classmethod
    def of(cls, release: Release, first_party: FirstParty) -> ReleaseRecord:
        """From a release in memory (what its files publish: ``publication.estimates_frame`` and
        ``exploration_frame`` hold the same numbers)."""
        d1 = release.domain.num_columns
        values = release.domain.slice_values()
        keys = tuple(slice_key([values[c][i] for c in release.domain.slice_columns])
                     for i in range(release.domain.num_slices))
        arms = release.exploration
        return cls(release.params.count_limit, release.params.exploration, retention_checksum(release.params), keys,
                   release.estimates.estimate, release.estimates.std_error**2,
                   np.zeros((0, d1)) if arms is None else arms.estimate,
                   np.zeros((0, d1)) if arms is None else arms.std_error**2, first_party,
                   tuple(q.clip_threshold for q in release.params.queries))


@dataclass(frozen=True)
class PrivateModel:
    """What the releases and first-party data tell: the retention curve, every declared slice's daily
    true totals (count first), the first-party values, the days learnt from."""

    curve: RetentionCurve
    slice_totals: Mapping[tuple[Any, ...], np.ndarray]
    values: np.ndarray
    days: int
    value_scales: Mapping[tuple[Any, ...], np.ndarray] | None = None
    """Per slice, its values' scale per value query relative to the first-party values (from the
    releases' clipped means: ``optimize.heterogeneity``); None: every slice draws the pooled values."""
    scale_variances: Mapping[tuple[Any, ...], np.ndarray] | None = None
    """Per slice, the posterior variance of its log value scales."""
    exponents: Mapping[tuple[Any, ...], tuple[float, float]] | None = None
    """Per slice, its retention exponent theta (r_k(K) = r(K)^theta) and theta's posterior variance
    (``heterogeneity.retention_exponents``); None: every slice has the pooled curve."""

    def slice_ratio(self, key: tuple[Any, ...], kept_ranks: int) -> float:
        """r_k(K) of a slice: the pooled curve's r(K) to the slice's exponent."""
        r = max(float(self.curve.ratio(kept_ranks)[0]), MIN_RATIO)
        theta = 1.0 if self.exponents is None or key not in self.exponents else self.exponents[key][0]
        return float(r**theta)


def retention_points(records: Sequence[ReleaseRecord]) -> list[tuple[int, float, float]]:
    """(kept ranks K, ratio r(K), variance) from every arm and every main release, pooled per K:
    an arm's kept-count estimate over its share of the day's first-party conversions; the main
    release's summed over slices over the main share (variances: the noise and a binomial-like
    sampling term of the share)."""
    raw: dict[int, list[tuple[float, float]]] = {}
    for r in records:
        total = float(r.first_party.totals[0])
        exploration = r.exploration
        main_share = 1.0 if exploration is None else exploration.main_share
        if exploration is not None:
            for arm, est, var in zip(exploration.arms, r.arms[:, 0], r.arms_variance[:, 0], strict=True):
                n = arm.share * total
                if n >= 1:
                    point = (float(est) / n, float(var) / n**2 + 1 / n)
                    raw.setdefault(kept_per_impression(arm.count_limit), []).append(point)
        n = main_share * total
        if n >= 1:
            raw.setdefault(kept_per_impression(r.count_limit), []).append(
                (float(r.main[:, 0].sum()) / n, float(r.main_variance[:, 0].sum()) / n**2 + 0.1 / n))
    points = []
    for k, values in sorted(raw.items()):
        w = np.array([1.0 / max(v, 1e-12) for _, v in values])
        points.append((k, float(np.sum(w * np.array([x for x, _ in values])) / w.sum()), float(1.0 / w.sum())))
    return points


def learn(records: Sequence[ReleaseRecord], domain: KeyDomain,
          older: Sequence[ReleaseRecord] = (), exponent: float | None = None) -> PrivateModel:
    """The model of the module docstring from ``records`` (all of the same slices and queries); the
    slices' retention exponents also from ``older`` releases (a slice's conversions per impression is
    a lasting trait, and older releases may be at other count limits); ``exponent``: every slice's
    exponent fixed instead (0: slices keep all they convert)."""
    if not records:
        raise InvalidInput("privacy-safe tuning needs at least one past release")
    curve = fit_retention_curve(retention_points(records))
    values = domain.slice_values()
    keys = [slice_key([values[c][i] for c in domain.slice_columns]) for i in range(domain.num_slices)]
    exponents = (slice_exponents([*older, *records], keys, curve) if exponent is None
                 else {k: (exponent, 0.0) for k in keys})
    totals = {k: np.zeros(domain.num_columns) for k in keys}
    for r in records:
        share = 1.0 if r.exploration is None else r.exploration.main_share
        pooled = max(float(curve.ratio(kept_per_impression(r.count_limit))[0]), MIN_RATIO)
        for key, row in zip(r.slice_keys, r.main, strict=True):
            if key in totals:
                ratio = max(pooled ** exponents[key][0] * share, MIN_RATIO)
                totals[key] = totals[key] + row / ratio / len(records)
    # the noise averages out over the days first: cutting each day's estimate at 0 would inflate
    # every small slice by its noise (and small slices weigh most in RMSRE_tau)
    totals = {k: np.maximum(v, 0.0) for k, v in totals.items()}
    pool = np.concatenate([r.first_party.values for r in records])
    scales = slice_value_scales(records, keys, totals, pool)
    return PrivateModel(curve, totals, pool, len(records), None if scales is None else scales[0],
                        None if scales is None else scales[1], exponents)


def slice_exponents(records: Sequence[ReleaseRecord], keys: Sequence[tuple[Any, ...]], curve: RetentionCurve
                    ) -> dict[tuple[Any, ...], tuple[float, float]]:
    """Every declared slice's retention exponent from the main releases grouped by count limit
    (``heterogeneity.retention_exponents``): a slice's kept share of the day's conversions per day,
    averaged over the days of one count limit."""
    p = curve.size_distribution()
    n = np.arange(1, len(p) + 1, dtype=np.float64)
    cluster = float(p @ n**2) / float(p @ n)
    by_k: dict[int, list[ReleaseRecord]] = {}
    for r in records:
        by_k.setdefault(kept_per_impression(r.count_limit), []).append(r)
    groups = []
    for k, group in sorted(by_k.items()):
        share = np.zeros(len(keys))
        variance = np.zeros(len(keys))
        for r in group:
            at = {key: i for i, key in enumerate(r.slice_keys)}
            rows = np.array([at.get(key, -1) for key in keys])
            main_share = 1.0 if r.exploration is None else r.exploration.main_share
            total = max(float(r.first_party.totals[0]) * main_share, 1.0)
            u = np.where(rows >= 0, r.main[rows, 0], 0.0)
            v = np.where(rows >= 0, r.main_variance[rows, 0], 0.0)
            share += u / total / len(group)
            # noise, and the day's sampling of the slice's conversions (clustered by impression)
            variance += (v + np.maximum(u, 0.0) * cluster) / total**2 / len(group) ** 2
        groups.append(SliceCounts(k, share, variance, max(float(curve.ratio(k)[0]), MIN_RATIO)))
    theta, var = retention_exponents(groups)
    return {key: (float(theta[i]), float(var[i])) for i, key in enumerate(keys)}


def slice_value_scales(records: Sequence[ReleaseRecord], keys: Sequence[tuple[Any, ...]],
                       totals: Mapping[tuple[Any, ...], np.ndarray], pool: np.ndarray
                       ) -> tuple[dict[tuple[Any, ...], np.ndarray], dict[tuple[Any, ...], np.ndarray]] | None:
    """Every declared slice's value scale per query from the main releases' clipped means, grouped by
    clip (``heterogeneity.value_scales``); None when no record states its clips."""
    known = [r for r in records if len(r.clips) == pool.shape[1]]
    if not known:
        return None
    scales = np.ones((len(keys), pool.shape[1]))
    variances = np.zeros((len(keys), pool.shape[1]))
    weights = np.array([float(totals[k][0]) for k in keys])
    for j in range(pool.shape[1]):
        groups: dict[float, list[ReleaseRecord]] = {}
        for r in known:
            groups.setdefault(float(r.clips[j]), []).append(r)
        observed = []
        for clip, group in sorted(groups.items()):
            rows = [dict(zip(r.slice_keys, range(len(r.slice_keys)), strict=True)) for r in group]
            index = [[row.get(k, -1) for k in keys] for row in rows]

            def summed(field: str, column: int, group: list[ReleaseRecord] = group,
                       index: list[list[int]] = index) -> np.ndarray:
                out = np.zeros(len(keys))
                for r, idx in zip(group, index, strict=True):
                    at = np.asarray(idx)
                    ok = at >= 0
                    out[ok] += getattr(r, field)[at[ok], column]
                return out

            observed.append(SliceValues(clip, summed("main", 0), summed("main_variance", 0),
                                        summed("main", j + 1), summed("main_variance", j + 1)))
        scales[:, j], variances[:, j] = value_scales(observed, pool[:, j], weights)
    return {k: scales[i] for i, k in enumerate(keys)}, {k: variances[i] for i, k in enumerate(keys)}


def pseudo_history(model: PrivateModel, slice_columns: Sequence[str], value_columns: Sequence[str], seed: int,
                   spread_days: int = SPREAD_DAYS) -> Conversions:
    """A conversion log drawn from the model: per slice Poisson impressions started over the model's
    days and the ``spread_days`` before them, sizes from the retention curve, conversions uniform over
    ``spread_days`` after the impression, values from the first-party conversions, cut at the end of
    the model's days. ``in_period`` marks the model's days (earlier conversions only give lifetime
    ranks)."""
    rng = np.random.default_rng(seed)
    sizes = model.curve.size_distribution()
    mean_size = model.curve.mean_size()
    days = model.days
    ids: list[np.ndarray] = []
    times: list[np.ndarray] = []
    slices: dict[str, list[np.ndarray]] = {c: [] for c in slice_columns}
    row_scales: list[np.ndarray] = []
    next_id = 0
    for key, total in model.slice_totals.items():
        impressions = int(rng.poisson(float(total[0]) * (days + spread_days) / mean_size))
        if impressions == 0:
            continue
        size = rng.choice(len(sizes), impressions, p=sizes) + 1
        start = rng.integers(-spread_days * DAY_US, days * DAY_US, impressions)
        rows = int(size.sum())
        ids.append(np.repeat(np.arange(next_id, next_id + impressions), size))
        next_id += impressions
        times.append(np.repeat(start, size) + rng.integers(0, spread_days * DAY_US, rows))
        for column, value in zip(slice_columns, key, strict=True):
            slices[column].append(np.full(rows, value, dtype=object if isinstance(value, str) else None))
        if model.value_scales is not None:
            row_scales.append(np.tile(model.value_scales[key], (rows, 1)))
    if not ids:
        raise InvalidInput("the releases show no conversions in any declared slice")
    imp = np.concatenate(ids).astype(np.int64)
    t = np.concatenate(times).astype(np.int64)
    vals = model.values[rng.integers(0, len(model.values), len(imp))]
    if model.value_scales is not None:  # each slice's value level, as its releases show it
        vals = vals * np.concatenate(row_scales).reshape(len(imp), -1)
    conv = Conversions(imp, t, {c: np.concatenate(v) for c, v in slices.items()}, vals.reshape(len(imp), -1),
                       tuple(value_columns))
    # a history ends with its last day: conversions after it are not in it (as in a real window)
    conv = conv.take(np.flatnonzero(t < days * DAY_US))
    return dataclasses.replace(conv, in_period=conv.conversion_time >= 0)


def first_party_taus(values: np.ndarray) -> list[float]:
    """The paper's taus (Sec. 5.1: 5 for the count, 5 x the median of each value) from first-party values."""
    return [float(t) for t in default_taus(values, COUNT_TAU)]


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
                    exploration=exploration if exploration is not None else default_exploration())
    return ParameterVersion(params, domain=domain, provenance=Provenance(extra={
        "tuning": "cold start: no release yet; clips from first-party values only",
        "exploration_share": params.exploration.total_share if params.exploration is not None else 0.0}))


def inputs_seed(records: Sequence[ReleaseRecord]) -> int:
    """A seed for the pseudo-history from the inputs' digest: the same inputs, the same parameters."""
    digest = hashlib.sha256()
    for r in records:
        for a in (r.main, r.arms, r.first_party.totals):
            digest.update(np.ascontiguousarray(a, dtype=np.float64).tobytes())
    return int.from_bytes(digest.digest()[:8], "big")


@dataclass(frozen=True)
class _Candidates:
    """What privacy-safe tuning's ``choose`` made of the pseudo-history: the tuning, the cold-start rule,
    and the candidate versions with the search each came from (in the calibration's order)."""

    result: TuningResult
    cold: ParameterVersion
    versions: tuple[ParameterVersion, ...]
    searches: tuple[Any, ...]


def private_tune(records: Sequence[ReleaseRecord], epsilon: float, domain: KeyDomain, value_columns: Sequence[str], *,
                 window: int = WINDOW, max_count_limit: int = MAX_COUNT_LIMIT, release_period_days: float = 1.0,
                 exploration: Exploration | None = None, taus: Sequence[float] | None = None,
                 spread_days: int = SPREAD_DAYS) -> TuningResult:
    """The parameter version for the next release from the last ``window`` records (and the last
    ``EXPONENT_HISTORY`` for the slices' retention exponents only).

    Candidates: the tuned parameters (Alg. 5 on the pseudo-history, both objectives) and the cold-start
    rule, each calibrated on the pseudo-history with the ratios the releases show
    (``with_release_ratios``), each with the estimator it would publish (capped or divided by the
    ratio); the one with the lowest error robust to the slices' unseen retention differences
    (``heterogeneity.robust_rmsre_tau``) is published with that error as its prediction. When the last
    release contradicts the model (``heterogeneity.release_consistency``), the cold-start rule is
    published and the version's provenance says why."""
    recent = list(records)[-window:]
    older = list(records)[-EXPONENT_HISTORY:-window] if len(records) > window else []
    plan = exploration if exploration is not None else (recent[-1].exploration or default_exploration())
    model = learn(recent, domain, older)
    pseudo = pseudo_history(model, domain.slice_columns, value_columns, inputs_seed(recent), spread_days)
    if taus is None:
        taus = first_party_taus(model.values)
    taus = list(taus)

    def explored(version: ParameterVersion) -> ParameterVersion:
        params = dataclasses.replace(version.params, exploration=plan,
                                     conversion_slice_columns=domain.conversion_slice_columns)
        provenance = version.provenance
        if provenance is not None:  # no clock readings: the same inputs give the same file
            provenance = dataclasses.replace(provenance, created_at=None, extra={
                k: v for k, v in provenance.extra.items() if k != "optimizer_seconds"})
        return dataclasses.replace(version, params=params, domain=domain, provenance=provenance)

    def choose(stats: SufficientStatistics) -> tuple[_Candidates, tuple[ParameterVersion, ...]]:
        """Alg. 5 on the pseudo-history's statistics, and on the low-retention one's; with the cold-start
        rule, the candidates the tuning workflow calibrates on the pseudo-history."""
        result = tune(stats, epsilon, objective=CORRECTED, taus=taus, release_period_days=release_period_days,
                      history_days=model.days, slice_columns=domain.slice_columns, max_count_limit=max_count_limit,
                      provenance={"tuning": "privacy-safe: DP releases and first-party conversions only",
                                  "releases": len(recent), "exploration_share": plan.total_share})
        # the same tuning where every slice keeps all it converts (theta = 0): the smallest true totals the
        # releases allow, so the candidates span what the releases cannot tell apart
        low = dataclasses.replace(model, exponents={k: (0.0, 0.0) for k in model.slice_totals},
                                  slice_totals=learn(recent, domain, older, exponent=0.0).slice_totals)
        low_pseudo = pseudo_history(low, domain.slice_columns, value_columns, inputs_seed(recent) ^ 1, spread_days)
        low_result = tune(compute_statistics_in_memory(low_pseudo, spec), epsilon, objective=CORRECTED, taus=taus,
                          release_period_days=release_period_days, history_days=model.days,
                          slice_columns=domain.slice_columns, max_count_limit=max_count_limit,
                          provenance={"tuning": "privacy-safe: DP releases and first-party conversions only "
                                                "(slices' retention 1)",
                                      "releases": len(recent), "exploration_share": plan.total_share})
        pooled_first_party = FirstParty.of(recent[-1].first_party.day, model.values)
        cold = cold_start(pooled_first_party, epsilon, domain, value_columns, plan)
        cold = dataclasses.replace(cold, params=dataclasses.replace(
            cold.params, queries=tuple(dataclasses.replace(q, tau=float(t))
                                       for q, t in zip(cold.params.queries, taus[1:], strict=True))))
        tuned = explored(result.version).provenance
        if tuned is not None:  # the cold-start rule as a candidate of this tuning: it carries the tuning's record
            cold = dataclasses.replace(cold, provenance=dataclasses.replace(tuned, extra={
                **tuned.extra, "tuning": "privacy-safe: the cold-start rule, chosen against the tuned candidates"}))
        versions = tuple([explored(v) for v, _ in result.candidates] + [explored(v) for v, _ in low_result.candidates]
                         + [cold])
        searches = tuple([o for _, o in result.candidates] + [o for _, o in low_result.candidates]
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
    scored: list[tuple[float, int, bool, ParameterVersion]] = []
    learnt = float(np.exp(np.mean([np.log(max(float(model.curve.ratio(kept_per_impression(r.count_limit))[0]), MIN_RATIO))
                                   for r in recent])))
    for number, (version, search, cal) in enumerate(candidates):
        one = calibrate(dataclasses.replace(result, version=version, optimization=search, alternatives=()), [cal],
                        release_period_days)
        released = with_release_ratios(one.version, recent, model)
        if released.calibration is None:
            continue
        ratio = _domain_ratio(released.calibration, keys)
        spread = _spread(model, released.params, ratio, keys)
        value_spread = spread - _spread(model, released.params, ratio, keys, values=False)
        breakdown = expected_error(day, day_index, domain.num_slices, released.params, "exact",
                                   tie_breaker=day.record_keys())
        pooled_curve = max(float(model.curve.ratio(kept_per_impression(released.params.count_limit))[0]), MIN_RATIO)
        theta = np.array([model.exponents[k][0] if model.exponents and k in model.exponents else 1.0 for k in keys])
        theta_var = np.array([model.exponents[k][1] if model.exponents and k in model.exponents
                              else EXPONENT_PRIOR_VARIANCE for k in keys])
        for correction in ("none", "ratio"):
            error = robust_rmsre_tau(breakdown, ratio, correction == "ratio", value_spread, taus_arr, pooled_curve,
                                     learnt, theta, theta_var)
            provenance = released.provenance
            if provenance is not None:
                extra = dict(provenance.extra)
                extra.update(robust_prediction={"candidate": "cold start" if version is cold else f"tuned {number}",
                                                "correction": correction, "rmsre_tau": error,
                                                "retention_spread": float(np.median(spread[:, 0]))})
                provenance = dataclasses.replace(provenance, predicted_rmsre_tau=error, extra=extra)
            scored.append((error, len(scored), version is cold,
                           dataclasses.replace(released, correction=correction, provenance=provenance)))
    if not scored:
        raise InvalidInput("no candidate of the privacy-safe tuning could be calibrated on its pseudo-history")
    chosen = min(scored, key=lambda x: (x[0], x[1]))[3]
    check = _consistency(recent[-1], model, domain)
    if check > CONTRADICTION:
        fallback = [x for x in scored if x[2]]
        if fallback:
            chosen = min(fallback, key=lambda x: (x[0], x[1]))[3]
        note = (f"fallback to the cold-start rule: the last release contradicts the model (standardized scatter "
                f"{check:.3g} > {CONTRADICTION:g})")
    else:
        note = f"the last release agrees with the model (standardized scatter {check:.3g} <= {CONTRADICTION:g})"
    if chosen.provenance is not None:
        chosen = dataclasses.replace(chosen, provenance=dataclasses.replace(
            chosen.provenance, extra={**chosen.provenance.extra, "model_check": note}))
    return dataclasses.replace(result, version=chosen, alternatives=())


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


def _domain_ratio(cal: Calibration, keys: Sequence[tuple[Any, ...]]) -> np.ndarray:
    """The calibration's ratio per declared slice (rows in ``keys`` order; unseen slices: pooled)."""
    at = {slice_key(list(k)): i for i, k in enumerate(cal.slice_keys)}
    out = np.tile(np.asarray(cal.pooled_ratio, dtype=np.float64), (len(keys), 1))
    for row, key in enumerate(keys):
        i = at.get(key)
        if i is not None:
            out[row] = np.where(cal.observed[i], cal.ratio[i], cal.pooled_ratio)
    return out


def _spread(model: PrivateModel, params: Params, ratio: np.ndarray, keys: Sequence[tuple[Any, ...]],
            values: bool = True) -> np.ndarray:
    """The variance of every slice's ratio (rows: ``keys``; ``ratio`` its ratios, count first) that the
    model cannot see: the retention spread at the parameters' kept ranks, scaled to each query by its
    ratio over the count's, and for a value query the uncertainty of the slice's value level through
    the clip (``heterogeneity.ratio_elasticity`` squared times its log scale's variance)."""
    k = kept_per_impression(params.count_limit)
    pooled = max(float(model.curve.ratio(k)[0]), MIN_RATIO)
    r = np.asarray(ratio, dtype=np.float64)
    # Var(r_k) of r_k = r^theta_k through theta's posterior variance (delta method), as a share of r_k
    relative = np.array([np.log(pooled) ** 2 * (model.exponents[key][1] if model.exponents and key in model.exponents
                                                else EXPONENT_PRIOR_VARIANCE) for key in keys])
    out = relative[:, None] * r**2
    if values and model.value_scales is not None and model.scale_variances is not None:
        for j, query in enumerate(params.queries):
            scales = np.array([float(model.value_scales.get(k, np.ones(len(params.queries)))[j]) for k in keys])
            var = np.array([float(model.scale_variances.get(k, np.full(len(params.queries), 1.0))[j]) for k in keys])
            e = ratio_elasticity(model.values[:, j], scales, query.clip_threshold)
            out[:, j + 1] += (e**2 * var) * r[:, j + 1] ** 2
    return np.asarray(out, dtype=np.float64)


def _consistency(record: ReleaseRecord, model: PrivateModel, domain: KeyDomain) -> float:
    """``heterogeneity.release_consistency`` of the last release's main count estimates: expected
    r(C) x main share x the slice's model total x the day's first-party volume over the model's mean."""
    share = 1.0 if record.exploration is None else record.exploration.main_share
    k = kept_per_impression(record.count_limit)
    ratio = max(float(model.curve.ratio(k)[0]) * share, MIN_RATIO)
    mean_day = float(np.sum([v[0] for v in model.slice_totals.values()]))
    volume = float(record.first_party.totals[0]) / mean_day if mean_day > 0 else 1.0
    at = {key: i for i, key in enumerate(record.slice_keys)}
    keys = [k2 for k2 in model.slice_totals if k2 in at]
    if not keys:
        return 0.0
    rows = np.array([at[k2] for k2 in keys])
    truth = np.array([float(model.slice_totals[k2][0]) for k2 in keys]) * volume
    p = model.curve.size_distribution()
    n = np.arange(1, len(p) + 1, dtype=np.float64)
    cluster = float(p @ n**2) / float(p @ n)  # a day's count of a slice is a sum over impressions
    return release_consistency(record.main[rows, 0], record.main_variance[rows, 0], ratio * truth,
                               ratio**2 * truth * cluster, retention_spread(model.curve, k))


def with_release_ratios(version: ParameterVersion, records: Sequence[ReleaseRecord],
                        model: PrivateModel) -> ParameterVersion:
    """The version's calibration with the ratios the releases themselves show: the count's is sum U /
    sum T of past main releases with the same retention checksum (exact first-party T), else the
    model's, for every slice (no input shows a slice's own retention); a value query's is the pseudo-
    history's per-slice ratio (the slices' value levels come from the releases) rescaled to the
    releases' pooled one. Every slice's variance adds the admitted between-slice spread of retention
    (``heterogeneity.retention_spread``): the intervals carry what the model cannot see."""
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
        variance = np.full(len(ratio), float(ratio_variance(model.curve, [k])[0]))
    ratio = np.asarray(ratio, dtype=np.float64)
    variance = np.asarray(variance, dtype=np.float64)
    m = cal.ratio.shape[0]
    keys = [slice_key(list(k)) for k in cal.slice_keys]
    kept = kept_per_impression(params.count_limit)
    pooled_curve = max(float(model.curve.ratio(kept)[0]), MIN_RATIO)
    tilt = np.array([model.slice_ratio(k, kept) / pooled_curve for k in keys])  # the slice's own retention
    per_slice = np.tile(ratio, (m, 1))
    per_slice[:, 0] = np.clip(ratio[0] * tilt, MIN_RATIO, 1.0)
    per_variance = np.tile(variance, (m, 1))
    pseudo_pooled = np.maximum(np.asarray(cal.pooled_ratio, dtype=np.float64), MIN_RATIO)
    for q in range(1, len(ratio)):
        seen = cal.observed[:, q]
        per_slice[seen, q] = np.clip(cal.ratio[seen, q] * ratio[q] / pseudo_pooled[q] * tilt[seen], MIN_RATIO, 1.0)
        per_variance[seen, q] += cal.variance[seen, q]
    per_variance += _spread(model, params, per_slice, keys)
    pooled_spread = _spread(model, params, ratio[None, :], [()])[0]
    calibration = dataclasses.replace(
        cal, ratio=per_slice, variance=per_variance, pooled_ratio=ratio, pooled_variance=variance + pooled_spread,
        unseen_variance=np.maximum(cal.unseen_variance, variance + pooled_spread))
    return dataclasses.replace(version, calibration=calibration)
