"""The parameters of one ARA summary-report configuration: count limit C, clip thresholds C_l and
budget fractions alpha_l (Sec. 4.1).

The parameters are those of Alg. 3 (L-infinity encoding), Alg. 6 (L1 encoding) and the paper's
baseline (Sec. 5.1: a separate count key with its own fraction alpha_0, no bottom key), validated
semantically (fractions sum to one, encoding-specific fields, integer scales of at least 1). What a
parameter *file* adds (the declared domain, a calibration, provenance) is ``araopt.version``'s.
Every refusal is an ``InvalidParameters`` naming the offending field.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, cast

from araopt.constants import CONTRIBUTION_BUDGET, COUNT_TAU, L1_ROUNDING_OF_A_FILE, MAX_CLIP_THRESHOLD
from araopt.errors import (
    InvalidParameters,
    check_contribution_budget,
    check_count_limit,
    check_epsilon,
    is_positive_finite,
)
from araopt.mechanism.exploration import Exploration
from araopt.mechanism.keys import HISTORY, KeyDomain


class Encoding(StrEnum):
    """How a conversion becomes a histogram contribution: HistogramContribution L-inf (Alg. 3), L1
    (Alg. 6), or the paper's baseline (Sec. 5.1: a separate count key, no bottom key)."""

    LINF = "linf"
    L1 = "l1"
    BASELINE = "baseline"


class L1Rounding(StrEnum):
    """Alg. 6's rounding: the paper's floor (biased) or our unbiased systematic randomized rounding."""

    FLOOR = "floor"
    RANDOMIZED = "randomized"


ENCODINGS = tuple(e.value for e in Encoding)
L1_ROUNDINGS = tuple(r.value for r in L1Rounding)
FRACTION_TOLERANCE = 1e-9


@dataclass(frozen=True)
class QueryParams:
    """One value query q_l: its column, clip threshold C_l, budget fraction alpha_l and tau_l."""

    column: str
    clip_threshold: float
    budget_fraction: float | None = None
    tau: float | None = None

    def __post_init__(self) -> None:
        where = f"queries[{self.column!r}]"
        if not isinstance(self.column, str) or not self.column:
            raise InvalidParameters(f"queries: column must be a non-empty string, got {self.column!r}")
        if not is_positive_finite(self.clip_threshold) or self.clip_threshold > MAX_CLIP_THRESHOLD:
            raise InvalidParameters(f"{where}.clip_threshold must be a finite number in (0, {MAX_CLIP_THRESHOLD:g}], "
                                    f"got {self.clip_threshold!r}")
        if self.budget_fraction is not None and not (
            is_positive_finite(self.budget_fraction) and self.budget_fraction <= 1.0
        ):
            raise InvalidParameters(f"{where}.budget_fraction must lie in (0, 1], got {self.budget_fraction!r}")
        if self.tau is not None and not is_positive_finite(self.tau):
            raise InvalidParameters(f"{where}.tau must be a finite number > 0, got {self.tau!r}")

    @property
    def name(self) -> str:
        return self.column


@dataclass(frozen=True)
class Params:
    """All parameters of one ARA summary-report configuration (Sec. 4.1, Alg. 3/6, baseline).

    ``queries`` are the value queries q_1..q_d in key order; the count q_0 is implicit.
    ``budget_fraction`` of each query is alpha_l (L-inf and baseline; must sum to one together with
    ``count_budget_fraction`` for the baseline); the L1 encoding (Alg. 6) uses no fractions.
    ``conversion_slice_columns`` are the slice columns known only at conversion time (carried by the
    trigger key piece); the others are impression features (carried by the source key piece).
    ``l1_rounding`` defaults to the paper's floor: what an L1 parameter file that names none means.
    """

    count_limit: int
    encoding: str
    epsilon: float
    slice_columns: tuple[str, ...]
    queries: tuple[QueryParams, ...]
    contribution_budget: int = CONTRIBUTION_BUDGET
    count_budget_fraction: float | None = None
    count_tau: float = COUNT_TAU
    l1_rounding: str = L1_ROUNDING_OF_A_FILE
    conversion_slice_columns: tuple[str, ...] = ()
    exploration: Exploration | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "slice_columns", tuple(self.slice_columns))
        object.__setattr__(self, "queries", tuple(self.queries))
        object.__setattr__(self, "conversion_slice_columns", tuple(self.conversion_slice_columns))
        object.__setattr__(self, "contribution_budget",
                           check_contribution_budget(self.contribution_budget, high=CONTRIBUTION_BUDGET))
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))
        object.__setattr__(self, "count_limit", check_count_limit(self.count_limit, self.contribution_budget))
        if self.encoding not in ENCODINGS:
            raise InvalidParameters(f"encoding must be one of {ENCODINGS}, got {self.encoding!r}")
        if self.l1_rounding not in L1_ROUNDINGS:
            raise InvalidParameters(f"l1_rounding must be one of {L1_ROUNDINGS}, got {self.l1_rounding!r}")
        object.__setattr__(self, "encoding", str(Encoding(self.encoding)))
        object.__setattr__(self, "l1_rounding", str(L1Rounding(self.l1_rounding)))
        if not is_positive_finite(self.count_tau):
            raise InvalidParameters(f"count_tau must be a finite number > 0, got {self.count_tau!r}")
        if not self.queries:
            raise InvalidParameters("queries must list at least one value query")
        if not all(isinstance(q, QueryParams) for q in self.queries):
            raise InvalidParameters("queries must be QueryParams instances")
        names = [q.column for q in self.queries]
        if len(set(names)) != len(names):
            raise InvalidParameters(f"queries: duplicate column in {names}")
        if any(not isinstance(c, str) or not c for c in self.slice_columns):
            raise InvalidParameters(f"slice_columns must be non-empty strings, got {self.slice_columns!r}")
        if len(set(self.slice_columns)) != len(self.slice_columns):
            raise InvalidParameters(f"slice_columns has duplicates: {self.slice_columns!r}")
        overlap = set(self.slice_columns) & set(names)
        if overlap:
            raise InvalidParameters(f"slice_columns and queries share columns {sorted(overlap)}")
        unknown = set(self.conversion_slice_columns) - set(self.slice_columns)
        if unknown:
            raise InvalidParameters(f"conversion_slice_columns {sorted(unknown)} are not in slice_columns")
        self._check_fractions()
        self._check_scales()
        if self.exploration is not None:
            self._check_exploration(self.exploration)

    def _check_exploration(self, exploration: Exploration) -> None:
        """Arms re-use the encoding at other count limits (L-inf, L1): each must be valid parameters."""
        if not isinstance(exploration, Exploration):
            raise InvalidParameters(f"exploration must be an Exploration, got {type(exploration).__name__}")
        if self.encoding == Encoding.BASELINE:
            raise InvalidParameters("exploration arms need encoding 'linf' or 'l1' (every conversion of an arm costs "
                                    "floor(Gamma / C_a)); the baseline's norms vary")
        for index, arm in enumerate(exploration.arms):
            try:
                self.for_arm(index)
            except InvalidParameters as exc:
                raise InvalidParameters(f"exploration arm {index} (C = {arm.count_limit}): {exc}") from None

    def check_domain(self, domain: KeyDomain, source: str = "domain") -> None:
        """Refuse a key domain that is not laid out for these slices, queries and encoding."""
        if not isinstance(domain, KeyDomain):
            raise InvalidParameters(f"{source} must be a KeyDomain, got {type(domain).__name__}")
        mine = (self.slice_columns, self.query_columns, self.encoding == Encoding.BASELINE, self.conversion_slice_columns)
        theirs = (domain.slice_columns, domain.query_names, domain.baseline, domain.conversion_slice_columns)
        if mine != theirs:
            raise InvalidParameters(f"{source} is for slices {domain.slice_columns} / queries {domain.query_names} / "
                             f"baseline {domain.baseline}, the parameters use {self.slice_columns} / "
                             f"{self.query_columns} / baseline {mine[2]}")

    def history_domain(self, slice_values: Mapping[str, Any]) -> KeyDomain:
        """The key domain of the training history's slices (``slice_values``: column -> values), laid out
        for these parameters (origin ``history``)."""
        return KeyDomain.from_slice_values(self.slice_columns, slice_values, self.query_columns,
                                           self.encoding == Encoding.BASELINE, self.conversion_slice_columns, HISTORY)

    def _check_fractions(self) -> None:
        fractions = [q.budget_fraction for q in self.queries]
        if self.encoding == Encoding.L1:
            if any(f is not None for f in fractions) or self.count_budget_fraction is not None:
                raise InvalidParameters("budget_fraction must be absent (null) for encoding 'l1': Alg. 6 uses no fractions")
            return
        missing = [q.column for q in self.queries if q.budget_fraction is None]
        if missing:
            raise InvalidParameters(f"queries{missing}.budget_fraction is required for encoding {self.encoding!r}")
        total = float(sum(f for f in fractions if f is not None))  # (none is None: checked above)
        if self.encoding == Encoding.BASELINE:
            if self.count_budget_fraction is None:
                raise InvalidParameters("count_budget_fraction is required for encoding 'baseline'")
            total += float(self.count_budget_fraction)
            what = "count_budget_fraction + queries[].budget_fraction"
        else:
            if self.count_budget_fraction is not None:
                raise InvalidParameters("count_budget_fraction is only used by encoding 'baseline'")
            what = "queries[].budget_fraction"
        if abs(total - 1.0) > FRACTION_TOLERANCE:
            raise InvalidParameters(f"{what} must sum to 1 (within {FRACTION_TOLERANCE:g}), got {total!r}")

    def _check_scales(self) -> None:
        """Refuse a budget fraction whose integer scale floor(alpha Gamma / C) is 0 (Alg. 3, baseline):
        its key would always hold 0 and Alg. 4 would divide by 0 (the L1 scale floor(Gamma / C) is >= 1)."""
        if self.encoding == Encoding.L1:
            return
        fractions = [(f"queries[{q.column!r}].budget_fraction", float(cast(float, q.budget_fraction)))
                     for q in self.queries]
        if self.encoding == Encoding.BASELINE:
            fractions.append(("count_budget_fraction", float(cast(float, self.count_budget_fraction))))
        gamma, c = self.contribution_budget, self.count_limit
        for what, alpha in fractions:
            if math.floor(alpha * gamma / c) < 1:  # as encoding.query_scale
                raise InvalidParameters(
                    f"{what} = {alpha!r} gives the scale floor(alpha x Gamma / C) = floor({alpha!r} x {gamma} / {c}) = 0: "
                    f"the key would always hold 0 and its estimate would divide by 0; use a fraction of at least "
                    f"C / Gamma = {c / gamma!r} (or a smaller count_limit)")

    # ---- derived quantities -------------------------------------------------------------
    @property
    def query_columns(self) -> tuple[str, ...]:
        return tuple(q.column for q in self.queries)

    @property
    def num_queries(self) -> int:
        return len(self.queries)

    @property
    def impression_slice_columns(self) -> tuple[str, ...]:
        """Slice columns that are impression features (one value per impression), in slice order."""
        return tuple(c for c in self.slice_columns if c not in self.conversion_slice_columns)

    @property
    def budget_fractions(self) -> tuple[float, ...]:
        """alpha_1..alpha_d (1.0 for L1, whose encoder uses no fractions: Alg. 6)."""
        return tuple(1.0 if q.budget_fraction is None else float(q.budget_fraction) for q in self.queries)

    @property
    def count_fraction(self) -> float:
        """alpha_0 of the baseline's separate count key."""
        if self.count_budget_fraction is None:
            raise InvalidParameters(f"encoding {self.encoding!r} has no count budget fraction (baseline only)")
        return float(self.count_budget_fraction)

    @property
    def per_conversion_budget(self) -> int:
        """floor(Gamma / C): the L1 norm every L-inf / L1 contribution uses (Lemma 4.1)."""
        return self.contribution_budget // self.count_limit

    def with_epsilon(self, epsilon: float) -> Params:
        return dataclasses.replace(self, epsilon=epsilon)

    def with_exploration(self, exploration: Exploration | None) -> Params:
        """These parameters with ``exploration``'s arms (None: none). An arm encodes with these budget
        fractions at its own count limit C_a (``for_arm``), so an L-inf query's scale floor(alpha Gamma /
        C_a) must be >= 1 at the largest arm too (Alg. 3): a fraction below max C_a / Gamma (ParameterOptimization,
        Alg. 5, may leave a query one unit C / Gamma at a smaller main C) is raised to it, the raise taken
        from the largest fraction. The fractions still sum to 1; a raised query's main scale is never lower."""
        if exploration is None or self.encoding != Encoding.LINF or not exploration.arms:
            return dataclasses.replace(self, exploration=exploration)
        gamma = self.contribution_budget
        widest = max(arm.count_limit for arm in exploration.arms)
        floor = widest / gamma
        while math.floor(floor * gamma / widest) < 1:  # as _check_scales, whatever the float rounding
            floor = math.nextafter(floor, 1.0)
        alpha = [float(cast(float, q.budget_fraction)) for q in self.queries]
        raised = sum(floor - a for a in alpha if a < floor)
        if raised > 0:
            largest = max(range(len(alpha)), key=lambda i: alpha[i])
            alpha = [max(a, floor) for a in alpha]
            alpha[largest] -= raised
        queries = tuple(dataclasses.replace(q, budget_fraction=a) for q, a in zip(self.queries, alpha, strict=True))
        return dataclasses.replace(self, queries=queries, exploration=exploration)

    def for_arm(self, arm: int) -> Params:
        """The parameters exploration arm ``arm`` encodes with: these at the arm's count limit."""
        if self.exploration is None:
            raise InvalidParameters("these parameters have no exploration arms")
        return dataclasses.replace(self, count_limit=self.exploration.arms[arm].count_limit, exploration=None)
