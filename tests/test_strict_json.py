"""Every JSON file the project writes is strict JSON (no bare NaN / Infinity: null instead), and every
JSON file it reads refuses a key given twice (``araopt.io.jsonio``)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from araopt import Params, QueryParams
from araopt.io import jsonio
from araopt.version import ParameterVersion


def strict_loads(text):
    """What a strict parser (JavaScript's JSON.parse, Go, Java) accepts."""
    return json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in written JSON"))


def test_non_finite_floats_are_written_as_null_and_numpy_values_as_numbers():
    value = {"a": float("nan"), "b": [float("inf"), np.float64("-inf"), np.float32(1.5)], "c": np.int64(3),
             "d": np.array([[1.0, np.nan]]), "e": (np.bool_(True), "x"), "f": 2.5}
    text = jsonio.dumps(value, sort_keys=True)
    assert strict_loads(text) == {"a": None, "b": [None, None, 1.5], "c": 3, "d": [[1.0, None]], "e": [True, "x"],
                                  "f": 2.5}


def test_finite_json_is_written_byte_for_byte_as_the_standard_library_writes_it():
    value = {"z": 1, "a": [0.1, 1e300, -0.0, "é"], "n": None}
    for kw in ({}, {"indent": 2}, {"indent": 1, "sort_keys": True}, {"separators": (",", ":")}):
        assert jsonio.dumps(value, **kw) == json.dumps(value, **kw)


def test_parameter_files_and_calibrations_are_strict_and_keep_their_checksum():
    from factories import fitted

    params, cal = fitted()
    with_calibration = ParameterVersion(params, calibration=cal)
    strict_loads(with_calibration.to_bytes().decode())
    strict_loads(cal.to_bytes().decode())
    again = ParameterVersion.from_bytes(with_calibration.to_bytes())
    assert again.to_bytes() == with_calibration.to_bytes()  # what the checksum is taken of
    assert json.loads(with_calibration.to_bytes()) == json.loads(json.dumps(with_calibration.to_json(), indent=2))


@pytest.mark.parametrize("text, where", [
    ('{"epsilon": 0.5, "epsilon": 64}', "'epsilon'"),
    ('{"a": {"b": 1, "b": 2}}', "'b'"),
    ('[{"x": 1}, {"x": 1, "x": 1}]', "'x'"),
])
def test_a_key_given_twice_is_refused(text, where):
    with pytest.raises(ValueError, match=rf"f.json: not valid JSON \(key {where} appears twice in one object\)"):
        jsonio.loads(text, "f.json")


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_not_json(constant):
    with pytest.raises(ValueError, match=f"{constant} is not JSON"):
        jsonio.loads(f'{{"epsilon": {constant}}}', "f.json")


def params_text():
    p = Params(count_limit=2, encoding="linf", epsilon=0.5, slice_columns=("s",), queries=(QueryParams("v", 20.0, 1.0),))
    return ParameterVersion(p).to_bytes().decode()


def test_duplicate_keys_are_refused_in_parameter_files(tmp_path):
    text = params_text()
    assert ParameterVersion.from_bytes(text.encode()).params.epsilon == 0.5
    doubled = text.replace('"epsilon": 0.5,', '"epsilon": 0.5,\n  "epsilon": 64,')
    (tmp_path / "p.json").write_text(doubled)
    with pytest.raises(ValueError, match="key 'epsilon' appears twice"):
        ParameterVersion.load(tmp_path / "p.json")


def test_duplicate_keys_are_refused_in_key_maps_calibrations_and_presets(tmp_path):
    from araopt.ara.registrations import KeyMap
    from araopt.calibration.model import Calibration
    from araopt.data.synthetic import load_preset
    from araopt.mechanism.keys import KeyDomain
    from factories import fitted

    domain = KeyDomain.from_slice_values(("s",), {"s": np.array(["a", "b"])}, ("v",))
    text = json.dumps(domain.to_json("0" * 64))
    doubled = text.replace('"params_sha256"', '"slice_columns": ["s"], "params_sha256"', 1)
    assert doubled != text
    (tmp_path / "km.json").write_text(doubled)
    for load in (KeyMap.load, KeyDomain.load):
        with pytest.raises(ValueError, match="key 'slice_columns' appears twice"):
            load(tmp_path / "km.json")
    _, cal = fitted()
    raw = cal.to_bytes().decode().replace('"num_blocks"', '"num_blocks": 1, "num_blocks"', 1)
    with pytest.raises(ValueError, match="key 'num_blocks' appears twice"):
        Calibration.from_bytes(raw.encode())
    (tmp_path / "preset.json").write_text('{"name": "a", "name": "b"}')
    with pytest.raises(ValueError, match="key 'name' appears twice"):
        load_preset(tmp_path / "preset.json")


@pytest.mark.slow
def test_every_json_file_nightly_and_measure_write_is_strict(tmp_path, capsys):
    import glob
    import os

    from factories import nightly_args, write_history
    from pipelines import measure as measure_pipeline
    from pipelines import nightly

    hist = write_history(tmp_path / "h", days=("2026-11-20", "2026-11-21", "2026-11-22", "2026-11-23"), n=1500)
    store = str(tmp_path / "store")
    assert nightly.run(nightly_args(hist, store)) == 0  # (as of 11-22: the day after is released)
    assert measure_pipeline.run(["--input", os.path.join(hist, "date=2026-11-23"), "--params", store, "--output",
                                 str(tmp_path / "out")]) == 0
    files = glob.glob(os.path.join(store, "**", "*.json"), recursive=True)
    files += glob.glob(os.path.join(str(tmp_path / "out"), "**", "*.json"), recursive=True)
    assert any(f.endswith("report.json") for f in files) and any(f.endswith("run_summary.json") for f in files)
    for path in files:
        with open(path) as fh:
            strict_loads(fh.read())
