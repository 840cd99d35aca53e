"""The privacy-safe start-up: the first version learnt from releases is not judged against the cold
start's clips, first-party conversions after --as-of are never read (no look-ahead in a backtest),
and a release of conversions another store's ledger holds is warned of when that ledger is named."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from araopt import Params, QueryParams
from araopt.ledger.ledger import Ledger
from araopt.ledger.verify import ReleaseVerifier
from araopt.mechanism.keys import KeyDomain
from araopt.nightly import Guardrails, new_series
from araopt.version import ParameterVersion, Provenance
from pipelines import measure as measure_cli
from pipelines.private import read_first_party, tune_privately

DAY_US = 86_400_000_000


def version(clip: float, count_limit: int = 2, extra: dict | None = None) -> ParameterVersion:
    p = Params(count_limit=count_limit, encoding="linf", epsilon=8.0, slice_columns=("campaign",),
               queries=(QueryParams("value", clip, 1.0),))
    return ParameterVersion(p, provenance=Provenance(predicted_rmsre_tau=0.1, extra=extra or {}))


COLD = {"tuning": "cold start: no release yet; clips from first-party values only", "cold_start": True}


def test_the_first_learnt_version_after_the_cold_start_is_not_judged_against_its_clips():
    cold, learnt = version(311.8, extra=COLD), version(19.55, extra={"cold_start": False})
    guard = Guardrails()
    assert guard.check(learnt, 0.1, {"baseline_q95": 0.2}, cold) == []
    assert "cold start" in new_series(cold, learnt)
    # a version before the cold-start flag existed is recognised by its provenance's words
    assert guard.check(learnt, 0.1, {"baseline_q95": 0.2}, version(311.8, extra={"tuning": COLD["tuning"]})) == []
    # after a learnt version, the same move is still refused
    problems = guard.check(version(100.4), 0.1, {"baseline_q95": 0.2}, learnt)
    assert len(problems) == 1 and "clip threshold of value moves 19.55 -> 100.4" in problems[0]
    # a second cold start after a cold start is judged as usual (nothing was learnt yet)
    assert guard.check(version(19.55, extra=COLD), 0.1, {"baseline_q95": 0.2}, cold)


def _first_party(tmp_path, days: int = 6, per_day: int = 50):
    rng = np.random.default_rng(0)
    start = np.datetime64("2026-11-20", "D").astype(np.int64)
    t = np.concatenate([(start + d) * DAY_US + rng.integers(0, DAY_US, per_day) for d in range(days)])
    values = np.concatenate([np.full(per_day, 10.0 * (d + 1)) for d in range(days)])  # a day's values say its day
    folder = tmp_path / "first_party"
    folder.mkdir()
    pd.DataFrame({"conversion_time": pd.to_datetime(t, unit="us", utc=True), "value": values}).to_parquet(
        folder / "part-0.parquet", index=False)
    return str(folder)


def test_first_party_conversions_after_as_of_are_not_read(tmp_path):
    pattern = _first_party(tmp_path)
    domain = KeyDomain.from_slice_values(("campaign",), {"campaign": np.arange(3)}, ("value",), origin="declared")
    log = read_first_party(pattern, ("value",), domain, last_day="2026-11-22")
    assert log.rows_read == 300 and log.after_last_day == 150 and len(log.day) == 150
    assert log.day.max() == np.datetime64("2026-11-22", "D").astype(np.int64) and log.values.max() == 30.0
    # the cold start on 2026-11-22 is the same whatever the later days hold
    (tmp_path / "releases").mkdir()
    verifier = ReleaseVerifier.open(str(tmp_path / "ledger"))  # an empty ledger: no release to verify
    tuned = tune_privately(str(tmp_path / "releases"), pattern, domain, ("value",), 8.0, "2026-11-22", 7, 8, verifier)
    assert tuned.cold_start and tuned.version.provenance.extra["first_party_rows_after_as_of"] == 150
    later = tmp_path / "later"
    later.mkdir()
    frame = pd.read_parquet(pattern)
    frame.loc[frame["conversion_time"] >= pd.Timestamp("2026-11-23", tz="UTC"), "value"] = 1e6
    frame.to_parquet(later / "part-0.parquet", index=False)
    again = tune_privately(str(tmp_path / "releases"), str(later), domain, ("value",), 8.0, "2026-11-22", 7, 8, verifier)
    assert again.version.to_bytes() == tuned.version.to_bytes()


def test_other_ledgers_are_read_only_and_say_how_many_rows_they_released(tmp_path):
    from araopt.io.rowset import RowSet, sorted_unique
    from araopt.ledger.ledger import other_ledgers

    rows = RowSet(sorted_unique(np.arange(100, dtype=np.uint64)), 0, 10)
    a = Ledger.open(str(tmp_path / "a"), allow_rerelease=False)
    a.check_and_record(rows, rows.to_parquet_bytes(), {})
    others = other_ledgers(f"{tmp_path / 'a'},{tmp_path / 'b'},{tmp_path / 'a'}", own=str(tmp_path / "b"))
    assert [o.store.uri for o in others] == [a.store.uri]  # the own ledger and repeats left out
    half = RowSet(sorted_unique(np.arange(50, 150, dtype=np.uint64)), 0, 10)
    assert others[0].released_before(half) == (50, 1)
    assert len(a.store.read_ledger()[0]) == 1  # nothing recorded by the check


def test_measure_warns_when_another_stores_ledger_released_the_same_rows(tmp_path, capsys):
    rng = np.random.default_rng(1)
    n = 600
    day = tmp_path / "log" / "date=2026-11-22"
    day.mkdir(parents=True)
    impression = rng.integers(0, 200, n).astype("int64")
    pd.DataFrame({"impression_id": impression,
                  "conversion_time": pd.Timestamp("2026-11-22", tz="UTC")
                  + pd.to_timedelta(rng.integers(0, 86400, n), unit="s"),
                  "campaign": impression % 3,
                  "value": rng.lognormal(2, 1, n)}).to_parquet(day / "part-0.parquet", index=False)
    (tmp_path / "slices.csv").write_text("campaign\n0\n1\n2\n")
    for name, clip in (("a", 10.0), ("b", 20.0)):  # two stores' parameters, two ledgers
        dataclasses.replace(version(clip), provenance=None).save(str(tmp_path / f"{name}.json"))

    def release(name: str, *extra: str) -> int:
        return measure_cli.run(["--input", str(day), "--params", str(tmp_path / f"{name}.json"), "--domain",
                                str(tmp_path / "slices.csv"), "--output", str(tmp_path / f"out-{name}"), "--ledger",
                                str(tmp_path / f"ledger-{name}"), "--no-progress", *extra])

    assert release("a") == 0
    capsys.readouterr()
    assert release("b", "--check-ledgers", str(tmp_path / "ledger-a")) == 0
    err = capsys.readouterr().err
    assert f"{n:,} of the {n:,} conversions of this input were already released from another store" in err
    summary = json.loads((tmp_path / "out-b" / "private" / "run_summary.json").read_text())
    assert list(summary["conversions_in_other_ledgers"].values()) == [n]


@pytest.mark.parametrize("spec", ["", None])
def test_no_other_ledgers_named_means_none_checked(spec):
    from araopt.ledger.ledger import other_ledgers

    assert other_ledgers(spec, own=None) == []
