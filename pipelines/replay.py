"""`araopt replay`: what each tuning method would have released, day by day, on a joined daily log.

    araopt replay --history logs/ --slices campaignId,geography --values value --epsilon 8 --output replay/

For each replayed day, in order, every method measures the day (simulation mode: seeded rounding and
noise) with the parameters it chose from what it could see before that day, and its released
estimates are scored against the day's true totals (``araopt.evaluation.replay``). Writes
replay.csv (one row per day and method), summary.json and replay.png into OUTPUT, all
operator-private: the replay reads the raw joined log and its releases are simulations.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from araopt.io.folders import MANIFEST, FolderKind

from . import options
from .values import split_columns

PROG = "araopt replay"
REPLAY_FOLDER = FolderKind("replay folder", "a replay", (MANIFEST, "replay.csv"))
DEAD_LETTER = "dead_letter/rejected.parquet"
LABEL = ("OPERATOR-PRIVATE: a backtest on the raw joined log (simulated, seeded releases scored against exact "
         "truths); never publish")


def run(argv: Sequence[str] | None = None) -> int:
    return options.run_command("replay", _run, argv)


def _run(args: argparse.Namespace, beam_args: list[str]) -> int:
    import pyarrow.parquet as pq

    from araopt.evaluation.plots import replay_plot
    from araopt.evaluation.replay import ReplayConfig, replay, summary
    from araopt.io.folders import OutputFolder, check_target
    from araopt.io.progress import Progress
    from araopt.mechanism.exploration import default_exploration
    from araopt.mechanism.keys import DECLARED, KeyDomain
    from transforms.io import check_input

    from .inputs import load_conversions, read_domain, report_rejections

    slices = split_columns(args.slices, "--slices")
    values = split_columns(args.values, "--values")
    config = ReplayConfig(args.epsilon, window_days=args.window_days, lookback_days=args.lookback_days,
                          days=args.replay_days, exploration=default_exploration(share=args.exploration_share),
                          max_count_limit=args.max_count_limit, seed=args.seed,
                          fresh_start=args.fresh_start)
    check_target(os.path.realpath(args.output), args.overwrite, REPLAY_FOLDER)  # before any work; again at commit
    inputs = check_input(args.history, slices, values)
    progress = Progress(PROG, enabled=not args.no_progress)
    progress(f"reading the joined log ({len(inputs.paths)} file(s), {inputs.rows:,} rows) into memory")
    conversions, counts, rejected = load_conversions(inputs, slices, values, args.max_rejected_fraction,
                                                     what="history")
    if args.domain is not None:
        domain = read_domain(args.domain, slices, values, inputs)
    else:
        domain = KeyDomain.from_slice_values(slices, conversions.slices, values).with_origin(DECLARED)
        print(f"{PROG}: no --domain: the declared domain is taken to be every slice of the log "
              f"({domain.num_slices} slices; in production it is the ad server's campaign list)", file=sys.stderr)
    frame = replay(conversions, domain, config, progress=progress)
    found = summary(frame)
    with OutputFolder.prepare(args.output, args.overwrite, PROG, REPLAY_FOLDER) as folder:  # whole or not at all
        staging = Path(folder.staging)
        frame.to_csv(staging / "replay.csv", index=False)
        (staging / "summary.json").write_text(json.dumps({"label": LABEL, "epsilon": args.epsilon, **found},
                                                                indent=2))
        replay_plot(frame, staging / "replay.png", f"\u03b5 = {args.epsilon:g}")
        if rejected.num_rows:  # the rows the replay could not read, with their reasons
            (staging / "dead_letter").mkdir()
            pq.write_table(rejected, staging / DEAD_LETTER)
        folder.commit({"command": "replay", "label": LABEL, "rows_read": counts.rows_read,
                       "rows_rejected": counts.rows_rejected})
    out = Path(args.output)
    report_rejections(PROG, counts, str(out / DEAD_LETTER) if rejected.num_rows else None)
    print(f"{PROG}: {len(frame['day'].unique())} day(s) replayed -> {out / 'replay.csv'} ({LABEL})")
    for key, value in found.items():
        print(f"  {key}: {value:.4g}")
    return 0
