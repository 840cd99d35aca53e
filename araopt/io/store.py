"""Versioned parameter store: immutable versions plus a compare-and-swap ``latest`` pointer.

Layout under a store root (a local directory or ``gs://BUCKET/PREFIX``)::

    versions/<as_of>-<run_id>/params.json          the parameter file, written once, never replaced
    versions/<as_of>-<run_id>/params.json.sha256   its checksum (``sha256sum`` format), written once
    latest                                         small JSON pointer, moved by compare-and-swap

Publishing writes the version files only if absent, then moves ``latest`` with a precondition on the
pointer's generation as read *before* the version was written (GCS: ``if_generation_match``; local:
a ``flock``-guarded check of a serial number kept inside the pointer). Of two racing publishers
exactly one moves the pointer; the other raises :class:`StoreConflict` and leaves the previous
version in force. Readers never see a partial file: versions are created atomically (temp file +
``link`` locally, single-request uploads on GCS) and the pointer is replaced atomically.

Release ledger: ``ledger/index.json`` lists every release (its conversion count, time window and
the sha256 of its row set) and is moved by compare-and-swap like ``latest`` (local: a ``flock`` and
the content's digest; GCS: the object generation); ``ledger/rows/<sha256>.parquet`` holds each
release's row set (``araopt.rowset``), content-addressed and create-only. Of two racing recorders
exactly one appends; the other re-reads the index and checks again.

Idempotency: publishing an as-of date whose payload is byte-identical to the one ``latest`` already
names is a no-op that returns the existing version, whatever the run id. A *different* payload for
the same as-of date (e.g. late data) is published as a new version and moves the pointer. Moving
``latest`` back to an older as-of date is refused unless ``allow_rollback=True``.

This module is engine-free: it imports neither Beam nor the parameter model.
"""
from __future__ import annotations

import abc
import contextlib
import datetime as _dt
import enum
import errno
import fcntl
import functools
import hashlib
import os
import re
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar, cast

from araopt.io import jsonio

if TYPE_CHECKING:  # pragma: no cover - typing only
    from google.cloud import storage

__all__ = [
    "LATEST",
    "UNSET",
    "GcsStore",
    "LatestPointer",
    "LocalStore",
    "ParameterStore",
    "PublishedVersion",
    "ResolvedParams",
    "StoreConflict",
    "StoreError",
    "make_gcs_client",
    "open_store",
    "parse_params_ref",
    "resolve_params_ref",
    "version_name",
]

LATEST: Final = "latest"
PARAMS_FILE: Final = "params.json"
CHECKSUM_FILE: Final = "params.json.sha256"
VERSIONS_DIR: Final = "versions"

_AS_OF_RE: Final = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_RUN_ID_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_VERSION_RE: Final = re.compile(r"^(\d{4}-\d{2}-\d{2})-([A-Za-z0-9][A-Za-z0-9._-]{0,127})$")
_SHA256_RE: Final = re.compile(r"^[0-9a-f]{64}$")
_SCHEME_RE: Final = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_BUCKET_RE: Final = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
_POINTER_FIELDS: Final = ("version", "path", "sha256", "as_of", "run_id", "published_at", "previous", "serial")
_CREDENTIALS_HELP: Final = (
    "run `gcloud auth application-default login` (or set GOOGLE_APPLICATION_CREDENTIALS), "
    "or set STORAGE_EMULATOR_HOST=http://HOST:PORT to use a GCS emulator"
)

T = TypeVar("T")


class StoreError(Exception):
    """A parameter store operation failed; the message is one line and names the file involved."""


class StoreConflict(StoreError):
    """Another publisher moved ``latest`` first (compare-and-swap lost); nothing was made latest."""


class _Unset(enum.Enum):
    TOKEN = 0


UNSET: Final = _Unset.TOKEN
"""Sentinel for ``publish(expected_previous=...)``: do not check what ``latest`` named at start."""


def _one_line(text: object, limit: int = 300) -> str:
    """Collapse an error text to one short line."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def version_name(as_of: str, run_id: str) -> str:
    """Return the version name ``<as_of>-<run_id>`` after validating both parts."""
    if not isinstance(as_of, str) or not _AS_OF_RE.fullmatch(as_of):
        raise ValueError(f"as_of must be YYYY-MM-DD, got {as_of!r}")
    try:
        _dt.date.fromisoformat(as_of)
    except ValueError:
        raise ValueError(f"as_of is not a calendar date: {as_of!r}") from None
    if not isinstance(run_id, str) or not _RUN_ID_RE.fullmatch(run_id):
        raise ValueError(
            f"run_id must be 1-128 characters of [A-Za-z0-9._-] starting with a letter or digit, got {run_id!r}"
        )
    return f"{as_of}-{run_id}"


def _params_key(version: str) -> str:
    return f"{VERSIONS_DIR}/{version}/{PARAMS_FILE}"


def _checksum_key(version: str) -> str:
    return f"{VERSIONS_DIR}/{version}/{CHECKSUM_FILE}"


LEDGER_DIR: Final = "ledger"
LEDGER_INDEX: Final = f"{LEDGER_DIR}/index.json"
LEDGER_FORMAT: Final = "araopt-ledger/2"
_LEDGER_ENTRY_FIELDS: Final = ("id", "row_set", "row_set_sha256", "rows", "first_time_us", "last_time_us")


def _ledger_rows_key(sha: str) -> str:
    return f"{LEDGER_DIR}/rows/{sha}.parquet"


@dataclass(frozen=True)
class LatestPointer:
    """The content of the ``latest`` pointer file."""

    version: str
    path: str
    sha256: str
    as_of: str
    run_id: str
    published_at: str
    previous: str | None
    serial: int

    def to_json_bytes(self) -> bytes:
        """Serialize deterministically (sorted keys, trailing newline)."""
        body = {name: getattr(self, name) for name in _POINTER_FIELDS}
        return (jsonio.dumps(body, indent=2, sort_keys=True) + "\n").encode("utf-8")

    @classmethod
    def from_json_bytes(cls, data: bytes, uri: str) -> LatestPointer:
        """Parse and validate pointer bytes; any defect raises :class:`StoreError` naming ``uri``."""

        def bad(reason: str) -> StoreError:
            return StoreError(
                f"corrupt latest pointer {uri}: {reason}; "
                "delete it (the next publish recreates it) or restore a good copy"
            )

        try:
            body = jsonio.loads(data, uri)
        except ValueError as exc:
            raise bad(f"not valid JSON ({_one_line(exc, 80)}), possibly truncated") from None
        if not isinstance(body, dict):
            raise bad("not a JSON object")
        missing = [name for name in _POINTER_FIELDS if name not in body]
        if missing:
            raise bad(f"missing field(s) {', '.join(missing)}")
        version, sha, serial, previous = body["version"], body["sha256"], body["serial"], body["previous"]
        match = _VERSION_RE.fullmatch(version) if isinstance(version, str) else None
        if match is None:
            raise bad(f"invalid version {version!r}")
        if body["as_of"] != match.group(1) or body["run_id"] != match.group(2):
            raise bad(f"as_of/run_id do not match version {version!r}")
        if body["path"] != _params_key(version):
            raise bad(f"path {body['path']!r} is not {_params_key(version)!r}")
        if not isinstance(sha, str) or not _SHA256_RE.fullmatch(sha):
            raise bad("sha256 is not 64 lowercase hex digits")
        if isinstance(serial, bool) or not isinstance(serial, int) or serial < 1:
            raise bad(f"serial {serial!r} is not a positive integer")
        if previous is not None and (not isinstance(previous, str) or not _VERSION_RE.fullmatch(previous)):
            raise bad(f"invalid previous {previous!r}")
        if not isinstance(body["published_at"], str):
            raise bad("published_at is not a string")
        return cls(
            version=version,
            path=body["path"],
            sha256=sha,
            as_of=body["as_of"],
            run_id=body["run_id"],
            published_at=body["published_at"],
            previous=previous,
            serial=serial,
        )


@dataclass(frozen=True)
class PublishedVersion:
    """Outcome of :meth:`ParameterStore.publish`.

    ``created`` is False when the version files already existed with identical bytes; ``moved`` is
    False when ``latest`` already named this payload for this as-of date (idempotent re-run).
    """

    version: str
    uri: str
    sha256: str
    pointer: LatestPointer
    created: bool
    moved: bool


@dataclass(frozen=True)
class ResolvedParams:
    """A parameter file read from a store, checksum-verified."""

    store: str
    ref: str
    version: str
    payload: bytes
    sha256: str
    uri: str
    as_of: str
    run_id: str

    def summary(self) -> dict[str, str]:
        """What a job records in run_summary.json about the parameters it used."""
        return {
            "store": self.store,
            "ref": self.ref,
            "version": self.version,
            "sha256": self.sha256,
            "uri": self.uri,
            "as_of": self.as_of,
            "run_id": self.run_id,
        }


class ParameterStore(abc.ABC):
    """Immutable parameter versions plus a compare-and-swap ``latest`` pointer.

    Subclasses implement six storage primitives; the publish/resolve protocol lives here so both
    backends behave the same.
    """

    @property
    @abc.abstractmethod
    def uri(self) -> str:
        """The store's root URI (as given to :func:`open_store`)."""

    # -- storage primitives -------------------------------------------------------------------
    @abc.abstractmethod
    def _object_uri(self, key: str) -> str:
        """Human-readable URI of an object (used in every error message)."""

    @abc.abstractmethod
    def _read(self, key: str) -> bytes | None:
        """Return an object's bytes, or None if it does not exist."""

    @abc.abstractmethod
    def _create(self, key: str, data: bytes) -> bool:
        """Atomically create an object if absent; return False (writing nothing) if it exists."""

    @abc.abstractmethod
    def _read_pointer(self) -> tuple[bytes | None, int]:
        """Return the pointer's bytes (None if absent) and its generation (0 if absent)."""

    @abc.abstractmethod
    def _swap_pointer(self, data: bytes, expected_generation: int) -> None:
        """Atomically replace the pointer iff its generation is still ``expected_generation``.

        Raises :class:`StoreConflict` when the precondition fails.
        """

    @abc.abstractmethod
    def _list_version_names(self) -> list[str]:
        """Names of versions whose params file exists (unsorted)."""

    @abc.abstractmethod
    def _read_cas(self, key: str) -> tuple[bytes | None, int]:
        """An object moved by compare-and-swap: its bytes (None if absent) and generation (0 if absent)."""

    @abc.abstractmethod
    def _swap_cas(self, key: str, data: bytes, expected_generation: int) -> None:
        """Replace (or create, for generation 0) ``key`` iff its generation is still ``expected_generation``;
        :class:`StoreConflict` otherwise."""

    # -- public API ---------------------------------------------------------------------------
    def read_latest_pointer(self) -> LatestPointer | None:
        """Return the current ``latest`` pointer, or None if nothing was published yet."""
        data, _ = self._read_pointer()
        return None if data is None else LatestPointer.from_json_bytes(data, self._object_uri(LATEST))

    def list_versions(self) -> list[str]:
        """All published version names (including ones that never became latest), sorted."""
        return sorted(name for name in self._list_version_names() if _VERSION_RE.fullmatch(name))

    def publish(
        self,
        as_of: str,
        run_id: str,
        payload: bytes,
        *,
        expected_previous: str | None | _Unset = UNSET,
        allow_rollback: bool = False,
        validate: Callable[[bytes], object] | None = None,
    ) -> PublishedVersion:
        """Write ``versions/<as_of>-<run_id>/params.json`` if absent, then move ``latest`` to it.

        ``expected_previous``: the version ``latest`` named when the job started (None: nothing was
        published). If given and ``latest`` has moved since, :class:`StoreConflict` is raised before
        anything is written, so a retried publish step of a job that lost a race keeps losing.
        ``validate``: called with the payload before anything is written (e.g. ``Params.from_bytes``,
        which refuses an epsilon outside [2^-20, 64]); whatever it raises is raised as ValueError.
        Raises ValueError for bad arguments, :class:`StoreConflict` when another publisher moved the
        pointer first, :class:`StoreError` for anything else (the previous latest stays in force).
        """
        version = version_name(as_of, run_id)
        if not isinstance(payload, bytes | bytearray):
            raise ValueError(f"payload must be bytes, got {type(payload).__name__}")
        payload = bytes(payload)
        try:
            jsonio.loads(payload, "payload")
        except ValueError as exc:
            raise ValueError(f"payload is not UTF-8 JSON: {_one_line(exc, 120)}") from None
        if validate is not None:
            try:
                validate(payload)
            except Exception as exc:  # noqa: BLE001 - any refusal of the validator means: do not publish
                raise ValueError(f"refusing to publish {version}: {_one_line(exc, 200)}") from None
        sha = _sha256(payload)
        pointer_uri = self._object_uri(LATEST)
        params_key = _params_key(version)

        current_raw, generation = self._read_pointer()
        current = None if current_raw is None else LatestPointer.from_json_bytes(current_raw, pointer_uri)
        if current is not None and current.as_of == as_of and current.sha256 == sha:
            return PublishedVersion(
                version=current.version,
                uri=self._object_uri(current.path),
                sha256=sha,
                pointer=current,
                created=False,
                moved=False,
            )
        current_version = None if current is None else current.version
        if expected_previous is not UNSET and current_version != expected_previous:
            raise StoreConflict(
                f"{pointer_uri} names {current_version or 'nothing'} but this job started from "
                f"{expected_previous or 'nothing'}: another publisher moved it; not publishing {version}"
            )
        if current is not None and as_of < current.as_of and not allow_rollback:
            raise StoreError(
                f"refusing to move {pointer_uri} from as-of {current.as_of} back to {as_of} "
                "(pass allow_rollback=True to roll back on purpose)"
            )

        created = self._put_immutable(params_key, payload)
        self._put_immutable(_checksum_key(version), f"{sha}  {PARAMS_FILE}\n".encode("ascii"))

        new = LatestPointer(
            version=version,
            path=params_key,
            sha256=sha,
            as_of=as_of,
            run_id=run_id,
            published_at=_dt.datetime.now(_dt.UTC).isoformat(timespec="microseconds"),
            previous=current_version,
            serial=(0 if current is None else current.serial) + 1,
        )
        new_raw = new.to_json_bytes()
        try:
            self._swap_pointer(new_raw, generation)
        except StoreConflict:
            # A retried request whose first attempt succeeded also fails its precondition: check.
            now_raw, _ = self._read_pointer()
            if now_raw != new_raw:
                winner = "an unreadable pointer"
                if now_raw is not None:
                    with contextlib.suppress(StoreError):
                        winner = LatestPointer.from_json_bytes(now_raw, pointer_uri).version
                raise StoreConflict(
                    f"{pointer_uri} was moved to {winner} by another publisher while publishing {version}; "
                    f"{version} was written but is not latest"
                ) from None
        return PublishedVersion(
            version=version, uri=self._object_uri(params_key), sha256=sha, pointer=new, created=created, moved=True
        )

    def resolve(self, ref: str = LATEST) -> ResolvedParams:
        """Read ``latest`` (or a named version), verify its checksum and return its bytes.

        A missing, corrupt, truncated or unparsable pointer, params file or checksum file raises
        :class:`StoreError` naming that file.
        """
        if ref == LATEST:
            pointer = self.read_latest_pointer()
            if pointer is None:
                raise StoreError(f"nothing published yet: {self._object_uri(LATEST)} does not exist")
            version, expected, source = pointer.version, pointer.sha256, self._object_uri(LATEST)
        else:
            if not isinstance(ref, str) or not _VERSION_RE.fullmatch(ref):
                raise StoreError(
                    f"invalid version name {ref!r} for store {self.uri} (expected YYYY-MM-DD-RUNID or 'latest')"
                )
            version = ref
            expected, source = self._read_checksum(version), self._object_uri(_checksum_key(version))
        key = _params_key(version)
        uri = self._object_uri(key)
        data = self._read(key)
        if data is None:
            raise StoreError(f"params file {uri} is missing (referenced by {source})")
        actual = _sha256(data)
        if actual != expected:
            raise StoreError(
                f"checksum mismatch for {uri}: {source} records sha256 {expected} but the file "
                f"({len(data)} bytes) has {actual}; the file is corrupt or truncated"
            )
        try:
            jsonio.loads(data, uri)
        except ValueError as exc:
            raise StoreError(f"params file {uri} is not valid JSON: {_one_line(exc, 80)}") from None
        match = _VERSION_RE.fullmatch(version)
        assert match is not None
        return ResolvedParams(
            store=self.uri,
            ref=ref,
            version=version,
            payload=data,
            sha256=actual,
            uri=uri,
            as_of=match.group(1),
            run_id=match.group(2),
        )

    # -- release ledger ------------------------------------------------------------------------
    def read_ledger(self) -> tuple[list[dict[str, Any]], int]:
        """The releases the ledger records (oldest first) and the index's generation (for
        :meth:`append_release`); a corrupt index raises :class:`StoreError` naming it."""
        raw, generation = self._read_cas(LEDGER_INDEX)
        if raw is None:
            return [], 0
        uri = self._object_uri(LEDGER_INDEX)
        try:
            body = jsonio.loads(raw, uri)
        except ValueError as exc:
            raise StoreError(f"corrupt release ledger {uri}: not valid JSON ({_one_line(exc, 80)})") from None
        releases = body.get("releases") if isinstance(body, dict) else None
        if not isinstance(body, dict) or body.get("format") != LEDGER_FORMAT or not isinstance(releases, list):
            raise StoreError(f"corrupt release ledger {uri}: expected format {LEDGER_FORMAT} with a list of releases")
        for entry in releases:
            if not isinstance(entry, dict) or any(name not in entry for name in _LEDGER_ENTRY_FIELDS):
                raise StoreError(f"corrupt release ledger {uri}: an entry lacks one of {', '.join(_LEDGER_ENTRY_FIELDS)}")
        return releases, generation

    def read_row_set(self, entry: dict[str, Any]) -> bytes:
        """The row set a ledger entry names, checksum-verified."""
        key = entry["row_set"]
        data = self._read(key)
        if data is None:
            raise StoreError(f"release ledger: row set {self._object_uri(key)} is missing (entry {entry['id']})")
        if _sha256(data) != entry["row_set_sha256"]:
            raise StoreError(f"release ledger: row set {self._object_uri(key)} does not match its sha256 (corrupt)")
        return data

    def append_release(self, entry: dict[str, Any], row_set: bytes, expected_generation: int) -> dict[str, Any]:
        """Store ``row_set`` (create-only, named by its sha256) and append ``entry`` (with a unique ``id``)
        to the index iff the index is still at ``expected_generation`` (:class:`StoreConflict` otherwise:
        read and check again). Returns the entry as recorded."""
        sha = _sha256(row_set)
        key = _ledger_rows_key(sha)
        self._put_immutable(key, row_set)
        recorded = {**entry, "row_set": key, "row_set_sha256": sha, "row_set_bytes": len(row_set)}
        releases, generation = self.read_ledger()
        if generation != expected_generation:
            raise StoreConflict(f"{self._object_uri(LEDGER_INDEX)} changed while this release was checked")
        try:
            self._swap_cas(LEDGER_INDEX, _ledger_bytes([*releases, recorded]), generation)
        except StoreConflict:
            # A retried request whose first attempt succeeded also fails its precondition: check.
            if not any(e["id"] == recorded["id"] for e in self.read_ledger()[0]):
                raise
        return recorded

    def remove_release(self, release_id: str, attempts: int = 10) -> None:
        """Take an entry out of the index again (a release recorded but then not committed)."""
        for _ in range(attempts):
            releases, generation = self.read_ledger()
            kept = [e for e in releases if e["id"] != release_id]
            if len(kept) == len(releases):
                return
            try:
                self._swap_cas(LEDGER_INDEX, _ledger_bytes(kept), generation)
                return
            except StoreConflict:
                continue
        raise StoreError(f"could not remove release {release_id} from {self._object_uri(LEDGER_INDEX)}: it kept changing")

    # -- helpers ------------------------------------------------------------------------------
    def _put_immutable(self, key: str, data: bytes) -> bool:
        """Create ``key`` if absent; accept an existing identical object; refuse a different one."""
        if self._create(key, data):
            return True
        existing = self._read(key)
        if existing != data:
            raise StoreError(
                f"{self._object_uri(key)} already exists with different content; versions are immutable "
                "(publish under a new run id)"
            )
        return False

    def _read_checksum(self, version: str) -> str:
        key = _checksum_key(version)
        uri = self._object_uri(key)
        raw = self._read(key)
        if raw is None:
            if self._read(_params_key(version)) is None:
                raise StoreError(f"version {version} not found in store {self.uri}")
            raise StoreError(f"checksum file {uri} is missing (incomplete publish?)")
        fields = raw.decode("ascii", errors="replace").split()
        if len(fields) != 2 or not _SHA256_RE.fullmatch(fields[0]) or fields[1] != PARAMS_FILE:
            raise StoreError(f"corrupt checksum file {uri}: expected '<sha256>  {PARAMS_FILE}'")
        return fields[0]


def _ledger_bytes(releases: list[dict[str, Any]]) -> bytes:
    return (jsonio.dumps({"format": LEDGER_FORMAT, "releases": releases}, indent=1, sort_keys=True) + "\n").encode()


# ---------------------------------------------------------------------------------------------
# Local filesystem
# ---------------------------------------------------------------------------------------------


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
        reason = os.strerror(exc.errno) if exc.errno else _one_line(exc)
        if exc.errno in (errno.EACCES, errno.EPERM):
            reason = "permission denied"
        raise StoreError(f"cannot {action} {uri}: {reason}") from exc


# ---------------------------------------------------------------------------------------------
# Google Cloud Storage
# ---------------------------------------------------------------------------------------------


def _describe(exc: BaseException) -> str:
    """Short description of a transport error (requests' messages embed whole URLs)."""
    text = str(exc)
    endpoint = re.search(r"host='([^']+)', port=(\d+)", text)
    if endpoint and "ConnectionError" in type(exc).__name__:
        return f"{type(exc).__name__}: cannot connect to {endpoint.group(1)}:{endpoint.group(2)}"
    return f"{type(exc).__name__}: {_one_line(text, 160)}"


def make_gcs_client(project: str | None = None) -> storage.Client:
    """Create a google-cloud-storage client, or raise a one-line StoreError about credentials.

    With ``STORAGE_EMULATOR_HOST`` set, an anonymous client is used (the emulator needs no
    credentials, and none are looked up).
    """
    from google.cloud import storage  # keep import cost off local-only runs

    if os.environ.get("STORAGE_EMULATOR_HOST"):
        from google.auth.credentials import AnonymousCredentials

        return storage.Client(
            credentials=AnonymousCredentials(),
            project=project or os.environ.get("GOOGLE_CLOUD_PROJECT") or "test",
        )
    from google.auth import exceptions as auth_exceptions

    try:
        return storage.Client(project=project)
    except auth_exceptions.DefaultCredentialsError as exc:
        raise StoreError(
            f"no Google Cloud credentials for gs:// stores ({_one_line(exc, 120)}): {_CREDENTIALS_HELP}"
        ) from None
    except auth_exceptions.GoogleAuthError as exc:
        raise StoreError(f"cannot load Google Cloud credentials ({_one_line(exc, 160)}): {_CREDENTIALS_HELP}") from None


class GcsStore(ParameterStore):
    """A store under ``gs://BUCKET/PREFIX`` on google-cloud-storage.

    Versions are uploaded with ``if_generation_match=0`` (create only); ``latest`` with
    ``if_generation_match=<generation read before the version was written>`` (0 if absent). An HTTP
    412 becomes :class:`StoreConflict`. Every other failure (network, permission, emulator down
    after ``retry_deadline`` seconds of retries) becomes a one-line :class:`StoreError`.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        client: storage.Client | None = None,
        timeout: float = 30.0,
        retry_deadline: float = 60.0,
    ) -> None:
        from google.cloud.storage.retry import DEFAULT_RETRY

        prefix = prefix.strip("/")
        self._bucket_name = bucket
        self._prefix = f"{prefix}/" if prefix else ""
        self._client = client if client is not None else make_gcs_client()
        self._bucket = self._client.bucket(bucket)
        self._timeout = timeout
        self._retry = DEFAULT_RETRY.with_timeout(retry_deadline)

    @property
    def uri(self) -> str:
        return f"gs://{self._bucket_name}/{self._prefix}".rstrip("/")

    def _object_uri(self, key: str) -> str:
        return f"gs://{self._bucket_name}/{self._prefix}{key}"

    def _call(self, key: str, action: str, fn: Callable[[], T]) -> T:
        """Run one client call, translating library errors into one-line StoreErrors."""
        from google.api_core import exceptions as api
        from google.auth import exceptions as auth_exceptions
        from google.cloud.storage import exceptions as storage_exceptions

        uri = self._object_uri(key)
        try:
            return fn()
        except (StoreError, api.PreconditionFailed, api.NotFound):
            raise
        except api.Forbidden as exc:
            raise StoreError(f"permission denied to {action} {uri}: {_one_line(exc.message, 160)}") from exc
        except api.Unauthorized as exc:
            raise StoreError(f"not authorized to {action} {uri}: {_CREDENTIALS_HELP}") from exc
        except api.GoogleAPICallError as exc:
            raise StoreError(f"cannot {action} {uri}: HTTP {exc.code}: {_one_line(exc.message, 160)}") from exc
        except api.RetryError as exc:
            cause = exc.cause if exc.cause is not None else exc
            raise StoreError(f"cannot {action} {uri}: gave up retrying ({_describe(cause)})") from exc
        except auth_exceptions.GoogleAuthError as exc:
            raise StoreError(
                f"cannot {action} {uri}: credentials failed ({_one_line(exc, 120)}): {_CREDENTIALS_HELP}"
            ) from exc
        except (OSError, storage_exceptions.InvalidResponse, storage_exceptions.DataCorruption) as exc:
            # requests' ConnectionError/Timeout are OSErrors; DataCorruption: download checksum failed.
            raise StoreError(f"cannot {action} {uri}: {_describe(exc)}") from exc

    def _bucket_missing(self, key: str, action: str) -> StoreError:
        return StoreError(f"cannot {action} {self._object_uri(key)}: bucket {self._bucket_name} not found")

    def _read(self, key: str) -> bytes | None:
        from google.api_core import exceptions as api

        blob = self._bucket.blob(self._prefix + key)
        try:
            return cast(bytes | None, self._call(
                key, "read", lambda: blob.download_as_bytes(retry=self._retry, timeout=self._timeout)))
        except api.NotFound:
            return None

    def _create(self, key: str, data: bytes) -> bool:
        from google.api_core import exceptions as api

        blob = self._bucket.blob(self._prefix + key)
        content_type = ("application/json" if key.endswith(".json")
                        else "application/octet-stream" if key.endswith(".parquet") else "text/plain")
        try:
            self._call(
                key,
                "create",
                lambda: blob.upload_from_string(
                    data, content_type=content_type, if_generation_match=0, retry=self._retry, timeout=self._timeout
                ),
            )
        except api.PreconditionFailed:
            return False
        except api.NotFound as exc:
            raise self._bucket_missing(key, "create") from exc
        return True

    def _read_pointer(self) -> tuple[bytes | None, int]:
        return self._read_cas(LATEST)

    def _swap_pointer(self, data: bytes, expected_generation: int) -> None:
        self._swap_cas(LATEST, data, expected_generation)

    def _read_cas(self, key: str) -> tuple[bytes | None, int]:
        from google.api_core import exceptions as api

        name = self._prefix + key
        for _ in range(5):
            try:
                blob = self._call(
                    key, "read", lambda: self._bucket.get_blob(name, retry=self._retry, timeout=self._timeout)
                )
            except api.NotFound as exc:
                raise self._bucket_missing(key, "read") from exc
            if blob is None:
                return None, 0
            generation = int(blob.generation)
            try:
                data = self._call(key, "read", functools.partial(self._download_generation, blob, generation))
            except (api.PreconditionFailed, api.NotFound):
                continue  # replaced between the metadata and the media request: read again
            return data, generation
        raise StoreError(f"cannot read {self._object_uri(key)}: it kept changing during 5 attempts")

    def _download_generation(self, blob: storage.Blob, generation: int) -> bytes:
        return cast(bytes, blob.download_as_bytes(if_generation_match=generation, retry=self._retry, timeout=self._timeout))

    def _swap_cas(self, key: str, data: bytes, expected_generation: int) -> None:
        from google.api_core import exceptions as api

        blob = self._bucket.blob(self._prefix + key)
        blob.cache_control = "no-store"
        try:
            self._call(
                key,
                "replace",
                lambda: blob.upload_from_string(
                    data,
                    content_type="application/json",
                    if_generation_match=expected_generation,
                    retry=self._retry,
                    timeout=self._timeout,
                ),
            )
        except api.PreconditionFailed:
            raise StoreConflict(
                f"{self._object_uri(key)} changed (generation is no longer {expected_generation})"
            ) from None
        except api.NotFound as exc:
            raise self._bucket_missing(key, "replace") from exc

    def _list_version_names(self) -> list[str]:
        from google.api_core import exceptions as api

        start = f"{self._prefix}{VERSIONS_DIR}/"
        suffix = f"/{PARAMS_FILE}"

        def names() -> list[str]:
            blobs = self._client.list_blobs(
                self._bucket_name, prefix=start, retry=self._retry, timeout=self._timeout
            )
            return [b.name[len(start) : -len(suffix)] for b in blobs if b.name.endswith(suffix)]

        try:
            found = self._call(VERSIONS_DIR, "list", names)
        except api.NotFound as exc:
            raise self._bucket_missing(VERSIONS_DIR, "list") from exc
        return [name for name in found if "/" not in name]


# ---------------------------------------------------------------------------------------------
# Factory
# ---------------------------------------------------------------------------------------------


def open_store(
    uri: str,
    *,
    gcs_client: storage.Client | None = None,
    gcs_timeout: float = 30.0,
    gcs_retry_deadline: float = 60.0,
) -> ParameterStore:
    """Open a store: a local path or ``file://PATH`` → :class:`LocalStore`, ``gs://BUCKET/PREFIX`` →
    :class:`GcsStore`. Any other scheme raises ValueError; missing GCS credentials raise a one-line
    :class:`StoreError`. Both happen before any data is touched.
    """
    if not isinstance(uri, str) or not uri.strip():
        raise ValueError("store URI is empty")
    match = _SCHEME_RE.match(uri)
    if match is None:
        return LocalStore(uri)
    scheme = match.group(1).lower()
    parsed = urllib.parse.urlparse(uri)
    if scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise ValueError(f"file:// store URI must name a local path (file:///abs/path), got {uri!r}")
        path = urllib.parse.unquote(parsed.path)
        if not path:
            raise ValueError(f"file:// store URI has no path: {uri!r}")
        return LocalStore(path)
    if scheme == "gs":
        bucket = parsed.netloc
        if not _BUCKET_RE.fullmatch(bucket):
            raise ValueError(f"invalid bucket name {bucket!r} in store URI {uri!r} (expected gs://BUCKET/PREFIX)")
        client = gcs_client if gcs_client is not None else make_gcs_client()
        return GcsStore(bucket, parsed.path, client=client, timeout=gcs_timeout, retry_deadline=gcs_retry_deadline)
    raise ValueError(
        f"unknown store scheme {scheme!r} in {uri!r}: use a local path, file:///PATH or gs://BUCKET/PREFIX"
    )


def parse_params_ref(uri: str) -> tuple[str, str]:
    """Split a ``--params`` store reference into (store URI, ref).

    ``STORE`` → (STORE, "latest"); ``STORE/versions/<version>`` or
    ``STORE/versions/<version>/params.json`` → (STORE, "<version>"). A plain parameter file that
    is not in a store is the caller's business (check for it first).
    """
    trimmed = uri.rstrip("/")
    if trimmed.endswith("/" + PARAMS_FILE):
        trimmed = trimmed[: -len(PARAMS_FILE) - 1]
    head, sep, name = trimmed.rpartition("/")
    if not sep or not _VERSION_RE.fullmatch(name):
        return uri, LATEST
    store, sep, versions = head.rpartition("/")
    if versions != VERSIONS_DIR:
        return uri, LATEST
    if not sep:
        return ".", name  # "versions/<name>" relative to the working directory
    if store.endswith(":/"):  # "gs://bucket/versions/<name>" split inside "gs://"
        return uri, LATEST
    return store or "/", name


def resolve_params_ref(uri: str, **open_kwargs: Any) -> ResolvedParams:
    """Open the store named by a ``--params`` value and resolve ``latest`` or the named version."""
    store_uri, ref = parse_params_ref(uri)
    return open_store(store_uri, **open_kwargs).resolve(ref)
