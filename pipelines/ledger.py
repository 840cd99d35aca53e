"""The release ledger: which conversions were released (the Aggregation Service's rule: each report
goes into one aggregation only; releasing the same conversions again lets averages strip the noise).

Keyed on rows, not files (``araopt.io.rowset``): a release is the set of conversions it used, whatever
files, order, compression, row groups or encodings they came in. At commit, under the run folder's
lock and before anything is moved into place, :meth:`Ledger.check_and_record` compares the release's
row set with every earlier release whose time window meets it; conversions released before refuse
the release (saying how many of how many) unless ``--allow-rerelease``, and the count is recorded.
The entry is appended to the ledger index by compare-and-swap (of two racing releases exactly one
appends; the other checks again and sees the first); if the commit then fails, it is taken out again.

One ledger per store: when ``--params`` names a parameter store (its root, ``STORE/versions/<v>`` or
``STORE/versions/<v>/params.json``), the ledger is ``STORE/ledger/`` and a ``--ledger`` elsewhere is
refused; else ``--ledger`` or ``$ARAOPT_LEDGER`` or ``~/.local/state/araopt``.
"""
from __future__ import annotations

import logging
import os
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

from araopt.io.files import utc_now_iso
from araopt.io.rowset import RowSet, times_released
from araopt.io.store import ParameterStore, StoreConflict, StoreError
from araopt.io.stores import open_store

from .options import UserError


def default_ledger_root() -> str:
    return os.environ.get("ARAOPT_LEDGER") or os.path.join(os.path.expanduser("~"), ".local", "state", "araopt")


def _same_location(a: str, b: str) -> bool:
    if "://" in a or "://" in b:
        return a.rstrip("/") == b.rstrip("/")
    return os.path.realpath(a) == os.path.realpath(b)


def ledger_root(store: str | None, ledger: str | None) -> str:
    """Where releases are recorded: the parameter store's ledger, else ``--ledger`` or the default."""
    if store is None:
        return ledger or default_ledger_root()
    if ledger is not None and not _same_location(ledger, store):
        raise UserError(f"--ledger {ledger}: the parameters come from the store {store}, whose releases are recorded "
                        f"in its own ledger ({store}/ledger; one ledger per store): drop --ledger")
    return store


@dataclass(frozen=True)
class Recorded:
    """A release as recorded: the ledger entry, and how often its conversions had been released."""

    entry: dict[str, Any]
    rows_released_before: int
    release_number: int  # 1 + the most earlier releases any one of its conversions was in


@dataclass(frozen=True)
class Ledger:
    """A release ledger (a store's ``ledger/``) and whether re-releasing is allowed."""

    store: ParameterStore
    allow_rerelease: bool

    @classmethod
    def open(cls, root: str, allow_rerelease: bool) -> Ledger:
        """Open the ledger and read its index once: an unreachable or corrupt ledger fails before any work."""
        try:
            store = open_store(root)
            store.read_ledger()
        except (StoreError, ValueError) as exc:
            raise UserError(f"release ledger: {exc}") from None
        return cls(store, allow_rerelease)

    def check_and_record(self, rows: RowSet, row_set: bytes, entry: dict[str, Any], attempts: int = 10) -> Recorded:
        """Refuse ``rows`` if any was released before (unless re-releasing is allowed), else append the
        release (``row_set``: its Parquet bytes) with ``entry``'s fields. Retries when another release
        is recorded meanwhile."""
        loaded: dict[str, np.ndarray] = {}
        try:
            for _ in range(attempts):
                releases, generation = self.store.read_ledger()
                meeting = [e for e in releases if rows.may_meet(e["first_time_us"], e["last_time_us"])]
                for e in meeting:
                    if e["id"] not in loaded:
                        loaded[e["id"]] = RowSet.from_parquet_bytes(self.store.read_row_set(e), e["row_set"]).ids
                counts = times_released(rows, [loaded[e["id"]] for e in meeting])
                before = int(np.count_nonzero(counts))
                overlaps = {e["id"]: int(np.count_nonzero(rows.contained_in(loaded[e["id"]]))) for e in meeting}
                overlaps = {k: v for k, v in overlaps.items() if v}
                if before and not self.allow_rerelease:
                    raise UserError(
                        f"{before:,} of the {len(rows):,} conversions of this input were already released "
                        f"({len(overlaps)} earlier release(s) in the ledger {self.store.uri}); releasing them again lets "
                        f"averages strip the noise. Pass --allow-rerelease to do it anyway (it is recorded)")
                number = 1 + int(counts.max()) if len(counts) else 1
                record = {**entry, "id": uuid.uuid4().hex, "recorded_at": utc_now_iso(), "rows": len(rows),
                          "first_time_us": rows.first_time_us, "last_time_us": rows.last_time_us,
                          "rows_released_before": before, "release_number": number, "overlaps": overlaps}
                try:
                    recorded = self.store.append_release(record, row_set, generation)
                except StoreConflict:
                    continue
                return Recorded(recorded, before, number)
        except StoreError as exc:
            raise UserError(f"release ledger: {exc}") from None
        raise UserError(f"release ledger {self.store.uri}: it kept changing during {attempts} attempts; nothing was "
                        f"released")

    def rollback(self, recorded: Recorded) -> None:
        """Take a recorded release out again (its commit failed: nothing was released)."""
        try:
            self.store.remove_release(recorded.entry["id"])
        except StoreError as exc:  # the run's own error is what the user must see: say this one in the log
            logging.getLogger(__name__).error(
                "release ledger: the commit failed and release %s could not be taken out of %s (%s): the ledger "
                "over-counts one release (the safe direction)", recorded.entry["id"], self.store.uri, exc)
