"""The API as a parameter-version field: ARA files unchanged (no ``api``, same bytes), attribution
versions carrying their parameters and paper view, every refusal one line."""
import json

import numpy as np
import pytest

from araopt import Params, QueryParams
from araopt.attribution.params import COUNT, AttributionParams, AttributionQuery
from araopt.errors import InvalidParameters
from araopt.mechanism.keys import KeyDomain
from araopt.version import Api, ParameterVersion, Provenance


def attribution_params(**overrides):
    queries = (AttributionQuery(COUNT, None), AttributionQuery("revenue", "value", max_value=255, clip=50.0))
    base = dict(per_site_budget=4.0, count_limit=4, fractions={COUNT: 0.25, "revenue": 0.75}, queries=queries,
                slice_columns=("campaign",))
    base.update(overrides)
    return AttributionParams.from_paper(**base)


def layout(params):
    return KeyDomain.from_slice_values(params.slice_columns, {"campaign": np.arange(3)}, params.query_names)


def test_an_ara_file_names_no_api_and_keeps_its_bytes(tmp_path):
    params = Params(count_limit=2, encoding="linf", epsilon=8.0, slice_columns=("campaign",),
                    queries=(QueryParams("value", 30.0, 1.0),))
    version = ParameterVersion(params, provenance=Provenance(rows=3))
    doc = version.to_json()
    assert "api" not in doc and "attribution" not in doc
    version.save(tmp_path / "p.json")
    loaded = ParameterVersion.load(tmp_path / "p.json")
    assert loaded.api == Api.ARA and loaded.attribution is None
    assert loaded.to_bytes() == (tmp_path / "p.json").read_bytes() and loaded.checksum() == version.checksum()


def test_an_attribution_version_round_trips_with_its_paper_view(tmp_path):
    params = attribution_params()
    version = ParameterVersion.for_attribution(params, domain=layout(params), provenance=Provenance(rows=5))
    assert version.api == Api.ATTRIBUTION and version.attribution == params
    view = version.params
    assert view.count_limit == params.count_limit(multi_epoch=True) == 4
    assert view.query_columns == ("value",) and view.queries[0].clip_threshold == 50.0
    version.save(tmp_path / "p.json")
    doc = json.loads((tmp_path / "p.json").read_text())
    assert doc["api"] == "attribution" and doc["attribution"]["format"] == "araopt-attribution-params/1"
    loaded = ParameterVersion.load(tmp_path / "p.json")
    assert loaded == version and loaded.checksum() == version.checksum()
    assert loaded.domain is not None and loaded.domain.query_names == (COUNT, "revenue")


@pytest.mark.parametrize("mutate, words", [
    (lambda d: d.update(api="topics"), "api"),
    (lambda d: d.update(count_limit=3), "paper view"),
    (lambda d: d["attribution"]["queries"][1].update(clip=40.0), "paper view"),
    (lambda d: d.pop("attribution"), "needs its attribution parameters"),
    (lambda d: d.pop("api"), "need api 'attribution'"),
    (lambda d: d["attribution"].update(extra=1), "unknown field 'extra'"),
    # a clip whose Alg. 4 scale or value scale overflows: -inf +- inf, or an exact-looking 0 +- 0
    (lambda d: d["attribution"]["queries"][1].update(clip=1e308), "clip must be a finite number in"),
    (lambda d: d["attribution"]["queries"][1].update(clip=5e-324), "clip must be a finite number in"),
])
def test_inconsistent_attribution_files_are_refused_in_one_line(tmp_path, mutate, words):
    params = attribution_params()
    doc = ParameterVersion.for_attribution(params).to_json()
    mutate(doc)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(InvalidParameters, match=words) as err:
        ParameterVersion.load(path)
    assert "\n" not in str(err.value)


def test_the_histogram_layout_must_be_the_attributions():
    params = attribution_params()
    ara_layout = KeyDomain.from_slice_values(("campaign",), {"campaign": np.arange(3)}, ("value",))
    with pytest.raises(InvalidParameters, match="histogram layout"):
        ParameterVersion.for_attribution(params, domain=ara_layout)


def test_commands_of_one_api_refuse_the_others_versions():
    version = ParameterVersion.for_attribution(attribution_params())
    version.require_api(Api.ATTRIBUTION, "measure")
    with pytest.raises(InvalidParameters, match="export-ara handles parameter versions of api 'ara'"):
        version.require_api(Api.ARA, "export-ara")
    with pytest.raises(InvalidParameters, match="api 'ara'"):
        version.with_epsilon(2.0)


def test_count_only_configurations_have_no_paper_view():
    count_only = AttributionParams(1.0, (AttributionQuery(COUNT, None),), ("campaign",))
    with pytest.raises(InvalidParameters, match="at least one value query"):
        ParameterVersion.for_attribution(count_only)
