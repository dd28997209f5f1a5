"""Estimates that learn: a completed job's measured MFU is recorded (DynamoDB via moto, DescribeTrainingJob through
botocore's Stubber, which checks the response against the service model) and the next estimate of the same
model shape and method uses it, saying so."""

from __future__ import annotations

import copy
from datetime import datetime, timezone

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from spotrun.pipeline.plan import PipelineSettings, plan
from spotrun.planner.estimate import load_catalog
from spotrun.planner.measured import (
    METHOD_TAG,
    SHAPE_TAG,
    record_performance,
    recorded_utilization,
    shape_key,
)

from .pipeline_inputs import recorder_table

SETTINGS = PipelineSettings(bucket="art-bucket", job_prefix="spotrun-dev-", model_package_group="spotrun-models",
                            poll_seconds=60, project="spotrun", stage="dev", cost_center="ml-platform")
LLAMA_1B = {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 16,
            "num_attention_heads": 16, "vocab_size": 32000}
RUN = {"version": 1, "name": "llama-1b", "model": {"init": "random", "config": LLAMA_1B},
       "data": {"source": "s3://art-bucket/datasets/d1/", "tokens": 2_000_000_000, "seq_len": 2048},
       "compute": {"instance_type": "ml.p4d.24xlarge"}, "budget": {"max_usd": 100_000}}


def _describe(job: str, itype: str, count: int, metrics: dict[str, float]) -> dict:
    now = datetime(2026, 11, 30, tzinfo=timezone.utc)
    return {"TrainingJobName": job, "TrainingJobArn": f"arn:aws:sagemaker:us-east-1:123456789012:training-job/{job}",
            "ModelArtifacts": {"S3ModelArtifacts": f"s3://art-bucket/output/{job}/output/model.tar.gz"},
            "TrainingJobStatus": "Completed", "SecondaryStatus": "Completed",
            "AlgorithmSpecification": {"TrainingInputMode": "File", "TrainingImage": "img:latest"},
            "ResourceConfig": {"InstanceType": itype, "InstanceCount": count, "VolumeSizeInGB": 100},
            "StoppingCondition": {"MaxRuntimeInSeconds": 3600}, "CreationTime": now,
            "FinalMetricDataList": [{"MetricName": k, "Value": v, "Timestamp": now} for k, v in metrics.items()]}


def _completed_event(p: dict) -> dict:
    return {"detail": {"TrainingJobName": p["job_name"], "TrainingJobStatus": "Completed",
                       "SecondaryStatus": "Completed",
                       "ResourceConfig": {"InstanceType": p["instance_type"], "InstanceCount": p["instance_count"]},
                       "Tags": {t["Key"]: t["Value"] for t in p["tags"]}}}


@pytest.fixture
def table():
    with mock_aws():
        yield recorder_table()


def test_an_estimate_after_a_recorded_run_uses_the_recorded_mfu(table):
    catalog = load_catalog()

    def lookup(shape: str, method: str):
        return recorded_utilization(table, shape=shape, method=method)

    first = plan(copy.deepcopy(RUN), "exec-1", SETTINGS, mfu_lookup=lookup, catalog=catalog)
    assert first["status"] == "ok", first
    assert first["estimate"]["utilization_source"] == "catalog default"
    assert first["estimate"]["utilization"] == catalog["defaults"]["utilization"]
    tags = {t["Key"]: t["Value"] for t in first["tags"]}
    assert tags[SHAPE_TAG] == shape_key(LLAMA_1B) and tags[METHOD_TAG] == "full"

    sagemaker = boto3.client("sagemaker", region_name="us-east-1")
    gpus = catalog["instances"]["ml.p4d.24xlarge"]["gpus"]
    response = _describe(first["job_name"], "ml.p4d.24xlarge", first["instance_count"],
                         {"train:loss": 2.1, "train:mfu": 0.41, "train:tokens_per_s": 8 * 3000.0})
    with Stubber(sagemaker) as stub:
        for _ in range(2):
            stub.add_response("describe_training_job", response, {"TrainingJobName": first["job_name"]})
        assert record_performance(_completed_event(first), table, sagemaker, catalog) == "recorded"
        assert record_performance(_completed_event(first), table, sagemaker, catalog) == "duplicate"  # redelivered
    item = table.get_item(Key={"pk": first["job_name"], "sk": "PERFORMANCE"})["Item"]
    assert float(item["tokens_per_s_per_device"]) == pytest.approx(8 * 3000.0 / (gpus * first["instance_count"]))

    second = plan(copy.deepcopy(RUN), "exec-2", SETTINGS, mfu_lookup=lookup, catalog=catalog)
    assert second["estimate"]["utilization"] == pytest.approx(0.41)
    assert second["estimate"]["utilization_source"].startswith("measured: the median MFU of 1 earlier full run")
    # Same FLOPs at 0.41 instead of 0.25 of peak.
    assert second["estimate"]["gpu_hours"] == pytest.approx(first["estimate"]["gpu_hours"] * 0.25 / 0.41)

    other = copy.deepcopy(RUN)
    other["model"]["config"] = {**LLAMA_1B, "num_hidden_layers": 24}  # another shape learns nothing from it
    assert plan(other, "exec-3", SETTINGS, mfu_lookup=lookup, catalog=catalog)["estimate"]["utilization_source"] \
        == "catalog default"


def test_jobs_without_a_measured_mfu_or_spotrun_tags_teach_nothing(table):
    catalog = load_catalog()
    sagemaker = boto3.client("sagemaker", region_name="us-east-1")
    p = plan(copy.deepcopy(RUN), "exec-1", SETTINGS, catalog=catalog)
    untagged = _completed_event(p)
    untagged["detail"]["Tags"] = {}
    with Stubber(sagemaker) as stub:
        # A CPU-like run: the trainer prints mfu=na, so no train:mfu metric exists.
        stub.add_response("describe_training_job", _describe(p["job_name"], "ml.p4d.24xlarge", 1,
                                                             {"train:tokens_per_s": 100.0}))
        stub.add_response("describe_training_job", _describe(p["job_name"], "ml.p4d.24xlarge", 1,
                                                             {"train:mfu": 0.4}))
        assert record_performance(_completed_event(p), table, sagemaker, catalog) == "ignored"
        assert record_performance(untagged, table, sagemaker, catalog) == "ignored"
    stopped = _completed_event(p)
    stopped["detail"]["TrainingJobStatus"] = "Stopped"
    assert record_performance(stopped, table, sagemaker, catalog) == "ignored"  # no API call for unfinished jobs
    assert table.scan()["Count"] == 0
