"""A lookback carries an earlier W3C Attribution release's budget state only if it holds the rows that
release simulated, not only their ids (``araopt.ledger.attribution.content_check``).

A later release simulates again, from its lookback, the conversions the ledger says an earlier release
released (matched by row id: impression id and conversion time). A lookback partition re-exported with
other content under the same ids (a conversion site renamed, browsers remapped, values refunded, or
deduplicated where the released export had every row twice) would be simulated into another budget
state than the one that release left, and one browser's budget spent twice. So each attribution entry
records, per released row id, a hash of what the simulation read of its rows and how many copies there
were (``content_row_set``), and a release whose lookback holds an earlier release whole by id but with
other content is refused in one line at commit: nothing released, nothing recorded. An unchanged lookback
still carries; ``--allow-rerelease`` releases anyway and records the release it did not carry.
"""
import json

import numpy as np
import pandas as pd
import pytest

from araopt.attribution.params import COUNT, AttributionParams, AttributionQuery
from araopt.io.rowset import content_ids
from araopt.mechanism.keys import DECLARED, KeyDomain
from araopt.version import ParameterVersion
from pipelines.cli import main
from w3c import log_parquet

HOUR_US = 3_600_000_000
DAY_US = 24 * HOUR_US
T0 = 1_767_225_600_000_000  # 2026-01-01
DAYS = ("2026-01-01", "2026-01-02")
BROWSERS = 12
DIFFERS = "held by the lookback with other content than they released"


def _params() -> AttributionParams:
    """Per-site budget 1, two full conversions per site and epoch: a browser's 6 conversions on day 1 spend
    the whole budget of its impression's epoch."""
    queries = (AttributionQuery(COUNT, None), AttributionQuery("value", "value", max_value=255, clip=20.0))
    return AttributionParams.from_paper(1.0, 2, {COUNT: 0.3, "value": 0.7}, queries, ("campaign",))


def _day(day: int, per_browser: int = 6) -> pd.DataFrame:
    """Every browser's conversions of one day, all of its one impression (shown on the first day)."""
    rng = np.random.default_rng(100 + day)
    return pd.DataFrame([{"browser_id": b, "impression_id": b, "campaign": b % 2, "value": 20.0,
                          "impression_time_us": T0 + 5 * HOUR_US, "conversion_site": "shop.example",
                          "conversion_time_us": T0 + day * DAY_US + 6 * HOUR_US + int(rng.integers(0, 17 * HOUR_US))}
                         for b in range(BROWSERS) for _ in range(per_browser)])


def _release_two_days(tmp_path, day1: pd.DataFrame, reexport) -> int:
    """Day 1 released as ``day1``; its partition then re-exported as ``reexport(day1)``; day 2 released with
    ``--lookback-days 1``. Day 2's exit code."""
    params = _params()
    layout = KeyDomain.from_slice_values(("campaign",), {"campaign": np.array([0, 1])},
                                         params.query_names).with_origin(DECLARED)
    version = str(tmp_path / "v.json")
    ParameterVersion.for_attribution(params, domain=layout).save(version)
    root = tmp_path / "logs"
    for name in DAYS:
        (root / f"date={name}").mkdir(parents=True)
    log_parquet(day1, root / f"date={DAYS[0]}" / "part.parquet")
    log_parquet(_day(1), root / f"date={DAYS[1]}" / "part.parquet")

    def measure(day, more=()):
        return main(["measure", "--api", "attribution", "--input", f"{root}/date={DAYS[day]}/", "--params", version,
                     "--output", str(tmp_path / f"out-{day}"), "--ledger", str(tmp_path / "ledger"), "--no-progress",
                     *more])

    assert measure(0) == 0
    log_parquet(reexport(day1.copy()), root / f"date={DAYS[0]}" / "part.parquet")
    return measure(1, ("--lookback-days", "1"))


def _ledger(tmp_path) -> list[dict]:
    return json.load(open(tmp_path / "ledger" / "ledger" / "index.json"))["releases"]


def _refused(tmp_path, capsys, day1, reexport) -> None:
    capsys.readouterr()
    code = _release_two_days(tmp_path, day1, reexport)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("araopt measure: error:") and DIFFERS in err[0], err
    assert "per-site budgets again" in err[0]
    assert not (tmp_path / "out-1").exists() and len(_ledger(tmp_path)) == 1  # nothing released, nothing recorded


@pytest.mark.slow
@pytest.mark.parametrize("copies", [1, 2])
def test_an_unchanged_lookback_carries_the_earlier_release_budget_state(tmp_path, capsys, copies):
    """The day-1 partition read back as released (each row once, or every row twice as an at-least-once
    export released it): day 2 is made, carries day 1's budget state, and its browsers, whose budget day 1
    spent, get no report accepted. Day 1's entry records its rows' content identities."""
    day1 = pd.concat([_day(0, 6 // copies)] * copies, ignore_index=True)
    code = _release_two_days(tmp_path, day1, lambda df: df)
    assert code == 0, capsys.readouterr().err
    first, second = _ledger(tmp_path)
    assert first["content_row_set"] and first["content_row_set_bytes"] > 0
    assert second["budget_carried_from"] == [first["id"]] and second["epochs_shared_with"] == []
    summary = json.load(open(tmp_path / "out-1" / "private" / "run_summary.json"))
    assert summary["reports_matched"] > 0 and summary["reports_matched"] == summary["reports_refused_for_budget"]
    assert "lookback_content_differs" not in summary


@pytest.mark.slow
def test_a_lookback_whose_conversion_site_was_renamed_is_refused(tmp_path, capsys):
    """The day-1 partition re-exported with another conversion site: simulated again, its conversions
    would spend another site's budget and leave shop.example's untouched for day 2."""
    _refused(tmp_path, capsys, _day(0), lambda df: df.assign(conversion_site="old-shop.example"))


@pytest.mark.slow
def test_a_lookback_whose_browsers_were_remapped_is_refused(tmp_path, capsys):
    """The day-1 partition re-exported with other browser ids: simulated again, day 1's spend would go
    to browsers that do not exist, and the real ones would spend their budgets again on day 2."""
    _refused(tmp_path, capsys, _day(0), lambda df: df.assign(browser_id=df["browser_id"] + 1000))


@pytest.mark.slow
def test_a_lookback_whose_values_were_refunded_is_refused_and_allow_rerelease_does_not_carry_it(tmp_path, capsys):
    """The day-1 partition re-exported with its values refunded to 0: simulated again, day 1's value
    reports would cost nothing. Refused; with --allow-rerelease the release is made and records day 1 as a
    release whose epochs it shares without having carried its budget."""
    _refused(tmp_path, capsys, _day(0), lambda df: df.assign(value=0.0))
    assert main(["measure", "--api", "attribution", "--input", f"{tmp_path}/logs/date={DAYS[1]}/", "--params",
                 str(tmp_path / "v.json"), "--output", str(tmp_path / "out-1"), "--ledger", str(tmp_path / "ledger"),
                 "--no-progress", "--lookback-days", "1", "--allow-rerelease"]) == 0, capsys.readouterr().err
    first, second = _ledger(tmp_path)
    assert second["budget_carried_from"] == [] and second["epochs_shared_with"] == [first["id"]]
    summary = json.load(open(tmp_path / "out-1" / "private" / "run_summary.json"))
    assert summary["lookback_content_differs"] == {first["id"]: first["rows"]}


@pytest.mark.slow
def test_a_deduplicated_lookback_of_a_release_that_had_every_row_twice_is_refused(tmp_path, capsys):
    """Day 1 exported with every conversion row twice (both copies called the browsers), its partition
    re-exported deduplicated: every released row id is still held, but once, so simulated again it would
    spend half of what day 1 spent. The number of copies is part of the recorded content."""
    _refused(tmp_path, capsys, pd.concat([_day(0, 3)] * 2, ignore_index=True), lambda df: df.drop_duplicates())


def test_content_identities_tell_contents_and_copies_apart_whatever_the_order():
    """Per row id one content identity, in the row id's id range: equal for the same rows in any order,
    different when a row's content changes or a row id's number of copies does."""
    ids = np.array([5, 9, 5, 2**63 + 1], dtype=np.uint64)
    content = np.array([1, 2, 3, 4], dtype=np.uint64)
    base = content_ids(ids, content)
    assert len(base) == 3 and (base >> np.uint64(58)).tolist() == sorted((ids[[0, 1, 3]] >> np.uint64(58)).tolist())
    assert content_ids(ids[::-1], content[::-1]).tolist() == base.tolist()
    assert content_ids(ids, np.array([1, 2, 3, 5], dtype=np.uint64)).tolist() != base.tolist()
    assert len(set(content_ids(ids[1:], content[1:]).tolist()) & set(base.tolist())) == 2  # id 5 once: differs
    doubled = content_ids(np.concatenate([ids, ids]), np.concatenate([content, content]))
    assert not set(doubled.tolist()) & set(base.tolist())


def test_an_entry_recorded_before_content_identities_is_carried_unchecked(tmp_path):
    """An earlier release recorded without content identities (before they were kept) has nothing to
    compare the lookback with: it is carried as before, named as unchecked (the CLI says so on stderr and
    in the run summary); one recorded with them and held with other content is not carried."""
    from araopt.attribution.lifetime import AttributionHistory, EarlierRelease
    from araopt.io.rowset import RowSet
    from araopt.ledger.attribution import carried_entries, content_check
    from araopt.ledger.ledger import Ledger

    params = _params()
    layout = KeyDomain.from_slice_values(("campaign",), {"campaign": np.array([0, 1])},
                                         params.query_names).with_origin(DECLARED)
    ledger = Ledger.open(str(tmp_path), allow_rerelease=False)
    ids = RowSet(np.arange(1, 4, dtype=np.uint64), T0, T0 + HOUR_US)
    recorded = content_ids(ids.ids, np.arange(3, dtype=np.uint64))
    entry = {"api": "attribution", "mechanism": ParameterVersion.for_attribution(params, domain=layout).to_json()}
    old = ledger.check_and_record(ids, ids.to_parquet_bytes(), dict(entry)).entry
    later = RowSet(np.arange(5, 8, dtype=np.uint64), T0 + 2 * HOUR_US, T0 + 3 * HOUR_US)
    new = ledger.check_and_record(later, later.to_parquet_bytes(), dict(entry),
                                  content=RowSet(content_ids(later.ids, np.arange(3, dtype=np.uint64)), None, None)
                                  ).entry
    history = AttributionHistory((EarlierRelease(old["id"], params, layout, ids.ids),
                                  EarlierRelease(new["id"], params, layout, later.ids)))
    held = {old["id"]: 3, new["id"]: 3}
    lookback = RowSet(np.sort(np.concatenate([recorded, content_ids(later.ids, np.array([0, 1, 7], np.uint64))])),
                      None, None)
    check = content_check(ledger, history, held, [lookback])
    assert check.unchecked == (old["id"],) and dict(check.differ) == {new["id"]: 1}
    assert carried_entries(history, held, check.differ) == frozenset({old["id"]})
