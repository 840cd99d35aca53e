"""The privacy-safe tuner's caches give the same bits as computing every candidate from scratch
(issue 30: the replay's CPU per day, with seeded outputs unchanged): the slice posterior's terms
shared by every grouping and between-group spread of one within-group spread, and the retention
curve's bootstrap refits shared by every candidate's count limit."""
import numpy as np
from scipy.special import logsumexp

from araopt.optimize.retention import CurveBootstrap, RetentionCurve, fit_retention_curve, ratio_variance
from araopt.optimize.slice_retention import DEFAULT_SPREAD, MEANS, SPREADS, _log_prior, _posterior


def posterior_from_scratch(ll, center, slice_groups, identified):
    """``slice_retention._posterior`` with every option's terms computed afresh (scipy's log-sum-exp)."""
    m = ll.shape[0]
    grid = np.log(MEANS)

    def hierarchy(groups, between, within, posterior=False):
        top = _log_prior(grid, np.array([center]), between)[0]
        cond = _log_prior(grid, grid, within)
        per = logsumexp(ll[:, None, :] + cond[None, :, :], axis=2)
        labels, index = np.unique(groups, return_inverse=True)
        sums = np.zeros((len(labels), per.shape[1]))
        np.add.at(sums, index, per)
        joint = top[None, :] + sums
        total = float(logsumexp(joint, axis=1).sum())
        if not posterior:
            return total, None
        x = ll + logsumexp((joint[index] - per)[:, :, None] + cond[None, :, :], axis=1)
        return total, x - logsumexp(x, axis=1, keepdims=True)

    def grouping(column):
        return np.zeros(m, dtype=np.int64) if column < 0 else np.asarray(slice_groups[column], dtype=np.int64)

    options = [(-1, 0.0, DEFAULT_SPREAD)]
    if identified:
        options = [(-1, 0.0, w) for w in SPREADS]
        options += [(c, b, w) for c in range(len(slice_groups)) for b in SPREADS for w in SPREADS]
    totals = np.array([hierarchy(grouping(c), b, w)[0] for c, b, w in options])
    evidence = np.exp(totals - totals.max())
    evidence /= evidence.sum()
    weights = np.zeros_like(ll)
    for share, (c, b, w) in zip(evidence, options, strict=True):
        if share >= 1e-4:
            weights += share * np.exp(hierarchy(grouping(c), b, w, posterior=True)[1])
    weights /= weights.sum(axis=1, keepdims=True)
    column, between, within = options[int(np.argmax(totals))]
    return weights, column, between, within


def test_the_slice_posterior_shares_its_within_group_terms_with_the_same_bits():
    """Slices of two groupings whose log-likelihoods make many options carry evidence (the hyperprior
    average sums many posteriors): the cached terms give the weights, grouping and spreads bit for bit."""
    rng = np.random.default_rng(11)
    m = 24
    truth = np.repeat(rng.normal(1.5, 0.8, size=6), 4) + rng.normal(0.0, 0.3, size=m)
    grid = np.log(MEANS)
    ll = -0.5 * ((grid[None, :] - truth[:, None]) / rng.uniform(0.3, 1.5, size=(m, 1))) ** 2
    slice_groups = [np.repeat(np.arange(6), 4), np.tile(np.arange(4), 6)]
    center = float(grid[int(np.argmax(ll.sum(axis=0)))])
    for identified in (True, False):
        got = _posterior(ll, center, slice_groups, identified)
        want = posterior_from_scratch(ll, center, slice_groups, identified)
        assert got[0].tobytes() == np.asarray(want[0]).tobytes()
        assert got[1:] == want[1:]
    assert (got[0] > 0).all()


def test_one_bootstrap_asked_every_count_limit_gives_the_variances_of_fresh_ones():
    """The refits do not depend on K: asked in any order, a shared bootstrap gives each K's variance
    bit for bit as a fresh bootstrap per K (and as the refits drawn by hand)."""
    truth = RetentionCurve(np.array([0.3, 0.1, 0.05, 0.02]) / (np.array([0.3, 0.1, 0.05, 0.02]) @ np.arange(1, 5)))
    points = [(k, float(truth.ratio(k)[0]), 4e-4) for k in (1, 2, 3, 6)]
    curve = fit_retention_curve(points)
    shared = CurveBootstrap(curve, reps=12, seed=5)
    ranks = [3, 1, 6, 3, 2]
    got = [shared.ratio_variance([k]) for k in ranks]
    for k, variance in zip(ranks, got, strict=True):
        assert variance.tobytes() == ratio_variance(curve, [k], reps=12, seed=5).tobytes()
    rng = np.random.default_rng(5)
    by_hand = [fit_retention_curve([(k, float(r + rng.normal(0.0, np.sqrt(v))), v) for k, r, v in curve.points])
               for _ in range(12)]
    assert np.var([fit.ratio([2])[0] for fit in by_hand]) == got[-1][0]
    assert len({float(v[0]) for v in got}) == 4 and all(v[0] > 0 for v in got)
