"""The release ledger: which inputs were released, how many times (Aggregation Service rule: each
report goes into one aggregation only; re-noising the same data lets averages strip the noise).

An input's identity is the sha256 of its files' content digests, sorted: the same rows released
again count as a re-release whatever the files are called or where they live. The ledger lives in
the parameter store when ``--params`` is a store (``STORE/ledger/``), else in ``--ledger`` or
``$ARAOPT_LEDGER`` or ``~/.local/state/araopt``. Releasing an input the ledger already knows needs
``--allow-rerelease``; the count is recorded in the run's manifest and in the ledger entry.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from apache_beam.io.filesystems import FileSystems

from araopt.params import utc_now_iso
from araopt.store import ParameterStore, StoreError, open_store

from .options import UserError

_CHUNK = 8 << 20


def file_sha256(path: str) -> tuple[str, int]:
    """(sha256 hex, size) of one file, streamed (local or gs://)."""
    digest = hashlib.sha256()
    size = 0
    with FileSystems.open(path) as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


@dataclass(frozen=True)
class InputIdentity:
    """The content identity of an input: per-file digests and their combined sha256."""

    input_id: str
    files: tuple[tuple[str, str, int], ...]  # (path, sha256, bytes)
    first_time: str | None
    last_time: str | None

    def to_json(self) -> dict:
        return {"input_sha256": self.input_id,
                "files": [{"path": p, "sha256": h, "bytes": n} for p, h, n in self.files],
                "window": {"first_conversion_time": self.first_time, "last_conversion_time": self.last_time}}


def input_identity(paths: Sequence[str], first_time: str | None = None, last_time: str | None = None) -> InputIdentity:
    """Hash every input file (threads: hashlib releases the GIL) and combine the sorted digests."""
    with ThreadPoolExecutor(max_workers=min(4, max(1, len(paths)))) as pool:
        digests = list(pool.map(file_sha256, paths))
    files = tuple((p, h, n) for p, (h, n) in zip(paths, digests, strict=True))
    combined = hashlib.sha256("\n".join(sorted(h for _, h, _ in files)).encode()).hexdigest()
    return InputIdentity(combined, files, first_time, last_time)


def default_ledger_root() -> str:
    return os.environ.get("ARAOPT_LEDGER") or os.path.join(os.path.expanduser("~"), ".local", "state", "araopt")


@dataclass(frozen=True)
class Ledger:
    """A ledger location and the count of earlier releases of one input, read when the job started."""

    store: ParameterStore
    identity: InputIdentity
    previous_releases: int

    @classmethod
    def open(cls, root: str, identity: InputIdentity, allow_rerelease: bool) -> Ledger:
        try:
            store = open_store(root)
            count = store.release_count(identity.input_id)
        except StoreError as exc:
            raise UserError(f"release ledger: {exc}") from None
        if count and not allow_rerelease:
            raise UserError(
                f"this input (sha256 {identity.input_id[:16]}…, {len(identity.files)} file(s)) was already released "
                f"{count} time(s) (ledger {store.uri}); releasing the same data again lets averages strip the noise. "
                f"Pass --allow-rerelease to do it anyway (it is recorded)")
        return cls(store, identity, count)

    def record(self, entry: dict) -> int:
        """Record this release (create-only): returns the number of times the input has now been released."""
        body = {"recorded_at": utc_now_iso(), **self.identity.to_json(), **entry}
        try:
            return self.store.record_release(self.identity.input_id, (json.dumps(body, indent=1) + "\n").encode(),
                                             self.previous_releases)
        except StoreError as exc:
            raise UserError(f"release ledger: {exc}") from None
