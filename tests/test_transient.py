"""Issue 26: what a main release keeps after count-limit moves (``optimize.transient``) against a
brute-force run of Alg. 1 (``mechanism.bounding.bound_sorted``) over simulated impressions, and the
slices' retention identified from releases in a transient."""
import numpy as np
import pytest

from araopt.constants import CONTRIBUTION_BUDGET
from araopt.mechanism.bounding import bound_sorted, kept_per_impression
from araopt.optimize.slice_retention import MEANS, geometric_log_weights
from araopt.optimize.transient import SPREAD_DAYS, kept_share, kept_table


def alg1_share(schedule: list[int], mean: float, per_day: int, seed: int) -> float:
    """The kept share of the last day's conversions by Alg. 1 over every impression's life: impressions
    start uniformly over the days of ``schedule`` and the ``SPREAD_DAYS`` before it (at its first count
    limit), Geometric(``mean``) conversions uniform over the window after each, a conversion costed
    floor(Gamma / C) at its day's count limit."""
    rng = np.random.default_rng(seed)
    days = len(schedule) + SPREAD_DAYS
    limits = np.concatenate([np.full(SPREAD_DAYS, schedule[0]), schedule])  # day index 0..days-1
    starts = rng.random(per_day * (days + SPREAD_DAYS)) * (days + SPREAD_DAYS) - SPREAD_DAYS  # the last day: days - 1
    sizes = rng.geometric(1.0 / mean, len(starts))
    imp = np.repeat(np.arange(len(starts)), sizes)
    time = starts[imp] + rng.random(len(imp)) * SPREAD_DAYS
    keep = (time >= 0) & (time < days)
    imp, time = imp[keep], time[keep]
    order = np.lexsort((time, imp))
    imp, time = imp[order], time[order]
    day = np.floor(time).astype(np.int64)
    first = np.r_[True, imp[1:] != imp[:-1]]
    group = np.cumsum(first) - 1
    rank = np.arange(len(imp)) - np.flatnonzero(first)[group]
    norms = CONTRIBUTION_BUDGET // limits[day]
    kept = bound_sorted(norms, rank, group)
    last = day == days - 1
    return float(kept[last].mean())


@pytest.mark.parametrize("schedule", [
    [5] * 25 + [20] * 6,          # a move up six days ago: the conversions charged at 5 leave no room
    [20] * 28 + [3] * 3,          # a move down: the cheap conversions charged at 20 leave room above K(3)
    [5] * 10 + [3, 4, 3, 4, 5] * 4 + [13],  # the schedule of a probing tuner
])
def test_the_kept_share_after_count_limit_moves_is_alg1_s_over_the_impression_s_life(schedule):
    g = int(np.abs(MEANS - 4.0).argmin())
    weights = np.exp(geometric_log_weights()[g])
    predicted = float(kept_share(weights, schedule)[0])
    brute = alg1_share(schedule, float(MEANS[g]), 4000, 7)
    settled = float(weights @ np.minimum(np.arange(1, len(weights) + 1), kept_per_impression(schedule[-1])))
    assert predicted == pytest.approx(brute, abs=0.015)
    assert abs(brute - settled) > 0.04  # a transient the settled curve would miss


def test_a_settled_schedule_keeps_the_first_k_of_every_impression():
    np.testing.assert_array_equal(kept_table([7] * 40)[:10], np.minimum(np.arange(1, 11), 7.0))
    assert kept_table([4, 9])[-1] <= 20  # never more than the report limit
    with pytest.raises(ValueError):
        kept_table([])


def _transient_days(tables: bool) -> tuple:
    """Thirty daily releases of 8 slices (half converting 1.5 times per impression, half 8), the count
    limit moved from 5 to 20 on day 20 and to 3 on day 26: each release keeps what Alg. 1 keeps after
    the count limits before it (``kept_table``), 2,000 conversions a slice a day, little noise."""
    from araopt.optimize.retention import MAX_SIZE, RetentionCurve
    from araopt.optimize.slice_retention import SliceDays

    schedule = [5] * 20 + [20] * 6 + [3] * 4
    grid = [int(np.abs(MEANS - m).argmin()) for m in (1.5, 8.0)]
    family = np.exp(geometric_log_weights())
    curves = family[[grid[k % 2] for k in range(8)]]
    table = np.stack([kept_table(schedule[max(0, d - SPREAD_DAYS):d + 1]) for d in range(len(schedule))], axis=1)
    kept = 2000.0 * (curves @ table).T  # (days, slices)
    pooled = RetentionCurve(curves.mean(axis=0))
    ranks = np.array([kept_per_impression(c) for c in schedule])
    days = SliceDays(ranks, kept.sum(axis=1), kept, np.full(kept.shape, 4.0), table[:MAX_SIZE] if tables else None)
    return days, pooled, np.array([MEANS[grid[k % 2]] for k in range(8)])


def test_releases_in_a_transient_identify_each_slice_s_conversions_per_impression():
    """Read with the count limits before each release, the releases after the moves identify each
    slice's mean conversions per impression; read as if settled at their count limits they do not."""
    from araopt.optimize.slice_retention import slice_posterior

    errors = {}
    for tables in (True, False):
        days, pooled, truth = _transient_days(tables)
        posterior = slice_posterior(days, pooled, [np.arange(8) % 2])
        errors[tables] = np.abs(np.log(posterior.mean_size() / truth))
    assert errors[True].max() < np.log(1.25)
    assert errors[False].max() > 2 * errors[True].max()


def test_tomorrow_s_count_ratio_carries_the_transient_of_the_move_it_makes():
    """Ten releases at C = 5 of slices converting once or eight times per impression: a candidate at
    C = 20 tomorrow keeps what Alg. 1 keeps after them (``kept_share``), far below the settled r(20),
    and the pseudo-history's steady kept totals are scaled by that (``mixing_factor``); after days back
    at 20 the releases there are moved by the model's transient from their days to tomorrow's."""
    import dataclasses

    from araopt.mechanism.keys import KeyDomain
    from araopt.optimize.private import FirstParty, cold_start, mixing_factor
    from araopt.optimize.private_model import PrivateModel
    from araopt.optimize.retention import RetentionCurve
    from tests.test_honest_intervals import _posterior, record

    means = np.array([1.0, 8.0])
    posterior = _posterior(means)
    curves = posterior.weights @ posterior.grid_weights
    pool = RetentionCurve(curves.mean(axis=0))
    domain = KeyDomain.from_slice_values(("s",), {"s": np.arange(2)}, ("value",))
    params = cold_start(FirstParty.of("d", np.arange(1.0, 100.0)), 8.0, domain, ("value",)).params
    params = dataclasses.replace(params, count_limit=20, exploration=None)

    def model(schedule: list[int]) -> PrivateModel:
        return PrivateModel(pool, {(0,): np.array([1000.0]), (1,): np.array([1000.0])}, np.zeros((0, 1)), 10,
                            slices=posterior, slice_keys=((0,), (1,)), schedule=tuple(schedule))

    def releases(schedule: list[int]) -> list:
        out = []
        for d, c in enumerate(schedule):
            shares = kept_share(curves, schedule[max(0, d - SPREAD_DAYS):d + 1])
            out.append(record(c, 1000.0 * shares, 2000.0))
        return out

    schedule = [5] * 10
    factor, same = mixing_factor(releases(schedule), params, model(schedule))
    tomorrow = float(kept_share(curves, [*schedule, 20]).mean())
    steady = float(kept_share(curves, [20]).mean())
    assert same == [] and factor == pytest.approx(tomorrow / steady) and factor < 0.8
    schedule = [20] * 10 + [5] * 3
    history = releases(schedule)
    factor, same = mixing_factor(history, params, model(schedule))
    then = np.mean([float(kept_share(curves, schedule[:d + 1]).mean()) for d in (7, 8, 9)])
    observed = np.mean([float(r.main[:, 0].sum()) / 2000.0 for r in history[7:10]])
    tomorrow = float(kept_share(curves, [*schedule, 20]).mean())
    assert len(same) == 3
    assert factor * steady == pytest.approx(observed * tomorrow / then)
    assert factor * steady == pytest.approx(tomorrow, rel=0.02)  # the releases are the model's own
