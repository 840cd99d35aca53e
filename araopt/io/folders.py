"""The one output-folder contract of every command that writes a folder: a folder is whole or absent,
and one run at a time writes it (``synth``, ``split``, ``load-criteo``, ``evaluate`` and ``export-ara``
through :class:`OutputFolder`; ``measure``'s run folder through ``pipelines.run_folder`` on the same
functions, with its release and private manifests and Cloud Storage besides).

1. :meth:`OutputFolder.prepare`: an exclusive ``flock`` on ``.<name>.araopt-lock`` beside the target,
   held for the run's life (the kernel releases it if the run dies), so a second run into the same
   output fails at once naming the first; the overwrite rule (:func:`check_target`); leftovers of
   killed runs swept (:func:`sweep_leftovers`); an empty staging folder ``<target>.araopt-staging-<id>``.
2. The command writes into the staging folder.
3. :meth:`OutputFolder.commit`: the overwrite rule again (the target may have appeared meanwhile), the
   manifest written last, then :func:`move_into_place`: the old folder renamed away, the staging folder
   renamed into place, the old one deleted. A reader sees the old folder, none, or the new one, never a
   mix, also when the run is killed (``kill -9``).
4. Any failure (an exception, Ctrl-C, SIGTERM or SIGHUP: ``termination_as_exit``) removes the staging
   folder (:meth:`OutputFolder.abandon`).

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
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from araopt.errors import OutputRefused, Unsupported
from araopt.io import jsonio
from araopt.io.locks import FileLock, LockHeld, describe_owner, sweep_unlocked

MANIFEST = "_manifest.json"
"""A data, evaluation or export folder's manifest (underscore files are skipped by dataset readers)."""
STAGING_TAG = ".araopt-staging-"
REPLACED_TAG = ".araopt-replaced-"
PENDING_TAG = ".araopt-pending-"
"""A run folder's commit in progress: ``<target>.araopt-pending-<staging id>.json`` names the ledger entry
recorded for the staging folder until the folder is in place (``pipelines.run_folder``)."""
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


def move_into_place(staging: str, target: str) -> None:
    """Two renames: the old ``target`` (if any) away, ``staging`` into place; then the old one deleted."""
    replaced = None
    if os.path.lexists(target):
        replaced = f"{target}{REPLACED_TAG}{uuid.uuid4().hex[:12]}"
        os.rename(target, replaced)
    os.rename(staging, target)
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


@dataclass(frozen=True)
class OutputFolder:
    """A local output folder being written: its target, the staging folder the command writes into, and
    the target's lock, held from :meth:`prepare` until :meth:`commit` or :meth:`abandon`.

    As a context manager it abandons the staging folder on any exception and releases the lock in
    every case; :meth:`commit` is the only way to publish."""

    target: Path
    staging: Path
    overwrite: bool
    kind: FolderKind
    lock: FileLock = field(repr=False, compare=False)
    _signals: contextlib.ExitStack = field(default_factory=contextlib.ExitStack, repr=False, compare=False)

    @classmethod
    def prepare(cls, target: str | os.PathLike[str], overwrite: bool, what: str,
                kind: FolderKind = DATA_FOLDER) -> OutputFolder:
        """Lock the target, apply the overwrite rule, sweep killed runs' leftovers, create the staging folder."""
        path = str(target).rstrip("/")
        if not path:
            raise OutputRefused("--output is empty")
        if "://" in path:
            raise Unsupported(f"{what}: --output {path}: this command writes a local folder")
        resolved = os.path.realpath(os.path.abspath(path))  # a symlinked output is the folder it names
        os.makedirs(os.path.dirname(resolved), exist_ok=True)
        lock = lock_target(resolved, what)
        try:
            check_target(resolved, overwrite, kind)
            sweep_leftovers(resolved)
            staging = new_staging(resolved)
            os.makedirs(staging)
        except BaseException:
            lock.release()
            raise
        return cls(Path(resolved), Path(staging), overwrite, kind, lock)

    def final_path(self, staged: str | os.PathLike[str]) -> str:
        """Where a path under the staging folder will be once committed (for messages)."""
        return str(self.target / Path(staged).relative_to(self.staging))

    def commit(self, manifest: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Check the target again, write the manifest (``manifest`` plus every staged file's sha256 and
        size) last, move the folder into place, release the lock. Returns the manifest written."""
        try:
            check_target(self.target, self.overwrite, self.kind, at_commit=True)
            written = {**(manifest or {}), "files": file_entries(self.staging)}
            (self.staging / MANIFEST).write_text(jsonio.dumps(written, indent=2) + "\n", encoding="utf-8")
            move_into_place(str(self.staging), str(self.target))
        finally:
            self.lock.release()
        return written

    def abandon(self) -> None:
        """Remove the staging folder (a failed run leaves nothing behind) and release the lock."""
        try:
            if not remove_local(self.staging):
                _LOG.warning("could not remove the staging folder %s", self.staging)
        finally:
            self.lock.release()

    def __enter__(self) -> OutputFolder:
        self._signals.enter_context(termination_as_exit())
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if os.path.lexists(self.staging):  # not committed: an exception, or a command that stopped early
                self.abandon()
            else:
                self.lock.release()
        finally:
            self._signals.close()


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
