"""The Beam measurement pipeline: each transform with TestPipeline + assert_that, exact equality with
the core library, invariance to input layout and runner mode, retries, dead letters and accounting."""
from __future__ import annotations

import dataclasses
import json
import os

import apache_beam as beam
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from araopt import Conversions, KeyDomain, measure
from araopt.io import avro, outputs
from araopt.io.conversions import ValidationCounts
from araopt.io.ids import ID_HASH, canonical_id_hash
from araopt.io.run_folder import RunFolder
from araopt.mechanism import aggregate
from araopt.mechanism.measure import encode_and_bound
from araopt.version import ParameterVersion
from factories import make_frame, make_params, write_parts
from pipelines import measure as measure_pipeline
from pipelines.runner import make_runner
from transforms import aggregate as agg_transforms
from transforms.aggregate import EncodeBoundAndSum, NoisyRelease, _AddNoise
from transforms.coders import ArrowTableCoder
from transforms.group import GroupByImpression, shard_of, split_by_shard
from transforms.io import check_input
from transforms.measure import ReleaseJob, build_release
from transforms.validate import REJECTED, ValidateConversions

SEED = 7


def run_measure(tmp_path, frame, params, name, parts=3, extra=()):
    data = write_parts(frame, tmp_path / f"in-{name}", parts)
    ParameterVersion(params).save(tmp_path / f"{name}.json")
    out = tmp_path / f"out-{name}"
    code = measure_pipeline.run(["--input", data, "--params", str(tmp_path / f"{name}.json"), "--output", str(out),
                                 "--simulation-seed", str(SEED), "--debug-run", *extra])
    return code, out


def rel(out, name, simulation=True):
    """A release artifact of a run folder (simulation runs: simulation/SIMULATION-<name>)."""
    return os.path.join(str(out), outputs.release_file(name, simulation))


def private(out, name):
    return os.path.join(str(out), outputs.private_file(name))


def read_debug(out):
    buckets, unnoised, noise, _ = avro.read_debug_report(private(out, outputs.DEBUG_REPORT))
    return buckets, unnoised, noise


def data_domain(frame, params):
    return KeyDomain.from_slice_values(params.slice_columns, {c: frame[c].to_numpy() for c in params.slice_columns},
                                       params.query_columns, baseline=params.encoding == "baseline")


# ---- transforms, one by one ------------------------------------------------------------------
def test_validate_sends_bad_rows_to_dead_letter_with_reason():
    frame = make_frame(20)
    frame.loc[1, "value"] = -1.0
    frame.loc[2, "value"] = np.inf
    table = pa.Table.from_pandas(frame, preserve_index=False)
    table = table.set_column(0, "impression_id", pa.array([None] + frame["impression_id"].tolist()[1:], pa.int64()))
    with TestPipeline() as p:
        out = p | beam.Create([table]) | ValidateConversions(("campaign", "geo"), ("value", "items"))
        assert_that(out.valid | "ValidRows" >> beam.Map(lambda t: t.num_rows), equal_to([17]), label="valid")
        reasons = out[REJECTED] | beam.FlatMap(lambda t: t.column("reason").to_pylist())
        assert_that(reasons, equal_to(["null_impression_id", "negative_value", "non_finite_value"]), label="reasons")
        counts = out.counts | beam.CombineGlobally(ValidationCounts.merge)
        assert_that(counts | beam.Map(lambda c: (c.rows_read, c.rows_rejected, dict(c.rejected_by_reason))),
                    equal_to([(20, 3, {"negative_value": 1, "non_finite_value": 1, "null_impression_id": 1})]),
                    label="counts")


def test_group_by_impression_puts_each_impression_in_exactly_one_shard():
    frame = make_frame(3000)
    tables = [pa.Table.from_pandas(frame.iloc[i::4], preserve_index=False) for i in range(4)]

    def check(shards):
        seen = {}
        for shard, table in shards:
            for imp in set(table.column("impression_id").to_pylist()):
                assert imp not in seen, f"impression {imp} in shards {seen[imp]} and {shard}"
                seen[imp] = shard
        assert sum(t.num_rows for _, t in shards) == 3000
        assert set(seen) == set(frame["impression_id"])

    with TestPipeline() as p:
        shards = p | beam.Create(tables) | GroupByImpression(num_shards=8)
        assert_that(shards, check)


def test_shards_of_a_batch_are_its_rows_and_travel_as_their_rows_only():
    table = pa.Table.from_pandas(make_frame(3000), preserve_index=False)
    shards = list(split_by_shard(table, 8))
    ids = table.column("impression_id").to_numpy()
    assert [s for s, _ in shards] == sorted({s for s, _ in shards})
    assert sum(part.num_rows for _, part in shards) == table.num_rows
    coder = ArrowTableCoder()
    for shard, part in shards:
        want = table.filter(pa.array(shard_of(ids, 8) == shard))
        # the shard's rows, in batch order, with their id hash (hashed once, reused after the shuffle)
        assert part.drop_columns([ID_HASH]).equals(want)
        assert np.array_equal(part.column(ID_HASH).to_numpy(), canonical_id_hash(want.column("impression_id")))
        want = want.append_column(ID_HASH, part.column(ID_HASH))
        encoded = coder.encode(part)  # what the shuffle moves: the slice's rows, not the whole batch
        assert coder.decode(encoded).equals(want) and len(encoded) < 2 * len(coder.encode(want))


def test_tables_cross_stages_as_arrow_ipc_not_pickles():
    assert isinstance(beam.coders.registry.get_coder(pa.Table), ArrowTableCoder)
    coder = ArrowTableCoder()
    table = pa.table({"s": pa.array(["a", "b", "a"]).dictionary_encode(), "v": [1.0, 2.0, 3.0]})
    for t in (table, table.slice(1, 2), table.slice(0, 0)):
        assert coder.decode(coder.encode(t)).equals(t)
    assert coder.estimate_size(table) == table.nbytes  # what Beam's counters ask for: no encoding


def core_sums(frame, params, domain=None):
    domain = domain or data_domain(frame, params)
    conv = Conversions.from_table(frame, params.slice_columns, params.query_columns)
    contributions, kept = encode_and_bound(conv, params, SEED)
    sums = aggregate.domain_sums(domain.slice_index(conv.slices), contributions, kept, domain.num_slices,
                                 impressions=len(np.unique(conv.impression_id)))
    # one grouping, encoded as a simulation (SEED): what EncodeBoundAndSum's sums carry
    return dataclasses.replace(sums, grouping="the whole log", simulated=True)


@pytest.mark.parametrize("encoding", ["linf", "baseline"])
def test_encode_bound_and_sum_equals_core(encoding):
    frame = make_frame(3000)
    params = make_params(encoding)
    domain = data_domain(frame, params)
    expected = core_sums(frame, params, domain)
    tables = [pa.Table.from_pandas(frame.iloc[i::3], preserve_index=False) for i in range(3)]

    def check(results):
        (got,) = results
        assert np.array_equal(got.histogram, expected.histogram)
        assert (got.kept, got.capped, got.outside_domain, got.impressions) == \
            (expected.kept, expected.capped, expected.outside_domain, expected.impressions)

    with TestPipeline() as p:
        valid = (p | beam.Create(tables) | ValidateConversions(params.slice_columns, params.query_columns)).valid
        merged = valid | GroupByImpression(5) | EncodeBoundAndSum(params, p | "D" >> beam.Create([domain]), SEED)
        assert_that(merged, check)


def test_noisy_release_equals_core_measure():
    frame = make_frame(3000)
    params = make_params()
    core = measure(Conversions.from_table(frame, params.slice_columns, params.query_columns), params, simulation_seed=SEED)

    def check(results):
        (rel,) = results
        assert np.array_equal(rel.report.unnoised, core.histogram)
        assert np.array_equal(rel.report.noisy, core.report.noisy)
        assert np.allclose(rel.estimates.estimate, core.estimates.estimate)

    with TestPipeline() as p:
        merged = p | "Sums" >> beam.Create([core_sums(frame, params)])
        counts = p | "Counts" >> beam.Create([ValidationCounts(3000, 0)])
        domain = p | "Domain" >> beam.Create([data_domain(frame, params)])
        assert_that(merged | NoisyRelease(params, counts, domain, simulation_seed=SEED), check)


def test_non_global_windowing_is_refused():
    params = make_params()
    with pytest.raises(ValueError, match="global window"):
        with TestPipeline() as p:
            merged = (p | beam.Create([core_sums(make_frame(50), params)])
                      | beam.WindowInto(beam.window.FixedWindows(60)))
            merged | NoisyRelease(params, p | "C" >> beam.Create([ValidationCounts(50, 0)]),
                                  p | "D" >> beam.Create([data_domain(make_frame(50), params)]))


# ---- the whole job -------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("ids", ["int64", "string"])
def test_pipeline_histogram_and_estimates_equal_core_exactly(tmp_path, ids):
    frame = make_frame()
    if ids == "string":
        frame["impression_id"] = "imp-" + frame["impression_id"].astype(str)
    params = make_params()
    code, out = run_measure(tmp_path, frame, params, "a")
    assert code == 0
    core = measure(Conversions.from_table(frame, params.slice_columns, params.query_columns), params, simulation_seed=SEED)
    buckets, unnoised, noise = read_debug(out)
    assert buckets == core.domain.buckets()
    assert np.array_equal(unnoised, core.histogram.ravel())
    assert np.array_equal(noise, core.report.noise.ravel())
    sbuckets, metrics = avro.read_summary_report(rel(out, outputs.SUMMARY_REPORT))
    assert sbuckets == buckets and np.array_equal(metrics, core.report.noisy.ravel())
    assert avro.read_output_domain(rel(out, outputs.OUTPUT_DOMAIN)) == buckets
    est = pd.read_parquet(rel(out, outputs.ESTIMATES_PARQUET))
    assert list(est.columns) == ["campaign", "geo", "query", "estimate", "std_error", "ci_low", "ci_high",
                                 "capped_estimate", "capped_std_error", "bias_corrected"]
    assert not est["bias_corrected"].any() and (est["estimate"] == est["capped_estimate"]).all()  # no calibration
    assert np.allclose(est["estimate"].to_numpy(), core.estimates.estimate.ravel())
    summary = json.loads(open(private(out, outputs.RUN_SUMMARY)).read())
    assert summary["rows_read"] == len(frame) and summary["accounting_closes"]
    assert summary["conversions_kept"] == core.rows_kept and summary["conversions_dropped_by_cap"] == core.rows_capped
    assert summary["parameters"]["sha256"] and summary["simulation"] is True


@pytest.mark.slow
def test_invariant_to_row_order_files_shards_and_running_mode(tmp_path):
    frame = make_frame()
    params = make_params()
    _, ref = run_measure(tmp_path, frame, params, "ref", parts=3)
    reference = avro.read_summary_report(rel(ref, outputs.SUMMARY_REPORT))
    shuffled = frame.sample(frac=1.0, random_state=3).reset_index(drop=True)
    variants = [
        ("shuffled", shuffled, 3, ["--num-shards", "64"]),
        ("files", frame, 7, ["--num-shards", "3"]),
        ("memory-shuffle", shuffled, 3, ["--shuffle", "memory"]),
        ("multiproc", shuffled, 2, ["--direct_running_mode", "multi_processing", "--direct_num_workers", "2"]),
    ]
    for name, data, parts, extra in variants:
        code, out = run_measure(tmp_path, data, params, name, parts=parts, extra=extra)
        assert code == 0
        got = avro.read_summary_report(rel(out, outputs.SUMMARY_REPORT))
        assert got[0] == reference[0] and np.array_equal(got[1], reference[1]), name
    summary = json.loads(open(private(tmp_path / "out-multiproc", outputs.RUN_SUMMARY)).read())
    assert "multi_processing" in summary["runner"]


@pytest.mark.slow
def test_bad_rows_go_to_dead_letter_and_accounting_closes(tmp_path):
    frame = make_frame(3000)
    frame.loc[10, "value"] = -5.0
    frame.loc[11, "value"] = np.nan
    frame.loc[12, "geo"] = None
    frame.loc[13, "items"] = -1
    code, out = run_measure(tmp_path, frame, make_params(), "bad")
    assert code == 0
    dead = pd.read_parquet(private(out, outputs.DEAD_LETTER))
    assert sorted(dead["reason"]) == ["negative_value", "negative_value", "null_slice_value", "null_value"]
    s = json.loads(open(private(out, outputs.RUN_SUMMARY)).read())
    assert s["rows_rejected_by_reason"] == {"negative_value": 2, "null_slice_value": 1, "null_value": 1}
    assert s["rows_read"] == s["conversions_kept"] + s["conversions_dropped_by_cap"] + s["rows_rejected"] \
        + s["conversions_kept_outside_domain"]


@pytest.mark.slow
def test_too_many_bad_rows_fail_before_release(tmp_path, capsys):
    frame = make_frame(500)
    frame.loc[:80, "value"] = -1.0  # 16% rejected > 10%
    code, out = run_measure(tmp_path, frame, make_params(), "toobad")
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    (line,) = [ln for ln in err.splitlines() if ln.startswith("araopt measure: error:")]
    assert "above the 10% threshold" in line
    assert not out.exists()  # nothing released, not even partly
    kept = [p for p in os.listdir(tmp_path) if p.startswith("out-toobad.araopt-failed-")]
    assert len(kept) == 1 and os.listdir(tmp_path / kept[0]) == [outputs.PRIVATE_DIR]
    dead = pd.read_parquet(tmp_path / kept[0] / outputs.PRIVATE_DIR / "dead_letter" / "rejected.parquet")
    assert (dead["reason"] == "negative_value").sum() == 81


@pytest.mark.slow
def test_missing_column_and_bad_epsilon_refused_before_processing(tmp_path, capsys):
    frame = make_frame(100).drop(columns=["items"])
    code, out = run_measure(tmp_path, frame, make_params(), "missing")
    assert code == 2 and "missing required column" in capsys.readouterr().err and not out.exists()
    code, _ = run_measure(tmp_path, make_frame(100), make_params(), "eps", extra=["--epsilon", "65"])
    assert code == 2 and "epsilon" in capsys.readouterr().err


class _FailFirstAttempt(_AddNoise):
    """The noise step fails on its first attempt (marker file), then succeeds when retried."""

    def __init__(self, marker, *args):
        super().__init__(*args)
        self._marker = marker

    def process(self, impulse, merged, counts, domain):
        if not os.path.exists(self._marker):
            open(self._marker, "w").close()
            raise RuntimeError("injected failure on first attempt")
        yield from super().process(impulse, merged, counts, domain)


@pytest.mark.slow
@pytest.mark.parametrize("seeded, shuffle", [(True, "memory"), (False, "memory"), (True, "files")])
def test_failed_step_is_retried_and_noise_is_added_once_per_key(tmp_path, monkeypatch, seeded, shuffle):
    frame = make_frame(2000)
    params = make_params()
    seed = SEED if seeded else None
    marker = str(tmp_path / "attempted")
    monkeypatch.setattr(agg_transforms, "_AddNoise", lambda *a: _FailFirstAttempt(marker, *a))
    data = write_parts(frame, tmp_path / "in", 2)
    folder = RunFolder.prepare(str(tmp_path / "out"), overwrite=False)
    opts = PipelineOptions(["--runner", "BundleBasedDirectRunner"])
    with beam.Pipeline(options=opts) as p:
        build_release(p, check_input(data, params.slice_columns, params.query_columns), ParameterVersion(params),
                      folder, ReleaseJob(data_domain(frame, params).with_origin("declared"),  # as if listed
                                         simulation_seed=seed, debug_run=True,
                                         shuffle_dir=str(tmp_path / "spill") if shuffle == "files" else None))
    assert os.path.exists(marker)  # the first attempt did fail
    buckets, unnoised, noise, _ = avro.read_debug_report(folder.path(outputs.private_file(outputs.DEBUG_REPORT)))
    sb, noisy = avro.read_summary_report(folder.path(outputs.release_file(outputs.SUMMARY_REPORT, seeded)))
    assert len(set(sb)) == len(sb) == len(buckets)  # each key released exactly once
    assert np.array_equal(noisy, unnoised + noise)
    core = measure(Conversions.from_table(frame, params.slice_columns, params.query_columns), params, simulation_seed=SEED)
    if seeded:  # key-deterministic simulation: exactly the core's histogram and noise
        assert np.array_equal(unnoised, core.histogram.ravel())
        assert np.array_equal(noise, core.report.noise.ravel())
    else:  # secure rounding differs per run, but each kept record still adds floor(Gamma / C) per slice
        assert np.array_equal(unnoised.reshape(core.histogram.shape).sum(axis=1), core.histogram.sum(axis=1))


def test_default_local_runner_is_the_fn_api_runner():
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    assert isinstance(make_runner(PipelineOptions([])), fn_runner.FnApiRunner)
    assert make_runner(PipelineOptions(["--runner", "DataflowRunner"])) is None


@pytest.mark.slow
def test_reconstruct_cli_reproduces_the_pipelines_estimates(tmp_path):
    """ARA round trip at pipeline level: `araopt reconstruct` on `araopt measure`'s summary report and
    key map gives the pipeline's estimates.csv exactly; its debug report gives the same."""
    from pipelines.ara import run_reconstruct

    frame = make_frame(3000)
    params = make_params()
    code, out = run_measure(tmp_path, frame, params, "rt")
    assert code == 0
    for i, report in enumerate((rel(out, outputs.SUMMARY_REPORT), private(out, outputs.DEBUG_REPORT))):
        target = tmp_path / f"reconstructed-{i}.csv"
        assert run_reconstruct(["--summary-report", report, "--params", str(tmp_path / "rt.json"),
                                "--key-map", rel(out, outputs.KEY_MAP_JSON), "--out", str(target)]) == 0
        got = pd.read_csv(target)
        want = pd.read_csv(rel(out, outputs.ESTIMATES_CSV))
        pd.testing.assert_frame_equal(got, want)


@pytest.mark.slow
def test_declared_domain_noises_unseen_keys_and_counts_slices_outside_it(tmp_path):
    """--domain: every declared key is released (noise only if unseen); kept conversions of slices
    outside the domain are counted, not silently dropped, and the accounting closes."""
    from araopt import KeyDomain

    frame = make_frame(2000)
    params = make_params()
    declared = {"campaign": np.array([0, 1, 9]), "geo": np.array(["NY", "NY", "LA"])}  # (9, LA) never occurs
    domain = KeyDomain.from_slice_values(params.slice_columns, declared, params.query_columns, origin="declared")
    domain.save(tmp_path / "domain.json", ParameterVersion(params).checksum())
    code, out = run_measure(tmp_path, frame, params, "dom", extra=["--domain", str(tmp_path / "domain.json")])
    assert code == 0
    buckets, unnoised, noise = read_debug(out)
    assert buckets == domain.buckets() and len(buckets) == 3 * 3
    assert (unnoised.reshape(3, 3)[2] == 0).all() and (noise != 0).any()
    in_domain = frame[((frame.campaign == 0) | (frame.campaign == 1)) & (frame.geo == "NY")]
    s = json.loads(open(private(out, outputs.RUN_SUMMARY)).read())
    assert s["conversions_kept_outside_domain"] > 0 and s["accounting_closes"]
    core = measure(Conversions.from_table(frame, params.slice_columns, params.query_columns), params, domain,
                   simulation_seed=SEED)
    assert np.array_equal(unnoised, core.histogram.ravel())
    assert s["conversions_kept"] == core.rows_kept <= len(in_domain)
    assert s["conversions_kept_outside_domain"] == core.rows_outside_domain


@pytest.mark.slow
def test_spilled_shuffle_ignores_files_of_a_failed_attempt(tmp_path, monkeypatch):
    """A spill step that wrote files and then failed is retried; the orphaned files of the failed
    attempt are never read (only committed paths pass the GroupByKey), so counts stay exact."""
    from transforms import group

    frame = make_frame(2000)
    params = make_params()
    marker = tmp_path / "failed-once"
    original = group._SpillByShard.process

    def flaky(self, table):
        outputs = list(original(self, table))  # the files are written ...
        if not marker.exists():
            marker.touch()
            raise RuntimeError("injected failure after spilling")  # ... and then the bundle fails
        yield from outputs

    monkeypatch.setattr(group._SpillByShard, "process", flaky)
    data = write_parts(frame, tmp_path / "in", 1)
    folder = RunFolder.prepare(str(tmp_path / "out"), overwrite=False)
    spill = tmp_path / "spill"
    with beam.Pipeline(options=PipelineOptions(["--runner", "BundleBasedDirectRunner"])) as p:
        build_release(p, check_input(data, params.slice_columns, params.query_columns), ParameterVersion(params),
                      folder, ReleaseJob(data_domain(frame, params), simulation_seed=SEED, debug_run=True,
                                         shuffle_dir=str(spill)))
    assert marker.exists()
    per_shard = [len(files) for root, _, files in os.walk(spill) if files]
    assert per_shard and all(n == 2 for n in per_shard)  # each shard: one orphan of the failed attempt + one read
    _, unnoised, _, _ = avro.read_debug_report(folder.path(outputs.private_file(outputs.DEBUG_REPORT)))
    core = measure(Conversions.from_table(frame, params.slice_columns, params.query_columns), params, simulation_seed=SEED)
    assert np.array_equal(unnoised, core.histogram.ravel())
