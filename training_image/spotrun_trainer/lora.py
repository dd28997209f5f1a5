"""LoRA on the FSDP2-sharded model: PEFT's adapters, adapter-only checkpoint state, adapter and merged exports.

The settings are `config.LoraConfig` (kept with the other components' configs so the launcher validates them
without importing torch or peft). How the pieces fit (measured with peft 0.21.2 and torch 2.13):

- PEFT first, FSDP2 after. `get_peft_model` injects `lora_A`/`lora_B` into the meta-device model; then every
  decoder block and the root are `fully_shard`ed exactly as for a full run, so each block's FSDP unit holds its
  frozen base weights and its adapters together. That is valid in FSDP2, which shards each parameter as its own
  DTensor: FSDP1's flat parameters needed one requires_grad per unit (llm-foundry #414), FSDP2 only needs one
  original dtype among a unit's *trainable* parameters (`FSDPParamGroup._init_mp_dtypes`). Wrapping adapters as
  units of their own would add two small all-gathers per targeted layer per pass and save no memory.
- The frozen base is stored in the compute dtype (bf16 on GPU, 2 bytes/param; fp32 on CPU); the adapters stay
  fp32 (they are the master weights) and the MixedPrecisionPolicy casts them for the forward.
- Checkpoints hold only trainable state: `StateDictOptions(ignore_frozen_params=True)` drops the base from
  `get_state_dict`, so DCP writes every rank's shard of every adapter and its AdamW moments. Nothing goes
  through a rank-0 full state dict, which elsewhere kept only rank 0's slice of each adapter
  (https://github.com/huggingface/accelerate/issues/4206). Loading is non-strict for the model only because the
  base keys are absent by design; DCP still fails on any adapter key missing from the checkpoint.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from spotrun.settings.checks import ConfigError, short_repr
from spotrun.settings.sections import LoraConfig

ADAPTER_NAME = "default"  # PEFT's name for a model's only adapter (files are saved at the top of the directory)


def peft_config(cfg: LoraConfig, base_model: str = "", revision: str = ""):
    # peft takes seconds to import: only LoRA runs load it
    from peft import LoraConfig as PeftLoraConfig
    from peft import TaskType

    targets = cfg.targets
    return PeftLoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                          target_modules=targets if targets == "all-linear" else list(targets),
                          task_type=TaskType.CAUSAL_LM, base_model_name_or_path=base_model or None,
                          revision=revision or None)


def apply(model: nn.Module, cfg: LoraConfig, *, base_dtype: torch.dtype, base_model: str = "",
          revision: str = "") -> nn.Module:
    """Wrap an HF causal LM (on any device, meta included) in PEFT's LoRA; freeze the base in `base_dtype`.
    `base_model`, `revision`: what the exported adapter names as its base (adapter_config.json's
    base_model_name_or_path and revision, which PEFT's AutoPeftModel loads; model.py `base_of`).

    Call inside `torch.device("meta")` for the model that will be sharded: the adapters are then created there too.
    """
    from peft import get_peft_model  # peft takes seconds to import: only LoRA runs load it

    try:
        wrapped = get_peft_model(model, peft_config(cfg, base_model, revision))
    except ValueError as exc:  # PEFT: "Target modules {...} not found in the base model"
        raise ConfigError(f"lora.target_modules={short_repr(cfg.target_modules)} is invalid: {exc}") from None
    # NOTE: get_peft_model replaces the config's base with the model's `name_or_path`: the directory it was loaded
    # from, the job's `input/data/model` channel, which is gone once the job is. The exported adapter_config.json
    # names the base as a user loads it (a hub id, an S3 URI or a local path: model.py `base_of`) instead.
    wrapped.peft_config[ADAPTER_NAME].base_model_name_or_path = base_model or None
    for param in wrapped.parameters():
        if not param.requires_grad and param.dtype != base_dtype:
            param.data = param.data.to(base_dtype)
    return wrapped


def checkpoint_options() -> StateDictOptions:
    """What the checkpoint manager saves and loads for a LoRA model: the trainable parameters only."""
    return StateDictOptions(ignore_frozen_params=True, strict=False)


def export_adapter(model: nn.Module, out: Path) -> list[str]:
    """`adapter_config.json` + `adapter_model.safetensors` (fp32) in `out`, loadable with
    `PeftModel.from_pretrained(base, out)`. Collective: every rank calls it; rank 0 writes."""
    adapters = get_model_state_dict(model, options=StateDictOptions(
        full_state_dict=True, cpu_offload=True, ignore_frozen_params=True))
    if dist.get_rank() == 0:
        # PEFT's own save renames the keys (drops the adapter name) and writes the config beside the weights.
        model.save_pretrained(str(out), state_dict=adapters)
    return ["adapter_config.json", "adapter_model.safetensors"]


def merged_model(model: nn.Module, hf_config, dtype: torch.dtype) -> nn.Module | None:
    """The base with the adapter merged in (PEFT's `merge_and_unload`), on rank 0's CPU in `dtype`; None elsewhere.

    Collective: the full state (base and adapters) is gathered to rank 0, which rebuilds the PEFT model in fp32
    (the merge W + (alpha/r)·B·A is computed in fp32, then cast). Needs ~6 bytes per parameter of host memory on
    rank 0 beside the training process's own.
    """
    # peft takes seconds to import: only LoRA runs load it; transformers' loaders only at the merge
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() != 0:
        return None
    base = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    rebuilt = get_peft_model(base, copy.deepcopy(model.peft_config[ADAPTER_NAME]))
    missing, unexpected = rebuilt.load_state_dict({k: v.float() for k, v in full.items()}, strict=False)
    del full
    tied = _tied_names(rebuilt)
    if unexpected or set(missing) - tied:
        raise RuntimeError(f"merge: the gathered state does not fit the rebuilt model (missing "
                           f"{sorted(set(missing) - tied)[:4]}, unexpected {sorted(unexpected)[:4]})")
    merged = rebuilt.merge_and_unload()
    return merged.to(dtype)


def _tied_names(model: nn.Module) -> set[str]:
    """State-dict names that alias a parameter stored under another name (tied input/output embeddings)."""
    seen: dict[int, str] = {}
    aliases = set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in seen:
            aliases.add(name)
        else:
            seen[id(param)] = name
    return aliases
