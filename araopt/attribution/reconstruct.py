"""The aggregation of W3C Attribution histograms and the estimates of the true totals (Alg. 4).

The aggregation service (DAP with Prio3L1BoundSum, spec "Prio and DAP") sums one query's reports
per histogram index and adds noise; the browser's deduction assumes Laplace noise of scale
b = 2 maxValue / epsilon per index. araopt simulates it with discrete Laplace DLap(a), a = 1/b rounded
down (``araopt.mechanism.noise``: exact, from the secure generator unless a seeded ``Simulation``).

An estimate of a query's true total is the noisy sum divided by the value scale s = maxValue / C
(Alg. 4). Its error has the paper's parts (Thm. 4.2): the noise variance Var DLap(a) / s^2 (about
2 b^2 / s^2 = 8 C^2 / epsilon^2: the value scale cancels), the rounding variance sum f(1 - f) / s^2 of
the randomized rounding, and biases from clipping at C and from reports refused for budget (an
epoch whose budget is short contributes nothing).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, cast

import numpy as np
import pandas as pd

from araopt.attribution.params import AttributionParams, AttributionQuery
from araopt.errors import InvalidInput, InvalidParameters
from araopt.mechanism.keys import KeyDomain
from araopt.mechanism.noise import (
    MAX_NOISE_PARAMETER,
    MIN_NOISE_PARAMETER,
    RATE_BITS,
    discrete_laplace_variance,
    sample_discrete_laplace,
)
from araopt.mechanism.randomness import Simulation
from araopt.mechanism.report import without_signal


def noise_rate(query: AttributionQuery) -> float:
    """a = epsilon / (2 maxValue) (= 1 / b), rounded down to a multiple of 2^-52: what is sampled (never
    less noise than the deduction assumes)."""
    numerator = (Fraction(query.epsilon) * (1 << RATE_BITS)) // (2 * query.max_value)
    return float(numerator / (1 << RATE_BITS))


def check_noise_rates(params: AttributionParams) -> None:
    """Refuse (one line, naming the query) a query whose noise rate ``noise_rate`` lies outside the exact
    sampler's domain [2^-36, 64] (``araopt.mechanism.noise``): its aggregation cannot be simulated. A
    release checks it before any work (else the job fails at its noise step)."""
    for query in params.queries:
        a = noise_rate(query)
        if not MIN_NOISE_PARAMETER <= a <= MAX_NOISE_PARAMETER:
            raise InvalidParameters(f"queries[{query.name!r}]: the noise rate epsilon / (2 maxValue) = {a:.3g} lies outside "
                                    f"[2^-36, {MAX_NOISE_PARAMETER:g}], where araopt samples the aggregation's noise "
                                    f"exactly (epsilon {query.epsilon:g}, max_value {query.max_value})")


def aggregate(sums: np.ndarray, query: AttributionQuery, simulation: Simulation | None = None,
              stream: int = 0) -> np.ndarray:
    """The aggregation service's output for one query's unnoised ``sums``: each index plus DLap(a).
    Secure noise unless ``simulation`` (seeded, not private) is given."""
    sums = np.asarray(sums, dtype=np.int64)
    rng = None if simulation is None else simulation.generator(stream)
    noisy: np.ndarray = sums + sample_discrete_laplace(noise_rate(query), sums.shape, rng)
    return noisy


@dataclass(frozen=True)
class Estimate:
    """Estimates of one query's true totals per index (its column's unit), the noise's standard
    deviation and the half width of the noise interval at ``level``."""

    values: np.ndarray
    noise_sd: float
    half_width: float
    level: float


def noise_half_width(a: float, level: float) -> int:
    """The smallest k with P(|DLap(a)| <= k) >= level (integer units): P(|X| > k) = 2 e^{-a(k+1)} / (1 + e^{-a})."""
    if not 0 < level < 1:
        raise InvalidParameters(f"level must lie in (0, 1), got {level!r}")
    k = math.log(2 / ((1 - level) * (1 + math.exp(-a)))) / a - 1
    return max(0, math.ceil(k))


def reconstruct(noisy: np.ndarray, query: AttributionQuery, level: float = 0.95) -> Estimate:
    """Alg. 4 for one query: noisy sums / s, with the noise's standard deviation and interval half
    width in the column's unit (the rounding variance and the biases are not in them)."""
    a = noise_rate(query)
    scale = query.value_scale
    return Estimate(np.asarray(noisy, dtype=np.float64) / scale, math.sqrt(discrete_laplace_variance(a)) / scale,
                    noise_half_width(a, level) / scale, level)


def rounding_variance(values: np.ndarray, query: AttributionQuery) -> float:
    """sum f(1 - f) / s^2 over the reports' scaled clipped values (f: the fractional part rounded)."""
    scaled = np.minimum(np.asarray(values, dtype=np.float64), query.clip) * query.value_scale
    frac = scaled - np.floor(scaled)
    return float(np.sum(frac * (1 - frac))) / query.value_scale**2


def clipping_bias(values: np.ndarray, query: AttributionQuery) -> float:
    """What clipping at C removes from the total: -sum max(0, v - C)."""
    return -float(np.sum(np.maximum(np.asarray(values, dtype=np.float64) - query.clip, 0.0)))


HISTOGRAM_COLUMNS = ("query", "histogram_index", "noisy_sum")
"""The aggregated histograms ``reconstruct`` reads: one row per (query, histogram index) with the
aggregation service's noisy sum (a ``task`` column too when there are conversion-side slices)."""


def estimates_frame(estimates: Mapping[tuple[str, int], Estimate], domain: KeyDomain,
                    with_task: bool = False) -> pd.DataFrame:
    """The published table: one row per (query[, task], histogram index) with the index's slice values,
    the estimate (Alg. 4), the noise's standard deviation and the interval at the estimate's level."""
    slices = domain.slice_values()
    frames = []
    for (name, task), est in sorted(estimates.items()):
        frame = pd.DataFrame({"query": name, "histogram_index": np.arange(len(est.values)), **slices,
                              "estimate": est.values, "std_error": est.noise_sd,
                              "ci_low": est.values - est.half_width, "ci_high": est.values + est.half_width})
        if with_task:
            frame.insert(1, "task", task)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def read_histograms(frame: pd.DataFrame, params: AttributionParams, histogram_size: int,
                    source: str = "histograms") -> tuple[dict[tuple[str, int], np.ndarray], int]:
    """The noisy histograms of ``frame`` (``HISTOGRAM_COLUMNS``) per (query, task) over the layout's
    indices, and how many (query, task, index) entries are missing (NaN: their estimates are NaN).
    An unknown query, an index outside the layout, a repeated entry or a non-integer sum is refused
    (one line)."""
    missing_columns = [c for c in HISTOGRAM_COLUMNS if c not in frame.columns]
    if missing_columns:
        raise InvalidInput(f"{source}: column {missing_columns[0]!r} is missing (columns: {', '.join(HISTOGRAM_COLUMNS)})")
    task = frame["task"] if "task" in frame.columns else pd.Series(0, index=frame.index)
    unknown = sorted(set(frame["query"].astype(str)) - set(params.query_names))
    if unknown:
        raise InvalidInput(f"{source}: query {unknown[0]!r} is not one of the parameters' {list(params.query_names)}")
    index = pd.to_numeric(frame["histogram_index"], errors="coerce")
    value = pd.to_numeric(frame["noisy_sum"], errors="coerce")
    bad = index.isna() | (index != index.round()) | (index < 0) | (index >= histogram_size)
    if bool(bad.any()):
        raise InvalidInput(f"{source}: histogram_index {frame['histogram_index'][bad].iloc[0]!r} is not an index of the "
                           f"layout (0..{histogram_size - 1})")
    if bool((value.isna() | (value != value.round())).any()):
        raise InvalidInput(f"{source}: noisy_sum must be integers (the aggregation's histogram entries)")
    keys = pd.DataFrame({"query": frame["query"].astype(str), "task": task, "index": index.astype(np.int64)})
    if bool(keys.duplicated().any()):
        row = keys[keys.duplicated()].iloc[0]
        raise InvalidInput(f"{source}: ({row['query']}, index {row['index']}) appears twice")
    tasks = sorted(set(task.astype(int))) or [0]
    out: dict[tuple[str, int], np.ndarray] = {}
    for name in params.query_names:
        for t in tasks:
            out[(name, t)] = np.full(histogram_size, np.nan)
    for key, part in keys.assign(value=value.to_numpy()).groupby(["query", "task"]):
        name, t = cast(tuple[Any, Any], key)
        out[(str(name), int(t))][part["index"].to_numpy()] = part["value"].to_numpy(dtype=np.float64)
    missing = int(sum(np.isnan(v).sum() for v in out.values()))
    return out, missing


def reconstruct_histograms(params: AttributionParams, histograms: Mapping[tuple[str, int], np.ndarray],
                           level: float = 0.95) -> dict[tuple[str, int], Estimate]:
    """Alg. 4 for every (query, task) histogram of a real aggregation (NaN entries stay NaN)."""
    out = {}
    for (name, task), noisy in histograms.items():
        out[(name, task)] = reconstruct(noisy, params.queries[params.query_names.index(name)], level)
    return out


def queries_without_signal(estimates: Mapping[tuple[str, int], Estimate]) -> list[str]:
    """The queries whose estimates, summed over every histogram index (and task), are within
    ``mechanism.report.SIGNAL_SDS`` noise standard deviations of 0: the release says nothing of them (the
    ARA target's ``mechanism.report.queries_without_signal``). Post-processing of the noised estimates and
    the public noise scale."""
    totals: dict[str, float] = {}
    variances: dict[str, float] = {}
    for (name, _), estimate in estimates.items():
        totals[name] = totals.get(name, 0.0) + float(np.sum(estimate.values))
        variances[name] = variances.get(name, 0.0) + estimate.noise_sd**2 * estimate.values.size
    return without_signal(list(totals), list(totals.values()), [math.sqrt(v) for v in variances.values()])
