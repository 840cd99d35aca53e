"""Calibration from history: estimates of the TRUE totals from the capped-and-clipped ones (issue 12).

ReconstructValues (Alg. 4) is unbiased for the capped-and-clipped sum X_lj = sum over the conversions
that ContributionCapping (Alg. 1) keeps of the clipped value (count: 1), not for the true total
T_lj = V_D(q_l)_j of Sec. 3.2. For FIXED parameters (C, C_l, alpha_l, encoding) the loss is
predictable: the retention ratio R_lj = X_lj / T_lj (count: kept / all conversions; value query l:
E[clipped kept value] / true value) is stable over time, and T_hat = U / r_hat estimates T.

Model (per query l, computed separately for the count and every value query)
  A "cluster" i is one (impression, slice, block); t_i = its true total, x_i = what Alg. 1 keeps of it
  (the mean of the encoding, ``encoding.expected_contribution`` in query units; count: kept records).
  Slice j, block b (a day, or any disjoint part of the history window):
      r_jb = X_jb / T_jb = rho_j + delta_b + gamma_jb + e_jb,
  rho_j the slice's long-run ratio, delta_b a period effect common to all slices (e.g. day of week),
  gamma_jb a slice x period interaction (variance s2_gamma), e_jb the sampling error of a ratio of
  sums over clusters: Var(e_jb) ~= sum_i (x_i - rho_j t_i)^2 / T_jb^2 = kappa_j / N_jb, with
  kappa_j = N_j sum_i (x_i - r_j t_i)^2 / T_j^2 the per-conversion "ratio sampling factor" (N = number
  of conversions; delta method for a ratio of sums of independent clusters).
  * kappa_j is estimated per slice (with the small-sample factor M/(M-1), M = clusters), blended with
    the pooled kappa by a pseudo-count of ``KAPPA_PSEUDO_CONVERSIONS`` conversions and never taken
    below the pooled kappa (with rare losses most slices show none in their history, which does not
    mean they cannot lose). The shrinkage below uses the pooled kappa: a slice's own kappa is
    correlated with its ratio (no loss -> kappa ~ 0 -> huge weight) and would bias mu toward 1.
  * The loss-event rate p_j (clusters that lose anything, per conversion; blended like kappa) gives
    the probability that a measured period loses nothing at all: exp(-p_j N).
  * Period effects: the composition-adjusted block deviation delta_b = sum_j (X_jb - r_j T_jb) / T_b
    with sampling variance sum_j SS_jb / T_b^2. For a measured period of P consecutive blocks, the
    variance of its deviation is estimated by method of moments over all windows of P consecutive
    blocks (mean of delta_W^2 minus its sampling variance), corrected for the estimated grand mean
    (x (1 + P/B) / (1 - P/B)); this captures cycles (a whole week cancels a day-of-week effect) and
    autocorrelation. When B < 2P it falls back to independent blocks: s2_1 (1/P + 1/B).
  * s2_gamma by method of moments over the cells' residuals r_jb - r_j - delta_b, minus their
    sampling variances (weights N_jb; slices seen in >= 2 blocks, cells with >= 20 clusters: the
    delta-method variance of a ratio over a handful of heavy-tailed clusters is biased low).
  * Shrinkage (empirical Bayes, random-effects meta-analysis): the slice's historical ratio r_j has
    sampling variance s_j^2 = kappa_j / N_j + s2_gamma / B_j. The between-slice variance of rho_j,
    s2_slice, is the DerSimonian-Laird method-of-moments estimate; the pooled ratio mu is the
    random-effects weighted mean (Var(mu) = 1 / sum_j 1/(s_j^2 + s2_slice)). Then
        r_hat_j = mu + (1 - B_j)(r_j - mu),   B_j = s_j^2 / (s_j^2 + s2_slice),
        Var(rho_j | history) = (1 - B_j) s_j^2 + B_j^2 Var(mu)
    (tiny slice -> mu, huge slice -> its own ratio). s2_slice = 0 shrinks every slice to mu.
  * Slices absent from history (or without any value of a query) use mu with variance
    s2_slice_upper + Var(mu), s2_slice_upper the DerSimonian-Laird estimate with Q replaced by
    Q + 1.645 sqrt(2 (k - 1)) (a one-sided ~95 % bound; > 0 even when s2_slice = 0), so an unseen
    slice always gets a wider uncertainty than any seen one. One observed slice only: ((1 - mu)/2)^2.

Correction (``correct``) of an estimate U (Alg. 4, standard error se) of slice j, query l, for a
measured period of P blocks:
    T_hat = U / r_hat,
    Var(r_hat - R_period) = Var(rho_j | history) + V_period(P) + s2_gamma / P + kappa_j / N_hat,
    std_error^2 = se^2 / r_hat^2 + X2 Var(r_hat - R_period) / r_hat^4      (delta method),
with X2 = max(U^2 - se^2, 0) the unbiased estimate of X^2 (U^2 itself carries the noise's variance),
with N_hat = max(1, U_count / r_hat_count) the corrected count estimate of the slice's conversions in
the measured period: the realized ratio of the measured period fluctuates around rho_j by kappa/N,
which dominates at large epsilon. The interval is not symmetric: the period's loss D = T - X >= 0
is a sum of rare, large events when C is well above the typical impression (the (C+1)-th conversion
of a few impressions), so D is modelled as 0 with probability exp(-p_j N_hat) and otherwise a gamma,
with mean U (1 - r_hat) / r_hat and variance U^2 kappa_j / (N_hat r_hat^4); it is convolved with a
normal for the rest (noise and rounding se / r_hat, the long-run ratio error) and the interval is
T_hat + [2.5 %, 97.5 %] quantiles of that sum minus its mean (``convolved_loss_quantiles``). For
U <= 0 the interval is the symmetric normal one. r_hat lies in [MIN_RATIO, 1] and each side is at
least z se / r_hat >= z se: never narrower than the uncorrected interval's noise part, and nothing
is divided by zero.

Assumptions and what is NOT covered
  * The measured period behaves like the history (same C, C_l, alpha_l: checked by a checksum; same
    mix of impressions, conversions per impression and values, up to the modelled random effects).
    A trend or a shift outside the history's range is not covered. A deterministic cycle is modelled
    as random: a period that averages over whole cycles is right; a single day of a weekly cycle
    gets the day-to-day variance (conservative for that weekday; fit on that weekday's blocks only,
    ``fit_calibration(..., blocks=...)``, for a sharper interval).
  * Batches must hold all conversions of each of their impressions (as for the statistics): Alg. 1
    keeps per impression. Clusters are assumed independent (impressions are).
  * Uncertainty of s2_slice, s2_gamma and kappa themselves is ignored (plug-in); the delta method
    and the zero-inflated gamma are approximations (poor for slices with a handful of conversions).
  * The baseline encoding (Sec. 5.1) keeps records by their realised, randomly rounded norms; the
    calibration uses ``error_model.kept_mask``'s expected-norm decision (documented approximation).

Accumulator (``create_accumulator`` / ``add_conversions`` / ``merge_accumulators`` / ``compact`` /
``extract_output``, then ``fit_calibration``): per (slice, block) cell 1 + 6 (d+1) sums (clusters; per
quantity T, X, sum t^2, sum t x, sum x^2, loss clusters): O(slices x blocks x queries), whatever the
number of conversions.

Error model of the corrected estimator (``corrected_breakdown``, ``optimize_corrected``): from the
optimizer's ``SufficientStatistics`` for any (C, C_l, alpha_l) (L-inf, Alg. 3; L1 Alg. 6 with d = 1
and randomized rounding is the same). MSE_lj ~= Var(U_lj) / r_lj^2 + T_lj^2 (Var(rho_j | history) +
V_period + kappa_l / N_j) / r_lj^2: the first term is the inflated noise + rounding variance; the
second the ratio error, reported as a residual bias (root mean square, sign unknown) for the
history part and a variance for the sampling part. kappa_l is computed from the statistics'
impression-size histogram and value moments assuming values i.i.d. within an impression and
independent of rank; Var(rho_j | history) by the same empirical Bayes formulas on the slices.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pandas as pd
from scipy import special as sp_special
from scipy import stats as sp_stats

from . import jsonio
from .bounding import kept_per_impression
from .conversions import Conversions
from .encoding import check_values, expected_contribution, query_scales
from .error_model import ErrorBreakdown, kept_mask, rmsre_tau
from .files import atomic_write_bytes, read_bytes
from .keys import KeyDomain
from .noise import discrete_laplace_variance, noise_parameter
from .params import Params, QueryParams, check_epsilon
from .report import Estimates, estimate_variance, nonnegative_interval
from .statistics import SufficientStatistics, count_kappa, value_kappa

CALIBRATION_FORMAT = "araopt.calibration/1"
METHOD = "empirical-bayes-ratio/1"
MIN_RATIO = 1e-6
"""Ratios are clipped to [MIN_RATIO, 1]: a slice never gets divided by (almost) zero."""
KAPPA_PSEUDO_CONVERSIONS = 1000.0
"""Pseudo-count (conversions) with which the pooled ratio sampling factor kappa enters a slice's kappa."""
MIN_INTERACTION_CLUSTERS = 20
"""Cells with fewer clusters do not enter the slice x block interaction estimate: the delta-method
variance of a ratio over a handful of heavy-tailed clusters is biased low, which would show up as a
spurious interaction."""
_Z95_ONE_SIDED = 1.6448536269514722
_BLOCK_SHIFT = 32
_COUNT = "count"


def retention_checksum(params: Params) -> str:
    """sha256 of what decides the retention ratios: encoding, C, Gamma, C_l, alpha_l, l1_rounding.

    Epsilon, taus and provenance do not change what Alg. 1 keeps or how values are clipped, so a
    calibration stays valid for the same bounding at another epsilon.
    """
    data = {
        "encoding": params.encoding, "count_limit": params.count_limit,
        "contribution_budget": params.contribution_budget,
        "count_budget_fraction": params.count_budget_fraction,
        "l1_rounding": params.l1_rounding if params.encoding == "l1" else None,
        "queries": [[q.column, float(q.clip_threshold), q.budget_fraction] for q in params.queries],
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode("utf-8")).hexdigest()


def _python_scalar(v: Any) -> Any:
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def _sort_key(key: tuple[Any, ...]) -> tuple[tuple[str, Any], ...]:
    return tuple((type(v).__name__, v) for v in key)


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
    """

    params: Params
    slice_columns: tuple[str, ...]
    slice_ids: dict[tuple[Any, ...], int] = field(default_factory=dict)
    block_ids: dict[Any, int] = field(default_factory=dict)
    keys: list[np.ndarray] = field(default_factory=list)
    vals: list[np.ndarray] = field(default_factory=list)
    num_conversions: int = 0


def create_accumulator(params: Params, slice_columns: Sequence[str] | None = None) -> CalibrationAccumulator:
    """An empty accumulator for ``params`` (slices: ``params.slice_columns`` unless given)."""
    cols = tuple(params.slice_columns if slice_columns is None else slice_columns)
    return CalibrationAccumulator(params=params, slice_columns=cols)


def _register(codes_uniques: list[tuple[np.ndarray, np.ndarray]], registry: dict[Any, int], n: int,
              scalar: bool = False) -> np.ndarray:
    """Local ids of the combined keys (a loop over distinct keys, not records); ``scalar``: one column, bare keys."""
    if not codes_uniques:
        sid = registry.setdefault((), len(registry))
        return np.full(n, sid, dtype=np.int64)
    combined = codes_uniques[0][0].astype(np.int64)
    for code, uniq in codes_uniques[1:]:
        combined = combined * len(uniq) + code
    _, first_rows, inverse = np.unique(combined, return_index=True, return_inverse=True)
    local = np.empty(len(first_rows), dtype=np.int64)
    for i, row in enumerate(first_rows):
        key: Any = tuple(_python_scalar(uniq[code[row]]) for code, uniq in codes_uniques)
        local[i] = registry.setdefault(key[0] if scalar else key, len(registry))
    return local[inverse.reshape(-1)]


def _factorize(values: Any) -> tuple[np.ndarray, np.ndarray]:
    code, uniq = pd.factorize(np.asarray(values), sort=False)
    return code.astype(np.int64), np.asarray(uniq, dtype=object)


def retained_values(conversions: Conversions, params: Params) -> tuple[np.ndarray, np.ndarray]:
    """(kept mask, (n, d) expected retained value per record in query units; 0 where not kept).

    Kept: ``error_model.kept_mask`` with the pipeline's tie-break ``Conversions.record_keys()``
    (L-inf Alg. 3 / L1 Alg. 6: rank < K(C); baseline: expected-norm approximation). Retained value:
    E[w_l] C_l / scale_l (L-inf: min(v, C_l); L1: the shrunk value), as in ``error_model``.
    """
    vals = check_values(conversions.values, params.num_queries)
    kept = kept_mask(conversions, params, tie_breaker=conversions.record_keys())
    out = np.zeros_like(vals)
    if kept.any():
        thresholds = np.array([q.clip_threshold for q in params.queries], dtype=np.float64)
        unit = thresholds / query_scales(params)
        out[kept] = expected_contribution(vals[kept], params) * unit[None, :]
    return kept, out


def add_conversions(acc: CalibrationAccumulator, conversions: Conversions, block_ids: Any) -> CalibrationAccumulator:
    """Add a batch holding ALL conversions of each of its impressions, with a block id per record
    (lookback rows, ``in_period`` False, are capped with the rest and then left out).

    Block ids are any hashable scalars (a day index, a date string); blocks are ordered by their
    sorted ids (consecutive blocks = consecutive periods). Returns ``acc``.
    """
    params = acc.params
    if tuple(conversions.value_columns) != params.query_columns:
        raise ValueError(f"conversions carry value columns {conversions.value_columns}, "
                         f"params expect {params.query_columns}")
    missing = [c for c in acc.slice_columns if c not in conversions.slices]
    if missing:
        raise ValueError(f"conversions lack slice column(s) {missing}")
    n = len(conversions)
    blocks = np.asarray(block_ids)
    if blocks.ndim != 1 or len(blocks) != n:
        raise ValueError(f"block_ids must be one id per record ({n}), got shape {blocks.shape}")
    if n == 0:
        return acc
    if pd.isna(pd.Series(blocks)).any():
        raise ValueError("block_ids must not be null / NaN")
    d = params.num_queries
    kept, retained = retained_values(conversions, params)  # Alg. 1 over the period and its lookback
    vals = check_values(conversions.values, d)
    if conversions.in_period is not None:  # only the period's rows are counted
        inside = conversions.period_mask()
        conversions, kept, retained, vals, blocks = (conversions.take(np.flatnonzero(inside)), kept[inside],
                                                     retained[inside], vals[inside], blocks[inside])
        n = len(conversions)
        if n == 0:
            return acc
    sid = _register([_factorize(conversions.slices[c]) for c in acc.slice_columns], acc.slice_ids, n)
    bid = _register([_factorize(blocks)], acc.block_ids, n, scalar=True)
    imp, _ = _factorize(conversions.impression_id)
    order = np.lexsort((bid, sid, imp))
    imp_o, sid_o, bid_o = imp[order], sid[order], bid[order]
    starts = np.flatnonzero(np.r_[True, (imp_o[1:] != imp_o[:-1]) | (sid_o[1:] != sid_o[:-1]) | (bid_o[1:] != bid_o[:-1])])
    t = np.column_stack([np.ones(n), vals])[order]
    x = np.column_stack([kept.astype(np.float64), retained])[order]
    tc = np.add.reduceat(t, starts, axis=0)
    xc = np.add.reduceat(x, starts, axis=0)
    cell = (sid_o[starts] << _BLOCK_SHIFT) | bid_o[starts]
    cols = [np.ones(len(starts))]
    for q in range(d + 1):
        a, b = tc[:, q], xc[:, q]
        cols += [a, b, a * a, a * b, b * b, (b < a * (1.0 - 1e-12)).astype(np.float64)]
    k, v = _reduce(cell, np.column_stack(cols))
    acc.keys.append(k)
    acc.vals.append(v)
    acc.num_conversions += n
    if len(acc.keys) > 8:
        compact(acc)
    return acc


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
        raise ValueError("merge_accumulators needs at least one accumulator")
    first = accs[0]
    if any(retention_checksum(a.params) != retention_checksum(first.params) or a.slice_columns != first.slice_columns
           or a.params.query_columns != first.params.query_columns for a in accs):
        raise ValueError("cannot merge calibration accumulators of different parameters or slice columns")
    out = create_accumulator(first.params, first.slice_columns)
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
    skeys = sorted(acc.slice_ids, key=_sort_key)
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
    return CalibrationStatistics(acc.params, acc.slice_columns, tuple(skeys), tuple(bkeys), cells, int(acc.num_conversions))


def calibration_statistics(conversions: Conversions, params: Params, block_ids: Any,
                           slice_columns: Sequence[str] | None = None) -> CalibrationStatistics:
    """Convenience: one batch (all conversions of every impression) -> extracted statistics."""
    return extract_output(add_conversions(create_accumulator(params, slice_columns), conversions, block_ids))


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
    ids = np.asarray(conversions.impression_id)
    ids = ids.astype(np.int64) if ids.dtype.kind in "iu" else ids.astype(object)
    return (pd.util.hash_array(ids) % np.uint64(HASH_BLOCKS)).astype(np.int64)


def period_blocks_for(calibration: Calibration, conversions: float) -> int:
    """How many history blocks a measured period with ``conversions`` conversions amounts to (>= 1):
    its size over the history's average block size."""
    per_block = float(np.sum(calibration.conversions)) / max(1, calibration.num_blocks)
    if not (per_block > 0 and np.isfinite(conversions)):
        return 1
    return max(1, int(round(float(conversions) / per_block)))


def day_blocks(conversions: Conversions, times: np.ndarray | None = None) -> np.ndarray:
    """Block id = UTC day index of ``times`` (default: the conversion times, int64 microseconds)."""
    t = np.asarray(conversions.conversion_time if times is None else times, dtype=np.int64)
    return np.floor_divide(t, 86_400_000_000)


# ================================================================================================
# Empirical Bayes (vectorized over columns)
# ================================================================================================

@dataclass(frozen=True)
class _Shrinkage:
    ratio: np.ndarray          # (m, G) shrunk ratio (mu where not valid)
    variance: np.ndarray       # (m, G) Var(rho_j | history) (unseen variance where not valid)
    mu: np.ndarray             # (G,)
    mu_variance: np.ndarray    # (G,)
    between: np.ndarray        # (G,) s2_slice
    between_upper: np.ndarray  # (G,)
    unseen_variance: np.ndarray  # (G,)


def _shrink(r: np.ndarray, s2: np.ndarray, valid: np.ndarray) -> _Shrinkage:
    """DerSimonian-Laird between-slice variance and empirical-Bayes shrinkage, column by column."""
    r = np.where(valid, r, 0.0)
    s2 = np.where(valid, np.maximum(s2, 1e-14), 1.0)
    w = np.where(valid, 1.0 / s2, 0.0)
    k = valid.sum(axis=0).astype(np.float64)
    sw = w.sum(axis=0)
    safe_sw = np.where(sw > 0, sw, 1.0)
    mu_fe = (w * r).sum(axis=0) / safe_sw
    Q = (w * (r - mu_fe) ** 2).sum(axis=0)
    denom = sw - (w**2).sum(axis=0) / safe_sw
    ok = (k >= 2) & (denom > 0)
    safe_denom = np.where(ok, denom, 1.0)
    between = np.where(ok, np.maximum(0.0, (Q - (k - 1)) / safe_denom), 0.0)
    upper = np.where(ok, np.maximum(0.0, (Q - (k - 1) + _Z95_ONE_SIDED * np.sqrt(2 * np.maximum(k - 1, 0))) / safe_denom),
                     0.0)
    wr = np.where(valid, 1.0 / (s2 + between), 0.0)
    swr = wr.sum(axis=0)
    mu = np.where(swr > 0, (wr * r).sum(axis=0) / np.where(swr > 0, swr, 1.0), 1.0)
    mu = np.clip(mu, MIN_RATIO, 1.0)
    mu_var = np.where(swr > 0, 1.0 / np.where(swr > 0, swr, 1.0), 0.0)
    upper = np.where(k >= 2, upper, ((1.0 - mu) / 2.0) ** 2)
    B = np.where(between > 0, s2 / (s2 + between), 1.0)
    ratio = mu + (1.0 - B) * (r - mu)
    post = (1.0 - B) * s2 + B**2 * mu_var
    unseen = upper + mu_var
    ratio = np.where(valid, ratio, mu)
    post = np.where(valid, post, unseen)
    return _Shrinkage(np.clip(ratio, MIN_RATIO, 1.0), post, mu, mu_var, between, upper, unseen)


# ================================================================================================
# The calibration
# ================================================================================================

@dataclass(frozen=True, eq=False)
class Calibration:
    """Retention ratios of fixed parameters, fitted from history (see the module docstring).

    Arrays are (m, d+1) in Alg. 4's order (count first), one row per ``slice_keys`` entry:
    ``ratio`` r_hat_j, ``variance`` Var(rho_j | history), ``kappa`` the ratio sampling factor,
    ``observed`` (False: the slice had no value of that query; ratio/variance are the unseen ones).
    Pooled (d+1): ``pooled_ratio`` mu, ``pooled_variance`` Var(mu), ``unseen_variance`` (used for
    slices absent from history), ``between_slice_variance``, ``interaction_variance``,
    ``pooled_kappa``. ``period_variance`` (B, d+1): row P-1 is V_period(P) for P consecutive blocks.
    """

    params_checksum: str
    retention_checksum: str
    slice_columns: tuple[str, ...]
    query_names: tuple[str, ...]
    slice_keys: tuple[tuple[Any, ...], ...]
    conversions: np.ndarray
    slice_blocks: np.ndarray
    ratio: np.ndarray
    variance: np.ndarray
    kappa: np.ndarray
    loss_rate: np.ndarray
    observed: np.ndarray
    pooled_ratio: np.ndarray
    pooled_variance: np.ndarray
    unseen_variance: np.ndarray
    between_slice_variance: np.ndarray
    interaction_variance: np.ndarray
    pooled_kappa: np.ndarray
    pooled_loss_rate: np.ndarray
    period_variance: np.ndarray
    num_blocks: int
    block_keys: tuple[str, ...] = ()
    method: str = METHOD
    format: str = CALIBRATION_FORMAT

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def num_slices(self) -> int:
        return len(self.slice_keys)

    @property
    def num_queries(self) -> int:
        return len(self.query_names) - 1

    def index(self) -> dict[tuple[Any, ...], int]:
        return {k: i for i, k in enumerate(self.slice_keys)}

    def check_params(self, params: Params) -> None:
        """Refuse (ValueError) parameters whose bounding differs from the fitted one (checksum)."""
        got = retention_checksum(params)
        if got != self.retention_checksum:
            raise ValueError(
                f"calibration does not match the parameters: retention checksum {self.retention_checksum[:12]}... "
                f"(fitted for params {self.params_checksum[:12]}...) != {got[:12]}... of these parameters "
                "(C, C_l, alpha_l or encoding differ): refit the calibration for these parameters")
        if ("count",) + params.query_columns != self.query_names:
            raise ValueError(f"calibration queries {self.query_names} differ from the parameters' {params.query_columns}")

    def period(self, period_blocks: int) -> np.ndarray:
        """V_period(P) (d+1) for a measured period of P >= 1 consecutive blocks."""
        if isinstance(period_blocks, bool) or not isinstance(period_blocks, (int, np.integer)) or period_blocks < 1:
            raise ValueError(f"period_blocks must be an integer >= 1, got {period_blocks!r}")
        P = int(period_blocks)
        if P <= self.period_variance.shape[0]:
            return cast(np.ndarray, self.period_variance[P - 1])
        B = self.num_blocks  # beyond the history: independent blocks, s2_1 from P = 1
        s2_1 = self.period_variance[0] / (1.0 + 1.0 / B)
        return cast(np.ndarray, s2_1 * (1.0 / P + 1.0 / B))

    # ---- serialisation --------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        def arr(a: np.ndarray) -> Any:
            return np.asarray(a).tolist()

        return {
            "format": self.format, "method": self.method,
            "params_checksum": self.params_checksum, "retention_checksum": self.retention_checksum,
            "slice_columns": list(self.slice_columns), "query_names": list(self.query_names),
            "num_blocks": int(self.num_blocks), "block_keys": list(self.block_keys),
            "pooled": {"ratio": arr(self.pooled_ratio), "variance": arr(self.pooled_variance),
                       "unseen_variance": arr(self.unseen_variance),
                       "between_slice_variance": arr(self.between_slice_variance),
                       "interaction_variance": arr(self.interaction_variance), "kappa": arr(self.pooled_kappa),
                       "loss_rate": arr(self.pooled_loss_rate)},
            "period_variance": arr(self.period_variance),
            "slices": {"keys": [list(k) for k in self.slice_keys], "conversions": arr(self.conversions),
                       "blocks": arr(self.slice_blocks), "ratio": arr(self.ratio), "variance": arr(self.variance),
                       "kappa": arr(self.kappa), "loss_rate": arr(self.loss_rate), "observed": arr(self.observed)},
        }

    def to_bytes(self) -> bytes:
        return (jsonio.dumps(self.to_json()) + "\n").encode("utf-8")  # NaN as null: read back as NaN

    @classmethod
    def from_json(cls, data: Any, params: Params | None = None, source: str = "calibration") -> Calibration:
        """Validate and build; with ``params``, also refuse a checksum mismatch. Every refusal is a ValueError."""
        if not isinstance(data, Mapping):
            raise ValueError(f"{source}: top level must be a JSON object")
        if data.get("format") != CALIBRATION_FORMAT:
            raise ValueError(f"{source}: unsupported format {data.get('format')!r}; expected {CALIBRATION_FORMAT!r}")
        if data.get("method") != METHOD:
            raise ValueError(f"{source}: unknown method {data.get('method')!r}; expected {METHOD!r}")
        try:
            pooled, slices = data["pooled"], data["slices"]
            num_slices = len(slices["keys"])
            d1 = len(data["query_names"])

            def mat(x: Any, name: str) -> np.ndarray:
                a = np.asarray(x, dtype=np.float64)
                if a.size == num_slices * d1:
                    return a.reshape(num_slices, d1)
                return _bad_shape(name, a.shape, (num_slices, d1))

            cal = cls(
                params_checksum=data["params_checksum"], retention_checksum=data["retention_checksum"],
                slice_columns=tuple(data["slice_columns"]), query_names=tuple(data["query_names"]),
                slice_keys=tuple(tuple(_python_scalar(v) for v in k) for k in slices["keys"]),
                conversions=np.asarray(slices["conversions"], dtype=np.float64),
                slice_blocks=np.asarray(slices["blocks"], dtype=np.float64),
                ratio=mat(slices["ratio"], "slices.ratio"), variance=mat(slices["variance"], "slices.variance"),
                kappa=mat(slices["kappa"], "slices.kappa"), loss_rate=mat(slices["loss_rate"], "slices.loss_rate"),
                observed=np.asarray(slices["observed"], dtype=bool).reshape(num_slices, d1),
                pooled_ratio=np.asarray(pooled["ratio"], dtype=np.float64),
                pooled_variance=np.asarray(pooled["variance"], dtype=np.float64),
                unseen_variance=np.asarray(pooled["unseen_variance"], dtype=np.float64),
                between_slice_variance=np.asarray(pooled["between_slice_variance"], dtype=np.float64),
                interaction_variance=np.asarray(pooled["interaction_variance"], dtype=np.float64),
                pooled_kappa=np.asarray(pooled["kappa"], dtype=np.float64),
                pooled_loss_rate=np.asarray(pooled["loss_rate"], dtype=np.float64),
                period_variance=np.asarray(data["period_variance"], dtype=np.float64).reshape(-1, d1),
                num_blocks=data["num_blocks"], block_keys=tuple(str(b) for b in data.get("block_keys", ())),
                method=data["method"], format=data["format"],
            )
        except KeyError as exc:
            raise ValueError(f"{source}: missing field {exc.args[0]!r}") from None
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{source}: {exc}") from None
        if params is not None:
            cal.check_params(params)
        return cal

    @classmethod
    def from_bytes(cls, raw: bytes, params: Params | None = None, source: str = "calibration") -> Calibration:
        return cls.from_json(jsonio.loads(raw, source), params, source)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write atomically (temporary file + rename), like ``Params.save``."""
        atomic_write_bytes(path, self.to_bytes())

    @classmethod
    def load(cls, path: str | os.PathLike[str], params: Params | None = None) -> Calibration:
        """Read and validate; with ``params``, refuse a calibration fitted for other parameters."""
        path = os.fspath(path)
        raw = read_bytes(path, "calibration file")
        return cls.from_bytes(raw, params, source=path)


def _bad_shape(name: str, got: tuple[int, ...], want: tuple[int, ...]) -> np.ndarray:
    raise ValueError(f"field {name} has shape {got}, expected {want}")


_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def _validate(cal: Calibration) -> None:
    for name in ("params_checksum", "retention_checksum"):
        v = getattr(cal, name)
        if not isinstance(v, str) or not _HEX64.match(v):
            raise ValueError(f"calibration field {name} must be a sha256 hex digest, got {v!r}")
    if cal.method != METHOD or cal.format != CALIBRATION_FORMAT:
        raise ValueError(f"unknown calibration method/format {cal.method!r}/{cal.format!r}")
    if not cal.query_names or cal.query_names[0] != _COUNT:
        raise ValueError(f"calibration query_names must start with 'count', got {cal.query_names!r}")
    if isinstance(cal.num_blocks, bool) or not isinstance(cal.num_blocks, (int, np.integer)) or cal.num_blocks < 1:
        raise ValueError(f"calibration num_blocks must be an integer >= 1, got {cal.num_blocks!r}")
    m, d1 = len(cal.slice_keys), len(cal.query_names)
    if len(set(cal.slice_keys)) != m:
        raise ValueError("calibration slice keys must be unique")
    if any(len(k) != len(cal.slice_columns) for k in cal.slice_keys):
        raise ValueError(f"every calibration slice key must have {len(cal.slice_columns)} values (the slice columns)")
    for name, shape in (("ratio", (m, d1)), ("variance", (m, d1)), ("kappa", (m, d1)), ("loss_rate", (m, d1)),
                        ("observed", (m, d1)), ("pooled_loss_rate", (d1,)),
                        ("conversions", (m,)), ("slice_blocks", (m,)), ("pooled_ratio", (d1,)),
                        ("pooled_variance", (d1,)), ("unseen_variance", (d1,)), ("between_slice_variance", (d1,)),
                        ("interaction_variance", (d1,)), ("pooled_kappa", (d1,))):
        a = np.asarray(getattr(cal, name))
        if a.shape != shape:
            raise ValueError(f"calibration field {name} has shape {a.shape}, expected {shape}")
    pv = np.asarray(cal.period_variance)
    if pv.ndim != 2 or pv.shape[1] != d1 or pv.shape[0] < 1:
        raise ValueError(f"calibration field period_variance must be (blocks, {d1}), got {pv.shape}")
    for name in ("ratio", "pooled_ratio"):
        a = np.asarray(getattr(cal, name), dtype=np.float64)
        if not np.isfinite(a).all() or (a <= 0).any() or (a > 1).any():
            raise ValueError(f"calibration field {name}: retention ratios must lie in (0, 1], got "
                             f"{a[~(np.isfinite(a) & (a > 0) & (a <= 1))][:3].tolist()}")
    for name in ("variance", "kappa", "pooled_variance", "unseen_variance", "between_slice_variance",
                 "interaction_variance", "pooled_kappa", "period_variance", "conversions", "slice_blocks"):
        a = np.asarray(getattr(cal, name), dtype=np.float64)
        if not np.isfinite(a).all() or (a < 0).any():
            raise ValueError(f"calibration field {name}: must be finite and >= 0 (no NaN, no negative variance), got "
                             f"{a[~(np.isfinite(a) & (a >= 0))][:3].tolist()}")
    for name in ("loss_rate", "pooled_loss_rate"):
        a = np.asarray(getattr(cal, name), dtype=np.float64)
        if not (np.isfinite(a).all() and (a >= 0).all() and (a <= 1).all()):
            raise ValueError(f"calibration field {name}: loss events per conversion must lie in [0, 1]")
    if (np.asarray(cal.unseen_variance) < np.asarray(cal.pooled_variance)).any():
        raise ValueError("calibration field unseen_variance must be >= pooled_variance")


def fit_calibration(stats: CalibrationStatistics, blocks: Sequence[Any] | None = None,
                    kappa_pseudo_conversions: float = KAPPA_PSEUDO_CONVERSIONS) -> Calibration:
    """Fit the model of the module docstring on extracted statistics (optionally a subset of blocks).

    ``blocks`` (block ids) restricts the fit, e.g. to the same weekday as the measured period.
    """
    cells = stats.cells
    bkeys = stats.block_keys
    if blocks is not None:
        wanted = [_python_scalar(b) for b in blocks]
        idx = [i for i, b in enumerate(bkeys) if b in set(wanted)]
        missing = set(wanted) - {bkeys[i] for i in idx}
        if missing:
            raise ValueError(f"blocks {sorted(map(str, missing))} are not in the calibration statistics")
        cells, bkeys = cells[:, idx], tuple(bkeys[i] for i in idx)
    present = cells[:, :, _col(0, "T")].sum(axis=1) > 0
    cells = cells[present]
    slice_keys = tuple(k for k, p in zip(stats.slice_keys, present, strict=True) if p)
    m, B = cells.shape[0], cells.shape[1]
    if m == 0 or B == 0:
        raise ValueError("no conversions in the calibration history")
    d = stats.num_queries
    N_jb = cells[:, :, _col(0, "T")]
    N_j = N_jb.sum(axis=1)
    M_jb = cells[:, :, 0]
    B_j = (N_jb > 0).sum(axis=1).astype(np.float64)
    out = {k: np.empty((m, d + 1)) for k in ("ratio", "variance", "kappa", "loss_rate", "observed")}
    pooled = {k: np.empty(d + 1) for k in ("ratio", "variance", "unseen", "between", "interaction", "kappa", "loss_rate")}
    period = np.zeros((B, d + 1))
    for q in range(d + 1):
        T = cells[:, :, _col(q, "T")]
        X = cells[:, :, _col(q, "X")]
        Stt, Stx, Sxx = (cells[:, :, _col(q, w)] for w in ("Stt", "Stx", "Sxx"))
        T_j, X_j = T.sum(axis=1), X.sum(axis=1)
        valid = T_j > 0
        r_j = np.where(valid, X_j / np.where(valid, T_j, 1.0), 0.0)
        rr = r_j[:, None]
        ss_jb = np.maximum(Sxx - 2 * rr * Stx + rr**2 * Stt, 0.0)
        ss_j = ss_jb.sum(axis=1)
        L_j = cells[:, :, _col(q, "L")].sum(axis=1)
        M_j = cells[:, :, 0].sum(axis=1)
        safe_T = np.where(valid, T_j, 1.0)
        kappa_hat = np.where(valid, N_j * ss_j / safe_T**2 * M_j / np.maximum(M_j - 1.0, 1.0), 0.0)
        T_tot, N_tot = T_j[valid].sum(), N_j[valid].sum()
        kappa_pool = float(N_tot * ss_j[valid].sum() / T_tot**2) if T_tot > 0 else 0.0
        loss_pool = float(L_j[valid].sum() / N_tot) if N_tot > 0 else 0.0
        n0 = float(kappa_pseudo_conversions)
        # a slice's own history may raise its sampling factor above the pooled one, never lower it:
        # with rare losses most slices show none in history, which does not mean they cannot lose
        kappa = np.maximum(np.where(valid, (N_j * kappa_hat + n0 * kappa_pool) / (N_j + n0), kappa_pool), kappa_pool)
        loss_rate = np.where(valid, (L_j + n0 * loss_pool) / (N_j + n0), loss_pool)
        # period effects (composition-adjusted block deviations)
        R_b = (np.where(valid[:, None], X - r_j[:, None] * T, 0.0)).sum(axis=0)
        T_b = np.where(valid[:, None], T, 0.0).sum(axis=0)
        SS_b = np.where(valid[:, None], ss_jb, 0.0).sum(axis=0)
        period[:, q] = _period_variances(R_b, T_b, SS_b)
        delta_b = np.where(T_b > 0, R_b / np.where(T_b > 0, T_b, 1.0), 0.0)
        # slice x block interaction
        cell_ok = valid[:, None] & (M_jb >= MIN_INTERACTION_CLUSTERS) & (B_j[:, None] >= 2)
        safe_T_jb = np.where(T > 0, T, 1.0)
        e = X / safe_T_jb - r_j[:, None] - delta_b[None, :]
        samp_jb = ss_jb / safe_T_jb**2 * M_jb / np.maximum(M_jb - 1.0, 1.0)
        samp_j = (ss_j / safe_T**2)[:, None]
        moment = e**2 - (samp_jb - samp_j)
        w = np.where(cell_ok, N_jb, 0.0)
        shrink_w = (w * (1.0 - 1.0 / np.maximum(B_j[:, None], 1.0))).sum()
        interaction = max(0.0, float((w * moment).sum() / shrink_w)) if shrink_w > 0 else 0.0
        # the pooled kappa, not the slice's own: a slice's kappa estimate is correlated with its ratio
        # (rare losses: no loss -> kappa ~ 0 -> huge weight), which would bias mu toward 1
        s2 = np.where(valid, kappa_pool / np.maximum(N_j, 1.0) + interaction / np.maximum(B_j, 1.0), 1.0)
        sh = _shrink(r_j[:, None], s2[:, None], valid[:, None])
        out["ratio"][:, q] = sh.ratio[:, 0]
        out["variance"][:, q] = sh.variance[:, 0]
        out["kappa"][:, q] = kappa
        out["loss_rate"][:, q] = loss_rate
        out["observed"][:, q] = valid
        for key, val in (("ratio", sh.mu[0]), ("variance", sh.mu_variance[0]), ("unseen", sh.unseen_variance[0]),
                         ("between", sh.between[0]), ("interaction", interaction), ("kappa", kappa_pool),
                         ("loss_rate", loss_pool)):
            pooled[key][q] = val
    return Calibration(
        params_checksum=stats.params.checksum(), retention_checksum=retention_checksum(stats.params),
        slice_columns=stats.slice_columns, query_names=(_COUNT,) + stats.params.query_columns,
        slice_keys=slice_keys, conversions=N_j, slice_blocks=B_j, ratio=out["ratio"], variance=out["variance"],
        kappa=out["kappa"], loss_rate=out["loss_rate"], observed=out["observed"].astype(bool), pooled_ratio=pooled["ratio"],
        pooled_variance=pooled["variance"], unseen_variance=pooled["unseen"],
        between_slice_variance=pooled["between"], interaction_variance=pooled["interaction"],
        pooled_kappa=pooled["kappa"], pooled_loss_rate=pooled["loss_rate"], period_variance=period, num_blocks=int(B),
        block_keys=tuple(str(b) for b in bkeys),
    )


def _period_variances(R_b: np.ndarray, T_b: np.ndarray, SS_b: np.ndarray) -> np.ndarray:
    """V_period(P) for P = 1..B from the block deviations (module docstring): rolling windows or independence."""
    B = len(T_b)
    out = np.zeros(B)
    if B < 2:
        return out
    cR, cT, cS = (np.concatenate([[0.0], np.cumsum(a)]) for a in (R_b, T_b, SS_b))

    def raw(P: int) -> float:
        R = cR[P:] - cR[:-P]
        T = cT[P:] - cT[:-P]
        S = cS[P:] - cS[:-P]
        ok = T > 0
        if not ok.any():
            return 0.0
        dev = R[ok] / T[ok]
        return float(np.mean(dev**2 - S[ok] / T[ok] ** 2))

    s2_1 = max(0.0, raw(1)) / (1.0 - 1.0 / B)
    for P in range(1, B + 1):
        if 2 * P <= B:
            out[P - 1] = max(0.0, raw(P)) * (1.0 + P / B) / (1.0 - P / B)
        else:
            out[P - 1] = s2_1 * (1.0 / P + 1.0 / B)
    return out


def calibrate(conversions: Conversions, params: Params, block_ids: Any, slice_columns: Sequence[str] | None = None,
              blocks: Sequence[Any] | None = None) -> Calibration:
    """Fit a calibration of ``params`` on in-memory history in one call (accumulate, extract, fit)."""
    return fit_calibration(calibration_statistics(conversions, params, block_ids, slice_columns), blocks)


# ================================================================================================
# Correction of estimates
# ================================================================================================

@dataclass(frozen=True)
class CorrectedEstimates:
    """Estimates of the TRUE totals (m, d+1), count first, beside the paper's capped ones (Alg. 4)."""

    estimate: np.ndarray
    std_error: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    capped_estimate: np.ndarray
    capped_std_error: np.ndarray
    ratio: np.ndarray
    ratio_std_error: np.ndarray
    fallback: np.ndarray          # (m, d+1) True where the pooled ratio was used
    fallback_slices: int          # slices with a fallback in any query
    query_names: tuple[str, ...]
    confidence: float
    period_blocks: int
    retention_checksum: str

    def to_frame(self, slice_values: Mapping[str, Sequence[Any]] | None = None) -> pd.DataFrame:
        """Long format: one row per slice and query with estimate, std_error, ci_*, capped_*, ratio."""
        m, d1 = self.estimate.shape
        frame = pd.DataFrame({"slice": np.repeat(np.arange(m), d1), "query": np.tile(self.query_names, m)})
        if slice_values is not None:
            for c, v in slice_values.items():
                frame[c] = np.repeat(np.asarray(list(v), dtype=object), d1)
        for name in ("estimate", "std_error", "ci_low", "ci_high", "capped_estimate", "capped_std_error", "ratio",
                     "ratio_std_error", "fallback"):
            frame[name] = getattr(self, name).reshape(-1)
        frame["bias_corrected"] = True
        return frame


def _slice_rows(slices: KeyDomain | Mapping[str, Sequence[Any]], columns: tuple[str, ...], m: int) -> list[tuple[Any, ...]]:
    values = slices.slice_values() if isinstance(slices, KeyDomain) else slices
    missing = [c for c in columns if c not in values]
    if missing:
        raise ValueError(f"slice values lack the calibration's slice column(s) {missing}")
    cols = [list(values[c]) for c in columns]
    if any(len(c) != m for c in cols):
        raise ValueError(f"slice values must give one value per estimate row ({m})")
    if not columns:
        return [()] * m
    return [tuple(_python_scalar(v) for v in row) for row in zip(*cols, strict=True)]


def correct(estimates: Estimates, calibration: Calibration, slices: KeyDomain | Mapping[str, Sequence[Any]],
            params: Params | None = None, period_blocks: int = 1, confidence: float | None = None) -> CorrectedEstimates:
    """T_hat = U / r_hat per slice and query, with the delta-method standard error (module docstring).

    ``slices``: the domain of the estimates (``KeyDomain``) or its slice values per column, in row
    order. ``params`` (recommended) is checked against the calibration's checksum. ``period_blocks``:
    how many calibration blocks the measured period spans. Slices the calibration never saw use the
    pooled ratio with the wider unseen variance; they are counted in ``fallback_slices``.
    """
    if params is not None:
        calibration.check_params(params)
    U = np.asarray(estimates.estimate, dtype=np.float64)
    se = np.asarray(estimates.std_error, dtype=np.float64)
    if U.ndim != 2 or U.shape[1] != len(calibration.query_names):
        raise ValueError(f"estimates have shape {U.shape}; the calibration has {len(calibration.query_names)} queries")
    if tuple(estimates.query_names) != calibration.query_names:
        raise ValueError(f"estimates' queries {estimates.query_names} differ from the calibration's "
                         f"{calibration.query_names}")
    if not (np.isfinite(U).all() and np.isfinite(se).all() and (se >= 0).all()):
        raise ValueError("estimates and standard errors must be finite (standard errors >= 0)")
    conf = estimates.confidence if confidence is None else float(confidence)
    if not 0.0 < conf < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")
    m = U.shape[0]
    rows = _slice_rows(slices, calibration.slice_columns, m)
    index = calibration.index()
    pos: np.ndarray = np.array([index.get(r, -1) for r in rows], dtype=np.int64)
    seen = pos >= 0
    safe = np.where(seen, pos, 0)
    ratio = np.where(seen[:, None], calibration.ratio[safe], calibration.pooled_ratio[None, :])
    var_long = np.where(seen[:, None], calibration.variance[safe], calibration.unseen_variance[None, :])
    kappa = np.where(seen[:, None], calibration.kappa[safe], calibration.pooled_kappa[None, :])
    fallback = ~seen[:, None] | ~np.where(seen[:, None], calibration.observed[safe], False)
    loss_rate = np.where(seen[:, None], calibration.loss_rate[safe], calibration.pooled_loss_rate[None, :])
    ratio = np.clip(ratio, MIN_RATIO, 1.0)
    n_hat = np.maximum(U[:, 0] / ratio[:, 0], 1.0)
    var_other = (var_long + calibration.period(period_blocks)[None, :]
                 + calibration.interaction_variance[None, :] / period_blocks)
    var_sampling = kappa / n_hat[:, None]
    est = U / ratio
    # the ratio terms scale with X^2; U^2 - se^2 estimates X^2 without the noise's own contribution
    # (E U^2 = X^2 + se^2), which would otherwise widen the intervals of noise-dominated slices
    X2 = np.maximum(U**2 - se**2, 0.0)
    var = se**2 / ratio**2 + X2 * (var_other + var_sampling) / ratio**4
    std = np.maximum(np.sqrt(var), se)
    tail = (1.0 - conf) / 2.0
    z = float(sp_stats.norm.ppf(1.0 - tail))
    # the loss D = T - X of the measured period (sampling part): mean U (1 - r) / r, variance from kappa,
    # no loss at all with probability exp(-expected loss events); D >= 0 (module docstring)
    pos = U > 0
    mean_loss = np.where(pos, U * (1.0 - ratio) / ratio, 0.0)
    var_loss = X2 * var_sampling / ratio**4
    zero = np.exp(-loss_rate * n_hat[:, None])
    gauss_sd = np.sqrt(se**2 / ratio**2 + X2 * var_other / ratio**4)  # noise, rounding, long-run ratio error
    w_lo, w_hi = convolved_loss_quantiles(mean_loss, var_loss, zero, gauss_sd, tail)
    ci_low = np.where(pos, est + np.minimum(w_lo - mean_loss, 0.0), est - z * std)
    ci_high = np.where(pos, est + np.maximum(w_hi - mean_loss, 0.0), est + z * std)
    noise = z * se / ratio  # never narrower than the uncorrected interval's noise part (until cut at 0)
    ci_low, ci_high = nonnegative_interval(np.minimum(ci_low, est - noise), np.maximum(ci_high, est + noise))
    return CorrectedEstimates(
        estimate=est, std_error=std, ci_low=ci_low, ci_high=ci_high,
        capped_estimate=U.copy(),
        capped_std_error=se.copy(), ratio=ratio, ratio_std_error=np.sqrt(var_other + var_sampling), fallback=fallback,
        fallback_slices=int(fallback.any(axis=1).sum()), query_names=calibration.query_names, confidence=conf,
        period_blocks=int(period_blocks), retention_checksum=calibration.retention_checksum,
    )


_EDGES = np.concatenate([[0.0], sp_special.ndtr(np.linspace(-4.5, 4.5, 63)), [1.0]])
_LEVELS = 0.5 * (_EDGES[1:] + _EDGES[:-1])
"""Quadrature nodes (probability levels) of the gamma part: 64 cells, finer in both tails."""
_WEIGHTS = np.diff(_EDGES)


def convolved_loss_quantiles(mean: np.ndarray, variance: np.ndarray, zero_probability: np.ndarray, gauss_sd: np.ndarray,
                             tail: float) -> tuple[np.ndarray, np.ndarray]:
    """``tail`` and 1 - ``tail`` quantiles of D + G, G ~ N(0, gauss_sd^2) independent (noise, rounding,
    long-run ratio error), and D >= 0 the period's loss: D = 0 with probability ``zero_probability``,
    otherwise a gamma with the conditional mean and variance implied by (``mean``, ``variance``).

    Losses are sums of rare, large events in small slices or at a count limit well above the typical
    impression: D is then 0 most of the time and sometimes several conversions, which no symmetric
    interval covers. With many events (P(D = 0) ~ 0) D is a gamma fit (skewness 2 CV).

    CDF by quadrature over 64 gamma quantile nodes (``_LEVELS``), inverted by bisection (vectorized).
    """
    mean = np.maximum(np.asarray(mean, dtype=np.float64), 0.0)
    shape_ = mean.shape
    mean = mean.reshape(-1)
    var = (np.maximum(np.asarray(variance, dtype=np.float64), 0.0) * np.ones(shape_)).reshape(-1)
    p0 = (np.clip(np.asarray(zero_probability, dtype=np.float64), 0.0, 1.0 - 1e-9) * np.ones(shape_)).reshape(-1)
    sd = (np.maximum(np.asarray(gauss_sd, dtype=np.float64), 0.0) * np.ones(shape_)).reshape(-1)
    # work in units of the element's own scale: no under- or overflow whatever the magnitudes
    unit = np.maximum.reduce([mean, np.sqrt(var), sd])
    unit = np.where(unit > 0, unit, 1.0)
    mean, var, sd = mean / unit, (np.sqrt(var) / unit) ** 2, sd / unit
    m1 = mean / (1.0 - p0)
    vp = np.maximum((var + mean * mean) / (1.0 - p0) - m1 * m1, 1e-8 * m1 * m1 + 1e-12)
    shape = np.clip(m1 * m1 / vp, 1e-8, 1e8)
    scale = np.where(m1 > 0, m1 / shape, 0.0)
    nodes = scale[:, None] * sp_special.gammaincinv(shape[:, None], _LEVELS[None, :])  # (k, nodes)
    nodes = np.where(mean[:, None] > 0, nodes, 0.0)
    sdd = np.maximum(sd, 1e-12 * (1.0 + mean))[:, None]

    def cdf(w: np.ndarray) -> np.ndarray:
        return cast(np.ndarray, p0 * sp_special.ndtr(w / sdd[:, 0])
                    + (1.0 - p0) * (sp_special.ndtr((w[:, None] - nodes) / sdd) * _WEIGHTS[None, :]).sum(axis=1))

    span = 12.0 * (sd + np.sqrt(var + mean * mean) + nodes.max(axis=1)) + 1e-9
    out = []
    for p in (tail, 1.0 - tail):
        lo, hi = -span, span
        for _ in range(44):
            mid = 0.5 * (lo + hi)
            below = cdf(mid) < p
            lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
        out.append((0.5 * (lo + hi) * unit).reshape(shape_))
    return out[0], out[1]


# ================================================================================================
# Error model of the corrected estimator from SufficientStatistics (for the optimizer)
# ================================================================================================

def _supported_for_objective(params: Params) -> None:
    if params.encoding == "linf" or (params.encoding == "l1" and params.num_queries == 1
                                     and params.l1_rounding == "randomized"):
        return
    raise ValueError("the corrected objective supports encoding 'linf' (Alg. 3) and 'l1' (Alg. 6) with one query and "
                     f"randomized rounding; got encoding {params.encoding!r} with {params.num_queries} queries")


@dataclass(frozen=True)
class Backtest:
    """The error one release of ``period_blocks`` history blocks would have had, replayed on the
    history's own blocks: RMSRE_tau per window of blocks, and over all windows (root mean square)."""

    correction: str
    period_blocks: int
    rmsre_tau: float
    per_query: np.ndarray   # (d+1,) root mean square over windows
    per_window: np.ndarray  # (windows,)


def _leave_one_out_ratios(T: np.ndarray, X: np.ndarray, calibration: Calibration, q: int,
                          slice_rows: np.ndarray) -> np.ndarray:
    """(m, W) ratios of each slice without window w: its raw history ratio without that window,
    shrunk toward the pooled ratio with the calibration's own weight (the measured window never
    informs its own correction)."""
    mu = float(calibration.pooled_ratio[q])
    between = float(calibration.between_slice_variance[q])
    n_hist = calibration.conversions[slice_rows]
    blocks = np.maximum(calibration.slice_blocks[slice_rows], 1.0)
    s2 = calibration.pooled_kappa[q] / np.maximum(n_hist, 1.0) + calibration.interaction_variance[q] / blocks
    keep = np.zeros_like(s2) if between <= 0 else between / (s2 + between)  # 1 - B_j per slice
    T_rest = T.sum(axis=1, keepdims=True) - T
    X_rest = X.sum(axis=1, keepdims=True) - X
    with np.errstate(invalid="ignore", divide="ignore"):
        raw = np.where(T_rest > 0, X_rest / np.where(T_rest > 0, T_rest, 1.0), mu)
    return cast(np.ndarray, np.clip(mu + keep[:, None] * (raw - mu), MIN_RATIO, 1.0))


def backtest(stats: CalibrationStatistics, params: Params, calibration: Calibration,
             taus: np.ndarray | Sequence[float], correction: str, period_blocks: int = 1) -> Backtest:
    """Replay releases of ``period_blocks`` consecutive history blocks (e.g. days) with ``params``:
    per window the expected error of the released estimate given that window's data, E(U) = X_w
    (what Alg. 1 keeps of it, clipped; ``correction`` "ratio": X_w / r_hat with the window left out
    of r_hat) against its true total T_w, plus the noise and rounding variance of Thm. 4.2, over the
    slices of the history (Def. 3.2, taus given). This is the prediction a model of the period cannot
    make well when the window's volume, its loss and its truth vary together (heavy-tailed values,
    weekday cycles): every window is a real sample of a release."""
    if correction not in ("ratio", "none"):
        raise ValueError(f"correction must be 'ratio' or 'none', got {correction!r}")
    P = int(period_blocks)
    B = stats.cells.shape[1]
    if P < 1 or P > B:
        raise ValueError(f"period_blocks must lie in [1, {B}] (blocks in the history), got {period_blocks!r}")
    t = np.asarray(taus, dtype=np.float64)
    d = params.num_queries
    if t.shape != (d + 1,):
        raise ValueError(f"taus must be {d + 1} numbers (count first), got {t}")
    index = calibration.index()
    slice_rows = np.array([index.get(k, -1) for k in stats.slice_keys], dtype=np.int64)
    present = slice_rows >= 0
    windows = np.lib.stride_tricks.sliding_window_view(np.arange(B), P)
    sq = np.zeros((len(windows), d + 1))
    for q in range(d + 1):
        T = np.stack([stats.quantity(q, "T")[:, w].sum(axis=1) for w in windows], axis=1)[present]
        X = np.stack([stats.quantity(q, "X")[:, w].sum(axis=1) for w in windows], axis=1)[present]
        kept = np.stack([stats.quantity(0, "X")[:, w].sum(axis=1) for w in windows], axis=1)[present]
        ratio = (_leave_one_out_ratios(T, X, calibration, q, slice_rows[present]) if correction == "ratio"
                 else np.ones_like(T))
        # Thm. 4.2: noise, and rounding bounded by 1/6 per kept conversion (small beside the noise)
        var = np.stack([estimate_variance(params, kept[:, w], np.repeat(kept[:, w:w + 1] / 6.0, d, axis=1))[:, q]
                        for w in range(len(windows))], axis=1)
        err2 = (X / ratio - T) ** 2 + var / ratio**2
        sq[:, q] = (err2 / np.maximum(t[q], T) ** 2).mean(axis=0)
    per_window = np.sqrt(sq.mean(axis=1))
    return Backtest(correction, P, float(np.sqrt(sq.mean())), np.sqrt(sq.mean(axis=0)), per_window)


@dataclass(frozen=True)
class CorrectedBreakdown:
    """Error model of T_hat = U / r_hat per slice (m, d+1): truth, ratio, residual bias (rms), variance."""

    truth: np.ndarray
    ratio: np.ndarray
    residual_bias: np.ndarray
    variance: np.ndarray
    capped: ErrorBreakdown

    @property
    def mse(self) -> np.ndarray:
        return cast(np.ndarray, self.residual_bias**2 + self.variance)

    def as_error_breakdown(self) -> ErrorBreakdown:
        """For ``error_model.rmsre_tau``: expected = truth + residual bias (its rms), variance."""
        return ErrorBreakdown(truth=self.truth, expected=self.truth + self.residual_bias, variance=self.variance)


def _ratio_terms(T: np.ndarray, X: np.ndarray, N: np.ndarray, kappa: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Shrunk ratio and Var(rho | history) per slice for columns (m, G) (kappa: (G,))."""
    valid = T > 0
    r = np.where(valid, X / np.where(valid, T, 1.0), 0.0)
    s2 = kappa[None, :] / np.maximum(N, 1.0)[:, None] * np.ones_like(T)
    sh = _shrink(r, s2, valid)
    return sh.ratio, sh.variance


def corrected_breakdown(stats: SufficientStatistics, params: Params, kind: str = "exact",
                        period_variance: float | Sequence[float] | np.ndarray = 0.0) -> CorrectedBreakdown:
    """Predicted error of the corrected estimator for ``params`` from the optimizer's statistics.

    ``period_variance`` (scalar or d+1): V_period of the measured period (e.g. from a calibration).
    ``stats`` may be scaled to a release period (``SufficientStatistics.scaled``): truths, bias and
    the period's sampling term kappa / N follow the period's volume, the ratio's own uncertainty
    Var(rho | history) the history's (``stats.volume_scale`` says how they differ).
    """
    from .optimizer import statistics_breakdown  # the paper estimator's breakdown (Thm. 4.2 + exact bias)

    _supported_for_objective(params)
    capped = statistics_breakdown(stats, params, kind, period_loss=False)  # the ratio terms below model the loss
    d = params.num_queries
    K = kept_per_impression(params.count_limit, params.contribution_budget)
    pv = np.broadcast_to(np.asarray(period_variance, dtype=np.float64), (d + 1,))
    T, X = capped.truth, capped.expected
    N = T[:, 0]
    kappa = np.array([count_kappa(stats, K)]
                     + [float(value_kappa(stats, q, K, np.array([params.queries[q].clip_threshold]))[0])
                        for q in range(d)])
    ratio, post = _ratio_terms(T, X, N / stats.volume_scale, kappa)  # the ratio is learnt on the whole history
    resid = T * np.sqrt(post + pv[None, :]) / ratio
    var = capped.variance / ratio**2 + T**2 * (kappa[None, :] / np.maximum(N, 1.0)[:, None]) / ratio**2
    return CorrectedBreakdown(truth=T, ratio=ratio, residual_bias=resid, variance=var, capped=capped)


def corrected_objective(stats: SufficientStatistics, params: Params, taus: np.ndarray | Sequence[float] | None = None,
                        kind: str = "exact", period_variance: float | Sequence[float] | np.ndarray = 0.0) -> float:
    """Predicted RMSRE_tau (Def. 3.2) of the corrected estimator (objective kind "corrected")."""
    t = stats.taus() if taus is None else np.asarray(taus, dtype=np.float64)
    return rmsre_tau(corrected_breakdown(stats, params, kind, period_variance).as_error_breakdown(), t).combined


@dataclass(frozen=True)
class CorrectedOptimizationResult:
    """Chosen L-inf parameters for the corrected objective, its predicted RMSRE_tau and the per-C table."""

    params: Params
    objective: float
    per_count_limit: pd.DataFrame
    seconds: float
    kind: str = "corrected"


def _clip_grid(stats: SufficientStatistics, q: int, size: int) -> np.ndarray:
    p = np.unique(np.concatenate([np.linspace(0.05, 0.95, size // 4),
                                  1.0 - np.logspace(-5, np.log10(0.05), size - size // 4)]))
    pts = np.array([stats.quantile(q, float(x)) for x in p] + [float(stats.value_max[q])])
    pts = np.unique(pts[pts > 0])
    return pts if pts.size else np.array([1.0])


def optimize_corrected(
    stats: SufficientStatistics, epsilon: float, max_count_limit: int = 20, taus: np.ndarray | Sequence[float] | None = None,
    period_variance: float | Sequence[float] | np.ndarray = 0.0, grid_size: int = 192, sweeps: int = 4,
    slice_columns: Sequence[str] | None = None,
) -> CorrectedOptimizationResult:
    """ParameterOptimization (Alg. 5) for the corrected objective, L-inf encoding (Alg. 3).

    For every C: per query a grid of clip thresholds (training quantiles); for fixed thresholds the
    variance part sum_l A_l / alpha_l^2 is minimised by alpha_l ~ A_l^(1/3) (Lagrange), so the
    search is over thresholds only (exhaustive for d = 1, coordinate sweeps for d >= 2). Rounding
    variance 1/6 per unclipped kept conversion; integer scales as in ``optimizer``. The chosen
    parameters' objective is recomputed by ``corrected_objective``.
    """
    from .optimizer import _integer_fractions  # integer budget scales, as the paper-objective optimizer

    t0 = time.perf_counter()
    epsilon = check_epsilon(epsilon)
    if stats.num_conversions == 0:
        raise ValueError("the statistics hold no conversions (empty history)")
    cmax = int(max_count_limit)
    if cmax < 1 or cmax > stats.spec.max_count_limit:
        raise ValueError(f"max_count_limit must lie in [1, {stats.spec.max_count_limit}], got {max_count_limit!r}")
    tau = stats.taus() if taus is None else np.asarray(taus, dtype=np.float64)
    d = stats.num_queries
    gamma = stats.spec.contribution_budget
    pv = np.broadcast_to(np.asarray(period_variance, dtype=np.float64), (d + 1,))
    vnoise = discrete_laplace_variance(noise_parameter(epsilon, gamma))
    T = stats.totals()
    pi = 1.0 / np.maximum(tau[None, :], T) ** 2
    N = T[:, 0]  # conversions per slice in the release period
    N_history = N / stats.volume_scale  # ... and in the history the ratios are learnt on
    grids = [_clip_grid(stats, q, grid_size) for q in range(d)]
    rows: list[dict[str, Any]] = []
    best: tuple[float, Params | None] = (np.inf, None)
    params: Params | None
    for C in range(1, cmax + 1):
        K = kept_per_impression(C, gamma)
        if K > stats.max_rank:
            break
        kept = stats.kept_totals(K)
        k0 = np.array([count_kappa(stats, K)])
        r0, post0 = _ratio_terms(T[:, :1], kept[:, :1], N_history, k0)
        var0 = (d + 1) * vnoise / (gamma // C) ** 2
        count_term = float((pi[:, 0] * (var0 + T[:, 0] ** 2 * (post0[:, 0] + pv[0] + k0[0] / np.maximum(N, 1.0)))
                            / r0[:, 0] ** 2).mean())
        A, Bq = [], []
        for q in range(d):
            c = grids[q]
            X, unclipped = _clipped_sums(stats, q, K, c, kept[:, q + 1], kept[:, 0])
            kq = value_kappa(stats, q, K, c)
            Tq = np.repeat(T[:, q + 1:q + 2], len(c), axis=1)
            rq, postq = _ratio_terms(Tq, X, N_history, kq)
            A.append((pi[:, q + 1:q + 2] * (vnoise + unclipped / 6.0) * (c[None, :] * C / gamma) ** 2 / rq**2).mean(axis=0))
            Bq.append((pi[:, q + 1:q + 2] * Tq**2 * (postq + pv[q + 1] + kq[None, :] / np.maximum(N, 1.0)[:, None])
                       / rq**2).mean(axis=0))
        idx = np.array([int(np.argmin(A[q] + Bq[q])) for q in range(d)])
        for _ in range(sweeps if d > 1 else 0):
            changed = False
            for q in range(d):
                others = sum(np.cbrt(A[o][idx[o]]) for o in range(d) if o != q)
                tot = np.array([sum(Bq[o][idx[o]] for o in range(d) if o != q)]) + Bq[q] + (others + np.cbrt(A[q])) ** 3
                new = int(np.argmin(tot))
                changed |= new != idx[q]
                idx[q] = new
            if not changed:
                break
        a_sel = np.array([A[q][idx[q]] for q in range(d)])
        value_terms = float(sum(Bq[q][idx[q]] for q in range(d)) + np.cbrt(a_sel).sum() ** 3)
        model = math.sqrt(max(count_term + value_terms, 0.0) / (d + 1))
        thresholds = np.array([grids[q][idx[q]] for q in range(d)])
        fractions = np.array([1.0]) if d == 1 else _integer_fractions(np.maximum(a_sel, 1e-300), C, gamma)
        params = Params(count_limit=C, encoding="linf", epsilon=epsilon,
                        slice_columns=tuple(stats.slice_columns if slice_columns is None else slice_columns),
                        queries=tuple(QueryParams(col, float(thresholds[q]), float(fractions[q]), float(tau[q + 1]))
                                      for q, col in enumerate(stats.value_columns)),
                        count_tau=float(tau[0]), contribution_budget=gamma)
        row = {"C": C, "kept_ranks": K, "corrected_rmsre_tau": model}
        row.update({f"C_{col}": float(t) for col, t in zip(stats.value_columns, thresholds, strict=True)})
        row.update({f"alpha_{col}": float(a) for col, a in zip(stats.value_columns, fractions, strict=True)})
        rows.append(row)
        if model < best[0]:
            best = (model, params)
    params = best[1]
    assert params is not None
    final = corrected_objective(stats, params, tau, "exact", pv)
    return CorrectedOptimizationResult(params, final, pd.DataFrame(rows), time.perf_counter() - t0)


def _clipped_sums(stats: SufficientStatistics, q: int, kept_ranks: int, c: np.ndarray, kept_sum: np.ndarray,
                  kept_count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per slice and clip c (m, G): sum over kept conversions of min(v, c), and the kept count below c.

    A bucket counts as above c when its mean is >= c (buckets are 1.1 % wide by default).
    """
    m, G = stats.num_slices, len(c)
    e = (stats.hist_query == q) & (stats.hist_rank < kept_ranks)
    sl, cnt, sm = stats.hist_slice[e], stats.hist_count[e], stats.hist_sum[e]
    mean_b = sm / np.maximum(cnt, 1e-300)
    gidx = np.searchsorted(c, mean_b, side="right")  # entry is above c_g for g < gidx
    flat = sl * (G + 1) + gidx
    cnt_at = np.bincount(flat, weights=cnt, minlength=m * (G + 1)).reshape(m, G + 1)
    sm_at = np.bincount(flat, weights=sm, minlength=m * (G + 1)).reshape(m, G + 1)
    cnt_above = np.cumsum(cnt_at[:, ::-1], axis=1)[:, ::-1][:, 1:]
    sm_above = np.cumsum(sm_at[:, ::-1], axis=1)[:, ::-1][:, 1:]
    X = kept_sum[:, None] - sm_above + c[None, :] * cnt_above
    return X, np.maximum(kept_count[:, None] - cnt_above, 0.0)
