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
import datetime as dt
import io
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from types import EllipsisType
from typing import Any

import apache_beam as beam
import pandas as pd
import pyarrow as pa
from apache_beam.io.filesystems import FileSystems

from araopt.constants import MAX_SLICES
from araopt.errors import InvalidInput, InvalidParameters
from araopt.io import jsonio, outputs
from araopt.io.conversions import type_family
from araopt.io.progress import Progress
from araopt.io.rowset import COARSE_MARGIN_US, RowSet, RowSetPart, SpilledRowSet
from araopt.io.run_folder import ROW_IDS, RunFolder, failures_settled
from araopt.io.store import StoreError
from araopt.mechanism.keys import KeyDomain
from araopt.mechanism.lifetime import ReleaseHistory
from araopt.mechanism.params import Encoding, Params
from araopt.publication import Publication
from araopt.release_summary import summary_lines
from araopt.release_workflow import ReleaseSpec, publish_release, release_epsilon, resolve_release_domain
from araopt.version import Api, ParameterVersion
from transforms.aggregate import DomainFromData, EncodeBoundAndSum, NoisyRelease
from transforms.io import InputFiles, check_input, footer_summary, match_files
from transforms.release import WriteRelease
from transforms.rowset import WriteRowIds
from transforms.validate import LOOKBACK_COUNTS, ReadAndValidate, lookback_rows, period_rows

from . import options
from .inputs import LoadedParams, load_params, read_domain
from .ledger import RELEASE_FILES, Ledger, LedgerRefusal, check_lookback, ledger_root, other_ledgers
from .partitions import files_in_days, partition_day, partition_days, partition_root, rows_outside_days
from .runner import (
    dry_run_sentence,
    is_local_runner,
    is_remote,
    measure_job,
    run_pipeline,
    runner_name,
    spill_folder,
)

SIMULATION_WARNING = ("WARNING: SIMULATION MODE (--simulation-seed): rounding and noise are seeded and reproducible; "
                      "the output is NOT differentially private and must never be published")


def build_parser() -> argparse.ArgumentParser:
    return options.build_parser("measure")


def load_domain(path: str, params: Params, inputs: InputFiles) -> KeyDomain:
    """--domain: a key map JSON (with its layout checksum) or a .csv / .json list of slice values."""
    return read_domain(path, params.slice_columns, params.query_columns, inputs, params.encoding == Encoding.BASELINE,
                       params.conversion_slice_columns)


def resolve_domain(args: argparse.Namespace, version: ParameterVersion, inputs: InputFiles
                   ) -> tuple[KeyDomain | None, str]:
    """(declared domain or None for the simulation-only data-derived one, where it came from): the
    release workflow's ``resolve_release_domain`` over --domain and the parameter version's domain."""
    params = version.params
    given = None if args.domain is None else load_domain(args.domain, params, inputs)
    families = {c: type_family(inputs.schema.field(c).type) for c in params.slice_columns}
    domain, origin = resolve_release_domain(given, f"--domain {args.domain}", version, families, args.simulation_seed,
                                            args.max_slices, "--max-slices", f"domain {args.domain}")
    if domain is None:
        print("WARNING: SIMULATION: the key domain is derived from the data being measured (allowed only in "
              "simulation mode; a real release needs --domain)", file=sys.stderr)
    return domain, origin


def build_pipeline(pipeline: beam.Pipeline, inputs: InputFiles, version: ParameterVersion, folder: RunFolder,
                   domain: KeyDomain | None = None, simulation_seed: int | None = None, debug_run: bool = False,
                   num_shards: int = 64, max_rejected_fraction: float = 0.10, shuffle_dir: str | None = None,
                   max_slices: int = MAX_SLICES, row_ids: str | None = None, lookback: InputFiles | None = None,
                   one_dead_letter_file: bool = True, history: ReleaseHistory | None = None,
                   days: tuple[str, ...] | None | EllipsisType = ...):
    """Wire the measurement transforms into ``folder``'s staging location; returns the release PCollection.
    ``row_ids``: the folder where the released rows' ids go (``transforms.rowset``), for the ledger (and
    the lookback's, in ``row_ids + LOOKBACK_SUFFIX``, to refuse a lookback holding the period's own rows);
    ``lookback``: earlier conversions that consume each impression's budget (Alg. 1) but are not released
    (nor recorded in the ledger), each costed with the configuration of the release that used it
    (``history``, from the ledger; None: today's); ``one_dead_letter_file``: False on remote workers
    (a sharded dead letter); ``days``: the days the release covers (the calendar's), by default
    ``release_days(inputs)``."""
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
        tables = released
        released = tables | "PeriodRows" >> beam.Map(period_rows).with_output_types(pa.Table)
        if row_ids is not None:  # to check that the lookback does not hold the period's own conversions
            # the period's own conversions re-exported lie within 26 hours of it (time zones); earlier
            # lookback rows only add chance coarse matches (different conversions of the same impressions)
            since = _micros(inputs.first_time)
            since = None if since is None else since - COARSE_MARGIN_US
            earlier = tables | "LookbackRows" >> beam.Map(lookback_rows, since).with_output_types(pa.Table)
            _ = earlier | "LookbackRowIds" >> WriteRowIds(row_ids.rstrip("/") + LOOKBACK_SUFFIX)
    if row_ids is not None:
        _ = released | "ReleasedRowIds" >> WriteRowIds(row_ids)
    if domain is not None:
        domain_pc = pipeline | "DeclaredDomain" >> beam.Create([domain])
    else:
        domain_pc = released | "DomainFromData" >> DomainFromData(params, max_slices)
    merged = grouped | "EncodeBoundAndSum" >> EncodeBoundAndSum(params, domain_pc, simulation_seed, coverage_start,
                                                                history)
    release = merged | "NoisyRelease" >> NoisyRelease(params, counts, domain_pc, simulation_seed, max_rejected_fraction,
                                                      read.get(LOOKBACK_COUNTS))
    if days is ...:
        days = release_days(inputs)[0]
    spec = ReleaseSpec(version, simulation_seed, max_rejected_fraction, history, coverage_start, days)
    published = release | "Publish" >> beam.Map(publish_release, spec).with_output_types(Publication)
    published | "WriteRelease" >> WriteRelease(folder.staging, version.checksum(), debug_run, simulation_seed is not None)
    return release


LOOKBACK_SUFFIX = "_lookback"
"""The lookback rows' ids go beside the released rows' (``ROW_IDS + LOOKBACK_SUFFIX``)."""


def release_days(inputs: InputFiles) -> tuple[tuple[str, ...] | None, str | None]:
    """The days a release covers, from its input's ``date=YYYY-MM-DD/`` partition folders (how the
    operator cut the input, not what the rows say: the calibration's day-of-week effects then apply),
    and why they are not used (None: used, or there are none): a folder whose rows' conversion times
    (the Parquet footers) fall on other UTC days names the wrong days (e.g. impression-date partitions).
    A malformed partition date is refused (one line)."""
    days = partition_days(inputs.paths)
    if days is None:
        return None, None
    by_day: dict[str, list[str]] = {}
    for path in inputs.paths:
        by_day.setdefault(str(partition_day(path)), []).append(path)
    for day, paths in sorted(by_day.items()):
        _, first, last = footer_summary(paths)
        why = rows_outside_days(_micros(first), _micros(last), [day])
        if why is not None:
            return None, f"the partition folder date={day} does not hold that day's conversions: {why}"
    return days, None


def _micros(iso: str | None) -> int | None:
    """An ISO-8601 time (naive = UTC) as int64 microseconds since the epoch; None stays None."""
    if iso is None:
        return None
    stamp = pd.Timestamp(iso)
    stamp = stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")
    return int(stamp.value // 1000)


def lookback_partitions(inputs: InputFiles, days: int) -> tuple[list[str], str]:
    """--lookback-days N: the files of the N ``date=`` partitions before the input's first day, found
    beside the input's own partitions (the folder holding them: ``logs`` for ``--input
    logs/date=2026-11-25/``), as ``nightly --lookback-days`` selects its lookback; with a sentence
    saying what was looked for."""
    if days < 0:
        raise InvalidParameters(f"--lookback-days must be >= 0, got {days}")
    dates = [partition_day(p) for p in inputs.paths]
    roots = {partition_root(p) for p in inputs.paths}
    if any(d is None for d in dates) or len(roots) != 1:
        raise InvalidInput("--lookback-days needs an input in date=YYYY-MM-DD/ partition folders under one folder "
                           f"(e.g. --input logs/date=2026-11-25/); got {inputs.paths[0]!r}"
                        + (f" and {len(roots)} partition folders' parents" if len(roots) > 1 else "")
                        + "; name the earlier files with --lookback instead")
    first = dt.date.fromisoformat(min(d for d in dates if d is not None))
    start, end = first - dt.timedelta(days=days), first - dt.timedelta(days=1)
    (root,) = roots
    assert root is not None
    files = files_in_days(match_files(root), start, end) if days else []
    return files, f"--lookback-days {days}: {start}..{end} under {root}"


def load_lookback(pattern: str | None, params: Params, inputs: InputFiles, days: int | None = None
                  ) -> InputFiles | None:
    """--lookback (a path or glob) or --lookback-days (the partitions before the input's days): checked
    like the input (same columns and id / slice types), and disjoint from it (a file in both would
    consume budget twice). None without either, or when the days hold no partition (said on stderr)."""
    if pattern is not None and days is not None:
        raise InvalidParameters("pass --lookback or --lookback-days, not both")
    if days is not None:
        paths, what = lookback_partitions(inputs, days)
        if not paths:
            print(f"araopt measure: {what}: no partitions found, so no lookback", file=sys.stderr)
            return None
        lookback = check_input(paths, params.slice_columns, params.query_columns)
    elif pattern is None:
        return None
    else:
        lookback = check_input(pattern, params.slice_columns, params.query_columns)
    shared = sorted(set(lookback.paths) & set(inputs.paths))
    if shared:
        raise InvalidInput(f"--lookback and --input share {len(shared)} file(s) (e.g. {shared[0]}): the lookback holds "
                           f"earlier conversions only")
    families = {c: type_family(inputs.schema.field(c).type) for c in ("impression_id", *params.slice_columns)}
    other = {c: type_family(lookback.schema.field(c).type) for c in families}
    differ = [c for c in families if families[c] != other[c]]
    if differ:
        raise InvalidInput(f"--lookback types differ from --input for {differ} ({[other[c] for c in differ]} vs "
                           f"{[families[c] for c in differ]}): ids would not match")
    return lookback


def lookback_history(args: argparse.Namespace, loaded: LoadedParams, version: ParameterVersion,
                     lookback: InputFiles | None) -> ReleaseHistory | None:
    """The earlier releases recorded in the ledger (each with its mechanism) that cost the lookback's
    conversions; None without a lookback or in simulation (nothing recorded: today's parameters)."""
    if lookback is None or args.simulation_seed is not None:
        return None
    ledger = Ledger.open(ledger_root(loaded.store, args.ledger), args.allow_rerelease)
    return ledger.release_history(_micros(lookback.first_time), _micros(lookback.last_time), version)


def run(argv: Sequence[str] | None = None) -> int:
    return options.run_command("measure", _run, argv)


def _run(args: argparse.Namespace, beam_args: list[str]) -> int:
    started = time.time()
    simulation = args.simulation_seed is not None
    if simulation:
        print(SIMULATION_WARNING, file=sys.stderr)
    loaded = load_params(args.params, args.params_version)
    if args.api is not None:
        loaded.version.require_api(Api(args.api), f"measure --api {args.api}")
    if loaded.version.api == Api.ATTRIBUTION:  # W3C Attribution Level 1: its own job, grouped by browser
        from .measure_attribution import run_attribution

        return run_attribution(args, beam_args, loaded, started)
    version, epsilon_note = release_epsilon(loaded.version, args.epsilon, args.override_epsilon,
                                            str(loaded.source.get("path")))
    params = version.params
    opts, pipeline = measure_job(args, beam_args)  # Beam checks its options here: before any work
    inputs = check_input(args.input, params.slice_columns, params.query_columns)
    lookback = load_lookback(args.lookback, params, inputs, args.lookback_days)
    days, days_note = release_days(inputs)  # a malformed partition date is refused here, before any work
    if lookback is not None:
        partition_days(lookback.paths)
    if days_note is not None:
        print(f"araopt measure: {days_note}: the release's days are not used (no day-of-week calendar)",
              file=sys.stderr)
    domain, domain_origin = resolve_domain(args, version, inputs)
    history = lookback_history(args, loaded, version, lookback)
    folder = RunFolder.prepare(args.output, args.overwrite)  # the output first, locked for the whole run
    with failures_settled(folder, (StoreError, LedgerRefusal)):  # a ledger refusal: nothing to debug, nothing kept
        summary = _measure(args, opts, pipeline, loaded, version, epsilon_note, inputs, domain, domain_origin, folder,
                           started, simulation, lookback, history, days, days_note)
    if summary is not None:
        print_summary(summary, folder.target, simulation)
        if summary.get("report_page", True):
            print(f"  report (operator-private): {folder.target}/{outputs.private_file(outputs.REPORT_HTML)}")
    return 0


def _measure(args: argparse.Namespace, opts: Any, pipeline: beam.Pipeline, loaded: LoadedParams,
             version: ParameterVersion,
             epsilon_note: dict, inputs: InputFiles, domain: KeyDomain | None, domain_origin: str, folder: RunFolder,
             started: float, simulation: bool, lookback: InputFiles | None = None,
             history: ReleaseHistory | None = None, days: tuple[str, ...] | None = None,
             days_note: str | None = None) -> dict | None:
    """Run the job into ``folder``'s staging folder and commit it (recording the release in the ledger);
    None after a dry run (translated, nothing else done)."""
    params = version.params
    ledger = None
    others: list[Ledger] = []
    if not simulation:  # simulations are not releases: nothing to protect, nothing recorded
        ledger = Ledger.open(ledger_root(loaded.store, args.ledger), args.allow_rerelease)
        others = other_ledgers(getattr(args, "check_ledgers", None), ledger.store.uri)
    num_shards = args.num_shards or auto_shards(inputs, lookback)
    with spill_folder(opts, args.shuffle) as shuffle_dir:
        build_pipeline(pipeline, inputs, version, folder, domain, args.simulation_seed,
                       args.debug_run, num_shards, args.max_rejected_fraction, shuffle_dir, args.max_slices,
                       row_ids=None if ledger is None and lookback is None else folder.path(ROW_IDS),
                       lookback=lookback, one_dead_letter_file=is_local_runner(opts), history=history, days=days)
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
                   lookback_costed_with=None if history is None else history.summary(),
                   impression_times_known=bool(set(inputs.optional_columns) & {"impression_time"}),
                   partition_days=None if days is None else list(days), partition_days_not_used=days_note)
    folder.write(outputs.private_file(outputs.PRIVATE_README), outputs.PRIVATE_README_TEXT.encode())
    private = {"params_sha256": version.checksum(), "epsilon": params.epsilon, "domain": domain_origin,
               "input": input_facts(inputs)}

    # the released rows' identities: the workers' sorted runs merged on local disk, range by range
    # (``SpilledRowSet``): the driver holds one run or one id range at a time, whatever the release's size
    with tempfile.TemporaryDirectory(prefix="araopt-row-ids-") as id_dir:
        return _check_and_commit(args, folder, loaded, version, epsilon_note, inputs, simulation, lookback, ledger,
                                 others, summary, private, id_dir)


def _check_and_commit(args: argparse.Namespace, folder: RunFolder, loaded: LoadedParams, version: ParameterVersion,
                      epsilon_note: dict, inputs: InputFiles, simulation: bool, lookback: InputFiles | None,
                      ledger: Ledger | None, others: list[Ledger], summary: dict, private: dict, id_dir: str) -> dict:
    """The ledger step and the commit: a lookback holding the period's own conversions refused, the
    released rows checked against the ledger (and ``--check-ledgers``) and recorded at commit."""
    params = version.params
    period = None
    if ledger is not None or lookback is not None:
        period = SpilledRowSet.merge_runs(map(RowSetPart.from_arrow_bytes, folder.iter_all(ROW_IDS)),
                                          os.path.join(id_dir, "period"))
    if lookback is not None and period is not None:  # before anything is recorded: refuse a lookback holding
        # the period's own conversions
        check_lookback(period, SpilledRowSet.merge_runs(
            map(RowSetPart.from_arrow_bytes, folder.iter_all(ROW_IDS + LOOKBACK_SUFFIX)), os.path.join(id_dir, "lookback")))
    rows, coarse = (None, None) if ledger is None or period is None else period
    if rows is not None and others:
        warn_other_ledgers(others, rows, summary)

    def record_release():
        """At commit (exclusive): check the released rows against the ledger and record them."""
        undo = None
        if ledger is not None and rows is not None:
            entry = {"output": folder.target, "staging": folder.staging, "params_sha256": version.checksum(),
                     "epsilon": params.epsilon, "mechanism": ParameterVersion(params).to_json(), **epsilon_note,
                     RELEASE_FILES: folder.release_digests()}
            entry_id = uuid.uuid4().hex
            folder.mark_pending(ledger.store.uri, entry_id)  # a kill from here on is settled by the next run
            try:
                recorded = ledger.check_and_record(rows, rows.to_parquet_bytes, entry, entry_id=entry_id,
                                                   coarse=coarse)
            except BaseException:
                if ledger.rollback_entry(entry_id):  # refused (or failed): nothing recorded
                    folder.clear_pending()
                raise
            summary.update(release_number_of_this_input=recorded.release_number,
                           conversions_released_before=recorded.rows_released_before,
                           ledger=ledger.store.uri, ledger_entry=recorded.entry["id"])
            private["ledger"] = {"uri": ledger.store.uri, "entry": recorded.entry}

            def undo():
                if ledger.rollback_entry(entry_id):
                    folder.clear_pending()
        folder.write(outputs.private_file(outputs.RUN_SUMMARY), jsonio.dumps(summary, indent=1).encode())
        return undo

    try:  # the page is for reading the release, not part of it: a failure to draw it never stops a release
        write_report(folder, summary, loaded, version, inputs, simulation, args.debug_run)
        summary["report_page"] = True
    except Exception as exc:  # noqa: BLE001 - said on stderr, and the console names no page
        print(f"araopt measure: WARNING: the report page was not written: {options.one_line(exc)}", file=sys.stderr)
        summary["report_page"] = False
    folder.commit(simulation, {"params_sha256": version.checksum(), "epsilon": params.epsilon}, private,
                  before_move=record_release)
    return summary


def warn_other_ledgers(others: Sequence[Ledger], rows: RowSet | SpilledRowSet, summary: dict) -> None:
    """One stderr warning per other ledger that records some of ``rows`` as released (another store
    released them: averaging the two releases strips noise); the counts go into the run summary."""
    found = {}
    for other in others:
        before, releases = other.released_before(rows)
        found[other.store.uri] = before
        if before:
            print(f"araopt measure: warning: {before:,} of the {len(rows):,} conversions of this input were already "
                  f"released from another store ({releases} release(s) in the ledger {other.store.uri}); releasing "
                  f"them again lets averages strip the noise", file=sys.stderr)
    summary["conversions_in_other_ledgers"] = found


def input_facts(inputs: InputFiles) -> dict:
    """Operator-private: the input's files with their sizes, and its time window from the footers."""
    sizes = {m.path: m.size_in_bytes for result in FileSystems.match(list(inputs.paths)) for m in result.metadata_list}
    return {"files": [{"path": p, "bytes": sizes.get(p)} for p in inputs.paths],
            "window": {"first_conversion_time": inputs.first_time, "last_conversion_time": inputs.last_time}}


def auto_shards(inputs: InputFiles, lookback: InputFiles | None = None) -> int:
    """Shards of ``ROWS_PER_SHARD`` rows of the input and its lookback (a shard holds both: sized by the input
    alone, a 30-day lookback made every shard 30 times larger)."""
    from transforms.io import auto_num_shards

    return auto_num_shards(inputs.rows + (lookback.rows if lookback is not None else 0))


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
    accounting = json.loads(folder.read(ACCOUNTING_FILE).decode())
    folder.remove([ACCOUNTING_FILE])
    if not accounting.get("accounting_closes"):
        raise RuntimeError(f"row accounting does not close: {accounting}")
    return accounting




def print_summary(summary: dict, output: str, simulation: bool) -> None:
    for line in summary_lines(summary, output, simulation):
        print(line)


def write_report(folder: RunFolder, summary: dict, loaded: LoadedParams, version: ParameterVersion,
                 inputs: InputFiles, simulation: bool, debug_run: bool) -> None:
    """The run's report page and figures (``araopt.evaluation.report_html``) into ``private/``: they show
    the exact accounting beside the released numbers, so they are operator-private."""
    from araopt.evaluation.report_html import DebugReport, release_report_files
    from araopt.publication import ESTIMATE_COLUMNS

    estimates = pd.read_parquet(io.BytesIO(folder.read(outputs.release_file(outputs.ESTIMATES_PARQUET, simulation))))
    slice_columns = [c for c in estimates.columns if c != "query" and c not in ESTIMATE_COLUMNS]
    debug = None
    debug_path = folder.path(outputs.private_file(outputs.DEBUG_REPORT))
    if debug_run and not is_remote(debug_path):
        from araopt.io import avro

        key_map = json.loads(folder.read(outputs.release_file(outputs.KEY_MAP_JSON, simulation)))
        _, unnoised, noise, _ = avro.read_debug_report(debug_path)
        debug = DebugReport(unnoised, noise, (*key_map["queries"], key_map["bottom_name"]),
                            version.params.contribution_budget)
    history = []
    if loaded.store is not None:
        from araopt.io.stores import open_store
        from araopt.nightly import version_table

        history = version_table(open_store(loaded.store))
    up = "../"
    links = [(f"{name} (released)", up + outputs.release_file(name, simulation))
             for name in (outputs.ESTIMATES_CSV, outputs.SUMMARY_REPORT, outputs.KEY_MAP_JSON, outputs.RELEASE_JSON,
                          outputs.MANIFEST)]
    links += [("run_summary.json (operator-private)", outputs.RUN_SUMMARY),
              ("run_manifest.json (operator-private)", outputs.RUN_MANIFEST),
              ("dead letter (operator-private)", outputs.DEAD_LETTER)]
    version_name = summary.get("parameters", {}).get("version")
    if loaded.store is not None and version_name and not is_remote(loaded.store):  # the night that chose them
        night = os.path.join(loaded.store, "reports", str(version_name), outputs.REPORT_HTML)
        if os.path.exists(night):
            links.append((f"the nightly report of {version_name}",
                          os.path.relpath(night, os.path.join(folder.target, outputs.PRIVATE_DIR))))
    console = summary_lines(summary, folder.target, simulation)
    files = release_report_files(estimates, slice_columns, console, summary, version, version_name,
                                 partition_days(inputs.paths), history, debug, links)
    for name, data in files.items():
        folder.write(outputs.private_file(name), data)


if __name__ == "__main__":
    raise SystemExit(run())
