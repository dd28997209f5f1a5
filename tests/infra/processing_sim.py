"""A SageMaker Processing job behind moto, run for real on this machine from the request the state machine sent.

moto records a processing job as Completed the moment it is created and keeps no ProcessingResources, so
`RecordedRequests` keeps every CreateProcessingJob request as sent (also for botocore's model), and
`run_processing_job` does what SageMaker does with it (Processing documentation, API reference ProcessingS3Input):
- one /opt/ml per instance (`algo-1`..`algo-N`, /opt/ml/config/resourceconfig.json naming it);
- S3Prefix inputs: the objects under the prefix, each instance 1/N of them with ShardedByS3Key (by key, in turn),
  all with FullyReplicated; ManifestFile inputs: the manifest's prefix + each listed key; both at LocalPath
  (under the instance's /opt/ml), keeping the key relative to the prefix;
- the ContainerEntrypoint, run with SPOTRUN_SM_ROOT at that /opt/ml (what the image's /opt/ml is); a failed
  container's /opt/ml/output/message becomes ExitMessage (its first 1 KB);
- each output's LocalPath uploaded to its S3Uri at the end (EndOfJob), every instance to the same prefix;
- billing: ProcessingStartTime to ProcessingEndTime, `billed_s` of simulated time, per instance.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

SM_ROOT = "/opt/ml"


def _split(uri: str) -> tuple[str, str]:
    bucket, _, key = uri[len("s3://"):].partition("/")
    return bucket, key


def _local(root: Path, path: str) -> Path:
    assert path.startswith(SM_ROOT + "/"), path
    return root / path[len(SM_ROOT) + 1:]


def _keys(s3, bucket: str, prefix: str) -> list[str]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def _download_input(s3, spec: dict, root: Path, index: int, count: int) -> None:
    s3_input = spec["S3Input"]
    target = _local(root, s3_input["LocalPath"])
    target.mkdir(parents=True, exist_ok=True)
    bucket, prefix = _split(s3_input["S3Uri"])
    if s3_input["S3DataType"] == "ManifestFile":
        manifest = json.loads(s3.get_object(Bucket=bucket, Key=prefix)["Body"].read())
        m_bucket, m_prefix = _split(manifest[0]["prefix"])
        pairs = [(m_bucket, m_prefix + key, key) for key in manifest[1:]]
    else:
        pairs = [(bucket, key, key[len(prefix):].lstrip("/")) for key in _keys(s3, bucket, prefix)]
    if s3_input.get("S3DataDistributionType") == "ShardedByS3Key":
        pairs = pairs[index::count]
    for src_bucket, key, relative in pairs:
        (target / relative).parent.mkdir(parents=True, exist_ok=True)
        s3.download_file(src_bucket, key, str(target / relative))


def run_processing_job(s3, job, request: dict, workdir: Path, *, billed_s: float = 600.0) -> list[str]:
    """Run `request` (as CreateProcessingJob received it) on this machine; returns each instance's stdout. The moto
    `job` gets the outcome: status, times, and the failure reason of a failed container."""
    count = request["ProcessingResources"]["ClusterConfig"]["InstanceCount"]
    entry = request["AppSpecification"]["ContainerEntrypoint"]
    command = [sys.executable if entry[0] == "python" else entry[0], *entry[1:]]
    hosts = [f"algo-{i + 1}" for i in range(count)]
    outs, failure = [], None
    for index, host in enumerate(hosts):
        root = workdir / job.processing_job_name / host
        (root / "config").mkdir(parents=True)
        (root / "config" / "resourceconfig.json").write_text(json.dumps({"current_host": host, "hosts": hosts}))
        for spec in request.get("ProcessingInputs", []):
            _download_input(s3, spec, root, index, count)
        result = subprocess.run(command, env={**os.environ, "SPOTRUN_SM_ROOT": str(root)}, capture_output=True,
                                text=True, timeout=300)
        outs.append(result.stdout + result.stderr)
        if result.returncode != 0:  # SageMaker's reason names the exit code; the container's own is ExitMessage
            failure = f"AlgorithmError: ClientError: exit code {result.returncode}"
            message = root / "output" / "message"
            if message.is_file():
                job.exit_message = message.read_bytes()[:1024].decode()
            continue
        for output in request["ProcessingOutputConfig"]["Outputs"]:
            local = _local(root, output["S3Output"]["LocalPath"])
            bucket, prefix = _split(output["S3Output"]["S3Uri"])
            for path in sorted(p for p in local.rglob("*") if p.is_file()):
                s3.upload_file(str(path), bucket, prefix + path.relative_to(local).as_posix())
    start = job.creation_time if isinstance(job.creation_time, dt.datetime) else dt.datetime.now(dt.timezone.utc)
    job.processing_start_time = start
    job.processing_end_time = start + dt.timedelta(seconds=billed_s)
    job.processing_job_status = "Failed" if failure else "Completed"
    if failure:
        job.failure_reason = failure
    return outs


class RecordedRequests:
    """Every CreateProcessingJob request moto receives, as sent (moto's own model drops ProcessingResources)."""

    def __init__(self):
        self.requests: dict[str, dict] = {}
        self.keep_running = False  # True: the created job stays InProgress (moto's would be Completed at once)

    def wrap(self, original):
        recorder = self

        def create_processing_job(response_self):
            request = json.loads(response_self.body)
            recorder.requests[request["ProcessingJobName"]] = request
            response = original(response_self)
            if recorder.keep_running:
                job = response_self.sagemaker_backend.processing_jobs[request["ProcessingJobName"]]
                job.processing_job_status = "InProgress"
            return response
        return create_processing_job
