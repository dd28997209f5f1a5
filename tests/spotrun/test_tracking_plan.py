"""A run's `tracking.mlflow_uri` reaches the trainer: the planner sends the server and the experiment as
hyperparameters, and the trainer's own config parser reads them; a run that names no server sends neither."""

from __future__ import annotations

import copy

from spotrun.contract import parse_run
from spotrun.planner import estimate
from spotrun.seams import Hyperparameter

SERVER = "arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/ml-team"
RUN = {"version": 1, "name": "tiny-tracked",
       "model": {"init": "random",
                 "config": {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
                            "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 1000}},
       "data": {"source": "s3://art-bucket/datasets/d1/", "tokens": 1_000_000, "seq_len": 128},
       "tracking": {"mlflow_uri": SERVER},
       "compute": {"instance_type": "ml.g5.xlarge"}, "budget": {"max_usd": 20}}


def test_the_tracking_server_and_experiment_are_hyperparameters_the_trainer_parses():
    from spotrun_trainer.config import TrainConfig

    hp = estimate(parse_run(RUN)).hyperparameters
    assert hp[Hyperparameter.TRACKING_MLFLOW_URI.value] == SERVER
    assert hp[Hyperparameter.TRACKING_EXPERIMENT.value] == "tiny-tracked"  # the run's executions, side by side
    cfg = TrainConfig.from_hyperparameters(hp, **{"data.path": "/opt/ml/input/data/train",
                                                  "output_dir": "/opt/ml/model",
                                                  "model.config": '{"model_type": "llama"}'})
    assert (cfg.tracking.mlflow_uri, cfg.tracking.experiment) == (SERVER, "tiny-tracked")


def test_a_run_naming_no_server_sends_no_tracking_hyperparameter():
    run = copy.deepcopy(RUN)
    del run["tracking"]
    hp = estimate(parse_run(run)).hyperparameters
    assert not [k for k in hp if k.startswith("tracking.")]
