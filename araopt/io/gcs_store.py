"""The parameter store and release ledger on Google Cloud Storage: create-only objects and compare-and-swap
by generation (``if_generation_match``), every failure a one-line ``StoreError``."""
from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from araopt.errors import one_line
from araopt.io.store import (
    CREDENTIALS_HELP,
    LATEST,
    PARAMS_FILE,
    VERSIONS_DIR,
    ParameterStore,
    StoreConflict,
    StoreError,
    T,
)

if TYPE_CHECKING:  # typing only
    from google.cloud import storage


def _describe(exc: BaseException) -> str:
    """Short description of a transport error (requests' messages embed whole URLs)."""
    text = str(exc)
    endpoint = re.search(r"host='([^']+)', port=(\d+)", text)
    if endpoint and "ConnectionError" in type(exc).__name__:
        return f"{type(exc).__name__}: cannot connect to {endpoint.group(1)}:{endpoint.group(2)}"
    return f"{type(exc).__name__}: {one_line(text, 160)}"


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
