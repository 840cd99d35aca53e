"""The browsers' budget state carried across releases (W3C Attribution Level 1,
``araopt.attribution.lifetime``): a daily release simulates again, with the parameters each was released
under and the same keyed draws, the conversions earlier releases released (its lookback), so that

* no privacy unit (browser x conversion site x epoch) spends more than its per-site budget over all
  releases together, nor a browser's epoch more than its global budget, nor an impression site more
  than its quota (hypothesis, with the parameters changing from day to day);
* a sequence of releases keeps exactly what one simulation of the whole life keeps, and what the W3C
  reference implementation keeps replaying the whole life (``export_segments``);
* a lookback of lookbackDays + epoch_days days is enough.
"""
import math
import random

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from araopt.attribution.config import MICROEPSILONS, BrowserConfig
from araopt.attribution.draws import DrawKey
from araopt.attribution.encoder import CONVERSION_TIME_US, browser_config
from araopt.attribution.lifetime import AttributionHistory, EarlierRelease
from araopt.attribution.measure import export_segments, simulate_release, simulate_segments
from araopt.attribution.params import COUNT, AttributionParams, AttributionQuery
from araopt.io.conversions import BROWSER_ID, CONVERSION_SITE, IMPRESSION_ID, IMPRESSION_SITE, IN_PERIOD
from araopt.io.rowset import conversion_row_ids, sorted_unique
from araopt.mechanism.keys import DECLARED, KeyDomain
from w3c import random_log, run_reference, w3c_reference  # noqa: F401  (fixture)

DAY_US = 86_400_000_000
T0 = 1_767_225_600_000_000  # (random_log's first day)


def _params(rng: random.Random, budget: float, lookback_days: int = 30) -> AttributionParams:
    """One day's parameters: the split (each query's epsilon), maxValue and clip change from day to day;
    the browsers' per-site budget does not."""
    queries = (AttributionQuery(COUNT, None),
               AttributionQuery("value", "value", max_value=rng.choice((1, 7, 255)), clip=rng.choice((5.0, 20.0))))
    split = rng.choice((0.2, 0.5, 0.8))
    return AttributionParams.from_paper(budget, rng.randrange(1, 5), {COUNT: split, "value": 1 - split}, queries,
                                        ("campaign",), lookback_days=lookback_days)


def _layout(params: AttributionParams) -> KeyDomain:
    return KeyDomain.from_slice_values(("campaign",), {"campaign": np.arange(3)}, params.query_names).with_origin(DECLARED)


def _log(seed: int, users: int) -> pd.DataFrame:
    """``random_log`` (many conversions per browser and site, over ~75 days) with impression sites, and
    each row's conversion day."""
    rng = random.Random(seed)
    log = random_log(rng, users)
    log[IMPRESSION_SITE] = [rng.choice(("pub-1.example", "pub-2.example")) for _ in range(len(log))]
    log[IMPRESSION_SITE] = log.groupby(IMPRESSION_ID)[IMPRESSION_SITE].transform("first")
    log["day"] = (log[CONVERSION_TIME_US] - T0) // DAY_US
    return log


def _ids(rows: pd.DataFrame) -> np.ndarray:
    return conversion_row_ids(rows[IMPRESSION_ID].to_numpy(), rows[CONVERSION_TIME_US].to_numpy())


def _daily_releases(log, params_of, key, config, lookback_days=None, carry=True):
    """One release per conversion day, in order: its rows and (``carry``) as lookback the rows of the
    ``lookback_days`` days before (every earlier day if None), with the earlier days' releases as the
    history (what the ledger records). Per day: (day, params, the day's rows, its sums, its simulation)."""
    out, history = [], []
    for day in sorted(log["day"].unique()):
        params = params_of(day)
        rows = log[log["day"] == day]
        frame = rows.assign(**{IN_PERIOD: True})
        if carry:
            since = -math.inf if lookback_days is None else day - lookback_days
            back = log[(log["day"] < day) & (log["day"] >= since)].assign(**{IN_PERIOD: False})
            frame = pd.concat([frame, back], ignore_index=True)
        sums, sim = simulate_release(params, frame.drop(columns="day"), _layout(params), config=config, key=key,
                                     history=AttributionHistory(tuple(history), key=key))
        out.append((day, params, rows, sums, sim))
        history.append(EarlierRelease(f"day-{day}", params, _layout(params), sorted_unique(_ids(rows))))
    return out


def _spend(releases):
    """What the releases' own accepted reports took, over all releases: per (browser, conversion site,
    epoch) from the per-site budget, per (browser, epoch) from the global budget, per (browser, epoch,
    impression site) from the quota. Epochs are each browser's grid (keyed: one grid in every release)."""
    frames = []
    for _, params, _, _, sim in releases:
        rep = sim.reports
        own = rep.released & rep.accepted
        rows = sim.rows.iloc[rep.row[own]]
        scale = np.array([2 * q.max_value / q.epsilon for q in params.queries])[rep.query[own]]
        frames.append(pd.DataFrame({
            "browser": rows[BROWSER_ID].to_numpy(), "site": rows[CONVERSION_SITE].to_numpy(),
            "impression_site": rows[IMPRESSION_SITE].to_numpy(), "epoch": rep.epoch[own],
            "site_spend": rep.deducted[own],
            "value_spend": np.ceil(2 * rep.value[own] / scale * MICROEPSILONS).astype(np.int64)}))
    spent = pd.concat(frames, ignore_index=True)
    return (spent.groupby(["browser", "site", "epoch"])["site_spend"].sum(),
            spent.groupby(["browser", "epoch"])["value_spend"].sum(),
            spent.groupby(["browser", "epoch", "impression_site"])["value_spend"].sum())


def _within(releases, config: BrowserConfig) -> bool:
    site, glob, quota = _spend(releases)
    return (int(site.max()) <= config.per_site_budget and int(glob.max()) <= config.global_budget_per_epoch
            and int(quota.max()) <= config.impression_site_quota_per_epoch)


def _config(params: AttributionParams, tight: bool) -> BrowserConfig:
    """The browsers' limits; ``tight``: global budget = the per-site budget, quota half of it (they bind)."""
    config = browser_config(params, 3)
    if not tight:
        return config
    return BrowserConfig(per_site_budget=config.per_site_budget, global_budget_per_epoch=config.per_site_budget,
                         impression_site_quota_per_epoch=config.per_site_budget // 2, epoch_days=config.epoch_days,
                         max_histogram_size=3)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), budget=st.sampled_from((1.0, 4.0)), tight=st.booleans())
def test_no_unit_spends_more_than_its_budget_over_a_sequence_of_daily_releases(seed, budget, tight):
    """Daily releases, each with other parameters (epsilon split, maxValue, clip), the browsers' budget
    state carried by the lookback: every (browser, site, epoch) within the per-site budget over all
    releases together, every epoch within the global budget, every impression site within its quota."""
    rng = random.Random(seed)
    log = _log(seed, users=8)
    by_day = {d: _params(rng, budget) for d in sorted(log["day"].unique())}
    config = _config(by_day[min(by_day)], tight)
    releases = _daily_releases(log, by_day.__getitem__, DrawKey.new(), config)
    assert _within(releases, config)


def test_without_the_earlier_releases_spend_the_units_overspend():
    """The check above fails when each release ignores what the earlier ones spent (no lookback: fresh
    budgets, as before this was carried): the same days overspend."""
    rng = random.Random(5)
    log = _log(5, users=12)
    by_day = {d: _params(rng, 1.0) for d in sorted(log["day"].unique())}
    config = _config(by_day[min(by_day)], tight=False)
    key = DrawKey.new()
    assert _within(_daily_releases(log, by_day.__getitem__, key, config), config)
    site, _, _ = _spend(_daily_releases(log, by_day.__getitem__, key, config, carry=False))
    assert int(site.max()) > config.per_site_budget


def _accepted(releases):
    """(row id, query name) of every report the releases' own rows had accepted."""
    out = set()
    for _, params, _, _, sim in releases:
        rep = sim.reports
        own = rep.released & rep.accepted
        ids = _ids(sim.rows.iloc[rep.row[own]])
        out |= {(int(i), params.queries[q].name) for i, q in zip(ids, rep.query[own], strict=True)}
    return out


def _whole_life(log, by_day, key, config):
    """One simulation of the whole life: every day's rows called with that day's parameters."""
    days = sorted(by_day)
    segments = [(by_day[d], _layout(by_day[d])) for d in days]
    row_set = np.searchsorted(days, log["day"].to_numpy())
    return segments, row_set


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_sequence_of_releases_keeps_what_one_simulation_of_the_whole_life_keeps(seed):
    """Daily releases with changing parameters accept exactly the reports that one simulation of all
    the days (each day's rows called with its parameters) accepts; a lookback of lookbackDays +
    epoch_days (37) days gives the same releases as the whole history."""
    rng = random.Random(seed)
    log = _log(seed, users=40)
    by_day = {d: _params(rng, rng.choice((1.0, 4.0))) for d in sorted(log["day"].unique())}
    config = _config(by_day[min(by_day)], tight=seed == 3)
    key = DrawKey.new()
    releases = _daily_releases(log, by_day.__getitem__, key, config)
    segments, row_set = _whole_life(log, by_day, key, config)
    whole = simulate_segments(segments, log.drop(columns="day"), row_set, key, config)
    rep = whole.reports
    ids = _ids(whole.rows.iloc[rep.row[rep.accepted]])
    names = [segments[s][0].queries[q].name for s, q in zip(rep.segment[rep.accepted], rep.query[rep.accepted],
                                                            strict=True)]
    assert _accepted(releases) == {(int(i), n) for i, n in zip(ids, names, strict=True)}
    assert rep.refused.any()  # (the budgets bind)
    windowed = _daily_releases(log, by_day.__getitem__, key, config, lookback_days=37)
    for (_, _, _, a, _), (_, _, _, b, _) in zip(releases, windowed, strict=True):
        assert {k: v.tolist() for k, v in a.unnoised.items()} == {k: v.tolist() for k, v in b.unnoised.items()}


@pytest.mark.parametrize("seed", [1, 2])
def test_a_sequence_of_releases_keeps_what_the_reference_keeps_over_the_whole_life(w3c_reference, tmp_path,  # noqa: F811
                                                                                   seed):
    """The W3C reference implementation replays the whole life (every day's conversions called with the
    parameters of the day's release, each browser's epoch grid and roundings from the releases' key):
    per day, the sums of its histograms equal the day's release's unnoised sums."""
    rng = random.Random(seed)
    log = _log(seed, users=30)
    by_day = {d: _params(rng, 1.0) for d in sorted(log["day"].unique())}
    config = _config(by_day[min(by_day)], tight=False)
    key = DrawKey.new()
    releases = _daily_releases(log, by_day.__getitem__, key, config)
    segments, row_set = _whole_life(log, by_day, key, config)
    frame = log.drop(columns="day")
    cases = export_segments(segments, frame, row_set, key, config)
    theirs, _ = run_reference(w3c_reference, cases, tmp_path)
    whole = simulate_segments(segments, frame, row_set, key, config)  # its reports in the cases' call order
    assert len(theirs) == len(whole.reports.query)
    days = sorted(by_day)
    sums: dict = {}
    for row, segment, query in zip(theirs, whole.reports.segment, whole.reports.query, strict=True):
        name = segments[segment][0].queries[query].name
        acc = sums.setdefault((days[segment], name), np.zeros(3, dtype=np.int64))
        acc += np.asarray(row["histogram"], dtype=np.int64)
    refused = 0
    for day, params, _, day_sums, _ in releases:
        refused += day_sums.reports_refused
        for name in params.query_names:
            assert day_sums.unnoised[(name, 0)].tolist() == sums.get((day, name), np.zeros(3)).tolist(), (day, name)
    assert refused > 0
