"""The parameters of one Attribution Level 1 configuration: what the conversion site passes to
``measureConversion``, one call per query, and the layout of the histograms.

The paper's terms (Sec. 4.1) carry over:

* the count limit C becomes how many full reports fit in the per-site epoch budget:
  C = floor(epsilon_site / sum_q deduction_q(maxValue_q)) (:meth:`AttributionParams.count_limit`),
  each report deducting ``value * epsilon / (2 maxValue)`` in one epoch, twice that across epochs;
* the clip threshold C_l becomes ``maxValue`` in integer units with a value scale
  s_l = maxValue_l / C_l: a value v is sent as RR(s_l min(v, C_l)) (randomized rounding, eq. 2);
* the budget fractions alpha_l become the split of the per-site budget between the queries'
  ``epsilon`` (:meth:`AttributionParams.from_paper`);
* Alg. 4 divides a query's aggregated histogram by s_l;
* keys become histogram indices: the impression's ``histogramIndex`` is its impression-side slice
  (chosen when the ad is shown); conversion-side slices cannot choose an index, so they choose the
  aggregation task instead: a report goes to the histogram of its (query, conversion-side slice), at no
  extra budget (one call per query either way).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from araopt.attribution.browser import DEFAULT_CONVERSION_EPSILON, deductions
from araopt.attribution.config import MAX_CONVERSION_EPSILON, MAX_UNSIGNED_LONG, MICROEPSILONS
from araopt.constants import CONTRIBUTION_BUDGET, MAX_CLIP_THRESHOLD, MIN_ATTRIBUTION_CLIP, MIN_EPSILON
from araopt.errors import InvalidParameters, is_positive_finite
from araopt.mechanism.keys import KeyDomain
from araopt.mechanism.params import Encoding, Params, QueryParams

COUNT = "count"
"""The name of the count query (value 1, maxValue 1: the spec's default call)."""


@dataclass(frozen=True)
class AttributionQuery:
    """One ``measureConversion`` per conversion: ``column`` (None: the count query), its ``epsilon``,
    ``max_value`` (integer maxValue) and ``clip`` (C_l, in the column's unit)."""

    name: str
    column: str | None
    epsilon: float = DEFAULT_CONVERSION_EPSILON
    max_value: int = 1
    clip: float = 1.0

    def __post_init__(self) -> None:
        where = f"queries[{self.name!r}]"
        if not isinstance(self.name, str) or not self.name:
            raise InvalidParameters(f"queries: name must be a non-empty string, got {self.name!r}")
        if not is_positive_finite(self.epsilon) or not MIN_EPSILON <= self.epsilon <= MAX_CONVERSION_EPSILON:
            raise InvalidParameters(f"{where}.epsilon must lie in [2^-20, {MAX_CONVERSION_EPSILON}] (ARA's floor: "
                                    f"constants.MIN_EPSILON), got {self.epsilon!r}")
        if isinstance(self.max_value, bool) or not isinstance(self.max_value, int) or not (
                1 <= self.max_value <= MAX_UNSIGNED_LONG):
            raise InvalidParameters(f"{where}.max_value must be an integer in [1, 2^32 - 1], got {self.max_value!r}")
        if not is_positive_finite(self.clip) or not MIN_ATTRIBUTION_CLIP <= self.clip <= MAX_CLIP_THRESHOLD:
            raise InvalidParameters(f"{where}.clip must be a finite number in [{MIN_ATTRIBUTION_CLIP:g}, "
                                    f"{MAX_CLIP_THRESHOLD:g}], got {self.clip!r}")
        if self.column is None and (self.max_value, self.clip) != (1, 1.0):
            raise InvalidParameters(f"{where}: the count query (no column) sends value 1 with maxValue 1")

    @property
    def value_scale(self) -> float:
        """s_l = maxValue / C_l: integer units per unit of the column (Alg. 4 divides by it)."""
        return self.max_value / self.clip

    def deduction(self, value: int, multi_epoch: bool) -> int:
        """Microepsilons one report of integer ``value`` deducts from each epoch it uses (the browser's
        arithmetic: ``araopt.attribution.browser.deductions``)."""
        l1, both = deductions(self.epsilon, value, self.max_value, value)
        return both if multi_epoch else l1

    @property
    def noise_scale(self) -> float:
        """b = 2 maxValue / epsilon: the Laplace scale the deduction assumes the aggregation adds (per
        histogram entry, in integer units)."""
        return 2 * self.max_value / self.epsilon


@dataclass(frozen=True)
class AttributionParams:
    """All parameters of one Attribution Level 1 configuration.

    ``per_site_budget`` is epsilon_site (per conversion site and epoch of a browser); ``epoch_days``
    the browsers' epoch; ``lookback_days`` every call's ``lookbackDays``; ``credit`` every call's
    ``credit`` (``(1,)``: last touch); ``slice_columns`` the impression-side slices (the histogram
    index); ``conversion_slice_columns`` the conversion-side slices (the aggregation task)."""

    per_site_budget: float
    queries: tuple[AttributionQuery, ...]
    slice_columns: tuple[str, ...]
    conversion_slice_columns: tuple[str, ...] = ()
    epoch_days: int = 7
    lookback_days: int = 30
    credit: tuple[float, ...] = (1.0,)

    def __post_init__(self) -> None:
        object.__setattr__(self, "queries", tuple(self.queries))
        object.__setattr__(self, "slice_columns", tuple(self.slice_columns))
        object.__setattr__(self, "conversion_slice_columns", tuple(self.conversion_slice_columns))
        object.__setattr__(self, "credit", tuple(float(c) for c in self.credit))
        if not is_positive_finite(self.per_site_budget) or self.per_site_budget > MAX_CONVERSION_EPSILON:
            raise InvalidParameters(
                f"per_site_budget must lie in (0, {MAX_CONVERSION_EPSILON}], got {self.per_site_budget!r}")
        if not self.queries or not all(isinstance(q, AttributionQuery) for q in self.queries):
            raise InvalidParameters("queries must list at least one AttributionQuery")
        names = [q.name for q in self.queries]
        if len(set(names)) != len(names):
            raise InvalidParameters(f"queries: duplicate name in {names}")
        for what, value in (("epoch_days", self.epoch_days), ("lookback_days", self.lookback_days)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_UNSIGNED_LONG:
                raise InvalidParameters(f"{what} must be an integer in [1, 2^32 - 1] (the browser's), got {value!r}")
        if not self.credit or not all(is_positive_finite(c) for c in self.credit):
            raise InvalidParameters(f"credit must be a non-empty list of positive numbers, got {self.credit!r}")
        overlap = set(self.slice_columns) & set(self.conversion_slice_columns)
        if overlap:
            raise InvalidParameters(f"slice_columns and conversion_slice_columns share {sorted(overlap)}")
        if self.count_limit(multi_epoch=True) < 1:
            raise InvalidParameters(
                f"one report of every query at maxValue deducts {self.full_report_deduction(True)} microepsilons "
                f"across epochs, more than the per-site budget of {self.budget_micro}: no report would be accepted")

    @property
    def budget_micro(self) -> int:
        """epsilon_site in microepsilons (rounded down: the browser's store is an integer)."""
        return math.floor(self.per_site_budget * MICROEPSILONS)

    @property
    def query_names(self) -> tuple[str, ...]:
        return tuple(q.name for q in self.queries)

    @property
    def value_columns(self) -> tuple[str, ...]:
        return tuple(q.column for q in self.queries if q.column is not None)

    def full_report_deduction(self, multi_epoch: bool) -> int:
        """Microepsilons one conversion deducts per epoch when every query sends its maxValue."""
        return sum(q.deduction(q.max_value, multi_epoch) for q in self.queries)

    def count_limit(self, multi_epoch: bool) -> int:
        """The paper's C: full conversions (every query at maxValue) that fit in one site-epoch budget."""
        return self.budget_micro // self.full_report_deduction(multi_epoch)

    def check_domain(self, domain: KeyDomain, source: str = "domain") -> None:
        """Refuse a domain that is not this configuration's histogram layout (impression-side slices,
        the queries' names, no baseline count key)."""
        if not isinstance(domain, KeyDomain):
            raise InvalidParameters(f"{source} must be a KeyDomain, got {type(domain).__name__}")
        mine = (self.slice_columns, self.query_names, False, ())
        theirs = (domain.slice_columns, domain.query_names, domain.baseline, domain.conversion_slice_columns)
        if mine != theirs:
            raise InvalidParameters(f"{source} is for slices {domain.slice_columns} / queries {domain.query_names}, "
                                    f"the histogram layout uses {self.slice_columns} / {self.query_names}")

    def paper_params(self) -> Params:
        """The paper's view of this configuration (Sec. 4.1) as ARA ``Params``: C = the full reports that
        fit a site-epoch across epochs (at most Gamma), the value queries' clip thresholds C_l, the
        impression- and conversion-side slices; L1 encoding (no fractions: the split of the budget is
        in the queries' ``epsilon``). What a parameter version keeps beside the Attribution parameters (the
        nightly guardrails compare C and C_l; the retention calibration checks the full parameters). Needs
        at least one value query, each on its own column."""
        values = [q for q in self.queries if q.column is not None]
        if not values:
            raise InvalidParameters("a parameter version for the attribution API needs at least one value query "
                                    "(count-only configurations are plain parameter files)")
        columns = [q.column for q in values]
        if len(set(columns)) != len(columns):
            raise InvalidParameters(f"queries: a parameter version needs one query per value column, got {columns}")
        return Params(count_limit=min(self.count_limit(multi_epoch=True), CONTRIBUTION_BUDGET), encoding=Encoding.L1,
                      epsilon=self.per_site_budget,
                      slice_columns=self.slice_columns + self.conversion_slice_columns,
                      queries=tuple(QueryParams(str(q.column), q.clip) for q in values),
                      conversion_slice_columns=self.conversion_slice_columns)

    def to_json(self) -> dict[str, Any]:
        """This configuration as a parameter file's JSON object (:func:`params_to_json`)."""
        return params_to_json(self)

    @classmethod
    def from_json(cls, doc: Any) -> AttributionParams:
        """Parameters from a parameter file's JSON object, validated (:func:`params_from_json`)."""
        return params_from_json(doc)

    @classmethod
    def from_paper(cls, per_site_budget: float, count_limit: int, fractions: dict[str, float],
                   queries: tuple[AttributionQuery, ...], slice_columns: tuple[str, ...],
                   multi_epoch: bool = True, conversion_slice_columns: tuple[str, ...] = (), epoch_days: int = 7,
                   lookback_days: int = 30, credit: tuple[float, ...] = (1.0,)) -> AttributionParams:
        """The parameters of the paper's (C, alpha_l, C_l): each query's ``epsilon`` is its share alpha_l of
        the per-site budget spread over C full reports (across epochs when ``multi_epoch``, the worst
        case), lowered by microepsilons until C full reports fit the browser's rounded-up deductions.
        ``queries`` give the names, columns, max_values and clips (their ``epsilon`` is replaced)."""
        if isinstance(count_limit, bool) or not isinstance(count_limit, int) or count_limit < 1:
            raise InvalidParameters(f"count_limit must be a positive integer, got {count_limit!r}")
        if set(fractions) != {q.name for q in queries}:
            raise InvalidParameters(f"fractions must name every query: {sorted(fractions)} vs {[q.name for q in queries]}")
        if abs(sum(fractions.values()) - 1.0) > 1e-9 or not all(is_positive_finite(f) for f in fractions.values()):
            raise InvalidParameters(f"fractions must be positive and sum to 1, got {fractions!r}")
        per_report = per_site_budget / count_limit * (1 if multi_epoch else 2)  # a report at maxValue costs eps (eps/2)
        chosen = []
        for q in queries:
            micro = math.floor(fractions[q.name] * per_report * MICROEPSILONS)
            while micro > 0:
                candidate = AttributionQuery(q.name, q.column, micro / MICROEPSILONS, q.max_value, q.clip)
                share = math.floor(fractions[q.name] * per_site_budget * MICROEPSILONS)
                if candidate.deduction(q.max_value, multi_epoch) * count_limit <= share:
                    break
                micro -= 1
            if micro <= 0:
                raise InvalidParameters(f"query {q.name!r}: its share of the budget is below one microepsilon per report")
            chosen.append(candidate)
        return cls(per_site_budget, tuple(chosen), slice_columns, conversion_slice_columns, epoch_days, lookback_days,
                   credit)


PARAMS_FORMAT = "araopt-attribution-params/1"
"""The ``format`` of an Attribution parameter file (a format of its own, not ARA's ParameterVersion)."""

_QUERY_FIELDS = ("name", "column", "epsilon", "max_value", "clip")
_PARAMS_FIELDS = ("format", "per_site_budget", "queries", "slice_columns", "conversion_slice_columns", "epoch_days",
                  "lookback_days", "credit")


def _fields(doc: Any, allowed: tuple[str, ...], required: tuple[str, ...], where: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise InvalidParameters(f"{where} must be a JSON object, got {type(doc).__name__}")
    unknown = sorted(set(doc) - set(allowed))
    if unknown:
        raise InvalidParameters(f"{where}: unknown field {unknown[0]!r} (fields: {', '.join(allowed)})")
    missing = [f for f in required if f not in doc]
    if missing:
        raise InvalidParameters(f"{where}: missing field {missing[0]!r}")
    return doc


def _names(value: Any, field: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise InvalidParameters(f"{field} must be a list of column names, got {value!r}")
    return tuple(value)


def params_to_json(params: AttributionParams) -> dict[str, Any]:
    """The parameter file's JSON object (:func:`params_from_json` reads it back to equal parameters)."""
    return {"format": PARAMS_FORMAT, "per_site_budget": params.per_site_budget,
            "queries": [{"name": q.name, "column": q.column, "epsilon": q.epsilon, "max_value": q.max_value,
                         "clip": q.clip} for q in params.queries],
            "slice_columns": list(params.slice_columns),
            "conversion_slice_columns": list(params.conversion_slice_columns),
            "epoch_days": params.epoch_days, "lookback_days": params.lookback_days, "credit": list(params.credit)}


def params_from_json(doc: Any) -> AttributionParams:
    """Validated parameters from a parameter file's JSON object; every refusal is one line naming the
    field (unknown and missing fields included)."""
    doc = _fields(doc, _PARAMS_FIELDS, ("format", "per_site_budget", "queries", "slice_columns"), "params")
    if doc["format"] != PARAMS_FORMAT:
        raise InvalidParameters(f"format must be {PARAMS_FORMAT!r} (an Attribution parameter file), got "
                                f"{doc['format']!r}")
    if not isinstance(doc["queries"], list) or not doc["queries"]:
        raise InvalidParameters(f"queries must be a non-empty list, got {doc['queries']!r}")
    queries = []
    for i, q in enumerate(doc["queries"]):
        q = _fields(q, _QUERY_FIELDS, ("name", "column"), f"queries[{i}]")
        if q["column"] is not None and (not isinstance(q["column"], str) or not q["column"]):
            raise InvalidParameters(f"queries[{i}].column must be a column name or null, got {q['column']!r}")
        queries.append(AttributionQuery(**q))
    credit = doc.get("credit", [1.0])
    if not isinstance(credit, list) or not all(is_positive_finite(c) for c in credit):
        raise InvalidParameters(f"credit must be a list of positive numbers, got {credit!r}")
    return AttributionParams(
        per_site_budget=doc["per_site_budget"], queries=tuple(queries),
        slice_columns=_names(doc["slice_columns"], "slice_columns"),
        conversion_slice_columns=_names(doc.get("conversion_slice_columns", []), "conversion_slice_columns"),
        epoch_days=doc.get("epoch_days", 7), lookback_days=doc.get("lookback_days", 30), credit=tuple(credit))
