"""`eval.keep_best` + `export.from=best` on several SageMaker hosts whose checkpoint directories are synced
with one prefix as SageMaker syncs them (tests/trainer/hosts.py): each host sees only its own checkpoint writes
during a job and every host's at the next start, and a file a host deletes is deleted from the prefix.

The validation set is unlike the training text, so its loss falls and then rises: the best step comes before
the last. Two hosts x two ranks run once uninterrupted (the best found in the job that exports: the failure of
issue 27) and once stopped after the best step and restarted (the best from an earlier job), with the same
losses; four hosts x one rank once stopped and restarted. Every run must export the best checkpoint's weights,
bitwise (read back from the prefix with DCP's own converter), and leave the prefix holding exactly the kept
checkpoints, each complete.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from spotrun.local.harness import loss_history, val_history
from spotrun.seams import CHECKPOINT_STEP_PREFIX, EXPORT_METADATA
from spotrun_trainer.checkpoint import committed_checkpoints

from .conftest import BASE_HP
from .hosts import Cluster, Hosts, unavailable

pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(unavailable()), reason=unavailable())]

# Four ranks x micro_batch 1 in both layouts; every other step evaluated (on the first 8 samples), so a new best
# gets its own checkpoint.
HP = {**BASE_HP, "training.micro_batch": 1, "max_steps": 12, "eval.every_steps": 2, "eval.max_batches": 8,
      "eval.keep_best": True, "export.from": "best", "training.lr": 1e-2, "checkpoint.interval_steps": 4,
      "checkpoint.keep": 2}
LAST = HP["max_steps"]


def _cluster(hosts: Hosts, root: Path, assets: dict, validation: Path, nproc: int) -> Cluster:
    return Cluster(hosts, root, hyperparameters={**HP, "nproc_per_node": nproc},
                   channels={"train": assets["data"], "model": assets["model"], "validation": validation})


def _best_step(job: Cluster) -> int:
    meta = json.loads((job.output / EXPORT_METADATA).read_text())["evaluation"]
    vals = val_history(job.output)
    best = min((s for s in vals if s > 0), key=vals.get)
    assert (meta["weights"], meta["exported_step"], meta["val_loss"]) == ("best", best, vals[best])
    return best


def _checkpoint_weights(prefix: Path, step: int, tmp: Path) -> dict[str, torch.Tensor]:
    out = tmp / f"step-{step}.pt"
    dcp_to_torch_save(prefix / f"{CHECKPOINT_STEP_PREFIX}{step:08d}", out)
    return torch.load(out, weights_only=False)["model"]


def _assert_exports_the_checkpoint(job: Cluster, step: int, tmp: Path) -> None:
    exported = load_file(job.output / "model.safetensors")
    saved = _checkpoint_weights(job.prefix.root, step, tmp)
    assert exported and exported.keys() <= saved.keys(), sorted(exported.keys() - saved.keys())
    for key, tensor in exported.items():
        assert tensor.equal(saved[key]), key


def _assert_prefix_holds_exactly(job: Cluster, steps: set[int]) -> None:
    """Every step-* folder of the prefix is a complete checkpoint, and they are `steps`."""
    folders = sorted(p.name for p in job.prefix.root.iterdir() if p.name.startswith(CHECKPOINT_STEP_PREFIX))
    complete = sorted(step for step, _ in committed_checkpoints(job.prefix.root))
    assert folders == [f"{CHECKPOINT_STEP_PREFIX}{s:08d}" for s in complete], (folders, complete)
    assert set(complete) == steps, (complete, steps)


def _wait_past_best(proc, job: Cluster, timeout: float = 400) -> int:
    """The best step once a later evaluation came out worse (the best checkpoint is saved by then)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        vals = {step: loss for step, loss in val_history(job.output).items() if step > 0}
        best = min(vals, key=vals.get) if vals else 0
        if vals and max(vals) > best:
            return best
        assert proc.poll() is None, job.texts()
        time.sleep(0.05)
    raise TimeoutError(job.texts())


def _stopped_after_the_best_and_restarted(hosts: Hosts, job: Cluster) -> int:
    """Stop every host once the validation loss has turned up (a spot interruption), then restart; the best."""
    procs = job.start()
    best = _wait_past_best(procs[0], job)
    for proc in procs:  # SageMaker stops every instance of the job
        hosts.stop(proc)
    assert job.finish(procs) == [0] * len(procs), job.texts()
    stopped = max(loss_history(job.output))
    assert best < stopped < LAST, (best, stopped)
    assert {best, stopped} <= {step for step, _ in committed_checkpoints(job.prefix.root)}
    assert job.run() == [0] * len(procs), job.texts()
    assert f"start_step={stopped}" in job.text(0)
    assert _best_step(job) == best
    return best


@pytest.fixture
def make_hosts():
    made: list[Hosts] = []

    def make(count: int) -> Hosts:
        made.append(Hosts(count))
        try:
            made[-1].create()
        except RuntimeError as exc:
            pytest.skip(f"network namespaces cannot be made here: {exc}")
        return made[-1]

    yield make
    for hosts in made:
        hosts.close()


def test_two_hosts_export_the_best_checkpoint_bitwise_with_and_without_a_restart_after_it(
        make_hosts, assets, unrelated_validation, tmp_path):
    hosts = make_hosts(2)
    reference = _cluster(hosts, tmp_path / "reference", assets, unrelated_validation, nproc=2)
    assert reference.run() == [0, 0], reference.texts()
    best = _best_step(reference)
    assert best < LAST - 4, best  # before the last and before the newest two checkpoints
    _assert_exports_the_checkpoint(reference, best, tmp_path)  # this job's best: from memory
    _assert_prefix_holds_exactly(reference, {best, LAST - 4, LAST})

    job = _cluster(hosts, tmp_path / "restarted", assets, unrelated_validation, nproc=2)
    assert _stopped_after_the_best_and_restarted(hosts, job) == best
    assert loss_history(job.output) == loss_history(reference.output)
    _assert_exports_the_checkpoint(job, best, tmp_path)  # the earlier job's best: from its checkpoint
    _assert_prefix_holds_exactly(job, {best, LAST - 4, LAST})


def test_four_hosts_stopped_after_the_best_and_restarted_export_the_best_checkpoint_bitwise(
        make_hosts, assets, unrelated_validation, tmp_path):
    hosts = make_hosts(4)
    job = _cluster(hosts, tmp_path / "restarted", assets, unrelated_validation, nproc=1)
    best = _stopped_after_the_best_and_restarted(hosts, job)
    assert best < LAST - 4, best
    _assert_exports_the_checkpoint(job, best, tmp_path)
    _assert_prefix_holds_exactly(job, {best, LAST - 4, LAST})
