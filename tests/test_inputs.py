"""Inputs that used to abort a job or pass silently: conversion times far in the future or the past,
duplicate JSON keys, parameters whose scales are 0, data-derived key maps, domain integers beyond
int64, key maps without the parameters' checksum, a file named twice, partition folders matched by
a glob, unknown options. Each goes to the dead letter with a reason or is refused in one line."""
from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from araopt import Params, QueryParams
from araopt.io import outputs
from araopt.io.conversions import validate_batch
from araopt.io.files import micros_iso
from araopt.version import ParameterVersion
from factories import history_version, log, write_log
from transforms.io import read_footer, window_of

T0 = pd.Timestamp("2026-09-01", tz="UTC")


def with_times(frame, micros, unit="us"):
    """``frame`` as an Arrow table whose conversion times are the given integers in ``unit``."""
    table = pa.Table.from_pandas(frame, preserve_index=False)
    times = pa.array(np.asarray(micros, dtype=np.int64), type=pa.timestamp(unit, tz="UTC"))
    return table.set_column(table.schema.get_field_index("conversion_time"), "conversion_time", times)


def params(**kw):
    base = dict(count_limit=2, encoding="linf", epsilon=8.0, slice_columns=("s",), queries=(QueryParams("v", 20.0, 1.0),))
    base.update(kw)
    return Params(**base)


# ---- conversion times ----------------------------------------------------------------------------
YEAR_10000_US = 253_402_300_800_000_000  # 10000-01-01: a valid int64 microsecond timestamp


@pytest.mark.parametrize("unit, times, rejected", [
    ("us", [0, 7_258_118_400_000_000 - 1], [False, False]),  # 1970-01-01 and the last microsecond before 2200
    ("us", [-1, 7_258_118_400_000_000], [True, True]),  # 1969-12-31T23:59:59.999999 and 2200-01-01
    ("us", [YEAR_10000_US, -62_135_596_800_000_000], [True, True]),  # year 10000, year 1
    ("s", [YEAR_10000_US // 1_000_000, 1_700_000_000], [True, False]),
    ("ms", [-(2**62), 1_700_000_000_000], [True, False]),
])
def test_far_future_and_far_past_conversion_times_go_to_the_dead_letter(unit, times, rejected):
    frame = log(2)
    batch = validate_batch(with_times(frame, times, unit), ["s"], ["v"])
    assert batch.valid.num_rows == rejected.count(False)
    assert batch.rejected.column("reason").to_pylist() == ["conversion_time_out_of_range"] * rejected.count(True)


def test_footer_statistics_of_a_year_10000_time_do_not_abort_and_name_the_window(tmp_path):
    frame = log(3)
    micros = [int(T0.value // 1000), YEAR_10000_US, int(T0.value // 1000) + 5]
    pq.write_table(with_times(frame, micros), str(tmp_path / "far.parquet"))
    pq.write_table(with_times(frame, [-62_135_596_800_000_000] * 3), str(tmp_path / "past.parquet"))
    far, past = (read_footer(str(tmp_path / name)) for name in ("far.parquet", "past.parquet"))
    assert far.rows + past.rows == 6
    first, last = window_of([far, past])
    assert (micros_iso(first), micros_iso(last)) == ("0001-01-01T00:00:00+00:00", "10000-01-01T00:00:00.000000+00:00")
    assert (first, last) == (-62_135_596_800_000_000, YEAR_10000_US)
    assert far.window() == (int(T0.value // 1000), YEAR_10000_US)
    assert micros_iso(far.window()[0]) == "2026-09-01T00:00:00+00:00"


def test_footer_times_are_named_exactly_whatever_the_year():
    """``micros_iso`` names every time a footer can hold (years 1 to 10000 and beyond: pandas'
    Timestamp stops at 2262) exactly: numpy reads each name back to the same microsecond."""
    for micros in (0, -1, int(T0.value // 1000) + 7, YEAR_10000_US, -62_135_596_800_000_000, 2**62 // 1000):
        name = micros_iso(micros)
        assert name is not None and name.endswith("+00:00")
        assert int(np.datetime64(name.removesuffix("+00:00"), "us").astype(np.int64)) == micros
    assert micros_iso(None) is None


@pytest.mark.slow
def test_a_conversion_at_year_10000_is_dead_lettered_by_every_job(tmp_path, capsys):
    from pipelines import measure as measure_pipeline
    from pipelines import optimize

    frame = log()
    micros = (frame["conversion_time"].astype("int64") // 1000).to_numpy().copy()
    micros[0] = YEAR_10000_US
    path = tmp_path / "log.parquet"
    pq.write_table(with_times(frame, micros), str(path))
    assert optimize.run(["--history", str(path), "--slices", "s", "--values", "v", "--epsilon", "8", "--output",
                         str(tmp_path / "p.json")]) == 0
    assert "conversion_time_out_of_range 1" in capsys.readouterr().err
    # (a simulation: the version's history domain was learnt on this log, which a release may not list)
    assert measure_pipeline.run(["--input", str(path), "--params", str(tmp_path / "p.json"), "--output",
                                 str(tmp_path / "out"), "--simulation-seed", "1"]) == 0
    summary = json.loads((tmp_path / "out" / outputs.private_file(outputs.RUN_SUMMARY)).read_text())
    assert summary["rows_rejected_by_reason"] == {"conversion_time_out_of_range": 1} and summary["accounting_closes"]
    dead = pq.read_table(str(tmp_path / "out" / outputs.private_file(outputs.DEAD_LETTER)))
    assert dead.column("reason").to_pylist() == ["conversion_time_out_of_range"]


# ---- parameters whose scale floor(alpha Gamma / C) is 0 ------------------------------------------
def test_a_budget_fraction_whose_scale_is_zero_is_refused_with_the_reason():
    smallest = 2 / 65536  # floor(alpha x 65536 / 2) = 1 exactly
    two = lambda a: (QueryParams("v", 20.0, a), QueryParams("w", 5.0, 1.0 - a))  # noqa: E731
    assert params(queries=two(smallest)).count_limit == 2
    with pytest.raises(ValueError, match=r"queries\['v'\].budget_fraction = 3.05175781\d*e-05 gives the scale "
                                         r"floor\(alpha x Gamma / C\) = floor\(.* x 65536 / 2\) = 0"):
        params(queries=two(np.nextafter(smallest, 0.0)))
    with pytest.raises(ValueError, match=r"count_budget_fraction = 1e-05 gives the scale .* = 0"):
        params(encoding="baseline", count_budget_fraction=1e-5, queries=(QueryParams("v", 20.0, 1 - 1e-5),))
    # a larger C needs a larger fraction; the parameter file names itself
    text = ParameterVersion(params(queries=two(20 / 65536), count_limit=20)).to_bytes()
    text = text.replace(b'"count_limit": 20', b'"count_limit": 21')
    with pytest.raises(ValueError, match=r"^p.json: queries\['v'\].budget_fraction .* x 65536 / 21\) = 0"):
        ParameterVersion.from_bytes(text, "p.json")


# ---- the rejected-share gate -------------------------------------------------------------------------
def test_the_rejected_share_gate_flips_on_one_row_at_the_threshold_and_says_so():
    from araopt.io.conversions import ValidationCounts, check_rejected_share
    from pipelines.options import build_parser

    check_rejected_share(ValidationCounts(1000, 100, {"null_value": 100}))  # exactly 10%: the job goes on
    with pytest.raises(ValueError, match=r"101 of 1,000 input rows \(10.1%\) failed validation, above the 10% threshold"):
        check_rejected_share(ValidationCounts(1000, 101, {"null_value": 101}))
    text = " ".join(build_parser("measure").format_help().split())
    assert "exactly this share passes, one more invalid row fails the job" in text


# ---- key maps: origin, the parameters' checksum, int64 values -----------------------------------


def test_export_ara_key_maps_record_where_their_slices_come_from(tmp_path, capsys):
    from pipelines.ara import run_export_ara

    data = write_log(tmp_path)
    p = params()
    ParameterVersion(p).save(tmp_path / "p.json")
    assert run_export_ara(["--params", str(tmp_path / "p.json"), "--out", str(tmp_path / "e1"), "--conversions", data,
                           "--simulation-seed", "1"]) == 0  # (without a seed: refused, test_ara)
    assert json.loads((tmp_path / "e1" / "key_map.json").read_text())["origin"] == "data"
    history_version(p, {"s": np.array(["a", "b", "c"])}).save(tmp_path / "ph.json")
    assert run_export_ara(["--params", str(tmp_path / "ph.json"), "--out", str(tmp_path / "e2")]) == 0
    assert json.loads((tmp_path / "e2" / "key_map.json").read_text())["origin"] == "history"
    # a key map passed on keeps its origin (one of origin data only in simulation, as measure takes it);
    # the parameters' embedded domain carries none (checksums unchanged)
    again = ["--params", str(tmp_path / "p.json"), "--key-map", str(tmp_path / "e1" / "key_map.json")]
    assert run_export_ara([*again, "--out", str(tmp_path / "e3")]) == 2
    assert "derived from the data" in capsys.readouterr().err and not (tmp_path / "e3").exists()
    assert run_export_ara([*again, "--out", str(tmp_path / "e3"), "--conversions", data, "--simulation-seed", "1"]) == 0
    assert json.loads((tmp_path / "e3" / "key_map.json").read_text())["origin"] == "data"
    assert "origin" not in json.loads((tmp_path / "ph.json").read_text())["domain"]


def test_measure_refuses_a_data_derived_key_map_outside_simulation(tmp_path, capsys):
    from pipelines import measure as measure_pipeline
    from pipelines.ara import run_export_ara

    data = write_log(tmp_path)
    ParameterVersion(params()).save(tmp_path / "p.json")
    assert run_export_ara(["--params", str(tmp_path / "p.json"), "--out", str(tmp_path / "e"), "--conversions", data,
                           "--simulation-seed", "1"]) == 0
    capsys.readouterr()
    args = ["--input", data, "--params", str(tmp_path / "p.json"), "--domain", str(tmp_path / "e" / "key_map.json"),
            "--output", str(tmp_path / "out")]
    assert measure_pipeline.run(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "key map origin 'data'" in err and "--simulation-seed" in err
    assert not (tmp_path / "out").exists()


def test_key_maps_without_origin_or_parameter_checksum_are_refused():
    from araopt.ara.registrations import KeyMap
    from araopt.mechanism.keys import KeyDomain

    doc = KeyDomain.from_slice_values(("s",), {"s": np.array(["a"])}, ("v",)).to_json("ab" * 32)
    assert KeyMap.from_json(doc).domain.origin == "data"
    for field, value, message in (("origin", None, "no valid origin"), ("origin", "guessed", "no valid origin"),
                                  ("params_sha256", None, "no params_sha256"), ("params_sha256", "abc", "no params_sha256")):
        bad = {**doc, field: value}
        for load in (KeyMap.from_json, KeyDomain.from_json):
            with pytest.raises(ValueError, match=message):
                load(bad)


def test_a_domain_integer_beyond_int64_is_refused_when_the_domain_is_loaded(tmp_path, capsys):
    from araopt.mechanism.keys import KeyDomain
    from pipelines import measure as measure_pipeline

    frame = log().assign(s=lambda f: f["impression_id"] % 3)
    data = write_log(tmp_path, frame)
    ParameterVersion(params()).save(tmp_path / "p.json")
    (tmp_path / "d.csv").write_text("s\n0\n1\n9223372036854775808\n")
    assert measure_pipeline.run(["--input", data, "--params", str(tmp_path / "p.json"), "--domain",
                                 str(tmp_path / "d.csv"), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "9223372036854775808 does not fit int64" in err and not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match="value -9223372036854775809 does not fit int64"):
        KeyDomain(("s",), ((0, -(2**63) - 1),), np.zeros((0, 1)), ("v",))
    KeyDomain(("s",), ((2**63 - 1, -(2**63)),), np.zeros((0, 1)), ("v",))  # the int64 bounds themselves fit


@pytest.mark.slow
def test_measures_key_map_records_the_domains_origin(tmp_path, capsys):
    from pipelines import measure as measure_pipeline

    data = write_log(tmp_path)
    ParameterVersion(params()).save(tmp_path / "p.json")
    (tmp_path / "d.csv").write_text("s\na\nb\nc\nd\n")
    base = ["--input", data, "--params", str(tmp_path / "p.json")]
    assert measure_pipeline.run(base + ["--domain", str(tmp_path / "d.csv"), "--output", str(tmp_path / "o1")]) == 0
    km = json.loads((tmp_path / "o1" / outputs.release_file(outputs.KEY_MAP_JSON, False)).read_text())
    assert km["origin"] == "declared" and km["params_sha256"] == ParameterVersion(params()).checksum()
    assert measure_pipeline.run(base + ["--simulation-seed", "1", "--output", str(tmp_path / "o2")]) == 0
    km = json.loads((tmp_path / "o2" / outputs.release_file(outputs.KEY_MAP_JSON, True)).read_text())
    assert km["origin"] == "data"
    # a simulation may use the data-derived key map; a release may not (test above)
    assert measure_pipeline.run(base + ["--simulation-seed", "1", "--domain",
                                        str(tmp_path / "o2" / outputs.release_file(outputs.KEY_MAP_JSON, True)),
                                        "--output", str(tmp_path / "o3")]) == 0


# ---- a file named twice is read once --------------------------------------------------------------
def test_a_file_named_twice_in_one_input_is_read_once(tmp_path):
    from araopt.io.avro import expand_paths
    from transforms.io import check_input, match_files

    folder = tmp_path / "log"
    folder.mkdir()
    log(200).to_parquet(folder / "a.parquet")
    log(100, seed=1).to_parquet(folder / "b.parquet")
    os.symlink(folder / "a.parquet", folder / "c.parquet")  # the same file under another name
    os.link(folder / "b.parquet", folder / "d.parquet")  # and a hard link
    assert [os.path.basename(p) for p in match_files(str(folder))] == ["a.parquet", "b.parquet"]
    assert [os.path.basename(p) for p in match_files(str(folder / "*.parquet"))] == ["a.parquet", "b.parquet"]
    a = str(folder / "a.parquet")
    inputs = check_input([a, a, str(folder / "." / "a.parquet"), str(folder / "c.parquet")], ["s"], ["v"])
    assert inputs.paths == (a,) and inputs.rows == 200
    (tmp_path / "r.avro").write_bytes(b"x")
    os.symlink(tmp_path / "r.avro", tmp_path / "s.avro")
    assert expand_paths([str(tmp_path / "r.avro"), str(tmp_path / "." / "r.avro"), str(tmp_path / "s.avro")]) == [
        str(tmp_path / "r.avro")]


@pytest.mark.slow
def test_measure_counts_the_rows_of_a_file_named_twice_once(tmp_path, capsys):
    from pipelines import measure as measure_pipeline

    folder = tmp_path / "log"
    folder.mkdir()
    log().to_parquet(folder / "a.parquet")
    os.symlink(folder / "a.parquet", folder / "copy.parquet")
    ParameterVersion(params()).save(tmp_path / "p.json")
    assert measure_pipeline.run(["--input", str(folder), "--params", str(tmp_path / "p.json"), "--output",
                                 str(tmp_path / "out"), "--simulation-seed", "1"]) == 0
    summary = json.loads((tmp_path / "out" / outputs.private_file(outputs.RUN_SUMMARY)).read_text())
    assert summary["rows_read"] == len(log()) and summary["input_files"] == 1


# ---- a glob that matches partition folders --------------------------------------------------------
def partitions(tmp_path):
    root = tmp_path / "log"
    for day, sub in (("2026-09-01", ""), ("2026-09-02", "hour=03"), ("2026-09-10", "")):
        folder = root / f"date={day}" / sub
        folder.mkdir(parents=True)
        log(100, seed=int(day[-2:])).to_parquet(folder / "part-0.parquet")
    (root / "date=2026-09-01" / "_SUCCESS").write_text("")
    (root / "date=2026-09-01" / "_temporary").mkdir()
    log(5).to_parquet(root / "date=2026-09-01" / "_temporary" / "part-9.parquet")
    return root


def test_a_glob_that_matches_partition_folders_finds_the_parquet_files_under_them(tmp_path):
    from pipelines.nightly import select_window
    from transforms.io import match_files

    root = partitions(tmp_path)
    relative = lambda paths: [os.path.relpath(p, root) for p in paths]  # noqa: E731
    assert relative(match_files(str(root / "date=2026-09-0*"))) == [
        "date=2026-09-01/part-0.parquet", "date=2026-09-02/hour=03/part-0.parquet"]
    assert len(match_files(str(root / "date=*"))) == 3 == len(match_files(str(root / "date=*/")))
    assert relative(match_files(str(root / "date=*" / "*.parquet"))) == [
        "date=2026-09-01/part-0.parquet", "date=2026-09-10/part-0.parquet"]  # a glob of files stays one
    files, dates, _ = select_window(str(root / "date=2026-09-0*"), "2026-09-02", 7)
    assert dates == ["2026-09-01", "2026-09-02"] and len(files) == 2


@pytest.mark.slow
def test_measure_reads_the_partitions_a_glob_names(tmp_path, capsys):
    from pipelines import measure as measure_pipeline

    root = partitions(tmp_path)
    ParameterVersion(params()).save(tmp_path / "p.json")
    assert measure_pipeline.run(["--input", str(root / "date=2026-09-0*"), "--params", str(tmp_path / "p.json"),
                                 "--output", str(tmp_path / "out"), "--simulation-seed", "1"]) == 0
    summary = json.loads((tmp_path / "out" / outputs.private_file(outputs.RUN_SUMMARY)).read_text())
    assert summary["rows_read"] == 200 and summary["input_files"] == 2


# ---- unknown options --------------------------------------------------------------------------------
def _example_argv(command):
    import shlex

    from pipelines.options import COMMANDS

    return shlex.split(COMMANDS[command].examples[0])[2:]


@pytest.mark.parametrize("command", ["measure", "optimize", "evaluate", "nightly", "synth", "fit-synthetic", "split",
                                     "load-criteo", "export-ara", "reconstruct", "demo"])
@pytest.mark.parametrize("typo", [["--overwite"], ["--max-slice", "5"], ["--runer", "DataflowRunner"], ["stray"]])
def test_an_unknown_or_misspelt_option_is_refused_before_anything_runs_on_every_command(command, typo, tmp_path, capsys,
                                                                                         monkeypatch):
    from pipelines.cli import main

    monkeypatch.chdir(tmp_path)  # the examples' relative outputs would land here, if anything ran
    assert main([command, *_example_argv(command), *typo]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unrecognized arguments" in err and typo[0] in err and "Traceback" not in err
    assert os.listdir(tmp_path) == []


def test_a_misspelt_option_gets_a_suggestion_and_beam_options_still_pass(capsys):
    from pipelines.options import parse

    argv = ["--input", "x", "--params", "p", "--output", "o"]
    with pytest.raises(SystemExit):
        parse("measure", argv + ["--max-slice", "5", "--overwite"])
    assert "did you mean: --max-slice -> --max-slices, --overwite -> --overwrite" in capsys.readouterr().err
    beam = ["--runner", "DirectRunner", "--direct_running_mode", "multi_processing", "--direct_num_workers=2",
            "--temp_location", "/tmp", "--project", "p", "--setup_file", "./setup.py"]
    args, rest = parse("measure", argv + beam)
    assert rest == beam and args.output == "o"


# ---- Ctrl-C ---------------------------------------------------------------------------------------
def test_ctrl_c_while_a_command_imports_its_modules_is_one_line(monkeypatch, capsys):
    import importlib

    from pipelines import cli

    def interrupted(name):
        raise KeyboardInterrupt

    monkeypatch.setattr(importlib, "import_module", interrupted)
    assert cli.main(["measure", "--input", "x", "--params", "p", "--output", "o"]) == 130
    assert capsys.readouterr().err == "araopt measure: interrupted\n"


def _wait_until_loaded(pid: int, library: str, timeout: float = 300.0) -> None:
    """Until the process ``pid`` has mapped a shared object whose path contains ``library`` (it is then
    importing the command's modules: nothing heavy is imported before `cli.main`'s guard)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/maps") as fh:
            if library in fh.read():
                return
        time.sleep(0.005)
    raise AssertionError(f"{library} never loaded in {pid}")


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc to see what the process loaded")
@pytest.mark.parametrize("library", ["_multiarray_umath", "coder_impl"])  # numpy (early), then Beam's coders
def test_ctrl_c_during_start_up_prints_one_line(library, tmp_path):
    """Ctrl-C while the command's modules import (the moment is read from the process's memory map, not a
    sleep, so a loaded machine cannot move it before the guard): one line and exit 130."""
    import signal
    import subprocess
    import sys

    write_log(tmp_path)
    ParameterVersion(params()).save(tmp_path / "p.json")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.Popen([sys.executable, "-m", "pipelines.cli", "measure", "--input", str(tmp_path / "log.parquet"),
                             "--params", str(tmp_path / "p.json"), "--output", str(tmp_path / "out"),
                             "--simulation-seed", "1"], cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        _wait_until_loaded(proc.pid, library)
    finally:
        proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    lines = [ln for ln in err.splitlines() if not ln.startswith("WARNING")]
    assert proc.returncode == 130 and lines == ["araopt measure: interrupted"], err[-2000:]


def test_each_footer_is_read_once_for_the_checks_the_partition_days_and_the_windows(tmp_path, monkeypatch):
    """``check_input`` keeps every file's footer (schema, rows, timestamp windows) on ``InputFiles``:
    the partition-day check and the impression-time window reuse it instead of opening the file again."""
    import transforms.io as tio
    from araopt.io.conversions import IMPRESSION_TIME
    from factories import LOG_DAY

    for k in range(2):
        frame = log(50, seed=k)
        frame["conversion_time"] = frame["conversion_time"] + pd.Timedelta(days=k)
        frame[IMPRESSION_TIME] = frame["conversion_time"] - pd.Timedelta(hours=1)
        day = (LOG_DAY + pd.Timedelta(days=k)).strftime("%Y-%m-%d")
        os.makedirs(tmp_path / f"date={day}")
        frame.to_parquet(tmp_path / f"date={day}" / "part-0.parquet")
    opened: list[str] = []
    real_open = tio.FileSystems.open
    monkeypatch.setattr(tio.FileSystems, "open", lambda path, *a, **k: opened.append(path) or real_open(path, *a, **k))
    inputs = tio.check_input(str(tmp_path), ["s"], ["v"])
    days, why = tio.release_days(inputs)
    impressions = tio.window_of(inputs.footers, IMPRESSION_TIME)
    assert sorted(opened) == sorted(inputs.paths) and len(inputs.paths) == 2  # one read per file
    assert why is None and days is not None and len(days) == 2
    assert inputs.rows == 100 and inputs.optional_columns == (IMPRESSION_TIME,)
    assert inputs.first_time_us is not None and inputs.last_time_us is not None
    assert impressions == (inputs.first_time_us - 3_600_000_000, inputs.last_time_us - 3_600_000_000)
