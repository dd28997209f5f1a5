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
5. the spot policy (spotrun/pipeline/policy_stage.py `with_spot_policy`: spotrun/policy/choose.py `spot_policy`,
   the cap that finishes at the P95 of the run as one job) and its first market;
6. what must hold before anything is created (spotrun/pipeline/preflight.py): `checkpoint.resume_from`, the
   account's SageMaker quota, the run record beside the checkpoints (for a run the planner found over budget
   too, before it says so: invalid input wins);
7. the plan (spotrun/pipeline/assembly.py `assemble`).

Also here: the canceller's rule (`cancel`: which jobs are an ended execution's). The settings (`PipelineSettings`,
the estimate function's environment) are defined in spotrun/seams.py.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable

from ..contract.refusal import Refusal
from ..contract.spec import parse_run
from ..planner.estimate import load_catalog
from ..planner.stage import planned
from ..seams import CANCEL_STATUSES, EXECUTION_TAG, PipelineSettings, PlanStatus, PreparationSettings
from .assembly import CONTRACT_KEYS, assemble, job_name
from .inputs import prepare_inputs
from .policy_stage import layout_ranker, over_budget_with_caps, with_spot_policy
from .preflight import check_before_creating, check_execution_name, record_run
from .validate import admit


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


def plan(run_raw: Any, execution: str, settings: PipelineSettings, *, s3_client: Any = None,
         rates: dict[str, float] | None = None, catalog: dict | None = None, quotas_client: Any = None,
         started: str = "", mfu_lookup: Callable[[str, str], dict[str, tuple[float, int]]] | None = None,
         running_executions: int | None = None,
         execution_status: Callable[[str], tuple[str, str | None] | None] | None = None,
         preparation: PreparationSettings | None = None, prepared: dict | None = None,
         waits: dict[str, tuple[float, int]] | None = None) -> dict:
    """The plan for one execution (see the module docstring); clients None skip the checks that need them.

    `running_executions`: executions of the pipeline running now, this one included (the stage's concurrency
    limit); `execution_status(name)`: (status, run name) of an execution of the pipeline, None if none has it
    (what `checkpoint.resume_from` may name).

    `mfu_lookup(shape, method)`: instance type -> (MFU, runs) measured by earlier runs (spotrun/planner/measured.py);
    `waits`: instance type -> (mean wait for spot capacity after an interruption, waits) recorded there.
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
        done = est = over_budget = None
        if inputs.prepare is None:
            poll = {"poll_s": settings.poll_seconds,
                    "max_poll_s": max(settings.poll_seconds, settings.max_poll_seconds)}
            ranker = layout_ranker(admitted.catalog, **poll)  # the layout by the spot policy's simulated bill
            try:
                done = planned(inputs.run, catalog=admitted.catalog, s3_client=s3_client, rates=rates,
                               mfu_lookup=mfu_lookup, base_name=base_name, waits=waits, layout_cost=ranker)
            except Refusal as exc:  # invalid input wins: a run over budget is refused first by what it must change
                if exc.status != PlanStatus.OVER_BUDGET.value:
                    raise
                # the caps it names, as the estimate's simulation holds them (issue #26)
                over_budget = over_budget_with_caps(
                    inputs.run, exc, lambda cap, cost: planned(
                        dataclasses.replace(inputs.run, max_usd=cap), catalog=admitted.catalog, s3_client=s3_client,
                        rates=rates, mfu_lookup=mfu_lookup, base_name=base_name, waits=waits,
                        layout_cost=cost).estimate,
                    admitted.catalog, **poll, stage_limits={settings.stage or "?": settings.max_usd_per_run})
            else:
                est = with_spot_policy(done.run, done.estimate, admitted.catalog, **poll, ranker=ranker,
                                       replan=done.replan,
                                       stage_limits={settings.stage or "?": settings.max_usd_per_run})
        # before a preparation job too, so that it bills nothing for a run these refuse; and before an over-budget
        # refusal, on the planner's estimate
        check_before_creating(inputs.run, quotas_client, execution_status,
                              over_budget.estimate if over_budget else est)
        if over_budget is not None:
            raise over_budget
        if done is None:
            return inputs.prepare
        prefix = record_run(done.run, execution, s3_client, settings.bucket, done.model_config, done.tokens,
                            est.parameters)
        return assemble(done.run, est, shape=done.shape, cap_usd=run.max_usd, admitted=admitted,
                        inputs=inputs, ckpt_prefix=prefix, execution=execution, started=started, settings=settings)
    except Refusal as exc:  # the contract, the stage's rules, the inputs, the planner or the preflight checks
        return exc.result(CONTRACT_KEYS)
