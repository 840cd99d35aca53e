"""A release's commit on the driver, written once for both APIs' ``measure`` (ARA's and the W3C
Attribution target's): the exact accounting the release writer left for the driver, read back and
checked (``take_accounting``); the released rows' identities merged from the workers' sorted runs on
local disk (``merged_identities``); other stores' ledgers consulted (``released_elsewhere``); and the
ledger step at commit (``commit_release``): under the output's lock, before anything is moved into
place, the released rows are checked against the ledger and recorded (``Ledger.check_and_record``),
with a pending record naming the entry first (a killed commit is settled by the next run:
``araopt.io.run_folder``), the entry taken out again if the commit then fails, and the run summary
written with what the ledger said.
"""
from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from araopt.attribution.lifetime import ChargedWindow
from araopt.io import jsonio, outputs
from araopt.io.rowset import RowSet, RowSetPart, SpilledRowSet
from araopt.io.run_folder import RunFolder
from araopt.ledger.attribution import DRAW_KEY
from araopt.ledger.ledger import RELEASE_FILES, Identities, Ledger, Recorded
from araopt.ledger.lifetime import HeldLookback

ACCOUNTING_FILE = outputs.private_file(outputs.ACCOUNTING)
"""Where the release writer leaves the exact accounting for the driver (read and removed before the commit)."""


def take_accounting(folder: RunFolder) -> dict[str, Any]:
    """The exact accounting the job's release writer left in ``folder`` (removed: the run summary carries
    it); a run whose row accounting does not close is a bug, not a release."""
    accounting: dict[str, Any] = jsonio.loads(folder.read(ACCOUNTING_FILE), "accounting")
    folder.remove([ACCOUNTING_FILE])
    if not accounting.get("accounting_closes"):
        raise RuntimeError(f"row accounting does not close: {accounting}")
    return accounting


HELD_FILE = outputs.private_file("lookback_held.json")
"""Where the job leaves, for the commit, how many conversions of each earlier release its lookback held
(``transforms.rowset.CountHeldReleases``; read and removed before the commit)."""


def take_held(folder: RunFolder) -> dict[str, int]:
    """{ledger entry id: conversions of it the lookback held} as the job counted them (removed: the ledger
    entry records it); empty when the job counted nothing (no lookback, or no release in it)."""
    data = folder.staged.read_or_none(HELD_FILE)
    if data is None:
        return {}
    folder.remove([HELD_FILE])
    held: dict[str, int] = jsonio.loads(data, "lookback_held")
    return held


def merged_identities(folder: RunFolder, relative: str, directory: str) -> Identities:
    """The exact, coarse and minute identities of the conversion ids the workers wrote under ``relative`` of the
    staging folder (sorted runs, ``transforms.rowset``), merged on local disk under ``directory``
    (``SpilledRowSet``): the driver holds one run or one id range at a time, whatever the release's size."""
    return Identities(*SpilledRowSet.merge_runs(map(RowSetPart.from_arrow_bytes, folder.iter_all(relative)), directory))


def released_elsewhere(others: Sequence[Ledger], rows: RowSet | SpilledRowSet) -> tuple[dict[str, int], list[str]]:
    """Per other ledger (``measure --check-ledgers``), how many of ``rows`` it records as released (another
    store released them: averaging the two releases strips noise), and one warning per ledger that does."""
    found, warnings = {}, []
    for other in others:
        before, releases = other.released_before(rows)
        found[other.store.uri] = before
        if before:
            warnings.append(f"{before:,} of the {len(rows):,} conversions of this input were already released from "
                            f"another store ({releases} release(s) in the ledger {other.store.uri}); releasing them "
                            f"again lets averages strip the noise")
    return found, warnings


def recorded_summary(ledger: Ledger, recorded: Recorded) -> dict[str, Any]:
    """What the run summary says of the ledger step."""
    return {"release_number_of_this_input": recorded.release_number,
            "conversions_released_before": recorded.rows_released_before, "ledger": ledger.store.uri,
            "ledger_entry": recorded.entry["id"]}


@dataclass(frozen=True)
class LedgerStep:
    """What the commit records: the ledger, the released rows' identities and the entry's own fields
    (the parameters' sha256, epsilon, the mechanism the release used, ...; the release folder's file
    digests and the ids are added at commit)."""

    ledger: Ledger
    rows: RowSet | SpilledRowSet
    coarse: RowSet | SpilledRowSet | None
    entry: Mapping[str, Any] = field(default_factory=dict)
    charged: ChargedWindow | None = None  # an attribution release's matched reports' impressions (araopt.ledger.attribution)
    lifetime: HeldLookback | None = None  # an ARA release's period and its lookback's counts (araopt.ledger.lifetime)
    minute: RowSet | SpilledRowSet | None = None  # the minute identities (araopt.io.rowset.minute_row_ids)
    carried: frozenset[str] = frozenset()  # attribution: earlier releases its lookback simulated again whole
    content: RowSet | SpilledRowSet | None = None  # attribution: the released rows' content identities


def commit_release(folder: RunFolder, simulation: bool, public: dict[str, Any], private: dict[str, Any],
                   summary: dict[str, Any], step: LedgerStep | None = None) -> dict[str, Any]:
    """Commit ``folder`` (sealed with the ``private`` run manifest and the ``public`` release manifest),
    recording the release in the ledger first when ``step`` says so (a simulation records nothing).
    Exclusively, before the move: the entry (``step.entry``, the output, the staging folder and the
    release files' digests) is named in a pending record, checked and recorded (a refusal or failure
    takes it out again), the run summary updated (``recorded_summary``) and written; if the commit then
    fails, the entry is taken out. Returns the release manifest."""

    def before_move() -> Callable[[], None] | None:
        undo = None
        if step is not None:
            ledger = step.ledger
            entry = {"output": folder.target, "staging": folder.staging, **step.entry,
                     RELEASE_FILES: folder.release_digests()}
            entry_id = uuid.uuid4().hex
            folder.mark_pending(ledger.store.uri, entry_id)  # a kill from here on is settled by the next run
            try:
                recorded = ledger.check_and_record(step.rows, step.rows.to_parquet_bytes, entry, entry_id=entry_id,
                                                   coarse=step.coarse, charged=step.charged,
                                                   lifetime=step.lifetime, minute=step.minute, carried=step.carried,
                                                   content=step.content)
            except BaseException:
                if ledger.rollback_entry(entry_id):  # refused (or failed): nothing recorded
                    folder.clear_pending()
                raise
            summary.update(recorded_summary(ledger, recorded))
            # the run manifest names the entry without the ledger's secret draw key (it stays in the ledger only)
            private["ledger"] = {"uri": ledger.store.uri,
                                 "entry": {k: v for k, v in recorded.entry.items() if k != DRAW_KEY}}

            def undo() -> None:
                if ledger.rollback_entry(entry_id):
                    folder.clear_pending()
        folder.write(outputs.private_file(outputs.RUN_SUMMARY), jsonio.dumps(summary, indent=1).encode())
        return undo

    return folder.commit(simulation, public, private, before_move=before_move)

