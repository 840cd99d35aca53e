"""What a release publishes, decided once for every way of making one (``measure``'s Beam job, the
in-memory ``mechanism.measure``, ``reconstruct`` of the Aggregation Service's report):

* the estimates of the TRUE totals when the parameter version carries a calibration
  (``calibration.correct``, for a measured period of as many history blocks as its size says), and
  the one long-format table of estimates (``estimates_frame``);
* what ``release.json`` says about the release (public facts only, no exact counts);
* the operator-private accounting (exact counts) and the calibration that made the estimates;
* the Aggregation Service records of the release (``io.avro``'s checked builders) and the debug
  run's annotation rule;
* for the W3C Attribution target (``measure --api attribution``), its release's files: the estimates
  table, the histogram layout, release.json and the operator-private accounting
  (``attribution_release_files``), under the same rules (a seeded release only as a simulation, the
  rejected share).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from araopt.attribution.calibrate import Retention, estimates_of
from araopt.attribution.reconstruct import queries_without_signal as attribution_queries_without_signal
from araopt.attribution.release import AttributionRelease, histogram_layout
from araopt.calibration.calendar import Calendar
from araopt.calibration.correct import CorrectedEstimates, correct, period_blocks_for
from araopt.calibration.model import Calibration, retention_checksum
from araopt.errors import InvalidInput, InvalidParameters, PrivacyRefusal
from araopt.io import avro, jsonio, outputs
from araopt.mechanism.exploration import EXPLORATION_BIT
from araopt.mechanism.keys import DATA, KeyDomain
from araopt.mechanism.params import Params
from araopt.mechanism.release import Release
from araopt.mechanism.report import Estimates, queries_without_signal
from araopt.version import POINT_ESTIMATES, Api, ParameterVersion, divided_queries

ESTIMATE_COLUMNS = ("estimate", "std_error", "ci_low", "ci_high", "capped_estimate", "capped_std_error",
                    "bias_corrected")


@dataclass(frozen=True)
class Publication:
    """A release as published: Alg. 4's estimates and, with a calibration, those of the true totals
    (``corrected``) with the version's choice of point estimate (``correction``)."""

    release: Release
    calibration: Calibration | None = None
    correction: str = "ratio"
    corrected: CorrectedEstimates | None = None
    public_calibration: bool = False
    """Whether the calibration may leave with the release: privacy-safe tuning's (a post-processing of DP
    releases and first-party data). A joined history's is that history's exact per-slice statistics
    (estimate / capped_estimate is its ratio): its true totals are operator-private."""

    @property
    def params(self) -> Params:
        return self.release.params

    @property
    def domain(self) -> KeyDomain:
        return self.release.domain

    def frame(self) -> pd.DataFrame:
        """The estimates table (``estimates_frame``), with the true totals of any calibration: the operator's."""
        return estimates_frame(self.release.estimates, self.release.domain, self.corrected, self.correction)

    def release_frame(self) -> pd.DataFrame:
        """The estimates table the release folder holds: the true totals only of a calibration that may leave
        (``public_calibration``), else Alg. 4's (noised numbers only)."""
        return self.frame() if self.public_calibration else estimates_frame(self.release.estimates, self.release.domain)

    def private_true_totals(self) -> pd.DataFrame | None:
        """The true totals that stay with the operator (a joined history's calibration), or None."""
        return self.frame() if self.corrected is not None and not self.public_calibration else None


def publish(release: Release, version: ParameterVersion, period_days: Sequence[Any] | None = None) -> Publication:
    """``release`` with the true totals of ``version``'s calibration (if it carries one); ``period_days``:
    the dates the release covers (declared by how the input was cut, e.g. its ``date=`` partitions),
    for the calendar's day-type effects (None: the period is any day)."""
    corrected = (None if version.calibration is None
                 else true_totals(release.estimates, version.calibration, release.domain, release.params,
                                  calendar=version.calendar, period_days=period_days))
    public = joined_calibration_reason(version) is None
    return Publication(release, version.calibration, version.correction, corrected, public)


def joined_calibration_reason(version: ParameterVersion) -> str | None:
    """Why estimates made with ``version``'s calibration (ARA's per-slice ratios, Attribution's retention) are
    operator-private, or None: a calibration fitted on the joined history is that history's exact statistics,
    read back from the estimates (estimate / capped_estimate); privacy-safe tuning's may leave. Attribution's
    retention is always the joined history's (no privacy-safe tuner fits one), whatever the provenance says:
    the rule ``attribution_release_files`` applies."""
    if version.retention is None and (version.calibration is None or (
            version.provenance is not None and version.provenance.privacy_safe)):
        return None
    return ("the estimates of the true totals are calibrated on the joined history, whose exact per-slice ratios they "
            "hold: the output is OPERATOR-PRIVATE, never publish it (publish Alg. 4's capped_estimate columns, or tune "
            "with --private)")


def true_totals(estimates: Estimates, calibration: Calibration, domain: KeyDomain,
                params: Params | None = None, calendar: Calendar | None = None,
                period_days: Sequence[Any] | None = None) -> CorrectedEstimates:
    """The calibration's estimates of the true totals (``calibration.correct``). The measured period's
    length in history blocks is its size over the history's block size. A reconstructed report may
    miss buckets (NaN estimates): then only the complete slices are corrected, the rest stay NaN."""
    finite = np.isfinite(estimates.estimate).all(axis=1) & np.isfinite(estimates.std_error).all(axis=1)
    kept = float(np.clip(estimates.estimate[finite, 0], 0.0, None).sum())
    period = period_blocks_for(calibration, kept) if period_days is None else max(1, len(set(period_days)))
    if finite.all():
        return correct(estimates, calibration, domain, params, period_blocks=period, calendar=calendar,
                       period_days=period_days)
    part = dataclasses.replace(estimates, **{f: getattr(estimates, f)[finite] for f in
                                             ("estimate", "std_error", "ci_low", "ci_high")})
    values = {c: [v for v, keep in zip(vals, finite, strict=True) if keep] for c, vals in domain.slice_values().items()}
    got = correct(part, calibration, values, params, period_blocks=period, calendar=calendar, period_days=period_days)
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
                              retention_checksum=got.retention_checksum, calendar_note=got.calendar_note,
                              calendar_applied=got.calendar_applied)


def estimates_frame(estimates: Estimates, domain: KeyDomain, corrected: CorrectedEstimates | None = None,
                    correction: str = "ratio") -> pd.DataFrame:
    """Long table: slice columns, ``query`` (count, q_1..q_d), then ``ESTIMATE_COLUMNS``.

    ``estimate``, ``std_error``, ``ci_low``, ``ci_high`` are about the TRUE total when ``corrected``
    (``calibration.correct``) is given: the point estimate U / r_hat (``correction`` "ratio",
    ``bias_corrected`` true) or the capped estimate U ("none": the history showed dividing adds more
    noise than it removes bias; std_error then includes that known bias), or per query ("count": the
    count divided, the values capped), and the calibrated interval either way. Without a calibration
    they are Alg. 4's, about the capped-and-clipped sum, and equal ``capped_estimate`` /
    ``capped_std_error`` (``bias_corrected`` false).
    """
    m, k = estimates.estimate.shape
    values = domain.slice_values()
    frame = pd.DataFrame({c: np.repeat(np.asarray(v, dtype=object), k) for c, v in values.items()})
    frame["query"] = np.tile(np.asarray(estimates.query_names, dtype=object), m)
    if corrected is None:
        point, std, low, high = estimates.estimate, estimates.std_error, estimates.ci_low, estimates.ci_high
        bias_corrected: bool | np.ndarray = False
    else:  # the intervals are of the true totals either way; a capped point's std_error includes its known bias
        divide = np.array(divided_queries(correction, k))[None, :]
        point = np.where(divide, corrected.estimate, estimates.estimate)
        std = np.where(divide, corrected.std_error,
                       np.sqrt(corrected.std_error**2 + (corrected.estimate - estimates.estimate) ** 2))
        low, high = corrected.ci_low, corrected.ci_high
        bias_corrected = np.tile(divide[0], m)
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


def release_json(publication: Publication, params_sha256: str) -> dict[str, Any]:
    """What the release says about itself: only public facts (no exact counts)."""
    release = publication.release
    simulation = release.simulation_seed is not None
    return {
        "simulation": simulation,
        "differentially_private": release.secure_noise,  # (not the operator-private folder: this file is public)
        "note": ("SIMULATION: seeded noise, NOT differentially private; never publish" if simulation
                 else "noised with discrete Laplace noise over the declared domain"),
        "epsilon": release.params.epsilon,
        "contribution_budget": release.params.contribution_budget,
        "encoding": release.params.encoding,
        "count_limit": release.params.count_limit,
        "queries": [{"column": q.column, "clip_threshold": q.clip_threshold, "budget_fraction": q.budget_fraction}
                    for q in release.params.queries],
        "exploration": None if release.params.exploration is None else release.params.exploration.to_json(),
        "retention_checksum": retention_checksum(release.params),
        "params_sha256": params_sha256,
        "domain_layout_sha256": release.domain.layout_checksum(),
        "slices": release.domain.num_slices,
        "keys": release.domain.num_keys + (0 if release.exploration is None else release.exploration.estimate.size),
        "estimates_of": ara_estimates_of(publication),
        "queries_without_signal": queries_without_signal(release.estimates),
    }


def ara_estimates_of(publication: Publication) -> str:
    """What the release folder's estimates are of (``Publication.release_frame``)."""
    if publication.corrected is None:
        return "the capped-and-clipped sums (Alg. 4; no calibration)"
    if not publication.public_calibration:
        return (f"the capped-and-clipped sums (Alg. 4); the true totals, calibrated on the joined history, are "
                f"operator-private ({outputs.private_file(outputs.TRUE_TOTALS_CSV)})")
    return ("the true totals (calibrated by privacy-safe tuning; point estimate: "
            + POINT_ESTIMATES[publication.correction] + ")")


def calibration_summary(publication: Publication) -> dict[str, Any] | None:
    """Which calibration made the estimates of the true totals (None: estimates are Alg. 4's)."""
    cal, corrected = publication.calibration, publication.corrected
    if cal is None or corrected is None:
        return None
    return {"retention_checksum": cal.retention_checksum, "params_checksum": cal.params_checksum, "method": cal.method,
            "history_blocks": cal.num_blocks, "period_blocks": corrected.period_blocks,
            "correction": publication.correction, "fallback_slices": corrected.fallback_slices,
            "calendar_applied": corrected.calendar_applied, "calendar_note": corrected.calendar_note,
            "released": publication.public_calibration}


def private_accounting(publication: Publication) -> dict[str, Any]:
    """The operator-private accounting of a release: exact counts (never published)."""
    release = publication.release
    return {**release.accounting.to_json(), "slices": release.domain.num_slices,
            "keys": int(release.report.noisy.size),  # every noised key: the domain's and the exploration arms'
            "domain_keys": release.domain.num_keys, "calibration": calibration_summary(publication),
            "queries_without_signal": queries_without_signal(release.estimates)}


def debug_annotations(unnoised: int) -> list[str]:
    """The Aggregation Service's debug-run tags of a domain bucket: every bucket is ``in_domain``; one
    with contributions is also ``in_reports``."""
    return ["in_domain", "in_reports"] if unnoised > 0 else ["in_domain"]


def release_buckets(release: Release) -> list[int]:
    """The 128-bit bucket of every key of the release, in the histogram's order (``histogram_buckets``)."""
    return histogram_buckets(release.params, release.domain)


def histogram_buckets(params: Params, domain: KeyDomain) -> list[int]:
    """The domain's keys, then each exploration arm's keys (the top bit set: main keys must fit below it):
    the output domain of a release with ``params``."""
    buckets = domain.buckets()
    exploration = params.exploration
    if exploration is None:
        return buckets
    if domain.total_bits > EXPLORATION_BIT:
        raise InvalidParameters(f"the domain's keys take {domain.total_bits} bits: with exploration arms they must "
                         f"fit in {EXPLORATION_BIT} (the top bit marks an arm's keys)")
    return buckets + [exploration.bucket(a, domain.query_code(col))
                      for a in range(exploration.num_arms) for col in range(domain.num_columns)]


def summary_records(release: Release) -> list[dict[str, Any]]:
    """``AggregatedFact`` records of the release (buckets with leading zero bytes left out)."""
    return avro.summary_report_records(release_buckets(release), release.report.noisy.ravel().tolist())


def domain_records(release: Release) -> list[dict[str, Any]]:
    """``AggregationBucket`` records of the release's output domain (16-byte buckets)."""
    return avro.output_domain_records(release_buckets(release))


def debug_records(release: Release) -> list[dict[str, Any]]:
    """``DebugAggregatedFact`` records of the release: unnoised metric, noise, annotations."""
    unnoised = release.report.unnoised.ravel().tolist()
    return avro.debug_report_records(release_buckets(release), unnoised, release.report.noise.ravel().tolist(),
                                     [debug_annotations(u) for u in unnoised])


def exploration_frame(release: Release) -> pd.DataFrame | None:
    """The exploration arms' estimates (Alg. 4 at each arm's count limit; public, noised): ``arm``,
    ``count_limit``, ``share``, ``query`` and the estimate with its error bars; None without arms."""
    exploration, estimates = release.params.exploration, release.exploration
    if exploration is None or estimates is None:
        return None
    k, q = estimates.estimate.shape
    return pd.DataFrame({
        "arm": np.repeat(np.arange(k), q),
        "count_limit": np.repeat([a.count_limit for a in exploration.arms], q),
        "share": np.repeat([a.share for a in exploration.arms], q),
        "query": np.tile(np.asarray(estimates.query_names, dtype=object), k),
        **{f: getattr(estimates, f).reshape(-1) for f in ("estimate", "std_error", "ci_low", "ci_high")},
    })


def attribution_release_json(rel: AttributionRelease, params_sha256: str, retention: Retention | None = None
                             ) -> dict[str, Any]:
    """What a W3C Attribution release's release.json says: public facts only (no exact counts)."""
    p = rel.params
    level = next(iter(rel.estimates.values())).level
    return {"api": Api.ATTRIBUTION.value, "params_sha256": params_sha256, "per_site_budget": p.per_site_budget,
            "epoch_days": p.epoch_days, "lookback_days": p.lookback_days,
            "queries": [{"name": q.name, "column": q.column, "epsilon": q.epsilon, "max_value": q.max_value,
                         "clip": q.clip, "value_scale": q.value_scale, "noise_scale": q.noise_scale} for q in p.queries],
            "histogram_size": rel.domain.num_slices, "layout_sha256": rel.domain.layout_checksum(),
            "domain": "data" if rel.domain.origin == DATA else rel.domain.origin,
            "interval_level": level, "simulation": rel.simulation_seed is not None,
            "bias_corrected": retention is not None, "estimates": estimates_of(retention),
            "queries_without_signal": attribution_queries_without_signal(rel.estimates),
            "retention": None if retention is None else {"ratios": dict(zip(p.query_names, retention.ratios,
                                                                            strict=True)),
                                                         "spreads": dict(zip(p.query_names, retention.spreads,
                                                                             strict=True)),
                                                         "level": retention.level}}


DEBUG_NEEDS_SIMULATION = "--debug-run writes unnoised sums: it needs --simulation-seed (a simulation)"
"""Why a debug run's unnoised sums are refused outside simulation (the writer's rule, and the CLI's before any work)."""


def attribution_release_files(rel: AttributionRelease, params_sha256: str, simulation: bool, debug_run: bool,
                              max_rejected_fraction: float, retention: Retention | None = None) -> dict[str, bytes]:
    """A W3C Attribution release's files by their path in the run folder (``io.outputs``: ``release/`` or
    the simulation's names, ``private/``), in the order they are written: the estimates (Parquet, CSV),
    the histogram layout (key_map.json, histogram_layout.csv), release.json, with ``debug_run`` the
    unnoised sums, and the exact accounting the driver reads back. Refused: a seeded release outside a
    simulation (or secure noise inside one), the unnoised sums of a release that is not a simulation
    (``Target.debug_needs_simulation``: the rule of every path, a graph wired from ``transforms/`` too),
    more than ``max_rejected_fraction`` of the rows rejected."""
    if (rel.simulation_seed is not None) != simulation:
        raise PrivacyRefusal("a release noised with a simulation seed is written only as a simulation, and a "
                             "simulation only with seeded noise")
    if debug_run and not simulation:
        raise PrivacyRefusal(DEBUG_NEEDS_SIMULATION)
    counts = rel.counts
    if counts.rows_read and counts.rows_rejected > max_rejected_fraction * counts.rows_read:
        raise InvalidInput(f"{counts.rows_rejected:,} of {counts.rows_read:,} rows are invalid (more than "
                           f"--max-rejected-fraction {max_rejected_fraction:g}): nothing released; see the dead letter")
    def name(file: str) -> str:
        return outputs.release_file(file, simulation)

    # the retention calibration is the joined history's (its ratios, spreads and size): the true totals it makes
    # stay with the operator, the release folder holds Alg. 4's estimates (noised numbers only)
    frame = rel.estimates_frame(None)
    released = attribution_release_json(rel, params_sha256, None)
    released["estimates"] = estimates_of(None, calibrated_privately=retention is not None)
    if retention is not None:
        released["true_totals"] = (f"operator-private ({outputs.private_file(outputs.TRUE_TOTALS_CSV)}): calibrated "
                                   f"on the joined history, whose retention ratios they hold")
    files = {name(outputs.ESTIMATES_PARQUET): outputs.parquet_bytes(frame),
             name(outputs.ESTIMATES_CSV): outputs.csv_bytes(frame),
             name(outputs.KEY_MAP_JSON): jsonio.dumps(rel.domain.to_json(params_sha256), indent=1).encode(),
             name(outputs.HISTOGRAM_LAYOUT_CSV): outputs.csv_bytes(histogram_layout(rel.domain)),
             name(outputs.RELEASE_JSON): jsonio.dumps(released, indent=1).encode()}
    if retention is not None:
        totals = rel.estimates_frame(retention)
        files[outputs.private_file(outputs.TRUE_TOTALS_PARQUET)] = outputs.parquet_bytes(totals)
        files[outputs.private_file(outputs.TRUE_TOTALS_CSV)] = outputs.csv_bytes(totals)
    if debug_run:
        files[outputs.private_file(outputs.DEBUG_HISTOGRAMS_CSV)] = outputs.csv_bytes(rel.debug_frame())
    files[outputs.private_file(outputs.ACCOUNTING)] = jsonio.dumps(rel.accounting(), indent=1).encode()
    return files
