"""Calibration from history: estimates of the TRUE totals from the capped-and-clipped ones.

ReconstructValues (Alg. 4) is unbiased for the capped-and-clipped sum X_lj = sum over the conversions
that ContributionCapping (Alg. 1) keeps of the clipped value (count: 1), not for the true total
T_lj = V_D(q_l)_j of Sec. 3.2. For FIXED parameters (C, C_l, alpha_l, encoding) the loss is
predictable: the retention ratio R_lj = X_lj / T_lj (count: kept / all conversions; value query l:
E[clipped kept value] / true value) is stable over time, and T_hat = U / r_hat estimates T.

Model (per query l, computed separately for the count and every value query)
  A "cluster" i is one (impression, slice, block); t_i = its true total, x_i = what Alg. 1 keeps of it
  (the mean of the encoding, ``encoding.expected_contribution`` in query units; count: kept records).
  Slice j, block b (a day, or any disjoint part of the history window):
      r_jb = X_jb / T_jb = rho_j + delta_b + gamma_jb + e_jb,
  rho_j the slice's long-run ratio, delta_b a period effect common to all slices (e.g. day of week),
  gamma_jb a slice x period interaction (variance s2_gamma), e_jb the sampling error of a ratio of
  sums over clusters: Var(e_jb) ~= sum_i (x_i - rho_j t_i)^2 / T_jb^2 = kappa_j / N_jb, with
  kappa_j = N_j sum_i (x_i - r_j t_i)^2 / T_j^2 the per-conversion "ratio sampling factor" (N = number
  of conversions; delta method for a ratio of sums of independent clusters).
  * kappa_j is estimated per slice (with the small-sample factor M/(M-1), M = clusters), blended with
    the pooled kappa by a pseudo-count of ``KAPPA_PSEUDO_CONVERSIONS`` conversions and never taken
    below the pooled kappa (with rare losses most slices show none in their history, which does not
    mean they cannot lose). The shrinkage below uses the pooled kappa: a slice's own kappa is
    correlated with its ratio (no loss -> kappa ~ 0 -> huge weight) and would bias mu toward 1.
  * The loss-event rate p_j (clusters that lose anything, per conversion; blended like kappa) gives
    the probability that a measured period loses nothing at all: exp(-p_j N).
  * Period effects: the composition-adjusted block deviation delta_b = sum_j (X_jb - r_j T_jb) / T_b
    with sampling variance sum_j SS_jb / T_b^2. For a measured period of P consecutive blocks, the
    variance of its deviation is estimated by method of moments over all windows of P consecutive
    blocks (mean of delta_W^2 minus its sampling variance), corrected for the estimated grand mean
    (x (1 + P/B) / (1 - P/B)); this captures cycles (a whole week cancels a day-of-week effect) and
    autocorrelation. When B < 2P it falls back to independent blocks: s2_1 (1/P + 1/B).
  * s2_gamma by method of moments over the cells' residuals r_jb - r_j - delta_b, minus their
    sampling variances (weights N_jb; slices seen in >= 2 blocks, cells with >= 20 clusters: the
    delta-method variance of a ratio over a handful of heavy-tailed clusters is biased low).
  * Shrinkage (empirical Bayes, random-effects meta-analysis): the slice's historical ratio r_j has
    sampling variance s_j^2 = kappa_j / N_j + s2_gamma / B_j. The between-slice variance of rho_j,
    s2_slice, is the DerSimonian-Laird method-of-moments estimate; the pooled ratio mu is the
    random-effects weighted mean (Var(mu) = 1 / sum_j 1/(s_j^2 + s2_slice)). Then
        r_hat_j = mu + (1 - B_j)(r_j - mu),   B_j = s_j^2 / (s_j^2 + s2_slice),
        Var(rho_j | history) = (1 - B_j) s_j^2 + B_j^2 Var(mu)
    (tiny slice -> mu, huge slice -> its own ratio). s2_slice = 0 shrinks every slice to mu.
  * Slices absent from history (or without any value of a query) use mu with variance
    s2_slice_upper + Var(mu), s2_slice_upper the DerSimonian-Laird estimate with Q replaced by
    Q + 1.645 sqrt(2 (k - 1)) (a one-sided ~95 % bound; > 0 even when s2_slice = 0), so an unseen
    slice always gets a wider uncertainty than any seen one. One observed slice only: ((1 - mu)/2)^2.

Correction (``correct``) of an estimate U (Alg. 4, standard error se) of slice j, query l, for a
measured period of P blocks:
    T_hat = U / r_hat,
    Var(r_hat - R_period) = Var(rho_j | history) + V_period(P) + s2_gamma / P + kappa_j / N_hat,
    std_error^2 = se^2 / r_hat^2 + X2 Var(r_hat - R_period) / r_hat^4      (delta method),
with X2 = max(U^2 - se^2, 0) the unbiased estimate of X^2 (U^2 itself carries the noise's variance),
with N_hat = max(1, U_count / r_hat_count) the corrected count estimate of the slice's conversions in
the measured period: the realized ratio of the measured period fluctuates around rho_j by kappa/N,
which dominates at large epsilon. The interval is not symmetric: the period's loss D = T - X >= 0
is a sum of rare, large events when C is well above the typical impression (the (C+1)-th conversion
of a few impressions), so D is modelled as 0 with probability exp(-p_j N_hat) and otherwise a gamma,
with mean U (1 - r_hat) / r_hat and variance U^2 kappa_j / (N_hat r_hat^4); it is convolved with a
normal for the rest (noise and rounding se / r_hat, the long-run ratio error) and the interval is
T_hat + [2.5 %, 97.5 %] quantiles of that sum minus its mean (``convolved_loss_quantiles``). For
U <= 0 the interval is the symmetric normal one. r_hat lies in [MIN_RATIO, 1] and each side is at
least z se / r_hat >= z se: never narrower than the uncorrected interval's noise part, and nothing
is divided by zero.
  The interval is also never narrower than Fieller's set for the ratio T = X / R (``fieller_interval``):
with s^2 = Var(rho_j | history) + V_period(P) + s2_gamma / P (the ratio's error other than sampling)
and, for the count, the sampling variance of X given T, kappa_j T (= T^2 kappa_j / N with N = T),
    {T : (U - T r_hat)^2 <= z^2 (se^2 + c T + s^2 T^2)},   a = r_hat^2 - z^2 s^2,  b = 2 U r_hat + z^2 c,
    T = (b -/+ sqrt(b^2 - 4 a (U^2 - z^2 se^2))) / (2 a),
c = kappa_j for the count, 0 for a value query (its sampling stays in the loss convolution), the upper
root taken at max(U, 0) (X >= 0: a negative U says no less than U = 0). X2 drops the ratio's
uncertainty where U is at noise level (X2 = 0 for |U| <= se), yet there the true total may be far
above U / r_hat: at U = 0 (c = 0) Fieller gives +/- z se / sqrt(a), not z se / r_hat. Where the ratio is
not significantly above 0 (a <= 0, the set unbounded) ``fieller_interval`` floors a at
(r_hat exp(-z s / r_hat))^2, the log-scale lower bound of a positive ratio (inactive while
z s / r_hat <= 0.9); ``correct`` applies the set only where z s / r_hat <= 0.9: the private
calibration's s of near-empty slices (synth-criteo: z ratio_std_error / r_hat 1-16) made the set ~10^3 x the
truth, so there the convolved interval stays (a documented gap). For U >> se and s << r_hat it is the
delta method's interval and the convolved one above is the wider.

Assumptions and what is NOT covered
  * The measured period behaves like the history (same C, C_l, alpha_l: checked by a checksum; same
    mix of impressions, conversions per impression and values, up to the modelled random effects).
    A trend or a shift outside the history's range is not covered. A deterministic cycle is modelled
    as random: a period that averages over whole cycles is right; a single day of a weekly cycle
    gets the day-to-day variance (conservative for that weekday; fit on that weekday's blocks only,
    ``fit_calibration(..., blocks=...)``, for a sharper interval).
  * Batches must hold all conversions of each of their impressions (as for the statistics): Alg. 1
    keeps per impression. Clusters are assumed independent (impressions are).
  * Uncertainty of s2_slice, s2_gamma and kappa themselves is ignored (plug-in); the delta method
    and the zero-inflated gamma are approximations (poor for slices with a handful of conversions).
  * The baseline encoding (Sec. 5.1) keeps records by their realised, randomly rounded norms; the
    calibration uses ``error_model.kept_mask``'s expected-norm decision (documented approximation).

The accumulator is ``calibration.accumulator``, the fit ``calibration.fit``, the correction
``calibration.correct``, the replay of releases ``calibration.backtest``; the error model of the
corrected estimator for the optimizer is ``optimize.corrected``.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from araopt.errors import InvalidInput, InvalidParameters
from araopt.io import jsonio
from araopt.io.files import atomic_write_bytes, read_bytes
from araopt.mechanism.keys import slice_key
from araopt.mechanism.params import Encoding, Params

CALIBRATION_FORMAT = "araopt.calibration/1"
METHOD = "empirical-bayes-ratio/1"
MIN_RATIO = 1e-6
"""Ratios are clipped to [MIN_RATIO, 1]: a slice never gets divided by (almost) zero."""
KAPPA_PSEUDO_CONVERSIONS = 1000.0
"""Pseudo-count (conversions) with which the pooled ratio sampling factor kappa enters a slice's kappa."""
MIN_INTERACTION_CLUSTERS = 20
"""Cells with fewer clusters do not enter the slice x block interaction estimate: the delta-method
variance of a ratio over a handful of heavy-tailed clusters is biased low, which would show up as a
spurious interaction."""
_Z95_ONE_SIDED = 1.6448536269514722
_COUNT = "count"


def retention_checksum(params: Params) -> str:
    """sha256 of what decides the retention ratios: encoding, C, Gamma, C_l, alpha_l, l1_rounding and
    the exploration arms (their impressions are not in the main keys).

    Epsilon, taus and provenance do not change what Alg. 1 keeps or how values are clipped, so a
    calibration stays valid for the same bounding at another epsilon.
    """
    data = {
        "encoding": params.encoding, "count_limit": params.count_limit,
        "contribution_budget": params.contribution_budget,
        "count_budget_fraction": params.count_budget_fraction,
        "l1_rounding": params.l1_rounding if params.encoding == Encoding.L1 else None,
        "queries": [[q.column, float(q.clip_threshold), q.budget_fraction] for q in params.queries],
    }
    if params.exploration is not None:  # the arms' impressions are not in the main keys
        data["exploration"] = params.exploration.to_json()
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode("utf-8")).hexdigest()



# The calibration
# ================================================================================================

@dataclass(frozen=True, eq=False)
class Calibration:
    """Retention ratios of fixed parameters, fitted from history (see the module docstring).

    Arrays are (m, d+1) in Alg. 4's order (count first), one row per ``slice_keys`` entry:
    ``ratio`` r_hat_j, ``variance`` Var(rho_j | history), ``kappa`` the ratio sampling factor,
    ``observed`` (False: the slice had no value of that query; ratio/variance are the unseen ones).
    Pooled (d+1): ``pooled_ratio`` mu, ``pooled_variance`` Var(mu), ``unseen_variance`` (used for
    slices absent from history), ``between_slice_variance``, ``interaction_variance``,
    ``pooled_kappa``. ``period_variance`` (B, d+1): row P-1 is V_period(P) for P consecutive blocks.
    ``point_ratio`` (m, d+1, optional): the ratio the point estimate divides by where it differs from
    ``ratio`` (the privacy-safe tuner's typical-period ratio of a heavy-tailed value,
    ``optimize.private.typical_day_factors``, and its divisor under the retention's doubt,
    ``optimize.private.shrunk_point``); the interval stays built around ``ratio``, the mean ratio, so it
    still covers the periods that hold the tail. None: the point divides by ``ratio``.
    """

    params_checksum: str
    retention_checksum: str
    slice_columns: tuple[str, ...]
    query_names: tuple[str, ...]
    slice_keys: tuple[tuple[Any, ...], ...]
    conversions: np.ndarray
    slice_blocks: np.ndarray
    ratio: np.ndarray
    variance: np.ndarray
    kappa: np.ndarray
    loss_rate: np.ndarray
    observed: np.ndarray
    pooled_ratio: np.ndarray
    pooled_variance: np.ndarray
    unseen_variance: np.ndarray
    between_slice_variance: np.ndarray
    interaction_variance: np.ndarray
    pooled_kappa: np.ndarray
    pooled_loss_rate: np.ndarray
    period_variance: np.ndarray
    num_blocks: int
    block_keys: tuple[str, ...] = ()
    point_ratio: np.ndarray | None = None
    method: str = METHOD
    format: str = CALIBRATION_FORMAT

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def num_slices(self) -> int:
        return len(self.slice_keys)

    @property
    def num_queries(self) -> int:
        return len(self.query_names) - 1

    def index(self) -> dict[tuple[Any, ...], int]:
        return {k: i for i, k in enumerate(self.slice_keys)}

    def check_params(self, params: Params) -> None:
        """Refuse (ValueError) parameters whose bounding differs from the fitted one (checksum)."""
        got = retention_checksum(params)
        if got != self.retention_checksum:
            raise InvalidInput(
                f"calibration does not match the parameters: retention checksum {self.retention_checksum[:12]}... "
                f"(fitted for params {self.params_checksum[:12]}...) != {got[:12]}... of these parameters "
                "(C, C_l, alpha_l or encoding differ): refit the calibration for these parameters")
        if ("count",) + params.query_columns != self.query_names:
            raise InvalidInput(f"calibration queries {self.query_names} differ from the parameters' {params.query_columns}")

    def period(self, period_blocks: int) -> np.ndarray:
        """V_period(P) (d+1) for a measured period of P >= 1 consecutive blocks."""
        if isinstance(period_blocks, bool) or not isinstance(period_blocks, (int, np.integer)) or period_blocks < 1:
            raise InvalidParameters(f"period_blocks must be an integer >= 1, got {period_blocks!r}")
        P = int(period_blocks)
        if P <= self.period_variance.shape[0]:
            return cast(np.ndarray, self.period_variance[P - 1])
        B = self.num_blocks  # beyond the history: independent blocks, s2_1 from P = 1
        s2_1 = self.period_variance[0] / (1.0 + 1.0 / B)
        return cast(np.ndarray, s2_1 * (1.0 / P + 1.0 / B))

    # ---- serialisation --------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        def arr(a: np.ndarray) -> Any:
            return np.asarray(a).tolist()

        return {
            "format": self.format, "method": self.method,
            "params_checksum": self.params_checksum, "retention_checksum": self.retention_checksum,
            "slice_columns": list(self.slice_columns), "query_names": list(self.query_names),
            "num_blocks": int(self.num_blocks), "block_keys": list(self.block_keys),
            "pooled": {"ratio": arr(self.pooled_ratio), "variance": arr(self.pooled_variance),
                       "unseen_variance": arr(self.unseen_variance),
                       "between_slice_variance": arr(self.between_slice_variance),
                       "interaction_variance": arr(self.interaction_variance), "kappa": arr(self.pooled_kappa),
                       "loss_rate": arr(self.pooled_loss_rate)},
            "period_variance": arr(self.period_variance),
            "slices": {"keys": [list(k) for k in self.slice_keys], "conversions": arr(self.conversions),
                       "blocks": arr(self.slice_blocks), "ratio": arr(self.ratio), "variance": arr(self.variance),
                       "kappa": arr(self.kappa), "loss_rate": arr(self.loss_rate), "observed": arr(self.observed),
                       **({} if self.point_ratio is None else {"point_ratio": arr(self.point_ratio)})},
        }

    def to_bytes(self) -> bytes:
        return (jsonio.dumps(self.to_json()) + "\n").encode("utf-8")  # NaN as null: read back as NaN

    @classmethod
    def from_json(cls, data: Any, params: Params | None = None, source: str = "calibration") -> Calibration:
        """Validate and build; with ``params``, also refuse a checksum mismatch. Every refusal is a ValueError."""
        if not isinstance(data, Mapping):
            raise InvalidInput(f"{source}: top level must be a JSON object")
        if data.get("format") != CALIBRATION_FORMAT:
            raise InvalidInput(f"{source}: unsupported format {data.get('format')!r}; expected {CALIBRATION_FORMAT!r}")
        if data.get("method") != METHOD:
            raise InvalidInput(f"{source}: unknown method {data.get('method')!r}; expected {METHOD!r}")
        try:
            pooled, slices = data["pooled"], data["slices"]
            num_slices = len(slices["keys"])
            d1 = len(data["query_names"])

            def mat(x: Any, name: str) -> np.ndarray:
                a = np.asarray(x, dtype=np.float64)
                if a.size == num_slices * d1:
                    return a.reshape(num_slices, d1)
                return _bad_shape(name, a.shape, (num_slices, d1))

            cal = cls(
                params_checksum=data["params_checksum"], retention_checksum=data["retention_checksum"],
                slice_columns=tuple(data["slice_columns"]), query_names=tuple(data["query_names"]),
                slice_keys=tuple(slice_key(k) for k in slices["keys"]),
                conversions=np.asarray(slices["conversions"], dtype=np.float64),
                slice_blocks=np.asarray(slices["blocks"], dtype=np.float64),
                ratio=mat(slices["ratio"], "slices.ratio"), variance=mat(slices["variance"], "slices.variance"),
                kappa=mat(slices["kappa"], "slices.kappa"), loss_rate=mat(slices["loss_rate"], "slices.loss_rate"),
                observed=np.asarray(slices["observed"], dtype=bool).reshape(num_slices, d1),
                pooled_ratio=np.asarray(pooled["ratio"], dtype=np.float64),
                pooled_variance=np.asarray(pooled["variance"], dtype=np.float64),
                unseen_variance=np.asarray(pooled["unseen_variance"], dtype=np.float64),
                between_slice_variance=np.asarray(pooled["between_slice_variance"], dtype=np.float64),
                interaction_variance=np.asarray(pooled["interaction_variance"], dtype=np.float64),
                pooled_kappa=np.asarray(pooled["kappa"], dtype=np.float64),
                pooled_loss_rate=np.asarray(pooled["loss_rate"], dtype=np.float64),
                period_variance=np.asarray(data["period_variance"], dtype=np.float64).reshape(-1, d1),
                num_blocks=data["num_blocks"], block_keys=tuple(str(b) for b in data.get("block_keys", ())),
                point_ratio=(None if slices.get("point_ratio") is None
                             else mat(slices["point_ratio"], "slices.point_ratio")),
                method=data["method"], format=data["format"],
            )
        except KeyError as exc:
            raise InvalidInput(f"{source}: missing field {exc.args[0]!r}") from None
        except (TypeError, ValueError) as exc:
            raise InvalidInput(f"{source}: {exc}") from None
        if params is not None:
            cal.check_params(params)
        return cal

    @classmethod
    def from_bytes(cls, raw: bytes, params: Params | None = None, source: str = "calibration") -> Calibration:
        return cls.from_json(jsonio.loads(raw, source), params, source)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write atomically (temporary file + rename), like ``Params.save``."""
        atomic_write_bytes(path, self.to_bytes())

    @classmethod
    def load(cls, path: str | os.PathLike[str], params: Params | None = None) -> Calibration:
        """Read and validate; with ``params``, refuse a calibration fitted for other parameters."""
        path = os.fspath(path)
        raw = read_bytes(path, "calibration file")
        return cls.from_bytes(raw, params, source=path)


def _bad_shape(name: str, got: tuple[int, ...], want: tuple[int, ...]) -> np.ndarray:
    raise InvalidInput(f"field {name} has shape {got}, expected {want}")


_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def _validate(cal: Calibration) -> None:
    for name in ("params_checksum", "retention_checksum"):
        v = getattr(cal, name)
        if not isinstance(v, str) or not _HEX64.match(v):
            raise InvalidInput(f"calibration field {name} must be a sha256 hex digest, got {v!r}")
    if cal.method != METHOD or cal.format != CALIBRATION_FORMAT:
        raise InvalidInput(f"unknown calibration method/format {cal.method!r}/{cal.format!r}")
    if not cal.query_names or cal.query_names[0] != _COUNT:
        raise InvalidInput(f"calibration query_names must start with 'count', got {cal.query_names!r}")
    if isinstance(cal.num_blocks, bool) or not isinstance(cal.num_blocks, (int, np.integer)) or cal.num_blocks < 1:
        raise InvalidInput(f"calibration num_blocks must be an integer >= 1, got {cal.num_blocks!r}")
    m, d1 = len(cal.slice_keys), len(cal.query_names)
    if len(set(cal.slice_keys)) != m:
        raise InvalidInput("calibration slice keys must be unique")
    if any(len(k) != len(cal.slice_columns) for k in cal.slice_keys):
        raise InvalidInput(f"every calibration slice key must have {len(cal.slice_columns)} values (the slice columns)")
    for name, shape in (("ratio", (m, d1)), ("variance", (m, d1)), ("kappa", (m, d1)), ("loss_rate", (m, d1)),
                        ("observed", (m, d1)), ("pooled_loss_rate", (d1,)),
                        ("conversions", (m,)), ("slice_blocks", (m,)), ("pooled_ratio", (d1,)),
                        ("pooled_variance", (d1,)), ("unseen_variance", (d1,)), ("between_slice_variance", (d1,)),
                        ("interaction_variance", (d1,)), ("pooled_kappa", (d1,))):
        a = np.asarray(getattr(cal, name))
        if a.shape != shape:
            raise InvalidInput(f"calibration field {name} has shape {a.shape}, expected {shape}")
    pv = np.asarray(cal.period_variance)
    if pv.ndim != 2 or pv.shape[1] != d1 or pv.shape[0] < 1:
        raise InvalidInput(f"calibration field period_variance must be (blocks, {d1}), got {pv.shape}")
    point_shape = None if cal.point_ratio is None else np.asarray(cal.point_ratio).shape
    if point_shape is not None and point_shape != (m, d1):
        raise InvalidInput(f"calibration field point_ratio has shape {point_shape}, expected {(m, d1)}")
    for name in ("ratio", "pooled_ratio") + (() if cal.point_ratio is None else ("point_ratio",)):
        a = np.asarray(getattr(cal, name), dtype=np.float64)
        if not np.isfinite(a).all() or (a <= 0).any() or (a > 1).any():
            raise InvalidInput(f"calibration field {name}: retention ratios must lie in (0, 1], got "
                             f"{a[~(np.isfinite(a) & (a > 0) & (a <= 1))][:3].tolist()}")
    for name in ("variance", "kappa", "pooled_variance", "unseen_variance", "between_slice_variance",
                 "interaction_variance", "pooled_kappa", "period_variance", "conversions", "slice_blocks"):
        a = np.asarray(getattr(cal, name), dtype=np.float64)
        if not np.isfinite(a).all() or (a < 0).any():
            raise InvalidInput(f"calibration field {name}: must be finite and >= 0 (no NaN, no negative variance), got "
                             f"{a[~(np.isfinite(a) & (a >= 0))][:3].tolist()}")
    for name in ("loss_rate", "pooled_loss_rate"):
        a = np.asarray(getattr(cal, name), dtype=np.float64)
        if not (np.isfinite(a).all() and (a >= 0).all() and (a <= 1).all()):
            raise InvalidInput(f"calibration field {name}: loss events per conversion must lie in [0, 1]")
    if (np.asarray(cal.unseen_variance) < np.asarray(cal.pooled_variance)).any():
        raise InvalidInput("calibration field unseen_variance must be >= pooled_variance")

