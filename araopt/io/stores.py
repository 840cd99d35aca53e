"""Which parameter store a URI names (a local folder or gs://BUCKET/PREFIX), and a parameter reference
(a store, STORE/versions/<v> or its params.json) resolved to checksum-verified bytes."""
from __future__ import annotations

import urllib.parse
from typing import TYPE_CHECKING, Any

from araopt.errors import InvalidParameters, Unsupported
from araopt.io.gcs_store import GcsStore, make_gcs_client
from araopt.io.local_store import LocalStore
from araopt.io.store import (
    BUCKET_RE,
    LATEST,
    PARAMS_FILE,
    SCHEME_RE,
    VERSION_RE,
    VERSIONS_DIR,
    ParameterStore,
    ResolvedParams,
)

if TYPE_CHECKING:  # typing only
    from google.cloud import storage


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
        raise InvalidParameters("store URI is empty")
    match = SCHEME_RE.match(uri)
    if match is None:
        return LocalStore(uri)
    scheme = match.group(1).lower()
    parsed = urllib.parse.urlparse(uri)
    if scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise InvalidParameters(f"file:// store URI must name a local path (file:///abs/path), got {uri!r}")
        path = urllib.parse.unquote(parsed.path)
        if not path:
            raise InvalidParameters(f"file:// store URI has no path: {uri!r}")
        return LocalStore(path)
    if scheme == "gs":
        bucket = parsed.netloc
        if not BUCKET_RE.fullmatch(bucket):
            raise InvalidParameters(f"invalid bucket name {bucket!r} in store URI {uri!r} (expected gs://BUCKET/PREFIX)")
        client = gcs_client if gcs_client is not None else make_gcs_client()
        return GcsStore(bucket, parsed.path, client=client, timeout=gcs_timeout, retry_deadline=gcs_retry_deadline)
    raise Unsupported(
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
    if not sep or not VERSION_RE.fullmatch(name):
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
