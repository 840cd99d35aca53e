"""An impression is one ARA source, registered once with its features: its impression-side slice values
are constant. Rows that break this (differ from their impression's first row, in Alg. 1's order: time,
then the record hash) are refused by ``mechanism.measure`` and dead-lettered by the jobs
(``IMPRESSION_SLICE_INCONSISTENT``)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np
import pandas as pd
import pyarrow as pa

from araopt.io.conversions import (
    IMPRESSION_ID,
    IMPRESSION_SLICE_INCONSISTENT,
    Conversions,
    dead_letter_rows,
    equality_codes,
)
from araopt.io.ids import table_sort_keys
from araopt.mechanism.bounding import ranks_within_impression, sort_by_impression


def impression_slice_conflicts(records: pa.Table | Conversions, impression_slice_columns: Sequence[str],
                               slice_columns: Sequence[str] = (), value_columns: Sequence[str] = ()) -> np.ndarray:
    """Mask of the records whose impression-side slice values differ from their impression's first record.

    ``records``: validated rows (a ``validate_batch`` table with its ``slice_columns`` and
    ``value_columns``, or ``Conversions``) holding every row of each of its impressions. An
    impression is one ARA source, registered once with its impression features: rows that disagree
    on them cannot come from a browser and would split the impression over two slices (two
    budgets). The first row is the first in Alg. 1's order (conversion time, then
    ``Conversions.record_keys``), so the verdict does not depend on files, batches or shards.
    Vectorized: a hash pass finds the impressions with more than one value; only their rows are sorted.
    """
    table = records if isinstance(records, pa.Table) else None
    n = len(records) if table is None else table.num_rows
    conflicts = np.zeros(n, dtype=bool)
    columns = tuple(impression_slice_columns)
    if n < 2 or not columns:
        return conflicts

    def column(c: str) -> pa.ChunkedArray | np.ndarray:
        return table.column(c) if table is not None else np.asarray(cast(Conversions, records).slices[c])

    if table is not None and pa.types.is_string(table.schema.field(IMPRESSION_ID).type):
        impression = table_sort_keys(table)  # dense ranks of the ids (the shard's, when it carries them)
    else:
        impression = pd.factorize(equality_codes(column(IMPRESSION_ID) if table is not None
                                                  else cast(Conversions, records).impression_id))[0]
    suspect = np.zeros(int(impression.max()) + 1, dtype=bool)
    for c in columns:
        codes = equality_codes(column(c))
        some = np.empty(len(suspect), dtype=codes.dtype)
        some[impression] = codes  # some row's value per impression: every row equals it iff the column is constant
        suspect[impression[codes != some[impression]]] = True
    if not suspect.any():
        return conflicts
    rows = np.flatnonzero(suspect[impression])
    sub = (Conversions.from_table(table.take(pa.array(rows)), slice_columns, value_columns) if table is not None
           else cast(Conversions, records).take(rows))
    order, sorted_impressions = sort_by_impression(sub.impression_sort_keys(), sub.conversion_time, sub.record_keys())
    rank, group = ranks_within_impression(sorted_impressions)
    first_row = order[rank == 0][group]  # for each sorted position: the first row of its impression
    differs = np.zeros(len(rows), dtype=bool)
    for c in columns:
        values = np.asarray(sub.slices[c])
        differs[order] |= values[order] != values[first_row]
    conflicts[rows[differs]] = True
    return conflicts


def split_impression_slice_conflicts(
    table: pa.Table, impression_slice_columns: Sequence[str], slice_columns: Sequence[str],
    value_columns: Sequence[str],
) -> tuple[pa.Table, pa.Table | None]:
    """(rows kept, dead-letter rows or None) of ``impression_slice_conflicts``."""
    conflicts = impression_slice_conflicts(table, impression_slice_columns, slice_columns, value_columns)
    if not conflicts.any():
        return table, None
    return (table.filter(pa.array(~conflicts)),
            dead_letter_rows(table.filter(pa.array(conflicts)), slice_columns, value_columns,
                             IMPRESSION_SLICE_INCONSISTENT))
