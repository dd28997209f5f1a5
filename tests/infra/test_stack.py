"""Fine-grained assertions on the synthesized stack, one behaviour per test."""

from __future__ import annotations

import json

import pytest

from spotrun.seams import COMPLETED_METRIC_DEFINITION, METRIC_DEFINITIONS, StackOutput
from spotrun_trainer import metrics as trainer_metrics

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


def test_training_role_writes_only_checkpoints_and_output_and_cannot_read_or_delete_models(synth):
    stmts = statements(synth, "ExecutionRoleDefaultPolicy")
    assert sorted(_suffix(r) for r in _s3_object_resources(stmts, "s3:PutObject")) == ["/checkpoints/*", "/output/*"]
    # Registered model artifacts live under output/: only checkpoints may be deleted (SageMaker's sync does).
    assert sorted(_suffix(r) for r in _s3_object_resources(stmts, "s3:DeleteObject")) == ["/checkpoints/*"]
    # No job reads another run's registered model: output/ is write-only.
    assert sorted(_suffix(r) for r in _s3_object_resources(stmts, "s3:GetObject")) == [
        "/checkpoints/*", "/datasets/*", "/models/*"]
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
    assert all(p["detail"]["TrainingJobName"] == [{"prefix": "spotrun-dev-"}] for p in rules
               if p["source"] == ["aws.sagemaker"])


def test_a_failure_is_notified_once_by_the_state_machine_not_by_a_rule(synth, definition):
    for rule in synth.resources("AWS::Events::Rule").values():
        assert all(t["Arn"] != {"Ref": "FailuresTopic8CFD5254"} for t in rule["Properties"]["Targets"])
    notify = [n for n, s in definition["States"].items() if s.get("Resource", "").endswith(":sns:publish")]
    assert sorted(notify) == ["NotifyCostCap", "NotifyGateFailed", "NotifyInvalidRun", "NotifyOverBudget",
                              "NotifyPipelineError", "NotifyPreparationFailed", "NotifyTrainingFailed"]
    for name in notify:  # each ends the execution: one email per failure
        assert definition["States"][definition["States"][name]["Next"]]["Type"] == "Fail"


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
    assert "train:loss" in body and "train:val_loss" in body and "RunCostUSD" in body


def test_trainer_image_asset_is_built_from_training_image_with_the_sagemaker_base(synth):
    assets = json.loads(next((synth.outdir / "assembly-dev").glob("*.assets.json")).read_text())
    images = list(assets["dockerImages"].values())
    assert len(images) == 1
    source = images[0]["source"]
    staged = synth.outdir / "assembly-dev" / source["directory"]
    staged = staged if staged.exists() else synth.outdir / source["directory"]
    assert source["dockerFile"] == "training_image/Dockerfile" and (staged / source["dockerFile"]).exists()
    # The context is the repository root reduced to what the image installs: the trainer and spotrun (its seams).
    assert (staged / "spotrun" / "seams.py").exists() and (staged / "pyproject.toml").exists()
    assert not (staged / "tests").exists() and not (staged / "node_modules").exists()
    assert source["dockerBuildArgs"]["BASE_IMAGE"] == \
        "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.10-gpu-py313"
    assert source["platform"] == "linux/amd64"


def test_metric_definitions_are_the_seams_and_match_the_trainers_line(definition):
    import re

    spot = definition["States"]["CreateSpotTrainingJob"]["Parameters"]
    # The trainer's metric lines, and its completion line (what tells a finished run from a segment's end).
    assert spot["AlgorithmSpecification"]["MetricDefinitions"] == METRIC_DEFINITIONS + [COMPLETED_METRIC_DEFINITION]
    line = trainer_metrics.format_line(7, loss=2.5, lr=1e-4, grad_norm=0.5, tokens_per_s=100, mfu=0.3, mem_gb=1.0)
    eval_line = trainer_metrics.format_eval_line(7, val_loss=2.75, val_ppl=15.6, val_tokens=640, eval_s=0.5)
    done = "run_completed step=7 final_loss=2.5000 val_loss=2.61 base_val_loss=3.4"  # as train.py prints it
    parsed = {**trainer_metrics.parse_line(line), **trainer_metrics.parse_eval_line(eval_line),
              "exported_val_loss": 2.61, "base_val_loss": 3.4}
    for d in METRIC_DEFINITIONS:
        name = d["Name"].removeprefix("train:")
        ours = eval_line if name.startswith("val_") else done if name in parsed and "_val_" in name else line
        value = float(re.search(d["Regex"], ours).group(1))
        assert value == pytest.approx(parsed[name], rel=1e-3)
        for other in {line, eval_line, done} - {ours}:  # `loss` is not read out of `val_loss`, nor the reverse
            assert re.search(d["Regex"], other) is None, (name, other)


@pytest.mark.parametrize("state, spot", [("CreateSpotTrainingJob", True), ("CreateOnDemandTrainingJob", False)])
def test_training_job_parameters(definition, state, spot):
    params = definition["States"][state]["Parameters"]
    assert params["EnableManagedSpotTraining"] is spot
    stopping = params["StoppingCondition"]
    # Each segment's limits come from the guard: MaxRuntime is what the cap still allows at on-demand rates.
    assert stopping["MaxRuntimeInSeconds.$"] == "$.guard.max_runtime_seconds"
    assert stopping.get("MaxWaitTimeInSeconds.$", "$.guard.max_wait_seconds") == "$.guard.max_wait_seconds"
    assert params["EnableNetworkIsolation"] is True
    assert ("MaxWaitTimeInSeconds.$" in stopping) is spot
    # Built by the estimate (VolumeKmsKeyId only without local storage; the warm pool only on-demand).
    assert params["ResourceConfig.$"] == ("$.plan.resource_config_spot" if spot else "$.plan.resource_config_on_demand")
    assert params["TrainingJobName.$"] == "$.guard.job_name"
    assert params["CheckpointConfig"] == {"S3Uri.$": "$.plan.checkpoint_s3_uri", "LocalPath": "/opt/ml/checkpoints"}
    assert params["RetryStrategy"] == {"MaximumRetryAttempts": 3}
    assert params["AlgorithmSpecification"]["TrainingInputMode"] == "FastFile"
    assert params["Tags.$"] == "$.plan.tags" and params["HyperParameters.$"] == "$.guard.hyperparameters"
    assert params["OutputDataConfig"]["S3OutputPath"] == "s3://ref-artifactsbucket88671897/output/"


@pytest.mark.parametrize("state", ["CreateSpotTrainingJob", "CreateOnDemandTrainingJob"])
def test_a_retried_create_that_finds_its_job_continues_polling(definition, state):
    catches = definition["States"][state]["Catch"]
    assert catches[0] == {"ErrorEquals": ["SageMaker.ResourceInUseException"], "ResultPath": None,
                          "Next": "WaitForJob"}
    assert catches[-1]["ErrorEquals"] == ["States.ALL"] and catches[-1]["Next"] == "JobToStop"


def test_the_error_path_stops_the_job_before_failing(definition):
    states = definition["States"]
    choice = states["JobToStop"]
    assert choice["Choices"] == [{"Variable": "$.guard.job_name", "IsPresent": True, "Next": "StopJobOnError"}]
    assert choice["Default"] == "NotifyPipelineError"
    stop = states["StopJobOnError"]
    assert stop["Resource"].endswith(":sagemaker:stopTrainingJob") and stop["Next"] == "NotifyPipelineError"
    assert stop["Retry"][0]["MaxAttempts"] >= 5 and stop["Catch"][0]["Next"] == "NotifyPipelineError"


def test_every_segment_after_the_first_is_created_by_the_guards_choice_of_capacity(definition):
    states = definition["States"]
    choices = {c.get("StringEquals"): c["Next"] for c in states["NextAction"]["Choices"] if "StringEquals" in c}
    either = [c for c in states["NextAction"]["Choices"] if "Or" in c]
    assert {c["StringEquals"] for c in either[0]["Or"]} == {"segment", "fallback"} and \
        either[0]["Next"] == "NextSegment"
    assert choices["wait"] == "WaitForJob" and choices["completed"] == "CreateModelPackage"
    assert states["NextSegment"]["Choices"][0]["Variable"] == "$.guard.spot"
    assert states["CreateModelPackage"]["Parameters"]["ModelApprovalStatus"] == "PendingManualApproval"


def test_named_failures_before_anything_is_created(definition):
    choice = definition["States"]["EstimateOk"]
    targets = {c["StringEquals"]: c["Next"] for c in choice["Choices"]}
    # Prepare: raw data.source is prepared first (a processing job; the estimate runs again after it).
    assert targets == {"InvalidRun": "NotifyInvalidRun", "OverBudget": "NotifyOverBudget",
                       "Prepare": "CreatePreparationJob"}
    assert definition["States"]["EstimatePrepared"]["Next"] == "EstimateOk"
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
    # <base>-<8 characters of the stack id>: a redeploy after destroy, or another stage, gets its own group
    group = outputs["ModelPackageGroupName"]["Value"]["Fn::Join"]
    assert group[0] == "-" and group[1][0] == "spotrun-dev-models"
    assert "AWS::StackId" in json.dumps(group[1][1])
    assert {"FailuresTopicArn", "DashboardName"} <= outputs.keys()


def test_estimate_settings_output_renders_to_the_estimate_functions_environment(synth):
    """`spotrun start` validates with this output: it must be exactly what the estimate Lambda reads."""
    from spotrun.handlers.estimate import PipelineSettings
    from tests.infra.render import placeholder, render

    value = synth.template["Outputs"][StackOutput.ESTIMATE_SETTINGS]["Value"]
    fn = next(r for k, r in synth.resources("AWS::Lambda::Function").items() if k.startswith("PipelineEstimateFn"))
    env = {k: render(v, placeholder) for k, v in fn["Properties"]["Environment"]["Variables"].items()}
    settings = json.loads(render(value, placeholder))
    assert settings == env
    assert PipelineSettings.from_env(settings).job_prefix == "spotrun-dev-"
