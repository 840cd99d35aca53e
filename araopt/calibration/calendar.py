"""Calendar structure of the retention ratios: day-of-week and declared special-day effects.

The calibration's blocks are UTC conversion days (``accumulator.day_blocks``). A weekly cycle in what
Alg. 1 loses (more conversions per impression at weekends: more fall beyond the count limit C; larger
values at weekends: more is clipped) makes the ratio of a day depend on its weekday. Treated as random,
the cycle gives every day the same interval: too wide on ordinary weekdays, too narrow on the days the
cycle pushes away from the mean. This module models it as known structure:

  delta_b = delta_k(b) + eta_b,   k(b) the day type of block b: its weekday (Mon = 0 .. Sun = 6), or
                                  ``SPECIAL`` when the operator declared the date special (holidays, sales),

with delta_b the composition-adjusted deviation of block b (``calibration.model``'s docstring:
sum over slices of X_jb - r_j T_jb, over T_b) and eta_b the day's own deviation (variance
``day_variance`` after removing the blocks' sampling variance, estimated within day types).

  * Fixed effects delta_k: the mean of delta_b over the blocks of type k, with sampling variance
    v_k = W / n_k (W the pooled within-type variance of delta_b, n_k the type's blocks).
  * Empirical-Bayes shrinkage (DerSimonian-Laird, as for the slices): the between-type variance tau^2
    of the effects and their random-effects mean mu; then delta_k_hat = mu + (1 - B_k)(mean_k - mu),
    B_k = v_k / (v_k + tau^2), with posterior variance (1 - B_k) v_k + B_k^2 Var(mu). A history that
    shows no weekday cycle (tau^2 = 0) shrinks every type to mu, i.e. back to the pooled ratio.
  * Effects are fitted only when the history spans at least ``MIN_SPAN_DAYS`` (two weeks: every
    weekday twice, so a day's own deviation can be told from its weekday's); otherwise no effect is
    applied and a measured day gets the history's marginal day-to-day variance (``Calibration.period``).
  * A measured period of days D_1..D_P (their types known from their dates, not from the data) gets
    the ratio shift sum_i w_i delta_k(D_i)_hat (w_i the type's mean volume share in the period) and
    the variance sum_k W_k^2 Var(delta_k | history) + day_variance sum_i w_i^2 (W_k = sum of the w_i of
    type k; days independent given their types).
  * A type the calibration cannot support -- never seen in the history (a weekday missing from a
    history shorter than the cycle, a special day with no special day in the history) -- gets mu with
    the variance ``unseen_variance``: the larger of the one-sided 95 % upper bound of tau^2 and the
    largest squared effect seen (with effects) or the largest squared day deviation seen (without),
    plus Var(mu). The correction then says so (``CalendarAdjustment.unsupported``) and the interval widens.
  * A declared special day with no special day in the history can move a ratio further than any day
    the history holds: a sale brings bigger baskets and more conversions per impression, so a value
    clipped low (items clipped at 1) keeps a much smaller share, and nothing in the release shows it
    (its clipped sums look like any busy day's). The variance above, learnt from ordinary days, does
    not cover that. Such a day's ratio is instead bounded by a band on what Alg. 1 loses per kept unit:
    the odds o = (1 - r) / r may be up to ``UNSEEN_LOSS_FACTOR`` (k) times the history's or k times
    less, i.e. r in [r / (r + k (1 - r)), r / (r + (1 - r) / k)] (``CalendarAdjustment.band``):
    ``calibration.correct`` takes the union of the intervals over that band. The band scales with
    what a query loses at all -- a count barely capped (r ~ 1) widens little, a value clipped at its
    typical size (r ~ 0.5) widens a lot. With one or two special days in the history (fewer than
    ``MIN_SPECIAL_DAYS``) the band applies around their estimated effect: a sale's later days differ
    from its first (impressions that converted on the first day have less of their lifetime budget
    left), which one or two days cannot show. With more, a special day's ratio is predicted from
    their effect with their own day-to-day spread as its variance, taken at its one-sided 95 % upper
    bound (chi-square with n - 1 degrees of freedom: three days say little about a spread).

The effects are common to all slices (additive on the ratio); a slice x day interaction beyond them is
the calibration's ``interaction_variance``. The shift and variance enter ``calibration.correct``.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any

import numpy as np
from scipy import special as sp_special

from araopt.calibration.accumulator import CalibrationStatistics, _col
from araopt.calibration.model import _Z95_ONE_SIDED, Calibration
from araopt.constants import SPECIAL_DAY_LOSS_FACTOR
from araopt.errors import InvalidInput, InvalidParameters

CALENDAR_FORMAT = "araopt.calendar/1"
DAY_TYPES = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun", "special")
SPECIAL = 7
"""Day type of a declared special day (whatever its weekday)."""
UNSEEN_LOSS_FACTOR = SPECIAL_DAY_LOSS_FACTOR
"""On a declared special day the history holds nothing like, what Alg. 1 loses per kept unit (the odds
(1 - r) / r of each query's retention ratio r) may be up to this many times the history's, or as many
times less (module docstring): a sale's bigger baskets or more conversions per impression, which the
release's own numbers cannot show."""
MIN_SPECIAL_DAYS = 3
"""Special days the history must hold before a special day's ratio is predicted from them like a
weekday's (with their own day-to-day spread); with fewer, the odds band applies around their effect."""
MIN_SPAN_DAYS = 14
"""Day-type effects need a history of at least two weeks (every weekday seen twice)."""
_EPOCH = date(1970, 1, 1)
_EPOCH_WEEKDAY = 3  # 1970-01-01 was a Thursday (Monday = 0)


def chi2_quantile(p: float, dof: float) -> float:
    """The ``p`` quantile of the chi-square distribution with ``dof`` degrees of freedom (what
    ``scipy.stats.chi2.ppf`` computes, bit for bit, without importing scipy.stats: ~1 s of start-up)."""
    return float(2.0 * sp_special.gammaincinv(dof / 2.0, p))


def epoch_day(day: date | str | int | np.integer) -> int:
    """Days since 1970-01-01 of a date, an ISO date string or an epoch day (an int is taken as is)."""
    if isinstance(day, (bool, np.bool_)):
        raise InvalidInput(f"not a date: {day!r}")
    if isinstance(day, (int, np.integer)):
        return int(day)
    if isinstance(day, str):
        try:
            day = date.fromisoformat(day.strip())
        except ValueError:
            raise InvalidInput(f"not an ISO date (YYYY-MM-DD): {day!r}") from None
    if isinstance(day, date):
        return (day - _EPOCH).days
    raise InvalidInput(f"not a date: {day!r}")


def iso_day(day: int) -> str:
    return (_EPOCH + timedelta(days=int(day))).isoformat()


def day_types(days: np.ndarray | Sequence[int], special_days: Sequence[int] = ()) -> np.ndarray:
    """Day type per epoch day: its weekday (Mon = 0), or ``SPECIAL`` for a declared special day."""
    d = np.asarray(days, dtype=np.int64)
    types = np.mod(d + _EPOCH_WEEKDAY, 7)
    if len(special_days):
        types = np.where(np.isin(d, np.asarray(special_days, dtype=np.int64)), SPECIAL, types)
    return types


def parse_special_days(spec: str | Sequence[Any] | None) -> tuple[str, ...]:
    """A declared list of special days: 'YYYY-MM-DD,YYYY-MM-DD,...' or a sequence of dates, as sorted
    unique ISO strings (a bad date is refused with a ValueError naming it)."""
    if spec is None:
        return ()
    items = [s for s in spec.split(",") if s.strip()] if isinstance(spec, str) else list(spec)
    return tuple(sorted({iso_day(epoch_day(s)) for s in items}))


@dataclass(frozen=True)
class CalendarAdjustment:
    """The measured period's ratio shift and the variance of its deviation (d+1 each), the day types
    the calibration could not support (names), and whether day-type effects were applied."""

    shift: np.ndarray
    variance: np.ndarray
    unsupported: tuple[str, ...]
    effects_applied: bool
    unseen_special_weight: float = 0.0  # the period's volume share of special days the history cannot support
    loss_factor: float = UNSEEN_LOSS_FACTOR
    special_days_seen: int = 0  # special days in the history (< MIN_SPECIAL_DAYS: the band applies)

    def band(self, ratio: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(lowest, highest) retention ratio of the period given the history's ``ratio`` (any shape): the
        unseen special days' share ranges over the odds band (module docstring), the rest stays."""
        r = np.asarray(ratio, dtype=np.float64)
        k, w = float(self.loss_factor), float(self.unseen_special_weight)
        low = r / (r + k * (1.0 - r))
        high = r / (r + (1.0 - r) / k)
        return (1.0 - w) * r + w * low, (1.0 - w) * r + w * high

    def note(self) -> str | None:
        """One console line when the calibration cannot support the period (None otherwise)."""
        if not self.unsupported and not self.unseen_special_weight > 0:
            return None
        if self.unsupported:
            text = (f"the calibration's history has no {', '.join(self.unsupported)} day: its retention ratio is "
                    "extrapolated and the intervals are widened for it")
        else:
            text = (f"the calibration's history has only {self.special_days_seen} special day(s) (fewer than "
                    f"{MIN_SPECIAL_DAYS}): a special day's retention ratio is extrapolated from them and the intervals "
                    "are widened for it")
        if self.unseen_special_weight > 0:
            text += (f" (what each query loses per kept unit may be up to {self.loss_factor:g}x the history's: a "
                     f"sale's bigger baskets are not visible in the release)")
        return text


@dataclass(frozen=True, eq=False)
class Calendar:
    """Day-type effects on the retention ratios of one calibration (module docstring).

    Per day type (``DAY_TYPES``; rows K = 8) and quantity (count first, d+1 columns): ``effect`` the
    shrunk effect, ``effect_variance`` its posterior variance, ``raw_effect`` the unshrunk mean; per
    type ``blocks`` (history days of that type) and ``volume`` (their mean conversions). Per quantity:
    ``mean_effect`` mu, ``between_variance`` tau^2, ``day_variance``, ``unseen_variance``.
    ``effects_fitted``: the history spans >= ``MIN_SPAN_DAYS`` days (else no effect is applied).
    """

    retention_checksum: str
    query_names: tuple[str, ...]
    special_days: tuple[str, ...]
    first_day: str
    last_day: str
    effects_fitted: bool
    blocks: np.ndarray
    volume: np.ndarray
    effect: np.ndarray
    effect_variance: np.ndarray
    raw_effect: np.ndarray
    mean_effect: np.ndarray
    between_variance: np.ndarray
    day_variance: np.ndarray
    unseen_variance: np.ndarray
    format: str = CALENDAR_FORMAT
    unseen_loss_factor: float = UNSEEN_LOSS_FACTOR

    def __post_init__(self) -> None:
        _validate(self)

    def check_calibration(self, calibration: Calibration) -> None:
        if calibration.retention_checksum != self.retention_checksum or calibration.query_names != self.query_names:
            raise InvalidInput("the calendar was fitted for another calibration (retention checksum or queries differ)")

    def special(self) -> tuple[int, ...]:
        return tuple(epoch_day(s) for s in self.special_days)

    def adjustment(self, period_days: Sequence[Any], calibration: Calibration) -> CalendarAdjustment:
        """Shift and variance of the ratio of a measured period of ``period_days`` (dates, ISO strings or
        epoch days), in place of ``calibration.period(P)`` (module docstring)."""
        days = np.unique(np.array([epoch_day(d) for d in period_days], dtype=np.int64))
        if len(days) == 0:
            raise InvalidParameters("a measured period needs at least one day")
        types = day_types(days, self.special())
        seen = self.blocks[types] > 0
        d1 = len(self.query_names)
        # weights: the type's mean history volume (an unseen type: the mean over seen types)
        vol_seen = self.volume[self.blocks > 0]
        fill = float(vol_seen.mean()) if len(vol_seen) else 1.0
        w = np.where(seen, self.volume[types], fill)
        w = w / w.sum() if w.sum() > 0 else np.full(len(days), 1.0 / len(days))
        W = np.bincount(types, weights=w, minlength=len(DAY_TYPES))  # (K,) weight per type
        unseen_weight = float(w[~seen].sum())
        unsupported = tuple(DAY_TYPES[k] for k in np.unique(types[~seen]))
        if self.effects_fitted:
            eff = np.where((self.blocks > 0)[:, None], self.effect, self.mean_effect[None, :])
            var_k = np.where((self.blocks > 0)[:, None], self.effect_variance, self.unseen_variance[None, :])
            shift = (W[:, None] * eff).sum(axis=0)
            variance = (W[:, None] ** 2 * var_k).sum(axis=0) + self.day_variance * float((w**2).sum())
        else:
            shift = np.zeros(d1)
            variance = calibration.period(len(days)) + unseen_weight**2 * self.unseen_variance
        special_seen = int(self.blocks[SPECIAL])
        few = (types == SPECIAL) & (special_seen < MIN_SPECIAL_DAYS)
        return CalendarAdjustment(shift, np.maximum(variance, 0.0), unsupported, self.effects_fitted,
                                  float(w[few].sum()), self.unseen_loss_factor, special_seen)

    # ---- serialisation --------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        def arr(a: np.ndarray) -> Any:
            return np.asarray(a).tolist()

        return {"format": self.format, "retention_checksum": self.retention_checksum,
                "query_names": list(self.query_names), "special_days": list(self.special_days),
                "first_day": self.first_day, "last_day": self.last_day, "effects_fitted": bool(self.effects_fitted),
                "day_types": list(DAY_TYPES), "blocks": arr(self.blocks), "volume": arr(self.volume),
                "effect": arr(self.effect), "effect_variance": arr(self.effect_variance),
                "raw_effect": arr(self.raw_effect), "mean_effect": arr(self.mean_effect),
                "between_variance": arr(self.between_variance), "day_variance": arr(self.day_variance),
                "unseen_variance": arr(self.unseen_variance), "unseen_loss_factor": float(self.unseen_loss_factor)}

    @classmethod
    def from_json(cls, data: Any, source: str = "calendar") -> Calendar:
        if not isinstance(data, Mapping):
            raise InvalidInput(f"{source}: must be a JSON object")
        if data.get("format") != CALENDAR_FORMAT:
            raise InvalidInput(f"{source}: unsupported format {data.get('format')!r}; expected {CALENDAR_FORMAT!r}")
        if list(data.get("day_types", DAY_TYPES)) != list(DAY_TYPES):
            raise InvalidInput(f"{source}: day types must be {list(DAY_TYPES)}")
        try:
            def f(name: str) -> np.ndarray:
                return np.asarray(data[name], dtype=np.float64)

            return cls(retention_checksum=data["retention_checksum"], query_names=tuple(data["query_names"]),
                       special_days=parse_special_days(list(data["special_days"])), first_day=str(data["first_day"]),
                       last_day=str(data["last_day"]), effects_fitted=bool(data["effects_fitted"]),
                       blocks=f("blocks"), volume=f("volume"), effect=f("effect"),
                       effect_variance=f("effect_variance"), raw_effect=f("raw_effect"), mean_effect=f("mean_effect"),
                       between_variance=f("between_variance"), day_variance=f("day_variance"),
                       unseen_variance=f("unseen_variance"), format=data["format"],
                       unseen_loss_factor=float(data.get("unseen_loss_factor", UNSEEN_LOSS_FACTOR)))
        except KeyError as exc:
            raise InvalidInput(f"{source}: missing field {exc.args[0]!r}") from None
        except (TypeError, ValueError) as exc:
            raise InvalidInput(f"{source}: {exc}") from None

    def checksum(self) -> str:
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode("utf-8")).hexdigest()


def _validate(cal: Calendar) -> None:
    K, d1 = len(DAY_TYPES), len(cal.query_names)
    if not cal.query_names or cal.query_names[0] != "count":
        raise InvalidInput(f"calendar query_names must start with 'count', got {cal.query_names!r}")
    for name, shape in (("blocks", (K,)), ("volume", (K,)), ("effect", (K, d1)), ("effect_variance", (K, d1)),
                        ("raw_effect", (K, d1)), ("mean_effect", (d1,)), ("between_variance", (d1,)),
                        ("day_variance", (d1,)), ("unseen_variance", (d1,))):
        a = np.asarray(getattr(cal, name))
        if a.shape != shape:
            raise InvalidInput(f"calendar field {name} has shape {a.shape}, expected {shape}")
        if not np.isfinite(a).all():
            raise InvalidInput(f"calendar field {name} must be finite")
    for name in ("blocks", "volume", "effect_variance", "between_variance", "day_variance", "unseen_variance"):
        if (np.asarray(getattr(cal, name)) < 0).any():
            raise InvalidInput(f"calendar field {name} must be >= 0")
    for name in ("effect", "raw_effect", "mean_effect"):
        if (np.abs(np.asarray(getattr(cal, name))) > 1).any():
            raise InvalidInput(f"calendar field {name}: a ratio shift lies in [-1, 1]")
    epoch_day(cal.first_day), epoch_day(cal.last_day)
    if not (np.isfinite(cal.unseen_loss_factor) and cal.unseen_loss_factor >= 1.0):
        raise InvalidInput(f"calendar field unseen_loss_factor must be a finite number >= 1, got {cal.unseen_loss_factor!r}")


def _dersimonian_laird(x: np.ndarray, v: np.ndarray) -> tuple[float, float, float, float]:
    """(tau^2, its one-sided 95 % upper bound, random-effects mean, its variance) of estimates ``x`` with
    sampling variances ``v`` (> 0)."""
    w = 1.0 / v
    k = len(x)
    sw = float(w.sum())
    mu_fe = float((w * x).sum() / sw)
    Q = float((w * (x - mu_fe) ** 2).sum())
    denom = sw - float((w**2).sum()) / sw
    if k < 2 or denom <= 0:
        return 0.0, 0.0, mu_fe, 1.0 / sw
    tau2 = max(0.0, (Q - (k - 1)) / denom)
    upper = max(0.0, (Q - (k - 1) + _Z95_ONE_SIDED * np.sqrt(2.0 * (k - 1))) / denom)
    wr = 1.0 / (v + tau2)
    return tau2, upper, float((wr * x).sum() / wr.sum()), float(1.0 / wr.sum())


def _block_days(block_keys: Sequence[Any]) -> np.ndarray | None:
    """Epoch days of the statistics' blocks, or None when blocks are not days (e.g. random parts)."""
    try:
        return np.array([epoch_day(b) if not isinstance(b, (float, np.floating)) else int(b) for b in block_keys],
                        dtype=np.int64)
    except (ValueError, TypeError):
        return None


def fit_calendar(stats: CalibrationStatistics, calibration: Calibration,
                 special_days: Sequence[Any] = (), unseen_loss_factor: float = UNSEEN_LOSS_FACTOR) -> Calendar | None:
    """Day-type effects (module docstring) of the history in ``stats`` (blocks = conversion days, as
    ``calibration.day_blocks`` gives them), relative to the slices' long-run ratios. None when the
    blocks are not days."""
    days = _block_days(stats.block_keys)
    if days is None or len(days) == 0:
        return None
    specials = parse_special_days(list(special_days))
    types = day_types(days, [epoch_day(s) for s in specials])
    K, d = len(DAY_TYPES), stats.num_queries
    span = int(days.max() - days.min() + 1)
    fitted = span >= MIN_SPAN_DAYS
    N_b = stats.quantity(0, "T").sum(axis=0)
    has = N_b > 0
    blocks = np.bincount(types[has], minlength=K).astype(np.float64)
    volume = np.bincount(types[has], weights=N_b[has], minlength=K) / np.maximum(blocks, 1.0)
    shape = (K, d + 1)
    effect, effect_var, raw = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    mean_eff, between, day_var, unseen = (np.zeros(d + 1) for _ in range(4))
    for q in range(d + 1):
        T, X = stats.quantity(q, "T"), stats.quantity(q, "X")
        Stt, Stx, Sxx = (stats.cells[:, :, _col(q, w)] for w in ("Stt", "Stx", "Sxx"))
        T_j = T.sum(axis=1)
        valid = T_j > 0
        r_j = np.where(valid, X.sum(axis=1) / np.where(valid, T_j, 1.0), 0.0)[:, None]
        R_b = np.where(valid[:, None], X - r_j * T, 0.0).sum(axis=0)
        T_b = np.where(valid[:, None], T, 0.0).sum(axis=0)
        SS_b = np.where(valid[:, None], np.maximum(Sxx - 2 * r_j * Stx + r_j**2 * Stt, 0.0), 0.0).sum(axis=0)
        ok = T_b > 0
        if not ok.any():
            continue
        dev = R_b[ok] / T_b[ok]
        samp = SS_b[ok] / T_b[ok] ** 2
        t = types[ok]
        n_k = np.bincount(t, minlength=K).astype(np.float64)
        mean_k = np.bincount(t, weights=dev, minlength=K) / np.maximum(n_k, 1.0)
        dof = float((np.maximum(n_k - 1.0, 0.0)).sum())
        marginal = max(0.0, float(np.mean(dev**2 - samp)))  # a day's deviation, cycle and all
        if not fitted or dof < 1:
            unseen[q] = max(marginal, float(np.max(dev**2)))
            day_var[q] = marginal
            continue
        within = float(((dev - mean_k[t]) ** 2).sum()) / dof  # a day's deviation within its type, sampling included
        day_var[q] = max(0.0, within - float(samp.mean()))
        seen = n_k > 0
        v_k = np.maximum(within, 1e-14) / n_k[seen]
        tau2, tau2_upper, mu, mu_var = _dersimonian_laird(mean_k[seen], v_k)
        B = v_k / (v_k + tau2) if tau2 > 0 else np.ones_like(v_k)
        effect[seen, q] = mu + (1.0 - B) * (mean_k[seen] - mu)
        effect_var[seen, q] = (1.0 - B) * v_k + B**2 * mu_var
        raw[seen, q] = mean_k[seen]
        mean_eff[q], between[q] = mu, tau2
        special = t == SPECIAL
        if special.sum() >= 2:  # a new special day deviates from their mean as much as they do from each other
            n_special = float(special.sum())
            own = max(0.0, float(np.var(dev[special], ddof=1)) - float(samp[special].mean()))
            # from a handful of days: the variance's one-sided 95 % upper bound (chi-square, n - 1 dof)
            own_upper = own * (n_special - 1.0) / chi2_quantile(0.05, n_special - 1.0)
            effect_var[SPECIAL, q] = max(effect_var[SPECIAL, q], own_upper * (1.0 + 1.0 / n_special))
        unseen[q] = max(tau2_upper, float(np.max((mean_k[seen] - mu) ** 2))) + mu_var
    return Calendar(retention_checksum=calibration.retention_checksum, query_names=calibration.query_names,
                    special_days=specials, first_day=iso_day(int(days.min())), last_day=iso_day(int(days.max())),
                    effects_fitted=fitted, blocks=blocks, volume=volume, effect=np.clip(effect, -1.0, 1.0),
                    effect_variance=effect_var, raw_effect=np.clip(raw, -1.0, 1.0), mean_effect=np.clip(mean_eff, -1, 1),
                    between_variance=between, day_variance=day_var, unseen_variance=unseen,
                    unseen_loss_factor=float(unseen_loss_factor))
