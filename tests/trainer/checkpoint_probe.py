"""Run under torchrun by test_topology.py: load a checkpoint into this topology with the trainer's own code and
write the full (unsharded) model and optimizer state it ended up with, so the test can compare it bitwise with the
checkpoint read offline."""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

from spotrun.settings.sections import CheckpointConfig, ModelConfig, ShardingConfig
from spotrun_trainer.checkpoint import CheckpointManager
from spotrun_trainer.model import build_mesh, build_sharded_model

model_dir, ckpt_dir, out = sys.argv[1], sys.argv[2], sys.argv[3]
sharding = ShardingConfig(**json.loads(sys.argv[4]))
dist.init_process_group("gloo")
mesh = build_mesh("cpu", dist.get_world_size(), sharding)
built = build_sharded_model(ModelConfig(path=model_dir), mesh=mesh, device=torch.device("cpu"), seed=0)
optimizer = torch.optim.AdamW(built.model.parameters(), lr=1e-3)
ckpt = CheckpointManager(CheckpointConfig(dir=ckpt_dir, async_save=False), model=built.model, optimizer=optimizer,
                         local_rank=int(__import__("os").environ["LOCAL_RANK"]))
restored = ckpt.load()
model_sd, optim_sd = get_state_dict(built.model, optimizer,
                                    options=StateDictOptions(full_state_dict=True, cpu_offload=True))
if dist.get_rank() == 0:
    torch.save({"step": restored.step, "model": model_sd, "optim": optim_sd}, out)
dist.barrier()
dist.destroy_process_group()
# NOTE: the results are written; leave without the interpreter's teardown, where gloo's worker threads can still
# hold tensors whose release then aborts the process (SIGABRT: pytorch/pytorch#179291). The trainer's own exit
# copes with that in the launcher (decide_exit).
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
