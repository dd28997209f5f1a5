"""How the cost cap holds by construction: a run is a chain of training jobs (segments) on one checkpoint prefix,
and every job's MaxRuntimeInSeconds is what the cap still allows at on-demand rates.

Why segments. SageMaker reports BillableTimeInSeconds only when a job ends; while a spot job runs, its bill can
only be bounded at on-demand rates (API reference, DescribeTrainingJob). A cap between the spot and the on-demand
estimate therefore cannot let one job run the whole way: after cap / on-demand rate seconds the bound reaches
the cap although the real (spot) bill is a fraction of it. So the run goes in segments: each job may run as
long as the cap leaves at on-demand rates; the trainer saves and exits cleanly before that (hyperparameter
`segment_seconds`); the job ends, SageMaker reports its exact bill, and the next segment starts with the room that
bill left. The first segment is the whole run when the cap covers its on-demand bound (today's single job).

The bound SageMaker enforces. For every job,
    MaxRuntimeInSeconds <= (cap - exact spend so far) / on-demand rate - warm pool - STOP_BILL_S,
so a job that runs until SageMaker stops it (MaxRuntime: SIGTERM, then up to 120 s) bills at most what the cap
has left, even when every Lambda is down. The cost guard's own stop is a second line, not the one the cap rests on.

Segment overhead: every new job pulls the image, downloads data, loads the model and restores the checkpoint
(`segment_overhead_seconds`: the catalog's startup plus the trainer's restart measured by benchmarks/restart_cost.py
and the reads at the planned S3 rate), and saves one at its end. `plan_chain` simulates the chain greedily: each
segment as long as the room allows, billed at the expected spot bill (the billed share of on-demand), the last one
sized by the work it has left. The planner runs it from the start to count segments, put their restarts into the
estimate and refuse a cap no chain fits (with the smallest cap that fits, `smallest_cap`); the guard runs it from
the newest checkpoint with the exact bills at every segment boundary and starts the next segment only when the
chain from there still finishes (spotrun/pipeline/guard.py). A chain is greedy because only the restarts cost: what a
segment's MaxRuntime reserves and does not bill is room for the next one. See docs/cap-and-segments.md.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from ..seams import SegmentPlan, StopNotice
from .catalog import share_done, usd

STOP_BILL_S = StopNotice.NOTICE_S  # a stop (StopTrainingJob, MaxRuntime) bills until the container exits
MAX_SEGMENTS = 99  # a longer chain spends more on restarts than it is worth: refused (`-99od`: 5 characters)
SEGMENT_END_MARGIN_S = 60  # the trainer ends its segment this long before the save must start (a slow step)


JOB_END_S = SEGMENT_END_MARGIN_S  # what a job bills past its training: the margin its trainer's budget reserves
SEGMENT_SUFFIX_MAX = len(f"-{MAX_SEGMENTS}od")  # job names: the first job's name + this, at most


def segment_job_name(first: str, segment: int, spot: bool) -> str:
    """The name of segment `segment` (1 = the first job, named by the estimate) of a run: `<first>-<n>[od]`."""
    if segment == 1:
        return first
    return f"{first}-{segment}{'' if spot else 'od'}"


def room_seconds(cap_usd: float, spent_usd: float, usd_per_s: float, warm_pool_s: float = 0.0) -> float:
    """Seconds a job may run at on-demand rates before the cap is reached, after its stop and warm pool."""
    return (cap_usd - spent_usd) / usd_per_s - warm_pool_s - STOP_BILL_S


def next_max_runtime(*, cap_usd: float, spent_usd: float, usd_per_s: float, longest_s: int,
                     warm_pool_s: float = 0.0) -> int:
    """The next job's MaxRuntimeInSeconds: the room the cap leaves, at most `longest_s` (SageMaker's limit or the
    single-job MaxRuntime); 0 or less when nothing is left."""
    room = room_seconds(cap_usd, spent_usd, usd_per_s, warm_pool_s)
    return int(longest_s if room >= longest_s else math.floor(room))  # an infinite cap: the longest


def segment_seconds(max_runtime_s: int, *, startup_s: float, save_s: float) -> int:
    """The trainer's budget for one job (`segment_seconds`): it saves and exits this long after it started, which
    leaves the startup before it and the save plus a margin before MaxRuntime."""
    return max(1, int(max_runtime_s - startup_s - save_s - SEGMENT_END_MARGIN_S))


@dataclass(frozen=True)
class ChainCosts:
    """What a chain's segments cost besides their training, from the plan's figures."""

    usd_per_s: float  # on-demand, all instances: the bound while a job runs
    spot_fraction: float  # the expected bill's share of on-demand (1 - the spot discount; 1 on-demand)
    startup_s: float  # the first job's start (provisioning, image, data) before it trains
    restart_s: float  # a later segment's start: the same plus the trainer's restart and the checkpoint restore
    save_s: float  # the checkpoint save a segment ends with
    longest_s: int  # no job runs longer (the single job's MaxRuntime)
    step_s: float = 0.0  # one optimizer step: a segment that cannot train one makes no progress
    warm_pool_s: float = 0.0  # an on-demand job's keep-alive, billed after it ends
    # kept beside an on-demand job for the policy's sentinel (spotrun/policy/decision.py `sentinel_room_s`): its
    # MaxRuntime is shorter by it, never billed by the job
    sentinel_room_s: float = 0.0


@dataclass(frozen=True)
class Chain:
    """The expected chain from a point of the run: its segments, the first one's MaxRuntime, its bill."""

    fits: bool
    segments: int
    first_max_runtime_seconds: int
    cost_usd: float  # spent before + the chain's expected bill (inf when it does not fit)
    reached: float  # the share of the work the chain trains before it stops (1.0 when it fits)
    room_left_s: int  # the room (s at on-demand) of the segment the chain could not start; 0 when it fits
    needed_s: int  # what that segment needed: its start, one step or the rest, its save and margin


def plan_chain(*, cap_usd: float, spent_usd: float, work_s: float, costs: ChainCosts, first: bool,
               spot: bool = True, stopped: bool = False) -> Chain:
    """The greedy chain that trains `work_s` more seconds (its final save included) with the cap less `spent_usd`
    left: each job's MaxRuntime is the room at on-demand rates (`next_max_runtime`), its trainer saves before it
    (`segment_seconds`), and it bills its start, training and save at the expected rate. `first`: the chain's
    first job is the run's first (its start is `startup_s`, later ones `restart_s`). `stopped`: every job also
    bills a stop (STOP_BILL_S), as an interrupted one does (`finish_cap_usd`)."""
    share = costs.spot_fraction if spot else 1.0
    warm = 0.0 if spot else costs.warm_pool_s
    kept = warm if spot else warm + costs.sentinel_room_s  # what an on-demand job's MaxRuntime leaves unbilled
    left, spent, segments, first_rt = work_s, spent_usd, 0, 0
    while left > 1e-9:
        max_rt = next_max_runtime(cap_usd=cap_usd, spent_usd=spent, usd_per_s=costs.usd_per_s,
                                  longest_s=costs.longest_s, warm_pool_s=kept)
        start = costs.startup_s if first and segments == 0 else costs.restart_s
        rest = int(math.ceil(start + left + costs.save_s + SEGMENT_END_MARGIN_S))  # finishes the run
        trains = max_rt - start - costs.save_s - SEGMENT_END_MARGIN_S
        progress = min(left, max(costs.step_s, 1.0))  # at least a step (or the rest)
        if segments >= MAX_SEGMENTS or (max_rt < rest and trains < progress):
            need = min(rest, int(math.ceil(start + progress + costs.save_s + SEGMENT_END_MARGIN_S)))
            reached = math.floor((1 - left / work_s) * 1e4) / 1e4  # floored: never 1.0 with work left
            return Chain(False, segments, first_rt, math.inf, reached, max(0, max_rt), need)
        segments += 1
        first_rt = first_rt or max_rt
        trained = min(left, trains)
        left -= trained
        # NOTE: a job bills its end past the trainer's exit (SageMaker's Uploading: the output and the last
        # checkpoint files; billed seconds rounded up), which the trainer's budget reserves as the margin: billed
        # in full, or the smallest cap leaves no slack for it and an uninterrupted run ends a step short (#28)
        billed = start + trained + (costs.save_s if left > 1e-9 else 0.0) + SEGMENT_END_MARGIN_S + \
            (STOP_BILL_S if stopped else 0.0)
        spent += (billed * share + warm) * costs.usd_per_s
    return Chain(True, segments, first_rt, spent, 1.0, 0, 0)


@dataclass(frozen=True)
class NextSegment:
    """The cost guard's next job of a chain (spotrun/pipeline/guard.py `_next_segment`): the chain from the newest
    checkpoint, the figures it was planned on (without the sentinel's room where only that fits), the job's
    MaxRuntime, and whether the run goes on (the chain fits and the job is within MAX_SEGMENTS)."""

    chain: Chain
    costs: ChainCosts
    max_runtime_s: int
    goes_on: bool


def next_segment(*, cap_usd: float, spent_usd: float, work_s: float, costs: ChainCosts, spot: bool,
                 segment: int) -> NextSegment:
    """The guard's rule at a job's end without the run finished (the simulator's too: spotrun/policy/execution.py):
    segment number `segment` goes on when the chain that trains `work_s` more from `spent_usd` finishes under the cap
    at the expected bill. An on-demand job keeps the room for a sentinel beside it (`costs.sentinel_room_s`) where
    the chain fits with it; where it fits only without, the job takes all the cap leaves (no sentinel fits beside
    it), not the run ended at the cap with a finish it can pay for (benchmarks/replay_bench.py --cap-x 2: a run
    ended at $56.18 of a $214.54 cap that it finished at $207.04 without a sentinel)."""
    chain = plan_chain(cap_usd=cap_usd, spent_usd=spent_usd, work_s=work_s, costs=costs, first=False, spot=spot)
    if not chain.fits and not spot and costs.sentinel_room_s:
        costs = replace(costs, sentinel_room_s=0.0)
        chain = plan_chain(cap_usd=cap_usd, spent_usd=spent_usd, work_s=work_s, costs=costs, first=False, spot=spot)
    kept = 0.0 if spot else costs.warm_pool_s + costs.sentinel_room_s  # on-demand: its warm pool, the sentinel's room
    max_rt = next_max_runtime(cap_usd=cap_usd, spent_usd=spent_usd, usd_per_s=costs.usd_per_s,
                              longest_s=costs.longest_s, warm_pool_s=kept)
    return NextSegment(chain, costs, max_rt, chain.fits and segment <= MAX_SEGMENTS)


def work_left_s(*, planned_steps: int, checkpoint_step: int | None, seconds_per_step: float,
                expected_overhead_s: float) -> float:
    """Training seconds still to do from the newest committed checkpoint (all of it without one), at the planned
    pace without further interruptions: the guard stops a run only when even an uninterrupted finish cannot fit
    (the interruptions so far are in the bills already). At least a step (or a second): the job ended without
    completing."""
    steps = max(1, planned_steps - (checkpoint_step or 0))
    interruptions = float(expected_overhead_s) / max(1, planned_steps)
    return max(1.0, steps * max(seconds_per_step - interruptions, 0.0))


def restart_wasted_s(*, max_runtime_s: float, billed_s: float, startup_s: float, step_s: float,
                     save_s: float) -> bool:
    """A job whose MaxRuntime left (`max_runtime_s` less `billed_s`) cannot hold a restart that trains a step: its
    start, one step (or a second), a save and the margin (the guard's `restart_wasted`)."""
    return max_runtime_s - billed_s < startup_s + max(step_s, 1.0) + save_s + SEGMENT_END_MARGIN_S


def cap_wait_s(*, cap_usd: float, spent_usd: float, usd_per_s: float) -> float:
    """The longest the guard waits before its next poll by the cap: the seconds left before the cap would be reached
    at on-demand rates, less the STOP_BILL_S a stop still bills (the guard's `next_wait`)."""
    return (cap_usd - spent_usd) / usd_per_s - STOP_BILL_S


def sentinel_room(*, cap_usd: float, spent_before_usd: float, usd_per_s: float, od_max_runtime_s: float,
                  od_warm_pool_s: float, longest_s: int, recheck_s: float, poll_s: float) -> tuple[int, int] | None:
    """(MaxRuntime, MaxWait) of a sentinel created beside an on-demand job of MaxRuntime `od_max_runtime_s`, or None
    when the cap leaves no room for one that can hold its instances until the guard's next look (`recheck_s`, then a
    poll) and its stop (the guard's `sentinel_limits`, spotrun/pipeline/guard.py, which says why)."""
    od_worst = (od_max_runtime_s + STOP_BILL_S + od_warm_pool_s) * usd_per_s
    room = (cap_usd - spent_before_usd - od_worst) / usd_per_s - STOP_BILL_S
    runtime = int(min(room, longest_s)) if room < math.inf else longest_s
    if runtime < recheck_s + poll_s or od_max_runtime_s == math.inf:
        return None
    return runtime, max(runtime, int(od_max_runtime_s))


def smallest_cap(*, spent_usd: float, work_s: float, costs: ChainCosts, first: bool, spot: bool = True,
                 stopped: bool = False) -> float:
    """The smallest cap (to the cent) whose chain fits: bisection between what is spent and one job's on-demand
    bound for all the work (a chain fits at the one and not below the other; more room never shortens it)."""
    one_job = spent_usd + (costs.startup_s + costs.restart_s + work_s + costs.save_s + SEGMENT_END_MARGIN_S
                           + STOP_BILL_S + costs.warm_pool_s + costs.sentinel_room_s) * costs.usd_per_s
    if work_s > costs.longest_s:  # SageMaker's 28 days: a chain of the longest jobs
        one_job += (work_s // costs.longest_s) * (costs.restart_s + costs.save_s) * costs.usd_per_s * 2
    low, high = spent_usd, max(one_job, spent_usd + 0.01)
    for _ in range(40):  # a chain that needs more than MAX_SEGMENTS jobs fits no cap: inf
        if plan_chain(cap_usd=high, spent_usd=spent_usd, work_s=work_s, costs=costs, first=first, spot=spot,
                      stopped=stopped).fits:
            break
        low, high = high, high * 2
    else:
        return math.inf
    low_c, high_c = math.floor(low * 100), math.ceil(high * 100)  # in cents: the cap a user can write
    while high_c - low_c > 1:
        mid = (low_c + high_c) // 2
        fits = plan_chain(cap_usd=mid / 100, spent_usd=spent_usd, work_s=work_s, costs=costs, first=first,
                          spot=spot, stopped=stopped).fits
        low_c, high_c = (low_c, mid) if fits else (mid, high_c)
    return high_c / 100


def chain_refusal(chain: Chain, cap_usd: float, smallest: float, costs: ChainCosts, spot: bool = True) -> str:
    """Why no chain fits, with the numbers (`spot`: the chain's jobs bill the spot share, else on-demand rates)."""
    basis = "the expected (spot) bill" if spot and costs.spot_fraction < 1.0 else "the on-demand bill"
    return (f"no chain of jobs fits {usd(cap_usd)}: while a job runs its bill is bounded at on-demand rates "
            f"(${costs.usd_per_s * 3600:,.2f}/h), so each job may run only what the cap leaves at those rates, "
            f"less the {STOP_BILL_S:.0f} s a stop bills; after {chain.segments} job(s) and "
            f"{share_done(chain.reached)} of the training at {basis}, the room left ({chain.room_left_s:,} s) is "
            f"under the {chain.needed_s:,} s the next job needs (its start, one step or the rest, its save and a "
            f"{SEGMENT_END_MARGIN_S} s margin); the smallest cap whose chain finishes is ${smallest:,.2f}")


def plan_segments(*, cap_usd: float, usd_per_s: float, spot_fraction: float, run_seconds: float,
                  startup_s: float, overhead_s: float, save_s: float, longest_s: int,
                  warm_pool_s: float = 0.0, step_s: float = 0.0, spot: bool = True) -> SegmentPlan:
    """The expected chain of the whole run: `run_seconds` is the single job's expected time (startup, training,
    the expected interruptions), `spot_fraction` the billed share of on-demand (1 - discount; 1 on-demand), `spot`
    whether its jobs are spot jobs (an on-demand job's MaxRuntime leaves room for its warm pool, which it bills)."""
    # NOTE: the first job's start is counted as a restart, as the first job's trainer budget counts it
    # (spotrun/planner/outputs.py `first_segment_seconds`): the trainer trains `segment_seconds` and no more, so a
    # chain planned on the shorter first start expected work the job never does (seen: accepted at $11.10, the
    # uninterrupted run stopped at the cap with $7.76 left; issue #28). It differs only by the checkpoint restore.
    costs = ChainCosts(usd_per_s=usd_per_s, spot_fraction=spot_fraction, startup_s=overhead_s, restart_s=overhead_s,
                       save_s=save_s, longest_s=longest_s, step_s=step_s, warm_pool_s=warm_pool_s)
    work = run_seconds - startup_s  # training still to do (with the expected interruptions' cost)
    # NOTE: the market is passed on: an on-demand run's chain planned as spot left its warm pool out of both the
    # MaxRuntime and the bill (a new user's qwen2 with compute.spot=false and 30 min of warm pool was accepted at
    # $0.83 with MaxRuntime 0.3 h and 'the bill to expect' $0.74; its warm pool alone bills $1.16)
    chain = plan_chain(cap_usd=cap_usd, spent_usd=0.0, work_s=work, costs=costs, first=True, spot=spot)
    smallest = smallest_cap(spent_usd=0.0, work_s=work, costs=costs, first=True, spot=spot)
    min_segment = int(math.ceil(overhead_s + max(step_s, 1.0) + save_s + SEGMENT_END_MARGIN_S))
    billed = chain.cost_usd / usd_per_s / spot_fraction if chain.fits else 0.0  # incl. warm pools: an upper side
    overhead_fraction = max(0.0, billed - run_seconds) / run_seconds if chain.fits else 0.0
    first = chain.first_max_runtime_seconds
    if not chain.fits:
        line = chain_refusal(chain, cap_usd, smallest, costs, spot=spot)
    elif chain.segments == 1:
        line = (f"the cap holds on on-demand rates while a job runs: one job, MaxRuntime {first / 3600:,.1f} h "
                f"({usd(first * usd_per_s)} at on-demand rates)")
    else:
        line = (f"the cap holds on on-demand rates while a job runs: {chain.segments} segments, the first "
                f"{first / 3600:,.1f} h, overhead {overhead_fraction:.0%}; the smallest cap that finishes with the "
                f"expected interruptions is ${smallest:,.2f} (the cap to set is the spot policy's "
                "last line: it also finishes at the simulated P95 bill)")
    one_cap, one_cost = (None, None)
    if chain.fits and chain.segments > 1:  # the user's choice: the chain's restarts, or a larger cap and one job
        one_cap, one_cost = _one_job(costs, work)
        if one_cap is not None:
            line += "; " + one_job_text(one_cap, one_cost, chain.segments, chain.cost_usd, cap_usd)
    return SegmentPlan(segments=chain.segments, first_max_runtime_seconds=first, longest_seconds=longest_s,
                       min_segment_seconds=min_segment, overhead_seconds=overhead_s,
                       overhead_fraction=round(overhead_fraction, 4),
                       spot_cost_usd=chain.cost_usd if chain.fits else None,  # no finite bill: null in JSON
                       on_demand_bound_usd=_one_job_bound(costs, work), fits=chain.fits,
                       line=line, spot_fraction=spot_fraction, min_cap_usd=smallest, chain_costs=asdict(costs),
                       work_seconds=work, one_job_cap_usd=one_cap, one_job_expected_usd=one_cost)


def job_start_s(segments: SegmentPlan) -> float:
    """What every job of the chain bills before its first step (the first one's too: `plan_segments`' NOTE):
    provisioning, image and data, the trainer's start, the weights and the checkpoint read. The simulation of the
    run starts its jobs with this figure, so one run has one bill in the cost row, the policy table and the caps."""
    return float(segments.overhead_seconds)


def _one_job_bound(costs: ChainCosts, work_s: float) -> float:
    """What one job of all the work `work_s` needs at on-demand rates (to the cent up): its start as the chain
    bills it, the work, its save, its end and a stop, with its warm pool; SageMaker's longest job aside. It was
    the single job's time with the catalog's bare startup and no save or end: $0.69 for qwen2 with
    compute.spot=false, under the $0.74 the same job bills (issue #28)."""
    rest = costs.startup_s + work_s + costs.save_s + SEGMENT_END_MARGIN_S + STOP_BILL_S + costs.warm_pool_s
    return math.ceil(round(rest * costs.usd_per_s * 100, 6)) / 100


def _one_job_cap(costs: ChainCosts, work_s: float) -> float:
    """The smallest cap (to the cent) at which the chain of `work_s` is one job: its MaxRuntime holds the start, all
    the work, the save, the margin and a stop at on-demand rates (inf where SageMaker's longest job cannot)."""
    rest = math.ceil(costs.startup_s + work_s + costs.save_s + SEGMENT_END_MARGIN_S)
    if rest > costs.longest_s:
        return math.inf
    cap = math.ceil(round((rest + STOP_BILL_S) * costs.usd_per_s * 100, 6)) / 100
    one = plan_chain(cap_usd=cap, spent_usd=0.0, work_s=work_s, costs=costs, first=True).segments == 1
    return cap if one else cap + 0.01  # a MaxRuntime floored a second short


def _one_job(costs: ChainCosts, work_s: float) -> tuple[float | None, float | None]:
    """The one-job cap of the chain of `work_s` and the chain's expected bill there, both by `plan_chain` (None,
    None where no one job holds the run)."""
    cap = _one_job_cap(costs, work_s)
    if cap == math.inf:
        return None, None
    return cap, plan_chain(cap_usd=cap, spent_usd=0.0, work_s=work_s, costs=costs, first=True).cost_usd


def one_job_text(one_cap_usd: float, one_cost_usd: float, jobs: int, chain_cost_usd: float, cap_usd: float) -> str:
    """What a chain of `jobs` at `cap_usd` costs beside the run as one job: the smallest cap at which it is one job
    and the expected bills (the chain's restarts against the caps' difference), so the user can choose."""
    return (f"the run is one job from a cap of ${one_cap_usd:,.2f}: expected {usd(one_cost_usd)} there, "
            f"{usd(chain_cost_usd)} as the chain of {jobs} jobs at ${cap_usd:,.2f}")


def chain_at(segments: SegmentPlan, cap_usd: float) -> tuple[int, float | None]:
    """The expected chain of `segments` at `cap_usd`: its jobs and its expected bill (None where it does not fit)."""
    chain = plan_chain(cap_usd=cap_usd, spent_usd=0.0, work_s=segments.work_seconds,
                       costs=ChainCosts(**segments.chain_costs), first=True)
    return chain.segments, chain.cost_usd if chain.fits else None


def one_job_at(segments: SegmentPlan) -> tuple[float | None, float | None]:
    """The smallest cap at which the expected chain of `segments` is one job and its expected bill there (None,
    None where no one job holds the run)."""
    return _one_job(ChainCosts(**segments.chain_costs), segments.work_seconds)


def one_job_cap_usd(segments: SegmentPlan) -> float:
    """The smallest cap (to the cent) at which the expected chain of `segments` is one job: its MaxRuntime holds the
    start, all the work, the save, the margin and a stop at on-demand rates (inf where SageMaker's longest job
    cannot hold them)."""
    return _one_job_cap(ChainCosts(**segments.chain_costs), segments.work_seconds)


def uncapped_cost_usd(segments: SegmentPlan) -> float:
    """The expected chain's bill with no cap binding (one job, or SageMaker's longest jobs): what an accepted
    estimate's cost row shows at a cap that carries the run as one job, and what a refusal quotes."""
    return plan_chain(cap_usd=math.inf, spent_usd=0.0, work_s=segments.work_seconds,
                      costs=ChainCosts(**segments.chain_costs), first=True, spot=_spot(segments)).cost_usd


def longest_job_cap_usd(segments: SegmentPlan) -> float | None:
    """The least cap (to the cent, up) at which the first job's MaxRuntime is the longest (`next_max_runtime`: the
    planner's limit for one job), so its MaxWait (MaxRuntime + the accepted delay) the longest too: a larger cap
    lengthens neither. None without the chain's figures."""
    costs = segments.chain_costs if segments else None
    if not costs:
        return None
    usd = (costs["longest_s"] + STOP_BILL_S + costs.get("warm_pool_s", 0.0)) * costs["usd_per_s"]
    cap = math.ceil(round(usd * 100, 6)) / 100
    while room_seconds(cap, 0.0, costs["usd_per_s"], costs.get("warm_pool_s", 0.0)) < costs["longest_s"]:
        cap += 0.01  # the float's rounding
    return round(cap, 2)


def segments_at(segments: SegmentPlan, cap_usd: float) -> int:
    """How many jobs the expected chain of `segments` (planned at the run's cap) has at `cap_usd` instead (where
    none fits: the jobs it starts). Never more at a larger cap (a second's rounding of MaxRuntime aside): each job's
    room grows by the added cap at on-demand rates and its bill by at most the spot share of that, so every later
    job has at least the room and at most the work left."""
    return plan_chain(cap_usd=cap_usd, spent_usd=0.0, work_s=segments.work_seconds,
                      costs=ChainCosts(**segments.chain_costs), first=True, spot=_spot(segments)).segments


def _spot(segments: SegmentPlan) -> bool:
    """Whether the expected chain's jobs are spot jobs (an on-demand run's bill the whole on-demand rate, and its
    jobs' warm pools: only an on-demand run has one)."""
    return segments.spot_fraction < 1.0 or not segments.chain_costs.get("warm_pool_s")


def on_demand_cap_usd(segments: SegmentPlan, work_s: float) -> float:
    """The smallest cap (to the cent) whose on-demand chain of `work_s` (no expected interruptions) finishes: what
    the cost guard needs to carry an on-demand policy's jobs, each billed at on-demand rates in full (its MaxRuntime
    is the room the cap leaves at those rates). It is `finish_cap_usd(segments, bill, spot=False)` of that chain's
    one-job bill, from the work itself: an on-demand row simulated at a binding cap counts its chain's restarts in
    its bill, which the finish cap's own chain would count again."""
    costs = ChainCosts(**{**segments.chain_costs, "spot_fraction": 1.0})
    return smallest_cap(spent_usd=0.0, work_s=max(work_s, 1.0), costs=costs, first=True, spot=False)


def on_demand_segments_at(segments: SegmentPlan, cap_usd: float, work_s: float) -> int:
    """How many jobs an on-demand chain of `work_s` (no expected interruptions) has at `cap_usd` (where none fits:
    the jobs it starts): what an on-demand policy of a spot run is split into."""
    costs = ChainCosts(**{**segments.chain_costs, "spot_fraction": 1.0})
    return plan_chain(cap_usd=cap_usd, spent_usd=0.0, work_s=max(work_s, 1.0), costs=costs, first=True,
                      spot=False).segments


def finish_cap_usd(segments: SegmentPlan, bill_usd: float, spot: bool = True, sentinel_room_s: float = 0.0) -> float:
    """The smallest cap whose chain carries a run that one job (the cap not binding) bills `bill_usd` for: that
    bill's billed time as the chain's work (`segments`: the estimate's expected chain). More than the bill plus one
    restart: the last job's MaxRuntime must hold its start, its training and its end at on-demand rates, of which it
    bills only the spot share, and a stop; a cap below this can strand a run whose bill it covers (issue #28). At least
    the expected chain's smallest cap (a bill simulated on traces can be under the chain's expectation).

    Each job of a spot chain also bills a stop: an interrupted job restarts its trainer, whose segment clock
    (`segment_seconds`) starts again with it, so it trains until SageMaker stops it at MaxRuntime and bills the
    stop a cleanly ended job does not (seen: Llama 3 8B on one g6e.48xlarge, interrupted before its first checkpoint,
    its own bill within the P95, stopped at the cap named without it: $86.65, its chain needing $86.72).

    `spot`: the run can bill spot (False: an on-demand policy's, every second at on-demand rates, its jobs never
    interrupted). The cap depends only on that bill and the markets the run can bill it in: the same on-demand P95
    was told $0.83 with compute.spot=false and several times that with on_demand chosen on spot=true (its seconds
    taken at the spot share). A policy that can run spot keeps the spot share even where its P95 was billed
    on-demand (`SpotPolicy.p95_one_job_on_demand_usd`): the cap must carry every run billed within the P95, and of
    the runs billing a sum the one billing it all on spot runs longest, each of its seconds bounded at on-demand
    rates while its job runs (qwen2 on spot, uniform_progress, a P95 billed on-demand throughout: $1.45, the $0.83
    the same bill needs on-demand named beside it; docs/cap-and-segments.md).

    `sentinel_room_s`: what the policy keeps beside an on-demand job for its sentinel (spotrun/policy/decision.py
    `sentinel_room_s`), added at on-demand rates: an on-demand job then has, at any spend, the MaxRuntime it has
    without a sentinel at the cap without the room, and the guard the room to create the sentinel."""
    costs = ChainCosts(**segments.chain_costs)
    spot = spot and costs.spot_fraction < 1.0
    if not spot:  # an on-demand chain: no spot share, and its jobs end cleanly (no stop billed)
        costs = ChainCosts(**{**segments.chain_costs, "spot_fraction": 1.0})
    # an on-demand run's bill holds its last job's warm pool (spotrun/policy/execution.py `bill_last_warm_pool`),
    # which is no work: the chain bills every job's pool itself
    bill_usd = max(0.0, bill_usd - costs.warm_pool_s * costs.usd_per_s)
    work = bill_usd / (costs.usd_per_s * costs.spot_fraction) - costs.startup_s - JOB_END_S
    finish = smallest_cap(spent_usd=0.0, work_s=max(work, 1.0), costs=costs, first=True, spot=spot, stopped=spot)
    room = math.ceil(sentinel_room_s * costs.usd_per_s * 100) / 100  # in cents, up
    return round(max(segments.min_cap_usd, finish) + room, 2)


def speed_margin(segments: SegmentPlan, cap_usd: float, spot: bool = False) -> float:
    """How much slower than planned the trainer may train (a share of the planned training time) before the chain at
    `cap_usd` no longer carries the run: past it the job's MaxRuntime comes first, the trainer saves and exits at its
    segment's end (`segment_seconds`), and the next job does not fit in what the cap leaves, so the guard ends the
    run at the cap (OverBudget) with its newest checkpoint and no model. At an on-demand run's cap to set it was
    seconds (mistral-7b LoRA at $31.70: 8 s of 13.45 h); `spot`: the chain at the spot share (0.0: none fits)."""
    costs, work = ChainCosts(**segments.chain_costs), segments.work_seconds

    def fits(share: float) -> bool:
        return plan_chain(cap_usd=cap_usd, spent_usd=0.0, work_s=work * (1 + share), costs=costs, first=True,
                          spot=spot).fits

    if work <= 0 or not fits(0.0):
        return 0.0
    low, high = 0.0, 1e-4
    while fits(high):  # more work never fits where less does not
        low, high = high, high * 2
        if high > 1e3:
            return math.inf
    for _ in range(40):
        mid = (low + high) / 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low
