"""The release workflow written once (``araopt.release_workflow``): the in-memory backend and the Beam
adapters (``transforms.aggregate``) give the same publication on the same seeded input, and the
privacy rules live in the release step whichever backend made the sums."""
from __future__ import annotations

import dataclasses

import apache_beam as beam
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that

from araopt import Conversions, measure
from araopt.errors import PrivacyRefusal
from araopt.io.conversions import ValidationCounts
from araopt.mechanism.keys import DATA
from araopt.release_workflow import (
    InMemoryReleaseBackend,
    ReleaseSpec,
    data_domain,
    publish_release,
    release_and_publish,
    release_epsilon,
)
from araopt.version import ParameterVersion
from factories import make_frame, make_params
from transforms.aggregate import EncodeBoundAndSum, NoisyRelease
from transforms.group import GroupByImpression
from transforms.validate import ValidateConversions

SEED = 11


def _conversions(frame: pd.DataFrame, params) -> Conversions:
    return Conversions.from_table(frame, params.slice_columns, params.query_columns)


def test_in_memory_and_beam_backends_publish_the_same_release():
    frame = make_frame(3000)
    params = make_params()
    spec = ReleaseSpec(ParameterVersion(params), simulation_seed=SEED)
    domain = data_domain(_conversions(frame, params), params)
    expected = release_and_publish(InMemoryReleaseBackend(_conversions(frame, params)), spec, domain)
    expected_frame = expected.frame()
    tables = [pa.Table.from_pandas(frame.iloc[i::3], preserve_index=False) for i in range(3)]

    def check(results):
        (got,) = results
        assert np.array_equal(got.release.report.unnoised, expected.release.report.unnoised)
        assert np.array_equal(got.release.report.noisy, expected.release.report.noisy)
        assert got.release.accounting == expected.release.accounting
        pd.testing.assert_frame_equal(got.frame(), expected_frame)

    with TestPipeline() as p:
        valid = (p | beam.Create(tables) | ValidateConversions(params.slice_columns, params.query_columns)).valid
        domain_pc = p | "Domain" >> beam.Create([domain])
        counts = p | "Counts" >> beam.Create([ValidationCounts(len(frame))])
        merged = valid | GroupByImpression(4) | EncodeBoundAndSum(params, domain_pc, SEED)
        published = (merged | NoisyRelease(params, counts, domain_pc, simulation_seed=SEED)
                     | beam.Map(publish_release, spec))
        assert_that(published, check)


def test_the_in_memory_workflow_is_the_mechanisms_measure():
    frame = make_frame(2000, seed=3)
    params = make_params("baseline")
    conversions = _conversions(frame, params)
    domain = data_domain(conversions, params)
    core = measure(conversions, params, domain, simulation_seed=SEED)
    got = release_and_publish(InMemoryReleaseBackend(conversions), ReleaseSpec(ParameterVersion(params),
                              simulation_seed=SEED), domain).release
    assert np.array_equal(got.report.noisy, core.report.noisy)
    assert got.accounting == core.release.accounting


def test_the_release_step_refuses_a_data_derived_domain_outside_simulation():
    frame = make_frame(500)
    params = make_params()
    conversions = _conversions(frame, params)
    domain = data_domain(conversions, params)
    assert domain.origin == DATA
    with pytest.raises(PrivacyRefusal, match="derived from the data"):
        release_and_publish(InMemoryReleaseBackend(conversions), ReleaseSpec(ParameterVersion(params)), domain)
    with pytest.raises(PrivacyRefusal, match="derived from the data"):  # the Beam adapter runs the same step
        with TestPipeline() as p:
            sums = p | "Sums" >> beam.Create([dataclasses.replace(InMemoryReleaseBackend(conversions).domain_sums(
                ReleaseSpec(ParameterVersion(params)), domain).sums, grouping="the whole log")])
            _ = sums | NoisyRelease(params, p | "C" >> beam.Create([ValidationCounts(len(frame))]),
                                    p | "D" >> beam.Create([domain]))


@pytest.mark.parametrize("rejected, refused", [(100, False), (101, True)])
def test_the_release_step_refuses_above_the_rejected_share(rejected, refused):
    frame = make_frame(900)
    params = make_params()
    conversions = _conversions(frame, params)
    domain = data_domain(conversions, params)
    counts = ValidationCounts(1000, rejected, {"bad": rejected})
    backend = InMemoryReleaseBackend(conversions, counts)  # 900 rows kept (or capped) of 1000 read
    spec = ReleaseSpec(ParameterVersion(params), simulation_seed=SEED, max_rejected_fraction=0.10)
    if refused:
        with pytest.raises(PrivacyRefusal, match="failed validation"):
            release_and_publish(backend, spec, domain)
    else:
        published = release_and_publish(backend, spec, domain)
        assert published.release.accounting.rows_rejected == rejected


def test_an_epsilon_that_differs_needs_the_override_and_is_recorded():
    version = ParameterVersion(make_params())
    assert release_epsilon(version, None, False, "p.json") == (version, {})
    assert release_epsilon(version, 4.0, False, "p.json") == (version, {})
    with pytest.raises(ValueError, match="--override-epsilon"):
        release_epsilon(version, 2.0, False, "p.json")
    changed, note = release_epsilon(version, 2.0, True, "p.json")
    assert changed.params.epsilon == 2.0 and note == {"epsilon_overridden": {"from": 4.0, "to": 2.0}}
