"""The whole ARA mechanism on in-memory records: encode (HistogramContribution, Alg. 3 / Alg. 6) ->
cap (ContributionCapping, Alg. 1) -> sum over the domain -> the release step (``araopt.mechanism.release``:
SummaryReport, Alg. 2, and ReconstructValues, Alg. 4). The Beam pipeline runs the same functions per
shard (``encode_and_bound``, ``aggregate.domain_sums``) and after its combine (``release.noisy_release``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd

from araopt.errors import InvalidInput, PrivacyRefusal
from araopt.io.conversions import Conversions, ValidationCounts, concat_periods, split_periods
from araopt.mechanism.aggregate import DomainSums, domain_sums
from araopt.mechanism.bounding import bound_contributions
from araopt.mechanism.encoding import encode
from araopt.mechanism.exploration import exploration_rows
from araopt.mechanism.keys import KeyDomain
from araopt.mechanism.lifetime import ReleaseHistory, lifetime_norms
from araopt.mechanism.params import Encoding, Params
from araopt.mechanism.randomness import keyed_uniforms, secure_generator
from araopt.mechanism.release import (
    Release,
    check_learnt_window,
    histogram_height,
    release_domain,
    release_step,
)
from araopt.mechanism.report import Estimates, SummaryReport
from araopt.mechanism.sources import impression_slice_conflicts


def distinct_count(keys: np.ndarray) -> int:
    """The number of distinct values of ``keys``: by a count per value for small non-negative integers (the
    dense ranks of string ids, ``Conversions.impression_sort_keys``), else by a hash table."""
    if keys.dtype.kind in "iu" and len(keys) and int(keys.min()) >= 0 and int(keys.max()) < 4 * len(keys) + 1024:
        return int(np.count_nonzero(np.bincount(keys)))
    return len(pd.unique(keys))


def rounding_uniforms(record_keys: np.ndarray, num_queries: int, simulation_seed: int | None) -> np.ndarray | None:
    """Simulation: per-record uniforms from (seed, record content hash), partition-independent."""
    if simulation_seed is None:
        return None
    return np.column_stack([keyed_uniforms(simulation_seed, record_keys, col) for col in range(num_queries)])


LOOKBACK_NEEDS_HISTORY = (
    "lookback rows are costed by the releases that used them: pass the release history (the ledger's, "
    "Ledger.release_history) or ReleaseHistory.of([]) to declare that no release used them; without one they "
    "would be costed at today's parameters, under an earlier release's at a lower count limit")
"""Why a release (no simulation seed) with lookback rows needs a ``ReleaseHistory``, whatever path made it."""


def check_released_times(conversions: Conversions, domain: KeyDomain, simulation_seed: int | None) -> None:
    """``release.check_learnt_window`` on the conversions this release sums (the period's; the lookback's
    only spend budget): every ARA path's encode step (``measure``, ``shard_sums``) runs it."""
    check_learnt_window(domain, conversions.conversion_time[conversions.period_mask()], simulation_seed is not None)


def encode_and_bound(
    conversions: Conversions, params: Params, simulation_seed: int | None = None,
    rng: np.random.Generator | None = None, history: ReleaseHistory | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(contributions (n, d+1), kept mask) for records that hold *all* conversions of their impressions
    (up to the end of the measured period: lookback rows included, whatever ``in_period`` says).

    Lookback rows (``in_period`` False) cost the budget of the configuration that released them
    (``history``, from the release ledger; ``araopt.mechanism.lifetime``), not today's; their
    contributions are encoded with today's parameters but never summed."""
    if conversions.has_lookback and history is None and simulation_seed is None:
        raise PrivacyRefusal(LOOKBACK_NEEDS_HISTORY)
    keys = conversions.record_keys()
    uniforms = rounding_uniforms(keys, params.num_queries, simulation_seed)
    if uniforms is None and rng is None:
        rng = secure_generator()
    if params.exploration is None:
        contributions = encode(conversions.values, params, rng, uniforms=uniforms)
    else:  # every arm's conversions are encoded at the arm's count limit (Alg. 3 / 6 at C_a)
        arm = params.exploration.assign(conversions.impression_id)
        contributions = np.zeros((len(conversions), params.num_queries + 1), dtype=np.int64)
        for index in range(-1, params.exploration.num_arms):
            rows = np.flatnonzero(arm == index)
            if len(rows):
                contributions[rows] = encode(conversions.values[rows], params if index < 0 else params.for_arm(index),
                                             rng, uniforms=None if uniforms is None else uniforms[rows])
    if conversions.has_lookback:  # Alg. 1 over the impression's life: earlier rows at what they really cost
        low, high = lifetime_norms(conversions, params, contributions, history, uniforms)
        kept = bound_contributions(conversions.impression_sort_keys(), conversions.conversion_time, low,
                                   params.contribution_budget, tie_breaker=keys, upper_norms=high)
    else:
        kept = bound_contributions(conversions.impression_sort_keys(), conversions.conversion_time, contributions,
                                   params.contribution_budget, tie_breaker=keys)
    return contributions, kept


def histogram_rows(conversions: Conversions, params: Params, domain: KeyDomain) -> np.ndarray:
    """The histogram row of every record: its domain slice (-1 outside the domain) or, for an
    exploration arm's record, the arm's pooled row ``num_slices + arm``."""
    slice_index = domain.slice_index(conversions.slices)
    if params.exploration is None:
        return slice_index
    return exploration_rows(params.exploration.assign(conversions.impression_id), domain.num_slices, slice_index)


def check_measurable(conversions: Conversions, params: Params) -> None:
    """An in-memory log the mechanism can measure: the parameters' value columns, and every impression's
    conversions with its first conversion's impression-side slice (one source, one slice); refused
    otherwise (the jobs dead-letter such rows)."""
    if tuple(conversions.value_columns) != params.query_columns:
        raise InvalidInput(f"conversions carry value columns {conversions.value_columns}, "
                           f"params expect {params.query_columns}")
    inconsistent = impression_slice_conflicts(conversions, params.impression_slice_columns)
    if inconsistent.any():
        raise InvalidInput(f"{int(inconsistent.sum())} conversion(s) have impression-side slice values "
                           f"({', '.join(params.impression_slice_columns)}) that differ from their impression's first "
                           f"conversion (e.g. impression {conversions.impression_id[np.flatnonzero(inconsistent)[0]]!r}): "
                           f"an impression is one source with one slice; remove them (the jobs dead-letter them)")


@dataclass(frozen=True)
class Measurement:
    """Everything one ARA release produces in memory: the release and the per-record masks."""

    release: Release
    histogram: np.ndarray
    kept: np.ndarray  # per record, lookback rows included (Alg. 1 runs over them too)
    in_domain: np.ndarray

    @property
    def domain(self) -> KeyDomain:
        return self.release.domain

    @property
    def report(self) -> SummaryReport:
        return self.release.report

    @property
    def estimates(self) -> Estimates:
        return self.release.estimates

    @property
    def rows(self) -> int:
        return int(len(self.kept))

    @property
    def rows_kept(self) -> int:
        return self.release.accounting.rows_kept

    @property
    def rows_capped(self) -> int:
        return self.release.accounting.rows_capped

    @property
    def rows_outside_domain(self) -> int:
        return self.release.accounting.rows_outside_domain


def measure(
    conversions: Conversions, params: Params, domain: KeyDomain | None = None, *,
    simulation_seed: int | None = None, rng: np.random.Generator | None = None,
    noise_rng: np.random.Generator | None = None, history: ReleaseHistory | None = None,
) -> Measurement:
    """Run the mechanism. Without ``simulation_seed`` all randomness is from the secure generator
    (or the given ``rng`` / ``noise_rng``, for tests). Conversions whose impression-side slice
    values differ from their impression's first conversion are refused (ValueError).

    ``history``: the earlier releases (configurations and the conversions each released) that cost the
    lookback rows (``araopt.mechanism.lifetime``); None: no release recorded, today's parameters.

    ``domain`` may be omitted only in simulation (``simulation_seed``): a real release over a domain
    derived from the data it releases would reveal which slices occur in it (the release step refuses
    a domain of origin ``data`` outside simulation, however it was made).
    """
    check_measurable(conversions, params)
    domain, _ = release_domain(domain, "the domain given", None, {}, simulation_seed)  # the release step's rules
    if domain is None:  # simulation only
        domain = KeyDomain.from_slice_values(params.slice_columns, conversions.slices, params.query_columns,
                                             baseline=params.encoding == Encoding.BASELINE,
                                             conversion_slice_columns=params.conversion_slice_columns)
    check_released_times(conversions, domain, simulation_seed)
    contributions, kept = encode_and_bound(conversions, params, simulation_seed, rng, history)
    slice_idx = histogram_rows(conversions, params, domain)
    period = conversions.period_mask()
    sums = domain_sums(slice_idx, contributions, kept, histogram_height(params, domain),
                       impressions=distinct_count(conversions.impression_sort_keys()[period]), in_period=period,
                       conversion_time=conversions.conversion_time)
    sums = dataclasses.replace(sums, simulated=simulation_seed is not None)
    release = release_step(sums, ValidationCounts(int(period.sum())), params, domain, simulation_seed=simulation_seed,
                           lookback_counts=ValidationCounts(sums.lookback_rows), rng=noise_rng)
    return Measurement(release, sums.histogram, kept, (slice_idx >= 0) & (slice_idx < domain.num_slices))


def shard_sums(conversions: Conversions, params: Params, domain: KeyDomain, simulation_seed: int | None = None,
               history: ReleaseHistory | None = None, coverage_start_us: int | None = None) -> DomainSums:
    """One shard of complete impressions (the release workflow's distributed step): encoding (Alg. 3 /
    Alg. 6), capping (Alg. 1) over the period's rows and their lookback, per-key sums of the period's
    rows over ``domain``. Lookback rows of impressions without a period row are left out (they cannot
    change anything) but counted in ``lookback_rows``; ``rows_before_lookback``: period rows of
    impressions shown before ``coverage_start_us`` (the earliest conversion read)."""
    lookback_rows = 0
    if conversions.in_period is not None:
        lookback_rows = int((~conversions.period_mask()).sum())
        conversions = concat_periods(*split_periods(conversions))
    check_released_times(conversions, domain, simulation_seed)
    contributions, kept = encode_and_bound(conversions, params, simulation_seed, history=history)
    period = conversions.period_mask()
    sums = domain_sums(histogram_rows(conversions, params, domain), contributions, kept, histogram_height(params, domain),
                       impressions=distinct_count(conversions.impression_sort_keys()[period]), in_period=period,
                       rows_before_lookback=rows_before_coverage(conversions, coverage_start_us),
                       conversion_time=conversions.conversion_time)
    if conversions.in_period is not None:
        sums = dataclasses.replace(sums, lookback_rows=lookback_rows)
    return dataclasses.replace(sums, simulated=simulation_seed is not None)


def rows_before_coverage(conversions: Conversions, coverage_start_us: int | None) -> int:
    """Period rows of impressions shown before ``coverage_start_us`` (the earliest conversion the job
    reads): their earlier conversions may be missing. 0 when impression times are unknown."""
    if coverage_start_us is None or conversions.impression_time is None:
        return 0
    return int((conversions.period_mask() & (conversions.impression_time < coverage_start_us)).sum())
