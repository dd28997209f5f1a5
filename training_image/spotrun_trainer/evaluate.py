"""Validation loss: the mean next-token loss over every trained token of the validation set.

`ValidationSet` reads the prepared validation shards in index order (no shuffling) as `seq_len` samples, cut to
the first `max_batches * micro_batch` samples when asked: the same samples whatever the number of ranks. Global
batch b (micro_batch x ranks samples) gives rank r its r-th slice; ranks whose slice runs past the end get rows
of ignored labels, so every rank runs the same number of forwards (FSDP's all-gathers are collectives).

`Evaluator.run` sums each rank's token losses (float64) and trained-token counts, and sums both over the ranks
once at the end, in rank order (agreement.rank_ordered_sum): the value is the same after any resume (same
weights, same samples) and, within float summation order, the same on any number of ranks. Dropout is off
(model.eval()) and no random number is drawn, so the training RNG streams are untouched. A stop requested
during the evaluation is agreed across ranks before each forward (a small CPU all-reduce on its own gloo
group, overlapping the forward): the evaluation is abandoned at once and the caller saves and exits; the
resumed run evaluates that step again.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from spotrun.settings.sections import EvalConfig

from .agreement import rank_ordered_sum
from .data import DataError, TokenShardLoader
from .loss import IGNORE_INDEX, CausalLMLoss, target_count


class ValidationSet:
    """One rank's share of the validation samples, as micro-batches of model inputs."""

    def __init__(self, data_dir: Path, *, seq_len: int, micro_batch: int, dp_rank: int, dp_size: int,
                 max_batches: int = 0):
        try:
            self.reader = TokenShardLoader(Path(data_dir), seq_len=seq_len, micro_batch=1, dp_rank=0, dp_size=1,
                                           seed=0)
        except DataError as exc:
            raise DataError(f"data.validation_path: {exc}") from None
        rows = [(s, i) for s, n in enumerate(self.reader.samples_per_shard) for i in range(n)]
        self.rows = rows[: max_batches * micro_batch] if max_batches else rows
        self.micro_batch, self.dp_rank, self.dp_size, self.seq_len = micro_batch, dp_rank, dp_size, seq_len
        self.batches_per_rank = math.ceil(len(self.rows) / (micro_batch * dp_size))

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        global_batch = self.micro_batch * self.dp_size
        for b in range(self.batches_per_rank):
            start = b * global_batch + self.dp_rank * self.micro_batch
            rows = self.rows[start : start + self.micro_batch]
            inputs = self.reader.inputs_for(rows) if rows else None
            yield self._padded(inputs, self.micro_batch - len(rows))

    def _padded(self, inputs: dict[str, np.ndarray] | None, missing: int) -> dict[str, np.ndarray]:
        """Fill a short micro-batch with rows that train nothing (ignored labels), keeping its shape."""
        if not missing:
            return inputs
        ids = np.zeros((missing, self.seq_len), dtype=np.int64)
        pad = {"input_ids": ids, "labels": np.full_like(ids, IGNORE_INDEX)}
        if inputs is None:
            return pad
        return {k: np.concatenate([inputs[k], pad[k]]) for k in ("input_ids", "labels")}


@dataclass(frozen=True)
class EvalResult:
    step: int
    loss: float  # mean over the trained tokens
    tokens: int
    seconds: float

    @property
    def perplexity(self) -> float:
        return math.exp(min(self.loss, 700.0))  # exp overflows a float past ~709


class Evaluator:
    """`run(step, stop_requested)`: the validation loss of the model as it is now, or None when a stop came."""

    def __init__(self, cfg: EvalConfig, valset: ValidationSet, *, model: torch.nn.Module, loss_fn: CausalLMLoss,
                 device: torch.device):
        self.cfg, self.valset, self.model, self.loss_fn, self.device = cfg, valset, model, loss_fn, device
        self.group = dist.new_group(backend="gloo")  # the stop agreement during evaluation (every rank creates it)
        self._last_t = time.monotonic()
        self.batches_done = 0  # of the latest run: all of them, or where a stop cut it short

    def due(self, step: int, *, total_steps: int, log_step: bool) -> bool:
        """Evaluate after `step`? On the step schedule and at the end (the same on every rank); on the minutes
        schedule at log steps, agreed across ranks (rank 0's clock decides)."""
        if step == total_steps or (self.cfg.every_steps and step % self.cfg.every_steps == 0):
            return True
        if not (self.cfg.every_s and log_step):
            return False
        flag = torch.tensor([float(time.monotonic() - self._last_t >= self.cfg.every_s)])
        dist.broadcast(flag, src=0, group=self.group)
        return bool(flag.item())

    def run(self, step: int, stop_requested: Callable[[], bool]) -> EvalResult | None:
        t0 = time.perf_counter()
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        tokens = 0
        self.model.eval()
        self.batches_done = 0
        try:
            with torch.no_grad():
                for batch in self.valset:
                    flag = torch.tensor([float(stop_requested())])
                    work = dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
                    tokens += target_count(batch["labels"])
                    inputs = {k: torch.from_numpy(v).to(self.device, non_blocking=True) for k, v in batch.items()}
                    total += self.loss_fn(self.model, inputs, normalizer=1.0).double()  # the token sum
                    work.wait()
                    if flag.item():
                        return None
                    self.batches_done += 1
        finally:
            self.model.train()
        sums = torch.stack([total, torch.tensor(float(tokens), dtype=torch.float64, device=self.device)])
        loss_sum, count = rank_ordered_sum(sums).tolist()  # the one host read of the evaluation
        self._last_t = time.monotonic()
        return EvalResult(step=step, loss=loss_sum / max(count, 1.0), tokens=int(count),
                          seconds=time.perf_counter() - t0)
