"""Run under torchrun by test_training.py: build a model with the trainer's own code and report its sharding."""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM

from spotrun.settings.sections import ModelConfig, ShardingConfig
from spotrun_trainer.model import build_mesh, build_sharded_model

model_dir, out = sys.argv[1], sys.argv[2]
# mode, nodes, group_nodes: the trainer's own ShardingConfig (2-D mesh for hybrid)
sharding = ShardingConfig(mode=sys.argv[3], nodes=int(sys.argv[4]), group_nodes=int(sys.argv[5])) \
    if len(sys.argv) > 3 else ShardingConfig()
dist.init_process_group("gloo")
world = dist.get_world_size()
mesh = build_mesh("cpu", world, sharding)
built = build_sharded_model(ModelConfig(path=model_dir), mesh=mesh, device=torch.device("cpu"), seed=0)
params = []
for name, p in built.model.named_parameters():
    params.append({"name": name, "dtensor": isinstance(p, DTensor),
                   "placements": [repr(pl) for pl in p.placements] if isinstance(p, DTensor) else [],
                   "mesh_size": p.device_mesh.size() if isinstance(p, DTensor) else 0,
                   "global_rows": p.shape[0], "local_rows": p.to_local().shape[0] if isinstance(p, DTensor) else -1})
buffers_on_meta = [n for n, b in built.model.named_buffers() if b.is_meta]
# The weights every rank received must be rank 0's full model, buffers (rotary inv_freq, ...) included.
full = get_model_state_dict(built.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
ref_sd = reference.state_dict()
weights_match = dist.get_rank() != 0 or all(torch.equal(full[k], ref_sd[k]) for k in full)
ref_buffers = dict(reference.named_buffers())
buffers_match = all(torch.equal(b, ref_buffers[n]) for n, b in built.model.named_buffers())
report = {"rank": dist.get_rank(), "params": params, "blocks": len(built.blocks),
          "blocks_fsdp": [isinstance(b, FSDPModule) for b in built.blocks],
          "root_fsdp": isinstance(built.model, FSDPModule), "buffers_on_meta": buffers_on_meta,
          "weights_match": weights_match, "buffers_match": buffers_match}
with open(f"{out}.rank{dist.get_rank()}.json", "w") as fh:
    json.dump(report, fh)
dist.destroy_process_group()
# NOTE: the results are written; leave without the interpreter's teardown, where gloo's worker threads can still
# hold tensors whose release then aborts the process (SIGABRT: pytorch/pytorch#179291). The trainer's own exit
# copes with that in the launcher (decide_exit).
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
