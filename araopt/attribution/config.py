"""The implementation-defined values of one browser (spec "Setting Implementation-Defined Values",
"Privacy and Safety Limit Parameter Configuration"), in the units of the reference implementation:
budgets in microepsilons (10^-6 epsilon), durations in days.

``from_e2e`` reads the spec's end-to-end ``config`` (``e2e-tests/CONFIG.json``, camelCase names),
which also carries the two random draws of a browser instance: ``epochStart`` (where in the epoch the
instance's epochs start) and ``fairlyAllocateCreditFraction`` (the uniform of credit rounding).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from araopt.errors import InvalidParameters

MICROEPSILONS = 1_000_000
"""Microepsilons per epsilon: the unit of every budget store."""
MAX_CONVERSION_EPSILON = 4294
"""The largest ``epsilon`` of one ``measureConversion`` (budgets are 32-bit unsigned microepsilons)."""
MAX_UNSIGNED_LONG = 2**32 - 1
DAY_MS = 86_400_000
HOUR_MS = 3_600_000
DAP_HISTOGRAM = "dap-18-histogram"
DEFAULT_AGGREGATION_SERVICE = "https://agg-service.example"

_E2E_NAMES = {
    "per_site_budget": "perSitePrivacyBudget",
    "global_budget_per_epoch": "globalPrivacyBudgetPerEpoch",
    "impression_site_quota_per_epoch": "impressionSiteQuotaPerEpoch",
    "epoch_days": "privacyBudgetEpochDays",
    "max_lookback_days": "maxLookbackDays",
    "max_histogram_size": "maxHistogramSize",
    "max_credit_size": "maxCreditSize",
    "max_match_values": "maxMatchValues",
    "max_conversion_sites_per_impression": "maxConversionSitesPerImpression",
    "max_conversion_callers_per_impression": "maxConversionCallersPerImpression",
    "max_impression_sites_for_conversion": "maxImpressionSitesForConversion",
    "max_impression_callers_for_conversion": "maxImpressionCallersForConversion",
}


@dataclass(frozen=True)
class BrowserConfig:
    """One browser's implementation-defined values. Defaults: epsilon_site = 1 over 7-day epochs, the
    safety limits as multiples of it (global 8x, impression-site quota 4x, the ratios of the spec's
    test configuration), and the spec's minimum caps (lookback 30 days, 5 conversion sites, 10
    callers, 30 impression sites, 10 credit values, 30 match values)."""

    per_site_budget: int = MICROEPSILONS
    global_budget_per_epoch: int = 8 * MICROEPSILONS
    impression_site_quota_per_epoch: int = 4 * MICROEPSILONS
    epoch_days: int = 7
    max_lookback_days: int = 30
    max_histogram_size: int = 1 << 16
    max_credit_size: int = 10
    max_match_values: int = 30
    max_conversion_sites_per_impression: int = 5
    max_conversion_callers_per_impression: int = 10
    max_impression_sites_for_conversion: int = 30
    max_impression_callers_for_conversion: int = 10
    aggregation_services: tuple[tuple[str, str], ...] = ((DEFAULT_AGGREGATION_SERVICE, DAP_HISTOGRAM),)

    def __post_init__(self) -> None:
        for name in _E2E_NAMES:
            value = getattr(self, name)
            low = 1 if name in ("epoch_days", "max_lookback_days", "max_histogram_size") else 0
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_UNSIGNED_LONG:
                raise InvalidParameters(f"browser config: {name} must be an integer in [{low}, 2^32 - 1], got {value!r}")
        object.__setattr__(self, "aggregation_services", tuple((str(u), str(p)) for u, p in self.aggregation_services))

    @property
    def epoch_ms(self) -> int:
        return self.epoch_days * DAY_MS

    def aggregation_protocol(self, url: str) -> str | None:
        return dict(self.aggregation_services).get(url)

    def to_e2e(self) -> dict[str, Any]:
        """The spec's end-to-end ``config`` (camelCase) for these values (without the random draws)."""
        out: dict[str, Any] = {e2e: getattr(self, name) for name, e2e in _E2E_NAMES.items()}
        out["aggregationServices"] = dict(self.aggregation_services)
        return out

    @classmethod
    def from_e2e(cls, config: Mapping[str, Any]) -> tuple[BrowserConfig, float, float]:
        """``(config, epoch_start, credit_fraction)`` of an end-to-end ``config`` (complete: merge a
        case's partial config over ``CONFIG.json`` first)."""
        missing = [e2e for e2e in (*_E2E_NAMES.values(), "aggregationServices", "epochStart",
                                   "fairlyAllocateCreditFraction") if e2e not in config]
        if missing:
            raise InvalidParameters(f"browser config: missing {missing}")
        values = {name: config[e2e] for name, e2e in _E2E_NAMES.items()}
        services = tuple(dict(config["aggregationServices"]).items())
        return (cls(**values, aggregation_services=services), check_unit_draw(config["epochStart"], "epochStart"),
                check_unit_draw(config["fairlyAllocateCreditFraction"], "fairlyAllocateCreditFraction"))


def check_unit_draw(value: Any, name: str) -> float:
    """A uniform draw on [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and 0 <= value < 1):
        raise InvalidParameters(f"{name} must be a number in [0, 1), got {value!r}")
    return float(value)
