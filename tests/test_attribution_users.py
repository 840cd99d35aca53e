"""Users for a log that has none (``araopt.data.users``), and a synthetic preset with users through
the W3C Attribution measurement."""
import numpy as np
import pandas as pd
import pytest

from araopt.attribution.measure import measure
from araopt.attribution.params import COUNT, AttributionParams, AttributionQuery
from araopt.data.synthetic import PRESETS, generate_table
from araopt.data.users import with_users
from araopt.errors import InvalidInput, InvalidParameters
from araopt.mechanism.keys import KeyDomain


@pytest.fixture(scope="module")
def synthetic_log():
    preset = next(iter(PRESETS.values()))
    return generate_table(preset, seed=3, scale=0.02, days=14).to_pandas()


def test_every_impression_belongs_to_one_browser_and_browsers_have_several(synthetic_log):
    log = with_users(synthetic_log, impressions_per_user=4.0, seed=1, impression_sites=("p1.example", "p2.example"),
                     conversion_sites=("a1.example", "a2.example", "a3.example"))
    per_impression = log.groupby("impression_id")[["browser_id", "impression_site"]].nunique()
    assert (per_impression == 1).all().all()
    impressions_per_browser = log.groupby("browser_id")["impression_id"].nunique()
    assert impressions_per_browser.mean() == pytest.approx(4.0, rel=0.15)
    assert set(log["conversion_site"]) == {"a1.example", "a2.example", "a3.example"}
    again = with_users(synthetic_log, impressions_per_user=4.0, seed=1, impression_sites=("p1.example", "p2.example"),
                       conversion_sites=("a1.example", "a2.example", "a3.example"))
    pd.testing.assert_frame_equal(log, again)
    assert not with_users(synthetic_log, 4.0, seed=2)["browser_id"].equals(log["browser_id"])


def test_a_preset_with_users_runs_through_the_attribution_measurement(synthetic_log):
    log = with_users(synthetic_log, impressions_per_user=5.0, seed=0)
    rows = log.assign(impression_time_us=log["impression_time"].astype("datetime64[us, UTC]").astype("int64"),
                      conversion_time_us=log["conversion_time"].astype("datetime64[us, UTC]").astype("int64"))
    queries = (AttributionQuery(COUNT, None), AttributionQuery("value", "value", max_value=255, clip=300.0))
    params = AttributionParams.from_paper(1.0, 2, {COUNT: 0.2, "value": 0.8}, queries, ("campaignId",))
    domain = KeyDomain.from_slice_values(("campaignId",), {"campaignId": np.arange(16)}, params.query_names)
    result = measure(params, rows, domain, simulation_seed=5)
    assert result.rows == len(rows) and result.rows_outside_domain == 0
    assert 0 < result.reports_refused < len(result.reports.accepted)
    assert result.unnoised[(COUNT, 0)].sum() == result.reports.accepted[result.reports.query == 0].sum()


def test_users_need_impression_times_and_sensible_sizes(synthetic_log):
    with pytest.raises(InvalidInput, match="impression_time"):
        with_users(synthetic_log.drop(columns=["impression_time"]))
    with pytest.raises(InvalidParameters, match="impressions_per_user"):
        with_users(synthetic_log, impressions_per_user=0.5)
