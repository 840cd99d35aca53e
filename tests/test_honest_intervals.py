"""Issue 26, honest intervals of the privacy-safe tuner: the model's own uncertainty is calibrated out
of sample against the releases (``private_model.ratio_excess``, ``share_excess``) and the excess widens
the ratio variance every slice's interval carries (``private._spread``)."""
import dataclasses

import numpy as np
import pytest

from araopt.mechanism.keys import KeyDomain
from araopt.mechanism.params import Encoding, Params, QueryParams
from araopt.optimize.private import FirstParty, ReleaseRecord, _spread, cold_start, released_value_shares
from araopt.optimize.private_model import (
    MIN_EXCESS_CELLS,
    PrivateModel,
    ratio_excess,
    same_count,
    share_excess,
)
from araopt.optimize.retention import RetentionCurve
from araopt.optimize.slice_retention import MEANS, SlicePosterior, geometric_log_weights


def record(count_limit: int, kept: np.ndarray, conversions: float, noise: float = 0.0) -> ReleaseRecord:
    """A main release (no arms) of ``kept`` count estimates per slice (each with noise variance
    ``noise``) on a day of ``conversions`` first-party conversions."""
    kept = np.asarray(kept, dtype=np.float64)
    m = len(kept)
    main = np.stack([kept, 10.0 * kept], axis=1)
    return ReleaseRecord(count_limit, None, "", tuple((k,) for k in range(m)), main, np.full((m, 2), noise),
                         np.zeros((0, 2)), np.zeros((0, 2)), FirstParty("d", np.array([conversions, 0.0]),
                                                                         np.zeros((0, 1))))


def test_the_ratio_excess_is_the_error_of_the_published_pooled_ratio_on_releases_it_did_not_see():
    """Three releases at C = 5 kept 0.9 of the day's conversions, the fourth 0.8: the ratio published
    for the fourth (the latest same-count releases before it) was 0.9, so its relative error is
    0.8 / 0.9 - 1; a release with no same-count release before it says nothing."""
    history = [record(5, [450.0, 450.0], 1000.0)] * 3 + [record(5, [400.0, 400.0], 1000.0)]
    assert ratio_excess(history, 1) == pytest.approx((0.8 / 0.9 - 1.0) ** 2)
    # over the last two: the third release agreed with the two before it
    assert ratio_excess(history, 2) == pytest.approx((0.8 / 0.9 - 1.0) ** 2 / 2)
    moved = [*history[:3], dataclasses.replace(history[3], count_limit=20)]
    assert ratio_excess(moved, 1) == 0.0
    assert same_count(moved, 20, None) == [moved[3]]


def test_the_ratio_excess_subtracts_what_the_releases_noise_explains():
    """Shares scattered around 0.9 by exactly the noise the releases state: no excess beyond it (the
    mean over many releases of the squared error less its noise part is about 0, cut at 0)."""
    rng = np.random.default_rng(3)
    sd = 20.0  # per slice, two slices: the day's kept count's noise variance 2 sd^2
    history = [record(5, 450.0 + rng.normal(0.0, sd, 2), 1000.0, noise=sd**2) for _ in range(400)]
    noisy = ratio_excess(history, 397)
    assert noisy < 2e-4
    # the same scatter with no noise stated is all excess: about (sqrt(2) sd / 900)^2 (1 + 1/3)
    bare = [dataclasses.replace(r, main_variance=np.zeros_like(r.main_variance)) for r in history]
    assert ratio_excess(bare, 397) == pytest.approx(2 * sd**2 / 900.0**2 * (1 + 1 / 3), rel=0.25)


def test_intervals_widened_by_the_ratio_excess_cover_the_transient_the_bare_ones_miss():
    """Count limits that move every few days: each release keeps another share than the settled
    releases at its count limit did (a transient; here a random 5% around them). The pooled ratio
    published from the releases before each day, with the noise variance alone, covers few of the
    realised shares; with the excess learnt out of sample from the days before, >= 90%."""
    rng = np.random.default_rng(11)
    limits = np.repeat(rng.choice([3, 5], 30), 3)
    settled = {3: 0.85, 5: 0.93}
    history: list[ReleaseRecord] = []
    bare = widened = tried = 0
    for day, c in enumerate(limits):
        share = settled[int(c)] * (1.0 + 0.05 * rng.standard_normal())
        today = record(int(c), [share * 4000.0, share * 6000.0], 10_000.0, noise=4.0)
        before = same_count(history, int(c), None)
        if day >= 20 and before:
            published = sum(float(r.main[:, 0].sum()) for r in before) / (10_000.0 * len(before))
            noise = 8.0 / 10_000.0**2 * (1 + 1 / len(before))
            excess = ratio_excess(history, 9)
            error = abs(share - published)
            tried += 1
            bare += error <= 1.96 * np.sqrt(noise)
            widened += error <= 1.96 * np.sqrt(noise + excess * published**2)
        history.append(today)
    assert tried > 40
    assert bare / tried < 0.3
    assert widened / tried >= 0.9


def _posterior(means: np.ndarray) -> SlicePosterior:
    """Slices whose conversions per impression are known exactly (the grid point nearest each mean)."""
    weights = np.zeros((len(means), len(MEANS)))
    weights[np.arange(len(means)), np.abs(MEANS[None, :] - np.asarray(means)[:, None]).argmin(axis=1)] = 1.0
    return SlicePosterior(weights, np.exp(geometric_log_weights()), -1, (0.0, 0.0), True)


def _share_records(scatter: float, seed: int, days: int = 20, m: int = 30
                   ) -> tuple[list[ReleaseRecord], PrivateModel]:
    """``days`` releases at C = 5 of ``m`` slices with one conversion per impression (r = 1, each day's
    count Poisson around the slice's size), noise variance 25; each day-slice count further scaled by
    exp(``scatter`` z) (what the model does not hold)."""
    rng = np.random.default_rng(seed)
    sizes = np.linspace(50.0, 500.0, m)
    records = []
    for _ in range(days):
        kept = rng.poisson(sizes) * np.exp(scatter * rng.standard_normal(m)) + rng.normal(0.0, 5.0, m)
        records.append(record(5, kept, float(kept.sum()), noise=25.0))
    keys = [(k,) for k in range(m)]
    curve = RetentionCurve(np.exp(geometric_log_weights())[0])
    model = PrivateModel(curve, {k: np.array([s]) for k, s in zip(keys, sizes, strict=True)}, np.zeros((0, 1)), days,
                         slices=_posterior(np.ones(m)), slice_keys=tuple(keys))
    return records, model


def test_the_share_excess_is_zero_when_the_slices_scatter_as_the_model_says_and_measures_an_excess():
    """Out of sample (each release against shares learnt from the others): Poisson counts with the
    stated noise show no excess; a further 20% log-normal scatter per day and slice shows about
    0.2^2 of relative variance."""
    records, model = _share_records(0.0, 1)
    keys = list(model.slice_keys)
    assert share_excess(records, model, keys) < 0.002
    records, model = _share_records(0.2, 1)
    assert share_excess(records, model, keys) == pytest.approx(0.2**2, rel=0.3)
    # four releases: a share learnt from the release itself would hide a quarter of its scatter
    records, model = _share_records(0.2, 4, days=4, m=200)
    assert share_excess(records, model, list(model.slice_keys)) == pytest.approx(0.2**2, rel=0.15)
    # too few releases say nothing
    assert share_excess(records[:1], model, keys) == 0.0
    assert MIN_EXCESS_CELLS > 1


def test_the_excess_widens_every_query_s_ratio_variance_by_its_share_of_the_ratio_squared():
    records, model = _share_records(0.0, 2)
    domain = KeyDomain.from_slice_values(("s",), {"s": np.arange(30)}, ("value",))
    params = cold_start(FirstParty.of("d", np.arange(1.0, 100.0)), 8.0, domain, ("value",)).params
    keys = list(model.slice_keys)
    ratio = np.tile([0.9, 0.8], (30, 1))
    plain = _spread(model, params, ratio, keys, values=False)
    wider = _spread(dataclasses.replace(model, excess=0.01), params, ratio, keys, values=False)
    np.testing.assert_allclose(wider - plain, 0.01 * ratio**2)


def _valued(clip: float, kept_count: float, kept_value: float) -> ReleaseRecord:
    """A main release at C = 5 and ``clip`` of one slice that kept ``kept_count`` conversions worth
    ``kept_value`` (clipped) of a day of 1000 conversions worth 10000."""
    return ReleaseRecord(5, None, "", ((0,),), np.array([[kept_count, kept_value]]), np.zeros((1, 2)),
                         np.zeros((0, 2)), np.zeros((0, 2)),
                         FirstParty("d", np.array([1000.0, 10000.0]), np.zeros((0, 1))), (clip,))


def test_the_values_ratio_over_the_counts_is_the_releases_with_their_clips_moved_to_the_candidates():
    """Alg. 1 keeps an impression's first conversions: where values go with conversions per impression
    the kept ones are not the values' average, so the value's pooled ratio is read from what the
    releases kept (exact first-party totals), not assumed to be the count's times the clip's. A
    release at the candidate's clip gives it as kept; one at another clip is moved by the first-party
    values' clipped means (E[min(v, 10)] = 7, E[min(v, 20)] = 10 on these values)."""
    values = np.array([[2.0], [6.0], [12.0], [40.0]])
    at = lambda clip: Params(5, Encoding.LINF, 1.0, ("s",), (QueryParams("value", clip, 1.0),))  # noqa: E731
    ten = _valued(10.0, 500.0, 2500.0)
    twenty = _valued(20.0, 500.0, 3000.0)
    np.testing.assert_allclose(released_value_shares([ten], at(10.0), values), [0.25 / 0.5])
    np.testing.assert_allclose(released_value_shares([ten], at(20.0), values), [0.25 / 0.5 * 10 / 7])
    np.testing.assert_allclose(released_value_shares([ten, twenty], at(10.0), values),
                               [(2500.0 + 3000.0 * 7 / 10) / 20000.0 / 0.5])
    # a record that does not state its clips says nothing of them
    unknown = dataclasses.replace(ten, clips=())
    assert np.isnan(released_value_shares([unknown], at(10.0), values)).all()
