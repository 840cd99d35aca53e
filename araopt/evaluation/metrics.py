"""The error metrics of the paper's metrics table (Appendix A), per slice and averaged over slices.

Closed forms from bias and variance where one exists (RMSE, RMSRE, RMSRE_tau); the others
(probabilities and absolute errors) are computed on Monte-Carlo samples of the estimates.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np
import pandas as pd

from araopt.errors import InvalidInput
from araopt.optimize.error_model import ErrorBreakdown, RmsreTau, realised_relative_bias, realised_rmsre_tau

# the one realised RMSRE_tau (Def. 3.2) of replay, the demo and evaluate, and its shared part
__all__ = ["RmsreTau", "realised_relative_bias", "realised_rmsre_tau"]


def _as_samples(samples: np.ndarray, truth: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(samples, dtype=np.float64)
    t = np.asarray(truth, dtype=np.float64)
    if s.ndim != 2 or s.shape[1] != t.shape[0]:
        raise InvalidInput(f"samples must be (runs, m) with m = len(truth) = {t.shape[0]}, got {s.shape}")
    return s, t


def are(samples: np.ndarray, truth: np.ndarray, alpha: float) -> np.ndarray:
    """ARE_alpha: P[|U - V| / V > alpha] per slice (undefined, NaN, where V = 0)."""
    s, t = _as_samples(samples, truth)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.abs(s - t) / t
    out = (rel > alpha).mean(axis=0)
    return np.where(t == 0, np.nan, out)


def ame(samples: np.ndarray, truth: np.ndarray, tau: float) -> np.ndarray:
    """AME_tau: P[|U - V| > tau] per slice."""
    s, t = _as_samples(samples, truth)
    return cast(np.ndarray, (np.abs(s - t) > tau).mean(axis=0))


def apme(samples: np.ndarray, truth: np.ndarray, alpha: float, tau: float) -> np.ndarray:
    """APME_{alpha,tau}: P[|U - V| / V > alpha and |U - V| > tau] per slice (V = 0 counts as relative > alpha)."""
    s, t = _as_samples(samples, truth)
    err = np.abs(s - t)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel_big = np.where(t > 0, err / np.where(t > 0, t, 1.0) > alpha, err > 0)
    return cast(np.ndarray, (rel_big & (err > tau)).mean(axis=0))


def eare(samples: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """EARE: E[|U - V| / V] (NaN where V = 0)."""
    s, t = _as_samples(samples, truth)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(t == 0, np.nan, (np.abs(s - t) / t).mean(axis=0))


def eare_tau(samples: np.ndarray, truth: np.ndarray, tau: float) -> np.ndarray:
    """EARE_tau: E[|U - V| / max(tau, V)]."""
    s, t = _as_samples(samples, truth)
    return cast(np.ndarray, (np.abs(s - t) / np.maximum(tau, t)).mean(axis=0))


def eareo(samples: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """EAREO: E[|U - V| / U] (relative to the observation; NaN where a sample is 0)."""
    s, t = _as_samples(samples, truth)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.abs(s - t) / np.abs(s)
    return np.where((s == 0).any(axis=0), np.nan, ratio.mean(axis=0))


def rmse(samples: np.ndarray, truth: np.ndarray) -> np.ndarray:
    s, t = _as_samples(samples, truth)
    return cast(np.ndarray, np.sqrt(((s - t) ** 2).mean(axis=0)))


def rmsre(samples: np.ndarray, truth: np.ndarray) -> np.ndarray:
    s, t = _as_samples(samples, truth)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(t == 0, np.nan, np.sqrt((((s - t) / t) ** 2).mean(axis=0)))


def rmsre_tau_samples(samples: np.ndarray, truth: np.ndarray, tau: float) -> np.ndarray:
    """RMSRE_tau per slice on samples: sqrt(E[((U - V) / max(tau, V))^2])."""
    s, t = _as_samples(samples, truth)
    return cast(np.ndarray, np.sqrt((((s - t) / np.maximum(tau, t)) ** 2).mean(axis=0)))


# ---- closed forms from the error model -------------------------------------------------------
def rmse_closed_form(breakdown: ErrorBreakdown) -> np.ndarray:
    """sqrt(bias^2 + Var) per slice and query."""
    return cast(np.ndarray, np.sqrt(breakdown.mse))


def rmsre_closed_form(breakdown: ErrorBreakdown) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(breakdown.truth == 0, np.nan, np.sqrt(breakdown.mse) / breakdown.truth)


def rmsre_tau_closed_form(breakdown: ErrorBreakdown, taus: np.ndarray) -> np.ndarray:
    return cast(np.ndarray, np.sqrt(breakdown.mse) / np.maximum(np.asarray(taus)[None, :], breakdown.truth))


def metrics_table(samples: np.ndarray, truth: np.ndarray, alpha: float = 0.1, tau: float = 5.0) -> dict[str, float]:
    """All metrics of the paper's table on Monte-Carlo samples, averaged over slices (NaN-aware)."""
    s, t = _as_samples(samples, truth)
    per = {
        f"ARE_{alpha:g}": are(s, t, alpha), f"AME_{tau:g}": ame(s, t, tau),
        f"APME_{alpha:g},{tau:g}": apme(s, t, alpha, tau),
        "EARE": eare(s, t), "RMSE": rmse(s, t), "RMSRE": rmsre(s, t), f"EARE_{tau:g}": eare_tau(s, t, tau),
        "EAREO": eareo(s, t),
    }
    out = {k: float(np.nanmean(v)) if np.isfinite(v).any() else float("nan") for k, v in per.items()}
    out[f"RMSRE_{tau:g}"] = float(np.sqrt(np.mean(rmsre_tau_samples(s, t, tau) ** 2)))
    return out


def realised_rmsre_of_estimates(estimates: pd.DataFrame, truth: pd.DataFrame, slice_columns: Sequence[str],
                                queries: Sequence[str], taus: Sequence[float]) -> float:
    """RMSRE_tau (Def. 3.2, ``realised_rmsre_tau``) of a release's long-format estimates table (the one
    ``publication.estimates_frame`` makes) against the true totals ``truth`` (indexed by the slice
    columns, one column per query); a released slice absent from the truth has true total 0."""
    released = estimates[estimates["query"].isin(queries)].pivot_table(
        index=list(slice_columns), columns="query", values="estimate", aggfunc="sum").reindex(columns=list(queries))
    true = truth.reindex(released.index, fill_value=0.0)[list(queries)]
    return realised_rmsre_tau(released.to_numpy(dtype=float), true.to_numpy(dtype=float), np.asarray(taus)).combined
