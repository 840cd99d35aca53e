"""One Attribution Level 1 measurement in memory: reproducible in simulation whatever the row order,
refused without a declared domain outside simulation, and its estimates those of the browsers'
reports (count exact when nothing is refused, values within the rounding)."""
import dataclasses

import numpy as np
import pandas as pd
import pytest

from araopt.attribution.measure import measure
from araopt.attribution.params import COUNT, AttributionParams, AttributionQuery
from araopt.errors import PrivacyRefusal
from araopt.mechanism.keys import KeyDomain

DAY_US = 86_400_000_000


def _log(n=3000, seed=3):
    g = np.random.default_rng(seed)
    imp = g.integers(0, n // 3, n)
    t0 = 1_767_225_600_000_000
    shown = t0 + (imp % 50) * DAY_US // 3
    return pd.DataFrame({"browser_id": imp % 400, "impression_id": imp, "campaign": imp % 4,
                         "impression_time_us": shown, "conversion_time_us": shown + g.integers(0, 6, n) * DAY_US,
                         "value": g.uniform(0, 30, n)})


def _params(budget, count_limit=2):
    queries = (AttributionQuery(COUNT, None), AttributionQuery("value", "value", max_value=1023, clip=40.0))
    return AttributionParams.from_paper(budget, count_limit, {COUNT: 0.2, "value": 0.8}, queries, ("campaign",),
                                        lookback_days=7)


def test_a_simulated_measurement_is_reproducible_whatever_the_row_order():
    log, params = _log(), _params(1.0)
    first = measure(params, log, simulation_seed=11)
    shuffled = measure(params, log.sample(frac=1.0, random_state=5), simulation_seed=11)
    assert first.reports_refused > 0
    for key in first.unnoised:
        assert first.unnoised[key].tolist() == shuffled.unnoised[key].tolist()
        assert first.noisy[key].tolist() == shuffled.noisy[key].tolist()
    other = measure(params, log, simulation_seed=12)
    assert any(first.noisy[k].tolist() != other.noisy[k].tolist() for k in first.noisy)


def test_without_a_declared_domain_only_a_simulation_may_run():
    with pytest.raises(PrivacyRefusal, match="declared domain"):
        measure(_params(1.0), _log())


def test_with_budget_to_spare_the_reports_carry_the_true_totals():
    log, params = _log(), _params(1000.0, count_limit=500)
    domain = KeyDomain.from_slice_values(("campaign",), {"campaign": np.arange(4)}, params.query_names)
    result = measure(params, log, domain, simulation_seed=2)
    assert result.reports_refused == 0 and result.rows_outside_domain == 0
    counts = log.groupby("campaign").size().reindex(range(4), fill_value=0).to_numpy()
    assert result.unnoised[(COUNT, 0)].tolist() == counts.tolist()
    truth = log.groupby("campaign")["value"].sum().reindex(range(4), fill_value=0).to_numpy()
    scale = params.queries[1].value_scale
    rounding_sd = np.sqrt(counts / 4) / scale  # RR's variance is at most 1/4 per report
    assert np.all(np.abs(result.unnoised[("value", 0)] / scale - truth) <= 5 * rounding_sd + 1e-9)
    estimate = result.estimates[("value", 0)]
    assert np.all(np.abs(estimate.values - truth) <= estimate.half_width * 3 + 5 * rounding_sd)


def test_the_secure_measurement_needs_no_seed_and_adds_noise():
    log, params = _log(), _params(4.0)
    domain = KeyDomain.from_slice_values(("campaign",), {"campaign": np.arange(4)}, params.query_names,
                                         origin="declared")  # listed by the operator
    result = measure(params, log, domain)
    assert any((result.noisy[k] != result.unnoised[k]).any() for k in result.noisy)


def test_the_secure_measurement_refuses_a_domain_derived_from_the_data():
    log, params = _log(), _params(4.0)
    derived = KeyDomain.from_slice_values(("campaign",), {"campaign": np.arange(4)}, params.query_names)  # origin data
    with pytest.raises(PrivacyRefusal, match="derived from the data"):
        measure(params, log, derived)
    assert measure(params, log, derived, simulation_seed=3).noisy


@pytest.mark.parametrize("epoch_days", [1, 7])
def test_the_reference_draw_of_a_browsers_grid_is_whole_seconds_and_gives_that_grid(epoch_days):
    """Each browser's epochs are a grid fixed by its draw alone (every release agrees on them); the
    spec's browser fixes the hour of its first measureConversion minus its draw: the exported draw
    gives it the same grid, and is whole seconds of the epoch (the reference's Temporal refuses a
    fractional second)."""
    from araopt.attribution.browser import Browser
    from araopt.attribution.config import BrowserConfig
    from araopt.attribution.simulate import epoch_grid, reference_draws

    config = BrowserConfig(epoch_days=epoch_days)
    rng = np.random.default_rng(epoch_days)
    starts = epoch_grid(rng.random(20_000), config)
    assert (starts % 3_600_000 == 0).all() and ((starts >= 0) & (starts < config.epoch_ms)).all()
    first = 1_767_225_600_000 + rng.integers(0, 400 * 86_400_000, 20_000)
    draws = reference_draws(starts, first, config)
    period = config.epoch_ms // 1000
    assert ((draws >= 0) & (draws < 1)).all() and (draws * period == np.floor(draws * period)).all()
    for s, f, d in list(zip(starts.tolist(), first.tolist(), draws.tolist(), strict=True))[:2000]:
        browser = Browser(config, d, lambda: 0.5)
        browser.epoch(f)  # the first need fixes the epoch start
        assert (browser.epoch_start_time - s) % config.epoch_ms == 0


def test_a_browsers_grid_is_keyed_by_its_canonical_id_and_the_key():
    """"007", "7" and 7 are one browser: one grid; another key, other grids."""
    from araopt.attribution.config import BrowserConfig
    from araopt.attribution.draws import DrawKey
    from araopt.attribution.measure import epoch_starts

    class Plan:
        def __init__(self, ids):
            self.browsers = ids

    config, key = BrowserConfig(), DrawKey.new()
    spelt = [np.array(["007", "8"], dtype=object), np.array(["7", "008"], dtype=object), np.array([7, 8])]
    grids = [epoch_starts(Plan(ids), config, key).tolist() for ids in spelt]
    assert grids[0] == grids[1] == grids[2]
    many = np.arange(1000)
    assert (epoch_starts(Plan(many), config, key) != epoch_starts(Plan(many), config, DrawKey.new())).mean() > 0.9
    assert epoch_starts(Plan(many), config, 3).tolist() == epoch_starts(Plan(many), config, 3).tolist()


def _with_tasks():
    """A log with a conversion-side slice (``kind``: the aggregation task) and its parameters."""
    log = _log().assign(kind=lambda f: f["impression_id"] % 2)
    queries = (AttributionQuery(COUNT, None), AttributionQuery("value", "value", max_value=1023, clip=40.0))
    params = AttributionParams.from_paper(4.0, 2, {COUNT: 0.2, "value": 0.8}, queries, ("campaign",),
                                          conversion_slice_columns=("kind",), lookback_days=7)
    layout = KeyDomain.from_slice_values(("campaign",), {"campaign": np.arange(4)}, params.query_names,
                                         origin="declared")
    return log, params, layout


def _tasks(params, origin, learnt_before_us=None):
    tasks = KeyDomain.from_slice_values(("kind",), {"kind": np.arange(2)}, params.query_names, origin=origin)
    return tasks if learnt_before_us is None else dataclasses.replace(tasks, learnt_before_us=learnt_before_us)


def test_the_task_domain_passes_the_release_rules_of_the_layout():
    """The task domain lists the conversion-side slices of what is released, as the layout lists the
    impression-side ones (red team, round sixteen: a task domain derived from the released data, or a
    version's history domain over that history, was released without a seed). Refused outside
    simulation on every path: the in-memory measure (``simulate_release``) and the graph's transform."""
    from transforms.attribution import MeasureAttribution

    log, params, layout = _with_tasks()
    with pytest.raises(PrivacyRefusal, match="the task domain was derived from the data"):
        measure(params, log, layout, task_domain=_tasks(params, "data"))
    with pytest.raises(PrivacyRefusal, match="the task domain was derived from the data"):
        MeasureAttribution(params, None, layout, None, 2, "browser_id", task_domain=_tasks(params, "data"))
    assert measure(params, log, layout, task_domain=_tasks(params, "data"), simulation_seed=3).noisy
    end = int(log["conversion_time_us"].max()) + 1  # a history ending after the last released conversion
    with pytest.raises(PrivacyRefusal, match="training history whose last conversion"):
        measure(params, log, layout, task_domain=_tasks(params, "history", end))
    with pytest.raises(PrivacyRefusal, match="whose end it does not record"):
        measure(params, log, layout, task_domain=_tasks(params, "history"))
    start = int(log["conversion_time_us"].min())  # a history that ended before every released conversion
    released = measure(params, log, layout, task_domain=_tasks(params, "history", start))
    assert {task for _, task in released.noisy} == {0, 1}
    assert measure(params, log, layout, task_domain=_tasks(params, "declared")).noisy


def test_the_browser_sums_record_their_earliest_released_conversion():
    """What the release step checks against a training window (``BrowserSums.first_time_us``): the
    earliest conversion of the release's own rows, a lookback row's not (it was released before), and
    the earliest over every shard when shards merge."""
    from araopt.attribution.measure import BrowserSums, simulate_browsers

    log, params = _log(), _params(4.0)
    layout = KeyDomain.from_slice_values(("campaign",), {"campaign": np.arange(4)}, params.query_names,
                                         origin="declared")
    times = log["conversion_time_us"]
    sums, _ = simulate_browsers(params, log, layout, simulation_seed=3)
    assert sums.first_time_us == int(times.min())
    earliest = times == times.min()
    looked_back, _ = simulate_browsers(params, log.assign(in_period=~earliest), layout, simulation_seed=3)
    assert looked_back.first_time_us == int(times[~earliest].min()) > int(times.min())
    assert BrowserSums.merge([looked_back, sums]).first_time_us == int(times.min())


def test_times_in_other_units_are_refused_not_compared():
    """The rows' times are microseconds, as the training window and the lookback compare them: a log in
    nanoseconds (pandas' datetime64, or int64) would pass a version's window by a factor of 1,000 (red
    team, round seventeen). Refused in one line before anything is simulated."""
    from araopt.errors import InvalidInput

    log, params = _log(), _params(4.0)
    domain = KeyDomain.from_slice_values(("campaign",), {"campaign": np.arange(4)}, params.query_names,
                                         origin="declared")
    for column in ("conversion_time_us", "impression_time_us"):
        for spelled in (log[column] * 1000, pd.to_datetime(log[column], unit="us"), log[column].astype(float)):
            with pytest.raises(InvalidInput, match=f"{column} must be integer microseconds"):
                measure(params, log.assign(**{column: spelled}), domain)
    assert measure(params, log, domain).noisy
