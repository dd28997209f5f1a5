"""The deadline-aware spot policies against each other and the exact offline optimum on the public traces.

    python benchmarks/policy_bench.py --spot-traces DIR [--every-h 6] [--optimum-every 4] [--optimum-cache FILE]

The issue's setting (#26): every one-node trace of github.com/skypilot-org/spot-traces
(`availability/1-node/*/*.json` under DIR; not in this repository), 40 h of work, a 0.2 h changeover (a 600 s
startup, a 60 s restore and a 60 s save), spot at 0.35 of on-demand, saves on the notice, a job started every
`--every-h` hours of each trace (while the deadline fits in the recording), deadlines 48, 60 and 80 h. Each policy
runs as the state machine executes it (spotrun/policy/execution.py: the guard's polls, what it sees).

Choose and report on different windows: the traces in sorted path order alternate between the choose set (even
positions) and the held-out set (odd positions). Policy parameters were picked on the choose set only.

Two published policies are compared here only (neither is in RULES, each loses to the chosen one):
- `uniform_progress_code`: Uniform Progress as the authors' code (skypilot-org/sky-spot, `rc_cr_threshold`)
  behaves: back to spot whenever it can, no hysteresis; executed by the guard, which cannot see spot capacity
  from an on-demand job, that is a return as soon as the run is ahead of its line (`DeadlineRule("line",
  hysteresis=0)`).
- `ross`: a randomized threshold after ROSS (arXiv 2601.14612; only its abstract was available to us, so this is
  our reading of it, not the authors' algorithm): each run draws once the share w of its initial slack it
  spends waiting for spot, w ~ e^w / (e - 1) on [0, 1] (the randomized ski-rental density), then stays
  on-demand; one draw per window from a seeded generator.

And a bound, not a policy (measured here only; the guard cannot execute it): `probing_sighted` is
`probing_greedy` that sees the trace's spot capacity while on on-demand (as if the guard had a capacity signal
there): it leaves on-demand for spot after half an hour on it whenever spot is there, and only then. Set beside
probing_greedy, it shows how much of the gap to the optimum is the blindness of the probes.

And `probing_sentinel` (`SentinelGreedy`, in RULES: the guard executes it, spotrun/pipeline/guard.py): after
`SENTINEL_STINT_S` on an on-demand job it keeps a sentinel, a spot job of the run's instance type and count waiting
for capacity beside it (unbilled while it waits), looks at it at least every `SENTINEL_POLL_S`, and goes to spot at
the first poll that sees it with instances; the sentinel's spot seconds from capacity to its stop (and the stop's
120 s) are billed in its cost (spotrun/policy/execution.py). Its two parameters were chosen on the choose set
(docs/spot-policy.md, "Closing the gap to the optimum").

The exact optimum (spotrun/policy/optimum.py) takes about a second per window: it runs on every
`--optimum-every`-th window, and the gap to it is each policy's mean on those same windows over the optimum's,
on the windows where the solver reports its answer exact (past its cap it returns a floor; the count is printed).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import random
from pathlib import Path

from spotrun.policy.decision import (
    DEADLINE_RULES,
    RULES,
    Action,
    DeadlineRule,
    Decision,
    JobStatus,
    Market,
    Observation,
    ProbingGreedy,
    SentinelGreedy,
    risk_s,
    slack_s,
)
from spotrun.policy.engine import SimPlan
from spotrun.policy.execution import execute
from spotrun.policy.optimum import solve
from spotrun.policy.traces import read_availability, replay

DEADLINES_H = (48, 60, 80)
WORK_H = 40.0
AFTER_DEADLINE_H = 200.0  # trace kept past the deadline: a late run still finishes on the recording


def setting(deadline_h: float) -> SimPlan:
    return SimPlan(work_s=WORK_H * 3600, startup_s=600, restore_s=60, save_s=60, interval_s=1800, step_s=10,
                   notice_ok=True, spot_usd_per_h=0.35, on_demand_usd_per_h=1.0, deadline_s=deadline_h * 3600)


def windows(recordings: list, deadline_h: float, every_h: float) -> list[tuple[int, list]]:
    """(trace position, the trace seen by a job started there) every `every_h` hours of each recording."""
    out = []
    for n, rec in enumerate(recordings):
        offset = 0.0
        while offset + deadline_h * 3600 <= rec.length_s:
            out.append((n, replay(rec, offset, (deadline_h + AFTER_DEADLINE_H) * 3600)))
            offset += every_h * 3600
    return out


BASELINES = ("uniform_progress_code", "ross", "probing_sighted")  # probing_sentinel is in DEADLINE_RULES
SIGHTED_STINT_S = 1800.0  # probing_sighted's least time on an on-demand job before it goes back to spot
SENTINEL_STINT_S = RULES["probing_sentinel"].stint_s  # least time on an on-demand job before its sentinel (chosen)
SENTINEL_POLL_S = RULES["probing_sentinel"].sentinel_poll_s  # the longest wait between the guard's looks at it
ROSS_SEED = 0


@contextlib.contextmanager
def registered(name: str, rule):
    """A rule of this benchmark's under `name` while it runs (execute looks policies up by name in RULES)."""
    RULES[name] = rule
    try:
        yield name
    finally:
        del RULES[name]


def ross_rule(plan: SimPlan, rng: random.Random) -> ProbingGreedy:
    """One run's ROSS threshold (see the module docstring): wait until a drawn share of the slack is spent."""
    start = slack_s(plan, "notice", Observation(0.0, 0.0, Market.SPOT, JobStatus.NONE)) - risk_s(plan, "notice")
    waited = math.log(1 + rng.random() * (math.e - 1))
    return ProbingGreedy(reserve=(1 - waited) * start / plan.changeover_s, stint_s=math.inf)


def sighted_rule(trace: list):
    """probing_greedy that sees `trace`'s capacity while on on-demand (see the module docstring; a bound only)."""
    chosen = RULES["probing_greedy"]

    def rule(plan: SimPlan, ck: str, obs: Observation) -> Decision:
        decision = ProbingGreedy(chosen.reserve, math.inf, chosen.keep)(plan, ck, obs)
        if obs.market is not Market.ON_DEMAND or obs.status is not JobStatus.RUNNING or \
                decision.action is not Action.KEEP:
            return decision
        if slack_s(plan, ck, obs) - plan.changeover_s <= risk_s(plan, ck) + chosen.keep * plan.changeover_s:
            return decision  # no probe fits: on-demand to the end
        there = any(a <= obs.elapsed_s < b for a, b in trace)
        if there and obs.job_age_s >= SIGHTED_STINT_S:
            return Decision(Action.TO_SPOT, plan.poll_s)
        return Decision(Action.KEEP, 900.0)

    return rule


def outcome(plan: SimPlan, trace: list, policy: str, runs: list | None = None, **sentinel) -> tuple[float, bool]:
    """(cost / on-demand from the start, deadline met); `runs`: the execution appended to it; `sentinel`: the
    sentinel's assumptions (execute's sentinel_lag_s, sentinel_stop_s)."""
    od = plan.work_s / 3600 * plan.on_demand_usd_per_h
    run = execute(plan, trace, policy, "notice", horizon_s=plan.deadline_s + AFTER_DEADLINE_H * 3600, **sentinel)
    if runs is not None:
        runs.append(run)
    tally = run.tally
    usd = (tally.spot_s * plan.spot_usd_per_h + tally.od_s * plan.on_demand_usd_per_h) / 3600
    return usd / od, tally.finished and tally.t <= plan.deadline_s + 1e-6


def sentinel_line(plan: SimPlan, runs: list) -> str:
    """What probing_sentinel's sentinels did, over all windows: how many per run, their bill, the guard's polls."""
    od = plan.work_s * plan.on_demand_usd_per_h
    bill = sum(r.sentinel_s for r in runs) * plan.spot_usd_per_h / od / len(runs)
    polls = [r.polls for r in runs]
    return (f"  probing_sentinel, all {len(runs)} windows: {sum(r.sentinels for r in runs) / len(runs):.2f} "
            f"sentinels and {sum(len(r.jobs) for r in runs) / len(runs):.2f} training jobs per run, "
            f"sentinel bill {bill:.4f} of on-demand per run (mean), "
            f"guard polls per run {sum(polls) / len(polls):.0f} mean, {max(polls)} max")


SENTINEL_RUNS: list = []  # the last probing_sentinel executions (for `sentinel_line`)
SENTINEL_MODEL: dict = {}  # --sentinel-lag-s, --sentinel-stop-s, --sentinel-poll-s when given


def outcomes(plan: SimPlan, traces: list, policy: str) -> list[tuple[float, bool]]:
    """(cost / on-demand from the start, deadline met) per trace."""
    if policy == "uniform_progress_code":
        with registered("_bench", DeadlineRule("line", hysteresis=0.0)) as name:
            return [outcome(plan, trace, name) for trace in traces]
    if policy == "ross":
        rng, out = random.Random(ROSS_SEED), []
        for trace in traces:
            with registered("_bench", ross_rule(plan, rng)) as name:
                out.append(outcome(plan, trace, name))
        return out
    if policy == "probing_sentinel":
        model = dict(SENTINEL_MODEL)
        rule = SentinelGreedy(RULES["probing_greedy"].reserve, SENTINEL_STINT_S, model.pop("poll_s", SENTINEL_POLL_S))
        SENTINEL_RUNS.clear()
        with registered("_bench", rule) as name:
            return [outcome(plan, trace, name, SENTINEL_RUNS, **model) for trace in traces]
    if policy == "probing_sighted":
        out = []
        for trace in traces:
            with registered("_bench", sighted_rule(trace)) as name:
                out.append(outcome(plan, trace, name))
        return out
    return [outcome(plan, trace, policy) for trace in traces]


def optima(plan: SimPlan, ws: list, sampled: list[int], cache: Path | None) -> dict[int, float]:
    """The exact optimum's cost / on-demand on each sampled window where the solver says it is exact (past its
    cap it returns a floor, not the optimum). `cache`: a JSON file of earlier answers, keyed by the setting (a
    hash of the plan), trace position, window and start offset; the windows it lacks are solved and added."""
    stored = json.loads(cache.read_text()) if cache is not None and cache.exists() else {}
    od = plan.work_s / 3600 * plan.on_demand_usd_per_h
    out, added = {}, False
    setting_key = hashlib.sha256(repr(plan).encode()).hexdigest()[:16]  # a changed setting misses the cache
    for i in sampled:
        key = f"{setting_key}/{ws[i][0]}/{i}/{ws[i][1][0][0]:.3f}"
        if key not in stored:
            o = solve(plan, ws[i][1])
            stored[key], added = (o.usd / od if o.exact and o.usd is not None else None), True
        if stored[key] is not None:
            out[i] = stored[key]
    if cache is not None and added:
        cache.write_text(json.dumps(stored, indent=0, sort_keys=True))
    return out


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")  # no exact optimum among the sampled windows


def table(recordings: list, names: list[str], every_h: float, optimum_every: int, policies: list[str],
          deadlines: tuple[float, ...] = DEADLINES_H, cache: Path | None = None) -> list[str]:
    rows = ["| deadline | policy | choose: cost / OD | choose: over optimum | choose: missed | held-out: cost / OD | "
            "held-out: over optimum | held-out: missed | all 17: cost / OD | all: over optimum |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for deadline in deadlines:
        plan = setting(deadline)
        ws = windows(recordings, deadline, every_h)
        sets = {"choose": [i for i, (n, _) in enumerate(ws) if n % 2 == 0],
                "held-out": [i for i, (n, _) in enumerate(ws) if n % 2 == 1], "all": list(range(len(ws)))}
        sampled = list(range(0, len(ws), optimum_every))
        floor = optima(plan, ws, sampled, cache)
        print(f"{deadline} h: {len(ws)} windows ({len(sets['choose'])} choose, {len(sets['held-out'])} held out); "
              f"exact optimum on {len(floor)} of {len(sampled)} sampled: {_mean(list(floor.values())):.3f} of "
              "on-demand", flush=True)
        for policy in policies:
            res = outcomes(plan, [t for _, t in ws], policy)
            cells = []
            for key in ("choose", "held-out", "all"):
                idx = sets[key]
                opt_idx = [i for i in idx if i in floor]
                gap = _mean([res[i][0] for i in opt_idx]) / _mean([floor[i] for i in opt_idx]) - 1
                cells += [f"{_mean([res[i][0] for i in idx]):.3f}", f"{gap:+.1%}"]
                if key != "all":
                    cells.append(str(sum(1 for i in idx if not res[i][1])))
            rows.append(f"| {deadline} h | {policy} | " + " | ".join(cells) + " |")
            print(rows[-1], flush=True)
            if policy == "probing_sentinel":
                print(sentinel_line(plan, SENTINEL_RUNS), flush=True)
        rows.append(f"| {deadline} h | exact optimum | {_mean([floor[i] for i in sets['choose'] if i in floor]):.3f} | "
                    f"| | {_mean([floor[i] for i in sets['held-out'] if i in floor]):.3f} | | | "
                    f"{_mean(list(floor.values())):.3f} | |")
    head = f"{len(recordings)} traces: choose set {', '.join(names[0::2])}; held out {', '.join(names[1::2])}"
    return [head, ""] + rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spot-traces", type=Path, required=True,
                        help="the extracted skypilot-org/spot-traces repository")
    parser.add_argument("--every-h", type=float, default=6.0, help="hours between job starts in each trace")
    parser.add_argument("--optimum-every", type=int, default=4, help="the exact optimum on every k-th window")
    parser.add_argument("--optimum-cache", type=Path,
                        help="a JSON file of the optimum's answers: read, and extended with the windows it lacks")
    parser.add_argument("--deadline", type=float, action="append", help="only these deadlines, hours (repeatable)")
    parser.add_argument("--policy", action="append", choices=DEADLINE_RULES + BASELINES,
                        help="only these (repeatable)")
    parser.add_argument("--sentinel-poll-s", type=float,
                        help=f"probing_sentinel: the longest wait between looks at it (default {SENTINEL_POLL_S})")
    parser.add_argument("--sentinel-lag-s", type=float,
                        help="probing_sentinel: seen with instances only this long into a window (default 0)")
    parser.add_argument("--sentinel-stop-s", type=float,
                        help="probing_sentinel: seconds billed at a stop with instances (default 120)")
    args = parser.parse_args()
    for key, value in (("poll_s", args.sentinel_poll_s), ("sentinel_lag_s", args.sentinel_lag_s),
                       ("sentinel_stop_s", args.sentinel_stop_s)):
        if value is not None:
            SENTINEL_MODEL[key] = value
    files = sorted(args.spot_traces.rglob("availability/1-node/*/*.json"))
    if not files:
        raise SystemExit(f"--spot-traces {args.spot_traces}: no availability/1-node/*/*.json under it")
    recordings = [read_availability(f) for f in files]
    names = [f"{f.parent.name}/{f.stem}" for f in files]
    policies = args.policy or list(DEADLINE_RULES + BASELINES)
    print("\n".join(table(recordings, names, args.every_h, args.optimum_every, policies,
                           tuple(args.deadline or DEADLINES_H), args.optimum_cache)))


if __name__ == "__main__":
    main()
