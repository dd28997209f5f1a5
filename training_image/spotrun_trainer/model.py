"""Build a Hugging Face causal LM and shard it with FSDP2.

Memory: every rank builds the model on the meta device (no storage), shards it, allocates only its own shards
(`to_empty`), and then receives the weights from rank 0, which alone materialises the full model on CPU
(`set_model_state_dict(..., broadcast_from_rank0=True)`). N ranks on a node therefore do not hold N full copies.
A LoRA run wraps the model in PEFT's adapters before sharding (see lora.py); rank 0 does the same to its full copy,
so the adapters' initial values are broadcast like every other weight.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from transformers import AutoConfig, AutoModelForCausalLM

from spotrun.seams import HUB_MANIFEST
from spotrun.settings.sections import LoraConfig, ModelConfig, PerfConfig, ShardingConfig

from . import lora as lora_lib

log = logging.getLogger(__name__)


def _hf_config(cfg: ModelConfig):
    if cfg.path:
        return AutoConfig.from_pretrained(cfg.path)
    raw = dict(cfg.config)
    return AutoConfig.for_model(raw.pop("model_type"), **raw)


def base_of(cfg: ModelConfig) -> tuple[str, str]:
    """(name, revision) by which a user loads the base model (an exported adapter's base_model_name_or_path and
    revision in adapter_config.json; the export metadata's base_model): a hub model's id and the commit its copy
    holds, read from the copy's HUB_MANIFEST (the preparation step's fetch writes it beside the files, on AWS and in
    `spotrun local` alike: spotrun/pipeline/hub_fetch.py), else the run's model.source, else the model directory
    itself (never the job's `input/data/model` link to it, gone with the job). Revision "": none to name."""
    if cfg.path:
        manifest_path = Path(cfg.path) / HUB_MANIFEST
        if manifest_path.is_file():
            manifest = json.loads(manifest_path.read_text())
            names = [manifest.get(k) for k in ("repo", "commit")] if isinstance(manifest, dict) else []
            if len(names) != 2 or not all(isinstance(n, str) and n for n in names):
                raise ValueError(f"model.path: {manifest_path} names no hub repo and commit")
            return names[0], names[1]
    return cfg.source or (str(Path(cfg.path).resolve()) if cfg.path else ""), ""


def _materialise_full(cfg: ModelConfig, hf_config, seed: int) -> nn.Module:
    """The full model on CPU in fp32: weights from the model directory, or initialised from `seed`."""
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


def build_mesh(device_type: str, world: int, sharding: ShardingConfig) -> DeviceMesh:
    """The device mesh for the sharding mode (see ShardingConfig).

    full: 1-D ("shard",) over every rank. hybrid: 2-D ("replicate", "shard"); torch's mesh is row-major, so the
    shard groups are runs of consecutive global ranks, and torchrun numbers ranks node by node: a shard group is
    `group_nodes` whole nodes, and its all-gathers/reduce-scatters stay on those nodes' links (NVLink inside one).
    """
    replicas, shard = sharding.mesh_shape(world)
    if replicas == 1:
        return init_device_mesh(device_type, (world,), mesh_dim_names=("shard",))
    return init_device_mesh(device_type, (replicas, shard), mesh_dim_names=("replicate", "shard"))


def sharding_units(model: nn.Module, blocks: list[nn.Module]) -> list[nn.Module]:
    """The modules that become their own FSDP unit before the root, in forward order.

    Every decoder block, and (torchtitan's layout) the input embeddings and the output head when they are not
    tied: otherwise they would stay in the root unit, which FSDP2 keeps gathered from forward to the end of
    backward (the root does not reshard after forward), holding vocab x hidden x 2 unsharded weights and their
    gradients on every GPU (4 GB each for a 128k-vocabulary 8k-hidden model in bf16). Tied weights share one
    parameter and must stay in one unit (the root).
    """
    units = list(blocks)
    get_in, get_out = getattr(model, "get_input_embeddings", None), getattr(model, "get_output_embeddings", None)
    emb = get_in() if get_in else None
    head = get_out() if get_out else None
    if emb is not None and head is not None and head.weight is not emb.weight:
        units = [emb, *units, head]
    return units


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
    trainable_params: int = 0
    """Parameters the optimizer updates (all of them in a full run, the adapters in a LoRA run)."""
    checkpoint_options: StateDictOptions | None = None
    """What the checkpoint manager saves of the model (None: everything; LoRA: the trainable parameters)."""
    base_model: str = ""
    base_revision: str = ""
    """How a user loads the base model (`base_of`): its name or place, and the revision ("" for none)."""


def build_sharded_model(cfg: ModelConfig, *, mesh: DeviceMesh, device: torch.device, seed: int,
                        lora: LoraConfig | None = None, perf: PerfConfig | None = None) -> BuiltModel:
    """The model sharded over `mesh`; with `lora`, PEFT's adapters on a frozen base (stored in the compute dtype).
    `perf` must be resolved for the device (PerfConfig.resolved); None: the plain defaults."""
    perf = perf or PerfConfig().resolved(device.type)

    hf_config = _hf_config(cfg)
    rank = dist.get_rank()
    param_dtype = resolve_param_dtype(cfg.param_dtype, device.type)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    if cfg.activation_checkpointing:
        if not getattr(model, "supports_gradient_checkpointing", False):
            raise ValueError(f"model.activation_checkpointing: {type(model).__name__} does not support it")
        # HF's checkpointing: non-reentrant torch.utils.checkpoint with preserve_rng_state, so dropout replays
        # exactly in the recomputation (measured on CPU with dropout: bitwise-equal gradients). Non-reentrant needs no
        # input that requires grad, which matters for LoRA: the frozen embeddings' output does not.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    if lora is not None:
        with torch.device("meta"):
            base, revision = base_of(cfg)
            model = lora_lib.apply(model, lora, base_dtype=param_dtype, base_model=base, revision=revision)

    blocks = find_blocks(model)
    if not blocks:
        raise ValueError(f"no decoder blocks found in {type(model).__name__}: cannot shard block by block")
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=getattr(torch, perf.reduce_dtype))
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    for unit in sharding_units(model, blocks):
        reshard = perf.reshard_after_forward
        if unit is head and perf.loss == "chunked":
            # The chunked loss reads lm_head.weight after the model's forward (loss.py): its unit keeps the
            # gathered weight until its backward, as the root would.
            reshard = False
        if perf.compile == "on" and any(unit is b for b in blocks):
            unit.compile()  # in place: parameter names (and so checkpoint keys) stay as they are
        fully_shard(unit, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
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
        if lora is not None:
            torch.manual_seed(seed)  # the adapters' initial values (lora_A random, lora_B zero)
            full = lora_lib.apply(full, lora, base_dtype=torch.float32)
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
    base, revision = base_of(cfg)
    return BuiltModel(model=model, blocks=blocks, num_params=num_params, hf_config=hf_config,
                      base_model=base, base_revision=revision,
                      trainable_params=sum(p.numel() for p in model.parameters() if p.requires_grad),
                      checkpoint_options=lora_lib.checkpoint_options() if lora is not None else None)


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
