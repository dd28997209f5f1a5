"""The estimate step's spot-policy stage (spotrun/pipeline/plan.py `plan`, stage 5; `spotrun estimate` shares it):
the planner's estimate with the spot policy the run starts with and the caps it names (spotrun/policy/choose.py
`spot_policy_at_caps`: the policy at the cap set, the cap that finishes at the P95 bill of the run as one job,
spotrun/planner/segments.py `finish_cap_usd`, and the deadline warning's cap)."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..planner.estimate import Estimate
from ..policy import choose


def with_spot_policy(run: Any, est: Estimate, catalog: dict, *, poll_s: float = 60.0,
                     max_poll_s: float = 4 * 3600.0, n: int = choose.N_TRACES) -> Estimate:
    """The estimate with its spot policy and the caps it names (spotrun/policy/choose.py `spot_policy_at_caps` on
    `n` traces: one call into the policy) and the policy's warnings after its own: a new Estimate, `est`
    unchanged. `spotrun estimate` shares this stage."""
    chosen = choose.spot_policy_at_caps(run, est, catalog, poll_s=poll_s, max_poll_s=max_poll_s, n=n)
    return dataclasses.replace(est, spot_policy=chosen.section, warnings=[*est.warnings, *chosen.warnings])
