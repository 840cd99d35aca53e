"""Synthetic conversion logs: the generative model of Sec. 5.3 (Defs. 5.1-5.3, Table synthetic-datasets).

Model (Sec. 5.3.1 "Dataset Generation", features of Table impression-dimensions)
  Step 1  impressions per slice ~ PowerLaw(b, k_min, k_max) (Def. 5.1), drawn independently for
          each of the T = 16 x 8 x 2 = 256 slices (campaignId x geography x productCategory).
  Step 2  conversions per impression ~ Poisson(lam) (Def. 5.2). Impressions with zero
          conversions produce no record. Each conversion gets a uniform conversionType in 0..4.
  Step 3  conversion value ~ LogNormal(mu, sigma) (Def. 5.3), i.i.d. per conversion.
The output is one row per conversion in the conversion-log contract (schemas/conversion_log.md).

Power-law sampling: what is exact and what is approximate
  The paper's footnote samples Def. 5.1 with the approximation of Clauset, Shalizi & Newman (2009),
  Appendix D, eq. (D.6): x = floor((k_min - 1/2) (1 - r)^(-1/(b-1)) + 1/2). That is the
  continuous power law on [k_min - 1/2, inf) rounded to the nearest integer. Its pmf is
  P(k) ~ integral of x^-b over [k - 1/2, k + 1/2], not k^-b. It is accurate for large k but not
  for the smallest ones. For k_min = 1 and b = 2.88 it gives P(2)/P(1) = 0.090 where Def. 5.1
  says 2^-2.88 = 0.136, so it is 34 % off, and 8.5 % off for b = 1.14. It needs b > 1, and the
  paper's synth-real-estate preset has b = 0.06.
  * method="exact" (the default) samples Def. 5.1 itself. It inverts the discrete CDF
    (np.searchsorted over the cumulative weights k^-b) for the first 2^20 support points, which
    covers the whole support whenever k_max - k_min < 2^20 (all presets at scale <= 100).
    Beyond that it uses the rounded continuous law on [k - 1/2, k + 1/2]. Its relative pmf error
    there is about b(b+1)/(24 k^2) < 1e-10 for k > 2^20. The normaliser Z(b) uses the same head
    sum plus tail integral, so the sampler, pmf(), mean() and fit_synthetic agree exactly.
  * method="clauset" keeps the paper's approximation, bounded: the continuous power law on
    [k_min - 1/2, k_max + 1/2], sampled by inverse CDF (valid for every b > 0, including b <= 1).
    With k_max = inf and b > 1 this is eq. (D.6) exactly. It is kept for fidelity to the paper's
    footnote, and the tests show how far it is from Def. 5.1.

Scale knob
  ``scale`` s multiplies the power-law support:
  k_min' = max(1, floor(s k_min + 1/2)) and k_max' = max(k_min', floor(s k_max + 1/2)).
  b, lam, mu, sigma and the 256 slices stay the same, and the data is still an exact Def. 5.1
  draw (with bounds k_min', k_max'). For a continuous power law X' = sX in distribution, so
  expected impressions and conversions grow about linearly in s. The growth is exact for b near 0
  and approximate when k_min' is small: for synth-criteo, E[X] is 1.44 at s = 1 and 20.3 at
  s = 10. ``expected_sizes`` gives the exact expectations, and ``scale_for_target_conversions``
  inverts them.

Time and partitions
  Impression times are uniform over the day(s) [start_date, start_date + days). An impression's
  conversions fall in its attribution window [impression_time, impression_time + 30 days) by
  default. They are spread like sorted uniforms, made with exponential spacings, and every
  conversion time is distinct: conversion j of an impression gets offset
  floor(U_(j) (W - n)) + j microseconds, with U_(j) the j-th uniform order statistic. So the order
  used by a per-impression count cap is always defined. Rows of an impression are contiguous and
  sorted by conversion_time.
  With ``days``, an impression and all of its conversions go to the partition of its impression
  date, date=YYYY-MM-DD/part-*.parquet. The conversion date can be up to 30 days later. A day's
  partition is then self-contained for contribution bounding per impression. Each slice's
  impression count is split over the days by a multinomial draw.

Determinism
  Randomness comes only from ``numpy.random.Generator`` objects seeded by SeedSequence(seed,
  spawn_key=...). The counts use key (split, 0). Each block of impressions uses key
  (split, 1, day, block); a block holds a fixed number of impressions that depends only on lam.
  The output depends only on (preset, scale, seed, split, days, start_date, method). ``chunk_rows``
  and the file size limits only change file boundaries. Train and test use different split keys,
  so they are independent draws. This is simulation data, not privacy noise, so seeding is
  intended.

Why a plain chunked writer and not a Beam pipeline
  Each record costs a few vectorized numpy operations. About 12M rows are generated and 10M rows
  of Parquet (snappy) are written per CPU-second, and a second thread encodes Parquet while the
  next chunk is generated. Per-element overhead in Beam's Python SDK would cost more than the
  whole generator. Memory is bounded by construction. At most two chunks of about
  ``chunk_rows`` rows are alive at a time: one being generated and one being written. Blocks
  are keyed deterministically, so a Beam/Dataflow fan-out (one element per block, ParDo ->
  RecordBatch -> WriteToParquet) would produce the same rows if generation ever has to be
  distributed.
"""
from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from araopt.data.users import deal_browsers
from araopt.errors import InvalidInput, InvalidParameters, Unsupported
from araopt.io import jsonio
from araopt.io.files import atomic_write_bytes
from araopt.io.folders import OutputFolder, ParquetShardWriter, check_output_file, check_parent_folder

# --------------------------------------------------------------------------------------------
# Features (Table impression-dimensions) and the output schema (schemas/conversion_log.arrow.json)
# --------------------------------------------------------------------------------------------

IMPRESSION_FEATURES: tuple[tuple[str, int], ...] = (("campaignId", 16), ("geography", 8), ("productCategory", 2))
IMPRESSION_FEATURE_NAMES: tuple[str, ...] = tuple(name for name, _ in IMPRESSION_FEATURES)
N_SLICES: int = math.prod(card for _, card in IMPRESSION_FEATURES)  # T = 256 (Sec. 5.3.1, Step 1)
N_CONVERSION_TYPES: int = 5
SPLITS: tuple[str, ...] = ("train", "test")
# Impression ids are unique within a split; test ids start at 2^48 so a union of train and test
# never collides (not required by the contract, but it prevents accidental joins).
SPLIT_ID_OFFSET: Mapping[str, int] = MappingProxyType({"train": 0, "test": 1 << 48})
DEFAULT_START_DATE = date(2024, 1, 1)
PRESET_FORMAT = "araopt.synthetic-preset/1"

_US_PER_DAY = 86_400_000_000
_HEAD = 1 << 20  # support points sampled/summed exactly (see module docstring)
_UTC_US = pa.timestamp("us", tz="UTC")

CONVERSION_LOG_SCHEMA = pa.schema(
    [
        pa.field("impression_id", pa.int64(), nullable=False),
        pa.field("conversion_time", _UTC_US, nullable=False),
        pa.field("campaignId", pa.int32(), nullable=False),
        pa.field("geography", pa.int32(), nullable=False),
        pa.field("productCategory", pa.int32(), nullable=False),
        pa.field("conversionType", pa.int32(), nullable=False),
        pa.field("value", pa.float64(), nullable=False),
        pa.field("impression_time", _UTC_US, nullable=False),
        pa.field("browser_id", pa.int64(), nullable=False),
    ],
    metadata={"araopt.schema": "conversion_log/1", "araopt.source": "araopt.synthetic"},
)
_DICTIONARY_COLUMNS = ("campaignId", "geography", "productCategory", "conversionType")


def _check_finite(name: str, x: float) -> float:
    try:
        x = float(x)
    except (TypeError, ValueError):
        raise InvalidParameters(f"{name} must be a number, got {x!r}") from None
    if not math.isfinite(x):
        raise InvalidParameters(f"{name} must be finite, got {x}")
    return x


def check_int(name: str, x: Any) -> int:
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        if isinstance(x, float) and x.is_integer():
            return int(x)
        raise InvalidParameters(f"{name} must be an integer, got {x!r}")
    return int(x)


# --------------------------------------------------------------------------------------------
# Step 1: the power law of Def. 5.1
# --------------------------------------------------------------------------------------------

def _integral_pow(lo: float, hi: float, b: float) -> float:
    """Integral of x^-b over [lo, hi] (0 < lo <= hi), stable for b near 1."""
    g = 1.0 - b
    log_ratio = math.log(hi / lo)
    if abs(g * log_ratio) < 1e-12:
        return cast(float, lo**g * log_ratio)
    return cast(float, lo**g * math.expm1(g * log_ratio) / g)


def _continuous_ppf(v: np.ndarray, lo: float, hi: float, b: float) -> np.ndarray:
    """Inverse CDF of the density proportional to x^-b on [lo, hi] at v in [0, 1)."""
    g = 1.0 - b
    log_ratio = math.log(hi / lo)
    if abs(g * log_ratio) < 1e-12:
        return lo * np.exp(v * log_ratio)
    return lo * np.exp(np.log1p(v * math.expm1(g * log_ratio)) / g)


@dataclass(frozen=True)
class PowerLaw:
    """The bounded discrete power law of Def. 5.1: P(k) = k^-b / sum_{j=k_min}^{k_max} j^-b."""

    b: float
    k_min: int
    k_max: int

    def __post_init__(self) -> None:
        b = _check_finite("b", self.b)
        if b <= 0:
            raise InvalidParameters(f"power-law shape b must be > 0 (Def. 5.1), got {b}")
        k_min, k_max = check_int("k_min", self.k_min), check_int("k_max", self.k_max)
        if k_min < 1:
            raise InvalidParameters(f"k_min must be >= 1, got {k_min}")
        if k_max < k_min:
            raise InvalidParameters(f"k_max must be >= k_min, got k_min={k_min}, k_max={k_max}")
        object.__setattr__(self, "b", b)
        object.__setattr__(self, "k_min", k_min)
        object.__setattr__(self, "k_max", k_max)

    @property
    def head_max(self) -> int:
        """Largest support point that is summed/sampled exactly."""
        return min(self.k_max, self.k_min + _HEAD - 1)

    @cached_property
    def _table(self) -> tuple[np.ndarray, float]:
        """Cumulative weights (k/k_min)^-b over the exact head, and the tail weight."""
        ks = np.arange(self.k_min, self.head_max + 1, dtype=np.float64)
        cum = np.cumsum(np.exp(-self.b * np.log(ks / self.k_min)))
        tail = 0.0
        if self.k_max > self.head_max:
            lo, hi = (self.head_max + 0.5) / self.k_min, (self.k_max + 0.5) / self.k_min
            tail = self.k_min * _integral_pow(lo, hi, self.b)
        return cum, tail

    @property
    def _total(self) -> float:
        cum, tail = self._table
        return float(cum[-1]) + tail

    def log_normalizer(self) -> float:
        """log Z(b), Z(b) = sum_{k=k_min}^{k_max} k^-b (tail beyond 2^20 points by integral)."""
        return -self.b * math.log(self.k_min) + math.log(self._total)

    def pmf(self, k: np.ndarray | int) -> np.ndarray:
        """Def. 5.1 pmf (0 outside [k_min, k_max])."""
        k = np.asarray(k, dtype=np.float64)
        inside = (k >= self.k_min) & (k <= self.k_max)
        safe = np.where(inside, k, self.k_min)
        return np.where(inside, np.exp(-self.b * np.log(safe / self.k_min)) / self._total, 0.0)

    def mean(self) -> float:
        """E[X] (exact over the head, integral over the tail)."""
        ks = np.arange(self.k_min, self.head_max + 1, dtype=np.float64)
        head = float(np.sum(ks * np.exp(-self.b * np.log(ks / self.k_min))))
        tail = 0.0
        if self.k_max > self.head_max:
            lo, hi = (self.head_max + 0.5) / self.k_min, (self.k_max + 0.5) / self.k_min
            tail = self.k_min**2 * _integral_pow(lo, hi, self.b - 1.0)
        return (head + tail) / self._total

    def var_log(self) -> float:
        """Var[log X] = d^2/db^2 log Z(b), the Fisher information of b per observation."""
        h = min(1e-4 * max(1.0, self.b), self.b / 2)
        f = [PowerLaw(self.b + s * h, self.k_min, self.k_max).log_normalizer() for s in (-1, 0, 1)]
        return max(0.0, (f[0] - 2.0 * f[1] + f[2]) / h**2)

    def sample(self, rng: np.random.Generator, size: int, method: str = "exact") -> np.ndarray:
        """``size`` i.i.d. draws (int64); see the module docstring for ``method``."""
        u = rng.random(size)
        if method == "exact":
            return self.ppf_exact(u)
        if method == "clauset":
            return self.ppf_clauset(u)
        raise InvalidParameters(f"unknown power-law sampler {method!r}; expected 'exact' or 'clauset'")

    def ppf_exact(self, u: np.ndarray) -> np.ndarray:
        """Def. 5.1 quantile function at u in [0, 1) (exact on the head, see module docstring)."""
        cum, tail = self._table
        t = np.asarray(u, dtype=np.float64) * (float(cum[-1]) + tail)
        idx = np.searchsorted(cum, t, side="right")
        k = self.k_min + idx.astype(np.int64)
        in_tail = idx >= cum.size
        if np.any(in_tail):
            v = np.clip((t[in_tail] - cum[-1]) / tail, 0.0, 1.0 - 1e-16)
            lo, hi = self.head_max + 0.5, self.k_max + 0.5
            x = np.floor(_continuous_ppf(v, lo, hi, self.b) + 0.5)
            k[in_tail] = np.clip(x, self.head_max + 1, self.k_max).astype(np.int64)
        return k

    def ppf_clauset(self, u: np.ndarray) -> np.ndarray:
        """Clauset et al. (2009) eq. (D.6), truncated to [k_min - 1/2, k_max + 1/2] (approximate)."""
        lo, hi = self.k_min - 0.5, self.k_max + 0.5
        x = np.floor(_continuous_ppf(np.asarray(u, dtype=np.float64), lo, hi, self.b) + 0.5)
        return np.clip(x, self.k_min, self.k_max).astype(np.int64)

    def clauset_pmf(self, k: np.ndarray | int) -> np.ndarray:
        """pmf actually sampled by ``ppf_clauset``: integral of x^-b over [k-1/2, k+1/2], normalised."""
        k = np.atleast_1d(np.asarray(k, dtype=np.float64))
        total = _integral_pow(self.k_min - 0.5, self.k_max + 0.5, self.b)
        out = np.array([_integral_pow(x - 0.5, x + 0.5, self.b) if self.k_min <= x <= self.k_max else 0.0
                        for x in k.ravel()])
        return out.reshape(k.shape) / total


# --------------------------------------------------------------------------------------------
# Presets (Table synthetic-datasets)
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SyntheticPreset:
    """Parameters of the Sec. 5.3 generator; invalid values raise ValueError.

    b: power-law shape (Def. 5.1, > 0); lam: Poisson mean of conversions per impression
    (Def. 5.2, >= 0); mu, sigma: log-normal value parameters (Def. 5.3, sigma > 0);
    k_min, k_max: power-law support (k_max finite: needed for b <= 1 and keeps sizes bounded);
    attribution_window_days: window after the impression in which its conversions fall;
    impressions_per_user: mean impressions per browser (``browser_id``, the W3C Attribution target's
    privacy unit: a day's impressions dealt to browsers in time order, ``users.deal_browsers``).
    """

    name: str
    b: float
    lam: float
    mu: float
    sigma: float
    k_min: int = 1
    k_max: int = 10_000
    attribution_window_days: int = 30
    impressions_per_user: float = 3.0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidParameters(f"preset name must be a non-empty string, got {self.name!r}")
        lam = _check_finite("lam", self.lam)
        if lam < 0:
            raise InvalidParameters(f"Poisson rate lam must be >= 0 (Def. 5.2), got {lam}")
        mu = _check_finite("mu", self.mu)
        sigma = _check_finite("sigma", self.sigma)
        if sigma <= 0:
            raise InvalidParameters(f"log-normal sigma must be > 0 (Def. 5.3), got {sigma}")
        window = check_int("attribution_window_days", self.attribution_window_days)
        if window < 1:
            raise InvalidParameters(f"attribution_window_days must be >= 1, got {window}")
        per_user = _check_finite("impressions_per_user", self.impressions_per_user)
        if per_user < 1:
            raise InvalidParameters(f"impressions_per_user must be >= 1, got {per_user}")
        object.__setattr__(self, "impressions_per_user", per_user)
        law = PowerLaw(self.b, self.k_min, self.k_max)  # validates b, k_min, k_max
        for name, value in (("b", law.b), ("k_min", law.k_min), ("k_max", law.k_max), ("lam", lam),
                            ("mu", mu), ("sigma", sigma), ("attribution_window_days", window)):
            object.__setattr__(self, name, value)

    @property
    def power_law(self) -> PowerLaw:
        return PowerLaw(self.b, self.k_min, self.k_max)

    def scaled(self, scale: float) -> SyntheticPreset:
        """The preset with its power-law support multiplied by ``scale`` (module docstring)."""
        s = _check_finite("scale", scale)
        if s <= 0:
            raise InvalidParameters(f"scale must be > 0, got {s}")
        if s == 1.0:
            return self
        k_min = max(1, math.floor(self.k_min * s + 0.5))
        k_max = max(k_min, math.floor(self.k_max * s + 0.5))
        return replace(self, k_min=k_min, k_max=k_max)

    def to_dict(self) -> dict[str, Any]:
        return {"format": PRESET_FORMAT, **asdict(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SyntheticPreset:
        """Inverse of ``to_dict``; unknown keys are an error (catches typos like "lambda")."""
        if not isinstance(data, Mapping):
            raise InvalidInput(f"a preset must be a JSON object, got {type(data).__name__}")
        allowed = {f for f in cls.__dataclass_fields__} | {"format", "fit"}
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise InvalidInput(f"unknown preset key(s) {unknown}; allowed: {sorted(allowed)}")
        fmt = data.get("format", PRESET_FORMAT)
        if fmt != PRESET_FORMAT:
            raise Unsupported(f"unsupported preset format {fmt!r}; expected {PRESET_FORMAT!r}")
        missing = [k for k in ("name", "b", "lam", "mu", "sigma") if k not in data]
        if missing:
            raise InvalidInput(f"preset is missing key(s) {missing}")
        return cls(**{k: v for k, v in data.items() if k not in ("format", "fit")})


PRESETS: Mapping[str, SyntheticPreset] = MappingProxyType({
    p.name: p for p in (
        SyntheticPreset("synth-criteo", b=2.88, lam=10.0, mu=4.19, sigma=1.16),
        SyntheticPreset("synth-real-estate", b=0.06, lam=10.0, mu=0.87, sigma=0.43),
        SyntheticPreset("synth-travel", b=1.14, lam=10.0, mu=1.95, sigma=1.14),
    )
})


def get_preset(name_or_path: str | os.PathLike[str]) -> SyntheticPreset:
    """A preset by name (``PRESETS``) or from a preset JSON file (as written by fit-synthetic)."""
    key = os.fspath(name_or_path)
    if key in PRESETS:
        return PRESETS[key]
    if key.endswith(".json") or os.sep in key:
        if not os.path.isfile(key):
            raise InvalidInput(f"preset file {key!r} does not exist")
        return load_preset(key)
    raise InvalidParameters(f"unknown preset {key!r}; known presets: {', '.join(PRESETS)} (or a preset .json file)")


def load_preset(path: str | os.PathLike[str]) -> SyntheticPreset:
    data = jsonio.load(path, "preset file")
    try:
        return SyntheticPreset.from_dict(data)
    except (TypeError, ValueError) as e:
        raise InvalidInput(f"preset file {os.fspath(path)!r}: {e}") from None


def save_preset(preset: SyntheticPreset, path: str | os.PathLike[str], *, fit: Mapping[str, Any] | None = None,
                overwrite: bool = False) -> None:
    """Write a preset JSON (``fit`` diagnostics are stored alongside and ignored on load)."""
    path = Path(path)
    check_output_file(path, overwrite)
    data = preset.to_dict()
    if fit is not None:
        data["fit"] = dict(fit)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, (jsonio.dumps(data, indent=2, sort_keys=False) + "\n").encode("utf-8"))


def expected_sizes(preset: SyntheticPreset, scale: float = 1.0) -> dict[str, float]:
    """Expected impressions and conversions of one split (256 slices x E[X], x lam)."""
    eff = preset.scaled(scale)
    impressions = N_SLICES * eff.power_law.mean()
    return {"impressions": impressions, "conversions": impressions * eff.lam,
            "k_min": eff.k_min, "k_max": eff.k_max}


def scale_for_target_conversions(preset: SyntheticPreset, target: float) -> float:
    """Smallest scale (to 0.1 %) whose expected conversions per split reach ``target``."""
    target = _check_finite("target conversions", target)
    if target <= 0:
        raise InvalidParameters(f"target conversions must be > 0, got {target}")
    if preset.lam == 0:
        raise InvalidParameters("lam = 0 generates no conversions; no scale reaches a conversion target")
    lo = 0.5 / max(preset.k_max, 1)  # support collapses to [1, 1]
    minimum = expected_sizes(preset, lo)["conversions"]
    if target <= minimum:
        return lo
    hi = 1.0
    while expected_sizes(preset, hi)["conversions"] < target:
        hi *= 4.0
        if hi > 1e12:
            raise InvalidParameters(f"target {target:g} conversions is out of reach for preset {preset.name!r}")
    while hi / lo > 1.001:
        mid = math.sqrt(lo * hi)
        if expected_sizes(preset, mid)["conversions"] >= target:
            hi = mid
        else:
            lo = mid
    return hi


# --------------------------------------------------------------------------------------------
# Generation (Steps 1-3), chunked
# --------------------------------------------------------------------------------------------

def _seed_sequence(seed: int, *key: int) -> np.random.SeedSequence:
    return np.random.SeedSequence(entropy=seed, spawn_key=tuple(key))


def _check_seed(seed: int) -> int:
    seed = check_int("seed", seed)
    if seed < 0:
        raise InvalidParameters(f"seed must be >= 0, got {seed}")
    return seed


def _block_impressions(lam: float) -> int:
    """Impressions per RNG block: a power of two with about 2^19 expected rows (depends on lam only)."""
    if lam <= 0:
        return 1 << 20
    return 1 << int(min(20, max(0, math.floor(math.log2((1 << 19) / lam)))))


@dataclass(frozen=True, eq=False)
class ImpressionPlan:
    """Step 1 result: impressions per (day, slice), and everything needed to generate the rows."""

    preset: SyntheticPreset  # effective (already scaled)
    seed: int
    split: str
    start_date: date
    counts: np.ndarray = field(repr=False)  # (days, N_SLICES) int64
    scale: float = 1.0
    power_law_method: str = "exact"

    @property
    def days(self) -> int:
        return int(self.counts.shape[0])

    @property
    def slice_counts(self) -> np.ndarray:
        """Impressions per slice over all days (the Step 1 power-law draws)."""
        return cast(np.ndarray, self.counts.sum(axis=0))

    @property
    def n_impressions(self) -> int:
        return int(self.counts.sum())

    def day(self, d: int) -> date:
        return self.start_date + timedelta(days=d)


def plan_impressions(preset: SyntheticPreset, *, seed: int, split: str = "train", scale: float = 1.0,
                     days: int = 1, start_date: date = DEFAULT_START_DATE,
                     power_law_method: str = "exact") -> ImpressionPlan:
    """Step 1: one power-law draw per slice, split uniformly over ``days`` by a multinomial."""
    seed = _check_seed(seed)
    if split not in SPLITS:
        raise InvalidParameters(f"split must be one of {SPLITS}, got {split!r}")
    days = check_int("days", days)
    if days < 1:
        raise InvalidParameters(f"days must be >= 1, got {days}")
    if power_law_method not in ("exact", "clauset"):
        raise InvalidParameters(f"unknown power-law sampler {power_law_method!r}; expected 'exact' or 'clauset'")
    eff = preset.scaled(scale)
    rng = np.random.default_rng(_seed_sequence(seed, SPLITS.index(split), 0))
    per_slice = eff.power_law.sample(rng, N_SLICES, method=power_law_method)
    if days == 1:
        counts = per_slice[None, :].astype(np.int64)
    else:
        counts = rng.multinomial(per_slice, np.full(days, 1.0 / days)).T.astype(np.int64)
    return ImpressionPlan(eff, seed, split, start_date, counts, float(scale), power_law_method)


def _slice_features(slice_index: np.ndarray) -> dict[str, np.ndarray]:
    """Mixed-radix decoding: slice = (campaignId * 8 + geography) * 2 + productCategory."""
    out: dict[str, np.ndarray] = {}
    rest = slice_index
    for name, card in reversed(IMPRESSION_FEATURES):
        out[name] = (rest % card).astype(np.int32)
        rest = rest // card
    return {name: out[name] for name in IMPRESSION_FEATURE_NAMES}


def _generate_block(plan: ImpressionPlan, day: int, block: int, cum_counts: np.ndarray,
                    i0: int, i1: int, id_base: int) -> dict[str, np.ndarray]:
    """Steps 2-3 for impressions [i0, i1) of one day (slice-major order); vectorized."""
    preset = plan.preset
    rng = np.random.default_rng(_seed_sequence(plan.seed, SPLITS.index(plan.split), 1, day, block))
    n_imp = i1 - i0
    local = np.arange(i0, i1, dtype=np.int64)
    slice_of = np.searchsorted(cum_counts, local, side="right")
    day_start_us = int(datetime(plan.start_date.year, plan.start_date.month, plan.start_date.day,
                                tzinfo=UTC).timestamp()) * 1_000_000 + day * _US_PER_DAY
    imp_time = day_start_us + rng.integers(0, _US_PER_DAY, n_imp, dtype=np.int64)
    n_conv = rng.poisson(preset.lam, n_imp).astype(np.int64)  # Step 2
    rows = int(n_conv.sum())
    has = n_conv > 0
    n_nz = n_conv[has]
    rep = np.repeat(np.arange(n_imp, dtype=np.int64), n_conv)  # impression (block-local) of each row

    # Conversion times: order statistics of n uniforms via n+1 exponential spacings per impression.
    expo = rng.standard_exponential(rows + n_nz.size)
    csum = np.concatenate(([0.0], np.cumsum(expo)))
    row_start = np.cumsum(n_nz) - n_nz  # first row of each converting impression
    rank = np.arange(n_nz.size, dtype=np.int64)
    slot_start = row_start + rank  # each earlier impression used one extra (n+1-th) spacing
    base = csum[slot_start]
    total = csum[slot_start + n_nz + 1] - base
    imp_rank = np.repeat(rank, n_nz)
    j = np.arange(rows, dtype=np.int64) - row_start[imp_rank]
    frac = (csum[np.arange(rows, dtype=np.int64) + imp_rank + 1] - base[imp_rank]) / total[imp_rank]
    window_us = preset.attribution_window_days * _US_PER_DAY
    offset = np.floor(frac * (window_us - n_nz[imp_rank]).astype(np.float64)).astype(np.int64) + j

    cols: dict[str, np.ndarray] = {
        "impression_id": id_base + i0 + rep,
        "conversion_time": imp_time[rep] + offset,
    }
    cols.update(_slice_features(slice_of[rep]))
    cols["conversionType"] = rng.integers(0, N_CONVERSION_TYPES, rows, dtype=np.int32)
    cols["value"] = rng.lognormal(preset.mu, preset.sigma, rows)  # Step 3
    cols["impression_time"] = imp_time[rep]
    cols["browser_id"] = _browsers(plan, day, block, imp_time, id_base + i0)[rep]
    return cols


def _browsers(plan: ImpressionPlan, day: int, block: int, imp_time: np.ndarray, first_id: int) -> np.ndarray:
    """Each impression's ``browser_id``: the block's impressions dealt to browsers in time order, in
    runs of Geometric(1 / impressions_per_user) (``users.deal_browsers``); a browser's id is the
    smallest impression id among its impressions (unique in the split). Its own random stream: the other
    columns are those of a log without users."""
    rng = np.random.default_rng(_seed_sequence(plan.seed, SPLITS.index(plan.split), 2, day, block))
    browser = deal_browsers(imp_time, plan.preset.impressions_per_user, rng)
    first = np.full(int(browser.max()) + 1 if len(browser) else 0, len(browser), dtype=np.int64)
    np.minimum.at(first, browser, np.arange(len(browser), dtype=np.int64))
    out: np.ndarray = first_id + first[browser]
    return out


def _block_table(cols: dict[str, np.ndarray]) -> pa.Table:
    arrays = [pa.array(cols[f.name], type=f.type) for f in CONVERSION_LOG_SCHEMA]
    return pa.Table.from_arrays(arrays, schema=CONVERSION_LOG_SCHEMA)


def _pieces(table: pa.Table, chunk_rows: int) -> Iterator[pa.Table]:
    """Zero-copy slices of about ``chunk_rows`` rows, cut only between impressions."""
    n = table.num_rows
    if n <= chunk_rows:
        yield table
        return
    ids = table.column("impression_id").to_numpy()
    starts = np.flatnonzero(ids[1:] != ids[:-1]) + 1  # first row of each impression but the first
    pos = np.searchsorted(starts, np.arange(chunk_rows, n, chunk_rows))
    cuts = np.unique(starts[pos[pos < starts.size]])
    edges = [0, *cuts.tolist(), n]
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        yield table.slice(a, b - a)


def iter_chunks(plan: ImpressionPlan, chunk_rows: int = 1_000_000) -> Iterator[tuple[int, pa.Table]]:
    """Yield (day index, table) chunks of about ``chunk_rows`` rows; an impression is never split.

    Blocks of impressions (about 2^19 rows each) are generated whole. Peak memory is about
    max(chunk_rows, 2^19) rows times a small constant, whatever the output size.
    """
    chunk_rows = check_int("chunk_rows", chunk_rows)
    if chunk_rows < 1:
        raise InvalidParameters(f"chunk_rows must be >= 1, got {chunk_rows}")
    block_imps = _block_impressions(plan.preset.lam)
    id_base = SPLIT_ID_OFFSET[plan.split]
    for d in range(plan.days):
        cum = np.cumsum(plan.counts[d])
        n_day = int(cum[-1]) if cum.size else 0
        pending: list[pa.Table] = []  # whole blocks; concatenated without copying
        pending_rows = 0
        for block, i0 in enumerate(range(0, n_day, block_imps)):
            table = _block_table(_generate_block(plan, d, block, cum, i0, min(n_day, i0 + block_imps), id_base))
            pending.append(table)
            pending_rows += table.num_rows
            if pending_rows >= chunk_rows:
                yield from ((d, piece) for piece in _pieces(pa.concat_tables(pending), chunk_rows))
                pending, pending_rows = [], 0
        if pending_rows:
            yield from ((d, piece) for piece in _pieces(pa.concat_tables(pending), chunk_rows))
        id_base += n_day


def generate_table(preset: SyntheticPreset, *, seed: int, split: str = "train", scale: float = 1.0,
                   days: int = 1, start_date: date = DEFAULT_START_DATE,
                   power_law_method: str = "exact") -> pa.Table:
    """One split in memory (for tests and small data; use ``write_synthetic`` for big data)."""
    plan = plan_impressions(preset, seed=seed, split=split, scale=scale, days=days, start_date=start_date,
                            power_law_method=power_law_method)
    tables = [t for _, t in iter_chunks(plan)]
    return pa.concat_tables(tables) if tables else CONVERSION_LOG_SCHEMA.empty_table()


# --------------------------------------------------------------------------------------------
# Writer: Parquet shards, bounded memory, optional date partitions, atomic per split
# --------------------------------------------------------------------------------------------


def write_split(plan: ImpressionPlan, directory: str | os.PathLike[str], *, partition_by_date: bool,
                chunk_rows: int = 1_000_000, max_rows_per_file: int = 8_000_000,
                compression: str = "snappy", by_conversion_date: bool = False) -> dict[str, Any]:
    """Write one split's Parquet shards into a fresh ``directory``; returns the manifest. Date
    partitions are by impression date (each holds whole impressions), or with ``by_conversion_date``
    by conversion date (what a daily export holds: an impression's conversions spread over days)."""
    max_rows_per_file = check_int("max_rows_per_file", max_rows_per_file)
    if max_rows_per_file < 1:
        raise InvalidParameters(f"max_rows_per_file must be >= 1, got {max_rows_per_file}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    flat = ParquetShardWriter(directory, CONVERSION_LOG_SCHEMA, max_rows_per_file, compression,
                              use_dictionary=list(_DICTIONARY_COLUMNS))
    current: tuple[int, ParquetShardWriter] | None = None  # (day, writer) of the open date partition
    closed: list[ParquetShardWriter] = [flat]
    by_day: dict[date, ParquetShardWriter] = {}  # conversion-date partitions, all open until the end
    rows = 0
    converting_impressions = 0
    max_per_impression = 0
    # Parquet encoding runs on a second thread (pyarrow and most numpy kernels release the GIL), so
    # generation of chunk i+1 overlaps the writing of chunk i. At most one write is in flight, so
    # memory stays bounded (about two chunks), and files are written in order.
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="araopt-parquet")
    in_flight: list[Future[Any]] = []

    def submit(fn: Any, *args: Any) -> None:
        if in_flight:
            in_flight.pop().result()  # re-raises a failed write here
        in_flight.append(pool.submit(fn, *args))

    try:
        for d, table in iter_chunks(plan, chunk_rows):
            writer: ParquetShardWriter | None
            if partition_by_date and by_conversion_date:
                day_of = np.floor_divide(table.column("conversion_time").cast(pa.int64()).to_numpy(), _US_PER_DAY)
                for day in np.unique(day_of):
                    when = (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(days=int(day))).date()
                    if when not in by_day:
                        by_day[when] = ParquetShardWriter(directory / f"date={when.isoformat()}", CONVERSION_LOG_SCHEMA,
                                                          max_rows_per_file, compression,
                                                          use_dictionary=list(_DICTIONARY_COLUMNS))
                        closed.append(by_day[when])
                    submit(by_day[when].write, table.filter(pa.array(day_of == day)))
                writer = None
            elif not partition_by_date:
                writer = flat
            else:
                if current is None or current[0] != d:  # days are generated in order
                    if current is not None:
                        submit(current[1].close)
                    current = (d, ParquetShardWriter(directory / f"date={plan.day(d).isoformat()}",
                                                     CONVERSION_LOG_SCHEMA, max_rows_per_file, compression,
                                                     use_dictionary=list(_DICTIONARY_COLUMNS)))
                    closed.append(current[1])
                writer = current[1]
            if writer is not None:
                submit(writer.write, table)
            ids = table.column("impression_id").to_numpy()
            run_starts = np.flatnonzero(np.diff(ids, prepend=ids[0] - 1))  # chunks never split an impression
            converting_impressions += run_starts.size
            max_per_impression = max(max_per_impression, int(np.diff(np.append(run_starts, ids.size)).max()))
            rows += table.num_rows
        if in_flight:
            in_flight.pop().result()
    finally:
        pool.shutdown(wait=True)
        for w in closed:
            w.close()
    files = [f for w in closed for f in w.files]
    if rows == 0:  # keep the schema discoverable
        empty = directory / "part-00000.parquet"
        pq.write_table(CONVERSION_LOG_SCHEMA.empty_table(), empty)
        files.append(str(empty))
    return {
        "schema": "conversion_log/1",
        "split": plan.split,
        "seed": plan.seed,
        "scale": plan.scale,
        "preset": plan.preset.to_dict(),
        "power_law_method": plan.power_law_method,
        "start_date": plan.start_date.isoformat(),
        "days": plan.days,
        "partition_by_date": partition_by_date,
        "partitioned_by": None if not partition_by_date else ("conversion_date" if by_conversion_date
                                                             else "impression_date"),
        "slices": N_SLICES,
        "impressions": plan.n_impressions,
        "converting_impressions": converting_impressions,
        "conversions": rows,
        "max_conversions_per_impression": max_per_impression,
        "files": sorted(os.path.relpath(f, directory) for f in files),
    }


def write_synthetic(out_dir: str | os.PathLike[str], preset: SyntheticPreset, *, seed: int,
                    scale: float = 1.0, days: int | None = None, splits: Sequence[str] = SPLITS,
                    start_date: date = DEFAULT_START_DATE, overwrite: bool = False,
                    chunk_rows: int = 1_000_000, max_rows_per_file: int = 8_000_000,
                    power_law_method: str = "exact", compression: str = "snappy",
                    by_conversion_date: bool = False) -> dict[str, dict[str, Any]]:
    """Generate and write ``splits`` (independent draws) under ``out_dir/<split>/``.

    ``days=None`` writes flat ``part-*.parquet`` files (impressions on ``start_date``);
    ``days=N`` writes ``date=YYYY-MM-DD/part-*.parquet`` for N days of impressions, partitioned by
    impression date or, with ``by_conversion_date``, by conversion date. Each split is written to a
    staging folder and all are moved into place when every one is complete (``araopt.io.folders``: a
    split folder is whole or absent); its ``_manifest.json`` records parameters, sizes and every file's
    sha256 (underscore files are ignored by Arrow/pandas dataset readers).
    """
    splits = tuple(splits)
    if not splits or any(s not in SPLITS for s in splits) or len(set(splits)) != len(splits):
        raise InvalidParameters(f"splits must be distinct values from {SPLITS}, got {splits}")
    check_parent_folder(out_dir, splits, overwrite)
    plans = {s: plan_impressions(preset, seed=seed, split=s, scale=scale, days=1 if days is None else days,
                                 start_date=start_date, power_law_method=power_law_method) for s in splits}
    manifests: dict[str, dict[str, Any]] = {}
    with ExitStack() as stack:
        folders = {s: stack.enter_context(OutputFolder.prepare(Path(out_dir) / s, overwrite, "araopt synth"))
                   for s in splits}
        staged = {s: write_split(plan, folders[s].staging, partition_by_date=days is not None, chunk_rows=chunk_rows,
                                 max_rows_per_file=max_rows_per_file, compression=compression,
                                 by_conversion_date=by_conversion_date) for s, plan in plans.items()}
        for s, manifest in staged.items():
            manifests[s] = folders[s].commit(manifest)
    return manifests


# --------------------------------------------------------------------------------------------
# Fit: maximum-likelihood estimates of (b, lam, mu, sigma) from a conversion log
# --------------------------------------------------------------------------------------------


