"""ContributionCapping (Alg. 1): per impression, in time order, a contribution is kept iff the budget
used so far plus its L1 norm stays within Gamma = 65,536 (first come, first kept).

Specifications: the worked example, exact budget boundaries, non-default budgets, tie breaking,
every sort path, refusals (entry-wise range, dtypes, shapes, NaN), inputs left untouched, and a
property test against a literal sequential Alg. 1.
"""
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from araopt import Params, QueryParams, bound_contributions, encode
from araopt.mechanism.bounding import (
    bound_sorted,
    contribution_norms,
    impression_order,
    kept_per_impression,
    ranks_within_impression,
    sort_by_impression,
)

GAMMA = 65536


def sequential_alg1(impression_ids, times, norms, budget=GAMMA, tie_breaker=None, max_reports=20):
    """Alg. 1 literally, as Chrome runs it: per impression, in time order (ties by tie breaker, then
    input position), a contribution is dropped if the impression already sent ``max_reports``
    reports, else kept iff it fits the remaining budget; a contribution of norm 0 sends no report."""
    ids, ts = list(np.asarray(impression_ids).tolist()), list(np.asarray(times).tolist())
    ties = [0] * len(ids) if tie_breaker is None else list(np.asarray(tie_breaker).tolist())
    kept = np.zeros(len(ids), dtype=bool)
    used, sent = {}, {}
    for i in sorted(range(len(ids)), key=lambda i: (ids[i], ts[i], ties[i], i)):
        norm = int(norms[i])
        if norm > 0 and sent.get(ids[i], 0) >= max_reports:
            continue
        b = used.get(ids[i], 0)
        if b + norm <= budget:
            kept[i] = True
            used[ids[i]] = b + norm
            sent[ids[i]] = sent.get(ids[i], 0) + (norm > 0)
    return kept


def one_impression(norms, budget=GAMMA, times=None):
    norms = np.asarray(norms, dtype=np.int64)
    t = np.arange(len(norms)) if times is None else np.asarray(times)
    return bound_contributions(np.zeros(len(norms), dtype=np.int64), t, norms, budget).tolist()


def test_paper_example_z4_dropped():
    # Du & Penc, impression 123: z1, z2, z4 each use Gamma/2, so z4 (the third, latest) is dropped
    params = Params(count_limit=2, encoding="linf", epsilon=8.0, slice_columns=("campaign",),
                    queries=(QueryParams("items", 2.0, 0.5), QueryParams("value", 30.0, 0.5)))
    imp = np.array([123, 123, 456, 123, 101, 789, 101])
    t = np.array([1, 2, 3, 4, 5, 6, 7])
    vals = np.array([[3, 21], [1, 5], [1, 99], [2, 23], [2, 50], [3, 15], [1, 5]], dtype=float)
    w = encode(vals, params, np.random.default_rng(0))
    kept = bound_contributions(imp, t, w)
    assert kept.tolist() == [True, True, True, False, True, True, True]


def test_a_contribution_that_does_not_fit_is_skipped_and_later_smaller_ones_fit():
    # 40000 kept; 30000 would make 70000: skipped; 20000 -> 60000 kept; 5000 -> 65000 kept; 600 -> 65600 no
    kept = bound_contributions(np.zeros(5, int), np.arange(5), np.array([40000, 30000, 20000, 5000, 600]))
    assert kept.tolist() == [True, False, True, True, False]


# ---- exact boundaries of the budget ---------------------------------------------------------------
def test_a_total_of_exactly_gamma_is_kept():
    assert one_impression([40000, 25536]) == [True, True]
    assert one_impression([GAMMA]) == [True]
    assert one_impression([GAMMA, 0]) == [True, True]  # a zero contribution always fits


def test_one_unit_over_gamma_is_dropped():
    assert one_impression([65536, 1]) == [True, False]
    assert one_impression([40000, 25537]) == [True, False]
    assert one_impression([GAMMA + 1]) == [False]


def test_the_boundary_holds_for_per_key_rows_too():
    imp, t = np.zeros(3, dtype=np.int64), np.arange(3)
    rows = np.array([[30000, 10000, 0], [20000, 0, 5536], [0, 1, 0]])  # norms 40000, 25536, 1
    assert bound_contributions(imp, t, rows).tolist() == [True, True, False]


# ---- a non-default budget is honoured on every path ------------------------------------------------
def test_non_default_budget_with_equal_norms_keeps_exactly_floor_budget_over_norm():
    assert one_impression([10, 10, 10], budget=20) == [True, True, False]
    assert one_impression([7, 7, 7], budget=20) == [True, True, False]
    assert one_impression([10, 10], budget=5) == [False, False]
    rows = np.full((3, 2), 5)  # (n, K) with equal norms 10: the equal-norm fast path
    assert bound_contributions(np.zeros(3, int), np.arange(3), rows, contribution_budget=20).tolist() == [True, True, False]


def test_non_default_budget_with_unequal_norms():
    assert one_impression([15, 6, 5], budget=20) == [True, False, True]
    assert one_impression([21, 20, 1], budget=20) == [False, True, False]
    assert one_impression([10, 11, 10], budget=20) == [True, False, True]


def test_bound_sorted_honours_the_budget_with_and_without_equal_norm():
    rank, group = np.array([0, 1, 2, 0]), np.array([0, 0, 0, 1])
    kept = bound_sorted(np.full(4, 10), rank, group, 20)
    assert kept.dtype == bool and kept.tolist() == [True, True, False, True]
    assert bound_sorted(np.array([15, 6, 5, 21]), rank, group, 20).dtype == bool
    assert bound_sorted([10, 10, 10, 10], [0, 1, 2, 0], [0, 0, 0, 1], 20).tolist() == [True, True, False, True]
    assert bound_sorted(np.array([21]), np.array([0]), np.array([0]), 20).tolist() == [False]  # one record
    assert bound_sorted(np.array([20]), np.array([0]), np.array([0]), 20).tolist() == [True]
    assert bound_sorted(np.zeros(0), rank, group, 20, equal_norm=10).tolist() == [True, True, False, True]
    assert bound_sorted(np.zeros(0), rank, group, 20, equal_norm=0).tolist() == [True] * 4
    assert bound_sorted(np.zeros(0), rank, group, 20, equal_norm=21).tolist() == [False] * 4
    assert bound_sorted(np.array([15, 6, 5, 21]), rank, group, 20).tolist() == [True, False, True, False]


# ---- Chrome's limit: at most 20 aggregatable reports per source -----------------------------------
def test_a_source_keeps_at_most_20_contributions_even_with_budget_left():
    assert one_impression([100] * 25) == [True] * 20 + [False] * 5  # equal norms
    assert one_impression([100, 101] * 12 + [100]) == [True] * 20 + [False] * 5  # unequal norms
    assert one_impression([3276] * 21) == [True] * 20 + [False]  # L-inf C = 20: floor(Gamma/20) fits 20 times only
    assert one_impression([2621] * 25) == [True] * 20 + [False] * 5  # C = 25 would fit 25: Chrome sends 20


def test_the_report_limit_is_checked_before_the_budget_and_dropped_contributions_do_not_count():
    # 60000 kept, 10000 does not fit (no report), then 19 of the twenty 10s fill the 20 reports
    assert one_impression([60000, 10000] + [10] * 20) == [True, False] + [True] * 19 + [False]
    # a 21st contribution that would fit the budget is dropped, a later one too
    assert one_impression([1] * 22, budget=100) == [True] * 20 + [False, False]


def test_contributions_of_norm_zero_send_no_report_and_are_not_counted():
    assert one_impression([0] * 5 + [1] * 22) == [True] * 25 + [False] * 2
    assert one_impression([0] * 30) == [True] * 30  # equal-norm path: nothing is sent, nothing is limited


def test_the_report_limit_applies_per_impression_on_both_paths():
    imp = np.repeat([5, 9], 25)
    t = np.tile(np.arange(25), 2)
    for norms in (np.full(50, 7), np.tile([7, 8], 25)):
        kept = bound_contributions(imp, t, norms)
        assert kept[:25].sum() == 20 and kept[25:].sum() == 20 and kept[:20].all() and kept[25:45].all()
        assert bound_contributions(imp, t, norms, max_reports=3).reshape(2, 25).sum(axis=1).tolist() == [3, 3]
    rank, group = np.tile(np.arange(25), 2), np.repeat([0, 1], 25)
    assert bound_sorted(np.zeros(0), rank, group, equal_norm=7).sum() == 40
    assert bound_sorted(np.tile([7, 8], 25), rank, group).sum() == 40
    assert bound_sorted(np.zeros(0), rank, group, equal_norm=7, max_reports=21).sum() == 42


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, None])
def test_bad_report_limit_refused(bad):
    with pytest.raises(ValueError, match="max_reports"):
        bound_contributions(np.zeros(2, int), np.arange(2), np.ones(2, int), max_reports=bad)


def test_kept_per_impression_is_the_budget_quotient_capped_at_20_reports():
    assert [kept_per_impression(c) for c in (1, 2, 3, 20, 21, 25, 300)] == [1, 2, 3, 20, 20, 20, 20]
    assert kept_per_impression(21, max_reports=25) == 21
    assert kept_per_impression(7, contribution_budget=20) == 10  # floor(20/7) = 2 fits 10 times


# ---- order: time, then tie breaker, then input position ------------------------------------------
def test_time_order_not_input_order_and_deterministic_ties():
    imp = np.array([7, 7, 7])
    kept = bound_contributions(imp, np.array([30, 10, 20]), np.array([40000, 40000, 20000]))
    assert kept.tolist() == [False, True, True]
    # equal times: the tie-breaker decides, whatever the input order
    tb = np.array([5, 1, 3], dtype=np.uint64)
    kept = bound_contributions(imp, np.zeros(3), np.array([40000, 40000, 30000]), tie_breaker=tb)
    assert kept.tolist() == [False, True, False]


@pytest.mark.parametrize("times", [np.array([4, 4, 4]), np.array([0.5, 0.5, 0.5]), np.array([4, 4, 4], dtype=np.uint64)])
@pytest.mark.parametrize("ids", [np.array([3, 3, 3]), np.array([2**62, 2**62, 2**62]),
                                 np.array(["a", "a", "a"], dtype=object)])
def test_ties_in_time_are_resolved_by_the_tie_breaker_on_every_sort_path(times, ids):
    # the tie breaker reverses the input order: the last record comes first and takes the budget
    norms = np.array([40000, 40000, 40000])
    kept = bound_contributions(ids, times, norms, tie_breaker=np.array([9, 5, 1], dtype=np.uint64))
    assert kept.tolist() == [False, False, True]
    # equal tie breakers: input position decides
    kept = bound_contributions(ids, times, norms, tie_breaker=np.array([1, 1, 1], dtype=np.uint64))
    assert kept.tolist() == [True, False, False]
    assert bound_contributions(ids, times, norms).tolist() == [True, False, False]


@pytest.mark.parametrize("ids", [np.array([7, 7]), np.array(["x", "x"], dtype=object), np.array([-1, -1])])
def test_time_comes_before_the_tie_breaker_on_the_slow_sort_path(ids):
    # float times take np.lexsort: the earlier time (0.5) wins although its tie breaker is larger
    kept = bound_contributions(ids, np.array([1.5, 0.5]), np.array([40000, 40000]), tie_breaker=np.array([0, 1]))
    assert kept.tolist() == [False, True]


# ---- mutants of the bounding, each as a named example -----------------------------------------------
def test_negative_times_are_ordered_by_time_not_by_magnitude():
    # mutant (t1 + t0) for (t1 - t0) in the packed key: impression 0 got 80,000
    kept = bound_contributions(np.array([0, 0, 1]), np.array([4, -4, -4]), np.array([40000, 40000, 40000]))
    assert kept.tolist() == [False, True, True]


@pytest.mark.parametrize("dtype", [np.int64, np.uint64, np.int32, np.uint8])
def test_times_are_offset_by_the_earliest_time_in_the_packed_key(dtype):
    # mutant "drop offset -= t0": time 5 spilled into the impression bits and both were kept
    kept = bound_contributions(np.array([0, 0]), np.array([2, 5], dtype=dtype), np.array([40000, 40000]))
    assert kept.tolist() == [True, False]
    # t0 = 6: adding it instead of subtracting merges impressions 0 and 1 (12 >> 1 == 13 >> 1 ...)
    ids, t = np.array([1, 0, 1, 0]), np.array([7, 6, 6, 7], dtype=dtype)
    assert sort_by_impression(ids, t)[0].tolist() == [1, 3, 2, 0]
    assert bound_contributions(ids, t, np.full(4, 40000)).tolist() == [False, True, True, False]
    # t0 = 1: offsets t + t0 = 2, 3 carry into the impression bit and merge impressions 0 and 1
    assert bound_contributions(np.array([0, 1]), np.array([1, 2], dtype=dtype), np.full(2, 40000)).tolist() == [True, True]


def test_fractional_float_times_are_not_truncated():
    # mutant `in "iu"` negated: 0.7 and 0.2 both became 0 and input order decided
    kept = bound_contributions(np.array([7, 7]), np.array([0.7, 0.2]), np.array([40000, 40000]))
    assert kept.tolist() == [False, True]


def test_ids_1_and_1_plus_2_to_the_62_are_different_impressions():
    # a weakened overflow check in the packed key merged them
    ids = np.array([1, 1 + 2**62, 1, 1 + 2**62])
    kept = bound_contributions(ids, np.array([0, 0, 1, 1]), np.array([40000, 40000, 40000, 25536]))
    assert kept.tolist() == [True, True, False, True]
    order, key = sort_by_impression(ids, np.array([0, 0, 1, 1]))
    assert order.tolist() == [0, 2, 1, 3]
    assert (key[1:] == key[:-1]).tolist() == [True, False, True]


def test_ids_mixing_zero_and_values_above_2_to_the_61():
    ids = np.array([2**63 - 1, 0, 2**61, 0, 2**63 - 1, 2**61], dtype=np.int64)
    t = np.array([1, 1, 0, 0, 0, 1])
    norms = np.array([40000, 40000, 40000, 40000, 40000, 40000])
    assert bound_contributions(ids, t, norms).tolist() == [False, False, True, True, True, False]
    uids = np.array([2**64 - 1, 0, 2**64 - 1], dtype=np.uint64)
    assert bound_contributions(uids, np.array([1, 0, 0]), norms[:3]).tolist() == [False, True, True]


def test_caller_arrays_are_never_modified():
    # mutant astype(copy=False): the caller's int64 times were shifted in place by t0
    cases = [
        (np.array([5, 5, 9, 9]), np.array([30, 10, 20, 20]), None),  # packed key
        (np.array([2**62, 2**62, 0, 0]), np.array([30, 10, 20, 20]), np.array([3, 2, 1, 0])),  # dense index
        (np.array([5, 5, 9, 9]), np.array([3.5, 1.0, 2.0, 2.0]), np.array([3, 2, 1, 0])),  # lexsort
        (np.array([-5, -5, 9, 9]), np.array([30, 10, 20, 20], dtype=np.uint64), None),
    ]
    for ids, times, tie in cases:
        contrib = np.array([[40000, 0], [30000, 0], [1, 2], [65536, 0]])
        before = [a.copy() for a in (ids, times, contrib)] + ([tie.copy()] if tie is not None else [])
        bound_contributions(ids, times, contrib, tie_breaker=tie)
        bound_contributions(ids, times, contrib[:, 0].copy(), tie_breaker=tie)
        after = [ids, times, contrib] + ([tie] if tie is not None else [])
        for b, a in zip(before, after, strict=True):
            assert np.array_equal(a, b) and a.dtype == b.dtype
    norms = np.array([3, 1, 2])
    bound_sorted(norms, np.array([0, 1, 2]), np.zeros(3, dtype=np.int64))
    assert norms.tolist() == [3, 1, 2]


# ---- real bugs found while writing these tests ------------------------------------------------------
def test_negative_entry_cannot_offset_an_entry_above_gamma():
    """Issue 13: non-negativity was checked on row sums, so one key received 70,000 > Gamma."""
    with pytest.raises(ValueError, match=r"entry must be an integer in \[0, Gamma = 65536\].*got 70000 at row 0, key 0"):
        bound_contributions(np.zeros(1, int), np.zeros(1, int), np.array([[70000, -10000]]))
    with pytest.raises(ValueError, match=r"got 70000 at row 0, key 1"):  # the first bad entry is named
        bound_contributions(np.zeros(1, int), np.zeros(1, int), np.array([[GAMMA, 70000, -1]]))
    with pytest.raises(ValueError, match=r"\[0, Gamma = 65536\].*got -1 at row 1, key 0"):
        bound_contributions(np.zeros(2, int), np.zeros(2, int), np.array([[1, 1], [-1, 5]]))
    with pytest.raises(ValueError, match=r"\[0, Gamma = 20\].*got 21 at row 0, key 1"):
        bound_contributions(np.zeros(1, int), np.zeros(1, int), np.array([[0, 21]]), contribution_budget=20)
    # the largest legal entry, alone, is kept
    assert bound_contributions(np.zeros(1, int), np.zeros(1, int), np.array([[GAMMA, 0]])).tolist() == [True]


def test_contribution_norms_are_int64_row_sums():
    for dtype in (np.uint64, np.uint16, np.int32, np.int64):
        big = min(GAMMA, np.iinfo(dtype).max)
        norms = contribution_norms(np.array([[1, 2], [big, 0]], dtype=dtype))
        assert norms.dtype == np.int64 and norms.tolist() == [3, big]
        norms = contribution_norms(np.array([7, np.iinfo(dtype).max], dtype=dtype))
        assert norms.dtype == np.int64 and norms.tolist() == [7, min(np.iinfo(dtype).max, GAMMA + 1)]


def test_a_norm_near_int64_max_is_dropped_not_wrapped_around():
    # used + norm overflowed int64 to a negative number, which "fit"
    assert one_impression([1, 2**63 - 1]) == [True, False]
    norms = np.array([1, 2**64 - 1, 5], dtype=np.uint64)
    assert bound_contributions(np.zeros(3, int), np.arange(3), norms).tolist() == [True, False, True]
    assert contribution_norms(np.array([2**63 - 1, 7]), 20).tolist() == [21, 7]


def test_uint64_times_above_2_to_the_63_are_sorted_exactly():
    # the packed key converted t0 = 2^63 to a C long: OverflowError
    times = np.array([2**63 + 5, 2**63, 2**63 + 1], dtype=np.uint64)
    kept = bound_contributions(np.array([1, 1, 1]), times, np.array([40000, 40000, 25536]))
    assert kept.tolist() == [False, True, True]
    small = np.array([250, 3], dtype=np.uint8)
    assert sort_by_impression(np.array([0, 0]), small)[0].tolist() == [1, 0]
    assert sort_by_impression(np.array([0, 0]), np.array([100, -100], dtype=np.int8))[0].tolist() == [1, 0]


def test_epoch_scale_times_in_microseconds_and_nanoseconds():
    us = 1_700_000_000_000_000
    for base in (us, us * 1000, -us * 1000):
        kept = bound_contributions(np.array([9, 9, 9]), np.array([base + 2, base, base + 1]), np.full(3, 30000))
        assert kept.tolist() == [False, True, True]
    # range above 2^62: no packed key, still exact
    t = np.array([2**62, -(2**62), 0])
    assert bound_contributions(np.zeros(3, int), t, np.full(3, 30000)).tolist() == [False, True, True]


# ---- refusals ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("contrib, match", [
    (np.array([1.0, 2.0]), "integers"),
    (np.array([[1.0, np.nan], [0.0, 0.0]]), "integers"),
    (np.array([np.inf, 1.0]), "integers"),
    (np.array([True, False]), "integers"),
    (np.array([1, 2], dtype=object), "integers"),
    (np.array([3, -1]), "non-negative"),
    (np.zeros((2, 2, 2), dtype=np.int64), "shape"),
])
def test_bad_contributions_refused(contrib, match):
    with pytest.raises(ValueError, match=match):
        bound_contributions(np.zeros(2, int), np.arange(2), contrib)


def test_scalar_and_mismatched_contributions_refused():
    with pytest.raises(ValueError, match="scalar"):
        bound_contributions(np.zeros(1, int), np.zeros(1, int), np.int64(5))
    with pytest.raises(ValueError, match="rows"):
        bound_contributions(np.zeros(3), np.zeros(3), np.zeros(2, dtype=np.int64))
    # an empty float array is an empty list of contributions, not a dtype error
    assert bound_contributions(np.zeros(0), np.zeros(0), np.zeros((0, 3))).tolist() == []


def test_mismatched_lengths_refused():
    with pytest.raises(ValueError, match="lengths"):
        bound_contributions(np.zeros(3), np.zeros(2), np.zeros(3, dtype=np.int64))
    with pytest.raises(ValueError, match="lengths"):
        bound_contributions(np.zeros(3), np.zeros(3), np.zeros(3, dtype=np.int64), tie_breaker=np.zeros(2))
    with pytest.raises(ValueError, match="1-D"):
        sort_by_impression(np.zeros((3, 1)), np.zeros(3))


@pytest.mark.parametrize("budget", [-1, 0, 2.0, 20.5, True, 2**32 + 1, "65536", None])
def test_bad_contribution_budget_refused(budget):
    with pytest.raises(ValueError, match="contribution_budget must be an integer"):
        bound_contributions(np.zeros(2, int), np.arange(2), np.array([1, 2]), contribution_budget=budget)
    with pytest.raises(ValueError, match="contribution_budget must be an integer"):
        bound_sorted(np.array([1, 2]), np.arange(2), np.zeros(2, int), budget)


def test_budget_limits_are_accepted():
    assert one_impression([1, 1], budget=1) == [True, False]
    assert one_impression([2**32, 1], budget=2**32) == [True, False]
    assert one_impression([5, 5], budget=np.int64(10)) == [True, True]


@pytest.mark.parametrize("ids, times, match", [
    (np.array([0.0, np.nan]), np.arange(2), "impression_ids must be finite"),
    (np.zeros(2), np.array([0.0, np.nan]), "conversion_times must be finite"),
    (np.zeros(2), np.array([0.0, np.inf]), "conversion_times must be finite"),
    (np.zeros(2), np.array(["2024-01-01", "NaT"], dtype="datetime64[s]"), "NaT"),
])
def test_nan_ids_and_non_finite_times_refused(ids, times, match):
    with pytest.raises(ValueError, match=match):
        bound_contributions(ids, times, np.array([1, 2]))


def test_nan_tie_breaker_refused():
    with pytest.raises(ValueError, match="tie_breaker must be finite"):
        bound_contributions(np.zeros(2), np.zeros(2), np.array([1, 2]), tie_breaker=np.array([np.nan, 1.0]))


def test_bound_sorted_refusals():
    rank, group = np.arange(3), np.zeros(3, dtype=np.int64)
    with pytest.raises(ValueError, match="norms must be 3"):
        bound_sorted(np.array([1, 2]), rank, group)
    with pytest.raises(ValueError, match="equal lengths"):
        bound_sorted(np.array([1, 2, 3]), rank, group[:2])
    with pytest.raises(ValueError, match="integers"):
        bound_sorted(np.array([0.5, 65536.9, 1.0]), rank, group)
    with pytest.raises(ValueError, match="non-negative"):
        bound_sorted(np.array([1, -2, 3]), rank, group)
    for bad in (-1, 2.0, True):
        with pytest.raises(ValueError, match="equal_norm"):
            bound_sorted(np.zeros(0), rank, group, equal_norm=bad)


def test_empty_input():
    assert bound_contributions(np.zeros(0, int), np.zeros(0, int), np.zeros(0, int)).tolist() == []
    rank, group = ranks_within_impression(np.zeros(0))
    assert rank.dtype == np.int64 and group.dtype == np.int64 and len(rank) == 0
    assert bound_sorted(np.zeros(0, int), rank, group).tolist() == []


def test_impression_order_is_the_sort_permutation():
    """impression_order (used by the error model and the statistics) sorts by (impression, time, tie, position)."""
    ids, t = np.array([9, 4, 9, 4, 9]), np.array([2, 7, 2, 1, 0])
    tie = np.array([5, 0, 3, 0, 0], dtype=np.uint64)
    assert impression_order(ids, t, tie).tolist() == [3, 1, 4, 2, 0]
    assert impression_order(ids, t).tolist() == [3, 1, 4, 0, 2]
    assert impression_order(ids, t.astype(float) / 2, tie).tolist() == [3, 1, 4, 2, 0]


def test_ranks_within_impression():
    rank, group = ranks_within_impression(np.array([4, 4, 4, 7, 9, 9]))
    assert rank.tolist() == [0, 1, 2, 0, 0, 1]
    assert group.tolist() == [0, 0, 0, 1, 2, 2]


# ---- properties -------------------------------------------------------------------------------------
ID_POOLS = {
    "small": [0, 1, 2, 3],
    "huge": [0, 1, 2**61, 2**61 + 1, 2**62, 2**63 - 1],  # mixing 0 with values >= 2^61
    "negative": [-(2**63), -5, 0, 7],
    "uint64": [0, 2**63, 2**64 - 1],
    "string": ["a", "b", "c"],
}


@st.composite
def capping_inputs(draw):
    """Records of a few impressions with colliding times of every kind, and a budget."""
    n = draw(st.integers(0, 40))
    id_kind = draw(st.sampled_from(sorted(ID_POOLS)))
    ids = draw(st.lists(st.sampled_from(ID_POOLS[id_kind]), min_size=n, max_size=n))
    dtype = {"uint64": np.uint64, "string": object}.get(id_kind, np.int64)
    time_kind = draw(st.sampled_from(["small", "epoch_us", "negative", "float", "epoch_float", "uint64", "uint64_high",
                                      "wide"]))
    base = {"small": 0, "epoch_us": 1_700_000_000_000_000, "negative": -(10**12), "float": 0.0,
            "epoch_float": 1.7e9, "uint64": 1000, "uint64_high": 2**63, "wide": 0}[time_kind]
    if time_kind == "wide":  # a range above 2^62 disables every packed key
        offsets = draw(st.lists(st.sampled_from([-(2**62), -1, 0, 2**62]), min_size=n, max_size=n))
    elif "float" in time_kind:
        offsets = draw(st.lists(st.sampled_from([-0.75, -0.5, 0.0, 0.25, 0.5, 1.0]), min_size=n, max_size=n))
    else:
        offsets = draw(st.lists(st.integers(0 if time_kind == "uint64_high" else -3, 3), min_size=n, max_size=n))
    times = np.array([base + o for o in offsets], dtype=np.uint64 if time_kind.startswith("uint64") else
                     (np.float64 if "float" in time_kind else np.int64))
    tie = draw(st.one_of(st.none(), st.lists(st.integers(0, 3), min_size=n, max_size=n).map(
        lambda v: np.array(v, dtype=np.uint64))))
    budget = draw(st.one_of(st.just(GAMMA), st.integers(1, 100)))
    max_reports = draw(st.sampled_from([20, 1, 2, 3, 7]))
    equal = draw(st.booleans())
    norm_values = st.one_of(st.integers(0, 2 * budget + 2),
                            st.sampled_from([0, budget // 2, budget - 1, budget, budget + 1]))
    if equal:
        norms = [draw(norm_values)] * n
    else:
        norms = draw(st.lists(norm_values, min_size=n, max_size=n))
    return (np.array(ids, dtype=dtype), times, tie, np.array(norms, dtype=np.int64).reshape(n), max(budget, 1),
            max_reports)


@given(inputs=capping_inputs())
def test_vectorized_alg1_equals_a_literal_sequential_loop(inputs):
    """Every sort path and both bounding paths agree with Alg. 1 run record by record (with the
    report limit), every impression's kept contributions have L1 norm <= the budget and at most
    ``max_reports`` of them are non-empty; the inputs are left unchanged."""
    ids, times, tie, norms, budget, max_reports = inputs
    copies = [ids.copy(), times.copy(), norms.copy()]
    kept = bound_contributions(ids, times, norms, contribution_budget=budget, tie_breaker=tie, max_reports=max_reports)
    assert kept.tolist() == sequential_alg1(ids, times, norms, budget, tie, max_reports).tolist()
    totals: dict = {}
    reports: dict = {}
    for i in np.flatnonzero(kept):
        totals[ids[i]] = totals.get(ids[i], 0) + int(norms[i])
        reports[ids[i]] = reports.get(ids[i], 0) + (int(norms[i]) > 0)
    assert all(v <= budget for v in totals.values())
    assert all(v <= max_reports for v in reports.values())
    assert all(np.array_equal(a, b) for a, b in zip(copies, [ids, times, norms], strict=True))


@given(inputs=capping_inputs(), k=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_per_key_rows_are_bounded_by_their_l1_norm(inputs, k, seed):
    """(n, K) rows with entries in [0, budget] are capped exactly like their row sums."""
    ids, times, tie, norms, budget, max_reports = inputs
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, budget + 1, size=(len(ids), k))
    kept = bound_contributions(ids, times, rows, contribution_budget=budget, tie_breaker=tie, max_reports=max_reports)
    assert kept.tolist() == sequential_alg1(ids, times, rows.sum(axis=1), budget, tie, max_reports).tolist()


@given(n_imp=st.integers(1, 8), n=st.integers(0, 120), count_limit=st.integers(1, 40),
       encoding=st.sampled_from(["linf", "l1", "baseline"]), seed=st.integers(0, 2**31),
       scale=st.floats(0.01, 1e4))
def test_every_impression_kept_total_within_budget(n_imp, n, count_limit, encoding, seed, scale):
    """For any encoder and any input, each impression's kept contributions have L1 norm <= 65,536."""
    rng = np.random.default_rng(seed)
    imp = rng.integers(0, n_imp, n)
    t = rng.integers(0, 5, n)
    vals = rng.lognormal(0, 2, (n, 2)) * scale
    qs = (QueryParams("a", 3.0, None if encoding == "l1" else 0.3),
          QueryParams("b", 50.0, None if encoding == "l1" else (0.7 if encoding == "linf" else 0.2)))
    params = Params(count_limit=count_limit, encoding=encoding, epsilon=1.0, slice_columns=(), queries=qs,
                    count_budget_fraction=0.5 if encoding == "baseline" else None)
    w = encode(vals, params, rng)
    kept = bound_contributions(imp, t, w)
    totals = np.bincount(imp[kept], weights=w[kept].sum(axis=1), minlength=n_imp)
    assert (totals <= GAMMA).all()
    assert (w[kept] >= 0).all()


@given(records=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3), st.integers(0, 3)), max_size=60),
       id_kind=st.sampled_from(["small", "huge", "negative", "string"]))
def test_sort_paths_agree_with_reference_lexsort(records, id_kind):
    """Packed-key fast paths and the lexsort fallback all give (impression, time, tie, position) order."""
    base = np.array([r[0] for r in records], dtype=np.int64)
    imp = {"small": base, "huge": base + 2**61, "negative": base - 3,
           "string": np.array([f"id{v}" for v in base], dtype=object)}[id_kind]
    t = np.array([r[1] for r in records], dtype=np.int64)
    tie = np.array([r[2] for r in records], dtype=np.uint64)
    order, key = sort_by_impression(imp, t, tie)
    ref = sorted(range(len(records)), key=lambda i: (imp[i], t[i], tie[i], i))
    assert order.tolist() == ref
    same = [imp[a] == imp[b] for a, b in zip(ref, ref[1:], strict=False)]
    assert (key[1:] == key[:-1]).tolist() == same


@given(spellings=st.lists(st.sampled_from(["7", "07", "0000007", "7.0", "7.00"]), min_size=1, max_size=12),
       others=st.lists(st.sampled_from(["8", "008", "x7", " 7", "+7", "7.5"]), max_size=8),
       count_limit=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_an_impression_spelled_several_ways_is_capped_once(spellings, others, count_limit, seed):
    """Alg. 1 keeps at most K(C) conversions (L1 <= Gamma) per impression, the impression being its
    canonical id (``araopt.io.ids``): zero padding or a ``.0`` from a re-export does not make a second
    one with a budget of its own."""
    from araopt.io.conversions import Conversions
    from araopt.io.ids import canonical_id_hash
    from araopt.mechanism.bounding import kept_per_impression
    from araopt.mechanism.measure import encode_and_bound

    rng = np.random.default_rng(seed)
    ids = list(rng.permutation(np.array(spellings + others, dtype=object)))
    n = len(ids)
    table = pa.table({"impression_id": pa.array(ids, pa.string()),
                      "conversion_time": pa.array(rng.integers(0, 10, n) * 1_000_000, pa.timestamp("us", tz="UTC")),
                      "s": rng.integers(0, 2, n), "value": rng.random(n) * 10})
    conversions = Conversions.from_table(table, ["s"], ["value"])
    params = Params(count_limit=count_limit, encoding="linf", epsilon=1.0, slice_columns=("s",),
                    queries=(QueryParams("value", 5.0, 1.0),))
    contributions, kept = encode_and_bound(conversions, params, simulation_seed=seed)
    canonical = canonical_id_hash(conversions.impression_id)
    for impression in np.unique(canonical):
        mine = canonical == impression
        assert contributions[mine & kept].sum() <= GAMMA
        assert (mine & kept).sum() == min(int(mine.sum()), kept_per_impression(count_limit))
    seven = canonical == canonical_id_hash(np.array([7]))[0]
    assert (seven & kept).sum() == min(len(spellings), kept_per_impression(count_limit))
