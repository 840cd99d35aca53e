"""Wall time, CPU time and peak RSS of the process tree of araopt's commands on a retail log, in one run.

    .venv/bin/python benchmarks/scale.py [--conversions 120000] [--commands optimize,replay,evaluate,measure]
                                         [--lookback-days 4] [--replay-days 1,3] [--epsilons 1,8] [--code OTHER_CHECKOUT]
                                         [--window-days 7,14,28] [--nightly-lookback-days 30] [--release]
                                         [--chunk-days 7] [--measure-conversions N] [--no-reference] [--figures FILE]
                                         [--params-days N] [--measure-repeats N]

The log: ``benchmarks/perf_log.py`` (string ids, 40 x 6 = 240 slices, revenue and items, weekday
cycle) over ``--days`` days, as date= partitions; evaluate trains on the 12 days before the last and
tests on the last; ``measure`` measures the last day, ``measure-lookback`` the same day with the
``--lookback-days`` days before it as its lookback, ``measure-all`` every day of the log as one release,
``nightly`` re-optimizes on the last ``--window-days`` days (once per value, each into a new store) with
its ``--nightly-lookback-days`` lookback (nightly's default, 30 days): the rows read are the window's and
the lookback's, and the CPU per million rows read is printed. ``--release``: the measure commands make real releases (secure
noise, the parameters' domain, recorded in a fresh ledger: the ledger step included) instead of seeded
simulations. ``--chunk-days``: the log is generated that many days at a time (impressions do not span
two chunks), so long logs need not fit in the generator's memory. Every command is a separate process
(``python -m pipelines.cli ...``): CPU is its user + system time and that of its children
(``os.wait4``), peak RSS the largest sum of VmRSS over the process and its descendants, sampled every
0.1 s from /proc (Linux). ``replay`` runs once per ``--replay-days`` value: the CPU per replayed day is
the difference of the CPU times over the difference of the days (start-up, reading and the plot
cancel). ``measure`` is followed by ``benchmarks/reference_measure.py`` (plain numpy/pyarrow: shard ->
sort -> encode -> Alg. 1 -> bincount, no validation, ledger or outputs) on the same day and parameter
file, and the ratio of their CPU times; ``--measure-conversions N`` measures a one-day log of about N
conversions instead of the last day (``--no-reference``: without the reference, for memory runs;
``--measure-repeats N``: N alternating pairs, the ratio their median: on a shared machine one pair's
ratio moves with the load between its two runs).
``--params-days N``: optimize on the last N days only (a big log's parameters in seconds).
``--code``: run the commands of another checkout (its folder first on PYTHONPATH), for before/after
figures on the same log and machine. ``--figures FILE``: also write the run's figures as the Markdown
tables ``docs/performance.md`` includes (``benchmarks/figures.py``: edit the script, not the file).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from perf_log import DAY_US, SLICES, START_US, VALUES, day_of, generate

_PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


def _tree_rss_kb(root: int) -> int:
    """Sum of the resident set sizes of ``root`` and its descendants (from /proc)."""
    parents: dict[int, int] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/statm") as fh:
                rss[int(entry)] = int(fh.read().split()[1]) * _PAGE_KB
        except (OSError, IndexError, ValueError):
            continue
        parents[int(entry)] = int(fields[1])
    tree, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid and child not in tree:
                tree.add(child)
                frontier.append(child)
    return sum(rss.get(pid, 0) for pid in tree)


def run(argv: list[str], env: dict[str, str], log: Path) -> dict[str, float]:
    """Run one command; its wall and CPU seconds and peak tree RSS (MiB); stderr kept in ``log``."""
    start = time.perf_counter()
    with open(log, "w") as err:
        # started in the log's folder: ``python -m`` puts its working folder first on sys.path, ahead of
        # PYTHONPATH, so started from a checkout it would run that checkout's code whatever ``--code`` says
        proc = subprocess.Popen(argv, stdout=err, stderr=subprocess.STDOUT, env=env, cwd=log.parent)
        peak = [0]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], _tree_rss_kb(proc.pid))
                done.wait(0.1)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        done.set()
        sampler.join()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({os.waitstatus_to_exitcode(status)}); see {log}")
    return {"wall": time.perf_counter() - start, "cpu": usage.ru_utime + usage.ru_stime,
            "rss_mib": peak[0] / 1024}


def write_log(root: Path, conversions: int, days: int, seed: int, train_days: int, chunk_days: int = 0) -> int:
    chunk = chunk_days if 0 < chunk_days < days else days
    rows, train, test = 0, [], []
    last = days - 1
    for first in range(0, days, chunk):
        span = min(chunk, days - first)
        table = generate(round(conversions * span / days), span, seed + first)
        if first:  # a later chunk: its own impressions, its days shifted
            ids = pa.compute.replace_substring(table.column("impression_id"), "imp-", f"imp{first}-")
            shifted = pa.compute.add(table.column("conversion_time").cast(pa.int64()), first * DAY_US * 1000)
            table = table.set_column(0, "impression_id", ids).set_column(
                1, "conversion_time", shifted.cast(pa.timestamp("ns", tz="UTC")))
        day = day_of(table)
        for d in range(first, first + span):
            part = root / "log" / f"date={np.datetime64(START_US + d * DAY_US, 'us').astype('datetime64[D]')}"
            part.mkdir(parents=True, exist_ok=True)
            pq.write_table(table.filter(pa.array(day == d)), part / "part-0.parquet")
        train.append(table.filter(pa.array((day >= last - train_days) & (day < last))))
        test.append(table.filter(pa.array(day == last)))
        rows += table.num_rows
        del table, day
    pq.write_table(pa.concat_tables(train), root / "train.parquet")
    pq.write_table(pa.concat_tables(test), root / "test.parquet")
    return rows


def write_scale_figures(path: str, rows: int, days: int, results: list[tuple[str, dict[str, float]]],
                        derived: list[tuple[str, str]], load_before: tuple[float, ...], load_after: tuple[float, ...]
                        ) -> None:
    """The run's figures as the Markdown tables ``docs/performance.md`` includes (``benchmarks/figures.py``)."""
    from figures import markdown_table, write_figure

    runs = [(name + (f" ({int(f['rows']):,} rows)" if "rows" in f else ""), f"{f['cpu']:.1f} s", f"{f['rss_mib']:,.0f} MiB",
             f"{f['wall']:.1f} s") for name, f in results]
    body = (f"Log: {rows:,} conversions over {days} days (`benchmarks/perf_log.py`); load average "
            f"{load_before[0]:.1f} at the start, {load_after[0]:.1f} at the end (2 cores, shared: compare CPU "
            f"times, paired within the run).\n\n"
            + markdown_table(["command (a separate process)", "CPU", "peak RSS (process tree)", "wall"], runs))
    if derived:
        body += "\n\n" + markdown_table(["from the runs above", "figure"], derived)
    write_figure(path, body)


def rows_between(log: Path, after: np.datetime64, upto: np.datetime64) -> int:
    """Rows of the date= partitions of ``log`` in (after, upto] (from the Parquet footers)."""
    return sum(pq.ParquetFile(p).metadata.num_rows for p in log.glob("date=*/*.parquet")
               if after < np.datetime64(p.parent.name[5:]) <= upto)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--conversions", type=int, default=120_000)
    ap.add_argument("--days", type=int, default=35)
    ap.add_argument("--train-days", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--commands", default="optimize,replay,evaluate,measure")
    ap.add_argument("--lookback-days", type=int, default=4, help="measure-lookback's lookback (days before the last)")
    ap.add_argument("--replay-days", default="1,3", help="replay runs (comma-separated day counts)")
    ap.add_argument("--epsilons", default="1,8", help="evaluate's epsilons")
    ap.add_argument("--epsilon", default="8", help="optimize's, measure's and replay's epsilon")
    ap.add_argument("--measure-conversions", type=int, default=0,
                    help="measure (and the reference) a one-day log of about this many conversions instead of the "
                         "last day of the log")
    ap.add_argument("--code", default=None, help="another checkout whose commands to run")
    ap.add_argument("--window-days", default="7", help="nightly's windows (comma-separated day counts)")
    ap.add_argument("--nightly-lookback-days", type=int, default=30,
                    help="nightly's --lookback-days (its default, 30): the rows read are the window's and these days'")
    ap.add_argument("--release", action="store_true",
                    help="measure commands make real releases recorded in a fresh ledger (not seeded simulations)")
    ap.add_argument("--chunk-days", type=int, default=0, help="generate the log this many days at a time")
    ap.add_argument("--params", default=None, help="the measure commands' parameter file (default: optimize's)")
    ap.add_argument("--params-days", type=int, default=0,
                    help="optimize (the measure commands' parameters) on the last N days of the log only (0: all)")
    ap.add_argument("--reuse-log", action="store_true", help="with --workdir: keep the log already written there")
    ap.add_argument("--workdir", default=None, help="keep the log and outputs here (default: a temporary folder)")
    ap.add_argument("--measure-repeats", type=int, default=1,
                    help="measure and the reference this many times, alternating (the ratio: the median of the pairs)")
    ap.add_argument("--no-reference", dest="reference", action="store_false",
                    help="measure without the numpy reference after it (memory runs)")
    ap.add_argument("--figures", default=None, help="also write the figures as Markdown tables to this file")
    args = ap.parse_args()
    commands = [c for c in args.commands.split(",") if c]
    env = dict(os.environ)
    code = os.path.abspath(args.code or os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = code + os.pathsep + env.get("PYTHONPATH", "")
    with tempfile.TemporaryDirectory(prefix="araopt-scale-") as tmp:
        root = Path(args.workdir or tmp).resolve()
        root.mkdir(parents=True, exist_ok=True)
        if args.reuse_log and (root / "log").is_dir():
            rows = sum(pq.ParquetFile(p).metadata.num_rows for p in (root / "log").glob("date=*/*.parquet"))
        else:
            rows = write_log(root, args.conversions, args.days, args.seed, args.train_days, args.chunk_days)
        print(f"log: {rows:,} conversions over {args.days} days, 240 slices, values {VALUES}; code: {code}")
        base = [sys.executable, "-m", "pipelines.cli"]
        cols = ["--slices", SLICES, "--values", VALUES]
        results: list[tuple[str, dict[str, float]]] = []
        derived: list[tuple[str, str]] = []  # (what, figure) computed from the runs
        load_before = os.getloadavg()

        def timed(name: str, argv: list[str], base: list[str] = base) -> dict[str, float]:
            figures = run(base + argv, env, root / f"{name}.log")
            results.append((name, figures))
            print(f"{name:<24} wall {figures['wall']:8.1f} s   cpu {figures['cpu']:8.1f} s   "
                  f"peak rss {figures['rss_mib']:7.0f} MiB", flush=True)
            return figures

        measuring = [c for c in commands if c.startswith("measure")]
        def release_mode(name: str) -> list[str]:
            """A seeded simulation, or (--release) a real release into a fresh ledger of its own."""
            if not args.release:
                return ["--simulation-seed", "1"]
            return ["--ledger", str(root / f"ledger-{name}")]

        if args.params:  # the parameters given: no optimize run
            (root / "params.json").write_bytes(Path(args.params).read_bytes())
        if "optimize" in commands or (measuring and not args.params):
            history = root / "log"
            if args.params_days:  # the last N days only: links to their partitions in a folder of their own
                history = root / f"log-last-{args.params_days}"
                shutil.rmtree(history, ignore_errors=True)
                for part in sorted((root / "log").glob("date=*"))[-args.params_days:]:
                    (history / part.name).mkdir(parents=True)
                    for file in part.glob("*.parquet"):
                        (history / part.name / file.name).symlink_to(file)
            timed("optimize", ["optimize", "--history", str(history), *cols, "--epsilon", args.epsilon,
                               "--output", str(root / "params.json"), "--overwrite", "--no-progress"])
        if "measure" in commands:
            last = np.datetime64(START_US + (args.days - 1) * DAY_US, "us").astype("datetime64[D]")
            day = root / "log" / f"date={last}"
            if args.measure_conversions:
                day = root / "measure_day"
                day.mkdir(exist_ok=True)
                if not (args.reuse_log and (day / "part-0.parquet").exists()):
                    table = generate(args.measure_conversions, 1, args.seed + 1, warmup=0, mean_delay_days=0.05)
                    pq.write_table(table, day / "part-0.parquet")
                    del table
                print(f"measure's log: {pq.ParquetFile(day / 'part-0.parquet').metadata.num_rows:,} conversions in one "
                      f"day", flush=True)
            measure_rows = sum(pq.ParquetFile(p).metadata.num_rows for p in day.glob("*.parquet"))
            ratios = []
            for repeat in range(args.measure_repeats):  # measure and the reference alternate: pairs of one load
                label = "" if args.measure_repeats == 1 else f" #{repeat + 1}"
                measured = timed(f"measure{label}", ["measure", "--input", str(day), "--params",
                                                     str(root / "params.json"), "--output", str(root / "run"),
                                                     *release_mode("measure"), "--overwrite", "--no-progress"])
                measured["rows"] = measure_rows
                if not args.reference:
                    continue
                # the plain numpy/pyarrow floor: shard -> sort -> encode -> Alg. 1 -> bincount (this checkout's script)
                reference = timed(f"reference (numpy){label}", [
                    os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference_measure.py"), str(day),
                    str(root / "params.json")], base=[sys.executable])
                ratios.append(measured["cpu"] / reference["cpu"])
                print(f"measure / reference cpu{label}: {ratios[-1]:.2f}", flush=True)
            if ratios:
                what = ("measure / reference CPU" if len(ratios) == 1 else
                        f"measure / reference CPU (median of {len(ratios)} pairs: "
                        + ", ".join(f"{r:.2f}" for r in ratios) + ")")
                derived.append((what, f"{float(np.median(ratios)):.2f}"))
        if "measure-all" in commands:
            every = rows_between(root / "log", np.datetime64("1970-01-01"), np.datetime64("9999-12-31"))
            timed("measure all days", ["measure", "--input", str(root / "log"), "--params", str(root / "params.json"),
                                       "--output", str(root / "run-all"), *release_mode("all"), "--overwrite",
                                       "--no-progress"])["rows"] = every
        if "measure-lookback" in commands:
            last = np.datetime64(START_US + (args.days - 1) * DAY_US, "us").astype("datetime64[D]")
            read = rows_between(root / "log", last - np.timedelta64(args.lookback_days + 1, "D"), last)
            timed(f"measure lookback {args.lookback_days}d",
                  ["measure", "--input", str(root / "log" / f"date={last}"), "--lookback-days", str(args.lookback_days),
                   "--params", str(root / "params.json"), "--output", str(root / "run-lookback"),
                   *release_mode("lookback"), "--overwrite", "--no-progress"])["rows"] = read
        if "nightly" in commands:
            last = np.datetime64(START_US + (args.days - 1) * DAY_US, "us").astype("datetime64[D]")
            for window in [int(x) for x in args.window_days.split(",")]:
                # nightly reads its window and the --lookback-days partitions before it (30 by default)
                window_rows = rows_between(root / "log", last - np.timedelta64(window, "D"), last)
                lookback_rows = rows_between(root / "log", last - np.timedelta64(window + args.nightly_lookback_days, "D"),
                                             last - np.timedelta64(window, "D"))
                figures = timed(f"nightly {window}d", [
                    "nightly", "--history", str(root / "log"), "--as-of", str(last), "--window-days", str(window),
                    "--lookback-days", str(args.nightly_lookback_days), "--store", str(root / f"store-{window}"), *cols,
                    "--epsilon", args.epsilon, "--no-progress"])
                read = window_rows + lookback_rows
                figures["rows_read"] = read
                print(f"nightly {window}d: {read:,} rows read ({window_rows:,} in the window, {lookback_rows:,} in its "
                      f"{args.nightly_lookback_days}-day lookback), cpu {figures['cpu'] / read * 1e6:.2f} s per million "
                      f"rows read", flush=True)
                derived.append((f"nightly {window}d: CPU per million rows read ({read:,}: {window_rows:,} in the window, "
                                f"{lookback_rows:,} in the {args.nightly_lookback_days}-day lookback)",
                                f"{figures['cpu'] / read * 1e6:.2f} s"))
        if "evaluate" in commands:
            timed(f"evaluate eps {args.epsilons}", ["evaluate", "--train", str(root / "train.parquet"), "--test",
                                                    str(root / "test.parquet"), *cols, "--epsilons", args.epsilons,
                                                    "--output", str(root / "evaluation"), "--overwrite"])
        if "replay" in commands:
            spans = [int(x) for x in args.replay_days.split(",")]
            cpu = {}
            for n in spans:
                cpu[n] = timed(f"replay {n} day(s)", ["replay", "--history", str(root / "log"), *cols, "--epsilon",
                                                      args.epsilon, "--replay-days", str(n), "--output",
                                                      str(root / f"replay{n}"), "--overwrite"])["cpu"]
            if len(spans) >= 2:
                lo, hi = min(spans), max(spans)
                print(f"replay cpu per replayed day: {(cpu[hi] - cpu[lo]) / (hi - lo):.1f} s "
                      f"(days {lo} -> {hi})")
                derived.append((f"replay CPU per replayed day (days {lo} -> {hi})",
                                f"{(cpu[hi] - cpu[lo]) / (hi - lo):.1f} s"))
        if args.figures:
            write_scale_figures(args.figures, rows, args.days, results, derived, load_before, os.getloadavg())
            print(f"wrote {args.figures}")


if __name__ == "__main__":
    main()
