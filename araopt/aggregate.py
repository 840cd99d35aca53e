"""Per-slice integer sums of kept contributions: a pure, mergeable combiner (no Beam).

Shards of complete impressions are encoded and bounded independently; each yields a
``SliceSums`` (one row per slice seen: integer sums of the d+1 encoder columns over kept records,
plus the record accounting). ``merge`` adds them up by slice; ``histogram`` lays the result over the
declared key domain (every domain key gets a value, zero if no contribution). The Beam
``CombineFn`` in ``transforms/aggregate.py`` is a thin wrapper around these functions.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from .conversions import Conversions
from .keys import KeyDomain

ACCOUNTING = ("rows", "kept", "capped")


@dataclass(frozen=True)
class SliceSums:
    """Slice columns + ``w0..wd`` (int64 sums of kept contributions) + rows/kept/capped counts."""

    slice_columns: tuple[str, ...]
    num_columns: int
    frame: pd.DataFrame

    @property
    def weight_columns(self) -> list[str]:
        return [f"w{c}" for c in range(self.num_columns)]

    @property
    def rows(self) -> int:
        return int(self.frame["rows"].sum()) if len(self.frame) else 0

    @property
    def kept(self) -> int:
        return int(self.frame["kept"].sum()) if len(self.frame) else 0

    @property
    def capped(self) -> int:
        return int(self.frame["capped"].sum()) if len(self.frame) else 0


def empty(slice_columns: Sequence[str], num_columns: int) -> SliceSums:
    cols = list(slice_columns) + [f"w{c}" for c in range(num_columns)] + list(ACCOUNTING)
    return SliceSums(tuple(slice_columns), num_columns, pd.DataFrame({c: pd.Series(dtype="int64") for c in cols}))


def slice_sums(conversions: Conversions, contributions: np.ndarray, kept: np.ndarray) -> SliceSums:
    """Sum kept contributions per slice of one shard (vectorized groupby), with accounting."""
    slice_columns = conversions.slice_columns
    k = contributions.shape[1]
    data = {c: conversions.slices[c] for c in slice_columns}
    masked = np.where(kept[:, None], contributions, 0)
    for c in range(k):
        data[f"w{c}"] = masked[:, c]
    data["rows"] = np.ones(len(kept), dtype=np.int64)
    data["kept"] = kept.astype(np.int64)
    data["capped"] = (~kept).astype(np.int64)
    frame = pd.DataFrame(data)
    if not slice_columns:
        return SliceSums((), k, frame.sum().to_frame().T.astype("int64"))
    grouped = frame.groupby(list(slice_columns), sort=False, dropna=False).sum().reset_index()
    return SliceSums(tuple(slice_columns), k, grouped)


def merge(parts: Iterable[SliceSums]) -> SliceSums:
    """Add up slice sums (associative and commutative; integer exact)."""
    parts = [p for p in parts if p is not None]
    if not parts:
        raise ValueError("merge needs at least one SliceSums")
    first = parts[0]
    frames = [p.frame for p in parts if len(p.frame)]
    if not frames:
        return first
    frame = pd.concat(frames, ignore_index=True)
    if first.slice_columns:
        frame = frame.groupby(list(first.slice_columns), sort=True, dropna=False).sum().reset_index()
    else:
        frame = frame.sum().to_frame().T.astype("int64")
    return SliceSums(first.slice_columns, first.num_columns, frame)


@dataclass(frozen=True)
class DomainHistogram:
    """The summed contributions over a declared domain, and what fell outside it."""

    histogram: np.ndarray  # (m, d+1) int64
    rows_outside_domain: int  # kept records whose slice is not in the domain (not released)
    slices_outside_domain: int


def histogram(sums: SliceSums, domain: KeyDomain) -> DomainHistogram:
    """Lay per-slice sums over the domain: every domain slice gets a row (zeros if unseen)."""
    m = domain.num_slices
    hist = np.zeros((m, sums.num_columns), dtype=np.int64)
    if not len(sums.frame):
        return DomainHistogram(hist, 0, 0)
    if sums.slice_columns:
        idx = domain.slice_index({c: sums.frame[c].to_numpy() for c in sums.slice_columns})
    else:
        idx = np.zeros(len(sums.frame), dtype=np.int64)
    inside = idx >= 0
    weights = sums.frame[sums.weight_columns].to_numpy(dtype=np.int64)
    np.add.at(hist, idx[inside], weights[inside])
    outside = ~inside
    return DomainHistogram(hist, int(sums.frame["kept"].to_numpy()[outside].sum()), int(outside.sum()))


def domain_from_sums(sums: SliceSums, query_names: Sequence[str], baseline: bool,
                     conversion_slice_columns: Sequence[str] = ()) -> KeyDomain:
    """Simulation default: the domain of the slices present in the (valid) input."""
    cols = {c: sums.frame[c].to_numpy() for c in sums.slice_columns}
    return KeyDomain.from_slice_values(sums.slice_columns, cols, query_names, baseline, conversion_slice_columns)
