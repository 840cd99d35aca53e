"""Where the Chrome conformance tests find Chrome's WICG logic, and when its absence fails CI rather
than skipping the tests (``tests/chrome.py``)."""
from __future__ import annotations

import os

import pytest

from chrome import BUILD_SCRIPT, locate_wicg_build, unavailable


def _shared(root):
    script = root / BUILD_SCRIPT
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/bash\n")
    return str(script)


def test_the_wicg_build_is_found_through_the_environment_or_a_shared_folder_above_the_clone(tmp_path):
    script = _shared(tmp_path)
    beside = tmp_path / "clone" / "tests"  # a clone next to shared/
    deeper = tmp_path / "ci" / "jobs" / "clone" / "tests"  # a clone further below the folder holding shared/
    for tests in (beside, deeper):
        tests.mkdir(parents=True)
        assert locate_wicg_build({}, str(tests / "chrome.py")) == script
    assert locate_wicg_build({"ARAOPT_WICG_BUILD": "/elsewhere/build.sh"}, str(beside / "chrome.py")) == \
        "/elsewhere/build.sh"
    lonely = tmp_path.parent / f"{tmp_path.name}-alone" / "clone" / "tests"
    lonely.mkdir(parents=True)
    assert locate_wicg_build({}, str(lonely / "chrome.py")) is None


def test_a_missing_wicg_build_fails_ci_and_skips_elsewhere(tmp_path):
    script = _shared(tmp_path)
    assert unavailable([], script, {"CI": "true"}) is None
    for build in (None, str(tmp_path / "missing" / "build.sh")):
        kind, reason = unavailable([], build, {"CI": "true"})
        assert kind == "fail" and "ARAOPT_WICG_BUILD" in reason
        assert unavailable([], build, {})[0] == "skip"
        assert unavailable([], build, {"CI": "false"})[0] == "skip"
    # without node or npm nothing can be built, in CI or not: said, and skipped
    kind, reason = unavailable(["node"], script, {"CI": "true"})
    assert kind == "skip" and "node" in reason


def test_this_clone_finds_the_build_ci_uses():
    """The development layout (and CI's: a fresh clone with shared/ beside it) finds the script."""
    here = os.path.dirname(os.path.abspath(__file__))
    expected = os.path.join(os.path.dirname(os.path.dirname(here)), BUILD_SCRIPT)
    if not os.path.exists(expected):
        pytest.skip(f"no {expected} beside this clone")
    assert locate_wicg_build({}, os.path.join(here, "chrome.py")) == expected
