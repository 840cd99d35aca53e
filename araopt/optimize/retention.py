"""The retention curve: what share of a period's conversions ContributionCapping (Alg. 1) keeps at
each count limit, learnt from noisy releases (privacy-safe tuning).

Under the L-inf and L1 encodings every conversion costs floor(Gamma / C) of its impression's budget,
so Alg. 1 keeps an impression's first K(C) conversions over its life. In a steady state the share of
a day's conversions kept is r(K) = E[min(n, K)] / E[n], n an impression's conversions. Such a curve
is non-decreasing and concave with r(0) = 0 and r -> 1, and every such curve is a mixture
    r(K) = sum_j t_j min(j + 1, K),   t_j >= 0,   sum_j t_j (j + 1) = 1,
t_j proportional to the share of impressions with j + 1 conversions. It is fitted to noisy points
(K, r_hat, variance) by non-negative least squares with a penalty on the second differences of t
from size 2 on (smooth size distributions beside a mass of single conversions); its uncertainty at
a K by a parametric bootstrap of the points.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from scipy.optimize import nnls

from araopt.errors import InvalidInput

MAX_SIZE = 256
"""Impression sizes the mixture spans (conversions per impression beyond it count as this many)."""
SMOOTHNESS = 100.0
"""Weight of the second-difference penalty, relative to a typical point's weight."""


@dataclass(frozen=True)
class RetentionCurve:
    """Mixture weights t_j (size j + 1) and the points they were fitted to."""

    weights: np.ndarray
    points: tuple[tuple[int, float, float], ...] = ()
    rows: tuple[np.ndarray | None, ...] = ()
    """Per point, what it keeps of an impression of each size when that is not min(n, K) (a release
    in a count-limit transient, ``optimize.transient.kept_table``); empty or None: min(n, K)."""

    def ratio(self, kept_ranks: int | Sequence[int] | np.ndarray) -> np.ndarray:
        """r(K) for every K of ``kept_ranks``."""
        k = np.atleast_1d(np.asarray(kept_ranks, dtype=np.float64))
        sizes = np.arange(1, len(self.weights) + 1, dtype=np.float64)
        return np.asarray(np.minimum(sizes[None, :], k[:, None]) @ self.weights, dtype=np.float64)

    def size_distribution(self) -> np.ndarray:
        """P(n = j + 1) over impressions with at least one conversion."""
        total = float(self.weights.sum())
        if total <= 0:
            raise InvalidInput("the retention curve has no mass")
        return np.asarray(self.weights / total, dtype=np.float64)

    def mean_size(self) -> float:
        p = self.size_distribution()
        return float(p @ np.arange(1, len(p) + 1))


def fit_retention_curve(points: Sequence[tuple[int, float, float]], smoothness: float = SMOOTHNESS,
                        max_size: int = MAX_SIZE, rows: Sequence[np.ndarray | None] = ()) -> RetentionCurve:
    """The mixture closest to the points (kept ranks K, ratio, variance of the ratio), weighted by
    their precision, r(infinity) = 1 held almost exactly. ``rows``: per point, the kept conversions of
    an impression of each size (1..) when they are not min(n, K) (a main release in a count-limit
    transient reads sum_j t_j row_j); missing or None: min(n, K)."""
    if not points:
        raise InvalidInput("no points to fit a retention curve to")
    if any(int(k) < 1 or not np.isfinite(r) or not np.isfinite(v) or v < 0 for k, r, v in points):
        raise InvalidInput(f"retention points must be (K >= 1, finite ratio, finite variance >= 0), got {list(points)}")
    if len(rows) > len(points):
        raise InvalidInput(f"{len(rows)} kept rows for {len(points)} retention points")
    sizes = np.arange(1, max_size + 1, dtype=np.float64)
    k = np.array([p[0] for p in points], dtype=np.float64)
    r = np.array([p[1] for p in points], dtype=np.float64)
    w = 1.0 / np.sqrt(np.maximum(np.array([p[2] for p in points], dtype=np.float64), 1e-10))
    scale = float(np.median(w))
    kept = np.minimum(sizes[None, :], k[:, None])
    for i, row in enumerate(rows):
        if row is not None:
            given = np.asarray(row, dtype=np.float64)[:max_size]
            kept[i, :len(given)] = given
            kept[i, len(given):] = given[-1]
    rows_ = [kept * w[:, None], sizes[None, :] * scale * 1e3]
    target = [r * w, np.array([scale * 1e3])]
    if smoothness > 0:
        # sizes 2, 3, ... are smooth; size 1 is not in the penalty: single-conversion impressions are a
        # mass of their own in many logs (a campaign whose impressions convert once), which a penalty
        # through it would smear over sizes 2 and 3 (r(1) then far below what the arm at C = 1 shows)
        d2 = np.zeros((max_size - 3, max_size))
        idx = np.arange(1, max_size - 2)
        d2[idx - 1, idx], d2[idx - 1, idx + 1], d2[idx - 1, idx + 2] = 1.0, -2.0, 1.0
        rows_.append(np.sqrt(smoothness) * scale * d2)
        target.append(np.zeros(max_size - 3))
    t, _ = nnls(np.vstack(rows_), np.concatenate(target), maxiter=50 * max_size)
    return RetentionCurve(t, tuple((int(a), float(b), float(c)) for a, b, c in points),
                          tuple(None if row is None else np.asarray(row, dtype=np.float64) for row in rows))


@dataclass(frozen=True)
class CurveBootstrap:
    """The parametric bootstrap of a fitted curve: ``reps`` refits to its points moved by their own
    noise (seeded: model uncertainty, not privacy noise). The refits do not depend on the kept ranks
    asked about, so they are fitted once (on first use) for every K the caller asks of the same curve
    (the privacy-safe tuner asks it for each candidate's count limit)."""

    curve: RetentionCurve
    reps: int = 30
    seed: int = 0
    smoothness: float = SMOOTHNESS

    @cached_property
    def fits(self) -> tuple[RetentionCurve, ...]:
        rng = np.random.default_rng(self.seed)
        fits = []
        for _ in range(self.reps):
            moved = [(k, float(r + rng.normal(0.0, np.sqrt(v))), v) for k, r, v in self.curve.points]
            fits.append(fit_retention_curve(moved, self.smoothness, rows=self.curve.rows))
        return tuple(fits)

    def ratio_variance(self, kept_ranks: Sequence[int]) -> np.ndarray:
        """Variance of the fitted r(K) at ``kept_ranks`` over the refits."""
        k = np.asarray(kept_ranks)
        return np.asarray(np.var(np.array([fit.ratio(k) for fit in self.fits]), axis=0), dtype=np.float64)


def ratio_variance(curve: RetentionCurve, kept_ranks: Sequence[int], reps: int = 30, seed: int = 0,
                   smoothness: float = SMOOTHNESS) -> np.ndarray:
    """Variance of the fitted r(K) at ``kept_ranks`` when the points move by their own noise
    (``CurveBootstrap``; keep one of those to ask several K of the same curve)."""
    return CurveBootstrap(curve, reps, seed, smoothness).ratio_variance(kept_ranks)
