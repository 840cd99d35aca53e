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

A commit that records a release cannot lose it or record it falsely, whenever it is killed: before the
ledger records anything, :meth:`RunFolder.mark_pending` writes ``OUT.araopt-pending-<staging id>.json``
(the ledger and the entry id the release will be recorded under); it is removed only once the folder is
in place or the entry is taken out again. The next holder of the output (locally: the next run's
lock, in :meth:`RunFolder.prepare`, before anything is swept; on gs://: the next commit's lease)
settles every pending record first (:func:`settle_pending`): if the target holds the sealed run that
names the entry, the release was published; else if the staging folder holds the complete sealed
release naming the entry (manifests written, every file matching its sha256), the release is finished
(moved into place: it is exactly what the killed run would have published); else nothing was
published and the entry is taken out of the ledger. A staging folder holding a complete release is
therefore never swept as garbage, and the input can be released again without ``--allow-rerelease``
whenever nothing of it was published.
"""
from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from apache_beam.io.filesystems import FileSystems

from araopt.errors import InvalidInput, InvalidParameters, OutputRefused, one_line
from araopt.io import jsonio, outputs
from araopt.io.files import atomic_write_bytes
from araopt.io.folders import (
    LOCK_TAG,
    PENDING_TAG,
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

from .runner import is_remote

__all__ = ["FAILED_TAG", "PENDING_TAG", "REPLACED_TAG", "ROW_IDS", "RUN_FOLDER", "STAGING_TAG", "RunFolder",
           "settle_pending", "wait_for_manifest"]
FAILED_TAG = ".araopt-failed-"
PENDING_FORMAT = "araopt-pending-release/1"
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
            raise InvalidParameters("--output is empty")
        if is_remote(target):
            if not target.startswith("gs://"):
                raise InvalidParameters(f"--output {target}: a run folder is a local path or gs://BUCKET/PATH")
            folder = cls(target, new_staging(target), overwrite)
            folder._settle_early()
            _check_target(target, overwrite)
            return folder
        target = os.path.realpath(os.path.abspath(target))  # a symlinked output is the folder it names
        os.makedirs(os.path.dirname(target), exist_ok=True)
        lock = lock_target(target, what)
        try:
            settle_pending(target)  # a killed commit's release is finished or taken back before anything is swept
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

    def release_digests(self, simulation: bool = False) -> dict[str, str]:
        """{path under the release folder: sha256} of the staged release files (what the release manifest
        will list): the release ledger records them, so a release folder can be checked against it."""
        prefix = outputs.release_dir(simulation) + "/"
        manifest = outputs.manifest_file(simulation)
        return {rel[len(prefix):]: outputs.sha256_hex(self.read(rel)) for rel in self._files()
                if rel.startswith(prefix) and rel != manifest}

    def commit(self, simulation: bool, public: dict[str, Any], private: dict[str, Any] | None = None,
               before_move: Callable[[], Callable[[], None] | None] | None = None) -> dict[str, Any]:
        """Exclusively: check the target again, call ``before_move()`` (e.g. record the release in the
        ledger; it returns an undo called if the commit then fails), write ``private/run_manifest.json``
        (``private``: input facts) and the release manifest (``public``: public facts) last, and move the
        folder into place. Returns the release manifest."""
        lease = self._lease() if is_remote(self.target) else None
        try:
            if lease is not None:
                settle_pending(self.target)  # on gs:// the lease is the output's lock: settle killed commits
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
            self.clear_pending()  # published: the ledger entry stands
        finally:
            if lease is not None:
                lease.release()
        self._release()  # on failure the caller's fail() or abandon() releases it, after cleaning up
        return manifest

    @property
    def pending_uri(self) -> str:
        """This commit's pending record, beside the target (see module doc)."""
        return f"{self.target}{PENDING_TAG}{self.staging.rsplit(STAGING_TAG, 1)[-1]}.json"

    def mark_pending(self, ledger_uri: str, entry_id: str) -> None:
        """Before the ledger records entry ``entry_id``: say so beside the target (written whole), so
        that whoever holds the output next finishes this release or takes the entry out again."""
        record = {"format": PENDING_FORMAT, "ledger": ledger_uri, "entry": entry_id, "staging": self.staging,
                  "target": self.target}
        _put(self.pending_uri, (jsonio.dumps(record, indent=1) + "\n").encode())

    def clear_pending(self) -> None:
        """The release is in place or its entry was taken out: the pending record goes."""
        try:
            _delete(self.pending_uri)
        except Exception as exc:  # noqa: BLE001 - the next holder of the output settles it
            _LOG.warning("could not remove %s (the next run into %s removes it): %s", self.pending_uri, self.target,
                         one_line(exc))

    def _settle_early(self) -> None:
        """On gs://, settle killed commits before the job runs if the commit lease is free (a held one:
        the commit settles them, under its lease)."""
        try:
            lease = self._lease()
        except OutputRefused:
            return
        try:
            settle_pending(self.target)
        finally:
            lease.release()

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


# ---- pending commits ------------------------------------------------------------------------------
@contextmanager
def failures_settled(folder: RunFolder, refusals: tuple[type[BaseException], ...] = ()) -> Iterator[RunFolder]:
    """Run a job into ``folder``: a refusal (``refusals``: nothing to debug) or an interrupt abandons it
    (nothing kept); any other failure keeps its operator-private files for debugging (``fail``) and is
    re-raised as one line saying that nothing was released and where they are."""
    try:
        yield folder
    except refusals:
        folder.abandon()
        raise
    except Exception as exc:
        kept = folder.fail()
        if kept is None:
            raise
        raise InvalidInput(f"{one_line(exc)} (nothing was released; the operator-private files of the failed "
                           f"run are in {kept})") from exc
    except BaseException:
        folder.abandon()
        raise


def _put(uri: str, data: bytes) -> None:
    if uri.startswith("gs://"):
        parent, name = uri.rsplit("/", 1)
        _Gcs(parent).put(name, data)
    else:
        atomic_write_bytes(uri, data)


def _delete(uri: str) -> None:
    if uri.startswith("gs://"):
        parent, name = uri.rsplit("/", 1)
        _Gcs(parent).delete([name])
    elif os.path.lexists(uri):
        os.unlink(uri)


def _pending_records(target: str) -> list[str]:
    """The pending records of commits into ``target`` (see module doc), oldest name first."""
    parent, name = target.rsplit("/", 1) if target.startswith("gs://") else os.path.split(target)
    prefix = name + PENDING_TAG
    if target.startswith("gs://"):
        return [f"{parent}/{n}" for n in _Gcs(parent).names(prefix) if n.endswith(".json") and "/" not in n]
    try:
        names = os.listdir(parent)
    except FileNotFoundError:
        return []
    return [os.path.join(parent, n) for n in sorted(names) if n.startswith(prefix) and n.endswith(".json")]


def _sealed_with(folder_uri: str, entry_id: str) -> bool:
    """Whether ``folder_uri`` holds a whole sealed release recorded as ledger entry ``entry_id``: its run
    manifest names the entry and the release manifest's sha256, and every release file matches."""
    folder = RunFolder(folder_uri, folder_uri, True)
    try:
        manifest_bytes = folder.read(outputs.manifest_file(False))
        run_manifest = jsonio.loads(folder.read(outputs.private_file(outputs.RUN_MANIFEST)), "run manifest")
        if run_manifest.get("ledger", {}).get("entry", {}).get("id") != entry_id:
            return False
        if run_manifest.get("release_manifest_sha256") != outputs.sha256_hex(manifest_bytes):
            return False
        release_prefix = outputs.release_dir(False) + "/"
        for f in jsonio.loads(manifest_bytes, "release manifest")["files"]:
            data = folder.read(release_prefix + f["path"])
            if outputs.sha256_hex(data) != f["sha256"] or len(data) != f["bytes"]:
                return False
    except Exception:  # noqa: BLE001 - anything missing, partial or unreadable: not a whole release
        return False
    return True


def settle_pending(target: str) -> list[tuple[str, str]]:
    """Settle the commits into ``target`` that were killed between recording their release in the ledger
    and removing their pending record; call with the output's lock (locally) or lease (gs://) held.
    Per record: ``published`` (the target holds it), ``finished`` (the staging folder held the whole
    sealed release: moved into place now) or ``rolled back`` (nothing was published: the ledger entry
    is taken out). Returns (entry id, outcome) pairs; an unreachable ledger refuses the run (nothing is
    swept: the pending record and its staging folder stay for a later run)."""
    from .ledger import Ledger

    settled = []
    for uri in _pending_records(target):
        try:
            record = jsonio.loads(_read(uri), uri)
            ledger_uri, entry_id, staging = record["ledger"], record["entry"], record["staging"]
        except Exception as exc:  # noqa: BLE001 - written whole before anything was recorded: nothing to undo
            _LOG.warning("removing an unreadable pending commit record %s (%s)", uri, one_line(exc))
            _delete(uri)
            continue
        if _sealed_with(target, entry_id):
            outcome = "published"
        elif _sealed_with(staging, entry_id):
            if is_remote(target):
                RunFolder(target, staging, True)._move_remote(False)
            else:
                move_into_place(staging, target)
            outcome = "finished"
        else:
            if not Ledger.open(ledger_uri, allow_rerelease=False).rollback_entry(entry_id):
                raise OutputRefused(f"{target}: a killed run's commit recorded release {entry_id} in {ledger_uri} but "
                                    f"published nothing, and the entry could not be taken out; try again")
            outcome = "rolled back"
        if is_remote(staging):
            leftover = _Gcs(staging)
            leftover.delete(leftover.names())
        _delete(uri)
        _LOG.warning("a run into %s was killed during its commit: its release (ledger entry %s) was %s", target,
                     entry_id, {"published": "already published", "finished": "complete and is now published",
                                "rolled back": "not published; its ledger entry was taken out"}[outcome])
        settled.append((entry_id, outcome))
    return settled


def _read(uri: str) -> bytes:
    if uri.startswith("gs://"):
        parent, name = uri.rsplit("/", 1)
        return _Gcs(parent).read(name)
    with open(uri, "rb") as fh:
        return fh.read()


class _Gcs:
    """The objects under one gs:// prefix, through the storage client (preconditions, one object at a time)."""

    def __init__(self, uri: str) -> None:
        from araopt.io.gcs_store import make_gcs_client

        self.uri = uri.rstrip("/")
        bucket, prefix = split_gs(self.uri + "/x")
        self._prefix = prefix[:-1]
        self._client = make_gcs_client()
        self._bucket = self._client.bucket(bucket)

    def names(self, start: str = "") -> list[str]:
        """The objects under the prefix (those whose name starts with ``start``), relative, sorted."""
        return sorted(b.name[len(self._prefix):]
                      for b in self._client.list_blobs(self._bucket, prefix=self._prefix + start))

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
            raise InvalidInput(f"{path} has no {outputs.manifest_file(False)}: the run is incomplete (killed or still "
                               f"running)")
        time.sleep(0.2)
