"""Small helpers for what AWS delivers and keeps: timestamps as Step Functions/EventBridge deliver them, EMF metrics,
idempotent records."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from botocore.exceptions import ClientError


def to_epoch(value: Any) -> float | None:
    """Seconds since the epoch from an ISO-8601 string, epoch seconds or epoch milliseconds; None if absent."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value / 1000.0 if value > 1e11 else float(value)
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, str) and value.strip().lstrip("-").replace(".", "", 1).isdigit():
        return to_epoch(float(value))  # EventBridge may deliver times as strings of epoch milliseconds
    if isinstance(value, str) and value:
        text = value.replace("Z", "+00:00")
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            return None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=timezone.utc)
        return parsed.timestamp()
    return None


def emit_metric(namespace: str, name: str, value: float, unit: str, dimensions: dict[str, str]) -> str:
    """Print one CloudWatch Embedded Metric Format record (Lambda's log line becomes a metric); returns it."""
    record = {
        "_aws": {"Timestamp": int(datetime.now(timezone.utc).timestamp() * 1000),
                 "CloudWatchMetrics": [{"Namespace": namespace, "Dimensions": [sorted(dimensions)],
                                        "Metrics": [{"Name": name, "Unit": unit}]}]},
        name: value, **dimensions,
    }
    line = json.dumps(record)
    print(line)
    return line


def put_once(table: Any, item: dict) -> str:
    """PutItem unless an item with the same key exists: EventBridge may deliver an event more than once.
    Returns 'recorded' or 'duplicate'."""
    try:
        table.put_item(Item=item, ConditionExpression="attribute_not_exists(pk) AND attribute_not_exists(sk)")
    except ClientError as exc:
        if exc.response["Error"]["Code"] == "ConditionalCheckFailedException":
            return "duplicate"
        raise
    return "recorded"
