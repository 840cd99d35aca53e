"""Aggregation Service Avro files: schemas, bucket byte forms, schema checks, bad files."""
import json

import fastavro
import numpy as np
import pytest

from araopt.io import avro


def _write_raw(path, schema, records):
    with open(path, "wb") as fh:
        fastavro.writer(fh, fastavro.parse_schema(schema), records)


def test_schemas_are_the_services_records():
    summary = avro.load_schema(avro.SUMMARY)
    assert summary["name"] == "AggregatedFact"
    assert [(f["name"], f["type"]) for f in summary["fields"]] == [("bucket", "bytes"), ("metric", "long")]
    debug = avro.load_schema(avro.DEBUG)
    assert debug["name"] == "DebugAggregatedFact"
    assert [f["name"] for f in debug["fields"]] == ["bucket", "unnoised_metric", "noise", "annotations"]
    enum = debug["fields"][3]["type"]["items"]
    assert enum["type"] == "enum" and enum["symbols"] == ["in_domain", "in_reports"]
    domain = avro.load_schema(avro.DOMAIN)
    assert domain["name"] == "AggregationBucket" and [f["name"] for f in domain["fields"]] == ["bucket"]
    # plain JSON files on disk (Beam's WriteToAvro takes the parsed JSON)
    for name in (avro.SUMMARY, avro.DEBUG, avro.DOMAIN):
        with open(avro.schema_path(name)) as fh:
            assert json.load(fh)["name"] == name


def test_summary_round_trip_with_leading_zero_bytes_left_out(tmp_path):
    buckets = [0, 1, 0x1FF, 1 << 64, (1 << 128) - 1, 0x0102]
    metrics = [5, -3, 0, 2**62, -(2**63), 7]
    path = tmp_path / "summary.avro"
    avro.write_summary_report(path, buckets, metrics)
    with open(path, "rb") as fh:
        raw = [r["bucket"] for r in fastavro.reader(fh)]
    assert raw == [b"\x00", b"\x01", b"\x01\xff", b"\x01" + b"\x00" * 8, b"\xff" * 16, b"\x01\x02"]
    got_b, got_m = avro.read_summary_report(str(path))
    assert got_b == buckets and got_m.tolist() == metrics and got_m.dtype == np.int64


def test_reader_accepts_every_bucket_form_the_service_may_write(tmp_path):
    rows = [
        {"bucket": b"", "metric": 1},                            # 0 with every byte dropped
        {"bucket": b"\x02\x05", "metric": 2},                    # leading zero bytes dropped
        {"bucket": b"\x00" * 14 + b"\x02\x06", "metric": 3},     # full 16 bytes
        {"bucket": b"\x00" + b"\x80" + b"\x00" * 15, "metric": 4},  # 17 bytes: Java BigInteger sign byte
    ]
    path = tmp_path / "s.avro"
    _write_raw(path, avro.load_schema(avro.SUMMARY), rows)
    buckets, metrics = avro.read_summary_report(path)
    assert buckets == [0, 0x205, 0x206, 1 << 127] and metrics.tolist() == [1, 2, 3, 4]
    too_long = tmp_path / "long.avro"
    _write_raw(too_long, avro.load_schema(avro.SUMMARY), [{"bucket": b"\x01" * 17, "metric": 1}])
    with pytest.raises(ValueError, match=r"long\.avro: row 0: .*17 significant bytes"):
        avro.read_summary_report(too_long)


def test_output_domain_is_16_bytes_and_refuses_duplicates(tmp_path):
    path = tmp_path / "domain.avro"
    avro.write_output_domain(path, [0, 0x101, 1 << 100])
    with open(path, "rb") as fh:
        assert all(len(r["bucket"]) == 16 for r in fastavro.reader(fh))
    assert avro.read_output_domain(path) == [0, 0x101, 1 << 100]
    with pytest.raises(ValueError, match="twice"):
        avro.write_output_domain(tmp_path / "dup.avro", [3, 3])
    with pytest.raises(ValueError, match=r"outside \[0, 2\^128\)"):
        avro.write_output_domain(tmp_path / "big.avro", [1 << 128])


def test_debug_report_round_trip_and_metric_is_unnoised_plus_noise(tmp_path):
    path = tmp_path / "debug.avro"
    avro.write_debug_report(path, [1, 2, 3], [10, 0, 4], [-2, 5, 0],
                            [["in_domain", "in_reports"], ["in_domain"], ["in_reports"]])
    buckets, unnoised, noise, annotations = avro.read_debug_report(path)
    assert buckets == [1, 2, 3] and unnoised.tolist() == [10, 0, 4] and noise.tolist() == [-2, 5, 0]
    assert annotations == (("in_domain", "in_reports"), ("in_domain",), ("in_reports",))
    data = avro.read_report(path)
    assert data.kind == avro.DEBUG and data.metrics.tolist() == [8, 5, 4]
    with pytest.raises(ValueError, match="annotations"):
        avro.write_debug_report(tmp_path / "bad.avro", [1], [1], [0], [["in_flight"]])


def test_other_schema_is_refused_naming_the_file(tmp_path):
    other = {"type": "record", "name": "AggregatedFact", "fields": [{"name": "bucket", "type": "bytes"},
                                                                   {"name": "metric", "type": "double"}]}
    path = tmp_path / "wrong.avro"
    _write_raw(path, other, [{"bucket": b"\x01", "metric": 1.5}])
    with pytest.raises(ValueError,
                       match=r"wrong\.avro: Avro schema AggregatedFact \{bucket: bytes, metric: double\} is not"):
        avro.read_summary_report(path)
    # a domain file is not a summary report; a summary report is not an output domain
    avro.write_output_domain(tmp_path / "domain.avro", [1])
    with pytest.raises(ValueError, match=r"domain\.avro: .*AggregationBucket"):
        avro.read_report(tmp_path / "domain.avro")
    avro.write_summary_report(tmp_path / "summary.avro", [1], [1])
    with pytest.raises(ValueError, match=r"summary\.avro: .*not the Aggregation Service's AggregationBucket"):
        avro.read_output_domain(tmp_path / "summary.avro")
    (tmp_path / "junk.avro").write_bytes(b"not avro at all")
    with pytest.raises(ValueError, match=r"junk\.avro: not an Avro data file"):
        avro.read_summary_report(tmp_path / "junk.avro")


def test_globs_directories_and_mixed_kinds(tmp_path):
    avro.write_summary_report(tmp_path / "part-1.avro", [1, 2], [10, 20])
    avro.write_summary_report(tmp_path / "part-2.avro", [3], [30])
    buckets, metrics = avro.read_summary_report(str(tmp_path / "part-*.avro"))
    assert buckets == [1, 2, 3] and metrics.tolist() == [10, 20, 30]
    assert avro.read_summary_report(tmp_path)[0] == [1, 2, 3]  # a directory: its *.avro files
    data = avro.read_report([tmp_path / "part-2.avro", tmp_path / "part-1.avro"])
    assert data.paths[data.files[0]].endswith("part-2.avro")
    with pytest.raises(ValueError, match="no file matches"):
        avro.read_summary_report(str(tmp_path / "nothing-*.avro"))
    avro.write_debug_report(tmp_path / "part-3.avro", [4], [1], [0], [["in_domain"]])
    with pytest.raises(ValueError, match="do not mix summary and debug"):
        avro.read_report(str(tmp_path / "part-*.avro"))


def test_writers_refuse_values_avro_cannot_hold(tmp_path):
    with pytest.raises(ValueError, match="does not fit in an Avro long"):
        avro.write_summary_report(tmp_path / "x.avro", [1], [2**63])
    with pytest.raises(ValueError, match="integer"):
        avro.write_summary_report(tmp_path / "x.avro", [1], [1.5])
    with pytest.raises(ValueError, match="2 buckets"):
        avro.write_summary_report(tmp_path / "x.avro", [1, 2], [1])
    assert not (tmp_path / "x.avro").exists()  # nothing half-written
