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
    n = len(impression_ids)
    if len(conversion_times) != n or (tie_breaker is not None and len(tie_breaker) != n):
        raise ValueError(
            f"impression_ids, conversion_times and tie_breaker must have equal lengths, got "
            f"{n}, {len(conversion_times)}, {None if tie_breaker is None else len(tie_breaker)}"
        )
    keys = [np.asarray(conversion_times), np.asarray(impression_ids)]
    if tie_breaker is not None:
        keys.insert(0, np.asarray(tie_breaker))
    return np.lexsort(keys)  # lexsort: last key is primary; it is stable, so input position breaks ties


def ranks_within_impression(sorted_impression_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For records sorted by impression: (rank within impression from 0, impression index)."""
    n = len(sorted_impression_ids)
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    starts = np.empty(n, dtype=bool)
    starts[0] = True
    starts[1:] = sorted_impression_ids[1:] != sorted_impression_ids[:-1]
    group = np.cumsum(starts) - 1
    start_pos = np.flatnonzero(starts)
    rank = np.arange(n) - start_pos[group]
    return rank, group


def bound_sorted(
    norms: np.ndarray, rank: np.ndarray, group: np.ndarray, contribution_budget: int = CONTRIBUTION_BUDGET,
) -> np.ndarray:
    """Alg. 1 on records already sorted by (impression, time): boolean kept mask in that order."""
    norms = np.asarray(norms, dtype=np.int64)
    n = len(norms)
    kept = np.zeros(n, dtype=bool)
    if n == 0:
        return kept
    if (norms < 0).any():
        raise ValueError("contributions must be non-negative (Alg. 1 takes histogram contributions in Z>=0)")
    if (norms == norms[0]).all():  # equal norms (L-inf, L1): the first floor(Gamma / norm) are kept
        limit = n if norms[0] == 0 else contribution_budget // int(norms[0])
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
    order = impression_order(impression_ids, conversion_times, tie_breaker)
    rank, group = ranks_within_impression(np.asarray(impression_ids)[order])
    kept_sorted = bound_sorted(norms[order], rank, group, contribution_budget)
    kept = np.empty(n, dtype=bool)
    kept[order] = kept_sorted
    return kept
