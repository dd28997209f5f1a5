"""The trainer against its physical limits, side by side in one run; prints docs/benchmarks.md's Markdown table.

    python benchmarks/perf_bench.py [--steps 30 --trials 2]

On this machine (CPU processes, gloo) it measures, each goal beside it:
  - step overhead: the trainer's steps (through the container entry point, no checkpoints) against the bare
    FSDP2 loop of benchmarks/bare_loop.py on the same config, model, data and steps (goal <= 3%);
  - checkpoint (benchmarks/checkpoint_bench.py, ~85M-parameter Llama shape): training time blocked per periodic
    save against a bare memcpy of the same bytes (goal <= 1.5x) and against a rank-0 full-state torch.save, with
    the parts it is made of; the emergency save's throughput against dd with one writer, measured with one rank
    so one process writes in both (goal >= 70%), with its parts (DCP's write, the sha256); the LoRA rows of the
    same base (rank 16, every linear layer);
  - resume: process start to the first step after an interruption, against a cold start of the same run
    (goal <= 1.2x).
Trials alternate trainer and bare loop; the fastest of each is compared (the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import checkpoint_bench  # a sibling script: this directory is the script's first sys.path entry
from throughput import PRESETS, synthetic_shards

from spotrun.local.harness import free_port, kill_tree, start_launcher, write_sagemaker_root
from spotrun.seams import parse_metric_line

ROOT = Path(__file__).resolve().parent

RESUME_MODEL = {"model_type": "llama", "hidden_size": 640, "intermediate_size": 1920, "num_hidden_layers": 10,
                "num_attention_heads": 8, "vocab_size": 32000, "max_position_embeddings": 256,
                "tie_word_embeddings": False}


def _sm_root(work: Path, name: str, hp: dict, data: Path, ckpt: Path | None) -> Path:
    return write_sagemaker_root(work / name, hyperparameters={**hp, "master_port": free_port()},
                                channels={"train": data}, checkpoint_dir=ckpt)


def step_overhead(work: Path, steps: int, trials: int) -> dict:
    preset = PRESETS["cpu-small"]
    data = synthetic_shards(work / "data-small", preset["model"]["vocab_size"],
                            tokens=(steps + 2) * preset["micro_batch"] * 2 * preset["seq_len"] + preset["seq_len"])
    hp = {"nproc_per_node": 2, "num_threads": 1, "training.micro_batch": preset["micro_batch"], "max_steps": steps,
          "log_every": 10, "data.seq_len": preset["seq_len"], "model.config": preset["model"], "training.lr": 1e-4}
    log_every = hp["log_every"]
    tokens_per_step = preset["micro_batch"] * 2 * preset["seq_len"]
    trainer_s, bare_s, trainer_steady_s, bare_steady_s = [], [], [], []
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for trial in range(trials):
        sm = _sm_root(work, f"overhead-{trial}", hp, data, None)
        log = work / f"overhead-{trial}.log"
        if start_launcher(sm, log).wait() != 0:
            raise RuntimeError(log.read_text()[-3000:])
        # Whole run: the trainer's wall time from its start (after the model and checkpoint load; it includes
        # the first step and the ranks' start skew) per step.
        trainer_s.append(json.loads((sm / "model" / "metrics.json").read_text())["wall_s"] / steps)
        # Steady state: the metric lines' windows after the first (tokens_per_s is the whole job's, per window).
        rates = {m["step"]: m["tokens_per_s"] for m in map(parse_metric_line, log.read_text().splitlines()) if m}
        windows = range(2 * log_every, steps + 1, log_every)
        trainer_steady_s.append(sum(log_every * tokens_per_step / rates[s] for s in windows)
                                / (log_every * len(windows)))
        for warmup, into in ((0, bare_s), (log_every, bare_steady_s)):
            out = work / f"bare-{trial}-{warmup}.json"
            subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                            "--master_port", str(free_port()), str(ROOT / "bare_loop.py"), "--sm-root", str(sm),
                            "--out", str(out), "--warmup", str(warmup)], env=env, check=True, capture_output=True)
            bare = json.loads(out.read_text())
            into.append(bare["seconds_timed"] / bare["steps_timed"])
    return {"trainer_step_s": min(trainer_s), "bare_step_s": min(bare_s), "steps": steps, "trials": trials,
            "trainer_steady_s": min(trainer_steady_s), "bare_steady_s": min(bare_steady_s), "warmup": log_every}


def _wait_for(log: Path, needle: str, proc: subprocess.Popen, timeout: float = 900) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and needle in log.read_text(errors="replace"):
            return time.monotonic()
        if proc.poll() is not None:
            raise RuntimeError(f"run ended before {needle!r}:\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.02)
    raise TimeoutError(needle)


def resume_time(work: Path) -> dict:
    seq, micro = 64, 1
    data = synthetic_shards(work / "data-resume", RESUME_MODEL["vocab_size"], tokens=40 * micro * 2 * seq + seq)
    hp = {"nproc_per_node": 2, "num_threads": 1, "training.micro_batch": micro, "max_steps": 30, "log_every": 1,
          "data.seq_len": seq, "model.config": RESUME_MODEL, "training.lr": 1e-4, "checkpoint.interval_steps": 4}
    sm = _sm_root(work, "resume", hp, data, work / "resume-ckpt")
    log = work / "resume-cold.log"
    t0 = time.monotonic()
    proc = start_launcher(sm, log)
    cold = _wait_for(log, "\nstep=1 ", proc) - t0
    _wait_for(log, "\nstep=6 ", proc)
    proc.send_signal(signal.SIGTERM)  # a spot notice: save at the agreed step and stop
    proc.wait(timeout=300)
    stopped = [line for line in log.read_text().splitlines() if line.startswith("run_stopped")]
    stop_step = int(stopped[-1].split()[1].split("=")[1])
    log = work / "resume-warm.log"
    t0 = time.monotonic()
    proc = start_launcher(sm, log)
    warm = _wait_for(log, f"\nstep={stop_step + 1} ", proc) - t0
    kill_tree(proc)
    return {"cold_s": cold, "resume_s": warm, "stop_step": stop_step}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30, help="steps per step-overhead trial (default 30)")
    parser.add_argument("--trials", type=int, default=2, help="step-overhead trials (default 2)")
    parser.add_argument("--skip", nargs="*", default=[], choices=["overhead", "checkpoint", "resume"])
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="spotrun-perf-bench-"))
    table: list[tuple[str, str]] = []
    try:
        if "overhead" not in args.skip:
            o = step_overhead(work, args.steps, args.trials)
            w = o["warmup"]
            table += [("step, whole run: trainer (entry point, 2 ranks, cpu-small)",
                       f"{o['trainer_step_s'] * 1e3:.1f} ms"),
                      ("step, whole run: bare FSDP2 loop, same model/data/steps", f"{o['bare_step_s'] * 1e3:.1f} ms"),
                      ("step overhead, whole run", f"{(o['trainer_step_s'] / o['bare_step_s'] - 1) * 100:+.1f}%"),
                      (f"step, after {w} steps: trainer (its metric lines' windows)",
                       f"{o['trainer_steady_s'] * 1e3:.1f} ms"),
                      (f"step, after {w} steps: bare FSDP2 loop (--warmup {w})", f"{o['bare_steady_s'] * 1e3:.1f} ms"),
                      ("step overhead, steady state (goal <= 3%)",
                       f"{(o['trainer_steady_s'] / o['bare_steady_s'] - 1) * 100:+.1f}%")]
        if "checkpoint" not in args.skip:
            two = checkpoint_bench.measure(hidden=640, layers=10, nproc=2, directory=work / "ckpt2", lora_rank=16)
            one = checkpoint_bench.measure(hidden=640, layers=10, nproc=1, directory=work / "ckpt1")
            gb1 = one["checkpoint_bytes"] / 1e9
            table += [(f"checkpoint: {k}", v) for k, v in checkpoint_bench.rows(two) if "throughput" not in k]
            table += [("checkpoint, 1 rank: sync save", f"{one['sync_s']:.3f} s ({gb1 * 1e3 / one['sync_s']:.0f}"
                                                         " MB/s)"),
                      ("checkpoint, 1 rank: sync save parts: DCP write / sha256 of the written files",
                       f"{one['parts']['dcp_write_s']:.3f} s / {one['parts']['sha256_s']:.3f} s"),
                      ("checkpoint, 1 rank: dd conv=fsync, one writer", f"{one['dd_bytes_per_s'] / 1e6:.0f} MB/s"),
                      ("sync save throughput / dd, one writer each (goal >= 0.70)",
                       f"{gb1 * 1e9 / one['sync_s'] / one['dd_bytes_per_s']:.2f}")]
        if "resume" not in args.skip:
            r = resume_time(work)
            table += [("resume: cold start to first step (~85M Llama, 2 ranks)", f"{r['cold_s']:.1f} s"),
                      (f"resume: restart to first step after a stop at step {r['stop_step']}",
                       f"{r['resume_s']:.1f} s"),
                      ("resume / cold (goal <= 1.2)", f"{r['resume_s'] / r['cold_s']:.2f}")]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("| measure | value |\n|---|---|")
    for k, v in table:
        print(f"| {k} | {v} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
