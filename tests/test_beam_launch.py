"""Launching the Beam jobs: Beam's own options checked before any work, a dry run only for a runner
that has one, nothing written by remote workers to a local path, failures as one line with their
reason, and no staging folder left by a failed run. (The dry runs themselves, translated to Dataflow
jobs against the GCS emulator, and Beam's own validation errors, which reach for the temp bucket,
are in test_dataflow_jobs.py.)"""
from __future__ import annotations

import os

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from araopt.errors import ONE_LINE_MAX_CHARS, one_line
from araopt.version import ParameterVersion
from factories import make_frame, make_params, write_parts
from pipelines import measure as measure_pipeline
from pipelines.runner import (
    check_workers_can_write,
    is_dry_run,
    is_local_runner,
    job_file_path,
    pipeline_options,
    worker_writable,
)

DATAFLOW = ["--runner", "DataflowRunner", "--project", "araopt-test", "--region", "us-central1",
            "--temp_location", "gs://bucket/tmp"]


def measure_args(tmp_path, output, *extra):
    data = write_parts(make_frame(300), tmp_path / "in", 1)
    ParameterVersion(make_params()).save(tmp_path / "p.json")
    domain = tmp_path / "d.csv"
    domain.write_text("campaign,geo\n" + "".join(f"{c},{g}\n" for c in range(5) for g in ("NY", "BOS", "SF")))
    return ["--input", data, "--params", str(tmp_path / "p.json"), "--output", str(output), "--domain", str(domain),
            *extra]


def error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    return lines[0]


def leftovers(tmp_path, name="out"):
    return sorted(p for p in os.listdir(tmp_path) if p.startswith(name + ".araopt-"))


def test_one_line_keeps_the_reason_of_a_multi_line_error():
    beam_style = ValueError("Pipeline has validations errors: \nInvalid Project ID (Bad_Project!). Please make sure "
                            "you specified the Project ID, not project description.")
    assert one_line(beam_style) == ("Pipeline has validations errors: Invalid Project ID (Bad_Project!). Please make "
                                    "sure you specified the Project ID, not project description.")
    relayed = RuntimeError("Error received from SDK harness for instruction 4: Traceback (most recent call last):\n"
                           '  File "worker.py", line 3, in process\n    check(x)\n'
                           "ValueError: 81 of 500 input rows failed validation [while running 'NoisyRelease']")
    assert one_line(relayed) == ("Error received from SDK harness for instruction 4: ValueError: 81 of 500 input rows "
                                 "failed validation [while running 'NoisyRelease']")
    assert one_line(KeyError()) == "KeyError"
    assert len(one_line(ValueError("x" * 5000))) == ONE_LINE_MAX_CHARS


def test_remote_workers_never_write_a_local_path(tmp_path, capsys):
    assert measure_pipeline.run(measure_args(tmp_path, tmp_path / "out", *DATAFLOW, "--dry_run", "True")) == 2
    line = error_line(capsys.readouterr().err)
    assert "--output" in line and "local path" in line and "gs://" in line
    assert not leftovers(tmp_path)  # refused before a staging folder existed
    opts = pipeline_options(DATAFLOW)
    with pytest.raises(ValueError, match="local path"):
        check_workers_can_write(opts, "/tmp/out", "--output")
    check_workers_can_write(opts, "gs://bucket/out", "--output")
    check_workers_can_write(pipeline_options([]), "/tmp/out", "--output")  # the local runner's workers are here
    moved = worker_writable(opts, "/home/me/params.rejected")
    assert moved.startswith("gs://bucket/tmp/araopt-dead-letter-") and moved.endswith("/params.rejected")
    assert worker_writable(pipeline_options([]), "/home/me/params.rejected") == "/home/me/params.rejected"


def test_dry_run_needs_a_runner_that_translates(tmp_path, capsys):
    assert measure_pipeline.run(measure_args(tmp_path, tmp_path / "out", "--dry_run", "True")) == 2
    assert "--runner DataflowRunner" in error_line(capsys.readouterr().err)
    assert not leftovers(tmp_path)
    with pytest.raises(ValueError, match="reads any value as true"):
        is_dry_run(PipelineOptions(["--dry_run", "False"]))
    assert is_dry_run(PipelineOptions(["--dry_run", "True"])) and not is_dry_run(PipelineOptions([]))
    assert is_local_runner(PipelineOptions([])) and is_local_runner(PipelineOptions(["--runner", "DirectRunner"]))
    assert not is_local_runner(PipelineOptions(["--runner", "DataflowRunner"]))


def test_job_files_of_a_command_with_several_jobs_sit_beside_the_first():
    opts = PipelineOptions(["--dataflow_job_file", "gs://b/jobs/optimize.json"])
    assert job_file_path(opts) == "gs://b/jobs/optimize.json"
    assert job_file_path(opts, "calibration") == "gs://b/jobs/optimize-calibration.json"
    assert job_file_path(PipelineOptions([]), "calibration") is None


def test_a_run_failing_after_its_staging_folder_exists_leaves_none(tmp_path, capsys, monkeypatch):
    def broken(*args, **kwargs):
        raise ValueError("a transform could not be built:\nits reason")

    monkeypatch.setattr(measure_pipeline, "build_release", broken)
    assert measure_pipeline.run(measure_args(tmp_path, tmp_path / "out")) == 2
    assert "a transform could not be built: its reason" in error_line(capsys.readouterr().err)
    assert not leftovers(tmp_path) and not (tmp_path / "out").exists()
