"""Building a peer's own code (Chrome's WICG logic, the W3C reference implementation) into the user's
cache, once per machine: the build runs under an exclusive file lock, so concurrent test processes (xdist
workers, several checkouts on one machine) never see a half-built tree (``npm ci`` empties
``node_modules`` before it fills it)."""
from __future__ import annotations

import fcntl
import os
import subprocess


def cache_dir(name: str) -> str:
    """``$XDG_CACHE_HOME/araopt/NAME`` (``~/.cache`` by default)."""
    return os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "araopt", name)


def build_peer(script: str, name: str) -> str:
    """Run ``bash SCRIPT DEST`` (an idempotent build script) under ``DEST.lock``; return DEST."""
    dest = cache_dir(name)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    with open(dest + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = subprocess.run(["bash", script, dest], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    return dest
