"""`araopt export-attribution`: from W3C Attribution Level 1 parameters to what the ad servers and the
pages call (see docs/attribution.md).

    araopt export-attribution --params P --output DIR [--conversions LOG --simulation-seed S]
                              [--domain FILE] [--overwrite]

P is an Attribution parameter file (``araopt.attribution.params``: ``format``
``araopt-attribution-params/1``; not ARA's parameter version). DIR receives:

* ``calls.json``: per impression, the ``saveImpression`` options (``histogramIndex`` from the
  impression-side slice, ``lifetimeDays``); per conversion, one ``measureConversion`` per query, in
  order (``epsilon``, ``maxValue``, how ``value`` is computed from the query's column, ``lookbackDays``,
  ``credit``, ``histogramSize``); the browsers' configuration the parameters assume;
* ``histogram_layout.csv``: histogram index <-> impression-side slice values;
* ``export.json`` (summary) and ``_manifest.json``;
* with ``--conversions``, the operator-private ``private/events.jsonl``: one line per browser instance
  in the spec's end-to-end format (``{"config": {...}, "events": [...]}``, the instance's per-site
  budget, epoch length and epoch start in ``config``; every ``measureConversion`` event also carries
  ``"query"``), with the roundings and epoch starts ``araopt.attribution.measure`` draws for the same
  ``--simulation-seed``; ``private/README.txt`` says never to publish it.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pandas as pd

from araopt.attribution.encoder import DEFAULT_CONVERSION_SITE, DEFAULT_IMPRESSION_SITE, calls_json
from araopt.attribution.measure import export_cases
from araopt.attribution.params import PARAMS_FORMAT, AttributionParams
from araopt.attribution.release import histogram_layout
from araopt.errors import InvalidParameters
from araopt.io import jsonio, outputs
from araopt.io.conversions import ValidationCounts
from araopt.io.folders import EXPORT_FOLDER, OutputFolder, check_target
from araopt.mechanism.keys import KeyDomain
from araopt.mechanism.release import check_declared_domain

from . import options

if TYPE_CHECKING:
    from transforms.io import InputFiles

EVENTS_JSONL = "events.jsonl"
CALLS_JSON = "calls.json"
LAYOUT_CSV = outputs.HISTOGRAM_LAYOUT_CSV

EVENTS_PRIVATE_README_TEXT = """OPERATOR-PRIVATE - DO NOT PUBLISH

events.jsonl holds one line per browser instance of the --conversions log: its saveImpression and
measureConversion calls in the spec's end-to-end format, with the browser's raw id, the raw impression
and conversion times (as seconds) and the values sent: raw rows, neither noised nor aggregated. Use it
to replay the browsers (the reference implementation's tools/events.js, tests, simulations); never
publish it or send it to a third party. The files beside this folder (calls.json,
histogram_layout.csv, export.json) are the deployment: the ad servers' and the pages' inputs.
"""


def load_params(path: str) -> AttributionParams:
    """An Attribution parameter file (strict JSON, validated; every refusal one line naming the field)."""
    doc = jsonio.load(path, "parameter file")
    try:
        return AttributionParams.from_json(doc)
    except InvalidParameters as exc:
        raise InvalidParameters(f"parameter file {path}: {exc}") from None


def read_rows(pattern: str, params: AttributionParams) -> tuple[pd.DataFrame, ValidationCounts, InputFiles]:
    """Valid rows of a Parquet log with the Attribution columns, for ``params``' columns
    (``inputs.read_attribution_log``)."""
    from .inputs import read_attribution_log

    return read_attribution_log(pattern, (*params.slice_columns, *params.conversion_slice_columns),
                                params.value_columns)


def run_export_attribution(argv: Sequence[str] | None = None) -> int:
    return options.run_command("export-attribution", lambda a, _: _export(a), argv)


def _export(args: argparse.Namespace) -> int:
    prog = "araopt export-attribution"
    if args.simulation_seed is not None and args.simulation_seed < 0:
        raise InvalidParameters(f"--simulation-seed must be >= 0, got {args.simulation_seed}")
    if args.simulation_seed is not None and args.conversions is None:
        raise InvalidParameters("--simulation-seed only applies to events.jsonl, which needs --conversions")
    if args.conversions is not None and args.simulation_seed is None:
        raise InvalidParameters("--conversions writes the browsers' events with measure's roundings: pass "
                                "--simulation-seed S (the seed of the measure it is compared with)")
    check_target(args.output, args.overwrite, EXPORT_FOLDER)  # before any work; again at commit
    params = load_params(args.params)
    rows, counts, inputs = (read_rows(args.conversions, params) if args.conversions else (None, None, None))
    if args.domain is not None:
        from .inputs import read_domain

        domain = read_domain(args.domain, params.slice_columns, params.query_names, inputs)
        check_declared_domain(domain, args.simulation_seed, f"--domain {args.domain}")  # as measure refuses it
    elif rows is not None:
        domain = KeyDomain.from_slice_values(params.slice_columns, {c: rows[c].to_numpy() for c in params.slice_columns},
                                             params.query_names)
    else:
        raise InvalidParameters("export-attribution needs the histogram layout: pass --domain FILE (the impression-side "
                                "slice values) or --conversions LOG (its slices)")
    outside = 0 if rows is None else int(
        (domain.slice_index({c: rows[c].to_numpy() for c in params.slice_columns}) < 0).sum())
    cases = (None if rows is None else
             export_cases(params, rows, domain, simulation_seed=args.simulation_seed))
    # --- every check passed: write, whole or not at all ---
    with OutputFolder.prepare(args.output, args.overwrite, prog, EXPORT_FOLDER) as folder:
        out = lambda name: os.path.join(folder.staging, name)  # noqa: E731
        with open(out(CALLS_JSON), "w", encoding="utf-8") as fh:
            fh.write(jsonio.dumps(calls_json(params, domain), indent=1))
        with open(out(LAYOUT_CSV), "wb") as fh:
            fh.write(outputs.csv_bytes(histogram_layout(domain)))
        reports = 0
        if cases is not None:
            os.makedirs(out(outputs.PRIVATE_DIR))
            with open(out(outputs.private_file(outputs.PRIVATE_README)), "w", encoding="utf-8") as fh:
                fh.write(EVENTS_PRIVATE_README_TEXT)
            with open(out(outputs.private_file(EVENTS_JSONL)), "w", encoding="utf-8") as fh:
                for case in cases:
                    fh.write(jsonio.dumps(case, separators=(",", ":")))
                    fh.write("\n")
            reports = sum(1 for c in cases for ev in c["events"] if ev["event"] == "measureConversion")
        summary = {
            "params_format": PARAMS_FORMAT, "layout_sha256": domain.layout_checksum(),
            "domain_origin": domain.origin,
            "histogram_size": domain.num_slices, "queries": list(params.query_names),
            "conversions_read": 0 if counts is None else counts.rows_read,
            "conversions_rejected": {} if counts is None else dict(counts.rejected_by_reason),
            "conversions_outside_layout": outside,
            "browsers": 0 if cases is None else len(cases), "measure_conversion_calls": reports,
            "default_sites": {"impression": DEFAULT_IMPRESSION_SITE, "conversion": DEFAULT_CONVERSION_SITE},
            "simulation_seed": args.simulation_seed,
        }
        with open(out("export.json"), "w", encoding="utf-8") as fh:
            fh.write(jsonio.dumps(summary, indent=1))
        folder.commit({"command": "export-attribution"})
    if rows is not None and args.domain is None:
        print(f"{prog}: warning: the histogram layout lists exactly the slices present in {args.conversions}: deploy it "
              f"only if that log is history, never the data being measured", file=sys.stderr)
    if outside:
        print(f"{prog}: warning: {outside} conversions have impression-side slices outside the histogram layout: their "
              f"impressions get no histogramIndex and they make no measureConversion call", file=sys.stderr)
    if counts is not None and counts.rejected_by_reason:
        print(f"{prog}: warning: invalid conversion rows skipped: {dict(counts.rejected_by_reason)}", file=sys.stderr)
    print(f"{prog}: {len(params.queries)} measureConversion calls per conversion over {domain.num_slices} histogram "
          f"indices; wrote {CALLS_JSON}, {LAYOUT_CSV}, export.json under {args.output}")
    if cases is not None:
        print(f"  operator-private ({len(cases)} browsers, {reports} measureConversion events; raw ids and times, never "
              f"publish): {os.path.join(args.output, outputs.private_file(EVENTS_JSONL))}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pipelines.attribution export-attribution ...``: the same as ``araopt export-attribution``."""
    return options.subcommand_main("python -m pipelines.attribution", {"export-attribution": run_export_attribution},
                                   argv)


if __name__ == "__main__":
    raise SystemExit(main())
