"""Reading conversion logs (Parquet, local or gs://) as Arrow record batches through Beam IO.

The driver first resolves the input to an explicit file list (``match_files``: names starting with
``_`` or ``.`` anywhere below the input root are skipped, as Hadoop and Spark readers do, so
``_SUCCESS``, ``_temporary/`` and ``.crc`` files and our own ``_dead_letters-*`` never count), then
checks every file's schema and unifies them (``check_input``); the pipeline reads exactly those
files (``ReadConversionFiles``), never the glob again.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

from araopt.errors import InvalidInput
from araopt.io.conversions import (
    BROWSER_ID,
    CONVERSION_TIME,
    IMPRESSION_ID,
    IMPRESSION_TIME,
    check_attribution_schema,
    type_family,
    unify_schemas,
)
from araopt.io.files import distinct_files, local_files_below, micros_iso
from araopt.io.partitions import days_before, files_in_days, partition_day, partition_days, rows_outside_days

_GLOB_CHARS = "*?["


def _is_glob(pattern: str) -> bool:
    return any(ch in pattern for ch in _GLOB_CHARS)


def _is_directory(pattern: str) -> bool:
    """A folder (local) or a prefix with objects below it (gs://), not a glob and not a file."""
    if _is_glob(pattern):
        return False
    if "://" not in pattern or pattern.startswith("file://"):
        return os.path.isdir(pattern.removeprefix("file://"))
    if FileSystems.exists(pattern.rstrip("/")):  # an object: a file (object stores have no folders)
        return False
    below = FileSystems.match([pattern.rstrip("/") + "/**"], limits=[1])[0].metadata_list
    return bool(below)  # a prefix with objects under it, as gs://bucket/hist/ holding date=.../ partitions


def _root(pattern: str) -> str:
    """The fixed part of a path or glob: everything before the first component with a wildcard."""
    parts = pattern.split("/")
    for i, part in enumerate(parts):
        if _is_glob(part):
            return "/".join(parts[:i])
    return pattern if _is_directory(pattern) else "/".join(parts[:-1])


def is_hidden(path: str, root: str) -> bool:
    """True if a path component below ``root`` starts with ``_`` or ``.`` (metadata, not data)."""
    rest = path[len(root):] if root and path.startswith(root) else path.rsplit("/", 1)[-1]
    return any(part.startswith(("_", ".")) for part in rest.split("/") if part)


def match_files(pattern: str) -> list[str]:
    """Non-empty, non-hidden files matching a path or glob (local or gs://), each file once (also when
    two names lead to it: ``araopt.io.files.distinct_files``); a directory, or a folder a glob matches
    (``log/date=2026-09-0*``), means every ``*.parquet`` below it; locally, symbolic links to folders
    are followed (a folder of links to ``date=`` partitions)."""
    root = _root(pattern)
    if "://" not in pattern:  # local: symbolic links to folders followed (Beam's local listing does not)
        matched = local_files_below(pattern)
        return distinct_files(sorted(p for p, size in matched.items() if size > 0 and not is_hidden(p, root)))
    if _is_directory(pattern):
        patterns = [FileSystems.join(pattern, "**.parquet"), FileSystems.join(pattern, "*.parquet")]
    elif _is_glob(pattern):  # the files it matches, and the *.parquet below the folders it matches
        patterns = [pattern, pattern.rstrip("/") + "/**.parquet"]
    else:
        patterns = [pattern]
    matched = {m.path: m.size_in_bytes for p in patterns for m in FileSystems.match([p])[0].metadata_list}
    return distinct_files(sorted(p for p, size in matched.items() if size > 0 and not is_hidden(p, root)))


Window = tuple[int | None, int | None]
"""(first, last) time of a column as int64 microseconds since the epoch; None when unknown."""


@dataclass(frozen=True)
class Footer:
    """One Parquet file's footer, read once (``read_footer``): its Arrow schema, its row count and the
    window of each of its timestamp columns from the row groups' min/max statistics."""

    path: str
    schema: pa.Schema
    rows: int
    windows: tuple[tuple[str, int | None, int | None], ...] = ()  # (column, first, last) per timestamp column

    def window(self, column: str = CONVERSION_TIME) -> Window:
        """The file's window of ``column`` (None, None without statistics or without the column)."""
        return next(((first, last) for name, first, last in self.windows if name == column), (None, None))


def read_footer(path: str) -> Footer:
    """One small read of a file's Parquet footer; a file that is not Parquet is refused naming it. The
    windows are read as integers (a time beyond Python's year 9999 is a dead-letter row, not a reason
    to abort)."""
    try:
        with FileSystems.open(path) as fh:
            parquet = pq.ParquetFile(fh)
            meta, schema = parquet.metadata, parquet.schema_arrow
    except (pa.ArrowInvalid, OSError) as exc:
        raise InvalidInput(f"not a Parquet file: {path} ({str(exc).splitlines()[0]})") from None
    names = [meta.schema.column(i).name for i in range(meta.num_columns)]
    windows = []
    for field in schema:
        if not pa.types.is_timestamp(field.type) or field.name not in names:
            continue
        index = names.index(field.name)
        first: int | None = None
        last: int | None = None
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            st = group.column(index).statistics
            if st is None or not st.has_min_max or not isinstance(st.min_raw, int) or not isinstance(st.max_raw, int):
                if group.num_rows and (st is None or st.null_count != group.num_rows):
                    first = last = None  # a row group whose times the footer does not bound: the file's unknown
                    break
                continue
            lo, hi = (_micros(v, field.type.unit) for v in (st.min_raw, st.max_raw))
            first = lo if first is None else min(first, lo)
            last = hi if last is None else max(last, hi)
        windows.append((field.name, first, last))
    return Footer(path, schema, meta.num_rows, tuple(windows))


def window_of(footers: Sequence[Footer], column: str = CONVERSION_TIME) -> Window:
    """The window of ``column`` over several files' footers (the earliest first, the latest last); unknown
    (None, None) when a file with rows has none (its footer does not bound its times: a window of the
    others would leave its rows out of the ledger's lifetime rules)."""
    if any(footer.rows and footer.window(column) == (None, None) for footer in footers):
        return None, None
    firsts = [f for f, _ in (footer.window(column) for footer in footers) if f is not None]
    lasts = [last for _, last in (footer.window(column) for footer in footers) if last is not None]
    return (min(firsts) if firsts else None), (max(lasts) if lasts else None)


@dataclass(frozen=True)
class InputFiles:
    """The resolved input: each file's footer (read once, ``read_footer``), their unified canonical
    schema, and from the footers the files, the row count and the conversion-time window (int64
    microseconds since the epoch, None when the footers carry no statistics)."""

    footers: tuple[Footer, ...]
    schema: pa.Schema
    optional_columns: tuple[str, ...] = ()  # optional contract columns every file has (impression_time)

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(footer.path for footer in self.footers)

    @property
    def rows(self) -> int:
        return sum(footer.rows for footer in self.footers)

    @property
    def first_time_us(self) -> int | None:
        return window_of(self.footers)[0]

    @property
    def last_time_us(self) -> int | None:
        return window_of(self.footers)[1]


def check_input(pattern: str | Sequence[str], slice_columns: Sequence[str], value_columns: Sequence[str]) -> InputFiles:
    """Driver-side check before any processing: files exist, every file has the required columns
    with the right types, ids and slices have one type across files, and there is at least one row."""
    if isinstance(pattern, str):
        paths = match_files(pattern)
        if not paths:
            if not _is_glob(pattern) and FileSystems.exists(pattern) and not _is_directory(pattern):
                raise InvalidInput(f"{pattern} is empty (0 bytes): not a Parquet conversion log")
            raise InvalidInput(f"no input files match {pattern!r} (empty files and names starting with _ or . are skipped)")
    else:
        paths = distinct_files(pattern)  # a file named twice is read once
        if not paths:
            raise InvalidInput("no input files")
    footers = tuple(read_footer(p) for p in paths)
    schemas = [(f.path, f.schema) for f in footers]
    schema = unify_schemas(schemas, slice_columns, value_columns)
    optional = tuple(c for c in OPTIONAL_TIME_COLUMNS
                     if all(c in sch.names and pa.types.is_timestamp(sch.field(c).type) for _, sch in schemas))
    inputs = InputFiles(footers, schema, optional)
    if inputs.rows == 0:
        raise InvalidInput(f"the input holds no conversion rows ({len(paths)} file(s), 0 rows)")
    return inputs


OPTIONAL_TIME_COLUMNS = ("impression_time",)
"""Optional contract columns some jobs use when every file has them (the calibration's impression days)."""


def needed_columns(slice_columns: Sequence[str], value_columns: Sequence[str]) -> list[str]:
    return [IMPRESSION_ID, CONVERSION_TIME, *slice_columns, *value_columns]


@beam.typehints.with_output_types(pa.Table)
class ReadConversionFiles(beam.PTransform):
    """An explicit list of Parquet files -> PCollection of ``pa.Table`` batches with only the needed columns."""

    def __init__(self, paths: Sequence[str], columns: Sequence[str]):
        super().__init__()
        self._paths = list(paths)
        self._columns = list(columns)

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection[pa.Table]:
        return (
            pbegin
            | "Files" >> beam.Create(self._paths)
            | "ReadParquetBatches" >> beam.io.ReadAllFromParquetBatched(columns=self._columns).with_output_types(pa.Table)
        )


def _micros(value: int, unit: str) -> int:
    return value // 1000 if unit == "ns" else value * {"s": 1_000_000, "ms": 1_000, "us": 1}[unit]


def release_days(inputs: InputFiles) -> tuple[tuple[str, ...] | None, str | None]:
    """The days a release covers, from its input's ``date=YYYY-MM-DD/`` partition folders (how the
    operator cut the input, not what the rows say: the calibration's day-of-week effects then apply),
    and why they are not used (None: used, or there are none): a folder whose rows' conversion times
    (the Parquet footers) fall on other UTC days names the wrong days (e.g. impression-date partitions).
    A malformed partition date is refused (one line)."""
    days = partition_days(inputs.paths)
    if days is None:
        return None, None
    by_day: dict[str, list[Footer]] = {}
    for footer in inputs.footers:
        by_day.setdefault(str(partition_day(footer.path)), []).append(footer)
    for day, footers in sorted(by_day.items()):
        why = rows_outside_days(*window_of(footers), [day])
        if why is not None:
            return None, f"the partition folder date={day} does not hold that day's conversions: {why}"
    return days, None


def attribution_columns(inputs: InputFiles) -> tuple[str, ...]:
    """The W3C Attribution columns every input file has, typed (``impression_time`` required: it
    decides the epochs). The files agree on ``browser_id``: all or none have it (else each impression
    of the files without it would be a browser of its own), in one type family."""
    every: tuple[str, ...] | None = None
    browser_types: dict[str, str] = {}  # type family -> a file with it
    for footer in inputs.footers:
        path, schema = footer.path, footer.schema
        present = check_attribution_schema(schema, path)
        if IMPRESSION_TIME not in present:
            raise InvalidInput(f"{path}: column {IMPRESSION_TIME!r} is missing (the browsers' epochs need it)")
        if BROWSER_ID in present:
            browser_types.setdefault(type_family(schema.field(BROWSER_ID).type), path)
        every = present if every is None else tuple(c for c in every if c in present)
    if browser_types and BROWSER_ID not in (every or ()):  # some files name the browser, others do not
        raise InvalidInput(f"column {BROWSER_ID!r} is in {next(iter(browser_types.values()))} but not in every input "
                           f"file: without it each impression would be its own browser (a budget each), with it the "
                           f"browser; give every file the column, or none")
    if len(browser_types) > 1:
        kinds = "; ".join(f"{family} in {path}" for family, path in browser_types.items())
        raise InvalidInput(f"column {BROWSER_ID!r} has different types across the input files ({kinds}): a browser's "
                           f"id must have one type in every file (cast them to one type)")
    return every or ()


def lookback_partitions(inputs: InputFiles, days: int) -> tuple[list[str], str]:
    """--lookback-days N: the files of the N ``date=`` partitions before the input's first day, found
    beside the input's own partitions (the folder holding them: ``logs`` for ``--input
    logs/date=2026-11-25/``), as ``nightly --lookback-days`` selects its lookback; with a sentence
    saying what was looked for."""
    root, start, end = days_before(inputs.paths, days)
    files = files_in_days(match_files(root), start, end) if days else []
    return files, f"--lookback-days {days}: {start}..{end} under {root}"


def check_lookback(pattern: str | Sequence[str], inputs: InputFiles, slice_columns: Sequence[str],
                   value_columns: Sequence[str]) -> InputFiles:
    """Earlier conversions read only to cost each impression's budget (``measure --lookback``): checked
    like the input (``check_input``), with the same id (impression, and browser when both carry one) and
    slice types (ids would not match otherwise),
    and disjoint from it (a file in both would consume budget twice)."""
    lookback = check_input(pattern, slice_columns, value_columns)
    shared = sorted(set(lookback.paths) & set(inputs.paths))
    if shared:
        raise InvalidInput(f"--lookback and --input share {len(shared)} file(s) (e.g. {shared[0]}): the lookback holds "
                           f"earlier conversions only")
    families = {c: type_family(inputs.schema.field(c).type) for c in (IMPRESSION_ID, *slice_columns)}
    other = {c: type_family(lookback.schema.field(c).type) for c in families}
    # a browser's rows (W3C Attribution) must be one browser in both, as an impression's ids must (each
    # side's files agree on its type: ``attribution_columns``)
    mine, theirs = (next((type_family(f.schema.field(BROWSER_ID).type) for f in side.footers
                          if BROWSER_ID in f.schema.names), None) for side in (inputs, lookback))
    if mine is not None and theirs is not None:
        families[BROWSER_ID], other[BROWSER_ID] = mine, theirs
    differ = [c for c in families if families[c] != other[c]]
    if differ:
        raise InvalidInput(f"--lookback types differ from --input for {differ} ({[other[c] for c in differ]} vs "
                           f"{[families[c] for c in differ]}): ids would not match")
    return lookback


def input_facts(inputs: InputFiles) -> dict[str, object]:
    """Operator-private: the input's files with their sizes, and its time window from the footers."""
    sizes = {m.path: m.size_in_bytes for result in FileSystems.match(list(inputs.paths)) for m in result.metadata_list}
    return {"files": [{"path": p, "bytes": sizes.get(p)} for p in inputs.paths],
            "window": {"first_conversion_time": micros_iso(inputs.first_time_us),
                       "last_conversion_time": micros_iso(inputs.last_time_us)}}


ROWS_PER_SHARD = 250_000
MIN_SHARDS = 16


def auto_num_shards(total_rows: int, rows_per_shard: int = ROWS_PER_SHARD) -> int:
    """Shards so that each holds about ``rows_per_shard`` rows: the per-shard working set (what bounds
    a worker's memory) then stays the same whatever the input size."""
    return max(MIN_SHARDS, -(-int(total_rows) // rows_per_shard))


def auto_shards(inputs: InputFiles, lookback: InputFiles | None = None) -> int:
    """Shards of ``ROWS_PER_SHARD`` rows of the input and its lookback together: a shard holds both (sized by
    the input alone, a 30-day lookback made every shard ~30 times the size meant)."""
    return auto_num_shards(inputs.rows + (lookback.rows if lookback is not None else 0))
