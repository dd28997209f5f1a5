"""The training worker: one process per device, started by torchrun (see launcher.py).

Entry: `python -m spotrun_trainer.train --config run.json`. torchrun's RANK/LOCAL_RANK/WORLD_SIZE and the
launcher's SPOTRUN_OUTCOME_DIR are read here and nowhere below.

The shape (torchtitan's): `Trainer` builds the run from its config; `run()` loops over `train_step()`, the
step's agreement, logging and the save decision, then saves a final checkpoint and exports (export.py). The
CheckpointManager is handed the stateful objects once (model, optimizer, data loader, LR scheduler and the loop's
`TrainState`) and restores them all in place on resume.

Each step's loss is token-weighted over the whole step (loss.StepTokens). With validation data the Evaluator
(evaluate.py) runs before the first step (the base model's value), on its schedule and at the end, between the
step's agreement and its save, so every value up to a checkpoint is recorded before that checkpoint; an
evaluation a stop cut short is run first by the resumed job (`TrainState.last_eval_step`).

The hot path (agreement.py): two small CPU collectives per step beyond FSDP's own and clipping's: the agreement
(stop flag, save due, background save finished), started before the step and read after it, and the step's
trained-token count (loss.StepTokens), started before the first forward and read before it; the loss stays on
the device and is reduced and read at log steps and saves only. No other host sync per step.

Stop protocol: SIGTERM (SageMaker's stop or spot notice, forwarded by torchrun) only sets a flag; the next step's
agreement carries it to every rank, so they stop at the same step, save synchronously, write their outcome and
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
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import torch
import torch.distributed as dist

from spotrun.seams import (
    COMPLETION_LINE_PREFIX,
    COMPLETION_METRICS,
    RUN_START_PREFIX,
    Method,
    format_eval_line,
    format_metric_line,
)
from spotrun.settings.tree import TrainConfig
from spotrun.settings.wire import from_json_file

from . import metrics
from .agreement import Agreement, LossHistory, StepAgreement
from .best import BestWeights
from .checkpoint import CheckpointManager, verify_ahead
from .data import TokenShardLoader, total_steps
from .evaluate import EvalResult, Evaluator, ValidationSet
from .export import export
from .loss import CausalLMLoss, StepTokens, target_count
from .memory_check import PeakProbe, predict, report_line
from .model import build_mesh, build_sharded_model, resolve_param_dtype
from .outcome import OUTCOME_DIR_ENV, Outcome, write_outcome
from .tracking import make_tracker

log = logging.getLogger("spotrun_trainer")

OOM_HINT = ("CUDA out of memory: turn on model.activation_checkpointing first (recompute blocks in backward), "
            "then lower micro_batch (raise grad_accum to keep the global batch), then use more or larger GPUs")


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


@dataclass
class TrainState:
    """The loop's own counters, checkpointed beside the data loader and the LR scheduler.

    `segments`: the earlier starts of this run, each as of its last checkpoint ({start_step, end_step, seconds}),
    so that metrics.json spans the whole run across restarts (work redone after a hard kill is not counted twice).
    `last_eval_step`: the newest step whose validation loss is recorded (-1: none yet; 0 is the base model's);
    `val`: {"base", "last", "best", "best_step"} validation losses so far.
    `tracking`: the MLflow run this training run logs to (tracking.py: its key and run id), so a resumed job or the
    next segment continues it.
    """

    step: int = 0
    tokens_seen: int = 0
    last_loss: float = float("nan")
    segments: list = field(default_factory=list)
    segment_start_step: int = 0
    segment_t0: float = field(default_factory=time.perf_counter)
    last_eval_step: int = -1
    val: dict = field(default_factory=dict)
    eval_seconds: float = 0.0
    tracking: dict = field(default_factory=dict)

    def start_segment(self) -> None:
        self.segment_start_step, self.segment_t0 = self.step, time.perf_counter()

    def all_segments(self) -> list[dict]:
        return self.segments + [{"start_step": self.segment_start_step, "end_step": self.step,
                                 "seconds": round(time.perf_counter() - self.segment_t0, 3)}]

    def state_dict(self) -> dict:
        return {"step": self.step, "tokens_seen": self.tokens_seen, "last_loss": self.last_loss,
                "segments": self.all_segments(), "last_eval_step": self.last_eval_step, "val": dict(self.val),
                "eval_seconds": self.eval_seconds, "tracking": dict(self.tracking)}

    def load_state_dict(self, state: dict) -> None:
        self.step, self.tokens_seen = int(state["step"]), int(state["tokens_seen"])
        self.last_loss = float(state.get("last_loss", float("nan")))
        self.segments = list(state.get("segments", []))
        self.last_eval_step = int(state.get("last_eval_step", -1))
        self.val = dict(state.get("val", {}))
        self.eval_seconds = float(state.get("eval_seconds", 0.0))
        self.tracking = dict(state.get("tracking", {}))

    def record_eval(self, result: EvalResult) -> None:
        self.last_eval_step = result.step
        self.eval_seconds += result.seconds
        if result.step == 0:
            self.val["base"] = result.loss
        self.val["last"] = result.loss
        # The best of the trained weights (the base model has no checkpoint to keep or export).
        if result.step > 0 and result.loss < self.val.get("best", math.inf):
            self.val["best"], self.val["best_step"] = result.loss, result.step


SEGMENT_SKEW_S = 60.0  # how far apart the ranks' segment clocks may be (they start with the job, within seconds)


class Trainer:
    """Builds the run from its config, then `run()`: step, agree, log, save decision; at the end, export."""

    def __init__(self, cfg: TrainConfig, *, local_rank: int, stop: StopFlag):
        self.cfg, self.stop_flag = cfg, stop
        self._started = time.monotonic()  # the segment's clock (segment_seconds) starts with the trainer
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
        if cfg.num_threads:
            torch.set_num_threads(cfg.num_threads)
        if cfg.deterministic:
            torch.use_deterministic_algorithms(True)
        mesh = build_mesh(self.device.type, self.world, cfg.sharding)
        verified = verify_ahead(cfg.checkpoint, local_rank)  # hashes the checkpoints while the model is built
        self.perf = cfg.perf.resolved(self.device.type)

        t = cfg.training
        torch.manual_seed(t.seed)  # the same init stream on every rank before sharding
        self.built = build_sharded_model(cfg.model, mesh=mesh, device=self.device, seed=t.seed, perf=self.perf,
                                         lora=t.lora if t.method == Method.LORA else None)
        self.model = self.built.model
        self.model.train()
        torch.manual_seed(t.seed + 1 + self.rank)  # per-rank stream (dropout) after it; saved per rank
        self.loss_fn = CausalLMLoss(self.model, self.perf.loss, self.perf.loss_chunk_tokens)
        self.step_tokens = StepTokens(dp_ranks=self.world)  # every rank reads its own data: all are DP ranks

        o = cfg.optim
        fused = {"fused": True} if self.perf.fused_optimizer == "on" else {}
        self.trainable = [p for p in self.model.parameters() if p.requires_grad]  # LoRA: the adapters only
        self.optimizer = torch.optim.AdamW(self.trainable, lr=t.lr, betas=(o.beta1, o.beta2),
                                           weight_decay=o.weight_decay, **fused)
        self.loader = TokenShardLoader(Path(cfg.data.path), seq_len=cfg.data.seq_len, micro_batch=t.micro_batch,
                                       dp_rank=self.rank, dp_size=self.world, seed=t.seed)
        self.samples_per_step = self.loader.global_batch * t.grad_accum  # every rank's micro-batches
        self.tokens_per_step = self.samples_per_step * cfg.data.seq_len
        self.total_steps = total_steps(self.loader.index, seq_len=cfg.data.seq_len,
                                       samples_per_step=self.samples_per_step,
                                       epochs=t.epochs, max_steps=cfg.max_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(self.total_steps, o.warmup_steps, o.min_lr_ratio))
        self.state = TrainState()
        self.tracker = make_tracker(cfg.tracking, rank=self.rank, params={
            "method": t.method, "world_size": self.world, "parameters": self.built.num_params,
            "trainable_parameters": self.built.trainable_params, "total_steps": self.total_steps})
        self.evaluator = None
        if cfg.data.validation_path:
            valset = ValidationSet(Path(cfg.data.validation_path), seq_len=cfg.data.seq_len,
                                   micro_batch=t.micro_batch, dp_rank=self.rank, dp_size=self.world,
                                   max_batches=cfg.eval.max_batches)
            self.evaluator = Evaluator(cfg.eval, valset, model=self.model, loss_fn=self.loss_fn, device=self.device)
        self.ckpt = CheckpointManager(cfg.checkpoint, model=self.model, optimizer=self.optimizer,
                                      local_rank=local_rank, verified=verified,
                                      model_options=self.built.checkpoint_options,
                                      states={"trainer": self.state, "loader": self.loader,
                                              "scheduler": self.scheduler})
        if cfg.eval.keep_best:  # with checkpoints: TrainConfig's rule
            self.ckpt.keep_also = lambda: {self.state.val["best_step"]} if "best_step" in self.state.val else set()
        # export.from=best: the best step's weights, kept in memory when this job found them (see best.py)
        self.best = BestWeights(self.model, self.built.checkpoint_options)
        self.peak_flops = _device_peak(self.device)
        self.predicted = predict(
            self.built.hf_config, shard_ranks=cfg.sharding.mesh_shape(self.world)[1], micro_batch=t.micro_batch,
            seq_len=cfg.data.seq_len, activation_checkpointing=cfg.model.activation_checkpointing,
            compute_dtype=resolve_param_dtype(cfg.model.param_dtype, self.device.type), device=self.device,
            method=t.method, trainable_params=self.built.trainable_params)
        self.mem_probe = PeakProbe(self.model, self.optimizer, self.device, cfg.memory_probe)
        self.agreement = StepAgreement()
        # Each rank's step loss is its share of the step's token mean times the ranks (see StepTokens).
        self.losses = LossHistory(Path(cfg.output_dir) / "loss_history.jsonl", divisor=self.world, rank=self.rank)

    # ---- the loop ------------------------------------------------------------------------------------------

    def run(self) -> Outcome:
        restored = self.ckpt.load()  # restores model, optimizer, RNG, loader, scheduler and self.state in place
        self.state.start_segment()
        # A stop that arrived while starting (loading the model or the checkpoint): nothing new to save, and the
        # notice is better spent exiting than running a step.
        if self.agreement.now(stop=self.stop_flag.requested):
            return self._stopped("signal-before-first-step", save=False)
        self.tracker.begin(self.state.tracking, step=self.state.step, segments=self.state.segments)
        if self.rank == 0:
            replicas, shard = self.cfg.sharding.mesh_shape(self.world)
            print(f"{RUN_START_PREFIX} params={self.built.num_params} trainable={self.built.trainable_params} "
                  f"method={self.cfg.training.method} world={self.world} blocks={len(self.built.blocks)} "
                  f"start_step={self.state.step} total_steps={self.total_steps} device={self.device.type} "
                  f"sharding={self.cfg.sharding.mode} mesh={replicas}x{shard}", flush=True)
        if self._missed_eval() and not self._evaluate():  # the base model's value, or one a stop cut short
            return self._stopped("signal-during-eval", save=False)  # the checkpoint already holds this step
        self._window_t, self._window_tokens = time.perf_counter(), 0
        while self.state.step < self.total_steps:
            step = self.state.step + 1
            log_now = step % self.cfg.log_every == 0 or step == self.total_steps
            self.agreement.start(stop=self.stop_flag.requested or self._segment_over(),
                                 save_due=self.ckpt.due(step), pending=self.ckpt.pending_unfinished())
            loss_sum, grad_norm, lr = self.train_step(need_grad_norm=log_now)
            self.losses.add(step, loss_sum)
            agreed = self.agreement.wait()
            self._after_step(agreed, log_now, grad_norm, lr)
            if agreed.stop:
                if not self.stop_flag.requested and self._segment_over(skew_s=SEGMENT_SKEW_S):
                    return self._segment_end()
                return self._stopped("signal", save=True)
            new_best = False
            if self.evaluator and self.evaluator.due(step, total_steps=self.total_steps, log_step=log_now):
                if not self._evaluate():
                    return self._stopped("signal-during-eval", save=True)  # the resumed run evaluates it again
                new_best = self.cfg.eval.keep_best and self.state.val.get("best_step") == step
                if new_best and self.cfg.export.from_ == "best":
                    self.best.capture(step)
            self.ckpt.finalize_if_done(agreed.pending_done)
            if (agreed.save_due or new_best) and step < self.total_steps:  # the best weights get a checkpoint
                self.ckpt.save(step, blocking=not self.cfg.checkpoint.async_save)
        self._flush_losses()
        segments = self.state.all_segments()
        # A final checkpoint first: an interruption during export then resumes straight into export.
        self.ckpt.save(self.state.step, blocking=True)
        self.ckpt.close()
        # A stop during the final save: the checkpoint holds everything, so leave the notice to the exit and let
        # the resumed job (which finds step == total_steps) go straight to the export.
        if self.agreement.now(stop=self.stop_flag.requested):
            if self.rank == 0:
                print(f"run_stopped step={self.state.step} reason=signal-before-export", flush=True)
            self.tracker.close(step=self.state.step, reason="signal-before-export", completed=False, signalled=True)
            return self._stop_outcome()
        evaluation = self._choose_export_weights()
        export(self.cfg, self.model, self.built, self.loader, evaluation=evaluation)
        if self.rank == 0:
            self._write_summary(segments, restored)
            vals = "".join(f" {key}={evaluation[key]:.6g}" for key in COMPLETION_METRICS.values()
                           if evaluation and evaluation.get(key) is not None)
            print(f"{COMPLETION_LINE_PREFIX} step={self.state.step} final_loss={self.state.last_loss:.4f}{vals}",
                  flush=True)
        self.tracker.close(step=self.state.step, reason="completed", completed=True)
        return Outcome("completed", self.state.step)

    def accumulate(self) -> torch.Tensor:
        """Forward and backward over the step's `grad_accum` micro-batches, each weighted by its trained tokens
        out of the whole step's (all micro-batches, all ranks: see loss.StepTokens). Returns this rank's share of
        the step's mean loss times the ranks, on the device. No host sync."""
        # input_ids and labels (-100 on prompt tokens of chat data: see TokenShardLoader.next_inputs)
        batches = [self.loader.next_inputs() for _ in range(self.cfg.training.grad_accum)]
        self.step_tokens.start(sum(target_count(b["labels"]) for b in batches))
        batches = [{k: torch.from_numpy(v) for k, v in b.items()} for b in batches]
        if self.device.type == "cuda":
            batches = [{k: v.pin_memory().to(self.device, non_blocking=True) for k, v in b.items()} for b in batches]
        normalizer = self.step_tokens.normalizer()
        loss_sum = torch.zeros((), device=self.device)
        for inputs in batches:
            loss = self.loss_fn(self.model, inputs, normalizer=normalizer)
            loss.backward()
            loss_sum += loss.detach()
        return loss_sum

    def train_step(self, *, need_grad_norm: bool) -> tuple[torch.Tensor, torch.Tensor | None, float]:
        """One optimizer step over `grad_accum` micro-batches: (this rank's loss share on the device, the grad
        norm when clipping computed it or `need_grad_norm` asked for it, the lr used). No host sync."""
        cfg = self.cfg
        self.mem_probe.begin_step()
        loss_sum = self.accumulate()
        params = self.trainable
        grad_norm = None
        if cfg.optim.grad_clip > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.optim.grad_clip)  # its all-reduce is the clip's
        elif need_grad_norm:
            grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.mem_probe.end_step() and self.rank == 0:
            print(report_line(self.predicted, *self.mem_probe.measured()), flush=True)
        self.state.step += 1
        self.state.tokens_seen += self.tokens_per_step
        return loss_sum, grad_norm, lr

    # ---- evaluation ----------------------------------------------------------------------------------------

    def _choose_export_weights(self) -> dict | None:
        """export.from=best: put the best step's weights into the model for the export (the final ones are
        in the final checkpoint already): from memory when this job found them, else from their checkpoint, which
        was in the checkpoint prefix when this job started (best.py says why a checkpoint of this job cannot be
        read back). Returns the export metadata's `evaluation` (None without validation)."""
        val = self.state.val
        if self.evaluator is None or "last" not in val:
            return None
        chosen, step, loss = "last", self.state.step, val["last"]
        if self.cfg.export.from_ == "best" and "best_step" in val:
            chosen, step, loss = "best", val["best_step"], val["best"]
            if step != self.state.step:
                if self.best.step == step:
                    self.best.restore()
                else:
                    self.ckpt.load_model(step)
        return {"weights": chosen, "exported_step": step, "val_loss": loss, "base_val_loss": val.get("base"),
                "final_val_loss": val["last"], "best_val_loss": val.get("best"), "best_step": val.get("best_step"),
                "final_step": self.state.step}

    def _missed_eval(self) -> bool:
        """At a start: is the value of this step owed (the base model's at step 0, or a scheduled evaluation
        that a stop cut short)? The same on every rank (it reads the restored state only)."""
        if self.evaluator is None or self.state.last_eval_step >= self.state.step:
            return False
        step = self.state.step
        every = self.cfg.eval.every_steps
        return step == 0 or step == self.total_steps or bool(every and step % every == 0)

    def _evaluate(self) -> bool:
        """Evaluate now and record it (state, history, log line); False when a stop request cut it short."""
        if self.rank == 0:
            print(f"eval_start step={self.state.step} batches={self.evaluator.valset.batches_per_rank}", flush=True)
        result = self.evaluator.run(self.state.step, lambda: self.stop_flag.requested)
        if result is None:
            if self.rank == 0:
                print(f"eval_stopped step={self.state.step} batches_done={self.evaluator.batches_done} "
                      f"of={self.evaluator.valset.batches_per_rank}", flush=True)
            return False
        self.state.record_eval(result)
        if self.rank == 0:
            rec = {"step": result.step, "val_loss": result.loss, "val_loss_hex": result.loss.hex(),
                   "val_tokens": result.tokens}
            with (Path(self.cfg.output_dir) / "loss_history.jsonl").open("a") as fh:
                fh.write(json.dumps(rec) + "\n")
            print(format_eval_line(result.step, val_loss=result.loss, val_ppl=result.perplexity,
                                   val_tokens=result.tokens, eval_s=result.seconds), flush=True)
            self.tracker.evaluation(result.step, val_loss=result.loss, val_ppl=result.perplexity)
        return True

    def _flush_losses(self) -> None:
        flushed = self.losses.flush()
        if not flushed:
            return
        self.state.last_loss = flushed[-1][1]
        self.tracker.losses(flushed)
        bad = next(((step, loss) for step, loss in flushed if not math.isfinite(loss)), None)
        if bad is not None:  # the same reduced values on every rank: all stop together, before any save
            raise self.ckpt.diverged(f"the loss is {bad[1]} at step {bad[0]}")

    def _after_step(self, agreed: Agreement, log_now: bool, grad_norm: torch.Tensor | None, lr: float) -> None:
        """Read the losses when they are needed (log line, a save or a stop next) and print the metric line."""
        self._window_tokens += self.tokens_per_step
        if not (log_now or agreed.save_due or agreed.stop):
            return
        self._flush_losses()
        if not log_now:
            return
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()  # a collective: every rank, at log steps only
        if self.rank == 0:
            tps = self._window_tokens / max(time.perf_counter() - self._window_t, 1e-9)
            values = {"lr": lr, "grad_norm": float(grad_norm), "tokens_per_s": tps,
                      "mfu": metrics.mfu(self.built.num_params, tps / self.world, self.peak_flops,
                                         self.built.trainable_params), "mem_gb": _peak_mem_gb(self.device)}
            print(format_metric_line(self.state.step, loss=self.state.last_loss, **values), flush=True)
            self.tracker.step_metrics(self.state.step, {**values, "tokens_per_s_per_device": tps / self.world})
        self._window_t, self._window_tokens = time.perf_counter(), 0

    # ---- stopping and the end ------------------------------------------------------------------------------

    def _segment_over(self, skew_s: float = 0.0) -> bool:
        """The segment's time is up (within `skew_s`): save and exit (spotrun/planner/segments.py); the next job goes
        on. The first rank whose clock passes it stops every rank through the agreement; the others, started within
        seconds of it, recognise the segment's end by their own clock rather than a peer's stop signal."""
        limit = self.cfg.segment_seconds
        return limit > 0 and time.monotonic() - self._started > limit - skew_s

    def _segment_end(self) -> Outcome:
        self._flush_losses()
        self.ckpt.save(self.state.step, blocking=True)
        self.ckpt.close()
        if self.rank == 0:
            print(f"run_stopped step={self.state.step} reason=segment-end", flush=True)
        self.tracker.close(step=self.state.step, reason="segment-end", completed=False)
        return Outcome("segment_end", self.state.step, message=f"segment ended at step {self.state.step}; "
                       f"{self.ckpt.intact_note()}")

    def _stopped(self, reason: str, *, save: bool) -> Outcome:
        if save:
            self._flush_losses()
            self.ckpt.save(self.state.step, blocking=True)
        self.ckpt.close()
        if self.rank == 0:
            print(f"run_stopped step={self.state.step} reason={reason}", flush=True)
        self.tracker.close(step=self.state.step, reason=reason, completed=False, signalled=self.stop_flag.requested)
        return self._stop_outcome()

    def _stop_outcome(self) -> Outcome:
        return Outcome("stopped", self.state.step, message=f"stopped at step {self.state.step}; "
                       f"{self.ckpt.intact_note()}", signalled=self.stop_flag.requested)

    def _write_summary(self, segments: list[dict], restored) -> None:
        # The whole run across restarts: training seconds of every start (up to its last checkpoint), its steps.
        wall = sum(s["seconds"] for s in segments)
        steps_run = sum(s["end_step"] - s["start_step"] for s in segments)
        tps_dev = steps_run * self.tokens_per_step / max(wall, 1e-9) / self.world
        summary = {
            "final_loss": self.state.last_loss, "steps": self.state.step, "tokens": self.state.tokens_seen,
            "parameters": self.built.num_params, "world_size": self.world, "samples_per_step": self.samples_per_step,
            "tokens_per_s_per_device": tps_dev,
            "mfu": metrics.mfu(self.built.num_params, tps_dev, self.peak_flops, self.built.trainable_params),
            "peak_mem_gb": _peak_mem_gb(self.device), "wall_s": wall, "starts": len(segments),
            "segments": segments, "resumed_from_step": restored.step if restored else None,
            "trainable_parameters": self.built.trainable_params,
            "memory_predicted_bytes": self.predicted.total if self.predicted else None,
            "memory_measured_bytes": self.mem_probe.measured()[0],
            "memory_measured_source": self.mem_probe.measured()[1],
            "base_val_loss": self.state.val.get("base"), "final_val_loss": self.state.val.get("last"),
            "best_val_loss": self.state.val.get("best"), "best_val_step": self.state.val.get("best_step"),
            "eval_seconds": self.state.eval_seconds,
        }
        (Path(self.cfg.output_dir) / "metrics.json").write_text(json.dumps(summary, indent=2))
        self.tracker.summary(self.state.step, summary)


def train(cfg: TrainConfig, *, local_rank: int, stop: StopFlag) -> Outcome:
    return Trainer(cfg, local_rank=local_rank, stop=stop).run()


def _join_process_group(local_rank: int) -> None:
    """init_process_group, inside the error report: a rank that cannot reach its peers (gloo's connectFullMesh, a
    rendezvous timeout) fails here, and its outcome then names the cause instead of the launcher's bare exit code."""
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
    try:
        dist.init_process_group(backend)
    except Exception as exc:
        where = (f"rank {os.environ.get('RANK', '?')} of {os.environ.get('WORLD_SIZE', '?')} could not join the "
                 f"process group (master {os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}, "
                 f"GLOO_SOCKET_IFNAME={os.environ.get('GLOO_SOCKET_IFNAME', '')!r})")
        raise StartupError(f"{where}: {type(exc).__name__}: {' '.join(str(exc).split())}") from exc


class StartupError(RuntimeError):
    """A worker could not start training (joining the process group); the message names the peer setup."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="spotrun FSDP2 training worker (started by torchrun)")
    parser.add_argument("--config", required=True, help="TrainConfig JSON written by the launcher")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # transformers' load/save progress bars are carriage-return redraws: noise in CloudWatch and the local log.
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    outcome_dir = os.environ.get(OUTCOME_DIR_ENV, "")
    cfg = from_json_file(args.config)
    Path(cfg.output_dir).mkdir(parents=True, exist_ok=True)
    stop = StopFlag()
    stop.install()
    rank = int(os.environ.get("RANK", "0"))
    try:
        _join_process_group(local_rank)
        outcome = train(cfg, local_rank=local_rank, stop=stop)
    except torch.OutOfMemoryError as exc:
        log.error("%s (%s)", OOM_HINT, exc)
        write_outcome(outcome_dir, rank, Outcome("failed", -1, OOM_HINT))
        _exit_after_failure()
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # NOTE: not just Exception: DCP's CheckpointException is a BaseException
        write_outcome(outcome_dir, rank, Outcome("failed", -1, f"{type(exc).__name__}: {exc}"))
        _exit_after_failure()
    write_outcome(outcome_dir, rank, outcome)
    dist.destroy_process_group()
    return 0


def _exit_after_failure() -> NoReturn:
    """Print the failure and exit 1 at once, without the interpreter's teardown (called inside an `except`).

    NOTE: after a failure the process group cannot be destroyed safely (a peer still inside a collective makes
    destroy_process_group wait: pytorch/torchtitan#1342), and left to the interpreter's teardown, gloo's threads
    release their work after the interpreter is gone: the process aborts ("terminate called without an active
    exception", SIGABRT: pytorch/pytorch#190489, #179291), and a stop signal arriving during the teardown finds
    the default handler back and kills it (-15). Its outcome is written; nothing else of it needs finishing."""
    traceback.print_exc()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


if __name__ == "__main__":
    sys.exit(main())
