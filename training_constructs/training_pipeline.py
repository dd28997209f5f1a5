"""TrainingPipeline: the state machine estimate -> spot training job -> cost-guarded polling -> Model Registry.

    Init -> Estimate (Lambda, spotrun planner; region prices, allowed types, service quota, checkpoint prefix)
         -> InvalidRun / OverBudget named failures before anything is created
         -> CreateSpotTrainingJob (managed spot, RetryStrategy, CheckpointConfig checkpoints/<run>/<execution>/,
            MaxRuntime/MaxWait and ResourceConfig from the estimate, MetricDefinitions from spotrun.seams; sent by
            the launch function with the run's session tag: launcher.py)
            (ResourceInUse: a retried create whose first call succeeded; the guard checks the job is ours)
         -> WaitForJob ($.guard.wait_seconds) -> CostGuard (Lambda: describes the job, lists checkpoints) -> Choice:
              wait        -> WaitForJob
              stop        -> StopTrainingJob (the trainer saves and stops) -> WaitForJob
              fallback    -> CreateOnDemandTrainingJob (same checkpoint prefix) -> WaitForJob
         (a run with spot=false starts with CreateOnDemandTrainingJob, with a warm pool if asked)
              continue    -> StartExecution of this state machine with the run, plan and guard (the history is
                             nearly full: spotrun/pipeline/continuation.py) -> ContinuedInNewExecution (output)
              completed   -> CreateModelPackage (HF LLM serving image, run metadata) -> CostReport (output)
              gate_failed -> GateFailed (validation loss fails registry.gate; artifact kept, both losses in cause)
              over_budget / failed -> notify SNS -> Fail with the cause
    A continued execution starts at ContinueRun (the estimate Lambda proves its parent started it) -> NextSegment.
    Execution ABORTED / FAILED / TIMED_OUT -> EventBridge -> Canceller (Lambda): stops the execution's job.
NOTE: SageMaker calls use CallAwsService or the launch function (create + Wait + guard polling) rather than the
`.sync` integration: SageMakerCreateTrainingJob has no spot/checkpoint fields, polling is the form moto's
interpreter executes (tests/infra/test_state_machine_moto.py), and the loop is where the cost guard runs. The
loop's length in history events and the guard's wait schedule are explained in spotrun/pipeline/guard.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from aws_cdk import ArnFormat, Duration, Stack
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sns as sns
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from spotrun.seams import (
    CANCEL_STATUSES,
    COMPLETED_METRIC_DEFINITION,
    FIRST_EXECUTION_EVENTS,
    REGISTRATION_STATUS,
    CancelEnvironment,
    CostGuardEnvironment,
    GuardAction,
    PipelineSettings,
    PlanStatus,
    PreparationSettings,
    guard_path,
    plan_path,
)

from .artifact_store import ArtifactStore
from .lambda_code import dead_letter_queue, on_failure_destination, spotrun_function
from .launcher import RunLauncher, RunLauncherProps
from .nag import acknowledge, rendered
from .preparation_step import preparation_functions, preparation_states

CHECKPOINT_LOCAL_PATH = "/opt/ml/checkpoints"
# The longest run the contract allows: MaxWait up to 56 days of spot (contract.compute.max_wait_hours), then an
# on-demand fallback of MaxRuntime up to 28 days (84 days); the execution may not time out before its job ends.
EXECUTION_TIMEOUT = Duration.days(90)
# SageMaker restarts a job that hit an internal error, within MaxWait (spot) or MaxRuntime (API reference,
# RetryStrategy: 1-30 attempts).
RETRY_ATTEMPTS = 3


@dataclass(frozen=True)
class TrainingPipelineProps:
    store: ArtifactStore
    """The artifact bucket and key: datasets, models, checkpoints and output of every run."""
    execution_role: iam.IRole
    """The training jobs' role."""
    preparation_role: iam.IRole
    """The preparation (processing) jobs' role: the only one that writes datasets/_prepared/."""
    hub_fetch_role: iam.IRole
    """The hub fetch (processing) jobs' role: writes models/_hub/ only (spotrun/pipeline/hub.py)."""
    image_uri: str
    """The trainer image (an ECR URI) every training and preparation job runs."""
    inference_image_uri: str
    """The serving image the registered model packages name."""
    model_package_group_name: str
    """The group's name (a token when the stack derives it); IAM is scoped to `model_package_group_base`-*."""
    model_package_group_base: str
    """The stage's model package group name prefix: what IAM on the registry is scoped to."""
    job_prefix: str
    """The stage's job name prefix (1-24 characters; job names are <= 63): what IAM on jobs is scoped to."""
    project: str
    """The `project` tag on every job (cost allocation)."""
    stage: str
    """The stage's name: a tag on every job and the dimension of its metrics."""
    cost_center: str
    """The `cost-center` tag on every job."""
    failures_topic: sns.ITopic
    """Where a failed or refused run, a failed gate and a cancelled run are announced."""
    interruptions_table_name: str
    """The interruptions table (InterruptionEvents) the estimate reads recorded rates from."""
    metric_definitions: tuple[dict, ...]
    """SageMaker metric definitions of the trainer's metric lines (the completion line is added)."""
    subnet_ids: tuple[str, ...] = ()
    """The VPC subnets jobs run in (with `security_group_ids`). Default: none (no VPC)."""
    security_group_ids: tuple[str, ...] = ()
    """The security groups of jobs in the VPC (with `subnet_ids`). Default: none."""
    poll_seconds: int = 60
    """The cost guard's first poll interval, in seconds (1 <= poll_seconds <= max_poll_seconds). Default: 60."""
    max_poll_seconds: int = 4 * 3600
    """The longest interval between the guard's polls, in seconds. Default: 14400 (4 hours)."""
    allowed_instance_types: tuple[str, ...] = ()
    """The instance types a run may use (the estimate refuses others). Default: none (any in the catalog)."""
    metrics_namespace: str = "spotrun"
    """The CloudWatch namespace of the guard's metrics. Default: spotrun."""
    max_usd_per_run: float = 0.0
    """The stage's largest budget.max_usd; the estimate refuses more. Default: 0 (none)."""
    max_instances_per_run: int = 0
    """The stage's most instances per run. Default: 0 (none)."""
    max_concurrent_runs: int = 0
    """Executions that may run at once; the estimate counts the running ones. Default: 0 (none)."""
    mlflow_tracking_servers: tuple[str, ...] = ()
    """The MLflow tracking servers a run may name (the estimate refuses others). Default: none."""
    wandb_api_key_secrets: tuple[str, ...] = ()
    """The W&B API key secrets (ARNs) a run may name (the estimate refuses others). Default: none (no W&B)."""
    preparation: PreparationSettings = PreparationSettings()
    """The CPU instances that prepare a raw data.source (a SageMaker Processing job running the trainer image).
    Default: PreparationSettings()."""

    def __post_init__(self) -> None:
        if not self.job_prefix or len(self.job_prefix) > 24:
            raise ValueError(f"job_prefix={self.job_prefix!r}: expected 1-24 characters (job names are <= 63)")
        if bool(self.subnet_ids) != bool(self.security_group_ids):
            raise ValueError("subnet_ids and security_group_ids go together: set both or neither")
        if not 1 <= self.poll_seconds <= self.max_poll_seconds:
            raise ValueError(f"poll_seconds={self.poll_seconds}, max_poll_seconds={self.max_poll_seconds}: "
                             "expected 1 <= poll_seconds <= max_poll_seconds")


def create_training_job_parameters(props: TrainingPipelineProps, *, spot: bool, tracked: bool = False) -> dict:
    """The CreateTrainingJob request; values the estimate decides come from $.plan, the rest is fixed here.
    `tracked`: with the plan's MlflowConfig (a run naming a SageMaker AI MLflow tracking server by ARN)."""
    store = props.store
    params: dict = {
        # The guard holds the current segment's job: its name, MaxRuntime (what the cap still allows at on-demand
        # rates, spotrun/planner/segments.py), MaxWait and hyperparameters (the trainer's segment_seconds).
        "TrainingJobName.$": guard_path("job_name"),
        "RoleArn": props.execution_role.role_arn,
        "AlgorithmSpecification": {
            "TrainingImage": props.image_uri,
            "TrainingInputMode": "FastFile",
            # The trainer's metric lines, and its completion line: what tells a finished run from a segment's end.
            "MetricDefinitions": [dict(d) for d in props.metric_definitions] + [dict(COMPLETED_METRIC_DEFINITION)],
        },
        "HyperParameters.$": guard_path("hyperparameters"),
        "InputDataConfig.$": plan_path("input_data_config"),
        # output/<run>/: the training role writes only its own run's (${aws:PrincipalTag/run}, execution_role.py).
        "OutputDataConfig": {"S3OutputPath.$": f"States.Format('s3://{store.bucket.bucket_name}/"
                                               f"{store.output_prefix}{{}}/', {plan_path('run_name')})",
                             "KmsKeyId": store.key.key_arn},
        # Built by the estimate: VolumeKmsKeyId only for instance types without local storage; warm pool on-demand.
        "ResourceConfig.$": plan_path("resource_config_spot" if spot else "resource_config_on_demand"),
        # One prefix per execution (or the earlier execution's it continues): the on-demand fallback resumes
        # from the same checkpoints, a new execution of the same run JSON does not.
        "CheckpointConfig": {"S3Uri.$": plan_path("checkpoint_s3_uri"), "LocalPath": CHECKPOINT_LOCAL_PATH},
        "EnableManagedSpotTraining": spot,
        "StoppingCondition": ({"MaxRuntimeInSeconds.$": guard_path("max_runtime_seconds"),
                               "MaxWaitTimeInSeconds.$": guard_path("max_wait_seconds")} if spot
                              else {"MaxRuntimeInSeconds.$": guard_path("max_runtime_seconds")}),
        "RetryStrategy": {"MaximumRetryAttempts": RETRY_ATTEMPTS},
        # "No inbound or outbound network calls ... except for calls between peers within a training cluster"
        # (API reference, EnableNetworkIsolation): the container cannot reach S3, the internet or any endpoint;
        # SageMaker itself moves the channels, checkpoints and the model artifact. Off only for a run that names
        # one of the stage's MLflow tracking servers (the estimate refuses any other), which the trainer must reach.
        "EnableNetworkIsolation.$": plan_path("network_isolation"),
        "EnableInterContainerTrafficEncryption": False,
        "Tags.$": plan_path("tags"),
    }
    if tracked:  # SageMaker's own MLflow integration: the job is a run of the server's experiment
        params["MlflowConfig.$"] = plan_path("mlflow_config")
    if props.subnet_ids:
        params["VpcConfig"] = {"Subnets": list(props.subnet_ids), "SecurityGroupIds": list(props.security_group_ids)}
    return params


# A sentinel's container: the run's image with a command that holds the instances and does nothing (GNU
# coreutils' sleep; SageMaker ends it at MaxRuntime or on StopTrainingJob). As PID 1 without a handler it ignores
# SIGTERM, so a stop bills the whole 120 s allowance: what the simulator bills (spotrun/policy/decision.py
# SENTINEL_STOP_S).
SENTINEL_COMMAND = ("sleep", "infinity")


def sentinel_job_parameters(props: TrainingPipelineProps) -> dict:
    """The template of a sentinel's CreateTrainingJob request (spotrun/pipeline/guard.py `sentinel_request` adds
    its name and limits): managed spot, the run's spot ResourceConfig (its instance type and count), role, output
    path and tags, no channels, no checkpoints, no hyperparameters: it trains nothing and writes nothing the run
    reads. Sent by the cost guard with the launcher role (the run's session tag), as every job is."""
    store = props.store
    params: dict = {
        "RoleArn": props.execution_role.role_arn,
        "AlgorithmSpecification": {"TrainingImage": props.image_uri, "TrainingInputMode": "File",
                                   "ContainerEntrypoint": [SENTINEL_COMMAND[0]],
                                   "ContainerArguments": list(SENTINEL_COMMAND[1:])},
        "OutputDataConfig": {"S3OutputPath.$": f"States.Format('s3://{store.bucket.bucket_name}/"
                                               f"{store.output_prefix}{{}}/', {plan_path('run_name')})",
                             "KmsKeyId": store.key.key_arn},
        "ResourceConfig.$": plan_path("resource_config_spot"),
        "EnableManagedSpotTraining": True,
        "EnableNetworkIsolation": True,
        "Tags.$": plan_path("tags"),
    }
    if props.subnet_ids:
        params["VpcConfig"] = {"Subnets": list(props.subnet_ids), "SecurityGroupIds": list(props.security_group_ids)}
    return params


@dataclass(frozen=True)
class _Arns:
    """The stage's SageMaker resources the pipeline's policies are scoped to."""

    job: str
    group: str
    package: str
    processing: str

    @classmethod
    def of(cls, stack: Stack, props: TrainingPipelineProps) -> _Arns:
        return cls(
            job=stack.format_arn(service="sagemaker", resource="training-job", resource_name=f"{props.job_prefix}*"),
            processing=stack.format_arn(service="sagemaker", resource="processing-job",
                                        resource_name=f"{props.job_prefix}*"),
            group=stack.format_arn(service="sagemaker", resource="model-package-group",
                                   resource_name=f"{props.model_package_group_base}-*"),
            package=stack.format_arn(service="sagemaker", resource="model-package",
                                     resource_name=f"{props.model_package_group_base}-*/*"))


class TrainingPipeline(Construct):
    """The functions (estimate, cost guard, canceller), the state machine's definition and its role."""

    def __init__(self, scope: Construct, id_: str, *, props: TrainingPipelineProps) -> None:
        super().__init__(scope, id_)
        arns = _Arns.of(Stack.of(self), props)
        self._functions(props, arns.job)
        # Creates each training job with its run's session tag (launcher.py): the job reaches only its run's data.
        self.launcher = RunLauncher(self, "Launcher", props=RunLauncherProps(execution_role=props.execution_role,
                                                                          job_arn=arns.job,
                                                                          also_assumed_by=(self.guard_fn.role,)))
        # The cost guard creates a sentinel spot job as the launch function creates every job (launcher.py).
        for name, value in CostGuardEnvironment(metrics_namespace=props.metrics_namespace, stage=props.stage,
                                                launcher_role_arn=self.launcher.role.role_arn).to_env().items():
            self.guard_fn.add_environment(name, value)
        self.guard_fn.add_to_role_policy(iam.PolicyStatement(actions=["sts:AssumeRole", "sts:TagSession"],
                                                             resources=[self.launcher.role.role_arn]))
        self.prepare_fn = preparation_functions(self, props, arns.processing)
        self._state_machine(props, self._definition(props, arns), arns)
        self._estimate_reads_executions()
        self._canceller(props, arns.job, arns.processing)
        self._acknowledge(arns.job, arns.package, arns.group, arns.processing)

    def _functions(self, props: TrainingPipelineProps, job_arn: str) -> None:
        """The estimate and the cost guard, with what each reads."""
        store = props.store
        # The estimate handler reads these with PipelineSettings.from_env and PreparationSettings.from_env; the
        # stack also outputs them so that `spotrun start` validates with the same settings.
        self.estimate_settings = {**PipelineSettings(
            bucket=store.bucket.bucket_name, job_prefix=props.job_prefix,
            model_package_group=props.model_package_group_name, table_name=props.interruptions_table_name,
            poll_seconds=props.poll_seconds, max_poll_seconds=props.max_poll_seconds,
            allowed_instance_types=tuple(props.allowed_instance_types), volume_kms_key_arn=store.key.key_arn,
            project=props.project, stage=props.stage, cost_center=props.cost_center,
            max_usd_per_run=props.max_usd_per_run, max_instances_per_run=props.max_instances_per_run,
            max_concurrent_runs=props.max_concurrent_runs,
            mlflow_tracking_servers=tuple(props.mlflow_tracking_servers),
            wandb_api_key_secrets=tuple(props.wandb_api_key_secrets)).to_env(), **props.preparation.to_env()}
        self.estimate_fn = spotrun_function(
            self, "EstimateFn", handler="spotrun.handlers.estimate.handler", timeout_s=60,
            # One full vCPU (Lambda allots CPU in proportion to memory: 1,769 MB is one vCPU, per the Lambda
            # developer guide's "Configuring Lambda function memory"). The worst run the contract accepts (28 days
            # at 10 interruptions per hour, a 40-day deadline, a cap that binds: the run simulated at its cap, as
            # one job for the P95 finish cap, and at a deadline warning's cap) took 30.3 s of CPU on a shared,
            # loaded machine (benchmarks/estimate_lambda_bench.py --cap-x 1.3; docs/spot-policy.md).
            memory_mb=1769,
            description="spotrun planner: validates the run and decides instance, limits, cadence and cost",
            environment=self.estimate_settings)
        store.grant_read_prefix(self.estimate_fn, store.datasets_prefix)  # index.json of the data
        store.grant_read_prefix(self.estimate_fn, store.models_prefix)  # config.json of the model
        # spotrun-run.json beside each execution's checkpoints (written, and read by a later resume_from)
        store.grant_read_write_prefix(self.estimate_fn, store.checkpoints_prefix, delete=False)
        self.estimate_fn.add_to_role_policy(iam.PolicyStatement(actions=["servicequotas:ListServiceQuotas"],
                                                                resources=["*"]))
        acknowledge(self.estimate_fn.role.node.find_child("DefaultPolicy"), "AwsSolutions-IAM5[Resource::*]",
                    "servicequotas:ListServiceQuotas supports no resource scoping (the SageMaker quota preflight)")
        self.guard_fn = spotrun_function(
            self, "CostGuardFn", handler="spotrun.handlers.cost_guard.handler",
            description="spotrun cost guard: describes the job, checkpoint age, spend against the cap at every poll",
            environment=CostGuardEnvironment(metrics_namespace=props.metrics_namespace, stage=props.stage).to_env())
        # StopTrainingJob: the sentinel it created (spotrun/pipeline/guard.py); the run's jobs are stopped by the
        # state machine.
        self.guard_fn.add_to_role_policy(iam.PolicyStatement(
            actions=["sagemaker:DescribeTrainingJob", "sagemaker:ListTags", "sagemaker:StopTrainingJob"],
            resources=[job_arn]))
        self.guard_fn.add_to_role_policy(iam.PolicyStatement(
            actions=["s3:ListBucket"], resources=[store.bucket.bucket_arn],
            conditions={"StringLike": {"s3:prefix": [f"{store.checkpoints_prefix}*"]}}))
        acknowledge(self.guard_fn.role.node.find_child("DefaultPolicy"),
                    f"AwsSolutions-IAM5[Resource::{rendered(self, job_arn)}]",
                    "describes training jobs of this stage only: every job name starts with the stage's prefix")

    def failure_notice(self, props: TrainingPipelineProps, name: str, subject: str,
                       message_path: str) -> tasks.SnsPublish:
        """SNS to the failures topic with the message at `message_path` (each failure ends the execution)."""
        return tasks.SnsPublish(self, name, topic=props.failures_topic, subject=subject,
                                message=sfn.TaskInput.from_json_path_at(message_path),
                                result_path=sfn.JsonPath.DISCARD)

    def sagemaker_call(self, name: str, action: str, parameters: dict, resources: list[str], result_path: str,
             iam_action: str | None = None, result_selector: dict | None = None) -> tasks.CallAwsService:
        """A SageMaker API call, retried on throttling and internal errors."""
        task = tasks.CallAwsService(self, name, service="sagemaker", action=action, parameters=parameters,
                                    iam_resources=resources, result_path=result_path, iam_action=iam_action,
                                    result_selector=result_selector)
        task.add_retry(errors=["SageMaker.ThrottlingException", "SageMaker.SageMakerException"],
                       interval=Duration.seconds(5), max_attempts=3, backoff_rate=2)
        return task

    def _pipeline_error(self, props: TrainingPipelineProps, job_arn: str) -> sfn.Choice:
        """Unexpected errors anywhere (API errors, throttling after retries, a guard that keeps failing) end here,
        with the cause: the current job is stopped first (its MaxRuntime bounds it if the stop fails too, and the
        canceller tries again when the execution has failed)."""
        notify_error = self.failure_notice(props, "NotifyPipelineError", "spotrun: pipeline error",
                                           "$.error.Cause").next(
            sfn.Fail(self, "PipelineError", error="PipelineError", cause_path="$.error.Cause"))
        stop_on_error = tasks.CallAwsService(
            self, "StopJobOnError", service="sagemaker", action="stopTrainingJob",
            parameters={"TrainingJobName.$": guard_path("job_name")}, iam_resources=[job_arn],
            iam_action="sagemaker:StopTrainingJob", result_path=sfn.JsonPath.DISCARD)
        stop_on_error.add_retry(errors=["States.ALL"], interval=Duration.seconds(5), max_attempts=6,
                                backoff_rate=2)
        stop_on_error.add_catch(notify_error, errors=["States.ALL"], result_path="$.stop_error")
        stop_on_error.next(notify_error)
        return sfn.Choice(self, "JobToStop").when(
            sfn.Condition.is_present(guard_path("job_name")), stop_on_error).otherwise(notify_error)

    def _definition(self, props: TrainingPipelineProps, arns: _Arns) -> sfn.IChainable:
        """Init -> Estimate -> the first job -> the guarded polling loop -> registration or a named failure."""
        pipeline_error = self._pipeline_error(props, arns.job)

        def notify(name: str, subject: str, message_path: str) -> tasks.SnsPublish:
            return self.failure_notice(props, name, subject, message_path)

        init = sfn.Pass(self, "Init", parameters={"run.$": "$"})
        estimate = self.estimate_task("Estimate", pipeline_error)
        invalid = notify("NotifyInvalidRun", "spotrun: invalid run", plan_path("message")).next(
            sfn.Fail(self, "InvalidRun", error=PlanStatus.INVALID_RUN.value, cause_path=plan_path("message")))
        over_budget = notify("NotifyOverBudget", "spotrun: over budget", plan_path("message")).next(
            sfn.Fail(self, "OverBudget", error=PlanStatus.OVER_BUDGET.value, cause_path=plan_path("message")))

        init_guard = sfn.Pass(self, "InitGuard", result_path="$.guard", parameters={
            "action": GuardAction.WAIT.value, "job_name.$": plan_path("job_name"), "spot.$": plan_path("spot"),
            # What the run's preparation job billed (0 without one): the first segment's room is the cap less it.
            "wait_seconds.$": plan_path("poll_seconds"), "spent_before_usd.$": plan_path("spent_before_usd"),
            "interruptions_before": 0,
            "segment": 1, "max_runtime_seconds.$": plan_path("max_runtime_seconds"),
            "max_wait_seconds.$": plan_path("max_wait_seconds"),
            "hyperparameters.$": plan_path("hyperparameters"), "segments": [],
            "history_events": FIRST_EXECUTION_EVENTS})  # the events before the first poll, generously
        choose_create, next_segment = self._training_loop(props, arns, pipeline_error)
        estimate_ok = sfn.Choice(self, "EstimateOk")
        preparation = preparation_states(self, props, arns.processing, pipeline_error, estimate_ok)
        init.next(estimate).next(
            estimate_ok
            .when(sfn.Condition.string_equals(plan_path("status"), PlanStatus.PREPARE.value), preparation)
            .when(sfn.Condition.string_equals(plan_path("status"), PlanStatus.INVALID_RUN.value), invalid)
            .when(sfn.Condition.string_equals(plan_path("status"), PlanStatus.OVER_BUDGET.value), over_budget)
            .otherwise(init_guard.next(choose_create("SpotOrOnDemand", plan_path("spot")))))
        # A run continued from a full history (spotrun/pipeline/continuation.py): proven, then its next segment.
        resume = self.estimate_task("ContinueRun", pipeline_error, result_path="$", payload={
            "continuation.$": "$.continuation", "execution.$": "$$.Execution.Name",
            "state_machine.$": "$$.StateMachine.Id"})
        resume.next(sfn.Choice(self, "ContinuationProven")
                    .when(sfn.Condition.string_equals(plan_path("status"), PlanStatus.INVALID_RUN.value), invalid)
                    .otherwise(next_segment))
        return sfn.Choice(self, "ContinuesARun").when(sfn.Condition.is_present("$.continuation"), resume) \
            .otherwise(init)

    def estimate_task(self, name: str, pipeline_error: sfn.IChainable, *, result_path: str = "$.plan",
                      payload: dict | None = None, **extra: str) -> tasks.LambdaInvoke:
        """The estimate, on the run and the execution (and, after a preparation, what it made); `payload`: another
        question to the same function (a continued run's proof)."""
        estimate = tasks.LambdaInvoke(
            self, name, lambda_function=self.estimate_fn, payload_response_only=True, result_path=result_path,
            payload=sfn.TaskInput.from_object(payload or {
                "run.$": "$.run", "execution.$": "$$.Execution.Name", "started.$": "$$.Execution.StartTime",
                "state_machine.$": "$$.StateMachine.Id", **extra}))
        estimate.add_catch(pipeline_error, errors=["States.ALL"], result_path="$.error")
        return estimate

    def _training_loop(self, props: TrainingPipelineProps, arns: _Arns,
                       pipeline_error: sfn.IChainable) -> tuple[Callable[[str, str], sfn.Choice], sfn.Choice]:
        """The jobs (spot, on-demand; each with or without MlflowConfig) -> WaitForJob -> CostGuard -> its action:
        wait, stop, the next segment (here, or in a fresh execution), registration or a named failure. Returns
        what makes a Choice between the creates (the first job's from the plan) and the choice of the next
        segment's (where a continued run starts)."""
        job_arn, sdk = arns.job, self.sagemaker_call

        def notify(name: str, subject: str, message_path: str) -> tasks.SnsPublish:
            return self.failure_notice(props, name, subject, message_path)

        wait = sfn.Wait(self, "WaitForJob", time=sfn.WaitTime.seconds_path(guard_path("wait_seconds")))

        def create(name: str, spot: bool, tracked: bool = False) -> tasks.LambdaInvoke:
            # The request is the task's whole payload; the launch function adds SessionChainingConfig and sends it
            # with its run-tagged session (spotrun/pipeline/launch.py). A retried create whose first call went
            # through finds its job there (ResourceInUse); the guard checks the job is ours.
            task = tasks.LambdaInvoke(
                self, name, lambda_function=self.launcher.fn, payload_response_only=True,
                payload=sfn.TaskInput.from_object(create_training_job_parameters(props, spot=spot, tracked=tracked)),
                result_path=sfn.JsonPath.DISCARD)
            task.add_retry(errors=["States.TaskFailed"], interval=Duration.seconds(5), max_attempts=3,
                           backoff_rate=2)
            task.add_catch(pipeline_error, errors=["States.ALL"], result_path="$.error")
            return task

        create_spot = create("CreateSpotTrainingJob", True)
        create_on_demand = create("CreateOnDemandTrainingJob", False)
        create_spot_tracked = create("CreateSpotTrainingJobTracked", True, tracked=True)
        create_on_demand_tracked = create("CreateOnDemandTrainingJobTracked", False, tracked=True)
        # MlflowConfig is sent only when the plan has one (a null or {} MlflowConfig is not a valid request).
        tracked = sfn.Condition.is_present(plan_path("mlflow_config") + ".MlflowResourceArn")

        def choose_create(name: str, spot_path: str) -> sfn.Choice:
            spot = sfn.Condition.boolean_equals(spot_path, True)
            return (sfn.Choice(self, name)
                    .when(sfn.Condition.and_(spot, tracked), create_spot_tracked).when(spot, create_spot)
                    .when(tracked, create_on_demand_tracked).otherwise(create_on_demand))
        guard = tasks.LambdaInvoke(
            self, "CostGuard", lambda_function=self.guard_fn, payload_response_only=True, result_path="$.guard",
            payload=sfn.TaskInput.from_object({"plan.$": "$.plan", "guard.$": "$.guard",
                                               "sentinel_request": sentinel_job_parameters(props)}))
        guard.add_retry(errors=["States.TaskFailed"], interval=Duration.seconds(30), max_attempts=3, backoff_rate=2)
        guard.add_catch(pipeline_error, errors=["States.ALL"], result_path="$.error")
        stop = sdk("StopTrainingJob", "stopTrainingJob", {"TrainingJobName.$": guard_path("job_name")}, [job_arn],
                   sfn.JsonPath.DISCARD, iam_action="sagemaker:StopTrainingJob")
        stop.add_catch(pipeline_error, errors=["States.ALL"], result_path="$.error")
        register, report = self._registration(props, arns, pipeline_error)
        training_failed = notify("NotifyTrainingFailed", "spotrun: training failed", guard_path("message")).next(
            sfn.Fail(self, "TrainingFailed", error="TrainingFailed", cause_path=guard_path("message")))
        capped = notify("NotifyCostCap", "spotrun: stopped at the cost cap", guard_path("message")).next(
            sfn.Fail(self, "CostCapReached", error=PlanStatus.OVER_BUDGET.value, cause_path=guard_path("message")))
        # The job completed, but its validation loss fails registry.gate (spotrun/pipeline/gate.py): not registered; the
        # cause names both losses and where the artifact is kept.
        gate_failed = notify("NotifyGateFailed", "spotrun: model failed the registry gate", guard_path("message")
                             ).next(sfn.Fail(self, "GateFailed", error="GateFailed", cause_path=guard_path("message")))

        def action_is(action: GuardAction) -> sfn.Condition:
            return sfn.Condition.string_equals(guard_path("action"), action.value)

        next_segment = choose_create("NextSegment", guard_path("spot"))
        wait.next(guard).next(
            sfn.Choice(self, "NextAction")
            .when(action_is(GuardAction.WAIT), wait)
            .when(action_is(GuardAction.STOP), stop.next(wait))
            .when(sfn.Condition.or_(action_is(GuardAction.SEGMENT), action_is(GuardAction.FALLBACK)), next_segment)
            .when(action_is(GuardAction.CONTINUE), self._continue_in_new_execution(pipeline_error))
            .when(action_is(GuardAction.COMPLETED), register.next(report))
            .when(action_is(GuardAction.OVER_BUDGET), capped)
            .when(action_is(GuardAction.GATE_FAILED), gate_failed)
            .otherwise(training_failed))
        for task in (create_spot, create_on_demand, create_spot_tracked, create_on_demand_tracked):
            task.next(wait)
        return choose_create, next_segment

    def _continue_in_new_execution(self, pipeline_error: sfn.IChainable) -> sfn.CustomState:
        """StartExecution of this state machine with the run, the plan and the guard (its next job), then this
        execution succeeds naming its successor (spotrun/pipeline/continuation.py). A CustomState: the role's grant
        on the state machine's own ARN is a separate policy (`_state_machine`), which a task's grant would make a
        cycle."""
        start = sfn.CustomState(self, "ContinueInNewExecution", state_json={
            "Type": "Task", "Resource": f"arn:{Stack.of(self).partition}:states:::states:startExecution",
            "Parameters": {"StateMachineArn.$": "$$.StateMachine.Id", "Name.$": guard_path("next_execution"),
                           "Input": {"continuation": {"parent.$": "$$.Execution.Id", "run.$": "$.run",
                                                      "plan.$": "$.plan", "guard.$": "$.guard"}}},
            "ResultPath": "$.continued_in"})  # {ExecutionArn, StartDate} of the successor
        continued = sfn.Pass(self, "ContinuedInNewExecution", parameters={
            "continued_as.$": guard_path("next_execution"), "segment.$": guard_path("segment"),
            "history_events.$": guard_path("history_events")})  # the guard's count of this execution's events
        # A retried StartExecution whose first call went through: the successor runs.
        start.add_catch(continued, errors=["StepFunctions.ExecutionAlreadyExistsException"])
        start.add_catch(pipeline_error, errors=["States.ALL"], result_path="$.error")
        start.next(continued)
        return start

    def _registration(self, props: TrainingPipelineProps, arns: _Arns,
                      pipeline_error: sfn.IChainable) -> tuple[tasks.CallAwsService, sfn.Pass]:
        """The completed job's model package (for review, always) and the run's cost report."""
        register = self.sagemaker_call("CreateModelPackage", "createModelPackage", {
            "ModelPackageGroupName": props.model_package_group_name,
            # Registered for review, always: approval is a separate, permissioned step.
            "ModelApprovalStatus": REGISTRATION_STATUS,
            "ModelPackageDescription.$": f"States.Format('spotrun run {{}} ({{}}, {{}})', {plan_path('run_name')}, "
                                         f"{plan_path('method')}, {guard_path('job_name')})",
            "InferenceSpecification": {
                # The HF LLM (TGI) serving image reads the trainer's safetensors directory, which SageMaker
                # extracts from model.tar.gz into /opt/ml/model.
                "Containers": [{"Image": props.inference_image_uri,
                                "ModelDataUrl.$": guard_path("report", "model_data_url"),
                                "Environment": {"HF_MODEL_ID": "/opt/ml/model"}}],
                "SupportedContentTypes": ["application/json"],
                "SupportedResponseMIMETypes": ["application/json"],
            },
            "CustomerMetadataProperties.$": guard_path("report", "metadata"),
        }, [arns.group, arns.package], "$.registered", iam_action="sagemaker:CreateModelPackage")
        register.add_catch(pipeline_error, errors=["States.ALL"], result_path="$.error")
        report = sfn.Pass(self, "CostReport", parameters={
            "report.$": guard_path("report"), "model_package_arn.$": "$.registered.ModelPackageArn",
            "preparation.$": plan_path("preparation")})  # the raw data's preparation job and its cost ({}: none)
        return register, report

    def _state_machine(self, props: TrainingPipelineProps, definition: sfn.IChainable, arns: _Arns) -> None:
        """The state machine, its logs and what its role may do beyond what its tasks grant."""
        group_arn, package_arn = arns.group, arns.package
        log_group = logs.LogGroup(self, "Logs", retention=logs.RetentionDays.SIX_MONTHS)
        self.state_machine = sfn.StateMachine(
            self, "StateMachine", definition_body=sfn.DefinitionBody.from_chainable(definition),
            tracing_enabled=True, timeout=EXECUTION_TIMEOUT,
            logs=sfn.LogOptions(destination=log_group, level=sfn.LogLevel.ALL, include_execution_data=True))
        role = self.state_machine.role
        # The SDK integrations tag preparation jobs and packages at creation and pass the preparation role to
        # SageMaker; training jobs are created (tagged, the training role passed) by the launcher (launcher.py).
        # KMS: the job roles use the artifact key (OutputDataConfig, VolumeKmsKeyId), not this role.
        role.add_to_principal_policy(iam.PolicyStatement(actions=["sagemaker:AddTags"],
                                                         resources=[package_arn, group_arn, arns.processing]))
        role.add_to_principal_policy(iam.PolicyStatement(
            actions=["iam:PassRole"], resources=[props.preparation_role.role_arn, props.hub_fetch_role.role_arn],
            conditions={"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}}))
        # A run continues in a fresh execution of this state machine (spotrun/pipeline/continuation.py). A policy of its
        # own: on the role's default policy the state machine's ARN would form a cycle.
        iam.Policy(self, "ContinuesItself", roles=[role], statements=[iam.PolicyStatement(
            actions=["states:StartExecution"], resources=[self.state_machine.state_machine_arn])])

    def _estimate_reads_executions(self) -> None:
        """The estimate counts running executions (the stage's concurrency limit) and checks the execution a
        run resumes from. A policy of its own: on the function's default policy it would form a cycle (the state
        machine names the function, which would wait for a policy naming the state machine)."""
        stack = Stack.of(self)
        executions = stack.format_arn(service="states", resource="execution",
                                      resource_name=f"{self.state_machine.state_machine_name}:*",
                                      arn_format=ArnFormat.COLON_RESOURCE_NAME)
        policy = iam.Policy(self, "EstimateReadsExecutions", roles=[self.estimate_fn.role], statements=[
            iam.PolicyStatement(actions=["states:ListExecutions"], resources=[self.state_machine.state_machine_arn]),
            # GetExecutionHistory: a continued run's proof that its parent started it (spotrun/pipeline/continuation.py)
            iam.PolicyStatement(actions=["states:DescribeExecution", "states:GetExecutionHistory"],
                                resources=[executions])])
        acknowledge(policy, f"AwsSolutions-IAM5[Resource::{rendered(self, executions)}]",
                    "reads this state machine's executions only (execution ARNs are not known ahead)")

    def _canceller(self, props: TrainingPipelineProps, job_arn: str, processing_arn: str) -> None:
        """Execution ABORTED / FAILED / TIMED_OUT -> stop its jobs (spotrun.pipeline.plan.cancel, and the preparation
        job: spotrun/handlers/cancel.py)."""
        stack = Stack.of(self)
        self.cancel_fn = spotrun_function(
            self, "CancelFn", handler="spotrun.handlers.cancel.handler",
            description="spotrun canceller: an execution that ends early stops its training job",
            environment=CancelEnvironment(job_prefix=props.job_prefix,
                                          topic_arn=props.failures_topic.topic_arn).to_env())
        executions = stack.format_arn(service="states", resource="execution",
                                      resource_name=f"{self.state_machine.state_machine_name}:*",
                                      arn_format=ArnFormat.COLON_RESOURCE_NAME)
        self.cancel_fn.add_to_role_policy(iam.PolicyStatement(
            actions=["sagemaker:ListTags", "sagemaker:StopTrainingJob"], resources=[job_arn]))
        self.cancel_fn.add_to_role_policy(iam.PolicyStatement(
            actions=["sagemaker:ListTrainingJobs", "sagemaker:ListProcessingJobs"], resources=["*"]))
        self.cancel_fn.add_to_role_policy(iam.PolicyStatement(  # the execution's preparation job
            actions=["sagemaker:ListTags", "sagemaker:StopProcessingJob"], resources=[processing_arn]))
        self.cancel_fn.add_to_role_policy(iam.PolicyStatement(  # GetExecutionHistory: a continued run's proof
            actions=["states:DescribeExecution", "states:GetExecutionHistory"], resources=[executions]))
        props.failures_topic.grant_publish(self.cancel_fn)
        self.cancel_dlq = dead_letter_queue(self, "CancelDlq")
        self.cancel_rule = events.Rule(self, "ExecutionEnded", event_pattern=events.EventPattern(
            source=["aws.states"], detail_type=["Step Functions Execution Status Change"],
            detail={"stateMachineArn": [self.state_machine.state_machine_arn], "status": list(CANCEL_STATUSES)}))
        self.cancel_rule.add_target(targets.LambdaFunction(self.cancel_fn, retry_attempts=8,
                                                           dead_letter_queue=self.cancel_dlq))
        # EventBridge invokes it asynchronously: Lambda retries a failed invocation (a throttled stop), then the
        # event goes to this queue instead of being dropped (the DLQ above only takes undeliverable events).
        self.cancel_failures = on_failure_destination(self, "CancelFailures", self.cancel_fn)
        policy = self.cancel_fn.role.node.find_child("DefaultPolicy")
        acknowledge(policy, f"AwsSolutions-IAM5[Resource::{rendered(self, job_arn)}]",
                    "stops training jobs of this stage only: every job name starts with the stage's prefix")
        acknowledge(policy, "AwsSolutions-IAM5[Resource::*]",
                    "sagemaker:ListTrainingJobs and ListProcessingJobs support no resource scoping; the jobs it "
                    "stops are checked by name and execution tag and scoped by the statements above")
        acknowledge(policy, f"AwsSolutions-IAM5[Resource::{rendered(self, processing_arn)}]",
                    "stops preparation jobs of this stage only: every job name starts with the stage's prefix")
        acknowledge(policy, f"AwsSolutions-IAM5[Resource::{rendered(self, executions)}]",
                    "reads the input of this state machine's executions only (execution ARNs are not known ahead)")
        acknowledge(policy, "AwsSolutions-IAM5[Action::kms:GenerateDataKey*]",
                    "publishing to the KMS-encrypted failures topic needs data keys of that key only")

    def _acknowledge(self, job_arn: str, package_arn: str, group_arn: str, processing_arn: str) -> None:
        policy = self.state_machine.role.node.find_child("DefaultPolicy")
        acknowledge(policy, f"AwsSolutions-IAM5[Resource::{rendered(self, processing_arn)}]",
                    "preparation (processing) jobs of this stage only: every job name starts with the stage's prefix")
        acknowledge(policy, f"AwsSolutions-IAM5[Resource::{rendered(self, group_arn)}]",
                    "this stack's model package group: its name ends in a suffix unique to the stack instance")
        acknowledge(policy, f"AwsSolutions-IAM5[Resource::{rendered(self, job_arn)}]",
                    "training jobs of this stage only: every job name starts with the stage's prefix")
        acknowledge(policy, f"AwsSolutions-IAM5[Resource::{rendered(self, package_arn)}]",
                    "model package versions of this stack's group; version ARNs are not known in advance")
        for fn in (self.estimate_fn, self.guard_fn, self.prepare_fn, self.launcher.fn):
            acknowledge(policy, f"AwsSolutions-IAM5[Resource::{rendered(self, fn.function_arn)}:*]",
                        "LambdaInvoke grants the function's versions and aliases alongside the function")
        acknowledge(policy, "AwsSolutions-IAM5[Resource::*]",
                    "X-Ray tracing of the state machine: PutTraceSegments and sampling calls have no resource "
                    "scoping; log delivery (CloudWatch Logs vended logs) likewise")
        acknowledge(policy, "AwsSolutions-IAM5[Action::kms:GenerateDataKey*]",
                    "publishing to the KMS-encrypted failures topic needs data keys of that key only")
