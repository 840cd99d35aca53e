"""The methods the evaluation compares (Sec. 5): the optimized encodings, the paper's baselines and the
released estimates of the true totals, by the names the CSV files and the figures use."""
from __future__ import annotations

from araopt.constants import BASELINE_QUANTILES
from araopt.optimize.baselines import baseline_name

CORRECTED_METHOD = "corrected"
METHODS = ("optimized_linf", "optimized_l1") + tuple(baseline_name(q) for q in BASELINE_QUANTILES) + (
    CORRECTED_METHOD,)
METHOD_LABELS = {
    CORRECTED_METHOD: "corrected to the true totals (calibrated)",
    "optimized_linf": "optimized L\u221e (Alg. 3 + 5)",
    "optimized_l1": "optimized L1 (Alg. 6)",
    "baseline_q95": "baseline q=0.95",
    "baseline_q99": "baseline q=0.99",
}
