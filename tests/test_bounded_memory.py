"""Memory bounded by a shard or an id range, whatever the input (issue 30): grouped shards handed
between stages as their spill files (``transforms.group.ShardFiles``), and the release ledger's row
sets merged from sorted runs and compared range by range (``araopt.io.rowset``)."""
from __future__ import annotations

import os

import apache_beam as beam
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from araopt.io.ids import ID_SORT_KEY, id_sort_keys
from araopt.io.rowset import (
    RANGE_BITS,
    Released,
    RowSet,
    RowSetPart,
    SpilledRowSet,
    range_chunks,
    released_in,
    sorted_unique,
)
from transforms.group import ShardFiles, shard_table
from transforms.validate import COUNTS, GROUPED, ReadAndValidate

SLICES, VALUES = ("campaign", "geo"), ("value",)


def _conflicting_log(tmp_path, n: int = 400, string_ids: bool = False) -> list[str]:
    """Impressions over three files; every 7th impression's second row changes campaign (rejected)."""
    rng = np.random.default_rng(5)
    imp = np.repeat(np.arange(n), 3)
    campaign = np.array([f"c{i % 5}" for i in imp], dtype=object)
    second = (np.arange(len(imp)) % 3 == 1) & (imp % 7 == 0)
    campaign[second] = "other"
    ids = [f"imp-{i * 7919 % n}" for i in imp] if string_ids else imp
    df = pd.DataFrame({"impression_id": ids, "conversion_time": pd.to_datetime(np.arange(len(imp)), unit="s", utc=True),
                       "campaign": campaign, "geo": imp % 3, "value": rng.uniform(1, 9, len(imp)).round(2)})
    paths = []
    for i in range(3):
        paths.append(str(tmp_path / f"part-{i}.parquet"))
        pq.write_table(pa.Table.from_pandas(df.iloc[i::3], preserve_index=False), paths[-1])
    return paths


@pytest.mark.parametrize("shard_files", [False, True])
def test_shards_as_spill_files_hold_the_rows_the_shards_read_back_hold(tmp_path, shard_files):
    """The same kept rows per shard (conflicting rows left out: their shards rewritten to a new spill
    file) and the same accounting, whether the grouped shards are tables or their spill files."""
    paths = _conflicting_log(tmp_path)
    reference = pa.concat_tables([pq.read_table(p) for p in paths]).to_pandas()
    rejected = reference[reference["campaign"] == "other"]
    with TestPipeline() as p:
        read = p | ReadAndValidate(paths, SLICES, VALUES, num_shards=4, spill_dir=str(tmp_path / "spill"),
                                   shard_files=shard_files)
        kinds_seen = read[GROUPED] | beam.Map(lambda item: type(item[1]).__name__) | beam.Distinct()
        assert_that(kinds_seen, equal_to(["ShardFiles" if shard_files else "Table"]), label="kinds")
        values = read[GROUPED] | beam.FlatMap(lambda item: shard_table(item[1]).column("value").to_pylist())
        kept = reference[reference["campaign"] != "other"]["value"].tolist()
        assert 0 < len(rejected) < len(reference)
        assert_that(values, equal_to(kept), label="kept")
        assert_that(read[COUNTS] | beam.Map(lambda c: (c.rows_read, c.rows_rejected)),
                    equal_to([(len(reference), len(rejected))]), label="counts")


@pytest.mark.parametrize("shard_files", [False, True])
def test_grouped_shards_carry_their_ids_ranked_once(tmp_path, shard_files):
    """String ids are ranked once per shard by the impression-slice check (``ID_SORT_KEY``: a column of
    the shard's table, or a file beside its spill files) and every consumer reads the ranks that
    ``id_sort_keys`` gives its rows, also for a shard rewritten without its conflicting rows."""
    paths = _conflicting_log(tmp_path, string_ids=True)

    def ranks_as_computed(item):
        table = shard_table(item[1])
        assert ID_SORT_KEY in table.column_names
        assert table.column(ID_SORT_KEY).to_pylist() == id_sort_keys(table.column("impression_id")).tolist()
        return table.num_rows

    with TestPipeline() as p:
        read = p | ReadAndValidate(paths, SLICES, VALUES, num_shards=4, spill_dir=str(tmp_path / "spill"),
                                   shard_files=shard_files)
        rows = read[GROUPED] | beam.Map(ranks_as_computed) | beam.CombineGlobally(sum)
        assert_that(rows, equal_to([3 * 400 - 400 // 7 - 1]))


def test_shard_files_read_in_name_order_whatever_order_they_are_listed(tmp_path):
    a = pa.table({"x": [1, 2]})
    b = pa.table({"x": [3]})
    names = []
    for name, table in (("b.arrow", b), ("a.arrow", a)):
        names.append(str(tmp_path / name))
        with pa.ipc.new_file(names[-1], table.schema) as writer:
            writer.write_table(table)
    assert shard_table(ShardFiles(tuple(names))).column("x").to_pylist() == [1, 2, 3]
    assert shard_table(a) is a


def _parts(rng, sizes, space):
    """Unsorted parts with repeats inside and across them (ids drawn from ``space``)."""
    out = []
    for i, n in enumerate(sizes):
        ids = rng.choice(space, n).astype(np.uint64)
        coarse = rng.choice(space // 4 + 1, n).astype(np.uint64) * np.uint64(4)
        minute = rng.choice(space // 8 + 1, n).astype(np.uint64) * np.uint64(8)
        out.append(RowSetPart(ids, 100 + i, 200 + 3 * i, coarse, minute))
    return out


def test_row_sets_merged_from_runs_on_disk_are_the_merged_row_sets(tmp_path):
    rng = np.random.default_rng(11)
    space = rng.integers(0, 2**64 - 1, 50_000, dtype=np.uint64, endpoint=True)
    space[:3] = [0, 2**64 - 1, 1 << (64 - RANGE_BITS)]  # the extremes and a range's first id
    parts = _parts(rng, [0, 1, 7000, 30_000, 12_345], space)
    parts[1] = RowSetPart(space[:3].copy(), None, None, None)  # no time range, no coarse or minute ids
    exact, coarse, minute = SpilledRowSet.merge_runs([p.sorted() if i % 2 else p for i, p in enumerate(parts)],
                                                     str(tmp_path / "ids"))
    want, want_coarse = RowSet.merge(parts), RowSet.merge(p.coarse_part() for p in parts)
    want_minute = RowSet.merge(p.minute_part() for p in parts)
    for got, ref in ((exact, want), (coarse, want_coarse), (minute, want_minute)):
        assert np.array_equal(np.concatenate(list(got.chunks())), ref.ids)
        assert len(got) == len(ref) and (got.first_time_us, got.last_time_us) == (100, 212)
        back = RowSet.from_parquet_bytes(got.to_parquet_bytes())
        assert np.array_equal(back.ids, ref.ids) and (back.first_time_us, back.last_time_us) == (100, 212)
    assert sorted(os.listdir(tmp_path / "ids" / "exact")) == [f"range-{i:03d}.u64" for i in range(1 << RANGE_BITS)]


def test_released_in_counts_range_by_range_what_whole_sets_count():
    rng = np.random.default_rng(12)
    space = rng.integers(0, 2**64 - 1, 20_000, dtype=np.uint64, endpoint=True)
    rows = RowSet(sorted_unique(rng.choice(space, 9000)), 0, 1)
    earlier = [sorted_unique(rng.choice(space, n)) for n in (5000, 0, 15_000, 3)]
    found = released_in(rows, earlier)
    times = sum(np.isin(rows.ids, e).astype(np.int64) for e in earlier)
    assert found.before == int(np.count_nonzero(times)) > 0
    assert found.most == int(times.max()) == 2
    assert found.per_set == tuple(int(np.isin(rows.ids, e).sum()) for e in earlier)
    assert released_in(rows, []) == Released(0, 0, ())
    assert released_in(RowSet(rows.ids[:0], None, None), earlier[:1]) == Released(0, 0, (0,))
    assert released_in(rows, [RowSet(earlier[0], 0, 1)]).before == found.per_set[0]
    assert sum(len(c) for c in range_chunks(rows.ids)) == len(rows)


def _period_and_lookback() -> tuple[pd.DataFrame, pd.DataFrame]:
    """Impressions 0..149 convert in the period; 100..299 in the lookback (150..299 only there)."""
    rng = np.random.default_rng(8)

    def rows(imps, start_s):
        imp = np.repeat(imps, 3)
        return pd.DataFrame({"impression_id": [f"imp-{i}" for i in imp],
                             "conversion_time": pd.to_datetime(start_s + rng.integers(0, 86_400, len(imp)), unit="s",
                                                               utc=True),
                             "campaign": [f"c{i % 5}" for i in imp], "geo": imp % 3,
                             "value": rng.uniform(1, 9, len(imp)).round(2)})

    return rows(np.arange(150), 10 * 86_400), rows(np.arange(100, 300), 5 * 86_400)


def _log_with_lookback(tmp_path) -> tuple[list[str], list[str], pd.DataFrame, pd.DataFrame]:
    period, lookback = _period_and_lookback()
    paths = []
    for name, frame in (("period", period), ("lookback", lookback)):
        paths.append(str(tmp_path / f"{name}.parquet"))
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), paths[-1])
    return [paths[0]], [paths[1]], period, lookback


@pytest.mark.parametrize("shard_files", [False, True])
def test_spill_file_shards_keep_the_lookback_of_the_periods_impressions_only(tmp_path, shard_files):
    """Shards handed on as spill files (the statistics and calibration read them) keep lookback rows only
    of impressions with a period row; shards of rows (measure counts every lookback row) keep them all."""
    period_paths, lookback_paths, period, lookback = _log_with_lookback(tmp_path)
    with TestPipeline() as p:
        read = p | ReadAndValidate(period_paths, SLICES, VALUES, num_shards=4, spill_dir=str(tmp_path / "spill"),
                                   lookback_paths=lookback_paths, shard_files=shard_files)
        ids = read[GROUPED] | beam.FlatMap(lambda item: shard_table(item[1]).column("impression_id").to_pylist())
        wanted = period["impression_id"].tolist() + (
            lookback["impression_id"][lookback["impression_id"].isin(period["impression_id"])].tolist()
            if shard_files else lookback["impression_id"].tolist())
        assert_that(ids, equal_to(wanted))


def test_lookback_rows_of_impressions_without_a_period_row_change_no_statistics_or_calibration():
    """What the spill-file shards leave out: the statistics and the calibration cells are the same bit for bit."""
    from araopt.calibration.accumulator import candidates_statistics, day_blocks
    from araopt.io.conversions import IN_PERIOD, Conversions, validate_table
    from araopt.mechanism.params import Params, QueryParams
    from araopt.optimize.statistics import StatisticsSpec, compute_statistics_in_memory

    period, lookback = _period_and_lookback()
    period_rows, lookback_rows = (validate_table(pa.Table.from_pandas(f, preserve_index=False), SLICES, VALUES)[0]
                                  for f in (period, lookback))

    def joined(earlier: pa.Table) -> Conversions:
        table = pa.concat_tables([period_rows, earlier])
        flags = np.r_[np.ones(period_rows.num_rows, dtype=bool), np.zeros(earlier.num_rows, dtype=bool)]
        return Conversions.from_table(table.append_column(IN_PERIOD, pa.array(flags)), SLICES, VALUES)

    whole = joined(lookback_rows)
    of_period = np.isin(lookback_rows.column("impression_id").to_numpy(zero_copy_only=False), period["impression_id"])
    trimmed = joined(lookback_rows.filter(pa.array(of_period)))
    assert 0 < len(trimmed) - period_rows.num_rows < len(whole) - period_rows.num_rows
    spec = StatisticsSpec(SLICES, VALUES, max_count_limit=4)
    a, b = compute_statistics_in_memory(whole, spec), compute_statistics_in_memory(trimmed, spec)
    for name in ("rank_counts", "rank_sums", "hist_count", "hist_sum", "hist_sumsq", "global_sum", "impression_sizes",
                 "cluster_sizes"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    params = Params(count_limit=2, encoding="linf", epsilon=8.0, slice_columns=SLICES,
                    queries=(QueryParams("value", 5.0, 1.0),))
    (x,), (y,) = (candidates_statistics(c, [(params, "p")], day_blocks(c)) for c in (whole, trimmed))
    assert x.num_conversions == y.num_conversions and np.array_equal(x.cells, y.cells)


def test_shards_are_sized_by_the_input_and_its_lookback_together():
    """A shard holds the input's rows and their lookback's: ~250k rows each whatever the lookback."""
    from transforms.io import ROWS_PER_SHARD, Footer, InputFiles, auto_shards

    day, month = (InputFiles((Footer("x", pa.schema([]), rows),), pa.schema([])) for rows in (1_000_000, 30_000_000))
    assert auto_shards(day) == 16  # the minimum
    assert auto_shards(day, month) == -(-31_000_000 // ROWS_PER_SHARD) == 124
