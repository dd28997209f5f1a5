"""`spotrun status` says on which market the run's current job is, which spot policy the guard executes, and the
sentinel spot job beside an on-demand job while one lives (it showed none of them)."""

from __future__ import annotations

import pytest
from moto import mock_aws

from spotrun.cli import remote
from spotrun.cli.remote import Deployment, run_status
from tests.spotrun.test_handlers import DEADLINE_PLAN, GUARD0, PLAN, T0, _running

EXECUTION = {"name": "exec-1", "executionArn": "arn:aws:states:us-east-1:123456789012:execution:sm:exec-1",
             "status": "RUNNING", "startDate": "2026-01-01 00:00:00+00:00"}
SENTINEL = f"{PLAN['job_name']}-sn1"


class FakeSageMaker:
    def __init__(self, jobs: dict[str, dict]):
        self.jobs = jobs

    def describe_training_job(self, TrainingJobName: str) -> dict:  # noqa: N803 - boto3's spelling
        if TrainingJobName not in self.jobs:
            from botocore.exceptions import ClientError

            raise ClientError({"Error": {"Code": "ValidationException", "Message": "not found"}}, "Describe")
        return self.jobs[TrainingJobName]


class FakeDeployment(Deployment):
    sagemaker: FakeSageMaker | None = None

    def client(self, service: str):
        return self.sagemaker if service == "sagemaker" else super().client(service)


def status_of(monkeypatch, plan: dict, guard: dict, jobs: dict[str, dict]) -> dict:
    monkeypatch.setattr(remote, "pipeline_state", lambda sfn, arn: (plan, guard))
    dep = FakeDeployment("spotrun-dev", {}, "us-east-1")
    dep.sagemaker = FakeSageMaker(jobs)
    with mock_aws():  # CloudWatch Logs (no metric lines yet) and Step Functions' client
        return run_status(dep, EXECUTION)


@pytest.fixture(autouse=True)
def _credentials(monkeypatch):
    for key, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                       ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(key, value)


def test_status_names_the_market_and_the_policy_and_no_sentinel_on_spot(monkeypatch):
    out = status_of(monkeypatch, DEADLINE_PLAN, GUARD0, {PLAN["job_name"]: _running(1)})
    assert out["market"] == "spot" and out["spot_policy"] == DEADLINE_PLAN["estimate"]["spot_policy"]["chosen"]
    assert "sentinel" not in out and "sentinel_status" not in out


def test_status_shows_an_on_demand_job_and_the_live_sentinel_beside_it(monkeypatch):
    on_demand = {**GUARD0, "spot": False, "sentinel_name": SENTINEL, "sentinels": 1}
    waiting = _running(0, SecondaryStatus="Starting", CreationTime=T0 + 3600)
    out = status_of(monkeypatch, DEADLINE_PLAN, on_demand, {PLAN["job_name"]: _running(1), SENTINEL: waiting})
    assert out["market"] == "on-demand" and out["spot_policy"] == "uniform_progress (notice)"
    assert out["sentinel"] == SENTINEL
    assert out["sentinel_status"] == "InProgress/Starting (waiting for spot capacity)"
    seen = _running(0, CreationTime=T0 + 3600)  # past waiting: it holds instances
    out = status_of(monkeypatch, DEADLINE_PLAN, {**on_demand, "sentinel_stopping": True},
                    {PLAN["job_name"]: _running(1), SENTINEL: seen})
    assert out["sentinel_status"] == "InProgress/Training (spot capacity seen; the guard is stopping it)"
    # named by the guard, not created yet
    out = status_of(monkeypatch, DEADLINE_PLAN, on_demand, {PLAN["job_name"]: _running(1)})
    assert out["sentinel"] == SENTINEL and out["sentinel_status"] == "being created"
