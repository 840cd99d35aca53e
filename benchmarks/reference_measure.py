"""A plain numpy/pyarrow script doing the core of ``araopt measure`` on a log: shard by a hash of the
impression id -> sort each shard by (impression, time) -> encode (Alg. 3, L-inf, randomized rounding)
-> cap (Alg. 1, a prefix of each impression's contributions) -> per-key sums (bincount). No
validation, ledger, noise, dead letter or output files: the floor against which ``benchmarks/scale.py``
compares measure's CPU time.

    .venv/bin/python benchmarks/reference_measure.py LOG_FOLDER_OR_FILE PARAMS.json [--num-shards 64]

Reads the columns ``impression_id``, ``conversion_time`` and the parameter file's slice and value
columns; prints the rows read, kept and the sum of every query's column. It imports nothing from araopt.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq


def id_hash(ids: pa.Array) -> np.ndarray:
    """64-bit hash of every id, each distinct id hashed once."""
    encoded = pc.dictionary_encode(ids)
    words = pd.util.hash_array(encoded.dictionary.to_numpy(zero_copy_only=False))
    return np.asarray(words, dtype=np.uint64)[encoded.indices.to_numpy(zero_copy_only=False)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("log")
    ap.add_argument("params")
    ap.add_argument("--num-shards", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    params = json.loads(Path(args.params).read_text())
    slices = list(params["slice_columns"])
    queries = params["queries"]
    values = [q["column"] for q in queries]
    budget, count_limit = int(params["contribution_budget"]), int(params["count_limit"])
    per_record = budget // count_limit
    weights = np.array([int(q["budget_fraction"] * budget / count_limit) for q in queries], dtype=np.float64)
    clips = np.array([q["clip_threshold"] for q in queries], dtype=np.float64)
    rng = np.random.default_rng(args.seed)

    log = Path(args.log)
    files = sorted(log.rglob("*.parquet")) if log.is_dir() else [log]
    shards: list[list[pa.Table]] = [[] for _ in range(args.num_shards)]
    rows = 0
    for file in files:
        for batch in pq.ParquetFile(file).iter_batches(batch_size=1 << 20, columns=["impression_id", "conversion_time",
                                                                                    *slices, *values]):
            table = pa.Table.from_batches([batch])
            rows += table.num_rows
            hashed = id_hash(table.column("impression_id").combine_chunks())
            shard = (hashed % np.uint64(args.num_shards)).astype(np.int16)
            order = np.argsort(shard, kind="stable")
            table = table.take(pa.array(order)).append_column("h", pa.array(hashed[order]))
            bounds = np.searchsorted(shard[order], np.arange(args.num_shards + 1))
            for s in range(args.num_shards):
                if bounds[s + 1] > bounds[s]:
                    shards[s].append(table.slice(bounds[s], bounds[s + 1] - bounds[s]))

    codes = {c: {} for c in slices}  # slice value -> code, shared over the shards
    sums: dict[int, np.ndarray] = {}
    kept_total = 0
    for parts in shards:
        if not parts:
            continue
        table = pa.concat_tables(parts)
        parts.clear()
        h = table.column("h").to_numpy()
        t = table.column("conversion_time").cast(pa.int64()).to_numpy()
        order = np.lexsort((t, h))
        h = h[order]
        v = np.column_stack([table.column(c).to_numpy().astype(np.float64)[order] for c in values])
        # encode (Alg. 3): RR(weight * min(v, C) / C), bottom key = per_record - sum
        omega = weights * np.minimum(v, clips) / clips
        w = np.floor(omega + rng.random(omega.shape)).astype(np.int64)
        norm = np.full(len(h), per_record, dtype=np.int64)  # L-inf: every record costs floor(budget / C)
        # cap (Alg. 1): each impression's contributions in time order while their sum fits the budget
        start = np.empty(len(h), dtype=bool)
        start[0] = True
        np.not_equal(h[1:], h[:-1], out=start[1:])
        cum = np.cumsum(norm)
        first = np.flatnonzero(start)
        group = np.cumsum(start) - 1
        before = (cum - norm)[first][group]
        kept = cum - before <= budget
        kept_total += int(kept.sum())
        key = np.zeros(len(h), dtype=np.int64)
        for c in slices:
            col = pc.dictionary_encode(table.column(c).combine_chunks())
            local = np.array([codes[c].setdefault(x, len(codes[c])) for x in col.dictionary.to_pylist()], dtype=np.int64)
            key = key * 4096 + local[col.indices.to_numpy()][order]
        distinct, inverse = np.unique(key[kept], return_inverse=True)
        for j in range(len(values)):
            per_key = np.bincount(inverse, weights=w[kept, j], minlength=len(distinct))
            for k, s in zip(distinct.tolist(), per_key.tolist(), strict=True):
                sums.setdefault(k, np.zeros(len(values)))[j] += s
    totals = np.sum(list(sums.values()), axis=0) if sums else np.zeros(len(values))
    print(f"reference: {rows:,} rows read, {kept_total:,} kept, {len(sums)} keys, sums {totals.tolist()}")


if __name__ == "__main__":
    main()
