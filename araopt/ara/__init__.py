"""The browser side: ARA limits, key maps, source and trigger registrations, and reconstruction of
estimates from the Aggregation Service's summary reports.

The ad servers' API (docs/ara.md): ``SourceEncoder``, ``TriggerEncoder`` and ``KeyMap`` (from
``araopt.ara.registrations``), imported when first used, so that importing another module of the
package does not load the registrations.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_PUBLIC = {"KeyMap": "araopt.ara.registrations", "SourceEncoder": "araopt.ara.registrations",
           "TriggerEncoder": "araopt.ara.registrations"}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'araopt.ara' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:  # the same names, for type checkers
    from araopt.ara.registrations import KeyMap as KeyMap
    from araopt.ara.registrations import SourceEncoder as SourceEncoder
    from araopt.ara.registrations import TriggerEncoder as TriggerEncoder
