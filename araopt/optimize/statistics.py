"""Mergeable, bounded-size sufficient statistics for the optimizer (Alg. 5), as a pure combiner.

The optimizer needs, for every count limit C <= C_max, clip threshold C_l and slice j, the terms of
the bias decomposition eq. (bias-simplified), V_D(q_l)_j - E U_lj = B_lj(C) + A_lj(C_l, C):
B_lj(C) (value of the conversions Alg. 1 drops) and A_lj(C_l, C) = sum over kept conversions of
max(0, v - C_l), plus the count of kept conversions and, for the exact objective, the randomized
rounding variance. Under the L-inf and L1 encodings every contribution has L1 norm floor(Gamma/C),
so Alg. 1 keeps exactly the conversions of rank < K(C) = min(Gamma // floor(Gamma/C), 20) within
their impression (rank = position in (conversion_time, record_keys()) order; 20: Chrome's limit of
aggregatable reports per source). Hence everything follows from per-(slice, rank) statistics with
rank < R = max_{C <= C_max} K(C) (= min(C_max, 20) for C_max <= 255).

What is kept (the combiner's state; ``compact`` consolidates it)
  * ``rank_table``: exact count and exact sum of every query per (slice, rank class), rank classes
    0..R-1 and one class ">= R". Slice totals V_D(q_l)_j (the truth) and B_lj(C) are exact.
  * ``hist``: per (slice, rank < R, query, log bucket) the count, sum and sum of squares of the
    values in the bucket. Buckets are fixed (``BucketLayout``): [0, v_lo), then
    ``buckets_per_octave`` (64) geometric buckets per octave up to v_hi, then [v_hi, inf).
    A_lj(c) is exact when c is a bucket edge (it is sum - c count over the buckets above c) and is
    linearly interpolated inside a bucket (error <= count_in_bucket x bucket_width / 4; relative
    bucket width 2^(1/64) - 1 = 1.1 % by default; the objective error is ~1e-5, see tests).
  * ``global_hist``: per (query, bucket) count and sum over all conversions (any rank): medians
    (tau = 5 x median, Sec. 5.1) and quantiles (baselines) with relative error <= bucket width.
  * ``impression_sizes``: exact histogram of conversions per impression, 1..H (H =
    ``max_impression_size``) and one overflow bin: the baselines' count-limit quantile.
  * ``samples`` (only when ``sample_size`` > 0): per (slice, rank < R) a bottom-k sample of value
    vectors by record hash priority (mergeable, deterministic; the whole cell when it has <= k
    conversions). Used for the L1 encoding (Alg. 6) with d >= 2, whose clipping is not separable
    per query: estimates are exact for cells with <= k conversions, unbiased (Horvitz-Thompson with
    the exact cell count) otherwise.
  * ``cluster_sizes``: histogram of the measured period's clusters, one per (impression, release
    period cell of ``period_days`` UTC days; the whole window when None), by (conversions in the
    cluster, lifetime rank of its first conversion): Alg. 1 keeps clip(K(C) - first rank, 0, size) of
    them, exactly. The calibration's ratio sampling factor kappa (``araopt.calibration.model``) needs it.
  * ``day_counts``: conversions per UTC day, and the first and last conversion time: how many days
    of history the statistics hold (``history_days``), so that a release of another length can be
    modelled (``scaled``).
  * exact per-query maximum, number of conversions and impressions.

Lookback rows (``Conversions.in_period`` False: earlier conversions of the same impressions, read
only so that ranks are lifetime ranks, as the browser's budget is per source lifetime) are ranked
with the rest and then left out of every statistic.

Size bound (does not grow with the number of conversions n): with m slices, d queries,
B = layout.num_buckets (3,842 by default), R ranks, k samples, H impression sizes:
  rank_table  m (R+1) (d+1)          hist        <= m R d B x 4 numbers (key, count, sum, sumsq)
  global_hist <= d B x 3             samples     <= m R k (d + 1)        impression_sizes H+2.
The sparse ``hist`` also never holds more than d x (conversions with rank < R) entries.

Exact-objective rounding variance: sum over kept records of f(1-f), f = frac(s min(v, c)/c). A
clipped value (v >= c) has f = 0. For a bucket below c we model omega = s v / c as Gaussian with the
bucket's mean and standard deviation and take E f(1-f) (exact for a single distinct value,
``frac_variance``); it is 1/6 within 4.4e-3 relative once the spread exceeds half a unit. The error
per conversion is at most 1/4, i.e. at most (kept count / 4) / (kept count / 4 + Var DLap) of the
value query's variance; in practice it is far smaller (see tests).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from araopt.constants import CONTRIBUTION_BUDGET, MAX_REPORTS_PER_SOURCE
from araopt.errors import InvalidInput, InvalidParameters
from araopt.io.conversions import Conversions
from araopt.mechanism.bounding import impression_order, kept_per_impression, ranks_within_impression
from araopt.mechanism.encoding import check_values
from araopt.mechanism.keys import register_slices, slice_sort_key

_COMPACT_ROWS = 1_000_000
DEFAULT_MAX_COUNT_LIMIT = MAX_REPORTS_PER_SOURCE
"""Chrome creates at most 20 aggregatable reports per source."""


@dataclass(frozen=True)
class BucketLayout:
    """Fixed log buckets: [0, min_value), geometric buckets between min_value and max_value, [max_value, inf)."""

    min_value: float = 2.0**-20
    max_value: float = 2.0**40
    buckets_per_octave: int = 64

    def __post_init__(self) -> None:
        if not (0 < self.min_value < self.max_value and math.isfinite(self.max_value)):
            raise InvalidParameters(f"bucket layout needs 0 < min_value < max_value < inf, got {self.min_value}, "
                                    f"{self.max_value}")
        octaves = math.log2(self.max_value / self.min_value)
        if abs(octaves - round(octaves)) > 1e-9:
            raise InvalidParameters("max_value / min_value must be a power of two")
        if int(self.buckets_per_octave) < 1:
            raise InvalidParameters("buckets_per_octave must be >= 1")

    @property
    def num_log_buckets(self) -> int:
        return int(round(math.log2(self.max_value / self.min_value))) * int(self.buckets_per_octave)

    @property
    def num_buckets(self) -> int:
        return self.num_log_buckets + 2

    def lower_edges(self) -> np.ndarray:
        k = np.arange(self.num_log_buckets + 1, dtype=np.float64)
        return np.concatenate([[0.0], self.min_value * np.exp2(k / self.buckets_per_octave)])

    def upper_edges(self) -> np.ndarray:
        return np.concatenate([self.lower_edges()[1:], [np.inf]])

    def index(self, values: np.ndarray) -> np.ndarray:
        """Bucket of every value (non-negative floats), exact with respect to ``lower_edges``."""
        v = np.asarray(values, dtype=np.float64)
        top = self.num_buckets - 1
        with np.errstate(divide="ignore"):
            raw = np.floor(np.log2(np.maximum(v, self.min_value) / self.min_value) * self.buckets_per_octave)
        idx = np.clip(raw.astype(np.int64) + 1, 1, top)
        idx[v < self.min_value] = 0
        idx[v >= self.max_value] = top
        lower, upper = self.lower_edges(), self.upper_edges()
        idx -= (v < lower[idx]) & (idx > 0)
        idx += (v >= upper[idx]) & (idx < top)
        return cast(np.ndarray, idx)


@dataclass(frozen=True)
class StatisticsSpec:
    """What to collect: slice and value columns, C_max, bucket layout, L1 sample size, H."""

    slice_columns: tuple[str, ...]
    value_columns: tuple[str, ...]
    max_count_limit: int = DEFAULT_MAX_COUNT_LIMIT
    layout: BucketLayout = field(default_factory=BucketLayout)
    sample_size: int | None = None
    max_impression_size: int = 1024
    contribution_budget: int = CONTRIBUTION_BUDGET
    period_days: int | None = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "slice_columns", tuple(self.slice_columns))
        object.__setattr__(self, "value_columns", tuple(self.value_columns))
        if not self.value_columns:
            raise InvalidParameters("at least one value column is required")
        if len(set(self.slice_columns) | set(self.value_columns)) != len(self.slice_columns) + len(self.value_columns):
            raise InvalidParameters(f"slice and value columns must be distinct, got {self.slice_columns}, "
                                    f"{self.value_columns}")
        if isinstance(self.max_count_limit, bool) or not isinstance(self.max_count_limit, int) or self.max_count_limit < 1:
            raise InvalidParameters(f"max count limit C_max must be an integer >= 1, got {self.max_count_limit!r}")
        if self.max_count_limit > self.contribution_budget:
            raise InvalidParameters(f"max count limit must be <= {self.contribution_budget}")
        sample_size = self.sample_size
        if sample_size is None:  # samples are only needed for L1 with d >= 2
            sample_size = 128 if len(self.value_columns) >= 2 else 0
            object.__setattr__(self, "sample_size", sample_size)
        if int(sample_size) < 0 or int(self.max_impression_size) < 1:
            raise InvalidParameters("sample_size must be >= 0 and max_impression_size >= 1")
        if self.period_days is not None and (isinstance(self.period_days, bool) or int(self.period_days) < 1):
            raise InvalidParameters(f"period_days must be None or an integer >= 1, got {self.period_days!r}")

    @property
    def num_queries(self) -> int:
        return len(self.value_columns)

    @property
    def max_rank(self) -> int:
        """R = max over C <= C_max of K(C): ranks whose records some candidate C keeps."""
        return max(kept_per_impression(c, self.contribution_budget) for c in range(1, self.max_count_limit + 1))


# ------------------------------------------------------------------------------------------------
# The accumulator (mutable, picklable: only dicts, lists and numpy arrays)
# ------------------------------------------------------------------------------------------------

@dataclass
class StatisticsAccumulator:
    """Combiner state. Arrays are keyed by local slice ids (``slice_ids``); pending parts are lists."""

    spec: StatisticsSpec
    slice_ids: dict[tuple[Any, ...], int] = field(default_factory=dict)
    rank_keys: list[np.ndarray] = field(default_factory=list)     # slice * (R+1) + rank class
    rank_vals: list[np.ndarray] = field(default_factory=list)     # (k, 1 + d): count, sums
    hist_keys: list[np.ndarray] = field(default_factory=list)     # ((slice R + rank) d + q) B + bucket
    hist_vals: list[np.ndarray] = field(default_factory=list)     # (k, 3): count, sum, sumsq
    global_keys: list[np.ndarray] = field(default_factory=list)   # q B + bucket
    global_vals: list[np.ndarray] = field(default_factory=list)   # (k, 2): count, sum
    sample_cells: list[np.ndarray] = field(default_factory=list)  # slice * R + rank
    sample_prio: list[np.ndarray] = field(default_factory=list)   # uint64 record hash
    sample_vals: list[np.ndarray] = field(default_factory=list)   # (k, d)
    impression_sizes: np.ndarray | None = None
    cluster_keys: list[np.ndarray] = field(default_factory=list)  # size * (R+1) + min(first rank, R)
    cluster_vals: list[np.ndarray] = field(default_factory=list)  # (k, 1): clusters
    day_keys: list[np.ndarray] = field(default_factory=list)      # UTC day index
    day_vals: list[np.ndarray] = field(default_factory=list)      # (k, 1): conversions
    value_max: np.ndarray | None = None
    num_conversions: int = 0
    num_impressions: int = 0
    time_min: int | None = None
    time_max: int | None = None
    pending_rows: int = 0


def create_accumulator(spec: StatisticsSpec) -> StatisticsAccumulator:
    acc = StatisticsAccumulator(spec=spec)
    acc.impression_sizes = np.zeros(spec.max_impression_size + 2, dtype=np.int64)
    acc.value_max = np.zeros(spec.num_queries)
    return acc


def _reduce(keys: np.ndarray, vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sum ``vals`` rows with equal ``keys``; keys come out sorted and unique."""
    if len(keys) == 0:
        return keys.astype(np.int64), vals.reshape(0, vals.shape[1] if vals.ndim == 2 else 1)
    uniq, inv = np.unique(keys, return_inverse=True)
    inv = inv.reshape(-1)
    out = np.empty((len(uniq), vals.shape[1]))
    for col in range(vals.shape[1]):
        out[:, col] = np.bincount(inv, weights=vals[:, col], minlength=len(uniq))
    return uniq, out


def _bottom_k(cells: np.ndarray, prio: np.ndarray, vals: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per cell, the k rows of smallest priority (a uniform sample, since priorities are record hashes)."""
    if len(cells) == 0:
        return cells, prio, vals
    order = np.lexsort((prio, cells))
    cells, prio, vals = cells[order], prio[order], vals[order]
    starts = np.r_[True, cells[1:] != cells[:-1]]
    first = np.maximum.accumulate(np.where(starts, np.arange(len(cells)), 0))
    keep = (np.arange(len(cells)) - first) < k
    return cells[keep], prio[keep], vals[keep]


_US_PER_DAY = 86_400_000_000


def _period_clusters(spec: StatisticsSpec, group: np.ndarray, rank: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Keys size * (R+1) + min(first rank, R) of the period's clusters (rows sorted by impression, time)."""
    R, H = spec.max_rank, spec.max_impression_size
    if spec.period_days is None:
        cell = group
    else:
        period = np.floor_divide(times, _US_PER_DAY * int(spec.period_days))
        starts = np.r_[True, (group[1:] != group[:-1]) | (period[1:] != period[:-1])]
        cell = np.cumsum(starts) - 1
    first = np.r_[True, cell[1:] != cell[:-1]]
    sizes = np.bincount(cell)
    sizes = sizes[sizes > 0]
    first_rank = rank[first]
    return cast(np.ndarray, np.minimum(sizes, H + 1) * (R + 1) + np.minimum(first_rank, R))


def add_conversions(acc: StatisticsAccumulator, conversions: Conversions) -> StatisticsAccumulator:
    """Add a batch that holds ALL conversions of each of its impressions; returns ``acc``.

    Ranks are computed within impression by (conversion_time, record_keys()) with Alg. 1's order
    (``araopt.mechanism.bounding``), exactly as the mechanism does, over the period's rows and their lookback;
    only the period's rows are then counted.
    """
    spec = acc.spec
    missing = [c for c in spec.slice_columns if c not in conversions.slices]
    if missing:
        raise InvalidInput(f"conversions lack slice column(s) {missing}")
    if tuple(conversions.value_columns) != spec.value_columns:
        raise InvalidInput(f"conversions carry value columns {conversions.value_columns}, spec expects {spec.value_columns}")
    n = len(conversions)
    if n == 0:
        return acc
    vals = check_values(conversions.values, spec.num_queries)
    d, R, B = spec.num_queries, spec.max_rank, spec.layout.num_buckets
    keys = conversions.record_keys()
    ids = conversions.impression_sort_keys()  # integers ordered and grouped as the ids (no string compared)
    order = impression_order(ids, conversions.conversion_time, keys)
    rank_sorted, group = ranks_within_impression(ids[order])
    period_sorted = conversions.period_mask()[order]
    # impressions with a conversion in the period; their sizes count the lookback too (lifetime sizes)
    active = np.bincount(group, weights=period_sorted, minlength=int(group[-1]) + 1 if n else 0) > 0
    sizes = np.bincount(group)[active]
    assert acc.impression_sizes is not None and acc.value_max is not None  # (create_accumulator sets both)
    acc.impression_sizes += np.bincount(np.minimum(sizes, spec.max_impression_size + 1),
                                        minlength=spec.max_impression_size + 2)
    acc.num_impressions += int(len(sizes))
    times_sorted = np.asarray(conversions.conversion_time, dtype=np.int64)[order]
    pg, pr, pt = group[period_sorted], rank_sorted[period_sorted], times_sorted[period_sorted]
    if len(pg):
        clusters = _period_clusters(spec, pg, pr, pt)
        ck, cv = _reduce(clusters, np.ones((len(clusters), 1)))
        acc.cluster_keys.append(ck)
        acc.cluster_vals.append(cv)
        dk, dv = _reduce(np.floor_divide(pt, _US_PER_DAY), np.ones((len(pt), 1)))
        acc.day_keys.append(dk)
        acc.day_vals.append(dv)
        acc.time_min = int(pt.min()) if acc.time_min is None else min(acc.time_min, int(pt.min()))
        acc.time_max = int(pt.max()) if acc.time_max is None else max(acc.time_max, int(pt.max()))
    if conversions.in_period is not None:  # from here on only the period's rows, with their lifetime ranks
        rank = np.empty(n, dtype=np.int64)
        rank[order] = rank_sorted
        inside = conversions.period_mask()
        conversions, vals, keys, rank = conversions.take(np.flatnonzero(inside)), vals[inside], keys[inside], rank[inside]
        n = len(conversions)
        if n == 0:
            return acc
    else:
        rank = np.empty(n, dtype=np.int64)
        rank[order] = rank_sorted
    acc.num_conversions += n
    acc.value_max = np.maximum(acc.value_max, vals.max(axis=0))

    sid = register_slices([conversions.slices[c] for c in spec.slice_columns], acc.slice_ids, n)
    rclass = np.minimum(rank, R)
    k, v = _reduce(sid * (R + 1) + rclass, np.column_stack([np.ones(n), vals]))
    acc.rank_keys.append(k)
    acc.rank_vals.append(v)

    buckets = np.column_stack([spec.layout.index(vals[:, q]) for q in range(d)])
    qidx = np.arange(d, dtype=np.int64)
    gk, gv = _reduce((qidx[None, :] * B + buckets).reshape(-1),
                     np.column_stack([np.ones(n * d), vals.reshape(-1)]))
    acc.global_keys.append(gk)
    acc.global_vals.append(gv)

    low = rank < R
    cell = sid[low] * R + rank[low]
    hk = ((cell[:, None] * d + qidx[None, :]) * B + buckets[low]).reshape(-1)
    lv = vals[low].reshape(-1)
    hk, hv = _reduce(hk, np.column_stack([np.ones(len(lv)), lv, lv * lv]))
    acc.hist_keys.append(hk)
    acc.hist_vals.append(hv)

    if spec.sample_size:
        c, p, sv = _bottom_k(cell, keys[low], vals[low], spec.sample_size)
        acc.sample_cells.append(c)
        acc.sample_prio.append(p)
        acc.sample_vals.append(sv)
    acc.pending_rows += len(hk)
    if acc.pending_rows > _COMPACT_ROWS:
        compact(acc)
    return acc


def _concat(parts: list[np.ndarray], empty_shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(empty_shape, dtype=dtype)


def compact(acc: StatisticsAccumulator) -> StatisticsAccumulator:
    """Consolidate pending parts (sum equal keys, keep bottom-k samples); returns ``acc``."""
    d = acc.spec.num_queries
    if len(acc.rank_keys) > 1:
        k, v = _reduce(np.concatenate(acc.rank_keys), np.concatenate(acc.rank_vals))
        acc.rank_keys, acc.rank_vals = [k], [v]
    if len(acc.hist_keys) > 1:
        k, v = _reduce(np.concatenate(acc.hist_keys), np.concatenate(acc.hist_vals))
        acc.hist_keys, acc.hist_vals = [k], [v]
    if len(acc.global_keys) > 1:
        k, v = _reduce(np.concatenate(acc.global_keys), np.concatenate(acc.global_vals))
        acc.global_keys, acc.global_vals = [k], [v]
    if len(acc.cluster_keys) > 1:
        k, v = _reduce(np.concatenate(acc.cluster_keys), np.concatenate(acc.cluster_vals))
        acc.cluster_keys, acc.cluster_vals = [k], [v]
    if len(acc.day_keys) > 1:
        k, v = _reduce(np.concatenate(acc.day_keys), np.concatenate(acc.day_vals))
        acc.day_keys, acc.day_vals = [k], [v]
    if len(acc.sample_cells) > 1:
        assert acc.spec.sample_size is not None  # (an int after StatisticsSpec.__post_init__)
        c, p, v = _bottom_k(np.concatenate(acc.sample_cells), np.concatenate(acc.sample_prio),
                            np.concatenate(acc.sample_vals).reshape(-1, d), acc.spec.sample_size)
        acc.sample_cells, acc.sample_prio, acc.sample_vals = [c], [p], [v]
    acc.pending_rows = 0
    return acc


def _remap(keys: np.ndarray, per_slice: int, mapping: np.ndarray) -> np.ndarray:
    return cast(np.ndarray, mapping[keys // per_slice] * per_slice + keys % per_slice)


def merge_accumulators(accumulators: Sequence[StatisticsAccumulator]) -> StatisticsAccumulator:
    """Merge accumulators of the same spec (slice ids are remapped); the result is compacted."""
    accs = list(accumulators)
    if not accs:
        raise InvalidInput("merge_accumulators needs at least one accumulator")
    spec = accs[0].spec
    if any(a.spec != spec for a in accs):
        raise InvalidInput("cannot merge statistics of different specs")
    out = create_accumulator(spec)
    d, R, B = spec.num_queries, spec.max_rank, spec.layout.num_buckets
    for a in accs:
        mapping = np.empty(len(a.slice_ids), dtype=np.int64)
        for key, local in a.slice_ids.items():
            mapping[local] = out.slice_ids.setdefault(key, len(out.slice_ids))
        out.rank_keys += [_remap(k, R + 1, mapping) for k in a.rank_keys]
        out.rank_vals += list(a.rank_vals)
        out.hist_keys += [_remap(k, R * d * B, mapping) for k in a.hist_keys]
        out.hist_vals += list(a.hist_vals)
        out.global_keys += list(a.global_keys)
        out.global_vals += list(a.global_vals)
        out.sample_cells += [_remap(c, R, mapping) for c in a.sample_cells]
        out.sample_prio += list(a.sample_prio)
        out.sample_vals += list(a.sample_vals)
        assert out.impression_sizes is not None and out.value_max is not None  # (create_accumulator sets both)
        assert a.impression_sizes is not None and a.value_max is not None
        out.impression_sizes += a.impression_sizes
        out.value_max = np.maximum(out.value_max, a.value_max)
        out.num_conversions += a.num_conversions
        out.num_impressions += a.num_impressions
        out.cluster_keys += list(a.cluster_keys)
        out.cluster_vals += list(a.cluster_vals)
        out.day_keys += list(a.day_keys)
        out.day_vals += list(a.day_vals)
        for attr, pick in (("time_min", min), ("time_max", max)):
            mine, theirs = getattr(out, attr), getattr(a, attr)
            if theirs is not None:
                setattr(out, attr, theirs if mine is None else pick(mine, theirs))
    return compact(out)


# ------------------------------------------------------------------------------------------------
# The output
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class SufficientStatistics:
    """Consolidated statistics; slices sorted by their slice-column values (see module docstring)."""

    spec: StatisticsSpec
    slice_keys: tuple[tuple[Any, ...], ...]
    rank_counts: np.ndarray      # (m, R+1) exact counts per rank class (last: rank >= R)
    rank_sums: np.ndarray        # (m, R+1, d) exact sums per rank class
    hist_slice: np.ndarray       # sparse entries, sorted by (slice, rank, query, bucket)
    hist_rank: np.ndarray
    hist_query: np.ndarray
    hist_bucket: np.ndarray
    hist_count: np.ndarray
    hist_sum: np.ndarray
    hist_sumsq: np.ndarray
    global_count: np.ndarray     # (d, B)
    global_sum: np.ndarray       # (d, B)
    impression_sizes: np.ndarray  # (H+2,) index s: impressions with s conversions; last: > H
    value_max: np.ndarray        # (d,)
    sample_slice: np.ndarray
    sample_rank: np.ndarray
    sample_priority: np.ndarray
    sample_values: np.ndarray    # (k, d)
    num_conversions: int
    num_impressions: int
    cluster_sizes: np.ndarray = field(default_factory=lambda: np.zeros((0, 3)))  # rows (size, first rank, clusters)
    day_index: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # UTC days with conversions
    day_conversions: np.ndarray = field(default_factory=lambda: np.zeros(0))
    time_range: tuple[int, int] | None = None    # first and last conversion time (int64 microseconds)
    volume_scale: float = 1.0                     # 1 for observed statistics; ``scaled`` sets it
    future_period: bool = False                   # a model of a release yet to come (``for_release_period``)
    _cache: dict[Any, Any] = field(default_factory=dict, init=False, repr=False, compare=False)
    """Derived tables the optimizer asks for at every count limit (``_value_moments``' sorted buckets)."""

    # ---- shapes ----------------------------------------------------------------------------------
    @property
    def num_slices(self) -> int:
        return len(self.slice_keys)

    @property
    def num_queries(self) -> int:
        return self.spec.num_queries

    @property
    def max_rank(self) -> int:
        return self.spec.max_rank

    @property
    def value_columns(self) -> tuple[str, ...]:
        return self.spec.value_columns

    @property
    def slice_columns(self) -> tuple[str, ...]:
        return self.spec.slice_columns

    def slice_values(self) -> dict[str, np.ndarray]:
        return {c: np.array([k[i] for k in self.slice_keys]) for i, c in enumerate(self.spec.slice_columns)}

    def size_in_numbers(self) -> int:
        """How many numbers the statistics hold (compare with the bound in the module docstring)."""
        arrays = (self.rank_counts, self.rank_sums, self.hist_slice, self.hist_count, self.hist_sum, self.hist_sumsq,
                  self.impression_sizes, self.value_max, self.sample_priority, self.sample_values)
        return int(sum(a.size for a in arrays)) + int(np.count_nonzero(self.global_count) * 3)

    # ---- the release period ------------------------------------------------------------------------
    def history_days(self) -> int:
        """Days of history the statistics cover: UTC days with at least one conversion (>= 1)."""
        return max(1, int(len(self.day_index)))

    def scaled(self, factor: float) -> SufficientStatistics:
        """The expected statistics of a sample ``factor`` times as large (e.g. one day of a 9-day history:
        1/9): every count and sum of conversions and clusters multiplied by ``factor``; per-conversion
        distributions (quantiles, medians, taus, kept ranks) unchanged. The paper's error model is
        linear in them (bias terms and rounding variance), while the noise of a release does not
        depend on its volume: tuning on the scaled statistics tunes for a release of that volume."""
        f = float(factor)
        if not (math.isfinite(f) and f > 0):
            raise InvalidParameters(f"the scale factor must be a finite number > 0, got {factor!r}")
        cs = self.cluster_sizes.copy()
        if len(cs):
            cs[:, 2] *= f
        return dataclasses.replace(
            self, rank_counts=self.rank_counts * f, rank_sums=self.rank_sums * f, hist_count=self.hist_count * f,
            hist_sum=self.hist_sum * f, hist_sumsq=self.hist_sumsq * f, cluster_sizes=cs,
            day_conversions=self.day_conversions * f, volume_scale=self.volume_scale * f)

    def for_release_period(self, days: float, history_days: float | None = None) -> SufficientStatistics:
        """A model of one future release of ``days`` days: ``scaled`` to its expected volume (history:
        ``history_days``, default ``self.history_days()``; a period at least as long as the history
        is modelled at the history's volume), marked ``future_period``: the period's loss to Alg. 1
        and clipping is then a random quantity whose sampling variance the error model adds."""
        hist = float(self.history_days() if history_days is None else history_days)
        if not (math.isfinite(float(days)) and float(days) > 0 and hist > 0):
            raise InvalidParameters(f"release period and history must be > 0 days, got {days!r} and {hist!r}")
        return dataclasses.replace(self.scaled(min(1.0, float(days) / hist)), future_period=True)

    # ---- exact totals ------------------------------------------------------------------------------
    def totals(self) -> np.ndarray:
        """V_D(q_l)_j over ALL conversions, (m, d+1), count first (the truth of Def. 3.2)."""
        out = np.empty((self.num_slices, self.num_queries + 1))
        out[:, 0] = self.rank_counts.sum(axis=1)
        out[:, 1:] = self.rank_sums.sum(axis=1)
        return out

    def kept_totals(self, kept_ranks: int) -> np.ndarray:
        """Count and sums of the conversions with rank < kept_ranks (<= R), (m, d+1)."""
        if kept_ranks > self.max_rank:
            raise InvalidParameters(f"statistics cover ranks < {self.max_rank}; {kept_ranks} requested (raise C_max)")
        out = np.empty((self.num_slices, self.num_queries + 1))
        out[:, 0] = self.rank_counts[:, :kept_ranks].sum(axis=1)
        out[:, 1:] = self.rank_sums[:, :kept_ranks].sum(axis=1)
        return out

    # ---- distribution summaries ----------------------------------------------------------------------
    def quantile(self, query: int, q: float) -> float:
        """q-quantile of per-conversion values of a query, from ``global_hist`` (relative error <= bucket width).

        Returns the mean of the bucket that holds the quantile (exact when it holds one distinct value).
        """
        counts = self.global_count[query]
        total = counts.sum()
        if total <= 0:
            raise InvalidInput("no conversions in the statistics")
        b = int(np.searchsorted(np.cumsum(counts), q * total, side="left"))
        b = min(b, len(counts) - 1)
        return float(self.global_sum[query, b] / counts[b])

    def median(self, query: int) -> float:
        return self.quantile(query, 0.5)

    def mean(self, query: int) -> float:
        return float(self.global_sum[query].sum() / max(1.0, self.global_count[query].sum()))

    def taus(self, count_tau: float = 5.0) -> np.ndarray:
        """tau = (count_tau, 5 median(q_1), ...) as ``error_model.default_taus`` (Sec. 5.1), from histograms."""
        out = [float(count_tau)]
        for q in range(self.num_queries):
            tau = 5.0 * self.median(q)
            if tau <= 0:
                tau = 5.0 * self.mean(q) if self.mean(q) > 0 else 1.0
            out.append(tau)
        return np.array(out)

    def impression_size_quantile(self, q: float) -> int:
        """Smallest s with P(conversions per impression <= s) >= q (the overflow bin counts as H+1)."""
        cum = np.cumsum(self.impression_sizes)
        if cum[-1] <= 0:
            raise InvalidInput("no impressions in the statistics")
        return int(np.searchsorted(cum, q * cum[-1], side="left"))


def extract_output(acc: StatisticsAccumulator) -> SufficientStatistics:
    """Final statistics with slices in canonical (sorted) order; independent of batching and merge order."""
    compact(acc)
    spec = acc.spec
    d, R, B = spec.num_queries, spec.max_rank, spec.layout.num_buckets
    keys = sorted(acc.slice_ids, key=slice_sort_key)
    m = len(keys)
    mapping = np.empty(m, dtype=np.int64)
    for new, key in enumerate(keys):
        mapping[acc.slice_ids[key]] = new
    rank_counts = np.zeros((m, R + 1))
    rank_sums = np.zeros((m, R + 1, d))
    if acc.rank_keys:
        rk = _remap(acc.rank_keys[0], R + 1, mapping)
        rv = acc.rank_vals[0]
        rank_counts.reshape(-1)[rk] = rv[:, 0]
        rank_sums.reshape(-1, d)[rk] = rv[:, 1:]
    hk = _remap(acc.hist_keys[0], R * d * B, mapping) if acc.hist_keys else np.zeros(0, dtype=np.int64)
    hv = acc.hist_vals[0] if acc.hist_vals else np.zeros((0, 3))
    order = np.argsort(hk, kind="stable")
    hk, hv = hk[order], hv[order]
    bucket = hk % B
    rest = hk // B
    query = rest % d
    cell = rest // d
    global_count = np.zeros((d, B))
    global_sum = np.zeros((d, B))
    if acc.global_keys:
        global_count.reshape(-1)[acc.global_keys[0]] = acc.global_vals[0][:, 0]
        global_sum.reshape(-1)[acc.global_keys[0]] = acc.global_vals[0][:, 1]
    if acc.sample_cells:
        sc = _remap(acc.sample_cells[0], R, mapping)
        sp, sv = acc.sample_prio[0], acc.sample_vals[0].reshape(-1, d)
        o = np.lexsort((sp, sc))
        sc, sp, sv = sc[o], sp[o], sv[o]
    else:
        sc, sp, sv = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.uint64), np.zeros((0, d))
    assert acc.impression_sizes is not None and acc.value_max is not None  # (create_accumulator sets both)
    R = spec.max_rank
    if acc.cluster_keys:
        ck, cv = acc.cluster_keys[0], acc.cluster_vals[0][:, 0]
        cluster_sizes = np.column_stack([ck // (R + 1), ck % (R + 1), cv]).astype(np.float64)
    else:
        cluster_sizes = np.zeros((0, 3))
    day_index = acc.day_keys[0] if acc.day_keys else np.zeros(0, dtype=np.int64)
    day_conversions = acc.day_vals[0][:, 0] if acc.day_vals else np.zeros(0)
    time_range = None if acc.time_min is None or acc.time_max is None else (int(acc.time_min), int(acc.time_max))
    return SufficientStatistics(
        spec=spec, slice_keys=tuple(keys), rank_counts=rank_counts, rank_sums=rank_sums,
        hist_slice=cell // R, hist_rank=cell % R, hist_query=query, hist_bucket=bucket,
        hist_count=hv[:, 0].copy(), hist_sum=hv[:, 1].copy(), hist_sumsq=hv[:, 2].copy(),
        global_count=global_count, global_sum=global_sum, impression_sizes=acc.impression_sizes.copy(),
        value_max=acc.value_max.copy(), sample_slice=sc // R, sample_rank=sc % R, sample_priority=sp,
        sample_values=sv, num_conversions=int(acc.num_conversions), num_impressions=int(acc.num_impressions),
        cluster_sizes=cluster_sizes, day_index=day_index.astype(np.int64), day_conversions=day_conversions,
        time_range=time_range,
    )


def compute_statistics_in_memory(conversions: Conversions, spec: StatisticsSpec, batches: int = 1) -> SufficientStatistics:
    """Statistics of in-memory conversions (split into ``batches`` impression-complete batches by the
    canonical id's hash, ``araopt.io.ids``, then merged)."""
    if batches <= 1:
        return extract_output(add_conversions(create_accumulator(spec), conversions))
    part = conversions.id_hashes() % np.uint64(batches)
    accs = [add_conversions(create_accumulator(spec), conversions.take(np.flatnonzero(part == b))) for b in range(batches)]
    return extract_output(merge_accumulators(accs))


# ------------------------------------------------------------------------------------------------
# Rounding variance of a Gaussian-smeared value (exact objective)
# ------------------------------------------------------------------------------------------------

_FOURIER_TERMS = 64
_NEGLIGIBLE_EXPONENT = 40.0
"""A Fourier term with 2 pi^2 k^2 sigma^2 above this is below e^-40 / (pi k)^2 < 4.3e-19: left out."""


def frac_variance(mu: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """E f(1-f), f = frac(omega), omega ~ N(mu, sigma^2): the mean variance of RR(omega) (eq. 2).

    From the Fourier series f(1-f) = 1/6 - sum_k cos(2 pi k x) / (pi k)^2 and E cos(2 pi k omega) =
    cos(2 pi k mu) exp(-2 pi^2 k^2 sigma^2): 64 terms for 0.01 <= sigma < 0.5 (truncation < 1e-6);
    sigma >= 0.5 gives 1/6 (error <= 7.3e-4 absolute); sigma < 0.01 gives f(mu)(1 - f(mu)) - sigma^2
    (exact for sigma = 0, i.e. a single distinct value).

    Of the 64 terms only those with 2 pi^2 k^2 sigma^2 <= 40 are computed (about 1.42 / sigma of them;
    the others add less than 64 x 4.3e-19 in all, against a result of at least ~0.008): the cost is a
    few terms per value, not 64 (the objective evaluates this for every histogram cell).
    """
    mu = np.asarray(mu, dtype=np.float64)
    sigma = np.asarray(sigma, dtype=np.float64)
    out = np.full(np.broadcast(mu, sigma).shape, 1.0 / 6.0)
    mu, sigma = np.broadcast_to(mu, out.shape), np.broadcast_to(sigma, out.shape)
    small = sigma < 0.01
    f = mu[small] - np.floor(mu[small])
    out[small] = np.maximum(f * (1.0 - f) - sigma[small] ** 2, 0.0)
    mid = ~small & (sigma < 0.5)
    if mid.any():
        s, x = sigma[mid], mu[mid]
        order = np.argsort(s)  # cells needing term k are a prefix: sigma < sqrt(40 / (2 pi^2)) / k
        s, x = s[order], x[order] - np.floor(x[order])
        s2 = s * s
        limits = np.searchsorted(s, np.sqrt(_NEGLIGIBLE_EXPONENT / (2 * np.pi**2)) / np.arange(1, _FOURIER_TERMS + 1),
                                 side="right")
        tail = np.zeros(len(s))
        for k in range(1, _FOURIER_TERMS + 1):
            n = int(limits[k - 1])
            if n == 0:
                break
            tail[:n] += np.cos(2 * np.pi * k * x[:n]) * np.exp(-2 * np.pi**2 * k * k * s2[:n]) / (np.pi * k) ** 2
        result = np.empty(len(s))
        result[order] = 1.0 / 6.0 - tail
        out[mid] = result
    return out


# ------------------------------------------------------------------------------------------------
# Sampling of a release period's loss (clusters: an impression's conversions in one period)
# ------------------------------------------------------------------------------------------------

def _value_moments(stats: SufficientStatistics, q: int,
                   c: np.ndarray) -> tuple[float, float, np.ndarray, np.ndarray, np.ndarray]:
    """Per conversion (all ranks < R): E v, E v^2 and, for every clip c, E min(v,c), E min(v,c)^2, E v min(v,c)."""
    key = ("value_moments", q)
    if key not in stats._cache:  # independent of the clip and of C: sorted once per query
        e = stats.hist_query == q
        cnt, sm, sq = stats.hist_count[e], stats.hist_sum[e], stats.hist_sumsq[e]
        mean_b = sm / np.maximum(cnt, 1e-300)
        order = np.argsort(mean_b)
        mean_b, cnt, sm, sq = mean_b[order], cnt[order], sm[order], sq[order]

        def csum(a: np.ndarray) -> np.ndarray:
            return np.concatenate([[0.0], np.cumsum(a)])

        stats._cache[key] = (mean_b, max(cnt.sum(), 1e-300), csum(cnt), csum(sm), csum(sq))
    mean_b, N, ccnt, csm, csq = stats._cache[key]
    k = np.searchsorted(mean_b, c, side="left")  # buckets below c: [0, k)
    below_sm, below_sq = csm[k], csq[k]
    above_cnt, above_sm = ccnt[-1] - ccnt[k], csm[-1] - csm[k]
    m1, m2 = csm[-1] / N, csq[-1] / N
    g1 = (below_sm + c * above_cnt) / N
    g2 = (below_sq + c * c * above_cnt) / N
    gv = (below_sq + c * above_sm) / N
    return float(m1), float(m2), g1, g2, gv


def cluster_table(stats: SufficientStatistics, kept_ranks: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(h, n, k): clusters of the measured period (an impression's conversions in one release period)
    by size n and number k that Alg. 1 keeps, k = clip(K - first lifetime rank, 0, n) (conversions of
    a period are consecutive in the impression's order). Overflow sizes count as H+1."""
    cs = stats.cluster_sizes
    if len(cs):
        n, first, h = cs[:, 0], cs[:, 1], cs[:, 2]
        return h, n, np.clip(kept_ranks - first, 0.0, n)
    h = stats.impression_sizes.astype(np.float64)
    n = np.arange(len(h), dtype=np.float64)
    return h, n, np.minimum(n, kept_ranks)


def count_kappa(stats: SufficientStatistics, kept_ranks: int, ratio: float | None = None) -> float:
    """Sampling factor of a period's kept count: sum over clusters h (k - r n)^2 / N, so that
    Var(X - r T) = kappa T^2 / N for a period of N conversions. ``ratio`` None: r = the pooled
    retention ratio (the calibration's kappa); 1: the loss T - X of the capped estimate."""
    h, n, k = cluster_table(stats, kept_ranks)
    N = max((h * n).sum(), 1e-300)
    r = (h * k).sum() / N if ratio is None else float(ratio)
    return float((h * (k - r * n) ** 2).sum() / N)


def value_kappa(stats: SufficientStatistics, q: int, kept_ranks: int, clip: np.ndarray,
                ratio: float | None = None) -> np.ndarray:
    """Sampling factor of value query q for clip thresholds ``clip`` (L-inf retention min(v, c)), as
    ``count_kappa`` (``ratio`` None: the pooled ratio; 1: the loss of the capped estimate).

    Values i.i.d. within an impression, independent of rank: with D = min(v,c) - r v, a cluster of n
    conversions (k kept) has E(x - r t)^2 = k Var D + (n-k) r^2 Var v + (k E D - (n-k) r E v)^2.
    """
    c = np.atleast_1d(np.asarray(clip, dtype=np.float64))
    m1, m2, g1, g2, gv = _value_moments(stats, q, c)
    h, n, k = cluster_table(stats, kept_ranks)
    N = max((h * n).sum(), 1e-300)
    if m1 <= 0:
        return np.zeros_like(c)
    r = g1 * (h * k).sum() / (m1 * N) if ratio is None else np.full_like(c, float(ratio))
    ED = g1 - r * m1
    VD = np.maximum(g2 - 2 * r * gv + r * r * m2 - ED**2, 0.0)
    Vv = max(m2 - m1 * m1, 0.0)
    kk, nn, hh = k[:, None], n[:, None], h[:, None]
    e2 = kk * VD + (nn - kk) * r**2 * Vv + (kk * ED - (nn - kk) * r * m1) ** 2
    return cast(np.ndarray, (hh * e2).sum(axis=0) / (N * m1 * m1))


class StatisticsCombiner:
    """The ``araopt.combiner.Combiner`` of the statistics of ``spec``: batches that hold all conversions
    of each of their impressions in, ``SufficientStatistics`` out."""

    def __init__(self, spec: StatisticsSpec) -> None:
        self.spec = spec

    def create(self) -> StatisticsAccumulator:
        return create_accumulator(self.spec)

    def add(self, acc: StatisticsAccumulator, item: Conversions) -> StatisticsAccumulator:
        return add_conversions(acc, item)

    def merge(self, accs: Sequence[StatisticsAccumulator]) -> StatisticsAccumulator:
        return merge_accumulators(accs)

    def compact(self, acc: StatisticsAccumulator) -> StatisticsAccumulator:
        return compact(acc)

    def extract(self, acc: StatisticsAccumulator) -> SufficientStatistics:
        return extract_output(acc)
