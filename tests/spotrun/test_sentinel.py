"""The sentinel (spotrun/policy/execution.py, `SentinelGreedy` in spotrun/policy/decision.py): a spot job kept
waiting beside an on-demand job bills spot seconds only while it has instances, the run leaves on-demand at the
first poll that sees it with instances, and the whole bill stays at or above the exact optimum."""

import contextlib
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spotrun.policy.decision import (
    RULES,
    SENTINEL_STOP_S,
    Action,
    Decision,
    JobStatus,
    Market,
    Observation,
    SentinelGreedy,
    decide,
)
from spotrun.policy.engine import SimPlan
from spotrun.policy.execution import Run, execute
from spotrun.policy.optimum import solve

H = 3600.0
RULE = SentinelGreedy(reserve=32.0, stint_s=1800.0, sentinel_poll_s=600.0)


def _plan(deadline_h: float, work_h: float = 40.0) -> SimPlan:
    # the public traces' setting (docs/spot-policy.md): a 0.2 h changeover, spot at 0.35 of on-demand
    return SimPlan(work_s=work_h * H, startup_s=600, restore_s=60, save_s=60, interval_s=1800, step_s=10,
                   notice_ok=True, spot_usd_per_h=0.35, on_demand_usd_per_h=1.0, deadline_s=deadline_h * H)


@contextlib.contextmanager
def _registered():
    RULES["_sentinel"] = RULE  # this test's parameters, registered for the test only
    try:
        yield "_sentinel"
    finally:
        del RULES["_sentinel"]


def _usd(plan: SimPlan, tally) -> float:
    return (tally.spot_s * plan.spot_usd_per_h + tally.od_s * plan.on_demand_usd_per_h) / H


def test_the_sentinels_bill_by_hand():
    """Created at 150 s, capacity in [100, 200) and [300, 1000): 50 s in the first window; stopped at 350 s, 50 s in
    the second and the stop's 120 s; stopped at 990 s, 690 s and the 10 s the window has left."""
    trace = [(100.0, 200.0), (300.0, 1000.0)]
    for stop_at, expected in ((250.0, 50.0), (350.0, 50.0 + 50.0 + SENTINEL_STOP_S), (990.0, 50.0 + 690.0 + 10.0),
                              (2000.0, 50.0 + 700.0)):
        run = Run(_plan(48), "notice", trace)
        run.start_sentinel(150.0)
        run.stop_sentinel(stop_at)
        assert run.sentinel_s == pytest.approx(expected), stop_at
        assert run.tally.spot_s == run.sentinel_s and run.sentinel_at is None
    run = Run(_plan(48), "notice", trace)
    run.stop_sentinel(500.0)  # no sentinel: nothing billed
    assert run.sentinel_s == 0.0 and run.sentinels == 0


def test_the_run_leaves_on_demand_at_the_first_poll_that_sees_spot():
    """Spot for 2 h, none until 20 h, then spot to the end: the run waits, goes on-demand, keeps a sentinel and
    goes back to spot within one of the sentinel's polls of 20 h; the sentinel bills that wait and the stop."""
    plan = _plan(60)
    trace = [(0.0, 2 * H), (20 * H, math.inf)]
    with _registered() as name:
        run = execute(plan, trace, name, "notice")
    assert run.tally.finished and run.tally.t <= plan.deadline_s
    assert [j.market for j in run.jobs] == [Market.SPOT, Market.ON_DEMAND, Market.SPOT]
    od, back = run.jobs[1], run.jobs[2]
    assert run.sentinels == 1
    assert SENTINEL_STOP_S < run.sentinel_s <= RULE.sentinel_poll_s + SENTINEL_STOP_S
    seen_at = 20 * H + run.sentinel_s - SENTINEL_STOP_S  # the poll that saw the sentinel with instances
    assert od.created < 20 * H <= seen_at <= back.created <= seen_at + 3 * plan.poll_s
    probing = execute(plan, trace, "probing_greedy", "notice").tally  # blind probes every 6 h on on-demand
    assert _usd(plan, run.tally) < _usd(plan, probing)


def test_a_sentinel_that_never_sees_spot_bills_nothing():
    plan = _plan(48)
    with _registered() as name:
        run = execute(plan, [(0.0, 1 * H), (70 * H, math.inf)], name, "notice")
    assert run.tally.finished and run.tally.t <= plan.deadline_s
    assert run.sentinels >= 1 and run.sentinel_s == 0.0  # it waited, unbilled, and was stopped waiting
    assert [j.market for j in run.jobs] == [Market.SPOT, Market.ON_DEMAND]


def test_the_rule_asks_for_a_sentinel_only_on_a_running_on_demand_job_with_room_for_a_switch():
    plan = _plan(60)
    od = Observation(10 * H, 5 * H, Market.ON_DEMAND, JobStatus.RUNNING, job_age_s=2 * H)
    decision = RULE(plan, "notice", od)
    assert decision.action is Action.KEEP and decision.sentinel and decision.recheck_s == RULE.sentinel_poll_s
    seen = Observation(10 * H, 5 * H, Market.ON_DEMAND, JobStatus.RUNNING, job_age_s=2 * H, spot_seen=True)
    assert RULE(plan, "notice", seen).action is Action.TO_SPOT
    young = Observation(10 * H, 5 * H, Market.ON_DEMAND, JobStatus.RUNNING, job_age_s=600.0)
    assert not RULE(plan, "notice", young).sentinel  # before the stint: no sentinel
    late = Observation(plan.deadline_s - 20 * H, 5 * H, Market.ON_DEMAND, JobStatus.RUNNING, job_age_s=2 * H)
    assert RULE(plan, "notice", late) == Decision(Action.KEEP)  # no room for a switch: on-demand to the end
    for market, status in ((Market.SPOT, JobStatus.RUNNING), (Market.SPOT, JobStatus.WAITING)):
        assert not RULE(plan, "notice", Observation(10 * H, 5 * H, market, status, job_age_s=2 * H)).sentinel
    assert "_sentinel" not in RULES and isinstance(RULES["probing_sentinel"], SentinelGreedy)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(seed=st.integers(0, 10**6), deadline_h=st.sampled_from([6.0, 8.0, 12.0]), gaps=st.integers(1, 8))
def test_never_below_the_exact_optimum_and_never_late_where_on_demand_is_on_time(seed, deadline_h, gaps):
    """Random traces (4 h of work): the sentinel's run, its bills included, finishes by the deadline and costs at
    least the exact optimum (which sees capacity for free)."""
    rng, plan = random.Random(seed), _plan(deadline_h, work_h=4.0)
    t, trace = 0.0, []
    for _ in range(gaps):
        down, up = rng.uniform(0, 3 * H), rng.uniform(60.0, 3 * H)
        trace.append((t + down, t + down + up))
        t += down + up
    trace.append((t + rng.uniform(0, 5 * H), math.inf) if rng.random() < 0.5 else (math.inf, math.inf))
    with _registered() as name:
        run = execute(plan, trace, name, "notice")
        first = decide(name, plan, "notice", Observation(0.0, 0.0, Market.SPOT, JobStatus.NONE))
    assert run.tally.finished and run.tally.t <= plan.deadline_s, trace
    best = solve(plan, trace)
    assert best.exact and best.usd is not None
    assert best.usd <= _usd(plan, run.tally) * (1 + 1e-9), (trace, run.sentinel_s)
    assert first.action is Action.START_SPOT


def test_a_slower_sentinel_is_seen_later_and_billed_from_the_capacity():
    """SageMaker taking 15 min from capacity to Downloading (`sentinel_lag_s`): the run leaves on-demand no
    sooner than 15 min after spot came back, and the sentinel bills from the capacity, not from when it was seen;
    a dearer stop bills what it is told."""
    plan, trace, lag, stop = _plan(60), [(0.0, 2 * H), (20 * H, math.inf)], 900.0, 300.0
    with _registered() as name:
        run = execute(plan, trace, name, "notice", sentinel_lag_s=lag, sentinel_stop_s=stop)
    assert run.tally.finished and run.tally.t <= plan.deadline_s
    assert lag + stop <= run.sentinel_s <= lag + RULE.sentinel_poll_s + stop
    assert run.jobs[-1].market is Market.SPOT and run.jobs[-1].created >= 20 * H + lag
