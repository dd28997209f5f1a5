"""Run under torchrun by test_token_weighting.py: one optimizer step's forward/backward with the trainer's own
code (Trainer.accumulate, the logged loss through LossHistory); rank 0 writes the logged loss and the full
(unsharded) gradients of every trainable parameter."""

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from spotrun.settings.wire import from_json_file
from spotrun_trainer.train import StopFlag, Trainer

cfg_path, out = sys.argv[1], Path(sys.argv[2])
dist.init_process_group("gloo")
trainer = Trainer(from_json_file(cfg_path), local_rank=int(os.environ["LOCAL_RANK"]), stop=StopFlag())
trainer.losses.add(1, trainer.accumulate())
(_, loss), = trainer.losses.flush()  # what the metric line and loss_history.jsonl carry
grads = {name: p.grad.full_tensor() for name, p in trainer.model.named_parameters() if p.grad is not None}
if dist.get_rank() == 0:
    torch.save({"loss": loss, "grads": grads}, out)
dist.barrier()
dist.destroy_process_group()
# NOTE: the results are written; leave without the interpreter's teardown, where gloo's worker threads can still
# hold tensors whose release then aborts the process (SIGABRT: pytorch/pytorch#179291). The trainer's own exit
# copes with that in the launcher (decide_exit).
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
