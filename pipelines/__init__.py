"""Runnable pipelines and CLI entry points of araopt."""
