"""The execution at a cap that binds (spotrun/policy/execution.py `Cap`) decides as the cost guard does, through
the guard's own functions (spotrun/pipeline/guard.py and the rules it calls in spotrun/planner/segments.py): one
case per difference docs/spot-policy.md ("At a cap that binds") lists, each on a synthetic trace.

1. the run ends at the cap (OverBudget) where `_next_segment` finds no chain from the newest checkpoint that fits;
2. each job's MaxRuntime is what the cap leaves (`next_max_runtime`), its trainer ends its segment before it
   (`segment_seconds`), and the guard notices the end at a poll `next_wait` cut to the time the cap leaves;
3. a sentinel is created only where the cap leaves room for it beside the on-demand job (`sentinel_limits`)."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest

from spotrun.pipeline import guard as guard_rules
from spotrun.planner.segments import (
    ChainCosts,
    next_max_runtime,
    next_segment,
    segment_seconds,
    smallest_cap,
)
from spotrun.policy.decision import Market, checkpoint_step, poll_wait, sentinel_room_s
from spotrun.policy.engine import SimPlan
from spotrun.policy.execution import execute

H = 3600.0
OD_PER_H = 10.0
COSTS = ChainCosts(usd_per_s=OD_PER_H / 3600, spot_fraction=0.35, startup_s=600.0, restart_s=600.0, save_s=60.0,
                   longest_s=72_000, step_s=10.0)


def _plan(cap_usd: float | None, *, work_h: float = 10.0, deadline_h: float = 30.0) -> SimPlan:
    return SimPlan(work_s=work_h * H, startup_s=600.0, restore_s=0.0, save_s=60.0, interval_s=1800.0, step_s=10.0,
                   notice_ok=True, spot_usd_per_h=OD_PER_H * 0.35, on_demand_usd_per_h=OD_PER_H,
                   max_wait_s=COSTS.longest_s + 2 * H, max_runtime_s=float(COSTS.longest_s),
                   deadline_s=deadline_h * H, poll_s=60.0, max_poll_s=4 * H, planned_steps=int(work_h * 360),
                   cap_usd=cap_usd, chain_costs=None if cap_usd is None else COSTS, expected_overhead_s=0.0)


def _guard_plan(plan: SimPlan) -> SimpleNamespace:
    """The guard's plan fields its functions read, from the simulator's plan (spotrun/pipeline/assembly.py makes
    them from the same estimate)."""
    return SimpleNamespace(max_usd=plan.cap_usd, usd_per_hour=plan.on_demand_usd_per_h,
                           poll_seconds=plan.poll_s, max_poll_seconds=plan.max_poll_s,
                           max_runtime_cap_seconds=COSTS.longest_s, planned_steps=plan.planned_steps,
                           seconds_per_step=COSTS.step_s,
                           estimate=SimpleNamespace(expected_overhead_seconds=plan.expected_overhead_s))


def _bill(plan: SimPlan, job) -> float:
    return job.billed * (plan.spot_usd_per_h if job.market is Market.SPOT else plan.on_demand_usd_per_h) / 3600


def test_the_run_ends_at_the_cap_where_the_guard_finds_no_chain_that_fits():
    """Spot for an hour, then none: deadline_greedy moves to on-demand, whose chain for the work left does not fit
    the cap; the guard ends the run there (OverBudget), unfinished, within the cap. Without the cap modelled the
    execution billed on, over it."""
    trace = [(0.0, 1 * H), (500 * H, 1000 * H)]
    plan = _plan(60.0)
    run = execute(plan, trace, "deadline_greedy", "notice")
    assert run.over_budget and not run.tally.finished, run.tally
    assert [j.market for j in run.jobs] == [Market.SPOT], run.jobs  # no on-demand job was created
    spent = sum(_bill(plan, j) for j in run.jobs)
    step = checkpoint_step(run.committed, plan.work_s, plan.steps)
    left = guard_rules.work_left(_guard_plan(plan), step)
    assert not next_segment(cap_usd=60.0, spent_usd=spent, work_s=left, costs=COSTS, spot=False, segment=2).goes_on
    assert spent <= 60.0
    uncapped = execute(_plan(None), trace, "deadline_greedy", "notice")
    assert uncapped.tally.finished and sum(_bill(plan, j) for j in uncapped.jobs) > 60.0


def test_each_job_runs_what_the_cap_leaves_and_the_guard_notices_its_end_before_the_grid_would():
    """Spot throughout at a $60 cap: the first job's MaxRuntime is what the cap allows, its trainer ends its
    segment `segment_seconds` into its start; the guard's poll after it, `next_wait` cut to the time the cap leaves,
    creates the next job with the MaxRuntime the exact bill leaves (`_next_segment`), and so on to the finish."""
    trace = [(0.0, 1000 * H)]
    plan = _plan(60.0)
    run = execute(plan, trace, "maxwait_fallback", "notice")
    assert run.tally.finished and len(run.jobs) == 3, run.jobs
    first = run.jobs[0]
    assert first.max_runtime_s == next_max_runtime(cap_usd=60.0, spent_usd=0.0, usd_per_s=COSTS.usd_per_s,
                                                   longest_s=COSTS.longest_s) < COSTS.longest_s
    assert first.segment_s == segment_seconds(int(first.max_runtime_s), startup_s=600.0, save_s=60.0)
    # the trainer saved and exited after its budget: the job ended its start + budget + save later
    ended = first.created + 600.0 + first.segment_s + 60.0
    assert first.t == pytest.approx(ended) and first.end == "segment"
    # the guard's polls of the running job, each wait `next_wait` with the job's bound at on-demand rates
    gp, t, uncut = _guard_plan(plan), 0.0, 0.0
    while t < ended:
        t += guard_rules.next_wait(gp, t - first.created, t * COSTS.usd_per_s)
        uncut += poll_wait(math.floor(uncut), math.inf, poll_s=plan.poll_s, max_poll_s=plan.max_poll_s) \
            if uncut < ended else 0.0
    while uncut < ended:
        uncut += poll_wait(math.floor(uncut), math.inf, poll_s=plan.poll_s, max_poll_s=plan.max_poll_s)
    second = run.jobs[1]
    assert second.created == t < uncut, (second.created, t, uncut)
    spent = _bill(plan, first)
    step = checkpoint_step(_committed_by(plan, trace, "maxwait_fallback", ended), plan.work_s, plan.steps)
    nxt = next_segment(cap_usd=60.0, spent_usd=spent, work_s=guard_rules.work_left(gp, step), costs=COSTS,
                       spot=True, segment=2)
    assert nxt.goes_on and second.max_runtime_s == nxt.max_runtime_s
    assert second.segment_s == segment_seconds(nxt.max_runtime_s, startup_s=COSTS.restart_s, save_s=COSTS.save_s)
    assert sum(_bill(plan, j) for j in run.jobs) <= 60.0
    # without the cap modelled: one job of the longest MaxRuntime
    assert len(execute(_plan(None), trace, "maxwait_fallback", "notice").jobs) == 1


def test_a_sentinel_is_created_only_where_the_cap_leaves_room_for_it():
    """Spot for an hour, none until 19 h: probing_sentinel moves to on-demand and asks for a sentinel after an
    hour there. At a cap whose chain fits only without the sentinel's room, the on-demand job takes all the cap
    leaves, `sentinel_limits` finds no room beside it, and the run goes on-demand to the end without one; at a
    cap with the room the sentinel is created as without the cap."""
    trace = [(0.0, 1 * H), (19 * H, 1000 * H)]
    base = _plan(1000.0, work_h=5.0, deadline_h=24.0)
    roomy = execute(base, trace, "probing_sentinel", "notice")
    assert roomy.sentinels == 1 and roomy.tally.finished, roomy.tally
    assert roomy.sentinels == execute(_plan(None, work_h=5.0, deadline_h=24.0), trace, "probing_sentinel",
                                      "notice").sentinels
    spent = _bill(base, roomy.jobs[0])
    gp = _guard_plan(base)
    committed = _committed_by(base, trace, "probing_sentinel", roomy.jobs[0].t)
    left = guard_rules.work_left(gp, checkpoint_step(committed, base.work_s, base.steps))
    room = dataclasses.replace(COSTS, sentinel_room_s=sentinel_room_s("probing_sentinel", base.poll_s))
    with_room = smallest_cap(spent_usd=spent, work_s=left, costs=room, first=False, spot=False)
    without = smallest_cap(spent_usd=spent, work_s=left, costs=COSTS, first=False, spot=False)
    assert without < with_room
    cap = round((without + with_room) / 2, 2)
    run = execute(dataclasses.replace(base, cap_usd=cap), trace, "probing_sentinel", "notice")
    od = run.jobs[1]
    assert od.market is Market.ON_DEMAND and od.max_runtime_s == next_max_runtime(
        cap_usd=cap, spent_usd=spent, usd_per_s=COSTS.usd_per_s, longest_s=COSTS.longest_s)
    gp.max_usd = cap
    describe = {"StoppingCondition": {"MaxRuntimeInSeconds": od.max_runtime_s}}
    assert guard_rules.sentinel_limits(gp, SimpleNamespace(spent_before_usd=spent), describe, 600.0) is None
    assert run.sentinels == 0 and run.tally.finished and len(run.jobs) == 2, (run.sentinels, run.jobs)


def _committed_by(plan: SimPlan, trace: list, policy: str, t: float) -> float:
    """The work committed when the run's first job ended at `t` (the execution stopped at the poll after it)."""
    return execute(plan, trace, policy, "notice", horizon_s=t + 1.0).tally.progress
