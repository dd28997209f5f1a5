"""`spotrun local` applies the registry gate before its registry: a model that does not improve enough is trained,
reported with both validation losses and the gate's verdict, and not registered (exit code 4)."""

from __future__ import annotations

import json

import pytest

from spotrun.cli.main import main
from spotrun.local.registry import versions
from spotrun.seams import SAMPLES_FILE

pytestmark = pytest.mark.slow


def test_a_local_run_that_fails_its_gate_is_reported_and_not_registered(assets, tmp_path):
    run = {"version": 1, "name": "local-gate", "model": {"source": str(assets["model"])},
           "data": {"source": str(assets["corpus"].parent), "seq_len": 64, "validation_fraction": 0.1},
           "eval": {"every_steps": 3}, "training": {"lr": 0.003, "seed": 3},
           "compute": {"instance_type": "ml.g5.xlarge"}, "budget": {"max_usd": 5},
           "registry": {"model_package_group": "gate-tests", "gate": {"min_improvement": 0.99}}}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    code = main(["local", str(path), "--out", str(tmp_path / "out"), "--job-name", "gated", "--progress", "none",
                 "--format", "json", "--set", "max_steps=6", "--set", "training.micro_batch=2"])
    assert code == 4  # trained, refused by the gate
    report = json.loads((tmp_path / "out" / "gated" / "report.json").read_text())
    assert report["status"] == "GateFailed" and report["gate"]["passed"] is False
    base, final = report["base_val_loss"], report["exported_val_loss"]
    assert final < base  # it did learn, just not 99%
    assert f"exported weights' validation loss {final:.4f}, base model's {base:.4f}" in report["gate"]["cause"]
    assert "improvement below min_improvement 99.00%" in report["gate"]["cause"]
    assert versions(tmp_path / "out" / "registry" / "gate-tests") == [] and "model_package" not in report
    summary = (tmp_path / "out" / "gated" / "report.txt").read_text()
    assert "validation loss" in summary and "registry gate failed" in summary
    # What a user reads beside the loss: the trainer's sample generations, in the report and its text.
    samples = json.loads((tmp_path / "out" / "gated" / "sm" / "model" / SAMPLES_FILE).read_text())
    assert report["samples"] == samples and report["samples_file"] == SAMPLES_FILE
    assert len(samples["samples"]) == 3 and samples["base"] == "model.path"
    for i, sample in enumerate(samples["samples"], 1):
        assert len(sample["tuned_ids"]) == len(sample["base_ids"]) == samples["new_tokens"]
        assert f"{i}. prompt     {sample['prompt']!r}" in summary
        assert f"fine-tuned {sample['tuned']!r}" in summary and f"base       {sample['base']!r}" in summary
