"""The one Cloud Storage adapter (``araopt.io.gcs.GcsPrefix``) and the output-folder contract on gs://, on
fake-gcs-server (it honours generation preconditions; see tests/gcs_fixtures.py)."""
from __future__ import annotations

import json

import pytest

from araopt.errors import OutputRefused
from araopt.io.folders import MANIFEST, REPORT_FOLDER, OutputFolder, write_folder
from araopt.io.gcs import GcsPrefix
from araopt.io.locks import GcsLease, LockHeld
from araopt.io.store import StoreError


def test_create_swap_and_delete_are_decided_by_the_generation(fake_gcs_server):
    objects = GcsPrefix(f"gs://{fake_gcs_server.bucket}/p")
    first = objects.create("a.json", b"1")
    assert first is not None and objects.create("a.json", b"2") is None  # create-only: the second loses
    data, generation = objects.read_generation("a.json")
    assert (data, generation) == (b"1", first)
    second = objects.swap("a.json", b"3", generation)
    assert second is not None and second != first
    assert objects.swap("a.json", b"4", generation) is None  # a stale generation loses the swap
    assert objects.read("a.json") == b"3"
    # (a delete's generation precondition is not tested: fake-gcs-server ignores it on DELETE)
    assert objects.delete(["a.json"], generation=second) is True
    assert objects.read_or_none("a.json") is None and objects.read_generation("a.json") == (None, 0)
    assert objects.names() == []


def test_names_are_relative_to_the_prefix_and_a_missing_object_is_one_line(fake_gcs_server):
    objects = GcsPrefix(f"gs://{fake_gcs_server.bucket}/x/y")
    objects.put("b/c.txt", b"c")
    objects.put("a.txt", b"a")
    GcsPrefix(f"gs://{fake_gcs_server.bucket}/x/yz").put("other.txt", b"not under x/y/")
    assert objects.names() == ["a.txt", "b/c.txt"] and objects.names("b/") == ["b/c.txt"]
    with pytest.raises(StoreError, match=r"^gs://.*/x/y/missing\.txt does not exist$"):
        objects.read("missing.txt")
    with pytest.raises(StoreError, match="bucket no-such-bucket-araopt not found"):
        GcsPrefix("gs://no-such-bucket-araopt/p", retry_deadline=1.0).create("a", b"a")


def test_a_lease_is_exclusive_until_released(fake_gcs_server):
    uri = f"gs://{fake_gcs_server.bucket}/out.araopt-lock"
    lease = GcsLease.acquire(None, uri, "the first run")
    with pytest.raises(LockHeld, match="the first run"):
        GcsLease.acquire(None, uri, "the second run")
    lease.release()
    GcsLease.acquire(None, uri, "the second run").release()


def test_a_report_folder_on_gcs_is_written_whole_through_the_contract(fake_gcs_server):
    target = f"gs://{fake_gcs_server.bucket}/store/reports/2026-11-22-r1"
    manifest = write_folder(target, {"report.json": b"{}", "report.html": b"<p>"}, "test", REPORT_FOLDER,
                            {"command": "nightly"})
    objects = GcsPrefix(target)
    assert objects.names() == sorted(["report.json", "report.html", MANIFEST])
    assert json.loads(objects.read(MANIFEST)) == manifest
    assert {f["path"] for f in manifest["files"]} == {"report.json", "report.html"}
    parent = GcsPrefix(f"gs://{fake_gcs_server.bucket}/store/reports")
    assert [n for n in parent.names() if "araopt" in n] == []  # no staging folder or lease left behind
    with pytest.raises(OutputRefused, match="already holds a report"):
        write_folder(target, {"report.json": b"{}"}, "test", REPORT_FOLDER)
    write_folder(target, {"report.json": b"[]"}, "test", REPORT_FOLDER, overwrite=True)
    assert objects.names() == ["_manifest.json", "report.json"] and objects.read("report.json") == b"[]"


def test_overwrite_never_replaces_a_gcs_folder_araopt_did_not_write(fake_gcs_server):
    target = f"gs://{fake_gcs_server.bucket}/theirs"
    GcsPrefix(target).put("data.csv", b"a,b")
    with pytest.raises(OutputRefused, match="is not an araopt report folder"):
        write_folder(target, {"report.json": b"{}"}, "test", REPORT_FOLDER, overwrite=True)
    assert GcsPrefix(target).names() == ["data.csv"]


def test_a_command_that_writes_a_local_folder_refuses_gs(tmp_path):
    from araopt.errors import Unsupported

    with pytest.raises(Unsupported, match="writes a local folder"):
        OutputFolder.prepare("gs://bucket/out", False, "araopt synth")
