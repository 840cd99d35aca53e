"""Release integrity, end to end (slow): `araopt measure` runs racing into one output, re-releases in
disguise, the order of the refusals, the release manifest, the store's ledger, and commits on gs://."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from araopt.errors import OutputRefused
from araopt.io import outputs
from araopt.io.folders import STAGING_TAG
from araopt.io.run_folder import RunFolder
from araopt.io.stores import open_store
from araopt.version import ParameterVersion
from factories import conversions, domain_csv, error_line, params, read_json, setup, write
from pipelines import measure as measure_pipeline

pytestmark = pytest.mark.slow  # whole jobs end to end: `make test` runs them, `make test-fast` does not

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
END_TO_END_RACES = 3


def measure(argv, capsys=None):
    code = measure_pipeline.run(argv)
    return code, capsys.readouterr() if capsys is not None else None


def ledger_entries(root):
    return open_store(root).read_ledger()[0]


@pytest.mark.parametrize("race", range(END_TO_END_RACES))
def test_two_measure_runs_started_together_release_once_and_record_once(tmp_path, race):
    data, pfile = setup(tmp_path)
    cmd = [sys.executable, "-m", "pipelines.measure", "--input", data, "--params", pfile, "--output",
           str(tmp_path / "o"), "--domain", domain_csv(tmp_path)]
    env = {**os.environ, "PYTHONPATH": ROOT}
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [(p.wait(), p.stdout.read(), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 2], results
    (loser_err,) = [err for code, _, err in results if code == 2]
    line = error_line(loser_err)
    assert "already holds a run" in line or "being written by another run" in line
    (winner_out,) = [out for code, out, _ in results if code == 0]
    assert "release of" in winner_out
    assert len(ledger_entries(os.environ["ARAOPT_LEDGER"])) == 1  # the loser is not recorded
    assert read_json(tmp_path / "o" / "release" / "MANIFEST.json")["complete"] is True
    assert not [n for n in os.listdir(tmp_path) if STAGING_TAG in n or ".araopt-failed-" in n]


def test_rereleasing_the_same_rows_is_refused_in_every_disguise(tmp_path, capsys):
    frame = conversions(n=2000, impressions=400)
    data, pfile = setup(tmp_path, frame)
    dom = domain_csv(tmp_path)
    released = os.path.join(data, "part-0.parquet")
    assert measure_pipeline.run(["--input", data, "--params", pfile, "--output", str(tmp_path / "o"), "--domain", dom]) == 0
    table = pq.read_table(released)
    more = conversions(n=1, seed=9, impressions=1, start_id=10**6)

    def variant(name, files):
        folder = tmp_path / "variants" / name
        folder.mkdir(parents=True)
        for i, f in enumerate(files):
            f(str(folder / f"part-{i}.parquet"))
        return str(folder)

    variants = {
        "rows reordered": variant("reordered", [lambda p: pq.write_table(table.take(list(range(table.num_rows))[::-1]), p)]),
        "zstd instead of snappy": variant("zstd", [lambda p: pq.write_table(table, p, compression="zstd")]),
        "another row-group size": variant("row-groups", [lambda p: pq.write_table(table, p, row_group_size=100)]),
        "split into two files": variant("split", [lambda p: pq.write_table(table.slice(0, 900), p),
                                                  lambda p: pq.write_table(table.slice(900), p)]),
        "one row added": variant("one-more", [lambda p: pq.write_table(
            pa.concat_tables([table, pa.Table.from_pandas(more, preserve_index=False).cast(table.schema)]), p)]),
        "the released file plus a new one": variant("plus-new", [lambda p: shutil.copy(released, p),
                                                                 lambda p: write(more, p)]),
        "the same file twice through a symlink": variant("symlink", [
            lambda p: shutil.copy(released, p), lambda p: os.symlink(p.replace("part-1", "part-0"), p)]),
    }
    capsys.readouterr()
    for name, folder in variants.items():
        code, cap = measure(["--input", folder, "--params", pfile, "--output", str(tmp_path / "out" / name), "--domain",
                             dom], capsys)
        assert code == 2, name
        line = error_line(cap.err)
        expected = 2001 if name in ("one row added", "the released file plus a new one") else 2000
        assert f"2,000 of the {expected:,} conversions of this input were already released" in line, (name, line)
        assert not (tmp_path / "out" / name).exists(), name
    assert len(ledger_entries(os.environ["ARAOPT_LEDGER"])) == 1  # refused releases are not recorded
    code, _ = measure(["--input", variants["one row added"], "--params", pfile, "--output", str(tmp_path / "again"),
                       "--domain", dom, "--allow-rerelease"], capsys)
    assert code == 0
    summary = read_json(tmp_path / "again" / "private" / "run_summary.json")
    assert summary["release_number_of_this_input"] == 2 and summary["conversions_released_before"] == 2000


def test_the_output_check_comes_before_the_released_check(tmp_path, capsys):
    data, pfile = setup(tmp_path)
    argv = ["--input", data, "--params", pfile, "--output", str(tmp_path / "o"), "--domain", domain_csv(tmp_path)]
    assert measure_pipeline.run(argv) == 0
    capsys.readouterr()
    code, cap = measure(argv, capsys)
    line = error_line(cap.err)
    assert code == 2 and "already holds a run; pass --overwrite" in line and "released" not in line


def test_the_release_folder_holds_its_manifest_and_no_exact_input_facts(tmp_path):
    frame = conversions()
    frame.loc[0, "v"] = -1.0  # one dead letter row
    data, pfile = setup(tmp_path, frame)
    assert measure_pipeline.run(["--input", data, "--params", pfile, "--output", str(tmp_path / "o"), "--domain",
                                 domain_csv(tmp_path), "--debug-run"]) == 0
    out = tmp_path / "o"
    assert sorted(os.listdir(out)) == ["private", "release"]  # nothing beside the release
    manifest = read_json(out / "release" / "MANIFEST.json")
    listed = {f["path"]: f["sha256"] for f in manifest["files"]}
    assert set(listed) == set(os.listdir(out / "release")) - {"MANIFEST.json"}
    for name, sha in listed.items():
        assert outputs.sha256_hex((out / "release" / name).read_bytes()) == sha
    private = read_json(out / "private" / "run_manifest.json")
    dead_letter_sha = {f["path"]: f["sha256"] for f in private["files"]}["private/dead_letter/rejected.parquet"]
    input_sha = outputs.sha256_hex((tmp_path / "in" / "part-0.parquet").read_bytes())
    first = frame.conversion_time.min().isoformat()[:19]
    public_text = "".join((out / "release" / n).read_text(errors="replace") for n in ("MANIFEST.json", "release.json"))
    for secret in (dead_letter_sha, input_sha, first, "part-0.parquet", "ledger", "first_conversion_time"):
        assert secret not in public_text, secret
    assert private["input"]["files"][0]["path"].endswith("part-0.parquet") and private["ledger"]["entry"]["rows"] == 599
    assert private["release_manifest_sha256"] == outputs.sha256_hex((out / "release" / "MANIFEST.json").read_bytes())


def test_parameters_named_inside_a_store_record_in_the_stores_ledger(tmp_path, capsys):
    data, _ = setup(tmp_path)
    store = open_store(str(tmp_path / "store"))
    version = store.publish("2026-11-19", "r1", ParameterVersion(params()).to_bytes()).version
    dom = domain_csv(tmp_path)
    assert measure_pipeline.run(["--input", data, "--params", f"{store.uri}/versions/{version}/params.json",
                                 "--output", str(tmp_path / "o1"), "--domain", dom]) == 0
    assert len(ledger_entries(store.uri)) == 1 and ledger_entries(os.environ["ARAOPT_LEDGER"]) == []
    capsys.readouterr()
    code, cap = measure(["--input", data, "--params", store.uri, "--output", str(tmp_path / "o2"), "--domain", dom], capsys)
    assert code == 2 and "already released" in error_line(cap.err)
    code, cap = measure(["--input", data, "--params", store.uri, "--output", str(tmp_path / "o3"), "--domain", dom,
                         "--ledger", str(tmp_path / "elsewhere")], capsys)
    assert code == 2 and "one ledger per store" in error_line(cap.err)


# ---- gs:// -------------------------------------------------------------------------------------
def test_a_gcs_lease_admits_one_of_two_racing_takers_and_an_expired_one_is_taken_over(fake_gcs_server):
    from araopt.io.locks import GcsLease, LockHeld

    client = fake_gcs_server.client()
    for race in range(20):
        uri = f"gs://{fake_gcs_server.bucket}/out-{race}.araopt-lock"
        barrier = threading.Barrier(2)
        held, refused = [], []

        def take(uri=uri, barrier=barrier, held=held, refused=refused):
            barrier.wait()
            try:
                held.append(GcsLease.acquire(client, uri, "test"))
            except LockHeld as exc:
                refused.append(exc)

        threads = [threading.Thread(target=take) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(held) == 1 and len(refused) == 1 and refused[0].owner["what"] == "test"
        held[0].release()
        GcsLease.acquire(client, uri, "next").release()  # released: free again
    stale = GcsLease.acquire(client, f"gs://{fake_gcs_server.bucket}/stale.araopt-lock", "killed run", seconds=-1)
    taker = GcsLease.acquire(client, stale.uri, "next run")
    assert taker.generation != stale.generation
    with pytest.raises(LockHeld):
        GcsLease.acquire(client, stale.uri, "third run")


def test_two_runs_committing_one_gcs_output_commit_exactly_once(fake_gcs_server):
    bucket = fake_gcs_server.client().bucket(fake_gcs_server.bucket)
    for race in range(20):
        target = f"gs://{fake_gcs_server.bucket}/out-{race}"
        folders = [RunFolder.prepare(target, overwrite=False) for _ in range(2)]
        for tag, folder in zip("ab", folders, strict=True):
            prefix = folder.staging[len(f"gs://{fake_gcs_server.bucket}/"):]
            bucket.blob(f"{prefix}/release/release.json").upload_from_string(json.dumps({"run": tag}))
        barrier = threading.Barrier(2)
        won, lost = [], []

        def commit(folder, tag, barrier=barrier, won=won, lost=lost):
            barrier.wait()
            try:
                folder.commit(False, {})
                won.append(tag)
            except OutputRefused as exc:
                folder.abandon()
                lost.append(str(exc))

        threads = [threading.Thread(target=commit, args=(f, t)) for f, t in zip(folders, "ab", strict=True)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(won) == 1 and len(lost) == 1, (won, lost)
        names = sorted(b.name for b in bucket.list_blobs(prefix=f"out-{race}"))
        assert names == [f"out-{race}/private/run_manifest.json", f"out-{race}/release/MANIFEST.json",
                         f"out-{race}/release/release.json"], names
        released = json.loads(bucket.blob(f"out-{race}/release/release.json").download_as_bytes())
        assert released["run"] == won[0]
