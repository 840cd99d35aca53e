"""araopt's refusals and the checks shared by every layer. Every refusal is a ``ValueError`` (so a
caller that catches ``ValueError`` still catches it) of one of five kinds, and names what it refuses:

* ``InvalidParameters``: a parameter file, a parameter or an option out of its range;
* ``InvalidInput``: data that breaks its contract (a conversion log, a key map, a report);
* ``PrivacyRefusal``: something that would weaken a release's guarantee (a domain derived from the
  data it releases, conversions released before, too many rejected rows);
* ``Unsupported``: a valid combination the code does not model;
* ``OutputRefused``: an output that must not be written: an existing result without ``--overwrite``,
  something araopt did not write, a folder another run is writing.
"""
from __future__ import annotations

import math
from typing import Any, Final

from araopt.constants import CONTRIBUTION_BUDGET, MAX_CONTRIBUTION_BUDGET, MAX_EPSILON, MIN_EPSILON

ONE_LINE_MAX_CHARS: Final = 2000
_TRACEBACK: Final = "Traceback (most recent call last)"


def one_line(error: object, limit: int = ONE_LINE_MAX_CHARS) -> str:
    """An error (an exception or its text) as the one line a user sees: every line of its message joined
    (Beam's "Pipeline has validations errors:" has its reason on the next lines); of a traceback embedded
    in the message (a worker's error, relayed) only the exception it ends with, without the frames
    (``--traceback`` shows them); at most ``limit`` characters. An exception without a message is its
    type's name."""
    lines = str(error).splitlines()
    marks = [i for i, line in enumerate(lines) if _TRACEBACK in line]
    if marks:
        frames = [i for i in range(marks[-1] + 1, len(lines)) if lines[i][:1].isspace()]
        exception = lines[(frames[-1] if frames else marks[-1]) + 1:]  # what the traceback ends with
        lines = lines[:marks[0]] + [lines[marks[0]].split(_TRACEBACK, 1)[0]] + exception
    joined = " ".join(" ".join(line.split()) for line in lines if line.strip())
    if not joined and isinstance(error, BaseException):
        return type(error).__name__
    return joined if len(joined) <= limit else joined[:limit - 1] + "…"


class AraoptError(ValueError):
    """Any refusal of araopt."""


class InvalidParameters(AraoptError):
    """A parameter out of its range, or a parameter file that does not validate."""


class InvalidInput(AraoptError):
    """Data that breaks its contract."""


class PrivacyRefusal(AraoptError):
    """A request that would weaken the privacy of a release."""


class Unsupported(AraoptError):
    """A valid combination that is not modelled."""


class OutputRefused(AraoptError):
    """An output that would replace a result without ``--overwrite``, or something araopt did not write."""


def is_positive_finite(x: Any) -> bool:
    """A real number (not a bool) that is finite and > 0."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def check_epsilon(epsilon: float | str, name: str = "epsilon") -> float:
    """Epsilon as float if it lies in [2^-20, 64] (floor: MIN_EPSILON; ceiling: the Aggregation Service's)."""
    if isinstance(epsilon, bool):
        raise InvalidParameters(f"{name} must be a number, got {epsilon!r}")
    try:
        value = float(epsilon)
    except (TypeError, ValueError, OverflowError):
        raise InvalidParameters(f"{name} must be a number, got {epsilon!r}") from None
    if not (math.isfinite(value) and MIN_EPSILON <= value <= MAX_EPSILON):
        raise InvalidParameters(f"{name} must lie in [2^-20 (~9.54e-07), {MAX_EPSILON:g}], got {epsilon!r}")
    return value


def check_integer(value: Any, name: str, low: int, high: int | None = None, shown_high: str | None = None) -> int:
    """``value`` as int if it is an integer (an int, a numpy integer, or an integral float; never a bool)
    in [low, high]."""
    integral = (isinstance(value, int) or type(value).__name__.startswith(("int", "uint"))
                or (isinstance(value, float) and value.is_integer()))
    if isinstance(value, bool) or type(value).__name__ == "bool_" or not integral:
        raise InvalidParameters(f"{name} must be an integer, got {value!r}")
    out = int(value)
    if out < low or (high is not None and out > high):
        bound = f"[{low}, {shown_high or high}]" if high is not None else f">= {low}"
        raise InvalidParameters(f"{name} must lie in {bound}, got {value!r}")
    return out


def check_contribution_budget(contribution_budget: Any, high: int = MAX_CONTRIBUTION_BUDGET) -> int:
    """Gamma as an int if it is an integer (not a bool or a float) in [1, ``high``] (ARA's is 2^16; the
    bounding accepts up to 2^32, where running totals stay exact in int64)."""
    shown = "2^32" if high == MAX_CONTRIBUTION_BUDGET else str(high)
    integral = isinstance(contribution_budget, int) or type(contribution_budget).__name__.startswith(("int", "uint"))
    if (isinstance(contribution_budget, bool) or type(contribution_budget).__name__ == "bool_" or not integral
            or not 1 <= int(contribution_budget) <= high):
        raise InvalidParameters(f"contribution_budget must be an integer in [1, {shown}], got {contribution_budget!r}")
    return int(contribution_budget)


def check_count_limit(count_limit: Any, contribution_budget: int = CONTRIBUTION_BUDGET) -> int:
    """The count limit C if it is an integer in [1, Gamma]."""
    return check_integer(count_limit, "count_limit", 1, contribution_budget)
