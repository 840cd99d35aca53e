"""Flex Template entry point (FLEX_TEMPLATE_PYTHON_PY_FILE): runs ``araopt <job> ARGS``.

The image is built once per job (``--build-arg JOB=nightly|measure``, see deploy/Dockerfile); the
job comes from the ``ARAOPT_JOB`` environment variable. The launcher calls this file with the
template parameters as ``--<name>=<value>`` plus Beam's pipeline options (``--runner``,
``--project``, ``--region``, ``--temp_location``, ``--setup_file``, ...), all passed on unchanged.
"""
from __future__ import annotations

import os
import sys

JOBS = ("nightly", "measure")


def build_argv(job: str, args: list[str]) -> list[str]:
    """The ``araopt`` command line for ``job``; ValueError for an unknown job."""
    if job not in JOBS:
        raise ValueError(f"ARAOPT_JOB must be one of {', '.join(JOBS)}, got {job!r}")
    return [job, *args]


def main() -> int:
    try:
        argv = build_argv(os.environ.get("ARAOPT_JOB", ""), sys.argv[1:])
    except ValueError as exc:
        print(f"araopt flex template: {exc}", file=sys.stderr)
        return 2
    from pipelines.cli import main as cli_main  # only inside the template image

    return int(cli_main(argv) or 0)


if __name__ == "__main__":
    sys.exit(main())
