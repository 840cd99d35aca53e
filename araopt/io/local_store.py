"""The parameter store and release ledger in a local folder: files written whole (temporary sibling, fsync,
rename), compare-and-swap under a per-key lock, every failure a one-line ``StoreError``."""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from araopt.errors import one_line
from araopt.io.store import (
    LATEST,
    PARAMS_FILE,
    VERSIONS_DIR,
    LatestPointer,
    ParameterStore,
    StoreConflict,
    StoreError,
)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _content_generation(data: bytes) -> int:
    """A local object's generation: a digest of its content (a compare-and-swap under a lock needs
    only "unchanged since read"; every ledger write changes the content)."""
    return int.from_bytes(hashlib.sha256(data).digest()[:7], "big") + 1


def _write_temp(directory: Path, name: str, data: bytes) -> Path:
    """Write ``data`` to a fresh fsynced temp file in ``directory`` and return its path."""
    tmp = directory / f".{name}.tmp-{uuid.uuid4().hex}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return tmp


class LocalStore(ParameterStore):
    """A store in a local directory (the default for single-machine runs).

    Versions are created with temp file + fsync + ``os.link`` (fails if the target exists, so a
    version is never replaced or partially visible). ``latest`` is replaced with ``os.replace``
    while holding an exclusive ``flock`` on ``latest.lock``; its generation is the ``serial`` kept
    inside the pointer, so racing processes (and threads) behave as on GCS. ``flock`` is released
    by the kernel when a process dies, so a crash never leaves a stale lock.
    """

    def __init__(self, root: str | os.PathLike[str], *, lock_timeout: float = 30.0) -> None:
        self._root = Path(root).expanduser().absolute()
        self._lock_timeout = lock_timeout

    @property
    def uri(self) -> str:
        return str(self._root)

    @property
    def root(self) -> Path:
        return self._root

    def _object_uri(self, key: str) -> str:
        return str(self._root / key)

    def _guard(self, key: str, action: str) -> contextlib.AbstractContextManager[None]:
        return _translate_os_errors(self._object_uri(key), action)

    def _read(self, key: str) -> bytes | None:
        with self._guard(key, "read"):
            try:
                return (self._root / key).read_bytes()
            except FileNotFoundError:
                return None

    def _create(self, key: str, data: bytes) -> bool:
        path = self._root / key
        with self._guard(key, "create"):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = _write_temp(path.parent, path.name, data)
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            finally:
                with contextlib.suppress(OSError):
                    tmp.unlink()
            _fsync_dir(path.parent)
            return True

    def _read_pointer(self) -> tuple[bytes | None, int]:
        data = self._read(LATEST)
        if data is None:
            return None, 0
        return data, LatestPointer.from_json_bytes(data, self._object_uri(LATEST)).serial

    def _swap_pointer(self, data: bytes, expected_generation: int) -> None:
        def check() -> None:
            _, generation = self._read_pointer()
            if generation != expected_generation:
                raise StoreConflict(
                    f"{self._object_uri(LATEST)} changed (serial {generation}, expected {expected_generation})"
                )

        self._replace_locked(LATEST, data, check)

    def _read_cas(self, key: str) -> tuple[bytes | None, int]:
        data = self._read(key)
        return (None, 0) if data is None else (data, _content_generation(data))

    def _swap_cas(self, key: str, data: bytes, expected_generation: int) -> None:
        def check() -> None:
            if self._read_cas(key)[1] != expected_generation:
                raise StoreConflict(f"{self._object_uri(key)} changed (expected generation {expected_generation})")

        self._replace_locked(key, data, check)

    def _replace_locked(self, key: str, data: bytes, check: Callable[[], None]) -> None:
        """Under an exclusive ``flock`` on ``<key>.lock``: ``check()`` (raises to refuse), then replace
        ``key`` atomically (temp file, fsync, rename)."""
        path = self._root / key
        with self._guard(key, "replace"):
            path.parent.mkdir(parents=True, exist_ok=True)
            with self._key_lock(key):
                check()
                tmp = _write_temp(path.parent, path.name, data)
                try:
                    os.replace(tmp, path)
                except BaseException:
                    with contextlib.suppress(OSError):
                        tmp.unlink()
                    raise
                _fsync_dir(path.parent)

    @contextlib.contextmanager
    def _key_lock(self, key: str) -> Iterator[None]:
        lock_path = self._root / f"{key}.lock"
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            deadline = time.monotonic() + self._lock_timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise StoreError(f"timed out after {self._lock_timeout:g}s waiting for {lock_path}") from None
                    time.sleep(0.005)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the lock

    def _list_version_names(self) -> list[str]:
        directory = self._root / VERSIONS_DIR
        with self._guard(VERSIONS_DIR, "list"):
            if not directory.is_dir():
                return []
            return [entry.name for entry in directory.iterdir() if (entry / PARAMS_FILE).is_file()]


@contextlib.contextmanager
def _translate_os_errors(uri: str, action: str) -> Iterator[None]:
    """Turn OSErrors into one-line StoreErrors naming the file (StoreErrors pass through)."""
    try:
        yield
    except StoreError:
        raise
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else one_line(exc, 300)
        if exc.errno in (errno.EACCES, errno.EPERM):
            reason = "permission denied"
        raise StoreError(f"cannot {action} {uri}: {reason}") from exc
