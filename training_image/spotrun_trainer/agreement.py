"""What the ranks exchange around each training step, kept off the hot path.

- `StepAgreement`: the one collective per step. Stop requested, periodic save due and background save unfinished
  are all-reduced (MAX) as three CPU floats on a dedicated gloo group: started before the step's compute and read
  after it, so the exchange overlaps the step, and it never waits on the GPU (a CUDA tensor there would make
  every step a host sync). A dedicated group because its collectives must not interleave with FSDP's on the
  training group, nor with the background checkpoint's on its own group.
- `LossHistory`: each step's loss stays on the device; at log steps, before every save and at the end, the
  pending steps are gathered from every rank in one collective, summed in rank order and read once. Rank 0
  appends them to `loss_history.jsonl` (exact floats as hex), the record resume checks compare. Everything up
  to a checkpoint's step is in the file before that checkpoint is written, so a run killed at any moment resumes
  with no gap in the history.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Agreement:
    """What all ranks decided together for the step just run."""

    stop: bool  # a stop signal reached some rank
    save_due: bool  # a periodic save is due on some rank
    pending_done: bool  # every rank finished writing its part of the background save


class StepAgreement:
    """`start(...)` before a step, `wait()` after it: one non-blocking all-reduce per step."""

    def __init__(self) -> None:
        self.group = dist.new_group(backend="gloo")  # all ranks create it, in the same order
        self._flags: torch.Tensor | None = None
        self._work = None

    def start(self, *, stop: bool, save_due: bool, pending: bool) -> None:
        self._flags = torch.tensor([float(stop), float(save_due), float(pending)])
        self._work = dist.all_reduce(self._flags, op=dist.ReduceOp.MAX, group=self.group, async_op=True)

    def wait(self) -> Agreement:
        self._work.wait()
        stop, save_due, pending = (bool(x) for x in self._flags.tolist())
        self._work = self._flags = None
        return Agreement(stop=stop, save_due=save_due, pending_done=not pending)

    def now(self, *, stop: bool) -> bool:
        """A blocking agreement on the stop flag alone (before the first step)."""
        self.start(stop=stop, save_due=False, pending=False)
        return self.wait().stop


def rank_ordered_sum(values: torch.Tensor) -> torch.Tensor:
    """The element-wise sum of `values` over all ranks, added in rank order on every rank (a collective).

    NOTE: not `all_reduce(SUM)`: with 3 or more ranks gloo's all-reduce splits a tensor into chunks by its length
    and adds each chunk's contributions in a ring order that depends on the chunk, so one step's summed loss
    could differ in the last bit depending on how many steps were pending with it (measured with 4 ranks). A
    resumed run flushes at other moments than an uninterrupted one, so its logged losses must not depend on that.
    All-gather moves the bytes unchanged; the additions below are the same for any length."""
    gathered = [torch.empty_like(values) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, values.contiguous())
    total = gathered[0].clone()
    for part in gathered[1:]:
        total += part
    return total


class LossHistory:
    """Per-step summed losses kept on the device until read; `flush()` is a collective (every rank calls it)."""

    def __init__(self, path: Path, *, divisor: int, rank: int):
        self.path, self.divisor, self.rank = Path(path), divisor, rank
        self._steps: list[int] = []
        self._sums: list[torch.Tensor] = []

    def add(self, step: int, loss_sum: torch.Tensor) -> None:
        self._steps.append(step)
        self._sums.append(loss_sum)

    def flush(self) -> list[tuple[int, float]]:
        """Reduce the pending steps' losses across ranks, write them (rank 0); (step, mean loss) of each."""
        if not self._steps:
            return []
        means = [total / self.divisor for total in rank_ordered_sum(torch.stack(self._sums)).tolist()]
        flushed = list(zip(self._steps, means, strict=True))
        if self.rank == 0:
            with self.path.open("a") as fh:
                # Readable, and exact (float.hex) for bitwise comparisons across restarts.
                fh.writelines(json.dumps({"step": s, "loss": m, "loss_hex": m.hex()}) + "\n" for s, m in flushed)
        self._steps, self._sums = [], []
        return flushed
