"""End-to-end throughput of `araopt measure` on DirectRunner (in_memory) vs a strict per-element Beam
pipeline measured in the same run, with integer, string and dictionary-encoded string slices, and
peak memory.

    .venv/bin/python benchmarks/measure.py [--sizes 2000000,10000000] [--slices int,string,dictionary]
                                           [--naive-rows 1000000] [--log synth|realistic]

``--log synth`` (the default): ~10 conversions per impression, three integer slice columns (256
slices), one value column. ``--log realistic``: 5 conversions per impression, one slice column with
64 campaign names, two value columns; ``--slices`` picks its slice column's type: ``int`` (the
campaign's number), ``string`` (its name) or ``dictionary`` (the name, dictionary-encoded in the
Arrow schema, as pandas categoricals are written).

Each measured run is a separate process (`python -m pipelines.measure ...`); its peak RSS is read
with os.wait4. The strict per-element design (rows as dicts -> GroupByKey on impression_id ->
FlatMap in Python per element -> CombinePerKey) runs on --naive-rows rows of the same log (it runs at
tens of thousands of rows/s, so 10M rows would take minutes); throughput per row is what is compared.
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
from araopt.version import ParameterVersion  # noqa: E402

ROWS_PER_FILE = 1_000_000
CAMPAIGNS = 64


def campaign_name(code: int) -> str:
    return f"campaign-{code:02d}-spring-sale-{'abcdefgh'[code % 8]}"


def write_synthetic(directory: str, n: int, seed: int = 0, log: str = "synth", slices: str = "int") -> None:
    """``synth``: ~10 conversions per impression, 256 slices (16 x 8 x 2), log-normal values (synth-criteo-like);
    ``realistic``: 5 conversions per impression, one slice column of 64 campaigns, two value columns."""
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed)
    impressions = max(1, n // (10 if log == "synth" else 5))
    names = pa.array([campaign_name(c) for c in range(CAMPAIGNS)])
    for f, start in enumerate(range(0, n, ROWS_PER_FILE)):
        m = min(ROWS_PER_FILE, n - start)
        imp = rng.integers(0, impressions, m)
        columns = {
            "impression_id": pa.array(imp, pa.int64()),
            "conversion_time": pa.array(rng.integers(1_700_000_000_000_000, 1_702_592_000_000_000, m),
                                        pa.timestamp("us", tz="UTC")),
        }
        if log == "synth":
            slice_code = (imp * 2654435761) % 256  # the slice is an impression feature
            columns.update({
                "campaignId": pa.array((slice_code // 16).astype(np.int32)),
                "geography": pa.array((slice_code % 16 // 2).astype(np.int32)),
                "productCategory": pa.array((slice_code % 2).astype(np.int32)),
                "value": pa.array(rng.lognormal(4.19, 1.16, m)),
            })
        else:
            code = ((imp * 2654435761) % CAMPAIGNS).astype(np.int32)
            campaign = {"int": pa.array(code),
                        "string": names.take(pa.array(code)),
                        "dictionary": pa.DictionaryArray.from_arrays(pa.array(code), names)}[slices]
            columns.update({"campaign": campaign, "value": pa.array(rng.lognormal(4.19, 1.16, m)),
                            "items": pa.array(rng.poisson(2.0, m).astype(np.int64))})
        pq.write_table(pa.table(columns), os.path.join(directory, f"part-{f:05d}.parquet"))


def write_domain(path: str, log: str = "synth", slices: str = "int") -> str:
    """The declared domain: every slice of the log (a release needs one; see README)."""
    with open(path, "w") as fh:
        if log == "synth":
            fh.write("campaignId,geography,productCategory\n")
            for c in range(16):
                for g in range(8):
                    for pc in range(2):
                        fh.write(f"{c},{g},{pc}\n")
        else:
            fh.write("campaign\n" + "".join(f"{c if slices == 'int' else campaign_name(c)}\n" for c in range(CAMPAIGNS)))
    return path


def params(log: str = "synth") -> Params:
    if log == "synth":
        return Params(count_limit=4, encoding="linf", epsilon=8.0,
                      slice_columns=("campaignId", "geography", "productCategory"),
                      queries=(QueryParams("value", 150.0, 1.0),))
    return Params(count_limit=4, encoding="linf", epsilon=8.0, slice_columns=("campaign",),
                  queries=(QueryParams("value", 150.0, 0.7), QueryParams("items", 4.0, 0.3)))


def shard_working_set(directory: str, num_shards: int) -> tuple[int, float]:
    """(rows, peak traced MiB) of the per-shard step (Conversions -> encode + bound -> per-slice sums)
    on shard 0 of ``directory`` split ``num_shards`` ways, as the pipeline's GroupByImpression does."""
    import glob
    import tracemalloc

    from araopt.io.conversions import Conversions, validate_table
    from araopt.mechanism import aggregate
    from araopt.mechanism.keys import KeyDomain
    from araopt.mechanism.measure import encode_and_bound
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
    machine the wall time depends on the other load; the CPU time much less."""
    start = time.perf_counter()
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if status != 0:
        raise SystemExit(f"command failed: {' '.join(args)}\n{proc.stderr.read().decode()[-3000:]}")
    return wall, usage.ru_maxrss / 1024.0, usage.ru_utime + usage.ru_stime


def load_average() -> str:
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg()) + f" on {os.cpu_count()} cores"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="2000000,10000000")
    parser.add_argument("--log", choices=("synth", "realistic"), default="synth")
    parser.add_argument("--slices", default="string,dictionary,int",
                        help="slice column types of the realistic log, the first is the one compared with the naive design")
    parser.add_argument("--naive-rows", type=int, default=1_000_000)
    parser.add_argument("--keep", action="store_true", help="keep the generated data")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    kinds = args.slices.split(",") if args.log == "realistic" else ["int"]
    work = tempfile.mkdtemp(prefix="araopt-bench-")
    py = sys.executable
    try:
        ParameterVersion(params(args.log)).save(os.path.join(work, "params.json"))
        os.environ["ARAOPT_LEDGER"] = os.path.join(work, "ledger")
        results = {}
        for kind in kinds:
            domain = write_domain(os.path.join(work, f"domain-{kind}.csv"), args.log, kind)
            for n in sizes:
                data = os.path.join(work, f"data-{kind}-{n}")
                t0 = time.perf_counter()
                write_synthetic(data, n, log=args.log, slices=kind)
                print(f"generated {n:,} conversions ({args.log} log, {kind} slices) in {time.perf_counter() - t0:.1f} s",
                      flush=True)
                wall, rss, cpu = run_child([py, "-m", "pipelines.measure", "--input", data,
                                            "--params", os.path.join(work, "params.json"), "--output",
                                            os.path.join(work, f"out-{kind}-{n}"), "--domain", domain,
                                            "--direct_running_mode", "in_memory"])
                results[kind, n] = (wall, rss)
                print(f"araopt measure, {n:>11,} conversions, {kind:>10} slices: {wall:6.1f} s end to end = "
                      f"{n / wall:>9,.0f} conversions/s ({cpu:.1f} s CPU = {n / cpu:,.0f} conversions per CPU second), "
                      f"peak RSS {rss:,.0f} MiB; {load_average()}", flush=True)
                if n != max(sizes):
                    shutil.rmtree(data, ignore_errors=True)
        naive_n = args.naive_rows
        naive_data = os.path.join(work, "data-naive")
        write_synthetic(naive_data, naive_n, log=args.log, slices=kinds[0])
        wall, rss, cpu = run_child([py, os.path.join(ROOT, "benchmarks", "naive_measure.py"), naive_data,
                                    os.path.join(work, "params.json")])
        naive_rate = naive_n / wall
        print(f"strict per-element Beam (rows as dicts -> GroupByKey -> FlatMap -> CombinePerKey), {kinds[0]} slices, "
              f"{naive_n:,} conversions: {wall:6.1f} s = {naive_rate:,.0f} conversions/s ({cpu:.1f} s CPU), "
              f"peak RSS {rss:,.0f} MiB; {load_average()}")
        from transforms.io import auto_num_shards

        big = max(sizes)
        for n in sizes if args.log == "synth" else ():
            data = os.path.join(work, f"data-int-{n}")
            for label, shards in (("fixed 64 shards", 64), ("auto shards", auto_num_shards(n))):
                if os.path.isdir(data):
                    rows, mib = shard_working_set(data, shards)
                    print(f"per-shard working set, {n:>11,} conversions, {label:<15} ({shards:>3}): shard of {rows:>9,} "
                          f"rows -> peak {mib:7.1f} MiB traced ({mib * 2**20 / rows:.0f} B/row)")
        for kind in kinds:
            wall, rss = results[kind, big]
            rate = big / wall
            print(f"{kind:>10} slices, {big:,} conversions: {rate:,.0f} conversions/s end to end (target >= 1,000,000), "
                  f"{rate / naive_rate:.1f}x the per-element pipeline (target >= 15x), peak RSS {rss:,.0f} MiB")
        if len(sizes) > 1:
            small = min(sizes)
            for kind in kinds:
                print(f"{kind:>10} slices: peak RSS {small:,}: {results[kind, small][1]:,.0f} MiB vs {big:,}: "
                      f"{results[kind, big][1]:,.0f} MiB (input x{big / small:.0f}, "
                      f"memory x{results[kind, big][1] / results[kind, small][1]:.2f})")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"data kept in {work}")


if __name__ == "__main__":
    main()
