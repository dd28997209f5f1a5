"""What one segment restart costs on the trainer side (spotrun/planner/segments.py; catalog `trainer_restart_seconds`).

A run in segments ends each job with a save (the trainer's `segment_seconds`) and starts the next job from the
checkpoint. Inside the container that restart is: the launcher, torchrun, the imports, building and sharding the
model, and restoring the checkpoint, before the first step. This runs the container entry point (launcher ->
torchrun -> 2 CPU workers) on the tiny example: one segment that ends after its first step, then the next one,
timed from the launcher's start to `run_start` (printed once the checkpoint is restored), several times.
Provisioning, the image pull and the S3 reads are not here: the catalog's `startup_seconds` and the planner's
by-size figures cover those.

    python benchmarks/segment_restart.py --repeats 3

Last line: `segment_restart_s median=X max=Y repeats=N`
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from spotrun.local.examples import build_example
from spotrun.local.harness import free_port, start_launcher, write_sagemaker_root

HP = {"nproc_per_node": 2, "training.micro_batch": 2, "max_steps": 8, "log_every": 4, "num_threads": 1,
      "training.seed": 3, "data.seq_len": 64, "checkpoint.interval_steps": 4, "checkpoint.keep": 2}


def restart_seconds(work: Path, assets: dict) -> float:
    root = work / "sm"
    ckpt = work / "checkpoints"

    def write(**hp) -> None:
        write_sagemaker_root(root, hyperparameters={**HP, "master_port": free_port(), **hp},
                             channels={"train": assets["data"], "model": assets["model"]}, checkpoint_dir=ckpt)

    write(segment_seconds="0.001")  # the first segment ends after its first step, with a save
    log = work / "first.log"
    if start_launcher(root, log).wait(timeout=600) != 0 or "reason=segment-end" not in log.read_text():
        raise SystemExit(f"the first segment did not end cleanly:\n{log.read_text()[-2000:]}")
    hyper = json.loads((root / "input" / "config" / "hyperparameters.json").read_text())
    del hyper["segment_seconds"]
    (root / "input" / "config" / "hyperparameters.json").write_text(json.dumps(hyper))
    log = work / "next.log"
    started = time.monotonic()
    proc = start_launcher(root, log)
    while "run_start" not in (log.read_text() if log.exists() else ""):
        if proc.poll() is not None:
            raise SystemExit(f"the next segment ended before its first step:\n{log.read_text()[-2000:]}")
        time.sleep(0.05)
    elapsed = time.monotonic() - started
    proc.wait(timeout=600)
    if "start_step=0 " in log.read_text():
        raise SystemExit("the next segment did not resume from the checkpoint")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="restarts to time")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        assets = build_example(work / "assets", "llama")
        times = []
        for i in range(args.repeats):
            times.append(restart_seconds(work / f"r{i}", assets))
            print(f"restart {i + 1}: {times[-1]:.1f} s", flush=True)
    print(f"segment_restart_s median={statistics.median(times):.1f} max={max(times):.1f} repeats={len(times)}")


if __name__ == "__main__":
    main()
