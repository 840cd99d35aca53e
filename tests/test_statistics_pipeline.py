"""The Beam statistics side pipeline equals the core combiner on the same data."""
import dataclasses

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that

from araopt import Conversions
from araopt.optimize import statistics as stats
from factories import make_frame, write_parts
from pipelines.history import compute_statistics
from transforms.statistics import ComputeStatistics
from transforms.validate import ValidateConversions

SPEC = stats.StatisticsSpec(("campaign", "geo"), ("value", "items"), max_count_limit=6)


def core_statistics(frame):
    acc = stats.create_accumulator(SPEC)
    acc = stats.add_conversions(acc, Conversions.from_table(frame, SPEC.slice_columns, SPEC.value_columns))
    return stats.extract_output(acc)


def assert_same(a, b):
    assert a.slice_keys == b.slice_keys
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            if f.name.startswith("sample"):
                continue  # reservoir samples: compared as sets below
            assert np.allclose(x, y, rtol=1e-12, atol=1e-9), f.name
        elif f.name not in ("spec",):
            assert x == y, f.name
    assert sorted(map(tuple, a.sample_values.tolist())) == sorted(map(tuple, b.sample_values.tolist()))


def test_compute_statistics_transform_equals_core():
    frame = make_frame(4000)
    expected = core_statistics(frame)
    tables = [pa.Table.from_pandas(frame.iloc[i::3], preserve_index=False) for i in range(3)]

    def check(results):
        (got,) = results
        assert_same(got, expected)

    with TestPipeline() as p:
        valid = (p | beam.Create(tables) | ValidateConversions(SPEC.slice_columns, SPEC.value_columns)).valid
        assert_that(valid | ComputeStatistics(SPEC, num_shards=7), check)


@pytest.mark.slow
def test_compute_statistics_job_on_files(tmp_path):
    frame = make_frame(4000)
    frame.loc[3, "value"] = -2.0
    data = write_parts(frame, tmp_path / "hist", 4)
    run = compute_statistics(data, SPEC)
    assert (run.counts.rows_read, run.counts.rows_rejected) == (4000, 1)
    assert run.counts.rejected_by_reason == {"negative_value": 1}
    assert_same(run.statistics, core_statistics(frame.drop(index=3)))


def test_bad_history_refused_before_work(tmp_path):
    with pytest.raises(ValueError, match="no input files"):
        compute_statistics(str(tmp_path / "nothing*.parquet"), SPEC)
    data = write_parts(make_frame(100).drop(columns=["items"]), tmp_path / "h2", 1)
    with pytest.raises(ValueError, match="missing required column"):
        compute_statistics(data, SPEC)
