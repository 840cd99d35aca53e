"""Users for a conversion log that has none: the columns the W3C Attribution target needs
(``browser_id``, ``impression_site``, ``conversion_site``; ``schemas/conversion_log.md``), added to
a log with ``impression_time`` (the synthetic generator's, Sec. 5.3).

Impressions are dealt to browsers in runs of Geometric(1 / mean) impressions (on 1, 2, ...) (the impressions
of one browser are taken in impression-time order, so that a browser's impressions are close in time
and its conversions of different impressions share epochs), each impression gets one of
``impression_sites`` and each conversion one of ``conversion_sites``, uniformly. Deterministic in
``seed``; every row of an impression gets the same browser and impression site.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from araopt.errors import InvalidInput, InvalidParameters
from araopt.io.conversions import BROWSER_ID, CONVERSION_SITE, IMPRESSION_ID, IMPRESSION_SITE, IMPRESSION_TIME


def deal_browsers(shown: np.ndarray, impressions_per_user: float, rng: np.random.Generator) -> np.ndarray:
    """Per impression (``shown``: its time), its browser's number: the impressions in time order dealt
    to browsers 0, 1, ... in runs of Geometric(1 / ``impressions_per_user``) (on 1, 2, ...)."""
    order = np.argsort(shown, kind="stable")  # impressions by time: a browser's are consecutive
    runs = rng.geometric(1.0 / impressions_per_user, size=len(shown))  # on {1, 2, ...}, mean as asked
    browser = np.empty(len(shown), dtype=np.int64)
    browser[order] = np.repeat(np.arange(len(runs)), runs)[: len(shown)]
    return browser


def with_users(log: pd.DataFrame, impressions_per_user: float = 3.0, seed: int = 0,
               impression_sites: tuple[str, ...] = ("publisher.example",),
               conversion_sites: tuple[str, ...] = ("advertiser.example",)) -> pd.DataFrame:
    """``log`` with ``browser_id`` (int64), ``impression_site`` and ``conversion_site`` (strings)."""
    if not (isinstance(impressions_per_user, (int, float)) and impressions_per_user >= 1):
        raise InvalidParameters(f"impressions_per_user must be a number >= 1, got {impressions_per_user!r}")
    if not impression_sites or not conversion_sites:
        raise InvalidParameters("impression_sites and conversion_sites must each name at least one site")
    missing = [c for c in (IMPRESSION_ID, IMPRESSION_TIME) if c not in log]
    if missing:
        raise InvalidInput(f"the log needs {missing} to get users")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x05E25]))
    codes, impressions = pd.factorize(log[IMPRESSION_ID].to_numpy())
    first_shown = pd.Series(log[IMPRESSION_TIME].to_numpy()).groupby(codes).min().to_numpy()
    browser = deal_browsers(first_shown, impressions_per_user, rng)
    site = rng.integers(0, len(impression_sites), len(impressions))
    out = log.copy()
    out[BROWSER_ID] = browser[codes]
    out[IMPRESSION_SITE] = np.asarray(impression_sites, dtype=object)[site[codes]]
    out[CONVERSION_SITE] = np.asarray(conversion_sites, dtype=object)[rng.integers(0, len(conversion_sites), len(log))]
    return out
