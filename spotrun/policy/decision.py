"""The one spot-policy decision: what the cost guard executes at every poll and what the simulator replays.

A policy is a pure function `Rule(plan, checkpointing, Observation) -> Decision` (stdlib only: the guard Lambda
imports it). The cost guard (spotrun/pipeline/guard.py) calls `decide` at every poll of the training job and at a job's
end; the simulator (spotrun/policy/execution.py) calls the SAME `decide` at the SAME decision points, with the
same view of the run:

- `Observation` is all a decision may read: seconds since the execution started, the committed progress (the
  newest committed checkpoint's step x the planned step time: it lags the work by up to a checkpoint interval and
  a save), the seconds the job has trained since that commit (its status transitions and the checkpoint's
  LastModified: with saves on the notice, a stop keeps that work too), the current job's market and status
  (running / waiting for capacity / no job: it ended), the job's age (MaxWait counts from its creation), what
  was billed so far, and whether the last job ended at MaxWait without capacity. Spot availability is NOT
  observable while no spot job exists: on on-demand, "is spot there?" is answered only by starting a spot job
  (`Action.TO_SPOT`) and seeing it run or wait.
- `Decision` is an `Action` and `recheck_s`, the longest the policy may go unasked. The guard's next poll is
  `poll_wait(...)`: its own schedule (5% of the job's age, between the plan's poll_seconds and max_poll_seconds)
  cut to the time left to the recheck (never below poll_seconds). A policy that needs a decision at a given time
  asks for it here; the history quota's cost of its polls (9 events each) is the policy's cost to justify.
- When the guard asks (`ask_again`): at a job's end, at the first poll that sees the job's status changed since
  the last decision (running <-> waiting for capacity), and at the first poll at or after the recheck time. In
  between, the last decision stands (KEEP): a policy must not depend on being asked more often than that.
- The constants: the estimate's `SimPlan` (work, startup, restore, save, interval, prices, deadline, MaxWait,
  the guard's poll bounds) and the chosen checkpointing, from the policy section the plan carries.

Actions, and what the guard does for each:
- `KEEP`: let the job run (or wait for capacity; a spot job's wait is unbilled).
- `TO_ON_DEMAND`: stop the spot job (StopTrainingJob: SIGTERM, the trainer saves, up to 120 s billed), then the
  next job on-demand on the same checkpoints. `TO_SPOT`: the same from an on-demand job to a spot job.
- `START_SPOT` / `START_ON_DEMAND`: with no job (the last one ended: a segment's end, MaxWait, a stop), the next
  job's market. Waiting for spot without a job is `START_SPOT`: a spot job that finds no capacity waits in
  SageMaker's Starting status, unbilled, exactly as waiting would; the policy sees it as `status=WAITING`.
The run's contract comes over any policy, in `decide` itself: a run without on-demand fallback
(`SimPlan.on_demand_fallback`) never goes on-demand (a policy's move there is KEEP, or `END` after MaxWait
without capacity). The guard alone keeps the cost cap's rules (a stop the cap asked for keeps the market it had).

Adding a policy: write a `Rule`, register it in `RULES` under its name; the estimate's candidates are the names in
`RULES` (spotrun/policy/choose.py), so a policy the guard cannot execute cannot be offered.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from ..seams import SpotPolicy
from .engine import INF, SimPlan, periodic_interval

POLL_GROWTH = 0.05  # the guard's next wait as a fraction of the job's age (spotrun/pipeline/guard.py)
HYSTERESIS_CHANGEOVERS = 4.0  # lead (in changeovers) needed to leave on-demand for spot
RESERVE_CHANGEOVERS = 2.0  # the line aims this many changeovers before the deadline
OD_RECHECK_S = 3600.0  # an on-demand job ahead of a deadline policy is asked at least this often


class Market(str, Enum):
    SPOT = "spot"
    ON_DEMAND = "on_demand"


class JobStatus(str, Enum):
    RUNNING = "running"  # instances billed: starting up, training, saving
    WAITING = "waiting"  # a spot job without capacity: Starting/Interrupted before its instances come (unbilled)
    NONE = "none"  # no job: the last one ended (a segment's end, MaxWait, a stop); the next one is to be chosen


class Action(str, Enum):
    KEEP = "keep"
    TO_ON_DEMAND = "to_on_demand"
    TO_SPOT = "to_spot"
    START_SPOT = "start_spot"
    START_ON_DEMAND = "start_on_demand"
    END = "end"  # no job and none allowed: the run ends unfinished (MaxWait without capacity, no fallback)


# The members as module names: an Enum member looked up on its class costs about 0.2 us in Python 3.11, and the
# simulator makes these tests millions of times per estimate (the same objects: `is` holds as before).
_SPOT, _ON_DEMAND = Market.SPOT, Market.ON_DEMAND
_RUNNING, _WAITING, _NO_JOB = JobStatus.RUNNING, JobStatus.WAITING, JobStatus.NONE
_KEEP, _TO_ON_DEMAND, _TO_SPOT, _END = Action.KEEP, Action.TO_ON_DEMAND, Action.TO_SPOT, Action.END
_START_SPOT, _START_ON_DEMAND = Action.START_SPOT, Action.START_ON_DEMAND


@dataclass(frozen=True)
class Observation:
    """What the guard can see at a decision point."""

    elapsed_s: float
    """Seconds since the execution started."""
    committed_s: float
    """Work in the newest committed checkpoint, in seconds of training (step / planned steps x the work:
    `committed_progress_s`)."""
    market: Market
    """The current job's market; with status NONE, the market of the job that just ended."""
    status: JobStatus
    job_age_s: float = 0.0
    """Seconds since the current job's creation (MaxWait counts from it); 0 with status NONE."""
    spent_usd: float = 0.0
    """Exact bills of the ended jobs plus the running job's bound (its billed seconds at on-demand rates)."""
    max_wait_exceeded: bool = False
    """With status NONE: the job ended at MaxWait without spot capacity."""
    training_s: float = 0.0
    """Seconds the current job has been training (SecondaryStatus Training) since the newest commit, or since it
    entered Training if later; 0 when it is not training. Work a save on the notice would keep."""
    spot_seen: bool = False
    """A sentinel (a spot job of the run's instance type and count kept waiting beside an on-demand job, asked for
    by `Decision.sentinel`) has instances at this poll (SecondaryStatus Downloading or Training): spot capacity is
    there now. False without a sentinel."""


def checkpoint_step(committed_s: float, work_s: float, planned_steps: int) -> int:
    """The step of a checkpoint holding `committed_s` seconds of the work: the whole planned steps in it (the
    trainer commits whole steps; the simulator's work is in seconds)."""
    return int(committed_s / (work_s / max(1, planned_steps)))


def committed_progress_s(step: int | None, work_s: float, planned_steps: int) -> float:
    """`Observation.committed_s` as the guard reads it: the newest committed checkpoint's step x the planned step
    time (work_s / planned_steps), at most the work. The simulator observes its commits through the same two
    functions (spotrun/policy/execution.py), so a policy's threshold sees the same number on both sides."""
    return min(1.0, (step or 0) / max(1, planned_steps)) * work_s


@dataclass(frozen=True)
class Decision:
    action: Action
    recheck_s: float = INF
    """The longest the policy may go unasked (the guard polls sooner on its own schedule)."""
    sentinel: bool = False
    """Keep a sentinel waiting for spot capacity while this decision stands (on an on-demand job): a spot job of
    the same instance type and count, unbilled while it waits, billed at spot rates from when it gets instances
    until it is stopped. Only `SentinelGreedy` asks for one; the guard creates, describes and stops it
    (spotrun/pipeline/guard.py)."""


Rule = Callable[[SimPlan, str, Observation], Decision]


@functools.lru_cache(maxsize=16)
def poll_grid(poll_s: float, max_poll_s: float) -> tuple[float, ...]:
    """The guard's poll ages (seconds since the job's creation) while they grow: each wait 5% of the age, between
    poll_s and max_poll_s; past the last, every max_poll_s."""
    ages, age = [0.0], 0.0
    while POLL_GROWTH * age < max_poll_s:
        age += float(int(max(poll_s, POLL_GROWTH * age)))
        ages.append(age)
    return tuple(ages)


def poll_wait(job_age_s: float, recheck_s: float, *, poll_s: float, max_poll_s: float) -> float:
    """Seconds to the next poll: the next age on the guard's grid (`poll_grid`) at least poll_s away, or the
    policy's recheck if sooner (never below poll_s). The guard also cuts it to the time the cost cap leaves
    (spotrun/pipeline/guard.py)."""
    return wait_on_grid(poll_grid(poll_s, max_poll_s), job_age_s, recheck_s, poll_s, max_poll_s)


def wait_on_grid(grid: tuple[float, ...], job_age_s: float, recheck_s: float, poll_s: float,
                 max_poll_s: float) -> float:
    """`poll_wait` with the grid given (`poll_grid(poll_s, max_poll_s)`): for a loop over many polls."""
    age_s = job_age_s + poll_s
    if age_s <= grid[-1]:
        at = grid[bisect.bisect_left(grid, age_s - 1e-9)]
    else:
        at = grid[-1] + math.ceil((age_s - grid[-1]) / max_poll_s - 1e-9) * max_poll_s
    return min(at - job_age_s, INF if recheck_s == INF else float(max(poll_s, math.ceil(recheck_s - 1e-9))))


def first_poll_at(created: float, last_poll: float, target: float, recheck_at: float, *, poll_s: float,
                  max_poll_s: float) -> tuple[float, int]:
    """(the first poll at or after `target` <= recheck_at, the polls up to it) after the poll at `last_poll`,
    `poll_wait`'s sequence in one step (the simulator's). Every poll before the recheck is on the grid: from a
    poll whose next grid age is before the recheck, the grid's poll comes first. So the recheck can only cut in
    at the last poll before the grid's poll at or after `target`, and from there as `poll_wait` cuts it: at
    least poll_s later (a recheck less than poll_s after a grid poll waits for the poll poll_s later, not the
    recheck's time counted from an earlier poll)."""
    # the grid's index at or after an age, twice, written out (no calls: the simulator takes this step about a
    # million times per estimate)
    grid = poll_grid(poll_s, max_poll_s)
    last, n = grid[-1], len(grid)
    soonest = last_poll - created + poll_s
    if soonest <= last:
        i0 = bisect.bisect_left(grid, soonest - 1e-9)
    else:
        i0 = n - 1 + math.ceil((soonest - last) / max_poll_s - 1e-9)
    age = max(soonest, target - created)
    if age <= last:
        i = bisect.bisect_left(grid, age - 1e-9)
        at = grid[i]
    else:
        k = math.ceil((age - last) / max_poll_s - 1e-9)
        at, i = last + k * max_poll_s, n - 1 + k
    if i == i0:
        before = last_poll
    else:
        before = created + (grid[i - 1] if i - 1 < n else last + (i - n) * max_poll_s)
    wait = recheck_at - before
    wait = INF if wait == INF else float(max(poll_s, math.ceil(wait - 1e-9)))
    return min(created + at, before + wait), i - i0 + 1


def ask_again(status: JobStatus, asked_status: JobStatus, now_s: float, recheck_at_s: float) -> bool:
    """Whether the guard asks the policy at this poll (see the module docstring)."""
    return status is _NO_JOB or status is not asked_status or now_s >= recheck_at_s - 1e-6


# ---- the deadline arithmetic every deadline-aware rule shares -------------------------------------------------


def switch_s(plan: SimPlan) -> float:
    """What a change of market costs as the guard executes it: the changeover (a save, a startup, a restore) and
    two polls (the stop is noticed at a poll, the next job's status at the next)."""
    return plan.changeover_s + 2 * plan.poll_s


def risk_s(plan: SimPlan, ck: str) -> float:
    """What one more interruption or switch can cost in slack: a switch as the guard executes it, and the work
    since the last commit."""
    at_risk = plan.step_s if plan.notice_ok and ck != "periodic" else \
        min(periodic_interval(plan, ck) + plan.save_s, plan.work_s)
    return switch_s(plan) + at_risk


def od_finish_s(plan: SimPlan, ck: str, progress: float) -> float:
    """How long an on-demand job started now takes to finish: startup, restore, the work and its saves."""
    remaining = max(0.0, plan.work_s - progress)
    interval = periodic_interval(plan, ck)
    saves = max(0, math.ceil(remaining / interval) - 1) if interval < INF else 0
    return plan.startup_s + plan.restore_s + remaining + saves * plan.save_s


def progress_s(plan: SimPlan, ck: str, obs: Observation) -> float:
    """The work a stop now would keep: the committed work, plus what the job trained since when it saves on the
    notice (less one save: the time may include a periodic save's)."""
    if plan.notice_ok and ck != "periodic":
        return min(plan.work_s, obs.committed_s + max(0.0, obs.training_s - plan.save_s))
    return obs.committed_s


def slack_s(plan: SimPlan, ck: str, obs: Observation) -> float:
    """Deadline minus when an on-demand job started now would finish."""
    return plan.deadline_s - obs.elapsed_s - od_finish_s(plan, ck, progress_s(plan, ck, obs))


def line_target_s(plan: SimPlan) -> float:
    return max(plan.deadline_s - RESERVE_CHANGEOVERS * switch_s(plan), plan.deadline_s / 2)


class Figures:
    """The deadline arithmetic above for one plan and checkpointing, its constants computed once: the simulator
    asks a rule about a million times per estimate on one plan (the same values, in the same order of operations,
    as the functions: tests/spotrun/test_simulate.py checks them against each other)."""

    __slots__ = ("plan", "deadline", "work", "save", "ready", "interval", "notice", "switch", "risk", "line_target",
                 "reserves")

    def __init__(self, plan: SimPlan, ck: str):
        self.plan, self.deadline, self.work, self.save = plan, plan.deadline_s, plan.work_s, plan.save_s
        self.ready = plan.startup_s + plan.restore_s
        self.interval, self.notice = periodic_interval(plan, ck), plan.notice_ok and ck != "periodic"
        self.switch, self.risk = switch_s(plan), risk_s(plan, ck)
        self.line_target = None if plan.deadline_s is None else line_target_s(plan)
        self.reserves: dict[float, float] = {}  # a reserve rule's reserve by its fraction

    def od_finish(self, progress: float) -> float:
        """`od_finish_s`."""
        remaining = max(0.0, self.work - progress)
        saves = max(0, math.ceil(remaining / self.interval) - 1) if self.interval < INF else 0
        return self.ready + remaining + saves * self.save

    def progress(self, obs: Observation) -> float:
        """`progress_s`."""
        if self.notice:
            return min(self.work, obs.committed_s + max(0.0, obs.training_s - self.save))
        return obs.committed_s


_FIGURES: dict[tuple[int, str], Figures] = {}


def figures(plan: SimPlan, ck: str) -> Figures:
    """The plan's `Figures` (kept for the last few plans: a figure holds its plan, so its id is not reused)."""
    f = _FIGURES.get((id(plan), ck))
    if f is None or f.plan is not plan:
        if len(_FIGURES) >= 64:
            _FIGURES.clear()
        f = _FIGURES[id(plan), ck] = Figures(plan, ck)
    return f


def _half(seconds: float) -> float:
    """Ask again halfway to a threshold: polls close in on it geometrically, a poll_s apart at the end."""
    return max(0.0, seconds) / 2


def _to(market: Market, obs: Observation, recheck_s: float = INF) -> Decision:
    """The action that puts the run on `market` from where it is."""
    if obs.status is _NO_JOB:
        return Decision(_START_SPOT if market is _SPOT else _START_ON_DEMAND, recheck_s)
    if obs.market is market:
        return Decision(_KEEP, recheck_s)
    return Decision(_TO_SPOT if market is _SPOT else _TO_ON_DEMAND, recheck_s)


@dataclass(frozen=True)
class DeadlineRule:
    """Spot while it runs; without capacity, wait until `on_demand_at`; on on-demand, back to spot when
    `back_to_spot`. A safety net moves to on-demand when the slack falls to the risk.

    kind "line": Uniform Progress ("Can't Be Late", NSDI 2024): on-demand once committed progress falls behind
    the straight line to the deadline, back to spot when it leads the line by the hysteresis. "reserve": wait
    while the slack is above a reserve (`reserve_fraction` of the slack the run starts with), back to spot
    whenever the slack pays a changeover plus the hysteresis. "greedy": spot until the safety net, then
    on-demand to the end."""

    kind: str
    reserve_fraction: float = 0.5
    hysteresis: float = HYSTERESIS_CHANGEOVERS
    """Changeovers of lead needed to leave on-demand for spot (0: as soon as the run is ahead)."""

    def on_demand_at(self, plan: SimPlan, ck: str, progress: float) -> float:
        """When, waiting for capacity with this progress, the run moves to on-demand (before the safety net)."""
        return self._on_demand_at(figures(plan, ck), progress)

    def _on_demand_at(self, f: Figures, progress: float) -> float:
        if self.kind == "line":
            return progress / f.work * f.line_target
        if self.kind == "reserve":
            reserve = f.reserves.get(self.reserve_fraction)
            if reserve is None:  # a share of the slack the run starts with, above the risk
                start = f.deadline - f.od_finish(0.0) - f.risk
                reserve = f.reserves[self.reserve_fraction] = f.risk + self.reserve_fraction * max(0.0, start)
            return f.deadline - f.od_finish(progress) - reserve
        return INF

    def back_to_spot(self, plan: SimPlan, ck: str, obs: Observation) -> bool:
        """On on-demand: return to spot (blind: a spot job finds out whether there is capacity)? Only when, after
        the changeover, the run is still the hysteresis short of the point where it would come back to on-demand
        (otherwise a spot job without capacity flaps back at once, a changeover each way)."""
        f = figures(plan, ck)
        return self._back_to_spot(f, obs, f.progress(obs))

    def _back_to_spot(self, f: Figures, obs: Observation, progress: float) -> bool:
        if self.kind == "greedy":
            return False
        hysteresis = self.hysteresis * f.switch
        ahead_s = obs.elapsed_s + f.switch  # after the switch: the same progress, its slack
        if f.deadline - ahead_s - f.od_finish(progress) <= f.risk + hysteresis:
            return False
        return ahead_s + hysteresis <= self._on_demand_at(f, progress)

    def __call__(self, plan: SimPlan, ck: str, obs: Observation) -> Decision:
        if plan.deadline_s is None:
            return _to(_SPOT, obs)
        f = figures(plan, ck)
        progress = f.progress(obs)
        slack, risk = f.deadline - obs.elapsed_s - f.od_finish(progress), f.risk  # slack_s, risk_s
        if obs.market is _ON_DEMAND or slack <= risk or obs.max_wait_exceeded:
            if slack > risk and self._back_to_spot(f, obs, progress):
                return _to(_SPOT, obs, _half(slack - risk))
            return _to(_ON_DEMAND, obs, OD_RECHECK_S if self.kind != "greedy" else INF)
        if obs.status is _WAITING:
            od_at = min(self._on_demand_at(f, progress), obs.elapsed_s + slack - risk)
            if obs.elapsed_s >= od_at:
                return _to(_ON_DEMAND, obs, OD_RECHECK_S)
            return Decision(_KEEP, _half(od_at - obs.elapsed_s) + plan.poll_s)
        # on spot, running (or about to start): its startup and saves spend slack; an interruption could cost
        # the risk at any moment, so ask again halfway to the safety net
        return _to(_SPOT, obs, _half(slack - risk) + plan.poll_s)


@dataclass(frozen=True)
class ProbingGreedy:
    """Greedy with a reserve and blind probes (chosen on public traces: docs/spot-policy.md, "Policies compared").

    Spot while it runs; without capacity, wait until the slack is down to the safety net's risk plus the reserve,
    then on-demand. The reserve is `reserve` changeovers at the start and shrinks with the share of the work left
    (to no less than `keep` + 1 changeovers): slack kept for probes is worth what they can still move to spot.
    Unlike greedy, on-demand is not for good: after `stint_s` on an on-demand job, while the slack would still
    hold the risk plus `keep` changeovers after one more changeover, stop it and try spot (blind: the guard
    cannot see spot capacity from an on-demand job). A spot job that finds no capacity waits while the slack is
    above the reserve (a probe late in the run, when the reserve has shrunk, waits like greedy), then goes back
    to on-demand: a failed probe costs what it waited, one changeover of slack and an on-demand restart, and the
    reserve bounds how many the run can try. Deterministic."""

    reserve: float
    """Changeovers of slack above the risk kept when the run moves to on-demand, at the start (x the share of the
    work left later)."""
    stint_s: float
    """Seconds on an on-demand job before it probes spot."""
    keep: float = 1.0
    """Changeovers of slack above the risk a probe must leave."""

    def __call__(self, plan: SimPlan, ck: str, obs: Observation) -> Decision:
        if plan.deadline_s is None:
            return _to(_SPOT, obs)
        slack, risk, change = slack_s(plan, ck, obs), risk_s(plan, ck), plan.changeover_s
        if slack <= risk or obs.max_wait_exceeded:
            return _to(_ON_DEMAND, obs)
        can_probe = slack - change > risk + self.keep * change
        if obs.status is _NO_JOB:  # a job ended (a segment, a stop for a probe): spot if a probe fits
            return Decision(_START_SPOT, plan.poll_s) if can_probe else Decision(_START_ON_DEMAND)
        if obs.market is _ON_DEMAND:
            if not can_probe:
                return Decision(_KEEP)
            if obs.job_age_s >= self.stint_s:
                return Decision(_TO_SPOT, plan.poll_s)
            return Decision(_KEEP, self.stint_s - obs.job_age_s)
        left = max(0.0, plan.work_s - progress_s(plan, ck, obs)) / plan.work_s
        floor = risk + max(self.keep + 1, self.reserve * left) * change
        if obs.status is _WAITING:
            if slack <= floor:
                return Decision(_TO_ON_DEMAND)
            return Decision(_KEEP, _half(slack - floor) + plan.poll_s)
        return Decision(_KEEP, _half(slack - risk) + plan.poll_s)


SENTINEL_STOP_S = 120.0  # a sentinel stopped with instances: billed up to the stop's 120 s (SIGTERM allowance)


@dataclass(frozen=True)
class SentinelGreedy:
    """`probing_greedy` whose returns from on-demand are not blind (docs/spot-policy.md, "Closing the gap to the
    optimum"); the guard executes its sentinel (spotrun/pipeline/guard.py).

    After `stint_s` on an on-demand job, while one more changeover still leaves the risk plus `keep` changeovers,
    it keeps a sentinel (`Decision.sentinel`): a spot job of the run's instance type and count waiting for
    capacity beside the on-demand job, and asks again every `sentinel_poll_s`. At the first poll that sees the
    sentinel with instances (`Observation.spot_seen`) it goes to spot (`TO_SPOT`: the on-demand job stops with a
    save, the sentinel is stopped, a spot job starts and may find the capacity gone). Elsewhere it is
    `probing_greedy` without the blind probe: spot while it runs, wait until the slack is down to the shrinking
    reserve, then on-demand."""

    reserve: float
    stint_s: float
    """Seconds on an on-demand job before the sentinel is created."""
    sentinel_poll_s: float
    """The longest the guard waits between looks at the sentinel."""
    keep: float = 1.0

    def __call__(self, plan: SimPlan, ck: str, obs: Observation) -> Decision:
        decision = ProbingGreedy(self.reserve, INF, self.keep)(plan, ck, obs)
        if obs.market is not _ON_DEMAND or obs.status is not _RUNNING or \
                decision.action is not _KEEP:
            return decision
        if slack_s(plan, ck, obs) - plan.changeover_s <= risk_s(plan, ck) + self.keep * plan.changeover_s:
            return decision  # no switch fits: on-demand to the end, no sentinel
        if obs.job_age_s < self.stint_s:
            return Decision(_KEEP, self.stint_s - obs.job_age_s)
        if obs.spot_seen:
            return Decision(_TO_SPOT, plan.poll_s)
        return Decision(_KEEP, self.sentinel_poll_s, sentinel=True)


def sentinel_room_s(policy: str, poll_s: float) -> float:
    """Seconds at on-demand rates the cap keeps beside every on-demand job of a run whose policy keeps sentinels
    (0 for the others): what the guard's sentinel needs to hold its instances from the look that finds them
    (`sentinel_poll_s`, plus a poll of the guard's grid) to the end of its stop (spotrun/pipeline/guard.py
    `sentinel_limits`), and a second for the roundings. The on-demand job's MaxRuntime is shorter by it
    (spotrun/planner/segments.py `plan_chain`), and the cap to set is higher by it: without it, at the cap the
    estimate named, the on-demand job's MaxRuntime took all the cap left and the run ran without its sentinel."""
    rule = RULES.get(policy)
    if not isinstance(rule, SentinelGreedy):
        return 0.0
    return rule.sentinel_poll_s + poll_s + SENTINEL_STOP_S + 1.0


def on_demand_rule(plan: SimPlan, ck: str, obs: Observation) -> Decision:
    return _to(_ON_DEMAND, obs)


def maxwait_fallback_rule(plan: SimPlan, ck: str, obs: Observation) -> Decision:
    """Spot until a job ends at MaxWait without capacity, then on-demand to the end. (Spot without a fallback is
    this rule on a run without `on_demand_fallback`: every spot job has a MaxWait.)"""
    if obs.max_wait_exceeded or obs.market is _ON_DEMAND:
        return _to(_ON_DEMAND, obs)
    return _to(_SPOT, obs)


UNIFORM_PROGRESS = DeadlineRule("line")
GREEDY = DeadlineRule("greedy")
RULES: dict[str, Rule] = {
    "on_demand": on_demand_rule, "maxwait_fallback": maxwait_fallback_rule,
    "uniform_progress": UNIFORM_PROGRESS, "deadline_greedy": GREEDY,
    "slack_reserve_5": DeadlineRule("reserve", 0.05), "slack_reserve_10": DeadlineRule("reserve", 0.10),
    "slack_reserve_25": DeadlineRule("reserve", 0.25),
    # chosen on the choose-set windows of the public traces (benchmarks/policy_bench.py, docs/spot-policy.md):
    # 32 changeovers of reserve at the start, a probe after 6 h on on-demand
    "probing_greedy": ProbingGreedy(reserve=32.0, stint_s=6 * 3600.0),
    # probing_greedy's reserve with a sentinel after 1 h on on-demand, looked at every 10 min (chosen on the
    # choose-set windows: benchmarks/policy_bench.py SENTINEL_STINT_S, SENTINEL_POLL_S)
    "probing_sentinel": SentinelGreedy(reserve=32.0, stint_s=3600.0, sentinel_poll_s=600.0),
}
DEADLINE_RULES = ("uniform_progress", "deadline_greedy", "slack_reserve_5", "slack_reserve_10", "slack_reserve_25",
                  "probing_greedy", "probing_sentinel")


def sentinel_settings(policy: str) -> dict:
    """Whether the cost guard runs a sentinel for `policy` (a rule of RULES), and its settings: `{"used": false}`,
    or `{"used": true, "stint_s": ..., "poll_s": ...}` (seconds on an on-demand job before it is created, the
    longest wait between looks at it). The estimate's policy section carries it (`SpotPolicy.sentinel`)."""
    rule = RULES.get(policy)
    if not isinstance(rule, SentinelGreedy):
        return {"used": False}
    return {"used": True, "stint_s": rule.stint_s, "poll_s": rule.sentinel_poll_s}


def decide(policy: str, plan: SimPlan, checkpointing: str, obs: Observation) -> Decision:
    """The named policy's decision under the run's contract (see the module docstring); ValueError naming the
    policy when it is not one of RULES."""
    if policy not in RULES:
        raise ValueError(f"policy={policy!r} is invalid: expected one of {', '.join(RULES)}")
    decision = RULES[policy](plan, checkpointing, obs)
    if plan.on_demand_fallback or decision.action not in (_TO_ON_DEMAND, _START_ON_DEMAND):
        return decision
    if obs.status is not _NO_JOB:
        return Decision(_KEEP, decision.recheck_s)
    return Decision(_END if obs.max_wait_exceeded else _START_SPOT, decision.recheck_s)


def starts_on_spot(section: SpotPolicy) -> bool:
    """The first job's market: the policy's decision before anything ran (the plan's `spot`; the simulator's
    first job)."""
    first = decide_from_section(section, Observation(0.0, 0.0, _SPOT, _NO_JOB))
    return first.action is _START_SPOT


def decide_from_section(section: SpotPolicy, obs: Observation) -> Decision:
    """`decide` from the estimate's policy section as the plan carries it (`policy`, `checkpointing`,
    `sim_plan`): the guard's entry."""
    return decide(section.policy, SimPlan(**section.sim_plan), section.checkpointing, obs)
