"""The one canonical form and hash of an impression id, used wherever an id is hashed: the release
ledger (``araopt.io.rowset``), the exploration arm assignment (``araopt.mechanism.exploration``, and so
the ad server's registrations), the shard of the grouping step (``transforms.group``), the record keys
of the tie-break (``Conversions.record_keys``) and the calibration's hash blocks; and the impressions
Alg. 1 caps (``id_sort_keys``, and a lookback's rows matched to the period's: ``concat_periods``).

Canonical form: an impression id is an integer or a string. A string of ASCII decimal digits with
an optional leading ``-`` and an optional fraction of zeros (``.``, ``.0``, ``.00`` ...) whose value fits
in an int64 *is that integer*, leading zeros included ("000123", "123", "123.0" and 123 are one
impression; "-007" is -7). Any other string is itself, as its UTF-8 bytes ("0x7b", " 123", "+123",
"1e3", "123.5", "١٢٣" stay strings).

Why zero-padded strings equal the integer: ids travel between systems that store them as BIGINT and
as fixed-width text (``CHAR(n)``, ``LPAD``, a CSV read as text), and the padding is the only thing
such a round trip changes; a ledger or an arm plan that told them apart would see the same
impression as two (a re-release that looks new, an impression that changes arm). Why "123.0" equals
123: an integer column that passes through a float (pandas makes an int column with one missing value
float64; written as text it reads "123.0") changes exactly that, and the ledger missed such a
re-export (exact and coarse identities both). The other way is
the safe one: two genuinely different string ids that differ only by leading zeros would be merged,
which for the ledger can only report more overlap (a refusal, never a silent re-release) and for the
arms and shards only puts them in the same group. Other normalisations (case, whitespace, a ``+``
sign, other bases) are not applied: they are not what an export does to an id, and guessing more
would merge ids that are really different.

Hash: ``pd.util.hash_array`` of the canonical form (integers as int64: the splitmix64 finalizer of
their bits; strings: SipHash-2-4 with pandas' fixed key over the UTF-8 bytes, then the same finalizer),
so integer ids and ordinary strings hash exactly as they did before ids were canonicalised (ledgers,
arm plans and shard layouts stay put); only decimal strings with padding or of another type change.
"""
from __future__ import annotations

from typing import Final, TypeAlias, cast

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

_C1: Final = np.uint64(0xBF58476D1CE4E5B9)
_C2: Final = np.uint64(0x94D049BB133111EB)
_CHUNK: Final = 1 << 16  # cache-sized blocks: 3x faster than whole-array passes at 10^7 rows
_INT64_MAX_TEXT: Final = "9223372036854775807"
_INT64_MIN_DIGITS: Final = "9223372036854775808"

IdArray: TypeAlias = "np.ndarray | pa.Array | pa.ChunkedArray | pd.Categorical"

ID_HASH: Final = "_araopt_impression_id_hash"
"""The column the grouping step (``transforms.group``) adds to the rows it shards: ``canonical_id_hash``
of ``impression_id`` (uint64), computed once per row and reused after the shuffle by the record keys
(``Conversions.record_keys``) and the release ledger's identities (``araopt.io.rowset``)."""


def mix_in_place(x: np.ndarray, tmp: np.ndarray) -> None:
    """splitmix64's finalizer (pandas' integer hash), in place (uint64 arithmetic wraps)."""
    np.right_shift(x, np.uint64(30), out=tmp)
    x ^= tmp
    x *= _C1
    np.right_shift(x, np.uint64(27), out=tmp)
    x ^= tmp
    x *= _C2
    np.right_shift(x, np.uint64(31), out=tmp)
    x ^= tmp


def _mixed_ints(values: np.ndarray) -> np.ndarray:
    """``pd.util.hash_array`` of int64 values, in cache-sized blocks."""
    out = np.ascontiguousarray(values, dtype=np.int64).view(np.uint64).copy()
    tmp = np.empty(min(_CHUNK, len(out)), dtype=np.uint64)
    for start in range(0, len(out), _CHUNK):
        block = out[start:start + _CHUNK]
        mix_in_place(block, tmp[:len(block)])
    return out


def decimal_int64(text: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(mask, int64 values) over ``text`` (strings): which are decimal integers in the int64 range
    (optional ``-``, leading zeros allowed: see module doc), and their values (0 where not).

    Only the candidates (all ASCII digits, or a leading ``-``) go through the full parse: ids of
    another form (``"imp-00000001"``) cost one cheap pass."""
    text = text.cast(pa.string())
    candidate = np.asarray(pc.fill_null(pc.or_(pc.or_(pc.ascii_is_decimal(text), pc.starts_with(text, "-")),
                                               pc.match_substring(text, ".")), False)
                           .to_numpy(zero_copy_only=False), dtype=bool)
    mask = np.zeros(len(text), dtype=bool)
    values = np.zeros(len(text), dtype=np.int64)
    if candidate.all():
        return _parse_decimal_int64(text)
    if candidate.any():
        rows = np.flatnonzero(candidate)
        mask[rows], values[rows] = _parse_decimal_int64(text.take(pa.array(rows)))
    return mask, values


def _parse_decimal_int64(text: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """``decimal_int64`` of every string (no pre-filter)."""
    negative = pc.fill_null(pc.starts_with(text, "-"), False)
    digits = pc.if_else(negative, pc.utf8_slice_codeunits(text, 1), text)
    digits = pc.replace_substring_regex(digits, r"^([0-9]+)\.0*$", r"\1")  # an integer written as a float
    is_decimal = pc.fill_null(pc.match_substring_regex(digits, r"^[0-9]+$"), False)
    stripped = pc.utf8_ltrim(digits, "0")
    stripped = pc.if_else(pc.equal(stripped, ""), pa.scalar("0"), stripped)
    length = pc.utf8_length(stripped)
    fits = pc.or_(pc.less(length, 19), pc.and_(
        pc.equal(length, 19),
        pc.if_else(negative, pc.less_equal(stripped, pa.scalar(_INT64_MIN_DIGITS)),
                   pc.less_equal(stripped, pa.scalar(_INT64_MAX_TEXT)))))
    mask = pc.fill_null(pc.and_(is_decimal, fits), False)
    signed = pc.if_else(negative, pc.binary_join_element_wise("-", stripped, ""), stripped)
    values = pc.cast(pc.if_else(mask, signed, pa.scalar("0")), pa.int64())
    return (np.asarray(mask.to_numpy(zero_copy_only=False), dtype=bool),
            np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.int64))


def _mixed_text(values: np.ndarray) -> pa.Array:
    """A mixed object array of ids as Arrow strings: an integer is its decimal string (one canonical form
    with the strings), a missing id stays null."""
    return pa.array([v if v is None or isinstance(v, str) else str(int(v)) for v in values.tolist()], type=pa.string())


def canonical_id_hash(impression_id: IdArray) -> np.ndarray:
    """The 64-bit hash of every id's canonical form (module doc): equal for 123, "123" and "000123"."""
    if isinstance(impression_id, pd.Categorical):
        categories = np.array(list(impression_id.categories), dtype=object)
        hashed: np.ndarray = canonical_id_hash(categories)
        return hashed[np.asarray(impression_id.codes)]
    if isinstance(impression_id, pa.ChunkedArray):
        impression_id = impression_id.combine_chunks()
    if isinstance(impression_id, pa.Array):
        if pa.types.is_integer(impression_id.type) or pa.types.is_boolean(impression_id.type):
            return _mixed_ints(impression_id.cast(pa.int64()).to_numpy(zero_copy_only=False))
        text = impression_id.cast(pa.string())
    else:
        arr = np.asarray(impression_id)
        if arr.dtype.kind in "iub":
            return _mixed_ints(arr.astype(np.int64))
        if arr.dtype.kind not in "OUS":
            return np.asarray(pd.util.hash_array(arr.astype(object)), dtype=np.uint64)
        try:
            text = pa.array(arr.astype(object), type=pa.string())
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # a mixed object array
            text = _mixed_text(arr)
    encoded = pc.dictionary_encode(text)  # hash each distinct id once (an impression has several conversions)
    distinct = encoded.dictionary
    # categorize=False: the values are distinct already, and pandas' default factorizes them again first
    # (the same hashes, ~6x the time)
    words = np.asarray(pd.util.hash_array(np.asarray(distinct.to_numpy(zero_copy_only=False), dtype=object),
                                          categorize=False), dtype=np.uint64)
    mask, values = decimal_int64(distinct)
    if mask.any():
        words = np.where(mask, _mixed_ints(values), words)
    indices = encoded.indices
    if indices.null_count:  # a missing id hashes like pandas' None
        words = np.append(words, np.asarray(pd.util.hash_array(np.array([None], dtype=object)), dtype=np.uint64))
        indices = pc.fill_null(indices, len(distinct))
    return cast(np.ndarray, words[indices.to_numpy(zero_copy_only=False)])


ID_SORT_KEY: Final = "_araopt_impression_sort_key"
"""The column the impression-slice check (``transforms.validate``) adds to a grouped shard whose ids are
strings: ``id_sort_keys`` of its ``impression_id`` (int64), computed once per shard and reused by
``Conversions.from_table`` (Alg. 1's order); comparable within that table and its subsets of rows only."""


def table_sort_keys(table: pa.Table, id_column: str = "impression_id") -> np.ndarray:
    """``id_sort_keys`` of a table's ids: its ``ID_SORT_KEY`` column when the shard carries one (the same
    values), else computed."""
    if ID_SORT_KEY in table.column_names:
        return np.array(table.column(ID_SORT_KEY).to_numpy(zero_copy_only=False), dtype=np.int64)
    return id_sort_keys(table.column(id_column))


def with_sort_keys(table: pa.Table, id_column: str = "impression_id") -> tuple[pa.Table, np.ndarray]:
    """(``table`` with its ``ID_SORT_KEY`` column when its ids are strings, ``table_sort_keys``): other ids
    are their own keys and get no column."""
    keys = table_sort_keys(table, id_column)
    if ID_SORT_KEY in table.column_names or not pa.types.is_string(table.schema.field(id_column).type):
        return table, keys
    return table.append_column(ID_SORT_KEY, pa.array(keys, type=pa.int64())), keys


def table_id_hash(table: pa.Table, id_column: str = "impression_id") -> np.ndarray:
    """``canonical_id_hash`` of a table's ids: its ``ID_HASH`` column when the grouping step added one
    (the same values, computed before the shuffle), else computed (a fresh, writable array)."""
    if ID_HASH in table.column_names:
        return np.array(table.column(ID_HASH).to_numpy(zero_copy_only=False), dtype=np.uint64)
    return canonical_id_hash(table.column(id_column))


def with_id_hash(table: pa.Table, id_column: str = "impression_id") -> tuple[pa.Table, np.ndarray]:
    """(``table`` with its ``ID_HASH`` column, the hashes): the column added if missing."""
    if ID_HASH in table.column_names:
        return table, table_id_hash(table)
    hashed = canonical_id_hash(table.column(id_column))
    return table.append_column(ID_HASH, pa.array(hashed, type=pa.uint64())), hashed


def id_sort_keys(impression_id: IdArray) -> np.ndarray:
    """Keys that order and group rows as their canonical ids do (Alg. 1's impression order; module doc):
    for string ids the dense rank of each distinct id's canonical form, the decimal ones (``"007"``,
    ``"7.0"``: the integer 7) before the others in integer order, the others in UTF-8 byte (= code point)
    order, computed by Arrow over the distinct ids (int64; no Python comparison per row); integer ids are
    returned as they are. Comparable only within one call. Canonical because the cap must see one
    impression where the ledger, the shards and the arms do: ``"7"`` and ``"0000007"`` capped apart
    would keep C reports each."""
    if isinstance(impression_id, pa.ChunkedArray):
        impression_id = impression_id.combine_chunks()
    if not isinstance(impression_id, pa.Array):
        arr = np.asarray(impression_id)
        if arr.dtype != object or not len(arr):
            return arr
        try:
            impression_id = pa.array(arr, from_pandas=False)
        except (pa.ArrowException, TypeError, ValueError):  # a mixed object array
            impression_id = _mixed_text(arr)
    if not (pa.types.is_string(impression_id.type) or pa.types.is_large_string(impression_id.type)) \
            or impression_id.null_count or not len(impression_id):
        return np.asarray(impression_id.to_numpy(zero_copy_only=False))
    encoded = pc.dictionary_encode(impression_id)
    distinct = encoded.dictionary
    text_rank = np.asarray(pc.rank(distinct, sort_keys="ascending").to_numpy(), dtype=np.int64)
    decimal, value = decimal_int64(distinct)
    # the canonical form's order: (0, the integer) for a decimal id, (1, its byte rank) for another
    kind = (~decimal).astype(np.int64)
    minor = np.where(decimal, value, text_rank)
    order = np.lexsort((minor, kind))
    new = np.ones(len(order), dtype=bool)
    new[1:] = (kind[order][1:] != kind[order][:-1]) | (minor[order][1:] != minor[order][:-1])
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.cumsum(new) - 1
    return cast(np.ndarray, rank[encoded.indices.to_numpy(zero_copy_only=False)])
