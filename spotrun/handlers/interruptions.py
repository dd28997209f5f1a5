"""Interruption recorder: SageMaker Training Job State Change events -> DynamoDB, idempotently.

Two kinds of item, keyed so that a duplicate delivery of the same event writes nothing new:
    pk = job name, sk = "INTERRUPTED#<transition start>"   one per spot interruption of a job
    pk = job name, sk = "USAGE"                              instance-hours of a finished job
The estimate reads both to turn counts into an interruption rate per instance-hour for each instance type.
Environment (read here, at the entry point): TABLE_NAME, METRICS_NAMESPACE, STAGE.
"""

from __future__ import annotations

import os
from typing import Any

from .common import emit_metric, put_once, to_epoch

TERMINAL = ("Completed", "Failed", "Stopped")


def interruption_item(detail: dict, event_time: str) -> dict | None:
    """The DynamoDB item for an Interrupted event (None if the event is not one)."""
    if detail.get("SecondaryStatus") != "Interrupted":
        return None
    transitions = [t for t in detail.get("SecondaryStatusTransitions") or [] if t.get("Status") == "Interrupted"]
    started = transitions[-1].get("StartTime") if transitions else event_time
    resource = detail.get("ResourceConfig") or {}
    return {"pk": detail["TrainingJobName"], "sk": f"INTERRUPTED#{to_epoch(started) or to_epoch(event_time):.0f}",
            "kind": "interruption", "instance_type": resource.get("InstanceType", "unknown"),
            "instance_count": int(resource.get("InstanceCount", 1)), "time": str(started)}


def usage_item(detail: dict) -> dict | None:
    """Instance-hours of a finished job (None unless the job reached a terminal status with known times)."""
    if detail.get("TrainingJobStatus") not in TERMINAL:
        return None
    resource = detail.get("ResourceConfig") or {}
    count = int(resource.get("InstanceCount", 1))
    seconds = detail.get("TrainingTimeInSeconds")
    if seconds is None:
        start, end = to_epoch(detail.get("TrainingStartTime")), to_epoch(detail.get("TrainingEndTime"))
        seconds = (end - start) if start and end else None
    if seconds is None:
        return None
    return {"pk": detail["TrainingJobName"], "sk": "USAGE", "kind": "usage",
            "instance_type": resource.get("InstanceType", "unknown"),
            "instance_hours": str(round(float(seconds) * count / 3600, 6))}


def record(event: dict, table: Any, *, namespace: str, stage: str) -> str:
    """Write the item for one event; returns 'recorded', 'duplicate' or 'ignored'."""
    detail = event.get("detail") or {}
    if not detail.get("TrainingJobName"):
        return "ignored"
    item = interruption_item(detail, event.get("time", "")) or usage_item(detail)
    if item is None:
        return "ignored"
    if put_once(table, item) == "duplicate":
        return "duplicate"
    if item["kind"] == "interruption":
        emit_metric(namespace, "Interruptions", 1, "Count",
                    {"Stage": stage})
    return "recorded"


def handler(event: dict, _context: Any) -> dict:
    import boto3

    from ..planner import load_catalog
    from .performance import record_performance

    table = boto3.resource("dynamodb").Table(os.environ["TABLE_NAME"])
    outcome = record(event, table, namespace=os.environ.get("METRICS_NAMESPACE", "spotrun"),
                     stage=os.environ.get("STAGE", ""))
    # A Completed job's measured MFU, for later estimates (performance.py).
    performance = record_performance(event, table, boto3.client("sagemaker"), load_catalog())
    return {"outcome": outcome, "performance": performance}


def recorded_rates(table: Any, min_hours: float = 10.0) -> dict[str, float]:
    """Interruptions per instance-hour by instance type, for types with at least `min_hours` of recorded use.

    NOTE: a Scan; the table holds one or two small items per training job.
    """
    interruptions: dict[str, int] = {}
    hours: dict[str, float] = {}
    kwargs: dict = {}
    while True:
        page = table.scan(**kwargs)
        for item in page.get("Items", []):
            itype = item.get("instance_type", "unknown")
            if item.get("kind") == "interruption":
                interruptions[itype] = interruptions.get(itype, 0) + 1
            elif item.get("kind") == "usage":
                hours[itype] = hours.get(itype, 0.0) + float(item.get("instance_hours", 0))
        if "LastEvaluatedKey" not in page:
            break
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
    return {t: interruptions.get(t, 0) / h for t, h in hours.items() if h >= min_hours}
