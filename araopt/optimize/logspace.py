"""log-sum-exp of real float arrays, the same bits as ``scipy.special.logsumexp`` at a fraction of its cost.

The slice-retention posterior (``optimize.slice_retention``, the privacy-safe tuner's model) reduces
(slices x grid x grid) arrays in logs for every grouping and spread of its hyperprior: scipy's
array-API wrapper exponentiates the whole input twice (once for the non-finite fallback, whether any
output needs it or not), copies it twice more and dispatches through several layers per call. This
is its real-input, unweighted algorithm step for step (the same element operations on arrays of the
same shapes, so the same reductions in the same order): the maximum along the axis is taken out and
counted (its ties each contribute exp(0) = 1 exactly), the rest summed as exp(a - max), and
log1p(s / count) + log(count) + max returned; an output that comes out non-finite (every term -inf,
a +inf or a nan term) is log(sum(exp(a))), computed only when some output needs it. The tests check
the bits against scipy on random arrays with ties, -inf, +inf and nan terms.
"""
from __future__ import annotations

import numpy as np


def logsumexp(a: np.ndarray, axis: int | None = None, keepdims: bool = False) -> np.ndarray:
    """log(sum(exp(a))) along ``axis`` (all elements when None) of a real array (float64, or promoted
    to it), without overflow; ``keepdims`` as numpy's reductions."""
    a = np.asarray(a)
    if not np.issubdtype(a.dtype, np.floating):
        a = a.astype(np.float64)
    if a.ndim == 0:
        a = a.reshape(1)
    axes = tuple(range(a.ndim)) if axis is None else axis
    if a.size == 0:
        shape = np.asarray(a.shape)
        shape[list(np.atleast_1d(axes))] = 1
        out = np.full(tuple(shape), -np.inf, dtype=a.dtype)
    else:
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            top = np.max(a, axis=axes, keepdims=True)
            at_top = a == top
            count = np.sum(at_top.astype(a.dtype), axis=axes, keepdims=True, dtype=a.dtype)
            rest = np.sum(np.exp(np.where(at_top, -np.inf, a) - top), axis=axes, keepdims=True, dtype=a.dtype)
            rest = np.where(rest == 0, rest, rest / count)
            out = np.log1p(rest) + np.log(count) + top
            finite = np.isfinite(out)
            if not finite.all():  # every term -inf, or an inf / nan term: scipy's plain fallback there
                plain = np.log(np.sum(np.exp(a), axis=axes, keepdims=True))
                out = np.where(finite, out, plain)
    if not keepdims:
        out = np.squeeze(out, axis=axes)
    return out[()] if out.ndim == 0 else out
