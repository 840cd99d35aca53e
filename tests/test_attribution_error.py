"""The error terms of Attribution Level 1 estimates (bias from clipping and refused reports, variance
from noise and rounding) against repeated simulated measurements."""
import numpy as np
import pandas as pd
import pytest

from araopt.attribution.error import error_terms
from araopt.attribution.measure import measure
from araopt.attribution.params import COUNT, AttributionParams, AttributionQuery
from araopt.mechanism.keys import KeyDomain

DAY_US = 86_400_000_000


def _log(n=600, seed=1):
    g = np.random.default_rng(seed)
    shown = 1_767_225_600_000_000 + g.integers(0, 3, n) * DAY_US
    return pd.DataFrame({"browser_id": np.arange(n), "impression_id": np.arange(n), "campaign": g.integers(0, 3, n),
                         "impression_time_us": shown, "conversion_time_us": shown + DAY_US,
                         "value": g.choice([3.3, 7.7, 12.5, 60.0], n)})


def _params(budget, count_limit):
    queries = (AttributionQuery(COUNT, None), AttributionQuery("value", "value", max_value=15, clip=20.0))
    return AttributionParams.from_paper(budget, count_limit, {COUNT: 0.5, "value": 0.5}, queries, ("campaign",))


def test_the_error_terms_predict_repeated_measurements():
    """One conversion per browser and budget to spare: nothing is refused, so the bias is clipping
    alone (60 clipped to 20) and the spread is noise plus rounding, whatever the seed."""
    log, params = _log(), _params(4.0, 1)
    domain = KeyDomain.from_slice_values(("campaign",), {"campaign": np.arange(3)}, params.query_names)
    terms = error_terms(params, log, domain, simulation_seed=0)
    clipped = log.assign(excess=np.maximum(log["value"] - 20.0, 0)).groupby("campaign")["excess"].sum()
    assert terms.bias[1] == pytest.approx(-clipped.reindex(range(3)).to_numpy())
    assert terms.bias[0] == pytest.approx(np.zeros(3))
    errors = np.array([measure(params, log, domain, simulation_seed=s).estimates[("value", 0)].values - terms.truth[1]
                       for s in range(1, 301)])
    assert errors.mean(axis=0) == pytest.approx(terms.bias[1], abs=4 * np.sqrt(terms.variance[1] / 300).max())
    assert errors.var(axis=0) == pytest.approx(terms.variance[1], rel=0.25)


def test_refused_reports_are_a_bias_towards_zero():
    """Many conversions per browser and epoch with a small budget: the refused reports' values are
    missing from the expected estimate, so the count's bias is minus the refused count."""
    log = _log()
    log["browser_id"] = log["browser_id"] % 20
    params = _params(1.0, 2)
    domain = KeyDomain.from_slice_values(("campaign",), {"campaign": np.arange(3)}, params.query_names)
    terms = error_terms(params, log, domain, simulation_seed=3)
    refused = measure(params, log, domain, simulation_seed=3)
    assert refused.reports_refused > 0
    missing = (~refused.reports.accepted & (refused.reports.query == 0)).sum()
    assert -terms.bias[0].sum() == pytest.approx(missing)
    assert (terms.bias <= 1e-9).all() and (terms.rmsre(1.0) > 0).all()
