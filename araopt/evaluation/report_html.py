"""One self-contained HTML page per release (``measure``) and per nightly run: what a person opens first.

A page holds the warnings (simulation, uncalibrated estimates, the calendar's NOTE, a cold start, a
missing lookback, a guardrail refusal), the numbers with their intervals in sortable tables, the
parameter version in force (C, clip thresholds, budget fractions, the predicted RMSRE_tau of one
release, Def. 3.2) and the published versions over time, the PNG figures inline, and relative links to
the files of the run. It is static: CSS and the small table-sorting script are inline, images are
``data:`` URIs, and nothing is fetched from the network, so the file can be opened anywhere (also
offline) and archived as it is.

The pages are operator-private: a release page shows the run's exact accounting next to the released
numbers, and a nightly page the training history's row counts. They are written under ``private/``
(measure) and beside the nightly run report, never into a release folder.
"""
from __future__ import annotations

import base64
import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from araopt.io.run_folder import RunFolder
from araopt.version import ParameterVersion

RMSRE_TAU = "RMSRE_\u03c4"

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;max-width:1200px;
padding:16px 24px;color:#1b1b1b;background:#fff;line-height:1.4}
h1{font-size:1.5em;margin:0.2em 0}h2{font-size:1.15em;margin:1.4em 0 0.4em;border-bottom:1px solid #ddd}
.sub{color:#555;margin:0 0 0.8em}
.warn{background:#fff4e5;border-left:4px solid #e07b00;padding:6px 10px;margin:4px 0}
.bad{background:#fdecea;border-left:4px solid #c62828;padding:6px 10px;margin:4px 0;font-weight:600}
.ok{background:#e8f5e9;border-left:4px solid #2e7d32;padding:6px 10px;margin:4px 0}
.private{color:#c62828;font-weight:600}
table{border-collapse:collapse;font-size:0.85em;margin:4px 0 8px}
th,td{border:1px solid #ccc;padding:3px 7px;text-align:right;white-space:nowrap}
th{background:#f2f2f2;position:sticky;top:0}
table.sortable th{cursor:pointer;user-select:none}
table.sortable th[data-dir=asc]::after{content:" \\25B2"}table.sortable th[data-dir=desc]::after{content:" \\25BC"}
td.t,th.t{text-align:left}
.scroll{max-height:520px;overflow:auto;border:1px solid #eee;display:inline-block;max-width:100%}
dl{display:grid;grid-template-columns:max-content auto;gap:2px 14px;margin:4px 0}dt{color:#555}dd{margin:0}
img{max-width:100%;border:1px solid #eee;margin:6px 0}
pre{background:#f7f7f7;padding:8px;overflow:auto;font-size:0.85em}
ul.files{columns:2;font-size:0.9em}
"""

_SORT_JS = """
(function(){
  function key(cell){var v=cell.getAttribute('data-v');return v===null?cell.textContent:v;}
  function num(s){s=String(s).trim();return s!==''&&isFinite(Number(s))?Number(s):null;}
  function cmp(a,b){var x=num(a),y=num(b);
    if(x!==null&&y!==null){return x-y;}
    if(x!==null){return -1;}if(y!==null){return 1;}
    return String(a).localeCompare(String(b));}
  var tables=document.querySelectorAll('table.sortable');
  for(var t=0;t<tables.length;t++){(function(table){
    var heads=table.tHead.rows[0].cells;
    for(var i=0;i<heads.length;i++){(function(th,col){
      th.title='sort';
      th.addEventListener('click',function(){
        var asc=th.getAttribute('data-dir')!=='asc';
        for(var h=0;h<heads.length;h++){heads[h].removeAttribute('data-dir');}
        th.setAttribute('data-dir',asc?'asc':'desc');
        var body=table.tBodies[0],rows=Array.prototype.slice.call(body.rows);
        rows.sort(function(r,s){var c=cmp(key(r.cells[col]),key(s.cells[col]));return asc?c:-c;});
        for(var r=0;r<rows.length;r++){body.appendChild(rows[r]);}
      });})(heads[i],i);}
  })(tables[t]);}
})();
"""


@dataclass(frozen=True)
class Figure:
    """A PNG shown inline, with the file it was written to (a relative link) and what it shows."""

    title: str
    png: bytes
    href: str | None = None


@dataclass(frozen=True)
class Page:
    """The parts every page has: a title line, warnings (``bad`` ones are refusals), facts, figures, links."""

    title: str
    subtitle: str = ""
    warnings: tuple[str, ...] = ()
    refusals: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    figures: tuple[Figure, ...] = ()
    links: tuple[tuple[str, str], ...] = ()
    sections: tuple[tuple[str, str], ...] = field(default=())  # (heading, HTML body) in order


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _number(value: Any) -> tuple[str, str]:
    """(shown text, sort key) of a table cell."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "", ""
    if isinstance(value, bool):
        return str(value).lower(), str(int(value))
    if isinstance(value, int):
        return f"{value:,}", str(value)
    if isinstance(value, float):
        if math.isinf(value):
            return ("\u221e" if value > 0 else "-\u221e"), ("1e308" if value > 0 else "-1e308")
        magnitude = abs(value)
        text = (f"{value:,.0f}" if magnitude >= 1000 else f"{value:.4g}")
        return text, repr(value)
    return str(value), str(value)


def table(frame: pd.DataFrame, sortable: bool = True, text_columns: Sequence[str] = ()) -> str:
    """An HTML table of ``frame`` (numbers right-aligned, sorted by their value, not their text)."""
    columns = list(frame.columns)
    text = set(text_columns) | {c for c in columns if not pd.api.types.is_numeric_dtype(frame[c])
                                or pd.api.types.is_bool_dtype(frame[c])}
    head = "".join(f'<th class="t">{_e(c)}</th>' if c in text else f"<th>{_e(c)}</th>" for c in columns)
    rows = []
    for record in frame.itertuples(index=False, name=None):
        cells = []
        for column, value in zip(columns, record, strict=True):
            shown, key = _number(value.item() if hasattr(value, "item") else value)
            cls = ' class="t"' if column in text else ""
            cells.append(f'<td{cls} data-v="{_e(key)}">{_e(shown)}</td>')
        rows.append("<tr>" + "".join(cells) + "</tr>")
    cls = ' class="sortable"' if sortable else ""
    return f'<div class="scroll"><table{cls}><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table></div>'


def facts(items: Sequence[tuple[str, Any]]) -> str:
    """A definition list of (label, value) pairs; values that are None are left out."""
    body = "".join(f"<dt>{_e(k)}</dt><dd>{_e(_number(v)[0] if isinstance(v, (int, float)) else v)}</dd>"
                   for k, v in items if v is not None)
    return f"<dl>{body}</dl>"


def parameter_facts(version: ParameterVersion, name: str | None = None) -> list[tuple[str, Any]]:
    """The parameter version in force: C, each query's clip threshold and budget fraction, the predicted
    RMSRE_tau of one release, the calibration, where it came from."""
    params = version.params
    prov = version.provenance
    items: list[tuple[str, Any]] = [("version", name), ("epsilon", params.epsilon),
                                    ("encoding", str(params.encoding)), ("count limit C", params.count_limit)]
    for q in params.queries:
        fraction = "" if q.budget_fraction is None else f", budget fraction {q.budget_fraction:.3g}"
        items.append((f"{q.column}", f"clip threshold {q.clip_threshold:.4g}{fraction}"))
    if prov is not None:
        items.append((f"predicted {RMSRE_TAU} of one release", prov.predicted_rmsre_tau))
        items.append(("training window", f"{prov.training_start} .. {prov.training_end}" if prov.training_start
                      else None))
        items.append(("created", prov.created_at))
    calibration = version.calibration
    items.append(("calibration", "none: estimates are of the capped-and-clipped sums (Alg. 4)" if calibration is None
                  else f"{calibration.num_blocks} history day(s); estimator {version.correction}"))
    return items


def versions_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The published versions over time (oldest first): C, clip thresholds and predicted RMSRE_tau."""
    if not rows:
        return "<p>No published version yet.</p>"
    return table(pd.DataFrame(list(rows)), text_columns=("version",))


def page_html(page: Page) -> str:
    """The whole document."""
    parts = [f"<h1>{_e(page.title)}</h1>"]
    if page.subtitle:
        parts.append(f'<p class="sub">{_e(page.subtitle)}</p>')
    parts += [f'<div class="bad">{_e(w)}</div>' for w in page.refusals]
    parts += [f'<div class="warn">{_e(w)}</div>' for w in page.warnings]
    parts += [f'<div class="ok">{_e(w)}</div>' for w in page.notes]
    for heading, body in page.sections:
        parts.append(f"<h2>{_e(heading)}</h2>{body}")
    for figure in page.figures:
        src = "data:image/png;base64," + base64.b64encode(figure.png).decode("ascii")
        img = f'<img src="{src}" alt="{_e(figure.title)}">'
        parts.append(f"<h2>{_e(figure.title)}</h2>"
                     + (f'<a href="{_e(figure.href)}">{img}</a>' if figure.href else img))
    if page.links:
        items = "".join(f'<li><a href="{_e(href)}">{_e(label)}</a></li>' for label, href in page.links)
        parts.append(f'<h2>Files</h2><ul class="files">{items}</ul>')
    body = "\n".join(parts)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{_e(page.title)}</title><style>{_CSS}</style></head>\n<body>\n{body}\n"
            f"<script>{_SORT_JS}</script>\n</body></html>\n")


# ---- a release (measure) ---------------------------------------------------------------------------
MAX_TABLE_ROWS = 3000
"""Rows of the estimates table on a page (a domain of 10^5 slices would make a page of tens of MB)."""


def largest_slices(estimates: pd.DataFrame, slice_columns: Sequence[str], max_rows: int) -> pd.DataFrame:
    """The rows of the slices with the largest estimated count, at most ``max_rows`` (whole slices), in
    the table's order; all of them when they fit."""
    if len(estimates) <= max_rows:
        return estimates
    per_slice = max(1, int(estimates["query"].nunique()))
    keep = max(1, max_rows // per_slice)
    if not slice_columns:
        return estimates.head(max_rows)
    counts = estimates[estimates["query"] == "count"]
    top = counts.nlargest(keep, "estimate")[list(slice_columns)]
    return estimates.merge(top, on=list(slice_columns), how="inner")
@dataclass(frozen=True)
class DebugReport:
    """The debug run's unnoised metrics and noise per key (dense key order), for the noise figure."""

    unnoised: Any
    noise: Any
    column_names: tuple[str, ...]
    contribution_budget: int


def release_report_files(estimates: pd.DataFrame, slice_columns: Sequence[str], console: Sequence[str],
                         summary: Mapping[str, Any], version: ParameterVersion, version_name: str | None,
                         days: Sequence[str] | None = None, history: Sequence[Mapping[str, Any]] = (),
                         debug: DebugReport | None = None, links: Sequence[tuple[str, str]] = ()
                         ) -> dict[str, bytes]:
    """What ``measure`` writes beside its private files: ``estimates.png`` (the largest slices with their
    intervals), ``noisy_vs_unnoised.png`` with a debug run, and ``report.html`` showing both (names
    relative to the folder they are written to; ``links`` are relative to it too)."""
    from araopt.evaluation import plots

    files = {"estimates.png": plots.png_bytes(plots.estimates_figure(estimates, slice_columns))}
    figures = [Figure("The largest slices: released estimates with 95% intervals", files["estimates.png"],
                      "estimates.png")]
    if debug is not None:
        files["noisy_vs_unnoised.png"] = plots.png_bytes(plots.noise_figure(
            debug.unnoised, debug.noise, debug.column_names, epsilon=float(summary["epsilon"]),
            contribution_budget=debug.contribution_budget))
        figures.append(Figure("The debug run's noise against the discrete Laplace band", files["noisy_vs_unnoised.png"],
                              "noisy_vs_unnoised.png"))
    page = release_page(estimates, slice_columns, console, summary, version, version_name, days, history, figures,
                        [*links, *((f"{name} (this figure)", name) for name in files)])
    files["report.html"] = page.encode("utf-8")
    return files


def write_release_report(folder: RunFolder, summary: Mapping[str, Any], version: ParameterVersion,
                         console: Sequence[str], days: Sequence[str] | None, history: Sequence[Mapping[str, Any]],
                         debug_run: bool, simulation: bool, store: str | None) -> None:
    """``measure``'s report page and figures (``release_report_files``) into ``folder``'s ``private/``: they
    show the exact accounting beside the released numbers, so they are operator-private. Read back from
    the staged release: the estimates, and with a debug run on a local folder the debug report; linked:
    the release's files and, from a local parameter ``store``, the nightly report of the version used."""
    import io
    import json
    import os

    from araopt.io import avro, outputs
    from araopt.publication import ESTIMATE_COLUMNS

    # the operator's page: the true totals of a joined history's calibration (operator-private) when there are any
    table = (folder.read_or_none(outputs.private_file(outputs.TRUE_TOTALS_PARQUET))
             or folder.read(outputs.release_file(outputs.ESTIMATES_PARQUET, simulation)))
    estimates = pd.read_parquet(io.BytesIO(table))
    slice_columns = [c for c in estimates.columns if c != "query" and c not in ESTIMATE_COLUMNS]
    debug = None
    if debug_run and not folder.remote:
        key_map = json.loads(folder.read(outputs.release_file(outputs.KEY_MAP_JSON, simulation)))
        _, unnoised, noise, _ = avro.read_debug_report(folder.path(outputs.private_file(outputs.DEBUG_REPORT)))
        debug = DebugReport(unnoised, noise, (*key_map["queries"], key_map["bottom_name"]),
                            version.params.contribution_budget)
    up = "../"
    links = [(f"{name} (released)", up + outputs.release_file(name, simulation))
             for name in (outputs.ESTIMATES_CSV, outputs.SUMMARY_REPORT, outputs.KEY_MAP_JSON, outputs.RELEASE_JSON,
                          outputs.MANIFEST)]
    links += [("run_summary.json (operator-private)", outputs.RUN_SUMMARY),
              ("run_manifest.json (operator-private)", outputs.RUN_MANIFEST),
              ("dead letter (operator-private)", outputs.DEAD_LETTER)]
    version_name = summary.get("parameters", {}).get("version")
    if store is not None and version_name and "://" not in store:  # the night that chose them
        night = os.path.join(store, "reports", str(version_name), outputs.REPORT_HTML)
        if os.path.exists(night):
            links.append((f"the nightly report of {version_name}",
                          os.path.relpath(night, os.path.join(folder.target, outputs.PRIVATE_DIR))))
    files = release_report_files(estimates, slice_columns, console, summary, version, version_name, days, history,
                                 debug, links)
    for name, data in files.items():
        folder.write(outputs.private_file(name), data)


def release_page(estimates: pd.DataFrame, slice_columns: Sequence[str], console: Sequence[str],
                 summary: Mapping[str, Any], version: ParameterVersion, version_name: str | None,
                 days: Sequence[str] | None = None, history: Sequence[Mapping[str, Any]] = (),
                 figures: Sequence[Figure] = (), links: Sequence[tuple[str, str]] = (),
                 max_rows: int = MAX_TABLE_ROWS) -> str:
    """The page of one ``measure`` run (the estimates table holds at most ``max_rows`` rows: those of the
    slices with the largest estimated count): ``console`` are the lines the command printed (their WARNING and
    NOTE lines become warnings), ``summary`` the private run summary, ``days`` the release's days (its
    input's ``date=`` partitions), ``history`` the parameter store's published versions
    (``araopt.nightly.version_table``) when the parameters came from a store."""
    simulation = bool(summary.get("simulation"))
    title = "araopt release" + (f" of {', '.join(days)}" if days else "") + (" (SIMULATION)" if simulation else "")
    warnings = [line.strip() for line in console if line.strip().startswith(("WARNING", "NOTE"))]
    if simulation:
        warnings.insert(0, "SIMULATION: seeded noise; these numbers are NOT differentially private and must never "
                           "be published")
    calibration = summary.get("calibration")
    if not calibration:
        warnings.append("UNCALIBRATED: the parameters carry no calibration; the estimates are of the capped-and-"
                        "clipped sums (Alg. 4), not of the true totals")
    columns = [*slice_columns, "query", "estimate", "ci_low", "ci_high", "std_error", "capped_estimate",
               "bias_corrected"]
    shown = largest_slices(estimates, slice_columns, max_rows)[[c for c in columns if c in estimates.columns]]
    cut = (f"<p>The {len(shown):,} rows of the slices with the largest estimated count, of {len(estimates):,}: "
           f"every row is in estimates.csv.</p>" if len(shown) < len(estimates) else "")
    release = [("epsilon", summary.get("epsilon")), ("keys released", summary.get("keys")),
               ("slices", summary.get("slices")), ("domain", summary.get("domain")),
               ("release days", ", ".join(days) if days else "unknown (the input is not in date= partitions)")]
    accounting = [(k.replace("_", " "), summary.get(k)) for k in (
        "rows_read", "conversions_kept", "conversions_dropped_by_cap", "conversions_kept_outside_domain",
        "rows_rejected", "lookback_rows_used", "wall_time_s")]
    sections = [
        ("Release", facts(release)),
        ("Console", "<pre>" + _e("\n".join(console)) + "</pre>"),
        ("Estimates with 95% intervals (click a column to sort)",
         "<p>Of the true totals when <code>bias_corrected</code> or the parameters carry a calibration; "
         "<code>capped_estimate</code> is the paper's Alg. 4 estimate of the capped-and-clipped sum.</p>"
         + cut + table(shown, text_columns=(*slice_columns, "query"))),
        ("Parameter version used", facts(parameter_facts(version, version_name))),
    ]
    if history:
        sections.append(("Published parameter versions over time", versions_table(history)))
    sections.append(("Accounting (operator-private: exact counts)", facts(accounting)))
    return page_html(Page(title, "operator-private page: exact counts beside the released numbers; publish only the "
                                 "release folder", tuple(warnings), (), (), tuple(figures), tuple(links),
                          tuple(sections)))


# ---- a nightly run -----------------------------------------------------------------------------------
def nightly_page(report: Mapping[str, Any], history: Sequence[Mapping[str, Any]] = (),
                 figures: Sequence[Figure] = (), links: Sequence[tuple[str, str]] = ()) -> str:
    """The page of one ``nightly`` run from its ``report.json`` (``araopt.nightly.nightly_report``, or the
    privacy-safe run's report): the guardrails' decision, the chosen parameters, the predicted error
    against the baselines and per count limit, and the published versions over time."""
    params = report.get("params", {})
    version = ParameterVersion.from_json(params) if params else None
    refusals = tuple(f"NOT PUBLISHED: {p}" for p in report.get("problems", ()))
    warnings = []
    if report.get("cold_start"):
        warnings.append("COLD START: no past release to learn from; the parameters are the privacy-safe start-up "
                        "defaults and carry no learnt prediction")
    if version is not None and version.calibration is None:
        warnings.append("UNCALIBRATED: this version carries no calibration; releases with it estimate the capped-"
                        "and-clipped sums, not the true totals")
    if report.get("new_series"):
        warnings.append(f"NEW SERIES: {report['new_series']}")
    notes = []
    if report.get("idempotent"):
        notes.append(f"Already published as {report.get('version')}: a re-run of the same day on the same history")
    elif report.get("published"):
        notes.append(f"PUBLISHED {report.get('version')}"
                     + (" and moved latest" if report.get("pointer_moved", True) else ""))
    window = report.get("window") or report.get("release_dates") or ()
    mode = report.get("mode", "joined history")
    title = f"araopt nightly {report.get('as_of', '')} ({mode})"
    subtitle = (f"run {report.get('run_id', '')}; window {' .. '.join(str(w) for w in window[:1] + window[-1:])}"
                if window else f"run {report.get('run_id', '')}")
    decision = [("as of", report.get("as_of")), ("epsilon", report.get("epsilon")),
                ("objective", report.get("objective")), ("release period (days)", report.get("release_period_days")),
                ("lookback (days)", report.get("lookback_days")),
                (f"predicted {RMSRE_TAU} of one release", report.get("predicted_rmsre_tau")),
                ("prediction from", report.get("prediction")),
                ("previous version", report.get("previous_version")),
                ("rows read", report.get("rows_read", report.get("first_party_rows_read"))),
                ("rows rejected", report.get("rows_rejected", report.get("first_party_rows_rejected")))]
    taus = report.get("taus")
    if taus and version is not None:
        names = ("count", *version.params.query_columns)
        decision.append(("\u03c4 (per query)", ", ".join(f"{n} {t:.4g}" for n, t in zip(names, taus, strict=False))))
    sections = [("Decision", facts(decision))]
    if version is not None:
        sections.append(("Chosen parameters", facts(parameter_facts(version, report.get("version")))))
    baselines = report.get("baselines") or {}
    unreleasable = report.get("baselines_not_releasable") or {}  # (an Attribution night's: name -> why)
    predicted = report.get("predicted_rmsre_tau")
    if baselines or unreleasable:
        rows = [{"method": "optimized (this run)", RMSRE_TAU: predicted, "note": ""}] + [
            {"method": name, RMSRE_TAU: value, "note": ""} for name, value in baselines.items()] + [
            {"method": name, RMSRE_TAU: None, "note": str(why)} for name, why in unreleasable.items()]
        frame = pd.DataFrame(rows) if unreleasable else pd.DataFrame(rows).drop(columns="note")
        sections.append((f"Predicted {RMSRE_TAU} of one release: optimized vs the paper's baselines",
                         table(frame, text_columns=("method", "note"))))
    per_c = report.get("per_count_limit")
    if per_c:
        sections.append((f"Predicted {RMSRE_TAU} per count limit C (click a column to sort)",
                         table(pd.DataFrame(per_c))))
    sections.append(("Published parameter versions over time", versions_table(history)))
    return page_html(Page(title, subtitle + "; operator-private page (training row counts)", tuple(warnings), refusals,
                          tuple(notes), tuple(figures), tuple(links), tuple(sections)))
