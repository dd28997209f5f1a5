"""The Lambda handlers: estimate plan, cost guard decisions, interruption recorder (DynamoDB via moto)."""

from __future__ import annotations

import copy
import json

import boto3
import pytest
from moto import mock_aws

from spotrun.handlers.cost_guard import STOP_GRACE_S, decide
from spotrun.handlers.estimate import PipelineSettings, job_name, plan
from spotrun.handlers.interruptions import record, recorded_rates

SETTINGS = PipelineSettings(bucket="art-bucket", job_prefix="spotrun-dev-", model_package_group="spotrun-models",
                            poll_seconds=60, project="spotrun", stage="dev", cost_center="ml-platform")
RUN = {"version": 1, "name": "tiny-run",
       "model": {"init": "random", "config": {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4}},
       "data": {"source": "s3://art-bucket/datasets/d1/", "tokens": 1_000_000, "seq_len": 128},
       "compute": {"instance_type": "ml.g5.xlarge", "on_demand_fallback": True},
       "budget": {"max_usd": 20}, "tags": {"team": "nlp"}}


def test_plan_has_everything_create_training_job_needs():
    p = plan(copy.deepcopy(RUN), "exec-1", SETTINGS)
    assert p["status"] == "ok"
    assert p["job_name"].startswith("spotrun-dev-tiny-run-") and len(p["fallback_job_name"]) <= 63
    assert p["spot"] is True and p["instance_type"] == "ml.g5.xlarge" and p["instance_count"] == 1
    assert p["max_wait_seconds"] >= p["max_runtime_seconds"]
    assert p["input_data_config"] == [{"ChannelName": "train", "InputMode": "FastFile", "DataSource": {
        "S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://art-bucket/datasets/d1/",
                         "S3DataDistributionType": "FullyReplicated"}}}]
    assert json.loads(p["hyperparameters"]["model.config"])["model_type"] == "gpt2"
    assert all(isinstance(v, str) for v in p["hyperparameters"].values())
    tags = {t["Key"]: t["Value"] for t in p["tags"]}
    assert tags == {"project": "spotrun", "stage": "dev", "cost-center": "ml-platform", "team": "nlp",
                    "run": "tiny-run", "spotrun:method": "full", "spotrun:shape": "gpt2/3M/2L"}
    assert p["usd_per_hour"] == 1.408 and p["spot_discount"] == 0.70


def test_job_names_fit_sagemaker_limits_and_differ_per_execution():
    long = job_name(SETTINGS, "a" * 48, "exec-1")
    assert len(long + "-od") <= 63
    assert job_name(SETTINGS, "x", "exec-1") != job_name(SETTINGS, "x", "exec-2")


@pytest.mark.parametrize("mutate, status, field", [
    (lambda r: r.update(name="bad name"), "InvalidRun", "name"),
    (lambda r: r["data"].update(source="s3://other-bucket/datasets/d1/"), "InvalidRun", "data.source"),
    (lambda r: r["data"].update(source="/local/path"), "InvalidRun", "data.source"),
    (lambda r: r.update(model={"parameters": 1000}), "InvalidRun", "model.parameters"),
    (lambda r: r.update(registry={"model_package_group": "someone-elses"}), "InvalidRun",
     "registry.model_package_group"),
    (lambda r: r.update(budget={"max_usd": 0.001}), "OverBudget", "budget.max_usd"),
])
def test_runs_that_must_not_start_are_named(mutate, status, field):
    raw = copy.deepcopy(RUN)
    mutate(raw)
    p = plan(raw, "exec-1", SETTINGS)
    assert p["status"] == status and p["message"]
    assert p.get("field") == field


PLAN = plan(copy.deepcopy(RUN), "exec-1", SETTINGS)
GUARD0 = {"action": "wait", "job_name": PLAN["job_name"], "spot": True, "spent_before_usd": 0,
          "interruptions_before": 0}


def test_guard_waits_while_under_the_cap():
    out = decide(PLAN, GUARD0, {"TrainingJobStatus": "InProgress", "BillableTimeInSeconds": 3600}, now=0)
    # 1 h billed at 1.408 $/h with a 70% spot discount = $0.4224
    assert out["action"] == "wait" and out["cost_usd"] == pytest.approx(1.408 * 0.3)


def test_guard_stops_when_the_next_poll_would_pass_the_cap():
    rate = 1.408 * 0.3
    # The cap is $20: stop once spend + (60 s poll + 120 s grace) of spend would reach it.
    seconds = (20 / rate - (60 + STOP_GRACE_S) / 3600) * 3600
    assert decide(PLAN, GUARD0, {"TrainingJobStatus": "InProgress", "BillableTimeInSeconds": seconds - 5},
                  now=0)["action"] == "wait"
    out = decide(PLAN, GUARD0, {"TrainingJobStatus": "InProgress", "BillableTimeInSeconds": seconds + 5}, now=0)
    assert out["action"] == "stop" and out["stop_requested"] is True
    stopped = decide(PLAN, out, {"TrainingJobStatus": "Stopped", "BillableTimeInSeconds": seconds + 60}, now=0)
    assert stopped["action"] == "over_budget" and "cost cap" in stopped["message"]


def test_guard_uses_time_since_training_start_before_billable_time_is_known():
    out = decide(PLAN, GUARD0, {"TrainingJobStatus": "InProgress", "TrainingStartTime": "2026-01-01T00:00:00Z"},
                 now=1767225600 + 7200)
    assert out["cost_usd"] == pytest.approx(2 * 1.408 * 0.3)


def test_guard_falls_back_to_on_demand_on_the_same_run_when_spot_never_came():
    out = decide(PLAN, GUARD0, {"TrainingJobStatus": "Stopped", "SecondaryStatus": "MaxWaitTimeExceeded",
                                "BillableTimeInSeconds": 600,
                                "SecondaryStatusTransitions": [{"Status": "Interrupted"}]}, now=0)
    assert out["action"] == "fallback" and out["job_name"] == PLAN["fallback_job_name"] and out["spot"] is False
    assert out["spent_before_usd"] == pytest.approx(600 / 3600 * 1.408 * 0.3, abs=1e-4)
    # The on-demand job is charged at the full rate, on top of what the spot attempt cost.
    later = decide(PLAN, out, {"TrainingJobStatus": "InProgress", "BillableTimeInSeconds": 3600}, now=0)
    assert later["cost_usd"] == pytest.approx(out["spent_before_usd"] + 1.408, abs=1e-4)
    assert later["interruptions"] == 1


def test_guard_reports_savings_interruptions_and_loss_on_completion():
    describe = {"TrainingJobStatus": "Completed", "BillableTimeInSeconds": 1000, "TrainingTimeInSeconds": 4000,
                "SecondaryStatusTransitions": [{"Status": "Training"}, {"Status": "Interrupted"},
                                               {"Status": "Training"}, {"Status": "Interrupted"}],
                "FinalMetricDataList": [{"MetricName": "train:loss", "Value": 1.25}],
                "ModelArtifacts": {"S3ModelArtifacts": "s3://art-bucket/output/j/output/model.tar.gz"}}
    out = decide(PLAN, GUARD0, describe, now=0)
    report = out["report"]
    assert out["action"] == "completed"
    assert report["spot_savings_pct"] == 75.0  # (1 - 1000/4000) * 100
    assert report["interruptions"] == 2 and report["final_loss"] == 1.25
    assert report["cost_usd"] == round(1000 / 3600 * 1.408 * 0.3, 2)
    assert all(isinstance(v, str) for v in report["metadata"].values())


def test_guard_reports_failures_with_the_reason():
    out = decide(PLAN, GUARD0, {"TrainingJobStatus": "Failed", "FailureReason": "AlgorithmError: OOM"}, now=0)
    assert out["action"] == "failed" and "AlgorithmError: OOM" in out["message"]


def _event(status: str, secondary: str, *, start="2026-11-01T10:00:00Z", seconds=None) -> dict:
    detail = {"TrainingJobName": "spotrun-dev-a-1", "TrainingJobStatus": status, "SecondaryStatus": secondary,
              "ResourceConfig": {"InstanceType": "ml.g5.xlarge", "InstanceCount": 2},
              "SecondaryStatusTransitions": [{"Status": "Interrupted", "StartTime": start}]}
    if seconds is not None:
        detail["TrainingTimeInSeconds"] = seconds
    return {"id": "e1", "time": "2026-11-01T10:00:01Z", "detail": detail}


def test_recorder_is_idempotent_and_feeds_the_interruption_rate():
    with mock_aws():
        ddb = boto3.resource("dynamodb", region_name="us-east-1")
        table = ddb.create_table(TableName="t", BillingMode="PAY_PER_REQUEST",
                                 KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"},
                                            {"AttributeName": "sk", "KeyType": "RANGE"}],
                                 AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"},
                                                       {"AttributeName": "sk", "AttributeType": "S"}])
        kw = {"namespace": "spotrun", "stage": "dev"}
        assert record(_event("InProgress", "Interrupted"), table, **kw) == "recorded"
        assert record(_event("InProgress", "Interrupted"), table, **kw) == "duplicate"  # redelivered
        assert record(_event("InProgress", "Interrupted", start="2026-11-01T12:00:00Z"), table, **kw) == "recorded"
        assert record(_event("InProgress", "Training"), table, **kw) == "ignored"
        assert record(_event("Completed", "Completed", seconds=9 * 3600), table, **kw) == "recorded"
        assert record(_event("Completed", "Completed", seconds=9 * 3600), table, **kw) == "duplicate"
        assert table.scan()["Count"] == 3
        # 2 interruptions over 9 h x 2 instances = 18 instance-hours
        assert recorded_rates(table) == {"ml.g5.xlarge": pytest.approx(2 / 18)}
        assert recorded_rates(table, min_hours=100) == {}
