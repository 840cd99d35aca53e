"""Event streams in the spec's end-to-end format, replayed through :class:`~araopt.attribution.browser.Browser`.

A case is ``{"config"?: {...}, "events": [...]}``: one browser instance. ``config`` is merged over the
default configuration (``e2e-tests/CONFIG.json``); events are ``saveImpression``,
``measureConversion``, ``clearImpressionsForSite``, ``clearBrowsingHistoryForAttribution``,
``enableAPI`` and ``disableAPI``, each at ``seconds`` (strictly increasing). The output rows are those
of the reference's runner (``tools/events.js``): one per ``measureConversion``, ``{"case", "seconds",
"site", "histogram"}`` or ``{..., "error": NAME}``, and one per ``saveImpression`` that failed without
an ``expectedError``; araopt adds the budget outcome of each report under ``"budget"``.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from araopt.attribution.browser import Browser, Outcome
from araopt.attribution.config import BrowserConfig
from araopt.attribution.credit import js_round
from araopt.attribution.errors import ApiError
from araopt.errors import InvalidInput


def event_time_ms(seconds: Any) -> int:
    """An event's ``seconds`` as integer milliseconds (the reference's ``Math.round(seconds * 1e3)``)."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise InvalidInput(f"event seconds must be a number, got {seconds!r}")
    return js_round(seconds * 1e3)


@dataclass(frozen=True)
class Result:
    """One output row of a replay: a ``measureConversion``'s histogram (and budget outcome) or error,
    or an unexpected ``saveImpression`` error."""

    case: int
    seconds: float
    event: str
    site: str | None
    histogram: tuple[int, ...] | None = None
    error: str | None = None
    outcome: Outcome | None = None

    def to_json(self) -> dict[str, Any]:
        row: dict[str, Any] = {"case": self.case, "seconds": self.seconds}
        if self.event == "saveImpression":
            row.update(error=self.error, event="saveImpression")
            return row
        row["site"] = self.site
        if self.error is not None:
            row["error"] = self.error
        else:
            row["histogram"] = list(self.histogram or ())
            if self.outcome is not None:
                row["budget"] = {"matched_epochs": list(self.outcome.matched_epochs),
                                 "refused_epochs": list(self.outcome.refused_epochs),
                                 "deducted": list(self.outcome.deducted)}
        return row


def case_browser(case: Mapping[str, Any], default_config: Mapping[str, Any]) -> Browser:
    """A fresh browser for ``case``: its ``config`` merged over ``default_config``."""
    merged = {**default_config, **case.get("config", {})}
    config, epoch_start, credit_fraction = BrowserConfig.from_e2e(merged)
    return Browser(config, epoch_start, lambda: credit_fraction)


def replay_case(case: Mapping[str, Any], default_config: Mapping[str, Any], index: int = 0,
                browser: Browser | None = None, every_impression: bool = False) -> list[Result]:
    """Replay one case; every API exception becomes an ``error`` row (named as in JavaScript).
    ``every_impression``: a row for every ``saveImpression`` (``error`` None when it succeeded), not
    only for those that failed without an ``expectedError``."""
    browser = browser if browser is not None else case_browser(case, default_config)
    out: list[Result] = []
    last: int | None = None
    for ev in case["events"]:
        now = event_time_ms(ev["seconds"])
        if last is not None and now <= last:
            raise InvalidInput(f"case {index}: seconds must increase strictly (at {ev['seconds']})")
        last = now
        kind = ev["event"]
        if kind == "saveImpression":
            error = None
            try:
                browser.save_impression(now, ev["site"], ev.get("intermediarySite"), ev["options"])
            except ApiError as exc:
                error = exc.name.value
            if every_impression or (error is not None and ev.get("expectedError") is None):
                out.append(Result(index, ev["seconds"], kind, ev["site"], error=error))
        elif kind == "measureConversion":
            try:
                outcome = browser.measure_conversion(now, ev["site"], ev.get("intermediarySite"), ev["options"])
            except ApiError as exc:
                out.append(Result(index, ev["seconds"], kind, ev["site"], error=exc.name.value))
            else:
                out.append(Result(index, ev["seconds"], kind, ev["site"], histogram=outcome.histogram, outcome=outcome))
        elif kind == "clearImpressionsForSite":
            browser.clear_impressions_for_site(ev["site"])
        elif kind == "clearBrowsingHistoryForAttribution":
            browser.clear_browsing_history(now, ev["sites"], bool(ev["forgetVisits"]))
        elif kind == "enableAPI":
            browser.enabled = True
        elif kind == "disableAPI":
            browser.enabled = False
        else:
            raise InvalidInput(f"case {index}: unknown event {kind!r}")
    return out


def replay(cases: Iterable[Mapping[str, Any]], default_config: Mapping[str, Any]) -> list[Result]:
    """Replay several cases (one browser instance each), numbered from 0 as the reference's runner does."""
    out: list[Result] = []
    for index, case in enumerate(cases):
        out.extend(replay_case(case, default_config, index))
    return out


def expected_of(event: Mapping[str, Any]) -> tuple[int, ...] | str | None:
    """A ``measureConversion`` event's ``expected`` (a histogram, or the name of the error), or a
    ``saveImpression``'s ``expectedError`` (a name, or None)."""
    expected = event.get("expected", event.get("expectedError"))
    if expected is None or isinstance(expected, list):
        return None if expected is None else tuple(expected)
    return expected if isinstance(expected, str) else str(expected["name"])
