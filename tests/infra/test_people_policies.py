"""The managed policies for people (training_constructs/people_policies.py), decided by iam-simulate on the
synthesized documents: what lies outside each person's commands is denied. That every call each command makes is
allowed is proved where the commands run against moto (tests/infra/test_cli_remote.py, test_user_day.py:
`assert_people_may`, on the calls the CLI's clients made)."""

from __future__ import annotations

from spotrun.seams import PREPARED_PREFIX, RUN_RECORD
from tests.infra.iam_simulate import Request, decide
from tests.infra.people import ACCOUNT, REGION, people_policies
from tests.infra.render import placeholder

BUCKET = "spotrun-artifacts"
SM = f"arn:aws:states:{REGION}:{ACCOUNT}:stateMachine:pipeline"
JOB = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-job/spotrun-dev-run-a-1a2b"
PACKAGE = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:model-package/spotrun-dev-models-0a1b2c3d/1"


def _policies(synth) -> dict[str, list[dict]]:
    resources = synth.template["Resources"]

    def resolve(logical: str, attr: str | None) -> str:
        kind = resources[logical]["Type"]
        if kind == "AWS::S3::Bucket":
            return BUCKET if attr is None else f"arn:aws:s3:::{BUCKET}"
        if kind == "AWS::StepFunctions::StateMachine":
            return "pipeline" if attr == "Name" else SM
        if kind == "AWS::IAM::Role":
            return f"arn:aws:iam::{ACCOUNT}:role/{logical}"
        if kind == "AWS::KMS::Key":
            return f"arn:aws:kms:{REGION}:{ACCOUNT}:key/0a1b2c3d-0000-4000-8000-000000000000"
        return placeholder(logical, attr)

    return people_policies(synth.template, resolve)


def _role(synth, prefix: str) -> str:
    (logical,) = [k for k, r in synth.template["Resources"].items()
                  if r["Type"] == "AWS::IAM::Role" and k.startswith(prefix)]
    return f"arn:aws:iam::{ACCOUNT}:role/{logical}"


def _denied(policies: list[dict], requests: list[Request]) -> list[str]:
    return [f"{r.action} {r.resource}" for r, d in zip(requests, decide(policies, requests), strict=True)
            if d == "Allowed"]


def test_a_run_user_cannot_approve_train_outside_the_pipeline_or_touch_job_data(synth):
    s3 = f"arn:aws:s3:::{BUCKET}/"
    outside = [
        Request("sagemaker:UpdateModelPackage", PACKAGE),  # approval is the approver's
        Request("sagemaker:CreateTrainingJob", JOB),  # jobs are the pipeline's (the launch function's)
        Request("iam:PassRole", _role(synth, "ExecutionRole"),
                context={"iam:PassedToService": "sagemaker.amazonaws.com"}),
        Request("s3:PutObject", f"{s3}{PREPARED_PREFIX}0123abcd/shard-00000.bin"),  # the preparation job's alone
        Request("s3:PutObject", f"{s3}output/run-a/job/output/model.tar.gz"),
        Request("s3:GetObject", f"{s3}output/run-a/job/output/model.tar.gz"),
        Request("s3:PutObject", f"{s3}checkpoints/run-a/exec-1/step-20/x.distcp"),
        Request("s3:DeleteObject", f"{s3}models/llama/config.json"),
        Request("states:StartExecution", f"arn:aws:states:{REGION}:{ACCOUNT}:stateMachine:another"),
        Request("cloudformation:DeleteStack",
                f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/dev-Spotrun/0a1b2c3d-0000-4000-8000-000000000000"),
    ]
    assert _denied(_policies(synth)["RunUser"], outside) == []


def test_a_run_user_creates_a_run_record_and_cannot_replace_another_runs(synth):
    """`start` writes its execution's run record with `If-None-Match: *` (spotrun/pipeline/preflight.py); a put
    without it (an overwrite of run-b's record, which S3 would otherwise accept) is denied."""
    record = f"arn:aws:s3:::{BUCKET}/checkpoints/run-b/exec-1/{RUN_RECORD}"
    policies = _policies(synth)["RunUser"]
    assert decide(policies, [Request("s3:PutObject", record, context={"s3:if-none-match": "*"}),
                             Request("s3:GetObject", record)]) == ["Allowed", "Allowed"]
    assert _denied(policies, [Request("s3:PutObject", record),
                              Request("s3:PutObject", record, context={"s3:if-match": "0a1b2c"})]) == []


def test_an_approver_approves_and_cannot_start_upload_or_deploy(synth):
    outside = [Request("states:StartExecution", SM), Request("sagemaker:StopTrainingJob", JOB),
               Request("s3:PutObject", f"arn:aws:s3:::{BUCKET}/datasets/alpaca/index.json"),
               Request("sagemaker:CreateEndpoint", f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:endpoint/run-a")]
    policies = _policies(synth)["Approver"]
    assert _denied(policies, outside) == []
    assert decide(policies, [Request("sagemaker:UpdateModelPackage", PACKAGE)]) == ["Allowed"]


def test_a_deployer_only_assumes_the_cdk_bootstrap_roles(synth):
    bootstrap = [f"arn:aws:iam::{ACCOUNT}:role/cdk-hnb659fds-{r}-role-{ACCOUNT}-{REGION}"
                 for r in ("deploy", "file-publishing", "image-publishing", "lookup")]
    policies = _policies(synth)["Deployer"]
    assert decide(policies, [Request("sts:AssumeRole", r) for r in bootstrap]) == ["Allowed"] * 4
    outside = [Request("sts:AssumeRole", f"arn:aws:iam::{ACCOUNT}:role/cdk-hnb659fds-cfn-exec-role-{ACCOUNT}-{REGION}"),
               Request("sts:AssumeRole", _role(synth, "ExecutionRole")),
               Request("iam:CreateRole", f"arn:aws:iam::{ACCOUNT}:role/anything"),
               Request("cloudformation:CreateStack", f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/x/*")]
    assert _denied(policies, outside) == []
