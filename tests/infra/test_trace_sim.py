"""The replay's trace-driven SageMaker (tests/infra/trace_sim.py) shows the guard what the simulator assumes it
sees: a checkpoint's LastModified is the commit's simulated time, not the time the job was next described."""

from __future__ import annotations

import math
from types import SimpleNamespace
from unittest import mock

import boto3
from moto import mock_aws
from moto.s3 import models as s3_models

from spotrun.pipeline.guard import committed_checkpoints, training_seconds
from spotrun.policy.decision import committed_progress_s
from tests.infra.sagemaker_sim import SimClock, World, s3_clock
from tests.infra.trace_sim import TraceSimulation, Trainer

BASE = 1_800_000_000  # a whole second: S3's LastModified is listed to the second
STARTUP, INTERVAL, SAVE, STEP = 100.0, 1000.0, 60.0, 10.0


def _job() -> SimpleNamespace:
    return SimpleNamespace(training_job_name="run-1", enable_managed_spot_training=True,
                           resource_config={"InstanceCount": 1}, hyper_parameters={},
                           stopping_condition={"MaxRuntimeInSeconds": 86400, "MaxWaitTimeInSeconds": 172800},
                           checkpoint_config={"S3Uri": "s3://ckpt/run-1/"})


def test_a_committed_checkpoint_is_stamped_at_its_commit_and_the_guard_sees_the_training_since():
    clock = SimClock(BASE)
    world = World(work_s=100 * INTERVAL, usd_per_instance_hour=1.0, spot_discount=0.6, checkpoint_interval_s=1,
                  step_s=STEP)
    trainer = Trainer(startup_s=STARTUP, restore_s=0.0, save_s=SAVE, interval_s=INTERVAL, step_s=STEP, notice=True)
    with mock_aws(), mock.patch.object(s3_models, "utcnow", s3_clock(clock)):
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="ckpt")
        sim = TraceSimulation(clock, world, trainer, [(0.0, math.inf)])
        job = _job()
        sim.created(job)
        clock.advance(5000)  # the guard's next poll: four train-and-save cycles since the job was described
        sim.sync()
        newest, step = committed_checkpoints(s3, "ckpt", "run-1/")

    # the fourth save ends at startup + 4 x (interval + save) = 4,340 s; 660 s trained since
    committed_at = STARTUP + 4 * (INTERVAL + SAVE)
    assert newest == BASE + committed_at  # was BASE + 5000: the poll's time
    assert committed_progress_s(step, world.work_s, int(world.work_s / STEP)) == 4 * INTERVAL
    describe = {"SecondaryStatus": job.secondary_status, "TrainingStartTime": job.training_start_time,
                "SecondaryStatusTransitions": job.secondary_status_transitions}
    assert describe["SecondaryStatus"] == "Training"
    # the work a save on the notice would keep now (0 with the old stamp: progress_s read 660 s too little)
    assert training_seconds(describe, newest, clock()) == 5000 - committed_at
