"""Interruption recorder Lambda: SageMaker Training Job State Change events -> the interruptions table.

The entry point: the items and their keys are spotrun/planner/measured.py's (`record`, `record_waits`,
`record_performance`).
Environment (read here, at the entry point): spotrun.seams.RecorderEnvironment.
"""

from __future__ import annotations

import os
from typing import Any

import boto3

from ..planner.estimate import load_catalog
from ..planner.measured import record, record_performance, record_waits
from ..seams import RecorderEnvironment


def handler(event: dict, _context: Any) -> dict:
    env = RecorderEnvironment.from_env(os.environ)
    table = boto3.resource("dynamodb").Table(env.table_name)
    outcome = record(event, table, namespace=env.metrics_namespace, stage=env.stage)
    waits = record_waits(event, table)  # a finished spot job's waits for capacity, from its status transitions
    # A Completed job's measured MFU, for later estimates (spotrun/planner/measured.py).
    performance = record_performance(event, table, boto3.client("sagemaker"), load_catalog())
    return {"outcome": outcome, "performance": performance, "waits": waits}
