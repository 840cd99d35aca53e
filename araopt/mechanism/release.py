"""The release step, once, engine-free: per-key integer sums over the declared domain -> noise once
per key (SummaryReport, Alg. 2) -> reconstruction (ReconstructValues, Alg. 4) -> a ``Release``.

``mechanism.measure`` (in memory) and the Beam ``NoisyRelease`` (after the integer combine) both call
:func:`noisy_release`, so the release rules live here, once, for every path (the CLI, the in-memory
measure, a graph built from ``transforms/``, the privacy-safe tuner's parameters): the domain must be
declared (a domain whose origin is ``data``, derived from the data it describes, is released only in
simulation mode), the row accounting must close, and no more than ``max_rejected_fraction`` of the
rows read may have been rejected. What a release says beyond Alg. 4 (the true totals of a calibrated
parameter version, the published files) is ``araopt.publication``'s.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from araopt.errors import InvalidInput, PrivacyRefusal
from araopt.io.conversions import DEFAULT_MAX_REJECTED_FRACTION, ValidationCounts, check_rejected_share
from araopt.mechanism.aggregate import DomainSums, empty
from araopt.mechanism.keys import DATA, HISTORY, KeyDomain, check_domain_families
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
    secure_noise: bool = True  # False: seeded, or a caller's generator (tests): not private, never written as a release


def histogram_height(params: Params, domain: KeyDomain) -> int:
    """Rows of a release's histogram: the domain's slices and one pooled row per exploration arm."""
    return domain.num_slices + (params.exploration.num_arms if params.exploration is not None else 0)


def check_declared_domain(domain: KeyDomain, simulation_seed: int | None, source: str = "the key domain") -> None:
    """A release is over a declared domain: one of origin ``data`` (derived from the data it describes)
    only in simulation mode, since a release over the slices of the data it releases reveals which
    slices occur (two inputs differing in one row would differ in their keys)."""
    if domain.origin == DATA and simulation_seed is None:
        raise PrivacyRefusal(f"{source} was derived from the data it describes (derived from a conversion log: key "
                             f"map origin 'data', e.g. written by export-ara --conversions, or DomainFromData): "
                             f"a release over it reveals which slices occur; declare the domain (a .csv/.json list of "
                             f"slices, or the parameter version's history domain), or run in simulation mode "
                             f"(--simulation-seed)")


def check_sums_window(domain: KeyDomain, first_time_us: int | None, simulation: bool, how: str) -> None:
    """The release step's own :func:`check_learnt_window`, on the earliest conversion the sums hold
    (``first_time_us``; None: unknown), so that sums built by any path, by hand too, pass the rule the
    encode step applies: outside simulation, sums that do not record it are refused over a domain with a
    training window (``how``: how to build them with it)."""
    if not simulation and first_time_us is None and (domain.learnt_before_us is not None or domain.origin == HISTORY):
        raise PrivacyRefusal(f"the sums do not record their earliest conversion (sums built without their times: "
                             f"{how}), so the release step cannot check them against the domain's training window "
                             f"(check_learnt_window)")
    if first_time_us is not None:
        check_learnt_window(domain, np.array([first_time_us], dtype=np.int64), simulation)


def check_learnt_window(domain: KeyDomain, released_times_us: np.ndarray, simulation: bool) -> None:
    """No release of a parameter version's training history with that version (``KeyDomain.
    learnt_before_us``: the end of the history its count limit, clips and, for origin ``history``, its
    slices were learnt on). Over its history domain a release would reveal which slices occur in the data
    it releases (:func:`check_declared_domain`'s rule: one row of the released data would decide a
    published key); over any domain (a declared one gets the version's end: :func:`with_version_end`)
    it would release data with parameters read from that same data (a clip at one order's value).
    Outside simulation, refused when a released conversion (``released_times_us``: the period's, not the
    lookback's) is before that end, or when a history domain does not say where its history ended. Run
    by every path's encode step (ARA's ``shard_sums`` and in-memory ``measure``, Attribution's
    ``simulate_release``)."""
    if simulation:
        return
    if domain.origin == HISTORY and domain.learnt_before_us is None:
        raise PrivacyRefusal("the key domain lists the slices of a training history whose end it does not record "
                             "(a published key map or layout of another version's history domain, or a parameter "
                             "file written before araopt recorded it): a release over the same conversions would "
                             "reveal which slices occur in them; measure with the version it came from, re-run "
                             "nightly or optimize, declare the domain (--domain, a .csv/.json list of slices), or run "
                             "in simulation mode (--simulation-seed)")
    if domain.learnt_before_us is None:
        return
    times = np.asarray(released_times_us, dtype=np.int64)
    if times.size and int(times.min()) < domain.learnt_before_us:
        last = np.datetime64(int(domain.learnt_before_us) - 1, "us").astype("datetime64[s]")
        if domain.origin == HISTORY:
            raise PrivacyRefusal(
                f"the key domain lists the slices of a training history whose last conversion is at {last} UTC (the "
                f"parameter version's), and this release holds conversions from before then: a release over the "
                f"slices of the data it releases reveals which slices occur in it; release later conversions, "
                f"declare the domain (--domain, a .csv/.json list of slices), or run in simulation mode "
                f"(--simulation-seed)")
        raise PrivacyRefusal(
            f"the parameter version (its count limit and clips) was learnt on a training history whose last "
            f"conversion is at {last} UTC, and this release holds conversions from before then: parameters read "
            f"from the data they release reveal it, over any domain; release later conversions, or run in "
            f"simulation mode (--simulation-seed)")


def with_version_end(given: KeyDomain, carried: KeyDomain | None) -> KeyDomain:
    """The domain a release given ``given`` (a declared domain, or a published key map or layout, which
    leaves out where its history ended: ``KeyDomain.to_json``) is checked over when it releases with the
    parameter version whose domain is ``carried``: that version's end (``check_learnt_window``: its
    parameters were learnt on the history before it) applies to a domain of another origin (the later of
    the two ends) and to a history domain of the same layout (the version's own, published). A history
    domain of another layout keeps its own end (none: refused outside simulation)."""
    if carried is None or carried.learnt_before_us is None:
        return given
    if given.origin == HISTORY and carried != given:
        return given
    end = carried.learnt_before_us if given.learnt_before_us is None else max(given.learnt_before_us,
                                                                               carried.learnt_before_us)
    return dataclasses.replace(given, learnt_before_us=int(end))


def history_days_reason(domain: KeyDomain, days: Sequence[str] | None) -> str | None:
    """Why estimates over a history domain of a summary report (``reconstruct``) are operator-private, or
    None: the report's ``days`` (UTC dates) are not all after the history the domain lists ended (or
    either is unknown), so the aggregation service may have released the training conversions over keys
    learnt from them (:func:`check_learnt_window`'s rule, which ``measure`` enforces)."""
    if domain.origin != HISTORY:
        return None
    end = domain.learnt_before_us
    if end is not None and days and all(int(np.datetime64(d, "us").astype(np.int64)) >= end for d in days):
        return None
    why = ("the report's days are unknown (pass --days)" if not days else
           "the domain's end is unknown (give the key map with the parameter version it came from)" if end is None
           else "the report covers days before the end of the training history the domain lists")
    return (f"the domain is a parameter version's training slices and {why}: the estimates may list keys learnt "
            f"from the conversions they estimate; the output is OPERATOR-PRIVATE, never publish it")


def operator_private_reason(domain: KeyDomain, source: str) -> str | None:
    """Why an output listed over ``domain`` (``reconstruct``'s estimates) is operator-private, or None: a
    domain of origin ``data`` (a conversion log's slices, or a key map or layout written from one) lists
    exactly the slices that occur in that data, which a published table would reveal (the rule of
    :func:`check_declared_domain`)."""
    if domain.origin != DATA:
        return None
    return (f"the domain from {source} was derived from data (origin 'data'): the estimates list exactly the slices "
            f"that occur in it, which reveals them; the output is OPERATOR-PRIVATE, never publish it (for a "
            f"publishable table pass a declared key map or layout: measure's key_map.json over a declared domain)")


DATA_DERIVED = "derived from the data (simulation only)"
"""Where the domain of a simulated release without a declared one comes from (``release_domain``)."""


def release_domain(given: KeyDomain | None, given_source: str, carried: KeyDomain | None,
                   families: Mapping[str, str], simulation_seed: int | None, max_slices: int | None = None,
                   max_slices_source: str = "max_slices") -> tuple[KeyDomain | None, str]:
    """The key domain a release is over and where it came from: the declared one ``given`` (named by
    ``given_source``), else the one the parameter version carries (``carried``; its slice columns'
    value families checked against the input's ``families``), else, in simulation only, none: the
    mechanism derives it from the data (``DATA_DERIVED``). Refused: no declared domain outside
    simulation, a domain of origin ``data`` outside simulation (:func:`check_declared_domain`), more
    than ``max_slices`` slices."""
    if given is not None:
        domain, source = with_version_end(given, carried), given_source
    elif carried is not None:
        domain, source = carried, "the parameter version"
        check_domain_families(domain, families, source="the parameters' domain")
    elif simulation_seed is not None:
        return None, DATA_DERIVED
    else:
        raise PrivacyRefusal("a release needs a declared key domain: pass --domain (a key map, or a .csv/.json file "
                             "listing slice values), or parameters that carry one (araopt nightly and optimize publish "
                             "the history's domain); deriving it from the data being released is allowed only in "
                             "simulation mode (--simulation-seed)")
    check_declared_domain(domain, simulation_seed, f"the domain from {source}")
    if max_slices is not None and domain.num_slices > max_slices:
        raise InvalidInput(f"the domain from {source} has {domain.num_slices:,} slices, more than {max_slices_source} "
                           f"{max_slices:,}")
    return domain, source


def check_release_rules(domain: KeyDomain, accounting: Accounting, simulation_seed: int | None,
                        max_rejected_fraction: float = DEFAULT_MAX_REJECTED_FRACTION) -> None:
    """The rules every release passes, whatever path made it: a declared domain
    (:func:`check_declared_domain`), closing row accounting, and at most ``max_rejected_fraction`` of
    the rows read rejected."""
    check_declared_domain(domain, simulation_seed)
    if not accounting.closes:
        raise InvalidInput(f"row accounting does not close: {accounting.to_json()}")
    if not 0.0 <= max_rejected_fraction <= 1.0:
        raise InvalidInput(f"max_rejected_fraction must lie in [0, 1], got {max_rejected_fraction!r}")
    if accounting.rows_rejected > max_rejected_fraction * accounting.rows_read:
        raise PrivacyRefusal(f"{accounting.rows_rejected:,} of {accounting.rows_read:,} rows failed validation, above "
                             f"the {max_rejected_fraction:.0%} threshold: nothing is released")


def noisy_release(sums: DomainSums, params: Params, domain: KeyDomain, accounting: Accounting, *,
                  simulation_seed: int | None = None, rng: np.random.Generator | None = None,
                  max_rejected_fraction: float = DEFAULT_MAX_REJECTED_FRACTION) -> Release:
    """Noise once per key (Alg. 2, secure generator unless ``rng`` or ``simulation_seed``), including
    keys without contributions and the exploration arms' keys, then reconstruct (Alg. 4, each arm at
    its own count limit). Refused unless the release rules hold (:func:`check_release_rules`)."""
    height = histogram_height(params, domain)
    if sums.histogram.shape != (height, domain.num_columns):
        raise InvalidInput(f"sums have shape {sums.histogram.shape}, the domain needs ({height}, {domain.num_columns})")
    check_release_rules(domain, accounting, simulation_seed, max_rejected_fraction)
    check_sums_window(domain, sums.first_time_us, simulation_seed is not None,
                      "pass conversion_time to aggregate.domain_sums, or use shard_sums")
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
    return Release(params, domain, report, estimates, accounting, simulation_seed, exploration,
                   secure_noise=rng is None and simulation_seed is None)


SUMS_AND_NOISE_ONE_MODE = (
    "the sums and their noise are one simulation or one release: sums made with a simulation seed (seeded "
    "draws, a lookback costed without the release history) are noised only with one, and a release's only "
    "without (pass the same simulation_seed to the step that makes the sums and the one that noises them: "
    "EncodeBoundAndSum and NoisyRelease, or the browsers' simulation and attribution.release.release)")
"""Why the release step (ARA's ``release_step``, Attribution's ``release``) refuses sums made in the other mode
than its noise."""


def release_step(sums: DomainSums | None, counts: ValidationCounts, params: Params, domain: KeyDomain, *,
                 simulation_seed: int | None = None, max_rejected_fraction: float = DEFAULT_MAX_REJECTED_FRACTION,
                 lookback_counts: ValidationCounts | None = None, rng: np.random.Generator | None = None) -> Release:
    """The release step of every path (the release workflow's, ``araopt.release_workflow``), run once on
    the merged per-key sums: the validation's rejected share first (``check_rejected_share``: nothing is
    noised over an input that failed validation), the exact accounting from the validation ``counts``
    (and the lookback's) and the sums, then :func:`noisy_release` (its rules, noise once per key: Alg. 2;
    Alg. 4). ``sums`` None: no shard produced any (an empty histogram over the domain)."""
    check_rejected_share(counts, max_rejected_fraction)
    if sums is not None and sums.simulated != (simulation_seed is not None):
        raise PrivacyRefusal(SUMS_AND_NOISE_ONE_MODE)
    if sums is None:
        sums = empty(histogram_height(params, domain), domain.num_columns)
    lookback = lookback_counts or ValidationCounts()
    accounting = Accounting(counts.rows_read, counts.rows_rejected, sums.kept, sums.capped, sums.outside_domain,
                            sums.impressions, counts.rejected_by_reason, counts.times_floored,
                            lookback.rows_read, lookback.rows_rejected, sums.lookback_rows, sums.rows_before_lookback)
    return noisy_release(sums, params, domain, accounting, simulation_seed=simulation_seed, rng=rng,
                         max_rejected_fraction=max_rejected_fraction)
