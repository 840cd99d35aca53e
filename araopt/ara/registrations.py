"""ARA registrations for the paper's aggregation keys, ARA limits, and reconstruction from reports.

The paper's keys K = ([d] ∪ {⊥}) × [m] (Sec. 4.1) become ARA registrations as in Fig. 1, with the
bit layout of :mod:`araopt.mechanism.keys` (most significant first)::

    [ impression slice fields | conversion slice fields | query code (8 bits) ]

* Source (``Attribution-Reporting-Register-Source``), one per slice of impression features:
  ``aggregation_keys`` has one key per value query and one for ⊥ (``count`` for the baseline); every
  key's piece carries the impression-side slice fields.
* Trigger (``Attribution-Reporting-Register-Trigger``), one per conversion:
  ``aggregatable_trigger_data`` entries whose ``key_piece`` carries the conversion-side slice fields
  and the query code (l for q_l, 0 for ⊥), each naming its ``source_keys``; ``aggregatable_values``
  holds the encoder's integers (Alg. 3 / Alg. 6 / baseline). ARA wants values in [1, 65536], so
  keys whose value is 0 are left out (they add nothing); a trigger's total is ⌊Γ/C⌋ ≤ 65536.
* The browser ORs each source key's piece with the trigger pieces naming it: the result is the
  bucket :meth:`KeyDomain.bucket` gives for that (slice, query), i.e. the dense key id
  ``slice * (d+1) + column`` the measurement pipeline aggregates over.

Limits (ARA / Aggregation Service, see ``notes/measured-facts.md``): at most 20 aggregation keys per
source with names of at most 25 characters, key pieces of at most 128 bits (32 hex digits),
aggregatable values in [1, 65536], a trigger total of at most 65536, at most 20 aggregatable
reports per source. :func:`check_ara_limits` refuses a configuration that cannot be expressed,
saying which limit and by how much.
"""
from __future__ import annotations

import math
import os
import random
import re
import secrets
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from araopt.constants import (
    CONTRIBUTION_BUDGET,
    DESTINATION,
    MAX_BUCKET_BITS,
    MAX_KEY_NAME_LENGTH,
    MAX_KEYS_PER_SOURCE,
    MAX_REPORTS_PER_SOURCE,
    QUERY_BITS,
)
from araopt.errors import InvalidInput, InvalidParameters
from araopt.io import jsonio
from araopt.mechanism.bounding import impression_order
from araopt.mechanism.encoding import EncoderTable, count_scale, query_scales
from araopt.mechanism.keys import BOTTOM_NAME, COUNT_NAME, KeyDomain
from araopt.mechanism.params import Encoding, Params
from araopt.version import ParameterVersion

REGISTER_SOURCE = "Attribution-Reporting-Register-Source"
REGISTER_TRIGGER = "Attribution-Reporting-Register-Trigger"
# ARA's limits, by the names the browser side uses for them (defined once in ``araopt.constants``)
ARA_MAX_KEYS_PER_SOURCE = MAX_KEYS_PER_SOURCE
ARA_MAX_KEY_NAME_LENGTH = MAX_KEY_NAME_LENGTH
ARA_MAX_VALUE = CONTRIBUTION_BUDGET  # an aggregatable value is at most the budget: [1, 65536]
ARA_CONTRIBUTION_BUDGET = CONTRIBUTION_BUDGET
ARA_MAX_REPORTS_PER_SOURCE = MAX_REPORTS_PER_SOURCE  # Alg. 1 applies it (mechanism.bounding)
ARA_MAX_KEY_BITS = MAX_BUCKET_BITS
DEFAULT_DESTINATION = DESTINATION


def destination_site(url: str) -> str:
    """The ``destination`` of a source registration as Chrome takes it: a potentially trustworthy
    HTTP(S) URL (https, or http only for localhost / loopback), reduced to its site: scheme and
    registrable domain (eTLD+1 by the Public Suffix List); path, port and subdomains go."""
    import ipaddress
    from urllib.parse import urlsplit

    parsed = urlsplit(str(url).strip())
    scheme, host = parsed.scheme.lower(), (parsed.hostname or "").lower().rstrip(".")
    if scheme not in ("https", "http") or not host:
        raise InvalidParameters(f"--destination must be an http(s) URL with a host, got {url!r}")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    local = host == "localhost" or host.endswith(".localhost") or (ip is not None and ip.is_loopback)
    if scheme == "http" and not local:
        raise InvalidParameters(f"--destination {url!r}: Chrome refuses it (URL must use HTTP/HTTPS and be potentially "
                                f"trustworthy): use https://")
    if ip is not None:
        return f"{scheme}://{host if ip.version == 4 else '[' + host + ']'}"
    if local:
        return f"{scheme}://localhost"
    from publicsuffixlist import PublicSuffixList

    registrable = PublicSuffixList().privatesuffix(host)
    if registrable is None:
        raise InvalidParameters(f"--destination {url!r}: {host!r} is a public suffix, not a site")
    return f"{scheme}://{registrable}"

_HEX_PIECE = re.compile(r"^0[xX][0-9A-Fa-f]{1,32}$")
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")


# ---- names and pieces ----------------------------------------------------------------------------
def aggregation_key_names(params: Params) -> tuple[str, ...]:
    """ARA key names in encoder column order: one per value query, then ``bottom`` (``count`` for baseline).

    Query names are the column names with characters other than ``[A-Za-z0-9_.-]`` replaced by
    ``_``, cut to 25 characters and made unique with a ``_<n>`` suffix.
    """
    bottom = COUNT_NAME if params.encoding == Encoding.BASELINE else BOTTOM_NAME
    used = {bottom}
    names = []
    for column in params.query_columns:
        base = _NAME_UNSAFE.sub("_", column)[:ARA_MAX_KEY_NAME_LENGTH] or "q"
        name, k = base, 1
        while name in used:
            suffix = f"_{k}"
            name = base[: ARA_MAX_KEY_NAME_LENGTH - len(suffix)] + suffix
            k += 1
        used.add(name)
        names.append(name)
    return tuple(names) + (bottom,)


def key_piece_hex(piece: int) -> str:
    """ARA key-piece string: ``0x`` + 1..32 lower-case hex digits (no padding)."""
    if not 0 <= piece < 2**ARA_MAX_KEY_BITS:
        raise InvalidParameters(f"key piece {piece} does not fit in {ARA_MAX_KEY_BITS} bits")
    return f"0x{piece:x}"


def impression_slice_columns(params: Params) -> tuple[str, ...]:
    """Slice columns carried by the source piece (impression features), in slice order."""
    return params.impression_slice_columns


def conversion_slice_columns(params: Params) -> tuple[str, ...]:
    """Slice columns carried by the trigger piece (conversion features), in slice order."""
    conv = set(params.conversion_slice_columns)
    return tuple(c for c in params.slice_columns if c in conv)


# ---- limits --------------------------------------------------------------------------------------
def field_bits(cardinality: int) -> int:
    """Bits of one slice field: ceil(log2(#values)), at least 1 (as :attr:`KeyDomain.field_bits`)."""
    return max(1, math.ceil(math.log2(max(1, int(cardinality)))))


@dataclass(frozen=True)
class AraRequirements:
    """What a configuration needs from ARA, to compare with ARA's limits."""

    keys_per_source: int
    max_value: int
    max_trigger_total: int
    slice_bits: int
    max_key_name_length: int
    reports_per_source: int
    reports_per_source_guaranteed: bool
    contribution_budget: int
    num_queries: int

    @property
    def key_bits(self) -> int:
        return self.slice_bits + QUERY_BITS

    def violations(self) -> list[str]:
        """One message per ARA limit the configuration exceeds, with the excess."""
        out = []
        if self.keys_per_source > ARA_MAX_KEYS_PER_SOURCE:
            out.append(
                f"aggregation keys per source: {self.keys_per_source} ({self.num_queries} value queries + 1 bottom) > "
                f"ARA limit {ARA_MAX_KEYS_PER_SOURCE} (exceeds by {self.keys_per_source - ARA_MAX_KEYS_PER_SOURCE}); "
                f"drop value queries")
        if self.max_value > ARA_MAX_VALUE:
            out.append(f"aggregatable value: up to {self.max_value} > ARA limit {ARA_MAX_VALUE} "
                       f"(exceeds by {self.max_value - ARA_MAX_VALUE})")
        if self.max_trigger_total > ARA_CONTRIBUTION_BUDGET:
            out.append(f"aggregatable values per trigger: total up to {self.max_trigger_total} > ARA contribution budget "
                       f"{ARA_CONTRIBUTION_BUDGET} (exceeds by {self.max_trigger_total - ARA_CONTRIBUTION_BUDGET})")
        if self.key_bits > ARA_MAX_KEY_BITS:
            out.append(f"key bits: {self.slice_bits} slice bits + {QUERY_BITS} query bits = {self.key_bits} > ARA limit "
                       f"{ARA_MAX_KEY_BITS} (exceeds by {self.key_bits - ARA_MAX_KEY_BITS}); coarsen or drop slice columns")
        if self.max_key_name_length > ARA_MAX_KEY_NAME_LENGTH:
            out.append(f"aggregation key name length: {self.max_key_name_length} > ARA limit {ARA_MAX_KEY_NAME_LENGTH} "
                       f"(exceeds by {self.max_key_name_length - ARA_MAX_KEY_NAME_LENGTH})")
        if self.reports_per_source_guaranteed and self.reports_per_source > ARA_MAX_REPORTS_PER_SOURCE:
            out.append(f"aggregatable reports per source: count_limit C = {self.reports_per_source} conversions "
                       f"per impression "
                       f"> ARA limit {ARA_MAX_REPORTS_PER_SOURCE} reports per source "
                       f"(exceeds by {self.reports_per_source - ARA_MAX_REPORTS_PER_SOURCE})")
        return out

    def warnings(self) -> list[str]:
        """Differences between the browser and the simulation that do not make the configuration inexpressible.

        (More than 20 conversions of an impression fitting the baseline's budget is not one: the
        simulation's Alg. 1 keeps at most 20 reports per source, as the browser does.)"""
        out = []
        if self.contribution_budget != ARA_CONTRIBUTION_BUDGET:
            out.append(f"contribution_budget Γ = {self.contribution_budget} but the browser budgets "
                       f"{ARA_CONTRIBUTION_BUDGET} per "
                       f"source and the Aggregation Service adds noise DLap(ε/{ARA_CONTRIBUTION_BUDGET}): a simulation with "
                       f"Γ = {self.contribution_budget} does not reproduce real reports")
        return out


class AraLimitError(InvalidParameters):
    """A configuration that cannot be expressed in ARA; ``violations`` lists every exceeded limit."""

    def __init__(self, violations: Sequence[str]) -> None:
        self.violations = tuple(violations)
        super().__init__("configuration exceeds ARA limits: " + "; ".join(self.violations))


def ara_requirements(params: Params, cardinalities: Sequence[int]) -> AraRequirements:
    """Requirements of ``params`` with slice columns of the given numbers of distinct values."""
    d = params.num_queries
    budget = params.per_conversion_budget
    scales = [int(s) for s in query_scales(params)]
    if params.encoding == Encoding.BASELINE:
        cscale = count_scale(params)
        max_value, total = max([cscale] + scales), cscale + sum(scales)
        min_norm = max(1, cscale)  # a conversion with all values 0 still sends the count key
        reports, guaranteed = ARA_CONTRIBUTION_BUDGET // min_norm, False
    else:  # every contribution has L1 norm floor(Gamma / C) exactly (Lemma 4.1 / Alg. 6)
        max_value, total = budget, budget
        reports, guaranteed = params.count_limit, True
    names = aggregation_key_names(params)
    return AraRequirements(
        keys_per_source=d + 1, max_value=max_value, max_trigger_total=total,
        slice_bits=sum(field_bits(c) for c in cardinalities), max_key_name_length=max(len(n) for n in names),
        reports_per_source=reports, reports_per_source_guaranteed=guaranteed,
        contribution_budget=params.contribution_budget, num_queries=d,
    )


def check_ara_limits_for_cardinalities(params: Params, cardinalities: Sequence[int]) -> list[str]:
    """Raise :class:`AraLimitError` if the configuration cannot be expressed; else return warnings."""
    req = ara_requirements(params, cardinalities)
    bad = req.violations()
    if bad:
        raise AraLimitError(bad)
    return req.warnings()


def check_ara_limits(params: Params, domain: KeyDomain) -> None:
    """Refuse (:class:`AraLimitError`, a ValueError) a configuration ARA cannot express, naming the limit and excess.

    Also refuses a domain that does not belong to ``params`` (other columns, queries or encoding).
    """
    check_domain_matches(params, domain)
    check_ara_limits_for_cardinalities(params, [len(d) for d in domain.dictionaries])


def ara_warnings(params: Params, domain: KeyDomain | None = None) -> list[str]:
    """Non-fatal differences between what ARA does and what the simulation (``measure``) assumes."""
    cards = [len(d) for d in domain.dictionaries] if domain is not None else []
    return ara_requirements(params, cards).warnings()


# ---- domains and key maps ------------------------------------------------------------------------
def check_domain_matches(params: Params, domain: KeyDomain) -> None:
    """Refuse a key domain built for other slice columns, queries or encoding than ``params``."""
    problems = []
    if tuple(domain.slice_columns) != params.slice_columns:
        problems.append(f"slice columns {list(domain.slice_columns)} != {list(params.slice_columns)}")
    if tuple(domain.query_names) != params.query_columns:
        problems.append(f"queries {list(domain.query_names)} != {list(params.query_columns)}")
    if domain.baseline != (params.encoding == Encoding.BASELINE):
        problems.append(f"key map is for {'the baseline' if domain.baseline else 'a bottom-key'} encoding, "
                        f"parameters use {params.encoding!r}")
    if set(domain.conversion_slice_columns) != set(params.conversion_slice_columns):
        problems.append(f"conversion slice columns {sorted(domain.conversion_slice_columns)} != "
                        f"{sorted(params.conversion_slice_columns)}")
    if problems:
        raise InvalidInput("key map does not match the parameter file: " + "; ".join(problems))


@dataclass(frozen=True)
class KeyMap:
    """A saved key domain with the checksum of the parameter file it was exported for."""

    domain: KeyDomain
    params_sha256: str
    source: str = "key map"

    @classmethod
    def from_json(cls, data: Mapping[str, Any], source: str = "key map") -> KeyMap:
        """A key map file; its ``params_sha256`` and ``origin`` are required (``KeyDomain.from_json``)."""
        domain = KeyDomain.from_json(data, source=source)
        return cls(domain, str(data["params_sha256"]), source)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> KeyMap:
        path = os.fspath(path)
        return cls.from_json(jsonio.load(path, "key map"), source=path)

    def matches(self, version: ParameterVersion) -> bool:
        """Whether the key map was exported for exactly this parameter file (sha256)."""
        return self.params_sha256 == version.checksum()

    def domain_for(self, version: ParameterVersion, params_source: str = "parameter file") -> KeyDomain:
        """The domain, after checking that it was exported for exactly this parameter file (sha256)."""
        if not self.matches(version):
            raise InvalidInput(
                f"{params_source} does not match key map {self.source}: its sha256 {version.checksum()[:12]}… differs "
                f"from the key map's params_sha256 {str(self.params_sha256)[:12]}… (export-ara was run with other "
                f"parameters)")
        check_domain_matches(version.params, self.domain)
        return self.domain


def key_map_json(version: ParameterVersion, domain: KeyDomain) -> dict[str, Any]:
    """The key map written by export-ara: the domain layout plus the parameter file's sha256."""
    return domain.to_json(params_sha256=version.checksum())


def resolve_domain(version: ParameterVersion | Params,
                   domain_or_keymap: KeyDomain | KeyMap | Mapping[str, Any] | str | os.PathLike[str]) -> KeyDomain:
    """A :class:`KeyDomain` from a domain, a :class:`KeyMap`, a parsed key-map JSON or its path; checked against
    the parameters (a key map against the parameter file it was exported for: give the version)."""
    params = version.params if isinstance(version, ParameterVersion) else version
    if isinstance(domain_or_keymap, KeyDomain):
        check_domain_matches(params, domain_or_keymap)
        return domain_or_keymap
    if not isinstance(version, ParameterVersion):
        raise InvalidParameters("a key map is checked against the parameter file it was exported for: pass the "
                                "ParameterVersion, not its Params")
    if isinstance(domain_or_keymap, KeyMap):
        return domain_or_keymap.domain_for(version)
    if isinstance(domain_or_keymap, Mapping):
        return KeyMap.from_json(domain_or_keymap).domain_for(version)
    return KeyMap.load(domain_or_keymap).domain_for(version)


def _field_offset(domain: KeyDomain, column: str) -> int:
    return domain.field_offsets[domain.slice_columns.index(column)]


def aggregatable_values(names: Sequence[str], contribution: Sequence[int]) -> dict[str, int]:
    """A trigger's ``aggregatable_values`` for one encoded contribution: keys whose value is 0 left out
    (ARA wants [1, 65536]); a value outside [0, 65536] is refused (an encoder bug, Lemma 4.1), never emitted."""
    values: dict[str, int] = {}
    for name, w in zip(names, contribution, strict=True):
        if not 0 <= w <= ARA_MAX_VALUE:
            raise InvalidInput(f"encoded value {w} of key {name!r} is outside [0, {ARA_MAX_VALUE}]: "
                               f"{tuple(contribution)}")
        if w:
            values[name] = int(w)
    return values


def with_extra(registration: dict[str, Any], extra: Mapping[str, Any] | None) -> dict[str, Any]:
    """``registration`` with the caller's other header fields, which may not overwrite its aggregation part."""
    if extra:
        clash = set(extra) & set(registration)
        if clash:
            raise InvalidInput(f"extra fields {sorted(clash)} would overwrite the aggregation registration")
        registration.update(extra)
    return registration


# ---- sources -------------------------------------------------------------------------------------
def _py(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v


class SourceEncoder:
    """Source registrations (one per slice of impression features), precomputed for per-impression lookup."""

    def __init__(self, version: ParameterVersion | Params,
                 domain_or_keymap: KeyDomain | KeyMap | Mapping[str, Any] | str | os.PathLike[str],
                 destination: str | Sequence[str] = DEFAULT_DESTINATION) -> None:
        domain = resolve_domain(version, domain_or_keymap)
        params = version.params if isinstance(version, ParameterVersion) else version
        check_ara_limits(params, domain)
        self.params = params
        self.domain = domain
        self.destination = destination if isinstance(destination, str) else list(destination)
        self.key_names = aggregation_key_names(params)
        self.columns = impression_slice_columns(params)
        cols = [domain.slice_columns.index(c) for c in self.columns]
        rows, first = (np.unique(domain.slices[:, cols], axis=0, return_index=True) if domain.num_slices
                       else (np.zeros((0, len(cols)), dtype=np.int64), np.zeros(0, dtype=np.int64)))
        self._index: dict[tuple[Any, ...], int] = {}
        self._row_index: dict[tuple[int, ...], int] = {}
        slices, pieces = [], []
        for i, (row, j) in enumerate(zip(rows, first, strict=True)):
            values = tuple(domain.dictionaries[c][int(k)] for c, k in zip(cols, row, strict=True))
            self._index[values] = i
            self._row_index[tuple(int(k) for k in row)] = i
            slices.append(dict(zip(self.columns, values, strict=True)))
            pieces.append(domain.slice_bits(domain.slices[j], self.columns))
        self.slices: tuple[dict[str, Any], ...] = tuple(slices)
        self.pieces: tuple[int, ...] = tuple(pieces)

    def __len__(self) -> int:
        return len(self.pieces)

    def index(self, impression_slice: Mapping[str, Any]) -> int:
        """Index of the source registration for these impression-side slice values (ValueError if none)."""
        try:
            key = tuple(impression_slice[c] for c in self.columns)
        except KeyError as exc:
            raise InvalidInput(f"impression slice value for column {exc.args[0]!r} is missing") from None
        i = self._index.get(tuple(_py(v) for v in key))
        if i is None:  # (key may have the wrong length here: show what pairs up)
            raise InvalidInput(f"impression slice {dict(zip(self.columns, key, strict=False))} is not in the key domain")
        return i

    def row_index(self, dictionary_indices: Sequence[int]) -> int:
        """Source index for impression-side dictionary indices (in ``columns`` order); -1 if none."""
        return self._row_index.get(tuple(int(k) for k in dictionary_indices), -1)

    def registration_at(self, i: int, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        piece = key_piece_hex(self.pieces[i])
        return with_extra({"destination": self.destination,
                           "aggregation_keys": {name: piece for name in self.key_names}}, extra)

    def registration(self, impression_slice: Mapping[str, Any], extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """``Attribution-Reporting-Register-Source`` JSON for an impression; ``extra`` adds other fields."""
        return self.registration_at(self.index(impression_slice), extra)

    def header(self, impression_slice: Mapping[str, Any], extra: Mapping[str, Any] | None = None) -> str:
        return jsonio.dumps(self.registration(impression_slice, extra), separators=(",", ":"))

    def all_registrations(self) -> list[dict[str, Any]]:
        """Every source registration with its slice: ``[{"source_index", "slice", "registration"}]``."""
        return [{"source_index": i, "slice": dict(s), "registration": self.registration_at(i)}
                for i, s in enumerate(self.slices)]


# ---- triggers ------------------------------------------------------------------------------------
def _pairwise_sum(xs: Sequence[float]) -> float:
    """Sum in numpy's order for a contiguous row of length <= 128 (``ndarray.sum`` bit for bit)."""
    n = len(xs)
    if n < 8:
        s = 0.0
        for x in xs:
            s += x
        return s
    acc = list(xs[:8])
    i = 8
    stop = n - n % 8
    while i < stop:
        for j in range(8):
            acc[j] += xs[i + j]
        i += 8
    s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))
    while i < n:
        s += xs[i]
        i += 1
    return s


def _secure_uniforms(k: int) -> list[float]:
    """k uniforms on [0, 1) with 53 random bits each, from one call to the OS CSPRNG."""
    bits = secrets.randbits(53 * k)
    mask = (1 << 53) - 1
    return [((bits >> (53 * i)) & mask) * 2.0**-53 for i in range(k)]


class TriggerEncoder:
    """Per-conversion trigger registration (Alg. 3 / Alg. 6 / baseline), for ad servers, one record at a time.

    Pure Python on floats (no numpy per call), from the same :class:`~araopt.mechanism.encoding.EncoderTable`
    as :func:`araopt.mechanism.encoding.encode`, in the same order of floating-point operations: given the
    same uniforms it returns exactly what ``encode`` returns for the record (tested against it over
    encodings, C, Gamma, clip thresholds, fractions and every finite value). Rounding randomness comes from
    ``uniforms`` if given, else ``rng`` (a numpy Generator or a ``random.Random``), else the OS CSPRNG.
    Values outside [0, 65536] are never emitted.
    """

    def __init__(self, version: ParameterVersion | Params,
                 domain_or_keymap: KeyDomain | KeyMap | Mapping[str, Any] | str | os.PathLike[str]) -> None:
        domain = resolve_domain(version, domain_or_keymap)
        params = version.params if isinstance(version, ParameterVersion) else version
        check_ara_limits(params, domain)
        self.params = params
        self.domain = domain
        self.key_names = aggregation_key_names(params)
        self.columns = conversion_slice_columns(params)
        d = params.num_queries
        table = EncoderTable.of(params)
        self.table = table
        self._thresholds = table.clip_thresholds
        self._scales = tuple(float(s) for s in table.query_scales)  # as encode: min(v, C_l) / C_l * scale
        self._codes = tuple(domain.query_code(c) for c in range(d + 1))
        self._lookup = tuple({_py(v): i for i, v in enumerate(domain.dictionaries[domain.slice_columns.index(c)])}
                             for c in self.columns)
        self._offsets = tuple(_field_offset(domain, c) for c in self.columns)
        cols = [domain.slice_columns.index(c) for c in self.columns]
        combos = {tuple(int(x) for x in row) for row in domain.slices[:, cols]} if cols else {()}
        self._pieces = {combo: self.pieces_for_indices(combo) for combo in combos}

    @property
    def num_uniforms(self) -> int:
        """Uniforms one record consumes: d (L-inf, baseline), 1 (L1 randomized), 0 (L1 floor)."""
        return self.table.uniforms_per_record

    def pieces_for_indices(self, combo: tuple[int, ...]) -> tuple[str | None, ...]:
        """Key pieces per encoder column for conversion-side dictionary indices (None where 0)."""
        bits = 0
        for idx, off in zip(combo, self._offsets, strict=True):
            bits |= idx << off
        return tuple(key_piece_hex(bits | code) if bits | code else None for code in self._codes)

    def _uniforms(self, rng: Any, uniforms: Sequence[float] | None) -> list[float]:
        k = self.num_uniforms
        if uniforms is not None:
            u = [float(x) for x in uniforms]
            if len(u) < k or any(not 0.0 <= x < 1.0 for x in u[:k]):
                raise InvalidParameters(f"need {k} uniforms on [0, 1), got {uniforms!r}")
            return u
        if k == 0:
            return []
        if rng is None:
            return _secure_uniforms(k)
        if isinstance(rng, np.random.Generator):
            return cast(list[float], rng.random(k).tolist())
        if isinstance(rng, random.Random):
            return [rng.random() for _ in range(k)]
        raise InvalidParameters(f"rng must be a numpy Generator or random.Random, got {type(rng).__name__}")

    def _values(self, values: Mapping[str, float]) -> list[float]:
        out = []
        for q in self.params.query_columns:
            try:
                v = float(values[q])
            except KeyError:
                raise InvalidInput(f"value of query {q!r} is missing") from None
            except (TypeError, ValueError):
                raise InvalidInput(f"value of query {q!r} must be a number, got {values[q]!r}") from None
            if not math.isfinite(v) or v < 0:
                raise InvalidInput(f"value of query {q!r} must be finite and >= 0, got {values[q]!r}")
            out.append(v)
        return out

    def contributions(self, values: Mapping[str, float], *, rng: Any = None,
                      uniforms: Sequence[float] | None = None) -> tuple[int, ...]:
        """The record's histogram contribution (d+1 integers: queries, then bottom / count)."""
        vals = self._values(values)
        u = self._uniforms(rng, uniforms)
        t = self._thresholds
        table = self.table
        if table.encoding != Encoding.L1:
            w = []
            # not strict: a caller may pass more uniforms than the d this encoding consumes
            for v, ti, scale, ui in zip(vals, t, self._scales, u, strict=False):
                omega = min(v, ti) / ti * scale  # clipped first; exactly the scale when clipped (Lemma 4.1)
                low = math.floor(omega)
                w.append(low + (1 if ui < omega - low else 0))
            w.append(table.budget - sum(w) if table.count_scale is None else table.count_scale)
            return tuple(w)
        scaled = [v / ti for v, ti in zip(vals, t, strict=True)]
        norm = _pairwise_sum(scaled) if len(scaled) <= 128 else float(np.sum(scaled))
        if not math.isfinite(norm):  # as encoding.l1_scaled: the direction of a vector that overflows
            parts = [(math.frexp(v), math.frexp(ti)) for v, ti in zip(vals, t, strict=True)]
            top = max(ev - et for (mv, ev), (_, et) in parts if mv > 0)
            scaled = [math.ldexp(mv / mt, ev - et - top) for (mv, ev), (mt, et) in parts]
            total = _pairwise_sum(scaled) if len(scaled) <= 128 else float(np.sum(scaled))
            scaled = [s / total for s in scaled]
            norm = _pairwise_sum(scaled) if len(scaled) <= 128 else float(np.sum(scaled))
        shrink = 1.0 / max(1.0, norm)
        if table.l1_rounding == "floor":
            factor = shrink * table.l1_floor_scale
            w = [math.floor(s * factor) for s in scaled]
        else:
            factor = shrink * table.budget
            offset = u[0]
            budget = float(table.budget)
            prev = math.floor(offset)
            acc = 0.0
            w = []
            for s in scaled:
                acc += s * factor
                # clamped: in floats budget + offset rounds up to budget + 1 when offset > 1 - 2^-39 or so
                cut = min(math.floor(min(acc, budget) + offset), table.budget)
                w.append(cut - prev)
                prev = cut
        w.append(table.budget - sum(w))
        return tuple(w)

    def pieces(self, conversion_slice_values: Mapping[str, Any] | None = None) -> tuple[str | None, ...]:
        """Trigger key pieces per encoder column (None where the piece is 0 and the entry can be left out)."""
        if not self.columns:
            return self._pieces[()]
        sv = conversion_slice_values or {}
        combo = []
        for c, lookup in zip(self.columns, self._lookup, strict=True):
            if c not in sv:
                raise InvalidInput(f"conversion slice value for column {c!r} is missing")
            i = lookup.get(_py(sv[c]))
            if i is None:
                raise InvalidInput(f"conversion slice value {sv[c]!r} of column {c!r} is not in the key domain")
            combo.append(i)
        key = tuple(combo)
        found = self._pieces.get(key)
        return found if found is not None else self.pieces_for_indices(key)

    def registration_from(self, contribution: Sequence[int], pieces: Sequence[str | None],
                          extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Trigger JSON from an encoded contribution and its key pieces (keys with value 0 left out)."""
        values = aggregatable_values(self.key_names, contribution)
        trigger_data = [{"key_piece": piece, "source_keys": [name]}
                        for name, piece in zip(self.key_names, pieces, strict=True) if name in values and piece is not None]
        return with_extra({"aggregatable_trigger_data": trigger_data, "aggregatable_values": values}, extra)

    def registration(self, values: Mapping[str, float], conversion_slice_values: Mapping[str, Any] | None = None, *,
                     rng: Any = None, uniforms: Sequence[float] | None = None,
                     extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """``Attribution-Reporting-Register-Trigger`` JSON for one conversion."""
        pieces = self.pieces(conversion_slice_values)
        return self.registration_from(self.contributions(values, rng=rng, uniforms=uniforms), pieces, extra)

    def header(self, values: Mapping[str, float], conversion_slice_values: Mapping[str, Any] | None = None, *,
               rng: Any = None, uniforms: Sequence[float] | None = None, extra: Mapping[str, Any] | None = None) -> str:
        """The registration as a compact JSON string (the header value)."""
        return jsonio.dumps(self.registration(values, conversion_slice_values, rng=rng, uniforms=uniforms, extra=extra),
                          separators=(",", ":"))


# ---- many conversions at once (export, simulation) -----------------------------------------------
@dataclass(frozen=True)
class TriggerBatch:
    """Trigger registrations of a conversion log, in the order the browser sees them.

    Order: by impression, conversion time, then the record tie-breaker (as Alg. 1 in the core).
    ``skipped`` counts records that cannot be registered (slice values outside the key dictionaries).
    """

    impression_id: np.ndarray
    conversion_time: np.ndarray
    source_index: np.ndarray
    contributions: np.ndarray
    piece_index: np.ndarray
    pieces: tuple[tuple[str | None, ...], ...]
    outside_domain: int
    skipped: Mapping[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.impression_id)

    def registrations(self, encoder: TriggerEncoder) -> Iterator[dict[str, Any]]:
        for w, p in zip(self.contributions.tolist(), self.piece_index.tolist(), strict=True):
            yield encoder.registration_from(w, self.pieces[p])

    def lines(self, encoder: TriggerEncoder) -> Iterator[str]:
        """JSON Lines: ``{"impression_id", "conversion_time_us", "source_index", "registration"}``."""
        for imp, t, s, reg in zip(self.impression_id.tolist(), self.conversion_time.tolist(), self.source_index.tolist(),
                                  self.registrations(encoder), strict=True):
            yield jsonio.dumps({"impression_id": imp, "conversion_time_us": t, "source_index": s, "registration": reg},
                             separators=(",", ":"))


def trigger_batch(
    impression_id: np.ndarray, conversion_time: np.ndarray, slices: Mapping[str, np.ndarray], contributions: np.ndarray,
    tie_breaker: np.ndarray, sources: SourceEncoder, triggers: TriggerEncoder,
) -> TriggerBatch:
    """Attach key pieces and source registrations to encoded conversions (vectorized over records)."""
    domain = triggers.domain
    idx, _ = domain.dictionary_indices(slices)
    imp_cols = [domain.slice_columns.index(c) for c in sources.columns]
    conv_cols = [domain.slice_columns.index(c) for c in triggers.columns]
    n = len(impression_id)
    skipped: dict[str, int] = {}
    ok = np.ones(n, dtype=bool)
    for what, cols in (("impression_slice_not_in_domain", imp_cols), ("conversion_slice_not_in_domain", conv_cols)):
        bad = ok & (idx[:, cols] < 0).any(axis=1) if cols else np.zeros(n, dtype=bool)
        if bad.any():
            skipped[what] = int(bad.sum())
        ok &= ~bad
    # source index of each record: position of its impression-side tuple among the sources
    imp_rows, imp_inv = _unique_rows(idx[:, imp_cols])
    src_of_row = np.array([sources.row_index(r) for r in imp_rows], dtype=np.int64)
    source_index = src_of_row[imp_inv] if n else np.zeros(0, dtype=np.int64)
    no_source = ok & (source_index < 0)  # impression values known but combination never seen in the domain
    if no_source.any():
        skipped["impression_slice_not_in_domain"] = skipped.get("impression_slice_not_in_domain", 0) + int(no_source.sum())
    ok &= ~no_source
    conv_rows, conv_inv = _unique_rows(idx[:, conv_cols])
    pieces = tuple(triggers.pieces_for_indices(tuple(int(x) for x in r)) if (r >= 0).all() else () for r in conv_rows)
    outside = int((ok & (domain.slice_index(slices) < 0)).sum())
    order = impression_order(np.asarray(impression_id), np.asarray(conversion_time), tie_breaker)
    order = order[ok[order]]
    return TriggerBatch(
        impression_id=np.asarray(impression_id)[order], conversion_time=np.asarray(conversion_time)[order],
        source_index=source_index[order], contributions=np.asarray(contributions)[order],
        piece_index=(conv_inv[order] if n else np.zeros(0, dtype=np.int64)), pieces=pieces,
        outside_domain=outside, skipped=skipped,
    )


def _unique_rows(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if a.shape[1] == 0:
        return np.zeros((1, 0), dtype=np.int64), np.zeros(a.shape[0], dtype=np.int64)
    rows, inv = np.unique(a, axis=0, return_inverse=True)
    return rows, inv.reshape(-1)


# ---- validation of registrations (ARA header rules) ----------------------------------------------
def validate_source_registration(reg: Mapping[str, Any]) -> None:
    """Check the aggregation part of a source registration against ARA's header rules (ValueError)."""
    if "destination" not in reg:
        raise InvalidInput("source registration: 'destination' is required")
    keys = reg.get("aggregation_keys", {})
    if not isinstance(keys, Mapping):
        raise InvalidInput("source registration: aggregation_keys must be an object")
    if len(keys) > ARA_MAX_KEYS_PER_SOURCE:
        raise InvalidInput(f"source registration: {len(keys)} aggregation keys > {ARA_MAX_KEYS_PER_SOURCE}")
    for name, piece in keys.items():
        _check_name(name)
        _check_piece(piece)


def validate_trigger_registration(reg: Mapping[str, Any]) -> None:
    """Check a trigger registration's aggregatable_trigger_data / aggregatable_values (ValueError)."""
    for entry in reg.get("aggregatable_trigger_data", []):
        _check_piece(entry.get("key_piece"))
        names = entry.get("source_keys", [])
        if not isinstance(names, list):
            raise InvalidInput("trigger registration: source_keys must be a list")
        for name in names:
            _check_name(name)
    values = reg.get("aggregatable_values", {})
    if isinstance(values, list):  # filtered value sets (exploration arms): each is checked as a whole trigger's
        for entry in values:
            if not isinstance(entry, Mapping) or not isinstance(entry.get("values"), Mapping):
                raise InvalidInput("trigger registration: each aggregatable_values entry needs a 'values' object")
            _check_values(entry["values"])
        return
    if not isinstance(values, Mapping):
        raise InvalidInput("trigger registration: aggregatable_values must be an object or a list")
    _check_values(values)


def _check_values(values: Mapping[str, Any]) -> None:
    for name, v in values.items():
        _check_name(name)
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= ARA_MAX_VALUE:
            raise InvalidInput(f"trigger registration: aggregatable value {name!r} = {v!r} is not an integer "
                               f"in [1, {ARA_MAX_VALUE}]")
    total = sum(values.values())
    if total > ARA_CONTRIBUTION_BUDGET:
        raise InvalidInput(f"trigger registration: values total {total} > {ARA_CONTRIBUTION_BUDGET}")


def _check_name(name: Any) -> None:
    if not isinstance(name, str) or len(name) > ARA_MAX_KEY_NAME_LENGTH:
        raise InvalidInput(f"aggregation key name {name!r} must be a string of at most {ARA_MAX_KEY_NAME_LENGTH} characters")


def _check_piece(piece: Any) -> None:
    if not isinstance(piece, str) or not _HEX_PIECE.match(piece):
        raise InvalidInput(f"key piece {piece!r} must be '0x' followed by 1 to 32 hex digits")


