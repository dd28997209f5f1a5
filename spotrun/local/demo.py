"""A local spot training job, end to end, on this machine's CPUs: no AWS account, nothing downloaded.

Builds a tiny corpus, tokenizer and Llama-shaped model, starts the container's entry point (the launcher) on a
SageMaker-shaped directory with 2 worker processes, sends it SIGTERM mid-run as a spot interruption would,
starts it again on the same checkpoint directory, and checks that the resumed run completed and exported.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from .checkpoint import committed_checkpoints
from .examples import build_example, write_sagemaker_root
from .localrun import free_port, loss_history, start_launcher, wait_for_step


def run_demo(out: Path, *, steps: int = 40, interrupt_at: int = 15) -> dict:
    out = Path(out).resolve()
    assets = build_example(out / "assets", "llama")
    run_dir = out / f"run-{time.strftime('%Y%m%d-%H%M%S')}"
    ckpt = run_dir / "checkpoints"
    sm = write_sagemaker_root(run_dir / "sm", channels={"train": assets["data"], "model": assets["model"]},
                              checkpoint_dir=ckpt, hyperparameters={
                                  "nproc_per_node": 2, "master_port": free_port(), "micro_batch": 2,
                                  "max_steps": steps, "log_every": 5, "num_threads": 1, "data.seq_len": 64,
                                  "optim.lr": 3e-3, "optim.warmup_steps": 2, "checkpoint.interval_steps": 5})
    log = run_dir / "launcher.log"
    print(f"[demo] job directory {run_dir}; log {log}")
    proc = start_launcher(sm, log)
    wait_for_step(proc, sm / "model", interrupt_at)
    print(f"[demo] step {interrupt_at} reached: sending SIGTERM (a spot interruption notice)")
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=180)
    saved = committed_checkpoints(ckpt)[0][0] if committed_checkpoints(ckpt) else None
    print(f"[demo] launcher exited {rc} after saving step {saved}; restarting on the same checkpoint directory")
    if rc != 0:
        raise SystemExit(f"demo: the interrupted run did not stop cleanly; see {log}")
    proc = start_launcher(sm, log)
    rc = proc.wait(timeout=900)
    if rc != 0:
        raise SystemExit(f"demo: the resumed run failed (exit {rc}); see {log}")
    metrics = json.loads((sm / "model" / "metrics.json").read_text())
    losses = loss_history(sm / "model")
    summary = {"steps": metrics["steps"], "interrupted_at_step": saved, "resumed_from_step": metrics["resumed_from_step"],
               "first_loss": losses[1], "final_loss": metrics["final_loss"],
               "exported": sorted(p.name for p in (sm / "model").iterdir()), "output_dir": str(sm / "model")}
    print(json.dumps(summary, indent=2))
    return summary
