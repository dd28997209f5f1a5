"""Fine-grained assertions on the synthesized stack, one behaviour per test."""

from __future__ import annotations

import json

import pytest

from spotrun_trainer.metrics import METRIC_DEFINITIONS

BUCKET, LOG_BUCKET, KEY = "ArtifactsBucket88671897", "ArtifactsAccessLogs4D97777C", "ArtifactsKeyA4B22E2B"


def statements(synth, policy_prefix: str) -> list[dict]:
    out = []
    for lid, res in synth.resources("AWS::IAM::Policy").items():
        if lid.startswith(policy_prefix):
            out.extend(res["Properties"]["PolicyDocument"]["Statement"])
    return out


def as_list(x):
    return x if isinstance(x, list) else [x]


def test_bucket_policy_denies_requests_without_tls(synth):
    policy = next(r for r in synth.resources("AWS::S3::BucketPolicy").values()
                  if r["Properties"]["Bucket"] == {"Ref": BUCKET})
    deny = [s for s in policy["Properties"]["PolicyDocument"]["Statement"] if s["Effect"] == "Deny"]
    assert any(s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}} and s["Action"] == "s3:*" for s in deny)


def test_bucket_is_kms_encrypted_versioned_private_logged_and_retained(synth):
    bucket = synth.template["Resources"][BUCKET]
    props = bucket["Properties"]
    sse = props["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]["ServerSideEncryptionByDefault"]
    assert sse == {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": {"Fn::GetAtt": [KEY, "Arn"]}}
    assert props["VersioningConfiguration"] == {"Status": "Enabled"}
    assert all(props["PublicAccessBlockConfiguration"][k] for k in
               ("BlockPublicAcls", "BlockPublicPolicy", "IgnorePublicAcls", "RestrictPublicBuckets"))
    assert props["LoggingConfiguration"]["DestinationBucketName"] == {"Ref": LOG_BUCKET}
    assert bucket["DeletionPolicy"] == bucket["UpdateReplacePolicy"] == "Retain"
    assert synth.template["Resources"][KEY]["Properties"]["EnableKeyRotation"] is True


def test_lifecycle_aborts_multipart_expires_noncurrent_versions_and_old_checkpoints(synth):
    rules = {r["Id"]: r for r in synth.template["Resources"][BUCKET]["Properties"]["LifecycleConfiguration"]["Rules"]}
    assert rules["abort-incomplete-multipart"]["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 1}
    assert rules["expire-noncurrent"]["NoncurrentVersionExpiration"] == {"NoncurrentDays": 7}
    assert rules["expire-checkpoints"]["Prefix"] == "checkpoints/"
    assert rules["expire-checkpoints"]["ExpirationInDays"] == 30


def _s3_object_resources(stmts, action):
    out = []
    for s in stmts:
        if s["Effect"] == "Allow" and action in as_list(s["Action"]):
            out.extend(as_list(s["Resource"]))
    return out


def _suffix(resource) -> str:
    return resource["Fn::Join"][1][-1] if isinstance(resource, dict) else resource


def test_training_role_writes_only_checkpoints_and_output(synth):
    stmts = statements(synth, "ExecutionRoleDefaultPolicy")
    for action in ("s3:PutObject", "s3:DeleteObject"):
        assert sorted(_suffix(r) for r in _s3_object_resources(stmts, action)) == ["/checkpoints/*", "/output/*"]
    assert sorted(_suffix(r) for r in _s3_object_resources(stmts, "s3:GetObject")) == [
        "/checkpoints/*", "/datasets/*", "/models/*", "/output/*"]
    assert not any(a.startswith("s3:") and "*" in a for s in stmts for a in as_list(s["Action"]))


def test_training_role_has_no_managed_policies_and_trusts_only_sagemaker(synth):
    role = synth.template["Resources"]["ExecutionRoleCDF74862"]["Properties"]
    assert "ManagedPolicyArns" not in role
    principals = [s["Principal"] for s in role["AssumeRolePolicyDocument"]["Statement"]]
    assert principals == [{"Service": "sagemaker.amazonaws.com"}]
    stmts = statements(synth, "ExecutionRoleDefaultPolicy")
    metrics = [s for s in stmts if "cloudwatch:PutMetricData" in as_list(s["Action"])]
    assert metrics and metrics[0]["Condition"] == {"StringLike": {"cloudwatch:namespace": "/aws/sagemaker/*"}}


def test_no_lambda_uses_an_aws_managed_policy(synth):
    for lid, role in synth.resources("AWS::IAM::Role").items():
        assert "ManagedPolicyArns" not in role["Properties"], lid


def test_interruption_rule_matches_only_this_stages_interrupted_jobs(synth):
    rules = [r["Properties"]["EventPattern"] for r in synth.resources("AWS::Events::Rule").values()]
    interrupted = [p for p in rules if p["detail"].get("SecondaryStatus") == ["Interrupted"]]
    assert len(interrupted) == 1
    assert interrupted[0]["source"] == ["aws.sagemaker"]
    assert interrupted[0]["detail-type"] == ["SageMaker Training Job State Change"]
    assert interrupted[0]["detail"]["TrainingJobName"] == [{"prefix": "spotrun-dev-"}]
    assert all(p["detail"]["TrainingJobName"] == [{"prefix": "spotrun-dev-"}] for p in rules)


def test_failed_and_stopped_jobs_notify_the_topic(synth):
    rule = next(r for r in synth.resources("AWS::Events::Rule").values()
                if r["Properties"]["EventPattern"]["detail"].get("TrainingJobStatus") == ["Failed", "Stopped"])
    assert rule["Properties"]["Targets"][0]["Arn"] == {"Ref": "FailuresTopic8CFD5254"}


def test_interruptions_table_has_point_in_time_recovery_and_is_retained(synth):
    lid, table = synth.one("AWS::DynamoDB::GlobalTable")
    assert table["Properties"]["Replicas"][0]["PointInTimeRecoverySpecification"] == {
        "PointInTimeRecoveryEnabled": True}
    assert table["DeletionPolicy"] == "Retain"


def test_budget_is_monthly_on_the_project_tag_with_actual_and_forecast_alerts(synth):
    _, budget = synth.one("AWS::Budgets::Budget")
    data = budget["Properties"]["Budget"]
    assert data["TimeUnit"] == "MONTHLY" and data["BudgetType"] == "COST"
    assert data["CostFilters"] == {"TagKeyValue": ["user:project$spotrun"]}
    kinds = {n["Notification"]["NotificationType"] for n in budget["Properties"]["NotificationsWithSubscribers"]}
    assert kinds == {"ACTUAL", "FORECASTED"}


def test_cost_allocation_tags_are_on_every_taggable_resource(synth):
    # Which types take tags, and in which property, comes from CloudFormation's own resource schemas (as shipped
    # with cfn-lint), not from the template: an untagged resource of a taggable type must fail here.
    from cfnlint.schema import PROVIDER_SCHEMA_MANAGER

    checked = []
    for lid, res in synth.template["Resources"].items():
        if res["Type"].startswith("Custom::"):
            continue
        tagging = PROVIDER_SCHEMA_MANAGER.get_resource_schema("us-east-1", res["Type"]).schema.get("tagging", {})
        if not tagging.get("taggable") or not tagging.get("tagProperty", "").startswith("/properties/"):
            continue
        prop = tagging["tagProperty"].removeprefix("/properties/")
        tags = res.get("Properties", {}).get(prop)
        assert tags, f"{lid} ({res['Type']}) is taggable ({prop}) but has no tags"
        pairs = ({t["Key"]: t["Value"] for t in tags} if isinstance(tags, list) else tags)
        assert pairs.get("project") == "spotrun" and pairs.get("cost-center") == "ml-platform", (lid, pairs)
        checked.append(res["Type"])
    assert {"AWS::S3::Bucket", "AWS::Lambda::Function", "AWS::StepFunctions::StateMachine"} <= set(checked)


def test_dashboard_shows_runs_interruptions_loss_throughput_and_cost(synth):
    _, dash = synth.one("AWS::CloudWatch::Dashboard")
    body = json.dumps(dash["Properties"]["DashboardBody"])
    for title in ("Runs", "Spot interruptions", "Training loss", "Throughput", "Run cost"):
        assert title in body
    assert "train:loss" in body and "RunCostUSD" in body


def test_trainer_image_asset_is_built_from_training_image_with_the_sagemaker_base(synth):
    assets = json.loads(next((synth.outdir / "assembly-dev").glob("*.assets.json")).read_text())
    images = list(assets["dockerImages"].values())
    assert len(images) == 1
    source = images[0]["source"]
    assert (synth.outdir / "assembly-dev" / source["directory"] / "Dockerfile").exists() or \
        (synth.outdir / source["directory"] / "Dockerfile").exists()
    assert source["dockerBuildArgs"]["BASE_IMAGE"] == \
        "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.10-gpu-py313"
    assert source["platform"] == "linux/amd64"


def test_metric_definitions_come_from_the_trainer(definition):
    spot = definition["States"]["CreateSpotTrainingJob"]["Parameters"]
    assert spot["AlgorithmSpecification"]["MetricDefinitions"] == METRIC_DEFINITIONS


@pytest.mark.parametrize("state, spot", [("CreateSpotTrainingJob", True), ("CreateOnDemandTrainingJob", False)])
def test_training_job_parameters(definition, state, spot):
    params = definition["States"][state]["Parameters"]
    assert params["EnableManagedSpotTraining"] is spot
    stopping = params["StoppingCondition"]
    assert stopping["MaxRuntimeInSeconds.$"] == "$.plan.max_runtime_seconds"
    assert ("MaxWaitTimeInSeconds.$" in stopping) is spot
    assert ("KeepAlivePeriodInSeconds.$" in params["ResourceConfig"]) is not spot  # warm pools: on-demand only
    assert params["TrainingJobName.$"] == "$.guard.job_name"
    ckpt = params["CheckpointConfig"]
    assert ckpt["LocalPath"] == "/opt/ml/checkpoints"
    assert ckpt["S3Uri.$"] == "States.Format('s3://ref-artifactsbucket88671897/checkpoints/{}/', $.plan.run_name)"
    assert params["AlgorithmSpecification"]["TrainingInputMode"] == "FastFile"
    assert params["Tags.$"] == "$.plan.tags" and params["HyperParameters.$"] == "$.plan.hyperparameters"
    assert params["OutputDataConfig"]["S3OutputPath"] == "s3://ref-artifactsbucket88671897/output/"


def test_named_failures_before_anything_is_created(definition):
    choice = definition["States"]["EstimateOk"]
    targets = {c["StringEquals"]: c["Next"] for c in choice["Choices"]}
    assert targets == {"InvalidRun": "NotifyInvalidRun", "OverBudget": "NotifyOverBudget"}
    assert definition["States"]["InvalidRun"] == {"Type": "Fail", "Error": "InvalidRun", "CausePath": "$.plan.message"}
    assert definition["States"]["OverBudget"]["Error"] == "OverBudget"
    assert choice["Default"] == "InitGuard"
    assert definition["States"]["InitGuard"]["Next"] == "SpotOrOnDemand"
    spot_or_not = definition["States"]["SpotOrOnDemand"]
    assert spot_or_not["Choices"] == [{"Variable": "$.plan.spot", "BooleanEquals": True,
                                       "Next": "CreateSpotTrainingJob"}]
    assert spot_or_not["Default"] == "CreateOnDemandTrainingJob"


def test_outputs_tell_users_where_to_upload_and_what_to_start(synth):
    outputs = synth.template["Outputs"]
    assert outputs["ArtifactBucket"]["Value"] == {"Ref": BUCKET}
    assert outputs["StateMachineArn"]["Value"] == {"Ref": "PipelineStateMachine1814BD05"}
    assert outputs["ModelPackageGroupName"]["Value"] == "spotrun-models"
    assert {"FailuresTopicArn", "DashboardName"} <= outputs.keys()
