"""What finished jobs measured, recorded for later estimates: spot interruptions, instance-hours and MFU.

The interruption recorder (spotrun/handlers/interruptions.py) turns SageMaker Training Job State Change events
into items of the interruptions table, idempotently (a duplicate delivery of the same event writes nothing new):
    pk = job name, sk = "INTERRUPTED#<transition start>"   one per spot interruption of a job
    pk = job name, sk = "WAIT#<training start>"             one per wait of a spot job for capacity (`wait_items`)
    pk = job name, sk = "USAGE"                              instance-hours of a finished job
    pk = job name, sk = "PERFORMANCE"                        shape, method, instance type and count, MFU, tokens/s
The estimate reads them back (`recorded_rates`: interruptions per instance-hour by instance type;
`recorded_waits`: the mean wait for capacity after an interruption by instance type; `recorded_utilization`:
measured MFU by shape and method) instead of the catalog's guesses and the availability model's power law.

A wait for capacity is read from a finished spot job's secondary status transitions (the event's
SecondaryStatusTransitions, the whole history of the job, as DescribeTrainingJob returns it): from an
Interrupted transition's start (or the job's CreationTime) to the start of the next Downloading or Training
transition, the job having been Starting (launching instances, retrying while EC2 has no capacity) in between. It
includes the instances' launch, which a wait of hours dwarfs. A job that ended while waiting (MaxWaitTimeExceeded,
stopped) records no wait for that last one.

A completed job's final metrics (SageMaker's FinalMetricDataList, parsed from the trainer's metric line through
the MetricDefinitions: `train:mfu`, `train:tokens_per_s`) make its performance item. The shape and method come
from the tags the estimate puts on every job (SHAPE_TAG, METHOD_TAG), so a record is matched to later runs of the
same model shape and method on the same instance type.
"""

from __future__ import annotations

import statistics
from typing import Any

from ..pipeline.aws_events import emit_metric, put_once, to_epoch
from ..seams import INTERRUPTIONS_METRIC, METHOD_TAG, SHAPE_TAG, metric_name
from .params import shape_of

MFU_METRIC, TOKENS_METRIC = metric_name("mfu"), metric_name("tokens_per_s")  # the trainer's metric line


def shape_key(model_config: dict) -> str:
    """What makes two runs 'the same model shape' for throughput: architecture, size and depth (a tag value)."""
    shape = shape_of(model_config)
    return f"{model_config['model_type']}/{round(shape.total / 1e6)}M/{shape.layers}L"


def _final_metrics(description: dict) -> dict[str, float]:
    return {m["MetricName"]: float(m["Value"]) for m in description.get("FinalMetricDataList") or []
            if "MetricName" in m and "Value" in m}


def performance_item(detail: dict, description: dict, catalog: dict) -> dict | None:
    """The item for a Completed job (`detail`: the event's; `description`: DescribeTrainingJob's), or None when the
    job is not a tagged spotrun job that reported an MFU."""
    if detail.get("TrainingJobStatus") != "Completed":
        return None
    tags = detail.get("Tags") or {}
    if isinstance(tags, list):
        tags = {t.get("Key"): t.get("Value") for t in tags}
    final = _final_metrics(description)
    if SHAPE_TAG not in tags or METHOD_TAG not in tags or MFU_METRIC not in final:
        return None  # mfu is absent when the trainer knows no peak for the device: nothing to learn from
    resource = detail.get("ResourceConfig") or description.get("ResourceConfig") or {}
    itype, count = resource.get("InstanceType", "unknown"), int(resource.get("InstanceCount", 1))
    gpus = catalog["instances"].get(itype, {}).get("gpus", 1) * count
    item = {"pk": detail["TrainingJobName"], "sk": "PERFORMANCE", "kind": "performance",
            "shape": tags[SHAPE_TAG], "method": tags[METHOD_TAG], "instance_type": itype,
            "instance_count": count, "mfu": str(final[MFU_METRIC])}
    if TOKENS_METRIC in final:  # the metric line's tokens/s is for the whole job
        item["tokens_per_s_per_device"] = str(final[TOKENS_METRIC] / gpus)
    return item


def record_performance(event: dict, table: Any, sagemaker: Any, catalog: dict) -> str:
    """Record a completed job's measured performance: 'recorded', 'duplicate' or 'ignored'."""
    detail = event.get("detail") or {}
    if detail.get("TrainingJobStatus") != "Completed" or not detail.get("TrainingJobName"):
        return "ignored"
    description = sagemaker.describe_training_job(TrainingJobName=detail["TrainingJobName"])
    item = performance_item(detail, description, catalog)
    if item is None:
        return "ignored"
    return put_once(table, item)


def recorded_utilization(table: Any, *, shape: str, method: str) -> dict[str, tuple[float, int]]:
    """instance type -> (median measured MFU, number of runs) for runs of this shape and method.

    NOTE: a Scan, like recorded_rates: one or two small items per training job.
    """
    found: dict[str, list[float]] = {}
    kwargs: dict = {}
    while True:
        page = table.scan(**kwargs)
        for item in page.get("Items", []):
            if item.get("kind") == "performance" and item.get("shape") == shape and item.get("method") == method:
                found.setdefault(item["instance_type"], []).append(float(item["mfu"]))
        if "LastEvaluatedKey" not in page:
            break
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
    return {itype: (statistics.median(values), len(values)) for itype, values in found.items()}


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


RUNNING = ("Downloading", "Training")  # secondary statuses in which the job has its capacity


def _spot(detail: dict) -> bool:
    """A managed spot job: as the event says, else (not said) interrupted (only spot capacity is reclaimed)."""
    flag = detail.get("EnableManagedSpotTraining")
    if flag is not None:
        return flag in (True, "true", "True")
    return any(t.get("Status") == "Interrupted" for t in detail.get("SecondaryStatusTransitions") or [])


def wait_items(detail: dict) -> list[dict]:
    """The items for a finished spot job's waits for capacity (none for an on-demand job or one still running):
    each from an interruption (after="interruption") or the job's creation (after="creation") to the next start
    of Downloading or Training, in whole seconds."""
    if detail.get("TrainingJobStatus") not in TERMINAL or not _spot(detail):
        return []
    resource = detail.get("ResourceConfig") or {}
    base = {"pk": detail["TrainingJobName"], "kind": "wait", "instance_type": resource.get("InstanceType", "unknown"),
            "instance_count": int(resource.get("InstanceCount", 1))}
    since, after = to_epoch(detail.get("CreationTime")), "creation"
    items = []
    for t in detail.get("SecondaryStatusTransitions") or []:
        status, start = t.get("Status"), to_epoch(t.get("StartTime"))
        if start is None:
            continue
        if since is None and status == "Starting":
            since = start  # no CreationTime: the first Starting is when the job began to wait
        if status == "Interrupted":
            since, after = start, "interruption"
        elif status in RUNNING and since is not None:
            items.append({**base, "sk": f"WAIT#{start:.0f}", "after": after,
                          "seconds": str(round(max(0.0, start - since), 3))})
            since = None  # running: no wait until the next interruption
    return items


def record_waits(event: dict, table: Any) -> str:
    """Record a finished spot job's waits for capacity: 'recorded' (at least one new), 'duplicate' or 'ignored'."""
    detail = event.get("detail") or {}
    if not detail.get("TrainingJobName"):
        return "ignored"
    outcomes = [put_once(table, item) for item in wait_items(detail)]
    if not outcomes:
        return "ignored"
    return "recorded" if "recorded" in outcomes else "duplicate"


def recorded_waits(table: Any, min_waits: int = 5) -> dict[str, tuple[float, int]]:
    """instance type -> (mean seconds of a wait for capacity after an interruption, number of waits), for types
    with at least `min_waits` of them. The waits after a job's creation are recorded but not counted here: the
    estimate's model starts a job at a random moment itself and needs the waits that follow an interruption.

    NOTE: a Scan, like recorded_rates.
    """
    found: dict[str, list[float]] = {}
    kwargs: dict = {}
    while True:
        page = table.scan(**kwargs)
        for item in page.get("Items", []):
            if item.get("kind") == "wait" and item.get("after") == "interruption":
                found.setdefault(item.get("instance_type", "unknown"), []).append(float(item["seconds"]))
        if "LastEvaluatedKey" not in page:
            break
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
    return {t: (statistics.fmean(v), len(v)) for t, v in found.items() if len(v) >= min_waits}


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
        emit_metric(namespace, INTERRUPTIONS_METRIC, 1, "Count", {"Stage": stage})
    return "recorded"


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
