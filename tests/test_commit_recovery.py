"""A commit cannot lose a release nor record one falsely (slow: whole `araopt measure` jobs killed with
SIGKILL inside the commit; plus the same settlement on gs://). Whatever the point of the kill, the
next run into the output either finds the release whole (published, or finished from its complete
staging folder) or finds the input releasable again without --allow-rerelease (nothing published, the
ledger entry taken out)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from araopt.io import outputs
from araopt.io.folders import PENDING_TAG, STAGING_TAG
from araopt.io.run_folder import RunFolder, settle_pending
from araopt.io.stores import open_store
from araopt.ledger.ledger import Ledger
from factories import domain_csv, error_line, read_json, setup
from pipelines import measure as measure_pipeline

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A child `araopt measure` that kills itself (SIGKILL: no cleanup, no finally) at one point of the commit.
_KILLED_AT = {
    # right after the ledger's index records the release (before the manifests and the rename)
    "ledger record": ("araopt.io.store", "ParameterStore", "append_release"),
    # after the manifests are written, at the rename into place
    "rename": ("araopt.io.folders", None, "move_into_place"),
}
_CHILD = """
import importlib, os, signal, sys
module, owner, name = sys.argv[1:4]
mod = importlib.import_module(module)
holder = getattr(mod, owner) if owner != "-" else mod
original = getattr(holder, name)
def killed(*a, **k):
    if name == "append_release":
        original(*a, **k)
    os.kill(os.getpid(), signal.SIGKILL)
setattr(holder, name, killed)
from pipelines import measure
sys.exit(measure.run(sys.argv[4:]))
"""


def killed_measure(where: str, argv: list[str]) -> None:
    module, owner, name = _KILLED_AT[where]
    proc = subprocess.run([sys.executable, "-c", _CHILD, module, owner or "-", name, *argv], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]


def ledger_entries():
    return open_store(os.environ["ARAOPT_LEDGER"]).read_ledger()[0]


def test_a_run_killed_at_the_ledger_record_leaves_the_input_releasable_without_allow_rerelease(tmp_path, capsys):
    data, pfile = setup(tmp_path)
    argv = ["--input", data, "--params", pfile, "--output", str(tmp_path / "o"), "--domain", domain_csv(tmp_path)]
    killed_measure("ledger record", argv)
    assert len(ledger_entries()) == 1 and not (tmp_path / "o").exists()  # recorded, nothing published
    assert measure_pipeline.run(argv) == 0, capsys.readouterr().err  # the same command, no --allow-rerelease
    (entry,) = ledger_entries()  # the killed run's entry was taken out; this run's stands
    assert read_json(tmp_path / "o" / "private" / "run_manifest.json")["ledger"]["entry"]["id"] == entry["id"]
    assert read_json(tmp_path / "o" / "private" / "run_summary.json")["release_number_of_this_input"] == 1
    assert not [n for n in os.listdir(tmp_path) if STAGING_TAG in n or PENDING_TAG in n]


def test_a_run_killed_at_the_rename_is_published_whole_by_the_next_run_into_the_output(tmp_path, capsys):
    data, pfile = setup(tmp_path)
    argv = ["--input", data, "--params", pfile, "--output", str(tmp_path / "o"), "--domain", domain_csv(tmp_path)]
    killed_measure("rename", argv)
    (entry,) = ledger_entries()
    assert not (tmp_path / "o").exists()
    capsys.readouterr()
    assert measure_pipeline.run(argv) == 2  # the killed run's complete release is finished, not swept
    assert "already holds a run" in error_line(capsys.readouterr().err)
    manifest = read_json(tmp_path / "o" / "release" / "MANIFEST.json")
    assert manifest["complete"] is True
    for f in manifest["files"]:
        data_bytes = (tmp_path / "o" / "release" / f["path"]).read_bytes()
        assert outputs.sha256_hex(data_bytes) == f["sha256"]
    assert read_json(tmp_path / "o" / "private" / "run_manifest.json")["ledger"]["entry"]["id"] == entry["id"]
    assert [e["id"] for e in ledger_entries()] == [entry["id"]]
    assert not [n for n in os.listdir(tmp_path) if STAGING_TAG in n or PENDING_TAG in n]


# ---- the settlement itself, locally and on gs:// ----------------------------------------------------
def _staged_release(folder: RunFolder, ledger: Ledger, sealed: bool) -> str:
    """A commit killed after its ledger record: sealed (manifests written) or not. Returns the entry id."""
    from araopt.io.rowset import RowSet

    folder.write(outputs.release_file(outputs.RELEASE_JSON, False), json.dumps({"run": "killed"}).encode())
    rows = RowSet.merge([])
    entry_id = "e" * 32
    folder.mark_pending(ledger.store.uri, entry_id)
    recorded = ledger.check_and_record(rows, rows.to_parquet_bytes(), {"output": folder.target}, entry_id=entry_id)
    if sealed:
        folder._seal(False, {}, {"ledger": {"uri": ledger.store.uri, "entry": recorded.entry}})
    return entry_id


@pytest.mark.parametrize("sealed", [True, False])
def test_a_killed_commit_into_a_gcs_output_is_settled_by_the_next_commit(fake_gcs_server, tmp_path, sealed):
    ledger = Ledger.open(str(tmp_path / "ledger"), allow_rerelease=False)
    target = f"gs://{fake_gcs_server.bucket}/out-{sealed}"
    killed = RunFolder.prepare(target, overwrite=False)
    nxt = RunFolder.prepare(target, overwrite=False)  # started while the other one ran
    entry_id = _staged_release(killed, ledger, sealed)  # then killed: no move, pending record left behind
    nxt.write(outputs.release_file(outputs.RELEASE_JSON, False), json.dumps({"run": "next"}).encode())
    bucket = fake_gcs_server.client().bucket(fake_gcs_server.bucket)
    if sealed:  # finished under the next commit's lease: the next run finds the output taken
        with pytest.raises(Exception, match="already holds a run"):
            nxt.commit(False, {})
        nxt.abandon()
        assert [e["id"] for e in ledger.store.read_ledger()[0]] == [entry_id]
        with pytest.raises(Exception, match="already holds a run"):  # and a later run at once
            RunFolder.prepare(target, overwrite=False)
        assert json.loads(bucket.blob(f"out-{sealed}/release/release.json").download_as_bytes()) == {"run": "killed"}
        assert bucket.get_blob(f"out-{sealed}/release/MANIFEST.json") is not None
    else:  # nothing was published: the entry is taken out and the next commit goes through
        nxt.commit(False, {})
        assert ledger.store.read_ledger()[0] == []
        assert json.loads(bucket.blob(f"out-{sealed}/release/release.json").download_as_bytes()) == {"run": "next"}
    leftovers = [b.name for b in bucket.list_blobs(prefix=f"out-{sealed}.")]
    assert not [n for n in leftovers if STAGING_TAG in n or PENDING_TAG in n], leftovers


def test_a_commit_killed_after_its_rename_keeps_its_ledger_entry(tmp_path):
    ledger = Ledger.open(str(tmp_path / "ledger"), allow_rerelease=False)
    target = str(tmp_path / "o")
    folder = RunFolder.prepare(target, overwrite=False)
    entry_id = _staged_release(folder, ledger, sealed=True)
    os.rename(folder.staging, target)  # killed right after the rename, before the pending record went
    folder.lock.release()
    assert settle_pending(target) == [(entry_id, "published")]
    assert [e["id"] for e in ledger.store.read_ledger()[0]] == [entry_id]
    assert settle_pending(target) == []  # settled once


def test_a_killed_commit_into_a_gcs_output_is_settled_before_the_next_job_runs(fake_gcs_server, tmp_path):
    ledger = Ledger.open(str(tmp_path / "ledger"), allow_rerelease=False)
    target = f"gs://{fake_gcs_server.bucket}/early"
    entry_id = _staged_release(RunFolder.prepare(target, overwrite=False), ledger, sealed=True)
    with pytest.raises(Exception, match="already holds a run"):  # finished at prepare: refused before any work
        RunFolder.prepare(target, overwrite=False)
    assert [e["id"] for e in ledger.store.read_ledger()[0]] == [entry_id]
