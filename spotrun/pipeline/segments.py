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

Segment overhead: every new job provisions instances, pulls the image, downloads data, loads the model and
restores the checkpoint, and saves one at its end (`segment_overhead_seconds`). The planner simulates the chain
greedily (each segment as long as the room allows, the expected spot bill deducted) to count segments, put their
overhead into the estimate, and refuse a cap that cannot carry the run; the guard applies the same rule to the
real bills (`next_max_runtime`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ..planner.catalog import usd
from ..seams import StopNotice

STOP_BILL_S = StopNotice.NOTICE_S  # a stop (StopTrainingJob, MaxRuntime) bills until the container exits
MAX_SEGMENTS = 40  # a chain longer than this spends more on restarts than it is worth: refused
SEGMENT_END_MARGIN_S = 60  # the trainer ends its segment this long before the save must start (a slow step)
MIN_TRAINING_S = 600  # the shortest sensible segment trains at least this long (and at least its own overhead)


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
class SegmentPlan:
    """The planned chain, from expected figures (the guard recomputes each segment from the real bills)."""

    segments: int
    first_max_runtime_seconds: int
    longest_seconds: int  # no job runs longer than this (the single-job MaxRuntime)
    min_segment_seconds: int  # the guard ends the run at the cap when the room falls below this
    overhead_seconds: float  # one segment restart (provisioning, image, data, model load, restore, final save)
    overhead_fraction: float  # the chain's restarts over the single job's time
    spot_cost_usd: float  # the expected bill with the restarts
    on_demand_bound_usd: float  # the single job's bound at on-demand rates (what one job would need)
    fits: bool
    line: str

    def to_json(self) -> dict:
        return asdict(self)


def plan_segments(*, cap_usd: float, usd_per_s: float, spot_fraction: float, run_seconds: float,
                  startup_s: float, overhead_s: float, save_s: float, longest_s: int,
                  warm_pool_s: float = 0.0) -> SegmentPlan:
    """The expected chain: `run_seconds` is the single job's expected time (startup, training, interruptions),
    `spot_fraction` the billed share of on-demand (1 - discount; 1 on-demand)."""
    min_segment = int(max(2 * overhead_s, overhead_s + MIN_TRAINING_S) + save_s + SEGMENT_END_MARGIN_S)
    left = run_seconds - startup_s  # training still to do (with the expected interruptions' cost)
    spent, segments, first, billed_total = 0.0, 0, 0, 0.0
    fits = True
    while left > 0:
        max_rt = next_max_runtime(cap_usd=cap_usd, spent_usd=spent, usd_per_s=usd_per_s, longest_s=longest_s,
                                  warm_pool_s=warm_pool_s)
        start = startup_s if segments == 0 else overhead_s
        # a segment that carries the rest of the run may be shorter than the shortest sensible one
        rest = int(math.ceil(start + left + save_s + SEGMENT_END_MARGIN_S))
        if max_rt < min(min_segment, rest) or segments >= MAX_SEGMENTS:
            fits = False
            break
        segments += 1
        first = first or max_rt
        trained = min(left, segment_seconds(max_rt, startup_s=start, save_s=save_s))
        left -= trained
        billed = start + trained + (save_s if left > 0 else 0.0)  # the final save is in run_seconds
        billed_total += billed
        spent += billed * usd_per_s * spot_fraction + warm_pool_s * usd_per_s
    single = run_seconds  # the single job's bill, for comparison
    overhead_fraction = max(0.0, billed_total - single) / single if fits else 0.0
    spot_cost = spent if fits else float("inf")
    bound = (run_seconds + STOP_BILL_S + warm_pool_s) * usd_per_s
    if not fits:
        need = min(min_segment, rest)
        line = (f"at on-demand rates (the bound while a job runs) {usd(cap_usd)} allows {segments} segment(s) "
                f"before the room left ({max(max_rt, 0):,} s after the {STOP_BILL_S:.0f} s a stop bills) falls "
                f"below the next segment's {need:,} s ({usd((need + STOP_BILL_S + warm_pool_s) * usd_per_s)})")
    elif segments == 1:
        line = (f"the cap holds on on-demand rates while a job runs: one job, MaxRuntime {first / 3600:,.1f} h "
                f"({usd(first * usd_per_s)} at on-demand rates)")
    else:
        line = (f"the cap holds on on-demand rates while a job runs: {segments} segments, the first "
                f"{first / 3600:,.1f} h, overhead {overhead_fraction:.0%}")
    return SegmentPlan(segments=segments, first_max_runtime_seconds=first, longest_seconds=longest_s,
                       min_segment_seconds=min_segment, overhead_seconds=overhead_s,
                       overhead_fraction=round(overhead_fraction, 4), spot_cost_usd=spot_cost,
                       on_demand_bound_usd=bound, fits=fits, line=line)
