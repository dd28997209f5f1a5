"""Estimate Lambda: the first state of the training pipeline.

Input: {"run": <run JSON>, "execution": <execution name>}. Output: a plan the state machine reads. A run that must
not start returns status InvalidRun or OverBudget with the reason (the state machine turns them into named
failures before anything is created); otherwise status "ok" with every field CreateTrainingJob needs.
Environment (read here only): BUCKET_NAME, JOB_PREFIX, MODEL_PACKAGE_GROUP, TABLE_NAME, POLL_SECONDS, PROJECT,
STAGE, COST_CENTER.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any, Callable

from ..contract import RunSpec, RunValidationError, parse_run
from ..planner import EstimateRefused, estimate, load_catalog
from ..sources import resolve
from ..validate import Target, check_target, pipeline_hyperparameters
from .performance import METHOD_TAG, SHAPE_TAG, shape_key

CONTRACT_KEYS = ("parameters", "trainable_parameters", "training_flops", "gpu_hours", "instance_type",
                 "instance_count", "max_runtime_seconds", "max_wait_seconds", "checkpoint_bytes",
                 "notice_upload_gb_per_s", "checkpoint_interval_seconds", "cost_usd", "warnings", "utilization",
                 "utilization_source")
MAX_JOB_NAME = 63
FALLBACK_SUFFIX = "-od"


@dataclass(frozen=True)
class PipelineSettings:
    bucket: str
    job_prefix: str
    model_package_group: str
    poll_seconds: int
    project: str
    stage: str
    cost_center: str

    @classmethod
    def from_env(cls, env: dict[str, str]) -> "PipelineSettings":
        return cls(bucket=env["BUCKET_NAME"], job_prefix=env["JOB_PREFIX"],
                   model_package_group=env["MODEL_PACKAGE_GROUP"], poll_seconds=int(env.get("POLL_SECONDS", "60")),
                   project=env.get("PROJECT", "spotrun"), stage=env.get("STAGE", ""),
                   cost_center=env.get("COST_CENTER", ""))


def job_name(settings: PipelineSettings, run_name: str, execution: str) -> str:
    suffix = hashlib.sha256(execution.encode()).hexdigest()[:6]
    room = MAX_JOB_NAME - len(settings.job_prefix) - len(suffix) - 1 - len(FALLBACK_SUFFIX)
    return f"{settings.job_prefix}{run_name[:room].rstrip('-')}-{suffix}"


def _channel(name: str, uri: str) -> dict:
    return {"ChannelName": name, "InputMode": "FastFile",
            "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": uri,
                                            "S3DataDistributionType": "FullyReplicated"}}}


def plan(run_raw: Any, execution: str, settings: PipelineSettings, *, s3_client: Any = None,
         rates: dict[str, float] | None = None, catalog: dict | None = None,
         mfu_lookup: Callable[[str, str], dict[str, tuple[float, int]]] | None = None) -> dict:
    """`mfu_lookup(shape, method)`: instance type -> (MFU, runs) measured by earlier runs (performance.py)."""
    catalog = catalog or load_catalog()
    shape = None
    try:
        # The same rules `spotrun validate --stage` applies (spotrun/validate.py).
        run: RunSpec = parse_run(run_raw)
        data_uri, model_uri = check_target(run, Target(settings.bucket, settings.model_package_group))
        model_config, tokens = resolve(run, s3_client=s3_client)
        shape = shape_key(run.model.config or model_config) if (run.model.config or model_config) else None
        measured = mfu_lookup(shape, run.training.method) if (mfu_lookup and shape) else None
        est = estimate(run, catalog=catalog, model_config=model_config, data_tokens=tokens,
                       recorded_rates=rates, recorded_mfu=measured)
        hyper = pipeline_hyperparameters(run, est)
    except RunValidationError as exc:
        return {"status": "InvalidRun", "message": str(exc), "field": exc.field}
    except EstimateRefused as exc:
        out = {"status": exc.code, "message": exc.message, "field": exc.field or "run"}
        if exc.estimate is not None:
            out["estimate"] = {k: exc.estimate.to_json()[k] for k in CONTRACT_KEYS}
        return out

    family = est.instance_type.split(".")[1]
    discount = run.compute.spot_discount if run.compute.spot_discount is not None else \
        catalog["families"][family]["spot_discount"]
    channels = [_channel("train", data_uri)] + ([_channel("model", model_uri)] if model_uri else [])
    name = job_name(settings, run.name, execution)
    tags = {"project": settings.project, "stage": settings.stage, "cost-center": settings.cost_center,
            **run.tags, "run": run.name, METHOD_TAG: run.training.method}
    if shape:
        tags[SHAPE_TAG] = shape  # with the method, what matches this job's measured MFU to later estimates
    return {
        "status": "ok",
        "run_name": run.name,
        "job_name": name,
        "fallback_job_name": name + FALLBACK_SUFFIX,
        "spot": run.compute.spot,
        "on_demand_fallback": run.compute.on_demand_fallback,
        "instance_type": est.instance_type,
        "instance_count": est.instance_count,
        "volume_gb": max(100, int(est.checkpoint_bytes * run.checkpoint.keep * 1.5 / 1e9) + 50),
        "max_runtime_seconds": est.max_runtime_seconds,
        "max_wait_seconds": est.max_wait_seconds,
        "keep_alive_seconds": 0 if run.compute.spot else run.compute.warm_pool_minutes * 60,
        "hyperparameters": hyper,
        "input_data_config": channels,
        "tags": [{"Key": k, "Value": v} for k, v in sorted(tags.items())],
        "poll_seconds": settings.poll_seconds,
        "max_usd": run.max_usd,
        "usd_per_hour": catalog["instances"][est.instance_type]["on_demand_usd_per_hour"] * est.instance_count,
        "spot_discount": discount,
        "approval_status": run.approval_status,
        "estimate": {k: est.to_json()[k] for k in CONTRACT_KEYS},
    }


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
    return plan(event.get("run"), str(event.get("execution", "")), settings, rates=rates, mfu_lookup=mfu_lookup)
