"""Fit the estimate's availability model (spotrun/policy/availability.py) to recorded spot capacity.

    python benchmarks/fit_availability.py --spot-traces DIR [--set choose]

Reads every one-node trace of github.com/skypilot-org/spot-traces (`availability/1-node/*/*.json` under DIR; not in
this repository), in sorted path order; `--set choose` (the default) keeps the traces at even positions, the
choose set of benchmarks/policy_bench.py, so that benchmarks/calibration_bench.py can report on the others. From
each trace it takes every stretch with capacity that ended (an interruption) and every stretch without capacity
between two with it, and prints, as Python to paste into spotrun/policy/availability.py:
- `UP_SHAPE`: quantiles of the stretches with capacity, each times its own trace's interruption rate (the
  trace's interruptions per available hour, as the interruption recorder measures a rate), so they have mean 1
  and the estimate scales them by its own rate;
- `DOWN_SHAPE`: quantiles of the stretches without capacity, each over its own trace's mean one (mean 1);
- `DOWN_MEAN_AT_ONE_PER_HOUR_S`, `DOWN_RATE_EXPONENT`: c and beta of a trace's mean stretch without capacity
  = c x rate^beta (least squares on the logarithms over the traces): where capacity is interrupted more often it
  also takes longer to come back.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spotrun.policy.availability import LEVELS  # noqa: E402
from spotrun.policy.traces import read_availability  # noqa: E402


def stretches(rec) -> tuple[float, float, list[float], list[float]]:
    """(interruptions per available hour, mean down in seconds, ups times the rate, downs over their mean): the
    recording's closed stretches, not wrapped."""
    ups = [b - a for a, b in rec.windows]
    rate = len(rec.windows) / sum(ups)
    downs = [a2 - b for (_, b), (a2, _) in zip(rec.windows, rec.windows[1:], strict=False)]
    closed = ups if rec.windows[-1][1] < rec.length_s else ups[:-1]  # a window open at the end was not interrupted
    mean_down = sum(downs) / len(downs)
    return rate * 3600, mean_down, [u * rate for u in closed], [d / mean_down for d in downs]


def power_law(rates: list[float], means: list[float]) -> tuple[float, float]:
    """(c, beta) of mean = c x rate^beta, least squares on the logarithms."""
    xs, ys = [math.log(r) for r in rates], [math.log(m) for m in means]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    beta = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return math.exp(my - beta * mx), beta


def quantiles(values: list[float], levels: tuple[float, ...]) -> list[float]:
    """The empirical quantiles at `levels` by linear interpolation between closest ranks."""
    xs = sorted(values)
    out = []
    for q in levels:
        pos = q * (len(xs) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(xs) - 1)
        out.append(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spot-traces", type=Path, required=True, help="where skypilot-org/spot-traces is")
    parser.add_argument("--set", choices=["choose", "held-out", "all"], default="choose",
                        help="which traces: even positions (choose), odd (held-out) or all")
    args = parser.parse_args()
    paths = sorted(args.spot_traces.glob("availability/1-node/*/*.json"))
    if not paths:
        raise SystemExit(f"--spot-traces {args.spot_traces}: no availability/1-node/*/*.json under it")
    keep = {"choose": 0, "held-out": 1}.get(args.set)
    paths = [p for i, p in enumerate(paths) if keep is None or i % 2 == keep]
    ups, downs, rates, means = [], [], [], []
    for p in paths:
        rate, mean_down, u, d = stretches(read_availability(p))
        rates.append(rate)
        means.append(mean_down)
        ups += u
        downs += d
    c, beta = power_law(rates, means)
    print(f"# {len(paths)} traces ({args.set}): {len(ups)} stretches with capacity, {len(downs)} without")
    print(f"UP_SHAPE = ({', '.join(f'{v:.4g}' for v in quantiles(ups, LEVELS))})")
    print(f"DOWN_SHAPE = ({', '.join(f'{v:.4g}' for v in quantiles(downs, LEVELS))})")
    print(f"DOWN_MEAN_AT_ONE_PER_HOUR_S = {c:.0f}")
    print(f"DOWN_RATE_EXPONENT = {beta:.3f}")


if __name__ == "__main__":
    main()
