"""An impression's budget over its life when the parameters change between releases: every lookback
conversion costs what the release that used it spent (its count limit, its arm plan), as the browser
costed it, so no impression's kept contributions ever exceed Gamma or 20 reports over its life."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from araopt.constants import MAX_REPORTS_PER_SOURCE
from araopt.errors import InvalidInput
from araopt.io.conversions import Conversions, concat_periods
from araopt.mechanism.bounding import bound_contributions, bound_sorted, ranks_within_impression
from araopt.mechanism.encoding import encode
from araopt.mechanism.exploration import Exploration, ExplorationArm
from araopt.mechanism.lifetime import ReleaseHistory, lifetime_norms, norm_bounds
from araopt.mechanism.measure import encode_and_bound, measure
from araopt.mechanism.params import Params
from lifetimes import DAY, DOMAIN, GAMMA, chrome_keeps, config, daily_log, day_rows, released_ids, with_lookback

# ---- the finding: day 1 released at C = 3, day 2 at C = 5 with day 1 as lookback ----------------------

def test_day2_at_a_higher_count_limit_keeps_what_chrome_keeps():
    log = daily_log(1, impressions=400, days=2)
    day1, day2 = config(3), config(5)
    history = ReleaseHistory.of([(day1, released_ids(log, day_rows(log, 0)))])
    m = measure(with_lookback(log, 1), day2, DOMAIN, simulation_seed=2, history=history)
    chrome = chrome_keeps(log, {0: day1.per_conversion_budget, 1: day2.per_conversion_budget})
    assert m.rows_kept + m.rows_outside_domain == chrome[day_rows(log, 1)].sum()
    # re-encoding day 1 at today's C = 5 keeps more than the browser: what the release did before
    today_only = measure(with_lookback(log, 1), day2, DOMAIN, simulation_seed=2)
    assert today_only.rows_kept > m.rows_kept


# ---- the property: lifetime L1 <= Gamma and <= 20 reports over changing daily releases ---------------

@st.composite
def daily_plans(draw):
    days = draw(st.integers(2, 5))
    count_limit = draw(st.integers(1, 20))
    plans = []
    for _ in range(days):
        count_limit = min(max(1, count_limit + draw(st.integers(-5, 5))), 30)
        encoding = draw(st.sampled_from(["linf", "l1", "baseline"]))
        arms = None
        if encoding != "baseline" and draw(st.booleans()):
            limits = draw(st.lists(st.integers(1, 30), min_size=1, max_size=3, unique=True))
            arms = Exploration(tuple(ExplorationArm(c, 0.08) for c in limits), salt=draw(st.integers(0, 3)))
        plans.append(config(count_limit, encoding, arms))
    return plans


@settings(max_examples=40, deadline=None)
@given(plans=daily_plans(), seed=st.integers(0, 10_000))
def test_every_impression_stays_within_its_lifetime_budget_when_parameters_change_daily(plans, seed):
    log = daily_log(seed, impressions=40, days=len(plans), max_per_day=12)
    rng = np.random.default_rng(seed)  # secure-like: rounding not reproducible from one day to the next
    spent = np.zeros(40, dtype=np.int64)
    reports = np.zeros(40, dtype=np.int64)
    earlier: list[tuple[Params, np.ndarray]] = []
    for day, p in enumerate(plans):
        rows = day_rows(log, day)
        if len(rows) == 0:
            continue
        batch = with_lookback(log, day)
        contributions, kept = encode_and_bound(batch, p, rng=rng, history=ReleaseHistory.of(earlier))
        period = batch.period_mask()
        norms = contributions.sum(axis=1)
        kept_today = np.flatnonzero(kept & period)
        np.add.at(spent, batch.impression_id[kept_today], norms[kept_today])
        np.add.at(reports, batch.impression_id[kept_today], norms[kept_today] > 0)
        earlier.append((p, released_ids(log, rows)))
    assert spent.max() <= GAMMA and reports.max() <= MAX_REPORTS_PER_SOURCE


# ---- the measurement's start: conversions before it registered nothing ---------------------------------

@settings(max_examples=40, deadline=None)
@given(plans=daily_plans(), seed=st.integers(0, 10_000), start=st.integers(1, 3))
def test_every_impression_stays_within_its_lifetime_budget_from_a_declared_measurement_start(plans, seed, start):
    """Releases from day ``start`` on, the days before never released and declared free
    (``ReleaseHistory.start_us``): the kept contributions of every impression over all releases stay
    within Gamma and 20 reports."""
    days = len(plans) + start
    log = daily_log(seed, impressions=40, days=days, max_per_day=12)
    rng = np.random.default_rng(seed)
    spent = np.zeros(40, dtype=np.int64)
    reports = np.zeros(40, dtype=np.int64)
    earlier: list[tuple[Params, np.ndarray]] = []
    for day, p in enumerate(plans, start=start):
        rows = day_rows(log, day)
        if len(rows) == 0:
            continue
        batch = with_lookback(log, day)
        history = ReleaseHistory.of(earlier, start_us=start * DAY)
        contributions, kept = encode_and_bound(batch, p, rng=rng, history=history)
        kept_today = np.flatnonzero(kept & batch.period_mask())
        norms = contributions.sum(axis=1)
        np.add.at(spent, batch.impression_id[kept_today], norms[kept_today])
        np.add.at(reports, batch.impression_id[kept_today], norms[kept_today] > 0)
        earlier.append((p, released_ids(log, rows)))
    assert spent.max() <= GAMMA and reports.max() <= MAX_REPORTS_PER_SOURCE


def test_after_a_declared_start_a_release_keeps_what_chrome_keeps_when_earlier_triggers_registered_nothing():
    """Day 0 before the measurement (its triggers carried no contribution), day 1 at C = 3, day 2 at
    C = 5: day 2 keeps what the browser keeps; without the start, day 0 is costed at C = 3 (the dearest
    known) and fewer are kept."""
    log = daily_log(3, impressions=400, days=3)
    day1, day2 = config(3), config(5)
    history = ReleaseHistory.of([(day1, released_ids(log, day_rows(log, 1)))], start_us=DAY)
    m = measure(with_lookback(log, 2), day2, DOMAIN, simulation_seed=2, history=history)
    chrome = chrome_keeps(log, {0: 0, 1: day1.per_conversion_budget, 2: day2.per_conversion_budget})
    assert m.rows_kept + m.rows_outside_domain == chrome[day_rows(log, 2)].sum()
    charged = measure(with_lookback(log, 2), day2, DOMAIN, simulation_seed=2,
                      history=dataclasses.replace(history, start_us=None))
    assert charged.rows_kept < m.rows_kept


def test_a_row_from_before_the_start_costs_nothing_and_one_after_it_what_it_did_before():
    # the second at the very start: measured (costed as any row no release used)
    log = Conversions(np.array([0, 0, 0]), np.array([10, DAY, 2 * DAY + 10]), {"s": np.array([0, 0, 0])},
                      np.ones((3, 1)), ("value",))
    batch = concat_periods(log.take(np.array([2])), log.take(np.array([0, 1])))
    history = ReleaseHistory.of([(config(2), np.array([12345], dtype=np.uint64))], start_us=DAY)
    today = config(5)
    low, high = lifetime_norms(batch, today, encode(batch.values, today, np.random.default_rng(0)), history)
    back = np.flatnonzero(~batch.period_mask())
    before = batch.conversion_time[back] < DAY
    assert low[back][before].tolist() == high[back][before].tolist() == [0]
    assert low[back][~before].tolist() == [GAMMA // 5] and high[back][~before].tolist() == [GAMMA // 2]


def test_a_history_that_released_a_row_from_before_its_declared_start_is_refused():
    log = Conversions(np.array([0, 0]), np.array([10, DAY + 10]), {"s": np.array([0, 0])}, np.ones((2, 1)),
                      ("value",))
    batch = concat_periods(log.take(np.array([1])), log.take(np.array([0])))
    history = ReleaseHistory.of([(config(3), released_ids(log, np.array([0])))], start_us=DAY)
    today = config(5)
    with pytest.raises(InvalidInput, match="before its declared measurement start"):
        lifetime_norms(batch, today, encode(batch.values, today, np.random.default_rng(0)), history)


# ---- the costs: what each encoder really spends -----------------------------------------------------

@pytest.mark.parametrize("encoding", ["linf", "l1"])
@pytest.mark.parametrize("count_limit", [1, 3, 7, 20])
def test_linf_and_l1_contributions_have_norm_floor_gamma_over_c(encoding, count_limit):
    values = np.random.default_rng(count_limit).lognormal(1.0, 2.0, (500, 1))
    p = config(count_limit, encoding)
    norms = encode(values, p, np.random.default_rng(0)).sum(axis=1)
    assert (norms == GAMMA // count_limit).all()
    low, high = norm_bounds(values, np.arange(500), p)
    assert (low == GAMMA // count_limit).all() and (high == low).all()


def test_baseline_norms_lie_within_their_bounds_and_reach_both():
    values = np.random.default_rng(3).uniform(0.0, 8.0, (2000, 1))
    p = config(4, "baseline")
    low, high = norm_bounds(values, np.arange(2000), p)
    norms = encode(values, p, np.random.default_rng(5)).sum(axis=1)
    assert ((low <= norms) & (norms <= high)).all()
    assert (norms == low).any() and (norms == high).any() and (high > low).any()
    assert (high - low <= 1).all()  # one query: floor or ceil of one value


def test_seeded_baseline_rounding_makes_the_cost_exact():
    values = np.random.default_rng(3).uniform(0.0, 8.0, (300, 1))
    uniforms = np.random.default_rng(9).random((300, 1))
    p = config(4, "baseline")
    low, high = norm_bounds(values, np.arange(300), p, uniforms)
    np.testing.assert_array_equal(low, encode(values, p, uniforms=uniforms).sum(axis=1))
    np.testing.assert_array_equal(low, high)


def test_an_arm_costs_its_own_count_limit_under_the_plan_it_was_released_with():
    plan = Exploration((ExplorationArm(1, 0.1), ExplorationArm(10, 0.1)), salt=1)
    p = config(4, "linf", plan)
    ids = np.arange(3000)
    low, high = norm_bounds(np.ones((3000, 1)), ids, p)
    arm = plan.assign(ids)
    expected = np.choose(arm + 1, [GAMMA // 4, GAMMA // 1, GAMMA // 10])
    np.testing.assert_array_equal(low, expected)
    np.testing.assert_array_equal(high, expected)


def _lookback_of_two(released_at: Params) -> tuple[Conversions, ReleaseHistory]:
    """Impression 0: one conversion on day 0 (released with ``released_at``), one on day 1 (today)."""
    log = Conversions(np.array([0, 0]), np.array([10, DAY + 10]), {"s": np.array([0, 0])}, np.ones((2, 1)),
                      ("value",))
    batch = concat_periods(log.take(np.array([1])), log.take(np.array([0])))
    return batch, ReleaseHistory.of([(released_at, released_ids(log, np.array([0])))])


def test_a_lookback_row_costs_the_count_limit_it_was_released_with():
    batch, history = _lookback_of_two(config(3))
    today = config(5)
    contributions = encode(batch.values, today, np.random.default_rng(0))
    low, high = lifetime_norms(batch, today, contributions, history)
    back = ~batch.period_mask()
    assert low[back].tolist() == high[back].tolist() == [GAMMA // 3]
    assert low[~back].tolist() == [GAMMA // 5]
    # without the history, nothing says what day 0 cost: today's configuration
    low, high = lifetime_norms(batch, today, contributions, None)
    assert low[back].tolist() == high[back].tolist() == [GAMMA // 5]


def test_a_row_no_release_recorded_spans_every_known_configuration_and_today():
    log = Conversions(np.array([0, 0]), np.array([10, DAY + 10]), {"s": np.array([0, 0])}, np.ones((2, 1)),
                      ("value",))
    batch = concat_periods(log.take(np.array([1])), log.take(np.array([0])))
    history = ReleaseHistory.of([(config(2), np.array([12345], dtype=np.uint64)),
                                 (config(9), np.array([67890], dtype=np.uint64))])
    today = config(5)
    low, high = lifetime_norms(batch, today, encode(batch.values, today, np.random.default_rng(0)), history)
    back = ~batch.period_mask()
    assert low[back].tolist() == [GAMMA // 9] and high[back].tolist() == [GAMMA // 2]


def test_a_row_released_twice_spans_both_releases_costs():
    log = Conversions(np.array([0, 0]), np.array([10, DAY + 10]), {"s": np.array([0, 0])}, np.ones((2, 1)),
                      ("value",))
    batch = concat_periods(log.take(np.array([1])), log.take(np.array([0])))
    ids = released_ids(log, np.array([0]))
    history = ReleaseHistory.of([(config(2), ids), (config(6), ids), (config(20), np.empty(0, dtype=np.uint64))])
    today = config(5)
    low, high = lifetime_norms(batch, today, encode(batch.values, today, np.random.default_rng(0)), history)
    back = ~batch.period_mask()
    assert low[back].tolist() == [GAMMA // 6] and high[back].tolist() == [GAMMA // 2]


# ---- Alg. 1 over norm intervals -------------------------------------------------------------------

def _bound(low, high, groups, budget=10, max_reports=MAX_REPORTS_PER_SOURCE):
    rank, group = ranks_within_impression(np.asarray(groups))
    return bound_sorted(np.asarray(low), rank, group, budget, max_reports=max_reports, upper=np.asarray(high))


def test_a_row_is_kept_only_if_it_fits_whatever_the_earlier_rows_really_cost():
    # A costs 5 or 6; B (5) was kept iff A cost 5; so 10 or 6 are used, and C (1) may not fit: dropped.
    # Alg. 1 on the upper norms alone (6, 5, 1) would keep C: it under-counts the world where A cost 5.
    kept = _bound([5, 5, 1], [6, 5, 1], [0, 0, 0])
    assert kept.tolist() == [True, False, False]
    assert _bound([6, 5, 1], [6, 5, 1], [0, 0, 0]).tolist() == [True, False, True]


def test_a_row_that_fits_the_highest_spend_exactly_is_kept():
    assert _bound([4, 6], [6, 6], [0, 0], budget=12).tolist() == [True, True]
    assert _bound([4, 7], [6, 7], [0, 0], budget=12).tolist() == [True, False]


def test_earlier_rows_whose_cost_is_uncertain_count_towards_the_report_limit():
    # 3 earlier rows of cost 0 or 1 (each may have made a report), report limit 3: the 4th row may not report
    kept = _bound([0, 0, 0, 1], [1, 1, 1, 1], [0, 0, 0, 0], budget=100, max_reports=3)
    assert kept.tolist() == [True, True, True, False]
    assert _bound([0, 0, 0, 1], [0, 0, 0, 1], [0, 0, 0, 0], budget=100, max_reports=3).tolist() == [True] * 4


def test_a_row_that_may_have_been_dropped_leaves_the_lowest_spend_alone():
    # A [3, 8]: may or may not fit after 5; the lowest spend stays 5, so B [5, 5] may have fitted: the
    # highest spend becomes 10 and C (1) is dropped
    assert _bound([5, 3, 5, 1], [5, 8, 5, 1], [0, 0, 0, 0]).tolist() == [True, False, False, False]


@given(seed=st.integers(0, 10_000))
def test_point_intervals_are_alg1_exactly(seed):
    rng = np.random.default_rng(seed)
    n = 300
    groups = np.sort(rng.integers(0, 30, n))
    norms = rng.integers(0, 30, n)
    rank, group = ranks_within_impression(groups)
    plain = bound_sorted(norms, rank, group, 100, max_reports=5)
    # one extra impression with a wide interval sends everything through the interval loop
    low = np.append(norms, 1)
    high = np.append(norms, 50)
    rank2, group2 = ranks_within_impression(np.append(groups, 99))
    mixed = bound_sorted(low, rank2, group2, 100, max_reports=5, upper=high)
    np.testing.assert_array_equal(mixed[:-1], plain)


def test_an_upper_norm_below_its_lower_norm_is_refused():
    with pytest.raises(InvalidInput, match="below its lower"):
        _bound([5, 2], [4, 2], [0, 0])


def test_release_history_of_stores_each_configuration_once():
    a, b = config(3), config(5)
    history = ReleaseHistory.of([(a, np.array([3, 1], dtype=np.uint64)), (b, np.array([2], dtype=np.uint64)),
                                 (a, np.array([4], dtype=np.uint64))])
    assert history.configurations == (a, b)
    used = history.configurations_of(np.array([1, 2, 4, 9], dtype=np.uint64))
    assert used.tolist() == [[True, False], [False, True], [True, False], [False, False]]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 30), max_size=25),
       st.lists(st.lists(st.integers(0, 30), max_size=12), min_size=1, max_size=5))
def test_each_rows_configurations_are_those_of_the_releases_that_hold_it(rows, releases):
    """``configurations_of`` is membership, row by row, whatever the rows' order and repeats: a row is
    costed with every configuration that released it and with none that did not."""
    configs = [config(2 + i % 3) for i in range(len(releases))]
    history = ReleaseHistory.of([(c, np.array(r, dtype=np.uint64)) for c, r in zip(configs, releases, strict=True)])
    used = history.configurations_of(np.array(rows, dtype=np.uint64))
    expected = [[any(row in r for c, r in zip(configs, releases, strict=True) if c == known)
                 for known in history.configurations] for row in rows]
    assert used.shape == (len(rows), len(history.configurations))
    assert used.tolist() == expected


def test_a_release_history_refuses_unsorted_ids_and_unknown_configurations():
    with pytest.raises(InvalidInput, match="sorted and distinct"):
        ReleaseHistory((config(3),), ((0, np.array([2, 1], dtype=np.uint64)),))
    with pytest.raises(InvalidInput, match="sorted and distinct"):
        ReleaseHistory((config(3),), ((0, np.array([1, 1], dtype=np.uint64)),))
    with pytest.raises(InvalidInput, match="configuration 1"):
        ReleaseHistory((config(3),), ((1, np.array([1], dtype=np.uint64)),))
    with pytest.raises(InvalidInput, match="configuration -1"):
        ReleaseHistory((config(3),), ((-1, np.array([1], dtype=np.uint64)),))
    assert len(ReleaseHistory((config(3),), ((0, np.array([1, 2], dtype=np.uint64)),)).releases) == 1


def test_a_release_history_says_which_releases_and_configurations_cost_the_lookback():
    plan = Exploration((ExplorationArm(1, 0.1), ExplorationArm(9, 0.1)), salt=2)
    history = ReleaseHistory.of([(config(3), np.array([1], dtype=np.uint64)),
                                 (config(6, "l1", plan), np.array([2, 3], dtype=np.uint64)),
                                 (config(6, "l1", plan), np.empty(0, dtype=np.uint64))])
    assert history.summary() == {"releases": 2, "configurations": [
        {"encoding": "linf", "count_limit": 3, "arm_count_limits": []},
        {"encoding": "l1", "count_limit": 6, "arm_count_limits": [1, 9]}]}


def test_a_release_history_is_immutable_and_refuses_a_descent_anywhere():
    history = ReleaseHistory((config(3),), ((0, np.array([1, 2], dtype=np.uint64)),))
    with pytest.raises(dataclasses.FrozenInstanceError):
        history.configurations = ()
    with pytest.raises(InvalidInput, match="sorted and distinct"):
        ReleaseHistory((config(3),), ((0, np.array([1, 3, 2], dtype=np.uint64)),))


def test_a_lookback_row_is_found_past_releases_that_hold_nothing_of_it():
    history = ReleaseHistory.of([(config(2), np.empty(0, dtype=np.uint64)), (config(4), np.array([7], dtype=np.uint64)),
                                 (config(8), np.array([5, 9], dtype=np.uint64))])
    assert history.configurations_of(np.array([9, 7], dtype=np.uint64)).tolist() == [
        [False, False, True], [False, True, False]]
    # costed with the later configuration even though the first ones released other rows
    log = Conversions(np.array([0, 0]), np.array([10, DAY + 10]), {"s": np.array([0, 0])}, np.ones((2, 1)),
                      ("value",))
    batch = concat_periods(log.take(np.array([1])), log.take(np.array([0])))
    history = ReleaseHistory.of([(config(2), np.array([1], dtype=np.uint64)),
                                 (config(9), released_ids(log, np.array([0])))])
    today = config(5)
    low, high = lifetime_norms(batch, today, encode(batch.values, today, np.random.default_rng(0)), history)
    assert low[~batch.period_mask()].tolist() == high[~batch.period_mask()].tolist() == [GAMMA // 9]


def test_norm_bounds_refuse_values_of_another_shape():
    with pytest.raises(InvalidInput, match="2 columns"):
        norm_bounds(np.ones((3, 2)), np.arange(3), config(3))


def test_a_seeded_baseline_lookback_costs_what_the_seeded_earlier_day_spent():
    """Simulation: rounding is keyed by (seed, record), so the lookback's baseline norms are the ones the
    earlier seeded day drew and each day keeps what one lifetime cap over the whole log keeps."""
    log = daily_log(5, impressions=60, days=3)
    p = config(3, "baseline")
    _, lifetime = encode_and_bound(log, p, simulation_seed=9)
    for day in (1, 2):
        _, kept = encode_and_bound(with_lookback(log, day), p, simulation_seed=9)
        assert kept[with_lookback(log, day).period_mask()].sum() == lifetime[day_rows(log, day)].sum()


def test_seeded_uniforms_make_a_baseline_lookback_rows_cost_exact():
    log = Conversions(np.array([0, 0]), np.array([10, DAY + 10]), {"s": np.array([0, 0])}, np.array([[2.3], [1.7]]),
                      ("value",))
    batch = concat_periods(log.take(np.array([1])), log.take(np.array([0])))
    p = config(3, "baseline")
    uniforms = np.array([[0.99], [0.01]])  # the period row rounds down, the lookback row rounds up
    contributions = encode(batch.values, p, uniforms=uniforms)
    back = ~batch.period_mask()
    low, high = lifetime_norms(batch, p, contributions, None, uniforms)
    assert low[back].tolist() == high[back].tolist() == contributions[back].sum(axis=1).tolist()
    low, high = lifetime_norms(batch, p, contributions, None)  # not reproducible: floor and ceiling
    assert (high[back] - low[back]).tolist() == [1] and high[back].tolist() == contributions[back].sum(axis=1).tolist()


def test_intervals_are_honoured_when_every_lower_norm_is_equal_or_every_interval_is_wide():
    assert _bound([5, 5], [6, 5], [0, 0]).tolist() == [True, False]  # equal lower norms: not the equal-norm shortcut
    assert _bound([5, 4], [6, 5], [0, 0]).tolist() == [True, False]  # no point interval at all


def test_bound_contributions_takes_upper_norms_in_input_order():
    # the three records of the first interval test, given out of time order
    kept = bound_contributions(np.zeros(3, dtype=np.int64), np.array([3, 1, 2]), np.array([1, 5, 5]), 10,
                               upper_norms=np.array([1, 6, 5]))
    assert kept.tolist() == [False, True, False]


def test_upper_norms_of_the_wrong_kind_are_refused():
    rank, group = ranks_within_impression(np.zeros(2, dtype=np.int64))
    with pytest.raises(InvalidInput, match="upper must be"):
        bound_sorted(np.array([1, 1]), rank, group, 10, equal_norm=1, upper=np.array([1, 2]))
    with pytest.raises(InvalidInput, match="upper must be"):
        bound_sorted(np.array([1, 1]), rank, group, 10, upper=np.array([1, 2, 3]))
    with pytest.raises(InvalidInput, match="integers"):
        bound_sorted(np.array([1, 1]), rank, group, 10, upper=np.array([1.5, 2.0]))
    with pytest.raises(InvalidInput, match="upper_norms must be"):
        bound_contributions(np.zeros(2), np.arange(2), np.ones((2, 1), dtype=np.int64), 10,
                            upper_norms=np.array([1, 2]))
    with pytest.raises(InvalidInput, match="upper_norms must be"):
        bound_contributions(np.zeros(2), np.arange(2), np.array([1, 1]), 10, upper_norms=np.array([1, 2, 3]))
