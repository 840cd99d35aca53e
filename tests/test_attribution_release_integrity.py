"""Release integrity of the W3C Attribution target (red-team findings, each failing before its fix).

* A privacy unit (browser x conversion site x epoch) over several releases: each release simulates
  fresh browsers (full budgets, a new epoch start), so two releases whose reports use the same
  impressions would each spend a whole per-site budget on the same epoch. The ledger refuses a release
  whose charged impressions lie within one epoch of an earlier attribution release's
  (``araopt.attribution.lifetime``), unless ``--allow-rerelease`` (recorded).
* One unit however it is spelt (browser ids in canonical form, sites as registrable domains), input
  files that agree on ``browser_id``, rows the browsers cannot take in the dead letter.
* A data-derived layout stays data-derived in araopt's own CSVs; a graph wired from ``transforms/``
  passes the release rules; parameters araopt cannot run are refused before any work; neighbouring
  inputs' release folders differ only in the noisy numbers.
"""
import json

import numpy as np
import pandas as pd
import pytest

from araopt.attribution.lifetime import ChargedWindow
from araopt.attribution.measure import measure
from araopt.attribution.params import COUNT, AttributionParams, AttributionQuery
from araopt.errors import InvalidInput
from araopt.mechanism.keys import DECLARED, KeyDomain
from araopt.version import ParameterVersion
from pipelines.cli import main
from w3c import log_parquet

HOUR_US = 3_600_000_000
DAY_US = 24 * HOUR_US
T0 = 1_767_225_600_000_000  # 2026-01-01
QUERIES = (AttributionQuery(COUNT, None), AttributionQuery("value", "value", max_value=255, clip=20.0))


def _params() -> AttributionParams:
    return AttributionParams.from_paper(1.0, 2, {COUNT: 0.3, "value": 0.7}, QUERIES, ("campaign",))


def _log(shown_us: int, first_conversion_us: int, browsers: int = 30, conversions: int = 24, seed: int = 0):
    """Each browser: one impression at ``shown_us`` (id ``1000 seed + browser``), then ``conversions``
    conversions an hour apart, each at a random second of the hour after (drawn by the conversion
    time: another day's conversions of the impression share a coarse identity only by chance)."""
    rng = np.random.default_rng(first_conversion_us)
    rows = [{"browser_id": b, "impression_id": 1000 * seed + b, "campaign": b % 2, "value": 20.0,
             "impression_time_us": shown_us,
             "conversion_time_us": first_conversion_us + h * HOUR_US + int(rng.integers(0, 3_000_000_000))}
            for b in range(browsers) for h in range(conversions)]
    return pd.DataFrame(rows)


def _domain(params: AttributionParams) -> KeyDomain:
    """The declared histogram layout: campaigns 0 and 1."""
    return KeyDomain.from_slice_values(("campaign",), {"campaign": np.array([0, 1])},
                                       params.query_names).with_origin(DECLARED)


def _version(tmp_path) -> str:
    params = _params()
    domain = _domain(params)
    path = tmp_path / "v.json"
    ParameterVersion.for_attribution(params, domain=domain).save(path)
    return str(path)


def _release(tmp_path, name, log, version, extra=()):
    return main(["measure", "--input", log_parquet(log, tmp_path / f"{name}.parquet"), "--params", version,
                 "--output", str(tmp_path / name), "--ledger", str(tmp_path / "ledger"), "--no-progress", *extra])


def _ledger(tmp_path) -> list[dict]:
    return json.load(open(tmp_path / "ledger" / "ledger" / "index.json"))["releases"]


def test_a_second_release_of_the_same_impressions_is_refused(tmp_path, capsys):
    """Day 1 and day 2 of the same impressions (new conversions: the row ledger sees nothing twice):
    released one after the other each spent a whole budget on the impression's epoch (the whole life
    simulated at once keeps half of what the two releases keep). The second is refused, nothing is
    released, and the ledger holds the first only."""
    version = _version(tmp_path)
    day1 = _log(T0 + 5 * HOUR_US, T0 + 6 * HOUR_US)
    day2 = _log(T0 + 5 * HOUR_US, T0 + 30 * HOUR_US)
    params = _params()
    domain = ParameterVersion.load(version).domain
    apart = sum(int(measure(params, d, domain).reports.accepted.sum()) for d in (day1, day2))
    together = int(measure(params, pd.concat([day1, day2], ignore_index=True), domain).reports.accepted.sum())
    assert apart == 2 * together  # what two budget-blind releases would keep
    assert _release(tmp_path, "day1", day1, version) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert _release(tmp_path, "day2", day2, version) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("araopt measure: error:") and "epoch" in err and "budget" in err
    assert not (tmp_path / "day2").exists() and len(_ledger(tmp_path)) == 1


def test_releases_an_epoch_apart_are_both_made(tmp_path, capsys):
    """Impressions more than an epoch (7 days) apart share no epoch under any epoch start: both made,
    each recording the impression times its accepted reports charged."""
    version = _version(tmp_path)
    assert _release(tmp_path, "first", _log(T0, T0 + HOUR_US, seed=1), version) == 0, capsys.readouterr().err
    later = T0 + 8 * DAY_US
    assert _release(tmp_path, "later", _log(later, later + HOUR_US, seed=2), version) == 0, capsys.readouterr().err
    first, second = _ledger(tmp_path)
    assert first["charged_impressions"]["first_us"] == T0  # (to the ms: the simulation's event times)
    assert second["charged_impressions"]["first_us"] == later and second["epochs_shared_with"] == []


def test_allow_rerelease_makes_it_and_records_the_shared_epochs(tmp_path, capsys):
    version = _version(tmp_path)
    assert _release(tmp_path, "day1", _log(T0, T0 + HOUR_US), version) == 0, capsys.readouterr().err
    day2 = _log(T0, T0 + DAY_US + HOUR_US)
    assert _release(tmp_path, "day2", day2, version, ("--allow-rerelease",)) == 0, capsys.readouterr().err
    first, second = _ledger(tmp_path)
    assert second["epochs_shared_with"] == [first["id"]]


# ---- the rule ------------------------------------------------------------------------------------
@pytest.mark.parametrize("gap_us, shares", [(7 * DAY_US, False), (7 * DAY_US - 1, True), (0, True),
                                            (-3 * DAY_US, True)])
def test_two_windows_share_an_epoch_iff_less_than_an_epoch_apart(gap_us, shares):
    """Two impression times less than an epoch apart lie in one epoch under some epoch start; an
    epoch or more apart, under none. Either order."""
    a = ChargedWindow(T0, T0 + DAY_US, 7 * DAY_US)
    b = ChargedWindow(T0 + DAY_US + gap_us, T0 + 2 * DAY_US + gap_us, 7 * DAY_US)
    assert a.shares_epochs_with(b) is shares and b.shares_epochs_with(a) is shares


def test_the_longer_epoch_decides():
    a = ChargedWindow(T0, T0, 7 * DAY_US)
    b = ChargedWindow(T0 + 10 * DAY_US, T0 + 10 * DAY_US, 14 * DAY_US)
    assert a.shares_epochs_with(b) and b.shares_epochs_with(a)


def test_a_window_is_checked():
    with pytest.raises(InvalidInput):
        ChargedWindow(T0 + 1, T0, 7 * DAY_US)
    with pytest.raises(InvalidInput):
        ChargedWindow(T0, T0, 0)
    assert ChargedWindow.from_json(ChargedWindow(T0, T0 + 5, DAY_US).to_json()) == ChargedWindow(T0, T0 + 5, DAY_US)


def test_an_entry_without_its_window_charged_what_its_conversions_could_use():
    """A ledger entry recorded before the windows were kept: every impression within its lookback
    (30 days) before its conversions; an ARA release charges no attribution budget."""
    from araopt.ledger.ledger import shares_epochs

    mechanism = ParameterVersion.for_attribution(_params()).to_json()
    old = {"id": "e1", "api": "attribution", "mechanism": mechanism, "first_time_us": T0, "last_time_us": T0 + DAY_US}
    week = 7 * DAY_US
    assert shares_epochs(old, ChargedWindow(T0 - 36 * DAY_US, T0 - 36 * DAY_US, week))  # 30 + 6 days before
    assert not shares_epochs(old, ChargedWindow(T0 - 37 * DAY_US, T0 - 37 * DAY_US, week))
    assert not shares_epochs({**old, "charged_impressions": None}, ChargedWindow(T0, T0, week))
    assert not shares_epochs({**old, "api": "ara"}, ChargedWindow(T0, T0, week))


def test_shards_charged_windows_merge_to_the_first_and_last():
    from araopt.attribution.measure import BrowserSums

    sums = {(COUNT, 0): np.zeros(2, dtype=np.int64)}
    parts = [BrowserSums(sums, charged_first_ms=5, charged_last_ms=9), BrowserSums(sums),
             BrowserSums(sums, charged_first_ms=2, charged_last_ms=7)]
    merged = BrowserSums.merge(parts)
    assert (merged.charged_first_ms, merged.charged_last_ms) == (2, 9)
    assert merged.charged_window(7) == ChargedWindow(2000, 9000, 7 * DAY_US)
    assert BrowserSums.merge([BrowserSums(sums)]).charged_window(7) is None


# ---- a data-derived layout stays data-derived in araopt's own CSV files --------------------------
def _nodomain_version(tmp_path) -> str:
    path = tmp_path / "nodomain.json"
    ParameterVersion.for_attribution(_params()).save(path)
    return str(path)


def test_a_simulations_data_derived_layout_csv_is_refused_as_a_release_domain(tmp_path, capsys):
    """A simulation without a declared layout derives it from the data and writes it twice, as
    SIMULATION-key_map.json (origin ``data``: refused as --domain) and as
    SIMULATION-histogram_layout.csv: the CSV must not turn it into a declared layout either."""
    log = _log(T0, T0 + HOUR_US)
    version = _nodomain_version(tmp_path)
    sim = tmp_path / "sim"
    assert main(["measure", "--input", log_parquet(log, tmp_path / "log.parquet"), "--params", version, "--output",
                 str(sim), "--simulation-seed", "3", "--no-progress"]) == 0, capsys.readouterr().err
    for name in ("SIMULATION-histogram_layout.csv", "SIMULATION-key_map.json"):
        capsys.readouterr()
        assert _release(tmp_path, "rel", log, version, ("--domain", str(sim / "simulation" / name))) == 2, name
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert "derived from the data" in err and not (tmp_path / "rel").exists(), name


def test_export_attributions_layout_of_a_log_is_refused_as_a_release_domain(tmp_path, capsys):
    """``export-attribution --conversions LOG`` without --domain lists the log's slices: as --domain of a
    release it is a data-derived layout (refused outside simulation), while the same export over a
    declared --domain stays declared."""
    log = _log(T0, T0 + HOUR_US)
    (tmp_path / "p.json").write_text(json.dumps(_params().to_json()))
    path = log_parquet(log, tmp_path / "log.parquet")
    assert main(["export-attribution", "--params", str(tmp_path / "p.json"), "--output", str(tmp_path / "exp"),
                 "--conversions", path, "--simulation-seed", "1"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    version = _nodomain_version(tmp_path)
    assert _release(tmp_path, "rel", log, version, ("--domain", str(tmp_path / "exp" / "histogram_layout.csv"))) == 2
    assert "derived from the data" in capsys.readouterr().err and not (tmp_path / "rel").exists()
    (tmp_path / "slices.csv").write_text("campaign\n0\n1\n")
    assert main(["export-attribution", "--params", str(tmp_path / "p.json"), "--output", str(tmp_path / "dec"),
                 "--domain", str(tmp_path / "slices.csv")]) == 0, capsys.readouterr().err
    assert _release(tmp_path, "rel", log, version, ("--domain", str(tmp_path / "dec" / "histogram_layout.csv"))) == 0, \
        capsys.readouterr().err


def test_export_attribution_refuses_a_data_derived_layout_as_domain_as_measure_does(tmp_path, capsys):
    """The layout ``export-attribution --conversions`` wrote (origin data) given back as its ``--domain``: the
    calls.json it would deploy puts a data-derived layout into the browsers' histograms, so it is refused in
    one line at export (``measure`` refuses it later), except in simulation; a declared layout passes."""
    log = _log(T0, T0 + HOUR_US)
    (tmp_path / "p.json").write_text(json.dumps(_params().to_json()))
    path = log_parquet(log, tmp_path / "log.parquet")
    export = ["export-attribution", "--params", str(tmp_path / "p.json")]
    assert main([*export, "--output", str(tmp_path / "exp"), "--conversions", path, "--simulation-seed", "1"]) == 0
    layout = str(tmp_path / "exp" / "histogram_layout.csv")
    capsys.readouterr()
    assert main([*export, "--output", str(tmp_path / "again"), "--domain", layout]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "derived from the data" in err and f"--domain {layout}" in err, err
    assert not (tmp_path / "again").exists()
    assert main([*export, "--output", str(tmp_path / "sim"), "--domain", layout, "--conversions", path,
                 "--simulation-seed", "1"]) == 0, capsys.readouterr().err  # a simulation may
    assert main([*export, "--output", str(tmp_path / "dec"), "--domain",
                 str(tmp_path / "sim" / "histogram_layout.csv")]) == 2  # (it stays data-derived)


def test_a_layout_lists_one_known_origin():
    from araopt.mechanism.keys import domain_from_rows

    rows = pd.DataFrame({"campaign": ["0", "1"], "origin": ["data", "declared"]})
    with pytest.raises(InvalidInput, match="origin"):
        domain_from_rows(rows, ("campaign",), (COUNT,), False, (), {"campaign": "integer"})
    with pytest.raises(InvalidInput, match="origin"):
        domain_from_rows(rows.assign(origin="made-up"), ("campaign",), (COUNT,), False, (), {"campaign": "integer"})
    assert domain_from_rows(rows.assign(origin="data"), ("campaign",), (COUNT,), False, (),
                            {"campaign": "integer"}).origin == "data"
    assert domain_from_rows(rows[["campaign"]], ("campaign",), (COUNT,), False, (),
                            {"campaign": "integer"}).origin == DECLARED
    # any spelling of the header is the origin column (red team, round fifteen: "Origin" and "origin " passed a
    # history layout for a declared one), and a row without one is an error in one line, not a crash
    for header in ("Origin", "origin ", " ORIGIN"):
        spelt = rows[["campaign"]].assign(**{header: "history"})
        assert domain_from_rows(spelt, ("campaign",), (COUNT,), False, (), {"campaign": "integer"}).origin == "history"
    with pytest.raises(InvalidInput, match="a row without one"):
        domain_from_rows(rows.assign(origin=["history", None]), ("campaign",), (COUNT,), False, (),
                         {"campaign": "integer"})
    with pytest.raises(InvalidInput, match="one is allowed"):
        domain_from_rows(rows.assign(origin="data", Origin="data"), ("campaign",), (COUNT,), False, (),
                         {"campaign": "integer"})


# ---- rows the browsers cannot take: dead letter, not a failed job or a merged browser -------------
def test_rows_without_a_browser_or_converting_before_their_impression_are_dead_lettered(tmp_path, capsys):
    """A null browser_id (the privacy unit unknown: before, the rows of every such browser were merged
    into one, or the job failed) and a conversion before its impression (before, the whole release
    failed late in the job) are rejected with their reason; the rest is released."""
    log = _log(T0, T0 + HOUR_US, browsers=10, conversions=3)
    log["browser_id"] = log["browser_id"].astype("Int64")
    log.loc[0, "browser_id"] = pd.NA
    log.loc[4, "impression_time_us"] = log.loc[4, "conversion_time_us"] + 1
    path = log_parquet(log, tmp_path / "log.parquet")
    out = tmp_path / "out"
    assert main(["measure", "--input", path, "--params", _version(tmp_path), "--output", str(out),
                 "--simulation-seed", "1", "--no-progress"]) == 0, capsys.readouterr().err
    summary = json.load(open(out / "private" / "run_summary.json"))
    assert summary["rows_rejected_by_reason"] == {"null_browser_id": 1, "conversion_before_impression": 1}
    assert summary["rows_read"] == len(log) and summary["conversions_kept"] == len(log) - 2
    dead = pd.read_parquet(out / "private" / "dead_letter" / "rejected.parquet")
    assert sorted(dead["reason"]) == ["conversion_before_impression", "null_browser_id"]


def test_an_ara_release_ignores_the_attribution_columns_rules(tmp_path, capsys):
    """ARA runs ignore browser_id and keep impression_time as they did (the contract's attribution
    columns' rules are the attribution target's)."""
    from araopt.mechanism.params import Params, QueryParams

    log = _log(T0, T0 + HOUR_US, browsers=10, conversions=3)
    log["browser_id"] = log["browser_id"].astype("Int64")
    log.loc[0, "browser_id"] = pd.NA
    log.loc[4, "impression_time_us"] = log.loc[4, "conversion_time_us"] + 1
    version = tmp_path / "ara.json"
    ParameterVersion(Params(count_limit=2, encoding="linf", epsilon=8.0, slice_columns=("campaign",),
                            queries=(QueryParams("value", 20.0, 1.0),))).save(version)
    out = tmp_path / "out"
    assert main(["measure", "--input", log_parquet(log, tmp_path / "log.parquet"), "--params", str(version),
                 "--output", str(out), "--simulation-seed", "1", "--no-progress"]) == 0, capsys.readouterr().err
    assert json.load(open(out / "private" / "run_summary.json"))["rows_rejected"] == 0


# ---- parameters araopt cannot run: refused in one line before any work ---------------------------
def test_an_epoch_beyond_the_browsers_range_is_refused_with_the_parameters():
    from araopt.errors import InvalidParameters

    for field in ("epoch_days", "lookback_days"):
        with pytest.raises(InvalidParameters, match=field):
            AttributionParams(1.0, QUERIES[:1], ("campaign",), **{field: 2**32})
    assert AttributionParams(1.0, QUERIES[:1], ("campaign",), epoch_days=2**32 - 1).epoch_days == 2**32 - 1


def test_a_query_whose_noise_araopt_cannot_sample_is_refused_before_the_job(tmp_path, capsys):
    """epsilon / (2 maxValue) below 2^-36 (here one microepsilon at maxValue 2^32 - 1): the exact
    sampler's floor. Before, the whole job ran and failed at the noise step with ARA's wording."""
    params = AttributionParams(1.0, (AttributionQuery(COUNT, None, 1e-6),
                                     AttributionQuery("value", "value", 1e-6, 2**32 - 1, 20.0)), ("campaign",))
    domain = _domain(params)
    version = tmp_path / "tiny.json"
    ParameterVersion.for_attribution(params, domain=domain).save(version)
    assert _release(tmp_path, "out", _log(T0, T0 + HOUR_US), str(version)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "queries['value']" in err[0] and "2^-36" in err[0] and "while running" not in err[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("epsilon", [5e-324, 1e-300, 1e-12, 2.0**-21])
def test_a_query_epsilon_below_aras_floor_is_refused_where_the_parameters_are_made(epsilon):
    """A query epsilon far below one microepsilon: at 5e-324 each report deducted 0 and the count limit
    divided by zero; at 1e-12 the run failed at the noise step in ARA's wording. Refused in one line, naming
    the field, when the parameters are made (a file loads through the same check); in memory, a noise rate
    outside the sampler's domain is refused in the Attribution wording."""
    from araopt.errors import InvalidParameters

    with pytest.raises(InvalidParameters, match=r"queries\['count'\]\.epsilon must lie in \[2\^-20"):
        AttributionQuery(COUNT, None, epsilon)
    assert AttributionQuery(COUNT, None, 2.0**-20).epsilon == 2.0**-20
    tiny = AttributionParams(1.0, (AttributionQuery("value", "value", 2.0**-20, 2**32 - 1, 20.0),), ("campaign",))
    with pytest.raises(InvalidParameters, match=r"queries\['value'\]: the noise rate"):
        measure(tiny, _log(T0, T0 + HOUR_US, browsers=2, conversions=1), _domain(tiny), simulation_seed=1)


# ---- one browser, one budget, whatever its id's spelling ------------------------------------------
def test_a_browser_whose_id_is_spelt_two_ways_has_one_budget():
    """The grouping step shards browsers by the canonical id hash ("007" is 7: ``araopt.io.ids``), but
    the simulation took "7" and "007" for two browsers, each with a whole per-site budget. One
    browser's rows under both spellings keep what they keep under one."""
    log = _log(T0, T0 + HOUR_US, browsers=20)
    log["browser_id"] = log["browser_id"].astype(str)
    padded = log.copy()
    padded.loc[padded.index % 2 == 1, "browser_id"] = padded["browser_id"].map(lambda b: b.zfill(4))
    params = _params()
    domain = _domain(params)
    one = measure(params, log, domain, simulation_seed=4)
    two = measure(params, padded, domain, simulation_seed=4)
    assert int(two.reports.accepted.sum()) == int(one.reports.accepted.sum())
    assert {k: v.tolist() for k, v in two.unnoised.items()} == {k: v.tolist() for k, v in one.unnoised.items()}


def test_input_files_whose_browser_ids_differ_in_type_are_refused_before_the_job(tmp_path, capsys):
    """int64 browser ids in one file and strings in another: one line before any work (before, the
    job failed late merging the shards' tables)."""
    log = _log(T0, T0 + HOUR_US, browsers=6)
    folder = tmp_path / "mixed"
    folder.mkdir()
    log_parquet(log.iloc[::2], folder / "a.parquet")
    log_parquet(log.iloc[1::2].assign(browser_id=log["browser_id"].iloc[1::2].astype(str)), folder / "b.parquet")
    assert main(["measure", "--input", str(folder), "--params", _version(tmp_path), "--output", str(tmp_path / "o"),
                 "--simulation-seed", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "browser_id" in err and "while running" not in err and not (tmp_path / "o").exists()


def test_input_files_of_which_only_some_name_the_browser_are_refused(tmp_path, capsys):
    """Files with ``browser_id`` and files without: the job used only the columns every file has, so
    each impression became its own browser (a budget each) also where the browser was known."""
    log = _log(T0, T0 + HOUR_US, browsers=6)
    folder = tmp_path / "some"
    folder.mkdir()
    log_parquet(log.iloc[::2], folder / "a.parquet")
    log_parquet(log.iloc[1::2].drop(columns=["browser_id"]), folder / "b.parquet")
    assert main(["measure", "--input", str(folder), "--params", _version(tmp_path), "--output", str(tmp_path / "o"),
                 "--simulation-seed", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "browser_id" in err and "every input file" in err and not (tmp_path / "o").exists()


def test_a_conversion_site_spelt_as_a_host_has_the_sites_budget():
    """The per-site budget is the registrable domain's (``araopt.attribution.sites``): "www.adv.example",
    "ADV.example" and "https://shop.adv.example/cart" all measure on the site "adv.example" in a browser,
    but the simulation gave each spelling a budget of its own."""
    log = _log(T0, T0 + HOUR_US, browsers=20).assign(conversion_site="adv.example", impression_site="pub.example")
    spelt = log.copy()
    spellings = np.array(["adv.example", "www.adv.example", "ADV.example", "https://shop.adv.example/cart"], dtype=object)
    spelt["conversion_site"] = spellings[np.arange(len(spelt)) % 4]
    spelt["impression_site"] = np.array(["pub.example", "news.PUB.example"], dtype=object)[np.arange(len(spelt)) % 2]
    params = _params()
    domain = _domain(params)
    one = measure(params, log, domain, simulation_seed=4)
    many = measure(params, spelt, domain, simulation_seed=4)
    assert int(many.reports.accepted.sum()) == int(one.reports.accepted.sum())


def test_a_conversion_site_that_is_no_site_is_refused_in_one_line():
    from araopt.attribution.simulate import site_codes

    with pytest.raises(InvalidInput, match="conversion_site.*10.0.0.1"):
        site_codes(np.array(["adv.example", "10.0.0.1"], dtype=object), "conversion_site")
    codes = site_codes(np.array(["adv.example", "www.ADV.example", "pub.example"], dtype=object), "conversion_site")
    assert codes.tolist() == [0, 0, 1]


# ---- the release folder of neighbouring inputs: only the noisy numbers differ -----------------------
def test_neighbouring_inputs_release_folders_differ_only_in_the_noisy_numbers(tmp_path, capsys):
    """Two inputs differing in one browser, simulated with one seed (the same noise): every release
    file but the estimates is byte-identical (key set, layout, release.json, file list), and the
    manifest holds no time (a commit time is a timing side channel on the input's size, and made the
    same release differ in its bytes from run to run)."""
    log = _log(T0, T0 + HOUR_US, browsers=12)
    version = _version(tmp_path)
    folders = []
    for name, frame in (("all", log), ("less", log[log["browser_id"] != 5])):
        out = tmp_path / name
        assert main(["measure", "--input", log_parquet(frame, tmp_path / f"{name}.parquet"), "--params", version,
                     "--output", str(out), "--simulation-seed", "2", "--no-progress"]) == 0, capsys.readouterr().err
        folders.append(out / "simulation")
    noisy = {"SIMULATION-estimates.csv", "SIMULATION-estimates.parquet"}
    names = sorted(p.name for p in folders[0].iterdir())
    assert names == sorted(p.name for p in folders[1].iterdir())
    for name in set(names) - noisy - {"SIMULATION-MANIFEST.json"}:
        assert (folders[0] / name).read_bytes() == (folders[1] / name).read_bytes(), name
    manifests = [json.load(open(f / "SIMULATION-MANIFEST.json")) for f in folders]
    for manifest in manifests:
        assert "written_at" not in manifest and all("time" not in key for key in manifest)
        manifest["files"] = [e for e in manifest["files"] if e["path"] not in noisy]
    assert manifests[0] == manifests[1]


# ---- a graph built from transforms/ passes the release rules too -------------------------------------
def _transform_release(log, domain, counts, seed=None):
    import apache_beam as beam
    import pyarrow as pa
    from apache_beam.testing.test_pipeline import TestPipeline

    from transforms.attribution import MeasureAttribution

    with TestPipeline() as p:
        counted = p | "Counts" >> beam.Create([counts])
        _ = (p | beam.Create([pa.Table.from_pandas(log, preserve_index=False)])
             | MeasureAttribution(_params(), counted, domain, seed, 2, "browser_id"))


def test_a_graph_built_from_transforms_refuses_a_data_derived_layout_outside_simulation():
    """``MeasureAttribution`` given a layout of origin ``data`` and no seed: refused at its noise step,
    as ARA's ``NoisyRelease`` refuses (before, it released over it); a declared layout is released."""
    from araopt.io.conversions import ValidationCounts

    log = _log(T0, T0 + HOUR_US, browsers=6)
    data = KeyDomain.from_slice_values(("campaign",), {"campaign": np.array([0, 1])}, _params().query_names)
    assert data.origin == "data"
    with pytest.raises(Exception, match="derived from the data"):
        _transform_release(log, data, ValidationCounts(len(log)))
    _transform_release(log, _domain(_params()), ValidationCounts(len(log)))


def test_a_graph_built_from_transforms_gates_the_rejected_share_and_the_accounting():
    """At most 10% of the rows read rejected, and rows read = rejected + simulated (the release rules
    of ``araopt.mechanism.release``), whatever path wired the graph: before, only measure's file
    writer checked the share, and nothing the accounting."""
    from araopt.io.conversions import ValidationCounts

    log = _log(T0, T0 + HOUR_US, browsers=6)
    n = len(log)
    rejected = n // 5  # 1/6 of the rows read
    with pytest.raises(Exception, match="failed validation"):
        _transform_release(log, _domain(_params()), ValidationCounts(n + rejected, rejected, {"null_value": rejected}))
    with pytest.raises(Exception, match="accounting"):
        _transform_release(log, _domain(_params()), ValidationCounts(n + 1))


def test_rows_with_a_null_site_are_dead_lettered(tmp_path, capsys):
    """A null conversion_site or impression_site (the unit's site unknown) is rejected with its reason,
    not taken for another site's budget."""
    log = _log(T0, T0 + HOUR_US, browsers=10, conversions=3).assign(conversion_site="adv.example",
                                                                     impression_site="pub.example")
    log.loc[0, "conversion_site"] = None
    log.loc[7, "impression_site"] = None
    out = tmp_path / "out"
    assert main(["measure", "--input", log_parquet(log, tmp_path / "log.parquet"), "--params", _version(tmp_path),
                 "--output", str(out), "--simulation-seed", "1", "--no-progress"]) == 0, capsys.readouterr().err
    summary = json.load(open(out / "private" / "run_summary.json"))
    assert summary["rows_rejected_by_reason"] == {"null_site": 2}


def test_a_release_whose_lookback_has_no_history_is_refused_a_simulation_takes_its_own_parameters():
    """A lookback row spent the per-site budget of the release that used it: one browser, one site, one
    epoch; the earlier release spent the whole budget (its count at epsilon 10 of 10), so a browser
    refuses today's conversion (epsilon 5). Without the history a release would simulate the lookback at
    today's epsilon and spend 15 of 10: refused outside simulation, whatever path calls ``measure``."""
    from araopt.attribution.draws import DrawKey
    from araopt.attribution.lifetime import AttributionHistory, EarlierRelease
    from araopt.errors import PrivacyRefusal
    from araopt.io.rowset import conversion_row_ids

    early = AttributionParams(10.0, (AttributionQuery(COUNT, None, epsilon=10.0),), ("campaign",))
    today = AttributionParams(10.0, (AttributionQuery(COUNT, None, epsilon=5.0),), ("campaign",))
    domain = KeyDomain.from_slice_values(("campaign",), {"campaign": np.array([0])},
                                         today.query_names).with_origin(DECLARED)
    row = {"browser_id": 0, "impression_id": 0, "campaign": 0, "impression_time_us": T0,
           "conversion_site": "shop.example"}
    rows = pd.DataFrame([{**row, "conversion_time_us": T0 + HOUR_US, "in_period": False},
                         {**row, "conversion_time_us": T0 + 2 * HOUR_US, "in_period": True}])
    ids = np.sort(conversion_row_ids(np.array([0]), np.array([T0 + HOUR_US])))
    history = AttributionHistory((EarlierRelease("earlier", early, domain, ids),), key=DrawKey.new())
    made = measure(today, rows, domain, history=history)
    assert made.reports_refused == 1 and int(made.reports.accepted.sum()) == 1  # the lookback's, at epsilon 10
    with pytest.raises(PrivacyRefusal, match="AttributionHistory"):
        measure(today, rows, domain)
    unused = measure(today, rows, domain, history=AttributionHistory())  # declared: no release used the lookback
    assert unused.reports_refused == 0 and int(unused.reports.accepted.sum()) == 1
    simulated = measure(today, rows, domain, simulation_seed=3)  # a simulation: the lookback at today's epsilon
    assert simulated.reports_refused == 0 and int(simulated.reports.accepted.sum()) == 2
    # the hand-wired way round it: browsers simulated with a seed (the lookback at today's epsilon), then noised
    # as a release; refused by the release step, as ARA's sums are (mechanism.release.SUMS_AND_NOISE_ONE_MODE)
    from araopt.attribution.measure import BrowserSums, simulate_browsers
    from araopt.attribution.release import release
    from araopt.io.conversions import ValidationCounts

    seeded, _ = simulate_browsers(today, rows, domain, simulation_seed=3)
    assert seeded.simulated
    with pytest.raises(PrivacyRefusal, match="one simulation or one release"):
        release([seeded], today, domain, ValidationCounts(seeded.rows), None)
    assert release([seeded], today, domain, ValidationCounts(seeded.rows), 3).simulation_seed == 3
    made, _ = simulate_browsers(today, rows, domain, history=history)
    with pytest.raises(PrivacyRefusal, match="one simulation or one release"):
        release([made], today, domain, ValidationCounts(made.rows), 3)
    with pytest.raises(PrivacyRefusal, match="a simulation with a release"):
        BrowserSums.merge([seeded, made])


def test_a_lookback_is_simulated_again_with_the_draws_of_the_releases_that_used_it():
    """An earlier release (the ledger's draw key K) rounded a value of 0.5 up to 1 and so spent the whole
    per-site budget; today's conversion of value 1 is then refused by the browser. Simulated again with
    fresh draws the lookback may round down, leave budget, and today's report spend it again (a red team's:
    20 of 10 spent on 9 of 20 runs). The ledger's history carries K and a release draws with it; a history
    without its key, or another key, is refused outside simulation."""
    from araopt.attribution.draws import DrawKey
    from araopt.attribution.lifetime import AttributionHistory, EarlierRelease
    from araopt.errors import PrivacyRefusal
    from araopt.io.rowset import conversion_row_ids

    p = AttributionParams(10.0, (AttributionQuery("value", "value", 10.0, 1, 1.0),), ("campaign",))
    domain = KeyDomain.from_slice_values(("campaign",), {"campaign": np.array([0])}, p.query_names
                                         ).with_origin(DECLARED)

    def row(hour: int, value: float, in_period: bool) -> dict:
        return {"browser_id": 0, "impression_id": 0, "campaign": 0, "impression_time_us": T0, "value": value,
                "conversion_site": "shop.example", "conversion_time_us": T0 + hour * HOUR_US, "in_period": in_period}

    early = pd.DataFrame([row(1, 0.5, True)]).drop(columns="in_period")
    keys = (DrawKey(f"{i:0>{len(DrawKey.new().secret)}}") for i in range(100))
    key = next(k for k in keys if int(measure(p, early, domain, key=k).unnoised[("value", 0)].sum()) == 1)
    ids = np.sort(conversion_row_ids(np.array([0]), np.array([T0 + HOUR_US])))
    earlier = (EarlierRelease("earlier", p, domain, ids),)
    rows = pd.DataFrame([row(1, 0.5, False), row(3, 1.0, True)])
    for given in (None, key):  # the history's key, whether or not the caller passes it too
        made = measure(p, rows, domain, history=AttributionHistory(earlier, key=key), key=given)
        assert int(made.unnoised[("value", 0)].sum()) == 0 and made.reports_refused == 1
    with pytest.raises(PrivacyRefusal, match="draw key those releases used"):
        measure(p, rows, domain, history=AttributionHistory(earlier))
    with pytest.raises(PrivacyRefusal, match="draw key those releases used"):
        measure(p, rows, domain, history=AttributionHistory(earlier, key=key), key=DrawKey.new())
    measure(p, rows, domain, history=AttributionHistory(earlier), simulation_seed=1)  # a simulation draws its own
