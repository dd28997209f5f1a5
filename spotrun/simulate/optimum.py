"""The exact offline optimum: the least a run can cost on one trace, knowing the trace in advance, under the
engine's cost model (spotrun/simulate/engine.py); the floor every online policy is measured against. Stdlib only.

`exact_optimum(plan, trace) -> float | None`: USD, or None when the deadline cannot be met.

The model is the engine's with saves on the notice (`segment` with checkpointing "notice"): each job bills its
startup, a restore once anything is saved, its work; an interruption saves on the notice for free and loses the
step in progress; a stop the schedule chooses bills one save (SIGTERM) before the next job may start. Work counts
in whole steps (`step_s`), as the engine's saves do. MaxWait and MaxRuntime, SageMaker's limits on a policy's
jobs, do not bind the optimum. For a plan whose checkpoint cannot leave within the notice (`notice_ok` false) the
same model is a relaxation (free notice saves, no periodic save time): a floor, not an exact optimum.

Knowing the trace, an optimal schedule (each claim checked against an exhaustive search of the engine's own
schedules in tests/spotrun/test_optimum.py):
- runs a spot job from a window's start (or later, to bill only whole steps) to the window's end or the finish:
  stopping spot early only adds a save and a restart, and spot is the cheaper market at the same speed;
- runs on-demand either to the finish, or as a block that stops one save before a window opens; the block may
  start any time after the last job ended, so the work it does is a range (0 .. the gap's capacity).
The dynamic program goes window by window. Its state, idle after a job, is a family of (progress, cost) points
`cost = intercept + on-demand price x progress` over a range of whole steps (a block's range of work keeps that
form, a spot job shifts it), kept only where nothing has at least as much progress for at most the cost.

Bounds (for any plan: the horizon is the deadline, without one the trace's last window): windows shorter than
a startup are skipped (no job gains a step in them); per window the work is O(F log F) for the F families kept
(every family may still reach a later window by on-demand), and F is capped at `MAX_FAMILIES`: past the cap the
families of one window merge into their lower envelope with the lowest intercept over the union of their ranges
(a relaxation: still a floor) and `Optimum.exact` says so. Time O(windows x MAX_FAMILIES log MAX_FAMILIES),
memory O(MAX_FAMILIES).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .engine import INF, SimPlan

MAX_FAMILIES = 4096
_EPS = 1e-9


@dataclass(frozen=True)
class Family:
    """Idle from `t` with progress k x step for k in [lo, hi], at cost intercept + po x k x step (po per second)."""

    t: float
    lo: int
    hi: int
    intercept: float


@dataclass(frozen=True)
class Optimum:
    """One trace's optimum: `usd` (None: the deadline cannot be met), whether it is exact (see the module's
    docstring), and the windows and families it went through (its work)."""

    usd: float | None
    exact: bool
    windows: int
    families: int


def exact_optimum(plan: SimPlan, trace: list) -> float | None:
    """The least cost (USD) of finishing `plan.work_s` by the deadline on this trace, or None if no schedule
    can (on-demand from the start misses it)."""
    return solve(plan, trace).usd


def optimum_costs(plan: SimPlan, traces: list) -> list[float | None]:
    return [exact_optimum(plan, trace) for trace in traces]


def _whole_steps(seconds: float, step: float) -> int:
    """Whole steps in `seconds` of work, as the engine saves them (done - fmod(done, step))."""
    if seconds <= 0:
        return 0
    return int(round((seconds - math.fmod(seconds, step)) / step))


class _Solver:
    def __init__(self, plan: SimPlan):
        self.plan = plan
        self.step = plan.step_s
        self.ps, self.po = plan.spot_usd_per_h / 3600, plan.on_demand_usd_per_h / 3600
        self.deadline = plan.deadline_s if plan.deadline_s is not None else INF
        self.best = INF
        self.exact = True

    def overhead(self, k: int) -> float:
        """A job's time before its first step: startup, and the restore once anything is saved."""
        return self.plan.startup_s + (self.plan.restore_s if k > 0 else 0.0)

    def on_demand_finish(self, f: Family) -> None:
        """On-demand from f's idle time to the finish: the cost is the same at every point of the family, the
        deadline needs the most progress."""
        o = self.overhead(f.lo)
        if f.t + o + self.plan.work_s - f.hi * self.step <= self.deadline + _EPS:
            self.best = min(self.best, f.intercept + self.po * (o + self.plan.work_s))

    def entering(self, families: list[Family], a: float) -> list[tuple[int, int, float]]:
        """What can start a spot job at `a`: each family as it is (it waited), and the range an on-demand block
        adds above it (a block that stops one save before `a`)."""
        s, top = self.plan.save_s, self.last_unfinished_k()
        out = []
        for f in families:
            out.append((f.lo, f.hi, f.intercept))
            o = self.overhead(f.lo)
            room = _whole_steps(a - s - o - f.t, self.step)
            hi = min(f.hi + room, top)
            if room > 0 and hi > f.hi:
                out.append((f.hi + 1, hi, f.intercept + self.po * (o + s)))
        return out

    def last_unfinished_k(self) -> int:
        """The most whole steps short of the work (more is the finish)."""
        k = math.ceil(self.plan.work_s / self.step - _EPS) - 1
        return max(k, 0)

    def spot_window(self, pieces: list[tuple[int, int, float]], a: float, b: float) -> list[Family]:
        """A spot job from `a` to the window's end or the finish, from every piece; the families idle at b."""
        out = []
        for lo, hi, icpt in pieces:
            if lo == 0:  # the first job: nothing to restore
                self.spot_piece(0, 0, icpt, a, b, out)
                lo += 1
            if lo <= hi:
                self.spot_piece(lo, hi, icpt, a, b, out)
        return out

    def spot_piece(self, lo: int, hi: int, icpt: float, a: float, b: float, out: list[Family]) -> None:
        o, step, work = self.overhead(lo), self.step, self.plan.work_s
        fits = min(b, self.deadline) - a - o  # work that finishes inside the window and the deadline
        k_fin = lo if fits == INF else max(lo, math.ceil((work - fits) / step - _EPS))
        if k_fin <= hi:  # cost linear in k: icpt + po k step + ps (o + W - k step)
            for k in (k_fin, hi):
                self.best = min(self.best, icpt + self.po * k * step + self.ps * (o + work - k * step))
        top = min(hi, k_fin - 1)
        if b >= self.deadline or top < lo:  # nothing left unfinished that could still finish
            return
        gain = _whole_steps(b - a - o, step)
        if gain > 0:
            out.append(Family(b, lo + gain, top + gain, icpt + self.ps * (o + gain * step) - self.po * gain * step))

    def pareto(self, pieces: list[tuple[int, int, float]]) -> list[tuple[int, int, float]]:
        """The lower envelope of the pieces, then only points no other point has more progress for at most the
        cost of. Pieces are (lo, hi, intercept) over whole steps."""
        envelope = _envelope(pieces)
        kept, floor = [], INF
        for lo, hi, icpt in reversed(envelope):  # from the most progress down
            # keep k where icpt + po k step < floor
            limit = hi if floor == INF else min(hi, math.ceil((floor - icpt) / (self.po * self.step) - _EPS) - 1)
            if limit >= lo:
                kept.append((lo, limit, icpt))
                floor = min(floor, icpt + self.po * lo * self.step)
        return kept[::-1]


def _envelope(pieces: list[tuple[int, int, float]]) -> list[tuple[int, int, float]]:
    """For each k covered, the least intercept; as disjoint (lo, hi, intercept) sorted by lo."""
    if not pieces:
        return []
    cuts = sorted({p[0] for p in pieces} | {p[1] + 1 for p in pieces})
    by_lo = sorted(pieces)
    out: list[tuple[int, int, float]] = []
    active: list[tuple[int, int, float]] = []
    i = 0
    for lo, nxt in zip(cuts, cuts[1:], strict=False):
        while i < len(by_lo) and by_lo[i][0] <= lo:
            active.append(by_lo[i])
            i += 1
        active = [p for p in active if p[1] >= lo]
        if not active:
            continue
        icpt = min(p[2] for p in active)
        if out and out[-1][1] == lo - 1 and out[-1][2] == icpt:
            out[-1] = (out[-1][0], nxt - 1, icpt)
        else:
            out.append((lo, nxt - 1, icpt))
    return out


def solve(plan: SimPlan, trace: list) -> Optimum:
    """The dynamic program (the module's docstring); `trace` is sorted disjoint windows [(start, end), ...]."""
    sv = _Solver(plan)
    families = [Family(0.0, 0, 0, 0.0)]
    sv.on_demand_finish(families[0])
    windows = 0
    for a, b in trace:
        if a >= sv.deadline or a >= b:
            break
        if b - a <= plan.startup_s:  # no job gains a step here
            continue
        windows += 1
        pieces = sv.pareto(sv.entering(families, a))
        new = sv.spot_window(pieces, a, b)
        if new:
            merged = [Family(b, lo, hi, icpt) for lo, hi, icpt in sv.pareto([(f.lo, f.hi, f.intercept) for f in new])]
            for f in merged:
                sv.on_demand_finish(f)
            families.extend(merged)
        if len(families) > MAX_FAMILIES:
            families = _relax(families, sv)
    return Optimum(None if sv.best == INF else sv.best, sv.exact, windows, len(families))


def _relax(families: list[Family], sv: _Solver) -> list[Family]:
    """Past the cap: one family at the earliest idle time over the whole range, at the lowest intercept (a
    relaxation: every point it replaces is at least as dear, later and no further)."""
    sv.exact = False
    return [Family(min(f.t for f in families), min(f.lo for f in families), max(f.hi for f in families),
                   min(f.intercept for f in families))]
