"""The whole ARA mechanism on in-memory records: encode (Alg. 2/5) -> bound (Alg. 1) -> sum over
the domain -> noise (Alg. 3) -> reconstruct (Alg. 4). The Beam pipeline runs the same functions per
shard (``encode_and_bound``) and after its combine (``summary_report``, ``reconstruct``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .bounding import bound_contributions
from .conversions import Conversions
from .encoding import encode
from .keys import KeyDomain
from .params import Params
from .randomness import keyed_uniforms, secure_generator
from .report import Estimates, SummaryReport, key_histogram, reconstruct, summary_report


def rounding_uniforms(record_keys: np.ndarray, num_queries: int, simulation_seed: int | None) -> np.ndarray | None:
    """Simulation: per-record uniforms from (seed, record content hash), partition-independent."""
    if simulation_seed is None:
        return None
    return np.column_stack([keyed_uniforms(simulation_seed, record_keys, col) for col in range(num_queries)])


def encode_and_bound(
    conversions: Conversions, params: Params, simulation_seed: int | None = None,
    rng: np.random.Generator | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(contributions (n, d+1), kept mask) for records that hold *all* conversions of their impressions."""
    keys = conversions.record_keys()
    uniforms = rounding_uniforms(keys, params.num_queries, simulation_seed)
    if uniforms is None and rng is None:
        rng = secure_generator()
    contributions = encode(conversions.values, params, rng, uniforms=uniforms)
    kept = bound_contributions(conversions.impression_id, conversions.conversion_time, contributions,
                               params.contribution_budget, tie_breaker=keys)
    return contributions, kept


@dataclass(frozen=True)
class Measurement:
    """Everything one simulated ARA release produces, plus the accounting of records."""

    domain: KeyDomain
    histogram: np.ndarray
    report: SummaryReport
    estimates: Estimates
    kept: np.ndarray
    in_domain: np.ndarray

    @property
    def rows(self) -> int:
        return int(len(self.kept))

    @property
    def rows_kept(self) -> int:
        return int((self.kept & self.in_domain).sum())

    @property
    def rows_capped(self) -> int:
        return int((~self.kept).sum())

    @property
    def rows_outside_domain(self) -> int:
        return int((self.kept & ~self.in_domain).sum())


def measure(
    conversions: Conversions, params: Params, domain: KeyDomain | None = None, *,
    simulation_seed: int | None = None, rng: np.random.Generator | None = None,
    noise_rng: np.random.Generator | None = None,
) -> Measurement:
    """Run the mechanism. Without ``simulation_seed`` all randomness is from the secure generator.

    ``domain`` defaults to the slices present in the data (simulation convenience).
    """
    if tuple(conversions.value_columns) != params.query_columns:
        raise ValueError(f"conversions carry value columns {conversions.value_columns}, params expect {params.query_columns}")
    if domain is None:
        domain = KeyDomain.from_slice_values(params.slice_columns, conversions.slices, params.query_columns,
                                             baseline=params.encoding == "baseline",
                                             conversion_slice_columns=params.conversion_slice_columns)
    contributions, kept = encode_and_bound(conversions, params, simulation_seed, rng)
    slice_idx = domain.slice_index(conversions.slices)
    in_domain = slice_idx >= 0
    use = kept & in_domain
    hist = key_histogram(slice_idx[use], contributions[use], domain.num_slices)
    report = summary_report(hist, params.epsilon, params.contribution_budget, rng=noise_rng, simulation_seed=simulation_seed)
    return Measurement(domain, hist, report, reconstruct(report.noisy, params), kept, in_domain)
