"""Security and hygiene of the synthesized stack (issue #8, point 8), the canceller's rule and the freshness alarm."""

from __future__ import annotations

import copy
import json

from aws_cdk.assertions import Capture, Match

from spotrun.seams import CHECKPOINT_OVERDUE_METRIC
from tests.infra.statements import actions, as_list, role_named, role_statements

STATE_MACHINE, TOPIC = "PipelineStateMachine1814BD05", "FailuresTopic8CFD5254"


def _rules_targeting(template, function_prefix: str) -> list[tuple[dict, dict]]:
    """(rule, target) for each EventBridge rule target that invokes a function whose logical ID starts with the
    prefix."""
    arn = {"Fn::GetAtt": [Match.string_like_regexp(f"^{function_prefix}"), "Arn"]}
    rules = template.find_resources("AWS::Events::Rule", {"Properties": {"Targets": Match.array_with([
        Match.object_like({"Arn": arn})])}})
    return [(rule, target) for rule in rules.values() for target in rule["Properties"]["Targets"]
            if target["Arn"]["Fn::GetAtt"][0].startswith(function_prefix)]


def test_every_lambda_target_of_eventbridge_has_a_dead_letter_queue(template):
    targets = _rules_targeting(template, "InterruptionEventsRecorder") + _rules_targeting(template, "PipelineCancelFn")
    assert len(targets) == 3  # interrupted, finished -> recorder; execution ended -> canceller
    encrypted = template.find_resources("AWS::SQS::Queue", {"Properties": {"SqsManagedSseEnabled": True}})
    for _, target in targets:
        assert target["DeadLetterConfig"]["Arn"]["Fn::GetAtt"][0] in encrypted
        assert target["RetryPolicy"] == {"MaximumRetryAttempts": 8}


def test_the_recorder_may_only_put_items(template):
    granted = actions(role_statements(template, role_named(template, "InterruptionEventsRecorderRole")))
    assert {a for a in granted if a.startswith("dynamodb:")} == {"dynamodb:PutItem"}


def test_service_principals_use_the_topic_key_only_for_this_account_and_its_alarms(template):
    keys = [r for lid, r in template.find_resources("AWS::KMS::Key").items() if lid.startswith("FailuresTopicKey")]
    assert len(keys) == 1
    for stmt in keys[0]["Properties"]["KeyPolicy"]["Statement"]:
        service = stmt.get("Principal", {}).get("Service")
        if service is None:
            continue
        assert service == "cloudwatch.amazonaws.com", stmt  # EventBridge no longer publishes failures
        assert stmt["Condition"]["StringEquals"]["aws:SourceAccount"] == {"Ref": "AWS::AccountId"}
        assert ":alarm:*" in json.dumps(stmt["Condition"]["ArnLike"]["aws:SourceArn"])
    for policy in template.find_resources("AWS::SNS::TopicPolicy").values():
        for stmt in policy["Properties"]["PolicyDocument"]["Statement"]:
            assert "Service" not in stmt.get("Principal", {}) or "Condition" in stmt, stmt


def test_kms_grants_belong_to_the_execution_role_not_the_state_machine(template):
    sm_actions = actions(role_statements(template, role_named(template, "PipelineStateMachineRole")))
    assert not any(a.startswith("kms:CreateGrant") for a in sm_actions)
    grants = [s for s in role_statements(template, role_named(template, "ExecutionRole"))
              if "kms:CreateGrant" in as_list(s["Action"])]
    assert len(grants) == 1 and grants[0]["Condition"] == {"Bool": {"kms:GrantIsForAWSResource": "true"}}
    assert grants[0]["Resource"] == {"Fn::GetAtt": ["ArtifactsKeyA4B22E2B", "Arn"]}


def test_model_package_group_name_is_unique_to_the_stack_instance_and_retained(template):
    stack_part = Capture()
    found = template.find_resources("AWS::SageMaker::ModelPackageGroup", {"DeletionPolicy": "Retain", "Properties": {
        "ModelPackageGroupName": {"Fn::Join": ["-", ["spotrun-dev-models", stack_part]]}}})
    assert list(found) == ["ModelPackageGroup"]
    assert "AWS::StackId" in json.dumps(stack_part.as_object())


def test_an_execution_that_ends_early_invokes_the_canceller(template):
    from moto.events.models import EventPattern

    (rule, target), = _rules_targeting(template, "PipelineCancelFn")
    pattern = copy.deepcopy(rule["Properties"]["EventPattern"])
    assert pattern["detail"]["stateMachineArn"] == [{"Ref": STATE_MACHINE}]
    pattern["detail"]["stateMachineArn"] = ["arn:aws:states:us-east-1:123456789012:stateMachine:sm"]
    matcher = EventPattern.load(json.dumps(pattern))

    def event(status: str) -> dict:  # as documented for "Step Functions Execution Status Change"
        return {"version": "0", "id": "1", "detail-type": "Step Functions Execution Status Change",
                "source": "aws.states", "account": "123456789012", "time": "2026-11-30T00:00:00Z",
                "region": "us-east-1", "resources": ["arn:aws:states:us-east-1:123456789012:execution:sm:e"],
                "detail": {"executionArn": "arn:aws:states:us-east-1:123456789012:execution:sm:e",
                           "stateMachineArn": "arn:aws:states:us-east-1:123456789012:stateMachine:sm",
                           "name": "e", "status": status, "startDate": 1764460800000, "stopDate": 1764464400000,
                           "input": "{}", "output": None}}

    for status in ("ABORTED", "FAILED", "TIMED_OUT"):
        assert matcher.matches_event(event(status)), status
    for status in ("SUCCEEDED", "RUNNING"):
        assert not matcher.matches_event(event(status)), status
    fn = target["Arn"]["Fn::GetAtt"][0]
    assert fn in template.find_resources("AWS::Lambda::Function", {"Properties": {
        "Handler": "spotrun.handlers.cancel.handler"}})
    granted = actions(role_statements(template, role_named(template, "PipelineCancelFnRole")))
    assert {"sagemaker:StopTrainingJob", "sagemaker:ListTrainingJobs", "sagemaker:ListTags",
            "states:DescribeExecution"} <= granted


def test_no_function_is_invoked_asynchronously_without_an_on_failure_destination(template):
    """Every EventBridge-targeted function (an asynchronous invoke) sends failed events to a queue."""
    configs = {c["Properties"]["FunctionName"]["Ref"]: c["Properties"]
               for c in template.find_resources("AWS::Lambda::EventInvokeConfig").values()}
    targeted = {t["Arn"]["Fn::GetAtt"][0] for r in template.find_resources("AWS::Events::Rule").values()
                for t in r["Properties"].get("Targets", []) if "Fn::GetAtt" in t["Arn"]}
    assert targeted and targeted <= set(configs), targeted - set(configs)
    for fn in targeted:
        template.has_resource_properties("AWS::Lambda::EventInvokeConfig", {
            "FunctionName": {"Ref": fn}, "MaximumRetryAttempts": 2,
            "DestinationConfig": {"OnFailure": {"Destination": {"Fn::GetAtt": [Match.any_value(), "Arn"]}}}})


def _alarms_on(template, metric: str) -> list[dict]:
    return [a["Properties"] for a in template.find_resources("AWS::CloudWatch::Alarm", {"Properties": {
        "MetricName": metric}}).values()]


def test_dead_letters_function_errors_and_failed_executions_alarm_to_the_failures_topic(template):
    queued, errors, failed = (_alarms_on(template, m) for m in (
        "ApproximateNumberOfMessagesVisible", "Errors", "ExecutionsFailed"))
    watched = {d["Value"]["Fn::GetAtt"][0] for a in queued for d in a["Dimensions"]}
    assert watched == set(template.find_resources("AWS::SQS::Queue"))  # every dead-letter and on-failure queue
    erroring = {d["Value"]["Ref"] for a in errors for d in a["Dimensions"]}
    functions = template.find_resources("AWS::Lambda::Function")
    assert {f for f in functions if not f.startswith("CustomResource") and "LogRetention" not in f} <= erroring
    assert len(failed) == 1
    for alarm in queued + errors + failed:
        assert alarm["AlarmActions"] == [{"Ref": TOPIC}] and alarm["Threshold"] == 1


def test_checkpoint_freshness_alarm_notifies_the_topic(template):
    template.resource_properties_count_is("AWS::CloudWatch::Alarm", {"MetricName": CHECKPOINT_OVERDUE_METRIC}, 1)
    template.has_resource_properties("AWS::CloudWatch::Alarm", {
        "MetricName": CHECKPOINT_OVERDUE_METRIC, "Threshold": 1, "ComparisonOperator": "GreaterThanOrEqualToThreshold",
        "AlarmActions": [{"Ref": TOPIC}]})
    body = Capture()
    template.has_resource_properties("AWS::CloudWatch::Dashboard", {"DashboardBody": body})
    assert "CheckpointAgeSeconds" in json.dumps(body.as_object())


# ---- the serving role (spotrun deploy's endpoint models) ---------------------------------------------------------

ARTIFACT_BUCKET, ARTIFACT_KEY = "ArtifactsBucket88671897", "ArtifactsKeyA4B22E2B"


def _serving_role(template) -> tuple[str, list[dict]]:
    roles = template.find_resources("AWS::IAM::Role", {"Properties": {
        "AssumeRolePolicyDocument": {"Statement": [Match.object_like({
            "Principal": {"Service": "sagemaker.amazonaws.com"}})]},
        "Description": Match.string_like_regexp("endpoints")}})
    (logical, _), = roles.items()
    return logical, role_statements(template, logical)


def _registered_image(definition) -> str:
    found = []

    def walk(node):
        if isinstance(node, dict):
            found.extend(c["Image"] for c in node.get("InferenceSpecification", {}).get("Containers", []))
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(definition)
    assert len(set(found)) == 1, found
    return found[0]


def test_serving_role_reads_models_and_cannot_write(template):
    _, stmts = _serving_role(template)
    assert all(s["Effect"] == "Allow" for s in stmts)
    s3 = [s for s in stmts if any(a.startswith("s3:") for a in as_list(s["Action"]))]
    assert {a for s in s3 for a in as_list(s["Action"])} == {"s3:GetObject", "s3:ListBucket"}
    gets = [r for s in s3 if "s3:GetObject" in as_list(s["Action"]) for r in as_list(s["Resource"])]
    prefixes = sorted(r["Fn::Join"][1][1] for r in gets)
    assert prefixes == ["/models/*", "/output/*"]
    assert all(r["Fn::Join"][1][0] == {"Fn::GetAtt": [ARTIFACT_BUCKET, "Arn"]} for r in gets)
    lists = [s for s in s3 if "s3:ListBucket" in as_list(s["Action"])]
    assert sorted(p for s in lists for p in s["Condition"]["StringLike"]["s3:prefix"]) == ["models/*", "output/*"]
    kms = [s for s in stmts if any(a.startswith("kms:") for a in as_list(s["Action"]))]
    assert {a for s in kms for a in as_list(s["Action"])} == {"kms:Decrypt"}
    assert all(s["Resource"] == {"Fn::GetAtt": [ARTIFACT_KEY, "Arn"]} for s in kms)
    assert {a.split(":")[0] for a in actions(stmts)} == {"s3", "kms", "ecr", "logs"}


def test_serving_role_pulls_only_the_registered_serving_image(template, definition):
    _, stmts = _serving_role(template)
    image = _registered_image(definition)  # what the model packages record (the AWS-owned TGI image)
    account, _, _, region, *_ = image.split("/")[0].split(".")
    repository = image.split("/", 1)[1].split(":")[0].split("@")[0]
    ecr = [s for s in stmts if any(a.startswith("ecr:") for a in as_list(s["Action"]))]
    pull = [s for s in ecr if "ecr:BatchGetImage" in as_list(s["Action"])]
    assert len(pull) == 1 and set(as_list(pull[0]["Action"])) == {
        "ecr:BatchCheckLayerAvailability", "ecr:GetDownloadUrlForLayer", "ecr:BatchGetImage"}
    arn = pull[0]["Resource"]["Fn::Join"][1]
    assert arn == ["arn:", {"Ref": "AWS::Partition"}, f":ecr:{region}:{account}:repository/{repository}"]
    token = [s for s in ecr if s not in pull]
    assert [(as_list(s["Action"]), s["Resource"]) for s in token] == [(["ecr:GetAuthorizationToken"], "*")]


def test_serving_role_writes_only_endpoint_logs(template):
    _, stmts = _serving_role(template)
    logs = [s for s in stmts if any(a.startswith("logs:") for a in as_list(s["Action"]))]
    assert len(logs) == 1 and "logs:DeleteLogGroup" not in as_list(logs[0]["Action"])
    assert json.dumps(logs[0]["Resource"]).endswith(':log-group:/aws/sagemaker/Endpoints/*"]]}')


def test_serving_role_is_the_stack_output_deploy_reads(template):
    from spotrun.seams import StackOutput

    logical, _ = _serving_role(template)
    template.has_output(StackOutput.SERVING_ROLE_ARN.value, {"Value": {"Fn::GetAtt": [logical, "Arn"]}})


def test_serving_role_refuses_an_image_outside_ecr():
    import pytest

    from training_constructs.serving_role import ServingRoleProps

    with pytest.raises(ValueError, match=r"image_uri='ghcr.io/huggingface/text-generation-inference:3' is not an ECR"):
        ServingRoleProps(store=None, image_uri="ghcr.io/huggingface/text-generation-inference:3")
