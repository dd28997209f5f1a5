"""The spot-policy simulator against closed forms (fixed seeds, 1,000 generated traces), hand-made traces, the
guard's decision function, the recorded-trace reader and the estimate's policy section."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from types import SimpleNamespace

import pytest

from spotrun.contract.spec import RunValidationError, parse_run
from spotrun.policy import compare, simulate
from spotrun.policy.engine import INF, SimPlan
from spotrun.policy.policies import decide_next_segment
from spotrun.policy.traces import (
    TraceSpec,
    advisor_rate,
    generated_traces,
    read_availability,
    recorded_traces,
    windows_from_counts,
)
from spotrun.seams import SpotPolicy

H = 3600.0


def _plan(**kw) -> SimPlan:
    base = dict(work_s=40 * H, startup_s=600.0, restore_s=60.0, save_s=60.0, interval_s=1800.0, step_s=10.0,
                notice_ok=True, spot_usd_per_h=0.35, on_demand_usd_per_h=1.0, max_wait_s=60 * H,
                max_runtime_s=80 * H, deadline_s=60 * H)
    if kw.get("deadline_s", 1) is None:  # the closed forms: no SageMaker limits
        base.update(max_wait_s=INF, max_runtime_s=INF)
    return SimPlan(**{**base, **kw})


# ---- closed forms -------------------------------------------------------------------------------------------


def _mod_mean(lam: float, cycle: float) -> float:
    """E[X mod T] for X ~ Exp(lam): where in its save cycle a Poisson interruption lands."""
    return 1 / lam - cycle / math.expm1(lam * cycle)


def test_time_lost_per_interruption_with_periodic_saves_is_the_closed_form():
    # Saves block for s every I of work: an interruption loses the wall time since the last completed save.
    # Closed form E[X mod (I+s)] (memoryless interruptions, each job restarting a fresh cycle); to first order
    # (I+s)/2: half the interval plus half the save (a save that blocks; one that uploads in the background
    # would lose I/2 + s).
    lam, interval, save = 0.5 / H, 1800.0, 120.0
    plan = _plan(work_s=500 * H, startup_s=0.0, restore_s=0.0, save_s=save, interval_s=interval,
                 notice_ok=False, deadline_s=None)
    traces = generated_traces(TraceSpec(lam * H, horizon_s=2000 * H, restart_wait_s=0.0), 1000, seed=1)
    tallies = simulate(plan, traces, "spot", "periodic")
    n = sum(t.interruptions for t in tallies)
    assert n > 100_000
    measured = sum(t.lost_wall_s for t in tallies) / n
    assert measured == pytest.approx(_mod_mean(lam, interval + save), rel=0.05)
    # Work lost (progress, not the save in progress): E[min(X mod T, I)].
    cycle = interval + save
    p_in_save = (math.exp(-lam * interval) - math.exp(-lam * cycle)) / -math.expm1(-lam * cycle)
    in_work = (1 / lam * (1 - math.exp(-lam * interval) * (1 + lam * interval))) / -math.expm1(-lam * cycle)
    assert sum(t.lost_s for t in tallies) / n == pytest.approx(in_work + interval * p_in_save, rel=0.05)


def test_time_lost_at_a_low_rate_is_half_the_interval_plus_half_the_save():
    lam, interval, save = 0.02 / H, 1800.0, 120.0
    plan = _plan(work_s=500 * H, startup_s=0.0, restore_s=0.0, save_s=save, interval_s=interval,
                 notice_ok=False, deadline_s=None)
    traces = generated_traces(TraceSpec(lam * H, horizon_s=2000 * H, restart_wait_s=0.0), 1000, seed=2)
    tallies = simulate(plan, traces, "spot", "periodic")
    n = sum(t.interruptions for t in tallies)
    assert n > 5000
    assert sum(t.lost_wall_s for t in tallies) / n == pytest.approx((interval + save) / 2, rel=0.05)


def _daly_wall(work: float, interval: float, save: float, restart: float, lam: float) -> float:
    """Expected wall time with checkpoints every `interval` of work (Daly 2006, exact for Poisson failures with a
    restart of `restart` after each, failures possible during restarts): the first start, n - 1 save cycles, the
    last cycle without a save."""
    n = round(work / interval)
    per = math.exp(lam * restart) / lam
    return math.expm1(lam * restart) / lam + (n - 1) * per * math.expm1(lam * (interval + save)) + \
        per * math.expm1(lam * interval)


def test_wall_time_and_the_young_daly_interval_are_reproduced():
    lam, save, restart, work = 0.1 / H, 180.0, 300.0, 200 * H
    young = math.sqrt(2 * save / lam)  # sqrt(2 C MTBI) = 3,600 s
    factors = (0.5, 0.7, 1.0, 1.4, 2.0)
    traces = generated_traces(TraceSpec(lam * H, horizon_s=2000 * H, restart_wait_s=0.0), 1000, seed=3)
    walls = []
    for f in factors:
        interval = work / round(work / (young * f))
        plan = _plan(work_s=work, startup_s=restart, restore_s=0.0, save_s=save, interval_s=interval,
                     notice_ok=False, deadline_s=None)
        tallies = simulate(plan, traces, "spot", "periodic")
        walls.append(sum(t.t for t in tallies) / len(tallies))
        assert walls[-1] == pytest.approx(_daly_wall(work, interval, save, restart, lam), rel=0.05)
    assert min(range(len(factors)), key=walls.__getitem__) == factors.index(1.0)
    # The vertex of a parabola through the simulated walls (in log interval) is Young/Daly's interval.
    xs = [math.log(f) for f in factors]
    import numpy as np

    a, b, _ = np.polyfit(xs, walls, 2)
    assert math.exp(-b / (2 * a)) == pytest.approx(1.0, rel=0.05)


# ---- policies on hand-made traces ------------------------------------------------------------------------------


def test_on_demand_and_uninterrupted_spot_cost_the_work_its_saves_and_one_startup():
    plan = _plan()
    billed = plan.startup_s + plan.work_s + (math.ceil(plan.work_s / plan.interval_s) - 1) * plan.save_s
    od = simulate(plan, [[(0.0, INF)]], "on_demand", "both")[0]
    sp = simulate(plan, [[(0.0, INF)]], "spot", "both")[0]
    assert (od.od_s, od.spot_s, od.t) == (pytest.approx(billed), 0.0, pytest.approx(billed))
    assert (sp.spot_s, sp.od_s, sp.interruptions) == (pytest.approx(billed), 0.0, 0)


def test_a_drought_makes_maxwait_miss_the_deadline_and_uniform_progress_meet_it():
    plan = _plan()  # 40 h of work, 60 h deadline, MaxWait 60 h
    trace = [(0.0, 5 * H), (70 * H, INF)]  # five hours of spot, then a 65 h drought
    rows = {r.policy: r for r in compare(plan, [trace], [("maxwait_fallback", "notice"),
                                                          ("uniform_progress", "notice"),
                                                          ("on_demand", "notice")])}
    assert rows["maxwait_fallback"].p_deadline == 0.0
    assert rows["uniform_progress"].p_deadline == 1.0
    assert rows["uniform_progress"].mean_usd < rows["on_demand"].mean_usd


def test_notice_saves_lose_only_the_step_in_progress_and_periodic_ones_the_work_since_the_last_save():
    plan = _plan(startup_s=0.0, restore_s=0.0, deadline_s=None)
    trace = [(0.0, 2500.0), (2600.0, INF)]  # interrupted 2,500 s in: 700 s after the first save (1,800 + 60)
    notice = simulate(plan, [trace], "spot", "notice")[0]
    periodic = simulate(plan, [trace], "spot", "periodic")[0]
    assert notice.lost_s == pytest.approx(2500.0 % plan.step_s)
    assert periodic.lost_s == pytest.approx(2500.0 - 1860.0)
    failed = simulate(_plan(startup_s=0.0, restore_s=0.0, deadline_s=None, notice_ok=False), [trace], "spot",
                      "notice")[0]
    assert failed.lost_s == pytest.approx(2500.0)  # the checkpoint cannot leave within the notice


def test_hysteresis_keeps_uniform_progress_from_flapping_between_on_demand_and_spot(monkeypatch):
    # Spot comes back for 20 minutes every 2 hours, checked every 10 minutes on on-demand: a literal Uniform
    # Progress (no hysteresis) leaves on-demand each time it is ahead and pays a changeover each time.
    import spotrun.policy.policies as policies

    plan = _plan(deadline_s=50 * H, od_check_s=600.0)
    trace = [(0.0, 1.0)] + [(k * 2 * H, k * 2 * H + 1200.0) for k in range(1, 60)] + [(200 * H, INF)]

    def run(hysteresis):
        monkeypatch.setattr(policies, "HYSTERESIS_CHANGEOVERS", hysteresis)
        tally = simulate(plan, [trace], "uniform_progress", "notice")[0]
        assert tally.finished and tally.t <= plan.deadline_s
        return tally.switches, tally.spot_s / H * plan.spot_usd_per_h + tally.od_s / H * plan.on_demand_usd_per_h

    (switches, cost), (literal_switches, literal_cost) = run(4.0), run(0.0)
    assert literal_cost > simulate(plan, [trace], "on_demand", "notice")[0].od_s / H  # costlier than on-demand
    assert literal_switches > 40 and switches < literal_switches / 3 and cost < literal_cost


# ---- the guard's decision ------------------------------------------------------------------------------------


@pytest.mark.parametrize("progress_h, now_h, on_demand_now, spot_available, expected", [
    (10, 10, False, True, "spot"),        # behind the line but spot is there: spot
    (10, 5, False, False, "wait"),        # ahead, no spot: wait for it
    (10, 20, False, False, "on_demand"),  # behind, no spot: on-demand
    (17.5, 25.5, True, True, "on_demand"),  # on-demand, 0.4 h ahead: stays (hysteresis: 4 changeovers)
    (30, 25, True, True, "spot"),         # on-demand, well ahead, spot back: return to spot
    (30, 25, True, False, "on_demand"),   # ... but not while spot is gone
    (5, 50, False, True, "on_demand"),    # slack gone: the safety net
])
def test_decide_next_segment(progress_h, now_h, on_demand_now, spot_available, expected):
    plan = _plan()  # 40 h of work by 60 h: the line asks 2/3 h of work per hour
    assert decide_next_segment(progress_h * H, now_h * H, plan, on_demand_now=on_demand_now,
                               spot_available=spot_available) == expected


@pytest.mark.parametrize("progress_h, now_h, on_demand_now, spot_available, expected", [
    # 40 h of work by 60 h, saving every 30 min: the slack at the start is 18.3 h, the reserve 0.2 + 1.83 h
    (10, 20, False, False, "wait"),       # behind the line, but 8.8 h of slack is above the reserve: wait
    (10, 27, False, False, "on_demand"),  # the slack (1.8 h) fell under the reserve: on-demand
    (10, 27, True, True, "spot"),         # on-demand, spot back, the slack pays a changeover + hysteresis: return
    (10, 28, True, True, "on_demand"),    # ... but not once it does not (0.8 h)
])
def test_slack_reserve_decides_on_slack_not_on_the_line(progress_h, now_h, on_demand_now, spot_available, expected):
    from spotrun.policy.policies import RESERVES

    rule = RESERVES["slack_reserve_10"]
    assert decide_next_segment(progress_h * H, now_h * H, _plan(), on_demand_now=on_demand_now,
                               spot_available=spot_available, rule=rule) == expected


# ---- traces ----------------------------------------------------------------------------------------------------


def test_spot_traces_files_become_windows_and_replay_wraps_around(tmp_path):
    path = tmp_path / "us-test-1a_v100_1.json"
    path.write_text(json.dumps({"metadata": {"gap_seconds": 300}, "data": [1, 1, 0, 0, 1, 2, 0, 1]}))
    rec = read_availability(path)
    assert rec.windows == [(0.0, 600.0), (1200.0, 1800.0), (2100.0, 2400.0)]
    assert rec.available_fraction == pytest.approx(5 / 8)
    assert windows_from_counts([1, 1, 0, 0, 1, 2, 0, 1], 300, instances=2) == [(1500.0, 1800.0)]
    (trace,) = recorded_traces([rec], 1, horizon_s=5000.0, seed=0)
    assert trace[-1][1] == INF and all(b <= a2 for (_, b), (a2, _) in zip(trace, trace[1:], strict=False))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"data": [1]}))
    with pytest.raises(ValueError, match="gap_seconds"):
        read_availability(bad)


def test_generated_traces_have_the_rate_bursts_and_droughts_asked_for():
    spec = TraceSpec(0.5, horizon_s=1000 * H, restart_wait_s=60.0)
    traces = generated_traces(spec, 200, seed=5)
    ends = sum(len(t) - 1 for t in traces)
    assert ends / (200 * 1000) == pytest.approx(0.5, rel=0.05)
    dry = generated_traces(TraceSpec(0.0, horizon_s=1000 * H, droughts_per_day=0.5), 200, seed=6)
    gaps = [a2 - b for t in dry for (_, b), (a2, _) in zip(t, t[1:], strict=False)]
    assert gaps and 6 * H <= min(gaps) and max(gaps) <= 80 * H * 2
    assert advisor_rate("<5%") == pytest.approx(-math.log(0.975) / 730)
    with pytest.raises(ValueError, match="band"):
        advisor_rate("5%")


# ---- the estimate ------------------------------------------------------------------------------------------------


RUN = {"version": 1, "name": "p", "model": {"parameters": 1_000_000_000},
       "data": {"tokens": 2_000_000_000, "seq_len": 2048}, "budget": {"max_usd": 1_000_000},
       "compute": {"instance_type": "ml.g5.xlarge", "on_demand_fallback": True}}


def test_deadline_hours_is_optional_and_checked():
    assert parse_run(RUN).compute.deadline_s is None
    # hours in the run, seconds past the contract
    assert parse_run({**RUN, "compute": {**RUN["compute"], "deadline_hours": 48}}).compute.deadline_s == 48 * H
    with pytest.raises(RunValidationError, match="compute.deadline_hours"):
        parse_run({**RUN, "compute": {**RUN["compute"], "deadline_hours": -1}})


def test_the_estimate_chooses_the_cheapest_policy_meeting_the_deadline_and_states_its_odds():
    from spotrun.planner.estimate import estimate, load_catalog
    from spotrun.policy.choose import policy_text, spot_policy

    run = parse_run(RUN)
    est = estimate(run)
    hours = est.wall_seconds / H
    with_deadline = parse_run({**RUN, "compute": {**RUN["compute"], "deadline_hours": round(hours * 1.5, 1)}})
    section = spot_policy(with_deadline, est, load_catalog(), n=300).section
    rows = {r["label"]: r for r in section.policies}
    chosen = rows[section.chosen]
    assert chosen["p_deadline"] >= 0.99
    assert all(r["mean_usd"] >= chosen["mean_usd"] for r in rows.values() if r["p_deadline"] >= 0.99)
    assert chosen["mean_usd"] <= rows["on_demand"]["mean_usd"]
    assert {"uniform_progress (notice)", "slack_reserve_10 (notice)", "maxwait_fallback (periodic)"} <= set(rows)
    text = policy_text(section)
    assert section.chosen in text and "P(deadline)" in text
    from spotrun.policy.decision import DEADLINE_RULES, Action, JobStatus, Market, Observation, decide_from_section

    # as the plan carries it through Step Functions
    section = SpotPolicy.from_json(json.loads(json.dumps(section.to_json(), allow_nan=False)))
    start = decide_from_section(section, Observation(0.0, 0.0, Market.SPOT, JobStatus.NONE))
    assert start.action in (Action.START_SPOT, Action.START_ON_DEMAND)
    # Nothing done at the deadline, spot waiting for capacity: every deadline policy goes on-demand, whichever the
    # estimate chose (at 1.5x the work the MaxWait fallback may meet the deadline on 99% of the traces and be chosen).
    late = Observation(with_deadline.compute.deadline_s, 0.0, Market.SPOT, JobStatus.WAITING)
    for policy in DEADLINE_RULES:
        assert decide_from_section(dataclasses.replace(section, policy=policy), late).action is \
            Action.TO_ON_DEMAND, policy
    free = spot_policy(run, est, load_catalog(), n=300).section
    assert free.confidence is None
    assert free.chosen == min((r for r in free.policies if r["p_finished"] >= 0.99),
                                 key=lambda r: r["mean_usd"])["label"]
    asked = spot_policy(parse_run({**RUN, "compute": {**RUN["compute"], "spot": False}}), est,
                        load_catalog(), n=50).section
    assert asked.chosen == "on_demand" and "compute.spot=false" in asked.why


def test_local_trace_replay_turns_each_loss_of_capacity_into_an_injected_interruption(tmp_path):
    from spotrun.cli.local import trace_interrupts
    from spotrun.cli.main import build_parser
    from spotrun.local.pipeline import InterruptAt

    path = tmp_path / "trace.json"  # up 2 h, down 1 h, up 1 h, down, up to the end
    path.write_text(json.dumps({"metadata": {"gap_seconds": 3600}, "data": [1, 1, 0, 1, 0, 1]}))
    assert trace_interrupts(path, 3600.0) == (InterruptAt(seconds=2.0), InterruptAt(seconds=3.0))
    args = build_parser().parse_args(["local", "run.json", "--trace", str(path), "--trace-speedup", "1800"])
    assert trace_interrupts(args.trace, args.trace_speedup)[0] == InterruptAt(seconds=4.0)
    with pytest.raises(ValueError, match="--trace-speedup"):
        trace_interrupts(path, 0.0)


def test_the_estimate_lambdas_plan_carries_the_chosen_policy_and_its_odds():
    from moto import mock_aws

    from spotrun.pipeline.plan import plan

    from .pipeline_inputs import SETTINGS as settings
    from .pipeline_inputs import tiny_run

    run = tiny_run(deadline_hours=1.5)  # a minute of work: spot alone finds capacity within 1.5 h on < 99% of traces
    with mock_aws():
        import boto3

        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="art-bucket")
        out = plan(run, "exec-1", settings, s3_client=s3)
    section = out["estimate"]["spot_policy"]
    assert out["status"] == "ok" and section["sim_plan"]["deadline_s"] == 1.5 * H and section["traces"] == 1000
    chosen = next(r for r in section["policies"] if r["label"] == section["chosen"])
    assert chosen["p_deadline"] >= 0.99 and "deadline" in section["why"]
    # Without the fallback no policy may go on-demand (the guard could not execute it): the odds say so.
    run["compute"]["on_demand_fallback"] = False
    with mock_aws():
        import boto3

        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="art-bucket")
        spot_only = plan(run, "exec-2", settings, s3_client=s3)["estimate"]["spot_policy"]
    assert all(r["policy"] != "on_demand" for r in spot_only["policies"])
    assert max(r["p_deadline"] for r in spot_only["policies"]) < 0.99 and "no policy meets" in spot_only["why"]


def test_the_recorders_interruptions_become_gaps_and_resampled_traces():
    from spotrun.planner.measured import interruption_item
    from spotrun.policy.traces import interruption_gaps, resampled_traces

    def event(job, epoch):  # what the recorder writes for a real SageMaker state-change event
        return interruption_item({"TrainingJobName": job, "SecondaryStatus": "Interrupted",
                                  "ResourceConfig": {"InstanceType": "ml.g5.xlarge", "InstanceCount": 1},
                                  "SecondaryStatusTransitions": [{"Status": "Interrupted", "StartTime": epoch}]},
                                 "")

    items = [event("a", 1000), event("a", 4600), event("a", 8200), event("b", 50), {"pk": "b", "sk": "USAGE",
                                                                                    "kind": "usage"}]
    assert interruption_gaps(items) == [3600.0, 3600.0]
    assert interruption_gaps(items, "ml.p5.48xlarge") == []
    (trace,) = resampled_traces([3600.0], 1, 10 * H, restart_wait_s=0.0)
    assert trace[:2] == [(0.0, 3600.0), (3600.0, 7200.0)] and trace[-1][1] == INF
    with pytest.raises(ValueError, match="no recorded gaps"):
        resampled_traces([], 1, H)


def test_spotrun_simulate_writes_the_table_json_and_plot_for_generated_and_recorded_traces(tmp_path, capsys):
    from spotrun.cli.main import main
    from spotrun.planner.estimate import estimate

    run = tmp_path / "run.json"
    hours = round(1.5 * estimate(parse_run(RUN)).wall_seconds / H, 1)
    run.write_text(json.dumps({**RUN, "compute": {**RUN["compute"], "deadline_hours": hours}}))
    assert main(["simulate", str(run), "--n", "50", "--out", str(tmp_path / "gen"), "--band", "15-20%", "--plot"]) == 0
    text = capsys.readouterr().out
    assert "optimum meeting the deadline" in text and "chosen: " in text and "Advisor band 15-20%" in text
    report = json.loads((tmp_path / "gen" / "simulate.json").read_text())
    assert report["traces"] == 50 and report["optimum"]["mean_usd"] <= min(
        r["mean_usd"] for r in report["policies"] if r["p_deadline"] == 1.0) * (1 + 1e-9)
    assert (tmp_path / "gen" / "simulate.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "zone-a_v100_1.json").write_text(json.dumps({"metadata": {"gap_seconds": 600},
                                                          "data": ([1] * 30 + [0] * 12) * 40}))
    assert main(["simulate", str(run), "--n", "20", "--traces", str(traces), "--out", str(tmp_path / "rec"),
                 "--no-optimum", "--policy", "uniform_progress", "--policy", "on_demand"]) == 0
    rec = json.loads((tmp_path / "rec" / "simulate.json").read_text())
    assert {r["policy"] for r in rec["policies"]} == {"uniform_progress", "on_demand"}
    assert "1 recorded trace from" in rec["source"] and "optimum" not in rec
    assert main(["simulate", str(run), "--traces", str(tmp_path / "gen")]) == 2  # no trace files there


def test_spotrun_simulate_refuses_a_policy_the_run_cannot_take(tmp_path, capsys):
    """`--policy on_demand` on a run without the fallback printed spot's figures labelled on_demand; a deadline
    policy without a deadline printed maxwait's: each is refused in one line naming what the run can take."""
    from spotrun.cli.main import main

    run = tmp_path / "run.json"
    run.write_text(json.dumps({**RUN, "compute": {**RUN["compute"], "on_demand_fallback": False}}))
    for policy, needs in (("on_demand", "compute.on_demand_fallback=true"), ("uniform_progress",
                                                                            "compute.deadline_hours")):
        assert main(["simulate", str(run), "--n", "5", "--no-optimum", "--policy", policy,
                     "--out", str(tmp_path / policy)]) == 2
        err = capsys.readouterr().err
        assert f"--policy={policy} is not a policy this run can take" in err and needs in err, err
        assert "expected one of maxwait_fallback" in err and not (tmp_path / policy).exists()


@pytest.mark.parametrize("policy", ["on_demand", "spot", "maxwait_fallback", "uniform_progress", "deadline_greedy",
                                    "slack_reserve_10"])
def test_every_policy_keeps_the_books_on_arbitrary_traces(policy):
    from hypothesis import given, settings
    from hypothesis import strategies as st

    ups = st.lists(st.tuples(st.floats(1.0, 20 * H), st.floats(0.0, 30 * H)), min_size=0, max_size=12)

    @settings(max_examples=60, deadline=None, derandomize=True)
    @given(ups=ups, notice=st.booleans(), ck=st.sampled_from(["notice", "periodic", "both"]),
           deadline=st.one_of(st.none(), st.floats(5 * H, 200 * H)))
    def check(ups, notice, ck, deadline):
        t, trace = 0.0, []
        for up, down in ups:
            trace.append((t, t + up))
            t += up + down
        trace.append((t, INF))
        plan = _plan(work_s=10 * H, notice_ok=notice, deadline_s=deadline, max_wait_s=INF, max_runtime_s=INF)
        tally = simulate(plan, [trace], policy, ck)[0]
        billed = tally.spot_s + tally.od_s
        assert tally.finished and tally.progress == pytest.approx(plan.work_s)
        assert billed >= plan.work_s + tally.lost_s - 1e-6  # every second of work, kept or lost, was billed
        assert tally.t >= billed - 1e-6  # one job at a time
        assert tally.lost_s >= 0 and tally.interruptions <= len(ups)
        if policy == "on_demand":
            assert tally.spot_s == 0 and tally.interruptions == 0

    check()


def test_without_a_deadline_a_policy_stopped_unfinished_at_maxruntime_is_not_chosen():
    from spotrun.policy.choose import choose

    plan = _plan(deadline_s=None, max_runtime_s=20 * H, max_wait_s=100 * H)
    # spot's training time reaches MaxRuntime before the work is done: the guard ends the run there (a job ran to
    # the run's longest MaxRuntime without finishing)
    trace = [(0.0, 15 * H), (30 * H, INF)]
    rows = compare(plan, [trace], [("maxwait_fallback", "notice"), ("on_demand", "notice")])
    by = {r.policy: r for r in rows}
    assert by["maxwait_fallback"].p_finished == 0.0 and by["maxwait_fallback"].mean_usd < by["on_demand"].mean_usd
    best, why = choose(plan, rows)
    assert best.policy == "on_demand" and "finish" in why


def test_spotrun_simulate_resamples_the_interruption_tables_scan(tmp_path, capsys):
    from spotrun.cli.main import main

    run = tmp_path / "run.json"
    run.write_text(json.dumps(RUN))
    scan = {"Items": [{"pk": {"S": "job-a"}, "sk": {"S": f"INTERRUPTED#{t}"}, "kind": {"S": "interruption"},
                       "instance_type": {"S": "ml.g5.xlarge"}} for t in (0, 7200, 10800)]}
    (tmp_path / "scan.json").write_text(json.dumps(scan))
    assert main(["simulate", str(run), "--n", "20", "--interruptions", str(tmp_path / "scan.json"), "--no-optimum",
                 "--out", str(tmp_path / "out"), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["source"] == ("resampled from 2 recorded gaps between interruptions; only 2: every trace repeats "
                                "them, so the odds say little until more runs are recorded")
    spot = next(r for r in report["policies"] if r["label"] == "maxwait_fallback (notice)")
    assert spot["mean_interruptions"] > 1
    (tmp_path / "empty.json").write_text("[]")
    assert main(["simulate", str(run), "--interruptions", str(tmp_path / "empty.json"), "--no-optimum",
                 "--out", str(tmp_path / "out")]) == 2


def test_the_estimate_simulates_fewer_traces_for_a_long_run_at_a_high_rate():
    from spotrun.policy.choose import N_TRACES, traces_for_estimate

    assert traces_for_estimate(_plan(work_s=10 * H), 0.1) == N_TRACES
    fewer = traces_for_estimate(_plan(work_s=100 * H), 1.35)
    assert 100 < fewer < N_TRACES
    assert 1 <= traces_for_estimate(_plan(work_s=1000 * H), 1.35) < fewer


@pytest.mark.parametrize("work_days, rate", [(28, 10.0), (60, 10.0), (28, 0.0), (1, 10.0)])
def test_the_estimates_simulation_is_bounded_for_any_run_the_contract_accepts(work_days, rate):
    """The Lambda's time goes by the windows generated and replayed: at most about WINDOW_BUDGET (one trace of
    the longest run at the contract's highest rate, 10 per hour, fits), whatever the run's length."""
    from spotrun.policy.choose import ESTIMATE_TRACES, WINDOW_BUDGET, horizon_s, traces_for_estimate

    plan = _plan(work_s=work_days * 24 * H, deadline_s=None, max_wait_s=28 * 24 * H, max_runtime_s=28 * 24 * H)
    n = traces_for_estimate(plan, rate)
    traces = generated_traces(TraceSpec(rate, horizon_s(plan), **ESTIMATE_TRACES), n, seed=0)
    assert sum(len(t) for t in traces) <= 1.2 * WINDOW_BUDGET


def test_with_a_cap_between_spot_and_on_demand_the_chosen_policy_is_simulated_as_the_segment_chain_within_it():
    """The spot-policy page's example: llama3-8b-full with budget.max_usd 200 runs as a chain of segments (its
    first job's MaxRuntime is not the run's), and no policy whose runs the guard ends at the cap is chosen."""
    from pathlib import Path

    from spotrun.planner.estimate import estimate, load_catalog
    from spotrun.policy.choose import spot_policy

    doc = json.loads((Path(__file__).parents[2] / "examples/runs/llama3-8b-full.json").read_text())
    doc["budget"]["max_usd"] = 200
    run = parse_run(doc)
    est = estimate(run)
    assert est.segments.segments > 1 and est.segments.fits  # the cap sits between spot and on-demand
    # on the estimate's 1,000 traces, as the page's example runs: on 200 (one trace is half a point) the chosen
    # maxwait_fallback's share finishing read 98.5% on ESTIMATE_CHAIN, 99.2% on 1,000
    section = spot_policy(run, est, load_catalog()).section
    rows = {r["label"]: r for r in section.policies}
    chosen = rows[section.chosen]
    assert chosen["p95_usd"] <= 200 and chosen["p_finished"] >= 0.99
    # on-demand would pass the cap: the guard ends its runs at it, unfinished (spotrun/policy/execution.py `Cap`)
    assert rows["on_demand"]["p95_usd"] <= 200 and rows["on_demand"]["p_finished"] < 0.99, rows["on_demand"]
    # the chain's expected bill, as the planner states it, is what the simulator finds for plain spot
    assert chosen["mean_usd"] == pytest.approx(est.segments.spot_cost_usd, rel=0.1)


def test_a_deadline_no_policy_can_meet_is_a_warning_of_the_estimate():
    from spotrun.planner.estimate import estimate, load_catalog
    from spotrun.policy.choose import spot_policy

    est = estimate(parse_run(RUN))
    hours = est.wall_seconds / H
    deadline_hours = round(hours * 0.5, 2)
    run = parse_run({**RUN, "compute": {**RUN["compute"], "deadline_hours": deadline_hours}})
    before = list(est.warnings)
    choice = spot_policy(run, est, load_catalog(), n=50)
    assert any(w.startswith(f"compute.deadline_hours={deadline_hours:g}: no policy meets it")
               for w in choice.warnings), choice.warnings
    assert est.warnings == before  # returned for the estimate step to combine: the estimate is not changed
    feasible = spot_policy(parse_run({**RUN, "compute": {**RUN["compute"], "deadline_hours": round(hours * 2, 1)}}),
                           estimate(parse_run(RUN)), load_catalog(), n=50)
    assert not any("no policy meets it" in w for w in feasible.warnings)
    # Without the fallback on-demand is no candidate: the warning names spot's odds and the setting that helps,
    # not an on-demand time the run may not take (a deadline on-demand meets read "would miss it")
    spot_only = spot_policy(parse_run({**RUN, "compute": {**RUN["compute"], "on_demand_fallback": False,
                                                          "deadline_hours": round(hours * 1.1, 2)}}),
                            estimate(parse_run(RUN)), load_catalog(), n=50)
    missed = [w for w in spot_only.warnings if "no policy meets it" in w]
    assert missed and "on spot alone" in missed[0] and "compute.on_demand_fallback=true" in missed[0], missed
    assert "on-demand from the start" not in missed[0]


@pytest.mark.parametrize("example", ["qwen2-0.5b-full-small.json", "mistral-7b-lora.json"])
def test_spotrun_simulate_prints_a_run_without_on_demand_fallback(example, tmp_path, capsys):
    """Without compute.on_demand_fallback no on-demand row is simulated: its 'vs OD' column is '-', in text and
    JSON alike (the shipped examples and the demo's run leave the fallback off)."""
    from pathlib import Path

    from spotrun.cli.main import main

    run = Path(__file__).resolve().parents[2] / "examples" / "runs" / example
    assert main(["simulate", str(run), "--n", "20", "--no-optimum", "--out", str(tmp_path / "t")]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if "maxwait_fallback" in line]
    table = [line for line in rows if not line.startswith(("chosen", "as `spotrun estimate`", "  sentinel:",
                                                            "  the cap to set:", "  a larger cap bills less"))]
    # (the study's rows: not the estimate's settings lines under them)
    assert table and all(line.split()[-2] == "-" for line in table)
    assert main(["simulate", str(run), "--n", "20", "--no-optimum", "--format", "json",
                 "--out", str(tmp_path / "j")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert all(r["label"] != "on_demand" for r in doc["policies"])


def test_the_executions_work_is_bounded_by_its_windows_and_decisions_not_by_the_runs_length(monkeypatch):
    """27 days of work saving every 30 min (1,295 saves) in one capacity window: a handful of events, not one per
    save, and the bill is the closed form (startup, work, saves)."""
    from spotrun.policy import execution

    events = []
    real = execution.Run._event
    monkeypatch.setattr(execution.Run, "_event", lambda self, job, until: events.append(1) or real(self, job, until))
    work = 27 * 24 * H
    plan = _plan(work_s=work, deadline_s=None, interval_s=1800.0)
    run = execution.execute(plan, [(0.0, INF)], "maxwait_fallback", "periodic")
    saves = math.ceil(work / 1800.0) - 1
    assert run.tally.finished and run.tally.spot_s == pytest.approx(600.0 + work + saves * 60.0, rel=1e-12)
    assert len(events) < 20


def test_simulate_draws_a_progress_bar_on_stderr_only_once_it_has_taken_two_seconds():
    import io

    from spotrun.cli.simulate import PROGRESS_AFTER_S, Progress

    class Terminal(io.StringIO):  # the bar is drawn on a terminal only (tests/spotrun/test_traces_input.py)
        def isatty(self) -> bool:
            return True

    quick = Progress(Terminal())
    quick("policies", 10, 10)
    assert quick.stream.getvalue() == "" and not quick.shown
    slow = Progress(Terminal())
    slow.t0 -= PROGRESS_AFTER_S + 1
    slow("exact optimum", 250, 1000)
    slow("exact optimum", 1000, 1000)
    drawn = slow.stream.getvalue()
    assert drawn.startswith("\rexact optimum [#######.......................] 250/1,000")
    assert drawn.endswith("[" + "#" * Progress.WIDTH + "] 1,000/1,000\n")


def test_without_a_deadline_when_no_policy_finishes_on_the_confidence_the_reason_says_so_with_the_odds():
    from spotrun.policy.choose import CONFIDENCE, choose

    plan = _plan(deadline_s=None, max_runtime_s=20 * H, max_wait_s=100 * H)
    finishing, stranded = [(0.0, INF)], [(0.0, 15 * H), (30 * H, INF)]  # the second reaches MaxRuntime unfinished
    rows = compare(plan, [finishing, stranded], [("maxwait_fallback", "notice")])
    assert rows[0].p_finished == 0.5 < CONFIDENCE
    best, why = choose(plan, rows)
    assert why.startswith(f"no deadline, and no policy finishes on >= {CONFIDENCE:.0%}") and "(50.0%" in why
    assert "policies that finish on" not in why  # the old wording claimed what the odds deny


GUARD_EPOCH = 1e6  # the execution's start on the guard's clock (epoch seconds: 0 would read as absent)
TRAINING_STATUS = {"wait": "Starting", "start": "Downloading", "train": "Training", "save": "Training",
                   "stop": "Stopping"}
ENDED_STATUS = {"completed": "Completed", "segment": "Completed", "max_wait": "MaxWaitTimeExceeded",
                "max_runtime": "MaxRuntimeExceeded"}


class GuardsView:
    """What the guard reads of a simulated run, built as SageMaker and S3 would show it: DescribeTrainingJob
    (statuses, CreationTime, the last entry into Training), the newest committed checkpoint's step (whole steps of
    work / planned steps, as tests/infra/sagemaker_sim.py's trainer writes it) and LastModified; the Observation
    is then the guard's own (spotrun/pipeline/guard.py `observe`)."""

    def __init__(self, plan: SimPlan, policy: str):
        self.plan, self.policy = plan, policy
        self.trained_from: dict[int, float] = {}  # job -> when it last entered Training
        self.commit_t = None

    def event(self, real, run, job, until) -> None:
        """One simulated event, noting when a job enters Training and when a checkpoint commits."""
        phase, committed = job.phase, run.committed
        real(run, job, until)
        if phase == "start" and job.phase == "train":
            self.trained_from[id(job)] = job.t
        if run.committed != committed:
            self.commit_t = job.t

    def observe(self, run, job, now: float):
        from spotrun.pipeline.guard import observe  # the guard's module: this helper is the only caller here

        p = self.plan
        status = ("Completed" if job.end in ("completed", "segment") else "Stopped") if job.end else "InProgress"
        secondary = ENDED_STATUS.get(job.end, "Stopped") if job.end else TRAINING_STATUS[job.phase]
        trained = self.trained_from.get(id(job))
        describe = {"TrainingJobStatus": status, "SecondaryStatus": secondary,
                    "CreationTime": GUARD_EPOCH + job.created,
                    "SecondaryStatusTransitions": [] if trained is None else [
                        {"Status": "Training", "StartTime": GUARD_EPOCH + trained}]}
        step = int(run.committed / (p.work_s / p.planned_steps)) if run.committed else None
        policy = SpotPolicy(chosen=self.policy, why="", p95_finish_cap_usd=None, confidence=None, traces=0, seed=0,
                            trace_source="", policies=[], left_out=[], policy=self.policy, checkpointing="notice",
                            sim_plan={"work_s": p.work_s})
        plan = SimpleNamespace(estimate=SimpleNamespace(spot_policy=policy),
                               planned_steps=p.planned_steps, execution_started=GUARD_EPOCH, on_demand_fallback=True)
        return observe(plan, SimpleNamespace(spot=job.market.value == "spot"), describe, now=GUARD_EPOCH + now,
                       newest_checkpoint=None if self.commit_t is None else GUARD_EPOCH + self.commit_t,
                       checkpoint_step=step, spent=0.0)


@pytest.mark.parametrize("policy", ["uniform_progress", "deadline_greedy", "slack_reserve_10", "probing_greedy"])
def test_the_execution_skipping_polls_asks_the_policy_where_the_guard_polling_one_by_one_asks_it(policy, monkeypatch):
    """`execute` skips the polls that ask nothing; brute force: the same execution taking every poll, each from the
    guard's own `next_wait` (spotrun/pipeline/guard.py), asking where `ask_again` says. The same decisions at the
    same times. Before the fix the skip cut a recheck from the poll that asked, not from the last grid poll before
    it (where `next_wait` waits at least poll_seconds), and never asked at a new spot job's first poll while it
    still waited: public-trace windows executed 0.5-0.8 h apart from the state machine (docs/spot-policy.md).

    And at every poll that asks, the policy sees what the guard's own `observe` makes of the job's statuses and
    the checkpoint listing (`GuardsView`): the committed progress as whole planned steps, the age, the seconds
    trained since the commit. Before the fix the simulator read the committed seconds exactly, up to a step
    (10 s here) more than the guard: replay window 184 went back to spot in the simulator and stayed on-demand in
    the state machine (0.7 s on a threshold)."""
    from spotrun.pipeline.guard import next_wait
    from spotrun.policy import decision, execution

    # 1,777 planned steps: the guard's step (10.13 s of the work) is not the simulator's step_s (10 s)
    plan = _plan(work_s=5 * H, deadline_s=14 * H, max_wait_s=24 * H, max_runtime_s=48 * H, poll_s=900.0,
                 max_poll_s=4 * H, planned_steps=1777)
    guard_plan = SimpleNamespace(poll_seconds=900, max_poll_seconds=4 * 3600, max_usd=INF, usd_per_hour=1.0)
    spec = TraceSpec(interruptions_per_hour=0.5, horizon_s=60 * H, restart_wait_s=3600.0, burst_p=0.3,
                     droughts_per_day=2.0, drought_hours=(3.0, 8.0))

    def run(trace) -> tuple[list, execution.Run]:
        asked = []
        real = decision.decide

        def recorded(*args):
            asked.append((round(args[3].elapsed_s, 6), args[3].status, real(*args).action))
            return real(*args)

        with monkeypatch.context() as m:
            m.setattr(execution, "decide", recorded)
            out = execution.execute(plan, trace, policy, "notice")
        return asked, out

    def one_poll(self, created, now, target, recheck_at):  # the guard's next poll, from this one
        return now + next_wait(guard_plan, now - created, 0.0, recheck_at - now)

    traces = generated_traces(spec, 40, seed=3)
    skipping = [run(t) for t in traces]
    real_advance, real_event, real_observe = execution.Run.advance, execution.Run._event, execution.Run.observe
    monkeypatch.setattr(execution.Run, "skip_polls", one_poll)
    monkeypatch.setattr(execution.Run, "advance",  # only to the next poll: nothing skipped
                        lambda self, job, until, **skip: None if skip else real_advance(self, job, until))
    seen = []

    def compared(self, job, now, spot_seen=False):  # (no sentinel in these policies: spot_seen stays False)
        mine, guards = real_observe(self, job, now, spot_seen), view.observe(self, job, now)
        seen.append(mine.committed_s != self.committed)
        assert dataclasses.asdict(mine) | {"spent_usd": 0.0} == pytest.approx(dataclasses.asdict(guards)), (now, mine)
        return mine

    monkeypatch.setattr(execution.Run, "_event", lambda self, job, until: view.event(real_event, self, job, until))
    monkeypatch.setattr(execution.Run, "observe", compared)
    for (asked, out), trace in zip(skipping, traces, strict=True):
        view = GuardsView(plan, policy)
        every_poll, brute = run(trace)
        assert asked == every_poll
        assert (out.tally.t, out.tally.spot_s, out.tally.od_s, out.polls) == pytest.approx(
            (brute.tally.t, brute.tally.spot_s, brute.tally.od_s, brute.polls))
    assert any(out.tally.switches for _, out in skipping)  # not only runs that stayed on spot
    assert any(seen)  # polls where the guard's whole steps are not the committed seconds


def test_replay_window_184_executes_as_the_state_machine_ran_it():
    """benchmarks/replay_bench.py's window 184 (uniform_progress on skypilot-org/spot-traces'
    aws-10-26-2022/us-west-2b_k80_8.json from 1,332,746 s; the plan its estimate made) as far as the run reaches:
    capacity for 2.6 h, then none until 16.8 h. The rendered state machine with the real handlers (moto,
    tests/infra/replay.py) finished it at 9.3652 h for $128.20: on-demand from the drought's safety net to the end,
    the line's return-to-spot test kept off at the poll at 32,871 s, where the guard's committed progress (whole
    steps: 9,140.69 s) is 0.7 s under the committed seconds. The simulator read the seconds, went back to spot
    there and predicted 13.21 h and $132.30 (3.1% over)."""
    from spotrun.policy.execution import execute
    from spotrun.policy.policies import cost_usd

    plan = SimPlan(work_s=17746.43369723757, startup_s=300.0, restore_s=38.5452539904, save_s=38.5452539904,
                   interval_s=1863.0, step_s=23.26060557564323, notice_ok=True, spot_usd_per_h=13.1824,
                   on_demand_usd_per_h=37.664, max_wait_s=86765.0, max_runtime_s=36365.0, deadline_s=14 * H,
                   poll_s=900, max_poll_s=14400, planned_steps=763)
    run = execute(plan, [(0.0, 9454.307337013772), (60454.30733701377, INF)], "uniform_progress", "notice")
    assert run.tally.finished and run.tally.t / H == pytest.approx(9.365155822237332, abs=1e-6)
    assert sum(cost_usd(plan, run.tally)) == pytest.approx(128.20407111111112, rel=0.01)
    assert len(run.jobs) == 2  # spot, then on-demand to the end, as replayed


def test_when_no_policy_stays_within_the_cap_the_one_likeliest_to_finish_inside_it_is_chosen_not_on_demand():
    """On-demand over the cap bills past it on every trace (the guard ends it there, unfinished): with no policy
    within the cap on 95% of the traces, the choice is the likeliest to stay inside it, even where on-demand's
    P95 is the lowest (issue #28's 16-node run at 1.3x its spot estimate was accepted, then started on-demand)."""
    from spotrun.policy.choose import choose

    plan = _plan(deadline_s=None, max_runtime_s=60 * H, max_wait_s=70 * H, on_demand_fallback=True)
    # the drought falls back to on-demand after losing its first 27 minutes (no checkpoint yet): over on-demand's
    always, drought = [(0.0, INF)], [(0.0, 0.45 * H), (200 * H, INF)]
    od_cost = (plan.work_s + plan.startup_s) / H * plan.on_demand_usd_per_h
    cap = 0.6 * od_cost  # spot without interruptions fits; on-demand never does
    rows = compare(plan, [always, drought], [("maxwait_fallback", "periodic"), ("on_demand", "notice")],
                   cap_usd=cap)
    by = {r.policy: r for r in rows}
    assert by["on_demand"].p_within_cap == 0.0 and by["maxwait_fallback"].p_within_cap == 0.5
    assert by["on_demand"].p95_usd < by["maxwait_fallback"].p95_usd  # the lowest P95 would have been on-demand's
    best, why = choose(plan, rows, cap_usd=cap)
    assert best.policy == "maxwait_fallback" and "(50.0% of them)" in why


def test_a_cap_that_leaves_out_every_policy_meeting_the_deadline_is_a_warning_naming_a_cap_that_meets_it(
        monkeypatch):
    """A new user's run (a deadline with the fallback, a cap under the deadline policies' P95) was chosen a policy
    that misses the deadline, exit 0 without a word, the reason saying 'no policy meets the deadline' beside table
    rows at 100% that the cap had left out: a warning names a cap (with the cap modelled, no row meets the deadline
    within it: the runs that would pass it end at it). Set, that cap must let the estimate choose a policy that
    meets the deadline: the P95 it named was of the chain at the lower cap, and a larger cap's shorter chain moves
    it (here $149.27 became $169.27 once set, left out again). Both ways of naming it are checked: estimated again
    at raised caps, and, past the tries, the cap from which the chain is one job. (Each simulation is made once:
    the two ways ask for the same ones.)"""
    from spotrun.pipeline import policy_stage as estimate_step
    from spotrun.planner.estimate import estimate, load_catalog
    from spotrun.policy import choose
    from spotrun.policy.choose import CONFIDENCE

    made, simulated = {}, choose.spot_policy

    def once(*args, **kwargs):  # a call with a warning's callback is never the same (the lambda's repr differs)
        key = repr((args, kwargs))
        if key not in made:
            made[key] = simulated(*args, **kwargs)
        return made[key]

    monkeypatch.setattr(choose, "spot_policy", once)
    hours = estimate(parse_run(RUN)).wall_seconds / H
    timed = {**RUN, "compute": {**RUN["compute"], "deadline_hours": round(hours * 1.05, 1)}}  # tight: on-demand
    free = simulated(parse_run(timed), estimate(parse_run(timed)), load_catalog(), n=50).section
    cap = round(1.2 * min(r["p95_usd"] for r in free.policies), 2)  # spot's P95 fits; the deadline rules' not

    def estimated(max_usd: float):
        run = parse_run({**timed, "budget": {"max_usd": max_usd}})
        est = estimate_step.with_spot_policy(run, estimate(run), load_catalog(), n=50)
        rows = est.spot_policy.policies
        return est, rows, next(r for r in rows if r["label"] == est.spot_policy.chosen)

    for tries in (choose.DEADLINE_CAP_TRIES, 0):
        monkeypatch.setattr(choose, "DEADLINE_CAP_TRIES", tries)
        est, rows, chosen = estimated(cap)
        # the cap modelled as the guard holds it (spotrun/policy/execution.py `Cap`): the deadline policies' runs
        # that would pass it end at it instead, unfinished, so none meets the deadline within it (before: they met
        # it, their P95 over the cap, and were left out)
        assert chosen["p_deadline"] < CONFIDENCE and not [r for r in rows if r["p_deadline"] >= CONFIDENCE], rows
        assert all(r["p95_usd"] <= cap + 0.01 for r in rows), rows
        warned = [w for w in est.warnings if "lets the estimate choose a policy that meets it" in w]
        assert warned, est.warnings
        named = float(re.search(r"a cap of \$([\d,]+\.\d\d) lets the estimate choose a policy that meets it",
                                warned[0]).group(1).replace(",", ""))
        assert named > cap, (named, cap)
        again, _, chosen = estimated(named)
        assert chosen["p_deadline"] >= CONFIDENCE, (tries, named, again.spot_policy)
        assert not [w for w in again.warnings if "lets the estimate choose" in w], again.warnings


# ---- the estimate's speed: the same results, fewer operations ------------------------------------------------


@pytest.mark.parametrize("ck", ["notice", "periodic", "both"])
def test_a_rules_precomputed_figures_are_the_deadline_functions_to_the_last_bit(ck):
    """The deadline rules read the plan's constants once (`decision.Figures`, the estimate's hot loop): the slack,
    the progress, an on-demand finish, the switch and the risk, each bit-for-bit what the public functions (the
    guard's and the benchmarks') compute, on random plans and observations."""
    import random

    from spotrun.policy import decision
    from spotrun.policy.decision import JobStatus, Market, Observation

    rng = random.Random(7)
    for _ in range(300):
        plan = _plan(work_s=rng.uniform(0.1, 700) * H, startup_s=rng.uniform(0, 900), restore_s=rng.uniform(0, 300),
                     save_s=rng.uniform(0, 300), interval_s=rng.uniform(60, 7200), step_s=rng.uniform(0.01, 30),
                     notice_ok=rng.random() < 0.5, deadline_s=rng.uniform(1, 1500) * H, poll_s=rng.choice([60., 900.]))
        f = decision.figures(plan, ck)
        assert (f.switch, f.risk, f.line_target) == (decision.switch_s(plan), decision.risk_s(plan, ck),
                                                     decision.line_target_s(plan))
        obs = Observation(rng.uniform(0, plan.deadline_s), rng.uniform(0, plan.work_s), rng.choice(list(Market)),
                          rng.choice(list(JobStatus)), training_s=rng.choice([0.0, rng.uniform(0, 2 * plan.save_s)]))
        progress = f.progress(obs)
        assert progress == decision.progress_s(plan, ck, obs)
        assert f.od_finish(progress) == decision.od_finish_s(plan, ck, progress)
        assert plan.deadline_s - obs.elapsed_s - f.od_finish(progress) == decision.slack_s(plan, ck, obs)
    assert decision.figures(plan, ck) is f and decision.figures(dataclasses.replace(plan), ck) is not f


def test_the_estimate_step_executes_a_plan_once_when_two_caps_plan_the_same_simulation(monkeypatch):
    """Within `shared_simulations` (the estimate step: the run at its cap, as one job, at a deadline warning's
    caps), two caps whose chains plan the same simulation execute it once; the rows are those of separate
    simulations, each with its own cap's share within it. Outside it, each call simulates."""
    from spotrun.planner.estimate import estimate, load_catalog
    from spotrun.policy import choose, execution

    executed = []  # the trace runs (`execute_all` runs the uninterrupted one once for the traces it stands for)
    real = execution.execute
    monkeypatch.setattr(execution, "execute", lambda *a, **k: executed.append(1) or real(*a, **k))
    run = parse_run({**RUN, "compute": {**RUN["compute"], "deadline_hours": 300}})
    est = estimate(run)
    assert est.segments.segments <= 1  # no chain at this cap, nor at a larger one: the same plan
    larger = dataclasses.replace(run, max_usd=run.max_usd * 10)
    apart = [choose.spot_policy(r, est, load_catalog(), n=30) for r in (run, larger)]
    once = len(executed)
    with choose.shared_simulations():
        shared = [choose.spot_policy(r, est, load_catalog(), n=30) for r in (run, larger)]
    assert len(executed) - once == once // 2 > 0
    assert [c.section for c in shared] == [c.section for c in apart]
    assert [c.p95_usd for c in shared] == [c.p95_usd for c in apart]


def test_at_a_cap_that_binds_spotrun_simulate_prints_the_estimates_rows_and_marks_what_it_left_out(
        tmp_path, capsys, monkeypatch):
    """`spotrun simulate` planned its policies without the run's cap, so at a cap that binds its table was not the
    estimate's: the deadline policies met the deadline on 100% of the traces with P95 bills over the cap (marked
    left out), where the estimate, which executes them at the cap as the cost guard holds it, had them ended at
    the cap on a third of the traces. The same run, at a cap that binds, on the same generated traces: the same
    rows to the estimate's four places, the same choice, the same rows left out and marked the same way, no P95
    over the cap; the optimum, which knows no cap, is labelled as ignoring it."""
    from functools import partial

    from spotrun.cli import estimate as estimate_cli
    from spotrun.cli.main import main
    from spotrun.planner.estimate import estimate, load_catalog
    from spotrun.policy import choose
    from spotrun.policy.choose import left_out_mark
    from spotrun.policy.report import relative

    # the estimate step on 50 traces (its own N is 1,000), for `spotrun estimate` and simulate's estimate alike
    monkeypatch.setattr(estimate_cli, "with_spot_policy", partial(estimate_cli.with_spot_policy, n=50))
    hours = estimate(parse_run(RUN)).wall_seconds / H
    timed = {**RUN, "compute": {**RUN["compute"], "deadline_hours": round(hours * 1.05, 1)}}  # tight: on-demand
    free = choose.spot_policy(parse_run(timed), estimate(parse_run(timed)), load_catalog(), n=50).section
    cap = round(1.2 * min(r["p95_usd"] for r in free.policies), 2)  # spot's P95 fits; the deadline rules' not
    run = tmp_path / "run.json"
    run.write_text(json.dumps({**timed, "budget": {"max_usd": cap}}))
    assert main(["estimate", str(run), "--format", "json"]) == 0
    section = json.loads(capsys.readouterr().out)["spot_policy"]
    assert main(["simulate", str(run), "--n", str(section["traces"]), "--out", str(tmp_path / "out")]) == 0
    text = capsys.readouterr().out
    report = json.loads((tmp_path / "out" / "simulate.json").read_text())
    # the cap binds: deadline policies meeting the deadline on every trace without it are ended at it on some
    met_free = {r["label"]: r["p_deadline"] for r in free.policies}
    assert report["cap_binds"] and [r for r in report["policies"] if met_free[r["label"]] == 1.0 > r["p_deadline"]]
    theirs = {r["label"]: r for r in section["policies"]}
    assert [r["label"] for r in report["policies"]] == list(theirs)
    for r in report["policies"]:  # the estimate's rows are rounded to 4 places
        for key in ("mean_usd", "p50_usd", "p95_usd", "p_deadline", "p_within_cap", "mean_lost_h"):
            assert abs(r[key] - theirs[r["label"]][key]) <= 5e-5, (r["label"], key, r[key], theirs[r["label"]])
        assert r["p95_usd"] <= cap + 1e-9, r  # the cap modelled: no run bills past it
    assert report["chosen"] == section["chosen"]
    assert report["left_out"] == section["left_out"] and report["left_out"], (report["left_out"], section)
    assert report["left_out_finish_caps"] == section["left_out_finish_caps"]
    # why: the finish cap left on-demand out, not a P95 over the cap (none is: the said reason was wrong)
    assert "P95 cost over the" not in report["why"] and "needs a $" in report["why"], report["why"]
    lines = {r["label"]: next(line for line in text.splitlines() if f" {r['label']} " in line)
             for r in report["policies"]}
    for label, line in lines.items():  # the estimate's mark (spotrun/policy/choose.py `policy_text`), or none
        mark = left_out_mark(label, section["left_out"], section["left_out_finish_caps"])
        assert (mark in line) if mark else ("left out" not in line), (label, line)
    assert "  optimum, cap ignored" in text and f"the optimum ignores the ${cap:,.2f} cap" in text, text
    # on-demand ended at the cap (its finish cap is over it) is no yardstick: no 'vs OD' against its bill
    on_demand = next(r for r in report["policies"] if r["policy"] == "on_demand")
    assert on_demand["p_finished"] < 1 and relative(report, on_demand["label"])["of_on_demand"] is None


def test_an_out_that_is_a_file_is_refused_before_anything_is_simulated(tmp_path, capsys, monkeypatch):
    """A new user's `--out` naming a file: a FileExistsError traceback, exit 1, after the whole simulation ran."""
    from spotrun.cli import simulate as simulate_cli
    from spotrun.cli.main import main

    def never(*a, **k):
        raise AssertionError("simulated before --out was checked")

    monkeypatch.setattr(simulate_cli, "study", never)
    run, afile = tmp_path / "run.json", tmp_path / "afile"
    run.write_text(json.dumps(RUN))
    afile.write_text("mine")
    assert main(["simulate", str(run), "--n", "5", "--out", str(afile)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (f"error: InvalidArguments: --out={json.dumps(str(afile))} is invalid: expected a "
                           "directory (or a path to create one at): it is a file"), err
    assert afile.read_text() == "mine"
    assert main(["simulate", str(run), "--n", "5", "--out", str(afile / "sub"), "--format", "json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["error"] == "InvalidArguments" and doc["field"] == "--out", doc


def test_ctrl_c_in_simulate_or_estimate_is_one_line_and_exit_130(tmp_path, capsys, monkeypatch):
    """Ctrl-C during `spotrun simulate` (or the estimate's policy stage) printed a 16-frame KeyboardInterrupt
    traceback; `spotrun local` prints one line."""
    from spotrun.cli import simulate as simulate_cli
    from spotrun.cli.main import main

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(simulate_cli, "study", interrupted)
    run = tmp_path / "run.json"
    run.write_text(json.dumps(RUN))
    assert main(["simulate", str(run), "--n", "5", "--out", str(tmp_path / "out")]) == 130
    captured = capsys.readouterr()
    assert captured.err == "stopped: Ctrl-C: spotrun simulate stopped before it finished (run it again)\n", captured
    assert main(["simulate", str(run), "--n", "5", "--out", str(tmp_path / "out"), "--format", "json"]) == 130
    assert json.loads(capsys.readouterr().out)["error"] == "Stopped"


def test_an_accepted_missed_deadline_has_no_optimum_and_no_nan_in_the_table(tmp_path, capsys):
    """With compute.accept_missed_deadline and a deadline no schedule meets, every row's 'vs opt' read '+nan%' and
    the optimum's row 'nan nan nan 0.0%'."""
    from spotrun.cli.main import main
    from spotrun.planner.estimate import estimate

    hours = estimate(parse_run(RUN)).wall_seconds / H
    missed = {**RUN, "compute": {**RUN["compute"], "deadline_hours": round(hours / 2, 1),
                                 "accept_missed_deadline": True}}
    run = tmp_path / "run.json"
    run.write_text(json.dumps(missed))
    assert main(["simulate", str(run), "--n", "20", "--out", str(tmp_path / "out"), "--plot"]) == 0
    text = capsys.readouterr().out
    assert "nan" not in text.lower(), text
    deadline = missed["compute"]["deadline_hours"]
    assert (f"  no optimum: no schedule meets the {deadline:g} h deadline on any of the traces, on-demand from the "
            "start included") in text, text
    report = json.loads((tmp_path / "out" / "simulate.json").read_text())
    assert report["optimum"]["mean_usd"] is None and report["optimum"]["p_deadline"] == 0.0, report["optimum"]


def test_a_recording_that_flickers_every_second_is_bounded_by_n_not_held_in_gigabytes(tmp_path, capsys, monkeypatch):
    """A recording sampled every second whose capacity flickers (accepted: 1 s gaps, up to 10 M samples) held
    every replay's windows up front: 8.3 GB and no end at --n 1000. Refused before anything is simulated, naming
    the --n that fits; at that --n the replays built hold no more windows than the bound."""
    from spotrun.cli import simulate as simulate_cli
    from spotrun.cli.main import main

    class Built(Exception):
        pass

    held = []

    def count(plan, traces, *a, **k):
        held.append(sum(len(t) for t in traces))
        raise Built

    monkeypatch.setattr(simulate_cli, "study", count)
    rec = tmp_path / "traces" / "flicker.json"
    rec.parent.mkdir()
    rec.write_text(json.dumps({"metadata": {"gap_seconds": 1}, "data": [i % 2 for i in range(200_000)]}))
    run = tmp_path / "run.json"
    run.write_text(json.dumps(RUN))
    args = ["simulate", str(run), "--traces", str(rec.parent), "--out", str(tmp_path / "out")]
    assert main([*args, "--n", "1000"]) == 2 and not held
    err = capsys.readouterr().err
    most = int(re.search(r"expected --n ([\d,]+) or less$", err.strip()).group(1).replace(",", ""))
    assert err.startswith("error: InvalidArguments: --n=1000 is invalid with --traces=") and 1 <= most < 1000, err
    with pytest.raises(Built):
        main([*args, "--n", str(most)])
    assert held[0] <= simulate_cli.REPLAY_WINDOW_BUDGET, held
    # a recording at the public ones' scale (600 s samples, capacity for days at a time) is far from the bound
    calm = tmp_path / "calm"
    calm.mkdir()
    (calm / "calm.json").write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": ([1] * 500 + [0] * 20) * 40}))
    with pytest.raises(Built):
        main(["simulate", str(run), "--traces", str(calm), "--out", str(tmp_path / "out"), "--n", "1000"])
    assert held[1] < 10 * 1000, held


def test_a_cap_that_only_sets_the_jobs_maxruntime_is_not_said_to_end_runs(tmp_path, capsys):
    """At a cap over every bill that still sets the jobs' MaxRuntime (the cap shapes the runs, none ends at it),
    simulate said 'the rows are the run at the cap, which the guard ends where the chain of jobs left no longer
    fits it' (a new user read it as runs ended at the cap)."""
    from spotrun.cli.main import main
    from spotrun.planner.estimate import estimate

    on_demand = estimate(parse_run(RUN)).cost_usd["on_demand"]
    run = tmp_path / "run.json"
    run.write_text(json.dumps({**RUN, "budget": {"max_usd": round(1.5 * on_demand, 2)}}))
    assert main(["simulate", str(run), "--n", "50", "--out", str(tmp_path / "out")]) == 0
    text = capsys.readouterr().out
    report = json.loads((tmp_path / "out" / "simulate.json").read_text())
    assert report["cap_binds"] and all(r["p_finished"] == 1.0 for r in report["policies"]), report["policies"]
    assert "no longer fits it" not in text and "sets its jobs' MaxRuntime and the guard's polls (every run " \
        "finished)" in text, text


def test_simulate_on_recordings_says_where_the_estimates_cap_to_set_is_not_borne_out(tmp_path, capsys):
    """The 8B example at its cap to set, on recordings: the chosen policy finished 46.9% of the public recordings'
    windows, printed under 'the cap to set ... finishes at its P95 bill', with no word (a new user)."""
    from pathlib import Path

    from spotrun.cli.main import main

    path = Path(__file__).parents[2] / "examples/runs/llama3-8b-full.json"
    example = json.loads(path.read_text())
    assert main(["estimate", "--format", "json", str(path)]) == 0
    section = json.loads(capsys.readouterr().out)["spot_policy"]
    run = tmp_path / "run.json"
    run.write_text(json.dumps({**example, "budget": {"max_usd": section["p95_finish_cap_usd"]}}))
    lines = {}
    for name, (up, down) in {"scarce": (12, 288), "plenty": (2000, 2)}.items():  # 600 s samples: 2 h in 50 h
        (tmp_path / name).mkdir()
        (tmp_path / name / "t.json").write_text(json.dumps({"metadata": {"gap_seconds": 600},
                                                            "data": ([1] * up + [0] * down) * 20}))
        assert main(["simulate", str(run), "--n", "40", "--traces", str(tmp_path / name), "--no-optimum",
                     "--out", str(tmp_path / f"out-{name}")]) == 0
        report = json.loads((tmp_path / f"out-{name}" / "simulate.json").read_text())
        here = next(r["p_finished"] for r in report["policies"] if r["label"] == report["estimate_policy"]["chosen"])
        lines[name] = (here, [line for line in capsys.readouterr().out.splitlines() if "not borne out" in line])
    assert main(["estimate", "--format", "json", str(run)]) == 0  # the estimate at that cap: what it tells
    at_cap = json.loads(capsys.readouterr().out)["spot_policy"]
    told = next(r["p_finished"] for r in at_cap["policies"] if r["label"] == at_cap["chosen"])
    here, said = lines["scarce"]
    assert here < told - 0.01 and len(said) == 1, lines
    cap = section["p95_finish_cap_usd"]
    assert said[0].startswith(f"  not borne out here: on these traces, at the run's ${cap:,.2f} cap, "
                              f"{at_cap['chosen']} finishes on {here:.1%}, against {told:.1%} on the estimate's "
                              "generated traces"), said
    here, said = lines["plenty"]
    assert here >= told - 0.01 and not said, lines



def test_the_study_in_processes_is_the_study_in_one_figure_for_figure():
    """Issue 26 item 5: a long run with a deadline took minutes in `spotrun simulate`; its policies and its
    optimum now go to processes (`--jobs`). The report is the one process's, figure for figure (less the seconds
    it took): here a 60-hour run with a 90-hour deadline (every deadline policy, the on-demand policy on a plan of
    its own, the optimum over its traces in two chunks of the pool and a part), each row's share within a cap."""
    from spotrun.policy.choose import candidates
    from spotrun.policy.report import OPTIMUM_CHUNK, study

    plan = _plan(work_s=60 * H, deadline_s=90 * H, max_wait_s=90 * H, max_runtime_s=90 * H)
    on_demand = dataclasses.replace(plan, max_wait_s=0.0)
    traces = generated_traces(TraceSpec(0.2, 90 * H, mean_wait_s=1800.0), 2 * OPTIMUM_CHUNK + 3, seed=4)
    reports = []
    for workers in (1, 2):
        report = study(plan, traces, candidates(plan), cap_usd=35.0, workers=workers,
                       plan_of=lambda p: on_demand if p == "on_demand" else plan)
        report.pop("simulate_seconds")
        report["optimum"].pop("seconds")
        reports.append(report)
    one, two = reports
    assert len(one["policies"]) >= 8 and one["optimum"]["mean_usd"] > 0
    assert len({r["p_within_cap"] for r in one["policies"]}) > 1  # the cap leaves some rows more runs than others
    assert json.dumps(one) == json.dumps(two)


def test_simulate_takes_jobs_in_a_range_and_by_default_one_process_for_few_windows(tmp_path, capsys):
    from spotrun.cli.main import main
    from spotrun.cli.simulate import JOBS_DEFAULT_MAX, POOL_AFTER_WINDOWS, jobs

    run = tmp_path / "run.json"
    run.write_text(json.dumps(RUN))
    for bad in ("0", "65"):
        assert main(["simulate", str(run), "--jobs", bad, "--out", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: InvalidArguments: --jobs={bad} is invalid: expected an integer from 1 to "
                              "64") and err.count("\n") == 1, err
    few = [[(0.0, 1.0)] * 10] * (POOL_AFTER_WINDOWS // 10)
    assert jobs(None, few) == 1 and jobs(3, few) == 3
    assert 1 <= jobs(None, few + [[(0.0, 1.0)]]) <= JOBS_DEFAULT_MAX


def test_spotrun_simulate_executes_each_policy_once_on_the_estimates_own_traces(tmp_path, capsys, monkeypatch):
    """`spotrun simulate` on the estimate's own traces (generated, the estimate's count and seed) ran the estimate,
    then executed every policy again on the same plan and the same traces for its table. Now the study takes the
    estimate's executions: the command executes what `spotrun estimate` executes, no more; the report is the one
    the study makes on its own (in processes, `--jobs 2`, where nothing is shared)."""
    from pathlib import Path

    from spotrun.cli.main import main
    from spotrun.policy import execution

    run = Path(__file__).resolve().parents[2] / "examples" / "runs" / "qwen2-0.5b-full-small.json"
    made = []  # the trace runs (`execute_all`'s)
    real = execution.execute
    monkeypatch.setattr(execution, "execute", lambda *a, **k: made.append(1) or real(*a, **k))
    with monkeypatch.context() as m:  # the estimate's executions but its headroom's (simulate does not search it:
        # spotrun/policy/headroom.py runs other seeds and a slower trainer on top, `check_file(headroom=False)`)
        m.setattr("spotrun.cli.estimate.cap_to_set_headroom", lambda *a, **k: None)
        assert main(["estimate", str(run)]) == 0
    by_estimate = len(made)
    capsys.readouterr()
    made.clear()
    assert main(["simulate", str(run), "--no-optimum", "--format", "json", "--out", str(tmp_path / "a")]) == 0
    shared = json.loads(capsys.readouterr().out)
    assert shared["traces"] == 1000 and len(shared["policies"]) >= 2
    assert by_estimate > 0 and len(made) == by_estimate
    assert main(["simulate", str(run), "--no-optimum", "--format", "json", "--jobs", "2",
                 "--out", str(tmp_path / "b")]) == 0
    alone = json.loads(capsys.readouterr().out)
    shared.pop("simulate_seconds"), alone.pop("simulate_seconds")
    assert shared == alone


def test_spotrun_simulate_generates_the_estimates_traces_once(tmp_path, capsys, monkeypatch):
    """The study replays the estimate's own traces (the same spec, count and seed): made once, not generated again
    for the study (0.04 s of CPU of the 8B example's 1.2 s)."""
    from pathlib import Path

    import spotrun.cli.simulate as simulate_cli
    from spotrun.cli.main import main
    from spotrun.policy import choose

    run = Path(__file__).resolve().parents[2] / "examples" / "runs" / "qwen2-0.5b-full-small.json"
    made = []
    for module in (choose, simulate_cli):
        real = module.generated_traces
        monkeypatch.setattr(module, "generated_traces",
                            lambda spec, n, seed, real=real: made.append((spec, n, seed)) or real(spec, n, seed))
    assert main(["simulate", str(run), "--no-optimum", "--out", str(tmp_path)]) == 0
    assert "1000 traces (generated" in capsys.readouterr().out
    # each set once: the estimate's, which the study replays, and the longer ones a longer accepted delay draws
    # where some runs wait out MaxWait (its remedy, simulated: spotrun/policy/choose.py `maxwait_fixes`)
    assert made and made[0][1:] == (1000, 0) and len(set(made)) == len(made), made


def test_the_estimate_executes_each_plans_policy_on_a_trace_once(capsys, monkeypatch):
    """The search of the cap to set without a deadline executes the chosen policy on every trace at a cap that
    holds (`_Unfinished.too_many`); the full check at that cap (`spot_policy` there) then reuses those executions
    instead of making them again: no (plan, policy, checkpointing) is executed twice on one trace (the qwen2 example
    executed 90 twice; the shared run on `UNINTERRUPTED` is each `execute_all`'s own)."""
    from collections import Counter
    from pathlib import Path

    from spotrun.cli.main import main
    from spotrun.policy import execution

    run = Path(__file__).resolve().parents[2] / "examples" / "runs" / "qwen2-0.5b-full-small.json"
    made = Counter()
    real = execution.execute

    def counting(plan, trace, policy, ck, **kw):
        if trace is not execution.UNINTERRUPTED:
            made[plan, policy, ck, id(trace)] += 1
        return real(plan, trace, policy, ck, **kw)

    monkeypatch.setattr(execution, "execute", counting)
    assert main(["estimate", str(run)]) == 0
    assert "the cap to set" in capsys.readouterr().out
    assert len(made) > 500 and [k for k, times in made.items() if times > 1] == []
