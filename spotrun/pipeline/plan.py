"""The estimate step: one execution's plan, as the estimate Lambda returns it and `spotrun start` checks it before
starting anything (spotrun/handlers/estimate.py is the Lambda's entry point).

`plan()` takes a run (raw JSON), the execution's name and the deployment's `PipelineSettings`, and returns the
plan as the state machine carries it (`spotrun.seams.Plan.to_json()`; `Plan.from_json` decodes it). A run that
must not start returns status InvalidRun or OverBudget with the reason (the state machine turns them into named
failures before anything is created); otherwise status "ok" with every value CreateTrainingJob needs. A run
whose model.source is a hub id, or whose data.source is raw text under datasets/, is answered "Prepare" with the
job that makes it ready, and planned when the state machine calls again with what the job made (`prepared`).

The run goes through stages, each called once, in order:

1. the contract (spotrun/contract/spec.py `parse_run`): the run file and SageMaker's limits on it;
2. the stage's rules (spotrun/pipeline/validate.py `admit`): its maxima, its instance types (the region's prices:
   a region the catalog has no prices for is refused), every source's place;
3. the inputs (spotrun/pipeline/inputs.py `prepare_inputs`): a hub model's copy, raw data's prepared shards;
4. the planner (spotrun/planner/stage.py `planned`): the sources, the estimate, the hyperparameters' limits;
5. the spot policy (`with_spot_policy`: spotrun/policy/choose.py `spot_policy`, the cap that finishes at the P95
   of the run as one job, spotrun/pipeline/segments.py `finish_cap_usd`) and its first market;
6. what must hold before anything is created (spotrun/pipeline/preflight.py): the registry status,
   `checkpoint.resume_from`, the account's SageMaker quota, the run record beside the checkpoints;
7. the plan (spotrun/pipeline/assembly.py `assemble`).

Also here: the canceller's rule (`cancel`: which jobs are an ended execution's). The settings (`PipelineSettings`,
the estimate function's environment) are defined in spotrun/seams.py.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from typing import Any, Callable

from ..contract.refusal import Refusal
from ..contract.spec import parse_run
from ..planner.estimate import Estimate, load_catalog
from ..planner.stage import planned
from ..policy import choose
from ..seams import CANCEL_STATUSES, EXECUTION_TAG, PipelineSettings, PreparationSettings
from .assembly import CONTRACT_KEYS, assemble, job_name
from .inputs import prepare_inputs
from .preflight import check_before_creating, check_execution_name, record_run
from .segments import finish_cap_usd, one_job_cap_usd, segments_at
from .validate import admit

DEADLINE_CAP_TRIES = 2  # estimates at a raised cap for the deadline warning's cap (`_deadline_cap`)


def first_job_of(detail: dict, job_prefix: str, execution_input: str | None) -> str | None:
    """The execution's first job name (every later segment's name starts with it), or None without a run name.
    `detail`: the "Step Functions Execution Status Change" event's; `execution_input`: the execution's input."""
    try:
        run_name = json.loads(execution_input or "{}").get("name")
    except (json.JSONDecodeError, AttributeError):
        return None
    if not isinstance(run_name, str) or not run_name:
        return None
    return job_name(job_prefix, run_name, detail["name"])


def cancel(detail: dict, sagemaker: Any, *, job_prefix: str, execution_input: str | None,
           continued: dict | None = None) -> list[str]:
    """Stop the running jobs of an execution that ended early (spotrun/handlers/cancel.py); returns their names.

    Which jobs: every segment's name starts with the execution's first job name; of the jobs in progress with that
    name, the ones whose `execution` tag is this execution's (StopTrainingJob: SIGTERM, the trainer saves its
    checkpoint on the way out). A duplicate event finds them stopping and does nothing. `continued`: for an
    execution that continues a run (spotrun/pipeline/continuation.py `continued_run`, proven), the run's first job name
    and `execution` tag, which its jobs keep."""
    if detail.get("status") not in CANCEL_STATUSES:
        return []
    first = continued["first_job"] if continued else first_job_of(detail, job_prefix, execution_input)
    owner = continued["tag"] if continued else detail["name"]
    if first is None:
        return []
    stopped = []
    pages = sagemaker.get_paginator("list_training_jobs").paginate(NameContains=first, StatusEquals="InProgress")
    for page in pages:
        for job in page["TrainingJobSummaries"]:
            if not job["TrainingJobName"].startswith(first):
                continue
            tags = {t["Key"]: t["Value"] for t in sagemaker.list_tags(ResourceArn=job["TrainingJobArn"])["Tags"]}
            if tags.get(EXECUTION_TAG) != owner:
                continue  # a job of an earlier execution that had the same name
            sagemaker.stop_training_job(TrainingJobName=job["TrainingJobName"])
            stopped.append(job["TrainingJobName"])
    return stopped


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
    more."""
    poll = {"poll_s": poll_s, "max_poll_s": max_poll_s, "n": n}
    alone = functools.cache(lambda: choose.spot_policy(*_at_cap(run, est, math.inf), catalog, **poll))
    choice = choose.spot_policy(run, est, catalog, **poll,
                                deadline_cap=lambda p95: _deadline_cap(run, est, catalog, p95, poll, alone()))
    # the run as one job: the simulation at the cap set when that cap neither splits the run into a chain (the
    # simulation counts a chain's restarts as work) nor leaves out a policy
    one_job = choice if est.segments.segments <= 1 and not choice.left_out else alone()
    finish = finish_cap_usd(est.segments, one_job.p95_usd) if est.segments.chain_costs else math.inf
    section = {**choice.section, "p95_finish_cap_usd": finish if finish < math.inf else None,
               "p95_finish_policy": one_job.section["chosen"], "p95_one_job_usd": round(one_job.p95_usd, 2)}
    return dataclasses.replace(est, spot_policy=section, warnings=[*est.warnings, *choice.warnings])


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


def plan(run_raw: Any, execution: str, settings: PipelineSettings, *, s3_client: Any = None,
         rates: dict[str, float] | None = None, catalog: dict | None = None, quotas_client: Any = None,
         started: str = "", mfu_lookup: Callable[[str, str], dict[str, tuple[float, int]]] | None = None,
         running_executions: int | None = None,
         execution_status: Callable[[str], tuple[str, str | None] | None] | None = None,
         preparation: PreparationSettings | None = None, prepared: dict | None = None) -> dict:
    """The plan for one execution (see the module docstring); clients None skip the checks that need them.

    `running_executions`: executions of the pipeline running now, this one included (the stage's concurrency
    limit); `execution_status(name)`: (status, run name) of an execution of the pipeline, None if none has it
    (what `checkpoint.resume_from` may name).

    `mfu_lookup(shape, method)`: instance type -> (MFU, runs) measured by earlier runs (spotrun/planner/measured.py).
    `preparation`: the stage's preparation settings (None: nothing is prepared here, as in the CLI);
    `prepared`: what this execution's preparation job made (the finish step's output; spotrun/pipeline/preparation.py).
    """
    try:
        check_execution_name(execution)
        run = parse_run(run_raw)
        base_name = run.model.hub.repo if run.model.hub else None  # the exported adapter's base: the hub's name
        admitted = admit(run, settings, catalog or load_catalog(), running_executions)
        inputs = prepare_inputs(run, admitted.data_uri, s3_client, pipeline=settings, settings=preparation,
                                catalog=admitted.catalog, execution=execution, prepared=prepared)
        done = est = None
        if inputs.prepare is None:
            done = planned(inputs.run, catalog=admitted.catalog, s3_client=s3_client, rates=rates,
                           mfu_lookup=mfu_lookup, base_name=base_name)
            est = with_spot_policy(done.run, done.estimate, admitted.catalog, poll_s=settings.poll_seconds,
                                   max_poll_s=max(settings.poll_seconds, settings.max_poll_seconds))
        # before a preparation job too, so that it bills nothing for a run these refuse
        check_before_creating(inputs.run, quotas_client, execution_status, est)
        if done is None:
            return inputs.prepare
        prefix = record_run(done.run, execution, s3_client, settings.bucket, done.model_config, done.tokens,
                            est.parameters)
        return assemble(done.run, est, shape=done.shape, cap_usd=run.max_usd, admitted=admitted, inputs=inputs,
                        ckpt_prefix=prefix, execution=execution, started=started, settings=settings)
    except Refusal as exc:  # the contract, the stage's rules, the inputs, the planner or the preflight checks
        return exc.result(CONTRACT_KEYS)
