"""`eval.keep_best` + `export.weights=best` on several SageMaker hosts whose checkpoint directories are synced
with one prefix as SageMaker syncs them (tests/trainer/hosts.py): each host sees only its own checkpoint writes
during a job and every host's at the next start, and a file a host deletes is deleted from the prefix.

The validation set is unlike the training text, so its loss falls and then rises: the best step comes before
the last. Two hosts x two ranks and four hosts x one rank, each run once uninterrupted and once stopped after
the best step and restarted. Every run must export the best checkpoint's weights, bitwise (read back from the
prefix with DCP's own converter), and leave the prefix holding exactly the kept checkpoints, each complete.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from spotrun.local.harness import loss_history, val_history, wait_for_step
from spotrun.seams import CHECKPOINT_STEP_PREFIX, EXPORT_METADATA
from spotrun_trainer.checkpoint import committed_checkpoints

from .conftest import BASE_HP
from .hosts import Cluster, Hosts, unavailable

pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(unavailable()), reason=unavailable())]

# Four ranks x micro_batch 1 in both layouts; every other step evaluated, so a new best gets its own checkpoint.
HP = {**BASE_HP, "micro_batch": 1, "max_steps": 24, "eval.every_steps": 2, "eval.keep_best": True,
      "export.weights": "best", "optim.lr": 1e-2, "checkpoint.interval_steps": 4, "checkpoint.keep": 2}
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


@pytest.mark.parametrize("count,nproc", [(2, 2), (4, 1)])
def test_hosts_export_the_best_checkpoint_bitwise_with_and_without_a_restart_after_it(
        count, nproc, assets, unrelated_validation, tmp_path):
    hosts = Hosts(count)
    try:
        hosts.create()
    except RuntimeError as exc:
        hosts.close()
        pytest.skip(f"network namespaces cannot be made here: {exc}")
    try:
        reference = _cluster(hosts, tmp_path / "reference", assets, unrelated_validation, nproc)
        assert reference.run() == [0] * count, reference.texts()
        best = _best_step(reference)
        assert best < LAST - 4, best  # before the last and before the newest two checkpoints
        _assert_exports_the_checkpoint(reference, best, tmp_path)
        _assert_prefix_holds_exactly(reference, {best, LAST - 4, LAST})

        job = _cluster(hosts, tmp_path / "restarted", assets, unrelated_validation, nproc)
        procs = job.start()
        assert wait_for_step(procs[0], job.output, best + 2), job.texts()
        for proc in procs:  # a spot interruption: SageMaker stops every instance
            hosts.stop(proc)
        assert job.finish(procs) == [0] * count, job.texts()
        stopped = max(loss_history(job.output))
        assert best + 2 <= stopped < LAST, stopped
        assert {best, stopped} <= {step for step, _ in committed_checkpoints(job.prefix.root)}

        assert job.run() == [0] * count, job.texts()
        assert f"start_step={stopped}" in job.text(0)
        assert _best_step(job) == best
        assert loss_history(job.output) == loss_history(reference.output)
        _assert_exports_the_checkpoint(job, best, tmp_path)
        for key, tensor in load_file(reference.output / "model.safetensors").items():
            assert load_file(job.output / "model.safetensors")[key].equal(tensor), key
        _assert_prefix_holds_exactly(job, {best, LAST - 4, LAST})
    finally:
        hosts.close()
