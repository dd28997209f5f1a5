"""The estimate, worked by hand on a small catalog with round numbers, and every refusal."""

from __future__ import annotations

import copy
import json
import math
import re

import pytest

from spotrun.contract.spec import parse_run
from spotrun.planner.estimate import EstimateRefused, estimate, load_catalog
from spotrun.settings.wire import job_config, parse

CATALOG = {
    "defaults": {"utilization": 0.25, "startup_seconds": 180, "trainer_restart_seconds": 60,
                 "memory_usable_fraction": 0.5,
                 "memory_allowance_gb": 0, "compute_bytes": 2, "collective_efficiency": 0.5,
                 "tcp_collective_efficiency": 0.25, "comm_overlap_fraction": 0.8,
                 "max_runtime_factor": 2.0,
                 "min_max_runtime_seconds": 3600, "max_auto_instance_count": 16},
    "families": {"a1": {"spot_discount": 0.6, "interruptions_per_instance_hour": 0.5}},
    "instances": {
        "ml.a1.small": {"gpus": 1, "gpu_memory_gb": 32, "bf16_tflops_per_gpu": 100, "s3_upload_gb_per_s": 0.1,
                        "on_demand_usd_per_hour": 2.0, "gpu_link_gb_per_s": 10, "efa": False, "network_gbps": 8},
        "ml.a1.big": {"gpus": 4, "gpu_memory_gb": 32, "bf16_tflops_per_gpu": 100, "s3_upload_gb_per_s": 0.1,
                      "on_demand_usd_per_hour": 8.0, "gpu_link_gb_per_s": 10, "efa": False, "network_gbps": 8},
    },
}

BASE = {"version": 1, "name": "worked", "model": {"parameters": 1_000_000_000},
        "data": {"tokens": 100_000_000, "seq_len": 2048}, "budget": {"max_usd": 100}}


def run(**sections):
    raw = copy.deepcopy(BASE)
    raw.update(sections)
    return parse_run(raw)


def test_full_fine_tune_worked_example():
    est = estimate(run(), catalog=CATALOG)
    assert est.parameters == est.trainable_parameters == 1_000_000_000
    assert est.training_flops == 6 * 1e9 * 1e8 == 6e17
    assert est.training_state_bytes == 16e9  # 16 GB: fits 1 x 32 GB at 0.5 usable, exactly
    assert est.gpu_hours == pytest.approx(6e17 / (100e12 * 0.25) / 3600)  # 24,000 GPU-seconds
    # small: one GPU, no collectives: wall 24,000 + 180 s. big: 4 GPUs sharding 1e9 parameters over a 10 GB/s link
    # at 0.5 efficiency: (2 x 2 B gathers + 4 B reduce-scatter) x 1e9 x 3/4 = 6 GB in 1.2 s per micro-batch of
    # 2,048 tokens, against 6e9 x 2048 / 25e12 = 0.49 s of compute, of which 0.8 hides 0.39 s: 1.30 s a micro-batch.
    compute = 6e9 * 2048 / 25e12
    big_train = 1e8 / (4 * 2048) * (compute + 1.2 - 0.8 * compute)
    # Both save on a schedule: a 12 GB checkpoint needs 12/90 = 0.133 GB/s but one instance uploads 0.1 GB/s.
    # Save cost 12e9 / 0.1e9 = 120 s, MTBI 7,200 s.
    interval = math.sqrt(2 * 120 * 7200)  # 1,314.5 s
    small_interruptions = 0.5 * 24180 / 3600
    small_overhead = small_interruptions * (interval / 2 + 180 + 120)
    small_spot = 2.0 * (1 - 0.6) * (24180 + small_overhead) / 3600
    big_wall = big_train + 180
    big_spot = 8.0 * (1 - 0.6) * (big_wall + 0.5 * big_wall / 3600 * (interval / 2 + 300)) / 3600
    assert small_spot < big_spot
    assert (est.instance_type, est.instance_count, est.sharding) == ("ml.a1.small", 1, "full")
    assert est.wall_seconds == 24180
    assert est.checkpoint_bytes == 12e9  # fp32 weights 4 + Adam moments 8 per parameter: what DCP writes
    assert est.notice_upload_gb_per_s == pytest.approx(12 / 90)
    assert est.checkpoint_policy == "periodic"
    assert est.checkpoint_interval_s == round(interval) == 1315
    assert est.expected_interruptions == pytest.approx(small_interruptions)
    # The spot bill is the chain's (one job here), whose start is counted as a restart, as the trainer's segment
    # budget counts it: 180 s + the trainer's 60 s + 14 GB (the 12 GB checkpoint and 2 GB of bf16 weights) read at
    # 0.1 GB/s = 380 s, 200 s more than the wall's startup; and its end past the trainer's exit (SageMaker's
    # upload), billed as the 60 s the trainer's budget reserves for it.
    first_start_extra = 60 + 14e9 / 0.1e9 + 60
    chain_spot = 2.0 * (1 - 0.6) * (24180 + small_overhead + first_start_extra) / 3600
    # The on-demand figure is one uninterrupted job billed the same way (its start and end), not the bare wall: the
    # same run with compute.spot=false shows the chain's figure there (one quantity per market).
    # Both markets count the periodic saves the simulation bills (issue #26): one every 1,315 s of the 24,000 s of
    # training and the job's 60 s end but at its end, 120 s each: 18 saves, 2,160 s.
    saves = (math.ceil((24180 - 180 + 60) / 1315) - 1) * 120
    assert saves == 2160
    assert est.cost_usd == {"on_demand": round(2.0 * (24180 + first_start_extra + saves) / 3600, 2),
                            "spot": round(chain_spot + 2.0 * (1 - 0.6) * saves / 3600, 2)}
    assert est.max_runtime_seconds == math.ceil(2 * (24180 + small_overhead))
    assert est.max_wait_seconds == est.max_runtime_seconds + 24 * 3600
    sent = parse(est.hyperparameters)  # what the trainer reads
    assert (sent.checkpoint.interval_s, sent.sharding.mode, sent.training.micro_batch) == (1315, "full", 1)
    assert est.warnings == ["model.parameters only: activations, logits and gathered units are not in the memory "
                            "check (give model.config or model.source for a plan that counts them)"]
    big = estimate(run(compute={"instance_type": "ml.a1.big"}), catalog=CATALOG)
    assert big.seconds_per_micro_batch["communication"] == pytest.approx(1.2)
    assert big.wall_seconds == pytest.approx(big_wall)
    big_saves = (math.ceil((big_wall - 180 + 60) / 1315) - 1) * 120
    assert big.cost_usd["spot"] == round(big_spot + 8.0 * (1 - 0.6) * (first_start_extra + big_saves) / 3600, 2)


def test_lora_counts_frozen_forward_and_backward_and_checkpoints_only_the_adapter():
    llama2_7b = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                 "num_attention_heads": 32, "vocab_size": 32000}
    est = estimate(run(model={"config": llama2_7b}, training={"method": "lora", "lora": {"rank": 16}},
                       budget={"max_usd": 1000}), catalog=CATALOG)
    n, n_lora = 6_738_415_616, 39_976_960
    assert (est.parameters, est.trainable_parameters) == (n, n_lora)
    assert est.training_flops == (4 * n + 6 * n_lora) * 1e8
    assert est.training_state_bytes == 2 * n + 16 * n_lora  # the frozen base is kept in bf16
    assert est.checkpoint_bytes == 12 * n_lora == 479_723_520
    # 0.48 GB in 90 s needs 0.0053 GB/s < 0.1 GB/s: save on notice; periodic saves as insurance.
    assert est.checkpoint_policy == "save_on_notice"
    # Young/Daly gives sqrt(2 * 4.8 s * 7200 s) = 263 s; intervals are clamped to [5 min, 6 h].
    assert round(math.sqrt(2 * (479_723_520 / 0.1e9) * 7200)) == 263
    assert est.checkpoint_interval_s == 300


EFA_CATALOG = {**CATALOG, "instances": {"ml.a1.big": {**CATALOG["instances"]["ml.a1.big"], "efa": True,
                                                        "network_gbps": 400}}}


def test_target_hours_picks_the_node_count():
    # 6e18 FLOPs: 240,000 GPU-s of compute, 60,000 s on one 4-GPU node; 4 h needs several. The planner takes the
    # cheapest layout meeting 4 h, and a fewer-node one would not.
    runs = dict(data={"tokens": 1_000_000_000, "seq_len": 2048}, budget={"max_usd": 10_000},
                checkpoint={"interruptions_per_hour": 0.01})
    est = estimate(run(**runs, compute={"instance_type": "ml.a1.big", "target_hours": 4}), catalog=EFA_CATALOG)
    assert est.wall_seconds + est.expected_overhead_seconds <= 4 * 3600
    assert est.instance_count >= math.ceil(60_000 / (4 * 3600))
    assert est.interruptions_per_hour == pytest.approx(est.instance_count * 0.01)  # any node stops the job
    assert est.upload_gb_per_s_available == pytest.approx(0.1 * est.instance_count)
    fewer = estimate(run(**runs, compute={"instance_type": "ml.a1.big", "instance_count": est.instance_count - 1}),
                     catalog=EFA_CATALOG)
    assert fewer.wall_seconds + fewer.expected_overhead_seconds > 4 * 3600


def test_nodes_without_efa_only_replicate_across_nodes():
    runs = dict(data={"tokens": 1_000_000_000, "seq_len": 2048}, budget={"max_usd": 100_000})
    est = estimate(run(**runs, compute={"instance_type": "ml.a1.big", "instance_count": 2}), catalog=CATALOG)
    assert (est.sharding, est.shard_group_nodes) == ("hybrid", 1)
    # Replicas all-reduce each GPU's fp32 gradient shard (1e9 x 4 B / 4 GPUs) over TCP: 8 Gbps / 4 GPUs x 0.25.
    replica = 2 * 1e9 * 4 / 4 * (1 / 2) / (8 / 8 * 1e9 / 4 * 0.25)
    assert est.seconds_per_micro_batch["communication"] == pytest.approx(1.2 + replica)
    # 5e9 parameters: 80 GB of state is 20 GB a GPU within one node (16 usable), 10 GB across two.
    big_model = dict(runs, model={"parameters": 5_000_000_000})
    with_efa = estimate(run(**big_model, compute={"instance_type": "ml.a1.big", "instance_count": 2}),
                        catalog=EFA_CATALOG)
    assert (with_efa.sharding, with_efa.shard_group_nodes) == ("full", 2)
    assert parse(with_efa.hyperparameters).sharding.mode == "full"
    with pytest.raises(EstimateRefused) as err:
        estimate(run(**big_model, compute={"instance_type": "ml.a1.big", "instance_count": 2}), catalog=CATALOG)
    assert "ml.a1.big has no EFA, so nodes cannot share its training state" in err.value.message


def test_unreachable_target_hours_takes_the_fastest_and_says_so():
    est = estimate(run(data={"tokens": 1_000_000_000, "seq_len": 2048}, budget={"max_usd": 10_000},
                       compute={"instance_type": "ml.a1.small", "target_hours": 0.01}), catalog=CATALOG)
    assert any("compute.target_hours=0.01: no layout finishes in time" in w for w in est.warnings)


def test_on_demand_run_has_no_interruption_overhead():
    est = estimate(run(compute={"spot": False, "instance_type": "ml.a1.small"}), catalog=CATALOG)
    assert est.expected_interruptions == 0 and est.expected_overhead_seconds == 0
    assert est.max_runtime_seconds == 2 * 24180


def test_an_on_demand_runs_text_shows_no_max_wait():
    """A new user read 'MaxRuntime / MaxWait  3,600 s / 90,000 s' for compute.spot=false: the pipeline sends no
    MaxWait for an on-demand job (SageMaker takes one with managed spot only)."""
    from spotrun.planner.outputs import format_text

    rows = {line.split("  ")[0]: line for line in format_text(estimate(
        run(compute={"spot": False, "instance_type": "ml.a1.small"}), catalog=CATALOG)).splitlines()}
    assert rows["MaxRuntime / MaxWait"].endswith(f"{2 * 24180:,} s / none (compute.spot=false: an on-demand job "
                                                 "has no MaxWait)"), rows
    spot = format_text(estimate(run(compute={"instance_type": "ml.a1.small"}), catalog=CATALOG))
    assert "has no MaxWait" not in spot


def test_recorded_interruption_rate_replaces_the_catalog_default():
    est = estimate(run(compute={"instance_type": "ml.a1.small"}), catalog=CATALOG,
                   recorded_rates={"ml.a1.small": 2.0})
    assert est.interruptions_per_hour == 2.0
    assert est.checkpoint_interval_s == round(math.sqrt(2 * 120 * 1800))


def test_more_instances_than_needed_warns():
    est = estimate(run(compute={"instance_type": "ml.a1.small", "instance_count": 3}, budget={"max_usd": 1000}),
                   catalog=CATALOG)
    assert est.instance_count == 3
    assert any("instance_count=3" in w and "add speed and cost" in w for w in est.warnings)


def test_over_budget_is_refused_with_the_estimate_and_advice():
    with pytest.raises(EstimateRefused) as err:
        estimate(run(budget={"max_usd": 5}), catalog=CATALOG)
    assert err.value.code == "OverBudget" and "exceeds budget.max_usd=$5.00" in err.value.message
    assert err.value.estimate.cost_usd["spot"] > 5
    assert any("LoRA" in a for a in err.value.estimate.advice)


def test_a_cap_below_the_spot_estimate_names_the_smallest_cap_whose_chain_finishes_and_that_cap_is_accepted():
    """Below the spot estimate the refusal names the cap the chain needs (it said only 'exceeds': a user who then set
    the spot estimate was refused again); the named cap is accepted."""
    with pytest.raises(EstimateRefused) as err:
        estimate(run(budget={"max_usd": 5}), catalog=CATALOG)
    named = re.search(r"the smallest cap whose chain finishes is \$([\d,]+\.\d\d)", err.value.message)
    assert named and "exceeds budget.max_usd=$5.00" in err.value.message, err.value.message
    smallest = float(named.group(1).replace(",", ""))
    assert smallest > err.value.estimate.cost_usd["spot"] > 5
    assert estimate(run(budget={"max_usd": smallest}), catalog=CATALOG).instance_type  # accepted: no refusal


def test_over_budget_full_run_is_advised_what_lora_would_cost():
    llama2_7b = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                 "num_attention_heads": 32, "vocab_size": 32000}
    big = {**CATALOG, "instances": {**CATALOG["instances"], "ml.a1.huge": {
        "gpus": 8, "gpu_memory_gb": 80, "bf16_tflops_per_gpu": 100, "s3_upload_gb_per_s": 1.0,
        "on_demand_usd_per_hour": 40.0, "gpu_link_gb_per_s": 100, "efa": True, "network_gbps": 400}}}
    with pytest.raises(EstimateRefused) as err:
        estimate(run(model={"config": llama2_7b}, budget={"max_usd": 50}), catalog=big)
    lora = estimate(run(model={"config": llama2_7b}, training={"method": "lora", "lora": {"rank": 16}},
                        budget={"max_usd": 10_000}), catalog=big)
    expected = (f"LoRA (training.method=lora, rank 16, all-linear) would train 39,976,960 parameters on "
                f"{lora.instance_count} x {lora.instance_type} for about ${lora.cost_usd['spot']:.2f}")
    assert expected in err.value.estimate.advice


def test_spot_that_saves_little_is_advised_against():
    est = estimate(run(compute={"instance_type": "ml.a1.small", "spot_discount": 0.05}), catalog=CATALOG)
    assert any("on-demand (compute.spot=false) costs about the same" in a for a in est.advice)


@pytest.mark.parametrize("sections, message", [
    ({"compute": {"max_wait_hours": 1}}, "MaxWait (3600 s) < MaxRuntime"),
    # Without EFA no shard group spans nodes: the largest layout tried is 16 big nodes, each holding everything.
    ({"model": {"parameters": 10_000_000_000}}, "the model fits no layout tried: the largest, 16 x ml.a1.big, "
                                                "hybrid sharding: shard groups of 1 node(s) (4 GPUs), 16 replicas, "
                                                "needs 40.00 GB (state 40.00 + gathered 0.00"),
    ({"compute": {"instance_type": "ml.zz.huge"}}, 'compute.instance_type="ml.zz.huge" is not in the catalog'),
    ({"model": {"parameters": 2_000_000_000}, "compute": {"instance_type": "ml.a1.small"}},
     "compute.instance_type=ml.a1.small: the model fits no layout tried"),
    ({"training": {"method": "lora", "lora": {"rank": 8}}}, "needs the model's shape"),
])
def test_refusals_are_invalid_runs_with_a_reason(sections, message):
    with pytest.raises(EstimateRefused) as err:
        estimate(run(**sections), catalog=CATALOG)
    assert err.value.code == "InvalidRun" and message in err.value.message


def test_a_max_wait_under_max_runtime_names_the_least_that_is_accepted():
    """A new user wrote compute.max_wait_hours: 14 for 13.54 h of work and read 'compute.max_wait_hours=14.0:
    MaxWait (50400 s) < MaxRuntime (98109 s)', with no field of theirs that sets MaxRuntime. The refusal quotes the
    value as written, says where MaxRuntime comes from, and names the least MaxWait, which is accepted when set."""
    with pytest.raises(EstimateRefused) as err:
        estimate(run(compute={"max_wait_hours": 1}), catalog=CATALOG)
    message = err.value.message
    assert message.startswith("compute.max_wait_hours=1: MaxWait (3600 s) < MaxRuntime ("), message
    assert "the run is expected to take" in message, message
    least = float(re.search(r"give compute.max_wait_hours=([0-9.]+) or more", message).group(1))
    accepted = estimate(run(compute={"max_wait_hours": least}), catalog=CATALOG)
    assert accepted.max_wait_seconds >= accepted.max_runtime_seconds
    with pytest.raises(EstimateRefused):  # a hundredth under it is refused: it is the least
        estimate(run(compute={"max_wait_hours": round(least - 0.01, 2)}), catalog=CATALOG)


@pytest.mark.parametrize("compute, said", [
    ({"spot": False, "on_demand_fallback": True}, "compute.on_demand_fallback=true does nothing with compute.spot="
                                                  "false"),
    ({"accept_missed_deadline": True}, "compute.accept_missed_deadline=true does nothing without "
                                       "compute.deadline_hours"),
])
def test_a_setting_another_one_makes_do_nothing_is_said(compute, said):
    assert [w for w in estimate(run(compute=compute), catalog=CATALOG).warnings if said in w]
    quiet = {k: v for k, v in compute.items() if k == "spot"}  # the same run without the setting: no word
    assert not [w for w in estimate(run(compute=quiet), catalog=CATALOG).warnings if "does nothing" in w]


def test_the_shipped_catalog_covers_the_required_families_with_sources():
    catalog = load_catalog()
    families = {t.split(".")[1] for t in catalog["instances"]}
    assert {"g5", "g6", "g6e", "p4d", "p4de", "p5", "p5e", "p5en"} <= families
    assert catalog["as_of"] and catalog["sources"]
    for spec in catalog["instances"].values():
        assert spec["gpus"] >= 1 and spec["on_demand_usd_per_hour"] > 0 and spec["bf16_tflops_per_gpu"] > 0
    assert families <= set(catalog["families"])


@pytest.mark.parametrize("lora, settings, targets", [
    ({"rank": 8, "target_modules": ["q_proj", "v_proj"]}, {"alpha": 24.0, "dropout": 0.05}, ("q_proj", "v_proj")),
    ({"rank": 16}, {}, "all-linear"),
])
def test_lora_hyperparameters_are_what_the_trainer_config_reads(lora, settings, targets):
    from dataclasses import replace
    llama = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
             "num_attention_heads": 4, "vocab_size": 1000}
    spec = run(model={"config": llama}, training={"method": "lora", "lora": lora})
    spec = replace(spec, training=replace(spec.training, lora=replace(spec.training.lora, **settings)))
    est = estimate(spec, catalog=CATALOG)
    channels = {"data.path": "/data", "output_dir": "/out", "model.config": json.dumps(llama),
                "checkpoint.dir": "/opt/ml/checkpoints"}  # the launcher adds it from the job's CheckpointConfig
    cfg = job_config(est.hyperparameters, **channels)
    assert cfg.training.method == "lora"
    assert (cfg.training.lora.rank, cfg.training.lora.targets) == (lora["rank"], targets)
    sent = cfg.training.lora
    assert (sent.alpha, sent.dropout) == (spec.training.lora.alpha, spec.training.lora.dropout)
    full = estimate(run(model={"config": llama}), catalog=CATALOG)
    assert job_config(full.hyperparameters, **channels).training.method == "full"
    assert not any(k.startswith("training.lora.") for k in full.hyperparameters)


def test_the_notice_budget_is_the_one_the_launcher_and_trainer_keep(monkeypatch):
    """The planner's upload budget is seams.StopNotice's, not a copy: a shorter budget turns the LoRA run's
    save-on-notice into periodic saves."""
    from spotrun.seams import StopNotice

    lora = dict(model={"config": {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
                                  "num_hidden_layers": 32, "num_attention_heads": 32, "vocab_size": 32000}},
                training={"method": "lora", "lora": {"rank": 16}}, budget={"max_usd": 1000})
    assert estimate(run(**lora), catalog=CATALOG).checkpoint_policy == "save_on_notice"
    monkeypatch.setattr(StopNotice, "UPLOAD_S", 4)  # 0.48 GB in 4 s needs 0.12 GB/s > the 0.1 available
    est = estimate(run(**lora), catalog=CATALOG)
    assert est.checkpoint_policy == "periodic"
    assert est.notice_upload_gb_per_s == pytest.approx(479_723_520 / 4 / 1e9)


@pytest.mark.parametrize("price", [0, -1.0, float("nan"), "1.0", True])
def test_a_catalog_price_that_is_not_positive_is_refused_at_load(tmp_path, price):
    import json

    from spotrun.planner.estimate import load_catalog as load

    catalog = load()
    first = next(iter(catalog["regions"]["us-east-1"]["on_demand_usd_per_hour"]))
    catalog["regions"]["us-east-1"]["on_demand_usd_per_hour"][first] = price
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps(catalog))
    with pytest.raises(ValueError, match=f"regions.us-east-1.{first}.on_demand_usd_per_hour=.*a price of 0 would "
                                         "disable the cost cap"):
        load(path)


def test_a_cap_between_spot_and_on_demand_plans_segments_and_one_that_carries_nothing_is_refused():
    est = estimate(run(compute={"instance_type": "ml.a1.small"}, budget={"max_usd": 9}), catalog=CATALOG)
    seg = est.segments
    assert seg.fits and seg.segments > 1 and "segments of" not in seg.line
    assert f"{seg.segments} segments" in seg.line and est.cost_usd["spot"] >= 6.09  # the restarts cost
    # Each job's MaxRuntime is at most what the cap buys at on-demand rates, less the 120 s a stop bills.
    assert est.max_runtime_seconds <= 9 / (2.0 / 3600) - 120
    assert 0 < parse(est.hyperparameters).segment_seconds < est.max_runtime_seconds
    one = estimate(run(compute={"instance_type": "ml.a1.small"}, budget={"max_usd": 100}), catalog=CATALOG)
    assert one.segments.segments == 1 and "one job" in one.segments.line


def test_a_short_run_is_refused_only_below_the_smallest_cap_whose_chain_finishes_and_the_refusal_names_it():
    """The Qwen2 example at 1.3x its spot estimate was refused because the shortest segment then allowed cost more
    than the whole run on-demand. Now the refusal names the smallest cap whose chain of jobs finishes, and that cap
    is accepted: a chain of jobs, each bounded at on-demand rates, finishing at the expected spot bill."""
    from pathlib import Path

    doc = json.loads((Path(__file__).parents[2] / "examples/runs/qwen2-0.5b-full-small.json").read_text())
    doc["budget"]["max_usd"] = 1e6
    single = estimate(parse_run(doc))
    smallest = single.segments.min_cap_usd
    # Above the single job's on-demand bound ($0.70): that bound counts the first start as the wall does (180 s), a
    # job's trainer budget as a restart (431 s); the chain of two jobs below needs $0.73.
    assert single.cost_usd["spot"] < smallest
    doc["budget"]["max_usd"] = smallest
    est = estimate(parse_run(doc))
    assert est.segments.fits and est.segments.segments > 1 and est.cost_usd["spot"] <= smallest
    doc["budget"]["max_usd"] = round(smallest - 0.01, 2)
    with pytest.raises(EstimateRefused) as refused:
        estimate(parse_run(doc))
    assert f"the smallest cap whose chain finishes is ${smallest:,.2f}" in str(refused.value)
    assert "room left" in str(refused.value) and "stop bills" in str(refused.value)


def test_the_chain_at_another_cap_is_the_estimates_own_and_never_longer_at_a_larger_cap():
    """`segments_at` (the spot policy's simulation of the run at a cap the estimate names) is the chain the estimate
    plans at that cap, and never has more jobs at a larger cap: the deadline warning's cap search ends because of
    it (spotrun/policy/choose.py `_deadline_cap`). `one_job_cap_usd` is the smallest cap whose chain is one job."""
    from spotrun.planner.segments import one_job_cap_usd, segments_at

    small = {"instance_type": "ml.a1.small"}
    seg = estimate(run(compute=small, budget={"max_usd": 9}), catalog=CATALOG).segments
    one = one_job_cap_usd(seg)
    for cap in (seg.min_cap_usd, round(seg.min_cap_usd + 0.3, 2), 9.0, 12.34, round(one - 0.01, 2), one, 40.0):
        assert segments_at(seg, cap) == estimate(run(compute=small, budget={"max_usd": cap}),
                                                 catalog=CATALOG).segments.segments, cap
    jobs = [segments_at(seg, c / 100) for c in range(math.floor(seg.min_cap_usd * 100), math.ceil(one * 100) + 50)]
    assert all(a >= b for a, b in zip(jobs, jobs[1:], strict=False)) and jobs[0] > 2 and jobs[-1] == 1, jobs
    assert segments_at(seg, one) == 1 < segments_at(seg, round(one - 0.01, 2))
