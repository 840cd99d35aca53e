"""The ledger knows conversions that come back in a lossy re-export (times truncated to the
millisecond, naive local time, zero-padded string ids), a --lookback cannot hold the input's own
conversions, and every consumer of an impression id sees 123, "123" and "000123" as one impression
(ledger, exploration arms, shards, record keys). The end-to-end cases run whole `araopt measure` jobs."""
from __future__ import annotations

import os
import re

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from araopt.io.conversions import Conversions
from araopt.io.ids import canonical_id_hash
from araopt.io.rowset import (
    LOSSY_OVERLAP_SHARE,
    SHIFT_SAMPLE,
    RowSet,
    RowSetPart,
    coarse_row_ids,
    conversion_row_ids,
    minute_neighbours,
    minute_row_ids,
    released_shifted,
)
from araopt.ledger.ledger import Ledger, LedgerRefusal, identities
from araopt.mechanism.exploration import default_exploration
from factories import conversions, domain_csv, error_line, setup, write
from pipelines import measure as measure_pipeline
from transforms.group import shard_of


def with_microseconds(frame: pd.DataFrame, seed: int = 1) -> pd.DataFrame:
    """Conversion times with a random sub-second part (a warehouse's µs timestamps)."""
    rng = np.random.default_rng(seed)
    return frame.assign(conversion_time=frame["conversion_time"]
                        + pd.to_timedelta(rng.integers(0, 1_000_000, len(frame)), unit="us"))


# ---- one canonical id everywhere (core) -------------------------------------------------------------
IDS = np.arange(-50_000, 50_000, 7, dtype=np.int64)


@pytest.mark.parametrize("as_text", [str, lambda i: f"{i:012d}" if i >= 0 else f"-{-i:08d}"],
                         ids=["decimal", "zero-padded"])
def test_arm_assignment_is_the_same_for_an_integer_id_and_its_decimal_strings(as_text):
    exploration = default_exploration(share=0.03)
    text = np.array([as_text(int(i)) for i in IDS], dtype=object)
    arms = exploration.assign(IDS)
    assert (arms >= 0).sum() > 1000  # the arms are populated: the comparison can fail
    np.testing.assert_array_equal(exploration.assign(text), arms)
    np.testing.assert_array_equal(exploration.assign(pa.array(text.tolist())), arms)


def test_the_shard_hash_and_the_record_keys_are_the_same_for_an_integer_id_and_its_decimal_string():
    text = np.array([f"{i:06d}" if i >= 0 else str(i) for i in IDS], dtype=object)
    np.testing.assert_array_equal(shard_of(text, 64), shard_of(IDS, 64))
    times, values = np.arange(len(IDS), dtype=np.int64), np.ones((len(IDS), 1))
    as_int = Conversions(IDS, times, {"s": np.zeros(len(IDS), dtype=np.int64)}, values, ("v",))
    as_text = Conversions(text, times, {"s": np.zeros(len(IDS), dtype=np.int64)}, values, ("v",))
    np.testing.assert_array_equal(as_text.record_keys(), as_int.record_keys())


@given(st.integers(-2**63, 2**63 - 1), st.integers(0, 12), st.text(max_size=6))
def test_a_decimal_string_is_its_integer_and_nothing_else_is(value, zeros, other):
    """Any int64, written with any number of leading zeros, is the integer; a string that is not a
    decimal int64 (a sign other than '-', spaces, other characters, out of range) never is."""
    digits = "0" * zeros + str(abs(value))
    text = ("-" if value < 0 else "") + digits
    as_int = canonical_id_hash(np.array([value], dtype=np.int64))[0]
    assert canonical_id_hash(np.array([text], dtype=object))[0] == as_int
    assert canonical_id_hash(pa.array([text]))[0] == as_int
    for not_decimal in ("+" + digits, " " + text, text + " ", text + "x" + other, str(2**63 + abs(value))):
        ints_it_is_not = np.array([value, abs(value) % 2**63], dtype=np.int64)
        assert canonical_id_hash(np.array([not_decimal], dtype=object))[0] not in canonical_id_hash(ints_it_is_not)


def test_integer_ids_and_other_strings_hash_as_before_ids_were_canonicalised():
    """Ledgers, arm plans and shard layouts made before stay valid: only decimal strings moved."""
    ints = np.array([0, 1, -7, 2**62], dtype=np.int64)
    np.testing.assert_array_equal(canonical_id_hash(ints), pd.util.hash_array(ints))
    text = np.array(["a", "imp-42", "", "+5", " 5", "5.5", "5.0x", "1e3", ".0", "-.0", "0x10", "99999999999999999999"],
                    dtype=object)
    np.testing.assert_array_equal(canonical_id_hash(text), pd.util.hash_array(text))


@given(st.integers(-2**53, 2**53), st.integers(0, 3), st.integers(0, 4))
def test_an_integer_id_through_a_float_is_its_integer(value, zeros, point_zeros):
    """An integer id column that passed through a float (pandas turns an int column with a missing value
    into float64; written as text it reads "123.0") is the same id, with any zero padding, in every
    consumer of the canonical hash (ledger, arms, shards, record keys)."""
    digits = "0" * zeros + str(abs(value))
    text = ("-" if value < 0 else "") + digits + "." + "0" * point_zeros
    as_int = canonical_id_hash(np.array([value], dtype=np.int64))[0]
    assert canonical_id_hash(np.array([text], dtype=object))[0] == as_int
    assert canonical_id_hash(pa.array([text, "imp-1"]))[0] == as_int


def test_the_coarse_identity_survives_truncation_and_time_zone_shifts_but_not_other_seconds():
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 1000, 5000)
    times = rng.integers(1_700_000_000_000_000, 1_700_086_400_000_000, 5000)
    coarse = coarse_row_ids(ids, times)
    for changed in (times - times % 1000, times - times % 1_000_000, times + 5 * 3_600_000_000,
                    times - 5 * 3_600_000_000 - 45 * 60_000_000):  # ms, s, UTC+5, UTC-5:45
        np.testing.assert_array_equal(coarse_row_ids(ids, changed), coarse)
        exact_kept = conversion_row_ids(ids, changed) == conversion_row_ids(ids, times)
        assert exact_kept.mean() < 0.01  # what the exact identity alone misses (kept only where nothing changed)
    assert not np.any(coarse_row_ids(ids, times + 1_000_000) == coarse)  # the next second is another conversion
    assert not np.any(coarse_row_ids(ids + 1, times) == coarse)


MINUTE = 60_000_000


def test_the_minute_identity_survives_truncation_and_rounding_to_the_minute_within_a_neighbour():
    rng = np.random.default_rng(4)
    ids = rng.integers(0, 1000, 5000)
    times = rng.integers(1_700_000_000_000_000, 1_700_086_400_000_000, 5000)
    minute = minute_row_ids(ids, times)
    for unit in (1000, 1_000_000, MINUTE):  # truncated to the ms, s, minute: the same minute identity
        np.testing.assert_array_equal(minute_row_ids(ids, times - times % unit), minute)
    coarse_kept = coarse_row_ids(ids, times - times % MINUTE) == coarse_row_ids(ids, times)
    assert not np.any(coarse_kept[times % MINUTE >= 1_000_000])  # the coarse identity misses them: what it adds
    rounded = minute_row_ids(ids, (times + MINUTE // 2) // MINUTE * MINUTE)
    up = rounded != minute
    assert 0.4 < up.mean() < 0.6  # rounding moves about half of them to the next minute ...
    np.testing.assert_array_equal(minute_neighbours(rounded[up], -1), minute[up])  # ... a neighbour
    np.testing.assert_array_equal(minute_neighbours(minute_neighbours(minute, 1), -1), minute)
    assert not np.any(minute_row_ids(ids, times + 2 * MINUTE) == minute)  # two minutes on: another conversion
    assert not np.any(minute_row_ids(ids + 1, times) == minute)  # another impression
    low = minute & np.uint64(2**24 - 1)  # the minute, offset by the id's hash: not shown without the id
    assert np.mean(low == (times // MINUTE % 2**24).astype(np.uint64)) < 0.01


def _identities(ids, times):
    return identities([RowSetPart.of_table(pa.table({"impression_id": ids, "conversion_time_us": times}))])


def _record(ledger, ids, times):
    exact, coarse, minute = _identities(ids, times)
    return ledger.check_and_record(exact, exact.to_parquet_bytes(), {}, coarse=coarse, minute=minute)


@pytest.mark.parametrize("lossy", ["truncated to the minute", "rounded to the minute", "truncated to the second"])
def test_the_ledger_refuses_a_reexport_truncated_or_rounded_to_the_minute(tmp_path, lossy):
    rng = np.random.default_rng(5)
    ids = rng.integers(0, 400, 1200)
    times = 1_700_000_000_000_000 + rng.integers(0, 86_400_000_000, 1200)
    ledger = Ledger.open(str(tmp_path / "ledger"), allow_rerelease=False)
    _record(ledger, ids, times)
    changed = {"truncated to the minute": times - times % MINUTE,
               "rounded to the minute": (times + MINUTE // 2) // MINUTE * MINUTE,
               "truncated to the second": times - times % 1_000_000}[lossy]
    distinct = len(np.unique(minute_row_ids(ids, changed)))
    with pytest.raises(LedgerRefusal, match=f"{distinct:,} of the {distinct:,} conversions of this input match "
                                            f"conversions released before by impression id and minute"):
        _record(ledger, ids, changed)
    recorded = Ledger.open(str(tmp_path / "ledger"), allow_rerelease=True)
    entry = _record(recorded, ids, changed).entry  # still possible on purpose, and recorded
    assert entry["minute_rows_released_before"] == entry["minute_rows"] == distinct


def test_the_next_day_of_the_same_impressions_matches_by_minute_only_at_the_day_boundary(tmp_path):
    """Genuine distinct conversions (the same impressions, the next day) match by minute only within a
    minute of the earlier release's end: the minute identity's chance share stays far below the refusal."""
    rng = np.random.default_rng(6)
    ids, day = rng.integers(0, 300, 4000), 86_400_000_000
    times = 1_700_006_400_000_000 + rng.integers(0, day, 4000)  # 1_700_006_400 s: a UTC midnight
    ledger = Ledger.open(str(tmp_path / "ledger"), allow_rerelease=False)
    _record(ledger, ids, times)
    nxt = _record(ledger, rng.integers(0, 300, 4000), 1_700_006_400_000_000 + day + rng.integers(0, day, 4000)).entry
    assert nxt["rows_released_before"] == 0 and nxt["minute_rows_released_before"] < 0.005 * nxt["minute_rows"]
    # the boundary itself: an impression converting in the last and the first minute of two days matches
    counting = Ledger.open(str(tmp_path / "ledger"), allow_rerelease=True)  # (one of one: refused otherwise)
    last = _record(counting, np.array([7]), np.array([1_700_006_400_000_000 + 3 * day - 1])).entry
    first = _record(counting, np.array([7]), np.array([1_700_006_400_000_000 + 3 * day])).entry
    assert (last["minute_rows_released_before"], first["minute_rows_released_before"]) == (0, 1)


HOUR = 60 * MINUTE


@pytest.mark.parametrize("shift_minutes", [330, -225, 26 * 60, -12 * 60, 23 * 60 + 45])  # UTC+5:30, -3:45, …
@pytest.mark.parametrize("rounded", [False, True])
def test_a_reexport_truncated_to_the_minute_in_another_time_zone_matches_at_its_shift(shift_minutes, rounded):
    """The minute identities of a re-export truncated (or rounded) to the minute and written in another time
    zone are the released ones moved by the zones' difference: every sampled row matches at that shift;
    other conversions of the same impressions (a later hour) match at no shift beyond chance."""
    rng = np.random.default_rng(9)
    ids = rng.integers(0, 20_000, 20_000)  # about one released conversion per impression
    times = 1_700_000_000_000_000 + rng.integers(0, 86_400_000_000, 20_000)
    released = minute_row_ids(ids, times)
    moved = times + shift_minutes * MINUTE
    moved = (moved + MINUTE // 2) // MINUTE * MINUTE if rounded else moved - moved % MINUTE
    again = RowSet.merge([RowSetPart(minute_row_ids(ids, moved), None, None)])
    found = released_shifted(again, [np.unique(released)])
    assert found.shift_minutes == -shift_minutes and found.matched == found.sampled
    assert SHIFT_SAMPLE <= found.sampled < 2 * SHIFT_SAMPLE
    other = RowSet.merge([RowSetPart(minute_row_ids(ids, times + rng.integers(0, 86_400_000_000, 20_000)), None,
                                     None)])
    chance = released_shifted(other, [np.unique(released)])
    assert chance.matched < 0.01 * chance.sampled  # (3 minutes in 1,440 per released conversion of the impression)


def test_the_ledger_refuses_a_reexport_truncated_to_the_minute_in_another_time_zone(tmp_path):
    rng = np.random.default_rng(5)
    ids = rng.integers(0, 400, 1200)
    times = 1_700_000_000_000_000 + rng.integers(0, 86_400_000_000, 1200)
    ledger = Ledger.open(str(tmp_path / "ledger"), allow_rerelease=False)
    _record(ledger, ids, times)
    local = times + 5 * HOUR + 30 * MINUTE  # naive Asia/Kolkata time, truncated to the minute
    local -= local % MINUTE
    distinct = len(np.unique(minute_row_ids(ids, local)))
    with pytest.raises(LedgerRefusal, match=f"{distinct:,} of a sample of {distinct:,} conversions of this input "
                                            f"match conversions released before by impression id and minute "
                                            f"shifted by -5h30"):
        _record(ledger, ids, local)
    entry = _record(Ledger.open(str(tmp_path / "ledger"), allow_rerelease=True), ids, local).entry
    assert entry["minute_shift_matched"] == entry["minute_shift_sampled"] == distinct  # recorded when allowed
    assert entry["minute_shift_minutes"] == -330 and entry["minute_rows_released_before"] < 0.05 * distinct
    later = _record(ledger, ids, times + 2 * 86_400_000_000 + 7 * HOUR).entry  # the same impressions, 2 days on
    assert later["minute_shift_matched"] == 0  # (no release within 26 h: nothing compared)
    nxt = _record(ledger, rng.integers(0, 400, 1200), times + 86_400_000_000).entry  # genuine: the next day
    assert nxt["minute_shift_matched"] < LOSSY_OVERLAP_SHARE * nxt["minute_shift_sampled"]


def test_a_lookback_truncated_to_the_minute_is_refused():
    from araopt.ledger.ledger import check_lookback

    ids = np.arange(1000, dtype=np.int64)
    times = 1_700_000_000_000_000 + ids * 7_000_123
    period = _identities(ids, times)
    check_lookback(period, _identities(ids, times - 86_400_000_000 - 1_500_000))  # other seconds and minutes
    with pytest.raises(LedgerRefusal, match="by impression id and minute"):
        check_lookback(period, _identities(ids, times - times % MINUTE))
    local = times - 4 * HOUR  # the input's own conversions again, in UTC-4 and truncated to the minute
    with pytest.raises(LedgerRefusal, match=r"--lookback: 1,000 of a sample of 1,000 .* shifted by -4h00"):
        check_lookback(period, _identities(ids, local - local % MINUTE))


# ---- the ledger: lossy re-exports (end to end) --------------------------------------------------
def _released(tmp_path, frame):
    data, pfile = setup(tmp_path, frame)
    dom = domain_csv(tmp_path)
    assert measure_pipeline.run(["--input", data, "--params", pfile, "--output", str(tmp_path / "o"),
                                 "--domain", dom]) == 0
    return pfile, dom


def _release_again(tmp_path, frame, pfile, dom, name, capsys, extra=()):
    path = write(frame, str(tmp_path / name / "part-0.parquet"))
    capsys.readouterr()
    code = measure_pipeline.run(["--input", os.path.dirname(path), "--params", pfile, "--output",
                                 str(tmp_path / f"out-{name}"), "--domain", dom, *extra])
    return code, capsys.readouterr()


def _utc(times: pd.Series) -> pd.Series:
    return times.dt.tz_localize("UTC") if times.dt.tz is None else times.dt.tz_convert("UTC")


LOSSY = {
    "milliseconds": lambda f: f.assign(conversion_time=f["conversion_time"].dt.floor("ms")),
    "seconds": lambda f: f.assign(conversion_time=f["conversion_time"].dt.floor("s")),
    "minutes": lambda f: f.assign(conversion_time=f["conversion_time"].dt.floor("min")),
    "rounded to the minute": lambda f: f.assign(conversion_time=f["conversion_time"].dt.round("min")),
    "naive local time": lambda f: f.assign(
        conversion_time=_utc(f["conversion_time"]).dt.tz_convert("Asia/Kolkata").dt.tz_localize(None)),
    "naive local time to the minute": lambda f: f.assign(
        conversion_time=_utc(f["conversion_time"]).dt.tz_convert("America/New_York").dt.tz_localize(None)
        .dt.floor("min")),
    "zero-padded string ids": lambda f: f.assign(impression_id=f["impression_id"].map(lambda i: f"{i:010d}")),
    "ids through a float": lambda f: f.assign(impression_id=f["impression_id"].astype(float).astype(str)),
}


@pytest.mark.slow
@pytest.mark.parametrize("lossy", sorted(LOSSY))
def test_a_lossy_reexport_of_released_conversions_is_refused_as_a_rerelease(tmp_path, capsys, lossy):
    frame = with_microseconds(conversions(n=1223, impressions=400))
    pfile, dom = _released(tmp_path, frame)
    code, cap = _release_again(tmp_path, LOSSY[lossy](frame), pfile, dom, "again", capsys)
    assert code == 2, cap.out
    line = error_line(cap.err)
    exact = re.search(r"(\S+) of the 1,223 conversions of this input were already released", line)
    coarse = re.search(r"(\S+) of (?:the|a sample of) (\S+) conversions of this input match conversions released "
                       r"before", line)
    assert (exact and exact[1] == "1,223") or (coarse and coarse[1] == coarse[2]), line  # all of them, said so
    assert not (tmp_path / "out-again").exists()
    code, cap = _release_again(tmp_path, LOSSY[lossy](frame), pfile, dom, "anyway", capsys, ["--allow-rerelease"])
    assert code == 0, cap.err  # still possible on purpose, and recorded


@pytest.mark.slow
def test_the_next_day_of_the_same_impressions_is_not_taken_for_a_reexport(tmp_path, capsys):
    """Legitimate coincidences: the same impressions convert again the next day; their coarse matches
    (1 in 900 per pair) stay far below the refusal share."""
    frame = with_microseconds(conversions(n=4000, impressions=300))
    pfile, dom = _released(tmp_path, frame)
    nxt = with_microseconds(conversions(n=4000, impressions=300, seed=7), seed=8)
    nxt = nxt.assign(conversion_time=nxt["conversion_time"] + pd.Timedelta(days=1))
    day1 = write(frame, str(tmp_path / "day-1" / "part-0.parquet"))  # the lifetime cap: day 1 is its lookback
    code, cap = _release_again(tmp_path, nxt, pfile, dom, "next-day", capsys, ["--lookback", os.path.dirname(day1)])
    assert code == 0, cap.err
    summary = pd.read_json(tmp_path / "out-next-day" / "private" / "run_summary.json", typ="series")
    entry = pd.read_json(tmp_path / "out-next-day" / "private" / "run_manifest.json", typ="series")["ledger"]["entry"]
    assert summary["release_number_of_this_input"] == 1
    assert 0 < entry["coarse_rows_released_before"] < LOSSY_OVERLAP_SHARE * entry["coarse_rows"]
    assert entry["minute_rows_released_before"] < LOSSY_OVERLAP_SHARE * entry["minute_rows"]


# ---- the lookback cannot hold the input's own conversions -------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("disguise", ["another file", "another time zone"])
def test_a_lookback_holding_the_inputs_own_conversions_is_refused(tmp_path, capsys, disguise):
    frame = with_microseconds(conversions(n=1500, impressions=300))
    data, pfile = setup(tmp_path, frame)
    earlier = frame if disguise == "another file" else LOSSY["naive local time"](frame)
    lookback = write(earlier, str(tmp_path / "lookback" / "day-before.parquet"))
    capsys.readouterr()
    code = measure_pipeline.run(["--input", data, "--lookback", os.path.dirname(lookback), "--params", pfile,
                                 "--output", str(tmp_path / "o"), "--domain", domain_csv(tmp_path)])
    assert code == 2
    line = error_line(capsys.readouterr().err)
    held = re.search(r"--lookback holds (1,\d\d\d) of the (1,\d\d\d) conversions of --input", line)
    assert held and held[1] == held[2] and "twice" in line, line  # all of them (coarse: 1 in 900 pairs coincide)
    assert not (tmp_path / "o").exists()


def test_a_lookback_check_counts_exact_and_coarse_matches():
    from araopt.ledger.ledger import LedgerRefusal, check_lookback

    ids = np.arange(1000, dtype=np.int64)
    times = 1_700_000_000_000_000 + ids * 7_000_123

    def part(i, t):
        table = pa.table({"impression_id": i, "conversion_time_us": t})
        return [RowSetPart.of_table(table)]

    period = part(ids, times)
    check_lookback(period, part(ids, times - 86_400_000_000 - 1_500_000))  # a day and 1.5 s earlier: other seconds
    with pytest.raises(LedgerRefusal, match="holds 1 of the 1,000"):
        check_lookback(period, part(ids[:1], times[:1]))
    with pytest.raises(LedgerRefusal, match="time to the second"):
        check_lookback(period, part(ids, times - 3 * 3_600_000_000))
    assert len(RowSet.merge(period)) == 1000


def test_a_time_zone_shift_refuses_on_a_share_that_chance_cannot_reach_at_the_best_of_many_shifts():
    """The best of ~200 shifts: a small release's different conversions of the same impressions match a
    few by chance (2 of 12 in a red-team run refused a genuine day), so a match refuses when it is above
    the share and either 10 conversions or most of the sample; a re-export matches all of it."""
    from araopt.io.rowset import ShiftedMatch
    from araopt.ledger.ledger import SHIFT_MIN_MATCHES, _lossy_shift

    def lossy(matched: int, sampled: int) -> bool:
        return _lossy_shift(ShiftedMatch(matched, sampled, -330))

    assert not lossy(2, 12) and lossy(7, 12) and not lossy(6, 12)  # most of a small sample
    assert lossy(12, 12) and lossy(3, 3) and lossy(1, 1)  # a small re-export, whole
    assert lossy(SHIFT_MIN_MATCHES, 100) and not lossy(SHIFT_MIN_MATCHES - 1, 100)
    assert lossy(410, 8192) and not lossy(409, 8192)  # above 5% of a full sample
