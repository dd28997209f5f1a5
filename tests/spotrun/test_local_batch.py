"""`spotrun local` trains the plan's samples per optimizer step (issue #30: its 2 workers each took the plan's
per-GPU batch, so every step saw twice the samples the estimate said): the workers share the plan's batch, the line
before training says so, a worker count that cannot share it is refused, and the trainer's own metrics.json records
what ran."""

from __future__ import annotations

import json

import pytest

from spotrun.cli.main import main
from spotrun.contract.spec import RunValidationError
from spotrun.local.batch import LocalBatch, local_batch, with_batch
from spotrun.local.pipeline import plan_local
from spotrun.settings.wire import parse


def _run(tmp_path, assets, training: dict) -> dict:
    run = {"version": 1, "name": "batch", "model": {"source": str(assets["model"])},
           "data": {"source": str(assets["data"]), "seq_len": 64}, "training": {"seed": 3, **training},
           "compute": {"instance_type": "ml.g5.xlarge"}, "budget": {"max_usd": 5}}
    (tmp_path / "run.json").write_text(json.dumps(run))
    return run


@pytest.mark.parametrize(("per_gpu", "nproc", "per_worker"), [
    ((8, 1), 2, (4, 1)),  # the micro-batch halves
    ((2, 4), 2, (2, 2)),  # the accumulation halves, the micro-batch stays
    ((4, 2), 8, (1, 1)),
    ((8, 1), 3, None),  # 8 samples on 3 workers: refused
    ((2, 4), 1, (2, 4)),  # one worker: the plan's own values
])
def test_the_workers_share_the_plans_samples_per_step(tmp_path, assets, per_gpu, nproc, per_worker):
    planned = plan_local(_run(tmp_path, assets, {"micro_batch": 8}))
    samples = planned.estimate.global_batch_samples
    assert samples == 8 and parse(planned.hyperparameters).training.micro_batch == 8  # one GPU: its own batch
    # the plan's values per GPU (the planner may split 8 samples so when memory is tight)
    settings = with_batch(parse(planned.hyperparameters), LocalBatch(*per_gpu, 1, samples, "", False))
    if per_worker is None:
        with pytest.raises(RunValidationError, match="--nproc=3 is invalid: expected a number of workers that "
                                                     "divides the plan's 8 samples per optimizer step"):
            local_batch(planned, settings, nproc, {})
        return
    batch = local_batch(planned, settings, nproc, {})
    assert (batch.micro_batch, batch.grad_accum) == per_worker and batch.samples_per_step == samples
    assert batch.line().startswith(f"batch: 8 samples per optimizer step: {nproc} worker")
    assert "the plan's" in batch.line() and "not the plan's" not in batch.line()


def test_without_nproc_an_odd_batch_trains_on_one_worker_and_says_why(tmp_path, assets):
    planned = plan_local(_run(tmp_path, assets, {"micro_batch": 3}))
    batch = local_batch(planned, parse(planned.hyperparameters), None, {})
    assert (batch.nproc, batch.micro_batch, batch.samples_per_step) == (1, 3, 3)
    assert batch.line().endswith("; 2 workers cannot share 3 (--nproc sets the workers)"), batch.line()
    even = plan_local(_run(tmp_path, assets, {"micro_batch": 4}))
    assert local_batch(even, parse(even.hyperparameters), None, {}).nproc == 2


def test_a_batch_set_by_hand_is_kept_and_said_to_differ_from_the_plan(tmp_path, assets):
    planned = plan_local(_run(tmp_path, assets, {"micro_batch": 2}))
    batch = local_batch(planned, parse(planned.hyperparameters), 2, {"training.grad_accum": "3"})
    assert (batch.micro_batch, batch.grad_accum, batch.samples_per_step) == (2, 3, 12)
    assert "12 samples per optimizer step" in batch.line() and "(set by --set), not the plan's 2" in batch.line()


def test_a_worker_count_that_cannot_share_the_batch_is_refused_before_any_job(tmp_path, assets, capsys):
    _run(tmp_path, assets, {"micro_batch": 3})
    code = main(["local", str(tmp_path / "run.json"), "--out", str(tmp_path / "out"), "--nproc", "2",
                 "--progress", "none", "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 2 and doc["field"] == "--nproc" and "the plan's 3 samples per optimizer step" in doc["message"]
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.slow
def test_a_local_run_trains_the_samples_per_step_the_estimate_planned(tmp_path, assets, capsys):
    """A real 2-worker run: the trainer's metrics.json says the plan's samples per step, and its tokens agree."""
    _run(tmp_path, assets, {"micro_batch": 4, "grad_accum": 1})
    planned = plan_local(json.loads((tmp_path / "run.json").read_text()))
    samples = planned.estimate.global_batch_samples
    assert samples == 4
    code = main(["local", str(tmp_path / "run.json"), "--out", str(tmp_path / "out"), "--job-name", "j",
                 "--set", "max_steps=3", "--progress", "lines"])
    out = capsys.readouterr().out
    assert code == 0, out
    metrics = json.loads((tmp_path / "out" / "j" / "sm" / "model" / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["samples_per_step"] == samples
    assert metrics["tokens"] == metrics["steps"] * samples * 64  # what each step really read
    report = json.loads((tmp_path / "out" / "j" / "report.json").read_text())
    assert report["actual"]["samples_per_step"] == report["estimate"]["samples_per_step"] == samples
    said = out.index(f"[local] batch: {samples} samples per optimizer step: 2 workers x training.micro_batch=2 x "
                     "training.grad_accum=1, the plan's")
    assert said < out.index("[local] job ")  # before training
    assert f"of {samples} samples, as planned" in out
