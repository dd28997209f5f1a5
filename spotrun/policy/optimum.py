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

Pruning (none of it changes the answer; `solve(..., pruned=False)` is the program without it, which the tests
check it against): before the program, a few schedules are costed (`greedy`: spot in every window at most so
dear a second of work, on-demand to the finish from the best point), the cheapest a first best; a state is kept
only where a lower bound on the rest (the remaining work at the spot price, and `_Solver.bound`'s knapsack of
the windows left, each at its price a second of work, and on-demand) plus the cost paid is below the best found;
and the program ends once no state is left and no first job started from there on could beat the best. On the
public traces replayed without a deadline (weeks of windows, most of a few 10-minute samples) the first schedule
is the optimum on about 99% of them and the program only proves it: the frontiers stay under a hundred pieces.

Bounds (for any plan: the horizon is the deadline; without one, the trace's last window, and where that one
stays open the answer is one spot job in it, the least any schedule costs): windows no longer
than a startup are skipped (no job gains work in them); each event costs O(P log P) for P pieces, P is capped
at `MAX_PIECES` per frontier: past the cap the neighbouring pieces whose costs differ least merge, at the
lesser cost (a relaxation: still a floor) and `Optimum.exact` is false; the first schedules are at most
`FIRST_SCHEDULES`, O(windows) each. Time O(windows x (FIRST_SCHEDULES + MAX_PIECES log MAX_PIECES)), memory
O(windows + MAX_PIECES).
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate

from .engine import INF, SimPlan

MAX_PIECES = 512
FIRST_SCHEDULES = 32  # the most first schedules (`greedy`) costed before the program
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
    everything to the left (`left`). The hot loop of the program: `_append`, `max` and `min` are written out
    inline (the same comparisons, so the same floats)."""
    if not pieces:
        return []
    cuts = sorted({p[0] for p in pieces} | {p[1] for p in pieces})
    # by sigma_lo only: the heap's top is its least (J, sigma_hi) whatever the order the ties were pushed in
    by_lo = sorted(pieces, key=_lo)
    push, pop = heapq.heappush, heapq.heappop
    heap: list[tuple[float, float]] = []  # (J, sigma_hi)
    out: list[Piece] = []
    left, i, total, last = INF, 0, len(by_lo), len(cuts) - 1
    for n, c in enumerate(cuts):
        while i < total and by_lo[i][0] <= c:
            lo, hi, j = by_lo[i]
            push(heap, (j, hi))
            i += 1
        while heap and heap[0][1] < c:
            pop(heap)
        if not heap:
            continue
        j = heap[0][0]
        at_c = j - po * c
        if at_c < left:
            if out and out[-1][2] == j and out[-1][1] >= c:  # _append
                prev = out[-1]
                out[-1] = (prev[0], c if c > prev[1] else prev[1], j)
            else:
                out.append((c, c, j))
            left = at_c
        while heap and heap[0][1] <= c:  # pieces ending here do not reach the next cut
            pop(heap)
        if n == last or not heap:
            continue
        nxt = cuts[n + 1]
        j = heap[0][0]
        if left < INF:
            start = (j - left) / po
            if not start > c:
                start = c
        else:
            start = c
        if start < nxt:
            if out and out[-1][2] == j and out[-1][1] >= start:  # _append
                prev = out[-1]
                out[-1] = (prev[0], nxt if nxt > prev[1] else prev[1], j)
            else:
                out.append((start, nxt, j))
            at_nxt = j - po * nxt
            if at_nxt < left:
                left = at_nxt
    return out


def _lo(piece: Piece) -> float:
    return piece[0]


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
        self.caps: list[float] = []  # the knapsack bound (`bound`) of the windows from tau on
        self.gains: list[float] = []
        self.knapsack = True
        self.exact = True
        self.most = 0

    def advance(self, to: float, arrived: tuple | list = ()) -> None:
        """From tau to `to`: idle states wait; on-demand jobs run on; any idle state (and the fresh one: nothing
        done yet) may start one at any time in between (J + po (overhead + dt) over sigma + overhead .. + dt).
        `arrived`: idle states at `to` (a spot window's), joining the idle frontier."""
        dt, po = to - self.tau, self.po
        run = [(lo, hi, j + po * dt) for lo, hi, j in self.run]
        run += [(lo + self.restart, hi + self.restart + dt, j + po * (self.restart + dt)) for lo, hi, j in self.idle]
        c = self.plan.startup_s
        if self.tau + c <= self.slack:
            run.append((self.tau + c, self.tau + c + dt, po * (self.tau + c + dt)))
        self.idle = [(lo + dt, hi + dt, j + po * dt) for lo, hi, j in self.idle]
        self.tau = to
        self.idle = self.keep(self.idle + list(arrived), self.restart)
        self.run = self.keep(run, 0.0)

    def keep(self, pieces: list[Piece], overhead: float) -> list[Piece]:
        """The frontier of the pieces, less the states that cannot meet the deadline or beat the best found.
        From a state (sigma, cost J - po sigma) the remaining work is R = W - tau + sigma, and the rest costs at
        least ps (overhead + R) and at least K(R) (`bound`); both fall (or stay) in sigma once the cost paid is
        counted, so a piece keeps the sigmas from where both are below the best found. Both bounds grow with the
        slack used and the cost paid, so what a state dominates is cut with it: cutting first, then taking the
        frontier, is the frontier cut."""
        if not pieces:
            return []
        po, best, slack, left = self.po, self.best, self.slack, self.plan.work_s - self.tau
        base, m, cut = self.ps * (overhead + left), po - self.ps, []
        past, n = -left, len(self.gains) if self.knapsack else -1
        if m <= 0:
            for lo, hi, j in pieces:
                lo, hi = max(lo, past), min(hi, slack)
                if lo <= hi and j + base - m * hi < best:
                    cut.append((lo, hi, j))
        caps, gains = self.caps, self.gains
        for lo, hi, j in pieces if m > 0 else ():
            if hi > slack:
                hi = slack
            low = (j + base - best) / m
            if low < past:  # work done tau - sigma past W: the job finished before
                low = past
            if low > lo:
                lo = low
            if lo > hi:
                continue
            c = best - j - po * left  # K(R) < best - paid: G(R) < c (`least_rest`, inline)
            if c <= 0 and n >= 0:
                i = bisect_right(gains, -c)
                if i == n:
                    continue
                cap0, gain0 = (caps[i - 1], gains[i - 1]) if i else (0.0, 0.0)
                low = cap0 + (-c - gain0) / (gains[i] - gain0) * (caps[i] - cap0) - left
                if low > lo:
                    lo = low
                if lo > hi:
                    continue
            cut.append((lo, hi, j))
        out = pareto(cut, po) if len(cut) > 1 else cut
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

    def bound(self, windows: list[tuple[float, float]]) -> None:
        """The knapsack bound of what is left after tau: window k sells up to w_k = its length (to the deadline)
        less a startup of work at ps x length / w_k a second of work (a job in it bills at least a startup with
        its x <= w_k seconds of work: ps (startup + x) >= that price x x), on-demand sells any amount at po.
        K(R), the least R seconds of work cost so, is convex; kept as G(R) = K(R) - po R, falling through
        (caps[i], -gains[i]) over the windows cheaper than on-demand, cheapest first, then flat."""
        self.caps, self.gains = list(accumulate(w for w, _ in windows)), list(accumulate(g for _, g in windows))

    def least_rest(self, c: float) -> float:
        """The least R with G(R) < c (-INF: every R, INF: none)."""
        if c > 0:
            return -INF
        i = bisect_right(self.gains, -c)  # the first breakpoint below c
        if i == len(self.gains):
            return INF
        cap0, gain0 = (self.caps[i - 1], self.gains[i - 1]) if i else (0.0, 0.0)
        return cap0 + (-c - gain0) / (self.gains[i] - gain0) * (self.caps[i] - cap0)

    def fresh_can_win(self) -> bool:
        """Whether the first job, started from tau on, can cost less than the best found: it costs at least a
        startup and the work at the spot price, the work past what spot can still do at the on-demand one."""
        if self.tau + self.plan.startup_s > self.slack:
            return False
        low = min(self.ps, self.po) * (self.plan.startup_s + self.plan.work_s)
        return low < self.best and self.least_rest(self.best - self.po * self.plan.work_s) <= self.plan.work_s

    def finish_on_demand(self, pieces: list[Piece]) -> None:
        """On-demand from idle to the finish, started at once: J + po (overhead + W - tau) where it fits."""
        for lo, _, j in pieces:
            if lo + self.restart <= self.slack:
                self.best = min(self.best, j + self.po * (self.restart + self.plan.work_s - self.tau))


def solve(plan: SimPlan, trace: list, *, pruned: bool = True) -> Optimum:
    """The dynamic program (the module's docstring); `trace`: sorted disjoint windows [(start, end), ...].
    `pruned=False`: without the first schedules (`greedy`), the knapsack bound and the early end, the plain
    program the tests check the pruned one against."""
    sv = _Solver(plan)
    if plan.deadline_s is None and any(b == INF > a for a, b in trace):
        # no deadline and capacity that stays: one spot job in it, the least any schedule can cost
        return Optimum(min(sv.ps, sv.po) * (plan.startup_s + plan.work_s), True, 0, 0)
    usable = []
    for a, b in trace:
        if a >= sv.deadline or a >= b:
            break
        if b - a > plan.startup_s:  # no job gains work in a shorter window
            usable.append((a, b))
    # the knapsack bound's windows (`_Solver.bound`): (w_k, po w_k - ps length) for those cheaper than on-demand
    offers = []
    for k, (a, b) in enumerate(usable):
        length = min(b, sv.deadline) - a
        w = length - plan.startup_s
        if w > 0 and sv.ps * length < sv.po * w:
            offers.append((sv.ps * length / w, k, w, sv.po * w - sv.ps * length))
    offers.sort()
    if pruned:  # at most FIRST_SCHEDULES thresholds, spread over the prices (O(windows) each)
        prices = sorted({price for price, *_ in offers})
        if len(prices) > FIRST_SCHEDULES:
            prices = [prices[round(i * (len(prices) - 1) / (FIRST_SCHEDULES - 1))] for i in range(FIRST_SCHEDULES)]
        for dearest in [INF, *prices]:
            sv.best = greedy(plan, usable, dearest, sv.best)
    sv.knapsack = pruned
    windows, bound = 0, -1
    for k, (a, b) in enumerate(usable):
        if bound != k:
            sv.bound([(w, g) for _, i, w, g in offers if i >= k])
        if pruned and not sv.idle and not sv.run and not sv.fresh_can_win():
            break  # no state left and no job started from here on can beat the best found
        windows += 1
        sv.advance(max(a, sv.tau))
        arrived = sv.window(a, b)
        if b >= sv.deadline or b == INF:
            break
        bound = k + 1
        sv.bound([(w, g) for _, i, w, g in offers if i >= bound])
        sv.advance(b, arrived)
        sv.finish_on_demand(sv.idle)
    return Optimum(None if sv.best == INF else sv.best, sv.exact, windows, sv.most)


def greedy(plan: SimPlan, usable: list, dearest: float = INF, best: float = INF) -> float:
    """A schedule's cost, a first best to prune against: spot in every window whose price a second of work
    (ps x length / (length - startup)) is at most `dearest` (each a job, from the window's start to its end or
    the finish), and from the start or any window's end either on-demand to the finish or an on-demand block
    that leaves the next window just enough work to finish in; the cheapest of those that meet the deadline and
    `best` (INF: none)."""
    ps, po = plan.spot_usd_per_h / 3600, plan.on_demand_usd_per_h / 3600
    deadline = plan.deadline_s if plan.deadline_s is not None else INF
    paid, done, t, restart = 0.0, 0.0, 0.0, plan.startup_s + plan.restore_s
    for a, b in usable + [(INF, INF)]:
        if paid >= best:
            break
        o = plan.startup_s + (plan.restore_s if done > 0 else 0.0)
        if t + o + plan.work_s - done <= deadline:  # on-demand from t to the finish
            best = min(best, paid + po * (o + plan.work_s - done))
        if a == INF or a >= deadline:
            break
        if a + o + plan.work_s - done <= min(b, deadline):  # spot finishes in this window
            return min(best, paid + ps * (o + plan.work_s - done))
        # or an on-demand block of the least work x that lets it, stopped one save before the window opens
        x = plan.work_s - done - (min(b, deadline) - a - restart)
        if a - plan.save_s - x - o >= t:
            best = min(best, paid + po * (o + x + plan.save_s) + ps * (restart + plan.work_s - done - x))
        if b >= deadline:
            break
        if b - a <= o or ps * (b - a) > dearest * (b - a - plan.startup_s):
            continue
        paid, done, t = paid + ps * (b - a), done + b - a - o, b
    return best
