"""The privacy unit of W3C Attribution Level 1 (browser instance x conversion site x epoch) never
spends more than its per-site budget over its whole life; the safety limits (global budget per
epoch, impression-site quota per epoch) hold too; and the parameters and the encoder from a
conversion log keep their promises (value <= maxValue, the paper's count limit, one call per query)."""
import random

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from araopt.attribution.config import BrowserConfig
from araopt.attribution.encoder import browser_config, encode, encoded_values, simulate, unnoised_sums
from araopt.attribution.events import case_browser, replay_case
from araopt.attribution.params import COUNT, AttributionParams, AttributionQuery
from araopt.errors import InvalidParameters
from araopt.mechanism.keys import KeyDomain
from w3c import random_log, random_stream

E2E_DEFAULT = {**BrowserConfig(max_histogram_size=8, max_credit_size=4).to_e2e(), "epochStart": 0.5,
               "fairlyAllocateCreditFraction": 0.5}


def _check_ledgers(browser):
    cfg = browser.config
    assert all(v <= cfg.per_site_budget for v in browser.spent.values()), browser.spent
    assert all(v <= cfg.global_budget_per_epoch for v in browser.spent_global.values()), browser.spent_global
    assert all(v <= cfg.impression_site_quota_per_epoch for v in browser.spent_quota.values()), browser.spent_quota
    assert all(v >= 0 for v in browser.budget.values())


@given(seed=st.integers(0, 2**32 - 1), global_budget=st.sampled_from((1_000_000, 3_000_000, 4_000_000_000)))
def test_no_privacy_unit_spends_more_than_its_per_site_budget_over_its_life(seed, global_budget):
    """Adversarial streams (many reports per site and epoch, lookbacks across epochs, clearing of
    history with and without forgetting visits, disabling) through one browser each: the ledger of
    what each (epoch, conversion site) ever had deducted stays within the per-site budget, also
    after its budget entry was forgotten; likewise the global budget and impression-site quotas."""
    case = random_stream(random.Random(seed), events=80)
    case["config"]["globalPrivacyBudgetPerEpoch"] = global_budget
    browser = case_browser(case, E2E_DEFAULT)
    rows = replay_case(case, E2E_DEFAULT, browser=browser)
    _check_ledgers(browser)
    spent = sum(browser.spent.values())
    accepted = sum(sum(r.outcome.deducted) for r in rows if r.outcome is not None)
    assert spent == accepted  # the ledger is what the reports say they took


def _params(rng: random.Random) -> AttributionParams:
    queries = (AttributionQuery(COUNT, None), AttributionQuery("value", "value", max_value=rng.choice((1, 7, 255)),
                                                               clip=rng.choice((5.0, 10.0, 40.0))))
    fractions = {COUNT: 0.25, "value": 0.75}
    return AttributionParams.from_paper(rng.choice((1.0, 4.0, 10.0)), rng.randrange(1, 6), fractions, queries,
                                        ("campaign",), lookback_days=rng.choice((7, 30)))


@given(seed=st.integers(0, 2**32 - 1))
def test_no_browser_of_an_encoded_log_spends_more_than_its_per_site_budget(seed):
    """Random logs (several users, impressions and conversions each, tied times, conversions past the
    lookback, values above the clip) encoded for random parameters: every browser's ledger stays
    within the budget, every report's value within maxValue, and the reports refused for budget
    are exactly those beyond what the budget holds."""
    rng = random.Random(seed)
    params = _params(rng)
    log = random_log(rng, users=rng.randrange(1, 5))
    domain = KeyDomain.from_slice_values(("campaign",), {"campaign": np.arange(3)}, params.query_names)
    uniforms = np.random.default_rng(seed).random((len(log), len(params.queries)))
    streams, mask = encode(params, log, domain, uniforms)
    assert mask.all()
    config = browser_config(params, domain.num_slices)
    for stream in streams:
        outcomes, browser = simulate(stream, config, rng.random(), rng.random)
        _check_ledgers(browser)
        for ev in stream.events:
            if ev["event"] == "measureConversion":
                assert 1 <= ev["options"]["value"] <= ev["options"]["maxValue"]
        assert len(outcomes) == sum(1 for ev in stream.events if ev["event"] == "measureConversion")
    for stream in streams:  # a browser's events are sequential: strictly increasing times
        seconds = [ev["seconds"] for ev in stream.events]
        assert all(b > a for a, b in zip(seconds, seconds[1:], strict=False))
    saved = sum(1 for s in streams for ev in s.events if ev["event"] == "saveImpression")
    assert saved == len({(r.browser_id, r.impression_id) for r in log.itertuples()})


def test_the_count_limit_is_the_number_of_full_reports_the_budget_holds():
    """C full conversions (every query at maxValue, across epochs) fit in one site-epoch; the next is refused."""
    queries = (AttributionQuery(COUNT, None), AttributionQuery("value", "value", max_value=255, clip=100.0))
    params = AttributionParams.from_paper(1.0, 3, {COUNT: 0.5, "value": 0.5}, queries, ("campaign",))
    assert params.count_limit(multi_epoch=True) == 3
    assert params.count_limit(multi_epoch=False) >= 6  # a single-epoch report costs half
    day = 86_400_000_000
    t0 = 1_767_225_600_000_000
    log = pd.DataFrame({"browser_id": 1, "impression_id": 7, "campaign": 2, "impression_time_us": t0,
                        "conversion_time_us": [t0 + 8 * day + i * 1_000_000 for i in range(5)], "value": 500.0})
    domain = KeyDomain.from_slice_values(("campaign",), {"campaign": np.arange(3)}, params.query_names)
    streams, _ = encode(params, log, domain, np.zeros((5, 2)))
    config = browser_config(params, domain.num_slices)
    outcomes, browser = simulate(streams[0], config, 0.0, lambda: 0.5)
    refused = [refused for _, _, _, refused in outcomes]
    assert refused == [False] * 6 + [True] * 4  # 3 conversions x 2 queries accepted, then refused
    sums = unnoised_sums(params, outcomes, domain.num_slices)
    assert sums[(COUNT, 0)].tolist() == [0, 0, 3] and sums[("value", 0)].tolist() == [0, 0, 3 * 255]


def test_values_are_clipped_scaled_and_rounded_without_bias():
    query = AttributionQuery("value", "value", epsilon=1.0, max_value=7, clip=14.0)  # s = 0.5 unit per euro
    params = AttributionParams(4.0, (query,), ("campaign",))
    values = np.array([[0.0], [3.0], [14.0], [1000.0]])
    assert encoded_values(params, values, np.zeros((4, 1))).ravel().tolist() == [0, 2, 7, 7]  # u=0: rounds up
    assert encoded_values(params, values, np.full((4, 1), 0.999)).ravel().tolist() == [0, 1, 7, 7]
    draws = np.random.default_rng(1).random((200_000, 1))
    mean = encoded_values(params, np.full((200_000, 1), 3.0), draws).mean() / query.value_scale
    assert mean == pytest.approx(3.0, abs=0.01)  # Alg. 4: divide by the value scale


def test_parameters_that_no_report_could_fit_are_refused():
    with pytest.raises(InvalidParameters, match="no report would be accepted"):
        AttributionParams(0.5, (AttributionQuery(COUNT, None, epsilon=1.0),), ("campaign",))
    with pytest.raises(InvalidParameters, match="count query"):
        AttributionQuery(COUNT, None, max_value=3)


def test_the_attribution_columns_of_a_log_are_optional_and_typed():
    import pyarrow as pa

    from araopt.errors import InvalidInput
    from araopt.io.conversions import check_attribution_schema

    base = [pa.field("impression_id", pa.int64()), pa.field("conversion_time", pa.timestamp("us", "UTC"))]
    assert check_attribution_schema(pa.schema(base)) == ()
    full = pa.schema([*base, pa.field("conversion_site", pa.string()), pa.field("browser_id", pa.string()),
                      pa.field("impression_time", pa.timestamp("us", "UTC"))])
    assert check_attribution_schema(full) == ("browser_id", "impression_time", "conversion_site")
    with pytest.raises(InvalidInput, match="'browser_id' must be integer or string"):
        check_attribution_schema(pa.schema([*base, pa.field("browser_id", pa.float64())]))
    with pytest.raises(InvalidInput, match="'impression_site' must be string"):
        check_attribution_schema(pa.schema([*base, pa.field("impression_site", pa.int32())]))


@pytest.mark.parametrize("make, message", [
    (lambda: AttributionQuery("", None), "name must be a non-empty string"),
    (lambda: AttributionQuery("v", "v", epsilon=0.0), "epsilon must lie in"),
    (lambda: AttributionQuery("v", "v", epsilon=4295.0), "epsilon must lie in"),
    (lambda: AttributionQuery("v", "v", max_value=0), "max_value must be an integer"),
    (lambda: AttributionQuery("v", "v", max_value=2**32), "max_value must be an integer"),
    (lambda: AttributionQuery("v", "v", clip=float("inf")), "clip must be a finite number"),
    (lambda: AttributionParams(1.0, (AttributionQuery("a", None, 0.1), AttributionQuery("a", None, 0.1)), ("c",)),
     "duplicate name"),
    (lambda: AttributionParams(1.0, (AttributionQuery("a", None, 0.1),), ("c",), ("c",)), "share"),
    (lambda: AttributionParams(1.0, (AttributionQuery("a", None, 0.1),), ("c",), lookback_days=0), "lookback_days"),
    (lambda: AttributionParams(1.0, (AttributionQuery("a", None, 0.1),), ("c",), credit=()), "credit"),
    (lambda: AttributionParams(0.0, (AttributionQuery("a", None, 0.1),), ("c",)), "per_site_budget"),
    (lambda: AttributionParams.from_paper(1.0, 0, {"a": 1.0}, (AttributionQuery("a", None),), ("c",)), "count_limit"),
    (lambda: AttributionParams.from_paper(1.0, 2, {"a": 0.5}, (AttributionQuery("a", None),), ("c",)), "sum to 1"),
    (lambda: AttributionParams.from_paper(1e-6, 3, {"a": 1.0}, (AttributionQuery("a", None),), ("c",)), "microepsilon"),
    (lambda: BrowserConfig(epoch_days=0), "epoch_days"),
    (lambda: BrowserConfig.from_e2e({"perSitePrivacyBudget": 1}), "missing"),
])
def test_parameters_out_of_range_are_refused_naming_the_field(make, message):
    with pytest.raises(InvalidParameters, match=message):
        make()


def test_a_query_at_max_value_deducts_half_its_epsilon_in_one_epoch_and_all_of_it_across_epochs():
    query = AttributionQuery("v", "v", epsilon=0.6, max_value=255, clip=10.0)
    assert (query.deduction(255, multi_epoch=False), query.deduction(255, multi_epoch=True)) == (300_000, 600_000)
    assert query.deduction(1, multi_epoch=True) == 2353  # ceil(10^6 x 2 x 0.6 / 510): rounded up
