"""Seeded outputs of the commands whose results a refactoring must not change: optimize's parameter
file, measure's release (simulation seed) and evaluate's CSV files, each printed as the sha256 of its
normalised content. Run it on two checkouts and compare the lines:

    .venv/bin/python benchmarks/seeded_outputs.py [--keep DIR]
    (cd OTHER_CHECKOUT && PYTHONPATH=. /path/to/.venv/bin/python benchmarks/seeded_outputs.py)

Only the commands' own command lines are used (``pipelines.cli.main``), so the script runs unchanged on
any version of the code. Normalised: the fields that say when or how long (``created_at``,
``written_at``, ``recorded_at``, ``optimizer_seconds``, ``wall_seconds``) and the temporary folder's
path. measure runs with optimize's parameter file after that normalisation, so its release is a
function of the optimizer's output and the seed only.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from typing import Any

VOLATILE = {"created_at", "written_at", "recorded_at", "optimizer_seconds", "wall_seconds", "wall_time_seconds",
            "seconds"}
SLICES = "campaignId,geography,productCategory"


def normalise(value: Any, root: str) -> Any:
    if isinstance(value, dict):
        return {k: normalise(v, root) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [normalise(v, root) for v in value]
    if isinstance(value, str):
        return value.replace(root, "ROOT")
    return value


def digest(path: str, root: str) -> str:
    with open(path, "rb") as fh:
        raw = fh.read()
    if path.endswith(".json"):
        raw = json.dumps(normalise(json.loads(raw), root), sort_keys=True).encode()
    return hashlib.sha256(raw).hexdigest()[:16]


def run(argv: list[str]) -> None:
    from pipelines.cli import main

    code = main(argv)
    if code:
        raise SystemExit(f"araopt {argv[0]} failed with exit status {code}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", help="write into this folder (kept) instead of a temporary one")
    args = parser.parse_args()
    root = os.path.abspath(args.keep) if args.keep else tempfile.mkdtemp(prefix="araopt-seeded-")
    os.makedirs(root, exist_ok=True)
    os.environ["ARAOPT_LEDGER"] = os.path.join(root, "ledger")
    data = os.path.join(root, "data")
    run(["synth", "--preset", "synth-criteo", "--target-conversions", "40000", "--seed", "11", "--output", data,
         "--days", "6", "--partition-by", "conversion-date", "--attribution-window-days", "3", "--overwrite"])
    history = os.path.join(data, "train")
    dates = sorted(d for d in os.listdir(history) if d.startswith("date="))
    train_days = [os.path.join(history, d) for d in dates[:-1]]
    test_day = os.path.join(history, dates[-1])
    params = os.path.join(root, "params.json")
    run(["optimize", "--history", os.path.join(history, "date=*"), "--slices", SLICES, "--values", "value",
         "--epsilon", "8", "--output", params, "--overwrite", "--no-progress"])
    with open(params) as fh:
        fixed = normalise(json.load(fh), root)
    fixed_path = os.path.join(root, "params-fixed.json")
    with open(fixed_path, "w") as fh:
        json.dump(fixed, fh, indent=2)
    measured = os.path.join(root, "measure")
    run(["measure", "--input", test_day, "--params", fixed_path, "--output", measured, "--simulation-seed", "5",
         "--overwrite", "--no-progress", "--debug-run"])
    evaluated = os.path.join(root, "evaluate")
    run(["evaluate", "--train", train_days[-1], "--test", test_day, "--slices", SLICES, "--values", "value",
         "--epsilons", "1,8", "--output", evaluated, "--overwrite", "--no-progress", "--monte-carlo", "2"])
    files = [params]
    for folder in (os.path.join(measured, "simulation"), os.path.join(measured, "private")):
        for base, _, names in sorted(os.walk(folder)):
            files += [os.path.join(base, n) for n in sorted(names) if n not in ("run_summary.json", "run_manifest.json")]
    files += [os.path.join(evaluated, n) for n in sorted(os.listdir(evaluated)) if n.endswith(".csv")]
    print(f"seeded outputs under {root}", file=sys.stderr)
    for path in files:
        print(f"{digest(path, root)}  {os.path.relpath(path, root)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
