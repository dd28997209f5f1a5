"""The causal-LM loss: Hugging Face's own, or a chunked cross-entropy that never holds full-vocabulary logits.

HF's loss computes `lm_head(hidden)` for every token and upcasts the logits to fp32 before the cross-entropy: for
a 128k vocabulary and 8k tokens per sample that is 128k x 8k x 4 B = ~4 GB per sample, held until backward. The
chunked loss runs the head and the cross-entropy on `chunk_tokens` rows at a time under activation checkpointing,
so forward and backward hold one chunk's fp32 logits at a time (backward recomputes each chunk's head matmul:
~1/3 more head FLOPs, a small share of a step). The result equals HF's `ForCausalLMLoss` (mean over the
non-ignored next-token targets) up to float summation order.

With FSDP2 the head's weight belongs to the root unit, which FSDP2 does not reshard after forward (the root's
parameters are needed again at once in backward), so after the model's forward `lm_head.weight` is the unsharded
parameter and its gradient reaches FSDP's reduce-scatter like any other.

Token weighting (`StepTokens`): the loss of an optimizer step is the mean over every trained token of the step,
across its micro-batches and the data-parallel ranks, not a mean of per-micro-batch means (which counts a short
or prompt-only micro-batch as much as a full one). The step's target count is known on the host before any
compute (the labels are numpy); it is all-reduced once per step on a dedicated gloo group, started before the
first forward and read before the first backward, so it overlaps compute and never syncs with the device. Each
micro-batch's loss is then its token sum divided by `count / dp_ranks`: FSDP2 averages gradients over the
data-parallel ranks, so the step's gradient is exactly that of (sum over all the step's tokens) / count, as
Hugging Face Trainer's `num_items_in_batch` does (transformers' `fixed_cross_entropy` divides the summed loss by
it).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

IGNORE_INDEX = -100
# Config attributes that change the logits after the head: the chunked loss would silently differ from HF's.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def _chunk_loss_sum(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                    targets: torch.Tensor) -> torch.Tensor:
    logits = F.linear(hidden, weight, bias).float()
    return F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX, reduction="sum")


def chunked_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *,
                          chunk_tokens: int, bias: torch.Tensor | None = None,
                          normalizer: float | None = None) -> torch.Tensor:
    """Next-token cross-entropy of `hidden @ weight.T (+ bias)` against `labels` shifted by one, HF-style.

    hidden: (batch, seq, d_model) final hidden states; labels: (batch, seq) token ids, -100 ignored.
    Returns the summed loss divided by `normalizer`, or the mean over non-ignored targets when it is None (a 0-dim
    fp32 tensor), as HF's loss with and without num_items_in_batch.
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens={chunk_tokens} is invalid: expected an integer >= 1")
    targets = F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:].reshape(-1)
    flat = hidden.reshape(-1, hidden.shape[-1])
    count = (targets != IGNORE_INDEX).sum()
    total = flat.new_zeros((), dtype=torch.float32)
    for start in range(0, flat.shape[0], chunk_tokens):
        end = start + chunk_tokens
        total = total + checkpoint(_chunk_loss_sum, flat[start:end], weight, bias, targets[start:end],
                                   use_reentrant=False)
    return total / (count.clamp(min=1) if normalizer is None else normalizer)


def target_count(labels: np.ndarray) -> int:
    """The trained next-token targets of a (batch, seq) label array: -100 is ignored, and the first position of a
    row is never a target (the model predicts token t from tokens < t)."""
    return int((labels[:, 1:] != IGNORE_INDEX).sum())


class StepTokens:
    """The trained-token count of one optimizer step over all data-parallel ranks: `start(local)` before the
    step's compute, `normalizer()` before its first backward. One small CPU all-reduce per step."""

    def __init__(self, dp_ranks: int) -> None:
        self.dp_ranks = dp_ranks
        # Its own group: collectives on the stop agreement's or the checkpoint's groups must not interleave.
        self.group = dist.new_group(backend="gloo")
        self._count: torch.Tensor | None = None
        self._work = None

    def start(self, local: int) -> None:
        self._count = torch.tensor([local], dtype=torch.int64)  # exact: no float rounding of the count
        self._work = dist.all_reduce(self._count, op=dist.ReduceOp.SUM, group=self.group, async_op=True)

    def normalizer(self) -> float:
        """What each micro-batch's summed loss is divided by: the step's global count / the data-parallel ranks
        (FSDP2's gradient average over the ranks supplies the rest of the mean). A step without any trained
        token (prompt only everywhere) gives 1: its losses and gradients are 0, not NaN."""
        if self._work is not None:
            self._work.wait()
            self._work = None
        total = int(self._count.item())
        return max(total, 1) / self.dp_ranks


def check_chunked_loss_supported(model: nn.Module) -> None:
    """Refuse models whose logits are transformed after the head (soft-capping, scaling): their loss differs."""
    config = getattr(model, "config", None)
    for name in _LOGIT_TRANSFORMS:
        value = getattr(config, name, None)
        if value not in (None, 1, 1.0):
            raise ValueError(f"perf.loss=chunked: {type(model).__name__} applies {name}={value} to its logits, "
                             "which the chunked loss does not; use perf.loss=hf for this model")
    if model.get_output_embeddings() is None or getattr(model, "base_model", None) is None:
        raise ValueError(f"perf.loss=chunked: {type(model).__name__} has no output embeddings or base model; "
                         "use perf.loss=hf")


class CausalLMLoss:
    """forward(model, inputs) -> loss, by HF's loss (`hf`) or the chunked one (`chunked`).

    `inputs`: the model's keyword arguments (input_ids, labels with -100 on masked tokens: see
    TokenShardLoader.next_inputs), or a tensor of input_ids (labels = the same tokens). `normalizer`: divide the
    summed loss by it (the step's token weighting: see StepTokens); None gives the mean over this batch's targets.
    """

    def __init__(self, model: nn.Module, kind: str, chunk_tokens: int):
        self.kind, self.chunk_tokens = kind, chunk_tokens
        self._hidden: torch.Tensor | None = None
        if kind == "chunked":
            check_chunked_loss_supported(model)
            # The decoder's output is the final (normed) hidden state the head reads. A PEFT model wraps the HF
            # model: its own `base_model` is the LoRA wrapper, whose output is the logits.
            hf_model = model.get_base_model() if hasattr(model, "get_base_model") else model
            hf_model.base_model.register_forward_hook(self._capture)

    def _capture(self, _module, _args, output) -> None:
        self._hidden = output[0] if isinstance(output, tuple) else output.last_hidden_state

    def __call__(self, model: nn.Module, inputs: torch.Tensor | dict[str, torch.Tensor], *,
                 normalizer: float | None = None) -> torch.Tensor:
        if isinstance(inputs, torch.Tensor):
            inputs = {"input_ids": inputs, "labels": inputs}
        if self.kind == "hf":
            # num_items_in_batch: transformers' loss sums over the targets and divides by it.
            extra = {} if normalizer is None else {"num_items_in_batch": normalizer}
            return model(**inputs, **extra).loss
        # logits_to_keep=1: the head runs on the last position only; the loss reads the captured hidden states.
        model(input_ids=inputs["input_ids"], logits_to_keep=1)
        hidden, self._hidden = self._hidden, None
        head = model.get_output_embeddings()
        weight = head.weight
        if hasattr(weight, "full_tensor"):
            raise RuntimeError("perf.loss=chunked: lm_head.weight is still sharded after forward (its FSDP unit "
                               "resharded it); do not set reshard_after_forward on the head's unit")
        return chunked_cross_entropy(hidden, weight, inputs["labels"], chunk_tokens=self.chunk_tokens,
                                     bias=getattr(head, "bias", None), normalizer=normalizer)
