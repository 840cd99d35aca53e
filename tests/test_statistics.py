"""Sufficient statistics (araopt.statistics): exactness of totals, 0.1 % objective accuracy, mergeability, size bound."""
import pickle

import numpy as np
import pandas as pd
import pytest

from araopt.data import synthetic
from araopt.io.conversions import Conversions
from araopt.mechanism.bounding import kept_mask, kept_per_impression
from araopt.mechanism.keys import KeyDomain
from araopt.mechanism.params import Params, QueryParams
from araopt.optimize.error_model import default_taus, expected_error, rmsre_tau
from araopt.optimize.objective import predicted_rmsre_tau as objective
from araopt.optimize.objective import statistics_breakdown
from araopt.optimize.statistics import (
    BucketLayout,
    StatisticsSpec,
    add_conversions,
    compute_statistics_in_memory,
    create_accumulator,
    extract_output,
    frac_variance,
    merge_accumulators,
)

SLICES = ("campaignId", "geography", "productCategory")


def preset_conversions(name: str, target: int = 12000, seed: int = 1, split: str = "train") -> Conversions:
    preset = synthetic.PRESETS[name]
    scale = synthetic.scale_for_target_conversions(preset, target)
    return Conversions.from_table(synthetic.generate_table(preset, seed=seed, split=split, scale=scale), SLICES, ["value"])


def multi_query_conversions(n: int = 6000, seed: int = 3, impressions: int = 1500, slices: int = 12) -> Conversions:
    """d = 2 data, several conversions per impression, an integer-valued and a log-normal query."""
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({
        "impression_id": rng.integers(0, impressions, n),
        "conversion_time": pd.to_datetime(rng.integers(0, 10**6, n), unit="s", utc=True),
        "s": rng.integers(0, slices, n),
        "items": rng.poisson(2.0, n).astype(float),
        "price": rng.lognormal(3.0, 1.0, n),
    })
    return Conversions.from_table(frame, ["s"], ["items", "price"])


def exact_rmsre(conv: Conversions, params: Params, taus: np.ndarray, kind: str) -> float:
    dom = KeyDomain.from_slice_values(params.slice_columns, conv.slices, params.query_columns)
    sidx = dom.slice_index(conv.slices)
    return rmsre_tau(expected_error(conv, sidx, dom.num_slices, params, kind, tie_breaker=conv.record_keys()), taus).combined


def linf(C: int, thresholds, fractions, slices=SLICES, columns=("value",), eps: float = 4.0) -> Params:
    return Params(count_limit=C, encoding="linf", epsilon=eps, slice_columns=slices,
                  queries=tuple(QueryParams(c, float(t), float(a))
                                for c, t, a in zip(columns, thresholds, fractions, strict=True)))


@pytest.mark.statistical
@pytest.mark.parametrize("preset", ["synth-criteo", "synth-real-estate", "synth-travel"])
def test_objective_from_statistics_within_0_1_percent_of_exact_error_model(preset):
    conv = preset_conversions(preset)
    stats = compute_statistics_in_memory(conv, StatisticsSpec(SLICES, ("value",)))
    taus = stats.taus()
    rng = np.random.default_rng(0)
    lo, hi = np.log(np.quantile(conv.values, 0.02)), np.log(conv.values.max())
    worst = 0.0
    for C in (1, 2, 7, 13, 20):
        for c in np.exp(rng.uniform(lo, hi, 3)):
            for eps in (1.0, 64.0):
                for kind in ("exact", "relaxed"):
                    p = linf(C, [c], [1.0], eps=eps)
                    exact = exact_rmsre(conv, p, taus, kind)
                    approx = objective(stats, p, taus, kind)
                    worst = max(worst, abs(approx / exact - 1.0))
    assert worst < 1e-3, worst


def test_objective_d2_linf_and_baseline_match_error_model():
    conv = multi_query_conversions()
    stats = compute_statistics_in_memory(conv, StatisticsSpec(("s",), ("items", "price"), max_count_limit=8))
    taus = stats.taus()
    for C, t, a in [(1, (3.0, 40.0), (0.3, 0.7)), (3, (2.5, 90.0), (0.55, 0.45)), (8, (6.0, 15.0), (0.1, 0.9))]:
        for kind in ("exact", "relaxed"):
            p = linf(C, t, a, ("s",), ("items", "price"), eps=2.0)
            assert objective(stats, p, taus, kind) == pytest.approx(exact_rmsre(conv, p, taus, kind), rel=1e-3)
    # the breakdown's truth and kept count are exact, not approximate
    p = linf(3, (2.5, 90.0), (0.5, 0.5), ("s",), ("items", "price"))
    br = statistics_breakdown(stats, p)
    dom = KeyDomain.from_slice_values(("s",), conv.slices, ("items", "price"))
    ref = expected_error(conv, dom.slice_index(conv.slices), dom.num_slices, p, tie_breaker=conv.record_keys())
    assert np.allclose(br.truth, ref.truth, rtol=1e-12)
    assert np.array_equal(br.expected[:, 0], ref.expected[:, 0])


def test_kept_totals_follow_alg1_with_the_mechanisms_tie_break():
    conv = multi_query_conversions(n=3000, impressions=400)
    stats = compute_statistics_in_memory(conv, StatisticsSpec(("s",), ("items", "price"), max_count_limit=20))
    dom = KeyDomain.from_slice_values(("s",), conv.slices, ("items", "price"))
    sidx = dom.slice_index(conv.slices)
    for C in (1, 2, 5, 20):
        kept = kept_mask(conv, linf(C, (1.0, 1.0), (0.5, 0.5), ("s",), ("items", "price")), conv.record_keys())
        K = kept_per_impression(C)
        assert np.array_equal(stats.kept_totals(K)[:, 0], np.bincount(sidx[kept], minlength=dom.num_slices))
        assert np.allclose(stats.kept_totals(K)[:, 2], np.bincount(sidx[kept], conv.values[kept, 1], dom.num_slices))


def test_statistics_follow_alg1_with_chromes_20_reports_per_source():
    conv = multi_query_conversions(n=3000, impressions=60)  # about 50 conversions per impression
    spec = StatisticsSpec(("s",), ("items", "price"), max_count_limit=30)
    assert spec.max_rank == 20
    stats = compute_statistics_in_memory(conv, spec)
    dom = KeyDomain.from_slice_values(("s",), conv.slices, ("items", "price"))
    sidx = dom.slice_index(conv.slices)
    for C in (20, 25, 30):
        p = linf(C, (1.0, 1.0), (0.5, 0.5), ("s",), ("items", "price"))
        kept = kept_mask(conv, p, conv.record_keys())
        assert kept_per_impression(C) == 20 and kept.sum() == 20 * len(np.unique(conv.impression_id))
        kept_counts = np.bincount(sidx[kept], minlength=dom.num_slices)
        assert np.array_equal(stats.kept_totals(kept_per_impression(C))[:, 0], kept_counts)
        ref = expected_error(conv, sidx, dom.num_slices, p, tie_breaker=conv.record_keys())
        assert np.array_equal(statistics_breakdown(stats, p).expected[:, 0], ref.expected[:, 0])


def test_merging_batches_in_any_order_gives_the_same_statistics_and_pickles():
    conv = preset_conversions("synth-travel", 8000)
    spec = StatisticsSpec(SLICES, ("value",))
    one = compute_statistics_in_memory(conv, spec)
    ids = conv.impression_id % 5
    accs = [add_conversions(create_accumulator(spec), conv.take(np.flatnonzero(ids == k))) for k in range(5)]
    accs = [pickle.loads(pickle.dumps(a)) for a in accs]
    left = extract_output(merge_accumulators([merge_accumulators(accs[:2]), merge_accumulators(accs[2:])]))
    right = extract_output(merge_accumulators(accs[::-1]))
    for other in (left, right):
        assert other.slice_keys == one.slice_keys
        assert np.array_equal(other.hist_bucket, one.hist_bucket) and np.array_equal(other.hist_rank, one.hist_rank)
        assert np.allclose(other.hist_sum, one.hist_sum, rtol=1e-12)
        assert np.array_equal(other.rank_counts, one.rank_counts)
        assert np.array_equal(other.impression_sizes, one.impression_sizes)
        assert other.num_conversions == one.num_conversions == len(conv)
    assert pickle.loads(pickle.dumps(one)).totals().sum() == pytest.approx(one.totals().sum())


def test_medians_and_quantiles_close_to_exact():
    conv = preset_conversions("synth-criteo", 10000)
    stats = compute_statistics_in_memory(conv, StatisticsSpec(SLICES, ("value",)))
    width = 2 ** (1 / stats.spec.layout.buckets_per_octave) - 1
    assert stats.taus() == pytest.approx(default_taus(conv.values), rel=width)
    for q in (0.5, 0.95, 0.99):
        assert stats.quantile(0, q) == pytest.approx(np.quantile(conv.values[:, 0], q), rel=2 * width)
    sizes = np.bincount(np.unique(conv.impression_id, return_inverse=True)[1])
    assert stats.impression_size_quantile(0.95) == int(np.ceil(np.quantile(sizes, 0.95, method="inverted_cdf")))
    assert stats.num_impressions == len(sizes)


def test_size_is_bounded_independently_of_the_number_of_conversions():
    spec = StatisticsSpec(("s",), ("items", "price"), max_count_limit=5, layout=BucketLayout(buckets_per_octave=4))
    sizes = []
    for n in (20_000, 80_000):
        stats = compute_statistics_in_memory(multi_query_conversions(n=n, impressions=n // 4, slices=4), spec)
        m, R, d, B, k = stats.num_slices, spec.max_rank, spec.num_queries, spec.layout.num_buckets, spec.sample_size
        bound = (m * (R + 1) * (d + 1) + 4 * m * R * d * B + 3 * d * B + m * R * k * (d + 1)
                 + spec.max_impression_size + 2 + d)
        assert stats.size_in_numbers() <= bound
        sizes.append(stats.size_in_numbers())
    # 4x the conversions: the occupied (slice, rank, bucket) cells and the samples saturate
    assert sizes[1] < 1.1 * sizes[0], sizes


def test_frac_variance_exact_for_point_masses_and_one_sixth_when_spread():
    mu = np.array([0.0, 0.25, 3.5, 7.9])
    assert np.allclose(frac_variance(mu, np.zeros(4)), (mu % 1) * (1 - mu % 1))
    assert np.allclose(frac_variance(mu, np.full(4, 2.0)), 1 / 6)
    rng = np.random.default_rng(1)
    for m_, s_ in [(0.3, 0.05), (0.9, 0.2), (2.1, 0.4)]:
        x = rng.normal(m_, s_, 400_000)
        f = x - np.floor(x)
        assert frac_variance(np.array([m_]), np.array([s_]))[0] == pytest.approx(np.mean(f * (1 - f)), abs=2e-3)


def _frac_variance_64_terms(mu: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """The series with all 64 terms for every value (the formula frac_variance truncates per value)."""
    k = np.arange(1, 65, dtype=np.float64)[None, :]
    x = (mu - np.floor(mu))[:, None]
    return 1.0 / 6.0 - (np.cos(2 * np.pi * k * x) * np.exp(-2 * np.pi**2 * k * k * sigma[:, None] ** 2)
                        / (np.pi * k) ** 2).sum(axis=1)


def test_frac_variance_matches_the_full_64_term_series_to_1e12():
    rng = np.random.default_rng(7)
    sigma = np.concatenate([np.exp(rng.uniform(np.log(0.01), np.log(0.5), 20_000)), [0.01, 0.0100001, 0.4999999]])
    mu = rng.uniform(0, 5000, len(sigma))
    mu[:50] = np.round(mu[:50])  # integers: the series' smallest values (about 0.8 sigma)
    got = frac_variance(mu, sigma)
    assert np.abs(got / _frac_variance_64_terms(mu, sigma) - 1).max() < 1e-12
    # the other branches are unchanged: sigma < 0.01 closed form, sigma >= 0.5 one sixth
    assert frac_variance(np.array([2.3]), np.array([0.5]))[0] == 1 / 6
    assert frac_variance(np.array([2.25]), np.array([0.005]))[0] == pytest.approx(0.25 * 0.75 - 0.005**2, rel=1e-15)


def test_l1_objective_from_samples_exact_when_cells_are_small_and_close_when_sampled():
    conv = multi_query_conversions(n=4000, impressions=1000)
    taus = default_taus(conv.values)
    full = compute_statistics_in_memory(conv, StatisticsSpec(("s",), ("items", "price"), max_count_limit=6,
                                                             sample_size=10_000))
    sampled = compute_statistics_in_memory(conv, StatisticsSpec(("s",), ("items", "price"), max_count_limit=6,
                                                                sample_size=64))
    for C, t, rounding in [(1, (3.0, 60.0), "randomized"), (4, (2.0, 30.0), "floor")]:
        p = Params(count_limit=C, encoding="l1", epsilon=4.0, slice_columns=("s",), l1_rounding=rounding,
                   queries=(QueryParams("items", t[0]), QueryParams("price", t[1])))
        exact = exact_rmsre(conv, p, taus, "exact")
        assert objective(full, p, taus) == pytest.approx(exact, rel=1e-9)
        assert objective(sampled, p, taus) == pytest.approx(exact, rel=0.05)


def test_bad_input_refused():
    with pytest.raises(ValueError, match="C_max"):
        StatisticsSpec(SLICES, ("value",), max_count_limit=0)
    with pytest.raises(ValueError, match="distinct"):
        StatisticsSpec(("value",), ("value",))
    conv = multi_query_conversions(n=50)
    with pytest.raises(ValueError, match="slice column"):
        add_conversions(create_accumulator(StatisticsSpec(("nope",), ("items", "price"))), conv)
    bad = Conversions(conv.impression_id, conv.conversion_time, conv.slices, conv.values * -1 - 1, conv.value_columns)
    with pytest.raises(ValueError, match="non-negative"):
        add_conversions(create_accumulator(StatisticsSpec(("s",), ("items", "price"))), bad)


def test_batches_keep_an_impression_whole_however_its_id_is_spelled():
    """``compute_statistics_in_memory`` splits by the canonical id (``araopt.io.ids``): an impression
    whose rows say ``"7"``, ``"007"`` and ``"7.0"`` lies in one batch, so its ranks are its own."""
    conv = preset_conversions("synth-travel", 3000)
    rng = np.random.default_rng(4)
    width = rng.integers(1, 9, len(conv))
    ids = np.array([str(int(i)).zfill(int(w)) + (".0" if w == 8 else "") for i, w in zip(conv.impression_id, width,
                                                                                       strict=True)], dtype=object)
    spelled = Conversions(ids, conv.conversion_time, conv.slices, conv.values, conv.value_columns)
    spec = StatisticsSpec(SLICES, ("value",))
    one = compute_statistics_in_memory(conv, spec)
    split = compute_statistics_in_memory(spelled, spec, batches=4)
    assert np.array_equal(split.rank_counts, one.rank_counts)
    assert np.array_equal(split.impression_sizes, one.impression_sizes)
    assert split.num_impressions == one.num_impressions
