"""Estimates of the TRUE totals from Alg. 4's estimates, with intervals, for this target: what the
browsers lose (reports refused for budget, values clipped at C_l) is learnt on a training log.

On the training log the error model (``attribution.error``, Thm. 4.2 for this target) gives per query
l and histogram index j the truth V_lj and the expectation E U_lj of Alg. 4's estimate. The retention
ratio r_l = sum_j E U_lj / sum_j V_lj (as ARA's calibration's retention ratio) turns an estimate into
an estimate of the true total, U / r_l; the spread delta_l is the ``level`` quantile over the indices
with V_lj > 0 of |1 - r_lj / r_l| (how far one index's ratio strays from the pooled one). The interval
of the true total is U / r_l +- (h / r_l + delta_l |U / r_l|), h the noise interval's half width: the
noise part and the ratio part added (a conservative union of the two).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from araopt.attribution.error import error_terms
from araopt.attribution.params import AttributionParams
from araopt.attribution.reconstruct import Estimate
from araopt.errors import InvalidParameters
from araopt.mechanism.keys import KeyDomain


@dataclass(frozen=True)
class Retention:
    """Per query (``params.queries`` order): the retention ratio r_l and the spread delta_l."""

    ratios: tuple[float, ...]
    spreads: tuple[float, ...]
    level: float

    def true_totals(self, query: int, estimate: Estimate) -> tuple[np.ndarray, np.ndarray]:
        """The estimates of the true totals of ``query`` and the half widths of their intervals."""
        ratio, spread = self.ratios[query], self.spreads[query]
        values: np.ndarray = estimate.values / ratio
        half: np.ndarray = estimate.half_width / ratio + spread * np.abs(values)
        return values, half


def retention(params: AttributionParams, rows: pd.DataFrame, domain: KeyDomain, simulation_seed: int = 0,
              level: float = 0.95) -> Retention:
    """The retention ratios and spreads of ``params`` on the training ``rows`` (module docstring)."""
    if not 0 < level < 1:
        raise InvalidParameters(f"level must lie in (0, 1), got {level!r}")
    terms = error_terms(params, rows, domain, simulation_seed)
    expected = terms.truth + terms.bias
    ratios, spreads = [], []
    for q in range(len(params.queries)):
        truth, kept = terms.truth[q], expected[q]
        total = float(truth.sum())
        ratio = float(kept.sum()) / total if total > 0 else 1.0
        ratio = ratio if ratio > 0 else 1.0
        seen = truth > 0
        spread = float(np.quantile(np.abs(1.0 - kept[seen] / truth[seen] / ratio), level)) if seen.any() else 0.0
        ratios.append(ratio)
        spreads.append(spread)
    return Retention(tuple(ratios), tuple(spreads), level)
