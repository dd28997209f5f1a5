"""Cost guard Lambda: runs at every poll of the training job and decides what the state machine does next.

Input: {"plan": <estimate output>, "guard": <this handler's previous output>, "describe": <DescribeTrainingJob>}.
Output (the new guard): action is one of
    wait        the job runs and the projected spend stays under the cap
    stop        the spend would pass the cap before the next poll: StopTrainingJob (the trainer saves and stops)
    fallback    spot capacity never came (MaxWaitTimeExceeded) and on-demand fallback is allowed: resubmit
                on-demand on the same checkpoint prefix, so no work is lost
    completed   register the model; `report` is the cost report
    over_budget the job was stopped at the cap
    failed      the job failed or stopped for another reason; `message` says why
Spend = billable seconds x hourly price of all instances x (1 - spot discount when on spot). Before SageMaker
reports BillableTimeInSeconds, the time since TrainingStartTime stands in for it (an upper bound).
"""

from __future__ import annotations

import os
import time
from typing import Any

from .common import emit_metric, to_epoch

STOP_GRACE_S = 120  # SageMaker's SIGTERM-to-SIGKILL window: billed after StopTrainingJob


def _interruptions(describe: dict) -> int:
    return sum(1 for t in describe.get("SecondaryStatusTransitions") or [] if t.get("Status") == "Interrupted")


def _billable_seconds(describe: dict, now: float) -> float:
    if describe.get("BillableTimeInSeconds") is not None:
        return float(describe["BillableTimeInSeconds"])
    start = to_epoch(describe.get("TrainingStartTime"))
    if start is None:
        return 0.0
    end = to_epoch(describe.get("TrainingEndTime")) or now
    return max(0.0, end - start)


def _final_metric(describe: dict, name: str) -> float | None:
    for metric in describe.get("FinalMetricDataList") or []:
        if metric.get("MetricName") == name:
            return float(metric["Value"])
    return None


REGISTRY_METADATA_KEYS = ("run", "final_loss", "interruptions", "billable_seconds", "training_seconds",
                          "spot_savings_pct", "cost_usd")


def registry_metadata(report: dict) -> dict[str, str]:
    """The model package's CustomerMetadataProperties (strings only), from a cost report: the same keys on AWS
    and in the local registry of `spotrun local`."""
    return {k: str(report[k]) for k in REGISTRY_METADATA_KEYS}


def decide(plan: dict, guard: dict, describe: dict, *, now: float) -> dict:
    spot = bool(guard.get("spot", plan["spot"]))
    rate = plan["usd_per_hour"] * ((1 - plan["spot_discount"]) if spot else 1.0)
    billable = _billable_seconds(describe, now)
    job_cost = billable / 3600 * rate
    spent = float(guard.get("spent_before_usd", 0.0)) + job_cost
    projected = spent + (plan["poll_seconds"] + STOP_GRACE_S) / 3600 * rate
    status, secondary = describe.get("TrainingJobStatus"), describe.get("SecondaryStatus")
    out = {**guard, "cost_usd": round(spent, 4), "projected_usd": round(projected, 4),
           "interruptions": int(guard.get("interruptions_before", 0)) + _interruptions(describe)}

    if status == "Completed":
        training = float(describe.get("TrainingTimeInSeconds") or billable)
        savings = (1 - billable / training) * 100 if spot and training > 0 else 0.0
        loss = _final_metric(describe, "train:loss")
        report = {
            "run": plan["run_name"], "job_name": guard["job_name"], "status": "Completed",
            "instance_type": plan["instance_type"], "instance_count": plan["instance_count"], "spot": spot,
            "billable_seconds": billable, "training_seconds": training, "interruptions": out["interruptions"],
            "spot_savings_pct": round(savings, 2), "cost_usd": round(spent, 2), "cap_usd": plan["max_usd"],
            "estimated_cost_usd": plan["estimate"]["cost_usd"], "final_loss": loss,
            "model_data_url": (describe.get("ModelArtifacts") or {}).get("S3ModelArtifacts", ""),
        }
        report["metadata"] = registry_metadata(report)
        return {**out, "action": "completed", "report": report}
    if status == "Stopped" and guard.get("stop_requested"):
        return {**out, "action": "over_budget",
                "message": f"stopped at the cost cap: ${spent:.2f} spent of budget ${plan['max_usd']:.2f}"}
    if secondary == "MaxWaitTimeExceeded" or describe.get("FailureReason", "").startswith("MaxWaitTimeExceeded"):
        if spot and plan.get("on_demand_fallback"):
            return {**out, "action": "fallback", "job_name": plan["fallback_job_name"], "spot": False,
                    "spent_before_usd": round(spent, 4), "interruptions_before": out["interruptions"]}
        return {**out, "action": "failed", "message": "no spot capacity within MaxWait and on-demand fallback is off"}
    if status in ("Failed", "Stopped"):
        reason = describe.get("FailureReason") or f"training job {status.lower()}"
        return {**out, "action": "failed", "message": f"{guard['job_name']}: {reason}"}
    if status == "InProgress" and not guard.get("stop_requested") and projected >= plan["max_usd"]:
        return {**out, "action": "stop", "stop_requested": True}
    return {**out, "action": "wait"}


def handler(event: dict, _context: Any) -> dict:
    out = decide(event["plan"], event["guard"], event.get("describe") or {}, now=time.time())
    emit_metric(os.environ.get("METRICS_NAMESPACE", "spotrun"), "RunCostUSD", out["cost_usd"], "None",
                {"Stage": os.environ.get("STAGE", ""), "Run": event["plan"]["run_name"]})
    return out
