"""Whether one simulation's standard error is the noise of a difference between two simulated means.

    python benchmarks/tie_noise_bench.py [--deadline-hours 12.8] [--seeds 20]

The estimate breaks a lead within NOISE_SES standard errors of the difference as a tie (spotrun/planner/ties.py).
This simulates `examples/runs/llama3-8b-full.json` with `compute.deadline_hours` instead of `accepted_delay_hours`
on 1 x ml.g6e.48xlarge and 1 x ml.p5.48xlarge (each layout pinned), 1,000 traces per seed, and for four pairs (two
layouts, unpaired: each draws its own traces; three pairs of policies on one layout, paired) prints the mean
difference over the seeds, its standard deviation from seed to seed, and the mean of the one-seed standard error
the estimate computes. They agree where the standard error measures the noise.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from spotrun.contract.spec import parse_run
from spotrun.planner.estimate import estimate, load_catalog
from spotrun.planner.ties import paired_se, se_of_mean, unpaired_se
from spotrun.policy.choose import N_TRACES, _simulated

EXAMPLE = Path(__file__).parents[1] / "examples/runs/llama3-8b-full.json"
LAYOUTS = {"g6e": "ml.g6e.48xlarge", "p5": "ml.p5.48xlarge"}
PAIRS = [("g6e", "slack_reserve_5 (notice)", "p5", "deadline_greedy (notice)"),
         ("g6e", "probing_sentinel (notice)", "g6e", "slack_reserve_5 (notice)"),
         ("p5", "slack_reserve_5 (notice)", "p5", "deadline_greedy (notice)"),
         ("p5", "probing_sentinel (notice)", "p5", "deadline_greedy (notice)")]


def rows(catalog: dict, instance_type: str, hours: float, seed: int) -> dict:
    raw = json.loads(EXAMPLE.read_text())
    raw["compute"].pop("accepted_delay_hours")
    raw["compute"].update(deadline_hours=hours, instance_type=instance_type, instance_count=1)
    run = parse_run(raw)
    _, out, _ = _simulated(run, estimate(run, catalog=catalog), catalog, None, n=N_TRACES, seed=seed, poll_s=60.0,
                           max_poll_s=4 * 3600.0)
    return {r.label: r for r in out}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deadline-hours", type=float, default=12.8, help="compute.deadline_hours (default 12.8)")
    parser.add_argument("--seeds", type=int, default=20, help="simulations per layout, seeds 0..N-1 (default 20)")
    args = parser.parse_args()
    catalog = load_catalog()
    diffs: list[list[float]] = [[] for _ in PAIRS]
    ses: list[list[float]] = [[] for _ in PAIRS]
    for seed in range(args.seeds):
        by = {name: rows(catalog, it, args.deadline_hours, seed) for name, it in LAYOUTS.items()}
        for k, (la, a, lb, b) in enumerate(PAIRS):
            ra, rb = by[la][a], by[lb][b]
            diffs[k].append(ra.mean_usd - rb.mean_usd)
            ses[k].append(paired_se(ra.bills, rb.bills) if la == lb else
                          unpaired_se(se_of_mean(ra.bills), se_of_mean(rb.bills)))
    print(f"{'pair':<64} {'mean diff':>9} {'sd/seeds':>8} {'one-seed SE':>11}")
    for k, (la, a, lb, b) in enumerate(PAIRS):
        print(f"{la + ' ' + a + ' - ' + lb + ' ' + b:<64} {statistics.mean(diffs[k]):>+9.3f} "
              f"{statistics.stdev(diffs[k]):>8.3f} {statistics.mean(ses[k]):>11.3f}")


if __name__ == "__main__":
    main()
