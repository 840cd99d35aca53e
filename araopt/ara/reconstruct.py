"""Reconstruction from the Aggregation Service's summary report (ReconstructValues, Alg. 4): report buckets
mapped to (slice, query) through the key domain, every row accounted for (unknown, missing, implausible,
huge), and the estimates of the true totals when the parameter version carries a calibration."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from araopt.ara.registrations import ARA_CONTRIBUTION_BUDGET, KeyMap, check_domain_matches
from araopt.constants import (
    CONFIDENCE,
)
from araopt.errors import InvalidInput
from araopt.mechanism.keys import KeyDomain
from araopt.mechanism.noise import noise_parameter
from araopt.mechanism.params import Params
from araopt.mechanism.report import Estimates, reconstruct
from araopt.publication import estimates_frame, histogram_buckets, true_totals
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
    period_days: tuple[str, ...] | None = None  # the days the report covers, as given (None: not known)
    calendar_applied: bool = False  # the calibration's day-type effects shifted the ratios
    calendar_note: str | None = None  # the calibration could not apply or support the days (console, once)
    exploration_buckets: int = 0  # rows of the exploration arms' keys (part of the output domain, not unknown)

    def to_json(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in ("rows", "matched", "exploration_buckets", "unknown_buckets",
                                              "unknown_metric_sum", "missing_buckets", "incomplete_slices",
                                              "negative_metrics", "implausible_negative_metrics", "huge_metrics")}
        out["unknown_examples"] = [f"0x{b:x}" for b, _ in self.unknown[:5]]
        out.update(period_days=None if self.period_days is None else list(self.period_days),
                   calendar_applied=self.calendar_applied, calendar_note=self.calendar_note)
        return out


def implausible_negative_threshold(epsilon: float, contribution_budget: int = ARA_CONTRIBUTION_BUDGET,
                                   tail: float = IMPLAUSIBLE_TAIL) -> int:
    """k with P[DLap(ε/Γ) <= -k] <= tail: a metric below -k did not come from noise on a sum >= 0."""
    a = noise_parameter(epsilon, contribution_budget)
    return int(math.ceil(-math.log(tail) / a))


@dataclass(frozen=True)
class ReportEstimates:
    """A summary report mapped through the release's output domain (``histogram_buckets``) and
    reconstructed (Alg. 4): the main keys at the count limit C, each exploration arm's keys at the
    arm's C_a (``Params.for_arm``), and the accounting of every row. A domain or arm bucket missing from
    the report, or with a metric beyond ±2^53, is NaN in ``main``/``arms`` (and counted)."""

    main: Estimates
    arms: tuple[Estimates, ...]
    counters: ReconstructCounters

    @property
    def complete(self) -> bool:
        """Every bucket of the output domain, and no other, with an exact metric."""
        c = self.counters
        return (c.unknown_buckets == 0 and c.missing_buckets == 0 and c.huge_metrics == 0
                and not any(np.isnan(a.estimate).any() for a in self.arms))


def reconstruct_summary_report(
    buckets: Sequence[int], metrics: np.ndarray | Sequence[int], params: Params, domain: KeyDomain,
    confidence: float = CONFIDENCE,
) -> ReportEstimates:
    """Map report buckets to the output domain of a release with ``params`` (the domain's keys, then
    each exploration arm's: ``histogram_buckets``) and reconstruct (Alg. 4): the main keys at C, each
    arm at its own count limit C_a. The one policy for a report's rows: a bucket outside the output
    domain is counted as unknown (and listed), never silently dropped; a bucket of the output domain
    missing from the report, or with a metric beyond ±2^53, makes its estimate NaN and is counted; a
    bucket appearing twice is an error (overlapping files)."""
    check_domain_matches(params, domain)
    metrics = np.asarray(metrics, dtype=np.int64).reshape(-1)
    if len(buckets) != len(metrics):
        raise InvalidInput(f"{len(buckets)} buckets but {len(metrics)} metrics")
    layout = histogram_buckets(params, domain)
    position = {b: i for i, b in enumerate(layout)}
    num_keys, width = domain.num_keys, domain.num_columns
    ids = np.fromiter((position.get(int(b), -1) for b in buckets), dtype=np.int64, count=len(buckets))
    arm = ids >= num_keys
    unknown = ids < 0
    huge = np.abs(metrics.astype(np.float64)) > EXACT_FLOAT_LIMIT
    counts = np.bincount(ids[ids >= 0], minlength=len(layout))
    if (counts > 1).any():
        dup = int(np.flatnonzero(counts > 1)[0])
        raise InvalidInput(f"bucket 0x{layout[dup]:x} appears {int(counts[dup])} times in the summary report "
                           f"(overlapping files or a bad report)")
    flat: np.ndarray = np.full(len(layout), np.nan)
    placed = (ids >= 0) & ~huge
    flat[ids[placed]] = metrics[placed].astype(np.float64)
    W = flat[:num_keys].reshape(domain.num_slices, width)
    estimates = reconstruct(W, params, confidence)
    arm_rows = flat[num_keys:].reshape(-1, width)
    arms = tuple(reconstruct(arm_rows[a:a + 1], params.for_arm(a), confidence) for a in range(len(arm_rows)))
    floor = -implausible_negative_threshold(params.epsilon, params.contribution_budget)
    known = (ids >= 0) & ~arm
    unknown_rows = tuple((int(b), int(m)) for b, m, u in zip(buckets, metrics, unknown, strict=True) if u)
    counters = ReconstructCounters(
        rows=len(buckets), matched=int((known & ~huge).sum()), unknown_buckets=int(unknown.sum()),
        unknown_metric_sum=int(sum(m for _, m in unknown_rows)),
        missing_buckets=int(num_keys - (counts[:num_keys] > 0).sum()),
        incomplete_slices=int(np.isnan(W).any(axis=1).sum()),
        negative_metrics=int((known & (metrics < 0)).sum()),
        implausible_negative_metrics=int((known & ~huge & (metrics < floor)).sum()),
        huge_metrics=int((known & huge).sum()), unknown=unknown_rows, exploration_buckets=int(arm.sum()),
        huge=tuple((int(b), int(m)) for b, m, h in zip(buckets, metrics, known & huge, strict=True) if h),
    )
    return ReportEstimates(estimates, arms, counters)


def estimates_from_summary_report(
    buckets: Sequence[int], metrics: np.ndarray | Sequence[int], version: ParameterVersion | Params, domain: KeyDomain,
    confidence: float = CONFIDENCE, period_days: Sequence[Any] | None = None,
) -> tuple[pd.DataFrame, ReconstructCounters]:
    """Map report buckets to (slice, query) through the key domain and reconstruct (Alg. 4), with the
    row policy of ``reconstruct_summary_report``.

    With a calibration, the estimates of the true totals are ``publication.true_totals``'s, the code
    path ``measure`` publishes through: ``period_days`` (the UTC conversion days the report covers)
    apply the version's calendar as ``measure`` applies it to its input's ``date=`` partitions;
    without them the counters' ``calendar_note`` says the calendar was not applied.
    """
    if isinstance(version, Params):  # parameters without a calibration: Alg. 4's estimates
        version = ParameterVersion(version)
    params = version.params
    report = reconstruct_summary_report(buckets, metrics, params, domain, confidence)
    estimates = report.main
    corrected = (None if version.calibration is None else
                 true_totals(estimates, version.calibration, domain, params, calendar=version.calendar,
                             period_days=period_days))
    counters = dataclasses.replace(
        report.counters, period_days=None if period_days is None else tuple(str(d) for d in period_days),
        calendar_applied=corrected is not None and corrected.calendar_applied,
        calendar_note=None if corrected is None else corrected.calendar_note,
    )
    return estimates_frame(estimates, domain, corrected, version.correction), counters


def key_map_domain(key_map: KeyMap, file_version: ParameterVersion, version: ParameterVersion, params_source: str,
                   epsilon: float | None = None) -> KeyDomain:
    """The domain of a report through its key map, checked against the parameters it was made with:
    export-ara records the parameter file as is, measure records it after its ``--epsilon`` override
    (``version``: the file's at ``epsilon``)."""
    if key_map.matches(file_version) or version is file_version:
        return key_map.domain_for(file_version, params_source)
    return key_map.domain_for(version, f"{params_source} with --epsilon {epsilon:g}")


def check_report_matches(counters: ReconstructCounters) -> None:
    """Refuse a report none of whose buckets is in the key map (the wrong key map or parameter file)."""
    if counters.rows and counters.unknown_buckets == counters.rows:
        raise InvalidInput(f"none of the {counters.rows} buckets of the report is in the key map: wrong key map or "
                           f"parameter file? (first: {', '.join(counters.to_json()['unknown_examples'])})")


def report_warnings(counters: ReconstructCounters, epsilon: float) -> list[str]:
    """What ``reconstruct`` warns of a report's rows beyond the unknown buckets: missing buckets (NaN
    estimates), metrics beyond +-2^53, metrics more negative than the noise at ``epsilon`` makes plausible."""
    out = []
    if counters.missing_buckets:
        out.append(f"{counters.missing_buckets} bucket(s) of the key map are missing from the report: "
                   f"{counters.incomplete_slices} slice(s) get NaN estimates")
    if counters.huge_metrics:
        out.append(f"{counters.huge_metrics} metric(s) beyond ±2^53 skipped (their estimates are NaN): "
                   f"e.g. bucket 0x{counters.huge[0][0]:x} metric {counters.huge[0][1]}")
    if counters.implausible_negative_metrics:
        out.append(f"{counters.implausible_negative_metrics} metric(s) are more negative than noise at epsilon="
                   f"{epsilon:g} makes plausible (wrong epsilon or a corrupt report?)")
    return out
