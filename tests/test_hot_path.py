"""The hot paths computed once (issue 30): the id hash carried from the grouping step, Alg. 1's order
from integer sort keys, the cached search coefficients and scipy.stats-free quantiles give exactly
what they replace."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from scipy import special, stats

from araopt.calibration.calendar import chi2_quantile
from araopt.io.conversions import Conversions, validate_table
from araopt.io.ids import ID_HASH, canonical_id_hash, decimal_int64, id_sort_keys
from araopt.io.rowset import RowSetPart, conversion_row_ids, hashed_row_ids
from araopt.mechanism.bounding import sort_by_impression
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


def test_sort_keys_order_and_group_exactly_as_the_ids():
    ids = np.array(IDS * 3, dtype=object)
    keys = id_sort_keys(ids)
    assert keys.dtype.kind == "i"
    for i in range(len(ids)):
        for j in range(len(ids)):
            assert (keys[i] == keys[j]) == (ids[i] == ids[j])  # "007" and "7" stay two ids in Alg. 1's order
            assert (keys[i] < keys[j]) == (ids[i] < ids[j])
    times = np.arange(len(ids))[::-1].astype(np.int64) % 4
    tie = np.arange(len(ids), dtype=np.uint64)[::-1].copy()
    order_ids, _ = sort_by_impression(ids, times, tie)
    order_keys, _ = sort_by_impression(keys, times, tie)
    assert np.array_equal(order_ids, order_keys)
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
