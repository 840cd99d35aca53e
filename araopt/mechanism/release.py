"""The release step, once, engine-free: per-key integer sums over the declared domain -> noise once
per key (SummaryReport, Alg. 2) -> reconstruction (ReconstructValues, Alg. 4) -> a ``Release``.

``mechanism.measure`` (in memory) and the Beam ``NoisyRelease`` (after the integer combine) both call
:func:`noisy_release`. What a release says beyond Alg. 4 (the true totals of a calibrated parameter
version, the published files) is ``araopt.publication``'s.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from araopt.errors import InvalidInput
from araopt.mechanism.aggregate import DomainSums
from araopt.mechanism.keys import KeyDomain
from araopt.mechanism.params import Params
from araopt.mechanism.report import Estimates, SummaryReport, reconstruct, summary_report


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
    """One noisy summary report over the declared domain and its reconstruction (Alg. 4: estimates of
    the capped-and-clipped sums)."""

    params: Params
    domain: KeyDomain
    report: SummaryReport  # rows: the domain's slices, then the exploration arms' pooled rows
    estimates: Estimates  # the domain's slices (of the main impressions when there are exploration arms)
    accounting: Accounting
    simulation_seed: int | None = None
    exploration: Estimates | None = None  # one row per exploration arm: Alg. 4 at the arm's count limit


def histogram_height(params: Params, domain: KeyDomain) -> int:
    """Rows of a release's histogram: the domain's slices and one pooled row per exploration arm."""
    return domain.num_slices + (params.exploration.num_arms if params.exploration is not None else 0)


def noisy_release(sums: DomainSums, params: Params, domain: KeyDomain, accounting: Accounting, *,
                  simulation_seed: int | None = None, rng: np.random.Generator | None = None) -> Release:
    """Noise once per key (Alg. 2, secure generator unless ``rng`` or ``simulation_seed``), including
    keys without contributions and the exploration arms' keys, then reconstruct (Alg. 4, each arm at
    its own count limit)."""
    height = histogram_height(params, domain)
    if sums.histogram.shape != (height, domain.num_columns):
        raise InvalidInput(f"sums have shape {sums.histogram.shape}, the domain needs ({height}, {domain.num_columns})")
    if not accounting.closes:
        raise InvalidInput(f"row accounting does not close: {accounting.to_json()}")
    report = summary_report(sums.histogram, params.epsilon, params.contribution_budget, rng=rng,
                            simulation_seed=simulation_seed)
    m = domain.num_slices
    estimates = reconstruct(report.noisy[:m], params)
    exploration = None
    if params.exploration is not None:
        arms = [reconstruct(report.noisy[m + a:m + a + 1], params.for_arm(a)) for a in range(params.exploration.num_arms)]
        def stacked(name: str) -> np.ndarray:
            return np.vstack([getattr(e, name) for e in arms])

        exploration = Estimates(stacked("estimate"), stacked("std_error"), stacked("ci_low"), stacked("ci_high"),
                                query_names=estimates.query_names, confidence=estimates.confidence)
    return Release(params, domain, report, estimates, accounting, simulation_seed, exploration)
