"""A release run's output folder (``measure``): the one output-folder contract (``araopt.io.folders``,
locally or on gs://) plus what a release adds to it: two manifests, the failed run's private files,
and the recovery of a commit killed after the release ledger recorded it.

A run folder is sealed with ``private/run_manifest.json`` (the input facts, the ledger entry, the
release manifest's sha256) and then the release manifest (``release/MANIFEST.json`` or the simulation
folder's) last: on gs:// a folder without it is incomplete.

A commit that records a release cannot lose it or record it falsely, whenever it is killed: before the
ledger records anything, :meth:`OutputFolder.mark_pending` writes ``OUT.araopt-pending-<staging id>.json``
(the ledger and the entry id the release will be recorded under); it is removed only once the folder is
in place or the entry is taken out again. The next holder of the output (locally: the next run's
lock, before anything is swept; on gs://: the next commit's lease) settles every pending record first
(:func:`settle_pending`): if the target holds the sealed run that names the entry, the release was
published; else if the staging folder holds the complete sealed release naming the entry (manifests
written, every file matching its sha256), the release is finished (moved into place: it is exactly
what the killed run would have published); else nothing was published and the entry is taken out of
the ledger. A staging folder holding a complete release is therefore never swept as garbage, and the
input can be released again without ``--allow-rerelease`` whenever nothing of it was published.
"""
from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

from araopt.errors import InvalidInput, InvalidParameters, OutputRefused, one_line
from araopt.io import jsonio, outputs
from araopt.io.folders import (
    PENDING_TAG,
    FolderFiles,
    FolderKind,
    OutputFolder,
    move_into_place,
    read_uri,
    remove_local,
    remove_replaced,
    remove_uri,
)
from araopt.io.gcs import is_gs
from araopt.io.store import StoreError

__all__ = ["FAILED_TAG", "ROW_IDS", "RUN_FOLDER", "RunFolder", "failures_settled", "settle_pending",
           "wait_for_manifest"]
FAILED_TAG = ".araopt-failed-"
RUN_FOLDER = FolderKind("run folder", "a run", outputs.RUN_MARKERS)
"""The overwrite rule's markers of a run folder: a release or simulation manifest, or the run summary."""
WORK_DIR = ".araopt-work"
"""Inside the staging folder: files the job leaves for the driver (the released rows' ids); never committed."""
ROW_IDS = f"{WORK_DIR}/row_ids"
_LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunFolder(OutputFolder):
    """The target folder of a release run, the staging folder the pipeline writes into, and (locally)
    the target's lock, held from :meth:`prepare` until :meth:`commit`, :meth:`fail` or :meth:`abandon`."""

    records_pending: ClassVar[bool] = True

    @classmethod
    def prepare(cls, target: str | os.PathLike[str], overwrite: bool, what: str = "araopt measure",
                kind: FolderKind = RUN_FOLDER, *, remote: bool = True) -> RunFolder:
        """The contract's prepare (a local path or gs://), with the private folder created locally."""
        path = str(target).rstrip("/")
        if not path:
            raise InvalidParameters("--output is empty")
        if "://" in path and not is_gs(path):
            raise InvalidParameters(f"--output {path}: a run folder is a local path or gs://BUCKET/PATH")
        folder = super().prepare(path, overwrite, what, kind, remote=remote)
        if not folder.remote:
            try:
                os.makedirs(os.path.join(folder.staging, outputs.PRIVATE_DIR), mode=0o700)
            except BaseException:
                folder.abandon()
                raise
        return folder

    @classmethod
    def settle(cls, target: str) -> list[tuple[str, str]]:
        return settle_pending(target)

    def read_all(self, relative_dir: str) -> list[bytes]:
        """The contents of every file under ``relative_dir`` of the staging folder."""
        return list(self.iter_all(relative_dir))

    def iter_all(self, relative_dir: str) -> Iterator[bytes]:
        """The contents of every file under ``relative_dir`` of the staging folder, one file at a time
        (a few at a time from gs://), so a caller that streams them holds one batch, not all."""
        staged = self.staged
        names = staged.names(relative_dir.rstrip("/") + "/")
        if not self.remote:
            for name in names:
                yield staged.read(name)
            return
        with ThreadPoolExecutor(max_workers=8) as pool:  # one small object per batch: fetch several at once
            for start in range(0, len(names), 16):
                yield from pool.map(staged.read, names[start:start + 16])

    def remove(self, relatives: list[str]) -> None:
        """Remove staged files (e.g. what a worker left for the driver)."""
        self.staged.remove(relatives)

    def _publishable(self) -> list[str]:
        """Every staged file, relative (Beam temp folders and the driver's work folder excluded)."""
        return [r for r in self.staged.names() if not r.split("/", 1)[0].startswith(("beam-temp", WORK_DIR))]

    def release_digests(self, simulation: bool = False) -> dict[str, str]:
        """{path under the release folder: sha256} of the staged release files (what the release manifest
        will list): the release ledger records them, so a release folder can be checked against it."""
        prefix = outputs.release_dir(simulation) + "/"
        manifest = outputs.manifest_file(simulation)
        return {rel[len(prefix):]: outputs.sha256_hex(self.read(rel)) for rel in self._publishable()
                if rel.startswith(prefix) and rel != manifest}

    def commit(self, simulation: bool, public: dict[str, Any],  # type: ignore[override]
               private: dict[str, Any] | None = None,
               before_move: Callable[[], Callable[[], None] | None] | None = None) -> dict[str, Any]:
        """The contract's commit (:meth:`OutputFolder.commit`), sealed with the private run manifest
        (``private``: input facts) and the release manifest (``public``: public facts) last. Returns the
        release manifest."""
        return super().commit(seal=lambda: self._seal(simulation, public, private or {}), before_move=before_move)

    def _seal(self, simulation: bool, public: dict[str, Any], private: dict[str, Any]) -> tuple[dict[str, Any], str]:
        """Drop the work folder, hash every file, write the private then the release manifest."""
        self.staged.remove([WORK_DIR] if not self.remote else self.staged.names(WORK_DIR + "/"))
        release_prefix = outputs.release_dir(simulation) + "/"
        manifest_path = outputs.manifest_file(simulation)
        entries = []
        for rel in self._publishable():
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
        return manifest, manifest_path

    def fail(self) -> str | None:
        """A failed run: drop everything but the operator-private files; keep those (the dead letter
        explains most failures) in ``OUT.araopt-failed-<id>`` if there are any; return that path."""
        try:
            if self.remote or not os.path.isdir(self.staging):
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


# ---- pending commits ------------------------------------------------------------------------------
def _pending_records(target: str) -> list[str]:
    """The pending records of commits into ``target`` (see module doc), oldest name first."""
    parent, name = target.rsplit("/", 1) if is_gs(target) else os.path.split(target)
    folder = FolderFiles(parent)
    return [folder.path(n) for n in folder.children(name + PENDING_TAG) if n.endswith(".json")]


def _sealed_with(folder_uri: str, entry_id: str) -> bool:
    """Whether ``folder_uri`` holds a whole sealed release recorded as ledger entry ``entry_id``: its run
    manifest names the entry and the release manifest's sha256, and every release file matches."""
    folder = FolderFiles(folder_uri)
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


def _take_out(ledger_uri: str, entry_id: str) -> bool:
    """Take ledger entry ``entry_id`` out again (its commit published nothing); True if it is not in the
    ledger now."""
    from araopt.io.stores import open_store

    try:
        open_store(ledger_uri).remove_release(entry_id)
    except (StoreError, ValueError) as exc:
        _LOG.error("release ledger: release %s could not be taken out of %s (%s)", entry_id, ledger_uri, exc)
        return False
    return True


def settle_pending(target: str) -> list[tuple[str, str]]:
    """Settle the commits into ``target`` that were killed between recording their release in the ledger
    and removing their pending record; call with the output's lock (locally) or lease (gs://) held.
    Per record: ``published`` (the target holds it), ``finished`` (the staging folder held the whole
    sealed release: moved into place now) or ``rolled back`` (nothing was published: the ledger entry
    is taken out). Returns (entry id, outcome) pairs; an unreachable ledger refuses the run (nothing is
    swept: the pending record and its staging folder stay for a later run)."""
    settled = []
    for uri in _pending_records(target):
        try:
            record = jsonio.loads(read_uri(uri), uri)
            ledger_uri, entry_id, staging = record["ledger"], record["entry"], record["staging"]
        except Exception as exc:  # noqa: BLE001 - written whole before anything was recorded: nothing to undo
            _LOG.warning("removing an unreadable pending commit record %s (%s)", uri, one_line(exc))
            remove_uri(uri)
            continue
        if _sealed_with(target, entry_id):
            outcome = "published"
        elif _sealed_with(staging, entry_id):
            if is_gs(target):
                RunFolder(target, staging, True, RUN_FOLDER)._move_remote(outputs.manifest_file(False))
            else:
                remove_replaced(move_into_place(staging, target), target)
            outcome = "finished"
        else:
            if not _take_out(ledger_uri, entry_id):
                raise OutputRefused(f"{target}: a killed run's commit recorded release {entry_id} in {ledger_uri} but "
                                    f"published nothing, and the entry could not be taken out; try again")
            outcome = "rolled back"
        if is_gs(staging):
            FolderFiles(staging).remove_all()
        remove_uri(uri)
        _LOG.warning("a run into %s was killed during its commit: its release (ledger entry %s) was %s", target,
                     entry_id, {"published": "already published", "finished": "complete and is now published",
                                "rolled back": "not published; its ledger entry was taken out"}[outcome])
        settled.append((entry_id, outcome))
    return settled


def wait_for_manifest(path: str, timeout: float = 0.0) -> dict[str, Any]:
    """Read a run folder's release manifest (release or simulation folder); a folder without one is
    incomplete (refused)."""
    deadline = time.monotonic() + timeout
    folder = FolderFiles(path)
    while True:
        for sim in (False, True):
            data = folder.read_or_none(outputs.manifest_file(sim))
            if data is not None:
                return dict(jsonio.loads(data, folder.path(outputs.manifest_file(sim))))
        if time.monotonic() >= deadline:
            raise InvalidInput(f"{path} has no {outputs.manifest_file(False)}: the run is incomplete (killed or still "
                               f"running)")
        time.sleep(0.2)
