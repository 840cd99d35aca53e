"""Smaller release-integrity checks: export-ara only for Chrome's budget, partition dates read and
checked once (malformed ones refused in one line before any work, days that disagree with their rows
not used, the days used recorded), reconstruct's side files under the overwrite rule and the arms' keys
recognised, and every noised key counted where counts are printed."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from araopt import Conversions, KeyDomain
from araopt.ara.reconstruct import estimates_from_summary_report
from araopt.errors import InvalidInput
from araopt.io import avro
from araopt.mechanism.exploration import Exploration, ExplorationArm
from araopt.mechanism.measure import measure
from araopt.mechanism.params import Params, QueryParams
from araopt.publication import histogram_buckets, publish
from araopt.version import ParameterVersion
from factories import conversions, domain_csv, error_line, params, read_json, write
from pipelines import measure as measure_pipeline
from pipelines.ara import run_export_ara, run_reconstruct

ARMS = Exploration((ExplorationArm(1, 0.1), ExplorationArm(3, 0.1)), salt=4)


def arm_params() -> Params:
    return Params(count_limit=2, encoding="linf", epsilon=8.0, slice_columns=("s",),
                  queries=(QueryParams("v", 20.0, 1.0),), exploration=ARMS)


def declared(p: Params) -> KeyDomain:
    return KeyDomain.from_slice_values(("s",), {"s": np.array(["a", "b", "c"], dtype=object)}, p.query_columns,
                                       origin="declared")


# ---- export-ara: Chrome's budget only ------------------------------------------------------------------
def test_export_ara_refuses_a_contribution_budget_other_than_chromes(tmp_path, capsys):
    p = dataclasses.replace(params(), contribution_budget=32_768)
    ParameterVersion(p, domain=declared(p)).save(tmp_path / "p.json")
    out = tmp_path / "export"
    assert run_export_ara(["--params", str(tmp_path / "p.json"), "--out", str(out)]) == 2
    assert "65536" in error_line(capsys.readouterr().err, "araopt export-ara")
    assert not out.exists()


def test_export_ara_prints_every_bucket_of_its_output_domain_arms_included(tmp_path, capsys):
    p = arm_params()
    domain = declared(p)
    ParameterVersion(p, domain=domain).save(tmp_path / "p.json")
    assert run_export_ara(["--params", str(tmp_path / "p.json"), "--out", str(tmp_path / "export")]) == 0
    noised = len(avro.read_output_domain(str(tmp_path / "export" / "output_domain.avro")))
    assert noised == domain.num_keys + ARMS.num_arms * domain.num_columns == 10
    assert f" {noised} buckets (" in capsys.readouterr().out
    assert read_json(tmp_path / "export" / "export.json")["buckets"] == noised


def test_measures_private_summary_counts_every_noised_key_arms_included():
    p = arm_params()
    domain = declared(p)
    frame = conversions()
    release = measure(Conversions.from_table(frame, p.slice_columns, p.query_columns), p, domain,
                      simulation_seed=1).release
    from araopt.publication import private_accounting

    accounting = private_accounting(publish(release, ParameterVersion(p)))
    assert accounting["keys"] == release.report.noisy.size == 10
    assert accounting["domain_keys"] == domain.num_keys == 6


# ---- reconstruct -------------------------------------------------------------------------------------
def test_reconstruct_counts_the_arms_keys_as_arms_not_unknown(tmp_path):
    p = arm_params()
    domain = declared(p)
    buckets = histogram_buckets(p, domain)
    metrics = np.arange(1, len(buckets) + 1) * 100
    _, counters = estimates_from_summary_report(buckets, metrics, p, domain)
    assert counters.exploration_buckets == ARMS.num_arms * domain.num_columns
    assert counters.unknown_buckets == 0 and counters.matched == domain.num_keys
    _, counters = estimates_from_summary_report(buckets + [0xABC], np.append(metrics, 5), p, domain)
    assert counters.unknown_buckets == 1 and counters.exploration_buckets == 4


def test_the_one_report_mapper_reconstructs_each_arm_at_its_own_count_limit():
    """Alg. 4 for an arm's keys uses the arm's C_a (``Params.for_arm``), not the release's C; a missing
    arm or domain bucket is NaN and leaves the report incomplete, as an unknown bucket does."""
    from araopt.ara.reconstruct import reconstruct_summary_report
    from araopt.mechanism.report import reconstruct

    p = arm_params()
    domain = declared(p)
    buckets = histogram_buckets(p, domain)
    metrics = np.arange(1, len(buckets) + 1) * 100
    report = reconstruct_summary_report(buckets, metrics, p, domain)
    assert report.complete and len(report.arms) == ARMS.num_arms
    rows = metrics.reshape(-1, domain.num_columns).astype(np.float64)
    np.testing.assert_array_equal(report.main.estimate, reconstruct(rows[:domain.num_slices], p).estimate)
    for a, arm in enumerate(report.arms):
        expected = reconstruct(rows[domain.num_slices + a:domain.num_slices + a + 1], p.for_arm(a))
        np.testing.assert_array_equal(arm.estimate, expected.estimate)
        np.testing.assert_array_equal(arm.std_error, expected.std_error)
    assert not np.array_equal(report.arms[0].estimate, reconstruct(rows[domain.num_slices:][:1], p).estimate)
    no_arm_bucket = reconstruct_summary_report(buckets[:-1], metrics[:-1], p, domain)
    assert not no_arm_bucket.complete and np.isnan(no_arm_bucket.arms[-1].estimate).any()
    no_main_bucket = reconstruct_summary_report(buckets[1:], metrics[1:], p, domain)
    assert not no_main_bucket.complete and no_main_bucket.counters.missing_buckets == 1
    unknown = reconstruct_summary_report(buckets + [0xABC], np.append(metrics, 5), p, domain)
    assert not unknown.complete and unknown.counters.unknown_buckets == 1
    with pytest.raises(InvalidInput, match="appears 2 times"):
        reconstruct_summary_report(buckets + [buckets[-1]], np.append(metrics, 5), p, domain)


def test_the_privacy_safe_tuner_reads_a_service_report_through_the_one_mapper(tmp_path):
    """The tuner's reader of an Aggregation Service report gives the mapper's estimates (arms at their
    own C_a) and refuses a report that is not over the whole output domain (a missing main or arm
    bucket, an unknown one), where it once read a missing bucket as 0."""
    from araopt.ara.reconstruct import reconstruct_summary_report
    from araopt.optimize.private import FirstParty
    from pipelines.private import read_aggregation_service_release

    class Vouched:  # the ledger's check, out of this test's scope
        def check_service_release(self, folder: str, digest: str) -> None:
            pass

    p = arm_params()
    domain = declared(p)
    ParameterVersion(p, domain=domain).save(tmp_path / "params.json")
    buckets = histogram_buckets(p, domain)
    metrics = list(range(1, len(buckets) + 1))
    first_party = FirstParty.of("2026-11-01", np.zeros((0, 1)))
    avro.write_summary_report(tmp_path / "summary_report.avro", buckets, metrics)
    record, read = read_aggregation_service_release(str(tmp_path), domain, first_party, Vouched())
    report = reconstruct_summary_report(buckets, metrics, p, domain)
    assert read == p
    np.testing.assert_array_equal(record.main, report.main.estimate)
    np.testing.assert_array_equal(record.arms, np.vstack([a.estimate for a in report.arms]))
    np.testing.assert_array_equal(record.arms_variance, np.vstack([a.std_error for a in report.arms]) ** 2)
    for kept in (slice(1, None), slice(None, -1)):  # a main bucket missing, an arm bucket missing
        avro.write_summary_report(tmp_path / "summary_report.avro", buckets[kept], metrics[kept])
        with pytest.raises(InvalidInput, match="not over the declared domain and arms"):
            read_aggregation_service_release(str(tmp_path), domain, first_party, Vouched())
    avro.write_summary_report(tmp_path / "summary_report.avro", buckets + [0xABC], metrics + [1])
    with pytest.raises(InvalidInput, match="1 bucket\\(s\\) outside it \\(e.g. 0xabc\\)"):
        read_aggregation_service_release(str(tmp_path), domain, first_party, Vouched())


def test_reconstruct_replaces_its_side_files_only_with_overwrite(tmp_path, capsys):
    p = arm_params()
    domain = declared(p)
    version = ParameterVersion(p, domain=domain)
    version.save(tmp_path / "p.json")
    (tmp_path / "km.json").write_text(json.dumps(domain.to_json(version.checksum())))
    buckets = histogram_buckets(p, domain)
    avro.write_summary_report(tmp_path / "r.avro", buckets + [0xABC], list(range(1, len(buckets) + 1)) + [3])
    args = ["--summary-report", str(tmp_path / "r.avro"), "--params", str(tmp_path / "p.json"), "--key-map",
            str(tmp_path / "km.json"), "--out", str(tmp_path / "e.csv")]
    for side in ("e.summary.json", "e.unknown_buckets.csv"):
        (tmp_path / side).write_text("someone else's file")
        assert run_reconstruct(args) == 2
        assert "--overwrite" in error_line(capsys.readouterr().err, "araopt reconstruct")
        assert (tmp_path / side).read_text() == "someone else's file" and not (tmp_path / "e.csv").exists()
        (tmp_path / side).unlink()
    assert run_reconstruct(args) == 0
    assert "4 more are the exploration arms' keys" in capsys.readouterr().out
    summary = read_json(tmp_path / "e.summary.json")
    assert summary["exploration_buckets"] == 4 and summary["unknown_buckets"] == 1
    avro.write_summary_report(tmp_path / "r.avro", buckets, list(range(1, len(buckets) + 1)))
    assert run_reconstruct(args + ["--overwrite"]) == 0  # no unknown bucket now: the old list is not left behind
    assert not (tmp_path / "e.unknown_buckets.csv").exists()


# ---- partition dates ------------------------------------------------------------------------------------
def test_partition_dates_are_calendar_days_written_yyyy_mm_dd():
    from araopt.io.partitions import partition_days

    assert partition_days(["/log/date=2026-11-24/part-0.parquet", "gs://b/log/date=2026-11-24/x.parquet"]) == (
        "2026-11-24",)
    assert partition_days(["/log/date=2024-02-29/a.parquet"]) == ("2024-02-29",)
    assert partition_days(["/log/mydate=2026-11-24/a.parquet"]) is None
    for bad in ("date=2026-02-30", "date=2024-3-23", "date=20241123", "date=2024-11-23T00"):
        with pytest.raises(InvalidInput, match="YYYY-MM-DD"):
            partition_days([f"/log/{bad}/part-0.parquet"])
    with pytest.raises(InvalidInput, match="2024-3-23"):
        partition_days(["/log/date=2024-03-22/a.parquet", "/log/date=2024-3-23/b.parquet"])


def _measure(tmp_path, folder: str, frame=None, extra=()):
    data = tmp_path / "in" / folder
    write(conversions() if frame is None else frame, str(data / "part-0.parquet"))
    ParameterVersion(params()).save(tmp_path / "p.json")
    out = tmp_path / "out"
    code = measure_pipeline.run(["--input", str(data), "--params", str(tmp_path / "p.json"), "--output", str(out),
                                 "--domain", domain_csv(tmp_path), "--simulation-seed", "1", "--no-progress", *extra])
    return code, out


@pytest.mark.parametrize("folder", ["date=2026-02-30", "date=2024-3-23"])
def test_measure_refuses_a_malformed_partition_date_before_any_work(tmp_path, capsys, folder):
    code, out = _measure(tmp_path, folder)
    assert code == 2
    line = error_line(capsys.readouterr().err)
    assert folder in line and "YYYY-MM-DD" in line and "Publish" not in line
    assert not out.exists()


@pytest.mark.slow
def test_measure_records_the_days_it_used_and_does_not_use_days_its_rows_contradict(tmp_path, capsys):
    code, out = _measure(tmp_path / "a", "date=2026-11-20")  # the rows are of 2026-11-20 (factories.RELEASE_DAY)
    assert code == 0
    summary = read_json(out / "private" / "run_summary.json")
    assert summary["partition_days"] == ["2026-11-20"] and summary["partition_days_not_used"] is None
    capsys.readouterr()
    code, out = _measure(tmp_path / "b", "date=2026-11-23")
    assert code == 0
    summary = read_json(out / "private" / "run_summary.json")
    assert summary["partition_days"] is None
    assert "date=2026-11-23 does not hold that day's conversions" in summary["partition_days_not_used"]
    assert "2026-11-20" in summary["partition_days_not_used"]
    assert "date=2026-11-23 does not hold" in capsys.readouterr().err


def test_nightly_refuses_a_malformed_partition_date(tmp_path, capsys):
    from factories import nightly_args, write_history
    from pipelines.nightly import run as nightly

    history = tmp_path / "history"
    write_history(history, days=("2026-11-21", "2026-11-22"))
    frame = pd.read_parquet(next((history / "date=2026-11-22").glob("*.parquet")))
    write(frame, str(history / "date=2026-11-31" / "part-0.parquet"))
    assert nightly(nightly_args(str(history), str(tmp_path / "store"), as_of="2026-11-22", window=2)) == 2
    assert "date=2026-11-31" in error_line(capsys.readouterr().err, "araopt nightly")
