"""``optimize``, ``nightly`` and ``evaluate`` with ``--api attribution`` on a synthetic log with users:
the parameter version (api attribution) round trip, the store's published version, the evaluation's
table; and that ARA stays the default."""
from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest

from araopt.attribution.params import COUNT
from araopt.data.synthetic import PRESETS, write_synthetic
from araopt.io.stores import open_store
from araopt.mechanism.keys import KeyDomain
from araopt.optimize.attribution import AttributionProblem, optimize_attribution
from araopt.version import Api, ParameterVersion
from pipelines.cli import main
from pipelines.inputs import read_attribution_log as read_log


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("w3c") / "synth"
    write_synthetic(out, PRESETS["synth-travel"], seed=4, scale=0.0008, days=3, by_conversion_date=True)
    return str(out)


def test_optimize_writes_an_attribution_version_equal_to_the_core_optimum(logs, tmp_path, capsys) -> None:
    out = str(tmp_path / "params.json")
    assert main(["optimize", "--api", "attribution", "--history", f"{logs}/train", "--slices", "campaignId",
                 "--values", "value", "--epsilon", "4", "--max-count-limit", "6", "--output", out]) == 0
    printed = capsys.readouterr().out
    assert "api attribution" in printed and "spec_defaults" in printed and "baseline_q95" in printed
    version = ParameterVersion.load(out)
    assert version.api == Api.ATTRIBUTION and version.attribution is not None
    assert ParameterVersion.from_bytes(version.to_bytes()) == version
    rows, _, _ = read_log(f"{logs}/train", ("campaignId",), ("value",))
    domain = KeyDomain.from_slice_values(("campaignId",), {"campaignId": rows["campaignId"].to_numpy()},
                                         (COUNT, "value"))
    core = optimize_attribution(AttributionProblem(4.0, ("value",), ("campaignId",), max_count_limit=6), rows, domain)
    assert version.attribution == core.params
    assert version.attribution.per_site_budget == 4.0
    assert sum(q.epsilon for q in core.params.queries) * core.params.count_limit(True) <= 4.0 + 1e-9


def test_optimize_refuses_ara_only_options_with_the_attribution_api(logs, tmp_path, capsys) -> None:
    status = main(["optimize", "--api", "attribution", "--history", f"{logs}/train", "--slices", "campaignId",
                   "--values", "value", "--epsilon", "4", "--tau", "count=5", "--output", str(tmp_path / "p.json")])
    assert status == 2 and "--tau is not supported with --api attribution" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "p.json")


def test_nightly_publishes_an_attribution_version(logs, tmp_path, capsys) -> None:
    store = str(tmp_path / "store")
    dates = sorted(d.split("=")[1] for d in os.listdir(f"{logs}/train") if d.startswith("date="))
    assert main(["nightly", "--api", "attribution", "--history", f"{logs}/train", "--as-of", dates[-1],
                 "--window-days", str(len(dates)), "--store", store, "--slices", "campaignId", "--values", "value",
                 "--epsilon", "4", "--max-count-limit", "12"]) == 0
    assert "published" in capsys.readouterr().out
    latest = ParameterVersion.from_bytes(open_store(store).resolve("latest").payload)
    assert latest.api == Api.ATTRIBUTION and latest.attribution is not None
    assert latest.attribution.per_site_budget == 4.0


def test_evaluate_compares_with_the_baselines_per_budget(logs, tmp_path, capsys) -> None:
    out = str(tmp_path / "eval")
    assert main(["evaluate", "--api", "attribution", "--train", f"{logs}/train", "--test", f"{logs}/test",
                 "--name", "travel", "--slices", "campaignId", "--values", "value", "--epsilons", "1,4",
                 "--monte-carlo", "2", "--max-count-limit", "4", "--output", out]) == 0
    assert "optimized / best baseline" in capsys.readouterr().out
    table = pd.read_csv(os.path.join(out, "attribution.csv"))
    assert sorted(table["budget"].unique()) == [1.0, 4.0]
    assert list(table["method"][:3]) == ["optimized", "spec_defaults", "baseline_q95"]
    for _, cell in table.groupby("budget"):
        best = cell.loc[cell["method"] != "optimized", "RMSRE_tau"].min()
        opt = cell.loc[cell["method"] == "optimized"].iloc[0]
        assert opt["ratio_to_best_baseline"] == pytest.approx(opt["RMSRE_tau"] / best)
    assert np.isfinite(table["coverage"]).all()
    # a budget at which no baseline can be released: listed with why, and the console says so (not "max nan")
    tiny = str(tmp_path / "tiny")
    assert main(["evaluate", "--api", "attribution", "--train", f"{logs}/train", "--test", f"{logs}/test",
                 "--slices", "campaignId", "--values", "value", "--epsilons", "0.000003", "--output", tiny]) == 0
    assert "no baseline releasable at these budgets" in capsys.readouterr().out
    notes = pd.read_csv(os.path.join(tiny, "attribution.csv")).set_index("method")["note"]
    assert notes[["spec_defaults", "baseline_q95"]].str.startswith("not releasable").all()
