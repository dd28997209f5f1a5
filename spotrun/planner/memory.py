"""Per-GPU memory of one training rank: the model the planner plans with and the trainer checks itself against.

Stdlib only: the planner (and its Lambda) and the trainer image import the same functions. The trainer logs this
prediction beside its measured peak (GPU: `torch.cuda.max_memory_allocated`; CPU: torch's FSDPMemTracker), and
tests/trainer/test_topology.py (test_memory_model_predicts_the_measured_peak) holds the prediction to a stated
error on the CPU test models.

Bytes per parameter (spotrun.seams.BytesPerParameter) are those of the trainer's precision scheme
(spotrun_trainer.model): FSDP2 keeps the sharded
parameters in fp32 and casts the gathered copies to the compute dtype (MixedPrecisionPolicy param_dtype bf16 on GPU,
fp32 on CPU), gradients are reduced and kept in fp32, AdamW adds two fp32 moments:

    training state, full fine-tune   4 param + 4 grad + 8 Adam = 16 B, sharded over the shard group
    training state, LoRA             the compute dtype per frozen base parameter (bf16 on GPU: no fp32 master, no
                                     grad, no optimizer) + 16 per adapter parameter
    checkpoint, full fine-tune       4 param + 8 Adam = 12 B (DCP writes the fp32 shards and the moments)
    checkpoint, LoRA                 12 B per adapter parameter (the frozen base is not saved)

Per GPU, at the peak (the start of backward, or inside it with activation checkpointing):

    state           the bytes above / ranks in the shard group
    gathered        the largest FSDP unit (a decoder block, or the untied embedding or output head, which the trainer
                    shards as units of their own) unsharded in the compute dtype, its all-gather buffer and its
                    fp32 reduce-scatter input, plus one prefetched unit on GPU (FSDP2 gathers the next unit while
                    the current one computes; on CPU there is no second stream)
    activations     per token per decoder block, counted from the tensors autograd saves (Llama-shaped blocks:
                    RMSNorm keeps its fp32 input, its normalised output and the scaled output; attention keeps q, k,
                    v, its output and the fp32 log-sum-exp of SDPA's memory-efficient kernels; the SwiGLU MLP keeps
                    gate, up, silu(gate) and their product), for every block; with activation checkpointing only
                    each block's input is kept and one block is recomputed at a time
    logits          tokens x vocab x (compute dtype + the fp32 copy the loss makes when that is not fp32 + the fp32
                    log-softmax or its gradient)
    allowance       not modelled: CUDA context, NCCL buffers and allocator fragmentation; the planner adds a stated
                    allowance and keeps the total under a usable fraction of the GPU (catalog defaults)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from ..seams import BytesPerParameter
from .params import LLAMA_LIKE, Shape, shape_of

STATE_BYTES_FULL = BytesPerParameter.TRAINING_STATE_FULL
STATE_BYTES_FROZEN = BytesPerParameter.TRAINING_STATE_FROZEN
STATE_BYTES_ADAPTER = BytesPerParameter.TRAINING_STATE_ADAPTER
CHECKPOINT_BYTES_FULL = BytesPerParameter.CHECKPOINT_FULL
CHECKPOINT_BYTES_ADAPTER = BytesPerParameter.CHECKPOINT_LORA
FP32 = 4


@dataclass(frozen=True)
class ModelDims:
    """What the memory model reads of a model: a view of its Shape (spotrun/planner/params.py `shape_of`, the one
    reading of an HF config: Llama/Mistral/Qwen2 or GPT-2), with the parameter counts derived from it."""

    shape: Shape

    @classmethod
    def from_config(cls, cfg: dict) -> "ModelDims":
        return cls(shape_of(cfg))

    @property
    def arch(self) -> str:
        return "llama" if self.shape.model_type in LLAMA_LIKE else "gpt2"

    @property
    def total_params(self) -> int:
        return self.shape.total

    @cached_property  # read at every layout the planner tries
    def block_params(self) -> int:
        s = self.shape
        return sum(lin.fan_in * lin.fan_out + (lin.fan_out if lin.bias else 0) for lin in s.block_linears) + \
            s.block_other

    @property
    def embed_params(self) -> int:
        return self.shape.vocab * self.shape.hidden

    @property
    def head_params(self) -> int:
        """0 when tied to the embeddings."""
        return 0 if self.shape.tied else self.embed_params

    @cached_property
    def largest_unit_params(self) -> int:
        """The largest FSDP unit: a block, or the untied embedding/head (tied ones stay in the root unit)."""
        outside = self.total_params - self.shape.layers * self.block_params
        return max(self.block_params, outside if self.shape.tied else max(self.embed_params, self.head_params))


def block_activation_bytes_per_token(dims: ModelDims, compute_bytes: int) -> int:
    """Bytes autograd keeps per token for one decoder block without checkpointing."""
    p, h = compute_bytes, dims.shape.hidden
    q, kv = dims.shape.heads * dims.shape.head_dim, dims.shape.kv_heads * dims.shape.head_dim
    if dims.arch == "llama":
        norm = FP32 * h + 2 * p * h + FP32  # fp32 input, normalised and scaled outputs, rsqrt
        attn = p * (q + 2 * kv) + p * q + FP32 * dims.shape.heads  # q, k, v after RoPE; output; log-sum-exp
        mlp = 4 * p * dims.shape.intermediate  # gate, up, silu(gate), silu(gate) * up
        return 2 * norm + attn + mlp
    # GPT-2: LayerNorm keeps input and output (+ mean/rstd), c_attn's q/k/v, attention output, GELU in and out,
    # and the residual dropout masks (1 byte each).
    norm = 2 * p * h + 2 * FP32
    attn = p * 3 * h + p * h + FP32 * dims.shape.heads
    mlp = 2 * p * dims.shape.intermediate
    return 2 * norm + attn + mlp + 2 * h


@dataclass(frozen=True)
class MemoryEstimate:
    """Per-GPU bytes at the peak of a training step, by part."""

    state: int
    gathered: int
    activations: int
    logits: int

    @property
    def total(self) -> int:
        return self.state + self.gathered + self.activations + self.logits

    def describe(self) -> str:
        unit, scale = ("GB", 1e9) if self.total >= 1e9 else ("MB", 1e6)
        return (f"{self.total / scale:.2f} {unit} (state {self.state / scale:.2f} + gathered "
                f"{self.gathered / scale:.2f} + activations {self.activations / scale:.2f} + logits "
                f"{self.logits / scale:.2f})")


def training_state_bytes(total_params: int, trainable_params: int, method: str,
                         compute_bytes: int = STATE_BYTES_FROZEN) -> int:
    """Unsharded training state of the whole model (divide by the shard group for one GPU)."""
    if method == "lora":
        return compute_bytes * total_params + STATE_BYTES_ADAPTER * trainable_params
    return STATE_BYTES_FULL * total_params


def checkpoint_bytes(total_params: int, trainable_params: int, method: str) -> int:
    return CHECKPOINT_BYTES_ADAPTER * trainable_params if method == "lora" else CHECKPOINT_BYTES_FULL * total_params


def peak_bytes(dims: ModelDims, *, method: str = "full", trainable_params: int | None = None, shard_ranks: int,
               micro_batch: int, seq_len: int, activation_checkpointing: bool, compute_bytes: int,
               prefetch_units: int) -> MemoryEstimate:
    """The per-GPU peak of one rank in a shard group of `shard_ranks` (see the module docstring)."""
    trainable = dims.total_params if trainable_params is None else trainable_params
    p = compute_bytes
    state = -(-training_state_bytes(dims.total_params, trainable, method, p) // shard_ranks)
    unit = dims.largest_unit_params
    reduce = FP32 if method == "full" else 0  # LoRA reduce-scatters only the (small) adapter gradients
    gathered = unit * (2 * p + reduce) + prefetch_units * unit * 2 * p
    tokens = micro_batch * seq_len
    block = block_activation_bytes_per_token(dims, p)
    final_norm = FP32 * dims.shape.hidden + 2 * p * dims.shape.hidden + FP32
    if activation_checkpointing:
        kept = dims.shape.layers * p * dims.shape.hidden + block  # each block's input, one block recomputed
    else:
        kept = dims.shape.layers * block
    activations = tokens * (kept + final_norm)
    logits = tokens * dims.shape.vocab * (p + FP32 + (FP32 if p != FP32 else 0))
    return MemoryEstimate(state=state, gathered=gathered, activations=activations, logits=logits)
