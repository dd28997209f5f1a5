"""`first_poll_at` (spotrun/policy/decision.py): the simulator's skip over the guard's polls lands where stepping
`poll_wait` poll by poll lands, after the same number of polls."""

from __future__ import annotations

import math
import random

from spotrun.policy.decision import first_poll_at, poll_wait


def test_the_skip_lands_on_the_poll_stepping_poll_wait_reaches():
    """400 random skips (grid polls of jobs up to days old, targets from now to days ahead, rechecks none, at the
    target or past it): the same poll count, the same time to 1e-6 s (stepping adds the waits one by one)."""
    rng = random.Random(1)
    for _ in range(400):
        poll_s, max_poll_s = rng.choice([(60.0, 14400.0), (30.0, 3600.0), (60.0, 600.0)])
        created = rng.choice([0.0, rng.uniform(0, 1e6)])
        last = created
        for _ in range(rng.randrange(0, 80)):  # the last poll, on the guard's grid
            last += poll_wait(last - created, math.inf, poll_s=poll_s, max_poll_s=max_poll_s)
        target = last + rng.choice([0.0, 1.0, rng.uniform(0, 3e4), rng.uniform(0, 3e5)])
        recheck = rng.choice([math.inf, target, target + rng.uniform(0, 1e4)])
        at, polls = first_poll_at(created, last, target, recheck, poll_s=poll_s, max_poll_s=max_poll_s)
        t, n = last, 0
        while n == 0 or t < target - 1e-9:
            t += poll_wait(t - created, recheck - t, poll_s=poll_s, max_poll_s=max_poll_s)
            n += 1
        assert polls == n and abs(at - t) < 1e-6, (created, last, target, recheck)
