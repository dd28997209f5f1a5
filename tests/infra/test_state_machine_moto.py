"""The synthesized state machine, executed by moto's Step Functions interpreter.

Every SageMaker call runs against moto for real; the two Lambdas cannot run without Docker, so each test calls
the real handler (spotrun.handlers) itself and queues its output for moto to return (KNOWLEDGE.md).
"""

from __future__ import annotations

import copy
import json
import time

import boto3
import pytest
import requests
from moto import mock_aws

from spotrun.handlers.cost_guard import decide
from spotrun.handlers.estimate import PipelineSettings, plan
from tests.infra.render import render

REGION, ACCOUNT = "us-east-1", "123456789012"
BUCKET = "spotrun-artifacts-test"
RUN = {"version": 1, "name": "moto-run",
       "model": {"source": f"s3://{BUCKET}/models/tiny/"},
       "data": {"source": f"s3://{BUCKET}/datasets/tiny/", "seq_len": 128},
       "compute": {"instance_type": "ml.g5.2xlarge"},
       "budget": {"max_usd": 25}, "tags": {"team": "nlp"}}


def _env_of(synth, logical_prefix: str) -> dict:
    fn = next(r for k, r in synth.resources("AWS::Lambda::Function").items() if k.startswith(logical_prefix))
    return fn["Properties"]["Environment"]["Variables"]


@pytest.fixture
def aws(synth):
    """moto with the stack's resources created, and the synthesized state machine rendered onto them."""
    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}, "lambda": {"use_docker": False}}):
        s3 = boto3.client("s3", region_name=REGION)
        s3.create_bucket(Bucket=BUCKET)
        s3.put_object(Bucket=BUCKET, Key="models/tiny/config.json", Body=json.dumps(
            {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "vocab_size": 256}))
        s3.put_object(Bucket=BUCKET, Key="datasets/tiny/index.json", Body=json.dumps({"total_tokens": 5_000_000}))
        iam = boto3.client("iam", region_name=REGION)
        trust = json.dumps({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                                    "Principal": {"Service": "states.amazonaws.com"}}]})
        role_arn = iam.create_role(RoleName="sm-role", AssumeRolePolicyDocument=trust)["Role"]["Arn"]
        lam = boto3.client("lambda", region_name=REGION)
        arns = {}
        for logical in ("PipelineEstimateFnAA2A49C2", "PipelineCostGuardFn930206BB"):
            arns[logical] = lam.create_function(
                FunctionName=logical, Runtime="python3.12", Role=role_arn, Handler="x.handler",
                Code={"ZipFile": b"PK\x05\x06" + b"\x00" * 18})["FunctionArn"]
        topic = boto3.client("sns", region_name=REGION).create_topic(Name="failures")["TopicArn"]
        sagemaker = boto3.client("sagemaker", region_name=REGION)
        sagemaker.create_model_package_group(ModelPackageGroupName="spotrun-models")

        def resolve(logical: str, attr: str | None) -> str:
            if logical == "ArtifactsBucket88671897":
                return BUCKET if attr is None else f"arn:aws:s3:::{BUCKET}"
            if logical in arns:
                return arns[logical]
            if logical == "FailuresTopic8CFD5254":
                return topic
            if logical == "ArtifactsKeyA4B22E2B":
                return f"arn:aws:kms:{REGION}:{ACCOUNT}:key/00000000-0000-0000-0000-000000000000"
            if logical == "ExecutionRoleCDF74862":
                return role_arn
            raise KeyError(logical)

        _, sm = synth.one("AWS::StepFunctions::StateMachine")
        definition = render(sm["Properties"]["DefinitionString"], resolve)
        sfn = boto3.client("stepfunctions", region_name=REGION)
        sm_arn = sfn.create_state_machine(name="pipeline", definition=definition, roleArn=role_arn)["stateMachineArn"]
        env = _env_of(synth, "PipelineEstimateFn")
        settings = PipelineSettings(bucket=BUCKET, job_prefix=env["JOB_PREFIX"],
                                    model_package_group=env["MODEL_PACKAGE_GROUP"], poll_seconds=1,
                                    project=env["PROJECT"], stage=env["STAGE"], cost_center=env["COST_CENTER"])
        yield {"sfn": sfn, "sm_arn": sm_arn, "sagemaker": sagemaker, "s3": s3, "settings": settings}


def queue_lambda_results(*results: dict) -> None:
    resp = requests.post("http://motoapi.amazonaws.com/moto-api/static/lambda-simple/response",
                         json={"results": [json.dumps(r) for r in results], "region": REGION})
    assert resp.status_code == 201


def execute(aws, name: str, run: dict) -> dict:
    arn = aws["sfn"].start_execution(stateMachineArn=aws["sm_arn"], name=name, input=json.dumps(run))["executionArn"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        desc = aws["sfn"].describe_execution(executionArn=arn)
        if desc["status"] != "RUNNING":
            return desc
        time.sleep(0.2)
    raise TimeoutError(name)


def test_good_run_creates_a_spot_job_with_checkpoints_and_registers_the_model(aws):
    p = plan(copy.deepcopy(RUN), "good", aws["settings"], s3_client=aws["s3"])
    assert p["status"] == "ok", p
    guard0 = {"action": "wait", "job_name": p["job_name"], "spot": True, "spent_before_usd": 0,
              "interruptions_before": 0}
    completed = decide(p, guard0, {
        "TrainingJobStatus": "Completed", "BillableTimeInSeconds": 900, "TrainingTimeInSeconds": 3000,
        "FinalMetricDataList": [{"MetricName": "train:loss", "Value": 2.5}],
        "ModelArtifacts": {"S3ModelArtifacts": f"s3://{BUCKET}/output/{p['job_name']}/output/model.tar.gz"}},
        now=time.time())
    queue_lambda_results(p, completed)

    result = execute(aws, "good", RUN)
    assert result["status"] == "SUCCEEDED", result

    job = aws["sagemaker"].describe_training_job(TrainingJobName=p["job_name"])
    assert job["EnableManagedSpotTraining"] is True
    assert job["CheckpointConfig"] == {"S3Uri": f"s3://{BUCKET}/checkpoints/moto-run/",
                                       "LocalPath": "/opt/ml/checkpoints"}
    stop = job["StoppingCondition"]
    assert stop["MaxWaitTimeInSeconds"] >= stop["MaxRuntimeInSeconds"] == p["max_runtime_seconds"]
    assert job["ResourceConfig"]["InstanceType"] == "ml.g5.2xlarge"
    assert [c["InputMode"] for c in job["InputDataConfig"]] == ["FastFile", "FastFile"]
    assert job["HyperParameters"]["checkpoint.interval_minutes"] == p["hyperparameters"]["checkpoint.interval_minutes"]
    assert job["OutputDataConfig"]["S3OutputPath"] == f"s3://{BUCKET}/output/"
    tags = {t["Key"]: t["Value"] for t in aws["sagemaker"].list_tags(ResourceArn=job["TrainingJobArn"])["Tags"]}
    assert tags["run"] == "moto-run" and tags["project"] == "spotrun" and tags["cost-center"] == "ml-platform"

    packages = aws["sagemaker"].list_model_packages(ModelPackageGroupName="spotrun-models")["ModelPackageSummaryList"]
    assert len(packages) == 1 and packages[0]["ModelApprovalStatus"] == "PendingManualApproval"
    package = aws["sagemaker"].describe_model_package(ModelPackageName=packages[0]["ModelPackageArn"])
    assert package["CustomerMetadataProperties"]["spot_savings_pct"] == "70.0"
    assert package["CustomerMetadataProperties"]["final_loss"] == "2.5"

    output = json.loads(result["output"])
    assert output["model_package_arn"] == packages[0]["ModelPackageArn"]
    assert output["report"]["cost_usd"] == round(900 / 3600 * p["usd_per_hour"] * (1 - p["spot_discount"]), 2)
    assert output["report"]["cap_usd"] == 25


def test_on_demand_run_creates_a_job_without_spot_with_its_warm_pool(aws):
    run = copy.deepcopy(RUN)
    run["compute"].update(spot=False, warm_pool_minutes=10)
    p = plan(run, "on-demand", aws["settings"], s3_client=aws["s3"])
    assert p["status"] == "ok" and p["spot"] is False, p
    guard0 = {"action": "wait", "job_name": p["job_name"], "spot": False, "spent_before_usd": 0,
              "interruptions_before": 0}
    done = decide(p, guard0, {"TrainingJobStatus": "Completed", "BillableTimeInSeconds": 600,
                              "TrainingTimeInSeconds": 600,
                              "ModelArtifacts": {"S3ModelArtifacts": f"s3://{BUCKET}/output/x/model.tar.gz"}},
                  now=time.time())
    queue_lambda_results(p, done)
    assert execute(aws, "on-demand", run)["status"] == "SUCCEEDED"
    job = aws["sagemaker"].describe_training_job(TrainingJobName=p["job_name"])
    assert job["EnableManagedSpotTraining"] is False
    assert "MaxWaitTimeInSeconds" not in job["StoppingCondition"]
    assert job["ResourceConfig"]["KeepAlivePeriodInSeconds"] == 600
    assert job["CheckpointConfig"]["S3Uri"] == f"s3://{BUCKET}/checkpoints/moto-run/"


@pytest.mark.parametrize("mutate, error", [
    (lambda r: r.update(budget={"max_usd": 0.01}), "OverBudget"),
    (lambda r: r["data"].update(source="s3://somewhere-else/datasets/x/"), "InvalidRun"),
])
def test_refused_runs_fail_by_name_before_any_job_is_created(aws, mutate, error):
    run = copy.deepcopy(RUN)
    mutate(run)
    p = plan(run, error, aws["settings"], s3_client=aws["s3"])
    assert p["status"] == error
    queue_lambda_results(p)

    result = execute(aws, error, run)
    assert result["status"] == "FAILED"
    history = aws["sfn"].get_execution_history(executionArn=result["executionArn"])["events"]
    failed = [e for e in history if e["type"] == "ExecutionFailed"][0]["executionFailedEventDetails"]
    assert failed["error"] == error and p["message"] in failed["cause"]
    assert aws["sagemaker"].list_training_jobs()["TrainingJobSummaries"] == []
