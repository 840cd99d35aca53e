"""The one output-folder contract of every command that writes a folder: a folder is whole or absent,
and one run at a time writes it. ``synth``, ``split``, ``load-criteo``, ``evaluate``, ``replay``, the
exports and the nightly report use :class:`OutputFolder`; ``measure``'s run folder is an
:class:`OutputFolder` too (``araopt.io.run_folder``: its two manifests and the release's pending record).

1. :meth:`OutputFolder.prepare`: an exclusive ``flock`` on ``.<name>.araopt-lock`` beside the target,
   held for the run's life (the kernel releases it if the run dies), so a second run into the same
   output fails at once naming the first; killed commits settled (:meth:`OutputFolder.settle`); the
   overwrite rule (:func:`check_target`); leftovers of killed runs swept (:func:`sweep_leftovers`); an
   empty staging folder ``<target>.araopt-staging-<id>``.
2. The command writes into the staging folder.
3. :meth:`OutputFolder.commit`: the overwrite rule again (the target may have appeared meanwhile), an
   optional step that records something outside the folder (a release in the ledger, announced first
   by a pending record beside the target: :meth:`OutputFolder.mark_pending`), the manifest written
   last, then :func:`move_into_place`: the old folder renamed away, the staging folder renamed into
   place, the old one deleted. A reader sees the old folder, none, or the new one, never a mix, also
   when the run is killed (``kill -9``).
4. Any failure (an exception, Ctrl-C, SIGTERM or SIGHUP: ``termination_as_exit``) removes the staging
   folder (:meth:`OutputFolder.abandon`).

On gs:// (where a command allows it: ``measure``, the nightly report) there is no ``flock`` and no
atomic rename: the commit holds a lease object ``<target>.araopt-lock`` (create-only, with an expiry:
``araopt.io.locks.GcsLease``), deletes the old folder's markers first and creates the new manifest
last with ``if_generation_match=0``: a folder without it is incomplete. All gs:// access goes through
the one Cloud Storage adapter, ``araopt.io.gcs``; :class:`FolderFiles` is the only place that tells a
local folder from a gs:// one.

The overwrite rule: an absent or empty target is written; a non-empty one only with ``--overwrite``, and
even then only if araopt wrote it (it holds one of its kind's markers), so ``--overwrite`` never deletes
an unrelated folder. A single output file follows the same rule (:func:`check_output_file`) and is
written whole by ``araopt.io.files.atomic_write``. Parquet data is written in rolling shards.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import signal
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

from araopt.errors import OutputRefused, Unsupported, one_line
from araopt.io import jsonio
from araopt.io.files import atomic_write_bytes
from araopt.io.gcs import GcsPrefix, is_gs
from araopt.io.locks import FileLock, GcsLease, LockHeld, describe_owner, sweep_unlocked

MANIFEST = "_manifest.json"
"""A data, evaluation or export folder's manifest (underscore files are skipped by dataset readers)."""
STAGING_TAG = ".araopt-staging-"
REPLACED_TAG = ".araopt-replaced-"
PENDING_TAG = ".araopt-pending-"
"""A commit in progress: ``<target>.araopt-pending-<staging id>.json`` names the ledger entry recorded for
the staging folder until the folder is in place (:meth:`OutputFolder.mark_pending`)."""
PENDING_FORMAT = "araopt-pending-release/1"
LOCK_TAG = ".araopt-lock"
_LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class FolderKind:
    """What a command's output folder is called and how araopt recognises one it wrote."""

    name: str
    """In messages: "output folder", "run folder", ..."""
    holds: str
    """What a non-empty one holds, in messages: "data", "a run", "an export", "results"."""
    markers: tuple[str, ...] = (MANIFEST,)
    """Paths relative to the folder; a folder holding any of them was written by araopt."""


DATA_FOLDER = FolderKind("output folder", "data")
EVALUATION_FOLDER = FolderKind("evaluation folder", "results", (MANIFEST, "rmsre.csv"))
EXPORT_FOLDER = FolderKind("export folder", "an export", (MANIFEST, "export.json", "key_map.json"))
REPORT_FOLDER = FolderKind("report folder", "a report", (MANIFEST, "report.json"))


def _bookkeeping(name: str) -> bool:
    """A lock file, staging or replaced folder of a run into a folder beside it (inside a parent folder)."""
    return any(tag in name for tag in (LOCK_TAG, STAGING_TAG, REPLACED_TAG, PENDING_TAG))


def is_empty(path: str | os.PathLike[str]) -> bool:
    """Absent, or a folder holding nothing but araopt's bookkeeping for the folders in it."""
    p = Path(path)
    return not os.path.lexists(p) or (p.is_dir() and all(_bookkeeping(c.name) for c in p.iterdir()))


def overwrite_rule(target: str, empty: bool, ours: bool, overwrite: bool, kind: FolderKind,
                   at_commit: bool = False) -> None:
    """The overwrite rule on a target's facts, wherever it lives: an ``empty`` (or absent) target is
    written; one araopt did not write (not ``ours``) is refused even with ``overwrite``; ours is
    replaced only with ``overwrite`` (``at_commit``: the check at commit, when it appeared meanwhile)."""
    if empty:
        return
    late = " (it appeared while this run was running; nothing was written)" if at_commit else ""
    if not ours:
        raise OutputRefused(f"{target} exists and is not an araopt {kind.name} (no {kind.markers[0]}): refusing to "
                            f"write into or replace it; choose a new --output{late}")
    if not overwrite:
        raise OutputRefused(f"{target} already holds {kind.holds}; pass --overwrite to replace it{late}")


def check_target(target: str | os.PathLike[str], overwrite: bool, kind: FolderKind, at_commit: bool = False) -> None:
    """:func:`overwrite_rule` for a local target (a file where a folder is wanted is refused)."""
    p = Path(target)
    if os.path.lexists(p) and not p.is_dir():
        raise OutputRefused(f"output path {p} exists and is not a directory")
    overwrite_rule(str(p), is_empty(p), any(os.path.lexists(p / m) for m in kind.markers), overwrite, kind, at_commit)


def check_output_file(path: str | os.PathLike[str], overwrite: bool) -> None:
    """The overwrite rule for a single output file: an existing file is replaced only with ``overwrite``,
    and a folder never."""
    p = Path(path)
    if p.is_dir():
        raise OutputRefused(f"output path {p} is a directory; an output file was expected")
    if os.path.lexists(p) and not overwrite:
        raise OutputRefused(f"{p} already exists; pass --overwrite to replace it")


def check_parent_folder(out_dir: str | os.PathLike[str], subdirs: Sequence[str], overwrite: bool) -> None:
    """The overwrite rule for a folder of data folders (``synth``'s and ``split``'s ``train/`` and ``test/``):
    a non-empty ``out_dir`` only with ``overwrite``, and each of ``subdirs`` only if araopt wrote it. Other
    files in ``out_dir`` are never touched."""
    out = Path(out_dir)
    if os.path.lexists(out) and not out.is_dir():
        raise OutputRefused(f"output path {out} exists and is not a directory")
    if not is_empty(out):
        if not overwrite:
            raise OutputRefused(f"output directory {out} already holds data; pass --overwrite to replace it")
        for sub in subdirs:
            check_target(out / sub, True, DATA_FOLDER)


def lock_path(target: str) -> str:
    parent, name = os.path.split(target)
    return os.path.join(parent, f".{name}{LOCK_TAG}")


def lock_target(target: str, what: str) -> FileLock:
    """The target's exclusive lock (``.<name>.araopt-lock`` beside it); held by another run: refused, naming it."""
    try:
        return FileLock.acquire(lock_path(target), f"{what} into {target}")
    except LockHeld as held:
        raise OutputRefused(f"{target} is being written by another run: {describe_owner(held.owner)}; "
                            f"wait for it to finish or choose another --output") from None


def sweep_leftovers(target: str) -> list[str]:
    """Remove the staging and replaced folders of killed runs into ``target`` (call with its lock held:
    nobody else can be writing them). Returns what was removed."""
    parent, name = os.path.split(target)
    removed = []
    for tag in (STAGING_TAG, REPLACED_TAG):
        for path in sweep_unlocked(parent, name + tag):
            _LOG.warning("removed the leftover of a killed run: %s", path)
            removed.append(path)
    return removed


def new_staging(target: str) -> str:
    return f"{target}{STAGING_TAG}{uuid.uuid4().hex[:12]}"


def move_into_place(staging: str, target: str) -> str | None:
    """Two renames: the old ``target`` (if any) away, ``staging`` into place. Returns where the old one went
    (None: there was none), for ``remove_replaced`` once the commit stands: deleting it is cleanup, and
    an interrupt during it must not undo a release that is in place."""
    replaced = None
    if os.path.lexists(target):
        replaced = f"{target}{REPLACED_TAG}{uuid.uuid4().hex[:12]}"
        os.rename(target, replaced)
    os.rename(staging, target)
    return replaced


def remove_replaced(replaced: str | None, target: str) -> None:
    """Delete the folder ``move_into_place`` moved away from ``target`` (a warning if it cannot)."""
    if replaced and not remove_local(replaced):
        _LOG.warning("could not remove the replaced folder %s (the next run into %s removes it)", replaced, target)


def remove_local(path: str | os.PathLike[str]) -> bool:
    """Remove a local folder or file if present; True if it is gone."""
    if not os.path.lexists(path):
        return True
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        os.unlink(path)
    return not os.path.lexists(path)


def file_entries(folder: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every file under ``folder`` (relative, '/'-separated, sorted) with its sha256 and size."""
    root = Path(folder)
    out = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        out.append({"path": path.relative_to(root).as_posix(), "sha256": digest.hexdigest(),
                    "size": path.stat().st_size})
    return out


class FolderFiles:
    """The files of one folder, local or ``gs://`` (through the one Cloud Storage adapter,
    :class:`araopt.io.gcs.GcsPrefix`), by '/'-separated names relative to it: the only place where the
    output-folder contract tells the two apart."""

    def __init__(self, uri: str) -> None:
        self.uri = str(uri).rstrip("/")
        self._gcs = GcsPrefix(self.uri) if is_gs(self.uri) else None

    def path(self, relative: str = "") -> str:
        """The URI (or local path) of ``relative``."""
        if not relative:
            return self.uri
        return f"{self.uri}/{relative}" if self._gcs is not None else os.path.join(self.uri, *relative.split("/"))

    def names(self, start: str = "") -> list[str]:
        """Every file under the folder whose relative name starts with ``start``, sorted."""
        if self._gcs is not None:
            return self._gcs.names(start)
        found = []
        for root, _, files in os.walk(self.uri):
            for name in files:
                found.append(os.path.relpath(os.path.join(root, name), self.uri).replace(os.sep, "/"))
        return sorted(n for n in found if n.startswith(start))

    def children(self, start: str) -> list[str]:
        """The files directly in the folder (not in subfolders) whose name starts with ``start``."""
        if self._gcs is not None:
            return [n for n in self._gcs.names(start) if "/" not in n]
        try:
            return sorted(n for n in os.listdir(self.uri) if n.startswith(start))
        except FileNotFoundError:
            return []

    def read(self, relative: str) -> bytes:
        if self._gcs is not None:
            return self._gcs.read(relative)
        with open(self.path(relative), "rb") as fh:
            return fh.read()

    def read_or_none(self, relative: str) -> bytes | None:
        """The file's bytes, or None if it does not exist."""
        if self._gcs is not None:
            return self._gcs.read_or_none(relative)
        try:
            return self.read(relative)
        except FileNotFoundError:
            return None

    def write(self, relative: str, data: bytes) -> None:
        """Write a file whole (locally: a temporary sibling renamed over it)."""
        if self._gcs is not None:
            self._gcs.put(relative, data)
            return
        path = self.path(relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write_bytes(path, data)

    def create(self, relative: str, data: bytes) -> bool:
        """Write a file only if it is absent; False if it exists (on gs:// by a generation precondition)."""
        if self._gcs is not None:
            return self._gcs.create(relative, data) is not None
        path = self.path(relative)
        if os.path.lexists(path):
            return False
        self.write(relative, data)
        return True

    def remove(self, relatives: Sequence[str]) -> None:
        """Remove files or (locally) folders; absent ones are fine."""
        if self._gcs is not None:
            self._gcs.delete(list(relatives))
            return
        for relative in relatives:
            remove_local(self.path(relative))

    def remove_all(self) -> bool:
        """Remove the folder and everything in it; True if it is gone."""
        if self._gcs is not None:
            self._gcs.delete(self._gcs.names())
            return True
        return remove_local(self.uri)

    def copy(self, relative: str, other: FolderFiles, other_relative: str) -> None:
        if self._gcs is not None and other._gcs is not None:
            self._gcs.copy(relative, other._gcs, other_relative)
        else:
            other.write(other_relative, self.read(relative))


def read_uri(uri: str) -> bytes:
    """The bytes of one file, local or gs://."""
    parent, name = str(uri).rsplit("/", 1) if is_gs(str(uri)) else os.path.split(os.fspath(uri))
    return FolderFiles(parent).read(name)


def write_uri(uri: str, data: bytes) -> None:
    """Write one file whole, local or gs://."""
    parent, name = str(uri).rsplit("/", 1) if is_gs(str(uri)) else os.path.split(os.fspath(uri))
    FolderFiles(parent).write(name, data)


def remove_uri(uri: str) -> None:
    parent, name = str(uri).rsplit("/", 1) if is_gs(str(uri)) else os.path.split(os.fspath(uri))
    FolderFiles(parent).remove([name])


OutputFolderT = TypeVar("OutputFolderT", bound="OutputFolder")


@dataclass(frozen=True)
class OutputFolder:
    """An output folder being written (locally or, where a command allows it, on gs://): its target, the
    staging folder the command writes into, and (locally) the target's lock, held from :meth:`prepare`
    until :meth:`commit` or :meth:`abandon`; on gs:// the commit holds a lease instead (module doc).

    As a context manager it abandons the staging folder on any exception and releases the lock in
    every case; :meth:`commit` is the only way to publish."""

    target: str
    staging: str
    overwrite: bool
    kind: FolderKind
    lock: FileLock | None = field(default=None, repr=False, compare=False)
    _signals: contextlib.ExitStack = field(default_factory=contextlib.ExitStack, repr=False, compare=False)
    records_pending: ClassVar[bool] = False
    """Whether commits of this kind of folder record something outside it (pending records to settle)."""

    @classmethod
    def prepare(cls: type[OutputFolderT], target: str | os.PathLike[str], overwrite: bool, what: str,
                kind: FolderKind = DATA_FOLDER, *, remote: bool = False) -> OutputFolderT:
        """Lock the target, settle killed commits (:meth:`settle`), apply the overwrite rule, sweep killed
        runs' leftovers, create the staging folder. ``remote``: a gs:// target is allowed."""
        path = str(target).rstrip("/")
        if not path:
            raise OutputRefused("--output is empty")
        if "://" in path:
            if not (remote and is_gs(path)):
                raise Unsupported(f"{what}: --output {path}: this command writes a local folder"
                                  + (" or gs://BUCKET/PATH" if remote else ""))
            folder = cls(path, new_staging(path), overwrite, kind)
            folder._settle_early()
            folder.check()
            return folder
        resolved = os.path.realpath(os.path.abspath(path))  # a symlinked output is the folder it names
        os.makedirs(os.path.dirname(resolved), exist_ok=True)
        lock = lock_target(resolved, what)
        try:
            cls.settle(resolved)  # a killed commit is finished or taken back before anything is swept
            check_target(resolved, overwrite, kind)
            sweep_leftovers(resolved)  # nobody else holds the lock: these are dead runs' leftovers
            staging = new_staging(resolved)
            os.makedirs(staging)
        except BaseException:
            lock.release()
            raise
        return cls(resolved, staging, overwrite, kind, lock)

    @classmethod
    def settle(cls, target: str) -> object:
        """Settle the commits into ``target`` killed after recording something outside the folder (their
        pending records): called with the output's lock or lease held. Plain folders record nothing."""
        return None

    @property
    def remote(self) -> bool:
        return is_gs(self.target)

    @property
    def staged(self) -> FolderFiles:
        """The staging folder's files."""
        return FolderFiles(self.staging)

    def path(self, relative: str = "") -> str:
        """Where the command writes ``relative`` (a '/'-separated path) in the staging folder."""
        return self.staged.path(relative)

    def final_path(self, staged: str | os.PathLike[str]) -> str:
        """Where a path under the staging folder will be once committed (for messages)."""
        return str(Path(self.target) / Path(staged).relative_to(self.staging))

    def write(self, relative: str, data: bytes) -> None:
        self.staged.write(relative, data)

    def read(self, relative: str) -> bytes:
        return self.staged.read(relative)

    def read_or_none(self, relative: str) -> bytes | None:
        return self.staged.read_or_none(relative)

    def check(self, at_commit: bool = False) -> None:
        """The overwrite rule on the target, local or gs://."""
        if not self.remote:
            check_target(self.target, self.overwrite, self.kind, at_commit)
            return
        names = set(FolderFiles(self.target).names())
        overwrite_rule(self.target, not names, any(m in names for m in self.kind.markers), self.overwrite, self.kind,
                       at_commit)

    def commit(self, manifest: Mapping[str, Any] | None = None, *,
               seal: Callable[[], tuple[dict[str, Any], str]] | None = None,
               before_move: Callable[[], Callable[[], None] | None] | None = None) -> dict[str, Any]:
        """Exclusively: check the target again, call ``before_move()`` (e.g. record a release in the
        ledger; it returns an undo called if the commit then fails), seal the folder (``seal()``: write
        the manifests, return the last one and its path; default: ``_manifest.json`` with ``manifest``
        plus every staged file's sha256 and size) and move it into place. Returns the manifest."""
        lease = self._lease() if self.remote else None
        try:
            if lease is not None and self.records_pending:
                self.settle(self.target)  # on gs:// the lease is the output's lock: settle killed commits
            self.check(at_commit=True)
            undo = before_move() if before_move is not None else None
            last: str | None = None
            replaced: str | None = None
            try:
                written, last = seal() if seal is not None else self._seal_manifest(manifest or {})
                if self.remote:
                    self._move_remote(last)
                else:
                    replaced = move_into_place(self.staging, self.target)
            except BaseException:
                if not self._placed(last):  # in place (an interrupt right after the move): the release stands
                    if undo is not None:
                        undo()
                    raise
                self.clear_pending()
                raise
            self.clear_pending()  # in place: whatever before_move recorded stands
            # cleanup, after the commit stands (an interrupt here leaves a leftover: locally the next run sweeps it)
            if self.remote:
                try:
                    self.staged.remove_all()
                except Exception as exc:  # noqa: BLE001 - the release stands; the staged copies are only storage
                    _LOG.warning("could not remove the staging folder %s (%s)", self.staging, exc)
            else:
                remove_replaced(replaced, self.target)
        finally:
            if lease is not None:
                lease.release()
        self._release()  # on failure the caller's abandon (the context manager) or fail releases it, after cleanup
        return written

    def _publishable(self) -> list[str]:
        """The staged files that the commit publishes (on gs://, where nothing is renamed)."""
        return self.staged.names()

    def _seal_manifest(self, manifest: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
        if self.remote:
            files = self.staged
            entries = []
            for name in self._publishable():
                data = files.read(name)
                entries.append({"path": name, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)})
        else:
            entries = file_entries(self.staging)
        written = {**manifest, "files": entries}
        self.write(MANIFEST, (jsonio.dumps(written, indent=2) + "\n").encode())
        return written, MANIFEST

    def _move_remote(self, last: str) -> None:
        """gs:// has no rename: the old folder's markers first (it now reads as not whole), its other
        files, the new files, and the new ``last`` file (the manifest) at the end, created only if absent."""
        target, staged = FolderFiles(self.target), self.staged
        old = target.names()
        target.remove([m for m in self.kind.markers if m in old])
        target.remove(target.names())
        for name in self._publishable():
            if name != last:
                staged.copy(name, target, name)
        if not target.create(last, staged.read(last)):
            raise OutputRefused(f"{self.target}/{last} was created by another run during this commit; nothing was "
                                f"published by this run")

    def _placed(self, last: str | None) -> bool:
        """Whether this commit's folder is in place: locally its staging folder was renamed into the target
        (it exists no more), on gs:// the target's ``last`` file (the manifest, created last) is this run's."""
        if last is None:
            return False
        if not self.remote:
            return not os.path.lexists(self.staging)
        target = FolderFiles(self.target)
        return last in target.names() and target.read(last) == self.staged.read(last)

    # ---- pending records: a commit that records something outside the folder ---------------------
    @property
    def pending_uri(self) -> str:
        """This commit's pending record, beside the target: ``<target>.araopt-pending-<staging id>.json``."""
        return f"{self.target}{PENDING_TAG}{self.staging.rsplit(STAGING_TAG, 1)[-1]}.json"

    def mark_pending(self, ledger_uri: str, entry_id: str) -> None:
        """Before ``before_move`` records entry ``entry_id`` in the ledger ``ledger_uri``: say so beside the
        target (written whole), so that whoever holds the output next settles it (:meth:`settle`)."""
        record = {"format": PENDING_FORMAT, "ledger": ledger_uri, "entry": entry_id, "staging": self.staging,
                  "target": self.target}
        write_uri(self.pending_uri, (jsonio.dumps(record, indent=1) + "\n").encode())

    def clear_pending(self) -> None:
        """The folder is in place or the record's entry was taken out: the pending record goes."""
        try:
            remove_uri(self.pending_uri)
        except Exception as exc:  # noqa: BLE001 - the next holder of the output settles it
            _LOG.warning("could not remove %s (the next run into %s removes it): %s", self.pending_uri, self.target,
                         one_line(exc))

    def _settle_early(self) -> None:
        """On gs://, settle killed commits before the job runs if the commit lease is free (a held one:
        the commit settles them, under its lease)."""
        if not self.records_pending:
            return
        try:
            lease = self._lease()
        except OutputRefused:
            return
        try:
            self.settle(self.target)
        finally:
            lease.release()

    def _lease(self) -> GcsLease:
        try:
            return GcsLease.acquire(None, self.target + LOCK_TAG, f"araopt commit of {self.target}")
        except LockHeld as held:
            raise OutputRefused(f"{self.target} is being committed by another run: {describe_owner(held.owner)}; "
                                f"nothing was published") from None

    def abandon(self) -> None:
        """Remove the staging folder (a failed run leaves nothing behind) and release the lock."""
        try:
            if not self.staged.remove_all():
                _LOG.warning("could not remove the staging folder %s", self.staging)
        except Exception:  # noqa: BLE001 - cleanup must not hide the run's own error
            _LOG.warning("could not remove the staging folder %s", self.staging)
        finally:
            self._release()

    def _release(self) -> None:
        if self.lock is not None:
            self.lock.release()

    def __enter__(self: OutputFolderT) -> OutputFolderT:
        self._signals.enter_context(termination_as_exit())
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.remote or os.path.lexists(self.staging):  # not committed: an exception or an early stop
                self.abandon()  # (on gs:// after a commit: the staging prefix is already empty)
            else:
                self._release()
        finally:
            self._signals.close()


def write_folder(target: str, files: Mapping[str, bytes], what: str, kind: FolderKind,
                 manifest: Mapping[str, Any] | None = None, overwrite: bool = False) -> dict[str, Any]:
    """Write a small folder of ``files`` ({relative name: bytes}) whole through the contract, locally or on
    gs://: staged, sealed with its manifest, moved into place. Returns the manifest."""
    with OutputFolder.prepare(target, overwrite, what, kind, remote=True) as folder:
        for name, data in files.items():
            folder.write(name, data)
        return folder.commit(manifest)


TERMINATION_SIGNALS = ("SIGTERM", "SIGHUP")
"""Signals that end a run politely (``kill``, ``timeout``, a closed terminal, a scheduler): inside an
:class:`OutputFolder` they raise ``SystemExit(128 + signal)`` so that the staging folder is removed
(Ctrl-C already raises ``KeyboardInterrupt``; ``kill -9`` cannot be caught: the next run sweeps it)."""


@contextlib.contextmanager
def termination_as_exit() -> Iterator[None]:
    """While the block runs (main thread only; elsewhere a no-op), SIGTERM and SIGHUP raise SystemExit
    instead of ending the process on the spot; the previous handlers are restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = {}
    for name in TERMINATION_SIGNALS:
        number = getattr(signal, name, None)
        if number is not None:
            previous[number] = signal.signal(number, stop)
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


class ParquetShardWriter:
    """Rolls Parquet files <prefix>-NNNNN.parquet in one directory, one row group per write."""

    def __init__(self, directory: str | os.PathLike[str], schema: pa.Schema, max_rows_per_file: int = 8_000_000,
                 compression: str = "snappy", prefix: str = "part", use_dictionary: bool | list[str] = True) -> None:
        self.directory, self.schema = Path(directory), schema
        self.max_rows, self.compression, self.prefix = max_rows_per_file, compression, prefix
        self.use_dictionary = use_dictionary
        self.files: list[str] = []
        self._writer: pq.ParquetWriter | None = None
        self._rows_in_file = 0

    def write(self, table: pa.Table) -> None:
        if self._writer is None or self._rows_in_file >= self.max_rows:
            self.close()
            self.directory.mkdir(parents=True, exist_ok=True)
            path = self.directory / f"{self.prefix}-{len(self.files):05d}.parquet"
            self._writer = pq.ParquetWriter(path, self.schema, compression=self.compression,
                                            use_dictionary=self.use_dictionary)
            self.files.append(str(path))
            self._rows_in_file = 0
        self._writer.write_table(table, row_group_size=max(1, table.num_rows))
        self._rows_in_file += table.num_rows

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
