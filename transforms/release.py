"""Writing a release: the Aggregation Service Avro files (through Beam's WriteToAvro, fastavro), the
key map, the estimates (Parquet + CSV) and the accounting, all under one output prefix (local/gs://).
"""
from __future__ import annotations

import io
import json

import apache_beam as beam
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

from araopt import avro
from araopt.report import Estimates

from .aggregate import Release


def estimates_frame(release: Release) -> pd.DataFrame:
    """Long format: slice columns, query (count, then each value query), estimate, std_error, CI."""
    est: Estimates = release.estimates
    m, k = est.estimate.shape
    frame = pd.DataFrame({c: np.repeat(np.asarray(v, dtype=object), k) for c, v in release.domain.slice_values().items()})
    frame["query"] = np.tile(np.asarray(est.query_names, dtype=object), m)
    frame["estimate"] = est.estimate.ravel()
    frame["std_error"] = est.std_error.ravel()
    frame["ci_low"] = est.ci_low.ravel()
    frame["ci_high"] = est.ci_high.ravel()
    for c in release.domain.slice_columns:
        values = release.domain.dictionaries[release.domain.slice_columns.index(c)]
        if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values):
            frame[c] = frame[c].astype("int64")
        else:
            frame[c] = frame[c].astype(str)
    return frame


def _buckets(release: Release) -> list[int]:
    return release.domain.buckets()


def summary_records(release: Release):
    for bucket, metric in zip(_buckets(release), release.report.noisy.ravel().tolist()):
        yield {"bucket": avro.bucket_to_min_bytes(bucket), "metric": int(metric)}


def domain_records(release: Release):
    for bucket in _buckets(release):
        yield {"bucket": avro.bucket_to_16_bytes(bucket)}


def debug_records(release: Release):
    unnoised = release.report.unnoised.ravel().tolist()
    noise = release.report.noise.ravel().tolist()
    for bucket, u, z in zip(_buckets(release), unnoised, noise):
        tags = ["in_domain", "in_reports"] if u > 0 else ["in_domain"]
        yield {"bucket": avro.bucket_to_min_bytes(bucket), "unnoised_metric": int(u), "noise": int(z), "annotations": tags}


def accounting(release: Release) -> dict:
    return {
        "rows_read": release.rows_read,
        "rows_rejected": release.rows_rejected,
        "conversions_kept": release.rows_kept,
        "conversions_capped": release.rows_capped,
        "conversions_kept_outside_domain": release.rows_outside_domain,
        "slices_outside_domain": release.slices_outside_domain,
        "slices": release.domain.num_slices,
        "keys": release.domain.num_keys,
        "epsilon": release.params.epsilon,
        "simulation_seed": release.simulation_seed,
    }


class _WriteSmallFiles(beam.DoFn):
    """Key map (JSON + CSV), estimates (Parquet + CSV) and the release accounting (JSON)."""

    def __init__(self, output: str, params_sha256: str):
        self._output = output
        self._sha = params_sha256

    def _put(self, name: str, data: bytes) -> None:
        with FileSystems.create(FileSystems.join(self._output, name)) as fh:
            fh.write(data)

    def process(self, release: Release):
        self._put("key_map.json", json.dumps(release.domain.to_json(self._sha), indent=1).encode())
        self._put("key_map.csv", release.domain.key_table().to_csv(index=False).encode())
        frame = estimates_frame(release)
        buf = io.BytesIO()
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), buf)
        self._put("estimates.parquet", buf.getvalue())
        self._put("estimates.csv", frame.to_csv(index=False).encode())
        self._put("release.json", json.dumps(accounting(release), indent=1).encode())
        yield "done"


class WriteRelease(beam.PTransform):
    """Release -> files under ``output``: summary_report.avro, output_domain.avro, [debug/...], key map,
    estimates, release.json."""

    def __init__(self, output: str, params_sha256: str, debug_run: bool = False):
        super().__init__()
        self._output = output
        self._sha = params_sha256
        self._debug = debug_run

    def _avro(self, pcoll, label: str, fn, record: str, name: str):
        return (
            pcoll
            | f"{label}Records" >> beam.FlatMap(fn)
            | f"Write{label}" >> beam.io.WriteToAvro(
                FileSystems.join(self._output, name), schema=avro.load_schema(record), num_shards=1,
                shard_name_template="", file_name_suffix=".avro")
        )

    def expand(self, release):
        self._avro(release, "SummaryReport", summary_records, avro.SUMMARY, "summary_report")
        self._avro(release, "OutputDomain", domain_records, avro.DOMAIN, "output_domain")
        if self._debug:
            self._avro(release, "DebugReport", debug_records, avro.DEBUG, "debug/summary_report")
        return release | "WriteKeyMapAndEstimates" >> beam.ParDo(_WriteSmallFiles(self._output, self._sha))
