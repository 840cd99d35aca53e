"""Progress of long jobs: one line per stage on stderr, with the time since the job started.

Plain lines (not a bar), so that they also show in logs, CI and a Dataflow launcher's output;
``enabled=False`` (``--no-progress``) keeps stderr quiet. The core takes any ``Callable[[str], None]``.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

Stages = Callable[[str], None]
"""Where a long computation reports the stage it starts."""


class Progress:
    """``progress("stage")`` prints ``<prog>: [  12.3 s] stage`` on stderr (unless disabled)."""

    def __init__(self, prog: str, enabled: bool = True, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.prog = prog
        self.enabled = enabled
        self._stream = stream
        self._clock = clock
        self._start = clock()

    def __call__(self, stage: str) -> None:
        if self.enabled:
            print(f"{self.prog}: [{self._clock() - self._start:7.1f} s] {stage}", file=self._stream or sys.stderr,
                  flush=True)
