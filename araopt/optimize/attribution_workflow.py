"""Tuning for the W3C Attribution target, written once for ``optimize``, ``nightly`` and ``evaluate``
with ``--api attribution`` (docs/attribution.md), the sibling of ARA's tuning workflow
(``optimize.workflow``): a history in memory -> its histogram layout -> ParameterOptimization (Alg. 5,
``optimize.attribution``: the browsers simulated over the history's rows, the noise of
``mechanisms.ATTRIBUTION``) -> the retention calibration of the chosen parameters on the same history
(``attribution.calibrate``: measure then publishes estimates of the true totals) -> the parameter
version (api attribution) -> the baselines scored on the same history, for the guardrails
(``araopt.nightly``) and the console."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from araopt.attribution.calibrate import retention
from araopt.attribution.params import COUNT
from araopt.errors import InvalidParameters
from araopt.mechanism.keys import KeyDomain
from araopt.optimize.attribution import (
    BASELINES,
    AttributionOptimization,
    AttributionProblem,
    baseline_params,
    optimize_attribution,
    predicted_rmsre_tau,
)
from araopt.version import ParameterVersion


def history_domain(rows: pd.DataFrame, slices: Sequence[str], values: Sequence[str]) -> KeyDomain:
    """The histogram layout of the history's impression-side slices (as ARA's optimize takes the
    history's key domain)."""
    return KeyDomain.from_slice_values(tuple(slices), {c: rows[c].to_numpy() for c in slices}, (COUNT, *values))


@dataclass(frozen=True)
class AttributionTuning:
    """One tuning on a history: the optimization, its problem, the history's size and layout, and the
    parameter version that carries the chosen parameters and their retention calibration."""

    optimization: AttributionOptimization
    problem: AttributionProblem
    rows: int
    domain: KeyDomain
    version: ParameterVersion
    comparison: pd.DataFrame  # the chosen parameters and the baselines on the history (``comparison``)

    @property
    def baselines(self) -> dict[str, float]:
        """Each baseline's predicted training RMSRE_tau (the guardrails' bar)."""
        return {str(r["method"]): float(r["train RMSRE_tau"]) for _, r in self.comparison.iterrows()
                if r["method"] != "optimized"}


def tune_attribution(rows: pd.DataFrame, slices: Sequence[str], values: Sequence[str], budget: float,
                     max_count_limit: int, seed: int, what: str = "the history") -> AttributionTuning:
    """Optimize on the valid ``rows`` of a history, fit the retention calibration of the chosen
    parameters on the same history and build the version (api attribution) that carries both."""
    if not len(rows):
        raise InvalidParameters(f"{what} has no valid rows")
    domain = history_domain(rows, slices, values)
    problem = AttributionProblem(budget, tuple(values), tuple(slices), max_count_limit=max_count_limit)
    result = optimize_attribution(problem, rows, domain, simulation_seed=seed)
    fitted = retention(result.params, rows, domain, seed)
    version = ParameterVersion.for_attribution(result.params, domain=domain, retention=fitted)
    return AttributionTuning(result, problem, len(rows), domain, version, comparison(result, problem, rows, domain))


def comparison(result: AttributionOptimization, problem: AttributionProblem, rows: pd.DataFrame,
               domain: KeyDomain) -> pd.DataFrame:
    """The chosen parameters and the baselines on the history (predicted RMSRE_tau, ratio to optimized)."""
    out = [("optimized", result.params, result.rmsre_tau)]
    for name in BASELINES:
        p = baseline_params(name, problem, rows)
        out.append((name, p, predicted_rmsre_tau(p, rows, domain, np.array(result.taus))))
    return pd.DataFrame([{"method": name, "C": p.count_limit(multi_epoch=True),
                          "epsilons": ", ".join(f"{q.epsilon:.4g}" for q in p.queries),
                          "max_values": ", ".join(str(q.max_value) for q in p.queries),
                          "clips": ", ".join(f"{q.clip:.4g}" for q in p.queries), "lookback_days": p.lookback_days,
                          "train RMSRE_tau": value, "ratio": value / result.rmsre_tau} for name, p, value in out])
