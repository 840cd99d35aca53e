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

from araopt.calibration import MIN_RATIO, calibration_statistics, day_blocks, retention_checksum
from araopt.constants import COUNT_TAU, MAX_COUNT_LIMIT, PRIVATE_WINDOW_DAYS
from araopt.errors import InvalidInput
from araopt.io.conversions import Conversions
from araopt.mechanism.bounding import kept_per_impression
from araopt.mechanism.exploration import Exploration, default_exploration
from araopt.mechanism.keys import KeyDomain, slice_key
from araopt.mechanism.params import Params, QueryParams
from araopt.mechanism.release import Release
from araopt.optimize.error_model import default_taus
from araopt.optimize.retention import RetentionCurve, fit_retention_curve, ratio_variance
from araopt.optimize.search import CORRECTED
from araopt.optimize.statistics import StatisticsSpec, compute_statistics_in_memory
from araopt.optimize.tune import TuningResult, calibrate, tune
from araopt.version import ParameterVersion, Provenance

DAY_US = 86_400_000_000
COLD_START_COUNT_LIMIT = 5
"""Day 1's count limit, before any release shows how many conversions an impression has."""
SPREAD_DAYS = 30
"""Days after its impression over which a pseudo-history impression's conversions fall (ARA's default
attribution window: the releases do not show the delays)."""
WINDOW = PRIVATE_WINDOW_DAYS


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
                   np.zeros((0, d1)) if arms is None else arms.std_error**2, first_party)


@dataclass(frozen=True)
class PrivateModel:
    """What the releases and first-party data tell: the retention curve, every declared slice's daily
    true totals (count first), the first-party values, the days learnt from."""

    curve: RetentionCurve
    slice_totals: Mapping[tuple[Any, ...], np.ndarray]
    values: np.ndarray
    days: int


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


def learn(records: Sequence[ReleaseRecord], domain: KeyDomain) -> PrivateModel:
    """The model of the module docstring from ``records`` (all of the same slices and queries)."""
    if not records:
        raise InvalidInput("privacy-safe tuning needs at least one past release")
    curve = fit_retention_curve(retention_points(records))
    values = domain.slice_values()
    keys = [slice_key([values[c][i] for c in domain.slice_columns]) for i in range(domain.num_slices)]
    totals = {k: np.zeros(domain.num_columns) for k in keys}
    for r in records:
        share = 1.0 if r.exploration is None else r.exploration.main_share
        ratio = max(float(curve.ratio(kept_per_impression(r.count_limit))[0]) * share, MIN_RATIO)
        for key, row in zip(r.slice_keys, r.main, strict=True):
            if key in totals:
                totals[key] = totals[key] + row / ratio / len(records)
    # the noise averages out over the days first: cutting each day's estimate at 0 would inflate
    # every small slice by its noise (and small slices weigh most in RMSRE_tau)
    totals = {k: np.maximum(v, 0.0) for k, v in totals.items()}
    pool = np.concatenate([r.first_party.values for r in records])
    return PrivateModel(curve, totals, pool, len(records))


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
    if not ids:
        raise InvalidInput("the releases show no conversions in any declared slice")
    imp = np.concatenate(ids).astype(np.int64)
    t = np.concatenate(times).astype(np.int64)
    vals = model.values[rng.integers(0, len(model.values), len(imp))]
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


def private_tune(records: Sequence[ReleaseRecord], epsilon: float, domain: KeyDomain, value_columns: Sequence[str], *,
                 window: int = WINDOW, max_count_limit: int = MAX_COUNT_LIMIT, release_period_days: float = 1.0,
                 exploration: Exploration | None = None, taus: Sequence[float] | None = None,
                 spread_days: int = SPREAD_DAYS) -> TuningResult:
    """The parameter version for the next release from the last ``window`` records only."""
    recent = list(records)[-window:]
    plan = exploration if exploration is not None else (recent[-1].exploration or default_exploration())
    model = learn(recent, domain)
    pseudo = pseudo_history(model, domain.slice_columns, value_columns, inputs_seed(recent), spread_days)
    stats = compute_statistics_in_memory(pseudo, StatisticsSpec(domain.slice_columns, tuple(value_columns),
                                                                max_count_limit=max_count_limit))
    if taus is None:
        taus = first_party_taus(model.values)
    result = tune(stats, epsilon, objective=CORRECTED, taus=list(taus), release_period_days=release_period_days,
                  history_days=model.days, slice_columns=domain.slice_columns, max_count_limit=max_count_limit,
                  provenance={"tuning": "privacy-safe: DP releases and first-party conversions only",
                              "releases": len(recent), "exploration_share": plan.total_share})

    def explored(version: ParameterVersion) -> ParameterVersion:
        params = dataclasses.replace(version.params, exploration=plan,
                                     conversion_slice_columns=domain.conversion_slice_columns)
        provenance = version.provenance
        if provenance is not None:  # no clock readings: the same inputs give the same file
            provenance = dataclasses.replace(provenance, created_at=None, extra={
                k: v for k, v in provenance.extra.items() if k != "optimizer_seconds"})
        return dataclasses.replace(version, params=params, domain=domain, provenance=provenance)

    result = dataclasses.replace(result, version=explored(result.version),
                                 alternatives=tuple((explored(v), o) for v, o in result.alternatives))
    blocks = day_blocks(pseudo)
    cals = [calibration_statistics(pseudo, v.params, blocks, fitted_for=v.checksum()) for v, _ in result.candidates]
    result = calibrate(result, cals, release_period_days)
    return dataclasses.replace(result, version=with_release_ratios(result.version, recent, model))


def with_release_ratios(version: ParameterVersion, records: Sequence[ReleaseRecord],
                        model: PrivateModel) -> ParameterVersion:
    """The version's calibration with the ratio the releases themselves show: sum U / sum T of past
    main releases with the same retention checksum (exact first-party T), else the model's; every
    slice gets it (the releases cannot tell slices' ratios apart)."""
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
        ratio = cal.pooled_ratio
        k = kept_per_impression(params.count_limit)
        variance = np.full(len(ratio), float(ratio_variance(model.curve, [k])[0]))
    m = cal.ratio.shape[0]
    variance = np.asarray(variance, dtype=np.float64)
    calibration = dataclasses.replace(
        cal, ratio=np.tile(ratio, (m, 1)), variance=np.tile(variance, (m, 1)), pooled_ratio=np.asarray(ratio),
        pooled_variance=variance, unseen_variance=np.maximum(cal.unseen_variance, variance))
    return dataclasses.replace(version, calibration=calibration)
