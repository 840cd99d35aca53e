"""Chrome's own Attribution Reporting logic (the WICG TypeScript), built for tests: the session fixture
``wicg_contrib`` (registered in conftest) and helpers that run export-ara's registrations through it
and read what `araopt measure` simulated for the same log."""
import json
import os

import pytest

from araopt.io import avro
from peers import build_peer

BUILD_SCRIPT = os.path.join("shared", "peers", "wicg", "build.sh")


def locate_wicg_build(env=os.environ, start=None):
    """The WICG build script: ``$ARAOPT_WICG_BUILD`` if set (even if it names nothing: then that is
    what is missing), else ``shared/peers/wicg/build.sh`` in the nearest folder above the clone that has
    one (a clone next to ``shared/``, or deeper below the folder that holds it); None if none has."""
    explicit = env.get("ARAOPT_WICG_BUILD")
    if explicit:
        return explicit
    folder = os.path.dirname(os.path.abspath(start or __file__))  # start: a file of the clone's tests/
    while True:
        candidate = os.path.join(folder, BUILD_SCRIPT)
        if os.path.exists(candidate):
            return candidate
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


def unavailable(missing_tools, build, env=os.environ):
    """Why Chrome's logic cannot run here, as ("skip" | "fail", reason), or None when it can. In CI
    (``CI=true``) with node and npm installed, a missing build is a failure, never a silent skip: CI
    runs in a fresh clone with ``shared/`` beside it, so the conformance tests must run there."""
    if not missing_tools and build is not None and os.path.exists(build):
        return None
    what = (f"missing {missing_tools}" if missing_tools else
            f"no WICG build script ({build or 'no ' + BUILD_SCRIPT + ' above the clone'}; set ARAOPT_WICG_BUILD)")
    in_ci = env.get("CI", "").strip().lower() in ("true", "1", "yes")
    if in_ci and not missing_tools:
        return "fail", f"CI=true and node and npm are installed, but Chrome's WICG logic cannot be built: {what}"
    return "skip", f"Chrome's WICG logic cannot be built here: {what}"


WICG_BUILD = locate_wicg_build()


@pytest.fixture(scope="session")
def wicg_contrib():
    """``contrib.js``: Chrome's "create aggregatable contributions", report limit and budget (WICG
    attribution-reporting-api, ts/), built here with node and npm (a minute the first time; cached
    in ``~/.cache/araopt/wicg``). Skipped, saying why, when node, npm or the peer source is missing;
    failed instead in CI (``unavailable``)."""
    import shutil

    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    verdict = unavailable(missing, WICG_BUILD)
    if verdict is not None:
        kind, reason = verdict
        (pytest.fail if kind == "fail" else pytest.skip)(reason)
    return os.path.join(build_peer(WICG_BUILD, "wicg"), "contrib.js")


def chrome_sums(contrib_js, export_dir, tmp_path):
    """export-ara's registrations through Chrome's logic: {bucket: unnoised sum} and the source of each impression."""
    import subprocess

    with open(os.path.join(export_dir, "sources.json")) as fh:
        sources = [r["registration"] for r in json.load(fh)["registrations"]]
    by_impression: dict = {}
    with open(os.path.join(export_dir, "private", "triggers.jsonl")) as fh:  # browser arrival order
        for line in fh:
            t = json.loads(line)
            by_impression.setdefault(t["impression_id"], []).append(t)
    source_of = {imp: {t["source_index"] for t in ts} for imp, ts in by_impression.items()}
    t0 = min(t["conversion_time_us"] for ts in by_impression.values() for t in ts) // 1_000_000 - 1
    events = tmp_path / "events.jsonl"
    with open(events, "w") as fh:
        for imp, ts in by_impression.items():
            fh.write(json.dumps({"impression": imp, "source_json": sources[ts[0]["source_index"]], "source_time": t0,
                                 "triggers": [{"trigger_json": t["registration"],
                                               "trigger_time": t["conversion_time_us"] // 1_000_000} for t in ts]}) + "\n")
    done = subprocess.run(["node", contrib_js, str(events)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["stats"]["errors"] == 0 and out["max_reports"] == 20
    return {int(k, 16): v for k, v in out["sums"].items()}, source_of, out["stats"]


def measure_unnoised(tmp_path, log, params_path, key_map, seed):
    """`araopt measure` (the Beam job, simulation) over the export's key map: {bucket: unnoised sum}, run summary."""
    from pipelines import measure as measure_pipeline

    out = tmp_path / "measure"
    assert measure_pipeline.run(["--input", str(log), "--params", str(params_path), "--output", str(out), "--domain",
                                 str(key_map), "--simulation-seed", str(seed), "--debug-run"]) == 0
    from araopt.io import outputs

    buckets, unnoised, _, _ = avro.read_debug_report(os.path.join(str(out), outputs.private_file(outputs.DEBUG_REPORT)))
    with open(os.path.join(str(out), outputs.private_file(outputs.RUN_SUMMARY))) as fh:
        summary = json.load(fh)
    return {b: int(u) for b, u in zip(buckets, unnoised, strict=True) if u}, summary
