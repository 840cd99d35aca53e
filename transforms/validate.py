"""Row validation with a dead-letter output and Beam counters (per reason)."""
from __future__ import annotations

from typing import Sequence

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.metrics import Metrics

from araopt.conversions import REASON, REJECT_REASONS, validate_table

VALID = "valid"
REJECTED = "rejected"
NAMESPACE = "araopt"


class _ValidateBatch(beam.DoFn):
    def __init__(self, slice_columns: Sequence[str], value_columns: Sequence[str]):
        self._slice_columns = tuple(slice_columns)
        self._value_columns = tuple(value_columns)

    def setup(self):
        self._rows_read = Metrics.counter(NAMESPACE, "rows_read")
        self._rows_valid = Metrics.counter(NAMESPACE, "rows_valid")
        self._rejected = {r: Metrics.counter(NAMESPACE, f"rows_rejected_{r}") for r in REJECT_REASONS}

    def process(self, table: pa.Table):
        valid, rejected = validate_table(table, self._slice_columns, self._value_columns)
        self._rows_read.inc(table.num_rows)
        self._rows_valid.inc(valid.num_rows)
        if rejected.num_rows:
            reasons, counts = np.unique(np.asarray(rejected.column(REASON).to_pylist()), return_counts=True)
            for reason, count in zip(reasons, counts):
                self._rejected[str(reason)].inc(int(count))
            yield beam.pvalue.TaggedOutput(REJECTED, rejected)
        yield beam.pvalue.TaggedOutput("counts", (table.num_rows, rejected.num_rows))
        if valid.num_rows:
            yield valid


class ValidateConversions(beam.PTransform):
    """Batches -> outputs ``valid`` (tables), ``rejected`` (tables + ``reason``), ``counts`` (read, rejected)."""

    def __init__(self, slice_columns: Sequence[str], value_columns: Sequence[str]):
        super().__init__()
        self._slice_columns = tuple(slice_columns)
        self._value_columns = tuple(value_columns)

    def expand(self, batches):
        return batches | "ValidateRows" >> beam.ParDo(
            _ValidateBatch(self._slice_columns, self._value_columns)).with_outputs(REJECTED, "counts", main=VALID)


def sum_pairs(pairs):
    read = rejected = 0
    for a, b in pairs:
        read += a
        rejected += b
    return read, rejected


def counter_values(result) -> dict[str, int]:
    """Beam counters of a finished pipeline by name (committed, else attempted); {} if unsupported."""
    out: dict[str, int] = {}
    try:
        for c in result.metrics().query()["counters"]:
            out[c.key.metric.name] = out.get(c.key.metric.name, 0) + int(c.committed or c.attempted or 0)
    except Exception:  # noqa: BLE001 - some runners report no metrics; the pipeline's own accounting remains
        pass
    return out


def rejected_by_reason(result) -> dict[str, int]:
    """Rows sent to the dead letter, per reason, from the validation counters."""
    prefix = "rows_rejected_"
    return {k[len(prefix):]: v for k, v in counter_values(result).items() if k.startswith(prefix) and v}
