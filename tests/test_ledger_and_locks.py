"""The release ledger and liveness (fast): a conversion's identity, row sets, the ledger's check and
record, one ledger per store, and locks (not process ids) deciding which leftovers are dead."""
from __future__ import annotations

import io
import os
import subprocess
import sys
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from araopt.errors import InvalidParameters
from araopt.io.conversions import validate_table
from araopt.io.locks import FileLock, LockedDir, LockHeld, sweep_unlocked
from araopt.io.rowset import RowSet, RowSetPart, conversion_row_ids, sorted_unique, table_row_ids
from araopt.io.spill import SPILL_PREFIX
from araopt.io.stores import open_store
from araopt.ledger.ledger import Ledger, LedgerRefusal, ledger_root
from factories import RACES, conversions_table
from pipelines.runner import spill_folder


# ---- locks, not process ids -----------------------------------------------------------------------
def test_a_live_spill_folder_of_a_run_in_another_pid_namespace_is_not_swept(tmp_path, monkeypatch):
    opts = PipelineOptions(["--temp_location", str(tmp_path)])
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # its pid is free here, as a container's pids are
    with monkeypatch.context() as m:
        m.setattr(os, "getpid", lambda: gone.pid)  # the other run, as its namespace numbers it
        live = spill_folder(opts, "files")
    with open(os.path.join(live.path, "rows.arrow"), "wb") as fh:
        fh.write(b"raw rows")
    mine = spill_folder(opts, "files")
    assert os.path.isfile(os.path.join(live.path, "rows.arrow"))  # the live run's spill survives our sweep
    assert oct(os.stat(mine.path).st_mode & 0o777) == "0o700"
    mine.remove()
    live._locked._lock.release()  # the other run dies (the kernel frees its lock): a leftover now
    later = spill_folder(opts, "files")
    assert not os.path.exists(live.path)
    later.remove()
    assert not [n for n in os.listdir(tmp_path) if n.startswith(SPILL_PREFIX)]


def test_sweep_removes_unlocked_folders_only(tmp_path):
    alive = LockedDir.create(str(tmp_path), "x-", "test")
    dead = LockedDir.create(str(tmp_path), "x-", "test")
    dead._lock.release()  # as if its process had died
    orphan = tmp_path / "x-nolock"
    orphan.mkdir()
    assert sorted(sweep_unlocked(str(tmp_path), "x-")) == sorted([dead.path, str(orphan)])
    assert os.path.isdir(alive.path) and sorted(os.listdir(tmp_path)) == sorted(
        [os.path.basename(alive.path), os.path.basename(alive.path) + ".lock"])
    alive.remove()
    assert os.listdir(tmp_path) == []


def test_a_file_lock_names_its_owner_and_frees_on_release(tmp_path):
    path = str(tmp_path / "l")
    first = FileLock.acquire(path, "first run")
    with pytest.raises(LockHeld, match="first run"):
        FileLock.acquire(path, "second run")
    first.release()
    FileLock.acquire(path, "second run").release()


# ---- conversion identity --------------------------------------------------------------------------
def test_row_ids_are_pinned_golden_values():
    """The ledger compares ids across years: the function must never change (pandas' string hash included)."""
    ids = conversion_row_ids(np.array([0, 1, -7, 2**62], dtype=np.int64), np.array([0, 5, 1_700_000_000_000_000, -1]))
    assert ids.tolist() == [0, 7572189954100768156, 11107355853674984026, 8253779245989834730]
    text = conversion_row_ids(pa.array(["a", "imp-42", "", "x007"]), np.array([1, 2, 3, 4]))
    assert text.tolist()[:3] == [14380127798146821273, 2998314280352655471, 13431020076781761044]
    assert text[3] == 7807847360144183517  # the same as before ids were canonicalised


def test_a_string_id_in_canonical_integer_form_is_the_same_conversion_as_the_integer():
    times = np.array([10, 20, 30, 40, 50])
    ints = conversion_row_ids(np.array([5, -5, 9223372036854775807, -9223372036854775808, 0]), times)
    text = conversion_row_ids(pa.array(["5", "-5", "9223372036854775807", "-9223372036854775808", "0"]), times)
    assert ints.tolist() == text.tolist()
    other = conversion_row_ids(pa.array(["+5", "5.0", " 5", "9223372036854775808", "0x0"]), times)
    assert not set(other.tolist()) & set(ints.tolist())


def test_a_zero_padded_decimal_id_is_the_same_conversion_as_the_integer():
    """A warehouse's fixed-width text ids (LPAD, CHAR(n)) round-trip through BIGINT losing the zeros."""
    times = np.array([10, 20, 30, 40, 50])
    ints = conversion_row_ids(np.array([123, -7, 0, 9223372036854775807, 5]), times)
    padded = conversion_row_ids(pa.array(["000123", "-007", "-0", "0009223372036854775807", "05"]), times)
    assert padded.tolist() == ints.tolist()
    too_big = conversion_row_ids(pa.array(["09223372036854775808"]), times[:1])
    assert too_big[0] != conversion_row_ids(np.array([-9223372036854775808]), times[:1])[0]


def row_set_of_files(*blobs: bytes) -> RowSet:
    parts = []
    for blob in blobs:
        valid, _ = validate_table(pq.read_table(io.BytesIO(blob)), ["s"], ["v"])
        parts.append(RowSetPart.of_table(valid))
    return RowSet.merge(parts)


def parquet(table: pa.Table, **kwargs) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf, **kwargs)
    return buf.getvalue()


def test_the_row_set_does_not_depend_on_files_order_compression_row_groups_or_types():
    table = conversions_table()
    base = row_set_of_files(parquet(table))
    narrow = table.set_column(0, "impression_id", table.column(0).cast(pa.int32()))
    nanos = table.set_column(1, "conversion_time", table.column(1).cast(pa.timestamp("ns")))
    variants = {
        "rows reordered": [parquet(table.take(np.random.default_rng(1).permutation(table.num_rows)))],
        "zstd instead of snappy": [parquet(table, compression="zstd")],
        "another row-group size": [parquet(table, row_group_size=97)],
        "split into two files": [parquet(table.slice(0, 700)), parquet(table.slice(700))],
        "int32 ids": [parquet(narrow)],
        "nanosecond timestamps without a zone": [parquet(nanos)],
        "other slice values": [parquet(table.drop_columns(["s"]).append_column("s", pa.array(["z"] * table.num_rows)))],
    }
    for name, blobs in variants.items():
        rows = row_set_of_files(*blobs)
        assert np.array_equal(rows.ids, base.ids) and rows.first_time_us == base.first_time_us, name
    assert len(base) == len(np.unique(table_row_ids(validate_table(table, ["s"], ["v"])[0])))


def test_a_row_set_is_compact_and_round_trips():
    ids = sorted_unique(np.random.default_rng(3).integers(0, 2**64 - 1, 100_000, dtype=np.uint64))
    rows = RowSet(ids, 10, 20)
    data = rows.to_parquet_bytes()
    back = RowSet.from_parquet_bytes(data)
    assert np.array_equal(back.ids, ids) and (back.first_time_us, back.last_time_us) == (10, 20)
    assert len(data) < 6.5 * len(ids)  # delta-packed: ~49 bits per id at 10^5 ids (raw: 64)


# ---- the ledger ----------------------------------------------------------------------------------
def row_set(ids, first=0, last=100) -> tuple[RowSet, bytes]:
    rows = RowSet(sorted_unique(np.asarray(ids, dtype=np.uint64)), first, last)
    return rows, rows.to_parquet_bytes()


def test_a_release_overlapping_a_released_one_is_refused_with_the_overlap(tmp_path):
    ledger = Ledger.open(str(tmp_path / "ledger"), allow_rerelease=False)
    ledger.check_and_record(*row_set(range(0, 2000)), {})
    with pytest.raises(LedgerRefusal, match="2,000 of the 2,001 conversions of this input were already released"):
        ledger.check_and_record(*row_set(range(0, 2001)), {})
    ledger.check_and_record(*row_set(range(5000, 6000)), {})  # disjoint: fine
    ledger.check_and_record(*row_set(range(0, 1000), first=200, last=300), {})  # windows do not meet: no overlap
    again = Ledger.open(str(tmp_path / "ledger"), allow_rerelease=True).check_and_record(*row_set(range(0, 10)), {})
    assert (again.rows_released_before, again.release_number) == (10, 2)
    releases, _ = ledger.store.read_ledger()
    assert [e["rows"] for e in releases] == [2000, 1000, 1000, 10]


def test_racing_releases_of_the_same_rows_record_exactly_one(tmp_path):
    for race in range(RACES):
        root = str(tmp_path / f"ledger-{race}")
        Ledger.open(root, allow_rerelease=False)
        barrier = threading.Barrier(2)
        outcome = []

        def release(root=root, barrier=barrier, outcome=outcome) -> None:
            ledger = Ledger.open(root, allow_rerelease=False)
            barrier.wait()
            try:
                ledger.check_and_record(*row_set(range(100)), {})
                outcome.append("recorded")
            except LedgerRefusal:
                outcome.append("refused")

        threads = [threading.Thread(target=release) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(outcome) == ["recorded", "refused"]
        assert len(open_store(root).read_ledger()[0]) == 1


def test_one_ledger_per_store_whatever_names_it(tmp_path):
    store = str(tmp_path / "store")
    assert ledger_root(store, None) == store
    assert ledger_root(store, str(tmp_path / "store" / ".." / "store")) == store
    with pytest.raises(InvalidParameters, match="one ledger per store"):
        ledger_root(store, str(tmp_path / "elsewhere"))
    assert ledger_root(None, None) == os.environ["ARAOPT_LEDGER"]


def test_the_job_writes_the_ids_of_exactly_the_rows_it_reads(tmp_path):
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    from transforms.rowset import WriteRowIds

    valid, _ = validate_table(conversions_table(3000), ["s"], ["v"])
    batches = [valid.slice(0, 1000), valid.slice(1000, 1500), valid.slice(2500), valid.slice(0, 1000)]  # a retried batch
    with TestPipeline() as p:
        written = p | beam.Create(batches) | WriteRowIds(str(tmp_path / "ids"))
        assert_that(written | beam.combiners.Count.Globally(), equal_to([4]))
    parts = [RowSetPart.from_arrow_bytes((tmp_path / "ids" / n).read_bytes()) for n in os.listdir(tmp_path / "ids")]
    rows = RowSet.merge(parts)
    assert np.array_equal(rows.ids, sorted_unique(table_row_ids(valid)))
    times = valid.column("conversion_time_us").to_numpy()
    assert (rows.first_time_us, rows.last_time_us) == (times.min(), times.max())
