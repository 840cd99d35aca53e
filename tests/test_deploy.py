"""Deployment assets agree with the CLI options and are well-formed (no cloud access needed)."""
from __future__ import annotations

import argparse
import ast
import datetime as dt
import json
import py_compile
import re
import string
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy import flex_main, gen_metadata
from pipelines.options import OPTIONS_BY_JOB, CliOption, add_options
from pipelines.values import resolve_as_of

NIGHTLY_OPTIONS, MEASURE_OPTIONS = OPTIONS_BY_JOB["nightly"], OPTIONS_BY_JOB["measure"]

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
SAMPLE_VARS = {"PROJECT": "my-project", "REGION": "us-central1", "BUCKET": "my-bucket"}


def options(job: str) -> dict[str, CliOption]:
    return {option.name: option for option in OPTIONS_BY_JOB[job]}


def assert_template_parameters_valid(job: str, parameters: dict[str, Any]) -> None:
    """Names are the job's options, required ones are present, values are strings matching the regexes."""
    known = options(job)
    assert set(parameters) <= set(known), f"unknown {job} parameters: {set(parameters) - set(known)}"
    missing = [name for name, option in known.items() if option.required and name not in parameters]
    assert not missing, f"{job}: required parameters missing: {missing}"
    for name, value in parameters.items():
        assert isinstance(value, str), f"{job}.{name}: template parameter values are strings, got {value!r}"
        for regex in known[name].template_regexes:
            assert re.match(regex, value), f"{job}.{name}={value!r} does not match {regex}"


# ---------------------------------------------------------------------------------------------
# Options and metadata
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("job", sorted(OPTIONS_BY_JOB))
def test_committed_metadata_is_generated_from_cli_options(job: str) -> None:
    committed = gen_metadata.metadata_path(job).read_text(encoding="utf-8")
    assert committed == gen_metadata.render(job), (
        f"deploy/{job}-metadata.json is stale: run python -m deploy.gen_metadata"
    )


@pytest.mark.parametrize("job", sorted(OPTIONS_BY_JOB))
def test_metadata_parameters_match_options(job: str) -> None:
    metadata = json.loads(gen_metadata.metadata_path(job).read_text(encoding="utf-8"))
    assert metadata["name"] == f"araopt-{job}" and metadata["description"]
    names = [parameter["name"] for parameter in metadata["parameters"]]
    assert names == [option.name for option in OPTIONS_BY_JOB[job]]
    assert len(set(names)) == len(names)
    for parameter in metadata["parameters"]:
        option = options(job)[parameter["name"]]
        assert set(parameter) <= {"name", "label", "helpText", "isOptional", "regexes"}
        assert re.fullmatch(r"[a-z][a-z0-9_]*", parameter["name"])
        assert parameter["label"] and parameter["helpText"]
        assert parameter["isOptional"] is (not option.required)
        for regex in parameter.get("regexes", []):
            re.compile(regex)


def test_option_lists_cover_the_documented_cli() -> None:
    assert [o.flag for o in NIGHTLY_OPTIONS] == [
        "--history", "--as-of", "--window-days", "--store", "--slices", "--values", "--epsilon", "--release-period",
        "--lookback-days", "--encoding", "--max-count-limit", "--allow-large-change", "--max-threshold-change-factor",
        "--max-count-limit-change",
    ]  # fmt: skip
    assert [o.flag for o in MEASURE_OPTIONS] == [
        "--input", "--params", "--output", "--lookback", "--lookback-days", "--epsilon", "--override-epsilon",
        "--debug-run", "--domain", "--max-slices", "--allow-rerelease", "--ledger",
    ]
    required = {job: {o.name for o in opts if o.required} for job, opts in OPTIONS_BY_JOB.items()}
    assert required == {
        "nightly": {"history", "as_of", "window_days", "store", "slices", "values", "epsilon"},
        "measure": {"input", "params", "output"},
    }


def test_gen_metadata_check_mode_detects_stale_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert gen_metadata.main(["--check"]) == 0
    monkeypatch.setattr(gen_metadata, "metadata_path", lambda job: tmp_path / f"{job}-metadata.json")
    assert gen_metadata.main(["--check"]) == 1  # files missing
    assert gen_metadata.main([]) == 0  # writes them
    assert gen_metadata.main(["--check"]) == 0
    (tmp_path / "nightly-metadata.json").write_text("{}\n")
    assert gen_metadata.main(["--check"]) == 1


def _parser(job: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"araopt {job}", exit_on_error=False)
    add_options(parser, OPTIONS_BY_JOB[job])
    return parser


NIGHTLY_CLI = [
    "--history", "h/*.parquet", "--as-of", "2025-03-01", "--window-days", "28", "--store", "/tmp/store",
    "--slices", "campaign,geo", "--values", "purchases", "--epsilon", "10",
]  # fmt: skip


def test_parser_accepts_cli_and_template_spellings() -> None:
    cli, rest = _parser("nightly").parse_known_args([*NIGHTLY_CLI, "--allow-large-change", "--runner=DirectRunner"])
    assert (cli.as_of, cli.window_days, cli.epsilon, cli.allow_large_change) == ("2025-03-01", 28, 10.0, True)
    assert (cli.encoding, cli.max_count_limit) == ("linf", 20)  # defaults come from the registry
    assert rest == ["--runner=DirectRunner"]  # Beam options pass through

    template = [f"--{a[2:].replace('-', '_')}={b}" for a, b in zip(NIGHTLY_CLI[::2], NIGHTLY_CLI[1::2], strict=True)]
    parsed, rest = _parser("nightly").parse_known_args(
        [*template, "--allow_large_change=false", "--encoding=l1", "--project=p", "--region=r"]
    )
    assert vars(parsed) == {**vars(cli), "allow_large_change": False, "encoding": "l1"}
    assert rest == ["--project=p", "--region=r"]

    measure, _ = _parser("measure").parse_known_args(["--input=i", "--params=p", "--output=o", "--debug_run=true"])
    assert (measure.debug_run, measure.epsilon, measure.domain) == (True, None, None)


@pytest.mark.parametrize(
    "bad",
    [
        ["--window-days", "0"],
        ["--window-days", "28\n"],
        ["--window-days", "x"],
        ["--epsilon", "-1"],
        ["--slices", "a b"],
        ["--as-of", "03/01/2025"],
        ["--encoding", "l2"],
        ["--allow-large-change=maybe"],
    ],
)
def test_parser_rejects_values_the_template_would_reject(bad: list[str]) -> None:
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        _parser("nightly").parse_known_args([*NIGHTLY_CLI, *bad])


def test_parser_requires_required_options() -> None:
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        _parser("nightly").parse_known_args(NIGHTLY_CLI[:-2])  # no --epsilon


def test_resolve_as_of() -> None:
    today = dt.date(2025, 3, 2)
    assert resolve_as_of("yesterday", today) == "2025-03-01"
    assert resolve_as_of("today", today) == "2025-03-02"
    assert resolve_as_of("2024-02-29", today) == "2024-02-29"
    with pytest.raises(argparse.ArgumentTypeError):
        resolve_as_of("2023-02-29", today)


# ---------------------------------------------------------------------------------------------
# Composer DAG, scheduler job, Dockerfile
# ---------------------------------------------------------------------------------------------


def _dag_literal(name: str) -> dict[str, Any]:
    tree = ast.parse((DEPLOY / "composer_dag.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{name} not found in deploy/composer_dag.py")


def test_composer_dag_compiles(tmp_path: Path) -> None:
    py_compile.compile(str(DEPLOY / "composer_dag.py"), cfile=str(tmp_path / "dag.pyc"), doraise=True)


def test_composer_dag_uses_airflow3_api_and_valid_parameters() -> None:
    source = (DEPLOY / "composer_dag.py").read_text(encoding="utf-8")
    assert "from airflow.sdk import DAG" in source
    assert "from airflow.providers.google.cloud.operators.dataflow import DataflowStartFlexTemplateOperator" in source
    assert 'f"{TEMPLATES}/araopt-{job}.json"' in source
    assert re.search(r"nightly\s*>>\s*measure", source)
    variables = {"araopt_bucket": "my-bucket", "araopt_slices": "campaign,geo", "araopt_values": "purchases"}

    def render(expression: str) -> str:
        """Evaluate the few Jinja forms the DAG uses (the real render is in deploy/check_dag.sh)."""
        expression = expression.strip()
        if match := re.fullmatch(r"macros\.ds_add\(ds, (-?\d+)\)", expression):  # ds = 2025-03-02
            return str(dt.date(2025, 3, 2) + dt.timedelta(days=int(match.group(1))))
        if match := re.fullmatch(r"var\.value\.get\('(\w+)', '([^']*)'\)", expression):
            return variables.get(match.group(1), match.group(2))
        if match := re.fullmatch(r"var\.value\.(\w+)", expression):
            return variables[match.group(1)]
        raise AssertionError(f"unexpected template expression {expression!r} in a DAG parameter")

    def sample(parameters: dict[str, str]) -> dict[str, str]:
        return {k: re.sub(r"\{\{(.*?)\}\}", lambda m: render(m.group(1)), v) for k, v in parameters.items()}

    nightly, measure = sample(_dag_literal("NIGHTLY_PARAMETERS")), sample(_dag_literal("MEASURE_PARAMETERS"))
    assert_template_parameters_valid("nightly", nightly)
    assert_template_parameters_valid("measure", measure)
    # the measured day follows the nightly window: a version is never used on the days it was tuned on (a
    # release of them over its history domain is refused, test_release_rules)
    measured = re.search(r"date=(\d{4}-\d{2}-\d{2})/", measure["input"]).group(1)
    assert dt.date.fromisoformat(measured) == dt.date.fromisoformat(nightly["as_of"]) + dt.timedelta(days=1)


def _scheduler_job() -> dict[str, Any]:
    text = string.Template((DEPLOY / "scheduler-nightly.yaml").read_text(encoding="utf-8")).substitute(SAMPLE_VARS)
    return yaml.safe_load(text)


def test_scheduler_job_launches_the_nightly_template() -> None:
    job = _scheduler_job()
    assert job["name"] == "projects/my-project/locations/us-central1/jobs/araopt-nightly"
    assert len(job["schedule"].split()) == 5 and job["timeZone"]
    target = job["httpTarget"]
    assert target["uri"] == (
        "https://dataflow.googleapis.com/v1b3/projects/my-project/locations/us-central1/flexTemplates:launch"
    )
    assert target["httpMethod"] == "POST"
    assert target["oauthToken"]["serviceAccountEmail"].endswith("@my-project.iam.gserviceaccount.com")
    assert target["oauthToken"]["scope"] == "https://www.googleapis.com/auth/cloud-platform"
    launch = target["body"]["launchParameter"]
    assert launch["containerSpecGcsPath"] == "gs://my-bucket/templates/araopt-nightly.json"
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", launch["jobName"])
    assert launch["environment"]["serviceAccountEmail"].startswith("araopt-nightly@")
    assert_template_parameters_valid("nightly", launch["parameters"])
    assert launch["parameters"]["as_of"] == "yesterday"  # a static body must not pin a date
    json.dumps(target["body"])  # what deploy/README.md sends with --message-body-from-file


def test_dockerfile_uses_launcher_base_and_existing_entry_point() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(r"^FROM gcr\.io/dataflow-templates-base/python311-template-launcher-base\b", dockerfile, re.M)
    env = dict(re.findall(r"^ENV (\w+)=(\S+)", dockerfile, re.M))
    assert env["FLEX_TEMPLATE_PYTHON_PY_FILE"] == "${WORKDIR}/deploy/flex_main.py"
    assert env["FLEX_TEMPLATE_PYTHON_SETUP_FILE"] == "${WORKDIR}/setup.py"
    assert env["ARAOPT_JOB"] == "${JOB}"
    assert (DEPLOY / "flex_main.py").is_file() and (DEPLOY.parent / "setup.py").is_file()
    build = yaml.safe_load((DEPLOY / "cloudbuild.yaml").read_text(encoding="utf-8"))
    jobs = {step["args"][step["args"].index("--build-arg") + 1] for step in build["steps"]}
    assert jobs == {"JOB=nightly", "JOB=measure"}


def test_flex_entry_point_dispatches_by_job(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert flex_main.build_argv("nightly", ["--as_of=yesterday"]) == ["nightly", "--as_of=yesterday"]
    assert flex_main.build_argv("measure", []) == ["measure"]
    with pytest.raises(ValueError, match="ARAOPT_JOB"):
        flex_main.build_argv("train", [])
    monkeypatch.delenv("ARAOPT_JOB", raising=False)
    assert flex_main.main() == 2
    assert "ARAOPT_JOB" in capsys.readouterr().err


def test_check_dag_script_is_valid_bash() -> None:
    script = DEPLOY / "check_dag.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    assert "DagBag" in script.read_text(encoding="utf-8")


def test_readme_documents_build_run_schedule_and_composer() -> None:
    readme = (DEPLOY / "README.md").read_text(encoding="utf-8")
    for command in (
        "gcloud dataflow flex-template build",
        "gcloud dataflow flex-template run",
        "gcloud scheduler jobs create http",
        "gcloud composer environments storage dags import",
        "python -m deploy.gen_metadata",
        "bash deploy/check_dag.sh",
    ):
        assert command in readme, command
