"""ARA caps a source's reports over its whole life (up to 30 days), so a release whose impressions
converted in an earlier release must cost those conversions through its --lookback: without it, day 1
and day 2 each keep C reports per impression, 2C over its life. The ledger knows what was released;
a release whose lookback does not hold every conversion released within a source's life before it
is refused (before any work, and exactly at commit), and so is a release of conversions older than a
release already made within a source's life after them (Alg. 1 keeps a source's conversions in time
order). A first release, with nothing in reach in the ledger, needs no lookback."""
from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from araopt.constants import MAX_SOURCE_LIFE_DAYS
from araopt.io.rowset import RowSet, sorted_unique
from araopt.ledger.ledger import Ledger, LedgerRefusal
from araopt.ledger.lifetime import LookbackCover, ReleasePeriod
from araopt.version import ParameterVersion
from lifetimes import DAY, config, daily_log, day_rows

H = DAY // 24


def record(ledger: Ledger, first: int, last: int, ids=range(100), **fields) -> dict:
    """Record a release of ``ids`` with conversions from ``first`` to ``last`` (µs)."""
    rows = RowSet(sorted_unique(np.asarray(ids, dtype=np.uint64)), first, last)
    return ledger.check_and_record(rows, rows.to_parquet_bytes(), dict(fields)).entry


def period(first: int, last: int, *lookback_files: tuple[int, int]) -> ReleasePeriod:
    """A release of conversions from ``first`` to ``last`` with lookback files of these windows (none:
    no lookback)."""
    return ReleasePeriod(first, last, LookbackCover.of_windows(lookback_files) if lookback_files else None)


# ---- before any work: the ledger's windows and the lookback's days -----------------------------------
def test_a_release_after_an_earlier_one_of_the_same_source_life_needs_a_lookback(tmp_path):
    ledger = Ledger.open(str(tmp_path), allow_rerelease=False)
    day1 = record(ledger, 0 * DAY + 2 * H, 0 * DAY + 20 * H)
    with pytest.raises(LedgerRefusal) as refused:
        ledger.check_lifetime(period(1 * DAY + H, 1 * DAY + 22 * H))
    message = str(refused.value)
    assert "--lookback-days 1" in message and "--lookback" in message and day1["id"] in message
    assert "\n" not in message
    ledger.check_lifetime(period(1 * DAY + H, 1 * DAY + 22 * H, (0 * DAY + 2 * H, 0 * DAY + 20 * H)))  # held
    # a file of the day holds the whole UTC day (its first conversion's day through its last's)
    ledger.check_lifetime(period(1 * DAY + H, 1 * DAY + 22 * H, (0 * DAY + 5 * H, 0 * DAY + 6 * H)))
    with pytest.raises(LedgerRefusal, match="--lookback-days 1"):  # the day before the released one
        ledger.check_lifetime(period(1 * DAY + H, 1 * DAY + 22 * H, (-1 * DAY + 2 * H, -1 * DAY + 20 * H)))


def test_a_day_released_in_part_before_the_input_asks_for_those_conversions_not_for_lookback_days(tmp_path):
    """Day 0 up to noon was released; the input is its afternoon (in time order): only a --lookback with
    the morning's conversions holds them (--lookback-days reads the days before the input, none here)."""
    ledger = Ledger.open(str(tmp_path), allow_rerelease=False)
    record(ledger, 2 * H, 12 * H)
    with pytest.raises(LedgerRefusal, match="released in part before it: pass --lookback") as refused:
        ledger.check_lifetime(period(13 * H, 23 * H))
    assert "--lookback-days 0" not in str(refused.value)
    ledger.check_lifetime(period(13 * H, 23 * H, (2 * H, 12 * H)))  # the morning's file held


def test_a_lookback_with_a_hole_on_a_released_day_is_refused(tmp_path):
    ledger = Ledger.open(str(tmp_path), allow_rerelease=False)
    for day in range(3):
        record(ledger, day * DAY + 2 * H, day * DAY + 20 * H, ids=range(100 * day, 100 * day + 100))
    first = 3 * DAY + H
    whole = [(d * DAY + 3 * H, d * DAY + 19 * H) for d in range(3)]
    ledger.check_lifetime(period(first, first + H, *whole))
    with pytest.raises(LedgerRefusal, match="--lookback-days 3"):
        ledger.check_lifetime(period(first, first + H, whole[0], whole[2]))  # day 1's partition missing


def test_a_first_release_and_releases_beyond_a_source_life_need_no_lookback(tmp_path):
    ledger = Ledger.open(str(tmp_path), allow_rerelease=False)
    ledger.check_lifetime(period(40 * DAY, 40 * DAY + H))  # nothing recorded: nothing earlier was released
    life = MAX_SOURCE_LIFE_DAYS * DAY
    record(ledger, 0, 40 * DAY - life)  # its last conversion is a whole source life before the input's first
    ledger.check_lifetime(period(40 * DAY, 40 * DAY + H))
    record(ledger, 0, 40 * DAY - life + 1, ids=range(200, 300))  # one microsecond later it is in reach
    with pytest.raises(LedgerRefusal, match=f"--lookback-days {MAX_SOURCE_LIFE_DAYS}"):
        ledger.check_lifetime(period(40 * DAY, 40 * DAY + H))


def test_an_attribution_release_does_not_spend_an_ara_source_budget(tmp_path):
    ledger = Ledger.open(str(tmp_path), allow_rerelease=False)
    record(ledger, 0, 20 * H, api="attribution")
    ledger.check_lifetime(period(DAY, DAY + H))
    record(ledger, 0, 20 * H, ids=range(500, 600), api="ara")
    with pytest.raises(LedgerRefusal):
        ledger.check_lifetime(period(DAY, DAY + H))


def test_a_release_older_than_one_made_within_its_source_life_is_refused(tmp_path):
    """Day 5 released first, then day 4: Alg. 1 keeps a source's conversions in time order, so day 5's
    kept reports were chosen without day 4's; releasing day 4 now keeps up to C more."""
    ledger = Ledger.open(str(tmp_path), allow_rerelease=False)
    later = record(ledger, 5 * DAY + H, 5 * DAY + 20 * H)
    with pytest.raises(LedgerRefusal, match="in time order") as refused:
        ledger.check_lifetime(period(4 * DAY + H, 4 * DAY + 20 * H))
    assert later["id"] in str(refused.value)
    life = MAX_SOURCE_LIFE_DAYS * DAY
    ledger.check_lifetime(period(5 * DAY + H - life - H, 5 * DAY + H - life))  # a whole life before: no impression shared


def test_an_input_whose_footers_say_no_times_is_refused_when_the_ledger_has_ara_releases(tmp_path):
    ledger = Ledger.open(str(tmp_path), allow_rerelease=False)
    ledger.check_lifetime(ReleasePeriod(None, None, None))
    record(ledger, 0, H)
    with pytest.raises(LedgerRefusal, match="do not bound its conversion times"):
        ledger.check_lifetime(ReleasePeriod(None, None, None))


def test_the_lookback_cover_is_the_utc_days_of_its_files():
    cover = LookbackCover.of_windows([(2 * DAY + H, 3 * DAY + H), (0 * DAY + 23 * H, 0 * DAY + 23 * H), (None, None)])
    assert cover.spans == ((0, DAY), (2 * DAY, 4 * DAY))
    assert cover.gaps(0, 5 * DAY) == [(DAY, 2 * DAY), (4 * DAY, 5 * DAY)]
    assert LookbackCover.of_windows([(0, H), (DAY, DAY + H)]).spans == ((0, 2 * DAY),)  # adjacent days merge
    assert cover.gaps(2 * DAY, 4 * DAY) == []


# ---- at commit: the lookback the job read holds every row of those releases ----------------------------
def test_at_commit_each_release_in_reach_must_be_held_whole_by_the_lookback(tmp_path):
    ledger = Ledger.open(str(tmp_path), allow_rerelease=False)
    day1 = record(ledger, 2 * H, 20 * H, ids=range(100))
    today = period(DAY + H, DAY + 20 * H, (2 * H, 20 * H))
    new = RowSet(np.arange(1000, 1010, dtype=np.uint64), DAY + H, DAY + 20 * H)
    with pytest.raises(LedgerRefusal, match="holds 99 of the 100 conversions") as refused:
        ledger.check_and_record(new, new.to_parquet_bytes(), {}, lifetime=today.held({day1["id"]: 99}))
    assert day1["id"] in str(refused.value)
    with pytest.raises(LedgerRefusal, match="holds 0 of the 100 conversions"):  # the job did not count it
        ledger.check_and_record(new, new.to_parquet_bytes(), {}, lifetime=today.held({}))
    assert len(ledger.store.read_ledger()[0]) == 1  # nothing recorded
    recorded = ledger.check_and_record(new, new.to_parquet_bytes(), {}, lifetime=today.held({day1["id"]: 100}))
    assert recorded.entry["lookback_held"] == {day1["id"]: 100}


def test_at_commit_a_release_recorded_while_the_job_ran_is_checked_too(tmp_path):
    ledger = Ledger.open(str(tmp_path), allow_rerelease=False)
    today = period(DAY + H, DAY + 20 * H)  # no lookback: nothing was in reach when the job started
    ledger.check_lifetime(today)
    record(ledger, 2 * H, 20 * H)  # another run records day 0 meanwhile
    new = RowSet(np.arange(1000, 1010, dtype=np.uint64), DAY + H, DAY + 20 * H)
    with pytest.raises(LedgerRefusal, match="--lookback-days 1"):
        ledger.check_and_record(new, new.to_parquet_bytes(), {}, lifetime=today.held({}))


# ---- end to end: `araopt measure` day after day -------------------------------------------------------
def _write_day(log, rows, path) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(pa.table({"impression_id": log.impression_id[rows],
                             "conversion_time": pa.array(log.conversion_time[rows], pa.timestamp("us", tz="UTC")),
                             "s": log.slices["s"][rows], "value": log.values[rows, 0]}), str(path))
    return str(path)


@pytest.fixture
def three_days(tmp_path):
    """Three days of a log as date= partitions (1970-01-01 .. 03), C = 3, and a function releasing one."""
    from pipelines import measure as measure_cli

    log = daily_log(7, impressions=150, days=3)
    days = [_write_day(log, day_rows(log, d), tmp_path / "log" / f"date=1970-01-0{d + 1}" / "part-0.parquet")
            for d in range(3)]
    (tmp_path / "slices.csv").write_text("s\n0\n1\n2\n")
    ParameterVersion(config(3)).save(str(tmp_path / "p.json"))

    def release(day: int, out: str, *extra: str) -> int:
        return measure_cli.run(["--input", os.path.dirname(days[day]), "--params", str(tmp_path / "p.json"),
                                "--domain", str(tmp_path / "slices.csv"), "--output", str(tmp_path / out),
                                "--ledger", str(tmp_path / "ledger"), "--no-progress", *extra])

    return log, days, release


def _entries(tmp_path) -> list[dict]:
    return json.loads((tmp_path / "ledger" / "ledger" / "index.json").read_text())["releases"]


@pytest.mark.slow
def test_measure_refuses_the_next_day_without_a_lookback_and_releases_it_with_one(tmp_path, three_days, capsys):
    log, days, release = three_days
    assert release(0, "day1") == 0  # the first release: nothing earlier was released
    capsys.readouterr()
    assert release(1, "day2") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--lookback-days 1" in err[0] and "Traceback" not in err[0]
    assert not (tmp_path / "day2").exists() and len(_entries(tmp_path)) == 1  # before any work: nothing written
    assert release(1, "day2", "--lookback-days", str(MAX_SOURCE_LIFE_DAYS)) == 0
    entries = _entries(tmp_path)
    assert entries[1]["lookback_held"] == {entries[0]["id"]: entries[0]["rows"]}


@pytest.mark.slow
def test_measure_refuses_a_lookback_missing_released_conversions_at_commit(tmp_path, three_days, capsys):
    """The lookback's file of a released day holds only some of its conversions: its days look whole,
    the rows it holds say otherwise (counted in the job, checked before anything is recorded)."""
    log, days, release = three_days
    assert release(0, "day1") == 0
    rows = day_rows(log, 0)
    lookback = _write_day(log, rows[::2], tmp_path / "partial" / "date=1970-01-01" / "part-0.parquet")
    capsys.readouterr()
    assert release(1, "day2", "--lookback", os.path.dirname(lookback)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"holds {len(rows[::2]):,} of the {len(rows):,} conversions" in err[0]
    assert not (tmp_path / "day2").exists() and len(_entries(tmp_path)) == 1


# ---- a declared measurement start (measure --measurement-start) -------------------------------------
def test_a_declared_measurement_start_reaches_the_history_and_cannot_follow_a_release(tmp_path):
    """The start travels to ``ReleaseHistory.start_us`` (the lookback's conversions before it cost
    nothing); a start later than a recorded release's first conversion would make that release's
    conversions free, and is refused."""
    from araopt.errors import PrivacyRefusal

    ledger = Ledger.open(str(tmp_path), allow_rerelease=False)
    today = ParameterVersion(config(5))
    record(ledger, 1 * DAY + 2 * H, 1 * DAY + 20 * H, params_sha256=today.checksum())
    history = ledger.release_history(0, 2 * DAY, today, start_us=1 * DAY)
    assert history.start_us == DAY and len(history.releases) == 1
    assert ledger.release_history(0, 2 * DAY, today).start_us is None
    with pytest.raises(PrivacyRefusal, match="measurement start is later than the conversions released by ledger"):
        ledger.release_history(0, 2 * DAY, today, start_us=1 * DAY + 3 * H)


def test_the_ledger_resolves_one_start_per_measurement_with_or_without_a_lookback(tmp_path):
    """``Ledger.measurement_start`` runs on every release, lookback or not: the declared start, else the
    recorded one (inherited); another start than the recorded one, or a start later than an ARA release's
    first conversion (even one beyond a source life: it was measured then), is refused; an attribution
    release (other budgets) does not bound an ARA start."""
    from araopt.errors import InvalidParameters, PrivacyRefusal
    from araopt.ledger.ledger import MEASUREMENT_START

    ledger = Ledger.open(str(tmp_path), allow_rerelease=False)
    assert ledger.measurement_start(None) is None
    record(ledger, 0, 20 * H, ids=range(5), api="attribution")
    assert ledger.measurement_start(1 * DAY) == DAY  # an attribution release does not bound it
    record(ledger, 1 * DAY + 2 * H, 1 * DAY + 20 * H, **{MEASUREMENT_START: 1 * DAY})
    assert ledger.measurement_start(None) == DAY  # inherited
    assert ledger.measurement_start(DAY) == DAY
    with pytest.raises(InvalidParameters, match="was released with another --measurement-start"):
        ledger.measurement_start(DAY // 2)
    later = Ledger.open(str(tmp_path / "later"), allow_rerelease=False)
    record(later, 2 * H, 20 * H, ids=range(100, 200))  # 40 days before: no lookback reaches it
    assert later.measurement_start(2 * H) == 2 * H  # at its first conversion: charged from there
    for start in (2 * H + 1, 40 * DAY):
        with pytest.raises(PrivacyRefusal, match="a start cannot follow a release"):
            later.measurement_start(start)
    record(later, 40 * DAY, 40 * DAY + H, ids=range(300, 400), **{MEASUREMENT_START: 0})
    record(later, 41 * DAY, 41 * DAY + H, ids=range(400, 500), **{MEASUREMENT_START: DAY})  # forged
    with pytest.raises(InvalidParameters, match="records 2 measurement starts"):
        later.measurement_start(None)


def test_measure_refuses_a_declared_start_after_its_own_first_conversion():
    import datetime as dt

    from araopt.errors import InvalidInput
    from pipelines.measure import measurement_start_us

    assert measurement_start_us(None, 5) is None
    assert measurement_start_us(dt.date(1970, 1, 2), DAY) == DAY  # the input starts on the start day
    with pytest.raises(InvalidInput, match="--measurement-start 1970-01-02: the input holds conversions from before"):
        measurement_start_us(dt.date(1970, 1, 2), DAY - 1)


@pytest.mark.slow
def test_measure_from_a_declared_start_costs_the_days_before_it_nothing(tmp_path, three_days, capsys):
    """Day 2 released first, its day 1 as lookback: with ``--measurement-start`` on day 2 the day-1
    conversions registered nothing and the release keeps more than when they cost C = 3 (the browser
    of an advertiser who started measuring that day); a later release of the same ledger inherits the
    start; a start after the input's first day is refused."""
    log, days, release = three_days
    assert release(0, "early", "--measurement-start", "1970-01-02") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the input holds conversions from before it" in err[0]
    assert not (tmp_path / "early").exists()
    assert release(1, "fresh", "--lookback-days", "1", "--measurement-start", "1970-01-02") == 0
    # the same ledger, no flag: its recorded start is inherited; another ledger knows of no start
    assert release(1, "inherited", "--lookback-days", "1", "--allow-rerelease") == 0
    assert release(1, "charged", "--lookback-days", "1", "--ledger", str(tmp_path / "another-ledger")) == 0
    kept = {name: json.loads((tmp_path / name / "private" / "run_summary.json").read_text())["conversions_kept"]
            for name in ("fresh", "inherited", "charged")}
    assert kept["fresh"] == kept["inherited"] > kept["charged"]


# ---- other conversions of the same hours: a day in parts, a late row, a footer that says too little ----
def test_at_commit_a_release_of_other_conversions_of_the_same_hours_is_refused(tmp_path):
    """Alg. 1 keeps a source's conversions in time order: two releases of the same hours each chose theirs
    without the other's (an impression keeps C in each), so an ARA release whose window meets the
    released rows' is refused, the boundary included; the same conversions again are the re-release
    rules' to name."""
    ledger = Ledger.open(str(tmp_path), allow_rerelease=False)
    day0 = record(ledger, 2 * H, 20 * H, ids=range(100))
    for first, last in ((5 * H, 15 * H), (H, 21 * H), (20 * H, 22 * H), (0, 2 * H)):
        half = RowSet(np.arange(1000, 1010, dtype=np.uint64), first, last)
        with pytest.raises(LedgerRefusal, match="within this input's window") as refused:
            ledger.check_and_record(half, half.to_parquet_bytes(), {}, lifetime=period(first, last).held({}))
        assert day0["id"] in str(refused.value) and "\n" not in str(refused.value)
    same = RowSet(sorted_unique(np.arange(100, dtype=np.uint64)), 2 * H, 20 * H)
    with pytest.raises(LedgerRefusal, match="already released"):
        ledger.check_and_record(same, same.to_parquet_bytes(), {}, lifetime=period(2 * H, 20 * H).held({}))
    assert len(ledger.store.read_ledger()[0]) == 1  # nothing recorded
    after = RowSet(np.arange(1000, 1010, dtype=np.uint64), 20 * H + 1, 22 * H)  # one microsecond later: in reach
    with pytest.raises(LedgerRefusal, match="--lookback-days"):
        ledger.check_and_record(after, after.to_parquet_bytes(), {}, lifetime=period(20 * H + 1, 22 * H).held({}))


def test_an_overlapping_release_is_made_with_allow_rerelease_and_records_what_it_met(tmp_path):
    ledger = Ledger.open(str(tmp_path), allow_rerelease=False)
    day0 = record(ledger, 2 * H, 20 * H, ids=range(100))
    again = Ledger.open(str(tmp_path), allow_rerelease=True)
    half = RowSet(np.arange(1000, 1010, dtype=np.uint64), 5 * H, 15 * H)
    entry = again.check_and_record(half, half.to_parquet_bytes(), {}, lifetime=period(5 * H, 15 * H).held({})).entry
    assert entry["windows_overlap"] == [day0["id"]]
    later_day = RowSet(np.arange(2000, 2010, dtype=np.uint64), 40 * DAY, 40 * DAY + H)  # beyond a source life
    entry = ledger.check_and_record(later_day, later_day.to_parquet_bytes(), {},
                                    lifetime=period(40 * DAY, 40 * DAY + H).held({})).entry
    assert "windows_overlap" not in entry


def test_at_commit_the_period_is_the_released_rows_own_times_not_the_footers(tmp_path):
    """The footers said day 6 (a file without statistics held day 4's rows): the rows' own window meets
    day 5's release, which the footers' window had put after the input."""
    ledger = Ledger.open(str(tmp_path), allow_rerelease=False)
    day5 = record(ledger, 5 * DAY + 2 * H, 5 * DAY + 20 * H, ids=range(100))
    footers = period(6 * DAY + H, 6 * DAY + 20 * H, (5 * DAY + 2 * H, 5 * DAY + 20 * H))
    ledger.check_lifetime(footers)  # what the footers say passes
    rows = RowSet(np.arange(1000, 1010, dtype=np.uint64), 4 * DAY + H, 6 * DAY + 20 * H)
    with pytest.raises(LedgerRefusal, match="within this input's window"):
        ledger.check_and_record(rows, rows.to_parquet_bytes(), {}, lifetime=footers.held({day5["id"]: 100}))
    assert len(ledger.store.read_ledger()[0]) == 1
    rows = RowSet(np.arange(1000, 1010, dtype=np.uint64), 6 * DAY + H, 6 * DAY + 20 * H)
    ledger.check_and_record(rows, rows.to_parquet_bytes(), {}, lifetime=footers.held({day5["id"]: 100}))


def test_a_file_whose_footer_does_not_bound_its_times_makes_the_input_window_unknown(tmp_path):
    from transforms.io import read_footer, window_of

    def write(name: str, times: list[int], statistics: bool) -> str:
        path = str(tmp_path / name)
        pq.write_table(pa.table({"impression_id": np.arange(len(times)),
                                 "conversion_time": pa.array(times, pa.timestamp("us", tz="UTC"))}),
                       path, write_statistics=statistics)
        return path

    day6 = read_footer(write("day6.parquet", [6 * DAY + H, 6 * DAY + 2 * H], True))
    day4 = read_footer(write("day4.parquet", [4 * DAY + H], False))
    empty = read_footer(write("empty.parquet", [], False))
    assert day6.window() == (6 * DAY + H, 6 * DAY + 2 * H) and day4.window() == (None, None)
    assert window_of([day6]) == window_of([day6, empty]) == (6 * DAY + H, 6 * DAY + 2 * H)  # no rows: no times
    assert window_of([day6, day4]) == (None, None)


@pytest.mark.slow
def test_measure_refuses_a_day_released_in_two_parts(tmp_path, three_days, capsys):
    """One day's rows in two files released one after the other: the second is refused at commit,
    nothing of it published; a late row of a released day in the next day's file likewise."""
    log, days, release = three_days
    rows = day_rows(log, 0)
    first = _write_day(log, rows[::2], tmp_path / "a" / "part-0.parquet")
    second = _write_day(log, rows[1::2], tmp_path / "b" / "part-0.parquet")
    from pipelines import measure as measure_cli

    def run(path: str, out: str) -> int:
        return measure_cli.run(["--input", path, "--params", str(tmp_path / "p.json"), "--domain",
                                str(tmp_path / "slices.csv"), "--output", str(tmp_path / out),
                                "--ledger", str(tmp_path / "ledger"), "--no-progress"])

    assert run(first, "a-out") == 0
    capsys.readouterr()
    assert run(second, "b-out") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "within this input's window" in err[0]
    assert not (tmp_path / "b-out").exists() and len(_entries(tmp_path)) == 1
    late = np.concatenate([rows[1:2], day_rows(log, 1)])  # one unreleased row of day 0 in day 1's file
    path = _write_day(log, late, tmp_path / "late" / "part-0.parquet")
    assert run(path, "late-out") == 2
    assert not (tmp_path / "late-out").exists() and len(_entries(tmp_path)) == 1


def test_a_lookback_whose_id_types_differ_from_the_input_is_refused_before_any_work(tmp_path):
    """Ids are matched by type family: an impression's (and, W3C Attribution, a browser's) ids of another
    type in the lookback would be other units; refused in one line (before, a browser_id int64 beside a
    string one failed late, merging the shards)."""
    from araopt.errors import InvalidInput
    from transforms.io import check_input, check_lookback

    def write(name: str, impression, browser) -> str:
        path = str(tmp_path / name)
        pq.write_table(pa.table({"impression_id": impression, "browser_id": browser,
                                 "conversion_time": pa.array([DAY, DAY + H], pa.timestamp("us", tz="UTC")),
                                 "s": [0, 1], "value": [1.0, 2.0]}), path)
        return path

    inputs = check_input(write("in.parquet", [1, 2], [7, 8]), ["s"], ["value"])
    assert check_lookback(write("same.parquet", [3, 4], [9, 10]), inputs, ["s"], ["value"]).rows == 2
    for name, impression, browser, column in (("browser.parquet", [3, 4], ["9", "10"], "browser_id"),
                                              ("impression.parquet", ["3", "4"], [9, 10], "impression_id")):
        with pytest.raises(InvalidInput, match=f"--lookback types differ from --input for \\['{column}'\\]"):
            check_lookback(write(name, impression, browser), inputs, ["s"], ["value"])
