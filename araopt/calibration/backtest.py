"""Replaying releases on the history's own blocks (``backtest``): the error a release of a period
would have had, each block's correction learnt without it."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from araopt.calibration.accumulator import CalibrationStatistics
from araopt.calibration.model import MIN_RATIO, Calibration
from araopt.errors import InvalidParameters
from araopt.mechanism.params import Params
from araopt.mechanism.report import estimate_variance


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
        raise InvalidParameters(f"correction must be 'ratio' or 'none', got {correction!r}")
    P = int(period_blocks)
    B = stats.cells.shape[1]
    if P < 1 or P > B:
        raise InvalidParameters(f"period_blocks must lie in [1, {B}] (blocks in the history), got {period_blocks!r}")
    t = np.asarray(taus, dtype=np.float64)
    d = params.num_queries
    if t.shape != (d + 1,):
        raise InvalidParameters(f"taus must be {d + 1} numbers (count first), got {t}")
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


