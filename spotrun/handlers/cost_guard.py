"""Cost guard Lambda: runs at every poll of the training job (the entry point; spotrun/pipeline/guard.py decides).

Input: {"plan": <estimate output>, "guard": <this handler's previous output>, "sentinel_request": <the state
machine's template of a sentinel's CreateTrainingJob request>}, decoded here into spotrun.seams.Plan and Guard (a
malformed one is refused with the field named). The handler describes the job (and the guard's sentinel, if any),
reads their tags and lists the run's committed checkpoints, asks `spotrun.pipeline.guard.decide` for the new guard
(spotrun.seams.Guard), creates the sentinel the new guard names (with the launcher role and the run's session tag,
as the launch function creates every job) or stops the one it stopped, and publishes the run's cost and
checkpoint age as CloudWatch embedded metrics.
Environment (read here only): spotrun.seams.CostGuardEnvironment.
"""

from __future__ import annotations

import os
import time
from typing import Any

import boto3
from botocore.exceptions import ClientError

from ..contract.strict_json import strict
from ..pipeline.aws_events import emit_metric
from ..pipeline.guard import checkpoint_overdue, committed_checkpoints, decide, sentinel_request
from ..pipeline.launch import launch
from ..seams import (
    CHECKPOINT_AGE_METRIC,
    CHECKPOINT_OVERDUE_METRIC,
    RUN_COST_METRIC,
    CostGuardEnvironment,
    Guard,
    Plan,
    PlanStatus,
)


def clock() -> float:
    """Now, in epoch seconds (the one place the guard reads the time; the simulation replaces it)."""
    return time.time()


def handler(event: dict, _context: Any) -> dict:
    event = event if isinstance(event, dict) else {}
    plan, guard = Plan.from_json(event.get("plan"), "plan"), Guard.from_json(event.get("guard"), "guard")
    if plan.status is not PlanStatus.OK:
        raise ValueError(f"plan.status={plan.status.value!r} is invalid: the cost guard polls the job of an "
                         f"{PlanStatus.OK.value!r} plan only")
    env = CostGuardEnvironment.from_env(os.environ)
    sagemaker = boto3.client("sagemaker")
    describe = sagemaker.describe_training_job(TrainingJobName=guard.job_name)
    tags = {t["Key"]: t["Value"] for t in sagemaker.list_tags(ResourceArn=describe["TrainingJobArn"])["Tags"]}
    newest, step = committed_checkpoints(boto3.client("s3"), plan.checkpoint_bucket, plan.checkpoint_prefix)
    sentinel = sentinel_tags = None
    if guard.sentinel_name:
        sentinel = sagemaker.describe_training_job(TrainingJobName=guard.sentinel_name)
        sentinel_tags = {t["Key"]: t["Value"]
                         for t in sagemaker.list_tags(ResourceArn=sentinel["TrainingJobArn"])["Tags"]}
    out = decide(plan, guard, describe, now=clock(), newest_checkpoint=newest, job_tags=tags,
                 checkpoint_step=step, sentinel=sentinel, sentinel_tags=sentinel_tags)
    _sentinel_calls(env, sagemaker, guard, out, event.get("sentinel_request"))
    dims = {"Stage": env.stage, "Run": plan.run_name}
    emit_metric(env.metrics_namespace, RUN_COST_METRIC, out.cost_usd, "None", dims)
    if out.checkpoint_age_seconds is not None:
        emit_metric(env.metrics_namespace, CHECKPOINT_AGE_METRIC, out.checkpoint_age_seconds, "Seconds", dims)
        emit_metric(env.metrics_namespace, CHECKPOINT_OVERDUE_METRIC,
                    checkpoint_overdue(plan, out.checkpoint_age_seconds), "None", {"Stage": env.stage})
    return strict(out.to_json())  # strict JSON: a non-finite figure fails here


def _sentinel_calls(env: CostGuardEnvironment, sagemaker, before: Guard, after: Guard, template: dict | None) -> None:
    """Create the sentinel `after` names and `before` did not; stop the one `after` stopped. A retried poll whose
    create went through finds its job (ResourceInUse, spotrun/pipeline/launch.py); a stop of a job that has
    already ended is refused by SageMaker (ValidationException), which is what the stop wanted."""
    if after.sentinel_name and after.sentinel_name != before.sentinel_name and not after.sentinel_stopping:
        if not template or not env.launcher_role_arn:
            raise ValueError("sentinel_request and LAUNCHER_ROLE_ARN are required to create a sentinel "
                             f"({after.sentinel_name}): the state machine passes the one, the construct sets the other")
        launch(boto3.client("sts"), lambda credentials: boto3.client("sagemaker", **credentials),
               env.launcher_role_arn, sentinel_request(template, after))
    if after.sentinel_name and after.sentinel_stopping and not (
            before.sentinel_stopping and before.sentinel_name == after.sentinel_name):
        try:
            sagemaker.stop_training_job(TrainingJobName=after.sentinel_name)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "ValidationException":
                raise
