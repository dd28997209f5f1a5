"""Validation loss in the trainer: before the first step, on its schedule and at the end, equal to the token mean
computed offline over the whole validation set with the exported model; SIGTERM during an evaluation."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from spotrun.local.harness import val_history
from spotrun_trainer.data import read_index
from spotrun_trainer.metrics import parse_eval_line

pytestmark = pytest.mark.slow


def _offline_val_loss(model_dir, val_dir, seq_len: int) -> float:
    """The mean next-token loss over every trained token of every validation sample, one unsharded model."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    index = read_index(val_dir)
    total, count = 0.0, 0
    for shard in index["shards"]:
        tokens = np.fromfile(val_dir / shard["file"], dtype=index["dtype"]).astype(np.int64)
        rows = torch.from_numpy(tokens[: len(tokens) // seq_len * seq_len].reshape(-1, seq_len))
        if not len(rows):
            continue
        with torch.no_grad():
            logits = model(input_ids=rows).logits[:, :-1].float()
        total += torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1),
                                                   reduction="sum").item()
        count += rows[:, 1:].numel()
    return total / count


def test_validation_loss_is_the_token_mean_over_the_validation_set_before_during_and_after(baseline, assets):
    vals = val_history(baseline.output)
    assert sorted(vals) == [0, 8, 16, 24]  # the base model's, every eval.every_steps=8, and the end
    assert vals[24] < vals[0] - 0.5  # the model learned the held-out sentences' pattern too
    # The final value is the exported model's (float32 export: the training precision) on the whole set,
    # computed here on one unsharded model: world-size independent up to float summation order.
    offline = _offline_val_loss(baseline.output, assets["data"] / "validation", seq_len=64)
    assert vals[24] == pytest.approx(offline, rel=1e-5)
    lines = [parse_eval_line(line) for line in baseline.text().splitlines() if line.startswith("eval ")]
    assert [ln["step"] for ln in lines] == [0, 8, 16, 24]
    assert lines[-1]["val_loss"] == pytest.approx(vals[24], abs=1e-4)
    assert lines[-1]["val_ppl"] == pytest.approx(math.exp(vals[24]), rel=1e-3)
    summary = json.loads((baseline.output / "metrics.json").read_text())
    assert summary["base_val_loss"] == vals[0] and summary["final_val_loss"] == vals[24]
    assert summary["best_val_loss"] == min(vals.values()) and summary["eval_seconds"] > 0
