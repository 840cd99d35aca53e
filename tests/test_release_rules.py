"""The release rules are properties of the release step itself (``araopt.mechanism.release``), so every
path that releases passes them: the in-memory measure, a graph built from ``transforms/``, the CLI, and
the parameter files of privacy-safe tuning. A domain derived from the data it describes (origin
``data``) is released only in simulation mode; a release's rejected share is gated; a seeded release is
written only as a simulation; a parameter file keeps its domain's origin."""
from __future__ import annotations

import dataclasses
import json

import apache_beam as beam
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from araopt import Conversions, KeyDomain, measure
from araopt.errors import InvalidInput, PrivacyRefusal
from araopt.io.conversions import ValidationCounts, type_family
from araopt.mechanism import aggregate
from araopt.mechanism.keys import DATA, DECLARED, HISTORY
from araopt.mechanism.release import (
    DATA_DERIVED,
    Accounting,
    check_learnt_window,
    noisy_release,
    release_domain,
    with_version_end,
)
from araopt.publication import publish, release_json
from araopt.version import ParameterVersion
from factories import conversions, domain_csv, error_line, make_frame, make_params, params, setup, write
from pipelines import measure as measure_pipeline
from pipelines.optimize import run as optimize
from transforms.aggregate import DomainFromData, EncodeBoundAndSum, NoisyRelease
from transforms.group import GroupByImpression
from transforms.release import WriteRelease
from transforms.validate import ValidateConversions

SEED = 3


def _domain(frame, p, origin):
    return KeyDomain.from_slice_values(p.slice_columns, {c: frame[c].to_numpy() for c in p.slice_columns},
                                       p.query_columns, origin=origin)


def _sums(domain, p):
    return aggregate.empty(domain.num_slices, domain.num_columns)


def _accounting(read=10, rejected=0):
    return Accounting(rows_read=read, rows_rejected=rejected, rows_kept=read - rejected, rows_capped=0,
                      rows_outside_domain=0, impressions=1)


# ---- the release step itself -------------------------------------------------------------------------
def test_the_release_step_refuses_a_data_derived_domain_outside_simulation():
    frame, p = make_frame(200), make_params()
    data = _domain(frame, p, DATA)
    with pytest.raises(PrivacyRefusal, match="derived from the data"):
        noisy_release(_sums(data, p), p, data, _accounting())
    assert noisy_release(_sums(data, p), p, data, _accounting(), simulation_seed=SEED).simulation_seed == SEED
    declared = _domain(frame, p, DECLARED)
    assert noisy_release(_sums(declared, p), p, declared, _accounting()).domain.origin == DECLARED
    learnt = dataclasses.replace(_domain(frame, p, HISTORY), learnt_before_us=0)  # its history ended before
    assert noisy_release(_sums(learnt, p), p, learnt, _accounting()).domain.origin == HISTORY
    with pytest.raises(PrivacyRefusal, match="whose end it does not record"):  # where it ended is unknown
        noisy_release(_sums(learnt, p), p, dataclasses.replace(learnt, learnt_before_us=None), _accounting())


def test_the_release_step_gates_the_rejected_share():
    frame, p = make_frame(200), make_params()
    domain = _domain(frame, p, DECLARED)
    noisy_release(_sums(domain, p), p, domain, _accounting(100, 10))  # exactly 10%: released
    with pytest.raises(PrivacyRefusal, match="failed validation"):
        noisy_release(_sums(domain, p), p, domain, _accounting(100, 11))
    noisy_release(_sums(domain, p), p, domain, _accounting(100, 11), max_rejected_fraction=0.2)


def test_the_release_step_says_which_domain_a_release_is_over():
    """``release_domain``: a given domain before the parameter version's, none (derived from the data)
    only in simulation, a data-derived one only in simulation, the version's slice families checked
    against the input's, and at most ``max_slices`` slices (exactly that many is allowed)."""
    frame, p = make_frame(200), make_params()
    given, carried = _domain(frame, p, DECLARED), _domain(frame, p, HISTORY)
    families = {c: type_family(pa.array(frame[c]).type) for c in p.slice_columns}
    assert release_domain(given, "--domain d.csv", carried, families, None) == (given, "--domain d.csv")
    assert release_domain(None, "--domain", carried, families, None) == (carried, "the parameter version")
    assert release_domain(None, "--domain", None, families, SEED) == (None, DATA_DERIVED)
    with pytest.raises(PrivacyRefusal, match="declared key domain"):
        release_domain(None, "--domain", None, families, None)
    data = _domain(frame, p, DATA)
    with pytest.raises(PrivacyRefusal, match="the domain from --domain k.json was derived from the data"):
        release_domain(data, "--domain k.json", carried, families, None)
    with pytest.raises(PrivacyRefusal, match="the domain from the parameter version was derived from the data"):
        release_domain(None, "--domain", data, families, None)
    assert release_domain(data, "--domain k.json", None, families, SEED) == (data, "--domain k.json")
    other = {c: ("string" if f == "integer" else "integer") for c, f in families.items()}
    with pytest.raises(InvalidInput):
        release_domain(None, "--domain", carried, other, None)
    release_domain(given, "--domain d.csv", carried, other, None)  # a given domain is checked where it is read
    n = given.num_slices
    assert release_domain(given, "--domain d.csv", None, {}, None, n)[0] is given
    with pytest.raises(InvalidInput, match=f"{n:,} slices, more than --max-slices {n - 1:,}"):
        release_domain(given, "--domain d.csv", None, {}, None, n - 1, "--max-slices")


def test_the_in_memory_measure_refuses_a_data_derived_domain_outside_simulation():
    frame, p = make_frame(300), make_params()
    conv = Conversions.from_table(frame, p.slice_columns, p.query_columns)
    with pytest.raises(PrivacyRefusal, match="derived from the data"):
        measure(conv, p, _domain(frame, p, DATA), noise_rng=np.random.default_rng(0))
    with pytest.raises(PrivacyRefusal):  # no domain at all: derived, also with a test generator
        measure(conv, p, noise_rng=np.random.default_rng(0))
    assert measure(conv, p, _domain(frame, p, DECLARED)).domain.origin == DECLARED
    assert measure(conv, p, simulation_seed=SEED).domain.origin == DATA


def _tables(frame):
    return [pa.Table.from_pandas(frame.iloc[i::2], preserve_index=False) for i in range(2)]


def test_a_graph_built_from_transforms_refuses_a_data_derived_domain_outside_simulation():
    """validate -> group -> DomainFromData -> encode, cap, sum -> NoisyRelease, wired by hand (no CLI):
    without a simulation seed the release step refuses; with one it releases."""
    frame, p = make_frame(600), make_params()

    def graph(seed):
        with TestPipeline() as pipe:
            validated = pipe | beam.Create(_tables(frame)) | ValidateConversions(p.slice_columns, p.query_columns)
            domain = validated.valid | DomainFromData(p, 1000)
            grouped = validated.valid | GroupByImpression(4)
            counts = validated.counts | "Counts" >> beam.CombineGlobally(ValidationCounts.merge)
            released = (grouped | EncodeBoundAndSum(p, domain, seed)
                        | NoisyRelease(p, counts, domain, simulation_seed=seed))
            released | beam.Map(lambda r: r.domain.origin)

    with pytest.raises(Exception, match="derived from the data"):
        graph(None)
    graph(SEED)


def _hand_wired(pipe, tables, frame, p, origin):
    """A hand-wired graph's start: the batches validated, a domain of ``origin``, the counts."""
    validated = pipe | beam.Create(tables) | ValidateConversions(p.slice_columns, p.query_columns)
    domain = pipe | "Domain" >> beam.Create([_domain(frame, p, origin)])
    counts = validated.counts | "Counts" >> beam.CombineGlobally(ValidationCounts.merge)
    return validated.valid, domain, counts


def test_a_graph_built_from_transforms_refuses_a_declared_looking_data_domain():
    """The rule reads the domain's origin, not which transform made it: a data-derived key map given as
    the declared domain of a hand-built graph is refused too."""
    frame, p = make_frame(600), make_params()
    with pytest.raises(Exception, match="derived from the data"):
        with TestPipeline() as pipe:
            valid, domain, counts = _hand_wired(pipe, _tables(frame), frame, p, DATA)
            _ = valid | GroupByImpression(4) | EncodeBoundAndSum(p, domain) | NoisyRelease(p, counts, domain)


def test_a_seeded_release_is_written_only_as_a_simulation(tmp_path):
    frame, p = make_frame(300), make_params()
    conv = Conversions.from_table(frame, p.slice_columns, p.query_columns)
    seeded = publish(measure(conv, p, _domain(frame, p, DECLARED), simulation_seed=SEED).release,
                     ParameterVersion(p))
    secure = publish(measure(conv, p, _domain(frame, p, DECLARED)).release, ParameterVersion(p))
    for publication, simulation in ((seeded, False), (secure, True)):
        with pytest.raises(Exception, match="simulation"):
            with TestPipeline() as pipe:
                _ = pipe | beam.Create([publication]) | WriteRelease(str(tmp_path / "out"), "0" * 64,
                                                                     simulation=simulation)


def test_a_release_noised_by_a_callers_generator_is_neither_a_release_nor_a_simulation(tmp_path):
    """The in-memory API takes a caller's generator (``noise_rng``, for tests): its noise is seeded
    without the simulation flag. Such a release says it is not differentially private and is written
    neither as a release nor as a simulation (before, release.json said differentially_private and
    WriteRelease wrote it as a release)."""
    frame, p = make_frame(300), make_params()
    conv = Conversions.from_table(frame, p.slice_columns, p.query_columns)
    release = measure(conv, p, _domain(frame, p, DECLARED), noise_rng=np.random.default_rng(0)).release
    assert release.simulation_seed is None and not release.secure_noise
    publication = publish(release, ParameterVersion(p))
    assert release_json(publication, "0" * 64)["differentially_private"] is False
    secure = measure(conv, p, _domain(frame, p, DECLARED)).release
    assert secure.secure_noise and release_json(publish(secure, ParameterVersion(p)), "0" * 64)["differentially_private"]
    for simulation in (False, True):
        with pytest.raises(Exception, match="generator"):
            with TestPipeline() as pipe:
                _ = pipe | beam.Create([publication]) | WriteRelease(str(tmp_path / f"out{simulation}"), "0" * 64,
                                                                     simulation=simulation)


# ---- parameter files keep their domain's origin --------------------------------------------------------
# ---- a history domain is never released over its own history ----------------------------------------
def _learnt(frame, p, before_us):
    return dataclasses.replace(_domain(frame, p, HISTORY), learnt_before_us=int(before_us))


def test_a_history_domain_is_released_only_over_conversions_after_the_history_it_lists():
    """A domain of origin ``history`` lists the slices of the training history; released over that
    history's own conversions, one row of the released data would decide a published key (red team,
    round thirteen: optimize then measure of one log released a campaign's only conversion's key). The
    encode step refuses outside simulation a released conversion before the history's end, or a
    history domain that does not say where its history ended."""
    frame, p = make_frame(300), make_params()
    conv = Conversions.from_table(frame, p.slice_columns, p.query_columns)
    first = int(conv.conversion_time.min())
    with pytest.raises(PrivacyRefusal, match="training history whose last conversion"):
        measure(conv, p, _learnt(frame, p, first + 1))  # the first conversion is in the history
    assert measure(conv, p, _learnt(frame, p, first)).domain.origin == HISTORY  # every one from its end on
    assert measure(conv, p, _learnt(frame, p, first + 1), simulation_seed=SEED).release.simulation_seed == SEED
    with pytest.raises(PrivacyRefusal, match="does not record"):
        measure(conv, p, _domain(frame, p, HISTORY))
    assert measure(conv, p, _domain(frame, p, DECLARED)).domain.origin == DECLARED  # declared: no window


def test_lookback_rows_before_the_history_end_are_not_released_so_they_pass():
    """Only the period's conversions are released: an impression's earlier conversions (the lookback,
    which only spend budget) may lie in the history the domain was learnt on."""
    from araopt.io.conversions import concat_periods
    from araopt.mechanism.lifetime import ReleaseHistory

    frame, p = make_frame(300), make_params()
    conv = Conversions.from_table(frame, p.slice_columns, p.query_columns)
    cut = int(np.sort(conv.conversion_time)[len(conv) // 2])  # the first released conversion's time
    early = conv.conversion_time < cut
    both = concat_periods(conv.take(np.flatnonzero(~early)), conv.take(np.flatnonzero(early)))
    released = measure(both, p, _learnt(frame, p, cut), history=ReleaseHistory.of([]))
    assert released.release.accounting.rows_read == int((~early).sum())
    with pytest.raises(PrivacyRefusal, match="training history whose last conversion"):
        measure(both, p, _learnt(frame, p, cut + 1), history=ReleaseHistory.of([]))


def test_a_graph_built_from_transforms_refuses_a_history_domain_over_its_own_history():
    frame, p = make_frame(600), make_params()
    last = int(pd.to_datetime(frame["conversion_time"]).max().value // 1000)
    with pytest.raises(Exception, match="training history whose last conversion"):
        with TestPipeline() as pipe:
            valid, _, counts = _hand_wired(pipe, _tables(frame), frame, p, DECLARED)
            domain = pipe | "Learnt" >> beam.Create([_learnt(frame, p, last + 1)])
            _ = valid | GroupByImpression(4) | EncodeBoundAndSum(p, domain) | NoisyRelease(p, counts, domain)


def test_a_version_learnt_on_a_history_releases_none_of_it_over_any_domain():
    """A version's count limit and clips were read from its training history: released with them, that
    history would be released with parameters read from itself (a clip at one order's value), whatever
    the domain (red team, round sixteen: a declared --domain with the learnt version released the
    training log). The version's end applies to a declared domain too, outside simulation."""
    frame, p = make_frame(300), make_params()
    conv = Conversions.from_table(frame, p.slice_columns, p.query_columns)
    first = int(conv.conversion_time.min())
    for origin in (DECLARED, DATA):
        learnt = dataclasses.replace(_domain(frame, p, origin), learnt_before_us=first + 1)
        with pytest.raises(PrivacyRefusal, match="was learnt on a training history whose last conversion"):
            check_learnt_window(learnt, conv.conversion_time, simulation=False)
        check_learnt_window(learnt, conv.conversion_time, simulation=True)
        check_learnt_window(dataclasses.replace(learnt, learnt_before_us=first), conv.conversion_time, False)
    with pytest.raises(PrivacyRefusal, match="was learnt on a training history"):
        measure(conv, p, dataclasses.replace(_domain(frame, p, DECLARED), learnt_before_us=first + 1))
    assert measure(conv, p, dataclasses.replace(_domain(frame, p, DECLARED), learnt_before_us=first)).release


def test_release_domain_gives_a_declared_domain_its_versions_end():
    """``with_version_end`` (``release_domain``, the graph builder, export-ara): a declared domain given
    with a learnt version takes the later of the two ends; a published history key map of the version's
    layout takes the version's; a history key map of another layout keeps none (refused over any
    conversions); a version that records no end changes nothing."""
    frame, p = make_frame(300), make_params()
    families = {c: type_family(pa.array(frame[c]).type) for c in p.slice_columns}
    carried = _learnt(frame, p, 5_000)
    declared = _domain(frame, p, DECLARED)
    domain, _ = release_domain(declared, "--domain d.csv", carried, families, None)
    assert domain.origin == DECLARED and domain.learnt_before_us == 5_000
    assert with_version_end(dataclasses.replace(declared, learnt_before_us=9_000), carried).learnt_before_us == 9_000
    assert with_version_end(dataclasses.replace(declared, learnt_before_us=10), carried).learnt_before_us == 5_000
    assert with_version_end(_domain(frame, p, HISTORY), carried).learnt_before_us == 5_000
    other = _domain(frame.assign(geo=frame["geo"] + "x"), p, HISTORY)
    assert other != carried and with_version_end(other, carried).learnt_before_us is None
    assert with_version_end(declared, _domain(frame, p, HISTORY)).learnt_before_us is None
    assert with_version_end(declared, None).learnt_before_us is None


def test_a_graph_built_with_a_learnt_version_refuses_its_history_over_a_declared_domain(tmp_path):
    """The job builder (``transforms.measure.build_release``, what measure runs and what a graph built
    from ``transforms/`` can call) gives a declared domain its version's end before any release step."""
    from araopt.io.run_folder import RunFolder
    from transforms.io import check_input
    from transforms.measure import ReleaseJob, build_release

    frame, p = make_frame(600), make_params()
    data = write(frame, str(tmp_path / "log" / "part-0.parquet"))
    last = int(pd.to_datetime(frame["conversion_time"]).max().value // 1000)
    version = ParameterVersion(p, domain=_learnt(frame, p, last + 1))
    folder = RunFolder.prepare(str(tmp_path / "out"), overwrite=False)
    with pytest.raises(Exception, match="was learnt on a training history"):
        with TestPipeline() as pipe:
            build_release(pipe, check_input(data, p.slice_columns, p.query_columns), version, folder,
                          ReleaseJob(domain=_domain(frame, p, DECLARED)))


def test_the_release_step_checks_the_training_window_of_sums_built_by_hand():
    """The encode step is not the only guard: sums wired by hand from the package's functions
    (``encode_and_bound`` -> ``aggregate.domain_sums`` -> ``release_step``) record their earliest period
    conversion (``DomainSums.first_time_us``), the release step checks it against the domain's window,
    and sums that do not record it are refused over a domain with one (red team, round seventeen: such
    a graph released the training log over its history domain). Merging keeps the earliest."""
    from araopt.mechanism.aggregate import NO_CONVERSION, domain_sums, merge
    from araopt.mechanism.measure import encode_and_bound, histogram_rows
    from araopt.mechanism.release import release_step

    frame, p = make_frame(300), make_params()
    conv = Conversions.from_table(frame, p.slice_columns, p.query_columns)
    first = int(conv.conversion_time.min())
    learnt = _learnt(frame, p, first + 1)
    contributions, kept = encode_and_bound(conv, p)
    rows = histogram_rows(conv, p, learnt)

    def sums(times):
        return domain_sums(rows, contributions, kept, learnt.num_slices, conversion_time=times)

    counts = ValidationCounts(len(conv))
    with pytest.raises(PrivacyRefusal, match="do not record their earliest conversion"):
        release_step(sums(None), counts, p, learnt)
    with pytest.raises(PrivacyRefusal, match="training history whose last conversion"):
        release_step(sums(conv.conversion_time), counts, p, learnt)
    assert sums(conv.conversion_time).first_time_us == first
    assert merge([sums(conv.conversion_time + 5), sums(conv.conversion_time)]).first_time_us == first
    assert merge([sums(None), sums(conv.conversion_time)]).first_time_us is None
    assert release_step(sums(conv.conversion_time), counts, p, _learnt(frame, p, first)).secure_noise
    assert release_step(sums(None), counts, p, _domain(frame, p, DECLARED)).secure_noise  # no window to check
    none = dataclasses.replace(sums(conv.conversion_time), first_time_us=NO_CONVERSION)  # sums of no period row
    assert release_step(none, counts, p, learnt).secure_noise
    assert aggregate.empty(2, 3).first_time_us == NO_CONVERSION


def test_the_release_workflow_gives_a_declared_domain_its_versions_end():
    """``release_workflow.release_and_publish`` takes the whole version: a declared domain gets its end
    (red team, round seventeen: it released the training log over a declared domain)."""
    from araopt.release_workflow import InMemoryReleaseBackend, ReleaseSpec, release_and_publish

    frame, p = make_frame(300), make_params()
    conv = Conversions.from_table(frame, p.slice_columns, p.query_columns)
    first = int(conv.conversion_time.min())
    version = ParameterVersion(p, domain=_learnt(frame, p, first + 1))
    with pytest.raises(PrivacyRefusal, match="was learnt on a training history"):
        release_and_publish(InMemoryReleaseBackend(conv), ReleaseSpec(version), _domain(frame, p, DECLARED))
    earlier = ParameterVersion(p, domain=_learnt(frame, p, first))
    assert release_and_publish(InMemoryReleaseBackend(conv), ReleaseSpec(earlier), _domain(frame, p, DECLARED))


def test_a_history_domain_keeps_where_its_history_ended_in_files_and_key_maps():
    frame, p = make_frame(300), make_params()
    learnt = _domain(frame, p, HISTORY).learnt_before(1_767_312_000_000_005)  # its last conversion, exactly
    assert learnt.learnt_before_us == 1_767_312_000_000_006
    version = ParameterVersion(p, domain=learnt)  # the operator-private version keeps it
    assert ParameterVersion.from_bytes(version.to_bytes()).domain.learnt_before_us == learnt.learnt_before_us
    # a published key map does not (a time read from the data, red team round fourteen): read back, its end is
    # unknown, so it is refused over any conversions unless the version it came from gives its end
    published = KeyDomain.from_json(learnt.to_json("0" * 64))
    assert "learnt_before_us" not in learnt.to_json("0" * 64) and published.learnt_before_us is None
    assert published.origin == HISTORY
    assert "learnt_before_us" not in ParameterVersion(p, domain=_domain(frame, p, HISTORY)).to_json()["domain"]
    with pytest.raises(InvalidInput, match="learnt_before_us"):
        dataclasses.replace(learnt, learnt_before_us="2026-01-03")


def test_parameter_files_keep_their_domains_origin():
    frame, p = make_frame(300), make_params()
    for origin in (DATA, DECLARED, HISTORY):
        version = ParameterVersion(p, domain=_domain(frame, p, origin))
        assert ParameterVersion.from_bytes(version.to_bytes()).domain.origin == origin
    history = ParameterVersion(p, domain=_domain(frame, p, HISTORY))
    assert "origin" not in history.to_json()["domain"]  # the default: joined tuning's files keep their bytes


def test_a_parameter_file_written_before_origins_were_kept_loads_as_history():
    frame, p = make_frame(300), make_params()
    raw = ParameterVersion(p, domain=_domain(frame, p, DECLARED)).to_json()
    raw["domain"].pop("origin")
    assert ParameterVersion.from_json(raw).domain.origin == HISTORY
    raw["domain"]["origin"] = "somewhere"
    with pytest.raises(ValueError, match="origin"):
        ParameterVersion.from_json(raw)


@pytest.mark.slow
def test_measure_refuses_parameters_whose_domain_was_derived_from_the_data(tmp_path, capsys):
    frame = conversions()
    data, params_path = setup(tmp_path)
    p = params()
    ParameterVersion(p, domain=_domain(frame, p, DATA)).save(params_path)
    out = tmp_path / "out"
    assert measure_pipeline.run(["--input", data, "--params", params_path, "--output", str(out), "--ledger",
                                 str(tmp_path / "ledger"), "--no-progress"]) == 2
    assert "derived from a conversion log" in error_line(capsys.readouterr().err)
    assert not out.exists()


@pytest.mark.slow
def test_measure_refuses_a_version_learnt_on_the_log_it_would_release(tmp_path, capsys):
    """optimize on a log, then measure of the same log (red team, round thirteen: a campaign's only
    conversion decided whether its key was published): refused in one line, nothing written; the next
    day's log is released over the same version."""
    frame = conversions()
    data, _ = setup(tmp_path, frame)
    learnt = tmp_path / "learnt.json"
    assert optimize(["--history", data, "--slices", "s", "--values", "v", "--epsilon", "4", "--max-count-limit",
                     "3", "--output", str(learnt), "--no-progress"]) == 0
    last = int(pd.to_datetime(frame["conversion_time"]).max().value // 1000)
    assert ParameterVersion.load(learnt).domain.learnt_before_us == last + 1
    ledger = str(tmp_path / "ledger")
    out = tmp_path / "out"
    assert measure_pipeline.run(["--input", data, "--params", str(learnt), "--output", str(out), "--ledger", ledger,
                                 "--no-progress"]) == 2
    assert "training history whose last conversion is at 2026-11-20T23" in error_line(capsys.readouterr().err)
    assert not out.exists()
    later = frame.assign(conversion_time=frame["conversion_time"] + pd.Timedelta(days=1))
    write(later, str(tmp_path / "next" / "part-0.parquet"))
    assert measure_pipeline.run(["--input", str(tmp_path / "next"), "--params", str(learnt), "--output", str(out),
                                 "--ledger", ledger, "--no-progress"]) == 0, capsys.readouterr().err
    assert "the keys are the parameter version's training slices" in capsys.readouterr().out  # what it discloses
    key_map = out / "release" / "key_map.json"  # published: its origin, not the data's last time
    assert json.load(open(key_map))["origin"] == HISTORY and "learnt_before_us" not in json.load(open(key_map))
    # read back as --domain with its version, the version's end applies: the training log is still refused,
    # with another version (or none recording it) a history key map is refused over any conversions
    assert measure_pipeline.run(["--input", data, "--params", str(learnt), "--output", str(tmp_path / "again"),
                                 "--ledger", str(tmp_path / "ledger3"), "--domain", str(key_map), "--no-progress"]) == 2
    assert "training history whose last conversion" in error_line(capsys.readouterr().err)
    other = tmp_path / "other.json"
    wider = pd.concat([later, later.head(1).assign(s="z")])  # another history's slices, which ended long ago
    ParameterVersion(params(), domain=_learnt(wider, params(), 0)).save(other)
    assert measure_pipeline.run(["--input", str(tmp_path / "next"), "--params", str(other), "--output",
                                 str(tmp_path / "other-out"), "--ledger", str(tmp_path / "ledger2"), "--domain",
                                 str(key_map), "--no-progress"]) == 2
    assert "whose end it does not record" in error_line(capsys.readouterr().err)
    # a declared list of slices: the version's count limit and clips were read from the training log (red team,
    # round sixteen), so its end applies over any domain
    assert measure_pipeline.run(["--input", data, "--params", str(learnt), "--output", str(tmp_path / "declared"),
                                 "--ledger", str(tmp_path / "ledger4"), "--domain",
                                 domain_csv(tmp_path, sorted(frame["s"].unique())), "--no-progress"]) == 2
    assert "was learnt on a training history whose last conversion" in error_line(capsys.readouterr().err)
    assert not (tmp_path / "declared").exists()


# ---- privacy-safe tuning takes a declared domain only ---------------------------------------------------
def _first_party(tmp_path):
    frame = conversions(n=300)
    return write(frame[["conversion_time", "v"]], str(tmp_path / "fp" / "date=2026-11-20" / "part-0.parquet"))


def _data_key_map(tmp_path, origin=DATA):
    frame, p = conversions(), params()
    path = tmp_path / "key_map.json"
    path.write_text(json.dumps(_domain(frame, p, origin).to_json("0" * 64)))
    return str(path)


@pytest.mark.parametrize("origin, why", [(DATA, "derived from a conversion log"),
                                         (HISTORY, "a joined parameter version's training slices")])
def test_optimize_private_refuses_a_key_map_derived_from_the_data(tmp_path, capsys, monkeypatch, origin, why):
    """A key map of origin data, or history (a joined version's training slices, which a published key map
    carries without where that history ended: the version could never release, red team round fifteen),
    is no declared domain for privacy-safe tuning."""
    monkeypatch.setenv("ARAOPT_LEDGER", str(tmp_path / "ledger"))
    _first_party(tmp_path)
    out = tmp_path / "p.json"
    code = optimize(["--private", "--releases", str(tmp_path / "releases"), "--first-party", str(tmp_path / "fp"),
                     "--domain", _data_key_map(tmp_path, origin), "--slices", "s", "--values", "v", "--epsilon", "8",
                     "--output", str(out), "--no-progress"])
    assert code == 2
    assert why in error_line(capsys.readouterr().err, "araopt optimize")
    assert not out.exists()


def test_nightly_private_refuses_a_key_map_derived_from_the_data(tmp_path, capsys):
    from pipelines.nightly import run as nightly

    _first_party(tmp_path)
    code = nightly(["--private", "--releases", str(tmp_path / "releases"), "--first-party", str(tmp_path / "fp"),
                    "--domain", _data_key_map(tmp_path), "--slices", "s", "--values", "v", "--epsilon", "8",
                    "--as-of", "2026-11-20", "--window-days", "3", "--store", str(tmp_path / "store"),
                    "--no-progress"])
    assert code == 2
    assert "derived from a conversion log" in error_line(capsys.readouterr().err, "araopt nightly")
    assert not (tmp_path / "store" / "latest").exists()


def test_a_declared_key_map_gives_a_version_that_keeps_its_origin(tmp_path, monkeypatch):
    monkeypatch.setenv("ARAOPT_LEDGER", str(tmp_path / "ledger"))
    _first_party(tmp_path)
    frame, p = conversions(), params()
    key_map = tmp_path / "declared.json"
    key_map.write_text(json.dumps(_domain(frame, p, DECLARED).to_json("0" * 64)))
    out = tmp_path / "p.json"
    assert optimize(["--private", "--releases", str(tmp_path / "releases"), "--first-party", str(tmp_path / "fp"),
                     "--domain", str(key_map), "--slices", "s", "--values", "v", "--epsilon", "8", "--output",
                     str(out), "--no-progress"]) == 0
    assert ParameterVersion.load(out).domain.origin == DECLARED


def test_a_release_says_which_queries_it_holds_no_signal_for():
    """A value query left a few budget units (Alg. 5 may do so where it judges a query unmeasurable at
    its epsilon) is noise over the whole domain: its noised estimates summed over the slices are within
    ``SIGNAL_SDS`` standard errors of 0. release.json and the operator's console say so (a
    post-processing of published numbers); with its budget the same query is measured."""
    from araopt.mechanism.params import QueryParams
    from araopt.publication import private_accounting
    from araopt.release_summary import summary_lines

    frame = make_frame(3000)
    p = make_params()
    conv = Conversions.from_table(frame, p.slice_columns, p.query_columns)
    domain = _domain(frame, p, DECLARED)
    measured = publish(measure(conv, p, domain, simulation_seed=1).release, ParameterVersion(p))
    assert release_json(measured, "0" * 64)["queries_without_signal"] == []
    starved = dataclasses.replace(p, queries=(QueryParams("value", 20.0, 3 / 65_536),
                                              QueryParams("items", 3.0, 1 - 3 / 65_536)))
    publication = publish(measure(conv, starved, domain, simulation_seed=1).release, ParameterVersion(starved))
    assert release_json(publication, "0" * 64)["queries_without_signal"] == ["value"]
    accounting = private_accounting(publication)
    assert accounting["queries_without_signal"] == ["value"]
    summary = {**accounting, "epsilon": starved.epsilon, "wall_time_s": 1.0, "domain": "declared",
               "rows_read": len(frame), "rows_rejected": 0, "rows_rejected_by_reason": {}}
    notes = [line for line in summary_lines(summary, "out", True) if "no signal" in line]
    assert len(notes) == 1 and "for value:" in notes[0]


def test_the_tuner_predicts_the_queries_a_release_will_hold_no_signal_for():
    """``error_model.predicted_without_signal`` is the release's rule before the release: on the same
    conversions, the starved value query is predicted silent and the release lists it; funded, neither
    lists it. The prediction is what ``optimize --private`` and ``nightly --private`` print."""
    from araopt.mechanism.params import QueryParams
    from araopt.optimize.error_model import expected_error, predicted_without_signal

    frame = make_frame(3000)
    p = make_params()
    conv = Conversions.from_table(frame, p.slice_columns, p.query_columns)
    domain = _domain(frame, p, DECLARED)
    starved = dataclasses.replace(p, queries=(QueryParams("value", 20.0, 3 / 65_536),
                                              QueryParams("items", 3.0, 1 - 3 / 65_536)))
    for tuned, silent in ((p, []), (starved, ["value"])):
        index = domain.slice_index(conv.slices)
        predicted = predicted_without_signal(expected_error(conv, index, domain.num_slices, tuned), tuned)
        released = release_json(publish(measure(conv, tuned, domain, simulation_seed=1).release,
                                        ParameterVersion(tuned)), "0" * 64)["queries_without_signal"]
        assert predicted == released == silent


def test_a_graph_that_flattens_two_merged_sums_is_refused_before_any_noise():
    """Noise exactly once per key: two encode-and-sum branches flattened into one ``NoisyRelease`` would
    noise every key twice (their average halves the noise); the release step takes one element only."""
    frame, p = make_frame(600), make_params()
    with pytest.raises(Exception, match="noises one merged element .*got 2"):
        with TestPipeline() as pipe:
            valid, domain, counts = _hand_wired(pipe, _tables(frame), frame, p, DECLARED)
            grouped = valid | GroupByImpression(4)
            twice = (grouped | "A" >> EncodeBoundAndSum(p, domain), grouped | "B" >> EncodeBoundAndSum(p, domain))
            _ = twice | beam.Flatten() | NoisyRelease(p, counts, domain)


def test_a_writer_given_two_publications_writes_nothing(tmp_path):
    """A release folder holds one release: two publications (two noisings of the same keys) flattened into
    one ``WriteRelease`` are refused before a record is written."""
    frame, p = make_frame(300), make_params()
    conv = Conversions.from_table(frame, p.slice_columns, p.query_columns)
    domain = _domain(frame, p, DECLARED)
    pair = [publish(measure(conv, p, domain).release, ParameterVersion(p)) for _ in range(2)]
    out = tmp_path / "out"
    with pytest.raises(Exception, match="exactly one release, got 2"):
        with TestPipeline() as pipe:
            _ = pipe | beam.Create(pair) | WriteRelease(str(out), "0" * 64)
    assert not out.exists() or not any(f.is_file() and f.stat().st_size for f in out.rglob("*"))
    with TestPipeline() as pipe:  # one is written
        _ = pipe | beam.Create(pair[:1]) | WriteRelease(str(out), "0" * 64)
    assert any(out.rglob("*.avro"))


def test_lookback_rows_without_a_release_history_are_refused_outside_simulation():
    """Alg. 1 over an impression's life costs each lookback row at the configuration of the release that
    used it (``mechanism.lifetime``). Without a history a graph or an in-memory call would cost them at
    today's parameters, under an earlier release at a lower count limit (a red team's hand-wired graph
    kept 109,226 > 65,536 for an impression): a release (no seed) refuses; a declared empty history or a
    simulation releases."""
    from araopt.mechanism.lifetime import ReleaseHistory

    frame, p = make_frame(300), make_params()
    conv = Conversions.from_table(frame, p.slice_columns, p.query_columns)
    conv = conv.with_in_period(np.arange(len(conv)) % 3 != 0)
    domain = _domain(frame, p, DECLARED)
    with pytest.raises(PrivacyRefusal, match="lookback rows are costed by the releases that used them"):
        measure(conv, p, domain)
    assert measure(conv, p, domain, history=ReleaseHistory.of([])).release.accounting.rows_read > 0
    assert measure(conv, p, domain, simulation_seed=SEED).release.simulation_seed == SEED


def test_sums_encoded_as_a_simulation_are_noised_only_as_one():
    """The lookback's history is waived only in simulation: a graph whose encode step had a seed and whose
    noise step had none would release secure-noised sums whose lookback was costed at today's parameters
    (a red team's graph did, to release/ with differentially_private true). The sums say how they were
    encoded; the release step refuses the other mode, either way round, on every path."""
    from araopt.mechanism.lifetime import ReleaseHistory
    from araopt.mechanism.measure import shard_sums
    from araopt.mechanism.release import release_step

    frame, p = make_frame(300), make_params()
    conv = Conversions.from_table(frame, p.slice_columns, p.query_columns)
    conv = conv.with_in_period(np.arange(len(conv)) % 3 != 0)
    domain = _domain(frame, p, DECLARED)
    simulated = shard_sums(conv, p, domain, simulation_seed=SEED)
    assert simulated.simulated and simulated.lookback_rows > 0
    counts, lookback = ValidationCounts(simulated.rows), ValidationCounts(simulated.lookback_rows)
    with pytest.raises(PrivacyRefusal, match="one simulation or one release"):
        release_step(simulated, counts, p, domain, lookback_counts=lookback)
    made = release_step(simulated, counts, p, domain, simulation_seed=SEED, lookback_counts=lookback)
    assert made.simulation_seed == SEED
    secure = shard_sums(conv, p, domain, history=ReleaseHistory.of([]))
    assert not secure.simulated
    with pytest.raises(PrivacyRefusal, match="one simulation or one release"):
        release_step(secure, counts, p, domain, simulation_seed=SEED, lookback_counts=lookback)
    with pytest.raises(PrivacyRefusal, match="a simulation with a release"):
        aggregate.merge([simulated, secure])
    with pytest.raises(Exception, match="one simulation or one release"):
        with TestPipeline() as pipe:
            valid, domain_pc, counts_pc = _hand_wired(pipe, _tables(frame), frame, p, DECLARED)
            _ = (valid | GroupByImpression(4) | EncodeBoundAndSum(p, domain_pc, simulation_seed=SEED)
                 | NoisyRelease(p, counts_pc, domain_pc))


@pytest.mark.parametrize("keyed", ["all at key 0", "by batch"])
def test_shards_that_are_not_grouped_by_impression_are_refused(keyed):
    """Alg. 1 caps an impression within its shard: batches fed to ``EncodeBoundAndSum`` without
    ``GroupByImpression`` split an impression's conversions over elements, each keeping up to the whole
    budget (a red team's graph kept 131,072 for 17 impressions). Refused whether the batches share a key
    or each has its own; grouped shards release."""
    frame, p = make_frame(600), make_params()

    tables = [pa.Table.from_pandas(part, preserve_index=False) for part in (frame.iloc[:250], frame.iloc[250:])]

    def graph(group):
        with TestPipeline() as pipe:
            valid, domain, counts = _hand_wired(pipe, tables, frame, p, DECLARED)
            shards = group(valid)
            released = shards | EncodeBoundAndSum(p, domain) | NoisyRelease(p, counts, domain)
            assert_that(released | beam.Map(lambda r: r.accounting.rows_read), equal_to([len(frame)]))

    ungrouped = (beam.Map(lambda t: (0, t)) if keyed == "all at key 0" else
                 beam.Map(lambda t: (int(t.num_rows > 250), t)))  # each batch its own key
    with pytest.raises(Exception, match="a shard must hold all of an impression's conversions"):
        graph(lambda valid: valid | ungrouped)
    graph(lambda valid: valid | GroupByImpression(4))


def test_sums_of_two_encode_and_sum_steps_are_not_merged_into_one_release():
    """Each half of the rows grouped and capped on its own, then merged with the library's own combiner into
    one element: an impression with rows in both halves would keep its budget once in each (a red team's
    graph doubled every impression's total). Sums carry the grouping they were capped within; two do not merge."""
    from transforms.combine import CombinerFn

    frame, p = make_frame(600), make_params()
    with pytest.raises(Exception, match="capped in 2 groupings by impression"):
        with TestPipeline() as pipe:
            valid, domain, counts = _hand_wired(pipe, _tables(frame), frame, p, DECLARED)
            halves = [valid | f"Half{i}" >> beam.Map(lambda t, i=i: t.slice(0, t.num_rows // 2) if i else
                                                     t.slice(t.num_rows // 2)) for i in range(2)]
            encode = EncodeBoundAndSum(p, domain)  # one transform applied to each half: still two groupings
            sums = [h | f"Group{i}" >> GroupByImpression(4) | f"Encode{i}" >> encode for i, h in enumerate(halves)]
            merged = tuple(sums) | beam.Flatten() | beam.CombineGlobally(CombinerFn(aggregate.DomainSumsCombiner()))
            _ = merged | NoisyRelease(p, counts, domain)
    one = aggregate.empty(2, 2)
    assert aggregate.merge([one, one]).grouping is None  # one grouping (in memory) merges


@pytest.mark.parametrize("key", [-1, 2**64, "0", True])
def test_a_shard_key_that_is_no_shard_number_is_refused_in_one_line(key):
    from transforms.aggregate import shard_modulus

    with pytest.raises(PrivacyRefusal, match="shard number"):
        shard_modulus((key, pa.table({"impression_id": [1]})))


def test_sums_capped_outside_encode_and_sum_are_not_released():
    """A hand-made ParDo calling ``shard_sums`` on each half of the rows (its shards unchecked, no grouping):
    merged into one element its sums keep an impression's budget once per half (a red team's graph kept 337
    rows where the release keeps 179). ``NoisyRelease`` releases only ``EncodeBoundAndSum``'s sums."""
    from araopt.mechanism.measure import shard_sums
    from transforms.combine import CombinerFn

    frame, p = make_frame(600), make_params()

    def capped(item, domain):
        return shard_sums(Conversions.from_table(item[1], p.slice_columns, p.query_columns, categorical_slices=True),
                          p, domain)

    with pytest.raises(Exception, match="releases the sums of EncodeBoundAndSum only"):
        with TestPipeline() as pipe:
            valid, domain, counts = _hand_wired(pipe, _tables(frame), frame, p, DECLARED)
            sums = (valid | GroupByImpression(4) | beam.Map(capped, beam.pvalue.AsSingleton(domain))
                    | beam.CombineGlobally(CombinerFn(aggregate.DomainSumsCombiner())))
            _ = sums | NoisyRelease(p, counts, domain)
