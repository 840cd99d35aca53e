"""Aggregation keys: (slice, query) <-> 128-bit ARA bucket, and the declared key domain.

Bit layout of a bucket (most significant first, documented in the README)::

    [ slice column 1 | slice column 2 | ... | slice column k | query code (8 bits) ]

Each slice column occupies ceil(log2(#values)) bits (at least 1) holding the index of the value in
that column's dictionary (its distinct values in the domain, sorted). The query code is 0 for the
bottom key (the count key for the baseline encoding) and l for value query l (1-based, params order).
Impression-side columns are set by the source key piece, conversion-side columns and the query
code by the trigger key piece; OR-ing the two pieces, as the browser does, gives the bucket.

Dense key ids (what the core and the pipeline aggregate over) are ``slice_index * (d+1) + column``
with ``column`` the encoder's output column (queries in order, then bottom/count).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pandas as pd

from araopt.constants import MAX_BUCKET_BITS as _MAX_BUCKET_BITS
from araopt.constants import QUERY_BITS as _QUERY_BITS
from araopt.errors import InvalidInput, Unsupported
from araopt.io import jsonio

QUERY_BITS = _QUERY_BITS
MAX_BUCKET_BITS = _MAX_BUCKET_BITS
BOTTOM_NAME = "bottom"
COUNT_NAME = "count"
KEYMAP_FORMAT_VERSION = "1.0"
_LOOKUP_TABLE_MAX = 1 << 20  # slice spaces up to this size are looked up in a table (8 MiB), larger ones searched
DECLARED, HISTORY, DATA = "declared", "history", "data"
ORIGINS = (DECLARED, HISTORY, DATA)
ORIGIN_COLUMN = "origin"
"""The column of a table of slices (a layout CSV) that names its origin (absent: declared)."""
"""Where a domain's slices come from: listed by the operator, the training history's slices (the
parameter version), or the data it is used on (SIMULATION ONLY for a release: it reveals which slices
occur). Recorded in every key map; ``measure`` refuses a ``data`` key map outside simulation."""
_INT64 = (-(2**63), 2**63 - 1)
_SHA256_HEX = frozenset("0123456789abcdef")


def slice_value(v: Any) -> Any:
    """A slice value as the plain Python scalar every slice key uses: numpy scalars become Python ones
    and an integral float an int (so that 1.0 and 1 are one slice), whatever produced the value."""
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def slice_key(values: Sequence[Any]) -> tuple[Any, ...]:
    """The key of one slice: its values (one per slice column) as ``slice_value``s."""
    return tuple(slice_value(v) for v in values)


def slice_sort_key(key: tuple[Any, ...]) -> tuple[tuple[str, Any], ...]:
    """Canonical order of slice keys whose values may mix types (ints, strings)."""
    return tuple((type(v).__name__, v) for v in key)


def register_slices(columns: Sequence[Any], registry: dict[Any, int], n: int, bare: bool = False) -> np.ndarray:
    """The local id of every record's slice key (its values in ``columns``, one array per slice column),
    registering keys not yet in ``registry`` (a loop over distinct keys, not records): how the
    mergeable combiners key their state. ``bare``: one column whose keys are its values, not 1-tuples."""
    if not columns:
        sid = registry.setdefault((), len(registry))
        return np.full(n, sid, dtype=np.int64)
    codes, uniques = [], []
    for column in columns:
        # a categorical column (``Conversions.from_table(categorical_slices=True)``) by its codes: the same
        # codes and values, in order of first appearance, without hashing every row's string
        code, uniq = pd.factorize(column if isinstance(column, pd.Categorical) else np.asarray(column), sort=False)
        codes.append(code.astype(np.int64))
        uniques.append(np.asarray(uniq, dtype=object))
    combined = codes[0].copy()
    for code, uniq in zip(codes[1:], uniques[1:], strict=True):
        combined = combined * len(uniq) + code
    _, first_rows, inverse = np.unique(combined, return_index=True, return_inverse=True)
    local = np.empty(len(first_rows), dtype=np.int64)
    for i, row in enumerate(first_rows):
        key = slice_key([uniq[code[row]] for code, uniq in zip(codes, uniques, strict=True)])
        local[i] = registry.setdefault(key[0] if bare else key, len(registry))
    return cast(np.ndarray, local[inverse.reshape(-1)])


@dataclass(frozen=True, eq=False)
class KeyDomain:
    """The declared output domain: slices (as dictionary indices) x (value queries + bottom)."""

    slice_columns: tuple[str, ...]
    dictionaries: tuple[tuple[Any, ...], ...]
    slices: np.ndarray  # (m, k) int64 dictionary indices, sorted lexicographically, unique
    query_names: tuple[str, ...]
    baseline: bool = False
    conversion_slice_columns: tuple[str, ...] = ()
    origin: str = DATA  # see ORIGINS; not part of the layout (equality, checksum)
    learnt_before_us: int | None = None
    """Origin ``history``: the end (exclusive, microseconds since the epoch: its last conversion's time
    plus one) of the training history whose slices it lists, so that a release never lists them over
    that history's own conversions (``mechanism.release.check_learnt_window``); None: unknown. A time
    read from the data: kept in the parameter version (operator-private), never in a published key map
    (``to_json``). Not part of the layout (equality, checksum)."""

    def __post_init__(self) -> None:
        slices = np.asarray(self.slices, dtype=np.int64).reshape(-1, len(self.slice_columns))
        object.__setattr__(self, "slices", slices)
        if self.origin not in ORIGINS:
            raise InvalidInput(f"origin must be one of {ORIGINS}, got {self.origin!r}")
        if self.learnt_before_us is not None and (isinstance(self.learnt_before_us, bool)
                                                  or not isinstance(self.learnt_before_us, (int, np.integer))):
            raise InvalidInput(f"learnt_before_us must be an integer (microseconds), got {self.learnt_before_us!r}")
        if len(self.dictionaries) != len(self.slice_columns):
            raise InvalidInput("one dictionary per slice column is required")
        for c, d in zip(self.slice_columns, self.dictionaries, strict=True):
            big = [v for v in d if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
                   and not _INT64[0] <= int(v) <= _INT64[1]]
            if big:
                raise InvalidInput(f"slice column {c!r}: value {int(big[0])} does not fit int64 (integer slice values "
                                   f"are int64 in every input)")
        if len(self.query_names) + 1 >= 2**QUERY_BITS:
            raise InvalidInput(f"at most {2**QUERY_BITS - 2} value queries fit in the {QUERY_BITS}-bit query code")
        if self.total_bits > MAX_BUCKET_BITS:
            raise InvalidInput(
                f"key bits do not fit: slice columns need {self.total_bits - QUERY_BITS} bits + {QUERY_BITS} query bits = "
                f"{self.total_bits} > {MAX_BUCKET_BITS} (exceeds by {self.total_bits - MAX_BUCKET_BITS})"
            )
        for j, (c, d) in enumerate(zip(self.slice_columns, self.dictionaries, strict=True)):
            if len(set(d)) != len(d):
                raise InvalidInput(f"dictionary of slice column {c!r} has duplicate values")
            if slices.size and (slices[:, j].min() < 0 or slices[:, j].max() >= len(d)):
                raise InvalidInput(f"slices: an index of column {c!r} is outside its dictionary of {len(d)} values")
        if slices.shape[0] > 1:
            codes = self._mixed_radix(slices)
            if not (np.diff(codes) > 0).all():
                raise InvalidInput("slices must be unique and sorted (a slice listed twice would get two buckets)")

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, KeyDomain) and self.layout_checksum() == other.layout_checksum()
                and self.conversion_slice_columns == other.conversion_slice_columns)

    def __hash__(self) -> int:
        return hash(self.layout_checksum())

    # ---- construction -----------------------------------------------------------------------
    @classmethod
    def from_slice_values(
        cls, slice_columns: Sequence[str], columns: Mapping[str, Any], query_names: Sequence[str],
        baseline: bool = False, conversion_slice_columns: Sequence[str] = (), origin: str = DATA,
    ) -> KeyDomain:
        """Domain of the distinct slices present in ``columns`` (dict of equal-length arrays); ``origin``:
        where those values come from (``ORIGINS``; by default the data the domain is used on)."""
        frame = pd.DataFrame({c: np.asarray(columns[c]) for c in slice_columns}).drop_duplicates()
        dictionaries = tuple(slice_key(sorted(frame[c].unique().tolist())) for c in slice_columns)
        domain = cls(tuple(slice_columns), dictionaries, np.zeros((0, len(slice_columns))), tuple(query_names),
                     baseline, tuple(conversion_slice_columns), origin)
        idx, valid = domain.dictionary_indices({c: frame[c].to_numpy() for c in slice_columns})
        assert valid.all()
        return domain._with_slices(idx)

    def _with_slices(self, idx: np.ndarray) -> KeyDomain:
        idx = np.unique(np.asarray(idx, dtype=np.int64).reshape(-1, len(self.slice_columns)), axis=0)
        return KeyDomain(self.slice_columns, self.dictionaries, idx, self.query_names, self.baseline,
                         self.conversion_slice_columns, self.origin, self.learnt_before_us)

    def with_origin(self, origin: str) -> KeyDomain:
        """The same layout with another ``origin``."""
        return dataclasses.replace(self, origin=origin)

    def learnt_before(self, last_conversion_us: int) -> KeyDomain:
        """This domain of origin ``history`` learnt from conversions up to ``last_conversion_us`` (the
        exact recorded time: a release of later conversions is after it in any zone its days are cut in,
        as long as both logs record true UTC times; a history exported as naive local time records an
        end shifted by its offset, docs/privacy.md)."""
        return dataclasses.replace(self, learnt_before_us=int(last_conversion_us) + 1)

    # ---- sizes and layout -------------------------------------------------------------------
    @property
    def num_slices(self) -> int:
        return int(self.slices.shape[0])

    @property
    def num_columns(self) -> int:
        """d + 1: value queries plus bottom (or count)."""
        return len(self.query_names) + 1

    @property
    def num_keys(self) -> int:
        return self.num_slices * self.num_columns

    @property
    def bottom_name(self) -> str:
        return COUNT_NAME if self.baseline else BOTTOM_NAME

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(self.query_names) + (self.bottom_name,)

    @property
    def field_bits(self) -> tuple[int, ...]:
        return tuple(max(1, math.ceil(math.log2(max(1, len(d))))) for d in self.dictionaries)

    @property
    def field_offsets(self) -> tuple[int, ...]:
        offsets, off = [], QUERY_BITS
        for bits in reversed(self.field_bits):
            offsets.append(off)
            off += bits
        return tuple(reversed(offsets))

    @property
    def total_bits(self) -> int:
        return QUERY_BITS + sum(self.field_bits)

    def query_code(self, column: int) -> int:
        """Query code of encoder column ``column``: l+1 for value query l, 0 for bottom/count."""
        return 0 if column == len(self.query_names) else column + 1

    # ---- record -> slice --------------------------------------------------------------------
    def dictionary_indices(self, columns: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        """Per record and slice column, the dictionary index; and a mask of records fully known.

        A ``pd.Categorical`` column is looked up by its distinct values only (then taken by code)."""
        arrays = [columns[c] if isinstance(columns[c], pd.Categorical) else np.asarray(columns[c])
                  for c in self.slice_columns]
        n = len(arrays[0]) if arrays else 0
        idx = np.empty((n, len(arrays)), dtype=np.int64)
        for j, (arr, dictionary) in enumerate(zip(arrays, self.dictionaries, strict=True)):
            if isinstance(arr, pd.Categorical):
                found = np.append(pd.Index(list(dictionary)).get_indexer(arr.categories), -1)
                idx[:, j] = found[arr.codes]  # code -1 (a missing value) takes the appended -1
            else:
                idx[:, j] = pd.Index(list(dictionary)).get_indexer(arr)
        return idx, cast(np.ndarray, (idx >= 0).all(axis=1))

    def slice_index(self, columns: Mapping[str, Any]) -> np.ndarray:
        """Dense slice index in [0, m) of each record, -1 where the slice is not in the domain."""
        by_codes = self._categorical_slice_index(columns)
        if by_codes is not None:
            return by_codes
        return self.slice_index_of_indices(*self.dictionary_indices(columns))

    def _categorical_slice_index(self, columns: Mapping[str, Any]) -> np.ndarray | None:
        """``slice_index`` of categorical columns (``Conversions.from_table(categorical_slices=True)``) through
        a table over their categories' combinations (each looked up once): one gather per record instead of
        a lookup per column; None when a column is not categorical or the combinations are too many."""
        arrays = [columns[c] for c in self.slice_columns]
        if not arrays or not all(isinstance(a, pd.Categorical) for a in arrays):
            return None
        sizes = [len(a.categories) + 1 for a in arrays]  # a code -1 (a missing value) is category 0 below
        if math.prod(sizes) > _LOOKUP_TABLE_MAX:
            return None
        combos = np.indices(sizes).reshape(len(sizes), -1).T - 1  # every (code, code, ...) combination
        table = self.slice_index_of_indices(*self.dictionary_indices(
            {c: pd.Categorical.from_codes(combos[:, j], dtype=a.dtype)
             for j, (c, a) in enumerate(zip(self.slice_columns, arrays, strict=True))}))
        code = np.zeros(len(arrays[0]), dtype=np.int64)
        for a, size in zip(arrays, sizes, strict=True):
            code *= size
            code += a.codes
            code += 1
        return table[code]

    def slice_index_of_indices(self, idx: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """``slice_index`` from ``dictionary_indices``' (indices, fully known)."""
        codes = self._mixed_radix(idx)
        space = math.prod(max(1, len(d)) for d in self.dictionaries)
        if space <= _LOOKUP_TABLE_MAX:  # a table over the whole slice space: one gather per record
            table = np.full(space, -1, dtype=np.int64)
            table[self._mixed_radix(self.slices)] = np.arange(self.num_slices)
            return np.where(valid, table[codes], -1)
        domain_codes = self._mixed_radix(self.slices)
        pos = np.searchsorted(domain_codes, codes)
        pos_clipped = np.minimum(pos, max(0, len(domain_codes) - 1))
        found = valid & (len(domain_codes) > 0) & (domain_codes[pos_clipped] == codes if len(domain_codes) else False)
        return np.where(found, pos_clipped, -1)

    def _mixed_radix(self, idx: np.ndarray) -> np.ndarray:
        sizes = [max(1, len(d)) for d in self.dictionaries]
        if math.prod(sizes) >= 2**62:
            raise Unsupported("slice space too large for dense indexing (product of dictionary sizes >= 2^62)")
        code = np.zeros(idx.shape[0], dtype=np.int64)
        for j, size in enumerate(sizes):
            code = code * size + np.clip(idx[:, j], 0, None)
        return code

    def slice_values(self) -> dict[str, list[Any]]:
        """Slice column values of every domain slice, in slice-index order."""
        return {c: [d[i] for i in self.slices[:, j]]
                for j, (c, d) in enumerate(zip(self.slice_columns, self.dictionaries, strict=True))}

    # ---- buckets --------------------------------------------------------------------------------
    def slice_bits(self, slice_row: Sequence[int], columns: Sequence[str] | None = None) -> int:
        """The bits of a slice's fields (optionally only of ``columns``) at their offsets."""
        wanted = set(self.slice_columns if columns is None else columns)
        out = 0
        for c, off, i in zip(self.slice_columns, self.field_offsets, slice_row, strict=True):
            if c in wanted:
                out |= int(i) << off
        return out

    def bucket(self, slice_idx: int, column: int) -> int:
        return self.slice_bits(self.slices[slice_idx]) | self.query_code(column)

    def buckets(self) -> list[int]:
        """128-bit bucket of every dense key id (slice-major, encoder column minor)."""
        out: list[int] = []
        for row in self.slices:
            base = self.slice_bits(row)
            out.extend(base | self.query_code(col) for col in range(self.num_columns))
        return out

    def key_table(self) -> pd.DataFrame:
        """The key map: bucket (hex), slice values, query name (or bottom/count), dense key id."""
        values = self.slice_values()
        m, k = self.num_slices, self.num_columns
        frame = pd.DataFrame({c: np.repeat(np.asarray(v, dtype=object), k) for c, v in values.items()})
        frame["query"] = np.tile(np.asarray(self.column_names, dtype=object), m)
        frame["bucket"] = [f"0x{b:032x}" for b in self.buckets()]
        frame["key_id"] = np.arange(m * k)
        return frame

    # ---- serialisation ------------------------------------------------------------------------
    def to_json(self, params_sha256: str | None = None, learnt: bool = False) -> dict[str, Any]:
        """The key map (``learnt``: with ``learnt_before_us``, for the operator-private parameter version
        only; a published key map of a history domain leaves it out, and read back as ``--domain`` it
        takes the version's when their layouts match: ``mechanism.release.release_domain``)."""
        return {
            "format_version": KEYMAP_FORMAT_VERSION,
            "slice_columns": list(self.slice_columns),
            "conversion_slice_columns": list(self.conversion_slice_columns),
            "dictionaries": {c: list(d) for c, d in zip(self.slice_columns, self.dictionaries, strict=True)},
            "queries": list(self.query_names),
            "bottom_name": self.bottom_name,
            "query_bits": QUERY_BITS,
            "field_bits": dict(zip(self.slice_columns, self.field_bits, strict=True)),
            "slices": self.slices.tolist(),
            "layout_sha256": self.layout_checksum(),
            "params_sha256": params_sha256,
            "origin": self.origin,
            # (only when known and asked for: key maps and parameter files without it keep their bytes)
            **({"learnt_before_us": int(self.learnt_before_us)} if learnt and self.learnt_before_us is not None
               else {}),
        }

    def layout_checksum(self) -> str:
        blob = json.dumps([list(self.slice_columns), [list(d) for d in self.dictionaries], self.slices.tolist(),
                           list(self.query_names), self.baseline], sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()

    @classmethod
    def from_json(cls, data: Mapping[str, Any], source: str = "key map", embedded: bool = False) -> KeyDomain:
        """A key map file (``embedded=False``: its ``origin`` and the ``params_sha256`` of the parameters
        it was written for are required) or the domain a parameter version carries (``embedded``: its
        recorded ``origin``, ``history`` when none is recorded); the layout checksum is always checked."""
        if not isinstance(data, Mapping):
            raise InvalidInput(f"{source}: a key map is a JSON object")
        # a parameter file's domain is the history's unless it says otherwise (files written before
        # domains kept their origin in parameter files hold the training history's slices)
        origin = str(data.get("origin", HISTORY)) if embedded else str(data.get("origin"))
        try:
            cols = tuple(data["slice_columns"])
            dicts = tuple(tuple(data["dictionaries"][c]) for c in cols)
            domain = cls(cols, dicts, np.asarray(data["slices"], dtype=np.int64).reshape(-1, len(cols)),
                         tuple(data["queries"]), data.get("bottom_name") == COUNT_NAME,
                         tuple(data.get("conversion_slice_columns", ())), origin, data.get("learnt_before_us"))
        except (KeyError, TypeError, OverflowError) as exc:
            raise InvalidInput(f"{source}: malformed key map ({exc!r})") from None
        except ValueError as exc:
            if origin not in ORIGINS:
                raise InvalidInput(f"{source}: key map has no valid origin ({data.get('origin')!r}, one of {ORIGINS} "
                                   f"expected; key maps written before origins were recorded must be written "
                                   f"again)") from None
            raise InvalidInput(f"{source}: {exc}") from None
        recorded = data.get("layout_sha256")
        if not isinstance(recorded, str) or not recorded:
            raise InvalidInput(f"{source}: key map has no layout_sha256: its integrity cannot be checked "
                               f"(to declare a domain by hand, list slice values in a .csv or .json file instead)")
        if recorded != domain.layout_checksum():
            raise InvalidInput(f"{source}: layout checksum mismatch (file edited or corrupt)")
        sha = data.get("params_sha256")
        if not embedded and not (isinstance(sha, str) and len(sha) == 64 and set(sha) <= _SHA256_HEX):
            raise InvalidInput(f"{source}: key map has no params_sha256 (the checksum of the parameter file it was "
                               f"written for): it cannot be checked against the parameters")
        return domain

    def save(self, path: str | os.PathLike[str], params_sha256: str) -> None:
        """A key map file for the parameters whose checksum is ``params_sha256``."""
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(jsonio.dumps(self.to_json(params_sha256), indent=1))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> KeyDomain:
        return cls.from_json(jsonio.load(path, "key map"), source=os.fspath(path))


def bucket_to_bytes(bucket: int) -> bytes:
    """16-byte big-endian encoding (the output-domain Avro's ``bucket`` field)."""
    return int(bucket).to_bytes(16, "big")


def bucket_from_bytes(raw: bytes) -> int:
    """Big-endian bytes, possibly with leading zero bytes dropped (summary report Avro)."""
    if len(raw) > 16:
        raise InvalidInput(f"bucket has {len(raw)} bytes; ARA buckets are at most 16 (128 bits)")
    return int.from_bytes(raw, "big")


def _coerce(value: Any, family: str, column: str, source: str) -> Any:
    """A declared slice value in the input's type family (integer, string or boolean)."""
    if isinstance(value, np.generic):
        value = value.item()
    if family == "integer":
        if isinstance(value, bool) or not (isinstance(value, int)
                                           or (isinstance(value, str) and value.strip().lstrip("-").isdigit())
                                           or (isinstance(value, float) and value.is_integer())):
            raise InvalidInput(f"{source}: slice column {column!r} holds integers in the input, "
                               f"but the domain lists {value!r}")
        return int(value)
    if family == "boolean":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        raise InvalidInput(f"{source}: slice column {column!r} holds booleans in the input, but the domain lists {value!r}")
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise InvalidInput(f"{source}: slice column {column!r} holds strings in the input, but the domain lists {value!r}")
    return str(value)


def domain_from_rows(rows: pd.DataFrame, slice_columns: Sequence[str], query_names: Sequence[str], baseline: bool,
                     conversion_slice_columns: Sequence[str], families: Mapping[str, str],
                     source: str = "domain file") -> KeyDomain:
    """A declared domain from a table listing slice values (one row per slice, one column per slice
    column), with values coerced to the input's type family (``families``: column -> integer/string/boolean).
    A table with an ``origin`` column (``ORIGIN_COLUMN``: araopt writes one when it lists a layout derived
    from data, e.g. ``export-attribution --conversions``) has that origin, one of ``ORIGINS`` on every row:
    a file written from the data does not become a declaration by being a CSV."""
    origin = DECLARED
    # any spelling of the column (case, spaces) is the origin column: a header edited or re-exported by a
    # spreadsheet must not turn a data- or history-derived layout into a declaration
    named = [c for c in rows.columns if str(c).strip().lower() == ORIGIN_COLUMN and c not in slice_columns]
    if len(named) > 1:
        raise InvalidInput(f"{source}: {len(named)} origin columns ({named}): one is allowed")
    if named:
        column = rows[named[0]]
        found = sorted({"" if pd.isna(v) else str(v) for v in column.tolist()})
        if len(found) != 1 or found[0] not in ORIGINS:
            raise InvalidInput(f"{source}: column {ORIGIN_COLUMN!r} must name one origin of {ORIGINS} on every row, got "
                               f"{found} ('' is a row without one)")
        origin = found[0]
    missing = [c for c in slice_columns if c not in rows.columns]
    if missing:
        raise InvalidInput(f"{source}: missing slice column(s) {missing}; it has {list(rows.columns)}")
    if len(rows) == 0:
        raise InvalidInput(f"{source}: lists no slices")
    cols = {}
    for c in slice_columns:
        if rows[c].isna().any():
            raise InvalidInput(f"{source}: slice column {c!r} has an empty value")
        cols[c] = np.asarray([_coerce(v, families.get(c, "string"), c, source) for v in rows[c].tolist()], dtype=object)
    duplicated = pd.DataFrame(cols).duplicated()
    if duplicated.any():
        raise InvalidInput(f"{source}: slice {pd.DataFrame(cols)[duplicated].iloc[0].to_dict()} is listed twice")
    return KeyDomain.from_slice_values(slice_columns, cols, query_names, baseline, conversion_slice_columns, origin)


def check_domain_families(domain: KeyDomain, families: Mapping[str, str], source: str = "domain") -> None:
    """Refuse a domain whose slice values are not of the input's type (they would match no row)."""
    for column, dictionary in zip(domain.slice_columns, domain.dictionaries, strict=True):
        family = families.get(column)
        if family is None:
            continue
        for value in dictionary:
            if (_coerce(value, family, column, source) != value
                    or type(_coerce(value, family, column, source)) is not type(value)):
                raise InvalidInput(f"{source}: slice column {column!r} holds {family} values in the input, but the "
                                   f"domain lists {value!r} ({type(value).__name__})")
