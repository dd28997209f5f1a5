"""A SageMaker that bills as documented, behind moto's training jobs, on a simulated clock.

What it models (DescribeTrainingJob, StoppingCondition, managed spot and warm pool documentation):
- a job waits for capacity unbilled (`Starting`), then bills while it downloads and starts (`Downloading`),
  trains (`Training`) and uploads (`Uploading`);
- BillableTimeInSeconds is reported only when the job has ended; for spot it is the billed time x (1 - the
  discount); a running job reports none;
- MaxRuntimeInSeconds is enforced by SageMaker on the billed time: SIGTERM, then the stop bills `stop_bill_s`
  (up to 120 s) and the job ends Stopped / MaxRuntimeExceeded; MaxWaitTimeInSeconds likewise on the time since
  creation (spot), ending MaxWaitTimeExceeded; StopTrainingJob bills the same stop;
- a spot interruption stops billing, waits for capacity (`Interrupted`, unbilled), restarts (`Starting`,
  `Downloading` billed) and loses the work since the last periodic checkpoint;
- the trainer saves and exits at its `segment_seconds` (a Completed job without the completion metric) and, once
  all the work is done, prints its completion line (the completion metric);
- a warm pool (on-demand, KeepAlivePeriodInSeconds) bills its keep-alive after the job ends.

The clock moves only when the state machine waits (Wait states, retry intervals): the simulation replaces those
sleeps, and the cost guard reads the same clock. `truth_usd()` is what the run really cost.
"""

from __future__ import annotations

import datetime as dt
import math
from contextvars import ContextVar
from dataclasses import dataclass, field

from spotrun.seams import CHECKPOINT_MANIFEST, COMPLETED_METRIC, checkpoint_step_dir

BILLED = ("Downloading", "Training", "Uploading", "Stopping")


class SimClock:
    def __init__(self, start: float):
        self.now = start

    def advance(self, seconds: float) -> None:
        self.now += max(0.0, float(seconds))

    def __call__(self) -> float:
        return self.now


@dataclass
class World:
    """What is true of the run, whatever the pipeline believes."""

    work_s: float  # training seconds the whole run needs
    usd_per_instance_hour: float
    spot_discount: float
    checkpoint_interval_s: float
    save_s: float = 60.0  # a checkpoint save at a segment's end
    start_billed_s: float = 240.0  # Downloading: data, image, model load, checkpoint restore
    capacity_wait_s: float = 90.0  # Starting before the instances come (unbilled)
    interrupted_s: float = 1800.0  # waiting for spot capacity after an interruption (unbilled)
    upload_s: float = 30.0
    stop_bill_s: float = 120.0
    interruptions_at: list[float] = field(default_factory=list)  # work marks (s) a spot job is interrupted at
    no_spot_capacity: bool = False
    save_on_notice: bool = False  # the trainer saves on an interruption's notice (the plan's policy)
    committed_s: float = 0.0  # work in the newest checkpoint
    done: bool = False
    step_s: float = 0.0  # seconds per optimizer step: committed checkpoints appear in S3 as step-N/manifest.json
    checkpoint_uri: str = ""

    def commit(self, work_s: float, at: float | None = None) -> None:
        """A checkpoint of the work done so far: its manifest lands under the checkpoint prefix (the guard lists
        them), as the trainer's commit protocol writes it; `at`: the commit's simulated time, its LastModified
        under `s3_clock` (a job is advanced to the clock only when it is described, after the commit)."""
        if work_s <= self.committed_s:
            return
        self.committed_s = work_s
        if self.step_s and self.checkpoint_uri:
            import boto3

            bucket, _, prefix = self.checkpoint_uri.removeprefix("s3://").partition("/")
            step = int(work_s / self.step_s)
            token = COMMITTED_AT.set(at)
            try:
                boto3.client("s3", region_name="us-east-1").put_object(
                    Bucket=bucket, Key=f"{prefix}{checkpoint_step_dir(step)}/{CHECKPOINT_MANIFEST}", Body=b"{}")
            finally:
                COMMITTED_AT.reset(token)


COMMITTED_AT: ContextVar[float | None] = ContextVar("COMMITTED_AT", default=None)
"""The simulated time of the commit whose manifest `World.commit` is writing (None: now)."""


def s3_clock(clock: SimClock):
    """moto's S3 `utcnow` (naive UTC) on the simulated clock: a manifest's LastModified is its commit's time
    (`World.commit`'s `at`), anything else's the clock's now. The guard reads the newest manifest's LastModified
    as the end of the work a save on the notice keeps (spotrun/pipeline/guard.py `training_seconds`)."""

    def utcnow() -> dt.datetime:
        at = COMMITTED_AT.get()
        return dt.datetime.fromtimestamp(clock() if at is None else at, dt.timezone.utc).replace(tzinfo=None)

    return utcnow


def _ts(epoch: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc)


class SimJob:
    """One training job's timeline, advanced in steps to the clock."""

    def __init__(self, job, world: World, now: float):
        self.job, self.world = job, world
        self.spot = bool(job.enable_managed_spot_training)
        self.count = int(job.resource_config["InstanceCount"])
        self.keep_alive = float(job.resource_config.get("KeepAlivePeriodInSeconds") or 0)
        self.max_runtime = float(job.stopping_condition["MaxRuntimeInSeconds"])
        self.max_wait = float(job.stopping_condition.get("MaxWaitTimeInSeconds") or math.inf)
        self.segment_s = float(job.hyper_parameters.get("segment_seconds") or 0) or math.inf
        self.created, self.t = now, now
        self.billed = 0.0
        self.phase, self.phase_left = "Starting", world.capacity_wait_s
        self.process_s = 0.0  # the trainer's clock since its start
        self.work_mark = world.committed_s
        self.ended, self.end_secondary, self.completed_run = False, "", False
        self.stop_after = None  # billed seconds of stop still to come, once a stop began
        self.transitions: list[dict] = [{"Status": "Starting", "StartTime": now}]
        self._publish()

    # ---- the timeline -------------------------------------------------------------------------------------

    def _enter(self, phase: str, left: float) -> None:
        self.transitions[-1]["EndTime"] = self.t
        self.transitions.append({"Status": phase, "StartTime": self.t})
        self.phase, self.phase_left = phase, left

    def _end(self, status: str, secondary: str) -> None:
        self.transitions[-1]["EndTime"] = self.t
        self.transitions.append({"Status": secondary, "StartTime": self.t, "EndTime": self.t})
        self.ended, self.status, self.end_secondary = True, status, secondary

    def stop(self, secondary: str = "Stopped") -> None:
        """StopTrainingJob or a SageMaker limit: SIGTERM; the trainer saves within the stop's billed time."""
        if self.ended or self.phase == "Stopping":
            return
        if self.phase in ("Starting", "Interrupted"):  # no instances: nothing to save, nothing billed
            self._end("Stopped", secondary)
            return
        if self.phase in ("Training", "Uploading"):
            self.world.commit(self.work_mark)
        self.end_secondary = secondary
        self._enter("Stopping", self.world.stop_bill_s)

    def _next_interruption(self) -> float | None:
        if not self.spot:
            return None
        return min((m for m in self.world.interruptions_at if m > self.work_mark + 1e-9), default=None)

    def advance(self, until: float) -> None:
        w = self.world
        for _ in range(100_000):
            if self.ended or self.t >= until:
                return
            billed = self.phase in BILLED
            step = min(until - self.t, self.phase_left)
            if billed:
                step = min(step, max(0.0, self.max_runtime - self.billed)) if self.phase != "Stopping" else step
            if self.spot and self.phase != "Stopping":
                step = min(step, max(0.0, self.created + self.max_wait - self.t))
            if self.phase == "Training":
                step = min(step, w.work_s - self.work_mark, self.segment_s - self.process_s)
                mark = self._next_interruption()
                if mark is not None:
                    step = min(step, mark - self.work_mark)
            step = max(0.0, step)
            self.t += step
            self.phase_left -= step
            if billed:
                self.billed += step
            if self.phase == "Training":
                self.process_s += step
                before = self.work_mark
                self.work_mark += step
                # periodic checkpoints commit the work at each interval boundary passed
                k = math.floor(self.work_mark / w.checkpoint_interval_s)
                if k > math.floor(before / w.checkpoint_interval_s):
                    w.commit(k * w.checkpoint_interval_s)
            self._transition()
        raise RuntimeError(f"{self.job.training_job_name}: the simulation does not advance ({self.phase})")

    def _transition(self) -> None:
        w = self.world
        if self.phase == "Stopping":
            if self.phase_left <= 1e-9:
                self._end("Stopped", self.end_secondary or "Stopped")
            return
        if self.spot and self.t >= self.created + self.max_wait - 1e-9:
            self.stop("MaxWaitTimeExceeded")
            return
        if self.phase in BILLED and self.billed >= self.max_runtime - 1e-9:
            self.stop("MaxRuntimeExceeded")
            return
        hit = [m for m in w.interruptions_at if abs(m - self.work_mark) < 1e-6]
        if self.spot and self.phase == "Training" and hit:
            w.interruptions_at.remove(hit[0])
            if w.save_on_notice:
                w.commit(self.work_mark)
            self.work_mark = w.committed_s  # the work since the last checkpoint is lost
            self._enter("Interrupted", w.interrupted_s)
            return
        if self.phase == "Starting" and self.phase_left <= 1e-9:
            if self.spot and w.no_spot_capacity:
                self.phase_left = math.inf
                return
            self.process_s = 0.0
            self.work_mark = w.committed_s
            self._enter("Downloading", w.start_billed_s)
        elif self.phase == "Interrupted" and self.phase_left <= 1e-9:
            self._enter("Starting", w.capacity_wait_s)
        elif self.phase == "Downloading" and self.phase_left <= 1e-9:
            self._enter("Training", math.inf)
        elif self.phase == "Training":
            if self.work_mark >= w.work_s - 1e-9:
                w.commit(w.work_s)
                w.done, self.completed_run = True, True
                self._enter("Uploading", w.save_s + w.upload_s)
            elif self.process_s >= self.segment_s - 1e-9:
                w.commit(self.work_mark)
                self._enter("Uploading", w.save_s + w.upload_s)
        elif self.phase == "Uploading" and self.phase_left <= 1e-9:
            self._end("Completed", "Completed")

    # ---- what DescribeTrainingJob shows -----------------------------------------------------------------

    def billable_seconds(self) -> int:
        return int(math.ceil(self.billed * ((1 - self.world.spot_discount) if self.spot else 1.0)))

    def cost_usd(self) -> float:
        """What this job really bills: its billable time and its warm pool, at the on-demand price."""
        pool = self.keep_alive if self.ended else 0.0
        return (self.billable_seconds() + pool) * self.world.usd_per_instance_hour * self.count / 3600

    def _publish(self) -> None:
        job = self.job
        job.secondary_status_transitions = [
            {**t, "StartTime": _ts(t["StartTime"]), **({"EndTime": _ts(t["EndTime"])} if "EndTime" in t else {}),
             "StatusMessage": t["Status"]} for t in self.transitions]
        job.secondary_status = self.transitions[-1]["Status"]
        # moto stamps CreationTime with the real clock; the guard reads a job's age from it on the simulated one
        job.creation_time = job.training_start_time = _ts(self.created)
        if not self.ended:
            job.training_job_status = "Stopping" if self.phase == "Stopping" else "InProgress"
            job.billable_time_in_seconds = job.training_time_in_seconds = None
            job.final_metric_data_list = []
            return
        job.training_job_status = self.status
        job.training_end_time = _ts(self.t)
        job.billable_time_in_seconds = self.billable_seconds()
        job.training_time_in_seconds = int(math.ceil(self.billed))
        job.final_metric_data_list = [{"MetricName": "train:loss", "Value": 1.0, "Timestamp": _ts(self.t)}] + (
            [{"MetricName": COMPLETED_METRIC, "Value": 1.0, "Timestamp": _ts(self.t)}] if self.completed_run else [])
        if self.end_secondary in ("MaxWaitTimeExceeded", "MaxRuntimeExceeded"):
            job.failure_reason = f"{self.end_secondary}: the job reached its stopping condition"

    def sync(self, until: float) -> None:
        self.advance(until)
        self._publish()


class Simulation:
    def __init__(self, clock: SimClock, world: World):
        self.clock, self.world = clock, world
        self.jobs: dict[str, SimJob] = {}
        self.stop_calls = 0

    def created(self, job) -> None:
        self.world.checkpoint_uri = job.checkpoint_config["S3Uri"]
        self.jobs[job.training_job_name] = SimJob(job, self.world, self.clock())

    def sync(self) -> None:
        for sim in self.jobs.values():
            sim.sync(self.clock())

    def stop(self, name: str) -> None:
        self.sync()
        sim = self.jobs[name]
        sim.stop()
        sim._publish()

    def run_out(self, horizon_s: float = 90 * 86400) -> None:
        """Every Lambda is gone: let each job run until SageMaker ends it."""
        self.clock.advance(horizon_s)
        self.sync()

    def truth_usd(self) -> float:
        return sum(sim.cost_usd() for sim in self.jobs.values())
