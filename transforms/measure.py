"""``measure``'s Beam job, one builder (``build_release``) for either target: what differs is the
target's description (``araopt.targets.Target``: what Alg. 1 groups by and where, the Attribution
columns' rules, how the lookback's held releases are told) and its release step (``RELEASE_STEPS``:
the encoder, the budget and the noise, as composite transforms), built into a run folder's staging
location: the release workflow's steps.

Common: Parquet files -> validate (dead letter) -> the released rows' ids for the ledger (with a
lookback: the period's rows; the lookback's, to refuse a lookback holding the period's own rows; the
earlier releases it held) -> the target's release step -> its files.

ARA: Parquet files -> validate (dead letter) -> shard by hash(impression_id)
-> GroupByKey -> per shard: impression-side slices constant (else dead letter), sort, encode, cap
(Alg. 1), per-key sums over the domain -> CombineGlobally (integer) -> the release step (noise once per
domain key, Alg. 2; reconstruct, Alg. 4) -> the publication -> Avro / Parquet / CSV / JSON; beside it,
the released rows' ids for the ledger (and the lookback's, to refuse a lookback holding the period's
own rows).

W3C Attribution: Parquet files -> validate (dead letter) -> shard by
hash(browser_id) (the privacy unit is browser instance x conversion site x epoch: every row of a
browser meets in one shard) -> per shard: encode, the browsers' per-site per-epoch budgets and safety
limits, sums per (query, task, histogram index) -> CombineGlobally (exact integers) -> noise once per
index -> Alg. 4 -> the release's files (``araopt.publication.attribution_release_files``); beside it,
the released rows' ids for the ledger. With a lookback (the conversions earlier releases released) its
rows join their browsers' shards and are simulated again first, carrying the budgets' state.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from types import EllipsisType

import apache_beam as beam
import pyarrow as pa

from araopt.attribution.content import lookback_specs
from araopt.attribution.draws import DrawKey
from araopt.attribution.lifetime import AttributionHistory
from araopt.attribution.release import AttributionRelease
from araopt.constants import MAX_SLICES
from araopt.io import outputs
from araopt.io.rowset import COARSE_MARGIN_US
from araopt.io.run_folder import RunFolder
from araopt.ledger.commit import HELD_FILE
from araopt.mechanism.keys import KeyDomain
from araopt.mechanism.lifetime import ReleaseHistory
from araopt.mechanism.release import with_version_end
from araopt.publication import Publication
from araopt.release_workflow import ReleaseSpec, publish_release
from araopt.targets import HeldLookback, Target, attribution_params, input_columns, target_of
from araopt.version import Api, ParameterVersion
from transforms.aggregate import DomainFromData, EncodeBoundAndSum, NoisyRelease
from transforms.attribution import MeasureAttribution
from transforms.io import InputFiles, release_days
from transforms.release import WriteAttributionRelease, WriteRelease
from transforms.rowset import CountHeldReleases, WriteContentIds, WriteRowIds
from transforms.validate import LOOKBACK_COUNTS, ReadAndValidate, lookback_rows, period_rows

LOOKBACK_SUFFIX = "_lookback"
"""The lookback rows' ids go beside the released rows' (``ROW_IDS + LOOKBACK_SUFFIX``)."""
HELD_SUFFIX = "_lookback_all"
"""An attribution release's lookback rows' ids, all of them (``ROW_IDS + HELD_SUFFIX``): which earlier
releases the lookback held whole (``araopt.ledger.attribution``)."""
CONTENT_SUFFIX = "_content"
"""An attribution release's rows' content identities (``araopt.io.rowset.content_ids``: what the browsers'
simulation reads of each released row id, and its copies) go beside its row ids (``ROW_IDS +
CONTENT_SUFFIX``), and its lookback's, hashed as each earlier release hashed its rows, beside the lookback's
(``ROW_IDS + HELD_SUFFIX + CONTENT_SUFFIX + "_<i>"``, ``i``: ``araopt.attribution.content.lookback_specs``):
the ledger records the first, a later release compares the second with them."""


@dataclass(frozen=True)
class ReleaseJob:
    """What ``build_release`` wires besides the input, the version and the folder (measure's options).
    ``row_ids``: the folder where the released rows' ids go (``transforms.rowset``), for the ledger, and
    the lookback's (``row_ids + LOOKBACK_SUFFIX``: of the period's last 26 hours, to refuse a lookback
    holding the period's own rows; ``+ HELD_SUFFIX``: all of them, when the target's held releases are
    told by row ids); ``lookback``: earlier conversions that consume each privacy unit's budget but are
    not released (nor recorded), costed with the configuration of the releases that used them
    (``history``, the ledger's: ARA's ``ReleaseHistory``, Attribution's ``AttributionHistory``; None:
    today's), Attribution's drawn with ``key`` (the ledger's draw key); ``one_dead_letter_file``: False
    on remote workers (a sharded dead letter); ``days``: the days an ARA release covers (the
    calendar's), by default ``release_days(inputs)``; ``columns``: the optional columns carried through
    validation, by default those every input (and lookback) file has, for Attribution the Attribution
    columns every file has (``transforms.io.attribution_columns``), whose ``browser_id`` decides the
    grouping."""

    domain: KeyDomain | None = None
    simulation_seed: int | None = None
    debug_run: bool = False
    num_shards: int = 64
    max_rejected_fraction: float = 0.10
    shuffle_dir: str | None = None
    max_slices: int = MAX_SLICES
    row_ids: str | None = None
    lookback: InputFiles | None = None
    one_dead_letter_file: bool = True
    history: ReleaseHistory | AttributionHistory | None = None
    days: tuple[str, ...] | None | EllipsisType = ...
    key: DrawKey | None = None
    columns: tuple[str, ...] | None = None


def build_release(pipeline: beam.Pipeline, inputs: InputFiles, version: ParameterVersion, folder: RunFolder,
                  job: ReleaseJob) -> beam.PCollection:
    """Wire ``version``'s release (either target: ``araopt.targets.target_of``) into ``folder``'s staging
    location; returns the release PCollection (ARA's ``Release``, Attribution's ``AttributionRelease``)."""
    lookback, row_ids = job.lookback, job.row_ids
    if job.domain is not None:  # the version's training window applies over a declared domain too
        job = replace(job, domain=with_version_end(job.domain, version.domain))
    target = target_of(version)
    columns = job.columns
    if columns is None:
        columns = tuple(c for c in inputs.optional_columns if lookback is None or c in lookback.optional_columns)
    slices, values = input_columns(version)
    groups = target.groups_at_read
    read = pipeline | "ReadAndValidate" >> ReadAndValidate(
        inputs.paths, slices, values, folder.path(outputs.private_file(outputs.DEAD_LETTER))[:-len(".parquet")],
        passthrough=columns, num_shards=job.num_shards if groups else None,
        spill_dir=job.shuffle_dir if groups else None,
        impression_slice_columns=version.params.impression_slice_columns if groups else None,
        lookback_paths=lookback.paths if lookback is not None else (), one_dead_letter_file=job.one_dead_letter_file,
        attribution=target.attribution_columns)
    tables = read["grouped"] | "ShardTables" >> beam.Values() if groups else read["valid"]
    released = tables
    if lookback is not None:
        released = tables | "PeriodRows" >> beam.Map(period_rows).with_output_types(pa.Table)
        if row_ids is not None:  # to check that the lookback does not hold the period's own conversions
            # the period's own conversions re-exported lie within 26 hours of it (time zones); earlier
            # lookback rows only add chance coarse matches (different conversions of the same impressions)
            since = inputs.first_time_us
            since = None if since is None else since - COARSE_MARGIN_US
            earlier = tables | "LookbackRows" >> beam.Map(lookback_rows, since).with_output_types(pa.Table)
            _ = earlier | "LookbackRowIds" >> WriteRowIds(row_ids.rstrip("/") + LOOKBACK_SUFFIX)
            _held_releases(target, tables, job, folder)
    if row_ids is not None:
        _ = released | "ReleasedRowIds" >> WriteRowIds(row_ids)
    return RELEASE_STEPS[target.api](read, released, inputs, version, folder, job, columns)


def _held_releases(target: Target, tables: beam.PCollection, job: ReleaseJob, folder: RunFolder) -> None:
    """Which earlier releases the lookback held whole, told the target's way (``araopt.targets.HeldLookback``)."""
    assert job.row_ids is not None  # (only with the released rows' ids)
    if target.held_lookback == HeldLookback.ROW_IDS:
        _ = (tables | "AllLookbackRows" >> beam.Map(lookback_rows).with_output_types(pa.Table)
             | "HeldRowIds" >> WriteRowIds(job.row_ids.rstrip("/") + HELD_SUFFIX))
    elif isinstance(job.history, ReleaseHistory):  # the ledger's releases in reach must be held whole
        _ = (tables | "AllLookbackRows" >> beam.Map(lookback_rows).with_output_types(pa.Table)
             | "CountHeldReleases" >> CountHeldReleases(job.history, folder.path(HELD_FILE)))


def _ara_release(read: dict[str, beam.PCollection], released: beam.PCollection[pa.Table], inputs: InputFiles,
                 version: ParameterVersion, folder: RunFolder, job: ReleaseJob, columns: tuple[str, ...]
                 ) -> beam.PCollection:
    """ARA's release step: per shard of complete impressions encode (Alg. 3 / 6), cap (Alg. 1) and sum
    over the domain (declared, or the data's in simulation), the integer combine, noise once per key
    (Alg. 2) and Alg. 4 (``NoisyRelease``), the publication, its files."""
    params = version.params
    history = job.history if isinstance(job.history, ReleaseHistory) else None
    # conversions are exported by day: the earliest file read covers its whole UTC day
    first = (job.lookback or inputs).first_time_us
    coverage_start = None if first is None else first - first % 86_400_000_000
    if job.domain is not None:
        domain_pc = released.pipeline | "DeclaredDomain" >> beam.Create([job.domain])
    else:
        domain_pc = released | "DomainFromData" >> DomainFromData(params, job.max_slices)
    merged = read["grouped"] | "EncodeBoundAndSum" >> EncodeBoundAndSum(params, domain_pc, job.simulation_seed,
                                                                        coverage_start, history)
    release = merged | "NoisyRelease" >> NoisyRelease(params, read["counts"], domain_pc, job.simulation_seed,
                                                      job.max_rejected_fraction, read.get(LOOKBACK_COUNTS))
    days = release_days(inputs)[0] if job.days is ... else job.days
    spec = ReleaseSpec(version, job.simulation_seed, job.max_rejected_fraction, history, coverage_start, days)
    published = release | "Publish" >> beam.Map(publish_release, spec).with_output_types(Publication)
    published | "WriteRelease" >> WriteRelease(folder.staging, version.checksum(), job.debug_run,
                                               job.simulation_seed is not None)
    return release


def _attribution_release(read: dict[str, beam.PCollection], released: beam.PCollection[pa.Table],
                         inputs: InputFiles, version: ParameterVersion, folder: RunFolder, job: ReleaseJob,
                         columns: tuple[str, ...]) -> beam.PCollection[AttributionRelease]:
    """The W3C Attribution release step: the valid rows (the lookback's too, simulated again first with
    the ledger's parameters and draws) grouped by browser, each shard's browsers simulated (the encoder,
    the per-site per-epoch budgets, the safety limits), the exact integer combine, noise once per
    histogram index, Alg. 4 (``MeasureAttribution``), the release's files."""
    history = job.history if isinstance(job.history, AttributionHistory) else None
    release = read["valid"] | "MeasureAttribution" >> MeasureAttribution(
        attribution_params(version), read["counts"], job.domain, job.simulation_seed, job.num_shards,
        target_of(version).group_column(columns), job.shuffle_dir, max_rejected_fraction=job.max_rejected_fraction,
        key=job.key, history=history)
    if job.row_ids is not None and job.key is not None:  # a release: what its rows read, for the ledger
        params, base = attribution_params(version), job.row_ids.rstrip("/")
        _ = released | "ReleasedContentIds" >> WriteContentIds(base + CONTENT_SUFFIX, params)
        if job.lookback is not None and history is not None and history.releases:
            held = read["valid"] | "HeldLookbackRows" >> beam.Map(lookback_rows).with_output_types(pa.Table)
            for i, spec in enumerate(lookback_specs(history)):
                _ = held | f"HeldContentIds{i}" >> WriteContentIds(f"{base}{HELD_SUFFIX}{CONTENT_SUFFIX}_{i}", spec)
    _ = release | "WriteRelease" >> beam.ParDo(WriteAttributionRelease(folder.staging, version.checksum(),
                                                                       job.simulation_seed is not None, job.debug_run,
                                                                       job.max_rejected_fraction, version.retention))
    return release


ReleaseSteps = Callable[[dict[str, beam.PCollection], beam.PCollection, InputFiles, ParameterVersion, RunFolder,
                         ReleaseJob, tuple[str, ...]], beam.PCollection]
RELEASE_STEPS: dict[Api, ReleaseSteps] = {Api.ARA: _ara_release, Api.ATTRIBUTION: _attribution_release}
"""Each target's release step after the common read (a third target adds its description in
``araopt.targets`` and its step here, not a builder)."""
