"""``measure``'s one job builder (``transforms.measure.build_release``) reads the target's description
(``araopt.targets.Target``) for what differs between the targets: where Alg. 1's privacy unit is
grouped (ARA: complete impressions at the read; W3C Attribution: browsers inside its release step),
whether the Attribution columns are validated, and how the lookback's held releases are told. The
jobs are built, not run: these are specifications of their graphs."""
from __future__ import annotations

import apache_beam as beam
import numpy as np
import pandas as pd
import pyarrow as pa

from araopt.attribution.params import COUNT, AttributionParams, AttributionQuery
from araopt.io.conversions import CONVERSION_TIME
from araopt.io.run_folder import RunFolder
from araopt.mechanism.lifetime import ReleaseHistory
from araopt.targets import ARA, ATTRIBUTION, TARGETS, HeldLookback
from araopt.version import ParameterVersion
from factories import make_params
from transforms.io import Footer, InputFiles
from transforms.measure import RELEASE_STEPS, ReleaseJob, build_release

QUERIES = (AttributionQuery(COUNT, None), AttributionQuery("value", "value", max_value=255, clip=20.0))


def _inputs(name: str) -> InputFiles:
    first, last = (int(pd.Timestamp(t).value // 1000) for t in ("2026-11-20T00:00:00Z", "2026-11-20T23:00:00Z"))
    footer = Footer(f"/nonexistent/{name}.parquet", pa.schema([]), 10, ((CONVERSION_TIME, first, last),))
    return InputFiles((footer,), pa.schema([]))


def _labels(version: ParameterVersion, tmp_path, **job) -> set[str]:
    """The full labels of every transform of ``version``'s release job with a lookback and row ids."""
    folder = RunFolder.prepare(str(tmp_path / "out"), overwrite=False)
    pipeline = beam.Pipeline()
    build_release(pipeline, _inputs("period"), version, folder,
                  ReleaseJob(row_ids=str(tmp_path / "ids"), lookback=_inputs("lookback"), days=None, **job))
    labels: set[str] = set()

    class Visit(beam.pipeline.PipelineVisitor):
        def enter_composite_transform(self, node):
            labels.add(node.full_label)

        def visit_transform(self, node):
            labels.add(node.full_label)

    pipeline.visit(Visit())
    folder.abandon()
    return labels


def test_every_target_has_its_release_step():
    assert set(RELEASE_STEPS) == set(TARGETS)


def test_the_ara_job_groups_complete_impressions_at_the_read_and_counts_the_held_releases(tmp_path):
    params = make_params()
    history = ReleaseHistory((params,), ((0, np.array([1, 2], dtype=np.int64)),), ("e1",))
    labels = _labels(ParameterVersion(params), tmp_path, history=history)
    assert ARA.groups_at_read and ARA.held_lookback == HeldLookback.COUNTED
    assert "ReadAndValidate/GroupByImpression" in labels
    assert "ReadAndValidate/CheckImpressionSlices" in labels
    assert {"EncodeBoundAndSum", "NoisyRelease", "Publish", "WriteRelease"} <= labels
    assert {"ReleasedRowIds", "LookbackRowIds", "CountHeldReleases"} <= labels
    assert "HeldRowIds" not in labels and "MeasureAttribution" not in labels


def test_the_attribution_job_groups_browsers_in_its_release_step_and_writes_the_held_rows_ids(tmp_path):
    params = AttributionParams.from_paper(4.0, 2, {COUNT: 0.3, "value": 0.7}, QUERIES, ("campaign",))
    layout = ParameterVersion.for_attribution(params)
    labels = _labels(layout, tmp_path, columns=("impression_time", "browser_id"), simulation_seed=1)
    assert not ATTRIBUTION.groups_at_read and ATTRIBUTION.held_lookback == HeldLookback.ROW_IDS
    assert not any(label.startswith("ReadAndValidate/GroupByImpression") for label in labels)
    assert "MeasureAttribution/GroupByBrowser" in labels
    assert {"ReleasedRowIds", "LookbackRowIds", "HeldRowIds", "WriteRelease"} <= labels
    assert "CountHeldReleases" not in labels and "EncodeBoundAndSum" not in labels
