"""The estimate's spot policy: simulate the planned layout over N traces and choose, with the odds stated.

`plan_from_estimate` turns the planner's estimate into a SimPlan; `spot_policy(run, est, catalog)` simulates
every candidate policy over `N_TRACES` generated traces (fixed seed) and chooses the cheapest in the mean among
those meeting `compute.deadline_hours` on at least `CONFIDENCE` of the traces (without a deadline, the cheapest);
it returns a `PolicyChoice` (the section, its warnings, the chosen P95 bill). `spot_policy_at_caps` is the estimate
step's one call (spotrun/pipeline/policy_stage.py `with_spot_policy`): the choice at the cap set and the caps it
names on the pipeline's chain (the cap that finishes at the P95 of the run as one job, the deadline warning's cap),
each from the choice at another cap; `policy_text` is its report. Every candidate is simulated as the state
machine executes it (spotrun/policy/execution.py) and is a rule of spotrun/policy/decision.py, which the cost guard
calls with the section as the plan carries it (its `sim_plan`, `policy` and `checkpointing`). The traces: the estimate's
interruption rate (recorded by the interruption recorder, else the catalog's, or checkpoint.interruptions_per_hour),
with stretches with and without capacity shaped and bunched (two regimes) as the public recordings'
(`ESTIMATE_TRACES`: spotrun/policy/availability.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass

from ..contract.spec import deadline_hours_text
from ..planner.catalog import hours_text, usd
from ..planner.estimate import LayoutBill, startup_seconds
from ..planner.outputs import checkpoint_upload_seconds, guard_seconds_per_step, maxwait_fix_text
from ..planner.segments import (
    JOB_END_S,
    STOP_BILL_S,
    ChainCosts,
    chain_at,
    finish_cap_usd,
    job_start_s,
    longest_job_cap_usd,
    on_demand_cap_usd,
    on_demand_segments_at,
    one_job_at,
    one_job_cap_usd,
    one_job_text,
    segments_at,
)
from ..planner.ties import NOISE_SES, by_tail, cents, paired_se, se_of_mean, tied_with_least
from ..planner.topology import step_seconds
from ..seams import SpotPolicy
from . import EVERY_PLAN, Summary, _reusable, compare, executed
from .availability import HELD_OUT_OVER_AT_CAP_POINTS, HELD_OUT_RECORDINGS, mean_down_s, mean_wait_over_traces_s
from .decision import DEADLINE_RULES, RULES, sentinel_room_s, sentinel_settings
from .engine import INF, SimPlan, Tally
from .traces import TraceSpec, generated_traces

N_TRACES = 1000
SEED = 0
CONFIDENCE = 0.99
# Capacity windows generated over all traces (the Lambda's time goes by them, and by the decisions a policy takes
# in them: Uniform Progress flapping through 10-per-hour waits takes ~10 per window). 50,000: the worst run the
# contract accepts (28 days at 10 interruptions per hour, a 40-day deadline, a cap that binds: 3 simulations) in
# about 26 s of CPU here, under the function's 60 s (docs/spot-policy.md); 100,000 took about 52 s.
WINDOW_BUDGET = 50_000
DEADLINE_CAP_TRIES = 2  # estimates at a raised cap for the deadline warning's cap (`_deadline_cap`)
HORIZON_CAP_S = 96 * 24 * 3600.0  # the longest deadline (56 days) and 3 x a 28-day run fit; 10 interruptions/h
# (the contract's most) x 1.3 over it is ~30,000 windows: one trace of the longest run stays inside the budget
# The estimate's traces: stretches with and without capacity drawn from the availability model fitted to the
# public recordings (spotrun/policy/availability.py), the first scaled by the run's interruption rate. The
# synthetic model it replaced (30% bursts, a 6-80 h drought every 10 days, 10-minute waits) promised the MaxWait
# fallback 8-19 points more P(deadline) than it got on the recordings (docs/spot-policy.md, "Calibration").
ESTIMATE_TRACES = {"fitted": True}
# That synthetic model, kept for `spotrun simulate --droughts` and the benchmarks' figures made with it.
SYNTHETIC_TRACES = {"burst_p": 0.3, "droughts_per_day": 0.1, "drought_hours": (6.0, 80.0), "restart_wait_s": 600.0}


def plan_from_estimate(est, catalog: dict, *, deadline_s: float | None = None,
                       spot_discount: float | None = None, poll_s: float = 60.0,
                       max_poll_s: float = 4 * 3600.0, on_demand_fallback: bool = True,
                       cap_usd: float | None = None) -> SimPlan:
    """The simulator's plan for the estimate's layout. The restore (checkpoint download) is taken at the upload
    rate; the step is grad_accum micro-batches; the planned steps (in which the guard reads progress) are the
    estimate's; `poll_s`, `max_poll_s`: the stage's cost-guard poll bounds
    (PipelineSettings.poll_seconds, max_poll_seconds); `on_demand_fallback`: the run's compute.on_demand_fallback;
    `cap_usd`: the run's budget.max_usd, which the execution then models as the cost guard holds it (a finite cap
    on an estimate with a chain to plan: `SimPlan.cap_usd`, the guard's chain figures as the plan carries them)."""
    d = catalog["defaults"]
    startup = startup_seconds(d)  # provisioning, data download and the image pull, at every start
    family = est.instance_type.split(".")[1]
    discount = spot_discount if spot_discount is not None else catalog["families"][family]["spot_discount"]
    per_h = catalog["instances"][est.instance_type]["on_demand_usd_per_hour"] * est.instance_count
    rate = est.upload_gb_per_s_available * 1e9
    save = est.checkpoint_bytes / rate if rate > 0 else 0.0
    mb = est.seconds_per_micro_batch
    step = est.grad_accum * step_seconds(mb.get("compute", 0.0), mb.get("communication", 0.0),
                                         d["comm_overlap_fraction"])
    # A cap between the spot and the on-demand estimate makes the run a chain of segments
    # (spotrun/planner/segments.py): the first job's MaxRuntime is not the run's. With the cap (`cap_usd`) the
    # execution runs the chain's jobs as the guard creates them (spotrun/policy/execution.py `Cap`); without, it runs
    # the chain as one job of the single-job MaxRuntime (each segment's MaxWait allowance kept) whose work includes
    # the chain's restarts.
    seg = est.segments
    max_runtime = float((seg and seg.longest_seconds) or est.max_runtime_seconds)
    wait_allowance = max(0.0, float(est.max_wait_seconds) - float(est.max_runtime_seconds))
    capped = cap_usd is not None and math.isfinite(cap_usd) and bool(seg and seg.chain_costs)
    chain_s = 0.0 if capped else \
        max(0, int((seg and seg.segments) or 1) - 1) * float((seg and seg.overhead_seconds) or 0.0)
    costs = None
    if capped:  # the guard's figures (spotrun/pipeline/guard.py `chain_costs`, from the plan assembly makes)
        costs = ChainCosts(**{**seg.chain_costs, "save_s": checkpoint_upload_seconds(est),
                              "step_s": guard_seconds_per_step(est, startup), "sentinel_room_s": 0.0})
    # Every job starts and ends as the chain bills it (spotrun/planner/segments.py `job_start_s`, `JOB_END_S`): its
    # start holds the trainer's start and the restore, and its end is billed; a simulation on the catalog's bare
    # startup billed a spot=false run $0.62 where its cost row (the chain) said $0.74 (a new user's trial)
    start, restore, end = (job_start_s(seg), 0.0, JOB_END_S) if seg and seg.overhead_seconds else (startup, save, 0.0)
    return SimPlan(work_s=max(1.0, est.wall_seconds - startup) + chain_s + end, startup_s=start,
                   restore_s=restore, save_s=save, interval_s=float(est.checkpoint_interval_s),
                   step_s=max(step, 1e-3), notice_ok=est.checkpoint_policy == "save_on_notice",
                   spot_usd_per_h=per_h * (1 - discount), on_demand_usd_per_h=per_h,
                   max_wait_s=max_runtime + wait_allowance, max_runtime_s=max_runtime,
                   deadline_s=deadline_s, poll_s=poll_s,
                   max_poll_s=max(poll_s, max_poll_s), on_demand_fallback=on_demand_fallback,
                   planned_steps=est.planned_steps, cap_usd=cap_usd if capped else None, chain_costs=costs,
                   expected_overhead_s=float(est.expected_overhead_seconds) if capped else 0.0,
                   warm_pool_s=float(((seg and seg.chain_costs) or {}).get("warm_pool_s", 0.0)))


def run_plan(run, est, catalog: dict, *, poll_s: float = 60.0, max_poll_s: float = 4 * 3600.0) -> SimPlan:
    """The plan the estimate simulates `run` on (`plan_from_estimate` at the run's deadline, spot discount,
    fallback and cap: the cap modelled as the cost guard holds it): `spot_policy`'s, and `spotrun simulate`'s, so
    that at a cap that binds both print the same rows on the same traces."""
    return plan_from_estimate(est, catalog, deadline_s=run.compute.deadline_s,
                              spot_discount=run.compute.spot_discount, poll_s=poll_s, max_poll_s=max_poll_s,
                              on_demand_fallback=run.compute.on_demand_fallback or not run.compute.spot,
                              cap_usd=run.max_usd)


def policy_plans(run, est, plan: SimPlan) -> Callable[[str], SimPlan]:
    """policy -> the plan it is executed on: the on-demand policy's own (`_on_demand_plan`), `plan` for the rest."""
    on_demand = _on_demand_plan(run, est, plan)
    return lambda policy: on_demand if policy == "on_demand" else plan


def _on_demand_plan(run, est, plan: SimPlan) -> SimPlan:
    """The plan the on-demand policy runs: on-demand jobs bill at on-demand rates and are never interrupted, so
    the cap splits the run into the on-demand chain's jobs, not the spot chain's the plan counts (a spot run at the
    cap named for its on-demand P95 simulated on-demand with a spot chain's restart and missed its deadline)."""
    seg = est.segments
    if not (run.compute.spot and seg and seg.chain_costs) or plan.cap_usd is not None:  # with the cap: its jobs
        return plan
    jobs = on_demand_segments_at(seg, run.max_usd, seg.work_seconds - est.expected_overhead_seconds)
    return dataclasses.replace(plan, work_s=plan.work_s + (jobs - max(1, seg.segments)) * seg.overhead_seconds)


def horizon_s(plan: SimPlan) -> float:
    """How far traces are drawn: past the deadline, MaxWait plus the work, and three times the work (at most
    HORIZON_CAP_S: what a run the contract accepts can use)."""
    far = max(plan.deadline_s or 0.0, (plan.max_wait_s if plan.max_wait_s < INF else 0.0) + plan.work_s,
              3 * plan.work_s)
    return min(far + 80 * 3600, HORIZON_CAP_S)


def candidates(plan: SimPlan, every_checkpointing: bool = False) -> list[tuple[str, str]]:
    """(policy, checkpointing) pairs, each a rule the cost guard executes (spotrun/policy/decision.py):
    on-demand (when the run may go on-demand), spot with the MaxWait fallback with each way of saving; with a
    deadline, every deadline-aware policy with the plan's own (all of them with `every_checkpointing`)."""
    cks = ("notice", "periodic", "both") if plan.notice_ok else ("periodic",)
    own = plan.default_checkpointing() if every_checkpointing else ("notice" if plan.notice_ok else "periodic")
    out = [("on_demand", own)] if plan.on_demand_fallback else []
    for ck in cks if every_checkpointing else cks[:2]:
        out.append(("maxwait_fallback", ck))
    if plan.deadline_s is not None:
        for ck in cks if every_checkpointing else (own,):
            out += [(p, ck) for p in DEADLINE_RULES]
    return [(p, ck) for p, ck in out if p in RULES]  # only what the guard can execute


def run_candidates(run, plan: SimPlan) -> list[tuple[str, str]]:
    """The run's candidates (`candidates`): a `compute.spot=false` run takes on-demand alone, so no spot policy is
    simulated or chosen for it (a new user was told 'maxwait_fallback would be the choice with spot', and
    `spotrun simulate` chose it for that run)."""
    return candidates(plan) if run.compute.spot else [c for c in candidates(plan) if c[0] == "on_demand"]


def run_policies(run) -> list[str]:
    """The policies `run_candidates` gives the run, in their order, from the run alone (no estimate): `spotrun
    simulate --policy` refuses one the run cannot take before the estimate runs (a new user waited 9.7 s on the 8B
    for the refusal). A plan's `on_demand_fallback` and `deadline_s` are the run's (`run_plan`)."""
    if not run.compute.spot:
        return ["on_demand"]
    out = ["on_demand"] * run.compute.on_demand_fallback + ["maxwait_fallback"]
    if run.compute.deadline_s is not None:
        out += DEADLINE_RULES
    return [p for p in out if p in RULES]


# what the traces are for a compute.spot=false run: nothing (its jobs are on-demand, never interrupted, never waiting);
# a new user read simulate's "1000 traces (generated: 0 interruptions per job-hour, ... shaped and bunched as the
# public recordings')" as spot capacity simulated for an on-demand run
ON_DEMAND_ALONE = ("on-demand alone: compute.spot=false takes no spot capacity, so no interruption or wait for "
                   "capacity is simulated and the traces change nothing: every one bills the same on-demand run")


def on_demand_source(given: str = "") -> str:
    """The source line of a compute.spot=false run's simulation (`ON_DEMAND_ALONE`); `given`: the traces the command
    was given (`spotrun simulate --traces`, `--interruptions`, `--band`, `--droughts`), said to change nothing."""
    return ON_DEMAND_ALONE + (f"; the traces given change nothing either: {given}" if given else "")


LEFT_OUT_MARK = "  left out: P95 over the cap"  # a row's mark in the estimate's and simulate's tables


def finish_caps(est) -> dict[str, float]:
    """policy -> the cap its run needs to finish uninterrupted, where that can be more than its P95 bill: the
    on-demand policy's. An on-demand job bills at on-demand rates in full and its MaxRuntime is the room the cap
    leaves at those rates, so the cap must hold the on-demand chain of the run's work (spotrun/planner/segments.py
    `on_demand_cap_usd`, `finish_cap_usd` with spot=False): under it the cost guard stops the run OverBudget with
    no interruption at all (seen: 0.5B on 2 x g6e.xlarge, 0.5 h, on_demand chosen at a $2.96 cap over its $2.95
    P95, stopped a step short naming $3.12). A spot row's jobs are planned on the spot chain, which the estimate
    refuses at a cap it does not fit (the guard's check at every job's start, at the expected bill); a spot run
    billed past that expectation is the cap to set's matter (`_under_finish_cap` warns), not a row left out."""
    seg = est.segments
    if not seg.chain_costs:
        return {}
    return {"on_demand": on_demand_cap_usd(seg, seg.work_seconds - est.expected_overhead_seconds)}


def short_of_finish(rows: list[Summary], cap_usd: float | None,
                    finish: dict[str, float] | None) -> dict[str, float]:
    """The rows a cap leaves out for their finish cap (`finish_caps`) alone, their P95 bill within it: label -> that
    finish cap."""
    if cap_usd is None or not finish:
        return {}
    return {r.label: finish[r.policy] for r in rows if r.p95_usd <= cap_usd and cap_usd < finish.get(r.policy, 0.0)}


def left_out_by_cap(rows: list[Summary], cap_usd: float | None,
                    finish: dict[str, float] | None = None) -> tuple[str, ...]:
    """The labels of the rows a cap leaves out, as `choose` leaves them out: their P95 bill over it, or the cap
    under their finish cap (`finish`: `finish_caps`)."""
    if cap_usd is None:
        return ()
    return tuple(r.label for r in rows if r.p95_usd > cap_usd or cap_usd < (finish or {}).get(r.policy, 0.0))


def left_out_mark(label: str, left_out, short: dict | None) -> str:
    """A row's mark in the estimate's and simulate's tables: none, P95 over the cap, or the cap under what its
    jobs need to finish (`short_of_finish`)."""
    if label in (short or {}):
        return f"  left out: its jobs need a ${short[label]:,.2f} cap to finish at on-demand rates"
    return LEFT_OUT_MARK if label in left_out else ""


def _short_text(short: dict[str, float]) -> str:
    return "; ".join(f"{label} bills at on-demand rates and needs a ${cap:,.2f} cap to finish uninterrupted (the "
                     "guard stops it short under that)" for label, cap in short.items())


def choose(plan: SimPlan, rows: list[Summary], confidence: float = CONFIDENCE,
           cap_usd: float | None = None, finish: dict[str, float] | None = None) -> tuple[Summary, str]:
    """(the chosen row, why). With a cap, a policy whose P95 cost passes it is no candidate: the cost guard ends
    such runs at the cap, unfinished (more than 1 - CONFIDENCE of them); nor is one whose run needs more than the
    cap to finish uninterrupted (`finish`: `finish_caps`; the guard ends every such run at the cap)."""
    if cap_usd is not None:
        out = set(left_out_by_cap(rows, cap_usd, finish))
        short = {r.label: (finish or {})[r.policy] for r in rows if cap_usd < (finish or {}).get(r.policy, 0.0)}
        within = [r for r in rows if r.label not in out]
        if not within:  # the likeliest to finish inside the cap (a policy over it on every trace never does)
            best = min(rows, key=lambda r: (r.label in short, -(r.p_within_cap or 0.0), r.p95_usd, r.mean_usd))
            share = "" if best.p_within_cap is None else f" ({best.p_within_cap:.1%} of them)"
            never = f"; {_short_text(short)}" if short else ""
            return best, (f"no policy stays within the ${cap_usd:,.2f} cap on 95% of the traces: the likeliest to "
                          f"stay within it{share}, P95 cost ${best.p95_usd:,.2f}; the guard ends the other runs "
                          f"at the cap{never}")
        if len(within) < len(rows):
            chosen, why = choose(plan, within, confidence)
            # the reasons that left some row out: a P95 over the cap (none where the cap is modelled: the guard
            # ends those runs at it), a finish cap over it
            reasons = [f"P95 cost over the ${cap_usd:,.2f} cap"] * any(r.p95_usd > cap_usd for r in rows)
            reasons += [f"at the ${cap_usd:,.2f} cap, {_short_text(short)}"] * bool(short)
            return chosen, (f"{len(rows) - len(within)} of {len(rows)} policies left out ({', or '.join(reasons)}); "
                            f"of the rest, {why}")
    if plan.deadline_s is None:  # a run stopped unfinished (at MaxRuntime) costs less and is worth nothing
        done = [r for r in rows if r.p_finished >= confidence]
        if not done:  # without on-demand fallback, spot may not come back before MaxWait or MaxRuntime
            best = max(rows, key=lambda r: (r.p_finished, -r.mean_usd))
            return best, (f"no deadline, and no policy finishes on >= {confidence:.0%} of the traces: the likeliest "
                          f"to finish ({best.p_finished:.1%}; its expected cost counts the unfinished runs' bills)")
        best, least = least_mean_by_tail(done)
        return best, (f"no deadline: the least expected cost of the {len(done)} of {len(rows)} policies that "
                      f"finish on >= {confidence:.0%} of the traces{_tie_text(best, least, done)}")
    ok = [r for r in rows if r.p_deadline >= confidence]
    if not ok:  # the likeliest to meet it, then to finish, then the cheapest: a run stopped unfinished costs less
        # and is worth nothing (a new user's mistral at $15.34, every policy meeting 4 h on 0.0%, was chosen the
        # policy the guard stopped soonest, finishing on 0.0%, over maxwait_fallback finishing on 52.1%, late).
        # The deadline's odds first: the user set it, and a policy finishing a little more often must not take a
        # run from 95% to 10% by the deadline
        best = max(rows, key=lambda r: (r.p_deadline, r.p_finished, -r.mean_usd))
        before = max(rows, key=lambda r: (r.p_deadline, -r.mean_usd))  # the choice by the deadline's odds alone
        head = (f"no policy meets the {deadline_hours_text(plan.deadline_s)} h deadline on {confidence:.0%} "
                f"of the traces: ")
        if best is before:
            return best, head + f"the likeliest to meet it ({best.p_deadline:.1%})"
        return best, head + (f"of the likeliest to meet it, the likeliest to finish ({best.p_finished:.1%} of its "
                             f"runs, {best.p_deadline:.1%} by the deadline; {before.label} meets it on "
                             f"{before.p_deadline:.1%} at a mean of ${before.mean_usd:,.2f}, its runs finishing on "
                             f"{before.p_finished:.1%}: a run stopped unfinished is worth nothing)")
    best, least = least_mean_by_tail(ok)
    return best, (f"the least expected cost of the {len(ok)} of {len(rows)} policies that meet the "
                  f"{deadline_hours_text(plan.deadline_s)} h deadline on >= {confidence:.0%} of the traces"
                  f"{_tie_text(best, least, ok)}")


def _paired_se(a: Summary, b: Summary) -> float:
    return paired_se(a.bills, b.bills)


def least_mean_by_tail(rows: list[Summary]) -> tuple[Summary, Summary]:
    """(the row chosen, the least mean) of rows simulated on the same traces: the least mean, where another's
    mean is within the simulation's noise of it (spotrun/planner/ties.py: half a cent, or NOISE_SES standard errors
    of the paired difference) the lowest P95 of those, then the table's order (`candidates`: a fixed order, so the
    name does not flip between adjacent deadlines with the same bills)."""
    return by_tail(rows, lambda r: r.mean_usd, lambda r: r.p95_usd, _paired_se)


def _tie_text(best: Summary, least: Summary, rows: list[Summary]) -> str:
    """The why's clause on a tie (a new user saw four policies at $18.27 and one chosen without a word)."""
    tied = [r.label for r in tied_with_least(rows, lambda r: r.mean_usd, _paired_se) if r is not best]
    if not tied:
        return ""
    gap = best.mean_usd - least.mean_usd
    lower = f"${gap:,.2f}" if cents(gap) != "0.00" else "under a cent"
    lead = "" if best is least else f"; the least, {least.label}'s, {lower} lower"
    return (f"; tied with {', '.join(tied)} within the simulation's noise (the same printed mean, half a cent, or "
            f"{NOISE_SES:g} standard errors of the paired difference{lead}): chosen by the lowest P95 bill, then "
            "the table's order")


def windows_per_trace(plan: SimPlan, rate_per_hour: float, mean_wait_s: float | None = None) -> float:
    """Capacity windows a generated trace holds on average: one per stretch with and without capacity over the
    horizon (a mean stretch with capacity of 1 / rate hours, one without of `mean_wait_s`, else `mean_down_s`)."""
    if rate_per_hour <= 0:
        return 1.0
    wait_s = mean_down_s(rate_per_hour) if mean_wait_s is None else mean_wait_s
    return horizon_s(plan) / (3600 / rate_per_hour + wait_s) + 2


def traces_for_estimate(plan: SimPlan, rate_per_hour: float, n: int = N_TRACES,
                        mean_wait_s: float | None = None) -> int:
    """How many traces the estimate simulates: N, fewer for a long run at a high rate, so that about
    WINDOW_BUDGET windows are generated and replayed in all (the Lambda's time goes by them); at least one."""
    return max(1, min(n, int(WINDOW_BUDGET / windows_per_trace(plan, rate_per_hour, mean_wait_s))))


_SHARED: ContextVar[dict | None] = ContextVar("shared_simulations", default=None)


@contextlib.contextmanager
def shared_simulations(store: dict | None = None) -> Iterator[None]:
    """Within it, `spot_policy` generates each set of traces and executes each plan on them once: the estimate
    step asks for the run at several caps (`spot_policy_at_caps`), and a cap whose chain has as many
    jobs as another's plans the same simulation (the rows are the same; only the cap's share within it is not,
    which is computed from the tallies). The Lambda's time goes by these simulations. `store`: the simulations
    made already (`LayoutRanker.store`: the planner's layouts compared; keyed by the plan, which holds all the
    layout's figures the simulation reads). Without `store`, an enclosing one's if any (`spotrun simulate` holds one
    around the estimate and its study: `estimate_executions`), else a new one."""
    token = _SHARED.set(store if store is not None else _SHARED.get() if _SHARED.get() is not None else {})
    try:
        yield
    finally:
        _SHARED.reset(token)


@dataclass(frozen=True)
class PolicyChoice:
    """What `spot_policy` chose: the estimate's policy section (JSON; its `p95_finish_cap_usd` is None here,
    `spot_policy_at_caps` names it from the pipeline's chain), the warnings it adds to the estimate's, and the
    chosen policy's P95 bill (unrounded: what that cap is planned on)."""

    section: SpotPolicy
    warnings: tuple[str, ...]
    p95_usd: float
    # the labels of the policies the cap left out (their P95 over it, or the cap under their finish cap)
    left_out: tuple[str, ...] = ()
    meeting_p95_usd: float | None = None  # the lowest P95 of the policies meeting the deadline (None: none does)
    misses_deadline: bool = False  # a deadline the chosen policy meets on fewer than CONFIDENCE of the traces
    missed: str = ""  # the warning when no candidate meets the deadline (`_missed_deadline`, the first of
    # `warnings`): the estimate step names a larger cap instead where one meets the deadline, `spot_policy_at_caps`
    p95_on_demand_usd: float = 0.0  # the part of `p95_usd` billed at on-demand rates (Summary.p95_on_demand_usd)
    capped: bool = False  # the cap shaped some candidate's run on some trace (Summary.capped): not the run as one job
    se_usd: float = 0.0  # the standard error of the chosen policy's mean bill (the layouts' noise: `LayoutRanker`)


def spot_policy(run, est, catalog: dict, *, n: int = N_TRACES, seed: int = SEED, poll_s: float = 60.0,
                max_poll_s: float = 4 * 3600.0, deadline_cap: Callable[[float], float] | None = None,
                keep: bool = False, fixes: bool = False) -> PolicyChoice:
    """The estimate's policy choice: chosen policy, why, and every candidate's odds, as the cost guard polling
    between `poll_s` and `max_poll_s` executes them. The estimate is read, never changed. `deadline_cap(p95)`: the
    cap the warning names when the cap left out every policy meeting the deadline, from their lowest P95 here (by
    default that P95 rounded up to the cent; a cap's chain, so the P95, changes with the cap: the estimate step
    names one that holds, `spot_policy_at_caps`). `keep`: within `shared_simulations`, keep these executions (the
    run at its cap) for `estimate_executions`. `fixes`: simulate what finishes the chosen policy's runs that wait
    out MaxWait (`maxwait_fixes`: the estimate step's own call, not its searches at other caps)."""
    n_asked = n
    plan, rows, n = _simulated(run, est, catalog, None, n=n, seed=seed, poll_s=poll_s, max_poll_s=max_poll_s,
                               keep=keep)
    finish = finish_caps(est)
    best, why = choose(plan, rows, cap_usd=run.max_usd, finish=finish)
    remedies = maxwait_fixes(run, est, catalog, best, n=n_asked, seed=seed, poll_s=poll_s,
                             max_poll_s=max_poll_s) if fixes else None
    left_out = left_out_by_cap(rows, run.max_usd, finish)
    warnings = []
    missed = ""
    if plan.deadline_s is not None and not any(r.p_deadline >= CONFIDENCE for r in rows):
        missed = _missed_deadline(plan, rows)
        warnings.append(missed)
    elif plan.deadline_s is not None and run.compute.spot and not run.compute.on_demand_fallback:
        warnings.append(spot_alone(plan.deadline_s, best.p_deadline))
    meets = [r for r in rows if r.p_deadline is not None and r.p_deadline >= CONFIDENCE]
    cheapest = min(meets, key=lambda r: r.p95_usd) if meets else None
    misses = best.p_deadline is not None and best.p_deadline < CONFIDENCE
    if cheapest and misses:  # the cap left out every one
        named = (deadline_cap or cents_up)(cheapest.p95_usd)
        warnings.append(f"compute.deadline_hours={deadline_hours_text(plan.deadline_s)}: within the "
                        f"${run.max_usd:,.2f} cap the chosen {best.label} meets it on {best.p_deadline:.1%} of the "
                        f"traces; {cheapest.label} "
                        f"meets it on {cheapest.p_deadline:.1%}, its P95 bill here ${cheapest.p95_usd:,.2f}: a cap "
                        f"of ${named:,.2f} lets the estimate choose a policy that meets it")
    if plan.deadline_s is None and not any(r.p_finished >= CONFIDENCE for r in rows):
        if run.compute.on_demand_fallback or not run.compute.spot:  # on-demand is there: the cap ends the others
            warnings.append(f"the run may not finish: within the ${run.max_usd:,.2f} cap no policy finishes on "
                            f"{CONFIDENCE:.0%} of the traces (the likeliest, {best.label}, on "
                            f"{best.p_finished:.1%}); the guard ends the others at the cap (OverBudget): a larger "
                            "cap lets more of them finish")
        else:
            warnings.append(f"the run may not finish: no spot policy finishes on {CONFIDENCE:.0%} of the traces (the "
                            f"likeliest, {best.label}, on {best.p_finished:.1%}): "
                            + unfinished_by_cause(best.p_finished, best.p_over_budget, remedies))
    source = fitted_source(est.interruptions_per_hour, est.mean_wait_seconds, est.mean_wait_source)
    if not run.compute.spot:  # on-demand alone (`run_candidates`)
        why = "compute.spot=false: on-demand as the run asks"
        source = ON_DEMAND_ALONE
    section = SpotPolicy(chosen=best.label, why=why, p95_finish_cap_usd=None,
                         confidence=CONFIDENCE if plan.deadline_s is not None else None, traces=n, seed=seed,
                         trace_source=source,
                         policies=[_rounded(r) for r in rows], left_out=list(left_out),
                         left_out_finish_caps=short_of_finish(rows, run.max_usd, finish), policy=best.policy,
                         checkpointing=best.checkpointing, sim_plan=dataclasses.asdict(plan),
                         sentinel=sentinel_settings(best.policy), maxwait_fixes=remedies)
    return PolicyChoice(section=section, warnings=tuple(warnings), p95_usd=best.p95_usd, left_out=left_out,
                        meeting_p95_usd=cheapest.p95_usd if cheapest else None, misses_deadline=misses,
                        missed=missed, p95_on_demand_usd=best.p95_on_demand_usd,
                        capped=any(r.capped for r in rows), se_usd=se_of_mean(best.bills))


def unfinished_by_cause(p_finished: float, p_over_budget: float, fixes: list | None = None) -> str:
    """A spot run without on-demand fallback: why its unfinished runs end, the larger share first, each with what
    finishes them (at MaxWait: `maxwait_fix_text` of the section's `maxwait_fixes`). A new user was told
    'compute.on_demand_fallback=true finishes on on-demand when spot does not come back' where every unfinished run
    ended at the cap (qwen2 at $0.73: 4.3% at the cap, and 95.7% finished with the fallback as without it)."""
    unfinished = 1.0 - p_finished
    at_cap = min(unfinished, p_over_budget)
    causes = []
    if at_cap > 0:
        causes.append((at_cap, f"{at_cap:.1%} end at the cap (OverBudget): a larger budget.max_usd finishes them "
                               "(compute.on_demand_fallback=true does not)"))
    if unfinished - at_cap > 1e-9:
        causes.append((unfinished - at_cap, f"{unfinished - at_cap:.1%} wait out MaxWait with no spot capacity: "
                                            + maxwait_fix_text(fixes, p_finished)))
    return "; ".join(text for _, text in sorted(causes, key=lambda c: -c[0]))


def maxwait_fixes(run, est, catalog: dict, best: Summary, *, n: int, seed: int, poll_s: float,
                  max_poll_s: float) -> list[dict] | None:
    """Where some of `best`'s runs (the chosen policy at the run's cap) wait out MaxWait with no spot capacity (a
    spot run without on-demand fallback), each remedy simulated once, `best`'s policy on the traces the estimate of
    the run so changed draws (its own model and seed: those of the run where the change leaves the plan's horizon),
    as `spot_policy` simulates it: compute.on_demand_fallback=true; a longer compute.accepted_delay_hours
    (compute.max_wait_hours where the run gives one), the longest wait for capacity on the estimate's traces; and
    budget.max_usd at `longest_job_cap_usd`, the cap from which the job's MaxRuntime, so its MaxWait (MaxRuntime +
    the accepted delay), is the planner's limit for one job, where the run's cap is under it (a new user was told
    'a larger cap does not' of a mistral-7b LoRA with 2 h of accepted delay that finished 84.2% / 91.0% / 97.8% at
    $20 / $40 / $80; `value` null and `from_usd` that cap where the run's is at or over it). None where no run
    waits out MaxWait. [{"setting", "value", "p_finished"}, ...]: `SpotPolicy.maxwait_fixes`."""
    c = run.compute
    unfinished = 1.0 - best.p_finished
    if not c.spot or c.on_demand_fallback or unfinished - min(unfinished, best.p_over_budget) <= 1e-9:
        return None
    candidate = [(best.policy, best.checkpointing)]
    poll = {"n": n, "seed": seed, "poll_s": poll_s, "max_poll_s": max_poll_s}

    def finished(r, e) -> float:
        return round(_simulated(r, e, catalog, candidate, **poll)[1][0].p_finished, 4)

    with_compute = lambda **change: dataclasses.replace(run, compute=dataclasses.replace(c, **change))  # noqa: E731
    fixes = [{"setting": "compute.on_demand_fallback", "value": True,
              "p_finished": finished(with_compute(on_demand_fallback=True), est)}]
    given = c.max_wait_hours is not None  # the run's MaxWait stands as given: the remedy is a longer one
    setting = "compute.max_wait_hours" if given else "compute.accepted_delay_hours"

    def delayed(hours: float) -> tuple:  # the run and its estimate with this setting
        wait_s = int(hours * 3600) if given else est.max_runtime_seconds + int(hours * 3600)
        return (with_compute(**{setting.split(".")[1]: float(hours)}),
                dataclasses.replace(est, max_wait_seconds=wait_s))

    # the longest wait for capacity on the traces the run so changed draws: a longer MaxWait draws longer traces,
    # which can hold a longer wait, so again on those
    own = hours = c.max_wait_hours if given else c.accepted_delay_hours
    for _ in range(DELAY_ROUNDS):
        r, e = delayed(hours) if hours != own else (run, est)
        plan = run_plan(r, e, catalog, poll_s=poll_s, max_poll_s=max_poll_s)
        longest = max((_longest_wait_s(t) for t in _estimate_traces(plan, e, n, seed)), default=0.0)
        need = math.ceil(((est.max_runtime_seconds if given else 0) + longest) / 3600)
        most = 2 * MAX_DELAY_H if given else MAX_DELAY_H
        if need <= hours or hours >= most:
            break
        hours = min(most, need)
    if hours > own:
        fixes.append({"setting": setting, "value": hours, "p_finished": finished(*delayed(hours))})
    cap = longest_job_cap_usd(est.segments)
    if cap is not None and run.max_usd is not None and math.isfinite(run.max_usd) and run.max_usd < cap:
        fixes.append({"setting": "budget.max_usd", "value": cap, "p_finished": finished(*_at_cap(run, est, cap))})
    elif cap is not None and c.max_wait_hours is None:
        fixes.append({"setting": "budget.max_usd", "value": None, "from_usd": cap, "p_finished": None})
    return fixes


MAX_DELAY_H = 28 * 24  # compute.accepted_delay_hours' most (spotrun/contract/spec.py; max_wait_hours: twice it)
DELAY_ROUNDS = 3  # the traces drawn for a longer delay, each longer: its longest wait looked for at most this often


def _longest_wait_s(windows) -> float:
    """The longest stretch without capacity in a trace of capacity windows (before the first, between two)."""
    longest, end = 0.0, 0.0
    for start, stop in windows:
        longest, end = max(longest, start - end), stop
    return longest


def _estimate_traces(plan: SimPlan, est, n: int, seed: int) -> list:
    """The traces `_simulated` draws for `plan` (made once within `shared_simulations`)."""
    n = traces_for_estimate(plan, est.interruptions_per_hour, n, est.mean_wait_seconds)
    spec = TraceSpec(interruptions_per_hour=est.interruptions_per_hour, horizon_s=horizon_s(plan), **ESTIMATE_TRACES,
                     mean_wait_s=est.mean_wait_seconds)
    return shared_traces(spec, n, seed)


# Capacity windows the planner's layouts compared may simulate beyond the first (`LayoutRanker`): about one
# worst-case simulation more (WINDOW_BUDGET), so the estimate stays inside the Lambda's 60 s (docs/spot-policy.md).
LAYOUT_WINDOW_BUDGET = WINDOW_BUDGET


class LayoutRanker:
    """The planner's `layout_cost` (spotrun/planner/estimate.py `_by_policy`): a layout's Estimate -> the bill of
    the spot policy `spot_policy` chooses on it at the run's cap (its label, simulated mean, P(deadline), and
    whether it meets the deadline on CONFIDENCE of the traces: the rule the policy stage chooses by), on the policy
    stage's traces and polls. The first layout asked (the planner's cheapest) is simulated anyway by the stage; the
    others within LAYOUT_WINDOW_BUDGET capacity windows in all (None past it: not compared). `store`: the
    simulations made, which the stage reuses (`spot_policy_at_caps(simulations=...)`)."""

    def __init__(self, catalog: dict, *, poll_s: float = 60.0, max_poll_s: float = 4 * 3600.0, n: int = N_TRACES):
        self.catalog, self.poll = catalog, {"poll_s": poll_s, "max_poll_s": max_poll_s, "n": n}
        # an enclosing `shared_simulations`'s store (`spotrun simulate`'s), else its own
        self.store: dict = _SHARED.get() if _SHARED.get() is not None else {}
        self.windows = 0.0  # spent on the layouts after the first
        self.asked = 0

    def __call__(self, run, est) -> LayoutBill | None:
        plan = run_plan(run, est, self.catalog, poll_s=self.poll["poll_s"], max_poll_s=self.poll["max_poll_s"])
        n = traces_for_estimate(plan, est.interruptions_per_hour, self.poll["n"], est.mean_wait_seconds)
        windows = n * windows_per_trace(plan, est.interruptions_per_hour, est.mean_wait_seconds)
        self.asked += 1
        if self.asked > 1:
            if self.windows + windows > LAYOUT_WINDOW_BUDGET:
                return None
            self.windows += windows
        with shared_simulations(self.store):
            choice = spot_policy(run, est, self.catalog, **self.poll)
        row = next(r for r in choice.section.policies if r["label"] == choice.section.chosen)
        p = row["p_deadline"]
        return LayoutBill(policy=choice.section.chosen, mean_usd=row["mean_usd"], p_deadline=p,
                          meets=p is None or p >= CONFIDENCE, p95_usd=row.get("p95_usd"), se_usd=choice.se_usd)


def _simulated(run, est, catalog: dict, only: list[tuple[str, str]] | None, *, n: int, seed: int, poll_s: float,
               max_poll_s: float, keep: bool = False) -> tuple[SimPlan, list[Summary], int]:
    """The run's plan, the rows of its candidates (`only`: those alone) on the estimate's traces, executed as
    the cost guard runs them at the run's cap, and the traces' number (with `shared_simulations`, each set of
    traces and each plan's executions made once; with `keep`, these kept apart for `estimate_executions`: a
    later simulation at another cap of the same plan replaces them in the store)."""
    plan = run_plan(run, est, catalog, poll_s=poll_s, max_poll_s=max_poll_s)
    n = traces_for_estimate(plan, est.interruptions_per_hour, n, est.mean_wait_seconds)
    spec = TraceSpec(interruptions_per_hour=est.interruptions_per_hour, horizon_s=horizon_s(plan), **ESTIMATE_TRACES,
                     mean_wait_s=est.mean_wait_seconds)
    shared = _SHARED.get()
    if shared is None:
        traces = generated_traces(spec, n, seed)
    else:  # the traces and this plan's executions made once per estimate (the caps' plans often coincide)
        if ("traces", spec, n, seed) not in shared:
            shared["traces", spec, n, seed] = generated_traces(spec, n, seed)
        traces = shared["traces", spec, n, seed]
    plan_of = policy_plans(run, est, plan)
    kept = None if shared is None or not keep else shared.setdefault(("kept", spec, n, seed), {})
    rows = []
    for candidate in run_candidates(run, plan) if only is None else only:
        its = plan_of(candidate[0])
        # keyed without the cap: `compare` reuses a smaller cap's executions where that cap shaped none of them
        key = (dataclasses.replace(its, cap_usd=None), its.cap_usd is None)
        done = None if shared is None else shared.setdefault(("executions", key, spec, n, seed), {})
        rows += compare(its, traces, [candidate], cap_usd=run.max_usd, executions=done)
        if kept is not None:
            kept.setdefault(its, {})[candidate] = done[candidate]
    return plan, rows, n


def estimate_executions(plan: SimPlan, spec: TraceSpec, n: int, seed: int) -> dict | None:
    """Within `shared_simulations`, the executions the estimate made of `plan` at the run's cap on the traces of
    `spec`, `n` and `seed` (a copy of `compare`'s `executions` for it), or None: `spotrun simulate` holds the
    store around the estimate and its study, whose rows on the estimate's own traces are then the estimate's
    executions, not made twice."""
    shared = _SHARED.get()
    kept = None if shared is None else shared.get(("kept", spec, n, seed), {}).get(plan)
    return None if kept is None else dict(kept)


def shared_traces(spec: TraceSpec, n: int, seed: int) -> list:
    """`generated_traces(spec, n, seed)`, made once within `shared_simulations`: `spotrun simulate`'s study replays
    the estimate's own traces (the same spec, n and seed) and generated them a second time (0.04 s of CPU of the 8B
    example's 1.2 s)."""
    shared = _SHARED.get()
    if shared is None:
        return generated_traces(spec, n, seed)
    if ("traces", spec, n, seed) not in shared:
        shared["traces", spec, n, seed] = generated_traces(spec, n, seed)
    return shared["traces", spec, n, seed]


def cents_up(usd: float) -> float:
    """`usd` rounded up to the cent: a cap named from a bill holds that bill (a cap rounded down would not)."""
    return math.ceil(round(usd * 100, 6)) / 100


@dataclass(frozen=True)
class CappedChoice:
    """What the estimate step adds to the estimate (spotrun/pipeline/policy_stage.py `with_spot_policy`): the policy
    section with the caps it names, and the warnings that follow the estimate's own."""

    section: SpotPolicy
    warnings: tuple[str, ...]
    missed: str = ""  # the one of `warnings` that says no policy meets the deadline ("" when one does)


def spot_policy_at_caps(run, est, catalog: dict, *, poll_s: float = 60.0, max_poll_s: float = 4 * 3600.0,
                        n: int = N_TRACES, simulations: dict | None = None,
                        replan: Callable[[float], object] | None = None, refused: bool = False) -> CappedChoice:
    """The run's spot policy (`spot_policy` on `n` traces, looked up when called: the replay tests stand a cached
    one in) at the cap set, and the caps the section names, each from the choice at another cap: the estimate
    step's one call into the policy.

    Every cap it names holds when set (estimated again at it, the run is accepted and the same cap is named):
    - `p95_finish_cap_usd`: the smallest cap whose chain finishes a run billed the P95 of the policy chosen for the
      run as one job (`p95_finish_policy`, `p95_one_job_usd`; None without a chain to plan it on, or when no cap
      does). As one job, the cap set never enters it. Planned on the chain at the cap set, the P95 would count
      that chain's restarts, which the finish cap's own chain counts again, and would move with the cap (llama3's
      $155.72 at a $2,500 cap named $166.51 once set).
    - the deadline warning's cap (`deadline_cap_usd`), when the cap left out every policy that meets the deadline
      (`_deadline_cap`), at least the P95 finish cap of the run as one job.
    A cap that binds costs a second simulation (the run as one job), a deadline warning up to DEADLINE_CAP_TRIES
    more; a cap whose plan (its chain's length) was simulated already reuses that simulation
    (`shared_simulations`, from `simulations` where the planner's layouts compared made them: `LayoutRanker`).

    `replan(cap)`: the estimate of the run at another cap with its layouts ranked there (None where it refuses),
    given where the planner ranks layouts by their spot policy (a spot run with a deadline and an auto layout): the
    cap to set is then the one at which the estimate takes the layout it was searched on (`_settled_layout`).

    `refused`: the caller refuses a run whose deadline no policy meets on CONFIDENCE at any cap (`missed` with no
    deadline warning's cap; spotrun/pipeline/policy_stage.py `deadline_odds_refusal`), which says none of the caps
    searched here: such a run returns as soon as that is known, its section without the caps (a 27-day run at 0.05
    interruptions per hour with a 28.5-day deadline and no fallback was refused after 57 s of CPU in the estimate
    Lambda's 60 s, most of it the search of a cap to set no one was told)."""
    poll = {"poll_s": poll_s, "max_poll_s": max_poll_s, "n": n}
    alone = functools.cache(lambda: spot_policy(*_at_cap(run, est, math.inf), catalog, **poll))
    alone_finish = functools.cache(lambda: _finish_cap(est, alone(), poll_s))
    named: list[float] = []  # the deadline warning's cap, when it names one
    proven: list[Summary | dict] = []  # the chosen policy's row simulated at the cap to set (`_settled_cap`)
    to_the_cent: list[bool] = []  # whether that search ended to the cent
    moved: list[str] = []  # the layout the estimate takes at the cap to set, where it is not `est`'s
    unsettled: list[list | None] = []  # where the layouts ranked did not settle: `_settled_layout`'s hops
    held: list[list[str]] = []  # the odds the cap to set holds (`cap_to_set_holds`), where proven
    quoted: list[dict] = []  # the row simulated at a one-job cap kept for the deadline where none was proven
    deadline = run.compute.deadline_s is not None

    def _holds(of: PolicyChoice) -> list[str]:
        return cap_to_set_holds(next(r for r in of.section.policies if r["label"] == of.section.chosen), deadline)

    def across_layouts(cap: float, row: Summary | dict | None, exact: bool) -> tuple[float, Summary | dict | None,
                                                                                     bool]:
        # the cap to set of the layout the estimate takes at `cap` (`_settled_layout`): the same where it is est's.
        # Ranked also where no row was proven on est's layout (a cap kept for the deadline's odds as one job,
        # `_deadline_odds_kept`: without fallback, 8B 12 h auto named $432.70 for 2 x g6e 'the run is one job';
        # at it the estimate took 1 x ml.p5.48xlarge and named $344.52)
        if replan is None or cap == math.inf:
            return cap, row, exact
        other = _settled_layout(run, est, catalog, poll, cap, replan)
        if other is None:
            return cap, row, exact
        moved[:], unsettled[:] = [other[3]], [other[4]]
        return other[:3]

    def deadline_cap(p95: float) -> float:
        # at least the cap to set of the run as one job: one cap meets the deadline and finishes at the P95
        cap = _deadline_cap(run, est, catalog, max(p95, alone_finish()), poll, alone())
        # proven on simulations at it, and the least that holds (a cap a cent under it meets the deadline less)
        settled, row, exact = across_layouts(*_settled_cap(run, est, catalog, poll, cap, alone(), least=True))
        if row is not None:
            cap, proven[:], to_the_cent[:], held[:] = settled, [row], [exact], [_holds(alone())]
        named.append(cap)
        return named[-1]

    with shared_simulations(simulations):  # a cap whose plan was simulated already reuses its executions
        choice = spot_policy(run, est, catalog, **poll, deadline_cap=deadline_cap, keep=True, fixes=True)
        # the run as one job: the simulation at the cap set when that cap neither splits the run into a chain
        # (the simulation counts a chain's restarts as work) nor leaves out a policy
        one_job = choice if est.segments.segments <= 1 and not choice.left_out and not choice.capped else alone()
        missed = choice.missed
        if missed and one_job is not choice and one_job.meeting_p95_usd is not None:
            # none meets the deadline within the cap set (its chain's restarts, or the policies it left out), but
            # one does as one job: a larger cap meets it (a new user was told 'the run would miss it')
            cap = deadline_cap(one_job.meeting_p95_usd)
            label, odds = min((r["p95_usd"], r["label"], r["p_deadline"]) for r in one_job.section.policies
                              if r["p_deadline"] is not None and r["p_deadline"] >= CONFIDENCE)[1:]
            lets = "a cap of ${cap:,.2f} lets the estimate choose a policy that meets it"
            if proven and moved:  # proven on the layout the estimate takes there, with its odds there
                settle = "; they do not settle" if unsettled and unsettled[-1] else ""
                lets += (f": {_row_label(proven[-1])} on {moved[-1]} (the layouts ranked at that cap{settle}), on "
                         f"{_row_value(proven[-1], 'p_deadline'):.1%} simulated at it")
            elif proven:  # the policy the cap was proven for, as the last line names it (one policy for one cap)
                label, odds = proven[-1].label, _chosen_p_deadline(one_job, proven[-1].label)
            missed = (f"compute.deadline_hours={deadline_hours_text(run.compute.deadline_s)}: within the "
                      f"${run.max_usd:,.2f} cap no policy meets it on {CONFIDENCE:.0%} of the traces "
                      f"({choice.section.chosen} on "
                      f"{_chosen_p_deadline(choice):.1%}); "
                      f"as one job {label} meets it on {odds:.1%}: {lets.format(cap=cap)}")
        if refused and missed and not named:  # refused for the deadline's odds: no cap searched, none said
            return CappedChoice(dataclasses.replace(
                choice.section, p95_finish_policy=one_job.section.chosen, p95_one_job_usd=round(one_job.p95_usd, 2),
                p95_one_job_on_demand_usd=round(one_job.p95_on_demand_usd, 2),
                p95_on_demand_finish_cap_usd=_on_demand_finish_cap(est, one_job)), choice.warnings, missed=missed)
        finish = _finish_cap(est, one_job, poll_s, also=choice.section.policy)
        kept = [] if named else _deadline_odds_kept(run, est, catalog, finish, poll, one_job)
        if kept:
            finish = kept[0]
        if not named:  # the cap to set, proven on simulations at it (with a deadline, the least that holds)
            finish, row, exact = across_layouts(*_settled_cap(run, est, catalog, poll, finish, one_job,
                                                              least=run.compute.deadline_s is not None))
            proven[:], to_the_cent[:], held[:] = ([], [], []) if row is None else ([row], [exact], [_holds(one_job)])
        elif proven:  # the deadline warning's cap, proven: the cap to set, which the finish cap is not over
            finish = min(finish, named[-1])
        if kept and not proven and not moved:  # a one-job cap kept for the deadline, none proven: what the estimate
            # simulated at it shows, not the run's P95 under no cap (a new user's trial)
            there = spot_policy(*_at_cap(run, est, finish), catalog, **poll).section
            row = next(r for r in there.policies if r["label"] == there.chosen)
            one_row = next(r for r in one_job.section.policies if r["label"] == one_job.section.chosen)
            quoted = [row]
            held[:] = [[HOLDS_NAMES[key] for key, need in _needed(one_row, deadline)
                        if row[key] is not None and row[key] >= need]]
    section = dataclasses.replace(choice.section, p95_finish_cap_usd=finish if finish < math.inf else None,
                                  p95_finish_policy=one_job.section.chosen, p95_one_job_usd=round(one_job.p95_usd, 2),
                                  p95_one_job_on_demand_usd=round(one_job.p95_on_demand_usd, 2),
                                  p95_on_demand_finish_cap_usd=_on_demand_finish_cap(est, one_job),
                                  deadline_cap_usd=named[-1] if named else None,
                                  p95_finish_keeps_deadline=bool(kept) and not proven,
                                  cap_to_set_row=_row_dict(proven[-1]) if proven else quoted[-1] if quoted else None,
                                  cap_to_set_holds=held[-1] if (proven or quoted) and held else None,
                                  cap_to_set_least=bool(to_the_cent and to_the_cent[-1]),
                                  cap_to_set_layout=moved[-1] if moved else None,
                                  cap_to_set_unsettled=unsettled[-1] if unsettled else None)
    section = dataclasses.replace(section, cap_to_set_usd=section.deadline_cap_usd or section.p95_finish_cap_usd)
    if not moved:  # (the chain at the cap to set is the other layout's where it moved)
        section = _one_job_beside(est, section)
    own = [missed if w == choice.missed else w for w in choice.warnings]
    # one warning names the cap to set: where the deadline's already does, the cap's own would say it twice
    named_in = section.cap_to_set_usd is not None and any(f"${section.cap_to_set_usd:,.2f}" in w for w in own)
    under = [] if named_in else _under_finish_cap(run.max_usd, finish, section)
    # nor where the cap's own warning names it with its odds there (8B 12 h auto without fallback a cent under
    # $341.04 on ESTIMATE_CHAIN: the may-not-finish and the under-the-cap warnings both named it)
    return CappedChoice(section, (*_fallback_over_cap(run, est, section), *own,
                                  *_may_not_finish(run, section, name_cap=not named_in and not under), *under),
                        missed=missed)


def _may_not_finish(run, section: SpotPolicy, name_cap: bool = True) -> list[str]:
    """With a deadline, the may-not-finish warning `spot_policy` gives a run without one: the chosen spot policy
    finishes on fewer than CONFIDENCE of its simulated runs, with the fallback or without (a new user's mistral at
    $15.34 with the fallback was accepted with 'ok' where 0.0% of the chosen policy's runs finished, every one
    ended at the cap), why its unfinished runs end, and the cap to set with its odds there (not where another
    warning, the deadline's, already names it: `name_cap` false; a figure is said once)."""
    if run.compute.deadline_s is None or not run.compute.spot:
        return []
    row = next(r for r in section.policies if r["label"] == section.chosen)
    if row["p_finished"] >= CONFIDENCE:
        return []
    unfinished = 1.0 - row["p_finished"]
    at_cap = min(unfinished, row.get("p_over_budget", 0.0))
    if run.compute.on_demand_fallback:
        causes = [(at_cap, f"{at_cap:.1%} end at the cap (OverBudget): a larger budget.max_usd finishes them")] * \
            (at_cap > 0)
        rest = unfinished - at_cap
        causes += [(rest, f"{rest:.1%} reach a job's MaxRuntime or MaxWait unfinished")] * (rest > 1e-9)
        why = "; ".join(text for _, text in sorted(causes, key=lambda c: -c[0]))
    else:
        why = unfinished_by_cause(row["p_finished"], at_cap, section.maxwait_fixes)
    text = (f"the run may not finish: within the ${run.max_usd:,.2f} cap the chosen {section.chosen}'s runs finish "
            f"on {row['p_finished']:.1%} of the traces: {why}")
    to_set, proof = section.cap_to_set_usd, section.cap_to_set_row
    if name_cap and to_set is not None and to_set > run.max_usd:
        text += f"; the cap to set is ${to_set:,.2f}"
        if proof:
            text += f" (simulated at it, {proof['label']}'s runs finish on {proof['p_finished']:.1%})"
    return [text]


def _one_job_beside(est, section: SpotPolicy) -> SpotPolicy:
    """`section` with, when the cap to set splits the run into a chain of more than one job, that chain's expected
    bill and the smallest cap at which the run is one job with its expected bill there (the planner's chain,
    spotrun/planner/segments.py `chain_at`, `one_job_at`): a larger cap can cost less in expectation (a new user:
    qwen2 at the $0.75 named, 2 jobs expected $0.37; one job from $0.83, expected $0.26)."""
    to_set = section.deadline_cap_usd or section.p95_finish_cap_usd
    if to_set is None or not est.segments.chain_costs or section.policy == "on_demand":
        # on_demand chosen: the run is on-demand jobs, one at the cap to set (its finish cap), not the spot chain
        # (a spot run choosing on_demand was told 'expected $0.43 as the chain of 2 jobs at $0.83')
        return section
    jobs, chain_usd = chain_at(est.segments, to_set)
    one_cap, one_usd = one_job_at(est.segments)
    if jobs <= 1 or chain_usd is None or one_cap is None:
        return section
    return dataclasses.replace(section, cap_to_set_jobs=jobs, cap_to_set_expected_usd=chain_usd,
                               one_job_cap_usd=one_cap, one_job_expected_usd=one_usd)


def _fallback_over_cap(run, est, section: SpotPolicy) -> list[str]:
    """The warning when the run on-demand costs more than the cap, which the cost guard would stop a fallback at:
    not at or over the cap to set (the chosen policy's P95 bill, fallbacks counted, finishes within it; a new user
    was warned about the very cap the estimate named)."""
    to_set = section.deadline_cap_usd or section.p95_finish_cap_usd
    on_demand = est.cost_usd["on_demand"]
    if not (run.compute.spot and run.compute.on_demand_fallback and on_demand > run.max_usd):
        return []
    if to_set is not None and run.max_usd >= to_set:
        return []
    return [f"an on-demand fallback would cost {usd(on_demand)} > budget {usd(run.max_usd)}; the cost guard stops "
            "it at the cap"]


def _chosen_p_deadline(choice: PolicyChoice, label: str | None = None) -> float:
    """The P(deadline) of the chosen policy's row (of `label`'s where given)."""
    return next(r["p_deadline"] for r in choice.section.policies if r["label"] == (label or choice.section.chosen))


def _deadline_odds_kept(run, est, catalog: dict, finish: float, poll: dict, one_job: PolicyChoice) -> list[float]:
    """With a deadline, the cap to set keeps the odds of meeting it that the run has as one job: a P95 finish cap
    whose chain has more jobs adds their restarts to the run's time, and the deadline's odds drop (a new user:
    qwen2 with a 0.3 h deadline, 90.7% at a $50 cap, 0.0% at the $0.73 named). `[cap]`: the smallest cap whose
    chain is one job (at least `finish`), where they are the one job's; `[]`: `finish` keeps them (or no cap does)."""
    if run.compute.deadline_s is None or finish == math.inf or segments_at(est.segments, finish) <= 1:
        return []
    shown = _chosen_p_deadline(one_job)
    there = spot_policy(*_at_cap(run, est, finish), catalog, **poll)
    if _chosen_p_deadline(there) >= min(shown, CONFIDENCE) - 0.0005:  # the rows are rounded to 4 places
        return []
    one_job_cap = one_job_cap_usd(est.segments)
    return [] if one_job_cap == math.inf else [max(finish, one_job_cap)]


CAP_RAISES = 8  # raises of the named cap (by 1% of it, 2%, 4%, ...) tried when it does not hold
# the simulations of every policy the search of the cap to set runs at most (each as long as the estimate's own; the
# chosen policy's alone, a tenth of one, are not counted): past them the least cap proven so far is named, not to
# the cent (the estimate Lambda's 60 s: the longest run at 10 interruptions per hour, a 40-day deadline and a cap
# that binds took 83 s of CPU with 8, 57 s with 4, under load: benchmarks/estimate_lambda_bench.py's case)
FULL_SEARCH_SIMULATIONS = 2


def _needed(one_row: dict, deadline: bool) -> list[tuple[str, float]]:
    """The odds the cap to set keeps of the chosen policy's run as one job (`one_row`, rounded to 4 places), each at
    most CONFIDENCE, the share `choose` requires (at 95% a cap named for llama3-8b finished 97.7% of its runs, and
    the estimate at it warned that no policy finishes on 99%): (key, the least share) pairs. The share that finishes
    always; with a deadline its P(deadline) too where the run as one job meets it on any trace (a missed deadline,
    0.0% everywhere, searched alone named llama3-8b-full with a 3 h deadline $153.58, where 59.4% finished)."""
    met = deadline and one_row["p_deadline"] is not None and one_row["p_deadline"] > 0
    out = [("p_deadline", min(CONFIDENCE, one_row["p_deadline"]) - 0.00005)] if met else []
    return out + [("p_finished", min(CONFIDENCE, one_row["p_finished"]) - 0.00005)]


HOLDS_NAMES = {"p_deadline": "P(deadline)", "p_finished": "finish share"}  # `SpotPolicy.cap_to_set_holds`' words


def cap_to_set_holds(one_row: dict, deadline: bool) -> list[str]:
    """The odds the cap to set holds (`_needed`), as `SpotPolicy.cap_to_set_holds` names them."""
    return [HOLDS_NAMES[key] for key, _ in _needed(one_row, deadline)]


def _settled_cap(run, est, catalog: dict, poll: dict, cap: float, one_job: PolicyChoice,
                 least: bool) -> tuple[float, Summary | None, bool]:
    """The cap to set, proven on simulations at it: (the cap, the chosen policy's row simulated at it, None where
    none was simulated: no chain to plan a cap on, or no cap tried held; whether it is the least to the cent).

    A cap holds when the policy the estimate chooses there (`spot_policy`, simulated at it) keeps every odds of the
    policy chosen for the run as one job (`one_job`) that the cap holds (`_needed`: the share that finishes, and with
    a deadline met on any trace P(deadline)): the run at the cap is the run simulated, its sentinel's room and the
    chain's restarts included (a cap named $381.31 for a $249.03 P95 left a sentinel policy no room beside its
    $376.83 on-demand job: at it the estimate chose another policy, which missed the odds). The policy chosen there
    need not be the one-job policy: a chain's restarts raise every policy's mean and tied policies trade the choice
    (a deadline that cannot bind, 48 h on a ~10 h run, named $381.31 against $166.63 without it while the required
    label and a mean under the others' one-job means held only there). `cap` (the P95 finish cap) is raised (1%, 2%,
    4%, ... of it) while it does not hold, then bisected to the cent; with `least` (a deadline) the cap is searched
    down to the cent from the P95 bill (a chain's restarts can cost no odds: a long run was told 2.8x its P95 bill
    for odds its shorter chain met). The search runs on the one-job policy's row alone (one simulation of one policy
    a step: `row_holds`, its odds kept); the cap it ends on is checked on every policy's, and raised then bisected on
    them where the policy chosen there misses the odds, in FULL_SEARCH_SIMULATIONS at most (else the least proven so
    far: not to the cent)."""
    if cap == math.inf or not est.segments.chain_costs:
        return cap, None, False
    label, deadline = one_job.section.chosen, run.compute.deadline_s is not None
    one_row = next(r for r in one_job.section.policies if r["label"] == label)
    needs = _needed(one_row, deadline)
    n, candidate = poll["n"], (one_job.section.policy, one_job.section.checkpointing)
    sim = {"n": n, "seed": SEED, "poll_s": poll["poll_s"], "max_poll_s": poll["max_poll_s"]}

    def keeps(row: Summary) -> bool:  # every odds the cap holds
        return all(getattr(row, key) >= need for key, need in needs)

    def row_at(at: float, which: tuple[str, str] = candidate) -> Summary:  # a policy's row at the cap
        return _simulated(*_at_cap(run, est, at), catalog, [which], **sim)[1][0]

    # where the share that finishes is the one odds held (without a deadline, or one the run misses as one job) it
    # decides: a cap that ends too many runs unfinished is told by the traces likeliest to end so, executed first
    # (`_Unfinished`); with P(deadline) held too, a cap at which too many runs miss the deadline fails on those
    # traces alone the same way (exactly: the row there would keep fewer than its share), else the row decides
    alone = len(needs) == 1
    unfinished = _Unfinished(run, est, catalog, candidate, sim, needs[-1][1]) if alone else \
        _Unfinished(run, est, catalog, candidate, sim, dict(needs)["p_deadline"], deadline=True)

    def row_holds(at: float) -> Summary | bool | None:  # where the policy keeps the odds (the choice may move)
        if unfinished.too_many(at):
            return None
        if alone:  # (True: it holds; its row is simulated by the full check, `holds`)
            return True
        row = row_at(at)  # (every trace executed by `too_many`: reused)
        return row if keeps(row) else None

    full = [0]  # the simulations of every policy the search ran (FULL_SEARCH_SIMULATIONS at most)

    def holds(at: float) -> Summary | None:  # where the policy the estimate chooses there keeps the odds
        full[0] += 1
        there = spot_policy(*_at_cap(run, est, at), catalog, **poll).section
        row = row_at(at, (there.policy, there.checkpointing))  # the same executions, reused
        return row if keeps(row) else None

    def more() -> bool:
        return full[0] < FULL_SEARCH_SIMULATIONS

    # under the P95 bill the cap ends more than 5% of the runs unfinished; under the smallest cap whose chain
    # finishes the estimate refuses the run OverBudget (`accepted_floor`: an on-demand warm pool's keep-alive is
    # in that cap; the search's simulations at a cap do not refuse: qwen2 on-demand, a 30 min pool, 0.33 h, named
    # $1.91 where the estimate at it refused naming $1.99)
    low = max(cents_up(one_job.p95_usd), accepted_floor(est))
    high = max(cents_up(cap), low)
    top = row_holds(high)
    tries = 0
    below = high
    while top is None and tries < CAP_RAISES:  # raised on the policy's row until it holds
        below, high = high, cents_up(high + 0.01 * high * 2 ** tries)
        top, tries = row_holds(high), tries + 1
    if top is None:
        return cap, None, False
    if least:  # the least over the P95 bill
        high = low if row_holds(low) is not None else _bisect(low, high, top, row_holds)[0]
    elif tries:  # the least over the P95 finish cap
        high = _bisect(below, high, top, row_holds)[0]
    checked = holds(high)
    if checked is not None:
        return high, checked, True
    failed = high  # the choice moved where the row alone holds: raised, then bisected, on every policy's
    while checked is None and more():
        high = cents_up(high + 0.01 * high * 2 ** (full[0] - 1))
        checked = holds(high)
    if checked is None:
        return cap, None, False
    return _bisect(failed, high, checked, holds, more)


PARTIAL = "partial"  # `_Unfinished`'s executions on some traces at a cap, by (plan, policy, checkpointing)


class _Unfinished:
    """Without a deadline, whether a cap ends more of the chosen policy's runs unfinished than `need` allows, told
    by the traces likeliest to (those a cap tried ended unfinished, and those whose bill as one uncapped job is the
    highest), executed alone first: where more than allowed end unfinished among them, the cap fails on them alone,
    exactly (the other traces can only add to them); otherwise the other traces are executed too. With a deadline
    (`deadline`), the same of the runs that miss it (unfinished, or finished after it): a cap at which the deadline
    leaves the share out of reach fails on the traces that show it (a 70B LoRA refused at $500 with a 30 h deadline
    executed its chosen policy on all 1,000 traces at each of the caps its search tried: 52 s of CPU, of the
    Lambda's 60 s).
    The search of the cap to set without a deadline ran the row on every trace a dozen times (llama3-8b: 5.6 s of
    CPU), and about half its caps fail."""

    def __init__(self, run, est, catalog: dict, candidate: tuple[str, str], sim: dict, need: float,
                 deadline: bool = False):
        self.run, self.est, self.catalog, self.candidate, self.sim = run, est, catalog, candidate, sim
        self.need, self.deadline = need, deadline
        # the run as one job, uncapped (the estimate simulated it already: reused), its costliest traces first
        bills = _simulated(*_at_cap(run, est, math.inf), catalog, [candidate], **sim)[1][0].bills
        self.n = len(bills)
        self.allowed = self.n - math.ceil(round(need * self.n, 9))  # unfinished runs the share allows
        self.order = sorted(range(self.n), key=lambda i: -bills[i])
        self.likely = self.order[:max(10, 5 * self.allowed)]

    def too_many(self, at: float) -> bool:
        run, est = _at_cap(self.run, self.est, at)
        plan = run_plan(run, est, self.catalog, poll_s=self.sim["poll_s"], max_poll_s=self.sim["max_poll_s"])
        if traces_for_estimate(plan, est.interruptions_per_hour, self.sim["n"], est.mean_wait_seconds) != self.n:
            return False  # (not the traces the row is simulated on: the row decides)
        spec = TraceSpec(interruptions_per_hour=est.interruptions_per_hour, horizon_s=horizon_s(plan),
                         **ESTIMATE_TRACES, mean_wait_s=est.mean_wait_seconds)
        key, shared = ("traces", spec, self.n, self.sim["seed"]), _SHARED.get()
        traces = shared[key] if shared is not None and key in shared else generated_traces(spec, self.n,
                                                                                            self.sim["seed"])
        its, ended = policy_plans(run, est, plan)(self.candidate[0]), []
        key = (dataclasses.replace(its, cap_usd=None), its.cap_usd is None)
        done = None if shared is None else shared.setdefault(("executions", key, spec, self.n, self.sim["seed"]), {})
        hit = None if done is None else done.get(self.candidate)
        every = None if done is None else done.get(EVERY_PLAN, {}).get((its, *self.candidate))
        if every is None and hit is not None and _reusable(its, *hit):
            every = hit[1]
        if every is not None:  # executed at this cap already (the row's, reused): counted
            return self._fails(sum(1 for t in every if not self._kept(its, t)))
        # the traces executed at this cap by an earlier call that failed it on some alone (a search comes back to a
        # cap it tried): reused, not executed again
        made: dict[int, Tally] = {} if done is None else done.setdefault(PARTIAL, {}).setdefault(
            (its, *self.candidate), {})
        first = set(self.likely)
        # the others, costliest first, in growing batches: a cap that fails on them stops at the batch that shows it
        # (the same answer: more than allowed ended unfinished; a cap that holds executes every trace either way)
        rest = [i for i in self.order if i not in first]
        batches = [rest[(1 << k) * 64 - 64:(1 << (k + 1)) * 64 - 64] for k in range(max(1, len(rest)).bit_length())]
        for which in (self.likely, *(b for b in batches if b)):
            new = [i for i in which if i not in made]
            made.update(zip(new, executed(its, [traces[i] for i in new], *self.candidate) if new else [],
                            strict=True))
            ended += [i for i in which if not self._kept(its, made[i])]
            if self._fails(len(ended)):
                break
        self.likely = [*ended, *(i for i in self.likely if i not in set(ended))]
        if len(made) == self.n and done is not None:  # every trace executed: the row's executions at this cap,
            # which the full check (`holds`, `_simulated`'s) then reuses, keyed as `_simulated` keys them
            done[self.candidate] = (its, [made[i] for i in range(self.n)])
            done.setdefault(EVERY_PLAN, {})[(its, *self.candidate)] = done[self.candidate][1]
        return self._fails(len(ended))

    def _kept(self, its: SimPlan, t: Tally) -> bool:
        """Whether the run on a trace counts toward the share: it finishes (with a deadline: by it, as `summarize`
        counts `p_deadline`)."""
        if not self.deadline:
            return t.finished
        return t.finished and t.t <= its.deadline_s + 1e-6

    def _fails(self, ended: int) -> bool:
        """Whether `ended` runs not kept already leave the row short of `need` whatever the other traces do. With a
        deadline, as `summarize` computes `p_deadline` (the most it can be: every other trace kept; a quotient of
        floats grows with its numerator), so a cap fails here exactly where the row's share would be under `need`."""
        if not self.deadline:
            return ended > self.allowed
        return (self.n - ended) / self.n < self.need


def accepted_floor(est) -> float:
    """The smallest cap the estimate accepts on `est`'s layout, to the cent, up (the planner's OverBudget check:
    its chain's `min_cap_usd`, the warm pool's keep-alive included); 0 where it names none. No cap to set is under
    it (`_settled_cap`)."""
    smallest = est.segments.min_cap_usd if est.segments else 0.0
    return cents_up(smallest) if smallest and math.isfinite(smallest) else 0.0


def _bisect(fails: float, holds_at: float, row: Summary, holds: Callable[[float], Summary | None],
            more: Callable[[], bool] = lambda: True) -> tuple[float, Summary, bool]:
    """The least cap, to the cent, in (fails, holds_at] at which `holds`, by bisection while `more()` allows:
    (the cap, its row, whether it is to the cent)."""
    lo, hi = round(fails * 100), round(holds_at * 100)
    while hi - lo > 1 and more():
        mid = (lo + hi) // 2
        there = holds(mid / 100)
        if there is None:
            lo = mid
        else:
            hi, row = mid, there
    return hi / 100, row, hi - lo <= 1


LAYOUT_SETTLE_TRIES = 3  # layouts the cap to set is searched on at most (`_settled_layout`)


def layout_words(est) -> str:
    """An estimate's layout as the text names it: '1 x ml.p5.48xlarge'."""
    return f"{est.instance_count} x {est.instance_type}"


def _layout_key(est) -> tuple:
    return est.instance_type, est.instance_count, est.sharding, est.shard_group_nodes


def _settled_layout(run, est, catalog: dict, poll: dict, cap: float,
                    replan: Callable[[float], object]) -> tuple[float, dict, bool, str, list | None] | None:
    """Where the planner ranks the layouts by their spot policy's simulated bill at the run's cap
    (spotrun/planner/estimate.py `_by_policy`), the cap to set of `est`'s layout (`cap`) can bring another layout
    (a new user: 8B, 12 h, $445.38 named on 2 x ml.g6e.48xlarge; at it the estimate chose 1 x ml.p5.48xlarge and
    named $399.83). The layouts are ranked at `cap` (`replan`): None where the estimate there takes `est`'s layout
    (`cap` holds); else that layout's cap to set, searched on it as on `est`'s (`spot_policy_at_caps` at `cap`),
    and ranked again there, up to LAYOUT_SETTLE_TRIES layouts: (that cap, its chosen policy's row there, whether
    it is the least to the cent, the layout in words, None) where the estimate at it takes the layout it was
    searched on. Where none settles (the layouts cycle, or move past LAYOUT_SETTLE_TRIES; the estimate refuses a
    later cap, or names none there) `cap` is kept, and what is true at it is named: (`cap`, the row of the policy
    the estimate chooses at `cap` on the layout it takes there, not the least, that layout, the hops: one
    {"layout", "cap_to_set_usd", "brings"} per layout searched, `est`'s first; "brings" null where the estimate
    refused or named no cap). None where the estimate at `cap` itself refuses or names none."""
    layout, found, tried = _layout_key(est), None, {_layout_key(est)}
    hops = [{"layout": layout_words(est), "cap_to_set_usd": cap, "brings": None}]
    first = None  # (the row chosen at `cap` on the layout the estimate takes there, that layout): true at `cap`
    for _ in range(LAYOUT_SETTLE_TRIES):
        there = replan(cap)
        if there is not None and _layout_key(there) == layout:
            return found
        if there is not None:
            hops[-1]["brings"] = layout_words(there)
        if there is None or _layout_key(there) in tried:
            break
        at = spot_policy_at_caps(dataclasses.replace(run, max_usd=cap), there, catalog, **poll).section
        if first is None:
            first = (next(r for r in at.policies if r["label"] == at.chosen), layout_words(there))
        hops.append({"layout": layout_words(there), "cap_to_set_usd": None, "brings": None})
        if at.cap_to_set_usd is None or at.cap_to_set_row is None:
            break
        layout, cap = _layout_key(there), at.cap_to_set_usd
        tried.add(layout)
        hops[-1]["cap_to_set_usd"] = cap
        found = (cap, at.cap_to_set_row, at.cap_to_set_least, layout_words(there), None)
    if first is None:
        return None
    return hops[0]["cap_to_set_usd"], first[0], False, first[1], hops


def _row_dict(row: Summary | dict) -> dict:
    """A policy row as the section holds it (rounded): from a Summary, or already one (another layout's)."""
    return row if isinstance(row, dict) else _rounded(row)


def _row_label(row: Summary | dict) -> str:
    return _row_dict(row)["label"]


def _row_value(row: Summary | dict, key: str):
    return _row_dict(row)[key]


def _finish_cap(est, one_job: PolicyChoice, poll_s: float, also: str = "") -> float:
    """The P95 finish cap of `one_job`'s P95 bill on the estimate's chain (inf without a chain to plan it on), with
    the room a sentinel needs beside an on-demand job (the guard's `poll_s`) when `one_job`'s policy or `also` (the
    policy chosen at the cap set) keeps one."""
    if not est.segments.chain_costs:
        return math.inf
    on_demand = _on_demand_label(one_job.section.chosen)  # its bill is at on-demand rates
    room = max(sentinel_room_s(one_job.section.policy, poll_s), sentinel_room_s(also, poll_s))
    return finish_cap_usd(est.segments, one_job.p95_usd, spot=not on_demand, sentinel_room_s=room)


def _on_demand_label(label: str | None) -> bool:
    """Whether a policy row's label is the on-demand policy's (it never bills spot)."""
    return (label or "").split(" ")[0] == "on_demand"


def _on_demand_finish_cap(est, one_job: PolicyChoice) -> float | None:
    """Where the P95 bill of a policy that can run spot was billed (partly) on-demand: the cap the same bill needs
    on-demand throughout (what compute.spot=false is told for it), beside the cap to set, which takes it at the spot
    share (spotrun/planner/segments.py `finish_cap_usd`: a run billed within the P95 can bill it on spot). None
    otherwise."""
    if not est.segments.chain_costs or _on_demand_label(one_job.section.chosen) or one_job.p95_on_demand_usd <= 0:
        return None
    return finish_cap_usd(est.segments, one_job.p95_usd, spot=False)


BINDING_CAP_ODDS = ("Odds at a cap that binds rest on the tail of the generated traces' waits for capacity: on "
                    "the public recordings they promised more than was met (docs/spot-policy.md, 'Calibration at a "
                    "cap that binds').")


def _under_finish_cap(cap_usd: float, finish_usd: float, section: SpotPolicy) -> list[str]:
    """A warning when the cap set is under the cap to set: the run is accepted, and the warning says what the
    simulation at this cap showed, the share of the chosen policy's runs that finish (and meet the deadline), beside
    what it showed at the cap to set (a new user set a cap a cent under the figure they were told, with no word;
    the next was told a run billed the P95 'would stop OverBudget' while 97.6% of the simulated runs finished).
    With a deadline warning's cap, that one is the cap to set: one figure across the warnings and the summary."""
    if section.deadline_cap_usd is not None and section.cap_to_set_row is not None:
        finish_usd = section.deadline_cap_usd  # proven on simulations at it: one figure, as below
    deadline = section.deadline_cap_usd
    if deadline is not None and section.cap_to_set_row is None:
        return [] if cap_usd >= deadline else [
            f"budget.max_usd=${cap_usd:,.2f} is under the cap to set, ${deadline:,.2f}: set ${deadline:,.2f} "
            "to meet the deadline (the estimate then chooses a policy that meets it) and to finish at its P95 "
            "bill (the spot policy's last line)"]
    if finish_usd == math.inf or cap_usd >= finish_usd:
        return []
    deadline = section.confidence is not None
    here = next(r for r in section.policies if r["label"] == section.chosen)
    proven = section.cap_to_set_row
    if proven is not None:  # said only where this cap loses odds or money against the cap to set
        odds = [k for k in ("p_finished", "p_deadline") if k == "p_finished" or deadline]
        lower = any((here[k] or 0.0) < (proven[k] or 0.0) for k in odds)
        dearer = round(here["mean_usd"], 2) > round(proven["mean_usd"], 2)
        if not lower and not dearer:  # (at $388.19 a user was warned of $399.83, both 100%/100%)
            return []
        if not lower:  # money alone: the odds here are as good or better (a user was pushed to worse odds)
            return [f"budget.max_usd=${cap_usd:,.2f} is under the cap to set, ${finish_usd:,.2f}: at this cap "
                    f"{_shares_text(here, deadline)} of the estimate's traces at a mean bill of "
                    f"${here['mean_usd']:,.2f}; at ${finish_usd:,.2f} the estimate chooses {proven['label']}"
                    f"{_on_layout(section)}, whose "
                    f"mean bill is ${proven['mean_usd']:,.2f} ({_shares_text(proven, deadline)}): set "
                    f"${finish_usd:,.2f} for the lower expected bill, or keep this cap for these odds"]
    there = "" if proven is None else f" ({_shares_text(proven, deadline)}, simulated at it)"
    return [f"budget.max_usd=${cap_usd:,.2f} is under the cap to set, ${finish_usd:,.2f}: at this cap "
            f"{_shares_text(here, deadline)} of the estimate's traces; set ${finish_usd:,.2f} for "
            f"{(proven or {}).get('label', section.p95_finish_policy)}'s run{_on_layout(section)} as the estimate "
            f"simulated it{there}"
            + (f". {BINDING_CAP_ODDS}" if deadline else "")]


def _on_layout(section: SpotPolicy) -> str:
    """Where the estimate at the cap to set takes another layout than this one (`_settled_layout`): which."""
    layout = section.cap_to_set_layout
    return f" on {layout} (the layouts ranked at that cap{_unsettled_text(section)})" if layout else ""


def _unsettled_text(section: SpotPolicy) -> str:
    """Where the layouts ranked at the caps to set never settle (`SpotPolicy.cap_to_set_unsettled`): that they do
    not, each layout with its own cap to set in turn, and that the cap named is this layout's, at which the
    estimate takes the other (a cap where the run's layout and odds hold still was not found)."""
    hops = section.cap_to_set_unsettled
    if not hops:
        return ""
    chain = [f"{h['layout']} (" + ("no cap to set" if h["cap_to_set_usd"] is None else
                                   f"its cap to set ${h['cap_to_set_usd']:,.2f}") + ")" for h in hops]
    end = hops[-1]["brings"]
    if end:
        chain.append(f"{end}{' again' if any(h['layout'] == end for h in hops) else ''}")
    elif hops[-1]["cap_to_set_usd"] is not None:  # the search stopped (LAYOUT_SETTLE_TRIES, or a refusal there)
        chain[-1] = chain[-1][:-1] + ", not ranked at it)"
    return (f"; they do not settle: {' brings '.join(chain)}: the cap named is {hops[0]['layout']}'s, and what it "
            "says is the estimate at it")


def _shares_text(row: dict, deadline: bool) -> str:
    """A policy row's simulated shares: the runs that finish (and meet the deadline)."""
    met = f" and {row['p_deadline']:.1%} meet the deadline" if deadline and row["p_deadline"] is not None else ""
    return f"{row['label']}'s runs finish on {row['p_finished']:.1%}{met}"


def _at_cap(run, est, cap_usd: float) -> tuple:
    """The run and its estimate at another cap, as `spot_policy` reads them: the cap and the chain's length
    (one job under no cap)."""
    jobs = 1 if cap_usd == math.inf else segments_at(est.segments, cap_usd)
    return (dataclasses.replace(run, max_usd=cap_usd),
            dataclasses.replace(est, segments=dataclasses.replace(est.segments, segments=jobs)))


def _deadline_cap(run, est, catalog: dict, p95_usd: float, poll: dict, one_job: PolicyChoice) -> float:
    """A cap at which the estimate chooses a policy meeting the deadline, which the run's cap left out
    (`p95_usd`: their lowest P95 at the run's cap; `one_job`: the choice for the run as one job under no cap).

    A larger cap makes a shorter chain, so fewer restarts to simulate, and a policy's P95 moves (either way: the
    deadline policies decide on the slack left; seen: $149.27 at a $97.55 cap, $169.27 once set). So the cap is
    estimated again at that P95 (to the cent, up), raised to the lowest P95 there while no policy that meets the
    deadline is within it, at most DEADLINE_CAP_TRIES times (each a simulation). Past them: the smallest cap
    whose chain is one job, or the one-job P95 of the policies meeting it if more: from that cap on the chain is
    one job, so the simulation is `one_job`'s and that policy is within the cap."""
    cap = cents_up(p95_usd)
    for _ in range(DEADLINE_CAP_TRIES):
        there = spot_policy(*_at_cap(run, est, cap), catalog, **poll)
        if not there.misses_deadline:
            return cap
        if there.meeting_p95_usd is None:  # none meets it at this cap's chain
            break
        cap = max(cents_up(there.meeting_p95_usd), cap + 0.01)
    one_job_cap = one_job_cap_usd(est.segments)
    if one_job.meeting_p95_usd is None or one_job_cap == math.inf:  # none meets it as one job, or no one job
        return cap  # (of SageMaker's 28 days) holds the run: the last cap tried, not checked
    return max(one_job_cap, cents_up(one_job.meeting_p95_usd))


def spot_alone(deadline_s: float, p_deadline: float) -> str:
    """The line for a deadline met on spot capacity alone (compute.on_demand_fallback=false): no policy can move
    to on-demand, so every one runs spot until its MaxWait ends it and the odds are spot capacity's (a new user was
    told 'ok' at 99.5% by nine policies named for deadlines, all the same spot-only run)."""
    return (f"compute.deadline_hours={deadline_hours_text(deadline_s)} rests on spot capacity alone: "
            "compute.on_demand_fallback is false, so no policy moves to on-demand and each runs spot until its "
            f"MaxWait ends it; the {p_deadline:.1%} is the odds that spot capacity comes in time on these "
            "traces, not a guarantee; compute.on_demand_fallback=true lets the deadline policies move to on-demand "
            "to meet it")


def _missed_deadline(plan: SimPlan, rows: list[Summary]) -> str:
    """The warning for a deadline no candidate meets on CONFIDENCE of the traces, naming what would help."""
    head = (f"compute.deadline_hours={deadline_hours_text(plan.deadline_s)}: no policy meets it on {CONFIDENCE:.0%} "
            "of the traces")
    on_demand = next((r for r in rows if r.policy == "on_demand"), None)
    if on_demand is not None:
        return (f"{head} (on-demand from the start takes {hours_text(on_demand.mean_wall_h * 3600)}); the run would "
                "miss it")
    uninterrupted_h = (plan.startup_s + plan.work_s) / 3600
    if uninterrupted_h * 3600 > plan.deadline_s:  # on-demand fallback would not meet it either: no advice to take it
        return (f"{head}: uninterrupted from the start the run takes {hours_text(uninterrupted_h * 3600)}, so "
                "neither spot nor on-demand meets it; the run would miss it")
    likeliest = max(rows, key=lambda r: r.p_deadline)
    return (f"{head} on spot alone (the likeliest, {likeliest.label}, on {likeliest.p_deadline:.1%}); "
            "compute.on_demand_fallback=true lets the run move to on-demand to meet it")


def fitted_source(rate_per_hour: float, mean_wait_s: float | None = None, wait_source: str = "") -> str:
    """What the estimate's traces are, in a line: the waits' mean the model's at the rate (a trace's mean wait
    averaged over the traces: each trace has its own level), or the one given (with where it came from: recorded,
    or the run's checkpoint.mean_wait_hours)."""
    if mean_wait_s is None:
        return (f"generated: {rate_per_hour:.3g} interruptions per job-hour, waits for capacity of "
                f"{mean_wait_over_traces_s(rate_per_hour) / 3600:.1f} h on average, shaped and bunched as the public "
                "recordings'")
    return (f"generated: {rate_per_hour:.3g} interruptions per job-hour, waits for capacity of "
            f"{mean_wait_s / 3600:.2g} h on average ({wait_source or 'given'}), shaped and bunched as the public "
            "recordings'")


def _rounded(r: Summary) -> dict:
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.row().items()}


def mean_over_p95_note(rows: list[dict]) -> list[str]:
    """A line when a row's mean is above its P95 (printed cents): not a bug but a long tail, fewer than 5% of the
    traces costing far more (a long wait for capacity, then on-demand), which the mean carries and the P95 does not."""
    over = [r["label"] for r in rows if round(r["mean_usd"], 2) > round(r["p95_usd"], 2)]
    if not over:
        return []
    return [f"  mean above P95 ({', '.join(over)}): fewer than 5% of the traces cost far more than the rest (a long "
            "wait for capacity, then on-demand); the mean counts them, the P95 does not"]


def sentinel_text(section: SpotPolicy) -> str:
    """The policy section's line on the sentinel (`SpotPolicy.sentinel`), the same facts as its JSON."""
    sentinel = section.sentinel
    if not sentinel.get("used"):
        return f"  sentinel: none ({section.policy} keeps no spot job waiting beside an on-demand job)"
    return (f"  sentinel: yes ({section.policy}): after {sentinel['stint_s'] / 3600:.2f} h on an on-demand job, a "
            "spot job of the run's instances waits for capacity beside it, looked at every "
            f"{sentinel['poll_s'] / 60:.0f} min, in room every on-demand job leaves under the cap (its MaxRuntime "
            "is shorter by it; billed in the run's spend)")


def _p95_market_text(section: SpotPolicy) -> str:
    """What the cap to set holds above the P95 bill, by the markets the policy bills (spotrun/planner/segments.py
    `finish_cap_usd`): an on-demand policy's bill is the bill to expect and the cap adds only what a job's MaxRuntime
    leaves unbilled; a policy that can run spot takes all of it at the spot share, each second bounded at on-demand
    rates while its job runs, even the part its P95 billed on-demand (a run billed within the P95 can bill it on
    spot), and says so with the cap that part would need on-demand."""
    if _on_demand_label(section.p95_finish_policy):
        return ("; on-demand, the bill to expect): the cap also holds what the job's MaxRuntime leaves unbilled at "
                f"on-demand rates, its save and the {STOP_BILL_S:.0f} s a stop bills")
    text = "), with the chain's restarts and the last job's room at on-demand rates"
    on_demand = section.p95_one_job_on_demand_usd or 0.0
    if on_demand > 0 and section.p95_on_demand_finish_cap_usd is not None:
        text = (f", ${on_demand:,.2f} of it on-demand), with the chain's restarts and the last job's room at "
                "on-demand rates, all of it as if billed on spot: a run billed within the P95 can bill it on spot, "
                "each second bounded at on-demand rates while its job runs (billed on-demand throughout, that bill "
                f"needs ${section.p95_on_demand_finish_cap_usd:,.2f}, as compute.spot=false is told)")
    return text


def policy_text(section: SpotPolicy | None) -> str:
    """The estimate's lines for the policy section: the choice, each candidate's simulated bills (a row the cap
    left out marked), and the cap to set (`p95_finish_cap_usd`, named by the estimate step)."""
    if not section:
        return ""
    left_out = set(section.left_out)
    # without a deadline the odds column is the share that finishes (at a cap that binds, the cap ends the rest)
    deadline = any(r["p_deadline"] is not None for r in section.policies)
    odds = "P(deadline)" if deadline else "P(finished)"
    lines = [f"spot policy: {section.chosen} ({section.why}; {section.traces} traces, {section.trace_source})",
             "  each policy's bill simulated on these traces as the cost guard runs it (the chosen row, *, is the "
             "cost line's first figure):",
             f"  {'policy':<30} {'mean $':>10} {'P50 $':>10} {'P95 $':>10} {odds:>11} {'lost h':>7}"]
    for r in section.policies:
        met = f"{r['p_finished']:.1%}" if not deadline else "-" if r["p_deadline"] is None else f"{r['p_deadline']:.1%}"
        mark = "*" if r["label"] == section.chosen else " "
        out = left_out_mark(r["label"], left_out, section.left_out_finish_caps)
        lines.append(f"{mark} {r['label']:<30} {r['mean_usd']:>10,.2f} {r['p50_usd']:>10,.2f} {r['p95_usd']:>10,.2f} "
                     f"{met:>11} {r['mean_lost_h']:>7.2f}{out}")
    margin = held_out_margin_lines(section.policies, odds)
    lines += mean_over_p95_note(section.policies) + margin
    return "\n".join(lines + settings_lines(section, margin_above=bool(margin)))


def held_out_margin_lines(rows: list[dict], odds: str, where: str = "at this cap") -> list[str]:
    """Where the cap ends some of a row's runs (`p_over_budget`) and the row's odds are above 0: how far such odds
    read high on recordings each left out of the availability model's fit (`HELD_OUT_OVER_AT_CAP_POINTS`; issue #26:
    no model measured was within the 1 point asked there, so the margin is said, not hidden)."""
    ended = ended_at_cap_with_odds(rows)
    if not ended:
        return []
    return [f"  {where} the guard ends some runs of {', '.join(ended)} (OverBudget): {held_out_margin_text(odds)}"]


def held_out_margin_text(odds: str) -> str:
    """What odds at a cap that ends runs are worth (`HELD_OUT_OVER_AT_CAP_POINTS`), in the words every output that
    quotes such odds says it with (the policy table, the cap to set's line, a refusal's odds at the caps it names),
    with its condition: the leave-one-recording-out error on the public recordings under the fitted availability
    model, which says nothing of capacity harsher than theirs (a new user read it as the error on any capacity)."""
    mean, largest = HELD_OUT_OVER_AT_CAP_POINTS
    return (f"on the {HELD_OUT_RECORDINGS} public recordings each left out of the availability model's fit in turn, "
            f"the {odds} of policies at caps that end runs read {mean:.1f} points high on average and up to "
            f"{largest:.1f} (docs/spot-policy.md, \"Leave one recording out\"): expect that much less on capacity "
            "like the recordings'; capacity harsher than theirs is not covered by this margin")


def held_out_margin_brief(odds: str) -> str:
    """`held_out_margin_text` in a refusal's one-line message: the same figures, fewer words (the refusal's JSON
    carries the whole line in `held_out_margin` and `cap_to_set_held_out_margin`)."""
    mean, largest = HELD_OUT_OVER_AT_CAP_POINTS
    return (f"such {odds} read {mean:.1f} points high on average, up to {largest:.1f}, on the "
            f"{HELD_OUT_RECORDINGS} public recordings each left out of the fit, not on harsher capacity "
            "(docs/spot-policy.md, \"Leave one recording out\")")


def odds_name(rows: list[dict]) -> str:
    """The odds a table of rows quotes: P(deadline) with a deadline, else P(finished) (`policy_text`'s column)."""
    return "P(deadline)" if any(r.get("p_deadline") is not None for r in rows) else "P(finished)"


def larger_cap_bills_less(section: SpotPolicy | None) -> dict | None:
    """Where the run's cap is larger than the cap to set and the policy chosen at it bills less on average than the
    one proven at the cap to set (`cap_to_set_row`): both caps and both means (the estimate's and simulate's
    `larger_cap_bills_less`; null otherwise). A larger cap changes the policy's choices (a shorter chain: fewer
    restarts), so the least cap that holds the odds need not be the cheapest to expect: llama3-8b-full at $200 named
    $164.09, mean $140.39 there, against $137.05 at $200 (issue #26). From the simulations at hand: none is added."""
    proof = section.cap_to_set_row if section is not None else None
    at = (section.sim_plan or {}).get("cap_usd") if proof is not None else None
    to_set = section.cap_to_set_usd if proof is not None else None
    if at is None or to_set is None or round(at, 2) <= round(to_set, 2):
        return None
    here = next(r for r in section.policies if r["label"] == section.chosen)
    if round(here["mean_usd"], 2) >= round(proof["mean_usd"], 2):
        return None
    deadline = section.confidence is not None
    line = (f"a larger cap bills less on average: at this run's cap, ${at:,.2f}, the simulated mean bill is "
            f"${here['mean_usd']:,.2f} ({_shares_text(here, deadline)}), against ${proof['mean_usd']:,.2f} at the cap "
            f"to set, ${to_set:,.2f} ({_shares_text(proof, deadline)}): the cap changes the policy's choices (a "
            "shorter chain, fewer restarts); the cap to set is the least that holds the odds, not the cheapest to "
            "expect")
    return {"cap_usd": round(at, 2), "mean_usd": here["mean_usd"], "policy": here["label"], "cap_to_set_usd": to_set,
            "cap_to_set_mean_usd": proof["mean_usd"], "cap_to_set_policy": proof["label"], "line": line}


def cap_to_set_held_out_margin(section: SpotPolicy | None) -> dict | None:
    """The held-out margin of the odds the cap to set's line quotes (`cap_to_set_row`, simulated at the cap to set),
    where that cap ends some of its runs and they are above 0 (the estimate's and a refusal's
    `cap_to_set_held_out_margin`; null otherwise, or where the policy table's own margin line names the same row at
    the same odds: the run is at its cap to set). A new user read a binding cap to set's odds without it."""
    proof = section.cap_to_set_row if section is not None else None
    if proof is None or not ended_at_cap_with_odds([proof]):
        return None
    at = (section.sim_plan or {}).get("cap_usd")
    if at is not None and round(at, 2) == round(section.cap_to_set_usd or -1.0, 2) and \
            proof["label"] in ended_at_cap_with_odds(section.policies):
        return None  # the table's line says it of the same simulation
    odds = odds_name([proof])
    mean, largest = HELD_OUT_OVER_AT_CAP_POINTS
    return {"policies": [proof["label"]], "odds": odds, "cap_usd": section.cap_to_set_usd, "mean_points": mean,
            "largest_points": largest,
            "line": f"at the cap to set (${section.cap_to_set_usd:,.2f}) the guard ends some runs of "
                    f"{proof['label']} (OverBudget): {held_out_margin_text(odds)}"}


def ended_at_cap_with_odds(rows: list[dict]) -> list[str]:
    """The labels of the rows `held_out_margin_lines` names: the cap ends some of their runs, their odds are above 0."""
    return [r["label"] for r in rows
            if r.get("p_over_budget", 0.0) > 0 and (r["p_deadline"] if r.get("p_deadline") is not None
                                                    else r["p_finished"]) > 0]


def held_out_margin(rows: list[dict], odds: str | None = None, where: str = "at this cap") -> dict | None:
    """`held_out_margin_lines` for the JSON (the estimate's and simulate's `held_out_margin`; null where the cap ends
    no run with odds to lose): the rows it names, the margin in points and its line (a new user's `--format json`
    carried a binding cap's odds without it). `odds`: the column's name; by default as `policy_text` names it."""
    ended = ended_at_cap_with_odds(rows)
    if not ended:
        return None
    odds = odds or odds_name(rows)
    mean, largest = HELD_OUT_OVER_AT_CAP_POINTS
    return {"policies": ended, "odds": odds, "mean_points": mean, "largest_points": largest,
            "line": held_out_margin_lines(rows, odds, where)[0].strip()}


# what the cap to set promises: the choice and odds at it, proven by estimating there; a larger cap is another estimate
# (its shorter chain can let a cheaper policy meet the odds: qwen2 with on-demand fallback chose on_demand at
# $0.83-0.86 and maxwait_fallback at $0.90), so no "or more"
AT_THIS_CAP = "at this cap; a larger one can change the choice"


def _least_text(section: SpotPolicy) -> str:
    if section.cap_to_set_unsettled:  # this layout's cap to set, at which the estimate takes another (`_on_layout`)
        return f"the cap to set searched on {section.cap_to_set_unsettled[0]['layout']},"
    return ("the least cap, to the cent," if section.cap_to_set_least else
            f"the least cap found in {FULL_SEARCH_SIMULATIONS} simulations of every policy (a smaller one may hold)")


def _proven_text(section: SpotPolicy) -> str:
    """What the simulation at the cap to set showed of the chosen policy (`cap_to_set_row`)."""
    row = section.cap_to_set_row
    met = ("" if section.confidence is None or row["p_deadline"] is None else
           f"it meets the {deadline_hours_text(section.sim_plan['deadline_s'])} h deadline on {row['p_deadline']:.1%} "
           "of the traces, ")
    held = holds_text(section)
    return (f"{met}its runs finish on {row['p_finished']:.1%} (mean bill there ${row['mean_usd']:,.2f}, P95 "
            f"${row['p95_usd']:,.2f}{'; ' + held if held else ''})")


def holds_text(section: SpotPolicy) -> str:
    """Which odds the cap to set holds (`cap_to_set_holds`), in words: a missed deadline's cap holds the finish share
    alone (a new user's 3 h deadline on a ~10 h run was named a cap at which 59.4% of the runs finished)."""
    held = section.cap_to_set_holds or []
    if "P(deadline)" in held:
        return "the cap holds both odds, P(deadline) and the finish share"
    if not held:
        return ""
    if section.confidence is not None:
        return "the cap holds the finish share; the run as one job meets the deadline on no trace"
    return "the cap holds the finish share"


def settings_lines(section: SpotPolicy, *, margin_above: bool = False) -> list[str]:
    """The policy section's lines on what the run is set up with: the sentinel (`sentinel_text`) and the cap to set
    (`p95_finish_cap_usd`, `deadline_cap_usd`, named by the estimate step). `spotrun estimate` prints them under its
    table, `spotrun simulate` under its own: the same run says the same. `margin_above`: the lines above said the
    held-out margin in full (the table's line), so the cap to set's odds are told it in short."""
    lines = [sentinel_text(section)]
    if section.deadline_cap_usd is not None and section.cap_to_set_row is not None:  # searched on simulations
        lines.append(f"  the cap to set: ${section.deadline_cap_usd:,.2f} ({AT_THIS_CAP}): {_least_text(section)} at "
                     f"which the estimate simulated at it chooses {section.cap_to_set_row['label']}"
                     f"{_on_layout(section)} and "
                     f"{_proven_text(section)} (the deadline warning's cap)")
    elif section.deadline_cap_usd is not None:  # the deadline warning's cap, at least the finish cap
        lines.append(f"  the cap to set: ${section.deadline_cap_usd:,.2f} ({AT_THIS_CAP}): the estimate then chooses a "
                     "policy that meets the deadline (the deadline warning's cap), and a run billed "
                     f"{section.p95_finish_policy}'s P95 finishes (its P95 finish cap: "
                     f"${section.p95_finish_cap_usd:,.2f})")
    elif section.p95_finish_keeps_deadline:  # raised to one job: a chain's restarts lower the deadline's odds
        said = (f"simulated at it, the estimate chooses {section.cap_to_set_row['label']} and "
                f"{_proven_text(section)}" if section.cap_to_set_row is not None else
                f"finishes at {section.p95_finish_policy}'s P95 bill (${section.p95_one_job_usd:,.2f})")
        lines.append(f"  the cap to set: ${section.p95_finish_cap_usd:,.2f} ({AT_THIS_CAP}): the run is one job, so it "
                     f"keeps the deadline's odds of the run as one job; {said}; under it the run is a chain whose "
                     "restarts lower those odds")
    elif section.cap_to_set_row is not None and section.confidence is not None:  # searched on simulations
        lines.append(f"  the cap to set: ${section.p95_finish_cap_usd:,.2f} ({AT_THIS_CAP}): {_least_text(section)} at "
                     f"which the estimate simulated at it chooses {section.cap_to_set_row['label']}"
                     f"{_on_layout(section)} and "
                     f"{_proven_text(section)}")
    elif section.p95_finish_cap_usd is not None:  # the cap under which a run billed its P95 can strand
        lines.append(f"  the cap to set: ${section.p95_finish_cap_usd:,.2f} ({AT_THIS_CAP}) finishes at "
                     f"{section.p95_finish_policy}'s P95 bill (${section.p95_one_job_usd:,.2f} as one job"
                     f"{_p95_market_text(section)}")
        if section.cap_to_set_row is not None:
            lines[-1] += (f"; simulated at it, the estimate chooses {section.cap_to_set_row['label']} and "
                          f"{_proven_text(section)}")
    if margin := cap_to_set_held_out_margin(section):  # the odds proven at a cap to set that ends runs
        lines[-1] += "; " + (margin["line"] if not margin_above else margin["line"].split(": ")[0] +
                             f": its {margin['odds']} reads high by the margin above")
    if section.one_job_cap_usd is not None:  # the cap to set splits the run: what one job costs beside it
        to_set = section.deadline_cap_usd or section.p95_finish_cap_usd
        lines[-1] += "; " + one_job_text(section.one_job_cap_usd, section.one_job_expected_usd,
                                         section.cap_to_set_jobs, section.cap_to_set_expected_usd, to_set)
    if cheaper := larger_cap_bills_less(section):  # the run's own, larger cap bills less on average
        lines.append(f"  {cheaper['line']}")
    return lines
