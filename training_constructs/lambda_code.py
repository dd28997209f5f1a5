"""The Lambda code asset: the `spotrun` package alone (stdlib + boto3, which the Python runtime provides).

The handlers (spotrun/handlers/) are thin entry points over the library the CLI and tests use (spotrun/pipeline/plan.py,
guard.py, measured.py, ...): the same modules, no copies.
"""

from __future__ import annotations

from pathlib import Path

from aws_cdk import Duration
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_destinations as destinations
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from .nag import acknowledge

REPO_ROOT = Path(__file__).resolve().parent.parent
RUNTIME = lambda_.Runtime.PYTHON_3_14


def spotrun_code() -> lambda_.Code:
    # Asset root is the repository; everything but spotrun/ is excluded (negated globs keep the package).
    return lambda_.Code.from_asset(str(REPO_ROOT), exclude=["*", "!spotrun", "!spotrun/**", "**/__pycache__"])


def spotrun_function(scope: Construct, id_: str, *, handler: str, description: str, environment: dict[str, str],
                     timeout_s: int = 30, memory_mb: int = 256) -> lambda_.Function:
    log_group = logs.LogGroup(scope, f"{id_}Logs", retention=logs.RetentionDays.THREE_MONTHS)
    # Its own role writing only its own log group (instead of the AWS-managed AWSLambdaBasicExecutionRole).
    role = iam.Role(scope, f"{id_}Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
                    description=description[:1000])
    role.add_to_policy(iam.PolicyStatement(actions=["logs:CreateLogStream", "logs:PutLogEvents"],
                                           resources=[log_group.log_group_arn]))
    return lambda_.Function(
        scope, id_, runtime=RUNTIME, code=spotrun_code(), handler=handler, description=description,
        environment=environment, timeout=Duration.seconds(timeout_s), memory_size=memory_mb, log_group=log_group,
        role=role,
    )


def dead_letter_queue(scope: Construct, id_: str) -> sqs.Queue:
    """Where EventBridge puts an event its Lambda target could not take after the retries (else it is dropped)."""
    queue = sqs.Queue(scope, id_, encryption=sqs.QueueEncryption.SQS_MANAGED, enforce_ssl=True,
                      retention_period=Duration.days(14))
    acknowledge(queue, "AwsSolutions-SQS3", "this queue is itself the dead-letter queue of an EventBridge target")
    return queue


def on_failure_destination(scope: Construct, id_: str, fn: lambda_.Function) -> sqs.Queue:
    """For a function invoked asynchronously (an EventBridge target): Lambda retries a failed invocation twice,
    then sends the event with the error here instead of dropping it. Returns the queue (alarm on it)."""
    queue = sqs.Queue(scope, id_, encryption=sqs.QueueEncryption.SQS_MANAGED, enforce_ssl=True,
                      retention_period=Duration.days(14))
    acknowledge(queue, "AwsSolutions-SQS3", "this queue is itself the on-failure destination of a function's "
                                            "asynchronous invocations (it keeps the failed events)")
    fn.configure_async_invoke(on_failure=destinations.SqsDestination(queue), retry_attempts=2,
                              max_event_age=Duration.hours(6))
    return queue
