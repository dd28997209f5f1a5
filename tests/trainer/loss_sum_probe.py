"""Run under torchrun (4 ranks) by test_training.py: does a step's summed loss depend on how many steps are reduced
with it? Each rank holds 64 float32 values; every window of 1..8 consecutive values is reduced on its own and
compared bitwise with the same values reduced as part of the full tensor, by the trainer's rank_ordered_sum and,
for the record, by gloo's all_reduce(SUM)."""

import json
import os
import sys

import torch
import torch.distributed as dist

from spotrun_trainer.agreement import rank_ordered_sum

out = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
values = torch.rand(64, generator=torch.Generator().manual_seed(17 + rank), dtype=torch.float32) * 8 + 1
full_ours = rank_ordered_sum(values)
full_reduced = values.clone()
dist.all_reduce(full_reduced)
windows = ours_differ = reduced_differ = 0
for length in range(1, 9):
    for start in range(0, 64 - length + 1, length):
        part = values[start:start + length].clone()
        windows += 1
        ours_differ += int(not torch.equal(rank_ordered_sum(part), full_ours[start:start + length]))
        dist.all_reduce(part)
        reduced_differ += int(not torch.equal(part, full_reduced[start:start + length]))
gathered = [None] * dist.get_world_size()
dist.all_gather_object(gathered, full_ours.tolist())
if rank == 0:
    with open(out, "w") as fh:
        json.dump({"windows": windows, "ours_differ": ours_differ, "all_reduce_differ": reduced_differ,
                   "same_on_every_rank": all(g == gathered[0] for g in gathered)}, fh)
dist.destroy_process_group()
# NOTE: the results are written; leave without the interpreter's teardown, where gloo's worker threads can still
# hold tensors whose release then aborts the process (SIGABRT: pytorch/pytorch#179291). The trainer's own exit
# copes with that in the launcher (decide_exit).
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
