"""Conversion-date partitions as inputs: a folder of symbolic links to ``date=`` folders is read like the
folders themselves, and ``measure --lookback-days N`` reads the N partitions before the input's first
day (across a month boundary, which one glob cannot name), as ``nightly --lookback-days`` does."""
from __future__ import annotations

import datetime as dt
import json
import os

import numpy as np
import pandas as pd
import pytest

from araopt.io import outputs
from araopt.io.partitions import files_in_days, partition_day, partition_root
from araopt.mechanism.params import Params, QueryParams
from araopt.version import ParameterVersion
from transforms.io import check_input, match_files

DAYS = [dt.date(2026, 10, 29) + dt.timedelta(days=i) for i in range(6)]  # Oct 29 .. Nov 3


def _day(path):
    day = partition_day(path)
    return None if day is None else dt.date.fromisoformat(day)


def write_days(root, seed=0, per_day=300, impressions=1500):
    """One joined log cut by conversion date: impressions convert on several days (so a lookback matters)."""
    rng = np.random.default_rng(seed)
    for day in DAYS:
        imp = rng.integers(0, impressions, per_day)
        start = pd.Timestamp(day.isoformat(), tz="UTC")
        frame = pd.DataFrame({
            "impression_id": imp.astype("int64"),
            "conversion_time": start + pd.to_timedelta(rng.integers(0, 86_400, per_day), unit="s"),
            "s": np.array(["a", "b", "c"], dtype=object)[imp % 3],
            "v": rng.lognormal(2.0, 1.0, per_day),
        })
        os.makedirs(root / f"date={day}")
        frame.to_parquet(root / f"date={day}" / "part-0.parquet")
    return root


def linked_days(root, links):
    """A folder of symbolic links to the partitions of ``root`` (how an operator assembles a lookback)."""
    links.mkdir()
    for day in DAYS:
        os.symlink(root / f"date={day}", links / f"date={day}")
    return links


def test_a_folder_of_symlinked_partitions_is_read_like_the_partitions(tmp_path):
    logs = write_days(tmp_path / "logs")
    links = linked_days(logs, tmp_path / "links")
    got = match_files(str(links))
    assert [os.path.relpath(p, links) for p in got] == [f"date={d}/part-0.parquet" for d in DAYS]
    assert [_day(p) for p in match_files(str(links / "date=2026-11-0*"))] == DAYS[3:]
    assert check_input(str(links), ("s",), ("v",)).rows == 300 * len(DAYS)


def test_a_link_cycle_is_walked_once(tmp_path):
    logs = write_days(tmp_path / "logs")
    os.symlink(logs, logs / f"date={DAYS[0]}" / "back")  # a link back to the root
    assert len(match_files(str(logs))) == len(DAYS)


def test_partition_days_span_a_month_boundary(tmp_path):
    paths = match_files(str(write_days(tmp_path / "logs")))
    assert [_day(p) for p in files_in_days(paths, dt.date(2026, 10, 30), dt.date(2026, 11, 1))] == DAYS[1:4]
    assert partition_root(paths[0]) == str(tmp_path / "logs")
    assert partition_root("date=2026-11-01/p.parquet") == "." and partition_root("logs/p.parquet") is None
    assert _day("logs/xdate=2026-11-01/p.parquet") is None  # a folder named exactly date=...


def test_measure_lookback_days_selects_the_days_before_the_input(tmp_path):
    from transforms.io import lookback_partitions

    logs = write_days(tmp_path / "logs")
    inputs = check_input(str(logs / f"date={DAYS[-1]}"), ("s",), ("v",))
    files, what = lookback_partitions(inputs, 4)
    assert [_day(p) for p in files] == DAYS[1:5]  # Oct 30 .. Nov 2: the month boundary crossed
    assert what == f"--lookback-days 4: {DAYS[1]}..{DAYS[4]} under {logs}"
    assert [_day(p) for p in lookback_partitions(inputs, 30)[0]] == DAYS[:5]  # what there is
    assert lookback_partitions(inputs, 0)[0] == []
    two_days = check_input(str(logs / "date=2026-11-0[23]"), ("s",), ("v",))
    assert [_day(p) for p in lookback_partitions(two_days, 2)[0]] == DAYS[2:4]  # before the first day


def test_measure_lookback_days_before_the_first_partition_is_no_lookback_and_says_so(tmp_path, capsys):
    from pipelines.measure import load_lookback

    logs = write_days(tmp_path / "logs")
    inputs = check_input(str(logs / f"date={DAYS[0]}"), ("s",), ("v",))
    assert load_lookback(None, inputs, ("s",), ("v",), 7) is None
    assert f"--lookback-days 7: {DAYS[0] - dt.timedelta(days=7)}..{DAYS[0] - dt.timedelta(days=1)} under {logs}: " \
           "no partitions found, so no lookback" in capsys.readouterr().err
    later = load_lookback(None, check_input(str(logs / f"date={DAYS[2]}"), ("s",), ("v",)), ("s",), ("v",), 7)
    assert later is not None and [_day(p) for p in later.paths] == DAYS[:2] and later.rows == 600


def test_measure_lookback_days_is_refused_without_partitions_or_with_lookback(tmp_path, capsys):
    from pipelines import measure as measure_pipeline

    logs = write_days(tmp_path / "logs")
    flat = tmp_path / "flat.parquet"
    pd.read_parquet(logs / f"date={DAYS[-1]}").to_parquet(flat)
    ParameterVersion(_params()).save(tmp_path / "p.json")
    base = ["--params", str(tmp_path / "p.json"), "--simulation-seed", "1", "--no-progress"]
    assert measure_pipeline.run(["--input", str(flat), "--lookback-days", "3", "--output", str(tmp_path / "o"),
                                 *base]) == 2
    assert "--lookback-days needs an input in date=YYYY-MM-DD/ partition folders" in capsys.readouterr().err
    assert measure_pipeline.run(["--input", str(logs / f"date={DAYS[-1]}"), "--lookback-days", "3", "--lookback",
                                 str(logs / f"date={DAYS[0]}"), "--output", str(tmp_path / "o"), *base]) == 2
    assert "pass --lookback or --lookback-days, not both" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def _params():
    return Params(count_limit=2, encoding="linf", epsilon=8.0, slice_columns=("s",),
                  queries=(QueryParams("v", 20.0, 1.0),))


@pytest.mark.slow
def test_measure_lookback_days_equals_the_explicit_lookback_also_through_links(tmp_path, capsys):
    from pipelines import measure as measure_pipeline

    logs = write_days(tmp_path / "logs")
    links = linked_days(logs, tmp_path / "links")
    explicit = tmp_path / "explicit"  # the four days before Nov 3, named one by one
    for day in DAYS[1:5]:
        os.makedirs(explicit / f"date={day}")
        os.link(logs / f"date={day}" / "part-0.parquet", explicit / f"date={day}" / "part-0.parquet")
    ParameterVersion(_params()).save(tmp_path / "p.json")
    base = ["--params", str(tmp_path / "p.json"), "--simulation-seed", "1", "--no-progress"]

    def run(name, *extra):
        assert measure_pipeline.run(["--output", str(tmp_path / name), *base, *extra]) == 0
        summary = json.loads((tmp_path / name / outputs.private_file(outputs.RUN_SUMMARY)).read_text())
        estimates = pd.read_parquet(tmp_path / name / outputs.release_file(outputs.ESTIMATES_PARQUET, True))
        return summary, estimates

    by_days, estimates = run("out-days", "--input", str(logs / f"date={DAYS[-1]}"), "--lookback-days", "4")
    assert "lifetime cap:" in capsys.readouterr().out
    by_name, named = run("out-named", "--input", str(logs / f"date={DAYS[-1]}"), "--lookback", str(explicit))
    by_links, linked = run("out-links", "--input", str(links / f"date={DAYS[-1]}"), "--lookback-days", "4")
    assert by_days["lookback_files"] == 4 == by_links["lookback_files"]
    assert by_days["lookback_rows_used"] == by_name["lookback_rows_used"] == by_links["lookback_rows_used"] > 0
    assert by_days["conversions_dropped_by_cap"] == by_name["conversions_dropped_by_cap"]
    pd.testing.assert_frame_equal(estimates, named)
    pd.testing.assert_frame_equal(estimates, linked)
