"""The lifetime budget through the Beam measure and the `measure` CLI: lookback conversions cost what
the release that used them spent (the ledger records each release's mechanism)."""
import json

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.pipeline import PipelineVisitor
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that

from araopt.io.conversions import Conversions
from araopt.mechanism.lifetime import ReleaseHistory
from araopt.mechanism.measure import measure
from araopt.version import ParameterVersion
from lifetimes import DOMAIN, GAMMA, chrome_keeps, config, daily_log, day_rows, released_ids, with_lookback
from transforms.aggregate import EncodeBoundAndSum
from transforms.group import GroupByImpression
from transforms.validate import ReadAndValidate


def _write_day(log: Conversions, rows: np.ndarray, path) -> str:
    pq.write_table(pa.table({"impression_id": log.impression_id[rows],
                             "conversion_time": pa.array(log.conversion_time[rows], pa.timestamp("us", tz="UTC")),
                             "s": log.slices["s"][rows], "value": log.values[rows, 0]}), str(path))
    return str(path)


def test_beam_measure_costs_the_lookback_with_the_history(tmp_path):
    log = daily_log(7, impressions=150, days=2)
    day1 = _write_day(log, day_rows(log, 0), tmp_path / "day1.parquet")
    day2 = _write_day(log, day_rows(log, 1), tmp_path / "day2.parquet")
    history = ReleaseHistory.of([(config(2), released_ids(log, day_rows(log, 0)))])
    today = config(7)
    expected = measure(with_lookback(log, 1), today, DOMAIN, simulation_seed=4, history=history)
    assert expected.rows_kept < measure(with_lookback(log, 1), today, DOMAIN, simulation_seed=4).rows_kept

    def check(sums):
        (got,) = sums
        np.testing.assert_array_equal(got.histogram, expected.histogram)
        assert got.kept == expected.rows_kept and got.capped == expected.rows_capped

    with TestPipeline() as pipeline:
        read = pipeline | ReadAndValidate([day2], ("s",), ("value",), lookback_paths=[day1])
        sums = (read["valid"] | GroupByImpression(5)
                | EncodeBoundAndSum(today, pipeline | "Domain" >> beam.Create([DOMAIN]), simulation_seed=4,
                                    history=history))
        assert_that(sums, check)


class _RowFlattens(PipelineVisitor):
    """The Flatten steps of a graph that take tables of rows (not shard file paths) as input."""

    def __init__(self) -> None:
        self.found: list[str] = []

    def visit_transform(self, applied) -> None:
        if isinstance(applied.transform, beam.Flatten) and any(
                getattr(pc, "element_type", None) is pa.Table for pc in applied.inputs):
            self.found.append(applied.full_label)


def test_a_spilled_lookback_is_shuffled_apart_from_the_period_and_costs_the_same(tmp_path):
    """With a spill directory the period and the lookback are spilled by separate steps and only their
    shard files are joined (the local runner holds a Flatten of the rows themselves whole in memory);
    Alg. 1 still ranks each impression's lookback and period conversions together."""
    log = daily_log(7, impressions=150, days=2)
    day1 = _write_day(log, day_rows(log, 0), tmp_path / "day1.parquet")
    day2 = _write_day(log, day_rows(log, 1), tmp_path / "day2.parquet")
    today = config(3)
    expected = measure(with_lookback(log, 1), today, DOMAIN, simulation_seed=4)
    assert expected.rows_kept < measure(log.take(day_rows(log, 1)), today, DOMAIN, simulation_seed=4).rows_kept

    def check(sums):
        (got,) = sums
        np.testing.assert_array_equal(got.histogram, expected.histogram)
        assert got.kept == expected.rows_kept and got.capped == expected.rows_capped

    pipeline = TestPipeline()
    read = pipeline | ReadAndValidate([day2], ("s",), ("value",), lookback_paths=[day1], num_shards=5,
                                      spill_dir=str(tmp_path / "spill"))
    sums = read["grouped"] | EncodeBoundAndSum(today, pipeline | "Domain" >> beam.Create([DOMAIN]), simulation_seed=4)
    assert_that(sums, check)
    flattens = _RowFlattens()
    pipeline.visit(flattens)
    assert flattens.found == []
    pipeline.run().wait_until_finish()




def _two_days(tmp_path, seed: int = 4, impressions: int = 120):
    """Two days of a log as files (day 1 in ``lookback/``), C = 3 and C = 5 parameter files, and a
    function that releases a day into the ledger ``tmp_path/ledger``."""
    from pipelines import measure as measure_cli

    log = daily_log(seed, impressions=impressions, days=2)
    (tmp_path / "lookback").mkdir()
    day1 = _write_day(log, day_rows(log, 0), tmp_path / "lookback" / "day1.parquet")
    day2 = _write_day(log, day_rows(log, 1), tmp_path / "day2.parquet")
    (tmp_path / "slices.csv").write_text("s\n0\n1\n2\n")
    for name, c in (("c3.json", 3), ("c5.json", 5)):
        ParameterVersion(config(c)).save(str(tmp_path / name))

    def release(day: str, params: str, out: str, *extra: str) -> int:
        return measure_cli.run(["--input", day, "--params", str(tmp_path / params), "--domain",
                                str(tmp_path / "slices.csv"), "--output", str(tmp_path / out), "--ledger",
                                str(tmp_path / "ledger"), "--no-progress", *extra])

    return log, day1, day2, release


def _rewrite_entries(tmp_path, change) -> None:
    index = tmp_path / "ledger" / "ledger" / "index.json"
    body = json.loads(index.read_text())
    for entry in body["releases"]:
        change(entry)
    index.write_text(json.dumps(body))


@pytest.mark.slow
def test_a_lookback_released_with_parameters_nobody_recorded_is_refused(tmp_path, capsys):
    log, day1, day2, release = _two_days(tmp_path)
    assert release(day1, "c3.json", "out1") == 0
    _rewrite_entries(tmp_path, lambda e: (e.pop("mechanism"), e.update(params_sha256="0" * 64)))
    capsys.readouterr()
    assert release(day2, "c5.json", "out2", "--lookback", str(tmp_path / "lookback")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "their budget cannot be costed" in err[0]
    assert not (tmp_path / "out2").exists()


@pytest.mark.slow
def test_an_entry_without_its_mechanism_is_read_through_its_params_sha256(tmp_path):
    log, day1, day2, release = _two_days(tmp_path)
    assert release(day1, "c3.json", "out1") == 0
    _rewrite_entries(tmp_path, lambda e: e.pop("mechanism"))  # as entries were recorded before the field
    assert release(day2, "c3.json", "out2", "--lookback", str(tmp_path / "lookback")) == 0
    summary = _summary(tmp_path, "out2")
    chrome = chrome_keeps(log, {0: GAMMA // 3, 1: GAMMA // 3})
    assert summary["conversions_kept"] + summary["conversions_kept_outside_domain"] == chrome[day_rows(log, 1)].sum()
    assert summary["lookback_costed_with"]["releases"] == 1


def _summary(tmp_path, out: str) -> dict:
    with open(tmp_path / out / "private" / "run_summary.json") as fh:
        return json.load(fh)


@pytest.mark.slow
def test_measure_cli_costs_the_lookback_with_the_parameters_the_ledger_recorded(tmp_path):
    """`measure` day 1 at C = 3 (recorded in the ledger), day 2 at C = 5 with day 1 as --lookback: the
    release keeps exactly what the browser keeps of day 2 (not what C = 5 on both days would)."""
    log, day1, day2, release = _two_days(tmp_path, impressions=300)
    assert release(day1, "c3.json", "out1") == 0
    assert release(day2, "c5.json", "out2", "--lookback", str(tmp_path / "lookback")) == 0
    summary = _summary(tmp_path, "out2")
    chrome = chrome_keeps(log, {0: GAMMA // 3, 1: GAMMA // 5})
    assert summary["conversions_kept"] + summary["conversions_kept_outside_domain"] == chrome[day_rows(log, 1)].sum()
    entries = json.loads((tmp_path / "ledger" / "ledger" / "index.json").read_text())["releases"]
    assert [e["mechanism"]["count_limit"] for e in entries] == [3, 5]

