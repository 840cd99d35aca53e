"""SIMULATION of the browser and the Aggregation Service (tests, demos): what the browser makes of a
source and a trigger registration, Alg. 1 with Chrome's report limit over the triggers, and Alg. 2 with
key-deterministic (not private) noise."""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from araopt.ara.registrations import ARA_CONTRIBUTION_BUDGET, ARA_MAX_REPORTS_PER_SOURCE
from araopt.mechanism.bounding import bound_contributions
from araopt.mechanism.noise import noise_parameter
from araopt.mechanism.report import simulated_noise


# ---- browser and Aggregation Service simulation (tests, demos) -----------------------------------
def browser_contributions(source: Mapping[str, Any], trigger: Mapping[str, Any]) -> list[tuple[int, int]]:
    """What the browser makes of a (source, trigger) pair: (bucket, value) per key with a value.

    Each source key's piece is OR-ed with the ``key_piece`` of every trigger-data entry listing it in
    ``source_keys``; values come from ``aggregatable_values`` for keys the source declares.
    """
    keys = {name: int(piece, 16) for name, piece in source.get("aggregation_keys", {}).items()}
    for entry in trigger.get("aggregatable_trigger_data", []):
        piece = int(entry["key_piece"], 16)
        for name in entry.get("source_keys", []):
            if name in keys:
                keys[name] |= piece
    return [(keys[name], int(v)) for name, v in trigger.get("aggregatable_values", {}).items() if name in keys and v > 0]


@dataclass(frozen=True)
class BrowserResult:
    """Aggregatable reports (lists of (bucket, value)) of the triggers that passed Alg. 1 and the report cap."""

    reports: tuple[tuple[tuple[int, int], ...], ...]
    kept: np.ndarray


def simulate_browser(
    sources: Sequence[Mapping[str, Any]], source_index: Sequence[int], impression_id: np.ndarray,
    conversion_time: np.ndarray, triggers: Sequence[Mapping[str, Any]],
    contribution_budget: int = ARA_CONTRIBUTION_BUDGET, max_reports: int = ARA_MAX_REPORTS_PER_SOURCE,
) -> BrowserResult:
    """SIMULATION: triggers (in arrival order; ties in time keep that order) against their sources.

    Contributions from :func:`browser_contributions`; a trigger is kept iff its source has sent
    fewer than ``max_reports`` non-empty reports and its total fits the source's remaining budget
    (Alg. 1 with Chrome's report limit, :func:`araopt.mechanism.bounding.bound_contributions`).
    """
    contribs = [tuple(browser_contributions(sources[s], t)) for s, t in zip(source_index, triggers, strict=True)]
    totals = np.array([sum(v for _, v in c) for c in contribs], dtype=np.int64)
    n = len(contribs)
    kept = bound_contributions(np.asarray(impression_id), np.asarray(conversion_time), totals, contribution_budget,
                               tie_breaker=np.arange(n), max_reports=max_reports)
    return BrowserResult(tuple(c for c, k in zip(contribs, kept, strict=True) if k and c), kept)


@dataclass(frozen=True)
class ServiceResult:
    """Simulated Aggregation Service output: per output-domain bucket, and buckets seen only in reports."""

    buckets: list[int]
    noisy: np.ndarray
    unnoised: np.ndarray
    noise: np.ndarray
    in_reports: np.ndarray
    report_only_buckets: list[int]
    report_only_sums: np.ndarray


def simulate_aggregation_service(
    reports: Iterable[Iterable[tuple[int, int]]], domain_buckets: Sequence[int], epsilon: float, simulation_seed: int,
    contribution_budget: int = ARA_CONTRIBUTION_BUDGET, key_ids: Sequence[int] | None = None,
) -> ServiceResult:
    """SIMULATION of Alg. 2: per domain bucket, the sum of its contributions + DLap(ε/Γ), noise from
    :func:`araopt.mechanism.report.simulated_noise` keyed by the dense key id (default: position in the domain)."""
    sums: dict[int, int] = {}
    for report in reports:
        for bucket, value in report:
            sums[bucket] = sums.get(bucket, 0) + int(value)
    domain = [int(b) for b in domain_buckets]
    in_domain = set(domain)
    ids = np.arange(len(domain)) if key_ids is None else np.asarray(key_ids, dtype=np.int64)
    unnoised = np.array([sums.get(b, 0) for b in domain], dtype=np.int64)
    noise = simulated_noise(simulation_seed, ids, noise_parameter(epsilon, contribution_budget)).astype(np.int64)
    extra = sorted(b for b in sums if b not in in_domain)
    return ServiceResult(domain, unnoised + noise, unnoised, noise, np.array([b in sums for b in domain], dtype=bool),
                         extra, np.array([sums[b] for b in extra], dtype=np.int64))
