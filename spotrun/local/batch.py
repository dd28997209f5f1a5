"""The batch of a local run: the plan's samples per optimizer step, spread over this machine's worker processes.

On SageMaker every GPU of the planned layout adds `training.micro_batch x training.grad_accum` samples to each
optimizer step (the estimate's `batch` row: `global_batch_samples`). `spotrun local` stands in for those GPUs with
`--nproc` workers (2 by default, 1 when the plan's samples per step are odd), so it gives each worker its share of
the plan's samples per step: the run has the plan's steps, learning-rate schedule and samples per step, as on AWS.
The plan's micro-batch is kept when it divides a worker's share, otherwise the largest micro-batch that does, with
the accumulation making up the rest. A share that is not a whole number of samples is refused before anything
starts. `--set training.micro_batch=N` or `--set training.grad_accum=N` sets a worker's own values instead, and the
batch line says what they give.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..contract.spec import RunValidationError
from ..seams import Plan
from ..settings.checks import ConfigError
from ..settings.tree import TrainConfig
from ..settings.wire import flatten, parse

DEFAULT_WORKERS = 2  # without --nproc: the local stand-in for the planned GPUs
# the trainer's settings that make a worker's share of a step: `--set` of either keeps the user's values
BATCH_KEYS = ("training.micro_batch", "training.grad_accum")


@dataclass(frozen=True)
class LocalBatch:
    micro_batch: int
    grad_accum: int
    nproc: int
    planned_samples: int  # the plan's samples per optimizer step (0: a plan that does not say)
    planned_layout: str  # the plan's own per-GPU batch and GPUs, as the estimate's batch row says them
    set_by_user: bool  # --set named training.micro_batch or training.grad_accum
    fewer_workers: bool = False  # without --nproc: fewer than DEFAULT_WORKERS, which cannot share the plan's samples

    @property
    def samples_per_step(self) -> int:
        return self.nproc * self.micro_batch * self.grad_accum

    def line(self) -> str:
        """What the run will do, said before it starts (beside the estimate's figures)."""
        mine = (f"{self.samples_per_step} samples per optimizer step: {self.nproc} worker"
                f"{'' if self.nproc == 1 else 's'} x training.micro_batch={self.micro_batch} x "
                f"training.grad_accum={self.grad_accum}")
        if self.samples_per_step == self.planned_samples:
            fewer = (f"; {DEFAULT_WORKERS} workers cannot share {self.planned_samples} (--nproc sets the workers)"
                     if self.fewer_workers else "")
            return f"batch: {mine}, the plan's ({self.planned_layout}){fewer}"
        why = " (set by --set)" if self.set_by_user else ""
        return f"batch: {mine}{why}, not the plan's {self.planned_samples} ({self.planned_layout})"


def local_batch(planned: Plan, settings: TrainConfig, nproc: int | None, overrides: dict[str, str]) -> LocalBatch:
    """The workers' micro_batch and grad_accum that keep the plan's samples per step on `nproc` workers
    (`settings`: the plan's hyperparameters, parsed), or the user's when `--set` names either. `nproc` None (no
    `--nproc`): DEFAULT_WORKERS, or the most below it that share the plan's samples (1 for an odd number)."""
    mb, ga = settings.training.micro_batch, settings.training.grad_accum
    planned_samples = planned.estimate.global_batch_samples
    gpus = planned_samples // (mb * ga) if planned_samples else 0
    layout = (f"training.micro_batch={mb} x training.grad_accum={ga} per GPU on {gpus} GPU{'' if gpus == 1 else 's'}"
              f", {planned.instance_count} x {planned.instance_type}")
    user = {key: overrides[key] for key in BATCH_KEYS if key in overrides}
    if user:
        try:  # a worker's values as set (a value the trainer refuses is the launcher check's to name)
            mine = parse({**flatten(settings), **user}).training
            mb, ga = mine.micro_batch, mine.grad_accum
        except ConfigError:
            pass
    fewer = False
    if nproc is None:
        nproc = DEFAULT_WORKERS if user or not planned_samples else \
            max(n for n in range(1, DEFAULT_WORKERS + 1) if planned_samples % n == 0)
        fewer = nproc < DEFAULT_WORKERS
    if user or not planned_samples:
        return LocalBatch(mb, ga, nproc, planned_samples, layout, bool(user))
    if planned_samples % nproc:
        fits = [n for n in range(1, planned_samples + 1) if planned_samples % n == 0 and n <= 16]
        raise RunValidationError("--nproc", nproc, f"a number of workers that divides the plan's {planned_samples} "
                                 f"samples per optimizer step ({layout}), so that each worker trains a whole share "
                                 f"of them: one of {', '.join(map(str, fits))}; or --set training.micro_batch and "
                                 "training.grad_accum per worker (the run then has another batch than the plan's)")
    share = planned_samples // nproc
    micro = mb if share % mb == 0 else math.gcd(share, mb)
    return LocalBatch(micro, share // micro, nproc, planned_samples, layout, False, fewer)


def with_batch(settings: TrainConfig, batch: LocalBatch) -> TrainConfig:
    """The trainer's settings with the workers' micro_batch and grad_accum."""
    return replace(settings, training=replace(settings.training, micro_batch=batch.micro_batch,
                                              grad_accum=batch.grad_accum))
