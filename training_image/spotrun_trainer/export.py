"""What a finished run leaves in output_dir (SageMaker: /opt/ml/model), and the metadata that says what it is.

    full run          model.safetensors + config.json (export.dtype, bf16 by default) + tokenizer
    LoRA run          adapter_config.json + adapter_model.safetensors (fp32; `PeftModel.from_pretrained(base, dir)`)
                      + tokenizer; with export.merge_lora also merged/ (the base with the adapter merged in, a
                      standalone model in export.dtype)
    every run         spotrun-export.json (spotrun.seams.EXPORT_METADATA): kind (full | lora_adapter), whether
                      and which base model it needs, the LoRA settings, the weights' dtype, where each artifact
                      is, and with validation data `evaluation`: which weights (export.from last | best) of
                      which step, their validation loss, the base model's and the final one
    with validation   samples.json (samples.py): greedy generations from fixed validation prompts, base vs tuned

Every rank calls `export` (the weights are gathered from the shards); rank 0 writes.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import FSDPModule
from transformers import AutoTokenizer

from spotrun.seams import EXPORT_METADATA, Method
from spotrun.settings.tree import TrainConfig

from . import lora, samples

log = logging.getLogger(__name__)

METADATA_FORMAT = 1
MERGED_DIR = "merged"
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def plain_class_name(model: torch.nn.Module) -> str:
    # FSDP2 swaps the class for a dynamic subclass `FSDP<Name>(FSDPModule, <Name>)`.
    for cls in type(model).__mro__:
        if not issubclass(cls, FSDPModule) and cls.__name__ != "Module":
            return cls.__name__
    return type(model).__name__


def export(cfg: TrainConfig, model, built, loader, *, evaluation: dict | None = None) -> None:
    """Write the run's artifacts and metadata into cfg.output_dir (see the module docstring). `evaluation`:
    which weights were exported (last or best, their step) and the validation losses, for the metadata."""
    out = Path(cfg.output_dir)
    dtype = DTYPES[cfg.export.dtype]
    probe = _probe_logits(cfg, model, loader) if cfg.probe_logits_path else None
    rank = dist.get_rank()
    if cfg.training.method == Method.LORA:
        lora.export_adapter(model, out)
        merged = lora.merged_model(model, built.hf_config, dtype) if cfg.export.merge_lora else None
        if rank == 0:
            if merged is not None:
                merged.save_pretrained(out / MERGED_DIR)
                _export_tokenizer(cfg, out / MERGED_DIR)
                del merged
            _export_tokenizer(cfg, out)
    else:
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if rank == 0:
            full = {k: v.to(dtype) for k, v in full.items()}
            model.save_pretrained(out, state_dict=full)  # NOTE: save_pretrained empties the dict passed to it
            built.hf_config.architectures = [plain_class_name(model)]
            built.hf_config.dtype = cfg.export.dtype
            built.hf_config.save_pretrained(out)
            _export_tokenizer(cfg, out)
    if rank == 0:
        write_metadata(cfg, built, out, evaluation)
        _readable(out)
        if probe is not None:
            torch.save(probe, cfg.probe_logits_path)
        samples.write_samples(cfg, out)  # from the files just written, as a user loads them
    dist.barrier()


def _readable(out: Path) -> None:
    """Give the exported files the mode of any file this process creates (0644 under the usual umask 022).

    NOTE: safetensors writes through a private temporary file (mode 0600) that it renames into place, so the
    weights alone would be unreadable to the group and to tools running as another user."""
    mask = os.umask(0)
    os.umask(mask)
    for path in out.rglob("*"):
        if path.is_file():
            path.chmod(0o666 & ~mask)


def metadata(cfg: TrainConfig, built, evaluation: dict | None = None) -> dict:
    """The export metadata as a dict (what `write_metadata` writes)."""
    hf = built.hf_config
    is_lora, lora = cfg.training.method == Method.LORA, cfg.training.lora
    return {
        "format": METADATA_FORMAT,
        "kind": "lora_adapter" if is_lora else "full",
        "needs_base_model": is_lora,
        # the base as a user loads it (model.py `base_of`: a hub id with its commit, an S3 URI, a local path)
        "base_model": {"source": built.base_model or None, "revision": built.base_revision or None,
                       "path": cfg.model.path or None,
                       "model_type": hf.model_type,
                       "architectures": list(getattr(hf, "architectures", None) or [])},
        "weights_dtype": "float32" if is_lora else cfg.export.dtype,
        "lora": ({"rank": lora.rank, "alpha": lora.alpha, "dropout": lora.dropout,
                  "target_modules": lora.targets if isinstance(lora.targets, str) else list(lora.targets)}
                 if is_lora else None),
        "merged": ({"path": MERGED_DIR, "dtype": cfg.export.dtype}
                   if is_lora and cfg.export.merge_lora else None),
        "parameters": built.num_params,
        "trainable_parameters": built.trainable_params or built.num_params,
        "evaluation": evaluation,
    }


def write_metadata(cfg: TrainConfig, built, out: Path, evaluation: dict | None = None) -> Path:
    path = out / EXPORT_METADATA
    path.write_text(json.dumps(metadata(cfg, built, evaluation), indent=2, sort_keys=True) + "\n")
    return path


def _probe_logits(cfg: TrainConfig, model, loader) -> dict:
    """The sharded model's logits on one sample (every rank runs the forward; rank 0 keeps them): the tests
    compare them with what the exported files give."""
    model.eval()
    probe = torch.from_numpy(loader.next_batch()[:1]).to(next(model.parameters()).device)
    with torch.no_grad():
        logits = model(input_ids=probe).logits.float().cpu()
    model.train()
    return {"input_ids": probe.cpu(), "logits": logits}


def _export_tokenizer(cfg: TrainConfig, out: Path) -> None:
    for candidate in (cfg.model.path, str(Path(cfg.data.path) / "tokenizer")):
        if candidate and (Path(candidate) / "tokenizer_config.json").exists():
            AutoTokenizer.from_pretrained(candidate).save_pretrained(out)
            return
    log.warning("export: no tokenizer found next to the model or the data; the model is exported without one")
