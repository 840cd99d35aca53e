"""Which past releases the privacy-safe tuner may learn from: each release folder is checked against
the release ledger that recorded it, and (with a parameter store) against the store's published
versions, before a number of it is read.

A release folder's manifest only hashes its own files, so whoever can write the folder can rewrite
its estimates, its arm plan and its manifest together. The ledger is where ``measure`` records each
release at commit: its parameters' sha256, ε, the time window of its conversions and (since the
ledger keeps them) the sha256 of every file of its release folder. A folder is learnt from only if a
ledger entry holds exactly the files read (a forged, edited or never-recorded release is refused), the
entry's parameters and ε are those the folder says it was made with, and the entry's conversions
fall on the folder's day (``date=YYYY-MM-DD``: a stale release copied under another day is refused).
With a store, the entry's parameters must be one of the store's published versions; an Aggregation
Service folder (its Avro report and the ``params.json`` its registrations came from: never recorded
by ``measure``) is accepted only with a store, and only when its ``params.json`` is a published version
(its noised report cannot be checked: it comes from the Aggregation Service).
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from araopt.errors import InvalidInput, InvalidParameters, PrivacyRefusal
from araopt.io import outputs
from araopt.io.partitions import DAY_US
from araopt.io.store import StoreError
from araopt.io.stores import open_store
from araopt.ledger.ledger import RELEASE_FILES
from araopt.mechanism.exploration import Exploration
from araopt.mechanism.keys import KeyDomain
from araopt.mechanism.params import Params, QueryParams


@dataclass(frozen=True)
class ReleaseVerifier:
    """The release ledger's entries, and the sha256 of the store's published versions (None: no store)."""

    ledger_uri: str
    entries: tuple[Mapping[str, Any], ...]
    published: frozenset[str] | None = None
    store_uri: str | None = None

    @classmethod
    def open(cls, ledger_root: str, store: str | None = None) -> ReleaseVerifier:
        """Read the ledger under ``ledger_root`` (and the published versions of ``store``) once."""
        try:
            ledger = open_store(ledger_root)
            entries, _ = ledger.read_ledger()
            published = None
            if store is not None:
                params_store = open_store(store)
                published = frozenset(params_store.resolve(v).sha256 for v in params_store.list_versions())
        except (StoreError, ValueError) as exc:
            raise StoreError(f"privacy-safe tuning: {exc}") from None
        return cls(ledger.uri, tuple(entries), published, store)

    def check_release(self, folder: str, day: str, files: Mapping[str, bytes], facts: Mapping[str, Any],
                      manifest: Mapping[str, Any]) -> Mapping[str, Any]:
        """The ledger entry of the release in ``folder`` (``files``: the release files read, by name under
        release/; ``facts``: its release.json; ``manifest``: its MANIFEST.json), or a one-line refusal."""
        digests = {name: outputs.sha256_hex(data) for name, data in files.items()}
        recorded = [e for e in self.entries if isinstance(e.get(RELEASE_FILES), Mapping)
                    and all(e[RELEASE_FILES].get(name) == sha for name, sha in digests.items())]
        if not recorded:
            raise PrivacyRefusal(f"{folder}: no release in the ledger {self.ledger_uri} has these files (a release edited "
                                 f"or made up after its commit, one recorded in another ledger, or one recorded before the "
                                 f"ledger kept each release's file digests): privacy-safe tuning learns only from recorded "
                                 f"releases (--ledger names the ledger measure recorded them in)")
        entry = recorded[-1]
        said = {"release.json": facts.get("params_sha256"), "the manifest": manifest.get("params_sha256")}
        for where, sha in said.items():
            if sha != entry.get("params_sha256"):
                raise PrivacyRefusal(f"{folder}: {where} names parameters {str(sha)[:12]}…, the ledger recorded the release "
                                     f"with {str(entry.get('params_sha256'))[:12]}…")
        if facts.get("epsilon") != entry.get("epsilon") or manifest.get("epsilon") != entry.get("epsilon"):
            raise PrivacyRefusal(f"{folder}: released at epsilon {facts.get('epsilon')} by its files, "
                                 f"{entry.get('epsilon')} by the ledger")
        start = dt.date.fromisoformat(day).toordinal() - dt.date(1970, 1, 1).toordinal()
        first, last = int(entry["first_time_us"]), int(entry["last_time_us"])
        if not (first < (start + 1) * DAY_US and last >= start * DAY_US):
            raise PrivacyRefusal(f"{folder}: the ledger's release {entry.get('id')} holds conversions of "
                                 f"{_day(first)}..{_day(last)}, not of {day} (a release of another day under this date)")
        self.check_parameters(folder, str(entry.get("params_sha256")))
        return entry

    def check_parameters(self, folder: str, params_sha256: str) -> None:
        """With a store: ``params_sha256`` must be one of its published versions."""
        if self.published is not None and params_sha256 not in self.published:
            raise PrivacyRefusal(f"{folder}: made with parameters {params_sha256[:12]}…, which the store {self.store_uri} "
                                 f"never published")

    def check_service_release(self, folder: str, params_sha256: str) -> None:
        """An Aggregation Service report: never recorded by measure; its parameter file must be a version of
        the store (a store is needed to read one)."""
        if self.published is None:
            raise InvalidParameters(f"{folder}: an Aggregation Service report can be learnt from only with the parameter "
                                    f"store whose version its registrations were exported from (--store)")
        self.check_parameters(folder, params_sha256)


def _day(micros: int) -> str:
    return (dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=micros)).date().isoformat()


def release_parameters(facts: Mapping[str, Any], domain: KeyDomain, source: str) -> Params:
    """The public parameters a (verified) release says it was made with (release.json)."""
    try:
        return Params(
            count_limit=int(facts["count_limit"]), encoding=str(facts["encoding"]), epsilon=float(facts["epsilon"]),
            slice_columns=domain.slice_columns,
            queries=tuple(QueryParams(str(q["column"]), float(q["clip_threshold"]),
                                      None if q.get("budget_fraction") is None else float(q["budget_fraction"]))
                          for q in facts["queries"]),
            contribution_budget=int(facts["contribution_budget"]),
            conversion_slice_columns=domain.conversion_slice_columns,
            exploration=None if facts.get("exploration") is None else Exploration.from_json(facts["exploration"], source))
    except (KeyError, TypeError, ValueError, InvalidParameters) as exc:
        raise InvalidInput(f"{source}: release.json does not describe its parameters ({exc})") from None
