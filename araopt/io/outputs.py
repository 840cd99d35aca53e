"""The layout of a run's output folder: what may be published and what is operator-private.

    OUT/release/               PUBLISHABLE: noised numbers over the declared domain only
        summary_report.avro, output_domain.avro, key_map.json, key_map.csv,
        estimates.parquet, estimates.csv, release.json,
        MANIFEST.json          written last: the release files with their sha256 and size, nothing
                               else; a run without it is incomplete (a killed run) and must not be used
    OUT/private/               OPERATOR-PRIVATE: exact, un-noised figures and raw rows; never publish
        README.txt, run_summary.json, run_manifest.json (every private file's sha256, the input's
        files, the release ledger entry), dead_letter/rejected.parquet, debug/summary_report.avro,
        report.html (the run's page) with estimates.png and, with a debug run, noisy_vs_unnoised.png

In simulation mode (seeded noise: NOT private) the release folder is ``simulation/`` and every file
in it is named ``SIMULATION-<name>``, so a simulated file can never be mistaken for a release.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from araopt.errors import InvalidInput

RELEASE_DIR = "release"
SIMULATION_DIR = "simulation"
SIMULATION_PREFIX = "SIMULATION-"
PRIVATE_DIR = "private"
MANIFEST = "MANIFEST.json"
MANIFEST_FORMAT = "araopt-release/2"
RUN_MANIFEST = "run_manifest.json"
RUN_MANIFEST_FORMAT = "araopt-run/2"
LEGACY_MANIFEST = "MANIFEST.json"
"""Runs written before the manifest moved into the release folder have it at the top (still recognised)."""

SUMMARY_REPORT = "summary_report.avro"
OUTPUT_DOMAIN = "output_domain.avro"
KEY_MAP_JSON = "key_map.json"
KEY_MAP_CSV = "key_map.csv"
ESTIMATES_PARQUET = "estimates.parquet"
ESTIMATES_CSV = "estimates.csv"
EXPLORATION_PARQUET = "exploration.parquet"
EXPLORATION_CSV = "exploration.csv"
RELEASE_JSON = "release.json"
TRUE_TOTALS_PARQUET = "true_totals.parquet"
TRUE_TOTALS_CSV = "true_totals.csv"
"""(under private/) The estimates of the true totals by a joined history's calibration: that history's exact
per-slice ratios are in them (``publication.Publication.private_true_totals``)."""
RUN_SUMMARY = "run_summary.json"
ACCOUNTING = "accounting.json"
PRIVATE_README = "README.txt"
DEAD_LETTER = "dead_letter/rejected.parquet"
DEBUG_REPORT = "debug/summary_report.avro"
TRIGGERS_JSONL = "triggers.jsonl"
HISTOGRAM_LAYOUT_CSV = "histogram_layout.csv"
"""W3C Attribution: histogram index <-> impression-side slice (measure's release, export-attribution)."""
DEBUG_HISTOGRAMS_CSV = "debug_histograms.csv"
"""W3C Attribution --debug-run (under private/): the unnoised sums, ``query,histogram_index,unnoised_sum``."""
REPORT_HTML = "report.html"
"""The run's report page (operator-private: exact counts beside the released numbers), with estimates.png."""
"""export-ara --conversions: one trigger per conversion with its raw impression id and time (under private/)."""

PRIVATE_README_TEXT = """OPERATOR-PRIVATE - DO NOT PUBLISH

This folder holds exact, un-noised figures of the run (record counts, the debug report's unnoised
metrics and noise), raw input rows (the dead letter) and the estimates of the true totals calibrated
on a joined history (true_totals.csv: that history's per-slice ratios are in them). They are not
differentially private.
Only the files under the release folder (release/) may leave the building.
"""

EXPORT_PRIVATE_README_TEXT = """OPERATOR-PRIVATE - DO NOT PUBLISH

triggers.jsonl holds one trigger registration per conversion of the --conversions log, with the
conversion's raw impression_id and conversion time (conversion_time_us), in the browser's arrival
order: raw rows, neither noised nor aggregated. Use it to replay the browser (tests, simulations);
never publish it or send it to a third party. The files beside this folder (key_map.json/.csv,
sources.json, output_domain.avro, export.json) are the deployment: the ad servers' and the
Aggregation Service's inputs.
"""


def release_dir(simulation: bool) -> str:
    return SIMULATION_DIR if simulation else RELEASE_DIR


def release_file(name: str, simulation: bool) -> str:
    """Path of a release artifact relative to the run folder (``SIMULATION-`` marked in simulation)."""
    return f"{release_dir(simulation)}/{SIMULATION_PREFIX if simulation else ''}{name}"


def private_file(name: str) -> str:
    return f"{PRIVATE_DIR}/{name}"


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest_file(simulation: bool) -> str:
    """The manifest readers check, relative to the run folder (in the release or simulation folder)."""
    return release_file(MANIFEST, simulation)


RUN_MARKERS = (manifest_file(False), manifest_file(True), private_file(RUN_SUMMARY), LEGACY_MANIFEST)
"""Any of these makes a folder an araopt run folder (which ``--overwrite`` may replace)."""


@dataclass(frozen=True)
class ManifestEntry:
    path: str  # relative to the run folder, '/'-separated
    sha256: str
    bytes: int


def release_manifest(entries: Sequence[ManifestEntry], simulation: bool, extra: Mapping[str, Any]) -> dict[str, Any]:
    """The completion manifest of the release folder: written last, so its presence means every listed
    file is whole. It lists the release files only (paths relative to the release folder): nothing
    about the input, the private files or the ledger, and no time (when a run commits follows how long
    its input took: the private run manifest keeps it)."""
    folder = release_dir(simulation) + "/"
    outside = [e.path for e in entries if not e.path.startswith(folder)]
    if outside:
        raise InvalidInput(f"not release files: {outside}")
    return {
        "format": MANIFEST_FORMAT,
        "complete": True,
        "simulation": simulation,
        "files": [{"path": e.path[len(folder):], "sha256": e.sha256, "bytes": e.bytes}
                  for e in sorted(entries, key=lambda e: e.path)],
        **dict(extra),
    }


def run_manifest(entries: Sequence[ManifestEntry], release_manifest_sha256: str, extra: Mapping[str, Any]) -> dict[str, Any]:
    """The operator-private manifest: every other file of the run (paths relative to the run folder),
    the release manifest's sha256, and ``extra`` (the input's files, the release ledger entry)."""
    return {
        "format": RUN_MANIFEST_FORMAT,
        "OPERATOR_PRIVATE": "exact input facts: never publish",
        "release_manifest_sha256": release_manifest_sha256,
        "sealed_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "files": [{"path": e.path, "sha256": e.sha256, "bytes": e.bytes} for e in sorted(entries, key=lambda e: e.path)],
        **dict(extra),
    }


_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def neutralize_formula(value: Any) -> Any:
    """A string cell a spreadsheet would run as a formula (=, +, -, @, tab, CR first) gets a leading '."""
    if isinstance(value, str) and value.startswith(_FORMULA_STARTS):
        return "'" + value
    return value


def csv_bytes(frame: pd.DataFrame) -> bytes:
    """CSV of ``frame`` with every string cell (slice values, names) neutralised against formula injection."""
    safe = frame.copy()
    for column in safe.columns:
        if safe[column].dtype == object or pd.api.types.is_string_dtype(safe[column]):
            safe[column] = safe[column].map(neutralize_formula)
    safe.columns = [neutralize_formula(str(c)) for c in safe.columns]
    return safe.to_csv(index=False).encode("utf-8")


def parquet_bytes(frame: pd.DataFrame) -> bytes:
    """A Parquet file of ``frame`` (pyarrow's defaults, the index left out): the estimates tables."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), buf)
    return buf.getvalue()
