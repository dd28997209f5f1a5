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
The cost cap (`SimPlan.cap_usd`; `Cap`), as the guard holds it, through its own rules (spotrun/planner/segments.py,
which spotrun/pipeline/guard.py calls too): each job's MaxRuntime is what the cap leaves at on-demand rates
(`next_max_runtime`: the first job's at no spend, a later one's from the jobs' exact bills and a live sentinel's
bound; an on-demand job less the sentinel's room where the chain fits with it, `next_segment`) and its trainer
ends its segment `segment_seconds` into each start; at a job's end the run ends at the cap (OverBudget,
unfinished) where the chain from the newest checkpoint, at the guard's pace (`work_left_s`), does not fit
(`next_segment`); the polls come no later than the time the cap leaves (`cap_wait_s`, the guard's `next_wait`); a
sentinel is created only where the cap leaves room for it beside the on-demand job (`sentinel_room`); a spot job
waiting after an interruption whose MaxRuntime left cannot hold a restart is stopped (`restart_wasted_s`). The
chain's restarts are its jobs' starts (not added to the work, as without the cap: spotrun/policy/choose.py
`plan_from_estimate`). Without a cap, or where the cap shaped nothing (`Tally.capped` false), the run is the one
executed without it. Not modelled: a sentinel's own MaxRuntime and MaxWait (the room kept for it holds its look),
the guard's second-line stop (every MaxRuntime keeps the run under the cap), a preparation's bill before the
first job, and a job's end billed at every job (the plan's work holds one end: `Run.segment_left`).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import math
from dataclasses import dataclass, field

from ..planner.segments import (
    JOB_END_S,
    STOP_BILL_S,
    ChainCosts,
    next_max_runtime,
    next_segment,
    restart_wasted_s,
    segment_seconds,
    sentinel_room,
    work_left_s,
)
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
    poll_grid,
    sentinel_room_s,
)
from .engine import INF, SimPlan, Tally, periodic_interval

# The members as module names: an Enum member looked up on its class costs about 0.2 us in Python 3.11, and the
# simulator makes these tests millions of times per estimate (the same objects: `is` holds as before).
_SPOT, _ON_DEMAND = Market.SPOT, Market.ON_DEMAND
_RUNNING, _WAITING, _NO_JOB = JobStatus.RUNNING, JobStatus.WAITING, JobStatus.NONE
_KEEP, _TO_ON_DEMAND, _TO_SPOT, _END = Action.KEEP, Action.TO_ON_DEMAND, Action.TO_SPOT, Action.END
_START_SPOT, _START_ON_DEMAND = Action.START_SPOT, Action.START_ON_DEMAND

_new = object.__new__  # an instance without its __init__ (`Run.observe`, `execute_all`: fields set at once)
SEGMENT_END_MARGIN_S = 60.0  # spotrun/planner/segments.py: the trainer ends its segment this long before its save
# `skip_polls_capped`'s floor under the room left is this much under its arithmetic: far over the floats' error in
# the room's seconds (about 1e-5 s at a $1,000,000 cap and $0.50/h), far under a poll's wait (whole seconds)
LEFT_FLOOR_MARGIN_S = 1e-3
STARTS = {_START_SPOT: _SPOT, _START_ON_DEMAND: _ON_DEMAND,
          _TO_SPOT: _SPOT, _TO_ON_DEMAND: _ON_DEMAND}


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
    max_runtime_s: float = INF  # its MaxRuntimeInSeconds (billed seconds)
    max_wait_s: float = INF  # its MaxWaitTimeInSeconds from its creation (a spot job's)
    segment_s: float = INF  # its trainer's budget (`segment_seconds`): it ends its segment this long into a start
    interrupted: bool = False  # it lost its capacity at least once (the guard's `restart_wasted` looks at it)
    end_s: float = 0.0  # the work's last seconds that are the job's end, not its trainer's (`Run.segment_left`)


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
    capped: bool = False  # the cap shaped the run (a job's MaxRuntime, a poll, a sentinel, its end): `Cap`
    over_budget: bool = False  # the guard ended the run at the cap (OverBudget: no chain from here fits)
    on_demand_jobs: int = field(default=0, init=False)  # the jobs on on-demand so far (their warm pools: `_warm_s`)
    interval: float = field(default=INF, init=False)  # `periodic_interval(plan, ck)`, asked at every training event
    reach: float | None = field(default=None, repr=False)  # with a number: the time past which the first window's
    # end no longer changes anything the run reads (`_reached`; -inf: it read no window, an on-demand run's;
    # `execute_all` shares the uninterrupted run by it)

    def __post_init__(self):
        self.interval = periodic_interval(self.plan, self.ck)

    def _sentinel_window(self, t: float) -> tuple[float, float]:
        """The first window ending after t (a lookup that does not move `i`)."""
        if self.ends is None:
            self.ends = [b for _, b in self.trace]
        if self.reach is not None:
            self._reached(t)
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

    def sentinel_billed(self, now: float) -> float:
        """The live sentinel's seconds with instances from its creation to `now` (0 without one)."""
        if self.sentinel_at is None:
            return 0.0
        billed, t = 0.0, self.sentinel_at
        if self.reach is not None:
            self._reached(now)
        while t < now:
            a, b = self._sentinel_window(t)
            if a >= now:
                break
            billed += min(b, now) - max(a, t)
            t = b
        return billed

    def stop_sentinel(self, now: float) -> None:
        """Stop the sentinel at a poll: bill its time with instances since its creation, and the stop."""
        if self.sentinel_at is None:
            return
        billed = self.sentinel_billed(now)
        a, b = self._sentinel_window(now)
        if self.reach is not None:
            self._reached(now + self.sentinel_stop_s)
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
        stop_waiting, stop_running = unlike is not None and unlike is not _WAITING, \
            unlike is not None and unlike is not _RUNNING
        for _ in range(1_000_000):
            if job.end or job.t >= limit or (stop_waiting if job.phase == "wait" else stop_running):
                return
            self._event(job, until)
        raise RuntimeError(f"the execution does not advance at t={job.t} ({job.phase})")

    def _event(self, job: Job, until: float) -> None:
        p, spot = self.plan, job.market is _SPOT
        wait_end = job.created + job.max_wait_s if spot else INF
        if job.phase != "stop":
            if job.t >= wait_end - 1e-9:
                return self.stop(job, "max_wait")
            if job.phase != "wait" and job.billed >= job.max_runtime_s - 1e-9:
                return self.stop(job, "max_runtime")
        if spot:  # `window(job.t)`, inline: the hot loop's
            trace, i, t = self.trace, self.i, job.t
            while i < len(trace) and trace[i][1] <= t:
                i += 1
            self.i = i
            a, b = trace[i] if i < len(trace) else (INF, INF)
            reach = self.reach is not None
            if reach:
                self._reached(t)
        else:
            a, b, reach = job.t, INF, False
        # min() and max() written out below (the hot loop's): `y if y < x else x` is min(x, y), `y if y > x else x`
        # max(x, y), to the bit (the builtins keep the first of equals and compare with the same operators)
        if job.phase == "wait":
            t = job.t if job.t > a else a  # min(until, max(a, job.t), wait_end)
            t = t if t < until else until
            job.t = wait_end if wait_end < t else t
            if a <= job.t < wait_end:
                restore = p.restore_s if self.committed > 0 else 0.0
                job.phase, job.left, job.clock, job.cycle = "start", p.startup_s + restore, 0.0, 0.0
                self.work = self.committed
            return None
        if a > job.t:  # the window ended under the job
            return self.interrupted(job)
        horizon = b if b < until else until  # min(until, b)
        if job.phase != "stop":  # min(horizon, wait_end, job.t + job.max_runtime_s - job.billed)
            horizon = wait_end if wait_end < horizon else horizon
            runtime_end = job.t + job.max_runtime_s - job.billed
            horizon = runtime_end if runtime_end < horizon else horizon
        if job.phase != "train":
            step = horizon - job.t  # max(0.0, min(job.left, horizon - job.t))
            step = step if step < job.left else job.left
            step = step if step > 0.0 else 0.0
            if reach:
                self._reached(min(horizon, job.t + job.left))
            self.bill(job, step)
            job.left -= step
            if job.left <= 1e-9:
                self.phase_done(job)
            return None
        interval = self.interval
        segment_left = self.segment_left(job)
        if job.cycle == 0.0 and interval < INF:
            if reach:  # the whole cycles' count reads the window's end below (k + 1) cycles or the segment
                k = math.ceil((p.work_s - self.work) / interval) - 2
                if k > 0:
                    self._reached(min(horizon, job.t + min(segment_left, (k + 1) * (interval + p.save_s))))
            self._whole_cycles(job, interval, min(horizon - job.t, segment_left))
            segment_left = self.segment_left(job)
        # max(0.0, min(horizon - job.t, p.work_s - self.work, interval - job.cycle, segment_left))
        step, work_left, cycle_left = horizon - job.t, p.work_s - self.work, interval - job.cycle
        step = work_left if work_left < step else step
        step = cycle_left if cycle_left < step else step
        step = segment_left if segment_left < step else step
        step = step if step > 0.0 else 0.0
        if reach:
            self._reached(min(horizon, job.t + min(p.work_s - self.work, interval - job.cycle, segment_left)))
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

    def _reached(self, t: float) -> None:
        """With `reach` recorded (a run on `UNINTERRUPTED`, whose first window never ends): the run read the
        window's end where one at or before `t` would have read otherwise (an interruption, or a step, save or
        whole cycles cut short by it). A trace whose first window starts at 0 and ends past every such `t` (by
        REACH_MARGIN_S, for the roundings of `end - t`) is executed exactly as this run: the same reads, the same
        floats (`execute_all`)."""
        if t > self.reach:
            self.reach = t

    def segment_left(self, job: Job) -> float:
        """The trainer's budget left (`segment_seconds`). With the cap modelled, a job whose work left fits it but
        for the job's end (`JOB_END_S`: the plan's work holds it, spotrun/policy/choose.py `plan_from_estimate`)
        finishes: the end is billed past the trainer's exit, within MaxRuntime (a run at the cap at which it is one
        job is one job)."""
        left = job.segment_s - job.clock
        if job.end_s and self.plan.work_s - self.work - job.end_s <= left + 1e-9:
            return left + job.end_s
        return left

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
        if job.market is _SPOT:
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
        job.interrupted = True
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
        return _NO_JOB if job.end else _WAITING if job.phase == "wait" else _RUNNING

    def observe(self, job: Job, now: float, spot_seen: bool = False) -> Observation:
        """What the guard sees at a poll (spotrun/pipeline/guard.py `observe`): the committed work as whole
        planned steps (`committed_progress_s` of the checkpoint's step), the ended jobs' bills and the running
        job's billed seconds at on-demand rates (the guard's bound: SageMaker reports a job's billable time at
        its end)."""
        p, status = self.plan, self.status(job)
        spent = self.tally.spot_s * p.spot_usd_per_h + self.tally.od_s * p.on_demand_usd_per_h
        if not job.end and job.market is _SPOT:
            spent += job.billed * (p.on_demand_usd_per_h - p.spot_usd_per_h)
        if self._seen[0] != self.committed:  # the checkpoint's step, as the guard reads it, when it changed
            steps = p.steps
            self._seen = (self.committed, committed_progress_s(checkpoint_step(self.committed, p.work_s, steps),
                                                               p.work_s, steps))
        # the frozen dataclass's fields set at once (its __init__ sets them one `object.__setattr__` at a time:
        # a tenth of an estimate's time went there); the same object, equal to `Observation(...)` of the fields
        obs = _new(Observation)
        obs.__dict__.update(elapsed_s=now, committed_s=self._seen[1], market=job.market, status=status,
                            job_age_s=0.0 if job.end else now - job.created, spent_usd=spent / 3600,
                            max_wait_exceeded=job.end == "max_wait",
                            training_s=job.since_commit if job.phase in ("train", "save") and not job.end else 0.0,
                            spot_seen=spot_seen)
        return obs

    def skip_polls(self, created: float, now: float, target: float, recheck_at: float) -> float:
        """The first poll at or after `target` (counted)."""
        at, polls = first_poll_at(created, now, target, recheck_at, poll_s=self.plan.poll_s,
                                  max_poll_s=self.plan.max_poll_s)
        self.polls += polls - 1  # the poll at `at` is counted where it is taken
        return at

    def create(self, market: Market, now: float, limits: tuple[float, float, float] | None = None) -> Job:
        """A job created at `now`; `limits`: its MaxRuntime, MaxWait and trainer's budget (`Cap.limits`; None: the
        plan's, the cap not binding)."""
        if self.jobs and market is not self.jobs[-1].market:
            self.tally.switches += 1
        p = self.plan
        max_runtime, max_wait, segment = limits or (
            p.max_runtime_s, p.max_wait_s, p.max_runtime_s - p.startup_s - p.save_s - SEGMENT_END_MARGIN_S)
        job = Job(market=market, created=now, t=now, max_runtime_s=max_runtime, max_wait_s=max_wait,
                  segment_s=segment, end_s=JOB_END_S if p.cap_usd is not None else 0.0)
        self.jobs.append(job)
        self.on_demand_jobs += market is _ON_DEMAND
        return job

    # ---- the cost guard's view of the bills (the cap's rules: `Cap`) -------------------------------------------

    def billed_usd(self) -> float:
        """What the tally holds: the ended jobs' and sentinels' bills and the live job's so far."""
        p = self.plan
        return (self.tally.spot_s * p.spot_usd_per_h + self.tally.od_s * p.on_demand_usd_per_h) / 3600

    def guard_spent(self, cap: Cap, job: Job, t: float, billed_s: float) -> float:
        """The guard's spent money at a poll at `t` where `job` has billed `billed_s` seconds (it need not have
        ended): the other jobs' exact bills with their warm pools (spotrun/pipeline/guard.py `job_cost`), the job's
        bound at on-demand rates (its warm pool with it) and a live sentinel's bound at on-demand rates."""
        od = self.plan.on_demand_usd_per_h / 3600
        return self.billed_usd() - job.billed * self._own_usd_per_s(job) + \
            (billed_s + self._warm_s(cap) + self.sentinel_billed(t)) * od

    def _own_usd_per_s(self, job: Job) -> float:
        p = self.plan
        return (p.spot_usd_per_h if job.market is _SPOT else p.on_demand_usd_per_h) / 3600

    def bill_last_warm_pool(self) -> None:
        """The run's bill gets the last on-demand job's warm pool: its keep-alive bills at on-demand rates after the
        job ends and no later job takes it (SageMaker bills a warm pool's instances until a matching job reuses it
        or the keep-alive ends: the guide's "SageMaker Managed Warm Pools"); an earlier job's pool is taken by the
        next job of the chain when it starts, which the guard's bound (`_warm_s`, one per job) does not assume.
        Only an on-demand run has one (the contract refuses compute.warm_pool_minutes with spot). The run's bill
        left it out: a new user's qwen2 with 30 min of warm pool was told $0.74, the keep-alive alone bills $1.16."""
        if self.plan.warm_pool_s and self.on_demand_jobs:
            self.tally.od_s += self.plan.warm_pool_s

    def _warm_s(self, cap: Cap) -> float:
        """The warm pools' seconds the guard counts: one per on-demand job."""
        return cap.costs.warm_pool_s * self.on_demand_jobs

    def ended_spent(self, cap: Cap, now: float) -> float:
        """The guard's spent money at the poll that found the run's last job ended: the jobs' exact bills with their
        warm pools, a live sentinel's bound at on-demand rates (it is stopped at this poll)."""
        od = self.plan.on_demand_usd_per_h / 3600
        warm = cap.costs.warm_pool_s * self.on_demand_jobs
        return self.billed_usd() + (warm + self.sentinel_billed(now)) * od

    def skip_polls_capped(self, cap: Cap, job: Job, now: float, target: float, recheck_at: float,
                          billed_s: float, running: bool) -> float:
        """`skip_polls` as the guard waits near the cap (`next_wait`: never past the time the cap leaves,
        `cap_wait_s`), from the poll at `now` where the job had billed `billed_s` (`running`: it bills on to the
        target, else it waits). Far from the cap (the cut cannot bind before the target: the room shrinks at most at
        on-demand rates for the job and a sentinel, and no wait is longer than the grid's at the target's age), or
        where no wait was cut, the grid's poll."""
        p, tally, sentinel = self.plan, self.tally, self.sentinel_at is not None
        at, polls = first_poll_at(job.created, now, target, recheck_at, poll_s=p.poll_s, max_poll_s=p.max_poll_s)
        usd_per_s = cap.costs.usd_per_s
        shrink = (1.0 if running else 0.0) + (1.0 if sentinel else 0.0)
        # `cap_wait_s` of `guard_spent` at `now`, written out (the same arithmetic in the same order: the same
        # floats; every poll the guard skips comes here), with the parts that no poll of the loop below changes
        # (a long run near its cap polls there thousands of times)
        od = p.on_demand_usd_per_h / 3600
        others = (tally.spot_s * p.spot_usd_per_h + tally.od_s * p.on_demand_usd_per_h) / 3600 - \
            job.billed * ((p.spot_usd_per_h if job.market is _SPOT else p.on_demand_usd_per_h) / 3600)
        warm = cap.costs.warm_pool_s * self.on_demand_jobs
        room = (cap.cap_usd - (others + (billed_s + warm + (self.sentinel_billed(now) if sentinel else 0.0)) * od)) \
            / usd_per_s - STOP_BILL_S
        # p.poll_s + min(p.max_poll_s, max(p.poll_s, 0.06 * (...))), written out as in `Run._event`
        longest_wait = 0.06 * (at - job.created + p.poll_s)
        longest_wait = longest_wait if longest_wait > p.poll_s else p.poll_s
        longest_wait = p.poll_s + (longest_wait if longest_wait < p.max_poll_s else p.max_poll_s)
        if room - shrink * (at - now) >= longest_wait:
            self.polls += polls - 1
            return at
        t, n, cut = now, 0, False
        grid_ages = poll_grid(p.poll_s, p.max_poll_s)
        # `wait_on_grid` and `cap_wait_s` written out too (the same arithmetic)
        last, created, cap_usd, poll_s, max_poll_s = grid_ages[-1], job.created, cap.cap_usd, p.poll_s, p.max_poll_s
        # a floor under the room left at a poll at t: `room` less its shrink since `now` (the job's bound and a
        # sentinel's grow by at most the seconds elapsed, at on-demand rates); where it is over the poll's wait, the
        # wait is not cut there and `spent` need not be computed (a sentinel's bills are a walk over the windows)
        floor_left, shrink_per_s = room - LEFT_FLOOR_MARGIN_S, shrink * od / usd_per_s
        reach = sentinel and self.reach is not None
        walk = recheck_at == INF and _integral(now, created) and _grid_walk(poll_s, max_poll_s) is not None
        for _ in range(1_000_000):
            if n == 1 and walk:  # on the grid from the second poll: the polls the floor keeps uncut, at once
                k, t_k, before = _uncut_polls(grid_ages, t - created, created, now, target, floor_left,
                                              shrink_per_s, max_poll_s)
                if k:
                    if reach:
                        self._reached(before)
                    t, n = t_k, n + k
                    if t >= target - 1e-9:
                        break
            job_age = math.floor(t - created)
            age_s = job_age + poll_s
            if age_s <= last:
                at_age = grid_ages[bisect.bisect_left(grid_ages, age_s - 1e-9)]
            else:
                at_age = last + math.ceil((age_s - last) / max_poll_s - 1e-9) * max_poll_s
            recheck_s = recheck_at - t
            grid = min(at_age - job_age, INF if recheck_s == INF else float(max(poll_s, math.ceil(recheck_s - 1e-9))))
            if floor_left - shrink_per_s * (t - now) >= grid:  # `left` >= grid: not cut, the grid's wait
                if reach:  # (as `sentinel_billed(t)` records it)
                    self._reached(t)
                t += int(max(poll_s, grid))
            else:
                billed = billed_s + (t - now) if running else billed_s
                spent = others + (billed + warm + (self.sentinel_billed(t) if sentinel else 0.0)) * od
                left = (cap_usd - spent) / usd_per_s - STOP_BILL_S
                cut = cut or left < grid
                t += int(max(poll_s, min(grid, left)))
            n += 1
            if t >= target - 1e-9:
                break
        if not cut:
            self.polls += polls - 1
            return at
        self.capped = True
        self.polls += n - 1
        return t


def _integral(*times: float) -> bool:
    """Whether every time is a whole number of seconds, where adding whole seconds to it is exact."""
    return all(x == math.floor(x) and abs(x) < 2.0 ** 52 for x in times)


@functools.lru_cache(maxsize=16)
def _grid_walk(poll_s: float, max_poll_s: float) -> tuple[float, ...] | None:
    """The poll grid (`poll_grid`) where `skip_polls_capped`'s loop, at a whole-second job age on it and with no
    recheck, waits exactly to the grid's next age (past its last, every max_poll_s), and the waits never shrink:
    then the loop's polls are the grid's ages, and `_uncut_polls` may skip them. None otherwise."""
    grid = poll_grid(poll_s, max_poll_s)
    if not (_integral(poll_s, max_poll_s) and 1.0 <= poll_s <= max_poll_s):
        return None
    last = grid[-1]
    ages = [*grid, *(last + m * max_poll_s for m in range(1, 4))]
    for age, after in zip(ages, ages[1:], strict=False):  # the loop's arithmetic (`wait_on_grid`'s), at each age
        age_s = age + poll_s
        at = grid[bisect.bisect_left(grid, age_s - 1e-9)] if age_s <= last else \
            last + math.ceil((age_s - last) / max_poll_s - 1e-9) * max_poll_s
        if at != after or int(max(poll_s, at - age)) != at - age:
            return None
    waits = [b - a for a, b in zip(ages, ages[1:], strict=False)]
    return grid if all(a <= b for a, b in zip(waits, waits[1:], strict=False)) else None


def _grid_age(grid: tuple[float, ...], i: int, max_poll_s: float) -> float:
    """The grid's i-th age, past its last every max_poll_s."""
    return grid[i] if i < len(grid) else grid[-1] + (i - len(grid) + 1) * max_poll_s


def _uncut_polls(grid: tuple[float, ...], age: float, created: float, now: float, target: float, floor_left: float,
                 shrink_per_s: float, max_poll_s: float) -> tuple[int, float, float]:
    """`skip_polls_capped`'s polls from one at `age` on the grid (whole seconds, `_grid_walk`) that its floor under
    the room left keeps uncut, taken at once: (how many, the time of the poll after them, the time of the last one).
    The loop's test at each (`floor_left - shrink_per_s * (t - now) >= wait`) on the same floats (whole seconds add
    exactly): it holds on a prefix of the polls (the floor falls, the grid's waits grow), found by bisection, as is
    the first poll at or after the target, where the loop stops."""
    last = grid[-1]
    if age <= last:
        i0 = bisect.bisect_left(grid, age)
        if i0 >= len(grid) or grid[i0] != age:
            return 0, 0.0, 0.0
    else:
        m = (age - last) / max_poll_s
        if m != math.floor(m):
            return 0, 0.0, 0.0
        i0 = len(grid) - 1 + int(m)

    def uncut(k: int) -> bool:  # the loop passes poll k without a cut, and has not stopped at it
        at = _grid_age(grid, i0 + k, max_poll_s)
        t = created + at
        if k and t >= target - 1e-9:
            return False
        return floor_left - shrink_per_s * (t - now) >= _grid_age(grid, i0 + k + 1, max_poll_s) - at

    lo, hi = 0, 1  # every poll before lo is passed; hi - 1 is not, once found
    while uncut(hi - 1):
        if hi >= 1 << 40:
            return 0, 0.0, 0.0
        lo, hi = hi, 2 * hi
    hi -= 1
    while lo < hi:  # the first poll not passed, in [lo, hi]
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if uncut(mid) else (lo, mid)
    k = lo
    if k == 0:
        return 0, 0.0, 0.0
    return k, created + _grid_age(grid, i0 + k, max_poll_s), created + _grid_age(grid, i0 + k - 1, max_poll_s)


@dataclass(frozen=True)
class Cap:
    """The cost cap as the cost guard holds it (spotrun/pipeline/guard.py, its rules in spotrun/planner/segments.py,
    called here, not copied): the plan's `cap_usd` and the guard's chain figures, with the room the policy keeps
    beside an on-demand job for its sentinel (the guard's `plan_sentinel_room_s`)."""

    cap_usd: float
    costs: ChainCosts
    wait_allowance_s: float  # a spot job's MaxWait past its MaxRuntime (the plan's `max_wait_extra_seconds`)

    @classmethod
    def of(cls, plan: SimPlan, policy: str) -> Cap | None:
        """The plan's cap for `policy` (made once per plan and policy: each of a plan's traces asks for it)."""
        if plan.cap_usd is None:
            return None
        made = _CAPS.get((id(plan), policy))
        if made is not None and made[0] is plan:
            return made[1]
        costs = dataclasses.replace(plan.chain_costs, sentinel_room_s=sentinel_room_s(policy, plan.poll_s))
        allowance = plan.max_wait_s - plan.max_runtime_s if plan.max_wait_s < INF else INF
        if len(_CAPS) >= 64:
            _CAPS.clear()
        cap = cls(plan.cap_usd, costs, allowance)
        _CAPS[id(plan), policy] = (plan, cap)  # the plan held: its id is not reused while kept
        return cap

    def limits(self, plan: SimPlan, market: Market, max_runtime_s: int, first: bool) -> tuple | None:
        """(MaxRuntime, MaxWait, the trainer's `segment_seconds`) of a job of `max_runtime_s`, or None where it is
        the plan's longest (the cap does not bind it: `Run.create` takes the plan's). The first job's trainer budget
        counts the estimate's save (spotrun/planner/outputs.py `first_segment_seconds`), a later one's the guard's."""
        if max_runtime_s >= self.costs.longest_s:
            return None
        save = plan.save_s if first else self.costs.save_s
        segment = segment_seconds(max_runtime_s, startup_s=self.costs.startup_s, save_s=save)
        wait = max_runtime_s + self.wait_allowance_s if market is _SPOT else INF
        return float(max_runtime_s), wait, float(segment)

    def first(self, plan: SimPlan, market: Market) -> tuple | None:
        """The first job's limits: the estimate's MaxRuntime, all the cap allows (the planner's chain: its first job
        keeps no room, spotrun/planner/segments.py `plan_segments`)."""
        return self.limits(plan, market, next_max_runtime(cap_usd=self.cap_usd, spent_usd=0.0,
                                                          usd_per_s=self.costs.usd_per_s,
                                                          longest_s=self.costs.longest_s), True)

    def work_left(self, plan: SimPlan, committed: float) -> float:
        """The guard's `work_left` from the checkpoint's step as it reads it."""
        return work_left_s(planned_steps=plan.steps, checkpoint_step=trainer_step(plan, committed),
                           seconds_per_step=self.costs.step_s, expected_overhead_s=plan.expected_overhead_s)

    def restart_wasted(self, job: Job) -> bool:
        """The guard stops a spot job waiting for capacity after an interruption whose MaxRuntime left cannot hold
        a restart that trains a step (`restart_wasted`)."""
        return job.market is _SPOT and job.phase == "wait" and job.interrupted and not job.end and \
            restart_wasted_s(max_runtime_s=job.max_runtime_s, billed_s=job.billed, startup_s=self.costs.startup_s,
                             step_s=self.costs.step_s, save_s=self.costs.save_s)


def trainer_step(plan: SimPlan, committed_s: float) -> int:
    """The step of the checkpoint the trainer wrote after `committed_s` seconds of the plan's work, as the guard
    reads it. With the cap modelled the work's last JOB_END_S are the last job's end (`Run.segment_left`), billed
    past the trainer's exit, not trained: the planned steps span the rest. Spread over all of the work, each step
    was 0.586 s of a 0.537 s step on the qwen2 example, and a run at the cap its refusal named committed 867 steps
    in its first job where the planner's chain counted 947; the guard's chain then needed 190 s more work, not 153,
    and none of the runs finished (issue #26). NOTE: the policy's observation (`Run.observe`) still reads progress
    over all of the work, its end included: a deadline policy's thresholds were tuned on it."""
    end = JOB_END_S if plan.cap_usd is not None else 0.0
    return min(plan.steps, checkpoint_step(committed_s, max(plan.work_s - end, 1e-9), plan.steps))


_CAPS: dict[tuple[int, str], tuple[SimPlan, Cap]] = {}  # `Cap.of`'s, by the plan's id and the policy
FIRST = Observation(0.0, 0.0, _SPOT, _NO_JOB)  # what the first job's market is decided on


def execute(plan: SimPlan, trace: list, policy: str, checkpointing: str, *, horizon_s: float = INF,
            sentinel_lag_s: float = 0.0, sentinel_stop_s: float = SENTINEL_STOP_S, reach: bool = False) -> Run:
    """One trace run as the state machine runs it (see the module docstring); `run.tally` is its outcome. The
    policy is asked when `decision.ask_again` says the guard asks it. `sentinel_lag_s`, `sentinel_stop_s`: a
    sentinel's assumptions (the module docstring), for sensitivity checks. `reach`: record `Run.reach` (on
    `UNINTERRUPTED`: `execute_all`)."""
    run = Run(plan, checkpointing, trace, sentinel_lag_s=sentinel_lag_s, sentinel_stop_s=sentinel_stop_s,
              reach=-INF if reach else None)
    cap = Cap.of(plan, policy)
    first = decide(policy, plan, checkpointing, FIRST)
    market = _SPOT if first.action is _START_SPOT else _ON_DEMAND
    job = run.create(market, 0.0, cap and cap.first(plan, market))
    run.capped = run.capped or job.max_runtime_s < plan.max_runtime_s
    now, switch_to = 0.0, None
    asked_status, recheck_at, asked_seen = _NO_JOB, 0.0, False
    billed_at_poll, running_at_poll = 0.0, False
    while now < horizon_s:
        if switch_to is None:  # the polls before a change of status or the recheck ask nothing: skip them
            # (the status the policy was last asked at: a new job's first poll asks, even when it still waits;
            # a waiting sentinel: the polls before it can have instances)
            until = min(recheck_at, horizon_s)
            if run.sentinel_at is not None and not asked_seen:
                until = min(until, run.next_capacity(now))
            run.advance(job, until, unlike=asked_status)
            if cap is None:
                now = run.skip_polls(job.created, now, max(job.t, now), recheck_at)
            else:
                now = run.skip_polls_capped(cap, job, now, max(job.t, now), recheck_at, billed_at_poll,
                                            running_at_poll)
        else:  # stopping: the guard polls every poll_s until the job has ended
            now += plan.poll_s
        if not job.end and job.t < now - 1e-9:  # (`advance`'s own first test: most polls find the job there)
            run.advance(job, now)
        run.polls += 1
        billed_at_poll, running_at_poll = job.billed, not job.end and job.phase != "wait"
        if job.end == "completed":
            run.stop_sentinel(now)
            run.tally.t, run.tally.finished, run.tally.progress = job.t, True, plan.work_s
            run.tally.capped = run.capped
            run.bill_last_warm_pool()
            return run
        if switch_to is not None and not job.end:
            continue
        if job.end == "max_runtime" and job.max_runtime_s >= plan.max_runtime_s:
            break  # the guard ends a run whose job ran to the longest MaxRuntime unfinished
        if cap is not None and switch_to is None and cap.restart_wasted(job):
            run.stop(job, "stopped")  # the guard's stop, asking the policy nothing: the next job on this market
            switch_to, run.capped = job.market, True
            continue
        status = run.status(job)
        # the guard's spent money when the job ended: a live sentinel's bound before this poll stops it
        spent_end = run.ended_spent(cap, now) if cap is not None and job.end else 0.0
        seen = run.sentinel_at is not None and run.capacity_at(now)
        if ask_again(status, asked_status, now, recheck_at) or seen is not asked_seen:
            decision = decide(policy, plan, checkpointing, run.observe(job, now, spot_seen=seen))
            asked_status, recheck_at, asked_seen = status, now + decision.recheck_s, seen
            if decision.sentinel and not job.end and job.market is _ON_DEMAND:
                if cap is None or run.sentinel_at is not None or sentinel_room(
                        cap_usd=cap.cap_usd, spent_before_usd=run.guard_spent(cap, job, now, 0.0) - (
                            cap.costs.warm_pool_s * plan.on_demand_usd_per_h / 3600),
                        usd_per_s=cap.costs.usd_per_s, od_max_runtime_s=job.max_runtime_s,
                        od_warm_pool_s=cap.costs.warm_pool_s, longest_s=cap.costs.longest_s,
                        recheck_s=decision.recheck_s, poll_s=plan.poll_s) is not None:
                    run.start_sentinel(now)
                else:  # the cap leaves no room beside the on-demand job: the policy runs without one
                    run.capped = True
            else:
                run.stop_sentinel(now)
            if job.end and decision.action is _END:
                break
            if job.end:
                market = switch_to or STARTS.get(decision.action, job.market)
                limits = None
                if cap is not None:  # the guard's `_next_segment`: the chain from the newest checkpoint must fit
                    nxt = next_segment(cap_usd=cap.cap_usd, spent_usd=spent_end,
                                       work_s=cap.work_left(plan, run.committed), costs=cap.costs,
                                       spot=market is _SPOT, segment=len(run.jobs) + 1)
                    if not nxt.goes_on:
                        run.capped = run.over_budget = True
                        break
                    limits = cap.limits(plan, market, nxt.max_runtime_s, False)
                    run.capped = run.capped or limits is not None
                job = run.create(market, now, limits)
                switch_to, asked_status = None, _NO_JOB
                billed_at_poll, running_at_poll = 0.0, False
                continue
            if decision.action in (_TO_SPOT, _TO_ON_DEMAND):
                run.stop(job, "stopped")
                switch_to = STARTS[decision.action]
    run.stop_sentinel(now)
    run.tally.t, run.tally.progress = now, run.committed
    run.tally.capped, run.tally.over_budget = run.capped, run.over_budget
    run.bill_last_warm_pool()
    return run


UNINTERRUPTED = [(0.0, INF)]  # capacity from the start, never lost
REACH_MARGIN_S = 1.0  # past `Run.reach` by more than the roundings of a window's end less a time (< 1e-6 s)


def execute_all(plan: SimPlan, traces: list, policy: str, checkpointing: str) -> list[Tally]:
    """`execute(...).tally` on every trace, the runs that no interruption reaches executed once: a trace whose
    first window starts at 0 and ends past the uninterrupted run's `Run.reach` (by REACH_MARGIN_S) is read by
    the run exactly as `UNINTERRUPTED` is (`Run._reached` says where the window's end is read), so its tally is
    that run's (a copy each); where the run read no window (on-demand throughout), every trace's. At the
    estimate's rates many traces are such (the runs are hours, the traces' horizons days)."""
    shared = execute(plan, UNINTERRUPTED, policy, checkpointing, reach=True)
    past = shared.reach + REACH_MARGIN_S
    out = []
    for trace in traces:
        if past == -INF or (trace and trace[0][0] == 0.0 and trace[0][1] > past):
            tally = _new(Tally)
            tally.__dict__.update(shared.tally.__dict__)  # a copy (`dataclasses.replace` without its __init__)
            out.append(tally)
        else:
            out.append(execute(plan, trace, policy, checkpointing).tally)
    return out

