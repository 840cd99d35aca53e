"""One Attribution Level 1 measurement in memory: reproducible in simulation whatever the row order,
refused without a declared domain outside simulation, and its estimates those of the browsers'
reports (count exact when nothing is refused, values within the rounding)."""
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
def test_epoch_start_draws_are_whole_seconds_of_the_epoch(epoch_days):
    """The reference's Temporal refuses a fractional second: draw x epoch length must be an integer."""
    from araopt.attribution.config import BrowserConfig
    from araopt.attribution.encoder import schedule
    from araopt.attribution.measure import epoch_starts

    log = _log(n=30_000)
    log["browser_id"] = np.arange(len(log))
    params = _params(1.0)
    domain = KeyDomain.from_slice_values(("campaign",), {"campaign": np.arange(4)}, params.query_names)
    plan = schedule(params, log, domain, np.zeros((len(log), 2)))
    period = epoch_days * 86_400
    for seed in (None, 5):
        starts = epoch_starts(plan, BrowserConfig(epoch_days=epoch_days), seed)
        assert len(starts) == len(log) and ((starts >= 0) & (starts < 1)).all()
        assert (starts * period == np.floor(starts * period)).all()


def test_browser_keys_of_integer_ids_equal_pandas_object_hash() -> None:
    """The epoch-start draws are keyed by pandas' hash of each browser id as an object; the integer
    fast path must give the same 64 bits (extremes, negatives, unsigned), or every seeded run moves."""
    from araopt.attribution.measure import browser_keys

    signed = np.array([0, 1, -1, 7, 2**63 - 1, -2**63, 123_456_789_012], dtype=np.int64)
    unsigned = np.array([0, 1, 2**64 - 1, 2**63], dtype=np.uint64)
    for ids in (signed, unsigned, signed.astype(np.int32)):
        expected = pd.util.hash_array(np.asarray(ids, dtype=object)).astype(np.uint64)
        assert browser_keys(ids).tolist() == expected.tolist()
    strings = np.array(["b1", "b2", "b1"], dtype=object)
    assert browser_keys(strings).tolist() == pd.util.hash_array(strings).astype(np.uint64).tolist()
