"""A bare FSDP2 training loop on the trainer's own model, data, optimizer and schedule: the reference the trainer's
step is measured against (step overhead, benchmarks/perf_bench.py) and checked against (bitwise the same
per-step losses on CPU, tests/trainer/test_lean_step.py).

    python -m torch.distributed.run --nproc_per_node 2 benchmarks/bare_loop.py --sm-root SM --out bare.json

The config is the one the trainer gets, built from the SageMaker-shaped root by the launcher's own code; the
seeds, model build, data order, AdamW, LR schedule and clipping are the trainer's. Nothing else: no
checkpoints, no stop agreement, no logging, no host sync: each step's loss stays on the device and all of them are
reduced across ranks in one collective at the end (per element the same sum as reducing each step at once).
Writes {"losses": {step: float.hex()}, "steps_timed", "seconds_timed"} (rank 0).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from spotrun_trainer.data import TokenShardLoader
from spotrun_trainer.launcher import SageMakerEnv, plan_launch
from spotrun_trainer.loss import CausalLMLoss, StepTokens, target_count
from spotrun_trainer.model import build_mesh, build_sharded_model
from spotrun_trainer.train import lr_lambda


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sm-root", required=True, help="the SageMaker-shaped root the trainer ran from")
    parser.add_argument("--out", required=True, help="JSON file for the losses and timing (rank 0)")
    parser.add_argument("--warmup", type=int, default=2, help="steps excluded from the timing (default 2)")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    work = Path(tempfile.mkdtemp(prefix="spotrun-bare-"))
    cfg = plan_launch(SageMakerEnv.read(Path(args.sm_root)), gpu_count=torch.cuda.device_count(), efa_devices=[],
                      ofi_nccl_found=False, config_path=work / "c.json", outcome_dir=work).config
    device = torch.device("cuda", rank % max(1, torch.cuda.device_count())) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    if cfg.deterministic:
        torch.use_deterministic_algorithms(True)
    perf = cfg.perf.resolved(device.type)

    torch.manual_seed(cfg.training.seed)
    model = build_sharded_model(cfg.model, mesh=build_mesh(device.type, world, cfg.sharding),
                                device=device, seed=cfg.training.seed, perf=perf,
                                lora=cfg.training.lora if cfg.training.method == "lora" else None).model
    model.train()
    torch.manual_seed(cfg.training.seed + 1 + rank)
    loss_fn = CausalLMLoss(model, perf.loss, perf.loss_chunk_tokens)
    step_tokens = StepTokens(dp_ranks=world)
    o = cfg.optim
    trainable = [p for p in model.parameters() if p.requires_grad]  # LoRA: the adapters only
    optimizer = torch.optim.AdamW(trainable, lr=cfg.training.lr, betas=(o.beta1, o.beta2),
                                  weight_decay=o.weight_decay, **({"fused": True} if perf.fused_optimizer == "on"
                                                                 else {}))
    loader = TokenShardLoader(Path(cfg.data.path), seq_len=cfg.data.seq_len, micro_batch=cfg.training.micro_batch,
                              dp_rank=rank, dp_size=world, seed=cfg.training.seed)
    samples_per_step = loader.global_batch * cfg.training.grad_accum
    total = cfg.max_steps or max(1, int(cfg.training.epochs * loader.samples_per_epoch // samples_per_step))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(total, o.warmup_steps, o.min_lr_ratio))

    sums: list[torch.Tensor] = []
    t0 = None
    for step in range(1, total + 1):
        if step == args.warmup + 1:
            if cuda:
                torch.cuda.synchronize()
            dist.barrier()
            t0 = time.perf_counter()
        loss_sum = torch.zeros((), device=device)
        batches = [loader.next_inputs() for _ in range(cfg.training.grad_accum)]
        step_tokens.start(sum(target_count(b["labels"]) for b in batches))  # the token-weighted step mean
        normalizer = step_tokens.normalizer()
        for batch in batches:
            loss = loss_fn(model, {k: torch.from_numpy(v).to(device) for k, v in batch.items()},
                           normalizer=normalizer)
            loss.backward()
            loss_sum += loss.detach()
        if o.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(trainable, o.grad_clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        sums.append(loss_sum)
    if cuda:
        torch.cuda.synchronize()
    dist.barrier()
    seconds = time.perf_counter() - t0 if t0 is not None else 0.0
    reduced = torch.stack(sums)
    dist.all_reduce(reduced, op=dist.ReduceOp.SUM)
    losses = {step: (v / world).hex() for step, v in enumerate(reduced.tolist(), start=1)}
    if rank == 0:
        Path(args.out).write_text(json.dumps({"losses": losses, "steps_timed": max(0, total - args.warmup),
                                              "seconds_timed": seconds, "world_size": world}))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
