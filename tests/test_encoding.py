"""Encoders (Alg. 2, Alg. 5, baseline) and randomized rounding, as specifications."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from araopt import Params, QueryParams, encode, randomized_round
from araopt.encoding import expected_contribution

GAMMA = 65536


def du_penc_params():
    """Sec. 4.1: C = 2, C_1 = 2 items, C_2 = $30, alpha_1 = alpha_2 = 0.5."""
    return Params(count_limit=2, encoding="linf", epsilon=8.0, slice_columns=("campaign",),
                  queries=(QueryParams("items", 2.0, 0.5), QueryParams("value", 30.0, 0.5)))


def test_paper_worked_example_z1():
    # z1 = (3 items, $21): items clip to 2 -> 16384; value 21/30 * 16384 = 11468.8 -> 11468 or 11469
    outs = {tuple(encode(np.array([[3.0, 21.0]]), du_penc_params(), np.random.default_rng(s))[0]) for s in range(200)}
    assert outs == {(16384, 11469, 4915), (16384, 11468, 4916)}


def test_randomized_rounding_probabilities():
    rng = np.random.default_rng(1)
    draws = randomized_round(np.full(200_000, 11468.8), rng.random(200_000))
    assert set(np.unique(draws)) == {11468, 11469}
    p = (draws == 11469).mean()
    assert abs(p - 0.8) < 5 * np.sqrt(0.8 * 0.2 / 200_000)
    assert (randomized_round(np.array([5.0, 0.0]), np.array([0.999, 0.999])) == [5, 0]).all()


values_strategy = hnp.arrays(np.float64, st.tuples(st.integers(1, 40), st.integers(1, 3)),
                             elements=st.floats(0, 1e6, allow_nan=False, allow_infinity=False))


def make_params(encoding, d, count_limit, thresholds, rounding="floor"):
    thresholds = list(thresholds)[:d] + [1.0] * max(0, d - len(thresholds))
    if encoding == "l1":
        qs = tuple(QueryParams(f"q{i}", thresholds[i]) for i in range(d))
        return Params(count_limit=count_limit, encoding="l1", epsilon=1.0, slice_columns=(), queries=qs, l1_rounding=rounding)
    if encoding == "baseline":
        qs = tuple(QueryParams(f"q{i}", thresholds[i], 1.0 / (d + 1)) for i in range(d))
        return Params(count_limit=count_limit, encoding="baseline", epsilon=1.0, slice_columns=(), queries=qs,
                      count_budget_fraction=1.0 - sum(q.budget_fraction for q in qs))
    fr = np.random.default_rng(d).dirichlet(np.ones(d))
    fr[-1] = 1.0 - fr[:-1].sum()
    qs = tuple(QueryParams(f"q{i}", thresholds[i], float(fr[i])) for i in range(d))
    return Params(count_limit=count_limit, encoding="linf", epsilon=1.0, slice_columns=(), queries=qs)


thresholds_strategy = st.lists(st.floats(1e-3, 1e5), min_size=3, max_size=3)


@given(values=values_strategy, count_limit=st.integers(1, 300), thresholds=thresholds_strategy,
       encoding=st.sampled_from(["linf", "l1", "l1r", "baseline"]), seed=st.integers(0, 2**32))
def test_contributions_nonnegative_and_norm(values, count_limit, thresholds, encoding, seed):
    d = values.shape[1]
    enc, rounding = ("l1", "randomized") if encoding == "l1r" else (encoding, "floor")
    p = make_params(enc, d, count_limit, thresholds, rounding)
    w = encode(values, p, np.random.default_rng(seed))
    assert w.dtype == np.int64 and w.shape == (values.shape[0], d + 1)
    assert (w >= 0).all()
    if enc == "baseline":
        assert (w.sum(axis=1) <= GAMMA // count_limit).all()
    else:  # Lemmas 4.1 and 4.4: every contribution uses exactly floor(Gamma / C)
        assert (w.sum(axis=1) == GAMMA // count_limit).all()


@pytest.mark.parametrize("encoding", ["linf", "l1r", "baseline"])
def test_rounding_is_unbiased(encoding):
    rng = np.random.default_rng(7)
    values = rng.lognormal(1.0, 1.0, size=(50, 2))
    enc, rounding = ("l1", "randomized") if encoding == "l1r" else (encoding, "floor")
    p = make_params(enc, 2, 3, [5.0, 2.0], rounding)
    runs = np.stack([encode(values, p, rng)[:, :2] for _ in range(4000)])
    mean, sd = runs.mean(axis=0), runs.std(axis=0) + 1e-12
    expected = expected_contribution(values, p)
    assert (np.abs(mean - expected) <= 5 * sd / np.sqrt(4000) + 1e-9).all()


def test_l1_floor_is_the_papers_deterministic_version():
    p = make_params("l1", 2, 2, [10.0, 10.0])
    w = encode(np.array([[5.0, 5.0], [30.0, 10.0], [1.0, 0.0]]), p, np.random.default_rng(0))
    # v = (0.5, 0.5): |v|_1 = 1 -> u = v * 32768; (3, 1) -> /4 -> (0.75, 0.25) * 32768
    assert w.tolist() == [[16384, 16384, 0], [24576, 8192, 0], [3276, 0, 32768 - 3276]]


def test_bad_values_are_refused():
    p = du_penc_params()
    rng = np.random.default_rng(0)
    for bad, msg in [([[np.nan, 1.0]], "finite"), ([[np.inf, 1.0]], "finite"), ([[-1.0, 1.0]], "non-negative"),
                     ([[1.0, 2.0, 3.0]], "columns")]:
        with pytest.raises(ValueError, match=msg):
            encode(np.array(bad), p, rng)
    with pytest.raises(ValueError, match="rng"):
        encode(np.array([[1.0, 1.0]]), p)
