"""The parameter store and release ledger on Google Cloud Storage: create-only objects and compare-and-swap
by generation (``if_generation_match``), every failure a one-line ``StoreError``; all of it through the
one Cloud Storage adapter, :class:`araopt.io.gcs.GcsPrefix`."""
from __future__ import annotations

from typing import TYPE_CHECKING

from araopt.io.gcs import GcsPrefix, make_gcs_client
from araopt.io.store import LATEST, PARAMS_FILE, VERSIONS_DIR, ParameterStore, StoreConflict

if TYPE_CHECKING:  # typing only
    from google.cloud import storage

__all__ = ["GcsStore", "make_gcs_client"]


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
        prefix = prefix.strip("/")
        self._objects = GcsPrefix(f"gs://{bucket}/{prefix}", client=client, timeout=timeout,
                                  retry_deadline=retry_deadline)

    @property
    def uri(self) -> str:
        return self._objects.uri

    def _object_uri(self, key: str) -> str:
        return self._objects.object_uri(key)

    def _read(self, key: str) -> bytes | None:
        return self._objects.read_or_none(key)

    def _create(self, key: str, data: bytes) -> bool:
        return self._objects.create(key, data) is not None

    def _read_pointer(self) -> tuple[bytes | None, int]:
        return self._read_cas(LATEST)

    def _swap_pointer(self, data: bytes, expected_generation: int) -> None:
        self._swap_cas(LATEST, data, expected_generation)

    def _read_cas(self, key: str) -> tuple[bytes | None, int]:
        return self._objects.read_generation(key)

    def _swap_cas(self, key: str, data: bytes, expected_generation: int) -> None:
        if self._objects.swap(key, data, expected_generation, cache_control="no-store") is None:
            raise StoreConflict(f"{self._object_uri(key)} changed (generation is no longer {expected_generation})")

    def _list_version_names(self) -> list[str]:
        start, suffix = f"{VERSIONS_DIR}/", f"/{PARAMS_FILE}"
        found = [n[len(start):-len(suffix)] for n in self._objects.names(start) if n.endswith(suffix)]
        return [name for name in found if "/" not in name]
