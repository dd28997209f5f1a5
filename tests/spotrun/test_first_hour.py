"""A new user's first hour (issue #30): every inconsistency between a run and what it names is refused before
anything is paid for, through the CLI (`spotrun estimate`, `prepare`, `local`) and the estimate Lambda's handler
alike, with the field and the fix.

The validation split the prepared data holds (used, or refused when the run asks for another), an impossible
deadline (refused with the numbers, or accepted loudly), an empty dataset, shards of another tokenizer, an
interruption past the run's last step and a `--set` typo (both refused before the job directory exists).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from spotrun.cli.main import main
from spotrun.handlers import estimate as estimate_handler
from spotrun.pipeline.plan import plan
from spotrun.seams import DatasetIndex, PreparationSettings

from .stage_settings import BUCKET, SETTINGS


@pytest.fixture(scope="module")
def datasets(assets, tmp_path_factory) -> dict:
    """The assets' data (split at 0.1), the same corpus prepared without a split, and with another tokenizer."""
    from spotrun_trainer.data import prepare

    root = tmp_path_factory.mktemp("first-hour")
    prepare([assets["corpus"]], str(assets["tokenizer"]), root / "no-split", shard_bytes=16 * 1024)
    # Another tokenizer of the same size: the model's, lower-casing its input (other ids for the same text).
    other = root / "other-tokenizer"
    shutil.copytree(assets["tokenizer"], other)
    definition = json.loads((other / "tokenizer.json").read_text())
    definition["normalizer"] = {"type": "Lowercase"}
    (other / "tokenizer.json").write_text(json.dumps(definition))
    prepare([assets["corpus"]], str(other), root / "other-tokenizer-data", shard_bytes=16 * 1024)
    return {"split": assets["data"], "no-split": root / "no-split", "other": root / "other-tokenizer-data"}


def _run(model_source: str, data_source: str, **extra) -> dict:
    run = {"version": 1, "name": "first-hour", "model": {"source": model_source},
           "data": {"source": data_source, "seq_len": 64}, "compute": {"instance_type": "ml.g5.xlarge"},
           "budget": {"max_usd": 5}}
    for section, values in extra.items():
        run[section] = {**run.get(section, {}), **values}
    return run


def _estimate(tmp_path: Path, capsys, run: dict) -> tuple[int, dict]:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    code = main(["estimate", "--format", "json", str(path)])
    return code, json.loads(capsys.readouterr().out)


@pytest.fixture
def s3(assets, datasets):
    """The stage's bucket with the model (config, tokenizer) under models/ and each dataset's index files under
    datasets/ (the estimate reads nothing else)."""
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
            client.upload_file(str(assets["model"] / name), BUCKET, f"models/tiny/{name}")
        for name, local in datasets.items():
            for index in sorted(Path(local).rglob(DatasetIndex.FILE)):
                key = f"datasets/{name}/{index.relative_to(local).as_posix()}"
                client.upload_file(str(index), BUCKET, key)
        yield client


def _lambda(monkeypatch, run: dict) -> dict:
    """The estimate Lambda's handler itself, with the stage's environment (as the construct writes it)."""
    for key, value in {**SETTINGS.to_env(), "AWS_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    return estimate_handler.handler({"run": run, "execution": "exec-1", "started": "2026-01-01T00:00:00Z"}, None)


def _s3_run(dataset: str, **extra) -> dict:
    return _run(f"s3://{BUCKET}/models/tiny/", f"s3://{BUCKET}/datasets/{dataset}/", **extra)


# ---- the validation split ----------------------------------------------------------------------------------------


GATE = {"gate": {"min_improvement": 0.05}}


def test_a_gate_uses_the_split_the_prepared_data_holds(tmp_path, capsys, assets, datasets, s3):
    code, doc = _estimate(tmp_path, capsys, _run(str(assets["model"]), str(datasets["split"]), registry=GATE))
    assert code == 0, doc
    assert any("holds a validation split (0.1 of the documents)" in line for line in doc["checked"])
    assert doc["evaluation_seconds"] > 0  # the trainer evaluates
    planned = plan(_s3_run("split", registry=GATE), "exec-1", SETTINGS, s3_client=s3)
    assert planned["status"] == "ok", planned
    assert planned["estimate"]["evaluation_seconds"] > 0
    assert planned["gate"] == {"min_improvement": 0.05}


@pytest.mark.parametrize("data, extra, field, says", [
    ("no-split", {"data": {"validation_fraction": 0.1}}, "data.validation_fraction",
     "prepared without one; prepare it again with `spotrun prepare ... --validation-fraction 0.1`"),
    ("split", {"data": {"validation_fraction": 0.3}}, "data.validation_fraction",
     "expected 0.1, the split data.source holds"),
    ("no-split", {"registry": GATE}, "registry.gate", "holds no validation split, and without one the run would "
     "train to the end and report no validation loss"),
    ("no-split", {"eval": {"every_steps": 5}}, "eval", "holds no validation split"),
])
def test_a_validation_setting_the_data_cannot_satisfy_is_refused_by_cli_and_lambda(
        tmp_path, capsys, monkeypatch, assets, datasets, s3, data, extra, field, says):
    code, doc = _estimate(tmp_path, capsys, _run(str(assets["model"]), str(datasets[data]), **extra))
    assert (code, doc["error"], doc["field"]) == (2, "InvalidRun", field), doc
    assert says in doc["message"]
    out = _lambda(monkeypatch, _s3_run(data, **extra))
    assert (out["status"], out["field"]) == ("InvalidRun", field), out
    assert says in out["message"]


@pytest.mark.parametrize("data, extra, field", [
    ("no-split", {"data": {"validation_fraction": 0.1}}, "data.validation_fraction"),
    ("split", {"data": {"validation_fraction": 0.3}}, "data.validation_fraction"),
    ("no-split", {"registry": GATE}, "registry.gate"),
    ("no-split", {"eval": {"every_steps": 5}}, "eval"),
])
def test_validate_reads_a_local_prepared_index_and_refuses_the_same_settings(tmp_path, capsys, assets, datasets, data,
                                                                             extra, field):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(_run(str(assets["model"]), str(datasets[data]), **extra)))
    assert main(["validate", "--format", "json", str(path)]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert (doc["error"], doc["field"]) == ("InvalidRun", field), doc


def test_validate_refuses_shards_of_another_tokenizer_when_both_are_here(tmp_path, capsys, assets, datasets):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(_run(str(assets["model"]), str(datasets["other"]))))
    assert main(["validate", "--format", "json", str(path)]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["field"] == "data.source" and "shards made with model.source's tokenizer" in doc["message"], doc


@pytest.mark.parametrize("extra, field", [
    ({"data": {"validation_fraction": 0.1}}, "data.validation_fraction"),
    ({"registry": GATE}, "registry.gate"),
    ({"compute": {"deadline_hours": 0.0001}}, "compute.deadline_hours"),
])
def test_local_refuses_the_same_before_a_job_directory(tmp_path, capsys, assets, datasets, extra, field):
    err = _local(tmp_path, capsys, _run(str(assets["model"]), str(datasets["no-split"]), **extra))
    assert err.startswith(f"error: InvalidRun: {field}"), err


def test_validate_says_what_it_could_not_check_instead_of_ok(tmp_path, capsys, assets, datasets):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(_run(str(assets["model"]), str(datasets["split"]), registry=GATE)))
    assert main(["validate", "--format", "json", str(path)]) == 0  # a local split: checked, ok
    doc = json.loads(capsys.readouterr().out)
    assert doc["status"] == "ok" and "unchecked" not in doc
    assert any("holds a validation split (0.1 of the documents)" in line for line in doc["checked"]), doc
    assert "data.source was prepared with model.source's tokenizer" in doc["checked"]
    # An S3 source (validate reads none) and a deadline (validate does not plan): not "ok", and said which.
    run = _s3_run("no-split", registry=GATE, compute={"deadline_hours": 0.01})
    path.write_text(json.dumps(run))
    assert main(["validate", "--format", "json", str(path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["status"] == "unchecked", doc
    assert any(u.startswith("registry.gate against the validation split") for u in doc["unchecked"])
    assert any(u.startswith("compute.deadline_hours=0.01 against the run's length") for u in doc["unchecked"])
    assert main(["validate", str(path)]) == 0
    headline = capsys.readouterr().out.splitlines()[0]
    assert headline.startswith(f"== {path}: NOT CHECKED") and "compute.deadline_hours=0.01" in headline
    assert f"spotrun estimate {path}` must check these" in headline


@pytest.mark.parametrize("extra, setting", [({"registry": GATE}, "registry.gate"),
                                            ({"data": {"validation_fraction": 0.1}}, "data.validation_fraction")])
def test_validate_and_estimate_give_one_status_for_a_split_they_cannot_read(tmp_path, capsys, no_aws_credentials,
                                                                             extra, setting):
    """The same S3 split neither command can read (no credentials, or the examples' placeholder bucket): both say
    `unchecked`, naming the setting (estimate used to say ok)."""
    from spotrun.planner.sources import PLACEHOLDER_BUCKET

    path = tmp_path / "run.json"
    for bucket in (BUCKET, PLACEHOLDER_BUCKET):
        run = {**TOKENS_RUN, "data": {**TOKENS_RUN["data"], "source": f"s3://{bucket}/datasets/d1/"}}
        for section, values in extra.items():
            run[section] = {**run.get(section, {}), **values}
        path.write_text(json.dumps(run))
        docs = {}
        for command in ("validate", "estimate"):
            code = main([command, "--format", "json", str(path)])
            docs[command] = json.loads(capsys.readouterr().out)
            assert code == 0, docs[command]
        assert [d["status"] for d in docs.values()] == ["unchecked", "unchecked"], docs
        for doc in docs.values():
            assert [u for u in doc["unchecked"] if u.startswith(f"{setting} against the validation split")], doc
        assert main(["estimate", str(path)]) == 0
        headline = capsys.readouterr().out.splitlines()[0]
        assert headline.startswith(f"== {path}: NOT CHECKED") and setting in headline, headline


@pytest.mark.parametrize("change, field, says", [
    ({"data": {"source": "/nonexistent/data"}}, "data.source", "an existing local path or an s3:// URI"),
    ({"data": {"validation": "/nonexistent/validation"}}, "data.validation", "an existing local path"),
    ({"model": {"source": "DATA"}}, "model.source", "a Hugging Face model directory with config.json"),
    ({"compute": {"warm_pool_minutes": 5}}, "compute.warm_pool_minutes", "cannot be used with spot instances"),
])
def test_validate_refuses_what_estimate_and_local_always_refuse(tmp_path, capsys, assets, datasets, change, field,
                                                                 says):
    """A missing local source, a model.source that is not a model directory (the data's, swapped) and a warm pool
    with spot: validate said ok to runs that nothing could start."""
    run = _run(str(assets["model"]), str(datasets["split"]))
    for section, values in change.items():
        run[section] = {**run[section], **{k: str(datasets["split"]) if v == "DATA" else v for k, v in values.items()}}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    docs = {}
    for command in ("validate", "estimate"):
        assert main([command, "--format", "json", str(path)]) == 2, command
        docs[command] = json.loads(capsys.readouterr().out)
        assert (docs[command]["error"], docs[command]["field"]) == ("InvalidRun", field), docs
    assert says in docs["validate"]["message"], docs


def test_raw_text_for_a_gate_without_a_fraction_is_refused_before_preparing(assets):
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        s3.upload_file(str(assets["corpus"]), BUCKET, "datasets/raw/train.jsonl")
        for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
            s3.upload_file(str(assets["model"] / name), BUCKET, f"models/tiny/{name}")
        run = _s3_run("raw", registry=GATE)
        refused = plan(copy.deepcopy(run), "exec-1", SETTINGS, s3_client=s3, preparation=PreparationSettings())
        assert (refused["status"], refused["field"]) == ("InvalidRun", "registry.gate"), refused
        assert "set data.validation_fraction" in refused["message"]
        run["data"]["validation_fraction"] = 0.1
        prepare = plan(run, "exec-1", SETTINGS, s3_client=s3, preparation=PreparationSettings())
        assert prepare["status"] == "Prepare", prepare
        assert "--validation-fraction" in prepare["preparation"]["entrypoint"]


# ---- the deadline ------------------------------------------------------------------------------------------------


TOKENS_RUN = {"version": 1, "name": "deadline", "model": {"init": "random", "config": {
    "model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4}},
    "data": {"source": f"s3://{BUCKET}/datasets/d1/", "tokens": 1_000_000, "seq_len": 128},
    "compute": {"instance_type": "ml.g5.xlarge"}, "budget": {"max_usd": 20}}


def test_a_deadline_shorter_than_the_run_on_demand_is_refused_with_the_numbers(tmp_path, capsys, monkeypatch, s3):
    run = copy.deepcopy(TOKENS_RUN)
    run["compute"]["deadline_hours"] = 0.01
    code, doc = _estimate(tmp_path, capsys, run)
    assert (code, doc["field"]) == (2, "compute.deadline_hours"), doc
    hours = float(doc["message"].split("the run takes ")[1].split(" h")[0])
    assert hours > 0.01  # the numbers: the run's on-demand hours, above the deadline
    assert "compute.accept_missed_deadline=true" in doc["message"]
    out = _lambda(monkeypatch, run)
    assert (out["status"], out["field"]) == ("InvalidRun", "compute.deadline_hours"), out
    assert f"the run takes {hours:,.2f} h" in out["message"]


def test_an_accepted_missed_deadline_starts_with_a_loud_warning(tmp_path, capsys, s3):
    run = copy.deepcopy(TOKENS_RUN)
    run["compute"].update(deadline_hours=0.01, accept_missed_deadline=True)
    code, doc = _estimate(tmp_path, capsys, run)
    assert code == 0, doc
    assert any(w.startswith("THE DEADLINE WILL BE MISSED: compute.deadline_hours=0.01") for w in doc["warnings"])
    planned = plan(run, "exec-1", SETTINGS, s3_client=s3)
    assert planned["status"] == "ok"
    assert any("WILL BE MISSED" in w for w in planned["estimate"]["warnings"])
    run["compute"]["deadline_hours"] = 48  # a deadline the run meets: no word about it
    code, doc = _estimate(tmp_path, capsys, run)
    assert code == 0 and not any("DEADLINE" in w for w in doc["warnings"])


# ---- the data --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_prepare_refuses_an_empty_dataset(tmp_path, capsys, assets, content):
    (tmp_path / "empty.txt").write_text(content)
    code = main(["prepare", str(tmp_path / "empty.txt"), "--tokenizer", str(assets["tokenizer"]),
                 "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.endswith("no documents (0 documents, 0 tokens): the files are empty or hold only blank "
                                      "lines; a dataset needs text to train on"), err
    assert not (tmp_path / "out").exists()


def test_a_text_file_of_one_sentence_per_line_says_why_it_is_one_document(tmp_path, capsys, assets):
    (tmp_path / "lines.txt").write_text("".join(f"sentence number {i} of the corpus.\n" for i in range(50)))
    code = main(["prepare", str(tmp_path / "lines.txt"), "--tokenizer", str(assets["tokenizer"]), "--out",
                 str(tmp_path / "out"), "--validation-fraction", "0.1"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "in the validation set" in err and "of 1 documents" in err
    assert f"{tmp_path / 'lines.txt'} has none, so each is one document" in err
    assert "put a blank line between documents" in err


def test_shards_of_another_tokenizer_are_refused_by_cli_and_lambda(tmp_path, capsys, monkeypatch, assets, datasets,
                                                                  s3):
    code, doc = _estimate(tmp_path, capsys, _run(str(assets["model"]), str(datasets["other"])))
    assert (code, doc["field"]) == (2, "data.source"), doc
    assert "shards made with model.source's tokenizer" in doc["message"] and "--tokenizer" in doc["message"]
    out = _lambda(monkeypatch, _s3_run("other"))
    assert (out["status"], out["field"]) == ("InvalidRun", "data.source"), out
    assert "shards made with model.source's tokenizer" in out["message"]
    same = plan(_s3_run("no-split"), "exec-1", SETTINGS, s3_client=s3)  # the model's own tokenizer: planned
    assert same["status"] == "ok", same


def test_token_ids_beyond_the_models_vocabulary_are_refused(tmp_path, capsys, datasets):
    small = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
             "num_attention_heads": 2, "vocab_size": 100}  # the shards' tokenizer has 257 tokens
    run = {**_run("unused", str(datasets["no-split"])), "model": {"init": "random", "config": small}}
    code, doc = _estimate(tmp_path, capsys, run)
    assert (code, doc["field"]) == (2, "data.source"), doc
    assert "a tokenizer of 257 tokens and the model's vocab_size is 100" in doc["message"]


# ---- spotrun local: refused before the job directory exists -------------------------------------------------------


def _local(tmp_path, capsys, run: dict, *argv: str) -> str:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    code = main(["local", str(path), "--out", str(tmp_path / "out"), "--job-name", "j", "--progress", "none", *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert not (tmp_path / "out" / "j").exists()  # no job directory left behind
    return err


def test_an_interruption_beyond_the_runs_steps_is_refused_before_it_starts(tmp_path, capsys, assets, datasets):
    err = _local(tmp_path, capsys, _run(str(assets["model"]), str(datasets["split"])), "--interrupt-at", "999")
    assert err.startswith("error: InvalidRun: --interrupt-at=999 is invalid: expected a step from 1 to "), err
    steps = int(err.split("the run has ")[1].split(" steps")[0])
    assert 1 < steps < 999
    # One step before the end is accepted up to the start (refused here by a later check: the typo below).
    err = _local(tmp_path, capsys, _run(str(assets["model"]), str(datasets["split"])), "--interrupt-at",
                 str(steps - 1), "--set", "checkpoint.intervl_steps=3")
    assert "--interrupt-at" not in err


def test_an_interruption_at_a_time_past_the_plan_is_refused_before_it_starts(tmp_path, capsys, assets, datasets):
    err = _local(tmp_path, capsys, _run(str(assets["model"]), str(datasets["split"])), "--interrupt-at", "99999s")
    assert err.startswith('error: InvalidRun: --interrupt-at="99999s" is invalid: expected seconds after the start '
                          "below "), err
    max_runtime = int(err.split("below ")[1].split("s,")[0])
    assert 0 < max_runtime < 99999 and "the plan's MaxRuntime" in err
    err = _local(tmp_path, capsys, _run(str(assets["model"]), str(datasets["split"])), "--interrupt-at",
                 f"{max_runtime - 1}s", "--set", "checkpoint.intervl_steps=3")  # within it: refused only by the typo
    assert "--interrupt-at" not in err and "intervl_steps" in err


@pytest.mark.parametrize("argv, value", [
    (["local", "run.json", "--interrupt-at", "-5s"], "-5s"),  # argparse reads '-5s' as a flag
    (["local", "run.json", "--interrupt-at", "0"], "0"),
    (["local", "run.json", "--interrupt-at=-5s"], "-5s"),
    (["demo", "--interrupt-at", "-2s"], "-2s"),
])
def test_a_bad_interrupt_at_is_one_line_naming_the_flag_the_value_and_what_it_takes(capsys, argv, value):
    with pytest.raises(SystemExit) as done:
        main(argv)
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.count("\n") == 1, err  # one line: no usage block
    assert err.startswith(f"error: InvalidArguments: --interrupt-at={value} is invalid: expected a step "), err
    assert "(e.g. 30s)" in err and "argument --interrupt-at" not in err


def test_a_trace_speedup_without_a_trace_is_refused_not_ignored(tmp_path, capsys, assets, datasets):
    err = _local(tmp_path, capsys, _run(str(assets["model"]), str(datasets["split"])), "--trace-speedup", "60")
    assert err == ("error: InvalidArguments: --trace-speedup=60 is invalid: expected only with --trace FILE (it "
                   "scales the trace's time)")


def test_other_argument_errors_are_one_line_too(capsys):
    for argv, says in ((["local", "run.json", "--out", "-x"], "--out=-x is invalid: a value starting with '-' is "
                        "read as a flag; write --out=-x"),
                       (["local", "run.json", "--nproc", "two"], "--nproc=two is invalid: expected a whole number"),
                       (["estmate", "run.json"], "invalid choice: 'estmate'"),
                       (["local", "run.json", "--interrupt-at"], "--interrupt-at needs a value (STEP|SECONDSs)")):
        with pytest.raises(SystemExit) as done:
            main(argv)
        err = capsys.readouterr().err
        assert done.value.code == 2 and err.count("\n") == 1 and says in err, err


def test_a_set_typo_is_refused_without_leaving_a_job_directory(tmp_path, capsys, assets, datasets):
    err = _local(tmp_path, capsys, _run(str(assets["model"]), str(datasets["split"])), "--set",
                 "checkpoint.intervl_steps=3")
    assert err.startswith("error: InvalidConfiguration: invalid configuration:") and "intervl_steps" in err, err
    assert "no job directory was made" in err


def test_a_bad_set_value_is_quoted_as_the_user_wrote_it(tmp_path, capsys, assets, datasets):
    """`spotrun local --set training.lr=fast` said `training.lr='fast'` (Python's repr), `model.config=[1]` said
    `model.config='[1]'`, and `checkpoint.interval_s=-1` said `-1.0`: the values in JSON's spelling, as the rest of
    the CLI quotes them (issue #30): a string quoted (`"fast"`, `""`), what reads as JSON as written."""
    for setting, says in (("training.lr=fast", "training.lr=\"fast\" is invalid: expected a number"),
                          ("model.config=[1]", "model.config=[1] is invalid: expected a JSON object"),
                          ("checkpoint.interval_s=-1", "checkpoint.interval_s=-1 is invalid"),
                          ("training.method=", 'training.method="" is invalid')):
        err = _local(tmp_path, capsys, _run(str(assets["model"]), str(datasets["split"])), "--set", setting)
        assert err.startswith("error: InvalidConfiguration: invalid configuration:") and says in err, (setting, err)


# ---- exports that load anywhere ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_registered_lora_adapter_and_merged_model_load_elsewhere_once_the_job_is_gone(tmp_path, assets, datasets):
    import torch
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoModelForCausalLM

    from spotrun.local.pipeline import LocalOptions, run_local

    path = tmp_path / "run.json"
    path.write_text(json.dumps(_run(str(assets["model"]), str(datasets["no-split"]),
                                    training={"method": "lora", "lora": {"rank": 4}},
                                    export={"merge_lora": True})))  # the run field, as on AWS (not --set)
    report = run_local(path, LocalOptions(out=tmp_path / "out", job_name="lora", progress="none", overrides={
        "max_steps": "4"}), emit=lambda line: None)
    scratch = tmp_path / "out" / "lora" / "sm" / "tmp"  # each launch's TMPDIR (torchrun keeps its logs there)
    assert scratch.is_dir() and not list(scratch.glob("spotrun-*"))  # the launcher removed its own directory
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(report["model_package"], elsewhere)
    shutil.rmtree(tmp_path / "out")  # the job directory (and its input/data/model link) is gone
    adapter = elsewhere / "model"
    base = json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert base == str(assets["model"])  # the run's model.source, as the run file named it (made absolute)
    prompt = torch.tensor([[1, 2, 3]])
    for model in (AutoPeftModelForCausalLM.from_pretrained(adapter),  # the base found from adapter_config.json
                  AutoModelForCausalLM.from_pretrained(adapter / "merged")):
        generated = model.eval().generate(prompt, max_new_tokens=3, do_sample=False)
        assert generated.shape == (1, 6)


def test_the_launcher_removes_its_temporary_directory_however_it_ends(tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    (tmp_path / "sm" / "input" / "config").mkdir(parents=True)  # no resourceconfig.json: a configuration error
    done = subprocess.run([sys.executable, "-m", "spotrun_trainer.launcher", "train", "--sm-root",
                           str(tmp_path / "sm")], env={**os.environ, "TMPDIR": str(scratch)}, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and "resourceconfig.json not found" in done.stderr
    assert list(scratch.iterdir()) == []


# ---- the stage's region ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("configured", [None, "eu-west-1"])
def test_remote_commands_find_the_stage_in_its_own_region(monkeypatch, capsys, tmp_path, configured):
    from stacks.config import ENVIRONMENTS

    for name in ("AWS_DEFAULT_REGION", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    if configured:  # the user's AWS configuration names another region: the stage's wins
        monkeypatch.setenv("AWS_DEFAULT_REGION", configured)
    region = next(env.region for env in ENVIRONMENTS if env.stage == "dev")
    with mock_aws():
        sfn = boto3.client("stepfunctions", region_name=region)
        arn = sfn.create_state_machine(name="pipeline", roleArn="arn:aws:iam::123456789012:role/sfn", definition=
                                       json.dumps({"StartAt": "A", "States": {"A": {"Type": "Pass", "End": True}}})
                                       )["stateMachineArn"]
        sfn.start_execution(stateMachineArn=arn, name="first-hour-20260101-000000", input="{}")
        boto3.client("cloudformation", region_name=region).create_stack(StackName="dev-Spotrun", TemplateBody=
                                                                         json.dumps({"Resources": {"Topic": {
                                                                             "Type": "AWS::SNS::Topic"}},
                                                                             "Outputs": {"StateMachineArn": {
                                                                                 "Value": arn}}}))
        assert main(["list", "--stage", "dev", "--format", "json"]) == 0
        assert [e["execution"] for e in json.loads(capsys.readouterr().out)] == ["first-hour-20260101-000000"]
        assert main(["list", "--stage", "nowhere", "--format", "json"]) != 0  # not in stacks/config.py
        assert "nowhere" in capsys.readouterr().out


# ---- the small breaks --------------------------------------------------------------------------------------------


def test_estimate_and_simulate_work_on_a_demo_style_run_file_with_raw_text(tmp_path, capsys, assets):
    demo = tmp_path / "demo-output"  # as `spotrun demo` leaves it: run.json beside assets/ with relative sources
    (demo / "assets").mkdir(parents=True)
    (demo / "assets" / "corpus").symlink_to(assets["corpus"].parent, target_is_directory=True)
    (demo / "assets" / "model").symlink_to(assets["model"], target_is_directory=True)
    run = _run("assets/model", "assets/corpus", registry=GATE)
    run["data"]["validation_fraction"] = 0.1
    (demo / "run.json").write_text(json.dumps(run))
    assert main(["estimate", "--format", "json", str(demo / "run.json")]) == 0
    doc = json.loads(capsys.readouterr().out)
    note = next(line for line in doc["checked"] if line.startswith("raw data.source"))
    assert note.startswith(f"raw data.source prepared as shards in {demo / 'prepared'}")
    assert doc["evaluation_seconds"] > 0  # the split prepared, evaluated on
    assert main(["estimate", "--format", "json", str(demo / "run.json")]) == 0  # the shards are reused
    assert any(line.startswith("raw data.source reused") for line in json.loads(capsys.readouterr().out)["checked"])
    assert main(["simulate", str(demo / "run.json"), "--n", "20", "--no-optimum", "--format", "json",
                 "--out", str(tmp_path / "sim")]) == 0
    assert json.loads(capsys.readouterr().out)["traces"] == 20


def test_a_cap_of_a_tenth_of_a_cent_is_printed_as_such(tmp_path, capsys):
    run = copy.deepcopy(TOKENS_RUN)
    run["budget"]["max_usd"] = 0.001
    code, doc = _estimate(tmp_path, capsys, run)
    assert (code, doc["error"]) == (3, "OverBudget"), doc
    assert "budget.max_usd=$0.001" in doc["message"] and "$0.00 " not in doc["message"]


def test_a_cap_of_1e_300_is_refused_in_one_short_line(tmp_path, capsys):
    """`budget.max_usd: 1e-300` was refused OverBudget quoting '$0.000...' with 300 zeros."""
    run = copy.deepcopy(TOKENS_RUN)
    run["budget"]["max_usd"] = 1e-300
    code, doc = _estimate(tmp_path, capsys, run)
    assert (code, doc["error"]) == (3, "OverBudget"), doc
    # the cap as written, no run of zeros; the rest of the line names the caps that would hold (smallest, to set)
    # and the held-out margin of their odds, one line
    assert "budget.max_usd=$1e-300" in doc["message"] and "0" * 8 not in doc["message"], doc["message"]
    assert "\n" not in doc["message"] and len(doc["message"]) < 700, doc["message"]


def test_the_plot_marks_the_step_the_signal_was_sent_the_step_saved_and_the_best_checkpoint():
    from spotrun.local.report_files import loss_figure

    losses = [(s, 3.0 - s / 40) for s in range(1, 41)]
    event = {"kind": "sigterm", "signalled_at_step": 30, "step": 32, "checkpoint_step": 32}
    evaluation = {"weights": "best", "exported_step": 16, "best_step": 16, "best_val_loss": 2.5}
    fig = loss_figure(losses, [event], "demo", val={0: 3.1, 16: 2.5, 32: 2.6}, evaluation=evaluation)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "sigterm sent at step 30, saved step 32" in labels
    assert "best checkpoint: step 16, validation loss 2.5000 (exported)" in labels
    signal_line = next(line for line in ax.get_lines() if line.get_label().startswith("sigterm"))
    assert list(signal_line.get_xdata()) == [30, 30]


def test_after_a_resume_the_eta_counts_only_the_steps_of_this_attempt(tmp_path, monkeypatch):
    from spotrun.local import progress as progress_module
    from spotrun.local.progress import Progress

    clock = {"now": 0.0}
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: clock["now"])
    log = tmp_path / "launcher.log"
    log.write_text("run_start params=1 start_step=25 total_steps=80 device=cpu\n")
    progress = Progress(log, mode="none")
    progress.start_attempt()  # `--resume` from the checkpoint at step 25
    progress.update(25, interruptions=0, measured=False)  # the start-up: no trainer line yet
    for t, step in ((100.0, 26), (101.0, 27), (102.0, 28)):  # 100 s of start-up, then 1 s per step
        clock["now"] = t
        progress.update(step, interruptions=0)
    assert progress.eta_s() == pytest.approx(52.0)  # 52 steps left at 1 s each, not (102 s / 3 steps) x 52
    clock["now"] = 500.0  # an interruption: the next attempt starts again from its checkpoint
    progress.start_attempt()
    progress.update(28, interruptions=1, measured=False)
    assert progress.eta_s() is None  # no rate of this attempt yet: "ETA -" rather than a guess
