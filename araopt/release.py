"""The release step, once, engine-free: per-key integer sums over the declared domain -> noise once
per key (SummaryReport, Alg. 2) -> reconstruction (ReconstructValues, Alg. 4) -> a ``Release``.

``araopt.mechanism.measure`` (in memory) and the Beam ``NoisyRelease`` (after the integer combine)
both call :func:`noisy_release`; ``estimates_frame`` is the one long-format table of estimates.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from .aggregate import DomainSums
from .keys import KeyDomain
from .params import Params
from .report import Estimates, SummaryReport, reconstruct, summary_report


@dataclass(frozen=True)
class Accounting:
    """Exact record accounting of one run (operator-private: never part of the release).

    ``rows_read = rows_rejected + rows_kept + rows_capped + rows_outside_domain`` for the measured
    period; for its lookback (earlier conversions that only consume budget, never counted)
    ``lookback_rows_read = lookback_rows_rejected + lookback_rows_used``.
    """

    rows_read: int
    rows_rejected: int
    rows_kept: int
    rows_capped: int
    rows_outside_domain: int
    impressions: int
    rejected_by_reason: Mapping[str, int] = field(default_factory=dict)
    times_floored: int = 0
    lookback_rows_read: int = 0
    lookback_rows_rejected: int = 0
    lookback_rows_used: int = 0
    rows_before_lookback: int = 0

    @property
    def closes(self) -> bool:
        period = self.rows_read == self.rows_rejected + self.rows_kept + self.rows_capped + self.rows_outside_domain
        return period and self.lookback_rows_read == self.lookback_rows_rejected + self.lookback_rows_used

    def to_json(self) -> dict[str, object]:
        return {
            "rows_read": self.rows_read, "rows_rejected": self.rows_rejected,
            "rows_rejected_by_reason": dict(self.rejected_by_reason), "conversions_kept": self.rows_kept,
            "conversions_dropped_by_cap": self.rows_capped, "conversions_kept_outside_domain": self.rows_outside_domain,
            "impressions": self.impressions, "times_floored_to_microseconds": self.times_floored,
            "lookback_rows_read": self.lookback_rows_read, "lookback_rows_rejected": self.lookback_rows_rejected,
            "lookback_rows_used": self.lookback_rows_used,
            "conversions_of_impressions_older_than_the_lookback": self.rows_before_lookback,
            "accounting_closes": self.closes,
        }


@dataclass(frozen=True)
class Release:
    """One noisy summary report over the declared domain, its reconstruction (Alg. 4: the capped-and-
    clipped sums) and, when the parameters carry a calibration, the estimates of the true totals."""

    params: Params
    domain: KeyDomain
    report: SummaryReport
    estimates: Estimates
    accounting: Accounting
    simulation_seed: int | None = None
    corrected: Any = None  # araopt.calibration.CorrectedEstimates, or None without a calibration


def noisy_release(sums: DomainSums, params: Params, domain: KeyDomain, accounting: Accounting, *,
                  simulation_seed: int | None = None, rng: np.random.Generator | None = None) -> Release:
    """Noise once per domain key (Alg. 2, secure generator unless ``rng`` or ``simulation_seed``),
    including keys without contributions, then reconstruct (Alg. 4)."""
    if sums.histogram.shape != (domain.num_slices, domain.num_columns):
        raise ValueError(f"sums have shape {sums.histogram.shape}, the domain needs "
                         f"({domain.num_slices}, {domain.num_columns})")
    if not accounting.closes:
        raise ValueError(f"row accounting does not close: {accounting.to_json()}")
    report = summary_report(sums.histogram, params.epsilon, params.contribution_budget, rng=rng,
                            simulation_seed=simulation_seed)
    estimates = reconstruct(report.noisy, params)
    return Release(params, domain, report, estimates, accounting, simulation_seed, true_totals(estimates, params, domain))


def true_totals(estimates: Estimates, params: Params, domain: KeyDomain) -> Any:
    """The calibration's estimates of the true totals (``araopt.calibration.correct``), or None without
    one. The measured period's length in history blocks is its size over the history's block size."""
    if params.calibration is None:
        return None
    from .calibration import CorrectedEstimates, correct, period_blocks_for

    finite = np.isfinite(estimates.estimate).all(axis=1) & np.isfinite(estimates.std_error).all(axis=1)
    kept = float(np.clip(estimates.estimate[finite, 0], 0.0, None).sum())
    period = period_blocks_for(params.calibration, kept)
    if finite.all():
        return correct(estimates, params.calibration, domain, params, period_blocks=period)
    # a reconstructed report may miss buckets (NaN estimates): correct the complete slices only
    part = dataclasses.replace(estimates, **{f: getattr(estimates, f)[finite] for f in
                                             ("estimate", "std_error", "ci_low", "ci_high")})
    values = {c: [v for v, keep in zip(vals, finite, strict=True) if keep] for c, vals in domain.slice_values().items()}
    got = correct(part, params.calibration, values, params, period_blocks=period)
    full = {}
    for f in ("estimate", "std_error", "ci_low", "ci_high", "capped_estimate", "capped_std_error", "ratio",
              "ratio_std_error"):
        arr = np.full(estimates.estimate.shape, np.nan)
        arr[finite] = getattr(got, f)
        full[f] = arr
    fallback = np.zeros(estimates.estimate.shape, dtype=bool)
    fallback[finite] = got.fallback
    return CorrectedEstimates(**full, fallback=fallback, fallback_slices=got.fallback_slices,
                              query_names=got.query_names, confidence=got.confidence, period_blocks=got.period_blocks,
                              retention_checksum=got.retention_checksum)


ESTIMATE_COLUMNS = ("estimate", "std_error", "ci_low", "ci_high", "capped_estimate", "capped_std_error",
                    "bias_corrected")


def estimates_frame(estimates: Estimates, domain: KeyDomain, corrected: Any = None,
                    correction: str = "ratio") -> pd.DataFrame:
    """Long table: slice columns, ``query`` (count, q_1..q_d), then ``ESTIMATE_COLUMNS``.

    ``estimate``, ``std_error``, ``ci_low``, ``ci_high`` are about the TRUE total when ``corrected``
    (``calibration.correct``) is given: the point estimate U / r_hat (``correction`` "ratio",
    ``bias_corrected`` true) or the capped estimate U ("none": the history showed dividing adds more
    noise than it removes bias; std_error then includes that known bias), and the calibrated
    interval either way. Without a calibration they are Alg. 4's, about the capped-and-clipped sum,
    and equal ``capped_estimate`` / ``capped_std_error`` (``bias_corrected`` false).
    """
    m, k = estimates.estimate.shape
    values = domain.slice_values()
    frame = pd.DataFrame({c: np.repeat(np.asarray(v, dtype=object), k) for c, v in values.items()})
    frame["query"] = np.tile(np.asarray(estimates.query_names, dtype=object), m)
    if corrected is None:
        point, std, low, high = estimates.estimate, estimates.std_error, estimates.ci_low, estimates.ci_high
        bias_corrected = False
    elif correction == "ratio":
        point, std, low, high = corrected.estimate, corrected.std_error, corrected.ci_low, corrected.ci_high
        bias_corrected = True
    else:
        point, low, high = estimates.estimate, corrected.ci_low, corrected.ci_high
        std = np.sqrt(corrected.std_error**2 + (corrected.estimate - estimates.estimate) ** 2)
        bias_corrected = False
    for name, array in (("estimate", point), ("std_error", std), ("ci_low", low), ("ci_high", high),
                        ("capped_estimate", estimates.estimate), ("capped_std_error", estimates.std_error)):
        frame[name] = np.asarray(array, dtype=np.float64).reshape(-1)
    frame["bias_corrected"] = bias_corrected
    for c, dictionary in zip(domain.slice_columns, domain.dictionaries, strict=True):
        if all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) for v in dictionary):
            frame[c] = frame[c].astype("int64")
        else:
            frame[c] = frame[c].astype(str)
    return frame
