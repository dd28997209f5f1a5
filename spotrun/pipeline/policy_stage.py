"""The estimate step's spot-policy stage (spotrun/pipeline/plan.py `plan`, stage 5; `spotrun estimate` shares it):
the planner's estimate with the spot policy the run starts with and the caps it names (spotrun/policy/choose.py
`spot_policy_at_caps`: the policy at the cap set, the cap that finishes at the P95 bill of the run as one job,
spotrun/planner/segments.py `finish_cap_usd`, and the deadline warning's cap)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from ..contract.refusal import Refusal
from ..contract.spec import DAYS_28_H, deadline_hours_text
from ..planner.catalog import usd
from ..planner.estimate import DEADLINE_MISSED, DEADLINE_MISSED_ACCEPTED, Estimate, EstimateRefused, LayoutCost
from ..planner.options import SPOT_ADVICE
from ..planner.outputs import speed_margin_note
from ..policy import choose
from ..policy.decision import starts_on_spot
from ..policy.engine import INF
from ..policy.execution import execute
from ..seams import PlanStatus


def layout_ranker(catalog: dict, *, poll_s: float = 60.0, max_poll_s: float = 4 * 3600.0,
                  n: int = choose.N_TRACES) -> choose.LayoutRanker:
    """The planner's `layout_cost` for this stage (spotrun/policy/choose.py `LayoutRanker`: a layout by the bill of
    the spot policy this stage would choose on it, on its traces and polls); pass it to `with_spot_policy` as
    `ranker`, whose simulations the stage then reuses."""
    return choose.LayoutRanker(catalog, poll_s=poll_s, max_poll_s=max_poll_s, n=n)


def with_spot_policy(run: Any, est: Estimate, catalog: dict, *, poll_s: float = 60.0,
                     max_poll_s: float = 4 * 3600.0, n: int = choose.N_TRACES,
                     ranker: choose.LayoutRanker | None = None,
                     stage_limits: dict[str, float] | None = None,
                     replan: Callable[[float, LayoutCost], Estimate] | None = None) -> Estimate:
    """The estimate with its spot policy and the caps it names (spotrun/policy/choose.py `spot_policy_at_caps` on
    `n` traces: one call into the policy) and the policy's warnings after its own: a new Estimate, `est`
    unchanged. `spotrun estimate` shares this stage. `ranker`: the `layout_ranker` the planner chose the layout
    with (its simulations reused). `stage_limits`: stage -> its max_usd_per_run, where known (the stage's
    settings; the CLI's stacks/config.py): a cap to set over one is said (`cap_to_set_over_limit`).
    `replan(cap, layout_cost)`: the planner's estimate of the run at another budget.max_usd on the same sources,
    its layouts ranked by `layout_cost`; where the planner ranked the layouts by their spot policy (`ranker` asked),
    the cap to set is the one at which they rank the same (spotrun/policy/choose.py `_settled_layout`)."""
    return _with_spot_policy(run, est, catalog, poll_s=poll_s, max_poll_s=max_poll_s, n=n, ranker=ranker,
                             stage_limits=stage_limits, replan=replan)[0]


def _with_spot_policy(run: Any, est: Estimate, catalog: dict, *, poll_s: float, max_poll_s: float, n: int,
                      ranker: choose.LayoutRanker | None, stage_limits: dict[str, float] | None,
                      replan: Callable[[float, LayoutCost], Estimate] | None,
                      refuse_missed: bool = True) -> tuple[Estimate, Estimate, bool]:
    """`with_spot_policy`, the estimate on the layout the cap to set is named on (`est` where it is est's, or
    where the estimate ranked at the cap to set is not at hand; with the estimate's policy section), and whether
    the deadline's odds refuse the run. A deadline no policy meets on choose.CONFIDENCE at any cap is refused
    (`deadline_odds_refusal`) unless compute.accept_missed_deadline, or `refuse_missed` is false (an OverBudget
    refusal's estimate at its smallest cap: that refusal says the odds there, and that the estimate at its cap to
    set refuses the deadline: no larger cap meets it)."""
    poll = {"poll_s": poll_s, "max_poll_s": max_poll_s, "n": n}
    ranked = replan is not None and ranker is not None and ranker.asked > 0 and _auto_layout(run)
    planned: dict[float, Estimate | None] = {}  # cap -> the estimate there (the cap to set's layout's, below)

    def ranked_at(cap: float) -> Estimate | None:
        if cap not in planned:
            planned[cap] = _ranked_at(replan, cap, catalog, poll)
        return planned[cap]

    chosen = choose.spot_policy_at_caps(run, est, catalog, **poll,
                                        simulations=ranker.store if ranker is not None else None,
                                        replan=ranked_at if ranked else None,
                                        refused=refuse_missed and not run.compute.accept_missed_deadline)
    section = chosen.section
    odds_refused = bool(chosen.missed) and section is not None and section.deadline_cap_usd is None and \
        not run.compute.accept_missed_deadline  # (a deadline a larger cap meets: the warning names that cap)
    if refuse_missed and odds_refused:
        raise deadline_odds_refusal(run, est, catalog, chosen, poll)
    there = est  # the estimate on the layout the cap to set is named on: where it moved, the one ranked at it
    if ranked and section is not None and section.cap_to_set_layout and section.cap_to_set_usd:
        there = ranked_at(section.cap_to_set_usd)
    warnings = [*est.warnings, *chosen.warnings, *_starts_on_demand(run, chosen.section),
                *tail_over_on_demand(run, est, chosen.section),
                *cap_to_set_over_on_demand(run, est, chosen.section, there=there),
                *cap_to_set_over_limit(chosen.section, stage_limits or {})]
    out = dataclasses.replace(est, spot_policy=chosen.section, warnings=_missed_once(warnings, chosen),
                              advice=_market_advice(run, est, chosen.section))
    return out, (out if there is est or there is None else there), odds_refused


def _auto_layout(run: Any) -> bool:
    """Whether the planner chooses the run's layout (compute.instance_type or instance_count auto)."""
    return run.compute.instance_type == "auto" or run.compute.instance_count is None


def _ranked_at(replan: Callable[[float, LayoutCost], Estimate], cap: float, catalog: dict,
               poll: dict) -> Estimate | None:
    """The estimate at `cap` with its layouts ranked as a fresh estimate ranks them (a new ranker: its own budget of
    windows; the simulations made already reused through the enclosing store), or None where it refuses."""
    try:
        return replan(cap, layout_ranker(catalog, **poll))
    except Refusal:
        return None


def _market_advice(run: Any, est: Estimate, section) -> list[str]:
    """The estimate's advice with its market line (spotrun/planner/options.py `price_advice`: 'managed spot on ...')
    naming on-demand where the chosen spot policy starts the run on on-demand instances (a new user read 'advice:
    managed spot on 1 x ml.g6e.48xlarge' above a chosen on_demand policy billing 2.8x the spot figure)."""
    if not run.compute.spot or section is None or starts_on_spot(section):
        return est.advice
    spot_line = next((a for a in est.advice if a.startswith(SPOT_ADVICE)), None)
    if spot_line is None:
        return est.advice
    layout = spot_line.removeprefix(SPOT_ADVICE).split(", ")[0]
    later = ("every job on on-demand: no spot capacity is used" if section.policy == "on_demand" else
             "on-demand first, spot only where the policy moves to it")
    line = (f"on-demand on {layout} from the start: the chosen spot policy, {section.chosen}, runs {later} "
            "(see the spot policy below)")
    return [line if a is spot_line else a for a in est.advice]


def cap_to_set_over_limit(section, limits: dict[str, float]) -> list[str]:
    """A warning when the cap to set (the spot policy's last line) is over a stage's max_usd_per_run: the stage
    refuses a budget.max_usd over it, so that cap cannot be set there (a long run with a deadline was told a cap to
    set that the stage's limit never met, without a word)."""
    to_set = section and (section.deadline_cap_usd or section.p95_finish_cap_usd)
    over = {stage: limit for stage, limit in limits.items() if limit and to_set and to_set > limit}
    if not over:
        return []
    named = ", ".join(f"stage {stage}'s ${limit:,.2f}" for stage, limit in over.items())
    return [f"the cap to set, ${to_set:,.2f}, is over max_usd_per_run ({named}, stacks/config.py): the stage refuses "
            "a budget.max_usd over it, so the run there gets the odds of a cap within it (the spot policy's table "
            "at the cap set); raise the stage's limit or plan a shorter run"]


def _missed_once(warnings: list[str], chosen: choose.CappedChoice) -> list[str]:
    """A run accepted to miss its deadline (compute.accept_missed_deadline) is told so in one loud line with the
    numbers: the planner's (the run's hours on on-demand from the start against the deadline's) and the policy's
    (the chosen policy's P(deadline) on the estimate's traces); the policy's own 'no policy meets it' warning,
    which said the same a second time, is left out."""
    loud = next((w for w in warnings if w.startswith(DEADLINE_MISSED)), None)
    section = chosen.section
    if loud is None or section is None:
        return warnings
    row = next(r for r in section.policies if r["label"] == section.chosen)
    odds = "" if row["p_deadline"] is None else (
        f"; the chosen policy, {section.chosen}, meets it on {row['p_deadline']:.1%} of the estimate's "
        f"{section.traces:,} traces")
    said = loud.removesuffix(DEADLINE_MISSED_ACCEPTED) + odds + DEADLINE_MISSED_ACCEPTED
    return [said if w is loud else w for w in warnings if not (chosen.missed and w == chosen.missed)]


def _starts_on_demand(run: Any, section) -> list[str]:
    """A warning when a spot run's chosen policy starts it on on-demand instances: the advice names managed spot
    and the cost line's spot figure, while the run's first job is on-demand (a new user's trial: 'advice: managed
    spot', the chosen row on_demand at 2.8x the spot figure)."""
    if not run.compute.spot or section is None or starts_on_spot(section):
        return []
    row = next(r for r in section.policies if r["label"] == section.chosen)
    return [f"the chosen spot policy, {section.chosen}, starts the run on on-demand instances ({section.why}): "
            f"simulated mean {usd(row['mean_usd'])}, P95 {usd(row['p95_usd'])}, not the cost line's spot figure"]


def tail_over_on_demand(run: Any, est: Estimate, section) -> list[str]:
    """A warning when the chosen spot policy's simulated P95 bill is above the run's on-demand bill (the cost row's
    on-demand figure): at the tail, spot costs more than on-demand from the start would (a new user's 70B run: mean
    $2,510.54, P95 $3,998.37 against on-demand's $3,945.89, without a word)."""
    if not run.compute.spot or section is None:
        return []
    row = next(r for r in section.policies if r["label"] == section.chosen)
    on_demand = est.cost_usd["on_demand"]
    if round(row["p95_usd"], 2) <= round(on_demand, 2):
        return []
    return [f"the chosen spot policy's P95 bill, {usd(row['p95_usd'])}, is above on-demand's {usd(on_demand)}: on "
            f"the costliest 5% of the simulated runs ({section.chosen}: long waits for spot capacity, interruptions "
            "redone, then on-demand) spot bills more than on-demand from the start would; spot is cheaper on "
            f"average (mean {usd(row['mean_usd'])}), on-demand (compute.spot=false) at the tail"]


def over_budget_with_caps(run: Any, refused: Refusal, replan: Callable[[float, LayoutCost | None], Estimate],
                          catalog: dict, *, poll_s: float = 60.0, max_poll_s: float = 4 * 3600.0,
                          n: int = choose.N_TRACES, stage_limits: dict[str, float] | None = None) -> Refusal:
    """An OverBudget refusal whose named caps hold what it says (issue #26): at the smallest cap whose chain
    finishes (the planner's `min_cap_usd`) the estimate is made again as the accepted path makes it (`replan(that
    cap, layout_ranker)`, then `with_spot_policy` with that ranker and `replan`: an auto layout's cap to set is
    ranked across layouts the same way, `cap_to_set_layout`), and the refusal says what the estimate's own
    simulation finds there, the uninterrupted run finishing (else it says so), the share of the simulated runs
    that finish, and the cap to set with the policy and odds proven at it (`cap_to_set_row`, on the layout the
    estimate takes there) and the accepted path's warnings on it (`cap_to_set_over_on_demand`,
    `cap_to_set_over_limit`); the refusal's estimate carries that spot policy section. It named only the smallest
    cap, 'whose chain finishes', at which 58.4% of llama3-8b-full's simulated runs finished and, before the
    simulator's fix, none of qwen2's; then a cap to set searched on the refused layout alone with the policy chosen
    at the smallest cap (8B, auto, 12 h: $386.67 'maxwait_fallback (notice)', where the estimate at $386.67 took
    1 x ml.p5.48xlarge and named $327.53). Any other refusal, or one naming no larger cap, is returned as it is."""
    est = refused.estimate
    seg = est.segments if est is not None else None
    smallest = seg.min_cap_usd if seg is not None else None
    if refused.status != PlanStatus.OVER_BUDGET.value or not smallest or not math.isfinite(smallest) or \
            smallest <= run.max_usd:
        return refused
    at_run = dataclasses.replace(run, max_usd=smallest)
    poll = {"poll_s": poll_s, "max_poll_s": max_poll_s, "n": n}
    ranker = layout_ranker(catalog, **poll)  # a fresh one, as the accepted estimate at that cap ranks with
    try:
        at, there, odds_refused = _with_spot_policy(at_run, replan(smallest, ranker), catalog, **poll,
                                                    ranker=ranker, replan=replan, stage_limits=stage_limits,
                                                    refuse_missed=False)
    except Refusal:  # the planner refuses its own smallest cap: the refusal stands on its words
        return refused
    section = at.spot_policy
    if section is None:
        return refused
    row = next(r for r in section.policies if r["label"] == section.chosen)
    plan = choose.run_plan(at_run, at, catalog, poll_s=poll_s, max_poll_s=max_poll_s)
    alone = execute(plan, [(0.0, INF)], section.policy, section.checkpointing).tally.finished
    moved = choose.layout_words(at) != choose.layout_words(est)  # the planner takes another layout at that cap
    there = f" on {choose.layout_words(at)}" if moved else ""
    # what does not finish uninterrupted is the chosen policy's run: said of it, with the policy that finishes most
    # there (a new user was told 'the run does not finish even uninterrupted' of a policy finishing on 0.0%
    # where maxwait_fallback finished on 52.1%)
    likeliest = max(section.policies, key=lambda r: r["p_finished"])
    other = (f" ({likeliest['label']}'s runs finish there on {likeliest['p_finished']:.1%}, late or not)"
             if likeliest["label"] != section.chosen and likeliest["p_finished"] > 0 else "")
    said = (f" (the planner's chain): simulated there{there}, the run finishes uninterrupted and "
            f"{_odds(row, section)}" if alone else f" by the planner's chain, but simulated there{there} the chosen "
            f"{section.chosen}'s run does not finish even uninterrupted{other}: do not set it")
    to_set = section.cap_to_set_usd
    proof = section.cap_to_set_row
    told: list[str] = []  # the warnings the text says of the cap to set
    if to_set and proof and to_set > smallest:
        layout = section.cap_to_set_layout or (choose.layout_words(at) if moved else None)
        on = f" on {layout}" if layout else ""
        said += (f"; the cap to set is ${to_set:,.2f}: simulated at it, the estimate chooses {proof['label']}{on} "
                 f"and {_odds(proof, section)}")
        if held := choose.holds_text(section):  # which odds it holds (`cap_to_set_holds`)
            said += f" ({held})"
        if odds_refused:  # no cap meets the deadline's odds: the estimate at the cap to set refuses the deadline
            said += f"; {deadline_refused_text(run, proof)}"
        # what the accepted estimate says of that cap (over the run's on-demand bill, on the layout the cap to set
        # is named on, as `with_spot_policy` said it; over a stage's limit): in the text and the estimate's warnings
        told = [*(w for w in at.warnings if OVER_ON_DEMAND in w), *cap_to_set_over_limit(section, stage_limits or {})]
        said += "".join(f"; {w}" for w in told)
        if moved and section.cap_to_set_layout is None:
            section = dataclasses.replace(section, cap_to_set_layout=layout)
    elif alone:
        said += f"; it is the cap to set ({section.chosen})"
    # what the accepted estimate says of the odds and the cap to set it names (issue #26): the held-out margin of
    # odds quoted at a cap that ends runs (`held_out_margin_text`) and, where the cap to set bills on-demand, the
    # speed margin (`speed_margin_note` on the estimate on the cap to set's layout)
    quoted = [row] if alone else [likeliest] * bool(other)
    ends = [smallest] * bool(choose.ended_at_cap_with_odds(quoted))
    to_set_margin = choose.cap_to_set_held_out_margin(section) if to_set and proof and to_set > smallest else None
    ends += [to_set] * bool(to_set_margin)
    if ends:
        caps = " and at ".join(f"${cap:,.2f}" for cap in ends)
        said += (f"; at {caps} the guard ends some of these simulated runs (OverBudget): "
                 f"{choose.held_out_margin_brief(choose.odds_name(section.policies))}")
    speed = speed_margin_note(at, there=there)
    if speed is not None:
        said += f"; {speed['line']}"
    if section.cap_to_set_layout == choose.layout_words(est):  # null where it is the refusal's estimate's own
        section = dataclasses.replace(section, cap_to_set_layout=None)
    message = refused.message + said + f" (the refusal's JSON: the estimate at ${smallest:,.2f})"
    warnings = [*est.warnings, *(w for w in told if w not in est.warnings)]
    notes = {"held_out_margin": choose.held_out_margin(section.policies, where=f"at ${smallest:,.2f}"),
             "cap_to_set_refused_field": "compute.deadline_hours" if odds_refused and to_set and proof and
             to_set > smallest else None,
             "cap_to_set_held_out_margin": to_set_margin, "cap_to_set_speed_margin": speed}
    return EstimateRefused(refused.status, message, dataclasses.replace(est, spot_policy=section, warnings=warnings),
                           field=refused.field, notes=notes)


def deadline_refused_text(run: Any, proof: dict) -> str:
    """What the estimate at an OverBudget refusal's cap to set does where no policy meets the run's deadline on
    choose.CONFIDENCE at any cap: it refuses compute.deadline_hours (`deadline_odds_refusal`), as the accepted
    path would (a refusal named a cap to set at which the estimate then refused the deadline, unsaid)."""
    return (f"but no policy meets compute.deadline_hours={deadline_hours_text(run.compute.deadline_s)} on "
            f"{choose.CONFIDENCE:.0%} at any cap ({proof['label']} on {proof['p_deadline']:.1%} there), so the "
            "estimate at it refuses compute.deadline_hours unless compute.accept_missed_deadline=true (its refusal "
            "names the fixes simulated)")


def _odds(row: dict, section) -> str:
    """A policy row's odds as the estimate states them: the share of its simulated runs that finish, and with a
    deadline the share that meets it."""
    odds = f"{row['p_finished']:.1%} of its {section.traces:,} simulated runs finish"
    if row.get("p_deadline") is not None:
        odds += f", {row['p_deadline']:.1%} by the deadline"
    return odds


OVER_ON_DEMAND = "is over the run's on-demand bill"  # `cap_to_set_over_on_demand`'s words


def cap_to_set_over_on_demand(run: Any, est: Estimate, section, *, there: Estimate | None = None) -> list[str]:
    """A warning when a spot run's cap to set (the spot policy's last line) is over the run's on-demand bill (the
    cost row's on-demand figure, one uninterrupted job): the cap is then held for the rare runs that wait and are
    interrupted most, and on-demand bounds the run for less (a new user's trial: llama3-8b-full with a 12 h deadline
    and no fallback named $344.52 to set, over on-demand's $322.52, for 96.7% -> 96.8% of the traces meeting the
    deadline; at $200 on 2 x g6e, $432.70 over that layout's $423.81) without a word. The figures are the cap to
    set's (issue #26): the on-demand bill of the layout it is named on (`there`, the estimate at the cap to set
    where `section.cap_to_set_layout` names another layout than `est`'s; none said where that estimate is not at
    hand) and the mean bill of the policy proven at it (`cap_to_set_row`, as the last line names it). A refusal
    said the smallest cap's: mistral auto 8 h at $10 named $32.57 on 3 x ml.g6e.xlarge, and its warning quoted 2 x
    ml.g6e.xlarge's $31.93 and the mean at $15.34, $9.38 (at $32.57: $32.24 on 3 x, mean $15.01)."""
    to_set = section.cap_to_set_usd if section is not None else None
    if to_set and section.cap_to_set_layout:
        if there is None or choose.layout_words(there) != section.cap_to_set_layout:
            return []  # the cap to set's layout's bill is not at hand: not compared with another layout's
        est = there
    on_demand = est.cost_usd.get("on_demand")
    # what on-demand from the start needs: its chain's smallest cap, a stop and the job's end over its bill
    od_cap = choose.finish_caps(est).get("on_demand", on_demand) if est.segments else on_demand
    if not run.compute.spot or not to_set or not on_demand or round(to_set, 2) <= round(max(on_demand, od_cap), 2):
        return []
    fallback = "" if run.compute.on_demand_fallback else (
        "; or compute.on_demand_fallback=true, which lets a late or stranded run finish on on-demand (estimate "
        "again: its cap to set can be lower)")
    # the mean at the cap to set: the policy proven there (else the chosen one's here, where none was proven)
    row = section.cap_to_set_row or next(r for r in section.policies if r["label"] == section.chosen)
    mean = ", at a higher mean bill" if on_demand > row["mean_usd"] else ", at no higher mean bill"
    # the cap's figure is said once, on the policy's last line (and the deadline warning's): not again here
    return [f"the cap to set (the spot policy's last line) {OVER_ON_DEMAND}, {usd(on_demand)} (one "
            f"uninterrupted job on {est.instance_count} x {est.instance_type}): it is held for the few spot runs "
            f"that wait and are interrupted the most, while the chosen policy's simulated mean bill is "
            f"{usd(row['mean_usd'])}; a lower bound{mean}: compute.spot=false, billed {usd(on_demand)} "
            f"with no interruptions under a cap of ${od_cap:,.2f}{fallback}"]


DEADLINE_TENTHS_MAX = int(DAYS_28_H * 2 * 10)  # compute.deadline_hours' largest value, in tenths of an hour


def deadline_odds_refusal(run: Any, est: Estimate, catalog: dict, chosen: choose.CappedChoice,
                          poll: dict) -> EstimateRefused:
    """InvalidRun (compute.deadline_hours) for a run whose every spot policy meets its deadline on fewer than
    choose.CONFIDENCE of the estimate's simulated traces, before anything is paid: the project promises the odds it
    was told, and a new user's mistral (3 h, no fallback) was told "ok", exit 0, at 40.8%. It names the fixes,
    each simulated on this layout, not guessed: compute.on_demand_fallback=true (where the run has it false) with
    its odds, the least compute.deadline_hours (in tenths of an hour) at which a policy meets it on CONFIDENCE (or
    that none up to the contract's largest does), and compute.accept_missed_deadline=true. (A deadline a larger cap
    meets is not refused here: the deadline warning names that cap, `spot_policy_at_caps`.) `notes` carries the
    same for the JSON."""
    c, section = run.compute, chosen.section
    row = next(r for r in section.policies if r["label"] == section.chosen)
    target = choose.CONFIDENCE
    fixes: list[str] = []
    notes: dict[str, Any] = {"deadline_odds": {"p_deadline": row["p_deadline"], "policy": section.chosen,
                                               "traces": section.traces}}
    if not c.on_demand_fallback:
        fb = _odds_at(run, est, catalog, poll, on_demand_fallback=True)
        fixes.append(f"compute.on_demand_fallback=true: {fb[0]} meets it on {fb[1]:.1%}")
        notes["deadline_odds"]["with_on_demand_fallback"] = {"policy": fb[0], "p_deadline": fb[1]}
    least = _least_deadline_tenths(run, est, catalog, poll)
    if least is None:
        fixes.append(f"no compute.deadline_hours up to {DEADLINE_TENTHS_MAX / 10:g} is met on {target:.0%} by a "
                     "policy with these settings")
    else:
        fixes.append(f"compute.deadline_hours={least[0] / 10:g}: {least[1]} meets it on {least[2]:.1%}")
    notes["deadline_odds"]["least_deadline_hours"] = None if least is None else least[0] / 10
    fixes.append("compute.accept_missed_deadline=true to start it with these odds")
    message = (f"compute.deadline_hours={deadline_hours_text(c.deadline_s)} is met on only {row['p_deadline']:.1%} "
               f"of the estimate's {section.traces:,} simulated runs by the chosen {section.chosen} (no policy meets "
               f"it on {target:.0%}) on {choose.layout_words(est)}; simulated on this layout: " + "; ".join(fixes))
    return EstimateRefused("InvalidRun", message, dataclasses.replace(est, spot_policy=section),
                           field="compute.deadline_hours", notes=notes)


def _with_compute(run: Any, **changes: Any) -> Any:
    return dataclasses.replace(run, compute=dataclasses.replace(run.compute, **changes))


def _odds_at(run: Any, est: Estimate, catalog: dict, poll: dict, **changes: Any) -> tuple[str, float]:
    """(the chosen policy, its P(deadline)) of the estimate's simulation of `run` with compute `changes`."""
    got = choose.spot_policy(_with_compute(run, **changes), est, catalog, **poll).section
    row = next(r for r in got.policies if r["label"] == got.chosen)
    best = max(got.policies, key=lambda r: r["p_deadline"] or 0.0)
    row = row if (row["p_deadline"] or 0.0) >= (best["p_deadline"] or 0.0) else best
    return row["label"], row["p_deadline"] or 0.0


def _least_deadline_tenths(run: Any, est: Estimate, catalog: dict, poll: dict) -> tuple[int, str, float] | None:
    """(the least compute.deadline_hours in tenths at which a policy meets it on CONFIDENCE, that policy, its
    odds) on the estimate's simulation of the run on its layout, searched by doubling and then halving (each
    step a simulation; the odds do not fall as the deadline grows); None when none up to the contract's largest
    deadline does (e.g. spot alone, whose runs that wait out MaxWait never finish)."""
    def meets(tenths: int) -> tuple[str, float] | None:
        label, odds = _odds_at(run, est, catalog, poll, deadline_s=tenths * 360.0)
        return (label, odds) if odds >= choose.CONFIDENCE else None

    lo = math.floor(run.compute.deadline_s / 360.0)  # missed there (or below the run's deadline)
    hi, found = max(lo + 1, 2 * lo), None
    while found is None:
        found = meets(hi)
        if found is None:
            if hi >= DEADLINE_TENTHS_MAX:
                return None
            lo, hi = hi, min(DEADLINE_TENTHS_MAX, 2 * hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        there = meets(mid)
        if there is None:
            lo = mid
        else:
            hi, found = mid, there
    return hi, found[0], found[1]
