"""Trainer throughput: tokens/s per device and MFU, measured through the container entry point.

    python benchmarks/throughput.py --preset cpu-small      # this machine: 2 CPU processes, ~7M params
    python benchmarks/throughput.py --preset gpu-1b         # a GPU machine: every GPU, ~1B Llama, bf16

Synthetic token shards (uniform random ids) stand in for data; the model is built from a config (no download).
The first log windows are warm-up and are skipped; the median of the rest is reported. MFU comes from the
trainer's own line (6 * params * tokens/s per device against the device's bf16 peak; `na` on CPU).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "training_image")]

from spotrun.local.harness import free_port, start_launcher, write_sagemaker_root  # noqa: E402
from spotrun_trainer.metrics import parse_line  # noqa: E402

PRESETS = {
    "cpu-small": {"model": {"model_type": "llama", "hidden_size": 256, "intermediate_size": 688,
                            "num_hidden_layers": 4, "num_attention_heads": 4, "vocab_size": 8000,
                            "max_position_embeddings": 512, "tie_word_embeddings": False},
                  "seq_len": 256, "micro_batch": 4, "steps": 30, "nproc": 2, "checkpointing": False},
    "gpu-1b": {"model": {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 5632,
                         "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 16,
                         "vocab_size": 32000, "max_position_embeddings": 4096, "tie_word_embeddings": False},
               "seq_len": 2048, "micro_batch": 4, "steps": 40, "nproc": 0, "checkpointing": True},
}


def synthetic_shards(out: Path, vocab: int, tokens: int) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    rng.integers(1, vocab, size=tokens, dtype=np.uint16).tofile(out / "shard-00000.bin")
    (out / "index.json").write_text(json.dumps({"format": 1, "dtype": "uint16", "eos_token_id": 0,
                                                "total_tokens": tokens,
                                                "shards": [{"file": "shard-00000.bin", "tokens": tokens}]}))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu-small")
    parser.add_argument("--steps", type=int, help="optimizer steps (default: the preset's)")
    parser.add_argument("--micro-batch", type=int, help="samples per device per step (default: the preset's)")
    args = parser.parse_args()
    preset = PRESETS[args.preset]
    steps = args.steps or preset["steps"]
    micro = args.micro_batch or preset["micro_batch"]
    work = Path(tempfile.mkdtemp(prefix="spotrun-throughput-"))
    nproc_guess = max(preset["nproc"], 8)
    data = synthetic_shards(work / "data", preset["model"]["vocab_size"],
                            tokens=(steps + 2) * micro * nproc_guess * preset["seq_len"] + preset["seq_len"])
    log_every = 5
    hp = {"micro_batch": micro, "max_steps": steps, "log_every": log_every, "data.seq_len": preset["seq_len"],
          "model.config": preset["model"], "master_port": free_port(), "optim.lr": 1e-4,
          "model.activation_checkpointing": preset["checkpointing"]}
    if preset["nproc"]:
        hp.update({"nproc_per_node": preset["nproc"], "num_threads": 1})
    sm = write_sagemaker_root(work / "sm", hyperparameters=hp, channels={"train": data}, checkpoint_dir=None)
    log = work / "launcher.log"
    rc = start_launcher(sm, log).wait()
    text = log.read_text(errors="replace")
    if rc != 0:
        print(text[-4000:])
        return 1
    metrics = json.loads((sm / "model" / "metrics.json").read_text())
    windows = [w for w in map(parse_line, text.splitlines()) if w]
    steady = windows[1:] or windows  # the first window includes compilation/allocation warm-up
    world = metrics["world_size"]
    tps_dev = statistics.median(w["tokens_per_s"] for w in steady) / world
    mfus = [w["mfu"] for w in steady if w["mfu"] is not None]
    mfu = f"{statistics.median(mfus):.3f}" if mfus else "na (no known peak)"
    print("| preset | params | devices | seq_len x micro_batch | tokens/s per device | MFU | peak mem GB |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {args.preset} | {metrics['parameters'] / 1e6:.1f} M | {world} | {preset['seq_len']} x {micro} | "
          f"{tps_dev:,.0f} | {mfu} | {metrics['peak_mem_gb']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
