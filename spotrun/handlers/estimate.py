"""Estimate Lambda: the first state of the training pipeline.

Input: {"run": <run JSON>, "execution": <execution name>, "started": <execution start time>}. Output: a plan
(spotrun.seams.Plan) the state machine reads. A run that must not start returns status InvalidRun or OverBudget
with the reason (the state machine turns them into named failures before anything is created); otherwise status
"ok" with every value CreateTrainingJob needs. A run whose data.source is raw text under datasets/ is answered
"Prepare" with the preparation job (spotrun/preparation.py), and planned when the state machine calls again with
what the job made (`prepared`: the prepared shards, and its bill, spent before the first job).

Besides the planner's rules, this is where the deployment's facts apply: the region's on-demand prices (a region
the catalog has no prices for is refused), the stage's allowed instance types, the account's SageMaker service
quota for the chosen type (Service Quotas), and the checkpoint prefix: one per execution,
`checkpoints/<run>/<execution>/`, or an earlier execution's when the run names it in `checkpoint.resume_from` and
the model shape and data match what that execution recorded in `spotrun-run.json` there.
Environment (read here only, in `handler`): see `PipelineSettings.from_env`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from dataclasses import dataclass
from typing import Any, Callable

from ..aws_text import TAG_VALUE_MAX, aws_text_ok
from ..contract import RunSpec, RunValidationError, parse_run
from ..gate import gate_of
from ..planner import estimate, load_catalog, regional_catalog, startup_seconds
from ..preparation import PreparationSettings, plan_step
from ..refusal import Refusal
from ..seams import EXECUTION_TAG, METHOD_TAG, SHAPE_TAG, VALIDATION_CHANNEL, Plan, PlanStatus, StopNotice
from ..segments import SEGMENT_SUFFIX_MAX, segment_job_name
from ..sources import read_sources
from ..validate import Target, check_target, pipeline_hyperparameters, validation_uri
from .performance import shape_key

CONTRACT_KEYS = ("parameters", "trainable_parameters", "training_flops", "gpu_hours", "instance_type",
                 "instance_count", "max_runtime_seconds", "max_wait_seconds", "checkpoint_bytes", "spot_policy",
                 "notice_upload_gb_per_s", "checkpoint_interval_seconds", "cost_usd", "warnings", "utilization",
                 "utilization_source", "segments", "wall_seconds", "expected_overhead_seconds",
                 "checkpoint_policy", "tokens", "expected_interruptions", "evaluation_seconds")  # the report's
MAX_JOB_NAME = 63
# Every package is registered for review: approval is a separate, permissioned step (UpdateModelPackage).
REGISTRATION_STATUS = "PendingManualApproval"
RUN_RECORD = "spotrun-run.json"  # what an execution trained, beside its checkpoints: checked on resume_from
QUOTA_SERVICE = "sagemaker"


@dataclass(frozen=True)
class PipelineSettings:
    bucket: str
    job_prefix: str
    model_package_group: str
    poll_seconds: int
    project: str
    stage: str
    cost_center: str
    region: str = "us-east-1"
    max_poll_seconds: int = 4 * 3600
    volume_kms_key_arn: str = ""  # sent only for instance types without local storage
    allowed_instance_types: tuple[str, ...] = ()  # empty: every type of the catalog
    # The stage's maxima (stacks/config.py); 0: no limit.
    max_usd_per_run: float = 0.0
    max_instances_per_run: int = 0
    max_concurrent_runs: int = 0
    # The MLflow tracking servers a run's tracking.mlflow_uri may name (stacks/config.py); empty: none.
    mlflow_tracking_servers: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, env: dict[str, str]) -> "PipelineSettings":
        allowed = tuple(t for t in env.get("ALLOWED_INSTANCE_TYPES", "").split(",") if t)
        return cls(bucket=env["BUCKET_NAME"], job_prefix=env["JOB_PREFIX"],
                   model_package_group=env["MODEL_PACKAGE_GROUP"], poll_seconds=int(env.get("POLL_SECONDS", "60")),
                   project=env.get("PROJECT", "spotrun"), stage=env.get("STAGE", ""),
                   cost_center=env.get("COST_CENTER", ""), region=env.get("AWS_REGION", "us-east-1"),
                   max_poll_seconds=int(env.get("MAX_POLL_SECONDS", str(4 * 3600))),
                   volume_kms_key_arn=env.get("VOLUME_KMS_KEY_ARN", ""), allowed_instance_types=allowed,
                   max_usd_per_run=float(env.get("MAX_USD_PER_RUN", "0")),
                   max_instances_per_run=int(env.get("MAX_INSTANCES_PER_RUN", "0")),
                   max_concurrent_runs=int(env.get("MAX_CONCURRENT_RUNS", "0")),
                   mlflow_tracking_servers=tuple(s for s in env.get("MLFLOW_TRACKING_SERVERS", "").split(",") if s))


def job_name(settings: PipelineSettings, run_name: str, execution: str) -> str:
    suffix = hashlib.sha256(execution.encode()).hexdigest()[:6]
    room = MAX_JOB_NAME - len(settings.job_prefix) - len(suffix) - 1 - SEGMENT_SUFFIX_MAX
    return f"{settings.job_prefix}{run_name[:room].rstrip('-')}-{suffix}"


def check_execution_name(execution: str) -> None:
    """The execution's name becomes the `execution` tag of its jobs (what ties a job to its execution): refuse a
    name Step Functions accepts but a tag value does not (`retrain(2)`), rather than tag a look-alike."""
    if not execution or len(execution) > TAG_VALUE_MAX or not aws_text_ok(execution):
        raise RunValidationError("execution", execution, "an execution name of letters, digits and _.:/=+-@ only "
                                 "(it is the training jobs' `execution` tag, whose pattern allows no other "
                                 "characters); e.g. retrain-2 instead of retrain(2)")


def _channel(name: str, uri: str) -> dict:
    return {"ChannelName": name, "InputMode": "FastFile",
            "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": uri,
                                            "S3DataDistributionType": "FullyReplicated"}}}


def resource_config(instance_type: str, count: int, volume_gb: int, settings: PipelineSettings, catalog: dict,
                    keep_alive_seconds: int | None = None) -> dict:
    """ResourceConfig as CreateTrainingJob accepts it.

    NOTE: "You can't request a VolumeKmsKeyId when using an instance type with local storage" (API reference,
    ResourceConfig); the SageMaker Python SDK drops it for those types too. Local NVMe is encrypted by the
    hardware; the key is sent only for types without local storage.
    """
    out: dict = {"InstanceType": instance_type, "InstanceCount": count, "VolumeSizeInGB": volume_gb}
    family = instance_type.split(".")[1]
    if settings.volume_kms_key_arn and not catalog["families"][family].get("local_storage", False):
        out["VolumeKmsKeyId"] = settings.volume_kms_key_arn
    if keep_alive_seconds:
        out["KeepAlivePeriodInSeconds"] = keep_alive_seconds
    return out


def run_record(run: RunSpec, model_config: dict | None, tokens: int | None, parameters: int) -> dict:
    """What makes checkpoints resumable by a later execution: the model's shape and the data."""
    shape = json.dumps(model_config or run.model.config or {}, sort_keys=True, separators=(",", ":"))
    return {"run": run.name, "method": run.training.method, "parameters": parameters,
            "model_shape_sha256": hashlib.sha256(shape.encode()).hexdigest(),
            "data_source": run.data.source, "data_tokens": tokens or run.data.tokens, "seq_len": run.data.seq_len}


def _check_resume(record: dict, s3_client: Any, bucket: str, prefix: str, resume_from: str) -> None:
    from botocore.exceptions import ClientError

    try:
        earlier = json.loads(s3_client.get_object(Bucket=bucket, Key=prefix + RUN_RECORD)["Body"].read())
    except ClientError:
        raise RunValidationError("checkpoint.resume_from", resume_from,
                                 f"an earlier execution of run {record['run']} (nothing recorded under "
                                 f"s3://{bucket}/{prefix})") from None
    for what, keys in (("model shape", ("method", "parameters", "model_shape_sha256")),
                       ("data", ("data_source", "data_tokens", "seq_len"))):
        differ = [k for k in keys if earlier.get(k) != record[k]]
        if differ:
            raise RunValidationError("checkpoint.resume_from", resume_from,
                                     f"an execution trained on the same {what}: {differ[0]} was "
                                     f"{earlier.get(differ[0])!r}, this run has {record[differ[0]]!r}")


def check_resumable(run: RunSpec, name: str, found: tuple[str, str | None] | None) -> None:
    """`checkpoint.resume_from` names an execution of this pipeline, of the same run, that has ended: a running
    one still writes its checkpoints, and another run's are not this run's."""
    if found is None:
        raise RunValidationError("checkpoint.resume_from", name, f"an ended execution of run {run.name} of this "
                                 "pipeline (no execution has this name)")
    status, run_name = found
    if status == "RUNNING":
        raise RunValidationError("checkpoint.resume_from", name, "an execution that has ended (this one is still "
                                 "running and writing its checkpoints: stop it first, or wait)")
    if run_name != run.name:
        raise RunValidationError("checkpoint.resume_from", name, f"an execution of run {run.name} (this one ran "
                                 f"{run_name!r})")


def check_quota(quotas_client: Any, instance_type: str, count: int, spot: bool) -> None:
    """Refuse a run the account's SageMaker quota cannot hold (Service Quotas; quotas are per instance type)."""
    from botocore.exceptions import ClientError

    name = f"{instance_type} for {'spot ' if spot else ''}training job usage"
    try:
        pages = list(quotas_client.get_paginator("list_service_quotas").paginate(ServiceCode=QUOTA_SERVICE))
    except ClientError as exc:
        if exc.response["Error"]["Code"] == "NoSuchResourceException":
            return  # Service Quotas has no SageMaker quotas in this region: nothing to check against
        raise
    for page in pages:
        for quota in page.get("Quotas", []):
            if quota.get("QuotaName") == name:
                if quota.get("Value", 0) < count:
                    raise RunValidationError(
                        "compute.instance_type", instance_type,
                        f"a type with quota for {count} instance(s): the account's SageMaker quota "
                        f"\"{name}\" ({quota.get('QuotaCode')}) is {quota.get('Value', 0):g}; raise it in the "
                        f"Service Quotas console or with `aws service-quotas request-service-quota-increase "
                        f"--service-code sagemaker --quota-code {quota.get('QuotaCode')} --desired-value {count}`")
                return
    # NOTE: a quota that is not listed is not refused: Service Quotas lists only quotas that exist in the region.


def check_stage_limits(run: RunSpec, settings: PipelineSettings, running_executions: int | None) -> None:
    """The stage's maxima (stacks/config.py): the cap per run, instances per run, runs at once; and the tracking
    servers a run may name."""
    where = f"stage {settings.stage or '?'}'s limit in stacks/config.py"
    if settings.max_usd_per_run and run.max_usd > settings.max_usd_per_run:
        raise RunValidationError("budget.max_usd", run.max_usd, f"at most {settings.max_usd_per_run:,.2f} "
                                 f"(max_usd_per_run, {where})")
    count = run.compute.instance_count
    if settings.max_instances_per_run and count is not None and count > settings.max_instances_per_run:
        raise RunValidationError("compute.instance_count", count, f"at most {settings.max_instances_per_run} "
                                 f"(max_instances_per_run, {where})")
    uri = run.tracking.mlflow_uri
    if uri and uri not in settings.mlflow_tracking_servers:  # a job that tracks runs without network isolation
        listed = ", ".join(settings.mlflow_tracking_servers) or "none"
        raise RunValidationError("tracking.mlflow_uri", uri, f"one of the stage's tracking servers: {listed} "
                                 f"(mlflow_tracking_servers, {where})")
    if settings.max_concurrent_runs and running_executions is not None and \
            running_executions > settings.max_concurrent_runs:
        raise RunValidationError("run", f"{running_executions} running executions", f"at most "
                                 f"{settings.max_concurrent_runs} at once (max_concurrent_runs, {where}): start it "
                                 "when one has ended")


def deployment_catalog(catalog: dict, settings: PipelineSettings, run: RunSpec) -> dict:
    """The catalog as this deployment may use it: the region's prices, the stage's allowed instance types, and
    `auto` counts within the stage's instances per run."""
    regional = regional_catalog(catalog, settings.region)
    if settings.max_instances_per_run:
        regional["defaults"]["max_auto_instance_count"] = min(regional["defaults"]["max_auto_instance_count"],
                                                              settings.max_instances_per_run)
    allowed = settings.allowed_instance_types
    if allowed:
        wanted = run.compute.instance_type
        if wanted != "auto" and wanted not in allowed:
            raise RunValidationError("compute.instance_type", wanted,
                                     f"a type this stage allows: {', '.join(allowed)} (or auto)")
        regional["instances"] = {t: s for t, s in regional["instances"].items() if t in allowed}
    return regional


def plan(run_raw: Any, execution: str, settings: PipelineSettings, *, s3_client: Any = None,
         rates: dict[str, float] | None = None, catalog: dict | None = None, quotas_client: Any = None,
         started: str = "", mfu_lookup: Callable[[str, str], dict[str, tuple[float, int]]] | None = None,
         running_executions: int | None = None,
         execution_status: Callable[[str], tuple[str, str | None] | None] | None = None,
         preparation: PreparationSettings | None = None, prepared: dict | None = None) -> dict:
    """The plan for one execution (see the module docstring); clients None skip the checks that need them.

    `running_executions`: executions of the pipeline running now, this one included (the stage's concurrency
    limit); `execution_status(name)`: (status, run name) of an execution of the pipeline, None if none has it
    (what `checkpoint.resume_from` may name).

    `mfu_lookup(shape, method)`: instance type -> (MFU, runs) measured by earlier runs (performance.py).
    `preparation`: the stage's preparation settings (None: raw data.source is not prepared here, as in the CLI);
    `prepared`: what this execution's preparation job made (the finish step's output; spotrun/preparation.py).
    """
    catalog = catalog or load_catalog()
    shape = None
    try:
        check_execution_name(execution)
        # The same rules `spotrun validate --stage` applies (spotrun/validate.py).
        run: RunSpec = parse_run(run_raw)
        check_stage_limits(run, settings, running_executions)
        catalog = deployment_catalog(catalog, settings, run)
        data_uri, model_uri = check_target(run, Target(settings.bucket, settings.model_package_group))
        cap, done = run.max_usd, None
        if preparation is not None:  # raw text under datasets/: prepared first (spotrun/preparation.py)
            run, done, instead = plan_step(run, s3_client, pipeline=settings, settings=preparation, catalog=catalog,
                                           execution=execution, prepared=prepared)
            if instead is not None:
                if instead["status"] == PlanStatus.PREPARE.value:
                    check_before_preparing(run, quotas_client, execution_status)
                return instead
            data_uri = done.data_source if done else data_uri
        sources = read_sources(run, s3_client=s3_client)
        model_config, tokens = sources.model_config, sources.tokens
        shape = shape_key(run.model.config or model_config) if (run.model.config or model_config) else None
        measured = mfu_lookup(shape, run.training.method) if (mfu_lookup and shape) else None
        est = estimate(run, catalog=catalog, model_config=model_config, data_tokens=tokens,
                       recorded_rates=rates, recorded_mfu=measured, validation_tokens=sources.validation_tokens)
        hyper = pipeline_hyperparameters(run, est)
        from ..simulate.choose import spot_policy  # the chosen spot policy and its odds (stdlib only)

        est.spot_policy = spot_policy(run, est, catalog)
    except Refusal as exc:  # the contract, the stage's rules, the sources or the planner
        return exc.result(CONTRACT_KEYS)

    try:
        if run.checkpoint.resume_from is not None and execution_status is not None:
            check_resumable(run, run.checkpoint.resume_from, execution_status(run.checkpoint.resume_from))
        out = _ok_plan(run, est, hyper, execution, started, settings, catalog, model_config, tokens, data_uri,
                       model_uri, s3_client, quotas_client, shape)
        if done is not None:  # the cap is the run's; the preparation's cost is spent before the first job
            out.update(max_usd=cap, spent_before_usd=done.cost_usd, preparation=dataclasses.asdict(done))
        return out
    except Refusal as exc:
        return exc.result(CONTRACT_KEYS)


def check_approval_status(run: RunSpec) -> None:
    if run.approval_status != REGISTRATION_STATUS:
        raise RunValidationError("registry.approval_status", run.approval_status,
                                 f"{REGISTRATION_STATUS}: the pipeline registers every model for review; approving "
                                 "it is a separate, permissioned step (aws sagemaker update-model-package "
                                 "--model-approval-status Approved)")


def check_before_preparing(run: RunSpec, quotas_client: Any, execution_status: Any) -> None:
    """What would refuse the run after its preparation and does not depend on the tokens: checked before its
    preparation job bills anything (the quota only for an explicit instance type)."""
    check_approval_status(run)
    if run.checkpoint.resume_from is not None and execution_status is not None:
        check_resumable(run, run.checkpoint.resume_from, execution_status(run.checkpoint.resume_from))
    if quotas_client is not None and run.compute.instance_type != "auto":
        check_quota(quotas_client, run.compute.instance_type, run.compute.instance_count or 1, run.compute.spot)


def _ok_plan(run: RunSpec, est: Any, hyper: dict, execution: str, started: str, settings: PipelineSettings,
             catalog: dict, model_config: dict | None, tokens: int | None, data_uri: str, model_uri: str | None,
             s3_client: Any, quotas_client: Any, shape: str | None) -> dict:
    check_approval_status(run)
    if quotas_client is not None:
        check_quota(quotas_client, est.instance_type, est.instance_count, run.compute.spot)
    record = run_record(run, model_config, tokens, est.parameters)
    ckpt_prefix = f"checkpoints/{run.name}/{run.checkpoint.resume_from or execution}/"
    if run.checkpoint.resume_from is not None:
        if s3_client is None:
            raise RunValidationError("checkpoint.resume_from", run.checkpoint.resume_from,
                                     "nothing here: resuming needs the artifact bucket to check the earlier run")
        _check_resume(record, s3_client, settings.bucket, ckpt_prefix, run.checkpoint.resume_from)
    elif s3_client is not None:
        s3_client.put_object(Bucket=settings.bucket, Key=ckpt_prefix + RUN_RECORD,
                             Body=json.dumps(record, indent=1).encode())
    channels = [_channel("train", data_uri)] + ([_channel("model", model_uri)] if model_uri else [])
    held_out = validation_uri(run, Target(settings.bucket, settings.model_package_group))
    channels += [_channel(VALIDATION_CHANNEL, held_out)] if held_out else []
    name = job_name(settings, run.name, execution)
    tags = {"project": settings.project, "stage": settings.stage, "cost-center": settings.cost_center,
            **run.tags, "run": run.name, EXECUTION_TAG: execution, METHOD_TAG: run.training.method}
    if shape:
        tags[SHAPE_TAG] = shape  # with the method, what matches this job's measured MFU to later estimates
    volume_gb = max(100, int(est.checkpoint_bytes * run.checkpoint.keep * 1.5 / 1e9) + 50)
    keep_alive = 0 if run.compute.spot else run.compute.warm_pool_minutes * 60
    steps = max(1, math.ceil(est.tokens / (est.global_batch_samples * run.data.seq_len)))
    startup = startup_seconds(catalog["defaults"])
    as_of = catalog["regions"][settings.region].get("as_of", "unknown date")
    upload_gb_per_s = est.upload_gb_per_s_available
    result = Plan(
        status=PlanStatus.OK.value, run_name=run.name, execution=execution, execution_started=started,
        job_name=name, fallback_job_name=segment_job_name(name, 2, spot=False), method=run.training.method,
        spot=run.compute.spot, on_demand_fallback=run.compute.on_demand_fallback,
        instance_type=est.instance_type, instance_count=est.instance_count,
        resource_config_spot=resource_config(est.instance_type, est.instance_count, volume_gb, settings, catalog),
        resource_config_on_demand=resource_config(est.instance_type, est.instance_count, volume_gb, settings,
                                                  catalog, keep_alive),
        checkpoint_s3_uri=f"s3://{settings.bucket}/{ckpt_prefix}", checkpoint_bucket=settings.bucket,
        checkpoint_prefix=ckpt_prefix,
        max_runtime_seconds=est.max_runtime_seconds, max_wait_seconds=est.max_wait_seconds,
        hyperparameters=hyper, input_data_config=channels,
        tags=[{"Key": k, "Value": v} for k, v in sorted(tags.items())],
        poll_seconds=settings.poll_seconds, max_poll_seconds=max(settings.poll_seconds, settings.max_poll_seconds),
        checkpoint_interval_seconds=float(est.checkpoint_interval_seconds),
        checkpoint_upload_seconds=(round(est.checkpoint_bytes / (upload_gb_per_s * 1e9), 1) if upload_gb_per_s
                                   else float(StopNotice.UPLOAD_S)),
        max_usd=run.max_usd,
        max_runtime_cap_seconds=int(est.segments["longest_seconds"]),
        max_wait_extra_seconds=est.max_wait_seconds - est.max_runtime_seconds,
        min_segment_seconds=int(est.segments["min_segment_seconds"]),
        segment_overhead_seconds=float(est.segments["overhead_seconds"]),
        warm_pool_seconds=keep_alive,
        planned_steps=steps,
        seconds_per_step=round((est.wall_seconds + est.expected_overhead_seconds - startup) / steps, 3),
        region=settings.region,
        usd_per_hour=catalog["instances"][est.instance_type]["on_demand_usd_per_hour"] * est.instance_count,
        price_source=f"on-demand list price in {settings.region} (spotrun catalog as of {as_of})",
        price_as_of=as_of,
        approval_status=REGISTRATION_STATUS, data_source=run.data.source or "",
        estimate={k: est.to_json()[k] for k in CONTRACT_KEYS}, gate=gate_of(run),
        network_isolation=not run.tracking.mlflow_uri,
    )
    return dataclasses.asdict(result)


def handler(event: dict, _context: Any) -> dict:
    import boto3

    event = event if isinstance(event, dict) else {}  # the state machine passes an object; anything else: no run
    settings = PipelineSettings.from_env(dict(os.environ))
    rates, mfu_lookup = None, None
    table_name = os.environ.get("TABLE_NAME")
    if table_name:
        from .interruptions import recorded_rates
        from .performance import recorded_utilization

        table = boto3.resource("dynamodb").Table(table_name)
        rates = recorded_rates(table)

        def mfu_lookup(shape: str, method: str) -> dict[str, tuple[float, int]]:
            return recorded_utilization(table, shape=shape, method=method)
    state_machine = str(event.get("state_machine") or "")
    running, status_of = None, None
    if state_machine:
        sfn = boto3.client("stepfunctions")
        running = count_running(sfn, state_machine, settings.max_concurrent_runs + 1)

        def status_of(name: str) -> tuple[str, str | None] | None:
            return execution_of(sfn, state_machine, name)
    return plan(event.get("run"), str(event.get("execution", "")), settings, rates=rates,
                s3_client=boto3.client("s3"), quotas_client=boto3.client("service-quotas"),
                started=str(event.get("started", "")), mfu_lookup=mfu_lookup, running_executions=running,
                execution_status=status_of, preparation=PreparationSettings.from_env(dict(os.environ)),
                prepared=event.get("prepared") if isinstance(event.get("prepared"), dict) else None)


def count_running(sfn: Any, state_machine_arn: str, enough: int) -> int:
    """Running executions of the state machine, counted up to `enough` (the limit + 1 decides)."""
    count = 0
    for page in sfn.get_paginator("list_executions").paginate(stateMachineArn=state_machine_arn,
                                                               statusFilter="RUNNING"):
        count += len(page["executions"])
        if count >= enough:
            break
    return count


def execution_of(sfn: Any, state_machine_arn: str, name: str) -> tuple[str, str | None] | None:
    """(status, run name of its input) of the state machine's execution `name`; None if there is none."""
    from botocore.exceptions import ClientError

    arn = state_machine_arn.replace(":stateMachine:", ":execution:", 1) + ":" + name
    try:
        desc = sfn.describe_execution(executionArn=arn)
    except ClientError as exc:
        if exc.response["Error"]["Code"] in ("ExecutionDoesNotExist", "InvalidArn"):
            return None
        raise
    try:
        run_name = json.loads(desc.get("input") or "{}").get("name")
    except (json.JSONDecodeError, AttributeError):
        run_name = None
    return desc["status"], run_name
