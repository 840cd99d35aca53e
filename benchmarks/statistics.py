"""Throughput of the statistics side pipeline (Beam, DirectRunner in_memory) and its output size.

    .venv/bin/python benchmarks/statistics.py [--rows 5000000]

Times `pipelines.history.compute_statistics` (read -> validate -> group by impression ->
sufficient statistics) in-process, from pipeline construction to the statistics on the driver.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from araopt.optimize.statistics import StatisticsSpec
from measure import write_synthetic
from pipelines.history import compute_statistics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="araopt-stats-") as work:
        data = os.path.join(work, "data")
        write_synthetic(data, args.rows)
        spec = StatisticsSpec(("campaignId", "geography", "productCategory"), ("value",), max_count_limit=20)
        t0 = time.perf_counter()
        run = compute_statistics(data, spec)
        stats = run.statistics
        wall = time.perf_counter() - t0
        print(f"statistics pipeline: {args.rows:,} conversions in {wall:.1f} s = {args.rows / wall:,.0f} conversions/s "
              f"(target >= 300,000)")
        print(f"statistics size: {stats.size_in_numbers():,} numbers for {stats.num_slices} slices, "
              f"{stats.num_conversions:,} conversions; rows read {run.counts.rows_read:,}")


if __name__ == "__main__":
    main()
