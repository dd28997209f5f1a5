"""What the estimate's simulation cannot resolve, and how such a tie breaks: by the tail, then a fixed order.

The spot policy and the layout are chosen by a simulated mean bill over generated traces (spotrun/policy/choose.py
`choose`, spotrun/planner/estimate.py `_policy_choice`). A mean over N traces carries sampling noise; a lead smaller
than NOISE_SES standard errors of the difference of two means is not one the simulation resolves (a seed's draw),
and a choice made on it flips between adjacent deadlines for no reason the user can see. Such a lead is a tie, and
so are two means printed at the same cents (`tied_with_least`); a tie is broken by the lower P95 bill (the tail
the user pays for, and what the cap to set follows), then by a fixed order.

Two policies on one layout are simulated on the same traces, so their difference is paired (`paired_se`); two
layouts draw their own traces (another interruption rate, another horizon), so theirs is not (`unpaired_se`).
Stdlib only: the estimate Lambda's runtime carries no numpy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TypeVar

# A lead within this many standard errors of the difference of the means is a tie (about a 95% interval). Measured
# on llama3-8b at a 12.8 h deadline (docs/spot-policy.md, "Ties the simulation cannot resolve"): over 20 seeds of
# 1,000 traces, the difference of two means varied as the one-seed standard error predicts.
NOISE_SES = 2.0
CENT = 0.005  # a difference under half a cent is a tie at the printed cents whatever the noise

T = TypeVar("T")


def se_of_mean(bills: Sequence[float]) -> float:
    """The standard error of the mean of `bills` (the sample standard deviation over sqrt(n)); 0 for fewer than 2."""
    n = len(bills)
    if n < 2:
        return 0.0
    mean = math.fsum(bills) / n
    return math.sqrt(math.fsum((b - mean) ** 2 for b in bills) / (n - 1) / n)


def paired_se(a: Sequence[float], b: Sequence[float]) -> float:
    """The standard error of the difference of two means over the same traces (`a[i]`, `b[i]`: trace i's bills):
    that of the per-trace differences' mean. 0 when either is missing or they differ in length."""
    if len(a) != len(b):
        return 0.0
    return se_of_mean([x - y for x, y in zip(a, b, strict=True)])


def unpaired_se(se_a: float, se_b: float) -> float:
    """The standard error of the difference of two means over independent traces."""
    return math.hypot(se_a, se_b)


def unresolved(lead_usd: float, se_usd: float) -> bool:
    """Whether a lead of `lead_usd` in the mean is a tie: within half a cent, or NOISE_SES standard errors."""
    return lead_usd <= max(CENT, NOISE_SES * se_usd)


def cents(usd: float) -> str:
    """`usd` as the estimate prints a mean bill (to the cent)."""
    return f"{usd:,.2f}"


def tied_with_least(items: Sequence[T], mean: Callable[[T], float], se: Callable[[T, T], float]) -> list[T]:
    """Of `items` (in their order), those the simulation does not resolve from the least mean: the least, those
    whose gap to it is `unresolved` (`se(item, least)`: the standard error of that difference), and every row that
    prints the same mean (to the cent) as one of these. Two rows the user reads at the same cents are tied, and
    said to be: half a cent from the least alone left a row at the chosen one's printed cents out of the tie
    (mistral at 14.25 h: the least $18.264, the chosen $18.268, a third $18.272, all three printed $18.27)."""
    least = min(items, key=mean)
    close = [x for x in items if x is least or unresolved(mean(x) - mean(least), se(x, least))]
    printed = {cents(mean(x)) for x in close}
    return [x for x in items if any(x is c for c in close) or cents(mean(x)) in printed]


def by_tail(items: Sequence[T], mean: Callable[[T], float], p95: Callable[[T], float],
            se: Callable[[T, T], float]) -> tuple[T, T]:
    """(the item chosen, the least mean): of `items` (in their fixed order), those tied with the least mean
    (`tied_with_least`), then those at the lowest P95 (to half a cent), then the first in order (never the mean
    again: a sub-cent lead is what flipped the name)."""
    least = min(items, key=mean)
    tied = tied_with_least(items, mean, se)
    lowest = min(p95(x) for x in tied)
    tail = [x for x in tied if p95(x) <= lowest + CENT]
    return tail[0], least
