"""Interruption recorder Lambda: SageMaker Training Job State Change events -> the interruptions table.

The entry point: the items and their keys are spotrun/measured.py's (`record`, `record_performance`).
Environment (read here, at the entry point): TABLE_NAME, METRICS_NAMESPACE, STAGE.
"""

from __future__ import annotations

import os
from typing import Any

from ..measured import record, record_performance
from ..planner import load_catalog


def handler(event: dict, _context: Any) -> dict:
    import boto3

    table = boto3.resource("dynamodb").Table(os.environ["TABLE_NAME"])
    outcome = record(event, table, namespace=os.environ.get("METRICS_NAMESPACE", "spotrun"),
                     stage=os.environ.get("STAGE", ""))
    # A Completed job's measured MFU, for later estimates (spotrun/measured.py).
    performance = record_performance(event, table, boto3.client("sagemaker"), load_catalog())
    return {"outcome": outcome, "performance": performance}
