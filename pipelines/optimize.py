"""`araopt optimize`: choose C, clip thresholds and budget fractions on a conversion history (Alg. 6).

    araopt optimize --history 'logs/*.parquet' --slices campaignId,geography --values value \
        --epsilon 8 [--encoding linf|l1] [--max-count-limit 20] [--objective exact|relaxed] \
        --out params.json [Beam options]

Statistics (bounded, mergeable; ``araopt.statistics``) are computed by the Beam transform
``transforms.statistics.compute_statistics``; the optimizer (``araopt.optimizer``) runs on the
driver, with a progress bar over candidate C. The parameter file records the predicted training
RMSRE_tau of the result and of the paper's baselines (q = 0.95 and 0.99).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Sequence

import numpy as np
import pandas as pd

from araopt.optimizer import BASELINE_QUANTILES, baseline_params, objective, optimize
from pipelines.options import OneLineParser
from araopt.params import Provenance, check_epsilon, utc_now_iso
from araopt.statistics import DEFAULT_MAX_COUNT_LIMIT, StatisticsSpec, SufficientStatistics

PROG = "araopt optimize"


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Any other --option is passed to Apache Beam (e.g. --runner DataflowRunner ...).")
    parser.add_argument("--history", required=True, help="Parquet conversion log: file, directory or glob (local or gs://)")
    parser.add_argument("--slices", required=True, help="comma-separated slice columns")
    parser.add_argument("--values", required=True, help="comma-separated value (query) columns")
    parser.add_argument("--epsilon", required=True, type=float, help="privacy budget, in (0, 64]")
    parser.add_argument("--encoding", choices=("linf", "l1"), default="linf", help="Alg. 2 (linf, default) or Alg. 5 (l1)")
    parser.add_argument("--max-count-limit", type=int, default=DEFAULT_MAX_COUNT_LIMIT,
                        help="largest count limit C tried (default 20: Chrome's limit of aggregatable reports per source)")
    parser.add_argument("--objective", choices=("exact", "relaxed"), default="exact",
                        help="exact (Thm. 4.2: DLap variance, rounding, floors; default) or the paper's Relaxation 4.3")
    parser.add_argument("--l1-rounding", choices=("randomized", "floor"), default="randomized",
                        help="L1 rounding written to the file (default randomized: unbiased)")
    parser.add_argument("--out", required=True, help="output parameter file (.json)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def split_columns(text: str, what: str) -> tuple[str, ...]:
    cols = tuple(c.strip() for c in text.split(",") if c.strip())
    if not cols and what == "--values":
        raise ValueError(f"{what} must name at least one column")
    if len(set(cols)) != len(cols):
        raise ValueError(f"{what} lists a column twice: {text!r}")
    return cols


def check_history(pattern: str, slice_columns: Sequence[str], value_columns: Sequence[str]) -> list[str]:
    """Before any work: files exist, columns exist with the right types, rows > 0, no negative value
    (from the Parquet footers' statistics; rows without statistics are checked by the pipeline)."""
    return _scan_history(pattern, slice_columns, value_columns)[0]


def _scan_history(pattern: str, slice_columns: Sequence[str], value_columns: Sequence[str]) -> tuple[list[str], tuple]:
    """(paths, (first, last) conversion time from the footers' statistics or (None, None))."""
    import pyarrow.parquet as pq
    from apache_beam.io.filesystems import FileSystems

    from transforms.io import check_input

    paths = list(check_input(pattern, slice_columns, value_columns).paths)
    rows = 0
    first = last = None
    for path in paths:
        with FileSystems.open(path) as fh:
            meta = pq.ParquetFile(fh).metadata
        rows += meta.num_rows
        names = [meta.schema.column(i).name for i in range(meta.num_columns)]
        if "conversion_time" in names:
            i = names.index("conversion_time")
            for g in range(meta.num_row_groups):
                st = meta.row_group(g).column(i).statistics
                if st is not None and st.has_min_max and st.min is not None and st.max is not None:
                    first = st.min if first is None else min(first, st.min)
                    last = st.max if last is None else max(last, st.max)
        for col in value_columns:
            if col not in names:
                continue
            i = names.index(col)
            for g in range(meta.num_row_groups):
                st = meta.row_group(g).column(i).statistics
                if st is not None and st.has_min_max and st.min is not None and float(st.min) < 0:
                    raise ValueError(f"value column {col!r} has negative values (min {st.min}) in {path}; "
                                     "values must be >= 0 (conversion-log contract)")
    if rows == 0:
        raise ValueError(f"empty history: {pattern!r} holds no rows")
    window = tuple(v.isoformat() if hasattr(v, "isoformat") else (None if v is None else str(v)) for v in (first, last))
    return paths, window


def compute_statistics(pattern: str, spec: StatisticsSpec, pipeline_args: list[str]) -> tuple[SufficientStatistics, dict]:
    """The Beam statistics pipeline (``transforms.statistics``); in memory when it is not installed."""
    try:
        from transforms.statistics import compute_statistics as beam_statistics
    except ModuleNotFoundError:
        return statistics_in_memory(pattern, spec)
    return beam_statistics(pattern, spec, pipeline_args)


def statistics_in_memory(pattern: str, spec: StatisticsSpec) -> tuple[SufficientStatistics, dict]:
    """Fallback: read the whole log with pyarrow and use the core combiner (small data only)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from apache_beam.io.filesystems import FileSystems

    from araopt.conversions import Conversions, validate_table
    from araopt.statistics import compute_statistics_in_memory
    from transforms.io import match_files, needed_columns

    tables = []
    for path in match_files(pattern):
        with FileSystems.open(path) as fh:
            tables.append(pq.read_table(fh, columns=needed_columns(spec.slice_columns, spec.value_columns)))
    table = pa.concat_tables(tables, promote_options="default") if tables else None
    if table is None or table.num_rows == 0:
        raise ValueError(f"empty history: {pattern!r} holds no rows")
    good, rejected = validate_table(table, spec.slice_columns, spec.value_columns)
    reasons = pd.Series(rejected.column("reason").to_pylist(), dtype=object).value_counts().to_dict()
    stats = compute_statistics_in_memory(Conversions.from_table(good, spec.slice_columns, spec.value_columns), spec)
    return stats, {"rows_read": table.num_rows, "rows_rejected": rejected.num_rows,
                   **{f"rows_rejected_{k}": int(v) for k, v in reasons.items()}}


def check_accounting(stats: SufficientStatistics, accounting: dict) -> None:
    negative = int(accounting.get("rows_rejected_negative_value", 0) or
                   (accounting.get("rows_rejected_by_reason", {}) or {}).get("negative_value", 0))
    if negative:
        raise ValueError(f"{negative} history rows have negative values; values must be >= 0 (conversion-log contract)")
    if stats.num_conversions == 0:
        raise ValueError("empty history: no valid conversion rows")


def result_table(rows: list[dict]) -> str:
    frame = pd.DataFrame(rows)
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.float_format", "{:.6g}".format):
        return frame.to_string(index=False)


def run_optimize(argv: Sequence[str] | None = None) -> int:
    from .options import cli_main

    return cli_main(_run, argv, PROG)


def _run(argv: list[str]) -> int:
    args, beam_args = build_parser().parse_known_args(argv)
    epsilon = check_epsilon(args.epsilon, "--epsilon")
    if args.max_count_limit < 1:
        raise ValueError(f"--max-count-limit must be >= 1, got {args.max_count_limit}")
    slices = split_columns(args.slices, "--slices")
    values = split_columns(args.values, "--values")
    spec = StatisticsSpec(slices, values, max_count_limit=args.max_count_limit)  # validates column overlap
    _, window = _scan_history(args.history, slices, values)
    stats, accounting = compute_statistics(args.history, spec, beam_args)
    check_accounting(stats, accounting)

    result = optimize(stats, epsilon, args.encoding, args.max_count_limit, args.objective,
                      progress=not args.no_progress, l1_rounding=args.l1_rounding)
    taus = np.asarray(result.taus)
    rows = [{"method": f"optimized {args.encoding}", "C": result.params.count_limit,
             "thresholds": ", ".join(f"{q.clip_threshold:.4g}" for q in result.params.queries),
             "fractions": ", ".join("-" if q.budget_fraction is None else f"{q.budget_fraction:.3f}" for q in result.params.queries),
             "train RMSRE_tau": result.objective, "ratio": 1.0}]
    baselines = {}
    for q in BASELINE_QUANTILES:
        p = baseline_params(stats, epsilon, q, args.max_count_limit, taus)
        value = objective(stats, p, taus, args.objective)
        baselines[f"q{q:g}"] = {"count_limit": p.count_limit, "rmsre_tau": value,
                                "clip_thresholds": [qq.clip_threshold for qq in p.queries]}
        rows.append({"method": f"baseline q={q:g}", "C": p.count_limit,
                     "thresholds": ", ".join(f"{qq.clip_threshold:.4g}" for qq in p.queries),
                     "fractions": ", ".join(f"{qq.budget_fraction:.3f}" for qq in p.queries) + f" (+count {p.count_budget_fraction:.3f})",
                     "train RMSRE_tau": value, "ratio": value / result.objective})
    prov = Provenance(training_start=window[0], training_end=window[1],
                      rows=int(accounting.get("rows_read", stats.num_conversions)), created_at=utc_now_iso(),
                      predicted_rmsre_tau=result.objective,
                      baseline_rmsre_tau=min(b["rmsre_tau"] for b in baselines.values()), objective=args.objective,
                      extra={"optimizer": "araopt.optimizer.optimize (Alg. 6)", "encoding": args.encoding,
                             "max_count_limit": args.max_count_limit, "history": args.history,
                             "baselines": baselines, "row_accounting": {k: v for k, v in accounting.items()
                                                                        if isinstance(v, (int, float, str))},
                             "per_count_limit": [{"C": r.count_limit, "rmsre_tau": r.objective} for r in result.per_count_limit],
                             "optimizer_seconds": result.seconds})
    params = dataclasses.replace(result.params.with_domain_of(stats.slice_values()), provenance=prov)
    params.save(args.out)
    print(f"{stats.num_conversions} conversions, {stats.num_impressions} impressions, {stats.num_slices} slices; "
          f"epsilon = {epsilon:g}, objective = {args.objective}, taus = {', '.join(f'{t:.4g}' for t in taus)}")
    print(result_table(rows))
    print(f"wrote {args.out}  (optimizer {result.seconds:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(run_optimize())
