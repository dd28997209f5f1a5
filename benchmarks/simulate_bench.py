"""The spot-policy simulator's acceptance figures; prints the Markdown tables of docs/spot-policy.md.

    python benchmarks/simulate_bench.py [--n 1000] [--spot-traces DIR]

1. Speed: the estimate's simulation (generate N traces, run every candidate policy) for each plan (goal < 2 s
   for 1,000 traces on this machine).
2. Plans: Llama 3.1 8B full, 70B full and 8B LoRA (1B tokens, 4,096 per sample, the planner's layouts), at each
   Spot Instance Advisor band (the middle of the band, per instance, times the nodes) and at the catalog's rate,
   on synthetic traces without droughts and on the estimate's fitted availability model, with a deadline of 1.5x
   the on-demand wall time.
   The policy is chosen on one set of N traces (seed 0) and measured on another (seed 1): its P(deadline) (goal
   >= 99%), its mean cost against the offline optimum (goal within 5%) and against on-demand from the start (goal
   <= 1), and fallback-at-MaxWait's P(deadline) (goal: below the chosen's).
3. Public availability traces (github.com/skypilot-org/spot-traces, all 17 availability/1-node/*/*.json; not in
   this repository: pass the directory they were extracted to): 40 h of work, a 0.2 h changeover, spot at 0.35 of
   on-demand, deadlines 48, 60 and 80 h, each of N runs starting at a random offset into a trace (the policy
   chosen on one set of offsets, measured on another).
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

from spotrun.contract.spec import parse_run
from spotrun.planner.estimate import estimate, load_catalog
from spotrun.planner.plans import LLAMA_31_8B, LLAMA_31_70B
from spotrun.policy.choose import (
    ESTIMATE_TRACES,
    SYNTHETIC_TRACES,
    candidates,
    horizon_s,
    plan_from_estimate,
    spot_policy,
)
from spotrun.policy.engine import SimPlan
from spotrun.policy.report import relative, study
from spotrun.policy.traces import (
    ADVISOR_BANDS,
    TraceSpec,
    advisor_rate,
    generated_traces,
    read_availability,
    recorded_traces,
)

PLANS = {"Llama 3.1 8B full": (LLAMA_31_8B, "full"), "Llama 3.1 70B full": (LLAMA_31_70B, "full"),
         "Llama 3.1 8B LoRA": (LLAMA_31_8B, "lora")}
DEADLINE_FACTOR = 1.5
GOALS = ("P(deadline) >= 99%", "within 5% of the optimum", "<= on-demand", "above MaxWait's P(deadline)")


def plan_run(name: str, deadline_hours: float | None = None):
    config, method = PLANS[name]
    training = {"method": method, "micro_batch": 1, "grad_accum": 8}
    if method == "lora":
        training["lora"] = {"rank": 16, "target_modules": "all-linear"}
    compute = {"on_demand_fallback": True, **({"deadline_hours": deadline_hours} if deadline_hours else {})}
    return parse_run({"version": 1, "name": "bench", "model": {"config": config},
                      "data": {"tokens": 1_000_000_000, "seq_len": 4096}, "training": training,
                      "compute": compute, "budget": {"max_usd": 10_000_000}})


def speed(n: int) -> list[str]:
    rows = ["| plan | layout | candidates | seconds for the estimate's simulation of %d traces |" % n,
            "|---|---|---|---|"]
    catalog = load_catalog()
    for name in PLANS:
        est = estimate(plan_run(name))
        run = plan_run(name, round(DEADLINE_FACTOR * est.wall_seconds / 3600, 1))
        best = math.inf
        for _ in range(3):
            t0 = time.perf_counter()
            section = spot_policy(run, est, catalog, n=n).section
            best = min(best, time.perf_counter() - t0)
        rows.append(f"| {name} | {est.instance_count} x {est.instance_type} | {len(section.policies)} | "
                    f"{best:.2f} s |")
    return rows


def _row(label: str, report: dict) -> str:
    rows = {r["label"]: r for r in report["policies"]}
    chosen = rows[report["chosen"]]
    maxwait = max((r for r in report["policies"] if r["policy"] == "maxwait_fallback"),
                  key=lambda r: r["p_deadline"])
    rel = relative(report, report["chosen"])
    goals = [chosen["p_deadline"] >= 0.99, rel["over_optimum"] <= 0.05, rel["of_on_demand"] <= 1.0,
             maxwait["p_deadline"] < chosen["p_deadline"] or maxwait["p_deadline"] == 1.0]
    missed = [g for g, ok in zip(GOALS, goals, strict=True) if not ok]
    return (f"| {label} | {report['chosen']} | {chosen['p_deadline']:.1%} | ${chosen['mean_usd']:,.0f} | "
            f"${report['optimum']['mean_usd']:,.0f} | {rel['over_optimum']:+.1%} | {rel['of_on_demand']:.2f} | "
            f"{maxwait['p_deadline']:.1%} | {chosen['mean_lost_h']:.2f} | {chosen['mean_interruptions']:.2f} | "
            f"{'MISSED: ' + ', '.join(missed) if missed else 'met'} |")


def plans_table(n: int) -> list[str]:
    rows = ["| plan, rate, droughts | chosen | P(deadline) | mean cost | optimum | over optimum | of on-demand | "
            "MaxWait fallback P(deadline) | work lost h | interruptions | goals |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    catalog = load_catalog()
    for name in PLANS:
        run = plan_run(name)
        est = estimate(run)
        deadline = round(DEADLINE_FACTOR * est.wall_seconds / 3600, 1)
        plan = plan_from_estimate(est, catalog, deadline_s=deadline * 3600)
        rates = {band: advisor_rate(band, est.instance_count) for band in ADVISOR_BANDS}
        rates["catalog"] = est.interruptions_per_hour
        for model, extra in (("no droughts", {**SYNTHETIC_TRACES, "droughts_per_day": 0.0}),
                             ("fitted", ESTIMATE_TRACES)):
            for band, rate in rates.items():
                spec = TraceSpec(rate, horizon_s(plan), **extra)
                report = study(plan, generated_traces(spec, n, seed=1), candidates(plan),
                               choose_on=generated_traces(spec, n, seed=0))
                label = (f"{name} ({est.instance_count} x {est.instance_type}, {plan.work_s / 3600:.1f} h, deadline "
                         f"{deadline:g} h), {band} ({rate:.2g}/h), {model}")
                rows.append(_row(label, report))
                print(rows[-1], flush=True)
    return rows


def public_table(directory: Path, n: int) -> list[str]:
    # every one-node trace (V100 and K80, one instance and eight): a subset of them made the figures look better
    recs = [read_availability(f) for f in sorted(directory.rglob("availability/1-node/*/*.json"))]
    rows = [f"{len(recs)} traces, available {min(r.available_fraction for r in recs):.0%}-"
            f"{max(r.available_fraction for r in recs):.0%} of the time", "",
            "| deadline | chosen | P(deadline) | chosen / on-demand | over optimum | probing greedy / OD | "
            "MaxWait fallback P(deadline), / OD | Uniform Progress / OD, over optimum | deadline greedy / OD | "
            "optimum / OD |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for deadline in (48, 60, 80):
        plan = SimPlan(work_s=40 * 3600, startup_s=600, restore_s=60, save_s=60, interval_s=1800, step_s=10,
                       notice_ok=True, spot_usd_per_h=0.35, on_demand_usd_per_h=1.0, max_runtime_s=80 * 3600,
                       max_wait_s=104 * 3600, deadline_s=deadline * 3600)
        traces = recorded_traces(recs, n, horizon_s(plan), seed=1)
        report = study(plan, traces, candidates(plan), source="spot-traces",
                       choose_on=recorded_traces(recs, n, horizon_s(plan), seed=0))
        r = {x["label"]: x for x in report["policies"]}
        od = r["on_demand"]["mean_usd"]
        up, opt = r["uniform_progress (notice)"], report["optimum"]["mean_usd"]
        chosen = r[report["chosen"]]
        rows.append(f"| {deadline} h | {report['chosen']} | {chosen['p_deadline']:.1%} | "
                    f"{chosen['mean_usd'] / od:.2f} | {chosen['mean_usd'] / opt - 1:+.1%} | "
                    f"{r['probing_greedy (notice)']['mean_usd'] / od:.2f} | "
                    f"{r['maxwait_fallback (notice)']['p_deadline']:.0%}, "
                    f"{r['maxwait_fallback (notice)']['mean_usd'] / od:.2f} | {up['mean_usd'] / od:.2f}, "
                    f"{up['mean_usd'] / opt - 1:+.1%} | {r['deadline_greedy (notice)']['mean_usd'] / od:.2f} | "
                    f"{opt / od:.2f} |")
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--spot-traces", type=Path, help="the extracted skypilot-org/spot-traces repository")
    parser.add_argument("--only", choices=["speed", "plans", "public"])
    args = parser.parse_args()
    out = []
    if args.only in (None, "speed"):
        out += speed(args.n) + [""]
    if args.only in (None, "plans"):
        out += plans_table(args.n) + [""]
    if args.spot_traces and args.only in (None, "public"):
        out += public_table(args.spot_traces, args.n)
    print("\n".join(out))


if __name__ == "__main__":
    main()
