"""The combiner laws, checked once over every ``araopt.combiner.Combiner`` of the core.

An engine may split a combiner's input anywhere (between impressions: a batch always holds all
conversions of its impressions), add the pieces in any order, merge partial accumulators in any order
and grouping, compact them, and pickle them between workers. ``extract`` must not tell: whatever the
split, the output equals the output of one accumulator fed the whole input (exactly for integers,
within float summation order for floats)."""
from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from araopt import Params, QueryParams
from araopt.calibration import accumulator as cb
from araopt.io.conversions import Conversions
from araopt.mechanism import aggregate
from araopt.mechanism.keys import KeyDomain
from araopt.mechanism.measure import encode_and_bound
from araopt.optimize import statistics as stats

SLICES = ("s",)
VALUES = ("items", "price")


def _log(n: int = 900, seed: int = 3) -> Conversions:
    rng = np.random.default_rng(seed)
    imp = rng.integers(0, n // 3, n)
    frame = pd.DataFrame({
        "impression_id": imp,
        "conversion_time": pd.Timestamp("2026-11-20", tz="UTC") + pd.to_timedelta(rng.integers(0, 3 * 86400, n), "s"),
        "s": imp * 7 % 5,
        "items": rng.poisson(2.0, n).astype(float),
        "price": rng.lognormal(2, 1, n),
    })
    return Conversions.from_table(frame, SLICES, VALUES)


LOG = _log()


def _params(count_limit: int, clip: float) -> Params:
    return Params(count_limit=count_limit, encoding="linf", epsilon=8.0, slice_columns=SLICES,
                  queries=(QueryParams("items", 3.0, 0.4), QueryParams("price", clip, 0.6)))


CANDIDATES = [(_params(2, 20.0), "a" * 64), (_params(5, 60.0), "b" * 64)]
DOMAIN = KeyDomain.from_slice_values(SLICES, {"s": np.arange(5)}, VALUES)


def _sums(part: Conversions) -> aggregate.DomainSums:
    contributions, kept = encode_and_bound(part, CANDIDATES[0][0], simulation_seed=7)
    return aggregate.domain_sums(DOMAIN.slice_index(part.slices), contributions, kept, DOMAIN.num_slices)


# name -> (combiner, item of one impression-complete part)
COMBINERS = {
    "statistics": (stats.StatisticsCombiner(stats.StatisticsSpec(SLICES, VALUES, max_count_limit=6, sample_size=16)),
                   lambda part: part),
    "calibration candidates": (cb.CandidatesCombiner(),
                               lambda part: cb.accumulate_candidates(part, CANDIDATES, SLICES)),
    "release sums": (aggregate.DomainSumsCombiner(), _sums),
    "slice set (simulation)": (aggregate.SliceSetCombiner(SLICES, 100),
                               lambda part: {c: np.asarray(part.slices[c]) for c in SLICES}),
}


def _same(a: object, b: object, path: str = "output") -> None:
    """Structural equality: integers exactly, floats within summation order."""
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        assert type(a) is type(b), path
        for f in dataclasses.fields(a):
            _same(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
    elif isinstance(a, np.ndarray | pd.DataFrame | pd.Series):
        x, y = np.asarray(a), np.asarray(b)
        assert x.shape == y.shape, f"{path}: shape {x.shape} != {y.shape}"
        if x.dtype.kind == "f":
            assert np.allclose(x, y, rtol=1e-9, atol=1e-9, equal_nan=True), path
        else:
            assert np.array_equal(x, y), path
    elif isinstance(a, tuple | list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{path}[{i}]")
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, float):
        assert np.isclose(a, b, rtol=1e-9, atol=1e-9, equal_nan=True), path
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def _parts(assignment: list[int], k: int) -> list[Conversions]:
    """Impression-complete parts: impression i goes to part assignment[i % len(assignment)] % k."""
    imp = np.asarray(LOG.impression_id)
    where = np.asarray(assignment)[imp % len(assignment)] % k
    return [LOG.take(np.flatnonzero(where == p)) for p in range(k)]


def _slice_set_output(out: object) -> object:
    """A slice set's frame order is the merge order: compare it as a sorted set."""
    frame = out.frame.sort_values(list(SLICES), ignore_index=True)  # type: ignore[attr-defined]
    return dataclasses.replace(out, frame=frame)  # type: ignore[type-var]


@pytest.mark.parametrize("name", sorted(COMBINERS))
@settings(max_examples=5, deadline=None)
@given(k=st.integers(2, 4),
       assignment=st.lists(st.integers(0, 3), min_size=1, max_size=7), order=st.randoms(use_true_random=False))
def test_any_split_merge_order_compaction_and_pickling_extract_the_whole_input(name, k, assignment, order):
    combiner, item = COMBINERS[name]
    whole = combiner.extract(combiner.add(combiner.create(), item(LOG)))
    parts = [p for p in _parts(assignment, k) if len(p)]
    # each part in its own accumulator (a worker), compacted and pickled across the wire
    accs = [pickle.loads(pickle.dumps(combiner.compact(combiner.add(combiner.create(), item(p))))) for p in parts]
    accs.append(combiner.create())  # an empty worker
    order.shuffle(accs)
    # merged in a random grouping: a first merge of some, then the rest with it
    cut = order.randint(1, len(accs))
    first = combiner.merge(accs[:cut])
    merged = combiner.merge([*accs[cut:], first]) if cut < len(accs) else first
    split = combiner.extract(combiner.compact(merged))
    # one accumulator fed the parts in sequence (a single worker's add loop)
    sequential = combiner.create()
    for p in reversed(parts):
        sequential = combiner.add(sequential, item(p))
    sequential = combiner.extract(sequential)
    if name.startswith("slice set"):
        whole, split, sequential = map(_slice_set_output, (whole, split, sequential))
    _same(split, whole)
    _same(sequential, whole)


def test_an_empty_combiner_extracts_nothing_rather_than_zeros():
    """A combiner that saw no input must not pretend it saw an empty one (a release of nothing)."""
    for name in ("calibration candidates", "release sums", "slice set (simulation)"):
        combiner, _ = COMBINERS[name]
        assert combiner.extract(combiner.merge([combiner.create(), combiner.create()])) is None, name
