"""The exact offline optimum: the least a run can cost on one trace, knowing the trace in advance, under the
engine's cost model (spotrun/policy/engine.py); the floor every online policy is measured against. Stdlib only.

`solve(plan, trace) -> Optimum`: `usd` (None when the deadline cannot be met), whether it is exact, and its size.

The model is the engine's with saves on the notice (`segment`, checkpointing "notice"): each job bills its
startup, a restore once anything is saved, its work; an interruption saves on the notice unbilled; a stop the
schedule chooses bills one save (SIGTERM) before the next job may start. Each start is billed once. Work is
continuous: the engine's loss of the step in progress at an interruption (at most `step_s`, none when a window's
edges fall on step boundaries) is not charged. MaxWait and MaxRuntime, SageMaker's limits on a policy's jobs, do
not bind the optimum. For a plan whose checkpoint cannot leave within the notice (`notice_ok` false) the same
model is a relaxation (free notice saves, no periodic save time): a floor, not the exact optimum.

Knowing the trace, an optimal schedule (each claim checked against an exhaustive search of the engine's own
schedules in tests/spotrun/test_optimum.py) runs spot from a window's start to its end or the finish (stopping
spot early only adds a save and a restart), and on-demand either to the finish or as a block that stops one save
before a window opens; a block may start any time, so the work it does is a range.

The dynamic program goes event by event (window starts and ends, in time order). A state is the slack used so
far, sigma = time - work done (waits, startups, restores, saves), and the cost paid; sigma <= deadline - work is
what meeting the deadline needs. Two sets of states are kept, each only where no state has less slack used for
at most the cost (a Pareto frontier): idle, and on-demand running. Every frontier is a list of pieces
(sigma_lo, sigma_hi, J) of states with cost J - po x sigma (po: the on-demand price per second): waiting, a
block's range of start times and a spot job each map a piece to a piece.

Bounds (for any plan: the horizon is the deadline; without one, the trace's last window, and where that one
stays open the answer is one spot job in it, the least any schedule costs): windows no longer
than a startup are skipped (no job gains work in them); each event costs O(P log P) for P pieces, P is capped
at `MAX_PIECES` per frontier: past the cap the neighbouring pieces whose costs differ least merge, at the
lesser cost (a relaxation: still a floor) and `Optimum.exact` is false. Time O(windows x MAX_PIECES log
MAX_PIECES), memory O(MAX_PIECES).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from .engine import INF, SimPlan

MAX_PIECES = 512
Piece = tuple[float, float, float]  # (sigma_lo, sigma_hi, J): cost J - po sigma


@dataclass(frozen=True)
class Optimum:
    """One trace's optimum: `usd` (None: the deadline cannot be met), whether it is exact (the module's
    docstring), the windows it went through and the most pieces a frontier held."""

    usd: float | None
    exact: bool
    windows: int
    pieces: int


def pareto(pieces: list[Piece], po: float) -> list[Piece]:
    """The states of the pieces that no other state beats on both slack and cost, as disjoint pieces sorted by
    sigma: a sweep over the pieces' ends with a heap of the open ones (least J first) and the least cost of
    everything to the left (`left`)."""
    if not pieces:
        return []
    cuts = sorted({p[0] for p in pieces} | {p[1] for p in pieces})
    by_lo = sorted(pieces)
    heap: list[tuple[float, float]] = []  # (J, sigma_hi)
    out: list[Piece] = []
    left, i = INF, 0
    for n, c in enumerate(cuts):
        while i < len(by_lo) and by_lo[i][0] <= c:
            heapq.heappush(heap, (by_lo[i][2], by_lo[i][1]))
            i += 1
        while heap and heap[0][1] < c:
            heapq.heappop(heap)
        if not heap:
            continue
        at_c = heap[0][0] - po * c
        if at_c < left:
            _append(out, (c, c, heap[0][0]))
            left = at_c
        nxt = cuts[n + 1] if n + 1 < len(cuts) else None
        while heap and heap[0][1] <= c:  # pieces ending here do not reach the next cut
            heapq.heappop(heap)
        if nxt is None or not heap:
            continue
        j = heap[0][0]
        start = max(c, (j - left) / po) if left < INF else c
        if start < nxt:
            _append(out, (start, nxt, j))
            left = min(left, j - po * nxt)
    return out


def _append(out: list[Piece], piece: Piece) -> None:
    if out and out[-1][2] == piece[2] and out[-1][1] >= piece[0]:
        out[-1] = (out[-1][0], max(out[-1][1], piece[1]), piece[2])
    else:
        out.append(piece)


class _Solver:
    def __init__(self, plan: SimPlan):
        self.plan = plan
        self.ps, self.po = plan.spot_usd_per_h / 3600, plan.on_demand_usd_per_h / 3600
        self.deadline = plan.deadline_s if plan.deadline_s is not None else INF
        self.slack = self.deadline - plan.work_s  # the most slack a schedule that meets the deadline uses
        self.restart = plan.startup_s + plan.restore_s  # a job's time before its first step, once saved
        self.best = self.po * (plan.startup_s + plan.work_s) if self.slack >= plan.startup_s else INF
        self.idle: list[Piece] = []
        self.run: list[Piece] = []
        self.tau = 0.0
        self.exact = True
        self.most = 0

    def advance(self, to: float) -> None:
        """From tau to `to`: idle states wait; on-demand jobs run on; any idle state (and the fresh one: nothing
        done yet) may start one at any time in between (J + po (overhead + dt) over sigma + overhead .. + dt)."""
        dt, po = to - self.tau, self.po
        run = [(lo, hi, j + po * dt) for lo, hi, j in self.run]
        run += [(lo + self.restart, hi + self.restart + dt, j + po * (self.restart + dt)) for lo, hi, j in self.idle]
        c = self.plan.startup_s
        if self.tau + c <= self.slack:
            run.append((self.tau + c, self.tau + c + dt, po * (self.tau + c + dt)))
        self.idle = [(lo + dt, hi + dt, j + po * dt) for lo, hi, j in self.idle]
        self.tau = to
        self.idle = self.keep(self.idle, self.restart)
        self.run = self.keep(run, 0.0)

    def keep(self, pieces: list[Piece], overhead: float) -> list[Piece]:
        """The frontier of the pieces, less the states that cannot meet the deadline or beat the best found.
        From a state the rest costs at least the remaining work (and `overhead`) at the spot price:
        J - po sigma + ps (overhead + W - tau + sigma)."""
        base, m, out = self.ps * (overhead + self.plan.work_s - self.tau), self.po - self.ps, []
        for lo, hi, j in pareto(pieces, self.po):
            hi = min(hi, self.slack)
            if m > 0:
                lo = max(lo, (j + base - self.best) / m)
            elif j + base - m * hi >= self.best:
                continue
            if lo <= hi:
                out.append((lo, hi, j))
        if len(out) > MAX_PIECES:
            out = self.relax(out)
        self.most = max(self.most, len(out))
        return out

    def relax(self, pieces: list[Piece]) -> list[Piece]:
        """Past the cap: neighbours in slack whose J differ least merge, each pair into one piece over both
        ranges at the lesser J (every state it replaces is at least as dear: still a floor, too low by at most
        the J difference over the merged range)."""
        self.exact = False
        merges = len(pieces) - MAX_PIECES
        gaps = sorted(range(len(pieces) - 1), key=lambda n: abs(pieces[n + 1][2] - pieces[n][2]))[:merges]
        joined, out = set(gaps), []
        for n, piece in enumerate(pieces):
            if n - 1 in joined:
                lo, hi, j = out[-1]
                out[-1] = (lo, max(hi, piece[1]), min(j, piece[2]))
            else:
                out.append(piece)
        return out

    def window(self, a: float, b: float) -> list[Piece]:
        """Spot from `a` for every state that can start there: finish inside the window and the deadline, or
        be idle at `b` (returned)."""
        s, po = self.plan.save_s, self.po
        entering = [(p, self.restart) for p in self.idle]
        entering += [((lo + s, hi + s, j + po * s), self.restart) for lo, hi, j in self.run]  # stopped at a - s
        if a + self.plan.startup_s <= self.slack:
            entering.append(((a, a, po * a), self.plan.startup_s))  # the first job: nothing to restore
        out = []
        for (lo, hi, j), o in entering:
            self.finish_on_spot(lo, hi, j, o, a, b)
            limit = min(b, self.deadline) - o - self.plan.work_s  # the most slack that finishes here
            if b < self.deadline and b - a > o and max(lo, limit) <= hi:
                out.append((max(lo, limit) + o, hi + o, j + self.ps * (b - a) + po * o))
        return out

    def finish_on_spot(self, lo: float, hi: float, j: float, o: float, a: float, b: float) -> None:
        """Cost J - po sigma + ps (o + W - (a - sigma)) for sigma up to where the finish fits; linear in sigma."""
        top = min(hi, min(b, self.deadline) - o - self.plan.work_s)
        for sigma in (lo, top) if lo <= top else ():
            self.best = min(self.best, j - self.po * sigma + self.ps * (o + self.plan.work_s - a + sigma))

    def finish_on_demand(self, pieces: list[Piece]) -> None:
        """On-demand from idle to the finish, started at once: J + po (overhead + W - tau) where it fits."""
        for lo, _, j in pieces:
            if lo + self.restart <= self.slack:
                self.best = min(self.best, j + self.po * (self.restart + self.plan.work_s - self.tau))


def solve(plan: SimPlan, trace: list) -> Optimum:
    """The dynamic program (the module's docstring); `trace`: sorted disjoint windows [(start, end), ...]."""
    sv = _Solver(plan)
    if plan.deadline_s is None and any(b == INF > a for a, b in trace):
        # no deadline and capacity that stays: one spot job in it, the least any schedule can cost
        return Optimum(min(sv.ps, sv.po) * (plan.startup_s + plan.work_s), True, 0, 0)
    windows = 0
    for a, b in trace:
        if a >= sv.deadline or a >= b:
            break
        if b - a <= plan.startup_s:  # no job gains work here
            continue
        windows += 1
        sv.advance(max(a, sv.tau))
        arrived = sv.window(a, b)
        if b >= sv.deadline or b == INF:
            break
        sv.advance(b)
        sv.idle = sv.keep(sv.idle + arrived, sv.restart)
        sv.finish_on_demand(sv.idle)
    return Optimum(None if sv.best == INF else sv.best, sv.exact, windows, sv.most)
