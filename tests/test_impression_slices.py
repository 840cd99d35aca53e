"""An impression is one ARA source, registered once with its impression features: rows whose
impression-side slice values differ from their impression's first row (in Alg. 1's order: time,
then the record hash) go to the dead letter with the reason ``impression_slice_inconsistent`` and
are counted, in ``measure``, the history jobs and the in-memory loaders alike; the core ``measure``
refuses them."""
from __future__ import annotations

import functools
import json
import os

import apache_beam as beam
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from araopt import Conversions, Params, QueryParams, measure
from araopt.io import outputs
from araopt.io.conversions import IMPRESSION_SLICE_INCONSISTENT, ValidationCounts, dead_letter_schema, validate_batch
from araopt.mechanism.sources import impression_slice_conflicts, split_impression_slice_conflicts
from araopt.version import ParameterVersion
from transforms.validate import COUNTS, GROUPED, ReadAndValidate

SLICES, VALUES = ("campaign", "geo", "device"), ("value",)


def frame():
    """Impression 1: campaign 'a' first (time 1), then 'b' at time 3 -> the 'b' row is inconsistent;
    impression 2: geo changes at its second row; impression 3: only the conversion-side device changes."""
    return pd.DataFrame({
        "impression_id": [1, 1, 1, 2, 2, 3, 3],
        "conversion_time": pd.to_datetime([2, 1, 3, 5, 6, 1, 2], unit="h", utc=True),
        "campaign": ["a", "a", "b", "c", "c", "d", "d"],
        "geo": [10, 10, 10, 20, 21, 30, 30],
        "device": ["m", "d", "m", "m", "m", "m", "d"],
        "value": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0],
    })


def valid_table(df):
    return validate_batch(pa.Table.from_pandas(df, preserve_index=False), SLICES, VALUES).valid


IMPRESSION_SIDE = ("campaign", "geo")


def test_rows_that_differ_from_their_impressions_first_row_in_time_order_are_flagged():
    flagged = impression_slice_conflicts(valid_table(frame()), IMPRESSION_SIDE, SLICES, VALUES)
    assert flagged.tolist() == [False, False, True, False, True, False, False]


def test_conversion_side_slices_may_change_within_an_impression():
    assert impression_slice_conflicts(valid_table(frame()), ("campaign",), SLICES, VALUES).tolist() == \
        [False, False, True, False, False, False, False]
    # device differs within impressions 1 and 3: as an impression-side column it would be flagged
    assert impression_slice_conflicts(valid_table(frame()), ("device",), SLICES, VALUES).sum() == 3
    assert not impression_slice_conflicts(valid_table(frame()), (), SLICES, VALUES).any()


def test_the_first_row_is_decided_by_time_then_record_hash_whatever_the_row_order():
    df = frame()
    base = impression_slice_conflicts(valid_table(df), IMPRESSION_SIDE, SLICES, VALUES)
    rng = np.random.default_rng(0)
    for _ in range(5):
        perm = rng.permutation(len(df))
        got = impression_slice_conflicts(valid_table(df.iloc[perm]), IMPRESSION_SIDE, SLICES, VALUES)
        assert got.tolist() == base[perm].tolist()
    # equal times: the record hash (Conversions.record_keys) decides, the same way for every order
    tied = df.assign(conversion_time=pd.Timestamp(0, tz="UTC"))
    first = impression_slice_conflicts(valid_table(tied), IMPRESSION_SIDE, SLICES, VALUES)
    reverse = impression_slice_conflicts(valid_table(tied.iloc[::-1]), IMPRESSION_SIDE, SLICES, VALUES)
    assert first.tolist() == reverse[::-1].tolist() and first[3:5].sum() == 1 and not first[5:].any()


@pytest.mark.parametrize("kind", ["int", "string", "bool"])
def test_every_slice_type_and_conversions_give_the_same_verdict_as_tables(kind):
    values = {"int": [7, 7, 8, 7], "string": ["x", "x", "y", "x"], "bool": [True, True, False, True]}[kind]
    df = pd.DataFrame({"impression_id": ["i", "i", "i", "j"], "conversion_time": pd.to_datetime([1, 2, 3, 1], unit="s"),
                       "s": values, "value": [1.0, 1.0, 1.0, 1.0]})
    table = validate_batch(pa.Table.from_pandas(df, preserve_index=False), ("s",), VALUES).valid
    want = [False, False, True, False]
    assert impression_slice_conflicts(table, ("s",), ("s",), VALUES).tolist() == want
    assert impression_slice_conflicts(Conversions.from_table(table, ("s",), VALUES), ("s",)).tolist() == want


def test_only_the_rows_of_impressions_with_two_values_are_sorted(monkeypatch):
    """The fast pass (a hash pass per column) clears consistent impressions; the exact first-row
    decision (a sort by time and record hash) sees only the rows of impressions that may have two values."""
    import araopt.io.conversions as conversions

    seen = []
    real = conversions.Conversions.from_table

    def spy(table, *args, **kw):
        seen.append(sorted(table.column("impression_id").to_pylist()))
        return real(table, *args, **kw)

    monkeypatch.setattr(conversions.Conversions, "from_table", staticmethod(spy))
    consistent = valid_table(frame().iloc[[0, 1, 3, 5, 6]])
    assert not impression_slice_conflicts(consistent, IMPRESSION_SIDE, SLICES, VALUES).any() and seen == []
    assert impression_slice_conflicts(valid_table(frame()), ("campaign",), SLICES, VALUES).sum() == 1
    assert seen == [[1, 1, 1]]  # impression 1 only: 2 and 3 are consistent in campaign


def test_rejected_rows_become_dead_letter_rows_with_the_reason():
    table = valid_table(frame())
    kept, rejected = split_impression_slice_conflicts(table, IMPRESSION_SIDE, SLICES, VALUES)
    assert kept.num_rows == 5 and rejected.schema == dead_letter_schema(SLICES, VALUES)
    assert rejected.column("reason").to_pylist() == [IMPRESSION_SLICE_INCONSISTENT] * 2
    assert rejected.column("campaign").to_pylist() == ["b", "c"] and rejected.column("geo").to_pylist() == ["10", "21"]
    assert rejected.column("conversion_time").to_pylist()[0].startswith("1970-01-01 03:00:00")
    consistent = valid_table(frame().iloc[[0, 1, 3, 5, 6]])
    assert split_impression_slice_conflicts(consistent, IMPRESSION_SIDE, SLICES, VALUES) == (consistent, None)


def test_the_core_measure_refuses_an_impression_split_over_two_slices():
    params = Params(count_limit=2, encoding="linf", epsilon=1.0, slice_columns=SLICES, conversion_slice_columns=("device",),
                    queries=(QueryParams("value", 5.0, 1.0),))
    conv = Conversions.from_table(valid_table(frame()), SLICES, VALUES)
    with pytest.raises(ValueError, match=r"2 conversion\(s\) have impression-side slice values \(campaign, geo\).*"
                                         r"impression np.int64\(1\)"):
        measure(conv, params, simulation_seed=1)
    ok = conv.take(np.array([0, 1, 3, 5, 6]))
    assert measure(ok, params, simulation_seed=1).rows == 5  # conversion-side device changes are fine


def test_read_and_validate_dead_letters_inconsistent_rows_spread_over_files(tmp_path):
    df = frame()
    paths = []
    for i in range(3):  # every impression's rows in several files
        paths.append(str(tmp_path / f"part-{i}.parquet"))
        pq.write_table(pa.Table.from_pandas(df.iloc[i::3], preserve_index=False), paths[-1])
    with TestPipeline() as p:
        read = p | ReadAndValidate(paths, SLICES, VALUES, str(tmp_path / "dead"), num_shards=2,
                                   impression_slice_columns=IMPRESSION_SIDE)
        rows = read[GROUPED] | beam.FlatMap(lambda item: item[1].column("value").to_pylist())
        assert_that(rows, equal_to([1.0, 2.0, 4.0, 6.0, 7.0]), label="kept")
        assert_that(read[COUNTS] | beam.Map(lambda c: (c.rows_read, c.rows_rejected, dict(c.rejected_by_reason))),
                    equal_to([(7, 2, {IMPRESSION_SLICE_INCONSISTENT: 2})]), label="counts")
    dead = pq.read_table(str(tmp_path / "dead.parquet"))
    assert sorted(dead.column("value").to_pylist()) == ["3", "5"]


def test_counts_of_late_rejections_merge_with_validation_counts():
    late = ValidationCounts.rejected(2, IMPRESSION_SLICE_INCONSISTENT)
    merged = ValidationCounts.merge([ValidationCounts(10, 1, {"null_value": 1}, 0), late])
    assert (merged.rows_read, merged.rows_rejected, merged.rows_valid) == (10, 3, 7)
    assert merged.rejected_by_reason == {"impression_slice_inconsistent": 2, "null_value": 1}
    assert ValidationCounts.rejected(0, IMPRESSION_SLICE_INCONSISTENT).rejected_by_reason == {}


def choose_fixed(version, statistics, counts):
    """A history job's choice: always ``version`` (picklable: a module-level function)."""
    return "fixed", (version,)


@pytest.mark.slow
def test_measure_and_the_history_jobs_reject_the_same_rows_and_accounting_closes(tmp_path, capsys):
    from araopt.optimize.statistics import StatisticsSpec
    from pipelines import measure as measure_pipeline
    from pipelines.history import compute_statistics, compute_tuned_history
    from pipelines.inputs import load_conversions

    df = pd.concat([frame().assign(impression_id=frame()["impression_id"] + 10 * k) for k in range(5)])
    path = tmp_path / "log.parquet"
    df.to_parquet(path)
    params = Params(count_limit=2, encoding="linf", epsilon=1.0, slice_columns=SLICES, conversion_slice_columns=("device",),
                    queries=(QueryParams("value", 5.0, 1.0),))
    ParameterVersion(params).save(tmp_path / "p.json")
    out = tmp_path / "out"
    assert measure_pipeline.run(["--input", str(path), "--params", str(tmp_path / "p.json"), "--output", str(out),
                                 "--simulation-seed", "3", "--max-rejected-fraction", "0.5"]) == 0
    summary = json.loads((out / outputs.private_file(outputs.RUN_SUMMARY)).read_text())
    assert summary["rows_rejected_by_reason"] == {IMPRESSION_SLICE_INCONSISTENT: 10} and summary["accounting_closes"]
    assert summary["conversions_kept"] + summary["conversions_dropped_by_cap"] == 25
    dead = pq.read_table(os.path.join(out, outputs.private_file(outputs.DEAD_LETTER)))
    assert set(dead.column("reason").to_pylist()) == {IMPRESSION_SLICE_INCONSISTENT} and dead.num_rows == 10
    # the history jobs: every slice column is an impression feature there
    # (device too: impression 1's first row is the 'd' one at time 1, impression 3's the 'm' one)
    run = compute_statistics(str(path), StatisticsSpec(SLICES, VALUES), max_rejected_fraction=0.6)
    assert run.counts.rejected_by_reason == {IMPRESSION_SLICE_INCONSISTENT: 20}
    assert run.statistics.num_conversions == 15
    conv, counts, rejected = load_conversions(str(path), SLICES, VALUES, 0.5, impression_slice_columns=("campaign", "geo"))
    assert len(conv) == 25 and counts.rejected_by_reason == {IMPRESSION_SLICE_INCONSISTENT: 10}
    assert rejected.num_rows == 10
    # the one job of optimize (statistics, choice, calibration of the candidates): the same rows rejected
    from transforms.io import check_input

    tuned = compute_tuned_history(check_input(str(path), SLICES, VALUES), StatisticsSpec(SLICES, VALUES),
                                  functools.partial(choose_fixed, ParameterVersion(params)), max_rejected_fraction=0.6)
    assert tuned.counts.rejected_by_reason == {IMPRESSION_SLICE_INCONSISTENT: 20} and tuned.chosen == "fixed"
    (cal,) = tuned.calibration
    assert cal.num_conversions == 15 == tuned.statistics.num_conversions
