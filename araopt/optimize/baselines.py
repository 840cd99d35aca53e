"""The paper's baselines (Sec. 5.1): equal budget fractions with a separate count key, clip thresholds
and count limit at a quantile of the training data; named and evaluated on the same statistics."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from araopt.constants import BASELINE_QUANTILES, OBJECTIVE, Objective
from araopt.errors import InvalidParameters, check_epsilon
from araopt.mechanism.params import Params
from araopt.optimize.objective import check_max_count_limit, check_taus, predicted_rmsre_tau
from araopt.optimize.search import candidate_params
from araopt.optimize.statistics import SufficientStatistics


def baseline_params(
    stats: SufficientStatistics, epsilon: float, quantile: float, max_count_limit: int | None = None,
    taus: np.ndarray | Sequence[float] | None = None, slice_columns: Sequence[str] | None = None,
) -> Params:
    """Sec. 5.1 baseline: alpha_0 = ... = alpha_d = 1/(d+1) with a separate count key; C_l = training
    quantile of per-conversion values; C = quantile of conversions per impression (capped at C_max)."""
    epsilon = check_epsilon(epsilon)
    if not 0.0 < quantile <= 1.0:
        raise InvalidParameters(f"quantile must lie in (0, 1], got {quantile!r}")
    cmax = stats.spec.max_count_limit if max_count_limit is None else check_max_count_limit(stats, max_count_limit)
    tau = check_taus(stats, taus)
    d = stats.num_queries
    C = int(min(max(1, stats.impression_size_quantile(quantile)), cmax))
    thresholds = []
    for q in range(d):
        t = stats.quantile(q, quantile)
        thresholds.append(t if t > 0 else (stats.mean(q) if stats.mean(q) > 0 else 1.0))
    frac = 1.0 / (d + 1)
    return candidate_params(stats, "baseline", epsilon, C, np.array(thresholds), np.full(d, frac), tau, slice_columns,
                        count_fraction=1.0 - d * frac)


def baseline_name(quantile: float) -> str:
    """One naming for the paper's baselines everywhere: ``baseline_q95`` for the 0.95 quantile."""
    return f"baseline_q{quantile * 100:g}"


@dataclass(frozen=True)
class Baseline:
    """The Sec. 5.1 baseline at one quantile and its predicted RMSRE_tau on the same statistics."""

    name: str
    quantile: float
    params: Params
    rmsre_tau: float

    def to_json(self) -> dict[str, Any]:
        return {"quantile": self.quantile, "count_limit": self.params.count_limit, "rmsre_tau": self.rmsre_tau,
                "clip_thresholds": [q.clip_threshold for q in self.params.queries]}


def baselines(statistics: SufficientStatistics, epsilon: float, max_count_limit: int, taus: np.ndarray | Sequence[float],
              objective: Objective = OBJECTIVE.error_model, slice_columns: Sequence[str] | None = None,
              quantiles: Sequence[float] = BASELINE_QUANTILES) -> tuple[Baseline, ...]:
    """The paper's baselines (equal fractions, quantile thresholds and count limit), evaluated."""
    taus_arr = np.asarray(taus, dtype=np.float64)
    out = []
    for q in quantiles:
        p = baseline_params(statistics, epsilon, q, max_count_limit, taus_arr, slice_columns=slice_columns)
        out.append(Baseline(baseline_name(q), float(q), p, predicted_rmsre_tau(statistics, p, taus_arr, objective)))
    return tuple(out)
