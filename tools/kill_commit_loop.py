"""`kill -9` at the release ledger's record, N times: every release is whole, or re-makeable without
--allow-rerelease.

Each round starts `araopt measure` on a small log with its own ledger and output, polls the ledger's
index until the release is recorded there and sends SIGKILL: at once (round 1, 4, 7, ...), after a
random 0-15 ms (2, 5, 8, ...), or as soon as the staging folder's release manifest appears (3, 6,
9, ...: sealed, not yet renamed), so the kills land before the manifests, between them and the
rename, and after it. Then
it runs the same command again, without --allow-rerelease, and classifies the outcome:

* ``whole``: the second run is refused because the output holds a run, and that run is the killed
  run's release (its run manifest names the ledger's only entry; every release file matches the
  release manifest) — published by the killed run itself or finished by the second run's settlement;
* ``re-made``: the killed run published nothing, its ledger entry was taken out, and the second run
  released the input (exit 0, one ledger entry: the second run's);
* ``FAILED``: anything else (a lost release, a false record, a half-written output).

    .venv/bin/python tools/kill_commit_loop.py [--runs 10] [--seed 0] [--api ara|attribution]

``--api attribution``: the same loop over an attribution release (a log with browsers and impression
times, an attribution parameter version): its commit records the release (and the impression times
it charged) through the same pending records.

Exit status 1 if any round failed.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pandas as pd

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from araopt.io import outputs  # noqa: E402
from araopt.mechanism.params import Params, QueryParams  # noqa: E402
from araopt.version import ParameterVersion  # noqa: E402


def make_input(folder: str, seed: int) -> tuple[str, str, str]:
    rng = np.random.default_rng(seed)
    n = 3000
    imp = rng.integers(0, 600, n)
    frame = pd.DataFrame({"impression_id": imp.astype("int64"),
                          "conversion_time": pd.Timestamp("2026-03-02", tz="UTC")
                          + pd.to_timedelta(rng.integers(0, 86_400_000_000, n), unit="us"),
                          "s": np.array(["a", "b", "c"], dtype=object)[imp % 3], "v": rng.lognormal(2, 1, n)})
    data = os.path.join(folder, "in")
    os.makedirs(data)
    frame.to_parquet(os.path.join(data, "part-0.parquet"), index=False)
    params = os.path.join(folder, "p.json")
    ParameterVersion(Params(count_limit=2, encoding="linf", epsilon=8.0, slice_columns=("s",),
                            queries=(QueryParams("v", 20.0, 1.0),))).save(params)
    domain = os.path.join(folder, "domain.csv")
    with open(domain, "w") as fh:
        fh.write("s\na\nb\nc\n")
    return data, params, domain


def make_attribution_input(folder: str, seed: int) -> tuple[str, str, str]:
    """``make_input``'s log with browsers (3 impressions each) and impression times, and an attribution
    parameter version over the same slices."""
    from araopt.attribution.params import COUNT, AttributionParams, AttributionQuery

    data, _, domain = make_input(folder, seed)
    path = os.path.join(data, "part-0.parquet")
    frame = pd.read_parquet(path)
    frame["browser_id"] = frame["impression_id"] // 3
    frame["impression_time"] = (pd.Timestamp("2026-03-01", tz="UTC")
                                + pd.to_timedelta(frame["impression_id"] * 60_000_000, unit="us"))
    frame.to_parquet(path, index=False)
    queries = (AttributionQuery(COUNT, None), AttributionQuery("v", "v", max_value=255, clip=20.0))
    params = os.path.join(folder, "p.json")
    ParameterVersion.for_attribution(AttributionParams.from_paper(4.0, 2, {COUNT: 0.3, "v": 0.7}, queries,
                                                                  ("s",))).save(params)
    return data, params, domain


def entries(ledger: str) -> list[dict]:
    path = os.path.join(ledger, "ledger", "index.json")
    try:
        with open(path) as fh:
            return list(json.load(fh)["releases"])
    except (OSError, ValueError, KeyError):
        return []


def whole(target: str) -> str | None:
    """The ledger entry id a whole run folder was recorded under, or None if it is not whole."""
    try:
        with open(os.path.join(target, outputs.manifest_file(False)), "rb") as fh:
            manifest_bytes = fh.read()
        with open(os.path.join(target, outputs.private_file(outputs.RUN_MANIFEST))) as fh:
            run_manifest = json.load(fh)
        if run_manifest["release_manifest_sha256"] != outputs.sha256_hex(manifest_bytes):
            return None
        for f in json.loads(manifest_bytes)["files"]:
            with open(os.path.join(target, "release", f["path"]), "rb") as fh:
                if outputs.sha256_hex(fh.read()) != f["sha256"]:
                    return None
        return str(run_manifest["ledger"]["entry"]["id"])
    except (OSError, ValueError, KeyError):
        return None


def one_round(number: int, rng: random.Random, api: str = "ara") -> tuple[bool, str]:
    with tempfile.TemporaryDirectory(prefix="araopt-kill-") as tmp:
        data, params, domain = (make_attribution_input if api == "attribution" else make_input)(tmp, number)
        ledger, target = os.path.join(tmp, "ledger"), os.path.join(tmp, "out")
        cmd = [sys.executable, "-m", "pipelines.measure", "--input", data, "--params", params, "--domain", domain,
               "--output", target, "--ledger", ledger, "--no-progress"]
        env = {**os.environ, "PYTHONPATH": ROOT}
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        kind = number % 3
        delay = rng.uniform(0.0, 0.015) if kind == 2 else 0.0
        deadline = time.monotonic() + 300
        while not entries(ledger):
            if proc.poll() is not None or time.monotonic() > deadline:
                return False, f"the run ended (exit {proc.returncode}) before the ledger recorded anything"
            time.sleep(0.0002)
        recorded_at = time.monotonic()
        if kind == 0:  # at the sealed release manifest in the staging folder
            manifest = outputs.manifest_file(False)
            while not any(os.path.exists(os.path.join(tmp, n, manifest)) for n in os.listdir(tmp)
                          if ".araopt-staging-" in n) and not os.path.exists(os.path.join(target, manifest)):
                if proc.poll() is not None:
                    break
                time.sleep(0.0002)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        delay = time.monotonic() - recorded_at
        proc.wait()
        killed_entry = entries(ledger)[0]["id"]
        at_kill = ("published" if whole(target) == killed_entry else
                   "sealed, not moved" if any(".araopt-staging-" in n and whole(os.path.join(tmp, n)) == killed_entry
                                             for n in os.listdir(tmp)) else "not sealed")
        again = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        after = entries(ledger)
        leftovers = [n for n in os.listdir(tmp) if ".araopt-staging-" in n or ".araopt-pending-" in n]
        status = f"killed {delay * 1000:4.1f} ms after the record ({at_kill:<17}); "
        if again.returncode == 2 and "already holds a run" in again.stderr:
            ok = whole(target) == killed_entry and [e["id"] for e in after] == [killed_entry] and not leftovers
            return ok, status + ("whole: the killed run's release, its ledger entry kept" if ok else
                                 f"FAILED: refused but the output/ledger disagree ({len(after)} entries)")
        if again.returncode == 0:
            ok = len(after) == 1 and after[0]["id"] != killed_entry and whole(target) == after[0]["id"] \
                and not leftovers
            return ok, status + ("re-made: nothing was published, the entry was taken out, released again "
                                 "without --allow-rerelease" if ok else f"FAILED: {len(after)} entries after re-making")
        tail = [ln for ln in again.stderr.splitlines() if "error:" in ln][-1:] or [again.stderr[-300:]]
        return False, status + f"FAILED: the second run exited {again.returncode}: {tail[0]}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--api", choices=("ara", "attribution"), default="ara")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    failures = 0
    for number in range(1, args.runs + 1):
        ok, what = one_round(number, rng, args.api)
        failures += not ok
        print(f"run {number:2d}: {what}", flush=True)
    print(f"{args.runs - failures} of {args.runs} runs: every release whole or re-makeable without --allow-rerelease")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
