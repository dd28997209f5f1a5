"""The training worker: one process per device, started by torchrun (see launcher.py).

Entry: `python -m spotrun_trainer.train --config run.json`. torchrun's RANK/LOCAL_RANK/WORLD_SIZE and the
launcher's SPOTRUN_OUTCOME_DIR are read here and nowhere below.

Stop protocol: SIGTERM (SageMaker's stop or spot notice, forwarded by torchrun) only sets a flag; after every
step all ranks all-reduce(MAX) it, so they stop at the same step, save synchronously, write their outcome and
exit 0. A resumed run is the same run: model, optimizer, scheduler, data position and each rank's RNG are
restored, so per-step losses and final weights are bitwise identical to an uninterrupted run on CPU.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import resource
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from . import metrics
from .checkpoint import CheckpointManager
from .config import TrainConfig
from .data import TokenShardLoader
from .export import export
from .memory_check import PeakProbe, predict, report_line
from .model import build_mesh, build_sharded_model, resolve_param_dtype

log = logging.getLogger("spotrun_trainer")

OOM_HINT = ("CUDA out of memory: turn on model.activation_checkpointing first (recompute blocks in backward), "
            "then lower micro_batch (raise grad_accum to keep the global batch), then use more or larger GPUs")


@dataclass
class Outcome:
    status: str  # completed | stopped | failed
    step: int
    message: str = ""


class StopFlag:
    """Set by SIGTERM; read once per step and agreed across ranks."""

    def __init__(self) -> None:
        self.requested = False

    def install(self) -> None:
        def handler(signum, _frame):
            self.requested = True  # NOTE: only a flag: collectives or I/O in a signal handler can deadlock

        signal.signal(signal.SIGTERM, handler)


def lr_lambda(total_steps: int, warmup: int, min_ratio: float):
    def fn(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return fn


def _peak_mem_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # kB on Linux


def _device_peak(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    return metrics.device_peak_flops(torch.cuda.get_device_name(device))


def train(cfg: TrainConfig, *, local_rank: int, stop: StopFlag) -> Outcome:
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    if cfg.deterministic:
        torch.use_deterministic_algorithms(True)
    mesh = build_mesh(device.type, world, cfg.sharding)

    torch.manual_seed(cfg.seed)  # the same init stream on every rank before sharding
    built = build_sharded_model(cfg.model, mesh=mesh, device=device, seed=cfg.seed,
                                lora=cfg.lora if cfg.method == "lora" else None)
    model = built.model
    model.train()
    torch.manual_seed(cfg.seed + 1 + rank)  # per-rank stream (dropout) after it; saved per rank in checkpoints

    trainable = [p for p in model.parameters() if p.requires_grad]  # LoRA: the adapters only
    optimizer = torch.optim.AdamW(trainable, lr=cfg.optim.lr, betas=(cfg.optim.beta1, cfg.optim.beta2),
                                  weight_decay=cfg.optim.weight_decay)
    loader = TokenShardLoader(Path(cfg.data.path), seq_len=cfg.data.seq_len, micro_batch=cfg.micro_batch,
                              dp_rank=rank, dp_size=world, seed=cfg.seed)
    samples_per_step = loader.global_batch * cfg.grad_accum
    total_steps = cfg.max_steps or max(1, int(cfg.epochs * loader.samples_per_epoch // samples_per_step))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(total_steps, cfg.optim.warmup_steps, cfg.optim.min_lr_ratio))
    ckpt = CheckpointManager(cfg.checkpoint, model=model, optimizer=optimizer, local_rank=local_rank,
                             model_options=built.checkpoint_options)
    predicted = predict(built.hf_config, shard_ranks=cfg.sharding.mesh_shape(world)[1], micro_batch=cfg.micro_batch,
                        seq_len=cfg.data.seq_len, activation_checkpointing=cfg.model.activation_checkpointing,
                        compute_dtype=resolve_param_dtype(cfg.model.param_dtype, device.type), device=device,
                        method=cfg.method, trainable_params=built.trainable_params)
    mem_probe = PeakProbe(model, optimizer, device, cfg.memory_probe)

    step, tokens_seen, last_loss = 0, 0, float("nan")
    segments: list[dict] = []  # earlier starts of this run, as of their last checkpoint (metrics.json spans them)
    restored = ckpt.load()
    if restored is not None:
        ts = restored.train_state
        step, tokens_seen = ts["step"], ts["tokens_seen"]
        last_loss = ts.get("last_loss", last_loss)
        segments = list(ts.get("segments", []))
        loader.load_state_dict(ts["loader"])
        scheduler.load_state_dict(ts["scheduler"])
    segment_start_step, run_t0 = step, time.perf_counter()

    def run_segments() -> list[dict]:
        return segments + [{"start_step": segment_start_step, "end_step": step,
                            "seconds": round(time.perf_counter() - run_t0, 3)}]

    def train_state() -> dict:
        return {"step": step, "tokens_seen": tokens_seen, "last_loss": last_loss, "loader": loader.state_dict(),
                "scheduler": scheduler.state_dict(), "segments": run_segments()}

    # A stop that arrived while starting (loading the model or the checkpoint): nothing new to save, and the
    # notice is better spent exiting than running a step.
    early = torch.tensor([float(stop.requested)], device=device)
    dist.all_reduce(early, op=dist.ReduceOp.MAX)
    if early.item():
        ckpt.close()
        if rank == 0:
            print(f"run_stopped step={step} reason=signal-before-first-step", flush=True)
        return Outcome("stopped", step)

    if rank == 0:
        replicas, shard = cfg.sharding.mesh_shape(world)
        print(f"run_start params={built.num_params} trainable={built.trainable_params} method={cfg.method} "
              f"world={world} blocks={len(built.blocks)} "
              f"start_step={step} total_steps={total_steps} device={device.type} "
              f"sharding={cfg.sharding.mode} mesh={replicas}x{shard}", flush=True)
    peak = _device_peak(device)
    loss_log = Path(cfg.output_dir) / "loss_history.jsonl"
    tokens_per_step = samples_per_step * cfg.data.seq_len
    window_t, window_tokens = time.perf_counter(), 0

    while step < total_steps:
        loss_sum = torch.zeros((), device=device)
        mem_probe.begin_step()
        for _ in range(cfg.grad_accum):
            # input_ids and labels (-100 on prompt tokens of chat data: see TokenShardLoader.next_inputs)
            out = model(**{k: torch.from_numpy(v).to(device) for k, v in loader.next_inputs().items()})
            (out.loss / cfg.grad_accum).backward()
            loss_sum += out.loss.detach()
        if cfg.optim.grad_clip > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(trainable, cfg.optim.grad_clip)
        else:
            grad_norm = torch.nn.utils.get_total_norm([p.grad for p in trainable if p.grad is not None])
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        lr = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if mem_probe.end_step() and rank == 0:
            print(report_line(predicted, *mem_probe.measured()), flush=True)
        step += 1
        tokens_seen += tokens_per_step
        window_tokens += tokens_per_step

        dist.all_reduce(loss_sum, op=dist.ReduceOp.SUM)
        last_loss = loss_sum.item() / (world * cfg.grad_accum)
        if not math.isfinite(last_loss):  # the same reduced value on every rank: all stop together
            raise ckpt.diverged(f"the loss is {last_loss} at step {step}")
        # One agreement per step: stop requested anywhere, periodic save due anywhere, background save unfinished.
        flags = torch.tensor([float(stop.requested), float(ckpt.due(step)), float(ckpt.pending_unfinished())],
                             device=device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        stop_now, save_due, pending = (bool(x) for x in flags.tolist())

        if rank == 0:
            with loss_log.open("a") as fh:
                # Readable, and exact (float.hex) for bitwise comparisons across restarts.
                fh.write(json.dumps({"step": step, "loss": last_loss, "loss_hex": last_loss.hex()}) + "\n")
            if step % cfg.log_every == 0 or step == total_steps:
                elapsed = time.perf_counter() - window_t
                tps = window_tokens / max(elapsed, 1e-9)
                print(metrics.format_line(step, loss=last_loss, lr=lr, grad_norm=float(grad_norm),
                                          tokens_per_s=tps,
                                          mfu=metrics.mfu(built.num_params, tps / world, peak, built.trainable_params),
                                          mem_gb=_peak_mem_gb(device)), flush=True)
                window_t, window_tokens = time.perf_counter(), 0

        if stop_now:
            ckpt.save(step, train_state(), blocking=True)
            ckpt.close()
            if rank == 0:
                print(f"run_stopped step={step} reason=signal", flush=True)
            return Outcome("stopped", step)
        ckpt.finalize_if_done(not pending)
        if save_due and step < total_steps:
            ckpt.save(step, train_state(), blocking=not cfg.checkpoint.async_save)

    all_segments = run_segments()
    # A final checkpoint first: an interruption during export then resumes straight into export.
    ckpt.save(step, train_state(), blocking=True)
    ckpt.close()
    # A stop during the final save: the checkpoint holds everything, so leave the notice to the exit and let the
    # resumed job (which finds step == total_steps) go straight to the export.
    stop_before_export = torch.tensor([float(stop.requested)], device=device)
    dist.all_reduce(stop_before_export, op=dist.ReduceOp.MAX)
    if stop_before_export.item():
        if rank == 0:
            print(f"run_stopped step={step} reason=signal-before-export", flush=True)
        return Outcome("stopped", step)
    export(cfg, model, built, loader)
    if rank == 0:
        # The whole run across restarts: training seconds of every start (up to its last checkpoint; work
        # redone after a hard kill is not counted twice), tokens and steps of the run.
        wall = sum(s["seconds"] for s in all_segments)
        steps_run = sum(s["end_step"] - s["start_step"] for s in all_segments)
        tps_dev = steps_run * tokens_per_step / max(wall, 1e-9) / world
        summary = {
            "final_loss": last_loss, "steps": step, "tokens": tokens_seen, "parameters": built.num_params,
            "trainable_parameters": built.trainable_params,
            "world_size": world, "tokens_per_s_per_device": tps_dev,
            "mfu": metrics.mfu(built.num_params, tps_dev, peak, built.trainable_params),
            "peak_mem_gb": _peak_mem_gb(device),
            "wall_s": wall, "starts": len(all_segments), "segments": all_segments,
            "resumed_from_step": restored.step if restored else None,
            "memory_predicted_bytes": predicted.total if predicted else None,
            "memory_measured_bytes": mem_probe.measured()[0], "memory_measured_source": mem_probe.measured()[1],
        }
        (Path(cfg.output_dir) / "metrics.json").write_text(json.dumps(summary, indent=2))
        print(f"run_completed step={step} final_loss={last_loss:.4f}", flush=True)
    return Outcome("completed", step)


def write_outcome(outcome_dir: str, rank: int, outcome: Outcome) -> None:
    if not outcome_dir:
        return
    Path(outcome_dir).mkdir(parents=True, exist_ok=True)
    Path(outcome_dir, f"rank{rank}.json").write_text(json.dumps(outcome.__dict__))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="spotrun FSDP2 training worker (started by torchrun)")
    parser.add_argument("--config", required=True, help="TrainConfig JSON written by the launcher")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    outcome_dir = os.environ.get("SPOTRUN_OUTCOME_DIR", "")
    cfg = TrainConfig.from_json_file(args.config)
    Path(cfg.output_dir).mkdir(parents=True, exist_ok=True)
    stop = StopFlag()
    stop.install()
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend)
    rank = dist.get_rank()
    try:
        outcome = train(cfg, local_rank=local_rank, stop=stop)
    except torch.OutOfMemoryError as exc:
        log.error("%s (%s)", OOM_HINT, exc)
        write_outcome(outcome_dir, rank, Outcome("failed", -1, OOM_HINT))
        raise
    except BaseException as exc:  # NOTE: not just Exception: DCP's CheckpointException is a BaseException
        if not isinstance(exc, (KeyboardInterrupt, SystemExit)):
            write_outcome(outcome_dir, rank, Outcome("failed", -1, f"{type(exc).__name__}: {exc}"))
        raise
    write_outcome(outcome_dir, rank, outcome)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
