"""`execute_all` (spotrun/policy/execution.py): the runs no interruption reaches are executed once and shared, with
the same tallies, to the last bit, as executing every trace (`Run.reach` says how far the run read the first
window's end)."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from spotrun.planner.segments import ChainCosts
from spotrun.policy import execution
from spotrun.policy.decision import RULES
from spotrun.policy.engine import SimPlan
from spotrun.policy.execution import REACH_MARGIN_S, UNINTERRUPTED, execute, execute_all
from spotrun.policy.traces import TraceSpec, generated_traces

H = 3600.0
INF = math.inf
COSTS = ChainCosts(usd_per_s=10.0 / 3600, spot_fraction=0.35, startup_s=600.0, restart_s=600.0, save_s=60.0,
                   longest_s=72_000, step_s=10.0)


def _plan(cap_usd: float | None, *, deadline_h: float | None = 30.0, notice_ok: bool = True) -> SimPlan:
    return SimPlan(work_s=10 * H, startup_s=600.0, restore_s=120.0, save_s=60.0, interval_s=1800.0, step_s=10.0,
                   notice_ok=notice_ok, spot_usd_per_h=3.5, on_demand_usd_per_h=10.0,
                   max_wait_s=COSTS.longest_s + 2 * H, max_runtime_s=float(COSTS.longest_s),
                   deadline_s=None if deadline_h is None else deadline_h * H, poll_s=60.0, max_poll_s=4 * H,
                   planned_steps=3600, cap_usd=cap_usd, chain_costs=None if cap_usd is None else COSTS)


def _traces(reach: float) -> list:
    """Generated traces, and first windows ending around the uninterrupted run's reach: just past it (shared),
    just short of the margin and well before it (executed), and ones that start with a wait."""
    traces = generated_traces(TraceSpec(interruptions_per_hour=0.1, horizon_s=80 * H, fitted=True), 40, 3)
    rng = random.Random(5)
    for end in (reach + REACH_MARGIN_S + 1e-6, reach + REACH_MARGIN_S + 0.5, reach + 30.0, reach + 7 * H,
                reach + REACH_MARGIN_S - 1e-3, reach - 1.0, reach / 2, 0.3 * H):
        gap = rng.uniform(60.0, 4 * H)
        traces.append([(0.0, end), (end + gap, INF)])
    traces += [[(1800.0, INF)], [(0.0, INF)], [(600.0, 20 * H), (22 * H, INF)]]
    return traces


CASES = [(cap, deadline, notice) for cap, deadline, notice in
         ((None, 30.0, True), (None, None, True), (120.0, 30.0, True), (160.0, 14.0, False), (95.0, None, True))]


@pytest.mark.parametrize("cap,deadline_h,notice_ok", CASES)
def test_the_shared_runs_are_every_traces_own_to_the_bit(cap, deadline_h, notice_ok):
    """On every policy and checkpointing, capped or not, with a deadline or without: `execute_all`'s tallies equal
    each trace's own execution exactly (dataclass equality of every float), the traces whose first window ends a
    hair past the reach included."""
    plan = _plan(cap, deadline_h=deadline_h, notice_ok=notice_ok)
    for policy in RULES:
        for ck in ("notice", "periodic", "both"):
            reach = execute(plan, UNINTERRUPTED, policy, ck, reach=True).reach
            traces = _traces(max(reach, 0.0))
            assert execute_all(plan, traces, policy, ck) == [execute(plan, t, policy, ck).tally for t in traces], \
                (policy, ck)


def test_the_runs_no_interruption_reaches_are_executed_once(monkeypatch):
    """Ten traces whose first window outlasts the run and three interrupted ones: four executions (the shared run
    and the three), each shared tally a copy of its own; on-demand reads no window: one execution for all."""
    plan = _plan(120.0)
    calls = []
    real = execution.execute

    def counting(*args, **kwargs):
        calls.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(execution, "execute", counting)
    long = [[(0.0, (200 + k) * H)] for k in range(10)]
    cut = [[(0.0, 2 * H), (3 * H, INF)], [(0.0, 5 * H), (5.5 * H, INF)], [(900.0, INF)]]
    tallies = execute_all(plan, long + cut, "deadline_greedy", "notice")
    assert calls == [UNINTERRUPTED] + cut
    assert len({id(t) for t in tallies}) == len(tallies)
    assert tallies[0].finished and tallies[0] == dataclasses.replace(tallies[9])
    assert tallies[10].interruptions == 1 and tallies[0].interruptions == 0
    calls.clear()
    assert execute_all(plan, long + cut, "on_demand", "notice") == [execute(plan, t, "on_demand", "notice").tally
                                                                     for t in long + cut]
    assert calls == [UNINTERRUPTED]  # (the comparison's executions are the test's own, not counted)
