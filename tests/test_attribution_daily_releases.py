"""Daily W3C Attribution releases end to end (``measure --api attribution --lookback-days N``): each day's
release reads the days before as its lookback, simulates again the conversions earlier releases
released (with the parameters and layout their ledger entries recorded and the ledger's draw key) and
charges only what is left, so that

* a sequence of daily releases keeps exactly what one simulation of the whole life keeps (the CLI with
  its ledger: per day the reports matched and refused; in simulation with ``--debug-run``: per day the
  unnoised sums), where budget-blind releases would keep more;
* a release whose lookback does not hold an earlier release sharing its epochs is refused in one line
  before any work, naming ``--lookback-days N``; ``--allow-rerelease`` still makes it and records it;
* the graph built from ``transforms/`` (``MeasureAttribution`` on lookback-flagged batches) gives the
  in-memory simulation's sums.
"""
import json

import numpy as np
import pandas as pd
import pytest

from araopt.attribution.draws import DrawKey
from araopt.attribution.encoder import browser_config
from araopt.attribution.lifetime import AttributionHistory, EarlierRelease
from araopt.attribution.measure import simulate_release, simulate_segments
from araopt.attribution.params import COUNT, AttributionParams, AttributionQuery
from araopt.attribution.simulate import report_sums
from araopt.io.conversions import IN_PERIOD
from araopt.io.rowset import conversion_row_ids, sorted_unique
from araopt.mechanism.keys import DECLARED, KeyDomain
from araopt.version import ParameterVersion
from pipelines.cli import main
from w3c import log_parquet

HOUR_US = 3_600_000_000
DAY_US = 24 * HOUR_US
T0 = 1_767_225_600_000_000  # 2026-01-01
DAYS = ("2026-01-01", "2026-01-02", "2026-01-03")
QUERIES = (AttributionQuery(COUNT, None), AttributionQuery("value", "value", max_value=255, clip=20.0))


def _params() -> AttributionParams:
    return AttributionParams.from_paper(1.0, 2, {COUNT: 0.3, "value": 0.7}, QUERIES, ("campaign",))


def _layout(params: AttributionParams) -> KeyDomain:
    return KeyDomain.from_slice_values(("campaign",), {"campaign": np.array([0, 1, 2])},
                                       params.query_names).with_origin(DECLARED)


def _log(seed: int = 0, browsers: int = 40) -> pd.DataFrame:
    """Per browser 1-3 impressions shown in the 10 days before the first day or on it, and per day 0-4
    conversions of them (two conversion sites, values from 0 to far above the clip): the budgets of the
    impressions' epochs bind across the days."""
    rng = np.random.default_rng(seed)
    rows = []
    for b in range(browsers):
        shown = [T0 - int(rng.integers(0, 10 * DAY_US)) for _ in range(int(rng.integers(1, 4)))]
        for day in range(len(DAYS)):
            for _ in range(int(rng.integers(0, 5))):
                k = int(rng.integers(len(shown)))
                rows.append({"browser_id": b, "impression_id": 100 * b + k, "campaign": (b + k) % 3,
                             "conversion_site": ("adv-1.example", "adv-2.example")[int(rng.integers(2))],
                             "impression_time_us": shown[k],
                             "conversion_time_us": T0 + day * DAY_US + int(rng.integers(0, DAY_US)),
                             "value": float(rng.choice((0.0, 3.5, 10.0, 20.0, 1000.0)))})
    log = pd.DataFrame(rows)
    log["day"] = (log["conversion_time_us"] - T0) // DAY_US
    return log


def _partitions(tmp_path, log: pd.DataFrame) -> str:
    """The log as daily partitions ``logs/date=YYYY-MM-DD/part.parquet`` (by conversion day)."""
    root = tmp_path / "logs"
    for day, name in enumerate(DAYS):
        (root / f"date={name}").mkdir(parents=True)
        log_parquet(log[log["day"] == day].drop(columns="day"), root / f"date={name}" / "part.parquet")
    return str(root)


def _version(tmp_path) -> str:
    params = _params()
    path = tmp_path / "v.json"
    ParameterVersion.for_attribution(params, domain=_layout(params)).save(path)
    return str(path)


def _measure(tmp_path, root, day, version, extra=()):
    return main(["measure", "--api", "attribution", "--input", f"{root}/date={DAYS[day]}/", "--params", version,
                 "--output", str(tmp_path / f"out-{day}"), "--ledger", str(tmp_path / "ledger"), "--no-progress",
                 *extra])


def _ledger(tmp_path) -> list[dict]:
    return json.load(open(tmp_path / "ledger" / "ledger" / "index.json"))["releases"]


def _summary(tmp_path, day) -> dict:
    return json.load(open(tmp_path / f"out-{day}" / "private" / "run_summary.json"))


def _whole_life(log: pd.DataFrame, params: AttributionParams, draws):
    """One simulation of the whole life: every day's rows, segment = the day (each called with ``params``)."""
    segments = [(params, _layout(params))] * len(DAYS)
    return simulate_segments(segments, log.drop(columns="day"), log["day"].to_numpy(), draws,
                             browser_config(params, 3))


@pytest.mark.slow
def test_daily_releases_with_a_lookback_keep_what_one_simulation_of_the_whole_life_keeps(tmp_path, capsys):
    """Day 1, then day 2 with --lookback-days 1, then day 3 with --lookback-days 2, released through the
    ledger: per day the reports matched and refused for budget are those of one simulation of the three
    days (the ledger's draw key); budget-blind releases (each day simulated alone) would refuse fewer.
    Each later release records the releases whose budgets it carried."""
    log = _log()
    root, version = _partitions(tmp_path, log), _version(tmp_path)
    assert _measure(tmp_path, root, 0, version) == 0, capsys.readouterr().err
    assert _measure(tmp_path, root, 1, version, ("--lookback-days", "1")) == 0, capsys.readouterr().err
    assert _measure(tmp_path, root, 2, version, ("--lookback-days", "2")) == 0, capsys.readouterr().err
    assert "simulated again first, with 2 earlier release(s) of the ledger" in capsys.readouterr().out
    entries = _ledger(tmp_path)
    assert len({e["draw_key"] for e in entries}) == 1  # one key: every release draws the same epochs
    assert entries[1]["budget_carried_from"] == [entries[0]["id"]]
    assert sorted(entries[2]["budget_carried_from"]) == sorted(e["id"] for e in entries[:2])
    assert all(e["epochs_shared_with"] == [] for e in entries[1:])
    params = _params()
    key = DrawKey(entries[0]["draw_key"])
    whole = _whole_life(log, params, key).reports
    blind_refused = 0
    for day in range(len(DAYS)):
        s = _summary(tmp_path, day)
        mine = whole.segment == day
        assert s["reports_matched"] == int((whole.matched & mine).sum()), day
        assert s["reports_refused_for_budget"] == int((whole.refused & mine).sum()), day
        alone, _ = simulate_release(params, log[log["day"] == day].drop(columns="day"), _layout(params), key=key)
        blind_refused += alone.reports_refused
    assert s["lookback_held"] == {e["id"]: e["rows"] for e in entries[:2]}
    for day in range(len(DAYS)):  # the secret draw key stays in the ledger: no copy in the run folder
        for path in (tmp_path / f"out-{day}").rglob("*.json"):
            assert entries[0]["draw_key"] not in path.read_text(), path
    refused = int(whole.refused.sum())
    assert blind_refused < refused  # (the budgets bind across days: ignoring the lookback keeps more)


@pytest.mark.slow
def test_a_daily_release_without_the_lookback_is_refused_before_any_work(tmp_path, capsys):
    """Day 2 without a lookback (or with one that misses day 1) is refused in one line naming
    --lookback-days 1, before any work: no output, nothing recorded. With it, it is made; with
    --allow-rerelease it is made too and records the release whose epochs it shares."""
    log = _log(1)
    root, version = _partitions(tmp_path, log), _version(tmp_path)
    assert _measure(tmp_path, root, 0, version) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert _measure(tmp_path, root, 2, version, ("--lookback-days", "1")) == 2  # day 2 only: day 1 missing
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--lookback-days 2" in err[0] and "per-site budget" in err[0], err
    assert _measure(tmp_path, root, 1, version) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("araopt measure: error:") and "--lookback-days 1" in err[0], err
    assert not (tmp_path / "out-1").exists() and len(_ledger(tmp_path)) == 1
    assert _measure(tmp_path, root, 1, version, ("--allow-rerelease",)) == 0, capsys.readouterr().err
    first, second = _ledger(tmp_path)
    assert second["epochs_shared_with"] == [first["id"]] and second["budget_carried_from"] == []


@pytest.mark.slow
def test_a_lookback_missing_some_released_conversions_is_refused_at_commit_and_days_go_in_order(tmp_path, capsys):
    """A --lookback file covering day 1's hours but without some of the conversions day 1 released passes
    the check before any work (its footers cover the day) and is refused at commit, exactly (the job
    counts which released conversions it held): nothing released, nothing recorded. A day released
    after a later day that shares its epochs is refused before any work (its budgets were charged first)."""
    log = _log(4)
    root, version = _partitions(tmp_path, log), _version(tmp_path)
    assert _measure(tmp_path, root, 0, version) == 0, capsys.readouterr().err
    day1 = log[log["day"] == 0].sort_values("conversion_time_us")
    partial = pd.concat([day1.iloc[:1], day1.iloc[3:]])  # (the first and the last kept: the same footer window)
    capsys.readouterr()
    path = log_parquet(partial.drop(columns="day"), tmp_path / "partial.parquet")
    assert _measure(tmp_path, root, 1, version, ("--lookback", path)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "did not simulate their conversions again whole" in err[0], err
    assert not (tmp_path / "out-1").exists() and len(_ledger(tmp_path)) == 1
    assert _measure(tmp_path, root, 2, version, ("--lookback-days", "2", "--allow-rerelease")) == 0
    capsys.readouterr()
    assert _measure(tmp_path, root, 1, version, ("--lookback-days", "1")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not all before this input's" in err[0], err


@pytest.mark.slow
def test_a_day_released_in_two_parts_keeps_what_one_simulation_of_the_day_keeps(tmp_path, capsys):
    """The first day released as its morning, then its afternoon with the morning as ``--lookback``: per
    part the reports matched and refused for budget are those of one simulation of the day in two segments
    (the ledger's draw key), and the afternoon's release records the morning's as carried. The afternoon
    without the morning is refused before any work (its browsers' epochs were charged by the morning)."""
    log = _log(3)
    day = log[log["day"] == 0].drop(columns="day")
    afternoon = (day["conversion_time_us"] >= T0 + DAY_US // 2).to_numpy()
    parts = tmp_path / "parts"
    parts.mkdir()
    morning_path = log_parquet(day[~afternoon], parts / "morning.parquet")
    afternoon_path = log_parquet(day[afternoon], parts / "afternoon.parquet")
    version = _version(tmp_path)

    def release(name, path, extra=()):
        return main(["measure", "--api", "attribution", "--input", str(path), "--params", version,
                     "--output", str(tmp_path / name), "--ledger", str(tmp_path / "ledger"), "--no-progress", *extra])

    assert release("am", morning_path) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert release("pm", afternoon_path) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "per-site budget" in err[0], err
    assert not (tmp_path / "pm").exists() and len(_ledger(tmp_path)) == 1
    assert release("pm", afternoon_path, ("--lookback", str(morning_path))) == 0, capsys.readouterr().err
    first, second = _ledger(tmp_path)
    assert second["budget_carried_from"] == [first["id"]] and second["epochs_shared_with"] == []
    params = _params()
    whole = simulate_segments([(params, _layout(params))] * 2, day, afternoon.astype(np.int64),
                              DrawKey(first["draw_key"]), browser_config(params, 3)).reports
    for name, segment in (("am", 0), ("pm", 1)):
        summary = json.load(open(tmp_path / name / "private" / "run_summary.json"))
        mine = whole.segment == segment
        assert summary["reports_matched"] == int((whole.matched & mine).sum()), name
        assert summary["reports_refused_for_budget"] == int((whole.refused & mine).sum()), name
    alone, _ = simulate_release(params, day[afternoon], _layout(params), key=DrawKey(first["draw_key"]))
    assert alone.reports_refused < int((whole.refused & (whole.segment == 1)).sum())  # the morning's spend binds


@pytest.mark.slow
def test_a_simulated_daily_release_sums_what_the_whole_life_keeps_of_its_day(tmp_path, capsys):
    """In simulation (``--simulation-seed S --debug-run``, no ledger: the lookback's rows are taken as
    released with the same parameters), day 3 with --lookback-days 2: its unnoised sums are exactly the
    day's sums in one seeded simulation of the three days."""
    log = _log(2)
    root, version = _partitions(tmp_path, log), _version(tmp_path)
    out = tmp_path / "sim"
    assert main(["measure", "--api", "attribution", "--input", f"{root}/date={DAYS[2]}/", "--params", version,
                 "--output", str(out), "--simulation-seed", "7", "--debug-run", "--no-progress",
                 "--lookback-days", "2"]) == 0, capsys.readouterr().err
    debug = pd.read_csv(out / "private" / "debug_histograms.csv")
    params = _params()
    # day 3 as segment 0 (the sums'), the two days before as segment 1
    sim = simulate_segments([(params, _layout(params))] * 2, log.drop(columns="day"),
                            np.where(log["day"] == 2, 0, 1), 7, browser_config(params, 3))
    whole = report_sums(params, sim.reports, 3, 1)
    assert sim.reports.refused.any()
    for name in params.query_names:
        got = debug[debug["query"] == name].sort_values("histogram_index")["unnoised_sum"].tolist()
        assert got == whole[(name, 0)].tolist(), name
    alone, _ = simulate_release(params, log[log["day"] == 2].drop(columns="day"), _layout(params), simulation_seed=7)
    assert any(alone.unnoised[k].tolist() != whole[k].tolist() for k in whole)  # the lookback changed the sums


def test_the_graph_built_from_transforms_carries_the_lookback():
    """``MeasureAttribution`` on batches whose lookback rows are flagged (``in_period`` False), with the
    ledger's history and draw key: the release's sums and counts are the in-memory simulation's (the
    lookback's rows simulated, not summed, not counted)."""
    import apache_beam as beam
    import pyarrow as pa
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    from araopt.io.conversions import ValidationCounts
    from transforms.attribution import MeasureAttribution

    log = _log(3)
    params, key = _params(), DrawKey.new()
    layout = _layout(params)
    earlier = log[log["day"] < 2]
    ids = sorted_unique(conversion_row_ids(earlier["impression_id"].to_numpy(), earlier["conversion_time_us"].to_numpy()))
    history = AttributionHistory((EarlierRelease("e1", params, layout, ids),), key=key)
    frame = log.assign(**{IN_PERIOD: log["day"] == 2}).drop(columns="day")
    expected, _ = simulate_release(params, frame, layout, key=key, history=history)
    own = int((log["day"] == 2).sum())
    batches = [pa.Table.from_pandas(frame.iloc[i::3], preserve_index=False) for i in range(3)]

    def facts(release):
        return ({k: v.tolist() for k, v in release.sums.unnoised.items()}, release.sums.rows,
                release.sums.reports_refused, release.sums.lookback_rows > 0)

    with TestPipeline() as p:
        counts = p | "Counts" >> beam.Create([ValidationCounts(own)])
        release = (p | beam.Create(batches)
                   | MeasureAttribution(params, counts, layout, None, 3, "browser_id", key=key, history=history))
        assert_that(release | beam.Map(facts), equal_to([({k: v.tolist() for k, v in expected.unnoised.items()},
                                                          own, expected.reports_refused, True)]))
    assert expected.reports_refused > 0 and expected.lookback_reports > 0


# ---- the ledger's rule before any work, on recorded entries ------------------------------------------
def _entry(name, first_us, last_us, key="k" * 16, charged=True):
    params = _params()
    entry = {"id": name, "api": "attribution", "rows": 10, "first_time_us": first_us, "last_time_us": last_us,
             "mechanism": ParameterVersion.for_attribution(params, domain=_layout(params)).to_json(),
             "charged_impressions": {"first_us": first_us - DAY_US, "last_us": last_us, "epoch_us": 7 * DAY_US}}
    if charged:
        entry.update(layout=_layout(params).to_json(), draw_key=key)
    return entry


def test_the_check_before_any_work_names_the_days_the_lookback_needs():
    """An earlier release sharing the release's epochs and not in a lookback: refused, naming
    --lookback-days N for the days from its first conversion's to the input's; a lookback whose files
    cover its days passes; one recorded without its draws, or drawn with another key, cannot be carried
    (whatever the lookback); a release an epoch or more away shares nothing."""
    from araopt.attribution.lifetime import AttributionHistory as History
    from araopt.ledger.attribution import carried_refusal, ledger_draw_key, reach
    from araopt.ledger.lifetime import LookbackCover

    params = _params()
    first, last = T0 + 3 * DAY_US, T0 + 4 * DAY_US - 1
    window = reach(params, (T0 - 5 * DAY_US, T0 + 3 * DAY_US), (first, last))
    assert (window.first_us, window.last_us) == (T0 - 5 * DAY_US, T0 + 3 * DAY_US)  # the impressions' times
    earlier = _entry("e1", T0 + HOUR_US, T0 + 2 * HOUR_US)
    rebuilt = History((EarlierRelease("e1", params, _layout(params), np.array([1], dtype=np.uint64)),))
    why = carried_refusal([earlier], window, (first, last), None, rebuilt, "L")
    assert why is not None and "--lookback-days 3" in why and "no --lookback holds them" in why
    cover = LookbackCover.of_windows([(T0, T0 + 3 * DAY_US - 1)])
    assert carried_refusal([earlier], window, (first, last), cover, rebuilt, "L") is None
    assert carried_refusal([earlier], window, (first, last), cover, History(), "L") is not None  # not rebuilt
    old = _entry("e0", T0 + HOUR_US, T0 + 2 * HOUR_US, charged=False)
    why = carried_refusal([old], window, (first, last), cover, History(excluded=(("e0", "recorded before"),)), "L")
    assert why is not None and "cannot be simulated again" in why and "recorded before" in why
    far = reach(params, (T0 + 9 * DAY_US, T0 + 10 * DAY_US), (T0 + 10 * DAY_US, T0 + 11 * DAY_US))
    assert carried_refusal([earlier], far, (T0 + 10 * DAY_US, T0 + 11 * DAY_US), None, History(), "L") is None
    assert ledger_draw_key([old, _entry("e1", T0, T0, key="a" * 16), _entry("e2", T0, T0, key="b" * 16)]) == \
        DrawKey("b" * 16)
    assert ledger_draw_key([old]) is None


def test_an_earlier_release_under_another_budget_or_epoch_length_cannot_be_carried(tmp_path):
    """The browsers' budgets are one configuration over an epoch's life: a release whose per-site budget
    or epoch length differs from an earlier one's cannot simulate its conversions again (at a larger
    budget it would accept reports that release refused; with shorter epochs it charges one of its
    epochs a second budget), so that release is excluded and, sharing epochs, refuses the release."""
    from araopt.io.rowset import RowSet
    from araopt.ledger.attribution import attribution_history, carried_refusal, reach
    from araopt.ledger.ledger import Ledger

    ledger = Ledger.open(str(tmp_path), allow_rerelease=False)
    ids = RowSet(sorted_unique(np.arange(10, dtype=np.uint64)), T0 + HOUR_US, T0 + 2 * HOUR_US)
    recorded = ledger.check_and_record(ids, ids.to_parquet_bytes(), _entry("e1", T0 + HOUR_US, T0 + 2 * HOUR_US)).entry
    key = DrawKey("k" * 16)
    columns = ("campaign", "value")
    first, last = T0 + DAY_US, T0 + 2 * DAY_US - 1
    same = attribution_history(ledger, [recorded], key, (T0, T0 + DAY_US - 1), first, columns, _params())
    assert [r.entry_id for r in same.releases] == [recorded["id"]] and same.excluded == ()
    for other, what in ((AttributionParams.from_paper(4.0, 2, {COUNT: 0.3, "value": 0.7}, QUERIES, ("campaign",)),
                         "per_site_budget 1 over 7-day epochs, this release's 4 over 7-day"),
                        (AttributionParams.from_paper(1.0, 2, {COUNT: 0.3, "value": 0.7}, QUERIES, ("campaign",),
                                                      epoch_days=1), "this release's 1 over 1-day")):
        history = attribution_history(ledger, [recorded], key, (T0, T0 + DAY_US - 1), first, columns, other)
        assert history.releases == () and len(history.excluded) == 1 and what in history.excluded[0][1]
        window = reach(other, (T0 - DAY_US, first), (first, last))
        why = carried_refusal([recorded], window, (first, last), None, history, "L")
        assert why is not None and "cannot be simulated again" in why and what in why
