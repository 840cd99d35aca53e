"""The Beam calibration side pipeline (ComputeCalibration in the one generic CombinerFn) equals the core
accumulator on the same data, for several candidate parameter versions at once."""
import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that

import araopt.calibration as cb
from araopt import Conversions, Params, QueryParams
from araopt.version import ParameterVersion
from factories import make_frame
from transforms.calibration import ComputeCalibration
from transforms.group import split_by_shard
from transforms.validate import ValidateConversions

SLICES, VALUES = ("campaign", "geo"), ("value", "items")


def candidates():
    def params(c, clip):
        return Params(count_limit=c, encoding="linf", epsilon=8.0, slice_columns=SLICES,
                      queries=(QueryParams("value", clip, 0.5), QueryParams("items", 3.0, 0.5)))
    return (ParameterVersion(params(2, 20.0)), ParameterVersion(params(4, 50.0)))


def test_compute_calibration_transform_equals_core_for_every_candidate():
    frame = make_frame(n=3000, seed=5)
    table = pa.Table.from_pandas(frame, preserve_index=False)
    versions = candidates()
    with TestPipeline() as p:
        checked = p | beam.Create([table]) | "Validate" >> ValidateConversions(SLICES, VALUES)
        shards = checked["valid"] | beam.FlatMap(lambda t: list(split_by_shard(t, 5)))
        chosen = p | "Candidates" >> beam.Create([versions])
        result = shards | ComputeCalibration(chosen, SLICES, VALUES)

        def matches_core(got):
            (stats,) = got
            conv = Conversions.from_table(table, SLICES, VALUES)
            blocks = cb.day_blocks(conv)
            assert len(stats) == len(versions)
            for s, v in zip(stats, versions, strict=True):
                want = cb.calibration_statistics(conv, v.params, blocks, fitted_for=v.checksum())
                assert s.slice_keys == want.slice_keys and s.block_keys == want.block_keys
                assert s.fitted_for == v.checksum() and s.num_conversions == want.num_conversions == len(conv)
                assert np.allclose(s.cells, want.cells, rtol=1e-12, atol=1e-9)
            # the candidates differ in what Alg. 1 keeps: their statistics are not the same
            assert not np.allclose(stats[0].ratios(), stats[1].ratios(), equal_nan=True)

        assert_that(result, matches_core)


def test_candidates_combiner_is_associative_and_keeps_the_candidates_apart():
    frame = make_frame(n=1200, seed=6)
    conv = Conversions.from_table(frame, SLICES, VALUES)
    versions = candidates()
    pairs = [(v.params, v.checksum()) for v in versions]
    ids = np.asarray(conv.impression_id)
    halves = [conv.take(np.flatnonzero(ids % 2 == k)) for k in (0, 1)]  # impression-complete parts
    combiner = cb.CandidatesCombiner()
    parts = [cb.accumulate_candidates(h, pairs, SLICES) for h in halves]
    one = combiner.extract(combiner.add(combiner.add(combiner.create(), parts[0]), parts[1]))
    other = combiner.extract(combiner.merge([None, parts[1], parts[0]]))
    whole = combiner.extract(cb.accumulate_candidates(conv, pairs, SLICES))
    assert combiner.extract(combiner.create()) is None
    for a, b, c in zip(one, other, whole, strict=True):
        assert a.slice_keys == b.slice_keys == c.slice_keys
        assert np.allclose(a.cells, c.cells) and np.allclose(b.cells, c.cells)
