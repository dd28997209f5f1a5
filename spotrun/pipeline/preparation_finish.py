"""After the pipeline's preparation job (spotrun/pipeline/preparation.py): its outcome, its bill and the merged
dataset; and the canceller's stop of a preparation job whose execution ended early.

- `merge_parts` / `finish`: the parts' indexes (`parts/<host>/index.json`, one per instance) merged into the
  dataset's index.json (and validation/index.json), the tokenizer copied to `tokenizer/`, the marker last; the
  job's cost from its start and end times at the processing rate.
- a hub model's fetch (kind model, spotrun/pipeline/hub.py): its copy checked complete, and its bill.
- `stop_preparation`: the execution's running preparation job, stopped.
Stdlib only (the Lambda runtime).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from ..contract.hub_id import parse_hub_id
from ..seams import (
    EXECUTION_TAG,
    FINISH_FAILED,
    FINISH_PREPARED,
    PARTS_DIR,
    PREPARE_MARKER,
    PREPARE_MODEL,
    DatasetIndex,
    Preparation,
)
from .aws_events import to_epoch
from .hub import fetched
from .preparation import Prepared, list_objects


def merge_parts(parts: dict[str, dict], held_out_parts: dict[str, dict] | None = None) -> tuple[dict, dict | None]:
    """(index.json, validation/index.json or None) of the dataset from its parts' indexes ({host: index}, and
    {host: validation index} for the parts with a validation split); the shard files are named relative to the
    dataset's root (and to validation/: `../parts/<host>/validation/...`)."""
    held_out_parts = held_out_parts or {}
    if not parts:
        raise ValueError("no part wrote an index.json: the preparation produced nothing")
    first = parts[min(parts)]
    one_tokenizer = ("format", "dtype", "eos_token_id", DatasetIndex.VOCAB_SIZE, DatasetIndex.TOKENIZER)
    for host, index in parts.items():
        for field in one_tokenizer:
            if index.get(field) != first.get(field):
                raise ValueError(f"part {host}: {field}={index.get(field)!r} differs from part {min(parts)}'s "
                                 f"{first.get(field)!r} (one tokenizer for all parts)")
    shards, held_out, documents = [], [], 0
    fraction = None
    for host in sorted(parts):
        index = parts[host]
        base = f"{PARTS_DIR}/{host}/"
        shards += [_rebased(s, base) for s in index["shards"]]
        if index.get("validation"):
            if host not in held_out_parts:
                raise ValueError(f"part {host}: its index.json names a validation split without its index.json")
            fraction = index["validation"]["fraction"]
            documents += index["validation"]["documents"]
            vbase = f"../{base}{index['validation']['dir']}/"
            held_out += [_rebased(s, vbase) for s in held_out_parts[host]["shards"]]
    common = {k: first[k] for k in one_tokenizer if k in first}
    merged = {**common, "loss_mask": any("mask" in s for s in shards),
              DatasetIndex.TOTAL_TOKENS: sum(s["tokens"] for s in shards), DatasetIndex.SHARDS: shards,
              DatasetIndex.DOCUMENTS: sum(p.get(DatasetIndex.DOCUMENTS, 0) for p in parts.values()),
              "parts": sorted(parts)}
    if not merged[DatasetIndex.TOTAL_TOKENS]:
        raise ValueError("the raw files hold no documents (0 tokens in every part): a dataset needs text to train on")
    validation = None
    if held_out:
        validation = {**common, "loss_mask": any("mask" in s for s in held_out),
                      DatasetIndex.TOTAL_TOKENS: sum(s["tokens"] for s in held_out), DatasetIndex.SHARDS: held_out}
        merged["validation"] = {"dir": "validation", "fraction": fraction, "documents": documents}
    return merged, validation


def _rebased(shard: dict, base: str) -> dict:
    """A part's shard entry with its files (the tokens, and the mask and document starts where it has them)
    named from `base`."""
    return {**shard, **{key: base + shard[key] for key in ("file", "mask", "starts") if key in shard}}


def job_cost(describe: dict, usd_per_hour: float) -> tuple[float, float]:
    """(USD, seconds) of a processing job: its instances' time from ProcessingStartTime to ProcessingEndTime at
    the processing rate (per second, all instances)."""
    start, end = to_epoch(describe.get("ProcessingStartTime")), to_epoch(describe.get("ProcessingEndTime"))
    seconds = max(0.0, (end or start or 0.0) - (start or end or 0.0))
    return round(seconds * usd_per_hour / 3600, 4), round(seconds, 1)


def finish(s3: Any, sagemaker: Any, preparation: dict) -> dict:
    """The finish step: the job's outcome and cost; on success the merged index, the tokenizer and the marker.
    Returns {"status": "prepared" | "failed", "message", "prepared": Prepared}."""
    prep = Preparation(**{f.name: preparation[f.name] for f in dataclasses.fields(Preparation)})
    describe = sagemaker.describe_processing_job(ProcessingJobName=prep.job_name)
    cost, seconds = job_cost(describe, prep.usd_per_hour)
    status = describe.get("ProcessingJobStatus")
    done = Prepared(key=prep.key, raw_source=prep.raw_source, data_source=prep.output_uri, tokens=0, reused=False,
                    cost_usd=round(cost + prep.earlier_usd, 6), seconds=seconds, job_name=prep.job_name,
                    instance_type=prep.instance_type,
                    instance_count=prep.instance_count)
    if status != "Completed":
        reason = "; ".join(r for r in (describe.get("FailureReason"), describe.get("ExitMessage")) if r) or status
        return {"status": FINISH_FAILED, "prepared": dataclasses.asdict(done),
                "message": f"preparing {prep.raw_source} failed: processing job {prep.job_name} ended {status}: "
                           f"{reason} (${cost:.4f} billed)"}
    if prep.kind == PREPARE_MODEL:  # a hub model's fetch: its copy complete, and its bill (spotrun/pipeline/hub.py)
        return _fetched(s3, prep, done)
    parts: dict[str, dict] = {}
    held_out: dict[str, dict] = {}
    for o in list_objects(s3, prep.bucket, f"{prep.prefix}{PARTS_DIR}/"):
        host, _, name = o["Key"][len(f"{prep.prefix}{PARTS_DIR}/"):].partition("/")
        if name in (DatasetIndex.FILE, f"validation/{DatasetIndex.FILE}"):
            found = parts if name == DatasetIndex.FILE else held_out
            found[host] = json.loads(s3.get_object(Bucket=prep.bucket, Key=o["Key"])["Body"].read())
    try:
        merged, validation = merge_parts(parts, held_out)
    except ValueError as exc:
        return {"status": FINISH_FAILED, "prepared": dataclasses.asdict(done),
                "message": f"preparing {prep.raw_source}: {exc} (processing job {prep.job_name}, ${cost:.4f})"}
    source = f"{prep.prefix}{PARTS_DIR}/{min(parts)}/tokenizer/"
    for o in list_objects(s3, prep.bucket, source):  # beside the data, as `spotrun prepare` leaves it (exported)
        s3.copy_object(Bucket=prep.bucket, Key=f"{prep.prefix}tokenizer/{o['Key'][len(source):]}",
                       CopySource={"Bucket": prep.bucket, "Key": o["Key"]})
    if validation is not None:
        s3.put_object(Bucket=prep.bucket, Key=f"{prep.prefix}validation/index.json",
                      Body=json.dumps(validation, indent=1).encode())
    s3.put_object(Bucket=prep.bucket, Key=f"{prep.prefix}index.json", Body=json.dumps(merged, indent=1).encode())
    done = dataclasses.replace(done, tokens=merged[DatasetIndex.TOTAL_TOKENS])
    s3.put_object(Bucket=prep.bucket, Key=prep.prefix + PREPARE_MARKER, Body=json.dumps({  # last: complete from here on
        "key": prep.key, "raw_source": prep.raw_source, "total_tokens": merged["total_tokens"],
        "parts": merged["parts"], "job_name": prep.job_name, "cost_usd": cost, "seconds": seconds}).encode())
    return {"status": FINISH_PREPARED, "prepared": dataclasses.asdict(done), "message": ""}


def _fetched(s3: Any, prep: Preparation, done: Prepared) -> dict:
    outcome = {**dataclasses.asdict(done), "kind": PREPARE_MODEL}
    try:
        manifest = fetched(s3, prep.bucket, parse_hub_id(prep.raw_source))
    except ValueError as exc:
        manifest, why = None, str(exc)
    else:
        why = "files listed in its manifest are missing"
    if manifest is None:
        return {"status": FINISH_FAILED, "prepared": outcome,
                "message": f"fetching {prep.raw_source}: the job {prep.job_name} completed but {prep.output_uri} is "
                           f"not a complete copy ({why}; ${done.cost_usd:.4f} billed)"}
    return {"status": FINISH_PREPARED, "prepared": outcome, "message": f"fetched {prep.raw_source} at commit "
            f"{manifest.get('commit')} into {prep.output_uri}"}


def stop_preparation(sagemaker: Any, *, job_prefix: str, execution: str) -> list[str]:
    """The canceller's part: the execution's preparation job, if still running, is stopped (an aborted execution's
    job would otherwise bill on to its MaxRuntime). Its name ends with the execution's hash (`job_name`) and its
    `execution` tag names the execution."""
    suffix = "-" + hashlib.sha256(execution.encode()).hexdigest()[:6]
    stopped = []
    pages = sagemaker.get_paginator("list_processing_jobs").paginate(NameContains=f"{job_prefix}prep-",
                                                                     StatusEquals="InProgress")
    for page in pages:
        for job in page["ProcessingJobSummaries"]:
            name = job["ProcessingJobName"]
            if not name.startswith(f"{job_prefix}prep-") or not name.endswith(suffix):
                continue
            tags = {t["Key"]: t["Value"] for t in sagemaker.list_tags(ResourceArn=job["ProcessingJobArn"])["Tags"]}
            if tags.get(EXECUTION_TAG) != execution:
                continue
            sagemaker.stop_processing_job(ProcessingJobName=name)
            stopped.append(name)
    return stopped
