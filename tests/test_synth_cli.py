"""Specification of the data CLI (pipelines.synth): synth, fit-synthetic, split, load-criteo.

Success exits 0. Bad input exits 2 with one line on stderr and no traceback.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from pipelines.synth import main, run_fit_synthetic, run_load_criteo, run_split, run_synth

REPO = Path(__file__).resolve().parents[1]


def one_line_error(capsys: pytest.CaptureFixture[str], *needles: str) -> str:
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert all(n in lines[0] for n in needles), lines[0]
    return lines[0]


def test_synth_writes_train_and_test(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "o"
    assert run_synth(["--preset", "synth-travel", "--scale", "0.02", "--seed", "5", "--out", str(out)]) == 0
    (line,) = capsys.readouterr().out.splitlines()  # one sentence
    assert line.startswith("araopt synth: wrote synth-travel") and "train:" in line and "test:" in line
    for split in ("train", "test"):
        manifest = json.loads((out / split / "_manifest.json").read_text())
        assert ds.dataset(out / split).count_rows() == manifest["conversions"] > 0
        assert f"{manifest['conversions']:,} conversions" in line
    assert sorted(p.name for p in (out / "train").iterdir()) == ["_manifest.json", "part-00000.parquet"]


def test_synth_days_and_target_conversions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "o"
    code = run_synth(["--preset", "synth-real-estate", "--target-conversions", "50000", "--days", "2",
                      "--start-date", "2024-02-28", "--split", "train", "--out", str(out)])
    assert code == 0
    assert sorted(p.name for p in (out / "train").glob("date=*")) == ["date=2024-02-28", "date=2024-02-29"]
    assert not (out / "test").exists()
    n = json.loads((out / "train" / "_manifest.json").read_text())["conversions"]
    assert 35_000 < n < 65_000 and f"{n:,} conversions" in capsys.readouterr().out


def test_help_documents_the_knobs(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_synth(["--help"]) == 0
    text = capsys.readouterr().out
    for needle in ("--scale", "k_min", "k_max", "--days", "--overwrite", "synth-criteo", "synth-real-estate",
                   "synth-travel", "--target-conversions", "date=YYYY-MM-DD", "attribution window"):
        assert needle in text, needle
    for run in (run_fit_synthetic, run_split, run_load_criteo):
        assert run(["--help"]) == 0
    assert main(["--help"]) == 0


@pytest.mark.parametrize("args,needle", [
    (["--preset", "synth-nope"], "unknown preset 'synth-nope'"),
    (["--preset", "synth-travel", "--b", "0"], "b must be > 0"),
    (["--preset", "synth-travel", "--b", "-0.5"], "b must be > 0"),
    (["--preset", "synth-travel", "--lam", "-1"], "lam must be >= 0"),
    (["--preset", "synth-travel", "--sigma", "0"], "sigma must be > 0"),
    (["--preset", "synth-travel", "--k-min", "0"], "k_min must be >= 1"),
    (["--preset", "synth-travel", "--k-min", "10", "--k-max", "5"], "k_max must be >= k_min"),
    (["--preset", "synth-travel", "--scale", "-2"], "--scale"),
    (["--preset", "synth-travel", "--scale", "1e9"], "--max-conversions"),
    (["--preset", "synth-travel", "--days", "0"], "--days"),
    (["--preset", "synth-travel", "--start-date", "2024-13-01"], "--start-date"),
    (["--preset", "missing.json"], "does not exist"),
])
def test_synth_bad_input_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                args: list[str], needle: str) -> None:
    assert run_synth([*args, "--out", str(tmp_path / "o")]) == 2
    one_line_error(capsys, "araopt synth: error:", needle)
    assert not (tmp_path / "o").exists()


def test_synth_refuses_existing_data_unless_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--preset", "synth-criteo", "--out", str(tmp_path)]
    (tmp_path / "keep.txt").write_text("mine")
    assert run_synth(args) == 2
    one_line_error(capsys, "already holds data", "--overwrite")
    assert run_synth([*args, "--overwrite"]) == 0
    assert run_synth([*args, "--overwrite", "--seed", "1"]) == 0
    assert (tmp_path / "keep.txt").read_text() == "mine"


def test_fit_synthetic_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_synth(["--preset", "synth-travel", "--scale", "0.05", "--split", "train", "--out", str(tmp_path / "o")]) == 0
    preset = tmp_path / "fit.json"
    assert run_fit_synthetic(["--input", str(tmp_path / "o" / "train"), "--out", str(preset), "--name", "t"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("araopt fit-synthetic: wrote preset 't'")
    data = json.loads(preset.read_text())
    assert abs(data["lam"] - 10) < 0.5 and abs(data["mu"] - 1.95) < 0.05
    assert data["name"] == "t" and "stderr" in data["fit"]
    assert run_synth(["--preset", str(preset), "--out", str(tmp_path / "o2"), "--split", "test"]) == 0
    capsys.readouterr()
    assert run_fit_synthetic(["--input", str(tmp_path / "o" / "train"), "--out", str(preset)]) == 2
    one_line_error(capsys, "already exists")
    assert run_fit_synthetic(["--input", str(tmp_path / "nope"), "--out", str(tmp_path / "f2.json")]) == 2
    one_line_error(capsys, "does not exist")
    assert run_fit_synthetic(["--input", str(tmp_path / "o" / "train"), "--out", str(tmp_path / "f3.json"),
                              "--slices", "partner_id"]) == 2
    one_line_error(capsys, "partner_id")


def test_split_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_synth(["--preset", "synth-travel", "--scale", "0.02", "--split", "train", "--out", str(tmp_path / "o")]) == 0
    capsys.readouterr()
    assert run_split(["--input", str(tmp_path / "o" / "train"), "--out", str(tmp_path / "s"),
                      "--train-fraction", "0.8"]) == 0
    line = capsys.readouterr().out
    train = ds.dataset(tmp_path / "s" / "train").count_rows()
    test = ds.dataset(tmp_path / "s" / "test").count_rows()
    assert abs(train - 0.8 * (train + test)) <= 1 and f"{train:,} rows before" in line
    assert run_split(["--input", str(tmp_path / "o" / "train"), "--out", str(tmp_path / "s2"), "--train-fraction", "2"]) == 2
    one_line_error(capsys, "araopt split: error:", "between 0 and 1")
    assert run_split(["--input", str(tmp_path / "o" / "train"), "--out", str(tmp_path / "s3"), "--cut-time", "soon"]) == 2
    one_line_error(capsys, "ISO-8601")


def criteo_line(sale: int, amount: str, delay: str, partner: str = "A1B2") -> str:
    """One line in the Criteo Sponsored Search format: 23 tab-separated fields, -1 = missing."""
    return "\t".join([str(sale), amount, delay, "1596439000", "-1", "10.0"] + ["-1"] * 15 + [partner, "-1"])


def test_load_criteo_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "c.tsv"
    good.write_text("\n".join([criteo_line(1, "12.5", "60"), criteo_line(0, "-1", "-1"), criteo_line(1, "3", "5")]) + "\n")
    assert run_load_criteo(["--input", str(good), "--out", str(tmp_path / "c")]) == 0
    assert "-> 2 conversions" in capsys.readouterr().out
    assert ds.dataset(tmp_path / "c", format="parquet").count_rows() == 2
    bad = tmp_path / "bad.tsv"
    bad.write_text("\n".join([criteo_line(1, "1", "1"), criteo_line(1, "1", "1"), "1\t0.5\t3"]) + "\n")
    assert run_load_criteo(["--input", str(bad), "--out", str(tmp_path / "c2")]) == 2
    one_line_error(capsys, "araopt load-criteo: error:", "line 3", "expected 23 tab-separated columns, found 3")


@pytest.mark.slow
def test_module_entry_point_exit_code_and_no_traceback(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "pipelines.synth", "synth", "--preset", "synth-travel",
                           "--b", "0", "--out", str(tmp_path / "o")], capture_output=True, text=True, cwd=REPO, env=env)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "araopt synth: error: power-law shape b must be > 0 (Def. 5.1), got 0.0"
    proc = subprocess.run([sys.executable, "-m", "pipelines.synth", "nope"], capture_output=True, text=True,
                          cwd=REPO, env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
