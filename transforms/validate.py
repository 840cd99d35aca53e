"""Read + validate, once for every job: Parquet files -> canonical valid batches, a dead letter with
reasons, and one merged ``ValidationCounts`` (read / rejected per reason / times floored), with Beam
counters per reason. The rejected-share gate is ``araopt.io.conversions.check_rejected_share``.

Jobs that cap per impression also group here (``ReadAndValidate(..., num_shards=S)``): the rows of
each impression are brought together and those whose impression-side slice values differ from the
impression's first row go to the same dead letter (``araopt.io.conversions.impression_slice_conflicts``),
counted with the rest.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, cast

import apache_beam as beam
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.metrics import Metrics

from araopt.io.conversions import (
    IMPRESSION_SLICE_INCONSISTENT,
    IN_PERIOD,
    REJECT_REASONS,
    TIMES_FLOORED,
    ValidationCounts,
    dead_letter_rows,
    dead_letter_schema,
    validate_batch,
)
from araopt.io.ids import ID_SORT_KEY, with_sort_keys
from araopt.io.rowset import TIME_US
from araopt.mechanism.sources import impression_slice_conflicts

from .group import GroupByImpression, ShardFiles, shard_table, write_spill
from .io import ReadConversionFiles, needed_columns

VALID = "valid"
GROUPED = "grouped"
REJECTED = "rejected"
COUNTS = "counts"
LOOKBACK_COUNTS = "lookback_counts"
NAMESPACE = "araopt"


@beam.typehints.with_input_types(pa.Table)
@beam.typehints.with_output_types(pa.Table, **{REJECTED: pa.Table, COUNTS: ValidationCounts})
class _ValidateBatch(beam.DoFn):
    def __init__(self, slice_columns: Sequence[str], value_columns: Sequence[str], passthrough: Sequence[str] = (),
                 attribution: bool = False):
        self._slice_columns = tuple(slice_columns)
        self._value_columns = tuple(value_columns)
        self._passthrough = tuple(passthrough)
        self._attribution = attribution

    def setup(self) -> None:
        self._rows_read = Metrics.counter(NAMESPACE, "rows_read")
        self._rows_valid = Metrics.counter(NAMESPACE, "rows_valid")
        self._floored = Metrics.counter(NAMESPACE, TIMES_FLOORED)
        self._rejected = {r: Metrics.counter(NAMESPACE, f"rows_rejected_{r}") for r in REJECT_REASONS}

    def process(self, table: pa.Table) -> Iterator[pa.Table | beam.pvalue.TaggedOutput]:
        batch = validate_batch(table, self._slice_columns, self._value_columns, self._passthrough, self._attribution)
        counts = ValidationCounts.of(table.num_rows, batch)
        self._rows_read.inc(table.num_rows)
        self._rows_valid.inc(batch.valid.num_rows)
        self._floored.inc(batch.times_floored)
        for reason, count in counts.rejected_by_reason.items():
            self._rejected[reason].inc(count)
        if batch.rejected.num_rows:
            yield beam.pvalue.TaggedOutput(REJECTED, batch.rejected)
        yield beam.pvalue.TaggedOutput(COUNTS, counts)
        if batch.valid.num_rows:
            yield batch.valid


@beam.typehints.with_input_types(pa.Table)
@beam.typehints.with_output_types(pa.Table, **{REJECTED: pa.Table, COUNTS: ValidationCounts})
class ValidateConversions(beam.PTransform):
    """Batches -> outputs ``valid`` (canonical tables), ``rejected`` (text columns + ``reason``),
    ``counts`` (one ``ValidationCounts`` per batch)."""

    def __init__(self, slice_columns: Sequence[str], value_columns: Sequence[str], passthrough: Sequence[str] = (),
                 attribution: bool = False):
        super().__init__()
        self._slice_columns = tuple(slice_columns)
        self._value_columns = tuple(value_columns)
        self._passthrough = tuple(passthrough)
        self._attribution = attribution

    def expand(self, batches: beam.PCollection[pa.Table]) -> beam.pvalue.DoOutputsTuple:
        return batches | "ValidateRows" >> beam.ParDo(
            _ValidateBatch(self._slice_columns, self._value_columns, self._passthrough, self._attribution)).with_outputs(
                REJECTED, COUNTS, main=VALID)


def _mark_period(table: pa.Table, in_period: bool) -> pa.Table:
    return table.append_column(IN_PERIOD, pa.array(np.full(table.num_rows, in_period), type=pa.bool_()))


def period_rows(table: pa.Table) -> pa.Table:
    """The rows of the measured period of a valid batch (all of them when it carries no lookback)."""
    if IN_PERIOD not in table.column_names:
        return table
    return table.filter(table.column(IN_PERIOD))


def lookback_rows(table: pa.Table, since_us: int | None = None) -> pa.Table:
    """The --lookback rows of a valid batch (none when it carries no lookback), those converted at or
    after ``since_us`` only if given."""
    if IN_PERIOD not in table.column_names:
        return table.slice(0, 0)
    keep = pc.invert(table.column(IN_PERIOD))
    if since_us is not None:
        keep = pc.and_(keep, pc.greater_equal(table.column(TIME_US), pa.scalar(since_us, pa.int64())))
    return table.filter(keep)


LOOKBACK_REJECTED = "lookback_rejected"
LOOKBACK_CHECK_COUNTS = "lookback_check_counts"


class _CheckImpressionSlices(beam.DoFn):
    """Per shard of complete impressions: rows whose impression-side slice values differ from their
    impression's first row (in Alg. 1's order, lookback rows included) -> dead letter
    (``araopt.io.conversions.impression_slice_conflicts``); a lookback row's to the lookback's.

    A shard given as its spill files (``ShardFiles``) stays files, for consumers that only count the
    period's impressions (the statistics, the calibration): their lookback rows are kept only for
    impressions with a row in the period (the others change nothing they compute, and with a 30-day
    lookback are most of what is read); a shard that loses rows is written to a new spill file under
    ``spill_dir``. A shard of rows (measure, which counts every lookback row) loses only its conflicts."""

    def __init__(self, impression_slice_columns: Sequence[str], slice_columns: Sequence[str],
                 value_columns: Sequence[str], spill_dir: str | None = None):
        self._impression_slice_columns = tuple(impression_slice_columns)
        self._slice_columns = tuple(slice_columns)
        self._value_columns = tuple(value_columns)
        self._spill_dir = spill_dir

    def setup(self) -> None:
        self._rejected = Metrics.counter(NAMESPACE, f"rows_rejected_{IMPRESSION_SLICE_INCONSISTENT}")

    def process(self, item: tuple[int, pa.Table | ShardFiles]
                ) -> Iterator[tuple[int, pa.Table | ShardFiles] | beam.pvalue.TaggedOutput]:
        shard, value = item
        # the shard carries its ids' order from here on (``araopt.io.ids.ID_SORT_KEY``: ranked once, for this
        # check and every consumer's Alg. 1 order): as a column, or for spill files in a file of its own
        table, keys = with_sort_keys(shard_table(value))
        conflicts = impression_slice_conflicts(table, self._impression_slice_columns, self._slice_columns,
                                               self._value_columns)
        if conflicts.any():
            self._rejected.inc(int(conflicts.sum()))
            period = _period(table)
            for mask, rows_tag, counts_tag in ((conflicts & period, REJECTED, COUNTS),
                                               (conflicts & ~period, LOOKBACK_REJECTED, LOOKBACK_CHECK_COUNTS)):
                if mask.any():
                    yield beam.pvalue.TaggedOutput(rows_tag, dead_letter_rows(
                        table.filter(pa.array(mask)), self._slice_columns, self._value_columns,
                        IMPRESSION_SLICE_INCONSISTENT))
                    yield beam.pvalue.TaggedOutput(counts_tag, ValidationCounts.rejected(
                        int(mask.sum()), IMPRESSION_SLICE_INCONSISTENT))
        keep = ~conflicts
        if isinstance(value, ShardFiles):
            keep &= _of_period_impressions(table, keys, keep)
        if keep.all():
            if not isinstance(value, ShardFiles):
                yield shard, table
            elif value.sort_keys is None and ID_SORT_KEY in table.column_names and self._spill_dir is not None:
                keys_file = write_spill(self._spill_dir, shard, pa.table({ID_SORT_KEY: pa.array(keys, type=pa.int64())}))
                yield shard, ShardFiles(value.paths, keys_file)
            else:
                yield shard, value
            return
        kept = table.filter(pa.array(keep))
        if kept.num_rows:
            if isinstance(value, ShardFiles):
                assert self._spill_dir is not None  # (only GroupByImpression with a spill directory makes files)
                yield shard, ShardFiles((write_spill(self._spill_dir, shard, kept),))
            else:
                yield shard, kept


def _period(table: pa.Table) -> np.ndarray:
    """The rows of the measured period (all of them without a lookback)."""
    if IN_PERIOD not in table.column_names:
        return np.ones(table.num_rows, dtype=bool)
    return np.asarray(table.column(IN_PERIOD).to_numpy(zero_copy_only=False), dtype=bool)


def _of_period_impressions(table: pa.Table, keys: np.ndarray, among: np.ndarray) -> np.ndarray:
    """The rows of the impressions with a period row among the rows ``among`` (every row without a lookback)."""
    if IN_PERIOD not in table.column_names:
        return np.ones(table.num_rows, dtype=bool)
    # the ids' keys: dense ranks for string ids (``with_sort_keys``), the ids themselves otherwise
    labels = keys if ID_SORT_KEY in table.column_names else pd.factorize(keys)[0]
    active = np.zeros(int(labels.max()) + 1 if len(labels) else 0, dtype=bool)
    active[labels[_period(table) & among]] = True
    return cast(np.ndarray, active[labels])


class ReadAndValidate(beam.PTransform):
    """Explicit Parquet files -> ``{"valid": batches, "counts": singleton ValidationCounts}``, and the
    dead letter written to ``dead_letter_prefix`` (a ``.parquet`` file, text columns + reason) if given.

    With ``num_shards``: ``{"grouped": (shard, table of complete impressions), "counts": ...}`` instead
    (``GroupByImpression`` with ``spill_dir``), where rows whose ``impression_slice_columns`` (default:
    every slice column) differ from their impression's first row are rejected like invalid rows.

    ``lookback_paths``: files of earlier conversions that consume the per-impression budget of
    ContributionCapping (Alg. 1) but are not measured. They are validated the same way, their valid
    rows join ``valid`` / ``grouped`` with ``in_period`` False (the period's rows get True), their
    accounting is the extra output ``lookback_counts`` and their dead letter
    ``<dead_letter_prefix>_lookback.parquet``.

    ``shard_files`` (with ``spill_dir``): ``grouped`` holds each shard's spill files
    (``transforms.group.ShardFiles``), read again by each consumer (``transforms.group.shard_table``):
    for jobs whose grouped shards feed more than one stage.

    The outputs are typed by the steps that make them (``pa.Table``, ``ValidationCounts``): Beam
    checks a composite's dict output against a single output type, which fits neither."""

    def __init__(self, paths: Sequence[str], slice_columns: Sequence[str], value_columns: Sequence[str],
                 dead_letter_prefix: str | None = None, passthrough: Sequence[str] = (), num_shards: int | None = None,
                 spill_dir: str | None = None, impression_slice_columns: Sequence[str] | None = None,
                 lookback_paths: Sequence[str] = (), one_dead_letter_file: bool = True, shard_files: bool = False,
                 attribution: bool = False):
        super().__init__()
        self._attribution = attribution  # the W3C Attribution columns' rules too (``validate_batch``)
        self._paths = list(paths)
        self._slice_columns = tuple(slice_columns)
        self._value_columns = tuple(value_columns)
        self._dead_letter = dead_letter_prefix
        self._passthrough = tuple(passthrough)
        self._num_shards = num_shards
        self._spill_dir = spill_dir
        self._impression_slice_columns = (self._slice_columns if impression_slice_columns is None
                                          else tuple(impression_slice_columns))
        self._lookback = list(lookback_paths)
        self._one_file = one_dead_letter_file
        self._shard_files = shard_files and spill_dir is not None

    def _read(self, pbegin: beam.pvalue.PBegin, paths: list[str], label: str) -> beam.pvalue.DoOutputsTuple:
        columns = needed_columns(self._slice_columns, self._value_columns) + list(self._passthrough)
        batches = pbegin | f"Read{label}" >> ReadConversionFiles(paths, columns)
        return batches | f"Validate{label}" >> ValidateConversions(self._slice_columns, self._value_columns,
                                                                   self._passthrough, self._attribution)

    def _finish(self, counts: list[beam.PCollection[Any]], rejected: list[beam.PCollection[Any]], label: str,
                dead_letter: str | None) -> beam.PCollection[ValidationCounts]:
        if dead_letter is not None:
            _ = (rejected | f"AllRejected{label}" >> beam.Flatten() | f"WriteDeadLetter{label}"
                 >> beam.io.WriteToParquetBatched(
                     dead_letter, schema=dead_letter_schema(self._slice_columns, self._value_columns),
                     num_shards=1 if self._one_file else 0, shard_name_template="" if self._one_file else None,
                     file_name_suffix=".parquet"))
        return (counts | f"AllCounts{label}" >> beam.Flatten()
                | f"CountRows{label}" >> beam.CombineGlobally(ValidationCounts.merge).with_output_types(ValidationCounts))

    def expand(self, pbegin: beam.pvalue.PBegin) -> dict[str, beam.PCollection[Any]]:
        checked = self._read(pbegin, self._paths, "")
        counts, rejected = [checked[COUNTS]], [checked[REJECTED]]
        valid = checked[VALID]
        lookback_counts: list[beam.PCollection[Any]] = []
        lookback_rejected: list[beam.PCollection[Any]] = []
        if self._lookback:
            earlier = self._read(pbegin, self._lookback, "Lookback")
            lookback_counts, lookback_rejected = [earlier[COUNTS]], [earlier[REJECTED]]
            marked = (valid | "MarkPeriod" >> beam.Map(_mark_period, True).with_output_types(pa.Table),
                      earlier[VALID] | "MarkLookback" >> beam.Map(_mark_period, False).with_output_types(pa.Table))
        if self._num_shards is None:
            if self._lookback:
                valid = marked | "PeriodAndLookback" >> beam.Flatten().with_output_types(pa.Table)
            out: dict[str, beam.PCollection[Any]] = {VALID: valid}
        else:
            # the period and the lookback go to the shuffle separately: with a spill directory each is
            # spilled on its own and only their shard files are joined (a Flatten of the rows would be
            # held whole in memory by the local runner)
            grouped = (
                (marked if self._lookback else valid)
                | "GroupByImpression" >> GroupByImpression(self._num_shards, self._spill_dir,
                                                           as_files=self._shard_files)
                | "CheckImpressionSlices" >> beam.ParDo(_CheckImpressionSlices(
                    self._impression_slice_columns, self._slice_columns, self._value_columns,
                    self._spill_dir)).with_output_types(  # typed: a table crossing a stage is Arrow IPC, not pickled
                        beam.typehints.Tuple[int, ShardFiles if self._shard_files else pa.Table],
                        **{REJECTED: pa.Table, COUNTS: ValidationCounts, LOOKBACK_REJECTED: pa.Table,
                           LOOKBACK_CHECK_COUNTS: ValidationCounts}).with_outputs(
                        REJECTED, COUNTS, LOOKBACK_REJECTED, LOOKBACK_CHECK_COUNTS, main=GROUPED)
            )
            out = {GROUPED: grouped[GROUPED]}
            counts.append(grouped[COUNTS])
            rejected.append(grouped[REJECTED])
            if self._lookback:
                lookback_counts.append(grouped[LOOKBACK_CHECK_COUNTS])
                lookback_rejected.append(grouped[LOOKBACK_REJECTED])
        out[COUNTS] = self._finish(counts, rejected, "", self._dead_letter)
        if self._lookback:
            out[LOOKBACK_COUNTS] = self._finish(
                lookback_counts, lookback_rejected, "Lookback",
                None if self._dead_letter is None else self._dead_letter + "_lookback")
        return out
