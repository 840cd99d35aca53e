"""Fitting the paper's synthetic model (Sec. 5.3) to a conversion log by maximum likelihood: the power
law of impressions per slice (b), a zero-truncated Poisson of conversions per impression (lambda) and a
log-normal of values (mu, sigma), with asymptotic standard errors; the result is a preset the generator
(``data.synthetic``) takes."""
from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from scipy import optimize

from araopt.data.synthetic import IMPRESSION_FEATURE_NAMES, PowerLaw, SyntheticPreset, check_int
from araopt.errors import InvalidInput, InvalidParameters


@dataclass(frozen=True)
class SyntheticFit:
    """A fitted preset with the data sizes and asymptotic standard errors (Fisher information)."""

    preset: SyntheticPreset
    n_slices: int
    n_impressions: int
    n_conversions: int
    n_positive_values: int
    stderr: Mapping[str, float]
    notes: tuple[str, ...] = ()

    def diagnostics(self) -> dict[str, Any]:
        return {"n_slices": self.n_slices, "n_impressions": self.n_impressions,
                "n_conversions": self.n_conversions, "n_positive_values": self.n_positive_values,
                "stderr": dict(self.stderr), "notes": list(self.notes)}


def fit_power_law(counts: np.ndarray, k_min: int | None = None, k_max: int | None = None) -> tuple[PowerLaw, float]:
    """MLE of b (Def. 5.1) from impressions-per-slice counts; returns (law, standard error of b).

    Without explicit bounds the support is [min(counts), max(counts)], the joint MLE of the
    bounds for any b > 0, since shrinking the support to the data only raises the likelihood.
    The log-likelihood -b sum(log x) - n log Z(b) is concave in b, so a bounded scalar search
    over b in (1e-6, 50) finds the global maximum.
    """
    x = np.asarray(counts, dtype=np.int64)
    if x.size < 2:
        raise InvalidInput(f"need at least 2 slices to fit the power law, got {x.size}")
    lo = int(x.min()) if k_min is None else check_int("k_min", k_min)
    hi = int(x.max()) if k_max is None else check_int("k_max", k_max)
    if lo < 1 or x.min() < lo or x.max() > hi:
        raise InvalidInput(f"counts span [{x.min()}, {x.max()}], outside the support [{lo}, {hi}]")
    if lo == hi:
        raise InvalidInput(f"all {x.size} slices have {lo} impressions: the power-law shape b is not identifiable")
    mean_log = float(np.mean(np.log(x)))

    def nll(b: float) -> float:
        return b * mean_log + PowerLaw(b, lo, hi).log_normalizer()

    res = optimize.minimize_scalar(nll, bounds=(1e-6, 50.0), method="bounded",
                                   options={"xatol": 1e-7, "maxiter": 500})
    law = PowerLaw(float(res.x), lo, hi)
    info = law.var_log() * x.size
    return law, (1.0 / math.sqrt(info) if info > 0 else math.inf)


def fit_zero_truncated_poisson(counts: np.ndarray) -> tuple[float, float]:
    """MLE of lam from per-impression conversion counts that are all >= 1; returns (lam, stderr).

    Impressions without conversions leave no record, so the observed counts follow a
    zero-truncated Poisson. The MLE solves lam / (1 - exp(-lam)) = mean(counts), which lies in
    [mean - 1, mean]. If every count is 1 the MLE is the boundary lam = 0, and the notes say so.
    """
    n = np.asarray(counts, dtype=np.float64)
    if n.size == 0:
        raise InvalidInput("no impressions to fit lam")
    if n.min() < 1:
        raise InvalidInput("zero-truncated Poisson counts must all be >= 1")
    m = float(n.mean())
    if m <= 1.0:
        return 0.0, 0.0

    def g(lam: float) -> float:
        return lam / -math.expm1(-lam) - m

    lam = optimize.brentq(g, max(m - 1.0, 1e-12), m, xtol=1e-12, rtol=1e-14)
    var = m * (1.0 + lam - m)  # variance of the zero-truncated Poisson
    se = lam / math.sqrt(n.size * var) if var > 0 else math.inf
    return float(lam), float(se)


def fit_log_normal(values: np.ndarray) -> tuple[float, float, int]:
    """MLE (mu, sigma) of log-normal values (Def. 5.3) over values > 0; returns (mu, sigma, n used)."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v) & (v > 0)]
    if v.size < 2:
        raise InvalidInput(f"need at least 2 positive values to fit mu and sigma, got {v.size}")
    logs = np.log(v)
    mu = float(logs.mean())
    sigma = float(np.sqrt(np.mean((logs - mu) ** 2)))  # MLE: divide by n, not n - 1
    if sigma <= 0:
        raise InvalidInput("all positive values are equal: sigma is 0 and the log-normal is degenerate")
    return mu, sigma, int(v.size)


def _read_log(source: pa.Table | str | os.PathLike[str], columns: Sequence[str]) -> pa.Table:
    if isinstance(source, pa.Table):
        table = source
    else:
        path = os.fspath(source)
        if not os.path.exists(path):
            raise InvalidInput(f"input {path!r} does not exist")
        dataset = ds.dataset(path, format="parquet")
        missing = [c for c in columns if c not in dataset.schema.names]
        if missing:
            raise InvalidInput(f"input {path!r} lacks column(s) {missing}; present: {dataset.schema.names}")
        table = dataset.to_table(columns=list(columns))
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise InvalidInput(f"input lacks column(s) {missing}; present: {table.column_names}")
    return table.select(list(columns))


def fit_synthetic_report(source: pa.Table | str | os.PathLike[str], *, name: str = "fitted",
                         slice_columns: Sequence[str] = IMPRESSION_FEATURE_NAMES, value_column: str = "value",
                         impression_column: str = "impression_id", k_min: int | None = None,
                         k_max: int | None = None, attribution_window_days: int = 30) -> SyntheticFit:
    """Maximum-likelihood fit of the Sec. 5.3 model to a conversion log (table or Parquet path).

    b: power-law MLE over the number of distinct impressions per slice (``fit_power_law``).
       Only impressions with at least one conversion are visible, so slice sizes are thinned by
       (1 - exp(-lam)): under 5e-5 for lam = 10, but b is biased when lam is small.
    lam: zero-truncated Poisson MLE over conversions per impression (``fit_zero_truncated_poisson``).
    mu, sigma: log-normal MLE over the values > 0 (zeros, e.g. Criteo non-sales, are left out).
    Memory: the projected columns are read into memory (about 30 bytes per row).
    """
    slice_columns = list(slice_columns)
    if not slice_columns:
        raise InvalidParameters("at least one slice column is required")
    table = _read_log(source, [impression_column, *slice_columns, value_column])
    if table.num_rows == 0:
        raise InvalidInput("the conversion log is empty")
    for c in table.column_names:
        if table.column(c).null_count:
            raise InvalidInput(f"column {c!r} has {table.column(c).null_count} null(s); the contract requires non-null")
    per_imp = table.group_by([impression_column, *slice_columns]).aggregate([([], "count_all")])
    n_impressions = pc.count_distinct(table.column(impression_column)).as_py()
    if per_imp.num_rows != n_impressions:
        raise InvalidInput(f"{per_imp.num_rows - n_impressions} impression(s) appear in more than one slice "
                           f"of {slice_columns}; each impression must belong to one slice")
    per_slice = per_imp.group_by(slice_columns).aggregate([([], "count_all")])
    slice_sizes = per_slice.column("count_all").to_numpy()
    law, se_b = fit_power_law(slice_sizes, k_min, k_max)
    lam, se_lam = fit_zero_truncated_poisson(per_imp.column("count_all").to_numpy())
    values = pc.cast(table.column(value_column), pa.float64()).to_numpy()
    if np.any(values < 0) or not np.all(np.isfinite(values)):
        raise InvalidInput(f"value column {value_column!r} must be finite and >= 0")
    mu, sigma, n_pos = fit_log_normal(values)
    notes = []
    if lam == 0.0:
        notes.append("every impression has exactly one conversion: lam is not identifiable (MLE at lam = 0)")
    if n_pos < values.size:
        notes.append(f"{values.size - n_pos} zero value(s) left out of the log-normal fit")
    preset = SyntheticPreset(name, b=law.b, lam=lam, mu=mu, sigma=sigma, k_min=law.k_min, k_max=law.k_max,
                             attribution_window_days=attribution_window_days)
    stderr = {"b": se_b, "lam": se_lam, "mu": sigma / math.sqrt(n_pos), "sigma": sigma / math.sqrt(2 * n_pos)}
    return SyntheticFit(preset, int(slice_sizes.size), int(n_impressions), int(table.num_rows), n_pos, stderr,
                        tuple(notes))


def fit_synthetic(source: pa.Table | str | os.PathLike[str], **kwargs: Any) -> SyntheticPreset:
    """Fit (b, lam, mu, sigma) by maximum likelihood; see ``fit_synthetic_report`` for details."""
    return fit_synthetic_report(source, **kwargs).preset
