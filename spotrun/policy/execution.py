"""The run as the state machine executes it: the cost guard's polls deciding through spotrun/policy/decision.py.

`execute(plan, trace, policy, checkpointing)` replays one trace the way the pipeline runs it, not the way a
policy would like to: a job is created (spot or on-demand), the guard polls it on its schedule (`poll_wait`: 5%
of the job's age between the plan's poll bounds, cut to the policy's recheck), and at each poll it sees what
the guard sees (the newest committed checkpoint, the job's status) and calls `decide`; a stop takes the job's
save and is noticed at a later poll; a job that ended is followed, at the poll that notices it, by the next job
on the market `decide` chooses. The estimate's odds are computed here, so the odds it prints are the odds of
what runs (tests/infra/test_replay.py replays windows through the rendered state machine against this).

A job, as SageMaker and the trainer run it (spotrun/policy/engine.py states the same costs):
- a spot job waits unbilled for capacity (the trace's windows); every (re)start bills `startup_s` and, once a
  checkpoint exists, `restore_s`; training saves every `interval_s` of work (each save blocks for `save_s` and
  commits at its end);
- at a window's end (an interruption) the trainer saves on the notice when the plan can (`notice_ok` with notice
  saves: the work to the last whole step is committed), else the work since the last commit is lost; the job
  waits for the next window within its MaxWait (from its creation);
- a stop (the guard's StopTrainingJob, MaxRuntime on billed time, MaxWait on wall time): a job without
  instances ends at once; one with instances saves as on an interruption, billed `save_s`, and ends;
- the trainer ends its segment (saves, exits: a Completed job that did not finish the run) after
  `max_runtime_s - startup_s - save_s - 60 s` of its own clock (the guard's `segment_seconds`); a job that reaches
  MaxRuntime (`max_runtime_s`, the run's longest) ends the run unfinished, as the guard does.
A sentinel (`Decision.sentinel`, asked for by `SentinelGreedy` only; executed by spotrun/pipeline/guard.py):
a spot job of the run's instance type and count created at the poll that asks for it, beside the running
on-demand job. It waits unbilled and has instances exactly while the trace has capacity; it bills at spot rates
from each window's start (or its creation) to the window's end or its stop, and a stop that finds it with
instances bills `SENTINEL_STOP_S` more (at most to the window's end). The guard sees it with instances only at a
poll (the grid's or the policy's recheck) inside a window (`sentinel_lag_s` or more into it: SageMaker's delay
from capacity to Downloading, 0 unless asked; billed from the window's start), and asks the policy when that
changes; the sentinel
is stopped at the poll where the policy no longer asks for it or the on-demand job ended.
Not modelled: the cost cap (a run whose cap binds is another run: docs/spot-policy.md, "At a cap that binds",
replays it): the guard gives each job the MaxRuntime the cap leaves and its trainer ends its segment before it
(here the chain is one job of the plan's longest MaxRuntime, its restarts in the work), ends the run where the
chain from the newest checkpoint cannot finish under the cap (here the run bills on), creates a sentinel only
where the cap leaves room for it, and polls sooner near the cap.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from .decision import (
    SENTINEL_STOP_S,
    Action,
    JobStatus,
    Market,
    Observation,
    ask_again,
    checkpoint_step,
    committed_progress_s,
    decide,
    first_poll_at,
)
from .engine import INF, SimPlan, Tally, periodic_interval

SEGMENT_END_MARGIN_S = 60.0  # spotrun/planner/segments.py: the trainer ends its segment this long before its save
STARTS = {Action.START_SPOT: Market.SPOT, Action.START_ON_DEMAND: Market.ON_DEMAND,
          Action.TO_SPOT: Market.SPOT, Action.TO_ON_DEMAND: Market.ON_DEMAND}


@dataclass
class Job:
    """One training job's state (times in seconds since the execution started)."""

    market: Market
    created: float
    t: float
    phase: str = "wait"  # wait (no instances), start (billed startup), train, save, stop (saving on its way out)
    left: float = 0.0  # seconds left in the start/save/stop phase
    billed: float = 0.0
    clock: float = 0.0  # the trainer's own clock since its (re)start (its segment_seconds)
    cycle: float = 0.0  # work since the last periodic save
    since_commit: float = 0.0  # training seconds since the newest commit or the (re)start (the guard sees it)
    stopping: str = ""  # why the job is on its way out: stopped, max_wait, max_runtime, segment
    end: str = ""  # completed, or the reason it stopped


@dataclass
class Run:
    """One trace's execution: the committed and the in-flight work, the bills, the jobs."""

    plan: SimPlan
    ck: str
    trace: list
    committed: float = 0.0
    work: float = 0.0  # work done so far by the current job (committed or not)
    tally: Tally = field(default_factory=Tally)
    jobs: list = field(default_factory=list)
    polls: int = 0
    i: int = 0  # the trace window index (time only moves forward)
    sentinel_at: float | None = None  # when the waiting sentinel was created (None: no sentinel)
    sentinel_s: float = 0.0  # the sentinels' billed seconds (also in tally.spot_s)
    sentinels: int = 0
    sentinel_lag_s: float = 0.0  # a sentinel is seen with instances this long into a window (billed from its start)
    sentinel_stop_s: float = SENTINEL_STOP_S  # billed when a sentinel with instances is stopped
    ends: list | None = field(default=None, repr=False)  # the windows' ends (the sentinel's lookups; built on use)
    _seen: tuple = field(default=(None, 0.0), init=False, repr=False)  # (committed work, what the guard sees
    # of it: whole planned steps) at the last observation

    def _sentinel_window(self, t: float) -> tuple[float, float]:
        """The first window ending after t (a lookup that does not move `i`)."""
        if self.ends is None:
            self.ends = [b for _, b in self.trace]
        k = bisect.bisect_right(self.ends, t)
        return self.trace[k] if k < len(self.trace) else (INF, INF)

    def next_capacity(self, t: float) -> float:
        """The first time at or after t when spot has capacity (a sentinel would get instances)."""
        return max(t, self._sentinel_window(t)[0] + self.sentinel_lag_s)

    def capacity_at(self, t: float) -> bool:
        return self._sentinel_window(t)[0] + self.sentinel_lag_s <= t

    def start_sentinel(self, now: float) -> None:
        if self.sentinel_at is None:
            self.sentinel_at, self.sentinels = now, self.sentinels + 1

    def stop_sentinel(self, now: float) -> None:
        """Stop the sentinel at a poll: bill its time with instances since its creation, and the stop."""
        if self.sentinel_at is None:
            return
        billed, t = 0.0, self.sentinel_at
        while t < now:
            a, b = self._sentinel_window(t)
            if a >= now:
                break
            billed += min(b, now) - max(a, t)
            t = b
        a, b = self._sentinel_window(now)
        if a <= now:
            billed += min(self.sentinel_stop_s, b - now)
        self.sentinel_at = None
        self.sentinel_s += billed
        self.tally.spot_s += billed

    def window(self, t: float) -> tuple[float, float]:
        """The first window ending after t: (start, end); (inf, inf) past the last."""
        while self.i < len(self.trace) and self.trace[self.i][1] <= t:
            self.i += 1
        return self.trace[self.i] if self.i < len(self.trace) else (INF, INF)

    def advance(self, job: Job, until: float, *, unlike: JobStatus | None = None) -> None:
        """Move the job to `until` or to its end, one event at a time (`unlike`: or until its status is other than
        this one)."""
        limit = until - 1e-9
        # `status(job) is not unlike` for a job that has not ended: running unless it waits (the hot loop's test)
        stop_waiting, stop_running = unlike is not None and unlike is not JobStatus.WAITING, \
            unlike is not None and unlike is not JobStatus.RUNNING
        for _ in range(1_000_000):
            if job.end or job.t >= limit or (stop_waiting if job.phase == "wait" else stop_running):
                return
            self._event(job, until)
        raise RuntimeError(f"the execution does not advance at t={job.t} ({job.phase})")

    def _event(self, job: Job, until: float) -> None:
        p, spot = self.plan, job.market is Market.SPOT
        wait_end = job.created + p.max_wait_s if spot else INF
        if job.phase != "stop":
            if job.t >= wait_end - 1e-9:
                return self.stop(job, "max_wait")
            if job.phase != "wait" and job.billed >= p.max_runtime_s - 1e-9:
                return self.stop(job, "max_runtime")
        a, b = self.window(job.t) if spot else (job.t, INF)
        if job.phase == "wait":
            job.t = min(until, max(a, job.t), wait_end)
            if a <= job.t < wait_end:
                restore = p.restore_s if self.committed > 0 else 0.0
                job.phase, job.left, job.clock, job.cycle = "start", p.startup_s + restore, 0.0, 0.0
                self.work = self.committed
            return None
        if a > job.t:  # the window ended under the job
            return self.interrupted(job)
        horizon = min(until, b)
        if job.phase != "stop":
            horizon = min(horizon, wait_end, job.t + p.max_runtime_s - job.billed)
        if job.phase != "train":
            step = max(0.0, min(job.left, horizon - job.t))
            self.bill(job, step)
            job.left -= step
            if job.left <= 1e-9:
                self.phase_done(job)
            return None
        interval = periodic_interval(p, self.ck)
        segment_left = p.max_runtime_s - p.startup_s - p.save_s - SEGMENT_END_MARGIN_S - job.clock
        if job.cycle == 0.0 and interval < INF:
            self._whole_cycles(job, interval, min(horizon - job.t, segment_left))
            segment_left = p.max_runtime_s - p.startup_s - p.save_s - SEGMENT_END_MARGIN_S - job.clock
        step = max(0.0, min(horizon - job.t, p.work_s - self.work, interval - job.cycle, segment_left))
        self.bill(job, step)
        job.cycle += step
        self.work += step
        if self.work >= p.work_s - 1e-9:
            self.committed = self.work = p.work_s
            job.end = "completed"
        elif step >= segment_left - 1e-9:  # the trainer ends its segment: it saves and exits
            job.phase, job.left, job.stopping = "stop", p.save_s, "segment"
        elif job.cycle >= interval - 1e-9:
            job.phase, job.left, job.cycle = "save", p.save_s, 0.0
        return None

    def _whole_cycles(self, job: Job, interval: float, room: float) -> None:
        """Train-and-save cycles that end strictly inside `room` and before the work is done, in one step: the
        same bills and commits as one event per phase (the simulation's work stays bounded by the interruptions
        and polls, not by the saves)."""
        cycle = interval + self.plan.save_s
        k = math.ceil((self.plan.work_s - self.work) / interval) - 2
        if room < INF:
            k = min(k, int(room / cycle) - 1)
        if k <= 0:
            return
        self.bill(job, k * cycle)
        self.work += k * interval
        self.committed = self.work
        job.since_commit = 0.0

    def bill(self, job: Job, seconds: float) -> None:
        job.t += seconds
        job.billed += seconds
        if job.phase != "start":
            job.clock += seconds
        if job.phase in ("train", "save"):
            job.since_commit += seconds
        if job.market is Market.SPOT:
            self.tally.spot_s += seconds
        else:
            self.tally.od_s += seconds

    def phase_done(self, job: Job) -> None:
        if job.phase == "stop":  # the save on the way out is done
            self.committed = max(self.committed, self.work)
            job.end = job.stopping
        elif job.phase == "save":
            self.committed = self.work
        job.phase, job.since_commit = "train", 0.0

    def notice_saves(self) -> bool:
        return self.plan.notice_ok and self.ck in ("notice", "both")

    def _saved_on_notice(self) -> float:
        """The work a save on the notice commits: to the last whole step."""
        return self.committed + math.floor((self.work - self.committed) / self.plan.step_s + 1e-9) * self.plan.step_s

    def interrupted(self, job: Job) -> None:
        """The window ended under the job: save on the notice or lose the work since the last commit; wait."""
        if job.phase == "stop":  # reclaimed during its stop: the save in flight is lost, the job ends
            job.end = job.stopping
        elif job.phase in ("train", "save") and self.notice_saves():
            self.committed = self._saved_on_notice()
        self.tally.lost_s += self.work - self.committed
        self.work = self.committed
        self.tally.interruptions += 1
        if not job.end:
            job.phase, job.left = "wait", 0.0

    def stop(self, job: Job, why: str) -> None:
        """SIGTERM: a job without instances ends now; one with instances saves (on the notice) and ends."""
        if job.end or job.phase == "stop":
            return
        if job.phase == "wait":
            job.end = why
            return
        if job.phase in ("train", "save") and self.notice_saves():
            self.work = self._saved_on_notice()
        else:
            self.tally.lost_s += self.work - self.committed
            self.work = self.committed
        job.phase, job.left, job.stopping = "stop", self.plan.save_s, why

    @staticmethod
    def status(job: Job) -> JobStatus:
        return JobStatus.NONE if job.end else JobStatus.WAITING if job.phase == "wait" else JobStatus.RUNNING

    def observe(self, job: Job, now: float, spot_seen: bool = False) -> Observation:
        """What the guard sees at a poll (spotrun/pipeline/guard.py `observe`): the committed work as whole
        planned steps (`committed_progress_s` of the checkpoint's step), the ended jobs' bills and the running
        job's billed seconds at on-demand rates (the guard's bound: SageMaker reports a job's billable time at
        its end)."""
        p, status = self.plan, self.status(job)
        spent = self.tally.spot_s * p.spot_usd_per_h + self.tally.od_s * p.on_demand_usd_per_h
        if not job.end and job.market is Market.SPOT:
            spent += job.billed * (p.on_demand_usd_per_h - p.spot_usd_per_h)
        if self._seen[0] != self.committed:  # the checkpoint's step, as the guard reads it, when it changed
            steps = p.steps
            self._seen = (self.committed, committed_progress_s(checkpoint_step(self.committed, p.work_s, steps),
                                                               p.work_s, steps))
        return Observation(elapsed_s=now, committed_s=self._seen[1], market=job.market, status=status,
                           job_age_s=0.0 if job.end else now - job.created, spent_usd=spent / 3600,
                           max_wait_exceeded=job.end == "max_wait",
                           training_s=job.since_commit if job.phase in ("train", "save") and not job.end else 0.0,
                           spot_seen=spot_seen)

    def skip_polls(self, created: float, now: float, target: float, recheck_at: float) -> float:
        """The first poll at or after `target` (counted)."""
        at, polls = first_poll_at(created, now, target, recheck_at, poll_s=self.plan.poll_s,
                                  max_poll_s=self.plan.max_poll_s)
        self.polls += polls - 1  # the poll at `at` is counted where it is taken
        return at

    def create(self, market: Market, now: float) -> Job:
        if self.jobs and market is not self.jobs[-1].market:
            self.tally.switches += 1
        job = Job(market=market, created=now, t=now)
        self.jobs.append(job)
        return job


def execute(plan: SimPlan, trace: list, policy: str, checkpointing: str, *, horizon_s: float = INF,
            sentinel_lag_s: float = 0.0, sentinel_stop_s: float = SENTINEL_STOP_S) -> Run:
    """One trace run as the state machine runs it (see the module docstring); `run.tally` is its outcome. The
    policy is asked when `decision.ask_again` says the guard asks it. `sentinel_lag_s`, `sentinel_stop_s`: a
    sentinel's assumptions (the module docstring), for sensitivity checks."""
    run = Run(plan, checkpointing, trace, sentinel_lag_s=sentinel_lag_s, sentinel_stop_s=sentinel_stop_s)
    first = decide(policy, plan, checkpointing, Observation(0.0, 0.0, Market.SPOT, JobStatus.NONE))
    job = run.create(Market.SPOT if first.action is Action.START_SPOT else Market.ON_DEMAND, 0.0)
    now, switch_to = 0.0, None
    asked_status, recheck_at, asked_seen = JobStatus.NONE, 0.0, False
    while now < horizon_s:
        if switch_to is None:  # the polls before a change of status or the recheck ask nothing: skip them
            # (the status the policy was last asked at: a new job's first poll asks, even when it still waits;
            # a waiting sentinel: the polls before it can have instances)
            until = min(recheck_at, horizon_s)
            if run.sentinel_at is not None and not asked_seen:
                until = min(until, run.next_capacity(now))
            run.advance(job, until, unlike=asked_status)
            now = run.skip_polls(job.created, now, max(job.t, now), recheck_at)
        else:  # stopping: the guard polls every poll_s until the job has ended
            now += plan.poll_s
        run.advance(job, now)
        run.polls += 1
        if job.end == "completed":
            run.stop_sentinel(now)
            run.tally.t, run.tally.finished, run.tally.progress = job.t, True, plan.work_s
            return run
        if switch_to is not None and not job.end:
            continue
        if job.end == "max_runtime":  # the guard ends a run whose job ran to the longest MaxRuntime unfinished
            break
        status = run.status(job)
        seen = run.sentinel_at is not None and run.capacity_at(now)
        if ask_again(status, asked_status, now, recheck_at) or seen is not asked_seen:
            decision = decide(policy, plan, checkpointing, run.observe(job, now, spot_seen=seen))
            asked_status, recheck_at, asked_seen = status, now + decision.recheck_s, seen
            if decision.sentinel and not job.end and job.market is Market.ON_DEMAND:
                run.start_sentinel(now)
            else:
                run.stop_sentinel(now)
            if job.end and decision.action is Action.END:
                break
            if job.end:
                job = run.create(switch_to or STARTS.get(decision.action, job.market), now)
                switch_to, asked_status = None, JobStatus.NONE
                continue
            if decision.action in (Action.TO_SPOT, Action.TO_ON_DEMAND):
                run.stop(job, "stopped")
                switch_to = STARTS[decision.action]
    run.stop_sentinel(now)
    run.tally.t, run.tally.progress = now, run.committed
    return run
