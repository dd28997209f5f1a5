"""TrainingPipeline: the state machine estimate -> spot training job -> cost-guarded polling -> Model Registry.

    Init -> Estimate (Lambda, spotrun planner)
         -> InvalidRun / OverBudget named failures before anything is created
         -> CreateSpotTrainingJob (managed spot, CheckpointConfig checkpoints/<run>/, MaxRuntime/MaxWait from
            the estimate, FastFile data channel, MetricDefinitions from the trainer, cost tags)
         -> Wait -> DescribeTrainingJob -> CostGuard (Lambda) -> Choice:
              wait        -> Wait
              stop        -> StopTrainingJob (the trainer saves and stops) -> Wait
              fallback    -> CreateOnDemandTrainingJob (same checkpoint prefix) -> Wait
         (a run with spot=false starts with CreateOnDemandTrainingJob, with a warm pool if asked)
              completed   -> CreateModelPackage (PendingManualApproval, run metadata) -> CostReport (output)
              over_budget / failed -> notify SNS -> Fail with the cause
NOTE: SageMaker calls use CallAwsService (create + Wait + Describe polling) rather than the `.sync`
integration: SageMakerCreateTrainingJob has no spot/checkpoint fields, and polling is the form moto's
interpreter executes (tests/infra/test_state_machine_moto.py), and the loop is where the cost guard runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import Duration, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sns as sns
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from .artifact_store import ArtifactStore
from .lambda_code import spotrun_function
from .nag import acknowledge, rendered

CHECKPOINT_LOCAL_PATH = "/opt/ml/checkpoints"


@dataclass(frozen=True)
class TrainingPipelineProps:
    store: ArtifactStore
    execution_role: iam.IRole
    image_uri: str
    inference_image_uri: str
    model_package_group_name: str
    job_prefix: str
    project: str
    stage: str
    cost_center: str
    failures_topic: sns.ITopic
    interruptions_table_name: str
    metric_definitions: tuple[dict, ...]
    subnet_ids: tuple[str, ...] = ()
    security_group_ids: tuple[str, ...] = ()
    poll_seconds: int = 60
    metrics_namespace: str = "spotrun"

    def __post_init__(self) -> None:
        if not self.job_prefix or len(self.job_prefix) > 24:
            raise ValueError(f"job_prefix={self.job_prefix!r}: expected 1-24 characters (job names are <= 63)")
        if bool(self.subnet_ids) != bool(self.security_group_ids):
            raise ValueError("subnet_ids and security_group_ids go together: set both or neither")
        if self.poll_seconds < 1:
            raise ValueError(f"poll_seconds={self.poll_seconds}: expected >= 1")


def create_training_job_parameters(props: TrainingPipelineProps, *, spot: bool) -> dict:
    """The CreateTrainingJob request; values the estimate decides come from $.plan, the rest is fixed here."""
    store = props.store
    params: dict = {
        # The guard holds the current job's name: the plan's first, the -od name after a fallback.
        "TrainingJobName.$": "$.guard.job_name",
        "RoleArn": props.execution_role.role_arn,
        "AlgorithmSpecification": {
            "TrainingImage": props.image_uri,
            "TrainingInputMode": "FastFile",
            "MetricDefinitions": [dict(d) for d in props.metric_definitions],
        },
        "HyperParameters.$": "$.plan.hyperparameters",
        "InputDataConfig.$": "$.plan.input_data_config",
        "OutputDataConfig": {"S3OutputPath": f"s3://{store.bucket.bucket_name}/{store.output_prefix}",
                             "KmsKeyId": store.key.key_arn},
        "ResourceConfig": {"InstanceType.$": "$.plan.instance_type", "InstanceCount.$": "$.plan.instance_count",
                           "VolumeSizeInGB.$": "$.plan.volume_gb", "VolumeKmsKeyId": store.key.key_arn},
        # One prefix per run: a resubmitted (on-demand) job resumes from the same checkpoints.
        "CheckpointConfig": {
            "S3Uri.$": f"States.Format('s3://{store.bucket.bucket_name}/{store.checkpoints_prefix}{{}}/', "
                       f"$.plan.run_name)",
            "LocalPath": CHECKPOINT_LOCAL_PATH,
        },
        "EnableManagedSpotTraining": spot,
        "StoppingCondition": ({"MaxRuntimeInSeconds.$": "$.plan.max_runtime_seconds",
                               "MaxWaitTimeInSeconds.$": "$.plan.max_wait_seconds"} if spot
                              else {"MaxRuntimeInSeconds.$": "$.plan.max_runtime_seconds"}),
        "EnableInterContainerTrafficEncryption": False,
        "Tags.$": "$.plan.tags",
    }
    if not spot:  # managed warm pools exist only without spot (the planner refuses the combination)
        params["ResourceConfig"]["KeepAlivePeriodInSeconds.$"] = "$.plan.keep_alive_seconds"
    if props.subnet_ids:
        params["VpcConfig"] = {"Subnets": list(props.subnet_ids), "SecurityGroupIds": list(props.security_group_ids)}
    return params


class TrainingPipeline(Construct):
    def __init__(self, scope: Construct, id_: str, *, props: TrainingPipelineProps) -> None:
        super().__init__(scope, id_)
        stack = Stack.of(self)
        store = props.store
        job_arn = stack.format_arn(service="sagemaker", resource="training-job", resource_name=f"{props.job_prefix}*")
        group_arn = stack.format_arn(service="sagemaker", resource="model-package-group",
                                     resource_name=props.model_package_group_name)
        package_arn = stack.format_arn(service="sagemaker", resource="model-package",
                                       resource_name=f"{props.model_package_group_name}/*")

        self.estimate_fn = spotrun_function(
            self, "EstimateFn", handler="spotrun.handlers.estimate.handler", timeout_s=60,
            description="spotrun planner: validates the run and decides instance, limits, cadence and cost",
            environment={"BUCKET_NAME": store.bucket.bucket_name, "JOB_PREFIX": props.job_prefix,
                         "MODEL_PACKAGE_GROUP": props.model_package_group_name,
                         "TABLE_NAME": props.interruptions_table_name, "POLL_SECONDS": str(props.poll_seconds),
                         "PROJECT": props.project, "STAGE": props.stage, "COST_CENTER": props.cost_center})
        store.grant_read_prefix(self.estimate_fn, store.datasets_prefix)  # index.json of the data
        store.grant_read_prefix(self.estimate_fn, store.models_prefix)  # config.json of the model
        self.guard_fn = spotrun_function(
            self, "CostGuardFn", handler="spotrun.handlers.cost_guard.handler",
            description="spotrun cost guard: projected spend against the run's cap at every poll",
            environment={"METRICS_NAMESPACE": props.metrics_namespace, "STAGE": props.stage})

        def notify(name: str, subject: str, message_path: str) -> tasks.SnsPublish:
            return tasks.SnsPublish(self, name, topic=props.failures_topic, subject=subject,
                                    message=sfn.TaskInput.from_json_path_at(message_path),
                                    result_path=sfn.JsonPath.DISCARD)

        # Unexpected errors anywhere (API errors, throttling after retries) end here, with the cause.
        pipeline_error = notify("NotifyPipelineError", "spotrun: pipeline error", "$.error.Cause").next(
            sfn.Fail(self, "PipelineError", error="PipelineError", cause_path="$.error.Cause"))

        def sdk(name: str, action: str, parameters: dict, resources: list[str], result_path: str,
                iam_action: str | None = None) -> tasks.CallAwsService:
            task = tasks.CallAwsService(self, name, service="sagemaker", action=action, parameters=parameters,
                                        iam_resources=resources, result_path=result_path,
                                        iam_action=iam_action)
            task.add_retry(errors=["SageMaker.ThrottlingException", "SageMaker.SageMakerException"],
                           interval=Duration.seconds(5), max_attempts=3, backoff_rate=2)
            task.add_catch(pipeline_error, errors=["States.ALL"], result_path="$.error")
            return task

        init = sfn.Pass(self, "Init", parameters={"run.$": "$"})
        estimate = tasks.LambdaInvoke(
            self, "Estimate", lambda_function=self.estimate_fn, payload_response_only=True, result_path="$.plan",
            payload=sfn.TaskInput.from_object({"run.$": "$.run", "execution.$": "$$.Execution.Name"}))
        estimate.add_catch(pipeline_error, errors=["States.ALL"], result_path="$.error")
        invalid = notify("NotifyInvalidRun", "spotrun: invalid run", "$.plan.message").next(
            sfn.Fail(self, "InvalidRun", error="InvalidRun", cause_path="$.plan.message"))
        over_budget = notify("NotifyOverBudget", "spotrun: over budget", "$.plan.message").next(
            sfn.Fail(self, "OverBudget", error="OverBudget", cause_path="$.plan.message"))

        init_guard = sfn.Pass(self, "InitGuard", result_path="$.guard", parameters={
            "action": "wait", "job_name.$": "$.plan.job_name", "spot.$": "$.plan.spot", "spent_before_usd": 0,
            "interruptions_before": 0})
        create_spot = sdk("CreateSpotTrainingJob", "createTrainingJob",
                          create_training_job_parameters(props, spot=True), [job_arn], sfn.JsonPath.DISCARD,
                          iam_action="sagemaker:CreateTrainingJob")
        create_on_demand = sdk("CreateOnDemandTrainingJob", "createTrainingJob",
                               create_training_job_parameters(props, spot=False), [job_arn], sfn.JsonPath.DISCARD,
                               iam_action="sagemaker:CreateTrainingJob")
        wait = sfn.Wait(self, "WaitForJob", time=sfn.WaitTime.seconds_path("$.plan.poll_seconds"))
        describe = sdk("DescribeTrainingJob", "describeTrainingJob", {"TrainingJobName.$": "$.guard.job_name"},
                       [job_arn], "$.describe", iam_action="sagemaker:DescribeTrainingJob")
        guard = tasks.LambdaInvoke(
            self, "CostGuard", lambda_function=self.guard_fn, payload_response_only=True, result_path="$.guard",
            payload=sfn.TaskInput.from_object({"plan.$": "$.plan", "guard.$": "$.guard",
                                               "describe.$": "$.describe"}))
        guard.add_catch(pipeline_error, errors=["States.ALL"], result_path="$.error")
        # Drop the raw DescribeTrainingJob output (timestamps, large lists) from the state.
        tidy = sfn.Pass(self, "Tidy", parameters={"run.$": "$.run", "plan.$": "$.plan", "guard.$": "$.guard"})
        stop = sdk("StopTrainingJob", "stopTrainingJob", {"TrainingJobName.$": "$.guard.job_name"}, [job_arn],
                   sfn.JsonPath.DISCARD, iam_action="sagemaker:StopTrainingJob")
        register = sdk("CreateModelPackage", "createModelPackage", {
            "ModelPackageGroupName": props.model_package_group_name,
            "ModelApprovalStatus.$": "$.plan.approval_status",
            "ModelPackageDescription.$": "States.Format('spotrun run {} ({})', $.plan.run_name, $.guard.job_name)",
            "InferenceSpecification": {
                "Containers": [{"Image": props.inference_image_uri,
                                "ModelDataUrl.$": "$.guard.report.model_data_url"}],
                "SupportedContentTypes": ["application/json"],
                "SupportedResponseMIMETypes": ["application/json"],
            },
            "CustomerMetadataProperties.$": "$.guard.report.metadata",
        }, [group_arn, package_arn], "$.registered", iam_action="sagemaker:CreateModelPackage")
        report = sfn.Pass(self, "CostReport", parameters={
            "report.$": "$.guard.report", "model_package_arn.$": "$.registered.ModelPackageArn"})
        training_failed = notify("NotifyTrainingFailed", "spotrun: training failed", "$.guard.message").next(
            sfn.Fail(self, "TrainingFailed", error="TrainingFailed", cause_path="$.guard.message"))
        capped = notify("NotifyCostCap", "spotrun: stopped at the cost cap", "$.guard.message").next(
            sfn.Fail(self, "CostCapReached", error="OverBudget", cause_path="$.guard.message"))

        wait.next(describe).next(guard).next(tidy).next(
            sfn.Choice(self, "NextAction")
            .when(sfn.Condition.string_equals("$.guard.action", "wait"), wait)
            .when(sfn.Condition.string_equals("$.guard.action", "stop"), stop.next(wait))
            .when(sfn.Condition.string_equals("$.guard.action", "fallback"), create_on_demand.next(wait))
            .when(sfn.Condition.string_equals("$.guard.action", "completed"), register.next(report))
            .when(sfn.Condition.string_equals("$.guard.action", "over_budget"), capped)
            .otherwise(training_failed))
        definition = init.next(estimate).next(
            sfn.Choice(self, "EstimateOk")
            .when(sfn.Condition.string_equals("$.plan.status", "InvalidRun"), invalid)
            .when(sfn.Condition.string_equals("$.plan.status", "OverBudget"), over_budget)
            .otherwise(init_guard.next(
                sfn.Choice(self, "SpotOrOnDemand")
                .when(sfn.Condition.boolean_equals("$.plan.spot", True), create_spot.next(wait))
                .otherwise(create_on_demand))))

        log_group = logs.LogGroup(self, "Logs", retention=logs.RetentionDays.SIX_MONTHS)
        self.state_machine = sfn.StateMachine(
            self, "StateMachine", definition_body=sfn.DefinitionBody.from_chainable(definition),
            tracing_enabled=True, timeout=Duration.days(60),
            logs=sfn.LogOptions(destination=log_group, level=sfn.LogLevel.ALL, include_execution_data=True))
        role = self.state_machine.role
        # The SDK integrations tag jobs and packages at creation and pass the execution role to SageMaker.
        role.add_to_principal_policy(iam.PolicyStatement(actions=["sagemaker:AddTags"],
                                                         resources=[job_arn, package_arn, group_arn]))
        role.add_to_principal_policy(iam.PolicyStatement(
            actions=["iam:PassRole"], resources=[props.execution_role.role_arn],
            conditions={"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}}))
        store.key.grant(role, "kms:CreateGrant", "kms:DescribeKey")
        self._acknowledge(job_arn, package_arn)

    def _acknowledge(self, job_arn: str, package_arn: str) -> None:
        policy = self.state_machine.role.node.find_child("DefaultPolicy")
        acknowledge(policy, f"AwsSolutions-IAM5[Resource::{rendered(self, job_arn)}]",
                    "training jobs of this stage only: every job name starts with the stage's prefix")
        acknowledge(policy, f"AwsSolutions-IAM5[Resource::{rendered(self, package_arn)}]",
                    "model package versions of this stack's group; version ARNs are not known in advance")
        for fn in (self.estimate_fn, self.guard_fn):
            acknowledge(policy, f"AwsSolutions-IAM5[Resource::{rendered(self, fn.function_arn)}:*]",
                        "LambdaInvoke grants the function's versions and aliases alongside the function")
        acknowledge(policy, "AwsSolutions-IAM5[Resource::*]",
                    "X-Ray tracing of the state machine: PutTraceSegments and sampling calls have no resource "
                    "scoping; log delivery (CloudWatch Logs vended logs) likewise")
        acknowledge(policy, "AwsSolutions-IAM5[Action::kms:GenerateDataKey*]",
                    "publishing to the KMS-encrypted failures topic needs data keys of that key only")
