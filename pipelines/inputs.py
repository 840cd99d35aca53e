"""The inputs the commands share, read once here: a parameter file or store version (``load_params``),
a declared key domain file (``read_domain``), a small conversion log in memory with the same
validation and rejected-share gate as the Beam jobs (``load_conversions``, ``report_rejections``), the
W3C Attribution target's log in memory (``read_attribution_log``), and the one refusal of an ARA-only
option with ``--api attribution`` (``refuse_ara_only``). Command modules import these from here, never
from each other."""
from __future__ import annotations

import hashlib
import io
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from araopt.errors import InvalidInput, Unsupported
from araopt.io import jsonio
from araopt.mechanism.keys import KeyDomain, check_domain_families, domain_from_rows
from araopt.version import ParameterVersion

if TYPE_CHECKING:  # typing only: keep `araopt <command> --help` fast
    import argparse

    import pandas as pd
    import pyarrow as pa

    from araopt.io.conversions import Conversions, ValidationCounts
    from transforms.io import InputFiles


@dataclass(frozen=True)
class LoadedParams:
    version: ParameterVersion
    source: dict
    store: str | None = None


def load_params(ref: str, version: str = "latest") -> LoadedParams:
    """A parameter file (.json, local or gs://), or a store URI (``STORE`` -> latest, or
    ``STORE/versions/<v>`` or ``STORE/versions/<v>/params.json``) resolved to a checksum-verified
    version (a store's parameters are always read as the store's: its ledger records the release)."""
    from apache_beam.io.filesystems import FileSystems

    from araopt.io.store import LATEST
    from araopt.io.stores import open_store, parse_params_ref, resolve_params_ref

    if ref.endswith(".json") and parse_params_ref(ref)[1] == LATEST:
        try:
            with FileSystems.open(ref) as fh:
                raw = fh.read()
        except Exception as exc:  # noqa: BLE001 - any IO failure is a user-facing error here
            raise InvalidInput(f"cannot read parameter file {ref}: {exc}") from None
        return LoadedParams(ParameterVersion.from_bytes(raw, source=ref),
                            {"path": ref, "sha256": hashlib.sha256(raw).hexdigest()})
    resolved = open_store(ref).resolve(version) if version != "latest" else resolve_params_ref(ref)
    loaded = ParameterVersion.from_bytes(resolved.payload, source=resolved.uri)
    return LoadedParams(loaded, {"path": resolved.uri, **resolved.summary()}, store=resolved.store)


def read_domain(path: str, slice_columns: Sequence[str], query_columns: Sequence[str], inputs: InputFiles | None,
                baseline: bool = False, conversion_slice_columns: Sequence[str] = ()) -> KeyDomain:
    """A declared domain file: a key map JSON or a .csv / .json list of slice values, whose slice values
    have the types of the input's columns (without ``inputs``: a list's values are strings)."""
    import pandas as pd
    from apache_beam.io.filesystems import FileSystems

    from araopt.io.conversions import type_family

    try:
        with FileSystems.open(path) as fh:
            raw = fh.read()
    except Exception as exc:  # noqa: BLE001
        raise InvalidInput(f"cannot read domain file {path}: {exc}") from None
    families = {} if inputs is None else {c: type_family(inputs.schema.field(c).type) for c in slice_columns}
    if path.endswith(".csv"):
        try:
            rows = pd.read_csv(io.BytesIO(raw), dtype=str, keep_default_na=False, na_values=[""])
        except Exception as exc:  # noqa: BLE001 - a parser error is bad input
            raise InvalidInput(f"domain file {path} is not a readable CSV: {str(exc).splitlines()[0]}") from None
        return domain_from_rows(rows, slice_columns, query_columns, baseline, conversion_slice_columns, families,
                                source=path)
    try:
        data = jsonio.loads(raw, f"domain file {path}")
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    if isinstance(data, list):
        rows = pd.DataFrame(data)
        if inputs is None:  # no input to type the values by: a JSON list types them itself
            families = {c: _json_family(rows[c].tolist()) for c in slice_columns if c in rows.columns}
        return domain_from_rows(rows, slice_columns, query_columns, baseline, conversion_slice_columns, families,
                                source=path)
    domain = KeyDomain.from_json(data, source=path)
    check_domain_families(domain, families, source=path)
    return domain


def _json_family(values: list[Any]) -> str:
    if values and all(isinstance(v, bool) for v in values):
        return "boolean"
    if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return "integer"
    return "string"


def load_conversions(pattern: str | InputFiles, slice_columns: Sequence[str], value_columns: Sequence[str],
                     max_rejected_fraction: float = 0.10, what: str = "conversion log",
                     impression_slice_columns: Sequence[str] | None = None,
                     ) -> tuple[Conversions, ValidationCounts, pa.Table]:
    """A (small) log in memory: (valid conversions, row accounting, dead-letter rows), the same
    validation, canonical types, impression-slice check (``impression_slice_columns``, default every
    slice column) and gate as the Beam jobs."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from apache_beam.io.filesystems import FileSystems

    from araopt.io.conversions import (
        IMPRESSION_SLICE_INCONSISTENT,
        Conversions,
        ValidationCounts,
        check_rejected_share,
        validate_batch,
    )
    from araopt.mechanism.sources import split_impression_slice_conflicts
    from transforms.io import InputFiles, check_input, needed_columns

    inputs = pattern if isinstance(pattern, InputFiles) else check_input(pattern, slice_columns, value_columns)
    columns = needed_columns(slice_columns, value_columns)
    valid, rejected, counts = [], [], []
    for path in inputs.paths:
        with FileSystems.open(path) as fh:
            table = pq.read_table(fh, columns=columns)
        batch = validate_batch(table, slice_columns, value_columns)
        valid.append(batch.valid)
        rejected.append(batch.rejected)
        counts.append(ValidationCounts.of(table.num_rows, batch))
    good, inconsistent = split_impression_slice_conflicts(
        pa.concat_tables(valid), slice_columns if impression_slice_columns is None else impression_slice_columns,
        slice_columns, value_columns)
    if inconsistent is not None:
        rejected.append(inconsistent)
        counts.append(ValidationCounts.rejected(inconsistent.num_rows, IMPRESSION_SLICE_INCONSISTENT))
    total = ValidationCounts.merge(counts)
    check_rejected_share(total, max_rejected_fraction, what=what)
    return Conversions.from_table(good, slice_columns, value_columns), total, pa.concat_tables(rejected)


def report_rejections(prog: str, counts: ValidationCounts, where: str | None = None) -> None:
    """One console line about rejected rows (nothing when none was rejected)."""
    if counts.rows_rejected:
        reasons = ", ".join(f"{k} {v:,}" for k, v in counts.rejected_by_reason.items())
        tail = f"; dead letter: {where}" if where else ""
        print(f"{prog}: {counts.rows_rejected:,} of {counts.rows_read:,} rows rejected ({reasons}){tail}", file=sys.stderr)


def read_attribution_log(pattern: str | Sequence[str], slices: Sequence[str], values: Sequence[str]
                         ) -> tuple[pd.DataFrame, ValidationCounts, InputFiles]:
    """Valid rows of a Parquet log with the W3C Attribution columns (``impression_time`` required), for the
    columns ``slices`` and ``values``, with the same validation as every job (rows in = kept + rejected,
    rejections counted by reason), and the input's files and schema (which type a declared layout's values)."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq
    from apache_beam.io.filesystems import FileSystems

    from araopt.io.conversions import (
        ATTRIBUTION_COLUMNS,
        IMPRESSION_TIME,
        IMPRESSION_TIME_US,
        ValidationCounts,
        check_attribution_schema,
        validate_batch,
    )
    from transforms.io import check_input, needed_columns

    slices, values = tuple(slices), tuple(values)
    inputs = check_input(pattern, slices, values)
    valid, counts = [], []
    for footer in inputs.footers:
        path = footer.path
        present = check_attribution_schema(footer.schema, path)
        if IMPRESSION_TIME not in present:
            raise InvalidInput(f"{path}: column {IMPRESSION_TIME!r} is missing (the browsers' epochs need it)")
        with FileSystems.open(path) as fh:
            table = pq.read_table(fh, columns=[*needed_columns(slices, values), *present])
        batch = validate_batch(table, slices, values, passthrough=ATTRIBUTION_COLUMNS, attribution=True)
        valid.append(batch.valid)
        counts.append(ValidationCounts.of(table.num_rows, batch))
    rows = pa.concat_tables(valid).to_pandas()
    for c in slices:  # dictionary-encoded strings back to plain values
        if isinstance(rows[c].dtype, pd.CategoricalDtype):
            rows[c] = rows[c].astype(object)
    missing = rows[IMPRESSION_TIME_US].isna() if IMPRESSION_TIME_US in rows else pd.Series(True, index=rows.index)
    if bool(missing.any()):
        raise InvalidInput(f"{pattern}: {int(missing.sum())} rows without {IMPRESSION_TIME!r}")
    return rows, ValidationCounts.merge(counts), inputs


def read_attribution_history(prog: str, pattern: str | Sequence[str], slices: Sequence[str], values: Sequence[str],
                             max_rejected_fraction: float, what: str = "history"
                             ) -> tuple[pd.DataFrame, ValidationCounts]:
    """A W3C Attribution log a tuning reads (optimize, nightly, evaluate): :func:`read_attribution_log`,
    its rejected rows in one console line, and the same gate as ARA's histories (``check_rejected_share``:
    refused when more than ``max_rejected_fraction`` of the rows read failed validation)."""
    from araopt.io.conversions import check_rejected_share

    rows, counts, _ = read_attribution_log(pattern, slices, values)
    report_rejections(prog, counts)
    check_rejected_share(counts, max_rejected_fraction, what=what)
    return rows, counts


def refuse_ara_only(args: argparse.Namespace, prog: str, names: Sequence[str]) -> None:
    """One line for an ARA-only option given with ``--api attribution``."""
    for name in names:
        value = getattr(args, name, None)
        if value not in (None, False, [], ()):
            raise Unsupported(f"{prog}: --{name.replace('_', '-')} is not supported with --api attribution")
