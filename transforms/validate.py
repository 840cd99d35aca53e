"""Read + validate, once for every job: Parquet files -> canonical valid batches, a dead letter with
reasons, and one merged ``ValidationCounts`` (read / rejected per reason / times floored), with Beam
counters per reason. The rejected-share gate is ``araopt.conversions.check_rejected_share``.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.metrics import Metrics
from apache_beam.runners.runner import PipelineResult

from araopt.conversions import (
    IN_PERIOD,
    REJECT_REASONS,
    TIMES_FLOORED,
    ValidationCounts,
    dead_letter_schema,
    validate_batch,
)

from .io import ReadConversionFiles, needed_columns

VALID = "valid"
REJECTED = "rejected"
COUNTS = "counts"
LOOKBACK_COUNTS = "lookback_counts"
NAMESPACE = "araopt"


@beam.typehints.with_input_types(pa.Table)
@beam.typehints.with_output_types(pa.Table, **{REJECTED: pa.Table, COUNTS: ValidationCounts})
class _ValidateBatch(beam.DoFn):
    def __init__(self, slice_columns: Sequence[str], value_columns: Sequence[str], passthrough: Sequence[str] = ()):
        self._slice_columns = tuple(slice_columns)
        self._value_columns = tuple(value_columns)
        self._passthrough = tuple(passthrough)

    def setup(self) -> None:
        self._rows_read = Metrics.counter(NAMESPACE, "rows_read")
        self._rows_valid = Metrics.counter(NAMESPACE, "rows_valid")
        self._floored = Metrics.counter(NAMESPACE, TIMES_FLOORED)
        self._rejected = {r: Metrics.counter(NAMESPACE, f"rows_rejected_{r}") for r in REJECT_REASONS}

    def process(self, table: pa.Table) -> Iterator[pa.Table | beam.pvalue.TaggedOutput]:
        batch = validate_batch(table, self._slice_columns, self._value_columns, self._passthrough)
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

    def __init__(self, slice_columns: Sequence[str], value_columns: Sequence[str], passthrough: Sequence[str] = ()):
        super().__init__()
        self._slice_columns = tuple(slice_columns)
        self._value_columns = tuple(value_columns)
        self._passthrough = tuple(passthrough)

    def expand(self, batches: beam.PCollection[pa.Table]) -> beam.pvalue.DoOutputsTuple:
        return batches | "ValidateRows" >> beam.ParDo(
            _ValidateBatch(self._slice_columns, self._value_columns, self._passthrough)).with_outputs(
                REJECTED, COUNTS, main=VALID)


def _mark_period(table: pa.Table, in_period: bool) -> pa.Table:
    return table.append_column(IN_PERIOD, pa.array(np.full(table.num_rows, in_period), type=pa.bool_()))


def period_rows(table: pa.Table) -> pa.Table:
    """The rows of the measured period of a valid batch (all of them when it carries no lookback)."""
    if IN_PERIOD not in table.column_names:
        return table
    return table.filter(table.column(IN_PERIOD))


class ReadAndValidate(beam.PTransform):
    """Explicit Parquet files -> ``{"valid": batches, "counts": singleton ValidationCounts}``, and the
    dead letter written to ``dead_letter_prefix`` (text columns + reason) if given: one ``.parquet``
    file, or with ``one_dead_letter_file=False`` ``-SSSSS-of-NNNNN.parquet`` files sharded by the
    runner (one file means one worker writing every rejected row, after a shuffle to a single key).

    ``lookback_paths``: files of earlier conversions that consume the per-impression budget of
    ContributionCapping (Alg. 1) but are not measured. They are validated the same way, their valid
    rows join ``valid`` with ``in_period`` False (the period's rows get True), their accounting is the
    extra output ``lookback_counts`` and their dead letter ``<dead_letter_prefix>_lookback.parquet``.

    The outputs are typed by the steps that make them (``pa.Table``, ``ValidationCounts``): Beam
    checks a composite's dict output against a single output type, which fits neither."""

    def __init__(self, paths: Sequence[str], slice_columns: Sequence[str], value_columns: Sequence[str],
                 dead_letter_prefix: str | None = None, passthrough: Sequence[str] = (),
                 lookback_paths: Sequence[str] = (), one_dead_letter_file: bool = True):
        super().__init__()
        self._one_file = one_dead_letter_file
        self._paths = list(paths)
        self._slice_columns = tuple(slice_columns)
        self._value_columns = tuple(value_columns)
        self._dead_letter = dead_letter_prefix
        self._passthrough = tuple(passthrough)
        self._lookback = list(lookback_paths)

    def _read(self, pbegin: beam.pvalue.PBegin, paths: list[str], label: str,
              dead_letter: str | None) -> tuple[beam.PCollection[pa.Table], beam.PCollection[ValidationCounts]]:
        columns = needed_columns(self._slice_columns, self._value_columns) + list(self._passthrough)
        batches = pbegin | f"Read{label}" >> ReadConversionFiles(paths, columns)
        checked = batches | f"Validate{label}" >> ValidateConversions(self._slice_columns, self._value_columns,
                                                                      self._passthrough)
        counts = checked[COUNTS] | f"CountRows{label}" >> beam.CombineGlobally(
            ValidationCounts.merge).with_output_types(ValidationCounts)
        if dead_letter is not None:
            _ = checked[REJECTED] | f"WriteDeadLetter{label}" >> beam.io.WriteToParquetBatched(
                dead_letter, schema=dead_letter_schema(self._slice_columns, self._value_columns),
                num_shards=1 if self._one_file else 0, shard_name_template="" if self._one_file else None,
                file_name_suffix=".parquet")
        return checked[VALID], counts

    def expand(self, pbegin: beam.pvalue.PBegin) -> dict[str, beam.PCollection[Any]]:
        valid, counts = self._read(pbegin, self._paths, "", self._dead_letter)
        if not self._lookback:
            return {VALID: valid, COUNTS: counts}
        lookback, lookback_counts = self._read(pbegin, self._lookback, "Lookback",
                                               None if self._dead_letter is None else self._dead_letter + "_lookback")
        marked = (
            (valid | "MarkPeriod" >> beam.Map(_mark_period, True).with_output_types(pa.Table),
             lookback | "MarkLookback" >> beam.Map(_mark_period, False).with_output_types(pa.Table))
            | "PeriodAndLookback" >> beam.Flatten().with_output_types(pa.Table))
        return {VALID: marked, COUNTS: counts, LOOKBACK_COUNTS: lookback_counts}


def counter_values(result: PipelineResult) -> dict[str, int]:
    """Beam counters of a finished pipeline by name (committed, else attempted); {} if unsupported."""
    out: dict[str, int] = {}
    try:
        for c in result.metrics().query()["counters"]:
            out[c.key.metric.name] = out.get(c.key.metric.name, 0) + int(c.committed or c.attempted or 0)
    except Exception:  # noqa: BLE001 - some runners report no metrics; the pipeline's own accounting remains
        pass
    return out


def rejected_by_reason(result: PipelineResult) -> dict[str, int]:
    """Rows sent to the dead letter, per reason, from the validation counters."""
    prefix = "rows_rejected_"
    return {k[len(prefix):]: v for k, v in counter_values(result).items() if k.startswith(prefix) and v}
