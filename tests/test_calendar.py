"""The calendar of the calibration: day-of-week and declared special-day effects on the retention
ratios, shrunk toward the pooled ratio when the history does not support them, the measured period's
dates deciding its ratio and variance, and unsupported day types widening the interval."""
from __future__ import annotations

import dataclasses
import json
from datetime import date, timedelta

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import araopt.calibration as cb
from araopt import Params, QueryParams
from araopt.calibration.calendar import DAY_TYPES, SPECIAL, day_types, epoch_day, parse_special_days
from araopt.errors import InvalidParameters
from araopt.io.conversions import Conversions
from araopt.mechanism.report import Estimates
from araopt.version import ParameterVersion

MONDAY = date(2025, 1, 6)
DAY_US = 86_400_000_000


def params(count_limit: int = 2, clip: float = 15.0) -> Params:
    return Params(count_limit=count_limit, encoding="linf", epsilon=8.0, slice_columns=("s",),
                  queries=(QueryParams("value", clip, 1.0),))


def daily_log(days: int, weekend: float, seed: int = 0, per_day: int = 1500, skip_weekdays=(), start=MONDAY,
              special: dict[int, float] | None = None) -> Conversions:
    """Impressions every day, all their conversions on that day; at weekends ``weekend`` times the
    conversions per impression and the value per conversion (a count limit of 2 and a clip of 15
    then lose more at weekends); ``special``: day offset -> the same factor on that day."""
    rng = np.random.default_rng(seed)
    first = epoch_day(start)
    ids, times, slices, values = [], [], [], []
    next_id = 0
    for d in range(days):
        weekday = (start + timedelta(days=d)).weekday()
        if weekday in skip_weekdays:
            continue
        f = weekend if weekday >= 5 else 1.0
        f = (special or {}).get(d, f)
        n = rng.poisson(per_day / (1.0 + f))
        sizes = 1 + rng.poisson(f, n)
        rep = np.repeat(np.arange(n), sizes)
        ids.append(next_id + rep)
        times.append((first + d) * DAY_US + rng.integers(0, DAY_US, len(rep)))
        slices.append((np.arange(n) % 4)[rep])
        values.append(rng.lognormal(1.5, 0.8, len(rep)) * f)
        next_id += n
    return Conversions(np.concatenate(ids).astype(np.int64), np.concatenate(times), {"s": np.concatenate(slices)},
                       np.concatenate(values).reshape(-1, 1), ("value",))


def fitted(conv: Conversions, special_days=(), p: Params | None = None):
    p = p or params()
    stats = cb.calibration_statistics(conv, p, cb.day_blocks(conv))
    cal = cb.fit_calibration(stats)
    return p, stats, cal, cb.fit_calendar(stats, cal, special_days)


def realised_ratio(conv: Conversions, p: Params, day: date, q: int = 0) -> float:
    """X / T of one day over all slices (count: kept / all)."""
    kept, retained = cb.retained_values(conv, p)
    on = cb.day_blocks(conv) == epoch_day(day)
    x = kept[on].sum() if q == 0 else retained[on, q - 1].sum()
    t = on.sum() if q == 0 else conv.values[on, q - 1].sum()
    return float(x / t)


def test_day_types_and_special_days():
    days = [epoch_day(MONDAY + timedelta(days=i)) for i in range(7)]
    assert day_types(days).tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert day_types(days, [days[2]]).tolist() == [0, 1, SPECIAL, 3, 4, 5, 6]
    assert parse_special_days("2025-12-25, 2025-11-28,2025-12-25") == ("2025-11-28", "2025-12-25")
    with pytest.raises(ValueError, match="2025-13-01"):
        parse_special_days("2025-13-01")


def test_a_strong_weekday_effect_gets_weekday_specific_ratios():
    conv = daily_log(28, weekend=3.0)
    p, _, cal, calendar = fitted(conv)
    assert calendar is not None and calendar.effects_fitted
    assert calendar.blocks[:7].tolist() == [4.0] * 7 and calendar.blocks[SPECIAL] == 0
    for q in (0, 1):  # count (the cap) and value (clipping): weekends retain less
        assert calendar.between_variance[q] > 0
        assert calendar.effect[5:7, q].max() < calendar.effect[:5, q].min() - 0.05
    saturday = MONDAY + timedelta(days=26)
    wednesday = MONDAY + timedelta(days=23)
    for day in (saturday, wednesday):
        adj = calendar.adjustment([day], cal)
        assert adj.effects_applied and adj.unsupported == () and adj.note() is None
        pooled = float(cal.pooled_ratio[0])
        truth = realised_ratio(conv, p, day)
        # the weekday-specific ratio is far closer to the day's realised one than the pooled ratio
        assert abs(pooled + adj.shift[0] - truth) < 0.25 * abs(pooled - truth)


def test_without_a_weekday_effect_the_effects_shrink_to_the_pooled_ratio():
    strong = fitted(daily_log(28, weekend=3.0, seed=1))[3]
    assert strong is not None
    # a real cycle is kept (almost unshrunk) ...
    assert (np.ptp(strong.effect[:7], axis=0) > 0.9 * np.ptp(strong.raw_effect[:7], axis=0)).all()
    kept = []
    for seed in range(6):
        none = fitted(daily_log(28, weekend=1.0, seed=seed))[3]
        assert none is not None
        kept.append(np.ptp(none.effect[:7], axis=0) / np.ptp(none.raw_effect[:7], axis=0))
        assert (np.ptp(none.effect[:7], axis=0) < 0.1 * np.ptp(strong.effect[:7], axis=0)).all()
    # ... and day-to-day noise without a cycle is mostly shrunk away (often entirely: tau^2 = 0)
    kept_share = np.array(kept)
    assert kept_share.mean() < 0.5 and (kept_share == 0).any()


@settings(max_examples=12, deadline=None)
@given(weekend=st.floats(1.0, 3.0), seed=st.integers(0, 10_000))
def test_shrinkage_never_overshoots_and_a_full_week_cancels_the_cycle(weekend, seed):
    conv = daily_log(21, weekend=weekend, seed=seed, per_day=400)
    _, _, cal, calendar = fitted(conv)
    assert calendar is not None
    for q in (0, 1):
        mu = calendar.mean_effect[q]
        assert (np.abs(calendar.effect[:7, q] - mu) <= np.abs(calendar.raw_effect[:7, q] - mu) + 1e-12).all()
        assert (calendar.effect_variance[:7, q] >= 0).all()
    week = [MONDAY + timedelta(days=i) for i in range(7)]
    one_day = calendar.adjustment(week[5:6], cal)
    whole = calendar.adjustment(week, cal)
    # a whole week's shift is the volume-weighted mean of the effects: no larger than the largest one
    assert (np.abs(whole.shift) <= np.abs(calendar.effect[:7]).max(axis=0) + 1e-12).all()
    assert (whole.variance <= one_day.variance + 1e-15).all() or weekend < 1.05


def test_an_unseen_weekday_widens_the_interval_and_says_so():
    # four weeks without Saturdays: effects fitted, Saturday never seen
    conv = daily_log(28, weekend=2.0, skip_weekdays=(5,))
    p, _, cal, calendar = fitted(conv)
    assert calendar is not None and calendar.effects_fitted and calendar.blocks[5] == 0
    sat, sun = MONDAY + timedelta(days=26), MONDAY + timedelta(days=27)
    a_sat, a_sun = calendar.adjustment([sat], cal), calendar.adjustment([sun], cal)
    assert a_sat.unsupported == ("Sat",) and "Sat" in (a_sat.note() or "")
    assert a_sun.unsupported == ()
    assert (a_sat.variance > a_sun.variance).all()
    assert (calendar.unseen_variance >= calendar.effect_variance[:7].max(axis=0)).all()
    # the interval of the released estimate is wider for the unsupported day, and the note travels with it
    est = _estimates(cal)
    dom = {"s": list(range(4))}
    got_sat = cb.correct(est, cal, dom, p, calendar=calendar, period_days=[sat])
    got_sun = cb.correct(est, cal, dom, p, calendar=calendar, period_days=[sun])
    assert got_sat.calendar_note is not None and got_sun.calendar_note is None
    assert ((got_sat.ci_high - got_sat.ci_low) > (got_sun.ci_high - got_sun.ci_low)).all()


def test_a_history_shorter_than_the_cycle_fits_no_effects_and_widens_unseen_weekdays():
    conv = daily_log(5, weekend=2.0)  # Monday .. Friday
    p, _, cal, calendar = fitted(conv)
    assert calendar is not None and not calendar.effects_fitted
    assert not calendar.effect.any()
    wed, sat = MONDAY + timedelta(days=2), MONDAY + timedelta(days=5)
    a_wed, a_sat = calendar.adjustment([wed], cal), calendar.adjustment([sat], cal)
    assert not a_wed.effects_applied and a_wed.unsupported == () and not a_wed.shift.any()
    np.testing.assert_allclose(a_wed.variance, cal.period(1))  # the marginal model, as without dates
    assert a_sat.unsupported == ("Sat",) and (a_sat.variance > a_wed.variance).all()


def test_declared_special_days_get_their_own_effect():
    specials = {9: 4.0, 16: 4.0}  # two Wednesdays with a sale
    conv = daily_log(28, weekend=1.0, special=specials, seed=3)
    declared = [MONDAY + timedelta(days=d) for d in specials]
    p, _, cal, calendar = fitted(conv, special_days=[d.isoformat() for d in declared])
    assert calendar is not None and calendar.blocks[SPECIAL] == 2 and calendar.blocks[2] == 2
    assert calendar.special_days == tuple(d.isoformat() for d in declared)
    assert calendar.effect[SPECIAL, 0] < calendar.effect[:7, 0].min() - 0.05
    # a new sale day (declared) is measured with the special effect; without the declaration, as a Wednesday
    sale = MONDAY + timedelta(days=30)  # a Wednesday after the history
    with_sale = dataclasses.replace(calendar, special_days=calendar.special_days + (sale.isoformat(),))
    assert with_sale.adjustment([sale], cal).shift[0] < calendar.adjustment([sale], cal).shift[0] - 0.05
    # a special day declared with none in the history is unsupported
    plain = fitted(daily_log(28, weekend=1.0, seed=3), special_days=[sale.isoformat()])[3]
    assert plain is not None and plain.adjustment([sale], cal).unsupported == ("special",)


def test_the_parameter_version_carries_the_calendar_and_refuses_a_foreign_one():
    conv = daily_log(28, weekend=2.0)
    p, _, cal, calendar = fitted(conv, special_days=["2025-01-15"])
    version = ParameterVersion(p, calibration=cal, calendar=calendar)
    again = ParameterVersion.from_bytes(version.to_bytes())
    assert again.calendar is not None and again.to_bytes() == version.to_bytes()
    assert again.calendar.special_days == ("2025-01-15",)
    doc = json.loads(version.to_bytes())
    assert doc["calendar"]["day_types"] == list(DAY_TYPES)
    with pytest.raises(InvalidParameters, match="another calibration"):
        ParameterVersion(p, calibration=cal, calendar=dataclasses.replace(calendar, retention_checksum="0" * 64))
    with pytest.raises(InvalidParameters, match="calibration"):
        ParameterVersion(p, calendar=calendar)
    broken = json.loads(json.dumps(doc))
    broken["calendar"]["effect_variance"][0][0] = -1.0
    with pytest.raises(InvalidParameters, match="effect_variance"):
        ParameterVersion.from_json(broken)


def test_the_corrected_estimate_of_a_weekend_day_uses_its_ratio():
    conv = daily_log(35, weekend=3.0, seed=5)
    history = conv.take(np.flatnonzero(cb.day_blocks(conv) < epoch_day(MONDAY) + 28))
    p, _, cal, calendar = fitted(history)
    saturday = MONDAY + timedelta(days=33)
    day = conv.take(np.flatnonzero(cb.day_blocks(conv) == epoch_day(saturday)))
    kept, retained = cb.retained_values(day, p)
    slices = day.slices["s"]
    X = np.column_stack([np.bincount(slices, weights=kept.astype(float), minlength=4),
                         np.bincount(slices, weights=retained[:, 0], minlength=4)])
    T = np.column_stack([np.bincount(slices, minlength=4), np.bincount(slices, weights=day.values[:, 0], minlength=4)])
    exact = Estimates(X, np.zeros_like(X), X, X, ("count", "value"), 0.95)
    domain = {"s": list(range(4))}
    marginal = cb.correct(exact, cal, domain, p)
    dated = cb.correct(exact, cal, domain, p, calendar=calendar, period_days=[saturday])
    assert dated.calendar_applied and not marginal.calendar_applied
    err_dated = np.abs(dated.estimate / T - 1).max()
    err_marginal = np.abs(marginal.estimate / T - 1).max()
    assert err_dated < 0.5 * err_marginal
    assert ((dated.ci_low <= T) & (T <= dated.ci_high)).all()


def _estimates(cal) -> Estimates:
    U = np.tile(np.array([[800.0, 6000.0]]), (4, 1))
    se = np.full_like(U, 20.0)
    return Estimates(U, se, U - 40, U + 40, cal.query_names, 0.95)


def test_cli_special_days_and_partition_days():
    from araopt.io.partitions import partition_days
    from pipelines.values import parse_special_days_option

    assert parse_special_days_option("2026-12-24,2026-11-27") == ("2026-11-27", "2026-12-24")
    assert parse_special_days_option(None) == ()
    with pytest.raises(InvalidParameters, match="--special-days"):
        parse_special_days_option("2026-02-30")
    assert partition_days(["/log/date=2026-11-24/part-0.parquet", "gs://b/log/date=2026-11-24/x.parquet"]) == (
        "2026-11-24",)
    assert partition_days(["/log/date=2026-11-24/a.parquet", "/log/date=2026-11-25/b.parquet"]) == (
        "2026-11-24", "2026-11-25")
    assert partition_days(["/log/date=2026-11-24/a.parquet", "/log/other.parquet"]) is None
    assert partition_days(["/log/mydate=2026-11-24/a.parquet"]) is None


def _day_totals(conv: Conversions, p: Params, day: date):
    """Exact capped sums X (noiseless estimates) and true totals T of one day, per slice."""
    one = conv.take(np.flatnonzero(cb.day_blocks(conv) == epoch_day(day)))
    kept, retained = cb.retained_values(one, p)
    s = one.slices["s"]
    X = np.column_stack([np.bincount(s, weights=kept.astype(float), minlength=4),
                         np.bincount(s, weights=retained[:, 0], minlength=4)])
    T = np.column_stack([np.bincount(s, minlength=4), np.bincount(s, weights=one.values[:, 0], minlength=4)])
    return Estimates(X, np.zeros_like(X), X, X, ("count", "value"), 0.95), T


def test_an_unseen_special_day_covers_a_shift_the_release_cannot_see():
    # four ordinary weeks, then a declared sale day with twice the conversions per impression and twice
    # the basket: the value, clipped low, keeps a much smaller share than on any day of the history
    sale = MONDAY + timedelta(days=30)
    conv = daily_log(31, weekend=1.0, special={30: 2.0}, seed=7, per_day=4000)
    history = conv.take(np.flatnonzero(cb.day_blocks(conv) < epoch_day(MONDAY) + 28))
    p, _, cal, calendar = fitted(history, special_days=[sale.isoformat()], p=params(count_limit=3, clip=4.0))
    assert calendar is not None and calendar.blocks[SPECIAL] == 0
    exact, T = _day_totals(conv, p, sale)
    assert realised_ratio(conv, p, sale, q=1) < 0.8 * realised_ratio(conv, p, MONDAY + timedelta(days=23), q=1)
    got = cb.correct(exact, cal, {"s": list(range(4))}, p, calendar=calendar, period_days=[sale])
    assert ((got.ci_low <= T) & (T <= got.ci_high)).all()
    assert got.calendar_note is not None and "5x the history's" in got.calendar_note
    assert (np.abs(got.estimate - T) <= 3.0 * got.std_error).all()  # the standard error says as much
    # the band scales with what a query loses: the value (clipped low) widens more than the count
    width = (got.ci_high - got.ci_low) / got.estimate
    assert (width[:, 1] > 2 * width[:, 0]).all()
    # an ordinary day of the same calendar keeps its interval (no band)
    wednesday = MONDAY + timedelta(days=23)
    ordinary = calendar.adjustment([wednesday], cal)
    assert ordinary.unseen_special_weight == 0.0 and ordinary.unsupported == ()


@given(st.floats(0.01, 1.0), st.floats(1.0, 10.0), st.floats(0.0, 1.0))
def test_the_ratio_band_holds_the_ratio_and_stays_a_ratio(r, k, w):
    adjustment = cb.CalendarAdjustment(np.zeros(1), np.zeros(1), ("special",), True, w, k)
    low, high = adjustment.band(np.array([r]))
    assert 0.0 < low[0] <= r * (1 + 1e-12) and r * (1 - 1e-12) <= high[0] <= 1.0 + 1e-12
    odds = (1 - r) / r
    if w == 1.0 and r < 1.0:
        np.testing.assert_allclose((1 - low[0]) / low[0], k * odds, rtol=1e-9)


def test_a_special_day_seen_on_fewer_than_three_days_keeps_the_band_around_its_effect():
    # one sale day in the history (day 20), a bigger one after it (day 30): one day cannot show how
    # much a sale's days differ from each other
    days = [MONDAY + timedelta(days=d) for d in (20, 30)]
    conv = daily_log(31, weekend=1.0, special={20: 1.5, 30: 2.0}, seed=7, per_day=4000)
    history = conv.take(np.flatnonzero(cb.day_blocks(conv) < epoch_day(MONDAY) + 28))
    p, _, cal, calendar = fitted(history, special_days=[d.isoformat() for d in days], p=params(count_limit=3, clip=4.0))
    assert calendar is not None and calendar.blocks[SPECIAL] == 1
    exact, T = _day_totals(conv, p, days[1])
    got = cb.correct(exact, cal, {"s": list(range(4))}, p, calendar=calendar, period_days=[days[1]])
    assert ((got.ci_low <= T) & (T <= got.ci_high)).all()
    adjustment = calendar.adjustment([days[1]], cal)
    assert adjustment.unsupported == () and adjustment.unseen_special_weight == 1.0
    assert got.calendar_note is not None and "only 1 special day" in got.calendar_note


def test_the_operators_special_day_loss_factor_reaches_the_calendar_and_its_band():
    from pipelines.values import check_loss_factor

    conv = daily_log(28, weekend=1.0, seed=3)
    p = params()
    stats = cb.calibration_statistics(conv, p, cb.day_blocks(conv))
    cal = cb.fit_calibration(stats)
    sale = (MONDAY + timedelta(days=30)).isoformat()
    narrow, wide = (cb.fit_calendar(stats, cal, [sale], k) for k in (2.0, 8.0))
    assert narrow.unseen_loss_factor == 2.0 and wide.unseen_loss_factor == 8.0
    assert cb.Calendar.from_json(json.loads(json.dumps(wide.to_json()))).unseen_loss_factor == 8.0
    est = _estimates(cal)
    got = {k: cb.correct(est, cal, {"s": list(range(4))}, p, calendar=c, period_days=[sale])
           for k, c in (("narrow", narrow), ("wide", wide))}
    assert (got["wide"].ci_high > got["narrow"].ci_high).all()
    assert check_loss_factor(1.0) == 1.0
    with pytest.raises(InvalidParameters, match="--special-day-loss-factor"):
        check_loss_factor(0.5)
