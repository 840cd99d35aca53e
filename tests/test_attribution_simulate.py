"""The vectorized browsers (``araopt.attribution.simulate``) against the browser model, report by
report, on random encoded logs: the same reports accepted, refused for budget and deducted."""
import random

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from araopt.attribution.encoder import browser_config, encode, schedule, simulate, unnoised_sums
from araopt.attribution.params import COUNT, AttributionParams, AttributionQuery
from araopt.attribution.simulate import epoch_grid, reference_draws, report_sums, simulate_schedule
from araopt.mechanism.keys import KeyDomain
from w3c import random_log


def _setup(seed):
    rng = random.Random(seed)
    queries = (AttributionQuery(COUNT, None), AttributionQuery("value", "value", max_value=rng.choice((1, 7, 255)),
                                                               clip=rng.choice((5.0, 10.0, 40.0))))
    params = AttributionParams.from_paper(rng.choice((1.0, 4.0, 10.0)), rng.randrange(1, 6), {COUNT: 0.4, "value": 0.6},
                                          queries, ("campaign",), lookback_days=rng.choice((1, 7, 30)),
                                          epoch_days=rng.choice((1, 7)))
    log = random_log(rng, users=rng.randrange(1, 30))
    if rng.random() < 0.5:
        log["impression_site"] = [rng.choice(("pub-1.example", "pub-2.example")) for _ in range(len(log))]
        log["impression_site"] = log.groupby("impression_id")["impression_site"].transform("first")
    domain = KeyDomain.from_slice_values(("campaign",), {"campaign": np.arange(3)}, params.query_names)
    uniforms = np.random.default_rng(seed).random((len(log), 2))
    return rng, params, log, domain, uniforms


@given(seed=st.integers(0, 2**32 - 1))
def test_the_vectorized_browsers_accept_and_refuse_the_reports_the_browser_model_does(seed):
    rng, params, log, domain, uniforms = _setup(seed)
    config = browser_config(params, domain.num_slices)
    if rng.random() < 0.5:  # let the safety limits bind too
        config = browser_config(params, domain.num_slices).__class__(
            per_site_budget=config.per_site_budget, global_budget_per_epoch=config.per_site_budget,
            impression_site_quota_per_epoch=config.per_site_budget // 2, epoch_days=config.epoch_days,
            max_histogram_size=config.max_histogram_size)
    plan = schedule(params, log, domain, uniforms)
    streams, _ = encode(params, log, domain, uniforms)
    starts = epoch_grid(np.array([rng.random() for _ in streams]), config)  # each browser's epoch grid
    fast = simulate_schedule(params, plan, log, config, starts)
    calls = [next(ev["seconds"] for ev in s.events if ev["event"] == "measureConversion") for s in streams]
    draws = reference_draws(starts, np.round(np.array(calls) * 1000).astype(np.int64), config)  # the same grid
    slow = [o for stream, start in zip(streams, draws, strict=True) for o in simulate(stream, config, start, rng.random)[0]]
    assert len(slow) == len(fast.accepted)
    assert [refused for *_, refused in slow] == fast.refused.tolist()
    expected = [h for _, _, h, _ in slow]
    got = [tuple(int(v) if (i == idx and ok) else 0 for i in range(domain.num_slices))
           for idx, v, ok in zip(fast.index, fast.value, fast.accepted, strict=True)]
    assert got == expected
    ours = report_sums(params, fast, domain.num_slices)
    theirs = unnoised_sums(params, slow, domain.num_slices)
    assert {k: v.tolist() for k, v in theirs.items()} == {k: ours[k].tolist() for k in theirs}


def test_a_log_spanning_the_int64_times_is_scheduled_and_simulated_as_its_rank_compressed_copy():
    """Times so far apart that browser x time overflows int64 (the keys fall back to time ranks, the
    budget units to a factorization): the events come in the same order, and the reports are
    matched and accepted, as in a copy of the log whose distinct times keep their order but lie
    days apart."""
    rng = random.Random(3)
    queries = (AttributionQuery(COUNT, None),)
    params = AttributionParams.from_paper(1.0, 2, {COUNT: 1.0}, queries, ("campaign",), lookback_days=30)
    domain = KeyDomain.from_slice_values(("campaign",), {"campaign": np.arange(3)}, params.query_names)
    log = random_log(rng, users=1500)
    distinct = np.unique(np.concatenate([log["impression_time_us"], log["conversion_time_us"]]))
    stride = (2**63 - 1) // len(distinct)  # far beyond any lookback, and 1500 browsers x the span > 2^63 ms
    times = ("impression_time_us", "conversion_time_us")
    huge = log.assign(**{c: np.searchsorted(distinct, log[c]) * stride for c in times})
    uniforms = np.random.default_rng(3).random((len(log), 1))
    far, near = schedule(params, huge, domain, uniforms), schedule(params, log, domain, uniforms)
    assert len(far.browsers) * (int(far.time_ms.max()) - int(far.time_ms.min())) >= 2**62
    for field in ("browser", "kind", "row", "query", "ordinal", "impression_row"):
        assert getattr(far, field).tolist() == getattr(near, field).tolist(), field
    config = browser_config(params, domain.num_slices)
    reports = simulate_schedule(params, far, huge, config, np.zeros(len(far.browsers)))
    # every report is days from its impression unless they share a time: matched iff the same time
    same_time = (huge["conversion_time_us"].to_numpy() == huge["impression_time_us"].to_numpy())[reports.row]
    assert reports.matched.tolist() == same_time.tolist()
    assert reports.accepted.any() and reports.refused.any()
