"""One output-folder contract (araopt.io.folders) for every command that writes a folder: staged, the
manifest written last, renamed into place under the target's lock with the overwrite rule checked at
the start and again at commit. A run that raises or is killed mid-write leaves no partial folder and
keeps the previous one whole."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pytest

from araopt import ParameterVersion
from araopt.errors import OutputRefused
from araopt.io.folders import (
    DATA_FOLDER,
    EXPORT_FOLDER,
    MANIFEST,
    OutputFolder,
    check_output_file,
    check_target,
)
from factories import du_penc_frame, du_penc_params, log, setup


def _tree(path: Path) -> dict[str, bytes]:
    """Every data file under ``path`` with its bytes (lock files are bookkeeping: a run rewrites its owner record)."""
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file() and ".araopt-lock" not in p.name}


def _staged(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if ".araopt-staging-" in p.name or ".araopt-replaced-" in p.name]


# ---- the contract ----------------------------------------------------------------------------------

def test_a_folder_is_published_whole_with_its_manifest_last(tmp_path):
    with OutputFolder.prepare(tmp_path / "out", False, "test") as folder:
        (Path(folder.staging) / "a.txt").write_text("a")
        (Path(folder.staging) / "sub").mkdir()
        (Path(folder.staging) / "sub" / "b.txt").write_text("bb")
        assert not (tmp_path / "out").exists()  # nothing is visible before the commit
        manifest = folder.commit({"command": "test"})
    written = json.loads((tmp_path / "out" / MANIFEST).read_text())
    assert written == manifest and written["command"] == "test"
    assert [(f["path"], f["size"]) for f in written["files"]] == [("a.txt", 1), ("sub/b.txt", 2)]
    assert _staged(tmp_path) == []


def test_an_exception_mid_write_leaves_nothing_and_keeps_the_previous_folder(tmp_path):
    with OutputFolder.prepare(tmp_path / "out", False, "test") as folder:
        (Path(folder.staging) / "a.txt").write_text("old")
        folder.commit()
    before = _tree(tmp_path / "out")
    with pytest.raises(RuntimeError, match="injected"), OutputFolder.prepare(tmp_path / "out", True, "test") as folder:
        (Path(folder.staging) / "a.txt").write_text("new")
        raise RuntimeError("injected")
    assert _tree(tmp_path / "out") == before and _staged(tmp_path) == []
    with OutputFolder.prepare(tmp_path / "new", False, "test") as folder:  # never committed
        (Path(folder.staging) / "a.txt").write_text("x")
    assert not (tmp_path / "new").exists() and _staged(tmp_path) == []


def test_the_overwrite_rule(tmp_path):
    check_target(tmp_path / "absent", False, DATA_FOLDER)
    (tmp_path / "empty").mkdir()
    check_target(tmp_path / "empty", False, DATA_FOLDER)
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "notes.txt").write_text("x")
    for overwrite in (False, True):  # never into or over a folder araopt did not write, --overwrite or not
        with pytest.raises(OutputRefused, match="is not an araopt output folder .no _manifest.json."):
            check_target(tmp_path / "theirs", overwrite, DATA_FOLDER)
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputRefused, match="is not a directory"):
        check_target(tmp_path / "file", True, DATA_FOLDER)
    with OutputFolder.prepare(tmp_path / "ours", False, "test") as folder:
        folder.commit()
    with pytest.raises(OutputRefused, match="already holds data; pass --overwrite"):
        OutputFolder.prepare(tmp_path / "ours", False, "test")
    check_target(tmp_path / "ours", True, DATA_FOLDER)
    (tmp_path / "legacy").mkdir()  # an export written before exports had a manifest
    (tmp_path / "legacy" / "key_map.json").write_text("{}")
    check_target(tmp_path / "legacy", True, EXPORT_FOLDER)
    with pytest.raises(OutputRefused, match="already exists; pass --overwrite"):
        check_output_file(tmp_path / "file", False)
    check_output_file(tmp_path / "file", True)
    with pytest.raises(OutputRefused, match="is a directory"):
        check_output_file(tmp_path / "ours", True)


def test_a_target_that_appears_during_the_run_is_refused_at_commit(tmp_path):
    folder = OutputFolder.prepare(tmp_path / "out", False, "test")
    with pytest.raises(OutputRefused, match="appeared while this run was running"), folder:
        (Path(folder.staging) / "a.txt").write_text("mine")
        (tmp_path / "out").mkdir()
        (tmp_path / "out" / MANIFEST).write_text("{}")
        folder.commit()
    assert _tree(tmp_path / "out") == {MANIFEST: b"{}"} and _staged(tmp_path) == []


def test_one_run_at_a_time(tmp_path):
    first = OutputFolder.prepare(tmp_path / "out", False, "the first run")
    with pytest.raises(OutputRefused, match="being written by another run: the first run"):
        OutputFolder.prepare(tmp_path / "out", False, "the second run")
    first.abandon()
    OutputFolder.prepare(tmp_path / "out", False, "the second run").abandon()


def test_a_killed_run_leaves_no_folder_and_the_next_run_sweeps_its_staging(tmp_path):
    """kill -9 in the middle of writing: the target is absent (or the previous one, whole); the next
    holder of the lock removes the dead run's staging folder."""
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from araopt.io.folders import OutputFolder
        folder = OutputFolder.prepare({str(tmp_path / "out")!r}, True, "the killed run")
        (Path(folder.staging) / "part-0.parquet").write_bytes(b"x" * 1000)
        print("writing", flush=True)
        time.sleep(60)
        folder.commit()
    """)
    with OutputFolder.prepare(tmp_path / "out", False, "test") as folder:
        (Path(folder.staging) / "a.txt").write_text("previous")
        folder.commit()
    before = _tree(tmp_path / "out")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[1])
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "writing"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert _tree(tmp_path / "out") == before
    assert len(_staged(tmp_path)) == 1  # the killed run's staging folder, never visible as the output
    deadline = time.monotonic() + 10
    while True:  # the kernel has released the dead run's lock
        try:
            folder = OutputFolder.prepare(tmp_path / "out", True, "the next run")
            break
        except OutputRefused:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert len(_staged(tmp_path)) == 1  # swept; only the next run's own staging folder is left
    folder.abandon()
    assert _staged(tmp_path) == [] and _tree(tmp_path / "out") == before


# ---- every command that writes a folder --------------------------------------------------------------

def _fail_on_second_call(monkeypatch, target: str, attr: str):
    """Make ``target.attr`` raise on its second call: the first file is staged, then the write fails."""
    import importlib

    module = importlib.import_module(target)
    real = getattr(module, attr)
    calls = []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise OSError("disk full (injected)")
        return real(*args, **kwargs)

    monkeypatch.setattr(module, attr, flaky)
    return calls


def test_synth_and_split_interrupted_mid_write_leave_the_previous_splits_whole(tmp_path, monkeypatch):
    from araopt.data.split import split_by_time
    from araopt.data.synthetic import PRESETS, write_synthetic

    out = tmp_path / "synth"
    write_synthetic(out, PRESETS["synth-criteo"], seed=0, scale=0.2, max_rows_per_file=400)
    before = _tree(out)
    calls = _fail_on_second_call(monkeypatch, "araopt.data.synthetic", "ParquetShardWriter")  # the test split
    with pytest.raises(OSError, match="injected"):
        write_synthetic(out, PRESETS["synth-criteo"], seed=1, scale=0.2, overwrite=True)
    assert calls and _tree(out) == before and _staged(out) == []
    monkeypatch.undo()

    table = pa.Table.from_pandas(log(), preserve_index=False)
    split_by_time(table, tmp_path / "split", train_fraction=0.5)
    before = _tree(tmp_path / "split")
    _fail_on_second_call(monkeypatch, "araopt.data.split", "ParquetShardWriter")  # the test side
    with pytest.raises(OSError, match="injected"):
        split_by_time(table, tmp_path / "split", train_fraction=0.3, overwrite=True)
    assert _tree(tmp_path / "split") == before and _staged(tmp_path / "split") == []


def test_load_criteo_interrupted_mid_write_leaves_no_folder(tmp_path, monkeypatch):
    from araopt.data import criteo

    path = tmp_path / "c.tsv"
    path.write_text("1\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\n")

    def boom(*args, **kwargs):
        yield from ()
        raise OSError("disk full (injected)")

    monkeypatch.setattr(criteo, "iter_criteo", boom)
    with pytest.raises(OSError, match="injected"):
        criteo.convert_criteo(path, tmp_path / "criteo")
    assert not (tmp_path / "criteo").exists() and _staged(tmp_path) == []


def test_export_ara_interrupted_mid_write_leaves_the_previous_export_whole(tmp_path, monkeypatch, capsys):
    from pipelines.ara import run_export_ara

    ParameterVersion(du_penc_params()).save(tmp_path / "p.json")
    du_penc_frame().to_parquet(tmp_path / "log.parquet")
    argv = ["--params", str(tmp_path / "p.json"), "--conversions", str(tmp_path / "log.parquet"),
            "--simulation-seed", "1",  # a domain from the log's own slices: simulation only
            "--out", str(tmp_path / "export")]
    assert run_export_ara(argv) == 0
    manifest = json.loads((tmp_path / "export" / MANIFEST).read_text())
    assert {f["path"] for f in manifest["files"]} == {"key_map.json", "key_map.csv", "sources.json",
                                                      "output_domain.avro", "private/triggers.jsonl",
                                                      "private/README.txt", "export.json"}
    before = _tree(tmp_path / "export")
    assert run_export_ara(argv) == 2
    assert "already holds an export; pass --overwrite" in capsys.readouterr().err

    def boom(*args, **kwargs):  # after key_map.json/.csv and sources.json are staged
        raise OSError("disk full (injected)")

    monkeypatch.setattr("araopt.io.avro.write_output_domain", boom)
    assert run_export_ara([*argv, "--overwrite"]) == 2
    assert "injected" in capsys.readouterr().err
    assert _tree(tmp_path / "export") == before and _staged(tmp_path) == []
    monkeypatch.undo()
    assert run_export_ara([*argv[:-2], "--out", str(tmp_path / "fresh")]) == 0
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "notes.txt").write_text("x")
    assert run_export_ara([*argv[:-2], "--out", str(tmp_path / "theirs"), "--overwrite"]) == 2
    assert "not an araopt export folder" in capsys.readouterr().err
    assert _tree(tmp_path / "theirs") == {"notes.txt": b"x"}


def test_evaluate_interrupted_mid_write_leaves_no_folder(tmp_path, monkeypatch, capsys):
    """Part of the results is staged, then the run fails: no evaluation folder."""
    import araopt.evaluation.evaluate as evaluation
    from pipelines.evaluate import run_evaluate

    data, _ = setup(tmp_path)

    def write_then_fail(evaluations, out_dir):
        Path(out_dir, "rmsre.csv").write_text("staged")
        raise OSError("disk full (injected)")

    monkeypatch.setattr(evaluation, "write_outputs", write_then_fail)
    out = tmp_path / "eval"
    argv = ["--train", data, "--test", data, "--slices", "s", "--values", "v", "--epsilons", "8", "--out", str(out),
            "--no-progress"]
    assert run_evaluate(argv) == 2
    assert "injected" in capsys.readouterr().err
    assert not out.exists() and _staged(tmp_path) == []
    out.mkdir()
    (out / "notes.txt").write_text("x")
    assert run_evaluate([*argv, "--overwrite"]) == 2
    assert "not an araopt evaluation folder" in capsys.readouterr().err


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
def test_a_run_ended_by_a_signal_leaves_no_staging_folder_and_frees_the_target(tmp_path, signame):
    # a run killed politely (timeout, kill, a closed terminal) while writing: the staging folder goes with it
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from araopt.io.folders import OutputFolder
        with OutputFolder.prepare({str(tmp_path / "out")!r}, False, "test") as folder:
            (Path(folder.staging) / "part.txt").write_text("half")
            print("ready", flush=True)
            time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    proc.send_signal(getattr(signal, signame))
    assert proc.wait(timeout=30) == 128 + getattr(signal, signame)
    assert [p.name for p in tmp_path.iterdir() if "staging" in p.name] == []
    assert not (tmp_path / "out").exists()
    with OutputFolder.prepare(tmp_path / "out", False, "test") as folder:  # the lock was released
        folder.commit({})
    assert (tmp_path / "out" / MANIFEST).exists()
