"""`araopt measure`: a conversion log -> the release a parameter version's target would make, and
estimates with error bars, on Apache Beam: ARA's summary report (ContributionCapping, Alg. 1;
SummaryReport, Alg. 2; HistogramContribution, Alg. 3 / Alg. 6; ReconstructValues, Alg. 4) or, for a
version of the W3C Attribution target (``api: attribution``; ``--api`` checks it), the browsers and the
aggregation service simulated, with estimates under the same release rules (docs/attribution.md).

    araopt measure --input 'logs/*.parquet' --params STORE_OR_FILE --output out/ \\
        [--domain key_map.json|slices.csv] [--debug-run] [--overwrite] [Beam options]

One command path for both targets (``araopt.targets``): parse and check the options, load the inputs,
decide the domain (``release_workflow.resolve_release_domain``), build the target's job
(``transforms.measure``), run it, then the commit (``araopt.ledger.commit``: the accounting read back,
the ledger step, the manifests) and the console lines (``araopt.release_summary``).

A release needs a declared key domain (--domain, or the one the parameter version carries); only
simulation mode (--simulation-seed: seeded noise, NOT private) may derive it from the data.
Outputs (``araopt.io.outputs``): out/release/ is publishable; out/private/ holds exact counts, the dead
letter and the debug report and must never be published; out/release/MANIFEST.json is written last.
"""
from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from araopt.attribution.content import lookback_specs
from araopt.attribution.draws import DrawKey
from araopt.attribution.lifetime import AttributionHistory
from araopt.errors import InvalidInput, InvalidParameters
from araopt.io import outputs
from araopt.io.conversions import IMPRESSION_TIME, type_family
from araopt.io.partitions import DAY_US, partition_days
from araopt.io.progress import Progress
from araopt.io.run_folder import ROW_IDS, RunFolder, failures_settled
from araopt.io.store import StoreError
from araopt.ledger.attribution import (
    carried_entries,
    content_check,
    content_refusal,
    entry_fields,
    held_counts,
    prepare_release,
)
from araopt.ledger.commit import (
    LedgerStep,
    commit_release,
    merged_identities,
    released_elsewhere,
    take_accounting,
    take_held,
)
from araopt.ledger.ledger import MEASUREMENT_START, Ledger, LedgerRefusal, check_lookback, ledger_root, other_ledgers
from araopt.ledger.lifetime import LookbackCover, ReleasePeriod
from araopt.mechanism.keys import DATA, KeyDomain
from araopt.mechanism.lifetime import ReleaseHistory
from araopt.release_summary import attribution_summary_lines, run_summary, summary_lines
from araopt.release_workflow import check_debug_run, release_epsilon, resolve_release_domain
from araopt.targets import (
    attribution_params,
    charged_impressions,
    domain_columns,
    input_columns,
    ledger_entry,
    private_facts,
    public_facts,
)
from araopt.version import Api, ParameterVersion
from transforms.io import (
    InputFiles,
    attribution_columns,
    auto_shards,
    check_input,
    input_facts,
    lookback_partitions,
    release_days,
    window_of,
)
from transforms.io import check_lookback as check_lookback_input
from transforms.measure import CONTENT_SUFFIX, HELD_SUFFIX, LOOKBACK_SUFFIX, ReleaseJob, build_release

from . import options
from .inputs import LoadedParams, load_params, read_domain
from .runner import dry_run_sentence, is_local_runner, measure_job, run_pipeline, runner_name, spill_folder

SIMULATION_WARNING = ("WARNING: SIMULATION MODE (--simulation-seed): rounding and noise are seeded and reproducible; "
                      "the output is NOT differentially private and must never be published")
_NOT_FOR_ATTRIBUTION = (("epsilon", "--epsilon (each query's epsilon is in the parameters)"),
                        ("measurement_start", "--measurement-start (its budgets are per epoch: araopt.attribution)"))


def build_parser() -> argparse.ArgumentParser:
    return options.build_parser("measure")


@dataclass(frozen=True)
class MeasureConfig:
    """A checked ``measure`` command line: the version released (after an ``--override-epsilon``), its
    inputs, the domain and where it came from, and (ARA) the lookback, the ledger's history of the
    lookback's releases and the release's days."""

    loaded: LoadedParams
    version: ParameterVersion
    inputs: InputFiles
    domain: KeyDomain | None
    domain_origin: str
    epsilon_note: dict[str, Any] = field(default_factory=dict)
    lookback: InputFiles | None = None
    history: ReleaseHistory | None = None
    period: ReleasePeriod | None = None  # (ARA) its conversion times and its lookback's days, for the lifetime cap
    days: tuple[str, ...] | None = None
    days_note: str | None = None
    attribution_columns: tuple[str, ...] = ()
    attribution_history: AttributionHistory | None = None  # (a release) the ledger's releases its lookback may hold
    draw_key: DrawKey | None = None  # (a release) the ledger's draw key (araopt.attribution.draws)
    measurement_start_us: int | None = None  # (ARA) --measurement-start: recorded in the ledger entry

    @property
    def attribution(self) -> bool:
        return self.version.api == Api.ATTRIBUTION


def resolve_domain(args: argparse.Namespace, version: ParameterVersion, inputs: InputFiles
                   ) -> tuple[KeyDomain | None, str]:
    """(declared domain or None for the simulation-only data-derived one, where it came from): the
    release workflow's ``resolve_release_domain`` over --domain (a key map JSON with its layout
    checksum, or a .csv / .json list of slice values) and the parameter version's domain."""
    slices, queries, baseline, conversion_slices = domain_columns(version)
    given = None if args.domain is None else read_domain(args.domain, slices, queries, inputs, baseline,
                                                         conversion_slices)
    families = {c: type_family(inputs.schema.field(c).type) for c in slices}
    domain, origin = resolve_release_domain(given, f"--domain {args.domain}", version, families, args.simulation_seed,
                                            args.max_slices, "--max-slices", f"domain {args.domain}")
    if domain is None:
        what = "histogram layout" if version.api == Api.ATTRIBUTION else "key domain"
        print(f"WARNING: SIMULATION: the {what} is derived from the data being measured (allowed only in simulation "
              f"mode; a real release needs --domain)", file=sys.stderr)
    return domain, origin


def load_lookback(pattern: str | None, inputs: InputFiles, slices: Sequence[str], values: Sequence[str],
                  days: int | None = None) -> InputFiles | None:
    """--lookback (a path or glob) or --lookback-days (the partitions before the input's days), checked
    by ``transforms.io.check_lookback``. None without either, or when the days hold no partition (said
    on stderr)."""
    if pattern is not None and days is not None:
        raise InvalidParameters("pass --lookback or --lookback-days, not both")
    if days is not None:
        paths, what = lookback_partitions(inputs, days)
        if not paths:
            print(f"araopt measure: {what}: no partitions found, so no lookback", file=sys.stderr)
            return None
        return check_lookback_input(paths, inputs, slices, values)
    return None if pattern is None else check_lookback_input(pattern, inputs, slices, values)


def _configure(args: argparse.Namespace, loaded: LoadedParams, version: ParameterVersion,
               epsilon_note: dict[str, Any]) -> MeasureConfig:
    """The inputs, the lookback and the domain of the release of ``version`` (``loaded``'s, ARA's epsilon
    overridden as ``epsilon_note`` says)."""
    slices, values = input_columns(version)
    inputs = check_input(args.input, slices, values)
    if version.api == Api.ATTRIBUTION:
        return _configure_attribution(args, loaded, version, inputs, slices, values)
    lookback = load_lookback(args.lookback, inputs, slices, values, args.lookback_days)
    days, days_note = release_days(inputs)  # a malformed partition date is refused here, before any work
    if lookback is not None:
        partition_days(lookback.paths)
    if days_note is not None:
        print(f"araopt measure: {days_note}: the release's days are not used (no day-of-week calendar)",
              file=sys.stderr)
    domain, origin = resolve_domain(args, version, inputs)
    history = period = None
    start_us = measurement_start_us(args.measurement_start, inputs.first_time_us)
    if args.simulation_seed is None:  # a release: ARA's lifetime cap over the ledger's releases (before any work)
        ledger = Ledger.open(ledger_root(loaded.store, args.ledger), args.allow_rerelease)
        cover = None if lookback is None else LookbackCover.of_windows(
            footer.window() for footer in lookback.footers)
        period = ReleasePeriod(inputs.first_time_us, inputs.last_time_us, cover)
        ledger.check_lifetime(period)
        start_us = ledger.measurement_start(start_us)  # or an earlier release's: the same measurement
        if lookback is not None:  # the releases that cost the lookback's rows
            history = ledger.release_history(lookback.first_time_us, lookback.last_time_us, version, start_us)
    elif lookback is not None and start_us is not None:  # a simulation: its lookback's rows before the start are free
        history = ReleaseHistory.of([], start_us=start_us)
    return MeasureConfig(loaded, version, inputs, domain, origin, epsilon_note, lookback, history, period, days,
                         days_note, measurement_start_us=start_us)


def measurement_start_us(start: dt.date | None, first_time_us: int | None) -> int | None:
    """``--measurement-start`` as microseconds since the epoch (None: not declared); refused when the input
    holds a conversion from before it (a release of a day the advertiser did not measure)."""
    if start is None:
        return None
    start_us = (start - dt.date(1970, 1, 1)).days * DAY_US
    if first_time_us is not None and first_time_us < start_us:
        raise InvalidInput(f"--measurement-start {start.isoformat()}: the input holds conversions from before it; "
                           f"a release measures days from the start on")
    return start_us


def start_field(start_us: int | None) -> dict[str, int]:
    """The ledger entry's record of a declared measurement start (privacy-safe tuning reads its releases
    with it: ``optimize.private_inputs``); none when not declared."""
    return {} if start_us is None else {MEASUREMENT_START: start_us}


def _configure_attribution(args: argparse.Namespace, loaded: LoadedParams, version: ParameterVersion,
                           inputs: InputFiles, slices: Sequence[str], values: Sequence[str]) -> MeasureConfig:
    """An attribution release's inputs, lookback and layout, and (a release) the ledger's draw key and the
    earlier releases its lookback simulates again; refused before any work (one line naming
    ``--lookback-days N``) when it cannot carry the budgets of an earlier release sharing its epochs
    (``araopt.ledger.attribution``; skipped with ``--allow-rerelease``, which the commit records)."""
    present = attribution_columns(inputs)
    lookback = load_lookback(args.lookback, inputs, slices, values, args.lookback_days)
    if lookback is not None and set(attribution_columns(lookback)) != set(present):
        raise InvalidInput(f"--lookback has the attribution columns {sorted(attribution_columns(lookback))}, the input "
                           f"{sorted(present)}: a browser's rows must be read alike in both")
    domain, origin = resolve_domain(args, version, inputs)
    if args.simulation_seed is not None:  # no ledger: the lookback's rows taken as released with these parameters
        return MeasureConfig(loaded, version, inputs, domain, origin, lookback=lookback, attribution_columns=present)
    ledger = Ledger.open(ledger_root(loaded.store, args.ledger), args.allow_rerelease)
    key, history = prepare_release(
        ledger, attribution_params(version), (*slices, *values), (inputs.first_time_us, inputs.last_time_us),
        window_of(inputs.footers, IMPRESSION_TIME),
        None if lookback is None else (lookback.first_time_us, lookback.last_time_us),
        () if lookback is None else tuple(footer.window() for footer in lookback.footers))
    return MeasureConfig(loaded, version, inputs, domain, origin, lookback=lookback, attribution_columns=present,
                         attribution_history=history, draw_key=key)


def _check_attribution_options(args: argparse.Namespace, version: ParameterVersion) -> None:
    for name, flag in _NOT_FOR_ATTRIBUTION:
        if getattr(args, name, None) not in (None, False, []):
            raise InvalidParameters(f"{flag} does not apply to measure --api attribution")
    attribution_params(version)
    if args.simulation_seed is not None and args.simulation_seed < 0:
        raise InvalidParameters(f"--simulation-seed must be >= 0, got {args.simulation_seed}")


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
    version, epsilon_note = loaded.version, dict[str, Any]()
    check_debug_run(version, args.debug_run, args.simulation_seed)
    if version.api == Api.ATTRIBUTION:
        _check_attribution_options(args, version)
    else:
        version, epsilon_note = release_epsilon(version, args.epsilon, args.override_epsilon,
                                                str(loaded.source.get("path")))
    opts, pipeline = measure_job(args, beam_args)  # Beam checks its options here: before any work
    config = _configure(args, loaded, version, epsilon_note)
    folder = RunFolder.prepare(args.output, args.overwrite)  # the output first, locked for the whole run
    with failures_settled(folder, (StoreError, LedgerRefusal)):  # a ledger refusal: nothing to debug, nothing kept
        summary = _measure(args, opts, pipeline, config, folder, started)
    if summary is not None:
        if config.attribution:
            lines = attribution_summary_lines(summary, folder.target, simulation,
                                              len(attribution_params(config.version).queries), config.version)
        else:
            lines = summary_lines(summary, folder.target, simulation)
        for line in lines:
            print(line)
        if not config.attribution and summary.get("report_page", True):
            print(f"  report (operator-private): {folder.target}/{outputs.private_file(outputs.REPORT_HTML)}")
    return 0


def _measure(args: argparse.Namespace, opts: Any, pipeline: Any, config: MeasureConfig, folder: RunFolder,
             started: float) -> dict[str, Any] | None:
    """Run the target's job into ``folder``'s staging folder and commit it (recording the release in the
    ledger); None after a dry run (translated, nothing else done)."""
    simulation = args.simulation_seed is not None
    version, inputs, lookback = config.version, config.inputs, config.lookback
    ledger = None
    others: list[Ledger] = []
    if not simulation:  # simulations are not releases: nothing to protect, nothing recorded
        ledger = Ledger.open(ledger_root(config.loaded.store, args.ledger), args.allow_rerelease)
        others = other_ledgers(getattr(args, "check_ledgers", None), ledger.store.uri)
    num_shards = args.num_shards or auto_shards(inputs, lookback)
    row_ids = None if ledger is None and lookback is None else folder.path(ROW_IDS)
    with spill_folder(opts, args.shuffle) as shuffle_dir:
        build_release(pipeline, inputs, version, folder, ReleaseJob(
            config.domain, args.simulation_seed, args.debug_run, num_shards, args.max_rejected_fraction, shuffle_dir,
            args.max_slices, row_ids, lookback, is_local_runner(opts),
            config.attribution_history if config.attribution else config.history, config.days, config.draw_key,
            config.attribution_columns if config.attribution else None))
        if config.attribution:
            what = (f"the Beam job (attribution): validate, group by browser, the browsers' budgets, sum, noise once per "
                    f"histogram index ({len(inputs.paths)} file(s), {inputs.rows:,} rows"
                    + (f", {len(lookback.paths)} lookback file(s)" if lookback else "") + f", {num_shards} shards)")
        else:
            what = (f"the Beam job: validate, group by impression, encode, cap (Alg. 1), sum, noise once per key "
                    f"({len(inputs.paths)} file(s), {inputs.rows:,} rows"
                    + (f", {len(lookback.paths)} lookback file(s)" if lookback else "") + f", {num_shards} shards)")
        Progress("araopt measure", enabled=not args.no_progress)(what)
        translated = run_pipeline(pipeline, opts)
    if translated is not None:  # a dry run: no accounting, no release, nothing recorded in the ledger
        folder.abandon()
        print(dry_run_sentence("araopt measure", [translated]))
        return None
    summary = run_summary(version, take_accounting(folder), config.loaded.source, args.simulation_seed,
                          _run_facts(args, opts, config, num_shards, shuffle_dir is not None, time.time() - started))
    folder.write(outputs.private_file(outputs.PRIVATE_README), outputs.PRIVATE_README_TEXT.encode())
    private = private_facts(version, config.domain_origin)
    if not config.attribution:
        private["input"] = input_facts(inputs)
    # the released rows' identities: the workers' sorted runs merged on local disk, range by range
    with tempfile.TemporaryDirectory(prefix="araopt-row-ids-") as id_dir:
        step = None
        if row_ids is not None:
            period = merged_identities(folder, ROW_IDS, f"{id_dir}/period")
            if lookback is not None:  # before anything is recorded: refuse a lookback holding the period's own rows
                check_lookback(period, merged_identities(folder, ROW_IDS + LOOKBACK_SUFFIX, f"{id_dir}/lookback"))
            if ledger is not None:
                held = None if config.period is None else config.period.held(take_held(folder))
                extra, carried = None, frozenset[str]()
                content = None
                if config.attribution and config.domain is not None and config.draw_key is not None:
                    extra = entry_fields(config.domain, config.draw_key)
                    carried = _carried(folder, config, summary, ledger, id_dir)
                    content = merged_identities(folder, ROW_IDS + CONTENT_SUFFIX, f"{id_dir}/content").exact
                step = LedgerStep(ledger, period.exact, period.coarse,
                                  {**ledger_entry(version, config.epsilon_note, summary, extra),
                                   **start_field(config.measurement_start_us)},
                                  charged_impressions(version, summary), held, period.minute, carried, content)
                if others:
                    summary["conversions_in_other_ledgers"], warnings = released_elsewhere(others, period.exact)
                    for warning in warnings:
                        print(f"araopt measure: warning: {warning}", file=sys.stderr)
        if not config.attribution:
            _write_report(folder, summary, config, args.debug_run, simulation)
        commit_release(folder, simulation, public_facts(version), private, summary, step)
    return summary


def _carried(folder: RunFolder, config: MeasureConfig, summary: dict[str, Any], ledger: Ledger,
             directory: str) -> frozenset[str]:
    """The earlier attribution releases whose every released conversion the job's lookback held, with the
    content they released (their budgets carried: ``araopt.ledger.attribution``), from the lookback's row
    ids and content identities; the counts go to the run summary (``lookback_held``; those held with other
    content: ``lookback_content_differs``, refused unless re-releasing is allowed; those recorded before
    content identities, carried unchecked: ``lookback_content_unchecked``)."""
    history = config.attribution_history
    if history is None or config.lookback is None:
        return frozenset()
    lookback = merged_identities(folder, ROW_IDS + HELD_SUFFIX, f"{directory}/held").exact
    held = held_counts(history, lookback)
    summary["lookback_held"] = held
    if not history.releases:
        return carried_entries(history, held)
    contents = [merged_identities(folder, f"{ROW_IDS}{HELD_SUFFIX}{CONTENT_SUFFIX}_{i}",
                                  f"{directory}/held-content-{i}").exact for i in range(len(lookback_specs(history)))]
    check = content_check(ledger, history, held, contents)
    why = content_refusal(check, history, ledger.store.uri)
    if why is not None and not ledger.allow_rerelease:
        raise LedgerRefusal(why)
    if check.differ:
        summary["lookback_content_differs"] = dict(check.differ)
    if check.unchecked:
        summary["lookback_content_unchecked"] = list(check.unchecked)
        print(f"araopt measure: note: {len(check.unchecked)} earlier attribution release(s) carried by the lookback "
              f"were recorded before releases kept their rows' content ({', '.join(check.unchecked)}): their "
              f"budget state is carried from the lookback's rows as they are, unchecked", file=sys.stderr)
    return carried_entries(history, held, check.differ)


def _run_facts(args: argparse.Namespace, opts: Any, config: MeasureConfig, num_shards: int, spilled: bool,
               wall: float) -> dict[str, Any]:
    """How the run ran, for the run summary (after the parameters' facts)."""
    common = {"runner": runner_name(opts), "wall_time_s": round(wall, 3),
              "domain_kind": config.domain.origin if config.domain is not None else DATA}
    if config.attribution:
        carried = config.attribution_history
        return {"domain": config.domain_origin, "num_shards": num_shards, **common,
                "lookback_files": len(config.lookback.paths) if config.lookback else 0,
                "lookback_releases": None if carried is None else sorted(carried.rebuilt),
                "lookback_releases_excluded": None if carried is None else [list(e) for e in carried.excluded]}
    history, lookback = config.history, config.lookback
    return {"input_files": len(config.inputs.paths), **common, **config.epsilon_note, "domain": config.domain_origin,
            "num_shards": num_shards, "shuffle": "files" if spilled else "memory",
            "lookback_files": len(lookback.paths) if lookback else 0,
            "lookback_costed_with": None if history is None else history.summary(),
            "impression_times_known": bool(set(config.inputs.optional_columns) & {"impression_time"}),
            "partition_days": None if config.days is None else list(config.days),
            "partition_days_not_used": config.days_note}


def _write_report(folder: RunFolder, summary: dict[str, Any], config: MeasureConfig, debug_run: bool,
                  simulation: bool) -> None:
    """The run's report page (``report_html.write_release_report``): for reading the release, not part of
    it, so a failure to draw it never stops a release (said on stderr; the console then names no page)."""
    try:
        from araopt.evaluation.report_html import write_release_report

        history = []
        if config.loaded.store is not None:
            from araopt.io.stores import open_store
            from araopt.nightly import version_table

            history = version_table(open_store(config.loaded.store))
        write_release_report(folder, summary, config.version, summary_lines(summary, folder.target, simulation),
                             partition_days(config.inputs.paths), history, debug_run, simulation, config.loaded.store)
        summary["report_page"] = True
    except Exception as exc:  # noqa: BLE001 - said on stderr, and the console names no page
        print(f"araopt measure: WARNING: the report page was not written: {options.one_line(exc)}", file=sys.stderr)
        summary["report_page"] = False


if __name__ == "__main__":
    raise SystemExit(run())
