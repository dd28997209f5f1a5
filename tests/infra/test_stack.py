"""Fine-grained assertions on the synthesized stack, one behaviour per test."""

from __future__ import annotations

import json

import pytest
from aws_cdk.assertions import Capture, Match

from spotrun import seams
from spotrun.seams import COMPLETED_METRIC_DEFINITION, METRIC_DEFINITIONS, StackOutput
from tests.infra.statements import actions, as_list, role_statements

BUCKET, LOG_BUCKET, KEY = "ArtifactsBucket88671897", "ArtifactsAccessLogs4D97777C", "ArtifactsKeyA4B22E2B"
EXECUTION_ROLE, TOPIC = "ExecutionRoleCDF74862", "FailuresTopic8CFD5254"


def test_bucket_policy_denies_requests_without_tls(template):
    template.has_resource_properties("AWS::S3::BucketPolicy", {
        "Bucket": {"Ref": BUCKET},
        "PolicyDocument": {"Statement": Match.array_with([Match.object_like({
            "Effect": "Deny", "Action": "s3:*",
            "Condition": Match.exact({"Bool": {"aws:SecureTransport": "false"}})})])},
    })


def test_bucket_is_kms_encrypted_versioned_private_logged_and_retained(template):
    found = template.find_resources("AWS::S3::Bucket", {
        "DeletionPolicy": "Retain", "UpdateReplacePolicy": "Retain",
        "Properties": {
            "BucketEncryption": {"ServerSideEncryptionConfiguration": [{"ServerSideEncryptionByDefault": Match.exact(
                {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": {"Fn::GetAtt": [KEY, "Arn"]}})}]},
            "VersioningConfiguration": Match.exact({"Status": "Enabled"}),
            "PublicAccessBlockConfiguration": {k: True for k in (
                "BlockPublicAcls", "BlockPublicPolicy", "IgnorePublicAcls", "RestrictPublicBuckets")},
            "LoggingConfiguration": {"DestinationBucketName": {"Ref": LOG_BUCKET}},
        }})
    assert list(found) == [BUCKET]
    assert KEY in template.find_resources("AWS::KMS::Key", {"Properties": {"EnableKeyRotation": True}})


@pytest.mark.parametrize("rule", [
    {"Id": "abort-incomplete-multipart", "AbortIncompleteMultipartUpload": Match.exact({"DaysAfterInitiation": 1})},
    {"Id": "expire-noncurrent", "NoncurrentVersionExpiration": Match.exact({"NoncurrentDays": 7})},
    {"Id": "expire-checkpoints", "Prefix": "checkpoints/", "ExpirationInDays": 30},
])
def test_lifecycle_aborts_multipart_expires_noncurrent_versions_and_old_checkpoints(template, rule):
    found = template.find_resources("AWS::S3::Bucket", {"Properties": {"LifecycleConfiguration": {
        "Rules": Match.array_with([Match.object_like(rule)])}}})
    assert list(found) == [BUCKET]


def _s3_object_resources(stmts, action):
    return [r for s in stmts if s["Effect"] == "Allow" and action in as_list(s["Action"])
            for r in as_list(s["Resource"])]


def _suffix(resource) -> str:
    return resource["Fn::Join"][1][-1] if isinstance(resource, dict) else resource


def test_training_role_writes_only_checkpoints_and_output_and_cannot_read_or_delete_models(template):
    stmts = role_statements(template, EXECUTION_ROLE)  # every policy on the role
    # Prepared data is written by the preparation role only (tests/infra/test_data_access.py evaluates both).
    # Only its own run's prefixes (the session tag SageMaker chains from the launch function's session).
    run = "${aws:PrincipalTag/run}"
    assert sorted(_suffix(r) for r in _s3_object_resources(stmts, "s3:PutObject")) == [
        f"/checkpoints/{run}/*", f"/output/{run}/*"]
    # Registered model artifacts live under output/: only checkpoints may be deleted (SageMaker's sync does).
    assert sorted(_suffix(r) for r in _s3_object_resources(stmts, "s3:DeleteObject")) == [f"/checkpoints/{run}/*"]
    # No job reads another run's registered model: output/ is write-only.
    assert sorted(_suffix(r) for r in _s3_object_resources(stmts, "s3:GetObject")) == [
        f"/checkpoints/{run}/*", "/datasets/*", "/models/*"]
    assert not any(a.startswith("s3:") and "*" in a for a in actions(stmts))


def test_training_role_has_no_managed_policies_and_trusts_only_sagemaker(template):
    found = template.find_resources("AWS::IAM::Role", {"Properties": {
        "ManagedPolicyArns": Match.absent(),
        "AssumeRolePolicyDocument": {"Statement": [Match.object_like({
            "Principal": Match.exact({"Service": "sagemaker.amazonaws.com"})})]}}})
    assert EXECUTION_ROLE in found
    puts = [s for s in role_statements(template, EXECUTION_ROLE) if "cloudwatch:PutMetricData" in as_list(s["Action"])]
    namespace = {"StringLike": {"cloudwatch:namespace": "/aws/sagemaker/*"}}
    assert puts and all(s.get("Condition") == namespace for s in puts)


def test_no_lambda_uses_an_aws_managed_policy(template):
    assert template.find_resources("AWS::IAM::Role", {"Properties": {"ManagedPolicyArns": Match.any_value()}}) == {}


def test_interruption_rule_matches_only_this_stages_interrupted_jobs(template):
    prefix = Match.exact([{"prefix": "spotrun-dev-"}])
    interrupted = template.find_resources("AWS::Events::Rule", {"Properties": {"EventPattern": {
        "detail": {"SecondaryStatus": Match.exact(["Interrupted"])}}}})
    assert len(interrupted) == 1
    template.has_resource_properties("AWS::Events::Rule", {"EventPattern": {
        "source": Match.exact(["aws.sagemaker"]), "detail-type": Match.exact(["SageMaker Training Job State Change"]),
        "detail": {"SecondaryStatus": Match.exact(["Interrupted"]), "TrainingJobName": prefix}}})
    sagemaker = template.find_resources("AWS::Events::Rule", {"Properties": {"EventPattern": {
        "source": Match.exact(["aws.sagemaker"])}}})
    assert sagemaker == template.find_resources("AWS::Events::Rule", {"Properties": {"EventPattern": {
        "source": Match.exact(["aws.sagemaker"]), "detail": {"TrainingJobName": prefix}}}})


def test_a_failure_is_notified_once_by_the_state_machine_not_by_a_rule(template, definition):
    assert template.find_resources("AWS::Events::Rule", {"Properties": {"Targets": Match.array_with([
        Match.object_like({"Arn": {"Ref": TOPIC}})])}}) == {}
    notify = [n for n, s in definition["States"].items() if s.get("Resource", "").endswith(":sns:publish")]
    assert sorted(notify) == ["NotifyCostCap", "NotifyGateFailed", "NotifyInvalidRun", "NotifyOverBudget",
                              "NotifyPipelineError", "NotifyPreparationFailed", "NotifyTrainingFailed"]
    for name in notify:  # each ends the execution: one email per failure
        assert definition["States"][definition["States"][name]["Next"]]["Type"] == "Fail"


def test_interruptions_table_has_point_in_time_recovery_and_is_retained(template):
    template.resource_count_is("AWS::DynamoDB::GlobalTable", 1)
    template.has_resource("AWS::DynamoDB::GlobalTable", {"DeletionPolicy": "Retain", "Properties": {"Replicas": [
        Match.object_like({"PointInTimeRecoverySpecification": Match.exact({"PointInTimeRecoveryEnabled": True})})]}})


def test_budget_is_monthly_on_the_project_tag_with_actual_and_forecast_alerts(template):
    template.resource_count_is("AWS::Budgets::Budget", 1)
    notifications = Capture()
    template.has_resource_properties("AWS::Budgets::Budget", {
        "Budget": {"TimeUnit": "MONTHLY", "BudgetType": "COST",
                   "CostFilters": Match.exact({"TagKeyValue": ["user:project$spotrun"]})},
        "NotificationsWithSubscribers": notifications})
    assert {n["Notification"]["NotificationType"] for n in notifications.as_array()} == {"ACTUAL", "FORECASTED"}


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


def test_dashboard_shows_runs_interruptions_loss_throughput_and_cost(template):
    template.resource_count_is("AWS::CloudWatch::Dashboard", 1)
    body = Capture()
    template.has_resource_properties("AWS::CloudWatch::Dashboard", {"DashboardBody": body})
    text = json.dumps(body.as_object())
    for title in ("Runs", "Spot interruptions", "Training loss", "Throughput", "Run cost"):
        assert title in text
    assert "train:loss" in text and "train:val_loss" in text and "RunCostUSD" in text


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
    line = seams.format_metric_line(7, loss=2.5, lr=1e-4, grad_norm=0.5, tokens_per_s=100, mfu=0.3, mem_gb=1.0)
    eval_line = seams.format_eval_line(7, val_loss=2.75, val_ppl=15.6, val_tokens=640, eval_s=0.5)
    done = "run_completed step=7 final_loss=2.5000 val_loss=2.61 base_val_loss=3.4"  # as train.py prints it
    parsed = {**seams.parse_metric_line(line), **seams.parse_eval_line(eval_line),
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
    assert params["EnableNetworkIsolation.$"] == "$.plan.network_isolation"  # off only for a listed tracking server
    assert ("MaxWaitTimeInSeconds.$" in stopping) is spot
    # Built by the estimate (VolumeKmsKeyId only without local storage; the warm pool only on-demand).
    assert params["ResourceConfig.$"] == ("$.plan.resource_config_spot" if spot else "$.plan.resource_config_on_demand")
    assert params["TrainingJobName.$"] == "$.guard.job_name"
    assert params["CheckpointConfig"] == {"S3Uri.$": "$.plan.checkpoint_s3_uri", "LocalPath": "/opt/ml/checkpoints"}
    assert params["RetryStrategy"] == {"MaximumRetryAttempts": 3}
    assert params["AlgorithmSpecification"]["TrainingInputMode"] == "FastFile"
    assert params["Tags.$"] == "$.plan.tags" and params["HyperParameters.$"] == "$.guard.hyperparameters"
    # output/<run>/: the training role writes only its own run's (tests/infra/test_data_access.py).
    assert params["OutputDataConfig"]["S3OutputPath.$"] == \
        "States.Format('s3://ref-artifactsbucket88671897/output/{}/', $.plan.run_name)"


@pytest.mark.parametrize("state", ["CreateSpotTrainingJob", "CreateOnDemandTrainingJob"])
def test_the_launch_function_creates_each_job_and_errors_stop_it(definition, state):
    """The request is the launch function's whole payload (it creates the job as the run: spotrun/pipeline/launch.py,
    which also answers a retried create that finds its job); any error ends on the path that stops the job."""
    task = definition["States"][state]
    assert task["Resource"].endswith(":function:PipelineLauncherFn7670D452") and task["ResultPath"] is None
    catches = task["Catch"]
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
    assert states["NextSegment"]["Choices"] == _create_choices("$.guard.spot")
    assert states["CreateModelPackage"]["Parameters"]["ModelApprovalStatus"] == "PendingManualApproval"


def test_named_failures_before_anything_is_created(definition):
    choice = definition["States"]["EstimateOk"]
    targets = {c["StringEquals"]: c["Next"] for c in choice["Choices"]}
    # Prepare: raw data.source is prepared first, or a hub model fetched (a processing job of either kind; the
    # estimate runs again after it).
    assert targets == {"InvalidRun": "NotifyInvalidRun", "OverBudget": "NotifyOverBudget",
                       "Prepare": "PrepareWhat"}
    assert definition["States"]["EstimatePrepared"]["Next"] == "EstimateOk"
    assert definition["States"]["InvalidRun"] == {"Type": "Fail", "Error": "InvalidRun", "CausePath": "$.plan.message"}
    assert definition["States"]["OverBudget"]["Error"] == "OverBudget"
    assert choice["Default"] == "InitGuard"
    assert definition["States"]["InitGuard"]["Next"] == "SpotOrOnDemand"
    spot_or_not = definition["States"]["SpotOrOnDemand"]
    assert spot_or_not["Choices"] == _create_choices("$.plan.spot")
    assert spot_or_not["Default"] == "CreateOnDemandTrainingJob"


def _create_choices(spot_path: str) -> list[dict]:
    """Spot or on-demand as `spot_path` says; the creates with MlflowConfig only when the plan has one."""
    spot = {"Variable": spot_path, "BooleanEquals": True}
    tracked = {"Variable": "$.plan.mlflow_config.MlflowResourceArn", "IsPresent": True}
    return [{"And": [spot, tracked], "Next": "CreateSpotTrainingJobTracked"},
            {**spot, "Next": "CreateSpotTrainingJob"},
            {**tracked, "Next": "CreateOnDemandTrainingJobTracked"}]


def test_outputs_tell_users_where_to_upload_and_what_to_start(template):
    template.has_output("ArtifactBucket", {"Value": {"Ref": BUCKET}})
    template.has_output("StateMachineArn", {"Value": {"Ref": "PipelineStateMachine1814BD05"}})
    # <base>-<8 characters of the stack id>: a redeploy after destroy, or another stage, gets its own group
    stack_part = Capture()
    template.has_output("ModelPackageGroupName", {"Value": {"Fn::Join": ["-", ["spotrun-dev-models", stack_part]]}})
    assert "AWS::StackId" in json.dumps(stack_part.as_object())
    for name in ("FailuresTopicArn", "DashboardName"):
        template.has_output(name, {})


def test_estimate_settings_output_renders_to_the_estimate_functions_environment(template):
    """`spotrun start` validates with this output: it must be exactly what the estimate Lambda reads."""
    from spotrun.pipeline.plan import PipelineSettings
    from tests.infra.render import placeholder, render

    value = template.find_outputs(StackOutput.ESTIMATE_SETTINGS)[StackOutput.ESTIMATE_SETTINGS]["Value"]
    fn = next(r for k, r in template.find_resources("AWS::Lambda::Function").items()
              if k.startswith("PipelineEstimateFn"))
    env = {k: render(v, placeholder) for k, v in fn["Properties"]["Environment"]["Variables"].items()}
    settings = json.loads(render(value, placeholder))
    assert settings == env
    assert PipelineSettings.from_env(settings).job_prefix == "spotrun-dev-"
