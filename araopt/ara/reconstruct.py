"""Reconstruction from the Aggregation Service's summary report (ReconstructValues, Alg. 4): report buckets
mapped to (slice, query) through the key domain, every row accounted for (unknown, missing, implausible,
huge), and the estimates of the true totals when the parameter version carries a calibration."""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from araopt.ara.registrations import ARA_CONTRIBUTION_BUDGET, check_domain_matches
from araopt.constants import (
    CONFIDENCE,
)
from araopt.errors import InvalidInput
from araopt.mechanism.keys import KeyDomain
from araopt.mechanism.noise import noise_parameter
from araopt.mechanism.params import Params
from araopt.mechanism.report import reconstruct
from araopt.publication import estimates_frame, true_totals
from araopt.version import ParameterVersion

EXACT_FLOAT_LIMIT = 2**53
"""|metric| above this cannot be exact in float64, nor come from a real report batch (2^53 / 2^16 reports)."""


IMPLAUSIBLE_TAIL = 1e-12
"""A negative metric below the (1e-12)-quantile of the noise is flagged as implausible."""


# ---- reconstruction from a summary report (Alg. 4) -----------------------------------------------
@dataclass(frozen=True)
class ReconstructCounters:
    """Accounting of the rows of a summary report: nothing is dropped without being counted here."""

    rows: int
    matched: int
    unknown_buckets: int
    unknown_metric_sum: int
    missing_buckets: int
    incomplete_slices: int
    negative_metrics: int
    implausible_negative_metrics: int
    huge_metrics: int
    unknown: tuple[tuple[int, int], ...] = ()
    huge: tuple[tuple[int, int], ...] = ()

    def to_json(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in ("rows", "matched", "unknown_buckets", "unknown_metric_sum", "missing_buckets",
                                              "incomplete_slices", "negative_metrics", "implausible_negative_metrics",
                                              "huge_metrics")}
        out["unknown_examples"] = [f"0x{b:x}" for b, _ in self.unknown[:5]]
        return out


def implausible_negative_threshold(epsilon: float, contribution_budget: int = ARA_CONTRIBUTION_BUDGET,
                                   tail: float = IMPLAUSIBLE_TAIL) -> int:
    """k with P[DLap(ε/Γ) <= -k] <= tail: a metric below -k did not come from noise on a sum >= 0."""
    a = noise_parameter(epsilon, contribution_budget)
    return int(math.ceil(-math.log(tail) / a))


def estimates_from_summary_report(
    buckets: Sequence[int], metrics: np.ndarray | Sequence[int], version: ParameterVersion | Params, domain: KeyDomain,
    confidence: float = CONFIDENCE,
) -> tuple[pd.DataFrame, ReconstructCounters]:
    """Map report buckets to (slice, query) through the key domain and reconstruct (Alg. 4).

    Buckets absent from the domain are counted (and listed in the counters), never silently
    dropped; a domain bucket missing from the report, or with a metric beyond ±2^53, makes the
    affected estimates NaN and is counted; a bucket appearing twice is an error (overlapping files).
    """
    if isinstance(version, Params):  # parameters without a calibration: Alg. 4's estimates
        version = ParameterVersion(version)
    params = version.params
    check_domain_matches(params, domain)
    metrics = np.asarray(metrics, dtype=np.int64).reshape(-1)
    if len(buckets) != len(metrics):
        raise InvalidInput(f"{len(buckets)} buckets but {len(metrics)} metrics")
    key_of = {b: i for i, b in enumerate(domain.buckets())}
    num_keys = domain.num_keys
    ids = np.fromiter((key_of.get(int(b), -1) for b in buckets), dtype=np.int64, count=len(buckets))
    unknown = ids < 0
    huge = np.abs(metrics.astype(np.float64)) > EXACT_FLOAT_LIMIT
    known_ids = ids[~unknown]
    counts = np.bincount(known_ids, minlength=num_keys)
    if (counts > 1).any():
        dup = int(np.flatnonzero(counts > 1)[0])
        raise InvalidInput(f"bucket 0x{domain.buckets()[dup]:x} appears {int(counts[dup])} times in the summary report "
                           f"(overlapping files or a bad report)")
    use = ~unknown & ~huge
    W: np.ndarray = np.full(num_keys, np.nan)
    W[ids[use]] = metrics[use].astype(np.float64)
    W = W.reshape(domain.num_slices, domain.num_columns)
    estimates = reconstruct(W, params, confidence)
    floor = -implausible_negative_threshold(params.epsilon, params.contribution_budget)
    known = ~unknown
    unknown_rows = tuple((int(b), int(m)) for b, m, u in zip(buckets, metrics, unknown, strict=True) if u)
    counters = ReconstructCounters(
        rows=len(buckets), matched=int(use.sum()), unknown_buckets=int(unknown.sum()),
        unknown_metric_sum=int(sum(m for _, m in unknown_rows)),
        missing_buckets=int(num_keys - (counts > 0).sum()), incomplete_slices=int(np.isnan(W).any(axis=1).sum()),
        negative_metrics=int((known & (metrics < 0)).sum()),
        implausible_negative_metrics=int((known & ~huge & (metrics < floor)).sum()),
        huge_metrics=int((known & huge).sum()), unknown=unknown_rows,
        huge=tuple((int(b), int(m)) for b, m, h in zip(buckets, metrics, known & huge, strict=True) if h),
    )
    corrected = None if version.calibration is None else true_totals(estimates, version.calibration, domain, params)
    return estimates_frame(estimates, domain, corrected, version.correction), counters
