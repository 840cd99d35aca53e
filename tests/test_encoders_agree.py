"""Alg. 3 / Alg. 6 / the baseline written twice, tested as one: the numpy encoder (``encode``, batches)
and the ad-server encoder (``TriggerEncoder``, one record in pure Python) read one ``EncoderTable`` and
return the same integers under the same uniforms: for drawn encodings, Gamma, C (within ARA's 20
reports per source), clip thresholds, budget fractions, L1 roundings and finite values (fast lane), and
for every point of the rounding grid and its neighbours, at every C from 1 to 20 (slow lane)."""
from __future__ import annotations

import math
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from araopt import KeyDomain, Params, QueryParams, encode
from araopt.ara.registrations import (
    ARA_MAX_REPORTS_PER_SOURCE,
    ARA_MAX_VALUE,
    TriggerEncoder,
    validate_trigger_registration,
)
from araopt.constants import MAX_CLIP_THRESHOLD
from araopt.mechanism.encoding import EncoderTable, count_scale, query_scales

MAX_FLOAT = sys.float_info.max
TINY = 5e-324  # the smallest subnormal
LAST_UNIFORM = 1.0 - 2.0**-53
KINDS = ("linf", "baseline", "l1-floor", "l1-randomized")


def _params(kind: str, gamma: int, count_limit: int, thresholds: list[float], weights: list[int]) -> Params:
    """Valid parameters by construction: every fraction alpha >= 1.0001 C / Gamma (scale >= 1), the
    rest split by ``weights``; fractions sum to 1 up to float rounding."""
    d = len(thresholds)
    if kind.startswith("l1"):
        return Params(count_limit=count_limit, encoding="l1", epsilon=1.0, slice_columns=("s",),
                      contribution_budget=gamma, l1_rounding=kind.split("-")[1],
                      queries=tuple(QueryParams(f"q{i}", t) for i, t in enumerate(thresholds)))
    k = d + (kind == "baseline")
    floor = 1.0001 * count_limit / gamma
    rest = 1.0 - k * floor
    total = sum(weights[:k])
    fractions = [floor + rest * w / total for w in weights[:k]]
    fractions[-1] = 1.0 - sum(fractions[:-1])  # the sum is 1 within a few ulps
    extra = {"count_budget_fraction": fractions.pop()} if kind == "baseline" else {}
    return Params(count_limit=count_limit, encoding=kind, epsilon=1.0, slice_columns=("s",), contribution_budget=gamma,
                  queries=tuple(QueryParams(f"q{i}", t, a) for i, (t, a) in enumerate(zip(thresholds, fractions,
                                                                                          strict=True))), **extra)


clip_thresholds = st.one_of(  # every clip a parameter file may hold (at most MAX_CLIP_THRESHOLD)
    st.floats(min_value=TINY, max_value=MAX_CLIP_THRESHOLD, allow_nan=False, allow_infinity=False),
    st.sampled_from([TINY, 2.2250738585072014e-308, 1e-300, 0.01, 1.0, 3.0, 1e11, MAX_CLIP_THRESHOLD]),
)
uniform = st.one_of(st.floats(0.0, 1.0, exclude_max=True), st.sampled_from([0.0, 0.5, LAST_UNIFORM]))


@st.composite
def configurations(draw):
    kind = draw(st.sampled_from(KINDS))
    d = draw(st.integers(1, 19))  # d + 1 aggregation keys per source, ARA allows 20
    k = d + (kind == "baseline")
    gamma = draw(st.one_of(st.just(65536), st.integers(2 * k, 65536)))
    high = gamma if kind.startswith("l1") else max(1, int(gamma / (1.0002 * k)))
    # ARA sends at most 20 reports per source, so C > 20 cannot be registered (TriggerEncoder refuses it)
    count_limit = draw(st.integers(1, min(ARA_MAX_REPORTS_PER_SOURCE, high)))
    thresholds = draw(st.lists(clip_thresholds, min_size=d, max_size=d))
    weights = draw(st.lists(st.integers(1, 1000), min_size=k, max_size=k))
    return _params(kind, gamma, count_limit, thresholds, weights)


@st.composite
def records(draw, params: Params, n: int):
    """Values of ``n`` records: any finite value, and values on and next to the thresholds and the
    rounding grid (where a difference in floating-point order would change a rounded integer)."""
    d = params.num_queries
    scales = query_scales(params)
    rows = []
    for _ in range(n):
        row = []
        for t, scale in zip((q.clip_threshold for q in params.queries), scales, strict=True):
            on_grid = draw(st.integers(0, int(scale))) / float(scale) * t
            row.append(draw(st.one_of(
                st.floats(0.0, MAX_FLOAT, allow_nan=False, allow_infinity=False),
                st.sampled_from([0.0, TINY, MAX_FLOAT, t, math.nextafter(t, 0.0), _finite(math.nextafter(t, math.inf))]),
                st.sampled_from([on_grid, math.nextafter(on_grid, 0.0), _finite(math.nextafter(on_grid, math.inf))]),
            )))
        rows.append(row)
    uniforms = draw(st.lists(st.lists(uniform, min_size=d, max_size=d), min_size=n, max_size=n))
    return np.array(rows, dtype=np.float64), np.array(uniforms, dtype=np.float64).reshape(n, d)


def _finite(x: float) -> float:
    """The neighbour of the largest finite value is infinity: values are finite, so stay at the largest."""
    return min(x, MAX_FLOAT)


def _encoder(params: Params) -> TriggerEncoder:
    domain = KeyDomain.from_slice_values(("s",), {"s": np.array([0])}, params.query_columns,
                                         baseline=params.encoding == "baseline")
    return TriggerEncoder(params, domain)


@given(params=configurations(), data=st.data())
def test_the_ad_server_encoder_returns_what_the_numpy_encoder_returns(params, data):
    n = data.draw(st.integers(1, 6))
    values, uniforms = data.draw(records(params, n))
    want = encode(values, params, uniforms=uniforms)  # the batch at once: numpy's per-row sums included
    enc = _encoder(params)
    names = params.query_columns
    got = np.array([enc.contributions(dict(zip(names, row, strict=True)), uniforms=uniforms[i].tolist())
                    for i, row in enumerate(values.tolist())], dtype=np.int64)
    assert np.array_equal(got, want), (got, want)
    # what both promise: non-negative, within the per-conversion budget; the bottom key fills it (L-inf, L1)
    assert (want >= 0).all()
    if params.encoding == "baseline":
        assert (want[:, -1] == count_scale(params)).all()
        assert (want[:, :-1] <= query_scales(params)).all()
    else:
        assert (want.sum(axis=1) == params.per_conversion_budget).all()
    registration = enc.registration(dict(zip(names, values[0].tolist(), strict=True)), uniforms=uniforms[0].tolist())
    validate_trigger_registration(registration)
    assert all(1 <= v <= ARA_MAX_VALUE for v in registration["aggregatable_values"].values())


@pytest.mark.parametrize("kind", KINDS)
def test_both_encoders_read_one_table(kind):
    params = _params(kind, 65536, 3, [4.0, 60.0], [3, 7, 2])
    table = EncoderTable.of(params)
    assert table.query_scales == tuple(int(s) for s in query_scales(params))
    assert table.budget == 65536 // 3 and table.l1_floor_scale == 65536 / 3
    assert table.count_scale == (count_scale(params) if kind == "baseline" else None)
    enc = _encoder(params)
    assert enc.table == table
    assert enc.num_uniforms == {"linf": 2, "baseline": 2, "l1-floor": 0, "l1-randomized": 1}[kind]


def test_extreme_values_are_clipped_or_shrunk_never_overflowed():
    """The largest finite value, with the smallest threshold (and the largest a file may hold): L-inf clips
    to the scale, L1 keeps the direction of a vector whose norm overflows (both encoders)."""
    for kind in KINDS:
        params = _params(kind, 65536, 2, [TINY, MAX_CLIP_THRESHOLD], [1, 1, 1])
        values = np.array([[MAX_FLOAT, MAX_FLOAT], [MAX_FLOAT, 0.0], [0.0, MAX_FLOAT]])
        uniforms = np.full((3, 2), LAST_UNIFORM)
        want = encode(values, params, uniforms=uniforms)
        enc = _encoder(params)
        got = np.array([enc.contributions({"q0": a, "q1": b}, uniforms=[LAST_UNIFORM] * 2) for a, b in values.tolist()])
        assert np.array_equal(got, want)
        assert (want >= 0).all()
        if params.encoding != "l1":
            assert want[1, 0] == query_scales(params)[0]  # clipped: exactly the scale (Lemma 4.1)
        else:
            assert want[1, 0] == params.per_conversion_budget  # one overflowing coordinate takes the whole budget


def _grid_records(params: Params, query: int, rng: np.random.Generator) -> np.ndarray:
    """Every point k / scale * C_l of one query's rounding grid (k = 0..scale), its two float neighbours
    and the threshold's, the other queries at random values below, at and above their thresholds."""
    t = params.queries[query].clip_threshold
    scale = int(query_scales(params)[query])
    grid = np.arange(scale + 1, dtype=np.float64) / scale * t
    column = np.concatenate([grid, np.nextafter(grid, 0.0), np.nextafter(grid, np.inf),
                             [t, math.nextafter(t, 0.0), math.nextafter(t, math.inf), MAX_FLOAT]])
    thresholds = np.array([q.clip_threshold for q in params.queries])
    values = rng.choice([0.0, 0.5, 1.0, 3.0], (len(column), params.num_queries)) * thresholds
    values[:, query] = column
    return values


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_the_encoders_agree_on_every_point_of_the_rounding_grid(kind):
    """Exhaustive over the integers a record can round to: at every C from 1 to ARA's 20, every value
    on each query's rounding grid (where a different order of floating-point operations would change
    the rounded integer) and its neighbours, with the smallest and the largest uniform. L1 treats its
    queries alike (one scale, floor(Gamma / C)), so one query's grid covers it; floor L1 uses no uniform."""
    rng = np.random.default_rng(7)
    for count_limit in range(1, ARA_MAX_REPORTS_PER_SOURCE + 1):
        params = _params(kind, 65536, count_limit, [0.37, 1.0, 1234.5], [5, 3, 2, 1])
        enc = _encoder(params)
        names = params.query_columns
        for query in range(1 if params.encoding == "l1" else params.num_queries):
            values = _grid_records(params, query, rng)
            for u in ((0.0,) if kind == "l1-floor" else (0.0, LAST_UNIFORM)):
                uniforms = np.full(values.shape, u)
                want = encode(values, params, uniforms=uniforms)
                got = [enc.contributions(dict(zip(names, row, strict=True)), uniforms=list(uniforms[i]))
                       for i, row in enumerate(values.tolist())]
                assert np.array_equal(np.array(got, dtype=np.int64), want), (count_limit, query, u)
                assert (want >= 0).all()
