"""The estimate step's inputs stage (spotrun/pipeline/plan.py `plan`): what a run trains on, made ready before it
is planned. A hub model is fetched into the stage's models/ first (spotrun/pipeline/hub.py), then raw text under
datasets/ is prepared into shards (spotrun/pipeline/preparation.py); while either has a job to run, the estimate
answers Prepare with that job instead of a plan, and the state machine calls again with what the job made
(`prepared`: its output and its bill, spent before the first job).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import partial
from typing import Any

from ..contract.spec import RunSpec
from ..planner.stage import smallest_cap
from ..seams import PREPARE_MODEL, PipelineSettings, PlanStatus, Preparation, PreparationSettings
from .hub import fetch_message, hub_step
from .preparation import Prepared, job_tags, plan_step, prepare_message


@dataclass(frozen=True)
class Inputs:
    """The run to plan (on the hub model's copy and the prepared shards, with the cap less what was spent on
    them), its prepared data (`done`), the hub fetch's bill, and the train channel's place; or, while a job must run
    first, `prepare`: the estimate's Prepare answer."""

    run: RunSpec
    data_uri: str
    done: Prepared | None = None
    fetch_usd: float = 0.0
    prepare: dict | None = None


def _prepare_answer(job: Preparation, message: str, field: str) -> dict:
    return {"status": PlanStatus.PREPARE.value, "field": field, "preparation": dataclasses.asdict(job),
            "message": message}


def prepare_inputs(run: RunSpec, data_uri: str, s3: Any, *, pipeline: PipelineSettings,
                   settings: PreparationSettings | None, catalog: dict, execution: str,
                   prepared: dict | None) -> Inputs:
    """The inputs of `run` as they stand (see the module docstring); `settings` None: nothing is prepared here (the
    CLI). A refusal (a copy or a job that cannot be) is raised as spotrun.contract.refusal.Refusal."""
    if settings is None:
        return Inputs(run, data_uri)
    run, fetch = hub_step(run, s3, pipeline=pipeline, settings=settings, catalog=catalog, execution=execution,
                          tags=job_tags(run, pipeline, execution))
    if fetch is not None:
        return Inputs(run, data_uri, prepare=_prepare_answer(fetch, fetch_message(fetch), "model.source"))
    fetch_usd = 0.0
    if prepared and prepared.get("kind") == PREPARE_MODEL:  # this execution's fetch: its bill is spent
        fetch_usd, prepared = float(prepared["cost_usd"]), None
        run = dataclasses.replace(run, max_usd=round(run.max_usd - fetch_usd, 4))
    minimum = partial(smallest_cap, catalog=catalog, s3_client=s3)
    run_to_plan, done, job = plan_step(run, s3, pipeline=pipeline, settings=settings, catalog=catalog,
                                       execution=execution, prepared=prepared, training_minimum=minimum)
    if job is not None:
        # the fetch's bill rides on the data's preparation into the next plan (`Preparation.earlier_usd`)
        job = dataclasses.replace(job, earlier_usd=fetch_usd)
        return Inputs(run, data_uri, prepare=_prepare_answer(job, prepare_message(run, job), "data.source"))
    return Inputs(run_to_plan, done.data_source if done else data_uri, done, fetch_usd)
