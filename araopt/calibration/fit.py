"""Fitting the calibration model (``calibration.model``'s docstring) on extracted statistics:
DerSimonian-Laird between-slice variance, empirical-Bayes shrinkage, period and interaction variances."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from araopt.calibration.accumulator import CalibrationStatistics, _col, calibration_statistics
from araopt.calibration.model import (
    _COUNT,
    _Z95_ONE_SIDED,
    KAPPA_PSEUDO_CONVERSIONS,
    MIN_INTERACTION_CLUSTERS,
    MIN_RATIO,
    Calibration,
    retention_checksum,
)
from araopt.errors import InvalidInput
from araopt.io.conversions import Conversions
from araopt.mechanism.keys import slice_value
from araopt.mechanism.params import Params


@dataclass(frozen=True)
class Shrinkage:
    ratio: np.ndarray          # (m, G) shrunk ratio (mu where not valid)
    variance: np.ndarray       # (m, G) Var(rho_j | history) (unseen variance where not valid)
    mu: np.ndarray             # (G,)
    mu_variance: np.ndarray    # (G,)
    between: np.ndarray        # (G,) s2_slice
    between_upper: np.ndarray  # (G,)
    unseen_variance: np.ndarray  # (G,)


def shrink(r: np.ndarray, s2: np.ndarray, valid: np.ndarray) -> Shrinkage:
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
    return Shrinkage(np.clip(ratio, MIN_RATIO, 1.0), post, mu, mu_var, between, upper, unseen)




def fit_calibration(stats: CalibrationStatistics, blocks: Sequence[Any] | None = None,
                    kappa_pseudo_conversions: float = KAPPA_PSEUDO_CONVERSIONS) -> Calibration:
    """Fit the model of the module docstring on extracted statistics (optionally a subset of blocks).

    ``blocks`` (block ids) restricts the fit, e.g. to the same weekday as the measured period.
    """
    cells = stats.cells
    bkeys = stats.block_keys
    if blocks is not None:
        wanted = [slice_value(b) for b in blocks]
        idx = [i for i, b in enumerate(bkeys) if b in set(wanted)]
        missing = set(wanted) - {bkeys[i] for i in idx}
        if missing:
            raise InvalidInput(f"blocks {sorted(map(str, missing))} are not in the calibration statistics")
        cells, bkeys = cells[:, idx], tuple(bkeys[i] for i in idx)
    present = cells[:, :, _col(0, "T")].sum(axis=1) > 0
    cells = cells[present]
    slice_keys = tuple(k for k, p in zip(stats.slice_keys, present, strict=True) if p)
    m, B = cells.shape[0], cells.shape[1]
    if m == 0 or B == 0:
        raise InvalidInput("no conversions in the calibration history")
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
        sh = shrink(r_j[:, None], s2[:, None], valid[:, None])
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
        params_checksum=stats.fitted_for or retention_checksum(stats.params),
        retention_checksum=retention_checksum(stats.params),
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


