"""Exploration arms as ARA registrations: every registration export-ara emits for them passes ARA's
rules and Chrome's header validator, never asks for more than Gamma, and what Chrome's contribution
logic computes from them is what `araopt measure` simulates."""
import json
import os
import shutil
import subprocess

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from araopt.ara import exploration as arms
from araopt.ara.registrations import (
    SourceEncoder,
    TriggerEncoder,
    validate_source_registration,
    validate_trigger_registration,
)
from araopt.mechanism.encoding import encode
from araopt.mechanism.exploration import Exploration, ExplorationArm
from araopt.mechanism.keys import KeyDomain
from araopt.mechanism.params import Params, QueryParams
from araopt.version import ParameterVersion
from chrome import chrome_sums, measure_unnoised
from pipelines.ara import run_export_ara

GAMMA = 65536
EXPLORE = Exploration((ExplorationArm(1, 0.08), ExplorationArm(3, 0.08), ExplorationArm(20, 0.08)), salt=11)


def arm_params(encoding: str = "linf", count_limit: int = 5, conversion_side: bool = True) -> Params:
    d = 2
    return Params(count_limit=count_limit, encoding=encoding, epsilon=8.0, slice_columns=("campaign", "device"),
                  conversion_slice_columns=("device",) if conversion_side else (),
                  queries=(QueryParams("items", 4.0, None if encoding == "l1" else 1.0 / d),
                           QueryParams("value", 60.0, None if encoding == "l1" else 1.0 / d)),
                  exploration=EXPLORE)


def frame(seed: int = 3, impressions: int = 300) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 16, impressions)
    imp = np.repeat(np.arange(impressions), sizes)
    n = len(imp)
    return pd.DataFrame({
        "impression_id": imp, "conversion_time": pd.to_datetime(rng.integers(0, 10**6, n), unit="s", utc=True),
        "campaign": np.repeat(rng.integers(0, 4, impressions), sizes), "device": rng.choice(["desktop", "mobile"], n),
        "items": rng.integers(0, 6, n).astype(float), "value": np.round(rng.lognormal(3.0, 1.0, n), 2),
    })


def domain() -> KeyDomain:
    return KeyDomain.from_slice_values(("campaign", "device"), {"campaign": np.repeat(np.arange(4), 2),
                                                                "device": np.tile(["desktop", "mobile"], 4)},
                                       ("items", "value"), conversion_slice_columns=("device",))


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["linf", "l1"]), st.integers(1, 20), st.booleans(),
       st.lists(st.tuples(st.floats(0, 1e6), st.floats(0, 1e6)), min_size=1, max_size=20), st.integers(0, 2**32 - 1))
def test_every_arm_registration_passes_aras_rules_and_no_configuration_exceeds_gamma(
        encoding, count_limit, conversion_side, values, seed):
    params = arm_params(encoding, count_limit, conversion_side)
    dom = domain() if conversion_side else KeyDomain.from_slice_values(
        ("campaign", "device"), {"campaign": np.arange(4), "device": np.array(["m"] * 4)}, ("items", "value"))
    sources, triggers = SourceEncoder(params, dom), TriggerEncoder(params, dom)
    for entry in arms.source_registrations(sources, EXPLORE):
        validate_source_registration(entry["registration"])
    matrix = np.array(values, dtype=np.float64)
    rng = np.random.default_rng(seed)
    uniforms = rng.random((len(matrix), 2))
    configurations = [params] + [params.for_arm(a) for a in range(EXPLORE.num_arms)]
    encoded = np.stack([encode(matrix, p, None, uniforms=uniforms) for p in configurations], axis=1)
    pieces = triggers.pieces({"device": "mobile" if conversion_side else "m"} if conversion_side else None)
    for row in encoded:
        registration = arms.trigger_registration(triggers, EXPLORE, row.tolist(), pieces)
        validate_trigger_registration(registration)
        sets = registration["aggregatable_values"]
        assert [s["filters"][arms.ARM_FILTER] for s in sets] == [["main"], ["0"], ["1"], ["2"]]
        for configuration, value_set in zip(configurations, sets, strict=True):
            total = sum(value_set["values"].values())
            assert total <= GAMMA and total == configuration.per_conversion_budget  # Alg. 1 then caps at Gamma


def test_arm_sources_carry_their_filter_and_pooled_bucket_bits():
    params = arm_params()
    sources = SourceEncoder(params, domain())
    registrations = arms.source_registrations(sources, EXPLORE)
    assert len(registrations) == len(sources) + EXPLORE.num_arms
    main, arm = registrations[0]["registration"], registrations[-1]["registration"]
    assert main["filter_data"] == {"araopt_arm": ["main"]}
    assert arm["filter_data"] == {"araopt_arm": ["2"]}
    assert set(arm["aggregation_keys"].values()) == {hex((1 << 127) | (2 << 8))}


@pytest.mark.slow
@pytest.mark.parametrize("encoding", ["linf", "l1"])
def test_chrome_computes_from_the_arm_registrations_what_measure_simulates(encoding, wicg_contrib, tmp_path):
    params = arm_params(encoding)
    ParameterVersion(params, domain=domain()).save(tmp_path / "params.json")
    frame().to_parquet(tmp_path / "log.parquet")
    export = tmp_path / "export"
    assert run_export_ara(["--params", str(tmp_path / "params.json"), "--out", str(export), "--conversions",
                           str(tmp_path / "log.parquet"), "--simulation-seed", "5"]) == 0
    chrome, source_of, stats = chrome_sums(wicg_contrib, export, tmp_path)  # asserts 0 validation errors
    ours, summary = measure_unnoised(tmp_path, tmp_path / "log.parquet", tmp_path / "params.json",
                                      export / "key_map.json", 5)
    assert chrome == ours
    assert any(b >> 127 for b in chrome)  # the arms' keys are in the report
    assert stats["kept"] == summary["conversions_kept"]
    # every source and trigger registration through Chrome's header validator, one by one
    batch_js = os.path.join(os.path.dirname(wicg_contrib), "batch.js")
    sources = [r["registration"] for r in json.loads((export / "sources.json").read_text())["registrations"]]
    (tmp_path / "sources.jsonl").write_text("\n".join(json.dumps(s) for s in sources))
    trigger_lines = (export / "private" / "triggers.jsonl").read_text().splitlines()
    triggers = [json.loads(line)["registration"] for line in trigger_lines]
    (tmp_path / "triggers.jsonl").write_text("\n".join(json.dumps(t) for t in triggers))
    for kind, path in (("source", tmp_path / "sources.jsonl"), ("trigger", tmp_path / "triggers.jsonl")):
        done = subprocess.run(["node", batch_js, kind, str(path), "--jsonl"], capture_output=True, text=True,
                              timeout=600)
        results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        assert len(results) == (len(sources) if kind == "source" else len(triggers))
        assert sum(len(r["errors"]) for r in results) == 0, [r for r in results if r["errors"]][:2]
    assert shutil.which("node")
