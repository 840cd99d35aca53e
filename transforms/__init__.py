"""Thin Apache Beam wrappers over the engine-free core in ``araopt`` (composite PTransforms)."""

from . import coders  # noqa: F401 - registers the coder of pa.Table (Arrow IPC) for every pipeline
