"""The exact offline optimum (spotrun/policy/optimum.py) against an exhaustive search of the engine's own
schedules, against every policy on random traces, and its bounds."""

from __future__ import annotations

import functools
import json
import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spotrun.policy import optimum, simulate
from spotrun.policy.engine import INF, SimPlan, Tally, segment
from spotrun.policy.optimum import MAX_PIECES, solve
from spotrun.policy.policies import POLICIES, cost_usd
from spotrun.policy.traces import Recording, replay, windows_from_counts

H = 3600.0
Q = 60.0  # the brute force's grid: every time below is a multiple of it


def _brute_force(plan: SimPlan, trace: list, horizon: float) -> float | None:
    """The least cost over every schedule whose jobs start and stop on the Q grid: from idle at t with some
    progress, wait a tick, or start a job on spot (inside a window) or on-demand and stop it at any later tick
    or let it run (to its capacity's end or the finish). Each job is the engine's own `segment` (checkpointing
    "notice"); memoized on (t, progress), which is all a job depends on."""
    limit = plan.deadline_s if plan.deadline_s is not None else horizon

    @functools.lru_cache(maxsize=None)
    def best(t: float, progress: float) -> float:
        out = best(t + Q, progress) if t + Q <= limit else INF
        window = next(((a, b) for a, b in trace if a <= t < b), None)
        for spot in (True, False):
            if spot and window is None:
                continue
            cap = window[1] if spot else INF
            stops = [t + Q * i for i in range(1, int((min(cap, limit) - t) / Q) + 1) if t + Q * i < cap] + [INF]
            for stop in stops:
                tally = Tally(t=t, progress=progress)
                done = segment(plan, tally, t, cap, stop, spot, "notice")
                paid = sum(cost_usd(plan, tally))
                if done:
                    if tally.t <= limit + 1e-6:
                        out = min(out, paid)
                elif tally.t <= limit and tally.progress > progress:
                    out = min(out, paid + best(tally.t, tally.progress))
        return out

    cost = best(0.0, 0.0)
    return None if cost == INF else cost


def _tiny_case(rng: random.Random) -> tuple[SimPlan, list]:
    t, trace = 0.0, []
    for _ in range(rng.randint(0, 4)):
        t += Q * rng.randint(0, 8)
        up = Q * rng.randint(1, 10)
        trace.append((t, t + up))
        t += up + Q
    # an open last window, or none: no capacity after the trace (the sentinel policies read as "never")
    trace.append((t + Q * rng.randint(0, 6), INF) if rng.random() < 0.4 else (INF, INF))
    work = Q * rng.randint(3, 14)
    deadline = None if rng.random() < 0.2 else work + Q * rng.randint(2, 30)
    plan = SimPlan(work_s=work, startup_s=Q * rng.randint(1, 3), restore_s=Q * rng.randint(0, 1),
                   save_s=Q * rng.randint(0, 1), interval_s=1e6, step_s=Q, notice_ok=True,
                   spot_usd_per_h=rng.choice([0.2, 0.35, 0.7]), on_demand_usd_per_h=1.0, deadline_s=deadline)
    return plan, trace


def test_the_optimum_equals_an_exhaustive_search_of_the_engines_schedules_on_tiny_traces():
    rng = random.Random(26)
    met = 0
    for _ in range(60):
        plan, trace = _tiny_case(rng)
        horizon = max([b for _, b in trace if b < INF] + [a for a, _ in trace if a < INF] + [0.0]) \
            + 2 * plan.work_s + 6 * Q
        brute = _brute_force(plan, trace, horizon)
        exact = solve(plan, trace).usd
        assert (brute is None) == (exact is None), (plan, trace, brute, exact)
        if brute is not None:
            met += 1
            assert exact == pytest.approx(brute, rel=1e-9, abs=1e-12), (plan, trace, brute, exact)
    assert met >= 40  # most cases have a schedule that meets the deadline


def test_the_optimum_equals_an_exhaustive_search_on_tiny_flickering_traces_mostly_without_a_deadline():
    """Recorded traces in small: many windows of a few ticks, most too short to pay for their startup (the
    first schedules and the knapsack bound see them at their price a second of work), mostly no deadline."""
    rng = random.Random(27)
    for _ in range(60):
        t, trace = 0.0, []
        for _ in range(rng.randint(3, 9)):
            t += Q * rng.randint(1, 4)
            up = Q * rng.randint(1, 4)
            trace.append((t, t + up))
            t += up
        trace.append((INF, INF))
        work = Q * rng.randint(3, 12)
        deadline = None if rng.random() < 0.7 else work + Q * rng.randint(2, 30)
        plan = SimPlan(work_s=work, startup_s=Q, restore_s=Q * rng.randint(0, 1), save_s=Q * rng.randint(0, 1),
                       interval_s=1e6, step_s=Q, notice_ok=True, spot_usd_per_h=rng.choice([0.2, 0.35, 0.7]),
                       on_demand_usd_per_h=1.0, deadline_s=deadline)
        brute = _brute_force(plan, trace, t + 2 * work + 6 * Q)
        result = solve(plan, trace)
        assert result.exact and (brute is None) == (result.usd is None), (plan, trace, brute, result)
        if brute is not None:
            assert result.usd == pytest.approx(brute, rel=1e-9, abs=1e-12), (plan, trace, brute, result)


def test_on_a_clear_trace_the_optimum_is_spot_from_the_start_and_on_none_on_demand():
    plan = SimPlan(work_s=40 * H, startup_s=600, restore_s=60, save_s=60, interval_s=1800, step_s=10,
                   notice_ok=True, spot_usd_per_h=0.35, on_demand_usd_per_h=1.0, deadline_s=48 * H)
    assert solve(plan, [(0.0, INF)]).usd == pytest.approx(0.35 * (40 * H + 600) / H, rel=1e-12)
    assert solve(plan, []).usd == pytest.approx((40 * H + 600) / H, rel=1e-12)
    assert solve(SimPlan(**{**plan.__dict__, "deadline_s": 40 * H}), [(0.0, INF)]).usd is None


_windows = st.lists(st.tuples(st.floats(0.0, 30 * H), st.floats(60.0, 30 * H)), min_size=0, max_size=10)


@settings(max_examples=1000, deadline=None, derandomize=True)
@given(gaps=_windows, tail=st.booleans(), notice=st.booleans(),
       ck=st.sampled_from(["notice", "periodic", "both"]), deadline=st.one_of(st.none(), st.floats(12 * H, 120 * H)),
       startup=st.floats(0.0, 1800.0), save=st.floats(0.0, 600.0), spot_price=st.floats(0.1, 0.9))
def test_the_optimum_is_at_or_below_every_policy_and_finishes_whenever_one_does(gaps, tail, notice, ck, deadline,
                                                                                startup, save, spot_price):
    t, trace = 0.0, []
    for down, up in gaps:
        trace.append((t + down, t + down + up))
        t += down + up
    trace.append((t + 600.0, INF) if tail else (INF, INF))
    ck = ck if notice else "periodic"
    plan = SimPlan(work_s=10 * H, startup_s=startup, restore_s=save, save_s=save, interval_s=1800.0, step_s=10.0,
                   notice_ok=notice, spot_usd_per_h=spot_price, on_demand_usd_per_h=1.0, deadline_s=deadline)
    best = solve(plan, trace).usd
    for policy in POLICIES:
        tally = simulate(plan, [trace], policy, ck)[0]
        if not tally.finished or (deadline is not None and tally.t > deadline + 1e-6):
            continue
        assert best is not None, (policy, trace)
        assert best <= sum(cost_usd(plan, tally)) * (1 + 1e-9), (policy, trace)


def _plan_28_days() -> SimPlan:
    return SimPlan(work_s=20 * 24 * H, startup_s=120.0, restore_s=30.0, save_s=30.0, interval_s=1800.0, step_s=1.0,
                   notice_ok=True, spot_usd_per_h=0.35, on_demand_usd_per_h=1.0, deadline_s=28 * 24 * H)


def test_the_work_is_bounded_on_a_28_day_run_a_one_second_trace_and_a_thousand_windows():
    plan = _plan_28_days()
    rng = random.Random(3)
    # a recording one second apart whose capacity flips every few seconds: no window outlasts a startup
    flicker, t = [], 0.0
    while t < 28 * 24 * H:
        up = float(rng.randint(1, 60))
        flicker.append((t, t + up))
        t += up + rng.randint(1, 60)
    result = solve(plan, flicker + [(INF, INF)])
    assert result.windows == 0 and result.usd == pytest.approx((plan.work_s + plan.startup_s) / H)
    # 100 windows of 10-20 min, 1-30 min apart: the frontier reaches the cap, merges, and says it is a floor
    many, t = [], 0.0
    for _ in range(100):
        t += rng.uniform(60, 1800)
        up = rng.uniform(600, 1200)
        many.append((t, t + up))
        t += up
    result = solve(plan, many + [(INF, INF)])
    assert result.windows == 100 and result.pieces <= MAX_PIECES and not result.exact
    assert 0 < result.usd <= (plan.work_s + plan.startup_s) / H


def _recorded_like(rng: random.Random, days: float = 5.0) -> list:
    """A trace like the public recordings replayed without a deadline: 10-minute samples over 27 days whose
    capacity comes and goes every few samples (us-west-2b's v100_8 averages runs of 4.5 samples up, 5.2 down),
    seen from a random offset up to a horizon of days (no capacity after it)."""
    data, up = [], rng.random() < 0.5
    for _ in range(3895):
        data.append(int(up))
        if rng.random() < (1 / 4.5 if up else 1 / 5.2):
            up = not up
    rec = Recording("like", windows_from_counts(data, 600.0), 3895 * 600.0)
    return replay(rec, rng.uniform(0, rec.length_s), days * 24 * H)


def _plan_8b(**changes) -> SimPlan:
    """examples/runs/llama3-8b-full.json's plan as `spotrun simulate` sets it (no deadline)."""
    plan = SimPlan(work_s=35552.9, startup_s=465.0, restore_s=0.0, save_s=38.5, interval_s=1863.0, step_s=23.3,
                   notice_ok=True, spot_usd_per_h=13.1824, on_demand_usd_per_h=37.664, deadline_s=None)
    return SimPlan(**{**plan.__dict__, **changes})


def test_on_recorded_like_traces_without_a_deadline_the_optimum_is_exact_and_equals_the_plain_program(monkeypatch):
    """Weeks of windows of a few samples each, no deadline: the plain program past its cap merges pieces and
    gives a floor; the pruned one (first schedules, the knapsack bound, the early end) stays far under the cap,
    says exact, and equals the plain program with no cap."""
    rng = random.Random(3)
    cases = [(_plan_8b(restore_s=rng.choice([0.0, 60.0]), save_s=rng.choice([0.0, 38.5])), _recorded_like(rng))
             for _ in range(10)]
    pruned = [solve(plan, trace) for plan, trace in cases]
    assert all(r.exact and r.pieces <= MAX_PIECES // 4 for r in pruned)
    assert sum(not solve(plan, trace, pruned=False).exact for plan, trace in cases) >= 1  # the case sped up
    monkeypatch.setattr(optimum, "MAX_PIECES", 10**6)
    for (plan, trace), r in zip(cases, pruned, strict=True):
        plain = solve(plan, trace, pruned=False)
        assert plain.exact and r.usd == pytest.approx(plain.usd, rel=1e-9), (plan, trace)
        assert r.usd < (plan.startup_s + plan.work_s) * plan.on_demand_usd_per_h / H  # spot did part of it
        assert r.windows <= plain.windows


def test_with_spot_dearer_than_on_demand_the_optimum_is_on_demand_from_the_start():
    """Every schedule bills at least a startup and the work; at prices no less than on-demand's, on-demand from
    the start is the optimum. (An on-demand job run past the work's end, through an outage longer than the work,
    once entered a spot window shorter than a restart with the work left negative and came out below that.)"""
    rng = random.Random(8)
    cases = [(_plan_8b(restore_s=300.0, spot_usd_per_h=39.5472), [(0.0, 18545.5), (74120.5, 74705.5), (INF, INF)])]
    for _ in range(20):
        outage = [(0.0, 5 * H)] + [(a + 20 * H, b + 20 * H) for a, b in _recorded_like(rng)]
        cases.append((_plan_8b(restore_s=300.0, spot_usd_per_h=rng.choice([37.664, 39.5472, 75.0])), outage))
    for plan, trace in cases:
        least = (plan.startup_s + plan.work_s) * plan.on_demand_usd_per_h / H
        for pruned in (True, False):
            assert solve(plan, trace, pruned=pruned).usd == pytest.approx(least, rel=1e-12), (pruned, trace)


# ---- trace input and `spotrun simulate`'s bounds -----------------------------------------------------------


@pytest.mark.parametrize("doc, message", [
    ({"metadata": {"gap_seconds": 1e-6}, "data": [1, 0]},
     "gap_seconds=1e-06 is invalid: expected a number of seconds from 1 to 86400"),
    ({"metadata": {"gap_seconds": 1e308}, "data": [1, 0]}, "gap_seconds=1e+308 is invalid"),
    ({"metadata": {"gap_seconds": "600"}, "data": [1, 0]}, 'gap_seconds="600" is invalid'),  # JSON, not '600'
    ({"metadata": {"gap_seconds": 600}, "data": []}, "data is invalid (an empty array): expected an array of 1 to"),
    ({"metadata": {"gap_seconds": 600}, "data": [1, -1]}, "data[1]=-1 is invalid: expected a whole count"),
    ({"metadata": {"gap_seconds": 600}, "data": [1, float("nan")]}, "data[1]=NaN is invalid: expected a whole count"),
    ({"metadata": {"gap_seconds": 600}, "data": [1, "x", None]}, 'data[1]="x" is invalid: expected a whole count'),
    ({"metadata": {"gap_seconds": None}, "data": [1]}, "gap_seconds=null is invalid"),
    ({"metadata": {"gap_seconds": 600}, "data": [0, 0, 0]}, "no capacity at all"),
])
def test_bad_traces_are_refused_in_one_line(tmp_path, doc, message):
    from spotrun.policy.traces import read_availability

    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        read_availability(path)
    assert "\n" not in str(err.value)


def test_a_replay_never_reads_the_end_of_a_recording_as_capacity(tmp_path):
    from spotrun.policy.traces import read_availability, replay

    path = tmp_path / "t.json"
    path.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [0, 1, 1, 0]}))  # 40 min, 20 of spot
    rec = read_availability(path)
    trace = replay(rec, 0.0, 3 * H)  # a window far longer than the recording: it repeats, then nothing
    assert trace[:2] == [(600.0, 1800.0), (3000.0, 4200.0)] and trace[-1] == (INF, INF)
    assert all(b < INF for a, b in trace[:-1])
    plan = SimPlan(work_s=10 * H, startup_s=60.0, restore_s=0.0, save_s=0.0, interval_s=1800.0, step_s=10.0,
                   notice_ok=True, spot_usd_per_h=0.35, on_demand_usd_per_h=1.0)
    spot = simulate(plan, [trace], "spot", "notice")[0]
    assert not spot.finished  # 10 h of work in 3 h of replayed recording: spot alone cannot finish


@pytest.mark.parametrize("args, message", [
    (["--n", "100000000"], "--n=100000000 is invalid: expected an integer from 1 to 100,000"),
    (["--n", "0"], "--n=0 is invalid"),
    (["--traces", "TRACES"], "no capacity at all"),
])
def test_spotrun_simulate_refuses_bad_input_in_one_line_without_a_traceback(tmp_path, capsys, args, message):
    from spotrun.cli.main import main

    run = tmp_path / "run.json"
    run.write_text(json.dumps({"version": 1, "name": "p", "model": {"parameters": 1_000_000_000},
                               "data": {"tokens": 200_000_000, "seq_len": 2048}, "budget": {"max_usd": 1_000_000},
                               "compute": {"instance_type": "ml.g5.xlarge"}}))
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "z.json").write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [0] * 50}))
    args = [str(tmp_path / "traces") if a == "TRACES" else a for a in args]
    assert main(["simulate", str(run), "--out", str(tmp_path / "out"), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_the_frontier_of_pieces_is_the_states_no_other_beats_checked_on_a_grid():
    """`pareto` (the program's hot loop, written out for speed) against the definition, on random pieces: each
    state it keeps is an input state, the pieces are sorted and disjoint, and every input state on a grid of
    slacks is beaten or matched (no more slack, no more cost) by one it keeps."""
    rng, po = random.Random(5), 0.01
    for _ in range(300):
        pieces = []
        for _ in range(rng.randint(1, 12)):
            lo = rng.choice([0.0, 60.0, 120.0]) + rng.randint(0, 20) * 30.0
            pieces.append((lo, lo + rng.choice([0.0, 30.0, 90.0, 600.0]), rng.choice([1.0, 2.0, 3.0, 5.0, 8.0])))
        out = optimum.pareto(pieces, po)
        assert all(a[1] <= b[0] for a, b in zip(out, out[1:], strict=False)) and all(lo <= hi for lo, hi, _ in out)
        for lo, hi, j in out:  # input states: in a piece at that J (pieces of one J that touch are one)
            for sigma in (lo, (lo + hi) / 2, hi):
                assert any(p[0] - 1e-9 <= sigma <= p[1] + 1e-9 and p[2] == j for p in pieces), (pieces, out)
        for lo, hi, j in pieces:
            for sigma in (lo, (lo + hi) / 2, hi):
                cost = j - po * sigma
                assert any(k - po * min(sigma, h) <= cost + 1e-9 for s, h, k in out if s <= sigma + 1e-9), \
                    (pieces, out, sigma)
