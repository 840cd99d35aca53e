"""gs:// end to end on the gcp-storage-emulator: measure reads its log from and writes its release to
GCS through Beam IO; reconstruct and export-ara read their inputs from GCS."""
from __future__ import annotations

import os

import pandas as pd
import pytest

from araopt.version import ParameterVersion
from factories import make_frame, make_params, write_parts
from pipelines import measure as measure_pipeline
from pipelines.ara import run_export_ara, run_reconstruct

pytestmark = pytest.mark.slow  # whole jobs end to end: `make test` runs them, `make test-fast` does not


def upload_dir(bucket, local, prefix):
    for root, _, names in os.walk(local):
        for name in names:
            path = os.path.join(root, name)
            bucket.blob(f"{prefix}/{os.path.relpath(path, local)}").upload_from_filename(path)


def test_measure_and_reconstruct_on_gcs(tmp_path, gcp_storage_emulator):
    bucket = gcp_storage_emulator.client().bucket(gcp_storage_emulator.bucket)
    gs = f"gs://{gcp_storage_emulator.bucket}"
    frame = make_frame(2000)
    params = make_params()
    upload_dir(bucket, write_parts(frame, tmp_path / "log", 2), "log")
    ParameterVersion(params).save(tmp_path / "p.json")
    bucket.blob("params/p.json").upload_from_filename(str(tmp_path / "p.json"))
    bucket.blob("domain.csv").upload_from_string("campaign,geo\n" + "".join(f"{c},{g}\n" for c in range(5)
                                                                             for g in ("NY", "BOS", "SF")))
    assert measure_pipeline.run(["--input", f"{gs}/log/*.parquet", "--params", f"{gs}/params/p.json",
                                 "--output", f"{gs}/out", "--domain", f"{gs}/domain.csv", "--ledger", f"{gs}/ledger",
                                 "--debug-run"]) == 0
    names = {b.name for b in bucket.list_blobs()}
    assert {"out/release/summary_report.avro", "out/release/output_domain.avro", "out/release/key_map.json",
            "out/release/estimates.csv", "out/private/run_summary.json", "out/private/debug/summary_report.avro",
            "out/release/MANIFEST.json", "out/private/run_manifest.json"} <= names
    assert not [n for n in names if ".araopt-staging-" in n or "beam-temp" in n]  # staging moved, temp removed
    assert "ledger/ledger/index.json" in names  # the release is recorded on GCS
    assert not [n for n in names if ".araopt-lock" in n]  # the commit's lease is released
    target = tmp_path / "est.csv"
    assert run_reconstruct(["--summary-report", f"{gs}/out/release/summary_report.avro", "--params",
                            f"{gs}/params/p.json", "--key-map", f"{gs}/out/release/key_map.json", "--out", str(target)]) == 0
    bucket.blob("out/release/estimates.csv").download_to_filename(str(tmp_path / "want.csv"))
    pd.testing.assert_frame_equal(pd.read_csv(target), pd.read_csv(tmp_path / "want.csv"))
    assert run_export_ara(["--params", f"{gs}/params/p.json", "--key-map", f"{gs}/out/release/key_map.json",
                           "--out", str(tmp_path / "export")]) == 0
    assert (tmp_path / "export" / "sources.json").exists()
