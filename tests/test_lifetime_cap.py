"""The browser caps a source over its whole life: a daily release that reads the days before as a
lookback keeps exactly what one ContributionCapping (Alg. 1) over the whole log keeps on that day,
in the core, in the statistics and calibration, and in the Beam pipeline."""
import os

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that
from hypothesis import given
from hypothesis import strategies as st

import araopt.calibration as cb
from araopt.io.conversions import Conversions, concat_periods
from araopt.mechanism.bounding import kept_per_impression
from araopt.mechanism.keys import KeyDomain
from araopt.mechanism.measure import encode_and_bound, measure
from araopt.mechanism.params import Params, QueryParams
from araopt.optimize.statistics import StatisticsSpec, cluster_table, compute_statistics_in_memory
from araopt.version import ParameterVersion
from transforms.aggregate import EncodeBoundAndSum
from transforms.group import GroupByImpression
from transforms.validate import LOOKBACK_COUNTS, ReadAndValidate

DAY = 86_400_000_000


def multi_day_log(seed: int, impressions: int = 300, days: int = 6) -> Conversions:
    """Impressions converting on several days (1-12 conversions spread over up to 4 days)."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 13, impressions)
    first_day = rng.integers(0, days - 1, impressions)
    imp = np.repeat(np.arange(impressions), sizes)
    spread = rng.integers(0, 4 * DAY, len(imp))
    times = np.repeat(first_day, sizes) * DAY + spread
    slices = rng.integers(0, 3, impressions)
    return Conversions(imp.astype(np.int64), times.astype(np.int64), {"s": np.repeat(slices, sizes)},
                       rng.lognormal(1.0, 1.0, (len(imp), 1)), ("value",))


def params(encoding: str = "linf", count_limit: int = 3) -> Params:
    if encoding == "baseline":
        return Params(count_limit=count_limit, encoding="baseline", epsilon=4.0, slice_columns=("s",),
                      queries=(QueryParams("value", 5.0, 0.5),), count_budget_fraction=0.5)
    return Params(count_limit=count_limit, encoding=encoding, epsilon=4.0, slice_columns=("s",),
                  queries=(QueryParams("value", 5.0, None if encoding == "l1" else 1.0),))


def day_with_lookback(log: Conversions, day: int) -> Conversions:
    days = log.conversion_time // DAY
    period = log.take(np.flatnonzero(days == day))
    before = log.take(np.flatnonzero(days < day))
    return concat_periods(period, before)


@given(seed=st.integers(0, 10_000), encoding=st.sampled_from(["linf", "l1", "baseline"]),
       count_limit=st.integers(1, 8))
def test_daily_release_with_lookback_keeps_what_one_lifetime_cap_keeps(seed, encoding, count_limit):
    log = multi_day_log(seed, impressions=60)
    p = params(encoding, count_limit)
    contributions, lifetime = encode_and_bound(log, p, simulation_seed=9)
    days = log.conversion_time // DAY
    domain = KeyDomain.from_slice_values(("s",), {"s": np.arange(3)}, ("value",), baseline=encoding == "baseline")
    for day in np.unique(days):
        batch = day_with_lookback(log, int(day))
        m = measure(batch, p, domain, simulation_seed=9)
        period = batch.period_mask()
        on_day = days == day
        assert m.kept[period].sum() == lifetime[on_day].sum()
        expected = np.zeros_like(m.histogram)
        for j, s in enumerate(domain.slice_index({"s": log.slices["s"][on_day & lifetime]})):
            expected[s] += contributions[np.flatnonzero(on_day & lifetime)[j]]
        np.testing.assert_array_equal(m.histogram, expected)
        acc = m.release.accounting
        earlier_of_day = (days < day) & np.isin(log.impression_id, log.impression_id[on_day])
        assert acc.rows_read == on_day.sum() and acc.lookback_rows_used == earlier_of_day.sum() and acc.closes
        # every impression's kept contributions, lookback included, stay within Gamma
        kept_rows = np.flatnonzero(m.kept)
        norms = np.bincount(np.unique(batch.impression_id[kept_rows], return_inverse=True)[1].reshape(-1),
                            weights=encode_and_bound(batch, p, simulation_seed=9)[0][kept_rows].sum(axis=1))
        assert norms.max(initial=0) <= p.contribution_budget


def test_without_lookback_a_day_keeps_more_than_the_browser():
    log = multi_day_log(3)
    p = params("linf", 2)
    _, lifetime = encode_and_bound(log, p, simulation_seed=1)
    days = log.conversion_time // DAY
    day = int(np.unique(days)[3])
    alone = measure(log.take(np.flatnonzero(days == day)), p, simulation_seed=1)
    assert alone.rows_kept > lifetime[days == day].sum()


def test_statistics_and_calibration_count_the_period_with_lifetime_ranks():
    log = multi_day_log(11, impressions=400)
    days = log.conversion_time // DAY
    day = int(np.unique(days)[3])
    batch = day_with_lookback(log, day)
    spec = StatisticsSpec(("s",), ("value",), max_count_limit=8)
    stats = compute_statistics_in_memory(batch, spec, batches=3)
    assert stats.num_conversions == (days == day).sum()
    for count_limit in (1, 2, 5, 8):
        p = params("linf", count_limit)
        _, lifetime = encode_and_bound(log, p)
        kept = stats.kept_totals(kept_per_impression(count_limit))[:, 0].sum()
        assert kept == lifetime[days == day].sum()
        cal = cb.calibration_statistics(batch, p, cb.day_blocks(batch))
        assert cal.quantity(0, "X").sum() == lifetime[days == day].sum()
        assert cal.quantity(0, "T").sum() == (days == day).sum()
    # the day's clusters: the first lifetime rank of each impression's conversions that day
    h, n, k = cluster_table(stats, 2)
    assert (h * n).sum() == (days == day).sum()
    _, lifetime2 = encode_and_bound(log, params("linf", 2))
    assert (h * k).sum() == lifetime2[days == day].sum()


def test_scaled_statistics_model_one_day_of_the_history():
    log = multi_day_log(5, impressions=800, days=8)
    stats = compute_statistics_in_memory(log, StatisticsSpec(("s",), ("value",), max_count_limit=4))
    days = stats.history_days()
    assert days == len(np.unique(log.conversion_time // DAY))
    one = stats.for_release_period(1.0)
    assert one.future_period and one.volume_scale == pytest.approx(1.0 / days)
    np.testing.assert_allclose(one.totals(), stats.totals() / days)
    assert one.quantile(0, 0.5) == stats.quantile(0, 0.5) and one.taus().tolist() == stats.taus().tolist()
    assert stats.for_release_period(30.0).volume_scale == 1.0  # never more than the history
    with pytest.raises(ValueError, match="> 0"):
        stats.scaled(0.0)


def _write_days(log: Conversions, folder) -> dict[int, str]:
    paths = {}
    days = log.conversion_time // DAY
    for day in np.unique(days):
        rows = np.flatnonzero(days == day)
        table = pa.table({"impression_id": log.impression_id[rows],
                          "conversion_time": pa.array(log.conversion_time[rows], pa.timestamp("us", tz="UTC")),
                          "s": log.slices["s"][rows], "value": log.values[rows, 0]})
        path = os.path.join(folder, f"date={int(day):02d}.parquet")
        pq.write_table(table, path)
        paths[int(day)] = path
    return paths


def test_beam_measure_with_lookback_equals_the_lifetime_cap(tmp_path):
    log = multi_day_log(21, impressions=200)
    paths = _write_days(log, tmp_path)
    day = sorted(paths)[3]
    p = params("linf", 3)
    domain = KeyDomain.from_slice_values(("s",), {"s": np.arange(3)}, ("value",))
    expected = measure(day_with_lookback(log, day), p, domain, simulation_seed=4)

    def check(sums):
        (got,) = sums
        np.testing.assert_array_equal(got.histogram, expected.histogram)
        assert got.kept == expected.rows_kept and got.capped == expected.rows_capped
        assert got.lookback_rows == sum((log.conversion_time // DAY) < day)

    with TestPipeline() as pipeline:
        read = pipeline | ReadAndValidate([paths[day]], ("s",), ("value",),
                                          lookback_paths=[paths[d] for d in sorted(paths) if d < day])
        sums = (read["valid"] | GroupByImpression(7)
                | EncodeBoundAndSum(p, pipeline | "Domain" >> beam.Create([domain]), simulation_seed=4))
        assert_that(sums, check)
        assert_that(read[LOOKBACK_COUNTS] | beam.Map(lambda c: c.rows_read),
                    lambda got: got == [sum((log.conversion_time // DAY) < day)], label="lookback counts")


@pytest.mark.slow
def test_daily_releases_with_lookback_record_only_the_days_rows_in_the_ledger(tmp_path, capsys):
    from pipelines import measure as measure_cli

    log = multi_day_log(8, impressions=150)
    paths = _write_days(log, tmp_path)
    days = sorted(paths)
    ParameterVersion(params("linf", 3)).save(str(tmp_path / "params.json"))
    (tmp_path / "slices.csv").write_text("s\n0\n1\n2\n")

    def release(day: int) -> int:
        lookback = tmp_path / f"lookback-{day}"
        lookback.mkdir()
        for d in days:
            if d < day:
                os.link(paths[d], lookback / os.path.basename(paths[d]))
        return measure_cli.run(["--input", paths[day], "--lookback", str(lookback), "--params",
                                str(tmp_path / "params.json"), "--domain", str(tmp_path / "slices.csv"),
                                "--output", str(tmp_path / f"out-{day}"), "--ledger", str(tmp_path / "ledger")])

    # day 4's lookback holds day 3, which was released: not a re-release of any of day 4's rows
    assert release(days[3]) == 0 and release(days[4]) == 0
    out = capsys.readouterr().out
    assert out.count("lifetime cap:") == 2
    # the same day into a new output is refused before any work: day 4, released after it within a source
    # life, chose its kept reports without day 3's conversions again (ARA's lifetime cap across releases)
    again = measure_cli.run(["--input", paths[days[3]], "--params", str(tmp_path / "params.json"), "--domain",
                             str(tmp_path / "slices.csv"), "--output", str(tmp_path / "again"), "--ledger",
                             str(tmp_path / "ledger")])
    assert again == 2 and "Release a log's days in time order" in capsys.readouterr().err
    assert not (tmp_path / "again").exists()


@given(seed=st.integers(0, 10_000), count_limit=st.integers(1, 6))
def test_a_lookback_whose_ids_are_spelled_otherwise_still_holds_the_impressions_earlier_conversions(seed, count_limit):
    """A daily export that pads its ids (``"0000007"``) after one that did not (``"7"``): the lookback's
    rows are still the period's impressions' (their canonical ids, ``araopt.io.ids``), so each day keeps
    what one lifetime cap over the whole log keeps."""
    log = multi_day_log(seed, impressions=40)
    p = params("linf", count_limit)
    _, lifetime = encode_and_bound(log, p, simulation_seed=9)
    days = log.conversion_time // DAY

    def spelled(rows: np.ndarray, width: int) -> Conversions:
        part = log.take(rows)
        ids = np.array([str(int(i)).zfill(width) for i in part.impression_id], dtype=object)
        return Conversions(ids, part.conversion_time, part.slices, part.values, part.value_columns)

    for day in np.unique(days):
        batch = concat_periods(spelled(np.flatnonzero(days == day), 8), spelled(np.flatnonzero(days < day), 1))
        m = measure(batch, p, simulation_seed=9)
        assert m.kept[batch.period_mask()].sum() == lifetime[days == day].sum()
