"""Checkpoint benchmark: spotrun's DCP saves against the rank-0 full-state-dict recipe and the disk itself.

    python benchmarks/checkpoint_bench.py [--hidden 640 --layers 10 --nproc 2 --lora-rank 16 --dir /path/on/the/disk]

Starts itself under torchrun with `--nproc` CPU processes (gloo), builds a Llama-shaped model (~80M parameters
by default) with the trainer's own code, takes one optimizer step (so Adam state exists), then measures on the
same directory, for a full fine-tune and for LoRA adapters on the same base (adapter-only checkpoints):
  - async periodic save: the time training is blocked (staging) and the full save time (written + hashed +
    manifest committed), through spotrun_trainer.checkpoint.CheckpointManager;
  - the physical limit of that blocked time: a bare memcpy of the same tensors (each rank's shards of model and
    optimizer state) into preallocated CPU buffers, as the persistent stager does;
  - sync save (the emergency save on SIGTERM);
  - load (verify manifest hashes + DCP load + set state), as on a restart;
  - the common recipe: the full state (model + optimizer) gathered to rank 0 + torch.save;
  - the disk's sequential write bandwidth: dd with conv=fsync of as many bytes as the checkpoint.
Prints a Markdown table (benchmarks/perf_bench.py runs it beside the other measurements).
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


def measure_saves(model, opt, directory: Path, model_options) -> dict:
    """Async (first and steady state, with the memcpy limit), sync and load timings of the CheckpointManager."""
    import torch.distributed as dist

    from spotrun.settings.sections import CheckpointConfig
    from spotrun_trainer.checkpoint import CheckpointManager
    from spotrun_trainer.train import TrainState

    out: dict = {}
    train_state = TrainState()
    mgr = CheckpointManager(CheckpointConfig(dir=str(directory), keep=2, async_save=True), model=model,
                            optimizer=opt, states={"trainer": train_state},
                            local_rank=int(os.environ.get("LOCAL_RANK", "0")), model_options=model_options)
    blocked, totals = [], []
    for step in (1, 3, 5):  # the first save allocates the staging buffers; later ones reuse them
        dist.barrier()
        t0 = time.perf_counter()
        train_state.step = step
        mgr.save(step, blocking=False)
        blocked.append(time.perf_counter() - t0)
        mgr.wait()
        totals.append(time.perf_counter() - t0)
    out["async_blocked_first_s"], out["async_blocked_s"] = blocked[0], min(blocked[1:])
    out["memcpy_s"] = memcpy_seconds(model, opt, model_options)
    out["async_total_s"] = min(totals[1:])
    dist.barrier()
    t0 = time.perf_counter()
    train_state.step = 7
    mgr.save(7, blocking=True)
    out["sync_s"] = time.perf_counter() - t0
    manifest = json.loads((directory / "step-00000007" / "manifest.json").read_text())
    out["checkpoint_bytes"] = sum(f["size"] for f in manifest["files"])
    dist.barrier()
    t0 = time.perf_counter()
    restored = mgr.load()
    out["load_s"] = time.perf_counter() - t0
    assert restored is not None and restored.step == 7  # the newest committed checkpoint
    mgr.close()
    out["parts"] = save_parts(model, opt, directory / "parts", model_options)
    return out


def save_parts(model, opt, directory: Path, model_options) -> dict:
    """Where a save's time goes, each part timed on its own (fastest of 3, this rank): on the training thread, the
    finite-weights check, get_state_dict and DCP's DefaultStager copy (what an async save blocks on); in a sync
    save, DCP's write (serialization + write + fsync) and the sha256 of the written files for the manifest."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from spotrun_trainer.checkpoint import all_finite, files_written_by

    def local(t):
        return t.to_local() if hasattr(t, "to_local") else t

    def fastest(fn, runs: int = 3) -> float:
        times = []
        for _ in range(runs):
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    params = [local(p) for p in model.parameters()]
    state = dict(zip(("model", "optim"), get_state_dict(model, opt, options=model_options), strict=True))
    stager = DefaultStager(StagingOptions(False, False, False, False))
    stager.stage(state)  # allocates its buffers, as the first periodic save does
    parts = {"finite_check_s": fastest(lambda: all_finite(params)),
             "state_dict_s": fastest(lambda: get_state_dict(model, opt, options=model_options)),
             "stage_copy_s": fastest(lambda: stager.stage(state))}
    stager.close()
    rank = dist.get_rank()
    writes, hashes = [], []
    for trial in range(2):
        target = directory / f"trial-{trial}"
        writes.append(fastest(lambda t=target: dcp.save(state, checkpoint_id=str(t)), runs=1))
        hashes.append(fastest(lambda t=target: files_written_by(t, rank), runs=1))
        dist.barrier()
        if rank == 0:
            shutil.rmtree(target, ignore_errors=True)
    parts["dcp_write_s"], parts["sha256_s"] = min(writes), min(hashes)
    return parts


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
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    from spotrun.settings.sections import LoraConfig, ModelConfig, ShardingConfig
    from spotrun_trainer.model import build_mesh, build_sharded_model

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    root = Path(args.dir)
    cfg = ModelConfig(config={"model_type": "llama", "hidden_size": args.hidden, "intermediate_size": args.hidden * 3,
                              "num_hidden_layers": args.layers, "num_attention_heads": 8, "vocab_size": 32000,
                              "tie_word_embeddings": False})
    mesh = build_mesh("cpu", dist.get_world_size(), ShardingConfig())
    built = build_sharded_model(cfg, mesh=mesh, device=torch.device("cpu"), seed=0)
    model = built.model
    opt = _one_step(model, model.parameters())
    results: dict = {"parameters": built.num_params, **measure_saves(model, opt, root / "ckpt", None)}

    dist.barrier()
    t0 = time.perf_counter()
    full_model, full_optim = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True,
                                                                                 cpu_offload=True))
    full = {"model": full_model, "optim": full_optim}
    if rank == 0:
        torch.save(full, root / "rank0_full.pt")
        os.sync()
    dist.barrier()
    results["rank0_recipe_s"] = time.perf_counter() - t0
    if rank == 0:
        results["rank0_recipe_bytes"] = (root / "rank0_full.pt").stat().st_size
    del full, full_model, full_optim, model, opt, built

    if args.lora_rank > 0:
        # The same base with LoRA adapters on every linear layer: the checkpoint holds the adapters only.
        lora = LoraConfig(rank=args.lora_rank, alpha=2.0 * args.lora_rank)
        built = build_sharded_model(cfg, mesh=mesh, device=torch.device("cpu"), seed=0, lora=lora)
        opt = _one_step(built.model, [p for p in built.model.parameters() if p.requires_grad])
        results["lora"] = {"rank": args.lora_rank, "trainable_parameters": built.trainable_params,
                           **measure_saves(built.model, opt, root / "ckpt-lora", built.checkpoint_options)}
    if rank == 0:
        print("RESULTS " + json.dumps(results), flush=True)
    dist.destroy_process_group()


def memcpy_seconds(model, opt, model_options=None) -> float:
    """Fastest of 3 copies of this rank's local model and optimizer shards into preallocated CPU buffers."""
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_state_dict

    def local(t):
        return t.to_local() if hasattr(t, "to_local") else t

    model_sd, optim_sd = get_state_dict(model, opt, options=model_options)
    tensors = [local(t) for t in model_sd.values()]
    for per_param in optim_sd["state"].values():
        tensors.extend(local(t) for t in per_param.values() if isinstance(t, torch.Tensor) and t.dim() > 0)
    buffers = [torch.empty_like(t, device="cpu") for t in tensors]
    times = []
    for _ in range(3):
        dist.barrier()
        t0 = time.perf_counter()
        for buf, t in zip(buffers, tensors, strict=True):
            buf.copy_(t)
        times.append(time.perf_counter() - t0)
    return min(times)


def dd_bandwidth(directory: Path, nbytes: int) -> float:
    target = directory / "dd.bin"
    mb = max(64, nbytes // (1 << 20))
    t0 = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={mb}", "conv=fsync"],
                   check=True, capture_output=True)
    elapsed = time.perf_counter() - t0
    target.unlink()
    return mb * (1 << 20) / elapsed


def measure(*, hidden: int, layers: int, nproc: int, directory: Path, lora_rank: int = 0) -> dict:
    """Run the worker under torchrun; its results plus the disk's dd bandwidth for the same bytes."""
    directory.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
           str(_free_port()), __file__, "--worker", "--hidden", str(hidden), "--layers", str(layers),
           "--dir", str(directory), "--lora-rank", str(lora_rank)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)  # the code is read below
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULTS ")), None)
    if out.returncode != 0 or line is None:
        raise RuntimeError(f"checkpoint benchmark worker failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    r = json.loads(line[len("RESULTS "):])
    r["dd_bytes_per_s"] = dd_bandwidth(directory, r["checkpoint_bytes"])
    r["nproc"] = nproc
    return r


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rows(r: dict) -> list[tuple[str, str]]:
    gb = r["checkpoint_bytes"] / 1e9
    return [
        ("parameters", f"{r['parameters'] / 1e6:.1f} M"),
        (f"checkpoint (model + AdamW, {r['nproc']} ranks)", f"{gb:.3f} GB"),
        ("async save: training blocked (first save / steady state)",
         f"{r['async_blocked_first_s']:.3f} s / {r['async_blocked_s']:.3f} s"),
        ("bare memcpy of the same state into preallocated buffers", f"{r['memcpy_s']:.3f} s"),
        ("async save: total (write + sha256 + manifest)", f"{r['async_total_s']:.3f} s"),
        ("sync save (emergency)", f"{r['sync_s']:.3f} s ({gb * 1e3 / r['sync_s']:.0f} MB/s)"),
        ("load (verify + DCP load)", f"{r['load_s']:.3f} s"),
        ("rank-0 full state dict (model + optimizer) + torch.save",
         f"{r['rank0_recipe_s']:.3f} s ({r['rank0_recipe_bytes'] / 1e9:.3f} GB)"),
        ("disk sequential write (dd conv=fsync, one writer)", f"{r['dd_bytes_per_s'] / 1e6:.0f} MB/s"),
        ("steady-state blocked / memcpy (goal <= 1.5)", f"{r['async_blocked_s'] / r['memcpy_s']:.2f}"),
        ("steady-state blocked / rank-0 recipe", f"{r['async_blocked_s'] / r['rank0_recipe_s']:.3f}"),
        ("sync save throughput / dd (goal >= 0.70)", f"{gb * 1e9 / r['sync_s'] / r['dd_bytes_per_s']:.2f}"),
    ] + parts_rows(r) + lora_rows(r)


def parts_rows(r: dict) -> list[tuple[str, str]]:
    p = r["parts"]
    return [
        ("blocked, parts: finite check / get_state_dict / DefaultStager copy",
         f"{p['finite_check_s']:.3f} s / {p['state_dict_s']:.3f} s / {p['stage_copy_s']:.3f} s"),
        ("sync save, parts: DCP write (serialize + write + fsync) / sha256 of the written files",
         f"{p['dcp_write_s']:.3f} s / {p['sha256_s']:.3f} s"),
    ]


def lora_rows(r: dict) -> list[tuple[str, str]]:
    """The LoRA run on the same base (adapter-only checkpoints), when measured."""
    lo = r.get("lora")
    if not lo:
        return []
    name = f"LoRA r={lo['rank']}, all linear layers"
    return [
        (f"{name}: trained parameters / checkpoint", f"{lo['trainable_parameters'] / 1e6:.2f} M / "
         f"{lo['checkpoint_bytes'] / 1e9:.4f} GB"),
        (f"{name}: async save blocked (first / steady state)",
         f"{lo['async_blocked_first_s']:.3f} s / {lo['async_blocked_s']:.3f} s"),
        (f"{name}: async save total / sync save / load",
         f"{lo['async_total_s']:.3f} s / {lo['sync_s']:.3f} s / {lo['load_s']:.3f} s"),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=640)
    parser.add_argument("--layers", type=int, default=10)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--lora-rank", type=int, default=16,
                        help="LoRA rank of the adapter rows (all linear layers); 0 skips them")
    parser.add_argument("--dir", default="", help="directory on the disk to measure (default: a temp dir)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0
    import tempfile

    directory = Path(args.dir or tempfile.mkdtemp(prefix="spotrun-ckpt-bench-"))
    try:
        r = measure(hidden=args.hidden, layers=args.layers, nproc=args.nproc, directory=directory,
                    lora_rank=args.lora_rank)
    finally:
        if not args.dir:
            shutil.rmtree(directory, ignore_errors=True)
    print("| measure | value |\n|---|---|")
    for k, v in rows(r):
        print(f"| {k} | {v} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
