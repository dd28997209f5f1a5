"""LoRA fine-tunes end to end: PEFT adapters on the FSDP2-sharded model (2 CPU ranks, gloo), adapter-only spot-proof
checkpoints, and exports that PEFT itself loads. One LoRA training run (`lora_baseline`) serves every assertion
that does not need its own interruption."""

from __future__ import annotations

import json
import shutil
import signal

import pytest
import torch
from safetensors.torch import load_file

from spotrun.local.harness import loss_history, wait_for_step
from spotrun.seams import EXPORT_METADATA
from spotrun_trainer.checkpoint import committed_checkpoints
from spotrun_trainer.export import MERGED_DIR

from .conftest import LORA_BASELINE_SOURCE, LORA_HP, assert_same_run

pytestmark = pytest.mark.slow
RANK, ALPHA = LORA_HP["training.lora.rank"], LORA_HP["training.lora.alpha"]


def test_lora_trains_the_adapters_only_with_falling_loss(lora_baseline, assets):
    from spotrun.planner.params import lora_parameters, shape_of

    losses = loss_history(lora_baseline.output)
    assert sorted(losses) == list(range(1, 25))
    first, last = sum(losses[s] for s in (1, 2, 3)) / 3, sum(losses[s] for s in (22, 23, 24)) / 3
    assert last < first - 0.25, (first, last)
    metrics = json.loads((lora_baseline.output / "metrics.json").read_text())
    base_config = json.loads((assets["model"] / "config.json").read_text())
    planned = lora_parameters(shape_of(base_config), RANK, "all-linear")
    assert metrics["trainable_parameters"] == planned
    assert metrics["parameters"] == shape_of(base_config).total + planned
    assert f"trainable={planned} method=lora" in lora_baseline.text()


def test_lora_checkpoint_holds_every_ranks_slice_of_each_adapter_and_no_base_weight(lora_baseline):
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    step, manifest = committed_checkpoints(lora_baseline.ckpt)[0]
    assert step == 24 and manifest["world_size"] == 2
    meta = FileSystemReader(str(lora_baseline.ckpt / "step-00000024")).read_metadata()
    model_keys = [k for k in meta.state_dict_metadata if k.startswith("model.")]
    assert len(model_keys) == 2 * 7 * 2  # 2 blocks x 7 linear layers x (lora_A, lora_B)
    assert all(".lora_A." in k or ".lora_B." in k for k in model_keys), model_keys
    files_by_key: dict[str, set[str]] = {}
    for index, info in meta.storage_data.items():
        files_by_key.setdefault(index.fqn, set()).add(info.relative_path)
    for key in model_keys + [k for k in meta.state_dict_metadata if k.endswith((".exp_avg", ".exp_avg_sq"))]:
        md = meta.state_dict_metadata[key]
        assert isinstance(md, TensorStorageMetadata)
        # Shard(0) over 2 ranks: two chunks, one written by each rank, that together cover every row.
        assert sorted(c.offsets[0] for c in md.chunks) == [0, md.chunks[0].sizes[0]], key
        assert sum(c.sizes[0] for c in md.chunks) == md.size[0], key
        assert files_by_key[key] == {"__0_0.distcp", "__1_0.distcp"}, key
    # Read back in one process (as a 1-rank resume does): the adapters are exactly the exported step-24 ones.
    import torch.distributed.checkpoint as dcp

    exported = load_file(lora_baseline.output / "adapter_model.safetensors")
    prefix = "model."
    restored = {"model": {k[len(prefix):]: torch.empty(tuple(meta.state_dict_metadata[k].size))
                          for k in model_keys}}
    dcp.load(restored, checkpoint_id=str(lora_baseline.ckpt / "step-00000024"))
    assert len(exported) == len(model_keys)
    for key, value in restored["model"].items():
        assert torch.equal(value, exported[key.replace(".default.", ".")]), key


def test_sigterm_during_lora_training_resumes_bitwise(job_factory, lora_baseline):
    job = job_factory("lora-sigterm", **LORA_HP)
    proc = job.start()
    assert wait_for_step(proc, job.output, 10)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0, job.text()[-3000:]
    stopped = [line for line in job.text().splitlines() if line.startswith("run_stopped")]
    stop_step = int(stopped[0].split()[1].split("=")[1])
    assert stop_step < 24 and committed_checkpoints(job.ckpt)[0][0] == stop_step

    assert job.run() == 0, job.text()[-3000:]
    assert f"start_step={stop_step}" in job.text()
    assert_same_run(job, lora_baseline, "lora")


def test_two_rank_lora_checkpoint_resumes_on_one_rank(job_factory, lora_baseline):
    job = job_factory("lora-one-rank", nproc_per_node=1, **{**LORA_HP, "training.micro_batch": 4})  # same global batch
    shutil.copytree(lora_baseline.ckpt, job.ckpt)
    shutil.rmtree(job.ckpt / "step-00000024")

    assert job.run() == 0, job.text()[-3000:]
    text = job.text()
    assert "start_step=20" in text and "world=1" in text and "saved by 2 ranks, resuming on 1" in text
    # The adapters and their optimizer state are resharded by DCP and the run continues the same optimisation.
    # Not bitwise: the per-rank RNG streams are reseeded on a new world size, so adapter dropout draws other
    # masks (measured: 0.2% on the first resumed loss); a lost slice of the adapters would undo most of the
    # 0.4 the loss fell (test_lora_checkpoint_... checks the restored values exactly).
    resumed, reference = loss_history(job.output), loss_history(lora_baseline.output)
    assert resumed[21] == pytest.approx(reference[21], rel=1e-2)
    assert resumed[24] == pytest.approx(reference[24], rel=1e-2)
    assert resumed[24] < loss_history(lora_baseline.output)[1] - 0.25


def test_exported_adapter_loads_with_peft_and_gives_the_sharded_models_logits(lora_baseline, assets,
                                                                              tmp_path_factory):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = lora_baseline.output
    assert not (out / "model.safetensors").exists()  # the adapter, not a copy of the base
    probe = torch.load(tmp_path_factory.getbasetemp() / "lora-probe.pt")
    base = AutoModelForCausalLM.from_pretrained(assets["model"], dtype=torch.float32)
    model = PeftModel.from_pretrained(base, out).eval()
    with torch.no_grad():
        logits = model(input_ids=probe["input_ids"]).logits
    torch.testing.assert_close(logits, probe["logits"], rtol=0, atol=1e-5)
    config = json.loads((out / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["lora_dropout"]) == (
        RANK, ALPHA, LORA_HP["training.lora.dropout"])
    # The base it names is the run's model.source (given explicitly above, as an S3 source needs), never the
    # job's input/data/model link, which is gone with the job.
    assert config["base_model_name_or_path"] == LORA_BASELINE_SOURCE and config["revision"] is None
    meta = json.loads((out / EXPORT_METADATA).read_text())
    assert (meta["base_model"]["source"], meta["base_model"]["revision"]) == (LORA_BASELINE_SOURCE, None)
    assert meta["kind"] == "lora_adapter" and meta["needs_base_model"] is True
    assert meta["base_model"]["path"] == str(lora_baseline.root / "sm" / "input" / "data" / "model")
    assert meta["base_model"]["model_type"] == "llama"
    assert meta["lora"] == {"rank": RANK, "alpha": ALPHA, "dropout": LORA_HP["training.lora.dropout"],
                            "target_modules": "all-linear"}
    assert meta["merged"] == {"path": MERGED_DIR, "dtype": "bfloat16"}


def test_merged_export_equals_base_plus_scaled_adapter_product_in_bf16(lora_baseline, assets):
    base = load_file(assets["model"] / "model.safetensors")
    merged = load_file(lora_baseline.output / MERGED_DIR / "model.safetensors")
    adapter = load_file(lora_baseline.output / "adapter_model.safetensors")
    prefix = "base_model.model."
    targeted = {k[len(prefix):].replace(".lora_A.weight", ".weight") for k in adapter if ".lora_A." in k}
    assert len(targeted) == 14 and targeted <= set(merged)
    assert set(merged) == set(base)
    for key, weight in base.items():
        if key in targeted:
            a = adapter[prefix + key.replace(".weight", ".lora_A.weight")]
            b = adapter[prefix + key.replace(".weight", ".lora_B.weight")]
            expected = (weight + (b @ a) * (ALPHA / RANK)).to(torch.bfloat16)
            assert not torch.equal(expected, weight.to(torch.bfloat16)), key  # the adapter trained
        else:
            expected = weight.to(torch.bfloat16)
        assert merged[key].dtype == torch.bfloat16
        torch.testing.assert_close(merged[key], expected, rtol=0, atol=0, msg=key)


def test_lora_on_a_bf16_base_with_activation_checkpointing_trains_fp32_adapters(job_factory, lora_baseline):
    # The GPU configuration, on CPU: the frozen base stored and computed in bf16, adapters fp32, blocks recomputed.
    job = job_factory("lora-bf16-ac", max_steps=12, **{
        **LORA_HP, "model.param_dtype": "bfloat16", "model.activation_checkpointing": True,
        "export.merge_lora": False, "checkpoint.interval_steps": 6})
    assert job.run() == 0, job.text()[-3000:]
    losses, reference = loss_history(job.output), loss_history(lora_baseline.output)
    assert losses[12] < losses[1] - 0.1
    assert losses[1] == pytest.approx(reference[1], rel=2e-2)  # the same model, at bf16 precision
    adapters = load_file(job.output / "adapter_model.safetensors")
    assert len(adapters) == 28 and {t.dtype for t in adapters.values()} == {torch.float32}
    from torch.distributed.checkpoint import FileSystemReader

    meta = FileSystemReader(str(job.ckpt / "step-00000012")).read_metadata()
    dtypes = {md.properties.dtype for k, md in meta.state_dict_metadata.items() if k.startswith("model.")}
    assert dtypes == {torch.float32}  # adapters only, in fp32: the bf16 base is not in the checkpoint


def test_mfu_counts_the_frozen_base_at_four_flops_per_token_as_the_planner_does():
    from spotrun_trainer.metrics import mfu

    assert mfu(1_000, 10.0, 60_000.0) == pytest.approx(1.0)  # full: 6 * params * tokens
    assert mfu(1_000, 10.0, 60_000.0, trainable=100) == pytest.approx((4 * 900 + 6 * 100) * 10 / 60_000)
    assert mfu(1_000, 10.0, None, trainable=100) is None


def test_target_modules_that_match_nothing_name_the_field():
    from transformers import AutoConfig, AutoModelForCausalLM

    from spotrun.settings.checks import ConfigError
    from spotrun.settings.sections import LoraConfig
    from spotrun_trainer.lora import apply

    config = AutoConfig.for_model("llama", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                  num_attention_heads=2, vocab_size=64)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
        with pytest.raises(ConfigError, match=r"lora.target_modules=\"query,value\" is invalid: .*not found"):
            apply(model, LoraConfig(rank=4, target_modules="query,value"), base_dtype=torch.float32)
        wrapped = apply(model, LoraConfig(rank=4, target_modules="q_proj,v_proj"), base_dtype=torch.bfloat16)
    frozen = {p.dtype for p in wrapped.parameters() if not p.requires_grad}
    trained = {p.dtype for p in wrapped.parameters() if p.requires_grad}
    assert frozen == {torch.bfloat16} and trained == {torch.float32}


@pytest.mark.parametrize("hp, message", [
    ({"training.method": "qlora"}, "training.method=\"qlora\" is invalid: expected full or lora"),
    ({"training.lora.rank": "0"}, "training.lora.rank=0 is invalid: expected an integer in [1, 4096]"),
    ({"training.lora.alpha": "-2"}, "training.lora.alpha=-2 is invalid: expected a positive finite number"),
    ({"training.lora.dropout": "1"}, "training.lora.dropout=1 is invalid: expected a float in [0, 1)"),
    ({"training.lora.target_modules": "q-proj"},
     "training.lora.target_modules=\"q-proj\" is invalid: expected all-linear or"),
    ({"export.dtype": "fp16"}, "export.dtype=\"fp16\" is invalid: expected bfloat16 or float32"),
])
def test_bad_lora_and_export_settings_name_the_field_and_what_is_accepted(hp, message):
    from spotrun.settings.checks import ConfigError
    from spotrun.settings.wire import job_config

    with pytest.raises(ConfigError) as err:
        job_config(hp, **{"data.path": "/d", "model.path": "/m", "output_dir": "/o"})
    assert str(err.value).startswith(message)
