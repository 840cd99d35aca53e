"""Last-N-touch attribution (spec "Last-N-Touch Attribution"): "fairly allocate credit" and "fill a
histogram with last-n-touch attribution".

The arithmetic is the spec's, in IEEE doubles and in the spec's order, so that the same uniform
draws give the reference implementation's integers exactly (``value * item / sumCredit``, pairwise
randomized rounding, then a final round half up, ``Math.round``). The rounded credits sum to
``value``, each is within 1 of ``value * item / sumCredit`` and equals it in expectation.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from araopt.errors import InvalidParameters


def js_round(x: float) -> int:
    """JavaScript's ``Math.round``: the nearest integer, halves towards +infinity (exact: no ``x + 0.5``)."""
    low = math.floor(x)
    return int(low + 1 if x - low >= 0.5 else low)


def fairly_allocate_credit(credit: Sequence[float], value: int, rand: Callable[[], float]) -> list[int]:
    """Integer shares of ``value`` in proportion to ``credit`` (spec "fairly allocate credit").

    ``rand`` draws the uniforms on [0, 1), one per pair of entries that are not both integral."""
    if not credit:
        raise InvalidParameters("credit must not be empty")
    sum_credit = 0.0
    for item in credit:  # a left fold, like the reference's reduce (not fsum)
        sum_credit += float(item)
    rounded = [(value * float(item)) / sum_credit for item in credit]
    idx1 = 0
    for n in range(1, len(rounded)):
        idx2 = n
        frac1 = rounded[idx1] - math.floor(rounded[idx1])
        frac2 = rounded[idx2] - math.floor(rounded[idx2])
        if frac1 == 0 and frac2 == 0:
            continue
        if frac1 + frac2 > 1:
            incr1, incr2 = 1 - frac1, 1 - frac2
        else:
            incr1, incr2 = -frac1, -frac2
        p1 = incr2 / (incr1 + incr2)
        r = rand()
        if not 0 <= r < 1:
            raise InvalidParameters(f"credit rounding needs a uniform on [0, 1), got {r!r}")
        if r < p1:
            incr = incr1
            idx1, idx2 = idx2, idx1
        else:
            incr = incr2
        rounded[idx2] += incr
        rounded[idx1] -= incr
    return [js_round(x) for x in rounded]


def fill_histogram(ordered: Sequence[tuple[int, int, int]], histogram_size: int, value: int,
                   credit: Sequence[float], rand: Callable[[], float]) -> list[int]:
    """"Fill a histogram with last-n-touch attribution" over the matched impressions ``ordered``:
    ``(priority, timestamp, histogram_index)`` in the order they were matched.

    The impressions are sorted by priority, then timestamp, both descending (stable: ties keep the
    matching order); the first N = min(|credit|, |impressions|) get ``fairly_allocate_credit`` of
    the first N credits; an index at or beyond ``histogram_size`` drops its share."""
    if not ordered:
        raise InvalidParameters("fill_histogram needs at least one impression")
    ranked = sorted(ordered, key=lambda imp: (-imp[0], -imp[1]))
    n = min(len(credit), len(ranked))
    shares = fairly_allocate_credit(credit[:n], value, rand)
    histogram = [0] * histogram_size
    for (_, _, index), share in zip(ranked[:n], shares, strict=True):
        if index < histogram_size:
            histogram[index] += share
    return histogram
