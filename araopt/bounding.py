"""Contribution bounding (Alg. 1), vectorized across impressions.

Per impression, in conversion-time order (ties broken deterministically), a contribution is kept
iff the budget used so far plus its L1 norm stays within Gamma; a contribution that does not fit is
skipped and later, smaller ones may still fit (first come, first kept, all or nothing per trigger).
The loop runs over rank positions within impressions (at most max conversions per impression
iterations), each one vectorized over every impression that has a conversion at that rank.
"""
from __future__ import annotations

import numpy as np

from .params import CONTRIBUTION_BUDGET


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
        raise ValueError(
            f"impression_ids, conversion_times and tie_breaker must have equal lengths, got "
            f"{n}, {len(conversion_times)}, {None if tie_breaker is None else len(tie_breaker)}"
        )
    imp = np.asarray(impression_ids)
    times = np.asarray(conversion_times)
    position = np.arange(n)
    if n == 0:
        return position, imp
    if times.dtype.kind in "iu":
        t0, t1 = int(times.min()), int(times.max())
        time_bits = max(1, (t1 - t0).bit_length())
        if imp.dtype.kind in "iu" and int(imp.min()) >= 0 and int(imp.max()).bit_length() + time_bits <= 62:
            packed = imp.astype(np.int64)
            packed <<= time_bits
            offset = times.astype(np.int64, copy=True)
            offset -= t0
            packed |= offset
            del offset
            order = np.argsort(packed)
            sorted_key = packed[order]
            order = _order_packed(sorted_key, order, tie_breaker)
            sorted_key >>= time_bits
            return order, sorted_key
        by_imp = np.argsort(imp)
        sorted_imp = imp[by_imp]
        new_group = np.empty(n, dtype=np.int64)
        new_group[0] = 0
        new_group[1:] = sorted_imp[1:] != sorted_imp[:-1]
        group = np.cumsum(new_group)
        if int(group[-1]).bit_length() + time_bits <= 62:
            packed = (group << time_bits) | (times[by_imp].astype(np.int64) - t0)
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
    equal_norm: int | None = None,
) -> np.ndarray:
    """Alg. 1 on records already sorted by (impression, time): boolean kept mask in that order.

    ``equal_norm``: every record has this norm (L-inf, L1), so ``norms`` is not consulted.
    """
    n = len(rank)
    kept = np.zeros(n, dtype=bool)
    if n == 0:
        return kept
    if equal_norm is None:
        norms = np.asarray(norms, dtype=np.int64)
        if (norms < 0).any():
            raise ValueError("contributions must be non-negative (Alg. 1 takes histogram contributions in Z>=0)")
        if (norms == norms[0]).all():
            equal_norm = int(norms[0])
    if equal_norm is not None:  # equal norms: the first floor(Gamma / norm) of each impression are kept
        if equal_norm < 0:
            raise ValueError("contributions must be non-negative (Alg. 1 takes histogram contributions in Z>=0)")
        limit = n if equal_norm == 0 else contribution_budget // equal_norm
        return rank < limit
    used = np.zeros(int(group[-1]) + 1, dtype=np.int64)
    by_rank = np.argsort(rank, kind="stable")
    bounds = np.searchsorted(rank[by_rank], np.arange(int(rank.max()) + 2))
    for r in range(int(rank.max()) + 1):
        idx = by_rank[bounds[r]:bounds[r + 1]]
        g = group[idx]
        fits = used[g] + norms[idx] <= contribution_budget
        kept[idx] = fits
        used[g[fits]] += norms[idx[fits]]  # one record per impression per rank: no duplicate g
    return kept


def bound_contributions(
    impression_ids: np.ndarray, conversion_times: np.ndarray, contributions: np.ndarray,
    contribution_budget: int = CONTRIBUTION_BUDGET, tie_breaker: np.ndarray | None = None,
) -> np.ndarray:
    """Alg. 1 over records in any order: boolean "kept" mask aligned with the input.

    ``contributions`` is an (n, K) non-negative integer array (or (n,) of L1 norms). Records of one
    impression are taken in ``conversion_times`` order, ties by ``tie_breaker`` then input position.
    """
    contrib = np.asarray(contributions)
    n = len(impression_ids)
    if contrib.shape[0] != n:
        raise ValueError(f"contributions has {contrib.shape[0]} rows but there are {n} impression ids")
    if contrib.size and not np.issubdtype(contrib.dtype, np.integer):
        raise ValueError(f"contributions must be integers (ARA aggregatable values), got dtype {contrib.dtype}")
    norms = contrib.sum(axis=1) if contrib.ndim == 2 else contrib
    order, sorted_impressions = sort_by_impression(impression_ids, conversion_times, tie_breaker)
    rank, group = ranks_within_impression(sorted_impressions)
    if n and (norms == norms[0]).all():  # L-inf / L1: skip gathering the norms
        kept_sorted = bound_sorted(norms[:0], rank, group, contribution_budget, equal_norm=int(norms[0]))
    else:
        kept_sorted = bound_sorted(norms[order], rank, group, contribution_budget)
    kept = np.empty(n, dtype=bool)
    kept[order] = kept_sorted
    return kept
