"""Specification of araopt.split: train = earlier part of the log by time, test = the later part."""
from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from araopt.data.split import parse_cut_time, quantile_cut, split_by_time, split_table
from araopt.data.synthetic import PRESETS, write_synthetic

T0 = datetime(2024, 1, 1, tzinfo=UTC)


def log(times_s: list[int], ids: list[int] | None = None) -> pa.Table:
    n = len(times_s)
    return pa.table({
        "impression_id": pa.array(ids if ids is not None else list(range(n)), pa.int64()),
        "conversion_time": pa.array([T0 + timedelta(seconds=s) for s in times_s], pa.timestamp("us", tz="UTC")),
        "partner_id": pa.array([f"p{i % 3}" for i in range(n)]),
        "value": pa.array(np.arange(n, dtype=float)),
    })


def read(path: Path) -> pa.Table:
    return ds.dataset(path, format="parquet").to_table()


def test_fraction_split_puts_the_earliest_rows_in_train(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    times = rng.permutation(1000).tolist()  # distinct, unsorted
    table = log(times)
    pq.write_table(table, tmp_path / "in.parquet")
    result = split_by_time(tmp_path / "in.parquet", tmp_path / "out", train_fraction=0.7)
    train, test = read(tmp_path / "out" / "train"), read(tmp_path / "out" / "test")
    assert (result.train_rows, result.test_rows) == (train.num_rows, test.num_rows) == (700, 300)
    assert max(train["conversion_time"].to_pylist()) < min(test["conversion_time"].to_pylist())
    assert result.cut_time == T0 + timedelta(seconds=700)
    assert train.schema.equals(table.schema) and test.schema.equals(table.schema)
    assert sorted(train["impression_id"].to_pylist() + test["impression_id"].to_pylist()) == list(range(1000))
    manifest = json.loads((tmp_path / "out" / "train" / "_manifest.json").read_text())
    assert manifest["rows"] == 700 and manifest["rule"] == "train: time < cut; test: time >= cut"


def test_equal_times_never_straddle_the_cut() -> None:
    table = log([0, 1, 1, 1, 1, 2])
    cut = quantile_cut(table, 0.5)
    assert cut == T0 + timedelta(seconds=1)
    train, test = split_table(table, cut)
    assert train.num_rows == 1 and test.num_rows == 5


def test_explicit_cut_time(tmp_path: Path) -> None:
    table = log(list(range(0, 100_000, 1000)))
    cut = parse_cut_time("2024-01-01T10:00:00")  # naive = UTC
    result = split_by_time(table, tmp_path / "o", cut_time=cut)
    assert result.train_rows == 36 and result.test_rows == 64  # 0..35000 s < 36000 s
    assert parse_cut_time("2024-01-01T11:00:00+01:00") == cut
    assert parse_cut_time("2024-01-02") == T0 + timedelta(days=1)


def test_split_on_impression_time_keeps_impressions_whole(tmp_path: Path) -> None:
    write_synthetic(tmp_path / "syn", PRESETS["synth-travel"], seed=1, scale=0.05, days=3, splits=("train",))
    src = tmp_path / "syn" / "train"  # date=... partitions; the partition key must not become a column
    split_by_time(src, tmp_path / "o", train_fraction=0.5, time_column="impression_time")
    train, test = read(tmp_path / "o" / "train"), read(tmp_path / "o" / "test")
    assert "date" not in train.column_names
    assert not set(train["impression_id"].to_pylist()) & set(test["impression_id"].to_pylist())
    assert train.num_rows + test.num_rows == ds.dataset(src).count_rows()
    # on conversion_time the same log does split impressions (so the option matters)
    split_by_time(src, tmp_path / "o2", train_fraction=0.5)
    a, b = read(tmp_path / "o2" / "train"), read(tmp_path / "o2" / "test")
    assert set(a["impression_id"].to_pylist()) & set(b["impression_id"].to_pylist())


def test_bad_split_requests(tmp_path: Path) -> None:
    table = log([3, 1, 2])
    for kwargs, match in (
        ({"train_fraction": 0.0}, "strictly between 0 and 1"),
        ({"train_fraction": 1.0}, "strictly between 0 and 1"),
        ({}, "exactly one"),
        ({"train_fraction": 0.5, "cut_time": T0}, "exactly one"),
        ({"train_fraction": 0.5, "time_column": "nope"}, "no column 'nope'"),
        ({"train_fraction": 0.5, "time_column": "value"}, "must be a timestamp"),
    ):
        with pytest.raises(ValueError, match=match):
            split_by_time(table, tmp_path / "x", **kwargs)
    with_null = table.set_column(1, "conversion_time", pa.array([T0, None, T0], pa.timestamp("us", tz="UTC")))
    with pytest.raises(ValueError, match="null"):
        split_by_time(with_null, tmp_path / "x", train_fraction=0.5)
    with pytest.raises(ValueError, match="ISO-8601"):
        parse_cut_time("yesterday")
    with pytest.raises(ValueError, match="does not exist"):
        split_by_time(tmp_path / "missing", tmp_path / "x", train_fraction=0.5)


def test_existing_output_is_refused_unless_overwrite(tmp_path: Path) -> None:
    table = log(list(range(10)))
    split_by_time(table, tmp_path / "o", train_fraction=0.5)
    with pytest.raises(ValueError, match="already holds data"):
        split_by_time(table, tmp_path / "o", train_fraction=0.3)
    result = split_by_time(table, tmp_path / "o", train_fraction=0.3, overwrite=True)
    assert result.train_rows == 3 and read(tmp_path / "o" / "train").num_rows == 3
