"""The README's main job (`make demo`) end to end at a small size."""
import re

import pytest

from pipelines import demo


@pytest.mark.slow
def test_demo_runs_nightly_then_measures_the_next_day_with_its_lookback(tmp_path, capsys):
    assert demo.run(["--output", str(tmp_path / "out"), "--conversions-per-day", "4000"]) == 0
    out = capsys.readouterr().out
    assert "lifetime cap:" in out and "tuned for one day's release" in out
    match = re.search(r"predicted RMSRE_tau ([0-9.]+) \(replayed on the window's days\), realised ([0-9.]+)", out)
    assert match, out[-2000:]
    predicted, realised = float(match.group(1)), float(match.group(2))
    assert 0 < predicted and 0 < realised and 0.5 < realised / predicted < 2.0
    for path in ("measure/release/estimates.csv", "plots/nightly_report.png", "plots/estimates.png",
                 "plots/noisy_vs_unnoised.png", "measure/private/report.html", "store/latest"):
        assert (tmp_path / "out" / path).exists(), path
