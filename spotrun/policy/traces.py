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
  sentinel window `(inf, inf)`: the end of a recording is never read as capacity). `read_recordings` reads a
  directory's files: broken ones refuse it (TraceFileError, each named), those without the job's node count are
  left out (NoCapacity) and named.
- The interruption recorder's table: `interruption_gaps` (time between a job's consecutive interruptions) and
  `resampled_traces` (windows drawn from those gaps).
"""

from __future__ import annotations

import bisect
import math
import random
import re
from dataclasses import dataclass
from pathlib import Path

from ..contract.json_text import JsonSyntaxError, loads, with_excerpt
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
MAX_TRACE_BYTES = 512 * 2**20  # a 10,000,000-sample recording is ~30 MB of JSON; more is not a trace
TRACE_FORMAT = '{"metadata": {"gap_seconds": N}, "data": [instances available, ...]}'


class TraceFileError(ValueError):
    """A trace file that cannot be read as a recording: one line naming the file, the field, what was found and
    what is accepted."""


class NoCapacity(TraceFileError):
    """A well-formed recording in which no sample has the job's instance count available: it records nothing a
    job of that size could run on (a trace without capacity, or one recorded for fewer nodes)."""

    def __init__(self, path: Path, instances: int, most: float):
        self.path, self.instances, self.most = Path(path), instances, most
        super().__init__(f"{path}: no capacity at all for the job: no sample has {instances} instance"
                         f"{'s' * (instances != 1)} available (the most is {most:g}); a spot job would wait on this "
                         "trace forever")

    @property
    def reason(self) -> str:
        return (f"no sample has {self.instances} instance{'s' * (self.instances != 1)} available, the most is "
                f"{self.most:g}")


def _kind(value) -> str:
    """A JSON value's kind in JSON's words (an object, an array, a string...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"{'true' if value else 'false'}"
    return {dict: "an object", list: "an array", str: f"the string {show(value)}"}.get(type(value), show(value))


def _document(path: Path):
    """The JSON value of a trace file, or TraceFileError naming the file and what is wrong with its bytes."""
    try:
        if Path(path).stat().st_size > MAX_TRACE_BYTES:
            raise TraceFileError(f"{path}: {Path(path).stat().st_size:,} bytes is too large: expected a spot-traces "
                                 f"file of at most {MAX_TRACE_BYTES // 2**20} MiB")
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise TraceFileError(f"{path}: cannot be read ({exc.strerror or 'an operating-system error'}): expected a "
                             f"spot-traces file {TRACE_FORMAT}") from None
    if not raw.strip():
        raise TraceFileError(f"{path}: the file is empty: expected a spot-traces file {TRACE_FORMAT}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TraceFileError(f"{path}: not text (byte {exc.start:,} is not UTF-8: a binary file?): expected a "
                             f"spot-traces JSON file {TRACE_FORMAT}") from None
    try:
        return loads(text, parse_constant=lambda name: name)  # NaN/Infinity: kept as text, refused below
    except JsonSyntaxError as exc:
        raise TraceFileError(with_excerpt(f"{path}: not valid JSON ({exc.where_what}): expected a spot-traces "
                                          f"file {TRACE_FORMAT}", exc.excerpt)) from None
    except RecursionError:
        raise TraceFileError(f"{path}: JSON nested too deep: expected a spot-traces file {TRACE_FORMAT}") from None


def _count(value) -> bool:
    """Whether a sample is a count of instances: a whole number >= 0 (1.0 is 1)."""
    return (not isinstance(value, bool) and isinstance(value, (int, float)) and 0 <= value < INF
            and float(value).is_integer())


def read_availability(path: Path, instances: int = 1) -> Recording:
    """A trace file in the skypilot-org/spot-traces format; TraceFileError (a ValueError, one line) naming the
    file, the field (`metadata.gap_seconds`, `data[i]`), what was found and what is accepted: an object whose
    metadata.gap_seconds is a number of seconds in GAP_RANGE_S and whose data is a list of 1 to MAX_SAMPLES whole
    counts >= 0; NoCapacity (a TraceFileError) when no sample has `instances` or more (every spot policy would
    wait on it forever)."""
    doc = _document(path)
    if not isinstance(doc, dict):
        raise TraceFileError(f"{path}: the document is {_kind(doc)}: expected an object {TRACE_FORMAT}")
    for key in ("metadata", "data"):
        if key not in doc:
            raise TraceFileError(f"{path}: no \"{key}\" field: expected an object {TRACE_FORMAT}")
    meta, data = doc["metadata"], doc["data"]
    if not isinstance(meta, dict) or "gap_seconds" not in meta:
        found = "no gap_seconds in it" if isinstance(meta, dict) else f"it is {_kind(meta)}"
        raise TraceFileError(f"{path}: metadata is invalid ({found}): expected an object {{\"gap_seconds\": N}}, the "
                             "seconds between samples")
    gap = meta["gap_seconds"]
    lo, hi = GAP_RANGE_S
    if isinstance(gap, bool) or not isinstance(gap, (int, float)) or not lo <= gap <= hi:
        shown = gap if isinstance(gap, str) and gap in ("NaN", "Infinity", "-Infinity") else show(gap)
        raise TraceFileError(f"{path}: metadata.gap_seconds={shown} is invalid: expected a number of seconds from "
                             f"{lo:g} to {hi:g} (recordings sample every few minutes)")
    if not isinstance(data, list) or not data or len(data) > MAX_SAMPLES:
        found = (f"{len(data):,} samples" if isinstance(data, list) and data else "an empty array"
                 if isinstance(data, list) else _kind(data))
        raise TraceFileError(f"{path}: data is invalid ({found}): expected an array of 1 to {MAX_SAMPLES:,} counts "
                             "of instances available, one per gap_seconds")
    at = next((i for i, v in enumerate(data) if not _count(v)), None)
    if at is not None:
        bad = data[at]
        shown = bad if isinstance(bad, str) and bad in ("NaN", "Infinity", "-Infinity") else show(bad)
        raise TraceFileError(f"{path}: data[{at:,}]={shown} is invalid: expected a whole count of instances "
                             "available, 0 or more")
    if max(data) < instances:
        raise NoCapacity(path, instances, max(data))
    gap = float(gap)
    return Recording(Path(path).name, windows_from_counts(data, gap, instances), gap * len(data))


@dataclass(frozen=True)
class LeftOut:
    """A recording left out of a directory's replay, and why."""

    path: Path
    reason: str
    most: float
    """The most instances any sample has."""


SHOWN_ERRORS = 5  # of several unusable files, this many are named in the one line; the rest are counted


def read_recordings(files: list[Path], instances: int = 1) -> tuple[list[Recording], list[LeftOut]]:
    """The recordings of a directory's trace files and those left out: a file no sample of which has `instances`
    available (NoCapacity) is left out and named, so that a directory of 1- and 16-node recordings serves a run
    of either size; refused (TraceFileError, one line) when any file is not a recording (every such file named,
    up to SHOWN_ERRORS: a broken file is a mistake to fix, not data to skip) or when none has the capacity."""
    recs, left, broken = [], [], []
    for path in files:
        try:
            recs.append(read_availability(path, instances))
        except NoCapacity as exc:
            left.append(LeftOut(Path(path), exc.reason, exc.most))
        except TraceFileError as exc:
            broken.append(str(exc))
    if broken:
        more = f"; and {len(broken) - SHOWN_ERRORS:,} more" if len(broken) > SHOWN_ERRORS else ""
        head = f"{len(broken)} of {len(files)} trace files are not recordings: " if len(broken) > 1 else ""
        raise TraceFileError(head + "; ".join(broken[:SHOWN_ERRORS]) + more)
    if not recs and len(left) == 1:
        raise NoCapacity(left[0].path, instances, left[0].most)
    if not recs:
        most = max((x.most for x in left), default=0.0)
        raise TraceFileError(f"none of the {len(files)} trace file{'s' * (len(files) != 1)} has capacity for the "
                             f"job: no sample has {instances} instance{'s' * (instances != 1)} available in any (the "
                             f"most is {most:g}); expected recordings of at least {instances} node"
                             f"{'s' * (instances != 1)}")
    return recs, left


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


INTERRUPTED_SK = re.compile(r"INTERRUPTED#(\d{1,12}(?:\.\d+)?)")  # the recorder's sort key: epoch seconds


def interruption_gaps(items: list[dict], instance_type: str | None = None) -> list[float]:
    """Seconds between consecutive interruptions of the same job, from the interruption recorder's items
    (spotrun/planner/measured.py: pk = job, sk = "INTERRUPTED#<epoch>"), optionally of one instance type. Items come
    in any order (a table scan's); ValueError (one line) naming the item, its field and value when an interruption
    has no job name or its sk is not "INTERRUPTED#" and a time in epoch seconds >= 0."""
    by_job: dict[str, list[float]] = {}
    for n, item in enumerate(items):
        if item.get("kind") != "interruption" or (instance_type and item.get("instance_type") != instance_type):
            continue
        job, key = item.get("pk"), item.get("sk")
        if not isinstance(job, str) or not job:
            raise ValueError(f"items[{n}]: pk={show(job)} is invalid: expected the job's name (an interruption "
                             "item's key)")
        when = INTERRUPTED_SK.fullmatch(key) if isinstance(key, str) else None
        if when is None:
            raise ValueError(f"items[{n}] (job {show(job)}): sk={show(key)} is invalid: expected \"INTERRUPTED#\" and "
                             "the interruption's time in epoch seconds, 0 or more (e.g. \"INTERRUPTED#1764806400\")")
        by_job.setdefault(job, []).append(float(when[1]))
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
