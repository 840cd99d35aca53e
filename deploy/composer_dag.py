"""Airflow 3 (Cloud Composer 3) DAG: araopt nightly → measure, both as Dataflow Flex Templates.

The alternative to deploy/scheduler-nightly.yaml when measurement should follow the nightly job:
``nightly`` optimizes on the window up to the day before the measured day and publishes the parameters;
``measure`` then resolves the store's ``latest`` (checksum-verified; run_summary.json records the
version) and measures the last complete day, the day after that window: a version is never used on the
days it was tuned on (its key domain is their slices, and a release of them over it is refused).
Each task waits for its Dataflow job to finish.

Configure with Airflow Variables (``airflow variables set KEY VALUE``; defaults in brackets):
  araopt_project, araopt_region [us-central1], araopt_bucket,
  araopt_nightly_sa / araopt_measure_sa (service account e-mails, see deploy/iam.md),
  araopt_template_prefix [gs://<bucket>/templates], araopt_window_days [28],
  araopt_slices, araopt_values, araopt_epsilon [10].

Template parameter names must be those of pipelines/options.py (tests/test_deploy.py checks the
literal dictionaries below).
"""
from __future__ import annotations

import pendulum
from airflow.providers.google.cloud.operators.dataflow import DataflowStartFlexTemplateOperator
from airflow.sdk import DAG

PROJECT = "{{ var.value.araopt_project }}"
REGION = "{{ var.value.get('araopt_region', 'us-central1') }}"
BUCKET = "{{ var.value.araopt_bucket }}"
TEMPLATES = "{{ var.value.get('araopt_template_prefix', 'gs://' ~ var.value.araopt_bucket ~ '/templates') }}"

# the measured day is the day before the run's logical date (the last complete day when the run starts at
# 02:15); the nightly window ends the day before it (as_of), so the release is of a day after the version's
# history (``mechanism.release.check_learnt_window``).

NIGHTLY_PARAMETERS = {
    "history": "gs://{{ var.value.araopt_bucket }}/conversions/date=*/*.parquet",
    "as_of": "{{ macros.ds_add(ds, -2) }}",
    "window_days": "{{ var.value.get('araopt_window_days', '28') }}",
    "store": "gs://{{ var.value.araopt_bucket }}/params",
    "slices": "{{ var.value.araopt_slices }}",
    "values": "{{ var.value.araopt_values }}",
    "epsilon": "{{ var.value.get('araopt_epsilon', '10') }}",
}

MEASURE_PARAMETERS = {
    "input": "gs://{{ var.value.araopt_bucket }}/conversions/date={{ macros.ds_add(ds, -1) }}/*.parquet",
    "params": "gs://{{ var.value.araopt_bucket }}/params",
    "output": "gs://{{ var.value.araopt_bucket }}/summaries/{{ macros.ds_add(ds, -1) }}",
    "epsilon": "{{ var.value.get('araopt_epsilon', '10') }}",
}


def launch_body(job: str, parameters: dict[str, str], service_account: str) -> dict[str, object]:
    """The flexTemplates:launch request body for one job."""
    return {
        "launchParameter": {
            "jobName": f"araopt-{job}-{{{{ ds_nodash }}}}",
            "containerSpecGcsPath": f"{TEMPLATES}/araopt-{job}.json",
            "parameters": parameters,
            "environment": {
                "serviceAccountEmail": service_account,
                "tempLocation": f"gs://{BUCKET}/dataflow/tmp",
                "stagingLocation": f"gs://{BUCKET}/dataflow/staging",
                "maxWorkers": 10,
                "additionalUserLabels": {"app": "araopt", "job": job},
            },
        }
    }


with DAG(
    dag_id="araopt_nightly_measure",
    description="araopt: optimize summary-report parameters, then measure with them",
    schedule="15 2 * * *",
    start_date=pendulum.datetime(2025, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,  # two nightly runs must never race for the pointer from one DAG
    default_args={"retries": 0},  # a re-run of the same as-of date is idempotent: retry by hand
    tags=["araopt"],
) as dag:
    nightly = DataflowStartFlexTemplateOperator(
        task_id="nightly",
        project_id=PROJECT,
        location=REGION,
        body=launch_body("nightly", NIGHTLY_PARAMETERS, "{{ var.value.araopt_nightly_sa }}"),
        wait_until_finished=True,
        append_job_name=False,
    )
    measure = DataflowStartFlexTemplateOperator(
        task_id="measure",
        project_id=PROJECT,
        location=REGION,
        body=launch_body("measure", MEASURE_PARAMETERS, "{{ var.value.araopt_measure_sa }}"),
        wait_until_finished=True,
        append_job_name=False,
    )
    nightly >> measure
