"""Layouts a run can take (instance type x nodes x sharding) and the time of a micro-batch on each.

Stdlib only (the planner's Lambda imports it). The rules, with the numbers in catalog.json's `defaults`:

- Sharding. `full`: FSDP over every GPU of every node. `hybrid`: FSDP within groups of `group_nodes` nodes,
  replicated across groups. A shard group that spans nodes runs its per-layer all-gathers and reduce-scatters over
  the network, which only EFA makes fast enough: a node type without EFA is never used for cross-node sharding
  (its multi-node layouts are hybrid with one node per group).
- Communication per micro-batch and GPU (FSDP2 re-gathers every micro-batch; ring collectives move (S-1)/S of the
  buffer through each GPU): all-gathers of the parameters in the compute dtype in forward and again in backward,
  a reduce-scatter of the trainable gradients in fp32, and across replicas an all-reduce of each GPU's fp32
  gradient shard (2 (R-1)/R of it). Bandwidth: the GPU's link inside a node (NVLink/NVSwitch or PCIe), the node's
  network divided by its GPUs between nodes (the slower of the two when a group spans nodes), times a collective
  efficiency (NCCL's bus bandwidth against the line rate: lower among PCIe GPUs, whose collectives go through the
  CPUs, and over TCP sockets without EFA).
- Compute per micro-batch: 6 N per token for a full fine-tune (+2 N recomputing the forward under activation
  checkpointing); LoRA 4 N + 6 N_adapter (frozen weights get no gradient). FLOPs / (peak * utilization).
- Overlap: FSDP prefetches the next unit while the current one computes, so communication hides behind compute up
  to `comm_overlap_fraction` of the compute time; what does not fit is exposed and adds to the step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .memory import FP32


@dataclass(frozen=True)
class Layout:
    instance_type: str
    nodes: int
    gpus_per_node: int
    sharding: str  # full | hybrid
    group_nodes: int  # nodes per shard group (full: all of them)

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def shard_ranks(self) -> int:
        return self.group_nodes * self.gpus_per_node

    @property
    def replicas(self) -> int:
        return self.nodes // self.group_nodes

    def describe(self) -> str:
        where = f"{self.nodes} x {self.instance_type}"
        if self.sharding == "full":
            return f"{where}, one GPU" if self.world == 1 else f"{where}, full sharding over {self.world} GPUs"
        return (f"{where}, hybrid sharding: shard groups of {self.group_nodes} node(s) ({self.shard_ranks} GPUs), "
                f"{self.replicas} replicas")


def layouts(itype: str, spec: dict, nodes: int) -> list[Layout]:
    """Every sharding of `nodes` nodes of one type; cross-node shard groups only with EFA."""
    gpus = spec["gpus"]
    if nodes == 1:
        return [Layout(itype, 1, gpus, "full", 1)]
    out = [Layout(itype, nodes, gpus, "full", nodes)] if spec.get("efa") else []
    for group in range(1, nodes):
        if nodes % group == 0 and (group == 1 or spec.get("efa")):
            out.append(Layout(itype, nodes, gpus, "hybrid", group))
    return out


def _bandwidths(spec: dict, defaults: dict) -> tuple[float, float]:
    """(bytes/s per GPU inside a node, bytes/s per GPU between nodes), after collective efficiency."""
    eff = defaults["collective_efficiency"]
    intra_eff = defaults.get("pcie_collective_efficiency", eff) if spec.get("interconnect") == "pcie" else eff
    intra = spec["gpu_link_gb_per_s"] * 1e9 * intra_eff
    inter_eff = eff if spec.get("efa") else defaults["tcp_collective_efficiency"]
    inter = spec["network_gbps"] / 8 * 1e9 / spec["gpus"] * inter_eff
    return intra, inter


def comm_seconds(layout: Layout, spec: dict, defaults: dict, *, total_params: int, trainable_params: int,
                 compute_bytes: int) -> float:
    """Exposed-or-not communication time of one micro-batch on one GPU (see the module docstring)."""
    intra, inter = _bandwidths(spec, defaults)
    s, r = layout.shard_ranks, layout.replicas
    seconds = 0.0
    if s > 1:
        moved = (2 * total_params * compute_bytes + trainable_params * FP32) * (s - 1) / s
        seconds += moved / (intra if layout.group_nodes == 1 else min(intra, inter))
    if r > 1:
        seconds += 2 * (trainable_params * FP32 / s) * (r - 1) / r / inter
    return seconds


def flops_per_token(total_params: int, trainable_params: int, method: str, activation_checkpointing: bool) -> float:
    base = 4 * total_params + 6 * trainable_params if method == "lora" else 6 * total_params
    return base + (2 * total_params if activation_checkpointing else 0)


def step_seconds(compute_s: float, comm_s: float, overlap_fraction: float) -> float:
    """One micro-batch: compute plus the communication that could not hide behind it."""
    return compute_s + comm_s - min(comm_s, overlap_fraction * compute_s)


def divisors_desc(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]), reverse=True)
