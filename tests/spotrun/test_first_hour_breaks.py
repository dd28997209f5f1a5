"""The rest of a new user's first hour (issue #30): settings that would waste a run, refused before anything is paid
for in one line naming the field, through the CLI (`spotrun validate`, `estimate`) and the estimate Lambda's handler
alike; every CLI error under `--format json` as JSON; and the wording of the smaller refusals.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from moto import mock_aws

from spotrun.cli.main import main
from spotrun.handlers import estimate as estimate_handler

from .stage_settings import BUCKET, SETTINGS

RUN = {"version": 1, "name": "breaks", "model": {"init": "random", "config": {
    "model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4}},
    "data": {"source": f"s3://{BUCKET}/datasets/d1/", "tokens": 1_000_000, "seq_len": 128},
    "compute": {"instance_type": "ml.g5.xlarge"}, "budget": {"max_usd": 20}}


def _with(**sections) -> dict:
    run = copy.deepcopy(RUN)
    for section, values in sections.items():
        run[section] = {**run.get(section, {}), **values}
    return run


def _cli(tmp_path: Path, capsys, command: str, run: dict) -> tuple[int, dict]:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    code = main([command, "--format", "json", str(path)])
    return code, json.loads(capsys.readouterr().out)


def _lambda(monkeypatch, run: dict) -> dict:
    """The estimate Lambda's handler itself, with the stage's environment (as the construct writes it)."""
    for key, value in {**SETTINGS.to_env(), "AWS_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    with mock_aws():
        return estimate_handler.handler({"run": run, "execution": "exec-1", "started": "2026-01-01T00:00:00Z"}, None)


def _refused_alike(tmp_path, capsys, monkeypatch, run: dict, field: str, *says: str) -> None:
    """validate, estimate and the Lambda refuse `run` as InvalidRun on `field`, their messages saying `says`."""
    for command in ("validate", "estimate"):
        code, doc = _cli(tmp_path, capsys, command, run)
        assert (code, doc["error"], doc["field"]) == (2, "InvalidRun", field), (command, doc)
        assert all(s in doc["message"] for s in says), (command, doc["message"])
    out = _lambda(monkeypatch, run)
    assert (out["status"], out["field"]) == ("InvalidRun", field), out
    assert all(s in out["message"] for s in says), out["message"]


# ---- 1. eval.keep_best without an evaluation cadence ---------------------------------------------------------------


def test_keep_best_without_an_eval_cadence_is_refused_naming_the_fields(tmp_path, capsys, monkeypatch):
    """Without every_steps or every_minutes the trainer evaluates only before the first step and at the end: no
    best checkpoint is ever kept, and export.from=best would export the last weights under the name of the best."""
    run = _with(eval={"keep_best": True}, export={"from": "best"}, data={"validation_fraction": 0.1})
    _refused_alike(tmp_path, capsys, monkeypatch, run, "eval.keep_best", "eval.keep_best=true is invalid",
                   "eval.every_steps or eval.every_minutes")
    for cadence in ({"every_steps": 50}, {"every_minutes": 30}):  # either cadence: accepted
        code, doc = _cli(tmp_path, capsys, "estimate", _with(eval={"keep_best": True, **cadence},
                                                              export={"from": "best"}, data=run["data"]))
        assert code == 0, doc


# ---- 2. every error under --format json is JSON ------------------------------------------------------------------


@pytest.mark.parametrize("argv, field, says", [
    (["estimate", "--format", "json", "run.json", "--nope"], "--nope", "unrecognized arguments: --nope"),
    (["local", "run.json", "--format=json", "--nproc", "two"], "--nproc",
     "--nproc=two is invalid: expected a whole number"),
    (["local", "run.json", "--format", "json", "--interrupt-at", "-5s"], "--interrupt-at",
     "--interrupt-at=-5s is invalid: expected a step "),
    (["validate", "--format", "json"], None, "the following arguments are required: runs"),
    (["estmate", "--format", "json", "run.json"], None, "invalid choice: 'estmate'"),
    (["simulate", "run.json", "--format", "json", "--n", "x"], "--n", "--n=x is invalid: expected a whole number"),
])
def test_argument_errors_under_format_json_are_one_json_document_with_the_same_exit_code(capsys, argv, field, says):
    with pytest.raises(SystemExit) as done:
        main(argv)
    out, err = capsys.readouterr()
    assert done.value.code == 2 and err == "", (out, err)
    doc = json.loads(out)  # the whole of stdout: one object
    assert doc["error"] == "InvalidArguments" and says in doc["message"], doc
    assert doc.get("field") == field, doc
    text = [a for a in argv if a not in ("--format", "json", "--format=json")]  # the same mistake, as text
    with pytest.raises(SystemExit) as same:
        main(text)
    out, err = capsys.readouterr()
    assert same.value.code == 2 and out == "" and err.startswith("error: InvalidArguments: ") and says in err, err


def test_a_missing_package_under_format_json_is_json_too(tmp_path, capsys, monkeypatch):
    from spotrun.cli import estimate as estimate_command

    def missing(*_args, **_kwargs):
        raise ModuleNotFoundError("No module named 'torch'", name="torch")

    monkeypatch.setattr(estimate_command, "check_file", missing)
    (tmp_path / "run.json").write_text(json.dumps(RUN))
    assert main(["estimate", "--format", "json", str(tmp_path / "run.json")]) == 1
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["error"] == "MissingPackage" and "spotrun estimate needs torch" in doc["message"] and err == "", doc
    assert main(["estimate", str(tmp_path / "run.json")]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: spotrun estimate needs torch, which is not installed")


# ---- 3. fewer tokens than one optimizer step -----------------------------------------------------------------------


def _minimum(message: str) -> int:
    return int(message.split("expected at least ")[1].split(" tokens")[0].replace(",", ""))


def test_fewer_tokens_than_one_optimizer_step_are_refused_naming_the_minimum(tmp_path, capsys, monkeypatch):
    """4 GPUs x (micro_batch 4 x grad_accum 2) samples of 128 tokens per step: 2,000 tokens fill one GPU's step,
    not the plan's. The minimum named is the plan's: one token fewer is refused, that many are planned as one step
    of the plan's batch."""
    run = _with(data={"tokens": 2000}, compute={"instance_type": "ml.g5.12xlarge"},
                training={"micro_batch": 4, "grad_accum": 2})
    code, doc = _cli(tmp_path, capsys, "estimate", run)
    assert (code, doc["error"], doc["field"]) == (2, "InvalidRun", "data.tokens"), doc
    assert doc["message"].startswith("data.tokens=2000 is invalid: expected at least "), doc
    assert "one optimizer step of this plan" in doc["message"] and "1 x ml.g5.12xlarge" in doc["message"]
    minimum = _minimum(doc["message"])
    out = _lambda(monkeypatch, run)
    assert (out["status"], out["field"]) == ("InvalidRun", "data.tokens") and _minimum(out["message"]) == minimum, out
    code, doc = _cli(tmp_path, capsys, "estimate", _with(data={"tokens": minimum - 1},
                                                         compute=run["compute"], training=run["training"]))
    assert (code, doc["field"]) == (2, "data.tokens"), doc
    code, doc = _cli(tmp_path, capsys, "estimate", _with(data={"tokens": minimum},
                                                         compute=run["compute"], training=run["training"]))
    assert code == 0, doc
    assert doc["global_batch_samples"] * run["data"]["seq_len"] == minimum  # exactly one step of the plan's batch
    two_epochs = _with(data={"tokens": minimum // 2}, compute=run["compute"],
                       training={**run["training"], "epochs": 2})  # epochs count: two passes make the step
    assert _cli(tmp_path, capsys, "estimate", two_epochs)[0] == 0


def test_validate_refuses_fewer_tokens_than_one_step_on_one_gpu(tmp_path, capsys):
    """validate does not plan a layout, but one GPU's step (micro_batch x grad_accum samples) is the least any
    layout needs."""
    code, doc = _cli(tmp_path, capsys, "validate", _with(data={"tokens": 100}))
    assert (code, doc["field"]) == (2, "data.tokens"), doc
    assert _minimum(doc["message"]) == 128 and "training.micro_batch" in doc["message"], doc


# ---- 4. invalid input wins over the budget -------------------------------------------------------------------------


OVER_BUDGET = {"data": {"tokens": 1_000_000_000}, "budget": {"max_usd": 0.5}}


def test_an_invalid_field_in_an_over_budget_run_is_refused_as_invalid(tmp_path, capsys, monkeypatch):
    """The run must change whatever the cap: exit 2 / InvalidRun naming the field, not 3 / OverBudget."""
    assert _cli(tmp_path, capsys, "estimate", _with(**OVER_BUDGET))[0] == 3  # the cap alone: over budget
    run = _with(**OVER_BUDGET, registry={"approval_status": "Approved"})
    _refused_alike(tmp_path, capsys, monkeypatch, run, "registry.approval_status",
                   "approving it is a separate, permissioned step")


def test_an_execution_to_resume_that_does_not_exist_wins_over_the_budget():
    from spotrun.pipeline.plan import plan

    run = _with(**OVER_BUDGET, checkpoint={"resume_from": "breaks-20260101-000000"})
    refused = plan(run, "exec-1", SETTINGS, execution_status=lambda name: None)
    assert (refused["status"], refused["field"]) == ("InvalidRun", "checkpoint.resume_from"), refused


def test_of_several_files_an_invalid_one_decides_the_exit_code(tmp_path, capsys):
    over, invalid = tmp_path / "over.json", tmp_path / "invalid.json"
    over.write_text(json.dumps(_with(**OVER_BUDGET)))
    invalid.write_text(json.dumps(_with(compute={"instance_type": "ml.nope.xlarge"})))
    for order in ([over, invalid], [invalid, over]):
        assert main(["estimate", "--format", "json", *map(str, order)]) == 2
        docs = json.loads(capsys.readouterr().out)
        assert sorted(d["error"] for d in docs) == ["InvalidRun", "OverBudget"], docs


# ---- 5. a bare hub name as model.source --------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["validate", "estimate", "simulate", "local", "start"])
def test_a_bare_hub_name_that_is_no_local_directory_gets_a_did_you_mean(tmp_path, capsys, command):
    """The loader made `Qwen/Qwen2-0.5B` a path beside the run file; nothing is there, so the error quotes what was
    written and names the hub id it probably meant."""
    path = tmp_path / "run.json"
    path.write_text(json.dumps({**RUN, "model": {"source": "Qwen/Qwen2-0.5B"}}))
    with mock_aws():  # `start` reads the stage only after the file: no request may leave if it got that far
        main([command, str(path), "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert (doc["error"], doc["field"]) == ("InvalidRun", "model.source"), doc
    assert doc["message"].startswith('model.source="Qwen/Qwen2-0.5B" is invalid: '), doc
    assert "did you mean hf://Qwen/Qwen2-0.5B" in doc["message"] and str(tmp_path / "Qwen" / "Qwen2-0.5B") in \
        doc["message"], doc


def test_a_local_directory_named_like_a_hub_id_is_used_as_it_is(tmp_path, capsys):
    model = tmp_path / "Qwen" / "Qwen2-0.5B"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps(RUN["model"]["config"]))
    code, doc = _cli(tmp_path, capsys, "validate", {**RUN, "model": {"source": "Qwen/Qwen2-0.5B"}})
    assert code == 0 and "did you mean" not in json.dumps(doc), doc


def test_the_lambda_names_the_hub_id_for_a_bare_hub_name_too(monkeypatch):
    out = _lambda(monkeypatch, {**RUN, "model": {"source": "Qwen/Qwen2-0.5B"}})
    assert (out["status"], out["field"]) == ("InvalidRun", "model.source"), out
    assert "did you mean hf://Qwen/Qwen2-0.5B" in out["message"], out


# ---- 6. the smaller refusals' wording ----------------------------------------------------------------------------


@pytest.mark.parametrize("argv, prog", [
    (["local", "run.json", "--nope"], "spotrun local"),
    (["estimate", "run.json", "--nope"], "spotrun estimate"),
    (["catalog", "update", "--region", "eu-west-1", "--nope"], "spotrun catalog update"),
])
def test_an_unknown_flag_points_to_the_subcommands_help(capsys, argv, prog):
    with pytest.raises(SystemExit):
        main(argv)
    err = capsys.readouterr().err
    assert err == f"error: InvalidArguments: unrecognized arguments: --nope (`{prog} --help` lists the flags)\n", err


def _simulate(tmp_path: Path, capsys, *argv: str) -> tuple[int, str, str]:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(RUN))
    code = main(["simulate", str(path), "--n", "5", "--no-optimum", "--out", str(tmp_path / "sim"), *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_negative_drought_rate_is_named_by_its_flag(tmp_path, capsys):
    for value in ("-1", "inf"):  # inf studied "a drought every 0 days": a table of $0.00 runs that never finish
        code, _, err = _simulate(tmp_path, capsys, "--droughts", value)
        assert code == 2 and err == f"error: InvalidArguments: --droughts={value} is invalid: expected a number of " \
            "droughts per day from 0 to 24 (each lasts 6-80 h)\n", err


def test_a_traces_folder_that_does_not_exist_is_one_clear_line(tmp_path, capsys):
    missing = tmp_path / "no-such-traces"
    code, _, err = _simulate(tmp_path, capsys, "--traces", str(missing))
    assert code == 2 and err == f"error: InvalidArguments: --traces={missing} is invalid: expected a directory of " \
        "spot-traces files (*.json); nothing is there\n", err
    (tmp_path / "empty").mkdir()
    code, _, err = _simulate(tmp_path, capsys, "--traces", str(tmp_path / "empty"))
    assert code == 2 and "no *.json trace files under it" in err, err


def test_one_recorded_trace_is_one_trace(tmp_path, capsys):
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "zone-a.json").write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [1, 1, 0, 1] * 50}))
    code, out, _ = _simulate(tmp_path, capsys, "--traces", str(traces))
    assert code == 0 and "(1 recorded trace from random start offsets," in out, out


@pytest.mark.parametrize("argv", [["status"], ["validate", "RUN"], ["estimate", "RUN"]])
def test_a_stage_the_checkout_does_not_list_is_named_with_the_ones_it_does(tmp_path, capsys, monkeypatch, argv):
    """With no region anywhere, a mistyped `--stage` said botocore's NoRegionError."""
    from stacks.config import ENVIRONMENTS

    for name in ("AWS_DEFAULT_REGION", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    (tmp_path / "run.json").write_text(json.dumps(RUN))
    with mock_aws():
        code = main([str(tmp_path / "run.json") if a == "RUN" else a for a in argv] + ["--stage", "prd"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "NoRegionError" not in err, err
    listed = ", ".join(env.stage for env in ENVIRONMENTS)
    assert '"prd"' in err and f"stacks/config.py lists {listed}" in err and "--region" in err, err


def test_a_cap_under_the_cap_to_set_is_accepted_with_a_warning_naming_it(tmp_path, capsys):
    """A new user set a cap a cent under the P95 finish cap the estimate told them ('the cap to set'): accepted
    (the chain finishes uninterrupted), exit 0, and no word that a run billed the P95 would stop OverBudget. Now a
    warning names the cap to set; at that cap, none. The figure is the estimate's own, read from its output."""
    # llama3's chain at its cap has room above its smallest cap (qwen2's smallest cap is its cap to set)
    example = json.loads((Path(__file__).parents[2] / "examples/runs/llama3-8b-full.json").read_text())
    code, told = _cli(tmp_path, capsys, "estimate", example)
    finish = told["spot_policy"]["p95_finish_cap_usd"]
    assert code == 0 and finish is not None, told
    for cap, warned in ((round(finish - 0.01, 2), True), (finish, False)):
        code, out = _cli(tmp_path, capsys, "estimate", {**example, "budget": {**example["budget"], "max_usd": cap}})
        assert code == 0 and out["spot_policy"]["p95_finish_cap_usd"] == finish, out
        named = [w for w in out["warnings"] if "under the cap to set" in w]
        assert bool(named) == warned, (cap, out["warnings"])
        assert not warned or f"${finish:,.2f}" in named[0], named
