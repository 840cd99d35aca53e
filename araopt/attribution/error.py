"""The error of Attribution Level 1 estimates on a known log (the paper's Thm. 4.2 for this target):
per query and histogram index, bias (clipping at C_l; reports refused for budget or outside the
lookback) and variance (the aggregation's noise; the randomized rounding of the values).

The budget refusals depend on each browser's epoch start and on the roundings: the terms are those
of one simulated draw of both (``simulation_seed``), with the roundings' expectations (E RR(x) = x)
in the bias. The optimizer compares candidate parameters by ``mse`` or the relative error
``rmsre(tau)`` over the slices, as it does for ARA.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from araopt.attribution.encoder import browser_config, schedule
from araopt.attribution.measure import draws, epoch_starts
from araopt.attribution.params import AttributionParams
from araopt.attribution.reconstruct import noise_rate
from araopt.attribution.simulate import Reports, simulate_schedule
from araopt.errors import InvalidParameters
from araopt.mechanism.keys import KeyDomain
from araopt.mechanism.noise import MAX_NOISE_PARAMETER, MIN_NOISE_PARAMETER, discrete_laplace_variance


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


@dataclass(frozen=True)
class Simulated:
    """One simulated draw of the browsers over a log: the rows in the order the browsers saw them,
    each row's histogram index (``index``; ``encoded``: in the domain), its values per query
    (``values``: 1 for the count query) and the reports (which were accepted)."""

    index: np.ndarray
    encoded: np.ndarray
    values: np.ndarray
    reports: Reports

    def accepted_rows(self, query: int) -> np.ndarray:
        """The rows whose report of ``query`` (its position in ``params.queries``) was accepted."""
        out: np.ndarray = self.reports.row[(self.reports.query == query) & self.reports.accepted]
        return out


def simulate_log(params: AttributionParams, rows: pd.DataFrame, domain: KeyDomain, simulation_seed: int) -> Simulated:
    """The browsers of ``params`` over ``rows`` for one simulated draw (roundings and epoch starts keyed
    by ``simulation_seed``, as ``measure.measure`` draws them; one conversion-side task)."""
    if params.conversion_slice_columns:
        raise InvalidParameters("error_terms covers impression-side slices only (one task)")
    ordered, uniforms = draws(params, rows, simulation_seed)
    plan = schedule(params, ordered, domain, uniforms)
    config = browser_config(params, domain.num_slices)
    reports = simulate_schedule(params, plan, ordered, config, epoch_starts(plan, config, simulation_seed))
    values = np.ones((len(params.queries), len(ordered)))
    for qi, q in enumerate(params.queries):
        if q.column is not None:
            values[qi] = ordered[q.column].to_numpy(dtype=np.float64)
    return Simulated(plan.index, plan.encoded, values, reports)


def _noise_variance(rate: float) -> float:
    """The aggregation's noise variance at ``rate`` (DLap(a), ``noise_rate``): Var DLap(a) = 2 e^{-a} /
    expm1(-a)^2 for any a > 0 (infinite at 0). The error model needs the variance, not a draw: the sampler's
    domain (``check_noise_rates``) is the release's rule, and the search scores candidates at a maxValue the
    release does not use (``optimize.attribution.SEARCH_MAX_VALUE``), whose rate may lie below it."""
    if MIN_NOISE_PARAMETER <= rate <= MAX_NOISE_PARAMETER:
        return discrete_laplace_variance(rate)
    below = math.expm1(-rate) ** 2 if rate > 0 else 0.0  # (underflows to 0 below about 1.5e-162)
    return math.inf if below == 0.0 else float(2.0 * math.exp(-rate) / below)


def error_terms(params: AttributionParams, rows: pd.DataFrame, domain: KeyDomain, simulation_seed: int,
                simulated: Simulated | None = None) -> ErrorTerms:
    """The error terms of ``params`` on ``rows`` (one conversion-side task; every row in ``domain``);
    ``simulated``: the draw of :func:`simulate_log` for these parameters, if already made."""
    sim = simulated if simulated is not None else simulate_log(params, rows, domain, simulation_seed)
    size, queries = domain.num_slices, params.queries
    index, encoded = sim.index, sim.encoded
    truth = np.zeros((len(queries), size))
    expected = np.zeros((len(queries), size))
    rounding = np.zeros((len(queries), size))
    for qi, q in enumerate(queries):
        v = sim.values[qi]
        truth[qi] = np.bincount(index[encoded], weights=v[encoded], minlength=size)
        rows_accepted = sim.accepted_rows(qi)
        clipped = np.minimum(v[rows_accepted], q.clip)
        expected[qi] = np.bincount(index[rows_accepted], weights=clipped, minlength=size)
        scaled = clipped * q.value_scale
        frac = scaled - np.floor(scaled)
        rounding[qi] = np.bincount(index[rows_accepted], weights=frac * (1 - frac), minlength=size) / q.value_scale**2
    noise = np.array([_noise_variance(noise_rate(q)) / q.value_scale**2 for q in queries])[:, None]
    return ErrorTerms(truth, expected - truth, rounding + noise)
