"""The settings tree (spotrun.settings) as it travels: what the estimate Lambda sends is the flattened tree the
trainer's own parser reads back into the same values, every key a leaf of the trainer's config, and a key that is
also a field of the run JSON carries that field's value (one name where both mean the same)."""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any, get_type_hints

import boto3
import pytest
from moto import mock_aws

from spotrun.contract.decoder import reference
from spotrun.contract.spec import RunSpec
from spotrun.pipeline.plan import PipelineSettings, plan
from spotrun.seams import DatasetIndex
from spotrun.settings.tree import TrainConfig
from spotrun.settings.wire import flatten, job_config, parse

SERVER = "https://mlflow.example.com"
WANDB_SECRET = "arn:aws:secretsmanager:us-east-1:123456789012:secret:spotrun/wandb-AbCdEf"
SETTINGS = PipelineSettings(bucket="art-bucket", job_prefix="spotrun-dev-", model_package_group="spotrun-models",
                            poll_seconds=60, project="spotrun", stage="dev", cost_center="ml-platform",
                            mlflow_tracking_servers=(SERVER,), wandb_api_key_secrets=(WANDB_SECRET,))
CONFIG = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
          "num_attention_heads": 4, "vocab_size": 1000}
# A pretrained full run with validation (model.source, the evaluation schedule, export.from) and a LoRA run
# from random weights (model.config, the LoRA settings, a tracking server and a W&B secret the stage lists):
# between them, every hyperparameter the pipeline sends.
FULL = {"version": 1, "name": "hp-full", "model": {"source": "s3://art-bucket/models/base/"},
        "data": {"source": "s3://art-bucket/datasets/d1/", "tokens": 1_000_000, "seq_len": 128,
                 "validation": "s3://art-bucket/datasets/d1-val/"},
        "eval": {"every_steps": 25, "every_minutes": 30, "max_batches": 64, "keep_best": True},
        "export": {"from": "best"}, "compute": {"instance_type": "ml.g5.xlarge"}, "budget": {"max_usd": 20}}
LORA = {"version": 1, "name": "hp-lora", "model": {"init": "random", "config": CONFIG},
        "data": {"source": "s3://art-bucket/datasets/d1/", "tokens": 1_000_000, "seq_len": 128},
        "training": {"method": "lora", "lora": {"rank": 8, "alpha": 24, "dropout": 0.05,
                                                "target_modules": ["q_proj", "v_proj"]}},
        "tracking": {"mlflow_uri": SERVER, "wandb_project": "hp", "wandb_entity": "team",
                     "wandb_api_key_secret": WANDB_SECRET},
        "compute": {"instance_type": "ml.g5.xlarge"}, "budget": {"max_usd": 20}}
# What the launcher adds on SageMaker (the channels' paths).
CHANNELS = {"data.path": "/opt/ml/input/data/train", "data.validation_path": "/opt/ml/input/data/validation",
            "output_dir": "/opt/ml/model", "checkpoint.dir": "/opt/ml/checkpoints"}


def leaf_type(path: str) -> Any:
    """The type of the trainer config's leaf at a dotted path, or KeyError."""
    cls, *sections, name = [TrainConfig, *path.split(".")]
    for section in sections:
        cls = get_type_hints(cls)[section]
        assert dataclasses.is_dataclass(cls), f"{path}: {section} is not a section of the trainer's config"
    typ = get_type_hints(cls).get(name)
    if typ is None or dataclasses.is_dataclass(typ):
        raise KeyError(f"{path}: not a leaf of the trainer's config")
    return typ


def value_at(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def given_at(run: dict, path: str) -> Any:
    """The run JSON's value at a dotted path, None where the run does not give it."""
    for part in path.split("."):
        run = run.get(part) if isinstance(run, dict) else None
    return run


@pytest.fixture
def s3():
    """The sources the estimate reads: the base model's config.json and the validation set's index."""
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="art-bucket")
        client.put_object(Bucket="art-bucket", Key="models/base/config.json", Body=json.dumps(CONFIG))
        client.put_object(Bucket="art-bucket", Key="datasets/d1-val/" + DatasetIndex.FILE,
                          Body=json.dumps({DatasetIndex.TOTAL_TOKENS: 10_000}))
        yield client


@pytest.fixture
def planned(s3) -> dict[str, dict]:
    out = {}
    for run in (FULL, LORA):
        p = plan(copy.deepcopy(run), "exec-1", SETTINGS, s3_client=s3)
        assert p["status"] == "ok", p
        out[run["name"]] = p
    return out


def test_the_trainer_reads_each_sent_setting_into_its_leaf(planned):
    for p in planned.values():
        hp = p["hyperparameters"]
        channels = {c["ChannelName"] for c in p["input_data_config"]}
        model = {"model.path": "/opt/ml/input/data/model"} if "model" in channels else {}  # as the launcher does
        config = job_config(hp, **CHANNELS, **model)
        for key, text in hp.items():
            typ = leaf_type(key)
            expected = {bool: lambda t: {"true": True, "false": False}[t], dict: json.loads}.get(typ, typ)(text)
            assert value_at(config, key) == expected, (key, text)
        assert flatten(parse(hp)) == hp  # the pair is exact both ways: nothing rounded, nothing added


def test_a_setting_named_as_a_run_field_carries_that_fields_value(planned):
    run_fields = {path for path, *_ in reference(RunSpec)}
    shared = set()
    for run in (FULL, LORA):
        hp = planned[run["name"]]["hyperparameters"]
        sent = parse(hp)  # as the trainer reads them
        for key in hp:
            given = given_at(run, key)
            if key in run_fields and given is not None:
                shared.add(key)
                assert value_at(sent, key) == given, key
    # The names both sides spell the same (the planner's choices, micro_batch, sharding.*, are the trainer's own).
    assert {"data.seq_len", "eval.every_steps", "eval.keep_best", "tracking.mlflow_uri", "model.source",
            "model.config"} <= shared


def test_only_what_differs_from_the_trainers_defaults_travels():
    assert flatten(TrainConfig()) == {}
    sent = {"checkpoint.interval_seconds": "450.0", "sharding.group_nodes": "2", "model.config": '{"a":1}',
            "eval.keep_best": "true", "training.method": "lora", "training.epochs": "2.5"}
    config = parse(sent)
    assert (config.checkpoint.interval_seconds, config.sharding.group_nodes, config.model.config) == (450, 2, {"a": 1})
    assert flatten(config) == sent
    with pytest.raises(ValueError, match="unknown field 'checkpoint.interval_minutes'"):
        parse({"checkpoint.interval_minutes": "7.5"})
