"""The Lambda code asset: the `spotrun` package alone (stdlib + boto3, which the Python runtime provides).

The handlers are the same modules the CLI and tests use: no copies.
"""

from __future__ import annotations

from pathlib import Path

from aws_cdk import Duration
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

REPO_ROOT = Path(__file__).resolve().parent.parent
RUNTIME = lambda_.Runtime.PYTHON_3_14


def spotrun_code() -> lambda_.Code:
    # Asset root is the repository; everything but spotrun/ is excluded (negated globs keep the package).
    return lambda_.Code.from_asset(str(REPO_ROOT), exclude=["*", "!spotrun", "!spotrun/**", "**/__pycache__"])


def spotrun_function(scope: Construct, id_: str, *, handler: str, description: str, environment: dict[str, str],
                     timeout_s: int = 30) -> lambda_.Function:
    log_group = logs.LogGroup(scope, f"{id_}Logs", retention=logs.RetentionDays.THREE_MONTHS)
    # Its own role writing only its own log group (instead of the AWS-managed AWSLambdaBasicExecutionRole).
    role = iam.Role(scope, f"{id_}Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
                    description=description[:1000])
    role.add_to_policy(iam.PolicyStatement(actions=["logs:CreateLogStream", "logs:PutLogEvents"],
                                           resources=[log_group.log_group_arn]))
    return lambda_.Function(
        scope, id_, runtime=RUNTIME, code=spotrun_code(), handler=handler, description=description,
        environment=environment, timeout=Duration.seconds(timeout_s), memory_size=256, log_group=log_group,
        role=role,
    )
