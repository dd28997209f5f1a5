"""The simulated SageMaker's sentinel (tests/infra/trace_sim.py `SentinelJob`) against the trace and the model:
it has instances exactly while the trace has capacity, beside a spot training job that has them too, and bills
what spotrun/policy/execution.py bills for it."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from spotrun.pipeline.guard import has_instances
from spotrun.policy.engine import SimPlan
from spotrun.policy.execution import Run
from tests.infra.sagemaker_sim import SimClock, World
from tests.infra.trace_sim import SentinelJob, TraceJob, TraceSimulation, Trainer

WINDOWS = [(100.0, 1000.0), (3000.0, 5000.0)]


def _job(name: str, *, sentinel: bool) -> SimpleNamespace:
    return SimpleNamespace(training_job_name=name, enable_managed_spot_training=True,
                           resource_config={"InstanceCount": 2},
                           stopping_condition={"MaxRuntimeInSeconds": 86_400, "MaxWaitTimeInSeconds": 86_400},
                           hyper_parameters={}, checkpoint_config=None if sentinel else {"S3Uri": "s3://b/ck/"})


def _describe(job: SimpleNamespace) -> dict:
    return {"TrainingJobStatus": job.training_job_status, "SecondaryStatus": job.secondary_status}


@pytest.mark.parametrize("stop_at, billed", [
    (3600.0, 900.0 + 600.0 + 120.0),  # stopped with instances: the stop's 120 s
    (4950.0, 900.0 + 1950.0 + 50.0),  # stopped 50 s before the window ends: reclaimed during the stop
    (2000.0, 900.0),  # stopped while it waits: ends at once, nothing more
])
def test_the_sentinel_has_instances_exactly_while_the_trace_has_capacity_beside_a_training_job(stop_at, billed):
    clock = SimClock(0.0)
    world = World(work_s=1e6, usd_per_instance_hour=1.0, spot_discount=0.65, checkpoint_interval_s=1e9)
    sim = TraceSimulation(clock, world, Trainer(startup_s=300, restore_s=0, save_s=60, interval_s=math.inf,
                                                step_s=10, notice=True), WINDOWS)
    training, sentinel = _job("run-1", sentinel=False), _job("run-1-sn1", sentinel=True)
    sim.created(training)
    clock.advance(50)
    sim.created(sentinel)
    assert isinstance(sim.jobs["run-1"], TraceJob) and isinstance(sim.jobs["run-1-sn1"], SentinelJob)
    for t in [t for t in (60.0, 500.0, 999.0, 1500.0, 2999.0, 3001.0, 4900.0) if t < stop_at]:
        clock.now = t
        sim.sync()
        there = any(a <= t < b for a, b in WINDOWS)
        assert has_instances(_describe(sentinel)) is there, t
        assert (training.secondary_status not in ("Starting", "Interrupted")) is there, t  # both at once
    clock.now = stop_at
    sim.stop("run-1-sn1")
    clock.now = 6000.0
    sim.sync()
    job = sim.jobs["run-1-sn1"]
    assert sentinel.training_job_status == "Stopped" and job.billed == pytest.approx(billed)
    assert job.billable_seconds() == math.ceil(billed * 0.35)
    # the model's bill for the same sentinel (spotrun/policy/execution.py `Run.stop_sentinel`)
    run = Run(SimPlan(work_s=1e6, startup_s=300, restore_s=0, save_s=60, interval_s=math.inf, step_s=10,
                      notice_ok=True, spot_usd_per_h=0.35, on_demand_usd_per_h=1.0), "notice", WINDOWS)
    run.start_sentinel(50.0)
    run.stop_sentinel(stop_at)
    assert run.sentinel_s == pytest.approx(billed)
