"""BestWeights: the weights of the best validation step, kept in memory for `export.from=best`.

NOTE (multi-host): SageMaker uploads each host's checkpoint directory to the one S3 prefix while a job runs and
copies the prefix down only when a job starts. A checkpoint written during this job is therefore only partly on
each host (each has its own ranks' shards; DCP's `.metadata` and the manifest are on global rank 0's host only)
and cannot be loaded again until the next start. So when a new best is found, every rank copies its own shard of
the model's weights (the part of the state the checkpoint manager saves: `model_options`) into CPU memory, and the
export restores them from there: no rank reads a file another host wrote. A best from an earlier job of the run
was in the prefix when this job started, so every host has all of it: that one is loaded from its checkpoint
(CheckpointManager.load_model).

Cost: one CPU copy of this rank's shard of the trained parameters (parameters x 4 bytes / ranks in a full run,
the adapters in a LoRA run), taken on the training thread at each new best: a memory copy, no collective.
"""

from __future__ import annotations

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict
from torch.distributed.tensor import DTensor


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class BestWeights:
    """`capture(step)` at a new best, `restore()` before the export; every rank calls both (its own shard)."""

    def __init__(self, model: torch.nn.Module, options: StateDictOptions | None):
        self.model, self.options = model, options
        self.step: int | None = None
        self._shards: dict[str, torch.Tensor] = {}

    def capture(self, step: int) -> None:
        """Copy this rank's shard of the weights (as the checkpoint of `step` holds them) into CPU memory."""
        state = get_model_state_dict(self.model, options=self.options)
        self._shards = {key: _local(value).detach().to("cpu", copy=True) for key, value in state.items()}
        self.step = step

    def restore(self) -> None:
        """Put the captured weights back into the model, in place (the same path as loading a checkpoint: the
        state dict's local tensors are filled, then set_model_state_dict)."""
        if self.step is None:
            raise RuntimeError("BestWeights.restore: nothing was captured")
        state = get_model_state_dict(self.model, options=self.options)
        if state.keys() != self._shards.keys():
            raise RuntimeError(f"BestWeights.restore: the model's keys changed since step {self.step}")
        with torch.no_grad():
            for key, value in state.items():
                _local(value).copy_(self._shards[key])
        set_model_state_dict(self.model, state, options=self.options)
