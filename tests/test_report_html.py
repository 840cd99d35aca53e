"""The report pages (``araopt.evaluation.report_html``): self-contained, sortable, with the warnings a
reader must see; rendered by a real browser (headless Chromium) without a console error.

Chromium: Debian's ``chromium`` (/usr/bin/chromium); ``.ci/run`` installs it, and in CI (``CI`` or
``ARAOPT_REQUIRE_CHROMIUM`` set) a missing browser fails the browser tests instead of skipping them."""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import numpy as np
import pandas as pd
import pytest

from araopt.evaluation.report_html import DebugReport, nightly_page, release_report_files
from araopt.version import ParameterVersion, Provenance
from factories import du_penc_params

pytestmark = pytest.mark.rendering  # matplotlib figures and a browser: `make test` runs them, the fast lane not

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
IN_CI = bool(os.environ.get("CI") or os.environ.get("ARAOPT_REQUIRE_CHROMIUM"))


def _estimates() -> pd.DataFrame:
    rng = np.random.default_rng(5)
    campaigns = np.repeat(["Thanksgiving", "Christmas", "Easter"], 2)
    frames = []
    for query, scale in (("count", 1.0), ("items", 3.0), ("value", 40.0)):
        estimate = rng.uniform(10, 900, len(campaigns)) * scale
        se = np.full(len(campaigns), 5.0 * scale)
        frames.append(pd.DataFrame({"campaign": campaigns, "device": np.tile(["mobile", "desktop"], 3), "query": query,
                                    "estimate": estimate, "std_error": se, "ci_low": np.maximum(estimate - 1.96 * se, 0),
                                    "ci_high": estimate + 1.96 * se, "capped_estimate": estimate * 0.9,
                                    "capped_std_error": se, "bias_corrected": False}))
    return pd.concat(frames, ignore_index=True)


def _summary(**kw):
    base = {"epsilon": 8.0, "keys": 18, "slices": 6, "domain": "the parameter version", "rows_read": 1234,
            "conversions_kept": 1200, "conversions_dropped_by_cap": 30, "conversions_kept_outside_domain": 0,
            "rows_rejected": 4, "lookback_rows_used": 0, "wall_time_s": 3.2, "simulation": False, "calibration": None}
    base.update(kw)
    return base


def _version() -> ParameterVersion:
    return ParameterVersion(du_penc_params(), provenance=Provenance(training_start="2026-11-01",
                                                                    training_end="2026-11-14",
                                                                    predicted_rmsre_tau=0.0421))


CONSOLE = ["araopt measure: release of 18 keys at epsilon=8 written to out/release/ in 3.2 s",
           "  operator-private (exact, never publish): 1,234 rows read = ...",
           "  WARNING: no --lookback and no impression_time: conversions ... (pass the days before as --lookback)",
           "  NOTE: Saturday 2026-11-28 is a special day the calibration's history has no day like"]
HISTORY = [{"version": "2026-11-13-a", "epsilon": 8.0, "C": 3, "clip items": 2.0, "clip value": 30.0,
            "predicted RMSRE_tau": 0.05, "calibrated": True},
           {"version": "2026-11-14-b", "epsilon": 8.0, "C": 2, "clip items": 2.0, "clip value": 28.0,
            "predicted RMSRE_tau": 0.0421, "calibrated": True}]


def release_files() -> dict[str, bytes]:
    rng = np.random.default_rng(1)
    debug = DebugReport(rng.integers(0, 500, 18), rng.integers(-20, 20, 18), ("items", "value", "bottom"), 65536)
    return release_report_files(_estimates(), ["campaign", "device"], CONSOLE, _summary(), _version(), "2026-11-14-b",
                                ("2026-11-28",), HISTORY, debug, [("estimates.csv (released)", "../release/estimates.csv")])


def nightly_html(**report) -> str:
    base = {"as_of": "2026-11-14", "run_id": "b", "window": ["2026-11-08", "2026-11-14"], "epsilon": 8.0,
            "predicted_rmsre_tau": 0.0421, "baselines": {"baseline_q95": 0.08, "baseline_q99": 0.11},
            "per_count_limit": [{"C": c, "rmsre_tau": 0.03 + 0.002 * abs(c - 2)} for c in range(1, 21)],
            "params": _version().to_json(), "taus": [5.0, 10.0, 150.0], "published": True, "version": "2026-11-14-b",
            "problems": []}
    base.update(report)
    return nightly_page(base, HISTORY)


def test_the_release_page_shows_the_warnings_the_numbers_and_the_parameter_versions():
    files = release_files()
    assert set(files) == {"estimates.png", "noisy_vs_unnoised.png", "report.html"}
    page = files["report.html"].decode()
    assert "araopt release of 2026-11-28" in page
    assert 'class="warn">WARNING: no --lookback' in page and 'class="warn">NOTE: Saturday 2026-11-28' in page
    assert "UNCALIBRATED" in page  # the parameters carry no calibration
    assert page.count("<tr>") >= 18 + 1  # every estimate row, plus the header
    assert 'data-v="' in page and '<table class="sortable">' in page
    assert "2026-11-13-a" in page and "2026-11-14-b" in page and "clip value" in page  # versions over time
    assert "count limit C</dt><dd>2</dd>" in page
    assert "1,234" in page  # the accounting, formatted
    assert 'href="estimates.png"' in page and 'href="../release/estimates.csv"' in page


def test_a_large_release_shows_its_largest_slices_and_says_where_the_rest_is():
    from araopt.evaluation.report_html import release_page

    estimates = _estimates()
    page = release_page(estimates, ["campaign", "device"], CONSOLE, _summary(), _version(), None, max_rows=7)
    assert "The 6 rows of the slices with the largest estimated count, of 18" in page
    biggest = estimates[estimates["query"] == "count"].nlargest(2, "estimate")
    for campaign, device in zip(biggest["campaign"], biggest["device"], strict=True):
        assert f'data-v="{campaign}">{campaign}</td><td class="t" data-v="{device}">' in page


def test_the_nightly_page_shows_the_decision_and_a_refusal():
    page = nightly_html()
    assert "PUBLISHED 2026-11-14-b" in page and "baseline_q95" in page and "per count limit C" in page
    refused = nightly_html(published=False, problems=["count limit moves 2 -> 9, more than 3"])
    assert 'class="bad">NOT PUBLISHED: count limit moves 2 -&gt; 9' in refused and "PUBLISHED 2026" not in refused
    cold = nightly_html(cold_start=True, mode="privacy-safe", per_count_limit=None)
    assert "COLD START" in cold and "(privacy-safe)" in cold


@pytest.mark.parametrize("which", ["release", "nightly"])
def test_the_pages_are_self_contained(which):
    page = release_files()["report.html"].decode() if which == "release" else nightly_html()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)  # nothing fetched from a network
    assert "<link" not in page and "@import" not in page and "url(" not in page
    assert all(src.startswith("data:image/png;base64,") for src in re.findall(r'<img src="([^"]+)"', page))
    assert "<script src" not in page and "<script>" in page  # the sorting script is inline


# ---- in a real browser ----------------------------------------------------------------------------
def chromium(args: list[str], tmp_path) -> str:
    """Run headless Chromium with ``args``; its stderr (console messages are logged there as CONSOLE)."""
    if CHROMIUM is None:
        if IN_CI:
            pytest.fail("chromium is not installed: .ci/run installs it (apt-get install chromium)")
        pytest.skip("chromium is not installed (apt-get install chromium); CI installs it and runs this test")
    profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
    done = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                           "--no-first-run", f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", *args],
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stderr


def console_messages(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def screenshot(page: str, tmp_path, name: str) -> tuple[str, list[str]]:
    html_path = tmp_path / f"{name}.html"
    html_path.write_text(page, encoding="utf-8")
    png = tmp_path / f"{name}.png"
    stderr = chromium([f"--screenshot={png}", "--window-size=1280,1600", html_path.as_uri()], tmp_path)
    return str(png), console_messages(stderr)


def test_a_console_error_is_caught(tmp_path):
    """The check below can fail: a page with a script error shows up in the browser's console log."""
    _, messages = screenshot("<!DOCTYPE html><html><body><p>x</p><script>notDefined();</script></body></html>",
                             tmp_path, "broken")
    assert any("notDefined is not defined" in m for m in messages)


@pytest.mark.parametrize("which", ["release", "nightly"])
def test_the_page_renders_in_chromium_without_a_console_message(which, tmp_path):
    from matplotlib.image import imread

    page = release_files()["report.html"].decode() if which == "release" else nightly_html()
    png, messages = screenshot(page, tmp_path, which)
    assert messages == []
    image = imread(png, format="png")
    assert image.shape[0] >= 1000 and image.shape[1] >= 1000
    assert float(np.std(image[..., :3])) > 0.05  # text, tables and figures, not a blank page
    if os.environ.get("ARAOPT_KEEP_SCREENSHOTS"):  # to look at them
        shutil.copy(png, os.path.join(os.environ["ARAOPT_KEEP_SCREENSHOTS"], f"{which}.png"))


def test_clicking_a_column_sorts_the_table_in_chromium(tmp_path):
    """The inline script sorts by the cells' values (numbers as numbers): clicking 'estimate' twice gives
    the descending order, clicking 'campaign' the alphabetical one, checked in the page and reported on
    the console."""
    check = """<script>
    var th = Array.prototype.filter.call(document.querySelectorAll('table.sortable th'),
                                         function (h) { return h.textContent.trim() === 'estimate'; })[0];
    th.click(); th.click();
    var col = Array.prototype.indexOf.call(th.parentNode.cells, th);
    var rows = th.closest('table').tBodies[0].rows, ok = rows.length > 1;
    for (var i = 1; i < rows.length; i++) {
      if (parseFloat(rows[i - 1].cells[col].getAttribute('data-v')) <
          parseFloat(rows[i].cells[col].getAttribute('data-v'))) { ok = false; }
    }
    ok = ok && th.getAttribute('data-dir') === 'desc';
    var nameHead = Array.prototype.filter.call(document.querySelectorAll('table.sortable th'),
                                           function (h) { return h.textContent.trim() === 'campaign'; })[0];
    nameHead.click();  // text: alphabetical
    var texts = Array.prototype.map.call(nameHead.closest('table').tBodies[0].rows,
                                         function (r) { return r.cells[0].textContent; });
    for (var j = 1; j < texts.length; j++) { if (texts[j - 1].localeCompare(texts[j]) > 0) { ok = false; } }
    console.log('sort-check ' + (ok ? 'descending' : 'WRONG'));
    </script></body>"""
    page = release_files()["report.html"].decode().replace("</body>", check)
    _, messages = screenshot(page, tmp_path, "sorted")
    assert len(messages) == 1 and '"sort-check descending"' in messages[0], messages


@pytest.mark.slow
def test_a_page_that_cannot_be_drawn_does_not_stop_the_release(tmp_path, monkeypatch, capsys):
    from factories import domain_csv, read_json, setup
    from pipelines import measure as measure_pipeline

    def broken(*args, **kwargs):
        raise RuntimeError("no fonts (injected)")

    monkeypatch.setattr("araopt.evaluation.report_html.release_report_files", broken)
    data, params_file = setup(tmp_path)
    assert measure_pipeline.run(["--input", data, "--params", params_file, "--output", str(tmp_path / "o"),
                                 "--domain", domain_csv(tmp_path), "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert "WARNING: the report page was not written: no fonts (injected)" in captured.err
    assert "report (operator-private)" not in captured.out
    assert (tmp_path / "o" / "release" / "MANIFEST.json").exists()
    assert read_json(tmp_path / "o" / "private" / "run_summary.json")["report_page"] is False
    assert not (tmp_path / "o" / "private" / "report.html").exists()
