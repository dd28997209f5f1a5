"""The estimate Lambda's plan for the longest run the contract accepts, inside the Lambda's limits: 256 MiB of
memory and 60 s.

    python benchmarks/estimate_lambda_bench.py [--rate 10] [--deadline-days 40 56] [--cap-x 1.3] [--auto]
    python benchmarks/estimate_lambda_bench.py --worst

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
from pathlib import Path

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


LLAMA_70B = {"model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
             "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256,
             "tie_word_embeddings": False, "max_position_embeddings": 8192}


def worst_cases() -> list[tuple[str, dict]]:
    """The slowest runs measured that the contract accepts (issue #26; the catalog's own rates): each a refusal
    that names its caps from simulations at them, on layouts the planner compares by their spot policy's bill
    (an auto layout with a long deadline). The 70B LoRA (examples/runs/llama3-8b-full.json with a 70B
    `model.config`, LoRA rank 16 on all linear layers) at $500 with a 30 h deadline; the mistral-7b LoRA example
    on ml.g5.2xlarge with `instance_count` auto, a 30 h deadline, no fallback, at $5."""
    runs = Path(__file__).resolve().parents[1] / "examples" / "runs"
    l70 = json.loads((runs / "llama3-8b-full.json").read_text())
    l70["model"]["config"] = LLAMA_70B
    l70["training"].update({"method": "lora", "lora": {"rank": 16, "target_modules": "all-linear"}})
    l70["compute"].pop("accepted_delay_hours")
    l70["compute"]["deadline_hours"] = 30
    l70["budget"] = {"max_usd": 500}
    mistral = json.loads((runs / "mistral-7b-lora.json").read_text())
    mistral["compute"] = {"spot": True, "instance_type": "ml.g5.2xlarge", "instance_count": "auto",
                          "deadline_hours": 30, "on_demand_fallback": False}
    mistral["budget"] = {"max_usd": 5}
    for run in (l70, mistral):  # the sources the pipeline's bucket holds (the child's settings: art-bucket)
        run["model"] = {"init": "random", "config": run["model"]["config"]}  # (no model directory to read)
        run["data"]["source"] = "s3://art-bucket/datasets/d1/"
    return [("70B LoRA, auto layout, deadline 30 h, cap $500", l70),
            ("mistral-7b LoRA, ml.g5.2xlarge, count auto, deadline 30 h, no fallback, cap $5", mistral)]


def deadline_refusal_case() -> tuple[str, dict]:
    """The slowest refusal for a deadline's odds measured: the longest run at 0.05 interruptions per hour with a
    28.5-day deadline and no fallback (no policy meets it on 99%; the refusal simulates the fallback and searches
    the least deadline met): 57 s of CPU before the estimate skipped the cap-to-set search such a refusal never
    says, 31 s after."""
    run = longest_run(28.5, longest_tokens(0.05), fallback=False)
    return "longest run at 0.05/h, deadline 28.5 days, no fallback (refused: the deadline's odds)", \
        {"run": run, "rates": {"ml.g5.xlarge": 0.05}}


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


def measure(case: dict, cpu_limit_s: int = CPU_LIMIT_S) -> str:
    child = CHILD.format(limit=LIMIT_BYTES, cpu=cpu_limit_s)
    proc = subprocess.run([sys.executable, "-c", child, json.dumps(case)], capture_output=True, text=True,
                          env={"OPENBLAS_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)})
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return f"ended with {proc.returncode} (a signal when negative: SIGXCPU is the CPU limit): {tail}"
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    if r["status"] != "ok":
        return f"{r['status']} in {r['cpu_s']:.1f} s CPU | {r['peak_mib']:.0f} MiB peak: {r['message'][:120]}..."
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
    parser.add_argument("--worst", action="store_true",
                        help="the slowest runs measured instead (`worst_cases`: refusals naming their caps, on "
                        "auto layouts with a 30 h deadline, at the catalog's rates; `deadline_refusal_case`)")
    parser.add_argument("--cpu-limit", type=int, default=CPU_LIMIT_S,
                        help=f"the child's CPU limit in seconds (default {CPU_LIMIT_S}, the function's timeout; "
                        "larger to measure a case past it on a loaded machine)")
    args = parser.parse_args()
    print(f"| case | outcome (limits: {LIMIT_BYTES >> 20} MiB address space, {args.cpu_limit} s CPU) |\n|---|---|")
    if args.worst:
        for label, run in worst_cases():
            print(f"| {label} | {measure({'run': run, 'rates': None}, args.cpu_limit)} |", flush=True)
        label, case = deadline_refusal_case()
        print(f"| {label} | {measure(case, args.cpu_limit)} |", flush=True)
        return
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
            print(f"| {label} | {measure(case, args.cpu_limit)} |", flush=True)


if __name__ == "__main__":
    main()
