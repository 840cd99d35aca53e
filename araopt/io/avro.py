"""Aggregation Service Avro files: summary report, debug-run report and output domain.

The schemas are the service's own (``schemas/*.avsc``, plain JSON so Beam's ``WriteToAvro`` can use
them too):

* summary report ``AggregatedFact {bucket: bytes, metric: long}``;
* debug run ``DebugAggregatedFact {bucket, unnoised_metric: long, noise: long,
  annotations: array<enum bucket_tags {in_domain, in_reports}>}``;
* output domain ``AggregationBucket {bucket: bytes}``.

Buckets are 128-bit integers, big-endian. The service writes summary-report buckets with their
leading zero bytes left out; the output domain holds 16-byte buckets. Readers accept any of the
forms the service may produce: leading zero bytes dropped, a zero-length bucket for 0, a 16-byte
bucket, or a 17-byte two's-complement form with a leading 0x00 sign byte (Java ``BigInteger``).

Every reader checks the writer schema of each file: a file with another schema, or one that is not
Avro at all, is refused with a ``ValueError`` that names the file.
"""
from __future__ import annotations

import glob as _glob
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, cast

import fastavro
import numpy as np

from araopt.errors import InvalidInput
from araopt.io.files import atomic_write, distinct_files

SUMMARY = "AggregatedFact"
DEBUG = "DebugAggregatedFact"
DOMAIN = "AggregationBucket"
SCHEMA_FILES = {SUMMARY: "aggregated_fact.avsc", DEBUG: "debug_aggregated_fact.avsc", DOMAIN: "aggregation_bucket.avsc"}
ANNOTATIONS = ("in_domain", "in_reports")
BUCKET_BYTES = 16
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1

PathsOrGlob = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


# ---- schemas ----------------------------------------------------------------------------------
def load_schema(name: str) -> dict[str, Any]:
    """The raw JSON schema (dict) of record ``name`` (AggregatedFact, DebugAggregatedFact, AggregationBucket)."""
    if name not in SCHEMA_FILES:
        raise InvalidInput(f"unknown Aggregation Service record {name!r}; known: {sorted(SCHEMA_FILES)}")
    text = resources.files("araopt").joinpath("schemas", SCHEMA_FILES[name]).read_text(encoding="utf-8")
    return cast(dict[str, Any], json.loads(text))


def schema_path(name: str) -> str:
    """Filesystem path of the ``.avsc`` file (for tools that want a path, e.g. Beam)."""
    if name not in SCHEMA_FILES:
        raise InvalidInput(f"unknown Aggregation Service record {name!r}; known: {sorted(SCHEMA_FILES)}")
    return str(resources.files("araopt").joinpath("schemas", SCHEMA_FILES[name]))


def _parsed(name: str) -> dict[str, Any]:
    return cast(dict[str, Any], fastavro.parse_schema(load_schema(name)))  # a record schema parses to a dict


def _norm_type(t: Any) -> Any:
    """A comparable form of an Avro type, ignoring docs, namespaces and defaults."""
    if isinstance(t, str):
        return t.rsplit(".", 1)[-1]
    if isinstance(t, list):
        return ("union",) + tuple(_norm_type(x) for x in t)
    if isinstance(t, dict):
        kind = t.get("type")
        if kind == "array":
            return ("array", _norm_type(t.get("items")))
        if kind == "enum":
            return ("enum", tuple(t.get("symbols", ())))
        if kind == "record":
            return _signature(t)
        if kind == "map":
            return ("map", _norm_type(t.get("values")))
        if kind == "fixed":
            return ("fixed", t.get("size"))
        return _norm_type(kind)
    return repr(t)


def _signature(schema: Any) -> Any:
    if not isinstance(schema, dict) or schema.get("type") != "record":
        return ("not-a-record", _norm_type(schema))
    name = str(schema.get("name", "")).rsplit(".", 1)[-1]
    fields = frozenset((f.get("name"), _norm_type(f.get("type"))) for f in schema.get("fields", ()))
    return ("record", name, fields)


def _describe(schema: Any) -> str:
    if isinstance(schema, dict) and schema.get("type") == "record":
        fields = ", ".join(f"{f.get('name')}: {_type_name(f.get('type'))}" for f in schema.get("fields", ()))
        return f"{str(schema.get('name')).rsplit('.', 1)[-1]} {{{fields}}}"
    return repr(schema)[:200]


def _type_name(t: Any) -> str:
    n = _norm_type(t)
    return n if isinstance(n, str) else str(n[0]) if isinstance(n, tuple) else repr(n)


_EXPECTED = {name: _signature(load_schema(name)) for name in SCHEMA_FILES}


def _check_schema(path: str, schema: Any, allowed: tuple[str, ...]) -> str:
    sig = _signature(schema)
    for name in allowed:
        if sig == _EXPECTED[name]:
            return name
    want = " or ".join(_describe(load_schema(n)) for n in allowed)
    raise InvalidInput(f"{path}: Avro schema {_describe(schema)} is not the Aggregation Service's {want}")


# ---- buckets ----------------------------------------------------------------------------------
def bucket_to_min_bytes(bucket: int) -> bytes:
    """Summary-report form: big-endian, leading zero bytes left out (bucket 0 -> one zero byte)."""
    b = _check_bucket(bucket)
    return b.to_bytes(max(1, (b.bit_length() + 7) // 8), "big")


def bucket_to_16_bytes(bucket: int) -> bytes:
    """Output-domain form: exactly 16 bytes, big-endian."""
    return _check_bucket(bucket).to_bytes(BUCKET_BYTES, "big")


def bucket_from_avro_bytes(raw: bytes) -> int:
    """Any big-endian form with leading zero bytes dropped, kept, or a 0x00 sign byte; at most 128 bits."""
    if not isinstance(raw, (bytes, bytearray)):
        raise InvalidInput(f"bucket must be bytes, got {type(raw).__name__}")
    stripped = bytes(raw).lstrip(b"\x00")
    if len(stripped) > BUCKET_BYTES:
        raise InvalidInput(f"bucket 0x{stripped.hex()} has {len(stripped)} significant bytes; "
                           f"ARA buckets are at most 16 (128 bits)")
    return int.from_bytes(stripped, "big")


def _check_bucket(bucket: Any) -> int:
    if isinstance(bucket, (bool, np.bool_)) or not isinstance(bucket, (int, np.integer)):
        raise InvalidInput(f"bucket must be an integer, got {bucket!r}")
    b = int(bucket)
    if not 0 <= b < 2**128:
        raise InvalidInput(f"bucket {b} is outside [0, 2^128)")
    return b


def _check_long(value: Any, what: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise InvalidInput(f"{what} must be an integer (Avro long), got {value!r}")
    v = int(value)
    if not _LONG_MIN <= v <= _LONG_MAX:
        raise InvalidInput(f"{what} {v} does not fit in an Avro long")
    return v


# ---- paths ------------------------------------------------------------------------------------
def expand_paths(paths_or_glob: PathsOrGlob) -> list[str]:
    """Files named by a path, a directory (its ``*.avro`` files), a glob, or a list of those; sorted."""
    items = [paths_or_glob] if isinstance(paths_or_glob, (str, os.PathLike)) else list(paths_or_glob)
    out: list[str] = []
    for item in items:
        p = os.fspath(item)
        if any(ch in p for ch in "*?["):
            matches = sorted(m for m in _glob.glob(p) if os.path.isfile(m))
            if not matches:
                raise InvalidInput(f"no file matches {p!r}")
            out.extend(matches)
        elif os.path.isdir(p):
            matches = sorted(_glob.glob(os.path.join(p, "*.avro")))
            if not matches:
                raise InvalidInput(f"directory {p!r} holds no *.avro file")
            out.extend(matches)
        elif os.path.isfile(p):
            out.append(p)
        else:
            raise InvalidInput(f"no such file: {p!r}")
    if not out:
        raise InvalidInput("no input file given")
    return distinct_files(out)


def _records(path: str, allowed: tuple[str, ...]) -> tuple[str, Iterator[dict[str, Any]]]:
    """(record name, row iterator) of one file, after checking its writer schema."""
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise InvalidInput(f"{path}: cannot read ({exc.strerror})") from None
    try:
        reader = fastavro.reader(fh)
    except Exception as exc:  # noqa: BLE001 - as above: any fastavro failure on the header means not Avro
        fh.close()
        raise InvalidInput(f"{path}: not an Avro data file ({exc})") from None
    try:
        kind = _check_schema(path, reader.writer_schema, allowed)
    except ValueError:
        fh.close()
        raise
    return kind, _iterate(path, reader, fh)


def _iterate(path: str, reader: Any, fh: Any) -> Iterator[dict[str, Any]]:
    try:
        yield from reader
    except Exception as exc:  # noqa: BLE001 - any fastavro failure mid-file is corrupt data, named by path
        raise InvalidInput(f"{path}: corrupt Avro data ({exc})") from None
    finally:
        fh.close()


# ---- reading ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReportData:
    """Rows of a summary report (``kind == SUMMARY``) or a debug-run report (``kind == DEBUG``).

    ``metrics`` is the noisy metric in both cases (debug: ``unnoised + noise``). ``files`` has, per
    row, the index of the file it came from in ``paths``.
    """

    kind: str
    buckets: list[int]
    metrics: np.ndarray
    unnoised: np.ndarray | None
    noise: np.ndarray | None
    annotations: tuple[tuple[str, ...], ...] | None
    paths: tuple[str, ...]
    files: np.ndarray


def read_report(paths_or_glob: PathsOrGlob, allowed: Sequence[str] = (SUMMARY, DEBUG)) -> ReportData:
    """Read summary-report or debug-run Avro files (all of one kind); other schemas are refused."""
    paths = expand_paths(paths_or_glob)
    allowed_t = tuple(allowed)
    kinds: dict[str, str] = {}
    buckets: list[int] = []
    metrics: list[int] = []
    unnoised: list[int] = []
    noise: list[int] = []
    annotations: list[tuple[str, ...]] = []
    files: list[int] = []
    for i, path in enumerate(paths):
        kind, rows = _records(path, allowed_t)
        kinds[path] = kind
        if len(set(kinds.values())) > 1:
            raise InvalidInput(f"{path}: is a {kind} file but {paths[0]} is a {kinds[paths[0]]} file; "
                               f"do not mix summary and debug reports")
        for r, row in enumerate(rows):
            where = f"{path}: row {r}"
            try:
                buckets.append(bucket_from_avro_bytes(row["bucket"]))
            except ValueError as exc:
                raise InvalidInput(f"{where}: {exc}") from None
            if kind == SUMMARY:
                metrics.append(row["metric"])
            else:
                u, n = row["unnoised_metric"], row["noise"]
                unnoised.append(u)
                noise.append(n)
                metrics.append(u + n)
                annotations.append(tuple(row["annotations"]))
            files.append(i)
    kind = next(iter(kinds.values()))
    return ReportData(
        kind=kind, buckets=buckets, metrics=_as_int64(metrics, paths, files, "metric"),
        unnoised=_as_int64(unnoised, paths, files, "unnoised_metric") if kind == DEBUG else None,
        noise=_as_int64(noise, paths, files, "noise") if kind == DEBUG else None,
        annotations=tuple(annotations) if kind == DEBUG else None,
        paths=tuple(paths), files=np.asarray(files, dtype=np.int64),
    )


def _as_int64(values: list[int], paths: list[str], files: list[int], what: str) -> np.ndarray:
    try:
        return np.asarray(values, dtype=np.int64)
    except OverflowError:  # only a debug sum unnoised + noise can leave int64
        bad = next(i for i, v in enumerate(values) if not _LONG_MIN <= v <= _LONG_MAX)
        raise InvalidInput(f"{paths[files[bad]]}: {what} {values[bad]} does not fit in a 64-bit integer") from None


def read_summary_report(paths_or_glob: PathsOrGlob) -> tuple[list[int], np.ndarray]:
    """(buckets, metrics) of summary-report files (``AggregatedFact`` only)."""
    data = read_report(paths_or_glob, allowed=(SUMMARY,))
    return data.buckets, data.metrics


def read_debug_report(paths_or_glob: PathsOrGlob) -> tuple[list[int], np.ndarray, np.ndarray, tuple[tuple[str, ...], ...]]:
    """(buckets, unnoised metrics, noise, annotations) of debug-run files (``DebugAggregatedFact`` only)."""
    data = read_report(paths_or_glob, allowed=(DEBUG,))
    assert data.unnoised is not None and data.noise is not None and data.annotations is not None
    return data.buckets, data.unnoised, data.noise, data.annotations


def read_output_domain(paths_or_glob: PathsOrGlob) -> list[int]:
    """Buckets of output-domain files (``AggregationBucket`` only)."""
    out: list[int] = []
    for path in expand_paths(paths_or_glob):
        _, rows = _records(path, (DOMAIN,))
        for r, row in enumerate(rows):
            try:
                out.append(bucket_from_avro_bytes(row["bucket"]))
            except ValueError as exc:
                raise InvalidInput(f"{path}: row {r}: {exc}") from None
    return out


# ---- writing ----------------------------------------------------------------------------------
def _write(path: str | os.PathLike[str], name: str, records: Iterable[dict[str, Any]], codec: str) -> None:
    """Write atomically (temporary file + rename) with the service's schema ``name``."""
    atomic_write(path, lambda fh: fastavro.writer(fh, _parsed(name), records, codec=codec))


def _aligned(what: str, n: int, other: Sequence[Any] | np.ndarray) -> None:
    if len(other) != n:
        raise InvalidInput(f"{what} has {len(other)} entries but there are {n} buckets")


def summary_report_records(buckets: Sequence[int], metrics: Sequence[int] | np.ndarray) -> list[dict[str, Any]]:
    """Checked ``AggregatedFact`` records: buckets with leading zero bytes left out (as the service
    writes them), metrics that fit an Avro long."""
    _aligned("metrics", len(buckets), metrics)
    return [{"bucket": bucket_to_min_bytes(b), "metric": _check_long(m, "metric")}
            for b, m in zip(buckets, metrics, strict=True)]


def debug_report_records(buckets: Sequence[int], unnoised: Sequence[int] | np.ndarray,
                         noise: Sequence[int] | np.ndarray, annotations: Sequence[Sequence[str]]) -> list[dict[str, Any]]:
    """Checked ``DebugAggregatedFact`` records; annotations are lists drawn from ``ANNOTATIONS``."""
    n = len(buckets)
    for what, seq in (("unnoised", unnoised), ("noise", noise), ("annotations", annotations)):
        _aligned(what, n, seq)
    rows = []
    for b, u, z, a in zip(buckets, unnoised, noise, annotations, strict=True):
        tags = list(a)
        unknown = [t for t in tags if t not in ANNOTATIONS]
        if unknown:
            raise InvalidInput(f"annotations {unknown} are not among {ANNOTATIONS}")
        rows.append({"bucket": bucket_to_min_bytes(b), "unnoised_metric": _check_long(u, "unnoised_metric"),
                     "noise": _check_long(z, "noise"), "annotations": tags})
    return rows


def output_domain_records(buckets: Sequence[int]) -> list[dict[str, Any]]:
    """Checked ``AggregationBucket`` records, 16-byte big-endian buckets; duplicates are refused."""
    seen: set[int] = set()
    rows = []
    for b in buckets:
        v = _check_bucket(b)
        if v in seen:
            raise InvalidInput(f"output domain lists bucket 0x{v:032x} twice")
        seen.add(v)
        rows.append({"bucket": bucket_to_16_bytes(v)})
    return rows


def write_summary_report(path: str | os.PathLike[str], buckets: Sequence[int], metrics: Sequence[int] | np.ndarray,
                         codec: str = "null") -> None:
    """``AggregatedFact`` rows (``summary_report_records``), written atomically."""
    _write(path, SUMMARY, summary_report_records(buckets, metrics), codec)


def write_debug_report(path: str | os.PathLike[str], buckets: Sequence[int], unnoised: Sequence[int] | np.ndarray,
                       noise: Sequence[int] | np.ndarray, annotations: Sequence[Sequence[str]], codec: str = "null") -> None:
    """``DebugAggregatedFact`` rows (``debug_report_records``), written atomically."""
    _write(path, DEBUG, debug_report_records(buckets, unnoised, noise, annotations), codec)


def write_output_domain(path: str | os.PathLike[str], buckets: Sequence[int], codec: str = "null") -> None:
    """``AggregationBucket`` rows (``output_domain_records``), written atomically."""
    _write(path, DOMAIN, output_domain_records(buckets), codec)
