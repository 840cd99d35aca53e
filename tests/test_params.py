"""Parameter file: construction, JSON round trip, and every refusal naming its field."""
import copy
import dataclasses
import json

import pytest

from araopt import Params, QueryParams
from araopt.version import ParameterVersion, Provenance


def paper_params(**overrides):
    base = dict(count_limit=2, encoding="linf", epsilon=8.0, slice_columns=("campaign",),
                queries=(QueryParams("items", clip_threshold=2.0, budget_fraction=0.5),
                         QueryParams("value", clip_threshold=30.0, budget_fraction=0.5)))
    base.update(overrides)
    return Params(**base)


def test_defaults_and_derived_quantities():
    p = paper_params()
    assert p.contribution_budget == 65536
    assert p.per_conversion_budget == 32768
    assert p.query_columns == ("items", "value")
    assert p.count_tau == 5.0


def test_round_trip_through_file(tmp_path):
    v = ParameterVersion(paper_params(), provenance=Provenance(
        training_start="2026-11-01", training_end="2026-11-07", rows=10, created_at="2026-11-08T00:00:00+00:00",
        predicted_rmsre_tau=0.1, baseline_rmsre_tau=0.3))
    path = tmp_path / "params.json"
    v.save(path)
    q = ParameterVersion.load(path)
    assert q == v
    assert q.checksum() == v.checksum()


def test_l1_and_baseline_round_trip(tmp_path):
    l1 = Params(count_limit=3, encoding="l1", epsilon=1.0, slice_columns=("s",),
                queries=(QueryParams("v", 10.0), QueryParams("w", 2.0)), l1_rounding="randomized")
    base = Params(count_limit=3, encoding="baseline", epsilon=1.0, slice_columns=("s",),
                  queries=(QueryParams("v", 10.0, 0.5),), count_budget_fraction=0.5)
    for p in (l1, base):
        ParameterVersion(p).save(tmp_path / "p.json")
        assert ParameterVersion.load(tmp_path / "p.json").params == p


def _write(tmp_path, data):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda d: d.update(format_version="2.0"), "format_version"),
        (lambda d: d.pop("epsilon"), "epsilon"),
        (lambda d: d.pop("queries"), "queries"),
        (lambda d: d.update(epsilon=0), "epsilon"),
        (lambda d: d.update(epsilon=64.5), "epsilon"),
        (lambda d: d.update(epsilon=-1), "epsilon"),
        (lambda d: d.update(count_limit=0), "count_limit"),
        (lambda d: d.update(count_limit=65537), "count_limit"),
        (lambda d: d["queries"][0].update(clip_threshold=0), "clip_threshold"),
        (lambda d: d["queries"][1].update(clip_threshold=-3), "clip_threshold"),
        (lambda d: d["queries"][0].update(clip_threshold=1e308), "clip_threshold"),  # Alg. 4's scale overflows
        (lambda d: d["queries"][0].update(clip_threshold=1.0000001e12), "clip_threshold"),
        (lambda d: d["queries"][0].update(budget_fraction=0.6), "budget_fraction"),
        (lambda d: d.update(encoding="l2"), "encoding"),
        (lambda d: d.update(surprise=1), "surprise"),
    ],
)
def test_load_refuses_naming_the_field(tmp_path, mutate, field):
    data = ParameterVersion(paper_params()).to_json()
    mutate(data)
    with pytest.raises(ValueError, match=field):
        ParameterVersion.load(_write(tmp_path, data))


def test_fractions_sum_within_tolerance_accepted_beyond_refused():
    paper_params(queries=(QueryParams("a", 1.0, 0.5 + 4e-10), QueryParams("b", 1.0, 0.5)))
    with pytest.raises(ValueError, match="sum to 1"):
        paper_params(queries=(QueryParams("a", 1.0, 0.5 + 1e-8), QueryParams("b", 1.0, 0.5)))


def test_baseline_needs_count_fraction_and_l1_refuses_fractions():
    with pytest.raises(ValueError, match="count_budget_fraction"):
        Params(count_limit=1, encoding="baseline", epsilon=1, slice_columns=(), queries=(QueryParams("v", 1.0, 1.0),))
    with pytest.raises(ValueError, match="budget_fraction must be absent"):
        Params(count_limit=1, encoding="l1", epsilon=1, slice_columns=(), queries=(QueryParams("v", 1.0, 1.0),))


def test_not_json_and_unreadable(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        ParameterVersion.load(bad)
    with pytest.raises(ValueError, match="cannot read"):
        ParameterVersion.load(tmp_path / "missing.json")


def test_frozen():
    p = paper_params()
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.count_limit = 3  # type: ignore[misc]
    assert copy.deepcopy(p) == p
