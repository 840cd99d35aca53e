"""W3C Attribution releases in the ledger: the browsers' budget state carried from one release to the next.

A privacy unit (browser x conversion site x epoch) spends its per-site budget over all releases, and
each release simulates the browsers (``araopt.attribution.measure``). A daily release keeps what the
browser keeps over its whole life by simulating again, before and among its own conversions, the
conversions earlier releases released (its ``--lookback`` / ``--lookback-days``), each with the
parameters and histogram layout that release used and the ledger's draws (``araopt.attribution.draws``:
each browser's epoch grid and each report's rounding, keyed by the ledger's secret ``draw_key``):
:func:`attribution_history` reads them from the ledger. A report touches one epoch (its impression's),
and the budgets of one epoch see only the reports of that epoch, so the release decides exactly as one
simulation of the whole life would when every earlier release that may have charged an epoch its own
reports use was simulated again whole (``araopt.attribution.lifetime``).

* **Before any work** (:func:`carried_refusal`), from the windows alone: the epochs this release may use
  lie within an epoch of its input's impression times (from the Parquet footers; else the conversions'
  times less the lookback). Every earlier attribution release whose charged window comes within an
  epoch of them must be one the lookback can simulate again: recorded with its layout and this ledger's
  draw key, converted before this input's first conversion (a ledger's days are released in time
  order), and its conversions' days all in the lookback's files. Otherwise the release is refused in one
  line naming ``--lookback-days N`` (or why no lookback can help).
* **At commit**, exactly (:func:`carried_entries`): the release's matched reports' impression times
  (the epochs its decisions read) against every earlier release's charged window, with the ledger as it
  is then (``Ledger.check_and_record``); an earlier release sharing an epoch must be one whose every
  released conversion the job's lookback held (counted by the driver from the lookback's row ids), and held
  with the content it released (:func:`content_check`): each entry records, per released row id, a hash
  of what the simulation read of its rows and how many copies there were (``CONTENT``); a lookback
  matching by id but re-exported with other content (a site renamed, a browser remapped, a value refunded,
  rows deduplicated) would carry another budget state than the one that release left, and is refused in
  one line (:func:`content_refusal`). An entry recorded before content identities is carried as before,
  unchecked (said on stderr and in the run summary: ``lookback_content_unchecked``).

``--allow-rerelease`` skips the check before any work; at commit it makes the release anyway and records
the earlier releases it shares epochs with but did not carry (``epochs_shared_with``), as before (one
held with other content is not carried).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from araopt.attribution.content import spec_of
from araopt.attribution.draws import DrawKey
from araopt.attribution.lifetime import AttributionHistory, ChargedWindow, EarlierRelease
from araopt.attribution.params import AttributionParams
from araopt.errors import InvalidInput
from araopt.io.files import micros_iso as _iso  # the times in refusal messages
from araopt.io.partitions import DAY_US
from araopt.io.rowset import RowSet, SpilledRowSet, released_in
from araopt.io.store import StoreError
from araopt.ledger.ledger import Ledger, LedgerRefusal, shares_epochs
from araopt.ledger.lifetime import LookbackCover
from araopt.mechanism.keys import KeyDomain
from araopt.version import Api, ParameterVersion

DRAW_KEY = "draw_key"
"""An attribution entry's secret draw key (operator-private, as the ledger is): every release of the
ledger draws its browsers' epoch grids and roundings with it, so that a later release can make the same
decisions again."""
LAYOUT = "layout"
"""An attribution entry's histogram layout (``KeyDomain.to_json``): which rows called the browsers."""
CONTENT = "content_row_set"
"""An attribution entry's content identities (``araopt.io.rowset.content_ids``): per released row id, what the
browsers' simulation read of it (``araopt.attribution.content``) and how many copies were released."""
CARRIED = "budget_carried_from"
"""An attribution entry's earlier releases whose conversions its lookback simulated again whole."""


LATER = ("its conversions are not all before this input's (a ledger's releases go in conversion time order: its "
         "budgets were charged without this input's conversions)")


def is_attribution(entry: Mapping[str, Any]) -> bool:
    return bool(entry.get("api") == Api.ATTRIBUTION.value)


def entry_fields(layout: KeyDomain, key: DrawKey) -> dict[str, Any]:
    """What an attribution release records besides ``araopt.targets.ledger_entry``'s fields: its layout
    and the ledger's draw key (so that a later release can simulate its conversions again)."""
    return {LAYOUT: layout.to_json(), DRAW_KEY: key.secret}


def ledger_draw_key(entries: Sequence[Mapping[str, Any]]) -> DrawKey | None:
    """The draw key of the ledger: the latest attribution entry's that records one (None: no such entry,
    a first release makes a new one)."""
    for entry in reversed(entries):
        if is_attribution(entry) and isinstance(entry.get(DRAW_KEY), str):
            return DrawKey(entry[DRAW_KEY])
    return None


def _unusable(entry: Mapping[str, Any], key: DrawKey, columns: Sequence[str], params: AttributionParams
              ) -> str | None:
    """Why the conversions of ``entry`` cannot be simulated again as its release simulated them, for a release
    of ``params`` (None: they can). The browsers' budgets are one configuration over an epoch's life
    (``encoder.browser_config``: the per-site budget, the global budget and quota it sets, the epoch's
    length): a release simulating an earlier one's conversions under another would carry a state that
    release never left (at a larger budget it accepts reports the earlier release refused, and with
    shorter epochs it charges one of its epochs a second budget)."""
    if entry.get(DRAW_KEY) is None or entry.get(LAYOUT) is None:
        return "recorded before releases kept their draws and layout"
    if entry[DRAW_KEY] != key.secret:
        return "drawn with another draw key than the ledger's latest"
    earlier = _params_of(entry)
    missing = [c for c in (*earlier.slice_columns, *earlier.value_columns) if c not in set(columns)]
    if missing:
        return f"its parameters read {missing}, which this release does not read"
    if earlier.budget_micro != params.budget_micro or earlier.epoch_days != params.epoch_days:
        return (f"its browsers' budgets were per_site_budget {earlier.per_site_budget:g} over {earlier.epoch_days}-day "
                f"epochs, this release's {params.per_site_budget:g} over {params.epoch_days}-day epochs (a budget or "
                f"an epoch changes in a new ledger)")
    return None


def _params_of(entry: Mapping[str, Any]) -> AttributionParams:
    params = ParameterVersion.from_json(entry["mechanism"], source=f"ledger entry {entry['id']}").attribution
    if params is None:
        raise InvalidInput(f"ledger entry {entry['id']} is an attribution release without its parameters")
    return params


def _meets(entry: Mapping[str, Any], first_us: int | None, last_us: int | None) -> bool:
    """Whether ``entry`` released conversions within [first_us, last_us] (an unknown end: unbounded)."""
    if not entry.get("rows") or entry.get("first_time_us") is None:
        return False
    return (last_us is None or entry["first_time_us"] <= last_us) and (first_us is None
                                                                      or first_us <= entry["last_time_us"])


def attribution_history(ledger: Ledger, entries: Sequence[Mapping[str, Any]], key: DrawKey,
                        lookback: tuple[int | None, int | None] | None, first_us: int | None,
                        columns: Sequence[str], params: AttributionParams) -> AttributionHistory:
    """The earlier attribution releases whose conversions a lookback of conversion times ``lookback``
    (first, last; None: no lookback) may hold, for a release whose first conversion is at ``first_us``:
    each with its parameters, layout and released row ids (``releases``), or why it cannot be simulated
    again (``excluded``: another draw key, no recorded layout, converted after ``first_us``, columns this
    release does not read, another budget or epoch than ``params``'). ``columns``: the columns the release
    reads (its lookback rows have no others)."""
    if lookback is None:
        return AttributionHistory()
    lo, hi = lookback
    releases: list[EarlierRelease] = []
    excluded: list[tuple[str, str]] = []
    for entry in entries:
        if not is_attribution(entry) or not _meets(entry, lo, hi):
            continue
        why = _unusable(entry, key, columns, params)
        if why is None and (first_us is None or entry["last_time_us"] >= first_us):
            why = LATER
        if why is not None:
            excluded.append((entry["id"], why))
            continue
        ids = RowSet.from_parquet_bytes(ledger.store.read_row_set(dict(entry)), entry["row_set"]).ids
        layout = KeyDomain.from_json(entry[LAYOUT], source=f"ledger entry {entry['id']}'s layout", embedded=True)
        releases.append(EarlierRelease(entry["id"], _params_of(entry), layout, ids))
    return AttributionHistory(tuple(releases), tuple(excluded), key)


def reach(params: AttributionParams, impressions: tuple[int | None, int | None],
          conversions: tuple[int | None, int | None]) -> ChargedWindow:
    """The impression times a release's reports may use (µs): its input's impression times where the
    footers say them, within its conversions' times less the lookback (an unknown end: unbounded)."""
    (imp_lo, imp_hi), (conv_lo, conv_hi) = impressions, conversions
    lows = [v for v in (imp_lo, None if conv_lo is None else conv_lo - params.lookback_days * DAY_US) if v is not None]
    highs = [v for v in (imp_hi, conv_hi) if v is not None]
    lo = max(lows) if lows else -(2**62)
    hi = min(highs) if highs else 2**62
    return ChargedWindow(min(lo, hi), hi, params.epoch_days * DAY_US)


def carried_refusal(entries: Sequence[Mapping[str, Any]], window: ChargedWindow,
                    conversions: tuple[int | None, int | None], cover: LookbackCover | None,
                    history: AttributionHistory, ledger: str) -> str | None:
    """Before any work: why a release whose reports may use the impression times ``window`` cannot carry
    the budgets of the ledger's earlier attribution releases (``entries``) with its lookback (``cover``
    of its files' days, None: no lookback; ``history``: what :func:`attribution_history` made of them);
    None if it can (module doc). A release of conversions in the input's own hours (``conversions``:
    its first and last) is left to the commit: the same conversions are the row ledger's to refuse
    ("already released"), others of the same hours the commit's exact rule's."""
    first_us, last_us = conversions
    shared = [e for e in entries if shares_epochs(dict(e), window) and not _meets(e, first_us, last_us)]
    if not shared:
        return None
    excluded = dict(history.excluded)
    rebuilt = history.rebuilt
    blocked = [(e, excluded[e["id"]] if e["id"] in excluded else LATER) for e in shared
               if e["id"] in excluded or first_us is None or e["last_time_us"] >= first_us]
    if blocked:
        e, why = blocked[-1]
        return (f"{len(blocked)} earlier attribution release(s) in the ledger {ledger} charged the budgets of epochs "
                f"this release's impressions share and cannot be simulated again (e.g. {e['id']}: {why}): this "
                f"release would spend those epochs' per-site budgets again. Release impressions an epoch or more from "
                f"theirs, or pass --allow-rerelease to do it anyway (it is recorded)")
    uncovered = [e for e in shared if e["id"] not in rebuilt or cover is None
                 or cover.gaps(e["first_time_us"], e["last_time_us"] + 1)]
    if not uncovered:
        return None
    start = min(e["first_time_us"] for e in shared)
    first = first_us if first_us is not None else max(e["last_time_us"] for e in shared) + 1
    days = max(1, -(-(first - first % DAY_US - (start - start % DAY_US)) // DAY_US))
    e = uncovered[-1]
    held = "no --lookback holds them" if cover is None else "--lookback does not hold them all"
    return (f"{len(uncovered)} earlier attribution release(s) in the ledger {ledger} charged the budgets of epochs "
            f"this release's impressions share and {held} (e.g. {e['id']}: conversions "
            f"{_iso(e['first_time_us'])}..{_iso(e['last_time_us'])}): the browsers' budget state is carried only by "
            f"simulating their conversions again, else a browser's epoch would spend its per-site budget again. Pass "
            f"--lookback-days {days} (the {days} day(s) before the input, beside its date= partitions) or --lookback "
            f"with those days' conversions")


Window = tuple[int | None, int | None]
"""(first, last) time in µs; None: unknown."""


def prepare_release(ledger: Ledger, params: AttributionParams, columns: Sequence[str], conversions: Window,
                    impressions: Window, lookback: Window | None, lookback_files: Sequence[Window] = ()
                    ) -> tuple[DrawKey, AttributionHistory]:
    """Before any work, what a release (not a simulation) takes from the ledger: its draw key (the
    ledger's, else a new one) and the earlier releases its lookback simulates again
    (:func:`attribution_history`); refused (``LedgerRefusal``, one line naming ``--lookback-days N``)
    when it cannot carry the budgets of an earlier release sharing its epochs (:func:`carried_refusal`),
    unless the ledger allows re-releases (which the commit records). ``conversions`` and ``impressions``:
    the input's windows; ``lookback``: the lookback's window (None: no lookback) and ``lookback_files``
    each of its files' (the days it covers); ``columns``: the columns the release reads."""
    try:
        entries, _ = ledger.store.read_ledger()
    except StoreError as exc:
        raise StoreError(f"release ledger: {exc}") from None
    key = ledger_draw_key(entries) or DrawKey.new()
    history = attribution_history(ledger, entries, key, lookback, conversions[0], columns, params)
    if not ledger.allow_rerelease:
        cover = None if lookback is None else LookbackCover.of_windows(lookback_files)
        why = carried_refusal(entries, reach(params, impressions, conversions), conversions, cover, history,
                              ledger.store.uri)
        if why is not None:
            raise LedgerRefusal(why)
    return key, history


def held_counts(history: AttributionHistory, lookback: RowSet | SpilledRowSet | None) -> dict[str, int]:
    """Per earlier release of ``history``, how many of its released conversions the job's lookback rows
    (their row ids) held."""
    if lookback is None or not history.releases:
        return {r.entry_id: 0 for r in history.releases}
    found = released_in(lookback, [r.ids for r in history.releases]).per_set
    return {r.entry_id: int(n) for r, n in zip(history.releases, found, strict=True)}


def carried_entries(history: AttributionHistory, held: Mapping[str, int],
                    differ: Mapping[str, int] | None = None) -> frozenset[str]:
    """The earlier releases whose every released conversion the lookback held (so simulated again whole),
    but those whose held rows' content differs from what they released (``differ``: :func:`content_check`)."""
    return frozenset(r.entry_id for r in history.releases
                     if held.get(r.entry_id, 0) >= len(r.ids) and not (differ or {}).get(r.entry_id))


@dataclass(frozen=True)
class ContentCheck:
    """What :func:`content_check` found: per earlier release the lookback held whole by row id, how many of
    its released row ids the lookback holds with other content or another number of copies (``differ``,
    only those with some), and the releases recorded before content identities (``unchecked``)."""

    differ: Mapping[str, int]
    unchecked: tuple[str, ...]


def content_check(ledger: Ledger, history: AttributionHistory, held: Mapping[str, int],
                  lookback: Sequence[RowSet | SpilledRowSet]) -> ContentCheck:
    """At commit: whether the lookback's rows are the rows each earlier release of ``history`` whose every
    released conversion it held (``held``: :func:`held_counts`) simulated, not only their ids: its content
    identities (``lookback[i]``, hashed under ``araopt.attribution.content.lookback_specs(history)[i]``)
    against those the release's entry recorded (``CONTENT``). Simulated again with other content (a site
    renamed, a browser remapped, a value refunded, an impression time moved, a row deduplicated or
    repeated), its conversions would leave another budget state than the one it left. A release recorded
    before content identities cannot be compared (``unchecked``)."""
    entries, _ = ledger.store.read_ledger()
    by_id = {e["id"]: e for e in entries}
    differ: dict[str, int] = {}
    unchecked: list[str] = []
    for r in history.releases:
        if held.get(r.entry_id, 0) < len(r.ids):
            continue  # not held whole: not carried (the commit's rule)
        entry = by_id.get(r.entry_id)
        if entry is None or entry.get(CONTENT) is None:
            unchecked.append(r.entry_id)
            continue
        recorded = RowSet.from_parquet_bytes(ledger.store.read_row_set(dict(entry), CONTENT),
                                             f"ledger entry {r.entry_id}'s {CONTENT}").ids
        same = released_in(lookback[spec_of(history, r)], [recorded]).per_set[0]
        if same < len(recorded):
            differ[r.entry_id] = len(recorded) - int(same)
    return ContentCheck(differ, tuple(unchecked))


def content_refusal(check: ContentCheck, history: AttributionHistory, ledger: str) -> str | None:
    """Why the lookback cannot carry the budget state of the releases whose held rows differ (None: none do)."""
    if not check.differ:
        return None
    name, n = list(check.differ.items())[-1]
    rows = next(len(r.ids) for r in history.releases if r.entry_id == name)
    return (f"{len(check.differ)} earlier attribution release(s) in the ledger {ledger} are held by the lookback with "
            f"other content than they released (e.g. {name}: {n} of its {rows} conversions differ in browser, "
            f"impression, site, value or slice, or in their number of copies: a re-export, not the rows it "
            f"released): simulating them again would not carry the budget state it left, and this release would "
            f"spend its browsers' per-site budgets again. Pass a lookback holding the rows exactly as released, or "
            f"--allow-rerelease to release anyway (recorded)")

