"""Inputs several pipeline tests share: the stage's settings for the estimate step, a tiny run it plans, and the
recorder's DynamoDB table (inside moto)."""

from __future__ import annotations

import boto3

from spotrun.pipeline.plan import PipelineSettings

SETTINGS = PipelineSettings(bucket="art-bucket", job_prefix="spotrun-dev-", model_package_group="spotrun-models",
                            poll_seconds=60, project="spotrun", stage="dev", cost_center="ml-platform")


def tiny_run(**compute) -> dict:
    """A minute of training of a tiny GPT-2 on one ml.g5.xlarge with on-demand fallback, $20 cap; `compute` adds
    to its compute section."""
    return {"version": 1, "name": "tiny-run",
            "model": {"init": "random", "config": {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4}},
            "data": {"source": "s3://art-bucket/datasets/d1/", "tokens": 1_000_000, "seq_len": 128},
            "compute": {"instance_type": "ml.g5.xlarge", "on_demand_fallback": True, **compute},
            "budget": {"max_usd": 20}}


def recorder_table():
    """The recorder's table (pk, sk), as the stack creates it; call inside moto."""
    ddb = boto3.resource("dynamodb", region_name="us-east-1")
    return ddb.create_table(TableName="t", BillingMode="PAY_PER_REQUEST",
                            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"},
                                       {"AttributeName": "sk", "KeyType": "RANGE"}],
                            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"},
                                                  {"AttributeName": "sk", "AttributeType": "S"}])
