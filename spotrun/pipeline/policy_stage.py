"""The estimate step's spot-policy stage (spotrun/pipeline/plan.py `plan`, stage 5; `spotrun estimate` shares it):
the planner's estimate with the spot policy the run starts with (spotrun/policy/choose.py `spot_policy`) and the
cap that finishes at that policy's P95 bill (spotrun/planner/segments.py `finish_cap_usd`)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ..planner.estimate import Estimate
from ..planner.segments import finish_cap_usd
from ..policy import choose


def with_spot_policy(run: Any, est: Estimate, catalog: dict, *, poll_s: float = 60.0,
                     max_poll_s: float = 4 * 3600.0) -> Estimate:
    """The estimate with its spot policy (spotrun/policy/choose.py `spot_policy`, looked up when called: the
    replay tests stand a cached one in) and the policy's warnings after its own: a new Estimate, `est` unchanged.
    The section's `p95_finish_cap_usd` is the smallest cap whose chain finishes a run billed the chosen policy's
    P95 (None without a chain to plan it on, or when no cap does). `spotrun estimate` shares this stage."""
    choice = choose.spot_policy(run, est, catalog, poll_s=poll_s, max_poll_s=max_poll_s)
    finish = finish_cap_usd(est.segments, choice.p95_usd) if est.segments.chain_costs else math.inf
    section = {**choice.section, "p95_finish_cap_usd": finish if finish < math.inf else None}
    return dataclasses.replace(est, spot_policy=section, warnings=[*est.warnings, *choice.warnings])
