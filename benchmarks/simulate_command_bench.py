"""`spotrun simulate` on every example run: the seconds its study takes (1,000 generated traces, every candidate
policy and the exact optimum) and the whole command in a fresh process (imports too; the PNG is `--plot`'s,
not drawn here): goal <= 2 s. `--traces DIR`: recorded traces instead (every *.json under DIR, in the
skypilot-org/spot-traces format, replayed from random start offsets: `spotrun simulate --traces DIR`).

    python benchmarks/simulate_command_bench.py [--n 1000] [--repeat 3] [--traces DIR] [--jobs N] [--long]

Prints one Markdown row per example (best of `--repeat`); an example that cannot be planned here (the demo's run
needs `make demo`'s assets) prints why. `--jobs`: the command's (`spotrun simulate --jobs`; default its own).
`--long` adds the long run of issue 26's trial (`long_run`: examples/runs/llama3-8b-full.json at LONG_TOKENS_X
its tokens, about 463 h of work, with a 600-hour deadline instead of its accepted delay), where the exact
optimum and the estimate's simulations at the cap take most of the time.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from spotrun.cli.estimate import check_file
from spotrun.cli.simulate import jobs
from spotrun.contract.refusal import Refusal
from spotrun.planner.catalog import load_catalog, regional_catalog
from spotrun.policy.choose import ESTIMATE_TRACES, horizon_s, policy_plans, run_candidates, run_plan
from spotrun.policy.report import study
from spotrun.policy.traces import TraceSpec, generated_traces, read_availability, recorded_traces

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples/runs").glob("*.json")) + [ROOT / "examples/demo/run.json"]
LONG_TOKENS_X = 47  # the 8B example's 400M tokens (2 epochs of 200M) x 47: ~463 h of work on 1 x ml.g6e.48xlarge


def long_run(folder: Path) -> Path:
    """The 8B example at LONG_TOKENS_X its tokens, a 600-hour deadline instead of its accepted delay and a cap
    ($100,000) that does not bind, written under `folder`."""
    doc = json.loads((ROOT / "examples/runs/llama3-8b-full.json").read_text())
    doc["data"]["tokens"] *= LONG_TOKENS_X
    doc["compute"].pop("accepted_delay_hours")
    doc["compute"]["deadline_hours"] = 600
    doc["budget"]["max_usd"] = 100_000
    path = folder / "llama3-8b-full-x47-deadline-600h.json"
    path.write_text(json.dumps(doc))
    return path


def study_seconds(path: Path, n: int, traces: Path | None, workers: int | None) -> tuple[float, str]:
    checked = check_file(path, None, plan=True, region=None)
    est, run = checked.estimate, checked.run
    catalog = regional_catalog(load_catalog(), "us-east-1")
    plan = run_plan(run, est, catalog)  # the command's: the estimate's plan at the run's cap
    t0 = time.perf_counter()
    if traces is None:
        spec = TraceSpec(interruptions_per_hour=est.interruptions_per_hour, horizon_s=horizon_s(plan),
                         **ESTIMATE_TRACES, mean_wait_s=est.mean_wait_seconds)
        windows = generated_traces(spec, n, 0)
    else:  # as `spotrun simulate --traces` reads and replays them
        recordings = [read_availability(f, est.instance_count) for f in sorted(traces.rglob("*.json"))]
        windows = recorded_traces(recordings, n, horizon_s(plan), 0)
    report = study(plan, windows, run_candidates(run, plan), cap_usd=run.max_usd,
                   plan_of=policy_plans(run, est, plan), workers=jobs(workers, windows))
    exact = "exact" if report["optimum"]["exact"] else "a floor"
    return time.perf_counter() - t0, f"{len(report['policies'])} policies, optimum {exact}"


def command_seconds(path: Path, n: int, traces: Path | None, workers: int | None) -> tuple[float, float]:
    """(wall, CPU) seconds of the whole command in a fresh process: on a shared machine the CPU seconds are the
    figure that does not depend on the other processes."""
    recorded = ([] if traces is None else ["--traces", str(traces)]) + ([] if workers is None else
                                                                        ["--jobs", str(workers)])
    with tempfile.TemporaryDirectory() as out:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "spotrun", "simulate", str(path), "--n", str(n), "--out", out,
                        *recorded], check=True, capture_output=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--traces", type=Path, help="a directory of recorded availability traces (default: "
                        "generated traces)")
    parser.add_argument("--jobs", type=int, help="the command's --jobs (default: its own default)")
    parser.add_argument("--long", action="store_true", help="also the long run of issue 26's trial (`long_run`)")
    args = parser.parse_args()
    kind = "generated" if args.traces is None else "recorded"
    print(f"| example | study of {args.n} {kind} traces (s) | whole command: wall (s) | whole command: CPU (s) | |\n"
          "|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for path in EXAMPLES + ([long_run(Path(folder))] if args.long else []):
            row(path, args)


def row(path: Path, args: argparse.Namespace) -> None:
    """One example's Markdown row (best of --repeat)."""
    name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else f"{path.name} (`long_run`)"
    try:
        runs = [study_seconds(path, args.n, args.traces, args.jobs) for _ in range(args.repeat)]
    except (Refusal, ValueError) as exc:
        print(f"| {name} | - | - | not planned here: {str(exc).splitlines()[0]} |")
        return
    wall, cpu = min(command_seconds(path, args.n, args.traces, args.jobs) for _ in range(args.repeat))
    print(f"| {name} | {min(s for s, _ in runs):.2f} | {wall:.2f} | {cpu:.2f} | {runs[0][1]} |", flush=True)

if __name__ == "__main__":
    main()
