"""Variants of probing_greedy screened on the choose set of the public traces (issue #26, item 3).

    python benchmarks/policy_sweep.py --spot-traces DIR --optimum-cache FILE [--every 2] [--set choose]
    python benchmarks/policy_sweep.py --spot-traces DIR --optimum-cache FILE --set held-out \\
        --only '{"shape": 1.75, "stint_s": 27000}'

The setting and the choose / held-out split are benchmarks/policy_bench.py's (40 h of work, 48 / 60 / 80 h
deadlines, every one-node trace of skypilot-org/spot-traces, the traces at even positions in sorted path order
choose, the odd ones are held out). Each variant runs as the guard executes it (spotrun/policy/execution.py) on
every `--every`-th window of the set; the score is the sum over the three deadlines of the mean cost over
on-demand (the rule that chose probing_greedy's reserve). A variant is a pure function of the guard's
`Observation`, as any rule in spotrun/policy/decision.py must be:

- `reserve`, `stint_s`, `keep`: probing_greedy's (spotrun/policy/decision.py: ProbingGreedy);
- `shape`: the reserve shrinks as (the share of the work left) ** shape (probing_greedy: 1);
- `frac`: plus this share of the starting slack (in the reserve, before the shrinking);
- `margin`: hysteresis on returning to spot: an on-demand job probes only when the slack after the changeover
  is at least `margin` changeovers above the reserve (so a probe can wait);
- `avail_power`, `stint_power`: availability-aware, learned online from what the guard sees: `burn`, the share
  of the elapsed time that did not move the work (waits for capacity, startups: elapsed - progress over
  elapsed, with a prior of 0.25 worth 6 h), scales the reserve by (burn / 0.25) ** avail_power and the stint by
  (burn / 0.25) ** stint_power.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from policy_bench import optima, outcome, registered, setting, windows  # a sibling script (sys.path[0])

from spotrun.policy.decision import (
    Action,
    Decision,
    JobStatus,
    Market,
    Observation,
    _half,
    _to,
    progress_s,
    risk_s,
    slack_s,
)
from spotrun.policy.engine import SimPlan
from spotrun.policy.traces import read_availability

PRIOR_BURN, PRIOR_S = 0.25, 6 * 3600.0
GRID = [
    {}, *({"stint_s": h * 3600.0, "margin": m} for h in (3, 4.5, 6, 9) for m in (0, 1, 2, 4)),
    *({"avail_power": a} for a in (-1, -0.5, 0.5, 1)), *({"stint_power": b} for b in (-1, -0.5, 0.5, 1)),
    *({"reserve": r, "frac": f} for r, f in ((0, 0.5), (0, 0.7), (0, 0.9), (16, 0.3), (16, 0.5), (24, 0.2))),
    *({"shape": s, "reserve": r} for s in (0.5, 1.5, 2, 3) for r in (32, 40)),
    *({"shape": s, "stint_s": h * 3600.0} for s in (1.25, 1.5, 1.75) for h in (4.5, 6, 7.5)),
]


@dataclass(frozen=True)
class Variant:
    """probing_greedy with the knobs of the module docstring (the defaults are probing_greedy)."""

    reserve: float = 32.0
    stint_s: float = 6 * 3600.0
    keep: float = 1.0
    shape: float = 1.0
    frac: float = 0.0
    margin: float = 0.0
    avail_power: float = 0.0
    stint_power: float = 0.0

    def burn(self, plan: SimPlan, ck: str, obs: Observation) -> float:
        idle = obs.elapsed_s - progress_s(plan, ck, obs)
        return max(0.02, (idle + PRIOR_BURN * PRIOR_S) / (obs.elapsed_s + PRIOR_S)) / PRIOR_BURN

    def floor(self, plan: SimPlan, ck: str, obs: Observation) -> float:
        risk, change = risk_s(plan, ck), plan.changeover_s
        left = max(0.0, plan.work_s - progress_s(plan, ck, obs)) / plan.work_s
        start = slack_s(plan, ck, Observation(0.0, 0.0, Market.SPOT, JobStatus.NONE)) - risk
        reserve = (self.reserve + self.frac * start / change) * self.burn(plan, ck, obs) ** self.avail_power
        return risk + max(self.keep + 1, reserve * left ** self.shape) * change

    def __call__(self, plan: SimPlan, ck: str, obs: Observation) -> Decision:
        if plan.deadline_s is None:
            return _to(Market.SPOT, obs)
        slack, risk, change = slack_s(plan, ck, obs), risk_s(plan, ck), plan.changeover_s
        if slack <= risk or obs.max_wait_exceeded:
            return _to(Market.ON_DEMAND, obs)
        can_probe = slack - change > risk + self.keep * change
        if obs.status is JobStatus.NONE:
            return Decision(Action.START_SPOT, plan.poll_s) if can_probe else Decision(Action.START_ON_DEMAND)
        if obs.market is Market.ON_DEMAND:
            if not can_probe:
                return Decision(Action.KEEP)
            stint = self.stint_s * self.burn(plan, ck, obs) ** self.stint_power
            if self.margin > 0 and slack - change - self.floor(plan, ck, obs) < self.margin * change:
                return Decision(Action.KEEP, max(stint - obs.job_age_s, 1800.0))
            if obs.job_age_s >= stint:
                return Decision(Action.TO_SPOT, plan.poll_s)
            return Decision(Action.KEEP, stint - obs.job_age_s)
        floor = self.floor(plan, ck, obs)
        if obs.status is JobStatus.WAITING:
            if slack <= floor:
                return Decision(Action.TO_ON_DEMAND)
            return Decision(Action.KEEP, _half(slack - floor) + plan.poll_s)
        return Decision(Action.KEEP, _half(slack - risk) + plan.poll_s)


def score(spec: dict, recordings: list, parity: int, every: int, cache: Path) -> tuple[float, list[str]]:
    """(the sum of the mean costs / OD, one 'cost, over optimum, missed' cell per deadline) on the set."""
    total, cells = 0.0, []
    for deadline in (48, 60, 80):
        plan = setting(deadline)
        ws = windows(recordings, deadline, 6.0)
        floor = optima(plan, ws, list(range(0, len(ws), 6)), cache)
        idx = [i for i in range(0, len(ws), every) if ws[i][0] % 2 == parity]
        with registered("_sweep", Variant(**spec)) as name:
            res = {i: outcome(plan, ws[i][1], name) for i in idx}
        mean = sum(c for c, _ in res.values()) / len(res)
        opt = [i for i in idx if i in floor]
        gap = sum(res[i][0] for i in opt) / sum(floor[i] for i in opt) - 1
        total += mean
        cells.append(f"{mean:.4f}, {gap:+.1%}, {sum(1 for _, met in res.values() if not met)}")
    return total, cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spot-traces", type=Path, required=True)
    parser.add_argument("--optimum-cache", type=Path, required=True, help="policy_bench.py's --optimum-cache")
    parser.add_argument("--every", type=int, default=2, help="every k-th window of the set")
    parser.add_argument("--set", choices=("choose", "held-out"), default="choose")
    parser.add_argument("--only", type=json.loads, help="one variant, as JSON (default: the grid)")
    args = parser.parse_args()
    files = sorted(args.spot_traces.rglob("availability/1-node/*/*.json"))
    recordings = [read_availability(f) for f in files]
    print("| variant | sum of means | 48 h: cost / OD, over optimum, missed | 60 h | 80 h |\n|---|---|---|---|---|")
    for spec in [args.only] if args.only is not None else GRID:
        total, cells = score(spec, recordings, 0 if args.set == "choose" else 1, args.every, args.optimum_cache)
        print(f"| {json.dumps(spec)} | {total:.4f} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
