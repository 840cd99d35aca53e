"""The days a release covers decide its calibration: ``reconstruct`` of an Aggregation Service report
applies the calendar (day-of-week and special-day effects) exactly as ``measure`` does, from ``--days``
or the report's ``date=`` folders, and says so when it cannot."""
from __future__ import annotations

import json
from datetime import timedelta

import numpy as np
import pandas as pd
import pytest

import araopt.calibration as cb
from araopt.ara.reconstruct import estimates_from_summary_report
from araopt.ara.registrations import key_map_json
from araopt.calibration.calendar import epoch_day
from araopt.errors import InvalidParameters
from araopt.io import avro, jsonio
from araopt.mechanism.keys import KeyDomain
from araopt.mechanism.measure import measure
from araopt.publication import publish, release_buckets
from araopt.version import ParameterVersion
from pipelines.ara import run_reconstruct
from test_calendar import MONDAY, daily_log, fitted

SATURDAY = MONDAY + timedelta(days=33)
COLUMNS = ("estimate", "std_error", "ci_low", "ci_high")


@pytest.fixture(scope="module")
def saturday_release():
    """A calibrated version with a strong weekend effect (fitted on four weeks) and the release of a
    Saturday after its history (simulation seed)."""
    conv = daily_log(35, weekend=3.0, seed=5)
    blocks = cb.day_blocks(conv)
    history = conv.take(np.flatnonzero(blocks < epoch_day(MONDAY) + 28))
    p, _, cal, calendar = fitted(history)
    assert calendar is not None and calendar.effects_fitted
    version = ParameterVersion(p, calibration=cal, calendar=calendar)
    day = conv.take(np.flatnonzero(blocks == epoch_day(SATURDAY)))
    domain = KeyDomain.from_slice_values(("s",), {"s": np.arange(4)}, p.query_columns)
    release = measure(day, p, domain, simulation_seed=11).release
    return version, release, domain


def test_reconstruct_given_the_days_equals_measure_of_those_days(saturday_release):
    version, release, domain = saturday_release
    measured = publish(release, version, period_days=[SATURDAY.isoformat()]).frame()
    frame, counters = estimates_from_summary_report(release_buckets(release), release.report.noisy.ravel(), version,
                                                    domain, period_days=[SATURDAY.isoformat()])
    for c in COLUMNS:
        np.testing.assert_allclose(frame[c].to_numpy(), measured[c].to_numpy(), rtol=1e-12, err_msg=c)
    assert counters.calendar_applied and counters.calendar_note is None
    assert counters.to_json()["period_days"] == [SATURDAY.isoformat()]


def test_reconstruct_without_the_days_says_the_calendar_is_not_applied(saturday_release):
    version, release, domain = saturday_release
    dated, _ = estimates_from_summary_report(release_buckets(release), release.report.noisy.ravel(), version, domain,
                                             period_days=[SATURDAY.isoformat()])
    undated, counters = estimates_from_summary_report(release_buckets(release), release.report.noisy.ravel(), version,
                                                      domain)
    assert not counters.calendar_applied and counters.calendar_note is not None
    assert counters.calendar_note.startswith("the release's days are not known")
    assert not np.allclose(undated["estimate"], dated["estimate"])  # a Saturday is not an average day here


def _write_inputs(tmp_path, version, release, domain, folder):
    version.save(tmp_path / "params.json")
    (tmp_path / "key_map.json").write_text(jsonio.dumps(key_map_json(version, domain)))
    folder.mkdir(parents=True, exist_ok=True)
    avro.write_summary_report(folder / "summary_report.avro", release_buckets(release),
                              release.report.noisy.ravel().astype(np.int64))
    return ["--params", str(tmp_path / "params.json"), "--key-map", str(tmp_path / "key_map.json")]


def test_reconstruct_cli_reads_the_days_from_days_or_the_reports_date_folder(saturday_release, tmp_path, capsys):
    version, release, domain = saturday_release
    measured = publish(release, version, period_days=[SATURDAY.isoformat()]).frame()
    dated = tmp_path / "reports" / f"date={SATURDAY.isoformat()}"
    base = _write_inputs(tmp_path, version, release, domain, dated)
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "summary_report.avro").write_bytes((dated / "summary_report.avro").read_bytes())
    runs = {"folder": [str(dated / "summary_report.avro")],
            "flag": [str(flat / "summary_report.avro"), "--days", SATURDAY.isoformat()],
            "none": [str(flat / "summary_report.avro")]}
    out = {}
    for name, report in runs.items():
        target = tmp_path / f"{name}.csv"
        assert run_reconstruct(["--summary-report", *report, *base, "--out", str(target)]) == 0
        out[name] = (pd.read_csv(target), capsys.readouterr().out,
                     json.loads((tmp_path / f"{name}.summary.json").read_text()))
    for name in ("folder", "flag"):
        frame, console, summary = out[name]
        np.testing.assert_allclose(frame["estimate"].to_numpy(), measured["estimate"].to_numpy(), rtol=1e-9)
        assert "day-type effects applied" in console and "NOTE" not in console
        assert summary["calendar_applied"] and summary["period_days"] == [SATURDAY.isoformat()]
    _, console, summary = out["none"]
    assert "NOTE: the release's days are not known" in console
    assert not summary["calendar_applied"] and summary["period_days"] is None


def test_days_option_takes_a_list_or_a_range_and_refuses_a_bad_date():
    from pipelines.values import parse_days_option

    assert parse_days_option("2026-11-28,2026-11-27") == ("2026-11-27", "2026-11-28")
    assert parse_days_option("2026-11-30..2026-12-02") == ("2026-11-30", "2026-12-01", "2026-12-02")
    assert parse_days_option(None) is None
    with pytest.raises(InvalidParameters, match="--days"):
        parse_days_option("2026-02-30")
    with pytest.raises(InvalidParameters, match="ends before"):
        parse_days_option("2026-12-02..2026-11-30")
