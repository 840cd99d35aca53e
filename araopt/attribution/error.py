"""The error of Attribution Level 1 estimates on a known log (the paper's Thm. 4.2 for this target):
per query and histogram index, bias (clipping at C_l; reports refused for budget or outside the
lookback) and variance (the aggregation's noise; the randomized rounding of the values).

The budget refusals depend on each browser's epoch start and on the roundings: the terms are those
of one simulated draw of both (``simulation_seed``), with the roundings' expectations (E RR(x) = x)
in the bias. The optimizer compares candidate parameters by ``mse`` or the relative error
``rmsre(tau)`` over the slices, as it does for ARA.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from araopt.attribution.encoder import browser_config, schedule
from araopt.attribution.measure import draws, epoch_starts
from araopt.attribution.params import AttributionParams
from araopt.attribution.reconstruct import noise_rate
from araopt.attribution.simulate import simulate_schedule
from araopt.errors import InvalidParameters
from araopt.mechanism.keys import KeyDomain
from araopt.mechanism.noise import discrete_laplace_variance


@dataclass(frozen=True)
class ErrorTerms:
    """Per query (rows, ``params.queries`` order) and index (columns): the true totals of the log, the
    estimates' bias and variance, in each query's unit."""

    truth: np.ndarray
    bias: np.ndarray
    variance: np.ndarray

    @property
    def mse(self) -> np.ndarray:
        out: np.ndarray = self.bias**2 + self.variance
        return out

    def rmsre(self, tau: float) -> np.ndarray:
        """Root mean squared relative error per entry, relative to max(truth, tau) (the paper's RMSRE_tau)."""
        if not tau > 0:
            raise InvalidParameters(f"tau must be > 0, got {tau!r}")
        out: np.ndarray = np.sqrt(self.mse) / np.maximum(self.truth, tau)
        return out


def error_terms(params: AttributionParams, rows: pd.DataFrame, domain: KeyDomain, simulation_seed: int) -> ErrorTerms:
    """The error terms of ``params`` on ``rows`` (one conversion-side task; every row in ``domain``)."""
    if params.conversion_slice_columns:
        raise InvalidParameters("error_terms covers impression-side slices only (one task)")
    ordered, uniforms = draws(params, rows, simulation_seed)
    plan = schedule(params, ordered, domain, uniforms)
    config = browser_config(params, domain.num_slices)
    reports = simulate_schedule(params, plan, ordered, config, epoch_starts(plan, config, simulation_seed))
    size, queries = domain.num_slices, params.queries
    index = plan.index
    encoded = plan.encoded
    truth = np.zeros((len(queries), size))
    expected = np.zeros((len(queries), size))
    rounding = np.zeros((len(queries), size))
    values = {c: ordered[c].to_numpy(dtype=np.float64) for c in params.value_columns}
    for qi, q in enumerate(queries):
        v = np.ones(len(ordered)) if q.column is None else values[q.column]
        truth[qi] = np.bincount(index[encoded], weights=v[encoded], minlength=size)
        mine = reports.query == qi
        rows_accepted = reports.row[mine & reports.accepted]
        clipped = np.minimum(v[rows_accepted], q.clip)
        expected[qi] = np.bincount(index[rows_accepted], weights=clipped, minlength=size)
        scaled = clipped * q.value_scale
        frac = scaled - np.floor(scaled)
        rounding[qi] = np.bincount(index[rows_accepted], weights=frac * (1 - frac), minlength=size) / q.value_scale**2
    noise = np.array([discrete_laplace_variance(noise_rate(q)) / q.value_scale**2 for q in queries])[:, None]
    return ErrorTerms(truth, expected - truth, rounding + noise)
