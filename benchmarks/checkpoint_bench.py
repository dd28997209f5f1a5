"""Checkpoint benchmark: spotrun's DCP saves against the rank-0 full-state-dict recipe and the disk itself.

    python benchmarks/checkpoint_bench.py [--hidden 640 --layers 10 --dir /path/on/the/disk]

Starts itself under torchrun with 2 CPU processes (gloo), builds a Llama-shaped model (~80M parameters by
default) with the trainer's own code, takes one optimizer step (so Adam state exists), then measures on the
same directory, for a full fine-tune and for LoRA adapters on the same base (adapter-only checkpoints):
  - async periodic save: the time training is blocked (staging) and the full save time (written + hashed +
    manifest committed), through spotrun_trainer.checkpoint.CheckpointManager;
  - sync save (the emergency save on SIGTERM);
  - load (verify manifest hashes + DCP load + set state), as on a restart;
  - the common recipe: full model state dict gathered to rank 0 + torch.save (model only: no optimizer);
  - the disk's sequential write bandwidth: dd with conv=fsync of as many bytes as the checkpoint.
Prints a Markdown table (the README holds the last one with this command).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "training_image"))


def measure_saves(model, opt, directory: Path, model_options) -> dict:
    """Async (first and steady state), sync and load timings of the CheckpointManager on `directory`."""
    import torch.distributed as dist

    from spotrun_trainer.checkpoint import CheckpointManager
    from spotrun_trainer.config import CheckpointConfig

    out: dict = {}
    mgr = CheckpointManager(CheckpointConfig(dir=str(directory), keep=2, async_save=True), model=model,
                            optimizer=opt, local_rank=int(os.environ.get("LOCAL_RANK", "0")),
                            model_options=model_options)
    state = {"step": 1, "tokens_seen": 0, "loader": {}, "scheduler": {}}
    blocked, totals = [], []
    for step in (1, 3, 5):  # the first save allocates the staging buffers; later ones reuse them
        dist.barrier()
        t0 = time.perf_counter()
        mgr.save(step, {**state, "step": step}, blocking=False)
        blocked.append(time.perf_counter() - t0)
        mgr.wait()
        totals.append(time.perf_counter() - t0)
    out["async_blocked_first_s"], out["async_blocked_s"] = blocked[0], min(blocked[1:])
    out["async_total_s"] = min(totals[1:])
    dist.barrier()
    t0 = time.perf_counter()
    mgr.save(7, {**state, "step": 7}, blocking=True)
    out["sync_s"] = time.perf_counter() - t0
    manifest = json.loads((directory / "step-00000007" / "manifest.json").read_text())
    out["checkpoint_bytes"] = sum(f["size"] for f in manifest["files"])
    dist.barrier()
    t0 = time.perf_counter()
    restored = mgr.load()
    out["load_s"] = time.perf_counter() - t0
    assert restored is not None and restored.step == 7  # the newest committed checkpoint
    mgr.close()
    return out


def _one_step(model, params):
    import torch

    opt = torch.optim.AdamW(params, lr=1e-4)
    batch = torch.randint(0, 32000, (1, 64))
    model(input_ids=batch, labels=batch).loss.backward()
    opt.step()  # so that Adam state exists
    opt.zero_grad()
    return opt


def worker(args) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from spotrun_trainer.config import LoraConfig, ModelConfig
    from spotrun_trainer.model import build_mesh, build_sharded_model

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    root = Path(args.dir)
    cfg = ModelConfig(config={"model_type": "llama", "hidden_size": args.hidden, "intermediate_size": args.hidden * 3,
                              "num_hidden_layers": args.layers, "num_attention_heads": 8, "vocab_size": 32000,
                              "tie_word_embeddings": False})
    mesh = build_mesh("cpu", dist.get_world_size(), 1)
    built = build_sharded_model(cfg, mesh=mesh, device=torch.device("cpu"), seed=0)
    model = built.model
    opt = _one_step(model, model.parameters())
    results: dict = {"parameters": built.num_params, **measure_saves(model, opt, root / "ckpt", None)}

    dist.barrier()
    t0 = time.perf_counter()
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        torch.save(full, root / "rank0_full.pt")
        os.sync()
    dist.barrier()
    results["rank0_recipe_s"] = time.perf_counter() - t0
    if rank == 0:
        results["rank0_recipe_bytes"] = (root / "rank0_full.pt").stat().st_size
    del full, model, opt, built

    # The same base with LoRA adapters (rank 16 on every linear layer): the checkpoint holds the adapters only.
    lora = LoraConfig(rank=args.lora_rank, alpha=2.0 * args.lora_rank)
    built = build_sharded_model(cfg, mesh=mesh, device=torch.device("cpu"), seed=0, lora=lora)
    opt = _one_step(built.model, [p for p in built.model.parameters() if p.requires_grad])
    results["lora"] = {"trainable_parameters": built.trainable_params,
                       **measure_saves(built.model, opt, root / "ckpt-lora", built.checkpoint_options)}
    if rank == 0:
        print("RESULTS " + json.dumps(results), flush=True)
    dist.destroy_process_group()


def dd_bandwidth(directory: Path, nbytes: int) -> float:
    target = directory / "dd.bin"
    mb = max(64, nbytes // (1 << 20))
    t0 = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={mb}", "conv=fsync"],
                   check=True, capture_output=True)
    elapsed = time.perf_counter() - t0
    target.unlink()
    return mb * (1 << 20) / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=640)
    parser.add_argument("--layers", type=int, default=10)
    parser.add_argument("--lora-rank", type=int, default=16, help="LoRA rank of the adapter row (all linear layers)")
    parser.add_argument("--dir", default="", help="directory on the disk to measure (default: a temp dir)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0
    import tempfile

    directory = Path(args.dir or tempfile.mkdtemp(prefix="spotrun-ckpt-bench-"))
    directory.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "training_image")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29533",
           __file__, "--worker", "--hidden", str(args.hidden), "--layers", str(args.layers), "--dir", str(directory),
           "--lora-rank", str(args.lora_rank)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)  # the code is read below
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULTS ")), None)
    if out.returncode != 0 or line is None:
        print(out.stdout[-3000:], out.stderr[-3000:])
        return 1
    r = json.loads(line[len("RESULTS "):])
    disk = dd_bandwidth(directory, r["checkpoint_bytes"])
    shutil.rmtree(directory, ignore_errors=True) if not args.dir else None
    gb, lo = r["checkpoint_bytes"] / 1e9, r["lora"]
    lgb = lo["checkpoint_bytes"] / 1e9

    def saves(x: dict) -> list[str]:
        g = x["checkpoint_bytes"] / 1e9
        return [f"{x['async_blocked_first_s']:.3f} s / {x['async_blocked_s']:.3f} s", f"{x['async_total_s']:.3f} s",
                f"{x['sync_s']:.3f} s ({g * 1e3 / x['sync_s']:.0f} MB/s)", f"{x['load_s']:.3f} s"]

    full_saves, lora_saves = saves(r), saves(lo)
    rows = [
        ("parameters (trained)", f"{r['parameters'] / 1e6:.1f} M", f"{lo['trainable_parameters'] / 1e6:.2f} M"),
        ("checkpoint (trained weights + AdamW, 2 ranks)", f"{gb:.3f} GB", f"{lgb:.4f} GB"),
        ("async save: training blocked (first save / steady state)", full_saves[0], lora_saves[0]),
        ("async save: total (write + sha256 + manifest)", full_saves[1], lora_saves[1]),
        ("sync save (emergency)", full_saves[2], lora_saves[2]),
        ("load (verify + DCP load)", full_saves[3], lora_saves[3]),
        ("rank-0 full state dict + torch.save (model only)",
         f"{r['rank0_recipe_s']:.3f} s ({r['rank0_recipe_bytes'] / 1e9:.3f} GB)", "-"),
        ("disk sequential write (dd conv=fsync)", f"{disk / 1e6:.0f} MB/s", "-"),
        ("steady-state blocked / rank-0 recipe (goal <= 0.10)", f"{r['async_blocked_s'] / r['rank0_recipe_s']:.3f}",
         "-"),
        ("sync save throughput / disk (goal >= 0.70)", f"{gb * 1e9 / r['sync_s'] / disk:.2f}", "-"),
    ]
    print(f"| measure | full | LoRA r={args.lora_rank}, all linear layers |\n|---|---|---|")
    for k, v, w in rows:
        print(f"| {k} | {v} | {w} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
