"""The memory and time model (spotrun/planner/memory.py, spotrun/planner/topology.py) and the plans it gives on the
shipped catalog.

The planner page's table of plans is printed by `python -m spotrun.planner.plans` from the same runs as PLAN_RUNS here.
"""

from __future__ import annotations

import json
import math

import pytest

from spotrun.cli.main import main as cli_main
from spotrun.contract.spec import parse_run
from spotrun.planner.estimate import EstimateRefused, estimate, load_catalog
from spotrun.planner.memory import (
    CHECKPOINT_BYTES_FULL,
    STATE_BYTES_FULL,
    ModelDims,
    block_activation_bytes_per_token,
    peak_bytes,
)
from spotrun.planner.plans import LLAMA_31_8B, LLAMA_31_70B, PLAN_RUNS, plan_run
from spotrun.planner.topology import Layout, comm_seconds, layouts
from spotrun.settings.wire import parse

TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "tie_word_embeddings": False}


def test_bytes_per_parameter_are_the_trainers():
    assert STATE_BYTES_FULL == 4 + 4 + 8  # fp32 sharded param + fp32 grad + two fp32 Adam moments
    assert CHECKPOINT_BYTES_FULL == 4 + 8  # DCP saves the fp32 shards and the moments, no bf16 copy


def test_model_dims_from_the_llama_config():
    dims = ModelDims.from_config(LLAMA_31_8B)
    assert dims.total_params == 8_030_261_248  # Llama 3.1 8B, as transformers builds it
    assert dims.head_params == dims.embed_params == 128_256 * 4096
    assert dims.largest_unit_params == 128_256 * 4096  # the output head outweighs a decoder block (218M)


def test_tiny_model_peak_worked_by_hand():
    dims = ModelDims.from_config(TINY)
    # One block per token in fp32: 2 RMSNorms (fp32 input 256 + two outputs 512 + rsqrt 4), q/k/v 4 x (64+32+32),
    # attention output 256, log-sum-exp 16, SwiGLU 4 x 4 x 128.
    assert block_activation_bytes_per_token(dims, 4) == 2 * 772 + 512 + 256 + 16 + 2048 == 4376
    mem = peak_bytes(dims, shard_ranks=2, micro_batch=2, seq_len=64, activation_checkpointing=False,
                     compute_bytes=4, prefetch_units=0)
    assert mem.state == dims.total_params * 16 // 2
    assert mem.gathered == dims.block_params * (2 * 4 + 4)
    assert mem.activations == 128 * (2 * 4376 + 772)
    assert mem.logits == 128 * 256 * 8
    ac = peak_bytes(dims, shard_ranks=2, micro_batch=2, seq_len=64, activation_checkpointing=True,
                    compute_bytes=4, prefetch_units=0)
    assert ac.activations == 128 * (2 * 64 * 4 + 4376 + 772)  # block inputs kept, one block recomputed
    hybrid = peak_bytes(dims, shard_ranks=4, micro_batch=2, seq_len=64, activation_checkpointing=False,
                        compute_bytes=4, prefetch_units=0)
    assert hybrid.state == math.ceil(dims.total_params * 16 / 4)


def test_efa_decides_whether_shard_groups_span_nodes():
    catalog = load_catalog()
    p5 = [(x.sharding, x.group_nodes) for x in layouts("ml.p5.48xlarge", catalog["instances"]["ml.p5.48xlarge"], 4)]
    assert p5 == [("full", 4), ("hybrid", 1), ("hybrid", 2)]
    g5 = catalog["instances"]["ml.g5.12xlarge"]
    assert not g5["efa"]
    assert [(x.sharding, x.group_nodes) for x in layouts("ml.g5.12xlarge", g5, 4)] == [("hybrid", 1)]


def test_communication_inside_a_node_uses_its_link_and_across_nodes_the_network():
    catalog = load_catalog()
    d, p5 = catalog["defaults"], catalog["instances"]["ml.p5.48xlarge"]
    n = 8_000_000_000
    one = comm_seconds(Layout("ml.p5.48xlarge", 1, 8, "full", 1), p5, d, total_params=n, trainable_params=n,
                       compute_bytes=2)
    assert one == pytest.approx((2 * n * 2 + n * 4) * 7 / 8 / (450e9 * 0.7))
    two = comm_seconds(Layout("ml.p5.48xlarge", 2, 8, "full", 2), p5, d, total_params=n, trainable_params=n,
                       compute_bytes=2)
    assert two == pytest.approx((2 * n * 2 + n * 4) * 15 / 16 / (3200 / 8 * 1e9 / 8 * 0.7))


@pytest.fixture(scope="module")
def plans() -> dict:
    return {(name, seq): plan_run(name, seq) for name, seq in PLAN_RUNS}


@pytest.mark.parametrize("name, seq", PLAN_RUNS)
def test_readme_plans_fit_the_usable_memory_including_activations(plans, name, seq):
    est = plans[(name, seq)]
    m = est.memory_per_gpu
    assert m["activations"] > 0 and m["logits"] > 0 and m["gathered"] > 0
    assert m["state"] + m["gathered"] + m["activations"] + m["logits"] == m["total"] <= m["usable"]
    spec = load_catalog()["instances"][est.instance_type]
    assert m["usable"] == spec["gpu_memory_gb"] * 1e9 * 0.9 - 2e9
    sent = parse(est.hyperparameters)  # what the trainer reads
    assert (sent.training.micro_batch, sent.training.grad_accum) == (est.micro_batch, est.grad_accum)
    assert est.micro_batch * est.grad_accum == 8  # the run's samples per GPU and step, kept
    assert (sent.sharding.mode, sent.model.activation_checkpointing) == (est.sharding, est.activation_checkpointing)


@pytest.mark.parametrize("seq", [2048, 8192])
def test_70b_full_is_planned_on_several_efa_nodes(plans, seq):
    est = plans[("Llama 3.1 70B full", seq)]
    spec = load_catalog()["instances"][est.instance_type]
    assert est.instance_type.split(".")[1] in ("p4de", "p5", "p5e", "p5en") and spec["efa"]
    assert est.instance_count >= 2
    assert est.sharding == "full" or est.shard_group_nodes >= 2  # the state does not fit one node's GPUs
    assert est.checkpoint_bytes == 12 * 70_553_706_496


def test_8192_tokens_need_activation_checkpointing_where_2048_do_not(plans):
    assert not plans[("Llama 3.1 8B full", 2048)].activation_checkpointing
    assert plans[("Llama 3.1 8B full", 8192)].activation_checkpointing


def test_70b_lora_on_pcie_nodes_is_communication_bound():
    run = parse_run({"version": 1, "name": "lora70", "model": {"config": LLAMA_31_70B},
                     "data": {"tokens": 100_000_000, "seq_len": 2048},
                     "training": {"method": "lora", "lora": {"rank": 16}, "micro_batch": 1, "grad_accum": 8},
                     "compute": {"instance_type": "ml.g6e.48xlarge"}, "budget": {"max_usd": 1e6}})
    est = estimate(run)
    comm, compute = est.seconds_per_micro_batch["communication"], est.seconds_per_micro_batch["compute"]
    assert comm > compute  # gathering 70B bf16 weights twice a micro-batch over PCIe
    assert any(a.startswith("communication is not fully hidden") for a in est.advice)
    best = plan_run("Llama 3.1 70B LoRA", 2048)
    assert best.instance_type != "ml.g6e.48xlarge" and best.cost_usd["spot"] < est.cost_usd["spot"]


def test_the_old_1m_token_sample_is_refused_naming_the_largest_layout():
    run = parse_run({"version": 1, "name": "huge", "model": {"config": LLAMA_31_8B},
                     "data": {"tokens": 10_000_000_000, "seq_len": 1_048_576},
                     "training": {"micro_batch": 4096}, "budget": {"max_usd": 1e6}})
    with pytest.raises(EstimateRefused) as err:
        estimate(run)
    assert err.value.code == "InvalidRun"
    assert "the model fits no layout tried: the largest, 16 x ml.p5" in err.value.message
    assert "shorten data.seq_len" in err.value.message


def test_spotrun_estimate_on_a_70b_full_run_prints_a_multi_node_plan_with_periodic_saves(tmp_path, capsys):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"version": 1, "name": "llama70-full", "model": {"config": LLAMA_31_70B},
                                "data": {"tokens": 200_000_000, "seq_len": 8192},
                                "training": {"micro_batch": 1, "grad_accum": 8}, "budget": {"max_usd": 100_000}}))
    assert cli_main(["estimate", str(path), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["instance_count"] >= 2 and out["checkpoint_policy"] == "periodic"
    assert parse(out["hyperparameters"]).sharding.mode == out["sharding"]
    assert out["memory_per_gpu"]["total"] <= out["memory_per_gpu"]["usable"]
    advice = " ".join(out["advice"])
    assert "GB checkpoint cannot leave within the stop notice" in advice and "Young/Daly" in advice


@pytest.mark.parametrize("name, seq", [("Llama 3.1 70B full", 8192), ("Llama 3.1 8B full", 2048)])
def test_the_trainer_builds_exactly_the_planned_layout(plans, name, seq):
    """The plan's hyperparameters through the trainer's own parser, as the launcher does on the first of its nodes."""
    from spotrun.settings.wire import job_config

    est = plans[(name, seq)]
    cfg = job_config(est.hyperparameters, **{
        "output_dir": "/opt/ml/model", "data.path": "/opt/ml/input/data/train", "model.path": "/m",
        "sharding.nodes": str(est.instance_count), "checkpoint.dir": "/opt/ml/checkpoints"})
    gpus = load_catalog()["instances"][est.instance_type]["gpus"]
    assert (cfg.training.micro_batch, cfg.training.grad_accum) == (est.micro_batch, est.grad_accum)
    assert cfg.model.activation_checkpointing == est.activation_checkpointing
    assert cfg.data.seq_len == seq
    group_nodes = est.instance_count if est.sharding == "full" else est.shard_group_nodes
    assert cfg.sharding.mesh_shape(est.instance_count * gpus) == (est.instance_count // group_nodes,
                                                                   group_nodes * gpus)


def test_a_checkpoint_that_leaves_on_notice_only_across_nodes_says_so(plans):
    est = plans[("Llama 3.1 70B full", 2048)]  # shorter steps and more nodes than at 8,192 tokens
    assert est.checkpoint_policy == "save_on_notice" and est.instance_count > 1
    assert any(f"only because {est.instance_count} nodes upload their shards in parallel" in a for a in est.advice)
