"""The L-inf search's alternations from all starts in lockstep (issue 30) give bit for bit what the
one-point steps give: ``c_steps`` is ``c_step`` per (start, query), ``terms``/``total`` are
``bias_at``/``var_factor``/``value``, and ``solve_linf`` is the plain loop over the starts (written
out below from the model's one-point methods, as the search ran before)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from araopt.optimize import linf_search as search
from araopt.optimize.linf_search import LinfModel, QueryModel, linf_model, prepare_search, solve_linf
from araopt.optimize.statistics import StatisticsSpec, compute_statistics_in_memory
from factories import small_d2


def _plain_alternate(model: LinfModel, c: np.ndarray, alpha: np.ndarray, max_iter: int = 200):
    best = model.value(c, alpha)
    for _ in range(max_iter):
        alpha = model.alpha_step(c)
        c = np.array([model.c_step(q, alpha[q])[0] for q in range(model.d)])
        val = model.value(c, alpha)
        if val >= best * (1 - 1e-12):
            best = min(best, val)
            break
        best = val
    return c, alpha, best


def _plain_solve(model: LinfModel, starts):
    d = model.d
    best = (None, None, np.inf)
    for c0 in starts:
        c, alpha, val = _plain_alternate(model, np.asarray(c0, dtype=np.float64), np.full(d, 1.0 / d))
        c2 = search.profile_polish(model, c)
        c2, alpha2, val2 = _plain_alternate(model, c2, model.alpha_step(c2))
        if val2 < val:
            c, alpha, val = c2, alpha2, val2
        if val < best[2]:
            best = (c, alpha, val)
    return best


def _query(rng: np.random.Generator, size: int, flat: bool) -> QueryModel:
    """A query model on ``size`` grid points; ``flat``: constant bias and no rounding count (every
    candidate of every segment ties)."""
    g = np.sort(rng.random(size) * 10 ** rng.uniform(-2, 4)) + np.arange(size) * 1e-3
    if flat:
        return QueryModel(g, np.full(size, 2.0), np.zeros(size - 1), np.zeros(size - 1), np.zeros(size), 0.0)
    bias = np.cumsum(rng.random(size))[::-1] * 10 ** rng.uniform(-3, 3)
    q1 = rng.normal(size=size - 1) * (rng.random(size - 1) < 0.8)  # some segments linear or constant
    q2 = rng.random(size - 1) * (rng.random(size - 1) < 0.8)
    rho = np.cumsum(rng.random(size) * (rng.random(size) < 0.7)) * rng.uniform(0, 5)
    return QueryModel(g, bias, q1, q2, rho, float(rng.random()))


def _model(seed: int, d: int, flat: bool = False) -> LinfModel:
    rng = np.random.default_rng(seed)
    queries = tuple(_query(rng, int(rng.integers(2, 40)), flat) for _ in range(d))
    return LinfModel(int(rng.integers(1, 21)), "relaxed" if rng.random() < 0.2 else "exact",
                      float(rng.uniform(0.5, 16)), queries, float(rng.random()))


def _same(a, b) -> bool:
    return np.array_equal(np.asarray(a), np.asarray(b))


@given(seed=st.integers(0, 2**32 - 1), d=st.integers(1, 9), k=st.integers(1, 6))
def test_batched_c_steps_are_the_one_point_steps(seed, d, k):
    model = _model(seed, d)
    rng = np.random.default_rng(seed + 1)
    alpha = rng.dirichlet(np.ones(d), k) if d > 1 else np.ones((k, 1))
    alpha[0] = 1.0 / d  # the paper's equal split (a start of every search)
    got = model.c_steps(alpha)
    assert _same(got, [[model.c_step(q, a[q])[0] for q in range(d)] for a in alpha])


@given(seed=st.integers(0, 2**32 - 1), d=st.integers(1, 9), k=st.integers(1, 6))
def test_batched_terms_and_values_are_the_one_point_ones(seed, d, k):
    model = _model(seed, d)
    rng = np.random.default_rng(seed + 2)
    c = np.array([[q.g[0] + (q.g[-1] - q.g[0]) * rng.uniform(-0.1, 1.1) for q in model.queries] for _ in range(k)])
    c[0] = [q.g[len(q.g) // 2] for q in model.queries]  # on a grid point
    alpha = rng.dirichlet(np.ones(d), k)
    bias, factor = model.terms(c)
    assert _same(bias, [[model.queries[q].bias_at(row[q]) for q in range(d)] for row in c])
    assert _same(factor, [[model.var_factor(q, row[q]) for q in range(d)] for row in c])
    assert _same(model.total(bias, factor, alpha), [model.value(row, a) for row, a in zip(c, alpha, strict=True)])
    assert _same(search.split_rows(factor), [model.alpha_step(row) for row in c])


@given(seed=st.integers(0, 2**32 - 1), d=st.integers(2, 5), starts=st.integers(1, 5))
def test_lockstep_search_is_the_plain_search(seed, d, starts):
    model = _model(seed, d)
    rng = np.random.default_rng(seed + 3)
    points = [np.array([q.g[rng.integers(len(q.g))] * rng.uniform(0.5, 1.5) for q in model.queries])
              for _ in range(starts)]
    c, alpha, value = solve_linf(model, points)
    want = _plain_solve(model, points)
    assert _same(c, want[0]) and _same(alpha, want[1]) and value == want[2]


def test_ties_go_to_the_first_candidate_and_segment():
    """Every candidate of every segment has the same value: c_step takes the first segment's start."""
    model = _model(5, 3, flat=True)
    got = model.c_steps(np.array([[0.2, 0.3, 0.5], [1 / 3, 1 / 3, 1 / 3]]))
    assert _same(got, [[q.g[0] for q in model.queries]] * 2)
    assert _same(got[0], [model.c_step(q, a)[0] for q, a in enumerate([0.2, 0.3, 0.5])])


@pytest.mark.parametrize("count_limit", [1, 2, 3, 5, 8])
def test_lockstep_search_on_real_statistics_is_the_plain_search(count_limit):
    conv = small_d2(4000)
    stats = compute_statistics_in_memory(conv, StatisticsSpec(("s",), conv.value_columns))
    ctx = prepare_search(stats)
    for kind in ("exact", "relaxed"):
        model = linf_model(ctx, count_limit, kind, 4.0)
        q99 = np.array([stats.quantile(q, 0.99) for q in range(2)])
        points = [q99, *model.c_steps(np.array([[0.5, 0.5], [1.0, 1.0]]))]
        assert _same(points[1], [model.c_step(q, 0.5)[0] for q in range(2)])
        c, alpha, value = solve_linf(model, points)
        want = _plain_solve(model, points)
        assert _same(c, want[0]) and _same(alpha, want[1]) and value == want[2]


def test_squares_are_the_one_point_products():
    """x * x of a float, as the one-point steps square a budget fraction: ``pow(x, 2)`` is not
    portable (libm's differs from the product for ~0.1 % of values, numpy 2.4's ``np.power`` for ~5 %)."""
    x = np.random.default_rng(0).random(20_000) * 2
    assert _same(search._squares(x), [v * v for v in x.tolist()])
