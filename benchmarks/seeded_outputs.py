"""Seeded outputs of the commands whose results a refactoring must not change: optimize's parameter
file, measure's release (simulation seed), evaluate's CSV files, nightly's published version and report
(a local store, a fixed run id), replay's CSV and summary and the demo's nightly version and report (its
measure step uses secure noise, as in production), and the same commands with ``--api attribution`` (the
W3C Attribution target: optimize's version, measure's simulated release, nightly's published version and
report, evaluate's table), each printed as the sha256 of its normalised content. Run it on two checkouts
and compare the lines:

    .venv/bin/python benchmarks/seeded_outputs.py --keep /tmp/after
    (cd OTHER_CHECKOUT && PYTHONPATH=. /path/to/.venv/bin/python benchmarks/seeded_outputs.py --keep /tmp/before)
    .venv/bin/python benchmarks/seeded_outputs.py --compare /tmp/before /tmp/after

Only the commands' own command lines are used (``pipelines.cli.main``), so the script runs unchanged on
any version of the code. Normalised: the fields that say when or how long (``created_at``,
``written_at``, ``sealed_at``, ``recorded_at``, ``optimizer_seconds``, ``wall_seconds``, a run summary's ``wall_time_s``
and ``ledger_entry`` id) and the temporary folder's path. measure runs with optimize's parameter file
after that normalisation, so its release is a function of the optimizer's output and the seed only.

The jobs are not bit-reproducible even on one checkout: Beam merges the float sums of the statistics
and calibration combiners in a runner-dependent order (last-digit differences), and Avro files carry
a random sync marker. ``--compare`` therefore says per file whether the bytes are equal, and else the
largest relative difference of any number (Avro: whether the records are equal) and any other text
that differs.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from typing import Any

VOLATILE = {"created_at", "written_at", "sealed_at", "recorded_at", "optimizer_seconds", "wall_seconds",
            "wall_time_seconds", "seconds", "wall_time_s", "ledger_entry"}
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


def _walk(a: Any, b: Any, where: str, out: dict[str, Any]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out["other"].append(f"{where}.{k} only in one")
            else:
                _walk(a[k], b[k], f"{where}.{k}", out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _walk(x, y, f"{where}[{i}]", out)
    elif isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        rel = abs(a - b) / max(abs(a), abs(b), 1e-300) if a != b else 0.0
        out["max_rel"] = max(out["max_rel"], rel)
    elif a != b:
        out["other"].append(f"{where}: {str(a)[:60]!r} != {str(b)[:60]!r}")


def compare(before: str, after: str) -> int:
    """Per output file: identical bytes, or the largest relative difference of its numbers and the rest."""
    import fastavro
    import pandas as pd

    for rel in sorted(files_of(before)):
        a, b = os.path.join(before, rel), os.path.join(after, rel)
        if not os.path.exists(b):
            print(f"{rel}: missing after")
            continue
        with open(a, "rb") as fa, open(b, "rb") as fb:
            if fa.read() == fb.read():
                print(f"{rel}: identical bytes")
                continue
        out: dict[str, Any] = {"max_rel": 0.0, "other": []}
        if rel.endswith(".json"):
            with open(a) as fa, open(b) as fb:
                _walk(normalise(json.load(fa), before), normalise(json.load(fb), after), "", out)
        elif rel.endswith(".avro"):
            with open(a, "rb") as fa, open(b, "rb") as fb:
                same = list(fastavro.reader(fa)) == list(fastavro.reader(fb))
            print(f"{rel}: bytes differ (Avro sync marker), records {'equal' if same else 'DIFFER'}")
            continue
        elif not rel.endswith((".csv", ".parquet")):  # a page, a picture: bytes only
            print(f"{rel}: bytes differ")
            continue
        else:
            fa_ = pd.read_csv(a) if rel.endswith(".csv") else pd.read_parquet(a)
            fb_ = pd.read_csv(b) if rel.endswith(".csv") else pd.read_parquet(b)
            _walk(fa_.to_dict("list"), fb_.to_dict("list"), "", out)
        other = "; ".join(out["other"][:4]) + (f" (+{len(out['other']) - 4})" if len(out["other"]) > 4 else "")
        print(f"{rel}: max relative difference of numbers {out['max_rel']:.1e}" + (f"; differs: {other}" if other else ""))
    return 0


def files_of(root: str) -> list[str]:
    out = ["params.json"]
    if os.path.exists(os.path.join(root, "attribution")):  # (kept folders from before the attribution steps)
        out += ["attribution/params.json", os.path.join("attribution", "evaluate", "attribution.csv")]
    for folder in ("measure/simulation", "measure/private", "attribution/measure/simulation",
                   "attribution/measure/private"):
        for base, _, names in sorted(os.walk(os.path.join(root, folder))):
            out += [os.path.relpath(os.path.join(base, n), root) for n in sorted(names)
                    if n != "run_manifest.json"]
    out += [os.path.join("evaluate", n) for n in sorted(os.listdir(os.path.join(root, "evaluate"))) if n.endswith(".csv")]
    out += [p for p in ["demo/measure/private/run_summary.json"] if os.path.exists(os.path.join(root, p))]
    for folder, names in (("store", ("params.json", "report.json")), ("replay", ("replay.csv", "summary.json")),
                          ("demo/store", ("params.json", "report.json")),
                          ("attribution/store", ("params.json", "report.json"))):
        for base, _, found in sorted(os.walk(os.path.join(root, folder))):
            out += [os.path.relpath(os.path.join(base, n), root) for n in sorted(found) if n in names]
    return out


def run(argv: list[str]) -> None:
    from pipelines.cli import main

    code = main(argv)
    if code:
        raise SystemExit(f"araopt {argv[0]} failed with exit status {code}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", help="write into this folder (kept) instead of a temporary one")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="compare two kept folders")
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
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
    run(["nightly", "--history", history, "--as-of", dates[-1].split("=", 1)[1], "--window-days", "3", "--store",
         os.path.join(root, "store"), "--slices", SLICES, "--values", "value", "--epsilon", "8", "--run-id", "seeded",
         "--no-progress"])
    run(["replay", "--history", history, "--slices", SLICES, "--values", "value", "--epsilon", "8", "--output",
         os.path.join(root, "replay"), "--window-days", "3", "--replay-days", "2"])
    run(["demo", "--output", os.path.join(root, "demo"), "--conversions-per-day", "4000"])
    # the W3C Attribution target: the same commands with --api attribution (its optimizer simulates the
    # browsers in memory: one training day and a small count limit keep it short)
    w3c = os.path.join(root, "attribution")
    os.makedirs(w3c, exist_ok=True)
    w3c_params = os.path.join(w3c, "params.json")
    w3c_args = ["--slices", "campaignId", "--values", "value", "--max-count-limit", "4"]
    run(["optimize", "--api", "attribution", "--history", train_days[-1], *w3c_args, "--epsilon", "8", "--output",
         w3c_params, "--overwrite", "--no-progress"])
    with open(w3c_params) as fh:
        fixed = normalise(json.load(fh), root)
    w3c_fixed = os.path.join(w3c, "params-fixed.json")
    with open(w3c_fixed, "w") as fh:
        json.dump(fixed, fh, indent=2)
    run(["measure", "--api", "attribution", "--input", test_day, "--params", w3c_fixed, "--output",
         os.path.join(w3c, "measure"), "--simulation-seed", "5", "--overwrite", "--no-progress", "--debug-run"])
    run(["evaluate", "--api", "attribution", "--train", train_days[-1], "--test", test_day, *w3c_args,
         "--epsilons", "8", "--output", os.path.join(w3c, "evaluate"), "--overwrite", "--no-progress"])
    run(["nightly", "--api", "attribution", "--history", history, "--as-of", dates[-1].split("=", 1)[1],
         "--window-days", "1", "--store", os.path.join(w3c, "store"), *w3c_args, "--epsilon", "8", "--run-id",
         "seeded", "--no-progress"])
    print(f"seeded outputs under {root}", file=sys.stderr)
    for rel in files_of(root):
        print(f"{digest(os.path.join(root, rel), root)}  {rel}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
