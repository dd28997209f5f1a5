"""`spotrun prepare` and `spotrun upload-model`: here and into the stage's bucket (moto S3, the stack's real output
key in moto's CloudFormation); content-addressed, nothing half-written left looking complete, bad input named."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys

import boto3
import pytest
from moto import mock_aws

from spotrun.cli.datasets import prepare_dataset, upload_dataset
from spotrun.cli.main import main
from spotrun.seams import PREPARE_MARKER, StackOutput, stack_name

BUCKET, REGION = "spotrun-dev-artifacts", "us-east-1"


@pytest.fixture
def stage(monkeypatch):
    with mock_aws():
        monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
        boto3.client("s3", region_name=REGION).create_bucket(Bucket=BUCKET)
        outputs = {StackOutput.ARTIFACT_BUCKET.value: {"Value": BUCKET},
                   StackOutput.STATE_MACHINE_ARN.value: {"Value": "arn:aws:states:us-east-1:123456789012:"
                                                         "stateMachine:spotrun-dev"}}
        boto3.client("cloudformation", region_name=REGION).create_stack(
            StackName=stack_name("dev"), TemplateBody=json.dumps(
                {"Resources": {"Topic": {"Type": "AWS::SNS::Topic"}}, "Outputs": outputs}))
        yield boto3.client("s3", region_name=REGION)


@pytest.fixture
def chat_jsonl_gz(tmp_path):
    rows = [{"messages": [{"role": "user", "content": f"what does node {i} do?"},
                          {"role": "assistant", "content": "the node saves the weights."}]} for i in range(30)]
    rows += [{"text": "the spot instance resumes every step."}] * 10
    path = tmp_path / "raw" / "chat.jsonl.gz"
    path.parent.mkdir()
    with gzip.open(path, "wt") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    return path


@pytest.fixture
def chat_tokenizer(assets, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(assets["tokenizer"])
    tok.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    tok.save_pretrained(tmp_path / "tok")
    return tmp_path / "tok"


def _keys(s3, prefix: str) -> list[str]:
    return [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])]


def test_prepare_here_is_content_addressed_and_reports_the_data_source(capsys, tmp_path, chat_jsonl_gz,
                                                                       chat_tokenizer):
    out = tmp_path / "data"
    assert main(["prepare", str(chat_jsonl_gz), "--tokenizer", str(chat_tokenizer), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    index = json.loads((out / "index.json").read_text())
    assert index["loss_mask"] and index["total_tokens"] > 0 and (out / PREPARE_MARKER).is_file()
    assert f'data.source: "{out}"' in printed and "tokens/s" in printed  # throughput shown
    stamp = (out / "index.json").stat().st_mtime_ns
    copy = tmp_path / "elsewhere" / "chat.jsonl.gz"  # the same bytes under another path: the same dataset
    copy.parent.mkdir()
    shutil.copyfile(chat_jsonl_gz, copy)
    assert main(["prepare", str(copy), "--tokenizer", str(chat_tokenizer), "--out", str(out)]) == 0
    assert "already prepared (same inputs and tokenizer)" in capsys.readouterr().out
    assert (out / "index.json").stat().st_mtime_ns == stamp
    (chat_tokenizer / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    assert main(["prepare", str(copy), "--tokenizer", str(chat_tokenizer), "--out", str(out)]) == 2
    assert "already holds other files" in capsys.readouterr().err


def test_invalid_input_is_named_by_file_and_line_and_leaves_nothing_that_looks_complete(capsys, tmp_path, assets):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "a.jsonl").write_text('{"text": "fine"}\n{"text": "also fine"}\n{"text": broken}\n')
    out = tmp_path / "data"
    assert main(["prepare", str(raw), "--tokenizer", str(assets["tokenizer"]), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    # named as every error is (the line began `error: <file>`); the column, what is needed there (not the decoder's
    # "Expecting value"), and the line with a caret under the column
    value = 'a value (a "string", a number, an object {...}, an array [...], true, false or null)'
    assert err == (f"error: InvalidInput: {raw / 'a.jsonl'}:3: not valid JSON (at column 10: expected {value}: a word "
                   'other than true, false or null is a string, in double quotes)\n    {"text": broken}\n'
                   "             ^")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw"]  # no output, no staging directory left
    assert main(["prepare", str(raw), "--tokenizer", str(assets["tokenizer"])]) == 2
    assert "--out DIR (here) or --stage STAGE --name NAME" in capsys.readouterr().err


def test_prepare_to_the_stage_uploads_once_and_refuses_to_mix(capsys, tmp_path, stage, chat_jsonl_gz, chat_tokenizer,
                                                               monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["prepare", str(chat_jsonl_gz), "--tokenizer", str(chat_tokenizer), "--stage", "dev", "--name", "chat"]
    assert main(argv) == 0
    uri = f"s3://{BUCKET}/datasets/chat/"
    assert f'data.source: "{uri}"' in capsys.readouterr().out
    keys = _keys(stage, "datasets/chat/")
    assert {"datasets/chat/index.json", f"datasets/chat/{PREPARE_MARKER}", "datasets/chat/shard-00000.bin"} <= set(keys)
    assert main(argv) == 0
    assert "not prepared or uploaded again" in capsys.readouterr().out
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"text": "a different corpus entirely."}) + "\n")
    assert main(["prepare", str(other), "--tokenizer", str(chat_tokenizer), "--stage", "dev", "--name", "chat"]) == 2
    assert "already holds another dataset" in capsys.readouterr().err
    assert main([*argv[:-1], "Bad Name"]) == 2
    assert "--name='Bad Name' is invalid" in capsys.readouterr().err


def test_the_index_and_the_marker_are_uploaded_last(tmp_path, stage, chat_jsonl_gz, chat_tokenizer):
    prepared = prepare_dataset([chat_jsonl_gz], chat_tokenizer, tmp_path / "d", shard_bytes=1024,
                               emit=lambda _: None)
    order: list[str] = []

    class Recording:  # the real moto client underneath: boto3 validates every request against botocore's model
        def upload_file(self, filename, bucket, key):
            order.append(key)
            return stage.upload_file(filename, bucket, key)

        def __getattr__(self, name):
            return getattr(stage, name)

    assert upload_dataset(Recording(), prepared, BUCKET, "x", emit=lambda _: None)["uploaded"]
    assert len(order) > 3 and order[-2:] == ["datasets/x/index.json", f"datasets/x/{PREPARE_MARKER}"]
    assert sorted(order) == sorted(_keys(stage, "datasets/x/"))


def test_upload_model_checks_the_directory_then_prints_the_model_source(capsys, tmp_path, stage, assets):
    model = tmp_path / "Base-Model"
    shutil.copytree(assets["model"], model)
    assert main(["upload-model", str(model), "--stage", "dev"]) == 0
    out = capsys.readouterr().out
    assert f'model.source: "s3://{BUCKET}/models/base-model/"' in out and "llama" in out
    keys = _keys(stage, "models/base-model/")
    assert {"models/base-model/config.json", "models/base-model/model.safetensors",
            "models/base-model/tokenizer.json"} <= set(keys)
    assert main(["upload-model", str(model), "--stage", "dev"]) == 2  # the name holds a model already
    assert "already holds a model" in capsys.readouterr().err


def test_upload_model_uploads_the_top_level_files_the_trainer_loads_not_subfolders(capsys, tmp_path, stage, assets):
    """`hf download org/name --local-dir DIR` leaves .cache/huggingface/ in DIR, and many hub repositories carry
    other formats in subfolders (original/consolidated.00.pth: as large as the model): not uploaded."""
    model = tmp_path / "downloaded"
    shutil.copytree(assets["model"], model)
    (model / ".cache" / "huggingface" / "download").mkdir(parents=True)
    (model / ".cache" / "huggingface" / "download" / "config.json.metadata").write_text("abc\n")
    (model / "original").mkdir()
    (model / "original" / "consolidated.00.pth").write_bytes(b"\0" * 4096)
    assert main(["upload-model", str(model), "--stage", "dev", "--name", "dl"]) == 0
    out = capsys.readouterr().out
    keys = _keys(stage, "models/dl/")
    assert sorted(keys) == sorted(f"models/dl/{p.name}" for p in assets["model"].iterdir() if p.is_file())
    assert "left out (subfolders the trainer does not load): .cache/, original/" in out, out


@pytest.mark.parametrize("damage, message", [
    ("truncate", "the file is truncated"),
    ("index", "missing: model-00002-of-00002.safetensors"),
    ("tokenizer", "no tokenizer"),
    ("config", "no config.json"),
])
def test_upload_model_refuses_an_incomplete_directory_and_uploads_nothing(capsys, tmp_path, stage, assets, damage,
                                                                          message):
    model = tmp_path / "m"
    shutil.copytree(assets["model"], model)
    weights = model / "model.safetensors"
    if damage == "truncate":
        weights.write_bytes(weights.read_bytes()[:-100])
    elif damage == "index":
        (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
            "lm_head.weight": "model.safetensors", "model.norm.weight": "model-00002-of-00002.safetensors"}}))
    elif damage == "tokenizer":
        for p in model.glob("tokenizer*"):
            p.unlink()
    else:
        (model / "config.json").unlink()
    assert main(["upload-model", str(model), "--stage", "dev", "--name", "m"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and err.startswith("error: InvalidInput: ")
    assert _keys(stage, "models/") == []


def test_the_cli_itself_imports_no_torch():
    code = ("import sys; from spotrun.cli.main import build_parser; build_parser(); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_prepared_chat_is_what_the_trainers_loader_reads_with_the_prompt_masked(tmp_path, chat_jsonl_gz,
                                                                               chat_tokenizer):
    from spotrun_trainer.data import TokenShardLoader

    out = tmp_path / "data"
    assert main(["prepare", str(chat_jsonl_gz), "--tokenizer", str(chat_tokenizer), "--out", str(out)]) == 0
    loader = TokenShardLoader(out, seq_len=32, micro_batch=2, dp_rank=0, dp_size=1, seed=0)
    batch = loader.next_inputs()
    masked = batch["labels"] == -100
    assert masked.any() and not masked.all()  # prompts masked, answers trained on
    assert (batch["labels"][~masked] == batch["input_ids"][~masked]).all()


def test_a_sharded_model_is_checked_through_its_index_and_counts_the_same_parameters(tmp_path, assets):
    from transformers import AutoModelForCausalLM

    from spotrun.cli.models import check_model_dir

    whole = check_model_dir(assets["model"])
    model = AutoModelForCausalLM.from_pretrained(assets["model"])  # untied embeddings: every tensor is saved
    assert whole.parameters == sum(p.numel() for p in model.parameters())
    sharded = tmp_path / "sharded"
    model.save_pretrained(sharded, max_shard_size="100KB")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(assets["model"] / name, sharded / name)
    checked = check_model_dir(sharded)
    assert len(checked.weight_files) > 1 and (sharded / "model.safetensors.index.json").is_file()
    assert (checked.parameters, checked.tensors) == (whole.parameters, whole.tensors)


def test_estimate_on_raw_text_prepares_a_cache_and_reads_what_prepare_wrote(capsys, tmp_path, assets):
    run = {"version": 1, "name": "est", "model": {"source": str(assets["model"])},
           "data": {"source": str(assets["corpus"].parent), "seq_len": 64},
           "compute": {"instance_type": "ml.g5.xlarge"}, "budget": {"max_usd": 5}}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    # Raw local text is tokenized into a cache beside the run file to be planned (spotrun/cli/estimate.py)
    assert main(["estimate", str(path), "--prepared", str(tmp_path / "cache")]) == 0
    assert (tmp_path / "cache").is_dir() and any((tmp_path / "cache").rglob("index.json"))
    assert main(["prepare", str(assets["corpus"].parent), "--tokenizer", str(assets["model"]), "--out",
                 str(tmp_path / "data")]) == 0
    run["data"]["source"] = str(tmp_path / "data")
    path.write_text(json.dumps(run))
    capsys.readouterr()
    assert main(["estimate", str(path), "--format", "json"]) == 0
    tokens = json.loads((tmp_path / "data" / "index.json").read_text())["total_tokens"]
    assert str(tokens) in capsys.readouterr().out


def test_prepare_splits_validation_by_fraction_as_another_dataset(capsys, tmp_path, chat_jsonl_gz, chat_tokenizer):
    whole, split = tmp_path / "whole", tmp_path / "split"
    assert main(["prepare", str(chat_jsonl_gz), "--tokenizer", str(chat_tokenizer), "--out", str(whole)]) == 0
    assert main(["prepare", str(chat_jsonl_gz), "--tokenizer", str(chat_tokenizer), "--out", str(split),
                 "--validation-fraction", "0.3"]) == 0
    capsys.readouterr()
    train, held = (json.loads((p / "index.json").read_text()) for p in (split, split / "validation"))
    assert held["total_tokens"] > 0 and train["total_tokens"] + held["total_tokens"] == \
        json.loads((whole / "index.json").read_text())["total_tokens"]
    assert read_marker_key(split) != read_marker_key(whole)  # another split is another dataset
    assert main(["prepare", str(chat_jsonl_gz), "--tokenizer", str(chat_tokenizer), "--out", str(tmp_path / "x"),
                 "--validation-fraction", "0.9"]) == 2
    assert "--validation-fraction=0.9 is invalid" in capsys.readouterr().err


def read_marker_key(path):
    return json.loads((path / PREPARE_MARKER).read_text())["key"]


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_prepare_refuses_a_shard_size_naming_the_flag(capsys, tmp_path, chat_jsonl_gz, chat_tokenizer, value):
    """`--shard-mb 0` named the trainer's internal `shard_bytes=0`; `nan` and `inf` were tracebacks."""
    assert main(["prepare", str(chat_jsonl_gz), "--tokenizer", str(chat_tokenizer), "--out", str(tmp_path / "x"),
                 f"--shard-mb={value}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: InvalidArguments: --shard-mb={value} is invalid: expected a shard size in MB of at "
                          "least 0.001024")
    assert "shard_bytes" not in err and "Traceback" not in err
    assert not (tmp_path / "x").exists()
