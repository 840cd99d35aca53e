"""Plots a person can read without the code (engine-free; matplotlib's Agg canvas, imported lazily).

Each figure has a builder returning the matplotlib ``Figure`` (``*_figure``: for tests and notebooks)
and a writer that renders it to a PNG file (or bytes) and returns the path (or bytes):

* ``estimates_plot``: released estimates with their 95% intervals, the largest slices by count, one
  panel for the count and one per value query, slices named by their columns.
* ``noise_plot``: the debug report's noise (noisy - unnoised) against the unnoised metric per key kind,
  with the theoretical +-1.96 sd band of DLap(eps/Gamma), noisy vs unnoised on log axes with y = x,
  and the noise histogram against the DLap distribution.
* ``nightly_report_png``: predicted RMSRE_tau per integer count limit C with the chosen C and the
  baselines, tau stated; the published parameter versions over time.
* ``rmsre_plot`` / ``count_limit_plot`` / ``coverage_plot``: the evaluation figures (test RMSRE_tau vs
  epsilon per method, cf. the paper's Fig. (experiments); training RMSRE_tau per count limit C, "why
  this C"; coverage of each method's 95% intervals of the true totals vs epsilon).

No pyplot: every figure is a ``matplotlib.figure.Figure`` on its own ``FigureCanvasAgg``, so nothing
global (backend, current figure) is touched.
"""
from __future__ import annotations

import io
import os
import re
import textwrap
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, cast

import numpy as np
import pandas as pd

from araopt.constants import CONTRIBUTION_BUDGET
from araopt.errors import InvalidInput
from araopt.mechanism.noise import discrete_laplace_cdf, discrete_laplace_variance, noise_parameter

if TYPE_CHECKING:  # pragma: no cover - typing only
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

DPI = 110
Z_95 = 1.959963984540054
RMSRE_TAU = r"RMSRE$_\tau$"
ESTIMATE_COLUMNS = ("query", "estimate", "std_error", "ci_low", "ci_high")


# ---- helpers ------------------------------------------------------------------------------------
def _figure(width: float, height: float) -> Figure:
    """A new figure with constrained layout on its own Agg canvas (no pyplot, no global state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _wrap(text: str, fig: Figure, fontsize: float) -> str:
    """Wrap ``text`` to the figure's width (about 0.55 em per character)."""
    chars = max(20, int(fig.get_figwidth() * 72 / (0.55 * fontsize)))
    return "\n".join(textwrap.fill(line, chars) for line in text.split("\n"))


def _title(fig: Figure, title: str, subtitle: str | None = None, color: str | None = None) -> None:
    """Figure title (and a smaller subtitle line) wrapped to the figure's width."""
    text = _wrap(title, fig, 12)
    if subtitle:
        text += "\n" + _wrap(subtitle, fig, 11.5)  # drawn at the title's size (11): wrap with a margin
    fig.suptitle(text, fontsize=11, color=color)


def _caption(fig: Figure, text: str) -> None:
    """A caption under the panels (constrained layout keeps room for it)."""
    fig.supxlabel(_wrap(text, fig, 8.5), fontsize=8.5, color="0.25")


def _save(fig: Figure, path: str | os.PathLike[str]) -> str:
    fig.savefig(path, dpi=DPI)
    return os.fspath(path)


def png_bytes(fig: Figure) -> bytes:
    """A figure of this module as PNG bytes (at the module's DPI)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()



def _number(x: float) -> str:
    """Readable number: thousands separators for large ones, 3 significant digits for small ones."""
    if not np.isfinite(x):
        return "n/a"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _thousands(ax: Axes, axis: str = "x") -> None:
    from matplotlib.ticker import FuncFormatter

    formatter = FuncFormatter(lambda x, _: f"{x:,.0f}" if abs(x) >= 10 or x == 0 else f"{x:.3g}")
    (ax.xaxis if axis == "x" else ax.yaxis).set_major_formatter(formatter)


def readable_log_ticks(low: float, high: float, least: int = 3, most: int = 10) -> list[float]:
    """Major ticks of a log axis showing [low, high]: at least ``least`` of them inside it, whatever its span.

    1, 2, 5 per decade (or 1 per decade when that gives more than ``most``); 1..9 per decade when the view
    is too narrow for 1, 2, 5 (e.g. 0.15..0.65: 0.2, 0.3, ..., 0.6); evenly spaced round numbers when even
    that gives fewer than ``least`` (a view within one factor of 2)."""
    from matplotlib.ticker import LogLocator, MaxNLocator

    lo, hi = sorted((float(low), float(high)))
    if not (np.isfinite(lo) and np.isfinite(hi)) or hi <= 0:
        return []
    lo = lo if lo > 0 else hi / 10.0

    def inside(subs: tuple[float, ...]) -> list[float]:
        ticks = LogLocator(base=10, subs=subs, numticks=1000).tick_values(lo, hi)
        return [float(t) for t in ticks if lo * (1 - 1e-9) <= t <= hi * (1 + 1e-9)]

    ticks = inside((1.0, 2.0, 5.0))
    if len(ticks) > most:
        return inside((1.0,))
    if len(ticks) < least:
        ticks = inside(tuple(float(k) for k in range(1, 10)))
    if len(ticks) < least:
        ticks = [float(t) for t in MaxNLocator(nbins=4, steps=[1, 2, 2.5, 5, 10]).tick_values(lo, hi) if lo <= t <= hi]
    return ticks


def _plain_log_ticks(ax: Axes, axis: str = "y") -> None:
    """Log axis ticks as plain decimals (0.02, 0.1) instead of 2x10^-2, at least three of them labelled
    whatever the axis' span (``readable_log_ticks``, computed when the axis is drawn)."""
    from matplotlib.ticker import FuncFormatter, Locator

    target = ax.yaxis if axis == "y" else ax.xaxis

    class _Readable(Locator):
        def __call__(self) -> list[float]:
            if self.axis is None:
                return []
            low, high = self.axis.get_view_interval()
            return self.tick_values(low, high)

        def tick_values(self, vmin: float, vmax: float) -> list[float]:
            return readable_log_ticks(vmin, vmax)

    target.set_major_locator(_Readable())
    target.set_major_formatter(FuncFormatter(lambda x, _: f"{x:.3g}"))
    target.set_minor_formatter(FuncFormatter(lambda x, _: ""))


def slice_labels(frame: pd.DataFrame, slice_columns: Sequence[str]) -> pd.Series:
    """'campaignId=14, geography=7, productCategory=1' per row (vectorized)."""
    columns = list(slice_columns)
    if not columns:
        return pd.Series("all conversions", index=frame.index)
    parts = [f"{c}=" + frame[c].astype(str) for c in columns]
    # pandas takes a list of Series as `others`; pandas-stubs only admit list[str]
    return parts[0].str.cat(parts[1:], sep=", ") if len(parts) > 1 else parts[0]  # type: ignore[arg-type]


# ---- estimates ----------------------------------------------------------------------------------
def estimates_figure(estimates: pd.DataFrame, slice_columns: Sequence[str], top: int = 20) -> Figure:
    """Horizontal bars (released estimate) with 95% intervals for the ``top`` slices by estimated count;
    one panel for the count and one per value query, slices named ``column=value, ...``."""
    from matplotlib.ticker import MaxNLocator

    columns = list(slice_columns)
    missing = [c for c in (*columns, *ESTIMATE_COLUMNS) if c not in estimates.columns]
    if missing:
        raise InvalidInput(f"estimates table lacks columns {missing}")
    if estimates.duplicated([*columns, "query"]).any():
        raise InvalidInput("estimates table has more than one row for a (slice, query)")
    names = list(dict.fromkeys(estimates["query"].astype(str)))
    queries = ["count"] + [q for q in names if q != "count"] if "count" in names else names
    ranking = estimates[estimates["query"] == queries[0]]
    chosen = ranking.nlargest(top, "estimate")[columns].reset_index(drop=True) if columns else ranking.head(1)[[]]
    chosen["_rank"] = np.arange(len(chosen))
    labels = slice_labels(chosen, columns).to_numpy()
    n = len(chosen)
    label_width = max((len(s) for s in labels), default=10)
    fig = _figure(min(26.0, 0.075 * label_width + 4.6 * len(queries)), 2.4 + 0.3 * max(n, 3))
    axes = fig.subplots(1, len(queries), sharey=True, squeeze=False)[0]
    positions = np.arange(n)
    for ax, query in zip(axes, queries, strict=True):
        part = estimates[estimates["query"] == query]
        rows = chosen.merge(part, on=columns, how="left").sort_values("_rank") if columns else part.head(1)
        estimate = rows["estimate"].to_numpy(dtype=float)
        low, high = rows["ci_low"].to_numpy(dtype=float), rows["ci_high"].to_numpy(dtype=float)
        color = "tab:blue" if query == "count" else "tab:green"
        ax.barh(positions, estimate, height=0.62, color=color, alpha=0.35, label="released estimate")
        # intervals are cut at 0 and an interval of the true total need not hold the capped point estimate
        # (correction "none"): the bar spans the interval as released, the marker sits at the estimate
        center = np.clip(estimate, low, high)
        ax.errorbar(center, positions, xerr=np.vstack([center - low, high - center]), fmt="none", color="black",
                    elinewidth=1.6, capsize=4, capthick=1.6, label="95% interval")
        ax.plot(estimate, positions, "o", color="black", markersize=3)
        half = (high - low) / 2.0
        for y, x, e, h in zip(positions, high, estimate, half, strict=True):
            share = h / abs(e) if e != 0 and np.isfinite(e) else np.inf
            relative = f" ({share:.1%})" if share <= 1 else " (>100%)"
            ax.annotate(f"{_number(e)} \u00b1 {_number(h)}{relative}", xy=(x, y), xytext=(4, 0), textcoords="offset points",
                        va="center", fontsize=7.5)
        right = float(np.nanmax(high)) if n else 1.0
        ax.set_xlim(min(0.0, float(np.nanmin(low)) if n else 0.0), right * 1.55 if right > 0 else 1.0)
        _thousands(ax, "x")
        ax.xaxis.set_major_locator(MaxNLocator(5))
        ax.grid(True, axis="x", alpha=0.3)
        if query == "count":
            ax.set_title("count: conversions per slice", fontsize=10)
            ax.set_xlabel("conversions (estimated count)")
        else:
            ax.set_title(f"{query}: sum of '{query}' per slice", fontsize=10)
            ax.set_xlabel(f"{query} (sum, in the {query} column's unit)")
    axes[0].set_yticks(positions, labels, fontsize=8)
    axes[0].set_ylim(n - 0.5, -0.5)  # largest slice on top
    axes[0].set_ylabel("slice (" + ", ".join(columns) + ")" if columns else "")
    axes[0].legend(loc="lower right", fontsize=8)
    total = int((ranking["estimate"].notna()).sum())
    _title(fig, f"Released estimates of the {n} largest of {total:,} slices (ranked by estimated count)")
    corrected = "bias_corrected" in estimates.columns and bool(estimates["bias_corrected"].any())
    calibrated = "capped_estimate" in estimates.columns and bool(
        (((estimates["ci_low"] - (estimates["estimate"] - 1.96 * estimates["std_error"])).abs() > 1e-9)
         & (estimates["ci_low"] > 0)).any())  # (an interval cut at 0 is not a calibrated one)
    if corrected or calibrated:
        what = ("95% interval of the TRUE total: the differential-privacy noise and rounding plus the uncertainty "
                "of the retention ratios calibrated on the history (conversions dropped by the count limit C and "
                "value clipped at the thresholds are estimated back)")
    else:
        what = ("95% interval for the differential-privacy noise and rounding (estimate \u00b1 1.96 standard "
                "errors); it does not cover conversions dropped by the count limit C or values clipped at the "
                "thresholds (the parameters carry no calibration)")
    _caption(fig, "Bar and dot: the released (noisy) estimate. Whiskers and '\u00b1' number (and % of the estimate): "
                  f"{what}. Large slices have intervals too narrow to see: read the number.")
    return fig


def estimates_plot(estimates: pd.DataFrame, slice_columns: Sequence[str], path: str | os.PathLike[str],
                   top: int = 20) -> str:
    """Write :func:`estimates_figure` to ``path`` (PNG); returns the path."""
    return _save(estimates_figure(estimates, slice_columns, top), path)


# ---- noise of the debug report -----------------------------------------------------------------
def _kind_labels(column_names: Sequence[str]) -> list[str]:
    names = list(column_names)
    labels = [f"key of value query '{name}'" for name in names[:-1]]
    bottom = names[-1] if names else "bottom"
    labels.append("count key" if bottom == "count" else f"{bottom} key (rest of each conversion's budget)")
    return labels


def noise_figure(unnoised: np.ndarray | Sequence[int], noise: np.ndarray | Sequence[int], column_names: Sequence[str],
                 epsilon: float | None = None, contribution_budget: int | None = None,
                 max_points: int = 40_000) -> Figure:
    """Noise of the summary report keys (dense key order: ``key_id % len(column_names)`` is the kind).

    Left: noisy vs unnoised on symmetric-log axes with y = x. Middle: residual (noisy - unnoised)
    against the unnoised metric with the theoretical +-1.96 sd band of DLap(eps/Gamma) when
    ``epsilon`` is given. Right: histogram of the noise against the DLap distribution. At most
    ``max_points`` keys (a fixed random subset) are drawn as points; statistics use every key.
    """
    from matplotlib.collections import PathCollection
    from matplotlib.ticker import MaxNLocator

    unnoised = np.asarray(unnoised, dtype=np.float64).reshape(-1)
    noise = np.asarray(noise, dtype=np.float64).reshape(-1)
    if unnoised.shape != noise.shape:
        raise InvalidInput(f"unnoised has {unnoised.size} keys but noise has {noise.size}")
    kinds_count = max(1, len(column_names))
    n = unnoised.size
    if n == 0 or n % kinds_count:
        raise InvalidInput(f"{n} keys are not a whole number of slices of {kinds_count} keys ({list(column_names)})")
    kind = np.arange(n) % kinds_count
    noisy = unnoised + noise
    sd = a = None
    budget = contribution_budget
    if epsilon is not None:

        budget = CONTRIBUTION_BUDGET if contribution_budget is None else contribution_budget
        a = noise_parameter(epsilon, budget)
        sd = float(np.sqrt(discrete_laplace_variance(a)))
    shown = np.arange(n)
    if n > max_points:
        shown = np.sort(np.random.default_rng(0).choice(n, max_points, replace=False))
    labels = _kind_labels(column_names)
    colors = ["tab:green", "tab:purple", "tab:brown", "tab:olive", "tab:cyan"]
    fig = _figure(17.0, 5.6)
    left, middle, right = fig.subplots(1, 3)
    size = 14 if len(shown) <= 2_000 else (4 if len(shown) <= 20_000 else 1.5)
    alpha = 0.8 if len(shown) <= 2_000 else 0.35
    top_x = max(1.0, float(unnoised.max(initial=0.0)))
    linear_threshold = max(1.0, sd if sd is not None else float(np.std(noise)) or 1.0)
    for k in range(kinds_count):
        idx = shown[kind[shown] == k]
        color = "tab:blue" if k == kinds_count - 1 else colors[k % len(colors)]
        label = f"{labels[k]} ({int((kind == k).sum()):,} keys)"
        left.scatter(unnoised[idx], noisy[idx], s=size, alpha=alpha, color=color, label=label, linewidths=0)
        middle.scatter(unnoised[idx], noise[idx], s=size, alpha=alpha, color=color, label=label, linewidths=0)
    line = np.array([0.0, top_x * 1.5])
    left.plot(line, line, color="black", lw=1, ls="--", label="y = x (no noise)")
    for ax in (left, middle):
        ax.set_xscale("symlog", linthresh=linear_threshold)
        ax.set_xlim(-0.05 * linear_threshold, top_x * 1.5)
        ax.set_xlabel("unnoised key value (sum of contributions, debug run)")
        ax.grid(True, alpha=0.3)
    left.set_yscale("symlog", linthresh=linear_threshold)
    left.set_ylabel("noisy key value (as released)")
    left.set_title("noisy vs unnoised (symmetric log axes)", fontsize=10)
    middle.set_ylabel("noise = noisy \u2212 unnoised")
    middle.set_title("noise against the key's size", fontsize=10)
    middle.axhline(0.0, color="black", lw=1)
    _thousands(middle, "y")
    _thousands(right, "x")
    bins = np.histogram_bin_edges(noise, bins=min(60, max(10, int(np.sqrt(n)))))
    right.hist(noise, bins=bins, color="0.6", label=f"observed noise, all {n:,} keys")
    right.set_xlabel("noise = noisy \u2212 unnoised")
    right.set_ylabel("keys")
    right.yaxis.set_major_locator(MaxNLocator(integer=True))
    _thousands(right, "y")
    right.set_title("distribution of the noise", fontsize=10)
    subtitle = f"{n:,} keys"
    if sd is not None and a is not None:  # (set together)
        band = Z_95 * sd
        inside = float(np.mean(np.abs(noise) <= band)) if n else float("nan")
        edge = np.floor(band)
        expected_inside = float(discrete_laplace_cdf(np.array([edge]), a)[0]
                                - discrete_laplace_cdf(np.array([-edge - 1]), a)[0])
        band_label = (f"\u00b11.96 sd of DLap(\u03b5/\u0393) = \u00b1{_number(band)}: "
                      f"{inside:.1%} of keys inside (expected {expected_inside:.1%})")
        middle.axhspan(-band, band, color="tab:orange", alpha=0.18, label=band_label)
        xs = np.concatenate([[0.0], np.geomspace(linear_threshold / 100, top_x * 1.5, 200)])
        left.fill_between(xs, xs - band, xs + band, color="tab:orange", alpha=0.18, label="\u00b11.96 sd band")
        right.axvline(-band, color="tab:orange", lw=1.2, ls="--", label="\u00b11.96 sd")
        right.axvline(band, color="tab:orange", lw=1.2, ls="--")
        width = bins[1] - bins[0]
        grid = np.linspace(bins[0], bins[-1], 400)
        expected = n * width * np.tanh(a / 2.0) * np.exp(-a * np.abs(grid))
        right.plot(grid, expected, color="tab:orange", lw=2, label="expected: DLap(\u03b5/\u0393)")
        subtitle = (f"{n:,} keys, \u03b5 = {epsilon:g}, \u0393 = {budget:,}: noise ~ discrete Laplace with "
                    f"a = \u03b5/\u0393, sd = {_number(sd)} (same for every key)")
    else:
        subtitle += f"; observed noise sd = {_number(float(np.std(noise)))}"
    for ax, loc in ((left, "upper left"), (middle, "upper right")):
        legend = ax.legend(fontsize=7.5, loc=loc, markerscale=float(np.sqrt(30.0 / size)))
        for handle in legend.legend_handles:
            if isinstance(handle, PathCollection):  # the dots, not the band
                handle.set_alpha(1.0)
    right.legend(fontsize=7.5, loc="upper right")
    if len(shown) < n:
        subtitle += f"; points: a random {len(shown):,} of the keys"
    _title(fig, "Noise added to the summary report keys (debug run, operator-private)", subtitle)
    counted = ("the count key is the slice's count" if list(column_names)[-1:] == ["count"]
               else "a slice's count is reconstructed from the sum of its keys")
    _caption(fig, "Each dot is one key of the summary report. Keys far above the band are barely changed by the "
                  "noise (they sit on y = x); keys inside the band are dominated by it. Every kind of key gets the "
                  f"same noise; {counted}.")
    return fig


def noise_plot(unnoised: np.ndarray | Sequence[int], noise: np.ndarray | Sequence[int], column_names: Sequence[str],
               path: str | os.PathLike[str], epsilon: float | None = None, contribution_budget: int | None = None,
               max_points: int = 40_000) -> str:
    """Write :func:`noise_figure` to ``path`` (PNG); returns the path."""
    return _save(noise_figure(unnoised, noise, column_names, epsilon, contribution_budget, max_points), path)


# ---- nightly report -----------------------------------------------------------------------------
def _baseline_label(name: str) -> str:
    """'baseline_q95' / 'q0.95' -> 'baseline q=0.95 (C, clip at the 95th percentile)'."""
    match = re.search(r"q\s*=?\s*(0?\.\d+|\d+)", name)
    if not match:
        return name.replace("_", " ")
    digits = match.group(1)
    q = float(digits) if "." in digits else float(f"0.{digits}")
    return f"baseline q={q:g} (C and clip thresholds at the {q * 100:g}th percentile)"


def _taus_text(taus: Mapping[str, float] | Sequence[tuple[str, float]]) -> str:
    pairs = list(taus.items()) if isinstance(taus, Mapping) else [(name, value) for name, value in taus]
    return ", ".join(f"{name} {_number(float(value))}" for name, value in pairs)


def nightly_report_figure(
    per_count_limit: pd.DataFrame, chosen_count_limit: int, baselines: Mapping[str, float],
    taus: Mapping[str, float] | Sequence[tuple[str, float]],
    history: Sequence[tuple[str, int, float | None]], refused: Sequence[str] = (), release_period_days: float | None = None,
    predicted: tuple[float, str] | None = None,
) -> Figure:
    """Left: predicted RMSRE_tau per integer C, the chosen C, each baseline as a labelled line.
    Right: the published versions (C and predicted RMSRE_tau on two labelled y axes). ``refused``:
    the guardrails' reasons not to publish, shown as a red banner (the choice was NOT published).
    ``predicted``: the version's predicted RMSRE_tau and how it was made (the one number the console
    and the run report print: replayed on the window's days, or the error model); the chosen point,
    its label and the baselines' ratios show it. None: the search's value at the chosen C."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    table = per_count_limit.sort_values("C")
    counts = table["C"].to_numpy(dtype=int)
    errors = table["rmsre_tau"].to_numpy(dtype=float)
    fig = _figure(14.0, 6.6)
    left, right = fig.subplots(1, 2, width_ratios=[1.15, 1])
    curve = "error model: best " if predicted is not None else "optimized: best "
    left.plot(counts, errors, marker="o", markersize=4, color="tab:blue", label=f"{curve}{RMSRE_TAU} at each C")
    chosen_error = errors[counts == chosen_count_limit]
    chosen_value = float(chosen_error[0]) if chosen_error.size else float("nan")
    how = ""
    if predicted is not None and predicted[0] is not None and np.isfinite(predicted[0]):
        chosen_value, how = float(predicted[0]), f" ({predicted[1]})"
    chosen_text = f"{chosen_value:.4g}{how}" if np.isfinite(chosen_value) else "n/a (C not in the table)"
    left.axvline(chosen_count_limit, color="tab:blue", ls=":", lw=1)
    left.plot([chosen_count_limit], [chosen_value], marker="*", markersize=16, color="tab:red", ls="none",
              label=f"chosen C = {chosen_count_limit}: predicted {RMSRE_TAU} = {chosen_text}")
    styles = ["--", "-.", (0, (5, 2, 1, 2)), ":"]
    palette = ["tab:orange", "tab:green", "tab:purple", "tab:brown"]
    for i, (name, value) in enumerate(baselines.items()):
        ratio = f" (\u00d7{value / chosen_value:.1f})" if np.isfinite(chosen_value) and chosen_value > 0 else ""
        left.axhline(float(value), color=palette[i % len(palette)], ls=styles[i % len(styles)], lw=1.6,
                     label=f"{_baseline_label(name)}: {float(value):.4g}{ratio}")
    left.set_yscale("log")
    _plain_log_ticks(left, "y")
    if len(counts) <= 30:
        left.set_xticks(counts)
    else:
        left.xaxis.set_major_locator(MaxNLocator(integer=True))
    left.set_xlabel("count limit C (conversions kept per impression)")
    period = ("one release of the training window" if release_period_days is None
              else f"one release of {release_period_days:g} day(s)")
    left.set_ylabel(f"predicted {RMSRE_TAU} of {period} (lower is better)")

    left.set_title(f"Why C = {chosen_count_limit}: predicted error for each count limit", fontsize=10)
    left.grid(True, which="both", alpha=0.3)
    # below the panel, never over a line (the baselines are horizontal lines across the whole panel)
    left.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=1, frameon=False)
    right.set_title(f"Published parameter versions ({len(history)})", fontsize=10)
    if history:
        versions = [str(h[0]) for h in history]
        xs = np.arange(len(history))
        past = np.array([np.nan if h[2] is None else float(h[2]) for h in history])
        limits = np.array([int(h[1]) for h in history])
        right.plot(xs, past, marker="o", markersize=8, color="tab:blue")
        right.set_ylabel(f"predicted {RMSRE_TAU} (blue circles)", color="tab:blue")
        right.set_ylim(0.0, max(float(np.nanmax(past)) * 1.3, 1e-3) if np.isfinite(past).any() else 1.0)
        twin = right.twinx()
        twin.plot(xs, limits, marker="s", markersize=8, color="tab:orange", ls="--", drawstyle="steps-mid")
        twin.set_ylabel("count limit C (orange squares)", color="tab:orange")
        twin.yaxis.set_major_locator(MaxNLocator(integer=True))
        twin.set_ylim(0, max(limits.max(initial=1) + 2, 3))
        right.set_xticks(xs, versions, rotation=30 if len(versions) > 1 else 0,
                         ha="right" if len(versions) > 1 else "center", fontsize=8 if len(versions) <= 20 else 6)
        right.set_xlim(-0.6, len(history) - 0.4)
        right.set_xlabel("version (as-of date and run id), oldest to newest")
        right.legend(handles=[Line2D([], [], marker="o", color="tab:blue", label=f"predicted {RMSRE_TAU} (left axis)"),
                              Line2D([], [], marker="s", color="tab:orange", ls="--", label="count limit C (right axis)")],
                     fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
        right.grid(True, alpha=0.3)
    else:
        right.text(0.5, 0.5, "no published versions yet", ha="center", va="center", transform=right.transAxes)
        right.set_axis_off()
    head = f"Nightly parameter choice: C = {chosen_count_limit}, predicted {RMSRE_TAU} = {chosen_text}"
    if refused:
        head = "NOT PUBLISHED: " + "; ".join(refused) + f" -- refused choice: C = {chosen_count_limit}"
    _title(fig, head, f"{RMSRE_TAU}: root mean squared relative error over slices, each error divided by max(true value, "
                      f"\u03c4); \u03c4 = {_taus_text(taus)}", color="tab:red" if refused else None)
    return fig


def nightly_report_png(
    per_count_limit: pd.DataFrame, chosen_count_limit: int, baselines: Mapping[str, float],
    taus: Mapping[str, float] | Sequence[tuple[str, float]],
    history: Sequence[tuple[str, int, float | None]], refused: Sequence[str] = (), release_period_days: float | None = None,
    predicted: tuple[float, str] | None = None,
) -> bytes:
    """PNG bytes of :func:`nightly_report_figure` (``per_count_limit`` has columns C and rmsre_tau;
    ``taus`` maps query name (count first) to tau; ``history`` is (version, C, predicted RMSRE_tau))."""
    return png_bytes(nightly_report_figure(per_count_limit, chosen_count_limit, baselines, taus, history, refused,
                                           release_period_days, predicted))


# ---- evaluation ---------------------------------------------------------------------------------
def _epsilon_axis(ax: Axes, epsilons: pd.Series | np.ndarray) -> None:
    """A log2 epsilon axis with exactly the evaluated epsilons as ticks, labelled 1, 2, 4, ..."""
    from matplotlib.ticker import FixedLocator, NullLocator

    values = np.sort(np.unique(np.asarray(epsilons, dtype=np.float64)))
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(cast(Sequence[float], values)))  # (an array works as well)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticks(values, [f"{e:g}" for e in values])


def rmsre_figure(results: pd.DataFrame, with_monte_carlo: bool = True) -> Figure:
    """Test RMSRE_tau vs epsilon (log2 axis), one line per method, one panel per dataset (cf. Fig. experiments)."""

    from araopt.evaluation.methods import METHOD_LABELS, METHODS  # the optimizer: not for a release's report

    names = list(dict.fromkeys(results["dataset"]))
    fig = _figure(max(6.4, 5.4 * len(names)), 5.0)
    axes = fig.subplots(1, len(names), squeeze=False)[0]
    for ax, name in zip(axes, names, strict=True):
        sub = results[results["dataset"] == name]
        for method in [m for m in METHODS if m in set(sub["method"])]:
            s = sub[sub["method"] == method].sort_values("epsilon")
            ax.plot(s["epsilon"], s["test_rmsre_tau"], marker="o", label=METHOD_LABELS.get(method, method),
                    linestyle="--" if method == "optimized_l1" else "-")
        if with_monte_carlo and "mc_rmsre_tau" in sub and sub["mc_rmsre_tau"].notna().any():
            mc = sub[sub["mc_rmsre_tau"].notna()]
            runs = int(mc["mc_runs"].max()) if "mc_runs" in mc else 0
            ax.errorbar(mc["epsilon"], mc["mc_rmsre_tau"], yerr=2 * mc["mc_std_error"], fmt="x", color="k",
                        markersize=5, capsize=2, label=f"Monte-Carlo, {runs} runs (\u00b12 s.e.)")
        _epsilon_axis(ax, sub["epsilon"])
        ax.set_yscale("log")
        _plain_log_ticks(ax, "y")
        ax.set_xlabel("privacy budget \u03b5 (log scale)")
        ax.set_ylabel(f"test {RMSRE_TAU} (lower is better)")
        ax.set_title(name, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    _title(fig, f"Error of each method on the test data: {RMSRE_TAU} vs \u03b5",
           "parameters tuned on the training data; lines: analytic expectation")
    return fig


def rmsre_plot(results: pd.DataFrame, path: str | os.PathLike[str], with_monte_carlo: bool = True) -> str:
    """Write :func:`rmsre_figure` to ``path`` (PNG); returns the path."""
    return _save(rmsre_figure(results, with_monte_carlo), path)


def coverage_figure(results: pd.DataFrame, nominal: float = 0.95) -> Figure:
    """Empirical coverage of each method's nominal 95% intervals of the TRUE test totals vs epsilon, one
    panel per (dataset, query), the nominal level drawn and the [90%, 99%] band shaded."""

    queries = [c[len("coverage_"):] for c in results.columns if c.startswith("coverage_")]
    if not queries:
        raise InvalidInput("results have no coverage_<query> columns (run the evaluation with Monte-Carlo runs)")
    from araopt.evaluation.methods import METHOD_LABELS, METHODS  # the optimizer: not for a release's report

    names = list(dict.fromkeys(results["dataset"]))
    panels = [(name, query) for name in names for query in queries]
    fig = _figure(max(6.4, 4.6 * len(panels)), 4.8)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (name, query) in zip(axes, panels, strict=True):
        sub = results[(results["dataset"] == name) & results[f"coverage_{query}"].notna()]
        for method in [m for m in METHODS if m in set(sub["method"])]:
            s = sub[sub["method"] == method].sort_values("epsilon")
            ax.plot(s["epsilon"], 100.0 * s[f"coverage_{query}"], marker="o", label=METHOD_LABELS.get(method, method),
                    linestyle="--" if method == "optimized_l1" else "-")
        ax.axhspan(90.0, 99.0, color="tab:green", alpha=0.12, label="90\u201399%")
        ax.axhline(100.0 * nominal, color="k", lw=1.0, ls=":", label=f"nominal {100 * nominal:g}%")
        _epsilon_axis(ax, sub["epsilon"])
        ax.set_ylim(0.0, 102.0)
        ax.set_xlabel("privacy budget \u03b5 (log scale)")
        ax.set_ylabel("intervals covering the true total (%)")
        ax.set_title(f"{name}: {query}", fontsize=10)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=7.5, loc="lower right")
    _title(fig, "Do the 95% intervals cover the TRUE test totals?",
           "share of slices \u00d7 noise draws whose interval contains the true total; Alg. 4's intervals "
           "target the capped, clipped sum, the corrected method's the truth")
    return fig


def coverage_plot(results: pd.DataFrame, path: str | os.PathLike[str]) -> str:
    """Write :func:`coverage_figure` to ``path`` (PNG); returns the path."""
    return _save(coverage_figure(results), path)


def count_limit_figure(curves: pd.DataFrame) -> Figure:
    """Why this C: best training RMSRE_tau for each count limit C, one line per epsilon (chosen C starred)."""
    from matplotlib.lines import Line2D

    names = list(dict.fromkeys(curves["dataset"]))
    fig = _figure(max(6.4, 5.4 * len(names)), 5.0)
    axes = fig.subplots(1, len(names), squeeze=False)[0]
    for ax, name in zip(axes, names, strict=True):
        sub = curves[curves["dataset"] == name]
        for eps in sorted(set(sub["epsilon"])):
            s = sub[sub["epsilon"] == eps].sort_values("C")
            line = ax.plot(s["C"], s["train_rmsre_tau"], label=f"\u03b5 = {eps:g}")[0]
            chosen = s[s["chosen"].astype(bool)]
            ax.plot(chosen["C"], chosen["train_rmsre_tau"], marker="*", markersize=13, color=line.get_color(), ls="none")
        counts = np.sort(sub["C"].unique()).astype(int)
        ax.set_xticks(counts if len(counts) <= 25 else counts[:: int(np.ceil(len(counts) / 20))])
        ax.set_yscale("log")
        _plain_log_ticks(ax, "y")
        ax.set_xlabel("count limit C (conversions kept per impression)")
        ax.set_ylabel(f"best training {RMSRE_TAU} at this C")
        ax.set_title(name, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        handles, _ = ax.get_legend_handles_labels()
        ax.legend(handles=handles + [Line2D([], [], marker="*", color="0.3", ls="none", markersize=11,
                                            label="chosen C")], fontsize=8, ncol=2)
    _title(fig, f"Best {RMSRE_TAU} for each count limit C (\u2605 = chosen)",
           "small C drops conversions (capping bias), large C adds noise")
    return fig


def count_limit_plot(curves: pd.DataFrame, path: str | os.PathLike[str]) -> str:
    """Write :func:`count_limit_figure` to ``path`` (PNG); returns the path."""
    return _save(count_limit_figure(curves), path)


REPLAY_LABELS = {"private_safe": "privacy-safe (releases + first-party only)",
                 "cold_start": "cold start (the privacy-safe day-1 rule, every day)",
                 "fully_informed": "fully informed (raw joined history)",
                 "baseline_q95": "baseline q95", "baseline_q99": "baseline q99"}


def replay_figure(frame: pd.DataFrame, title: str = "") -> Figure:
    """RMSRE_tau of each method's release per replayed day (``evaluation.replay``), log scale."""
    fig = _figure(9.0, 4.8)
    ax = fig.subplots()
    for method in dict.fromkeys(frame["method"]):
        sub = frame[frame["method"] == method].sort_values("day")
        ax.plot(pd.to_datetime(sub["day"]), sub["rmsre_tau"], marker="o", markersize=3,
                label=REPLAY_LABELS.get(method, method), linestyle="--" if method.startswith("baseline") else "-")
    ax.set_yscale("log")
    _plain_log_ticks(ax, "y")
    ax.set_xlabel("replayed day (each measured with the parameters chosen before it)")
    ax.set_ylabel(f"{RMSRE_TAU} of the released estimates (lower is better)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.autofmt_xdate()
    _title(fig, f"Replay: {RMSRE_TAU} per day per method" + (f" ({title})" if title else ""),
           "OPERATOR-PRIVATE backtest on a joined log: simulated (seeded) releases scored against the true totals")
    return fig


def replay_plot(frame: pd.DataFrame, path: str | os.PathLike[str], title: str = "") -> str:
    """Write :func:`replay_figure` to ``path`` (PNG); returns the path."""
    return _save(replay_figure(frame, title), path)
