#!/usr/bin/env bash
# Load deploy/composer_dag.py with Airflow's DagBag and fail on import errors.
#
# NOT part of the main test suite (`make test` only byte-compiles the DAG): installing Airflow takes
# about 4 minutes and 2.2 GB the first time. The virtualenv is kept outside the repository and
# reused on later runs. CI may call this script only if that fits its time budget.
#
#   bash deploy/check_dag.sh                     # uses/creates $AIRFLOW_CHECK_VENV
#   AIRFLOW_CHECK_VENV=/tmp/af bash deploy/check_dag.sh
#
# Exit status: 0 when the DAG imports and has the expected tasks, 1 otherwise, 3 when Airflow
# itself could not be installed (an environment problem, not a DAG problem).
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${AIRFLOW_CHECK_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/araopt-airflow-check-venv}"
PYTHON="${PYTHON:-python3}"
# Pinned to the versions this check was validated with (Composer 3 / Airflow 3 era).
AIRFLOW_SPEC="${AIRFLOW_SPEC:-apache-airflow==3.3.2}"
PROVIDERS="${AIRFLOW_PROVIDERS:-apache-airflow-providers-google==22.8.0 apache-airflow-providers-apache-beam==6.3.1}"

if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import airflow.providers.google, airflow.providers.apache.beam" 2>/dev/null; then
    echo "check_dag: installing Airflow into $VENV (first run: ~4 min, ~2.2 GB)" >&2
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    # shellcheck disable=SC2086
    if ! "$VENV/bin/python" -m pip install --quiet "$AIRFLOW_SPEC" $PROVIDERS; then
        echo "check_dag: could not install Airflow (registry or resolver problem); exit 3" >&2
        exit 3
    fi
fi

AIRFLOW_HOME="$(mktemp -d)"
trap 'rm -rf "$AIRFLOW_HOME"' EXIT
export AIRFLOW_HOME
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__UNIT_TEST_MODE=True

"$VENV/bin/python" - "$REPO" <<'PY'
"""DagBag import check for the araopt Composer DAG, plus a render of its templated launch bodies."""
import inspect
import json
import re
import sys

try:  # Airflow >= 3.1
    from airflow.dag_processing.dagbag import DagBag
except ImportError:  # Airflow 3.0
    from airflow.models.dagbag import DagBag

import airflow
from airflow.sdk.execution_time import macros

repo = sys.argv[1]
sys.path.insert(0, repo)
from pipelines.options import OPTIONS_BY_JOB  # noqa: E402

path = f"{repo}/deploy/composer_dag.py"
# Airflow 3.0 still takes include_examples; later releases read AIRFLOW__CORE__LOAD_EXAMPLES only.
extra = {"include_examples": False} if "include_examples" in inspect.signature(DagBag.__init__).parameters else {}
bag = DagBag(dag_folder=path, **extra)
if bag.import_errors:
    for file, error in bag.import_errors.items():
        print(f"IMPORT ERROR in {file}:\n{error}", file=sys.stderr)
    sys.exit(1)
dag = bag.dags.get("araopt_nightly_measure")
if dag is None:
    print(f"no DAG 'araopt_nightly_measure' in {path}; found {sorted(bag.dags)}", file=sys.stderr)
    sys.exit(1)
tasks = {task.task_id: task for task in dag.tasks}
if set(tasks) != {"nightly", "measure"} or "measure" not in tasks["nightly"].downstream_task_ids:
    print(f"unexpected tasks/dependencies: {sorted(tasks)}", file=sys.stderr)
    sys.exit(1)

# Render the templated fields with sample Variables and check the result against the options.
variables = {
    "araopt_project": "my-project", "araopt_bucket": "my-bucket",
    "araopt_nightly_sa": "araopt-nightly@my-project.iam.gserviceaccount.com",
    "araopt_measure_sa": "araopt-measure@my-project.iam.gserviceaccount.com",
    "araopt_slices": "campaign,geo", "araopt_values": "purchases",
}
context = {"ds": "2025-03-02", "ds_nodash": "20250302", "macros": macros, "var": {"value": variables, "json": {}}}
problems = []
for task_id, task in tasks.items():
    body = task.render_template(task.body, context)
    text = json.dumps(body)
    if "{{" in text or "{%" in text:
        problems.append(f"{task_id}: unrendered template in {text}")
    launch = body["launchParameter"]
    if launch["containerSpecGcsPath"] != f"gs://my-bucket/templates/araopt-{task_id}.json":
        problems.append(f"{task_id}: template path {launch['containerSpecGcsPath']}")
    if not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", launch["jobName"]):
        problems.append(f"{task_id}: invalid Dataflow job name {launch['jobName']!r}")
    options = {option.name: option for option in OPTIONS_BY_JOB[task_id]}
    for name, value in launch["parameters"].items():
        option = options.get(name)
        if option is None:
            problems.append(f"{task_id}: unknown parameter {name}")
            continue
        for regex in option.template_regexes:
            if not re.match(regex, value):
                problems.append(f"{task_id}: {name}={value!r} does not match {regex}")
    missing = [o.name for o in options.values() if o.required and o.name not in launch["parameters"]]
    if missing:
        problems.append(f"{task_id}: missing required parameters {missing}")
    for field in ("project_id", "location"):
        if "{{" in str(task.render_template(getattr(task, field), context)):
            problems.append(f"{task_id}: {field} not rendered")
    print(f"check_dag: {task_id}: {json.dumps(launch['parameters'])}")
if problems:
    print("\n".join(problems), file=sys.stderr)
    sys.exit(1)
print(f"check_dag: OK (Airflow {airflow.__version__}): {dag.dag_id} with tasks nightly >> measure")
PY
