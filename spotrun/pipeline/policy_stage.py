"""The estimate step's spot-policy stage (spotrun/pipeline/plan.py `plan`, stage 5; `spotrun estimate` shares it):
the planner's estimate with the spot policy the run starts with (spotrun/policy/choose.py `spot_policy`) and the
cap that finishes at the P95 bill of the run as one job (spotrun/planner/segments.py `finish_cap_usd`)."""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

from ..planner.estimate import Estimate
from ..planner.segments import finish_cap_usd, one_job_cap_usd, segments_at
from ..policy import choose
from ..seams import SpotPolicy

DEADLINE_CAP_TRIES = 2  # estimates at a raised cap for the deadline warning's cap (`_deadline_cap`)


def with_spot_policy(run: Any, est: Estimate, catalog: dict, *, poll_s: float = 60.0,
                     max_poll_s: float = 4 * 3600.0, n: int = choose.N_TRACES) -> Estimate:
    """The estimate with its spot policy (spotrun/policy/choose.py `spot_policy` on `n` traces, looked up when
    called: the replay tests stand a cached one in) and the policy's warnings after its own: a new Estimate, `est`
    unchanged. `spotrun estimate` shares this stage.

    Every cap it names holds when set (estimated again at it, the run is accepted and the same cap is named):
    - `p95_finish_cap_usd`: the smallest cap whose chain finishes a run billed the P95 of the policy chosen for the
      run as one job (`p95_finish_policy`, `p95_one_job_usd`; None without a chain to plan it on, or when no cap
      does). As one job, the cap set never enters it. Planned on the chain at the cap set, the P95 would count
      that chain's restarts, which the finish cap's own chain counts again, and would move with the cap (llama3's
      $155.72 at a $2,500 cap named $166.51 once set).
    - the deadline warning's cap, when the cap left out every policy that meets the deadline (`_deadline_cap`).
    A cap that binds costs a second simulation (the run as one job), a deadline warning up to DEADLINE_CAP_TRIES
    more; a cap whose plan (its chain's length) was simulated already reuses that simulation
    (`choose.shared_simulations`)."""
    poll = {"poll_s": poll_s, "max_poll_s": max_poll_s, "n": n}
    alone = functools.cache(lambda: choose.spot_policy(*_at_cap(run, est, math.inf), catalog, **poll))
    alone_finish = functools.cache(lambda: _finish_cap(est, alone()))
    named: list[float] = []  # the deadline warning's cap, when it names one

    def deadline_cap(p95: float) -> float:
        # at least the cap to set of the run as one job: one cap meets the deadline and finishes at the P95
        named.append(_deadline_cap(run, est, catalog, max(p95, alone_finish()), poll, alone()))
        return named[-1]

    with choose.shared_simulations():  # a cap whose plan was simulated already reuses its executions
        choice = choose.spot_policy(run, est, catalog, **poll, deadline_cap=deadline_cap)
        # the run as one job: the simulation at the cap set when that cap neither splits the run into a chain
        # (the simulation counts a chain's restarts as work) nor leaves out a policy
        one_job = choice if est.segments.segments <= 1 and not choice.left_out else alone()
    finish = _finish_cap(est, one_job)
    section = dataclasses.replace(choice.section, p95_finish_cap_usd=finish if finish < math.inf else None,
                                  p95_finish_policy=one_job.section.chosen, p95_one_job_usd=round(one_job.p95_usd, 2),
                                  deadline_cap_usd=named[-1] if named else None)
    warnings = [*est.warnings, *choice.warnings, *_under_finish_cap(run.max_usd, finish, section)]
    return dataclasses.replace(est, spot_policy=section, warnings=warnings)


def _finish_cap(est: Estimate, one_job: choose.PolicyChoice) -> float:
    """The P95 finish cap of `one_job`'s P95 bill on the estimate's chain (inf without a chain to plan it on)."""
    return finish_cap_usd(est.segments, one_job.p95_usd) if est.segments.chain_costs else math.inf


def _under_finish_cap(cap_usd: float, finish_usd: float, section: SpotPolicy) -> list[str]:
    """A warning when the cap set is under the cap to set (the P95 finish cap): the run is accepted (its chain
    finishes uninterrupted) but a run billed the P95 stops OverBudget before it finishes, naming a larger cap (a
    new user set a cap a cent under the figure they were told, with no word). With a deadline warning's cap (at
    least the finish cap), that one is the cap to set: one figure across the warnings and the summary."""
    deadline = section.deadline_cap_usd
    if deadline is not None:
        return [] if cap_usd >= deadline else [
            f"budget.max_usd=${cap_usd:,.2f} is under the cap to set, ${deadline:,.2f}: set ${deadline:,.2f} or "
            "more to meet the deadline (the estimate then chooses a policy that meets it) and to finish at its P95 "
            "bill (the spot policy's last line)"]
    if finish_usd == math.inf or cap_usd >= finish_usd:
        return []
    return [f"budget.max_usd=${cap_usd:,.2f} is under the cap to set, ${finish_usd:,.2f}: a run billed "
            f"{section.p95_finish_policy}'s P95 (${section.p95_one_job_usd:,.2f} as one job) would stop "
            f"OverBudget before it finishes, naming a larger cap; set ${finish_usd:,.2f} or more to finish on 95% "
            "of the estimate's traces"]


def _at_cap(run: Any, est: Estimate, cap_usd: float) -> tuple[Any, Estimate]:
    """The run and its estimate at another cap, as the spot policy reads them: the cap and the chain's length
    (one job under no cap)."""
    jobs = 1 if cap_usd == math.inf else segments_at(est.segments, cap_usd)
    return (dataclasses.replace(run, max_usd=cap_usd),
            dataclasses.replace(est, segments=dataclasses.replace(est.segments, segments=jobs)))


def _deadline_cap(run: Any, est: Estimate, catalog: dict, p95_usd: float, poll: dict,
                  one_job: choose.PolicyChoice) -> float:
    """A cap at which the estimate chooses a policy meeting the deadline, which the run's cap left out
    (`p95_usd`: their lowest P95 at the run's cap; `one_job`: the choice for the run as one job under no cap).

    A larger cap makes a shorter chain, so fewer restarts to simulate, and a policy's P95 moves (either way: the
    deadline policies decide on the slack left; seen: $149.27 at a $97.55 cap, $169.27 once set). So the cap is
    estimated again at that P95 (to the cent, up), raised to the lowest P95 there while no policy that meets the
    deadline is within it, at most DEADLINE_CAP_TRIES times (each a simulation). Past them: the smallest cap
    whose chain is one job, or the one-job P95 of the policies meeting it if more: from that cap on the chain is
    one job, so the simulation is `one_job`'s and that policy is within the cap."""
    cap = choose.cents_up(p95_usd)
    for _ in range(DEADLINE_CAP_TRIES):
        there = choose.spot_policy(*_at_cap(run, est, cap), catalog, **poll)
        if not there.misses_deadline:
            return cap
        if there.meeting_p95_usd is None:  # none meets it at this cap's chain
            break
        cap = max(choose.cents_up(there.meeting_p95_usd), cap + 0.01)
    one_job_cap = one_job_cap_usd(est.segments)
    if one_job.meeting_p95_usd is None or one_job_cap == math.inf:  # none meets it as one job, or no one job
        return cap  # (of SageMaker's 28 days) holds the run: the last cap tried, not checked
    return max(one_job_cap, choose.cents_up(one_job.meeting_p95_usd))
