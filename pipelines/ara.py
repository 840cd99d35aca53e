"""`araopt export-ara` and `araopt reconstruct`: from parameters to ARA registrations, and from
Aggregation Service summary reports back to estimates (see docs/ara.md); ``reconstruct`` of a W3C
Attribution version reads the aggregated histograms instead (docs/attribution.md).

    araopt export-ara --params P --out DIR [--conversions LOG | --key-map M] [--destination URL]
                      [--simulation-seed S] [--overwrite]
    araopt reconstruct --summary-report FILE_OR_GLOB [...] --params P (--key-map M | --conversions LOG)
                       --out estimates.csv [--confidence 0.95] [--epsilon E]

export-ara writes under DIR: key_map.json / key_map.csv (bucket <-> slice and query, with the
parameter file's sha256), sources.json (one Attribution-Reporting-Register-Source per slice of
impression features), output_domain.avro (AggregationBucket: every (slice, query) and bottom
bucket), export.json (summary) and, with --conversions, the operator-private private/triggers.jsonl
(one Attribution-Reporting-Register-Trigger per conversion, in browser arrival order, with its raw
impression id and time; private/README.txt says never to publish it). ARA limits are checked before
anything is written.

Each ``run_*`` takes argv (without the subcommand) and returns an exit code: 0 on success, 2 on bad
input with a one-line ``araopt <cmd>: error: ...`` on stderr and no traceback.
``python -m pipelines.ara <export-ara|reconstruct> ...`` runs the same functions.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd

from araopt.ara.exploration import domain_from_conversions
from araopt.ara.export import check_exportable, export_ara, export_domain
from araopt.ara.reconstruct import check_report_matches, estimates_from_summary_report, key_map_domain, report_warnings
from araopt.ara.registrations import (
    KeyMap,
    ara_warnings,
    check_ara_limits_for_cardinalities,
    destination_site,
)
from araopt.errors import InvalidInput, InvalidParameters, check_epsilon
from araopt.io import avro, jsonio, outputs
from araopt.io.conversions import Conversions
from araopt.io.files import atomic_write
from araopt.io.folders import EXPORT_FOLDER, OutputFolder, check_output_file, check_target
from araopt.io.partitions import partition_days
from araopt.mechanism.keys import KeyDomain
from araopt.mechanism.params import Params
from araopt.mechanism.release import history_days_reason, operator_private_reason, with_version_end
from araopt.publication import joined_calibration_reason
from araopt.version import Api, ParameterVersion

from . import options
from .runner import localize
from .values import parse_days_option


def _warn(prog: str, message: str) -> None:
    print(f"{prog}: warning: {message}", file=sys.stderr)


# ---- inputs ---------------------------------------------------------------------------------------
def read_conversion_log(pattern: str, params: Params) -> tuple[Conversions, dict[str, int], int]:
    """Valid conversions of a Parquet log (the same read and validation as every job), rejected rows
    by reason, rows read."""
    from .inputs import load_conversions

    conv, counts, _ = load_conversions(pattern, params.slice_columns, params.query_columns,
                                       impression_slice_columns=params.impression_slice_columns)
    return conv, dict(counts.rejected_by_reason), counts.rows_read


# ---- export-ara ----------------------------------------------------------------------------------
def run_export_ara(argv: Sequence[str] | None = None) -> int:
    return options.run_command("export-ara", _with_local_inputs(_export, ("key_map", "conversions")), argv)


def _with_local_inputs(body: Callable[[argparse.Namespace], int], fields: tuple[str, ...]
                       ) -> Callable[[argparse.Namespace, list[str]], int]:
    """Run ``body`` with remote (gs://) inputs among ``fields`` copied to a temporary directory."""
    import tempfile

    def run(args: argparse.Namespace, _: list[str]) -> int:
        with tempfile.TemporaryDirectory(prefix="araopt-inputs-") as tmp:
            for name in fields:
                value = getattr(args, name, None)
                if isinstance(value, list):
                    setattr(args, name, [localize(v, tmp) for v in value])
                elif value is not None:
                    setattr(args, name, localize(value, tmp))
            return body(args)

    return run


def load_version(ref: str) -> ParameterVersion:
    """A parameter file (.json, local or gs://) or a store (its ``latest``, or ``STORE/versions/<v>``),
    checksum-verified, as ``araopt measure`` takes it."""
    from .inputs import load_params as load

    return load(ref).version


def _export(args: argparse.Namespace) -> int:
    prog = "araopt export-ara"
    version = load_version(args.params)
    params = version.params
    if args.simulation_seed is not None and args.simulation_seed < 0:
        raise InvalidParameters(f"--simulation-seed must be >= 0, got {args.simulation_seed}")
    if args.simulation_seed is not None and args.conversions is None:
        raise InvalidParameters("--simulation-seed only applies to triggers, which need --conversions")
    check_exportable(version)
    check_target(args.output, args.overwrite, EXPORT_FOLDER)  # before any work; again at commit
    destination = destination_site(args.destination)
    if destination != args.destination.rstrip("/"):
        _warn(prog, f"--destination {args.destination} is registered as its site {destination} (as Chrome does)")
    check_ara_limits_for_cardinalities(params, [])  # limits that do not depend on the slices, before reading data
    conv, rejected, rows_read = (read_conversion_log(args.conversions, params) if args.conversions else (None, {}, 0))
    domain, warning = export_domain(version, KeyMap.load(args.key_map) if args.key_map else None, args.params, conv,
                                    args.conversions, args.simulation_seed)
    if warning is not None:
        _warn(prog, warning)
    export = export_ara(version, domain, destination, conv, rejected, rows_read, args.simulation_seed)
    batch, summary = export.triggers, export.summary
    # --- every check passed: write, whole or not at all ---
    with OutputFolder.prepare(args.output, args.overwrite, prog, EXPORT_FOLDER) as folder:
        out = lambda name: os.path.join(folder.staging, name)  # noqa: E731
        with open(out("key_map.json"), "w", encoding="utf-8") as fh:
            fh.write(jsonio.dumps(export.key_map, indent=1))
        with open(out("key_map.csv"), "wb") as fh:
            fh.write(outputs.csv_bytes(export.key_table))
        with open(out("sources.json"), "w", encoding="utf-8") as fh:
            fh.write(jsonio.dumps(export.sources, indent=1))
        avro.write_output_domain(out("output_domain.avro"), export.buckets)
        if batch is not None:
            os.makedirs(out(outputs.PRIVATE_DIR))
            with open(out(outputs.private_file(outputs.PRIVATE_README)), "w", encoding="utf-8") as fh:
                fh.write(outputs.EXPORT_PRIVATE_README_TEXT)
            with open(out(outputs.private_file(outputs.TRIGGERS_JSONL)), "w", encoding="utf-8") as fh:
                for line in export.trigger_lines(version):
                    fh.write(line)
                    fh.write("\n")
        with open(out("export.json"), "w", encoding="utf-8") as fh:
            fh.write(jsonio.dumps(summary, indent=1))
        folder.commit({"command": "export-ara", "params_sha256": version.checksum()})
    for w in ara_warnings(params, domain):
        _warn(prog, w)
    if batch is not None and batch.skipped:
        _warn(prog, f"conversions without a trigger (slice values outside the key map): {dict(batch.skipped)}")
    if rejected:
        _warn(prog, f"invalid conversion rows skipped: {rejected}")
    files = "key_map.json/.csv, sources.json, output_domain.avro, export.json, _manifest.json"
    exploration = params.exploration
    arm_note = ("" if exploration is None else
                f" + {exploration.num_arms} exploration arms x {domain.num_columns} keys")
    print(f"{prog}: {summary['sources']} source registrations, {summary['buckets']} buckets ({domain.num_slices} slices x "
          f"{domain.num_columns} keys{arm_note}, {domain.total_bits} bits), {summary['triggers']} triggers; wrote "
          f"{files} under {args.output}")
    if batch is not None:
        print(f"  operator-private (raw impression ids and conversion times, never publish): "
              f"{os.path.join(args.output, outputs.private_file(outputs.TRIGGERS_JSONL))}")
    return 0


# ---- reconstruct ---------------------------------------------------------------------------------
def run_reconstruct(argv: Sequence[str] | None = None) -> int:
    local = _with_local_inputs(_reconstruct, ("summary_report", "key_map", "conversions"))

    def run(args: argparse.Namespace, rest: list[str]) -> int:
        args.summary_report_as_given = list(args.summary_report) if isinstance(args.summary_report, list) \
            else [args.summary_report]  # (a remote report is copied to a flat temporary folder: its date= are lost)
        return local(args, rest)

    return options.run_command("reconstruct", run, argv)


def _reconstruct(args: argparse.Namespace) -> int:
    prog = "araopt reconstruct"
    if not (math.isfinite(args.confidence) and 0.0 < args.confidence < 1.0):
        raise InvalidParameters(f"--confidence must lie in (0, 1), got {args.confidence}")
    check_output_file(args.output, args.overwrite)
    stem = os.path.splitext(args.output)[0]
    side_summary, side_unknown = f"{stem}.summary.json", f"{stem}.unknown_buckets.csv"
    for side in (side_summary, side_unknown):  # the files written beside the estimates follow the same rule
        check_output_file(side, args.overwrite)
    file_version = load_version(args.params)
    if args.api is not None:
        file_version.require_api(Api(args.api), f"reconstruct --api {args.api}")
    if file_version.api == Api.ATTRIBUTION:  # W3C Attribution Level 1: aggregated histograms, not ARA's Avro
        return _reconstruct_attribution(args, file_version, (side_summary,))
    version = (file_version if args.epsilon is None
               else file_version.with_epsilon(check_epsilon(args.epsilon, "--epsilon")))
    params = version.params
    if args.key_map:
        domain = key_map_domain(KeyMap.load(args.key_map), file_version, version, args.params, args.epsilon)
        private = operator_private_reason(domain, f"--key-map {args.key_map}")
    elif args.conversions:
        conv, _, _ = read_conversion_log(args.conversions, params)
        domain = domain_from_conversions(params, conv)
        private = operator_private_reason(domain, f"--conversions {args.conversions}")
    else:
        raise InvalidParameters("reconstruct needs the key map: pass --key-map M (written by export-ara or measure) or "
                                "--conversions LOG to derive the domain from its slices")
    data = avro.read_report(args.summary_report)
    days = report_days(args.days, list(data.paths), getattr(args, "summary_report_as_given", []))
    domain = with_version_end(domain, file_version.domain)
    private = private or history_days_reason(domain, days) or joined_calibration_reason(version)
    frame, counters = estimates_from_summary_report(data.buckets, data.metrics, version, domain, args.confidence,
                                                    period_days=days)
    check_report_matches(counters)
    atomic_write(args.output, lambda fh: fh.write(outputs.csv_bytes(frame)), mode="wb")
    summary: dict[str, Any] = {"report_kind": data.kind, "files": len(data.paths), **counters.to_json(),
                               "slices": domain.num_slices, "estimates": args.output,
                               **_privacy_facts(domain, private)}
    if private is not None:
        _warn(prog, private)
    if counters.unknown:
        side = side_unknown
        rows = pd.DataFrame({"bucket": [f"0x{b:032x}" for b, _ in counters.unknown],
                             "metric": [m for _, m in counters.unknown]})
        atomic_write(side, lambda fh: rows.to_csv(fh, index=False), mode="w")
        summary["unknown_buckets_file"] = side
        _warn(prog, f"{counters.unknown_buckets} bucket(s) of the report are not in the key map (metric sum "
                    f"{counters.unknown_metric_sum}); listed in {side}")
    elif os.path.lexists(side_unknown):  # (--overwrite) an earlier run's list would describe another report
        os.remove(side_unknown)
    if data.kind == avro.DEBUG and data.annotations is not None:
        summary["debug_rows_not_in_domain"] = sum(1 for a in data.annotations if "in_domain" not in a)
    for warning in report_warnings(counters, params.epsilon):
        _warn(prog, warning)
    atomic_write(side_summary, lambda fh: fh.write(jsonio.dumps(summary, indent=1)), mode="w")
    arms = (f" ({counters.exploration_buckets:,} more are the exploration arms' keys)"
            if counters.exploration_buckets else "")
    print(f"{prog}: {counters.matched:,} of {counters.rows:,} report rows matched {domain.num_keys:,} keys of "
          f"{domain.num_slices:,} slices{arms}; estimates with {args.confidence:.0%} intervals written to {args.output} "
          f"(accounting in {side_summary})")
    if version.calibration is not None and version.calendar is not None and days is not None:
        print(f"  days {days[0]}..{days[-1]} ({len(days)}): the calibration's day-type effects "
              + ("applied" if counters.calendar_applied else "not fitted (history shorter than two weeks)"))
    if counters.calendar_note:
        print(f"  NOTE: {counters.calendar_note}")
    return 0


def _privacy_facts(domain: KeyDomain, private: str | None) -> dict[str, Any]:
    """What reconstruct's summary says of its estimates: the domain's origin and whether they are operator-private
    (``araopt.mechanism.release.operator_private_reason``)."""
    return {"domain_origin": domain.origin, "operator_private": private is not None,
            **({"operator_private_reason": private} if private is not None else {})}


def _reconstruct_attribution(args: argparse.Namespace, version: ParameterVersion, sides: tuple[str, ...]) -> int:
    """``araopt reconstruct`` for an attribution parameter version: the aggregation service's noisy
    histograms (CSV: ``query,histogram_index,noisy_sum``) -> Alg. 4's estimates with noise intervals per
    histogram index (of the true totals when the version carries a retention calibration), through the
    histogram layout (--key-map: measure's key_map.json; else the version's layout; else --conversions'
    slices)."""
    from araopt.attribution.calibrate import estimates_of
    from araopt.attribution.release import estimates_from_histograms, reconstruction_layout
    from araopt.io.files import atomic_write

    prog = "araopt reconstruct"
    params = version.attribution
    if params is None:
        raise InvalidParameters("the parameter version carries no attribution parameters")
    if args.epsilon is not None:
        raise InvalidParameters("--epsilon does not apply to an attribution version (each query's epsilon is in it)")
    rows = None
    if not args.key_map and version.domain is None and args.conversions:
        from .inputs import read_attribution_log

        rows, _, _ = read_attribution_log(args.conversions, (*params.slice_columns, *params.conversion_slice_columns),
                                          params.value_columns)
    domain = reconstruction_layout(params, KeyDomain.load(args.key_map) if args.key_map else None, args.key_map,
                                   version.domain, rows)
    private = operator_private_reason(domain, f"--key-map {args.key_map}" if args.key_map else
                                      "the parameter version" if version.domain is not None
                                      else f"--conversions {args.conversions}")
    # (no report days here: over a history layout the estimates are operator-private)
    private = private or history_days_reason(with_version_end(domain, version.domain), None) \
        or joined_calibration_reason(version)
    paths = args.summary_report if isinstance(args.summary_report, list) else [args.summary_report]
    frames = []
    for path in paths:
        try:
            frames.append(pd.read_csv(path))
        except Exception as exc:  # noqa: BLE001 - a parser error is bad input
            raise InvalidInput(f"cannot read the aggregated histograms {path}: {str(exc).splitlines()[0]}") from None
    frame, histograms, missing = estimates_from_histograms(params, version.retention,
                                                           pd.concat(frames, ignore_index=True), domain,
                                                           args.confidence, ", ".join(paths))
    atomic_write(args.output, lambda fh: fh.write(outputs.csv_bytes(frame)), mode="wb")
    summary = {"api": "attribution", "histograms": histograms, "histogram_size": domain.num_slices,
               "missing_entries": missing, "layout_sha256": domain.layout_checksum(), "estimates": args.output,
               "bias_corrected": version.retention is not None, **_privacy_facts(domain, private)}
    atomic_write(sides[0], lambda fh: fh.write(jsonio.dumps(summary, indent=1)), mode="w")
    if private is not None:
        _warn(prog, private)
    if missing:
        print(f"{prog}: warning: {missing} (query, histogram index) entries are missing from the histograms: their "
              f"estimates are NaN", file=sys.stderr)
    print(f"{prog}: {histograms} histogram(s) x {domain.num_slices:,} indices; estimates with "
          f"{args.confidence:.0%} intervals written to {args.output} (summary in {sides[0]})")
    print(f"  estimates are of {estimates_of(version.retention)}")
    return 0


def report_days(given: str | None, paths: Sequence[str], as_given: Sequence[str] = ()) -> tuple[str, ...] | None:
    """The days a summary report covers: ``--days``, else the ``date=YYYY-MM-DD/`` folders its files lie
    in (as ``measure`` reads its input's; for a remote report, the folders its argument names), else
    None (not known)."""
    days = parse_days_option(given)
    if days is None:
        days = partition_days(paths)
    if days is None and as_given:
        days = partition_days(as_given)
    return days


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pipelines.ara <export-ara|reconstruct> ...``: the same as ``araopt <command> ...``."""
    return options.subcommand_main("python -m pipelines.ara",
                                   {"export-ara": run_export_ara, "reconstruct": run_reconstruct}, argv)


if __name__ == "__main__":
    raise SystemExit(main())
