"""Estimate Lambda: the first state of the training pipeline (the entry point; spotrun/pipeline/plan.py plans).

Input: {"run": <run JSON>, "execution": <execution name>, "started": <execution start time>, "state_machine":
<its ARN>, "prepared": <what the preparation job made, on the call after a Prepare answer>}. Output: the plan
(spotrun.seams.Plan) or the answer that `spotrun.pipeline.plan.plan` returns instead (a refusal, or Prepare).
Input of a continued execution's first step: {"continuation": ..., "execution", "state_machine"}; output: the
proven {run, plan, guard} it resumes with, or {"plan": <an InvalidRun refusal>} (spotrun/pipeline/continuation.py).
Environment (read here only): spotrun.seams.PipelineSettings (the construct writes it with `to_env`); its
table_name, when set, is the interruptions table whose records (spotrun/planner/measured.py) give the estimate measured
interruption rates and MFU; spotrun.seams.PreparationSettings (the stage's preparation instances).
"""

from __future__ import annotations

import os
from typing import Any

import boto3

from ..contract.strict_json import strict
from ..pipeline.continuation import NotAContinuation, carried
from ..pipeline.plan import plan
from ..pipeline.preflight import count_running, execution_of
from ..planner.measured import recorded_rates, recorded_utilization, recorded_waits
from ..seams import PipelineSettings, PlanStatus, PreparationSettings


def handler(event: dict, _context: Any) -> dict:
    event = event if isinstance(event, dict) else {}  # the state machine passes an object; anything else: no run
    if "continuation" in event:  # a run continued from a full execution history (spotrun/pipeline/continuation.py)
        try:
            return carried(boto3.client("stepfunctions"), str(event.get("state_machine", "")),
                           str(event.get("execution", "")), event["continuation"])
        except NotAContinuation as exc:
            return {"plan": {"status": PlanStatus.INVALID_RUN.value, "message": str(exc), "field": "continuation"}}
    settings = PipelineSettings.from_env(os.environ)
    rates, waits, mfu_lookup = None, None, None
    if settings.table_name:
        table = boto3.resource("dynamodb").Table(settings.table_name)
        rates, waits = recorded_rates(table), recorded_waits(table)

        def mfu_lookup(shape: str, method: str) -> dict[str, tuple[float, int]]:
            return recorded_utilization(table, shape=shape, method=method)
    state_machine = str(event.get("state_machine") or "")
    running, status_of = None, None
    if state_machine:
        sfn = boto3.client("stepfunctions")
        running = count_running(sfn, state_machine, settings.max_concurrent_runs + 1)

        def status_of(name: str) -> tuple[str, str | None] | None:
            return execution_of(sfn, state_machine, name)
    # strict JSON: a non-finite figure fails here, not as an Infinity that Step Functions refuses
    return strict(plan(event.get("run"), str(event.get("execution", "")), settings, rates=rates,
                s3_client=boto3.client("s3"), quotas_client=boto3.client("service-quotas"),
                started=str(event.get("started", "")), mfu_lookup=mfu_lookup, running_executions=running,
                execution_status=status_of, preparation=PreparationSettings.from_env(dict(os.environ)),
                prepared=event.get("prepared") if isinstance(event.get("prepared"), dict) else None, waits=waits))
