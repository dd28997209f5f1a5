"""The cap to set's headroom (`spotrun estimate` only; the estimate Lambda's section carries null).

The cap to set (spotrun/policy/choose.py `spot_policy_at_caps`) is the least cap at which the estimate's own
generated traces (seed `SEED`, `N_TRACES` of them) read the odds the chosen policy must keep: the search stops at the
first cent where they do, so it has no margin. A new user's trial: llama3-8b with a 6 h deadline, a cent under it
94.3% met the deadline, a trainer 1% slower than the catalog's default utilization 94.4%, another seed of the same
generated traces 98.6%. `cap_to_set_headroom` says the cap to set's odds on two other draws of the traces
(`OTHER_SEEDS`) and with a trainer `SLOWER` slower than planned, and names a cap with headroom: the least cap at
which the chosen policy keeps its odds on `FIT_SEED` with a trainer `SLOWER` slower (benchmarks/cap_headroom_bench.py
checks both caps on seeds it was not fitted on).

A trainer slower than planned is modelled as the speed margin is (spotrun/planner/segments.py `speed_margin`): the
simulated plan's training time and step time are `1 + SLOWER` times the planned ones, while the cap's chain of jobs
and the guard's figures stay the planned ones (the guard plans with the planned seconds per step). The traces are
the same draws at either speed (their horizon is the planned run's).

The limit: 1,000 traces read a share near 99% to about 0.3 points (the standard error of a share p over n draws,
sqrt(p (1 - p) / n)), so on a fresh draw a cap fitted on one seed may read a few tenths under its odds.
"""

from __future__ import annotations

import dataclasses
import math

from ..planner.segments import segments_at
from . import executed, summarize
from .choose import (
    CONFIDENCE,
    ESTIMATE_TRACES,
    cents_up,
    horizon_s,
    policy_plans,
    run_plan,
    traces_for_estimate,
)
from .policies import describe
from .traces import TraceSpec, generated_traces

OTHER_SEEDS = (1, 2)  # other draws of the estimate's generated traces, its own being choose.SEED (0)
FIT_SEED = 1  # the draw the cap with headroom is searched on (with a trainer SLOWER slower)
SLOWER = 0.10  # a trainer this share slower than planned
HEADROOM_RAISES = 8  # raises of the cap to set (1% of it, 2%, 4%, ...) tried before the bisection to the cent


class ChosenRows:
    """The chosen policy's runs at a cap, on one draw of the traces and at one trainer speed, each draw generated
    once: its row (`at`), or whether at most `allowed` of its runs miss the odds (`misses_at_most`), told by the
    runs likeliest to miss first (those that missed at a cap tried before on the same draw and speed), then the
    others in growing batches: a cap that fails stops at the batch that shows it (a cap that holds executes every
    trace either way; spotrun/policy/choose.py `_Unfinished` does the same for the cap to set's search)."""

    def __init__(self, run, est, catalog: dict, candidate: tuple[str, str], poll: dict, key: str = "p_finished"):
        self.run, self.est, self.catalog, self.candidate, self.poll = run, est, catalog, candidate, poll
        self.key = key  # "p_deadline": a run misses unless it finishes by the deadline; else unless it finishes
        self.traces: dict = {}
        self.likely: dict = {}  # (seed, slower) -> the traces that missed at a cap tried, the latest first
        self.executions = 0  # the traces' runs executed

    def _plan(self, cap: float, seed: int, slower: float):
        jobs = segments_at(self.est.segments, cap)
        run = dataclasses.replace(self.run, max_usd=cap)
        est = dataclasses.replace(self.est, segments=dataclasses.replace(self.est.segments, segments=jobs))
        plan = run_plan(run, est, self.catalog, poll_s=self.poll["poll_s"], max_poll_s=self.poll["max_poll_s"])
        n = traces_for_estimate(plan, est.interruptions_per_hour, self.poll["n"], est.mean_wait_seconds)
        spec = TraceSpec(interruptions_per_hour=est.interruptions_per_hour, horizon_s=horizon_s(plan),
                         **ESTIMATE_TRACES, mean_wait_s=est.mean_wait_seconds)
        if (spec, n, seed) not in self.traces:
            self.traces[spec, n, seed] = generated_traces(spec, n, seed)
        its = policy_plans(run, est, plan)(self.candidate[0])
        if slower:
            its = dataclasses.replace(its, work_s=its.work_s * (1 + slower), step_s=its.step_s * (1 + slower))
        return its, self.traces[spec, n, seed]

    def _missed(self, plan, tally) -> bool:
        if self.key == "p_deadline":
            return not (tally.finished and tally.t <= plan.deadline_s + 1e-6)  # as `summarize` counts it
        return not tally.finished

    def _run(self, plan, traces: list, which: list[int]) -> list:
        self.executions += len(which)
        return executed(plan, [traces[i] for i in which], *self.candidate)

    def at(self, cap: float, seed: int, slower: float = 0.0):
        """The chosen policy's row at `cap` on draw `seed`, the trainer `slower` slower than planned."""
        its, traces = self._plan(cap, seed, slower)
        tallies = self._run(its, traces, list(range(len(traces))))
        self.likely[seed, slower] = [i for i, t in enumerate(tallies) if self._missed(its, t)]
        policy, checkpointing = self.candidate
        return summarize(its, describe(policy, checkpointing), policy, checkpointing, tallies, cap_usd=cap)

    def misses_at_most(self, cap: float, seed: int, slower: float, allowed: int) -> bool:
        """Whether at most `allowed` of the runs at `cap` on draw `seed` (the trainer `slower` slower) miss."""
        its, traces = self._plan(cap, seed, slower)
        likely = self.likely.get((seed, slower), [])
        first = set(likely)
        order = [*likely, *(i for i in range(len(traces)) if i not in first)]
        size = max(32, 2 * (allowed + 1))  # growing batches: the likeliest first
        batches = [order[size * ((1 << k) - 1):size * ((1 << (k + 1)) - 1)] for k in range(len(order).bit_length())]
        missed: list[int] = []
        for which in batches:
            if not which:
                break
            missed += [i for i, t in zip(which, self._run(its, traces, which), strict=True) if self._missed(its, t)]
            if len(missed) > allowed:
                break
        self.likely[seed, slower] = [*missed, *(i for i in likely if i not in set(missed))]
        return len(missed) <= allowed


def cap_to_set_headroom(run, est, catalog: dict, *, poll_s: float = 60.0, max_poll_s: float = 4 * 3600.0,
                        n: int = 1000) -> dict | None:
    """The cap to set's odds on `OTHER_SEEDS` and with a trainer `SLOWER` slower, and the least cap at which the
    chosen policy (the one proven at the cap to set, `cap_to_set_row`) keeps its odds on `FIT_SEED` with a trainer
    `SLOWER` slower: raised from the cap to set (1%, 2%, 4%, ... of it) until it does, then bisected to the cent.
    Null where no cap to set was proven on simulations, or where it is another layout's (`cap_to_set_layout`: its
    estimate is not this one). `headroom_cap_usd` is null where no raise tried keeps the odds."""
    section = est.spot_policy
    row = section.cap_to_set_row if section is not None else None
    cap = section.cap_to_set_usd if section is not None else None
    if row is None or cap is None or not math.isfinite(cap) or section.cap_to_set_layout or \
            not (est.segments and est.segments.chain_costs):
        return None
    key = "p_deadline" if run.compute.deadline_s is not None else "p_finished"
    odds = min(CONFIDENCE, row[key])  # what the policy keeps at the cap to set (its rows are rounded to 4 places)
    need = odds - 0.00005
    rows = ChosenRows(run, est, catalog, (row["policy"], row["checkpointing"]),
                      {"poll_s": poll_s, "max_poll_s": max_poll_s, "n": n}, key)

    def share(at: float, seed: int, slower: float = 0.0) -> float:
        return getattr(rows.at(at, seed, slower), key)

    least = {f"seed_{seed}": share(cap, seed) for seed in OTHER_SEEDS}
    least["slower"] = share(cap, section.seed, SLOWER)

    at_fit = rows.at(cap, FIT_SEED, SLOWER)  # its misses are the traces the search executes first
    fitted = getattr(at_fit, key)
    allowed = at_fit.n - math.ceil(round(need * at_fit.n, 9))  # the runs that may miss: the odds kept on n traces

    def holds(at: float) -> bool:
        return rows.misses_at_most(at, FIT_SEED, SLOWER, allowed)

    headroom = cap if fitted >= need else None
    below, high, tries = cap, cap, 0
    while headroom is None and tries < HEADROOM_RAISES:
        below, high = high, cents_up(high + 0.01 * cap * 2 ** tries)
        tries += 1
        if holds(high):
            headroom = high
    if headroom is not None and headroom > cap:  # bisected to the cent between the last raise that failed and it
        low_c, high_c = round(below * 100), round(headroom * 100)
        while high_c - low_c > 1:
            mid = (low_c + high_c) // 2
            low_c, high_c = (low_c, mid) if holds(mid / 100) else (mid, high_c)
        headroom = high_c / 100
    return {"cap_usd": round(cap, 2), "policy": row["label"], "odds": key, "kept": round(odds, 4),
            "seeds": list(OTHER_SEEDS), "slower_share": SLOWER, "fit_seed": FIT_SEED,
            "least_cap": {k: round(v, 4) for k, v in least.items()},
            "least_cap_fit": round(fitted, 4),
            "headroom_cap_usd": headroom, "executions": rows.executions,
            "line": headroom_line(cap, key, odds, least, fitted, headroom, row["label"], n)}


def headroom_line(cap: float, key: str, odds: float, least: dict, fitted: float, headroom: float | None,
                  label: str, n: int) -> str:
    """The cap to set's headroom in one line (printed under the cap to set's line)."""
    what = "meets the deadline" if key == "p_deadline" else "finishes"
    other = " and ".join(f"{least[f'seed_{seed}']:.1%} on seed {seed}" for seed in OTHER_SEEDS)
    said = (f"headroom: the cap to set is the least cap at which the estimate's {n:,} traces (seed 0) read "
            f"{odds:.1%} or more; "
            f"at ${cap:,.2f} {label} {what} on {other} of the same generated traces, and on "
            f"{least['slower']:.1%} with a trainer {SLOWER:.0%} slower")
    if headroom is None:
        said += (f"; no cap up to {2 ** HEADROOM_RAISES - 1}% over it keeps {odds:.1%} on seed {FIT_SEED} with a "
                 f"trainer {SLOWER:.0%} slower")
    elif headroom <= cap:
        said += f"; it keeps {odds:.1%} on seed {FIT_SEED} with a trainer {SLOWER:.0%} slower ({fitted:.1%})"
    else:
        said += (f"; a cap with headroom: ${headroom:,.2f}, the least at which it keeps {odds:.1%} on seed "
                 f"{FIT_SEED} with a trainer {SLOWER:.0%} slower")
    se = math.sqrt(odds * (1 - odds) / n) if 0 < odds < 1 else 0.0
    # a few tenths near 99%; at odds far from it a point or more (a new user read "41% to about 1.6 points: a fresh
    # draw may read a few tenths under it")
    under = "a few tenths" if se < 0.005 else f"{se * 100:.1f} points or more"
    return said + (f" ({n:,} traces read {odds:.0%} to about {se * 100:.1f} points: a fresh draw may read {under} "
                   "under it)")
