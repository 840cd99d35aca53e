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


def test_a_history_with_too_many_rejected_rows_is_refused_as_aras(logs, tmp_path, capsys) -> None:
    """optimize, nightly and evaluate --api attribution gate the rejected share as ARA's histories do
    (red team, round thirteen: 33 of 40 rows rejected and all three went on; nightly's report counted the
    valid rows as read)."""
    import pyarrow.parquet as pq

    bad = tmp_path / "bad"
    total = rejected = 0
    for root, _, files in os.walk(f"{logs}/train"):
        for name in (f for f in files if f.endswith(".parquet")):
            frame = pq.read_table(os.path.join(root, name)).to_pandas()
            broken = np.arange(len(frame)) % 4 == 0  # a quarter of the rows: a negative value
            frame.loc[broken, "value"] = -1.0
            os.makedirs(bad / os.path.relpath(root, f"{logs}/train"), exist_ok=True)
            frame.to_parquet(bad / os.path.relpath(root, f"{logs}/train") / name, index=False)
            total, rejected = total + len(frame), rejected + int(broken.sum())
    dates = sorted(d.split("=")[1] for d in os.listdir(bad) if d.startswith("date="))
    common = ["--slices", "campaignId", "--values", "value", "--max-count-limit", "3"]
    runs = {"optimize": ["--history", str(bad), "--epsilon", "4", "--output", str(tmp_path / "p.json")],
            "nightly": ["--history", str(bad), "--as-of", dates[-1], "--window-days", str(len(dates)), "--epsilon",
                        "4", "--store", str(tmp_path / "store")],
            "evaluate": ["--train", str(bad), "--test", f"{logs}/test", "--name", "bad", "--epsilons", "4",
                         "--monte-carlo", "1", "--output", str(tmp_path / "eval")]}
    for command, argv in runs.items():
        assert main([command, "--api", "attribution", *argv, *common, "--max-rejected-fraction", "0.2"]) == 2
        err = capsys.readouterr().err
        assert f"{rejected:,} of {total:,}" in err and "failed validation, above the 20% threshold" in err, command
    assert not os.path.exists(tmp_path / "p.json") and not os.path.exists(tmp_path / "eval")
    main(["nightly", "--api", "attribution", *runs["nightly"], *common, "--max-rejected-fraction", "0.3",
          "--run-id", "ok"])  # below the gate: tuned, and reported whether or not the guardrails publish
    report = pd.read_json(os.path.join(tmp_path, "store", "reports", f"{dates[-1]}-ok", "report.json"),
                          typ="series")
    assert report["rows_read"] == total and report["rows_rejected"] == rejected


def test_optimize_records_the_window_the_rows_and_the_baselines_as_nightly(logs, tmp_path) -> None:
    """optimize --api attribution's version says what it was tuned on (red team, round fourteen: its
    provenance was null), as nightly's does: the window, the rows, the row accounting, the baselines."""
    out = str(tmp_path / "params.json")
    assert main(["optimize", "--api", "attribution", "--history", f"{logs}/train", "--slices", "campaignId",
                 "--values", "value", "--epsilon", "4", "--max-count-limit", "3", "--output", out]) == 0
    version = ParameterVersion.load(out)
    rows, counts, _ = read_log(f"{logs}/train", ("campaignId",), ("value",))
    prov = version.provenance
    days = sorted(d.split("=")[1] for d in os.listdir(f"{logs}/train") if d.startswith("date="))
    assert (prov.training_start, prov.training_end) == (days[0], days[-1]) and prov.rows == len(rows)
    assert prov.extra["row_accounting"]["rows_read"] == counts.rows_read and prov.extra["history"] == f"{logs}/train"
    assert prov.predicted_rmsre_tau > 0 and prov.baseline_rmsre_tau == min(
        b["rmsre_tau"] for b in prov.extra["baselines"].values())
    assert not prov.privacy_safe  # a joined history's reading
