"""Core throughput: encode (L-inf) + bound (Alg. 1) + per-key sum on 10M records; DLap sampler speed.

Run: .venv/bin/python benchmarks/core.py [--records N]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from araopt import Params, QueryParams, bound_contributions, encode, key_histogram, sample_discrete_laplace
from araopt.mechanism.noise import noise_parameter
from araopt.mechanism.randomness import secure_generator


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
    args = parser.parse_args()
    n = args.records
    imp, times, sidx, values = synthetic_arrays(n)
    params = Params(count_limit=4, encoding="linf", epsilon=8.0, slice_columns=("s",),
                    queries=(QueryParams("value", 120.0, 1.0),))
    rng = np.random.default_rng(1)
    t0 = time.perf_counter()
    w = encode(values, params, rng)
    t1 = time.perf_counter()
    kept = bound_contributions(imp, times, w)
    t2 = time.perf_counter()
    hist = key_histogram(sidx[kept], w[kept], 256)
    t3 = time.perf_counter()
    total = t3 - t0
    print(f"records: {n:,}")
    print(f"encode L-inf:      {t1 - t0:6.2f} s")
    print(f"bound (Alg. 1):    {t2 - t1:6.2f} s   kept {kept.mean():.1%}")
    print(f"per-key sum:       {t3 - t2:6.2f} s   keys {hist.size}")
    print(f"encode+bound+sum:  {total:6.2f} s   = {n / total / 1e6:.2f} M conversions/s (target >= 3)")

    a = noise_parameter(8.0)
    m = args.samples
    for label, gen in [("secure (AES-CTR, default)", None), ("numpy PCG64 (simulation)", np.random.default_rng(2))]:
        g = gen if gen is not None else secure_generator()
        t0 = time.perf_counter()
        sample_discrete_laplace(a, m, g)
        dt = time.perf_counter() - t0
        print(f"DLap sampler {label}: {m / dt / 1e6:.1f} M samples/s (target >= 5 for secure)")


if __name__ == "__main__":
    main()
