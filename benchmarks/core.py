"""Core throughput: encode (L-inf) + bound (Alg. 1) + per-key sum on 10M records; DLap sampler speed.

Run: .venv/bin/python benchmarks/core.py [--records N] [--figures docs/figures/core.md]

``--figures`` also writes the figures as the Markdown table that ``docs/performance.md`` shows.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from araopt import Params, QueryParams, bound_contributions, encode, key_histogram, sample_discrete_laplace
from araopt.mechanism.noise import noise_parameter
from araopt.mechanism.randomness import secure_generator

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from figures import markdown_table, write_figure


def synthetic_arrays(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    conv_per_imp = 10
    impression_ids = rng.integers(0, n // conv_per_imp, n)
    times = rng.integers(0, 30 * 86400 * 10**6, n)
    slice_index = rng.integers(0, 256, n)
    values = rng.lognormal(4.19, 1.16, (n, 1))
    return impression_ids, times, slice_index, values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--samples", type=int, default=10_000_000, help="discrete Laplace samples per sampler timing")
    parser.add_argument("--figures", help="also write the figures as a Markdown table to this file")
    args = parser.parse_args()
    n = args.records
    imp, times, sidx, values = synthetic_arrays(n)
    params = Params(count_limit=4, encoding="linf", epsilon=8.0, slice_columns=("s",),
                    queries=(QueryParams("value", 120.0, 1.0),))
    rng = np.random.default_rng(1)
    c0 = time.process_time()
    t0 = time.perf_counter()
    w = encode(values, params, rng)
    t1 = time.perf_counter()
    kept = bound_contributions(imp, times, w)
    t2 = time.perf_counter()
    hist = key_histogram(sidx[kept], w[kept], 256)
    t3 = time.perf_counter()
    cpu = time.process_time() - c0
    total = t3 - t0
    print(f"records: {n:,}")
    print(f"encode L-inf:      {t1 - t0:6.2f} s")
    print(f"bound (Alg. 1):    {t2 - t1:6.2f} s   kept {kept.mean():.1%}")
    print(f"per-key sum:       {t3 - t2:6.2f} s   keys {hist.size}")
    print(f"encode+bound+sum:  {total:6.2f} s   = {n / total / 1e6:.2f} M conversions/s (target >= 3); "
          f"CPU {cpu:.2f} s")
    rows = [[f"encode (L∞) + bound (Alg. 1) + per-key sum, {n:,} records, one process",
             f"{total:.2f} s wall, {cpu:.2f} s CPU = {n / cpu / 1e6:.2f}M conversions per CPU second"]]

    a = noise_parameter(8.0)
    m = args.samples
    for label, gen in [("secure (AES-CTR, default)", None), ("numpy PCG64 (simulation)", np.random.default_rng(2))]:
        g = gen if gen is not None else secure_generator()
        t0 = time.perf_counter()
        c0 = time.process_time()
        sample_discrete_laplace(a, m, g)
        dt = time.perf_counter() - t0
        cpu = time.process_time() - c0
        print(f"DLap sampler {label}: {m / dt / 1e6:.1f} M samples/s (target >= 5 for secure)")
        rows.append([f"exact integer discrete Laplace sampler, {label}, {m:,} samples",
                     f"{m / cpu / 1e6:.1f}M samples per CPU second"])
    if args.figures:
        load = os.getloadavg()[0]
        body = markdown_table(["what (`benchmarks/core.py`)", "figure"], rows)
        write_figure(args.figures, f"{body}\n\nLoad average at the run: {load:.1f} on {os.cpu_count()} cores.")
        print(f"wrote {args.figures}")


if __name__ == "__main__":
    main()
