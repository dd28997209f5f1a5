"""Read what the estimate needs from a run's sources: the model's config.json and the data's index.json.

A source is a local directory or an s3://bucket/prefix URI (read with boto3; the estimate Lambda has read access
to the datasets/ and models/ prefixes).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .contract import RunSpec, RunValidationError


def _read_json(source: str, name: str, field: str, s3_client: Any = None) -> dict:
    if source.startswith("s3://"):
        import boto3
        from botocore.exceptions import BotoCoreError, ClientError

        bucket, _, prefix = source[len("s3://"):].partition("/")
        key = f"{prefix.rstrip('/')}/{name}" if prefix.strip("/") else name
        client = s3_client or boto3.client("s3")
        try:
            body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        except (ClientError, BotoCoreError) as exc:
            raise RunValidationError(field, source, f"a readable s3 prefix containing {name} ({exc})") from None
    else:
        path = Path(source) / name
        if not path.is_file():
            raise RunValidationError(field, source, f"a directory containing {name}")
        body = path.read_bytes()
    try:
        value = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise RunValidationError(field, source, f"a valid JSON {name}") from None
    if not isinstance(value, dict):
        raise RunValidationError(field, source, f"a {name} holding a JSON object")
    return value


def resolve(run: RunSpec, s3_client: Any = None) -> tuple[dict | None, int | None]:
    """(model config or None, data tokens or None) read from the run's sources where needed."""
    model_config = None
    if run.model.source is not None:
        model_config = _read_json(run.model.source, "config.json", "model.source", s3_client)
    tokens = None
    if run.data.tokens is None and run.data.source is not None:
        index = _read_json(run.data.source, "index.json", "data.source", s3_client)
        tokens = index.get("total_tokens")
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens <= 0:
            raise RunValidationError("data.source", run.data.source, "an index.json with a positive total_tokens")
    return model_config, tokens
