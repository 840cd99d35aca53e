"""Shared fixtures and hypothesis settings."""
import os

from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

from gcs_fixtures import fake_gcs_server, gcp_storage_emulator  # noqa: E402,F401  (GCS API emulators)
