"""Torture test for spot-proof checkpoints: kill the 2-process CPU training at random moments, restart, compare.

Each trial runs the container entry point (launcher -> torchrun -> 2 workers) on a fresh job directory and
interrupts it 1-2 times: mostly at a random step plus a random fraction of a second (saves run every 2 steps, so
many kills land inside an asynchronous save), sometimes during start-up or checkpoint loading; by SIGKILL of the
whole process tree (an instance vanishing) or SIGTERM (a spot notice: save and stop). It restarts until the run
completes, then compares per-step losses and exported weights with an uninterrupted run, bit for bit.

    python benchmarks/torture.py --trials 20
    python benchmarks/torture.py --trials 20 --method lora     # LoRA: adapter-only checkpoints, adapter export

Last line: `method=full|lora trials=N resumed_ok=N torn_loaded=0 bitwise_equal=true|false`
  resumed_ok    trials that completed after their interruptions with losses and weights identical to the baseline
  torn_loaded   restarts that resumed from a checkpoint which was not complete (its manifest did not verify at the
                moment of the restart) or whose first resumed step diverged from the baseline
"""

from __future__ import annotations

import argparse
import random
import re
import signal
import sys
import tempfile
import time
from pathlib import Path

from safetensors.torch import load_file

from spotrun.local.examples import build_example
from spotrun.local.harness import (
    free_port,
    kill_tree,
    loss_history,
    start_launcher,
    wait_for_step,
    write_sagemaker_root,
)
from spotrun.seams import CHECKPOINT_MANIFEST, CHECKPOINT_STEP_PREFIX
from spotrun_trainer.checkpoint import step_dir, verify

# exported weights compared at training precision
HP = {"nproc_per_node": 2, "training.micro_batch": 2, "max_steps": 16, "log_every": 4, "num_threads": 1,
      "deterministic": True, "training.seed": 5, "training.lr": 3e-3, "data.seq_len": 64,
      "checkpoint.interval_steps": 2, "checkpoint.keep": 2, "export.dtype": "float32"}
# LoRA variant: rank 8 adapters on every linear layer of the same base, dropout on (per-rank RNG must resume too).
LORA_HP = {"training.method": "lora", "training.lora.rank": 8, "training.lora.alpha": 16, "training.lora.dropout": 0.1,
           "training.lr": 1e-2}
WEIGHTS = {"full": "model.safetensors", "lora": "adapter_model.safetensors"}


def make_job(root: Path, assets: dict) -> Path:
    return write_sagemaker_root(root / "sm", hyperparameters={**HP, "master_port": free_port()},
                                channels={"train": assets["data"], "model": assets["model"]},
                                checkpoint_dir=root / "checkpoints")


def same_weights(a: Path, b: Path) -> bool:
    weights = WEIGHTS[HP.get("training.method", "full")]
    x, y = load_file(a / weights), load_file(b / weights)
    return x.keys() == y.keys() and all(x[k].equal(y[k]) for k in x)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--workdir", type=Path, default=None, help="keep job directories here (default: temp)")
    parser.add_argument("--method", choices=sorted(WEIGHTS), default="full",
                        help="full fine-tune, or LoRA adapters on the same base (adapter-only checkpoints)")
    args = parser.parse_args()
    if args.method == "lora":
        HP.update(LORA_HP)
    rng = random.Random(args.seed)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="spotrun-torture-"))
    assets = build_example(work / "assets", "llama")

    base = work / "baseline"
    sm = make_job(base, assets)
    t0 = time.monotonic()
    if start_launcher(sm, base / "launcher.log").wait() != 0:
        print(f"baseline failed: see {base / 'launcher.log'}")
        return 1
    baseline_s = time.monotonic() - t0
    started = time.monotonic()
    ref_losses = loss_history(sm / "model")
    print(f"baseline: {len(ref_losses)} steps in {baseline_s:.1f}s", flush=True)

    resumed_ok = torn_loaded = unclean_stops = 0
    all_equal = True
    for trial in range(args.trials):
        root = work / f"trial-{trial:02d}"
        sm = make_job(root, assets)
        log = root / "launcher.log"
        events = []
        for _ in range(1 if rng.random() < 0.6 else 2):
            proc = start_launcher(sm, log)
            done = max(loss_history(sm / "model"), default=0)
            if rng.random() < 0.2 or done >= HP["max_steps"] - 1:  # during start-up, load or the first step
                when = f"{rng.uniform(1.0, 6.0):.1f}s"
                deadline = time.monotonic() + float(when[:-1])
                while time.monotonic() < deadline and proc.poll() is None:
                    time.sleep(0.01)
            else:  # at a random step, a random moment after it (saves run every 2 steps)
                target = min(HP["max_steps"] - 1, done + rng.randint(1, 6))
                wait_for_step(proc, sm / "model", target)
                extra = rng.uniform(0.0, 0.4)
                time.sleep(extra)
                when = f"step{target}+{extra:.2f}s"
            if proc.poll() is not None:
                break
            if rng.random() < 0.6:
                kill_tree(proc)
                events.append(f"SIGKILL@{when}")
            else:
                proc.send_signal(signal.SIGTERM)
                try:
                    rc = proc.wait(timeout=120)
                except Exception:  # noqa: BLE001 - a hung stop is a failure of the trial, not the tool
                    kill_tree(proc)
                    rc = "hung"
                # A stop must end cleanly: exit 0 and no output/failure (SageMaker would report a failure).
                clean = rc == 0 and not (sm / "output" / "failure").exists()
                unclean_stops += int(not clean)
                events.append(f"SIGTERM@{when}{'' if clean else f'(UNCLEAN rc={rc})'}")
        # Before restarting: which checkpoints are complete right now (independently of the trainer's choice)?
        complete_now = {int(p.name.split("-")[1]) for p in (root / "checkpoints").glob(CHECKPOINT_STEP_PREFIX + "*")
                        if verify(p)[0] is not None} if (root / "checkpoints").exists() else set()
        before = log.read_text(errors="replace") if log.exists() else ""
        while True:
            rc = start_launcher(sm, log).wait()
            if rc == 0 and (sm / "model" / "metrics.json").exists():
                break
            events.append(f"restart-rc={rc}")
            if len(events) > 6:
                break
        after = log.read_text(errors="replace")[len(before):]
        starts = [int(m) for m in re.findall(r"start_step=(\d+)", after)]
        resumed = starts[0] if starts else -1
        torn = resumed > 0 and resumed not in complete_now and not (step_dir(root / "checkpoints", resumed)
                                                                     / CHECKPOINT_MANIFEST).exists()
        losses = loss_history(sm / "model")
        diverged = resumed > 0 and losses.get(resumed + 1) != ref_losses.get(resumed + 1)
        torn_loaded += int(torn or diverged)
        equal = losses == ref_losses and (sm / "model" / WEIGHTS[args.method]).exists() and \
            same_weights(sm / "model", base / "sm" / "model")
        all_equal &= equal
        resumed_ok += int(equal)
        all_starts = [int(m) for m in re.findall(r"start_step=(\d+)", log.read_text(errors="replace"))]
        print(f"trial {trial:02d}: {' '.join(events) or 'no interruption'} -> launches started at steps "
              f"{all_starts}, "
              f"bitwise {'equal' if equal else 'DIFFERENT'}", flush=True)
    print(f"{args.trials} trials in {time.monotonic() - started:.0f}s; unclean stops after SIGTERM: {unclean_stops}",
          flush=True)
    print(f"method={args.method} trials={args.trials} resumed_ok={resumed_ok} torn_loaded={torn_loaded} "
          f"bitwise_equal={'true' if all_equal else 'false'}")
    return 0 if all_equal and torn_loaded == 0 and unclean_stops == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
