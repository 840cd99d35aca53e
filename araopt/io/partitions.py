"""Date partitions (``date=YYYY-MM-DD/``): the one reading of a partition folder's day, checked where it
is read (a malformed or impossible date is one line, before any work), the days before an input's
partitions (``measure --lookback-days``), and the check that a release's rows fall on the days its
folders name (``measure`` uses those days for the calibration's calendar).
"""
from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from dataclasses import dataclass

from araopt.errors import InvalidInput, InvalidParameters

_ISO_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")
DAY_US = 86_400_000_000


def partition_day(path: str) -> str | None:
    """The day of the ``date=YYYY-MM-DD`` folder ``path`` lies in (the innermost one; a path ending in
    ``/`` is a folder, else its last component is a file's name and not a partition), None outside any;
    a ``date=`` folder whose value is not a real calendar day in that form is refused (one line)."""
    folders = path.replace("\\", "/").split("/")[:-1]
    found = [part[len("date="):] for part in folders if part.startswith("date=")]
    if not found:
        return None
    value = found[-1]
    try:
        day = dt.date.fromisoformat(value) if _ISO_DAY.fullmatch(value) else None
    except ValueError as exc:
        raise InvalidInput(f"{path}: partition folder date={value} is not a calendar day written YYYY-MM-DD "
                           f"({exc})") from None
    if day is None:
        raise InvalidInput(f"{path}: partition folder date={value} is not a calendar day written YYYY-MM-DD")
    return day.isoformat()


def partition_root(path: str) -> str | None:
    """The folder holding the ``date=`` partition a file lies in (``logs`` for
    ``logs/date=2026-11-25/part-0.parquet``; ``.`` for a partition in the working folder), None outside any."""
    folders = path.replace("\\", "/").split("/")[:-1]
    inner = [i for i, part in enumerate(folders) if part.startswith("date=")]
    return None if not inner else ("/".join(folders[:inner[-1]]) or ".")


def files_in_days(paths: Sequence[str], first: dt.date, last: dt.date) -> list[str]:
    """The files of ``paths`` whose ``date=`` partition lies in [first, last] (files in no partition left
    out; a malformed partition date refused, as ``partition_day`` does)."""
    out = []
    for path in paths:
        day = partition_day(path)
        if day is not None and first <= dt.date.fromisoformat(day) <= last:
            out.append(path)
    return out


def partition_days(paths: Sequence[str]) -> tuple[str, ...] | None:
    """The days a set of files covers, from their ``date=YYYY-MM-DD/`` partition folders (how the input
    was cut, not what its rows say), sorted; None unless every file lies in such a partition."""
    days = [partition_day(p) for p in paths]
    if not days or any(d is None for d in days):
        return None
    return tuple(sorted({d for d in days if d is not None}))


def rows_outside_days(first_us: int | None, last_us: int | None, days: Sequence[str]) -> str | None:
    """Why rows whose conversion times run from ``first_us`` to ``last_us`` (UTC microseconds; None:
    unknown) do not fall on ``days`` (their UTC days), or None when they do or the times are unknown."""
    if first_us is None or last_us is None or not days:
        return None
    epoch = dt.date(1970, 1, 1).toordinal()
    allowed = {dt.date.fromisoformat(d).toordinal() - epoch for d in days}
    lo, hi = first_us // DAY_US, last_us // DAY_US
    if lo in allowed and hi in allowed:
        return None
    first, last = (dt.date.fromordinal(n + epoch).isoformat() for n in (lo, hi))
    return f"its rows' conversion times run from {first} to {last} (UTC)"


def days_before(paths: Sequence[str], days: int, flag: str = "--lookback-days") -> tuple[str, dt.date, dt.date]:
    """The ``days`` days before the first ``date=`` partition of ``paths``, and the folder holding those
    partitions (``logs`` for ``logs/date=2026-11-25/``), where the earlier days' partitions are looked
    for: (root, first day, last day). Refused (one line): a negative count, files outside partitions or
    in partitions under more than one folder."""
    if days < 0:
        raise InvalidParameters(f"{flag} must be >= 0, got {days}")
    dates = [partition_day(p) for p in paths]
    roots = {partition_root(p) for p in paths}
    if any(d is None for d in dates) or len(roots) != 1:
        raise InvalidInput(f"{flag} needs an input in date=YYYY-MM-DD/ partition folders under one folder "
                           f"(e.g. --input logs/date=2026-11-25/); got {paths[0]!r}"
                           + (f" and {len(roots)} partition folders' parents" if len(roots) > 1 else "")
                           + "; name the earlier files with --lookback instead")
    first = dt.date.fromisoformat(min(d for d in dates if d is not None))
    (root,) = roots
    assert root is not None
    return root, first - dt.timedelta(days=days), first - dt.timedelta(days=1)


@dataclass(frozen=True)
class Window:
    """``nightly``'s window of conversion days [start, end] and the lookback's days [lookback_start, start)."""

    start: dt.date
    end: dt.date
    lookback_start: dt.date


def window(as_of: str, window_days: int, lookback_days: int = 0) -> Window:
    """The ``window_days`` days up to ``as_of`` and the ``lookback_days`` before them (refused, one line: a
    window shorter than a day, a negative lookback)."""
    if window_days < 1:
        raise InvalidParameters(f"--window-days must be >= 1, got {window_days}")
    if lookback_days < 0:
        raise InvalidParameters(f"--lookback-days must be >= 0, got {lookback_days}")
    end = dt.date.fromisoformat(as_of)
    start = end - dt.timedelta(days=window_days - 1)
    return Window(start, end, start - dt.timedelta(days=lookback_days))


def window_partitions(paths: Sequence[str], days: Window, source: str = "the history"
                      ) -> tuple[list[str], list[str], list[str]]:
    """Of ``paths`` (a history's files), those of the conversion-date partitions in the window, the dates
    found, and the files of the lookback's partitions (read only for lifetime ranks). Refused (one line): a
    malformed ``date=`` folder, a window without any partition."""
    chosen, lookback, dates = [], [], set()
    for path in paths:
        found = partition_day(path)  # a malformed date= folder is refused, not skipped
        if found is None:
            continue
        day = dt.date.fromisoformat(found)
        if days.start <= day <= days.end:
            chosen.append(path)
            dates.add(found)
        elif days.lookback_start <= day < days.start:
            lookback.append(path)
    if not chosen:
        raise InvalidInput(f"no history in the window {days.start}..{days.end} under {source} "
                           f"({len(paths)} files found, partitions must look like date=YYYY-MM-DD/)")
    return chosen, sorted(dates), lookback
