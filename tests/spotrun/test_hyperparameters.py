"""seams.Hyperparameter against the trainer's own config: every member names a field of
spotrun_trainer.config.TrainConfig (`section.field`), and what the estimate Lambda sends is exactly the members,
each parsed by the trainer into the field it names."""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any, get_type_hints

import boto3
import pytest
from moto import mock_aws

from spotrun.pipeline.plan import PipelineSettings, plan
from spotrun.seams import DatasetIndex, Hyperparameter
from spotrun_trainer.config import TrainConfig

SERVER = "https://mlflow.example.com"
WANDB_SECRET = "arn:aws:secretsmanager:us-east-1:123456789012:secret:spotrun/wandb-AbCdEf"
SETTINGS = PipelineSettings(bucket="art-bucket", job_prefix="spotrun-dev-", model_package_group="spotrun-models",
                            poll_seconds=60, project="spotrun", stage="dev", cost_center="ml-platform",
                            mlflow_tracking_servers=(SERVER,), wandb_api_key_secrets=(WANDB_SECRET,))
CONFIG = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
          "num_attention_heads": 4, "vocab_size": 1000}
# A pretrained full run with validation (model.source, the evaluation schedule, export.weights) and a LoRA run
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


def field_of(path: str) -> tuple[Any, str]:
    """(the trainer config class holding it, the field's name) for a `section.field` path, or KeyError."""
    cls, *sections, name = [TrainConfig, *path.split(".")]
    for section in sections:
        cls = get_type_hints(cls)[section]
        assert dataclasses.is_dataclass(cls), f"{path}: {section} is not a section of the trainer's config"
    if name not in {f.name for f in dataclasses.fields(cls)}:
        raise KeyError(f"{path}: {cls.__name__} has no field {name!r}")
    return cls, name


def value_at(config: TrainConfig, path: str) -> Any:
    for part in path.split("."):
        config = getattr(config, part)
    return config


@pytest.mark.parametrize("member", list(Hyperparameter), ids=lambda m: m.value)
def test_every_hyperparameter_is_a_field_of_the_trainers_config(member):
    cls, name = field_of(member.value)
    assert not dataclasses.is_dataclass(get_type_hints(cls)[name]), f"{member.value} names a whole section"


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


def test_the_estimate_sends_exactly_the_members_and_the_trainer_reads_each_into_its_field(s3):
    sent: set[str] = set()
    for run in (FULL, LORA):
        p = plan(copy.deepcopy(run), "exec-1", SETTINGS, s3_client=s3)
        assert p["status"] == "ok", p
        hp = p["hyperparameters"]
        sent |= set(hp)
        channels = {c["ChannelName"] for c in p["input_data_config"]}
        model = {"model.path": "/opt/ml/input/data/model"} if "model" in channels else {}  # as the launcher does
        config = TrainConfig.from_hyperparameters(hp, **CHANNELS, **model)
        for key, text in hp.items():
            cls, name = field_of(key)
            typ = get_type_hints(cls)[name]
            expected = {bool: lambda t: {"true": True, "false": False}[t], dict: json.loads}.get(typ, typ)(text)
            assert value_at(config, key) == expected, (key, text)
    # Every key sent is a member (no name spelled outside the enum), and every member is sent by some run.
    assert sent == {m.value for m in Hyperparameter}
