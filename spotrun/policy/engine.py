"""The mechanics every policy shares: what a plan costs and achieves while it runs on spot or on-demand.

`SimPlan` holds the planner's figures the simulator needs (see `plan_from_estimate` in spotrun/policy/choose.py).
`Tally` accumulates one trace's outcome; `segment` runs one training job (one CreateTrainingJob on the run's
checkpoint prefix) from a start until it finishes, its spot capacity ends (an interruption) or the policy stops
it. Within a job:
- every start bills `startup_s` (container pull, data download) and, once anything was saved, `restore_s`
  (the checkpoint's download) before the first step;
- periodic checkpointing saves after every `interval_s` of work, each save blocking for `save_s`;
- on an interruption the trainer saves on the notice (checkpointing "notice" or "both") when the checkpoint can
  leave inside it (`notice_ok`); the step in progress is lost. Otherwise the work since the last completed
  save is lost;
- a stop chosen by the policy (StopTrainingJob: SIGTERM, then 120 s) saves the same way and bills the save; with
  periodic saves only, the stop waits for the next completed save (the guard stops after a commit).
Spot capacity waits are not billed (SageMaker bills training time only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..planner.segments import ChainCosts

INF = math.inf


@dataclass(frozen=True)
class SimPlan:
    """What the simulator replays: one layout's figures from the planner."""

    work_s: float
    """Seconds of training the run needs (the planner's wall time less one startup)."""
    startup_s: float
    """Billed seconds before the first step of every job: container pull, data download."""
    restore_s: float
    """The checkpoint's download at a restart."""
    save_s: float
    """One checkpoint save (bytes / upload rate), blocking training."""
    interval_s: float
    """Work between periodic saves."""
    step_s: float
    """One optimizer step (lost when an interruption lands in it)."""
    notice_ok: bool
    """The checkpoint leaves within the stop notice."""
    spot_usd_per_h: float
    on_demand_usd_per_h: float
    max_wait_s: float = INF
    """MaxWaitTimeInSeconds: a spot job stops this long after its creation."""
    max_runtime_s: float = INF
    """MaxRuntimeInSeconds: a job stops after this much training time."""
    deadline_s: float | None = None
    od_check_s: float = 3600.0
    """How often a deadline-aware policy on on-demand considers returning to spot (the guard's segment)."""
    poll_s: float = 60.0
    """The cost guard's shortest wait between polls (PipelineSettings.poll_seconds)."""
    max_poll_s: float = 4 * 3600.0
    """The cost guard's longest wait between polls (PipelineSettings.max_poll_seconds)."""
    on_demand_fallback: bool = True
    """The run may go on-demand (compute.on_demand_fallback); without it, a spot job's MaxWait ends the run."""
    planned_steps: int = 0
    """The run's optimizer steps as the plan counts them (spotrun/pipeline/assembly.py `planned_steps`): the guard
    sees committed progress as whole committed steps x work_s / planned_steps (`steps`; 0: steps of step_s)."""
    cap_usd: float | None = None
    """The run's budget.max_usd where the execution models the cap as the cost guard holds it (each job's
    MaxRuntime what the cap leaves, the run ended where the chain from the newest checkpoint no longer fits:
    spotrun/policy/execution.py); None: no cap modelled (each job has `max_runtime_s`)."""
    chain_costs: ChainCosts | None = None
    """With `cap_usd`: the guard's figures for the chain of jobs (spotrun/pipeline/guard.py `chain_costs`, its
    `sentinel_room_s` 0: the execution sets it by the policy)."""
    expected_overhead_s: float = 0.0
    """With `cap_usd`: the estimate's expected interruptions' cost (the guard's pace: `work_left_s`)."""
    warm_pool_s: float = 0.0
    """An on-demand run's warm pool (compute.warm_pool_minutes): its last job's keep-alive bills after the run
    (`Run.bill_last_warm_pool` in spotrun/policy/execution.py)."""

    def __post_init__(self):
        if isinstance(self.chain_costs, dict):  # read back from the section's JSON (`SimPlan(**sim_plan)`)
            object.__setattr__(self, "chain_costs", ChainCosts(**self.chain_costs))
        if self.cap_usd is not None and (self.chain_costs is None or not self.cap_usd > 0):
            raise ValueError(f"cap_usd={self.cap_usd!r} is invalid: expected a number > 0 with chain_costs, or None")
        for name in ("work_s", "interval_s", "step_s", "spot_usd_per_h", "on_demand_usd_per_h", "od_check_s",
                     "poll_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)!r} is invalid: expected a number > 0")
        for name in ("startup_s", "restore_s", "save_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}={getattr(self, name)!r} is invalid: expected a number >= 0")
        if not self.max_poll_s >= self.poll_s:
            raise ValueError(f"max_poll_s={self.max_poll_s!r} is invalid: expected a number >= poll_s")
        if not (isinstance(self.planned_steps, int) and self.planned_steps >= 0):
            raise ValueError(f"planned_steps={self.planned_steps!r} is invalid: expected an integer >= 0")
        if self.deadline_s is not None and not self.deadline_s > 0:
            raise ValueError(f"deadline_s={self.deadline_s!r} is invalid: expected a number > 0 or None")

    @property
    def steps(self) -> int:
        """The steps committed progress is counted in: `planned_steps`, else the work in steps of step_s."""
        return self.planned_steps or max(1, math.ceil(self.work_s / self.step_s - 1e-9))

    @property
    def changeover_s(self) -> float:
        """A switch between spot and on-demand: a save on SIGTERM, then a new job's startup and restore."""
        return self.save_s + self.startup_s + self.restore_s

    def default_checkpointing(self) -> str:
        return "both" if self.notice_ok else "periodic"


@dataclass
class Tally:
    """One trace's run: where it is and what it cost so far."""

    t: float = 0.0
    """Wall seconds since the run's first job was created."""
    progress: float = 0.0
    """Committed work (seconds of training the newest checkpoint holds)."""
    lost_s: float = 0.0
    """Work done and lost to interruptions (redone later)."""
    lost_wall_s: float = 0.0
    """Wall time since the last commit at each interruption (work and saves in progress), summed."""
    spot_s: float = 0.0
    od_s: float = 0.0
    interruptions: int = 0
    switches: int = 0
    finished: bool = False
    capped: bool = False
    """The cost cap shaped the run as the guard holds it (spotrun/policy/execution.py `Cap`); without, the run is
    the one executed with no cap modelled."""
    over_budget: bool = False
    """The guard ended the run unfinished at the cap (OverBudget: no chain from its checkpoint fits what is left);
    an unfinished run without it ended at MaxWait with no capacity (no on-demand fallback) or at MaxRuntime."""


def periodic_interval(plan: SimPlan, checkpointing: str) -> float:
    return plan.interval_s if checkpointing in ("periodic", "both") else INF


def notice_saves(plan: SimPlan, checkpointing: str) -> bool:
    return plan.notice_ok and checkpointing in ("notice", "both")


def ready_after(plan: SimPlan, tally: Tally) -> float:
    return plan.startup_s + (plan.restore_s if tally.progress > 0 else 0.0)


def progress_at(plan: SimPlan, checkpointing: str, p0: float, ready: float, t: float) -> float:
    """Work done by time t in a job that began training at `ready` from p0 (all of it, saved or not)."""
    if t <= ready:
        return p0
    interval = periodic_interval(plan, checkpointing)
    elapsed = t - ready
    if interval == INF:
        return min(plan.work_s, p0 + elapsed)
    cycle = interval + plan.save_s
    full = math.floor(elapsed / cycle)
    return min(plan.work_s, p0 + full * interval + min(elapsed - full * cycle, interval))


def segment(plan: SimPlan, tally: Tally, start: float, capacity_end: float, stop_at: float, spot: bool,
            checkpointing: str) -> bool:
    """One job from `start` until it finishes, its capacity ends (interrupted) or `stop_at` (stopped by the
    policy). Updates the tally; returns whether the run finished."""
    end = min(capacity_end, stop_at)
    ready = start + ready_after(plan, tally)
    interval, notice = periodic_interval(plan, checkpointing), notice_saves(plan, checkpointing)
    s, remaining = plan.save_s, plan.work_s - tally.progress
    billed_end = end
    if ready < end:
        saves = math.ceil(remaining / interval) - 1 if interval < INF else 0
        finish = ready + remaining + saves * s
        if finish <= end:
            _bill(tally, spot, finish - start)
            tally.t, tally.progress, tally.finished = finish, plan.work_s, True
            return True
        cycle = interval + s
        elapsed = end - ready
        full = math.floor(elapsed / cycle) if interval < INF else 0
        pos = elapsed - full * cycle if full else elapsed
        stopped = stop_at < capacity_end
        if stopped and not notice and interval < INF:
            next_commit = ready + (full + 1) * cycle
            if next_commit >= finish or next_commit > capacity_end:  # finishing or the reclaim comes first
                return segment(plan, tally, start, capacity_end, INF, spot, checkpointing)
            end = billed_end = next_commit  # the guard stops after the next completed save
            full, pos = full + 1, 0.0
        done = min(pos, interval)
        saved = done - math.fmod(done, plan.step_s) if notice else 0.0
        tally.progress += (full * interval if full else 0.0) + saved
        tally.lost_s += done - saved
        if stopped:
            billed_end = end + (s if notice and saved > 0 else 0.0)
        else:
            tally.lost_wall_s += pos - saved
    _bill(tally, spot, billed_end - start)
    tally.t = billed_end
    if end >= capacity_end:
        tally.interruptions += 1
    return False


def _bill(tally: Tally, spot: bool, seconds: float) -> None:
    if spot:
        tally.spot_s += seconds
    else:
        tally.od_s += seconds


def window_at(trace: list, t: float, i: int = 0) -> int:
    """Index of the first window (from i) that ends after t."""
    while trace[i][1] <= t:
        i += 1
    return i
