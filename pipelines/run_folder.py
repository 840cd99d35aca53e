"""A run's output folder is whole or absent, and only one run commits it: staged, sealed with
manifests, then moved into place under an exclusive lock with the overwrite rule checked again. The
contract, lock, overwrite rule, sweep and move are those of every output folder (``araopt.io.folders``);
a run folder adds its two manifests, the failed run's private files and Cloud Storage.

Locally the run takes an exclusive ``flock`` on ``.<name>.araopt-lock`` beside the target for its
whole life (:meth:`RunFolder.prepare`), so a second run into the same ``--output`` fails at once in
one line, naming the first. The pipeline writes into ``OUT.araopt-staging-<id>``; leftovers of killed
runs (staging and replaced folders) are swept by the next holder of the lock (a killed run's lock is
released by the kernel). :meth:`RunFolder.commit` checks the target again (``--overwrite`` or an
absent target), runs the caller's commit step (the release ledger records the release there), writes
``private/run_manifest.json`` and then the release manifest (``release/MANIFEST.json``) last, and moves
the folder into place with two ``rename``s (the old run, if ``--overwrite``, is renamed away first and
deleted after), so a reader sees the old run, no run, or the new run, never a mix. A symlinked
output is resolved: the folder it names is replaced.

On gs:// (no ``flock``, no atomic rename) the commit holds a lease object ``OUT.araopt-lock``
(create-only, with an expiry: ``araopt.io.locks.GcsLease``); the old release manifest is deleted first
and the new one is created last with ``if_generation_match=0``: a folder without it is incomplete.
"""
from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from apache_beam.io.filesystems import FileSystems

from araopt.errors import OutputRefused
from araopt.io import jsonio, outputs
from araopt.io.folders import (
    LOCK_TAG,
    REPLACED_TAG,
    STAGING_TAG,
    FolderKind,
    check_target,
    lock_target,
    move_into_place,
    new_staging,
    overwrite_rule,
    remove_local,
    sweep_leftovers,
)
from araopt.io.locks import FileLock, GcsLease, LockHeld, describe_owner, split_gs

from .options import UserError
from .runner import is_remote

__all__ = ["FAILED_TAG", "REPLACED_TAG", "ROW_IDS", "RUN_FOLDER", "STAGING_TAG", "RunFolder", "wait_for_manifest"]
FAILED_TAG = ".araopt-failed-"
RUN_FOLDER = FolderKind("run folder", "a run", outputs.RUN_MARKERS)
"""The overwrite rule's markers of a run folder: a release or simulation manifest, or the run summary."""
WORK_DIR = ".araopt-work"
"""Inside the staging folder: files the job leaves for the driver (the released rows' ids); never committed."""
ROW_IDS = f"{WORK_DIR}/row_ids"
_LOG = logging.getLogger(__name__)


def _check_target(target: str, overwrite: bool, at_commit: bool = False) -> None:
    """The overwrite rule of every output folder (``araopt.io.folders``), locally or on gs://."""
    if not target.startswith("gs://"):
        check_target(target, overwrite, RUN_FOLDER, at_commit)
        return
    names = set(_Gcs(target).names())
    overwrite_rule(target, not names, any(marker in names for marker in RUN_FOLDER.markers), overwrite, RUN_FOLDER,
                   at_commit)


@dataclass(frozen=True)
class RunFolder:
    """The target folder of a run, the staging folder the pipeline writes into, and (locally) the
    target's lock, held from :meth:`prepare` until :meth:`commit`, :meth:`fail` or :meth:`abandon`."""

    target: str
    staging: str
    overwrite: bool
    lock: FileLock | None = field(default=None, repr=False, compare=False)

    @classmethod
    def prepare(cls, target: str, overwrite: bool, what: str = "araopt measure") -> RunFolder:
        """Lock the target (locally), refuse an existing run without ``overwrite`` (and anything that is
        not a run folder even with it), sweep leftovers of killed runs, create an empty staging folder."""
        target = target.rstrip("/")
        if not target:
            raise UserError("--output is empty")
        if is_remote(target):
            if not target.startswith("gs://"):
                raise UserError(f"--output {target}: a run folder is a local path or gs://BUCKET/PATH")
            _check_target(target, overwrite)
            return cls(target, new_staging(target), overwrite)
        target = os.path.realpath(os.path.abspath(target))  # a symlinked output is the folder it names
        os.makedirs(os.path.dirname(target), exist_ok=True)
        lock = lock_target(target, what)
        try:
            _check_target(target, overwrite)
            sweep_leftovers(target)  # nobody else holds the lock: these are dead runs' leftovers
            staging = new_staging(target)
            os.makedirs(staging)
            os.makedirs(os.path.join(staging, outputs.PRIVATE_DIR), mode=0o700)
        except BaseException:
            lock.release()
            raise
        return cls(target, staging, overwrite, lock)

    def path(self, relative: str) -> str:
        """Where the pipeline writes ``relative`` (a path from ``araopt.io.outputs``)."""
        return FileSystems.join(self.staging, *relative.split("/"))

    def write(self, relative: str, data: bytes) -> None:
        if self.staging.startswith("gs://"):
            _Gcs(self.staging).put(relative, data)
            return
        with FileSystems.create(self.path(relative)) as fh:
            fh.write(data)

    def read(self, relative: str) -> bytes:
        if self.staging.startswith("gs://"):
            return _Gcs(self.staging).read(relative)
        with FileSystems.open(self.path(relative)) as fh:
            return bytes(fh.read())

    def read_all(self, relative_dir: str) -> list[bytes]:
        """The contents of every file under ``relative_dir`` of the staging folder."""
        prefix = relative_dir.rstrip("/") + "/"
        if self.staging.startswith("gs://"):
            from concurrent.futures import ThreadPoolExecutor

            gcs = _Gcs(self.staging)
            with ThreadPoolExecutor(max_workers=8) as pool:  # one small object per batch: fetch several at once
                return list(pool.map(gcs.read, [n for n in gcs.names() if n.startswith(prefix)]))
        directory = os.path.join(self.staging, *prefix.split("/"))
        if not os.path.isdir(directory):
            return []
        return [self.read(prefix + name) for name in sorted(os.listdir(directory))]

    def _files(self) -> list[str]:
        """Every file under the staging folder, relative, '/'-separated (Beam temp folders and the
        driver's work folder excluded)."""
        if is_remote(self.staging):
            rel = _Gcs(self.staging).names()
        else:
            rel = []
            for root, _, files in os.walk(self.staging):
                for f in files:
                    rel.append(os.path.relpath(os.path.join(root, f), self.staging).replace(os.sep, "/"))
        return sorted(r for r in rel if not r.split("/", 1)[0].startswith(("beam-temp", WORK_DIR)))

    def commit(self, simulation: bool, public: dict[str, Any], private: dict[str, Any] | None = None,
               before_move: Callable[[], Callable[[], None] | None] | None = None) -> dict[str, Any]:
        """Exclusively: check the target again, call ``before_move()`` (e.g. record the release in the
        ledger; it returns an undo called if the commit then fails), write ``private/run_manifest.json``
        (``private``: input facts) and the release manifest (``public``: public facts) last, and move the
        folder into place. Returns the release manifest."""
        lease = self._lease() if is_remote(self.target) else None
        try:
            _check_target(self.target, self.overwrite, at_commit=True)
            undo = before_move() if before_move is not None else None
            try:
                manifest = self._seal(simulation, public, private or {})
                if is_remote(self.target):
                    self._move_remote(simulation)
                else:
                    move_into_place(self.staging, self.target)
            except BaseException:
                if undo is not None:
                    undo()
                raise
        finally:
            if lease is not None:
                lease.release()
        self._release()  # on failure the caller's fail() or abandon() releases it, after cleaning up
        return manifest

    def _lease(self) -> GcsLease:
        from araopt.io.gcs_store import make_gcs_client

        try:
            return GcsLease.acquire(make_gcs_client(), self.target + LOCK_TAG, f"araopt commit of {self.target}")
        except LockHeld as held:
            raise OutputRefused(f"{self.target} is being committed by another run: {describe_owner(held.owner)}; "
                            f"nothing was released") from None

    def _seal(self, simulation: bool, public: dict[str, Any], private: dict[str, Any]) -> dict[str, Any]:
        """Drop the work folder, hash every file, write the private then the release manifest."""
        self._remove_work()
        release_prefix = outputs.release_dir(simulation) + "/"
        manifest_path = outputs.manifest_file(simulation)
        entries = []
        for rel in self._files():
            if rel in (manifest_path, outputs.private_file(outputs.RUN_MANIFEST)):
                continue
            data = self.read(rel)
            entries.append(outputs.ManifestEntry(rel, outputs.sha256_hex(data), len(data)))
        manifest = outputs.release_manifest([e for e in entries if e.path.startswith(release_prefix)], simulation, public)
        manifest_bytes = (jsonio.dumps(manifest, indent=1) + "\n").encode()
        run_manifest = outputs.run_manifest([e for e in entries if not e.path.startswith(release_prefix)],
                                            outputs.sha256_hex(manifest_bytes), private)
        self.write(outputs.private_file(outputs.RUN_MANIFEST), (jsonio.dumps(run_manifest, indent=1) + "\n").encode())
        self.write(manifest_path, manifest_bytes)
        return manifest

    def _remove_work(self) -> None:
        if is_remote(self.staging):
            gcs = _Gcs(self.staging)
            gcs.delete([n for n in gcs.names() if n.startswith(WORK_DIR + "/")])
        else:
            remove_local(os.path.join(self.staging, WORK_DIR))

    def _move_remote(self, simulation: bool) -> None:
        """Old manifests first (the old run now reads as incomplete), old files, new files, and the new
        release manifest last, created only if absent."""
        target, staging = _Gcs(self.target), _Gcs(self.staging)
        manifest = outputs.manifest_file(simulation)
        old = target.names()
        target.delete([m for m in (outputs.manifest_file(False), outputs.manifest_file(True), outputs.LEGACY_MANIFEST)
                       if m in old])
        target.delete([n for n in target.names()])
        names = [n for n in self._files() if n != manifest]
        for name in names:
            staging.copy(name, target, name)
        if not target.create(manifest, staging.read(manifest)):
            raise OutputRefused(f"{self.target}/{manifest} was created by another run during this commit; nothing was "
                            f"released by this run")
        staging.delete(staging.names())

    def fail(self) -> str | None:
        """A failed run: drop everything but the operator-private files; keep those (the dead letter
        explains most failures) in ``OUT.araopt-failed-<id>`` if there are any; return that path."""
        try:
            if is_remote(self.staging) or not os.path.isdir(self.staging):
                self.abandon()
                return None
            for name in os.listdir(self.staging):
                if name != outputs.PRIVATE_DIR:
                    remove_local(os.path.join(self.staging, name))
            private = os.path.join(self.staging, outputs.PRIVATE_DIR)
            if not any(files for _, _, files in os.walk(private)):
                self.abandon()
                return None
            kept = f"{self.target}{FAILED_TAG}{uuid.uuid4().hex[:12]}"
            os.rename(self.staging, kept)
            return kept
        finally:
            self._release()

    def abandon(self) -> None:
        """Remove the staging folder (a failed run leaves nothing behind) and release the lock."""
        try:
            if is_remote(self.staging):
                gcs = _Gcs(self.staging)
                gcs.delete(gcs.names())
            else:
                remove_local(self.staging)
        except Exception:  # noqa: BLE001 - cleanup must not hide the run's own error
            _LOG.warning("could not remove the staging folder %s", self.staging)
        finally:
            self._release()

    def _release(self) -> None:
        if self.lock is not None:
            self.lock.release()


class _Gcs:
    """The objects under one gs:// prefix, through the storage client (preconditions, one object at a time)."""

    def __init__(self, uri: str) -> None:
        from araopt.io.gcs_store import make_gcs_client

        self.uri = uri.rstrip("/")
        bucket, prefix = split_gs(self.uri + "/x")
        self._prefix = prefix[:-1]
        self._client = make_gcs_client()
        self._bucket = self._client.bucket(bucket)

    def names(self) -> list[str]:
        return sorted(b.name[len(self._prefix):] for b in self._client.list_blobs(self._bucket, prefix=self._prefix))

    def read(self, name: str) -> bytes:
        return bytes(self._bucket.blob(self._prefix + name).download_as_bytes())

    def put(self, name: str, data: bytes) -> None:
        self._bucket.blob(self._prefix + name).upload_from_string(data)

    def create(self, name: str, data: bytes) -> bool:
        from google.api_core import exceptions as api

        try:
            self._bucket.blob(self._prefix + name).upload_from_string(data, if_generation_match=0)
        except api.PreconditionFailed:
            return False
        return True

    def copy(self, name: str, other: _Gcs, other_name: str) -> None:
        self._bucket.copy_blob(self._bucket.blob(self._prefix + name), other._bucket, other._prefix + other_name)

    def delete(self, names: list[str]) -> None:
        from google.api_core import exceptions as api

        for name in names:
            try:
                self._bucket.blob(self._prefix + name).delete()
            except api.NotFound:
                pass


def wait_for_manifest(path: str, timeout: float = 0.0) -> dict[str, Any]:
    """Read a run folder's release manifest (release or simulation folder); a folder without one is
    incomplete (refused)."""
    deadline = time.monotonic() + timeout
    candidates = [FileSystems.join(path, *outputs.manifest_file(sim).split("/")) for sim in (False, True)]
    while True:
        for manifest_path in candidates:
            if FileSystems.exists(manifest_path):
                with FileSystems.open(manifest_path) as fh:
                    return dict(jsonio.loads(fh.read(), manifest_path))
        if time.monotonic() >= deadline:
            raise UserError(f"{path} has no {outputs.manifest_file(False)}: the run is incomplete (killed or still running)")
        time.sleep(0.2)
