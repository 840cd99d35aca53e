"""Expected error of the reconstructed estimates: bias, variance and RMSRE_tau (Sec. 4.3, Def. 3.2).

``exact`` uses Thm. 4.2 with the exact DLap variance 2e^a/(e^a-1)^2, the randomized-rounding
variance sum f(1-f) of the kept records, and the floors floor(alpha_l Gamma / C), floor(Gamma / C).
``relaxed`` is the paper's Relaxation 4.5: Var U_l = 2 C^2 C_l^2 / (alpha_l^2 eps^2),
Var U_0 = 2 (d+1) C^2 / eps^2 (no rounding variance, no floors); the bias is exact in both.

Which records are kept is decided exactly as Alg. 1 does, with Chrome's limit of 20 reports per
source (``araopt.mechanism.bounding``): for L-inf and L1 every contribution has norm floor(Gamma/C), so the
first min(Gamma // floor(Gamma/C), 20) conversions of each impression are kept.
For the baseline, norms vary with the (random) rounding; we decide with the expected norm rounded
to the nearest integer, which differs from the realised decision only when an impression's running
total lands within d units of Gamma (documented approximation, baseline only).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from araopt.constants import OBJECTIVE, Objective
from araopt.errors import InvalidInput, InvalidParameters
from araopt.io.conversions import Conversions
from araopt.mechanism.bounding import kept_mask
from araopt.mechanism.encoding import expected_contribution, query_scales, rounding_variance
from araopt.mechanism.params import Encoding, Params
from araopt.mechanism.report import SIGNAL_SDS, estimate_variance, without_signal
from araopt.optimize.mechanisms import ARA_LINF
from araopt.version import ParameterVersion

ERROR_MODELS = (Objective.EXACT, Objective.RELAXED)
"""The paper's error models of Alg. 4's estimates (``constants.Objective``): Thm. 4.2 or Relaxation 4.5."""


def check_error_model(objective: str) -> Objective:
    """``objective`` as an ``Objective`` if it is one of the paper's error models (``ERROR_MODELS``)."""
    if objective not in ERROR_MODELS:
        raise InvalidParameters(f"objective must be one of {tuple(map(str, ERROR_MODELS))}, got {str(objective)!r}")
    return Objective(objective)


@dataclass(frozen=True)
class ErrorBreakdown:
    """Per slice j and query (count, q_1..q_d): truth V, expectation E[U] and variance Var(U)."""

    truth: np.ndarray
    expected: np.ndarray
    variance: np.ndarray

    @property
    def bias(self) -> np.ndarray:
        return cast(np.ndarray, self.expected - self.truth)

    @property
    def mse(self) -> np.ndarray:
        return cast(np.ndarray, self.bias**2 + self.variance)


@dataclass(frozen=True)
class RmsreTau:
    """RMSRE_tau per query (count first) and combined over queries (Def. 3.2)."""

    per_query: np.ndarray
    combined: float


def default_taus(values: np.ndarray, count_tau: float = 5.0) -> np.ndarray:
    """tau = (5, 5 median(q_1), ..., 5 median(q_d)) over training records (Sec. 5.1).

    A query whose median is 0 falls back to 5 x its mean, then to 1, so that tau stays > 0.
    """
    vals = np.asarray(values, dtype=np.float64).reshape(len(values), -1)
    taus = [float(count_tau)]
    for col in range(vals.shape[1]):
        v = vals[:, col]
        tau = 5.0 * float(np.median(v)) if v.size else 0.0
        if tau <= 0:
            tau = 5.0 * float(v.mean()) if v.size and v.mean() > 0 else 1.0
        taus.append(tau)
    return np.array(taus)


def _per_slice_sum(slice_index: np.ndarray, weights: np.ndarray, m: int) -> np.ndarray:
    return np.bincount(slice_index, weights=weights, minlength=m)


def expected_error(
    conversions: Conversions, slice_index: np.ndarray, num_slices: int, params: Params,
    objective: Objective | str = OBJECTIVE.error_model, tie_breaker: np.ndarray | None = None,
) -> ErrorBreakdown:
    """Bias/variance of every estimate per slice for ``params`` on this data (truth = unclipped, uncapped),
    for the period's rows when ``conversions`` carries a lookback (``in_period``); ``slice_index`` is
    per record, lookback rows included (theirs may be -1)."""
    objective = check_error_model(objective)
    slice_index = np.asarray(slice_index, dtype=np.int64)
    if len(slice_index) != len(conversions):
        raise InvalidInput(f"slice_index has {len(slice_index)} entries for {len(conversions)} records")
    m, d = num_slices, params.num_queries
    kept = kept_mask(conversions, params, tie_breaker)  # Alg. 1 over the period and its lookback
    if conversions.in_period is not None:  # only the period's rows are measured
        inside = conversions.period_mask()
        conversions, slice_index, kept = conversions.take(np.flatnonzero(inside)), slice_index[inside], kept[inside]
    if (slice_index < 0).any():
        raise InvalidInput("records outside the domain (slice_index < 0) must be removed first")
    vals = conversions.values
    truth = np.empty((m, d + 1))
    truth[:, 0] = _per_slice_sum(slice_index, np.ones(len(slice_index)), m)
    for col in range(d):
        truth[:, col + 1] = _per_slice_sum(slice_index, vals[:, col], m)
    ks, kv = slice_index[kept], vals[kept]
    thresholds = np.array([q.clip_threshold for q in params.queries])

    unit = thresholds / query_scales(params)
    mean_w = expected_contribution(kv, params)
    expected = np.empty((m, d + 1))
    kept_count = _per_slice_sum(ks, np.ones(len(ks)), m)
    expected[:, 0] = kept_count
    for col in range(d):
        expected[:, col + 1] = _per_slice_sum(ks, mean_w[:, col], m) * unit[col]
    if objective == Objective.EXACT:
        rv = rounding_variance(kv, params)
        round_var = np.column_stack([_per_slice_sum(ks, rv[:, col], m) for col in range(d)]) if d else np.zeros((m, 0))
        variance = estimate_variance(params, kept_count, round_var)
    else:
        variance = relaxed_variance(params, m)
    return ErrorBreakdown(truth=truth, expected=expected, variance=variance)


def predicted_without_signal(breakdown: ErrorBreakdown, params: Params) -> list[str]:
    """The queries (``"count"``, then ``params``' value columns) whose expected estimates summed over the
    domain are within ``mechanism.report.SIGNAL_SDS`` of their predicted standard error of 0: what the
    release will list as ``queries_without_signal`` (``mechanism.report``), predicted before it, e.g. a
    value query that Alg. 5 left a single budget unit (publishing about 0 scores as well at this
    epsilon). The standard error includes the randomized rounding's (Alg. 3)."""
    return without_signal(("count",) + params.query_columns, breakdown.expected.sum(axis=0),
                          np.sqrt(breakdown.variance.sum(axis=0)))


PREDICTED_WITHOUT_SIGNAL = "predicted_without_signal"
"""The provenance field (``Provenance.extra``) where a tuner records ``predicted_without_signal``."""


def recorded_without_signal(version: ParameterVersion) -> list[str]:
    """The queries ``version``'s provenance predicts its release will hold no signal for (none when not
    recorded)."""
    extra = version.provenance.extra if version.provenance is not None else {}
    return [str(q) for q in extra.get(PREDICTED_WITHOUT_SIGNAL, ())]


def without_signal_note(queries: Sequence[str]) -> str:
    """The console's NOTE on the queries a tuned version is predicted to leave without signal ("" for none)."""
    if not queries:
        return ""
    return (f"NOTE: predicted to hold no signal for {', '.join(queries)} (its domain total within {SIGNAL_SDS:g} "
            f"noise standard errors of 0: the release will say so; a query these parameters leave unmeasured)")


def relaxed_variance(params: Params, num_slices: int) -> np.ndarray:
    """Relaxation 4.5 (m, d+1): 2 C^2 C_l^2/(alpha_l^2 eps^2) and 2 (d+1) C^2/eps^2 (baseline: / alpha_0^2)."""
    c, eps, d = params.count_limit, params.epsilon, params.num_queries
    out = np.empty((num_slices, d + 1))
    if d:
        out[:, 1:] = ARA_LINF.variance(c, np.array([q.clip_threshold for q in params.queries]),
                                       np.asarray(params.budget_fractions, dtype=np.float64), eps)[None, :]
    if params.encoding == Encoding.BASELINE:
        out[:, 0] = 2.0 * c**2 / (params.count_fraction**2 * eps**2)
    else:
        out[:, 0] = 2.0 * (d + 1) * c**2 / eps**2
    return out


def rmsre_tau(breakdown: ErrorBreakdown, taus: np.ndarray) -> RmsreTau:
    """RMSRE_tau per query: sqrt(mean_j E(U - V)^2 / max(tau, V)^2), combined: sqrt(mean of squares)."""
    taus = np.asarray(taus, dtype=np.float64)
    if taus.shape != (breakdown.truth.shape[1],) or (taus <= 0).any():
        raise InvalidParameters(f"taus must be {breakdown.truth.shape[1]} positive numbers (count first), got {taus}")
    if breakdown.truth.shape[0] == 0:
        raise InvalidInput("RMSRE_tau of an empty domain is undefined")
    denom = np.maximum(taus[None, :], breakdown.truth) ** 2
    per_query = np.sqrt((breakdown.mse / denom).mean(axis=0))
    return RmsreTau(per_query=per_query, combined=float(np.sqrt(np.mean(per_query**2))))


def realised_rmsre_tau(estimate: np.ndarray, truth: np.ndarray, taus: np.ndarray | Sequence[float]) -> RmsreTau:
    """The realised RMSRE_tau of released estimates (m slices, count first) against the true totals
    (Def. 3.2): per query the root of the slices' mean squared relative error ((U - V) / max(tau, V))^2,
    combined over queries as the root of the mean of the per-query squares (as ``rmsre_tau``)."""
    per_query = np.sqrt(np.mean(_relative_errors(estimate, truth, taus) ** 2, axis=0))
    return RmsreTau(per_query=per_query, combined=float(np.sqrt(np.mean(per_query**2))))


def realised_relative_bias(estimate: np.ndarray, truth: np.ndarray, taus: np.ndarray | Sequence[float]) -> np.ndarray:
    """Per query the slices' mean signed relative error (U - V) / max(tau, V): the systematic part of
    ``realised_rmsre_tau`` (its per-query square is this squared plus the slices' variance of the same
    relative errors). Far from 0 when the estimates are off together (a pooled ratio or a transient
    misjudged), near 0 when they only scatter (noise, or slice ratios off both ways)."""
    return np.asarray(np.mean(_relative_errors(estimate, truth, taus), axis=0), dtype=np.float64)


def _relative_errors(estimate: np.ndarray, truth: np.ndarray, taus: np.ndarray | Sequence[float]) -> np.ndarray:
    """(m, queries) the slices' relative errors (U - V) / max(tau, V) of Def. 3.2."""
    est = np.asarray(estimate, dtype=np.float64)
    true = np.asarray(truth, dtype=np.float64)
    t = np.asarray(taus, dtype=np.float64)
    if est.shape != true.shape or est.ndim != 2 or t.shape != (true.shape[1],) or (t <= 0).any():
        raise InvalidParameters(f"Def. 3.2's relative errors need estimates and truths of one shape (m, queries) and "
                                f"one positive tau per query, got {est.shape}, {true.shape}, taus {t.tolist()}")
    if true.shape[0] == 0:
        raise InvalidInput("Def. 3.2's relative errors of an empty domain are undefined")
    return np.asarray((est - true) / np.maximum(t[None, :], true), dtype=np.float64)


def params_taus(params: Params) -> np.ndarray | None:
    """The taus recorded in a parameter file (count first), or None if any is missing."""
    taus = [params.count_tau] + [q.tau for q in params.queries]
    return None if any(t is None for t in taus) else np.array(taus, dtype=np.float64)
