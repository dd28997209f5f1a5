"""Canceller Lambda: an execution that is stopped, fails or times out stops its training job.

Step Functions runs no cleanup on StopExecution, and a job created with CallAwsService keeps running (and
billing, unguarded) after its execution ends. An EventBridge rule on "Step Functions Execution Status Change"
(ABORTED, FAILED, TIMED_OUT) of the pipeline's state machine invokes this handler. It derives the execution's job
names the way the estimate does (the run name from the execution's input, the execution's name), and stops each
one that is still running and was created by this execution (StopTrainingJob: SIGTERM, the trainer saves its
checkpoint on the way out). A duplicate event finds the job already stopping and does nothing.
Environment (read here, at the entry point): JOB_PREFIX, TOPIC_ARN.
"""

from __future__ import annotations

import json
import os
from typing import Any

from .common import owned_by_execution, to_epoch
from .estimate import FALLBACK_SUFFIX, PipelineSettings, job_name

CANCEL_STATUSES = ("ABORTED", "FAILED", "TIMED_OUT")


def jobs_of(detail: dict, job_prefix: str, execution_input: str | None) -> list[str]:
    """The training job names an execution can have created (spot/first and on-demand fallback)."""
    try:
        run_name = json.loads(execution_input or "{}").get("name")
    except (json.JSONDecodeError, AttributeError):
        return []
    if not isinstance(run_name, str) or not run_name:
        return []
    settings = PipelineSettings(bucket="", job_prefix=job_prefix, model_package_group="", poll_seconds=1,
                                project="", stage="", cost_center="")
    first = job_name(settings, run_name, detail["name"])
    return [first, first + FALLBACK_SUFFIX]


def cancel(detail: dict, sagemaker: Any, *, job_prefix: str, execution_input: str | None) -> list[str]:
    """Stop this execution's running jobs; returns the names of the jobs stopped."""
    from botocore.exceptions import ClientError

    if detail.get("status") not in CANCEL_STATUSES:
        return []
    started = to_epoch(detail.get("startDate"))
    stopped = []
    for name in jobs_of(detail, job_prefix, execution_input):
        try:
            describe = sagemaker.describe_training_job(TrainingJobName=name)
        except ClientError as exc:
            if exc.response["Error"]["Code"] in ("ValidationException", "ResourceNotFound"):
                continue  # never created
            raise
        if describe.get("TrainingJobStatus") != "InProgress" or not owned_by_execution(describe, started):
            continue
        sagemaker.stop_training_job(TrainingJobName=name)
        stopped.append(name)
    return stopped


def handler(event: dict, _context: Any) -> dict:
    import boto3

    detail = event.get("detail") or {}
    execution_input = detail.get("input")
    if execution_input is None and detail.get("executionArn"):  # EventBridge leaves out large inputs
        execution_input = boto3.client("stepfunctions").describe_execution(
            executionArn=detail["executionArn"]).get("input")
    stopped = cancel(detail, boto3.client("sagemaker"), job_prefix=os.environ["JOB_PREFIX"],
                     execution_input=execution_input)
    if stopped and os.environ.get("TOPIC_ARN"):
        boto3.client("sns").publish(
            TopicArn=os.environ["TOPIC_ARN"], Subject="spotrun: run cancelled",
            Message=f"execution {detail.get('name')} ended {detail.get('status')}: stopped training job(s) "
                    f"{', '.join(stopped)} (the trainer saves a checkpoint on the way out)")
    return {"stopped": stopped}
