"""The retention calibration of an attribution parameter version (``attribution.calibrate``): stored,
checksummed and refused for other parameters; ``measure`` publishes estimates of the TRUE totals with
it (seeded end to end: coverage over many histogram indices) and says that the estimates are of the
accepted clipped values without it; ``nightly --api attribution``'s guardrails and run report."""
from __future__ import annotations

import dataclasses
import html
import json
import os
import shutil

import numpy as np
import pandas as pd
import pytest

from araopt.attribution.calibrate import Retention, params_checksum, published_frame, retention
from araopt.attribution.measure import measure
from araopt.attribution.params import COUNT, AttributionParams, AttributionQuery
from araopt.errors import InvalidInput, InvalidParameters
from araopt.evaluation.attribution import true_totals
from araopt.io import outputs
from araopt.io.stores import open_store
from araopt.mechanism.keys import DECLARED, KeyDomain
from araopt.nightly import Guardrails, new_series
from araopt.version import Api, ParameterVersion
from factories import error_line
from pipelines.cli import main
from w3c import log_parquet

DAY = 86_400_000_000
START = 1_767_225_600_000_000
CAMPAIGNS = 40
QUERIES = (AttributionQuery(COUNT, None), AttributionQuery("value", "value", max_value=255, clip=30.0))


def users_log(seed: int, browsers: int = 2500) -> pd.DataFrame:
    """Browsers with 1-2 impressions (40 campaigns) in 20 days, each with Geometric(0.3) conversions
    within 10 days (several per site-epoch: the budget refuses some), values LogNormal(2.5, 1) (some
    above the clip)."""
    rng = np.random.default_rng(seed)
    impressions = rng.integers(1, 3, browsers)
    browser = np.repeat(np.arange(browsers), impressions)
    n = len(browser)
    shown = START + rng.integers(0, 20 * 86_400, n) * 1_000_000
    campaign = rng.integers(0, CAMPAIGNS, n)
    conversions = rng.geometric(0.3, n)
    imp = np.repeat(np.arange(n), conversions)
    m = len(imp)
    return pd.DataFrame({"browser_id": browser[imp], "impression_id": imp, "campaign": campaign[imp],
                         "impression_time_us": shown[imp],
                         "conversion_time_us": shown[imp] + rng.integers(60, 10 * 86_400, m) * 1_000_000,
                         "value": np.round(rng.lognormal(2.5, 1.0, m), 2)})


def params(epsilon_share: float = 0.3, clip: float = 30.0) -> AttributionParams:
    queries = (QUERIES[0], dataclasses.replace(QUERIES[1], clip=clip))
    return AttributionParams.from_paper(4.0, 3, {COUNT: epsilon_share, "value": 1 - epsilon_share}, queries,
                                        ("campaign",))


def layout(p: AttributionParams) -> KeyDomain:
    return KeyDomain.from_slice_values(p.slice_columns, {"campaign": np.arange(CAMPAIGNS)},
                                       p.query_names).with_origin(DECLARED)


@pytest.fixture(scope="module")
def train() -> pd.DataFrame:
    return users_log(1)


@pytest.fixture(scope="module")
def fitted(train) -> Retention:
    return retention(params(), train, layout(params()), 0)


# ---- the version ---------------------------------------------------------------------------------
def test_a_version_carries_its_retention_through_a_round_trip(fitted) -> None:
    p = params()
    assert fitted.params_checksum == params_checksum(p) and fitted.query_names == p.query_names
    assert all(0 < r < 1 for r in fitted.ratios)  # the budget refuses reports, the clip cuts values
    version = ParameterVersion.for_attribution(p, domain=layout(p), retention=fitted)
    again = ParameterVersion.from_bytes(version.to_bytes())
    assert again == version and again.retention == fitted and again.checksum() == version.checksum()
    plain = ParameterVersion.for_attribution(p, domain=layout(p))
    assert "retention" not in plain.to_json() and plain.checksum() != version.checksum()
    doc = version.to_json()
    doc["retention"]["ratios"][1] = fitted.ratios[1] / 2
    assert ParameterVersion.from_json(doc).checksum() != version.checksum()  # the checksum covers it


def test_a_retention_is_operator_private_whatever_the_provenance_says(fitted) -> None:
    """Attribution's retention is only ever fitted on a joined history (no privacy-safe tuner fits one): a
    version whose provenance claims privacy-safe tuning is still held to the joined history's rule."""
    from araopt.publication import joined_calibration_reason
    from araopt.version import PRIVACY_SAFE, Provenance

    p = params()
    version = ParameterVersion.for_attribution(p, domain=layout(p), retention=fitted)
    claimed = dataclasses.replace(version, provenance=Provenance(extra={"tuning": f"{PRIVACY_SAFE}: claimed"}))
    assert claimed.provenance.privacy_safe
    assert joined_calibration_reason(version) is not None
    assert joined_calibration_reason(claimed) is not None
    assert joined_calibration_reason(ParameterVersion.for_attribution(p, domain=layout(p))) is None


def test_a_retention_fitted_for_other_parameters_is_refused(fitted) -> None:
    # another epsilon split keeps the paper view (C, C_l) but changes what the budget refuses
    other = params(epsilon_share=0.25)
    assert other.paper_params() == params().paper_params()
    with pytest.raises(InvalidInput, match="fitted for other attribution parameters"):
        ParameterVersion.for_attribution(other, retention=fitted)
    with pytest.raises(InvalidInput, match="fitted for other attribution parameters"):
        ParameterVersion.for_attribution(params(clip=31.0), retention=fitted)
    doc = ParameterVersion.for_attribution(params(), retention=fitted).to_json()
    doc["attribution"] = ParameterVersion.for_attribution(other).to_json()["attribution"]
    with pytest.raises(InvalidParameters, match="fitted for other attribution parameters"):
        ParameterVersion.from_json(doc)  # an edited file: one line, with the file's name
    with pytest.raises(InvalidParameters, match="need api 'attribution'"):
        ParameterVersion(params().paper_params(), retention=fitted)
    with pytest.raises(InvalidParameters, match="corrects by 'ratio'"):
        ParameterVersion.for_attribution(params(), retention=fitted, correction="none")
    bad = fitted.to_json()
    bad["ratios"] = [0.0, 0.5]
    with pytest.raises(InvalidParameters, match="ratios must lie in"):
        Retention.from_json(bad)
    with pytest.raises(InvalidParameters, match="'extra' is unknown"):
        Retention.from_json({**fitted.to_json(), "extra": 1})


def test_the_published_table_divides_by_the_ratio_and_widens_by_the_spread(fitted, train) -> None:
    p = params()
    result = measure(p, train, layout(p), simulation_seed=3)
    plain = published_frame(result.estimates, layout(p), p, None)
    assert not plain["bias_corrected"].any()
    assert (plain["estimate"] == plain["capped_estimate"]).all()
    frame = published_frame(result.estimates, layout(p), p, fitted)
    assert frame["bias_corrected"].all() and (frame["capped_estimate"] == plain["estimate"]).all()
    for q, (ratio, spread) in enumerate(zip(fitted.ratios, fitted.spreads, strict=True)):
        mine, alg4 = frame[frame["query"] == p.query_names[q]], result.estimates[(p.query_names[q], 0)]
        assert np.allclose(mine["estimate"], alg4.values / ratio)
        half = alg4.half_width / ratio + spread * np.abs(alg4.values / ratio)
        assert np.allclose(mine["ci_high"] - mine["estimate"], half)
        assert np.allclose(mine["estimate"] - mine["ci_low"], half)
        assert (mine["std_error"] >= alg4.noise_sd / ratio).all()
    with pytest.raises(InvalidInput, match="fitted for other"):
        published_frame(result.estimates, layout(p), params(clip=31.0), fitted)


# ---- measure, end to end (simulation mode: every draw seeded) --------------------------------------
def _run(tmp_path, version: ParameterVersion, log: pd.DataFrame, name: str, seed: int):
    """measure in simulation: (its output folder, the released estimates, release.json)."""
    path = tmp_path / f"{name}.json"
    version.save(path)
    out = tmp_path / name
    code = main(["measure", "--input", log_parquet(log, tmp_path / f"{name}.parquet"), "--params", str(path),
                 "--output", str(out), "--simulation-seed", str(seed), "--no-progress"])
    assert code == 0
    folder = os.path.join(out, "simulation")
    return (out, pd.read_csv(os.path.join(folder, "SIMULATION-estimates.csv")),
            json.load(open(os.path.join(folder, "SIMULATION-release.json"))))


def _measure(tmp_path, version: ParameterVersion, log: pd.DataFrame, name: str, seed: int):
    out, released, release = _run(tmp_path, version, log, name, seed)
    assert not os.path.exists(os.path.join(out, outputs.private_file(outputs.TRUE_TOTALS_CSV)))
    return released, release


def _measure_true_totals(tmp_path, version: ParameterVersion, log: pd.DataFrame, name: str, seed: int):
    """A release with a retention fitted on the joined history: its true totals (operator-private, under
    private/) and release.json; the release folder holds the accepted clipped values (Alg. 4's)."""
    out, released, release = _run(tmp_path, version, log, name, seed)
    assert not released["bias_corrected"].any() and release["bias_corrected"] is False and release["retention"] is None
    assert "operator-private" in release["true_totals"]
    assert "calibrated on the joined history" in release["estimates"]  # not "carry no retention calibration"
    assert "carry no retention calibration" not in release["estimates"]
    totals = pd.read_csv(os.path.join(out, outputs.private_file(outputs.TRUE_TOTALS_CSV)))
    np.testing.assert_array_equal(totals["capped_estimate"], released["estimate"])
    return totals, release


def _coverage(frame: pd.DataFrame, truth: np.ndarray, p: AttributionParams) -> float:
    hits = []
    for q, name in enumerate(p.query_names):
        mine = frame[frame["query"] == name].sort_values("histogram_index")
        hits.append((mine["ci_low"].to_numpy() <= truth[:, q]) & (truth[:, q] <= mine["ci_high"].to_numpy()))
    return float(np.mean(hits))


def test_measure_publishes_intervals_that_cover_the_true_totals(tmp_path, capsys, fitted) -> None:
    """Train and test logs from the same distribution; the version calibrated on train; measure on test
    (seeded: deterministic). Over the 80 (query, index) cells the intervals of the true totals cover
    at least 90%; the same release without the calibration (Alg. 4's intervals of the accepted clipped
    values) covers far fewer true totals."""
    p = params()
    test = users_log(2)
    truth = true_totals(p, test, layout(p))
    frame, release = _measure_true_totals(tmp_path, ParameterVersion.for_attribution(
        p, domain=layout(p), retention=fitted), test, "calibrated", 11)
    assert frame["bias_corrected"].all()
    assert "estimates are of the TRUE totals" in capsys.readouterr().out
    calibrated = _coverage(frame, truth, p)
    plain, release = _measure(tmp_path, ParameterVersion.for_attribution(p, domain=layout(p)), test, "plain", 11)
    assert np.allclose(frame["capped_estimate"], plain["estimate"])  # the same noise: only the estimand differs
    uncalibrated = _coverage(plain, truth, p)
    assert calibrated >= 0.9 and uncalibrated < 0.5, (calibrated, uncalibrated)


def test_a_version_without_calibration_says_its_estimates_are_of_the_accepted_clipped_values(tmp_path, capsys) -> None:
    p = params()
    frame, release = _measure(tmp_path, ParameterVersion.for_attribution(p, domain=layout(p)), users_log(3, 200),
                              "plain", 1)
    assert not frame["bias_corrected"].any() and release["bias_corrected"] is False and release["retention"] is None
    assert (frame["estimate"] == frame["capped_estimate"]).all()
    assert release["estimates"].startswith("the clipped values the browsers accepted")
    assert "carry no retention calibration" in release["estimates"]
    assert "estimates are of the clipped values the browsers accepted" in capsys.readouterr().out


def test_reconstruct_on_a_calibrated_version_gives_the_same_table(tmp_path, capsys, fitted, train) -> None:
    p = params()
    version = ParameterVersion.for_attribution(p, domain=layout(p), retention=fitted)
    version.save(tmp_path / "v.json")
    result = measure(p, train, layout(p), simulation_seed=5)
    pd.DataFrame([{"query": q, "histogram_index": i, "noisy_sum": int(v)} for (q, _), noisy in result.noisy.items()
                  for i, v in enumerate(noisy)]).to_csv(tmp_path / "h.csv", index=False)
    assert main(["reconstruct", "--summary-report", str(tmp_path / "h.csv"), "--params", str(tmp_path / "v.json"),
                 "--output", str(tmp_path / "est.csv")]) == 0
    assert "estimates are of the TRUE totals" in capsys.readouterr().out
    got = pd.read_csv(tmp_path / "est.csv")
    want = published_frame(result.estimates, layout(p), p, fitted)
    assert got["bias_corrected"].all() and np.allclose(got["estimate"], want["estimate"])
    assert np.allclose(got["ci_low"], want["ci_low"]) and np.allclose(got["ci_high"], want["ci_high"])


def test_an_attribution_release_over_the_layout_of_its_own_rows_is_refused(train) -> None:
    """The tuner's layout (origin history) lists the training rows' slices up to the end of their last
    day; a release of those rows over it would list the keys of the data it releases (the encode step's
    rule, ``mechanism.release.check_learnt_window``, as ARA's)."""
    from araopt.errors import PrivacyRefusal
    from araopt.optimize.attribution import history_domain

    p = params()
    learnt = history_domain(train, p.slice_columns, ("value",))
    assert learnt.learnt_before_us == int(train["conversion_time_us"].max()) + 1  # after its last conversion
    with pytest.raises(PrivacyRefusal, match="training history whose last conversion"):
        measure(p, train, learnt)
    assert measure(p, train, learnt, simulation_seed=2).rows == len(train)  # a simulation may
    later = dataclasses.replace(learnt, learnt_before_us=int(train["conversion_time_us"].min()))
    assert measure(p, train, later).rows == len(train)  # every row from the history's end on


# ---- optimize / nightly --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def history(tmp_path_factory) -> str:
    """Two days of a users log as date partitions (the contract's Parquet)."""
    root = tmp_path_factory.mktemp("history")
    log = users_log(4, 600)
    day = pd.to_datetime(log["conversion_time_us"], unit="us", utc=True).dt.date
    for i, d in enumerate(sorted(day.unique())[:2]):
        os.makedirs(root / f"date={d}")
        log_parquet(log[day == d], root / f"date={d}" / f"part-{i}.parquet")
    return str(root)


def test_optimize_stores_the_retention_fitted_for_the_chosen_parameters(history, tmp_path, capsys) -> None:
    out = tmp_path / "v.json"
    assert main(["optimize", "--api", "attribution", "--history", history, "--slices", "campaign", "--values",
                 "value", "--epsilon", "4", "--max-count-limit", "3", "--output", str(out)]) == 0
    version = ParameterVersion.load(out)
    assert version.api == Api.ATTRIBUTION and version.retention is not None and version.attribution is not None
    version.retention.check_params(version.attribution)
    assert version.retention.rows > 0 and version.retention.indices == version.domain.num_slices
    assert "retention" in capsys.readouterr().out
    # the history's layout is the version's domain (origin history, as ARA's): a release of later days
    # needs no --domain; a release of the history's own days would list the keys of the data it releases
    # (red team, round thirteen: one row decided a published key), so it is refused in one line
    from araopt.mechanism.keys import HISTORY
    assert version.domain.origin == HISTORY
    first, last = sorted(os.listdir(history))
    assert main(["measure", "--api", "attribution", "--input", os.path.join(history, last), "--params", str(out),
                 "--output", str(tmp_path / "refused"), "--no-progress"]) == 2
    assert "training history whose last conversion" in error_line(capsys.readouterr().err)
    assert not os.path.exists(tmp_path / "refused")
    earlier = tmp_path / "earlier"
    shutil.copytree(os.path.join(history, first), earlier / first)
    assert main(["optimize", "--api", "attribution", "--history", str(earlier), "--slices", "campaign", "--values",
                 "value", "--epsilon", "4", "--max-count-limit", "3", "--output", str(tmp_path / "w.json")]) == 0
    assert main(["measure", "--api", "attribution", "--input", os.path.join(history, last), "--params",
                 str(tmp_path / "w.json"), "--output", str(tmp_path / "release"), "--no-progress"]) == 0, \
        capsys.readouterr().err
    assert "the keys are the parameter version's training slices" in capsys.readouterr().out  # what it discloses
    # the published layout says it is the history's (red team, round fourteen: without an origin column it read
    # back as a declared list and released the training day over it), and keeps no time from the data
    layout_csv = tmp_path / "release" / "release" / "histogram_layout.csv"
    published = pd.read_csv(layout_csv)
    assert set(published["origin"]) == {"history"} and "learnt_before_us" not in published
    assert main(["measure", "--api", "attribution", "--input", os.path.join(history, first), "--params",
                 str(tmp_path / "w.json"), "--domain", str(layout_csv), "--output", str(tmp_path / "laundered"),
                 "--ledger", str(tmp_path / "fresh-ledger"), "--no-progress"]) == 2
    assert "training history whose last conversion" in error_line(capsys.readouterr().err)
    # a declared list of the same campaigns: the version's count limit and clips were still read from that day
    # (red team, round sixteen), so the version's end applies to any domain
    declared = tmp_path / "declared.csv"
    published[["campaign"]].to_csv(declared, index=False)
    assert main(["measure", "--api", "attribution", "--input", os.path.join(history, first), "--params",
                 str(tmp_path / "w.json"), "--domain", str(declared), "--output", str(tmp_path / "declared-out"),
                 "--ledger", str(tmp_path / "ledger-3"), "--no-progress"]) == 2
    assert "was learnt on a training history whose last conversion" in error_line(capsys.readouterr().err)
    assert not os.path.exists(tmp_path / "declared-out")


def test_nightly_guards_reports_and_recognises_a_rerun(history, tmp_path, capsys) -> None:
    store = str(tmp_path / "store")
    dates = sorted(d.split("=")[1] for d in os.listdir(history))
    argv = ["nightly", "--api", "attribution", "--history", history, "--as-of", dates[-1], "--window-days", "2",
            "--store", store, "--slices", "campaign", "--values", "value", "--epsilon", "4",
            "--max-count-limit", "3"]
    assert main([*argv, "--run-id", "r1"]) == 0
    assert "published" in capsys.readouterr().out
    latest = ParameterVersion.from_bytes(open_store(store).resolve("latest").payload)
    assert latest.retention is not None and latest.provenance is not None
    report = json.load(open(os.path.join(store, "reports", f"{dates[-1]}-r1", "report.json")))
    assert report["published"] and report["api"] == "attribution" and report["problems"] == []
    assert report["predicted_rmsre_tau"] < min(report["baselines"].values())
    assert report["retention"]["ratios"] == list(latest.retention.ratios)
    assert os.path.exists(os.path.join(store, "reports", f"{dates[-1]}-r1", "report.html"))
    assert main([*argv, "--run-id", "r2"]) == 0
    assert "idempotent re-run" in capsys.readouterr().out
    assert ParameterVersion.from_bytes(open_store(store).resolve("latest").payload) == latest


def test_the_guardrails_judge_attribution_versions_by_their_paper_view(fitted) -> None:
    small = ParameterVersion.for_attribution(params())
    large = ParameterVersion.for_attribution(AttributionParams.from_paper(4.0, 12, {COUNT: 0.3, "value": 0.7},
                                                                          QUERIES, ("campaign",)))
    guard = Guardrails(max_count_limit_change=2)
    assert guard.check(large, 1.0, {"spec_defaults": 2.0}, small)[0].startswith("count limit moves 3 -> 12")
    assert guard.check(large, 2.0, {"spec_defaults": 2.0}, None)[0].startswith("the error model's RMSRE_tau 2")
    assert guard.check(large, 1.0, {"spec_defaults": 2.0}, None) == []
    assert guard.check(large, 1.0, {}, None) == []  # no baseline releasable at the budget: nothing to beat
    shorter = ParameterVersion.for_attribution(dataclasses.replace(params(), lookback_days=7))
    assert new_series(small, shorter) == "epoch / lookback changed 7 / 30 -> 7 / 7 days"
    ara = ParameterVersion(params().paper_params())
    assert new_series(ara, small) == "api changed ara -> attribution"
    assert guard.check(large, 1.0, {"spec_defaults": 2.0}, ara) == []  # a new series: no move guards


def test_a_release_says_which_queries_it_holds_no_signal_for(tmp_path, capsys) -> None:
    """As the ARA target's: a query left almost no epsilon is noise over the whole histogram (its estimates
    summed over the indices within two noise sds of 0), and release.json lists it; with its share of
    the budget it is measured."""
    p = params()
    _, release = _measure(tmp_path, ParameterVersion.for_attribution(p, domain=layout(p)), users_log(3, 200),
                          "funded", 1)
    assert release["queries_without_signal"] == []
    starved = params(epsilon_share=0.9999)
    _, release = _measure(tmp_path, ParameterVersion.for_attribution(starved, domain=layout(starved)),
                          users_log(3, 200), "starved", 1)
    assert release["queries_without_signal"] == ["value"]


def test_nightly_at_a_budget_no_baseline_fits_still_decides_and_guards_the_moves(history, tmp_path, capsys) -> None:
    """At a per-site budget of 3e-6 neither baseline is releasable (spec defaults deduct more than the budget,
    q95's shares are below one microepsilon): nightly crashed on an empty minimum. Now its report lists them as
    not releasable, the version has nothing to beat, and a move is still guarded."""
    from araopt.nightly import private_problems

    store = str(tmp_path / "store")
    dates = sorted(d.split("=")[1] for d in os.listdir(history))
    argv = ["nightly", "--api", "attribution", "--history", history, "--as-of", dates[-1], "--window-days", "2",
            "--store", store, "--slices", "campaign", "--values", "value", "--epsilon", "0.000003",
            "--max-count-limit", "3", "--run-id", "tiny"]
    assert main(argv) == 0, capsys.readouterr().err
    report = json.load(open(os.path.join(store, "reports", f"{dates[-1]}-tiny", "report.json")))
    assert report["baselines"] == {} and report["published"]
    assert set(report["baselines_not_releasable"]) == {"spec_defaults", "baseline_q95"}
    page = open(os.path.join(store, "reports", f"{dates[-1]}-tiny", "report.html")).read()
    for name, why in report["baselines_not_releasable"].items():  # the page says so too, with why
        assert f'data-v="{name}">{name}</td>' in page and html.escape(why) in page
    counts = [row["C"] for row in report["per_count_limit"]]  # one row per count limit (its best point)
    assert counts == sorted(set(counts))
    latest = ParameterVersion.from_bytes(open_store(store).resolve("latest").payload)
    assert latest.provenance.baseline_rmsre_tau is None
    assert latest.attribution is not None
    moved = ParameterVersion.for_attribution(dataclasses.replace(latest.attribution, queries=tuple(
        dataclasses.replace(q, clip=q.clip * 100) if q.column else q for q in latest.attribution.queries)),
        domain=latest.domain, provenance=latest.provenance)
    assert any("clip threshold" in p for p in private_problems(moved, latest, Guardrails()))
