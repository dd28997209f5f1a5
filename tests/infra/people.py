"""What each CLI command asks of AWS: every API call the CLI's own clients make while a test runs the commands
against moto (tests/infra/test_cli_remote.py, test_user_day.py), with the command that made it; decided by
iam-simulate against the synthesized people policies (tests/infra/test_people_policies.py)."""

from __future__ import annotations

import dataclasses
import json
import threading
from dataclasses import dataclass, field

import botocore.client
import botocore.session

import spotrun.cli.main as cli_main
from tests.infra.iam_simulate import Request, decide
from tests.infra.render import PSEUDO, render

REGION, ACCOUNT = "us-east-1", "123456789012"  # tests/infra/test_state_machine_moto.py's moto
PERSON = f"arn:aws:iam::{ACCOUNT}:user/person"


@dataclass
class Call:
    command: str
    service: str
    operation: str
    params: dict


@dataclass
class Recorder:
    """Calls of the clients a command creates (in the main thread, while it runs; their calls may come from
    s3transfer's threads). moto's interpreter runs the Lambda handlers in its own threads with their own clients,
    and the test's own clients are made outside commands: neither is recorded."""

    calls: list[Call] = field(default_factory=list)
    command: str = ""

    def install(self, monkeypatch) -> None:
        recorder, build_parser = self, cli_main.build_parser
        create_client, make_api_call = botocore.session.Session.create_client, \
            botocore.client.BaseClient._make_api_call

        def parser():
            built = build_parser()
            parse = built.parse_args

            def parse_args(argv=None, namespace=None):
                args = parse(argv, namespace)
                func = args.func

                def run(a):
                    recorder.command = a.cmd
                    try:
                        return func(a)
                    finally:
                        recorder.command = ""
                args.func = run
                return args
            built.parse_args = parse_args
            return built

        def create(session, *args, **kwargs):
            client = create_client(session, *args, **kwargs)
            if recorder.command and threading.current_thread() is threading.main_thread():
                client._spotrun_command = recorder.command
            return client

        def call(client, operation, params):
            command = getattr(client, "_spotrun_command", "")
            if command:
                recorder.calls.append(Call(command, client.meta.service_model.service_name, operation,
                                           json.loads(json.dumps(params, default=str))))
            return make_api_call(client, operation, params)

        monkeypatch.setattr(cli_main, "build_parser", parser)
        monkeypatch.setattr(botocore.session.Session, "create_client", create)
        monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", call)


ARN = "arn:aws:{service}:" + f"{REGION}:{ACCOUNT}:" + "{resource}"
S3_ACTIONS = {"ListObjectsV2": "s3:ListBucket", "GetObject": "s3:GetObject", "HeadObject": "s3:GetObject",
              "PutObject": "s3:PutObject", "CreateMultipartUpload": "s3:PutObject", "UploadPart": "s3:PutObject",
              "CompleteMultipartUpload": "s3:PutObject", "AbortMultipartUpload": "s3:AbortMultipartUpload"}
SAGEMAKER_RESOURCES = (("EndpointConfig", "endpoint-config", "EndpointConfigName"),
                       ("Endpoint", "endpoint", "EndpointName"), ("TrainingJob", "training-job", "TrainingJobName"),
                       ("Model", "model", "ModelName"))


def iam_requests(call: Call, key_arn: str) -> list[Request]:
    """As a person (an IAM user): `_requests`."""
    return [dataclasses.replace(r, principal=PERSON) for r in _requests(call, key_arn)]


def _requests(call: Call, key_arn: str) -> list[Request]:
    """The IAM requests AWS authorizes for one API call (Service Authorization Reference: the action, the
    resource type, the condition keys), including what it implies: SSE-KMS data keys for S3 objects, AddTags for a
    SageMaker create with Tags, PassRole for a role given to SageMaker."""
    p, op = call.params, call.operation
    if call.service == "cloudformation":
        return [Request(f"cloudformation:{op}", PSEUDO["AWS::StackId"])]
    if call.service == "stepfunctions":
        return [Request(f"states:{op}", p.get("executionArn") or p["stateMachineArn"])]
    if call.service == "logs":
        group = ARN.format(service="logs", resource=f"log-group:{p['logGroupName']}")
        return [Request(f"logs:{op}", f"{group}:log-stream:{p['logStreamName']}" if "logStreamName" in p else group)]
    if call.service == "s3":
        action = S3_ACTIONS[op]
        if action == "s3:ListBucket":
            return [Request(action, f"arn:aws:s3:::{p['Bucket']}", context={"s3:prefix": p.get("Prefix", "")})]
        key = Request("kms:Decrypt" if action == "s3:GetObject" else "kms:GenerateDataKey", key_arn)
        conditional = {"s3:if-none-match": p["IfNoneMatch"]} if "IfNoneMatch" in p else {}
        return [Request(action, f"arn:aws:s3:::{p['Bucket']}/{p['Key']}", context=conditional), key]
    if call.service == "sagemaker":
        if "ModelPackage" in op:
            resource = p.get("ModelPackageArn") or p["ModelPackageName"]
        else:
            kind, param = next((k, n) for suffix, k, n in SAGEMAKER_RESOURCES if op.endswith(suffix))
            resource = ARN.format(service="sagemaker", resource=f"{kind}/{p[param].lower()}")
        out = [Request(f"sagemaker:{op}", resource)]
        if "Tags" in p:
            out.append(Request("sagemaker:AddTags", resource))
        if "ExecutionRoleArn" in p:
            out.append(Request("iam:PassRole", p["ExecutionRoleArn"],
                               context={"iam:PassedToService": "sagemaker.amazonaws.com"}))
        return out
    raise AssertionError(f"{call.command}: no IAM mapping for {call.service} {op}: add it here")


def people_policies(template: dict, resolve) -> dict[str, list[dict]]:
    """Each people policy's document (by construct id: Deployer, RunUser, Approver), rendered with `resolve`."""
    return {lid.removeprefix("People")[:-8]: [json.loads(json.dumps(r["Properties"]["PolicyDocument"]),
                                                            object_hook=lambda d: _render(d, resolve))]
            for lid, r in template["Resources"].items()
            if r["Type"] == "AWS::IAM::ManagedPolicy" and lid.startswith("People")}


def _render(d: dict, resolve):
    if len(d) == 1 and next(iter(d)) in ("Ref", "Fn::GetAtt", "Fn::Join", "Fn::Sub"):
        return render(d, resolve)
    return d


def assert_people_may(synth, driver, calls: list[Call]) -> None:
    """Every recorded call is allowed by the policy its command's person holds (approve: Approver; the rest:
    RunUser). What lies outside is denied: tests/infra/test_people_policies.py."""
    template = synth.template

    def resolve(logical: str, attr: str | None) -> str:
        kind = template["Resources"][logical]["Type"]
        if kind == "AWS::StepFunctions::StateMachine":
            return driver.sm_arn.rsplit(":", 1)[-1] if attr == "Name" else driver.sm_arn
        if kind == "AWS::IAM::Role" and logical.startswith("ServingRole"):
            return driver.serving_role_arn
        return driver.resolve(logical, attr)

    policies = people_policies(template, resolve)
    key = driver.resolve("ArtifactsKeyA4B22E2B", "Arn")
    # A KMS key is used only as its key policy allows (AWS evaluates it beside the identity policy).
    key_policy = json.loads(json.dumps(template["Resources"]["ArtifactsKeyA4B22E2B"]["Properties"]["KeyPolicy"]),
                            object_hook=lambda d: _render(d, resolve))
    assert calls, "no call was recorded"
    for person, mine in (("Approver", [c for c in calls if c.command == "approve"]),
                         ("RunUser", [c for c in calls if c.command != "approve"])):
        requests = [r for c in mine for r in iam_requests(c, key)]
        for kms in (False, True):
            these = [r for r in requests if r.action.startswith("kms:") == kms]
            decisions = decide(policies[person], these, key_policy if kms else None)
            assert [(r.action, r.resource, d) for r, d in zip(these, decisions, strict=True) if d != "Allowed"] == \
                [], person
