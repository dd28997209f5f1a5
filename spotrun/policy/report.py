"""A simulation study: every policy and the offline optimum over one set of traces, as a table, JSON and a PNG.

`study` runs it (the CLI's `spotrun simulate` and benchmarks/simulate_bench.py); `table_text` is the table;
`plot` draws cost against the probability of meeting the deadline, one point per policy, with the exact
offline optimum (spotrun/policy/optimum.py) as the floor (matplotlib, headless).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import nullcontext
from pathlib import Path

from ..contract.spec import deadline_hours_text
from ..planner.outputs import LONGEST_MAX_RUNTIME_FIX, LONGEST_MAX_RUNTIME_WHY
from . import compare, quantile
from .choose import choose, left_out_by_cap, left_out_mark, mean_over_p95_note, short_of_finish
from .engine import SimPlan
from .optimum import solve


def study(plan: SimPlan, traces: list, candidates: list[tuple[str, str]], *, optimum: bool = True,
          source: str = "", choose_on: list | None = None, cap_usd: float | None = None,
          progress: Callable[[str, int, int], None] | None = None, finish: dict[str, float] | None = None,
          plan_of: Callable[[str], SimPlan] | None = None, workers: int = 1,
          executions: Callable[[SimPlan], dict | None] | None = None) -> dict:
    """Rows per policy, the chosen one and why, the offline optimum's mean/P50/P95 and the seconds it took.
    `choose_on`: other traces to choose on (the rows are then out of sample), else these. `progress(what, done,
    total)` is called as the policies and the optimum go through the traces. `finish`: the caps rows need to
    finish uninterrupted (spotrun/policy/choose.py `finish_caps`), left out under them as the estimate does.
    `plan_of(policy)`: the plan each policy is executed on (spotrun/policy/choose.py `policy_plans`: the
    estimate's), else `plan`. A plan with `cap_usd` executes every policy at the cap as the cost guard holds it;
    the optimum knows no cap (spotrun/policy/optimum.py), which its row then says (`optimum_summary`).
    `workers` > 1: the candidates and the optimum's traces go to that many processes (`worker_pool`; the same
    report, each trace's result being its own). `executions(plan)`: executions of `plan` on these traces made
    already (spotrun/policy/choose.py `estimate_executions`: the estimate's, which `spotrun simulate` reuses), reused
    in the command's process as `compare` reuses them."""
    with worker_pool(workers) as pool:
        t0 = time.perf_counter()
        executing = _executing(plan, traces, candidates, cap_usd, plan_of, pool, executions)
        solving = _solving(plan, traces, pool) if optimum else None  # queued behind the rows: no idle process
        rows = _rows(executing, candidates, progress)
        seconds = time.perf_counter() - t0
        chosen_on = rows
        if choose_on:
            chosen_on = _rows(_executing(plan, choose_on, candidates, cap_usd, plan_of, pool), candidates, None)
        report = _report(plan, traces, rows, chosen_on, source, choose_on, cap_usd, finish, seconds)
        if optimum:
            report["optimum"] = optimum_summary(plan, traces, progress, solving=solving)
    return report


def _report(plan: SimPlan, traces: list, rows: list, chosen_on: list, source: str, choose_on: list | None,
            cap_usd: float | None, finish: dict[str, float] | None, seconds: float) -> dict:
    """`study`'s report less the optimum."""
    best, why = choose(plan, chosen_on, cap_usd=cap_usd, finish=finish)
    if choose_on:
        why += f" ({len(choose_on)} other traces)"
    out = {"traces": len(traces), "source": source, "deadline_hours": None if plan.deadline_s is None else
           plan.deadline_s / 3600, "on_demand_usd_per_h": plan.on_demand_usd_per_h, "work_hours": plan.work_s / 3600,
           "policies": [r.row() for r in rows], "chosen": best.label, "why": why, "simulate_seconds": seconds,
           # the rows the cap leaves out (their P95 bill over it, or the cap under their finish cap), as the
           # estimate's policy section names them
           "cap_usd": cap_usd, "left_out": list(left_out_by_cap(rows, cap_usd, finish)),
           "left_out_finish_caps": short_of_finish(rows, cap_usd, finish),
           # the cap shaped some policy's run on some trace (Summary.capped): the rows are not the run without it
           "cap_binds": any(r.capped for r in rows),
           # whether a spot job left without capacity past its MaxWait is followed by an on-demand one
           "on_demand_fallback": plan.on_demand_fallback,
           "longest_max_runtime": None}
    out["longest_max_runtime"] = longest_max_runtime(plan, out["policies"])
    return out


def longest_max_runtime(plan: SimPlan, rows: list[dict]) -> dict | None:
    """The runs that ended at the longest MaxRuntime (the planner's limit for one job, `SimPlan.max_runtime_s`):
    with on-demand fallback, a row's unfinished runs the cap did not end (without it those are said as MaxWait's,
    `_at_cap_text`). {"max_runtime_s", "ended": label -> share, "why", "advice"} (spotrun/planner/outputs.py's
    words, as the estimate's cost line says them), or None where no run ended there."""
    if not plan.on_demand_fallback:
        return None
    ended = {r["label"]: round(rest, 6) for r in rows
             if (rest := 1.0 - r["p_finished"] - min(1.0 - r["p_finished"], r.get("p_over_budget", 0.0))) > 1e-9}
    if not ended:
        return None
    return {"max_runtime_s": plan.max_runtime_s, "ended": ended, "why": LONGEST_MAX_RUNTIME_WHY,
            "advice": LONGEST_MAX_RUNTIME_FIX}


def longest_max_runtime_line(report: dict) -> list[str]:
    """simulate's line under the table for `longest_max_runtime` (its JSON), with or without the optimum's line."""
    said = report.get("longest_max_runtime")
    if not said:
        return []
    shares = ", ".join(f"{label} {share:.1%}" for label, share in said["ended"].items())
    return [f"  ran to the longest MaxRuntime, {said['max_runtime_s'] / 3600:,.1f} h, unfinished ({shares}): "
            f"{said['why']}; {said['advice']}"]


def worker_pool(workers: int):
    """A pool of `workers` processes for `study` (a context manager), or none (`nullcontext`) for one: the
    command line's, never the Lambda's (no /dev/shm there for multiprocessing's locks)."""
    return ProcessPoolExecutor(workers) if workers > 1 else nullcontext()


def _executing(plan: SimPlan, traces: list, candidates: list[tuple[str, str]], cap_usd: float | None,
               plan_of: Callable[[str], SimPlan] | None, pool: Executor | None,
               executions: Callable[[SimPlan], dict | None] | None = None) -> Iterator[list]:
    """`compare` of every candidate on its own plan (`plan_of`, else `plan`), one list of rows each, in the
    candidates' order: lazily (with the `executions` of each plan made already), or each candidate queued at once
    in a process of the `pool`."""
    plans = [plan if plan_of is None else plan_of(candidate[0]) for candidate in candidates]
    if pool is None:
        made = {} if executions is None else {p: executions(p) for p in set(plans)}
        return (compare(p, traces, [c], cap_usd=cap_usd, executions=made.get(p))
                for p, c in zip(plans, candidates, strict=True))
    n = len(candidates)
    return pool.map(compare, plans, [traces] * n, [[c] for c in candidates], [None] * n, [cap_usd] * n)


def _rows(executing: Iterator[list], candidates: list, progress: Callable[[str, int, int], None] | None) -> list:
    """The rows `_executing` gives, `progress` called after each candidate."""
    rows = []
    for done, row in enumerate(executing, 1):
        rows += row
        if progress:
            progress("policies", done, len(candidates))
    return rows


OPTIMUM_CHUNK = 20  # traces a process of the pool solves at a time


def _solve_all(plan: SimPlan, traces: list) -> list:
    return [solve(plan, trace) for trace in traces]


def _solving(plan: SimPlan, traces: list, pool: Executor | None) -> Iterator[list]:
    """Each trace's `solve` in order, in lists: lazily one by one, or OPTIMUM_CHUNK at a time queued at once in
    the processes of the `pool`."""
    if pool is None:
        return ([solve(plan, trace)] for trace in traces)
    chunks = [traces[i:i + OPTIMUM_CHUNK] for i in range(0, len(traces), OPTIMUM_CHUNK)]
    return pool.map(_solve_all, [plan] * len(chunks), chunks)


def optimum_summary(plan: SimPlan, traces: list, progress: Callable[[str, int, int], None] | None = None, *,
                    solving: Iterator[list] | None = None) -> dict:
    """The exact optimum over the traces: mean/P50/P95 over those where the deadline can be met, how many can,
    and whether every one was exact (spotrun/policy/optimum.py). It knows no cap: with the plan's `cap_usd`,
    `over_cap` counts the traces whose optimal schedule bills more than the cap (a schedule the guard would end
    at it), None without a cap. `solving`: the traces' solutions under way (`_solving`), else solved here."""
    t0 = time.perf_counter()
    results = []
    for chunk in solving if solving is not None else _solving(plan, traces, None):
        results += chunk
        if progress:
            progress("exact optimum", len(results), len(traces))
    feasible = sorted(r.usd for r in results if r.usd is not None)
    return {"mean_usd": sum(feasible) / len(feasible) if feasible else float("nan"),
            "p50_usd": quantile(feasible, 0.5), "p95_usd": quantile(feasible, 0.95),
            "p_deadline": None if plan.deadline_s is None else len(feasible) / len(traces),
            "exact": all(r.exact for r in results), "seconds": time.perf_counter() - t0,
            "over_cap": None if plan.cap_usd is None else sum(1 for u in feasible if u > plan.cap_usd + 1e-9)}


def relative(report: dict, label: str) -> dict:
    """A row's mean cost against on-demand from the start and against the optimum. None against an on-demand row
    that does not always finish (a cap under its finish cap ends it there: its bill is the cap's, not the run's)."""
    rows = {r["label"]: r for r in report["policies"]}
    row, od = rows[label], rows.get("on_demand")
    out = {"of_on_demand": row["mean_usd"] / od["mean_usd"] if od and od["p_finished"] == 1.0 else None}
    if has_optimum(report):
        out["over_optimum"] = row["mean_usd"] / report["optimum"]["mean_usd"] - 1
    return out


def has_optimum(report: dict) -> bool:
    """An optimum with a cost: none where no schedule meets the deadline on any trace (an accepted missed
    deadline), whose mean is nan in the study and null in the JSON."""
    return "optimum" in report and math.isfinite(report["optimum"]["mean_usd"])


def below_the_optimum(report: dict) -> dict[str, float]:
    """The rows whose mean is below the optimum's because they miss the deadline the optimum meets: label -> the
    share of the traces on which they miss it. The optimum is the cheapest schedule that meets the deadline (on the
    traces where one can); a policy that misses it stays on spot longer and can cost less (to -18.7% seen), which
    the table must not read as beating the floor. Empty without a deadline or an optimum."""
    if not report.get("deadline_hours") or not has_optimum(report):
        return {}
    return {r["label"]: 1.0 - r["p_deadline"] for r in report["policies"]
            if r["p_deadline"] is not None and r["p_deadline"] < 1.0
            and relative(report, r["label"])["over_optimum"] < -5e-4}


def optimum_ignores_cap(report: dict) -> bool:
    """Whether the optimum's row is not the floor of the rows: the cap shaped some policy's run (`cap_binds`), or
    the optimum's own schedule bills over the cap on some trace (`over_cap`); the optimum knows no cap."""
    o = report.get("optimum") or {}
    return report.get("cap_usd") is not None and bool(report.get("cap_binds") or o.get("over_cap"))


def _optimum_traces(report: dict, o: dict) -> int:
    """The traces on which the optimum exists (meets the deadline; every trace without one)."""
    return report["traces"] if o.get("p_deadline") is None else round(o["p_deadline"] * report["traces"])


def _at_cap_text(report: dict) -> str:
    """What the cap does to the rows: it sets the jobs' MaxRuntime and the guard's polls, and, on the rows whose
    runs do not all finish, ends some at the cap (OverBudget), each row's share said; the other unfinished runs
    ended at MaxWait without capacity (no fallback) or at the longest MaxRuntime, which the cap does not (a new
    user read 'the guard ends' them above a P(deadline) column, while the JSON said maxwait_fallback (periodic)
    finished on 94.7%)."""
    ended = [r for r in report["policies"] if r["p_finished"] < 1.0]
    if not ended:
        return "which sets its jobs' MaxRuntime and the guard's polls (every run finished)"
    other = ("waited out MaxWait with no spot capacity (no on-demand fallback)" if
             report.get("on_demand_fallback") is False else "ran to the longest MaxRuntime")
    shares = []
    for r in ended:
        at_cap = min(1.0 - r["p_finished"], r.get("p_over_budget", 0.0))
        rest = 1.0 - r["p_finished"] - at_cap
        why = [f"{at_cap:.1%} ended at the cap"] if at_cap > 0 else []
        why += [f"{rest:.1%} {other}"] if rest > 1e-9 else []
        shares.append(f"{r['label']} finishes on {r['p_finished']:.1%} ({', '.join(why)})")
    return ("which sets its jobs' MaxRuntime and the guard's polls; runs that do not finish: " + "; ".join(shares))


def table_text(report: dict) -> str:
    n = report["traces"]
    head = (f"{n} trace{'s' * (n != 1)} ({report['source']}); {report['work_hours']:.1f} h of work; deadline "
            + (f"{deadline_hours_text(report['deadline_hours'] * 3600)} h" if report["deadline_hours"] else "none"))
    odds = "P(deadline)" if report["deadline_hours"] else "P(finished)"  # without a deadline: does it finish
    lines = [head, f"  {'policy':<28} {'mean $':>11} {'P50 $':>11} {'P95 $':>11} {odds:>11} "
             f"{'lost h':>7} {'wall h':>7} {'interr.':>7} {'vs OD':>6} {'vs opt':>7}"]
    left_out = set(report.get("left_out") or ())
    below = below_the_optimum(report)
    for r in report["policies"]:
        rel = relative(report, r["label"])
        met = f"{r['p_finished'] if r['p_deadline'] is None else r['p_deadline']:.1%}"
        opt = f"{rel['over_optimum']:+.1%}" if "over_optimum" in rel else "-"
        # a run without fallback, or its on-demand row ended at the cap
        of_od = "-" if rel["of_on_demand"] is None else f"{rel['of_on_demand']:.2f}"
        lines.append(f"{'*' if r['label'] == report['chosen'] else ' '} {r['label']:<28} {r['mean_usd']:>11,.2f} "
                     f"{r['p50_usd']:>11,.2f} {r['p95_usd']:>11,.2f} {met:>11} {r['mean_lost_h']:>7.2f} "
                     f"{r['mean_wall_h']:>7.1f} {r['mean_interruptions']:>7.2f} {of_od:>6} "
                     f"{opt:>7}" + left_out_mark(r["label"], left_out, report.get("left_out_finish_caps"))
                     + (f"  misses the deadline on {below[r['label']]:.1%}: below the optimum that meets it"
                        if r["label"] in below else ""))
    if "optimum" in report and not has_optimum(report):
        hours = deadline_hours_text(report["deadline_hours"] * 3600)
        lines.append(f"  no optimum: no schedule meets the {hours} h deadline on any of the traces, on-demand from the "
                     "start included")
    elif "optimum" in report:
        o = report["optimum"]
        met = "-" if o["p_deadline"] is None else f"{o['p_deadline']:.1%}"
        no_cap = optimum_ignores_cap(report)
        name = "exact optimum" if o.get("exact", True) else "optimum (a floor)"
        if report["deadline_hours"]:  # over the traces where it can meet the deadline, meeting it
            name = "optimum meeting the deadline" if o.get("exact", True) else "optimum, deadline (a floor)"
        if no_cap:  # the floor of the run without the cap, which the rows are not
            name = "optimum, cap ignored" if o.get("exact", True) else "optimum, cap ignored (floor)"
        lines.append(f"  {name:<28} {o['mean_usd']:>11,.2f} {o['p50_usd']:>11,.2f} "
                     f"{o['p95_usd']:>11,.2f} {met:>11}")
        if no_cap:
            over = o.get("over_cap") or 0
            meeting = ", meeting the deadline" if report["deadline_hours"] else ""
            billed = (f"; on {over:,} of the {_optimum_traces(report, o):,} traces where it exists it bills over "
                      "the cap" if over else "")
            at_cap = _at_cap_text(report)
            lines.append(f"  the optimum ignores the ${report['cap_usd']:,.2f} cap (it knows none): the cheapest "
                         f"schedule of the run without the cap{meeting}{billed}; the rows are the run at the cap, "
                         + at_cap)
        under = [r["label"] for r in report["policies"] if relative(report, r["label"])["over_optimum"] < -5e-4]
        if under and report["deadline_hours"]:  # read as a floor broken (a new user)
            lines.append(f"  below the optimum: {', '.join(under)}: the optimum is the cheapest schedule that meets "
                         "the deadline (on the traces where one can); a policy that misses it stays on spot longer "
                         + ("or is ended at the cap unfinished, " if no_cap else "") + "and can cost less")
    lines += mean_over_p95_note(report["policies"]) + longest_max_runtime_line(report)
    lines.append(f"chosen: {report['chosen']}: {report['why']}")
    return "\n".join(lines)



def probability_axis(xs: list[float]) -> tuple[float, float]:
    """The limits of a probability axis holding `xs`: it ends at 1.0 (no odds past certainty), starts a tenth of
    the points' spread (at least 0.01) below the lowest, never below 0."""
    lo = min(xs, default=0.0)
    return max(0.0, lo - max(0.01, (1.0 - lo) * 0.1)), 1.0


def plot(report: dict, path: Path, title: str) -> Path:
    """Mean cost against P(deadline met), one point per policy; the optimum's cost as the frontier. The
    probability axis ends at 100% (`probability_axis`); points on it are drawn whole (unclipped)."""
    import matplotlib  # matplotlib: requirements-dev.txt, not the CLI's; only `spotrun simulate` draws

    matplotlib.use("Agg")  # headless: no display on servers and CI
    import matplotlib.pyplot as plt
    from matplotlib.ticker import PercentFormatter

    fig, ax = plt.subplots(figsize=(10, 5), dpi=100)
    markers = "osv^<>pPhX"
    xs = []
    for i, r in enumerate(report["policies"]):
        x = r["p_deadline"] if r["p_deadline"] is not None else r["p_finished"]
        xs.append(x)
        chosen = r["label"] == report["chosen"]
        ax.scatter([x], [r["mean_usd"]], s=160 if chosen else 45, marker="*" if chosen else markers[i % 10],
                   zorder=3, clip_on=False, label=r["label"] + (" (chosen)" if chosen else ""))
    if has_optimum(report):
        o = report["optimum"]
        x = o["p_deadline"] if o["p_deadline"] is not None else o.get("p_finished", 1.0)
        ax.axhline(o["mean_usd"], color="black", linestyle="--", linewidth=1, label="exact offline optimum")
        xs.append(x)
        ax.scatter([x], [o["mean_usd"]], color="black", marker="D", zorder=3, clip_on=False,
                   label="offline optimum's odds")
    ax.set_xlim(*probability_axis(xs))
    ax.xaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_xlabel("P(deadline met)" if report["deadline_hours"] else "P(finished) (no deadline)")
    ax.set_ylabel("mean cost (USD)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
