"""The project's log-sum-exp (``optimize.logspace``) returns scipy's bits: the slice-retention
posterior moved to it for speed, and the privacy-safe tuner's seeded outputs must not move."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import logsumexp as scipy_logsumexp

from araopt.optimize.logspace import logsumexp

SPECIAL = (-np.inf, np.inf, np.nan, 0.0, -0.0)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


@st.composite
def arrays(draw: st.DrawFn) -> np.ndarray:
    """Real arrays of 1-3 axes with ties (values on a coarse grid), far-apart values and, in some
    rows, -inf, +inf and nan terms."""
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=3)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    a = rng.normal(0.0, draw(st.sampled_from([1.0, 30.0, 800.0])), size=shape)
    if draw(st.booleans()):
        a = np.round(a)  # ties at the maximum
    specials = draw(st.integers(0, a.size))
    flat = a.reshape(-1)
    for i in rng.choice(a.size, size=specials, replace=False):
        flat[i] = SPECIAL[draw(st.integers(0, len(SPECIAL) - 1))] if draw(st.booleans()) else -np.inf
    return a


@settings(max_examples=300, deadline=None)
@given(arrays(), st.data())
def test_logsumexp_has_scipys_bits(a: np.ndarray, data: st.DataObject) -> None:
    axis = data.draw(st.sampled_from([None, *range(-a.ndim, a.ndim)]))
    keepdims = data.draw(st.booleans())
    with np.errstate(all="ignore"):
        expected = scipy_logsumexp(a, axis=axis, keepdims=keepdims)
    assert same_bits(logsumexp(a, axis=axis, keepdims=keepdims), expected)


@pytest.mark.parametrize("a", [np.full((3, 4), -np.inf), np.array([[1.0, 1.0, -np.inf], [np.inf, 2.0, 1.0]]),
                               np.array([[np.nan, 0.0], [-np.inf, 5.0]]), np.arange(12.0).reshape(3, 4) * 300,
                               np.array(3.0), np.arange(5)])
def test_logsumexp_edge_cases_have_scipys_bits(a: np.ndarray) -> None:
    for axis in [None, *range(a.ndim)]:
        for keepdims in (False, True):
            with np.errstate(all="ignore"):
                expected = scipy_logsumexp(a, axis=axis, keepdims=keepdims)
            assert same_bits(logsumexp(a, axis=axis, keepdims=keepdims), expected), (a, axis, keepdims)


def test_logsumexp_over_the_middle_axis_of_the_posteriors_shape() -> None:
    """The posterior's reduction (the middle axis of a slices x grid x grid array), and its value."""
    a = np.random.default_rng(3).normal(size=(7, 43, 43)) * 50
    assert same_bits(logsumexp(a, axis=1), scipy_logsumexp(a, axis=1))
    assert np.allclose(logsumexp(a, axis=1), np.log(np.exp(a).sum(axis=1)))


def test_logsumexp_with_tied_maxima_has_scipys_bits() -> None:
    """Rows whose maximum is reached 2-4 times (log of the count added in scipy's order)."""
    rng = np.random.default_rng(7)
    a = rng.normal(0.0, 40.0, size=(20_000, 9))
    ties = rng.integers(2, 5, size=len(a))
    for row, k in enumerate(ties):
        a[row, rng.choice(9, size=k, replace=False)] = a[row].max() + rng.uniform(0.0, 3.0)
    assert same_bits(logsumexp(a, axis=1), scipy_logsumexp(a, axis=1))
    assert same_bits(logsumexp(a.T, axis=0), scipy_logsumexp(a.T, axis=0))
