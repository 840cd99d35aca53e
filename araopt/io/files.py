"""Local files: written whole or not at all (temporary sibling, fsync, rename), read with a one-line error;
local inputs listed with symbolic links followed."""
from __future__ import annotations

import datetime as _dt
import glob
import os
from collections.abc import Callable, Iterable
from typing import IO, Any

from araopt.errors import InvalidInput, InvalidParameters


def atomic_write(path: str | os.PathLike[str], write: Callable[[IO[Any]], object], mode: str = "wb") -> str:
    """Call ``write(fh)`` on a temporary file beside ``path``, fsync it and rename it over ``path``.

    A reader sees the old file or the new one, never a partial one; on failure the temporary file is
    removed and ``path`` is untouched. ``mode`` is ``"wb"`` or ``"w"`` (UTF-8 text). Returns ``path``."""
    if mode not in ("wb", "w"):
        raise InvalidParameters(f"mode must be 'wb' or 'w', got {mode!r}")
    path = os.fspath(path)
    head, name = os.path.split(path)
    tmp = os.path.join(head, f".{name}.tmp-{os.getpid()}")
    try:
        with open(tmp, mode, encoding=None if mode == "wb" else "utf-8") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> str:
    """:func:`atomic_write` of ``data``."""
    return atomic_write(path, lambda fh: fh.write(data))


def read_bytes(path: str | os.PathLike[str], what: str) -> bytes:
    """The bytes of a local file; an unreadable one is a ``ValueError`` naming ``what`` and the path."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise InvalidInput(f"cannot read {what} {path}: {exc.strerror}") from None


def distinct_files(paths: Iterable[str]) -> list[str]:
    """``paths`` in order with every file once: a local file named twice (the same spelling, another
    spelling, a symlink or a hard link: one device and inode) is kept at its first name; remote
    (``scheme://``) names are compared as they are."""
    seen: set[Any] = set()
    out = []
    for path in paths:
        key: Any = path
        if "://" not in path or path.startswith("file://"):
            try:
                st = os.stat(path.removeprefix("file://"))
                key = (st.st_dev, st.st_ino)
            except OSError:  # unreadable: left to the reader, which says so
                key = os.path.realpath(path.removeprefix("file://"))
        if key not in seen:
            seen.add(key)
            out.append(path)
    return out


def local_files_below(pattern: str, suffix: str = ".parquet") -> dict[str, int]:
    """Local files a path or glob names, with their sizes: a file itself, and every file ending in
    ``suffix`` below a folder it names or matches, at any depth, **symbolic links to folders followed**
    (a folder of links to ``date=`` partitions is an input like any other; a link cycle is walked once).
    Names are built from ``pattern`` as written (the partition folders' names stay in them)."""
    if os.path.isdir(pattern):
        named = [pattern]
    elif glob.has_magic(pattern):
        named = sorted(glob.glob(pattern))
    else:
        named = [pattern] if os.path.exists(pattern) else []
    found: dict[str, int] = {}
    for path in named:
        if not os.path.isdir(path):
            found[path] = os.path.getsize(path)
            continue
        seen: set[str] = set()
        for folder, subfolders, names in os.walk(path, followlinks=True):
            real = os.path.realpath(folder)
            if real in seen:  # reached again through a link: its files are listed already
                subfolders[:] = []
                continue
            seen.add(real)
            subfolders.sort()
            for name in sorted(names):
                if name.endswith(suffix):
                    file = os.path.join(folder, name)
                    found[file] = os.path.getsize(file)
    return found


def micros_iso(micros: int | None) -> str | None:
    """ISO-8601 of a UTC time in microseconds (numpy's notation outside Python's years 1..9999)."""
    if micros is None:
        return None
    try:
        return (_dt.datetime(1970, 1, 1, tzinfo=_dt.UTC) + _dt.timedelta(microseconds=micros)).isoformat()
    except OverflowError:
        import numpy as np

        return f"{np.datetime64(micros, 'us')}+00:00"


def utc_now_iso() -> str:
    """Now, UTC, to the second, ISO 8601 (when a file or a record was made)."""
    return _dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat()
