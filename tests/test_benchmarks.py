"""Every script in benchmarks/ runs in its quick mode: its real code path end to end on tiny inputs.

Nothing else runs the benchmark scripts, so a renamed function or a changed signature in the code they
time breaks them silently (benchmarks/statistics.py and benchmarks/naive_measure.py both did). Each
script runs here as a subprocess from the repository root, with its outputs, temporary files and ledger
in a test folder, and must exit 0 and print the figures it exists to print (the words that label them;
never the timings). A new script in benchmarks/ without an entry in QUICK fails the suite. The scripts whose
figures the manual includes (FIGURE_FILES) also write their figure file, checked here as the manual reads it.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"

# script -> the figure file its quick run writes with --figures (the manual includes the real runs' files).
FIGURE_FILES = {"core": "core.md", "ledger": "ledger.md", "replay": "replay.md"}
# scripts another script's quick run runs (script -> that script): the numpy reference is run by scale's measure.
RUN_BY = {"reference_measure": "scale"}
# script -> (quick arguments, "{tmp}" standing for the test's folder; words its output must contain).
QUICK: dict[str, tuple[list[str], list[str]]] = {
    "ara": (["--repeat", "1", "--number", "10"], ["µs/call", "baseline", "l1-randomized"]),
    "attribution": (["--rows", "1000"], ["1000 rows: ARA measure", "Attribution measure"]),
    "attribution_tune": (["--conversions", "2000", "--runs", "2", "--budgets", "4", "--logs", "synth-criteo"],
                         ["== checks", "optimized <= best baseline in every cell:", "generalization <= 1.25:"]),
    "calendar_coverage": (["--per-day", "300", "--weeks", "1", "--seeds", "1", "--epsilons", "8", "--draws", "1",
                           "--variants", "with"],
                          ["[calendar] coverage of the released 95% intervals", "[marginal] test RMSRE_tau released",
                           "7 held-out days"]),
    "calibration": (["--conversions", "1000", "--draws", "1"],
                    ["Test RMSRE_tau of the TRUE test totals", "Coverage of nominal 95% intervals",
                     "Summary per dataset"]),
    "core": (["--records", "10000", "--samples", "10000", "--figures", "{tmp}/figures/core.md"],
             ["encode L-inf:", "bound (Alg. 1):", "encode+bound+sum:", "DLap sampler secure", "DLap sampler numpy",
              "wrote "]),
    "figures": (["--check"], ["figure(s) in docs/figures, 0 problem(s)"]),
    "ledger": (["--sizes", "1000", "--releases", "2", "--figures", "{tmp}/figures/ledger.md"],
               ["bytes per conversion", "bytes per released conversion", "check + record", "wrote "]),
    "measure": (["--sizes", "2000", "--naive-rows", "1000"],
                ["araopt measure,", "strict per-element Beam", "per-shard working set", "x the per-element pipeline"]),
    "naive_measure": (["--quick"], ["naive per-element pipeline: 1,000 conversions measured"]),
    "optimizer": (["--quick", "--out", "{tmp}/optimizer"],
                  ["== optimizer time", "== the paper's workflow", "ours <= scipy everywhere:",
                   "optimized L-inf strictly below both baselines", "generalization gap", "wrote rmsre.csv"]),
    "perf_log": (["{tmp}/log.parquet", "--conversions", "2000", "--days", "3"], ["conversions over 3 days"]),
    "release_period": (["--per-day", "300", "--train-days", "2", "--epsilons", "8", "--datasets", "geometric",
                        "--coverage-runs", "1"],
                       ["geometric-weekday", "released <= best baseline in", "realised/predicted"]),
    "replay": (["--per-day", "300", "--days", "3", "--epsilons", "8", "--logs", "geometric", "--jobs", "1",
                "--keep", "{tmp}/replay", "--figures", "{tmp}/figures/replay.md"],
               ["geometric", "median private/full", "below baselines", "coverage", "realised/predicted", "wrote "]),
    "retail_log": (["--out", "{tmp}/retail", "--per-day", "100"], ["conversions over 35 days", "sale days"]),
    "scale": (["--conversions", "2000", "--days", "6", "--train-days", "3", "--commands", "optimize,measure,nightly",
               "--window-days", "2", "--nightly-lookback-days", "2", "--workdir", "{tmp}/scale", "--figures",
               "{tmp}/scale.md"],
              ["log: ", "optimize ", "measure ", "peak rss", "reference (numpy)", "measure / reference cpu:",
               "s per million rows read", "wrote "]),
    "seeded_outputs": (["--keep", "{tmp}/seeded"],
                       ["measure/", "evaluate/", "store/versions/", "replay/summary.json"]),
    "spike_cli": (["--per-day", "200", "--days", "1", "--work", "{tmp}/spike"],
                  ["nightly --as-of", "reconstruct --days", "reconstruct (no days)"]),
    "spike_coverage": (["--per-day", "200", "--draws", "1"],
                       ["[measure] sale days: coverage", "[reconstruct] sale days: coverage"]),
    "statistics": (["--rows", "10000"], ["statistics pipeline: 10,000 conversions", "statistics size:", "rows read 10,000"]),
    "synth": (["--quick"], ["Parquet throughput and peak memory", "peak RSS for", "Presets at scale 1"]),
}


def test_every_benchmark_script_has_a_quick_run():
    scripts = {path.stem for path in BENCHMARKS.glob("*.py")}
    assert scripts - QUICK.keys() - RUN_BY.keys() == set(), "add a quick run to QUICK for each new script in benchmarks/"
    assert set(RUN_BY.values()) <= QUICK.keys() and RUN_BY.keys() <= scripts
    assert QUICK.keys() - scripts == set(), "QUICK names a script that is not in benchmarks/"


@pytest.mark.parametrize("script", sorted(QUICK))
def test_benchmark_quick_run(script, tmp_path):
    args, expected = QUICK[script]
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch), "ARAOPT_LEDGER": str(tmp_path / "ledger"), "PYTHONHASHSEED": "0"}
    argv = [sys.executable, str(BENCHMARKS / f"{script}.py"), *(a.replace("{tmp}", str(tmp_path)) for a in args)]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr[-3000:]}"
    missing = [word for word in expected if word not in done.stdout]
    assert missing == [], f"{script} did not print {missing}:\n{done.stdout[-3000:]}"
    if script in FIGURE_FILES:
        check_figure_file(script, tmp_path)



def check_figure_file(script: str, tmp_path: Path) -> None:
    """The figure file a quick run wrote (``--figures``) as the manual includes it: the generated-by line
    naming the script and the arguments that reproduce it, then a Markdown table."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import figures  # benchmarks/figures.py
    finally:
        sys.path.remove(str(BENCHMARKS))
    first, *rest = (tmp_path / "figures" / FIGURE_FILES[script]).read_text(encoding="utf-8").splitlines()
    header = figures.HEADER.match(first)
    assert header is not None and header.group("command").startswith(f"python benchmarks/{script}.py ")
    assert "--figures" not in header.group("command")  # the command that reproduces it, not where it went
    table = [line for line in rest if line.startswith("|")]  # header, separator, at least one row
    assert len(table) >= 3 and all(line.count("|") == table[0].count("|") for line in table)


def test_the_manual_shows_every_figure_file_and_each_names_its_script(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import figures

    assert figures.problems() == []
    assert (ROOT / "docs" / "figures" / "core.md").is_file()  # performance.md's core table is generated
