"""Spot-proof checkpoints end to end: stop and kill mid-run, restart, and get the same run bitwise."""

from __future__ import annotations

import fcntl
import io
import json
import os
import shutil
import signal
import struct
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from spotrun.local.harness import descendants, kill_tree, loss_history, wait_for_step
from spotrun_trainer.checkpoint import committed_checkpoints

from .conftest import LORA_HP, assert_same_run

pytestmark = pytest.mark.slow


def test_sigterm_saves_agreed_step_exits_cleanly_and_resume_is_bitwise_identical(job_factory, baseline):
    job = job_factory("sigterm")
    proc = job.start()
    assert wait_for_step(proc, job.output, 10)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0, job.text()[-3000:]  # a clean save-and-stop is success
    assert not job.failure.exists()
    assert "Traceback" not in job.text() and "SignalException" not in job.text()  # torchrun saw a clean exit
    stopped = [line for line in job.text().splitlines() if line.startswith("run_stopped")]
    assert len(stopped) == 1
    stop_step = int(stopped[0].split()[1].split("=")[1])
    assert stop_step < 24
    assert committed_checkpoints(job.ckpt)[0][0] == stop_step  # the emergency save is the newest checkpoint

    assert job.run() == 0, job.text()[-3000:]
    assert f"start_step={stop_step}" in job.text()
    assert_same_run(job, baseline)


def test_sigterm_while_starting_exits_cleanly_without_a_failure(job_factory):
    job = job_factory("early-stop")
    proc = job.start()
    deadline = time.monotonic() + 120
    while len(_workers(proc)) < 2:  # both workers exist: importing torch or building the model, no step yet
        assert proc.poll() is None and time.monotonic() < deadline, job.text()[-3000:]
        time.sleep(0.05)
    assert "launch:" in job.text() and "run_start" not in job.text()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0, job.text()[-3000:]
    assert not job.failure.exists()
    assert "run_completed" not in job.text()
    assert committed_checkpoints(job.ckpt) == []  # nothing new to save: the notice is spent exiting


def _workers(proc) -> list[int]:
    """The training worker processes under a launcher (torchrun's children running spotrun_trainer.train)."""
    found = []
    for pid in descendants(proc.pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"spotrun_trainer.train" in cmdline and b"torch.distributed.run" not in cmdline:
            found.append(pid)
    return found


@pytest.mark.parametrize("method", ["full", "lora"])
def test_sigkill_of_the_whole_process_tree_then_restart_is_bitwise_identical(job_factory, request, method):
    reference = request.getfixturevalue("baseline" if method == "full" else "lora_baseline")
    job = job_factory(f"sigkill-{method}", **(LORA_HP if method == "lora" else {}))
    proc = job.start()
    assert wait_for_step(proc, job.output, 14)
    kill_tree(proc)
    newest = committed_checkpoints(job.ckpt)[0][0]
    assert 4 <= newest <= 14

    assert job.run() == 0, job.text()[-3000:]
    assert f"start_step={newest}" in job.text()
    assert_same_run(job, reference, method)


def test_damaged_newest_checkpoint_falls_back_and_two_rank_checkpoint_resumes_on_one_rank(job_factory, baseline):
    job = job_factory("one-rank", nproc_per_node=1, **{"training.micro_batch": 4})  # same global batch as 2 x 2
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


# ---- the trainer's own edges: storage that fails, a run that diverges, a stop during the export ----------------

EIO_FILE = "/proc/self/mem"  # reading it at offset 0 fails with EIO: a real kernel I/O error, even for root


def test_unreadable_newest_checkpoint_stops_the_run_and_keeps_both_checkpoints(job_factory, baseline):
    job = job_factory("unreadable")
    shutil.copytree(baseline.ckpt, job.ckpt)
    manifest = job.ckpt / "step-00000024" / "manifest.json"
    manifest.unlink()
    manifest.symlink_to(EIO_FILE)

    assert job.run() == 1, job.text()[-3000:]
    failure = job.failure.read_text()
    assert failure.startswith("CheckpointError: checkpoint step-00000024 cannot be read (Input/output error: ")
    assert "not falling back to an older checkpoint" in failure
    assert "run_start" not in job.text()  # neither step 20 nor a fresh start was trained from
    assert sorted(p.name for p in job.ckpt.iterdir()) == ["step-00000020", "step-00000024"]  # nothing pruned
    assert manifest.is_symlink()


def test_full_disk_during_an_async_save_fails_naming_the_cause_and_the_intact_checkpoint(job_factory):
    job = job_factory("disk-full", max_steps=12)
    # Step 8's directory puts rank 1's shard on /dev/full, whose writes fail with ENOSPC. NOTE: a symlinked
    # directory, because the pruning at the start removes stray step-* directories (rmtree refuses links).
    full = job.root / "full-disk"
    full.mkdir()
    (full / "__1_0.distcp").symlink_to("/dev/full")
    job.ckpt.mkdir()
    (job.ckpt / "step-00000008").symlink_to(full, target_is_directory=True)

    assert job.run() == 1, job.text()[-3000:]
    failure = job.failure.read_text()
    assert failure.startswith("CheckpointError: checkpoint step-00000008 could not be written: no space left on "
                              "device on rank 1 ([Errno 28] No space left on device"), failure
    assert "the newest intact checkpoint is step-00000004 (a restart resumes from it)" in failure
    assert "without a worker error report" not in failure
    assert [s for s, _ in committed_checkpoints(job.ckpt)] == [4]
    assert not (job.output / "model.safetensors").exists()


@pytest.mark.parametrize("interval, max_steps, what, intact", [
    (3, 12, "the loss is nan at step 5", "the newest intact checkpoint is step-00000003"),  # caught at the loss
    (0, 4, "the weights after step 4 contain NaN or Inf", "no checkpoint of this run is intact yet"),  # final save
])
def test_diverging_run_stops_keeps_its_last_good_checkpoint_and_exports_nothing(job_factory, tmp_path, interval,
                                                                               max_steps, what, intact):
    # lr=1e5 is finite (accepted) but sends the weights to NaN after step 4 (measured: gradients are NaN at step 4)
    job = job_factory("diverge", **{"training.lr": 1e5, "checkpoint.interval_steps": interval, "max_steps": max_steps})
    assert job.run() == 1, job.text()[-3000:]
    failure = job.failure.read_text()
    assert failure.startswith(f"CheckpointError: training diverged: {what}"), failure
    assert intact in failure
    assert "run_completed" not in job.text() and not (job.output / "model.safetensors").exists()
    for step, _ in committed_checkpoints(job.ckpt):  # what was kept holds finite weights only
        dcp_to_torch_save(job.ckpt / f"step-{step:08d}", tmp_path / f"{step}.pt")
        state = torch.load(tmp_path / f"{step}.pt", weights_only=False)
        weights = [t for t in state["model"].values() if isinstance(t, torch.Tensor)]
        assert weights and all(torch.isfinite(t).all() for t in weights)
    assert [s for s, _ in committed_checkpoints(job.ckpt)] == ([3] if interval else [])


def test_sigterm_during_the_final_export_lets_it_finish_and_exits_cleanly(job_factory, baseline, tmp_path,
                                                                          tmp_path_factory):
    """A resumed job whose checkpoint is the last step goes straight to the export; a stop arriving while the
    export is being written lets it finish (it is bounded and the checkpoint already holds everything)."""
    # The export's last write (rank 0's probe logits, ~66 KB) goes into a pipe of one page that the test drains
    # only after the signal: rank 0 is held inside the export, rank 1 waits at the export's closing barrier.
    fifo = tmp_path / "probe.pt"
    os.mkfifo(fifo)
    job = job_factory("export-stop", probe_logits_path=str(fifo))
    shutil.copytree(baseline.ckpt, job.ckpt)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        fcntl.fcntl(reader, F_SETPIPE_SZ, 4096)
        proc = job.start()
        deadline = time.monotonic() + 300
        while _bytes_waiting(reader) == 0:
            assert proc.poll() is None and time.monotonic() < deadline, job.text()[-3000:]
            time.sleep(0.05)
        assert "run_completed" not in job.text()
        proc.send_signal(signal.SIGTERM)
        probe = _drain(reader, deadline)
    finally:
        os.close(reader)
    assert proc.wait(timeout=120) == 0, job.text()[-3000:]
    text = job.text()
    assert "start_step=24 total_steps=24" in text and "\nstep=" not in text  # straight to the export
    assert "run_completed step=24" in text and "exited before reporting" not in text
    assert not job.failure.exists()
    ours, ref = load_file(job.output / "model.safetensors"), load_file(baseline.output / "model.safetensors")
    assert ours.keys() == ref.keys() and all(ours[k].equal(ref[k]) for k in ref)
    ours_probe = torch.load(io.BytesIO(probe))  # the write the signal landed in was completed, intact
    ref_probe = torch.load(tmp_path_factory.getbasetemp() / "baseline-probe.pt")
    assert ours_probe["input_ids"].equal(ref_probe["input_ids"]) and ours_probe["logits"].equal(ref_probe["logits"])


F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ (Linux), absent from older Python builds
FIONREAD = 0x541B


def _bytes_waiting(fd: int) -> int:
    return struct.unpack("i", fcntl.ioctl(fd, FIONREAD, b"\0\0\0\0"))[0]


def _drain(fd: int, deadline: float) -> bytes:
    """Everything the writer sends, until it closes the pipe."""
    data = bytearray()
    while True:
        try:
            chunk = os.read(fd, 1 << 20)
        except BlockingIOError:  # the writer is still busy
            assert time.monotonic() < deadline, "the export stopped writing"
            time.sleep(0.01)
            continue
        if not chunk:
            return bytes(data)
        data += chunk
