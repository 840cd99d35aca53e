"""The one Beam ``CombineFn`` of the project: every method delegates to a core combiner
(``araopt.combiner.Combiner``: the optimizer's statistics, the calibration accumulators, the per-key
integer sums of a release)."""
from __future__ import annotations

from typing import Any

import apache_beam as beam

from araopt.combiner import Combiner


class CombinerFn(beam.CombineFn):
    """A thin ``CombineFn`` over ``combiner``."""

    def __init__(self, combiner: Combiner[Any, Any, Any]):
        self._combiner = combiner

    def create_accumulator(self) -> Any:
        return self._combiner.create()

    def add_input(self, acc: Any, item: Any) -> Any:
        return self._combiner.add(acc, item)

    def merge_accumulators(self, accs: Any) -> Any:
        return self._combiner.merge(list(accs))

    def compact(self, acc: Any) -> Any:
        return self._combiner.compact(acc)

    def extract_output(self, acc: Any) -> Any:
        return self._combiner.extract(acc)
