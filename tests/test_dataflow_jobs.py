"""Every Beam job translates to a Dataflow job, offline: Beam's own flags (``--runner DataflowRunner
--dry_run True --project --region --temp_location --staging_location --setup_file
--dataflow_job_file``), inputs on gs:// in the GCS emulator. Each job's translated graph must have
the steps the design relies on (the shuffle by impression, the integer combine, the single release
step after it, the statistics combines) and no step that holds the whole input in one worker (a
GroupByKey of row data on anything but the impression shard, a side input made of row data), and
what its workers write must be on gs://. Prints each job's step count and the asserted steps."""
from __future__ import annotations

import os

import pytest

from araopt.version import ParameterVersion
from dataflow_graph import GROUP_BY_KEY, JobGraph
from factories import make_frame, make_params, write_history, write_parts
from gcs_fixtures import start_gcp_storage_emulator
from pipelines import measure, nightly, optimize

pytestmark = pytest.mark.slow  # translates five jobs (each builds the sdist of --setup_file): `make test` runs it

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    """The GCS emulator with the inputs on gs://: a log (measure, optimize), date partitions
    (nightly), a parameter file and a declared domain; STORAGE_EMULATOR_HOST set for the module."""
    local = tmp_path_factory.mktemp("inputs")
    with start_gcp_storage_emulator() as emulator, pytest.MonkeyPatch.context() as mp:
        mp.setenv("STORAGE_EMULATOR_HOST", emulator.url)
        mp.setenv("NO_GCE_CHECK", "True")
        bucket = emulator.client().bucket(emulator.bucket)
        write_parts(make_frame(1500), local / "log", 2)
        write_history(local / "hist", n=400)
        ParameterVersion(make_params()).save(local / "params.json")
        for root, _, names in os.walk(local):
            for name in names:
                path = os.path.join(root, name)
                bucket.blob(os.path.relpath(path, local)).upload_from_filename(path)
        bucket.blob("domain.csv").upload_from_string(
            "campaign,geo\n" + "".join(f"{c},{g}\n" for c in range(5) for g in ("NY", "BOS", "SF")))
        yield emulator


def dataflow_flags(gs: str, job_file) -> list[str]:
    return ["--runner", "DataflowRunner", "--dry_run", "True", "--project", "araopt-test", "--region", "us-central1",
            "--temp_location", f"{gs}/tmp", "--staging_location", f"{gs}/staging",
            "--setup_file", os.path.join(ROOT, "setup.py"), "--dataflow_job_file", str(job_file)]


def translate(run, args, job_file, capsys) -> str:
    """Run a command as a dry run; returns its last line (the dry-run sentence)."""
    assert run(args) == 0, capsys.readouterr().err
    out = capsys.readouterr().out.strip().splitlines()
    assert out and "dry run" in out[-1] and str(job_file) in out[-1], out
    return out[-1]


def check_job(job_file, gs: str) -> JobGraph:
    """The description is a batch Dataflow job pointing at the pipeline written beside it; nothing in
    the graph holds the whole input in one worker; what the workers write is on gs://."""
    graph = JobGraph(str(job_file))
    env = graph.job["environment"]
    options = env["sdkPipelineOptions"]["options"]
    assert graph.job["type"] == "JOB_TYPE_BATCH" and graph.job["name"] == options["job_name"]
    assert options["region"] == "us-central1"
    assert options["pipelineProtoHash"] == graph.pipeline_sha256
    assert options["pipelineUrl"].startswith(f"{gs}/staging/") and options["project"] == "araopt-test"
    assert "workflow.tar.gz" in {p["name"] for p in env["workerPools"][0]["packages"]}  # --setup_file's sdist
    shuffles = graph.row_data_groupings()
    assert [graph.producer[s.main_inputs[0]].fn_type for s in shuffles] == ["_KeyByShard"], [s.name for s in shuffles]
    assert graph.row_data_side_inputs() == []
    assert all(p.startswith(f"{gs}/") for p in graph.sink_paths()), graph.sink_paths()
    return graph


def report(capsys, line: str) -> None:
    with capsys.disabled():
        print("\n" + line)


def combine_after_shuffle(graph: JobGraph, fn_type: str) -> str:
    """The one combine with ``fn_type``, fed (through per-shard steps only) by the impression shuffle."""
    (combine,) = graph.combines(fn_type)
    shuffle = graph.row_data_groupings()[0]
    between = graph.path(shuffle, combine)
    assert between, f"{combine.combine} is not fed by {shuffle.name}"
    assert [s.name for s in between if s.urn == GROUP_BY_KEY] == [shuffle.name, combine.name]
    return f"{combine.combine} ({fn_type})"


def shuffle_text(graph: JobGraph) -> str:
    shuffle = graph.row_data_groupings()[0]
    return f"shuffle by impression {shuffle.name} (GroupByKey after {graph.producer[shuffle.main_inputs[0]].name})"


def test_measure_translates_to_dataflow_job_with_one_release_after_the_integer_combine(gcs, tmp_path, capsys):
    gs = f"gs://{gcs.bucket}"
    job_file = tmp_path / "measure.json"
    line = translate(measure.run, ["--input", f"{gs}/log/*.parquet", "--params", f"{gs}/params.json", "--output",
                                   f"{gs}/out", "--domain", f"{gs}/domain.csv", "--debug-run",
                                   *dataflow_flags(gs, job_file)], job_file, capsys)
    graph = check_job(job_file, gs)
    combine = combine_after_shuffle(graph, "DomainSumsCombiner")
    release = graph.one(fn_type="_AddNoise")  # noise once per key: exactly one release step ...
    (sums,) = graph.combines("DomainSumsCombiner")
    after = graph.path(sums, release, through_side_inputs=True)  # ... fed by the integer combine, nothing grouped after
    assert after and [s.name for s in after if s.urn == GROUP_BY_KEY] == [sums.name]
    written = {p.rsplit("/", 2)[-2] + "/" + p.rsplit("/", 1)[-1] for p in graph.sink_paths()}
    assert written == {"release/summary_report", "release/output_domain", "debug/summary_report", "dead_letter/rejected"}
    names = {b.name for b in gcs.client().bucket(gcs.bucket).list_blobs()}
    assert not [n for n in names if n.startswith(("out", "tmp/", "staging/"))], names  # nothing ran, nothing staged
    report(capsys, f"measure: {graph.summary()}; {shuffle_text(graph)}; integer combine {combine}; release step "
                   f"{release.name} (_AddNoise, the only one, after the combine)\n  {line}")


def test_optimize_translates_to_one_job_with_one_read_and_one_shuffle(gcs, tmp_path, capsys):
    """Statistics, the optimization and the candidates' calibration from one read and one shuffle of the
    history (as nightly): both combines are fed by the one impression shuffle, the choice in between."""
    gs = f"gs://{gcs.bucket}"
    job_file = tmp_path / "optimize.json"
    line = translate(optimize.run, ["--history", f"{gs}/log", "--slices", "campaign,geo", "--values", "value,items",
                                    "--epsilon", "4", "--output", str(tmp_path / "params.json"),
                                    *dataflow_flags(gs, job_file)], job_file, capsys)
    assert not (tmp_path / "params.json").exists()  # the optimizer had nothing to run on
    assert not (tmp_path / "optimize-calibration.json").exists()  # no second job
    graph = check_job(job_file, gs)
    assert len(graph.row_data_groupings()) == 1  # one shuffle of the history's rows
    assert [p.rsplit("/", 1)[-1] for p in graph.sink_paths()] == ["params.rejected"]  # under --temp_location
    statistics = combine_after_shuffle(graph, "StatisticsCombiner")
    calibration = combine_after_shuffle(graph, "CandidatesCombiner")
    (stats_combine,) = graph.combines("StatisticsCombiner")
    (cal_combine,) = graph.combines("CandidatesCombiner")
    assert stats_combine.id in {s.id for s in graph.upstream(cal_combine, through_side_inputs=True)}  # chosen on them
    report(capsys, f"optimize (one job): {graph.summary()}; {shuffle_text(graph)}; statistics combine {statistics}; "
                   f"calibration combine {calibration} (its candidates chosen on the statistics)\n  {line}")


def test_nightly_finds_gcs_partitions_and_translates_with_one_publish_step(gcs, tmp_path, capsys):
    gs = f"gs://{gcs.bucket}"
    job_file = tmp_path / "nightly.json"
    line = translate(nightly.run, ["--history", f"{gs}/hist", "--as-of", "2026-11-22", "--window-days", "3",
                                   "--store", f"{gs}/store", "--slices", "campaign,geo", "--values", "value",
                                   "--epsilon", "8", *dataflow_flags(gs, job_file)], job_file, capsys)
    graph = check_job(job_file, gs)
    statistics = combine_after_shuffle(graph, "StatisticsCombiner")
    calibration = combine_after_shuffle(graph, "CandidatesCombiner")
    publish = graph.one(fn_type="_CalibrateReportAndPublish")
    upstream = {s.id for s in graph.upstream(publish, through_side_inputs=True)}
    assert {c.id for c in graph.combines("StatisticsCombiner") + graph.combines("CandidatesCombiner")} <= upstream
    assert not [b.name for b in gcs.client().bucket(gcs.bucket).list_blobs() if b.name.startswith("store")]
    report(capsys, f"nightly: {graph.summary()}; {shuffle_text(graph)}; statistics combine {statistics}; calibration "
                   f"combine {calibration}; publish step {publish.name} (the only one, after both combines)\n  {line}")



def test_beam_validation_error_is_one_line_with_its_reason_before_any_work(gcs, tmp_path, capsys):
    """Beam's "Pipeline has validations errors:" keeps its reason (on its next line in Beam's message),
    and the run stops before anything is written."""
    gs = f"gs://{gcs.bucket}"
    flags = dataflow_flags(gs, tmp_path / "job.json")
    flags[flags.index("araopt-test")] = "Bad_Project!"
    assert measure.run(["--input", f"{gs}/log", "--params", f"{gs}/params.json", "--output", f"{gs}/bad",
                        "--domain", f"{gs}/domain.csv", *flags]) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("araopt measure: error: Pipeline has validations errors:")
    assert "Invalid Project ID" in lines[0] and "Bad_Project!" in lines[0]
    assert not [b.name for b in gcs.client().bucket(gcs.bucket).list_blobs() if b.name.startswith("bad")]
    assert not (tmp_path / "job.json").exists()
