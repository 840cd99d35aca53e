"""`araopt measure`: a conversion log -> the summary report ARA would produce under a parameter file,
and estimates with error bars (ContributionCapping, Alg. 1; SummaryReport, Alg. 2;
HistogramContribution, Alg. 3 / Alg. 6; ReconstructValues, Alg. 4), on Apache Beam.

    araopt measure --input 'logs/*.parquet' --params STORE_OR_FILE --output out/ \\
        [--domain key_map.json|slices.csv] [--debug-run] [--overwrite] [Beam options]

A release needs a declared key domain (--domain, or the one the parameter version carries); only
simulation mode (--simulation-seed: seeded noise, NOT private) may derive it from the data.
Outputs (``araopt.io.outputs``): out/release/ is publishable; out/private/ holds exact counts, the dead
letter and the debug report and must never be published; out/release/MANIFEST.json is written last.

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
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import pandas as pd
import pyarrow as pa
from apache_beam.io.filesystems import FileSystems

from araopt.constants import MAX_SLICES
from araopt.errors import PrivacyRefusal, check_epsilon
from araopt.io import jsonio, outputs
from araopt.io.conversions import type_family
from araopt.io.progress import Progress
from araopt.io.rowset import RowSet, RowSetPart
from araopt.mechanism.keys import DATA, KeyDomain, check_domain_families, domain_from_rows
from araopt.mechanism.params import Params
from araopt.publication import Publication, publish
from araopt.version import ParameterVersion
from transforms.aggregate import DomainFromData, EncodeBoundAndSum, NoisyRelease
from transforms.io import InputFiles, check_input
from transforms.release import WriteRelease
from transforms.rowset import WriteRowIds
from transforms.validate import LOOKBACK_COUNTS, ReadAndValidate, period_rows

from . import options
from .ledger import Ledger, ledger_root
from .options import UserError
from .run_folder import ROW_IDS, RunFolder
from .runner import (
    check_workers_can_write,
    dry_run_sentence,
    is_local_runner,
    make_runner,
    pipeline_options,
    run_pipeline,
    runner_name,
    spill_folder,
)

SIMULATION_WARNING = ("WARNING: SIMULATION MODE (--simulation-seed): rounding and noise are seeded and reproducible; "
                      "the output is NOT differentially private and must never be published")


def build_parser() -> argparse.ArgumentParser:
    return options.build_parser("measure")


@dataclass(frozen=True)
class LoadedParams:
    version: ParameterVersion
    source: dict
    store: str | None = None


def load_params(ref: str, version: str = "latest") -> LoadedParams:
    """A parameter file (.json, local or gs://), or a store URI (``STORE`` -> latest, or
    ``STORE/versions/<v>`` or ``STORE/versions/<v>/params.json``) resolved to a checksum-verified
    version (a store's parameters are always read as the store's: its ledger records the release)."""
    from araopt.io.store import LATEST, StoreError
    from araopt.io.stores import open_store, parse_params_ref, resolve_params_ref

    if ref.endswith(".json") and parse_params_ref(ref)[1] == LATEST:
        try:
            with FileSystems.open(ref) as fh:
                raw = fh.read()
        except Exception as exc:  # noqa: BLE001 - any IO failure is a user-facing error here
            raise UserError(f"cannot read parameter file {ref}: {exc}") from None
        return LoadedParams(ParameterVersion.from_bytes(raw, source=ref),
                            {"path": ref, "sha256": hashlib.sha256(raw).hexdigest()})
    try:
        resolved = open_store(ref).resolve(version) if version != "latest" else resolve_params_ref(ref)
    except StoreError as exc:
        raise UserError(str(exc)) from None
    loaded = ParameterVersion.from_bytes(resolved.payload, source=resolved.uri)
    return LoadedParams(loaded, {"path": resolved.uri, **resolved.summary()}, store=resolved.store)


def apply_epsilon(loaded: LoadedParams, epsilon: float | None, override: bool) -> tuple[ParameterVersion, dict]:
    """The release's epsilon: the parameter file's, unless --epsilon differs and --override-epsilon says so."""
    version = loaded.version
    params = version.params
    if epsilon is None:
        return version, {}
    eps = check_epsilon(epsilon, "--epsilon")
    if eps == params.epsilon:
        return version, {}
    if not override:
        raise UserError(f"--epsilon {eps:g} differs from the parameter file's epsilon {params.epsilon:g} "
                        f"({loaded.source.get('path')}); pass --override-epsilon to release at {eps:g} (it is recorded)")
    return version.with_epsilon(eps), {"epsilon_overridden": {"from": params.epsilon, "to": eps}}


def load_domain(path: str, params: Params, inputs: InputFiles) -> KeyDomain:
    """--domain: a key map JSON (with its layout checksum) or a .csv / .json list of slice values."""
    domain = read_domain(path, params.slice_columns, params.query_columns, inputs, params.encoding == "baseline",
                         params.conversion_slice_columns)
    params.check_domain(domain, source=f"domain {path}")
    return domain


def read_domain(path: str, slice_columns: Sequence[str], query_columns: Sequence[str], inputs: InputFiles | None,
                baseline: bool = False, conversion_slice_columns: Sequence[str] = ()) -> KeyDomain:
    """A declared domain file: a key map JSON or a .csv / .json list of slice values, whose slice values
    have the types of the input's columns (without ``inputs``: a list's values are strings)."""
    try:
        with FileSystems.open(path) as fh:
            raw = fh.read()
    except Exception as exc:  # noqa: BLE001
        raise UserError(f"cannot read domain file {path}: {exc}") from None
    families = {} if inputs is None else {c: type_family(inputs.schema.field(c).type) for c in slice_columns}
    if path.endswith(".csv"):
        try:
            rows = pd.read_csv(io.BytesIO(raw), dtype=str, keep_default_na=False, na_values=[""])
        except Exception as exc:  # noqa: BLE001 - a parser error is bad input
            raise UserError(f"domain file {path} is not a readable CSV: {str(exc).splitlines()[0]}") from None
        return domain_from_rows(rows, slice_columns, query_columns, baseline, conversion_slice_columns, families,
                                source=path)
    try:
        data = jsonio.loads(raw, f"domain file {path}")
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if isinstance(data, list):
        rows = pd.DataFrame(data)
        if inputs is None:  # no input to type the values by: a JSON list types them itself
            families = {c: _json_family(rows[c].tolist()) for c in slice_columns if c in rows.columns}
        return domain_from_rows(rows, slice_columns, query_columns, baseline, conversion_slice_columns, families,
                                source=path)
    domain = KeyDomain.from_json(data, source=path)
    check_domain_families(domain, families, source=path)
    return domain


def _json_family(values: list[Any]) -> str:
    if values and all(isinstance(v, bool) for v in values):
        return "boolean"
    if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return "integer"
    return "string"


def resolve_domain(args: argparse.Namespace, version: ParameterVersion, inputs: InputFiles
                   ) -> tuple[KeyDomain | None, str]:
    """(declared domain or None for the simulation-only data-derived one, where it came from)."""
    params = version.params
    if args.domain is not None:
        domain, origin = load_domain(args.domain, params, inputs), f"--domain {args.domain}"
    elif version.domain is not None:
        domain, origin = version.domain, "the parameter version"
        check_domain_families(domain, {c: type_family(inputs.schema.field(c).type) for c in params.slice_columns},
                              source="the parameters' domain")
    elif args.simulation_seed is not None:
        print("WARNING: SIMULATION: the key domain is derived from the data being measured (allowed only in "
              "simulation mode; a real release needs --domain)", file=sys.stderr)
        return None, "derived from the data (simulation only)"
    else:
        raise PrivacyRefusal("a release needs a declared key domain: pass --domain (a key map, or a .csv/.json file "
                             "listing slice values), or parameters that carry one (araopt nightly and optimize publish "
                             "the history's domain); deriving it from the data being released is allowed only with "
                             "--simulation-seed")
    if domain.origin == DATA and args.simulation_seed is None:
        raise PrivacyRefusal(f"the domain from {origin} was derived from a conversion log (key map origin 'data', e.g. "
                             f"written by export-ara --conversions): a release over the slices of the data it releases "
                             f"reveals which slices occur; declare the domain (a .csv/.json list of slices, or the "
                             f"parameter version's history domain), or pass --simulation-seed")
    max_slices = args.max_slices
    if domain.num_slices > max_slices:
        raise UserError(f"the domain from {origin} has {domain.num_slices:,} slices, more than --max-slices {max_slices:,}")
    return domain, origin


def build_pipeline(pipeline: beam.Pipeline, inputs: InputFiles, version: ParameterVersion, folder: RunFolder,
                   domain: KeyDomain | None = None, simulation_seed: int | None = None, debug_run: bool = False,
                   num_shards: int = 64, max_rejected_fraction: float = 0.10, shuffle_dir: str | None = None,
                   max_slices: int = MAX_SLICES, row_ids: str | None = None, lookback: InputFiles | None = None,
                   one_dead_letter_file: bool = True):
    """Wire the measurement transforms into ``folder``'s staging location; returns the release PCollection.
    ``row_ids``: the folder where the released rows' ids go (``transforms.rowset``), for the ledger;
    ``lookback``: earlier conversions that consume each impression's budget (Alg. 1) but are not released
    (nor recorded in the ledger); ``one_dead_letter_file``: False on remote workers (a sharded dead letter)."""
    params = version.params
    passthrough = tuple(c for c in inputs.optional_columns if lookback is None or c in lookback.optional_columns)
    read = pipeline | "ReadAndValidate" >> ReadAndValidate(
        inputs.paths, params.slice_columns, params.query_columns,
        folder.path(outputs.private_file(outputs.DEAD_LETTER))[:-len(".parquet")], passthrough=passthrough,
        num_shards=num_shards, spill_dir=shuffle_dir, impression_slice_columns=params.impression_slice_columns,
        lookback_paths=lookback.paths if lookback is not None else (), one_dead_letter_file=one_dead_letter_file)
    grouped, counts = read["grouped"], read["counts"]
    # conversions are exported by day: the earliest file read covers its whole UTC day
    first = _micros((lookback or inputs).first_time)
    coverage_start = None if first is None else first - first % 86_400_000_000
    released = grouped | "ShardTables" >> beam.Values()
    if lookback is not None:
        released = released | "PeriodRows" >> beam.Map(period_rows).with_output_types(pa.Table)
    if row_ids is not None:
        _ = released | "ReleasedRowIds" >> WriteRowIds(row_ids)
    if domain is not None:
        domain_pc = pipeline | "DeclaredDomain" >> beam.Create([domain])
    else:
        domain_pc = released | "DomainFromData" >> DomainFromData(params, max_slices)
    merged = grouped | "EncodeBoundAndSum" >> EncodeBoundAndSum(params, domain_pc, simulation_seed, coverage_start)
    release = merged | "NoisyRelease" >> NoisyRelease(params, counts, domain_pc, simulation_seed, max_rejected_fraction,
                                                      read.get(LOOKBACK_COUNTS))
    published = release | "Publish" >> beam.Map(publish, version, partition_days(inputs.paths)).with_output_types(
        Publication)
    published | "WriteRelease" >> WriteRelease(folder.staging, version.checksum(), debug_run, simulation_seed is not None)
    return release


_PARTITION_DAY = re.compile(r"(?:^|/)date=(\d{4}-\d{2}-\d{2})(?:/|$)")


def partition_days(paths: Sequence[str]) -> tuple[str, ...] | None:
    """The days a release covers, from its input's ``date=YYYY-MM-DD/`` partition folders: how the
    operator cut the input, not what the rows say (the calibration's day-of-week effects then apply).
    None unless every input file lies in such a partition."""
    days = [_PARTITION_DAY.search(p.replace("\\", "/")) for p in paths]
    if not days or any(d is None for d in days):
        return None
    return tuple(sorted({d.group(1) for d in days if d is not None}))


def _micros(iso: str | None) -> int | None:
    """An ISO-8601 time (naive = UTC) as int64 microseconds since the epoch; None stays None."""
    if iso is None:
        return None
    stamp = pd.Timestamp(iso)
    stamp = stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")
    return int(stamp.value // 1000)


def load_lookback(pattern: str | None, params: Params, inputs: InputFiles) -> InputFiles | None:
    """--lookback: checked like the input (same columns and id / slice types), and disjoint from it
    (a file in both would consume budget twice)."""
    if pattern is None:
        return None
    lookback = check_input(pattern, params.slice_columns, params.query_columns)
    shared = sorted(set(lookback.paths) & set(inputs.paths))
    if shared:
        raise UserError(f"--lookback and --input share {len(shared)} file(s) (e.g. {shared[0]}): the lookback holds "
                        f"earlier conversions only")
    families = {c: type_family(inputs.schema.field(c).type) for c in ("impression_id", *params.slice_columns)}
    other = {c: type_family(lookback.schema.field(c).type) for c in families}
    differ = [c for c in families if families[c] != other[c]]
    if differ:
        raise UserError(f"--lookback types differ from --input for {differ} ({[other[c] for c in differ]} vs "
                        f"{[families[c] for c in differ]}): ids would not match")
    return lookback


def run(argv: Sequence[str] | None = None) -> int:
    return options.run_command("measure", _run, argv)


def _run(args: argparse.Namespace, beam_args: list[str]) -> int:
    started = time.time()
    simulation = args.simulation_seed is not None
    if simulation:
        print(SIMULATION_WARNING, file=sys.stderr)
    loaded = load_params(args.params, args.params_version)
    version, epsilon_note = apply_epsilon(loaded, args.epsilon, args.override_epsilon)
    params = version.params
    if not 0.0 <= args.max_rejected_fraction <= 1.0:
        raise UserError(f"--max-rejected-fraction must lie in [0, 1], got {args.max_rejected_fraction}")
    if args.num_shards is not None and args.num_shards < 1:
        raise UserError(f"--num-shards must be >= 1, got {args.num_shards}")
    opts = pipeline_options(beam_args)
    check_workers_can_write(opts, args.output, "--output")
    pipeline = beam.Pipeline(runner=make_runner(opts), options=opts)  # Beam checks its options here: before any work
    inputs = check_input(args.input, params.slice_columns, params.query_columns)
    lookback = load_lookback(args.lookback, params, inputs)
    domain, domain_origin = resolve_domain(args, version, inputs)
    folder = RunFolder.prepare(args.output, args.overwrite)  # the output first, locked for the whole run
    try:  # from here on every failure removes the staging folder (RunFolder.fail / abandon)
        summary = _measure(args, opts, pipeline, loaded, version, epsilon_note, inputs, domain, domain_origin, folder,
                           started, simulation, lookback)
    except UserError:  # a refusal (ledger, output): nothing to debug, nothing kept
        folder.abandon()
        raise
    except Exception as exc:
        kept = folder.fail()
        if kept is None:
            raise
        raise UserError(f"{options.one_line(exc)} (nothing was released; the operator-private files of the failed "
                        f"run are in {kept})") from exc
    except BaseException:
        folder.abandon()
        raise
    if summary is not None:
        print_summary(summary, folder.target, simulation)
    return 0


def _measure(args: argparse.Namespace, opts: Any, pipeline: beam.Pipeline, loaded: LoadedParams,
             version: ParameterVersion,
             epsilon_note: dict, inputs: InputFiles, domain: KeyDomain | None, domain_origin: str, folder: RunFolder,
             started: float, simulation: bool, lookback: InputFiles | None = None) -> dict | None:
    """Run the job into ``folder``'s staging folder and commit it (recording the release in the ledger);
    None after a dry run (translated, nothing else done)."""
    params = version.params
    ledger = None
    if not simulation:  # simulations are not releases: nothing to protect, nothing recorded
        ledger = Ledger.open(ledger_root(loaded.store, args.ledger), args.allow_rerelease)
    num_shards = args.num_shards or auto_shards(inputs)
    with spill_folder(opts, args.shuffle) as shuffle_dir:
        build_pipeline(pipeline, inputs, version, folder, domain, args.simulation_seed,
                       args.debug_run, num_shards, args.max_rejected_fraction, shuffle_dir, args.max_slices,
                       row_ids=None if ledger is None else folder.path(ROW_IDS), lookback=lookback,
                       one_dead_letter_file=is_local_runner(opts))
        Progress("araopt measure", enabled=not args.no_progress)(
            f"the Beam job: validate, group by impression, encode, cap (Alg. 1), sum, noise once per key "
            f"({len(inputs.paths)} file(s), {inputs.rows:,} rows"
            + (f", {len(lookback.paths)} lookback file(s)" if lookback else "") + f", {num_shards} shards)")
        translated = run_pipeline(pipeline, opts)
    if translated is not None:  # a dry run: no accounting, no release, nothing recorded in the ledger
        folder.abandon()
        print(dry_run_sentence("araopt measure", [translated]))
        return None
    summary = run_summary(folder, args, loaded, params, inputs, opts, time.time() - started, simulation)
    summary.update(epsilon_note, domain=domain_origin, num_shards=num_shards,
                   shuffle="files" if shuffle_dir else "memory", lookback_files=len(lookback.paths) if lookback else 0,
                   impression_times_known=bool(set(inputs.optional_columns) & {"impression_time"}))
    folder.write(outputs.private_file(outputs.PRIVATE_README), outputs.PRIVATE_README_TEXT.encode())
    private = {"params_sha256": version.checksum(), "epsilon": params.epsilon, "domain": domain_origin,
               "input": input_facts(inputs)}

    rows = None if ledger is None else RowSet.merge(RowSetPart.from_arrow_bytes(b) for b in folder.read_all(ROW_IDS))

    def record_release():
        """At commit (exclusive): check the released rows against the ledger and record them."""
        undo = None
        if ledger is not None and rows is not None:
            entry = {"output": folder.target, "params_sha256": version.checksum(), "epsilon": params.epsilon,
                     **epsilon_note}
            recorded = ledger.check_and_record(rows, rows.to_parquet_bytes(), entry)
            summary.update(release_number_of_this_input=recorded.release_number,
                           conversions_released_before=recorded.rows_released_before,
                           ledger=ledger.store.uri, ledger_entry=recorded.entry["id"])
            private["ledger"] = {"uri": ledger.store.uri, "entry": recorded.entry}

            def undo():
                ledger.rollback(recorded)
        folder.write(outputs.private_file(outputs.RUN_SUMMARY), jsonio.dumps(summary, indent=1).encode())
        return undo

    folder.commit(simulation, {"params_sha256": version.checksum(), "epsilon": params.epsilon}, private,
                  before_move=record_release)
    return summary


def input_facts(inputs: InputFiles) -> dict:
    """Operator-private: the input's files with their sizes, and its time window from the footers."""
    sizes = {m.path: m.size_in_bytes for result in FileSystems.match(list(inputs.paths)) for m in result.metadata_list}
    return {"files": [{"path": p, "bytes": sizes.get(p)} for p in inputs.paths],
            "window": {"first_conversion_time": inputs.first_time, "last_conversion_time": inputs.last_time}}


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
    print_lookback_note(summary)
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
        if calibration.get("calendar_note"):
            print(f"  NOTE: {calibration['calendar_note']}")


def print_lookback_note(summary: dict) -> None:
    """Once per run: whether Alg. 1 saw each impression's earlier conversions (the browser's cap is per
    source lifetime), and how many of the measured conversions may be over-counted."""
    before = summary.get("conversions_of_impressions_older_than_the_lookback", 0)
    if summary.get("lookback_files"):
        tail = (f"; {before:,} measured conversion(s) belong to impressions shown before the lookback's first day and "
                f"may be over-counted (lengthen --lookback)" if before else "")
        print(f"  lifetime cap: {summary['lookback_rows_used']:,} earlier conversion(s) from --lookback consumed "
              f"budget (not released){tail}")
    elif summary.get("impression_times_known"):
        if before:
            print(f"  WARNING: no --lookback: {before:,} measured conversion(s) belong to impressions shown before the "
                  f"input's first day; their earlier conversions did not consume budget, so the release may "
                  f"keep more of them than the browser does (pass the days before as --lookback)")
    else:
        print("  WARNING: no --lookback and no impression_time: conversions of impressions that converted before "
              "this input are capped as if these were their first, so the release may keep more than the browser "
              "does (pass the days before as --lookback)")


if __name__ == "__main__":
    raise SystemExit(run())
