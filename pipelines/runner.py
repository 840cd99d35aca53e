"""Beam plumbing of the jobs: runner selection, pipeline options, running a job (and Beam's
``--dry_run``), a job's shuffle spill folder under its temp location (``araopt.io.spill``), remote paths."""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from apache_beam.options.pipeline_options import (
    DebugOptions,
    DirectOptions,
    PipelineOptions,
    SetupOptions,
    StandardOptions,
    TestOptions,
    WorkerOptions,
)

from araopt.errors import InvalidParameters
from araopt.io.spill import SpillFolder
from araopt.io.spill import spill_folder as make_spill_folder

LOCAL_RUNNERS = (None, "DirectRunner", "direct", "FnApiRunner")


def pipeline_options(beam_args: Sequence[str]) -> PipelineOptions:
    """Beam options from the leftover CLI arguments (``--runner``, ``--project``, ...).

    Locally (no ``--runner`` or DirectRunner) we default to ``direct_running_mode=in_memory``.
    """
    opts = PipelineOptions(list(beam_args))
    opts.view_as(SetupOptions).save_main_session = False
    if is_dry_run(opts) and is_local_runner(opts):
        raise InvalidParameters("--dry_run translates a job for a remote runner without running it: it needs --runner "
                                "DataflowRunner (the local runner would run the job)")
    direct = opts.view_as(DirectOptions)
    if opts.view_as(StandardOptions).runner in LOCAL_RUNNERS and "--direct_running_mode" not in " ".join(beam_args):
        direct.direct_running_mode = "in_memory"
    return opts


def measure_job(args: Any, beam_args: Sequence[str]) -> tuple[PipelineOptions, Any]:
    """``measure``'s job, for either API: its shared option checks (rejected share, shards, a writable
    output), then the pipeline; Beam checks its options when the pipeline is made, before any work."""
    import apache_beam as beam

    if not 0.0 <= args.max_rejected_fraction <= 1.0:
        raise InvalidParameters(f"--max-rejected-fraction must lie in [0, 1], got {args.max_rejected_fraction}")
    if args.num_shards is not None and args.num_shards < 1:
        raise InvalidParameters(f"--num-shards must be >= 1, got {args.num_shards}")
    opts = pipeline_options(beam_args)
    check_workers_can_write(opts, args.output, "--output")
    return opts, beam.Pipeline(runner=make_runner(opts), options=opts)


def is_local_runner(opts: PipelineOptions) -> bool:
    """A runner whose workers are this machine (ours or one of Beam's local runners), as opposed to
    one with remote workers (Dataflow)."""
    name = opts.view_as(StandardOptions).runner
    return name in LOCAL_RUNNERS or str(name).split(".")[-1] in StandardOptions.LOCAL_RUNNERS


def check_workers_can_write(opts: PipelineOptions, path: str, flag: str) -> None:
    """Refuse a local ``path`` that a remote runner's workers would write (it would land on their disks)."""
    if not is_local_runner(opts) and not is_remote(path):
        raise InvalidParameters(f"{flag} {path} is a local path, but the workers of {runner_name(opts)} write it: "
                                f"give a gs:// location")


def worker_writable(opts: PipelineOptions, path: str) -> str:
    """``path``, or for a local path on a remote runner the same name in a fresh folder under
    ``--temp_location`` (what the workers write must be where they can write and the operator can read)."""
    if is_local_runner(opts) or is_remote(path):
        return path
    import uuid

    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import GoogleCloudOptions

    temp = opts.view_as(GoogleCloudOptions).temp_location
    if not temp:
        raise InvalidParameters(f"{runner_name(opts)} workers cannot write the local path {path}: pass --temp_location gs://...")
    return FileSystems.join(temp, f"araopt-dead-letter-{uuid.uuid4().hex[:12]}", os.path.basename(path))


def make_runner(opts: PipelineOptions):
    """The runner to use. DirectRunner means the FnApiRunner, chosen explicitly so that runs are
    deterministic about their runner: Beam 2.77's DirectRunner would first try to download and start
    the Prism runner (impossible offline; it logs a failure on every run) and then fall back."""
    if opts.view_as(StandardOptions).runner not in LOCAL_RUNNERS:
        return None  # let Beam resolve --runner (DataflowRunner, BundleBasedDirectRunner, ...)
    from apache_beam.portability.api import beam_provision_api_pb2
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.runners.portability.portable_runner import JobServiceHandle

    encoded = JobServiceHandle.encode_pipeline_options(opts.get_all_options())
    info = fn_runner.ExtendedProvisionInfo(beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded))
    return fn_runner.FnApiRunner(provision_info=info)


def is_dry_run(opts: PipelineOptions) -> bool:
    """Beam's ``--dry_run``, read as Beam's runner reads it (any value but none is true): translate
    the job, run nothing."""
    value = opts.view_as(TestOptions).dry_run
    if isinstance(value, str) and value.strip().lower() in ("false", "0", "no", ""):
        raise InvalidParameters(f"--dry_run {value}: Beam reads any value as true; leave --dry_run out for a real run")
    return bool(value)


@dataclass(frozen=True)
class TranslatedJob:
    """A job translated for its runner but not run (``--dry_run``): its description and size."""

    name: str
    steps: int  # primitive transforms of the translated pipeline
    job_file: str | None  # the job description (Beam's --dataflow_job_file), None when not asked for
    pipeline_file: str | None  # the portable pipeline the description points to (what a real run stages)


def run_pipeline(pipeline: Any, opts: PipelineOptions, name: str = "job", file_suffix: str = "") -> TranslatedJob | None:
    """Run ``pipeline`` to completion and return None; or, on a dry run, where the runner only
    translates it, write the job description where ``--dataflow_job_file`` says (``file_suffix`` for a
    command's second and later jobs) and return it: nothing ran, so the caller skips whatever would
    read the job's outputs."""
    result = pipeline.run()
    if not is_dry_run(opts):
        result.wait_until_finish()
        return None
    return write_translated_job(result, opts, name, file_suffix)


def job_file_path(opts: PipelineOptions, suffix: str = "") -> str | None:
    """``--dataflow_job_file`` (F), or ``F-<suffix>.<ext>`` beside it for a command's other jobs."""
    path = opts.view_as(DebugOptions).dataflow_job_file
    if not path or not suffix:
        return path
    stem, ext = os.path.splitext(path)
    return f"{stem}-{suffix}{ext}"


def write_translated_job(result: Any, opts: PipelineOptions, name: str = "job", file_suffix: str = "") -> TranslatedJob:
    """The Dataflow job description of a dry run. Beam's runner returns the job on a dry run without
    creating its description (that step also stages files); this builds the same description without
    staging anything: the Dataflow environment (workers, SDK options, the packages a real run would
    stage) and ``pipelineUrl``/``pipelineProtoHash`` of the portable pipeline, which is written beside
    the description (``<job file>.pipeline.pb``, the bytes a real run stages as ``pipeline.pb``)."""
    import hashlib

    from apache_beam.io.filesystems import FileSystems
    from apache_beam.portability import common_urns
    from apache_beam.portability.api import beam_runner_api_pb2
    from apache_beam.runners.dataflow.internal import apiclient
    from apache_beam.runners.internal import names

    translated = getattr(result, "job", None)
    if translated is None or not hasattr(translated, "proto_pipeline"):
        raise InvalidParameters(f"--dry_run: the runner {runner_name(opts)} returned no translated job")
    proto = translated.proto_pipeline
    options = translated.options
    overrides = options.view_as(WorkerOptions).sdk_harness_container_image_overrides or ()
    apiclient.DataflowApplicationClient._apply_sdk_environment_overrides(  # what job creation does first
        proto, dict(o.split(",", 1) for o in overrides), options)
    packages: list[str] = []
    for _, env in sorted(proto.components.environments.items()):
        for dep in env.dependencies:
            if dep.role_urn == common_urns.artifact_roles.STAGING_TO.urn:
                staged = beam_runner_api_pb2.ArtifactStagingToRolePayload.FromString(dep.role_payload).staged_name
                if staged not in packages:
                    packages.append(staged)
    serialized = proto.SerializeToString()
    staging = translated.google_cloud_options.staging_location
    translated.proto.environment = apiclient.Environment(
        packages=packages, options=options, environment_version=apiclient._FNAPI_ENVIRONMENT_MAJOR_VERSION,
        proto_pipeline_staged_url=FileSystems.join(staging, names.STAGED_PIPELINE_FILENAME), proto_pipeline=proto,
        pipeline_proto_hash=hashlib.sha256(serialized).hexdigest()).proto
    steps = sum(1 for t in proto.components.transforms.values() if not t.subtransforms)
    job_file = job_file_path(opts, file_suffix)
    pipeline_file = None
    if job_file:
        pipeline_file = job_file + ".pipeline.pb"
        for path, data in ((pipeline_file, serialized), (job_file, translated.json().encode())):
            with FileSystems.create(path) as fh:
                fh.write(data)
    return TranslatedJob(name, steps, job_file, pipeline_file)


def dry_run_sentence(prog: str, jobs: Sequence[TranslatedJob]) -> str:
    """The one sentence a dry run ends with."""
    parts = [f"{j.name + ': ' if len(jobs) > 1 else ''}{j.steps} steps, "
             + (f"job description in {j.job_file}" if j.job_file else "no --dataflow_job_file given")
             for j in jobs]
    kind = "a Dataflow job" if len(jobs) == 1 else f"{len(jobs)} Dataflow jobs"
    return (f"{prog}: dry run: translated to {kind} ({'; '.join(parts)}) and ran nothing, so nothing else was "
            f"written, published or recorded")


def spill_folder(opts: PipelineOptions, shuffle: str = "auto") -> SpillFolder:
    """The shuffle spill folder of a job (``araopt.io.spill``) under its ``--temp_location``, for its runner."""
    from apache_beam.options.pipeline_options import GoogleCloudOptions

    return make_spill_folder(opts.view_as(GoogleCloudOptions).temp_location, is_local_runner(opts), shuffle)


def runner_name(opts: PipelineOptions) -> str:
    name = opts.view_as(StandardOptions).runner
    if name in LOCAL_RUNNERS:
        return f"DirectRunner (FnApiRunner, {opts.view_as(DirectOptions).direct_running_mode})"
    return str(name)


def is_remote(uri: str) -> bool:
    return "://" in str(uri) and not str(uri).startswith("file://")


def localize(uri: str, workdir: str) -> str:
    """A remote file, directory or glob (gs://...) copied into ``workdir`` through Beam's FileSystems;
    returns a local path (a directory for several files). Local paths are returned unchanged."""
    if not is_remote(uri):
        return uri
    import os

    from apache_beam.io.filesystems import FileSystems

    patterns = [uri]
    if not any(ch in uri for ch in "*?[") and not FileSystems.exists(uri):
        raise FileNotFoundError(f"no such file or prefix: {uri}")
    if not any(ch in uri for ch in "*?[") and not uri.rstrip("/").rsplit("/", 1)[-1].count("."):
        patterns = [uri.rstrip("/") + "/**"]  # a prefix ("directory")
    matched = [m.path for p in patterns for m in FileSystems.match([p])[0].metadata_list]
    if not matched:
        raise FileNotFoundError(f"nothing matches {uri}")
    target = os.path.join(workdir, uri.replace("://", "_").replace("/", "_").replace("*", "x"))
    os.makedirs(target, exist_ok=True)
    for path in matched:
        local = os.path.join(target, path.replace("://", "_").replace("/", "_"))
        with FileSystems.open(path) as src, open(local, "wb") as dst:
            dst.write(src.read())
    return target if len(matched) > 1 or patterns[0] != uri else os.path.join(target, os.listdir(target)[0])
