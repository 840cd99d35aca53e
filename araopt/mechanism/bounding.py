"""Contribution bounding (ContributionCapping, Alg. 1), vectorized across impressions.

Per impression, in conversion-time order (ties broken deterministically), a contribution is kept
iff the budget used so far plus its L1 norm stays within Gamma; a contribution that does not fit is
skipped and later, smaller ones may still fit (first come, first kept, all or nothing per trigger).
As in Chrome, a source also sends at most ``MAX_REPORTS_PER_SOURCE`` (20) aggregatable reports:
once an impression has that many kept non-empty contributions, every later one is dropped, even if
budget remains (checked before the budget, as the spec's "max aggregatable reports per source").
A contribution of norm 0 makes no report (the browser sends none): it is kept and not counted.
The loop runs over rank positions within impressions (at most max conversions per impression
iterations), each one vectorized over every impression that has a conversion at that rank.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from araopt.constants import CONTRIBUTION_BUDGET, MAX_REPORTS_PER_SOURCE
from araopt.errors import InvalidInput, InvalidParameters, check_contribution_budget
from araopt.io.conversions import Conversions
from araopt.mechanism.encoding import count_scale, expected_contribution
from araopt.mechanism.params import Encoding, Params


def check_max_reports(max_reports: int) -> int:
    """The report limit as an int if it is an integer >= 1; a bool, float or smaller value is refused."""
    if isinstance(max_reports, (bool, np.bool_)) or not isinstance(max_reports, (int, np.integer)) or max_reports < 1:
        raise InvalidParameters(f"max_reports must be an integer >= 1, got {max_reports!r}")
    return int(max_reports)


def kept_per_impression(count_limit: int, contribution_budget: int = CONTRIBUTION_BUDGET,
                        max_reports: int = MAX_REPORTS_PER_SOURCE) -> int:
    """K(C) = min(Gamma // floor(Gamma / C), max_reports): what Alg. 1 keeps per impression when every
    contribution has norm floor(Gamma / C) (L-inf, L1)."""
    return min(contribution_budget // (contribution_budget // int(count_limit)), check_max_reports(max_reports))


def contribution_norms(contributions: np.ndarray, contribution_budget: int = CONTRIBUTION_BUDGET) -> np.ndarray:
    """L1 norm of each record's contribution as int64, checked entry-wise as a browser checks values.

    ``contributions`` is (n, K): every entry must be an integer in [0, Gamma] (a browser refuses an
    aggregatable value outside [1, 65536]; 0 is a key the record does not use). A negative entry
    must never offset a large one in the row sum. Or (n,): the records' L1 norms, non-negative
    integers; a norm above Gamma never fits and is stored as Gamma + 1 (no int64 overflow later).
    """
    budget = check_contribution_budget(contribution_budget)
    contrib = np.asarray(contributions)
    if contrib.ndim not in (1, 2):
        raise InvalidInput(f"contributions must be an (n, K) array of per-key values or (n,) L1 norms, "
                           f"got shape {contrib.shape}")
    if contrib.size and contrib.dtype.kind not in "iu":
        raise InvalidInput(f"contributions must be integers (ARA aggregatable values), got dtype {contrib.dtype}")
    if contrib.dtype.kind in "iu" and contrib.dtype.itemsize < 8:  # small ints: compare with Gamma in int64
        contrib = contrib.astype(np.int64)
    if contrib.ndim == 2:
        if contrib.size and (contrib.min() < 0 or contrib.max() > budget):
            row, key = np.argwhere((contrib < 0) | (contrib > budget))[0]
            raise InvalidInput(
                f"every contribution entry must be an integer in [0, Gamma = {budget}] (a browser refuses "
                f"aggregatable values outside [1, 65536]): got {int(contrib[row, key])} at row {row}, key {key}")
        return cast(np.ndarray, contrib.sum(axis=1, dtype=np.int64))
    if contrib.size and contrib.min() < 0:
        raise InvalidInput(f"contribution L1 norms must be non-negative integers, got {int(contrib.min())}")
    return cast(np.ndarray, np.minimum(contrib, budget + 1).astype(np.int64))  # uint64 above 2^63 never wraps to negative


def impression_order(
    impression_ids: np.ndarray, conversion_times: np.ndarray, tie_breaker: np.ndarray | None = None,
) -> np.ndarray:
    """Permutation sorting records by (impression, time, tie_breaker, input position)."""
    return sort_by_impression(impression_ids, conversion_times, tie_breaker)[0]


def sort_by_impression(
    impression_ids: np.ndarray, conversion_times: np.ndarray, tie_breaker: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(order, impression key along that order): a permutation sorting records by (impression, time,
    tie_breaker, input position), and an array equal exactly where the sorted impressions are equal.

    Fast path (integer times): one argsort of a single packed int64 key (impression id, or its dense
    index, << time bits | time offset); runs of equal (impression, time) are then ordered by
    (tie_breaker, input position). Falls back to ``np.lexsort`` otherwise.
    """
    n = len(impression_ids)
    if len(conversion_times) != n or (tie_breaker is not None and len(tie_breaker) != n):
        raise InvalidInput(
            f"impression_ids, conversion_times and tie_breaker must have equal lengths, got "
            f"{n}, {len(conversion_times)}, {None if tie_breaker is None else len(tie_breaker)}"
        )
    imp = np.asarray(impression_ids)
    times = np.asarray(conversion_times)
    if imp.ndim != 1 or times.ndim != 1 or (tie_breaker is not None and np.ndim(tie_breaker) != 1):
        raise InvalidInput("impression_ids, conversion_times and tie_breaker must be 1-D arrays")
    _check_orderable(imp, "impression_ids")
    _check_orderable(times, "conversion_times")
    if tie_breaker is not None:
        _check_orderable(np.asarray(tie_breaker), "tie_breaker")
    position = np.arange(n)
    if n == 0:
        return position, imp
    if times.dtype.kind in "iu":
        t0, t1 = int(times.min()), int(times.max())
        time_bits = max(1, (t1 - t0).bit_length())
        if imp.dtype.kind in "iu" and int(imp.min()) >= 0 and int(imp.max()).bit_length() + time_bits <= 62:
            packed = imp.astype(np.int64)
            packed <<= time_bits
            offset = _time_offsets(times, t0)
            packed |= offset
            del offset
            order = np.argsort(packed)
            sorted_key = packed[order]
            order = _order_packed(sorted_key, order, tie_breaker)
            sorted_key >>= time_bits
            return order, sorted_key
        by_imp = _argsort_ids(imp)
        sorted_imp = imp[by_imp]
        new_group = np.empty(n, dtype=np.int64)
        new_group[0] = 0
        new_group[1:] = sorted_imp[1:] != sorted_imp[:-1]
        group = np.cumsum(new_group)
        if int(group[-1]).bit_length() + time_bits <= 62:
            packed = (group << time_bits) | _time_offsets(times[by_imp], t0)
            second = np.argsort(packed)
            sorted_key = packed[second]
            order = _order_packed(sorted_key, by_imp[second], tie_breaker)
            sorted_key >>= time_bits
            return order, sorted_key
    keys = [position, times, imp]
    if tie_breaker is not None:
        keys.insert(1, np.asarray(tie_breaker))
    order = np.lexsort(keys)
    return order, imp[order]


def _argsort_ids(imp: np.ndarray) -> np.ndarray:
    """A permutation sorting the ids (equal ids in any order: only the order of distinct ids matters).
    String ids are sorted by Arrow (UTF-8 byte order is code point order, Python's): about twice as
    fast as numpy's comparisons of Python objects; other ids by numpy."""
    if imp.dtype == object and len(imp):
        try:
            arr = pa.array(imp, from_pandas=False)
            if pa.types.is_string(arr.type) and arr.null_count == 0:
                return cast(np.ndarray, pc.sort_indices(arr).to_numpy().astype(np.int64))
        except (pa.ArrowException, TypeError, ValueError):  # mixed or non-string objects: numpy's order
            pass
    return cast(np.ndarray, np.argsort(imp))


def _check_orderable(arr: np.ndarray, name: str) -> None:
    """Refuse NaN ids (each NaN would be an impression of its own, with a budget of its own), NaN /
    infinite float times and NaT: they are not instants and have no place in Alg. 1's time order."""
    if arr.dtype.kind in "fc" and not np.isfinite(arr).all():
        raise InvalidInput(f"{name} must be finite: NaN or infinity at position {int(np.flatnonzero(~np.isfinite(arr))[0])}")
    if arr.dtype.kind in "mM" and np.isnat(arr).any():
        raise InvalidInput(f"{name} must not hold NaT (position {int(np.flatnonzero(np.isnat(arr))[0])})")


def _time_offsets(times: np.ndarray, t0: int) -> np.ndarray:
    """times - t0 as int64, exact for any int or uint dtype when the range t1 - t0 is below 2^62
    (uint64 times above 2^63 included); a new array, the caller's is left alone."""
    if times.dtype.kind == "u":
        offset = times.astype(np.uint64)
        offset -= np.uint64(t0)
        return offset.astype(np.int64)
    offset = times.astype(np.int64)
    offset -= np.int64(t0)
    return offset


def _order_packed(sorted_key: np.ndarray, order: np.ndarray, tie_breaker: np.ndarray | None) -> np.ndarray:
    """Finish a packed-key sort: order runs of equal (impression, time) by (tie_breaker, position)."""
    ties = np.flatnonzero(sorted_key[1:] == sorted_key[:-1])
    if ties.size:
        pos = np.unique(np.concatenate([ties, ties + 1]))
        keys = [order[pos]] + ([np.asarray(tie_breaker)[order[pos]]] if tie_breaker is not None else [])
        keys.append(sorted_key[pos])
        order[pos] = order[pos][np.lexsort(keys)]
    return order


def ranks_within_impression(sorted_impression_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For records sorted by impression: (rank within impression from 0, impression index)."""
    n = len(sorted_impression_ids)
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    starts = np.empty(n, dtype=bool)
    starts[0] = True
    np.not_equal(sorted_impression_ids[1:], sorted_impression_ids[:-1], out=starts[1:])
    group = np.cumsum(starts, dtype=np.int64)
    group -= 1
    start_pos = np.flatnonzero(starts)
    rank = np.arange(n, dtype=np.int64)
    rank -= start_pos[group]
    return rank, group


def bound_sorted(
    norms: np.ndarray, rank: np.ndarray, group: np.ndarray, contribution_budget: int = CONTRIBUTION_BUDGET,
    equal_norm: int | None = None, max_reports: int = MAX_REPORTS_PER_SOURCE, upper: np.ndarray | None = None,
) -> np.ndarray:
    """ContributionCapping on records already sorted by (impression, time): boolean kept mask in that order.

    ``norms``: each record's L1 norm (non-negative integers, checked by :func:`contribution_norms`).
    ``equal_norm``: every record has this norm (L-inf, L1), so ``norms`` is not consulted.
    ``max_reports``: at most this many records of norm > 0 are kept per impression (Chrome: 20).
    ``upper``: when a record's norm is only known to lie in [``norms``, ``upper``] (an earlier release's
    random rounding, an unknown configuration: ``araopt.mechanism.lifetime``), the same Alg. 1 runs on
    an interval of each impression's state: a record *may* have been kept if its lower norm fits the
    lowest budget used, and *is* kept if its upper norm fits the highest (and the highest report count
    is below the limit). The highest state grows by the upper norm (and one report) of every record
    that may have been kept (never above Gamma or the report limit), the lowest by the lower norm of
    every record that is kept, so the true state stays inside and a kept record fits whatever the
    earlier ones really cost. With every interval a point this is Alg. 1 exactly.
    """
    budget = check_contribution_budget(contribution_budget)
    reports_limit = check_max_reports(max_reports)
    rank, group = np.asarray(rank), np.asarray(group)
    n = len(rank)
    if len(group) != n:
        raise InvalidInput(f"rank and group must have equal lengths, got {n} and {len(group)}")
    if upper is not None:
        if equal_norm is not None or np.shape(upper) != (n,):
            raise InvalidInput(f"upper must be {n} L1 norms beside {n} lower norms, got shape {np.shape(upper)}")
        upper = contribution_norms(upper, budget)
    if equal_norm is None:
        if np.shape(norms) != (n,):
            raise InvalidInput(f"norms must be {n} L1 norms (one per record), got shape {np.shape(norms)}")
        norms = contribution_norms(norms, budget)
        if upper is not None:
            if (upper < norms).any():
                raise InvalidInput(f"an upper norm is below its lower norm (record {int(np.argmax(upper < norms))})")
            if (upper == norms).all():
                upper = None
        if upper is None and n and (norms == norms[0]).all():
            equal_norm = int(norms[0])
    elif isinstance(equal_norm, (bool, np.bool_)) or not isinstance(equal_norm, (int, np.integer)) or equal_norm < 0:
        raise InvalidParameters(f"equal_norm must be a non-negative integer, got {equal_norm!r}")
    kept = np.zeros(n, dtype=bool)
    if n == 0:
        return kept
    if equal_norm is not None:  # equal norms: the first min(floor(Gamma / norm), max_reports) are kept
        limit = n if equal_norm == 0 else min(budget // int(equal_norm), reports_limit)
        return rank < limit
    used = np.zeros(int(group[-1]) + 1, dtype=np.int64)
    reports = np.zeros(len(used), dtype=np.int64)
    by_rank = np.argsort(rank, kind="stable")
    bounds = np.searchsorted(rank[by_rank], np.arange(int(rank.max()) + 2))
    if upper is not None:
        return _bound_intervals(norms, upper, group, by_rank, bounds, used, reports, budget, reports_limit, kept)
    for r in range(int(rank.max()) + 1):
        idx = by_rank[bounds[r]:bounds[r + 1]]
        g = group[idx]
        w = norms[idx]
        # norms <= Gamma + 1 and used <= Gamma: no overflow; a report beyond the limit is dropped first
        fits = (used[g] + w <= budget) & ((reports[g] < reports_limit) | (w == 0))
        kept[idx] = fits
        used[g[fits]] += w[fits]  # one record per impression per rank: no duplicate g
        reports[g[fits]] += w[fits] > 0
    return kept


def _bound_intervals(low: np.ndarray, high: np.ndarray, group: np.ndarray, by_rank: np.ndarray, bounds: np.ndarray,
                     used: np.ndarray, reports: np.ndarray, budget: int, reports_limit: int,
                     kept: np.ndarray) -> np.ndarray:
    """:func:`bound_sorted` over norm intervals: ``used``/``reports`` hold each impression's highest
    spend and report count, ``least_used`` its lowest spend (see :func:`bound_sorted`). A lowest
    report count is not needed: once it reaches the limit, so has the highest, and every later record
    is kept iff its upper norm is 0 whatever the spend."""
    least_used = np.zeros_like(used)
    for r in range(len(bounds) - 1):
        idx = by_rank[bounds[r]:bounds[r + 1]]
        g = group[idx]
        lo, hi = low[idx], high[idx]
        maybe = least_used[g] + lo <= budget
        fits = (used[g] + hi <= budget) & ((reports[g] < reports_limit) | (hi == 0))
        kept[idx] = fits
        used[g[maybe]] = np.minimum(used[g[maybe]] + hi[maybe], budget)
        reports[g[maybe]] = np.minimum(reports[g[maybe]] + (hi[maybe] > 0), reports_limit)
        least_used[g[fits]] += lo[fits]
    return kept


def bound_contributions(
    impression_ids: np.ndarray, conversion_times: np.ndarray, contributions: np.ndarray,
    contribution_budget: int = CONTRIBUTION_BUDGET, tie_breaker: np.ndarray | None = None,
    max_reports: int = MAX_REPORTS_PER_SOURCE, upper_norms: np.ndarray | None = None,
) -> np.ndarray:
    """ContributionCapping over records in any order: boolean "kept" mask aligned with the input.

    ``contributions`` is an (n, K) array of integers in [0, Gamma] (per-key values) or (n,) of
    non-negative integer L1 norms (see :func:`contribution_norms`). Records of one impression are
    taken in ``conversion_times`` order, ties by ``tie_breaker`` then input position; a record is
    kept iff the impression has sent fewer than ``max_reports`` reports (records of norm > 0) and
    its norm fits the impression's remaining budget ``contribution_budget``. Inputs are never modified.
    ``upper_norms``: (n,) upper bounds of the norms when ``contributions`` are (n,) lower bounds
    (earlier conversions whose cost is only known to an interval: :func:`bound_sorted`).
    """
    n = len(impression_ids)
    contrib = np.asarray(contributions)
    if contrib.ndim == 0:
        raise InvalidInput("contributions must be an (n, K) or (n,) array, got a scalar")
    if contrib.shape[0] != n:
        raise InvalidInput(f"contributions has {contrib.shape[0]} rows but there are {n} impression ids")
    norms = contribution_norms(contrib, contribution_budget)
    order, sorted_impressions = sort_by_impression(impression_ids, conversion_times, tie_breaker)
    rank, group = ranks_within_impression(sorted_impressions)
    if upper_norms is not None:
        if np.shape(upper_norms) != (n,) or contrib.ndim != 1:
            raise InvalidInput(f"upper_norms must be {n} L1 norms beside {n} lower norms (not per-key contributions)")
        kept_sorted = bound_sorted(norms[order], rank, group, contribution_budget, max_reports=max_reports,
                                   upper=np.asarray(upper_norms)[order])
    elif n and (norms == norms[0]).all():  # L-inf / L1: skip gathering the norms
        kept_sorted = bound_sorted(norms[:0], rank, group, contribution_budget, equal_norm=int(norms[0]),
                                   max_reports=max_reports)
    else:
        kept_sorted = bound_sorted(norms[order], rank, group, contribution_budget, max_reports=max_reports)
    kept = np.empty(n, dtype=bool)
    kept[order] = kept_sorted
    return kept


def kept_mask(conversions: Conversions, params: Params, tie_breaker: np.ndarray | None = None) -> np.ndarray:
    """Which records Alg. 1 keeps under ``params``, deterministically (the error model's and the
    calibration's kept set): L-inf and L1 contributions all have norm floor(Gamma/C); a baseline
    record's norm is decided by its expected norm rounded to the nearest integer, which differs from
    the realised decision only when an impression's running total lands within d units of Gamma.
    With exploration arms, a record of an arm costs floor(Gamma / C_a) and is not kept in the main
    keys (its arm's keys report it)."""
    return kept_mask_ordered(conversions, params, ImpressionRanks.of(conversions, tie_breaker))


@dataclass(frozen=True)
class ImpressionRanks:
    """Alg. 1's order of a batch, which does not depend on the parameters: ``order`` sorts the records by
    (impression, time, tie_breaker, position); ``rank`` and ``group`` (impression index) along it.
    Computed once, it serves every candidate parameter set (``kept_mask_ordered``)."""

    order: np.ndarray
    rank: np.ndarray
    group: np.ndarray

    @classmethod
    def of(cls, conversions: Conversions, tie_breaker: np.ndarray | None = None) -> ImpressionRanks:
        keys = conversions.impression_sort_keys()  # groups as the canonical ids do, compared as integers
        order = impression_order(keys, conversions.conversion_time, tie_breaker)
        rank, group = ranks_within_impression(keys[order])
        return cls(order, rank, group)


def kept_mask_ordered(conversions: Conversions, params: Params, ranks: ImpressionRanks) -> np.ndarray:
    """``kept_mask`` with the batch's order already computed (``ImpressionRanks.of`` with the same tie-break)."""
    order, rank, group = ranks.order, ranks.rank, ranks.group
    arm = None if params.exploration is None else params.exploration.assign(conversions.impression_id)[order]
    if params.encoding == Encoding.BASELINE:
        norms = np.rint(expected_contribution(conversions.values[order], params).sum(axis=1) + count_scale(params))
    elif arm is None:
        norms = np.full(len(order), params.per_conversion_budget)
    else:
        assert params.exploration is not None  # (arm is set only with arms)
        per_arm = np.array([params.for_arm(a).per_conversion_budget for a in range(params.exploration.num_arms)]
                           + [params.per_conversion_budget], dtype=np.int64)
        norms = per_arm[arm]  # index -1: the main configuration's
    kept_sorted = bound_sorted(norms.astype(np.int64), rank, group, params.contribution_budget)
    if arm is not None:
        kept_sorted &= arm < 0
    kept = np.empty(len(order), dtype=bool)
    kept[order] = kept_sorted
    return kept
