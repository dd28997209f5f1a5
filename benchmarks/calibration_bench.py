"""The estimate's P(deadline) against the frequency the executed runs meet it on the public traces.

    python benchmarks/calibration_bench.py --spot-traces DIR [--set held-out] [--every-h 6] [--n 1000]
    python benchmarks/calibration_bench.py --spot-traces DIR --set held-out --stretches 1000
    python benchmarks/calibration_bench.py --spot-traces DIR --set choose --windows 1000 --deadlines 48
    python benchmarks/calibration_bench.py --spot-traces DIR --set choose --cycles 20
    python benchmarks/calibration_bench.py --spot-traces DIR --set choose --unavailable 200 --deadlines 40,48,60,80
    python benchmarks/calibration_bench.py --spot-traces DIR --set held-out --waits recorded
    python benchmarks/calibration_bench.py --spot-traces DIR --set held-out --cap-x 0.8
    python benchmarks/calibration_bench.py --spot-traces DIR --set held-out --cap-x 0.8 --bills 200
    python benchmarks/calibration_bench.py --spot-traces DIR --set loo --cap-x 1.0 --fits /tmp/loo-fits.pickle
    python benchmarks/calibration_bench.py --spot-traces DIR --set loo --cap-x 0.8 --fits FITS --cells CELLS.json
    python benchmarks/calibration_bench.py --spot-traces DIR --set loo --fits FITS --unavailable 1000 --recordings R

The setting is benchmarks/policy_bench.py's (#26: 40 h of work, a 0.2 h changeover, spot at 0.35 of on-demand,
saves on the notice, deadlines 48, 60 and 80 h) on every one-node trace of github.com/skypilot-org/spot-traces
(`availability/1-node/*/*.json` under DIR; not in this repository), a job started every `--every-h` hours of each
recording while the deadline fits in it. `--set held-out` (the default): the traces at odd positions in sorted path
order, which the choose set's availability models (spotrun/policy/availability.py: `CHAIN` and the others of `--model`)
were not fitted on; `choose`: the 9 they were fitted on (benchmarks/fit_availability.py); `all`; `loo`: all 17, each
recording's estimate drawn from the model (`--model`) fitted by benchmarks/fit_availability.py's procedure on the other
16 (leave one recording out: every window is out of sample, the figure for a model fitted on all 17; `--fits FILE` keeps
the 17 fits between runs).

- Observed: every candidate the estimate offers (spotrun/policy/choose.py: `candidates`) executed on every window
  as the state machine runs it (spotrun/policy/execution.py, the model benchmarks/replay_bench.py replays through
  the rendered state machine): the fraction of windows that finished by the deadline.
- Estimated: what the estimate prints for a run on that recording's capacity: its P(deadline) over `--n`
  generated traces (choose.py's `ESTIMATE_TRACES`: the fitted model; seed 0) at the recording's own interruption
  rate (its windows per available hour, as the interruption recorder would measure it), averaged over the windows.
  `--waits recorded`: each recording's estimate also given its own mean wait for capacity (the mean gap between
  its windows, as the recorder's waits would measure it), as an estimate with recorded waits is; `model` (the
  default): the waits' mean from the model's power law at the rate.
The difference, per deadline and candidate, is the estimate's calibration on recorded capacity; beside it, the 5th
and 95th percentiles of that difference over the recordings resampled with replacement (their windows together),
which says how much of it a different handful of recordings would move.

At a cap (`--cap-usd USD`, or `--cap-x X`: X times the run's bill on-demand from the start at each deadline), both
sides execute every candidate with the cap modelled as the cost guard holds it (`SimPlan.cap_usd`, its chain
figures from this setting: spotrun/policy/execution.py `Cap`), as the estimate does at a run's cap: a run the cap
ends (OverBudget, unfinished) misses the deadline, so P(deadline) is finishing by the deadline inside the cap.
Beside each row, the share of runs the cap ended (estimated / observed). `--bills N` instead executes every
candidate without the cap (N generated traces per recording) and prints, estimated / observed, the share of bills
over the cap, the mean bill and the mean on-demand hours: where the cap's odds come from.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import pickle
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.fit_availability import fit_model, weighted_quantile  # noqa: E402
from benchmarks.policy_bench import AFTER_DEADLINE_H, DEADLINES_H, setting, windows  # noqa: E402
from spotrun.contract.spec import MAX_RUNTIME_LIMIT_S  # noqa: E402
from spotrun.planner.segments import ChainCosts  # noqa: E402
from spotrun.policy import compare, summarize  # noqa: E402
from spotrun.policy import traces as _traces  # noqa: E402
from spotrun.policy.availability import (  # noqa: E402
    BOOTSTRAP,
    BOOTSTRAP_RECORDED_WAITS,
    CHAIN,
    CHAIN_DROUGHTS,
    CHAIN_DROUGHTS_LEVEL,
    fitted_trace,
)
from spotrun.policy.choose import ESTIMATE_TRACES, candidates, horizon_s  # noqa: E402
from spotrun.policy.engine import INF  # noqa: E402
from spotrun.policy.execution import execute  # noqa: E402
from spotrun.policy.policies import cost_usd, describe  # noqa: E402
from spotrun.policy.traces import TraceSpec, generated_traces, read_availability  # noqa: E402

MODELS = {"regimes": CHAIN, "droughts": CHAIN_DROUGHTS, "droughts-level": CHAIN_DROUGHTS_LEVEL,
          "bootstrap": BOOTSTRAP, "bootstrap-recorded-waits": BOOTSTRAP_RECORDED_WAITS}


def use_chain(model) -> None:
    """Draw the estimate's generated traces from `model` (a `Chain` or `Bootstrap`) in this process."""
    _traces.fitted_trace = functools.partial(fitted_trace, chain=model)


def left_out_models(paths: list[Path], recordings: list, name: str, fits: Path | None = None) -> list:
    """Per recording, availability model `name` fitted (benchmarks/fit_availability.py `fit_model`, the procedure
    the estimate's models are fitted by) on every other recording: leave-one-recording-out. `fits`: a file that keeps
    them between runs (read when it holds this model fitted on these recordings, else written)."""
    key = (name, tuple(f"{p.parent.name}/{p.stem}" for p in paths))
    if fits is not None and fits.exists():
        with fits.open("rb") as f:
            kept = pickle.load(f)
        if key in kept:
            return kept[key]
    else:
        kept = {}
    base = kept.get(("regimes", key[1])) or [None] * len(recordings)  # the chains the other models build on
    models = [fit_model(name, recordings[:k] + recordings[k + 1:], base[k]) for k in range(len(recordings))]
    if fits is not None:
        kept[key] = models
        with fits.open("wb") as f:
            pickle.dump(kept, f)
    return models


def use_model(name: str) -> None:
    """Draw the estimate's generated traces (and `--cycles`') from availability model `name` in this process:
    `regimes` (CHAIN, the choose set's fit), `droughts` (CHAIN_DROUGHTS), `droughts-level` (CHAIN_DROUGHTS_LEVEL: with
    each trace's own level of waits), `bootstrap` (BOOTSTRAP: the choose set's recorded cycles resampled in blocks,
    the waits rescaled by the rate's power law) or `bootstrap-recorded-waits` (the waits in recorded seconds); each
    the choose set's fit (the estimate's own model, ESTIMATE_CHAIN, is droughts-level's procedure fitted on all 17:
    `--set loo --model droughts-level` is its out-of-sample figure)."""
    global CHAIN
    CHAIN = MODELS[name]
    use_chain(MODELS[name])


def recorded_rate(rec) -> float:
    """Interruptions per available hour: every window but an open last one ends in an interruption."""
    return len(rec.windows) / (sum(b - a for a, b in rec.windows) / 3600)


def recorded_wait(rec) -> float:
    """The mean wait for capacity after an interruption, in seconds: the gaps between the recording's windows."""
    w = rec.windows
    gaps = [a2 - b for (_, b), (a2, _) in zip(w, w[1:], strict=False)]
    return sum(gaps) / len(gaps)


def trace_spec(plan, rec, waits: str = "model") -> TraceSpec:
    """The estimate's traces for a run on `rec`'s capacity: at its rate, and (`waits="recorded"`) its mean wait."""
    return TraceSpec(interruptions_per_hour=recorded_rate(rec), horizon_s=horizon_s(plan), **ESTIMATE_TRACES,
                     mean_wait_s=recorded_wait(rec) if waits == "recorded" else None)


def estimated(plan, spec: TraceSpec, n: int, todo: list[tuple[str, str]], seed: int = 0) -> dict:
    """The estimate's P(deadline) per candidate label for a run on `spec`'s traces (drawn from `seed`: the
    estimate's is 0)."""
    return {r.label: r.p_deadline for r in compare(plan, generated_traces(spec, n, seed), todo)}


def on_demand_usd(plan) -> float:
    """The run's bill on-demand from the start (uninterrupted, no cap): what `--cap-x` multiplies."""
    uncapped = dataclasses.replace(plan, cap_usd=None, chain_costs=None)
    return sum(cost_usd(uncapped, execute(uncapped, [(0.0, INF)], "on_demand", "notice").tally))


def capped(plan, cap_usd: float):
    """`plan` with the cap modelled as the cost guard holds it: the guard's chain figures from the setting (on-demand
    rates as the bound while a job runs, the spot share, a first start of the start-up, a later one with the
    restore, the save, one step; no job longer than SageMaker's 28 days)."""
    costs = ChainCosts(usd_per_s=plan.on_demand_usd_per_h / 3600,
                       spot_fraction=plan.spot_usd_per_h / plan.on_demand_usd_per_h, startup_s=plan.startup_s,
                       restart_s=plan.startup_s + plan.restore_s, save_s=plan.save_s, longest_s=MAX_RUNTIME_LIMIT_S,
                       step_s=plan.step_s)
    return dataclasses.replace(plan, cap_usd=cap_usd, chain_costs=costs)


def estimated_at_cap(plan, spec: TraceSpec, n: int, todo: list[tuple[str, str]], seed: int = 0) -> dict:
    """`estimated` with, per label, (P(deadline), the share of runs the cap ended): `compare`'s rows, the runs
    kept to count those ended at the cap."""
    traces = generated_traces(spec, n, seed)
    out = {}
    for p, ck in todo:
        runs = [execute(plan, trace, p, ck) for trace in traces]
        row = summarize(plan, describe(p, ck), p, ck, [r.tally for r in runs])
        out[row.label] = (row.p_deadline, sum(r.over_budget for r in runs) / len(runs), run_figures(plan, runs))
    return out


def run_figures(plan, runs: list) -> dict:
    """Means over runs (`execute`'s) of what their odds are made of: the bill, the on-demand and spot hours, the
    hours to finish (finished runs), the share finished by the deadline, finished after it, ended at the cap."""
    done = [r.tally.t for r in runs if r.tally.finished]
    return {"bill": sum(sum(cost_usd(plan, r.tally)) for r in runs) / len(runs),
            "od_h": sum(r.tally.od_s for r in runs) / len(runs) / 3600,
            "spot_h": sum(r.tally.spot_s for r in runs) / len(runs) / 3600,
            "finish_h": sum(done) / len(done) / 3600 if done else None,
            "met": sum(r.tally.finished and r.tally.t <= plan.deadline_s + 1e-6 for r in runs) / len(runs),
            "late": sum(r.tally.finished and r.tally.t > plan.deadline_s + 1e-6 for r in runs) / len(runs),
            "ended": sum(r.over_budget for r in runs) / len(runs)}


def bill_rows(recordings: list, deadline_h: float, every_h: float, n: int, policies: list[str] | None,
              cap_usd: float | None, cap_x: float | None, waits: str = "model") -> list[str]:
    """Per candidate executed without the cap, estimated (`n` generated traces per recording, weighted by its
    windows) / observed (the recorded windows): the share of bills over the cap, the mean bill, the mean on-demand
    hours."""
    plan = setting(deadline_h)
    cap = cap_usd if cap_x is None else cap_x * on_demand_usd(plan)
    todo = windows(recordings, deadline_h, every_h)
    per_rec = [sum(1 for i, _ in todo if i == k) / len(todo) for k in range(len(recordings))]
    rows = []
    for policy, ck in [(p, ck) for p, ck in candidates(plan) if policies is None or p in policies]:
        est = [0.0, 0.0, 0.0]
        for k, rec in enumerate(recordings):
            if not per_rec[k]:
                continue
            tallies = [execute(plan, t, policy, ck).tally for t in generated_traces(trace_spec(plan, rec, waits), n, 0)]
            bills = [sum(cost_usd(plan, t)) for t in tallies]
            figures = (sum(b > cap + 1e-9 for b in bills), sum(bills), sum(t.od_s for t in tallies) / 3600)
            for j, v in enumerate(figures):
                est[j] += per_rec[k] * v / n
        tallies = [execute(plan, t, policy, ck, horizon_s=plan.deadline_s + AFTER_DEADLINE_H * 3600).tally
                   for _, t in todo]
        bills = [sum(cost_usd(plan, t)) for t in tallies]
        obs = [sum(b > cap + 1e-9 for b in bills) / len(bills), sum(bills) / len(bills),
               sum(t.od_s for t in tallies) / 3600 / len(tallies)]
        rows.append(f"| {deadline_h:g} h | ${cap:,.2f} | {describe(policy, ck)} | {len(todo)} | {est[0]:.1%} / "
                    f"{obs[0]:.1%} | ${est[1]:,.2f} / ${obs[1]:,.2f} | {est[2]:.2f} / {obs[2]:.2f} |")
    return rows


def observed(plan, trace: list, policy: str, ck: str, figures: list | None = None) -> tuple[bool, bool]:
    """(met the deadline, the cap ended the run) on one recorded window; `figures`: `run_figures` of the run
    appended to it."""
    run = execute(plan, trace, policy, ck, horizon_s=plan.deadline_s + AFTER_DEADLINE_H * 3600)
    if figures is not None:
        figures.append(run_figures(plan, [run]))
    return run.tally.finished and run.tally.t <= plan.deadline_s + 1e-6, run.over_budget


def calibrate(recordings: list, deadline_h: float, every_h: float, n: int, policies: list[str] | None,
              seed: int = 0, waits: str = "model", cap_usd: float | None = None, cap_x: float | None = None,
              models: list | None = None, cells: dict | None = None) -> list[tuple]:
    """(candidate, mean estimated P, observed frequency, windows, the difference's 90% interval) at one deadline;
    with a cap (`cap_usd`, or `cap_x` times the bill on-demand), also the shares of runs the cap ended (estimated,
    observed) and the cap. `models`: per recording, the availability model its estimate draws from (leave one
    out: `left_out_models`); None: the one in use. `cells` (with a cap): filled, per candidate label, with each
    recording's estimate (`run_figures` of its generated runs) and each window's executed run (its recording, its
    `run_figures`): what benchmarks/calibration_residuals.py reads."""
    plan = setting(deadline_h)
    cap = cap_usd if cap_x is None else cap_x * on_demand_usd(plan)
    if cap is not None:
        plan = capped(plan, cap)
    todo = windows(recordings, deadline_h, every_h)
    offered = [(p, ck) for p, ck in candidates(plan) if policies is None or p in policies]
    est = []
    for k, rec in enumerate(recordings):
        if models is not None:
            use_chain(models[k])
        if cap is None:
            est.append({lab: (v, 0.0) for lab, v in estimated(plan, trace_spec(plan, rec, waits), n, offered,
                                                              seed).items()})
        else:
            est.append(estimated_at_cap(plan, trace_spec(plan, rec, waits), n, offered, seed))
    out = []
    for policy, ck in offered:
        label = describe(policy, ck)
        figs: list | None = [] if cells is not None and cap is not None else None
        seen = [observed(plan, trace, policy, ck, figs) for _, trace in todo]
        if figs is not None:
            cells[label] = {"estimated": [e[label][2] for e in est],
                            "windows": [[i, f] for (i, _), f in zip(todo, figs, strict=True)]}
        met = [m for m, _ in seen]
        promised = [est[i][label][0] for i, _ in todo]
        off = [(i, p - m) for (i, _), p, m in zip(todo, promised, met, strict=True)]
        row = (label, sum(promised) / len(promised), sum(met) / len(met), len(todo), interval(off))
        if cap is not None:
            row += (sum(est[i][label][1] for i, _ in todo) / len(todo), sum(o for _, o in seen) / len(seen), cap)
        out.append(row)
    return out


def lost_at_end(plan, up_s: float) -> float:
    """Work a job with periodic saves only loses when a stretch with capacity of `up_s` ends under it, the job
    having started at the stretch's start: nothing before its start-up is done, then cycles of the interval's
    training and a blocking save (work is committed at a save's end)."""
    trained = up_s - plan.startup_s - plan.restore_s
    return 0.0 if trained <= 0 else min(trained % (plan.interval_s + plan.save_s), plan.interval_s)


def stretch_rows(plan, recordings: list, names: list[str], n: int, waits: str = "model",
                 models: list | None = None) -> list[str]:
    """Per recording, its stretches with capacity against those of the estimate's `n` generated traces at its rate
    (seed 0): the share shorter than a start (start-up and restore: no work done, none lost) and the mean work a
    periodic-only job loses at a stretch's end (`lost_at_end`). `models`: per recording, the model its traces draw
    from (`calibrate`'s)."""
    start = plan.startup_s + plan.restore_s
    rows = []
    for k, (name, rec) in enumerate(zip(names, recordings, strict=True)):
        if models is not None:
            use_chain(models[k])
        rate, spec = recorded_rate(rec), trace_spec(plan, rec, waits)
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


def window_figures(plan, trace: list) -> dict:
    """What a MaxWait run's odds rest on in one trace's first `plan.deadline_s`: its interruptions per hour with
    capacity, its stretches with capacity shorter than a start and a save (nothing committed in them), its waits
    after an interruption; and each way of saving's run on it: met the deadline, and the interruptions the run
    with saves on the notice saw (the calm windows are the ones that meet it)."""
    end, start = plan.deadline_s, plan.startup_s + plan.restore_s + plan.save_s
    ups = [min(b, end) - a for a, b in trace if a < end]
    waits = [a2 - b for (_, b), (a2, _) in zip(trace, trace[1:], strict=False) if b < end and a2 < INF]
    runs = {ck: execute(plan, trace, "maxwait_fallback", ck, horizon_s=plan.deadline_s + AFTER_DEADLINE_H * 3600)
            for ck in ("notice", "periodic")}
    met = {ck: r.tally.finished and r.tally.t <= plan.deadline_s + 1e-6 for ck, r in runs.items()}
    return {"up_h": sum(ups) / 3600, "ends": sum(1 for a, b in trace if a < end and b < end),
            "short": sum(u < start for u in ups[:-1]), "stretches": max(0, len(ups) - 1), "waits": waits,
            "notice": met["notice"], "periodic": met["periodic"],
            "seen": runs["notice"].tally.interruptions if met["notice"] else None}


def _pooled(figs: list[dict], weight: float) -> dict:
    """Sums of `window_figures` over windows, each counted `weight` times."""
    seen = [f["seen"] for f in figs if f["seen"] is not None]
    waits = [w for f in figs for w in f["waits"]]
    return {"w": weight * len(figs), "up_h": weight * sum(f["up_h"] for f in figs),
            "ends": weight * sum(f["ends"] for f in figs), "short": weight * sum(f["short"] for f in figs),
            "stretches": weight * sum(f["stretches"] for f in figs), "waits": weight * sum(waits),
            "n_waits": weight * len(waits), "notice": weight * sum(f["notice"] for f in figs),
            "periodic": weight * sum(f["periodic"] for f in figs), "seen": weight * sum(seen),
            "n_seen": weight * len(seen)}


def _cells(acc: dict) -> list[str]:
    div = lambda a, b: a / b if b else float("nan")  # noqa: E731
    return [f"{div(acc['ends'], acc['up_h']):.2f}", f"{div(acc['short'], acc['stretches']):.0%}",
            f"{div(acc['waits'], acc['n_waits']) / 3600:.2f}", f"{div(acc['notice'], acc['w']):.1%}",
            f"{div(acc['periodic'], acc['w']):.1%}",
            f"{div(acc['notice'] - acc['periodic'], acc['w']) * 100:.1f}", f"{div(acc['seen'], acc['n_seen']):.1f}"]


def window_rows(plan, recordings: list, names: list[str], every_h: float, n: int, waits: str = "model") -> list[str]:
    """Per recording and pooled (each recording's generated figures weighted by its windows), the recorded windows'
    `window_figures` against those of the estimate's `n` generated traces at its rate (seed 0): recorded / generated."""
    rows, total = [], {"rec": {}, "gen": {}}
    for name, rec in zip(names, recordings, strict=True):
        todo = windows([rec], plan.deadline_s / 3600, every_h)
        spec = trace_spec(plan, rec, waits)
        sides = {"rec": _pooled([window_figures(plan, t) for _, t in todo], 1.0),
                 "gen": _pooled([window_figures(plan, t) for t in generated_traces(spec, n, 0)], len(todo) / n)}
        for side, acc in sides.items():
            for key, v in acc.items():
                total[side][key] = total[side].get(key, 0.0) + v
        rows.append(_window_row(name, len(todo), sides))
    rows.append(_window_row(f"all {len(recordings)}", len(
        [1 for rec in recordings for _ in windows([rec], plan.deadline_s / 3600, every_h)]), total))
    return rows


def _window_row(name: str, count: int, sides: dict) -> str:
    cells = [f"{r} / {g}" for r, g in zip(_cells(sides["rec"]), _cells(sides["gen"]), strict=True)]
    return f"| {name} | {count} | " + " | ".join(cells) + " |"


def cycle_rows(recordings: list, names: list[str], repeats: int, waits: str = "model") -> list[str]:
    """Recorded against generated (`repeats` traces as long as each recording, in cycles, at its rate): the
    correlation of log(stretch with capacity) one cycle apart, of log(wait) one cycle apart, and of a stretch's
    log with the wait after it, pooled over the recordings (each sequence centred on its own mean)."""
    def corr(pairs: list[tuple[float, float]]) -> float:
        mx, my = (sum(p[i] for p in pairs) / len(pairs) for i in (0, 1))
        sxy = sum((x - mx) * (y - my) for x, y in pairs)
        sxx, syy = sum((x - mx) ** 2 for x, _ in pairs), sum((y - my) ** 2 for _, y in pairs)
        return sxy / math.sqrt(sxx * syy)

    def figures(seqs: list[list[tuple[float, float]]]) -> list[float]:
        lag_up, lag_down, same = [], [], []
        for cyc in seqs:
            ups, downs = [math.log(u) for u, _ in cyc], [math.log(d) for _, d in cyc]
            mu, md = sum(ups) / len(ups), sum(downs) / len(downs)
            ups, downs = [u - mu for u in ups], [d - md for d in downs]
            lag_up += list(zip(ups, ups[1:], strict=False))
            lag_down += list(zip(downs, downs[1:], strict=False))
            same += list(zip(ups, downs, strict=True))
        return [corr(lag_up), corr(lag_down), corr(same)]

    rec_seqs, gen_seqs = [], []
    rng = random.Random(0)
    for rec in recordings:
        w = rec.windows
        rec_seqs.append([(b - a, a2 - b) for (a, b), (a2, _) in zip(w, w[1:], strict=False)])
        for _ in range(repeats):
            gen = CHAIN.cycles(recorded_rate(rec), rng, recorded_wait(rec) if waits == "recorded" else None)
            next(gen)  # the first cycle is a remainder
            gen_seqs.append([next(gen)[1:] for _ in range(len(w) - 1)])
    return [f"| {name} | " + " | ".join(f"{x:+.3f}" for x in figures(seqs)) + " |"
            for name, seqs in ((f"recorded ({len(names)} traces)", rec_seqs),
                               (f"generated ({repeats} per trace)", gen_seqs))]


def unavailable(trace: list, end_s: float) -> tuple[float, float]:
    """(hours without capacity, the longest single stretch without capacity in hours) in a trace's first `end_s`
    (a stretch cut by `end_s` counts up to it; a trace that starts without capacity, from 0)."""
    up, longest, t = 0.0, 0.0, 0.0
    for a, b in trace:
        if a >= end_s:
            break
        longest = max(longest, a - t)
        up += min(b, end_s) - a
        t = min(b, end_s)
    longest = max(longest, end_s - t)
    return (end_s - up) / 3600, longest / 3600


def unavailable_rows(recordings: list, deadline_h: float, every_h: float, n: int, set_name: str,
                     waits: str = "model", models: list | None = None) -> list[str]:
    """At one D (`deadline_h`), on the windows the calibration makes (a job started every `every_h` hours while D
    fits) and on the estimate's `n` generated traces per recording at its rate (seed 0; each recording's weighted
    by its windows, so both sides have the same counts): the hours without capacity in the first D hours (mean,
    P90, P95, P99, the share of windows over D / 4) and the longest single stretch without capacity (mean, P95,
    P99). `models`: per recording, the model its generated traces draw from (`calibrate`'s)."""
    plan = setting(deadline_h)
    end = deadline_h * 3600
    todo = windows(recordings, deadline_h, every_h)
    rec_side: list[tuple[tuple[float, float], float]] = [(unavailable(t, end), 1.0) for _, t in todo]
    gen_side: list[tuple[tuple[float, float], float]] = []
    for k, rec in enumerate(recordings):
        count = sum(1 for i, _ in todo if i == k)
        if count and models is not None:
            use_chain(models[k])
        if count:
            gen_side += [(unavailable(t, end), count / n)
                         for t in generated_traces(trace_spec(plan, rec, waits), n, 0)]
    rows = []
    for side, figs in (("recorded", rec_side), ("generated", gen_side)):
        down = [(d, w) for (d, _), w in figs]
        longest = [(m, w) for (_, m), w in figs]
        total = sum(w for _, w in down)
        cells = [sum(d * w for d, w in down) / total, *(weighted_quantile(down, q) for q in (0.9, 0.95, 0.99))]
        over = sum(w for d, w in down if d > deadline_h / 4) / total
        lcells = [sum(m * w for m, w in longest) / total, *(weighted_quantile(longest, q) for q in (0.95, 0.99))]
        rows.append(f"| {deadline_h:g} h | {set_name}: {side} | {len(todo)} | "
                    + " | ".join(f"{c:.2f}" for c in cells) + f" | {over:.1%} | "
                    + " | ".join(f"{c:.2f}" for c in lcells) + " |")
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
    parser.add_argument("--set", choices=["held-out", "choose", "all", "loo"], default="held-out",
                        help="traces at odd positions in sorted path order (held-out: the availability model "
                        "was fitted on the others), even positions (choose), all, or all with each recording's "
                        "estimate drawn from the model (--model) fitted on the other 16 (loo: leave one recording "
                        "out; the calibration's rows only)")
    parser.add_argument("--fits", type=Path, help="with --set loo: a file that keeps the left-out fits between runs "
                        "(about 30 s of CPU each)")
    parser.add_argument("--seed", type=int, default=0,
                        help="draw the estimate's traces from this seed instead of its own 0 (its sampling error)")
    parser.add_argument("--waits", choices=["model", "recorded"], default="model",
                        help="the estimate's mean wait for capacity: the model's at the recording's rate, or the "
                        "recording's own (as the interruption recorder's waits measure it)")
    parser.add_argument("--cap-usd", type=float, help="execute every candidate at this cap (budget.max_usd), as the "
                        "cost guard holds it, on both sides")
    parser.add_argument("--cap-x", type=float, help="the cap as this multiple of the run's bill on-demand from the "
                        "start, at each deadline")
    parser.add_argument("--bills", type=int, metavar="N", default=0,
                        help="instead, with --cap-usd or --cap-x: every candidate without the cap on N generated "
                        "traces per recording and on the recorded windows: bills over the cap, mean bill, on-demand "
                        "hours")
    parser.add_argument("--model", choices=sorted(MODELS), default="regimes",
                        help="the availability model of the generated traces, each fitted on the choose set (with "
                        "--set loo, on the other 16 recordings): CHAIN (regimes), with droughts drawn in recorded "
                        "hours (droughts), and each trace's own level of waits (droughts-level: the procedure of the "
                        "estimate's ESTIMATE_CHAIN, which is fitted on all 17), or the recorded cycles resampled in "
                        "blocks, rescaled to the rate, the waits by the rate's power law (bootstrap) or in recorded "
                        "seconds (bootstrap-recorded-waits)")
    parser.add_argument("--cells", type=Path, metavar="FILE",
                        help="with a cap: also write every recording's estimate and every window's executed run "
                        "(bill, on-demand and spot hours, hours to finish, met / late / ended at the cap) to FILE "
                        "(JSON), for benchmarks/calibration_residuals.py")
    parser.add_argument("--recordings", help="comma-separated, as DIR/stem: only these recordings of --set (with "
                        "--set loo, after every fit: each still fitted on all the others)")
    parser.add_argument("--policies", help="comma-separated: only these candidates (default: every one offered)")
    parser.add_argument("--deadlines", default=",".join(map(str, DEADLINES_H)), help="hours, comma-separated")
    parser.add_argument("--stretches", type=int, metavar="N", default=0,
                        help="instead: each recording's stretches with capacity against those of N generated "
                        "traces at its rate (the share shorter than a start, the work lost at their end with "
                        "periodic saves)")
    parser.add_argument("--windows", type=int, metavar="N", default=0,
                        help="instead: at the first of --deadlines, each recording's windows against N generated "
                        "traces at its rate: interruptions per hour with capacity, stretches shorter than a start "
                        "and a save, the mean wait after an interruption, the MaxWait fallback's P(deadline) with "
                        "each way of saving, and the interruptions its notice-saving run saw where it met the deadline")
    parser.add_argument("--unavailable", type=int, metavar="N", default=0,
                        help="instead: at each of --deadlines D, the hours without capacity in the first D hours of "
                        "each window against N generated traces per recording at its rate (mean, P90, P95, P99, "
                        "the share over D / 4) and the longest single stretch without capacity (mean, P95, P99)")
    parser.add_argument("--cycles", type=int, metavar="N", default=0,
                        help="instead: how stretches with capacity and waits follow each other, recorded against N "
                        "generated traces per recording (lag-1 correlations of their logs, and of a stretch with the "
                        "wait after it)")
    args = parser.parse_args()
    use_model(args.model)
    if args.cap_usd is not None and args.cap_x is not None:
        parser.error("--cap-usd and --cap-x: give one")
    for flag, value in (("--cap-usd", args.cap_usd), ("--cap-x", args.cap_x)):
        if value is not None and not (math.isfinite(value) and value > 0):
            parser.error(f"{flag}={value:g} is invalid: expected a number > 0")
    if args.cells is not None and (args.cap_usd is None and args.cap_x is None or args.bills or args.unavailable
                                   or args.cycles or args.windows or args.stretches):
        parser.error("--cells writes the calibration's runs at a cap: give --cap-usd or --cap-x and none of "
                     "--bills, --unavailable, --cycles, --windows, --stretches, or drop --cells")
    paths = sorted(args.spot_traces.glob("availability/1-node/*/*.json"))
    if not paths:
        raise SystemExit(f"--spot-traces {args.spot_traces}: no availability/1-node/*/*.json under it")
    keep = {"choose": 0, "held-out": 1}.get(args.set)
    paths = [p for i, p in enumerate(paths) if keep is None or i % 2 == keep]
    recordings = [read_availability(p) for p in paths]
    names = [f"{p.parent.name}/{p.stem}" for p in paths]
    models = None
    if args.fits is not None and args.set != "loo":
        parser.error("--fits keeps the left-out fits of --set loo: give --set loo, or drop --fits")
    if args.set == "loo":
        if args.bills or args.cycles or args.windows:
            parser.error("--set loo gives the calibration's rows, --unavailable and --stretches only: drop --bills, "
                         "--cycles and --windows")
        models = left_out_models(paths, recordings, args.model, args.fits)
    if args.recordings:
        keep_names = args.recordings.split(",")
        unknown = [n for n in keep_names if n not in names]
        if unknown:
            parser.error(f"--recordings {','.join(unknown)}: not among the {len(names)} recordings of --set "
                         f"{args.set} (names as DIR/stem, e.g. {names[0]})")
        picked = [k for k, n in enumerate(names) if n in keep_names]
        recordings, names = [recordings[k] for k in picked], [names[k] for k in picked]
        models = None if models is None else [models[k] for k in picked]
    if args.bills:
        if args.cap_usd is None and args.cap_x is None:
            parser.error("--bills needs --cap-usd or --cap-x")
        print(f"| deadline | cap | candidate ({args.set}, no cap) | windows | bills over the cap (estimated / "
              "observed) | mean bill | on-demand hours |")
        print("|---|---|---|---|---|---|---|")
        policies = args.policies.split(",") if args.policies else None
        for deadline_h in map(float, args.deadlines.split(",")):
            print("\n".join(bill_rows(recordings, deadline_h, args.every_h, args.bills, policies, args.cap_usd,
                                      args.cap_x, args.waits)), flush=True)
        return
    if args.unavailable:
        print("| D | windows | count | hours without capacity in the first D: mean | P90 | P95 | P99 | over D / 4 "
              "| longest stretch without capacity (h): mean | P95 | P99 |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for deadline_h in map(float, args.deadlines.split(",")):
            print("\n".join(unavailable_rows(recordings, deadline_h, args.every_h, args.unavailable,
                                             args.set if not args.recordings else args.recordings, args.waits,
                                             models)), flush=True)
        return
    if args.cycles:
        print("| cycles | log stretch with capacity, one cycle apart | log wait, one cycle apart | log stretch and "
              "the wait after it |")
        print("|---|---|---|---|")
        print("\n".join(cycle_rows(recordings, names, args.cycles, args.waits)))
        return
    if args.windows:
        plan = setting(float(args.deadlines.split(",")[0]))
        print(f"{plan.deadline_s / 3600:g} h windows, every {args.every_h:g} h; each cell recorded / generated")
        print(f"| trace ({args.set}) | windows | interruptions per hour with capacity | stretches shorter than a start "
              f"and a save ({plan.startup_s + plan.restore_s + plan.save_s:g} s) | mean wait after an interruption "
              "(h) | P(deadline), notice | P(deadline), periodic | notice - periodic (points) | interruptions seen "
              "by the notice runs that met it |")
        print("|---|---|---|---|---|---|---|---|---|")
        print("\n".join(window_rows(plan, recordings, names, args.every_h, args.windows, args.waits)))
        return
    if args.stretches:
        plan = setting(float(args.deadlines.split(",")[0]))
        print(f"| trace ({args.set}) | interruptions per available hour | stretches | recorded: shorter than a start "
              f"({plan.startup_s + plan.restore_s:g} s) | recorded: lost at the end, periodic saves (s) | generated: "
              "shorter than a start | generated: lost at the end (s) | generated stretches |")
        print("|---|---|---|---|---|---|---|---|")
        print("\n".join(stretch_rows(plan, recordings, names, args.stretches, args.waits, models)))
        return
    print(f"{len(recordings)} traces ({args.set}); interruptions per available hour "
          f"{min(map(recorded_rate, recordings)):.2f}-{max(map(recorded_rate, recordings)):.2f}; waits: {args.waits}"
          + (f" (recorded means {min(map(recorded_wait, recordings)) / 3600:.2f}-"
             f"{max(map(recorded_wait, recordings)) / 3600:.2f} h)" if args.waits == "recorded" else ""))
    at_cap = args.cap_usd is not None or args.cap_x is not None
    cells: dict = {}
    print("| deadline | " + ("cap | " if at_cap else "") + "candidate | windows | estimated P(deadline) | observed | "
          "difference (points) | 90% interval, recordings resampled |"
          + (" ended at the cap (estimated / observed) |" if at_cap else ""))
    print("|---|" + "---|" * (7 if at_cap else 6) + ("---|" if at_cap else ""))
    t0 = time.perf_counter()
    policies = args.policies.split(",") if args.policies else None
    for deadline_h in map(float, args.deadlines.split(",")):
        cells[f"{deadline_h:g}"] = {}
        for label, promised, met, count, (lo, hi), *capped_row in calibrate(
                recordings, deadline_h, args.every_h, args.n, policies, args.seed, args.waits, args.cap_usd,
                args.cap_x, models, cells[f"{deadline_h:g}"]):
            cap_cell = f"${capped_row[2]:,.2f} | " if capped_row else ""
            ended = f" {capped_row[0]:.1%} / {capped_row[1]:.1%} |" if capped_row else ""
            print(f"| {deadline_h:g} h | {cap_cell}{label} | {count} | {promised:.1%} | {met:.1%} | "
                  f"{100 * (promised - met):+.1f} | {100 * lo:+.1f} .. {100 * hi:+.1f} |{ended}", flush=True)
    print(f"({time.perf_counter() - t0:.0f} s)")
    if args.cells is not None:
        args.cells.write_text(json.dumps({"set": args.set, "model": args.model, "seed": args.seed, "n": args.n,
                                          "every_h": args.every_h, "recordings": names, "deadlines": cells}))


if __name__ == "__main__":
    main()
