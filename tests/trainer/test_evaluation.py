"""Validation loss in the trainer: before the first step, on its schedule and at the end, equal to the token mean
computed offline over the whole validation set with the exported model; SIGTERM during an evaluation."""

from __future__ import annotations

import json
import math
import signal
import time

import numpy as np
import pytest
import torch

from spotrun.local.harness import loss_history, val_history
from spotrun.seams import parse_eval_line
from spotrun_trainer.data import read_index

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


def test_sigterm_during_an_evaluation_stops_at_once_and_the_resumed_run_evaluates_that_step(job_factory, baseline,
                                                                                          assets, tmp_path):
    # A validation set 10 times the usual (its index lists the same shards again and again): seconds per
    # evaluation here, so the stop lands inside one and may not wait for it.
    val = assets["data"] / "validation"
    big = tmp_path / "big-validation"
    big.mkdir()
    index = read_index(val)
    for shard in index["shards"]:
        (big / shard["file"]).symlink_to(val / shard["file"])
    index["shards"] = index["shards"] * 10
    (big / "index.json").write_text(json.dumps(index))
    job = job_factory("stop-in-eval", channels={"validation": big})
    proc = job.start()
    deadline = time.monotonic() + 300
    while "eval_start step=8 " not in job.text():
        assert proc.poll() is None and time.monotonic() < deadline, job.text()[-3000:]
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0, job.text()[-3000:]
    stopped = next(ln for ln in job.text().splitlines() if ln.startswith("eval_stopped step=8 "))
    done, total = (int(kv.split("=")[1]) for kv in stopped.split()[2:])
    assert done < total / 2, stopped  # the stop did not wait for the evaluation to finish
    assert "run_stopped step=8 reason=signal-during-eval" in job.text()
    assert 8 not in val_history(job.output) and sorted(val_history(job.output)) == [0]

    # The resumed run owes step 8's value and computes it first (a short prefix this time, to keep the test fast),
    # then trains on exactly as the uninterrupted run did.
    hp_file = job.root / "sm" / "input" / "config" / "hyperparameters.json"
    hp_file.write_text(json.dumps({**json.loads(hp_file.read_text()), "eval.max_batches": "4"}))
    assert job.run() == 0, job.text()[-3000:]
    assert sorted(val_history(job.output)) == [0, 8, 16, 24]
    resumed = job.text().split("start_step=8", 1)[1].splitlines()
    assert next(ln for ln in resumed if ln.startswith(("eval step=", "step="))).startswith("eval step=8 ")
    assert loss_history(job.output) == loss_history(baseline.output)  # evaluation never touches training


def test_the_completion_line_carries_the_exported_and_base_validation_loss_for_the_registry_gate(baseline):
    import re

    from spotrun.seams import COMPLETION_METRICS, metric_name
    from spotrun.seams import METRIC_DEFINITIONS as DEFINITIONS

    vals = val_history(baseline.output)
    done = next(ln for ln in baseline.text().splitlines() if ln.startswith("run_completed "))
    expected = {"exported_val_loss": vals[24], "base_val_loss": vals[0]}  # export.from=last by default
    for field in COMPLETION_METRICS:
        regex = next(d["Regex"] for d in DEFINITIONS if d["Name"] == metric_name(field))
        assert float(re.search(regex, done).group(1)) == pytest.approx(expected[field], rel=1e-5)
    meta = json.loads((baseline.output / "spotrun-export.json").read_text())["evaluation"]
    assert meta["weights"] == "last" and meta["exported_step"] == 24 and meta["val_loss"] == vals[24]


def test_keep_best_keeps_the_lowest_validation_loss_checkpoint_and_export_best_exports_its_weights(
        job_factory, unrelated_validation):
    from spotrun_trainer.checkpoint import committed_checkpoints

    job = job_factory("best", channels={"validation": unrelated_validation},
                      **{"eval.every_steps": 2, "eval.keep_best": True, "export.from": "best", "training.lr": 1e-2})
    assert job.run() == 0, job.text()[-3000:]
    vals = val_history(job.output)
    best = min((s for s in vals if s > 0), key=vals.get)
    assert 0 < best < 20  # the val loss rose afterwards: the best is older than the newest two checkpoints
    assert sorted(step for step, _ in committed_checkpoints(job.ckpt)) == [best, 20, 24]
    meta = json.loads((job.output / "spotrun-export.json").read_text())["evaluation"]
    assert (meta["weights"], meta["exported_step"], meta["val_loss"]) == ("best", best, vals[best])
    assert (meta["final_val_loss"], meta["base_val_loss"]) == (vals[24], vals[0])
    # The exported weights are step `best`'s: their loss on the validation set, computed here, is that step's.
    assert _offline_val_loss(job.output, unrelated_validation, seq_len=64) == pytest.approx(vals[best], rel=1e-5)


def test_the_schedule_evaluates_on_steps_at_the_end_and_at_the_first_log_step_after_its_minutes(tmp_path):
    import torch.distributed as dist

    from spotrun.settings.sections import EvalConfig
    from spotrun_trainer.evaluate import Evaluator

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        by_steps = Evaluator(EvalConfig(every_steps=5), None, model=None, loss_fn=None, device=torch.device("cpu"))
        assert [s for s in range(1, 13) if by_steps.due(s, total_steps=12, log_step=s % 2 == 0)] == [5, 10, 12]
        by_time = Evaluator(EvalConfig(every_s=0.12), None, model=None, loss_fn=None,
                            device=torch.device("cpu"))
        assert not by_time.due(1, total_steps=12, log_step=True)  # 0.12 s have not passed yet
        time.sleep(0.15)
        assert not by_time.due(2, total_steps=12, log_step=False)  # only at log steps (the ranks agree there)
        assert by_time.due(3, total_steps=12, log_step=True)
    finally:
        dist.destroy_process_group()
