"""The lean step computes what a plain FSDP2 loop computes: bitwise the same per-step losses on CPU, with the loss
read at log steps and saves only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spotrun.local.harness import free_port, loss_history

pytestmark = pytest.mark.slow
BARE_LOOP = Path(__file__).resolve().parents[2] / "benchmarks" / "bare_loop.py"


def test_trainer_losses_are_bitwise_those_of_a_bare_fsdp2_loop(baseline, tmp_path):
    out = tmp_path / "bare.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                          str(free_port()), str(BARE_LOOP), "--sm-root", str(baseline.root / "sm"), "--out",
                          str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    bare = {int(step): float.fromhex(v) for step, v in json.loads(out.read_text())["losses"].items()}
    assert len(bare) == 24
    assert loss_history(baseline.output) == bare  # exact floats, every step


def test_the_history_is_written_at_log_steps_and_saves_and_covers_every_step(baseline):
    # log_every=4 and a save every 4 steps: the trainer reads the loss six times in 24 steps, yet every step is
    # in the history, in order, once.
    lines = [json.loads(line) for line in (baseline.output / "loss_history.jsonl").read_text().splitlines()]
    assert [rec["step"] for rec in lines if "loss" in rec] == list(range(1, 25))
    assert [rec["step"] for rec in lines if "val_loss" in rec] == [0, 8, 16, 24]  # the evaluations, beside them
    metric_lines = [line for line in baseline.text().splitlines() if line.startswith("step=")]
    assert [int(line.split()[0].split("=")[1]) for line in metric_lines] == [4, 8, 12, 16, 20, 24]
