"""The pipeline's preparation job for real on this machine: `python -m spotrun_trainer prepare --sagemaker-processing`
on two SageMaker Processing "instances" (each its own /opt/ml with resourceconfig.json and half of the raw files, as
ShardedByS3Key gives them), their outputs uploaded to one prefix (moto S3), the finish step's merge
(spotrun.pipeline.preparation.finish), and the trainer's launcher training on the merged dataset with its validation
split."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import boto3
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from moto import mock_aws

from spotrun.local.harness import loss_history, val_history
from spotrun.pipeline.preparation_finish import finish
from spotrun.seams import PARTS_DIR, PREPARE_MARKER, Preparation
from spotrun_trainer.data import prepare, read_index

from .conftest import Job

pytestmark = pytest.mark.slow  # starts torchrun

BUCKET = "spotrun-artifacts-test"
PREFIX = "datasets/_prepared/0123456789abcdef01234567/"


def _raw_files(corpus: Path, root: Path) -> list[Path]:
    """The corpus as four raw files of three formats."""
    lines = corpus.read_text().splitlines()
    root.mkdir(parents=True)
    quarter = len(lines) // 4
    chunks = [lines[i * quarter:(i + 1) * quarter] for i in range(3)] + [lines[3 * quarter:]]
    files = [root / "a.jsonl", root / "b.jsonl.gz", root / "c.parquet", root / "d.jsonl"]
    files[0].write_text("\n".join(chunks[0]) + "\n")
    with gzip.open(files[1], "wt", encoding="utf-8") as fh:
        fh.write("\n".join(chunks[1]) + "\n")
    pq.write_table(pa.table({"text": [json.loads(line)["text"] for line in chunks[2]]}), files[2])
    files[3].write_text("\n".join(chunks[3]) + "\n")
    return files


def _instance(root: Path, host: str, files: list[Path], tokenizer: Path) -> Path:
    """One processing instance's /opt/ml: its share of the files and the tokenizer files (the manifest's)."""
    (root / "config").mkdir(parents=True)
    (root / "config" / "resourceconfig.json").write_text(json.dumps({"current_host": host,
                                                                     "hosts": ["algo-1", "algo-2"]}))
    data = root / "processing" / "input" / "data"
    data.mkdir(parents=True)
    for f in files:
        shutil.copy(f, data / f.name)
    shutil.copytree(tokenizer, root / "processing" / "input" / "tokenizer")
    return root


def _run_instance(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "SPOTRUN_SM_ROOT": str(root)}
    return subprocess.run([sys.executable, "-m", "spotrun_trainer", "prepare", "--sagemaker-processing",
                           "--shard-mb", "0.004", "--validation-fraction", "0.1"],
                          env=env, capture_output=True, text=True, timeout=300)


class _ProcessingJob:
    """DescribeProcessingJob of the finished job (moto has no clock of its own for it)."""

    def describe_processing_job(self, ProcessingJobName):  # noqa: N803 - boto3's keyword
        import datetime as dt
        start = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.timezone.utc)
        return {"ProcessingJobName": ProcessingJobName, "ProcessingJobStatus": "Completed",
                "ProcessingStartTime": start, "ProcessingEndTime": start + dt.timedelta(seconds=360)}


def test_two_instances_prepare_halves_and_the_merged_index_trains(assets, tmp_path):
    files = _raw_files(assets["corpus"], tmp_path / "raw")
    hosts = {"algo-1": files[:2], "algo-2": files[2:]}
    for host, share in hosts.items():
        result = _run_instance(_instance(tmp_path / host, host, share, assets["tokenizer"]))
        assert result.returncode == 0, result.stderr[-3000:]
        assert f"prepared part {host}:" in result.stdout
    prep = Preparation(job_name="spotrun-dev-prep-0123456789ab-abcdef", key=PREFIX.split("/")[-2],
                       raw_source=f"s3://{BUCKET}/datasets/raw/", output_uri=f"s3://{BUCKET}/{PREFIX}",
                       bucket=BUCKET, prefix=PREFIX, instance_type="ml.m5.xlarge", instance_count=2,
                       usd_per_hour=0.46, max_runtime_seconds=3600, processing_resources={}, processing_inputs=[],
                       processing_outputs=[], entrypoint=[], stopping_condition={}, tags=[], poll_seconds=60, files=4)
    merged = tmp_path / "merged"
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        for host in hosts:  # SageMaker uploads each instance's output directory to the one output prefix
            out = tmp_path / host / "processing" / "output"
            for path in out.rglob("*"):
                if path.is_file():
                    s3.upload_file(str(path), BUCKET, PREFIX + path.relative_to(out).as_posix())
        result = finish(s3, _ProcessingJob(), json.loads(json.dumps(prep.__dict__)))
        assert result["status"] == "prepared", result
        for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=PREFIX)["Contents"]:
            target = merged / o["Key"][len(PREFIX):]
            target.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(BUCKET, o["Key"], str(target))
    # Two instances at $0.23/h each for 360 s.
    assert result["prepared"]["cost_usd"] == round(360 * 0.46 / 3600, 4) and result["prepared"]["seconds"] == 360

    index, validation = read_index(merged), read_index(merged / "validation")
    assert index["parts"] == ["algo-1", "algo-2"] and json.loads((merged / PREPARE_MARKER).read_text())["key"] in PREFIX
    assert all(s["file"].startswith(f"{PARTS_DIR}/algo-") for s in index["shards"])
    # The same tokens as one prepare over all four files: every document once, split the same way.
    single = prepare(files, str(assets["tokenizer"]), tmp_path / "single", shard_bytes=4000, validation_fraction=0.1)
    assert index["total_tokens"] == single["total_tokens"] == result["prepared"]["tokens"]
    assert validation["total_tokens"] == read_index(tmp_path / "single" / "validation")["total_tokens"]

    def tokens(root: Path, idx: dict) -> np.ndarray:
        return np.concatenate([np.fromfile(root / s["file"], dtype=idx["dtype"]) for s in idx["shards"]])
    assert np.array_equal(tokens(merged, index), tokens(tmp_path / "single", single))
    assert (merged / "tokenizer" / "tokenizer.json").is_file()

    job_root = tmp_path / "job"
    job_root.mkdir()
    job = Job(job_root, {**assets, "data": merged}, max_steps=8, **{"eval.every_steps": 4})
    assert job.run() == 0, job.text()[-4000:]
    losses, val = loss_history(job.output), val_history(job.output)
    assert sorted(losses) == list(range(1, 9)) and all(np.isfinite(v) for v in losses.values())
    assert 0 in val and 8 in val  # the merged validation/ split evaluated: the base model's and the last
    assert (job.output / "tokenizer.json").is_file()  # the merged dataset's tokenizer/, exported with the model
