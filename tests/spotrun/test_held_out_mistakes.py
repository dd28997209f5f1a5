"""A new user's held-out mistakes (issue #30's acceptance: "a held-out list of user mistakes gets clear errors and
wastes nothing"): each is one line naming the flag or field, a non-zero exit, and nothing trained, prepared or
left behind.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from spotrun.cli.main import main


def _run(model_source: str, data_source: str) -> dict:
    return {"version": 1, "name": "held-out", "model": {"source": model_source},
            "data": {"source": data_source, "seq_len": 64}, "compute": {"instance_type": "ml.g5.xlarge"},
            "budget": {"max_usd": 5}}


def _refused(tmp_path: Path, capsys, *argv: str, out: Path | None = None) -> str:
    """`spotrun local` with these arguments: exit 2, one line on stderr, no job directory anywhere under tmp_path."""
    before = {p for p in tmp_path.rglob("*")}
    code = main(["local", *argv, "--out", str(out or tmp_path / "out"), "--progress", "none"])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.count("\n") == 0 and "Traceback" not in err, err
    assert {p for p in tmp_path.rglob("*")} == before  # nothing prepared, trained or left
    return err


@pytest.fixture
def run_file(tmp_path, assets) -> Path:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(_run(str(assets["model"]), str(assets["data"]))))
    return path


@pytest.mark.parametrize("name", ["../escape", "a/b", "/tmp/elsewhere", ".", "..", ""])
def test_a_job_name_that_is_not_one_directory_name_is_refused(tmp_path, capsys, run_file, name):
    # it was taken as a path: `--job-name ../escape` trained into a directory beside --out, `a/b` nested one
    err = _refused(tmp_path, capsys, str(run_file), "--job-name", name)
    assert err.startswith(f"error: InvalidArguments: --job-name={json.dumps(name)} is invalid: expected one "
                          "directory name under --out"), err


def test_an_out_that_is_a_file_is_refused_in_one_line(tmp_path, capsys, run_file):
    # it was a NotADirectoryError traceback from preparing the data under it
    afile = tmp_path / "afile"
    afile.write_text("x")
    err = _refused(tmp_path, capsys, str(run_file), out=afile)
    assert err == f"error: InvalidArguments: --out={json.dumps(str(afile))} is invalid: expected a directory (or a " \
                  "path to create one at): it is a file", err


def test_the_demo_refuses_an_out_that_is_a_file(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    code = main(["demo", "--out", str(afile), "--progress", "none"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith(f"error: InvalidArguments: --out={json.dumps(str(afile))} is invalid"), err
    assert afile.read_text() == "x"


def test_hard_kill_without_an_interruption_is_refused_not_ignored(tmp_path, capsys, run_file):
    # it trained the whole run with the flag doing nothing
    err = _refused(tmp_path, capsys, str(run_file), "--hard-kill")
    assert err.startswith("error: InvalidArguments: --hard-kill is invalid: expected with --interrupt-at or "
                          "--trace"), err


def _model_copy(tmp_path: Path, assets) -> Path:
    model = tmp_path / "model"
    shutil.copytree(assets["model"], model)
    return model


def test_truncated_weights_are_refused_before_the_job(tmp_path, capsys, assets):
    # they trained until the job's from_pretrained failed (exit 1, a job directory left, its start paid for)
    model = _model_copy(tmp_path, assets)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    path = tmp_path / "run.json"
    path.write_text(json.dumps(_run(str(model), str(assets["data"]))))
    err = _refused(tmp_path, capsys, str(path))
    assert err.startswith('error: InvalidRun: model.source="') and "is invalid: expected a model directory with " \
        f"whole safetensors weights ({model / 'model.safetensors'}: " in err and "the file is truncated" in err, err


def test_a_model_directory_without_weights_is_refused_before_the_job(tmp_path, capsys, assets):
    model = _model_copy(tmp_path, assets)
    (model / "model.safetensors").unlink()
    path = tmp_path / "run.json"
    path.write_text(json.dumps(_run(str(model), str(assets["data"]))))
    err = _refused(tmp_path, capsys, str(path))
    assert err.startswith('error: InvalidRun: model.source="') and "is invalid: expected a model directory with " \
        f"whole safetensors weights ({model}: no model.safetensors" in err, err


@pytest.mark.parametrize("flag", ["--traces", "--interruptions"])
def test_simulate_refuses_unusable_traces_before_it_prepares_the_raw_text(tmp_path, capsys, assets, flag):
    # an empty --traces folder was found after the raw text had been tokenized into prepared/ beside the run file
    raw = tmp_path / "raw"
    raw.mkdir()
    shutil.copy(assets["corpus"], raw)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(_run(str(assets["model"]), str(raw))))
    (tmp_path / "empty").mkdir()
    before = {p for p in tmp_path.rglob("*")}
    code = main(["simulate", str(path), flag, str(tmp_path / "empty")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0, err
    assert err.startswith(f"error: InvalidArguments: {flag}={tmp_path / 'empty'} is invalid: expected a "), err
    assert {p for p in tmp_path.rglob("*")} == before  # nothing prepared


@pytest.mark.parametrize("given, shown", [(("10", "10"), "10"), (("30s", "5", "30.0s"), "30s")])
def test_the_same_interruption_twice_is_refused(tmp_path, capsys, run_file, given, shown):
    # the repeat fired as soon as the resumed job started: a second stop and restart for one typo
    argv = [a for g in given for a in ("--interrupt-at", g)]
    err = _refused(tmp_path, capsys, str(run_file), *argv)
    assert err.startswith(f"error: InvalidArguments: --interrupt-at={shown} is invalid: expected each step or time "
                          "once (given 2 times"), err


def _estimate_json(tmp_path: Path, capsys, run: dict) -> tuple[int, dict]:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    code = main(["estimate", "--format", "json", str(path)])
    return code, json.loads(capsys.readouterr().out)


def test_a_lora_run_asks_for_its_merged_model_in_the_run_file(tmp_path, capsys, assets):
    # `spotrun deploy --merged` serves merged/, written "when the run set export.merge_lora": no run could set it
    # (the contract refused the field; only `spotrun local --set` reached the trainer's setting)
    lora = {**_run(str(assets["model"]), str(assets["data"])), "training": {"method": "lora", "lora": {"rank": 4}},
            "export": {"merge_lora": True}}
    code, doc = _estimate_json(tmp_path, capsys, lora)
    assert code == 0, doc
    assert doc["hyperparameters"]["export.merge_lora"] == "true"  # what the training job is sent
    code, doc = _estimate_json(tmp_path, capsys, {**lora, "data": {**lora["data"], "source": str(assets["corpus"])}})
    assert code == 0 and doc["hyperparameters"]["export.merge_lora"] == "true", doc  # without a validation split too
    code, doc = _estimate_json(tmp_path, capsys, {**lora, "training": {"method": "full"}})
    assert code == 2 and doc["field"] == "export.merge_lora", doc
    assert doc["message"] == "export.merge_lora=true is invalid: expected false unless training.method is lora (a " \
                             "full run exports a standalone model already)", doc


def test_a_raw_text_file_is_planned_and_validated_as_local_trains_it(tmp_path, capsys, assets):
    # `spotrun local` trains on one .jsonl file; `estimate` refused it ("expected a directory holding index.json")
    # and `validate` left its split unchecked ("not a directory here")
    run = {**_run(str(assets["model"]), str(assets["corpus"])), "registry": {"gate": {"min_improvement": 0.01}}}
    code, doc = _estimate_json(tmp_path, capsys, run)
    assert code == 2 and doc["field"] == "registry.gate" and "data.validation_fraction" in doc["message"], doc
    path = tmp_path / "run.json"
    assert main(["validate", "--format", "json", str(path)]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["field"] == "registry.gate" and "data.validation_fraction" in doc["message"], doc
    run["data"]["validation_fraction"] = 0.1
    code, doc = _estimate_json(tmp_path, capsys, run)
    assert code == 0, doc
    assert any(n.startswith("raw data.source prepared as shards in ") for n in doc["checked"]), doc["checked"]


def test_start_refuses_local_sources_before_asking_for_credentials(tmp_path, capsys, monkeypatch, run_file):
    # without credentials it said to configure them; with them, that the sources must be in the stage's bucket
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    code = main(["start", str(run_file), "--stage", "dev"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0, err
    assert err.startswith('error: InvalidRun: model.source="') and "is invalid: expected an s3:// URI under the " \
        "stage's bucket for `spotrun start`" in err, err


@pytest.mark.parametrize("gate", [False, True])
def test_swapped_sources_are_named_as_model_source_by_estimate_as_by_validate(tmp_path, capsys, assets, gate):
    # model.source = the prepared data, data.source = the model directory: `validate` and `local` named
    # model.source, `estimate` blamed registry.gate ("no validation data") or data.source ("no .txt ... files")
    run = _run(str(assets["data"]), str(assets["model"]))
    if gate:
        run["registry"] = {"gate": {"min_improvement": 0.01}}
    code, doc = _estimate_json(tmp_path, capsys, run)
    assert code == 2 and doc["field"] == "model.source", doc
    assert "a Hugging Face model directory with config.json" in doc["message"] and "index.json" in doc["message"]
    assert not (tmp_path / "prepared").exists()  # the model directory was not tokenized as raw text
    assert main(["validate", "--format", "json", str(tmp_path / "run.json")]) == 2
    assert json.loads(capsys.readouterr().out)["field"] == "model.source"


def test_an_accepted_missed_deadline_is_said_on_the_first_line(tmp_path, capsys, assets):
    # docs/checks-before-paying.md: "the run is planned and its estimate warns first"; the text said "== RUN: ok"
    # and the warning came 18 lines further down, after the plan
    run = {**_run(str(assets["model"]), str(assets["data"])),
           "compute": {"instance_type": "ml.g5.xlarge", "deadline_hours": 0.01, "accept_missed_deadline": True}}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    assert main(["estimate", str(path)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == (f"== {path}: ok, but THE DEADLINE WILL BE MISSED (accepted by compute.accept_missed_deadline; "
                     "the warning below says by how much)"), first
    run["compute"]["deadline_hours"] = 48
    path.write_text(json.dumps(run))
    assert main(["estimate", str(path)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"== {path}: ok"
