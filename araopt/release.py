"""The release step, once, engine-free: per-key integer sums over the declared domain -> noise once
per key (SummaryReport, Alg. 2) -> reconstruction (ReconstructValues, Alg. 4) -> a ``Release``.

``araopt.mechanism.measure`` (in memory) and the Beam ``NoisyRelease`` (after the integer combine)
both call :func:`noisy_release`; ``estimates_frame`` is the one long-format table of estimates.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .aggregate import DomainSums
from .keys import KeyDomain
from .params import Params
from .report import Estimates, SummaryReport, reconstruct, summary_report


@dataclass(frozen=True)
class Accounting:
    """Exact record accounting of one run (operator-private: never part of the release).

    ``rows_read = rows_rejected + rows_kept + rows_capped + rows_outside_domain``.
    """

    rows_read: int
    rows_rejected: int
    rows_kept: int
    rows_capped: int
    rows_outside_domain: int
    impressions: int
    rejected_by_reason: Mapping[str, int] = field(default_factory=dict)
    times_floored: int = 0

    @property
    def closes(self) -> bool:
        return self.rows_read == self.rows_rejected + self.rows_kept + self.rows_capped + self.rows_outside_domain

    def to_json(self) -> dict[str, object]:
        return {
            "rows_read": self.rows_read, "rows_rejected": self.rows_rejected,
            "rows_rejected_by_reason": dict(self.rejected_by_reason), "conversions_kept": self.rows_kept,
            "conversions_dropped_by_cap": self.rows_capped, "conversions_kept_outside_domain": self.rows_outside_domain,
            "impressions": self.impressions, "times_floored_to_microseconds": self.times_floored,
            "accounting_closes": self.closes,
        }


@dataclass(frozen=True)
class Release:
    """One noisy summary report over the declared domain, its reconstruction and the accounting."""

    params: Params
    domain: KeyDomain
    report: SummaryReport
    estimates: Estimates
    accounting: Accounting
    simulation_seed: int | None = None


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
    return Release(params, domain, report, reconstruct(report.noisy, params), accounting, simulation_seed)


def estimates_frame(estimates: Estimates, domain: KeyDomain) -> pd.DataFrame:
    """Long table: slice columns, ``query`` (count, q_1..q_d), estimate, std_error, ci_low, ci_high."""
    m, k = estimates.estimate.shape
    values = domain.slice_values()
    frame = pd.DataFrame({c: np.repeat(np.asarray(v, dtype=object), k) for c, v in values.items()})
    frame["query"] = np.tile(np.asarray(estimates.query_names, dtype=object), m)
    for name in ("estimate", "std_error", "ci_low", "ci_high"):
        frame[name] = getattr(estimates, name).reshape(-1)
    for c, dictionary in zip(domain.slice_columns, domain.dictionaries, strict=True):
        if all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) for v in dictionary):
            frame[c] = frame[c].astype("int64")
        else:
            frame[c] = frame[c].astype(str)
    return frame
