"""The cost guard's rules: what the state machine does next at every poll of the training job, and the bills.

The Lambda (spotrun/handlers/cost_guard.py) describes the job, reads its tags and lists the run's committed
checkpoints (one Lambda task per poll keeps the loop at a few history events); `decide` here is the pure rule:
it returns the new guard (spotrun.seams.Guard), whose `action` is a seams.GuardAction. `spotrun status` runs the
same arithmetic on a job as it is now; the cost report's registry metadata (`registry_metadata`) is the same on
AWS and in the local registry of `spotrun local`.

What holds the cap is not the guard: every job's MaxRuntimeInSeconds is what the cap still allows at
on-demand rates, and SageMaker enforces it (spotrun/planner/segments.py). The guard keeps the books and chains
segments:

- a finished job costs BillableTimeInSeconds x on-demand price x instance count (BillableTimeInSeconds is already
  the spot-adjusted time: SageMaker's savings are `1 - billable / training`), plus its warm pool's keep-alive at
  on-demand rates (a warm pool bills after the job ends); this is exact, and it is what the next segment's
  MaxRuntime is computed from;
- while a job runs SageMaker reports no billable time: the bound is the seconds the job spent in billed secondary
  statuses (SecondaryStatusTransitions; not the waits for capacity: Starting, Interrupted, ...) x the on-demand
  price. If that bound plus a poll and a stop would pass the cap and the job's own MaxRuntime does not keep it
  under the cap (a job created with a wrong limit), the guard stops the job: a second line behind MaxRuntime;
- a spot job waiting for capacity after an interruption whose MaxRuntime left cannot hold a restart that trains a
  step is stopped while it bills nothing (`restart_wasted`): the next segment gets the room its exact bill leaves;
- a job that ended without finishing the run (its segment's time was up, MaxRuntime, the guard's stop) is
  followed by the next segment while the chain from the newest committed checkpoint still finishes under the cap
  at the expected bill (`_next_segment`, spotrun/planner/segments.py `plan_chain`); spot or
  on-demand for it is decided in one place, `next_capacity` (after MaxWait without spot capacity: on-demand when
  the run allows a fallback, never after a stop the cap requested);
- the estimate's chosen spot policy is executed here through the one decision function the simulator replays
  (spotrun/policy/decision.py: `decide`, pure), only mapped to actions: asked at a job's end, when the job's
  status changed and at the policy's recheck (`ask_again`), its TO_ON_DEMAND / TO_SPOT stop the job
  (`switch_requested`, `switch_to_spot`) and the next segment runs on that market; at a job's end its START_*
  picks the next segment's market;
- a sentinel (the policy's `Decision.sentinel`: spotrun/policy/decision.py `SentinelGreedy`) is a spot job of
  the run's instance type and count that sleeps (`sentinel_request`: it trains nothing and writes nothing the run
  reads), created beside the on-demand job when the policy asks for one and stopped when it no longer does (or
  the on-demand job ends, or the guard stops it). The guard describes it at every poll; with instances
  (`has_instances`) the policy sees spot capacity (`Observation.spot_seen`) and is asked again, as the simulator
  asks it (spotrun/policy/execution.py). Its bill is in the run's spent money (bounded at on-demand rates while
  it runs, exact once it ended) and its MaxRuntime is what the cap leaves after the on-demand job's own
  MaxRuntime: even if every stop fails, the two jobs together stay under the cap (`sentinel_limits`). The Lambda
  creates it with the launcher role (the run's session tag, spotrun/pipeline/launch.py) and stops it;
- a job belongs to this execution when its `execution` tag says so (the name is derived, the tag is set at
  creation): a job name an earlier execution used is refused.

Polling, and the history quota: a Standard execution fails at 25,000 history events. The loop is Wait -> CostGuard
-> Choice (9 events), and the guard picks the next wait: 5% of the job's age, between `poll_seconds` and
`max_poll_seconds`, and never longer than the time left before the cap would be reached (minus the 120 s a stop
still bills). tests/infra/test_seams.py computes the event count of one segment of the longest job the contract
allows; the guard counts its execution's events (`history_events`) and sends a segment that might not fit in
what is left to a fresh execution (`continue`, spotrun/pipeline/continuation.py).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

from ..contract.aws_text import digest, metadata_value
from ..planner.segments import (
    MAX_SEGMENTS,
    STOP_BILL_S,
    ChainCosts,
    cap_wait_s,
    chain_refusal,
    next_segment,
    restart_wasted_s,
    segment_job_name,
    segment_seconds,
    sentinel_room,
    smallest_cap,
    work_left_s,
)
from ..policy.decision import (
    Action,
    Decision,
    JobStatus,
    Market,
    Observation,
    ask_again,
    committed_progress_s,
    decide_from_section,
    poll_wait,
    sentinel_room_s,
)
from ..seams import (
    CHECKPOINT_MANIFEST,
    CHECKPOINT_STEP_DIR,
    COMPLETED_METRIC,
    EXECUTION_TAG,
    Guard,
    GuardAction,
    Plan,
    SpotPolicy,
    metric_name,
)
from ..settings.wire import flatten, parse
from .aws_events import to_epoch
from .continuation import EVENTS_PER_CREATE, EVENTS_PER_POLL, EVENTS_PER_STOP, continuation_name, must_continue
from .report import run_report

STOP_GRACE_S = STOP_BILL_S  # a stopped job bills until the container exits: up to the notice
# Secondary statuses in which SageMaker has no instances billing for the job: waiting for (spot) capacity.
UNBILLED_STATUSES = frozenset({"Starting", "LaunchingMLInstances", "Pending", "Interrupted"})
ENDED = ("Completed", "Stopped", "Failed")
SENTINEL_MAX = 99  # sentinels per run (`-sn99`: as long as a segment's `-99od`); past it the policy runs without


def sentinel_name(plan: Plan, k: int) -> str:
    """The run's k-th sentinel: `<first job>-sn<k>` (a name no segment has; the canceller stops it with the
    run's jobs: every name starts with the first job's)."""
    return f"{plan.job_name}-sn{k}"


def has_instances(describe: dict | None) -> bool:
    """A sentinel holds instances: in progress, past waiting for capacity (Downloading, Training, ...)."""
    return bool(describe) and describe.get("TrainingJobStatus") == "InProgress" and \
        describe.get("SecondaryStatus") not in UNBILLED_STATUSES | {"Stopping"}


def sentinel_request(template: dict, guard: Guard) -> dict:
    """The sentinel's CreateTrainingJob request: the state machine's template (the run's image with a command
    that sleeps, its output path, role, ResourceConfig and tags: training_constructs/training_pipeline.py
    `sentinel_job_parameters`) with the guard's name and limits. Managed spot, no input, no checkpoints."""
    return {**template, "TrainingJobName": guard.sentinel_name, "EnableManagedSpotTraining": True,
            "StoppingCondition": {"MaxRuntimeInSeconds": int(guard.sentinel_max_runtime_seconds),
                                  "MaxWaitTimeInSeconds": int(guard.sentinel_max_wait_seconds)}}


def sentinel_limits(plan: Plan, guard: Guard, describe: dict, recheck_s: float) -> tuple[int, int] | None:
    """(MaxRuntime, MaxWait) of a sentinel created now beside the on-demand job `describe`, or None when the cap
    leaves no room for one that can hold its instances until the guard's next look (`recheck_s`) and its stop.
    MaxRuntime: what the cap leaves at on-demand rates after what is spent and the on-demand job's whole
    MaxRuntime, its stop and warm pool, less the sentinel's own stop: if every stop fails, both jobs run to their
    MaxRuntime and the run still stays under the cap. MaxWait: the on-demand job's MaxRuntime (it need not outlive
    it)."""
    limit = float((describe.get("StoppingCondition") or {}).get("MaxRuntimeInSeconds") or math.inf)
    return sentinel_room(cap_usd=plan.max_usd, spent_before_usd=float(guard.spent_before_usd),
                         usd_per_s=usd_per_second(plan), od_max_runtime_s=limit,
                         od_warm_pool_s=warm_pool_seconds(describe), longest_s=plan.max_runtime_cap_seconds,
                         recheck_s=recheck_s, poll_s=plan.poll_seconds)


def _sentinel_books(plan: Plan, guard: Guard, sentinel: dict | None, sentinel_tags: dict[str, str] | None,
                    now: float) -> tuple[Guard, float]:
    """(the guard with an ended sentinel's exact bill moved into spent_before_usd, the live sentinel's bill so
    far: bounded at on-demand rates). A job under the sentinel's name that is not this execution's is dropped
    unbilled (an earlier execution's)."""
    if not guard.sentinel_name or sentinel is None:
        return dataclasses.replace(guard, sentinel_name="", sentinel_stopping=False), 0.0
    if sentinel_tags is not None and sentinel_tags.get(EXECUTION_TAG) != plan.execution:
        return dataclasses.replace(guard, sentinel_name="", sentinel_stopping=False), 0.0
    cost, exact = job_cost(plan, sentinel, now)
    if not exact:
        return guard, cost
    bill = {"job_name": guard.sentinel_name, "secondary_status": sentinel.get("SecondaryStatus"),
            "billable_seconds": sentinel.get("BillableTimeInSeconds"), "cost_usd": round(cost, 4)}
    return dataclasses.replace(guard, sentinel_name="", sentinel_stopping=False,
                               spent_before_usd=round(float(guard.spent_before_usd) + cost, 6),
                               sentinel_bills=[*guard.sentinel_bills, bill]), 0.0


def _sentinel_wanted(plan: Plan, guard: Guard, describe: dict, decision: Decision | None) -> dict:
    """The guard's sentinel fields after the policy's decision at a poll of a running job (None: not asked, the
    sentinel stays as it is): create one when the policy asks for one on an on-demand job and none exists, stop
    it when the policy no longer asks."""
    if decision is None:
        return {}
    wanted = decision.sentinel and not guard.spot and describe.get("TrainingJobStatus") == "InProgress"
    if not wanted:
        return _sentinel_stopped(guard)
    if guard.sentinel_name or guard.sentinels >= SENTINEL_MAX:
        return {}
    limits = sentinel_limits(plan, guard, describe, decision.recheck_s)
    if limits is None:  # the cap leaves no room beside the on-demand job: the policy runs without one
        return {}
    k = int(guard.sentinels) + 1
    return {"sentinel_name": sentinel_name(plan, k), "sentinel_stopping": False, "sentinels": k,
            "sentinel_max_runtime_seconds": limits[0], "sentinel_max_wait_seconds": limits[1]}


def _sentinel_stopped(guard: Guard) -> dict:
    """A live sentinel stopped (the Lambda sends StopTrainingJob; its bill is read when it has ended)."""
    return {"sentinel_stopping": True} if guard.sentinel_name and not guard.sentinel_stopping else {}


def _interruptions(describe: dict) -> int:
    return sum(1 for t in describe.get("SecondaryStatusTransitions") or [] if t.get("Status") == "Interrupted")


def _final_metric(describe: dict, name: str) -> float | None:
    for metric in describe.get("FinalMetricDataList") or []:
        if metric.get("MetricName") == name:
            return float(metric["Value"])
    return None


def usd_per_second(plan: Plan) -> float:
    return plan.usd_per_hour / 3600


def billed_seconds_bound(describe: dict, now: float) -> float:
    """Seconds the job has billed at most so far: its time in billed secondary statuses (the transitions' own
    clock); without transitions, the seconds since TrainingStartTime."""
    transitions = describe.get("SecondaryStatusTransitions") or []
    if transitions:
        total = 0.0
        for t in transitions:
            start = to_epoch(t.get("StartTime"))
            if t.get("Status") in UNBILLED_STATUSES or start is None:
                continue
            total += max(0.0, (to_epoch(t.get("EndTime")) or now) - start)
        return total
    start = to_epoch(describe.get("TrainingStartTime"))
    if start is None:
        return 0.0
    return max(0.0, (to_epoch(describe.get("TrainingEndTime")) or now) - start)


def warm_pool_seconds(describe: dict) -> float:
    """What a job's warm pool bills after it ends: the keep-alive (or what SageMaker reports, if more)."""
    keep = float((describe.get("ResourceConfig") or {}).get("KeepAlivePeriodInSeconds") or 0)
    retained = float((describe.get("WarmPoolStatus") or {}).get("ResourceRetainedBillableTimeInSeconds") or 0)
    return max(keep, retained)


def job_cost(plan: Plan, describe: dict, now: float) -> tuple[float, bool]:
    """(USD of this job, exact?): billable x on-demand (+ warm pool) once it ended, else the running bound."""
    rate = usd_per_second(plan)
    if describe.get("TrainingJobStatus") in ENDED and describe.get("BillableTimeInSeconds") is not None:
        return (float(describe["BillableTimeInSeconds"]) + warm_pool_seconds(describe)) * rate, True
    return (billed_seconds_bound(describe, now) + warm_pool_seconds(describe)) * rate, False


def next_wait(plan: Plan, job_age_s: float, spent_usd: float, recheck_s: float = math.inf) -> int:
    """Seconds to the next poll: the guard's grid (spotrun/policy/decision.py: `poll_wait`, 5% of the job's age
    between poll_seconds and max_poll_seconds), the spot policy's recheck if sooner, never past the time the cap
    leaves (see the module docstring)."""
    # NOTE: the grid's ages are whole seconds and a poll comes a fraction of a second after its grid age (the
    # Lambda's latency, CreationTime in milliseconds): the age is taken to the whole second below, else the grid's
    # next age (< age + poll_seconds) is skipped and the guard polls half as often as the simulator has it, or a
    # second before the grid and the policy's recheck (benchmarks/replay_bench.py found both)
    schedule = poll_wait(math.floor(job_age_s), recheck_s, poll_s=plan.poll_seconds,
                         max_poll_s=plan.max_poll_seconds)
    schedule = min(schedule, cap_wait_s(cap_usd=plan.max_usd, spent_usd=spent_usd, usd_per_s=usd_per_second(plan)))
    return int(max(plan.poll_seconds, schedule))


def checkpoint_age(describe: dict, newest_checkpoint: float | None, now: float) -> float | None:
    """Seconds since the newest committed checkpoint reached S3 (since training started when none has)."""
    if describe.get("TrainingJobStatus") != "InProgress" or describe.get("SecondaryStatus") != "Training":
        return None
    start = to_epoch(describe.get("TrainingStartTime"))
    reference = newest_checkpoint if newest_checkpoint is not None else start
    return None if reference is None else max(0.0, now - reference)


def policy_section(plan: Plan) -> SpotPolicy | None:
    """The estimate's chosen spot policy as the plan carries it (spotrun/policy/choose.py), or None (a plan
    without one: the run keeps its market, and MaxWait's fallback is the only switch)."""
    section = plan.estimate.spot_policy
    if section is None or not section.sim_plan or not section.policy:
        return None  # the plan's contract decides whether the run may go on-demand
    return dataclasses.replace(section, sim_plan={**section.sim_plan, "on_demand_fallback": plan.on_demand_fallback})


def training_seconds(describe: dict, newest_checkpoint: float | None, now: float) -> float:
    """Seconds the job has trained since the newest commit, or since it last entered Training if later (0 when
    it is not training): work a save on the notice keeps."""
    if describe.get("SecondaryStatus") != "Training":
        return 0.0
    starts = [to_epoch(t.get("StartTime")) for t in describe.get("SecondaryStatusTransitions") or []
              if t.get("Status") == "Training"]
    since = max([t for t in starts if t is not None] or [to_epoch(describe.get("TrainingStartTime")) or now])
    return max(0.0, now - max(since, newest_checkpoint or since))


def observe(plan: Plan, guard: Guard, describe: dict, *, now: float, newest_checkpoint: float | None,
            checkpoint_step: int | None, spent: float, spot_seen: bool = False) -> Observation:
    """What the spot policy sees at this poll (spotrun/policy/decision.py: Observation)."""
    section = policy_section(plan)
    work = float(section.sim_plan.get("work_s") or 0.0) if section else 0.0
    status, secondary = describe.get("TrainingJobStatus"), describe.get("SecondaryStatus")
    ended = status in ENDED
    started = to_epoch(plan.execution_started) or to_epoch(describe.get("CreationTime")) or now
    return Observation(
        elapsed_s=max(0.0, now - started),
        committed_s=committed_progress_s(checkpoint_step, work, plan.planned_steps),
        market=Market.SPOT if guard.spot else Market.ON_DEMAND,
        status=JobStatus.NONE if ended else JobStatus.WAITING if secondary in UNBILLED_STATUSES else
        JobStatus.RUNNING,
        job_age_s=0.0 if ended else max(0.0, now - (to_epoch(describe.get("CreationTime")) or now)),
        spent_usd=spent, max_wait_exceeded=ended and _no_capacity(describe),
        training_s=0.0 if ended else training_seconds(describe, newest_checkpoint, now), spot_seen=spot_seen)


def _no_capacity(describe: dict) -> bool:
    return describe.get("SecondaryStatus") == "MaxWaitTimeExceeded" or str(
        describe.get("FailureReason", "")).startswith("MaxWaitTimeExceeded")


def restart_wasted(plan: Plan, describe: dict, max_runtime_s: float, billed_s: float) -> bool:
    """A spot job waiting for capacity after an interruption whose MaxRuntime left cannot hold a restart, one step,
    a save and the margin: restarted, it would bill its start and a stop and train nothing. Stopped while it has
    no instances it bills nothing more, and the next segment gets the room its exact bill leaves (more than this
    job has left: it was bounded at on-demand rates and billed at spot)."""
    if describe.get("SecondaryStatus") not in UNBILLED_STATUSES or not _interruptions(describe):
        return False
    return restart_wasted_s(max_runtime_s=max_runtime_s, billed_s=billed_s, startup_s=plan.segment_overhead_seconds,
                            step_s=plan.seconds_per_step, save_s=plan.checkpoint_upload_seconds)


def next_capacity(plan: Plan, guard: Guard, *, no_spot_capacity: bool,
                  decision: Decision | None = None) -> bool | None:
    """The one decision point for the next segment's capacity: True spot, False on-demand, None neither (the run
    ends).

    An on-demand run stays on-demand; after a stop the cap requested, the capacity the job had; after a stop the
    spot policy requested, the market it asked for; otherwise the policy's decision at this job's end (which
    already keeps a run without fallback off on-demand: spotrun/policy/decision.py `decide`). Without a policy:
    after MaxWait without capacity on-demand when the run allows a fallback, else the capacity the run has been on.
    Its budget is checked by the caller, as for every segment."""
    if not plan.spot:
        return False
    if guard.stop_requested:
        return bool(guard.spot)
    if guard.switch_requested:
        return bool(guard.switch_to_spot)
    if decision is not None and decision.action is not Action.KEEP:
        return None if decision.action is Action.END else decision.action is Action.START_SPOT
    if no_spot_capacity:
        return False if plan.on_demand_fallback else None
    return bool(guard.spot)


def _policy_poll(plan: Plan, guard: Guard, obs: Observation) -> tuple[Decision | None, dict]:
    """The spot policy's decision at a poll of a running job, when the guard asks it (`ask_again`), and the
    guard's fields that record it."""
    section = policy_section(plan)
    recheck_at = math.inf if guard.policy_recheck_at is None else float(guard.policy_recheck_at)
    if section is None or not (ask_again(obs.status, JobStatus(guard.policy_status), obs.elapsed_s, recheck_at) or
                               obs.spot_seen is not bool(guard.policy_seen)):
        return None, {}
    decision = decide_from_section(section, obs)
    at = obs.elapsed_s + decision.recheck_s
    return decision, {"policy_status": obs.status.value, "policy_recheck_at": None if at == math.inf else at,
                      "policy_seen": obs.spot_seen}


def decide(plan: Plan, guard: Guard, describe: dict, *, now: float, newest_checkpoint: float | None = None,
           job_tags: dict[str, str] | None = None, checkpoint_step: int | None = None,
           sentinel: dict | None = None, sentinel_tags: dict[str, str] | None = None) -> Guard:
    """The new guard after one poll of the guard's job (`describe`: DescribeTrainingJob's answer; `job_tags`: its
    tags; `newest_checkpoint`, `checkpoint_step`: the newest committed checkpoint's time and step; `sentinel`,
    `sentinel_tags`: DescribeTrainingJob and tags of the guard's sentinel, None without one). The Lambda creates
    the new guard's sentinel when it names one the old did not, and stops it when `sentinel_stopping` turns on."""
    guard, sentinel_usd = _sentinel_books(plan, guard, sentinel, sentinel_tags, now)
    cost, exact = job_cost(plan, describe, now)
    spent = float(guard.spent_before_usd) + cost + sentinel_usd
    rate = usd_per_second(plan)
    projected = spent + (plan.poll_seconds + STOP_GRACE_S) * rate
    status = describe.get("TrainingJobStatus")
    age = checkpoint_age(describe, newest_checkpoint, now)
    worst_gap = max(float(guard.worst_checkpoint_gap_seconds or 0.0), age or 0.0)
    created = to_epoch(describe.get("CreationTime")) or now
    result = dataclasses.replace(
        guard, cost_usd=round(spent, 4), projected_usd=round(projected, 4),
        interruptions=int(guard.interruptions_before) + _interruptions(describe),
        checkpoint_age_seconds=None if age is None else round(age, 1),
        worst_checkpoint_gap_seconds=round(worst_gap, 1), report=None, message="",
        wait_seconds=next_wait(plan, now - created, spent),
        history_events=int(guard.history_events) + EVENTS_PER_POLL)  # the poll that called the guard

    def act(action: GuardAction, **changes: Any) -> Guard:
        return dataclasses.replace(result, action=action, **changes)

    seen = has_instances(sentinel) and bool(guard.sentinel_name) and not guard.sentinel_stopping
    if job_tags is not None and job_tags.get(EXECUTION_TAG) != plan.execution:
        return act(GuardAction.FAILED, **_sentinel_stopped(guard),
                   message=f"{guard.job_name} is not this execution's job: its {EXECUTION_TAG} tag is "
                           f"{job_tags.get(EXECUTION_TAG)!r}, this execution is {plan.execution!r}")
    obs = observe(plan, guard, describe, now=now, newest_checkpoint=newest_checkpoint,
                  checkpoint_step=checkpoint_step, spent=spent, spot_seen=seen)
    if status not in ENDED:
        # SageMaker ends the job at its MaxRuntime: when that bound keeps the run under the cap, a stop here
        # would only cut the segment short. The guard stops a job only when its MaxRuntime does not hold it.
        limit = float((describe.get("StoppingCondition") or {}).get("MaxRuntimeInSeconds") or math.inf)
        bounded = float(guard.spent_before_usd) + (limit + STOP_GRACE_S + warm_pool_seconds(
            describe)) * rate <= plan.max_usd + 1e-6
        if status == "InProgress" and not guard.stop_requested and (
                (projected >= plan.max_usd and not bounded) or
                restart_wasted(plan, describe, limit, billed_seconds_bound(describe, now))):
            return act(GuardAction.STOP, stop_requested=True, wait_seconds=plan.poll_seconds,
                       history_events=result.history_events + EVENTS_PER_STOP, **_sentinel_stopped(guard))
        if guard.stop_requested or guard.switch_requested:  # stopping: poll until the job has ended
            return act(GuardAction.WAIT, wait_seconds=plan.poll_seconds)
        return _running(plan, result, act, obs, describe, now - created, spent)
    # the job ended: a sentinel beside it is stopped (the policy asks for one beside a running job only)
    result = dataclasses.replace(result, **_sentinel_stopped(guard))
    done = [*guard.segments, _segment_record(guard, describe, cost, exact)]
    result = dataclasses.replace(result, segments=done)
    if status == "Completed" and _final_metric(describe, COMPLETED_METRIC) is not None:
        report = _report(plan, result, describe, spent)
        if not report["gate"]["passed"]:  # kept in S3 and reported, not registered
            return act(GuardAction.GATE_FAILED, report=report,
                       message=f"{report['gate']['cause']}; artifact kept at {report['model_data_url']}")
        return act(GuardAction.COMPLETED, report=report)
    section = policy_section(plan)
    decision = decide_from_section(section, obs) if section else None
    if decision is not None:
        result = dataclasses.replace(result, policy_seen=obs.spot_seen)
    return _after_segment(plan, result, describe, spent, act, decision, checkpoint_step, sentinel_usd)


def _running(plan: Plan, result: Guard, act: Callable[..., Guard], obs: Observation, describe: dict,
             job_age_s: float, spent: float) -> Guard:
    """A poll of a job that has not ended: the spot policy's move (a stop, to continue on the other market; a
    sentinel created or stopped), or the wait to the next poll (the policy's recheck if sooner than the guard's
    grid)."""
    status = describe.get("TrainingJobStatus")
    decision, asked = _policy_poll(plan, result, obs)
    asked.update(_sentinel_wanted(plan, result, describe, decision))
    result = dataclasses.replace(result, **asked)
    switch = decision is not None and status == "InProgress" and (
        (decision.action is Action.TO_ON_DEMAND and obs.market is Market.SPOT) or
        (decision.action is Action.TO_SPOT and obs.market is Market.ON_DEMAND))
    if switch:
        to_spot = decision.action is Action.TO_SPOT
        return dataclasses.replace(result, action=GuardAction.STOP, switch_requested=True, switch_to_spot=to_spot,
                                   wait_seconds=plan.poll_seconds,
                                   history_events=result.history_events + EVENTS_PER_STOP, message=(
                                       f"{result.job_name}: the spot policy "
                                       f"({plan.estimate.spot_policy.chosen}) moves the "
                                       f"run to {'spot' if to_spot else 'on-demand'}: stopping this job to "
                                       "continue on the same checkpoints"))
    recheck_at = math.inf if result.policy_recheck_at is None else result.policy_recheck_at
    return act(GuardAction.WAIT, **asked,
               wait_seconds=next_wait(plan, job_age_s, spent, recheck_at - obs.elapsed_s))


def _segment_record(guard: Guard, describe: dict, cost: float, exact: bool) -> dict:
    return {"segment": int(guard.segment), "job_name": guard.job_name,
            "spot": bool(guard.spot), "status": describe.get("TrainingJobStatus"),
            "secondary_status": describe.get("SecondaryStatus"),
            "billable_seconds": describe.get("BillableTimeInSeconds"),
            "training_seconds": describe.get("TrainingTimeInSeconds"), "cost_usd": round(cost, 4), "exact": exact,
            "interruptions": _interruptions(describe)}


def _after_segment(plan: Plan, guard: Guard, describe: dict, spent: float, act: Callable[..., Guard],
                   decision: Decision | None, checkpoint_step: int | None, sentinel_usd: float = 0.0) -> Guard:
    """A job ended without finishing the run: the next segment, or the reason the run ends here. `decision`: the
    spot policy's at this job's end (None without a policy); `sentinel_usd`: a live sentinel's bill so far (in
    `spent`, not carried in spent_before_usd: its exact bill is added when it has ended)."""
    status, secondary = describe.get("TrainingJobStatus"), describe.get("SecondaryStatus")
    stop_requested = bool(guard.stop_requested or guard.switch_requested)
    no_capacity = _no_capacity(describe)
    name = guard.job_name
    if no_capacity and not stop_requested:
        spot = next_capacity(plan, guard, no_spot_capacity=True, decision=decision)
        if spot is None:
            return act(GuardAction.FAILED, message=f"{name}: no spot capacity within MaxWait and on-demand "
                                                   "fallback is off (compute.on_demand_fallback)")
        return _next_segment(plan, guard, spent, spot, act, GuardAction.SEGMENT if spot else GuardAction.FALLBACK,
                             checkpoint_step, sentinel_usd)
    if status == "Failed":
        return act(GuardAction.FAILED, message=f"{name}: {describe.get('FailureReason') or 'training job failed'}")
    if status == "Stopped" and not stop_requested and secondary not in ("MaxRuntimeExceeded",
                                                                        "MaxWaitTimeExceeded"):
        return act(GuardAction.FAILED, message=f"{name} was stopped outside the pipeline (StopTrainingJob by "
                                               "someone else): the run ends with its newest checkpoint")
    if secondary == "MaxRuntimeExceeded" and int(guard.max_runtime_seconds or 0) >= \
            plan.max_runtime_cap_seconds:
        return act(GuardAction.FAILED, message=f"{name} ran to its MaxRuntime of "
                                               f"{plan.max_runtime_cap_seconds / 3600:,.1f} h (the longest a "
                                               "job of this run may run) without finishing: a job's time counts "
                                               "its restarts and the work interruptions lost, so many "
                                               "interruptions (or a trainer slower than planned) reach it; the "
                                               "newest checkpoint stands: checkpoint.resume_from continues the "
                                               "run, compute.spot=false is never interrupted")
    spot = next_capacity(plan, guard, no_spot_capacity=False, decision=decision)
    if spot is None:
        return act(GuardAction.FAILED, message=f"{name}: the run may not continue on-demand "
                                               "(compute.on_demand_fallback) and its spot policy ends it")
    return _next_segment(plan, guard, spent, spot, act, GuardAction.SEGMENT, checkpoint_step, sentinel_usd)


def chain_costs(plan: Plan) -> ChainCosts:
    """The plan's figures for the chain of the segments still to come (spotrun/planner/segments.py)."""
    return ChainCosts(usd_per_s=usd_per_second(plan), spot_fraction=plan.spot_fraction,
                      startup_s=plan.segment_overhead_seconds, restart_s=plan.segment_overhead_seconds,
                      save_s=plan.checkpoint_upload_seconds, longest_s=plan.max_runtime_cap_seconds,
                      step_s=plan.seconds_per_step, warm_pool_s=plan.warm_pool_seconds,
                      sentinel_room_s=plan_sentinel_room_s(plan))


def plan_sentinel_room_s(plan: Plan) -> float:
    """What the plan's policy keeps beside an on-demand job for its sentinel (0 without one): an on-demand job's
    MaxRuntime leaves it, so `sentinel_limits` finds room for the sentinel at any spend."""
    section = policy_section(plan)
    return 0.0 if section is None else sentinel_room_s(section.policy, plan.poll_seconds)


def work_left(plan: Plan, checkpoint_step: int | None) -> float:
    """Training seconds still to do from the newest committed checkpoint (all of it without one), at the planned
    pace without further interruptions: the guard stops a run only when even an uninterrupted finish cannot fit
    (the interruptions so far are in the bills already). At least a step (or a second): the job ended without
    completing."""
    return work_left_s(planned_steps=plan.planned_steps, checkpoint_step=checkpoint_step,
                       seconds_per_step=plan.seconds_per_step,
                       expected_overhead_s=float(plan.estimate.expected_overhead_seconds))


def _next_segment(plan: Plan, guard: Guard, spent: float, spot: bool, act: Callable[..., Guard],
                  action: GuardAction, checkpoint_step: int | None, sentinel_usd: float = 0.0) -> Guard:
    """The next segment when the chain from the newest checkpoint still finishes under the cap at the expected
    bill (its MaxRuntime: what the cap leaves at on-demand rates, less the room for a sentinel beside an on-demand
    job where the chain fits with it); otherwise the run ends at the cap, saying why."""
    segment = int(guard.segment) + 1
    left = work_left(plan, checkpoint_step)
    nxt = next_segment(cap_usd=plan.max_usd, spent_usd=spent, work_s=left, costs=chain_costs(plan), spot=spot,
                       segment=segment)
    chain, costs, max_rt = nxt.chain, nxt.costs, nxt.max_runtime_s
    if not nxt.goes_on:
        why = chain_refusal(chain, plan.max_usd, smallest_cap(spent_usd=spent, work_s=left, costs=costs,
                                                              first=False, spot=spot), costs, spot) if not chain.fits \
            else f"the run would need more than {MAX_SEGMENTS} jobs (segments)"
        return act(GuardAction.OVER_BUDGET, message=(
            f"stopped at the cost cap: ${spent:,.2f} billed (exact, {segment - 1} job(s)) of budget "
            f"${plan.max_usd:,.2f}, ${max(0.0, plan.max_usd - spent):,.2f} left, {left:,.0f} s of training to go "
            f"from step {checkpoint_step or 0} of {plan.planned_steps}: {why}. The newest checkpoint is under "
            f"{plan.checkpoint_s3_uri}: continue with checkpoint.resume_from={plan.execution} and a larger "
            "budget.max_usd"))
    hyper = flatten(dataclasses.replace(parse(plan.hyperparameters), segment_seconds=segment_seconds(
        max_rt, startup_s=plan.segment_overhead_seconds, save_s=plan.checkpoint_upload_seconds)))
    fresh = must_continue(int(guard.history_events))  # the next segment in a fresh execution's history
    return act(GuardAction.CONTINUE if fresh else action, job_name=segment_job_name(plan.job_name, segment, spot),
               spot=spot, segment=segment, spent_before_usd=round(spent - sentinel_usd, 6),
               interruptions_before=int(guard.interruptions), stop_requested=False, switch_requested=False,
               switch_to_spot=False, policy_status=JobStatus.NONE.value, policy_recheck_at=None,
               max_runtime_seconds=max_rt, max_wait_seconds=max_rt + plan.max_wait_extra_seconds if spot else max_rt,
               hyperparameters=hyper, wait_seconds=plan.poll_seconds,
               history_events=int(guard.history_events) + (0 if fresh else EVENTS_PER_CREATE),
               next_execution=continuation_name(plan.execution, segment) if fresh else "")


def _report(plan: Plan, guard: Guard, describe: dict, spent: float) -> dict:
    """The cost report of a completed run (`guard`: the poll's new guard, its `segments` every finished job)."""
    segments = guard.segments
    billable = sum(float(s["billable_seconds"] or 0.0) for s in segments)
    training = sum(float(s["training_seconds"] or s["billable_seconds"] or 0.0) for s in segments)
    spot_billable = sum(float(s["billable_seconds"] or 0.0) for s in segments if s["spot"])
    spot_training = sum(float(s["training_seconds"] or s["billable_seconds"] or 0.0) for s in segments if s["spot"])
    savings = (1 - spot_billable / spot_training) * 100 if spot_training > 0 else 0.0
    worst_lost = guard.worst_checkpoint_gap_seconds * plan.usd_per_hour / 3600
    report = run_report(  # the one report builder (spotrun/pipeline/report.py), as the local pipeline's
        plan, job_name=guard.job_name, spot=any(s["spot"] for s in segments), billable_seconds=billable,
        training_seconds=training, interruptions=guard.interruptions, spot_savings_pct=round(savings, 2),
        cost_usd=round(spent, 6), price_basis=f"{COST_BASIS_BILLED}; {plan.price_source}",
        cost_basis=COST_BASIS_BILLED, price_region=plan.region, price_as_of=plan.price_as_of,
        final_loss=_final_metric(describe, metric_name("loss")),
        model_data_url=(describe.get("ModelArtifacts") or {}).get("S3ModelArtifacts", ""),
        worst_case_lost_usd=round(worst_lost, 2), base_val_loss=_final_metric(describe, metric_name("base_val_loss")),
        exported_val_loss=_final_metric(describe, metric_name("exported_val_loss")))
    report.update(region=plan.region, segments=segments)
    report["metadata"] = registry_metadata(report)
    return report


# The model package's CustomerMetadataProperties: structured fields only (no prose: `;`, `(`, `)`, `,` break the
# value pattern; spotrun/contract/aws_text.py). data_source is the run's URI made to fit; data_source_sha256 the exact
# one.
REGISTRY_METADATA_KEYS = ("run", "method", "artifact", "data_source", "data_source_sha256", "final_loss",
                          "interruptions", "segments", "billable_seconds", "training_seconds", "spot_savings_pct",
                          "cost_usd",
                          "cost_basis", "price_region", "price_as_of", "worst_case_lost_usd")
# How the reported cost is computed, in the pattern's characters.
COST_BASIS_BILLED = "billable seconds x on-demand price x instance count"


# Runs with validation data; samples_file: the sample generations' file inside the package's ModelDataUrl.
OPTIONAL_METADATA_KEYS = ("base_val_loss", "exported_val_loss", "samples_file")


def registry_metadata(report: dict) -> dict[str, str]:
    """The model package's CustomerMetadataProperties (1-256 allowed characters each), from a cost report: the
    same keys on AWS and in the local registry of `spotrun local`."""
    source = str(report.get("data_source") or "")
    segments = report.get("segments")  # the jobs with their bills (AWS), or a count
    fields = {**report, "data_source": source, "data_source_sha256": digest(source) if source else None,
              "segments": (len(segments) if isinstance(segments, list) else segments) or 1}
    out = {k: metadata_value(fields.get(k)) for k in REGISTRY_METADATA_KEYS}
    out.update({k: metadata_value(report[k]) for k in OPTIONAL_METADATA_KEYS if report.get(k) is not None})
    return out


def newest_checkpoint(s3_client: Any, bucket: str, prefix: str) -> float | None:
    """LastModified (epoch s) of the newest committed checkpoint's manifest under the prefix: a listing only."""
    return committed_checkpoints(s3_client, bucket, prefix)[0]


def committed_checkpoints(s3_client: Any, bucket: str, prefix: str) -> tuple[float | None, int | None]:
    """(LastModified of the newest committed manifest, the highest committed step) under the prefix."""
    newest, step = None, None
    for page in s3_client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            if obj["Key"].endswith("/" + CHECKPOINT_MANIFEST):
                modified = to_epoch(obj["LastModified"])
                newest = modified if newest is None else max(newest, modified)
                found = CHECKPOINT_STEP_DIR.match(obj["Key"].rsplit("/", 2)[-2])
                if found:
                    step = max(step or 0, int(found.group(1)))
    return newest, step


def checkpoint_overdue(plan: Plan, age_s: float) -> float:
    """The checkpoint age against what the plan allows: 2 x the planned interval + one upload (alarm at >= 1)."""
    return round(age_s / (2 * plan.estimate.checkpoint_interval_s + plan.checkpoint_upload_seconds), 3)
