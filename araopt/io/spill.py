"""Where a job's shuffle spills (``transforms.group``'s GroupByImpression): the spill folder's life,
engine-free. Locally a folder created ``0700`` (it holds raw conversion rows) under the temp location,
with a lock held until it is removed (``araopt.io.locks.LockedDir``); spill folders there whose lock
nobody holds are killed runs' leftovers and are removed first, whatever host or PID namespace their run
was in. On ``gs://`` a fresh prefix (a killed run's spill is left to the bucket's lifecycle rules)."""
from __future__ import annotations

import logging
import tempfile
import uuid

from araopt.errors import InvalidParameters
from araopt.io.folders import FolderFiles, remove_local
from araopt.io.gcs import is_gs
from araopt.io.locks import LockedDir, sweep_unlocked

SHUFFLES = ("auto", "memory", "files")
SPILL_PREFIX = "araopt-shuffle-"
_LOG = logging.getLogger(__name__)


class SpillFolder:
    """Where GroupByImpression spills its shuffle: ``path``, or None for an in-memory GroupByKey;
    :meth:`remove` when the job ends or fails (also a context manager)."""

    def __init__(self, path: str | None, locked: LockedDir | None = None) -> None:
        self.path = path
        self._locked = locked

    def remove(self) -> None:
        if self._locked is not None:
            self._locked.remove()
        else:
            remove_dir(self.path)

    def __enter__(self) -> str | None:
        return self.path

    def __exit__(self, *exc: object) -> None:
        self.remove()


def spill_folder(temp_location: str | None, local_runner: bool, shuffle: str = "auto") -> SpillFolder:
    """The shuffle spill folder of a job under ``temp_location`` (default: the system's temporary folder).
    ``auto``: files for a local runner (whose GroupByKey holds its whole input in memory), memory otherwise
    (Dataflow's shuffle service keeps data out of worker memory)."""
    if shuffle not in SHUFFLES:
        raise InvalidParameters(f"--shuffle must be one of {SHUFFLES}, got {shuffle!r}")
    if shuffle == "memory" or (shuffle == "auto" and not local_runner):
        return SpillFolder(None)
    root = temp_location or tempfile.gettempdir()
    if is_gs(root):  # object stores: a killed run's spill is left to the bucket's lifecycle rules
        return SpillFolder(FolderFiles(root).path(f"{SPILL_PREFIX}{uuid.uuid4().hex}"))
    for stale in sweep_unlocked(root, SPILL_PREFIX):
        _LOG.warning("removed the shuffle spill of a killed run: %s", stale)
    locked = LockedDir.create(root, SPILL_PREFIX, "araopt shuffle spill", mode=0o700)
    return SpillFolder(locked.path, locked)


def remove_dir(path: str | None) -> None:
    """Best-effort removal of a job's temporary folder (a spill, the driver's work folder) after the job
    finished or failed: on ``gs://`` every object under the prefix."""
    if not path:
        return
    try:
        if is_gs(path):  # object stores have no directories: delete every object under the prefix
            FolderFiles(path).remove_all()
        else:
            remove_local(path)
    except Exception:  # noqa: BLE001 - leftover temporary files must not fail a finished job
        _LOG.warning("could not remove temporary shuffle files under %s", path)
