"""Thin Apache Beam wrappers over the engine-free core in ``araopt`` (composite PTransforms)."""
