"""Spot-proof checkpoints end to end: stop and kill mid-run, restart, and get the same run bitwise."""

from __future__ import annotations

import json
import shutil
import signal

import pytest
from safetensors.torch import load_file

from spotrun.local.harness import kill_tree, loss_history, wait_for_step
from spotrun_trainer.checkpoint import committed_checkpoints

pytestmark = pytest.mark.slow


def assert_same_run(job, baseline) -> None:
    assert loss_history(job.output) == loss_history(baseline.output)  # exact floats, every step
    ours, ref = load_file(job.output / "model.safetensors"), load_file(baseline.output / "model.safetensors")
    assert ours.keys() == ref.keys()
    for key in ref:
        assert ours[key].equal(ref[key]), key


def test_sigterm_saves_agreed_step_exits_cleanly_and_resume_is_bitwise_identical(job_factory, baseline):
    job = job_factory("sigterm")
    proc = job.start()
    assert wait_for_step(proc, job.output, 10)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0, job.text()[-3000:]  # a clean save-and-stop is success
    assert not job.failure.exists()
    assert "Traceback" not in job.text() and "SignalException" not in job.text()  # torchrun saw a clean exit
    stopped = [l for l in job.text().splitlines() if l.startswith("run_stopped")]
    assert len(stopped) == 1
    stop_step = int(stopped[0].split()[1].split("=")[1])
    assert stop_step < 24
    assert committed_checkpoints(job.ckpt)[0][0] == stop_step  # the emergency save is the newest checkpoint

    assert job.run() == 0, job.text()[-3000:]
    assert f"start_step={stop_step}" in job.text()
    assert_same_run(job, baseline)


def test_sigterm_while_starting_exits_cleanly_without_a_failure(job_factory):
    import time

    job = job_factory("early-stop")
    proc = job.start()
    deadline = time.monotonic() + 60
    while "launch:" not in (job.text() if job.log.exists() else "") and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)  # workers are importing torch or building the model: no step has run
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0, job.text()[-3000:]
    assert not job.failure.exists()
    assert "run_completed" not in job.text()
    assert committed_checkpoints(job.ckpt) == []  # nothing new to save: the notice is spent exiting


def test_sigkill_of_the_whole_process_tree_then_restart_is_bitwise_identical(job_factory, baseline):
    job = job_factory("sigkill")
    proc = job.start()
    assert wait_for_step(proc, job.output, 14)
    kill_tree(proc)
    newest = committed_checkpoints(job.ckpt)[0][0]
    assert 4 <= newest <= 14

    assert job.run() == 0, job.text()[-3000:]
    assert f"start_step={newest}" in job.text()
    assert_same_run(job, baseline)


def test_damaged_newest_checkpoint_falls_back_and_two_rank_checkpoint_resumes_on_one_rank(job_factory, baseline):
    job = job_factory("one-rank", nproc_per_node=1, micro_batch=4)  # same global batch as 2 x 2
    shutil.copytree(baseline.ckpt, job.ckpt)
    steps = [s for s, _ in committed_checkpoints(job.ckpt)]
    assert steps == [24, 20]
    shard = job.ckpt / "step-00000024" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2: len(data) // 2 + 64] = bytes(64)
    shard.write_bytes(bytes(data))

    assert job.run() == 0, job.text()[-3000:]
    text = job.text()
    assert "checkpoint step-00000024 skipped: __1_0.distcp content hash differs" in text
    assert "start_step=20" in text and "world=1" in text
    assert "saved by 2 ranks, resuming on 1" in text
    assert json.loads((job.output / "metrics.json").read_text())["steps"] == 24
    # Resharded model + optimizer and the same samples continue the same optimisation: the first resumed step's
    # loss matches the uninterrupted run's up to summation order (not bitwise: one rank reduces differently).
    assert loss_history(job.output)[21] == pytest.approx(loss_history(baseline.output)[21], rel=1e-4)
