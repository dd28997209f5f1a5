"""Preparation finish Lambda: after the pipeline's Processing job ended, its outcome, cost and merged index.

Input: {"preparation": <the estimate's Prepare output's `preparation`>}. Output: {"status": "prepared" | "failed",
"message", "prepared": spotrun.pipeline.preparation.Prepared}: on success the parts' indexes are merged into the
dataset's index.json (the marker last), and the estimate runs again with `prepared` (its cost counts against the cap).
The work is `spotrun.pipeline.preparation.finish`; this entry point only makes the clients.
"""

from __future__ import annotations

import os
from typing import Any

import boto3

from ..contract.strict_json import strict
from ..pipeline.preparation_finish import finish
from ..seams import PrepareEnvironment


def handler(event: dict, _context: Any) -> dict:
    bucket = PrepareEnvironment.from_env(os.environ).bucket  # the stage's artifact bucket: the only one it writes to
    preparation = event["preparation"]
    if preparation.get("bucket") != bucket:
        raise ValueError(f"preparation.bucket={preparation.get('bucket')!r} is invalid: expected the stage's "
                         f"artifact bucket {bucket}")
    return strict(finish(boto3.client("s3"), boto3.client("sagemaker"), preparation))
