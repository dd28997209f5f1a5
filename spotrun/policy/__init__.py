"""The spot-policy simulator: replay a plan against capacity traces under each policy, summarize the outcomes.

Modules: traces.py (generated and recorded traces), engine.py (what one job costs and achieves), policies.py (the
online policies as continuous-time simulations), decision.py (the one decision function the cost guard executes
and the simulator replays), execution.py (a trace run as the state machine runs it: the guard's polls, what it sees,
what it can do; the estimate's odds come from here), optimum.py (the exact offline optimum by dynamic
programming), choose.py (the estimate's choice and its text), report.py (a study: table, JSON, PNG);
`spotrun simulate` is spotrun/cli/simulate.py. Everything here is stdlib only (matplotlib for the PNG, imported
where it is drawn): the estimate Lambda's code asset is the `spotrun` package alone and its runtime carries no
numpy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

from .decision import RULES
from .engine import SimPlan, Tally
from .execution import execute_all
from .policies import POLICIES, cost_usd, describe


@dataclass(frozen=True)
class Summary:
    """One policy over a set of traces."""

    label: str
    policy: str
    checkpointing: str
    mean_usd: float
    p50_usd: float
    p95_usd: float
    mean_spot_usd: float
    mean_on_demand_usd: float
    p_deadline: float | None
    p_finished: float
    mean_lost_h: float
    mean_steps_redone: float
    mean_wall_h: float
    p95_wall_h: float
    mean_interruptions: float
    n: int
    p_within_cap: float | None = None
    """With a cap: the share of traces whose bill is within it (the cost guard ends the others at the cap)."""
    p95_on_demand_usd: float = 0.0
    """The part of the P95 bill billed at on-demand rates (the smaller of the two traces' the P95 lies between):
    a cap planned on the P95 takes those seconds at on-demand rates, the rest at the spot share
    (spotrun/planner/segments.py `finish_cap_usd`)."""
    p_over_budget: float = 0.0
    """The share of traces the guard ended unfinished at the cap (OverBudget); the rest of the unfinished ones
    ended at MaxWait with no spot capacity and no on-demand fallback, or at MaxRuntime: a larger cap finishes
    these (and, below the cap from which the job's MaxRuntime is the planner's limit for one job, some of those at
    MaxWait, which is MaxRuntime plus the accepted delay: spotrun/policy/choose.py `maxwait_fixes`)."""
    capped: bool = False
    """The cost cap shaped the run on some trace (spotrun/policy/execution.py `Cap`; not one of the row's figures)."""
    bills: tuple[float, ...] = field(default=(), repr=False, compare=False)
    """Each trace's bill, in the traces' order (not one of the row's figures): what the noise of the mean and of
    a difference between two rows on the same traces is measured on (spotrun/planner/ties.py)."""

    def row(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("capped", "bills")}


def quantile(sorted_values: list[float], q: float) -> float:
    """The q-quantile by linear interpolation between closest ranks (numpy's default)."""
    if not sorted_values:
        return float("nan")
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    if sorted_values[hi] == sorted_values[lo]:  # also two infinite walls (a run that never finishes)
        return sorted_values[lo]
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize(plan: SimPlan, label: str, policy: str, checkpointing: str, tallies: list[Tally],
              costs: list[tuple[float, float]] | None = None, cap_usd: float | None = None) -> Summary:
    costs = costs or [cost_usd(plan, t) for t in tallies]
    totals = sorted(s + o for s, o in costs)
    by_total = sorted(costs, key=lambda c: c[0] + c[1])
    walls = sorted(t.t for t in tallies)
    n = len(tallies)
    met = None if plan.deadline_s is None else \
        sum(1 for t in tallies if t.finished and t.t <= plan.deadline_s + 1e-6) / n
    return Summary(label=label, policy=policy, checkpointing=checkpointing, mean_usd=sum(totals) / n,
                   p50_usd=quantile(totals, 0.5), p95_usd=quantile(totals, 0.95),
                   mean_spot_usd=sum(s for s, _ in costs) / n, mean_on_demand_usd=sum(o for _, o in costs) / n,
                   p_deadline=met, p_finished=sum(1 for t in tallies if t.finished) / n,
                   mean_lost_h=sum(t.lost_s for t in tallies) / n / 3600,
                   mean_steps_redone=sum(t.lost_s for t in tallies) / n / plan.step_s,
                   mean_wall_h=sum(walls) / n / 3600, p95_wall_h=quantile(walls, 0.95) / 3600,
                   mean_interruptions=sum(t.interruptions for t in tallies) / n, n=n,
                   p_within_cap=None if cap_usd is None else sum(1 for c in totals if c <= cap_usd + 1e-9) / n,
                   p95_on_demand_usd=_p95_on_demand(by_total, quantile(totals, 0.95)),
                   p_over_budget=sum(1 for t in tallies if t.over_budget) / n,
                   capped=any(t.capped for t in tallies), bills=tuple(s + o for s, o in costs))


def _p95_on_demand(by_total: list[tuple[float, float]], p95: float) -> float:
    """The on-demand part of the P95 of (spot, on-demand) bills sorted by their sum: the smaller of the two bills'
    the P95 lies between (`quantile`'s ranks), never more than the P95 (the more of it at the spot share, the larger
    a cap planned on it)."""
    if not by_total:
        return 0.0
    pos = 0.95 * (len(by_total) - 1)
    lo, hi = int(pos), min(int(pos) + 1, len(by_total) - 1)
    return min(by_total[lo][1], by_total[hi][1], p95)


def simulate(plan: SimPlan, traces: list, policy: str, checkpointing: str | None = None) -> list[Tally]:
    """One policy over every trace (one Tally each)."""
    if policy not in POLICIES:
        raise ValueError(f"policy={policy!r} is invalid: expected one of {', '.join(POLICIES)}")
    ck = checkpointing or plan.default_checkpointing()
    fn = POLICIES[policy]
    return [fn(plan, trace, ck) for trace in traces]


def executed(plan: SimPlan, traces: list, policy: str, checkpointing: str | None = None) -> list[Tally]:
    """One policy over every trace as the state machine executes it (spotrun/policy/execution.py)."""
    if policy not in RULES:
        raise ValueError(f"policy={policy!r} is invalid: expected one of {', '.join(RULES)}")
    ck = checkpointing or plan.default_checkpointing()
    return execute_all(plan, traces, policy, ck)


def compare(plan: SimPlan, traces: list, candidates: list[tuple[str, str]],
            progress: Callable[[str, int, int], None] | None = None, cap_usd: float | None = None,
            executions: dict | None = None) -> list[Summary]:
    """Every (policy, checkpointing) candidate over the same traces, as the state machine executes it (with
    `cap_usd`: each row's share of traces within it). `progress(what, done, total)` is called after each.
    `executions`: the tallies of this plan on these traces by (policy, checkpointing), reused and filled (the
    estimate step's simulations at other caps: spotrun/policy/choose.py `shared_simulations`): those of the same
    plan, or of the plan at a smaller cap that shaped none of them (`_reusable`)."""
    rows = []
    for done, (p, c) in enumerate(candidates, 1):
        hit = executions.get((p, c)) if executions is not None else None
        tallies = hit[1] if hit is not None and _reusable(plan, *hit) else None
        if tallies is None and executions is not None:  # made at this plan before another replaced it
            tallies = executions.get(EVERY_PLAN, {}).get((plan, p, c))
        if tallies is None:
            tallies = executed(plan, traces, p, c)
            if executions is not None:
                executions[(p, c)] = (plan, tallies)
                executions.setdefault(EVERY_PLAN, {})[(plan, p, c)] = tallies
        rows.append(summarize(plan, describe(p, c), p, c, tallies, cap_usd=cap_usd))
        if progress:
            progress("policies", done, len(candidates))
    return rows


# the key under which `compare`'s `executions` keep every plan's tallies by (plan, policy, checkpointing): the
# (policy, checkpointing) entry holds the latest plan's alone, and a search of caps comes back to a plan it left
# (the estimate step's caps and layouts: a (plan, policy, cap) is executed once, spotrun/policy/choose.py)
EVERY_PLAN = "every plan"


def _reusable(plan: SimPlan, earlier: SimPlan, tallies: list[Tally]) -> bool:
    """Whether the executions of `earlier` are those of `plan`: the same plan, or the same at a cap no smaller than
    one that shaped none of its runs (`Tally.capped`: each of the cap's rules binds less at a larger cap, so they
    are the runs without it)."""
    if earlier == plan:
        return True
    if plan.cap_usd is None or earlier.cap_usd is None or plan.cap_usd < earlier.cap_usd:
        return False
    return dataclasses.replace(earlier, cap_usd=plan.cap_usd) == plan and not any(t.capped for t in tallies)


__all__ = ["SimPlan", "Summary", "compare", "executed", "simulate", "summarize", "quantile"]
