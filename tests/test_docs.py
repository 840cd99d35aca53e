"""The manual's Python examples run as written.

Every ```python block of docs/*.md and README.md is executed, the blocks of a page in order in one
namespace, in a fresh folder holding what the pages say it holds: ``params.json`` (the paper's worked
example of Sec. 4.1, sliced by the impression-side ``campaign`` and the conversion-side ``device``,
carrying its domain as a parameter version does) and ``export/`` (``araopt export-ara --params
params.json --output export``). An example that no longer runs fails here.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from factories import du_penc_params, history_version
from pipelines.ara import run_export_ara

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def python_blocks(page: Path) -> list[tuple[int, str]]:
    """(line number, source) of each ```python block of a Markdown page."""
    text = page.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in FENCE.finditer(text)]


PAGES_WITH_EXAMPLES = [p for p in PAGES if python_blocks(p)]


def test_the_blocks_are_found():
    """The ad-server API example of docs/ara.md is among the examples (a fence the pattern missed would
    make every example silently untested)."""
    names = [p.name for p in PAGES_WITH_EXAMPLES]
    assert "ara.md" in names
    assert any("TriggerEncoder" in source for _, source in python_blocks(ROOT / "docs" / "ara.md"))


@pytest.fixture
def docs_workspace(tmp_path, monkeypatch):
    params = du_penc_params(slice_columns=("campaign", "device"), conversion_slice_columns=("device",))
    campaigns, devices = np.array(["Thanksgiving", "Christmas"]), np.array(["desktop", "mobile", "tablet"])
    version = history_version(params, {"campaign": np.repeat(campaigns, len(devices)),
                                       "device": np.tile(devices, len(campaigns))})
    version.save(tmp_path / "params.json")
    assert run_export_ara(["--params", str(tmp_path / "params.json"), "--output", str(tmp_path / "export")]) == 0
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("page", PAGES_WITH_EXAMPLES, ids=lambda p: p.name)
def test_examples_run(page, docs_workspace):
    namespace: dict[str, object] = {"__name__": f"docs_{page.stem}"}
    for line, source in python_blocks(page):
        code = compile("\n" * (line - 1) + source, str(page), "exec")  # tracebacks point at the page's lines
        exec(code, namespace)  # the documentation's own examples


def test_the_readme_fits_on_a_screen_and_its_links_resolve():
    """The README is the entry (what it is, the two set-up commands, the commands, where to read on); the
    manual is in docs/. Its relative links point at files that exist."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    assert "make demo" in readme and "make test" in readme
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    assert targets and all((ROOT / t).exists() for t in targets if "://" not in t), targets


def _documented_invocations() -> list[tuple[str, str, str]]:
    """(page, command, flag) of every ``araopt COMMAND ... --flag`` in the pages' code (fenced blocks with
    their line continuations joined, and inline code spans)."""
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
        spans = re.findall(r"`([^`\n]+)`", re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL))
        for code in [b.replace("\\\n", " ") for b in blocks] + spans:
            for line in code.splitlines():
                for match in re.finditer(r"araopt ((?:[a-z][a-z-]*)(?:\\?\|[a-z][a-z-]*)*)((?: [^|`]*)?)", line):
                    commands = re.split(r"\\?\|", match.group(1))
                    for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9_-]*)", match.group(2).split("araopt ")[0]):
                        found.extend((page.name, command, flag) for command in commands)
    return found


def test_every_documented_option_exists():
    """A flag shown with an araopt command in the docs is an option of that command (or, for the Beam
    jobs, an Apache Beam option): a renamed or removed option cannot stay documented."""
    from pipelines import options

    invocations = _documented_invocations()
    assert len(invocations) > 50  # the pattern finds the documented invocations
    beam_flags = {f for a in options._beam_parser()._actions for f in a.option_strings}
    unknown = []
    for page, command, flag in sorted(set(invocations)):
        if command not in options.COMMANDS:
            continue  # e.g. prose like "araopt is"
        parser = options.build_parser(command)
        flags = {f for a in parser._actions for f in a.option_strings} | {"--help", "--version", "--traceback"}
        if options.COMMANDS[command].beam:
            flags |= beam_flags
        if flag not in flags:
            unknown.append(f"{page}: araopt {command} {flag}")
    assert not unknown, unknown
