"""`spotrun simulate` on every example run: the seconds its study takes (1,000 generated traces, every candidate
policy and the exact optimum) and the whole command in a fresh process (imports too; the PNG is `--plot`'s,
not drawn here): goal <= 2 s. `--traces DIR`: recorded traces instead (every *.json under DIR, in the
skypilot-org/spot-traces format, replayed from random start offsets: `spotrun simulate --traces DIR`).

    python benchmarks/simulate_command_bench.py [--n 1000] [--repeat 3] [--traces DIR] [--jobs N] [--long]
        [--deadline-h H ...] [--save DIR | --check DIR]

Prints one Markdown row per example (best of `--repeat`); an example that cannot be planned here (the demo's run
needs `make demo`'s assets) prints why. `--jobs`: the command's (`spotrun simulate --jobs`; default its own).
`--long` adds the long run of issue 26's trial (`long_run`: examples/runs/llama3-8b-full.json at LONG_TOKENS_X
its tokens, about 463 h of work, with a 600-hour deadline instead of its accepted delay), where the exact
optimum and the estimate's simulations at the cap take most of the time. `--deadline-h H` (repeatable) adds each
example's deadline variant (`deadline_run`: `compute.deadline_hours: H` instead of its accepted delay), where the
estimate compares the layouts by their policy's bill and searches the cap to set on simulations. Each row also
times `spotrun estimate` (CPU seconds, a fresh process).

`--save DIR` writes what each command prints (`spotrun estimate` and `spotrun simulate`, text and `--format json`;
simulate.json and simulate.txt, less the seconds they report) under DIR; `--check DIR` compares them with a DIR
saved before (at another commit) and exits 1 naming each file that differs: a speed-up must leave every byte as
it was. With either, `--repeat 0` skips the timings.
"""

from __future__ import annotations

import argparse
import difflib
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


def deadline_run(path: Path, hours: float, folder: Path) -> Path:
    """The example at `path` with `compute.deadline_hours: hours` instead of its accepted delay, under `folder`."""
    doc = json.loads(path.read_text())
    doc["compute"].pop("accepted_delay_hours", None)
    doc["compute"]["deadline_hours"] = hours
    out = folder / f"{path.stem}-deadline-{hours:g}h.json"
    out.write_text(json.dumps(doc))
    return out


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


def estimate_cpu_seconds(path: Path) -> float:
    """CPU seconds of `spotrun estimate` in a fresh process (imports too)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "spotrun", "estimate", str(path)], check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def _without_seconds(value):
    """simulate.json less the seconds it reports (`simulate_seconds`, the optimum's `seconds`): the rest is the
    report, which a speed-up must not change."""
    if isinstance(value, dict):
        return {k: _without_seconds(v) for k, v in value.items() if k not in ("simulate_seconds", "seconds")}
    if isinstance(value, list):
        return [_without_seconds(v) for v in value]
    return value


def outputs(path: Path, n: int) -> dict[str, str]:
    """file name -> what the commands print for the run at `path`: `spotrun estimate` and `spotrun simulate`
    (text and --format json, the example's folder as the working directory so that relative sources resolve as
    they do for a user), simulate.json less its seconds and simulate.txt."""
    out: dict[str, str] = {}
    for fmt in ("text", "json"):
        done = subprocess.run([sys.executable, "-m", "spotrun", "estimate", path.name, "--format", fmt],
                              capture_output=True, text=True, cwd=path.parent)
        out[f"estimate.{fmt}"] = f"exit {done.returncode}\n{done.stdout}"
        with tempfile.TemporaryDirectory() as folder:
            done = subprocess.run([sys.executable, "-m", "spotrun", "simulate", path.name, "--n", str(n),
                                   "--out", folder, "--format", fmt], capture_output=True, text=True, cwd=path.parent)
            printed = done.stdout.replace(folder, "OUT")
            if fmt == "json" and done.returncode == 0:
                printed = json.dumps(_without_seconds(json.loads(printed)), indent=2)
            out[f"simulate.{fmt}"] = f"exit {done.returncode}\n{printed}"
            if fmt == "text" and done.returncode == 0:
                report = json.loads((Path(folder) / "simulate.json").read_text())
                out["simulate.json-file"] = json.dumps(_without_seconds(report), indent=2)
                out["simulate.txt-file"] = (Path(folder) / "simulate.txt").read_text()
    return out


def save_or_check(path: Path, n: int, save: Path | None, check: Path | None) -> list[str]:
    """Write the run's `outputs` under save/<run>/, or compare them with check/<run>/: the files that differ."""
    differ = []
    for name, text in outputs(path, n).items():
        if save is not None:
            (save / path.stem).mkdir(parents=True, exist_ok=True)
            (save / path.stem / name).write_text(text)
            continue
        was = (check / path.stem / name).read_text() if (check / path.stem / name).is_file() else ""
        if was != text:
            differ.append(f"{path.stem}/{name}")
            sys.stdout.writelines(difflib.unified_diff(was.splitlines(True), text.splitlines(True),
                                                       f"before/{path.stem}/{name}", f"now/{path.stem}/{name}", n=1))
    return differ


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--traces", type=Path, help="a directory of recorded availability traces (default: "
                        "generated traces)")
    parser.add_argument("--jobs", type=int, help="the command's --jobs (default: its own default)")
    parser.add_argument("--long", action="store_true", help="also the long run of issue 26's trial (`long_run`)")
    parser.add_argument("--deadline-h", type=float, action="append", default=[],
                        help="also each example with compute.deadline_hours=H instead of its accepted delay "
                        "(`deadline_run`; repeatable)")
    outs = parser.add_mutually_exclusive_group()
    outs.add_argument("--save", type=Path, help="write what estimate and simulate print for each run under DIR")
    outs.add_argument("--check", type=Path, help="compare what they print with a DIR --save wrote (exit 1 on any "
                      "difference)")
    args = parser.parse_args()
    kind = "generated" if args.traces is None else "recorded"
    if args.repeat > 0:
        print(f"| example | study of {args.n} {kind} traces (s) | whole command: wall (s) | whole command: CPU (s) | "
              "| `spotrun estimate`: CPU (s) |\n|---|---|---|---|---|---|")
    differ: list[str] = []
    with tempfile.TemporaryDirectory() as folder:
        runs = EXAMPLES + [deadline_run(p, h, Path(folder)) for h in args.deadline_h for p in EXAMPLES
                           if p.parent.name == "runs"]
        for path in runs + ([long_run(Path(folder))] if args.long else []):
            if args.repeat > 0:
                row(path, args)
            if args.save or args.check:
                differ += save_or_check(path, args.n, args.save, args.check)
    if args.check:
        print(f"{len(differ)} files differ from {args.check}" + (f": {', '.join(differ)}" if differ else ""))
        sys.exit(1 if differ else 0)


def row(path: Path, args: argparse.Namespace) -> None:
    """One example's Markdown row (best of --repeat)."""
    made = "`deadline_run`" if "-deadline-" in path.stem and path.stem != "llama3-8b-full-x47-deadline-600h" else \
        "`long_run`"
    name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else f"{path.name} ({made})"
    try:
        runs = [study_seconds(path, args.n, args.traces, args.jobs) for _ in range(args.repeat)]
    except (Refusal, ValueError) as exc:
        print(f"| {name} | - | - | - | not planned here: {str(exc).splitlines()[0]} | - |")
        return
    wall, cpu = min(command_seconds(path, args.n, args.traces, args.jobs) for _ in range(args.repeat))
    estimate = min(estimate_cpu_seconds(path) for _ in range(args.repeat))
    print(f"| {name} | {min(s for s, _ in runs):.2f} | {wall:.2f} | {cpu:.2f} | {runs[0][1]} | {estimate:.2f} |",
          flush=True)

if __name__ == "__main__":
    main()
