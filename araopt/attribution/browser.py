"""One browser instance of W3C Attribution Level 1 (spec sections "Save Impression Algorithm",
"Measure Conversion Algorithm", "Attribution Logic", "Privacy Budget Store", "Epoch Start Time",
"Clearing API State"; reference ``impl/src/backend.ts``).

The privacy unit is (browser instance, conversion site, epoch). Each ``measureConversion`` that
matches impressions of an epoch deducts from that epoch's per-site budget

    l1Norm * epsilon / (2 * maxValue)          one epoch in the lookback (l1Norm = the histogram's sum)
    2 * value * epsilon / (2 * maxValue)       the lookback spans several epochs

in microepsilons rounded up; an epoch whose per-site budget (or the global budget of the epoch, or
the quota of one of its matched impressions' sites) is short contributes no impressions. The
deduction for the global budget and the impression-site quotas is always the multi-epoch one.

Times are integer milliseconds since the Unix epoch (the reference's ``Temporal.Instant``s at the
millisecond). Every store is exact integer arithmetic; the deductions are computed in IEEE doubles in
the spec's order and rounded up, as the reference does.

Where araopt departs from the reference (the spec's text is followed):
* the global budget per epoch is enforced from its configured value; the reference decrements an
  epoch's global entry before it exists (``undefined - x`` is NaN), after which no comparison with it
  fails, so its global limit never refuses.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from araopt.attribution.config import (
    DAY_MS,
    HOUR_MS,
    MAX_CONVERSION_EPSILON,
    MAX_UNSIGNED_LONG,
    MICROEPSILONS,
    BrowserConfig,
    check_unit_draw,
)
from araopt.attribution.credit import fill_histogram
from araopt.attribution.errors import ApiError, ErrorName
from araopt.attribution.sites import check_site, parse_sites

DEFAULT_IMPRESSION_LIFETIME_DAYS = 30
DEFAULT_IMPRESSION_MATCH_VALUE = 0
DEFAULT_IMPRESSION_PRIORITY = 0
DEFAULT_CONVERSION_EPSILON = 1.0
DEFAULT_CONVERSION_VALUE = 1
DEFAULT_CONVERSION_MAX_VALUE = 1

_LONG_MIN, _LONG_MAX = -(2**31), 2**31 - 1


def _unsigned_long(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_UNSIGNED_LONG:
        if isinstance(value, float) and value.is_integer() and 0 <= value <= MAX_UNSIGNED_LONG:
            return int(value)
        raise ApiError(ErrorName.TYPE_ERROR, f"{name} must be an unsigned long, got {value!r}")
    return value


def _long(value: Any, name: str) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not _LONG_MIN <= value <= _LONG_MAX:
        raise ApiError(ErrorName.TYPE_ERROR, f"{name} must be a long, got {value!r}")
    return value


def _double(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ApiError(ErrorName.TYPE_ERROR, f"{name} must be a finite number, got {value!r}")
    return float(value)


@dataclass
class Impression:
    """One saved impression (spec "Impression Store"). ``conversion_sites`` and ``conversion_callers``
    shrink when a site is cleared (``clear_impressions_for_site``)."""

    impression_site: str
    intermediary_site: str | None
    timestamp: int
    lifetime_ms: int
    histogram_index: int
    match_value: int
    priority: int
    conversion_sites: set[str] = field(default_factory=set)
    conversion_callers: set[str] = field(default_factory=set)

    @property
    def caller(self) -> str:
        return self.intermediary_site if self.intermediary_site is not None else self.impression_site


@dataclass(frozen=True)
class ConversionOptions:
    """Validated ``measureConversion`` options (spec "validated conversion options")."""

    aggregation_service: str
    epsilon: float
    histogram_size: int
    lookback_ms: int
    match_values: frozenset[int]
    impression_sites: frozenset[str]
    impression_callers: frozenset[str]
    credit: tuple[float, ...]
    value: int
    max_value: int

    @classmethod
    def validate(cls, config: BrowserConfig, options: Mapping[str, Any]) -> ConversionOptions:
        """The reference's ``#validateConversionOptions`` (its order of checks, its errors) over the
        JavaScript options object (camelCase keys, the API's defaults for absent ones)."""
        service = options.get("aggregationService")
        epsilon = _double(options.get("epsilon", DEFAULT_CONVERSION_EPSILON), "epsilon")
        histogram_size = _unsigned_long(options.get("histogramSize"), "histogramSize")
        lookback_days = _unsigned_long(options.get("lookbackDays", config.max_lookback_days), "lookbackDays")
        credit = tuple(_double(c, "credit") for c in options.get("credit", (1,)))
        max_value = _unsigned_long(options.get("maxValue", DEFAULT_CONVERSION_MAX_VALUE), "maxValue")
        match_values = [_unsigned_long(m, "matchValues") for m in options.get("matchValues", ())]
        value = _unsigned_long(options.get("value", DEFAULT_CONVERSION_VALUE), "value")
        if not isinstance(service, str) or config.aggregation_protocol(service) is None:
            raise ApiError(ErrorName.REFERENCE_ERROR, f"unknown aggregation service {service!r}")
        if not 0 < epsilon <= MAX_CONVERSION_EPSILON:
            raise ApiError(ErrorName.RANGE_ERROR, f"epsilon must be in the range (0, {MAX_CONVERSION_EPSILON}]")
        if not 1 <= histogram_size <= config.max_histogram_size:
            raise ApiError(ErrorName.RANGE_ERROR, f"histogramSize must be in the range [1, {config.max_histogram_size}]")
        if value == 0:
            raise ApiError(ErrorName.RANGE_ERROR, "value must be positive")
        if value > max_value:
            raise ApiError(ErrorName.RANGE_ERROR, "value must be <= maxValue")
        if not 1 <= len(credit) <= config.max_credit_size:
            raise ApiError(ErrorName.RANGE_ERROR, f"credit size must be in the range [1, {config.max_credit_size}]")
        if any(c <= 0 for c in credit):
            raise ApiError(ErrorName.RANGE_ERROR, "credit must be positive")
        lookback_days = min(lookback_days, config.max_lookback_days)
        if lookback_days == 0:
            raise ApiError(ErrorName.RANGE_ERROR, "lookbackDays must be positive")
        if len(match_values) > config.max_match_values:
            raise ApiError(ErrorName.RANGE_ERROR,
                           f"number of values in matchValues exceeds limit of {config.max_match_values}")
        impression_sites = parse_sites(options.get("impressionSites", ()), "impressionSites",
                                       config.max_impression_sites_for_conversion)
        impression_callers = parse_sites(options.get("impressionCallers", ()), "impressionCallers",
                                         config.max_impression_callers_for_conversion)
        return cls(service, epsilon, histogram_size, lookback_days * DAY_MS, frozenset(match_values),
                   impression_sites, impression_callers, credit, value, max_value)


def deductions(epsilon: float, value: int, max_value: int, l1_norm: int) -> tuple[int, int]:
    """``(l1NormDeduction, valueDeduction)`` in microepsilons (spec "deduct privacy and safety budgets"):
    ceil(10^6 * sensitivity / (2 maxValue / epsilon)) with sensitivity ``l1_norm`` resp. 2 ``value``,
    in doubles and in the spec's order (so the rounding up agrees with the reference's)."""
    noise_scale = (2 * max_value) / epsilon
    return (math.ceil((l1_norm / noise_scale) * MICROEPSILONS),
            math.ceil(((2 * value) / noise_scale) * MICROEPSILONS))


@dataclass(frozen=True)
class Outcome:
    """What one ``measureConversion`` did besides returning ``histogram``.

    ``matched_epochs``: epochs with matching impressions, in order; ``refused_epochs``: those of them
    whose budget or safety check failed (their impressions were not used); ``deducted``:
    microepsilons taken from each accepted epoch's per-site budget."""

    histogram: tuple[int, ...]
    single_epoch: bool
    matched_epochs: tuple[int, ...] = ()
    refused_epochs: tuple[int, ...] = ()
    deducted: tuple[int, ...] = ()

    @property
    def budget_refused(self) -> bool:
        """Some matching epoch's impressions were not used for lack of budget (a report "dropped")."""
        return bool(self.refused_epochs)


class Browser:
    """One browser instance: its impression store, budget stores, epoch start and clearing state.

    ``epoch_start`` is the instance's draw on [0, 1) that fixes the hour its epochs start at (taken
    when an epoch is first needed); ``credit_random`` draws the uniforms of credit rounding. Methods
    take the current time ``now`` (ms); events must come in increasing time, as in a browser.

    ``spent`` / ``spent_global`` / ``spent_quota`` are ledgers over the instance's life (never cleared):
    the microepsilons deducted per (epoch, conversion site), per epoch, per (epoch, impression site).
    """

    def __init__(self, config: BrowserConfig, epoch_start: float, credit_random: Callable[[], float]) -> None:
        self.config = config
        self.enabled = True
        self._epoch_start_draw = check_unit_draw(epoch_start, "epoch_start")
        self._credit_random = credit_random
        self.impressions: list[Impression] = []
        self.epoch_start_time: int | None = None
        self.budget: dict[tuple[int, str], int] = {}
        self.global_budget: dict[int, int] = {}
        self.quota: dict[tuple[int, str], int] = {}
        self.last_clear: int | None = None
        self.spent: dict[tuple[int, str], int] = {}
        self.spent_global: dict[int, int] = {}
        self.spent_quota: dict[tuple[int, str], int] = {}

    # ---- epochs -------------------------------------------------------------------------
    def epoch(self, t: int) -> int:
        """"Get the current epoch" of time ``t``; the first call fixes the epoch start time: the hour
        (rounded down) of ``t - epoch_start * epoch length``."""
        period = self.config.epoch_ms
        if self.epoch_start_time is None:
            offset = math.floor(self._epoch_start_draw * (period // 1000)) * 1000
            self.epoch_start_time = ((t - offset) // HOUR_MS) * HOUR_MS
        return (t - self.epoch_start_time) // period

    def start_epoch(self, now: int) -> int:
        """"Get the starting epoch for attribution": the epoch of ``now`` - maximum lookback, or the
        one after the last browsing-history clear when that is later."""
        start = self.epoch(now - self.config.max_lookback_days * DAY_MS)
        if self.last_clear is not None:
            start = max(start, self.epoch(self.last_clear) + 1)
        return start

    # ---- the API ------------------------------------------------------------------------
    def save_impression(self, now: int, site: str, intermediary_site: str | None, options: Mapping[str, Any]) -> None:
        """``saveImpression(options)`` called on ``site`` (via ``intermediary_site``)."""
        check_site(site, "impression site")
        if intermediary_site is not None:
            check_site(intermediary_site, "intermediary site")
        histogram_index = _unsigned_long(options.get("histogramIndex"), "histogramIndex")
        match_value = _unsigned_long(options.get("matchValue", DEFAULT_IMPRESSION_MATCH_VALUE), "matchValue")
        lifetime_days = _unsigned_long(options.get("lifetimeDays", DEFAULT_IMPRESSION_LIFETIME_DAYS), "lifetimeDays")
        priority = _long(options.get("priority", DEFAULT_IMPRESSION_PRIORITY), "priority")
        if histogram_index >= self.config.max_histogram_size:
            raise ApiError(ErrorName.RANGE_ERROR,
                           f"histogramIndex must be less than maximum histogram size ({self.config.max_histogram_size})")
        if lifetime_days == 0:
            raise ApiError(ErrorName.RANGE_ERROR, "lifetimeDays must be positive")
        lifetime_days = min(lifetime_days, self.config.max_lookback_days)
        conversion_sites = parse_sites(options.get("conversionSites", ()), "conversionSites",
                                       self.config.max_conversion_sites_per_impression)
        conversion_callers = parse_sites(options.get("conversionCallers", ()), "conversionCallers",
                                         self.config.max_conversion_callers_per_impression)
        if not self.enabled:
            return
        self.impressions.append(Impression(site, intermediary_site, now, lifetime_days * DAY_MS, histogram_index,
                                           match_value, priority, set(conversion_sites), set(conversion_callers)))

    def measure_conversion(self, now: int, site: str, intermediary_site: str | None,
                           options: Mapping[str, Any] | ConversionOptions) -> Outcome:
        """``measureConversion(options)`` on top-level ``site`` (via ``intermediary_site``): the
        unencrypted histogram and what the budgets did."""
        check_site(site, "conversion site")
        if intermediary_site is not None:
            check_site(intermediary_site, "intermediary site")
        validated = options if isinstance(options, ConversionOptions) else ConversionOptions.validate(self.config, options)
        if not self.enabled:
            return Outcome((0,) * validated.histogram_size, single_epoch=False)
        return self._attribute(now, site, intermediary_site, validated)

    def _matching(self, now: int, site: str, intermediary_site: str | None, options: ConversionOptions,
                  first: int, last: int) -> dict[int, list[Impression]]:
        """"Common matching logic" for every epoch in [first, last] at once: epoch -> its matching
        impressions in store order (the conditions do not depend on the epoch but through it)."""
        caller = intermediary_site if intermediary_site is not None else site
        by_epoch: dict[int, list[Impression]] = {}
        for imp in self.impressions:
            epoch = self.epoch(imp.timestamp)
            if not first <= epoch <= last:
                continue
            if now > imp.timestamp + imp.lifetime_ms or now > imp.timestamp + options.lookback_ms:
                continue
            if imp.conversion_sites and site not in imp.conversion_sites:
                continue
            if imp.conversion_callers and caller not in imp.conversion_callers:
                continue
            if options.match_values and imp.match_value not in options.match_values:
                continue
            if options.impression_sites and imp.impression_site not in options.impression_sites:
                continue
            if options.impression_callers and imp.caller not in options.impression_callers:
                continue
            by_epoch.setdefault(epoch, []).append(imp)
        return by_epoch

    def _fill(self, impressions: Iterable[Impression], options: ConversionOptions) -> list[int]:
        return fill_histogram([(i.priority, i.timestamp, i.histogram_index) for i in impressions],
                              options.histogram_size, options.value, options.credit, self._credit_random)

    def _attribute(self, now: int, site: str, intermediary_site: str | None, options: ConversionOptions) -> Outcome:
        """"Do attribution and fill a histogram"."""
        current = self.epoch(now)
        start = self.start_epoch(now)
        single = current == self.epoch(now - options.lookback_ms)
        zero = (0,) * options.histogram_size
        l1_norm = 0
        if single:
            in_current = self._matching(now, site, intermediary_site, options, current, current).get(current, [])
            if not in_current:
                return Outcome(zero, single)
            l1_norm = sum(self._fill(in_current, options))  # the spec fills twice (two sets of draws)
        by_epoch = self._matching(now, site, intermediary_site, options, start, current)
        used: list[Impression] = []
        deducted_quotas: set[tuple[int, str]] = set()
        deducted_global: set[int] = set()
        matched, refused, taken = [], [], []
        for epoch in sorted(by_epoch):
            impressions = by_epoch[epoch]
            matched.append(epoch)
            amount = self._deduct(epoch, site, impressions, options, single, l1_norm, deducted_quotas, deducted_global)
            if amount is None:
                refused.append(epoch)
            else:
                taken.append(amount)
                used.extend(impressions)
        histogram = tuple(self._fill(used, options)) if used else zero
        return Outcome(histogram, single, tuple(matched), tuple(refused), tuple(taken))

    def _deduct(self, epoch: int, site: str, impressions: Sequence[Impression], options: ConversionOptions,
                single: bool, l1_norm: int, deducted_quotas: set[tuple[int, str]],
                deducted_global: set[int]) -> int | None:
        """"Deduct privacy and safety budgets" for (``epoch``, ``site``): the per-site deduction made,
        or None when a check failed (then nothing is deducted)."""
        l1_deduction, value_deduction = deductions(options.epsilon, options.value, options.max_value,
                                                   l1_norm if single else 2 * options.value)
        deduction = l1_deduction if single else value_deduction
        key = (epoch, site)
        cfg = self.config
        if deduction > self.budget.get(key, cfg.per_site_budget):
            return None
        if value_deduction > self.global_budget.get(epoch, cfg.global_budget_per_epoch):
            return None
        sites = {imp.impression_site for imp in impressions}
        if any(value_deduction > self.quota.get((epoch, s), cfg.impression_site_quota_per_epoch) for s in sites):
            return None
        self.budget[key] = self.budget.get(key, cfg.per_site_budget) - deduction
        self.spent[key] = self.spent.get(key, 0) + deduction
        if epoch not in deducted_global:
            deducted_global.add(epoch)
            self.global_budget[epoch] = self.global_budget.get(epoch, cfg.global_budget_per_epoch) - value_deduction
            self.spent_global[epoch] = self.spent_global.get(epoch, 0) + value_deduction
        for s in sorted(sites):
            quota_key = (epoch, s)
            if quota_key not in deducted_quotas:
                deducted_quotas.add(quota_key)
                self.quota[quota_key] = self.quota.get(quota_key, cfg.impression_site_quota_per_epoch) - value_deduction
                self.spent_quota[quota_key] = self.spent_quota.get(quota_key, 0) + value_deduction
        return deduction

    # ---- clearing and activation ----------------------------------------------------------
    def clear_impressions_for_site(self, site: str) -> None:
        """Forget ``site``'s impressions (saved on it, or by it as intermediary), and ``site`` as a
        conversion site or caller of others (an impression left with none is removed)."""
        kept = []
        for imp in self.impressions:
            if (imp.intermediary_site is None and imp.impression_site == site) or imp.intermediary_site == site:
                continue
            if site in imp.conversion_sites:
                imp.conversion_sites.discard(site)
                if not imp.conversion_sites:
                    continue
            if site in imp.conversion_callers:
                imp.conversion_callers.discard(site)
                if not imp.conversion_callers:
                    continue
            kept.append(imp)
        self.impressions = kept

    def clear_browsing_history(self, now: int, sites: Sequence[str], forget_visits: bool) -> None:
        """``clearBrowsingHistoryForAttribution``: without ``forget_visits``, zero the budgets of
        ``sites`` for every epoch still usable; with it, forget the impressions saved on ``sites`` and
        their budget and quota entries (all state when ``sites`` is empty), and start attribution
        after the current epoch."""
        parsed = parse_sites(sites, "sites", None)
        if not forget_visits:
            if not parsed:
                raise ApiError(ErrorName.TYPE_ERROR, "clearing budgets needs at least one site")
            for s in sorted(parsed):
                for epoch in range(self.start_epoch(now), self.epoch(now) + 1):
                    self.budget[(epoch, s)] = 0
            return
        if not parsed:
            self.impressions = []
            self.budget.clear()
            self.quota.clear()
            self.global_budget.clear()
        else:
            self.impressions = [i for i in self.impressions if i.impression_site not in parsed]
            self.budget = {k: v for k, v in self.budget.items() if k[1] not in parsed}
            self.quota = {k: v for k, v in self.quota.items() if k[1] not in parsed}
        self.last_clear = now

    def clear_expired_impressions(self, now: int) -> None:
        """Drop impressions whose lifetime has ended."""
        self.impressions = [i for i in self.impressions if now < i.timestamp + i.lifetime_ms]
