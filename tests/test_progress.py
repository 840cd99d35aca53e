"""Long jobs say what they are doing: one line per stage on stderr with the time since the start
(``araopt.io.progress``), silenced by --no-progress."""
from __future__ import annotations

import io

import pytest

from araopt.io.progress import Progress


def test_a_stage_line_names_the_job_and_the_time_since_it_started():
    times = iter([100.0, 112.34, 200.0])
    out = io.StringIO()
    progress = Progress("araopt evaluate", stream=out, clock=lambda: next(times))
    progress("dataset1, epsilon 8 (2/7): optimizing")
    assert out.getvalue() == "araopt evaluate: [   12.3 s] dataset1, epsilon 8 (2/7): optimizing\n"
    quiet = io.StringIO()
    Progress("araopt evaluate", enabled=False, stream=quiet)("x")
    assert quiet.getvalue() == ""


def test_evaluate_dataset_reports_every_epsilon_and_step_as_it_starts():
    from araopt.evaluation.evaluate import evaluate_dataset
    from araopt.optimize.statistics import StatisticsSpec, compute_statistics_in_memory
    from factories import small_d2

    conv = small_d2()
    stats = compute_statistics_in_memory(conv, StatisticsSpec(("s",), ("items", "price"), max_count_limit=3))
    heard = []
    evaluate_dataset("d", stats, conv, [1.0, 8.0], test_stats=stats, max_count_limit=3, monte_carlo=2,
                     methods=("optimized_linf", "baseline_q95"), stages=heard.append)
    assert heard == [
        "d, epsilon 1 (1/2): optimizing optimized_linf, baseline_q95 on the training statistics",
        "d, epsilon 1 (1/2): test RMSRE_tau of 2 method(s), 2 mechanism runs each",
        "d, epsilon 1 (1/2): generalization gap (tuning on the test log)",
        "d, epsilon 8 (2/2): optimizing optimized_linf, baseline_q95 on the training statistics",
        "d, epsilon 8 (2/2): test RMSRE_tau of 2 method(s), 2 mechanism runs each",
        "d, epsilon 8 (2/2): generalization gap (tuning on the test log)",
    ]


@pytest.mark.slow
def test_evaluate_and_optimize_show_progress_on_stderr_unless_told_not_to(tmp_path, capsys):
    from factories import log, write_log
    from pipelines import evaluate, optimize

    data = write_log(tmp_path, log(600))
    base = ["--train", data, "--test", data, "--slices", "s", "--values", "v", "--epsilons", "1,8",
            "--methods", "optimized_linf,baseline_q95"]
    assert evaluate.run(base + ["--output", str(tmp_path / "ev")]) == 0
    err = capsys.readouterr().err
    stages = [ln for ln in err.splitlines() if ln.startswith("araopt evaluate: [")]
    assert len(stages) == 4 + 2 * 3 and "reading the training log (1 file(s), 600 rows)" in stages[0]
    assert "statistics of the training log" in stages[1] and "test log's lookback" in stages[3]
    assert "epsilon 8 (2/2): optimizing" in stages[7]
    assert evaluate.run(base + ["--output", str(tmp_path / "ev2"), "--no-progress"]) == 0
    assert "araopt evaluate: [" not in capsys.readouterr().err
    assert optimize.run(["--history", data, "--slices", "s", "--values", "v", "--epsilon", "8", "--output",
                         str(tmp_path / "p.json")]) == 0
    stages = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("araopt optimize: [")]
    # one stage: the tuning workflow's Beam job (statistics, ParameterOptimization, calibration) and the backtest
    assert [s.split("] ", 1)[1].split(" ")[0] for s in stages] == ["one"] and "backtest" in stages[0]
