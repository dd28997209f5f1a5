"""A run's `tracking.mlflow_uri` reaches the trainer: the planner sends the server and the experiment as
hyperparameters, and the trainer's own config parser reads them; a run that names no server sends neither."""

from __future__ import annotations

import copy

import pytest

from spotrun.contract.spec import RunValidationError, parse_run
from spotrun.pipeline.assembly import mlflow_config
from spotrun.planner.estimate import estimate

SERVER = "arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/ml-team"
RUN = {"version": 1, "name": "tiny-tracked",
       "model": {"init": "random",
                 "config": {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
                            "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 1000}},
       "data": {"source": "s3://art-bucket/datasets/d1/", "tokens": 1_000_000, "seq_len": 128},
       "tracking": {"mlflow_uri": SERVER},
       "compute": {"instance_type": "ml.g5.xlarge"}, "budget": {"max_usd": 20}}


def test_the_tracking_server_and_experiment_are_hyperparameters_the_trainer_parses():
    from spotrun.settings.wire import job_config

    hp = estimate(parse_run(RUN)).hyperparameters
    assert hp["tracking.mlflow_uri"] == SERVER
    assert hp["tracking.experiment"] == "tiny-tracked"  # the run's executions, side by side
    cfg = job_config(hp, **{"data.path": "/opt/ml/input/data/train",
                                                  "output_dir": "/opt/ml/model",
                                                  "checkpoint.dir": "/opt/ml/checkpoints",  # as the launcher sets
                                                  "model.config": '{"model_type": "llama"}'})
    assert (cfg.tracking.mlflow_uri, cfg.tracking.experiment) == (SERVER, "tiny-tracked")


def test_a_run_naming_no_server_sends_no_tracking_hyperparameter():
    run = copy.deepcopy(RUN)
    del run["tracking"]
    hp = estimate(parse_run(run)).hyperparameters
    assert not [k for k in hp if k.startswith("tracking.")]


# ---- the stage: which servers a run may name, and the job's network --------------------------------------------

def _settings(**changes):
    from spotrun.pipeline.plan import PipelineSettings

    return PipelineSettings(bucket="art-bucket", job_prefix="spotrun-dev-", model_package_group="spotrun-models",
                            poll_seconds=60, project="spotrun", stage="dev", cost_center="ml-platform", **changes)


def test_a_run_tracking_to_a_server_the_stage_lists_trains_without_network_isolation():
    from spotrun.pipeline.plan import plan

    listed = plan(RUN, "exec-1", _settings(mlflow_tracking_servers=(SERVER, "https://mlflow.example.com")))
    assert listed["status"] == "ok", listed
    assert listed["network_isolation"] is False  # the trainer must reach the server
    assert listed["hyperparameters"]["tracking.mlflow_uri"] == SERVER
    untracked = copy.deepcopy(RUN)
    del untracked["tracking"]
    assert plan(untracked, "exec-2", _settings(mlflow_tracking_servers=(SERVER,)))["network_isolation"] is True


def test_a_tracking_server_the_stage_does_not_list_is_refused_by_field():
    from spotrun.pipeline.plan import plan

    for settings, listed in ((_settings(), "none"), (_settings(mlflow_tracking_servers=("https://mlflow.example.com",)),
                                                     "https://mlflow.example.com")):
        refused = plan(RUN, "exec-3", settings)
        assert refused["status"] == "InvalidRun" and refused["field"] == "tracking.mlflow_uri", refused
        assert f"one of the stage's tracking servers: {listed} (mlflow_tracking_servers" in refused["message"]


def test_the_stages_tracking_servers_reach_the_estimate_function(synth):
    """The synthesized estimate function's environment, read back by the handler's own settings parser."""
    from spotrun.pipeline.plan import PipelineSettings

    function = next(r for lid, r in synth.resources("AWS::Lambda::Function").items()
                    if lid.startswith("PipelineEstimate"))
    env = {k: v if isinstance(v, str) else "x" for k, v in function["Properties"]["Environment"]["Variables"].items()}
    assert env["MLFLOW_TRACKING_SERVERS"] == ""  # the shipped stage lists none
    env["MLFLOW_TRACKING_SERVERS"] = f"{SERVER},https://mlflow.example.com"
    assert PipelineSettings.from_env(env).mlflow_tracking_servers == (SERVER, "https://mlflow.example.com")


def test_only_a_sagemaker_server_by_arn_gets_mlflow_config_with_the_named_experiment():
    run = copy.deepcopy(RUN)
    run["tracking"]["experiment"] = "support bot v2"
    spec = parse_run(run)
    assert mlflow_config(spec, "exec-1") == {"MlflowResourceArn": SERVER, "MlflowExperimentName": "support bot v2",
                                             "MlflowRunName": "exec-1"}
    assert estimate(spec).hyperparameters["tracking.experiment"] == "support bot v2"
    run["tracking"]["mlflow_uri"] = "https://mlflow.example.com"  # any MLflow server: the container's logger only
    assert mlflow_config(parse_run(run), "exec-1") == {}
    del run["tracking"]
    assert mlflow_config(parse_run(run), "exec-1") == {}


def test_a_bad_experiment_name_is_refused_by_field():
    run = copy.deepcopy(RUN)
    run["tracking"]["experiment"] = "x;" * 3
    with pytest.raises(RunValidationError) as err:
        parse_run(run)
    assert "tracking.experiment" in str(err.value) and "1-200 letters" in str(err.value)
    assert "\n" not in str(err.value)
