"""The release workflow, written once (the tuning workflow's sibling, ``araopt.optimize.workflow``):

    grouped log (every impression's conversions together)
    -> per shard: encode (Alg. 3 / 6), cap (Alg. 1), per-key integer sums over the domain (``shard_sums``)
    -> the sums merged (``aggregate.DomainSumsCombiner``: integers, any order)
    -> the release step, once: the privacy rules (declared domain, simulation, rejected share, closing
       accounting) and noise once per key (Alg. 2), reconstruction (Alg. 4) (``release_step``)
    -> the publication: true totals with the version's calibration, the estimates table (``publish``)

The distributed step (grouped log -> merged sums and the validation's counts) is a backend's:
``InMemoryReleaseBackend`` runs it on a ``Conversions`` in this process (evaluate, replay, the
demo's and the benchmarks' releases, tests); ``measure``'s Beam job builds the same steps from
``transforms.aggregate`` (``EncodeBoundAndSum``: ``shard_sums`` per shard and the combiner;
``NoisyRelease``: ``release_step``) and maps ``publish`` over the result. The domain a release is
over is decided here too (``resolve_release_domain``: declared, the version's, or in simulation only
derived from the data), before any backend runs.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from araopt.constants import MAX_SLICES
from araopt.errors import InvalidParameters, PrivacyRefusal, check_epsilon
from araopt.io.conversions import DEFAULT_MAX_REJECTED_FRACTION, Conversions, ValidationCounts
from araopt.mechanism.aggregate import DomainSums
from araopt.mechanism.keys import KeyDomain
from araopt.mechanism.lifetime import ReleaseHistory
from araopt.mechanism.measure import check_measurable, shard_sums
from araopt.mechanism.params import Encoding, Params
from araopt.mechanism.release import Release, release_domain, release_step, with_version_end
from araopt.publication import DEBUG_NEEDS_SIMULATION, Publication, publish
from araopt.targets import check_domain, target_of
from araopt.version import ParameterVersion


@dataclass(frozen=True)
class ReleaseSpec:
    """What one release is made with: the parameter version, seeded noise (simulation only, NOT
    private) or secure noise (None), the largest share of rejected rows, the earlier releases that
    cost a lookback's rows (``mechanism.lifetime``), the first microsecond the input covers, and
    the days the release covers (the calibration's calendar)."""

    version: ParameterVersion
    simulation_seed: int | None = None
    max_rejected_fraction: float = DEFAULT_MAX_REJECTED_FRACTION
    history: ReleaseHistory | None = None
    coverage_start_us: int | None = None
    days: tuple[str, ...] | None = None

    @property
    def params(self) -> Params:
        return self.version.params


@dataclass(frozen=True)
class MergedSums:
    """The distributed step's result: the merged per-key sums (None: no shard produced any), the
    validation's counts of the period and of its lookback (None without one)."""

    sums: DomainSums | None
    counts: ValidationCounts
    lookback_counts: ValidationCounts | None = None


class ReleaseBackend(Protocol):
    """Where the distributed step of a release runs: grouped log -> per-key sums over ``domain``."""

    def domain_sums(self, spec: ReleaseSpec, domain: KeyDomain) -> MergedSums: ...


@dataclass(frozen=True)
class InMemoryReleaseBackend:
    """The distributed step on a log held in memory (one shard: every impression's conversions are in
    it, lookback rows flagged ``in_period`` False); ``counts``: the validation's, when it ran (else
    every period row read and none rejected)."""

    conversions: Conversions
    counts: ValidationCounts | None = None

    def domain_sums(self, spec: ReleaseSpec, domain: KeyDomain) -> MergedSums:
        check_measurable(self.conversions, spec.params)
        sums = shard_sums(self.conversions, spec.params, domain, spec.simulation_seed, spec.history,
                          spec.coverage_start_us)
        counts = self.counts or ValidationCounts(int(self.conversions.period_mask().sum()))
        return MergedSums(sums, counts, ValidationCounts(sums.lookback_rows) if sums.lookback_rows else None)


def release_and_publish(backend: ReleaseBackend, spec: ReleaseSpec, domain: KeyDomain, *,
                        rng: np.random.Generator | None = None) -> Publication:
    """The workflow: the backend's sums, the release step once (its rules, noise once per key), the
    publication. ``rng``: the noise's generator (tests); by default the secure one, or the seeded one
    of a simulation. ``domain`` takes the version's training window (``with_version_end``)."""
    domain = with_version_end(domain, spec.version.domain)
    merged = backend.domain_sums(spec, domain)
    release = release_step(merged.sums, merged.counts, spec.params, domain, simulation_seed=spec.simulation_seed,
                           max_rejected_fraction=spec.max_rejected_fraction, lookback_counts=merged.lookback_counts,
                           rng=rng)
    return publish_release(release, spec)


def publish_release(release: Release, spec: ReleaseSpec) -> Publication:
    """The workflow's last step: the release as published under ``spec``'s version and days."""
    return publish(release, spec.version, spec.days)


def resolve_release_domain(given: KeyDomain | None, given_source: str, version: ParameterVersion,
                           families: Mapping[str, str], simulation_seed: int | None,
                           max_slices: int = MAX_SLICES, max_slices_source: str = "--max-slices",
                           given_name: str | None = None) -> tuple[KeyDomain | None, str]:
    """The domain a release is over (``mechanism.release.release_domain``'s rules: declared, else the
    version's, else in simulation only none, derived from the data), checked against the version's
    slice and query columns when given (its errors name it ``given_name``, by default ``given_source``)."""
    if given is not None:  # its columns: those of the version's target (ARA's keys, Attribution's histograms)
        check_domain(version, given, given_name or given_source)
    return release_domain(given, given_source, version.domain, families, simulation_seed, max_slices,
                          max_slices_source)


def check_debug_run(version: ParameterVersion, debug_run: bool, simulation_seed: int | None) -> None:
    """Refuse a debug run outside simulation where it would write unnoised sums (``Target.debug_needs_simulation``)."""
    if debug_run and simulation_seed is None and target_of(version).debug_needs_simulation:
        raise PrivacyRefusal(DEBUG_NEEDS_SIMULATION)


def data_domain(conversions: Conversions, params: Params) -> KeyDomain:
    """SIMULATION ONLY: the domain of the slices present in ``conversions`` (origin ``data``; the release
    step refuses it outside simulation)."""
    return KeyDomain.from_slice_values(params.slice_columns, conversions.slices, params.query_columns,
                                       baseline=params.encoding == Encoding.BASELINE,
                                       conversion_slice_columns=params.conversion_slice_columns)


def release_epsilon(version: ParameterVersion, epsilon: float | None, override: bool, source: str
                    ) -> tuple[ParameterVersion, dict[str, Any]]:
    """The release's epsilon: the version's, unless ``epsilon`` differs and ``override`` says so (then
    recorded: ``{"epsilon_overridden": {"from", "to"}}``); ``source`` names the parameter file."""
    params = version.params
    if epsilon is None:
        return version, {}
    eps = check_epsilon(epsilon, "--epsilon")
    if eps == params.epsilon:
        return version, {}
    if not override:
        raise InvalidParameters(f"--epsilon {eps:g} differs from the parameter file's epsilon {params.epsilon:g} "
                                f"({source}); pass --override-epsilon to release at {eps:g} (it is recorded)")
    return version.with_epsilon(eps), {"epsilon_overridden": {"from": params.epsilon, "to": eps}}
