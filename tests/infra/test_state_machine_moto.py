"""The synthesized state machine, executed by moto's Step Functions interpreter with the real handlers deciding.

Every SageMaker, S3 and SNS call runs against moto. moto's Lambda cannot run code without Docker, so its invoke is
replaced by a call of the real handler named in the template (spotrun.handlers.*) on exactly the payload the
state machine passes, with the function's synthesized environment: the handlers make their own AWS calls
(describe the job, list checkpoints, write the run record) inside moto.
moto's training jobs are Completed the moment they are created; `progress` stands in for SageMaker's progression
(the statuses it would report at each poll). moto has no StopTrainingJob: `_stop_training_job` below adds it
(the job goes to Stopping, as SageMaker's does).
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import importlib
import json
import os
import time
from typing import Callable
from unittest import mock

import boto3
import pytest
from moto import mock_aws
from moto.awslambda_simple.models import LambdaSimpleBackend
from moto.core.responses import ActionResult
from moto.sagemaker.models import sagemaker_backends
from moto.sagemaker.responses import SageMakerResponse
from moto.servicequotas.responses import ServiceQuotasResponse

from spotrun.handlers import cancel as cancel_handler
from spotrun.handlers import cost_guard
from spotrun.pipeline import guard as guard_rules
from spotrun.seams import COMPLETED_METRIC, CostGuardEnvironment, Guard, Plan
from tests.infra.render import render

REGION, ACCOUNT = "us-east-1", "123456789012"
BUCKET = "spotrun-artifacts-test"
GROUP = "spotrun-dev-models-0a1b2c3d"  # the group name rendered from the stack id (tests/infra/render.py)
RUN = {"version": 1, "name": "moto-run",
       "model": {"source": f"s3://{BUCKET}/models/tiny/"},
       "data": {"source": f"s3://{BUCKET}/datasets/tiny/", "seq_len": 128},
       "compute": {"instance_type": "ml.g5.2xlarge"},
       "budget": {"max_usd": 25}, "tags": {"team": "nlp"}}
RESOURCES = {"ArtifactsKeyA4B22E2B": f"arn:aws:kms:{REGION}:{ACCOUNT}:key/00000000-0000-0000-0000-000000000000"}


def _stop_training_job(self) -> ActionResult:
    job = self.sagemaker_backend.training_jobs[self._get_param("TrainingJobName")]
    job.training_job_status, job.secondary_status = "Stopping", "Stopping"
    return ActionResult({})


def start_execution_as_aws():
    """moto's `states:startExecution` integration hands the state's parameters to boto3 as written
    (StateMachineArn, Name, Input), which boto3's StartExecution does not know (stateMachineArn, name, input), and
    returns boto3's answer (executionArn, a datetime startDate); Step Functions takes the documented names and
    returns ExecutionArn and StartDate as JSON. Patched to do what the service does."""
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service_sfn import (
        StateTaskServiceSfn,
    )
    original = StateTaskServiceSfn._normalise_parameters

    def normalise(self, parameters, boto_service_name=None, service_action_name=None):
        original(self, parameters, boto_service_name, service_action_name)
        for key in list(parameters):
            parameters[key[0].lower() + key[1:]] = parameters.pop(key)

    evaluate = StateTaskServiceSfn._eval_service_task

    def answer(self, env, *args, **kwargs):  # the response as the service returns it: ExecutionArn, StartDate
        evaluate(self, env, *args, **kwargs)
        response = env.stack.pop()
        env.stack.append({k[0].upper() + k[1:]: v.isoformat() if isinstance(v, dt.datetime) else v
                          for k, v in response.items()})
    return _Patches(mock.patch.object(StateTaskServiceSfn, "_normalise_parameters", normalise),
                    mock.patch.object(StateTaskServiceSfn, "_eval_service_task", answer))


class _Patches:
    """Several mock.patch as one context manager."""

    def __init__(self, *patches):
        self.patches = patches

    def __enter__(self):
        for p in self.patches:
            p.__enter__()
        return self

    def __exit__(self, *exc):
        for p in reversed(self.patches):
            p.__exit__(*exc)
        return False


QUOTAS: list[dict] = []  # the account's SageMaker quotas (Service Quotas), set per test


def _list_service_quotas(self) -> str:
    assert json.loads(self.body)["ServiceCode"] == "sagemaker"
    return json.dumps({"Quotas": QUOTAS})


class Driver:
    """moto with the stack's resources, the rendered state machine, and the real handlers behind Lambda."""

    def __init__(self, synth):
        self.synth = synth
        # moto's jobs are Completed at once: by default, as a job that finished the run (its completion metric).
        self.progress: Callable[[object, int], None] = lambda job, poll: _mark_done(job)
        self.polls: dict[str, int] = {}
        self.payloads: dict[str, list[dict]] = {}
        self.functions: dict[str, dict] = {}

    def setup(self) -> None:
        self.s3 = boto3.client("s3", region_name=REGION)
        self.s3.create_bucket(Bucket=BUCKET)
        self.s3.put_object(Bucket=BUCKET, Key="models/tiny/config.json", Body=json.dumps(
            {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "vocab_size": 256}))
        self.s3.put_object(Bucket=BUCKET, Key="datasets/tiny/index.json", Body=json.dumps({"total_tokens": 5_000_000}))
        ddb = boto3.client("dynamodb", region_name=REGION)
        ddb.create_table(TableName="interruptions", BillingMode="PAY_PER_REQUEST",
                         KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"},
                                    {"AttributeName": "sk", "KeyType": "RANGE"}],
                         AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"},
                                               {"AttributeName": "sk", "AttributeType": "S"}])
        iam = boto3.client("iam", region_name=REGION)
        trust = json.dumps({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                                    "Principal": {"Service": "states.amazonaws.com"}}]})
        self.role_arn = iam.create_role(RoleName="sm-role", AssumeRolePolicyDocument=trust)["Role"]["Arn"]
        self.preparation_role_arn = iam.create_role(RoleName="preparation-role",
                                                    AssumeRolePolicyDocument=trust)["Role"]["Arn"]
        self.hub_fetch_role_arn = iam.create_role(RoleName="hub-fetch-role",
                                                  AssumeRolePolicyDocument=trust)["Role"]["Arn"]
        # What the launch function assumes, with the run's session tag, to create training jobs.
        self.launcher_role_arn = iam.create_role(RoleName="launcher-role",
                                                 AssumeRolePolicyDocument=trust)["Role"]["Arn"]
        self.topic = boto3.client("sns", region_name=REGION).create_topic(Name="failures")["TopicArn"]
        self.sagemaker = boto3.client("sagemaker", region_name=REGION)
        self.sagemaker.create_model_package_group(ModelPackageGroupName=GROUP)
        lam = boto3.client("lambda", region_name=REGION)
        self.arns = {}
        for logical, fn in self.synth.resources("AWS::Lambda::Function").items():
            self.arns[logical] = lam.create_function(
                FunctionName=logical, Runtime="python3.12", Role=self.role_arn, Handler=fn["Properties"]["Handler"],
                Code={"ZipFile": b"PK\x05\x06" + b"\x00" * 18})["FunctionArn"]
            env = {k: render(v, self.resolve) for k, v in fn["Properties"]["Environment"]["Variables"].items()}
            self.functions[logical] = {"handler": fn["Properties"]["Handler"], "env": env}
        _, sm = self.synth.one("AWS::StepFunctions::StateMachine")
        self.sfn = boto3.client("stepfunctions", region_name=REGION)
        self.sm_arn = self.sfn.create_state_machine(
            name="pipeline", definition=render(sm["Properties"]["DefinitionString"], self.resolve),
            roleArn=self.role_arn)["stateMachineArn"]

    def resolve(self, logical: str, attr: str | None) -> str:
        if logical == "ArtifactsBucket88671897":
            return BUCKET if attr is None else f"arn:aws:s3:::{BUCKET}"
        if logical in self.arns:
            return self.arns[logical]
        if logical.startswith("InterruptionEventsTable"):
            return "interruptions"
        if logical == "FailuresTopic8CFD5254":
            return self.topic
        if logical == "ExecutionRoleCDF74862":
            return self.role_arn
        if logical.startswith("PreparationRole"):
            return self.preparation_role_arn
        if logical.startswith("HubFetchRole"):
            return self.hub_fetch_role_arn
        if logical.startswith("PipelineLauncherRole"):
            return self.launcher_role_arn
        if logical in RESOURCES:
            return RESOURCES[logical]
        raise KeyError(logical)

    def invoke(self, backend, function_name, qualifier, body, headers, response_headers) -> bytes:
        logical = function_name.rsplit(":", 1)[-1] if function_name.startswith("arn:") else function_name
        fn = self.functions[logical]
        payload = json.loads(body)
        self.payloads.setdefault(logical, []).append(payload)
        if "guard" in payload:  # the cost guard: let "SageMaker" move the job on first
            name = payload["guard"]["job_name"]
            self.polls[name] = self.polls.get(name, 0) + 1
            self.progress(self.job(name), self.polls[name])
        module, _, attr = fn["handler"].rpartition(".")
        # Fast polls for the test; everything else is the synthesized environment.
        env = {**fn["env"], "AWS_REGION": REGION, "POLL_SECONDS": "1", "MAX_POLL_SECONDS": "1"}
        with mock.patch.dict(os.environ, env):
            return json.dumps(getattr(importlib.import_module(module), attr)(payload, None)).encode()

    def job(self, name: str):
        return sagemaker_backends[ACCOUNT][REGION].training_jobs[name]

    def start(self, name: str, run: dict) -> str:
        return self.sfn.start_execution(stateMachineArn=self.sm_arn, name=name, input=json.dumps(run))["executionArn"]

    # A bound on waiting, not a timing goal: moto's interpreter on 2 loaded cores took over 90 s for a run that
    # prepares its data first.
    def wait(self, arn: str, timeout: float = 600) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            desc = self.sfn.describe_execution(executionArn=arn)
            if desc["status"] != "RUNNING":
                return desc
            time.sleep(0.2)
        raise TimeoutError(arn)

    def execute(self, name: str, run: dict) -> dict:
        return self.wait(self.start(name, run))

    def chain(self, arn: str, timeout: float = 600) -> list[dict]:
        """The execution and every execution that continued its run (spotrun/pipeline/continuation.py), each ended."""
        out = [self.wait(arn, timeout)]
        while out[-1]["status"] == "SUCCEEDED" and "continued_as" in json.loads(out[-1].get("output") or "{}"):
            name = json.loads(out[-1]["output"])["continued_as"]
            out.append(self.wait(self.sm_arn.replace(":stateMachine:", ":execution:") + ":" + name, timeout))
        return out

    def history(self, arn: str) -> list[dict]:
        events, kwargs = [], {}
        while True:
            page = self.sfn.get_execution_history(executionArn=arn, maxResults=1000, **kwargs)
            events += page["events"]
            if not page.get("nextToken"):
                return events
            kwargs["nextToken"] = page["nextToken"]

    def failure(self, result: dict) -> dict:
        history = self.sfn.get_execution_history(executionArn=result["executionArn"])["events"]
        return [e for e in history if e["type"] == "ExecutionFailed"][0]["executionFailedEventDetails"]

    def plan_of(self, execution: str) -> dict:
        return next(p for p in self.functions_payloads("PipelineCostGuardFn") if p["plan"]["execution"] == execution
                    )["plan"]

    def functions_payloads(self, prefix: str) -> list[dict]:
        return [p for k, ps in self.payloads.items() if k.startswith(prefix) for p in ps]


@pytest.fixture
def aws(synth):
    driver = Driver(synth)
    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}, "lambda": {"use_docker": False}}), \
            mock.patch.object(LambdaSimpleBackend, "invoke", lambda backend, *a: driver.invoke(backend, *a)), \
            mock.patch.object(SageMakerResponse, "stop_training_job", _stop_training_job, create=True), \
            mock.patch.object(ServiceQuotasResponse, "list_service_quotas", _list_service_quotas, create=True):
        QUOTAS[:] = [{"ServiceCode": "sagemaker", "QuotaCode": "L-00000001", "Value": 2.0,
                      "QuotaName": "ml.g5.2xlarge for spot training job usage"}]
        driver.setup()
        yield driver


def _running(job, *, started_ago_s: float = 60) -> None:
    job.training_job_status, job.secondary_status = "InProgress", "Training"
    job.training_start_time = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=started_ago_s)
    job.training_end_time = None
    job.billable_time_in_seconds = None
    # Billed since it started training (the guard's running bound reads the transitions).
    job.secondary_status_transitions = [{"Status": "Training", "StartTime": job.training_start_time,
                                         "StatusMessage": "Training"}]


def _finished(job, status: str, secondary: str, *, billable: int, training: int | None = None,
              run_done: bool = True, **extra) -> None:
    """The job ended; a Completed job finished the run (the trainer's completion line) unless `run_done` is
    False (it ended a segment)."""
    job.training_job_status, job.secondary_status = status, secondary
    job.billable_time_in_seconds, job.training_time_in_seconds = billable, training or billable
    for key, value in extra.items():
        setattr(job, key, value)
    if status == "Completed" and run_done:
        _mark_done(job)


def _mark_done(job) -> None:
    metrics = [m for m in getattr(job, "final_metric_data_list", None) or [] if m["MetricName"] != COMPLETED_METRIC]
    if job.training_job_status == "Completed":
        job.final_metric_data_list = metrics + [{"MetricName": COMPLETED_METRIC, "Value": 100.0,
                                                 "Timestamp": job.creation_time}]


def test_spot_run_polls_completes_and_registers_a_deployable_package(aws):
    def progress(job, poll):
        if poll == 1:
            _running(job)
            job.secondary_status_transitions = [{"Status": "Interrupted", "StartTime": job.creation_time}]
        else:
            _finished(job, "Completed", "Completed", billable=900, training=3000,
                      final_metric_data_list=[{"MetricName": "train:loss", "Value": 2.5,
                                               "Timestamp": job.creation_time}])
    aws.progress = progress
    result = aws.execute("good", RUN)
    assert result["status"] == "SUCCEEDED", result
    p = aws.plan_of("good")
    job = aws.sagemaker.describe_training_job(TrainingJobName=p["job_name"])
    assert job["EnableManagedSpotTraining"] is True
    assert job["EnableNetworkIsolation"] is True and p["network_isolation"] is True  # no tracking server named
    assert job["CheckpointConfig"] == {"S3Uri": f"s3://{BUCKET}/checkpoints/moto-run/good/",
                                       "LocalPath": "/opt/ml/checkpoints"}
    assert "VolumeKmsKeyId" not in job["ResourceConfig"]  # g5: local NVMe
    stop = job["StoppingCondition"]
    assert stop["MaxWaitTimeInSeconds"] >= stop["MaxRuntimeInSeconds"] == p["max_runtime_seconds"]
    assert job["HyperParameters"] == p["hyperparameters"]
    tags = {t["Key"]: t["Value"] for t in aws.sagemaker.list_tags(ResourceArn=job["TrainingJobArn"])["Tags"]}
    assert tags["run"] == "moto-run" and tags["execution"] == "good" and tags["cost-center"] == "ml-platform"

    packages = aws.sagemaker.list_model_packages(ModelPackageGroupName=GROUP)["ModelPackageSummaryList"]
    assert len(packages) == 1 and packages[0]["ModelApprovalStatus"] == "PendingManualApproval"
    package = aws.sagemaker.describe_model_package(ModelPackageName=packages[0]["ModelPackageArn"])
    container = package["InferenceSpecification"]["Containers"][0]
    assert "huggingface-pytorch-tgi-inference" in container["Image"]
    assert container["Environment"] == {"HF_MODEL_ID": "/opt/ml/model"}
    assert container["ModelDataUrl"] == job["ModelArtifacts"]["S3ModelArtifacts"]
    meta = package["CustomerMetadataProperties"]
    assert meta["artifact"] == "full-model" and meta["final_loss"] == "2.5" and meta["interruptions"] == "1"
    assert meta["data_source"] == f"s3://{BUCKET}/datasets/tiny/" and meta["spot_savings_pct"] == "70.0"

    output = json.loads(result["output"])
    assert output["model_package_arn"] == packages[0]["ModelPackageArn"]
    # billable x on-demand
    assert output["report"]["cost_usd"] == pytest.approx(900 / 3600 * p["usd_per_hour"], abs=1e-6)
    # The guard was called with exactly what the state machine passes: the plan, its previous guard and the
    # template of a sentinel's request (spotrun/pipeline/guard.py `sentinel_request`).
    assert all(set(payload) == {"plan", "guard", "sentinel_request"}
               for payload in aws.functions_payloads("PipelineCostGuardFn"))


def test_on_demand_run_creates_a_job_without_spot_with_its_warm_pool(aws):
    run = copy.deepcopy(RUN)
    run["compute"].update(spot=False, warm_pool_minutes=10)
    assert aws.execute("on-demand", run)["status"] == "SUCCEEDED"
    p = aws.plan_of("on-demand")
    job = aws.sagemaker.describe_training_job(TrainingJobName=p["job_name"])
    assert job["EnableManagedSpotTraining"] is False
    assert "MaxWaitTimeInSeconds" not in job["StoppingCondition"]
    assert job["ResourceConfig"]["KeepAlivePeriodInSeconds"] == 600
    assert job["CheckpointConfig"]["S3Uri"] == f"s3://{BUCKET}/checkpoints/moto-run/on-demand/"


def test_a_run_that_spends_its_cap_ends_at_maxruntime_and_fails_as_over_budget(aws):
    run = copy.deepcopy(RUN)
    run["budget"]["max_usd"] = 1.0  # 2,376 s at $1.515/h on-demand: less than the run's longest job (1 h)

    def progress(job, poll):
        if poll == 1:
            _running(job, started_ago_s=600)
        else:  # SageMaker ended it at its MaxRuntime (what the cap allows), billed at on-demand rates all along
            _finished(job, "Stopped", "MaxRuntimeExceeded", billable=job.stopping_condition["MaxRuntimeInSeconds"])
    aws.progress = progress
    result = aws.execute("capped", run)
    assert result["status"] == "FAILED"
    failure = aws.failure(result)
    assert failure["error"] == "OverBudget" and "stopped at the cost cap: $0.95 billed" in failure["cause"]
    p = aws.plan_of("capped")
    # The job's MaxRuntime is what $1 buys at $1.515/h on-demand, less the 120 s a stop bills.
    assert aws.job(p["job_name"]).stopping_condition["MaxRuntimeInSeconds"] == int(1.0 / (1.515 / 3600) - 120)


def test_spot_that_never_came_falls_back_to_on_demand_on_the_same_checkpoints(aws):
    run = copy.deepcopy(RUN)
    run["compute"]["on_demand_fallback"] = True

    def progress(job, poll):
        if job.training_job_name == aws.plan_of("fallback")["fallback_job_name"]:
            _finished(job, "Completed", "Completed", billable=600)
        else:
            _finished(job, "Stopped", "MaxWaitTimeExceeded", billable=120,
                      failure_reason="MaxWaitTimeExceeded: no spot capacity")
    aws.progress = progress
    result = aws.execute("fallback", run)
    assert result["status"] == "SUCCEEDED", result
    p = aws.plan_of("fallback")
    spot_job = aws.sagemaker.describe_training_job(TrainingJobName=p["job_name"])
    od_job = aws.sagemaker.describe_training_job(TrainingJobName=p["fallback_job_name"])
    assert spot_job["EnableManagedSpotTraining"] is True and od_job["EnableManagedSpotTraining"] is False
    assert od_job["CheckpointConfig"] == spot_job["CheckpointConfig"]
    report = json.loads(result["output"])["report"]
    assert report["cost_usd"] == pytest.approx((120 + 600) / 3600 * p["usd_per_hour"], abs=1e-6)


@pytest.mark.parametrize("fallback, status, reason", [
    (False, ("Stopped", "MaxWaitTimeExceeded"), "no spot capacity within MaxWait"),
    (True, ("Failed", "Failed"), "AlgorithmError: CUDA out of memory"),
])
def test_jobs_that_end_without_a_model_fail_the_run_with_the_reason(aws, fallback, status, reason):
    run = copy.deepcopy(RUN)
    run["compute"]["on_demand_fallback"] = fallback
    aws.progress = lambda job, poll: _finished(job, *status, billable=60, failure_reason=reason)
    result = aws.execute(f"ends-{fallback}", run)
    assert result["status"] == "FAILED"
    failure = aws.failure(result)
    assert failure["error"] == "TrainingFailed" and reason in failure["cause"]
    assert aws.sagemaker.list_model_packages(ModelPackageGroupName=GROUP)["ModelPackageSummaryList"] == []


def test_stopping_the_execution_stops_its_training_job(aws):
    aws.progress = lambda job, poll: _running(job)
    arn = aws.start("aborted", RUN)
    deadline = time.monotonic() + 60
    while not aws.polls and time.monotonic() < deadline:
        time.sleep(0.2)
    aws.sfn.stop_execution(executionArn=arn)
    desc = aws.wait(arn)
    assert desc["status"] == "ABORTED"
    p = aws.plan_of("aborted")
    assert aws.job(p["job_name"]).training_job_status == "InProgress"  # Step Functions itself cleans nothing up
    # The event EventBridge delivers for it (tests/infra/test_security.py checks the rule matches it).
    event = {"source": "aws.states", "detail-type": "Step Functions Execution Status Change",
             "detail": {"executionArn": arn, "stateMachineArn": aws.sm_arn, "name": "aborted", "status": "ABORTED",
                        "startDate": int(desc["startDate"].timestamp() * 1000), "input": None}}
    env = aws.functions[next(k for k in aws.functions if k.startswith("PipelineCancelFn"))]["env"]
    with mock.patch.dict(os.environ, {**env, "AWS_REGION": REGION}):
        assert cancel_handler.handler(event, None) == {"stopped": [p["job_name"]]}  # input read back from SFN
        assert cancel_handler.handler(event, None) == {"stopped": []}  # a duplicate delivery does nothing
    assert aws.job(p["job_name"]).training_job_status == "Stopping"


def test_stopping_the_execution_stops_its_training_job_and_its_sentinel(aws):
    """A sentinel created by the cost guard's own create path (the launcher role, the run's tags) beside the
    running job: the canceller stops both, and only this execution's."""
    aws.progress = lambda job, poll: _running(job)
    arn = aws.start("aborted-sentinel", RUN)
    deadline = time.monotonic() + 60
    while not aws.polls and time.monotonic() < deadline:
        time.sleep(0.2)
    payload = aws.functions_payloads("PipelineCostGuardFn")[-1]
    p, before = Plan.from_json(payload["plan"]), Guard.from_json(payload["guard"])
    after = dataclasses.replace(before, sentinel_name=guard_rules.sentinel_name(p, 1), sentinels=1,
                                sentinel_max_runtime_seconds=3600, sentinel_max_wait_seconds=3600)
    env = aws.functions[next(k for k in aws.functions if k.startswith("PipelineCostGuardFn"))]["env"]
    with mock.patch.dict(os.environ, {**env, "AWS_REGION": REGION}):
        cost_guard._sentinel_calls(CostGuardEnvironment.from_env(os.environ), aws.sagemaker, before, after,
                                   payload["sentinel_request"])
    sentinel = aws.sagemaker.describe_training_job(TrainingJobName=after.sentinel_name)
    assert sentinel["EnableManagedSpotTraining"] and sentinel["ResourceConfig"] == payload["plan"][
        "resource_config_spot"]
    _running(aws.job(after.sentinel_name))
    aws.sfn.stop_execution(executionArn=arn)
    desc = aws.wait(arn)
    event = {"source": "aws.states", "detail-type": "Step Functions Execution Status Change",
             "detail": {"executionArn": arn, "stateMachineArn": aws.sm_arn, "name": "aborted-sentinel",
                        "status": "ABORTED", "startDate": int(desc["startDate"].timestamp() * 1000), "input": None}}
    env = aws.functions[next(k for k in aws.functions if k.startswith("PipelineCancelFn"))]["env"]
    with mock.patch.dict(os.environ, {**env, "AWS_REGION": REGION}):
        assert sorted(cancel_handler.handler(event, None)["stopped"]) == sorted([p.job_name, after.sentinel_name])
    assert aws.job(after.sentinel_name).training_job_status == "Stopping"


@pytest.mark.parametrize("mutate, error", [
    (lambda r: r.update(budget={"max_usd": 0.01}), "OverBudget"),
    (lambda r: r["data"].update(source="s3://somewhere-else/datasets/x/"), "InvalidRun"),
    (lambda r: r["checkpoint"].update(resume_from="no-such-execution"), "InvalidRun"),
    # The synthesized stage lists no MLflow tracking server: a run naming one would train without network isolation.
    (lambda r: r.update(tracking={"mlflow_uri": "https://mlflow.example.com"}), "InvalidRun"),
])
def test_refused_runs_fail_by_name_before_any_job_is_created(aws, mutate, error):
    run = copy.deepcopy(RUN)
    run["checkpoint"] = {}
    mutate(run)
    result = aws.execute(error, run)
    assert result["status"] == "FAILED"
    failure = aws.failure(result)
    assert failure["error"] == error and failure["cause"]
    assert aws.sagemaker.list_training_jobs()["TrainingJobSummaries"] == []


def test_a_run_the_accounts_quota_cannot_hold_fails_before_any_job_is_created(aws):
    QUOTAS[0]["Value"] = 0.0
    result = aws.execute("no-quota", RUN)
    failure = aws.failure(result)
    assert failure["error"] == "InvalidRun" and "ml.g5.2xlarge for spot training job usage" in failure["cause"]
    assert aws.sagemaker.list_training_jobs()["TrainingJobSummaries"] == []


GATED_RUN = {**RUN, "data": {**RUN["data"], "validation": f"s3://{BUCKET}/datasets/tiny-val/"},
             "registry": {"gate": {"max_val_loss": 2.5, "min_improvement": 0.1}}}


def _completed_with(base: float | None, final: float | None):
    """SageMaker's FinalMetricDataList as the trainer's run_completed line leaves it (MetricDefinitions)."""
    def progress(job, poll):
        metrics = [{"MetricName": "train:loss", "Value": 2.0, "Timestamp": job.creation_time}]
        metrics += [{"MetricName": name, "Value": value, "Timestamp": job.creation_time}
                    for name, value in (("train:base_val_loss", base), ("train:exported_val_loss", final))
                    if value is not None]
        _finished(job, "Completed", "Completed", billable=600, training=1200, final_metric_data_list=metrics)
    return progress


def test_a_model_that_passes_the_gate_is_registered_with_both_validation_losses(aws):
    aws.progress = _completed_with(3.2, 2.25)  # 29.7% better than the base and under 2.5
    aws.s3.put_object(Bucket=BUCKET, Key="datasets/tiny-val/index.json", Body=json.dumps({"total_tokens": 50_000}))
    result = aws.execute("gate-pass", GATED_RUN)
    assert result["status"] == "SUCCEEDED", result
    job = aws.sagemaker.describe_training_job(TrainingJobName=aws.plan_of("gate-pass")["job_name"])
    channels = {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in job["InputDataConfig"]}
    assert channels["validation"] == f"s3://{BUCKET}/datasets/tiny-val/"
    packages = aws.sagemaker.list_model_packages(ModelPackageGroupName=GROUP)["ModelPackageSummaryList"]
    assert len(packages) == 1
    meta = aws.sagemaker.describe_model_package(ModelPackageName=packages[0]["ModelPackageArn"])[
        "CustomerMetadataProperties"]
    assert (meta["base_val_loss"], meta["exported_val_loss"]) == ("3.2", "2.25")


@pytest.mark.parametrize("base, final, why", [
    (3.2, 3.0, "improvement below min_improvement 10.00%"),  # 6.25% better: not enough
    (9.0, 2.6, "above max_val_loss 2.5"),
    (3.2, None, "the run reported no validation loss"),
])
def test_a_model_that_fails_the_gate_ends_in_gate_failed_with_both_losses_and_is_not_registered(aws, base, final,
                                                                                               why):
    aws.progress = _completed_with(base, final)
    aws.s3.put_object(Bucket=BUCKET, Key="datasets/tiny-val/index.json", Body=json.dumps({"total_tokens": 50_000}))
    result = aws.execute("gate-fail", GATED_RUN)
    assert result["status"] == "FAILED", result
    failure = aws.failure(result)
    job = aws.sagemaker.describe_training_job(TrainingJobName=aws.plan_of("gate-fail")["job_name"])
    assert failure["error"] == "GateFailed" and why in failure["cause"]
    assert f"base model's {base:.4f}" in failure["cause"]
    loss = f"{final:.4f}" if final else "None"
    assert f"exported weights' validation loss {loss}" in failure["cause"]
    # The artifact stays where SageMaker put it, and the cause says where.
    assert job["ModelArtifacts"]["S3ModelArtifacts"] in failure["cause"]
    assert aws.sagemaker.list_model_packages(ModelPackageGroupName=GROUP)["ModelPackageSummaryList"] == []
