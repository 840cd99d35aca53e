"""The naive per-element design of the same measurement, for comparison only (benchmarks/measure.py).

    python benchmarks/naive_measure.py DATA_DIR PARAMS_JSON   (as benchmarks/measure.py runs it)
    python benchmarks/naive_measure.py --quick [--rows 1000]  (its own tiny log and parameters; CI)

Rows as Python dicts -> key by impression_id -> GroupByKey -> per impression: sort by time, encode
each conversion in Python (CRR, eq. 1), Alg. 1 -> (key, value) pairs -> CombinePerKey(sum) -> noise.
"""
from __future__ import annotations

import math
import os
import random
import sys
import tempfile

import apache_beam as beam

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from araopt import Params, sample_discrete_laplace
from araopt.mechanism.noise import noise_parameter
from araopt.version import ParameterVersion
from pipelines.runner import make_runner, pipeline_options


def encode_and_cap(item, params: Params):
    _, rows = item
    rows = sorted(rows, key=lambda r: r["conversion_time"])
    budget = params.per_conversion_budget
    used = 0
    rnd = random.Random()
    for row in rows:
        if used + budget > params.contribution_budget:
            continue
        used += budget
        slice_key = tuple(row[c] for c in params.slice_columns)
        total = 0
        for q in params.queries:
            omega = (math.floor(q.budget_fraction * params.contribution_budget / params.count_limit)
                     * min(row[q.column], q.clip_threshold) / q.clip_threshold)
            w = math.floor(omega) + (rnd.random() < omega - math.floor(omega))
            total += w
            yield (slice_key, q.column), w
        yield (slice_key, "bottom"), budget - total


def run(data: str, params_path: str) -> None:
    params = ParameterVersion.load(params_path).params
    opts = pipeline_options([])
    a = noise_parameter(params.epsilon)
    with beam.Pipeline(runner=make_runner(opts), options=opts) as p:
        _ = (
            p
            | beam.io.ReadFromParquetBatched(os.path.join(data, "*.parquet"))
            | "Rows" >> beam.FlatMap(lambda t: t.to_pylist())
            | "KeyByImpression" >> beam.Map(lambda r: (r["impression_id"], r))
            | beam.GroupByKey()
            | "EncodeAndCap" >> beam.FlatMap(encode_and_cap, params)
            | beam.CombinePerKey(sum)
            | "Noise" >> beam.Map(lambda kv: (kv[0], kv[1] + int(sample_discrete_laplace(a, 1)[0])))
        )


def quick(rows: int) -> None:
    """The same pipeline over a tiny synthetic log and measure.py's parameters, written to a temporary folder."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from measure import params, write_synthetic

    with tempfile.TemporaryDirectory(prefix="araopt-naive-") as work:
        data, params_path = os.path.join(work, "data"), os.path.join(work, "params.json")
        write_synthetic(data, rows)
        ParameterVersion(params()).save(params_path)
        run(data, params_path)
    print(f"naive per-element pipeline: {rows:,} conversions measured")


def main() -> None:
    if sys.argv[1:2] == ["--quick"]:
        rows = int(sys.argv[sys.argv.index("--rows") + 1]) if "--rows" in sys.argv else 1000
        quick(rows)
    else:
        run(sys.argv[1], sys.argv[2])


if __name__ == "__main__":
    main()
