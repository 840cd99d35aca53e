"""Histogram contributions: randomized rounding (eqs. 1-2), Alg. 3 (L-inf), Alg. 6 (L1), baseline.

All encoders are vectorized over records: ``values`` is an (n, d) array of the value queries
q_1..q_d (clipping happens here), and the result is an (n, d+1) int64 array with one column per
query in ``params.queries`` order followed by the bottom key (for the baseline: the count key).

Encodings
---------
``linf`` (Alg. 3): w_l = RR(floor(alpha_l Gamma / C) * min(v_l, C_l) / C_l), bottom = floor(Gamma/C) - sum.
``l1`` (Alg. 6): v = (q_l / C_l)_l, u = v / max(1, |v|_1) * S, w_l = round(u_l), bottom = floor(Gamma/C) - sum
    (a v that overflows float64 is replaced by its direction, ``l1_scaled``: safe for every finite value).
    * ``l1_rounding="floor"`` is the paper's version: S = Gamma / C and floor rounding. It is
      deterministic and biased: each record loses frac(u_l) on average ~1/2 unit per query.
    * ``l1_rounding="randomized"`` is our unbiased variant: S = floor(Gamma / C) and *systematic*
      randomized rounding (one uniform U per record, w_l = floor(S_l + U) - floor(S_{l-1} + U) with
      S_l the prefix sums of u). Each w_l is RR(u_l) marginally (so E w_l = u_l and Var = f(1-f))
      while the rounded sum never exceeds S, which independent RR could do (bottom would go < 0).
``baseline`` (Sec. 5.1): count key w_0 = floor(alpha_0 Gamma / C), w_l = CRR with alpha_l, no bottom;
    a record's norm is at most floor(Gamma / C) but usually less, so more than C may fit.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np

from araopt.constants import CONTRIBUTION_BUDGET
from araopt.errors import InvalidInput, InvalidParameters
from araopt.mechanism.params import Encoding, Params

_UNIFORMS_HELP = "uniforms must be an (n, d) float array on [0, 1)"


def check_values(values: np.ndarray, num_queries: int | None = None) -> np.ndarray:
    """Return ``values`` as a float64 (n, d) array; refuse NaN, infinities and negative values."""
    raw = np.asarray(values)
    if raw.dtype.kind not in "iuf":  # strings ("0.5"), bools, objects: a schema error, not a value
        raise TypeError(f"values must be a numeric (integer or float) array, got dtype {raw.dtype}")
    arr = raw.astype(np.float64, copy=False)
    if arr.ndim == 1:
        arr = arr.reshape(-1, 1)
    if arr.ndim != 2:
        raise InvalidInput(f"values must be a 1-D or 2-D array, got shape {np.shape(values)}")
    if num_queries is not None and arr.shape[1] != num_queries:
        raise InvalidInput(f"values has {arr.shape[1]} columns but the parameters define {num_queries} queries")
    if arr.size:
        if not np.isfinite(arr).all():
            bad = np.argwhere(~np.isfinite(arr))[0]
            raise InvalidInput(f"values must be finite: NaN or infinity at row {bad[0]}, query {bad[1]}")
        if (arr < 0).any():
            bad = np.argwhere(arr < 0)[0]
            raise InvalidInput(f"values must be non-negative: {float(arr[bad[0], bad[1]])!r} at row {bad[0]}, "
                               f"query {bad[1]}")
    return arr


def randomized_round(omega: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """RR(omega) (eq. 2): ceil(omega) with probability frac(omega), else floor(omega). Unbiased."""
    omega = np.asarray(omega, dtype=np.float64)
    low = np.floor(omega)
    frac = np.subtract(omega, low)
    up = np.less(uniforms, frac)
    low += up
    return cast(np.ndarray, low.astype(np.int64))


def clip_randomized_round(
    values: np.ndarray, count_limit: int, clip_threshold: float, budget_fraction: float,
    uniforms: np.ndarray, contribution_budget: int = CONTRIBUTION_BUDGET,
) -> np.ndarray:
    """CRR(v; C, C_l, alpha_l) = RR(floor(alpha_l Gamma / C) * clip_{C_l}(v) / C_l) (eq. 1)."""
    scale = query_scale(count_limit, budget_fraction, contribution_budget)
    return randomized_round(scale * (np.minimum(values, clip_threshold) / clip_threshold), uniforms)


def query_scale(count_limit: int, budget_fraction: float, contribution_budget: int = CONTRIBUTION_BUDGET) -> int:
    """floor(alpha_l Gamma / C): the integer a fully clipped value of query l is encoded as."""
    return int(np.floor(budget_fraction * contribution_budget / count_limit))


def query_scales(params: Params) -> np.ndarray:
    """Per value query, the divisor Alg. 4 uses to turn W_l back into the query's unit (times C_l)."""
    if params.encoding == Encoding.L1:
        return np.full(params.num_queries, params.per_conversion_budget, dtype=np.int64)
    scales = np.array(
        [query_scale(params.count_limit, alpha, params.contribution_budget) for alpha in params.budget_fractions],
        dtype=np.int64,
    )
    total = int(scales.sum()) + (count_scale(params) if params.encoding == Encoding.BASELINE else 0)
    if total > params.per_conversion_budget:  # Lemma 4.1; only reachable through the 1e-9 tolerance
        raise InvalidParameters(
            f"budget fractions over-allocate: the per-query scales sum to {total} > floor(Gamma/C) = "
            f"{params.per_conversion_budget}; lower a budget_fraction"
        )
    return scales


def count_scale(params: Params) -> int:
    """Divisor of the count estimate: floor(Gamma/C) (L-inf, L1), floor(alpha_0 Gamma/C) (baseline)."""
    if params.encoding == Encoding.BASELINE:
        return query_scale(params.count_limit, params.count_fraction, params.contribution_budget)
    return params.per_conversion_budget


@dataclass(frozen=True)
class EncoderTable:
    """The per-record constants of Alg. 3 / Alg. 6 / the baseline for one parameter set, computed once.

    The numpy encoder (:func:`encode`, over batches) and the ad-server encoder
    (``araopt.ara.registrations.TriggerEncoder``, one record at a time) both read them from here.
    """

    encoding: str
    l1_rounding: str
    clip_thresholds: tuple[float, ...]
    query_scales: tuple[int, ...]
    """Per value query: floor(alpha_l Gamma / C) (L-inf, baseline); floor(Gamma / C) (L1)."""
    budget: int
    """floor(Gamma / C): the L1 norm of an L-inf / L1 contribution (Lemma 4.1), the S of randomized L1."""
    l1_floor_scale: float
    """Gamma / C: the S of Alg. 6 with the paper's floor rounding (not floored)."""
    count_scale: int | None
    """The baseline's count key floor(alpha_0 Gamma / C); None when the last key is the bottom key."""

    @classmethod
    def of(cls, params: Params) -> EncoderTable:
        return cls(params.encoding, params.l1_rounding, tuple(float(q.clip_threshold) for q in params.queries),
                   tuple(int(s) for s in query_scales(params)), params.per_conversion_budget,
                   params.contribution_budget / params.count_limit,
                   count_scale(params) if params.encoding == Encoding.BASELINE else None)

    @property
    def uniforms_per_record(self) -> int:
        """Uniforms one record's rounding needs: d (L-inf, baseline), 1 (L1 randomized), 0 (L1 floor)."""
        if self.encoding == Encoding.L1:
            return 1 if self.l1_rounding == "randomized" else 0
        return len(self.clip_thresholds)


def _uniforms(n: int, d: int, rng: np.random.Generator | None, uniforms: np.ndarray | None) -> np.ndarray:
    if uniforms is not None:
        u = np.asarray(uniforms, dtype=np.float64)
        if u.ndim == 1:
            u = u.reshape(-1, 1)
        if u.ndim != 2 or u.shape[0] != n or u.shape[1] < d:
            raise InvalidParameters(f"{_UNIFORMS_HELP}: got shape {u.shape}, need ({n}, {d})")
        if u.size and not ((u >= 0.0) & (u < 1.0)).all():  # NaN fails both: floor(NaN) -> int64 garbage
            raise InvalidParameters(f"{_UNIFORMS_HELP}: got a value outside [0, 1) or NaN")
        return u
    if rng is None:
        raise InvalidParameters("encode needs either rng (a numpy Generator) or uniforms")
    return rng.random((n, d))


_CHUNK_ROWS = 1 << 18  # temporaries of a few MB are recycled by malloc instead of page-faulted


def encode(
    values: np.ndarray, params: Params, rng: np.random.Generator | None = None, *, uniforms: np.ndarray | None = None,
) -> np.ndarray:
    """Histogram contributions of each record: (n, d+1) int64, queries then bottom (baseline: count).

    Records are processed in chunks; the random stream is consumed row by row, so the result does
    not depend on the chunk size.
    """
    vals = check_values(values, params.num_queries)
    n, d = vals.shape
    if uniforms is not None:
        uniforms = _uniforms(n, 1 if params.encoding == Encoding.L1 else d, None, uniforms)
    elif rng is None:
        raise InvalidParameters("encode needs either rng (a numpy Generator) or uniforms")
    out = np.empty((n, d + 1), dtype=np.int64)
    width = 1 if params.encoding == Encoding.L1 else d
    table = EncoderTable.of(params)
    for start in range(0, n, _CHUNK_ROWS):
        stop = min(n, start + _CHUNK_ROWS)
        if uniforms is not None:
            u = uniforms[start:stop]
        else:  # rng is a Generator here (refused above otherwise)
            u = cast(np.random.Generator, rng).random((stop - start, width))
        _encode_chunk(vals[start:stop], table, u, out[start:stop])
    return out


def _encode_chunk(vals: np.ndarray, table: EncoderTable, u: np.ndarray, out: np.ndarray) -> None:
    d = vals.shape[1]
    thresholds = np.array(table.clip_thresholds, dtype=np.float64)
    budget = table.budget
    if table.encoding in (Encoding.LINF, Encoding.BASELINE):
        scales = np.array(table.query_scales, dtype=np.float64)
        for col in range(d):  # loop over queries (d <= 20), vectorized over records
            # min(v, C_l) / C_l * scale: clipped before it is scaled (no overflow for any finite v),
            # exactly ``scale`` when clipped, never above it (Lemma 4.1)
            omega = np.minimum(vals[:, col], thresholds[col])
            omega /= thresholds[col]
            omega *= scales[col]
            out[:, col] = randomized_round(omega, u[:, col])
        if table.count_scale is None:
            out[:, d] = budget
            for col in range(d):
                out[:, d] -= out[:, col]
        else:
            out[:, d] = table.count_scale
        return
    # L1 (Alg. 6)
    scaled, norm = l1_scaled(vals, thresholds)
    shrink = 1.0 / np.maximum(1.0, norm)
    if table.l1_rounding == "floor":
        u_real = scaled * (shrink * table.l1_floor_scale)[:, None]
        out[:, :d] = np.floor(u_real).astype(np.int64)
    else:
        u_real = scaled * (shrink * budget)[:, None]
        offset = u[:, 0]
        prefix = np.minimum(np.cumsum(u_real, axis=1), float(budget))
        cut = np.floor(prefix + offset[:, None])
        np.minimum(cut, float(budget), out=cut)  # exact arithmetic never exceeds S; float rounding can
        out[:, :d] = np.diff(cut, axis=1, prepend=np.floor(offset)[:, None]).astype(np.int64)
    out[:, d] = budget - out[:, :d].sum(axis=1)


def row_sums(a: np.ndarray) -> np.ndarray:
    """``a.sum(axis=-1)`` of a float array with few columns, bit for bit: numpy adds up to 7 columns in
    order (pairwise from 8), and one column at a time is ~30x faster than its strided reduction."""
    d = a.shape[-1]
    if d == 0 or d >= 8:
        return cast(np.ndarray, a.sum(axis=-1))
    out = a[..., 0].copy()
    for j in range(1, d):
        out += a[..., j]
    return out


def l1_scaled(vals: np.ndarray, thresholds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Alg. 6's scaled vectors v = (q_l / C_l)_l and their L1 norms, finite for every finite value.

    A record whose q_l / C_l (or their sum) overflows float64 has |v|_1 = inf, so Alg. 6 keeps only
    its direction v / |v|_1: computed from the ratios shifted by a power of two (``frexp``), it
    replaces v, with norm ~1 (inf / inf would be NaN, and NaN an int64 minimum after rounding).
    """
    with np.errstate(over="ignore"):
        scaled = vals / thresholds
        norm = row_sums(scaled)
    huge = ~np.isfinite(norm)
    if huge.any():
        mantissa, exponent = np.frexp(vals[huge])
        clip_mantissa, clip_exponent = np.frexp(thresholds)
        shift = exponent - clip_exponent
        top = np.where(mantissa > 0, shift, np.iinfo(np.int32).min).max(axis=1)
        direction = np.ldexp(mantissa / clip_mantissa, shift - top[:, None])  # in [0, 2): no overflow
        direction /= direction.sum(axis=1)[:, None]
        scaled[huge] = direction
        norm[huge] = direction.sum(axis=1)
    return scaled, norm


def expected_contribution(values: np.ndarray, params: Params) -> np.ndarray:
    """E[w] per record and value query: the quantity Alg. 4 makes the estimate unbiased for (n, d)."""
    vals = check_values(values, params.num_queries)
    thresholds = np.array([q.clip_threshold for q in params.queries], dtype=np.float64)
    if params.encoding in (Encoding.LINF, Encoding.BASELINE):
        return cast(np.ndarray, query_scales(params)[None, :] * (np.minimum(vals, thresholds) / thresholds))
    scaled, norm = l1_scaled(vals, thresholds)
    shrink = 1.0 / np.maximum(1.0, norm)
    if params.l1_rounding == "floor":
        return cast(np.ndarray, np.floor(scaled * (shrink * (params.contribution_budget / params.count_limit))[:, None]))
    return cast(np.ndarray, scaled * (shrink * params.per_conversion_budget)[:, None])


def rounding_variance(values: np.ndarray, params: Params) -> np.ndarray:
    """Var of each rounded value query per record: f(1-f), f = frac(E w) (0 for L1 floor) (n, d)."""
    if params.encoding == Encoding.L1 and params.l1_rounding == "floor":
        return np.zeros(check_values(values, params.num_queries).shape)
    mean = expected_contribution(values, params)
    frac = mean - np.floor(mean)
    return cast(np.ndarray, frac * (1.0 - frac))
