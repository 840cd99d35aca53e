"""The pieces both targets' ``measure`` (and every night) now share, written once in the core: the
commit's ledger step (``araopt.ledger.commit``), what each target records of a release
(``araopt.targets``), the W3C Attribution release's files and their rules (``publication``), nightly's
window (``io.partitions``) and the end of a night (``nightly.conclude_night``)."""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os

import numpy as np
import pytest

from araopt.attribution.measure import BrowserSums
from araopt.attribution.params import COUNT, AttributionParams, AttributionQuery
from araopt.attribution.release import release
from araopt.errors import InvalidInput, InvalidParameters, PrivacyRefusal
from araopt.io import jsonio, outputs
from araopt.io.conversions import BROWSER_ID, IMPRESSION_ID, ValidationCounts
from araopt.io.partitions import window, window_partitions
from araopt.io.rowset import RowSet, sorted_unique
from araopt.io.run_folder import RunFolder
from araopt.io.stores import open_store
from araopt.ledger.commit import ACCOUNTING_FILE, LedgerStep, commit_release, take_accounting
from araopt.ledger.ledger import RELEASE_FILES, Ledger, LedgerRefusal
from araopt.mechanism.keys import DECLARED, KeyDomain
from araopt.nightly import conclude_night
from araopt.publication import attribution_release_files
from araopt.targets import ARA, ATTRIBUTION, ledger_entry, private_facts, public_facts, target_of
from araopt.version import Api, ParameterVersion
from factories import params as ara_params


def _rows(ids, first=0, last=100) -> RowSet:
    return RowSet(sorted_unique(np.asarray(list(ids), dtype=np.uint64)), first, last)


def _staged(tmp_path, name: str) -> RunFolder:
    folder = RunFolder.prepare(str(tmp_path / name), overwrite=False)
    folder.write(outputs.release_file(outputs.ESTIMATES_CSV, False), b"query,estimate\ncount,1\n")
    return folder


def _attribution_version() -> ParameterVersion:
    queries = (AttributionQuery(COUNT, None), AttributionQuery("value", "value", max_value=255, clip=20.0))
    params = AttributionParams.from_paper(4.0, 2, {COUNT: 0.3, "value": 0.7}, queries, ("campaign",))
    return ParameterVersion.for_attribution(params)


# ---- the commit's ledger step, once for both targets ---------------------------------------------
@pytest.mark.parametrize("version", [ParameterVersion(ara_params()), _attribution_version()],
                         ids=["ara", "attribution"])
def test_a_commit_records_the_targets_entry_with_the_release_files_and_says_so_in_the_run_summary(tmp_path, version):
    ledger = Ledger.open(str(tmp_path / "ledger"), allow_rerelease=False)
    folder = _staged(tmp_path, "out")
    summary: dict = {"rows_read": 3}
    private: dict = {}
    commit_release(folder, False, public_facts(version), private, summary,
                   LedgerStep(ledger, _rows(range(3)), None, ledger_entry(version)))
    (entry,), _ = ledger.store.read_ledger()
    assert entry["params_sha256"] == version.checksum() and entry["rows"] == 3
    assert entry[RELEASE_FILES] == {outputs.ESTIMATES_CSV: outputs.sha256_hex(b"query,estimate\ncount,1\n")}
    assert entry["output"] == folder.target
    assert (entry.get("api") == "attribution") == (version.api == Api.ATTRIBUTION)
    written = json.loads((tmp_path / "out" / outputs.private_file(outputs.RUN_SUMMARY)).read_text())
    assert written == summary and summary["ledger_entry"] == entry["id"]
    assert summary["release_number_of_this_input"] == 1 and summary["conversions_released_before"] == 0
    assert private["ledger"]["entry"]["id"] == entry["id"]
    manifest = json.loads((tmp_path / "out" / outputs.manifest_file(False)).read_text())
    assert manifest["params_sha256"] == version.checksum()


def test_conversions_released_before_refuse_the_commit_and_leave_nothing_recorded_or_pending(tmp_path):
    version = ParameterVersion(ara_params())
    ledger = Ledger.open(str(tmp_path / "ledger"), allow_rerelease=False)
    commit_release(_staged(tmp_path, "a"), False, public_facts(version), {}, {},
                   LedgerStep(ledger, _rows(range(10)), None, ledger_entry(version)))
    folder = _staged(tmp_path, "b")
    with pytest.raises(LedgerRefusal, match="1 of the 1 conversions of this input were already released"):
        commit_release(folder, False, public_facts(version), {}, {},
                       LedgerStep(ledger, _rows([9]), None, ledger_entry(version)))
    folder.abandon()
    releases, _ = ledger.store.read_ledger()
    assert len(releases) == 1 and not (tmp_path / "b").exists()
    assert not [n for n in os.listdir(tmp_path) if ".araopt-pending-" in n]


def test_a_commit_failing_after_the_ledger_recorded_it_takes_the_entry_out_again(tmp_path, monkeypatch):
    version = ParameterVersion(ara_params())
    ledger = Ledger.open(str(tmp_path / "ledger"), allow_rerelease=False)
    folder = _staged(tmp_path, "out")

    def broken_seal(*args, **kwargs):
        raise OSError("disk full while sealing")

    monkeypatch.setattr(RunFolder, "_seal", broken_seal)
    with pytest.raises(OSError, match="disk full"):
        commit_release(folder, False, public_facts(version), {}, {},
                       LedgerStep(ledger, _rows(range(5)), None, ledger_entry(version)))
    folder.abandon()
    assert ledger.store.read_ledger()[0] == []  # taken out: the input can be released again
    assert not [n for n in os.listdir(tmp_path) if ".araopt-pending-" in n]


def test_a_simulation_records_nothing_and_still_writes_its_run_summary(tmp_path):
    folder = RunFolder.prepare(str(tmp_path / "sim"), overwrite=False)
    folder.write(outputs.release_file(outputs.ESTIMATES_CSV, True), b"x\n1\n")
    commit_release(folder, True, {"params_sha256": "abc"}, {}, {"simulation": True})
    assert json.loads((tmp_path / "sim" / outputs.private_file(outputs.RUN_SUMMARY)).read_text()) == {
        "simulation": True}


def test_the_accounting_is_read_back_once_and_must_close(tmp_path):
    folder = RunFolder.prepare(str(tmp_path / "out"), overwrite=False)
    folder.write(ACCOUNTING_FILE, jsonio.dumps({"rows_read": 2, "accounting_closes": True}).encode())
    assert take_accounting(folder) == {"rows_read": 2, "accounting_closes": True}
    assert not os.path.exists(folder.path(ACCOUNTING_FILE))  # the run summary carries it
    folder.write(ACCOUNTING_FILE, jsonio.dumps({"rows_read": 2, "accounting_closes": False}).encode())
    with pytest.raises(RuntimeError, match="row accounting does not close"):
        take_accounting(folder)
    folder.abandon()


# ---- what each target records of a release ------------------------------------------------------
def test_each_target_records_its_own_facts():
    ara = ParameterVersion(ara_params())
    note = {"epsilon_overridden": {"from": 4.0, "to": 8.0}}
    entry = ledger_entry(ara, note)
    assert entry["mechanism"] == ParameterVersion(ara.params).to_json()  # what a later lookback is costed with
    assert entry["epsilon_overridden"] == note["epsilon_overridden"] and "api" not in entry
    assert public_facts(ara) == {"params_sha256": ara.checksum(), "epsilon": ara.params.epsilon}
    assert private_facts(ara, "--domain d.csv")["domain"] == "--domain d.csv"
    w3c = _attribution_version()
    assert ledger_entry(w3c)["api"] == "attribution" and ledger_entry(w3c)["mechanism"] == w3c.to_json()
    assert public_facts(w3c) == {"params_sha256": w3c.checksum(), "api": "attribution"}
    assert target_of(ara) is ARA and target_of(w3c) is ATTRIBUTION


def test_alg1_groups_ara_by_impression_and_attribution_by_browser_or_else_impression():
    assert ARA.group_column([IMPRESSION_ID, BROWSER_ID]) == IMPRESSION_ID
    assert ATTRIBUTION.group_column([IMPRESSION_ID, BROWSER_ID]) == BROWSER_ID
    assert ATTRIBUTION.group_column([IMPRESSION_ID]) == IMPRESSION_ID
    assert ARA.noise.constant == 2.0 and ATTRIBUTION.noise.constant == 8.0 and ATTRIBUTION.noise.separate_count


# ---- the W3C Attribution release's files and their rules ------------------------------------------
def _attribution_release(rows_read: int, rejected: int, seed: int | None):
    params = _attribution_version().attribution
    assert params is not None
    domain = KeyDomain.from_slice_values(("campaign",), {"campaign": np.array([0, 1])}, params.query_names
                                         ).with_origin(DECLARED)
    kept = rows_read - rejected
    sums = BrowserSums({(q.name, 0): np.array([kept, 0]) for q in params.queries}, rows=kept, browsers=1,
                       simulated=seed is not None)  # sums made in the mode of their noise
    counts = ValidationCounts(rows_read, rejected, {"bad": rejected} if rejected else {})
    return release([sums], params, domain, counts, seed)


def test_the_attribution_release_step_checks_the_training_window_of_sums_built_by_hand():
    """Sums made without ``simulate_browsers`` (by hand, or another engine) pass the window rule at the
    release step itself (``check_sums_window``, as ARA's ``noisy_release``): over a layout learnt on a
    history, sums that do not say when their first conversion was are refused, as are sums holding a
    conversion before the history's end; a conversion at the end is released; a simulation is not checked."""
    params = _attribution_version().attribution
    assert params is not None
    end = 1_000_000_000
    layout = dataclasses.replace(KeyDomain.from_slice_values(("campaign",), {"campaign": np.array([0, 1])},
                                                             params.query_names).with_origin(DECLARED),
                                 learnt_before_us=end)

    def sums(first, seed=None):
        return BrowserSums({(q.name, 0): np.array([5, 0]) for q in params.queries}, rows=5, browsers=1,
                           simulated=seed is not None, first_time_us=first)

    counts = ValidationCounts(5, 0, {})
    with pytest.raises(PrivacyRefusal, match="do not record their earliest conversion"):
        release([sums(None)], params, layout, counts, None)
    with pytest.raises(PrivacyRefusal, match="whose last conversion is at"):
        release([sums(end - 1)], params, layout, counts, None)
    with pytest.raises(PrivacyRefusal, match="whose last conversion is at"):  # one shard's is enough
        release([sums(end + 5), sums(end - 1)], params, layout, dataclasses.replace(counts, rows_read=10), None)
    assert release([sums(end)], params, layout, counts, None).noisy
    assert release([sums(None, 3)], params, layout, counts, 3).noisy
    declared = dataclasses.replace(layout, learnt_before_us=None)  # no window: nothing to check
    assert release([sums(None)], params, declared, counts, None).noisy


def test_an_attribution_release_passes_at_the_rejected_share_and_is_refused_one_row_above():
    """The release step refuses one row above the share (nothing is noised: ``attribution.release.release``,
    the rule of every path), and the writer refuses such a release however it was made."""
    passing = _attribution_release(1000, 100, 3)
    ok = attribution_release_files(passing, "sha", True, True, 0.10)
    assert set(ok) >= {outputs.release_file(outputs.RELEASE_JSON, True), outputs.private_file(outputs.ACCOUNTING),
                       outputs.private_file(outputs.DEBUG_HISTOGRAMS_CSV),
                       outputs.release_file(outputs.HISTOGRAM_LAYOUT_CSV, True)}
    assert json.loads(ok[outputs.private_file(outputs.ACCOUNTING)])["accounting_closes"]
    with pytest.raises(PrivacyRefusal, match="101 of 1,000 input rows .* failed validation"):
        _attribution_release(1000, 101, 3)
    made_otherwise = dataclasses.replace(passing, counts=ValidationCounts(1000, 101, {"bad": 101}))
    with pytest.raises(InvalidInput, match="101 of 1,000 rows are invalid"):
        attribution_release_files(made_otherwise, "sha", True, False, 0.10)


def test_an_attribution_release_is_written_as_a_simulation_exactly_when_its_noise_was_seeded():
    with pytest.raises(PrivacyRefusal, match="written only as a simulation"):
        attribution_release_files(_attribution_release(10, 0, 3), "sha", False, False, 0.10)
    with pytest.raises(PrivacyRefusal, match="written only as a simulation"):
        attribution_release_files(_attribution_release(10, 0, None), "sha", True, False, 0.10)
    files = attribution_release_files(_attribution_release(10, 0, None), "sha", False, False, 0.10)
    assert outputs.private_file(outputs.DEBUG_HISTOGRAMS_CSV) not in files  # unnoised sums only when asked
    with pytest.raises(PrivacyRefusal, match="unnoised sums: it needs --simulation-seed"):  # and only in simulation
        attribution_release_files(_attribution_release(10, 0, None), "sha", False, True, 0.10)
    assert json.loads(files[outputs.release_file(outputs.RELEASE_JSON, False)])["simulation"] is False


# ---- nightly's window and the end of a night ------------------------------------------------------
def test_the_nightly_window_takes_its_days_and_the_lookbacks_before_them():
    paths = [f"h/date=2026-11-{d:02d}/p.parquet" for d in range(1, 11)] + ["h/other/p.parquet"]
    files, dates, lookback = window_partitions(paths, window("2026-11-09", 3, 2), "'h'")
    assert dates == ["2026-11-07", "2026-11-08", "2026-11-09"] and len(files) == 3
    assert lookback == ["h/date=2026-11-05/p.parquet", "h/date=2026-11-06/p.parquet"]
    assert window("2026-11-09", 1).start == dt.date(2026, 11, 9)
    with pytest.raises(InvalidParameters, match="--window-days must be >= 1"):
        window("2026-11-09", 0)
    with pytest.raises(InvalidInput, match="no history in the window 2026-12-01..2026-12-01 under 'h'"):
        window_partitions(paths, window("2026-12-01", 1), "'h'")


@pytest.mark.parametrize("idempotent, problems", [(False, ()), (True, ()), (False, ("C moves too far",))])
def test_a_night_publishes_exactly_when_nothing_refuses_it_and_always_writes_its_report(tmp_path, idempotent,
                                                                                          problems):
    store_uri = str(tmp_path / "store")
    store = open_store(store_uri)
    version = ParameterVersion(ara_params())
    report: dict = {"problems": list(problems), "published": False}
    if problems:
        with pytest.raises(InvalidInput, match="not published: C moves too far"):
            conclude_night(store, store_uri, report, version, idempotent, problems, "2026-11-09", "r1", None)
    else:
        directory = conclude_night(store, store_uri, report, version, idempotent, problems, "2026-11-09", "r1",
                                   "earlier" if idempotent else None)
        assert directory == os.path.join(store_uri, "reports", "2026-11-09-r1")
    published = store.list_versions()
    assert published == ([] if idempotent or problems else ["2026-11-09-r1"])
    assert report["published"] is (not idempotent and not problems)
    if idempotent:
        assert report["version"] == "earlier"
    written = json.loads((tmp_path / "store" / "reports" / "2026-11-09-r1" / "report.json").read_text())
    assert written["published"] is report["published"]
