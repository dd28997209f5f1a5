"""Trainer throughput: tokens/s per device, MFU and peak memory, measured through the container entry point.

    python benchmarks/throughput.py --preset cpu-small           # this machine: 2 CPU processes, ~7M params
    python benchmarks/throughput.py --preset gpu-1b              # one GPU: Llama 3.2 1B shape, bf16
    python benchmarks/throughput.py --preset gpu-3b              # one GPU: Llama 3.2 3B shape
    python benchmarks/throughput.py --preset node-8b             # every GPU of a node: Llama 3.1 8B shape
    python benchmarks/throughput.py --preset node-8b --dry-run   # no GPU needed: config, params, memory plan

Each GPU preset runs four variants by default (`--variants`): plain, torch.compile per block, the chunked loss,
and both. node-8b matches torchtitan's published Llama 3.1 8B FSDP setting (seq 8192, local batch 2,
activation checkpointing) for comparison. Synthetic token shards (uniform random ids) stand in for data; the
model is built from a config (no download). The first log window is warm-up (compilation, allocation) and is
skipped; the median of the rest is reported. MFU comes from the trainer's own line (6 * params * tokens/s per
device against the device's bf16 peak; `na` on CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

from spotrun.local.harness import free_port, start_launcher, write_sagemaker_root
from spotrun.seams import parse_metric_line

_LLAMA3 = {"model_type": "llama", "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
           "rope_theta": 500000.0}
PRESETS = {
    "cpu-small": {"model": {"model_type": "llama", "hidden_size": 256, "intermediate_size": 688,
                            "num_hidden_layers": 4, "num_attention_heads": 4, "vocab_size": 8000,
                            "max_position_embeddings": 512, "tie_word_embeddings": False},
                  "seq_len": 256, "micro_batch": 4, "steps": 30, "nproc": 2, "checkpointing": False},
    "gpu-1b": {"model": {**_LLAMA3, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                         "num_attention_heads": 32, "tie_word_embeddings": True},
               "seq_len": 8192, "micro_batch": 1, "steps": 30, "nproc": 0, "gpus": 1, "checkpointing": True},
    "gpu-3b": {"model": {**_LLAMA3, "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 28,
                         "num_attention_heads": 24, "tie_word_embeddings": True},
               "seq_len": 8192, "micro_batch": 1, "steps": 30, "nproc": 0, "gpus": 1, "checkpointing": True},
    "node-8b": {"model": {**_LLAMA3, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                          "num_attention_heads": 32, "tie_word_embeddings": False},
                "seq_len": 8192, "micro_batch": 2, "steps": 30, "nproc": 0, "gpus": 8, "checkpointing": True},
}
# The expected parameter count of each preset's shape (Llama 3.2 1B / 3B, Llama 3.1 8B model cards).
EXPECTED_PARAMS = {"gpu-1b": 1.24e9, "gpu-3b": 3.21e9, "node-8b": 8.03e9}
VARIANTS = {"plain": {"perf.compile": "off", "perf.loss": "hf"},
            "compile": {"perf.compile": "on", "perf.loss": "hf"},
            "chunked-loss": {"perf.compile": "off", "perf.loss": "chunked"},
            "compile+chunked-loss": {"perf.compile": "on", "perf.loss": "chunked"}}


def synthetic_shards(out: Path, vocab: int, tokens: int) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    rng.integers(1, vocab, size=tokens, dtype=np.uint16).tofile(out / "shard-00000.bin")
    (out / "index.json").write_text(json.dumps({"format": 1, "dtype": "uint16", "eos_token_id": 0,
                                                "total_tokens": tokens,
                                                "shards": [{"file": "shard-00000.bin", "tokens": tokens}]}))
    return out


def dry_run(name: str, preset: dict, micro: int) -> dict:
    """What a GPU run of the preset would build, checked without a GPU: the trainer's config through the
    launcher's own code, the model's parameter count on the meta device, and the per-GPU memory plan."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from spotrun.settings.wire import job_config
    from spotrun_trainer.launcher import LAUNCHER_KEYS

    hp = {k: json.dumps(v) if isinstance(v, dict) else str(v) for k, v in _hyperparameters(preset, micro, 30).items()
          if k not in LAUNCHER_KEYS}
    cfg = job_config(hp, **{"data.path": "/opt/ml/input/data/train",
                                                  "output_dir": "/opt/ml/model"})
    raw = dict(cfg.model.config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(raw.pop("model_type"), **raw))
    params = sum(p.numel() for p in model.parameters())
    gpus = preset["gpus"]
    vocab = preset["model"]["vocab_size"]
    return {"preset": name, "parameters": params, "gpus": gpus,
            "state_gb_per_gpu": 16 * params / gpus / 1e9,  # fp32 master + fp32 grads + Adam (FSDP2 shards)
            "hf_loss_logits_gb": micro * preset["seq_len"] * vocab * 4 / 1e9,  # fp32 logits HF's loss holds
            "chunked_loss_logits_gb": min(cfg.perf.loss_chunk_tokens, micro * preset["seq_len"]) * vocab * 4 / 1e9}


def _hyperparameters(preset: dict, micro: int, steps: int) -> dict:
    hp = {"training.micro_batch": micro, "max_steps": steps, "log_every": 5, "data.seq_len": preset["seq_len"],
          "model.config": preset["model"], "master_port": free_port(), "training.lr": 1e-4,
          "model.activation_checkpointing": preset["checkpointing"]}
    if preset["nproc"]:  # CPU: the launcher starts one process per GPU when there are GPUs
        hp.update({"nproc_per_node": preset["nproc"], "num_threads": 1})
    return hp


def run_variant(preset: dict, micro: int, steps: int, overrides: dict, work: Path) -> dict:
    nproc_guess = max(preset["nproc"], 8)
    data = synthetic_shards(work / "data", preset["model"]["vocab_size"],
                            tokens=(steps + 2) * micro * nproc_guess * preset["seq_len"] + preset["seq_len"])
    sm = write_sagemaker_root(work / "sm", hyperparameters={**_hyperparameters(preset, micro, steps), **overrides},
                              channels={"train": data}, checkpoint_dir=None)
    log = work / "launcher.log"
    if preset.get("gpus") == 1:  # a one-GPU preset on a multi-GPU machine: the launcher uses every visible GPU
        os.environ["CUDA_VISIBLE_DEVICES"] = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    rc = start_launcher(sm, log).wait()
    text = log.read_text(errors="replace")
    if rc != 0:
        raise RuntimeError(text[-4000:])
    metrics = json.loads((sm / "model" / "metrics.json").read_text())
    windows = [w for w in map(parse_metric_line, text.splitlines()) if w]
    steady = windows[1:] or windows  # the first window includes compilation/allocation warm-up
    world = metrics["world_size"]
    mfus = [w["mfu"] for w in steady if w["mfu"] is not None]
    return {"parameters": metrics["parameters"], "world": world,
            "tokens_per_s_per_device": statistics.median(w["tokens_per_s"] for w in steady) / world,
            "mfu": statistics.median(mfus) if mfus else None, "peak_mem_gb": max(w["mem_gb"] for w in windows)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu-small")
    parser.add_argument("--steps", type=int, help="optimizer steps (default: the preset's)")
    parser.add_argument("--micro-batch", type=int, help="samples per device per step (default: the preset's)")
    parser.add_argument("--variants", nargs="+", choices=sorted(VARIANTS),
                        help="GPU presets: which of the compile / loss variants to run (default: all four)")
    parser.add_argument("--dry-run", action="store_true", help="check the preset without running it (no GPU)")
    args = parser.parse_args()
    preset = PRESETS[args.preset]
    steps = args.steps or preset["steps"]
    micro = args.micro_batch or preset["micro_batch"]
    if args.dry_run:
        print(json.dumps(dry_run(args.preset, preset, micro)))
        return 0
    names = args.variants or (["plain"] if args.preset == "cpu-small" else list(VARIANTS))
    print("| preset | variant | params | devices | seq_len x micro_batch | tokens/s per device | MFU | peak mem GB |")
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        work = Path(tempfile.mkdtemp(prefix="spotrun-throughput-"))
        try:
            r = run_variant(preset, micro, steps, VARIANTS[name] if args.preset != "cpu-small" else {}, work)
        except RuntimeError as exc:
            print(f"| {args.preset} | {name} | failed: {str(exc).splitlines()[-1][:120]} | | | | | |")
            continue
        mfu = f"{r['mfu']:.3f}" if r["mfu"] is not None else "na (no known peak)"
        print(f"| {args.preset} | {name} | {r['parameters'] / 1e6:,.0f} M | {r['world']} | {preset['seq_len']} x "
              f"{micro} | {r['tokens_per_s_per_device']:,.0f} | {mfu} | {r['peak_mem_gb']:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
