"""Who is alive: locks and leases instead of process ids.

* :class:`FileLock` — an exclusive ``flock`` on a file holding an owner record. The kernel releases it
  when the process dies (``kill -9`` included), and it means the same in every PID namespace that
  shares the file (containers sharing a temp folder), which a process id does not.
* :class:`LockedDir` — a working folder (a staging folder, a shuffle spill) with a sibling lock file
  ``<folder>.lock`` held for the folder's life. The lock file is created already locked (linked into
  place after the ``flock``) before the folder exists, and removed only after the folder is gone, so
  a folder whose lock file is missing or unheld is a dead run's leftover (:func:`sweep_unlocked`).
* :class:`GcsLease` — the same on Cloud Storage, which has no ``flock``: an object created only if
  absent (``if_generation_match=0``) with an owner record and an expiry; an expired lease can be taken
  over with a precondition on its generation, so of two takers exactly one wins.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import json
import os
import shutil
import socket
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from araopt.errors import OutputRefused

if TYPE_CHECKING:  # pragma: no cover - typing only
    from google.cloud import storage

    from araopt.io.gcs import GcsPrefix

LOCK_SUFFIX: Final = ".lock"


class LockHeld(OutputRefused):
    """Someone else holds the lock or lease (an output another run is writing); ``owner`` is its owner
    record (None if unreadable)."""

    def __init__(self, where: str, owner: Mapping[str, Any] | None) -> None:
        self.where = where
        self.owner = dict(owner) if owner else None
        super().__init__(f"{where} is held by {describe_owner(self.owner)}")


def owner_record(what: str) -> dict[str, Any]:
    """Who holds a lock (for error messages only: liveness is the lock itself, never these fields)."""
    return {"what": what, "host": socket.gethostname(), "pid": os.getpid(),
            "since": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")}


def describe_owner(owner: Mapping[str, Any] | None) -> str:
    if not owner:
        return "another process (owner record unreadable)"
    return f"{owner.get('what', 'a run')} (pid {owner.get('pid')} on {owner.get('host')} since {owner.get('since')})"


def _read_owner(fd: int) -> dict[str, Any] | None:
    try:
        data = os.pread(fd, 4096, 0)
        owner = json.loads(data.decode())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return owner if isinstance(owner, dict) else None


def _try_flock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


class FileLock:
    """An exclusive ``flock`` on ``path`` with an owner record in the file; :meth:`release` (or the
    process's death) frees it. The file itself stays: unlinking a lock file others may have open would
    let two processes hold "the same" lock on two inodes."""

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self._fd = fd

    @classmethod
    def acquire(cls, path: str | os.PathLike[str], what: str) -> FileLock:
        """Take the lock without waiting; :class:`LockHeld` if another open file description holds it."""
        path = os.fspath(path)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        if not _try_flock(fd):
            owner = _read_owner(fd)
            os.close(fd)
            raise LockHeld(path, owner)
        _write_owner(fd, what)
        return cls(path, fd)

    @classmethod
    def create_locked(cls, path: str, what: str) -> FileLock:
        """A new lock file that appears in place already locked (FileExistsError if ``path`` exists):
        written and locked under a temporary name, then hard-linked to ``path``."""
        head, name = os.path.split(path)
        tmp = os.path.join(head, f".{name}.{uuid.uuid4().hex[:12]}.tmp")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            _write_owner(fd, what)
            os.link(tmp, path)
        except BaseException:
            os.close(fd)
            raise
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        return cls(path, fd)

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing the last descriptor releases the flock
            self._fd = -1

    def __enter__(self) -> FileLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _write_owner(fd: int, what: str) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(owner_record(what)).encode(), 0)


def _remove_tree(path: str) -> bool:
    """Remove a folder, a file or a symbolic link (never what a link points to); True if it is gone
    because of this call (False if it was already absent or could not be removed)."""
    try:
        if os.path.islink(path) or not os.path.isdir(path):
            os.unlink(path)
        else:
            shutil.rmtree(path)
    except FileNotFoundError:
        return False
    except OSError:
        return False
    return not os.path.lexists(path)


class LockedDir:
    """A working folder ``parent/<prefix><id>`` guarded by ``parent/<prefix><id>.lock`` (see module doc)."""

    def __init__(self, path: str, lock: FileLock) -> None:
        self.path = path
        self._lock = lock

    @classmethod
    def create(cls, parent: str, prefix: str, what: str, mode: int | None = 0o700) -> LockedDir:
        """Lock first, then the folder (``mode``: its permissions whatever the umask; None: default)."""
        os.makedirs(parent, exist_ok=True)
        path = os.path.join(parent, f"{prefix}{uuid.uuid4().hex[:16]}")
        lock = FileLock.create_locked(path + LOCK_SUFFIX, what)
        try:
            if mode is None:
                os.makedirs(path)
            else:
                os.makedirs(path, mode=mode)
                os.chmod(path, mode)
        except BaseException:
            _unlink_quietly(lock.path)
            lock.release()
            raise
        return cls(path, lock)

    def remove(self) -> None:
        """Remove the folder (if still there), then its lock file, then release the lock."""
        if os.path.lexists(self.path):
            _remove_tree(self.path)
        self.disown()

    def disown(self) -> None:
        """The folder was moved elsewhere (or removed): drop the lock file and release the lock."""
        if self._lock.held:
            _unlink_quietly(self._lock.path)
            self._lock.release()


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def sweep_unlocked(parent: str, prefix: str) -> list[str]:
    """Remove the folders ``parent/<prefix>*`` whose lock file is missing or held by nobody (dead runs'
    leftovers; a live run holds its folder's lock whatever its host or PID namespace), and orphaned
    lock files. Returns the folders actually removed."""
    try:
        names = os.listdir(parent)
    except FileNotFoundError:
        return []
    removed: list[str] = []
    for name in sorted(names):
        if not name.startswith(prefix) or name.endswith(LOCK_SUFFIX):
            continue
        path = os.path.join(parent, name)
        try:
            fd = os.open(path + LOCK_SUFFIX, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            fd = -1  # no lock file: never created by a live run (its lock exists before its folder)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM):
                continue  # another user's folder: not ours to judge
            raise
        try:
            if fd >= 0 and not _try_flock(fd):
                continue  # alive
            if _remove_tree(path):
                removed.append(path)
            if fd >= 0:
                _unlink_quietly(path + LOCK_SUFFIX)
        finally:
            if fd >= 0:
                os.close(fd)
    for name in sorted(names):  # lock files whose folder is gone and whose owner is dead
        path = os.path.join(parent, name)
        if name.startswith(prefix) and name.endswith(LOCK_SUFFIX) and not os.path.lexists(path[:-len(LOCK_SUFFIX)]):
            with contextlib.suppress(OSError):
                fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
                try:
                    if _try_flock(fd):
                        _unlink_quietly(path)
                finally:
                    os.close(fd)
    return removed


# ---------------------------------------------------------------------------------------------
# Cloud Storage
# ---------------------------------------------------------------------------------------------

DEFAULT_LEASE_SECONDS: Final = 900.0


class GcsLease:
    """A lease on the object ``gs://bucket/key`` (see module doc), through the one Cloud Storage adapter
    (:class:`araopt.io.gcs.GcsPrefix`). Holding it for longer than ``seconds`` lets another process take
    it over: use it around short critical sections (a commit)."""

    def __init__(self, objects: GcsPrefix, name: str, generation: int) -> None:
        self._objects = objects
        self._name = name
        self.uri = objects.object_uri(name)
        self.generation = generation

    @classmethod
    def acquire(cls, client: storage.Client | None, uri: str, what: str,
                seconds: float = DEFAULT_LEASE_SECONDS) -> GcsLease:
        from araopt.io.gcs import GcsPrefix

        objects, name = GcsPrefix.parent_of(uri, client=client)
        now = _dt.datetime.now(_dt.UTC)
        record = {**owner_record(what), "expires": (now + _dt.timedelta(seconds=seconds)).isoformat()}
        body = json.dumps(record).encode()
        for _ in range(3):
            generation = objects.create(name, body)
            if generation is not None:
                return cls(objects, name, generation)
            data, current = objects.read_generation(name)
            if data is None:
                continue  # released meanwhile: try to create again
            try:
                owner = json.loads(data)
                expires = _dt.datetime.fromisoformat(owner["expires"])
            except (ValueError, KeyError, TypeError):
                owner, expires = None, now  # unreadable lease: treat as expired
            if expires > now:
                raise LockHeld(uri, owner)
            generation = objects.swap(name, body, current)  # take over: of two takers the generation admits one
            if generation is not None:
                return cls(objects, name, generation)
        raise LockHeld(uri, None)

    def release(self) -> None:
        """Delete the lease object if it is still ours (a taken-over lease is left to its new owner)."""
        self._objects.delete([self._name], generation=self.generation)
