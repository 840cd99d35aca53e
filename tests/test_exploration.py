"""Exploration arms in the mechanism: a keyed share of impressions capped at other count limits and
reported on pooled keys of their own, every impression still within Gamma."""
import dataclasses

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that
from hypothesis import given
from hypothesis import strategies as st

from araopt.errors import InvalidParameters
from araopt.io.conversions import Conversions
from araopt.mechanism.bounding import bound_contributions, kept_mask
from araopt.mechanism.encoding import encode
from araopt.mechanism.exploration import EXPLORATION_BIT, Exploration, ExplorationArm, default_exploration
from araopt.mechanism.keys import KeyDomain
from araopt.mechanism.measure import encode_and_bound, histogram_rows, measure, rounding_uniforms
from araopt.mechanism.params import Params, QueryParams
from araopt.publication import exploration_frame, release_buckets
from araopt.version import ParameterVersion
from transforms.aggregate import EncodeBoundAndSum

GAMMA = 65536
EXPLORE = Exploration((ExplorationArm(1, 0.1), ExplorationArm(8, 0.1), ExplorationArm(20, 0.05)), salt=7)


def params(count_limit: int = 4, exploration: Exploration | None = EXPLORE, encoding: str = "linf") -> Params:
    return Params(count_limit=count_limit, encoding=encoding, epsilon=4.0, slice_columns=("s",),
                  queries=(QueryParams("v", 10.0, None if encoding == "l1" else 1.0),), exploration=exploration)


def log(seed: int, impressions: int = 400) -> Conversions:
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 25, impressions)
    imp = np.repeat(np.arange(impressions), sizes).astype(np.int64)
    return Conversions(imp, rng.integers(0, 10**9, len(imp)), {"s": np.repeat(rng.integers(0, 3, impressions), sizes)},
                       rng.lognormal(1.5, 1.0, (len(imp), 1)), ("v",))


def domain() -> KeyDomain:
    return KeyDomain.from_slice_values(("s",), {"s": np.arange(3)}, ("v",))


def test_arms_are_a_keyed_hash_of_the_impression_with_the_declared_shares():
    ids = np.arange(200_000)
    arm = EXPLORE.assign(ids)
    shares = np.bincount(arm + 1, minlength=4) / len(ids)
    np.testing.assert_allclose(shares, [0.75, 0.1, 0.1, 0.05], atol=0.005)
    assert np.array_equal(arm, EXPLORE.assign(ids))  # the same impression, the same arm, every day
    other = Exploration(EXPLORE.arms, salt=8).assign(ids)
    assert (other != arm).mean() > 0.3  # another salt, another assignment
    strings = EXPLORE.assign(np.array([f"id-{i}" for i in range(50_000)], dtype=object))
    assert abs((strings == -1).mean() - 0.75) < 0.01


def test_an_arms_conversions_are_encoded_at_its_count_limit_and_reported_on_its_pooled_keys():
    conv, p = log(1), params()
    contributions, kept = encode_and_bound(conv, p, simulation_seed=3)
    arm = EXPLORE.assign(conv.impression_id)
    norms = contributions.sum(axis=1)
    expected = np.where(arm < 0, GAMMA // 4, np.array([GAMMA // 1, GAMMA // 8, GAMMA // 20])[arm])
    np.testing.assert_array_equal(norms, expected)  # L-inf: every conversion costs floor(Gamma / C_arm)
    m = measure(conv, p, domain(), simulation_seed=3)
    rows = histogram_rows(conv, p, domain())
    for a in range(3):  # the arm's row: exactly its kept contributions, pooled over slices
        np.testing.assert_array_equal(m.histogram[3 + a], contributions[kept & (arm == a)].sum(axis=0))
        assert (rows[arm == a] == 3 + a).all()
    main = kept & (arm < 0)
    for j in range(3):
        np.testing.assert_array_equal(m.histogram[j], contributions[main & (conv.slices["s"] == j)].sum(axis=0))
    assert m.release.exploration is not None and m.release.exploration.estimate.shape == (3, 2)
    assert m.release.accounting.closes
    # each arm's count estimate (Alg. 4 at C_a) is close to its kept conversions
    kept_per_arm = np.array([(kept & (arm == a)).sum() for a in range(3)])
    np.testing.assert_allclose(m.release.exploration.estimate[:, 0], kept_per_arm,
                               atol=6 * m.release.exploration.std_error[:, 0].max())


def test_the_error_model_keeps_only_the_main_impressions_in_the_main_keys():
    conv, p = log(2), params()
    contributions, kept = encode_and_bound(conv, p, simulation_seed=3)
    arm = EXPLORE.assign(conv.impression_id)
    np.testing.assert_array_equal(kept_mask(conv, p, tie_breaker=conv.record_keys()), kept & (arm < 0))


@given(seed=st.integers(0, 10_000), count_limit=st.integers(1, 20), encoding=st.sampled_from(["linf", "l1"]),
       shares=st.lists(st.floats(0.01, 0.06), min_size=1, max_size=4),
       limits=st.lists(st.integers(1, 20), min_size=4, max_size=4))
def test_every_impression_stays_within_gamma_with_exploration_arms(seed, count_limit, encoding, shares, limits):
    exploration = Exploration(tuple(ExplorationArm(c, s) for c, s in zip(limits, shares, strict=False)), salt=seed)
    p = params(count_limit, exploration, encoding)
    conv = log(seed, impressions=60)
    uniforms = rounding_uniforms(conv.record_keys(), 1, seed)
    contributions, kept = encode_and_bound(conv, p, simulation_seed=seed)
    _, inverse = np.unique(conv.impression_id, return_inverse=True)
    totals = np.bincount(inverse.reshape(-1), weights=np.where(kept, contributions.sum(axis=1), 0))
    assert totals.max() <= GAMMA
    assert contributions.min() >= 0
    # the same as encoding each arm by itself and capping once (Alg. 1 over the impression)
    arm = exploration.assign(conv.impression_id)
    direct = np.zeros_like(contributions)
    for a in range(-1, exploration.num_arms):
        rows = np.flatnonzero(arm == a)
        direct[rows] = encode(conv.values[rows], p if a < 0 else p.for_arm(a), uniforms=uniforms[rows])
    np.testing.assert_array_equal(direct, contributions)
    np.testing.assert_array_equal(bound_contributions(conv.impression_id, conv.conversion_time, direct, GAMMA,
                                                      tie_breaker=conv.record_keys()), kept)


def test_arm_buckets_set_the_top_bit_and_never_meet_a_main_bucket():
    conv, p = log(3), params()
    release = measure(conv, p, domain(), simulation_seed=1).release
    buckets = release_buckets(release)
    assert len(buckets) == len(set(buckets)) == release.report.noisy.size
    main, arms = buckets[:release.domain.num_keys], buckets[release.domain.num_keys:]
    assert all(b < (1 << EXPLORATION_BIT) for b in main) and all(b >> EXPLORATION_BIT == 1 for b in arms)
    frame = exploration_frame(release)
    assert list(frame["count_limit"].unique()) == [1, 8, 20] and len(frame) == 6


def test_exploration_in_a_parameter_file_round_trips_and_bad_plans_are_refused(tmp_path):
    version = ParameterVersion(params(exploration=default_exploration()))
    version.save(tmp_path / "p.json")
    loaded = ParameterVersion.load(tmp_path / "p.json")
    assert loaded.params.exploration == default_exploration() and loaded.checksum() == version.checksum()
    with pytest.raises(InvalidParameters, match="baseline"):
        Params(count_limit=3, encoding="baseline", epsilon=1.0, slice_columns=("s",),
               queries=(QueryParams("v", 10.0, 0.5),), count_budget_fraction=0.5, exploration=EXPLORE)
    with pytest.raises(InvalidParameters, match="0.3 of the impressions"):
        Exploration((ExplorationArm(2, 0.2), ExplorationArm(3, 0.1)), salt=1)
    with pytest.raises(InvalidParameters, match="arm 0 .C = 20.*scale"):
        Params(count_limit=2, encoding="linf", epsilon=1.0, slice_columns=("s",),
               queries=(QueryParams("v", 10.0, 0.9997), QueryParams("w", 10.0, 0.0003)),
               exploration=Exploration((ExplorationArm(20, 0.01),), salt=1))


def test_attaching_arms_raises_a_fraction_alg5_left_one_unit_at_a_smaller_count_limit():
    """Alg. 5 at C = 12 (integer fractions) leaves the value query one unit, 12 / Gamma: the arm at
    C = 20 would encode it at scale floor(12 / 20) = 0 and the parameters are refused; attached with
    ``with_exploration`` it gets 20 / Gamma, taken from the largest, and every arm and the main keys
    keep a scale >= 1 (hetero-two-values at epsilon = 1 stopped privacy-safe tuning with this error)."""
    gamma = 65536
    tuned = Params(count_limit=12, encoding="linf", epsilon=1.0, slice_columns=("s",),
                   queries=(QueryParams("value", 10.0, 12 / gamma), QueryParams("items", 3.0, 1 - 12 / gamma)))
    with pytest.raises(InvalidParameters, match="arm 6 .C = 20.*scale"):
        dataclasses.replace(tuned, exploration=default_exploration())
    armed = tuned.with_exploration(default_exploration())
    assert armed.exploration == default_exploration()
    assert armed.budget_fractions == pytest.approx((20 / gamma, 1 - 20 / gamma), abs=1e-15)
    assert sum(armed.budget_fractions) == pytest.approx(1.0, abs=1e-12)
    for arm in range(len(armed.exploration.arms)):
        one = armed.for_arm(arm)
        assert all(int(a * gamma / one.count_limit) >= 1 for a in one.budget_fractions)
    assert int(armed.budget_fractions[0] * gamma / 12) == 1  # the main scale of the raised query: no lower
    # fractions every arm can encode are kept as they are; no arms, no change
    fine = tuned.with_exploration(None)
    assert fine.budget_fractions == tuned.budget_fractions and fine.exploration is None
    wide = dataclasses.replace(tuned, queries=(QueryParams("value", 10.0, 0.5), QueryParams("items", 3.0, 0.5)))
    assert wide.with_exploration(default_exploration()).budget_fractions == (0.5, 0.5)


@given(count_limit=st.integers(1, 20), k=st.lists(st.floats(1e-6, 1e6), min_size=1, max_size=4),
       limits=st.lists(st.integers(1, 40), min_size=1, max_size=7))
def test_any_tuned_fractions_take_any_arms(count_limit, k, limits):
    from araopt.optimize.search import _integer_fractions

    gamma = 65536
    alpha = _integer_fractions(np.array(k), count_limit, gamma)
    tuned = Params(count_limit=count_limit, encoding="linf", epsilon=1.0, slice_columns=("s",),
                   queries=tuple(QueryParams(f"v{i}", 1.0, float(a)) for i, a in enumerate(alpha)))
    plan = Exploration(tuple(ExplorationArm(c, 0.001) for c in limits), salt=3)
    armed = tuned.with_exploration(plan)  # valid parameters: every arm's scales >= 1 (else it raises)
    assert all(new >= old or new == max(armed.budget_fractions)
               for new, old in zip(armed.budget_fractions, tuned.budget_fractions, strict=True))
    main_scales = [int(a * gamma // count_limit) for a in armed.budget_fractions]
    assert min(main_scales) >= 1


def test_beam_sums_with_exploration_equal_the_in_memory_mechanism():
    conv, p = log(4, impressions=150), params()
    expected = measure(conv, p, domain(), simulation_seed=2).histogram
    import pyarrow as pa

    table = pa.table({"impression_id": conv.impression_id,
                      "conversion_time": pa.array(conv.conversion_time, pa.timestamp("us", tz="UTC")),
                      "s": conv.slices["s"], "v": conv.values[:, 0]})
    from araopt.io.conversions import validate_batch

    valid = validate_batch(table, ["s"], ["v"]).valid

    def check(sums):
        (got,) = sums
        np.testing.assert_array_equal(got.histogram, expected)

    with TestPipeline() as pipeline:
        shards = pipeline | beam.Create([(0, valid)])
        assert_that(shards | EncodeBoundAndSum(p, pipeline | "Domain" >> beam.Create([domain()]), simulation_seed=2),
                    check)
