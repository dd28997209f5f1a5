"""The policies compared on the same traces, each a function (plan, trace, checkpointing) -> Tally.

- `on_demand`: on-demand from the start.
- `spot`: managed spot, restarting whenever capacity returns, never falling back (greedy spot): no MaxWait,
  but SageMaker's MaxRuntime still stops it (unfinished).
- `maxwait_fallback`: today's pipeline: managed spot until SageMaker stops it at MaxWait (wall time since the
  job's creation) or MaxRuntime (its training time), then an on-demand job on the same checkpoints.
- `uniform_progress`: deadline-aware, after Uniform Progress ("Can't Be Late", NSDI 2024): spot while committed
  progress is on or ahead of the straight line from 0 to the deadline (less a reserve for one changeover); when
  spot is gone and progress falls behind the line, on-demand. It returns to spot only at an on-demand check
  (`SimPlan.od_check_s`) when spot is there and progress leads the line by the hysteresis (a literal reading that
  leaves on-demand the moment it is ahead flaps between idle and on-demand and pays a changeover each time).
  A safety net moves to on-demand for good when the slack left (time to the deadline less the remaining work and
  one restart) falls to what one more interruption could cost.
- `slack_reserve_5/10/25`: deadline-aware on slack instead of a line: wait for spot while the slack is above a
  reserve (5, 10 or 25% of the slack the run starts with, plus what one interruption costs), on-demand below it,
  and back to spot at an on-demand check whenever the slack pays a changeover and the hysteresis.
- `deadline_greedy`: spot or waiting for it until only the safety net's slack is left, then on-demand to the end.
  `decide_next_segment` is the rule at an hourly on-demand check. These continuous-time policies are the
  reference the executed ones (spotrun/policy/execution.py, the guard's view and cadence) are measured against.
Checkpointing: "notice", "periodic" or "both" (spotrun/policy/engine.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from .engine import INF, SimPlan, Tally, periodic_interval, progress_at, ready_after, segment, window_at

Trace = list[tuple[float, float]]
HYSTERESIS_CHANGEOVERS = 4.0  # lead (in changeovers) needed to leave on-demand for spot
RESERVE_CHANGEOVERS = 2.0  # the line aims this many changeovers before the deadline


def on_demand(plan: SimPlan, trace: Trace, checkpointing: str) -> Tally:
    tally = Tally()
    segment(plan, tally, 0.0, INF, INF, False, checkpointing)
    return tally


def _spot_until(plan: SimPlan, trace: Trace, checkpointing: str, tally: Tally, stop_at: float) -> None:
    """Managed spot from tally.t: restart in every window until finished or stopped at `stop_at` (wall) or when
    training time reaches MaxRuntime."""
    i = 0
    while not tally.finished:
        i = window_at(trace, tally.t, i)
        a, b = trace[i]
        start = max(a, tally.t)
        runtime_left = plan.max_runtime_s - tally.spot_s
        stop = min(stop_at, start + runtime_left)
        if start >= stop:
            tally.t = max(tally.t, min(stop_at, start))
            return
        segment(plan, tally, start, b, stop, True, checkpointing)
        if tally.t >= stop:
            return


def spot(plan: SimPlan, trace: Trace, checkpointing: str) -> Tally:
    tally = Tally()
    _spot_until(plan, trace, checkpointing, tally, INF)
    return tally


def maxwait_fallback(plan: SimPlan, trace: Trace, checkpointing: str) -> Tally:
    tally = Tally()
    _spot_until(plan, trace, checkpointing, tally, plan.max_wait_s)
    if not tally.finished:
        tally.switches += 1
        segment(plan, tally, tally.t, INF, INF, False, checkpointing)
    return tally


def _risk_s(plan: SimPlan, checkpointing: str) -> float:
    """What one more interruption or switch can cost in slack: a restart, a save, the work since the last
    commit."""
    at_risk = plan.step_s if plan.notice_ok and checkpointing != "periodic" else \
        min(periodic_interval(plan, checkpointing) + plan.save_s, plan.work_s)
    return plan.changeover_s + at_risk


def _line(plan: SimPlan, t: float) -> float:
    """Work the straight line asks for by time t."""
    target = max(plan.deadline_s - RESERVE_CHANGEOVERS * plan.changeover_s, plan.deadline_s / 2)
    return plan.work_s * min(1.0, t / target)


def _od_finish_s(plan: SimPlan, checkpointing: str, progress: float) -> float:
    """How long an on-demand job started now takes to finish: startup, restore, the work and its saves."""
    remaining = plan.work_s - progress
    interval = periodic_interval(plan, checkpointing)
    saves = max(0, math.ceil(remaining / interval) - 1) if interval < INF else 0
    return plan.startup_s + plan.restore_s + remaining + saves * plan.save_s


def _slack(plan: SimPlan, t: float, progress: float, checkpointing: str) -> float:
    """Deadline minus when an on-demand job started now would finish."""
    return plan.deadline_s - t - _od_finish_s(plan, checkpointing, progress)


@dataclass(frozen=True)
class DeadlineRule:
    """When a deadline-aware policy without spot capacity moves to on-demand, and when it returns.

    "line": Uniform Progress: on-demand once committed progress falls behind the line, back to spot when it
    leads the line by the hysteresis. "reserve": wait while the slack is above a reserve (`reserve_fraction` of
    the slack the run starts with), back to spot whenever the slack pays a changeover plus the hysteresis.
    "greedy": wait until only the safety net's slack is left, then on-demand to the end."""

    kind: str
    reserve_fraction: float = 0.5

    def on_demand_at(self, plan: SimPlan, ck: str, progress: float) -> float:
        """When, waiting for capacity with this progress, the run moves to on-demand."""
        if self.kind == "line":
            return _time_line_reaches(plan, progress)
        if self.kind == "reserve":
            return plan.deadline_s - _od_finish_s(plan, ck, progress) - self.reserve_s(plan, ck)
        return INF

    def reserve_s(self, plan: SimPlan, ck: str) -> float:
        start = plan.deadline_s - _od_finish_s(plan, ck, 0.0) - _risk_s(plan, ck)
        return _risk_s(plan, ck) + self.reserve_fraction * max(0.0, start)

    def back_to_spot(self, plan: SimPlan, ck: str, progress: float, now: float) -> bool:
        """On on-demand at a check, with spot there: return to it?"""
        if self.kind == "greedy":
            return False
        hysteresis = HYSTERESIS_CHANGEOVERS * plan.changeover_s
        affordable = _slack(plan, now + plan.changeover_s, progress, ck) > _risk_s(plan, ck) + hysteresis
        if self.kind == "line":
            return affordable and progress - _line(plan, now) >= hysteresis
        return affordable


UNIFORM_PROGRESS = DeadlineRule("line")
GREEDY = DeadlineRule("greedy")
RESERVES = {"slack_reserve_5": DeadlineRule("reserve", 0.05), "slack_reserve_10": DeadlineRule("reserve", 0.10),
            "slack_reserve_25": DeadlineRule("reserve", 0.25)}


def decide_next_segment(progress_s: float, now_s: float, plan: SimPlan, *, on_demand_now: bool,
                        spot_available: bool, checkpointing: str | None = None,
                        rule: DeadlineRule = UNIFORM_PROGRESS) -> str:
    """The deadline-aware rule as the guard applies it at a decision point: "spot", "on_demand" or "wait" (no
    job: spot is gone and the run can afford to wait). `progress_s`: the newest committed checkpoint's work in
    seconds (its step x the planned step time); `now_s`: seconds since the run started."""
    ck = checkpointing or plan.default_checkpointing()
    if plan.deadline_s is None:
        return "spot" if spot_available else "wait"
    if progress_s >= plan.work_s:
        return "on_demand" if on_demand_now else "spot"
    if _slack(plan, now_s, progress_s, ck) <= _risk_s(plan, ck):
        return "on_demand"
    if on_demand_now:
        return "spot" if spot_available and rule.back_to_spot(plan, ck, progress_s, now_s) else "on_demand"
    if spot_available:
        return "spot"
    return "on_demand" if now_s >= rule.on_demand_at(plan, ck, progress_s) else "wait"


def uniform_progress(plan: SimPlan, trace: Trace, checkpointing: str) -> Tally:
    return _deadline_aware(plan, trace, checkpointing, UNIFORM_PROGRESS)


def _reserve_policy(rule: DeadlineRule) -> Callable[[SimPlan, Trace, str], Tally]:
    def policy(plan: SimPlan, trace: Trace, checkpointing: str) -> Tally:
        return _deadline_aware(plan, trace, checkpointing, rule)

    return policy


def deadline_greedy(plan: SimPlan, trace: Trace, checkpointing: str) -> Tally:
    """Spot (or waiting for it) until only the safety net's slack is left, then on-demand to the end."""
    return _deadline_aware(plan, trace, checkpointing, GREEDY)


def _deadline_aware(plan: SimPlan, trace: Trace, checkpointing: str, rule: DeadlineRule) -> Tally:
    if plan.deadline_s is None:
        return spot(plan, trace, checkpointing)
    tally, i = Tally(), 0
    risk = _risk_s(plan, checkpointing)
    while not tally.finished:
        i = window_at(trace, tally.t, i)
        a, b = trace[i]
        if a > tally.t:  # no capacity now: wait while the rule allows, else on-demand (or when slack runs out)
            safe_until = plan.deadline_s - _od_finish_s(plan, checkpointing, tally.progress) - risk
            od_at = min(rule.on_demand_at(plan, checkpointing, tally.progress), safe_until)
            if od_at >= a:
                tally.t = a
                continue
            tally.t = max(tally.t, od_at)
            _on_demand_stint(plan, trace, checkpointing, tally, rule)
            continue
        if _slack(plan, tally.t, tally.progress, checkpointing) <= risk:
            tally.switches += 1
            segment(plan, tally, tally.t, INF, INF, False, checkpointing)
            return tally
        stop = _spot_safety_stop(plan, checkpointing, tally, risk)
        segment(plan, tally, tally.t, b, stop, True, checkpointing)
        if not tally.finished and tally.t >= stop:
            tally.switches += 1
            segment(plan, tally, tally.t, INF, INF, False, checkpointing)
    return tally


def _time_line_reaches(plan: SimPlan, progress: float) -> float:
    target = max(plan.deadline_s - RESERVE_CHANGEOVERS * plan.changeover_s, plan.deadline_s / 2)
    return progress / plan.work_s * target


def _spot_safety_stop(plan: SimPlan, checkpointing: str, tally: Tally, risk: float) -> float:
    """When slack, which a spot job spends on its startup and its saves, reaches the risk: stop there."""
    interval = periodic_interval(plan, checkpointing)
    saving = plan.save_s / (interval + plan.save_s) if interval < INF else 0.0
    spare = _slack(plan, tally.t, tally.progress, checkpointing) - risk - ready_after(plan, tally)
    if spare <= 0:
        return tally.t
    return tally.t + ready_after(plan, tally) + (spare / saving if saving > 0 else INF)


def _on_demand_stint(plan: SimPlan, trace: Trace, checkpointing: str, tally: Tally, rule: DeadlineRule) -> None:
    """An on-demand job from tally.t, checked every od_check_s; it ends at the first check where
    `decide_next_segment` returns to spot (or when the run finishes)."""
    tally.switches += 1
    start, p0 = tally.t, tally.progress
    ready = start + ready_after(plan, tally)
    check, i = ready + plan.od_check_s, 0
    while rule.kind != "greedy":
        p = progress_at(plan, checkpointing, p0, ready, check)
        if p >= plan.work_s:
            break
        i = window_at(trace, check, i)
        available = trace[i][0] <= check
        if decide_next_segment(p, check, plan, on_demand_now=True, spot_available=available,
                               checkpointing=checkpointing, rule=rule) == "spot":
            segment(plan, tally, start, INF, check, False, checkpointing)
            if not tally.finished:
                tally.switches += 1
            return
        check += plan.od_check_s
    segment(plan, tally, start, INF, INF, False, checkpointing)


POLICIES: dict[str, Callable[[SimPlan, Trace, str], Tally]] = {
    "on_demand": on_demand, "spot": spot, "maxwait_fallback": maxwait_fallback,
    "uniform_progress": uniform_progress, "deadline_greedy": deadline_greedy,
    **{name: _reserve_policy(rule) for name, rule in RESERVES.items()},
}


def describe(policy: str, checkpointing: str) -> str:
    return f"{policy} ({checkpointing})" if policy != "on_demand" else policy


def cost_usd(plan: SimPlan, tally: Tally) -> tuple[float, float]:
    """(spot, on-demand) billed dollars."""
    return tally.spot_s / 3600 * plan.spot_usd_per_h, tally.od_s / 3600 * plan.on_demand_usd_per_h

