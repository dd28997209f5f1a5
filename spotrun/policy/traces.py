"""Spot capacity traces the simulator replays: generated from a seed, or read from recordings.

A trace is the list of windows in which spot capacity is there for the job, `[(start_s, end_s), ...]`, sorted
and disjoint, from the job's creation at 0 s. A running spot job is interrupted when its window ends; it restarts
when the next window begins. A generated trace's last window is open (`end = inf`): it is drawn past any
deadline, MaxWait or expected finish it was made for. A replayed recording ends with `(inf, inf)` instead:
capacity never returns after what was recorded.

Sources (stdlib only: the estimate Lambda runs this):
- `generate` with `fitted` (the estimate's): stretches with and without capacity from the availability model fitted
  to the public recordings (spotrun/policy/availability.py), the first scaled by the interruption rate.
- `generate` otherwise (synthetic): Poisson interruptions at a rate per job-hour, a wait for capacity after each
  (exponential), bursts (an interruption followed by another within 3 minutes of the restart: most
  co-interruptions of one type and zone land within 3 minutes of each other) and droughts (no capacity for hours
  to days: the public traces show stretches without capacity of up to 80 h); `spotrun simulate --droughts`.
- The rate: the interruption recorder's measured rate, else the catalog's, else an AWS Spot Instance Advisor band
  (`advisor_rate`; bands of interruption frequency over the trailing month: <5%, 5-10%, 10-15%, 15-20%, >20%).
- `read_availability`: traces in the format of github.com/skypilot-org/spot-traces (`{"metadata":
  {"gap_seconds": N}, "data": [...]}`, each value the number of instances available, per that repository's
  README), turned into windows where at least the job's instance count is available; `recorded_traces` replays
  one from N start offsets, wrapping around its end; after the replay's horizon there is no capacity (the
  sentinel window `(inf, inf)`: the end of a recording is never read as capacity).
- The interruption recorder's table: `interruption_gaps` (time between a job's consecutive interruptions) and
  `resampled_traces` (windows drawn from those gaps).
"""

from __future__ import annotations

import bisect
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

from ..contract.strict_json import show
from .availability import fitted_trace

INF = math.inf
Windows = list[tuple[float, float]]
HOURS_PER_MONTH = 730.0
# The Spot Instance Advisor's bands (fraction of instances interrupted over the trailing month) and the
# frequency each is simulated at: the middle of the band, 30% for ">20%".
ADVISOR_BANDS = {"<5%": 0.025, "5-10%": 0.075, "10-15%": 0.125, "15-20%": 0.175, ">20%": 0.30}
BURST_WINDOW_S = 180.0


def advisor_rate(band: str, instance_count: int = 1) -> float:
    """Interruptions per job-hour for an Advisor band: a fraction p interrupted in a month is a Poisson rate of
    -ln(1 - p) / 730 per instance-hour, times the job's instances (each one's reclaim stops the job)."""
    if band not in ADVISOR_BANDS:
        raise ValueError(f"band={band!r} is invalid: expected one of {', '.join(ADVISOR_BANDS)}")
    return -math.log(1 - ADVISOR_BANDS[band]) / HOURS_PER_MONTH * instance_count


@dataclass(frozen=True)
class TraceSpec:
    """How generated traces are drawn."""

    interruptions_per_hour: float
    """Interruptions per job-hour (all the job's instances together)."""
    horizon_s: float
    """How far each trace is drawn; capacity stays after it."""
    restart_wait_s: float = 600.0
    """Mean wait for capacity after an interruption (exponential)."""
    burst_p: float = 0.0
    """Probability that an interruption is followed by another within 3 minutes of the restart."""
    droughts_per_day: float = 0.0
    """Rate of droughts (no capacity at all), Poisson."""
    drought_hours: tuple[float, float] = (6.0, 80.0)
    """Each drought's length, uniform between these."""
    fitted: bool = False
    """Draw the stretches with and without capacity from the availability model fitted to recorded capacity
    (spotrun/policy/availability.py) at `interruptions_per_hour`, instead of the waits, bursts and droughts above."""
    mean_wait_s: float | None = None
    """With `fitted`: the waits for capacity's long-run mean in seconds (recorded, or the run's
    checkpoint.mean_wait_hours), instead of the model's power law at `interruptions_per_hour`."""

    def __post_init__(self):
        for name in ("interruptions_per_hour", "restart_wait_s", "droughts_per_day"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}={getattr(self, name)!r} is invalid: expected a number >= 0")
        if not 0 <= self.burst_p < 1:
            raise ValueError(f"burst_p={self.burst_p!r} is invalid: expected 0 <= p < 1")
        if not self.horizon_s > 0:
            raise ValueError(f"horizon_s={self.horizon_s!r} is invalid: expected > 0")
        if self.mean_wait_s is not None and not 0 < self.mean_wait_s < math.inf:
            raise ValueError(f"mean_wait_s={self.mean_wait_s!r} is invalid: expected a number of seconds > 0")


def _droughts(spec: TraceSpec, rng: random.Random) -> Windows:
    """Drought intervals, drawn from before 0 so that a trace may begin inside one."""
    if spec.droughts_per_day <= 0:
        return []
    lo, hi = spec.drought_hours
    rate = spec.droughts_per_day / 86400
    out: Windows = []
    t = -hi * 3600
    while True:
        t += rng.expovariate(rate)
        if t >= spec.horizon_s:
            return out
        end = t + rng.uniform(lo, hi) * 3600
        if end > 0:
            out.append((max(0.0, t), end))
        t = end


def _subtract(windows: Windows, holes: Windows) -> Windows:
    if not holes:
        return windows
    out: Windows = []
    j = 0
    for a, b in windows:
        while j < len(holes) and holes[j][1] <= a:
            j += 1
        k, cur = j, a
        while k < len(holes) and holes[k][0] < b:
            if holes[k][0] > cur:
                out.append((cur, holes[k][0]))
            cur = max(cur, holes[k][1])
            k += 1
        if cur < b:
            out.append((cur, b))
    return out


def generate(spec: TraceSpec, rng: random.Random) -> Windows:
    """One trace: windows of capacity between interruptions, waits and droughts (see the module docstring)."""
    if spec.fitted:
        return fitted_trace(spec.interruptions_per_hour, spec.horizon_s, rng, mean_wait_s=spec.mean_wait_s)
    rate = spec.interruptions_per_hour / 3600
    out: Windows = []
    t, burst = 0.0, False
    while t < spec.horizon_s:
        up = rng.uniform(0, BURST_WINDOW_S) if burst else (rng.expovariate(rate) if rate > 0 else INF)
        end = t + up
        if end >= spec.horizon_s:
            break
        out.append((t, end))
        burst = rng.random() < spec.burst_p
        t = end + (rng.expovariate(1 / spec.restart_wait_s) if spec.restart_wait_s > 0 else 0.0)
    out.append((t, INF))
    return _subtract(out, _droughts(spec, rng))


def generated_traces(spec: TraceSpec, n: int, seed: int = 0) -> list[Windows]:
    rng = random.Random(seed)
    return [generate(spec, rng) for _ in range(n)]


def windows_from_counts(values: list[float], gap_s: float, instances: int = 1) -> Windows:
    """Windows where at least `instances` instances are available in a series of counts one gap apart."""
    out: Windows = []
    start = None
    for i, v in enumerate(values):
        if v >= instances and start is None:
            start = i * gap_s
        elif v < instances and start is not None:
            out.append((start, i * gap_s))
            start = None
    if start is not None:
        out.append((start, len(values) * gap_s))
    return out


@dataclass(frozen=True)
class Recording:
    """One recorded availability trace: its windows over `length_s` (it wraps around when replayed)."""

    name: str
    windows: Windows
    length_s: float

    @property
    def available_fraction(self) -> float:
        return sum(b - a for a, b in self.windows) / self.length_s


GAP_RANGE_S = (1.0, 86400.0)  # what recordings have: spot-traces samples every 195-600 s; 1 s to 1 day accepted
MAX_SAMPLES = 10_000_000


def read_availability(path: Path, instances: int = 1) -> Recording:
    """A trace file in the skypilot-org/spot-traces format; ValueError (one line) naming the file, the field,
    the bad value and what is accepted: gap_seconds a finite number in GAP_RANGE_S, data a non-empty list of
    finite counts >= 0 with at least one of `instances` or more (a trace without capacity is refused: every
    spot policy would wait on it forever)."""
    try:
        doc = json.loads(Path(path).read_text())
        gap, data = doc["metadata"]["gap_seconds"], doc["data"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: expected a spot-traces file {{\"metadata\": {{\"gap_seconds\": N}}, \"data\": "
                         f"[instances available, ...]}} ({exc})") from None
    lo, hi = GAP_RANGE_S
    if isinstance(gap, bool) or not isinstance(gap, (int, float)) or not lo <= gap <= hi:
        raise ValueError(f"{path}: metadata.gap_seconds={show(gap)} is invalid: expected a number of seconds from "
                         f"{lo:g} to {hi:g} (recordings sample every few minutes)")
    if not isinstance(data, list) or not data or len(data) > MAX_SAMPLES:
        raise ValueError(f"{path}: data is invalid: expected a list of 1 to {MAX_SAMPLES:,} counts of instances "
                         f"available")
    bad = next((v for v in data if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < INF), None)
    if bad is not None:
        raise ValueError(f"{path}: data has {show(bad)}: expected finite counts of instances available, >= 0")
    if max(data) < instances:
        raise ValueError(f"{path}: no capacity at all: no sample has {instances} or more instances available "
                         f"(the most is {max(data):g}); a spot job would wait on this trace forever")
    gap = float(gap)
    return Recording(Path(path).name, windows_from_counts(data, gap, instances), gap * len(data))


def replay(rec: Recording, offset_s: float, horizon_s: float) -> Windows:
    """The recording seen by a job created at `offset_s` into it, wrapped around its end (the recording is
    taken to repeat) up to `horizon_s`. Nothing is assumed after that: the trace ends with the sentinel
    `(inf, inf)` (no capacity ever again), so a policy still waiting for spot there does not finish; a window
    open at the horizon keeps its recorded end."""
    out: Windows = []
    starts = [a for a, _ in rec.windows]
    base = -offset_s
    i = max(0, bisect.bisect_right(starts, offset_s) - 1)
    while base < horizon_s and rec.windows:
        for a, b in rec.windows[i:]:
            a, b = a + base, b + base
            if b <= 0:
                continue
            if a >= horizon_s:
                break
            if out and abs(out[-1][1] - max(a, 0.0)) < 1e-9:  # joined across the wrap
                out[-1] = (out[-1][0], b)
            else:
                out.append((max(a, 0.0), b))
        base += rec.length_s
        i = 0
    out.append((INF, INF))
    return out


def recorded_traces(recordings: list[Recording], n: int, horizon_s: float, seed: int = 0) -> list[Windows]:
    """n traces: each a recording (in turn) replayed from a random start offset."""
    rng = random.Random(seed)
    return [replay(rec, rng.uniform(0, rec.length_s), horizon_s)
            for rec in (recordings[i % len(recordings)] for i in range(n))]


def interruption_times(windows: Windows, limit: int) -> list[float]:
    """A job's interruptions in its own running time: the capacity it had used by each end of a window (waits
    for capacity take no running time). At most `limit`."""
    out: list[float] = []
    used = 0.0
    for a, b in windows:
        if b == INF or len(out) >= limit:
            break
        used += b - a
        out.append(used)
    return out


def interruption_gaps(items: list[dict], instance_type: str | None = None) -> list[float]:
    """Seconds between consecutive interruptions of the same job, from the interruption recorder's items
    (spotrun/planner/measured.py: pk = job, sk = "INTERRUPTED#<epoch>"), optionally of one instance type."""
    by_job: dict[str, list[float]] = {}
    for item in items:
        if item.get("kind") != "interruption" or (instance_type and item.get("instance_type") != instance_type):
            continue
        by_job.setdefault(str(item["pk"]), []).append(float(str(item["sk"]).split("#", 1)[1]))
    return [b - a for times in by_job.values() for a, b in zip(sorted(times), sorted(times)[1:], strict=False)
            if b > a]


def resampled_traces(gaps: list[float], n: int, horizon_s: float, *, restart_wait_s: float = 600.0,
                     seed: int = 0) -> list[Windows]:
    """Traces whose capacity windows are recorded gaps between interruptions, drawn with replacement (each gap
    less the mean wait for capacity, which follows it as in `generate`)."""
    if not gaps:
        raise ValueError("no recorded gaps between interruptions: record more runs, or generate traces from a rate")
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        t, windows = 0.0, []
        while t < horizon_s:
            up = max(1.0, rng.choice(gaps) - restart_wait_s)
            windows.append((t, t + up))
            t += up + (rng.expovariate(1 / restart_wait_s) if restart_wait_s > 0 else 0.0)
        windows.append((t, INF))
        out.append(windows)
    return out
