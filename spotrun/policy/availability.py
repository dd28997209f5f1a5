"""The estimate's availability model: spot capacity as cycles of a stretch with capacity and one without, in two
regimes that persist, fitted to recorded capacity.

A generated trace is a sequence of cycles: a stretch with capacity (ended by an interruption), then the wait until
capacity returns (a drought when long). Each cycle belongs to a regime, and the regime is a two-state Markov chain
over the cycles (a Markov-modulated renewal process): a cycle keeps its predecessor's regime with that regime's
`stay` probability, so the recordings' bad spells (many short stretches with capacity and long waits, for days)
and calm ones come in runs instead of being spread evenly. Each regime draws its stretches from its own quantile
tables (linear between the quantiles: `LEVELS`). A stretch with capacity is short (at most 15 minutes: the
recordings' blips of a few samples) with the regime's share, scaled to the run's rate by a power law fitted
across the traces (13-49% of the recordings' stretches at every rate, a little more at higher rates), and then
drawn in seconds as recorded; the others are drawn in units scaled so that all stretches with capacity together
have a long-run mean of 1 / the estimate's interruption rate (the rate sets how long capacity lasts, the fitted
shapes how it spreads and bunches). Waits are drawn in units where the fitted mixture has mean 1, scaled so that
their long-run mean is `DOWN_MEAN_AT_ONE_PER_HOUR_S` x rate^`DOWN_RATE_EXPONENT` (fitted across the traces: where
capacity is interrupted more often, it also takes longer to return). A job is created at a random moment of that
process (its stationary state): in a regime and a phase (with capacity or not) with probability in proportion to
the time the process spends there, inside a stretch drawn in proportion to its length (a random moment falls in a
long stretch more often), at a uniform point of it.

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
# A stretch with capacity of at most this long is short: the recordings' blips (one sample of the 600 s
# recordings, up to four of the 195 s ones), as common at 0.1 as at 1.4 interruptions per hour, so drawn in seconds
# instead of in units of 1 / rate (benchmarks/calibration_bench.py --stretches).
SHORT_UP_S = 900.0


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
    """One regime: how often a cycle in it is followed by another in it, the share `short` of its stretches with
    capacity that are short (at most `SHORT_UP_S`: the recordings' blips), their quantile table in seconds
    (`up_short`), and the quantile tables of its other stretches with capacity (`up`, in units of their long-run
    mean, which the sampler scales so that all stretches together have mean 1 / rate) and of its waits (`down`, in
    units of the mean wait; the mixture over regimes has mean 1)."""

    stay: float
    up: tuple[float, ...]
    down: tuple[float, ...]
    short: float = 0.0
    up_short: tuple[float, ...] = (0.0,) * len(LEVELS)

    def __post_init__(self):
        if not 0 < self.stay < 1:
            raise ValueError(f"stay={self.stay!r} is invalid: expected 0 < stay < 1")
        if not 0 <= self.short < 1:
            raise ValueError(f"short={self.short!r} is invalid: expected 0 <= short < 1")

    @cached_property
    def ups(self) -> Stretches:
        return Stretches(self.up)

    @cached_property
    def shorts(self) -> Stretches:
        return Stretches(self.up_short)

    @cached_property
    def downs(self) -> Stretches:
        return Stretches(self.down)

    def draw_up(self, rng: random.Random, share: float, short_s: float, long_s: float) -> float:
        """One stretch with capacity in seconds: a short one (its table in seconds times `short_s`, 1 within the
        fitted rates) with probability `share` (the regime's `short` at the run's rate), else one of the others
        times `long_s`."""
        if share and rng.random() < share:
            return self.shorts.draw(rng) * short_s
        return self.ups.draw(rng) * long_s

    def mean_up_s(self, share: float, short_s: float, long_s: float) -> float:
        return share * self.shorts.mean * short_s + (1 - share) * self.ups.mean * long_s

    def draw_up_length_biased(self, rng: random.Random, share: float, short_s: float, long_s: float) -> float:
        """A stretch with capacity drawn in proportion to its length, from the mixture of the short and others."""
        if rng.random() * self.mean_up_s(share, short_s, long_s) < share * self.shorts.mean * short_s:
            return self.shorts.draw_length_biased(rng) * short_s
        return self.ups.draw_length_biased(rng) * long_s


# Pasted from the command above.
REGIMES = (
    Regime(stay=0.9255, short=0.3733,  # 1334 cycles
           up_short=(585, 585, 585, 585, 585, 585, 585, 585, 585, 585, 585, 585, 585, 585, 585, 585, 585, 600, 600,
                     600, 600, 600, 600, 600, 600, 600, 600, 600, 600, 600, 600, 600, 600, 600, 600, 600, 600, 600,
                     600, 600, 600, 600, 600, 600, 600, 780, 780, 780, 780, 780, 780, 780, 780),
           up=(0.03959, 0.0454, 0.05265, 0.05297, 0.0681, 0.09053, 0.1056, 0.1254, 0.1455, 0.1665, 0.1666, 0.1698,
               0.1755, 0.1919, 0.2194, 0.2425, 0.2461, 0.2498, 0.2597, 0.2597, 0.2633, 0.3047, 0.3153, 0.3153, 0.3331,
               0.351, 0.3643, 0.3815, 0.3895, 0.4164, 0.4608, 0.4921, 0.5079, 0.5194, 0.5595, 0.6229, 0.6603, 0.7067,
               0.7791, 0.8613, 0.9654, 1.107, 1.261, 1.477, 1.664, 1.97, 2.224, 2.584, 3.108, 4.721, 6.774, 9.159,
               17.62),
           down=(0.04581, 0.07819, 0.08982, 0.1064, 0.1337, 0.1337, 0.177, 0.1926, 0.1926, 0.1944, 0.2011, 0.203,
                 0.2592, 0.2675, 0.29, 0.377, 0.3851, 0.3889, 0.4012, 0.4022, 0.4255, 0.4575, 0.4692, 0.5319, 0.5474,
                 0.5777, 0.6383, 0.6587, 0.6703, 0.7447, 0.7703, 0.841, 0.8877, 0.9574, 1.015, 1.073, 1.204, 1.305,
                 1.489, 1.631, 1.885, 2.128, 2.339, 2.632, 3.011, 3.503, 4.072, 5.12, 6.544, 9.284, 13.25, 19.18,
                 24.79)),
    Regime(stay=0.8612, short=0.2593,  # 702 cycles
           up_short=(585, 585, 585, 585, 585, 585, 585, 585, 585, 585, 585, 585, 585, 600, 600, 600, 600, 600, 600,
                     600, 600, 600, 600, 600, 600, 600, 600, 600, 600, 600, 600, 600, 600, 600, 600, 600, 600, 600,
                     600, 600, 600, 600, 600, 600, 600, 600, 600, 780, 780, 780, 780, 780, 780),
           up=(0.04513, 0.1455, 0.1666, 0.1666, 0.1698, 0.2317, 0.2461, 0.2461, 0.2597, 0.2597, 0.2597, 0.3047, 0.3107,
               0.3331, 0.3555, 0.3691, 0.3691, 0.3895, 0.3895, 0.4428, 0.4836, 0.4995, 0.5079, 0.5194, 0.5578, 0.6152,
               0.6492, 0.6588, 0.6603, 0.7021, 0.7495, 0.7791, 0.8509, 0.9128, 1.039, 1.107, 1.167, 1.316, 1.416,
               1.479, 1.688, 1.824, 2.037, 2.318, 2.717, 2.999, 3.376, 4.128, 4.945, 7.248, 11.59, 16.84, 35.89),
           down=(0.04581, 0.04581, 0.04581, 0.04581, 0.059, 0.059, 0.06108, 0.087, 0.087, 0.087, 0.08982, 0.09163,
                 0.1064, 0.1064, 0.1064, 0.1064, 0.1064, 0.1064, 0.1064, 0.1069, 0.116, 0.1198, 0.1337, 0.1337, 0.1337,
                 0.1337, 0.1374, 0.174, 0.1796, 0.1926, 0.1926, 0.1926, 0.1926, 0.1926, 0.1926, 0.1926, 0.1926, 0.1926,
                 0.1926, 0.1926, 0.1944, 0.203, 0.2096, 0.236, 0.2675, 0.2675, 0.2901, 0.354, 0.3851, 0.5036, 0.5777,
                 0.6474, 0.7703)),
)
DOWN_MEAN_AT_ONE_PER_HOUR_S = 6405
DOWN_RATE_EXPONENT = 0.254
SHORT_FITTED_UP_TO_PER_HOUR = 1.39
SHORT_SHARE_AT_ONE_PER_HOUR = 0.339
SHORT_SHARE_RATE_EXPONENT = 0.270


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
    def mean_down(self) -> float:
        return sum(p * r.downs.mean for p, r in zip(self.occupancy, self.regimes, strict=True))

    @property
    def short_share(self) -> float:
        """The long-run share of short stretches with capacity among the fitted cycles."""
        return sum(p * r.short for p, r in zip(self.occupancy, self.regimes, strict=True))

    def shares(self, rate_per_hour: float) -> tuple[float, float]:
        """Each regime's share of short stretches at this rate: its fitted share times `short_share_at(rate)` over
        the chain's fitted share (the regimes keep their ratio; the rate sets the level)."""
        level = short_share_at(rate_per_hour) / (self.short_share or 1.0)
        return tuple(min(0.95, r.short * level) for r in self.regimes)

    def scales(self, rate_per_hour: float) -> tuple[tuple[float, float], float, float, float]:
        """(shares, short_s, long_s, down_s): each regime's share of short stretches, and what the short
        stretches' seconds, the other stretches' and the waits' tables are multiplied by at this rate. Short
        stretches keep their recorded seconds up to the fastest rate fitted (`SHORT_FITTED_UP_TO_PER_HOUR`) and
        shrink with 1 / rate beyond it; the others are scaled so that all stretches with capacity together have
        mean 1 / rate, the waits so that they have `mean_down_s`."""
        mean_s = 3600.0 / rate_per_hour
        shares = self.shares(rate_per_hour)
        short_s = min(1.0, SHORT_FITTED_UP_TO_PER_HOUR / rate_per_hour)
        pairs = list(zip(self.occupancy, shares, self.regimes, strict=True))
        shorts = sum(p * q * r.shorts.mean * short_s for p, q, r in pairs)
        longs = sum(p * (1 - q) * r.ups.mean for p, q, r in pairs)
        if not shorts < mean_s:
            raise ValueError(f"the short stretches' mean {shorts:g} s is not under the mean stretch {mean_s:g} s")
        return shares, short_s, (mean_s - shorts) / longs, mean_down_s(rate_per_hour) / self.mean_down

    def cycles(self, rate_per_hour: float, rng: random.Random):
        """Endless (regime, up seconds, down seconds) cycles from the stationary state: the first cycle's up (or,
        when the job is created during a wait, its down) is the remainder of a length-biased stretch, and a job
        created during a wait starts with an up of 0 s."""
        shares, short_s, long_s, down_s = self.scales(rate_per_hour)
        weights = [p * w for p, q, r in zip(self.occupancy, shares, self.regimes, strict=True)
                   for w in (r.mean_up_s(q, short_s, long_s), r.downs.mean * down_s)]
        phase = rng.choices(range(4), weights)[0]
        k, regime = phase // 2, self.regimes[phase // 2]
        if phase % 2 == 0:  # created while capacity is there
            yield (k, rng.random() * regime.draw_up_length_biased(rng, shares[k], short_s, long_s),
                   regime.downs.draw(rng) * down_s)
        else:
            yield k, 0.0, rng.random() * regime.downs.draw_length_biased(rng) * down_s
        while True:
            k = k if rng.random() < self.regimes[k].stay else 1 - k
            regime = self.regimes[k]
            yield k, regime.draw_up(rng, shares[k], short_s, long_s), regime.downs.draw(rng) * down_s


CHAIN = Chain(REGIMES)


def short_share_at(rate_per_hour: float) -> float:
    """The share of stretches with capacity that are short at this rate (the fitted power law; beyond the fastest
    rate fitted, the share there)."""
    return SHORT_SHARE_AT_ONE_PER_HOUR * min(rate_per_hour, SHORT_FITTED_UP_TO_PER_HOUR) ** SHORT_SHARE_RATE_EXPONENT


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
