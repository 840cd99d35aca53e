"""`araopt nightly`: re-optimize on the last N days of conversions and publish to a parameter store.

    python -m pipelines.nightly --history 'hist/' --as-of 2026-11-24 --window-days 7 --store STORE \
        --slices campaignId,geography,productCategory --values value --epsilon 8 [Beam options]

One Beam pipeline: the window's date partitions (``date=YYYY-MM-DD/...``) -> validate -> group by
impression -> sufficient statistics (bounded size) -> a single-element step that runs the optimizer
(Alg. 5) and the baselines and applies the guardrails (``araopt.nightly``) -> the calibration of the
chosen parameters on the same grouped history (retention ratios) -> a single-element step
that attaches it, writes the run report (JSON + PNG) and publishes an immutable version, then moves
``latest`` with a compare-and-swap on the pointer read when the job started. Publishing inside the
pipeline (not after ``wait_until_finish``) is what a Dataflow Flex Template launcher needs; locally it
runs in the same process.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import time
import uuid
from collections.abc import Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from araopt.errors import InvalidParameters, check_epsilon
from araopt.io.partitions import window, window_partitions
from araopt.io.progress import Progress
from araopt.nightly import (
    Guardrails,
    NightlyConfig,
    conclude_night,
    latest_version,
    private_night,
)
from araopt.optimize import statistics as stats
from araopt.optimize.error_model import without_signal_note
from transforms.io import auto_shards, check_input, match_files
from transforms.tuning import build_nightly

from . import options
from .private import check_mode
from .runner import dry_run_sentence, make_runner, pipeline_options, run_pipeline, spill_folder
from .values import check_loss_factor, parse_special_days_option, parse_tau, resolve_as_of, split_columns


def build_parser() -> argparse.ArgumentParser:
    return options.build_parser("nightly")


def select_window(history: str, as_of: str, window_days: int, lookback_days: int = 0
                  ) -> tuple[list[str], list[str], list[str]]:
    """The window's files, its dates and its lookback's files under ``history``
    (``araopt.io.partitions.window_partitions``; the window's bounds checked before any listing)."""
    days = window(as_of, window_days, lookback_days)
    return window_partitions(match_files(history), days, repr(history))


def run(argv: Sequence[str] | None = None) -> int:
    return options.run_command("nightly", _run, argv)


def _run(args: argparse.Namespace, beam_args: list[str]) -> int:
    from araopt.io.stores import open_store

    started = time.time()
    as_of = resolve_as_of(args.as_of)
    if args.api == "attribution":
        if args.history is None:
            raise InvalidParameters("--history is required with --api attribution")
        return _run_attribution(args, as_of)
    epsilon = check_epsilon(args.epsilon, "--epsilon")
    slices = split_columns(args.slices, "--slices")
    values = split_columns(args.values, "--values")
    max_c = args.max_count_limit
    if check_mode(args):
        return _run_private(args, as_of, epsilon, slices, values, started)
    tau_overrides = tuple(parse_tau(args.tau).items())
    opts = pipeline_options(beam_args)
    pipeline = beam.Pipeline(runner=make_runner(opts), options=opts)  # Beam checks its options here: before any work
    # the store first: unknown scheme, credentials, corrupt pointer fail before any work
    store = open_store(args.store)
    expected, previous = latest_version(store)  # parsed once: the job's decision and publish steps take it
    files, dates, lookback_files = select_window(args.history, as_of, args.window_days, args.lookback_days)
    inputs = check_input(files, slices, values)
    lookback = check_input(lookback_files, slices, values) if lookback_files else None
    window_start = window(as_of, args.window_days).start.isoformat()
    config = NightlyConfig(
        store=args.store, as_of=as_of, run_id=args.run_id or uuid.uuid4().hex[:8], epsilon=epsilon,
        slice_columns=slices, window=(window_start, as_of), dates=tuple(dates), encoding=args.encoding,
        max_count_limit=max_c, objective=args.objective, max_rejected_fraction=args.max_rejected_fraction,
        tau_overrides=tau_overrides, release_period_days=args.release_period, lookback_days=args.lookback_days,
        special_days=parse_special_days_option(args.special_days),
        special_day_loss_factor=check_loss_factor(args.special_day_loss_factor),
        guardrails=Guardrails(bool(args.allow_large_change), args.max_threshold_change_factor,
                              args.max_count_limit_change))
    spec = stats.StatisticsSpec(slices, values, max_count_limit=max_c, period_days=max(1, round(args.release_period)))
    num_shards = args.num_shards or auto_shards(inputs, lookback)
    with spill_folder(opts, args.shuffle) as shuffle_dir:
        build_nightly(pipeline, inputs.paths, lookback.paths if lookback else (), spec, config, previous, expected,
                      num_shards, shuffle_dir)
        Progress("araopt nightly", enabled=not args.no_progress)(
            f"one Beam job: validate, group by impression, statistics, ParameterOptimization (Alg. 5), guardrails, "
            f"calibration, publish ({len(inputs.paths)} file(s), {inputs.rows:,} rows"
            + (f", {len(lookback.paths)} lookback file(s)" if lookback else "") + f", {num_shards} shards)")
        translated = run_pipeline(pipeline, opts)
    if translated is not None:  # a dry run: nothing was computed, reported or published
        print(dry_run_sentence("araopt nightly", [translated]))
        return 0
    report_path = FileSystems.join(args.store, "reports", f"{as_of}-{config.run_id}", "report.json")
    with FileSystems.open(report_path) as fh:
        report = json.loads(fh.read().decode())
    print_report(report, time.time() - started, report_path)
    return 0


def _run_private(args: argparse.Namespace, as_of: str, epsilon: float, slices: tuple[str, ...],
                 values: tuple[str, ...], started: float) -> int:
    """--private: the version for the day after ``as_of`` from the window's releases and first-party
    conversions (``pipelines.private``), guarded and published like any nightly version. No Beam job:
    the inputs are a few noised tables and the advertiser's conversion values."""
    from araopt.io.stores import open_store
    from araopt.ledger.verify import ReleaseVerifier
    from araopt.mechanism.exploration import default_exploration
    from araopt.optimize.private_inputs import describe

    from .private import load_declared_domain, start_of, tune_privately

    store = open_store(args.store)
    expected, previous = latest_version(store)
    domain = load_declared_domain(args.domain, slices, values)
    run_id = args.run_id or uuid.uuid4().hex[:8]
    # the releases: recorded in the store's ledger, made with its published versions; the arm plan: the
    # operator's option, else the latest version's (configuration, never a release folder's say)
    verifier = ReleaseVerifier.open(args.store, args.store)
    plan = (default_exploration(share=args.exploration_share) if args.exploration_share is not None
            else previous.params.exploration if previous is not None else None)
    tuning = tune_privately(args.releases, args.first_party, domain, values, epsilon, as_of, args.window_days,
                            args.max_count_limit, verifier, plan, start_of(args))
    guardrails = Guardrails(bool(args.allow_large_change), args.max_threshold_change_factor, args.max_count_limit_change)
    decision, report = private_night(tuning.version, previous, as_of, run_id, epsilon, expected, guardrails,
                                     window_days=args.window_days, release_dates=list(tuning.dates),
                                     cold_start=tuning.cold_start, first_party_rows_read=tuning.first_party.rows_read,
                                     first_party_rows_rejected=tuning.first_party.rejected,
                                     first_party_rows_after_as_of=tuning.first_party.after_last_day)
    version = decision.version
    if decision.idempotent:
        print(f"araopt nightly --private {as_of}: already published as {expected or '?'} (idempotent re-run)")
        return 0
    conclude_night(store, args.store, report, version, False, decision.problems, as_of, run_id, expected,
                   figure_from=version)
    series = decision.series
    print(f"araopt nightly --private {as_of}: published {report['version']} in {time.time() - started:.1f} s; "
          f"{describe(tuning)}")
    if series:
        print(f"  a new series of versions: {series}")
    return 0


def _run_attribution(args: argparse.Namespace, as_of: str) -> int:
    """``nightly --api attribution``: the window's files (``select_window``) read in memory, tuned
    (the tuning workflow with ``optimize.attribution``'s steps), decided (``araopt.nightly.attribution_night``:
    ARA's guardrails, the re-run rule) and concluded (``conclude_night``: published to the store, the run report written)."""
    from araopt.io.stores import open_store
    from araopt.nightly import attribution_night
    from araopt.optimize.attribution import AttributionBackend, AttributionSpec, AttributionTuner
    from araopt.optimize.workflow import tune_and_calibrate

    from .inputs import read_attribution_history, refuse_ara_only

    prog = "araopt nightly"
    files, dates, _ = select_window(args.history, as_of, args.window_days, 0)
    refuse_ara_only(args, prog, ("private", "tau", "special_days"))
    budget = check_epsilon(args.epsilon, "--epsilon")
    slices = split_columns(args.slices, "--slices")
    values = split_columns(args.values, "--values")
    store = open_store(args.store)
    expected, previous = latest_version(store)
    rows, counts = read_attribution_history(prog, files, slices, values, args.max_rejected_fraction)
    tuning = tune_and_calibrate(AttributionBackend(rows, args.seed, f"{prog}: the history"),
                                AttributionSpec(slices, values), AttributionTuner(budget, args.max_count_limit, args.seed))
    run_id = args.run_id or uuid.uuid4().hex[:8]
    window_start = window(as_of, args.window_days).start.isoformat()
    guardrails = Guardrails(bool(args.allow_large_change), args.max_threshold_change_factor, args.max_count_limit_change)
    decision, report = attribution_night(tuning, previous, as_of, run_id, budget, window_start, dates, expected,
                                         guardrails, dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), counts)
    directory = conclude_night(store, args.store, report, decision.version, decision.idempotent, decision.problems,
                               as_of, run_id, expected)
    version, result = decision.version, tuning.optimization
    assert version.retention is not None  # (the workflow fits it)
    status = (f"already published as {expected} (idempotent re-run)" if decision.idempotent
              else f"published {report['version']} to {args.store}")
    best = (f"best baseline {min(tuning.baselines.values()):.4g}" if tuning.baselines
            else "no baseline releasable at this budget")
    print(f"{prog}: api attribution, {tuning.rows:,} conversions in {len(dates)} day(s): C = "
          f"{result.params.count_limit(multi_epoch=True)}, predicted RMSRE_tau {result.rmsre_tau:.4g} vs {best}; "
          f"retention "
          + ", ".join(f"{n} {r:.3g}" for n, r in zip(version.retention.query_names, version.retention.ratios,
                                                   strict=True))
          + f"; {status}; report {directory}/report.json")
    if decision.series:
        print(f"  a new series of versions: {decision.series}")
    return 0


def print_report(report: dict, wall: float, path: str) -> None:
    p = report["params"]
    qs = ", ".join(f"{q['column']}: C_l={q['clip_threshold']:.4g} "
                   f"alpha={q['budget_fraction'] if q['budget_fraction'] is None else round(q['budget_fraction'], 4)}"
                   for q in p["queries"])
    base = ", ".join(f"{k} {v:.4g}" for k, v in report["baselines"].items())
    print(f"araopt nightly {report['as_of']} ({report['window'][0]}..{report['window'][1]}, {report['rows_read']:,} rows): "
          f"C={p['count_limit']}; {qs}")
    status = (f"already published as {report.get('version')} (idempotent re-run)" if report.get("idempotent")
              else f"published {report.get('version')}")
    page = path[:-len("report.json")] + "report.html" if path.endswith("report.json") else path
    print(f"  predicted RMSRE_tau {report['predicted_rmsre_tau']:.4g} vs {base}; {status} in {wall:.1f} s; report {path}; "
          f"its page {page}")
    if note := without_signal_note(report.get("predicted_without_signal", [])):
        print(f"  {note}")


if __name__ == "__main__":
    raise SystemExit(run())
