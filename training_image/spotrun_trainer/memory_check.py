"""The planner's memory model (spotrun.planner.memory) against this rank's measured peak, logged side by side.

Measured: on GPU `torch.cuda.max_memory_allocated` (the caching allocator's figure for tensors). On CPU torch keeps
no allocator statistics, so with `memory_probe` on, one step runs under torch's own FSDPMemTracker
(torch.distributed._tools.fsdp2_mem_tracker: a dispatch mode that counts every live tensor storage, by kind).
The step after the first is probed: the first step has no optimizer state yet (AdamW allocates it lazily).
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)

PROBED_STEP = 2  # the second step this process runs (counted from 1)


def predict(hf_config, *, shard_ranks: int, micro_batch: int, seq_len: int, activation_checkpointing: bool,
            compute_dtype: torch.dtype, device: torch.device, method: str = "full",
            trainable_params: int | None = None):
    """The memory model's MemoryEstimate for this rank, or None when it has none for this model."""
    try:
        from spotrun.planner.memory import ModelDims, peak_bytes  # optional: a log line, never a failure
    except ImportError:  # NOTE: the image must install the spotrun package beside the trainer
        log.warning("memory model: the spotrun package is not installed in this image: no prediction to log")
        return None
    try:
        dims = ModelDims.from_config(hf_config.to_dict())
    except (ValueError, KeyError, TypeError) as exc:  # a model type the memory model does not know
        log.info("memory model: no prediction for %s (%s)", getattr(hf_config, "model_type", "?"), exc)
        return None
    return peak_bytes(dims, method=method, trainable_params=trainable_params, shard_ranks=shard_ranks,
                      micro_batch=micro_batch, seq_len=seq_len, activation_checkpointing=activation_checkpointing,
                      compute_bytes=torch.empty((), dtype=compute_dtype).element_size(),
                      prefetch_units=1 if device.type == "cuda" else 0)


class PeakProbe:
    """Measures this rank's peak bytes: the whole run on GPU, one probed step on CPU (when enabled)."""

    def __init__(self, model, optimizer, device: torch.device, enabled: bool):
        self.model, self.optimizer, self.device = model, optimizer, device
        self.enabled = enabled and device.type == "cpu"
        self.cpu_peak: int | None = None
        self.steps = 0
        self._tracker = None

    def begin_step(self) -> None:
        """Call before each optimizer step's forward passes; `end_step` after optimizer.step()."""
        self.steps += 1
        if self.enabled and self.steps == PROBED_STEP:
            # a private torch module, loaded only when memory_probe is on
            from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

            self._tracker = FSDPMemTracker(self.model, self.optimizer)
            self._tracker.__enter__()

    def end_step(self) -> bool:
        """True right after the probed step (the moment to report)."""
        tracker, self._tracker = self._tracker, None
        if tracker is not None:
            tracker.__exit__(None, None, None)
            self.cpu_peak = int(sum(d["Total"] for d in tracker.get_tracker_snapshot("peak").values()))
        return self.steps == PROBED_STEP

    def measured(self) -> tuple[int | None, str]:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device), "cuda.max_memory_allocated"
        if self.cpu_peak is not None:
            return self.cpu_peak, "FSDPMemTracker"
        return None, "none (CPU: set memory_probe=true to measure one step)"


def report_line(predicted, measured: int | None, source: str) -> str:
    """One parseable line: `memory predicted_gb=... measured_gb=... ratio=... source=... parts=...`."""
    pred = f"{predicted.total / 1e9:.6f}" if predicted else "na"
    meas = f"{measured / 1e9:.6f}" if measured is not None else "na"
    ratio = f"{predicted.total / measured:.3f}" if predicted and measured else "na"
    parts = predicted.describe() if predicted else "no prediction"
    return f"memory predicted_gb={pred} measured_gb={meas} ratio={ratio} source={source} parts={parts}"
