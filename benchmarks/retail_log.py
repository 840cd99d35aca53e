"""A retail team's own conversion log, as a data engineer exports it with pandas: a sale spike and a
small-integer value clipped low. Reusable by any benchmark (``retail_log``, ``write_partitions``).

    35 UTC conversion days (default 2026-10-27 .. 2026-11-30), cut by conversion date;
    string ids ("imp-00a1b2..."), string slices: 40 campaigns (Zipf sizes) x 6 geos = 240 slices;
    impressions from 30 days before the first day, each with a gamma propensity to convert (many
    impressions with one or two conversions, a tail with dozens: the count limit C bites) and
    conversions over the next days (exponential delays, mean 3 days, at most 30);
    a weekday cycle (more conversions per impression at weekends);
    a sale from day 32 (Black Friday 2026-11-27 .. Cyber Monday 2026-11-30): 2.0-2.8x the
    conversions per impression (a thinned process: every day draws the sale's rate, ordinary days keep
    a share of it) and bigger baskets;
    items: 1 + Poisson(0.7) a conversion, 1 + Poisson(1.8) in the sale (small integers, clipped low);
    revenue: the sum of the items' prices (log-normal), and a few huge orders (1 in 5,000 is x100).

Columns: impression_id (string), conversion_time and impression_time (timestamp[ns, UTC], as pandas
writes them), campaign, geo (strings), revenue (float), items (int64).

Run: .venv/bin/python benchmarks/retail_log.py --out /tmp/retail [--per-day 15000] [--seed 1]
     writes OUT/date=YYYY-MM-DD/part-00000.parquet (one folder per conversion day) and prints the days.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from datetime import date, timedelta

import numpy as np
import pandas as pd

START = date(2026, 10, 27)
DAYS = 35
SALE = {31: 2.8, 32: 2.2, 33: 2.0, 34: 2.5}
"""Day index (0 = START) -> conversions per impression on that day, relative to an ordinary day."""
WEEKDAY = np.array([0.95, 0.9, 0.9, 0.95, 1.05, 1.25, 1.2])  # Mon .. Sun
CAMPAIGNS = 40
CAMPAIGN_NAMES = np.array([f"cmp-{i + 1:02d}" for i in range(CAMPAIGNS)], dtype=object)
GEOS = ("US-CA", "US-NY", "US-TX", "GB", "DE", "JP")
GEO_SHARE = np.array([0.3, 0.2, 0.2, 0.12, 0.1, 0.08])
SLICES = ("campaign", "geo")
VALUES = ("revenue", "items")
DAY_US = 86_400_000_000


@dataclass(frozen=True)
class RetailLog:
    frame: pd.DataFrame  # the log, cut by conversion date (START .. START + days - 1)
    day: np.ndarray  # conversion day index of each row (0 = START)
    sale_days: tuple[str, ...]  # the sale's dates (ISO), what an operator declares as --special-days

    def date(self, day: int) -> str:
        return (START + timedelta(days=int(day))).isoformat()


def retail_log(per_day: int = 15_000, seed: int = 1, days: int = DAYS, sale: dict[int, float] | None = None,
               items_mean: float = 0.7, sale_items_mean: float = 1.8) -> RetailLog:
    """The log of the module docstring, about ``per_day`` conversions on an ordinary day."""
    sale = SALE if sale is None else sale
    rng = np.random.default_rng(seed)
    start_us = int(pd.Timestamp(START, tz="UTC").value // 1000)
    factor = np.array([WEEKDAY[(START + timedelta(days=d)).weekday()] * sale.get(d, 1.0) for d in range(days)])
    top = float(factor.max())
    mean_conversions, shape = 2.0, 0.5  # per impression on an ordinary day; gamma shape (overdispersed)
    mean_delay, horizon = 3.0 * DAY_US, 30 * DAY_US
    campaign_weight = 1.0 / np.arange(1, CAMPAIGNS + 1) ** 1.1
    campaign_weight /= campaign_weight.sum()
    frames = []
    next_id = 0
    for d in range(-30, days):
        n_imp = rng.poisson(per_day / mean_conversions)
        propensity = rng.gamma(shape, mean_conversions * top / shape, n_imp)  # the sale's rate: thinned below
        sizes = rng.poisson(propensity)
        campaign = rng.choice(CAMPAIGNS, n_imp, p=campaign_weight)
        geo = rng.choice(len(GEOS), n_imp, p=GEO_SHARE)
        t_imp = start_us + d * DAY_US + rng.integers(0, DAY_US, n_imp)
        rep = np.repeat(np.arange(n_imp), sizes)
        t = t_imp[rep] + np.minimum(rng.exponential(mean_delay, len(rep)).astype(np.int64), horizon - 1)
        day = np.floor_divide(t - start_us, DAY_US)
        inside = (day >= 0) & (day < days)
        keep = np.zeros(len(rep), dtype=bool)
        keep[inside] = rng.random(int(inside.sum())) < factor[day[inside]] / top
        rep, t, day = rep[keep], t[keep], day[keep]
        in_sale = np.isin(day, list(sale))
        items = 1 + rng.poisson(np.where(in_sale, sale_items_mean, items_mean))
        price = rng.lognormal(3.2, 0.9, int(items.sum()))
        revenue = np.add.reduceat(price, np.concatenate([[0], np.cumsum(items)[:-1]])) if len(items) else price[:0]
        huge = rng.random(len(rep)) < 1.0 / 5000
        revenue = np.round(np.where(huge, revenue * 100.0, revenue), 2)
        frames.append(pd.DataFrame({
            "impression_id": next_id + rep,
            "conversion_time": pd.to_datetime(t * 1000, utc=True),
            "impression_time": pd.to_datetime(t_imp[rep] * 1000, utc=True),
            "campaign": CAMPAIGN_NAMES[campaign[rep]],
            "geo": np.asarray(GEOS, dtype=object)[geo[rep]],
            "revenue": revenue, "items": items.astype(np.int64)}))
        next_id += n_imp
    frame = pd.concat(frames, ignore_index=True).sort_values("conversion_time", kind="stable").reset_index(drop=True)
    frame["impression_id"] = frame["impression_id"].map("imp-{:08x}".format)  # string ids
    day = ((frame["conversion_time"].astype("int64") // 1000 - start_us) // DAY_US).to_numpy()
    return RetailLog(frame, day, tuple((START + timedelta(days=d)).isoformat() for d in sorted(sale)))


def write_partitions(log: RetailLog, root: str) -> list[str]:
    """``root``/date=YYYY-MM-DD/part-00000.parquet per conversion day; returns the folders."""
    folders = []
    for d in np.unique(log.day):
        folder = os.path.join(root, f"date={log.date(int(d))}")
        os.makedirs(folder, exist_ok=True)
        log.frame[log.day == d].to_parquet(os.path.join(folder, "part-00000.parquet"), index=False)
        folders.append(folder)
    return folders


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for the date=YYYY-MM-DD/ partitions")
    ap.add_argument("--per-day", type=int, default=15_000, help="conversions on an ordinary day")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    log = retail_log(args.per_day, args.seed)
    folders = write_partitions(log, args.out)
    per_day = np.bincount(log.day)
    print(f"{len(log.frame):,} conversions over {len(folders)} days under {args.out} ({per_day.min():,}..{per_day.max():,}"
          f" a day); sale days (declare them: --special-days {','.join(log.sale_days)})")


if __name__ == "__main__":
    main()
