"""The one protocol of the core's mergeable combiners (the statistics of the optimizer, the calibration
accumulators, the per-key sums of a release): an engine runs any of them with one generic wrapper
(``transforms.combine.CombinerFn``). Each method may modify and return its accumulator; ``merge`` and
``add`` are associative and commutative up to float sums; ``extract`` does not depend on how the
input was split or merged."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

A = TypeVar("A")
I_contra = TypeVar("I_contra", contravariant=True)
O_co = TypeVar("O_co", covariant=True)


class Combiner(Protocol[A, I_contra, O_co]):
    """create -> add* -> merge* -> compact? -> extract."""

    def create(self) -> A: ...

    def add(self, acc: A, item: I_contra) -> A: ...

    def merge(self, accs: Sequence[A]) -> A: ...

    def compact(self, acc: A) -> A: ...

    def extract(self, acc: A) -> O_co: ...
