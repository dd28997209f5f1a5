"""Hub models in the pipeline: `model.source` `hf://org/name[@revision]` fetched once into the stage's models/.

A hub id is never read by the training job: the preparation step (the same SageMaker Processing step that prepares
raw data, its other kind, PREPARE_MODEL) runs `python -m spotrun.pipeline.hub_fetch` with network access and
writes the model's files into `models/_hub/<org>/<name>/<revision>/` (spotrun/pipeline/hub_fetch.py), with
`spotrun-hub.json` beside them: the commit the revision resolved to and each file's size and SHA-256. The estimate
then plans on that copy (its config.json; no hub access at estimate time) and the training job reads it as its
model channel, network-isolated as always.

- `fetched`: the copy's manifest when the copy is complete (every listed file present with its size), else None.
- `hub_step`: the estimate's step: the run with model.source replaced by the complete copy, or the fetch job
  (status Prepare, kind model). A copy is reused by every later run naming the same id and revision: the stage
  keeps the commit of the first fetch (name a commit, or another revision, to take a newer one).
The fetch job's bounds (its processing rate, MaxRuntime under the cap, poll) are the data preparation's
(spotrun/pipeline/preparation.py), called last in the step: the estimate goes hub -> preparation once.
Stdlib only (the Lambda runtime).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from ..contract.hub_id import HubId
from ..contract.refusal import Refusal
from ..seams import HUB_MANIFEST, HUB_MODELS_PREFIX, PREPARE_MODEL, PROCESSING_MODEL_OUTPUT, PlanStatus, Preparation
from .preparation import PROCESSING_ROOT, PreparationRefused, max_runtime, preparation_poll_seconds, processing_rate

# A fetch moves one model's files: an hour's MaxRuntime holds ~100 GB at the hub's usual rates; the cap bounds it too.
FETCH_MAX_RUNTIME_S = 3600


def hub_prefix(hub: HubId) -> str:
    return f"{HUB_MODELS_PREFIX}{hub.org}/{hub.name}/{hub.revision}/"


def check_manifest(manifest: Any, hub: HubId) -> dict:
    """The manifest's shape, and that it is this id's (a copy of another id under this prefix is refused)."""
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict) or not manifest["files"]:
        raise ValueError(f"{HUB_MANIFEST} of {hub.text} lists no files")
    if (manifest.get("repo"), manifest.get("revision")) != (hub.repo, hub.revision):
        raise ValueError(f"{HUB_MANIFEST} names {manifest.get('repo')}@{manifest.get('revision')}, not {hub.text}")
    return manifest


def fetched(s3: Any, bucket: str, hub: HubId) -> dict | None:
    """The manifest of the complete copy of `hub` in the stage's bucket, or None (no copy, or one missing files:
    SageMaker Processing uploads files in no set order, so a manifest alone proves nothing)."""
    prefix = hub_prefix(hub)
    listed = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix).search("Contents[]")
    sizes = {o["Key"][len(prefix):]: o["Size"] for o in listed if o}  # an empty listing's page yields None
    if HUB_MANIFEST not in sizes:
        return None
    manifest = check_manifest(json.loads(s3.get_object(Bucket=bucket, Key=prefix + HUB_MANIFEST)["Body"].read()), hub)
    complete = all(sizes.get(name) == entry.get("size") for name, entry in manifest["files"].items())
    return manifest if complete else None


def fetch_request(hub: HubId, *, bucket: str, settings: Any, catalog: dict, region: str, job_prefix: str,
                  execution: str, cap_usd: float, volume_kms_key_arn: str, tags: list,
                  poll_seconds: int) -> Preparation:
    """The fetch job (one instance of the stage's preparation type): the trainer image's hub_fetch writing the
    model into the processing output, uploaded to the copy's prefix at the job's end."""
    rate = processing_rate(catalog, region, settings.instance_type)
    runtime_s = min(FETCH_MAX_RUNTIME_S, max_runtime(settings, cap_usd, rate))
    prefix = hub_prefix(hub)
    key = hashlib.sha256(hub.text.encode()).hexdigest()[:24]
    suffix = hashlib.sha256(execution.encode()).hexdigest()[:6]
    cluster: dict = {"InstanceCount": 1, "InstanceType": settings.instance_type, "VolumeSizeInGB": settings.volume_gb}
    if volume_kms_key_arn:
        cluster["VolumeKmsKeyId"] = volume_kms_key_arn
    local = f"{PROCESSING_ROOT}/{PROCESSING_MODEL_OUTPUT}"
    outputs = [{"OutputName": PROCESSING_MODEL_OUTPUT, "S3Output": {
        "S3Uri": f"s3://{bucket}/{prefix}", "LocalPath": local, "S3UploadMode": "EndOfJob"}}]
    return Preparation(
        job_name=f"{job_prefix}prep-{key[:12]}-{suffix}"[:63], key=key, raw_source=hub.text,
        output_uri=f"s3://{bucket}/{prefix}", bucket=bucket, prefix=prefix, instance_type=settings.instance_type,
        instance_count=1, usd_per_hour=round(rate, 6), max_runtime_seconds=runtime_s,
        processing_resources={"ClusterConfig": cluster}, processing_inputs=[], processing_outputs=outputs,
        entrypoint=["python", "-m", "spotrun.pipeline.hub_fetch", hub.text, "--sagemaker-processing"],
        stopping_condition={"MaxRuntimeInSeconds": runtime_s}, tags=tags, poll_seconds=poll_seconds, files=0,
        kind=PREPARE_MODEL)


def hub_step(run: Any, s3: Any, *, pipeline: Any, settings: Any, catalog: dict, execution: str,
             tags: list) -> tuple[Any, Preparation | None]:
    """The estimate's hub step: (the run on the stage's copy of its hub model, None), or (the run, the fetch job
    to run first); a Refusal when the copy or the job cannot be. A run without a hub id, or planned without S3
    (the CLI), is returned as it is."""
    hub = run.model.hub
    if hub is None or s3 is None:
        return run, None
    try:
        manifest = fetched(s3, pipeline.bucket, hub)
    except ValueError as exc:
        raise Refusal(PlanStatus.INVALID_RUN.value, str(exc), field="model.source") from None
    if manifest is not None:
        copy = f"s3://{pipeline.bucket}/{hub_prefix(hub)}"
        return dataclasses.replace(run, model=dataclasses.replace(run.model, source=copy)), None
    try:
        job = fetch_request(hub, bucket=pipeline.bucket, settings=settings, catalog=catalog, region=pipeline.region,
                            job_prefix=pipeline.job_prefix, execution=execution, cap_usd=run.max_usd,
                            volume_kms_key_arn=pipeline.volume_kms_key_arn, tags=tags, poll_seconds=0)
    except PreparationRefused as exc:
        status = PlanStatus.OVER_BUDGET if exc.over_budget else PlanStatus.INVALID_RUN
        raise Refusal(status.value, str(exc), field="model.source") from None
    return run, dataclasses.replace(job, poll_seconds=preparation_poll_seconds(
        job.max_runtime_seconds, pipeline.poll_seconds, pipeline.max_poll_seconds))


def fetch_message(job: Preparation) -> str:
    """The Prepare answer's message for a fetch job."""
    return (f"model.source={job.raw_source}: fetching it from the hub into {job.output_uri} (processing job "
            f"{job.job_name}, 1 x {job.instance_type}, MaxRuntime {job.max_runtime_seconds} s, at "
            f"most ${job.usd_per_hour * job.max_runtime_seconds / 3600:.2f})")
