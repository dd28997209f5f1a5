"""A new user's trial: a deadline that chose 64 GPUs planned 1024 samples per optimizer step where the run's
training.micro_batch 4 x grad_accum 4 give 16 on one GPU (64x fewer steps at the same training.lr) without a word,
and the batch row showed micro_batch 2 x grad_accum 8 with no mention of the run's 4 x 4. The estimate says so in
its text, its JSON and the estimate Lambda's answer (they share the planner's warnings); a run whose layout keeps
its batch is not warned."""

from __future__ import annotations

import json
import re
from pathlib import Path

from spotrun.cli.main import main

from .test_caps_keep_the_deadline import handler_plan
from .test_new_users_trial import BUCKET, _cli, _with

ROOT = Path(__file__).parents[2]


def _mistral(**compute) -> dict:
    example = json.loads((ROOT / "examples/runs/mistral-7b-lora.json").read_text())
    return _with(example, compute={"spot": True, **compute})


def _plan(monkeypatch, run: dict) -> dict:
    """The estimate Lambda's handler itself, with the model's config.json in the stage's bucket: the accepted
    estimate."""
    out = handler_plan(monkeypatch, run, {"models/mistral-7b/config.json": json.dumps(run["model"]["config"])})
    assert "estimate" in out, out
    return out["estimate"]


def _batch_warnings(doc: dict) -> list[str]:
    return [w for w in doc["warnings"] if "samples per optimizer step" in w]


def _samples_per_step(doc: dict) -> int:
    return doc["global_batch_samples"]


def test_a_deadline_that_multiplies_the_batch_says_so_in_text_json_and_the_lambda(tmp_path, capsys, monkeypatch):
    run = _mistral(deadline_hours=0.5, on_demand_fallback=True)
    code, doc = _cli(tmp_path, capsys, "estimate", run)
    assert code == 0, doc
    planned = _samples_per_step(doc)
    written = run["training"]["micro_batch"] * run["training"]["grad_accum"]  # one GPU fits the run (no deadline)
    assert planned > written, doc  # the deadline's layout has more GPUs than the fewest that fit
    lambda_run = _with(run, model={"source": f"s3://{BUCKET}/models/mistral-7b/"},
                       data={"source": f"s3://{BUCKET}/datasets/summaries/"})  # the stage's bucket, not a placeholder
    for told in (doc, _plan(monkeypatch, lambda_run)):
        said = _batch_warnings(told)
        assert len(said) == 1, told["warnings"]
        w = said[0]
        assert f"{planned} samples per optimizer step" in w and f"give {written} on the fewest GPUs" in w, w
        assert f"{planned // written}x the run's" in w, w
        assert "compute.deadline_hours=0.5" in w and "training.micro_batch=4 x training.grad_accum=4" in w, w
        assert "training.lr=0.0002 is not scaled" in w, w
        assert "set compute.instance_type=" in w and "compute.instance_count=1" in w, w
        steps = [int(n.replace(",", "")) for n in re.findall(r"([\d,]+) optimizer steps instead of ([\d,]+)", w)[0]]
        assert abs(steps[1] / steps[0] - planned / written) < 1, w  # fewer steps by the batch's factor

    path = tmp_path / "text.json"
    path.write_text(json.dumps(run))
    assert main(["estimate", str(path)]) == 0
    text = capsys.readouterr().out
    batch_row = next(line for line in text.splitlines() if line.startswith("batch "))
    assert f"{planned} samples per step" in batch_row, batch_row
    if (doc["micro_batch"], doc["grad_accum"]) != (4, 4):
        assert "(the run wrote 4 x 4" in batch_row, batch_row
    assert [line for line in text.splitlines()
            if line.startswith("warning: ") and "samples per optimizer step" in line], text


def test_the_batch_row_names_the_run_s_micro_batch_when_the_planner_changes_it(tmp_path, capsys):
    """Without a deadline the mistral run is planned on one GPU as micro_batch 1 x grad_accum 16 (the largest
    micro-batch that fits): the row says the run wrote 4 x 4, and the batch is the run's, so no warning."""
    run = _mistral()
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    assert main(["estimate", str(path)]) == 0
    text = capsys.readouterr().out
    code, doc = _cli(tmp_path, capsys, "estimate", run)
    assert code == 0 and (doc["micro_batch"], doc["grad_accum"]) != (4, 4), doc
    assert doc["written_batch"] == {"micro_batch": 4, "grad_accum": 4}, doc
    batch_row = next(line for line in text.splitlines() if line.startswith("batch "))
    assert "(the run wrote 4 x 4" in batch_row, batch_row


def test_a_layout_that_keeps_the_run_s_batch_is_not_warned(tmp_path, capsys):
    """The run's own one-GPU layout, and a run that names 4 nodes itself: the samples per step are what the run's
    micro_batch x grad_accum give there, so nothing is said (while the deadline's layout above is warned)."""
    for run in (_mistral(), _mistral(instance_type="ml.g6e.xlarge", instance_count=4)):
        code, doc = _cli(tmp_path, capsys, "estimate", run)
        assert code == 0, doc
        assert _samples_per_step(doc) == doc["instance_count"] * 16, doc
        assert not _batch_warnings(doc), doc["warnings"]
    # 10 h with on_demand_fallback: 2 x (the deadline's layout; at 13 h without it the likeliest is now 3 x, whose
    # 48 samples per step no whole number per GPU brings to 16)
    code, doc = _cli(tmp_path, capsys, "estimate", _mistral(deadline_hours=10, on_demand_fallback=True))
    assert code == 0 and _samples_per_step(doc) > 16 and _batch_warnings(doc), doc
    w = _batch_warnings(doc)[0]
    # 2 GPUs: halving the samples per GPU keeps the run's 16 per step
    assert "lower the samples per GPU to 8" in w and "training.grad_accum=2" in w, w
