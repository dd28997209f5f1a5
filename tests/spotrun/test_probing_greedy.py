"""probing_greedy (spotrun/policy/decision.py): safe wherever on-demand could make the deadline, pure, and the
probe it adds over greedy pays on a trace where spot comes back after greedy committed to on-demand."""

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from spotrun.policy.decision import (
    RULES,
    Action,
    JobStatus,
    Market,
    Observation,
    ProbingGreedy,
    decide,
    od_finish_s,
    risk_s,
)
from spotrun.policy.engine import SimPlan
from spotrun.policy.execution import execute
from spotrun.policy.traces import TraceSpec, generated_traces

H = 3600.0


def _plan(deadline_h: float, work_h: float = 40.0) -> SimPlan:
    # the public traces' setting (docs/spot-policy.md): a 0.2 h changeover, spot at 0.35 of on-demand
    return SimPlan(work_s=work_h * H, startup_s=600, restore_s=60, save_s=60, interval_s=1800, step_s=10,
                   notice_ok=True, spot_usd_per_h=0.35, on_demand_usd_per_h=1.0, deadline_s=deadline_h * H)


def _on_demand_finish_s(plan: SimPlan) -> float:
    return execute(plan, [(math.inf, math.inf)], "on_demand", "notice").tally.t


def test_probing_greedy_meets_every_deadline_on_demand_could_meet_on_generated_traces():
    rng = random.Random(7)
    checked = 0
    for deadline_h, work_h in ((48, 40), (60, 40), (80, 40), (13, 10), (10.9, 10)):
        plan = _plan(deadline_h, work_h)
        assert _on_demand_finish_s(plan) <= plan.deadline_s  # on-demand from the start makes it
        for rate in (0.05, 0.5, 3.0):
            spec = TraceSpec(rate, plan.deadline_s + 100 * H, restart_wait_s=1800, burst_p=0.3,
                             droughts_per_day=0.5, drought_hours=(1.0, 30.0))
            for trace in generated_traces(spec, 40, seed=rng.randrange(10**6)):
                tally = execute(plan, trace, "probing_greedy", "notice").tally
                assert tally.finished and tally.t <= plan.deadline_s, (deadline_h, rate, trace[:5], tally)
                checked += 1
    assert checked == 5 * 3 * 40


observations = st.builds(
    Observation, elapsed_s=st.floats(0, 80 * H), committed_s=st.floats(0, 40 * H),
    market=st.sampled_from(Market), status=st.sampled_from(JobStatus), job_age_s=st.floats(0, 40 * H),
    spent_usd=st.floats(0, 100), max_wait_exceeded=st.booleans(), training_s=st.floats(0, 3600))


@settings(max_examples=300, deadline=None)
@given(obs=observations, deadline_h=st.sampled_from([48, 60, 80]))
def test_its_decision_is_a_pure_function_of_what_the_guard_sees(obs, deadline_h):
    plan = _plan(deadline_h)
    first = decide("probing_greedy", plan, "notice", obs)
    assert decide("probing_greedy", plan, "notice", obs) == first  # no state between calls
    rule = RULES["probing_greedy"]
    assert ProbingGreedy(rule.reserve, rule.stint_s, rule.keep)(plan, "notice", obs) == first


def test_a_probe_finds_spot_that_came_back_after_greedy_went_on_demand_for_good():
    plan = _plan(48)
    trace = [(12 * H, math.inf)]  # no capacity for 12 h, then capacity to the end
    greedy = execute(plan, trace, "deadline_greedy", "notice").tally
    probing = execute(plan, trace, "probing_greedy", "notice").tally
    for tally in (greedy, probing):
        assert tally.finished and tally.t <= plan.deadline_s
    assert greedy.spot_s == 0  # on-demand for good at ~7.5 h
    assert probing.spot_s > 20 * H  # back on spot at the first probe after 12 h
    cost = {name: t.spot_s * plan.spot_usd_per_h + t.od_s * plan.on_demand_usd_per_h
            for name, t in (("greedy", greedy), ("probing", probing))}
    assert cost["probing"] < 0.8 * cost["greedy"]


def test_a_failed_probe_goes_back_to_on_demand_once_the_slack_is_down_to_the_reserve():
    plan = _plan(48)
    trace = [(60 * H, math.inf)]  # no capacity within the deadline: every probe fails
    run = execute(plan, trace, "probing_greedy", "notice")
    assert run.tally.finished and run.tally.t <= plan.deadline_s
    assert run.tally.spot_s == 0
    probes = [j for j in run.jobs[1:] if j.market is Market.SPOT]
    assert probes and all(j.billed == 0 for j in probes)
    after = {id(job): nxt for job, nxt in zip(run.jobs, run.jobs[1:], strict=False)}
    assert all(after[id(j)].market is Market.ON_DEMAND for j in probes)


def test_the_reserve_shrinks_with_the_work_left():
    """Waiting for spot with the same slack (the risk plus 8 changeovers): at the start the reserve (32
    changeovers) is above it, so the run goes on-demand; with 1 h of the 40 left it is 2, so the run waits."""
    plan, rule = _plan(48), RULES["probing_greedy"]
    assert rule.reserve / 40 <= rule.keep + 1 < 8 < rule.reserve
    for committed, expected in ((0.0, Action.TO_ON_DEMAND), (39 * H, Action.KEEP)):
        slack = risk_s(plan, "notice") + 8 * plan.changeover_s
        elapsed = plan.deadline_s - od_finish_s(plan, "notice", committed) - slack
        obs = Observation(elapsed, committed, Market.SPOT, JobStatus.WAITING, job_age_s=elapsed)
        assert decide("probing_greedy", plan, "notice", obs).action is expected
