"""The typed values of the command-line options (stdlib only, like the option registry that uses them):
switches, positive numbers, dates and as-of dates, column lists, --tau pairs, special days, day lists.
Each bad value is one line (``argparse.ArgumentTypeError`` at parse time, ``InvalidParameters`` after).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import math

from araopt.errors import InvalidParameters


def parse_bool(value: str | bool) -> bool:
    """``true``/``false`` (any case, also 1/0/yes/no) -> bool; how templates pass switches."""
    if isinstance(value, bool):
        return value
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def _positive_int(text: str) -> int:
    try:
        x = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if x < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return x


def _positive_float(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(x) or x <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return x


def _date(text: str) -> _dt.date:
    try:
        return _dt.date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a YYYY-MM-DD date: {text!r}") from None


def resolve_as_of(value: str, today: _dt.date | None = None) -> str:
    """Turn ``today``/``yesterday`` (UTC) into YYYY-MM-DD; validate explicit dates."""
    today = today or _dt.datetime.now(_dt.UTC).date()
    if value == "today":
        return today.isoformat()
    if value == "yesterday":
        return (today - _dt.timedelta(days=1)).isoformat()
    try:
        return _dt.date.fromisoformat(value).isoformat()
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected YYYY-MM-DD, 'today' or 'yesterday', got {value!r}") from None


def split_columns(text: str, what: str) -> tuple[str, ...]:
    """Comma-separated column names; refuses an empty --values list and repeated names."""
    cols = tuple(c.strip() for c in text.split(",") if c.strip())
    if not cols and what == "--values":
        raise InvalidParameters(f"{what} must name at least one column")
    if len(set(cols)) != len(cols):
        raise InvalidParameters(f"{what} lists a column twice: {text!r}")
    return cols


def parse_tau(text: str | None) -> dict[str, float]:
    """``count=5,value=200`` -> {"count": 5.0, "value": 200.0} (validated later against the queries)."""
    out: dict[str, float] = {}
    for part in (p.strip() for p in (text or "").split(",") if p.strip()):
        name, sep, value = part.partition("=")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep or not name.strip():
            raise InvalidParameters(f"--tau expects NAME=VALUE pairs such as count=5,value=200, got {part!r}")
    return out


def parse_special_days_option(text: str | None) -> tuple[str, ...]:
    """``--special-days 2026-11-27,2026-12-24`` -> sorted unique ISO dates (a bad date: one-line error)."""
    from araopt.calibration.calendar import parse_special_days

    try:
        return parse_special_days(text)
    except ValueError as exc:
        raise InvalidParameters(f"--special-days: {exc}") from None


def check_loss_factor(value: float) -> float:
    """--special-day-loss-factor: a finite number >= 1 (one-line error otherwise)."""
    if not (math.isfinite(value) and value >= 1.0):
        raise InvalidParameters(f"--special-day-loss-factor must be a finite number >= 1, got {value}")
    return float(value)


def parse_days_option(text: str | None, flag: str = "--days") -> tuple[str, ...] | None:
    """``--days 2026-11-27,2026-11-28`` or ``--days 2026-11-27..2026-11-30`` -> sorted unique ISO dates
    (None when not given; a bad date or an empty range: one-line error)."""
    if text is None:
        return None
    try:
        first, sep, last = text.partition("..")
        if sep:
            lo, hi = _dt.date.fromisoformat(first.strip()), _dt.date.fromisoformat(last.strip())
            if hi < lo:
                raise ValueError(f"the range {text!r} ends before it starts")
            return tuple((lo + _dt.timedelta(days=i)).isoformat() for i in range((hi - lo).days + 1))
        return tuple(sorted({_dt.date.fromisoformat(d.strip()).isoformat() for d in text.split(",") if d.strip()}))
    except ValueError as exc:
        raise InvalidParameters(f"{flag}: {exc}") from None
