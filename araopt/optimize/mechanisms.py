"""What the optimizer needs to know about a target's mechanism (the paper's Sec. 4, Relaxation 4.5),
so that one ParameterOptimization (Alg. 5) serves both targets.

For a count limit C, budget fractions alpha_l, clip thresholds C_l and a budget epsilon, the noise
variance of query l's estimate (Alg. 4, in the query's unit) is ``constant * C^2 C_l^2 / (alpha_l^2
epsilon^2)``:

* ARA (L-inf, Alg. 3): DLap of parameter epsilon / Gamma on a key scaled to floor(alpha_l Gamma / C):
  constant 2; the count is estimated from the sum of the queries' keys (no separate count fraction).
* W3C Attribution Level 1 (``araopt.attribution``): a report of query l sends at most maxValue with
  epsilon_l = alpha_l epsilon_site / C (C full reports in a site-epoch: a report whose lookback spans
  several epochs deducts ``2 value * epsilon_l / (2 maxValue)``, epsilon_l at maxValue; one inside a
  single epoch half that), the aggregation adds Laplace of scale 2 maxValue / epsilon_l, so the
  variance in the column's unit is 8 C_l^2 / epsilon_l^2 = 8 C^2 C_l^2 / (alpha_l^2 epsilon_site^2):
  constant 8; the count is a query of its own (value 1, C_0 = 1).

Minimising sum_l K_l / alpha_l^2 subject to sum_l alpha_l = 1 gives alpha_l proportional to
K_l^(1/3) (Lagrange; ``split_fractions``), the budget step of the alternating search in both.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from araopt.errors import InvalidParameters


@dataclass(frozen=True)
class NoiseModel:
    """Relaxation 4.5 for one target: ``constant`` of the variance and whether the count is a query
    with its own budget fraction (``separate_count``; its clip threshold is 1)."""

    name: str
    constant: float
    separate_count: bool

    def variance(self, count_limit: int, clips: np.ndarray, fractions: np.ndarray, epsilon: float) -> np.ndarray:
        """Per query (``clips`` and ``fractions`` aligned), ``constant C^2 C_l^2 / (alpha_l^2 epsilon^2)``."""
        clips = np.asarray(clips, dtype=np.float64)
        fractions = np.asarray(fractions, dtype=np.float64)
        if clips.shape != fractions.shape or (fractions <= 0).any() or not epsilon > 0:
            raise InvalidParameters(f"noise variance needs one positive fraction per clip threshold and epsilon > 0, "
                                    f"got {clips.tolist()}, {fractions.tolist()}, {epsilon!r}")
        out: np.ndarray = self.constant * count_limit**2 * clips**2 / (fractions**2 * epsilon**2)
        return out


ARA_LINF = NoiseModel("ara", 2.0, separate_count=False)
ATTRIBUTION = NoiseModel("attribution", 8.0, separate_count=True)


def split_fractions(variance_factors: np.ndarray) -> np.ndarray:
    """The budget split minimising sum_l K_l / alpha_l^2 with sum alpha_l = 1: alpha_l ~ K_l^(1/3)."""
    r = np.cbrt(np.maximum(np.asarray(variance_factors, dtype=np.float64), 1e-300))
    out: np.ndarray = r / r.sum()
    return out
