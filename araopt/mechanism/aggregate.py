"""Per-key integer sums of kept contributions over a declared domain: pure, mergeable combiners.

Shards of complete impressions are encoded (HistogramContribution, Alg. 3 / Alg. 6) and capped
(ContributionCapping, Alg. 1) independently; each yields a ``DomainSums``: the (m, d+1) integer
histogram of kept contributions over the domain's slices, plus the record accounting. Records whose
slice is outside the declared domain are only counted, so the state never grows with the number of
distinct slice values in the input. ``merge`` adds sums up (associative, commutative, integer exact).

``SliceSet`` collects the distinct slices of the data, bounded by ``max_slices``: the data-derived
domain that only simulation mode may use. The Beam ``CombineFn`` wrappers live in
``transforms/aggregate.py``.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from araopt.errors import InvalidInput, PrivacyRefusal
from araopt.mechanism.keys import DATA, KeyDomain

DEFAULT_MAX_SLICES = 100_000
"""Default limit on the number of slices of a domain (declared or derived): ``--max-slices``."""


NO_CONVERSION = 2**63 - 1
"""``DomainSums.first_time_us`` of sums over no period row (later than any time)."""


def first_time(times: np.ndarray) -> int:
    """The earliest of the released rows' times (``NO_CONVERSION``: no row): what sums record of them."""
    return int(np.min(times)) if len(times) else NO_CONVERSION


def earliest(firsts: Iterable[int | None]) -> int | None:
    """The first time of merged sums: the earliest of the parts', unknown (None) when any part's is."""
    known = list(firsts)
    return None if None in known else min(t for t in known if t is not None)


@dataclass(frozen=True)
class DomainSums:
    """Integer sums of kept contributions per domain key, and the record accounting.

    ``rows = kept + capped + outside_domain`` counts the rows of the measured period: ``capped`` were
    dropped by Alg. 1, ``outside_domain`` were kept by Alg. 1 but their slice is not in the declared
    domain (never released). ``lookback_rows`` only consumed budget (earlier conversions of the same
    impressions, never counted); ``rows_before_lookback`` are period rows whose impression was shown
    before the earliest conversion the job saw, so earlier conversions of it may be missing and Alg. 1
    may keep more of it than the browser did (0 when impression times are unknown).
    """

    histogram: np.ndarray  # (m, d+1) int64, encoder column order
    kept: int
    capped: int
    outside_domain: int
    impressions: int
    lookback_rows: int = 0
    rows_before_lookback: int = 0
    grouping: str | None = None
    """The grouping by impression the sums were capped within (one ``EncodeBoundAndSum``'s token; None:
    in memory, one grouping): Alg. 1 caps an impression once per grouping, so sums of two are not merged."""
    simulated: bool = False
    """Encoded as a simulation (``simulation_seed``: seeded rounding, a lookback without a release history
    costed at today's parameters): such sums are noised only as a simulation (``release.release_step``)."""
    first_time_us: int | None = None
    """The earliest conversion time of the period's rows summed over (``NO_CONVERSION``: none; None:
    unknown, sums built without their times): the release step checks it against the domain's training
    window (``release.check_learnt_window``), whatever path made the sums."""

    @property
    def rows(self) -> int:
        return self.kept + self.capped + self.outside_domain


def empty(num_slices: int, num_columns: int) -> DomainSums:
    return DomainSums(np.zeros((num_slices, num_columns), dtype=np.int64), 0, 0, 0, 0, first_time_us=NO_CONVERSION)


def domain_sums(slice_index: np.ndarray, contributions: np.ndarray, kept: np.ndarray, num_slices: int,
                impressions: int = 0, in_period: np.ndarray | None = None,
                rows_before_lookback: int = 0, conversion_time: np.ndarray | None = None) -> DomainSums:
    """Sum kept contributions of the period's rows per domain slice (``slice_index`` -1: outside the
    domain), vectorized. Rows with ``in_period`` False (lookback) were capped with the rest but are
    neither summed nor counted as kept, capped or outside the domain. ``conversion_time``: the rows'
    times, whose earliest in the period the sums record (``DomainSums.first_time_us``; without them
    unknown, and the release step refuses them over a domain with a training window)."""
    slice_index = np.asarray(slice_index, dtype=np.int64)
    contributions = np.asarray(contributions)
    kept = np.asarray(kept, dtype=bool)
    period = np.ones(len(kept), dtype=bool) if in_period is None else np.asarray(in_period, dtype=bool)
    if contributions.ndim != 2 or not (len(slice_index) == len(kept) == len(period) == contributions.shape[0]):
        raise InvalidInput(f"contributions {contributions.shape}, slice_index {slice_index.shape}, kept "
                           f"{kept.shape} and in_period {period.shape} do not align")
    if contributions.size and contributions.dtype.kind not in "iu":
        raise InvalidInput(f"contributions must be integers, got dtype {contributions.dtype}")
    if slice_index.size and (slice_index.min() < -1 or slice_index.max() >= num_slices):
        raise InvalidInput(f"slice_index outside [-1, {num_slices})")
    inside = slice_index >= 0
    use = kept & inside & period
    # rows not used are added to an extra last row that is dropped (cheaper than selecting the used rows)
    hist = np.zeros((num_slices + 1, contributions.shape[1]), dtype=np.int64)
    target = np.where(use, slice_index, num_slices)
    values = contributions.astype(np.int64, copy=False)
    for col in range(contributions.shape[1]):
        # integer bincount: np.add.at is exact for int64 (no float weights, no 2^53 limit)
        np.add.at(hist[:, col], target, values[:, col])
    first: int | None = None
    if conversion_time is not None:
        times = np.asarray(conversion_time, dtype=np.int64)
        if len(times) != len(period):
            raise InvalidInput(f"conversion_time {times.shape} does not align with in_period {period.shape}")
        first = first_time(times[period])
    return DomainSums(hist[:num_slices], int(use.sum()), int((~kept & period).sum()),
                      int((kept & ~inside & period).sum()), int(impressions), int((~period).sum()),
                      int(rows_before_lookback), first_time_us=first)


def merge(parts: Iterable[DomainSums]) -> DomainSums:
    """Add up sums over the same domain (associative and commutative; integer exact)."""
    parts = [p for p in parts if p is not None]
    if not parts:
        raise InvalidInput("merge needs at least one DomainSums")
    shapes = {p.histogram.shape for p in parts}
    if len(shapes) != 1:
        raise InvalidInput(f"cannot merge sums over different domains: shapes {sorted(shapes)}")
    groupings = {p.grouping for p in parts}
    if len(groupings) != 1:
        raise PrivacyRefusal(f"cannot merge sums capped in {len(groupings)} groupings by impression (two "
                             f"EncodeBoundAndSum steps): Alg. 1 would keep an impression's budget once in each")
    if len({p.simulated for p in parts}) != 1:
        raise PrivacyRefusal("cannot merge the sums of a simulation with a release's")
    hist = parts[0].histogram.copy()
    for p in parts[1:]:
        hist += p.histogram
    return DomainSums(hist, sum(p.kept for p in parts), sum(p.capped for p in parts),
                      sum(p.outside_domain for p in parts), sum(p.impressions for p in parts),
                      sum(p.lookback_rows for p in parts), sum(p.rows_before_lookback for p in parts),
                      parts[0].grouping, parts[0].simulated, earliest(p.first_time_us for p in parts))


class TooManySlices(InvalidInput):
    """The data holds more distinct slices than ``max_slices`` (a data-derived domain, simulation only)."""


@dataclass(frozen=True)
class SliceSet:
    """Distinct slice-value rows seen so far (simulation-only data-derived domain), at most ``max_slices``."""

    slice_columns: tuple[str, ...]
    frame: pd.DataFrame
    max_slices: int

    def __post_init__(self) -> None:
        if len(self.frame) > self.max_slices:
            raise TooManySlices(
                f"the data holds more than {self.max_slices:,} distinct slices: refusing to build a domain that "
                f"large (raise --max-slices or declare a smaller domain)")


def slice_set(slices: Mapping[str, np.ndarray | Sequence[Any]], slice_columns: Sequence[str], max_slices: int) -> SliceSet:
    frame = pd.DataFrame({c: np.asarray(slices[c]) for c in slice_columns}).drop_duplicates(ignore_index=True)
    return SliceSet(tuple(slice_columns), frame, max_slices)


def merge_slice_sets(parts: Iterable[SliceSet]) -> SliceSet:
    parts = [p for p in parts if p is not None]
    if not parts:
        raise InvalidInput("merge needs at least one SliceSet")
    frames = [p.frame for p in parts if len(p.frame)]
    frame = pd.concat(frames, ignore_index=True).drop_duplicates(ignore_index=True) if frames else parts[0].frame
    return SliceSet(parts[0].slice_columns, frame, min(p.max_slices for p in parts))


def domain_of(slices: SliceSet, query_names: Sequence[str], baseline: bool,
              conversion_slice_columns: Sequence[str] = ()) -> KeyDomain:
    """SIMULATION ONLY: the domain of the slices present in the data."""
    cols = {c: slices.frame[c].to_numpy() for c in slices.slice_columns}
    return KeyDomain.from_slice_values(slices.slice_columns, cols, query_names, baseline, conversion_slice_columns, DATA)


class DomainSumsCombiner:
    """The ``araopt.combiner.Combiner`` of a release's per-key integer sums (``merge``); None before any input."""

    def create(self) -> DomainSums | None:
        return None

    def add(self, acc: DomainSums | None, item: DomainSums) -> DomainSums:
        return item if acc is None else merge([acc, item])

    def merge(self, accs: Sequence[DomainSums | None]) -> DomainSums | None:
        parts = [a for a in accs if a is not None]
        return merge(parts) if parts else None

    def compact(self, acc: DomainSums | None) -> DomainSums | None:
        return acc

    def extract(self, acc: DomainSums | None) -> DomainSums | None:
        return acc


class SliceSetCombiner:
    """The ``araopt.combiner.Combiner`` of the distinct slices of the data (SIMULATION ONLY: a domain
    derived from the data), from batches of slice columns; None before any input."""

    def __init__(self, slice_columns: Sequence[str], max_slices: int) -> None:
        self.slice_columns = tuple(slice_columns)
        self.max_slices = max_slices

    def create(self) -> SliceSet | None:
        return None

    def add(self, acc: SliceSet | None, item: Mapping[str, Any]) -> SliceSet:
        part = slice_set(item, self.slice_columns, self.max_slices)
        return part if acc is None else merge_slice_sets([acc, part])

    def merge(self, accs: Sequence[SliceSet | None]) -> SliceSet | None:
        parts = [a for a in accs if a is not None]
        return merge_slice_sets(parts) if parts else None

    def compact(self, acc: SliceSet | None) -> SliceSet | None:
        return acc

    def extract(self, acc: SliceSet | None) -> SliceSet | None:
        return acc
