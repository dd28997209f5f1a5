"""`Run.skip_polls_capped` (spotrun/policy/execution.py): the simulator's skip over the guard's polls near the cost
cap lands where the guard's own rule, stepped poll by poll, lands (each wait the grid's `poll_wait`, cut to the
time the cap leaves, `cap_wait_s` of `guard_spent`), after the same number of polls, to the bit; and the polls
that the cap cannot cut are passed without computing the spend at each."""

from __future__ import annotations

import math
import random

from spotrun.planner.segments import ChainCosts, cap_wait_s
from spotrun.policy import execution
from spotrun.policy.decision import Market, first_poll_at, poll_wait
from spotrun.policy.engine import SimPlan
from spotrun.policy.execution import Cap, Run

H = 3600.0
INF = math.inf
COSTS = ChainCosts(usd_per_s=10.0 / 3600, spot_fraction=0.35, startup_s=600.0, restart_s=600.0, save_s=60.0,
                   longest_s=72_000, step_s=10.0)


def _plan(cap_usd: float, poll_s: float, max_poll_s: float) -> SimPlan:
    return SimPlan(work_s=40 * H, startup_s=600.0, restore_s=120.0, save_s=60.0, interval_s=1800.0, step_s=10.0,
                   notice_ok=True, spot_usd_per_h=3.5, on_demand_usd_per_h=10.0, max_wait_s=COSTS.longest_s + 2 * H,
                   max_runtime_s=float(COSTS.longest_s), poll_s=poll_s, max_poll_s=max_poll_s, planned_steps=14400,
                   cap_usd=cap_usd, chain_costs=COSTS)


def _state(rng: random.Random, poll_s: float, max_poll_s: float):
    """A run at a poll: earlier jobs' bills, a job created at a whole second or not, running or waiting, a sentinel
    or none, the cap from a few seconds to days of room."""
    spot_s, od_s = rng.uniform(0, 4 * H), rng.choice([0.0, rng.uniform(0, 3 * H)])
    created = rng.choice([0.0, float(rng.randrange(0, 40_000)), float(rng.randrange(0, 40_000)),
                          rng.uniform(0, 40_000)])
    now = created + rng.choice([0.0, float(rng.randrange(0, 30_000)), float(rng.randrange(0, 30_000)),
                                rng.uniform(0, 30_000)])
    target = now + rng.choice([0.0, 1.0, rng.uniform(0, 3 * H), rng.uniform(0, 3 * 24 * H), rng.uniform(0, 3 * 24 * H)])
    spent = (spot_s * 3.5 + od_s * 10.0 + (now - created) * 10.0) / H  # about the guard's, at `now`
    # the cap's room about the time to the target (the loop's case), or anything from hours to days
    cap = rng.choice([spent + (target - now) * rng.uniform(0.3, 1.3) * 10.0 / H + rng.uniform(0.0, 5.0)] * 3 +
                     [rng.choice([40.0, 150.0, 400.0, 2_000.0])])
    plan = _plan(max(cap, 1.0), poll_s, max_poll_s)
    run = Run(plan, "notice", [(0.0, 3 * H), (5 * H, 9 * H), (9.5 * H, 30 * H), (31 * H, INF)])
    run.tally.spot_s, run.tally.od_s = spot_s, od_s
    job = run.create(rng.choice([Market.SPOT, Market.ON_DEMAND]), created)
    job.billed = rng.uniform(0, now - created)
    if job.market is Market.ON_DEMAND and rng.random() < 0.5:
        run.start_sentinel(created + rng.uniform(0, now - created))
    cap = Cap.of(plan, "sentinel_greedy" if run.sentinel_at is not None else "deadline_greedy")
    recheck = rng.choice([INF, INF, INF, target, target + rng.uniform(0, 2 * H)])
    return run, cap, job, now, target, recheck, job.billed, rng.random() < 0.7


def _stepped(run: Run, cap: Cap, job, now, target, recheck_at, billed_s, running) -> tuple[float, int, int | None]:
    """The guard's rule poll by poll: (the poll at or after the target, the polls up to it, the first whose wait the
    cap cut: None where none)."""
    p, t, n, cut = run.plan, now, 0, None
    while n == 0 or t < target - 1e-9:
        billed = billed_s + (t - now) if running else billed_s
        grid = poll_wait(math.floor(t - job.created), recheck_at - t, poll_s=p.poll_s, max_poll_s=p.max_poll_s)
        left = cap_wait_s(cap_usd=cap.cap_usd, spent_usd=run.guard_spent(cap, job, t, billed),
                          usd_per_s=cap.costs.usd_per_s)
        if cut is None and left < grid:
            cut = n + 1
        t += int(max(p.poll_s, min(grid, left)))
        n += 1
    return t, n, cut


def test_the_skip_near_the_cap_lands_on_the_poll_the_guard_reaches(monkeypatch):
    """1,000 random runs at a poll (grids of 60 s to 4 h and 30 s to 1 h; whole-second times and not; running,
    waiting, a sentinel; rechecks none, at the target, past it; caps from seconds to days of room): where the
    skip cuts no wait it lands on `first_poll_at`'s poll (where stepping lands, within the guard's whole
    seconds), else on the poll stepping the guard's rule reaches, to
    the bit, with the same count of polls and the run marked capped exactly when a wait was cut."""
    rng = random.Random(7)
    cut_seen = uncut_seen = 0
    passed = []  # the polls passed at once (`_uncut_polls`), where any
    real = execution._uncut_polls

    def counting(*args):
        out = real(*args)
        passed.append(out[0])
        return out

    monkeypatch.setattr(execution, "_uncut_polls", counting)
    for _ in range(1000):
        poll_s, max_poll_s = rng.choice([(60.0, 14400.0), (30.0, 3600.0)])
        run, cap, job, now, target, recheck, billed, running = _state(rng, poll_s, max_poll_s)
        t, n, cut = _stepped(run, cap, job, now, target, recheck, billed, running)
        polls = run.polls
        at = run.skip_polls_capped(cap, job, now, target, recheck, billed, running)
        assert run.capped == (cut is not None), (now, target, recheck)
        if cut is not None:
            assert (at, run.polls - polls + 1) == (t, n), (now, target, recheck)
            cut_seen += 1
        else:  # the grid's poll, as `skip_polls` takes it (stepping lands up to a second or so away where the
            # job was created at a fraction of one: the guard counts a job's age in whole seconds)
            assert (at, run.polls - polls + 1) == first_poll_at(job.created, now, target, recheck, poll_s=poll_s,
                                                                 max_poll_s=max_poll_s), (now, target, recheck)
            assert abs(at - t) < 2, (now, target, recheck)
            uncut_seen += 1
    assert cut_seen > 100 and uncut_seen > 100 and sum(1 for k in passed if k) > 60


def test_the_polls_the_cap_cannot_cut_are_not_stepped_one_by_one(monkeypatch):
    """An on-demand job with a sentinel, $200 of cap at $10/h for the job and as much for the sentinel while spot
    has capacity, walked from its creation to 12 h on the 60 s to 4 h grid (132 polls): the cap cuts its waits
    from the 93rd poll, at 11.1 h. The spend (a walk over the trace's windows for the sentinel's bill) is computed
    at the first poll and from a poll or two before the first cut on, not at each of the polls before it."""
    plan = _plan(200.0, 60.0, 14400.0)
    run = Run(plan, "notice", [(0.0, 3 * H), (5 * H, 9 * H), (9.5 * H, INF)])
    job = run.create(Market.ON_DEMAND, 0.0)
    run.start_sentinel(0.0)
    cap = Cap.of(plan, "sentinel_greedy")
    calls = []
    real = Run.sentinel_billed

    def counting(self, now):
        calls.append(now)
        return real(self, now)

    monkeypatch.setattr(Run, "sentinel_billed", counting)
    t, n, cut = _stepped(run, cap, job, 0.0, 12 * H, INF, 0.0, True)
    assert cut is not None and cut > 50 and n - cut > 10, (n, cut)
    assert len(calls) == n  # stepping computes the spend at every poll
    calls.clear()
    assert run.skip_polls_capped(cap, job, 0.0, 12 * H, INF, 0.0, True) == t
    assert len(calls) <= 1 + (n - cut + 1) + 2, (n, cut, len(calls))


def test_the_grid_walk_is_refused_where_the_loop_would_leave_the_grid():
    """A grid of fractional seconds is not walked at once (`_grid_walk`): adding its waits is not exact."""
    assert execution._grid_walk(60.0, 14400.0) is not None
    assert execution._grid_walk(60.5, 14400.0) is None
