"""Security and hygiene of the synthesized stack (issue #8, point 8), the canceller's rule and the freshness alarm."""

from __future__ import annotations

import json

from spotrun.seams import CHECKPOINT_OVERDUE_METRIC

STATE_MACHINE = "PipelineStateMachine1814BD05"


def _as_list(x):
    return x if isinstance(x, list) else [x]


def _statements(synth, prefix: str) -> list[dict]:
    return [s for lid, r in synth.resources("AWS::IAM::Policy").items() if lid.startswith(prefix)
            for s in r["Properties"]["PolicyDocument"]["Statement"]]


def _rules_targeting(synth, function_prefix: str) -> list[dict]:
    out = []
    for rule in synth.resources("AWS::Events::Rule").values():
        for target in rule["Properties"]["Targets"]:
            if function_prefix in json.dumps(target["Arn"]):
                out.append((rule, target))
    return out


def test_every_lambda_target_of_eventbridge_has_a_dead_letter_queue(synth):
    targets = _rules_targeting(synth, "InterruptionEventsRecorder") + _rules_targeting(synth, "PipelineCancelFn")
    assert len(targets) == 3  # interrupted, finished -> recorder; execution ended -> canceller
    queues = synth.resources("AWS::SQS::Queue")
    for _, target in targets:
        queue_id = target["DeadLetterConfig"]["Arn"]["Fn::GetAtt"][0]
        assert queues[queue_id]["Properties"]["SqsManagedSseEnabled"] is True
        assert target["RetryPolicy"]["MaximumRetryAttempts"] == 8


def test_the_recorder_may_only_put_items(synth):
    actions = {a for s in _statements(synth, "InterruptionEventsRecorderRole") for a in _as_list(s["Action"])}
    assert {a for a in actions if a.startswith("dynamodb:")} == {"dynamodb:PutItem"}


def test_service_principals_use_the_topic_key_only_for_this_account_and_its_alarms(synth):
    keys = [r for lid, r in synth.resources("AWS::KMS::Key").items() if lid.startswith("FailuresTopicKey")]
    assert len(keys) == 1
    for stmt in keys[0]["Properties"]["KeyPolicy"]["Statement"]:
        service = stmt.get("Principal", {}).get("Service")
        if service is None:
            continue
        assert service == "cloudwatch.amazonaws.com", stmt  # EventBridge no longer publishes failures
        assert stmt["Condition"]["StringEquals"]["aws:SourceAccount"] == {"Ref": "AWS::AccountId"}
        assert ":alarm:*" in json.dumps(stmt["Condition"]["ArnLike"]["aws:SourceArn"])
    for policy in synth.resources("AWS::SNS::TopicPolicy").values():
        for stmt in policy["Properties"]["PolicyDocument"]["Statement"]:
            assert "Service" not in stmt.get("Principal", {}) or "Condition" in stmt, stmt


def test_kms_grants_belong_to_the_execution_role_not_the_state_machine(synth):
    sm_actions = {a for s in _statements(synth, "PipelineStateMachineRole") for a in _as_list(s["Action"])}
    assert not any(a.startswith("kms:CreateGrant") for a in sm_actions)
    grants = [s for s in _statements(synth, "ExecutionRoleDefaultPolicy") if "kms:CreateGrant" in _as_list(s["Action"])]
    assert len(grants) == 1 and grants[0]["Condition"] == {"Bool": {"kms:GrantIsForAWSResource": "true"}}
    assert grants[0]["Resource"] == {"Fn::GetAtt": ["ArtifactsKeyA4B22E2B", "Arn"]}


def test_model_package_group_name_is_unique_to_the_stack_instance_and_retained(synth):
    group = synth.template["Resources"]["ModelPackageGroup"]
    assert group["DeletionPolicy"] == "Retain"
    name = group["Properties"]["ModelPackageGroupName"]["Fn::Join"]
    assert name[1][0] == "spotrun-dev-models" and "AWS::StackId" in json.dumps(name[1][1])


def test_an_execution_that_ends_early_invokes_the_canceller(synth):
    from moto.events.models import EventPattern

    (rule, target), = _rules_targeting(synth, "PipelineCancelFn")
    pattern = rule["Properties"]["EventPattern"]
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
    fn = synth.resources("AWS::Lambda::Function")[target["Arn"]["Fn::GetAtt"][0]]
    assert fn["Properties"]["Handler"] == "spotrun.handlers.cancel.handler"
    actions = {a for s in _statements(synth, "PipelineCancelFnRole") for a in _as_list(s["Action"])}
    assert {"sagemaker:StopTrainingJob", "sagemaker:ListTrainingJobs", "sagemaker:ListTags",
            "states:DescribeExecution"} <= actions


def test_no_function_is_invoked_asynchronously_without_an_on_failure_destination(synth):
    """Every EventBridge-targeted function (an asynchronous invoke) sends failed events to a queue."""
    configs = {c["Properties"]["FunctionName"]["Ref"]: c["Properties"]
               for c in synth.resources("AWS::Lambda::EventInvokeConfig").values()}
    targeted = {t["Arn"]["Fn::GetAtt"][0] for r in synth.resources("AWS::Events::Rule").values()
                for t in r["Properties"].get("Targets", []) if "Fn::GetAtt" in t["Arn"]}
    assert targeted and targeted <= set(configs), targeted - set(configs)
    for fn in targeted:
        assert configs[fn]["DestinationConfig"]["OnFailure"]["Destination"]["Fn::GetAtt"][1] == "Arn"
        assert configs[fn]["MaximumRetryAttempts"] == 2


def test_dead_letters_function_errors_and_failed_executions_alarm_to_the_failures_topic(synth):
    alarms = [a["Properties"] for a in synth.resources("AWS::CloudWatch::Alarm").values()]
    by_metric: dict[str, list[dict]] = {}
    for alarm in alarms:
        by_metric.setdefault(alarm.get("MetricName", ""), []).append(alarm)
    queues = set(synth.resources("AWS::SQS::Queue"))
    watched = {d["Value"]["Fn::GetAtt"][0] for a in by_metric["ApproximateNumberOfMessagesVisible"]
               for d in a["Dimensions"]}
    assert watched == queues  # every dead-letter and on-failure queue
    functions = set(synth.resources("AWS::Lambda::Function"))
    erroring = {d["Value"]["Ref"] for a in by_metric["Errors"] for d in a["Dimensions"]}
    assert {f for f in functions if not f.startswith("CustomResource") and "LogRetention" not in f} <= erroring
    assert len(by_metric["ExecutionsFailed"]) == 1
    for alarm in by_metric["ApproximateNumberOfMessagesVisible"] + by_metric["Errors"] + by_metric["ExecutionsFailed"]:
        assert alarm["AlarmActions"] == [{"Ref": "FailuresTopic8CFD5254"}] and alarm["Threshold"] == 1


def test_checkpoint_freshness_alarm_notifies_the_topic(synth):
    alarms = [a["Properties"] for a in synth.resources("AWS::CloudWatch::Alarm").values()
              if a["Properties"].get("MetricName") == CHECKPOINT_OVERDUE_METRIC]
    assert len(alarms) == 1
    alarm = alarms[0]
    assert alarm["Threshold"] == 1 and alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    assert alarm["AlarmActions"] == [{"Ref": "FailuresTopic8CFD5254"}]
    _, dash = synth.one("AWS::CloudWatch::Dashboard")
    assert "CheckpointAgeSeconds" in json.dumps(dash["Properties"]["DashboardBody"])


# ---- the serving role (spotrun deploy's endpoint models) ---------------------------------------------------------

ARTIFACT_BUCKET, ARTIFACT_KEY = "ArtifactsBucket88671897", "ArtifactsKeyA4B22E2B"


def _serving_role(synth) -> tuple[str, list[dict]]:
    from aws_cdk.assertions import Match, Template

    roles = Template.from_json(synth.template).find_resources("AWS::IAM::Role", {"Properties": {
        "AssumeRolePolicyDocument": {"Statement": [Match.object_like({
            "Principal": {"Service": "sagemaker.amazonaws.com"}})]},
        "Description": Match.string_like_regexp("endpoints")}})
    (logical, _), = roles.items()
    policies = [r["Properties"]["PolicyDocument"]["Statement"] for r in synth.resources("AWS::IAM::Policy").values()
                if {"Ref": logical} in r["Properties"]["Roles"]]
    return logical, [s for statements in policies for s in statements]


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


def test_serving_role_reads_models_and_cannot_write(synth):
    _, stmts = _serving_role(synth)
    assert all(s["Effect"] == "Allow" for s in stmts)
    s3 = [s for s in stmts if any(a.startswith("s3:") for a in _as_list(s["Action"]))]
    assert {a for s in s3 for a in _as_list(s["Action"])} == {"s3:GetObject", "s3:ListBucket"}
    gets = [r for s in s3 if "s3:GetObject" in _as_list(s["Action"]) for r in _as_list(s["Resource"])]
    prefixes = sorted(r["Fn::Join"][1][1] for r in gets)
    assert prefixes == ["/models/*", "/output/*"]
    assert all(r["Fn::Join"][1][0] == {"Fn::GetAtt": [ARTIFACT_BUCKET, "Arn"]} for r in gets)
    lists = [s for s in s3 if "s3:ListBucket" in _as_list(s["Action"])]
    assert sorted(p for s in lists for p in s["Condition"]["StringLike"]["s3:prefix"]) == ["models/*", "output/*"]
    kms = [s for s in stmts if any(a.startswith("kms:") for a in _as_list(s["Action"]))]
    assert {a for s in kms for a in _as_list(s["Action"])} == {"kms:Decrypt"}
    assert all(s["Resource"] == {"Fn::GetAtt": [ARTIFACT_KEY, "Arn"]} for s in kms)
    actions = {a for s in stmts for a in _as_list(s["Action"])}
    assert {a.split(":")[0] for a in actions} == {"s3", "kms", "ecr", "logs"}


def test_serving_role_pulls_only_the_registered_serving_image(synth, definition):
    _, stmts = _serving_role(synth)
    image = _registered_image(definition)  # what the model packages record (the AWS-owned TGI image)
    account, _, _, region, *_ = image.split("/")[0].split(".")
    repository = image.split("/", 1)[1].split(":")[0].split("@")[0]
    ecr = [s for s in stmts if any(a.startswith("ecr:") for a in _as_list(s["Action"]))]
    pull = [s for s in ecr if "ecr:BatchGetImage" in _as_list(s["Action"])]
    assert len(pull) == 1 and set(_as_list(pull[0]["Action"])) == {
        "ecr:BatchCheckLayerAvailability", "ecr:GetDownloadUrlForLayer", "ecr:BatchGetImage"}
    arn = pull[0]["Resource"]["Fn::Join"][1]
    assert arn == ["arn:", {"Ref": "AWS::Partition"}, f":ecr:{region}:{account}:repository/{repository}"]
    token = [s for s in ecr if s not in pull]
    assert [(_as_list(s["Action"]), s["Resource"]) for s in token] == [(["ecr:GetAuthorizationToken"], "*")]


def test_serving_role_writes_only_endpoint_logs(synth):
    _, stmts = _serving_role(synth)
    logs = [s for s in stmts if any(a.startswith("logs:") for a in _as_list(s["Action"]))]
    assert len(logs) == 1 and "logs:DeleteLogGroup" not in _as_list(logs[0]["Action"])
    assert json.dumps(logs[0]["Resource"]).endswith(':log-group:/aws/sagemaker/Endpoints/*"]]}')


def test_serving_role_is_the_stack_output_deploy_reads(synth):
    from aws_cdk.assertions import Template

    from spotrun.seams import StackOutput

    logical, _ = _serving_role(synth)
    Template.from_json(synth.template).has_output(StackOutput.SERVING_ROLE_ARN.value,
                                                  {"Value": {"Fn::GetAtt": [logical, "Arn"]}})


def test_serving_role_refuses_an_image_outside_ecr():
    import pytest

    from training_constructs.serving_role import ServingRoleProps

    with pytest.raises(ValueError, match=r"image_uri='ghcr.io/huggingface/text-generation-inference:3' is not an ECR"):
        ServingRoleProps(store=None, image_uri="ghcr.io/huggingface/text-generation-inference:3")
