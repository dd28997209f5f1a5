"""A SageMaker whose spot capacity follows a trace, for replaying trace windows through the state machine.

The billing, statuses and limits are tests/infra/sagemaker_sim.py's (SimJob's DescribeTrainingJob fields, cost,
MaxRuntime on billed time, MaxWait on wall time, a stop billed while the trainer saves). What differs:
- spot capacity is the trace's windows (seconds from the first job's creation): a spot job waits unbilled
  (Starting, Interrupted) while there is none, and a window's end interrupts it;
- the trainer as the plan describes it: every (re)start bills the startup and, once a checkpoint exists, the
  restore (Downloading); training saves every `interval_s` of work, each save blocking `save_s` and committing at
  its end (a manifest under the checkpoint prefix: the guard lists it, its LastModified the commit's simulated time);
  on an interruption's notice it saves to the last whole step (when the plan saves on the notice), else the work
  since the last commit is lost; a stop (StopTrainingJob, MaxRuntime, MaxWait) saves the same way, billed
  `save_s`; the final step ends the job at once (the last save is part of the work).

A sentinel (a spot job without CheckpointConfig: the cost guard's, spotrun/pipeline/guard.py `sentinel_request`)
is a `SentinelJob`: it has instances exactly while the trace has capacity (two jobs at once get it: the trace
counts instances available), waits unbilled (Starting, Interrupted) while there is none, bills from each window's
start (Training: it sleeps) to the window's end, its stop or a limit; a stop with instances bills SageMaker's
120 s allowance (the sleep ignores SIGTERM) unless the window ends first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tests.infra.sagemaker_sim import BILLED, SimClock, SimJob, Simulation, World

EPS = 1e-6  # seconds: the clock is epoch seconds (~1.8e9), whose float steps are ~2.4e-7 s


@dataclass
class Trainer:
    """The plan's figures the trainer stand-in runs by (from the estimate's sim_plan)."""

    startup_s: float
    restore_s: float
    save_s: float
    interval_s: float  # inf: no periodic saves
    step_s: float  # a save on the notice keeps whole steps of this length
    notice: bool  # saves on the notice (and on a stop)
    # the work's last seconds that are the job's end, billed past the trainer's exit (the sim_plan's work holds
    # them: spotrun/policy/choose.py `plan_from_estimate`): a job whose training left fits its segment_seconds
    # finishes them (spotrun/policy/execution.py `Run.segment_left`)
    end_s: float = 0.0


class TraceJob(SimJob):
    """One job whose spot capacity is the trace's (see the module docstring)."""

    def __init__(self, job, world: World, now: float, trainer: Trainer, windows: list, base: float):
        self.trainer, self.windows, self.base = trainer, windows, base
        self.work, self.cycle, self.saving, self.stop_why = world.committed_s, 0.0, 0.0, ""
        super().__init__(job, world, now)
        self.phase, self.phase_left = "Starting", 0.0

    def _window(self, t: float) -> tuple[float, float]:
        rel = t - self.base
        for a, b in self.windows:
            if b > rel + EPS:
                return a + self.base, b + self.base
        return math.inf, math.inf

    def _stop_started(self, secondary: str) -> bool:
        """A stop that needs nothing more: the job ended or is stopping already, or had no instances (it ends
        now, unbilled). False: the caller enters Stopping."""
        if self.ended or self.phase == "Stopping":
            return True
        if self.phase in ("Starting", "Interrupted"):
            self._end("Stopped", secondary)
            return True
        return False

    def stop(self, secondary: str = "Stopped") -> None:
        if self._stop_started(secondary):
            return
        if self.phase == "Training" and self.trainer.notice:
            self.work = self._to_step()
        else:
            self.work = self.world.committed_s
        self.stop_why = secondary
        self._enter("Stopping", self.trainer.save_s)

    def _to_step(self) -> float:
        done = self.world.committed_s
        return done + math.floor((self.work - done) / self.trainer.step_s + EPS) * self.trainer.step_s

    def advance(self, until: float) -> None:
        for _ in range(100_000):
            if self.ended or self.t >= until - EPS:
                return
            self._event(until)
        raise RuntimeError(f"{self.job.training_job_name}: the simulation does not advance: {self.phase} at "
                           f"{self.t - self.base:.3f} s (until {until - self.base:.3f}), window "
                           f"{self._window(self.t)}, billed {self.billed}, work {self.work}, cycle {self.cycle}, "
                           f"saving {self.saving}, process {self.process_s}/{self.segment_s}")

    def _event(self, until: float) -> None:
        w, tr = self.world, self.trainer
        wait_end = self.created + self.max_wait if self.spot else math.inf
        if self.phase != "Stopping":
            if self.t >= wait_end - EPS:
                return self.stop("MaxWaitTimeExceeded")
            if self.phase in BILLED and self.billed >= self.max_runtime - EPS:
                return self.stop("MaxRuntimeExceeded")
        a, b = self._window(self.t) if self.spot else (self.t, math.inf)
        if self.phase in ("Starting", "Interrupted"):
            if a <= self.t:
                self.work, self.process_s = w.committed_s, 0.0
                return self._enter("Downloading", tr.startup_s + (tr.restore_s if w.committed_s > 0 else 0.0))
            self.t = min(until, a, wait_end)
            return None
        if a > self.t:  # the window ended under the job: the notice
            if self.phase == "Stopping":
                return self._end("Stopped", self.stop_why)
            if self.phase == "Training" and tr.notice:
                w.commit(self._to_step(), self.t)
            self.work, self.saving = w.committed_s, 0.0
            return self._enter("Interrupted", 0.0)
        horizon = min(until, b)
        if self.phase != "Stopping":
            horizon = min(horizon, wait_end, self.t + self.max_runtime - self.billed)
        if self.phase in ("Downloading", "Stopping") or self.saving > 0:
            left = self.saving if self.saving > 0 else self.phase_left
            step = max(0.0, min(left, horizon - self.t))
            self._bill(step)
            if self.saving > 0:
                self.saving -= step
                if self.saving <= EPS:
                    self.saving = 0.0
                    w.commit(self.work, self.t)
                return None
            self.phase_left -= step
            if self.phase_left <= EPS:
                if self.phase == "Downloading":
                    self.cycle = 0.0
                    return self._enter("Training", math.inf)
                w.commit(self.work, self.t)
                return self._end("Completed" if self.stop_why == "segment" else "Stopped", self.stop_why)
            return None
        segment_left = self.segment_s - self.process_s
        if tr.end_s and w.work_s - self.work - tr.end_s <= segment_left + EPS:
            segment_left += tr.end_s
        step = max(0.0, min(horizon - self.t, w.work_s - self.work, tr.interval_s - self.cycle, segment_left))
        self._bill(step)
        self.work += step
        self.cycle += step
        if self.work >= w.work_s - EPS:
            w.commit(w.work_s, self.t)
            w.done, self.completed_run = True, True
            return self._end("Completed", "Completed")
        if step >= segment_left - EPS:  # the trainer's segment_seconds: it saves and exits
            self.stop_why = "segment"
            return self._enter("Stopping", tr.save_s)
        if self.cycle >= tr.interval_s - EPS:
            self.cycle, self.saving = 0.0, tr.save_s
        return None

    def _bill(self, seconds: float) -> None:
        self.t += seconds
        self.billed += seconds
        if self.phase != "Downloading":
            self.process_s += seconds


class TraceSimulation(Simulation):
    """Simulation whose jobs are TraceJobs; the trace's 0 is the first job's creation."""

    def __init__(self, clock: SimClock, world: World, trainer: Trainer, windows: list):
        super().__init__(clock, world)
        self.trainer, self.windows, self.base = trainer, windows, None

    def created(self, job) -> None:
        if not job.checkpoint_config:  # the cost guard's sentinel
            self.jobs[job.training_job_name] = SentinelJob(job, self.world, self.clock(), self.windows, self.base)
            return
        self.world.checkpoint_uri = job.checkpoint_config["S3Uri"]
        self.base = self.clock() if self.base is None else self.base
        self.jobs[job.training_job_name] = TraceJob(job, self.world, self.clock(), self.trainer, self.windows,
                                                    self.base)


class SentinelJob(SimJob):
    """A sentinel spot job whose capacity is the trace's (see the module docstring)."""

    def __init__(self, job, world: World, now: float, windows: list, base: float):
        self.job, self.world, self.windows, self.base = job, world, windows, base
        self.spot, self.count, self.keep_alive = True, int(job.resource_config["InstanceCount"]), 0.0
        self.max_runtime = float(job.stopping_condition["MaxRuntimeInSeconds"])
        self.max_wait = float(job.stopping_condition.get("MaxWaitTimeInSeconds") or math.inf)
        self.created, self.t, self.billed, self.process_s = now, now, 0.0, 0.0
        self.phase, self.phase_left = "Starting", 0.0
        self.ended, self.end_secondary, self.completed_run, self.stop_why = False, "", False, ""
        self.transitions: list[dict] = [{"Status": "Starting", "StartTime": now}]
        self._publish()

    _window = TraceJob._window
    _stop_started = TraceJob._stop_started

    def stop(self, secondary: str = "Stopped") -> None:
        if self._stop_started(secondary):
            return
        self.stop_why = secondary
        self._enter("Stopping", self.world.stop_bill_s)

    def advance(self, until: float) -> None:
        for _ in range(100_000):
            if self.ended or self.t >= until - EPS:
                return
            self._event(until)
        raise RuntimeError(f"{self.job.training_job_name}: the sentinel does not advance ({self.phase})")

    def _event(self, until: float) -> None:
        wait_end = self.created + self.max_wait
        if self.phase != "Stopping":
            if self.t >= wait_end - EPS:
                return self.stop("MaxWaitTimeExceeded")
            if self.phase == "Training" and self.billed >= self.max_runtime - EPS:
                return self.stop("MaxRuntimeExceeded")
        a, b = self._window(self.t)
        if self.phase in ("Starting", "Interrupted"):
            if a <= self.t:
                return self._enter("Training", math.inf)
            self.t = min(until, a, wait_end)
            return None
        if a > self.t:  # the window ended under it: reclaimed (during its stop: it ends)
            if self.phase == "Stopping":
                return self._end("Stopped", self.stop_why)
            return self._enter("Interrupted", 0.0)
        horizon = min(until, b)
        if self.phase == "Stopping":
            step = max(0.0, min(self.phase_left, horizon - self.t))
        else:
            step = max(0.0, min(horizon, wait_end, self.t + self.max_runtime - self.billed) - self.t)
        self.t += step
        self.billed += step
        if self.phase == "Stopping":
            self.phase_left -= step
            if self.phase_left <= EPS:
                self._end("Stopped", self.stop_why)
        return None
