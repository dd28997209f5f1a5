"""The estimate Lambda plans LoRA runs, and the trainer reads the LoRA settings it sends."""

from __future__ import annotations

from spotrun.pipeline.plan import PipelineSettings, plan

SETTINGS = PipelineSettings(bucket="art-bucket", job_prefix="spotrun-dev-", model_package_group="spotrun-models",
                            poll_seconds=60, project="spotrun", stage="dev", cost_center="ml-platform")
LORA_RUN = {"version": 1, "name": "tiny-lora",
            "model": {"init": "random",
                      "config": {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
                                 "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 1000}},
            "data": {"source": "s3://art-bucket/datasets/d1/", "tokens": 1_000_000, "seq_len": 128},
            "training": {"method": "lora", "lora": {"rank": 8, "alpha": 24, "dropout": 0.05,
                                                    "target_modules": ["q_proj", "v_proj"]}},
            "compute": {"instance_type": "ml.g5.xlarge"}, "budget": {"max_usd": 20}}


def test_estimate_lambda_plans_a_lora_run_and_the_trainer_parses_its_hyperparameters():
    from spotrun.settings.wire import job_config

    p = plan(LORA_RUN, "exec-1", SETTINGS)
    assert p["status"] == "ok", p
    hp = p["hyperparameters"]
    assert hp["training.method"] == "lora"
    assert hp["training.lora.target_modules"] == "q_proj,v_proj"
    # 2 layers x (q: 8 * (256 + 256), v: 8 * (256 + 256)) adapter parameters, 12 bytes each in a checkpoint
    assert p["estimate"]["trainable_parameters"] == 2 * 2 * 8 * 512
    assert p["estimate"]["checkpoint_bytes"] == 12 * 2 * 2 * 8 * 512
    cfg = job_config(hp, **{"data.path": "/opt/ml/input/data/train",
                                                  "output_dir": "/opt/ml/model",
                                                  "checkpoint.dir": "/opt/ml/checkpoints"})  # CheckpointConfig
    lora = cfg.training.lora
    assert cfg.training.method == "lora" and lora.rank == 8 and lora.targets == ("q_proj", "v_proj")
    assert (lora.alpha, lora.dropout) == (24.0, 0.05)
    assert cfg.model.config["model_type"] == "llama"
