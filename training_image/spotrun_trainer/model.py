"""Build a Hugging Face causal LM and shard it with FSDP2.

Memory: every rank builds the model on the meta device (no storage), shards it, allocates only its own shards
(`to_empty`), and then receives the weights from rank 0, which alone materialises the full model on CPU
(`set_model_state_dict(..., broadcast_from_rank0=True)`). N ranks on a node therefore do not hold N full copies.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from .config import ModelConfig, PerfConfig

log = logging.getLogger(__name__)


def _hf_config(cfg: ModelConfig):
    from transformers import AutoConfig

    if cfg.path:
        return AutoConfig.from_pretrained(cfg.path)
    raw = dict(cfg.config)
    return AutoConfig.for_model(raw.pop("model_type"), **raw)


def _materialise_full(cfg: ModelConfig, hf_config, seed: int) -> nn.Module:
    """The full model on CPU in fp32: weights from the model directory, or initialised from `seed`."""
    from transformers import AutoModelForCausalLM

    if cfg.path:
        return AutoModelForCausalLM.from_pretrained(cfg.path, config=hf_config, dtype=torch.float32)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)


def find_blocks(model: nn.Module) -> list[nn.Module]:
    """The decoder blocks, found from the model itself.

    HF models name their block classes in `_no_split_modules` (LlamaDecoderLayer, GPT2Block, Qwen2DecoderLayer,
    ...); failing that, the longest ModuleList of same-class children is taken to be the stack of blocks.
    """
    names = set(getattr(model, "_no_split_modules", None) or [])
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if blocks:
        return blocks
    best: list[nn.Module] = []
    for m in model.modules():
        if isinstance(m, nn.ModuleList) and len(m) > len(best) and len({type(c) for c in m}) == 1:
            best = list(m)
    return best


def build_mesh(device_type: str, world: int, replicate_degree: int) -> DeviceMesh:
    """1-D (shard over every rank) on one node; 2-D hybrid sharding on several: replicate across nodes, shard
    within a node, so the per-step all-gathers and reduce-scatters stay on the node's fast links."""
    if world % replicate_degree:
        raise ValueError(f"replicate_degree={replicate_degree} does not divide the world size {world}")
    if replicate_degree == 1:
        return init_device_mesh(device_type, (world,), mesh_dim_names=("shard",))
    return init_device_mesh(device_type, (replicate_degree, world // replicate_degree),
                            mesh_dim_names=("replicate", "shard"))


def resolve_param_dtype(name: str, device_type: str) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device_type == "cuda" else torch.float32
    return {"bfloat16": torch.bfloat16, "float32": torch.float32}[name]


@dataclass
class BuiltModel:
    model: nn.Module
    blocks: list[nn.Module]
    num_params: int
    hf_config: object


def build_sharded_model(cfg: ModelConfig, *, mesh: DeviceMesh, device: torch.device, seed: int,
                        perf: PerfConfig | None = None) -> BuiltModel:
    """`perf` must be resolved for the device (PerfConfig.resolved); None: the plain defaults."""
    from transformers import AutoModelForCausalLM

    perf = perf or PerfConfig().resolved(device.type)

    hf_config = _hf_config(cfg)
    rank = dist.get_rank()
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    if cfg.activation_checkpointing:
        if not getattr(model, "supports_gradient_checkpointing", False):
            raise ValueError(f"model.activation_checkpointing: {type(model).__name__} does not support it")
        # HF's checkpointing: non-reentrant torch.utils.checkpoint with preserve_rng_state, so dropout replays
        # exactly in the recomputation (KNOWLEDGE.md: gradients matched bitwise).
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False

    blocks = find_blocks(model)
    if not blocks:
        raise ValueError(f"no decoder blocks found in {type(model).__name__}: cannot shard block by block")
    mp = MixedPrecisionPolicy(param_dtype=resolve_param_dtype(cfg.param_dtype, device.type),
                              reduce_dtype=getattr(torch, perf.reduce_dtype))
    for block in blocks:
        if perf.compile == "on":
            block.compile()  # in place: parameter names (and so checkpoint keys) stay as they are
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=perf.reshard_after_forward)
    # NOTE: the root gets no reshard_after_forward: FSDP2 then keeps its parameters (embeddings, final norm, head)
    # gathered from forward to backward, which the chunked loss relies on (loss.py).
    fully_shard(model, mesh=mesh, mp_policy=mp)
    set_prefetch(blocks, perf.prefetch_blocks)
    warn_unsharded_blocks(model, blocks)

    # Non-persistent buffers (rotary inv_freq, ...) are not in the state dict: remember their names so rank 0's
    # values can be broadcast after allocation.
    persistent = set(model.state_dict().keys())
    buffer_names = [n for n, _ in model.named_buffers() if n not in persistent]

    model.to_empty(device=device)
    full_sd: dict = {}
    full_buffers: dict[str, torch.Tensor] = {}
    if rank == 0:
        full = _materialise_full(cfg, hf_config, seed)
        full_sd = full.state_dict()
        full_buffers = dict(full.named_buffers())
        del full
    set_model_state_dict(model, full_sd, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    own_buffers = dict(model.named_buffers())
    for name in buffer_names:
        buf = own_buffers[name]
        if rank == 0:
            buf.copy_(full_buffers[name].to(device))
        dist.broadcast(buf, src=0)
    del full_sd, full_buffers

    num_params = sum(p.numel() for p in model.parameters())
    return BuiltModel(model=model, blocks=blocks, num_params=num_params, hf_config=hf_config)


def set_prefetch(blocks: list[nn.Module], n: int) -> None:
    """FSDP2 explicit prefetching: each block all-gathers the next `n` blocks in forward and the previous `n` in
    backward as soon as it starts (0: FSDP2's implicit prefetch of one block)."""
    if n <= 0:
        return
    for i, block in enumerate(blocks):
        block.set_modules_to_forward_prefetch(blocks[i + 1:i + 1 + n])
        block.set_modules_to_backward_prefetch(blocks[max(0, i - n):i][::-1])


def warn_unsharded_blocks(model: nn.Module, blocks: list[nn.Module]) -> int:
    """Warn about each decoder block that is not its own FSDP unit (one unit for the whole model gathers all
    parameters at once: the common cause of OOM and of no overlap). Returns how many were found."""
    missing = [i for i, b in enumerate(blocks) if not isinstance(b, FSDPModule)]
    if missing:
        log.warning("FSDP: %d of %d decoder blocks are not their own FSDP unit (indices %s): memory and overlap "
                    "suffer; shard each block before the root", len(missing), len(blocks), missing[:8])
    if not isinstance(model, FSDPModule):
        log.warning("FSDP: the root module is not an FSDP unit")
    return len(missing)
