"""A parameter version: the parameter FILE that ``optimize`` and ``nightly`` publish and ``measure``,
``export-ara`` and ``reconstruct`` read. It holds the mechanism's parameters (``mechanism.params``),
the declared key domain of its releases, the calibration fitted on the training history and how
estimates use it (``correction``), and where it came from (``Provenance``); and the API it targets
(``Api``): ARA (the default: a file without ``api`` is ARA's, byte for byte as before) or W3C Attribution
Level 1, whose version carries its ``AttributionParams`` (``attribution``) beside their paper view.

The file is JSON, validated against ``schemas/params.schema.json`` and then semantically; every
refusal names the field. ``checksum`` is the sha256 of the bytes ``save`` writes: key maps and
releases record it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from importlib import resources
from typing import Any, cast

import jsonschema

from araopt.attribution.calibrate import Retention
from araopt.attribution.params import AttributionParams, params_from_json, params_to_json
from araopt.calibration.calendar import Calendar
from araopt.calibration.model import Calibration
from araopt.constants import CORRECTION, L1_ROUNDING_OF_A_FILE
from araopt.errors import InvalidParameters
from araopt.io import jsonio
from araopt.io.files import atomic_write_bytes, read_bytes
from araopt.mechanism.exploration import Exploration
from araopt.mechanism.keys import HISTORY, KeyDomain
from araopt.mechanism.params import Encoding, Params, QueryParams

FORMAT_VERSION = "1.0"
SUPPORTED_MAJOR_VERSION = 1
CORRECTIONS = ("ratio", "none", "count")
POINT_ESTIMATES = {"ratio": "capped sum / retention ratio", "none": "the capped sum",
                   "count": "the count: capped count / retention ratio; each value: the capped sum"}
"""What each ``correction`` publishes as the point estimate (the intervals are of the true totals
either way)."""


def divided_queries(correction: str, num_columns: int) -> list[bool]:
    """Per query (count first), whether ``correction``'s point estimate divides by the ratio."""
    if correction not in CORRECTIONS:
        raise InvalidParameters(f"correction must be one of {CORRECTIONS}, got {correction!r}")
    return [correction == "ratio" or (correction == "count" and q == 0) for q in range(num_columns)]


class Api(StrEnum):
    """The browser API a parameter version targets: ARA (summary reports) or W3C Attribution Level 1."""

    ARA = "ara"
    ATTRIBUTION = "attribution"


"""How estimates use a calibration: ``ratio`` divides by the retention ratio; ``none`` keeps the capped estimate."""


PRIVACY_SAFE = "privacy-safe"
"""How privacy-safe tuning's provenance begins its ``tuning`` entry (``optimize.private``)."""


JOINED_HISTORY_FIELDS = ("history", "row_accounting", "rows_read")
"""Provenance fields only tuning on a joined history writes (``optimize --history``'s path, the Beam job's row
accounting, ``nightly``'s rows read): a version carrying one was fitted on raw data, whatever else it says."""


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

    @property
    def privacy_safe(self) -> bool:
        """Whether privacy-safe tuning made the version: its calibration is a post-processing of DP releases
        and first-party data, not of a joined history. The claim is the operator's file (nothing signs it);
        one that also records a joined history's reading (``JOINED_HISTORY_FIELDS``) is not believed."""
        return (str(self.extra.get("tuning", "")).startswith(PRIVACY_SAFE)
                and not any(f in self.extra for f in JOINED_HISTORY_FIELDS))

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Provenance:
        data = dict(data)
        window = data.pop("training_window", None) or {}
        known = {k: data.pop(k, None)
                 for k in ("rows", "created_at", "predicted_rmsre_tau", "baseline_rmsre_tau", "objective")}
        return cls(training_start=window.get("start"), training_end=window.get("end"), extra=data, **known)


@dataclass(frozen=True)
class ParameterVersion:
    """One parameter file: the mechanism's ``params``; the declared key ``domain`` of releases made with
    them (the slices of the training history) or None; the ``calibration`` fitted on the history for
    exactly this bounding, which turns estimates of the capped-and-clipped sums into estimates of the
    true totals, and ``correction``, how the point estimate uses it: ``ratio`` (U / r_hat), ``none``
    (the capped estimate, when the history shows that dividing adds more noise than it removes bias)
    or ``count`` (the count divided, each value query's capped estimate); the intervals are for the
    true totals either way; the ``calendar``: day-of-week and declared
    special-day effects on the calibration's ratios (``calibration.calendar``; it records the special
    days); and ``provenance``.

    ``api`` is the target; for ``Api.ATTRIBUTION``, ``attribution`` holds the Attribution parameters,
    ``params`` is their paper view (``AttributionParams.paper_params``: C, C_l, the slices; what a
    calibration is checked against) and ``domain`` the histogram layout (impression-side slices, the
    queries' names); ``retention`` the calibration to the true totals fitted on the history for exactly
    these attribution parameters (``attribution.calibrate``: refused when fitted for others; the point
    estimate always divides by the ratio). Build one with :meth:`for_attribution`."""

    params: Params
    domain: KeyDomain | None = None
    calibration: Calibration | None = None
    correction: str = CORRECTION
    provenance: Provenance | None = None
    format_version: str = FORMAT_VERSION
    calendar: Calendar | None = None
    api: Api = Api.ARA
    attribution: AttributionParams | None = None
    retention: Retention | None = None

    def __post_init__(self) -> None:
        _check_version(self.format_version)
        if not isinstance(self.params, Params):
            raise InvalidParameters(f"params must be Params, got {type(self.params).__name__}")
        try:
            object.__setattr__(self, "api", Api(self.api))
        except ValueError:
            raise InvalidParameters(f"api must be one of {[a.value for a in Api]}, got {self.api!r}") from None
        if self.api == Api.ATTRIBUTION:
            if not isinstance(self.attribution, AttributionParams):
                raise InvalidParameters("api 'attribution' needs its attribution parameters")
            if self.params != self.attribution.paper_params():
                raise InvalidParameters("the paper view (count_limit, queries, slices, epsilon) does not match the "
                                        "attribution parameters")
            if self.calibration is not None:
                raise InvalidParameters("an attribution version is calibrated by its retention, not an ARA calibration")
            if self.retention is not None:
                if not isinstance(self.retention, Retention):
                    raise InvalidParameters(f"retention must be a Retention, got {type(self.retention).__name__}")
                if self.correction != CORRECTION:
                    raise InvalidParameters(f"an attribution retention corrects by {CORRECTION!r}, got "
                                            f"{self.correction!r}")
                self.retention.check_params(self.attribution)
        elif self.attribution is not None or self.retention is not None:
            raise InvalidParameters("attribution parameters and their retention need api 'attribution'")
        if self.domain is not None:
            if self.attribution is not None:
                self.attribution.check_domain(self.domain)
            else:
                self.params.check_domain(self.domain)
        if self.correction not in CORRECTIONS:
            raise InvalidParameters(f"correction must be one of {CORRECTIONS}, got {self.correction!r}")
        if self.calibration is not None:
            if not isinstance(self.calibration, Calibration):
                raise InvalidParameters(f"calibration must be a Calibration, got {type(self.calibration).__name__}")
            self.calibration.check_params(self.params)
        if self.calendar is not None:
            if not isinstance(self.calendar, Calendar) or self.calibration is None:
                raise InvalidParameters("a calendar needs the calibration it was fitted with")
            try:
                self.calendar.check_calibration(self.calibration)
            except ValueError as exc:
                raise InvalidParameters(str(exc)) from None

    @classmethod
    def for_attribution(cls, attribution: AttributionParams, domain: KeyDomain | None = None,
                        correction: str = CORRECTION, provenance: Provenance | None = None,
                        retention: Retention | None = None) -> ParameterVersion:
        """A version of the attribution API: ``attribution`` with its paper view as ``params`` and the
        ``retention`` fitted for them (or None: its releases estimate the accepted clipped values)."""
        return cls(attribution.paper_params(), domain=domain, correction=correction, provenance=provenance,
                   api=Api.ATTRIBUTION, attribution=attribution, retention=retention)

    def require_api(self, api: Api, command: str) -> None:
        """Refuse (one line) a version of another API than the one ``command`` handles."""
        if self.api != api:
            raise InvalidParameters(f"{command} handles parameter versions of api {api.value!r}; this one is for "
                                    f"{self.api.value!r}")

    def with_epsilon(self, epsilon: float) -> ParameterVersion:
        """The same version releasing at another epsilon (a calibration does not depend on it)."""
        self.require_api(Api.ARA, "with_epsilon")
        return dataclasses.replace(self, params=self.params.with_epsilon(epsilon))

    # ---- serialisation --------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        p = self.params
        out: dict[str, Any] = {
            "format_version": self.format_version,
            "contribution_budget": p.contribution_budget,
            "epsilon": p.epsilon,
            "encoding": p.encoding,
            "count_limit": p.count_limit,
            "slice_columns": list(p.slice_columns),
            "conversion_slice_columns": list(p.conversion_slice_columns),
            "queries": [
                {"column": q.column, "clip_threshold": q.clip_threshold, "budget_fraction": q.budget_fraction, "tau": q.tau}
                for q in p.queries
            ],
            "count_budget_fraction": p.count_budget_fraction,
            "count_tau": p.count_tau,
            "provenance": self.provenance.to_json() if self.provenance else None,
        }
        if self.domain is not None:
            # the origin is kept (a release over a data-derived domain is refused outside simulation);
            # ``history``, the default, is left out: files of joined tuning keep their bytes and checksums
            out["domain"] = {k: v for k, v in self.domain.to_json(learnt=True).items()
                             if k != "params_sha256" and not (k == "origin" and v == HISTORY)}
        if self.calibration is not None:
            out["correction"] = self.correction
            out["calibration"] = self.calibration.to_json()
            if self.calendar is not None:
                out["calendar"] = self.calendar.to_json()
        if p.encoding == Encoding.L1:
            out["l1_rounding"] = p.l1_rounding
        if p.exploration is not None:
            out["exploration"] = p.exploration.to_json()
        if self.attribution is not None:  # ARA's files name no api: their bytes and checksums are as before
            out["api"] = self.api.value
            out["attribution"] = params_to_json(self.attribution)
            if self.retention is not None:  # a version without one keeps its bytes and checksum
                out["retention"] = self.retention.to_json()
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
    def from_json(cls, data: Any, source: str = "parameter file") -> ParameterVersion:
        """Validate ``data`` (parsed JSON) against the schema and semantically; refuse with the field name."""
        if not isinstance(data, dict):
            raise InvalidParameters(f"{source}: top level must be a JSON object")
        if "format_version" in data:
            _check_version(data["format_version"], source)
        validator = jsonschema.Draft202012Validator(params_json_schema())
        errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
        if errors:
            err = errors[0]
            raise InvalidParameters(f"{source}: field {_json_path(err)}: {err.message}")
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
            api = Api(data.get("api", Api.ARA.value))
            attribution = None if data.get("attribution") is None else params_from_json(data["attribution"])
            params = Params(
                count_limit=data["count_limit"], encoding=data["encoding"], epsilon=data["epsilon"],
                slice_columns=tuple(data["slice_columns"]), queries=queries,
                contribution_budget=data["contribution_budget"],
                count_budget_fraction=data.get("count_budget_fraction"), count_tau=float(data["count_tau"]),
                l1_rounding=data.get("l1_rounding", L1_ROUNDING_OF_A_FILE),
                conversion_slice_columns=tuple(data.get("conversion_slice_columns", ())),
                exploration=None if data.get("exploration") is None else Exploration.from_json(data["exploration"]))
            calibration = data.get("calibration")
            return cls(
                params,
                domain=None if data.get("domain") is None else KeyDomain.from_json(data["domain"], source="domain",
                                                                                  embedded=True),
                calibration=None if calibration is None else Calibration.from_json(calibration, source="calibration"),
                correction=data.get("correction", CORRECTION),
                calendar=None if data.get("calendar") is None else Calendar.from_json(data["calendar"]),
                provenance=Provenance.from_json(prov) if prov else None, format_version=data["format_version"],
                api=api, attribution=attribution,
                retention=None if data.get("retention") is None else Retention.from_json(data["retention"]),
            )
        except ValueError as exc:  # every refusal of the parts, said once with the file's name
            raise InvalidParameters(f"{source}: {exc}") from None

    @classmethod
    def from_bytes(cls, raw: bytes, source: str = "parameter file") -> ParameterVersion:
        return cls.from_json(jsonio.loads(raw, source), source)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ParameterVersion:
        path = os.fspath(path)
        raw = read_bytes(path, "parameter file")
        return cls.from_bytes(raw, source=path)


def params_json_schema() -> dict[str, Any]:
    """The JSON Schema of the parameter file (``schemas/params.schema.json``)."""
    text = resources.files("araopt").joinpath("schemas/params.schema.json").read_text(encoding="utf-8")
    return cast(dict[str, Any], json.loads(text))


def _check_version(version: Any, source: str = "parameter file") -> None:
    if not isinstance(version, str) or "." not in version:
        raise InvalidParameters(f"{source}: field format_version must look like 'MAJOR.MINOR', got {version!r}")
    major = version.split(".", 1)[0]
    if not major.isdigit() or int(major) != SUPPORTED_MAJOR_VERSION:
        raise InvalidParameters(f"{source}: field format_version {version!r} has unknown major version "
                                f"(supported: {SUPPORTED_MAJOR_VERSION}.x)")


def _json_path(err: jsonschema.ValidationError) -> str:
    if err.validator == "required":
        missing = err.message.split("'")[1] if "'" in err.message else "?"
        base = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path)
        return f"{base}.{missing}".lstrip(".") or missing
    if err.validator == "additionalProperties":
        return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path).lstrip(".") or "(top level)"
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path).lstrip(".") or "(top level)"

