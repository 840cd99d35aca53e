"""Contribution bounding (Alg. 1): the worked example, equality with a sequential loop, the L1 cap."""
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from araopt import Params, QueryParams, bound_contributions, encode

GAMMA = 65536


def sequential_alg1(impression_ids, times, norms, budget=GAMMA):
    """Alg. 1 literally: per impression, in time order (ties by input position), keep if it fits."""
    kept = np.zeros(len(norms), dtype=bool)
    used = {}
    for i in sorted(range(len(norms)), key=lambda i: (impression_ids[i], times[i], i)):
        b = used.get(impression_ids[i], 0)
        if b + norms[i] <= budget:
            kept[i] = True
            used[impression_ids[i]] = b + norms[i]
    return kept


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


def test_time_order_not_input_order_and_deterministic_ties():
    imp = np.array([7, 7, 7])
    kept = bound_contributions(imp, np.array([30, 10, 20]), np.array([40000, 40000, 20000]))
    assert kept.tolist() == [False, True, True]
    # equal times: the tie-breaker decides, whatever the input order
    tb = np.array([5, 1, 3], dtype=np.uint64)
    kept = bound_contributions(imp, np.zeros(3), np.array([40000, 40000, 30000]), tie_breaker=tb)
    assert kept.tolist() == [False, True, False]


records = st.lists(st.tuples(st.integers(0, 6), st.integers(0, 5), st.integers(0, 70000)), min_size=0, max_size=80)


@given(records=records)
def test_vectorized_alg1_equals_sequential_loop(records):
    imp = np.array([r[0] for r in records], dtype=np.int64)
    t = np.array([r[1] for r in records], dtype=np.int64)
    norms = np.array([r[2] for r in records], dtype=np.int64)
    assert (bound_contributions(imp, t, norms) == sequential_alg1(imp, t, norms)).all()


@given(records=records)
def test_vectorized_alg1_equals_sequential_loop_equal_norms(records):
    imp = np.array([r[0] for r in records], dtype=np.int64)
    t = np.array([r[1] for r in records], dtype=np.int64)
    norm = records[0][2] if records else 1
    norms = np.full(len(records), norm, dtype=np.int64)
    assert (bound_contributions(imp, t, norms) == sequential_alg1(imp, t, norms)).all()


@given(n_imp=st.integers(1, 8), n=st.integers(0, 120), count_limit=st.integers(1, 40),
       encoding=st.sampled_from(["linf", "l1", "baseline"]), seed=st.integers(0, 2**31),
       scale=st.floats(0.01, 1e4))
def test_every_impression_kept_total_within_budget(n_imp, n, count_limit, encoding, seed, scale):
    """For any encoder and any input, each impression's kept contributions have L1 norm <= 65,536."""
    rng = np.random.default_rng(seed)
    imp = rng.integers(0, n_imp, n)
    t = rng.integers(0, 5, n)
    vals = rng.lognormal(0, 2, (n, 2)) * scale
    qs = (QueryParams("a", 3.0, None if encoding == "l1" else 0.3), QueryParams("b", 50.0, None if encoding == "l1" else (0.7 if encoding == "linf" else 0.2)))
    params = Params(count_limit=count_limit, encoding=encoding, epsilon=1.0, slice_columns=(), queries=qs,
                    count_budget_fraction=0.5 if encoding == "baseline" else None)
    w = encode(vals, params, rng)
    kept = bound_contributions(imp, t, w)
    totals = np.bincount(imp[kept], weights=w[kept].sum(axis=1), minlength=n_imp)
    assert (totals <= GAMMA).all()
    assert (w[kept] >= 0).all()


def test_mismatched_lengths_refused():
    import pytest
    with pytest.raises(ValueError, match="lengths"):
        bound_contributions(np.zeros(3), np.zeros(2), np.zeros(3, dtype=np.int64))
    with pytest.raises(ValueError, match="rows"):
        bound_contributions(np.zeros(3), np.zeros(3), np.zeros(2, dtype=np.int64))


@given(records=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3), st.integers(0, 3)), max_size=60),
       id_kind=st.sampled_from(["small", "huge", "negative", "string"]))
def test_sort_paths_agree_with_reference_lexsort(records, id_kind):
    """Packed-key fast paths and the lexsort fallback all give (impression, time, tie, position) order."""
    from araopt.bounding import sort_by_impression

    base = np.array([r[0] for r in records], dtype=np.int64)
    imp = {"small": base, "huge": base + 2**61, "negative": base - 3,
           "string": np.array([f"id{v}" for v in base], dtype=object)}[id_kind]
    t = np.array([r[1] for r in records], dtype=np.int64)
    tie = np.array([r[2] for r in records], dtype=np.uint64)
    order, key = sort_by_impression(imp, t, tie)
    ref = sorted(range(len(records)), key=lambda i: (imp[i], t[i], tie[i], i))
    assert order.tolist() == ref
    same = [imp[a] == imp[b] for a, b in zip(ref, ref[1:])]
    assert (key[1:] == key[:-1]).tolist() == same
