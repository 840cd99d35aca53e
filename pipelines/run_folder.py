"""A run's output folder is whole or absent: staged, completed with a manifest, then moved into place.

The pipeline writes into a staging folder beside the target (``OUT.araopt-staging-<pid>-<id>``).
When everything is written, :func:`RunFolder.commit` hashes every file, writes ``MANIFEST.json``
last (``araopt.outputs``) and moves the folder into place: locally with two ``rename``s (the old run,
if ``--overwrite``, is renamed away first and deleted after), so a reader sees the old run, no run,
or the new run, never a mix. On gs:// (no atomic rename) the old folder's manifest is deleted
first and the new one is copied last: a folder without ``MANIFEST.json`` is incomplete.

Leftovers of killed runs (staging folders, replaced folders, and shuffle spill folders named with a
dead process id) are swept by the next run that uses the same output or temp location.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass

from apache_beam.io.filesystems import FileSystems

from araopt import outputs

from .options import UserError
from .runner import is_remote, sweep_leftovers

STAGING_TAG = ".araopt-staging-"
REPLACED_TAG = ".araopt-replaced-"
FAILED_TAG = ".araopt-failed-"
_LOG = logging.getLogger(__name__)


def looks_like_run(path: str) -> bool:
    return any(FileSystems.exists(FileSystems.join(path, name)) for name in (outputs.MANIFEST, "run_summary.json"))


@dataclass(frozen=True)
class RunFolder:
    """The target folder of a run and the staging folder the pipeline writes into."""

    target: str
    staging: str
    overwrite: bool

    @classmethod
    def prepare(cls, target: str, overwrite: bool) -> RunFolder:
        """Refuse an existing run without ``overwrite`` (and anything that is not a run folder even with
        it); sweep leftovers of killed runs; create an empty staging folder."""
        target = target.rstrip("/")
        if not target:
            raise UserError("--output is empty")
        remote = is_remote(target)
        if not remote:
            target = os.path.abspath(target)
        if FileSystems.exists(target) and (remote or os.listdir(target)):
            if not looks_like_run(target):
                raise UserError(f"{target} exists and is not an araopt run folder (no {outputs.MANIFEST}): "
                                f"refusing to write into or replace it; choose a new --output")
            if not overwrite:
                raise UserError(f"{target} already holds a run; pass --overwrite to replace it (the whole run)")
        if not remote:
            parent, name = os.path.split(target)
            os.makedirs(parent, exist_ok=True)
            for path in sweep_leftovers(parent, (name + STAGING_TAG, name + REPLACED_TAG)):
                _LOG.warning("removed the leftover of a killed run: %s", path)
        staging = f"{target}{STAGING_TAG}{os.getpid()}-{uuid.uuid4().hex[:12]}"
        if not remote:
            os.makedirs(staging)
            os.makedirs(os.path.join(staging, outputs.PRIVATE_DIR), mode=0o700)
        return cls(target, staging, overwrite)

    def path(self, relative: str) -> str:
        """Where the pipeline writes ``relative`` (a path from ``araopt.outputs``)."""
        return FileSystems.join(self.staging, *relative.split("/"))

    def write(self, relative: str, data: bytes) -> None:
        with FileSystems.create(self.path(relative)) as fh:
            fh.write(data)

    def _files(self) -> list[str]:
        """Every file under the staging folder, relative, '/'-separated (Beam temp folders excluded)."""
        if is_remote(self.staging):
            matched = FileSystems.match([self.staging + "/**"])[0].metadata_list
            rel = [m.path[len(self.staging) + 1:] for m in matched]
        else:
            rel = []
            for root, _, files in os.walk(self.staging):
                for f in files:
                    rel.append(os.path.relpath(os.path.join(root, f), self.staging).replace(os.sep, "/"))
        return sorted(r for r in rel if not r.split("/", 1)[0].startswith("beam-temp"))

    def commit(self, simulation: bool, extra: dict) -> dict:
        """Hash every file, write the manifest last, move the folder into place; returns the manifest."""
        entries = []
        for rel in self._files():
            with FileSystems.open(self.path(rel)) as fh:
                data = fh.read()
            entries.append(outputs.ManifestEntry(rel, outputs.sha256_hex(data), len(data)))
        manifest = outputs.manifest_json(entries, simulation, extra)
        self.write(outputs.MANIFEST, (json.dumps(manifest, indent=1) + "\n").encode())
        if is_remote(self.target):
            self._commit_remote(entries)
        else:
            self._commit_local()
        return manifest

    def _commit_local(self) -> None:
        replaced = None
        if os.path.exists(self.target):
            replaced = f"{self.target}{REPLACED_TAG}{os.getpid()}-{uuid.uuid4().hex[:12]}"
            os.rename(self.target, replaced)
        os.rename(self.staging, self.target)
        if replaced:
            shutil.rmtree(replaced, ignore_errors=True)

    def _commit_remote(self, entries: list) -> None:
        old_manifest = FileSystems.join(self.target, outputs.MANIFEST)
        if FileSystems.exists(old_manifest):
            FileSystems.delete([old_manifest])  # from here on the old folder reads as incomplete
        old = [m.path for m in FileSystems.match([self.target + "/**"])[0].metadata_list]
        if old:
            FileSystems.delete(old)
        names = [e.path for e in entries]
        FileSystems.rename([self.path(n) for n in names], [FileSystems.join(self.target, n) for n in names])
        FileSystems.rename([self.path(outputs.MANIFEST)], [FileSystems.join(self.target, outputs.MANIFEST)])
        self.abandon()

    def fail(self) -> str | None:
        """A failed run: drop everything but the operator-private files; keep those (the dead letter
        explains most failures) in ``OUT.araopt-failed-<pid>-<id>`` if there are any; return that path."""
        if is_remote(self.staging) or not os.path.isdir(self.staging):
            self.abandon()
            return None
        for name in os.listdir(self.staging):
            if name != outputs.PRIVATE_DIR:
                path = os.path.join(self.staging, name)
                shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else os.remove(path)
        private = os.path.join(self.staging, outputs.PRIVATE_DIR)
        has_files = any(files for _, _, files in os.walk(private))
        if not has_files:
            self.abandon()
            return None
        kept = f"{self.target}{FAILED_TAG}{os.getpid()}-{uuid.uuid4().hex[:12]}"
        os.rename(self.staging, kept)
        return kept

    def abandon(self) -> None:
        """Remove the staging folder (a failed run leaves nothing behind)."""
        try:
            if is_remote(self.staging):
                left = [m.path for m in FileSystems.match([self.staging + "/**"])[0].metadata_list]
                if left:
                    FileSystems.delete(left)
            elif os.path.exists(self.staging):
                shutil.rmtree(self.staging, ignore_errors=True)
        except Exception:  # noqa: BLE001 - cleanup must not hide the run's own error
            _LOG.warning("could not remove the staging folder %s", self.staging)


def wait_for_manifest(path: str, timeout: float = 0.0) -> dict:
    """Read a run folder's manifest; a folder without one is incomplete (refused)."""
    deadline = time.monotonic() + timeout
    manifest_path = FileSystems.join(path, outputs.MANIFEST)
    while not FileSystems.exists(manifest_path):
        if time.monotonic() >= deadline:
            raise UserError(f"{path} has no {outputs.MANIFEST}: the run is incomplete (killed or still running)")
        time.sleep(0.2)
    with FileSystems.open(manifest_path) as fh:
        return json.loads(fh.read().decode())
