"""Generate the Flex Template metadata files from the option registry (pipelines/options.py).

    python -m deploy.gen_metadata           # rewrite deploy/nightly-metadata.json, deploy/measure-metadata.json
    python -m deploy.gen_metadata --check   # exit 1 if a committed file is out of date
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Final

from pipelines.options import OPTIONS_BY_JOB, CliOption

DEPLOY_DIR: Final = Path(__file__).resolve().parent

_DESCRIPTIONS: Final = {
    "nightly": (
        "araopt nightly: optimizes ARA summary-report parameters (contribution budgeting) on the "
        "conversion history window ending at the as-of date and publishes them as an immutable version "
        "in the parameter store, moving its 'latest' pointer with a generation precondition."
    ),
    "measure": (
        "araopt measure: resolves the parameters (store 'latest' or a named version, checksum-verified), "
        "measures the reports with them and writes the summary report and run_summary.json."
    ),
}


def metadata_path(job: str) -> Path:
    """Where the committed metadata of ``job`` lives."""
    return DEPLOY_DIR / f"{job}-metadata.json"


def parameter_metadata(option: CliOption) -> dict[str, Any]:
    """One entry of the metadata ``parameters`` list."""
    entry: dict[str, Any] = {
        "name": option.name,
        "label": option.label,
        "helpText": option.help,
        "isOptional": not option.required,
    }
    if option.template_regexes:
        entry["regexes"] = list(option.template_regexes)
    return entry


def build_metadata(job: str) -> dict[str, Any]:
    """The Flex Template metadata document of ``job`` ('nightly' or 'measure')."""
    if job not in OPTIONS_BY_JOB:
        raise ValueError(f"unknown job {job!r}; expected one of {sorted(OPTIONS_BY_JOB)}")
    return {
        "name": f"araopt-{job}",
        "description": _DESCRIPTIONS[job],
        "streaming": False,
        "parameters": [parameter_metadata(option) for option in OPTIONS_BY_JOB[job]],
    }


def render(job: str) -> str:
    """Deterministic JSON text of the metadata (2-space indent, trailing newline)."""
    return json.dumps(build_metadata(job), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.gen_metadata", description=__doc__.splitlines()[1])
    parser.add_argument("--check", action="store_true", help="only check the committed files; exit 1 if stale")
    args = parser.parse_args(argv)
    stale = []
    for job in OPTIONS_BY_JOB:
        path, text = metadata_path(job), render(job)
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        if args.check:
            stale.append(path)
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    if stale:
        print(f"out of date (run python -m deploy.gen_metadata): {', '.join(map(str, stale))}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
