"""`araopt measure`: a conversion log -> the summary report ARA would produce under a parameter file,
and estimates with error bars (Alg. 1-4 on Apache Beam).

    python -m pipelines.measure --input 'logs/*.parquet' --params params.json --output out/ \
        [--epsilon 8] [--debug-run] [--domain key_map.json] [--simulation-seed 1] [Beam options]

Data flow: ReadFromParquetBatched -> validate (dead letter) -> shard by hash(impression_id) ->
GroupByKey -> per shard: sort, encode, bound (Alg. 1), per-slice sums -> CombineGlobally (integer) ->
noise once per domain key (Alg. 3) -> reconstruct (Alg. 4) -> Avro / Parquet / CSV / JSON outputs.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import time
from dataclasses import dataclass
from typing import Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from araopt.keys import KeyDomain
from araopt.params import Params, check_epsilon
from transforms.aggregate import EncodeBoundAndSum, NoisyRelease
from transforms.group import GroupByImpression
from transforms.io import ReadConversions, auto_num_shards, check_input, count_rows, needed_columns
from transforms.release import WriteRelease
from transforms.validate import REJECTED, ValidateConversions, counter_values, rejected_by_reason, sum_pairs

from deploy.cli_options import MEASURE_OPTIONS, add_options

from .options import SHUFFLES, UserError, cli_main, make_runner, pipeline_options, remove_dir, runner_name, spill_dir

DEFAULT_SHARDS = 64


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="araopt measure", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Any other --option is passed to Apache Beam (e.g. --runner DataflowRunner --project P "
               "--region R --temp_location gs://... --setup_file ./setup.py, or --direct_num_workers 2 "
               "--direct_running_mode multi_processing).")
    add_options(parser, MEASURE_OPTIONS)  # --input --params --output --epsilon --debug-run --domain (shared with deploy/)
    parser.add_argument("--params-version", default="latest", help="version to resolve in a parameter store (default latest)")
    parser.add_argument("--simulation-seed", type=int, default=None,
                        help="SIMULATION MODE: seeded, key-deterministic rounding and noise; output is NOT private")
    parser.add_argument("--num-shards", type=int, default=None,
                        help="impression shards (default: about 250,000 rows per shard, at least 16)")
    parser.add_argument("--shuffle", choices=SHUFFLES, default="auto",
                        help="group-by-impression shuffle: files (spilled Arrow files; default locally), memory "
                             "(plain GroupByKey; default on Dataflow), auto")
    parser.add_argument("--max-rejected-fraction", type=float, default=0.10,
                        help="fail before releasing if more than this share of rows is invalid (default 0.10)")
    parser.add_argument("--overwrite", action="store_true", help="allow writing into an output directory that has a run")
    return parser


@dataclass(frozen=True)
class LoadedParams:
    params: Params
    source: dict


def load_params(ref: str, version: str = "latest") -> LoadedParams:
    """A parameter file (.json, local or gs://), or a store URI (``STORE`` -> latest, or
    ``STORE/versions/<v>``) resolved to a checksum-verified version."""
    if ref.endswith(".json"):
        try:
            with FileSystems.open(ref) as fh:
                raw = fh.read()
        except Exception as exc:  # noqa: BLE001 - any IO failure is a user-facing error here
            raise UserError(f"cannot read parameter file {ref}: {exc}") from None
        params = Params.from_bytes(raw, source=ref)
        return LoadedParams(params, {"path": ref, "sha256": hashlib.sha256(raw).hexdigest()})
    from araopt.store import StoreError, open_store, resolve_params_ref

    try:
        resolved = open_store(ref).resolve(version) if version != "latest" else resolve_params_ref(ref)
    except StoreError as exc:
        raise UserError(str(exc)) from None
    params = Params.from_bytes(resolved.payload, source=resolved.uri)
    return LoadedParams(params, {"path": resolved.uri, **resolved.summary()})


def load_domain(path: str | None, params: Params) -> KeyDomain | None:
    if path is None:
        return None
    with FileSystems.open(path) as fh:
        data = json.loads(fh.read().decode())
    domain = KeyDomain.from_json(data, source=path)
    if domain.slice_columns != params.slice_columns or domain.query_names != params.query_columns:
        raise UserError(f"domain {path} is for slices {domain.slice_columns} / queries {domain.query_names}, "
                        f"the parameters use {params.slice_columns} / {params.query_columns}")
    return domain


def build_pipeline(pipeline: beam.Pipeline, input_pattern: str, params: Params, output: str, params_sha256: str,
                   domain: KeyDomain | None = None, simulation_seed: int | None = None, debug_run: bool = False,
                   num_shards: int = DEFAULT_SHARDS, max_rejected_fraction: float = 0.10, dead_letter_schema=None,
                   shuffle_dir: str | None = None):
    """Wire the measurement transforms; returns the release PCollection."""
    columns = needed_columns(params.slice_columns, params.query_columns)
    batches = pipeline | "ReadConversions" >> ReadConversions(input_pattern, columns)
    checked = batches | "Validate" >> ValidateConversions(params.slice_columns, params.query_columns)
    counts = checked.counts | "CountRows" >> beam.CombineGlobally(sum_pairs)
    if dead_letter_schema is not None:
        _ = checked[REJECTED] | "WriteDeadLetters" >> beam.io.WriteToParquetBatched(
            FileSystems.join(output, "dead_letter", "rejected"), schema=dead_letter_schema, num_shards=1,
            shard_name_template="", file_name_suffix=".parquet")
    merged = (
        checked.valid
        | "GroupByImpression" >> GroupByImpression(num_shards, shuffle_dir)
        | "EncodeBoundAndSum" >> EncodeBoundAndSum(params, simulation_seed)
    )
    release = merged | "NoisyRelease" >> NoisyRelease(params, counts, domain, simulation_seed, max_rejected_fraction)
    release | "WriteRelease" >> WriteRelease(output, params_sha256, debug_run)
    return release


def run(argv: Sequence[str] | None = None) -> int:
    return cli_main(_run, argv, "araopt measure")


def _run(argv: list[str]) -> int:
    args, beam_args = build_parser().parse_known_args(argv)
    started = time.time()
    loaded = load_params(args.params, args.params_version)
    params = loaded.params
    if args.epsilon is not None:
        params = params.with_epsilon(check_epsilon(args.epsilon, "--epsilon"))
    if not 0.0 <= args.max_rejected_fraction <= 1.0:
        raise UserError(f"--max-rejected-fraction must lie in [0, 1], got {args.max_rejected_fraction}")
    if args.num_shards is not None and args.num_shards < 1:
        raise UserError(f"--num-shards must be >= 1, got {args.num_shards}")
    summary_path = FileSystems.join(args.output, "run_summary.json")
    if FileSystems.exists(summary_path) and not args.overwrite:
        raise UserError(f"{args.output} already holds a run (run_summary.json); pass --overwrite to replace it")
    paths, schema = check_input(args.input, params.slice_columns, params.query_columns)
    num_shards = args.num_shards or auto_num_shards(count_rows(paths))
    domain = load_domain(args.domain, params)
    import pyarrow as pa

    dl_fields = [schema.field(c) for c in needed_columns(params.slice_columns, params.query_columns)]
    dead_letter_schema = pa.schema(dl_fields + [pa.field("reason", pa.string())])
    opts = pipeline_options(beam_args)
    shuffle_dir = spill_dir(opts, args.shuffle)
    pipeline = beam.Pipeline(runner=make_runner(opts), options=opts)
    build_pipeline(pipeline, args.input, params, args.output, params.checksum(), domain, args.simulation_seed,
                   args.debug_run, num_shards, args.max_rejected_fraction, dead_letter_schema, shuffle_dir)
    try:
        result = pipeline.run()
        result.wait_until_finish()
    finally:
        remove_dir(shuffle_dir)
    summary = run_summary(args, result, loaded, params, paths, opts, time.time() - started)
    summary["num_shards"] = num_shards
    summary["shuffle"] = "files" if shuffle_dir else "memory"
    with FileSystems.create(summary_path) as fh:
        fh.write(json.dumps(summary, indent=1).encode())
    print_summary(summary, args.output)
    return 0


def run_summary(args, result, loaded: LoadedParams, params: Params, paths: list[str], opts, wall: float) -> dict:
    with FileSystems.open(FileSystems.join(args.output, "release.json")) as fh:
        release = json.loads(fh.read().decode())
    counters = counter_values(result)
    rejected = rejected_by_reason(result)
    summary = {
        "rows_read": release["rows_read"],
        "rows_rejected": release["rows_rejected"],
        "rows_rejected_by_reason": rejected,
        "conversions_kept": release["conversions_kept"],
        "conversions_dropped_by_cap": release["conversions_capped"],
        "conversions_kept_outside_domain": release["conversions_kept_outside_domain"],
        "impressions": counters.get("impressions"),
        "slices": release["slices"],
        "keys": release["keys"],
        "epsilon": params.epsilon,
        "encoding": params.encoding,
        "count_limit": params.count_limit,
        "parameters": loaded.source,
        "simulation": args.simulation_seed is not None,
        "simulation_seed": args.simulation_seed,
        "input_files": len(paths),
        "runner": runner_name(opts),
        "wall_time_s": round(wall, 3),
    }
    closes = summary["rows_read"] == (summary["conversions_kept"] + summary["conversions_dropped_by_cap"]
                                      + summary["conversions_kept_outside_domain"] + summary["rows_rejected"])
    summary["accounting_closes"] = bool(closes)
    if not closes:
        raise RuntimeError(f"row accounting does not close: {summary}")
    return summary


def print_summary(summary: dict, output: str) -> None:
    print(f"araopt measure: {summary['rows_read']:,} rows read, {summary['rows_rejected']:,} rejected, "
          f"{summary['conversions_kept']:,} kept, {summary['conversions_dropped_by_cap']:,} dropped by the cap; "
          f"{summary['keys']:,} keys released at epsilon={summary['epsilon']:g} in {summary['wall_time_s']:.1f} s")
    print(f"outputs under {output}: summary_report.avro, output_domain.avro, key_map.json/.csv, "
          f"estimates.parquet/.csv, dead_letter/, run_summary.json")


if __name__ == "__main__":
    raise SystemExit(run())
