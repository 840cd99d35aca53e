"""W3C Attribution Level 1's own code, for tests: the spec's end-to-end cases and the reference
implementation of the browser side (``impl/`` of w3c/attribution at 9fab4e8, with ``tools/events.js``),
found in ``$ARAOPT_W3C_ATTRIBUTION`` or ``../shared/peers/w3c-attribution`` next to the repository,
built with node and npm into ``~/.cache/araopt/w3c``; and a seeded generator of adversarial event
streams (one browser instance each) for differential tests."""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess

import pandas as pd
import pytest

from peers import build_peer

W3C_PEER = os.environ.get("ARAOPT_W3C_ATTRIBUTION", os.path.join(os.path.dirname(__file__), "..", "..", "shared",
                                                                "peers", "w3c-attribution"))
BUDGET_RUNNER = os.path.join(os.path.dirname(__file__), "w3c_budget_runner.js")


def _missing(what: str) -> None:
    """Fail under CI (the conformance suite must run there), skip elsewhere, saying why."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but {what}")
    pytest.skip(what)


@pytest.fixture(scope="session")
def w3c_e2e_dir():
    """The spec's end-to-end cases (``e2e-tests/``: CONFIG.json and 26 cases)."""
    folder = os.path.join(W3C_PEER, "e2e-tests")
    if not os.path.isfile(os.path.join(folder, "CONFIG.json")):
        _missing(f"the W3C Attribution end-to-end cases are not at {folder} (set ARAOPT_W3C_ATTRIBUTION)")
    return folder


@pytest.fixture(scope="session")
def w3c_reference():
    """DEST of the built reference implementation (``DEST/events.js``); skipped when node or npm is missing."""
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    build = os.path.join(W3C_PEER, "build.sh")
    if not os.path.exists(build):
        _missing(f"the W3C Attribution reference implementation is not at {W3C_PEER} (set ARAOPT_W3C_ATTRIBUTION)")
    if missing:
        pytest.skip(f"the W3C Attribution reference implementation cannot be built here: missing {missing}")
    return build_peer(build, "w3c")


def run_reference(dest: str, cases: list[dict], tmp_path) -> tuple[list[dict], list[dict]]:
    """The cases through the reference: the rows of ``events.js --jsonl`` (histograms and errors per
    measureConversion) and of the budget runner (the per-site budget store after each of them)."""
    lines = "".join(json.dumps(c) + "\n" for c in cases)
    events = subprocess.run(["node", os.path.join(dest, "events.js"), "--jsonl"], input=lines, capture_output=True,
                            text=True, timeout=600)
    assert events.returncode == 0, events.stderr[-2000:]
    budgets = subprocess.run(["node", BUDGET_RUNNER, dest], input=lines, capture_output=True, text=True, timeout=600)
    assert budgets.returncode == 0, budgets.stderr[-2000:]
    return ([json.loads(x) for x in events.stdout.splitlines()], [json.loads(x) for x in budgets.stdout.splitlines()])


AGG = "https://agg-service.example"
IMPRESSION_SITES = ("pub-1.example", "pub-2.example", "pub-3.example")
CONVERSION_SITES = ("adv-1.example", "adv-2.example", "adv-3.example")
INTERMEDIARIES = ("adtech-1.example", "adtech-2.example")
DAY = 86_400


def random_stream(rng: random.Random, events: int = 40) -> dict:
    """One browser instance's adversarial event stream in the spec's end-to-end format: many
    conversions per site and epoch, lookbacks and lifetimes across epochs (and past the maximum),
    several impressions per conversion with tied priorities, conversions exactly at lookback, lifetime
    and epoch boundaries, values at and above maxValue, fractional epsilons and credits, indices
    outside the histogram, clearing and disabling. The global budget is set out of reach (the
    reference never enforces it: see ``araopt.attribution.browser``); the per-site budget and the
    impression-site quota bind often."""
    epoch_days = rng.choice((1, 7, 7))
    config = {
        "epochStart": rng.randrange(128) / 128,  # epochStart x epoch length is whole seconds, as Temporal needs
        "fairlyAllocateCreditFraction": rng.randrange(1000) / 1000,
        "perSitePrivacyBudget": rng.choice((300_000, 1_000_000, 2_500_000)),
        "impressionSiteQuotaPerEpoch": rng.choice((1_000_000, 3_000_000, 4_000_000_000)),
        "globalPrivacyBudgetPerEpoch": 4_000_000_000,
        "privacyBudgetEpochDays": epoch_days,
        "maxLookbackDays": rng.choice((7, 30)),
        "maxHistogramSize": 8,
        "maxCreditSize": 4,
    }
    t = rng.randrange(1, 2_000_000_000)
    saved: list[int] = []
    out = []
    for _ in range(events):
        step = rng.random()
        if step < 0.3:
            t += 1
        elif step < 0.6:
            t += rng.randrange(1, 6 * 3600)
        elif step < 0.8:
            t += rng.randrange(1, 4) * DAY + rng.choice((0, 1, -1, 17))
        elif saved and step < 0.9:  # exactly at an impression's lookback / lifetime edge (or one second after)
            edge = rng.choice(saved) + rng.randrange(1, 9) * DAY + rng.choice((0, 1))
            t = max(t + 1, edge)
        else:
            t += rng.randrange(1, epoch_days * DAY * 2)
        kind = rng.random()
        if kind < 0.38:
            options: dict = {"histogramIndex": rng.randrange(8), "priority": rng.choice((0, 0, 0, 1, -1, 2))}
            if rng.random() < 0.5:
                options["matchValue"] = rng.randrange(3)
            if rng.random() < 0.6:
                options["lifetimeDays"] = rng.choice((1, 2, 3, 7, 8, 14, 30, 31, 40))
            if rng.random() < 0.3:
                options["conversionSites"] = rng.sample(CONVERSION_SITES, rng.randrange(1, 3))
            if rng.random() < 0.1:
                options["conversionCallers"] = rng.sample(CONVERSION_SITES + INTERMEDIARIES, 2)
            ev = {"event": "saveImpression", "site": rng.choice(IMPRESSION_SITES), "options": options}
            if rng.random() < 0.2:
                ev["intermediarySite"] = rng.choice(INTERMEDIARIES)
            saved.append(t)
        elif kind < 0.92:
            max_value = rng.choice((1, 3, 7, 10, 255, 1000))
            value = rng.choice((max_value, max_value, rng.randrange(1, max_value + 1), max_value + rng.choice((0, 1))))
            options = {"aggregationService": AGG, "histogramSize": rng.randrange(1, 9), "value": value,
                       "maxValue": max_value, "epsilon": rng.choice((0.1, 0.5, 1, 1, 2.5, 1 / 3, 0.7)),
                       "lookbackDays": rng.choice((1, 2, 3, 7, 8, 14, 30, 31))}
            if rng.random() < 0.7:
                options["credit"] = [rng.choice((1, 1, 2, 3, 0.5, 0.3, 0.25)) for _ in range(rng.randrange(1, 5))]
            if rng.random() < 0.25:
                options["matchValues"] = rng.sample((0, 1, 2), rng.randrange(1, 3))
            if rng.random() < 0.15:
                options["impressionSites"] = rng.sample(IMPRESSION_SITES, rng.randrange(1, 3))
            if rng.random() < 0.1:
                options["impressionCallers"] = rng.sample(IMPRESSION_SITES + INTERMEDIARIES, 2)
            ev = {"event": "measureConversion", "site": rng.choice(CONVERSION_SITES), "options": options}
            if rng.random() < 0.1:
                ev["intermediarySite"] = rng.choice(INTERMEDIARIES)
        elif kind < 0.95:
            site = rng.choice(IMPRESSION_SITES + CONVERSION_SITES + INTERMEDIARIES)
            ev = {"event": "clearImpressionsForSite", "site": site}
        elif kind < 0.98:
            forget = rng.random() < 0.5
            sites = rng.sample(CONVERSION_SITES + IMPRESSION_SITES, rng.randrange(0 if forget else 1, 3))
            ev = {"event": "clearBrowsingHistoryForAttribution", "sites": sites, "forgetVisits": forget}
        else:
            ev = {"event": rng.choice(("disableAPI", "enableAPI"))}
        ev["seconds"] = t
        out.append(ev)
    return {"config": config, "events": out}


def random_log(rng: random.Random, users: int) -> pd.DataFrame:
    """A conversion log with the Attribution columns: per user 1-4 impressions (3 campaigns) within 40
    days, 1-6 conversions each at two conversion sites, from the same second (tied times) to 35 days
    later (past the lookback), values from 0 to far above any clip."""
    rows = []
    t0 = 1_767_225_600_000_000  # 2026-01-01 in microseconds
    for user in range(users):
        for k in range(rng.randrange(1, 5)):
            impression = user * 100 + k
            shown = t0 + rng.randrange(0, 40 * 86_400) * 1_000_000
            campaign = rng.randrange(3)
            tied = rng.random() < 0.3
            for _ in range(rng.randrange(1, 7)):
                delay = 0 if tied else rng.choice((0, 1, 3600, 86_400, 6 * 86_400, 8 * 86_400, 29 * 86_400, 35 * 86_400))
                rows.append({"browser_id": user, "impression_id": impression, "campaign": campaign,
                             "conversion_site": rng.choice(("adv-1.example", "adv-2.example")),
                             "impression_time_us": shown,
                             "conversion_time_us": shown + (delay + rng.randrange(0, 3)) * 1_000_000,
                             "value": rng.choice((0.0, 1.0, 3.5, 10.0, 10.0, 25.0, 1000.0))})
    return pd.DataFrame(rows)


def log_parquet(log: pd.DataFrame, path) -> str:
    """``log`` (canonical ``*_time_us`` columns) written as the contract's Parquet: conversion_time and
    impression_time as UTC timestamps."""
    out = log.drop(columns=["conversion_time_us", "impression_time_us"]).assign(
        conversion_time=pd.to_datetime(log["conversion_time_us"], unit="us", utc=True),
        impression_time=pd.to_datetime(log["impression_time_us"], unit="us", utc=True))
    out.to_parquet(path, index=False)
    return str(path)
