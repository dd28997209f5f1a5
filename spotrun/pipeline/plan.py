"""The deployment's side of planning: one execution's plan, as the estimate Lambda returns it and `spotrun start`
checks it before starting anything (spotrun/handlers/estimate.py is the Lambda's entry point).

`plan()` takes a run (raw JSON), the execution's name and the deployment's `PipelineSettings`, and returns the
plan as the state machine carries it (`spotrun.seams.Plan.to_json()`; `Plan.from_json` decodes it). A run that
must not start returns status InvalidRun or OverBudget with the reason (the state machine turns them into named
failures before anything is created); otherwise status "ok" with every value CreateTrainingJob needs. A run
whose data.source is raw text under datasets/ is answered "Prepare" with the preparation job
(spotrun/pipeline/preparation.py), and planned when the state machine calls again with what the job made (`prepared`:
the prepared shards, and its bill, spent before the first job).

Besides the planner's rules, this is where the deployment's facts apply: the region's on-demand prices (a region
the catalog has no prices for is refused), the stage's allowed instance types, the account's SageMaker service
quota for the chosen type, and the checkpoint prefix: one per execution, `checkpoints/<run>/<execution>/`, or an
earlier execution's when the run names it in `checkpoint.resume_from` (spotrun/pipeline/preflight.py holds those
checks). Also here: the jobs' names (`job_name`), their ResourceConfig, and the canceller's rule (`cancel`: which jobs
are an ended execution's). The settings (`PipelineSettings`, the estimate function's environment) are defined
in spotrun/seams.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from typing import Any, Callable

from ..contract.hub_id import is_hub_id, parse_hub_id
from ..contract.refusal import Refusal
from ..contract.spec import RunSpec, RunValidationError, parse_run
from ..planner.estimate import estimate, load_catalog, regional_catalog, startup_seconds
from ..planner.measured import shape_key
from ..planner.outputs import mlflow_config
from ..planner.sources import read_sources, with_split
from ..policy.decision import starts_on_spot
from ..seams import (
    CANCEL_STATUSES,
    EXECUTION_TAG,
    METHOD_TAG,
    PREPARE_MODEL,
    REGISTRATION_STATUS,
    RUN_TAG,
    SHAPE_TAG,
    VALIDATION_CHANNEL,
    PipelineSettings,
    Plan,
    PlanStatus,
    PreparationSettings,
    StopNotice,
)
from .gate import gate_of
from .hub import hub_step
from .preflight import (
    check_approval_status,
    check_before_preparing,
    check_execution_name,
    check_quota,
    check_resumable,
    check_resume,
    check_stage_limits,
    run_record,
    write_run_record,
)
from .preparation import job_tags, plan_step
from .segments import SEGMENT_SUFFIX_MAX, segment_job_name
from .validate import Target, check_hyperparameters, check_target, validation_uri

MODEL_SOURCE_PATH = "model.source"  # spotrun/settings.py ModelConfig.source: the base an exported adapter names
CONTRACT_KEYS = ("parameters", "trainable_parameters", "training_flops", "gpu_hours", "instance_type",
                 "instance_count", "max_runtime_seconds", "max_wait_seconds", "checkpoint_bytes", "spot_policy",
                 "notice_upload_gb_per_s", "checkpoint_interval_seconds", "cost_usd", "warnings", "utilization",
                 "utilization_source", "segments", "wall_seconds", "expected_overhead_seconds",
                 "checkpoint_policy", "tokens", "expected_interruptions", "evaluation_seconds")  # the report's
MAX_JOB_NAME = 63


def job_name(job_prefix: str, run_name: str, execution: str) -> str:
    """The first job's name of an execution of run `run_name` (later segments' names start with it)."""
    suffix = hashlib.sha256(execution.encode()).hexdigest()[:6]
    room = MAX_JOB_NAME - len(job_prefix) - len(suffix) - 1 - SEGMENT_SUFFIX_MAX
    return f"{job_prefix}{run_name[:room].rstrip('-')}-{suffix}"


def first_job_of(detail: dict, job_prefix: str, execution_input: str | None) -> str | None:
    """The execution's first job name (every later segment's name starts with it), or None without a run name.
    `detail`: the "Step Functions Execution Status Change" event's; `execution_input`: the execution's input."""
    try:
        run_name = json.loads(execution_input or "{}").get("name")
    except (json.JSONDecodeError, AttributeError):
        return None
    if not isinstance(run_name, str) or not run_name:
        return None
    return job_name(job_prefix, run_name, detail["name"])


def cancel(detail: dict, sagemaker: Any, *, job_prefix: str, execution_input: str | None,
           continued: dict | None = None) -> list[str]:
    """Stop the running jobs of an execution that ended early (spotrun/handlers/cancel.py); returns their names.

    Which jobs: every segment's name starts with the execution's first job name; of the jobs in progress with that
    name, the ones whose `execution` tag is this execution's (StopTrainingJob: SIGTERM, the trainer saves its
    checkpoint on the way out). A duplicate event finds them stopping and does nothing. `continued`: for an
    execution that continues a run (spotrun/pipeline/continuation.py `continued_run`, proven), the run's first job name
    and `execution` tag, which its jobs keep."""
    if detail.get("status") not in CANCEL_STATUSES:
        return []
    first = continued["first_job"] if continued else first_job_of(detail, job_prefix, execution_input)
    owner = continued["tag"] if continued else detail["name"]
    if first is None:
        return []
    stopped = []
    pages = sagemaker.get_paginator("list_training_jobs").paginate(NameContains=first, StatusEquals="InProgress")
    for page in pages:
        for job in page["TrainingJobSummaries"]:
            if not job["TrainingJobName"].startswith(first):
                continue
            tags = {t["Key"]: t["Value"] for t in sagemaker.list_tags(ResourceArn=job["TrainingJobArn"])["Tags"]}
            if tags.get(EXECUTION_TAG) != owner:
                continue  # a job of an earlier execution that had the same name
            sagemaker.stop_training_job(TrainingJobName=job["TrainingJobName"])
            stopped.append(job["TrainingJobName"])
    return stopped



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


def training_minimum(run: RunSpec, catalog: dict, s3_client: Any) -> Callable[[int], float]:
    """tokens -> the smallest cap whose training chain finishes on that many tokens (spotrun/pipeline/segments.py
    `smallest_cap`, the planner's own figure): what a preparation job must leave of the cap. The planner refuses a
    model it cannot plan here too, before the preparation bills anything."""
    def minimum(tokens: int) -> float:
        # NOTE: the raw text has no index.json yet: the probe names no data.source, only the token count.
        probe = dataclasses.replace(run, max_usd=math.inf,
                                    data=dataclasses.replace(run.data, tokens=tokens, source=None))
        sources = read_sources(probe, s3_client=s3_client)
        est = estimate(probe, catalog=catalog, model_config=sources.model_config, data_tokens=tokens)
        return float(est.segments["min_cap_usd"])

    return minimum


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

    `mfu_lookup(shape, method)`: instance type -> (MFU, runs) measured by earlier runs (spotrun/planner/measured.py).
    `preparation`: the stage's preparation settings (None: raw data.source is not prepared here, as in the CLI);
    `prepared`: what this execution's preparation job made (the finish step's output; spotrun/pipeline/preparation.py).
    """
    catalog = catalog or load_catalog()
    shape = None
    try:
        check_execution_name(execution)
        # The same rules `spotrun validate --stage` applies (spotrun/pipeline/validate.py).
        run: RunSpec = parse_run(run_raw)
        check_stage_limits(run, settings, running_executions)
        catalog = deployment_catalog(catalog, settings, run)
        # Every source's place first (a hub id: its copy's, spotrun/pipeline/validate.py `hub_copy`), before any job.
        data_uri, model_uri = check_target(run, Target(settings.bucket, settings.model_package_group))
        cap, done, fetch_usd = run.max_usd, None, 0.0
        hub_repo = parse_hub_id(run.model.source).repo if is_hub_id(run.model.source) else None
        if preparation is not None:  # a hub model: fetched into models/ first (spotrun/pipeline/hub.py)
            run, instead = hub_step(run, s3_client, pipeline=settings, settings=preparation, catalog=catalog,
                                    execution=execution, tags=job_tags(run, settings, execution))
            if instead is not None:
                if instead["status"] == PlanStatus.PREPARE.value:
                    check_before_preparing(run, quotas_client, execution_status)
                return instead
            if prepared and prepared.get("kind") == PREPARE_MODEL:  # this execution's fetch: its bill is spent
                fetch_usd, prepared = float(prepared["cost_usd"]), None
                run = dataclasses.replace(run, max_usd=round(run.max_usd - fetch_usd, 4))
            # Raw text under datasets/: prepared first (spotrun/pipeline/preparation.py).
            run, done, instead = plan_step(run, s3_client, pipeline=settings, settings=preparation, catalog=catalog,
                                           execution=execution, prepared=prepared,
                                           training_minimum=training_minimum(run, catalog, s3_client))
            if instead is not None:
                if instead["status"] == PlanStatus.PREPARE.value:
                    check_before_preparing(run, quotas_client, execution_status)
                    # the fetch's bill rides on the data's preparation into the next plan (`Preparation.earlier_usd`)
                    instead["preparation"]["earlier_usd"] = fetch_usd
                return instead
            data_uri = done.data_source if done else data_uri
        sources = read_sources(run, s3_client=s3_client)
        run = with_split(run, sources)  # the validation split the prepared data holds, when the run names none
        model_config, tokens = sources.model_config, sources.tokens
        shape = shape_key(run.model.config or model_config) if (run.model.config or model_config) else None
        measured = mfu_lookup(shape, run.training.method) if (mfu_lookup and shape) else None
        est = estimate(run, catalog=catalog, model_config=model_config, data_tokens=tokens,
                       recorded_rates=rates, recorded_mfu=measured, validation_tokens=sources.validation_tokens)
        if hub_repo:  # the exported adapter's base: the hub's name for it (from_pretrained takes it), not the copy
            est = dataclasses.replace(est, hyperparameters={**est.hyperparameters, MODEL_SOURCE_PATH: hub_repo})
        check_hyperparameters(est.hyperparameters)
        from ..policy.choose import spot_policy  # the chosen spot policy and its odds (stdlib only)

        est = dataclasses.replace(est, spot_policy=spot_policy(
            run, est, catalog, poll_s=settings.poll_seconds,
            max_poll_s=max(settings.poll_seconds, settings.max_poll_seconds)))
    except Refusal as exc:  # the contract, the stage's rules, the sources or the planner
        return exc.result(CONTRACT_KEYS)

    try:
        if run.checkpoint.resume_from is not None and execution_status is not None:
            check_resumable(run, run.checkpoint.resume_from, execution_status(run.checkpoint.resume_from))
        out = _ok_plan(run, est, execution, started, settings, catalog, model_config, tokens, data_uri,
                       model_uri, s3_client, quotas_client, shape)
        if done is not None or fetch_usd:  # the cap is the run's; the preparation's cost is spent before the first job
            out.update(max_usd=cap, spent_before_usd=round((done.cost_usd if done else 0.0) + fetch_usd, 6))
        if done is not None:
            out.update(preparation=dataclasses.asdict(done))
        return out
    except Refusal as exc:
        return exc.result(CONTRACT_KEYS)


def _ok_plan(run: RunSpec, est: Any, execution: str, started: str, settings: PipelineSettings,
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
        check_resume(record, s3_client, settings.bucket, ckpt_prefix, run.checkpoint.resume_from)
    elif s3_client is not None:
        write_run_record(record, s3_client, settings.bucket, ckpt_prefix, execution)
    channels = [_channel("train", data_uri)] + ([_channel("model", model_uri)] if model_uri else [])
    held_out = validation_uri(run, Target(settings.bucket, settings.model_package_group))
    channels += [_channel(VALIDATION_CHANNEL, held_out)] if held_out else []
    name = job_name(settings.job_prefix, run.name, execution)
    tags = {"project": settings.project, "stage": settings.stage, "cost-center": settings.cost_center,
            **run.tags, RUN_TAG: run.name, EXECUTION_TAG: execution, METHOD_TAG: run.training.method}
    if shape:
        tags[SHAPE_TAG] = shape  # with the method, what matches this job's measured MFU to later estimates
    volume_gb = max(100, int(est.checkpoint_bytes * run.checkpoint.keep * 1.5 / 1e9) + 50)
    keep_alive = 0 if run.compute.spot else run.compute.warm_pool_minutes * 60
    steps = max(1, math.ceil(est.tokens / (est.global_batch_samples * run.data.seq_len)))
    startup = startup_seconds(catalog["defaults"])
    as_of = catalog["regions"][settings.region].get("as_of", "unknown date")
    upload_gb_per_s = est.upload_gb_per_s_available
    result = Plan(
        status=PlanStatus.OK, run_name=run.name, execution=execution, execution_started=started,
        job_name=name, fallback_job_name=segment_job_name(name, 2, spot=False), method=run.training.method,
        # the first job's market: the chosen policy's first decision (spotrun/policy/decision.py)
        spot=run.compute.spot and (not est.spot_policy or starts_on_spot(est.spot_policy)),
        on_demand_fallback=run.compute.on_demand_fallback,
        instance_type=est.instance_type, instance_count=est.instance_count,
        resource_config_spot=resource_config(est.instance_type, est.instance_count, volume_gb, settings, catalog),
        resource_config_on_demand=resource_config(est.instance_type, est.instance_count, volume_gb, settings,
                                                  catalog, keep_alive),
        checkpoint_s3_uri=f"s3://{settings.bucket}/{ckpt_prefix}", checkpoint_bucket=settings.bucket,
        checkpoint_prefix=ckpt_prefix,
        max_runtime_seconds=est.max_runtime_seconds, max_wait_seconds=est.max_wait_seconds,
        hyperparameters=est.hyperparameters, input_data_config=channels,
        tags=[{"Key": k, "Value": v} for k, v in sorted(tags.items())],
        poll_seconds=settings.poll_seconds, max_poll_seconds=max(settings.poll_seconds, settings.max_poll_seconds),
        checkpoint_interval_seconds=float(est.checkpoint_interval_seconds),
        checkpoint_upload_seconds=(round(est.checkpoint_bytes / (upload_gb_per_s * 1e9), 1) if upload_gb_per_s
                                   else float(StopNotice.UPLOAD_S)),
        max_usd=run.max_usd,
        max_runtime_cap_seconds=int(est.segments["longest_seconds"]),
        max_wait_extra_seconds=est.max_wait_seconds - est.max_runtime_seconds,
        min_segment_seconds=int(est.segments["min_segment_seconds"]),
        spot_fraction=float(est.segments["spot_fraction"]),
        segment_overhead_seconds=float(est.segments["overhead_seconds"]),
        warm_pool_seconds=keep_alive,
        planned_steps=steps,
        # six significant digits: a tiny model's step is well under a millisecond
        seconds_per_step=float(f"{(est.wall_seconds + est.expected_overhead_seconds - startup) / steps:.6g}"),
        region=settings.region,
        usd_per_hour=catalog["instances"][est.instance_type]["on_demand_usd_per_hour"] * est.instance_count,
        price_source=f"on-demand list price in {settings.region} (spotrun catalog as of {as_of})",
        price_as_of=as_of,
        approval_status=REGISTRATION_STATUS, data_source=run.data.source or "",
        estimate={k: est.to_json()[k] for k in CONTRACT_KEYS}, gate=gate_of(run),
        network_isolation=not (run.tracking.mlflow_uri or run.tracking.wandb_project),
        mlflow_config=mlflow_config(run, execution),
    )
    return result.to_json()


