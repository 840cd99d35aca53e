"""`araopt measure` for a parameter version of the W3C Attribution Level 1 API (``api: attribution``;
``--api attribution`` checks it): the browsers and the aggregation service simulated on Beam, and
estimates with noise intervals published under the same rules as ARA's release (docs/attribution.md).

    araopt measure --input 'logs/*.parquet' --params STORE_OR_FILE --output out/ \\
        [--domain histogram_layout.csv|key_map.json] [--debug-run] [--simulation-seed S] [--overwrite]

Data flow: Parquet files -> validate (dead letter) -> shard by hash(browser_id) (the privacy unit is
browser instance x conversion site x epoch: every row of a browser meets in one shard) -> per shard:
encode, the browsers' per-site per-epoch budgets and safety limits, sums per (query, task, histogram
index) -> CombineGlobally (exact integers) -> noise once per index (discrete Laplace of scale
2 maxValue / epsilon, secure unless --simulation-seed) -> Alg. 4 (divide by the value scale) -> files.

Outputs (``araopt.io.outputs``, the run-folder contract): ``release/`` (``SIMULATION-`` names and
``simulation/`` in simulation) holds estimates.csv / .parquet, key_map.json (the histogram layout),
histogram_layout.csv and release.json; ``private/`` the dead letter, run_summary.json (exact counts)
and, with --debug-run, debug_histograms.csv (``query,histogram_index,unnoised_sum``); the release
manifest is written last.
"""
from __future__ import annotations

import argparse
import io
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

from araopt.attribution.calibrate import Retention, estimates_of
from araopt.attribution.lifetime import CHARGED, ChargedWindow
from araopt.attribution.params import AttributionParams
from araopt.attribution.reconstruct import check_noise_rates, layout_frame
from araopt.errors import InvalidInput, InvalidParameters, PrivacyRefusal, Unsupported
from araopt.io import jsonio, outputs
from araopt.io.conversions import BROWSER_ID, IMPRESSION_TIME, check_attribution_schema, type_family
from araopt.io.progress import Progress
from araopt.io.rowset import RowSet, RowSetPart
from araopt.io.run_folder import ROW_IDS, RunFolder, failures_settled
from araopt.io.store import StoreError
from araopt.mechanism.keys import DATA, KeyDomain
from araopt.mechanism.release import release_domain
from araopt.version import Api, ParameterVersion
from transforms.attribution import AttributionRelease, MeasureAttribution, unit_column
from transforms.io import InputFiles, check_input
from transforms.rowset import WriteRowIds
from transforms.validate import ReadAndValidate

from .inputs import LoadedParams, read_domain
from .ledger import RELEASE_FILES, Ledger, LedgerRefusal, ledger_root
from .runner import (
    dry_run_sentence,
    is_local_runner,
    measure_job,
    run_pipeline,
    runner_name,
    spill_folder,
)

DEBUG_HISTOGRAMS_CSV = "debug_histograms.csv"
HISTOGRAM_LAYOUT_CSV = "histogram_layout.csv"
ACCOUNTING_FILE = outputs.private_file(outputs.ACCOUNTING)
_NOT_FOR_ATTRIBUTION = (("epsilon", "--epsilon (each query's epsilon is in the parameters)"),
                        ("lookback", "--lookback (the browsers' lookback is lookbackDays)"),
                        ("lookback_days", "--lookback-days"), ("check_ledgers", "--check-ledgers"))


def attribution_columns(inputs: InputFiles) -> tuple[str, ...]:
    """The W3C Attribution columns every input file has, typed (``impression_time`` required: it
    decides the epochs)."""
    from transforms.io import read_schema

    every: tuple[str, ...] | None = None
    browser_types: dict[str, str] = {}  # type family -> a file with it
    for path in inputs.paths:
        schema = read_schema(path)
        present = check_attribution_schema(schema, path)
        if IMPRESSION_TIME not in present:
            raise InvalidInput(f"{path}: column {IMPRESSION_TIME!r} is missing (the browsers' epochs need it)")
        if BROWSER_ID in present:
            browser_types.setdefault(type_family(schema.field(BROWSER_ID).type), path)
        every = present if every is None else tuple(c for c in every if c in present)
    if browser_types and BROWSER_ID not in (every or ()):  # some files name the browser, others do not
        raise InvalidInput(f"column {BROWSER_ID!r} is in {next(iter(browser_types.values()))} but not in every input "
                           f"file: without it each impression would be its own browser (a budget each), with it the "
                           f"browser; give every file the column, or none")
    if len(browser_types) > 1:
        kinds = "; ".join(f"{family} in {path}" for family, path in browser_types.items())
        raise InvalidInput(f"column {BROWSER_ID!r} has different types across the input files ({kinds}): a browser's "
                           f"id must have one type in every file (cast them to one type)")
    return every or ()


def resolve_layout(args: argparse.Namespace, version: ParameterVersion, params: AttributionParams,
                   inputs: InputFiles) -> tuple[KeyDomain | None, str]:
    """(the declared histogram layout, or None for the simulation-only data-derived one; its origin):
    ARA's release rule (``release_domain``) over --domain and the version's layout."""
    given = None
    if args.domain is not None:
        given = read_domain(args.domain, params.slice_columns, params.query_names, inputs)
        params.check_domain(given, source=f"domain {args.domain}")
    families = {c: type_family(inputs.schema.field(c).type) for c in params.slice_columns}
    domain, origin = release_domain(given, f"--domain {args.domain}", version.domain, families, args.simulation_seed,
                                    args.max_slices, "--max-slices")
    if domain is None:
        print("WARNING: SIMULATION: the histogram layout is derived from the data being measured (allowed only in "
              "simulation mode; a real release needs --domain)", file=sys.stderr)
    return domain, origin


class _WriteRelease(beam.DoFn):
    """The release's files into the staging folder (names and visibility: ``araopt.io.outputs``)."""

    def __init__(self, staging: str, params_sha256: str, simulation: bool, debug_run: bool,
                 retention: Retention | None = None):
        self._staging, self._sha, self._simulation = staging, params_sha256, simulation
        self._debug, self._retention = debug_run, retention

    def _put(self, relative: str, data: bytes) -> None:
        with FileSystems.create(FileSystems.join(self._staging, *relative.split("/"))) as fh:
            fh.write(data)

    def process(self, rel: AttributionRelease) -> Iterator[str]:
        if (rel.simulation_seed is not None) != self._simulation:
            raise PrivacyRefusal("a release noised with a simulation seed is written only as a simulation, and a "
                                 "simulation only with seeded noise")
        name = lambda n: outputs.release_file(n, self._simulation)  # noqa: E731
        frame = rel.estimates_frame(self._retention)
        buf = io.BytesIO()
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), buf)
        self._put(name(outputs.ESTIMATES_PARQUET), buf.getvalue())
        self._put(name(outputs.ESTIMATES_CSV), outputs.csv_bytes(frame))
        self._put(name(outputs.KEY_MAP_JSON), jsonio.dumps(rel.domain.to_json(self._sha), indent=1).encode())
        self._put(name(HISTOGRAM_LAYOUT_CSV), outputs.csv_bytes(layout_frame(rel.domain)))
        self._put(name(outputs.RELEASE_JSON), jsonio.dumps(release_json(rel, self._sha, self._retention),
                                                            indent=1).encode())
        if self._debug:
            self._put(outputs.private_file(DEBUG_HISTOGRAMS_CSV), outputs.csv_bytes(rel.debug_frame()))
        self._put(ACCOUNTING_FILE, jsonio.dumps(rel.accounting(), indent=1).encode())
        yield "done"


def release_json(rel: AttributionRelease, params_sha256: str, retention: Retention | None = None) -> dict[str, Any]:
    """What release.json says: public facts only (no exact counts)."""
    p = rel.params
    level = next(iter(rel.estimates.values())).level
    return {"api": Api.ATTRIBUTION.value, "params_sha256": params_sha256, "per_site_budget": p.per_site_budget,
            "epoch_days": p.epoch_days, "lookback_days": p.lookback_days,
            "queries": [{"name": q.name, "column": q.column, "epsilon": q.epsilon, "max_value": q.max_value,
                         "clip": q.clip, "value_scale": q.value_scale, "noise_scale": q.noise_scale} for q in p.queries],
            "histogram_size": rel.domain.num_slices, "layout_sha256": rel.domain.layout_checksum(),
            "domain": "data" if rel.domain.origin == DATA else rel.domain.origin,
            "interval_level": level, "simulation": rel.simulation_seed is not None,
            "bias_corrected": retention is not None, "estimates": estimates_of(retention),
            "retention": None if retention is None else {"ratios": dict(zip(p.query_names, retention.ratios,
                                                                            strict=True)),
                                                         "spreads": dict(zip(p.query_names, retention.spreads,
                                                                             strict=True)),
                                                         "level": retention.level}}


def build_pipeline(pipeline: beam.Pipeline, inputs: InputFiles, version: ParameterVersion, folder: RunFolder,
                   domain: KeyDomain | None, simulation_seed: int | None = None, debug_run: bool = False,
                   num_shards: int = 64, max_rejected_fraction: float = 0.10, shuffle_dir: str | None = None,
                   one_dead_letter_file: bool = True, row_ids: str | None = None
                   ) -> beam.PCollection[AttributionRelease]:
    """Wire the Attribution measurement into ``folder``'s staging location; returns the release.
    ``row_ids``: where the released rows' ids go, for the ledger (``transforms.rowset``)."""
    params = attribution_params(version)
    present = attribution_columns(inputs)
    read = pipeline | "ReadAndValidate" >> ReadAndValidate(
        inputs.paths, (*params.slice_columns, *params.conversion_slice_columns), params.value_columns,
        folder.path(outputs.private_file(outputs.DEAD_LETTER))[:-len(".parquet")], passthrough=present,
        one_dead_letter_file=one_dead_letter_file, attribution=True)
    if row_ids is not None:
        _ = read["valid"] | "ReleasedRowIds" >> WriteRowIds(row_ids)
    release = read["valid"] | "MeasureAttribution" >> MeasureAttribution(
        params, read["counts"], domain, simulation_seed, num_shards, unit_column(present), shuffle_dir,
        max_rejected_fraction=max_rejected_fraction)
    _ = release | "WriteRelease" >> beam.ParDo(_WriteRelease(folder.staging, version.checksum(),
                                                             simulation_seed is not None, debug_run,
                                                             version.retention))
    return release


def attribution_params(version: ParameterVersion) -> AttributionParams:
    version.require_api(Api.ATTRIBUTION, "measure --api attribution")
    if version.attribution is None:  # (require_api: an attribution version carries them)
        raise InvalidParameters("the parameter version carries no attribution parameters")
    if version.attribution.conversion_slice_columns:
        raise Unsupported("measure --api attribution: conversion-side slices (aggregation tasks) need a declared task "
                          "layout, not supported yet")
    check_noise_rates(version.attribution)  # before any work, not at the job's noise step
    return version.attribution


def _recorder(ledger: Ledger, folder: RunFolder, version: ParameterVersion, summary: dict[str, Any],
              private: dict[str, Any]) -> Callable[[], Callable[[], None] | None]:
    """At commit (exclusive): refuse conversions released before (the ledger's rule, as ARA's releases)
    and a release charging an epoch an earlier attribution release charged (``araopt.attribution.lifetime``:
    each release simulates fresh budgets), and record this release's; returns the undo if the commit
    then fails."""
    parts = [RowSetPart.from_arrow_bytes(b) for b in folder.read_all(ROW_IDS)]
    rows, coarse = RowSet.merge(parts), RowSet.merge(p.coarse_part() for p in parts)
    window = summary.get(CHARGED)
    charged = None if window is None else ChargedWindow.from_json(window)  # no epoch charged twice over releases

    def record() -> Callable[[], None] | None:
        entry = {"output": folder.target, "staging": folder.staging, "params_sha256": version.checksum(),
                 "api": Api.ATTRIBUTION.value, "epsilon": version.params.epsilon, "mechanism": version.to_json(),
                 CHARGED: window, RELEASE_FILES: folder.release_digests()}
        entry_id = uuid.uuid4().hex
        folder.mark_pending(ledger.store.uri, entry_id)
        try:
            recorded = ledger.check_and_record(rows, rows.to_parquet_bytes(), entry, entry_id=entry_id, coarse=coarse,
                                               charged=charged)
        except BaseException:
            if ledger.rollback_entry(entry_id):
                folder.clear_pending()
            raise
        summary.update(release_number_of_this_input=recorded.release_number, ledger=ledger.store.uri,
                       ledger_entry=recorded.entry["id"])
        private["ledger"] = {"uri": ledger.store.uri, "entry": recorded.entry}
        folder.write(outputs.private_file(outputs.RUN_SUMMARY), jsonio.dumps(summary, indent=1).encode())

        def undo() -> None:
            if ledger.rollback_entry(entry_id):
                folder.clear_pending()
        return undo
    return record


def run_attribution(args: argparse.Namespace, beam_args: list[str], loaded: LoadedParams, started: float) -> int:
    """``araopt measure`` for an attribution version (called by ``pipelines.measure``)."""
    for name, flag in _NOT_FOR_ATTRIBUTION:
        if getattr(args, name, None) not in (None, False, []):
            raise InvalidParameters(f"{flag} does not apply to measure --api attribution")
    version = loaded.version
    params = attribution_params(version)
    simulation = args.simulation_seed is not None
    if simulation and args.simulation_seed < 0:
        raise InvalidParameters(f"--simulation-seed must be >= 0, got {args.simulation_seed}")
    if not simulation and args.debug_run:
        raise PrivacyRefusal("--debug-run writes unnoised sums: it needs --simulation-seed (a simulation)")
    opts, pipeline = measure_job(args, beam_args)
    inputs = check_input(args.input, (*params.slice_columns, *params.conversion_slice_columns), params.value_columns)
    attribution_columns(inputs)
    domain, origin = resolve_layout(args, version, params, inputs)
    ledger = None if simulation else Ledger.open(ledger_root(loaded.store, args.ledger), args.allow_rerelease)
    folder = RunFolder.prepare(args.output, args.overwrite)
    with failures_settled(folder, (StoreError, LedgerRefusal)):
        from transforms.io import auto_num_shards

        num_shards = args.num_shards or auto_num_shards(inputs.rows)
        with spill_folder(opts, args.shuffle) as shuffle_dir:
            build_pipeline(pipeline, inputs, version, folder, domain, args.simulation_seed, args.debug_run, num_shards,
                           args.max_rejected_fraction, shuffle_dir, one_dead_letter_file=is_local_runner(opts),
                           row_ids=None if ledger is None else folder.path(ROW_IDS))
            Progress("araopt measure", enabled=not args.no_progress)(
                f"the Beam job (attribution): validate, group by browser, the browsers' budgets, sum, noise once per "
                f"histogram index ({len(inputs.paths)} file(s), {inputs.rows:,} rows, {num_shards} shards)")
            translated = run_pipeline(pipeline, opts)
        if translated is not None:
            folder.abandon()
            print(dry_run_sentence("araopt measure", [translated]))
            return 0
        accounting = jsonio.loads(folder.read(ACCOUNTING_FILE), "accounting")
        folder.remove([ACCOUNTING_FILE])
        if not accounting.get("accounting_closes"):
            raise RuntimeError(f"row accounting does not close: {accounting}")
        summary = {"OPERATOR_PRIVATE": "exact, un-noised counts: never publish", **accounting,
                   "api": Api.ATTRIBUTION.value, "per_site_budget": params.per_site_budget,
                   "queries": list(params.query_names), "parameters": loaded.source, "simulation": simulation,
                   "simulation_seed": args.simulation_seed, "domain": origin, "num_shards": num_shards,
                   "bias_corrected": version.retention is not None,
                   "retention": None if version.retention is None else version.retention.to_json(),
                   "runner": runner_name(opts), "wall_time_s": round(time.time() - started, 3)}
        folder.write(outputs.private_file(outputs.PRIVATE_README), outputs.PRIVATE_README_TEXT.encode())
        folder.write(outputs.private_file(outputs.RUN_SUMMARY), jsonio.dumps(summary, indent=1).encode())
        private: dict[str, Any] = {"params_sha256": version.checksum(), "domain": origin}
        record = None if ledger is None else _recorder(ledger, folder, version, summary, private)
        folder.commit(simulation, {"params_sha256": version.checksum(), "api": Api.ATTRIBUTION.value}, private,
                      before_move=record)
    mark = "SIMULATION (not private) " if simulation else ""
    print(f"araopt measure: {mark}attribution release of {len(params.queries)} histogram(s) x "
          f"{summary['histogram_size']:,} indices written to {folder.target}/"
          f"{outputs.release_dir(simulation)}/ in {summary['wall_time_s']:.1f} s (domain: {origin})")
    print(f"  operator-private (exact, never publish): {summary['rows_read']:,} rows read = {summary['conversions_kept']:,} "
          f"kept + {summary['conversions_outside_domain']:,} outside the layout + {summary['rows_rejected']:,} rejected; "
          f"{summary['reports_refused_for_budget']:,} of {summary['reports']:,} reports refused for budget")
    print(f"  estimates are of {estimates_of(version.retention)}")
    return 0

