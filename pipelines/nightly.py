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

from araopt.errors import InvalidInput, InvalidParameters, check_epsilon
from araopt.io import jsonio
from araopt.io.conversions import ValidationCounts
from araopt.io.progress import Progress
from araopt.nightly import (
    Guardrails,
    NightlyConfig,
    NightlyDecision,
    nightly_decision,
    nightly_report,
    nightly_report_png,
    private_night,
    publish_version,
    version_history,
    version_report_png,
    version_table,
    with_calibration,
)
from araopt.optimize import statistics as stats
from araopt.optimize.statistics import SufficientStatistics
from araopt.version import ParameterVersion
from transforms.io import auto_num_shards, check_input, match_files
from transforms.tuning import StatisticsAndCalibration
from transforms.validate import ReadAndValidate

from . import options
from .partitions import partition_day
from .private import check_mode
from .runner import dry_run_sentence, make_runner, pipeline_options, run_pipeline, spill_folder
from .values import check_loss_factor, parse_special_days_option, parse_tau, resolve_as_of, split_columns


def build_parser() -> argparse.ArgumentParser:
    return options.build_parser("nightly")


def select_window(history: str, as_of: str, window_days: int, lookback_days: int = 0
                  ) -> tuple[list[str], list[str], list[str]]:
    """Files of the conversion-date partitions in [as_of - window_days + 1, as_of], the dates found, and
    the files of the ``lookback_days`` partitions before the window (read only for lifetime ranks)."""
    if window_days < 1:
        raise InvalidParameters(f"--window-days must be >= 1, got {window_days}")
    if lookback_days < 0:
        raise InvalidParameters(f"--lookback-days must be >= 0, got {lookback_days}")
    end = dt.date.fromisoformat(as_of)
    start = end - dt.timedelta(days=window_days - 1)
    lookback_start = start - dt.timedelta(days=lookback_days)
    files = match_files(history)
    chosen, lookback, dates = [], [], set()
    for path in files:
        found = partition_day(path)  # a malformed date= folder is refused, not skipped
        if found is None:
            continue
        day = dt.date.fromisoformat(found)
        if start <= day <= end:
            chosen.append(path)
            dates.add(found)
        elif lookback_start <= day < start:
            lookback.append(path)
    if not chosen:
        raise InvalidInput(f"no history in the window {start}..{end} under {history!r} "
                           f"({len(files)} files found, partitions must look like date=YYYY-MM-DD/)")
    return chosen, sorted(dates), lookback


def _decide(statistics: SufficientStatistics, counts: ValidationCounts, config: NightlyConfig,
            previous_payload: bytes | None) -> tuple[NightlyDecision, tuple[ParameterVersion, ...]]:
    """The single-element decision step: ``araopt.nightly.nightly_decision`` (gate, tune, guardrails),
    and the candidate versions to calibrate."""
    previous = ParameterVersion.from_bytes(previous_payload, "previous latest") if previous_payload else None
    decision = nightly_decision(statistics, counts, config, previous)
    return decision, tuple(v for v, _ in decision.tuning.candidates)


class _CalibrateReportAndPublish(beam.DoFn):
    """The single-element publish step: the parameters with the window's calibration attached, the
    run report, and the publish (only if the decision says so)."""

    def __init__(self, config: NightlyConfig, previous_payload: bytes | None, expected_previous: str | None):
        self._config = config
        self._previous_payload = previous_payload
        self._expected_previous = expected_previous

    def setup(self):
        from araopt.io.stores import open_store

        self._store = open_store(self._config.store)

    def process(self, decision: NightlyDecision, calibration_statistics, counts: ValidationCounts):
        config = self._config
        previous = ParameterVersion.from_bytes(self._previous_payload, "previous latest") if self._previous_payload else None
        decision = with_calibration(decision, calibration_statistics, previous, config)
        report = nightly_report(decision, config, counts, self._expected_previous)
        report_dir = FileSystems.join(config.store, "reports", f"{config.as_of}-{config.run_id}")
        if decision.idempotent:  # the same as-of date on the same history: nothing new to publish
            report.update(version=self._expected_previous)
        elif decision.problems:
            _write_report(report_dir, report, decision, self._store)
            raise InvalidInput("not published: " + "; ".join(decision.problems) + f" (report: {report_dir})")
        else:
            publish_version(self._store, decision.tuning.version, report, config.as_of, config.run_id,
                            self._expected_previous)
        _write_report(report_dir, report, decision, self._store)
        yield report


def _write_report(directory: str, report: dict, decision: NightlyDecision | None, store,
                  version: ParameterVersion | None = None) -> None:
    """report.json, report.png (from the decision, or from what ``version`` records of its tuning: the
    privacy-safe run; none for its cold start) and report.html, the page a person opens
    (``araopt.evaluation.report_html``), beside them."""
    from araopt.evaluation.report_html import Figure, nightly_page
    from araopt.io.folders import REPORT_FOLDER, write_folder

    files = {"report.json": jsonio.dumps(report, indent=1, default=str).encode()}
    figures, links = [], [("report.json (the run report)", "report.json")]
    if decision is not None:
        png: bytes | None = nightly_report_png(decision, version_history(store))
    else:
        png = None if version is None else version_report_png(version, report.get("problems", ()),
                                                               version_history(store))
    if png is not None:
        files["report.png"] = png
        figures.append(Figure("The nightly choice (report.png)", png, "report.png"))
        links.append(("report.png", "report.png"))
    if report.get("published") and report.get("version"):
        links.append((f"published parameters {report['version']}", f"../../versions/{report['version']}/params.json"))
    files["report.html"] = nightly_page(report, version_table(store), figures, links).encode("utf-8")
    # whole or absent, like every output folder; a re-run with the same --run-id replaces its own report
    write_folder(directory, files, "araopt nightly report", REPORT_FOLDER, {"command": "nightly"}, overwrite=True)


def run(argv: Sequence[str] | None = None) -> int:
    return options.run_command("nightly", _run, argv)


def _run(args: argparse.Namespace, beam_args: list[str]) -> int:
    from araopt.io.stores import open_store

    started = time.time()
    as_of = resolve_as_of(args.as_of)
    if args.api == "attribution":
        from .tune_attribution import run_nightly as run_attribution

        if args.history is None:
            raise InvalidParameters("--history is required with --api attribution")
        files, dates, _ = select_window(args.history, as_of, args.window_days, 0)
        return run_attribution(args, "araopt nightly", as_of, files, dates, _write_report)
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
    pointer = store.read_latest_pointer()
    previous_payload = store.resolve("latest").payload if pointer else None
    files, dates, lookback_files = select_window(args.history, as_of, args.window_days, args.lookback_days)
    inputs = check_input(files, slices, values)
    lookback = check_input(lookback_files, slices, values) if lookback_files else None
    window_start = (dt.date.fromisoformat(as_of) - dt.timedelta(days=args.window_days - 1)).isoformat()
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
    num_shards = args.num_shards or auto_num_shards(inputs.rows + (lookback.rows if lookback else 0))  # shards hold both
    with spill_folder(opts, args.shuffle) as shuffle_dir:
        read = pipeline | "ReadWindow" >> ReadAndValidate(inputs.paths, slices, values, num_shards=num_shards,
                                                          spill_dir=shuffle_dir,
                                                          lookback_paths=lookback.paths if lookback else (),
                                                          shard_files=True)  # the calibration reads the shards again
        counts = read["counts"]
        tuned = read["grouped"] | "OptimizeAndGuard" >> StatisticsAndCalibration(spec, _decide, counts, config,
                                                                                 previous_payload)
        decision, calibration = tuned["chosen"], tuned["calibration"]
        _ = decision | "CalibrateReportAndPublish" >> beam.ParDo(
            _CalibrateReportAndPublish(config, previous_payload, pointer.version if pointer else None),
            beam.pvalue.AsSingleton(calibration), beam.pvalue.AsSingleton(counts))
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
    from araopt.mechanism.exploration import default_exploration
    from araopt.optimize.private_inputs import describe

    from .private import load_declared_domain, tune_privately
    from .verified_releases import ReleaseVerifier

    store = open_store(args.store)
    pointer = store.read_latest_pointer()
    previous = ParameterVersion.from_bytes(store.resolve("latest").payload, "previous latest") if pointer else None
    domain = load_declared_domain(args.domain, slices, values)
    run_id = args.run_id or uuid.uuid4().hex[:8]
    # the releases: recorded in the store's ledger, made with its published versions; the arm plan: the
    # operator's option, else the latest version's (configuration, never a release folder's say)
    verifier = ReleaseVerifier.open(args.store, args.store)
    plan = (default_exploration(share=args.exploration_share) if args.exploration_share is not None
            else previous.params.exploration if previous is not None else None)
    tuning = tune_privately(args.releases, args.first_party, domain, values, epsilon, as_of, args.window_days,
                            args.max_count_limit, verifier, plan)
    guardrails = Guardrails(bool(args.allow_large_change), args.max_threshold_change_factor, args.max_count_limit_change)
    expected = pointer.version if pointer else None
    decision, report = private_night(tuning.version, previous, as_of, run_id, epsilon, expected, guardrails,
                                     window_days=args.window_days, release_dates=list(tuning.dates),
                                     cold_start=tuning.cold_start, first_party_rows_read=tuning.first_party.rows_read,
                                     first_party_rows_rejected=tuning.first_party.rejected,
                                     first_party_rows_after_as_of=tuning.first_party.after_last_day)
    version = decision.version
    if decision.idempotent:
        print(f"araopt nightly --private {as_of}: already published as {expected or '?'} (idempotent re-run)")
        return 0
    report_dir = FileSystems.join(args.store, "reports", f"{as_of}-{run_id}")
    if decision.publish:
        publish_version(store, version, report, as_of, run_id, expected)
    _write_report(report_dir, report, None, store, version)
    problems, series = decision.problems, decision.series
    if problems:
        raise InvalidInput("not published: " + "; ".join(problems) + f" (report: {report_dir})")
    print(f"araopt nightly --private {as_of}: published {report['version']} in {time.time() - started:.1f} s; "
          f"{describe(tuning)}")
    if series:
        print(f"  a new series of versions: {series}")
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


if __name__ == "__main__":
    raise SystemExit(run())
