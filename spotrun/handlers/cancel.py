"""Canceller Lambda: an execution that is stopped, fails or times out stops its training jobs (and its preparation
job, spotrun/preparation.py `stop_preparation`).

Step Functions runs no cleanup on StopExecution, and a job created with CallAwsService keeps running (and
billing, though never past its MaxRuntime, which the cap set) after its execution ends. An EventBridge rule on
"Step Functions Execution Status Change" (ABORTED, FAILED, TIMED_OUT) of the pipeline's state machine invokes this
handler asynchronously; Lambda retries a failed invocation and then sends it to the on-failure destination (a
queue with an alarm), so a throttled StopTrainingJob is retried rather than dropped.

Which jobs: every segment's name starts with the execution's first job name (derived from the run name and the
execution's name, as the estimate does); of the jobs in progress with that name, the ones whose `execution` tag
is this execution's are stopped (StopTrainingJob: SIGTERM, the trainer saves its checkpoint on the way out). A
duplicate event finds them stopping and does nothing.
Environment (read here, at the entry point): JOB_PREFIX, TOPIC_ARN.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ..preparation_finish import stop_preparation
from ..seams import EXECUTION_TAG
from .estimate import PipelineSettings, job_name

CANCEL_STATUSES = ("ABORTED", "FAILED", "TIMED_OUT")


def first_job_of(detail: dict, job_prefix: str, execution_input: str | None) -> str | None:
    """The execution's first job name (every later segment's name starts with it), or None without a run name."""
    try:
        run_name = json.loads(execution_input or "{}").get("name")
    except (json.JSONDecodeError, AttributeError):
        return None
    if not isinstance(run_name, str) or not run_name:
        return None
    settings = PipelineSettings(bucket="", job_prefix=job_prefix, model_package_group="", poll_seconds=1,
                                project="", stage="", cost_center="")
    return job_name(settings, run_name, detail["name"])


def cancel(detail: dict, sagemaker: Any, *, job_prefix: str, execution_input: str | None) -> list[str]:
    """Stop this execution's running jobs; returns the names of the jobs stopped."""
    if detail.get("status") not in CANCEL_STATUSES:
        return []
    first = first_job_of(detail, job_prefix, execution_input)
    if first is None:
        return []
    stopped = []
    pages = sagemaker.get_paginator("list_training_jobs").paginate(NameContains=first, StatusEquals="InProgress")
    for page in pages:
        for job in page["TrainingJobSummaries"]:
            if not job["TrainingJobName"].startswith(first):
                continue
            tags = {t["Key"]: t["Value"] for t in sagemaker.list_tags(ResourceArn=job["TrainingJobArn"])["Tags"]}
            if tags.get(EXECUTION_TAG) != detail["name"]:
                continue  # a job of an earlier execution that had the same name
            sagemaker.stop_training_job(TrainingJobName=job["TrainingJobName"])
            stopped.append(job["TrainingJobName"])
    return stopped


def handler(event: dict, _context: Any) -> dict:
    import boto3

    detail = event.get("detail") or {}
    execution_input = detail.get("input")
    if execution_input is None and detail.get("executionArn"):  # EventBridge leaves out large inputs
        execution_input = boto3.client("stepfunctions").describe_execution(
            executionArn=detail["executionArn"]).get("input")
    sagemaker = boto3.client("sagemaker")
    stopped = cancel(detail, sagemaker, job_prefix=os.environ["JOB_PREFIX"], execution_input=execution_input)
    if detail.get("status") in CANCEL_STATUSES and detail.get("name"):  # and its raw data's preparation job
        stopped += stop_preparation(sagemaker, job_prefix=os.environ["JOB_PREFIX"], execution=detail["name"])
    if stopped and os.environ.get("TOPIC_ARN"):
        boto3.client("sns").publish(
            TopicArn=os.environ["TOPIC_ARN"], Subject="spotrun: run cancelled",
            Message=f"execution {detail.get('name')} ended {detail.get('status')}: stopped job(s) "
                    f"{', '.join(stopped)} (a training job's trainer saves a checkpoint on the way out)")
    return {"stopped": stopped}
