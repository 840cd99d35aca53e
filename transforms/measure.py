"""``measure``'s Beam job for either target (``araopt.targets``), built into a run folder's staging
location: the release workflow's steps as composite transforms.

ARA (``build_ara_release``): Parquet files -> validate (dead letter) -> shard by hash(impression_id)
-> GroupByKey -> per shard: impression-side slices constant (else dead letter), sort, encode, cap
(Alg. 1), per-key sums over the domain -> CombineGlobally (integer) -> the release step (noise once per
domain key, Alg. 2; reconstruct, Alg. 4) -> the publication -> Avro / Parquet / CSV / JSON; beside it,
the released rows' ids for the ledger (and the lookback's, to refuse a lookback holding the period's
own rows).

W3C Attribution (``build_attribution_release``): Parquet files -> validate (dead letter) -> shard by
hash(browser_id) (the privacy unit is browser instance x conversion site x epoch: every row of a
browser meets in one shard) -> per shard: encode, the browsers' per-site per-epoch budgets and safety
limits, sums per (query, task, histogram index) -> CombineGlobally (exact integers) -> noise once per
index -> Alg. 4 -> the release's files (``araopt.publication.attribution_release_files``); beside it,
the released rows' ids for the ledger. With a lookback (the conversions earlier releases released) its
rows join their browsers' shards and are simulated again first, carrying the budgets' state.
"""
from __future__ import annotations

from types import EllipsisType

import apache_beam as beam
import pyarrow as pa

from araopt.attribution.draws import DrawKey
from araopt.attribution.lifetime import AttributionHistory
from araopt.attribution.params import AttributionParams
from araopt.attribution.release import AttributionRelease
from araopt.constants import MAX_SLICES
from araopt.io import outputs
from araopt.io.rowset import COARSE_MARGIN_US
from araopt.io.run_folder import RunFolder
from araopt.ledger.commit import HELD_FILE
from araopt.mechanism.keys import KeyDomain
from araopt.mechanism.lifetime import ReleaseHistory
from araopt.publication import Publication
from araopt.release_workflow import ReleaseSpec, publish_release
from araopt.version import ParameterVersion
from transforms.aggregate import DomainFromData, EncodeBoundAndSum, NoisyRelease
from transforms.attribution import MeasureAttribution, unit_column
from transforms.io import InputFiles, iso_micros, release_days
from transforms.release import WriteAttributionRelease, WriteRelease
from transforms.rowset import CountHeldReleases, WriteRowIds
from transforms.validate import LOOKBACK_COUNTS, ReadAndValidate, lookback_rows, period_rows

LOOKBACK_SUFFIX = "_lookback"
"""The lookback rows' ids go beside the released rows' (``ROW_IDS + LOOKBACK_SUFFIX``)."""
HELD_SUFFIX = "_lookback_all"
"""An attribution release's lookback rows' ids, all of them (``ROW_IDS + HELD_SUFFIX``): which earlier
releases the lookback held whole (``araopt.ledger.attribution``)."""


def build_ara_release(pipeline: beam.Pipeline, inputs: InputFiles, version: ParameterVersion, folder: RunFolder,
                      domain: KeyDomain | None = None, simulation_seed: int | None = None, debug_run: bool = False,
                      num_shards: int = 64, max_rejected_fraction: float = 0.10, shuffle_dir: str | None = None,
                      max_slices: int = MAX_SLICES, row_ids: str | None = None, lookback: InputFiles | None = None,
                      one_dead_letter_file: bool = True, history: ReleaseHistory | None = None,
                      days: tuple[str, ...] | None | EllipsisType = ...) -> beam.PCollection:
    """Wire the measurement transforms into ``folder``'s staging location; returns the release PCollection.
    ``row_ids``: the folder where the released rows' ids go (``transforms.rowset``), for the ledger (and
    the lookback's, in ``row_ids + LOOKBACK_SUFFIX``, to refuse a lookback holding the period's own rows);
    ``lookback``: earlier conversions that consume each impression's budget (Alg. 1) but are not released
    (nor recorded in the ledger), each costed with the configuration of the release that used it
    (``history``, from the ledger; None: today's); ``one_dead_letter_file``: False on remote workers
    (a sharded dead letter); ``days``: the days the release covers (the calendar's), by default
    ``release_days(inputs)``."""
    params = version.params
    passthrough = tuple(c for c in inputs.optional_columns if lookback is None or c in lookback.optional_columns)
    read = pipeline | "ReadAndValidate" >> ReadAndValidate(
        inputs.paths, params.slice_columns, params.query_columns,
        folder.path(outputs.private_file(outputs.DEAD_LETTER))[:-len(".parquet")], passthrough=passthrough,
        num_shards=num_shards, spill_dir=shuffle_dir, impression_slice_columns=params.impression_slice_columns,
        lookback_paths=lookback.paths if lookback is not None else (), one_dead_letter_file=one_dead_letter_file)
    grouped, counts = read["grouped"], read["counts"]
    # conversions are exported by day: the earliest file read covers its whole UTC day
    first = iso_micros((lookback or inputs).first_time)
    coverage_start = None if first is None else first - first % 86_400_000_000
    released = grouped | "ShardTables" >> beam.Values()
    if lookback is not None:
        tables = released
        released = tables | "PeriodRows" >> beam.Map(period_rows).with_output_types(pa.Table)
        if row_ids is not None:  # to check that the lookback does not hold the period's own conversions
            # the period's own conversions re-exported lie within 26 hours of it (time zones); earlier
            # lookback rows only add chance coarse matches (different conversions of the same impressions)
            since = iso_micros(inputs.first_time)
            since = None if since is None else since - COARSE_MARGIN_US
            earlier = tables | "LookbackRows" >> beam.Map(lookback_rows, since).with_output_types(pa.Table)
            _ = earlier | "LookbackRowIds" >> WriteRowIds(row_ids.rstrip("/") + LOOKBACK_SUFFIX)
            if history is not None:  # the ledger's releases in reach must be held whole (araopt.ledger.lifetime)
                _ = (tables | "AllLookbackRows" >> beam.Map(lookback_rows).with_output_types(pa.Table)
                     | "CountHeldReleases" >> CountHeldReleases(history, folder.path(HELD_FILE)))
    if row_ids is not None:
        _ = released | "ReleasedRowIds" >> WriteRowIds(row_ids)
    if domain is not None:
        domain_pc = pipeline | "DeclaredDomain" >> beam.Create([domain])
    else:
        domain_pc = released | "DomainFromData" >> DomainFromData(params, max_slices)
    merged = grouped | "EncodeBoundAndSum" >> EncodeBoundAndSum(params, domain_pc, simulation_seed, coverage_start,
                                                                history)
    release = merged | "NoisyRelease" >> NoisyRelease(params, counts, domain_pc, simulation_seed, max_rejected_fraction,
                                                      read.get(LOOKBACK_COUNTS))
    if days is ...:
        days = release_days(inputs)[0]
    spec = ReleaseSpec(version, simulation_seed, max_rejected_fraction, history, coverage_start, days)
    published = release | "Publish" >> beam.Map(publish_release, spec).with_output_types(Publication)
    published | "WriteRelease" >> WriteRelease(folder.staging, version.checksum(), debug_run, simulation_seed is not None)
    return release


def build_attribution_release(pipeline: beam.Pipeline, inputs: InputFiles, version: ParameterVersion,
                              params: AttributionParams, present: tuple[str, ...], folder: RunFolder,
                              domain: KeyDomain | None, simulation_seed: int | None = None, debug_run: bool = False,
                              num_shards: int = 64, max_rejected_fraction: float = 0.10,
                              shuffle_dir: str | None = None, one_dead_letter_file: bool = True,
                              row_ids: str | None = None, lookback: InputFiles | None = None,
                              history: AttributionHistory | None = None, key: DrawKey | None = None
                              ) -> beam.PCollection[AttributionRelease]:
    """Wire the Attribution measurement into ``folder``'s staging location; returns the release.
    ``present``: the Attribution columns every input file has (``transforms.io.attribution_columns``);
    ``row_ids``: where the released rows' ids go, for the ledger (``transforms.rowset``), and the
    lookback's (``row_ids + LOOKBACK_SUFFIX``: those of the period's last 26 hours, to refuse a lookback
    holding the period's own rows; ``+ HELD_SUFFIX``: all, to count which earlier releases it held whole);
    ``lookback``: the conversions earlier releases released, read with the input and grouped with their
    browsers, simulated again with the parameters of ``history`` (the ledger's) and the draws of ``key``
    (the ledger's; ``araopt.attribution.lifetime``), not summed."""
    read = pipeline | "ReadAndValidate" >> ReadAndValidate(
        inputs.paths, (*params.slice_columns, *params.conversion_slice_columns), params.value_columns,
        folder.path(outputs.private_file(outputs.DEAD_LETTER))[:-len(".parquet")], passthrough=present,
        one_dead_letter_file=one_dead_letter_file, attribution=True,
        lookback_paths=lookback.paths if lookback is not None else ())
    valid = read["valid"]
    if row_ids is not None:
        released = valid
        if lookback is not None:
            released = valid | "PeriodRows" >> beam.Map(period_rows).with_output_types(pa.Table)
            since = iso_micros(inputs.first_time)
            since = None if since is None else since - COARSE_MARGIN_US
            _ = (valid | "LookbackRows" >> beam.Map(lookback_rows, since).with_output_types(pa.Table)
                 | "LookbackRowIds" >> WriteRowIds(row_ids.rstrip("/") + LOOKBACK_SUFFIX))
            _ = (valid | "AllLookbackRows" >> beam.Map(lookback_rows).with_output_types(pa.Table)
                 | "HeldRowIds" >> WriteRowIds(row_ids.rstrip("/") + HELD_SUFFIX))
        _ = released | "ReleasedRowIds" >> WriteRowIds(row_ids)
    release = valid | "MeasureAttribution" >> MeasureAttribution(
        params, read["counts"], domain, simulation_seed, num_shards, unit_column(present), shuffle_dir,
        max_rejected_fraction=max_rejected_fraction, key=key, history=history)
    _ = release | "WriteRelease" >> beam.ParDo(WriteAttributionRelease(folder.staging, version.checksum(),
                                                                       simulation_seed is not None, debug_run,
                                                                       max_rejected_fraction, version.retention))
    return release
