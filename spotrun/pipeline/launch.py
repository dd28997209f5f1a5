"""Creating a training job as its run: what the launch function does (spotrun/handlers/launch.py).

The training role's S3 grants name `${aws:PrincipalTag/run}` (training_constructs/execution_role.py): a job's
credentials reach only its own run's checkpoints and output. SageMaker gives the job those tags when the principal
that creates the job carries them as session tags and the request sets `SessionChainingConfig.
EnableSessionTagChaining` (API reference, SessionChainingConfig). Step Functions' own role carries no session tags,
so the state machine hands the request to the launch function, which assumes the launcher role with the session
tag run=<the request's run tag> and creates the job with that session. docs/security.md explains the choice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..seams import RUN_TAG

SESSION_NAME_MAX = 64  # AssumeRole RoleSessionName: 2-64 characters of [\w+=,.@-]


def run_of(request: dict) -> str:
    """The run whose job `request` creates: its `run` tag (the plan tags every job with it)."""
    runs = [t["Value"] for t in request.get("Tags") or [] if t.get("Key") == RUN_TAG]
    if len(runs) != 1 or not runs[0]:
        raise ValueError(f"CreateTrainingJob request for {request.get('TrainingJobName')!r}: expected exactly one "
                         f"non-empty {RUN_TAG!r} tag, got {runs}")
    return runs[0]


def training_job_request(request: dict) -> dict:
    """The CreateTrainingJob request as sent: the state machine's, with the creator's session tags passed on to
    the execution role."""
    return {**request, "SessionChainingConfig": {"EnableSessionTagChaining": True}}


def assume_as_run(sts, launcher_role_arn: str, request: dict) -> dict:
    """The launcher role's credentials, tagged with the request's run (boto3 client keyword arguments)."""
    run = run_of(request)
    session = f"{request['TrainingJobName']}"[:SESSION_NAME_MAX]
    creds = sts.assume_role(RoleArn=launcher_role_arn, RoleSessionName=session,
                            Tags=[{"Key": RUN_TAG, "Value": run}])["Credentials"]
    return {"aws_access_key_id": creds["AccessKeyId"], "aws_secret_access_key": creds["SecretAccessKey"],
            "aws_session_token": creds["SessionToken"]}


def launch(sts, sagemaker_as: Callable[[dict], Any], launcher_role_arn: str, request: dict) -> dict:
    """Create the job with the run's tagged session. A retried create whose first call went through finds its job
    (ResourceInUse): the guard checks the job is this execution's (spotrun/pipeline/guard.py)."""
    sagemaker = sagemaker_as(assume_as_run(sts, launcher_role_arn, request))
    try:
        arn = sagemaker.create_training_job(**training_job_request(request))["TrainingJobArn"]
    except sagemaker.exceptions.ResourceInUse:
        return {"job_name": request["TrainingJobName"], "created": False}
    return {"job_name": request["TrainingJobName"], "created": True, "job_arn": arn}
