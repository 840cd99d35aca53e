"""Shared fixtures and hypothesis settings.

Profiles (``HYPOTHESIS_PROFILE``): ``ci`` (default) is derandomized, so CI and local runs test the
same examples (a fixed seed per test, no example database); ``nightly`` explores freely with many
more examples; ``mutation`` is ``ci`` for tools/mutation.py (explicitly no database: every mutant
starts from an empty one).
"""
import os

from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=60, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("nightly", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("mutation", parent=settings.get_profile("ci"), database=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

import pytest  # noqa: E402

from chrome import wicg_contrib  # noqa: E402,F401  (Chrome's ARA logic, built with node)
from gcs_fixtures import fake_gcs_server, gcp_storage_emulator  # noqa: E402,F401  (GCS API emulators)


@pytest.fixture(autouse=True)
def _private_release_ledger(tmp_path_factory, monkeypatch):
    """Every test gets its own release ledger (``$ARAOPT_LEDGER``), also for the processes it starts."""
    monkeypatch.setenv("ARAOPT_LEDGER", str(tmp_path_factory.mktemp("ledger")))
