"""The estimate's availability model: spot capacity as alternating stretches with and without it, fitted to
recorded capacity.

A generated trace alternates a stretch with capacity (ended by an interruption) and one without (the wait until
capacity returns, a drought when long). Stretches with capacity are `UP_SHAPE` (mean 1) over the estimate's
interruption rate: the rate sets how long capacity lasts, the fitted shape how it spreads (many short stretches,
a few long ones). Stretches without capacity are `DOWN_SHAPE` (mean 1) times a mean that grows with the rate,
`DOWN_MEAN_AT_ONE_PER_HOUR_S` x rate^`DOWN_RATE_EXPONENT` (fitted across the traces: where capacity is
interrupted more often, it also takes longer to return). Each is drawn from its quantile
table (linear between the quantiles: `LEVELS`), independently. A job is created at a random moment of that
process (its stationary state): with capacity with probability mean_up / (mean_up + mean_down), and inside a
stretch whose length is drawn in proportion to its length (a random moment falls in a long stretch more often).

Fitted on the 9 traces at even positions (sorted path order, the choose set of benchmarks/policy_bench.py) of
the one-node availability traces of github.com/skypilot-org/spot-traces (aws-02-15-2023 and aws-10-26-2022;
2,040 stretches with capacity, 2,036 without) by

    python benchmarks/fit_availability.py --spot-traces DIR --set choose

and checked on the other 8 by benchmarks/calibration_bench.py (docs/spot-policy.md, "Calibration"). The traces
themselves are not in this repository. Stdlib only (the estimate Lambda runs it).
"""

from __future__ import annotations

import bisect
import math
import random

INF = math.inf
LEVELS = (0.0, *(i / 50 for i in range(1, 50)), 0.99, 0.995, 1.0)
# Pasted from the command above (the quantiles at LEVELS).
UP_SHAPE = (0.02388, 0.0268, 0.03573, 0.05571, 0.07969, 0.09783, 0.1035, 0.124, 0.1439, 0.1439, 0.1439, 0.1439,
    0.1548, 0.1957, 0.2124, 0.2205, 0.2205, 0.2205, 0.2205, 0.2259, 0.2259, 0.2283, 0.2879, 0.2931, 0.3084, 0.3096,
    0.3629, 0.4239, 0.4377, 0.441, 0.4518, 0.4644, 0.5311, 0.6193, 0.642, 0.6777, 0.7503, 0.8478, 0.882, 0.9789,
    1.103, 1.275, 1.431, 1.696, 1.985, 2.325, 2.787, 3.39, 4.631, 6.616, 9.216, 12.92, 62.03)
DOWN_SHAPE = (0.04581, 0.04581, 0.059, 0.06108, 0.087, 0.08982, 0.1064, 0.1064, 0.1064, 0.1096, 0.1337, 0.1337,
    0.1337, 0.174, 0.1926, 0.1926, 0.1926, 0.1926, 0.1926, 0.1926, 0.1944, 0.2024, 0.2096, 0.2592, 0.2675, 0.29,
    0.377, 0.3851, 0.3892, 0.4022, 0.4255, 0.4692, 0.5319, 0.5777, 0.6033, 0.6678, 0.7114, 0.7703, 0.8714, 0.9628,
    1.07, 1.237, 1.442, 1.733, 2.126, 2.427, 2.967, 3.771, 5.071, 7.257, 10.23, 15.4, 24.79)
DOWN_MEAN_AT_ONE_PER_HOUR_S = 6405
DOWN_RATE_EXPONENT = 0.254


def _check(levels: tuple[float, ...], values: tuple[float, ...]) -> None:
    if len(values) != len(levels) or any(b < a for a, b in zip(values, values[1:], strict=False)) or values[0] < 0:
        raise ValueError("a quantile table must have one non-decreasing value >= 0 per level")


class Stretches:
    """One quantile table: draws, its mean, and draws in proportion to length (for the stationary start)."""

    def __init__(self, values: tuple[float, ...], levels: tuple[float, ...] = LEVELS):
        _check(levels, values)
        self.levels, self.values = levels, values
        pairs = list(zip(values, values[1:], strict=False))
        masses = [q1 - q0 for q0, q1 in zip(levels, levels[1:], strict=False)]
        self.mean = sum(m * (a + b) / 2 for m, (a, b) in zip(masses, pairs, strict=True))
        weights = [m * (a + b) / 2 for m, (a, b) in zip(masses, pairs, strict=True)]
        total = sum(weights) or 1.0
        self._biased = [sum(weights[:i + 1]) / total for i in range(len(weights))]
        self._pairs = pairs

    def draw(self, rng: random.Random) -> float:
        u = rng.random()
        i = min(bisect.bisect_right(self.levels, u), len(self.levels) - 1)
        q0, q1 = self.levels[i - 1], self.levels[i]
        a, b = self.values[i - 1], self.values[i]
        return a + (b - a) * ((u - q0) / (q1 - q0) if q1 > q0 else 0.0)

    def draw_length_biased(self, rng: random.Random) -> float:
        """A stretch drawn with probability in proportion to its length (density x f(x) / mean)."""
        k = min(bisect.bisect_left(self._biased, rng.random()), len(self._pairs) - 1)
        a, b = self._pairs[k]
        return math.sqrt(a * a + rng.random() * (b * b - a * a))  # density in proportion to x on [a, b]


UP = Stretches(UP_SHAPE)
DOWN = Stretches(DOWN_SHAPE)


def mean_down_s(rate_per_hour: float) -> float:
    """The mean stretch without capacity at this interruption rate (the fitted power law)."""
    return DOWN_MEAN_AT_ONE_PER_HOUR_S * rate_per_hour ** DOWN_RATE_EXPONENT


def renewal_trace(rate_per_hour: float, horizon_s: float, rng: random.Random) -> list[tuple[float, float]]:
    """One trace: windows with capacity up to `horizon_s` (the last one open), from the stationary state."""
    if rate_per_hour <= 0:
        return [(0.0, INF)]
    mean_up, mean_down = 3600.0 / rate_per_hour, mean_down_s(rate_per_hour)
    up_scale, down_scale = mean_up / UP.mean, mean_down / DOWN.mean
    out: list[tuple[float, float]] = []
    if rng.random() < mean_up / (mean_up + mean_down):  # created while capacity is there
        t, up = 0.0, rng.random() * UP.draw_length_biased(rng) * up_scale
    else:
        t, up = rng.random() * DOWN.draw_length_biased(rng) * down_scale, UP.draw(rng) * up_scale
    while t + up < horizon_s:
        out.append((t, t + up))
        t += up + DOWN.draw(rng) * down_scale
        up = UP.draw(rng) * up_scale
    out.append((t, INF))
    return out
