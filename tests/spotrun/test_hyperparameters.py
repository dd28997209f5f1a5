"""The settings tree (spotrun/settings/) as it travels: what the estimate Lambda sends is the flattened tree the
trainer's own parser reads back into the same values, every key a leaf of the trainer's config; and every run field
that is also a leaf of the trainer's tree (the same attribute path after the contract: `training.lr`,
`checkpoint.interval_s`, `export.from`) is found by walking both trees, accepts within the trainer's limits
everything the contract accepts, and reaches the trainer with the run's value through the real planner. A new
setting declared on both sides is checked here without a line of this file changing."""

from __future__ import annotations

import copy
import dataclasses
import json
import keyword
import types
import typing
from typing import Any, Literal, get_args, get_origin, get_type_hints

import boto3
import pytest
from moto import mock_aws

from spotrun.contract.decoder import FieldRule, rules
from spotrun.contract.spec import RunSpec, parse_run
from spotrun.pipeline.plan import PipelineSettings, plan
from spotrun.planner.estimate import estimate
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


def attribute(obj_or_cls: Any, part: str) -> str:
    """The field a dotted path's part names: itself, or with PEP 8's trailing underscore when it is a keyword."""
    names = {f.name for f in dataclasses.fields(obj_or_cls)}
    return part + "_" if part not in names and keyword.iskeyword(part) and part + "_" in names else part


def leaf_type(path: str) -> Any:
    """The type of the trainer config's leaf at a dotted path, or KeyError."""
    cls, *sections, name = [TrainConfig, *path.split(".")]
    for section in sections:
        cls = get_type_hints(cls)[attribute(cls, section)]
        assert dataclasses.is_dataclass(cls), f"{path}: {section} is not a section of the trainer's config"
    typ = get_type_hints(cls).get(attribute(cls, name))
    if typ is None or dataclasses.is_dataclass(typ):
        raise KeyError(f"{path}: not a leaf of the trainer's config")
    return typ


def value_at(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, attribute(obj, part))
    return obj


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


# ---- the run fields the trainer shares, found by walking both trees -------------------------------------------


def _run_leaves(cls: type = RunSpec, attrs: tuple = (), at: tuple = ()) -> dict[tuple, tuple[FieldRule, tuple]]:
    """{attribute path after the contract: (its rule, its JSON path)} of every leaf field of the run contract."""
    out = {}
    for rule in rules(cls):
        path, json_path = (*attrs, rule.name), (*at, *rule.at)
        if dataclasses.is_dataclass(rule.kind) and rule.meta["decode"] is None:
            out.update(_run_leaves(rule.kind, path, json_path))
        else:
            out[path] = (rule, json_path)
    return out


def _trainer_leaves(cls: type = TrainConfig, attrs: tuple = ()) -> dict[tuple, type]:
    out = {}
    for name, typ in get_type_hints(cls).items():
        out.update(_trainer_leaves(typ, (*attrs, name)) if dataclasses.is_dataclass(typ) else {(*attrs, name): typ})
    return out


SHARED = {path: (*_run_leaves()[path], typ) for path, typ in _trainer_leaves().items() if path in _run_leaves()}


def dotted(path: tuple) -> str:
    return ".".join(p[:-1] if p.endswith("_") and keyword.iskeyword(p[:-1]) else p for p in path)


def test_the_shared_settings_are_found_on_both_sides():
    names = {dotted(p) for p in SHARED}
    assert {"training.lr", "training.method", "training.lora.rank", "training.epochs", "training.micro_batch",
            "training.seed", "export.from", "checkpoint.interval_s", "checkpoint.keep", "data.seq_len",
            "eval.every_steps", "model.source", "tracking.mlflow_uri"} <= names
    assert "optim.lr" not in names and "lr" not in {p[-1] for p in _trainer_leaves() if p[0] != "training"}


def test_every_field_of_the_run_sections_the_trainer_owns_is_a_setting_of_the_trainer():
    """`training`, `eval` and `export` describe the trainer's work: a field added there and not to the trainer's tree
    would be accepted and never reach it."""
    owned = [path for path in _run_leaves() if path[0] in ("training", "eval", "export")]
    assert len(owned) >= 14 and [dotted(p) for p in owned if p not in SHARED] == []


def _bounds(rule: FieldRule) -> list[Any]:
    """The extreme values the contract accepts for a numeric or enumerated field, in the user's unit."""
    meta, kind = rule.meta, rule.kind
    if get_origin(kind) is Literal:
        return list(get_args(kind))
    if kind is bool:
        return [False, True]
    if kind in (int, float) and meta["lo"] is not None:
        low = meta["lo"] + (1 if kind is int else 1e-9 * (meta["hi"] - meta["lo"])) if meta["lo_open"] else meta["lo"]
        return [low, meta["hi"]]
    return []


@pytest.mark.parametrize("path", sorted(SHARED), ids=dotted)
def test_the_trainer_accepts_every_value_the_contract_accepts(path):
    rule, _, typ = SHARED[path]
    allowed = {int: (int,), float: (float,), bool: (bool,), str: (str,), dict: (dict,)}
    kind = rule.kind
    if get_origin(kind) is Literal:
        assert typ is str and all(isinstance(c, str) for c in get_args(kind)), path
    elif get_origin(kind) in (typing.Union, types.UnionType) or rule.meta["decode"]:
        assert typ in (str, dict), path  # decoded values (sources, URIs, module names, HF configs) travel as text
    else:
        assert kind in allowed.get(typ, ()), (path, kind, typ)
    for value in _bounds(rule):
        sent = value * rule.meta["unit"] if rule.meta["unit"] != 1 else value
        assert value_at(parse({dotted(path): sent}), dotted(path)) == sent, path  # no ConfigError, nothing changed


def _different(rule: FieldRule, default: Any) -> Any:
    """A value the contract accepts (in the user's unit) that differs from the trainer's default, inside the
    planner's reach: the smallest integers, a doubled default or a quarter of the largest number."""
    bounds, unit = _bounds(rule), rule.meta["unit"]
    if get_origin(rule.kind) is Literal or rule.kind is bool:
        return next(v for v in bounds if v != default)
    if rule.kind is int:
        return next(v for v in range(int(bounds[0]) + 1, int(bounds[1]) + 1) if v != default)
    if rule.kind is float:
        low, high = bounds
        return default * 2 / unit if low < default * 2 / unit <= high else high / 4
    return None


# One run that uses every part of the trainer's tree the contract reaches: LoRA from random weights, validation
# data with an evaluation schedule, the best weights exported, MLflow and W&B tracking. Each shared setting the run
# leaves at the trainer's default is then set to another value its rule accepts; text fields must be given here.
EVERYTHING = {"version": 1, "name": "hp-all", "model": {"init": "random", "config": CONFIG},
              "data": {"source": "s3://art-bucket/datasets/d1/", "tokens": 1_000_000, "seq_len": 128,
                       "validation": "s3://art-bucket/datasets/d1-val/"},
              "training": {"method": "lora", "lora": {"rank": 8, "target_modules": ["q_proj", "v_proj"]}},
              "eval": {"keep_best": True}, "export": {"from": "best"},
              "tracking": {"mlflow_uri": SERVER, "experiment": "exp", "wandb_project": "hp", "wandb_entity": "team",
                           "wandb_api_key_secret": WANDB_SECRET},
              "compute": {"instance_type": "ml.g5.xlarge"}, "budget": {"max_usd": 200}}


def _given(raw: dict, json_path: tuple) -> Any:
    for part in json_path:
        raw = raw.get(part) if isinstance(raw, dict) else None
    return raw


def test_every_shared_setting_reaches_the_trainer_with_the_runs_value():
    raw, default = copy.deepcopy(EVERYTHING), TrainConfig()
    for path, (rule, json_path, _) in SHARED.items():
        if _given(raw, json_path) is None and path != ("model", "source"):  # random weights: no source
            value = _different(rule, value_at(default, dotted(path)))
            assert value is not None, f"{'.'.join(json_path)}: give it a value in EVERYTHING"
            node = raw
            for part in json_path[:-1]:
                node = node.setdefault(part, {})
            node[json_path[-1]] = value
    run = parse_run(raw)
    est = estimate(run, validation_tokens=10_000)
    sent = parse(est.hyperparameters)  # as the trainer reads them
    for path in SHARED:
        if path == ("model", "source"):
            continue
        expected = value_at(run, dotted(path))
        expected = ",".join(expected) if isinstance(expected, tuple) else expected  # a list of module names
        assert expected != value_at(default, dotted(path)), dotted(path)
        # the run's value; where the planner chooses, the choice its estimate records under the same name
        assert value_at(sent, dotted(path)) == getattr(est, path[-1], expected), dotted(path)
    assert sent.training.micro_batch * sent.training.grad_accum == run.training.micro_batch * run.training.grad_accum


def test_only_what_differs_from_the_trainers_defaults_travels():
    assert flatten(TrainConfig()) == {}
    sent = {"model.config": '{"a":1}', "training.method": "lora", "training.epochs": "2.5", "training.lr": "0.001",
            "checkpoint.interval_s": "450.0", "sharding.group_nodes": "2", "export.from": "best",
            "eval.keep_best": "true"}
    config = parse(sent)
    assert (config.checkpoint.interval_s, config.sharding.group_nodes, config.model.config) == (450, 2, {"a": 1})
    assert (config.training.lr, config.export.from_) == (0.001, "best")  # a keyword's field: `from_`
    assert flatten(config) == sent
    with pytest.raises(ValueError, match="unknown field checkpoint.interval_minutes: accepted fields are async_save"):
        parse({"checkpoint.interval_minutes": "7.5"})
    for old in ("optim.lr", "export.weights", "method", "epochs", "seed", "micro_batch", "lora.rank", "export.from_"):
        with pytest.raises(ValueError, match=f"unknown field {old}:"):  # one name only
            parse({old: "1"})
