"""The privacy-safe tuner's model (``optimize.private``): what it reads of a release and of the
advertiser's own conversions, and what it learns from them.

- ``ReleaseRecord``: one past release as the tuner sees it (the public parameters, the noised capped
  estimates of the main keys per slice and of the exploration arms) with its day's ``FirstParty``
  facts (the advertiser's conversions without the impression join).
- ``retention_points``: the pooled retention r(K) at every count limit of the arms and the settled
  main releases.
- ``learn``: the ``PrivateModel``: the pooled retention curve (``optimize.retention``), each slice's
  own curve (``optimize.slice_retention``: identified from main releases at two count limits or
  more, shrunk by empirical Bayes), each slice's daily true totals (the main releases divided by the
  slice's retention relative to the pool's, scaled to the day's first-party conversions, averaged
  over the days before cutting at 0), each slice's value level (``optimize.heterogeneity``), the
  first-party values.
- ``pseudo_history``: a conversion log drawn from the model (model sampling seeded by the inputs'
  digest, not privacy noise), on which the usual tuning runs.
"""
from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from araopt.calibration import MIN_RATIO, retention_checksum
from araopt.constants import COUNT_TAU
from araopt.errors import InvalidInput
from araopt.io.conversions import Conversions
from araopt.mechanism.bounding import kept_per_impression
from araopt.mechanism.exploration import Exploration
from araopt.mechanism.keys import KeyDomain, slice_key
from araopt.mechanism.release import Release
from araopt.optimize.error_model import default_taus
from araopt.optimize.heterogeneity import SliceValues, value_scales, within_slice_values
from araopt.optimize.retention import MAX_SIZE, RetentionCurve, fit_retention_curve
from araopt.optimize.slice_retention import SliceDays, SlicePosterior, slice_posterior
from araopt.optimize.transient import DELAY_LAWS, SPREAD_DAYS, release_table

DAY_US = 86_400_000_000
SLICE_HISTORY = 60
"""Releases the retention curves are learnt from (the window's and older ones: conversions per
impression are a lasting trait, and older releases may be at other count limits)."""
SAME_COUNT_RELEASES = 3
"""The latest releases at a candidate's count limit whose pooled kept share is its ratio."""
MIN_EXCESS_CELLS = 8
"""Fewer (release, slice) residuals than this say nothing of the model's excess scatter (it stays 0)."""
SETTLE_RELEASES = 30
"""Releases (days) before a main release that must share its count limit for its kept share to be the
curve's r(K): an impression's conversions fall within ARA's 30-day attribution window."""


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
    days_since_start: int | None = None
    """Days from the measurement's declared start (``lifetime.ReleaseHistory.start_us``) to this release (0:
    the first); None: not declared. The conversions before the start registered no contribution, so for
    30 days the releases after it, arms included, keep more than r(K) (``transient.kept_table``'s
    ``start_offset``)."""

    @property
    def main_conversions(self) -> float:
        """The day's first-party conversions on the main release's share of impressions (all without arms)."""
        return float(self.first_party.totals[0]) * (1.0 if self.exploration is None else self.exploration.main_share)

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
    """What the releases and first-party data tell: the pooled retention curve, every declared slice's
    daily true totals (count first), the first-party values, the days learnt from, each slice's value
    level and own retention."""

    curve: RetentionCurve
    slice_totals: Mapping[tuple[Any, ...], np.ndarray]
    values: np.ndarray
    days: int
    value_scales: Mapping[tuple[Any, ...], np.ndarray] | None = None
    """Per slice, its values' scale per value query relative to the first-party values (from the
    releases' clipped means: ``optimize.heterogeneity``); None: every slice draws the pooled values."""
    scale_variances: Mapping[tuple[Any, ...], np.ndarray] | None = None
    """Per slice, the posterior variance of its log value scales."""
    value_shape: np.ndarray | None = None
    """(n, queries) the first-party values with the slices' spread of levels taken out
    (``heterogeneity.within_slice_values``): the yardstick of the scaled values' tail
    (``heterogeneity.shape_doubt``); None: not measured."""
    slices: SlicePosterior | None = None
    """Each slice's posterior over its conversions per impression (``optimize.slice_retention``), rows
    in ``slice_keys`` order; None: every slice has the pooled curve, with no uncertainty."""
    slice_keys: tuple[tuple[Any, ...], ...] = ()
    schedule: tuple[int, ...] = ()
    """The main count limits of the releases learnt from (older and window, time order, one a day): what
    each release and tomorrow's keep depends on them (``optimize.transient``)."""
    excess: float = 0.0
    """The relative variance of every slice's ratio that the model's own uncertainty misses, measured
    out of sample on the window's releases (``ratio_excess`` + ``share_excess``): added to the ratio
    variance the intervals carry."""
    delay_days: float | None = None
    start_offset: int | None = None
    """Days from the measurement's start to the first release of ``schedule`` (None: no start declared):
    the days before the start cost nothing."""
    """The conversions' delay law the transients are sized by (``transient.DELAY_LAWS``, ``delay_law``)."""

    def _row(self, key: tuple[Any, ...]) -> int | None:
        if self.slices is None:
            return None
        rows = {k: i for i, k in enumerate(self.slice_keys)}
        return rows.get(key)

    def slice_curve(self, key: tuple[Any, ...]) -> RetentionCurve:
        """A slice's retention curve: the posterior mixture of its own, else the pooled curve."""
        row = self._row(key)
        return self.curve if row is None or self.slices is None else self.slices.slice_curve(row)

    def slice_ratios(self, kept_ranks: int) -> np.ndarray:
        """r_k(K) of every slice of ``slice_totals`` (its order): its posterior mean."""
        pooled = max(float(self.curve.ratio(kept_ranks)[0]), MIN_RATIO)
        if self.slices is None:
            return np.full(len(self.slice_totals), pooled)
        mean = self.slices.mean_ratio(kept_ranks)
        rows = {k: i for i, k in enumerate(self.slice_keys)}
        return np.array([max(float(mean[rows[k]]), MIN_RATIO) if k in rows else pooled for k in self.slice_totals])

    def ratios_of(self, keys: Sequence[tuple[Any, ...]], kept_ranks: int) -> np.ndarray:
        """r_k(K) of every slice of ``keys`` (a slice the model does not hold: the pool's)."""
        ratios = dict(zip(self.slice_totals, self.slice_ratios(kept_ranks), strict=True))
        pooled = self.pooled_ratio(kept_ranks) if any(k not in ratios for k in keys) else 0.0
        return np.array([ratios.get(k, pooled) for k in keys], dtype=np.float64)

    def ratio_variances(self, keys: Sequence[tuple[Any, ...]], kept_ranks: int) -> np.ndarray:
        """The posterior variance of r_k(K) of every slice of ``keys`` (0 for a slice the model does
        not hold: it has the pooled curve)."""
        if self.slices is None:
            return np.zeros(len(keys))
        var = self.slices.ratio_variance(kept_ranks)
        rows = {k: i for i, k in enumerate(self.slice_keys)}
        return np.array([float(var[rows[k]]) if k in rows else 0.0 for k in keys])

    def kept_table(self, release: int | None = None, count_limit: int | None = None,
                   ahead: Sequence[int] = ()) -> np.ndarray:
        """(MAX_SIZE,) what a release keeps of an impression of each size given the count limits before
        it: the ``release``-th of ``schedule`` (negative: from the end), or (None) tomorrow's at
        ``count_limit`` after the whole schedule, or the last of the releases at count limits ``ahead``
        (tomorrow's first) after it."""
        past = list(self.schedule) if release is None else list(self.schedule[: len(self.schedule) + release + 1]
                                                              if release < 0 else self.schedule[: release + 1])
        if count_limit is not None:
            past.append(int(count_limit))
        past.extend(int(c) for c in ahead)
        return release_table(past, len(past) - 1, MAX_SIZE, self.delay_days, start_offset=self.start_offset)

    def kept_shares(self, keys: Sequence[tuple[Any, ...]], table: np.ndarray) -> np.ndarray:
        """Every slice's expected kept share of its conversions under a schedule's ``kept_table`` (its
        posterior mean; a slice the model does not hold, or no slices: the pooled curve's)."""
        pooled = max(float(padded_weights(self.curve, len(table)) @ table), MIN_RATIO)
        if self.slices is None:
            return np.full(len(keys), pooled)
        mean = self.slices.weights @ (self.slices.grid_weights @ table[: self.slices.grid_weights.shape[1]])
        rows = {k: i for i, k in enumerate(self.slice_keys)}
        return np.array([max(float(mean[rows[k]]), MIN_RATIO) if k in rows else pooled for k in keys])

    def pooled_share(self, table: np.ndarray) -> float:
        """The pool's kept share under ``table``: the slices' weighted by their conversions."""
        keys = list(self.slice_totals)
        weights = np.array([float(t[0]) for t in self.slice_totals.values()])
        shares = self.kept_shares(keys, table)
        return max(float(weights @ shares / weights.sum()) if weights.sum() > 0 else float(shares.mean()), MIN_RATIO)

    def pooled_ratio(self, kept_ranks: int) -> float:
        """r(K) of the pool as the model holds it: the slices' ratios weighted by their conversions
        (so that the slices' ratios average to the releases' pooled one)."""
        weights = np.array([float(t[0]) for t in self.slice_totals.values()])
        ratios = self.slice_ratios(kept_ranks)
        return max(float(weights @ ratios / weights.sum()) if weights.sum() > 0 else float(ratios.mean()), MIN_RATIO)


def same_count(records: Sequence[ReleaseRecord], count_limit: int, exploration: Exploration | None
               ) -> list[ReleaseRecord]:
    """The latest ``SAME_COUNT_RELEASES`` main releases of ``records`` (time order) at ``count_limit``'s
    kept ranks and with ``exploration``'s arms: their pooled kept share is the count's ratio there."""
    kept = kept_per_impression(count_limit)
    same = [r for r in records if kept_per_impression(r.count_limit) == kept and r.exploration == exploration]
    return same[-SAME_COUNT_RELEASES:]


def ratio_excess(history: Sequence[ReleaseRecord], targets: int) -> float:
    """The relative variance of the count's pooled ratio the releases show beyond their noise, out of
    sample: each of the last ``targets`` releases of ``history`` (time order) against the ratio the
    tuner publishes from the releases before it (``same_count``: the pooled kept share over the
    first-party conversions, exact), mean of (realised / published - 1)^2 minus its noise's share,
    cut at 0. After a count-limit move a release keeps another share than the settled releases at its
    count limit did (Alg. 1 charges over the impression's life, ``mechanism.lifetime``): this is the
    size of that error, which every slice's ratio carries."""
    excess, cells = 0.0, 0
    for i in range(max(0, len(history) - targets), len(history)):
        r = history[i]
        before = same_count(history[:i], r.count_limit, r.exploration)
        fp = float(r.first_party.totals[0])
        fp_before = sum(float(q.first_party.totals[0]) for q in before)
        if not before or fp < 1 or fp_before < 1:
            continue
        published = float(np.clip(sum(float(q.main[:, 0].sum()) for q in before) / fp_before, MIN_RATIO, 1.0))
        realised = float(r.main[:, 0].sum()) / fp
        noise = (float(r.main_variance[:, 0].sum()) / fp**2
                 + sum(float(q.main_variance[:, 0].sum()) for q in before) / fp_before**2) / published**2
        excess += (realised / published - 1.0) ** 2 - noise
        cells += 1
    return max(excess / cells, 0.0) if cells else 0.0


def share_excess(records: Sequence[ReleaseRecord], model: PrivateModel, keys: Sequence[tuple[Any, ...]]) -> float:
    """The relative variance of the slices' kept counts beyond what the model allows, out of sample:
    release d's kept count of slice k predicted as w_k y_d rho_kd (y_d the release's kept count over all
    slices, rho_kd = r_k(K_d) / R(K_d) the slice's retention relative to the pool's, w_k from the other
    releases only: leave one out), its variance the release's noise, the day's sampling (a day's count
    sums the impressions' conversions of that day: ``day_dispersion``), the posterior variance of the
    slice's retention and of w_k; the excess s^2 (per release and slice, relative) solves
    mean (resid^2 / (variance + s^2 pred^2 (1 + h))) = 1 over every (release, slice), h the squared
    weights of w_k's leave-one-out sum (its share of the other releases' excess); 0 when the scatter
    is within the model's. Slices that differ from
    what the model holds of them (their retention, a contrast it extrapolates) show here."""
    data = slice_days(records, keys)
    if len(records) < 2 or model.slices is None:
        return 0.0
    ranks = np.asarray(data.kept_ranks)
    if model.schedule:  # each release's own kept shares, after the count limits before it
        tables = [model.kept_table(release=d - len(records)) for d in range(len(records))]
        rho = np.stack([model.kept_shares(keys, t) / model.pooled_share(t) for t in tables])  # (days, slices)
    else:
        rho = np.stack([model.ratios_of(keys, int(k)) / model.pooled_ratio(int(k)) for k in ranks])
    rel = np.stack([model.ratio_variances(keys, int(k)) / np.maximum(model.ratios_of(keys, int(k)), MIN_RATIO) ** 2
                    for k in ranks])
    rows = {k: i for i, k in enumerate(model.slice_keys)}
    at = np.array([rows.get(k, -1) for k in keys])
    dispersion = np.ones_like(rho)
    known = at >= 0
    dispersion[:, known] = day_dispersion(model.slices.dispersion(ranks))[at[known]].T
    u = np.asarray(data.kept, dtype=np.float64)
    y = u.sum(axis=1)
    x = u / np.maximum(rho, MIN_RATIO)
    w = (x.sum(axis=0)[None, :] - x) / np.maximum(y.sum() - y, 1e-300)[:, None]  # leave-one-out shares
    pred = w * rho * y[:, None]
    sampling = data.noise + dispersion * np.maximum(pred, 0.0)
    # w_k's variance from the other releases' sampling (0 where no other release kept any: w_k = 0)
    others = x.sum(axis=0)[None, :] - x
    scaled = sampling / np.maximum(rho, MIN_RATIO) ** 2
    held = (w > 0) & (others > 0)
    loo = np.divide(scaled.sum(axis=0)[None, :] - scaled, others**2, out=np.zeros_like(x), where=held)
    base = sampling + (rel + loo) * pred**2
    # the excess of the other releases enters w_k too: by the squared weights of its leave-one-out sum
    spread = 1.0 + np.divide((x**2).sum(axis=0)[None, :] - x**2, others**2, out=np.zeros_like(x), where=held)
    ok = (pred > 0) & (base > 0)
    if ok.sum() < MIN_EXCESS_CELLS:
        return 0.0
    resid2, base, scale = (u - pred)[ok] ** 2, base[ok], (spread * pred**2)[ok]

    def scatter(s2: float) -> float:
        return float(np.mean(resid2 / (base + s2 * scale)))

    if scatter(0.0) <= 1.0:
        return 0.0
    lo, hi = 0.0, 1.0
    while scatter(hi) > 1.0 and hi < 1e6:
        hi *= 4.0
    for _ in range(60):  # bisection: the scatter falls as s^2 grows
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if scatter(mid) > 1.0 else (lo, mid)
    return hi


def day_dispersion(impression_dispersion: np.ndarray, spread_days: int = SPREAD_DAYS) -> np.ndarray:
    """A day's count's variance over its mean from its impressions' (``SlicePosterior.dispersion``):
    an impression's conversions fall uniformly over the ``spread_days`` of the attribution window, so a
    day holds m of its conversions with probability 1 / spread_days each (binomial thinning of a
    compound Poisson: 1 - p + p E[m^2] / E[m])."""
    p = 1.0 / spread_days
    return np.asarray(1.0 - p + p * np.asarray(impression_dispersion, dtype=np.float64), dtype=np.float64)


def settled_at(records: Sequence[ReleaseRecord], i: int) -> bool:
    """Whether the ``SETTLE_RELEASES`` releases before the ``i``-th of ``records`` (time order) all had its
    count limit (and none of them is the measurement's start): its kept share is then its count limit's
    steady r(K)."""
    if not _past_start(records[i]):
        return False
    return all(q.count_limit == records[i].count_limit for q in records[max(0, i - SETTLE_RELEASES):i])


def start_offset(records: Sequence[ReleaseRecord]) -> int | None:
    """Days from the measurement's declared start to the first of ``records`` (time order); None: none
    declared."""
    return records[0].days_since_start if records else None


def _past_start(record: ReleaseRecord) -> bool:
    """Whether ``record`` is at least ``SETTLE_RELEASES`` days after the measurement's start (or none was
    declared): the conversions before the start, which cost nothing, have left its attribution window."""
    return record.days_since_start is None or record.days_since_start >= SETTLE_RELEASES


def arm_settled(records: Sequence[ReleaseRecord], i: int) -> bool:
    """Whether the arms of the ``i``-th of ``records`` keep r(K) of their count limit: always, unless the
    measurement started fewer than ``SETTLE_RELEASES`` days before it (its conversions before the start
    were free)."""
    return _past_start(records[i])


def retention_points(records: Sequence[ReleaseRecord]) -> list[tuple[int, float, float]]:
    """(kept ranks K, ratio r(K), variance) from every arm and every settled main release, pooled per
    K: an arm's kept-count estimate over its share of the day's first-party conversions; a main
    release's summed over slices over the main share (variances: the noise and a binomial-like
    sampling term of the share). An arm's impressions are capped at one count limit all their life, a
    main release's conversions were charged at the count limits of the releases before it (Alg. 1
    over the impression's life): its share is r(K) only when the ``SETTLE_RELEASES`` releases before it
    had its count limit too (``records`` in time order)."""
    raw: dict[int, list[tuple[float, float]]] = {}
    for i, r in enumerate(records):
        total = float(r.first_party.totals[0])
        exploration = r.exploration
        if exploration is not None and arm_settled(records, i):
            for arm, est, var in zip(exploration.arms, r.arms[:, 0], r.arms_variance[:, 0], strict=True):
                n = arm.share * total
                if n >= 1:
                    point = (float(est) / n, float(var) / n**2 + 1 / n)
                    raw.setdefault(kept_per_impression(arm.count_limit), []).append(point)
        n = r.main_conversions
        if n >= 1 and settled_at(records, i):
            raw.setdefault(kept_per_impression(r.count_limit), []).append(
                (float(r.main[:, 0].sum()) / n, float(r.main_variance[:, 0].sum()) / n**2 + 0.1 / n))
    points = []
    for k, values in sorted(raw.items()):
        w = np.array([1.0 / max(v, 1e-12) for _, v in values])
        points.append((k, float(np.sum(w * np.array([x for x, _ in values])) / w.sum()), float(1.0 / w.sum())))
    return points


TRANSIENT_DOUBT = 0.1
"""The share of a transient's departure from the settled kept share (``transient_points``) taken as the
sd of its modelling error: the transient's size follows the delay law the model chose among
``transient.DELAY_LAWS`` (``delay_law``), which a log's delays follow only approximately."""


TRANSIENT_FLOOR_SD = 0.01
"""The least sd of a transient point's modelling error (a kept share): a release a little off its settled
share is no exact point either, and exact points at the count limit the schedule keeps pin the pool's
curve there and leave the sizes above it no mass (r(2K) = 1 where a few percent of the conversions are
in larger impressions), which the slices' curves, anchored to the pool, then cannot have either."""


def transient_points(records: Sequence[ReleaseRecord], settled: RetentionCurve | None, delay_days: float | None = None
                     ) -> tuple[list[tuple[int, float, float]], list[np.ndarray], list[float]]:
    """(points, kept rows, doubts) of every main release that ``retention_points`` leaves out (the count
    limits before it were not all its own): its kept share over the main share, read at what the count
    limits of the ``SPREAD_DAYS`` before it keep of an impression of each size under the delay law
    ``delay_days`` (``optimize.transient``), its variance the noise, the sampling term and the doubt
    (``TRANSIENT_DOUBT`` times how far the ``settled`` curve says the transient moves it, with
    ``TRANSIENT_FLOOR_SD`` in quadrature; also returned alone). These are the only precise points at the
    count limits a schedule moves to: without them the pool's curve there rests on the arms."""
    points: list[tuple[int, float, float]] = []
    rows: list[np.ndarray] = []
    doubts: list[float] = []
    limits = [int(r.count_limit) for r in records]
    offset = start_offset(records)
    sizes = np.arange(1, MAX_SIZE + 1, dtype=np.float64)
    weights = None if settled is None else padded_weights(settled)

    def add(count_limit: int, row: np.ndarray, share: float, noise: float) -> None:
        k = kept_per_impression(count_limit)
        # no settled curve yet (every release in the start's transient): the floor alone
        departure = 0.0 if weights is None else float(weights @ (np.minimum(sizes, float(k)) - row))
        doubt = (TRANSIENT_DOUBT * departure) ** 2 + TRANSIENT_FLOOR_SD**2
        points.append((k, share, noise + doubt))
        rows.append(row)
        doubts.append(doubt)

    for i, r in enumerate(records):
        total = float(r.first_party.totals[0])
        if r.exploration is not None and not arm_settled(records, i):
            for arm, est, var in zip(r.exploration.arms, r.arms[:, 0], r.arms_variance[:, 0], strict=True):
                n_arm = arm.share * total
                if n_arm >= 1:  # an arm's impressions at its count limit since the start
                    # the arm's impressions at its count limit since the start (the same plan before the records)
                    row = release_table([arm.count_limit] * (i + 1), i, MAX_SIZE, delay_days, start_offset=offset)
                    add(arm.count_limit, row, float(est) / n_arm, float(var) / n_arm**2 + 1 / n_arm)
        n = r.main_conversions
        if n < 1 or settled_at(records, i):
            continue
        add(r.count_limit, release_table(limits, i, MAX_SIZE, delay_days, start_offset=offset),
            float(r.main[:, 0].sum()) / n, float(r.main_variance[:, 0].sum()) / n**2 + 0.1 / n)
    return points, rows, doubts


def padded_weights(curve: RetentionCurve, size: int = MAX_SIZE) -> np.ndarray:
    """The curve's mixture weights over impression sizes 1..``size`` (0 beyond its own)."""
    w = np.zeros(size)
    given = np.asarray(curve.weights, dtype=np.float64)[:size]
    w[: len(given)] = given
    return w


def _settled_fit(history: Sequence[ReleaseRecord]) -> RetentionCurve | None:
    """The curve of the settled points (``retention_points``); None when there are none (every release in
    the measurement start's transient)."""
    points = retention_points(history)
    return fit_retention_curve(points) if points or start_offset(history) is None else None


def pooled_fit(history: Sequence[ReleaseRecord], delay_days: float | None, settled: RetentionCurve | None = None
               ) -> tuple[RetentionCurve, float]:
    """The pooled retention curve: fitted to the arms and settled main releases (``retention_points``:
    ``settled``, fitted here when not given), then again with the main releases in transients read at
    their own kept rows (``transient_points``, sized by the delay law ``delay_days``); and the sum of the
    transient points' squared standardized residuals under it (their variance without the doubt: how well
    the delay law sizes the transients; 0 with none)."""
    settled = _settled_fit(history) if settled is None else settled
    if settled is None:  # every release in the start's transient: fitted to them first, their doubts from that fit
        first, first_rows, _ = transient_points(history, None, delay_days)
        settled = fit_retention_curve(first, rows=first_rows)
        points: list[tuple[int, float, float]] = []
    else:
        points = list(settled.points)
    more, rows, doubts = transient_points(history, settled, delay_days)
    if not more:
        return settled, 0.0
    curve = fit_retention_curve([*points, *more], rows=[*([None] * len(points)), *rows])
    w = padded_weights(curve)
    misfit = sum((r - float(w @ row)) ** 2 / max(v - d, 1e-12)
                 for (_, r, v), row, d in zip(more, rows, doubts, strict=True))
    return curve, float(misfit)


DELAY_EVIDENCE = 9.0
"""How much lower (a chi-square: three standard deviations) the transients' misfit under another delay
law must be than under the uniform one for that law to be used: a few releases in a transient fit
any law about as well, and the uniform law (ARA's window) is the default."""


def delay_law(history: Sequence[ReleaseRecord]) -> tuple[float | None, RetentionCurve]:
    """The delay law of ``transient.DELAY_LAWS`` under which the pooled curve fits the main releases in
    transients best (``pooled_fit``'s misfit: a move shows the delays through how fast the kept share
    settles at the new count limit), and that curve; the uniform law (the first) unless another fits
    better by more than ``DELAY_EVIDENCE`` (with no release in a transient, all fit equally)."""
    settled = _settled_fit(history)  # the same for every law
    fits = [(law, *pooled_fit(history, law, settled)) for law in DELAY_LAWS]
    law, curve, misfit = min(fits, key=lambda x: x[2])  # min keeps the first of equal misfits
    if fits[0][2] - misfit <= DELAY_EVIDENCE:
        return fits[0][0], fits[0][1]
    return law, curve


def domain_keys(domain: KeyDomain) -> list[tuple[Any, ...]]:
    """Every declared slice's key (``slice_key``), in the domain's order."""
    values = domain.slice_values()
    return [slice_key([values[c][i] for c in domain.slice_columns]) for i in range(domain.num_slices)]


def slice_days(records: Sequence[ReleaseRecord], keys: Sequence[tuple[Any, ...]], delay_days: float | None = None
               ) -> SliceDays:
    """The main releases' count estimates per declared slice (``slice_retention.SliceDays``); a slice
    a release does not hold counts 0 with no noise. ``records`` are daily releases in time order: each
    release's kept share is that of the count limits of the ``SPREAD_DAYS`` before it
    (``optimize.transient``)."""
    kept = np.zeros((len(records), len(keys)))
    noise = np.zeros((len(records), len(keys)))
    for d, r in enumerate(records):
        at = {key: i for i, key in enumerate(r.slice_keys)}
        rows = np.array([at.get(key, -1) for key in keys])
        ok = rows >= 0
        kept[d, ok] = r.main[rows[ok], 0]
        noise[d, ok] = r.main_variance[rows[ok], 0]
    ranks = np.array([kept_per_impression(r.count_limit) for r in records], dtype=np.int64)
    limits = [int(r.count_limit) for r in records]
    tables = np.stack([release_table(limits, d, MAX_SIZE, delay_days, start_offset=start_offset(records))
                       for d in range(len(records))], axis=1) if records else None
    conversions = np.array([r.main_conversions for r in records])
    return SliceDays(ranks, np.maximum(kept.sum(axis=1), 1.0), kept, noise, tables, conversions)


def slice_groups(domain: KeyDomain) -> list[np.ndarray]:
    """Per slice column, every declared slice's value code: the groupings the slices' retention may
    share (``slice_retention``)."""
    values = domain.slice_values()
    out = []
    for column in domain.slice_columns:
        codes: dict[Any, int] = {}
        out.append(np.array([codes.setdefault(slice_key([v])[0], len(codes)) for v in values[column]], dtype=np.int64))
    return out


def learn(records: Sequence[ReleaseRecord], domain: KeyDomain, older: Sequence[ReleaseRecord] = (),
          slices: bool = True) -> PrivateModel:
    """The model of the module docstring from ``records`` (all of the same slices and queries); each
    slice's own retention also from ``older`` releases; ``slices`` False: every slice has the pooled
    curve."""
    if not records:
        raise InvalidInput("privacy-safe tuning needs at least one past release")
    history = [*older, *records]
    delay, curve = delay_law(history)
    keys = domain_keys(domain)
    posterior = slice_posterior(slice_days(history, keys, delay), curve, slice_groups(domain)) if slices else None
    model = PrivateModel(curve, {k: np.zeros(domain.num_columns) for k in keys}, np.zeros((0, 0)), len(records),
                         slices=posterior, slice_keys=tuple(keys),
                         schedule=tuple(int(r.count_limit) for r in history), delay_days=delay,
                         start_offset=start_offset(history))
    # every window release's kept share per impression size, given the count limits before it
    tables = [model.kept_table(release=-len(records) + i) for i in range(len(records))]
    # the slices' conversions at their own retention: the weights of the pool the model holds
    rough = np.zeros(len(keys))
    for r, table in zip(records, tables, strict=True):
        at = {key: i for i, key in enumerate(r.slice_keys)}
        rows = np.array([at.get(key, -1) for key in keys])
        counts = np.where(rows >= 0, np.maximum(r.main[rows, 0], 0.0), 0.0)
        rough += counts / np.maximum(model.kept_shares(keys, table), MIN_RATIO)
    model = dataclasses.replace(model, slice_totals={k: np.array([float(v)]) for k, v in zip(keys, rough, strict=True)})
    totals = {k: np.zeros(domain.num_columns) for k in keys}
    for r, table in zip(records, tables, strict=True):
        # the day's conversions (first-party, exact) shared as the slices' kept counts are, each divided by
        # its retention relative to the pool's: the pool's kept share that day (whatever the count limits
        # before it charged) is the release's own
        day_kept = float(np.maximum(r.main[:, 0], 0.0).sum())
        per_kept = float(r.first_party.totals[0]) / day_kept if day_kept > 0 else 0.0
        ratios = dict(zip(keys, model.kept_shares(keys, table) / model.pooled_share(table), strict=True))
        for key, row in zip(r.slice_keys, r.main, strict=True):
            if key in totals:
                totals[key] = totals[key] + row * per_kept / max(ratios[key], MIN_RATIO) / len(records)
    # the noise averages out over the days first: cutting each day's estimate at 0 would inflate
    # every small slice by its noise (and small slices weigh most in RMSRE_tau)
    totals = {k: np.maximum(v, 0.0) for k, v in totals.items()}
    pool = np.concatenate([r.first_party.values for r in records])
    scales = slice_value_scales(records, keys, totals, pool)
    excess = ratio_excess(history, len(records)) + share_excess(records, model, keys)
    return dataclasses.replace(model, slice_totals=totals, values=pool, excess=excess,
                               value_scales=None if scales is None else scales[0],
                               scale_variances=None if scales is None else scales[1],
                               value_shape=None if scales is None else scales[2])


def slice_value_scales(records: Sequence[ReleaseRecord], keys: Sequence[tuple[Any, ...]],
                       totals: Mapping[tuple[Any, ...], np.ndarray], pool: np.ndarray
                       ) -> tuple[dict[tuple[Any, ...], np.ndarray], dict[tuple[Any, ...], np.ndarray],
                                  np.ndarray] | None:
    """Every declared slice's value scale per query from the main releases' clipped means, grouped by
    clip (``heterogeneity.value_scales``), and the first-party values with the spread of those levels
    taken out (``heterogeneity.within_slice_values``); None when no record states its clips."""
    known = [r for r in records if len(r.clips) == pool.shape[1]]
    if not known:
        return None
    scales = np.ones((len(keys), pool.shape[1]))
    variances = np.zeros((len(keys), pool.shape[1]))
    shape = np.array(pool, dtype=np.float64, copy=True)
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
        shape[:, j] = within_slice_values(pool[:, j], np.log(scales[:, j]), weights)
    return ({k: scales[i] for i, k in enumerate(keys)}, {k: variances[i] for i, k in enumerate(keys)}, shape)


def pseudo_history(model: PrivateModel, slice_columns: Sequence[str], value_columns: Sequence[str], seed: int,
                   spread_days: int = SPREAD_DAYS) -> Conversions:
    """A conversion log drawn from the model: per slice Poisson impressions started over the model's
    days and the ``spread_days`` before them, sizes from the retention curve, conversions uniform over
    ``spread_days`` after the impression, values from the first-party conversions, cut at the end of
    the model's days. ``in_period`` marks the model's days (earlier conversions only give lifetime
    ranks)."""
    rng = np.random.default_rng(seed)
    days = model.days
    ids: list[np.ndarray] = []
    times: list[np.ndarray] = []
    slices: dict[str, list[np.ndarray]] = {c: [] for c in slice_columns}
    row_scales: list[np.ndarray] = []
    next_id = 0
    for key, total in model.slice_totals.items():
        curve = model.slice_curve(key)
        sizes = curve.size_distribution()
        impressions = int(rng.poisson(float(total[0]) * (days + spread_days) / curve.mean_size()))
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


def inputs_seed(records: Sequence[ReleaseRecord]) -> int:
    """A seed for the pseudo-history from the inputs' digest: the same inputs, the same parameters."""
    digest = hashlib.sha256()
    for r in records:
        for a in (r.main, r.arms, r.first_party.totals):
            digest.update(np.ascontiguousarray(a, dtype=np.float64).tobytes())
    return int.from_bytes(digest.digest()[:8], "big")
