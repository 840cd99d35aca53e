"""The docs' recipe for a campaign launched after the parameters' history (docs/privacy.md, "A new
campaign"): outside the parameter version's domain it is counted, not released, and the console says
how to declare it; with the declared slices file it is released from its first day, and export-ara
builds its registrations from that release's key map."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from araopt.io import outputs
from factories import conversions, domain_csv, history_version, params, read_json, write
from pipelines import measure as measure_pipeline
from pipelines.ara import run_export_ara

pytestmark = pytest.mark.slow  # whole measure jobs


def test_a_campaign_launched_today_is_released_once_declared(tmp_path, capsys):
    frame = conversions(slices=("a", "b", "new"))  # "new" launched today: not in the history
    data = write(frame, str(tmp_path / "in" / "part-0.parquet"))
    history_version(params(), {"s": ["a", "b"]}).save(tmp_path / "p.json")
    base = ["--input", data, "--params", str(tmp_path / "p.json"), "--no-progress"]

    assert measure_pipeline.run([*base, "--output", str(tmp_path / "history-domain")]) == 0
    out = capsys.readouterr().out
    summary = read_json(tmp_path / "history-domain" / outputs.private_file(outputs.RUN_SUMMARY))
    assert summary["conversions_kept_outside_domain"] > 0
    estimates = pd.read_csv(tmp_path / "history-domain" / outputs.release_file(outputs.ESTIMATES_CSV, False))
    assert set(estimates["s"]) == {"a", "b"}
    note = next(line for line in out.splitlines() if "outside the declared domain" in line)
    assert "--domain slices.csv" in note and "A new campaign" in note
    assert "the keys are the parameter version's training slices" in out  # what a history domain discloses

    declared = domain_csv(tmp_path, ("a", "b", "new"))
    assert measure_pipeline.run([*base, "--output", str(tmp_path / "declared"), "--domain", declared,
                                 "--allow-rerelease"]) == 0
    out = capsys.readouterr().out
    assert "outside the declared domain" not in out and "training slices" not in out  # a declared domain: no note
    summary = read_json(tmp_path / "declared" / outputs.private_file(outputs.RUN_SUMMARY))
    assert summary["conversions_kept_outside_domain"] == 0
    estimates = pd.read_csv(tmp_path / "declared" / outputs.release_file(outputs.ESTIMATES_CSV, False))
    assert set(estimates["s"]) == {"a", "b", "new"}

    key_map = tmp_path / "declared" / outputs.release_file(outputs.KEY_MAP_JSON, False)
    assert run_export_ara(["--params", str(tmp_path / "p.json"), "--output", str(tmp_path / "export"),
                           "--key-map", str(key_map)]) == 0
    sources = json.loads((tmp_path / "export" / "sources.json").read_text())
    assert {r["slice"]["s"] for r in sources["registrations"]} == {"a", "b", "new"}
