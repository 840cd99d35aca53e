"""Strict JSON for the files the project reads and writes.

Reading (``loads``, ``load``): a key given twice in one object is refused (Python's ``json`` keeps
the last one silently, so a parameter file with ``"epsilon": 0.5, "epsilon": 64`` would load as 64),
and so are ``NaN`` / ``Infinity`` (not JSON). Writing (``dumps``): a float that is not finite is
written as ``null`` (strict JSON parsers refuse bare ``NaN``), numpy scalars and arrays as JSON
numbers and lists; everything else as ``json.dumps`` writes it, byte for byte.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from typing import Any

from araopt.errors import InvalidInput
from araopt.io.files import read_bytes


class DuplicateKeyError(InvalidInput):
    """A JSON object names the same key twice."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKeyError(f"key {key!r} appears twice in one object")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise InvalidInput(f"{name} is not JSON")


def loads(raw: bytes | str, source: str) -> Any:
    """Parse JSON strictly; any problem is a one-line ``ValueError`` naming ``source``."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"{source}: not valid JSON (not UTF-8: {exc.reason})") from None
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"{source}: not valid JSON ({exc})") from None
    except ValueError as exc:  # a duplicate key or a NaN / Infinity constant
        raise InvalidInput(f"{source}: not valid JSON ({exc})") from None


def load(path: str | os.PathLike[str], what: str) -> Any:
    """:func:`loads` of a local file (an unreadable file is a one-line ``ValueError`` naming ``what``)."""
    return loads(read_bytes(path, what), os.fspath(path))


def strict(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None and numpy scalars / arrays made plain."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    if hasattr(value, "tolist") and hasattr(value, "dtype"):  # numpy scalar or array
        return strict(value.tolist())
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """``json.dumps`` of :func:`strict` ``(value)``, refusing anything that would still not be JSON."""
    return json.dumps(strict(value), allow_nan=False, **kwargs)
