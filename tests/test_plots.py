"""Each plot of ``araopt.evaluation.plots`` rendered from small synthetic inputs: the PNG is written and decodes,
and the properties a reader needs are checked on the matplotlib objects (labels, slice names,
intervals, y = x and the noise band, integer C ticks, labelled baselines, titles inside the figure)."""
from __future__ import annotations

import ast
import io
import os

import numpy as np
import pandas as pd
import pytest

from araopt.evaluation import evaluate as evaluation
from araopt.evaluation import methods, plots

matplotlib = pytest.importorskip("matplotlib")
from matplotlib.container import ErrorbarContainer  # noqa: E402
from matplotlib.image import imread  # noqa: E402


def _check_png(source) -> None:
    if isinstance(source, (str, os.PathLike)):
        assert os.path.getsize(source) > 10_000
    image = imread(source, format="png")
    assert image.ndim == 3 and image.shape[0] > 300 and image.shape[1] > 500
    assert float(np.std(image[..., :3])) > 0.01  # not a blank canvas


def _inside_figure(fig) -> None:
    """Render ``fig`` once (to a PNG that must decode), then check that every figure and axes title lies
    within the figure's canvas (nothing cut at the edges)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")  # draws at the figure's own dpi: the layout below is that of the PNG
    buffer.seek(0)
    _check_png(buffer)
    renderer = fig.canvas.get_renderer()
    box = fig.bbox
    texts = [t for t in (fig._suptitle, fig._supxlabel) if t is not None and t.get_text()]
    texts += [ax.title for ax in fig.axes if ax.get_title()]
    assert texts
    for text in texts:
        extent = text.get_window_extent(renderer)
        assert extent.x0 >= box.x0 - 1 and extent.x1 <= box.x1 + 1, text.get_text()
        assert extent.y0 >= box.y0 - 1 and extent.y1 <= box.y1 + 1, text.get_text()


def _legend_texts(ax) -> list[str]:
    legend = ax.get_legend()
    return [t.get_text() for t in legend.get_texts()] if legend else []


def _estimates() -> pd.DataFrame:
    rng = np.random.default_rng(3)
    slices = pd.DataFrame({"campaignId": np.repeat(np.arange(10), 3), "geography": np.tile(["US", "DE", "FR"], 10)})
    frames = []
    for query, scale in (("count", 1.0), ("value", 40.0)):
        estimate = rng.uniform(50, 5_000, len(slices)) * scale
        se = np.full(len(slices), 20.0 * scale)
        frames.append(slices.assign(query=query, estimate=estimate, std_error=se, ci_low=estimate - 1.96 * se,
                                    ci_high=estimate + 1.96 * se))
    return pd.concat(frames, ignore_index=True)


def test_module_imports_no_matplotlib_or_beam_at_import_time():
    tree = ast.parse(open(plots.__file__).read())
    top_level = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    names = [alias.name for node in top_level if isinstance(node, ast.Import) for alias in node.names]
    names += [node.module or "" for node in top_level if isinstance(node, ast.ImportFrom)]
    assert not [n for n in names if n.startswith(("matplotlib", "apache_beam"))]
    assert "apache_beam" not in open(plots.__file__).read()


@pytest.mark.rendering
def test_estimates_plot_count_and_value_panels_with_named_slices_and_intervals(tmp_path):
    estimates = _estimates()
    fig = plots.estimates_figure(estimates, ["campaignId", "geography"], top=8)
    count_axes, value_axes = fig.axes[:2]
    assert "conversions" in count_axes.get_xlabel()
    assert "value" in value_axes.get_xlabel() and "unit" in value_axes.get_xlabel()
    labels = [t.get_text() for t in count_axes.get_yticklabels()]
    assert len(labels) == 8 and all(t.startswith("campaignId=") and ", geography=" in t for t in labels)
    counts = estimates[estimates["query"] == "count"].nlargest(8, "estimate")
    expected_top = f"campaignId={counts.iloc[0]['campaignId']}, geography={counts.iloc[0]['geography']}"
    assert labels[0] == expected_top  # the largest slice is named first (at the top)
    for ax in (count_axes, value_axes):
        assert ax.get_xscale() == "linear"
        bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
        assert len(bars) == 1 and bars[0].has_xerr
        segments = bars[0].lines[2][0].get_segments()
        assert len(segments) == 8 and all(seg[1][0] > seg[0][0] for seg in segments)  # intervals drawn
    assert "95%" in fig._supxlabel.get_text()
    _inside_figure(fig)
    path = plots.estimates_plot(estimates, ["campaignId", "geography"], tmp_path / "estimates.png")
    _check_png(path)


@pytest.mark.rendering
def test_estimates_plot_draws_an_interval_that_does_not_hold_the_point_estimate():
    # correction "none": the released point is the capped estimate (biased low), the interval is the
    # true total's and may lie wholly above it
    estimates = _estimates()
    estimates["ci_low"] = estimates["estimate"] * 1.1
    estimates["ci_high"] = estimates["estimate"] * 1.3
    fig = plots.estimates_figure(estimates, ["campaignId", "geography"], top=4)
    bars = [c for c in fig.axes[0].containers if isinstance(c, ErrorbarContainer)]
    segments = bars[0].lines[2][0].get_segments()
    counts = estimates[estimates["query"] == "count"].nlargest(4, "estimate")
    lows = sorted(seg[0][0] for seg in segments)
    assert lows == pytest.approx(sorted(counts["ci_low"]))


@pytest.mark.rendering
def test_estimates_plot_draws_an_interval_cut_at_zero_beside_a_negative_estimate(tmp_path):
    estimates = _estimates()
    value = estimates.index[estimates["query"] == "value"][0]  # a value sum whose noisy estimate is below 0
    estimates.loc[value, ["estimate", "ci_low", "ci_high"]] = [-30.0, 0.0, 40.0]
    fig = plots.estimates_figure(estimates, ["campaignId", "geography"], top=30)
    bars = [c for c in fig.axes[1].containers if isinstance(c, ErrorbarContainer)][0]
    spans = {(round(seg[0][0], 6), round(seg[1][0], 6)) for seg in bars.lines[2][0].get_segments()}
    assert (0.0, 40.0) in spans  # the interval as released, not [-30, 40]
    assert "noise and rounding" in fig._supxlabel.get_text()  # a cut interval is not a calibrated one
    _check_png(plots.estimates_plot(estimates, ["campaignId", "geography"], tmp_path / "e.png"))


@pytest.mark.rendering
def test_estimates_plot_refuses_missing_columns():
    with pytest.raises(ValueError, match="lacks columns"):
        plots.estimates_figure(_estimates().drop(columns="ci_low"), ["campaignId", "geography"])


def _debug_report(slices: int = 400, epsilon: float = 8.0, shares: tuple[float, ...] = (0.4, 0.1, 2.0)):
    """Dense key order: slice-major, one key per share (value queries, then bottom or count)."""
    from araopt.mechanism.noise import discrete_laplace_variance, noise_parameter

    rng = np.random.default_rng(5)
    base = rng.pareto(1.2, slices) * 20_000
    unnoised = np.round(base[:, None] * np.asarray(shares)[None, :]).ravel()
    sd = np.sqrt(discrete_laplace_variance(noise_parameter(epsilon, 65536)))
    noise = np.round(rng.laplace(0.0, sd / np.sqrt(2), unnoised.size))
    return unnoised, noise


@pytest.mark.rendering
def test_noise_plot_residuals_with_band_and_y_equals_x_per_key_kind(tmp_path):
    unnoised, noise = _debug_report()
    fig = plots.noise_figure(unnoised, noise, ("revenue", "items", "bottom"), epsilon=8.0, contribution_budget=65536)
    scatter, residual, histogram = fig.axes[:3]
    legend = " | ".join(_legend_texts(scatter) + _legend_texts(residual))
    for kind in ("'revenue'", "'items'", "bottom key"):
        assert kind in legend
    assert any(line.get_label().startswith("y = x") for line in scatter.get_lines())
    assert "1.96 sd" in " ".join(_legend_texts(residual))
    assert "noisy" in residual.get_ylabel() and "unnoised" in residual.get_xlabel()
    assert [len(c.get_offsets()) for c in residual.collections if c.get_label().startswith("key")][:1] == [400]
    assert "expected: DLap" in " ".join(_legend_texts(histogram))
    assert "\u03b5 = 8" in fig._suptitle.get_text()
    _inside_figure(fig)
    _check_png(plots.noise_plot(unnoised, noise, ("revenue", "items", "bottom"), tmp_path / "noise.png", epsilon=8.0))


@pytest.mark.rendering
def test_noise_plot_subsamples_points_and_works_without_epsilon():
    unnoised, noise = _debug_report(slices=2_000, shares=(3.0, 1.0))
    fig = plots.noise_figure(unnoised, noise, ("value", "count"), max_points=1_000)
    drawn = sum(len(c.get_offsets()) for c in fig.axes[1].collections if c.get_label().endswith("keys)"))
    assert drawn == 1_000
    assert "count key" in " ".join(_legend_texts(fig.axes[1]))
    assert "a random 1,000 of the keys" in fig._suptitle.get_text()
    with pytest.raises(ValueError, match="keys"):
        plots.noise_figure(unnoised, noise[:-1], ("value", "count"))
    with pytest.raises(ValueError, match="whole number of slices"):
        plots.noise_figure(unnoised[:-1], noise[:-1], ("value", "count"))


def _nightly_inputs(versions: int):
    per_count_limit = pd.DataFrame({"C": np.arange(1, 21), "rmsre_tau": 0.9 * np.exp(-np.arange(20) / 4) + 0.02})
    history = [(f"2026-11-{day:02d}-r{day}", 14 + day % 3, 0.03 - 0.001 * day) for day in range(1, versions + 1)]
    return per_count_limit, 16, {"baseline_q95": 0.1, "baseline_q99": 0.05}, {"count": 5.0, "value": 328.8}, history


@pytest.mark.rendering
def test_nightly_report_integer_c_baselines_tau_and_history():
    per_count_limit, chosen, baselines, taus, history = _nightly_inputs(4)
    fig = plots.nightly_report_figure(per_count_limit, chosen, baselines, taus, history)
    left, right = fig.axes[:2]
    ticks = left.get_xticks()
    assert len(ticks) and np.allclose(ticks, np.round(ticks))
    legend = _legend_texts(left)
    assert any("chosen C = 16" in t for t in legend)
    for q in ("0.95", "0.99"):
        assert any(f"baseline q={q}" in t for t in legend)
    horizontal = [line for line in left.get_lines() if np.ptp(line.get_ydata()) == 0 and "baseline" in line.get_label()]
    assert sorted(float(line.get_ydata()[0]) for line in horizontal) == [0.05, 0.1]
    assert "\u03c4 = count 5, value 329" in fig._suptitle.get_text()
    assert "version" in right.get_xlabel() and right.get_ylabel()
    twin = fig.axes[2]
    assert "count limit C" in twin.get_ylabel()
    assert np.allclose(twin.get_yticks(), np.round(twin.get_yticks()))
    assert len(_legend_texts(right)) == 2
    _inside_figure(fig)


@pytest.mark.rendering
def test_nightly_report_png_with_one_version_and_with_none():
    per_count_limit, chosen, baselines, taus, history = _nightly_inputs(1)
    fig = plots.nightly_report_figure(per_count_limit, chosen, baselines, taus, history)
    assert fig.axes[1].get_lines()[0].get_marker() == "o"  # a single version is a visible marker
    _check_png(io.BytesIO(plots.nightly_report_png(per_count_limit, chosen, baselines, list(taus.items()), history)))
    _check_png(io.BytesIO(plots.nightly_report_png(per_count_limit, chosen, baselines, taus, [])))


@pytest.mark.parametrize("low, high", [(0.15, 0.65), (0.151, 0.2), (0.02, 0.9), (1e-4, 10.0), (0.3, 0.31)])
def test_a_log_axis_gets_at_least_three_labelled_ticks_inside_its_view(low, high):
    ticks = plots.readable_log_ticks(low, high)
    assert len(ticks) >= 3 and all(low * (1 - 1e-9) <= t <= high * (1 + 1e-9) for t in ticks)
    assert len(ticks) <= 10 and ticks == sorted(ticks)


@pytest.mark.rendering
def test_nightly_report_narrow_error_range_is_labelled_and_the_legend_covers_no_line():
    """A per-C curve between 0.15 and 0.65 (less than a decade: 1-2-5 ticks would label only 0.2 and 0.5)
    gets at least three labelled y ticks, and the legend lies outside the panel, so no baseline line runs
    under it."""
    per_count_limit = pd.DataFrame({"C": np.arange(1, 21), "rmsre_tau": 0.15 + 0.3 * np.exp(-np.arange(20) / 3)})
    baselines = {"baseline_q95": 0.282, "baseline_q99": 0.627}  # the q99 line near the panel's top
    fig = plots.nightly_report_figure(per_count_limit, 13, baselines, {"count": 5.0, "value": 332.0},
                                      [("2026-11-15-demo", 13, 0.151)])
    _inside_figure(fig)
    left = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    low, high = left.get_ylim()
    labelled = [t for t in left.yaxis.get_major_ticks()
                if t.label1.get_visible() and t.label1.get_text() and low <= t.get_loc() <= high]
    assert len(labelled) >= 3, [t.label1.get_text() for t in labelled]
    for ax in fig.axes[:2]:
        legend = ax.get_legend().get_window_extent(renderer)
        panel = ax.get_window_extent(renderer)
        assert legend.y1 <= panel.y0, "the legend overlaps the panel"


def _evaluation_frames():
    rows, curves = [], []
    for eps in (1.0, 4.0, 16.0):
        for i, method in enumerate(methods.METHODS):
            value = (0.3 + 0.2 * i) / np.sqrt(eps)
            rows.append({"dataset": "synth", "epsilon": eps, "method": method, "test_rmsre_tau": value,
                         "mc_rmsre_tau": value * 1.01, "mc_std_error": value * 0.02, "mc_runs": 5})
        for c in range(1, 11):
            curves.append({"dataset": "synth", "epsilon": eps, "C": c, "train_rmsre_tau": 1 / c + c / (40 * eps),
                           "chosen": c == 6})
    return pd.DataFrame(rows), pd.DataFrame(curves)


@pytest.mark.rendering
def test_rmsre_and_count_limit_plots_titles_fit_and_aliases_remain(tmp_path):
    results, curves = _evaluation_frames()
    fig = plots.count_limit_figure(curves)
    _inside_figure(fig)
    ax = fig.axes[0]
    assert np.allclose(ax.get_xticks(), np.arange(1, 11))
    assert "count limit C" in ax.get_xlabel() and any("chosen" in t for t in _legend_texts(ax))
    fig = plots.rmsre_figure(results)
    _inside_figure(fig)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "4", "16"]
    assert any("Monte-Carlo" in t for t in _legend_texts(ax))
    assert evaluation.plot_rmsre is plots.rmsre_plot and evaluation.plot_count_limit is plots.count_limit_plot
    _check_png(plots.rmsre_plot(results, tmp_path / "rmsre.png"))
    _check_png(plots.count_limit_plot(curves, tmp_path / "count_limit.png"))


@pytest.mark.rendering
def test_coverage_plot_one_panel_per_dataset_and_query_with_the_nominal_level(tmp_path):
    results, _ = _evaluation_frames()
    results["coverage_count"] = np.where(results["method"] == "corrected", 0.95, 0.6)
    results["coverage_value"] = np.where(results["method"] == "corrected", 0.94, 0.3)
    fig = plots.coverage_figure(results)
    _inside_figure(fig)
    assert [ax.get_title() for ax in fig.axes] == ["synth: count", "synth: value"]
    ax = fig.axes[0]
    assert "true total" in ax.get_ylabel() and "\u03b5" in ax.get_xlabel()
    assert any("nominal 95%" in t for t in _legend_texts(ax))
    corrected = [line for line in ax.get_lines() if line.get_label() == methods.METHOD_LABELS["corrected"]]
    assert len(corrected) == 1 and np.allclose(corrected[0].get_ydata(), 95.0)  # percent, per epsilon
    _check_png(plots.coverage_plot(results, tmp_path / "coverage.png"))
    with pytest.raises(ValueError, match="coverage"):
        plots.coverage_figure(results.drop(columns=["coverage_count", "coverage_value"]))
