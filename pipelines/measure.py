"""`araopt measure`: a conversion log -> the summary report ARA would produce under a parameter file,
and estimates with error bars (ContributionCapping, Alg. 1; SummaryReport, Alg. 2;
HistogramContribution, Alg. 3 / Alg. 6; ReconstructValues, Alg. 4), on Apache Beam.

    araopt measure --input 'logs/*.parquet' --params STORE_OR_FILE --output out/ \\
        [--domain key_map.json|slices.csv] [--debug-run] [--overwrite] [Beam options]

A release needs a declared key domain (--domain, or the one the parameter version carries); only
simulation mode (--simulation-seed: seeded noise, NOT private) may derive it from the data.
Outputs (``araopt.outputs``): out/release/ is publishable; out/private/ holds exact counts, the dead
letter and the debug report and must never be published; out/MANIFEST.json is written last.

Data flow: Parquet files -> validate (dead letter) -> shard by hash(impression_id) -> GroupByKey ->
per shard: impression-side slices constant (else dead letter), sort, encode, cap, per-key sums over
the domain -> CombineGlobally (integer) -> noise once per domain key -> reconstruct -> Avro / Parquet
/ CSV / JSON.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import apache_beam as beam
import pandas as pd
from apache_beam.io.filesystems import FileSystems

from araopt import jsonio, outputs
from araopt.aggregate import DEFAULT_MAX_SLICES
from araopt.conversions import type_family
from araopt.keys import DATA, KeyDomain, check_domain_families, domain_from_rows
from araopt.params import Params, check_epsilon
from araopt.progress import Progress
from transforms.aggregate import DomainFromData, EncodeBoundAndSum, NoisyRelease
from transforms.io import InputFiles, check_input
from transforms.release import WriteRelease
from transforms.validate import ReadAndValidate

from . import options
from .ledger import Ledger, default_ledger_root, input_identity
from .options import UserError
from .run_folder import RunFolder
from .runner import make_runner, pipeline_options, remove_dir, runner_name, spill_dir

SIMULATION_WARNING = ("WARNING: SIMULATION MODE (--simulation-seed): rounding and noise are seeded and reproducible; "
                      "the output is NOT differentially private and must never be published")


def build_parser() -> argparse.ArgumentParser:
    return options.build_parser("measure")


@dataclass(frozen=True)
class LoadedParams:
    params: Params
    source: dict
    store: str | None = None


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
    return LoadedParams(params, {"path": resolved.uri, **resolved.summary()}, store=resolved.store)


def apply_epsilon(loaded: LoadedParams, epsilon: float | None, override: bool) -> tuple[Params, dict]:
    """The release's epsilon: the parameter file's, unless --epsilon differs and --override-epsilon says so."""
    params = loaded.params
    if epsilon is None:
        return params, {}
    eps = check_epsilon(epsilon, "--epsilon")
    if eps == params.epsilon:
        return params, {}
    if not override:
        raise UserError(f"--epsilon {eps:g} differs from the parameter file's epsilon {params.epsilon:g} "
                        f"({loaded.source.get('path')}); pass --override-epsilon to release at {eps:g} (it is recorded)")
    return params.with_epsilon(eps), {"epsilon_overridden": {"from": params.epsilon, "to": eps}}


def load_domain(path: str, params: Params, inputs: InputFiles) -> KeyDomain:
    """--domain: a key map JSON (with its layout checksum) or a .csv / .json list of slice values."""
    try:
        with FileSystems.open(path) as fh:
            raw = fh.read()
    except Exception as exc:  # noqa: BLE001
        raise UserError(f"cannot read domain file {path}: {exc}") from None
    families = {c: type_family(inputs.schema.field(c).type) for c in params.slice_columns}
    baseline = params.encoding == "baseline"
    if path.endswith(".csv"):
        try:
            rows = pd.read_csv(io.BytesIO(raw), dtype=str, keep_default_na=False, na_values=[""])
        except Exception as exc:  # noqa: BLE001 - a parser error is bad input
            raise UserError(f"domain file {path} is not a readable CSV: {str(exc).splitlines()[0]}") from None
        return domain_from_rows(rows, params.slice_columns, params.query_columns, baseline,
                                params.conversion_slice_columns, families, source=path)
    try:
        data = jsonio.loads(raw, f"domain file {path}")
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if isinstance(data, list):
        return domain_from_rows(pd.DataFrame(data), params.slice_columns, params.query_columns, baseline,
                                params.conversion_slice_columns, families, source=path)
    domain = KeyDomain.from_json(data, source=path)
    params.check_domain(domain, source=f"domain {path}")
    check_domain_families(domain, families, source=path)
    return domain


def resolve_domain(args: argparse.Namespace, params: Params, inputs: InputFiles) -> tuple[KeyDomain | None, str]:
    """(declared domain or None for the simulation-only data-derived one, where it came from)."""
    if args.domain is not None:
        domain, origin = load_domain(args.domain, params, inputs), f"--domain {args.domain}"
    elif params.domain is not None:
        domain, origin = params.domain, "the parameter version"
        check_domain_families(domain, {c: type_family(inputs.schema.field(c).type) for c in params.slice_columns},
                              source="the parameters' domain")
    elif args.simulation_seed is not None:
        print("WARNING: SIMULATION: the key domain is derived from the data being measured (allowed only in "
              "simulation mode; a real release needs --domain)", file=sys.stderr)
        return None, "derived from the data (simulation only)"
    else:
        raise UserError("a release needs a declared key domain: pass --domain (a key map, or a .csv/.json file "
                        "listing slice values), or parameters that carry one (araopt nightly and optimize publish "
                        "the history's domain); deriving it from the data being released is allowed only with "
                        "--simulation-seed")
    if domain.origin == DATA and args.simulation_seed is None:
        raise UserError(f"the domain from {origin} was derived from a conversion log (key map origin 'data', e.g. "
                        f"written by export-ara --conversions): a release over the slices of the data it releases "
                        f"reveals which slices occur; declare the domain (a .csv/.json list of slices, or the "
                        f"parameter version's history domain), or pass --simulation-seed")
    max_slices = args.max_slices
    if domain.num_slices > max_slices:
        raise UserError(f"the domain from {origin} has {domain.num_slices:,} slices, more than --max-slices {max_slices:,}")
    return domain, origin


def build_pipeline(pipeline: beam.Pipeline, inputs: InputFiles, params: Params, folder: RunFolder, params_sha256: str,
                   domain: KeyDomain | None = None, simulation_seed: int | None = None, debug_run: bool = False,
                   num_shards: int = 64, max_rejected_fraction: float = 0.10, shuffle_dir: str | None = None,
                   max_slices: int = DEFAULT_MAX_SLICES):
    """Wire the measurement transforms into ``folder``'s staging location; returns the release PCollection."""
    read = pipeline | "ReadAndValidate" >> ReadAndValidate(
        inputs.paths, params.slice_columns, params.query_columns,
        folder.path(outputs.private_file(outputs.DEAD_LETTER))[:-len(".parquet")], num_shards=num_shards,
        spill_dir=shuffle_dir, impression_slice_columns=params.impression_slice_columns)
    grouped, counts = read["grouped"], read["counts"]
    if domain is not None:
        domain_pc = pipeline | "DeclaredDomain" >> beam.Create([domain])
    else:
        domain_pc = (grouped | "ShardTables" >> beam.Values()
                     | "DomainFromData" >> DomainFromData(params, max_slices))
    merged = grouped | "EncodeBoundAndSum" >> EncodeBoundAndSum(params, domain_pc, simulation_seed)
    release = merged | "NoisyRelease" >> NoisyRelease(params, counts, domain_pc, simulation_seed, max_rejected_fraction)
    release | "WriteRelease" >> WriteRelease(folder.staging, params_sha256, debug_run, simulation_seed is not None)
    return release


def run(argv: Sequence[str] | None = None) -> int:
    return options.run_command("measure", _run, argv)


def _run(args: argparse.Namespace, beam_args: list[str]) -> int:
    started = time.time()
    simulation = args.simulation_seed is not None
    if simulation:
        print(SIMULATION_WARNING, file=sys.stderr)
    loaded = load_params(args.params, args.params_version)
    params, epsilon_note = apply_epsilon(loaded, args.epsilon, args.override_epsilon)
    if not 0.0 <= args.max_rejected_fraction <= 1.0:
        raise UserError(f"--max-rejected-fraction must lie in [0, 1], got {args.max_rejected_fraction}")
    if args.num_shards is not None and args.num_shards < 1:
        raise UserError(f"--num-shards must be >= 1, got {args.num_shards}")
    inputs = check_input(args.input, params.slice_columns, params.query_columns)
    domain, domain_origin = resolve_domain(args, params, inputs)
    ledger = None
    if not simulation:  # simulations are not releases: nothing to protect, nothing recorded
        identity = input_identity(inputs.paths, inputs.first_time, inputs.last_time)
        ledger = Ledger.open(args.ledger or loaded.store or default_ledger_root(), identity, args.allow_rerelease)
    folder = RunFolder.prepare(args.output, args.overwrite)
    opts = pipeline_options(beam_args)
    shuffle_dir = spill_dir(opts, args.shuffle)
    num_shards = args.num_shards or auto_shards(inputs)
    pipeline = beam.Pipeline(runner=make_runner(opts), options=opts)
    build_pipeline(pipeline, inputs, params, folder, params.checksum(), domain, args.simulation_seed, args.debug_run,
                   num_shards, args.max_rejected_fraction, shuffle_dir, args.max_slices)
    Progress("araopt measure", enabled=not args.no_progress)(
        f"the Beam job: validate, group by impression, encode, cap (Alg. 1), sum, noise once per key "
        f"({len(inputs.paths)} file(s), {inputs.rows:,} rows, {num_shards} shards)")
    try:
        try:
            result = pipeline.run()
            result.wait_until_finish()
        finally:
            remove_dir(shuffle_dir)
        summary = run_summary(folder, args, loaded, params, inputs, opts, time.time() - started, simulation)
        summary.update(epsilon_note, domain=domain_origin, num_shards=num_shards,
                       shuffle="files" if shuffle_dir else "memory")
        folder.write(outputs.private_file(outputs.PRIVATE_README), outputs.PRIVATE_README_TEXT.encode())
        release_number = None
        if ledger is not None:
            release_number = ledger.record({"output": folder.target, "params_sha256": params.checksum(),
                                            "epsilon": params.epsilon, **epsilon_note})
            summary["release_number_of_this_input"] = release_number
            summary["ledger"] = ledger.store.uri
        folder.write(outputs.private_file(outputs.RUN_SUMMARY), jsonio.dumps(summary, indent=1).encode())
        extra = {"params_sha256": params.checksum(), "epsilon": params.epsilon, "domain": domain_origin,
                 "input": ledger.identity.to_json() if ledger else {"files": list(inputs.paths)},
                 "release_number_of_this_input": release_number}
        folder.commit(simulation, extra)
    except Exception as exc:
        kept = folder.fail()
        if kept is None:
            raise
        raise UserError(f"{str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__} "
                        f"(nothing was released; the operator-private files of the failed run are in {kept})") from exc
    except BaseException:
        folder.abandon()
        raise
    print_summary(summary, folder.target, simulation)
    return 0


def auto_shards(inputs: InputFiles) -> int:
    from transforms.io import auto_num_shards

    return auto_num_shards(inputs.rows)


def run_summary(folder: RunFolder, args, loaded: LoadedParams, params: Params, inputs: InputFiles, opts, wall: float,
                simulation: bool) -> dict:
    """Operator-private run summary: the pipeline's exact accounting plus what ran and how."""
    accounting = _read_accounting(folder)
    return {
        "OPERATOR_PRIVATE": "exact, un-noised counts: never publish",
        **accounting,
        "epsilon": params.epsilon,
        "encoding": params.encoding,
        "count_limit": params.count_limit,
        "parameters": loaded.source,
        "simulation": simulation,
        "simulation_seed": args.simulation_seed,
        "input_files": len(inputs.paths),
        "runner": runner_name(opts),
        "wall_time_s": round(wall, 3),
    }


ACCOUNTING_FILE = outputs.private_file(outputs.ACCOUNTING)


def _read_accounting(folder: RunFolder) -> dict:
    with FileSystems.open(folder.path(ACCOUNTING_FILE)) as fh:
        accounting = json.loads(fh.read().decode())
    FileSystems.delete([folder.path(ACCOUNTING_FILE)])
    if not accounting.get("accounting_closes"):
        raise RuntimeError(f"row accounting does not close: {accounting}")
    return accounting




def print_summary(summary: dict, output: str, simulation: bool) -> None:
    rel = outputs.release_dir(simulation)
    mark = "SIMULATION (not private) " if simulation else ""
    print(f"araopt measure: {mark}release of {summary['keys']:,} keys at epsilon={summary['epsilon']:g} "
          f"written to {output}/{rel}/ in {summary['wall_time_s']:.1f} s (domain: {summary['domain']})")
    by_reason = ", ".join(f"{k} {v:,}" for k, v in summary["rows_rejected_by_reason"].items()) or "none"
    print(f"  operator-private (exact, never publish): {summary['rows_read']:,} rows read = "
          f"{summary['conversions_kept']:,} kept + {summary['conversions_dropped_by_cap']:,} dropped by the cap + "
          f"{summary['conversions_kept_outside_domain']:,} outside the domain + {summary['rows_rejected']:,} rejected "
          f"({by_reason}); details in {output}/{outputs.PRIVATE_DIR}/")
    calibration = summary.get("calibration")
    if not calibration:
        print("  estimates are of the capped-and-clipped sums (Alg. 4): the parameters carry no calibration, so "
              "bias_corrected is false (araopt optimize / nightly fit one on the history)")
    else:
        point = "capped / retention ratio" if calibration["correction"] == "ratio" else "the capped sum"
        unseen = calibration["fallback_slices"]
        print(f"  estimates are of the TRUE totals (point estimate: {point}; intervals include the calibration's "
              f"uncertainty for a period of {calibration['period_blocks']} history block(s))"
              + (f"; {unseen:,} slice(s) absent from the history use the pooled ratio (wider intervals)" if unseen else ""))


if __name__ == "__main__":
    raise SystemExit(run())
