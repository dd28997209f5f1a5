"""Inside the trainer image, under torchrun: the worker's start-up on a spot restart, phase by phase.

Run by benchmarks/restart_cost.py (`docker run --entrypoint python <image> -m torch.distributed.run ...
/bench/restart_probe.py`) on a SageMaker root whose checkpoints directory holds a committed checkpoint. It plans
the run from /opt/ml exactly as the launcher does, then times what a worker does before its first step, using the
trainer's own classes: imports, the process group, the model build (the checkpoint's hashes are verified in a
thread meanwhile), the wait for that verification plus the DCP load, and the first step. Rank 0 prints one JSON
line `restart_probe {...}` with wall-clock marks (time.time(), comparable with the container's start time).
"""

import json
import time

MARKS = {"probe_start": time.time()}

import torch.distributed as dist  # noqa: E402
import transformers  # noqa: E402, F401 - part of what a worker imports

from spotrun_trainer.launcher import SageMakerEnv, plan_launch  # noqa: E402
from spotrun_trainer.train import StopFlag, Trainer  # noqa: E402

MARKS["imports"] = time.time()


def main() -> None:
    from pathlib import Path

    sm = SageMakerEnv.read(Path("/opt/ml"))
    plan = plan_launch(sm, gpu_count=0, efa_devices=[], ofi_nccl_found=False, config_path=Path("/tmp/cfg.json"),
                       outcome_dir=Path("/tmp/outcome"))
    dist.init_process_group("gloo")
    MARKS["process_group"] = time.time()
    trainer = Trainer(plan.config, local_rank=int(__import__("os").environ["LOCAL_RANK"]), stop=StopFlag())
    MARKS["model_build"] = time.time()
    restored = trainer.ckpt.load()
    MARKS["verify_and_load"] = time.time()
    trainer.train_step(need_grad_norm=False)
    dist.barrier()
    MARKS["first_step"] = time.time()
    if dist.get_rank() == 0:
        print("restart_probe " + json.dumps({"marks": MARKS, "resumed_step": restored.step if restored else None,
                                             "parameters": trainer.built.num_params}), flush=True)
    trainer.ckpt.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
