"""The offline optimum: the cheapest way through each trace knowing it in advance (dynamic programming), the floor
every online policy is measured against. numpy, vectorized over traces; the CLI and benchmarks use it, the estimate
Lambda does not.

Time and work are cut into ticks of `work_s / ticks` seconds. In each tick the run is idle, on spot (in the ticks a
capacity window covers, its ends rounded to the nearest tick) or on on-demand. Starting a job (from idle or from
the other kind) costs a startup and a restore (and the last job's save before its capacity goes, which foresight
makes possible, unless it fits the stop notice; the first job has no restore), billed at the new job's price, and
delays progress by that many ticks (rounded to the nearest tick). Knowing the trace, no work is ever lost.
Cost[mode][progress] is carried forward tick by tick; the answer per trace is the least cost at which progress
reaches the work by the deadline (or by the trace's horizon without one).
"""

from __future__ import annotations

import math

import numpy as np

from .engine import SimPlan


def availability(traces: list, tick_s: float, ticks: int) -> np.ndarray:
    """(traces, ticks) booleans: spot is there for the tick (a window covers the ticks its ends round to)."""
    out = np.zeros((len(traces), ticks), dtype=bool)
    for n, trace in enumerate(traces):
        for a, b in trace:
            first = round(a / tick_s)
            if first >= ticks:
                break
            last = ticks if b == math.inf else min(ticks, round(b / tick_s))
            if last > first:
                out[n, first:last] = True
    return out


def offline_optimum(plan: SimPlan, traces: list, *, ticks: int = 300, horizon_s: float | None = None) -> np.ndarray:
    """Least cost (USD) per trace; inf where the deadline cannot be met."""
    tick = plan.work_s / ticks
    limit = plan.deadline_s if plan.deadline_s is not None else (horizon_s or 4 * plan.work_s)
    steps = int(math.floor(limit / tick + 1e-9))
    avail = availability(traces, tick, steps)
    # A job's save before its capacity goes is free on spot when it fits the notice; the first job has nothing
    # to restore.
    change_s = plan.startup_s + plan.restore_s + (0.0 if plan.notice_ok else plan.save_s)
    o, o_first = max(1, round(change_s / tick)), max(1, round(plan.startup_s / tick))
    ps, po = plan.spot_usd_per_h * tick / 3600, plan.on_demand_usd_per_h * tick / 3600
    start_spot, start_od = plan.spot_usd_per_h * change_s / 3600, plan.on_demand_usd_per_h * change_s / 3600
    first_spot, first_od = plan.spot_usd_per_h * plan.startup_s / 3600, plan.on_demand_usd_per_h * plan.startup_s / 3600
    n, size = len(traces), ticks + o + 1  # index j holds progress j - o (a fresh job owes its changeover)
    inf = np.inf
    idle = np.full((n, size), inf)
    spot = np.full((n, size), inf)
    od = np.full((n, size), inf)
    done = np.full(n, inf)
    for t in range(steps):
        enter_spot = np.full((n, size), inf)
        enter_spot[:, :size - o] = np.minimum(idle, od)[:, o:] + start_spot
        enter_od = np.full((n, size), inf)
        enter_od[:, :size - o] = np.minimum(idle, spot)[:, o:] + start_od
        # the first job, from progress 0 (index o), any time
        enter_spot[:, o - o_first] = np.minimum(enter_spot[:, o - o_first], first_spot)
        enter_od[:, o - o_first] = np.minimum(enter_od[:, o - o_first], first_od)
        new_idle = np.minimum(np.minimum(idle, spot), od)
        run_spot = np.minimum(spot, enter_spot)
        run_od = np.minimum(od, enter_od)
        spot = np.full((n, size), inf)
        spot[:, 1:] = run_spot[:, :-1] + ps
        spot[~avail[:, t]] = inf
        od = np.full((n, size), inf)
        od[:, 1:] = run_od[:, :-1] + po
        idle = new_idle
        done = np.minimum(done, np.minimum(spot[:, -1], od[:, -1]))
    return done
