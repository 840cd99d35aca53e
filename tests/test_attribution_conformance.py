"""araopt's model of the W3C Attribution Level 1 browser against the spec's own 26 end-to-end cases
(``e2e-tests/*.json`` of w3c/attribution): every measureConversion's histogram or error, and every
saveImpression's expected error, as the spec's test runner (``impl/src/e2e.test.ts``) checks them."""
import glob
import json
import os

from araopt.attribution.events import expected_of, replay_case
from w3c import w3c_e2e_dir  # noqa: F401  (fixture)


def _cases(folder):
    with open(os.path.join(folder, "CONFIG.json")) as fh:
        default = json.load(fh)
    paths = sorted(p for p in glob.glob(os.path.join(folder, "*.json")) if os.path.basename(p) != "CONFIG.json")
    cases = []
    for path in paths:
        with open(path) as fh:
            cases.append((os.path.basename(path), json.load(fh)))
    return default, cases


def test_the_spec_end_to_end_cases_replay_with_every_histogram_and_error_as_expected(w3c_e2e_dir):  # noqa: F811
    default, cases = _cases(w3c_e2e_dir)
    assert len(cases) == 26
    checked = {"measureConversion": 0, "saveImpression": 0}
    mismatches = []
    for index, (name, case) in enumerate(cases):
        results = iter(replay_case(case, default, index, every_impression=True))
        for ev in case["events"]:
            if ev["event"] not in checked:
                continue
            row = next(results)
            assert (row.event, row.seconds) == (ev["event"], ev["seconds"])
            got = row.error if row.error is not None else row.histogram
            want = expected_of(ev)
            checked[ev["event"]] += 1
            if got != want:
                mismatches.append(f"{name} at {ev['seconds']}: expected {want}, got {got}")
    print(f"{len(cases)} cases: {checked['measureConversion']} measureConversion histograms/errors and "
          f"{checked['saveImpression']} saveImpression outcomes checked, {len(mismatches)} mismatches")
    assert mismatches == []
    assert checked["measureConversion"] == 90


def test_the_report_refused_for_budget_in_the_spec_case_is_all_zero_and_says_it_was_refused(w3c_e2e_dir):  # noqa: F811
    """single-epoch-budgeting.json: the third report asks 1/2 of the budget when 1/4 is left."""
    default, cases = _cases(w3c_e2e_dir)
    case = dict(cases[[n for n, _ in cases].index("single-epoch-budgeting.json")][1])
    events = [dict(e) for e in case["events"]]
    third = [i for i, e in enumerate(events) if e["event"] == "measureConversion"][2]  # the one refused for budget
    assert events[third]["expected"] == [0, 0, 0]
    rows = [r for r in replay_case({**case, "events": events}, default) if r.event == "measureConversion"]
    assert rows[2].histogram == (0, 0, 0) and rows[2].outcome is not None and rows[2].outcome.budget_refused
    assert rows[1].histogram == (0, 8, 0) and not rows[1].outcome.budget_refused
