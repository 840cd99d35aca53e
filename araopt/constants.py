"""Every number araopt uses more than once, defined once: ARA's and the Aggregation Service's limits,
and the defaults of the core, which the command line's option registry (``pipelines.options``) refers
to. Standard library only: ``araopt <command> --help`` reads it without importing numpy.
"""
from __future__ import annotations

from enum import StrEnum
from typing import Final

# ---- ARA and the Aggregation Service ------------------------------------------------------------
CONTRIBUTION_BUDGET: Final = 65536
"""Gamma: the ARA L1 contribution budget per source (impression); also the largest aggregatable value."""
MAX_CONTRIBUTION_BUDGET: Final = 2**32
"""Largest Gamma the bounding accepts (tests and studies; ARA's is 2^16): sums stay exact in int64."""
MAX_REPORTS_PER_SOURCE: Final = 20
"""Chrome's limit of aggregatable reports per source (the spec leaves it to the user agent)."""
MAX_KEYS_PER_SOURCE: Final = 20
MAX_SOURCE_LIFE_DAYS: Final = 30
"""ARA's longest source life (its maximum expiry): a source's conversions lie within 30 days after it
was registered, so a release's impressions converted earlier at most 30 days before its first conversion."""
MAX_KEY_NAME_LENGTH: Final = 25
QUERY_BITS: Final = 8
MAX_BUCKET_BITS: Final = 128
MIN_EPSILON: Final = 2.0**-20
"""Floor of epsilon (~9.5e-7): below it the noise sd exceeds 9e10 per key and the exact sampler's rate
eps / Gamma would keep fewer than 16 bits (``mechanism.noise``). Google's DP library floors at 2^-50."""
MAX_EPSILON: Final = 64.0
MAX_CLIP_THRESHOLD: Final = 1e12
"""The largest clip threshold C_l (either target): Alg. 4 scales a noised sum by C_l over the query's
scale, and its variance by the square; far above any conversion value, far below what overflows a float."""
MIN_ATTRIBUTION_CLIP: Final = 1e-12
"""The smallest Attribution clip: its value scale maxValue / clip must stay finite (a clip of 5e-324 released
0 +- 0 where nothing was measured)."""
"""Ceiling of epsilon: the Aggregation Service accepts eps in (0, 64]."""
MAX_REJECTED_FRACTION: Final = 0.10
"""Like the Aggregation Service (which fails a job when more than 10% of reports are bad). The gate is
sharp: with exactly 10% of the rows rejected the job goes on and releases, one more rejected row
refuses it (nothing is released)."""

# ---- defaults of the core --------------------------------------------------------------------------
ENCODING: Final = "linf"
"""HistogramContribution L-inf (Alg. 3)."""
L1_ROUNDING: Final = "randomized"
"""Alg. 6's rounding the optimizer writes: unbiased systematic randomized rounding (the paper's is floor)."""
L1_ROUNDING_OF_A_FILE: Final = "floor"
"""The rounding of an L1 parameter file that names none: the paper's Alg. 6."""


class Objective(StrEnum):
    """What Alg. 5 minimises. EXACT and RELAXED are the paper's error models of Alg. 4's (capped)
    estimates: Thm. 4.2 (exact DLap variance, rounding, floors) or Relaxation 4.5. CORRECTED is the
    predicted error of the estimates of the TRUE totals (``optimize.corrected``, L-inf only), whose
    capped estimate it corrects is modelled exactly (``error_model``)."""

    EXACT = "exact"
    RELAXED = "relaxed"
    CORRECTED = "corrected"

    @property
    def error_model(self) -> Objective:
        """The paper's error model (EXACT or RELAXED) of the capped estimates under this objective."""
        return Objective.EXACT if self is Objective.CORRECTED else self


OBJECTIVE: Final = Objective.CORRECTED
"""What the tuning minimises: the predicted error of the true totals (see ``optimize.search``). The one
default objective; where only the paper's error models apply the default is ``OBJECTIVE.error_model``."""
CORRECTION: Final = "ratio"
"""How estimates use a calibration when a parameter file names no choice."""
COUNT_TAU: Final = 5.0
"""RMSRE_tau's threshold of the count query (Sec. 5.1)."""
TAU_MEDIANS: Final = 5.0
"""A value query's RMSRE_tau threshold is this many times its median per conversion (Sec. 5.1)."""
MAX_COUNT_LIMIT: Final = MAX_REPORTS_PER_SOURCE
"""Largest count limit C the optimizer tries: beyond Chrome's report limit Alg. 1 keeps no more."""
MAX_SLICES: Final = 100_000
"""Largest domain (declared or derived) a release accepts: ``--max-slices``."""
RELEASE_PERIOD_DAYS: Final = 1.0
LOOKBACK_DAYS: Final = MAX_SOURCE_LIFE_DAYS
"""Days of history before a window read for lifetime ranks (Chrome caps a source over up to 30 days)."""
CONFIDENCE: Final = 0.95
EXPLORATION_COUNT_LIMITS: Final = (1, 2, 3, 5, 8, 12, 20)
"""The count limits of the privacy-safe mode's exploration arms (from C = 1 to Chrome's 20 reports)."""
EXPLORATION_ARM_SHARE: Final = 0.003
"""Share of the impressions in each exploration arm (seven arms: 2.1% in all)."""
PRIVATE_WINDOW_DAYS: Final = 9
"""Past releases (days) the privacy-safe tuner learns from; the replay's raw window for the fully informed one."""
EPSILONS: Final = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
"""The epsilons of the paper's evaluation (Sec. 5)."""
BASELINE_QUANTILES: Final = (0.95, 0.99)
"""The quantiles of the paper's baselines (Sec. 5.1)."""
MAX_THRESHOLD_CHANGE_FACTOR: Final = 2.0
MAX_COUNT_LIMIT_CHANGE: Final = 2
SPECIAL_DAY_LOSS_FACTOR: Final = 5.0
"""On a declared special day the calibration's history cannot support, what Alg. 1 loses per kept unit
may be up to this many times the history's, or as many times less (``calibration.calendar``)."""
DESTINATION: Final = "https://advertiser.example"
