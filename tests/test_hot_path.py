"""The hot paths computed once (issue 30): the id hash carried from the grouping step, Alg. 1's order
from integer sort keys, the cached search coefficients and scipy.stats-free quantiles give exactly
what they replace."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from scipy import special, stats

from araopt.calibration.calendar import chi2_quantile
from araopt.io.conversions import Conversions, validate_table
from araopt.io.ids import ID_HASH, ID_SORT_KEY, canonical_id_hash, decimal_int64, id_sort_keys, with_sort_keys
from araopt.io.rowset import RowSetPart, conversion_row_ids, hashed_row_ids
from araopt.mechanism.bounding import sort_by_impression
from araopt.mechanism.keys import KeyDomain
from araopt.mechanism.measure import shard_sums
from araopt.mechanism.params import Params, QueryParams
from araopt.mechanism.sources import impression_slice_conflicts
from araopt.optimize.linf_search import QueryModel
from transforms.group import split_by_shard

IDS = ["b", "a", "007", "7", "é", "a", "-0", "0", "zz", "b", "١٢٣", "", "7", "a b"]


def _table(ids: list[str], seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    n = len(ids)
    raw = pa.table({"impression_id": ids,
                    "conversion_time": pa.array(rng.integers(0, 10, n) * 1_000_000, type=pa.timestamp("us", tz="UTC")),
                    "s": [f"s{i % 3}" for i in range(n)], "v": rng.random(n)})
    return validate_table(raw, ["s"], ["v"])[0]


def _canonical(v: str) -> tuple[int, int | str]:
    """The canonical id's order (``araopt.io.ids``): decimal ids as their integer first, then other strings."""
    mask, value = decimal_int64(pa.array([v]))
    return (0, int(value[0])) if mask[0] else (1, v)


def test_sort_keys_order_and_group_as_the_canonical_ids():
    """Alg. 1 caps an impression once however its id is spelled: "007", "7" and "7.0" are one key (as
    for the ledger, the shards and the arms); other strings keep their byte order after the integers."""
    ids = np.array([*IDS, "7.0", "0007", "-000"] * 3, dtype=object)
    keys = id_sort_keys(ids)
    assert keys.dtype.kind == "i"
    for i in range(len(ids)):
        for j in range(len(ids)):
            assert (keys[i] == keys[j]) == (_canonical(ids[i]) == _canonical(ids[j]))
            assert (keys[i] < keys[j]) == (_canonical(ids[i]) < _canonical(ids[j]))
    assert np.array_equal(id_sort_keys(pa.array(ids.tolist())), keys)  # Arrow strings: the same keys
    mixed = np.array([7, "007", "x", 3], dtype=object)  # an integer in an object array is its decimal string
    assert id_sort_keys(mixed).tolist() == [1, 1, 2, 0]
    ints = np.array([5, 3, 5], dtype=np.int64)
    assert id_sort_keys(ints) is ints or np.array_equal(id_sort_keys(ints), ints)


def test_decimal_parse_only_on_candidates_is_the_full_parse():
    text = pa.array(["imp-1", "12", "-007", "0x7b", " 1", "+1", "99999999999999999999", "-9223372036854775808",
                     "١٢٣", "", "-", "-a", "000"])
    mask, values = decimal_int64(text)
    assert mask.tolist() == [False, True, True, False, False, False, False, True, False, False, False, False, True]
    assert values[mask].tolist() == [12, -7, -9223372036854775808, 0]
    assert np.array_equal(canonical_id_hash(pa.array(["12", "012"])), canonical_id_hash(np.array([12, 12])))


def test_grouping_carries_the_id_hash_and_every_use_gets_the_same_values():
    valid = _table(IDS * 20)
    parts = [part for _, part in split_by_shard(valid, 4)]
    for part in parts:
        assert np.array_equal(part.column(ID_HASH).to_numpy(), canonical_id_hash(part.column("impression_id")))
        plain = part.drop_columns([ID_HASH])
        carried, fresh = Conversions.from_table(part, ["s"], ["v"]), Conversions.from_table(plain, ["s"], ["v"])
        assert np.array_equal(carried.record_keys(), fresh.record_keys())
        assert np.array_equal(carried.impression_sort_keys(), fresh.impression_sort_keys())
        rows = np.arange(len(carried))[::2]
        assert np.array_equal(carried.take(rows).record_keys(), fresh.take(rows).record_keys())
        assert np.array_equal(carried.with_in_period(None).id_hashes(), fresh.id_hashes())
        with_column, without = RowSetPart.of_table(part), RowSetPart.of_table(plain)
        assert np.array_equal(with_column.ids, without.ids) and np.array_equal(with_column.coarse, without.coarse)
        times = plain.column("conversion_time_us").to_numpy()
        assert np.array_equal(hashed_row_ids(fresh.id_hashes(), times),
                              conversion_row_ids(plain.column("impression_id"), times))


def test_shard_sort_keys_carried_give_what_each_step_computed_itself():
    """The impression-slice check ranks a shard's string ids once (``ID_SORT_KEY``); the check itself, a
    shard with conflicting rows, Alg. 1's order and the measured sums are the same as without the column."""
    ids = [f"i{k % 37}" for k in range(400)]
    valid = _table(ids, seed=4)
    slices = np.asarray(valid.column("s").to_numpy(zero_copy_only=False)).astype(object)
    slices[[5, 77, 300]] = "other"  # three rows disagree with their impression's first row
    valid = valid.set_column(valid.column_names.index("s"), "s", pa.array(slices))
    carried, keys = with_sort_keys(valid)
    assert carried.column(ID_SORT_KEY).to_numpy().tolist() == id_sort_keys(valid.column("impression_id")).tolist()
    assert keys.tolist() == id_sort_keys(valid.column("impression_id")).tolist()
    plain_conflicts = impression_slice_conflicts(valid, ["s"], ["s"], ["v"])
    assert plain_conflicts.sum() >= 3
    assert np.array_equal(impression_slice_conflicts(carried, ["s"], ["s"], ["v"]), plain_conflicts)
    rows = np.flatnonzero(~plain_conflicts)[:0:-1]  # a subset of the shard, reordered, keeps the ids' order
    sub, sub_plain = carried.take(pa.array(rows)), valid.take(pa.array(rows))
    a = Conversions.from_table(sub, ["s"], ["v"])
    b = Conversions.from_table(sub_plain, ["s"], ["v"])
    order_a, _ = sort_by_impression(a.impression_sort_keys(), a.conversion_time, a.record_keys())
    order_b, _ = sort_by_impression(b.impression_sort_keys(), b.conversion_time, b.record_keys())
    assert np.array_equal(order_a, order_b)
    params = Params(count_limit=2, encoding="linf", epsilon=8.0, slice_columns=("s",),
                    queries=(QueryParams("v", 0.5, 1.0),))
    domain = KeyDomain.from_slice_values(("s",), a.slices, params.query_columns)
    got, want = shard_sums(a, params, domain, simulation_seed=3), shard_sums(b, params, domain, simulation_seed=3)
    assert np.array_equal(got.histogram, want.histogram) and got.capped > 0
    assert (got.kept, got.capped, got.impressions) == (want.kept, want.capped, want.impressions)
    assert with_sort_keys(carried)[0] is carried  # a shard ranked once is not ranked again


def test_single_point_search_terms_are_the_array_terms():
    rng = np.random.default_rng(3)
    g = np.sort(rng.random(12)) * 10
    model = QueryModel(g, rng.random(12), rng.random(11), rng.random(11), np.cumsum(rng.random(12)), 0.5)
    for c in [-1.0, g[0], g[3], (g[3] + g[4]) / 2, g[-1], 11.0, *rng.random(20) * 10]:
        assert float(model.bias_at(np.float64(c))) == float(model.bias_at(np.array([c]))[0])
        assert float(model.rho_at(np.float64(c))) == float(model.rho_at(np.array([c]))[0])


@pytest.mark.parametrize("dof", [1.0, 2.0, 3.0, 6.0, 29.0])
def test_quantiles_without_scipy_stats_are_scipy_stats(dof):
    assert chi2_quantile(0.05, dof) == float(stats.chi2.ppf(0.05, dof))
    for tail in (0.025, 0.05, 0.1):
        assert float(special.ndtri(1.0 - tail)) == float(stats.norm.ppf(1.0 - tail))


def test_string_id_hash_is_pandas_hash_of_the_strings():
    """Hashed once per distinct id, without pandas' second factorization: the values of
    ``pd.util.hash_array`` over every row (non-decimal strings; decimal ones hash as their integer)."""
    rng = np.random.default_rng(5)
    words = ["b", "a", "é", "zz", "١٢٣", "", "a b", "0x7b", " 1", "+1", "imp-1", "😀"]
    ids = np.array([words[i] for i in rng.integers(0, len(words), 300)] + [f"imp-{i:08d}" for i in range(300)],
                   dtype=object)
    assert np.array_equal(canonical_id_hash(ids), pd.util.hash_array(ids))
    assert np.array_equal(canonical_id_hash(pa.array(ids.tolist())), pd.util.hash_array(ids))


def test_categorical_slices_give_the_statistics_and_calibration_of_plain_ones():
    """The Beam steps read slices as categoricals (codes + distinct values) and order impressions by their
    integer sort keys: the statistics and calibration cells are bit for bit those of plain object slices."""
    from araopt.calibration.accumulator import candidates_statistics, day_blocks
    from araopt.mechanism.keys import register_slices
    from araopt.optimize.statistics import StatisticsSpec, compute_statistics_in_memory

    rng = np.random.default_rng(9)
    n = 3000
    raw = pa.table({"impression_id": [f"imp-{i}" for i in rng.integers(0, 700, n)],
                    "conversion_time": pa.array(rng.integers(0, 5 * 86_400, n) * 1_000_000,
                                                type=pa.timestamp("us", tz="UTC")),
                    "campaign": [f"c{i}" for i in rng.integers(0, 6, n)], "geo": [["US", "é", ""][i] for i in
                                                                                   rng.integers(0, 3, n)],
                    "v": rng.lognormal(2, 1, n), "w": rng.integers(0, 5, n).astype(float)})
    valid = validate_table(raw, ["campaign", "geo"], ["v", "w"])[0]
    plain = Conversions.from_table(valid, ["campaign", "geo"], ["v", "w"])
    categorical = Conversions.from_table(valid, ["campaign", "geo"], ["v", "w"], categorical_slices=True)
    assert isinstance(categorical.slices["geo"], pd.Categorical)
    columns = [categorical.slices[c] for c in ("campaign", "geo")]
    registry_a: dict = {}
    registry_b: dict = {}
    assert np.array_equal(register_slices(columns, registry_a, n),
                          register_slices([np.asarray(c) for c in columns], registry_b, n))
    assert registry_a == registry_b
    spec = StatisticsSpec(("campaign", "geo"), ("v", "w"), max_count_limit=5)
    a, b = compute_statistics_in_memory(categorical, spec), compute_statistics_in_memory(plain, spec)
    for name in ("rank_counts", "rank_sums", "hist_count", "hist_sum", "hist_sumsq", "global_sum", "impression_sizes"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    params = Params(count_limit=2, encoding="linf", epsilon=8.0, slice_columns=("campaign", "geo"),
                    queries=(QueryParams("v", 20.0, 0.5), QueryParams("w", 3.0, 0.5)))
    (x,), (y,) = (candidates_statistics(c, [(params, "p")], day_blocks(c)) for c in (categorical, plain))
    assert x.slice_keys == y.slice_keys and np.array_equal(x.cells, y.cells)


def test_distinct_count_is_the_number_of_distinct_values():
    from araopt.mechanism.measure import distinct_count

    rng = np.random.default_rng(2)
    for keys in (rng.integers(0, 50, 300), rng.integers(0, 2**40, 300), np.array([], dtype=np.int64),
                 rng.integers(0, 5, 10).astype(np.uint64), np.array([-3, 5, -3]), np.array(["b", "a", "b"], dtype=object)):
        assert distinct_count(keys) == len(set(keys.tolist()))


def test_sort_keys_label_impressions_in_the_order_the_ids_first_appear():
    """The calibration labels impressions by ``pd.factorize`` of their sort keys: the labels of the
    canonical ids ("007" and "7" one impression)."""
    ids = np.array([IDS[i] for i in np.random.default_rng(6).integers(0, len(IDS), 500)], dtype=object)
    conv = Conversions.from_table(_table(list(ids)), ["s"], ["v"])
    assert np.array_equal(pd.factorize(conv.impression_sort_keys(), sort=False)[0],
                          pd.factorize(canonical_id_hash(conv.impression_id), sort=False)[0])
