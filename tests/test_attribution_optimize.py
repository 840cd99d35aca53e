"""ParameterOptimization (Alg. 5) for the W3C Attribution target (``araopt.optimize.attribution``): the
known optimum of small analytic cases, determinism, the baselines and the evaluation."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from araopt.attribution.params import COUNT
from araopt.errors import InvalidParameters
from araopt.evaluation.attribution import OPTIMIZED, evaluate_attribution
from araopt.mechanism.keys import KeyDomain
from araopt.optimize.attribution import (
    BASELINES,
    EQUAL_Q95,
    SPEC_DEFAULTS,
    AttributionProblem,
    baseline_params,
    build_params,
    optimize_attribution,
    predicted_rmsre_tau,
    privacy_unit_quantile,
    training_taus,
)
from araopt.optimize.mechanisms import ARA_LINF, ATTRIBUTION, split_fractions

DAY = 86_400_000_000
START = 1_767_225_600_000_000
SLICES = ("campaign",)


def log(browsers_per_slice: int, conversions_per_browser: int, value: float | np.ndarray = 10.0,
        slices: int = 4) -> pd.DataFrame:
    """Every browser: one impression, ``conversions_per_browser`` conversions a minute apart an hour
    after it (all in one epoch unless the browser's epoch boundary falls in those minutes)."""
    n_browsers = browsers_per_slice * slices
    browser = np.repeat(np.arange(n_browsers), conversions_per_browser)
    k = np.tile(np.arange(conversions_per_browser), n_browsers)
    shown = START + browser * 1_000_000
    return pd.DataFrame({"browser_id": browser, "impression_id": browser, "campaign": browser % slices,
                         "impression_time_us": shown, "conversion_time_us": shown + DAY // 24 + k * 60_000_000,
                         "value": np.broadcast_to(value, browser.shape).astype(np.float64)})


def domain(slices: int = 4) -> KeyDomain:
    return KeyDomain.from_slice_values(SLICES, {"campaign": np.arange(slices)}, (COUNT, "value"))


def test_the_optimizer_picks_the_known_optimum_without_binding_budgets() -> None:
    # One conversion per browser, every value 10: no report is ever refused and clipping at 10 loses
    # nothing, so the error is the noise alone, 8 C^2 C_l^2 / (alpha_l^2 eps^2), weighted by
    # pi_l = 1 / max(tau_l, V_l)^2 (V: 20 conversions, 200 of value per slice): smallest C (1), clip
    # 10, and the Lagrange split alpha_l ~ K_l^(1/3), K_count = 1 / 20^2, K_value = 10^2 / 400^2 =
    # K_count / 4 (taus 5, 400): alpha = (4^(1/3), 1) / (4^(1/3) + 1).
    rows = log(20, 1)
    problem = AttributionProblem(1.0, ("value",), SLICES)
    result = optimize_attribution(problem, rows, domain(), taus=[5.0, 400.0], simulation_seed=3)
    p = result.params
    assert p.count_limit(multi_epoch=True) == 1
    assert [q.clip for q in p.queries] == [1.0, 10.0]
    split = np.array([np.cbrt(4.0), 1.0]) / (np.cbrt(4.0) + 1.0)
    assert [q.epsilon for q in p.queries] == pytest.approx(split, abs=2e-6)
    assert result.taus == (5.0, 400.0)
    assert training_taus(rows, ("value",)).tolist() == [5.0, 50.0]  # tau = 5 x the training median


def test_the_optimizer_picks_the_count_limit_that_fits_every_browsers_conversions() -> None:
    # Four conversions per browser at one value, lookback 30 days (every report spans several 7-day
    # epochs: a full report deducts epsilon_site / C): below C = 4 a quarter or more of every slice is
    # refused (relative bias >= 0.25), from C = 4 on nothing is, and the noise grows with C: C = 4.
    rows = log(50, 4)
    problem = AttributionProblem(1.0, ("value",), SLICES)
    result = optimize_attribution(problem, rows, domain(), simulation_seed=0)
    assert result.params.count_limit(multi_epoch=True) == 4
    scored = {c.count_limit: c.rmsre_tau for c in result.candidates}
    assert min(scored, key=lambda c: scored[c]) == 4
    assert scored[3] > 2 * scored[4] and scored[5] > scored[4]
    table = result.table()  # the nightly report's per-C table: one row per C, its best point
    assert table["C"].tolist() == sorted({c.count_limit for c in result.candidates})
    for _, row in table.iterrows():
        at_c = [c.rmsre_tau for c in result.candidates if c.count_limit == row["C"]]
        assert row["RMSRE_tau"] == min(at_c) and row["points scored"] == len(at_c)
    assert table["points scored"].sum() == len(result.candidates) > len(table)  # points repeat a C


def test_the_optimizer_is_deterministic_and_at_least_as_good_as_the_baselines() -> None:
    g = np.random.default_rng(5)
    rows = log(30, 3, value=g.lognormal(2.0, 1.0, 30 * 4 * 3))
    problem = AttributionProblem(4.0, ("value",), SLICES)
    first = optimize_attribution(problem, rows, domain(), simulation_seed=1)
    again = optimize_attribution(problem, rows, domain(), simulation_seed=1)
    assert first.params.to_json() == again.params.to_json() and first.rmsre_tau == again.rmsre_tau
    taus = np.array(first.taus)
    for name in (SPEC_DEFAULTS, EQUAL_Q95):
        baseline = predicted_rmsre_tau(baseline_params(name, problem, rows), rows, domain(), taus, 1)
        assert first.rmsre_tau <= baseline
    assert first.rmsre_tau == predicted_rmsre_tau(first.params, rows, domain(), taus, 1)
    q = first.params.queries[1]
    assert q.max_value == (1 << q.max_value.bit_length()) - 1  # 2^n - 1


def test_the_baselines_follow_the_spec_defaults_and_the_q95_rule() -> None:
    rows = log(10, 3, value=np.arange(1, 121, dtype=np.float64))
    problem = AttributionProblem(1.0, ("value",), SLICES)
    spec = baseline_params(SPEC_DEFAULTS, problem, rows)
    assert [(q.epsilon, q.max_value) for q in spec.queries] == [(0.5, 1), (0.5, 1)]  # eps 1 would exceed 1
    assert spec.queries[1].clip == pytest.approx(60.5)  # count only: the value in units of its mean
    wide = baseline_params(SPEC_DEFAULTS, AttributionProblem(10.0, ("value",), SLICES), rows)
    assert [q.epsilon for q in wide.queries] == [1.0, 1.0]
    q95 = baseline_params(EQUAL_Q95, problem, rows)
    assert q95.queries[1].clip == pytest.approx(np.quantile(np.arange(1, 121), 0.95))
    assert q95.count_limit(multi_epoch=True) == privacy_unit_quantile(rows, 7, 0.95) == 3
    assert q95.queries[0].epsilon == pytest.approx(q95.queries[1].epsilon)


def test_the_noise_description_is_the_attribution_mechanisms_noise() -> None:
    # eps_l = 2 alpha_l eps_site / C, Laplace of scale 2 maxValue / eps_l over the value scale maxValue / C_l
    p = build_params(AttributionProblem(4.0, ("value",), SLICES), 3, [0.25, 0.75], [40.0], [255])
    assert p.queries[1].epsilon == pytest.approx(0.75 * 4.0 / 3, abs=1e-6)
    q = p.queries[1]
    laplace = 2 * (q.noise_scale / q.value_scale) ** 2
    described = ATTRIBUTION.variance(3, np.array([40.0]), np.array([0.75]), 4.0)[0]
    assert laplace == pytest.approx(described, rel=1e-5)
    assert ATTRIBUTION.constant == 4 * ARA_LINF.constant and ATTRIBUTION.separate_count
    assert not ARA_LINF.separate_count
    assert split_fractions(np.array([1.0, 8.0])) == pytest.approx([1 / 3, 2 / 3])


def test_refusals() -> None:
    with pytest.raises(InvalidParameters, match="max count limit"):
        AttributionProblem(1.0, ("value",), SLICES, max_count_limit=0)
    with pytest.raises(InvalidParameters, match="lookbacks"):
        AttributionProblem(1.0, ("value",), SLICES, lookbacks=())
    with pytest.raises(InvalidParameters, match="taus"):
        optimize_attribution(AttributionProblem(1.0, ("value",), SLICES), log(2, 1), domain(), taus=[1.0])
    with pytest.raises(InvalidParameters, match="unknown baseline"):
        baseline_params("nope", AttributionProblem(1.0, ("value",), SLICES), log(2, 1))


def test_the_evaluation_compares_on_the_test_log_with_training_taus() -> None:
    g = np.random.default_rng(2)
    train = log(20, 3, value=g.lognormal(2.0, 1.0, 240))
    test = log(20, 3, value=g.lognormal(2.0, 1.0, 240))
    (e,) = evaluate_attribution(train, test, domain(), ("value",), SLICES, [4.0], runs=2, seed=1)
    taus = training_taus(train, ("value",))
    assert [m.method for m in e.methods] == [OPTIMIZED, SPEC_DEFAULTS, EQUAL_Q95]
    assert e.optimized.analytic == predicted_rmsre_tau(e.optimized.params, test, domain(), taus, 1)
    assert e.ratio == e.optimized.analytic / min(m.analytic for m in e.methods[1:])
    assert all(m.coverage is not None and 0 <= m.coverage <= 1 for m in e.methods)
    assert e.generalization == e.optimized.analytic / e.tuned_on_test


def test_the_retention_calibration_divides_by_the_kept_share() -> None:
    # Four conversions per browser, C = 3: the budget keeps three of four (all four for the browsers
    # whose epoch boundary falls between their conversions): r = kept / true from the error model.
    from araopt.attribution.calibrate import retention
    from araopt.attribution.error import error_terms
    from araopt.attribution.reconstruct import Estimate

    rows = log(50, 4)
    params = build_params(AttributionProblem(1.0, ("value",), SLICES), 3, [0.5, 0.5], [10.0])
    calibration = retention(params, rows, domain(), 0)
    terms = error_terms(params, rows, domain(), 0)
    kept = (terms.truth + terms.bias).sum(axis=1) / terms.truth.sum(axis=1)
    assert calibration.ratios == pytest.approx(kept) and 0.75 <= calibration.ratios[0] < 0.8
    per_index = (terms.truth + terms.bias)[0] / terms.truth[0] / calibration.ratios[0]
    assert calibration.spreads[0] == pytest.approx(np.quantile(np.abs(1 - per_index), 0.95))
    estimate = Estimate(np.array([30.0, 60.0]), 1.0, 2.0, 0.95)
    values, half = calibration.true_totals(0, estimate)
    assert values == pytest.approx(estimate.values / calibration.ratios[0])
    assert half == pytest.approx(2.0 / calibration.ratios[0] + calibration.spreads[0] * values)
    with pytest.raises(InvalidParameters, match="level"):
        retention(params, rows, domain(), 0, level=1.0)


def test_the_tuning_workflow_runs_the_attribution_steps() -> None:
    # The one workflow (optimize.workflow.tune_and_calibrate) with this target's backend and steps:
    # Alg. 5 on the history's rows and layout, the retention calibration of the chosen parameters on the
    # same rows with the same draws, the version (api attribution) carrying both, the baselines beside.
    from araopt.attribution.calibrate import retention
    from araopt.optimize.attribution import AttributionBackend, AttributionSpec, AttributionTuner, history_domain
    from araopt.optimize.workflow import tune_and_calibrate
    from araopt.version import Api

    rows = log(30, 3)
    tuning = tune_and_calibrate(AttributionBackend(rows, 2), AttributionSpec(SLICES, ("value",)),
                                AttributionTuner(1.0, 6, 2))
    layout = history_domain(rows, SLICES, ("value",))
    direct = optimize_attribution(AttributionProblem(1.0, ("value",), SLICES, max_count_limit=6), rows, layout,
                                  simulation_seed=2)
    assert tuning.optimization == direct and tuning.rows == len(rows) and tuning.domain == layout
    assert tuning.version.api == Api.ATTRIBUTION and tuning.version.attribution == direct.params
    assert tuning.version.retention == retention(direct.params, rows, layout, 2)
    assert list(tuning.comparison["method"]) == ["optimized", *BASELINES]
    assert set(tuning.baselines) == set(BASELINES)
    with pytest.raises(InvalidParameters, match="the window has no valid rows"):
        tune_and_calibrate(AttributionBackend(rows.iloc[:0], 2, "the window"), AttributionSpec(SLICES, ("value",)),
                           AttributionTuner(1.0, 6, 2))


def test_the_search_at_a_tiny_budget_scores_every_candidate_and_chooses_releasable_parameters() -> None:
    """The search scores candidates at maxValue 2^20 - 1 (``SEARCH_MAX_VALUE``; the released maxValue is
    chosen after it), whose noise rate epsilon / (2 maxValue) may lie below the exact sampler's 2^-36. The
    error model needs the noise's variance there, not a draw: the sampler's check stopped the whole search
    (round seven), and scoring such candidates infinite left the search at its start (round eight: 5x
    worse than the spec defaults on a red team's log). What it chooses must be releasable
    (``reconstruct.check_noise_rates``)."""
    from araopt.attribution.params import AttributionParams, AttributionQuery
    from araopt.attribution.reconstruct import check_noise_rates

    rows = log(20, 3, value=np.linspace(1.0, 500.0, 240))
    taus = np.array([5.0, 500.0])
    unsampleable = AttributionParams(1.0, (AttributionQuery(COUNT, None, 2.0**-20),
                                           AttributionQuery("value", "value", 2.0**-20, 2**20, 500.0)), SLICES)
    with pytest.raises(InvalidParameters, match="noise rate"):
        check_noise_rates(unsampleable)
    assert np.isfinite(predicted_rmsre_tau(unsampleable, rows, domain(), taus))
    problem = AttributionProblem(5e-5, ("value",), SLICES)
    result = optimize_attribution(problem, rows, domain(), taus=taus, simulation_seed=3)
    check_noise_rates(result.params)
    scores = [c.rmsre_tau for c in result.candidates]
    assert np.isfinite(scores).all() and len({c.count_limit for c in result.candidates}) > 1  # it searched
    assert min(scores) < scores[0]  # and left its start (equal split, the 99% clip)


def test_a_baseline_that_cannot_be_released_at_the_budget_is_listed_not_scored_and_stops_nothing() -> None:
    """At a tiny budget the q95 baseline (C = 25 here) gives each query less than one microepsilon per
    report, or a noise rate the sampler cannot draw: no method a user could run. It stopped optimize,
    nightly and evaluate (a red team's: budget 2e-5); now the comparison lists it with why, the guardrails'
    bar and the evaluation's best baseline leave it out, and a releasable baseline is still scored."""
    from araopt.evaluation.attribution import evaluation_table
    from araopt.optimize.attribution import comparison, releasable_baseline

    rows = log(20, 25, value=np.linspace(1.0, 50.0, 2000))
    taus = np.array([5.0, 50.0])
    problem = AttributionProblem(2e-5, ("value",), SLICES)
    why = releasable_baseline(EQUAL_Q95, problem, rows)
    assert isinstance(why, str) and "microepsilon" in why
    assert not isinstance(releasable_baseline(SPEC_DEFAULTS, problem, rows), str)
    result = optimize_attribution(problem, rows, domain(), taus=taus, simulation_seed=3)
    table = comparison(result, problem, rows, domain()).set_index("method")
    assert table.loc[EQUAL_Q95, "note"].startswith("not releasable") and np.isnan(table.loc[EQUAL_Q95, "train RMSRE_tau"])
    assert np.isfinite(table.loc[SPEC_DEFAULTS, "train RMSRE_tau"]) and table.loc[SPEC_DEFAULTS, "note"] == ""
    (evaluation,) = evaluate_attribution(rows, rows, domain(), ("value",), SLICES, [2e-5], runs=1, seed=3)
    assert evaluation.best_baseline is not None and evaluation.best_baseline.method == SPEC_DEFAULTS
    evaluated = evaluation_table([evaluation]).set_index("method")
    assert evaluated.loc[EQUAL_Q95, "note"].startswith("not releasable")
    assert np.isfinite(evaluated.loc[OPTIMIZED, "ratio_to_best_baseline"])


def test_the_search_stops_at_the_first_count_limit_no_split_fits_and_evaluate_takes_its_c_max() -> None:
    """At a per-site budget of 3e-6 two queries fit one report each (1.5e-6 apiece) but not two: C = 2 leaves
    a query below one microepsilon per report, which stopped the whole search (and optimize, nightly and
    evaluate with it). Now the search ends at the first count limit no split fits; and evaluate searches up to
    the C_max it is given (it used the default whatever --max-count-limit said)."""
    rows = log(20, 3, value=np.linspace(1.0, 50.0, 240))
    taus = np.array([5.0, 50.0])
    result = optimize_attribution(AttributionProblem(3e-6, ("value",), SLICES), rows, domain(), taus=taus,
                                  simulation_seed=3)
    assert result.params.count_limit(multi_epoch=True) == 1
    assert {c.count_limit for c in result.candidates} == {1}
    with pytest.raises(InvalidParameters, match="microepsilon"):  # not even C = 1 fits: the one-line refusal
        optimize_attribution(AttributionProblem(1.5e-6, ("value",), SLICES), rows, domain(), taus=taus)
    (evaluation,) = evaluate_attribution(rows, rows, domain(), ("value",), SLICES, [1.0], max_count_limit=2)
    assert evaluation.optimized.params is not None
    assert evaluation.optimized.params.count_limit(multi_epoch=True) <= 2


def test_values_beyond_the_clip_range_are_searched_at_its_end_not_refused() -> None:
    """Valid values of ~1e13 (finite, e.g. nano-units) put the search's start and grid above the largest
    clip a parameter file holds; they are searched at MAX_CLIP_THRESHOLD (red team, round thirteen:
    optimize and nightly stopped on a clip the user never set)."""
    from araopt.constants import MAX_CLIP_THRESHOLD

    g = np.random.default_rng(3)
    rows = log(20, 2, value=g.lognormal(2.0, 1.0, 20 * 4 * 2) * 1e12)
    result = optimize_attribution(AttributionProblem(4.0, ("value",), SLICES, max_count_limit=3), rows, domain(),
                                  taus=np.array([5.0, 1e13]))
    assert result.params.queries[1].clip == MAX_CLIP_THRESHOLD
    assert all(c.clips[0] <= MAX_CLIP_THRESHOLD for c in result.candidates) and np.isfinite(result.rmsre_tau)
    from araopt.optimize.attribution import BASELINES, releasable_baseline

    problem = AttributionProblem(4.0, ("value",), SLICES, max_count_limit=3)
    for name in BASELINES:  # the baselines' clips too (round fourteen: "not releasable: clip must be ...")
        for scale, end in ((1e12, MAX_CLIP_THRESHOLD), (1e-14, 1e-12)):
            tiny_or_huge = rows.assign(value=rows["value"] / 1e12 * scale)
            baseline = releasable_baseline(name, problem, tiny_or_huge)
            assert not isinstance(baseline, str), baseline
            assert baseline.queries[1].clip == pytest.approx(end)
