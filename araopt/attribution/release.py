"""One W3C Attribution Level 1 release, engine-free (the release step of ``measure --api attribution``,
whichever backend made the sums): the merged unnoised sums of complete browsers -> the aggregation
service's noise once per histogram index (discrete Laplace of scale 2 maxValue / epsilon) and Alg. 4's
estimates with their noise intervals (``measure.noisy_release``) -> an ``AttributionRelease``, with
what it publishes (the estimates table, of the true totals with a retention calibration) and what
stays operator-private (the unnoised sums, the exact accounting)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from araopt.attribution.calibrate import Retention, published_frame
from araopt.attribution.lifetime import CHARGED, MATCHED
from araopt.attribution.measure import BrowserSums, noisy_release
from araopt.attribution.params import AttributionParams
from araopt.attribution.reconstruct import Estimate, check_noise_rates, read_histograms, reconstruct_histograms
from araopt.errors import InvalidInput, InvalidParameters, PrivacyRefusal
from araopt.io.conversions import DEFAULT_MAX_REJECTED_FRACTION, ValidationCounts, check_rejected_share
from araopt.mechanism.aggregate import NO_CONVERSION
from araopt.mechanism.keys import DECLARED, ORIGIN_COLUMN, KeyDomain
from araopt.mechanism.release import SUMS_AND_NOISE_ONE_MODE, check_declared_domain, check_sums_window


@dataclass(frozen=True)
class AttributionRelease:
    """One measurement's release: the noisy histograms and estimates per (query, task) over the
    domain's histogram indices, and the operator-private sums and counts."""

    params: AttributionParams
    domain: KeyDomain
    noisy: dict[tuple[str, int], np.ndarray]
    estimates: dict[tuple[str, int], Estimate]
    sums: BrowserSums
    counts: ValidationCounts
    simulation_seed: int | None

    def estimates_frame(self, retention: Retention | None = None) -> pd.DataFrame:
        """The published table (``araopt.attribution.calibrate.published_frame``): of the true totals
        with the version's ``retention``, else of the accepted clipped values."""
        return published_frame(self.estimates, self.domain, self.params, retention)

    def debug_frame(self) -> pd.DataFrame:
        """OPERATOR-PRIVATE: the unnoised sums per (query, histogram index) (``query,histogram_index,
        unnoised_sum``; with conversion-side slices also ``task``)."""
        frames = []
        for (name, task), sums in sorted(self.sums.unnoised.items()):
            frame = pd.DataFrame({"query": name, "histogram_index": np.arange(len(sums)), "unnoised_sum": sums})
            if self.params.conversion_slice_columns:
                frame.insert(1, "task", task)
            frames.append(frame)
        return pd.concat(frames, ignore_index=True)

    def accounting(self) -> dict[str, Any]:
        """OPERATOR-PRIVATE exact counts; rows read = kept + outside the layout + rejected; ``CHARGED``:
        the impression times whose epochs the accepted reports charged, ``MATCHED``: those the matched reports
        used (``araopt.attribution.lifetime``); the lookback's rows and reports simulated again."""
        c, s = self.counts, self.sums
        charged, matched = s.charged_window(self.params.epoch_days), s.matched_window(self.params.epoch_days)
        return {"rows_read": c.rows_read, "rows_rejected": c.rows_rejected,
                "rows_rejected_by_reason": dict(c.rejected_by_reason), "conversions_kept": s.rows - s.rows_outside_domain,
                "conversions_outside_domain": s.rows_outside_domain, "browsers": s.browsers,
                "histogram_size": self.domain.num_slices,
                "reports": s.reports, "reports_matched": s.reports_matched, "reports_refused_for_budget": s.reports_refused,
                CHARGED: None if charged is None else charged.to_json(),
                MATCHED: None if matched is None else matched.to_json(),
                "lookback_rows": s.lookback_rows, "lookback_reports": s.lookback_reports,
                "accounting_closes": c.rows_read - c.rows_rejected == s.rows}


def histogram_layout(domain: KeyDomain) -> pd.DataFrame:
    """The histogram layout: each histogram index with its impression-side slice values; a layout derived
    from data (``data``) or from a training history (``history``) also says so (an ``origin`` column on
    every row), so that read back as ``--domain`` it keeps its origin (refused outside simulation, or over
    its history's own rows) instead of passing for a declared list of slices."""
    frame = pd.DataFrame({"histogram_index": range(domain.num_slices), **domain.slice_values()})
    if domain.origin != DECLARED:
        frame[ORIGIN_COLUMN] = domain.origin
    return frame


def empty_sums(params: AttributionParams, domain: KeyDomain, num_tasks: int, simulated: bool = False) -> BrowserSums:
    """No browser's sums: zeros per (query, task) over the histogram indices (the identity of the merge)."""
    return BrowserSums({(q.name, t): np.zeros(domain.num_slices, dtype=np.int64)
                        for q in params.queries for t in range(num_tasks)}, simulated=simulated,
                       first_time_us=NO_CONVERSION)


def release(sums: Sequence[BrowserSums], params: AttributionParams, domain: KeyDomain, counts: ValidationCounts,
            simulation_seed: int | None, num_tasks: int = 1, level: float = 0.95,
            max_rejected_fraction: float = DEFAULT_MAX_REJECTED_FRACTION) -> AttributionRelease:
    """The release step, once, on the merged sums of every shard's browsers (every attribution path: the
    Beam job's noise step, a graph wired from ``transforms/``): ARA's release rules
    (``araopt.mechanism.release``) first (at most ``max_rejected_fraction`` of the rows read rejected, a
    declared layout: one of origin ``data`` only in simulation, rows read = rejected + simulated), then
    noise once per index, Alg. 4."""
    simulation = simulation_seed is not None
    if any(s.simulated != simulation for s in sums):
        raise PrivacyRefusal(SUMS_AND_NOISE_ONE_MODE)
    merged = BrowserSums.merge([empty_sums(params, domain, num_tasks, simulation), *sums])
    check_rejected_share(counts, max_rejected_fraction)
    check_declared_domain(domain, simulation_seed)
    check_sums_window(domain, merged.first_time_us, simulation, "use simulate_browsers")
    if counts.rows_read - counts.rows_rejected != merged.rows:
        raise InvalidInput(f"row accounting does not close: {counts.rows_read:,} rows read, {counts.rows_rejected:,} "
                           f"rejected, {merged.rows:,} simulated")
    noisy, estimates = noisy_release(params, merged.unnoised, simulation_seed, level)
    return AttributionRelease(params, domain, noisy, estimates, merged, counts, simulation_seed)


def reconstruction_layout(params: AttributionParams, key_map: KeyDomain | None, key_map_source: str | None,
                          carried: KeyDomain | None, rows: pd.DataFrame | None) -> KeyDomain:
    """The histogram layout an aggregation's histograms are read through (``reconstruct`` of an attribution
    version): the key map (measure's key_map.json, checked against ``params``), else the one the version
    carries, else the slices of a conversion log's ``rows``."""
    if key_map is not None:
        params.check_domain(key_map, source=f"key map {key_map_source}")
        return key_map
    if carried is not None:
        return carried
    if rows is not None:
        return KeyDomain.from_slice_values(params.slice_columns, {c: rows[c].to_numpy() for c in params.slice_columns},
                                           params.query_names)
    raise InvalidParameters("reconstruct needs the histogram layout: pass --key-map M (measure's key_map.json), a "
                            "version that carries one, or --conversions LOG")


def estimates_from_histograms(params: AttributionParams, retention: Retention | None, histograms: pd.DataFrame,
                              domain: KeyDomain, level: float = 0.95, source: str = "histograms"
                              ) -> tuple[pd.DataFrame, int, int]:
    """Alg. 4 on a real aggregation's noisy histograms (``query,histogram_index,noisy_sum``) through the
    layout ``domain``: the published estimates table (of the true totals with ``retention``), how many
    histograms, how many (query, task, index) entries are missing (NaN estimates)."""
    check_noise_rates(params)  # (the intervals are the noise's)
    noisy, missing = read_histograms(histograms, params, domain.num_slices, source=source)
    estimates = reconstruct_histograms(params, noisy, level)
    return published_frame(estimates, domain, params, retention), len(noisy), missing
