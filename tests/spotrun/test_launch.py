"""The launch function's library (spotrun/pipeline/launch.py) against moto's STS and SageMaker: the job is created
with the launcher role's session tagged with its run, and the request asks SageMaker to pass that tag on to the
training role (botocore validates every request against the service model before moto sees it)."""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws
from moto.sagemaker.models import sagemaker_backends

from spotrun.pipeline.launch import launch

REGION, ACCOUNT = "us-east-1", "123456789012"
REQUEST = {
    "TrainingJobName": "spotrun-run-a-1a2b3c4d-s1",
    "RoleArn": f"arn:aws:iam::{ACCOUNT}:role/training",
    "AlgorithmSpecification": {"TrainingImage": f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/trainer:1",
                               "TrainingInputMode": "FastFile"},
    "OutputDataConfig": {"S3OutputPath": "s3://bucket/output/run-a/"},
    "ResourceConfig": {"InstanceType": "ml.g5.2xlarge", "InstanceCount": 1, "VolumeSizeInGB": 50},
    "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
    "Tags": [{"Key": "execution", "Value": "exec-1"}, {"Key": "run", "Value": "run-a"},
             {"Key": "team", "Value": "nlp"}],
}


def _recording(client, operation: str, seen: list):
    client.meta.events.register(f"provide-client-params.{client.meta.service_model.service_name}.{operation}",
                                lambda params, **_: seen.append(dict(params)))
    return client


@mock_aws
def test_the_job_is_created_as_its_run_with_session_tag_chaining():
    trust = json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": ["sts:AssumeRole", "sts:TagSession"], "Principal": {"AWS": ACCOUNT}}]})
    role = boto3.client("iam").create_role(RoleName="launcher", AssumeRolePolicyDocument=trust)["Role"]["Arn"]
    assumed, created, sessions = [], [], []

    def sagemaker_as(credentials: dict):
        sessions.append(credentials)
        return _recording(boto3.client("sagemaker", region_name=REGION, **credentials), "CreateTrainingJob", created)

    out = launch(_recording(boto3.client("sts", region_name=REGION), "AssumeRole", assumed), sagemaker_as, role,
                 REQUEST)
    assert assumed == [{"RoleArn": role, "RoleSessionName": REQUEST["TrainingJobName"],
                        "Tags": [{"Key": "run", "Value": "run-a"}]}]
    assert created == [{**REQUEST, "SessionChainingConfig": {"EnableSessionTagChaining": True}}]
    assert sessions[0]["aws_session_token"]  # the assumed role's session, not the function's own credentials
    assert out == {"job_name": REQUEST["TrainingJobName"], "created": True,
                   "job_arn": sagemaker_backends[ACCOUNT][REGION].training_jobs[REQUEST["TrainingJobName"]].arn}


@mock_aws
def test_a_retried_create_that_finds_its_job_is_not_an_error():
    sagemaker = boto3.client("sagemaker", region_name=REGION)
    with Stubber(sagemaker) as stub:
        stub.add_client_error("create_training_job", service_error_code="ResourceInUse",
                              expected_params={**REQUEST, "SessionChainingConfig": {"EnableSessionTagChaining": True}})
        out = launch(boto3.client("sts", region_name=REGION), lambda _creds: sagemaker,
                     f"arn:aws:iam::{ACCOUNT}:role/launcher", REQUEST)
    assert out == {"job_name": REQUEST["TrainingJobName"], "created": False}


@pytest.mark.parametrize("tags", [[], [{"Key": "run", "Value": ""}],
                                  [{"Key": "run", "Value": "a"}, {"Key": "run", "Value": "b"}]])
def test_a_request_without_exactly_one_run_tag_is_refused_before_any_call(tags):
    def never(*_a, **_k):
        raise AssertionError("no AWS call for a refused request")

    class NoSts:
        assume_role = never

    with pytest.raises(ValueError, match=r"'spotrun-run-a-1a2b3c4d-s1': expected exactly one non-empty 'run' tag"):
        launch(NoSts(), never, "arn:aws:iam::123456789012:role/launcher", {**REQUEST, "Tags": tags})
