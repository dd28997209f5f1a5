"""Validation and evaluation from the run contract to the trainer: the estimate Lambda sends the `validation`
channel and the evaluation hyperparameters, the trainer's config parses them, and evaluation time is planned."""

from __future__ import annotations

import copy

import pytest

from spotrun.contract.spec import RunValidationError, parse_run
from spotrun.pipeline.plan import PipelineSettings, plan
from spotrun.planner.estimate import estimate
from spotrun.seams import VALIDATION_CHANNEL

SETTINGS = PipelineSettings(bucket="art-bucket", job_prefix="spotrun-dev-", model_package_group="spotrun-models",
                            poll_seconds=60, project="spotrun", stage="dev", cost_center="ml-platform")
RUN = {"version": 1, "name": "tiny-eval",
       "model": {"init": "random",
                 "config": {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
                            "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 1000}},
       "data": {"source": "s3://art-bucket/datasets/d1/", "tokens": 1_000_000, "seq_len": 128,
                "validation": "s3://art-bucket/datasets/d1-val"},
       "eval": {"every_steps": 25, "every_minutes": 30, "max_batches": 64, "keep_best": True},
       "export": {"from": "best"}, "registry": {"gate": {"min_improvement": 0.1}},
       "compute": {"instance_type": "ml.g5.xlarge"}, "budget": {"max_usd": 20}}


def test_the_plan_sends_the_validation_channel_and_the_trainer_parses_the_evaluation_settings():
    from spotrun.settings.wire import job_config

    p = plan(RUN, "exec-1", SETTINGS)
    assert p["status"] == "ok", p
    channel = next(c for c in p["input_data_config"] if c["ChannelName"] == VALIDATION_CHANNEL)
    assert channel["InputMode"] == "FastFile"
    assert channel["DataSource"]["S3DataSource"]["S3Uri"] == "s3://art-bucket/datasets/d1-val/"
    hp = p["hyperparameters"]
    assert hp["export.from"] == "best"
    # What the launcher adds on SageMaker: the channels' paths.
    cfg = job_config(hp, **{"data.path": "/opt/ml/input/data/train",
                                                  "data.validation_path": "/opt/ml/input/data/validation",
                                                  "output_dir": "/opt/ml/model",
                                                  "checkpoint.dir": "/opt/ml/checkpoints"})  # CheckpointConfig
    assert (cfg.eval.every_steps, cfg.eval.every_s, cfg.eval.max_batches) == (25, 1800.0, 64)
    assert cfg.eval.keep_best is True and cfg.export.from_ == "best"


def test_a_validation_channel_outside_the_datasets_prefix_is_refused_by_field():
    run = copy.deepcopy(RUN)
    run["data"]["validation"] = "s3://other-bucket/val/"
    p = plan(run, "exec-2", SETTINGS)
    assert p["status"] == "InvalidRun" and p["field"] == "data.validation", p


def test_evaluation_time_is_in_the_wall_time_and_grows_with_the_schedule():
    def planned(**eval_cfg):
        raw = copy.deepcopy(RUN)
        raw["data"].pop("validation")
        raw["data"]["validation_fraction"] = 0.2  # a quarter of the training tokens held out
        raw["eval"], raw["export"] = {"max_batches": 0, **eval_cfg}, {}  # keep_best needs a cadence
        return estimate(parse_run(raw))

    none = estimate(parse_run({**RUN, "data": {k: v for k, v in RUN["data"].items() if k != "validation"},
                               "eval": {}, "export": {}, "registry": {}}))
    ends = planned()  # before the first step and at the end
    often = planned(every_steps=1)
    assert none.evaluation_seconds == 0 and ends.evaluation_seconds > 0
    assert ends.wall_seconds == pytest.approx(none.wall_seconds + ends.evaluation_seconds)
    # 2 evaluations of 2 FLOPs per parameter over 250k held-out tokens, at the training's FLOP rate: a forward
    # is a third of a training step's 6 FLOPs per parameter, over a quarter of the tokens, twice.
    train_only = none.gpu_hours * 3600 / none.instance_count  # one GPU per ml.g5.xlarge: the training seconds
    assert ends.evaluation_seconds == pytest.approx(train_only * 2 / 6 * 0.25 * 2, rel=0.05)
    assert often.evaluation_seconds > 10 * ends.evaluation_seconds
    assert often.cost_usd["spot"] > ends.cost_usd["spot"]


@pytest.mark.parametrize("change, field", [
    ({"registry": {"gate": {"max_val_loss": 2.0}}, "data": {"tokens": 10, "seq_len": 8}}, "registry.gate"),
    ({"eval": {"every_steps": 5}, "data": {"tokens": 10, "seq_len": 8}, "registry": {}}, "eval"),
    ({"eval": {"keep_best": False}}, "export.from"),
    ({"data": {"tokens": 10, "seq_len": 8, "validation": "v/", "validation_fraction": 0.1}},
     "data.validation_fraction"),
    ({"registry": {"gate": {}}}, "registry.gate"),
    ({"export": {"from": "newest"}}, "export.from"),
])
def test_evaluation_settings_without_what_they_need_are_refused_by_field(change, field):
    with pytest.raises(RunValidationError) as err:
        parse_run({**RUN, **change})
    assert err.value.field == field
