"""Preparation in the pipeline: raw text under the stage's datasets/ into prepared shards by a SageMaker Processing job.

A run whose `data.source` is an S3 prefix of raw files (.txt, .jsonl, .jsonl.gz, .parquet) without an index.json
is prepared before the estimate's final plan (the estimate needs the token count):

- `content_key`: a SHA-256 over the raw objects' names, ETags and sizes, every tokenizer file of `model.source`
  (all but the weights: names, ETags, sizes) and the prepare options. The output lives at
  `datasets/_prepared/<key>/`; a complete one (its marker holds the key, written last) is reused without a job.
- `processing_request`: the varying half of CreateProcessingJob (the state machine fixes the image, the role, the
  network isolation and the key): the stage's CPU instances, the raw prefix sharded across them (ShardedByS3Key),
  the tokenizer files (a manifest: the weights are not downloaded), each instance writing its part to
  `parts/<host>/`, MaxRuntime bounded by what the cap allows at the catalog's processing rate.
- after the job, spotrun/pipeline/preparation_finish.py merges the parts and bills the job (the finish Lambda) and stops
  the job of an execution that ended early (the canceller).

The estimate's inputs stage (spotrun/pipeline/inputs.py) calls `plan_step`; the trainer's entry point (`python -m
spotrun_trainer prepare --sagemaker-processing`, spotrun_trainer/processing.py) reads the paths named in
spotrun/seams.py. Stdlib only (the Lambda runtime and the image).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from ..contract.refusal import Refusal
from ..contract.strict_json import show
from ..seams import (
    EXECUTION_TAG,
    PREPARE_MARKER,
    PREPARED_PREFIX,
    PROCESSING_DATA_INPUT,
    PROCESSING_OUTPUT,
    PROCESSING_TOKENIZER_INPUT,
    RAW_SUFFIXES,
    WEIGHT_SUFFIXES,
    DatasetIndex,
    PlanStatus,
    Preparation,
    PreparationSettings,
)

KEY_VERSION = 2  # bump when the parts' layout or the tokenizing changes meaning (2: chat separators, data.py)
# SageMaker Processing's container root (the input and output names: seams).
PROCESSING_ROOT = "/opt/ml/processing"
MIN_RUNTIME_S = 600  # a preparation job the cap cannot carry for 10 minutes is refused
# At most this many raw bytes per token: English text is about 4 bytes per BPE token; 4x that leaves room for JSON
# keys, markup and other scripts. Used only for a lower bound on the training the cap must still carry.
RAW_BYTES_PER_TOKEN_MAX = 16
STOP_BILL_S = 120  # what a stop at MaxRuntime still bills (as for training jobs)
MAX_TOKENIZER_FILES = 200
VOLUME_PER_RAW_BYTE = 3.0  # the raw share + its shards and masks (<= 2 bytes of token ids and 1 of mask per token)
MAX_VOLUME_GB = 16384  # CreateProcessingJob's VolumeSizeInGB
# The poll loop (Wait, DescribePreparationJob, Choice: 9 history events) runs at most this many times over the
# job's MaxRuntime: 2,700 events of the execution's 25,000 (Step Functions quotas), the rest left to training.
MAX_PREPARATION_POLLS = 300


class PreparationRefused(ValueError):
    """The raw data cannot be prepared as the run asks (the field and why); the estimate turns it into InvalidRun
    or OverBudget."""

    def __init__(self, field: str, message: str, *, over_budget: bool = False):
        super().__init__(message)
        self.field, self.over_budget = field, over_budget


@dataclass(frozen=True)
class Prepared:
    """A complete prepared output the run trains on (the plan's `preparation`), and what it cost this run."""

    key: str
    raw_source: str
    data_source: str
    tokens: int
    reused: bool
    cost_usd: float = 0.0
    seconds: float = 0.0
    job_name: str = ""
    instance_type: str = ""
    instance_count: int = 0


def _split(uri: str) -> tuple[str, str]:
    bucket, _, prefix = uri[len("s3://"):].partition("/")
    return bucket, (prefix.rstrip("/") + "/") if prefix.strip("/") else ""


def list_objects(s3: Any, bucket: str, prefix: str) -> list[dict]:
    out = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        out.extend(page.get("Contents", []))
    return out


def raw_objects(s3: Any, uri: str) -> list[dict]:
    """The raw input objects under the prefix (by suffix), sorted by key: [{key, etag, size}]."""
    bucket, prefix = _split(uri)
    found = (o for o in list_objects(s3, bucket, prefix) if o["Key"].endswith(RAW_SUFFIXES))
    return sorted(({"key": o["Key"][len(prefix):], "etag": o.get("ETag", "").strip('"'), "size": o["Size"]}
                   for o in found), key=lambda o: o["key"])


def tokenizer_objects(s3: Any, uri: str) -> list[dict]:
    """Every file of the model directory a tokenizer may load: all but the weights (as spotrun/cli/datasets.py)."""
    bucket, prefix = _split(uri)
    found = sorted(({"key": o["Key"][len(prefix):], "etag": o.get("ETag", "").strip('"'), "size": o["Size"]}
                    for o in list_objects(s3, bucket, prefix) if not o["Key"].endswith(WEIGHT_SUFFIXES)
                    and not o["Key"].endswith("model.safetensors.index.json")), key=lambda o: o["key"])
    if not any(o["key"] in ("tokenizer.json", "tokenizer_config.json") for o in found):
        raise PreparationRefused("model.source", f"model.source={show(uri)} has no tokenizer.json or "
                                 "tokenizer_config.json: preparing raw data.source needs the model's tokenizer")
    if len(found) > MAX_TOKENIZER_FILES:
        raise PreparationRefused("model.source", f"model.source={show(uri)} holds {len(found)} files besides the "
                                 f"weights: expected a model directory (at most {MAX_TOKENIZER_FILES})")
    return found


def content_key(inputs: list[dict], tokenizer: list[dict], *, text_field: str, shard_bytes: int,
                validation_fraction: float) -> str:
    """What the prepared output depends on, as 24 hex digits (S3 ETags stand for the bytes)."""
    options = {"version": KEY_VERSION, "text_field": text_field, "shard_bytes": shard_bytes,
               "validation_fraction": validation_fraction}
    digest = hashlib.sha256(json.dumps(options, sort_keys=True).encode())
    for kind, objects in (("input", inputs), ("tokenizer", tokenizer)):
        for o in objects:
            digest.update(f"\0{kind}\0{o['key']}\0{o['size']}\0{o['etag']}".encode())
    return digest.hexdigest()[:24]


def processing_rate(catalog: dict, region: str, instance_type: str) -> float:
    """USD per hour of one processing instance (catalog regions.<region>.processing_usd_per_hour)."""
    rates = catalog.get("regions", {}).get(region, {}).get("processing_usd_per_hour", {})
    rate = rates.get(instance_type)
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate <= 0:
        raise PreparationRefused("data.source", f"the stage's preparation instance {instance_type} has no "
                                 f"processing price in {region} (spotrun/planner/catalog.json processing_usd_per_hour: "
                                 f"{', '.join(sorted(rates)) or 'none'})")
    return float(rate)


def max_runtime(settings: PreparationSettings, cap_usd: float, usd_per_hour: float,
                training_minimum_usd: float = 0.0) -> int:
    """The job's MaxRuntime: the stage's limit, and never more than the cap buys at the processing rate after the
    training's minimum (less what a stop bills): the job alone cannot bill into what the training needs, with
    every Lambda dead."""
    allowed = int((cap_usd - training_minimum_usd) / (usd_per_hour / 3600) - STOP_BILL_S)
    if allowed < MIN_RUNTIME_S:
        shortest = (MIN_RUNTIME_S + STOP_BILL_S) * usd_per_hour / 3600
        after = f" after the training's minimum of ${training_minimum_usd:,.2f}" if training_minimum_usd else ""
        raise PreparationRefused("budget.max_usd", f"budget.max_usd={cap_usd} buys {max(allowed, 0)} s of "
                                 f"preparation at ${usd_per_hour:.3f}/h{after}: expected a cap that covers at least "
                                 f"{MIN_RUNTIME_S} s of it (${shortest:,.2f}) and the training: at least "
                                 f"${training_minimum_usd + shortest:,.2f} in all", over_budget=True)
    return min(settings.max_runtime_seconds, allowed)


def fewest_tokens(raw_bytes: int) -> int:
    """A lower bound on the tokens raw files of this many bytes make, for the training's minimum before preparing:
    RAW_BYTES_PER_TOKEN_MAX bytes per token (compressed .gz and .parquet make more tokens per byte, not fewer)."""
    return max(1, raw_bytes // RAW_BYTES_PER_TOKEN_MAX)


def preparation_poll_seconds(runtime_s: int, stage_poll_seconds: int, stage_max_poll_seconds: int) -> int:
    """Seconds between the state machine's looks at the job: the stage's poll, or longer for a long MaxRuntime so
    the loop never takes more than MAX_PREPARATION_POLLS turns; never longer than the stage's longest poll."""
    return min(max(stage_poll_seconds, stage_max_poll_seconds),
               max(stage_poll_seconds, math.ceil(runtime_s / MAX_PREPARATION_POLLS)))


def job_name(job_prefix: str, key: str, execution: str) -> str:
    suffix = hashlib.sha256(execution.encode()).hexdigest()[:6]
    return f"{job_prefix}prep-{key[:12]}-{suffix}"[:63]


def is_complete(s3: Any, bucket: str, prefix: str, key: str) -> dict | None:
    """The marker of a complete prepared output with this key (written last, after index.json), or None."""
    try:
        marker = json.loads(s3.get_object(Bucket=bucket, Key=prefix + PREPARE_MARKER)["Body"].read())
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
            return None
        raise
    except json.JSONDecodeError:
        return None
    return marker if isinstance(marker, dict) and marker.get("key") == key else None


def volume_gb(settings: PreparationSettings, raw_bytes: int, count: int) -> int:
    """Each instance's EBS volume: its share of the raw files (File mode downloads them) and its part (token ids
    take about as many bytes as the text, plus masks), with room; at least the stage's size."""
    share = raw_bytes / max(1, count)
    return min(MAX_VOLUME_GB, max(settings.volume_gb, math.ceil(share * VOLUME_PER_RAW_BYTE / 1e9) + 10))


def processing_request(*, key: str, raw_uri: str, tokenizer_manifest_uri: str, bucket: str, files: int,
                       settings: PreparationSettings, usd_per_hour: float, runtime_s: int, name: str,
                       volume_kms_key_arn: str, tags: list, text_field: str, validation_fraction: float,
                       poll_seconds: int, raw_bytes: int = 0) -> Preparation:
    """The estimate's half of CreateProcessingJob; fewer instances than files never start empty."""
    count = max(1, min(settings.instance_count, files))
    prefix = f"{PREPARED_PREFIX}{key}/"
    cluster: dict = {"InstanceCount": count, "InstanceType": settings.instance_type,
                     "VolumeSizeInGB": volume_gb(settings, raw_bytes, count)}
    if volume_kms_key_arn:
        cluster["VolumeKmsKeyId"] = volume_kms_key_arn
    inputs = [
        {"InputName": PROCESSING_DATA_INPUT, "S3Input": {
            "S3Uri": raw_uri, "LocalPath": f"{PROCESSING_ROOT}/input/{PROCESSING_DATA_INPUT}", "S3DataType": "S3Prefix",
            "S3InputMode": "File", "S3DataDistributionType": "ShardedByS3Key"}},
        # A manifest of the tokenizer files: every instance gets them, not the model's weights.
        {"InputName": PROCESSING_TOKENIZER_INPUT, "S3Input": {
            "S3Uri": tokenizer_manifest_uri, "LocalPath": f"{PROCESSING_ROOT}/input/{PROCESSING_TOKENIZER_INPUT}",
            "S3DataType": "ManifestFile", "S3InputMode": "File", "S3DataDistributionType": "FullyReplicated"}},
    ]
    outputs = [{"OutputName": "prepared", "S3Output": {
        "S3Uri": f"s3://{bucket}/{prefix}", "LocalPath": f"{PROCESSING_ROOT}/{PROCESSING_OUTPUT}",
        "S3UploadMode": "EndOfJob"}}]
    entrypoint = ["python", "-m", "spotrun_trainer", "prepare", "--sagemaker-processing",
                  "--shard-mb", f"{settings.shard_bytes / 1e6:g}", "--text-field", text_field,
                  "--validation-fraction", f"{validation_fraction:g}"]
    return Preparation(
        job_name=name, key=key, raw_source=raw_uri, output_uri=f"s3://{bucket}/{prefix}", bucket=bucket,
        prefix=prefix, instance_type=settings.instance_type, instance_count=count,
        usd_per_hour=round(usd_per_hour * count, 6), max_runtime_seconds=runtime_s, processing_resources={
            "ClusterConfig": cluster}, processing_inputs=inputs, processing_outputs=outputs, entrypoint=entrypoint,
        stopping_condition={"MaxRuntimeInSeconds": runtime_s}, tags=tags, poll_seconds=poll_seconds, files=files)


def tokenizer_manifest(model_uri: str, tokenizer: list[dict]) -> bytes:
    """A ManifestFile (API reference, S3DataSource): the common prefix, then each object's key relative to it."""
    return json.dumps([{"prefix": model_uri if model_uri.endswith("/") else model_uri + "/"},
                       *[o["key"] for o in tokenizer]]).encode()


# ---- the estimate's step ------------------------------------------------------------------------------------


def _has_index(s3: Any, uri: str) -> bool:
    bucket, prefix = _split(uri)
    return s3.list_objects_v2(Bucket=bucket, Prefix=prefix + DatasetIndex.FILE).get("KeyCount", 0) > 0


def resolve(run: Any, s3: Any, *, bucket: str, settings: PreparationSettings, catalog: dict, region: str,
            execution: str, job_prefix: str, volume_kms_key_arn: str, tags: list, poll_seconds: int,
            max_poll_seconds: int, prepared: dict | None = None,
            training_minimum: Any = None) -> Prepared | Preparation | None:
    """For a run whose data.source is raw text in the stage's bucket: the complete prepared output to train on
    (Prepared; reused, or just made by this execution's job, `prepared`), or the job to make it (Preparation).
    None when there is nothing to prepare (prepared shards, data.tokens given, no S3 client).
    `training_minimum(run, tokens)`: the smallest cap whose training chain finishes on that many tokens; the job's
    MaxRuntime leaves it for the training (at the fewest tokens the raw bytes can make)."""
    source = run.data.source
    if s3 is None or run.data.tokens is not None or not source or not source.startswith(f"s3://{bucket}/"):
        return None
    if _has_index(s3, source):
        return None
    raw = raw_objects(s3, source)
    if not raw:
        return None  # neither prepared nor raw: read_sources names what is missing
    needed_by = run.validation_needed_by
    if needed_by and run.data.validation is None and run.data.validation_fraction is None:
        raise PreparationRefused(needed_by, f"{needed_by} reads a validation loss and raw data.source ({source}) "
                                 "would be prepared without a validation split: set data.validation_fraction (e.g. "
                                 "0.1: that share of the documents is held out when it is prepared), or give "
                                 "data.validation")
    model = run.model.source
    if not model or not model.startswith("s3://"):
        raise PreparationRefused("model.source", f"model.source={show(model)}: raw data.source ({source}) is prepared "
                                 "with the model's tokenizer: expected an s3:// model directory under models/")
    tokenizer = tokenizer_objects(s3, model)
    fraction = float(run.data.validation_fraction or 0.0)
    key = content_key(raw, tokenizer, text_field="text", shard_bytes=settings.shard_bytes,
                      validation_fraction=fraction)
    prefix = f"{PREPARED_PREFIX}{key}/"
    marker = is_complete(s3, bucket, prefix, key)
    if marker is not None:
        ours = prepared if prepared and prepared.get("key") == key else None
        done = Prepared(key=key, raw_source=source, data_source=f"s3://{bucket}/{prefix}",
                        tokens=int(marker.get("total_tokens", 0)), reused=ours is None)
        if ours:
            done = dataclasses.replace(done, cost_usd=float(ours["cost_usd"]), seconds=float(ours["seconds"]),
                                       job_name=ours["job_name"], instance_type=ours["instance_type"],
                                       instance_count=int(ours["instance_count"]))
        return done
    if prepared:
        raise PreparationRefused("data.source", f"data.source={show(source)}: the preparation job "
                                 f"{prepared.get('job_name')} finished but s3://{bucket}/{prefix} is not complete "
                                 "(no marker with its key): the raw objects or the tokenizer changed meanwhile?")
    rate = processing_rate(catalog, region, settings.instance_type)
    count = max(1, min(settings.instance_count, len(raw)))
    raw_bytes = sum(o["size"] for o in raw)
    minimum = training_minimum(run, fewest_tokens(raw_bytes)) if training_minimum is not None else 0.0
    runtime_s = max_runtime(settings, run.max_usd, rate * count, minimum)
    manifest_key = f"checkpoints/{run.name}/{execution}/preparation/tokenizer.manifest"
    s3.put_object(Bucket=bucket, Key=manifest_key, Body=tokenizer_manifest(model, tokenizer))
    return processing_request(
        key=key, raw_uri=source, tokenizer_manifest_uri=f"s3://{bucket}/{manifest_key}", bucket=bucket,
        files=len(raw), raw_bytes=raw_bytes, settings=settings, usd_per_hour=rate,
        runtime_s=runtime_s, name=job_name(job_prefix, key, execution), volume_kms_key_arn=volume_kms_key_arn,
        tags=tags, text_field="text", validation_fraction=fraction,
        poll_seconds=preparation_poll_seconds(runtime_s, poll_seconds, max_poll_seconds))


def job_tags(run: Any, pipeline: Any, execution: str) -> list[dict]:
    """A preparation job's tags: the stage's, the run's, and the execution's (the canceller finds its job by it)."""
    tags = {"project": pipeline.project, "stage": pipeline.stage, "cost-center": pipeline.cost_center, **run.tags,
            "run": run.name, EXECUTION_TAG: execution}
    return [{"Key": k, "Value": v} for k, v in sorted(tags.items())]


def plan_step(run: Any, s3: Any, *, pipeline: Any, settings: PreparationSettings, catalog: dict, execution: str,
              prepared: dict | None, training_minimum: Any = None) -> tuple[Any, Prepared | None, Preparation | None]:
    """The estimate's preparation step: (the run to plan, its Prepared or None, the job to run first or None); a
    Refusal when the data cannot be prepared as the run asks. The run to plan trains on the prepared shards with
    the cap less what the preparation cost (the cap itself stays the plan's `max_usd`); the job's MaxRuntime leaves
    `training_minimum(run, tokens)` of the cap for the training (`resolve`)."""
    try:
        outcome = resolve(run, s3, bucket=pipeline.bucket, settings=settings, catalog=catalog,
                          region=pipeline.region, execution=execution, job_prefix=pipeline.job_prefix,
                          volume_kms_key_arn=pipeline.volume_kms_key_arn, poll_seconds=pipeline.poll_seconds,
                          max_poll_seconds=pipeline.max_poll_seconds,
                          tags=job_tags(run, pipeline, execution), prepared=prepared,
                          training_minimum=training_minimum)
    except PreparationRefused as exc:
        status = PlanStatus.OVER_BUDGET if exc.over_budget else PlanStatus.INVALID_RUN
        raise Refusal(status.value, str(exc), field=exc.field) from None
    if outcome is None:
        return run, None, None
    if isinstance(outcome, Preparation):
        return run, None, outcome
    trained = dataclasses.replace(run, max_usd=round(run.max_usd - outcome.cost_usd, 4),
                                  data=dataclasses.replace(run.data, source=outcome.data_source))
    return trained, outcome, None


def prepare_message(run: Any, job: Preparation) -> str:
    """The Prepare answer's message for a preparation of raw data."""
    return (f"data.source={show(run.data.source)} is raw text ({job.files} file(s)): preparing it with "
            f"{job.instance_count} x {job.instance_type} (processing job {job.job_name}, MaxRuntime "
            f"{job.max_runtime_seconds} s, at most ${job.usd_per_hour * job.max_runtime_seconds / 3600:.2f}) into "
            f"{job.output_uri}")
