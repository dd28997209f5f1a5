"""The state machine against the simulator that promised its odds, on public availability traces.

    python benchmarks/replay_bench.py --spot-traces DIR [--windows 200] [--jobs 2] [--out FILE]
        [--policy P ...] [--deadline-hours 14] [--cap-x X | --cap-usd USD]
    python benchmarks/replay_bench.py --polls      # the guard's polls and history events per run, by policy

1. Agreement: `--windows` windows (a policy and a trace replayed from a random offset into one of the
   skypilot-org/spot-traces one-node recordings, `DIR/availability/1-node/*/*.json`; not in this repository) run
   through the rendered state machine with the real handlers in moto (tests/infra/replay.py), each against the
   simulator's prediction for the same window (spotrun/policy/execution.py): finish time within one poll, cost
   within 1%. `--jobs N`: the windows in chunks of `--chunk`, each chunk in its own process with its own moto
   (one synthesized template for all); `--out` is rewritten as each chunk ends. `--only 184,190-199` replays
   those windows of the `--windows` drawn (the same offsets), in that order. The run's cap never binds (three
   times the on-demand estimate) unless `--cap-x X`: X times the cap to set the estimate names, each window then
   against `execute` on the plan the estimate makes at that cap (docs/spot-policy.md, "At a cap that binds"); a
   window agrees there also when neither side finished. `--cap-usd USD`: that cap itself.
2. Deadline met, per policy: the replay's count against the simulator's on the same windows.
3. `--polls`: on 300 generated traces (40 h of work, 60 h deadline, 0.1 interruptions per hour, the estimate's
   bursts and droughts), the polls per run as the guard executes each policy (9 history events each), and its
   mean cost against the continuous-time engine's (spotrun/policy/policies.py).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app import build_app  # noqa: E402
from spotrun.policy import simulate  # noqa: E402
from spotrun.policy.choose import SYNTHETIC_TRACES  # noqa: E402
from spotrun.policy.decision import RULES  # noqa: E402
from spotrun.policy.engine import SimPlan  # noqa: E402
from spotrun.policy.execution import execute  # noqa: E402
from spotrun.policy.policies import cost_usd  # noqa: E402
from spotrun.policy.traces import TraceSpec, generated_traces, read_availability, replay  # noqa: E402
from tests.conftest import Synth  # noqa: E402
from tests.infra.replay import Window, replay_windows  # noqa: E402

POLICIES = ("uniform_progress", "deadline_greedy", "slack_reserve_10", "maxwait_fallback")
H = 3600.0


def synthesize() -> Synth:
    outdir = Path(tempfile.mkdtemp(prefix="replay-cdk-"))
    build_app(outdir=str(outdir)).synth()
    path = next((outdir / "assembly-dev").glob("*.template.json"))
    return Synth(outdir=outdir, template=json.loads(path.read_text()), template_path=path)


def windows(trace_dir: Path, n: int, seed: int, horizon_s: float,
            policies: tuple[str, ...] = POLICIES) -> list[Window]:
    paths = sorted(trace_dir.glob("availability/1-node/*/*.json"))
    recordings = [read_availability(p) for p in paths]
    if not recordings:
        raise SystemExit(f"--spot-traces {trace_dir}: no availability/1-node/*/*.json under it")
    rng = random.Random(seed)
    out = []
    for k in range(n):
        rec = recordings[k % len(recordings)]
        offset = rng.uniform(0, rec.length_s)
        label = f"{paths[k % len(paths)].parent.name}/{rec.name}@{offset:.0f}"
        out.append(Window(policies[k % len(policies)], replay(rec, offset, horizon_s), label, k))
    return out


def only(spec: str, n: int) -> list[int]:
    """`--only`'s window numbers ("184,190-199"), each < n; SystemExit naming a bad one."""
    picked = []
    for part in spec.split(","):
        first, _, last = part.strip().partition("-")
        if not (first.isdigit() and (not last or last.isdigit())) or int(last or first) >= n:
            raise SystemExit(f"--only={spec!r} is invalid at {part!r}: expected window numbers or ranges (a-b) "
                             f"below --windows={n}")
        picked += range(int(first), int(last or first) + 1)
    return picked


def replay_all(synth: Synth, todo: list[Window], jobs: int, chunk: int, out: Path | None,
               deadline_hours: float = 14.0, cap_x: float | None = None, cap_usd: float | None = None) -> list:
    """Every window replayed, in chunks over `jobs` processes (each its own moto); `out` rewritten per chunk."""
    if jobs <= 1:
        found = []
        for i in range(0, len(todo), chunk):
            found += replay_windows(synth, todo[i:i + chunk], deadline_hours=deadline_hours, cap_x=cap_x,
                                    cap_usd=cap_usd)
            print(f"# {len(found)} of {len(todo)} windows replayed", file=sys.stderr, flush=True)
            if out:
                write(out, found)
        return found
    chunks = [todo[i:i + chunk] for i in range(0, len(todo), chunk)]
    found: dict[int, list] = {}
    # fork: the workers inherit the imports and the synthesized template; no moto is active in the parent
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:
        futures = {pool.submit(replay_windows, synth, c, deadline_hours=deadline_hours, cap_x=cap_x, cap_usd=cap_usd): i
                   for i, c in enumerate(chunks)}
        for f in as_completed(futures):
            found[futures[f]] = f.result()
            done = [a for i in sorted(found) for a in found[i]]
            print(f"# {len(done)} of {len(todo)} windows replayed", file=sys.stderr, flush=True)
            if out:
                write(out, done)
    return [a for i in sorted(found) for a in found[i]]


def _gap(a) -> float:
    """The cost gap of a window relative to the prediction (0 where both billed nothing: ended at the cap before
    a job had instances)."""
    if a.predicted_usd == 0:
        return 0.0 if a.replay_usd == 0 else float("inf")
    return abs(a.replay_usd / a.predicted_usd - 1)


def write(out: Path, found: list) -> None:
    out.write_text(json.dumps([{**a.__dict__, "window": a.window.label, "number": a.window.number,
                                "policy": a.window.policy, "time_ok": a.time_ok, "cost_ok": a.cost_ok,
                                "agrees": a.agrees}
                               for a in found], indent=1))


def polls() -> None:
    plan = SimPlan(work_s=40 * H, startup_s=600, restore_s=60, save_s=60, interval_s=1800, step_s=10,
                   notice_ok=True, spot_usd_per_h=0.35, on_demand_usd_per_h=1.0, deadline_s=60 * H,
                   max_wait_s=60 * H, max_runtime_s=80 * H)
    traces = generated_traces(TraceSpec(0.1, horizon_s=200 * H, **SYNTHETIC_TRACES), 300, seed=0)
    print("| policy | polls per run (mean, max) | history events (max) | executed mean cost | engine's |")
    print("|---|---|---|---|---|")
    for policy in ("on_demand", "maxwait_fallback", *POLICIES[:3]):
        runs = [execute(plan, t, policy, "notice") for t in traces]
        engine = simulate(plan, traces, policy, "notice")
        n = [r.polls for r in runs]
        print(f"| {policy} | {sum(n) / len(n):.0f}, {max(n)} | {9 * max(n):,} | "
              f"{sum(sum(cost_usd(plan, r.tally)) for r in runs) / len(runs):.2f} | "
              f"{sum(sum(cost_usd(plan, t)) for t in engine) / len(engine):.2f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spot-traces", type=Path, help="where skypilot-org/spot-traces is extracted")
    parser.add_argument("--polls", action="store_true", help="only the polls table (generated traces)")
    parser.add_argument("--windows", type=int, default=200, help="windows replayed through the state machine")
    parser.add_argument("--seed", type=int, default=1, help="the windows' offsets")
    parser.add_argument("--out", type=Path, help="write every window's figures here (JSON)")
    parser.add_argument("--jobs", type=int, default=1, help="processes replaying windows at once")
    parser.add_argument("--chunk", type=int, default=25, help="windows per process start (with --jobs > 1)")
    parser.add_argument("--only", help="replay only these of the windows drawn, in this order (e.g. 184,190-199)")
    parser.add_argument("--policy", action="append", choices=sorted(RULES),
                        help=f"the windows' policies, in turn (repeatable; default: {', '.join(POLICIES)})")
    parser.add_argument("--deadline-hours", type=float, default=14.0,
                        help="the replayed run's deadline (its work is ~5 h; default 14)")
    parser.add_argument("--cap-x", type=float,
                        help="the run's budget.max_usd: this many times the cap to set the estimate names (a cap "
                             "that binds; default: three times the on-demand estimate, a cap that never binds)")
    parser.add_argument("--cap-usd", type=float,
                        help="the run's budget.max_usd itself (instead of --cap-x): the same cap whatever the "
                             "estimate names")
    args = parser.parse_args()
    if args.polls:
        polls()
        return 0
    if args.spot_traces is None:
        parser.error("--spot-traces DIR is required (or --polls)")
    t0 = time.perf_counter()
    synth = synthesize()
    policies = tuple(args.policy or POLICIES)
    drawn = windows(args.spot_traces, args.windows, args.seed, 400 * H, policies)
    todo = [drawn[k] for k in only(args.only, args.windows)] if args.only else drawn
    found = replay_all(synth, todo, args.jobs, args.chunk, args.out, args.deadline_hours, args.cap_x, args.cap_usd)
    agree = [a for a in found if a.agrees]
    agreed = {id(a) for a in agree}
    caps = sorted({a.cap_usd for a in found})
    print(f"{len(agree)} of {len(found)} windows agree (finish within one poll, cost within 1%) "
          f"in {time.perf_counter() - t0:.0f} s; cap ${', $'.join(f'{c:,.2f}' for c in caps)}"
          + (" (set)" if args.cap_usd else f" ({args.cap_x} x the cap to set)" if args.cap_x
             else " (3 x the on-demand estimate)"))
    for policy in policies:
        mine = [a for a in found if a.window.policy == policy]
        met_replay = sum(1 for a in mine if a.replay_hours is not None and a.replay_hours <= a.deadline_hours)
        met_sim = sum(1 for a in mine if a.predicted_hours is not None and a.predicted_hours <= a.deadline_hours)
        print(f"  {policy:<18} {sum(1 for a in mine if id(a) in agreed):>4} of {len(mine):>3} agree; deadline met "
              f"replayed {met_replay}, predicted {met_sim}; worst cost gap "
              f"{max((_gap(a) for a in mine), default=0):.3%}; worst finish gap "
              f"{max((a.finish_gap_hours or 0.0 for a in mine), default=0):.4f} h; unfinished replayed "
              f"{sum(a.replay_hours is None for a in mine)}, predicted {sum(a.predicted_hours is None for a in mine)}"
              + (f"; sentinels replayed {sum(a.sentinels for a in mine)}, predicted "
                 f"{sum(a.predicted_sentinels for a in mine)}, in {sum(1 for a in mine if a.sentinels)} windows"
                 if any(a.sentinels or a.predicted_sentinels for a in mine) else ""))
    for a in found:
        if id(a) not in agreed:
            print(f"  disagrees: window {a.window.number} ({a.window.policy}, {a.window.label}): {a.status}, "
                  f"finish {a.replay_hours} h replayed / {a.predicted_hours} h predicted, "
                  f"${a.replay_usd:,.2f} / ${a.predicted_usd:,.2f}, jobs {a.jobs} / {a.predicted_jobs}, sentinels "
                  f"{a.sentinels} / {a.predicted_sentinels}{', ' + a.error if a.error else ''}")
    if args.out:
        write(args.out, found)
    return 0 if len(agree) == len(found) else 1


if __name__ == "__main__":
    sys.exit(main())
