"""Beam plumbing of the jobs: runner selection, pipeline options, shuffle spill folders, remote paths."""
from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, SetupOptions, StandardOptions

LOCAL_RUNNERS = (None, "DirectRunner", "direct", "FnApiRunner")


def pipeline_options(beam_args: Sequence[str]) -> PipelineOptions:
    """Beam options from the leftover CLI arguments (``--runner``, ``--project``, ...).

    Locally (no ``--runner`` or DirectRunner) we default to ``direct_running_mode=in_memory``.
    """
    opts = PipelineOptions(list(beam_args))
    opts.view_as(SetupOptions).save_main_session = False
    direct = opts.view_as(DirectOptions)
    if opts.view_as(StandardOptions).runner in LOCAL_RUNNERS and "--direct_running_mode" not in " ".join(beam_args):
        direct.direct_running_mode = "in_memory"
    return opts


def make_runner(opts: PipelineOptions):
    """The runner to use. DirectRunner means the FnApiRunner, chosen explicitly so that runs are
    deterministic about their runner: Beam 2.77's DirectRunner would first try to download and start
    the Prism runner (impossible offline; it logs a failure on every run) and then fall back."""
    name = opts.view_as(StandardOptions).runner
    if name not in LOCAL_RUNNERS:
        return None  # let Beam resolve --runner (DataflowRunner, BundleBasedDirectRunner, ...)
    from apache_beam.portability.api import beam_provision_api_pb2
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.runners.portability.portable_runner import JobServiceHandle

    encoded = JobServiceHandle.encode_pipeline_options(opts.get_all_options())
    info = fn_runner.ExtendedProvisionInfo(beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded))
    return fn_runner.FnApiRunner(provision_info=info)


SHUFFLES = ("auto", "memory", "files")


def spill_dir(opts: PipelineOptions, shuffle: str = "auto") -> str | None:
    """Where GroupByImpression spills its shuffle (``transforms.group``), or None for an in-memory
    GroupByKey. ``auto``: files for the local runner (whose GroupByKey holds its whole input in
    memory), memory otherwise (Dataflow's shuffle service keeps data out of worker memory)."""
    if shuffle not in SHUFFLES:
        raise ValueError(f"--shuffle must be one of {SHUFFLES}, got {shuffle!r}")
    local = opts.view_as(StandardOptions).runner in LOCAL_RUNNERS
    if shuffle == "memory" or (shuffle == "auto" and not local):
        return None
    import tempfile
    import uuid

    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import GoogleCloudOptions

    root = opts.view_as(GoogleCloudOptions).temp_location or tempfile.gettempdir()
    path = FileSystems.join(root, f"{SPILL_PREFIX}{os.getpid()}-{uuid.uuid4().hex}")
    if not is_remote(root):
        for stale in sweep_leftovers(root, (SPILL_PREFIX,)):
            logging.getLogger(__name__).warning("removed the shuffle spill of a killed run: %s", stale)
        os.makedirs(path, mode=0o700)
        os.chmod(path, 0o700)  # raw conversion rows: readable by this user only, whatever the umask
    return path


SPILL_PREFIX = "araopt-shuffle-"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_leftovers(parent: str, stems: tuple[str, ...]) -> list[str]:
    """Remove local folders ``parent/<stem><pid>-...`` whose process is gone (killed runs' leftovers).

    Returns what was removed. Object stores are left to the bucket's lifecycle rules.
    """
    import shutil

    removed: list[str] = []
    if is_remote(parent) or not os.path.isdir(parent):
        return removed
    for name in os.listdir(parent):
        for stem in stems:
            head = name[len(stem):].split("-", 1)[0] if name.startswith(stem) else ""
            if head.isdigit() and int(head) != os.getpid() and not _pid_alive(int(head)):
                path = os.path.join(parent, name)
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
                break
    return removed


def remove_dir(path: str | None) -> None:
    """Best-effort removal of a spill directory after the pipeline finished (or failed)."""
    if not path:
        return
    from apache_beam.io.filesystems import FileSystems

    try:
        if is_remote(path):  # object stores have no directories: delete every object under the prefix
            matched = [m.path for m in FileSystems.match([path.rstrip("/") + "/**"])[0].metadata_list]
            if matched:
                FileSystems.delete(matched)
        elif FileSystems.exists(path):
            FileSystems.delete([path])
    except Exception:  # noqa: BLE001 - leftover temporary files must not fail a finished job
        logging.getLogger(__name__).warning("could not remove temporary shuffle files under %s", path)


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
