"""The estimate step's last stage (spotrun/pipeline/plan.py `plan`): the plan as the state machine carries it
(`spotrun.seams.Plan`), assembled from the admitted run, its inputs, the planner's estimate and the chosen spot
policy: the jobs' names (`job_name`), their ResourceConfig, channels and tags, the checkpoint prefix, the cap's
segments, the cost guard's figures and the MLflow tracking server SageMaker shows the job in (`mlflow_config`).
"""

from __future__ import annotations

import dataclasses
import hashlib

from ..contract.spec import RunSpec
from ..planner.estimate import startup_seconds
from ..planner.outputs import Estimate, checkpoint_upload_seconds, guard_seconds_per_step
from ..planner.segments import SEGMENT_SUFFIX_MAX, segment_job_name
from ..policy.decision import starts_on_spot
from ..seams import (
    EXECUTION_TAG,
    METHOD_TAG,
    PLAN_ESTIMATE_FIELDS,
    REGISTRATION_STATUS,
    RUN_TAG,
    SHAPE_TAG,
    VALIDATION_CHANNEL,
    PipelineSettings,
    Plan,
    PlanEstimate,
    PlanStatus,
)
from .gate import gate_of
from .inputs import Inputs
from .validate import Admitted

CONTRACT_KEYS = PLAN_ESTIMATE_FIELDS  # the report's, and a refused run's estimate
MAX_JOB_NAME = 63


def job_name(job_prefix: str, run_name: str, execution: str) -> str:
    """The first job's name of an execution of run `run_name` (later segments' names start with it)."""
    suffix = hashlib.sha256(execution.encode()).hexdigest()[:6]
    room = MAX_JOB_NAME - len(job_prefix) - len(suffix) - 1 - SEGMENT_SUFFIX_MAX
    return f"{job_prefix}{run_name[:room].rstrip('-')}-{suffix}"


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


def _tags(run: RunSpec, settings: PipelineSettings, execution: str, shape: str | None) -> list[dict]:
    tags = {"project": settings.project, "stage": settings.stage, "cost-center": settings.cost_center,
            **run.tags, RUN_TAG: run.name, EXECUTION_TAG: execution, METHOD_TAG: run.training.method}
    if shape:
        tags[SHAPE_TAG] = shape  # with the method, what matches this job's measured MFU to later estimates
    return [{"Key": k, "Value": v} for k, v in sorted(tags.items())]


def mlflow_config(run: RunSpec, execution: str) -> dict[str, str]:
    """CreateTrainingJob's MlflowConfig for a run naming a SageMaker AI MLflow tracking server by ARN: SageMaker
    then shows the job in that server's experiment (`tracking.experiment`, default the run's name) as a run named
    after the execution. {} for a plain MLflow URL or no server (only the container's logger, tracking.py)."""
    uri = run.tracking.mlflow_uri
    if not uri or not uri.startswith("arn:"):
        return {}
    return {"MlflowResourceArn": uri, "MlflowExperimentName": run.tracking.experiment or run.name,
            "MlflowRunName": execution}


def assemble(plan_run: RunSpec, est: Estimate, *, shape: str | None, cap_usd: float, admitted: Admitted,
             inputs: Inputs, ckpt_prefix: str, execution: str, started: str, settings: PipelineSettings) -> dict:
    """The plan (`Plan.to_json()`) of the planned run (the admitted run on its inputs) and its estimate with the
    chosen spot policy; `cap_usd`: the run's own cap (a preparation's bill is spent before the first job);
    `ckpt_prefix`: the execution's checkpoint prefix (spotrun/pipeline/preflight.py `record_run`)."""
    catalog = admitted.catalog
    tracking = mlflow_config(plan_run, execution)
    channels = [_channel("train", inputs.data_uri)] + \
        ([_channel("model", admitted.model_uri)] if admitted.model_uri else [])
    channels += [_channel(VALIDATION_CHANNEL, admitted.validation_uri)] if admitted.validation_uri else []
    name = job_name(settings.job_prefix, plan_run.name, execution)
    volume_gb = max(100, int(est.checkpoint_bytes * plan_run.checkpoint.keep * 1.5 / 1e9) + 50)
    keep_alive = 0 if plan_run.compute.spot else plan_run.compute.warm_pool_minutes * 60
    startup = startup_seconds(catalog["defaults"])
    as_of = catalog["regions"][settings.region].get("as_of", "unknown date")
    steps = est.planned_steps  # the planner's count at data.seq_len
    full = est.to_json()
    result = Plan(
        status=PlanStatus.OK, run_name=plan_run.name, execution=execution, execution_started=started,
        job_name=name, fallback_job_name=segment_job_name(name, 2, spot=False), method=plan_run.training.method,
        # the first job's market: the chosen policy's first decision (spotrun/policy/decision.py)
        spot=plan_run.compute.spot and (est.spot_policy is None or starts_on_spot(est.spot_policy)),
        on_demand_fallback=plan_run.compute.on_demand_fallback,
        instance_type=est.instance_type, instance_count=est.instance_count,
        resource_config_spot=resource_config(est.instance_type, est.instance_count, volume_gb, settings, catalog),
        resource_config_on_demand=resource_config(est.instance_type, est.instance_count, volume_gb, settings,
                                                  catalog, keep_alive),
        checkpoint_s3_uri=f"s3://{settings.bucket}/{ckpt_prefix}", checkpoint_bucket=settings.bucket,
        checkpoint_prefix=ckpt_prefix,
        max_runtime_seconds=est.max_runtime_seconds, max_wait_seconds=est.max_wait_seconds,
        hyperparameters=est.hyperparameters, input_data_config=channels,
        tags=_tags(plan_run, settings, execution, shape),
        poll_seconds=settings.poll_seconds, max_poll_seconds=max(settings.poll_seconds, settings.max_poll_seconds),
        checkpoint_upload_seconds=checkpoint_upload_seconds(est),
        max_usd=plan_run.max_usd,
        max_runtime_cap_seconds=int(est.segments.longest_seconds),
        max_wait_extra_seconds=est.max_wait_seconds - est.max_runtime_seconds,
        min_segment_seconds=int(est.segments.min_segment_seconds),
        spot_fraction=float(est.segments.spot_fraction),
        segment_overhead_seconds=float(est.segments.overhead_seconds),
        warm_pool_seconds=keep_alive,
        planned_steps=steps,
        seconds_per_step=guard_seconds_per_step(est, startup),
        region=settings.region,
        usd_per_hour=catalog["instances"][est.instance_type]["on_demand_usd_per_hour"] * est.instance_count,
        price_source=f"on-demand list price in {settings.region} (spotrun catalog as of {as_of})",
        price_as_of=as_of,
        approval_status=REGISTRATION_STATUS, data_source=plan_run.data.source or "",
        # the plan's copy keeps max_wait_seconds (the state's field), which an on-demand estimate's JSON leaves out
        estimate=PlanEstimate.from_json({**{k: full[k] for k in CONTRACT_KEYS if k in full},
                                         "max_wait_seconds": est.max_wait_seconds}),
        gate=gate_of(plan_run),
        network_isolation=not (plan_run.tracking.mlflow_uri or plan_run.tracking.wandb_project),
        mlflow_config=tracking,
    )
    out = result.to_json()
    if inputs.done is not None or inputs.fetch_usd:  # the cap is the run's; a preparation's cost is spent first
        spent = (inputs.done.cost_usd if inputs.done else 0.0) + inputs.fetch_usd
        out.update(max_usd=cap_usd, spent_before_usd=round(spent, 6))
    if inputs.done is not None:
        out.update(preparation=dataclasses.asdict(inputs.done))
    return out
