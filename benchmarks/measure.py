"""End-to-end throughput of `araopt measure` on DirectRunner (in_memory) vs a naive per-element Beam
pipeline, and peak memory at two input sizes.

    .venv/bin/python benchmarks/measure.py [--sizes 2000000,10000000] [--naive-rows 1000000]

Each measured run is a separate process (`python -m pipelines.measure ...`); its peak RSS is read
with os.wait4. The naive design (rows as dicts -> GroupByKey on impression_id -> Python per element
-> CombinePerKey) is run on --naive-rows rows (it runs at tens of thousands of rows/s, so 10M rows
would take minutes); throughput per row is what is compared.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from araopt import Params, QueryParams  # noqa: E402

ROWS_PER_FILE = 1_000_000


def write_synthetic(directory: str, n: int, seed: int = 0) -> None:
    """~10 conversions per impression, 256 slices (16 x 8 x 2), log-normal values (synth-criteo-like)."""
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed)
    impressions = max(1, n // 10)
    for f, start in enumerate(range(0, n, ROWS_PER_FILE)):
        m = min(ROWS_PER_FILE, n - start)
        imp = rng.integers(0, impressions, m)
        slice_code = (imp * 2654435761) % 256  # the slice is an impression feature
        table = pa.table({
            "impression_id": pa.array(imp, pa.int64()),
            "conversion_time": pa.array(rng.integers(1_700_000_000_000_000, 1_702_592_000_000_000, m),
                                        pa.timestamp("us", tz="UTC")),
            "campaignId": pa.array((slice_code // 16).astype(np.int32)),
            "geography": pa.array((slice_code % 16 // 2).astype(np.int32)),
            "productCategory": pa.array((slice_code % 2).astype(np.int32)),
            "value": pa.array(rng.lognormal(4.19, 1.16, m)),
        })
        pq.write_table(table, os.path.join(directory, f"part-{f:05d}.parquet"))


def write_domain(path: str) -> str:
    """The declared domain: all 16 x 8 x 2 slices (a release needs one; see README)."""
    with open(path, "w") as fh:
        fh.write("campaignId,geography,productCategory\n")
        for c in range(16):
            for g in range(8):
                for pc in range(2):
                    fh.write(f"{c},{g},{pc}\n")
    return path


def params() -> Params:
    return Params(count_limit=4, encoding="linf", epsilon=8.0, slice_columns=("campaignId", "geography", "productCategory"),
                  queries=(QueryParams("value", 150.0, 1.0),))


def shard_working_set(directory: str, num_shards: int) -> tuple[int, float]:
    """(rows, peak traced MiB) of the per-shard step (Conversions -> encode + bound -> per-slice sums)
    on shard 0 of ``directory`` split ``num_shards`` ways, as the pipeline's GroupByImpression does."""
    import glob
    import tracemalloc

    from araopt import aggregate
    from araopt.conversions import Conversions, validate_table
    from araopt.keys import KeyDomain
    from araopt.mechanism import encode_and_bound
    from transforms.group import shard_of

    p = params()
    parts = []
    for path in sorted(glob.glob(os.path.join(directory, "*.parquet"))):
        table = pq.read_table(path)
        mask = shard_of(table.column("impression_id").to_numpy(), num_shards) == 0
        parts.append(table.filter(pa.array(mask)))
    shard, _ = validate_table(pa.concat_tables(parts), p.slice_columns, p.query_columns)
    tracemalloc.start()
    conv = Conversions.from_table(shard, p.slice_columns, p.query_columns)
    contributions, kept = encode_and_bound(conv, p, simulation_seed=1)
    domain = KeyDomain.from_slice_values(p.slice_columns, conv.slices, p.query_columns)
    aggregate.domain_sums(domain.slice_index(conv.slices), contributions, kept, domain.num_slices)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return shard.num_rows, peak / 2**20


def run_child(args: list[str]) -> tuple[float, float, float]:
    """(wall seconds, peak RSS MiB, CPU seconds: user + system) of a child process. On a shared
    machine the CPU time is the steadier figure to compare two versions with."""
    start = time.perf_counter()
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if status != 0:
        raise SystemExit(f"command failed: {' '.join(args)}\n{proc.stderr.read().decode()[-3000:]}")
    return wall, usage.ru_maxrss / 1024.0, usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="2000000,10000000")
    parser.add_argument("--naive-rows", type=int, default=1_000_000)
    parser.add_argument("--keep", action="store_true", help="keep the generated data")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    work = tempfile.mkdtemp(prefix="araopt-bench-")
    py = sys.executable
    try:
        params().save(os.path.join(work, "params.json"))
        domain = write_domain(os.path.join(work, "domain.csv"))
        os.environ["ARAOPT_LEDGER"] = os.path.join(work, "ledger")
        results = {}
        for n in sizes:
            data = os.path.join(work, f"data-{n}")
            t0 = time.perf_counter()
            write_synthetic(data, n)
            print(f"generated {n:,} conversions in {time.perf_counter() - t0:.1f} s", flush=True)
            out = os.path.join(work, f"out-{n}")
            wall, rss, cpu = run_child([py, "-m", "pipelines.measure", "--input", data,
                                   "--params", os.path.join(work, "params.json"), "--output", out, "--domain", domain,
                                   "--direct_running_mode", "in_memory"])
            results[n] = (wall, rss)
            print(f"araopt measure, {n:>11,} conversions: {wall:6.1f} s end to end = {n / wall:>9,.0f} conversions/s, "
                  f"peak RSS {rss:,.0f} MiB, CPU {cpu:.1f} s", flush=True)
        naive_n = args.naive_rows
        naive_data = os.path.join(work, "data-naive")
        write_synthetic(naive_data, naive_n)
        wall, rss, _ = run_child([py, os.path.join(ROOT, "benchmarks", "naive_measure.py"), naive_data,
                               os.path.join(work, "params.json")])
        naive_rate = naive_n / wall
        print(f"naive per-element Beam, {naive_n:,} conversions: {wall:6.1f} s = {naive_rate:,.0f} conversions/s, "
              f"peak RSS {rss:,.0f} MiB")
        big = max(results)
        rate = big / results[big][0]
        from transforms.io import auto_num_shards

        for n in sizes:
            data = os.path.join(work, f"data-{n}")
            for label, shards in (("fixed 64 shards", 64), ("auto shards", auto_num_shards(n))):
                rows, mib = shard_working_set(data, shards)
                print(f"per-shard working set, {n:>11,} conversions, {label:<15} ({shards:>3}): shard of {rows:>9,} rows "
                      f"-> peak {mib:7.1f} MiB traced ({mib * 2**20 / rows:.0f} B/row)")
        print(f"speed-up of araopt measure over the naive design: {rate / naive_rate:.1f}x (target >= 15x)")
        print(f"throughput at {big:,}: {rate:,.0f} conversions/s (target >= 500,000)")
        if len(results) > 1:
            small = min(results)
            print(f"peak RSS {small:,}: {results[small][1]:,.0f} MiB vs {big:,}: {results[big][1]:,.0f} MiB "
                  f"(input x{big / small:.0f}, memory x{results[big][1] / results[small][1]:.2f})")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"data kept in {work}")


if __name__ == "__main__":
    main()
