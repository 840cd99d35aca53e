"""What a release's run says to its operator, decided once for both targets: the operator-private run
summary (exact counts: never published; ``run_summary``), the console's lines after ``measure`` (also on
the run's report page, its WARNING and NOTE lines as warnings; ``summary_lines``, and
``attribution_summary_lines`` for the W3C Attribution target) and the demo's line on what the printed
estimates estimate.
"""
from __future__ import annotations

from typing import Any

from araopt.attribution.calibrate import estimates_of
from araopt.io import outputs
from araopt.mechanism.keys import HISTORY
from araopt.mechanism.report import SIGNAL_SDS
from araopt.version import POINT_ESTIMATES, Api, ParameterVersion

OPERATOR_PRIVATE = {"OPERATOR_PRIVATE": "exact, un-noised counts: never publish"}


def run_summary(version: ParameterVersion, accounting: dict[str, Any], parameters: dict[str, Any],
                simulation_seed: int | None, run: dict[str, Any]) -> dict[str, Any]:
    """The operator-private run summary of a release: its exact ``accounting`` (the job's), what it was
    made with (per target: ARA's epsilon, encoding and count limit; Attribution's per-site budget,
    queries and retention calibration), where the parameters came from (``parameters``), the
    simulation, then how it ran (``run``: runner, wall time, domain, shards, ...)."""
    if version.api == Api.ATTRIBUTION:
        assert version.attribution is not None  # (an attribution version carries them)
        made_with: dict[str, Any] = {
            "api": Api.ATTRIBUTION.value, "per_site_budget": version.attribution.per_site_budget,
            "queries": list(version.attribution.query_names), "parameters": parameters,
            "simulation": simulation_seed is not None, "simulation_seed": simulation_seed,
            "bias_corrected": version.retention is not None,
            "retention": None if version.retention is None else version.retention.to_json()}
    else:
        params = version.params
        made_with = {"epsilon": params.epsilon, "encoding": params.encoding, "count_limit": params.count_limit,
                     "parameters": parameters, "simulation": simulation_seed is not None,
                     "simulation_seed": simulation_seed}
    return {**OPERATOR_PRIVATE, **accounting, **made_with, **run}


def attribution_summary_lines(summary: dict[str, Any], output: str, simulation: bool, queries: int,
                              version: ParameterVersion) -> list[str]:
    """What the console says after a W3C Attribution release: the release, the operator-private
    accounting and what the estimates estimate."""
    mark = "SIMULATION (not private) " if simulation else ""
    lines = [f"araopt measure: {mark}attribution release of {queries} histogram(s) x "
             f"{summary['histogram_size']:,} indices written to {output}/"
             f"{outputs.release_dir(simulation)}/ in {summary['wall_time_s']:.1f} s (domain: {summary['domain']})",
             f"  operator-private (exact, never publish): {summary['rows_read']:,} rows read = "
             f"{summary['conversions_kept']:,} kept + {summary['conversions_outside_domain']:,} outside the layout + "
             f"{summary['rows_rejected']:,} rejected; {summary['reports_refused_for_budget']:,} of "
             f"{summary['reports']:,} reports refused for budget"]
    if summary.get("domain_kind") == HISTORY and not simulation:
        lines.append(HISTORY_KEYS_NOTE)
    if summary.get("lookback_files"):  # the budgets carried from earlier releases (araopt.ledger.attribution)
        carried = summary.get("lookback_releases")
        whose = ("the version's parameters (simulation: no ledger)" if carried is None
                 else f"{len(carried)} earlier release(s) of the ledger")
        lines.append(f"  budgets carried: {summary.get('lookback_reports', 0):,} reports of "
                     f"{summary.get('lookback_rows', 0):,} lookback conversions ({summary['lookback_files']} file(s)) "
                     f"simulated again first, with {whose}")
    private = ("" if version.retention is None else  # the joined history's retention: its true totals stay private
               joined_note(outputs.private_file(outputs.TRUE_TOTALS_CSV), "the clipped values the browsers accepted"))
    return [*lines, f"  estimates are of {estimates_of(version.retention)}{private}"]


HISTORY_KEYS_NOTE = ("  NOTE: the keys are the parameter version's training slices (those with a conversion in its "
                     "training window), which the release lists without noise; where that is sensitive, pass --domain "
                     "with your own campaign list (docs/privacy.md)")
"""The console's note on a release over a domain of origin ``history`` (what it discloses; both APIs)."""


def joined_note(private_path: str, released: str) -> str:
    """The console's clause for true totals calibrated on the joined history (``publication.joined_calibration_reason``):
    where they are kept and what the release holds instead."""
    return f"; calibrated on the joined history, so OPERATOR-PRIVATE in {private_path} (the release holds {released})"


def summary_lines(summary: dict[str, Any], output: str, simulation: bool) -> list[str]:
    """What the console says after a run (also shown, with its WARNING and NOTE lines as warnings, on the
    run's report page): the release, the operator-private accounting, and what the estimates estimate."""
    rel = outputs.release_dir(simulation)
    mark = "SIMULATION (not private) " if simulation else ""
    lines = [f"araopt measure: {mark}release of {summary['keys']:,} keys at epsilon={summary['epsilon']:g} "
             f"written to {output}/{rel}/ in {summary['wall_time_s']:.1f} s (domain: {summary['domain']})"]
    by_reason = ", ".join(f"{k} {v:,}" for k, v in summary["rows_rejected_by_reason"].items()) or "none"
    lines.append(f"  operator-private (exact, never publish): {summary['rows_read']:,} rows read = "
                 f"{summary['conversions_kept']:,} kept + {summary['conversions_dropped_by_cap']:,} dropped by the cap + "
                 f"{summary['conversions_kept_outside_domain']:,} outside the domain + {summary['rows_rejected']:,} "
                 f"rejected ({by_reason}); details in {output}/{outputs.PRIVATE_DIR}/")
    if summary.get("domain_kind") == HISTORY and not simulation:
        lines.append(HISTORY_KEYS_NOTE)
    if summary["conversions_kept_outside_domain"]:
        lines.append(f"  NOTE: conversions of slices outside the declared domain ({summary['domain']}) are counted, "
                     f"not released; to release a new campaign, list every slice to release in a file of your own "
                     f"and pass --domain slices.csv (docs/privacy.md, 'A new campaign')")
    lines += lookback_note_lines(summary)
    silent = summary.get("queries_without_signal") or []
    if silent:
        lines.append(f"  NOTE: this release holds no signal for {', '.join(silent)}: the noised estimates summed over "
                     f"the domain are within {SIGNAL_SDS:g} standard errors of 0 (a query the parameters left almost "
                     f"no budget or a clip near 0); its intervals say only that the total is not negative")
    calibration = summary.get("calibration")
    if not calibration:
        lines.append("  estimates are of the capped-and-clipped sums (Alg. 4): the parameters carry no calibration, so "
                     "bias_corrected is false (araopt optimize / nightly fit one on the history)")
    else:
        point = POINT_ESTIMATES.get(calibration["correction"], calibration["correction"])
        unseen = calibration["fallback_slices"]
        lines.append(f"  estimates are of the TRUE totals (point estimate: {point}; intervals include the "
                     f"calibration's uncertainty for a period of {calibration['period_blocks']} history block(s))"
                     + (f"; {unseen:,} slice(s) absent from the history use the pooled ratio (wider intervals)"
                        if unseen else "")
                     + ("" if calibration.get("released", True) else
                        joined_note(f"{output}/{outputs.private_file(outputs.TRUE_TOTALS_CSV)}", "Alg. 4's estimates")))
        if calibration.get("calendar_note"):
            lines.append(f"  NOTE: {calibration['calendar_note']}")
    return lines


def lookback_note_lines(summary: dict[str, Any]) -> list[str]:
    """Once per run: whether Alg. 1 saw each impression's earlier conversions (the browser's cap is per
    source lifetime), and how many of the measured conversions may be over-counted."""
    before = summary.get("conversions_of_impressions_older_than_the_lookback", 0)
    if summary.get("lookback_files"):
        tail = (f"; {before:,} measured conversion(s) belong to impressions shown before the lookback's first day and "
                f"may be over-counted (lengthen --lookback)" if before else "")
        return [f"  lifetime cap: {summary['lookback_rows_used']:,} earlier conversion(s) from the lookback consumed "
                f"budget (not released){tail}"]
    if summary.get("impression_times_known"):
        if before:
            return [f"  WARNING: no --lookback: {before:,} measured conversion(s) belong to impressions shown before "
                    f"the input's first day; their earlier conversions did not consume budget, so the release may "
                    f"keep more of them than the browser does (pass the days before as --lookback)"]
        return []
    return ["  WARNING: no --lookback and no impression_time: conversions of impressions that converted before "
            "this input are capped as if these were their first, so the release may keep more than the browser "
            "does (pass the days before as --lookback)"]


def estimates_line(calibration: dict[str, Any] | None) -> str:
    """One line saying what the printed estimates estimate."""
    if not calibration:
        return ("estimates: of the capped-and-clipped sums (Alg. 4); the parameters carry no calibration, so they "
                "are not corrected for conversions dropped by the count limit or value clipped away")
    point = {"ratio": "the capped estimate divided by the retention ratio",
             "count": "the count divided by its retention ratio, each value's capped estimate (dividing the values "
                      "would add more noise than it removes bias here)"}.get(
        calibration["correction"], "the capped estimate (correcting would add more noise than it removes bias here)")
    return (f"estimates: of the TRUE totals (all conversions, full value): {point}, with ratios calibrated on "
            f"{calibration['history_blocks']} days of history; the intervals include the calibration's uncertainty")
