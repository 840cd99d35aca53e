"""Parameter file of the ARA encoding: count limit C, clip thresholds C_l, budget fractions alpha_l.

The parameters are those of Alg. 3 (L-infinity encoding), Alg. 6 (L1 encoding) and the paper's
baseline (Sec. 5.1: a separate count key with its own fraction alpha_0, no bottom key). A parameter
file is JSON, validated against ``schemas/params.schema.json`` and then semantically (fractions sum
to one, encoding-specific fields). Every refusal is a ``ValueError`` naming the offending field.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from importlib import resources
from typing import Any, cast

import jsonschema

from . import jsonio
from .files import atomic_write_bytes, read_bytes
from .keys import HISTORY, KeyDomain

CONTRIBUTION_BUDGET = 65536
"""Gamma: the ARA L1 contribution budget per source (impression)."""

FORMAT_VERSION = "1.0"
SUPPORTED_MAJOR_VERSION = 1
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
CORRECTIONS = ("ratio", "none")
"""How estimates use a calibration: ``ratio`` divides by the retention ratio; ``none`` keeps the capped estimate."""
MIN_EPSILON = 2.0**-20
"""Floor of epsilon (~9.5e-7): below it the noise sd exceeds 9e10 per key and the exact sampler's
rate eps / Gamma would keep fewer than 16 bits (``noise.py``). Google's DP library floors at 2^-50."""
MAX_EPSILON = 64.0
"""Ceiling of epsilon: the Aggregation Service accepts eps in (0, 64]."""
FRACTION_TOLERANCE = 1e-9
DEFAULT_COUNT_TAU = 5.0


def check_epsilon(epsilon: float | str, name: str = "epsilon") -> float:
    """Return epsilon as float if it lies in [2^-20, 64] (floor: MIN_EPSILON; ceiling: the Aggregation Service's)."""
    if isinstance(epsilon, bool):
        raise ValueError(f"{name} must be a number, got {epsilon!r}")
    try:
        value = float(epsilon)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name} must be a number, got {epsilon!r}") from None
    if not (math.isfinite(value) and MIN_EPSILON <= value <= MAX_EPSILON):
        raise ValueError(f"{name} must lie in [2^-20 (~9.54e-07), {MAX_EPSILON:g}], got {epsilon!r}")
    return value


def check_count_limit(count_limit: int, contribution_budget: int = CONTRIBUTION_BUDGET) -> int:
    """Return the count limit C if it is an integer in [1, Gamma]."""
    if isinstance(count_limit, bool) or not isinstance(count_limit, (int,)) and not (
        isinstance(count_limit, float) and count_limit.is_integer()
    ):
        raise ValueError(f"count_limit must be an integer, got {count_limit!r}")
    value = int(count_limit)
    if not 1 <= value <= contribution_budget:
        raise ValueError(f"count_limit must lie in [1, {contribution_budget}], got {count_limit!r}")
    return value


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
            raise ValueError(f"queries: column must be a non-empty string, got {self.column!r}")
        if not _is_positive_finite(self.clip_threshold):
            raise ValueError(f"{where}.clip_threshold must be a finite number > 0, got {self.clip_threshold!r}")
        if self.budget_fraction is not None and not (
            _is_positive_finite(self.budget_fraction) and self.budget_fraction <= 1.0
        ):
            raise ValueError(f"{where}.budget_fraction must lie in (0, 1], got {self.budget_fraction!r}")
        if self.tau is not None and not _is_positive_finite(self.tau):
            raise ValueError(f"{where}.tau must be a finite number > 0, got {self.tau!r}")

    @property
    def name(self) -> str:
        return self.column


@dataclass(frozen=True)
class Provenance:
    """Where a parameter file came from and what error it is predicted to have."""

    training_start: str | None = None
    training_end: str | None = None
    rows: int | None = None
    created_at: str | None = None
    predicted_rmsre_tau: float | None = None
    baseline_rmsre_tau: float | None = None
    objective: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "training_window": {"start": self.training_start, "end": self.training_end},
            "rows": self.rows,
            "created_at": self.created_at,
            "predicted_rmsre_tau": self.predicted_rmsre_tau,
            "baseline_rmsre_tau": self.baseline_rmsre_tau,
            "objective": self.objective,
        }
        out.update(dict(self.extra))
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Provenance:
        data = dict(data)
        window = data.pop("training_window", None) or {}
        known = {k: data.pop(k, None)
                 for k in ("rows", "created_at", "predicted_rmsre_tau", "baseline_rmsre_tau", "objective")}
        return cls(training_start=window.get("start"), training_end=window.get("end"), extra=data, **known)


@dataclass(frozen=True)
class Params:
    """All parameters of one ARA summary-report configuration (Sec. 4.1, Alg. 3/6, baseline).

    ``queries`` are the value queries q_1..q_d in key order; the count q_0 is implicit.
    ``budget_fraction`` of each query is alpha_l (L-inf and baseline; must sum to one together with
    ``count_budget_fraction`` for the baseline); the L1 encoding (Alg. 6) uses no fractions.
    ``conversion_slice_columns`` are the slice columns known only at conversion time (carried by the
    trigger key piece); the others are impression features (carried by the source key piece).
    ``domain`` is the declared key domain of releases made with these parameters (the slices of the
    training history, carried by the published version), or None.
    ``calibration`` (``araopt.calibration.Calibration``, fitted on the history for exactly this
    bounding) turns estimates of the capped-and-clipped sums into estimates of the true totals;
    ``correction`` says how the point estimate uses it: ``ratio`` (U / r_hat) or ``none`` (the
    capped estimate, when the history shows that dividing adds more noise than it removes bias);
    the intervals are for the true totals either way.
    """

    count_limit: int
    encoding: str
    epsilon: float
    slice_columns: tuple[str, ...]
    queries: tuple[QueryParams, ...]
    contribution_budget: int = CONTRIBUTION_BUDGET
    count_budget_fraction: float | None = None
    count_tau: float = DEFAULT_COUNT_TAU
    l1_rounding: str = "floor"
    conversion_slice_columns: tuple[str, ...] = ()
    provenance: Provenance | None = None
    format_version: str = FORMAT_VERSION
    domain: KeyDomain | None = None
    calibration: Any = None
    correction: str = "ratio"

    def __post_init__(self) -> None:
        object.__setattr__(self, "slice_columns", tuple(self.slice_columns))
        object.__setattr__(self, "queries", tuple(self.queries))
        object.__setattr__(self, "conversion_slice_columns", tuple(self.conversion_slice_columns))
        _check_version(self.format_version)
        if isinstance(self.contribution_budget, bool) or not isinstance(self.contribution_budget, int) or not (
            1 <= self.contribution_budget <= CONTRIBUTION_BUDGET
        ):
            raise ValueError(f"contribution_budget must be an integer in [1, {CONTRIBUTION_BUDGET}], "
                             f"got {self.contribution_budget!r}")
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))
        object.__setattr__(self, "count_limit", check_count_limit(self.count_limit, self.contribution_budget))
        if self.encoding not in ENCODINGS:
            raise ValueError(f"encoding must be one of {ENCODINGS}, got {self.encoding!r}")
        if self.l1_rounding not in L1_ROUNDINGS:
            raise ValueError(f"l1_rounding must be one of {L1_ROUNDINGS}, got {self.l1_rounding!r}")
        object.__setattr__(self, "encoding", str(Encoding(self.encoding)))
        object.__setattr__(self, "l1_rounding", str(L1Rounding(self.l1_rounding)))
        if not _is_positive_finite(self.count_tau):
            raise ValueError(f"count_tau must be a finite number > 0, got {self.count_tau!r}")
        if not self.queries:
            raise ValueError("queries must list at least one value query")
        if not all(isinstance(q, QueryParams) for q in self.queries):
            raise ValueError("queries must be QueryParams instances")
        names = [q.column for q in self.queries]
        if len(set(names)) != len(names):
            raise ValueError(f"queries: duplicate column in {names}")
        if any(not isinstance(c, str) or not c for c in self.slice_columns):
            raise ValueError(f"slice_columns must be non-empty strings, got {self.slice_columns!r}")
        if len(set(self.slice_columns)) != len(self.slice_columns):
            raise ValueError(f"slice_columns has duplicates: {self.slice_columns!r}")
        overlap = set(self.slice_columns) & set(names)
        if overlap:
            raise ValueError(f"slice_columns and queries share columns {sorted(overlap)}")
        unknown = set(self.conversion_slice_columns) - set(self.slice_columns)
        if unknown:
            raise ValueError(f"conversion_slice_columns {sorted(unknown)} are not in slice_columns")
        self._check_fractions()
        self._check_scales()
        if self.domain is not None:
            self.check_domain(self.domain)
        if self.correction not in CORRECTIONS:
            raise ValueError(f"correction must be one of {CORRECTIONS}, got {self.correction!r}")
        if self.calibration is not None:
            from .calibration import Calibration

            if not isinstance(self.calibration, Calibration):
                raise ValueError(f"calibration must be a Calibration, got {type(self.calibration).__name__}")
            self.calibration.check_params(self)

    def check_domain(self, domain: KeyDomain, source: str = "domain") -> None:
        """Refuse a key domain that is not laid out for these slices, queries and encoding."""
        if not isinstance(domain, KeyDomain):
            raise ValueError(f"{source} must be a KeyDomain, got {type(domain).__name__}")
        mine = (self.slice_columns, self.query_columns, self.encoding == "baseline", self.conversion_slice_columns)
        theirs = (domain.slice_columns, domain.query_names, domain.baseline, domain.conversion_slice_columns)
        if mine != theirs:
            raise ValueError(f"{source} is for slices {domain.slice_columns} / queries {domain.query_names} / "
                             f"baseline {domain.baseline}, the parameters use {self.slice_columns} / "
                             f"{self.query_columns} / baseline {self.encoding == 'baseline'}")

    def with_domain_of(self, slice_values: Mapping[str, Any]) -> Params:
        """These parameters carrying the domain of the slices in ``slice_values`` (column -> values)."""
        domain = KeyDomain.from_slice_values(self.slice_columns, slice_values, self.query_columns,
                                             self.encoding == "baseline", self.conversion_slice_columns, HISTORY)
        return dataclasses.replace(self, domain=domain)

    def _check_fractions(self) -> None:
        fractions = [q.budget_fraction for q in self.queries]
        if self.encoding == "l1":
            if any(f is not None for f in fractions) or self.count_budget_fraction is not None:
                raise ValueError("budget_fraction must be absent (null) for encoding 'l1': Alg. 6 uses no fractions")
            return
        missing = [q.column for q in self.queries if q.budget_fraction is None]
        if missing:
            raise ValueError(f"queries{missing}.budget_fraction is required for encoding {self.encoding!r}")
        total = float(sum(f for f in fractions if f is not None))  # (none is None: checked above)
        if self.encoding == "baseline":
            if self.count_budget_fraction is None:
                raise ValueError("count_budget_fraction is required for encoding 'baseline'")
            total += float(self.count_budget_fraction)
            what = "count_budget_fraction + queries[].budget_fraction"
        else:
            if self.count_budget_fraction is not None:
                raise ValueError("count_budget_fraction is only used by encoding 'baseline'")
            what = "queries[].budget_fraction"
        if abs(total - 1.0) > FRACTION_TOLERANCE:
            raise ValueError(f"{what} must sum to 1 (within {FRACTION_TOLERANCE:g}), got {total!r}")

    def _check_scales(self) -> None:
        """Refuse a budget fraction whose integer scale floor(alpha Gamma / C) is 0 (Alg. 3, baseline):
        its key would always hold 0 and Alg. 4 would divide by 0 (the L1 scale floor(Gamma / C) is >= 1)."""
        if self.encoding == "l1":
            return
        fractions = [(f"queries[{q.column!r}].budget_fraction", float(cast(float, q.budget_fraction)))
                     for q in self.queries]
        if self.encoding == "baseline":
            fractions.append(("count_budget_fraction", float(cast(float, self.count_budget_fraction))))
        gamma, c = self.contribution_budget, self.count_limit
        for what, alpha in fractions:
            if math.floor(alpha * gamma / c) < 1:  # as encoding.query_scale
                raise ValueError(
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
            raise ValueError(f"encoding {self.encoding!r} has no count budget fraction (baseline only)")
        return float(self.count_budget_fraction)

    @property
    def per_conversion_budget(self) -> int:
        """floor(Gamma / C): the L1 norm every L-inf / L1 contribution uses (Lemma 4.1)."""
        return self.contribution_budget // self.count_limit

    def with_epsilon(self, epsilon: float) -> Params:
        return dataclasses.replace(self, epsilon=epsilon)

    # ---- serialisation --------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "format_version": self.format_version,
            "contribution_budget": self.contribution_budget,
            "epsilon": self.epsilon,
            "encoding": self.encoding,
            "count_limit": self.count_limit,
            "slice_columns": list(self.slice_columns),
            "conversion_slice_columns": list(self.conversion_slice_columns),
            "queries": [
                {"column": q.column, "clip_threshold": q.clip_threshold, "budget_fraction": q.budget_fraction, "tau": q.tau}
                for q in self.queries
            ],
            "count_budget_fraction": self.count_budget_fraction,
            "count_tau": self.count_tau,
            "provenance": self.provenance.to_json() if self.provenance else None,
        }
        if self.domain is not None:
            out["domain"] = {k: v for k, v in self.domain.to_json().items() if k not in ("params_sha256", "origin")}
        if self.calibration is not None:
            out["correction"] = self.correction
            out["calibration"] = self.calibration.to_json()
        if self.encoding == "l1":
            out["l1_rounding"] = self.l1_rounding
        return out

    def to_bytes(self) -> bytes:
        return (jsonio.dumps(self.to_json(), indent=2, sort_keys=False) + "\n").encode("utf-8")

    def checksum(self) -> str:
        """sha256 of the canonical serialisation (what ``save`` writes)."""
        return hashlib.sha256(self.to_bytes()).hexdigest()

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write atomically (temporary file + rename): a reader never sees a partial file."""
        atomic_write_bytes(path, self.to_bytes())

    @classmethod
    def from_json(cls, data: Any, source: str = "parameter file") -> Params:
        """Validate ``data`` (parsed JSON) against the schema and semantically; refuse with the field name."""
        if not isinstance(data, dict):
            raise ValueError(f"{source}: top level must be a JSON object")
        if "format_version" in data:
            _check_version(data["format_version"], source)
        validator = jsonschema.Draft202012Validator(params_json_schema())
        errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
        if errors:
            err = errors[0]
            where = _json_path(err)
            raise ValueError(f"{source}: field {where}: {err.message}")
        queries = tuple(
            QueryParams(
                column=q["column"], clip_threshold=float(q["clip_threshold"]),
                budget_fraction=None if q.get("budget_fraction") is None else float(q["budget_fraction"]),
                tau=None if q.get("tau") is None else float(q["tau"]),
            )
            for q in data["queries"]
        )
        prov = data.get("provenance")
        try:
            return cls(
                count_limit=data["count_limit"], encoding=data["encoding"], epsilon=data["epsilon"],
                slice_columns=tuple(data["slice_columns"]), queries=queries,
                contribution_budget=data["contribution_budget"],
                count_budget_fraction=data.get("count_budget_fraction"), count_tau=float(data["count_tau"]),
                l1_rounding=data.get("l1_rounding", "floor"),
                conversion_slice_columns=tuple(data.get("conversion_slice_columns", ())),
                provenance=Provenance.from_json(prov) if prov else None, format_version=data["format_version"],
                domain=None if data.get("domain") is None else KeyDomain.from_json(data["domain"], source="domain",
                                                                                  embedded=True),
                calibration=_calibration_from_json(data.get("calibration")), correction=data.get("correction", "ratio"),
            )
        except ValueError as exc:
            raise ValueError(f"{source}: {exc}") from None

    @classmethod
    def from_bytes(cls, raw: bytes, source: str = "parameter file") -> Params:
        return cls.from_json(jsonio.loads(raw, source), source)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Params:
        path = os.fspath(path)
        raw = read_bytes(path, "parameter file")
        return cls.from_bytes(raw, source=path)


def _calibration_from_json(data: Any) -> Any:
    if data is None:
        return None
    from .calibration import Calibration

    return Calibration.from_json(data, source="calibration")


def params_json_schema() -> dict[str, Any]:
    """The JSON Schema of the parameter file (``schemas/params.schema.json``)."""
    text = resources.files("araopt").joinpath("schemas/params.schema.json").read_text(encoding="utf-8")
    return cast(dict[str, Any], json.loads(text))


def utc_now_iso() -> str:
    return _dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat()


def _check_version(version: Any, source: str = "parameter file") -> None:
    if not isinstance(version, str) or "." not in version:
        raise ValueError(f"{source}: field format_version must look like 'MAJOR.MINOR', got {version!r}")
    major = version.split(".", 1)[0]
    if not major.isdigit() or int(major) != SUPPORTED_MAJOR_VERSION:
        raise ValueError(
            f"{source}: field format_version {version!r} has unknown major version (supported: {SUPPORTED_MAJOR_VERSION}.x)"
        )


def _json_path(err: jsonschema.ValidationError) -> str:
    if err.validator == "required":
        missing = err.message.split("'")[1] if "'" in err.message else "?"
        base = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path)
        return f"{base}.{missing}".lstrip(".") or missing
    if err.validator == "additionalProperties":
        return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path).lstrip(".") or "(top level)"
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path).lstrip(".") or "(top level)"


def _is_positive_finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0
