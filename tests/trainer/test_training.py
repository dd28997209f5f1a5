"""FSDP2 training under torchrun (2 CPU processes, gloo): sharding, falling loss, export."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from spotrun.local.harness import free_port, loss_history

pytestmark = pytest.mark.slow
PROBE = Path(__file__).with_name("sharding_probe.py")


def _torchrun(script: Path, *args: str, nproc: int = 2) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
                           "--master_port", str(free_port()), str(script), *args],
                          env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("model_key", ["model", "model-gpt2", "model-qwen2"])
def test_every_block_is_its_own_fsdp_unit_and_params_are_sharded_across_two_ranks(assets, tmp_path, model_key):
    res = _torchrun(PROBE, str(assets[model_key]), str(tmp_path / "report"))
    assert res.returncode == 0, res.stderr[-4000:]
    reports = [json.loads((tmp_path / f"report.rank{r}.json").read_text()) for r in (0, 1)]
    for rep in reports:
        assert rep["blocks"] == 2 and all(rep["blocks_fsdp"]) and rep["root_fsdp"]
        assert rep["buffers_on_meta"] == []
        assert rep["weights_match"] and rep["buffers_match"]
        for p in rep["params"]:
            assert p["dtensor"], p["name"]
            assert p["placements"] == ["Shard(dim=0)"] and p["mesh_size"] == 2, p
    # Shard(0) over 2 ranks: the two local row counts add up to the global row count.
    for p0, p1 in zip(reports[0]["params"], reports[1]["params"], strict=True):
        assert p0["local_rows"] + p1["local_rows"] == p0["global_rows"], p0["name"]
        assert p0["local_rows"] < p0["global_rows"] or p0["global_rows"] == 1


def test_two_node_layout_replicates_across_nodes_and_shards_within(assets, tmp_path):
    # 4 processes as 2 "nodes" x 2, hybrid sharding with one node per shard group: the 2-D mesh.
    res = _torchrun(PROBE, str(assets["model"]), str(tmp_path / "report"), "hybrid", "2", "1", nproc=4)
    assert res.returncode == 0, res.stderr[-4000:]
    reports = [json.loads((tmp_path / f"report.rank{r}.json").read_text()) for r in range(4)]
    for rep in reports:
        assert all(rep["blocks_fsdp"]) and rep["root_fsdp"] and rep["weights_match"]
        for p in rep["params"]:
            assert p["placements"] == ["Replicate()", "Shard(dim=0)"] and p["mesh_size"] == 4, p
    # Ranks 0 and 2 (same position in different nodes) hold the same shard; 0 and 1 split it.
    for p0, p1, p2 in zip(reports[0]["params"], reports[1]["params"], reports[2]["params"], strict=True):
        assert p0["local_rows"] == p2["local_rows"]
        assert p0["local_rows"] + p1["local_rows"] == p0["global_rows"]


def test_llama_trains_with_falling_loss(baseline):
    losses = loss_history(baseline.output)
    assert sorted(losses) == list(range(1, 25))
    first, last = sum(losses[s] for s in (1, 2, 3)) / 3, sum(losses[s] for s in (22, 23, 24)) / 3
    assert last < first - 0.5, (first, last)
    metrics = json.loads((baseline.output / "metrics.json").read_text())
    assert metrics["steps"] == 24 and metrics["world_size"] == 2
    assert metrics["tokens"] == 24 * 2 * 2 * 64
    assert metrics["tokens_per_s_per_device"] > 0 and metrics["mfu"] is None  # CPU: no known peak, no guess
    assert "run_completed step=24" in baseline.text()


def test_gpt2_shaped_model_trains_with_falling_loss_and_exports_bf16_by_default(job_factory):
    from safetensors.torch import load_file

    from spotrun.planner.params import shape_of
    from spotrun.seams import EXPORT_METADATA

    job = job_factory("gpt2", model_key="model-gpt2", max_steps=16,
                      **{"checkpoint.interval_steps": 0, "export.dtype": ""})  # "": the default
    rc = job.run()
    assert rc == 0, job.text()[-4000:]
    losses = loss_history(job.output)
    assert losses[16] < losses[1] - 0.5
    weights = load_file(job.output / "model.safetensors")
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}
    assert json.loads((job.output / "config.json").read_text())["dtype"] == "bfloat16"
    meta = json.loads((job.output / EXPORT_METADATA).read_text())
    assert meta["kind"] == "full" and meta["needs_base_model"] is False and meta["lora"] is None
    assert meta["weights_dtype"] == "bfloat16" and meta["base_model"]["model_type"] == "gpt2"
    config = json.loads((job.output / "config.json").read_text())
    assert meta["trainable_parameters"] == meta["parameters"] == shape_of(config).total


def test_exported_model_loads_with_from_pretrained_and_matches_sharded_logits(baseline, tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    probe = torch.load(tmp_path_factory.getbasetemp() / "baseline-probe.pt")
    model = AutoModelForCausalLM.from_pretrained(baseline.output)
    with torch.no_grad():
        logits = model(input_ids=probe["input_ids"]).logits
    assert torch.equal(logits, probe["logits"])
    assert (baseline.output / "model.safetensors").exists()
    assert json.loads((baseline.output / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert AutoTokenizer.from_pretrained(baseline.output).eos_token == "<|endoftext|>"


def test_metric_lines_match_the_sagemaker_metric_definitions(baseline):
    import re

    from spotrun.seams import TRAIN_METRIC_DEFINITIONS as METRIC_DEFINITIONS
    from spotrun.seams import parse_metric_line, run_start_total_steps

    lines = [line for line in baseline.text().splitlines() if line.startswith("step=")]
    assert len(lines) == 6  # every 4 steps of 24
    parsed = parse_metric_line(lines[-1])
    assert parsed["step"] == 24
    # The run's length as `spotrun status` and local progress read it from the trainer's own run_start line.
    assert [n for n in map(run_start_total_steps, baseline.text().splitlines()) if n is not None] == [24]
    for definition in METRIC_DEFINITIONS:
        match = re.search(definition["Regex"], lines[-1])
        name = definition["Name"].split(":")[1]
        if name == "mfu":
            assert match is None  # `mfu=na` on CPU must not be published as a number
        else:
            assert match and float(match.group(1)) == pytest.approx(parsed[name], rel=1e-3)


def test_summed_losses_do_not_depend_on_how_many_steps_are_reduced_together(tmp_path):
    """4 ranks (with 2, order cannot matter): a resumed run flushes its pending losses in other groupings than an
    uninterrupted one, so the per-step sum must not depend on the tensor it travels in. gloo's all-reduce does
    (measured: 79 of 172 windows differ in the last bits); the trainer's rank-ordered sum does not."""
    out = tmp_path / "sums.json"
    res = _torchrun(Path(__file__).with_name("loss_sum_probe.py"), str(out), nproc=4)
    assert res.returncode == 0, res.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["ours_differ"] == 0 and report["same_on_every_rank"], report
    assert report["all_reduce_differ"] > 0, report  # the probe does exercise the length dependence
