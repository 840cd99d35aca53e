"""The calibration's accumulator, a pure combiner (``create_accumulator`` / ``add_conversions`` /
``merge_accumulators`` / ``compact`` / ``extract_output``): per (slice, block) cell 1 + 6 (d+1) sums
(clusters; per quantity T, X, sum t^2, sum t x, sum x^2, loss clusters): O(slices x blocks x queries),
whatever the number of conversions (the model: ``calibration.model``)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from araopt.calibration.model import retention_checksum
from araopt.errors import InvalidInput
from araopt.io.conversions import Conversions
from araopt.mechanism.bounding import ImpressionRanks, kept_mask_ordered
from araopt.mechanism.encoding import check_values, expected_contribution, query_scales
from araopt.mechanism.keys import register_slices, slice_sort_key
from araopt.mechanism.params import Params

_BLOCK_SHIFT = 32
_MOMENTS = ("T", "X", "Stt", "Stx", "Sxx", "L")


def _ncols(num_queries: int) -> int:
    return 1 + len(_MOMENTS) * (num_queries + 1)


def _col(q: int, what: str) -> int:
    """Column of quantity q (0 = count) in the cell layout: clusters, then per q the sums ``_MOMENTS``."""
    return 1 + len(_MOMENTS) * q + _MOMENTS.index(what)


# ================================================================================================
# The accumulator (pure combiner: create / add / merge / compact / extract)
# ================================================================================================

@dataclass
class CalibrationAccumulator:
    """Combiner state for fixed ``params``: per (slice, block) cell the sums of the model's clusters.

    Cell values (``_col``): number of clusters; per quantity (count, q_1..q_d): T = sum t_i,
    X = sum x_i, sum t_i^2, sum t_i x_i, sum x_i^2. Size after ``compact``: <= slices x blocks cells.
    ``fitted_for``: the checksum of the parameter file being calibrated (recorded in the calibration).
    """

    params: Params
    slice_columns: tuple[str, ...]
    fitted_for: str
    slice_ids: dict[tuple[Any, ...], int] = field(default_factory=dict)
    block_ids: dict[Any, int] = field(default_factory=dict)
    keys: list[np.ndarray] = field(default_factory=list)
    vals: list[np.ndarray] = field(default_factory=list)
    num_conversions: int = 0


def create_accumulator(params: Params, slice_columns: Sequence[str] | None = None,
                       fitted_for: str | None = None) -> CalibrationAccumulator:
    """An empty accumulator for ``params`` (slices: ``params.slice_columns`` unless given); ``fitted_for``:
    the checksum of the parameter file (``version.ParameterVersion.checksum``) the calibration is for
    (default: the parameters' retention checksum)."""
    cols = tuple(params.slice_columns if slice_columns is None else slice_columns)
    return CalibrationAccumulator(params=params, slice_columns=cols,
                                  fitted_for=retention_checksum(params) if fitted_for is None else fitted_for)


def retained_values(conversions: Conversions, params: Params,
                    ranks: ImpressionRanks | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(kept mask, (n, d) expected retained value per record in query units; 0 where not kept).

    Kept: ``error_model.kept_mask`` with the pipeline's tie-break ``Conversions.record_keys()``
    (L-inf Alg. 3 / L1 Alg. 6: rank < K(C); baseline: expected-norm approximation). Retained value:
    E[w_l] C_l / scale_l (L-inf: min(v, C_l); L1: the shrunk value), as in ``error_model``.
    ``ranks``: that order, if already computed (``ImpressionRanks.of(conversions, record_keys())``).
    """
    vals = check_values(conversions.values, params.num_queries)
    if ranks is None:
        ranks = ImpressionRanks.of(conversions, conversions.record_keys())
    kept = kept_mask_ordered(conversions, params, ranks)
    out = np.zeros_like(vals)
    if kept.any():
        thresholds = np.array([q.clip_threshold for q in params.queries], dtype=np.float64)
        unit = thresholds / query_scales(params)
        out[kept] = expected_contribution(vals[kept], params) * unit[None, :]
    return kept, out


@dataclass(frozen=True, eq=False)
class PreparedBatch:
    """What the calibration needs of a batch whatever the parameters, computed once for all candidates:
    Alg. 1's order (one record hash and one sort), the period's rows, their (slice, block) registry and
    the clusters (impression, slice, block) with their true sums. ``add_prepared`` then costs a few
    passes over the rows per candidate instead of a hash, a sort and a factorisation."""

    conversions: Conversions
    ranks: ImpressionRanks
    inside: np.ndarray | None  # period rows (None: all)
    slice_columns: tuple[str, ...]
    slice_ids: dict[tuple[Any, ...], int]
    block_ids: dict[Any, int]
    order: np.ndarray  # period rows by (impression, slice, block)
    starts: np.ndarray  # first row of every cluster along ``order``
    truth: np.ndarray  # (clusters, 1 + d): conversions and value sums per cluster
    cell_keys: np.ndarray  # distinct (slice << 32 | block) keys
    cell_index: np.ndarray  # cluster -> index into cell_keys

    @classmethod
    def of(cls, conversions: Conversions, block_ids: Any, slice_columns: Sequence[str],
           value_columns: Sequence[str]) -> PreparedBatch:
        if tuple(conversions.value_columns) != tuple(value_columns):
            raise InvalidInput(f"conversions carry value columns {conversions.value_columns}, "
                               f"params expect {tuple(value_columns)}")
        missing = [c for c in slice_columns if c not in conversions.slices]
        if missing:
            raise InvalidInput(f"conversions lack slice column(s) {missing}")
        n = len(conversions)
        blocks = np.asarray(block_ids)
        if blocks.ndim != 1 or len(blocks) != n:
            raise InvalidInput(f"block_ids must be one id per record ({n}), got shape {blocks.shape}")
        if n and pd.isna(pd.Series(blocks)).any():
            raise InvalidInput("block_ids must not be null / NaN")
        ranks = ImpressionRanks.of(conversions, conversions.record_keys() if n else None)
        inside = None
        period = conversions
        if conversions.in_period is not None:  # only the period's rows are counted
            inside = conversions.period_mask()
            period, blocks = conversions.take(np.flatnonzero(inside)), blocks[inside]
        m = len(period)
        slice_ids: dict[tuple[Any, ...], int] = {}
        block_registry: dict[Any, int] = {}
        sid = register_slices([period.slices[c] for c in slice_columns], slice_ids, m)
        bid = register_slices([blocks], block_registry, m, bare=True)
        # the ids' integer sort keys (one per distinct id, carried by the batch): the same labels, in order of
        # first appearance, as the ids themselves, without hashing every string again
        imp = pd.factorize(period.impression_sort_keys(), sort=False)[0].astype(np.int64)
        order = np.lexsort((bid, sid, imp))
        imp_o, sid_o, bid_o = imp[order], sid[order], bid[order]
        starts = np.flatnonzero(np.r_[True, (imp_o[1:] != imp_o[:-1]) | (sid_o[1:] != sid_o[:-1])
                                      | (bid_o[1:] != bid_o[:-1])]) if m else np.zeros(0, dtype=np.int64)
        vals = check_values(period.values, len(value_columns))
        truth = (np.add.reduceat(np.column_stack([np.ones(m), vals])[order], starts, axis=0) if m
                 else np.zeros((0, 1 + len(value_columns))))
        cell = (sid_o[starts] << _BLOCK_SHIFT) | bid_o[starts]
        cell_keys, cell_index = np.unique(cell, return_inverse=True)
        return cls(conversions, ranks, inside, tuple(slice_columns), slice_ids, block_registry, order, starts, truth,
                   cell_keys.astype(np.int64), cell_index.reshape(-1))


def add_prepared(acc: CalibrationAccumulator, batch: PreparedBatch) -> CalibrationAccumulator:
    """``add_conversions`` of a prepared batch (same result): only what Alg. 1 keeps and retains depends
    on the accumulator's parameters."""
    params = acc.params
    if batch.slice_columns != acc.slice_columns or params.query_columns != tuple(batch.conversions.value_columns):
        raise InvalidInput("the prepared batch was made for other slice or value columns")
    if len(batch.order) == 0:
        return acc
    kept, retained = retained_values(batch.conversions, params, batch.ranks)  # Alg. 1 over period and lookback
    if batch.inside is not None:
        kept, retained = kept[batch.inside], retained[batch.inside]
    if acc.slice_ids or acc.block_ids:  # an accumulator with earlier parts: map the batch's local ids to its own
        smap = np.array([acc.slice_ids.setdefault(k, len(acc.slice_ids)) for k in batch.slice_ids], dtype=np.int64)
        bmap = np.array([acc.block_ids.setdefault(k, len(acc.block_ids)) for k in batch.block_ids], dtype=np.int64)
        keys = (smap[batch.cell_keys >> _BLOCK_SHIFT] << _BLOCK_SHIFT) | bmap[batch.cell_keys & ((1 << _BLOCK_SHIFT) - 1)]
        remapped = True
    else:
        remapped = False
        acc.slice_ids.update(batch.slice_ids)
        acc.block_ids.update(batch.block_ids)
        keys = batch.cell_keys
    d = params.num_queries
    x = np.column_stack([kept.astype(np.float64), retained])[batch.order]
    xc = np.add.reduceat(x, batch.starts, axis=0)
    tc = batch.truth
    cols = [np.ones(len(batch.starts))]
    for q in range(d + 1):
        a, b = tc[:, q], xc[:, q]
        cols += [a, b, a * a, a * b, b * b, (b < a * (1.0 - 1e-12)).astype(np.float64)]
    vals = np.column_stack(cols)
    out = np.empty((len(keys), vals.shape[1]))
    for c in range(vals.shape[1]):
        out[:, c] = np.bincount(batch.cell_index, weights=vals[:, c], minlength=len(keys))
    if remapped:  # keep the keys sorted, as ``_reduce`` leaves them
        k_order = np.argsort(keys)
        keys, out = keys[k_order], out[k_order]
    acc.keys.append(keys)
    acc.vals.append(out)
    acc.num_conversions += len(batch.order)
    if len(acc.keys) > 8:
        compact(acc)
    return acc


def add_conversions(acc: CalibrationAccumulator, conversions: Conversions, block_ids: Any) -> CalibrationAccumulator:
    """Add a batch holding ALL conversions of each of its impressions, with a block id per record
    (lookback rows, ``in_period`` False, are capped with the rest and then left out).

    Block ids are any hashable scalars (a day index, a date string); blocks are ordered by their
    sorted ids (consecutive blocks = consecutive periods). Returns ``acc``.
    """
    return add_prepared(acc, PreparedBatch.of(conversions, block_ids, acc.slice_columns, acc.params.query_columns))


def _reduce(keys: np.ndarray, vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    uniq, inv = np.unique(keys, return_inverse=True)
    inv = inv.reshape(-1)
    out = np.empty((len(uniq), vals.shape[1]))
    for c in range(vals.shape[1]):
        out[:, c] = np.bincount(inv, weights=vals[:, c], minlength=len(uniq))
    return uniq.astype(np.int64), out


def compact(acc: CalibrationAccumulator) -> CalibrationAccumulator:
    """Sum pending parts with equal (slice, block) keys; returns ``acc`` (size <= slices x blocks)."""
    if len(acc.keys) > 1:
        k, v = _reduce(np.concatenate(acc.keys), np.concatenate(acc.vals))
        acc.keys, acc.vals = [k], [v]
    return acc


def merge_accumulators(accumulators: Sequence[CalibrationAccumulator]) -> CalibrationAccumulator:
    """Merge accumulators of the same parameters and slice columns (local ids remapped); compacted."""
    accs = list(accumulators)
    if not accs:
        raise InvalidInput("merge_accumulators needs at least one accumulator")
    first = accs[0]
    if any(retention_checksum(a.params) != retention_checksum(first.params) or a.slice_columns != first.slice_columns
           or a.params.query_columns != first.params.query_columns or a.fitted_for != first.fitted_for for a in accs):
        raise InvalidInput("cannot merge calibration accumulators of different parameters or slice columns")
    out = create_accumulator(first.params, first.slice_columns, first.fitted_for)
    for a in accs:
        smap = np.empty(max(1, len(a.slice_ids)), dtype=np.int64)
        for key, local in a.slice_ids.items():
            smap[local] = out.slice_ids.setdefault(key, len(out.slice_ids))
        bmap = np.empty(max(1, len(a.block_ids)), dtype=np.int64)
        for key, local in a.block_ids.items():
            bmap[local] = out.block_ids.setdefault(key, len(out.block_ids))
        for k, v in zip(a.keys, a.vals, strict=True):
            out.keys.append((smap[k >> _BLOCK_SHIFT] << _BLOCK_SHIFT) | bmap[k & ((1 << _BLOCK_SHIFT) - 1)])
            out.vals.append(v)
        out.num_conversions += a.num_conversions
    return compact(out)


@dataclass(frozen=True, eq=False)
class CalibrationStatistics:
    """Extracted cell sums, slices and blocks in canonical (sorted) order: ``cells`` (m, B, 1 + 5(d+1))."""

    params: Params
    slice_columns: tuple[str, ...]
    slice_keys: tuple[tuple[Any, ...], ...]
    block_keys: tuple[Any, ...]
    cells: np.ndarray
    num_conversions: int
    fitted_for: str = ""

    @property
    def num_queries(self) -> int:
        return self.params.num_queries

    def quantity(self, q: int, what: str) -> np.ndarray:
        """(m, B) array of T, X, Stt, Stx or Sxx of quantity q (0 = count)."""
        return self.cells[:, :, _col(q, what)]

    def ratios(self) -> np.ndarray:
        """Raw (unshrunk) historical ratio per slice and quantity (m, d+1); NaN where T = 0."""
        T = self.cells[:, :, [_col(q, "T") for q in range(self.num_queries + 1)]].sum(axis=1)
        X = self.cells[:, :, [_col(q, "X") for q in range(self.num_queries + 1)]].sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(T > 0, X / np.where(T > 0, T, 1.0), np.nan)


def extract_output(acc: CalibrationAccumulator) -> CalibrationStatistics:
    """Dense cell sums in canonical order; independent of batching and merge order (up to float sums)."""
    compact(acc)
    d = acc.params.num_queries
    skeys = sorted(acc.slice_ids, key=slice_sort_key)
    bkeys = sorted(acc.block_ids, key=lambda b: (type(b).__name__, b))
    smap = np.empty(max(1, len(skeys)), dtype=np.int64)
    for new, key in enumerate(skeys):
        smap[acc.slice_ids[key]] = new
    bmap = np.empty(max(1, len(bkeys)), dtype=np.int64)
    for new, key in enumerate(bkeys):
        bmap[acc.block_ids[key]] = new
    cells = np.zeros((len(skeys), len(bkeys), _ncols(d)))
    if acc.keys:
        k, v = acc.keys[0], acc.vals[0]
        cells[smap[k >> _BLOCK_SHIFT], bmap[k & ((1 << _BLOCK_SHIFT) - 1)]] = v
    return CalibrationStatistics(acc.params, acc.slice_columns, tuple(skeys), tuple(bkeys), cells, int(acc.num_conversions),
                                 acc.fitted_for)


def calibration_statistics(conversions: Conversions, params: Params, block_ids: Any,
                           slice_columns: Sequence[str] | None = None,
                           fitted_for: str | None = None) -> CalibrationStatistics:
    """Convenience: one batch (all conversions of every impression) -> extracted statistics."""
    return extract_output(add_conversions(create_accumulator(params, slice_columns, fitted_for), conversions,
                                          block_ids))


IMPRESSION_TIME = "impression_time"
"""Optional column of the conversion log: when every input file has it, blocks are impression days."""
HASH_BLOCKS = 7
"""Without impression times: this many disjoint random parts of the window (by impression id)."""


def history_blocks(conversions: Conversions, impression_time_us: np.ndarray | None = None) -> np.ndarray:
    """Block id per record: the UTC day of its impression (``impression_time_us``, int64 microseconds)
    when known, else one of ``HASH_BLOCKS`` disjoint random parts of the window by a stable hash of the
    impression id. Either way an impression stays in one block, and blocks do not depend on how many
    conversions an impression has (a block by first-conversion day would: impressions with many
    conversions convert early, which makes the ratio depend on the block)."""
    if impression_time_us is not None:
        return np.floor_divide(np.asarray(impression_time_us, dtype=np.int64), 86_400_000_000)
    return (conversions.id_hashes() % np.uint64(HASH_BLOCKS)).astype(np.int64)


def day_blocks(conversions: Conversions, times: np.ndarray | None = None) -> np.ndarray:
    """Block id = UTC day index of ``times`` (default: the conversion times, int64 microseconds)."""
    t = np.asarray(conversions.conversion_time if times is None else times, dtype=np.int64)
    return np.floor_divide(t, 86_400_000_000)




def accumulate_candidates(conversions: Conversions, candidates: Sequence[tuple[Params, str]],
                          slice_columns: Sequence[str]) -> tuple[CalibrationAccumulator, ...]:
    """One batch (all conversions of each of its impressions; blocks are their UTC days) accumulated
    for each candidate (parameters, checksum of their parameter version)."""
    return candidates_accumulators(conversions, candidates, day_blocks(conversions), slice_columns)


def candidates_accumulators(conversions: Conversions, candidates: Sequence[tuple[Params, str]], block_ids: Any,
                            slice_columns: Sequence[str] | None = None) -> tuple[CalibrationAccumulator, ...]:
    """One batch accumulated for each candidate (parameters, checksum of their version), its order, ranks
    and clusters computed once (``PreparedBatch``); ``slice_columns`` default: the first candidate's."""
    if not candidates:
        return ()
    accs = [create_accumulator(params, slice_columns, fitted_for) for params, fitted_for in candidates]
    batch = PreparedBatch.of(conversions, block_ids, accs[0].slice_columns, accs[0].params.query_columns)
    return tuple(add_prepared(acc, batch) for acc in accs)


def candidates_statistics(conversions: Conversions, candidates: Sequence[tuple[Params, str]], block_ids: Any,
                          slice_columns: Sequence[str] | None = None) -> list[CalibrationStatistics]:
    """``calibration_statistics`` of every candidate (parameters, version checksum) on one batch, the
    parameter-free work done once."""
    return [extract_output(a) for a in candidates_accumulators(conversions, candidates, block_ids, slice_columns)]


class CandidatesCombiner:
    """The ``araopt.combiner.Combiner`` of the calibration of several candidates at once: its inputs and
    accumulators are tuples of ``CalibrationAccumulator`` (one per candidate, ``accumulate_candidates``),
    its output the tuple of their ``CalibrationStatistics``; None before any input."""

    def create(self) -> tuple[CalibrationAccumulator, ...] | None:
        return None

    def add(self, acc: tuple[CalibrationAccumulator, ...] | None,
            item: tuple[CalibrationAccumulator, ...]) -> tuple[CalibrationAccumulator, ...]:
        return item if acc is None else tuple(merge_accumulators([a, b]) for a, b in zip(acc, item, strict=True))

    def merge(self, accs: Sequence[tuple[CalibrationAccumulator, ...] | None]
              ) -> tuple[CalibrationAccumulator, ...] | None:
        parts = [a for a in accs if a is not None]
        if not parts:
            return None
        return tuple(merge_accumulators(list(group)) for group in zip(*parts, strict=True))

    def compact(self, acc: tuple[CalibrationAccumulator, ...] | None) -> tuple[CalibrationAccumulator, ...] | None:
        return None if acc is None else tuple(compact(a) for a in acc)

    def extract(self, acc: tuple[CalibrationAccumulator, ...] | None) -> tuple[CalibrationStatistics, ...] | None:
        return None if acc is None else tuple(extract_output(a) for a in acc)
