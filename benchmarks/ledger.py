"""The release ledger's size and speed: bytes per released conversion of a row set, and the time to
compute row ids, merge a release's set and check it against earlier releases.

    .venv/bin/python benchmarks/ledger.py [--sizes 1000000,10000000] [--releases 10]

Conversions as in benchmarks/measure.py (~10 per impression, times over 30 days, int64 ids).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from araopt.io.rowset import RowSet, RowSetPart, conversion_row_ids  # noqa: E402

BATCH = 1 << 20


def release(n: int, seed: int) -> tuple[RowSet, float, float]:
    """(row set of n synthetic conversions, seconds to hash them in batches, seconds to merge)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, max(1, n // 10), n) + seed * n
    times = rng.integers(1_700_000_000_000_000, 1_702_592_000_000_000, n)
    start = time.perf_counter()
    parts = [RowSetPart(conversion_row_ids(ids[i:i + BATCH], times[i:i + BATCH]), int(times[i:i + BATCH].min()),
                        int(times[i:i + BATCH].max())) for i in range(0, n, BATCH)]
    hashed = time.perf_counter() - start
    start = time.perf_counter()
    rows = RowSet.merge(parts)
    return rows, hashed, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000000,10000000")
    parser.add_argument("--releases", type=int, default=10, help="earlier releases to check a new one against")
    args = parser.parse_args()
    for n in (int(s) for s in args.sizes.split(",")):
        rows, hashed, merged = release(n, seed=0)
        data = rows.to_parquet_bytes()
        start = time.perf_counter()
        RowSet.from_parquet_bytes(data)
        read = time.perf_counter() - start
        print(f"{n:>11,} conversions: row ids {hashed:5.2f} s ({n / hashed / 1e6:5.1f}M/s), merge {merged:5.2f} s, "
              f"row set {len(data):>11,} bytes = {len(data) / len(rows):.2f} bytes per conversion "
              f"({len(data) * 1e6 / len(rows) / 2**20:.2f} MiB per 10^6; read back {read:.2f} s)")
    n = int(args.sizes.split(",")[0])
    with tempfile.TemporaryDirectory() as root:
        os.environ["ARAOPT_LEDGER"] = root
        from pipelines.ledger import Ledger

        ledger = Ledger.open(root, allow_rerelease=True)
        for k in range(args.releases):
            rows, _, _ = release(n, seed=k + 1)
            ledger.check_and_record(rows, rows.to_parquet_bytes(), {})
        ledger_bytes = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(root) for f in fs)
        rows, _, _ = release(n, seed=1)  # a re-release of the first one; every window meets every other
        start = time.perf_counter()
        recorded = ledger.check_and_record(rows, rows.to_parquet_bytes(), {})
        took = time.perf_counter() - start
    print(f"ledger of {args.releases} releases of {n:,} conversions: {ledger_bytes:,} bytes on disk = "
          f"{ledger_bytes / (args.releases * n):.2f} bytes per released conversion (index included)")
    print(f"check + record of {n:,} conversions against those {args.releases} releases: {took:.2f} s "
          f"(overlap found: {recorded.rows_released_before:,})")

if __name__ == "__main__":
    main()
