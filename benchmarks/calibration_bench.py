"""The estimate's P(deadline) against the frequency the executed runs meet it on the public traces.

    python benchmarks/calibration_bench.py --spot-traces DIR [--set held-out] [--every-h 6] [--n 1000]
    python benchmarks/calibration_bench.py --spot-traces DIR --set held-out --stretches 1000

The setting is benchmarks/policy_bench.py's (#26: 40 h of work, a 0.2 h changeover, spot at 0.35 of on-demand,
saves on the notice, deadlines 48, 60 and 80 h) on every one-node trace of github.com/skypilot-org/spot-traces
(`availability/1-node/*/*.json` under DIR; not in this repository), a job started every `--every-h` hours of
each recording while the deadline fits in it. `--set held-out` (the default): the traces at odd positions in
sorted path order, which the estimate's availability model (spotrun/policy/availability.py) was not fitted on;
`choose`: the 9 it was fitted on (benchmarks/fit_availability.py); `all`.

- Observed: every candidate the estimate offers (spotrun/policy/choose.py: `candidates`) executed on every window
  as the state machine runs it (spotrun/policy/execution.py, the model benchmarks/replay_bench.py replays through
  the rendered state machine): the fraction of windows that finished by the deadline.
- Estimated: what the estimate prints for a run on that recording's capacity: its P(deadline) over `--n`
  generated traces (choose.py's `ESTIMATE_TRACES`: the fitted model; seed 0) at the recording's own interruption
  rate (its windows per available hour, as the interruption recorder would measure it), averaged over the windows.
The difference, per deadline and candidate, is the estimate's calibration on recorded capacity; beside it, the 5th
and 95th percentiles of that difference over the recordings resampled with replacement (their windows together),
which says how much of it a different handful of recordings would move.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.policy_bench import AFTER_DEADLINE_H, DEADLINES_H, setting, windows  # noqa: E402
from spotrun.policy import compare  # noqa: E402
from spotrun.policy.choose import ESTIMATE_TRACES, candidates, horizon_s  # noqa: E402
from spotrun.policy.execution import execute  # noqa: E402
from spotrun.policy.policies import describe  # noqa: E402
from spotrun.policy.traces import TraceSpec, generated_traces, read_availability  # noqa: E402


def recorded_rate(rec) -> float:
    """Interruptions per available hour: every window but an open last one ends in an interruption."""
    return len(rec.windows) / (sum(b - a for a, b in rec.windows) / 3600)


def estimated(plan, rate: float, n: int, todo: list[tuple[str, str]]) -> dict:
    """The estimate's P(deadline) per candidate label for a run at `rate` interruptions per job-hour."""
    spec = TraceSpec(interruptions_per_hour=rate, horizon_s=horizon_s(plan), **ESTIMATE_TRACES)
    return {r.label: r.p_deadline for r in compare(plan, generated_traces(spec, n, 0), todo)}


def observed(plan, trace: list, policy: str, ck: str) -> bool:
    tally = execute(plan, trace, policy, ck, horizon_s=plan.deadline_s + AFTER_DEADLINE_H * 3600).tally
    return tally.finished and tally.t <= plan.deadline_s + 1e-6


def calibrate(recordings: list, deadline_h: float, every_h: float, n: int,
              policies: list[str] | None) -> list[tuple[str, float, float, int, tuple[float, float]]]:
    """(candidate, mean estimated P, observed frequency, windows, the difference's 90% interval) at one deadline."""
    plan = setting(deadline_h)
    todo = windows(recordings, deadline_h, every_h)
    offered = [(p, ck) for p, ck in candidates(plan) if policies is None or p in policies]
    est = [estimated(plan, recorded_rate(rec), n, offered) for rec in recordings]
    out = []
    for policy, ck in offered:
        label = describe(policy, ck)
        met = [observed(plan, trace, policy, ck) for _, trace in todo]
        promised = [est[i][label] for i, _ in todo]
        off = [(i, p - m) for (i, _), p, m in zip(todo, promised, met, strict=True)]
        out.append((label, sum(promised) / len(promised), sum(met) / len(met), len(todo), interval(off)))
    return out


def lost_at_end(plan, up_s: float) -> float:
    """Work a job with periodic saves only loses when a stretch with capacity of `up_s` ends under it, the job
    having started at the stretch's start: nothing before its start-up is done, then cycles of the interval's
    training and a blocking save (work is committed at a save's end)."""
    trained = up_s - plan.startup_s - plan.restore_s
    return 0.0 if trained <= 0 else min(trained % (plan.interval_s + plan.save_s), plan.interval_s)


def stretch_rows(plan, recordings: list, names: list[str], n: int) -> list[str]:
    """Per recording, its stretches with capacity against those of the estimate's `n` generated traces at its rate
    (seed 0): the share shorter than a start (start-up and restore: no work done, none lost) and the mean work a
    periodic-only job loses at a stretch's end (`lost_at_end`)."""
    start = plan.startup_s + plan.restore_s
    rows = []
    for name, rec in zip(names, recordings, strict=True):
        rate = recorded_rate(rec)
        spec = TraceSpec(interruptions_per_hour=rate, horizon_s=horizon_s(plan), **ESTIMATE_TRACES)
        gen: list[float] = []
        for trace in generated_traces(spec, n, 0):
            gen += [b - a for a, b in trace[:-1] if a > 0]  # whole stretches: not the first (cut by the start)
        rec_ups = [b - a for a, b in rec.windows[:-1]]  # the last may be cut by the recording's end
        cells = []
        for ups in (rec_ups, gen):
            cells += [f"{sum(u < start for u in ups) / len(ups):.0%}",
                      f"{sum(lost_at_end(plan, u) for u in ups) / len(ups):.0f}"]
        rows.append(f"| {name} | {rate:.2f} | {len(rec_ups)} | " + " | ".join(cells) + f" | {len(gen)} |")
    return rows


def interval(off: list[tuple[int, float]], draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    """The 5th and 95th percentiles of the mean difference (estimated - observed, per window) over the windows
    of the recordings resampled with replacement: how far the figure moves with other recordings of the same
    kind (windows of one recording overlap and share its spells, so they are resampled together)."""
    by_rec: dict[int, list[float]] = {}
    for i, d in off:
        by_rec.setdefault(i, []).append(d)
    groups = list(by_rec.values())
    rng = random.Random(seed)
    means = []
    for _ in range(draws):
        picked = [groups[rng.randrange(len(groups))] for _ in groups]
        means.append(sum(map(sum, picked)) / sum(map(len, picked)))
    means.sort()
    return means[int(0.05 * draws)], means[int(0.95 * draws) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spot-traces", type=Path, required=True, help="where skypilot-org/spot-traces is")
    parser.add_argument("--every-h", type=float, default=6.0, help="a window starts every this many hours")
    parser.add_argument("--n", type=int, default=1000, help="generated traces per estimate (the estimate's N)")
    parser.add_argument("--set", choices=["held-out", "choose", "all"], default="held-out",
                        help="traces at odd positions in sorted path order (held-out: the availability model "
                        "was fitted on the others), even positions (choose) or all")
    parser.add_argument("--policies", help="comma-separated: only these candidates (default: every one offered)")
    parser.add_argument("--deadlines", default=",".join(map(str, DEADLINES_H)), help="hours, comma-separated")
    parser.add_argument("--stretches", type=int, metavar="N", default=0,
                        help="instead: each recording's stretches with capacity against those of N generated "
                        "traces at its rate (the share shorter than a start, the work lost at their end with "
                        "periodic saves)")
    args = parser.parse_args()
    paths = sorted(args.spot_traces.glob("availability/1-node/*/*.json"))
    if not paths:
        raise SystemExit(f"--spot-traces {args.spot_traces}: no availability/1-node/*/*.json under it")
    keep = {"choose": 0, "held-out": 1}.get(args.set)
    paths = [p for i, p in enumerate(paths) if keep is None or i % 2 == keep]
    recordings = [read_availability(p) for p in paths]
    if args.stretches:
        plan = setting(float(args.deadlines.split(",")[0]))
        print(f"| trace ({args.set}) | interruptions per available hour | stretches | recorded: shorter than a start "
              f"({plan.startup_s + plan.restore_s:g} s) | recorded: lost at the end, periodic saves (s) | generated: "
              "shorter than a start | generated: lost at the end (s) | generated stretches |")
        print("|---|---|---|---|---|---|---|---|")
        print("\n".join(stretch_rows(plan, recordings, [f"{p.parent.name}/{p.stem}" for p in paths],
                                     args.stretches)))
        return
    print(f"{len(recordings)} traces ({args.set}); interruptions per available hour "
          f"{min(map(recorded_rate, recordings)):.2f}-{max(map(recorded_rate, recordings)):.2f}")
    print("| deadline | candidate | windows | estimated P(deadline) | observed | difference (points) | "
          "90% interval, recordings resampled |")
    print("|---|---|---|---|---|---|---|")
    t0 = time.perf_counter()
    policies = args.policies.split(",") if args.policies else None
    for deadline_h in map(float, args.deadlines.split(",")):
        for label, promised, met, count, (lo, hi) in calibrate(recordings, deadline_h, args.every_h, args.n,
                                                                policies):
            print(f"| {deadline_h:g} h | {label} | {count} | {promised:.1%} | {met:.1%} | "
                  f"{100 * (promised - met):+.1f} | {100 * lo:+.1f} .. {100 * hi:+.1f} |", flush=True)
    print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
