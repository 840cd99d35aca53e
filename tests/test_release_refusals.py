"""The privacy refusals a release command only calls (the rules live in the core): a debug run of a target
whose debug output is unnoised sums needs a simulation; privacy-safe tuning takes no joined log; a W3C
Attribution release that cannot carry an earlier release's budgets is refused by the ledger step."""
from __future__ import annotations

import numpy as np
import pytest

from araopt import Params, QueryParams
from araopt.attribution.params import COUNT, AttributionParams, AttributionQuery
from araopt.errors import PrivacyRefusal
from araopt.ledger.attribution import prepare_release
from araopt.ledger.ledger import Ledger
from araopt.mechanism.keys import KeyDomain
from araopt.optimize.private_inputs import refuse_joined_inputs
from araopt.release_workflow import check_debug_run
from araopt.targets import ARA, ATTRIBUTION
from araopt.version import ParameterVersion


def _attribution() -> ParameterVersion:
    queries = (AttributionQuery(COUNT, None), AttributionQuery("revenue", "value", max_value=255, clip=50.0))
    params = AttributionParams.from_paper(per_site_budget=4.0, count_limit=4, fractions={COUNT: 0.25, "revenue": 0.75},
                                          queries=queries, slice_columns=("campaign",))
    layout = KeyDomain.from_slice_values(params.slice_columns, {"campaign": np.arange(3)}, params.query_names)
    return ParameterVersion.for_attribution(params, domain=layout)


def _ara() -> ParameterVersion:
    return ParameterVersion(Params(count_limit=2, encoding="linf", epsilon=8.0, slice_columns=("campaign",),
                                   queries=(QueryParams("value", 30.0, 1.0),)))


def test_a_debug_run_of_unnoised_sums_needs_a_simulation():
    assert ATTRIBUTION.debug_needs_simulation and not ARA.debug_needs_simulation
    with pytest.raises(PrivacyRefusal, match="--debug-run writes unnoised sums"):
        check_debug_run(_attribution(), True, None)
    check_debug_run(_attribution(), True, 0)  # a simulation
    check_debug_run(_attribution(), False, None)  # a release without debug output
    check_debug_run(_ara(), True, None)  # ARA's debug run is the Aggregation Service's (operator-private)


def test_privacy_safe_tuning_refuses_the_options_of_a_joined_log():
    refuse_joined_inputs([])
    with pytest.raises(PrivacyRefusal, match="drop --history and --lookback"):
        refuse_joined_inputs(["--history", "--lookback"])


def test_a_release_on_an_empty_ledger_takes_a_new_draw_key_and_no_history(tmp_path):
    version = _attribution()
    assert version.attribution is not None
    ledger = Ledger.open(str(tmp_path / "ledger"), allow_rerelease=False)
    key, history = prepare_release(ledger, version.attribution, ("campaign", "value"), (0, 10), (0, 10), None)
    again, _ = prepare_release(ledger, version.attribution, ("campaign", "value"), (0, 10), (0, 10), None)
    assert not history.releases and not history.excluded
    assert key != again  # nothing recorded yet: each release would draw its own key
