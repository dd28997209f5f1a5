"""The estimate's availability model: spot capacity as cycles of a stretch with capacity and one without, in two
regimes that persist, fitted to recorded capacity.

A generated trace is a sequence of cycles: a stretch with capacity (ended by an interruption), then the wait until
capacity returns (a drought when long). Each cycle belongs to a regime, and the regime is a two-state Markov chain
over the cycles (a Markov-modulated renewal process): a cycle keeps its predecessor's regime with that regime's
`stay` probability, so the recordings' bad spells (many short stretches with capacity and long waits, for days)
and calm ones come in runs instead of being spread evenly. Each regime draws its stretches from its own quantile
tables (linear between the quantiles: `LEVELS`), in units where the fitted mixture has mean 1: stretches with
capacity are scaled so that their long-run mean is 1 / the estimate's interruption rate (the rate sets how long
capacity lasts, the fitted shapes how it spreads and bunches), waits so that their long-run mean is
`DOWN_MEAN_AT_ONE_PER_HOUR_S` x rate^`DOWN_RATE_EXPONENT` (fitted across the traces: where capacity is
interrupted more often, it also takes longer to return). A job is created at a random moment of that process (its
stationary state): in a regime and a phase (with capacity or not) with probability in proportion to the time the
process spends there, inside a stretch drawn in proportion to its length (a random moment falls in a long stretch
more often), at a uniform point of it.

Fitted on the 9 traces at even positions (sorted path order, the choose set of benchmarks/policy_bench.py) of
the one-node availability traces of github.com/skypilot-org/spot-traces (aws-02-15-2023 and aws-10-26-2022;
2,036 cycles) by a two-state hidden Markov model over the cycles (Baum-Welch, then each cycle labelled by the most
likely state sequence):

    python benchmarks/fit_availability.py --spot-traces DIR --set choose

and checked on the other 8 by benchmarks/calibration_bench.py (docs/spot-policy.md, "Calibration"). The traces
themselves are not in this repository. Stdlib only (the estimate Lambda runs it).
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass
from functools import cached_property

INF = math.inf
LEVELS = (0.0, *(i / 50 for i in range(1, 50)), 0.99, 0.995, 1.0)


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


@dataclass(frozen=True)
class Regime:
    """One regime: how often a cycle in it is followed by another in it, and its stretches' quantile tables
    (with capacity, in units of 1 / rate; without, in units of the mean wait; the mixture over regimes has mean 1)."""

    stay: float
    up: tuple[float, ...]
    down: tuple[float, ...]

    def __post_init__(self):
        if not 0 < self.stay < 1:
            raise ValueError(f"stay={self.stay!r} is invalid: expected 0 < stay < 1")

    @cached_property
    def ups(self) -> Stretches:
        return Stretches(self.up)

    @cached_property
    def downs(self) -> Stretches:
        return Stretches(self.down)


# Pasted from the command above.
REGIMES = (
    Regime(stay=0.9255,  # 1334 cycles
           up=(0.02388, 0.0268, 0.02862, 0.03573, 0.05495, 0.06252, 0.09539, 0.09783, 0.1035, 0.1071, 0.1304, 0.1439,
                0.1439, 0.1439, 0.1439, 0.1526, 0.1548, 0.1957, 0.2124, 0.2205, 0.2205, 0.2205, 0.2205, 0.2259,
                0.2259, 0.2283, 0.2879, 0.2935, 0.3096, 0.3222, 0.3807, 0.4239, 0.4318, 0.441, 0.4518, 0.4645, 0.5542,
                0.6193, 0.6615, 0.7191, 0.7753, 0.882, 0.9789, 1.172, 1.431, 1.73, 2.14, 2.619, 3.251, 5.27, 7.25,
                9.185, 21.07),
           down=(0.04581, 0.07819, 0.08982, 0.1064, 0.1337, 0.1337, 0.177, 0.1926, 0.1926, 0.1944, 0.2011, 0.203,
                0.2592, 0.2675, 0.29, 0.377, 0.3851, 0.3889, 0.4012, 0.4022, 0.4255, 0.4575, 0.4692, 0.5319, 0.5474,
                0.5777, 0.6383, 0.6587, 0.6703, 0.7447, 0.7703, 0.841, 0.8877, 0.9574, 1.015, 1.073, 1.204, 1.305,
                1.489, 1.631, 1.885, 2.128, 2.339, 2.632, 3.011, 3.503, 4.072, 5.12, 6.544, 9.284, 13.25, 19.18,
                24.79)),
    Regime(stay=0.8612,  # 702 cycles
           up=(0.02862, 0.09539, 0.1062, 0.1439, 0.1439, 0.1548, 0.1548, 0.2205, 0.2205, 0.2205, 0.2205, 0.2205,
                0.2259, 0.2259, 0.2283, 0.2879, 0.2897, 0.3096, 0.3096, 0.4239, 0.441, 0.441, 0.4518, 0.4644, 0.5217,
                0.5311, 0.6193, 0.6383, 0.6615, 0.7435, 0.7656, 0.8497, 0.882, 0.9789, 0.9789, 1.103, 1.205, 1.323,
                1.393, 1.544, 1.758, 1.98, 2.202, 2.64, 2.867, 3.481, 3.929, 5.073, 6.057, 8.285, 12.79, 20.33,
                62.03),
           down=(0.04581, 0.04581, 0.04581, 0.04581, 0.059, 0.059, 0.06108, 0.087, 0.087, 0.087, 0.08982, 0.09163,
                0.1064, 0.1064, 0.1064, 0.1064, 0.1064, 0.1064, 0.1064, 0.1069, 0.116, 0.1198, 0.1337, 0.1337, 0.1337,
                0.1337, 0.1374, 0.174, 0.1796, 0.1926, 0.1926, 0.1926, 0.1926, 0.1926, 0.1926, 0.1926, 0.1926, 0.1926,
                0.1926, 0.1926, 0.1944, 0.203, 0.2096, 0.236, 0.2675, 0.2675, 0.2901, 0.354, 0.3851, 0.5036, 0.5777,
                0.6474, 0.7703)),
)
DOWN_MEAN_AT_ONE_PER_HOUR_S = 6405
DOWN_RATE_EXPONENT = 0.254


@dataclass(frozen=True)
class Chain:
    """Two regimes as a Markov chain over cycles, with the long-run figures the sampler scales by."""

    regimes: tuple[Regime, Regime]

    @property
    def occupancy(self) -> tuple[float, float]:
        """The share of cycles in each regime in the long run (the chain's stationary distribution)."""
        leave = [1 - r.stay for r in self.regimes]
        return leave[1] / sum(leave), leave[0] / sum(leave)

    @property
    def mean_up(self) -> float:
        return sum(p * r.ups.mean for p, r in zip(self.occupancy, self.regimes, strict=True))

    @property
    def mean_down(self) -> float:
        return sum(p * r.downs.mean for p, r in zip(self.occupancy, self.regimes, strict=True))

    def cycles(self, rate_per_hour: float, rng: random.Random):
        """Endless (regime, up seconds, down seconds) cycles from the stationary state: the first cycle's up (or,
        when the job is created during a wait, its down) is the remainder of a length-biased stretch, and a job
        created during a wait starts with an up of 0 s."""
        up_s = 3600.0 / rate_per_hour / self.mean_up
        down_s = mean_down_s(rate_per_hour) / self.mean_down
        weights = [p * w for p, r in zip(self.occupancy, self.regimes, strict=True)
                   for w in (r.ups.mean * up_s, r.downs.mean * down_s)]
        phase = rng.choices(range(4), weights)[0]
        k, regime = phase // 2, self.regimes[phase // 2]
        if phase % 2 == 0:  # created while capacity is there
            yield k, rng.random() * regime.ups.draw_length_biased(rng) * up_s, regime.downs.draw(rng) * down_s
        else:
            yield k, 0.0, rng.random() * regime.downs.draw_length_biased(rng) * down_s
        while True:
            k = k if rng.random() < self.regimes[k].stay else 1 - k
            regime = self.regimes[k]
            yield k, regime.ups.draw(rng) * up_s, regime.downs.draw(rng) * down_s


CHAIN = Chain(REGIMES)


def mean_down_s(rate_per_hour: float) -> float:
    """The mean stretch without capacity at this interruption rate (the fitted power law)."""
    return DOWN_MEAN_AT_ONE_PER_HOUR_S * rate_per_hour ** DOWN_RATE_EXPONENT


def fitted_trace(rate_per_hour: float, horizon_s: float, rng: random.Random,
                 chain: Chain = CHAIN) -> list[tuple[float, float]]:
    """One trace: windows with capacity up to `horizon_s` (the last one open), from the stationary state."""
    if rate_per_hour <= 0:
        return [(0.0, INF)]
    out: list[tuple[float, float]] = []
    t = 0.0
    for _, up, down in chain.cycles(rate_per_hour, rng):
        if t + up >= horizon_s:
            break
        if up > 0:
            out.append((t, t + up))
        t += up + down
    out.append((t, INF))
    return out
