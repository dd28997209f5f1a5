"""One front end: every command reads a run file with spotrun.contract.runfile.load_run_file (a duplicated key is
refused by each, by field), relative sources are read relative to the run file, and every command exits by the one
table of spotrun/cli/exits.py (printed by --help, docs/cli.md's table the same), with JSON errors under
--format json."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from moto import mock_aws

from spotrun.cli.exits import MEANING, Exit
from spotrun.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "runs" / "qwen2-0.5b-full-small.json"


def _twice_budget(tmp_path: Path) -> Path:
    """A valid run file but for a second "budget" key (json.loads would keep the last one silently)."""
    text = json.dumps(json.loads(EXAMPLE.read_text()))
    path = tmp_path / "twice.json"
    path.write_text(text[:-1] + ', "budget": {"max_usd": 100000}}')
    return path


@pytest.mark.parametrize("argv", [
    ["validate"], ["estimate"], ["simulate", "--n", "1"], ["start", "--stage", "dev"], ["local", "--progress", "none"],
])
def test_every_command_refuses_a_duplicated_key_by_field(argv, tmp_path, capsys, monkeypatch):
    path = _twice_budget(tmp_path)
    monkeypatch.chdir(tmp_path)  # simulate/local outputs, if any were written, land here
    with mock_aws():  # no stack exists: `start` must refuse the file before it looks for one
        code = main([argv[0], str(path), *argv[1:], "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == Exit.INVALID == 2, doc
    assert doc["error"] == "InvalidRun" and doc["field"] == "budget", doc
    assert "each key once" in doc["message"]
    assert not (tmp_path / "runs").exists()  # local made no job directory


def test_start_reads_the_run_file_before_the_stack_in_text_too(tmp_path, capsys):
    with mock_aws():
        assert main(["start", str(_twice_budget(tmp_path)), "--stage", "dev"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: InvalidRun: budget=") and "stack" not in err


def test_relative_sources_are_read_relative_to_the_run_file_not_the_cwd(tmp_path, assets, capsys, monkeypatch):
    runs = tmp_path / "runs"
    shutil.copytree(assets["model"], runs / "model")
    shutil.copytree(assets["data"], runs / "data")
    run = {"version": 1, "name": "relative", "model": {"source": "model"},
           "data": {"source": "data", "seq_len": 64}, "compute": {"instance_type": "ml.g5.xlarge"},
           "budget": {"max_usd": 5}}
    (runs / "run.json").write_text(json.dumps(run))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # neither model/ nor data/ here
    assert main(["estimate", "--format", "json", str(runs / "run.json")]) == 0
    doc = json.loads(capsys.readouterr().out)
    tokens = json.loads((runs / "data" / "index.json").read_text())["total_tokens"]
    assert f"read model.source's config.json ({runs / 'model'})" in doc["checked"]
    assert f"read data.source's index.json ({runs / 'data'}): {tokens:,} tokens" in doc["checked"]
    run["data"]["source"] = "missing"
    (runs / "run.json").write_text(json.dumps(run))
    assert main(["estimate", "--format", "json", str(runs / "run.json")]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["field"] == "data.source" and '/runs/missing" is invalid' in doc["message"]  # absolute


def _example_with(tmp_path: Path, section: str, **values) -> Path:
    raw = json.loads(EXAMPLE.read_text())
    raw[section] = {**raw.get(section, {}), **values}
    path = tmp_path / f"{section}.json"
    path.write_text(json.dumps(raw))
    return path


def test_validate_refuses_an_instance_type_the_catalog_does_not_have(tmp_path, capsys):
    path = _example_with(tmp_path, "compute", instance_type="ml.zz9.xlarge")
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert 'InvalidRun: compute.instance_type="ml.zz9.xlarge" is invalid: expected auto or an instance type of ' \
           "spotrun's catalog: " in err and "ml.g5.xlarge" in err
    assert main(["estimate", "--format", "json", str(path)]) == 2
    assert json.loads(capsys.readouterr().out)["field"] == "compute.instance_type"
    assert "did you mean" not in err  # nothing near it
    # a typo: the type meant, before the whole list
    assert main(["validate", str(_example_with(tmp_path, "compute", instance_type="ml.g6e.xlarg"))]) == 2
    assert "expected auto or an instance type of spotrun's catalog (did you mean ml.g6e.xlarge?): " in \
        capsys.readouterr().err


def test_an_invalid_run_the_planner_finds_exits_2_and_over_budget_3(tmp_path, capsys):
    warm = _example_with(tmp_path, "compute", warm_pool_minutes=5)  # spot with a warm pool: the planner refuses
    assert main(["estimate", "--format", "json", str(warm)]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["error"] == "InvalidRun" and doc["field"] == "compute.warm_pool_minutes"
    poor = _example_with(tmp_path, "budget", max_usd=0.01)
    assert main(["estimate", "--format", "json", str(poor)]) == 3
    assert json.loads(capsys.readouterr().out)["error"] == "OverBudget"


def test_argument_errors_are_json_under_format_json(tmp_path, capsys):
    assert main(["validate", "--format", "json", "--bucket", "b", str(EXAMPLE)]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["field"] == "--bucket" and "--group too" in doc["message"]
    assert main(["local", "--format", "json"]) == 2
    assert json.loads(capsys.readouterr().out)["error"] == "InvalidArguments"


def test_help_prints_the_one_exit_code_table_and_the_docs_agree(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for code, meaning in MEANING.items():
        assert f"{int(code)} {meaning}" in text
    rows = re.findall(r"^\| (\d+) +\| (.+?) +\|$", (ROOT / "docs" / "cli.md").read_text(), re.MULTILINE)
    assert {int(code): meaning for code, meaning in rows} == {int(c): m for c, m in MEANING.items()}


def _local_run(tmp_path: Path, assets, **model) -> dict:
    return {"version": 1, "name": "through-plan", "model": {"source": str(assets["model"]), **model},
            "data": {"source": str(assets["data"]), "seq_len": 64}, "compute": {"instance_type": "ml.g5.xlarge"},
            "budget": {"max_usd": 5}}


def test_local_sends_the_plans_hyperparameters_not_an_inline_config_of_a_pretrained_model(tmp_path, assets):
    from spotrun.local.pipeline import LocalOptions, channels_of, hyperparameters, plan_local

    config = json.loads((assets["model"] / "config.json").read_text())
    planned = plan_local(_local_run(tmp_path, assets, config=config))  # a pretrained model with an inline copy
    hyper = hyperparameters(planned, LocalOptions(out=tmp_path, overrides={"max_steps": "3"}))
    assert "model.config" not in hyper  # its config comes with its weights, as on AWS
    assert "segment_seconds" not in hyper and hyper["max_steps"] == "3"
    # the plan's 1 sample per optimizer step (training.micro_batch 1 on one GPU): one worker (spotrun/local/batch.py)
    assert hyper["data.seq_len"] == "64" and hyper["nproc_per_node"] == "1"
    assert channels_of(planned) == {"train": assets["data"], "model": assets["model"]}


def _local_refusal(capsys, tmp_path: Path, raw: dict) -> dict:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(raw))
    code = main(["local", str(path), "--out", str(tmp_path / "out"), "--progress", "none", "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 2 and doc["error"] == "InvalidRun", doc
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())  # no job directory
    return doc


def test_local_applies_the_hyperparameter_limits_and_the_pipelines_rules(tmp_path, assets, capsys):
    config = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 128,
              "notes": "x" * 3000}  # an inline config over CreateTrainingJob's 2,500-character value limit
    raw = {**_local_run(tmp_path, assets), "model": {"init": "random", "config": config}}
    doc = _local_refusal(capsys, tmp_path, raw)
    assert doc["field"] == "model.config" and "at most 2,500 characters" in doc["message"]
    raw = {**_local_run(tmp_path, assets), "registry": {"approval_status": "Approved"}}
    doc = _local_refusal(capsys, tmp_path, raw)  # the pipeline registers every model for review
    assert doc["field"] == "registry.approval_status"


def test_the_local_and_the_aws_report_come_from_one_builder(tmp_path, assets):
    from spotrun.local.pipeline import plan_local
    from spotrun.pipeline.guard import _report, registry_metadata
    from spotrun.pipeline.report import build_local_report, summary_text
    from spotrun.seams import Guard, GuardAction

    raw = _local_run(tmp_path, assets)
    raw["registry"] = {"gate": {"max_val_loss": 2.5}}
    raw["data"]["validation"] = str(assets["data"])
    planned = plan_local(raw)
    local = build_local_report(
        plan=planned, spot=True, job_name="j", metrics={"final_loss": 2.0, "steps": 3, "tokens": 192, "wall_s": 9.0,
                                                        "tokens_per_s_per_device": 10.0},
        losses=[(1, 2.2), (2, 2.1), (3, 2.0)], history={"starts": [{"started_s": 0.0, "ended_s": 10.0}],
                                                       "interruptions": [], "wall_s": 10.0},
        spot_discount=0.7, model_data_url="out/model", evaluation={"base_val_loss": 3.0, "val_loss": 2.4})
    describe = {"FinalMetricDataList": [{"MetricName": "train:loss", "Value": 2.0},
                                        {"MetricName": "train:base_val_loss", "Value": 3.0},
                                        {"MetricName": "train:exported_val_loss", "Value": 2.4}],
                "ModelArtifacts": {"S3ModelArtifacts": "s3://b/output/model.tar.gz"}}
    segment = {"segment": 1, "job_name": "j", "spot": True, "status": "Completed", "secondary_status": "Completed",
               "billable_seconds": 3, "training_seconds": 10, "cost_usd": 0.01, "exact": True, "interruptions": 0}
    guard = Guard(action=GuardAction.COMPLETED, job_name="j", spot=True, wait_seconds=60, spent_before_usd=0.0,
                  interruptions_before=0, segments=[segment])
    remote = _report(planned, guard, describe, 0.01)
    shared = ("run", "job_name", "status", "method", "instance_type", "instance_count", "spot", "billable_seconds",
              "training_seconds", "interruptions", "spot_savings_pct", "cost_usd", "price_basis", "cost_basis",
              "price_region", "price_as_of", "cap_usd", "estimated_cost_usd", "final_loss", "model_data_url",
              "data_source", "worst_case_lost_usd", "artifact", "base_val_loss", "exported_val_loss", "gate")
    assert set(shared) <= local.keys() and set(shared) <= remote.keys()
    for key in ("run", "method", "instance_type", "instance_count", "cap_usd", "estimated_cost_usd", "final_loss",
                "data_source", "artifact", "base_val_loss", "exported_val_loss", "gate"):
        assert local[key] == remote[key], key
    assert local["gate"]["passed"] and "registry gate passed" in local["gate"]["cause"]
    assert registry_metadata(local).keys() == registry_metadata(remote).keys()
    assert "registry gate passed" in summary_text(local) and "registry gate passed" in summary_text(remote)


def test_a_local_run_may_name_its_own_tracking_server(tmp_path, assets):
    from spotrun.local.pipeline import LocalOptions, hyperparameters, plan_local

    raw = {**_local_run(tmp_path, assets), "tracking": {"mlflow_uri": "http://127.0.0.1:5931"}}
    hyper = hyperparameters(plan_local(raw), LocalOptions(out=tmp_path))  # no stage lists servers on this machine
    assert hyper["tracking.mlflow_uri"] == "http://127.0.0.1:5931"
