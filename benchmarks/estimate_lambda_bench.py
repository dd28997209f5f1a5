"""The estimate Lambda's plan for the longest run the contract accepts, inside the Lambda's limits: 256 MiB of
memory and 60 s.

    python benchmarks/estimate_lambda_bench.py [--rate 10] [--deadline-days 40 56] [--cap-x 1.3]

Each case runs in a fresh subprocess that first limits itself (`resource.setrlimit`): its address space to 256 MiB
(RLIMIT_AS, stricter than the Lambda's memory setting, which bounds resident memory) and its CPU to the
function's timeout, CPU_LIMIT_S (RLIMIT_CPU: past it the kernel ends the process). It imports what the Lambda
imports (boto3 and spotrun.pipeline.plan) and plans, with the estimate's policy simulation, the longest run the
planner accepts on one ml.g5.xlarge (expected to finish, interruptions included, within SageMaker's 28-day
MaxRuntime; a longer one is refused) at 0.05 interruptions per hour and at the rate given (the contract's
highest, 10 per hour, by default), without a deadline and at each deadline given, at an unbinding cap or, with
`--cap-x`, that multiple of the spot estimate (a chain of jobs: the estimate simulates the run again as one job
for its P95 finish cap, and again at the caps a deadline warning names). Prints one row per case: the CPU
seconds and the peak resident memory of the subprocess, the traces simulated and the chosen policy; a case
that breaks a limit prints how it ended. CPU seconds, not wall time: they do not depend on what else the
machine runs (much: a loaded machine's shared caches slow a process too).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from spotrun.contract.spec import parse_run
from spotrun.planner.estimate import EstimateRefused, estimate, load_catalog

LIMIT_BYTES = 256 * 1024 * 1024
CPU_LIMIT_S = 60  # the estimate function's timeout (training_constructs/training_pipeline.py)

CHILD = r"""
import json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
resource.setrlimit(resource.RLIMIT_CPU, ({cpu}, {cpu}))
import boto3  # noqa: F401  (the Lambda's runtime imports it with the handler)
from spotrun.pipeline.plan import PipelineSettings, plan

case = json.loads(sys.argv[1])
settings = PipelineSettings(bucket="art-bucket", job_prefix="spotrun-dev-", model_package_group="g", poll_seconds=60,
                            project="spotrun", stage="dev", cost_center="ml")
out = plan(case["run"], "exec-1", settings, rates=case["rates"])
usage = resource.getrusage(resource.RUSAGE_SELF)
est = out.get("estimate") or {{}}
section = est.get("spot_policy") or {{}}
print(json.dumps({{"status": out.get("status"), "message": out.get("message"), "cpu_s": usage.ru_utime + usage.ru_stime,
                  "peak_mib": usage.ru_maxrss / 1024, "days": est.get("wall_seconds", 0) / 86400,
                  "traces": section.get("traces"), "chosen": section.get("chosen")}}))
"""


def longest_run(deadline_days: float | None, tokens: int, max_usd: float = 1_000_000, auto: bool = False,
                fallback: bool = True) -> dict:
    compute = {"instance_type": "auto" if auto else "ml.g5.xlarge", "on_demand_fallback": fallback}
    if deadline_days:
        compute["deadline_hours"] = deadline_days * 24
    return {"version": 1, "name": "longest", "model": {"init": "random", "config": {
        "model_type": "gpt2", "n_embd": 1024, "n_layer": 24, "n_head": 16}},
        "data": {"source": "s3://art-bucket/datasets/d1/", "tokens": tokens, "seq_len": 1024},
        "compute": compute, "budget": {"max_usd": max_usd}}


def longest_tokens(rate: float) -> int:
    """The most tokens (within 1%) whose run the planner accepts at this interruption rate: past them it
    expects the run, interruptions included, to outlast SageMaker's 28-day MaxRuntime and refuses it."""
    lo, hi = 10_000_000, 100_000_000_000
    while hi > 1.01 * lo:
        mid = (lo + hi) // 2
        try:
            estimate(parse_run(longest_run(None, mid)), recorded_rates={"ml.g5.xlarge": rate})
            lo = mid
        except EstimateRefused:
            hi = mid
    return lo


def measure(case: dict) -> str:
    child = CHILD.format(limit=LIMIT_BYTES, cpu=CPU_LIMIT_S)
    proc = subprocess.run([sys.executable, "-c", child, json.dumps(case)], capture_output=True, text=True,
                          env={"OPENBLAS_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)})
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return f"ended with {proc.returncode} (a signal when negative: SIGXCPU is the CPU limit): {tail}"
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    if r["status"] != "ok":
        return f"{r['status']}: {r['message']}"
    return (f"{r['days']:.1f} days without interruptions | {r['cpu_s']:.1f} s CPU | {r['peak_mib']:.0f} MiB peak | "
            f"{r['traces']} traces | {r['chosen']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=10.0, help="interruptions per hour (default 10, the most)")
    parser.add_argument("--deadline-days", type=float, nargs="+", default=[40.0, 56.0],
                        help="the deadlines of the deadline cases (default 40 and 56: at 40 days a cap that binds "
                        "also leaves out the policies meeting it, a deadline warning's simulations on top)")
    parser.add_argument("--cap-x", type=float, default=None,
                        help="the cap as this multiple of the spot estimate (default: $1,000,000, not binding)")
    parser.add_argument("--auto", action="store_true",
                        help="the runs' compute.instance_type 'auto' (every instance type at the rate): with a "
                        "deadline the planner compares layouts by the spot policy's bill, simulations on top")
    parser.add_argument("--no-fallback", action="store_true",
                        help="the runs without compute.on_demand_fallback: where runs wait out MaxWait, the estimate "
                        "simulates each remedy for them (spotrun/policy/choose.py `maxwait_fixes`), simulations on top")
    args = parser.parse_args()
    print(f"| case | outcome (limits: {LIMIT_BYTES >> 20} MiB address space, {CPU_LIMIT_S} s CPU) |\n|---|---|")
    for rate in sorted({args.rate, 0.05}):
        tokens = longest_tokens(rate)
        spot = estimate(parse_run(longest_run(None, tokens)), recorded_rates={"ml.g5.xlarge": rate}).cost_usd["spot"]
        cap = round(args.cap_x * spot, 2) if args.cap_x else 1_000_000
        for deadline in (None, *args.deadline_days):
            rates = dict.fromkeys(load_catalog()["instances"], rate) if args.auto else {"ml.g5.xlarge": rate}
            case = {"run": longest_run(deadline, tokens, cap, args.auto, not args.no_fallback), "rates": rates}
            label = ("auto, " if args.auto else "") + ("no fallback, " if args.no_fallback else "") + f"{rate:g}/h, "
            label += (f"deadline {deadline:g} days" if deadline else "no deadline") + \
                (f", cap ${cap:,.2f} ({args.cap_x:g}x spot)" if args.cap_x else "")
            print(f"| {label} | {measure(case)} |", flush=True)


if __name__ == "__main__":
    main()
