"""The one Cloud Storage adapter: every driver-side gs:// access of araopt (the parameter store and
release ledger, the commit leases, the output folders) goes through :class:`GcsPrefix`, the objects
under one ``gs://BUCKET/PREFIX``, on the google-cloud-storage client.

What it offers is what the release-integrity contracts need and Beam's file IO does not:
create-only objects (``if_generation_match=0``), a read that returns the generation it read, a
compare-and-swap on that generation, and a delete on a generation. Every failure other than the
precondition outcomes (which the methods return as ``False`` / ``None``) becomes a one-line
:class:`araopt.io.store.StoreError` naming the object. Beam workers read and write gs:// through Beam's
own IO (``transforms/``); that is the engine's file layer, not a wrapper of araopt's.

With ``STORAGE_EMULATOR_HOST`` set the client is anonymous (tests run on the emulators of
``tests/gcs_fixtures.py``: gcp-storage-emulator for Beam IO, fake-gcs-server for preconditions).
"""
from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar, cast

from araopt.errors import InvalidParameters, one_line
from araopt.io.store import CREDENTIALS_HELP, StoreError

if TYPE_CHECKING:  # typing only
    from google.cloud import storage

R = TypeVar("R")
SCHEME = "gs://"


def is_gs(uri: str) -> bool:
    return str(uri).startswith(SCHEME)


def split_gs(uri: str) -> tuple[str, str]:
    """``gs://bucket/key`` -> (bucket, key)."""
    if not is_gs(uri):
        raise InvalidParameters(f"not a gs:// URI: {uri!r}")
    bucket, _, key = uri[len(SCHEME):].partition("/")
    if not bucket or not key:
        raise InvalidParameters(f"a gs:// object URI needs a bucket and a name: {uri!r}")
    return bucket, key


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
            f"no Google Cloud credentials for gs:// stores ({one_line(exc, 120)}): {CREDENTIALS_HELP}"
        ) from None
    except auth_exceptions.GoogleAuthError as exc:
        raise StoreError(f"cannot load Google Cloud credentials ({one_line(exc, 160)}): {CREDENTIALS_HELP}") from None


def _describe(exc: BaseException) -> str:
    """Short description of a transport error (requests' messages embed whole URLs)."""
    text = str(exc)
    endpoint = re.search(r"host='([^']+)', port=(\d+)", text)
    if endpoint and "ConnectionError" in type(exc).__name__:
        return f"{type(exc).__name__}: cannot connect to {endpoint.group(1)}:{endpoint.group(2)}"
    return f"{type(exc).__name__}: {one_line(text, 160)}"


def _content_type(name: str) -> str:
    if name.endswith(".json"):
        return "application/json"
    if name.endswith(".html"):
        return "text/html"
    if name.endswith(".png"):
        return "image/png"
    if name.endswith((".parquet", ".avro", ".arrow", ".pkl")):
        return "application/octet-stream"
    return "text/plain"


class GcsPrefix:
    """The objects under ``gs://BUCKET/PREFIX`` (names relative to the prefix; ``""`` prefix: the bucket).

    ``timeout`` bounds each request, ``retry_deadline`` the client's retries of transient failures."""

    def __init__(self, uri: str, *, client: storage.Client | None = None, timeout: float = 30.0,
                 retry_deadline: float = 60.0) -> None:
        from google.cloud.storage.retry import DEFAULT_RETRY

        if not is_gs(uri):
            raise InvalidParameters(f"not a gs:// URI: {uri!r}")
        bucket, _, prefix = uri[len(SCHEME):].partition("/")
        if not bucket:
            raise InvalidParameters(f"a gs:// URI needs a bucket: {uri!r}")
        prefix = prefix.strip("/")
        self.bucket_name = bucket
        self._prefix = f"{prefix}/" if prefix else ""
        self._client = client if client is not None else make_gcs_client()
        self._bucket = self._client.bucket(bucket)
        self._timeout = timeout
        self._retry = DEFAULT_RETRY.with_timeout(retry_deadline)

    @classmethod
    def parent_of(cls, uri: str, **kwargs: object) -> tuple[GcsPrefix, str]:
        """(the prefix holding the object ``uri``, the object's name in it)."""
        parent, name = uri.rstrip("/").rsplit("/", 1)
        if parent == "gs:/":
            raise InvalidParameters(f"a gs:// object URI needs a bucket and a name: {uri!r}")
        return cls(parent, **kwargs), name  # type: ignore[arg-type]

    @property
    def uri(self) -> str:
        return f"{SCHEME}{self.bucket_name}/{self._prefix}".rstrip("/")

    def object_uri(self, name: str) -> str:
        return f"{SCHEME}{self.bucket_name}/{self._prefix}{name}"

    def child(self, name: str) -> GcsPrefix:
        """The objects under ``name/`` of this prefix, on the same client."""
        return GcsPrefix(self.object_uri(name), client=self._client, timeout=self._timeout)

    # ---- error translation ----------------------------------------------------------------------
    def _call(self, name: str, action: str, fn: Callable[[], R]) -> R:
        """Run one client call, translating library errors into one-line StoreErrors (preconditions and
        NotFound pass through for the caller to turn into an outcome)."""
        from google.api_core import exceptions as api
        from google.auth import exceptions as auth_exceptions
        from google.cloud.storage import exceptions as storage_exceptions

        uri = self.object_uri(name)
        try:
            return fn()
        except (StoreError, api.PreconditionFailed, api.NotFound):
            raise
        except api.Forbidden as exc:
            raise StoreError(f"permission denied to {action} {uri}: {one_line(exc.message, 160)}") from exc
        except api.Unauthorized as exc:
            raise StoreError(f"not authorized to {action} {uri}: {CREDENTIALS_HELP}") from exc
        except api.GoogleAPICallError as exc:
            raise StoreError(f"cannot {action} {uri}: HTTP {exc.code}: {one_line(exc.message, 160)}") from exc
        except api.RetryError as exc:
            cause = exc.cause if exc.cause is not None else exc
            raise StoreError(f"cannot {action} {uri}: gave up retrying ({_describe(cause)})") from exc
        except auth_exceptions.GoogleAuthError as exc:
            raise StoreError(
                f"cannot {action} {uri}: credentials failed ({one_line(exc, 120)}): {CREDENTIALS_HELP}"
            ) from exc
        except (OSError, storage_exceptions.InvalidResponse, storage_exceptions.DataCorruption) as exc:
            # requests' ConnectionError/Timeout are OSErrors; DataCorruption: download checksum failed.
            raise StoreError(f"cannot {action} {uri}: {_describe(exc)}") from exc

    def _bucket_missing(self, name: str, action: str) -> StoreError:
        return StoreError(f"cannot {action} {self.object_uri(name)}: bucket {self.bucket_name} not found")

    # ---- the operations -------------------------------------------------------------------------
    def names(self, start: str = "") -> list[str]:
        """The objects under the prefix whose name starts with ``start``, relative, sorted."""
        from google.api_core import exceptions as api

        def listed() -> list[str]:
            blobs = self._client.list_blobs(self.bucket_name, prefix=self._prefix + start, retry=self._retry,
                                            timeout=self._timeout)
            return [b.name[len(self._prefix):] for b in blobs]

        try:
            return sorted(self._call(start, "list", listed))
        except api.NotFound as exc:
            raise self._bucket_missing(start, "list") from exc

    def read_or_none(self, name: str) -> bytes | None:
        """The object's bytes, or None if it does not exist."""
        from google.api_core import exceptions as api

        blob = self._bucket.blob(self._prefix + name)
        try:
            return cast(bytes, self._call(
                name, "read", lambda: blob.download_as_bytes(retry=self._retry, timeout=self._timeout)))
        except api.NotFound:
            return None

    def read(self, name: str) -> bytes:
        """The object's bytes; a missing object is a one-line StoreError."""
        data = self.read_or_none(name)
        if data is None:
            raise StoreError(f"{self.object_uri(name)} does not exist")
        return bytes(data)

    def read_generation(self, name: str, attempts: int = 5) -> tuple[bytes | None, int]:
        """(the object's bytes, the generation they are), or (None, 0) if absent: the bytes are those of
        that generation (re-read when it changes between the metadata and the media request)."""
        from google.api_core import exceptions as api

        key = self._prefix + name
        for _ in range(attempts):
            try:
                blob = self._call(name, "read", lambda: self._bucket.get_blob(key, retry=self._retry,
                                                                              timeout=self._timeout))
            except api.NotFound as exc:
                raise self._bucket_missing(name, "read") from exc
            if blob is None:
                return None, 0
            generation = int(blob.generation)
            try:
                data = self._call(name, "read", functools.partial(self._download_generation, blob, generation))
            except (api.PreconditionFailed, api.NotFound):
                continue  # replaced between the metadata and the media request: read again
            return data, generation
        raise StoreError(f"cannot read {self.object_uri(name)}: it kept changing during {attempts} attempts")

    def _download_generation(self, blob: storage.Blob, generation: int) -> bytes:
        return cast(bytes, blob.download_as_bytes(if_generation_match=generation, retry=self._retry,
                                                  timeout=self._timeout))

    def _upload(self, name: str, data: bytes, action: str, generation: int | None,
                cache_control: str | None = None) -> int | None:
        """Upload; returns the new generation, or None when the precondition failed."""
        from google.api_core import exceptions as api

        blob = self._bucket.blob(self._prefix + name)
        if cache_control is not None:
            blob.cache_control = cache_control
        try:
            self._call(name, action, lambda: blob.upload_from_string(
                data, content_type=_content_type(name), if_generation_match=generation, retry=self._retry,
                timeout=self._timeout))
        except api.PreconditionFailed:
            return None
        except api.NotFound as exc:
            raise self._bucket_missing(name, action) from exc
        return int(blob.generation or 0)

    def put(self, name: str, data: bytes) -> None:
        """Write the object whatever was there."""
        self._upload(name, data, "write", None)

    def create(self, name: str, data: bytes) -> int | None:
        """Create the object only if absent: its generation, or None if it exists (HTTP 412)."""
        return self._upload(name, data, "create", 0)

    def swap(self, name: str, data: bytes, expected_generation: int, cache_control: str | None = None) -> int | None:
        """Replace the object only if it is still ``expected_generation`` (0: still absent): the new
        generation, or None if it changed meanwhile."""
        return self._upload(name, data, "replace", expected_generation, cache_control)

    def copy(self, name: str, other: GcsPrefix, other_name: str) -> None:
        source = self._bucket.blob(self._prefix + name)
        self._call(name, "copy", lambda: self._bucket.copy_blob(source, other._bucket, other._prefix + other_name,
                                                                retry=self._retry, timeout=self._timeout))

    def delete(self, names: list[str], generation: int | None = None) -> bool:
        """Delete the objects (absent ones are fine); with ``generation`` (one name): only if it is still
        that generation. False if a precondition failed."""
        from google.api_core import exceptions as api

        kept = True
        for name in names:
            blob = self._bucket.blob(self._prefix + name)
            try:
                self._call(name, "delete", functools.partial(blob.delete, if_generation_match=generation,
                                                             retry=self._retry, timeout=self._timeout))
            except api.NotFound:
                pass
            except api.PreconditionFailed:
                kept = False
        return kept
