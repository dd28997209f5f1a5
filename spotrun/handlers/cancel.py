"""Canceller Lambda: an execution that is stopped, fails or times out stops its training jobs (and its preparation
job, spotrun/pipeline/preparation.py `stop_preparation`).

Step Functions runs no cleanup on StopExecution, and a job created with CallAwsService keeps running (and
billing, though never past its MaxRuntime, which the cap set) after its execution ends. An EventBridge rule on
"Step Functions Execution Status Change" (ABORTED, FAILED, TIMED_OUT) of the pipeline's state machine invokes this
handler asynchronously; Lambda retries a failed invocation and then sends it to the on-failure destination (a
queue with an alarm), so a throttled StopTrainingJob is retried rather than dropped.

Which jobs: the execution's, found by name and `execution` tag (`spotrun.pipeline.plan.cancel`); an execution
that continues a run (spotrun/pipeline/continuation.py) stops the run's jobs once its parent is proven to have
started it.
Environment (read here, at the entry point): spotrun.seams.CancelEnvironment.
"""

from __future__ import annotations

import os
from typing import Any

import boto3

from ..pipeline.continuation import continued_run
from ..pipeline.plan import cancel
from ..pipeline.preparation_finish import stop_preparation
from ..seams import CANCEL_STATUSES, CancelEnvironment


def handler(event: dict, _context: Any) -> dict:
    detail = event.get("detail") or {}
    execution_input = detail.get("input")
    if execution_input is None and detail.get("executionArn"):  # EventBridge leaves out large inputs
        execution_input = boto3.client("stepfunctions").describe_execution(
            executionArn=detail["executionArn"]).get("input")
    env = CancelEnvironment.from_env(os.environ)
    sagemaker = boto3.client("sagemaker")
    continued = None
    if detail.get("stateMachineArn") and detail.get("name") and "continuation" in (execution_input or ""):
        continued = continued_run(boto3.client("stepfunctions"), detail["stateMachineArn"], detail["name"],
                                  execution_input)
    stopped = cancel(detail, sagemaker, job_prefix=env.job_prefix, execution_input=execution_input,
                     continued=continued)
    if detail.get("status") in CANCEL_STATUSES and detail.get("name"):  # and its raw data's preparation job
        stopped += stop_preparation(sagemaker, job_prefix=env.job_prefix, execution=detail["name"])
    if stopped and env.topic_arn:
        boto3.client("sns").publish(
            TopicArn=env.topic_arn, Subject="spotrun: run cancelled",
            Message=f"execution {detail.get('name')} ended {detail.get('status')}: stopped job(s) "
                    f"{', '.join(stopped)} (a training job's trainer saves a checkpoint on the way out)")
    return {"stopped": stopped}
