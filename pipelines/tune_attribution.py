"""`optimize`, `nightly` and `evaluate` with ``--api attribution``: ParameterOptimization (Alg. 5) for
W3C Attribution Level 1 (``araopt.optimize.attribution``) and its comparison with the baselines
(``araopt.evaluation.attribution``); see docs/attribution.md.

In memory: the error model simulates the browsers over the log's rows (``--epsilon`` is the per-site
epoch budget). The parameter version written or published has ``api: attribution`` and carries the
``AttributionParams`` (``ParameterVersion.for_attribution``), with the history's histogram layout as
its domain, and the retention calibration of those parameters fitted on the same history, so that
``measure`` publishes estimates of the true totals.
"""
from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from araopt.errors import InvalidParameters, Unsupported

from .values import split_columns

if TYPE_CHECKING:
    from araopt.mechanism.keys import KeyDomain
    from araopt.optimize.attribution import AttributionOptimization, AttributionProblem
    from araopt.version import ParameterVersion


def refuse_ara_only(args: argparse.Namespace, prog: str, names: Sequence[str]) -> None:
    """One line for an ARA-only option given with ``--api attribution``."""
    for name in names:
        value = getattr(args, name, None)
        if value not in (None, False, [], ()):
            raise Unsupported(f"{prog}: --{name.replace('_', '-')} is not supported with --api attribution")


def history_domain(rows: pd.DataFrame, slices: Sequence[str], values: Sequence[str]) -> KeyDomain:
    """The histogram layout of the history's impression-side slices (as ARA's optimize takes the
    history's key domain)."""
    from araopt.attribution.params import COUNT
    from araopt.mechanism.keys import KeyDomain

    return KeyDomain.from_slice_values(tuple(slices), {c: rows[c].to_numpy() for c in slices}, (COUNT, *values))


def tune(prog: str, pattern: str | list[str], slices: Sequence[str], values: Sequence[str], budget: float,
         max_count_limit: int, seed: int) -> tuple[AttributionOptimization, AttributionProblem, pd.DataFrame,
                                                   KeyDomain, ParameterVersion]:
    """Read the history, optimize, fit the retention calibration of the chosen parameters on the same
    history (``attribution.calibrate``: estimates of the true totals) and build the parameter version
    (api attribution) that carries both."""
    from araopt.attribution.calibrate import retention
    from araopt.optimize.attribution import AttributionProblem, optimize_attribution
    from araopt.version import ParameterVersion

    from .attribution import read_log
    from .inputs import report_rejections

    rows, counts, _ = read_log(pattern, slices, values)  # type: ignore[arg-type]
    report_rejections(prog, counts)
    if not len(rows):
        raise InvalidParameters(f"{prog}: the history has no valid rows")
    domain = history_domain(rows, slices, values)
    problem = AttributionProblem(budget, tuple(values), tuple(slices), max_count_limit=max_count_limit)
    result = optimize_attribution(problem, rows, domain, simulation_seed=seed)
    fitted = retention(result.params, rows, domain, seed)
    return result, problem, rows, domain, ParameterVersion.for_attribution(result.params, domain=domain,
                                                                           retention=fitted)


def comparison(result: AttributionOptimization, problem: AttributionProblem, rows: pd.DataFrame,
               domain: KeyDomain) -> pd.DataFrame:
    """The chosen parameters and the baselines on the history (predicted RMSRE_tau, ratio to optimized)."""
    from araopt.optimize.attribution import BASELINES, baseline_params, predicted_rmsre_tau

    out = [("optimized", result.params, result.rmsre_tau)]
    for name in BASELINES:
        p = baseline_params(name, problem, rows)
        out.append((name, p, predicted_rmsre_tau(p, rows, domain, np.array(result.taus))))
    return pd.DataFrame([{"method": name, "C": p.count_limit(multi_epoch=True),
                          "epsilons": ", ".join(f"{q.epsilon:.4g}" for q in p.queries),
                          "max_values": ", ".join(str(q.max_value) for q in p.queries),
                          "clips": ", ".join(f"{q.clip:.4g}" for q in p.queries), "lookback_days": p.lookback_days,
                          "train RMSRE_tau": value, "ratio": value / result.rmsre_tau} for name, p, value in out])


def run_optimize(args: argparse.Namespace, prog: str) -> int:
    """``araopt optimize --api attribution``: the version to ``--output``."""
    from araopt.errors import check_epsilon
    from araopt.io.folders import check_output_file

    refuse_ara_only(args, prog, ("lookback", "tau", "special_days", "private"))
    budget = check_epsilon(args.epsilon, "--epsilon")
    slices = split_columns(args.slices, "--slices")
    values = split_columns(args.values, "--values")
    check_output_file(args.output, args.overwrite)
    result, problem, rows, domain, version = tune(prog, args.history, slices, values, budget, args.max_count_limit,
                                                  args.seed)
    check_output_file(args.output, args.overwrite)
    version.save(args.output)
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.float_format", "{:.6g}".format):
        print(comparison(result, problem, rows, domain).to_string(index=False))
    p = result.params
    print(f"{prog}: {len(rows):,} conversions, {domain.num_slices} histogram indices; per-site budget {budget:g}: "
          f"C = {p.count_limit(multi_epoch=True)}, epsilon per query "
          + ", ".join(f"{q.name} {q.epsilon:g}" for q in p.queries)
          + f", predicted training RMSRE_tau {result.rmsre_tau:.4g}; wrote {args.output} (api attribution)")
    assert version.retention is not None  # (tune fits it)
    print(f"{prog}: retention (kept / true on the history) "
          + ", ".join(f"{n} {r:.3g} (spread {d:.3g})" for n, r, d in zip(version.retention.query_names,
                                                                        version.retention.ratios,
                                                                        version.retention.spreads, strict=True))
          + ": measure with this version publishes estimates of the TRUE totals")
    return 0


def run_nightly(args: argparse.Namespace, prog: str, as_of: str, files: list[str], dates: Sequence[str],
                write_report: Callable[..., None]) -> int:
    """``araopt nightly --api attribution``: optimize on the window's ``files`` (``nightly.select_window``),
    fit the retention calibration on them, apply ARA's guardrails (``nightly.Guardrails``: beat the best
    baseline on the window; bounded moves of C and C_l within a series; a re-run of the same as-of date
    publishes nothing) and publish the version to the store (a compare-and-swap of ``latest``); the run
    report (``nightly.run_report``'s schema, with the retention ratios) goes to ``STORE/reports/`` through
    ``write_report(directory, report, None, store)`` (``pipelines.nightly``'s, passed in: commands do not
    import each other)."""
    import dataclasses
    import datetime as dt
    import uuid

    from apache_beam.io.filesystems import FileSystems

    from araopt.errors import InvalidInput, check_epsilon
    from araopt.io.stores import open_store
    from araopt.nightly import Guardrails, new_series, publish_version, run_report, same_release
    from araopt.version import ParameterVersion, Provenance

    refuse_ara_only(args, prog, ("private", "tau", "special_days"))
    budget = check_epsilon(args.epsilon, "--epsilon")
    slices = split_columns(args.slices, "--slices")
    values = split_columns(args.values, "--values")
    store = open_store(args.store)
    pointer = store.read_latest_pointer()
    previous = ParameterVersion.from_bytes(store.resolve("latest").payload, "previous latest") if pointer else None
    expected = pointer.version if pointer else None
    result, problem, rows, domain, version = tune(prog, files, slices, values, budget, args.max_count_limit,
                                                  args.seed)
    run_id = args.run_id or uuid.uuid4().hex[:8]
    window_start = (dt.date.fromisoformat(as_of) - dt.timedelta(days=args.window_days - 1)).isoformat()
    table = comparison(result, problem, rows, domain)
    baselines = {str(r["method"]): float(r["train RMSRE_tau"]) for _, r in table.iterrows() if r["method"] != "optimized"}
    version = dataclasses.replace(version, provenance=Provenance(
        training_start=window_start, training_end=as_of, rows=len(rows),
        created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        predicted_rmsre_tau=result.rmsre_tau, baseline_rmsre_tau=min(baselines.values()), objective="rmsre_tau",
        extra={"as_of": as_of, "run_id": run_id, "api": "attribution", "taus": list(result.taus),
               "baselines": {k: {"rmsre_tau": v} for k, v in baselines.items()}}))
    idempotent = previous is not None and same_release(previous, version, as_of)
    guardrails = Guardrails(bool(args.allow_large_change), args.max_threshold_change_factor, args.max_count_limit_change)
    problems = [] if idempotent else guardrails.check(version, result.rmsre_tau, baselines, previous)
    series = "" if previous is None or idempotent else new_series(previous, version)
    assert version.retention is not None  # (tune fits it)
    report = run_report("joined history", as_of, run_id, budget, version, result.rmsre_tau, baselines, expected,
                        problems, idempotent, series, api="attribution", window=[window_start, as_of],
                        history_dates=list(dates), rows_read=len(rows), taus=list(result.taus),
                        retention=version.retention.to_json(),
                        per_count_limit=result.table().to_dict(orient="records"))
    report_dir = FileSystems.join(args.store, "reports", f"{as_of}-{run_id}")
    if idempotent:
        report.update(version=expected)
    elif not problems:
        publish_version(store, version, report, as_of, run_id, expected)
    write_report(report_dir, report, None, store)
    if problems:
        raise InvalidInput("not published: " + "; ".join(problems) + f" (report: {report_dir})")
    status = (f"already published as {expected} (idempotent re-run)" if idempotent
              else f"published {report['version']} to {args.store}")
    print(f"{prog}: api attribution, {len(rows):,} conversions in {len(dates)} day(s): C = "
          f"{result.params.count_limit(multi_epoch=True)}, predicted RMSRE_tau {result.rmsre_tau:.4g} vs best "
          f"baseline {min(baselines.values()):.4g}; retention "
          + ", ".join(f"{n} {r:.3g}" for n, r in zip(version.retention.query_names, version.retention.ratios,
                                                   strict=True))
          + f"; {status}; report {report_dir}/report.json")
    if series:
        print(f"  a new series of versions: {series}")
    return 0


def run_evaluate(args: argparse.Namespace, prog: str, budgets: Sequence[float]) -> int:
    """``araopt evaluate --api attribution``: per dataset and per-site budget, the optimized parameters
    (tuned on train) against the baselines on test; writes ``attribution.csv``."""
    from araopt.evaluation.attribution import evaluate_attribution, evaluation_table
    from araopt.io.folders import EVALUATION_FOLDER, OutputFolder, check_target

    from .attribution import read_log
    from .inputs import report_rejections

    refuse_ara_only(args, prog, ("lookback", "tau"))
    if len(args.train) != len(args.test):
        raise InvalidParameters(f"give one --test per --train ({len(args.train)} vs {len(args.test)})")
    names = args.name or [f"dataset{i + 1}" for i in range(len(args.train))]
    if len(names) != len(args.train):
        raise InvalidParameters(f"give one --name per --train ({len(names)} vs {len(args.train)})")
    slices = split_columns(args.slices, "--slices")
    values = split_columns(args.values, "--values")
    check_target(args.output, args.overwrite, EVALUATION_FOLDER)
    tables = []
    with OutputFolder.prepare(args.output, args.overwrite, prog, EVALUATION_FOLDER) as folder:
        for name, train_path, test_path in zip(names, args.train, args.test, strict=True):
            train, counts, _ = read_log(train_path, slices, values)
            report_rejections(f"{prog} ({name}, training log)", counts)
            test, counts, _ = read_log(test_path, slices, values)
            report_rejections(f"{prog} ({name}, test log)", counts)
            domain = history_domain(pd.concat([train[list(slices)], test[list(slices)]]), slices, values)
            evaluations = evaluate_attribution(train, test, domain, values, slices, budgets, runs=args.monte_carlo,
                                               seed=args.seed)
            table = evaluation_table(evaluations)
            table.insert(0, "dataset", name)
            tables.append(table)
        results = pd.concat(tables, ignore_index=True)
        results.to_csv(os.path.join(folder.staging, "attribution.csv"), index=False)
        folder.commit({"command": "evaluate", "api": "attribution", "datasets": list(names),
                       "budgets": list(budgets)})
    with pd.option_context("display.width", 250, "display.max_columns", 20, "display.float_format", "{:.4g}".format):
        print(results.to_string(index=False))
    opt = results[results["method"] == "optimized"]
    print(f"{prog}: api attribution, {len(opt)} (dataset, budget) cells: optimized / best baseline "
          f"max {opt['ratio_to_best_baseline'].max():.4g}, tuned-on-train / tuned-on-test max "
          f"{opt['tuned_train/test'].max():.4g}"
          + (f", coverage of the intervals of the true totals min {opt['coverage'].min():.4g}" if args.monte_carlo else "")
          + f"; wrote attribution.csv to {args.output}")
    return 0
