"""Cost guard Lambda: runs at every poll of the training job and decides what the state machine does next.

Input: {"plan": <estimate output>, "guard": <this handler's previous output>}. The handler describes the job and
lists the run's committed checkpoints itself (one Lambda task per poll keeps the loop at a few history events);
`decide` is the pure rule. Output: the new guard (spotrun.seams.Guard), whose `action` is a seams.GuardAction.

Cost, honestly:
- a finished job costs BillableTimeInSeconds x on-demand price x instance count. BillableTimeInSeconds is already
  the spot-adjusted time (SageMaker's savings are `1 - billable / training`), so no discount is applied again;
- while it runs, SageMaker reports no billable time, so the cap is enforced on an upper bound: seconds since
  TrainingStartTime x the on-demand price of all instances (no spot price is measured here);
- every figure uses the plan's region price (`plan.price_source` says which).

Polling, and the history quota: a Standard execution fails at 25,000 history events. The loop is Wait -> CostGuard
-> Choice (9 events), and the guard picks the next wait: 5% of the job's age, between `poll_seconds` and
`max_poll_seconds`, and never longer than the time left before the cap would be reached (minus the 120 s a stop
still bills). Early on it polls every minute; a 28-day job is polled every 4 h (its completion is noticed within
5% of its age). tests/infra/test_history_budget.py computes the event count for the longest run the contract
allows (MaxWait 56 days of spot, then a 28-day on-demand fallback) from the rendered definition and this schedule.
We chose this over continue-as-new (a chain of executions breaks stop-execution as the way to cancel a run) and
over job-event callbacks (the cap needs a timer anyway).
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from ..gate import check_gate
from ..seams import (
    CHECKPOINT_AGE_METRIC,
    CHECKPOINT_MANIFEST,
    CHECKPOINT_OVERDUE_METRIC,
    METRICS_NAMESPACE,
    RUN_COST_METRIC,
    Guard,
    GuardAction,
    StopNotice,
    metric_name,
)
from .common import emit_metric, owned_by_execution, to_epoch

STOP_GRACE_S = StopNotice.NOTICE_S  # a stopped job bills until the container exits: up to the notice
POLL_GROWTH = 0.05  # the next wait as a fraction of the job's age


def _interruptions(describe: dict) -> int:
    return sum(1 for t in describe.get("SecondaryStatusTransitions") or [] if t.get("Status") == "Interrupted")


def _final_metric(describe: dict, name: str) -> float | None:
    for metric in describe.get("FinalMetricDataList") or []:
        if metric.get("MetricName") == name:
            return float(metric["Value"])
    return None


def job_cost(plan: dict, describe: dict, now: float) -> tuple[float, bool]:
    """(USD of this job, exact?): billable x on-demand when SageMaker reports it, else the running upper bound."""
    rate_per_s = plan["usd_per_hour"] / 3600
    if describe.get("BillableTimeInSeconds") is not None:
        return float(describe["BillableTimeInSeconds"]) * rate_per_s, True
    start = to_epoch(describe.get("TrainingStartTime"))
    if start is None:
        return 0.0, False
    end = to_epoch(describe.get("TrainingEndTime")) or now
    return max(0.0, end - start) * rate_per_s, False


def next_wait(plan: dict, job_age_s: float, spent_usd: float) -> int:
    """Seconds to the next poll: grows with the job's age, never past the time the cap leaves (see docstring)."""
    schedule = min(plan["max_poll_seconds"], max(plan["poll_seconds"], POLL_GROWTH * job_age_s))
    rate_per_s = plan["usd_per_hour"] / 3600
    if rate_per_s > 0:
        schedule = min(schedule, (plan["max_usd"] - spent_usd) / rate_per_s - STOP_GRACE_S)
    return int(max(plan["poll_seconds"], schedule))


def checkpoint_age(describe: dict, newest_checkpoint: float | None, now: float) -> float | None:
    """Seconds since the newest committed checkpoint reached S3 (since training started when none has)."""
    if describe.get("TrainingJobStatus") != "InProgress" or describe.get("SecondaryStatus") != "Training":
        return None
    start = to_epoch(describe.get("TrainingStartTime"))
    reference = newest_checkpoint if newest_checkpoint is not None else start
    return None if reference is None else max(0.0, now - reference)


def decide(plan: dict, guard: dict, describe: dict, *, now: float, newest_checkpoint: float | None = None) -> dict:
    cost, exact = job_cost(plan, describe, now)
    spent = float(guard.get("spent_before_usd", 0.0)) + cost
    rate_per_s = plan["usd_per_hour"] / 3600
    projected = spent + (plan["poll_seconds"] + STOP_GRACE_S) * rate_per_s
    status, secondary = describe.get("TrainingJobStatus"), describe.get("SecondaryStatus")
    age = checkpoint_age(describe, newest_checkpoint, now)
    worst_gap = max(float(guard.get("worst_checkpoint_gap_seconds") or 0.0), age or 0.0)
    created = to_epoch(describe.get("CreationTime")) or now
    base = {f.name: guard[f.name] for f in dataclasses.fields(Guard) if f.name in guard}
    out = {**base, "cost_usd": round(spent, 4), "projected_usd": round(projected, 4),
           "interruptions": int(guard.get("interruptions_before", 0)) + _interruptions(describe),
           "checkpoint_age_seconds": None if age is None else round(age, 1),
           "worst_checkpoint_gap_seconds": round(worst_gap, 1), "report": None, "message": "",
           "wait_seconds": next_wait(plan, now - created, spent)}
    result = Guard(**out)

    def act(action: GuardAction, **changes: Any) -> dict:
        return dataclasses.asdict(dataclasses.replace(result, action=action.value, **changes))

    started = to_epoch(plan.get("execution_started"))
    if not owned_by_execution(describe, started):
        return act(GuardAction.FAILED, message=f"{guard['job_name']} was created before this execution started: "
                                               "it belongs to an earlier execution of the same name, not to this one")
    if status == "Completed":
        report = _report(plan, guard, describe, spent, out)
        if not report["gate"]["passed"]:  # kept in S3 and reported, not registered
            return act(GuardAction.GATE_FAILED, report=report,
                       message=f"{report['gate']['cause']}; artifact kept at {report['model_data_url']}")
        return act(GuardAction.COMPLETED, report=report)
    if status == "Stopped" and guard.get("stop_requested"):
        return act(GuardAction.OVER_BUDGET, message=f"stopped at the cost cap: ${spent:.2f} spent of budget "
                                                    f"${plan['max_usd']:.2f} ({_basis(plan, exact)})")
    if secondary == "MaxWaitTimeExceeded" or str(describe.get("FailureReason", "")).startswith("MaxWaitTimeExceeded"):
        if guard.get("spot", plan["spot"]) and plan.get("on_demand_fallback"):
            return act(GuardAction.FALLBACK, job_name=plan["fallback_job_name"], spot=False,
                       spent_before_usd=round(spent, 4), interruptions_before=out["interruptions"],
                       wait_seconds=plan["poll_seconds"])
        return act(GuardAction.FAILED, message="no spot capacity within MaxWait and on-demand fallback is off")
    if status in ("Failed", "Stopped"):
        reason = describe.get("FailureReason") or f"training job {status.lower()}"
        return act(GuardAction.FAILED, message=f"{guard['job_name']}: {reason}")
    if status == "InProgress" and not guard.get("stop_requested") and projected >= plan["max_usd"]:
        return act(GuardAction.STOP, stop_requested=True, wait_seconds=plan["poll_seconds"])
    return act(GuardAction.WAIT)


def _basis(plan: dict, exact: bool) -> str:
    how = ("billable seconds x on-demand price x instance count" if exact
           else "upper bound: seconds since training start x on-demand price x instance count")
    return f"{how}; {plan.get('price_source', 'catalog price')}"


def _report(plan: dict, guard: dict, describe: dict, spent: float, out: dict) -> dict:
    spot = bool(guard.get("spot", plan["spot"]))
    billable = float(describe.get("BillableTimeInSeconds") or 0.0)
    training = float(describe.get("TrainingTimeInSeconds") or billable)
    savings = (1 - billable / training) * 100 if spot and training > 0 else 0.0
    worst_lost = out["worst_checkpoint_gap_seconds"] * plan["usd_per_hour"] / 3600
    report = {
        "run": plan["run_name"], "job_name": guard["job_name"], "status": "Completed", "method": plan["method"],
        "instance_type": plan["instance_type"], "instance_count": plan["instance_count"], "spot": spot,
        "region": plan["region"], "billable_seconds": billable, "training_seconds": training,
        "interruptions": out["interruptions"], "spot_savings_pct": round(savings, 2), "cost_usd": round(spent, 2),
        "price_basis": _basis(plan, True), "cap_usd": plan["max_usd"],
        "estimated_cost_usd": plan["estimate"]["cost_usd"], "final_loss": _final_metric(describe,
                                                                                         metric_name("loss")),
        "model_data_url": (describe.get("ModelArtifacts") or {}).get("S3ModelArtifacts", ""),
        "data_source": plan.get("data_source", ""),
        # An interruption at the worst moment seen would have repeated this much work (at the on-demand price).
        "worst_case_lost_usd": round(worst_lost, 2),
    }
    report["artifact"] = artifact_kind(plan["method"])
    # The exported weights' and the base model's validation losses (the trainer's run_completed line).
    report["base_val_loss"] = _final_metric(describe, metric_name("base_val_loss"))
    report["final_val_loss"] = _final_metric(describe, metric_name("exported_val_loss"))
    gate = check_gate(plan.get("gate"), base=report["base_val_loss"], final=report["final_val_loss"])
    report["gate"] = {"passed": gate.passed, "cause": gate.cause}
    report["metadata"] = registry_metadata(report)
    return report


REGISTRY_METADATA_KEYS = ("run", "method", "artifact", "data_source", "final_loss", "interruptions",
                          "billable_seconds", "training_seconds", "spot_savings_pct", "cost_usd", "price_basis",
                          "worst_case_lost_usd")


OPTIONAL_METADATA_KEYS = ("base_val_loss", "final_val_loss")  # runs with validation data


def artifact_kind(method: str) -> str:
    return "lora-adapter" if method == "lora" else "full-model"


def registry_metadata(report: dict) -> dict[str, str]:
    """The model package's CustomerMetadataProperties (strings only), from a cost report: the same keys on AWS
    and in the local registry of `spotrun local`."""
    out = {k: str(report[k]) for k in REGISTRY_METADATA_KEYS}
    out.update({k: str(report[k]) for k in OPTIONAL_METADATA_KEYS if report.get(k) is not None})
    return out


def newest_checkpoint(s3_client: Any, bucket: str, prefix: str) -> float | None:
    """LastModified (epoch s) of the newest committed checkpoint's manifest under the prefix: a listing only."""
    newest = None
    for page in s3_client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            if obj["Key"].endswith("/" + CHECKPOINT_MANIFEST):
                modified = to_epoch(obj["LastModified"])
                newest = modified if newest is None else max(newest, modified)
    return newest


def handler(event: dict, _context: Any) -> dict:
    import boto3

    plan, guard = event["plan"], event["guard"]
    describe = boto3.client("sagemaker").describe_training_job(TrainingJobName=guard["job_name"])
    newest = newest_checkpoint(boto3.client("s3"), plan["checkpoint_bucket"], plan["checkpoint_prefix"])
    out = decide(plan, guard, describe, now=time.time(), newest_checkpoint=newest)
    namespace = os.environ.get("METRICS_NAMESPACE", METRICS_NAMESPACE)
    dims = {"Stage": os.environ.get("STAGE", ""), "Run": plan["run_name"]}
    emit_metric(namespace, RUN_COST_METRIC, out["cost_usd"], "None", dims)
    if out["checkpoint_age_seconds"] is not None:
        emit_metric(namespace, CHECKPOINT_AGE_METRIC, out["checkpoint_age_seconds"], "Seconds", dims)
        overdue = out["checkpoint_age_seconds"] / (2 * plan["checkpoint_interval_seconds"]
                                                   + plan["checkpoint_upload_seconds"])
        emit_metric(namespace, CHECKPOINT_OVERDUE_METRIC, round(overdue, 3), "None", {"Stage": dims["Stage"]})
    return out
