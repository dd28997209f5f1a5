"""Every policy against the exact offline optimum on all one-node public availability traces; prints the table of
docs/spot-policy.md.

    python benchmarks/optimum_bench.py --spot-traces DIR [--every-hours 6] [--deadlines 48 60 80]

DIR: the extracted github.com/skypilot-org/spot-traces repository (not in this one); every
availability/1-node/*/*.json under it is read (1 instance available = capacity). The setting of "Can't Be Late"
(NSDI 2024): 40 h of work, a 0.2 h changeover (10 min startup, 1 min restore, 1 min save), spot at 0.35 of
on-demand, saves on the notice; a job created every `--every-hours` of each trace (the trace replayed from there,
wrapping around its end). Per deadline: the exact optimum's mean cost relative to on-demand from the start, and
each policy's mean relative to on-demand and to the optimum (mean over mean), its P(deadline), and which one the
estimate's rule chooses on these windows.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from spotrun.policy import compare
from spotrun.policy.choose import candidates, choose, horizon_s
from spotrun.policy.engine import SimPlan
from spotrun.policy.optimum import solve
from spotrun.policy.traces import read_availability, replay

H = 3600.0


def setting(deadline_h: float) -> SimPlan:
    return SimPlan(work_s=40 * H, startup_s=600.0, restore_s=60.0, save_s=60.0, interval_s=1800.0, step_s=10.0,
                   notice_ok=True, spot_usd_per_h=0.35, on_demand_usd_per_h=1.0, max_runtime_s=80 * H,
                   max_wait_s=104 * H, deadline_s=deadline_h * H)


def windows(directory: Path, every_h: float, plan: SimPlan) -> tuple[list, list[str]]:
    files = sorted(directory.glob("availability/1-node/*/*.json"))
    if not files:
        raise SystemExit(f"--spot-traces={directory}: no availability/1-node/*/*.json under it")
    traces, names = [], []
    for f in files:
        rec = read_availability(f)
        offset = 0.0
        while offset < rec.length_s:
            traces.append(replay(rec, offset, horizon_s(plan)))
            offset += every_h * H
        names.append(f"{f.parent.name}/{f.name}")
    return traces, names


def table(directory: Path, every_h: float, deadlines: list[float]) -> list[str]:
    out = []
    for deadline in deadlines:
        plan = setting(deadline)
        traces, names = windows(directory, every_h, plan)
        t0 = time.perf_counter()
        results = [solve(plan, t) for t in traces]
        seconds = time.perf_counter() - t0
        rows = compare(plan, traces, candidates(plan))
        od = next(r for r in rows if r.policy == "on_demand").mean_usd
        opt = sum(r.usd for r in results) / len(results)
        chosen, _ = choose(plan, rows)
        if not out:
            out += [f"{len(names)} traces ({', '.join(names)}), a job every {every_h:g} h: {len(traces)} windows", ""]
        out += [f"deadline {deadline:g} h: exact optimum {opt / od:.3f} of on-demand ({sum(r.exact for r in results)}"
                f" of {len(results)} windows exact, {seconds:.1f} s); chosen by the estimate's rule: {chosen.label}",
                "", "| policy | P(deadline) | mean / on-demand | mean / optimum |", "|---|---|---|---|"]
        for r in rows:
            mark = " (chosen)" if r.label == chosen.label else ""
            out.append(f"| {r.label}{mark} | {r.p_deadline:.1%} | {r.mean_usd / od:.3f} | "
                       f"{r.mean_usd / opt - 1:+.1%} |")
        out.append("")
        print("\n".join(out[-len(rows) - 5:]), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spot-traces", type=Path, required=True, help="the extracted skypilot-org/spot-traces "
                        "repository")
    parser.add_argument("--every-hours", type=float, default=6.0, help="a job created every this many hours of "
                        "each trace (default 6)")
    parser.add_argument("--deadlines", type=float, nargs="+", default=[48.0, 60.0, 80.0], help="hours")
    args = parser.parse_args()
    print("\n".join(table(args.spot_traces, args.every_hours, args.deadlines)))


if __name__ == "__main__":
    main()
