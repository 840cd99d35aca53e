"""The run folder (fast): one commit per output, the overwrite rule checked at commit, symlinked outputs,
leftovers, the release manifest, and a failed run leaves nothing behind."""
from __future__ import annotations

import json
import logging
import os
import threading

import pyarrow.parquet as pq
import pytest

from araopt.errors import InvalidInput, OutputRefused
from araopt.io import outputs
from araopt.io.folders import REPLACED_TAG, STAGING_TAG
from araopt.io.run_folder import RunFolder, wait_for_manifest
from araopt.io.stores import open_store
from araopt.version import ParameterVersion
from factories import RACES, conversions_table


def commit_run(folder: RunFolder, tag: str) -> None:
    folder.write(outputs.release_file(outputs.RELEASE_JSON, False), json.dumps({"run": tag}).encode())
    folder.commit(False, {})


def released_tag(target) -> str:
    with open(os.path.join(target, "release", "release.json")) as fh:
        return json.load(fh)["run"]


# ---- one commit per output ------------------------------------------------------------------------
@pytest.mark.parametrize("race", range(RACES))
def test_two_runs_racing_into_one_output_commit_exactly_once(tmp_path, race):
    """Even races: both runs are started before either commits (the two-jobs-at-once case); odd races:
    free interleaving."""
    target = str(tmp_path / "out")
    start, started = threading.Barrier(2), threading.Barrier(2)
    won, lost = [], []

    def run(tag: str) -> None:
        start.wait()
        folder = None
        try:
            try:
                folder = RunFolder.prepare(target, overwrite=False)
            finally:
                if race % 2 == 0:
                    started.wait()
            commit_run(folder, tag)
            won.append(tag)
        except OutputRefused as exc:
            if folder is not None:
                folder.abandon()
            lost.append(str(exc))

    threads = [threading.Thread(target=run, args=(tag,)) for tag in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(lost) == 1, (won, lost)
    assert "\n" not in lost[0] and ("already holds a run" in lost[0] or "being written by another run" in lost[0])
    assert released_tag(target) == won[0]
    assert not [n for n in os.listdir(tmp_path) if STAGING_TAG in n or REPLACED_TAG in n]


def test_the_overwrite_rule_is_checked_again_at_commit(tmp_path):
    target = tmp_path / "out"
    folder = RunFolder.prepare(str(target), overwrite=False)
    (target / "release").mkdir(parents=True)  # a run appears meanwhile (not through the lock)
    (target / "release" / "MANIFEST.json").write_text("{}")
    folder.write(outputs.release_file(outputs.RELEASE_JSON, False), b"{}")
    recorded = []
    with pytest.raises(OutputRefused, match="already holds a run.*appeared while this run was running"):
        folder.commit(False, {}, before_move=lambda: recorded.append(1))
    folder.abandon()
    assert recorded == []  # refused before the commit step (the ledger) ran
    assert (target / "release" / "MANIFEST.json").read_text() == "{}"


def test_a_failed_commit_step_is_undone(tmp_path, monkeypatch):
    folder = RunFolder.prepare(str(tmp_path / "out"), overwrite=False)
    folder.write(outputs.release_file(outputs.RELEASE_JSON, False), b"{}")
    undone = []

    def boom(staging, target):
        raise OSError("disk full (injected)")

    monkeypatch.setattr("araopt.io.folders.move_into_place", boom)
    with pytest.raises(OSError):
        folder.commit(False, {}, before_move=lambda: lambda: undone.append(1))
    folder.abandon()
    assert undone == [1] and not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["right after the rename", "deleting the replaced folder"])
def test_an_interrupt_once_the_release_is_in_place_does_not_undo_its_record(tmp_path, monkeypatch, where):
    """Ctrl-C after the new run is in place (a red-team run: while --overwrite deleted the old folder) used
    to take the ledger entry out while the release stayed published, so the same input could be released
    again elsewhere: once in place, the record stands (the old folder is a leftover the next run removes)."""
    import araopt.io.folders as folders

    commit_run(RunFolder.prepare(str(tmp_path / "out"), overwrite=False), "old")
    folder = RunFolder.prepare(str(tmp_path / "out"), overwrite=True)
    folder.write(outputs.release_file(outputs.RELEASE_JSON, False), json.dumps({"run": "new"}).encode())
    move, undone = folders.move_into_place, []

    def interrupted_after_move(staging, target):
        move(staging, target)
        raise KeyboardInterrupt

    def interrupted_cleanup(replaced, target):
        raise KeyboardInterrupt

    if where == "right after the rename":
        monkeypatch.setattr("araopt.io.folders.move_into_place", interrupted_after_move)
    else:
        monkeypatch.setattr("araopt.io.folders.remove_replaced", interrupted_cleanup)
    with pytest.raises(KeyboardInterrupt):
        folder.commit(False, {}, before_move=lambda: lambda: undone.append(1))
    folder.abandon()
    assert undone == [] and released_tag(tmp_path / "out") == "new"


def test_overwrite_through_a_symlinked_output_replaces_the_folder_it_names(tmp_path, caplog):
    real, link = tmp_path / "real", tmp_path / "link"
    commit_run(RunFolder.prepare(str(real), overwrite=False), "old")
    link.symlink_to(real)
    commit_run(RunFolder.prepare(str(link), overwrite=True), "new")
    assert link.is_symlink() and released_tag(link) == released_tag(real) == "new"
    assert sorted(os.listdir(tmp_path)) == [".real.araopt-lock", "link", "real"]  # no replaced link left behind
    with caplog.at_level(logging.WARNING):
        commit_run(RunFolder.prepare(str(link), overwrite=True), "newer")
    assert "removed the leftover" not in caplog.text and released_tag(real) == "newer"


def test_leftovers_of_killed_runs_are_swept_by_the_next_run_only(tmp_path):
    target = str(tmp_path / "out")
    dead = tmp_path / f"out{STAGING_TAG}0123abcd"  # a killed run's staging folder (its lock died with it)
    dead.mkdir()
    live = RunFolder.prepare(target, overwrite=False)  # holds the output's lock: its staging folder is alive
    with pytest.raises(OutputRefused, match="being written by another run"):
        RunFolder.prepare(target, overwrite=False)
    assert os.path.isdir(live.staging) and not dead.exists()
    live.abandon()
    assert not os.path.exists(live.staging)


def test_wait_for_manifest_reads_the_release_manifest_and_refuses_an_incomplete_run(tmp_path):
    folder = RunFolder.prepare(str(tmp_path / "out"), overwrite=False)
    folder.write(outputs.release_file(outputs.RELEASE_JSON, False), b"{}")
    folder.write(outputs.private_file(outputs.RUN_SUMMARY), b"{}")
    manifest = folder.commit(False, {"epsilon": 1.0}, {"input": {"files": ["x.parquet"]}})
    on_disk = json.loads((tmp_path / "out" / "release" / "MANIFEST.json").read_text())
    assert wait_for_manifest(str(tmp_path / "out")) == on_disk
    assert [f["path"] for f in manifest["files"]] == ["release.json"]  # release files only, nothing else
    private = json.loads((tmp_path / "out" / "private" / "run_manifest.json").read_text())
    assert [f["path"] for f in private["files"]] == ["private/run_summary.json"] and private["input"]
    os.remove(tmp_path / "out" / "release" / "MANIFEST.json")
    with pytest.raises(InvalidInput, match="incomplete"):
        wait_for_manifest(str(tmp_path / "out"))


def test_a_run_failing_after_its_output_was_prepared_leaves_no_staging_folder(tmp_path, monkeypatch, capsys):
    from araopt import Params, QueryParams
    from pipelines import measure as measure_pipeline

    pq.write_table(conversions_table(50), tmp_path / "in.parquet")
    ParameterVersion(Params(count_limit=2, encoding="linf", epsilon=8.0, slice_columns=("s",),
                            queries=(QueryParams("v", 20.0, 1.0),))).save(tmp_path / "p.json")
    (tmp_path / "domain.csv").write_text("s\na\nb\n")

    def boom(*args, **kwargs):
        raise RuntimeError("injected failure while building the job")

    monkeypatch.setattr(measure_pipeline, "build_release", boom)
    code = measure_pipeline.run(["--input", str(tmp_path / "in.parquet"), "--params", str(tmp_path / "p.json"),
                                 "--output", str(tmp_path / "out"), "--domain", str(tmp_path / "domain.csv")])
    err = capsys.readouterr().err
    assert code == 2 and "injected failure" in err and "Traceback" not in err
    assert not [n for n in os.listdir(tmp_path) if STAGING_TAG in n or n == "out"]


def test_a_parameter_file_inside_a_store_is_read_as_the_stores(tmp_path):
    from araopt import Params, QueryParams
    from pipelines.inputs import load_params

    params = Params(count_limit=2, encoding="linf", epsilon=8.0, slice_columns=("s",),
                    queries=(QueryParams("v", 20.0, 1.0),))
    store = open_store(str(tmp_path / "store"))
    version = store.publish("2026-11-20", "r1", ParameterVersion(params).to_bytes()).version
    for ref in (f"{tmp_path}/store/versions/{version}/params.json", f"{tmp_path}/store/versions/{version}",
                f"{tmp_path}/store"):
        assert load_params(ref).store == store.uri, ref
