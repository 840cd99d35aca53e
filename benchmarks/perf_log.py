"""A retail-like joined conversion log for the performance benchmarks (no sale spike: for the sale, see
``retail_log.py``), as date=YYYY-MM-DD/ Parquet partitions by conversion date.

    python benchmarks/perf_log.py OUT [--conversions 1220000] [--days 35] [--seed 0]

What issue 27's user exported from pandas: string impression ids, ``conversion_time`` as pandas'
``timestamp[ns, UTC]``, 40 Zipf-sized campaigns x 6 geographies (``campaignId``, ``geography``: 240
slices), ``revenue`` (LogNormal, a few huge orders) and ``items`` (small integers), a weekday cycle,
Geometric(mean 3) conversions per impression with exponential delays (mean 4 days). Impressions start up
to 30 days before the first conversion day, so the first days carry lifetime ranks from before the log.
The whole log also goes to OUT/all.parquet unless ``--no-single``; ``--split TRAIN_DAYS`` writes
OUT/train.parquet (the TRAIN_DAYS days before the last day) and OUT/test.parquet (the last day) for
``evaluate``. (Written for the performance benchmarks; ``benchmarks/scale.py`` uses it.)
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

DAY_US = 86_400_000_000
START_US = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z
SLICES = "campaignId,geography"
VALUES = "revenue,items"
GEOS = ("US", "GB", "DE", "FR", "JP", "BR")


def generate(conversions: int, days: int, seed: int, warmup: int = 30, mean_delay_days: float = 4.0) -> pa.Table:
    """About ``conversions`` rows over conversion days [0, days) (fewer with the default ``warmup`` and
    delay: many land outside the days; ``warmup=0, mean_delay_days=0.05`` keeps nearly all of one day's)."""
    rng = np.random.default_rng(seed)
    mean_size = 3.0
    weekday = np.array([0.85, 0.9, 0.95, 1.0, 1.05, 1.3, 0.95])
    # impressions over days [-warmup, days); about days/(days+warmup/mean_delay...) of conversions land inside
    n_imp = int(conversions / mean_size * 1.63)
    day = rng.integers(-warmup // 4, days, n_imp)
    day = day[rng.random(n_imp) < weekday[day % 7] / weekday.max()]
    n_imp = len(day)
    imp_time = START_US + day * DAY_US + rng.integers(0, DAY_US, n_imp)
    size = rng.geometric(1.0 / mean_size, n_imp)
    camp_w = 1.0 / np.arange(1, 41) ** 1.1
    campaign = rng.choice(40, n_imp, p=camp_w / camp_w.sum())
    geo = rng.choice(6, n_imp, p=[0.4, 0.2, 0.15, 0.1, 0.1, 0.05])
    owner = np.repeat(np.arange(n_imp), size)
    delay = (rng.exponential(mean_delay_days * DAY_US, len(owner))).astype(np.int64)
    conv_time = imp_time[owner] + delay
    conv_day = (conv_time - START_US) // DAY_US
    keep = (conv_day >= 0) & (conv_day < days)
    owner, conv_time = owner[keep], conv_time[keep]
    n = len(owner)
    revenue = np.round(np.exp(rng.normal(3.5, 1.0, n)), 2)
    huge = rng.random(n) < 2e-5
    revenue[huge] *= rng.uniform(50, 200, int(huge.sum()))
    items = np.minimum(rng.geometric(0.55, n), 40).astype(np.int64)
    ids = np.char.add("imp-", np.char.zfill(np.arange(n_imp).astype(str), 8))
    return pa.table({
        "impression_id": pa.array(ids[owner]),
        "conversion_time": pa.array(conv_time * 1000, type=pa.timestamp("ns", tz="UTC")),
        "campaignId": pa.array(np.char.add("cmp-", campaign[owner].astype(str))),
        "geography": pa.array(np.asarray(GEOS)[geo[owner]]),
        "revenue": pa.array(revenue),
        "items": pa.array(items),
    })


def day_of(table: pa.Table) -> np.ndarray:
    micros = table.column("conversion_time").cast(pa.int64()).to_numpy() // 1000
    return (micros - START_US) // DAY_US


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--conversions", type=int, default=1_220_000)
    ap.add_argument("--days", type=int, default=35)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--split", type=int, default=0, help="write train.parquet (these days) and test.parquet (last day)")
    args = ap.parse_args()
    table = generate(args.conversions, args.days, args.seed)
    out = Path(args.out)
    day = day_of(table)
    for d in range(args.days):
        part = out / "log" / f"date={np.datetime64(START_US + d * DAY_US, 'us').astype('datetime64[D]')}"
        os.makedirs(part, exist_ok=True)
        pq.write_table(table.filter(pa.array(day == d)), part / "part-0.parquet")
    if args.split:
        last = args.days - 1
        pq.write_table(table.filter(pa.array((day >= last - args.split) & (day < last))), out / "train.parquet")
        pq.write_table(table.filter(pa.array(day == last)), out / "test.parquet")
    print(f"{table.num_rows:,} conversions over {args.days} days -> {out}")


if __name__ == "__main__":
    main()
