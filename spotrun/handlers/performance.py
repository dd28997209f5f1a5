"""Measured performance of finished runs, so later estimates use it instead of the catalog's utilization guess.

A completed job's final metrics (SageMaker's FinalMetricDataList, parsed from the trainer's metric line through
the MetricDefinitions: `train:mfu`, `train:tokens_per_s`) are recorded in the interruptions table beside the
interruption and usage items, one item per job:
    pk = job name, sk = "PERFORMANCE"   shape, method, instance type and count, MFU, tokens/s per device
The shape and method come from the tags the estimate puts on every job (SHAPE_TAG, METHOD_TAG), so a record is
matched to later runs of the same model shape and method on the same instance type.
"""

from __future__ import annotations

import statistics
from typing import Any

from ..seams import METHOD_TAG, SHAPE_TAG, metric_name
from .common import put_once

MFU_METRIC, TOKENS_METRIC = metric_name("mfu"), metric_name("tokens_per_s")  # the trainer's metric line


def shape_key(model_config: dict) -> str:
    """What makes two runs 'the same model shape' for throughput: architecture, size and depth (a tag value)."""
    from ..params import shape_of

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
