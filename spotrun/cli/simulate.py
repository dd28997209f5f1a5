"""`spotrun simulate RUN.json`: the run's plan replayed over N traces under every policy; table, JSON and PNG.

Traces: generated (the estimate's interruption rate, or `--band`'s Spot Instance Advisor rate, with the estimate's
availability model fitted to recorded capacity, or synthetic bursts and droughts with `--droughts`), `--traces DIR`
of availability files in the skypilot-org/spot-traces format, or `--interruptions FILE`: the interruption table's
items, resampled. Exit codes: spotrun/cli/exits.py, as `spotrun estimate`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

from ..contract.json_text import JsonSyntaxError, loads, with_excerpt
from ..contract.refusal import Refusal
from ..contract.runfile import load_run_file
from ..contract.strict_json import dumps as strict_dumps
from ..planner.estimate import load_catalog, regional_catalog
from ..planner.outputs import maxwait_fix_text, speed_margin_note
from ..policy.choose import (
    ESTIMATE_TRACES,
    SYNTHETIC_TRACES,
    cap_to_set_held_out_margin,
    estimate_executions,
    finish_caps,
    fitted_source,
    held_out_margin,
    held_out_margin_lines,
    horizon_s,
    larger_cap_bills_less,
    on_demand_source,
    policy_plans,
    run_candidates,
    run_plan,
    run_policies,
    settings_lines,
    shared_simulations,
    shared_traces,
    spot_alone,
)
from ..policy.decision import RULES
from ..policy.report import plot, study, table_text
from ..policy.traces import (
    ADVISOR_BANDS,
    SHOWN_ERRORS,
    LeftOut,
    TraceFileError,
    TraceSpec,
    advisor_rate,
    generated_traces,
    interruption_gaps,
    read_recordings,
    recorded_traces,
    resampled_traces,
)
from .arguments import as_typed, run_file
from .estimate import add_prepared_argument, check_file
from .exits import Exit, fail, for_status

N_RANGE = (1, 100_000)  # 100,000 traces of every candidate is minutes and ~1 GB here; more is a mistake
DROUGHTS_MAX = 24.0  # droughts per day: each lasts hours, so more than one an hour is no trace to study
PROGRESS_AFTER_S = 2.0
JOBS_RANGE = (1, 64)
JOBS_DEFAULT_MAX = 8  # the default --jobs: the machine's CPUs, at most this many
POOL_AFTER_WINDOWS = 20_000  # by default a study of fewer windows runs in the command's process (no pool to start)


class Progress:
    """A progress bar on stderr (`what [#####.....] done/total`), shown only once the command has taken
    PROGRESS_AFTER_S, redrawn at most every REDRAW_S, and only on a terminal: redrawn with carriage returns, a bar
    in a CI log or a `2> file` is a line per redraw of noise (there, nothing: the report says what was done)."""

    WIDTH = 30
    REDRAW_S = 0.2

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.live = bool(getattr(self.stream, "isatty", lambda: False)())
        self.t0 = time.perf_counter()
        self.drawn = -1.0
        self.shown = False

    def __call__(self, what: str, done: int, total: int) -> None:
        now = time.perf_counter()
        if not self.live or now - self.t0 < PROGRESS_AFTER_S or (done != total and now - self.drawn < self.REDRAW_S):
            return
        self.shown, self.drawn = True, now
        filled = self.WIDTH * done // max(1, total)
        self.stream.write(f"\r{what} [{'#' * filled}{'.' * (self.WIDTH - filled)}] {done:,}/{total:,}"
                          + ("\n" if done == total else ""))
        self.stream.flush()


def finite(value):
    """The report with non-finite floats (a run that never finishes has an infinite wall time) as null: strict
    JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


def register(sub) -> None:
    sim = sub.add_parser("simulate", help="replay the run's plan over spot traces under each policy: cost, "
                         "P(deadline), work lost; table and PNG")
    sim.add_argument("run", type=run_file("run"), help="run JSON file")
    add_prepared_argument(sim)
    sim.add_argument("--traces", type=Path, help="a directory of availability traces (skypilot-org/spot-traces "
                     "format; every *.json file under it; one in which the run's node count is never available is "
                     "left out and named); default: generated traces")
    sim.add_argument("--interruptions", type=Path, help="the interruption table's items (a JSON array, or `aws "
                     "dynamodb scan --table-name T` output): windows drawn from the gaps between a job's interruptions")
    sim.add_argument("--policy", action="append", metavar="NAME",
                     help=f"only this policy (repeatable; each as the cost guard executes it): one of "
                     f"{', '.join(sorted(RULES))} that the run can take (one it cannot, or another name, is refused "
                     "from the run file, before the estimate, naming those it can)")
    sim.add_argument("--n", type=int, default=1000, help=f"traces, {N_RANGE[0]} to {N_RANGE[1]:,} (default 1000)")
    sim.add_argument("--seed", type=int, default=0, help="seed of the generated traces and start offsets")
    sim.add_argument("--band", choices=list(ADVISOR_BANDS), help="interruptions at this Spot Instance Advisor band "
                     "instead of the estimate's rate: the Advisor's share of instances reclaimed in a month, so "
                     "even >20%% is far calmer than the estimate's rate fitted to recorded capacity (the source "
                     "line says by how much)")
    sim.add_argument("--droughts", type=float, help="generate synthetic traces instead (10-minute waits for capacity, "
                     "30%% of interruptions in bursts) with this many 6-80 h droughts per day; default: the "
                     "estimate's availability model fitted to recorded capacity")
    sim.add_argument("--region", help="price in this region (default us-east-1)")
    sim.add_argument("--out", type=Path, default=Path("simulate-output"), help="where simulate.json, simulate.txt "
                     "and, with --plot, simulate.png go (default ./simulate-output)")
    sim.add_argument("--no-optimum", action="store_true", help="skip the exact offline optimum")
    sim.add_argument("--jobs", type=int, help=f"processes the policies and the optimum run in, {JOBS_RANGE[0]} to "
                     f"{JOBS_RANGE[1]} (the same report; default: the machine's CPUs, at most {JOBS_DEFAULT_MAX}, "
                     f"once the traces hold over {POOL_AFTER_WINDOWS:,} windows, else 1: in the command's process)")
    sim.add_argument("--plot", action="store_true", help="also draw simulate.png (matplotlib: a second or more)")
    sim.add_argument("--format", choices=["text", "json"], default="text")
    sim.set_defaults(func=simulate_command)


REPLAY_WINDOW_BUDGET = 2_000_000  # windows replayed in all (about 110 bytes each held, each executed per policy)


class TooManyWindows(ValueError):
    """Recordings whose replay over the run's horizon would hold more windows than simulate bounds itself to."""


def replay_windows(recs: list, n: int, horizon_s: float) -> int:
    """About how many windows `n` replays of the recordings (in turn) hold over `horizon_s`."""
    per = [len(r.windows) / r.length_s * horizon_s + 1 for r in recs]
    return int(sum(per[i % len(recs)] for i in range(n)))


class BadTraceInput(ValueError):
    """A --traces or --interruptions file simulate cannot use; `flag` names the flag (one line)."""

    def __init__(self, flag: str, message: str):
        self.flag = flag
        super().__init__(message)


def trace_files(directory: Path) -> list[Path]:
    """The trace files under a --traces directory: every *.json file (a directory named *.json is no trace)."""
    return sorted(p for p in Path(directory).rglob("*.json") if p.is_file())


def left_out_line(left: list[LeftOut], kept: int, directory: Path, instances: int) -> str:
    """The recordings a directory's replay leaves out (no sample has the job's node count), named relative to the
    directory (the public recordings repeat names across dates)."""
    names = [str(x.path.relative_to(directory)) if x.path.is_relative_to(directory) else str(x.path)
             for x in left]
    more = f" and {len(names) - SHOWN_ERRORS:,} more (simulate.json lists them)" if len(names) > SHOWN_ERRORS else ""
    return (f"left out {len(left)} of {len(left) + kept} trace files in which no sample has {instances} instance"
            f"{'s' * (instances != 1)} available (the most is {max(x.most for x in left):g}): "
            f"{', '.join(names[:SHOWN_ERRORS])}{more}")


def traces_for(plan, est, args) -> tuple[list, str, list[LeftOut], tuple | None]:
    """The traces, their source line, the recordings left out, and (spec, n, seed) where they are generated as the
    estimate generates its own (`estimate_executions` then holds the estimate's executions on them), else None."""
    horizon = horizon_s(plan)
    if args.traces:
        where = f"--traces={as_typed(str(args.traces))}"
        try:
            recs, left = read_recordings(trace_files(args.traces), est.instance_count)
        except TraceFileError as exc:
            raise BadTraceInput("--traces", f"{where}: {exc}") from None
        if (held := replay_windows(recs, args.n, horizon)) > REPLAY_WINDOW_BUDGET:
            most = max(1, int(args.n * REPLAY_WINDOW_BUDGET / held))
            raise TooManyWindows(
                f"--n={args.n} is invalid with --traces={json.dumps(str(args.traces))}: its recordings change "
                f"capacity so often that {args.n:,} replays over the run's {horizon / 3600:,.1f} h horizon hold about "
                f"{held:,} windows, over the {REPLAY_WINDOW_BUDGET:,} simulate holds; expected --n {most:,} or less")
        mean = sum(r.available_fraction for r in recs) / len(recs)
        source = (f"{len(recs)} recorded trace{'s' * (len(recs) != 1)} from random start offsets, {mean:.0%} "
                  "available on average")
        if left:
            source += f"; {left_out_line(left, len(recs), args.traces, est.instance_count)}"
        return recorded_traces(recs, args.n, horizon, args.seed), source, left, None
    if args.interruptions:
        where = f"--interruptions={as_typed(str(args.interruptions))}"
        try:
            items = read_items(args.interruptions)
            gaps = interruption_gaps(items)
            if not gaps:
                raise ValueError(no_gaps_text(items))
            traces = resampled_traces(gaps, args.n, horizon, seed=args.seed)
        except ValueError as exc:
            raise BadTraceInput("--interruptions", f"{where}: {exc}") from None
        few = (f"; only {len(gaps)}: every trace repeats {'it' if len(gaps) == 1 else 'them'}, so the odds say "
               "little until more runs are recorded") if len(gaps) < FEW_GAPS else ""
        return (traces, f"resampled from {len(gaps)} recorded gap{'s' * (len(gaps) != 1)} between interruptions"
                f"{few}", [], None)
    rate = advisor_rate(args.band, est.instance_count) if args.band else est.interruptions_per_hour
    band = f"Advisor band {args.band}{_band_scale(rate, est.interruptions_per_hour)}: " if args.band else ""
    if args.droughts is None:  # the estimate's mean wait (recorded or the run's) goes with its rate, not a band's
        wait_s = None if args.band else est.mean_wait_seconds
        spec = TraceSpec(interruptions_per_hour=rate, horizon_s=horizon, **ESTIMATE_TRACES, mean_wait_s=wait_s)
        return (shared_traces(spec, args.n, args.seed), band + fitted_source(rate, wait_s, est.mean_wait_source),
                [], (spec, args.n, args.seed))
    spec = TraceSpec(interruptions_per_hour=rate, horizon_s=horizon,
                     **{**SYNTHETIC_TRACES, "droughts_per_day": args.droughts})
    droughts = f"a drought every {1 / spec.droughts_per_day:g} days" if spec.droughts_per_day else "no droughts"
    return (generated_traces(spec, args.n, args.seed),
            f"generated (synthetic): {band}{rate:.3g} interruptions per job-hour, {spec.burst_p:.0%} in bursts, "
            f"{droughts}", [], None)


def _band_scale(rate: float, estimate_rate: float) -> str:
    """How an Advisor band's rate compares with the estimate's: the band is a monthly share of instances reclaimed
    (AWS's Spot Instance Advisor), the estimate's rate is fitted to recorded capacity; a new user read ">20%" as the
    worst case and found every policy finishing at the on-demand-free bill, 300x calmer than the estimate's."""
    if not (estimate_rate > 0 and rate > 0):
        return ""
    ratio = estimate_rate / rate
    if 0.5 <= ratio <= 2:
        return ""
    how = f"{ratio:,.0f}x fewer" if ratio > 1 else f"{1 / ratio:,.0f}x more"
    return (f" (a monthly share of instances reclaimed: {how} interruptions than the estimate's "
            f"{estimate_rate:.3g} per job-hour)")


FEW_GAPS = 20  # recorded gaps under which simulate's source line says the odds rest on too few


def no_gaps_text(items: list[dict]) -> str:
    """Why an interruption table gives no gap to resample: how many items, how many interruptions (the recorder's
    items carry kind="interruption"), how many jobs; each gap is between two interruptions of one job."""
    kinds = [i for i in items if isinstance(i, dict) and i.get("kind") == "interruption"]
    jobs = {i.get("pk") for i in kinds}
    if not kinds:
        return (f"{len(items):,} item{'s' * (len(items) != 1)}, none with kind=\"interruption\" (the interruption "
                "recorder's items carry it, beside pk and sk): no interruption to take gaps between")
    return (f"{len(kinds):,} interruption item{'s' * (len(kinds) != 1)} over {len(jobs):,} job"
            f"{'s' * (len(jobs) != 1)}, none interrupted twice at different times: a gap is between two "
            "interruptions of one job; record more runs, or generate traces from a rate")


def read_items(path: Path) -> list[dict]:
    """DynamoDB items from a JSON array or `aws dynamodb scan` output (typed attribute values: {"S": ...});
    ValueError (one line, without the file's name) when the file is not one."""
    expected = "expected a JSON array of the interruption table's items or `aws dynamodb scan` output"
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot be read ({exc.strerror or 'an operating-system error'}): {expected}") from None
    if not raw.strip():
        raise ValueError(f"the file is empty: {expected}")
    try:
        doc = loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"not text (byte {exc.start:,} is not UTF-8: a binary file?): {expected}") from None
    except JsonSyntaxError as exc:
        raise ValueError(with_excerpt(f"not valid JSON ({exc.where_what}): {expected}", exc.excerpt)) from None
    except RecursionError:
        raise ValueError(f"JSON nested too deep: {expected}") from None
    items = doc.get("Items") if isinstance(doc, dict) else doc
    if not isinstance(items, list):
        found = "an object without an \"Items\" array" if isinstance(doc, dict) else "a single JSON value, not an array"
        raise ValueError(f"the document is {found}: {expected}")

    def plain(value):
        if isinstance(value, dict) and len(value) == 1 and next(iter(value)) in ("S", "N", "BOOL"):
            return next(iter(value.values()))
        return value

    return [{k: plain(v) for k, v in item.items()} for item in items if isinstance(item, dict)]


def jobs(given: int | None, traces: list) -> int:
    """The processes the study runs in: --jobs, else the machine's CPUs (at most JOBS_DEFAULT_MAX) for a study
    of over POOL_AFTER_WINDOWS windows, else 1 (starting processes would cost more than they save)."""
    if given is not None:
        return given
    if sum(len(t) for t in traces) <= POOL_AFTER_WINDOWS:
        return 1
    return max(1, min(JOBS_DEFAULT_MAX, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                      else os.cpu_count() or 1))


def bad_argument(args: argparse.Namespace) -> tuple[str, str] | None:
    """(flag, one line) for a flag value simulate cannot use, checked before the run is read; None when all are."""
    if not N_RANGE[0] <= args.n <= N_RANGE[1]:
        return "--n", f"--n={args.n} is invalid: expected an integer from {N_RANGE[0]} to {N_RANGE[1]:,}"
    if args.jobs is not None and not JOBS_RANGE[0] <= args.jobs <= JOBS_RANGE[1]:
        return "--jobs", f"--jobs={args.jobs} is invalid: expected an integer from {JOBS_RANGE[0]} to {JOBS_RANGE[1]}"
    if args.droughts is not None and not 0 <= args.droughts <= DROUGHTS_MAX:
        return "--droughts", (f"--droughts={args.droughts:g} is invalid: expected a number of droughts per day from "
                               f"0 to {DROUGHTS_MAX:g} (each lasts 6-80 h)")
    if args.traces is not None and not args.traces.is_dir():
        there = "it is not a directory" if args.traces.exists() else "nothing is there"
        return "--traces", (f"--traces={args.traces} is invalid: expected a directory of spot-traces files "
                             f"(*.json); {there}")
    # before the run is read: reading it prepares raw text, which an unusable flag must not cost
    if args.traces is not None and not trace_files(args.traces):
        return "--traces", (f"--traces={args.traces} is invalid: expected a directory of spot-traces files "
                             "(*.json); no *.json trace files under it")
    if args.interruptions is not None and not args.interruptions.is_file():
        there = "it is a directory" if args.interruptions.exists() else "nothing is there"
        return "--interruptions", (f"--interruptions={args.interruptions} is invalid: expected a file of the "
                                   f"interruption table's items (a JSON array or a DynamoDB scan); {there}")
    return None


def bad_policy(policies: list[str], run) -> str | None:
    """The one line refusing the --policy values the run cannot take (`run_policies`: on-demand without the fallback;
    a deadline policy without a deadline; a spot policy with compute.spot=false), naming those it can; None when it
    can take them all. From the run alone: checked before the estimate."""
    allowed = sorted(run_policies(run))
    if unknown := sorted(set(policies) - set(RULES)):  # no policy at all (argparse no longer lists them)
        return (f"--policy={','.join(unknown)} is invalid: no such policy; expected one this run can take: "
                f"{', '.join(allowed)} (the policies: {', '.join(sorted(RULES))})")
    if not (not_here := sorted(set(policies) - set(allowed))):
        return None
    return (f"--policy={','.join(not_here)} is not a policy this run can take: expected one of {', '.join(allowed)} "
            "(on_demand needs compute.on_demand_fallback=true or compute.spot=false; the deadline policies need "
            "compute.deadline_hours; compute.spot=false takes on_demand alone)")


def not_borne_out(report: dict, section, recorded: bool) -> list[str]:
    """On recorded (or resampled) traces, the lines that say where the estimate's chosen policy does worse here
    than on the estimate's generated traces, on which its figures and the cap to set rest (a new user: the cap to
    set finished 46.9% of the public recordings' windows, printed under a line promising 95%): its odds at the run's
    cap, with why its runs end unfinished (`unfinished_text`: at the cap, or at MaxWait without fallback, which no
    cap fixes), and its P95 bill against the cap to set (a new user was told 'the cap to set: $160.39 or more' under
    a P95 of $371.51 on the recordings, without a word)."""
    row = next((r for r in report["policies"] if r["label"] == section.chosen), None)
    if not recorded or row is None:
        return []
    cap_line = _cap_to_set_not_borne_out(report, section, row)
    return _odds_not_borne_out(report, section, row) + (cap_line or _bill_not_borne_out(section, row))


BILL_NOT_BORNE_OUT = 0.05  # the recordings' mean over the estimate's by more than this share is said


def _bill_not_borne_out(section, row: dict) -> list[str]:
    """The chosen policy's mean bill on these traces against the estimate's: a new user's 8B with a 12 h deadline
    billed $196.53 on the public recordings (P95 $322.52) against the $152.80 (P95 $165.00) the estimate told,
    without a word, since its cap still held."""
    told = next((r for r in section.policies if r["label"] == section.chosen), None)
    if told is None or not told.get("mean_usd") or row["mean_usd"] <= told["mean_usd"] * (1 + BILL_NOT_BORNE_OUT):
        return []
    return [f"  not borne out here in the bill: on these traces {section.chosen}'s mean bill is "
            f"${row['mean_usd']:,.2f} (P95 ${row['p95_usd']:,.2f}), {row['mean_usd'] / told['mean_usd'] - 1:.0%} over "
            f"the estimate's ${told['mean_usd']:,.2f} (P95 ${told['p95_usd']:,.2f}) on its generated traces: where "
            "these traces are the capacity the run will meet, expect this bill"]


def _odds_not_borne_out(report: dict, section, row: dict) -> list[str]:
    key = "p_deadline" if report["deadline_hours"] else "p_finished"
    here = row[key]
    told = next((r.get(key) for r in section.policies if r["label"] == section.chosen), None)
    if here is None or told is None or here >= told - 0.01:
        return []
    what = "meets the deadline" if report["deadline_hours"] else "finishes"
    cap = f"at the run's ${report['cap_usd']:,.2f} cap" if report.get("cap_usd") is not None else "without a cap"
    line = (f"  not borne out here: on these traces, {cap}, {section.chosen} {what} on {here:.1%}, against "
            f"{told:.1%} on the estimate's generated traces, on which its figures and the cap to set rest")
    causes = _missed_by_cause(row, bool(section.sim_plan.get("on_demand_fallback", True)),
                              late=bool(report["deadline_hours"]), fixes=getattr(section, "maxwait_fixes", None))
    harsher = _harsher_capacity(row, section)
    return [line + (f": {causes}" if causes else "") + (f"; {harsher}" if harsher else "") + "; "
            + _what_was_simulated(report, section)]


HARSHER_INTERRUPTIONS = 0.10  # interruptions per run here over the estimate's by more than this share: said


def _harsher_capacity(row: dict, section) -> str:
    """Where these traces interrupt the chosen policy's runs more often than the estimate's generated traces did
    (interruptions per run, the rows' `mean_interruptions`): that the capacity here is harsher than the estimate's,
    which neither its odds nor its held-out margin cover (the margin is the leave-one-recording-out error on the
    public recordings under the fitted availability model). A new user's llama on the public recordings: 4.56
    interruptions per run against the estimate's 0.95, and the line named no cause but the shares."""
    told = next((r for r in section.policies if r["label"] == section.chosen), None)
    here_n, told_n = row.get("mean_interruptions"), (told or {}).get("mean_interruptions")
    if here_n is None or told_n is None or here_n <= told_n * (1 + HARSHER_INTERRUPTIONS) or here_n - told_n < 0.05:
        return ""
    return (f"harsher capacity than the estimate's: {here_n:.2f} interruptions per run here against {told_n:.2f} on "
            "its generated traces, which its odds and its held-out margin (measured on the public recordings under "
            "the fitted availability model) do not cover")


def _missed_by_cause(row: dict, fallback: bool, late: bool, fixes: list | None = None) -> str:
    """Why the chosen policy's runs miss here, each cause with its share and what would change it: ended at the cap
    (a larger cap finishes them), MaxWait without spot capacity and no fallback (the remedies the estimate simulated
    on its traces, `maxwait_fix_text` of its `maxwait_fixes`: the cost line's and the warnings' text), the longest
    MaxRuntime reached unfinished, or (`late`, with a deadline) finished after it. A new user was told '6.4% wait out
    MaxWait ... no cap finishes them' where 6.1% more had ended at the cap."""
    unfinished = 1.0 - row["p_finished"]
    at_cap = min(unfinished, row.get("p_over_budget", 0.0))
    rest = unfinished - at_cap
    causes = []
    if late and row.get("p_deadline") is not None and row["p_finished"] - row["p_deadline"] > 1e-9:
        causes.append((row["p_finished"] - row["p_deadline"], f"{row['p_finished'] - row['p_deadline']:.1%} finish "
                                                              "after the deadline"))
    if at_cap > 1e-9:
        causes.append((at_cap, f"{at_cap:.1%} end unfinished at the cap (OverBudget: a larger cap "
                               f"{'lets them go on' if late else 'finishes them'})"))
    if rest > 1e-9 and not fallback:
        causes.append((rest, f"{rest:.1%} wait out MaxWait with no spot capacity and end unfinished "
                             "(compute.on_demand_fallback=false: no on-demand job follows; "
                             f"{maxwait_fix_text(fixes)})"))
    elif rest > 1e-9:
        causes.append((rest, f"{rest:.1%} run to the longest MaxRuntime unfinished"))
    return ", ".join(text for _, text in sorted(causes, key=lambda c: -c[0]))


def _what_was_simulated(report: dict, section) -> str:
    """What these rows are: the run at its own cap on the estimate's layout. Where the cap to set is another cap (or
    runs another layout) it was not simulated here: a new user's 8B at a $200 cap on 2 x g6e was told 'the cap to set
    is not enough' of a $327.53 cap on 1 x p5 that this study never ran."""
    to_set = section.deadline_cap_usd or section.p95_finish_cap_usd
    cap = report.get("cap_usd")
    where = "where these traces are the capacity the run will meet"
    if to_set and cap is not None and abs(cap - to_set) < 0.005 and not section.cap_to_set_layout:
        return f"{where}, the cap to set (${to_set:,.2f}, the run's cap here) does not give the estimate's odds"
    simulated = f"the run's ${cap:,.2f} cap" if cap is not None else "the run without a cap"
    if not to_set:
        return f"{where}, expect these odds ({simulated} on {report['layout']} was simulated)"
    other = f" on {section.cap_to_set_layout}" if section.cap_to_set_layout else ""
    return (f"{where}, expect these odds at {simulated} on {report['layout']}, the one simulated here: the cap to set "
            f"(${to_set:,.2f}{other}) was not (set budget.max_usd to it and simulate again for its odds on these "
            "traces)")


def _cap_to_set_not_borne_out(report: dict, section, row: dict) -> list[str]:
    to_set = section.deadline_cap_usd or section.p95_finish_cap_usd
    cap = report.get("cap_usd")
    # at a run's cap at or under the cap to set, the rows are the run there: the odds line says it
    if not to_set or round(row["p95_usd"], 2) <= round(to_set, 2) or (cap is not None and cap <= to_set + 0.005):
        return []
    return [f"  not borne out here at the cap to set: on these traces {section.chosen}'s P95 bill is "
            f"${row['p95_usd']:,.2f} (mean ${row['mean_usd']:,.2f}), over the ${to_set:,.2f} the estimate names: a "
            "run capped there ends unfinished at the cap (OverBudget) wherever it would bill more, on 5% or "
            "more of these traces; where they are the capacity the run will meet, set a cap above that P95 (simulate "
            "the run with budget.max_usd at a cap to see its odds there)"]


def simulate_command(args: argparse.Namespace) -> int:
    if bad := bad_argument(args):
        return fail(args.format, Exit.INVALID, "InvalidArguments", bad[1], bad[0])
    with shared_simulations():  # the estimate's executions, which the study reuses on the same traces
        return _simulate(args)


def _simulate(args: argparse.Namespace) -> int:
    try:
        # the run's contract alone first: a --policy it cannot take is refused before the estimate runs (a new
        # user waited 9.7 s on the 8B for it)
        if args.policy and (bad := bad_policy(args.policy, load_run_file(args.run).run)):
            return fail(args.format, Exit.INVALID, "InvalidArguments", bad, "--policy")
        # spotrun.contract.runfile's loader, and the estimate's own policy stage: its sentinel and cap to set are
        # printed under the study (which makes its own choice on its own traces)
        # (the cap to set's headroom is the estimate's line alone: not searched here)
        checked = check_file(args.run, None, plan=True, region=args.region, prepared=args.prepared, headroom=False)
        est, run = checked.estimate, checked.run
        catalog = regional_catalog(load_catalog(), args.region or "us-east-1")
        # the estimate's plan, at the run's cap (as the cost guard holds it): at a cap that binds, the rows are the
        # estimate's on the same traces (a table planned without the cap differed from the estimate's there)
        plan = run_plan(run, est, catalog)
        traces, source, left_out, generated = traces_for(plan, est, args)
        if not run.compute.spot:  # on-demand alone: what the traces are changes nothing, which the line says
            given = args.traces or args.interruptions or args.band or args.droughts is not None
            source = on_demand_source(source if given else "")
    except Refusal as exc:
        return fail(args.format, for_status(exc.status), exc.status, exc.message, exc.field)
    except TooManyWindows as exc:
        return fail(args.format, Exit.INVALID, "InvalidArguments", str(exc), "--n")
    except BadTraceInput as exc:  # the traces or interruptions given
        return fail(args.format, Exit.INVALID, "InvalidArguments", str(exc), exc.flag)
    chosen = run_candidates(run, plan)  # as the estimate's: on-demand alone for compute.spot=false
    if args.policy:  # each one the run can take (`bad_policy`, before the estimate)
        chosen = [c for c in chosen if c[0] in args.policy]
    # no optimum without a choice: compute.spot=false runs on-demand alone, and without on_demand_fallback a spot
    # run has one schedule (spot whenever it has capacity), which every policy runs: the optimum, which may move to
    # on-demand, would be a floor the run cannot reach
    one_schedule = run.compute.spot and not run.compute.on_demand_fallback
    try:  # before the study: an --out that cannot be written is said now, not after minutes of simulating
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return fail(args.format, Exit.INVALID, "InvalidArguments", f"--out={json.dumps(str(args.out))} is invalid: "
                    f"expected a directory (or a path to create one at): "
                    f"{'it is a file' if args.out.is_file() else exc.strerror or exc}", "--out")
    report = study(plan, traces, chosen, optimum=not args.no_optimum and run.compute.spot and not one_schedule,
                   source=source, cap_usd=run.max_usd, progress=Progress(),
                   finish=finish_caps(est), plan_of=policy_plans(run, est, plan), workers=jobs(args.jobs, traces),
                   executions=None if generated is None else lambda p: estimate_executions(p, *generated))
    report["run"] = run.name
    if left_out:
        report["traces_left_out"] = [{"file": str(x.path), "reason": x.reason} for x in left_out]
    report["layout"] = f"{est.instance_count} x {est.instance_type}"
    section = est.spot_policy
    speed = speed_margin_note(est)  # an on-demand chain's: how much slower the trainer may be at the cap to set
    report["estimate_policy"] = {"chosen": section.chosen, "traces": section.traces, "sentinel": section.sentinel,
                                 "cap_to_set_usd": section.deadline_cap_usd or section.p95_finish_cap_usd,
                                 "cap_to_set_speed_margin": speed,
                                 # the estimate's odds at its cap to set, where that cap ends runs (its last line)
                                 "cap_to_set_held_out_margin": cap_to_set_held_out_margin(section),
                                 "larger_cap_bills_less": larger_cap_bills_less(section)}
    files = {"report": args.out / "simulate.json", "summary": args.out / "simulate.txt"}
    # the availability model's odds at a cap that ends runs read high on recordings it was not fitted on (as the
    # estimate says under its table); on recorded or resampled traces the odds are those traces' own
    recorded = bool(args.traces or args.interruptions)
    odds = "P(deadline)" if report["deadline_hours"] else "P(finished)"
    report["held_out_margin"] = None if recorded else held_out_margin(report["policies"], odds)
    notes = [] if recorded else held_out_margin_lines(report["policies"], odds)
    if one_schedule:
        notes.append("no optimum: compute.on_demand_fallback=false leaves the run one schedule, spot whenever it has "
                     "capacity, which each policy above runs (an optimum may move to on-demand, which this run may "
                     "not)")
        if plan.deadline_s is not None:
            notes.append(spot_alone(plan.deadline_s, max(r["p_deadline"] for r in report["policies"])))
    text = "\n".join([f"{run.name} on {report['layout']}: " + table_text(report), *notes,
                      f"as `spotrun estimate` sets the run up (its choice: {section.chosen}, on its "
                      f"{section.traces:,} traces):", *settings_lines(section),
                      *(["  " + speed["line"]] if speed else []),
                      *not_borne_out(report, section, recorded=recorded)])
    files["report"].write_text(strict_dumps(finite(report), indent=2))
    files["summary"].write_text(text + "\n")
    if args.plot:
        files["plot"] = plot(report, args.out / "simulate.png", f"{run.name}: {report['layout']}, "
                             f"{report['traces']} traces")
    if args.format == "json":
        print(strict_dumps(finite(report), indent=2))
    else:
        print(text)
        for name, path in files.items():
            print(f"  {name:<16} {path}")
    return 0
