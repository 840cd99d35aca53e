"""Encoders (Alg. 3, Alg. 6, baseline) and randomized rounding, as specifications."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from araopt import Params, QueryParams, encode, randomized_round
from araopt.constants import MAX_CLIP_THRESHOLD
from araopt.mechanism.encoding import expected_contribution
from factories import du_penc_params

GAMMA = 65536


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
        return Params(count_limit=count_limit, encoding="l1", epsilon=1.0, slice_columns=(), queries=qs,
                      l1_rounding=rounding)
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


@pytest.mark.statistical
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


# ---- extreme uniforms, the uniforms= path, chunking, C not dividing Gamma -------------------------
import araopt.mechanism.encoding as encoding_module  # noqa: E402
from araopt.mechanism.encoding import clip_randomized_round, count_scale, query_scale, query_scales, rounding_variance  # noqa: E402

LARGEST_BELOW_ONE = np.nextafter(1.0, 0.0)
ENCODINGS = [("linf", "floor"), ("l1", "floor"), ("l1", "randomized"), ("baseline", "floor")]
EXTREME_VALUES = np.array([[0.0, 0.0, 0.0], [2.0, 30.0, 7.0], [1e300, 1e300, 1e300], [5e-324, 1e-300, 0.0],
                           [1.9999999999, 29.999999999, 6.9999999], [3.0, 21.0, 1.0], [2.0, 0.0, 0.0],
                           [0.7, 11.0, 6.5], [1e-9, 29.0, 1e6]])


def params_for(encoding, rounding="floor", count_limit=3, budget=GAMMA):
    """Three value queries (C_l = 2, 30, 7); L-inf fractions 0.2/0.5/0.3, baseline 0.2/0.3/0.1 + count 0.4."""
    thresholds = (2.0, 30.0, 7.0)
    fractions = {"linf": (0.2, 0.5, 0.3), "baseline": (0.2, 0.3, 0.1)}.get(encoding, (None,) * 3)
    qs = tuple(QueryParams(f"q{i}", t, f) for i, (t, f) in enumerate(zip(thresholds, fractions, strict=True)))
    return Params(count_limit=count_limit, encoding=encoding, epsilon=1.0, slice_columns=(), queries=qs,
                  l1_rounding=rounding, count_budget_fraction=0.4 if encoding == "baseline" else None,
                  contribution_budget=budget)


def width(p):
    return 1 if p.encoding == "l1" else p.num_queries


@pytest.mark.parametrize("encoding, rounding", ENCODINGS)
@pytest.mark.parametrize("u", [0.0, LARGEST_BELOW_ONE])
@pytest.mark.parametrize("count_limit", [1, 2, 3, 7])
def test_extreme_uniforms_keep_contributions_integer_non_negative_and_within_the_norm(encoding, rounding, u, count_limit):
    """Lemmas 4.1 / 4.4: w >= 0, int64, row sum exactly floor(Gamma/C) (L-inf, L1) or at most the
    baseline's sum of scales; every value query within one unit of its mean E w (RR / CRR)."""
    p = params_for(encoding, rounding, count_limit)
    n = len(EXTREME_VALUES)
    w = encode(EXTREME_VALUES, p, uniforms=np.full((n, 3), u))
    assert w.dtype == np.int64 and w.shape == (n, 4)
    assert (w >= 0).all()
    budget = GAMMA // count_limit
    if encoding == "baseline":
        assert (w[:, 3] == count_scale(p)).all()
        assert (w.sum(axis=1) <= query_scales(p).sum() + count_scale(p)).all()
        assert query_scales(p).sum() + count_scale(p) <= budget
    else:
        assert (w.sum(axis=1) == budget).all()
    mean = expected_contribution(EXTREME_VALUES, p)
    assert (np.abs(w[:, :3] - mean) <= 1).all()
    if encoding in ("linf", "baseline"):  # RR: U = 0 rounds every fraction up, U -> 1 rounds down
        assert (w[:, :3] == (np.ceil(mean) if u == 0.0 else np.floor(mean))).all()


def test_randomized_rounding_at_the_extreme_uniforms():
    omega = np.array([0.0, 0.5, 11468.8, 16384.0, 3.0 - 2**-40])
    assert randomized_round(omega, np.zeros(5)).tolist() == [0, 1, 11469, 16384, 3]
    assert randomized_round(omega, np.full(5, LARGEST_BELOW_ONE)).tolist() == [0, 0, 11468, 16384, 2]
    assert randomized_round(omega, np.full(5, 0.8)).tolist() == [0, 0, 11468, 16384, 3]  # up iff U < frac
    assert randomized_round(np.array([2.5, 2.5]), np.array([0.5, np.nextafter(0.5, 0)])).tolist() == [2, 3]
    assert randomized_round(omega, np.zeros(5)).dtype == np.int64


def test_l1_randomized_uses_one_uniform_per_record_systematically():
    """w_l = floor(S_l + U) - floor(S_{l-1} + U) with S the prefix sums of u = v / max(1, |v|_1) * floor(Gamma/C)."""
    p = params_for("l1", "randomized", count_limit=2)  # floor(Gamma / C) = 32768
    vals = np.array([[0.2, 0.0, 0.0]])  # v = (0.1, 0, 0): u_1 = 3276.8
    for u, first in [(0.0, 3276), (0.19, 3276), (0.2, 3277), (LARGEST_BELOW_ONE, 3277)]:
        w = encode(vals, p, uniforms=np.array([[u]]))
        assert w.tolist() == [[first, 0, 0, 32768 - first]], u
    # u = (16384, 8192, 8192) exactly: integers are not rounded (in floats, floor(16384 + U) is 16385
    # for U within 2^-39 of 1; ara.TriggerEncoder clamps it at the budget)
    for u in (0.0, 0.5, 0.9):
        assert encode(np.array([[2.0, 15.0, 3.5]]), p, uniforms=np.array([[u]])).tolist() == [[16384, 8192, 8192, 0]]


def test_l1_floor_with_a_count_limit_that_does_not_divide_gamma():
    """The paper's L1 (Alg. 6 encoding): S = Gamma / C = 21845.33 for C = 3, w_l = floor(u_l),
    bottom = floor(Gamma/C) - sum."""
    p = params_for("l1", "floor", count_limit=3)
    vals = np.array([[2.0, 0.0, 0.0], [1.0, 15.0, 0.0], [2.0, 30.0, 7.0], [0.2, 0.0, 0.0], [4.0, 0.0, 0.0]])
    w = encode(vals, p, np.random.default_rng(0))
    s = GAMMA / 3
    assert w.tolist() == [
        [21845, 0, 0, 0],                       # v = (1, 0, 0): floor(21845.33)
        [10922, 10922, 0, 1],                   # (0.5, 0.5, 0): floor(10922.67) twice, bottom takes the rest
        [7281, 7281, 7281, 2],                  # (1, 1, 1) / 3: floor(7281.78)
        [int(np.floor(0.1 * s)), 0, 0, 21845 - int(np.floor(0.1 * s))],  # 2184
        [21845, 0, 0, 0],                       # (2, 0, 0) shrinks to (1, 0, 0)
    ]
    assert int(np.floor(0.1 * s)) == 2184
    assert np.array_equal(expected_contribution(vals, p), w[:, :3])
    assert not rounding_variance(vals, p).any()


@pytest.mark.parametrize("encoding, rounding", ENCODINGS)
def test_uniforms_path_equals_rng_path_given_the_same_uniforms(encoding, rounding, monkeypatch):
    """mechanism.py / ara.py pass uniforms=; rng= draws the same row-major stream chunk by chunk."""
    monkeypatch.setattr(encoding_module, "_CHUNK_ROWS", 4)
    p = params_for(encoding, rounding, count_limit=3)
    vals = np.random.default_rng(5).lognormal(1.0, 1.5, size=(11, 3))
    from_rng = encode(vals, p, np.random.default_rng(9))
    uniforms = np.random.default_rng(9).random((11, width(p)))
    assert np.array_equal(encode(vals, p, uniforms=uniforms), from_rng)
    wide = np.column_stack([uniforms, np.random.default_rng(1).random((11, 3))])[:, :3]  # extra columns ignored
    assert np.array_equal(encode(vals, p, uniforms=wide if width(p) == 1 else uniforms), from_rng)
    if rounding != "floor" or encoding != "l1":  # the uniforms are used: others give other roundings
        assert not np.array_equal(encode(vals, p, uniforms=1.0 - uniforms * 0.999 - 1e-3), from_rng)


def test_uniforms_given_as_a_vector_for_one_query():
    p = Params(count_limit=2, encoding="linf", epsilon=1.0, slice_columns=(), queries=(QueryParams("v", 30.0, 1.0),))
    vals = np.array([21.0, 21.0])  # 1-D values: one query; omega = 22937.6
    assert encode(vals, p, uniforms=np.array([0.5, 0.7])).tolist() == [[22938, 32768 - 22938], [22937, 32768 - 22937]]


@pytest.mark.parametrize("encoding, rounding", ENCODINGS)
def test_results_do_not_depend_on_the_chunk_size(encoding, rounding, monkeypatch):
    p = params_for(encoding, rounding, count_limit=2)
    vals = np.random.default_rng(6).lognormal(1.0, 1.5, size=(23, 3))
    reference = encode(vals, p, np.random.default_rng(3))
    uniforms = np.random.default_rng(4).random((23, 3))
    reference_u = encode(vals, p, uniforms=uniforms)
    for chunk in (1, 5, 22, 23):
        monkeypatch.setattr(encoding_module, "_CHUNK_ROWS", chunk)
        assert np.array_equal(encode(vals, p, np.random.default_rng(3)), reference), chunk
        assert np.array_equal(encode(vals, p, uniforms=uniforms), reference_u), chunk


def test_more_rows_than_one_chunk(monkeypatch):
    n = encoding_module._CHUNK_ROWS + 5
    p = params_for("linf", count_limit=3)
    vals = np.random.default_rng(7).lognormal(1.0, 1.5, size=(n, 3))
    chunked = encode(vals, p, np.random.default_rng(8))
    monkeypatch.setattr(encoding_module, "_CHUNK_ROWS", 2 * n)
    assert np.array_equal(encode(vals, p, np.random.default_rng(8)), chunked)
    assert (chunked.sum(axis=1) == GAMMA // 3).all()


# ---- closed forms: scales, expectations, rounding variance ------------------------------------------
def test_query_scales_and_count_scale_are_floors_of_alpha_gamma_over_c():
    assert query_scales(params_for("linf", count_limit=3)).tolist() == [4369, 10922, 6553]  # floor(0.2 * 65536 / 3) ...
    assert query_scales(params_for("baseline", count_limit=3)).tolist() == [4369, 6553, 2184]
    assert count_scale(params_for("baseline", count_limit=3)) == 8738  # floor(0.4 * 65536 / 3)
    assert count_scale(params_for("linf", count_limit=3)) == 21845
    assert query_scales(params_for("l1", count_limit=3)).tolist() == [21845] * 3
    # a non-default Gamma flows through every scale
    assert query_scales(params_for("linf", count_limit=3, budget=1000)).tolist() == [66, 166, 100]
    assert count_scale(params_for("baseline", count_limit=3, budget=1000)) == 133
    assert query_scale(2, 0.5) == 16384 and query_scale(2, 0.5, 1000) == 250 and query_scale(3, 1.0) == 21845


def test_over_allocated_fractions_are_refused():
    """Lemma 4.1 needs sum_l floor(alpha_l Gamma / C) <= floor(Gamma / C); a Params that bypassed validation is refused."""
    p = params_for("linf", count_limit=1)
    object.__setattr__(p.queries[0], "budget_fraction", 0.3)  # 0.3 + 0.5 + 0.3 > 1
    with pytest.raises(ValueError, match="over-allocate"):
        query_scales(p)
    with pytest.raises(ValueError, match="over-allocate"):
        encode(np.ones((1, 3)), p, np.random.default_rng(0))


def test_expected_contribution_and_rounding_variance_closed_forms():
    vals = np.array([[3.0, 21.0, 0.0], [1.0, 45.0, 3.5]])
    linf = params_for("linf", count_limit=2)  # scales floor(alpha * 32768) = 6553, 16384, 9830
    exp = expected_contribution(vals, linf)
    assert np.allclose(exp, [[6553, 16384 * 0.7, 0], [3276.5, 16384, 4915]])
    assert np.allclose(rounding_variance(vals, linf), [[0, 0.8 * 0.2, 0], [0.25, 0, 0]])
    l1r = params_for("l1", "randomized", count_limit=2)  # v = (1.5, 0.7, 0) -> / 2.2, * 32768
    assert np.allclose(expected_contribution(vals[:1], l1r), [[1.5 / 2.2 * 32768, 0.7 / 2.2 * 32768, 0]])
    frac = np.array([1.5, 0.7, 0.0]) / 2.2 * 32768 % 1
    assert np.allclose(rounding_variance(vals[:1], l1r), [frac * (1 - frac)])
    # L1 floor: v = (0.5, 1.5, 0.5) -> / 2.5 -> (0.2, 0.6, 0.2) * 32768, floored
    assert expected_contribution(vals[1:], params_for("l1", count_limit=2)).tolist() == [[6553, 19660, 6553]]


def test_clip_randomized_round_eq_1():
    """CRR(v; C, C_l, alpha_l) = RR(floor(alpha_l Gamma / C) * min(v, C_l) / C_l): the worked example z1."""
    rounded = clip_randomized_round(np.array([21.0, 21.0, 45.0]), 2, 30.0, 0.5, np.array([0.5, 0.9, 0.0]))
    assert rounded.tolist() == [11469, 11468, 16384]
    assert clip_randomized_round(np.array([21.0]), 2, 30.0, 0.5, np.array([0.0]), contribution_budget=1000).tolist() == [175]


def test_bad_uniforms_and_shapes_are_refused():
    p = params_for("linf")
    vals = np.ones((2, 3))
    for bad in (np.full((2, 3), np.nan), np.full((2, 3), 1.0), np.full((2, 3), -0.25)):
        with pytest.raises(ValueError, match=r"uniforms must be .* on \[0, 1\).*outside"):
            encode(vals, p, uniforms=bad)
    for shape in ((3, 3), (2, 2), (2, 3, 1)):
        with pytest.raises(ValueError, match="uniforms must be"):
            encode(vals, p, uniforms=np.zeros(shape))
    with pytest.raises(ValueError, match="1-D or 2-D"):
        encode(np.ones((2, 3, 1)), p, np.random.default_rng(0))
    # NaN uniforms used to become -2^63 in the L1-randomized encoder
    with pytest.raises(ValueError, match="NaN"):
        encode(np.ones((1, 3)), params_for("l1", "randomized"), uniforms=np.array([[np.nan]]))


def test_default_gamma_is_65536_in_the_scalar_helpers():
    assert query_scale(1, 1.0) == GAMMA
    assert clip_randomized_round(np.array([5.0]), 1, 5.0, 1.0, np.array([0.5])).tolist() == [GAMMA]


def test_over_allocation_by_a_single_unit_is_refused_for_linf_and_baseline():
    p = params_for("linf", count_limit=1)  # floors 13107 + 32768 + 19660 = 65535
    object.__setattr__(p.queries[2], "budget_fraction", 19662 / GAMMA)  # -> 65537 > floor(Gamma / C)
    with pytest.raises(ValueError, match="over-allocate"):
        query_scales(p)
    b = params_for("baseline", count_limit=1)  # 13107 + 19660 + 6553 + count 26214 = 65534
    object.__setattr__(b, "count_budget_fraction", 26217 / GAMMA)  # count 26217 -> 65537
    with pytest.raises(ValueError, match="over-allocate"):
        query_scales(b)


def test_value_refusals_name_the_first_bad_entry():
    p = params_for("linf")
    with pytest.raises(ValueError, match=r"-1\.0\)? at row 0, query 1"):
        encode(np.array([[0.0, -1.0, -2.0], [1.0, 1.0, 1.0]]), p, np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"row 0, query 1"):
        encode(np.array([[0.0, np.nan, np.inf], [np.inf, 1.0, 1.0]]), p, np.random.default_rng(0))
    for f in (expected_contribution, rounding_variance):  # every entry point checks the columns
        with pytest.raises(ValueError, match="columns"):
            f(np.ones((2, 2)), params_for("l1", "floor"))
        with pytest.raises(ValueError, match="columns"):
            f(np.ones((2, 2)), p)


def test_l1_randomized_needs_one_uniform_column():
    p = params_for("l1", "randomized")
    with pytest.raises(ValueError, match=r"^uniforms must be an \(n, d\) float array on \[0, 1\): got shape \(2, 0\)"):
        encode(np.ones((2, 3)), p, uniforms=np.zeros((2, 0)))
    assert encode(np.ones((2, 3)), p, uniforms=np.zeros((2, 1))).shape == (2, 4)


@pytest.mark.parametrize("bad", [np.array([["0.5"]]), np.array([[True]]), np.array([[1.0]], dtype=object)])
def test_values_must_be_numeric_not_strings_bools_or_objects(bad):
    with pytest.raises(TypeError, match="numeric"):
        encoding_module.check_values(bad, 1)


def test_negative_value_message_prints_a_plain_number():
    with pytest.raises(ValueError, match=r"non-negative: -1\.0 at row 0, query 0"):
        encoding_module.check_values(np.array([[-1.0]]), 1)


# ---- every finite value is safe ----------------------------------------------------------------------
ANY_FINITE_VALUES = [0.0, 5e-324, 1e-300, 0.25, 1.0, 3.0, 1e300, 1e308, np.finfo(np.float64).max]
ANY_CLIP_THRESHOLDS = [1e-300, 1e-10, 0.5, 1.0, MAX_CLIP_THRESHOLD]  # (the largest a parameter file may hold)


def extreme_params(encoding, rounding, thresholds, count_limit=3):
    d = len(thresholds)
    if encoding == "l1":
        return Params(count_limit=count_limit, encoding="l1", l1_rounding=rounding, epsilon=1.0, slice_columns=(),
                      queries=tuple(QueryParams(f"q{i}", t) for i, t in enumerate(thresholds)))
    share = 0.5 if encoding == "baseline" else 1.0
    return Params(count_limit=count_limit, encoding=encoding, epsilon=1.0, slice_columns=(),
                  count_budget_fraction=0.5 if encoding == "baseline" else None,
                  queries=tuple(QueryParams(f"q{i}", t, share / d) for i, t in enumerate(thresholds)))


@given(encoding=st.sampled_from([("linf", "floor"), ("baseline", "floor"), ("l1", "floor"), ("l1", "randomized")]),
       thresholds=st.lists(st.sampled_from(ANY_CLIP_THRESHOLDS), min_size=1, max_size=3), data=st.data())
def test_every_encoder_is_safe_for_every_finite_value(encoding, thresholds, data):
    """Values up to the largest float with clip thresholds far below 1: contributions stay integers in
    [0, floor(Gamma/C)] with the exact norm (no inf / inf = NaN -> INT64_MIN), and E[w] is finite."""
    params = extreme_params(*encoding, thresholds)
    d = len(thresholds)
    values = np.array(data.draw(st.lists(st.lists(st.sampled_from(ANY_FINITE_VALUES), min_size=d, max_size=d),
                                         min_size=1, max_size=6)))
    with np.errstate(over="raise", invalid="raise", divide="raise"):  # no overflow or NaN on the way either
        w = encode(values, params, np.random.default_rng(0))
    budget = params.per_conversion_budget
    assert (w >= 0).all() and (w <= budget).all()
    if encoding[0] == "baseline":
        assert (w.sum(axis=1) <= budget).all()
    else:
        assert (w.sum(axis=1) == budget).all()
    assert np.isfinite(expected_contribution(values, params)).all()


def test_l1_keeps_the_direction_of_a_vector_that_overflows():
    """(1e308, 1e308) / 0.5 overflows: it is encoded as its direction, like (1, 1); (1e308, 1) like (1, 0)."""
    for rounding in ("floor", "randomized"):
        params = extreme_params("l1", rounding, [0.5, 0.5], count_limit=1)
        u = np.full((1, 1), 0.5)
        for huge, same_direction in (([1e308, 1e308], [1.0, 1.0]), ([1e308, 1.0], [1.0, 0.0]),
                                     ([np.finfo(np.float64).max, 0.0], [1.0, 0.0])):
            got = encode(np.array([huge]), params, uniforms=u)
            assert got.tolist() == encode(np.array([same_direction]), params, uniforms=u).tolist()
        assert encode(np.array([[1e308, 1e308]]), params, uniforms=u).tolist()[0][:2] == [32768, 32768]
