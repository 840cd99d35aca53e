"""Writing a release under a run folder (local or gs://; the driver stages it and moves it into place):
the Aggregation Service Avro files (Beam's WriteToAvro, fastavro), the key map and the estimates in
the release folder; the debug report (``--debug-run``) in the operator-private folder. File names and
visibility come from ``araopt.outputs``.
"""
from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from typing import Any

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

from araopt import avro, jsonio, outputs
from araopt.release import Release, estimates_frame


def summary_records(release: Release) -> Iterator[dict[str, Any]]:
    for bucket, metric in zip(release.domain.buckets(), release.report.noisy.ravel().tolist(), strict=True):
        yield {"bucket": avro.bucket_to_min_bytes(bucket), "metric": int(metric)}


def domain_records(release: Release) -> Iterator[dict[str, Any]]:
    for bucket in release.domain.buckets():
        yield {"bucket": avro.bucket_to_16_bytes(bucket)}


def debug_records(release: Release) -> Iterator[dict[str, Any]]:
    unnoised = release.report.unnoised.ravel().tolist()
    noise = release.report.noise.ravel().tolist()
    for bucket, u, z in zip(release.domain.buckets(), unnoised, noise, strict=True):
        tags = ["in_domain", "in_reports"] if u > 0 else ["in_domain"]
        yield {"bucket": avro.bucket_to_min_bytes(bucket), "unnoised_metric": int(u), "noise": int(z), "annotations": tags}


def calibration_summary(release: Release) -> dict[str, Any] | None:
    """Which calibration made the estimates of the true totals (None: estimates are Alg. 4's)."""
    cal, corrected = release.params.calibration, release.corrected
    if cal is None or corrected is None:
        return None
    return {"retention_checksum": cal.retention_checksum, "params_checksum": cal.params_checksum, "method": cal.method,
            "history_blocks": cal.num_blocks, "period_blocks": corrected.period_blocks,
            "correction": release.params.correction, "fallback_slices": corrected.fallback_slices}


def release_json(release: Release, params_sha256: str) -> dict[str, Any]:
    """What the release says about itself: only public facts (no exact counts)."""
    simulation = release.simulation_seed is not None
    return {
        "simulation": simulation,
        "differentially_private": not simulation,  # (not the operator-private folder: this file is public)
        "note": ("SIMULATION: seeded noise, NOT differentially private; never publish" if simulation
                 else "noised with discrete Laplace noise over the declared domain"),
        "epsilon": release.params.epsilon,
        "contribution_budget": release.params.contribution_budget,
        "encoding": release.params.encoding,
        "count_limit": release.params.count_limit,
        "params_sha256": params_sha256,
        "domain_layout_sha256": release.domain.layout_checksum(),
        "slices": release.domain.num_slices,
        "keys": release.domain.num_keys,
        "estimates_of": ("the true totals (calibrated from history; point estimate: "
                         + ("capped sum / retention ratio" if release.params.correction == "ratio" else "the capped sum")
                         + ")") if release.corrected is not None else "the capped-and-clipped sums (Alg. 4; no calibration)",
    }


class _WriteSmallFiles(beam.DoFn):
    """Key map (JSON + CSV), estimates (Parquet + CSV) and release.json into the release folder."""

    def __init__(self, output: str, params_sha256: str, simulation: bool):
        self._output = output
        self._sha = params_sha256
        self._simulation = simulation

    def _put(self, name: str, data: bytes) -> None:
        with FileSystems.create(FileSystems.join(self._output, outputs.release_file(name, self._simulation))) as fh:
            fh.write(data)

    def process(self, release: Release) -> Iterator[str]:
        self._put(outputs.KEY_MAP_JSON, jsonio.dumps(release.domain.to_json(self._sha), indent=1).encode())
        self._put(outputs.KEY_MAP_CSV, outputs.csv_bytes(release.domain.key_table()))
        frame = estimates_frame(release.estimates, release.domain, release.corrected, release.params.correction)
        buf = io.BytesIO()
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), buf)
        self._put(outputs.ESTIMATES_PARQUET, buf.getvalue())
        self._put(outputs.ESTIMATES_CSV, outputs.csv_bytes(frame))
        self._put(outputs.RELEASE_JSON, jsonio.dumps(release_json(release, self._sha), indent=1).encode())
        private = {**release.accounting.to_json(), "slices": release.domain.num_slices, "keys": release.domain.num_keys,
                   "calibration": calibration_summary(release)}
        with FileSystems.create(FileSystems.join(self._output, outputs.private_file(outputs.ACCOUNTING))) as fh:
            fh.write(jsonio.dumps(private, indent=1).encode())
        yield "done"


@beam.typehints.with_input_types(Release)
@beam.typehints.with_output_types(str)
class WriteRelease(beam.PTransform):
    """Release -> files under the run folder ``output`` (see ``araopt.outputs`` for the layout)."""

    def __init__(self, output: str, params_sha256: str, debug_run: bool = False, simulation: bool = False):
        super().__init__()
        self._output = output
        self._sha = params_sha256
        self._debug = debug_run
        self._simulation = simulation

    def _avro(self, pcoll: beam.PCollection[Release], label: str, fn: Callable[[Release], Iterator[dict[str, Any]]],
              record: str, relative: str) -> beam.pvalue.PDone:
        stem = relative[: -len(".avro")]
        return (
            pcoll
            | f"{label}Records" >> beam.FlatMap(fn)
            | f"Write{label}" >> beam.io.WriteToAvro(
                FileSystems.join(self._output, stem), schema=avro.load_schema(record), num_shards=1,
                shard_name_template="", file_name_suffix=".avro")
        )

    def expand(self, release: beam.PCollection[Release]) -> beam.PCollection[str]:
        self._avro(release, "SummaryReport", summary_records, avro.SUMMARY,
                   outputs.release_file(outputs.SUMMARY_REPORT, self._simulation))
        self._avro(release, "OutputDomain", domain_records, avro.DOMAIN,
                   outputs.release_file(outputs.OUTPUT_DOMAIN, self._simulation))
        if self._debug:
            self._avro(release, "DebugReport", debug_records, avro.DEBUG, outputs.private_file(outputs.DEBUG_REPORT))
        return release | "WriteKeyMapAndEstimates" >> beam.ParDo(_WriteSmallFiles(self._output, self._sha, self._simulation))
