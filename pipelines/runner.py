"""Beam plumbing of the jobs: runner selection, pipeline options, shuffle spill folders, remote paths."""
from __future__ import annotations

import logging
from collections.abc import Sequence

from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, SetupOptions, StandardOptions

from araopt.locks import LockedDir, sweep_unlocked

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
SPILL_PREFIX = "araopt-shuffle-"


class SpillFolder:
    """Where GroupByImpression spills its shuffle (``transforms.group``): ``path``, or None for an
    in-memory GroupByKey; :meth:`remove` when the job ends or fails (also a context manager)."""

    def __init__(self, path: str | None, locked: LockedDir | None = None) -> None:
        self.path = path
        self._locked = locked

    def remove(self) -> None:
        if self._locked is not None:
            self._locked.remove()
        else:
            remove_dir(self.path)

    def __enter__(self) -> str | None:
        return self.path

    def __exit__(self, *exc: object) -> None:
        self.remove()


def spill_folder(opts: PipelineOptions, shuffle: str = "auto") -> SpillFolder:
    """The shuffle spill folder of a job. ``auto``: files for the local runner (whose GroupByKey holds
    its whole input in memory), memory otherwise (Dataflow's shuffle service keeps data out of worker
    memory).

    A local spill folder is created ``0700`` (raw conversion rows) with a lock held until it is removed
    (``araopt.locks.LockedDir``); spill folders under the same temp location whose lock nobody holds
    are killed runs' leftovers and are removed first, whatever host or PID namespace their run was in."""
    if shuffle not in SHUFFLES:
        raise ValueError(f"--shuffle must be one of {SHUFFLES}, got {shuffle!r}")
    local = opts.view_as(StandardOptions).runner in LOCAL_RUNNERS
    if shuffle == "memory" or (shuffle == "auto" and not local):
        return SpillFolder(None)
    import tempfile
    import uuid

    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import GoogleCloudOptions

    root = opts.view_as(GoogleCloudOptions).temp_location or tempfile.gettempdir()
    if is_remote(root):  # object stores: a killed run's spill is left to the bucket's lifecycle rules
        return SpillFolder(FileSystems.join(root, f"{SPILL_PREFIX}{uuid.uuid4().hex}"))
    for stale in sweep_unlocked(root, SPILL_PREFIX):
        logging.getLogger(__name__).warning("removed the shuffle spill of a killed run: %s", stale)
    locked = LockedDir.create(root, SPILL_PREFIX, "araopt shuffle spill", mode=0o700)
    return SpillFolder(locked.path, locked)


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
