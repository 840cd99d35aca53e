"""W3C Attribution Level 1 in memory vs ARA in memory, on the same synthetic rows: CPU seconds of
``araopt.attribution.measure.measure`` (browsers, budgets, noise, estimates) and of
``araopt.mechanism.measure.measure`` (Alg. 1-4), simulation mode, 8 conversions per browser.

Run: .venv/bin/python benchmarks/attribution.py [--rows N]

``--whole-process DIR``: instead, the commands as an operator runs them, each a separate process
(``python -m pipelines.cli measure``, simulation mode, declared layouts, ``--shuffle files``): the same
rows written as Parquet files under DIR, measured with an ARA parameter version and with an
attribution one; CPU seconds of the process tree (``benchmarks/scale.py``'s ``run``: user + system of
the process and its children) and its peak RSS.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

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


def _versions(root: Path) -> tuple[Path, Path]:
    """An ARA and an attribution parameter version over the same 16 campaigns (declared layouts)."""
    from araopt.mechanism.keys import DECLARED
    from araopt.version import ParameterVersion

    campaigns = {"campaign": np.arange(16)}
    ara = Params(count_limit=4, encoding="l1", epsilon=1.0, slice_columns=("campaign",),
                 queries=(QueryParams("value", 40.0),))
    ara_version = ParameterVersion(ara, domain=KeyDomain.from_slice_values(("campaign",), campaigns, ("value",))
                                   .with_origin(DECLARED))
    queries = (AttributionQuery(COUNT, None), AttributionQuery("value", "value", max_value=255, clip=40.0))
    w3c = AttributionParams.from_paper(4.0, 3, {COUNT: 0.3, "value": 0.7}, queries, ("campaign",))
    w3c_version = ParameterVersion.for_attribution(
        w3c, domain=KeyDomain.from_slice_values(("campaign",), campaigns, w3c.query_names).with_origin(DECLARED))
    paths = root / "ara.json", root / "attribution.json"
    ara_version.save(paths[0])
    w3c_version.save(paths[1])
    return paths


def whole_process(rows: int, root: Path, files: int = 10) -> None:
    """``measure`` with each version on the same Parquet rows, one process each (CPU of the tree)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from scale import run

    root.mkdir(parents=True, exist_ok=True)
    log_dir = root / "log"
    if not log_dir.exists():
        log_dir.mkdir()
        log = synthetic_log(rows)
        log["impression_time"] = pd.to_datetime(log["impression_time_us"], unit="us", utc=True)
        log = log.drop(columns=["impression_time_us", "conversion_time_us"])
        for i in range(files):
            pq.write_table(pa.Table.from_pandas(log.iloc[i::files], preserve_index=False), log_dir / f"part-{i}.parquet")
    ara, w3c = _versions(root)
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    out = {}
    for name, version in (("ara", ara), ("attribution", w3c)):
        argv = [sys.executable, "-m", "pipelines.cli", "measure", "--input", str(log_dir), "--params", str(version),
                "--output", str(root / f"out-{name}"), "--simulation-seed", "1", "--overwrite", "--no-progress",
                "--shuffle", "files"]
        out[name] = run(argv, env, root / f"{name}.log")
        print(f"{name}: {out[name]['cpu']:.1f} s CPU, {out[name]['wall']:.1f} s wall, {out[name]['rss_mib']:.0f} MiB "
              f"peak RSS", flush=True)
    ratio = out["attribution"]["cpu"] / out["ara"]["cpu"]
    print(f"{rows} rows, measure (whole process): attribution / ARA CPU = {ratio:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--whole-process", metavar="DIR", default=None)
    args = parser.parse_args()
    if args.whole_process is not None:
        whole_process(args.rows, Path(args.whole_process))
        return
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
