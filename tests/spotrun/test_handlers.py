"""The Lambda handlers: estimate plan, cost guard decisions, canceller, interruption recorder.

AWS stands in as moto (S3, DynamoDB) or as botocore's Stubber on a real client (Service Quotas, SageMaker stop),
which checks every request and canned response against the service's published model.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from datetime import datetime, timezone

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from spotrun.pipeline import guard as guard_rules
from spotrun.pipeline.aws_events import to_epoch
from spotrun.pipeline.guard import STOP_GRACE_S, newest_checkpoint
from spotrun.pipeline.plan import PipelineSettings, cancel, first_job_of, job_name, plan
from spotrun.pipeline.preflight import RUN_RECORD
from spotrun.planner.estimate import load_catalog
from spotrun.planner.measured import record, recorded_rates
from spotrun.planner.segments import MAX_SEGMENTS, next_max_runtime, segment_job_name
from spotrun.policy.engine import SimPlan
from spotrun.seams import (
    CHECKPOINT_MANIFEST,
    COMPLETED_METRIC,
    GUARD_FIELDS,
    PLAN_FIELDS,
    Guard,
    GuardAction,
    Plan,
    PlanStatus,
    SpotPolicy,
    StopNotice,
    checkpoint_step_dir,
)
from spotrun.settings.wire import parse


def decide(plan: dict, guard: dict, describe: dict, **kwargs) -> dict:
    """The cost guard's rule on the JSON the state machine carries, as its handler calls it: decoded at entry
    (spotrun.seams.Plan, Guard), encoded on return."""
    return guard_rules.decide(Plan.from_json(plan), Guard.from_json(guard), describe, **kwargs).to_json()


def next_wait(plan: dict, job_age_s: float, spent_usd: float) -> int:
    return guard_rules.next_wait(Plan.from_json(plan), job_age_s, spent_usd)


SETTINGS = PipelineSettings(bucket="art-bucket", job_prefix="spotrun-dev-", model_package_group="spotrun-models",
                            poll_seconds=60, project="spotrun", stage="dev", cost_center="ml-platform",
                            volume_kms_key_arn="arn:aws:kms:us-east-1:123456789012:key/k")
RUN = {"version": 1, "name": "tiny-run",
       "model": {"init": "random", "config": {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4}},
       "data": {"source": "s3://art-bucket/datasets/d1/", "tokens": 1_000_000, "seq_len": 128},
       "compute": {"instance_type": "ml.g5.xlarge", "on_demand_fallback": True},
       "budget": {"max_usd": 20}, "tags": {"team": "nlp"}}
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


@pytest.fixture
def s3():
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="art-bucket")
        yield client


def test_plan_has_every_plan_field_and_what_create_training_job_needs(s3):
    p = plan(copy.deepcopy(RUN), "exec-1", SETTINGS, s3_client=s3, started="2026-01-01T00:00:00Z")
    assert p["status"] == "ok" and set(p) == PLAN_FIELDS
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
                    "run": "tiny-run", "execution": "exec-1", "spotrun:method": "full", "spotrun:shape": "gpt2/3M/2L"}
    assert p["usd_per_hour"] == 1.408 and "us-east-1" in p["price_source"]


def test_no_volume_kms_key_for_instance_types_with_local_storage():
    p = plan(copy.deepcopy(RUN), "exec-1", SETTINGS)
    for config in (p["resource_config_spot"], p["resource_config_on_demand"]):
        assert "VolumeKmsKeyId" not in config  # g5 has local NVMe: the API refuses the key
        assert config["InstanceType"] == "ml.g5.xlarge" and config["InstanceCount"] == 1
    # A family without local storage (none in the catalog today) gets the key.
    catalog = load_catalog()
    catalog["families"]["g5"] = {**catalog["families"]["g5"], "local_storage": False}
    p = plan(copy.deepcopy(RUN), "exec-1", SETTINGS, catalog=catalog)
    assert p["resource_config_spot"]["VolumeKmsKeyId"] == SETTINGS.volume_kms_key_arn


def test_warm_pool_only_on_the_on_demand_resource_config():
    run = copy.deepcopy(RUN)
    run["compute"].update(spot=False, warm_pool_minutes=10)
    p = plan(run, "exec-1", SETTINGS)
    assert p["resource_config_on_demand"]["KeepAlivePeriodInSeconds"] == 600
    assert "KeepAlivePeriodInSeconds" not in p["resource_config_spot"]


def test_each_execution_gets_its_own_checkpoint_prefix_and_records_what_it_trains(s3):
    a = plan(copy.deepcopy(RUN), "exec-1", SETTINGS, s3_client=s3)
    b = plan(copy.deepcopy(RUN), "exec-2", SETTINGS, s3_client=s3)
    assert a["checkpoint_s3_uri"] == "s3://art-bucket/checkpoints/tiny-run/exec-1/"
    assert b["checkpoint_s3_uri"] == "s3://art-bucket/checkpoints/tiny-run/exec-2/"
    recorded = json.loads(s3.get_object(Bucket="art-bucket", Key=f"{a['checkpoint_prefix']}{RUN_RECORD}")["Body"]
                          .read())
    assert recorded["data_tokens"] == 1_000_000 and recorded["method"] == "full"


def test_a_run_record_is_created_once_and_another_runs_record_is_never_replaced(s3):
    """The CLI's check and the estimate Lambda write the same record (kept); a different run's record already
    under the execution's prefix (moto enforces If-None-Match: *) refuses the plan and stays as it was."""
    assert plan(copy.deepcopy(RUN), "exec-1", SETTINGS, s3_client=s3)["status"] == "ok"
    assert plan(copy.deepcopy(RUN), "exec-1", SETTINGS, s3_client=s3)["status"] == "ok"
    key = "checkpoints/tiny-run/exec-2/" + RUN_RECORD
    s3.put_object(Bucket="art-bucket", Key=key, Body=json.dumps({"run": "other-run"}).encode())
    refused = plan(copy.deepcopy(RUN), "exec-2", SETTINGS, s3_client=s3)
    assert refused["field"] == "execution" and 'another run ("other-run")' in refused["message"], refused
    assert json.loads(s3.get_object(Bucket="art-bucket", Key=key)["Body"].read()) == {"run": "other-run"}


def test_resume_from_continues_an_earlier_executions_checkpoints_with_a_new_lr(s3):
    plan(copy.deepcopy(RUN), "exec-1", SETTINGS, s3_client=s3)
    run = copy.deepcopy(RUN)
    run["training"] = {"lr": 5e-5}
    run["checkpoint"] = {"resume_from": "exec-1"}
    p = plan(run, "exec-2", SETTINGS, s3_client=s3)
    assert p["status"] == "ok", p
    assert p["checkpoint_s3_uri"] == "s3://art-bucket/checkpoints/tiny-run/exec-1/"
    assert p["job_name"] != plan(copy.deepcopy(RUN), "exec-1", SETTINGS)["job_name"]


@pytest.mark.parametrize("mutate, says", [
    (lambda r: r["data"].update(tokens=2_000_000), "same data: data_tokens was 1000000"),
    (lambda r: r["model"]["config"].update(n_layer=3), "same model shape: parameters was"),
    (lambda r: r["checkpoint"].update(resume_from="never-ran"), "nothing recorded under"),
])
def test_resume_from_is_refused_when_model_or_data_differ_or_nothing_is_there(s3, mutate, says):
    plan(copy.deepcopy(RUN), "exec-1", SETTINGS, s3_client=s3)
    run = copy.deepcopy(RUN)
    run["checkpoint"] = {"resume_from": "exec-1"}
    mutate(run)
    p = plan(run, "exec-2", SETTINGS, s3_client=s3)
    assert p["status"] == "InvalidRun" and p["field"] == "checkpoint.resume_from", p
    assert says in p["message"]


@pytest.mark.parametrize("found, says", [
    (None, "no execution has this name"),
    (("RUNNING", "tiny-run"), "still running"),
    (("SUCCEEDED", "other-run"), 'this one ran "other-run"'),
])
def test_resume_from_names_only_an_ended_execution_of_the_same_run(s3, found, says):
    plan(copy.deepcopy(RUN), "exec-1", SETTINGS, s3_client=s3)
    run = copy.deepcopy(RUN)
    run["checkpoint"] = {"resume_from": "exec-1"}
    p = plan(run, "exec-2", SETTINGS, s3_client=s3, execution_status=lambda name: found)
    assert p["status"] == "InvalidRun" and p["field"] == "checkpoint.resume_from" and says in p["message"], p
    ended = plan(run, "exec-2", SETTINGS, s3_client=s3, execution_status=lambda name: ("FAILED", "tiny-run"))
    assert ended["status"] == "ok", ended


LIMITED = dataclasses.replace(SETTINGS, max_usd_per_run=15, max_instances_per_run=2, max_concurrent_runs=3)


@pytest.mark.parametrize("mutate, running, field, says", [
    (lambda r: None, 3, None, None),
    (lambda r: r["budget"].update(max_usd=16), 1, "budget.max_usd", "at most $15.00 (max_usd_per_run"),
    (lambda r: r["compute"].update(instance_count=3), 1, "compute.instance_count", "at most 2"),
    (lambda r: None, 4, "run", "at most 3 at once (max_concurrent_runs"),
])
def test_the_stage_limits_cap_instances_and_concurrent_runs(mutate, running, field, says):
    raw = copy.deepcopy(RUN)
    raw["budget"]["max_usd"] = 15
    mutate(raw)
    p = plan(raw, "exec-1", LIMITED, running_executions=running)
    if field is None:
        assert p["status"] == "ok" and p["instance_count"] <= 2, p
    else:
        assert p["status"] == "InvalidRun" and p["field"] == field and says in p["message"], p


def test_registration_is_always_for_review():
    raw = copy.deepcopy(RUN)
    raw["registry"] = {"approval_status": "Approved"}
    p = plan(raw, "exec-1", SETTINGS)
    assert p["status"] == "InvalidRun" and p["field"] == "registry.approval_status" and "permissioned" in p["message"]
    assert plan(copy.deepcopy(RUN), "exec-1", SETTINGS)["approval_status"] == "PendingManualApproval"


def test_job_names_fit_sagemaker_limits_and_differ_per_execution():
    long = job_name(SETTINGS.job_prefix, "a" * 48, "exec-1")
    assert len(long + f"-{MAX_SEGMENTS}od") <= 63
    assert job_name(SETTINGS.job_prefix, "x", "exec-1") != job_name(SETTINGS.job_prefix, "x", "exec-2")


def test_a_region_without_prices_is_refused_by_name():
    p = plan(copy.deepcopy(RUN), "exec-1", PipelineSettings(**{**SETTINGS.__dict__, "region": "eu-west-3"}))
    assert p["status"] == "InvalidRun" and p["field"] == "region"
    assert "eu-west-3" in p["message"] and "us-east-1" in p["message"]


def test_allowed_instance_types_restrict_explicit_and_auto_choices():
    settings = PipelineSettings(**{**SETTINGS.__dict__, "allowed_instance_types": ("ml.g6.xlarge",)})
    p = plan(copy.deepcopy(RUN), "exec-1", settings)
    assert p["status"] == "InvalidRun" and p["field"] == "compute.instance_type" and "ml.g6.xlarge" in p["message"]
    run = copy.deepcopy(RUN)
    run["compute"]["instance_type"] = "auto"
    assert plan(run, "exec-1", settings)["instance_type"] == "ml.g6.xlarge"


def _quotas(value: float, name: str = "ml.g5.xlarge for spot training job usage"):
    client = boto3.client("service-quotas", region_name="us-east-1")
    stub = Stubber(client)
    stub.add_response("list_service_quotas", {"Quotas": [
        {"ServiceCode": "sagemaker", "QuotaName": name, "QuotaCode": "L-12345678", "Value": value}]},
        {"ServiceCode": "sagemaker"})
    stub.activate()
    return client


def test_quota_preflight_refuses_a_zero_quota_with_its_name_and_how_to_raise_it():
    p = plan(copy.deepcopy(RUN), "exec-1", SETTINGS, quotas_client=_quotas(0))
    assert p["status"] == "InvalidRun" and p["field"] == "compute.instance_type"
    assert '"ml.g5.xlarge for spot training job usage" (L-12345678) is 0' in p["message"]
    assert "request-service-quota-increase" in p["message"]
    assert plan(copy.deepcopy(RUN), "exec-1", SETTINGS, quotas_client=_quotas(2))["status"] == "ok"
    # On-demand runs check the on-demand quota: the spot one does not count for them.
    run = copy.deepcopy(RUN)
    run["compute"]["spot"] = False
    refused = plan(run, "exec-1", SETTINGS, quotas_client=_quotas(0, "ml.g5.xlarge for training job usage"))
    assert refused["status"] == "InvalidRun" and "for training job usage" in refused["message"]


@pytest.mark.parametrize("mutate, status, field", [
    (lambda r: r.update(name="bad name"), "InvalidRun", "name"),
    (lambda r: r["data"].update(source="s3://other-bucket/datasets/d1/"), "InvalidRun", "data.source"),
    (lambda r: r["data"].update(source="/local/path"), "InvalidRun", "data.source"),
    (lambda r: r.update(model={"parameters": 1000}), "InvalidRun", "model.parameters"),
    (lambda r: r.update(registry={"model_package_group": "someone-elses"}), "InvalidRun",
     "registry.model_package_group"),
    (lambda r: r.update(checkpoint={"resume_from": "has space"}), "InvalidRun", "checkpoint.resume_from"),
    (lambda r: r.update(budget={"max_usd": 0.001}), "OverBudget", "budget.max_usd"),
])
def test_runs_that_must_not_start_are_named(mutate, status, field):
    raw = copy.deepcopy(RUN)
    mutate(raw)
    p = plan(raw, "exec-1", SETTINGS)
    assert p["status"] == status and p["message"]
    assert p.get("field") == field


PLAN = plan(copy.deepcopy(RUN), "exec-1", SETTINGS, started="2026-01-01T00:00:00Z")
GUARD0 = {"action": "wait", "job_name": PLAN["job_name"], "spot": True, "wait_seconds": 60, "spent_before_usd": 0,
          "interruptions_before": 0, "segment": 1, "max_runtime_seconds": PLAN["max_runtime_seconds"],
          "max_wait_seconds": PLAN["max_wait_seconds"], "hyperparameters": PLAN["hyperparameters"],
          "segments": []}
RATE = 1.408  # on-demand $/h of one ml.g5.xlarge in us-east-1
DONE = [{"MetricName": "train:loss", "Value": 1.25}, {"MetricName": COMPLETED_METRIC, "Value": 100}]
OURS = {"execution": "exec-1"}


def _running(hours: float, **extra) -> dict:
    return {"TrainingJobStatus": "InProgress", "SecondaryStatus": "Training", "CreationTime": T0,
            "TrainingStartTime": T0, **extra}


def _ended(status: str, billable: float, **extra) -> dict:
    return {"TrainingJobStatus": status, "SecondaryStatus": extra.pop("secondary", status),
            "BillableTimeInSeconds": billable, "TrainingTimeInSeconds": extra.pop("training", billable),
            "CreationTime": T0, **extra}


def test_guard_output_is_a_guard_and_waits_under_the_cap():
    out = decide(PLAN, GUARD0, _running(1), now=T0 + 3600, job_tags=OURS)
    assert set(out) == GUARD_FIELDS and out["action"] == GuardAction.WAIT.value
    # While running the cap is held on an upper bound: elapsed x on-demand price (no spot discount assumed).
    assert out["cost_usd"] == pytest.approx(RATE)


def test_the_running_bound_counts_only_billed_statuses_not_the_waits_for_capacity():
    transitions = [{"Status": "Starting", "StartTime": T0, "EndTime": T0 + 900},
                   {"Status": "Training", "StartTime": T0 + 900, "EndTime": T0 + 2700},
                   {"Status": "Interrupted", "StartTime": T0 + 2700, "EndTime": T0 + 6300},
                   {"Status": "Starting", "StartTime": T0 + 6300, "EndTime": T0 + 7200},
                   {"Status": "Training", "StartTime": T0 + 7200}]
    out = decide(PLAN, GUARD0, _running(0, SecondaryStatusTransitions=transitions), now=T0 + 9000)
    assert out["cost_usd"] == pytest.approx((1800 + 1800) / 3600 * RATE, abs=1e-4)  # not the 9000 s since start
    assert out["interruptions"] == 1


def test_guard_stops_when_the_next_poll_would_pass_the_cap_and_then_reads_the_exact_bill():
    seconds = (20 / RATE - (60 + STOP_GRACE_S) / 3600) * 3600
    assert decide(PLAN, GUARD0, _running(0), now=T0 + seconds - 5)["action"] == "wait"
    out = decide(PLAN, GUARD0, _running(0), now=T0 + seconds + 5)
    assert out["action"] == "stop" and out["stop_requested"] is True
    # Billed at on-demand all the way: nothing is left for another segment; the message says what was billed.
    capped = decide(PLAN, out, _ended("Stopped", seconds + 60), now=T0 + seconds + 90)
    assert capped["action"] == "over_budget"
    assert f"${(seconds + 60) / 3600 * RATE:,.2f} billed (exact, 1 job(s)) of budget $20.00" in capped["message"]
    assert "no chain of jobs fits $20.00" in capped["message"] and "resume_from=exec-1" in capped["message"]
    # Billed at spot (30% of on-demand): the room the exact bill leaves carries the next segment; a requested
    # stop is never followed by an on-demand fallback, even when the job ended at MaxWait.
    spot_bill = 0.3 * seconds
    later = decide(PLAN, out, _ended("Stopped", spot_bill, secondary="MaxWaitTimeExceeded"), now=T0 + seconds)
    assert later["action"] == "segment" and later["spot"] is True and later["stop_requested"] is False


def test_guard_wait_grows_with_the_job_but_never_past_the_cap():
    assert next_wait(PLAN, 0, 0) == 60  # first minutes: every poll_seconds
    ages = [0]  # the polls of a job: each waits 5% of the job's age (at least poll_seconds)
    while ages[-1] < 3 * 3600:
        ages.append(ages[-1] + next_wait(PLAN, ages[-1], 0))
    assert all(b - a == max(60, int(0.05 * a)) for a, b in zip(ages, ages[1:], strict=False))
    # A poll off that grid (a policy's recheck) is followed by the next poll on it, at least poll_seconds away.
    assert next_wait(PLAN, ages[-1] + 1, 0) + ages[-1] + 1 == ages[-1] + next_wait(PLAN, ages[-1], 0)
    # An age read a fraction of a second past the grid (CreationTime in milliseconds, the Lambda's latency) still
    # lands the next poll on the grid, not a second before it (where a policy's recheck would be missed).
    for a in ages[1:]:
        assert next_wait(PLAN, a + 0.0004, 0) == next_wait(PLAN, a, 0)
    rich, month = {**PLAN, "max_usd": 1e6}, 30 * 24 * 3600
    first = next_wait(rich, month, 0)  # to the grid, then every max_poll_seconds
    assert 60 <= first <= PLAN["max_poll_seconds"]
    assert next_wait(rich, month + first, 0) == PLAN["max_poll_seconds"]
    # $1 left at $1.408/h: 2557 s until the cap, minus the stop's grace.
    assert next_wait(PLAN, 30 * 24 * 3600, 19) == int(3600 / RATE - STOP_GRACE_S)


def test_a_job_that_ends_its_segment_is_followed_by_the_next_with_the_max_runtime_the_cap_allows():
    billable = 0.3 * 4 * 3600  # a 4 h spot segment at 30%
    out = decide(PLAN, GUARD0, _ended("Completed", billable, training=4 * 3600, FinalMetricDataList=DONE[:1]),
                 now=T0 + 5 * 3600, job_tags=OURS)
    assert out["action"] == "segment" and out["segment"] == 2 and out["job_name"] == PLAN["job_name"] + "-2"
    spent = billable / 3600 * RATE
    assert out["spent_before_usd"] == pytest.approx(spent, abs=1e-4)
    room = (20 - spent) / (RATE / 3600) - StopNotice.NOTICE_S
    assert out["max_runtime_seconds"] == min(PLAN["max_runtime_cap_seconds"], int(room))
    assert out["max_wait_seconds"] - out["max_runtime_seconds"] == PLAN["max_wait_extra_seconds"]
    budget = parse(out["hyperparameters"]).segment_seconds  # as the trainer reads it
    assert 0 < budget < out["max_runtime_seconds"]
    assert out["segments"][0]["cost_usd"] == pytest.approx(spent, abs=1e-3) and out["segments"][0]["exact"]


def test_only_a_job_that_printed_its_completion_is_registered_with_every_segments_bill():
    first = decide(PLAN, GUARD0, _ended("Completed", 3000, training=10000), now=T0 + 4 * 3600)
    describe = _ended("Completed", 1000, training=4000, FinalMetricDataList=DONE,
                      SecondaryStatusTransitions=[{"Status": "Training"}, {"Status": "Interrupted"},
                                                  {"Status": "Training"}, {"Status": "Interrupted"}],
                      ModelArtifacts={"S3ModelArtifacts": "s3://art-bucket/output/j/output/model.tar.gz"})
    out = decide(PLAN, first, describe, now=T0 + 5000)
    report = out["report"]
    assert out["action"] == "completed"
    assert report["cost_usd"] == pytest.approx(4000 / 3600 * RATE, abs=1e-6)  # billable is already spot-adjusted
    # the report's bill is its jobs' bills added, not rounded to cents beside them (the text printed $0.2500
    # above a segment's $0.2525)
    bills = [s["cost_usd"] for s in report["segments"]]  # each at 4 decimals, as printed
    assert report["cost_usd"] == pytest.approx(sum(bills), abs=5e-5 * len(bills))
    assert report["spot_savings_pct"] == 71.43  # (1 - 4000/14000) * 100
    assert report["interruptions"] == 2 and report["final_loss"] == 1.25
    assert [s["job_name"] for s in report["segments"]] == [PLAN["job_name"], PLAN["job_name"] + "-2"]
    assert "on-demand list price in us-east-1" in report["price_basis"]
    meta = report["metadata"]
    assert all(isinstance(v, str) for v in meta.values())
    assert meta["artifact"] == "full-model" and meta["method"] == "full" and meta["segments"] == "2"
    assert meta["data_source"] == "s3://art-bucket/datasets/d1/" and meta["cost_usd"] == str(report["cost_usd"])


def test_guard_falls_back_to_on_demand_when_the_budget_allows_it():
    out = decide(PLAN, GUARD0, _ended("Stopped", 600, secondary="MaxWaitTimeExceeded",
                                      SecondaryStatusTransitions=[{"Status": "Interrupted"}]), now=T0)
    assert out["action"] == "fallback" and out["job_name"] == PLAN["fallback_job_name"] and out["spot"] is False
    assert out["spent_before_usd"] == pytest.approx(600 / 3600 * RATE, abs=1e-4)
    assert out["max_wait_seconds"] == out["max_runtime_seconds"]  # on-demand: no MaxWait beyond it
    later = decide(PLAN, out, _running(1), now=T0 + 3600)
    assert later["cost_usd"] == pytest.approx(out["spent_before_usd"] + RATE, abs=1e-4)
    assert later["interruptions"] == 1
    # The budget is checked before the fallback: a spent cap ends the run instead.
    spent = {**GUARD0, "spent_before_usd": 19.9}
    assert decide(PLAN, spent, _ended("Stopped", 0, secondary="MaxWaitTimeExceeded"), now=T0)["action"] == \
        "over_budget"


def test_a_warm_pool_is_billed_after_its_job_and_counted_before_the_next():
    raw = copy.deepcopy(RUN)
    raw["compute"].update(spot=False, warm_pool_minutes=30)
    raw["budget"]["max_usd"] = 4
    p = plan(raw, "exec-1", SETTINGS)
    guard = {**GUARD0, "spot": False, "job_name": p["job_name"], "max_runtime_seconds": p["max_runtime_seconds"]}
    ended = _ended("Completed", 3600, ResourceConfig={"KeepAlivePeriodInSeconds": 1800})
    out = decide(p, guard, ended, now=T0 + 7200)
    assert out["spent_before_usd"] == pytest.approx((3600 + 1800) / 3600 * RATE, abs=1e-4)
    assert out["action"] == "segment" and out["spot"] is False
    assert out["max_runtime_seconds"] == int((4 - out["spent_before_usd"]) / (RATE / 3600) - 1800 - 120)


def test_guard_refuses_a_job_whose_execution_tag_is_another_executions():
    out = decide(PLAN, GUARD0, _running(0), now=T0 + 60, job_tags={"execution": "exec-0"})
    assert out["action"] == "failed" and "'exec-0'" in out["message"] and "'exec-1'" in out["message"]
    assert decide(PLAN, GUARD0, _running(0), now=T0 + 60, job_tags=OURS)["action"] == "wait"


def test_guard_reports_checkpoint_age_and_the_worst_gap_as_lost_work():
    out = decide(PLAN, GUARD0, _running(2), now=T0 + 7200, newest_checkpoint=T0 + 3600)
    assert out["checkpoint_age_seconds"] == 3600 and out["worst_checkpoint_gap_seconds"] == 3600
    later = decide(PLAN, out, _running(3), now=T0 + 7260, newest_checkpoint=T0 + 7250)
    assert later["checkpoint_age_seconds"] == 10 and later["worst_checkpoint_gap_seconds"] == 3600
    done = decide(PLAN, later, _ended("Completed", 7300, FinalMetricDataList=DONE), now=T0 + 7400)
    assert done["report"]["worst_case_lost_usd"] == round(3600 / 3600 * RATE, 2)


def test_newest_checkpoint_is_the_newest_committed_manifest(s3):
    prefix = "checkpoints/tiny-run/exec-1/"
    s3.put_object(Bucket="art-bucket", Key=prefix + "step-00000010/__0_0.distcp", Body=b"x")
    assert newest_checkpoint(s3, "art-bucket", prefix) is None  # shards without a manifest do not count
    s3.put_object(Bucket="art-bucket", Key=f"{prefix}{checkpoint_step_dir(10)}/{CHECKPOINT_MANIFEST}", Body=b"{}")
    newest = newest_checkpoint(s3, "art-bucket", prefix)
    assert newest == pytest.approx(datetime.now(timezone.utc).timestamp(), abs=120)


@pytest.mark.parametrize("describe, says", [
    (_ended("Failed", 60, FailureReason="AlgorithmError: OOM"), "AlgorithmError: OOM"),
    (_ended("Stopped", 60), "stopped outside the pipeline"),
    # not "the estimate was far off": a spot job's time counts its restarts and lost work, so runs interrupted
    # far more often than expected reach it with a good estimate (a new user's 70B, 15-20 interruptions)
    (_ended("Stopped", 600, secondary="MaxRuntimeExceeded"), "interruptions lost"),
])
def test_guard_ends_the_run_with_the_reason(describe, says):
    guard = {**GUARD0, "max_runtime_seconds": PLAN["max_runtime_cap_seconds"]}
    out = decide(PLAN, guard, describe, now=T0)
    assert out["action"] == "failed" and says in out["message"]


def test_stop_grace_is_the_stop_notice():
    assert STOP_GRACE_S == StopNotice.NOTICE_S == StopNotice.UPLOAD_S + StopNotice.FINISH_S


# ---- canceller ---------------------------------------------------------------------------------------------------


def _execution_event(status: str, name: str = "exec-1", start_ms: int = int(T0 * 1000)) -> dict:
    return {"executionArn": f"arn:aws:states:us-east-1:123456789012:execution:sm:{name}", "name": name,
            "status": status, "startDate": start_ms, "input": json.dumps(RUN)}


def _summary(name: str) -> dict:
    return {"TrainingJobName": name, "TrainingJobArn": f"arn:aws:sagemaker:us-east-1:123456789012:training-job/{name}",
            "CreationTime": datetime.fromtimestamp(T0, timezone.utc), "TrainingJobStatus": "InProgress"}


def test_canceller_stops_the_executions_running_jobs_found_by_their_execution_tag():
    first = first_job_of(_execution_event("ABORTED"), "spotrun-dev-", json.dumps(RUN))
    assert first == PLAN["job_name"]
    client = boto3.client("sagemaker", region_name="us-east-1")
    stub = Stubber(client)  # requests and responses checked against SageMaker's service model
    ours, theirs = first + "-3", first + "-2od"
    stub.add_response("list_training_jobs", {"TrainingJobSummaries": [_summary(ours), _summary(theirs)]},
                      {"NameContains": first, "StatusEquals": "InProgress"})
    stub.add_response("list_tags", {"Tags": [{"Key": "execution", "Value": "exec-1"}]},
                      {"ResourceArn": _summary(ours)["TrainingJobArn"]})
    stub.add_response("stop_training_job", {}, {"TrainingJobName": ours})
    stub.add_response("list_tags", {"Tags": [{"Key": "execution", "Value": "exec-0"}]},
                      {"ResourceArn": _summary(theirs)["TrainingJobArn"]})
    with stub:
        assert cancel(_execution_event("ABORTED"), client, job_prefix="spotrun-dev-",
                      execution_input=json.dumps(RUN)) == [ours]
        stub.assert_no_pending_responses()


def test_canceller_leaves_jobs_alone_on_success():
    client = boto3.client("sagemaker", region_name="us-east-1")
    with Stubber(client) as stub:  # no request may be made
        assert cancel(_execution_event("SUCCEEDED"), client, job_prefix="spotrun-dev-",
                      execution_input=json.dumps(RUN)) == []
        stub.assert_no_pending_responses()


# ---- recorder ----------------------------------------------------------------------------------------------------


def _event(status: str, secondary: str, *, start="2026-11-01T10:00:00Z", seconds=None) -> dict:
    detail = {"TrainingJobName": "spotrun-dev-a-1", "TrainingJobStatus": status, "SecondaryStatus": secondary,
              "ResourceConfig": {"InstanceType": "ml.g5.xlarge", "InstanceCount": 2},
              "SecondaryStatusTransitions": [{"Status": "Interrupted", "StartTime": start}]}
    if seconds is not None:
        detail["TrainingTimeInSeconds"] = seconds
    return {"id": "e1", "time": "2026-11-01T10:00:01Z", "detail": detail}


def test_times_as_epoch_millisecond_strings_are_read():
    assert to_epoch("1761991200000") == to_epoch("2025-11-01T10:00:00Z") == to_epoch(1761991200000)


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
        # The same interruption delivered with its time as a string of epoch milliseconds is the same item.
        ms = str(int(to_epoch("2026-11-01T10:00:00Z") * 1000))
        assert record(_event("InProgress", "Interrupted", start=ms), table, **kw) == "duplicate"
        assert record(_event("InProgress", "Interrupted", start="2026-11-01T12:00:00Z"), table, **kw) == "recorded"
        assert record(_event("InProgress", "Training"), table, **kw) == "ignored"
        assert record(_event("Completed", "Completed", seconds=9 * 3600), table, **kw) == "recorded"
        assert record(_event("Completed", "Completed", seconds=9 * 3600), table, **kw) == "duplicate"
        assert table.scan()["Count"] == 3
        # 2 interruptions over 9 h x 2 instances = 18 instance-hours
        assert recorded_rates(table) == {"ml.g5.xlarge": pytest.approx(2 / 18)}
        assert recorded_rates(table, min_hours=100) == {}


# The spot policy executed by the guard: a plan whose estimate chose uniform_progress for a 10 h run with a 12 h
# deadline (the section as the estimate writes it: spotrun/policy/choose.py).
SIM_PLAN = dataclasses.asdict(SimPlan(work_s=10 * 3600, startup_s=300, restore_s=60, save_s=60, interval_s=1800,
                                      step_s=4.6, notice_ok=True, spot_usd_per_h=0.3 * RATE, on_demand_usd_per_h=RATE,
                                      deadline_s=12 * 3600))
DEADLINE_PLAN = {**PLAN, "max_usd": 40, "estimate": {**PLAN["estimate"], "spot_policy": SpotPolicy(
    chosen="uniform_progress (notice)", why="the cheapest policy meeting the deadline", p95_finish_cap_usd=None,
    confidence=0.99, traces=1000, seed=0, trace_source="generated", policies=[], left_out=[],
    policy="uniform_progress", checkpointing="notice", sim_plan=SIM_PLAN).to_json()}}


def _step(fraction: float) -> int:
    return int(fraction * PLAN["planned_steps"])


def test_a_spot_job_behind_the_policy_is_stopped_and_the_run_continues_on_demand_on_the_same_checkpoints():
    behind = _step(0.1)  # 4 h in, 10% committed a minute ago: the deadline is at risk
    out = decide(DEADLINE_PLAN, GUARD0, _running(4), now=T0 + 4 * 3600, checkpoint_step=behind, job_tags=OURS,
                 newest_checkpoint=T0 + 4 * 3600 - 60)
    assert out["action"] == "stop" and out["switch_requested"] is True and out["stop_requested"] is False
    assert "uniform_progress" in out["message"]
    # Stopped at the guard's request (the trainer saved on SIGTERM): the next segment on-demand, within the cap.
    stopped = decide(DEADLINE_PLAN, out, _ended("Stopped", 0.3 * 4 * 3600, training=4 * 3600),
                     now=T0 + 4 * 3600 + 300, checkpoint_step=behind, job_tags=OURS)
    assert stopped["action"] == "segment" and stopped["spot"] is False and stopped["switch_requested"] is False
    assert stopped["job_name"] == segment_job_name(PLAN["job_name"], 2, spot=False)
    assert stopped["max_runtime_seconds"] == next_max_runtime(
        cap_usd=40, spent_usd=stopped["spent_before_usd"], usd_per_s=RATE / 3600,
        longest_s=PLAN["max_runtime_cap_seconds"], warm_pool_s=PLAN["warm_pool_seconds"])
    assert stopped["max_wait_seconds"] == stopped["max_runtime_seconds"]
    # The same progress with 4 h trained since its commit: a save on the notice would keep them, the run is ahead.
    assert decide(DEADLINE_PLAN, GUARD0, _running(4), now=T0 + 4 * 3600, checkpoint_step=behind)["action"] == "wait"
    # The same spot job on or ahead of the line keeps running, and waits for capacity while the run can afford it.
    ahead = _step(0.5)
    assert decide(DEADLINE_PLAN, GUARD0, _running(4), now=T0 + 4 * 3600, checkpoint_step=ahead)["action"] == "wait"
    waiting = _running(1, SecondaryStatus="Interrupted")
    assert decide(DEADLINE_PLAN, GUARD0, waiting, now=T0 + 3600, checkpoint_step=_step(0.09))["action"] == "wait"
    late = decide(DEADLINE_PLAN, GUARD0, waiting, now=T0 + 4 * 3600, checkpoint_step=_step(0.3))
    assert late["action"] == "stop" and late["switch_requested"] is True


def test_the_run_returns_to_spot_when_ahead_at_a_segment_boundary_or_by_stopping_the_on_demand_job():
    on_demand = {**GUARD0, "spot": False, "job_name": segment_job_name(PLAN["job_name"], 2, spot=False),
                 "segment": 2}
    segment_end = _ended("Completed", 3600, FinalMetricDataList=DONE[:1])
    back = decide(DEADLINE_PLAN, on_demand, segment_end, now=T0 + 3 * 3600, checkpoint_step=_step(0.6))
    assert back["action"] == "segment" and back["spot"] is True
    assert back["max_wait_seconds"] - back["max_runtime_seconds"] == PLAN["max_wait_extra_seconds"]
    stay = decide(DEADLINE_PLAN, on_demand, segment_end, now=T0 + 6 * 3600, checkpoint_step=_step(0.45))
    assert stay["action"] == "segment" and stay["spot"] is False
    # A running on-demand job far ahead is stopped to continue on spot; one behind runs on.
    back = decide(DEADLINE_PLAN, on_demand, _running(1), now=T0 + 3 * 3600, checkpoint_step=_step(0.9),
                  newest_checkpoint=T0 + 3 * 3600 - 60)
    assert back["action"] == "stop" and back["switch_requested"] and back["switch_to_spot"], back
    then = decide(DEADLINE_PLAN, back, _ended("Stopped", 3600), now=T0 + 3 * 3600 + 120, checkpoint_step=_step(0.9))
    assert then["action"] == "segment" and then["spot"] is True and not then["switch_requested"]
    assert decide(DEADLINE_PLAN, on_demand, _running(1), now=T0 + 6 * 3600, checkpoint_step=_step(0.45),
                  newest_checkpoint=T0 + 6 * 3600 - 60)["action"] == "wait"


def test_no_switch_without_a_deadline_after_a_stop_the_cap_requested_or_without_on_demand_fallback():
    behind = _step(0.01)
    late = T0 + 11 * 3600
    # No deadline (the estimate's own section for this run): the guard never switches.
    assert PLAN["estimate"]["spot_policy"]["sim_plan"]["deadline_s"] is None
    assert decide(PLAN, GUARD0, _running(11), now=late, checkpoint_step=behind)["action"] == "wait"
    # A stop the cap requested: the next segment keeps the capacity it had (spot), however far behind.
    capped = {**GUARD0, "stop_requested": True}
    after = decide(DEADLINE_PLAN, capped, _ended("Stopped", 0.3 * 3600, training=3600), now=late,
                   checkpoint_step=behind)
    assert after["action"] == "segment" and after["spot"] is True
    # A run that forbids on-demand stays on spot.
    no_fallback = {**DEADLINE_PLAN, "on_demand_fallback": False}
    assert decide(no_fallback, GUARD0, _running(11), now=late, checkpoint_step=behind)["action"] == "wait"


def test_the_cost_guard_decodes_plan_and_guard_at_entry_and_names_what_is_malformed():
    from spotrun.handlers import cost_guard as cost_guard_handler

    assert Plan.from_json(PLAN).to_json() == PLAN and Plan.from_json(PLAN).status is PlanStatus.OK
    assert Guard.from_json(GUARD0).action is GuardAction.WAIT
    without_name = {k: v for k, v in PLAN.items() if k != "job_name"}
    with pytest.raises(ValueError, match=r"^plan is invalid: expected the fields of spotrun.seams.Plan; "
                                         r"missing: job_name; unknown: jobname$"):
        Plan.from_json({**without_name, "jobname": "x"}, "plan")
    with pytest.raises(ValueError, match=r"^guard.action='pause' is invalid: expected one of wait, stop, segment"):
        Guard.from_json({**GUARD0, "action": "pause"}, "guard")
    with pytest.raises(ValueError, match=r"^plan.max_usd='20' is invalid: expected float"):
        Plan.from_json({**PLAN, "max_usd": "20"}, "plan")
    with pytest.raises(ValueError, match=r"^guard.spot=1 is invalid: expected bool"):
        Guard.from_json({**GUARD0, "spot": 1}, "guard")
    # The handler refuses before it calls anything: a state machine passing a refusal or no plan is a bug.
    with pytest.raises(ValueError, match=r"^plan=\[\] is invalid: expected an object with the fields of "):
        cost_guard_handler.handler({"plan": [], "guard": GUARD0}, None)
    with pytest.raises(ValueError, match=r"^plan.status='InvalidRun' is invalid: the cost guard polls"):
        cost_guard_handler.handler({"plan": {**PLAN, "status": "InvalidRun"}, "guard": GUARD0}, None)


def test_a_sentinels_bill_is_in_the_spend_bounded_while_it_runs_and_exact_once_it_ended():
    """The guard's sentinel (spotrun/pipeline/guard.py): while it runs, its billed seconds at on-demand rates are in
    the spend; once ended, its exact bill moves into spent_before_usd and the guard forgets its name."""
    on_demand = {**GUARD0, "spot": False, "sentinel_name": f"{PLAN['job_name']}-sn1", "sentinels": 1}
    held = _running(0, SecondaryStatusTransitions=[{"Status": "Starting", "StartTime": T0 + 3600,
                                                     "EndTime": T0 + 4000},
                                                    {"Status": "Training", "StartTime": T0 + 4000}])
    out = decide(PLAN, on_demand, _running(1), now=T0 + 4600, job_tags=OURS, sentinel=held, sentinel_tags=OURS)
    assert out["cost_usd"] == pytest.approx((4600 + 600) / 3600 * RATE, abs=1e-4)
    assert out["sentinel_name"] == on_demand["sentinel_name"] and out["spent_before_usd"] == 0
    ended = _ended("Stopped", 210)
    out = decide(PLAN, {**on_demand, "sentinel_stopping": True}, _running(1), now=T0 + 5000, job_tags=OURS,
                 sentinel=ended, sentinel_tags=OURS)
    assert out["spent_before_usd"] == pytest.approx(210 / 3600 * RATE, abs=1e-6)
    assert out["cost_usd"] == pytest.approx((5000 + 210) / 3600 * RATE, abs=1e-4)
    assert out["sentinel_name"] == "" and not out["sentinel_stopping"] and len(out["sentinel_bills"]) == 1
    # another execution's job under the name is not this run's: not billed, forgotten
    out = decide(PLAN, on_demand, _running(1), now=T0 + 4600, job_tags=OURS, sentinel=held,
                 sentinel_tags={"execution": "exec-0"})
    assert out["sentinel_name"] == "" and out["cost_usd"] == pytest.approx(4600 / 3600 * RATE, abs=1e-4)


def test_a_sentinels_max_runtime_leaves_both_jobs_limits_under_the_cap():
    """Every stop failing, the on-demand job runs to its MaxRuntime and the sentinel to its own, each billing its
    stop: together under the cap. No room for a sentinel that can wait for the guard's next look: none."""
    p, rate = Plan.from_json(PLAN), RATE / 3600
    guard = Guard.from_json({**GUARD0, "spot": False, "spent_before_usd": 2.5})
    for limit in (600, 10_000, 30_000):
        od = _running(0, StoppingCondition={"MaxRuntimeInSeconds": limit})
        runtime, wait = guard_rules.sentinel_limits(p, guard, od, 600.0)
        assert 2.5 + (limit + 120) * rate + (runtime + 120) * rate <= p.max_usd + 1e-9
        assert runtime >= 600 + p.poll_seconds and wait >= max(runtime, limit)
    full = int(p.max_usd / rate) - 120 - 700  # the on-demand job's limit takes nearly all the cap leaves
    assert guard_rules.sentinel_limits(p, guard, _running(0, StoppingCondition={"MaxRuntimeInSeconds": full}),
                                       600.0) is None
