"""Shared by the lifetime-budget tests: multi-day logs, daily configurations, the row ids a release
records, and the browser's per-source logic as an oracle."""
import numpy as np

from araopt.constants import CONTRIBUTION_BUDGET, MAX_REPORTS_PER_SOURCE
from araopt.io.conversions import Conversions, concat_periods
from araopt.io.rowset import conversion_row_ids
from araopt.mechanism.exploration import Exploration
from araopt.mechanism.keys import KeyDomain
from araopt.mechanism.params import Params, QueryParams

DAY = 86_400_000_000
GAMMA = CONTRIBUTION_BUDGET
DOMAIN = KeyDomain.from_slice_values(("s",), {"s": np.arange(3)}, ("value",))


def config(count_limit: int, encoding: str = "linf", exploration: Exploration | None = None) -> Params:
    if encoding == "baseline":
        return Params(count_limit=count_limit, encoding="baseline", epsilon=4.0, slice_columns=("s",),
                      queries=(QueryParams("value", 5.0, 0.5),), count_budget_fraction=0.5)
    return Params(count_limit=count_limit, encoding=encoding, epsilon=4.0, slice_columns=("s",),
                  queries=(QueryParams("value", 5.0, None if encoding == "l1" else 1.0),), exploration=exploration)


def daily_log(seed: int, impressions: int, days: int, max_per_day: int = 8) -> Conversions:
    """Impressions converting on consecutive days from a random first day (0..max_per_day a day)."""
    rng = np.random.default_rng(seed)
    first = rng.integers(0, days, impressions)
    ids, times = [], []
    for imp in range(impressions):
        for day in range(int(first[imp]), days):
            k = int(rng.integers(0, max_per_day + 1))
            ids += [imp] * k
            times += list(day * DAY + np.sort(rng.choice(DAY, size=k, replace=False)))
    n = len(ids)
    imp = np.asarray(ids, dtype=np.int64)
    return Conversions(imp, np.asarray(times, dtype=np.int64), {"s": (imp * 7) % 3},
                       rng.lognormal(1.0, 1.0, (n, 1)), ("value",))


def day_rows(log: Conversions, day: int) -> np.ndarray:
    return np.flatnonzero(log.conversion_time // DAY == day)


def with_lookback(log: Conversions, day: int) -> Conversions:
    return concat_periods(log.take(day_rows(log, day)), log.take(np.flatnonzero(log.conversion_time // DAY < day)))


def released_ids(log: Conversions, rows: np.ndarray) -> np.ndarray:
    return conversion_row_ids(log.impression_id[rows], log.conversion_time[rows])


def chrome_keeps(log: Conversions, cost_of_day: dict[int, int]) -> np.ndarray:
    """The browser's per-source logic, one conversion at a time in time order: a trigger whose value
    (its day's configuration's floor(Gamma / C)) fits the source's remaining budget and report limit
    is kept; an oracle written independently of Alg. 1's vectorised form."""
    kept = np.zeros(len(log), dtype=bool)
    used: dict[int, int] = {}
    reports: dict[int, int] = {}
    for i in np.lexsort((log.conversion_time, log.impression_id)):
        imp = int(log.impression_id[i])
        cost = cost_of_day[int(log.conversion_time[i] // DAY)]
        if reports.get(imp, 0) < MAX_REPORTS_PER_SOURCE and used.get(imp, 0) + cost <= GAMMA:
            kept[i] = True
            used[imp] = used.get(imp, 0) + cost
            reports[imp] = reports.get(imp, 0) + (cost > 0)  # a trigger that contributes nothing sends no report
    return kept
