"""`araopt optimize`: choose C, clip thresholds and budget fractions on a conversion history
(ParameterOptimization, Alg. 5), with the paper's baselines beside them (``araopt.optimize.tune``).

Statistics (bounded, mergeable; ``araopt.optimize.statistics``) come from the Beam job of
``pipelines.history``; the optimizer runs on the driver. The parameter file records the predicted
training RMSRE_tau of the result and of the baselines, the tau rule, and the history's key domain.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import numpy as np
import pandas as pd

from araopt.errors import InvalidInput
from araopt.io.files import micros_iso
from araopt.optimize.error_model import recorded_without_signal, without_signal_note

from . import options
from .values import check_loss_factor, parse_special_days_option, parse_tau, resolve_as_of, split_columns

PROG = "araopt optimize"


def build_parser() -> argparse.ArgumentParser:
    return options.build_parser("optimize")


def result_table(rows: list[dict] | pd.DataFrame) -> str:
    frame = pd.DataFrame(rows)
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.float_format", "{:.6g}".format):
        return frame.to_string(index=False)


def run(argv: Sequence[str] | None = None) -> int:
    return options.run_command("optimize", _run, argv)


run_optimize = run


def _run(args: argparse.Namespace, beam_args: list[str]) -> int:
    from araopt.errors import check_epsilon
    from araopt.io.folders import check_output_file
    from araopt.io.progress import Progress
    from araopt.optimize.statistics import StatisticsSpec
    from araopt.optimize.workflow import AraTuning, TuneCandidates, tune_and_calibrate_run
    from transforms.io import check_input

    from .history import BeamBackend, TunedHistoryRun
    from .inputs import report_rejections
    from .private import check_mode
    from .runner import dry_run_sentence

    if args.api == "attribution":
        return _run_attribution(args)
    epsilon = check_epsilon(args.epsilon, "--epsilon")
    slices = split_columns(args.slices, "--slices")
    values = split_columns(args.values, "--values")
    tau_overrides = parse_tau(args.tau)
    special_days = parse_special_days_option(args.special_days)
    check_loss_factor(args.special_day_loss_factor)
    check_output_file(args.output, args.overwrite)  # before any work; again before the file is written
    if check_mode(args):
        return _run_private(args, epsilon, slices, values)
    period = args.release_period
    spec = StatisticsSpec(slices, values, max_count_limit=args.max_count_limit,  # validates column overlap
                          period_days=max(1, round(period)))
    inputs = check_input(args.history, slices, values)
    lookback = check_input(args.lookback, slices, values) if args.lookback else None
    dead_letter = os.path.splitext(args.output)[0] + ".rejected"
    progress = Progress(PROG, enabled=not args.no_progress)
    # the tuning workflow on the Beam backend: the job's statistics, the search once in the job (with its row
    # accounting in the provenance), the candidates calibrated on the same shards; the backtest on the driver
    mechanism = AraTuning(TuneCandidates(epsilon, {
        "encoding": args.encoding, "max_count_limit": args.max_count_limit, "objective": args.objective,
        "l1_rounding": args.l1_rounding,
        "training_window": (micros_iso(inputs.first_time_us), micros_iso(inputs.last_time_us)),
        "tau_overrides": tau_overrides, "progress": not args.no_progress, "release_period_days": period,
        "provenance": {"history": args.history, "lookback": args.lookback}}),
        period, special_days, args.special_day_loss_factor)
    backend = BeamBackend(inputs, tuple(beam_args), args.max_rejected_fraction, dead_letter=dead_letter,
                          lookback=lookback)
    progress(f"one Beam job ({len(inputs.paths)} file(s), {inputs.rows:,} rows): statistics of the history, "
             f"ParameterOptimization (Alg. 5) and the baselines for C = 1..{args.max_count_limit}, calibration of "
             f"the candidates; then their backtest: their releases replayed on the history's days (the estimator "
             f"and the predicted error)")
    if backend.dry_run:  # the job is translated, not run
        print(dry_run_sentence(PROG, [backend.translate(spec, mechanism.choose)]))
        return 0
    run, tuning = tune_and_calibrate_run(backend, spec, mechanism)
    assert isinstance(run, TunedHistoryRun)  # (BeamBackend's run: with the job's row accounting)
    report_rejections(PROG, run.counts, run.dead_letter)
    stats = run.statistics
    if not lookback:
        print(f"{PROG}: no --lookback: conversions are ranked within the history only, so impressions that "
              f"converted before it look smaller than they are (the loss to the cap is under-estimated)",
              file=sys.stderr)
    version = tuning.version
    params = version.params
    result = tuning.optimization
    rows = [{"method": f"optimized {args.encoding}", "C": result.params.count_limit,
             "thresholds": ", ".join(f"{q.clip_threshold:.4g}" for q in result.params.queries),
             "fractions": ", ".join("-" if q.budget_fraction is None else f"{q.budget_fraction:.3f}"
                                    for q in result.params.queries),
             "train RMSRE_tau": result.predicted_rmsre_tau, "ratio": 1.0}]
    for b in tuning.baselines:
        p = b.params
        rows.append({"method": b.name, "C": p.count_limit,
                     "thresholds": ", ".join(f"{qq.clip_threshold:.4g}" for qq in p.queries),
                     "fractions": (", ".join(f"{qq.budget_fraction:.3f}" for qq in p.queries)
                                   + f" (+count {p.count_budget_fraction:.3f})"),
                     "train RMSRE_tau": b.rmsre_tau, "ratio": b.rmsre_tau / result.predicted_rmsre_tau})
    check_output_file(args.output, args.overwrite)
    version.save(args.output)  # whole or absent (a temporary file renamed over it)
    print(f"{stats.num_conversions:,} conversions over {stats.history_days()} day(s), {stats.num_impressions:,} "
          f"impressions, {stats.num_slices:,} slices; epsilon {epsilon:g}, objective {args.objective}, tuned for one "
          f"release of {period:g} day(s); {tuning.tau_rule}")
    print(result_table(rows))
    best = tuning.best_baseline
    print(f"{PROG}: wrote {args.output}: C = {params.count_limit}, "
          + ", ".join(f"{q.column} clipped at {q.clip_threshold:.4g}" for q in params.queries)
          + f"; predicted RMSRE_tau of one {period:g}-day release {result.predicted_rmsre_tau:.4g}, "
            f"{best.rmsre_tau / result.predicted_rmsre_tau:.1f}x better than the best baseline ({best.name}) "
            f"[optimizer {result.seconds:.2f} s]; estimates will be "
          + ("corrected to the true totals (calibrated on the history)" if version.correction == "ratio" else
             "the capped sums with intervals for the true totals (correcting would add more noise than bias)"))
    if note := without_signal_note(recorded_without_signal(version)):
        print(f"{PROG}: {note}")
    return 0


def _run_attribution(args: argparse.Namespace) -> int:
    """``optimize --api attribution``: the history read in memory, tuned (the tuning workflow with the
    target's steps, ``optimize.attribution``: Alg. 5 for the target, the retention calibration on the same
    history), the version to ``--output``."""
    import dataclasses

    from araopt.attribution.encoder import CONVERSION_TIME_US
    from araopt.errors import check_epsilon
    from araopt.io.files import utc_now_iso
    from araopt.io.folders import check_output_file
    from araopt.optimize.attribution import AttributionBackend, AttributionSpec, AttributionTuner
    from araopt.optimize.workflow import tune_and_calibrate

    from .inputs import read_attribution_history, refuse_ara_only

    refuse_ara_only(args, PROG, ("lookback", "tau", "special_days", "private"))
    budget = check_epsilon(args.epsilon, "--epsilon")
    slices = split_columns(args.slices, "--slices")
    values = split_columns(args.values, "--values")
    check_output_file(args.output, args.overwrite)
    rows, counts = read_attribution_history(PROG, args.history, slices, values, args.max_rejected_fraction)
    tuning = tune_and_calibrate(AttributionBackend(rows, args.seed, f"{PROG}: the history"),
                                AttributionSpec(slices, values), AttributionTuner(budget, args.max_count_limit, args.seed))
    days = pd.to_datetime(rows[CONVERSION_TIME_US], unit="us", utc=True).dt.date if len(rows) else None
    version = dataclasses.replace(tuning.version, provenance=tuning.provenance(
        None if days is None else days.min().isoformat(), None if days is None else days.max().isoformat(),
        utc_now_iso(), counts, history=args.history))
    p = tuning.optimization.params
    check_output_file(args.output, args.overwrite)
    version.save(args.output)
    print(result_table(tuning.comparison))
    print(f"{PROG}: {tuning.rows:,} conversions, {tuning.domain.num_slices} histogram indices; per-site budget "
          f"{budget:g}: C = {p.count_limit(multi_epoch=True)}, epsilon per query "
          + ", ".join(f"{q.name} {q.epsilon:g}" for q in p.queries)
          + f", predicted training RMSRE_tau {tuning.optimization.rmsre_tau:.4g}; wrote {args.output} (api attribution)")
    assert version.retention is not None  # (the workflow fits it)
    print(f"{PROG}: retention (kept / true on the history) "
          + ", ".join(f"{n} {r:.3g} (spread {d:.3g})" for n, r, d in zip(version.retention.query_names,
                                                                        version.retention.ratios,
                                                                        version.retention.spreads, strict=True))
          + ": measure with this version estimates the TRUE totals (operator-private: calibrated on this history)")
    return 0


def _run_private(args: argparse.Namespace, epsilon: float, slices: tuple[str, ...], values: tuple[str, ...]) -> int:
    """--private: the parameter version from past releases (each checked against the release ledger and,
    with --store, the store's published versions), first-party conversions and the declared domain,
    under nightly's guardrails against the parameters of the last release learnt from."""
    from araopt.io.folders import check_output_file
    from araopt.ledger.ledger import ledger_root
    from araopt.ledger.verify import ReleaseVerifier
    from araopt.mechanism.exploration import default_exploration
    from araopt.nightly import Guardrails, private_problems, released_on_probe_day
    from araopt.optimize.private_inputs import describe
    from araopt.version import ParameterVersion

    from .private import load_declared_domain, read_first_party, release_folders, start_of, tune_privately

    domain = load_declared_domain(args.domain, slices, values)
    verifier = ReleaseVerifier.open(ledger_root(args.store, args.ledger), args.store)
    as_of = args.as_of
    if as_of is None:
        found = release_folders(args.releases, "0000-00-00", "9999-99-99")
        if found:
            as_of = found[-1][0]
        else:  # the cold start: the last first-party day
            days = read_first_party(args.first_party, values, domain).day
            if len(days) == 0:
                raise InvalidInput(f"--first-party {args.first_party}: no valid conversion")
            as_of = str(np.datetime64(int(days.max()), "D"))
    plan = None if args.exploration_share is None else default_exploration(share=args.exploration_share)
    tuning = tune_privately(args.releases, args.first_party, domain, values, epsilon, resolve_as_of(as_of),
                            args.window_days, args.max_count_limit, verifier, plan, start_of(args))
    version = tuning.version
    guardrails = Guardrails(bool(args.allow_large_change), args.max_threshold_change_factor, args.max_count_limit_change)
    previous = None if tuning.last_release is None else ParameterVersion(tuning.last_release)
    if previous is not None and released_on_probe_day(version, tuning.dates[-1]):
        previous = None  # the last release was the schedule's probe: moving back from it is not a move to guard
    problems = private_problems(version, previous, guardrails)
    if problems:
        raise InvalidInput(f"not written (against the parameters of the last release, {tuning.dates[-1]}): "
                        + "; ".join(problems))
    check_output_file(args.output, args.overwrite)
    version.save(args.output)  # whole or absent (a temporary file renamed over it)
    print(f"{PROG}: wrote {args.output}: {describe(tuning)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run())
