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
release's row set (``araopt.io.rowset``) and, since coarse identities, its coarse row set (optional
entry fields ``coarse_row_set``, ``coarse_row_set_sha256``, ``coarse_row_set_bytes``; likewise
``minute_row_set`` since minute identities, and ``content_row_set`` for an attribution release since
content identities), content-addressed
and create-only. Of two racing recorders
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
import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from araopt.errors import AraoptError, InvalidInput, InvalidParameters, OutputRefused, one_line
from araopt.io import jsonio

__all__ = [
    "LATEST",
    "UNSET",
    "LatestPointer",
    "ParameterStore",
    "PublishedVersion",
    "ResolvedParams",
    "StoreConflict",
    "StoreError",
    "version_name",
]

LATEST: Final = "latest"
PARAMS_FILE: Final = "params.json"
CHECKSUM_FILE: Final = "params.json.sha256"
VERSIONS_DIR: Final = "versions"

_AS_OF_RE: Final = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_RUN_ID_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
VERSION_RE: Final = re.compile(r"^(\d{4}-\d{2}-\d{2})-([A-Za-z0-9][A-Za-z0-9._-]{0,127})$")
_SHA256_RE: Final = re.compile(r"^[0-9a-f]{64}$")
SCHEME_RE: Final = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
BUCKET_RE: Final = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
_POINTER_FIELDS: Final = ("version", "path", "sha256", "as_of", "run_id", "published_at", "previous", "serial")
CREDENTIALS_HELP: Final = (
    "run `gcloud auth application-default login` (or set GOOGLE_APPLICATION_CREDENTIALS), "
    "or set STORAGE_EMULATOR_HOST=http://HOST:PORT to use a GCS emulator"
)

T = TypeVar("T")


class StoreError(AraoptError):
    """A parameter store operation failed (a missing, corrupt or unreachable object); the message is one
    line and names the file involved."""


class StoreConflict(StoreError, OutputRefused):
    """Another publisher moved ``latest`` first (compare-and-swap lost); nothing was made latest."""


class _Unset(enum.Enum):
    TOKEN = 0


UNSET: Final = _Unset.TOKEN
"""Sentinel for ``publish(expected_previous=...)``: do not check what ``latest`` named at start."""



def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def version_name(as_of: str, run_id: str) -> str:
    """Return the version name ``<as_of>-<run_id>`` after validating both parts."""
    if not isinstance(as_of, str) or not _AS_OF_RE.fullmatch(as_of):
        raise InvalidParameters(f"as_of must be YYYY-MM-DD, got {as_of!r}")
    try:
        _dt.date.fromisoformat(as_of)
    except ValueError:
        raise InvalidParameters(f"as_of is not a calendar date: {as_of!r}") from None
    if not isinstance(run_id, str) or not _RUN_ID_RE.fullmatch(run_id):
        raise InvalidParameters(
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
            raise bad(f"not valid JSON ({one_line(exc, 80)}), possibly truncated") from None
        if not isinstance(body, dict):
            raise bad("not a JSON object")
        missing = [name for name in _POINTER_FIELDS if name not in body]
        if missing:
            raise bad(f"missing field(s) {', '.join(missing)}")
        version, sha, serial, previous = body["version"], body["sha256"], body["serial"], body["previous"]
        match = VERSION_RE.fullmatch(version) if isinstance(version, str) else None
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
        if previous is not None and (not isinstance(previous, str) or not VERSION_RE.fullmatch(previous)):
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
        return sorted(name for name in self._list_version_names() if VERSION_RE.fullmatch(name))

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
            raise InvalidInput(f"payload must be bytes, got {type(payload).__name__}")
        payload = bytes(payload)
        try:
            jsonio.loads(payload, "payload")
        except ValueError as exc:
            raise InvalidInput(f"payload is not UTF-8 JSON: {one_line(exc, 120)}") from None
        if validate is not None:
            try:
                validate(payload)
            except Exception as exc:  # noqa: BLE001 - any refusal of the validator means: do not publish
                raise InvalidInput(f"refusing to publish {version}: {one_line(exc, 200)}") from None
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
            if not isinstance(ref, str) or not VERSION_RE.fullmatch(ref):
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
            raise StoreError(f"params file {uri} is not valid JSON: {one_line(exc, 80)}") from None
        match = VERSION_RE.fullmatch(version)
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
            raise StoreError(f"corrupt release ledger {uri}: not valid JSON ({one_line(exc, 80)})") from None
        releases = body.get("releases") if isinstance(body, dict) else None
        if not isinstance(body, dict) or body.get("format") != LEDGER_FORMAT or not isinstance(releases, list):
            raise StoreError(f"corrupt release ledger {uri}: expected format {LEDGER_FORMAT} with a list of releases")
        for entry in releases:
            if not isinstance(entry, dict) or any(name not in entry for name in _LEDGER_ENTRY_FIELDS):
                raise StoreError(f"corrupt release ledger {uri}: an entry lacks one of {', '.join(_LEDGER_ENTRY_FIELDS)}")
        return releases, generation

    def read_row_set(self, entry: dict[str, Any], field: str = "row_set") -> bytes:
        """The row set a ledger entry names (``field``: ``row_set``, or ``coarse_row_set`` / ``minute_row_set``
        for the coarse / minute identities), checksum-verified."""
        key = entry[field]
        data = self._read(key)
        if data is None:
            raise StoreError(f"release ledger: row set {self._object_uri(key)} is missing (entry {entry['id']})")
        if _sha256(data) != entry[f"{field}_sha256"]:
            raise StoreError(f"release ledger: row set {self._object_uri(key)} does not match its sha256 (corrupt)")
        return data

    def append_release(self, entry: dict[str, Any], row_set: bytes | Callable[[], bytes], expected_generation: int,
                       coarse_row_set: bytes | Callable[[], bytes] | None = None,
                       minute_row_set: bytes | Callable[[], bytes] | None = None,
                       content_row_set: bytes | Callable[[], bytes] | None = None) -> dict[str, Any]:
        """Store ``row_set`` (and ``coarse_row_set`` and ``minute_row_set``, the coarse and minute
        identities, and ``content_row_set``, an attribution release's rows' content identities; create-only,
        named by their
        sha256) and append ``entry`` (with a unique ``id``) to the index iff the index is still at
        ``expected_generation`` (:class:`StoreConflict` otherwise: read and check again). Returns the
        entry as recorded. A row set may be given as a function that makes its bytes: then only one
        row set's bytes are held at a time (a large release's are hundreds of MB)."""
        recorded = dict(entry)
        for field, given in (("row_set", row_set), ("coarse_row_set", coarse_row_set),
                             ("minute_row_set", minute_row_set), ("content_row_set", content_row_set)):
            if given is None:
                continue
            data = given() if callable(given) else given
            sha = _sha256(data)
            key = _ledger_rows_key(sha)
            self._put_immutable(key, data)
            recorded.update({field: key, f"{field}_sha256": sha, f"{field}_bytes": len(data)})
            del data  # (before the next row set's bytes are made)
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


# ---------------------------------------------------------------------------------------------
# Google Cloud Storage
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Factory
# ---------------------------------------------------------------------------------------------


