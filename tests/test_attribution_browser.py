"""Pieces of the W3C Attribution browser model: sites, credit allocation, conversion-side slices."""
import random

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from araopt.attribution.credit import fairly_allocate_credit, js_round
from araopt.attribution.encoder import encode
from araopt.attribution.errors import ApiError, ErrorName
from araopt.attribution.params import COUNT, AttributionParams, AttributionQuery
from araopt.attribution.sites import parse_site
from araopt.mechanism.keys import KeyDomain


@pytest.mark.parametrize("host, site", [  # what tldts' getDomain (the reference's parser) gives
    ("Foo.Example", "foo.example"), ("https://a.b.example/x", "b.example"), ("a_b.example", "a_b.example"),
    ("a.example.", "a.example"), ("a.example:443", "a.example"),
    # the URL parser ends an https URL's authority at a backslash: the host is before it, not after an '@'
    ("https://evil.example\\@shop.example/", "evil.example"), ("https://a.evil.example\\x", "evil.example"),
    ("%73hop.example", "shop.example"), ("shop.example:", "shop.example")])
def test_a_host_becomes_its_site(host, site):
    assert parse_site(host) == site


@pytest.mark.parametrize("host", ["1.2.3.4", "127.1", "0x7f.1", "127.0.1", "10.0.1", "0x7f.0.0.1", "shop.1",
                                  "shop.0x10", "shop.0x", "a.b.017", "１２７.１", "a..example", "-a.example", "a", "",
                                  ":", "a b.example", "localhost", "%FF.example", "a%2Fb.example", "%zz.example",
                                  "x.localhost"])
def test_what_is_no_site_is_a_syntax_error(host):
    with pytest.raises(ApiError) as err:
        parse_site(host)
    assert err.value.name is ErrorName.SYNTAX_ERROR


def test_js_round_rounds_halves_up_without_the_x_plus_half_error():
    assert [js_round(x) for x in (2.5, -2.5, 0.49999999999999994, -1e-17, 3.0)] == [3, -2, 0, 0, 3]


@given(credit=st.lists(st.floats(0.01, 100), min_size=1, max_size=10), value=st.integers(1, 2**32 - 1),
       seed=st.integers(0, 2**32 - 1))
def test_fairly_allocated_credit_sums_to_the_value_and_is_within_one_of_its_share(credit, value, seed):
    rng = random.Random(seed)
    shares = fairly_allocate_credit(credit, value, rng.random)
    assert sum(shares) == value
    total = sum(credit)
    assert all(abs(s - value * c / total) <= 1 + 1e-6 for s, c in zip(shares, credit, strict=True))


def test_a_conversion_side_slice_chooses_the_task_not_the_index():
    """The conversion's type cannot change the impression's histogramIndex: it selects the histogram
    (task) the report goes to; the index stays the impression-side slice."""
    params = AttributionParams(4.0, (AttributionQuery(COUNT, None),), ("campaign",), ("conversionType",))
    t0 = 1_767_225_600_000_000
    log = pd.DataFrame({"impression_id": [1, 1, 2], "campaign": [0, 0, 1], "conversionType": [3, 5, 3],
                        "impression_time_us": t0, "conversion_time_us": [t0 + 10, t0 + 20, t0 + 30]})
    domain = KeyDomain.from_slice_values(("campaign",), {"campaign": np.arange(2)}, params.query_names)
    tasks = KeyDomain.from_slice_values(("conversionType",), {"conversionType": np.array([3, 5])}, params.query_names)
    streams, mask = encode(params, log, domain, np.zeros((3, 1)), task_domain=tasks)
    assert mask.all()
    saved = {s.browser: [e["options"]["histogramIndex"] for e in s.events if e["event"] == "saveImpression"]
             for s in streams}
    assert saved == {1: [0], 2: [1]}
    assert [(e["task"], e["options"]["histogramSize"]) for s in streams for e in s.events
            if e["event"] == "measureConversion"] == [(0, 2), (1, 2), (0, 2)]


SPELLINGS = ["xn--bcher-kva.example", "bücher.example", "bu\u0308cher.example", "bü\u00adcher.example",
             "BÜCHER.Example", "bücher\u3002example", "https://shop.bücher.example:8443/cart",
             "b%C3%BCcher.example", "https://b%c3%bccher%2Eexample:/"]  # percent-decoded, an empty port


@pytest.mark.parametrize("host", SPELLINGS)
def test_every_spelling_of_a_site_is_the_site_the_browser_serialises(host):
    """The browser's URL parser serialises a host by UTS #46 to ASCII: each spelling of one site is that
    one site, so one privacy unit (a red team's log spelt one conversion site four ways and spent four
    per-site budgets in one epoch)."""
    assert parse_site(host) == "xn--bcher-kva.example"
    assert parse_site("ａｄｖ.example") == "adv.example"  # full-width letters


def test_the_spellings_of_a_site_share_one_site_code():
    """What the per-site budgets are keyed by (``simulate.site_codes``): one code for every spelling."""
    from araopt.attribution.simulate import site_codes

    codes = site_codes(np.array(SPELLINGS + ["other.example"], dtype=object), "conversion_site")
    assert len(set(codes[:-1].tolist())) == 1 and codes[-1] != codes[0]


@pytest.mark.parametrize("host", ["xn--zz-\u00e9.example", "xn--.example", "b\u00fccher..example"])
def test_a_host_uts46_rejects_is_no_site(host):
    with pytest.raises(ApiError) as err:
        parse_site(host)
    assert err.value.name is ErrorName.SYNTAX_ERROR


@pytest.mark.parametrize("upper, lower", [("ΑΣ-b.example", "ασ-b.example"), ("shop.ΟΔΟΣ.example", "shop.οδοσ.example"),
                                          ("https://ΟΔΟΣ-1.example/cart", "οδοσ-1.example")])
def test_a_capital_sigma_is_the_site_of_its_lower_case(upper, lower):
    """UTS #46 maps a capital sigma to sigma wherever it stands; Python's lower() applies the final-sigma rule
    (a capital sigma before a hyphen or at the end became the final sigma, another site): the host is case
    mapped by UTS #46 alone, so both spellings are one site, as in a browser."""
    assert parse_site(upper) == parse_site(lower)


def test_white_space_a_browser_refuses_is_no_site():
    with pytest.raises(ApiError) as err:
        parse_site("bücher.example\u3000")
    assert err.value.name is ErrorName.SYNTAX_ERROR
    assert parse_site(" a.example\t") == "a.example"  # ASCII white space around a host is trimmed


def test_which_of_two_conversions_at_one_instant_a_browser_admits_does_not_depend_on_the_files_order():
    """One impression converts on two sites at the same microsecond and the impression-site quota admits one
    of them: which one is decided by the rows' content (``measure._tie_breaks``), not by their order in the
    file, so a lookback re-exported in another order carries the budget state the release left (its content
    identities are the same; a red team had day 2 accept reports the first order refused)."""
    from araopt.attribution.measure import simulate_release
    from araopt.attribution.params import AttributionQuery
    from araopt.mechanism.keys import DECLARED

    hour, t0 = 3_600_000_000, 1_767_225_600_000_000
    queries = (AttributionQuery(COUNT, None), AttributionQuery("value", "value", max_value=255, clip=20.0))
    params = AttributionParams.from_paper(1.0, 2, {COUNT: 0.3, "value": 0.7}, queries, ("campaign",))
    domain = KeyDomain.from_slice_values(("campaign",), {"campaign": np.array([0])},
                                         params.query_names).with_origin(DECLARED)

    def row(imp, site, h, imp_site="pub.example", imp_hour=1):
        return {"browser_id": 0, "impression_id": imp, "campaign": 0, "value": 20.0, "impression_site": imp_site,
                "impression_time_us": t0 + imp_hour * hour, "conversion_site": site, "conversion_time_us": t0 + h * hour}

    early = [row(0, s, h) for s, h in (("a.example", 2), ("b.example", 3), ("b.example", 4), ("c.example", 5),
                                       ("c.example", 6), ("d.example", 7), ("d.example", 8))]
    tie = [row(0, "a.example", 9), row(0, "e.example", 9)]
    later = [row(1, "a.example", 30, imp_site="pub2.example", imp_hour=20)]
    outcomes = []
    for order in (tie, tie[::-1]):
        _, sim = simulate_release(params, pd.DataFrame(early + order + later), domain, simulation_seed=7)
        sites = sim.rows["conversion_site"].to_numpy()[sim.reports.row]
        hours = sim.rows["conversion_time_us"].to_numpy()[sim.reports.row]
        outcomes.append(sorted(zip(sites.tolist(), hours.tolist(), sim.reports.accepted.tolist(), strict=True)))
    assert outcomes[0] == outcomes[1]
    assert any(not accepted for _, _, accepted in outcomes[0])  # the quota did refuse something


@pytest.mark.parametrize("spelling", ["https://shop.example\n/c", "shop\n.example", "https://shop.example\n:8443/c",
                                      "shop.exa\tmple", "shop.example\r\n"])
def test_tab_and_newline_anywhere_are_removed_as_the_url_parser_does(spelling):
    """The URL parser removes ASCII tab and newline anywhere before parsing; a label check that let a trailing
    newline through made "example\\n" a second site (a red team's browser spent two per-site budgets)."""
    assert parse_site(spelling) == "shop.example"
