"""What a browser simulation reads of a conversion row, as one 64-bit hash: the content a release's ledger
entry records per released row id (``araopt.io.rowset.content_ids``), so that a later release carrying its
budget state can tell that its lookback holds the rows that release simulated, not only their ids
(``araopt.ledger.attribution``).

A row's decisions read its browser (the canonical id: ``encoder.browser_codes``), its impression time,
its impression and conversion sites (canonical: ``simulate.site_codes``, so "www.ADV.example" and
"adv.example" are one site), and its values, slices, impression id and conversion time through its draws'
key (``measure.row_keys``: the value rounding is keyed by the row's content, as the release's parameters
name its columns). A re-export that renamed a site, remapped a browser, refunded a value or changed an
impression time changes the hash; ``content_ids`` adds how many copies of the row id there are.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from araopt.attribution.lifetime import AttributionHistory, EarlierRelease
from araopt.attribution.measure import row_keys
from araopt.attribution.params import AttributionParams
from araopt.attribution.sites import site_hashes
from araopt.io.conversions import BROWSER_ID, CONVERSION_SITE, IMPRESSION_ID, IMPRESSION_SITE, IMPRESSION_TIME_US
from araopt.io.ids import canonical_id_hash, mix_in_place
from araopt.io.rowset import TIME_US

_SALTS = tuple(np.uint64(s) for s in (0x243F6A8885A308D3, 0x13198A2E03707344, 0xA4093822299F31D0,
                                      0x082EFA98EC4E6C89, 0x452821E638D01377))


def key_columns(params: AttributionParams) -> tuple[str, ...]:
    """The columns a row's draws' key reads under ``params`` (``measure.row_keys``, in its order): rows hashed
    under two parameter sets naming the same columns hash alike."""
    return (IMPRESSION_ID, BROWSER_ID, TIME_US, *params.value_columns, *params.slice_columns,
            *params.conversion_slice_columns)


def _sites(column: pa.ChunkedArray) -> np.ndarray:
    """The hash of each value's site (``sites.parse_site``; a value that is no site hashes as itself, marked:
    the simulation refuses it anyway)."""
    if pa.types.is_dictionary(column.type):
        column = pc.cast(column, column.type.value_type)
    return site_hashes(column.to_numpy(zero_copy_only=False))


def row_contents(params: AttributionParams, table: pa.Table) -> np.ndarray:
    """Per valid row of ``table`` (``validate_batch``'s canonical rows), the hash of what the browsers'
    simulation under ``params`` reads of it (module doc); a column the table lacks hashes as a constant."""
    n = table.num_rows
    present = set(table.column_names)
    keyed = [c for c in key_columns(params) if c in present]
    frame = table.select(keyed).to_pandas()
    for c in frame.columns:
        if isinstance(frame[c].dtype, pd.CategoricalDtype):
            frame[c] = frame[c].astype(object)
    parts = [row_keys(params, frame)]
    browser = table.column(BROWSER_ID if BROWSER_ID in present else IMPRESSION_ID)
    parts.append(canonical_id_hash(browser))
    impression = (table.column(IMPRESSION_TIME_US).to_numpy(zero_copy_only=False).astype(np.int64)
                  if IMPRESSION_TIME_US in present else np.zeros(n, dtype=np.int64))
    parts.append(impression.view(np.uint64))
    for site in (IMPRESSION_SITE, CONVERSION_SITE):
        parts.append(_sites(table.column(site)) if site in present else np.zeros(n, dtype=np.uint64))
    out = np.zeros(n, dtype=np.uint64)
    tmp = np.empty(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for salt, part in zip(_SALTS, parts, strict=True):
            out ^= np.asarray(part, dtype=np.uint64) + salt
            mix_in_place(out, tmp)
    return out


def lookback_specs(history: AttributionHistory) -> list[AttributionParams]:
    """The parameters a lookback's rows are hashed under to compare them with each earlier release of
    ``history`` (each release's rows hash as that release hashed them): one per distinct
    :func:`key_columns`, in order of first use; :func:`spec_of` names a release's."""
    out: dict[tuple[str, ...], AttributionParams] = {}
    for r in history.releases:
        out.setdefault(key_columns(r.params), r.params)
    return list(out.values())


def spec_of(history: AttributionHistory, release: EarlierRelease) -> int:
    """The index in :func:`lookback_specs` of ``release``'s hashing."""
    return [key_columns(p) for p in lookback_specs(history)].index(key_columns(release.params))
