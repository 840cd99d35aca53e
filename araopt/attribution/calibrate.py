"""Estimates of the TRUE totals from Alg. 4's estimates, with intervals, for this target: what the
browsers lose (reports refused for budget, values clipped at C_l) is learnt on a training log.

On the training log the error model (``attribution.error``, Thm. 4.2 for this target) gives per query
l and histogram index j the truth V_lj and the expectation E U_lj of Alg. 4's estimate. The retention
ratio r_l = sum_j E U_lj / sum_j V_lj (as ARA's calibration's retention ratio) turns an estimate into
an estimate of the true total, U / r_l; the spread delta_l is the ``level`` quantile over the indices
with V_lj > 0 of |1 - r_lj / r_l| (how far one index's ratio strays from the pooled one). The interval
of the true total is U / r_l +- (h / r_l + delta_l |U / r_l|), h the noise interval's half width: the
noise part and the ratio part added (a conservative union of the two).

A ``Retention`` is fitted for exactly one set of ``AttributionParams`` (every field decides what the
browsers keep: the epsilons against the per-site budget, maxValue, C_l, epochs, lookback, credit, the
slices): ``params_checksum`` is the sha256 of their canonical JSON and ``check_params`` refuses others.
It is stored in the attribution parameter version (``version.ParameterVersion.retention``, format
``RETENTION_FORMAT``), and ``published_frame`` turns a release's Alg. 4 estimates into the published
table: of the TRUE totals with it, of the accepted clipped values without it (``bias_corrected``).
"""
from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy.special import ndtri

from araopt.attribution.error import error_terms
from araopt.attribution.params import AttributionParams, params_to_json
from araopt.attribution.reconstruct import Estimate, estimates_frame
from araopt.errors import InvalidInput, InvalidParameters
from araopt.mechanism.keys import KeyDomain

RETENTION_FORMAT = "araopt.attribution-retention/1"
PUBLISHED_COLUMNS = ("estimate", "std_error", "ci_low", "ci_high", "capped_estimate", "capped_std_error",
                     "bias_corrected")
"""The estimate columns of an attribution release (ARA's ``publication.ESTIMATE_COLUMNS``): ``capped_*``
is Alg. 4's estimate of the values the browsers accepted, clipped at C_l."""


def params_checksum(params: AttributionParams) -> str:
    """sha256 of the parameters' canonical JSON: what a retention was fitted for."""
    return hashlib.sha256(json.dumps(params_to_json(params), sort_keys=True).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Retention:
    """Per query (``params.queries`` order, names ``query_names``): the retention ratio r_l and the
    spread delta_l at ``level``, fitted for the parameters of ``params_checksum`` on ``rows`` training
    conversions over ``indices`` histogram indices."""

    ratios: tuple[float, ...]
    spreads: tuple[float, ...]
    level: float
    params_checksum: str
    query_names: tuple[str, ...]
    rows: int = 0
    indices: int = 0

    def __post_init__(self) -> None:
        n = len(self.query_names)
        if not n or len(self.ratios) != n or len(self.spreads) != n:
            raise InvalidParameters(f"retention: {len(self.ratios)} ratios and {len(self.spreads)} spreads for "
                                    f"{n} queries")
        if not all(isinstance(r, float) and math.isfinite(r) and 0 < r <= 1 for r in self.ratios):
            raise InvalidParameters(f"retention: ratios must lie in (0, 1], got {list(self.ratios)}")
        if not all(isinstance(d, float) and math.isfinite(d) and d >= 0 for d in self.spreads):
            raise InvalidParameters(f"retention: spreads must be finite and >= 0, got {list(self.spreads)}")
        if not 0 < self.level < 1:
            raise InvalidParameters(f"retention: level must lie in (0, 1), got {self.level!r}")

    def check_params(self, params: AttributionParams) -> None:
        """Refuse (one line) parameters other than those the retention was fitted for."""
        got = params_checksum(params)
        if got != self.params_checksum or params.query_names != self.query_names:
            raise InvalidInput(f"the retention calibration was fitted for other attribution parameters (checksum "
                               f"{self.params_checksum[:12]}... != {got[:12]}... of these): refit it for these parameters")

    def to_json(self) -> dict[str, Any]:
        return {"format": RETENTION_FORMAT, "params_checksum": self.params_checksum,
                "query_names": list(self.query_names), "ratios": list(self.ratios), "spreads": list(self.spreads),
                "level": self.level, "rows": self.rows, "indices": self.indices}

    @classmethod
    def from_json(cls, doc: Any) -> Retention:
        """The stored retention; every refusal one line naming the field."""
        fields = ("format", "params_checksum", "query_names", "ratios", "spreads", "level", "rows", "indices")
        if not isinstance(doc, Mapping):
            raise InvalidParameters("retention must be a JSON object")
        unknown = sorted(set(doc) - set(fields))
        missing = [f for f in fields if f not in doc]
        if unknown or missing:
            raise InvalidParameters(f"retention: field {(unknown or missing)[0]!r} is "
                                    + ("unknown" if unknown else "missing"))
        if doc["format"] != RETENTION_FORMAT:
            raise InvalidParameters(f"retention: format must be {RETENTION_FORMAT!r}, got {doc['format']!r}")
        checksum = doc["params_checksum"]
        if not isinstance(checksum, str) or len(checksum) != 64 or set(checksum) - set("0123456789abcdef"):
            raise InvalidParameters(f"retention: params_checksum must be a sha256 hex digest, got {checksum!r}")
        for name in ("ratios", "spreads"):
            if not isinstance(doc[name], list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                          for x in doc[name]):
                raise InvalidParameters(f"retention: {name} must be a list of numbers, got {doc[name]!r}")
        if not isinstance(doc["query_names"], list) or not all(isinstance(x, str) for x in doc["query_names"]):
            raise InvalidParameters(f"retention: query_names must be a list of names, got {doc['query_names']!r}")
        for name in ("rows", "indices"):
            if not isinstance(doc[name], int) or isinstance(doc[name], bool) or doc[name] < 0:
                raise InvalidParameters(f"retention: {name} must be an integer >= 0, got {doc[name]!r}")
        if not isinstance(doc["level"], float):
            raise InvalidParameters(f"retention: level must be a number in (0, 1), got {doc['level']!r}")
        return cls(tuple(float(x) for x in doc["ratios"]), tuple(float(x) for x in doc["spreads"]), doc["level"],
                   checksum, tuple(doc["query_names"]), doc["rows"], doc["indices"])

    def true_totals(self, query: int, estimate: Estimate) -> tuple[np.ndarray, np.ndarray]:
        """The estimates of the true totals of ``query`` and the half widths of their intervals."""
        ratio, spread = self.ratios[query], self.spreads[query]
        values: np.ndarray = estimate.values / ratio
        half: np.ndarray = estimate.half_width / ratio + spread * np.abs(values)
        return values, half


def retention(params: AttributionParams, rows: pd.DataFrame, domain: KeyDomain, simulation_seed: int = 0,
              level: float = 0.95) -> Retention:
    """The retention ratios and spreads of ``params`` on the training ``rows`` (module docstring)."""
    if not 0 < level < 1:
        raise InvalidParameters(f"level must lie in (0, 1), got {level!r}")
    terms = error_terms(params, rows, domain, simulation_seed)
    expected = terms.truth + terms.bias
    ratios, spreads = [], []
    for q in range(len(params.queries)):
        truth, kept = terms.truth[q], expected[q]
        total = float(truth.sum())
        ratio = float(kept.sum()) / total if total > 0 else 1.0
        ratio = ratio if ratio > 0 else 1.0
        seen = truth > 0
        spread = float(np.quantile(np.abs(1.0 - kept[seen] / truth[seen] / ratio), level)) if seen.any() else 0.0
        ratios.append(min(ratio, 1.0))
        spreads.append(spread)
    return Retention(tuple(ratios), tuple(spreads), level, params_checksum(params), params.query_names, len(rows),
                     domain.num_slices)


def published_frame(estimates: Mapping[tuple[str, int], Estimate], domain: KeyDomain, params: AttributionParams,
                    retention: Retention | None) -> pd.DataFrame:
    """The published estimates table (``reconstruct.estimates_frame``'s rows) with ``PUBLISHED_COLUMNS``.

    With ``retention`` (checked against ``params``) ``estimate`` / ``ci_low`` / ``ci_high`` are of the
    TRUE totals (U / r_l +- (h / r_l + delta_l |U / r_l|)), ``std_error`` = sqrt((sd / r_l)^2 +
    (delta_l |U / r_l| / z)^2) (z: the level's normal quantile; the ratio part as a standard deviation)
    and ``bias_corrected`` is true; without, they are Alg. 4's, of the clipped values the browsers
    accepted, equal to ``capped_estimate`` / ``capped_std_error``, and ``bias_corrected`` is false."""
    frame = estimates_frame(estimates, domain, bool(params.conversion_slice_columns))
    frame["capped_estimate"] = frame["estimate"]
    frame["capped_std_error"] = frame["std_error"]
    frame["bias_corrected"] = retention is not None
    if retention is None:
        return frame
    retention.check_params(params)
    values, std, half = [], [], []
    for (name, _), est in sorted(estimates.items()):  # estimates_frame's row order
        q = params.query_names.index(name)
        v, h = retention.true_totals(q, est)
        z = float(ndtri(0.5 + est.level / 2))  # the normal quantile (scipy.stats imports in ~1 s)
        values.append(v)
        half.append(h)
        std.append(np.sqrt((est.noise_sd / retention.ratios[q]) ** 2
                           + (retention.spreads[q] * np.abs(v) / z) ** 2))
    point, width = np.concatenate(values), np.concatenate(half)
    frame["estimate"] = point
    frame["std_error"] = np.concatenate(std)
    frame["ci_low"] = point - width
    frame["ci_high"] = point + width
    return frame[[c for c in frame.columns if c not in PUBLISHED_COLUMNS] + list(PUBLISHED_COLUMNS)]


def estimates_of(retention: Retention | None, calibrated_privately: bool = False) -> str:
    """What the published estimates estimate (release.json's ``estimates`` and the console);
    ``calibrated_privately``: the version carries a retention calibrated on a joined history, whose true
    totals stay operator-private (the release holds Alg. 4's estimates)."""
    if retention is None:
        why = ("the version's retention is calibrated on the joined history, so the true totals it makes are "
               "operator-private (private/) and the release holds these" if calibrated_privately else
               "the parameters carry no retention calibration (araopt optimize / nightly --api attribution fit one "
               "on the history)")
        return ("the clipped values the browsers accepted (noisy sum / value scale, Alg. 4; the interval covers the "
                f"aggregation's noise): {why}, so bias_corrected is false")
    return (f"the TRUE totals: Alg. 4's estimate / the retention ratio learnt on {retention.rows:,} conversions of "
            f"history (bias_corrected); the intervals include the calibration's uncertainty (the noise interval / "
            f"the ratio + the {retention.level:g} quantile of the indices' ratio spread x |estimate|)")
