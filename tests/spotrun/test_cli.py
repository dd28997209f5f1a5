"""`spotrun estimate` offline in text and JSON, and the sources it reads (local and S3 through moto)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from spotrun.cli import main
from spotrun.contract import RunValidationError, parse_run
from spotrun.sources import resolve

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples" / "runs").glob("*.json"))
CONTRACT_KEYS = {"parameters", "trainable_parameters", "training_flops", "gpu_hours", "instance_type",
                 "instance_count", "max_runtime_seconds", "max_wait_seconds", "checkpoint_bytes",
                 "notice_upload_gb_per_s", "checkpoint_interval_seconds", "cost_usd", "warnings"}


def test_python_m_spotrun_estimates_every_example_as_json_offline():
    env = {"PATH": "/usr/bin:/bin", "AWS_EC2_METADATA_DISABLED": "true"}  # no credentials, no network use
    res = subprocess.run([sys.executable, "-m", "spotrun", "estimate", "--format", "json", *map(str, EXAMPLES)],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    docs = json.loads(res.stdout)  # several files: one JSON document, an array
    assert [d["file"] for d in docs] == list(map(str, EXAMPLES))
    for doc in docs:
        assert CONTRACT_KEYS <= doc.keys()
        assert set(doc["cost_usd"]) == {"on_demand", "spot"}
        assert doc["max_wait_seconds"] >= doc["max_runtime_seconds"]


def test_text_format_is_a_readable_table(capsys):
    assert main(["estimate", str(EXAMPLES[0])]) == 0
    out = capsys.readouterr().out
    for label in ("parameters", "GPU-hours", "instances", "MaxRuntime / MaxWait", "checkpoint", "cost"):
        assert label in out


def test_invalid_and_over_budget_runs_exit_non_zero_with_the_reason(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**json.loads(EXAMPLES[0].read_text()), "name": "no spaces allowed"}))
    assert main(["estimate", "--format", "json", str(bad)]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["error"] == "InvalidRun" and out["field"] == "name"
    poor = tmp_path / "poor.json"
    poor.write_text(json.dumps({**json.loads(EXAMPLES[0].read_text()), "budget": {"max_usd": 1}}))
    assert main(["estimate", "--format", "json", str(poor)]) == 3
    out = json.loads(capsys.readouterr().out)
    assert out["error"] == "OverBudget" and out["estimate"]["cost_usd"]["spot"] > 1
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    assert main(["estimate", str(broken)]) == 2
    assert "InvalidRun" in capsys.readouterr().err


def _run_with_sources(model_source: str, data_source: str):
    return parse_run({"version": 1, "name": "src", "model": {"source": model_source},
                      "data": {"source": data_source, "seq_len": 128}, "budget": {"max_usd": 10}})


def test_local_sources_give_the_exact_config_and_token_count(assets):
    config, tokens = resolve(_run_with_sources(str(assets["model"]), str(assets["data"])))
    assert config["model_type"] == "llama"
    assert tokens == json.loads((assets["data"] / "index.json").read_text())["total_tokens"]


def test_s3_sources_are_read_with_boto3():
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="runs-bucket")
        s3.put_object(Bucket="runs-bucket", Key="models/tiny/config.json",
                      Body=json.dumps({"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4}))
        s3.put_object(Bucket="runs-bucket", Key="datasets/d1/index.json", Body=json.dumps({"total_tokens": 1234}))
        run = _run_with_sources("s3://runs-bucket/models/tiny/", "s3://runs-bucket/datasets/d1")
        config, tokens = resolve(run, s3_client=s3)
        assert config["n_embd"] == 64 and tokens == 1234
        with pytest.raises(RunValidationError) as err:
            resolve(_run_with_sources("s3://runs-bucket/models/missing/", "s3://runs-bucket/datasets/d1"), s3)
        assert err.value.field == "model.source"


def test_the_spotrun_command_is_installed_by_make():
    command = Path(sys.executable).parent / "spotrun"
    assert command.exists(), "make venv installs the project (pip install -e .), which provides `spotrun`"
    res = subprocess.run([str(command), "estimate", str(EXAMPLES[0])], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "MaxRuntime / MaxWait" in res.stdout, res.stderr
