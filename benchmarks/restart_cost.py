"""What a spot restart costs inside the trainer image, from the container's start to the first step after resuming.

For each model (the demo's, and a ~0.37 B-parameter Llama: about the largest whose full training state, 16 bytes
per parameter, its checkpoint and the save's staging copy fit this 24 GB machine with room to spare):
  1. a first container trains until a periodic checkpoint is committed and is stopped (`docker stop -t 120`);
  2. the restart, twice, each on a fresh /opt/ml holding only that checkpoints directory (what SageMaker gives a
     restarted job), the image already pulled:
     - the real entry point (`docker run <image> train`), its phases from Docker's log timestamps: container
       start -> the launcher starts torchrun (launcher + its pre-check) -> `checkpoint: resumed` -> first step;
     - benchmarks/restart_probe.py under torchrun in the same image: the worker's imports, process group, model
       build (hashing the checkpoint meanwhile), the wait for the hashes + DCP load, the first step.
Results are printed and written as JSON (--out). Needs Docker (as the image tests: .ci/dockerd.sh start) and an
image built from the synthesized asset (default: built here as tests/image builds it, on the stand-in base).

    python -m benchmarks.restart_cost --out restart_cost.json   # from the repository root (it uses tests.image)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from datetime import datetime
from pathlib import Path

from spotrun.local.demo import build_assets
from spotrun.local.examples import save_model
from tests.image.images import build_trainer, docker, standin_base
from tests.image.sagemaker_host import Host, lay_out, stop

ROOT = Path(__file__).resolve().parents[1]

LARGE = {"model_type": "llama", "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
         "num_attention_heads": 16, "num_key_value_heads": 8, "max_position_embeddings": 512,
         "tie_word_embeddings": False}
HP = {"nproc_per_node": 2, "training.micro_batch": 1, "data.seq_len": 128, "max_steps": 50, "log_every": 1,
      "num_threads": 1, "checkpoint.interval_steps": 2, "checkpoint.keep": 2}


def _ts(text: str) -> float:
    """Docker's RFC 3339 nanosecond timestamp as epoch seconds."""
    head, _, frac = text.rstrip("Z").partition(".")
    return datetime.fromisoformat(head + "+00:00").timestamp() + float("0." + (frac or "0"))


def _log_marks(name: str, resumed_step: int) -> dict:
    out = subprocess.run(["docker", "logs", "--timestamps", name], capture_output=True, text=True).stdout
    err = subprocess.run(["docker", "logs", "--timestamps", name], capture_output=True, text=True).stderr
    lines = sorted((out + err).splitlines())
    marks = {"container_start": _ts(docker("inspect", "--format", "{{.State.StartedAt}}", name).strip())}
    for line in lines:
        stamp, _, text = line.partition(" ")
        if "launch:" in text and "torchrun_launch" not in marks:
            marks["torchrun_launch"] = _ts(stamp)
        elif "checkpoint: resumed from" in text and "resumed" not in marks:
            marks["resumed"] = _ts(stamp)
        elif text.startswith(f"step={resumed_step + 1} ") and "first_step" not in marks:
            marks["first_step"] = _ts(stamp)
    return marks


def _phases(marks: dict, order: list[str]) -> dict:
    return {f"{a}->{b}": round(marks[b] - marks[a], 2) for a, b in zip(order[:-1], order[1:], strict=True)} | {
        "total": round(marks[order[-1]] - marks[order[0]], 2)}


def measure(image: str, name: str, model_dir: Path, data_dir: Path, work: Path) -> dict:
    channels = {"train": data_dir, "model": model_dir}
    first = Host.start(image, lay_out(work / "first", host="algo-1", hosts=["algo-1"], hyperparameters=HP,
                                      channels=channels), host="algo-1", name=f"restart-{name}-first")
    try:
        deadline = time.monotonic() + 1800
        while not list((first.checkpoints).glob("step-*/manifest.json")):
            assert first.running() and time.monotonic() < deadline, first.logs()[-3000:]
            time.sleep(0.5)
        stop(first)
    finally:
        first.remove()
    committed = sorted(p.parent.name for p in first.checkpoints.glob("step-*/manifest.json"))
    step = int(committed[-1].split("-")[1])
    ckpt_bytes = sum(p.stat().st_size for p in (first.checkpoints / committed[-1]).iterdir())

    real = Host.start(image, lay_out(work / "real", host="algo-1", hosts=["algo-1"], hyperparameters=HP,
                                     channels=channels, checkpoints_from=[first.checkpoints]),
                      host="algo-1", name=f"restart-{name}-real")
    try:
        real.wait_for_step(step + 1, timeout=1800)
        marks = _log_marks(real.name, step)
        stop(real)
    finally:
        real.remove()

    probe_root = lay_out(work / "probe", host="algo-1", hosts=["algo-1"], hyperparameters=HP, channels=channels,
                         checkpoints_from=[first.checkpoints])
    probe_name = f"restart-{name}-probe"
    docker("run", "--name", probe_name, "--hostname", "algo-1", "--volume", f"{probe_root}:/opt/ml",
           "--volume", f"{ROOT / 'benchmarks'}:/bench:ro", "--entrypoint", "python", image,
           "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", "29511", "/bench/restart_probe.py", timeout=1800)
    try:
        logs = subprocess.run(["docker", "logs", probe_name], capture_output=True, text=True).stdout
        started = _ts(docker("inspect", "--format", "{{.State.StartedAt}}", probe_name).strip())
    finally:
        docker("rm", "--force", probe_name, check=False)
    probe = json.loads(next(line for line in logs.splitlines() if line.startswith("restart_probe "))[14:])
    probe["marks"]["container_start"] = started
    return {"model": name, "parameters": probe["parameters"], "checkpoint_step": step,
            "checkpoint_bytes": ckpt_bytes, "resumed_step": probe["resumed_step"],
            "entry_point": _phases(marks, ["container_start", "torchrun_launch", "resumed", "first_step"]),
            "worker": _phases(probe["marks"], ["container_start", "probe_start", "imports", "process_group",
                                               "model_build", "verify_and_load", "first_step"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--image", help="trainer image tag (default: build it from a fresh synth)")
    parser.add_argument("--models", default="demo,large", help="comma-separated: demo, large")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="spotrun-restart-") as tmp:
        work = Path(tmp)
        image = args.image or _build_image(work)
        assets = build_assets(work / "assets")
        from spotrun_trainer.data import prepare

        prepare([assets["corpus"] / "stdlib.jsonl"], str(work / "assets" / "tokenizer"), work / "data")
        models = {"demo": assets["model"]}
        if "large" in args.models:
            models["large"] = save_model(LARGE, work / "models" / "large", vocab_size=1024,
                                         tokenizer_dir=work / "assets" / "tokenizer")
        results = []
        for name in args.models.split(","):
            results.append(measure(image, name, models[name], work / "data", work / "runs" / name))
            print(json.dumps(results[-1]), flush=True)
            if args.out:
                args.out.write_text(json.dumps(results, indent=1) + "\n")


def _build_image(work: Path) -> str:
    from app import build_app

    build_app(outdir=str(work / "cdk.out")).synth()
    return build_trainer(work / "cdk.out", base=standin_base(), torch_pip="torch==2.13.0",
                         tag="spotrun-trainer-bench:latest").tag


if __name__ == "__main__":
    main()
