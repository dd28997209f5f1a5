"""The GPU throughput presets, dry-run on CPU: each builds a valid trainer config through the launcher's code and the
model shape it names (parameter count from the model built on the meta device)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.throughput import EXPECTED_PARAMS

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("preset", sorted(EXPECTED_PARAMS))
def test_gpu_preset_dry_run_builds_the_named_model_shape(preset):
    res = subprocess.run([sys.executable, "-m", "benchmarks.throughput", "--preset", preset, "--dry-run"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    plan = json.loads(res.stdout.strip().splitlines()[-1])
    assert plan["parameters"] == pytest.approx(EXPECTED_PARAMS[preset], rel=0.01)
    # The chunked loss is what makes these shapes fit: HF's loss holds GBs of fp32 logits at a 128k vocabulary.
    assert plan["chunked_loss_logits_gb"] < plan["hf_loss_logits_gb"] / 4
    assert plan["state_gb_per_gpu"] < 80 * 0.8  # fits an 80 GB GPU with room for activations
