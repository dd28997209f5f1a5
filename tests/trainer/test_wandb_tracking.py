"""W&B as the second tracker (issue #30 item 5): behind tracking.py's interface, alone or beside MLflow, its API
key read from the Secrets Manager secret the run names (moto's Secrets Manager here) and never written anywhere,
checked against what W&B itself recorded: wandb runs in offline mode (`WANDB_MODE=offline`, W&B's own setting),
and the run's record file is read back with W&B's own protobuf messages (wandb.proto.wandb_internal_pb2.Record).

Also the plan's side: a run naming a W&B project gets the project and the secret's ARN as hyperparameters (never
the key), the trainer's own config parses them, the job is planned without network isolation, and a stage that
does not list the secret refuses the run.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from spotrun.settings.checks import ConfigError
from spotrun.settings.sections import TrackingConfig
from spotrun.settings.wire import job_config
from spotrun_trainer import tracking

pytest.importorskip("wandb")  # training_image/requirements.txt pins it; the trainer runs without it when unused

KEY = "wandb-key-0123456789abcdef0123456789abcdef01234567"
SECRET = "arn:aws:secretsmanager:us-east-1:123456789012:secret:spotrun/wandb-AbCdEf"


def _records(run_dir: Path) -> list:
    """The offline run's records: the .wandb file is a LevelDB-style log (32 KiB blocks of 7-byte-headed
    chunks after W&B's 7-byte file header) of protobuf `Record`s, parsed with W&B's own message class."""
    from wandb.proto import wandb_internal_pb2

    data = next(run_dir.glob("run-*.wandb")).read_bytes()
    assert data[:4] == b":W&B"
    pos, block, chunks, out = 7, 32768, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # the block's tail is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunks, pos = chunks + data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # FULL, LAST: a record ends here
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            out.append(record)
            chunks = b""
    return out


def _items(items) -> dict:
    """A record's items ({key or nested key path: decoded JSON value})."""
    return {i.key or ".".join(i.nested_key): json.loads(i.value_json) for i in items}


@pytest.fixture
def wandb_env(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    for name in ("WANDB_API_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    with mock_aws():
        boto3.client("secretsmanager").create_secret(Name="spotrun/wandb", SecretString=json.dumps({"api_key": KEY}))
        yield tmp_path


def _cfg(secret: str, **extra) -> TrackingConfig:
    return TrackingConfig(wandb_project="spotrun-tests", wandb_api_key_secret=secret, run_name="wb",
                          params={"lr": "0.003", "tracking.wandb_api_key_secret": secret}, **extra)


def test_wandb_logs_each_step_once_across_a_restart_with_the_key_from_the_secret(wandb_env):
    secret = boto3.client("secretsmanager").describe_secret(SecretId="spotrun/wandb")["ARN"]
    read: list[str] = []

    def reader(secret_id: str) -> str:
        from spotrun_trainer.wandb_tracking import read_api_key

        read.append(secret_id)
        return read_api_key(secret_id)  # the real reader, against moto's Secrets Manager

    from spotrun_trainer.wandb_tracking import WandbTracker

    ids: dict = {}
    first = WandbTracker(_cfg(secret), params={"method": "full", "total_steps": 6}, key_reader=reader)
    first.begin(ids, step=0, segments=[])
    first.losses([(1, 2.5), (2, 2.25), (3, 2.0)])
    first.step_metrics(3, {"lr": 0.003, "mfu": None})
    assert first.close(step=3, reason="signal", completed=False, signalled=True)
    # The next start (a spot restart from the checkpoint at step 2): the same W&B run, from the saved id.
    second = WandbTracker(_cfg(secret), params={"method": "full", "total_steps": 6}, key_reader=reader)
    second.begin(ids, step=2, segments=[{"start_step": 0, "end_step": 2, "seconds": 1.0}])
    second.losses([(3, 2.0), (4, 1.75)])
    second.evaluation(4, val_loss=1.5, val_ppl=4.48)
    second.summary(4, {"steps": 4, "note": "text"})
    assert second.close(step=4, reason="completed", completed=True)
    assert read == [secret, secret]  # the key came from the secret the run named, at each start
    import wandb

    wandb.teardown()  # W&B's service writes the run files behind the process: let it finish them
    # Two starts within one second: W&B names the second folder with a "-1" after the run id.
    found = (wandb_env / "wandb").glob("offline-run-*")
    folder = rf"offline-run-\d{{8}}_\d{{6}}-{ids['wandb_run_id']}(-\d+)?"
    runs = sorted(p for p in found if re.fullmatch(folder, p.name))
    assert len(runs) == 2  # one W&B run id, continued by the second start
    starts = [[_items(r.history.item) for r in _records(run) if r.WhichOneof("record_type") == "history"]
              for run in runs]
    # Each start logged the steps it trained (the second from its checkpoint at step 2), each once in its file.
    assert [[(h["_step"], h["loss"]) for h in start] for start in starts] == [[(1, 2.5), (2, 2.25), (3, 2.0)],
                                                                               [(3, 2.0), (4, 1.75)]]
    assert [(h["_step"], h["lr"]) for h in starts[0] if "lr" in h] == [(3, 0.003)]  # an unmeasured value: absent
    assert not any("mfu" in h for start in starts for h in start)
    assert [(h["_step"], h["val_loss"], h["val_ppl"]) for h in starts[1] if "val_loss" in h] == [(4, 1.5, 4.48)]
    first_run = next(r.run for r in _records(runs[0]) if r.WhichOneof("record_type") == "run")
    config = _items(first_run.config.update)
    assert (config["lr"], config["method"], config["tracking.wandb_api_key_secret"]) == (
        "0.003", "full", secret)
    summary = {}
    for r in _records(runs[1]):
        if r.WhichOneof("record_type") == "summary":
            summary.update(_items(r.summary.update))
    assert (summary["summary.steps"], summary["resumed_from_step"], summary["spotrun.starts"]) == (4.0, 2, 2)
    for run in runs:  # the key is nowhere in what W&B wrote (the secret's ARN is, as a parameter)
        for path in run.rglob("*"):
            assert not path.is_file() or KEY.encode() not in path.read_bytes(), path


def test_beside_mlflow_both_trackers_get_every_call():
    cfg = TrackingConfig(mlflow_uri="http://127.0.0.1:1", wandb_project="p", wandb_api_key_secret=SECRET)
    both = tracking.make_tracker(cfg, rank=0, params={})
    assert type(both) is tracking.Trackers
    assert [type(t).__name__ for t in both.trackers] == ["MlflowTracker", "WandbTracker"]
    assert type(tracking.make_tracker(cfg, rank=1, params={})) is tracking.NullTracker  # rank 0 only


def test_a_secret_that_cannot_be_read_costs_training_nothing_but_a_warning(wandb_env, caplog):
    from spotrun_trainer.wandb_tracking import WandbTracker

    tracker = WandbTracker(_cfg("spotrun/missing"), params={})
    tracker.begin({}, step=0, segments=[])
    tracker.losses([(1, 2.0)])
    assert not tracker.close(step=1, reason="completed", completed=True)
    assert "W&B start failed (ResourceNotFoundException" in caplog.text


def test_the_plan_sends_the_secrets_name_never_the_key_and_the_trainer_parses_it():
    from spotrun.pipeline.plan import plan
    from spotrun.seams import PipelineSettings

    run = {"version": 1, "name": "wb", "model": {"init": "random", "config": {"model_type": "gpt2", "n_embd": 64,
                                                                             "n_layer": 2, "n_head": 4}},
           "data": {"source": "s3://art-bucket/datasets/d/", "tokens": 1_000_000, "seq_len": 128},
           "compute": {"instance_type": "ml.g5.xlarge"}, "budget": {"max_usd": 20},
           "tracking": {"wandb_project": "support-chat", "wandb_entity": "team", "wandb_api_key_secret": SECRET}}
    settings = PipelineSettings(bucket="art-bucket", job_prefix="spotrun-dev-", model_package_group="g",
                                stage="dev", wandb_api_key_secrets=(SECRET,))
    planned = plan(json.loads(json.dumps(run)), "exec-1", settings)
    assert planned["status"] == "ok", planned
    hyper = planned["hyperparameters"]
    assert hyper["tracking.wandb_project"] == "support-chat"
    assert hyper["tracking.wandb_api_key_secret"] == SECRET
    assert planned["network_isolation"] is False  # the job reaches W&B
    cfg = job_config({**hyper, "data.path": "d", "output_dir": "o",
                                            "checkpoint.dir": "/opt/ml/checkpoints"})  # the launcher adds it
    assert (cfg.tracking.wandb_project, cfg.tracking.wandb_entity, cfg.tracking.wandb_api_key_secret) == (
        "support-chat", "team", SECRET)
    other = PipelineSettings(bucket="art-bucket", job_prefix="spotrun-dev-", model_package_group="g", stage="dev")
    refused = plan(json.loads(json.dumps(run)), "exec-1", other)
    assert (refused["status"], refused["field"]) == ("InvalidRun", "tracking.wandb_api_key_secret"), refused
    assert "one of the stage's W&B API key secrets: none (wandb_api_key_secrets" in refused["message"]
    with pytest.raises(ConfigError, match=r'tracking\.wandb_api_key_secret="" is invalid'):
        job_config({"data.path": "d", "output_dir": "o", "model.config": '{"model_type": "x"}',
                                          "tracking.wandb_project": "p"})
