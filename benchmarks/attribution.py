"""W3C Attribution Level 1 in memory vs ARA in memory, on the same synthetic rows: CPU seconds of
``araopt.attribution.measure.measure`` (browsers, budgets, noise, estimates) and of
``araopt.mechanism.measure.measure`` (Alg. 1-4), simulation mode, 8 conversions per browser.

Run: .venv/bin/python benchmarks/attribution.py [--rows N]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from araopt.attribution.measure import measure as attribution_measure
from araopt.attribution.params import COUNT, AttributionParams, AttributionQuery
from araopt.io.conversions import Conversions
from araopt.mechanism.keys import KeyDomain
from araopt.mechanism.measure import measure as ara_measure
from araopt.mechanism.params import Params, QueryParams


def synthetic_log(n: int, seed: int = 1) -> pd.DataFrame:
    g = np.random.default_rng(seed)
    impression = g.integers(0, n // 3, n)
    shown = 1_767_225_600_000_000 + (impression * 7919 % (40 * 86_400)) * 1_000_000
    converted = shown + g.integers(0, 20 * 86_400, n) * 1_000_000
    return pd.DataFrame({"browser_id": impression % max(1, n // 8), "impression_id": impression,
                         "campaign": impression % 16, "impression_time_us": shown, "conversion_time_us": converted,
                         "conversion_time": pd.to_datetime(converted, unit="us", utc=True),
                         "value": g.lognormal(2, 1, n)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args()
    log = synthetic_log(args.rows)

    start = time.process_time()
    params = Params(count_limit=4, encoding="l1", epsilon=1.0, slice_columns=("campaign",),
                    queries=(QueryParams("value", 40.0),))
    conversions = Conversions.from_table(log[["impression_id", "conversion_time", "campaign", "value"]], ("campaign",),
                                         ("value",))
    ara_measure(conversions, params, KeyDomain.from_slice_values(("campaign",), {"campaign": np.arange(16)}, ("value",)),
                simulation_seed=1)
    ara = time.process_time() - start

    start = time.process_time()
    queries = (AttributionQuery(COUNT, None), AttributionQuery("value", "value", max_value=255, clip=40.0))
    w3c = AttributionParams.from_paper(4.0, 3, {COUNT: 0.3, "value": 0.7}, queries, ("campaign",))
    result = attribution_measure(w3c, log, KeyDomain.from_slice_values(("campaign",), {"campaign": np.arange(16)},
                                                                      w3c.query_names), simulation_seed=1)
    attribution = time.process_time() - start
    print(f"{args.rows} rows: ARA measure {ara:.2f} s CPU, Attribution measure {attribution:.2f} s CPU "
          f"({attribution / ara:.1f}x; {len(result.reports.accepted)} reports, {result.reports_refused} refused)")


if __name__ == "__main__":
    main()
