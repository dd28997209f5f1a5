"""The planner's options: every layout of the candidate instance types that fits the model, timed and priced.

`LayoutPlanner` fits a layout (the largest micro-batch that fits, first without, then with activation
checkpointing; spotrun/planner/memory.py), times it (compute and FSDP collectives; spotrun/planner/topology.py) and
prices it (`price_option`: startup, the checkpoint policy and interval, expected interruptions, spot and on-demand
cost).
`segment_plan` prices the chain of jobs the cap allows for the chosen option (spotrun/planner/segments.py);
`price_advice` and `checkpoint_advice` explain the chosen option's price and checkpoint policy. The rules
and the choices made are in spotrun/planner/estimate.py's docstring; `estimate` there chooses among these options.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from ..contract.spec import RunSpec
from ..seams import BytesPerParameter, SegmentPlan, StopNotice
from .memory import MemoryEstimate, ModelDims, peak_bytes, training_state_bytes
from .segments import JOB_END_S, plan_segments
from .topology import Layout, comm_seconds, divisors_desc, flops_per_token, layouts, step_seconds


@dataclass(frozen=True)
class Fit:
    """A layout whose peak fits, with the batch layout chosen for it."""

    layout: Layout
    micro_batch: int
    grad_accum: int
    activation_checkpointing: bool
    memory: MemoryEstimate
    usable: float


@dataclass(frozen=True)
class Option:
    instance_type: str
    count: int
    wall: float
    overhead: float
    interruptions: float
    rate: float
    interval_s: float  # between periodic saves (the estimate rounds it once: Estimate.checkpoint_interval_s)
    policy: str
    upload_available: float
    on_demand: float
    spot: float
    fit: Fit | None = None
    train_seconds: float = 0.0
    eval_seconds: float = 0.0  # inside train_seconds
    compute_s: float = 0.0
    comm_s: float = 0.0


def _interval(save_cost_s: float, rate_per_hour: float) -> float:
    if rate_per_hour <= 0:
        return 6 * 3600.0
    mtbi = 3600.0 / rate_per_hour
    return min(6 * 3600.0, max(300.0, math.sqrt(2 * save_cost_s * mtbi)))


def notice_upload_seconds(step_seconds: float) -> float:
    """What the stop notice leaves for the upload (seams.StopNotice: the budget the launcher and trainer keep).
    The ranks stop only between optimizer steps, so a step longer than the finishing budget eats into the
    upload's."""
    return max(0.0, StopNotice.UPLOAD_S - max(0.0, step_seconds - StopNotice.FINISH_S))


def startup_seconds(defaults: dict) -> float:
    """Seconds from a start (the first, and each spot restart: a new instance pulls the image again) to training:
    the catalog's startup_seconds (provisioning, data download) plus trainer_image_gb at image_pull_gb_per_s (the
    catalog cites both). A catalog without an image size adds no pull."""
    image_gb = defaults.get("trainer_image_gb", 0.0)
    return defaults["startup_seconds"] + (image_gb / defaults["image_pull_gb_per_s"] if image_gb else 0.0)


def price_option(run: RunSpec, catalog: dict, itype: str, count: int, train_seconds: float, ckpt_bytes: int,
            instance_rate: float, step_seconds: float = 0.0) -> Option:
    spec, d = catalog["instances"][itype], catalog["defaults"]
    family = itype.split(".")[1]
    startup = startup_seconds(d)
    wall = train_seconds + startup
    rate = instance_rate * count
    upload = spec["s3_upload_gb_per_s"] * count
    save_cost = ckpt_bytes / (upload * 1e9)
    budget = notice_upload_seconds(step_seconds)
    policy = "save_on_notice" if budget > 0 and ckpt_bytes / budget / 1e9 <= upload else "periodic"
    interval_s = run.checkpoint.interval_s if run.checkpoint.interval_s is not None else _interval(save_cost, rate)
    interruptions = rate * wall / 3600 if run.compute.spot else 0.0
    lost = 0.0 if policy == "save_on_notice" else interval_s / 2
    overhead = interruptions * (lost + startup + save_cost)
    discount = run.compute.spot_discount if run.compute.spot_discount is not None else \
        catalog["families"][family]["spot_discount"]
    price = spec["on_demand_usd_per_hour"] * count
    return Option(itype, count, wall, overhead, interruptions, rate, interval_s, policy, upload,
                   on_demand=price * wall / 3600, spot=price * (1 - discount) * (wall + overhead) / 3600)


def interruption_rate(run: RunSpec, catalog: dict, itype: str, recorded_rates: dict[str, float] | None) -> float:
    """Interruptions per instance-hour on `itype`: the run's checkpoint.interruptions_per_hour, else the recorded
    rate, else the catalog's for its family; 0 on-demand."""
    family = itype.split(".")[1]
    return (run.compute.spot and (run.checkpoint.interruptions_per_hour if run.checkpoint.interruptions_per_hour
                                  is not None else (recorded_rates or {}).get(
                                      itype, catalog["families"][family]["interruptions_per_instance_hour"]))) or 0.0


def mean_wait(run: RunSpec, itype: str,
              recorded_waits: dict[str, tuple[float, int]] | None) -> tuple[float | None, str]:
    """The mean wait for spot capacity after an interruption on `itype`, in seconds, and where it came from: the
    run's checkpoint.mean_wait_hours, else the recorder's (`recorded_waits`: instance type -> (mean, waits)); None
    (the availability model's at the rate) without either, or on-demand."""
    if not run.compute.spot:
        return None, ""
    if run.checkpoint.mean_wait_hours is not None:
        return run.checkpoint.mean_wait_hours * 3600, f"checkpoint.mean_wait_hours={run.checkpoint.mean_wait_hours:g}"
    if itype in (recorded_waits or {}):
        seconds, count = recorded_waits[itype]
        return seconds, f"recorded: {count} waits for capacity on {itype}"
    return None, ""


def evaluation_seconds(run: RunSpec, *, parameters: int, validation_tokens: float | None, optimizer_steps: float,
                       train_seconds: float, cluster_flops_per_s: float, micro_batch: int) -> float:
    """The run's evaluation time: forward passes only (2 FLOPs per parameter per token) over the validation
    tokens (or the eval.max_batches prefix), before the first step, at the end and on the eval schedule, at the
    cluster's effective FLOP rate. 0 without validation data; None tokens: not known here (a warning says so)."""
    if not run.data.has_validation or not validation_tokens or cluster_flops_per_s <= 0:
        return 0.0
    e = run.eval
    if e.max_batches:
        validation_tokens = min(validation_tokens, e.max_batches * micro_batch * run.data.seq_len)
    evaluations = 2 + (optimizer_steps // e.every_steps if e.every_steps else 0) + \
        (train_seconds // e.every_s if e.every_s else 0)
    return evaluations * 2 * parameters * validation_tokens / cluster_flops_per_s


def found_usable(spec: dict, defaults: dict) -> float:
    """Bytes per GPU the peak may reach: the usable fraction of its memory minus the allowance."""
    return spec["gpu_memory_gb"] * 1e9 * defaults["memory_usable_fraction"] - defaults["memory_allowance_gb"] * 1e9


class LayoutPlanner:
    """Fits, times and prices the layouts of one run (the pieces of `estimate` that depend on the layout)."""

    def __init__(self, run: RunSpec, catalog: dict, dims: ModelDims | None, total: int, trainable: int,
                 tokens: float, util: Callable[[str], float]):
        self.run, self.catalog, self.d = run, catalog, catalog["defaults"]
        self.dims, self.total, self.trainable, self.tokens, self.util = dims, total, trainable, tokens, util
        self.method = run.training.method
        self.per_rank = run.training.micro_batch * run.training.grad_accum
        self.largest: tuple[Layout, MemoryEstimate, float] | None = None  # for the refusal
        self._fits: dict[tuple[str, int], Fit | None] = {}

    def _memory(self, layout: Layout, micro_batch: int, ac: bool) -> MemoryEstimate:
        if self.dims is None:  # model.parameters only: the state is all that can be counted
            state = training_state_bytes(self.total, self.trainable, self.method, self.d["compute_bytes"])
            return MemoryEstimate(state=-(-state // layout.shard_ranks), gathered=0, activations=0, logits=0)
        return peak_bytes(self.dims, method=self.method, trainable_params=self.trainable,
                          shard_ranks=layout.shard_ranks, micro_batch=micro_batch, seq_len=self.run.data.seq_len,
                          activation_checkpointing=ac, compute_bytes=self.d["compute_bytes"], prefetch_units=1)

    def fit(self, layout: Layout) -> Fit | None:
        # The peak depends on the layout only through the shard group's size.
        key = (layout.instance_type, layout.shard_ranks)
        if key not in self._fits:
            self._fits[key] = self._fit(layout)
        found, smallest = self._fits[key]
        if found is not None:
            return replace(found, layout=layout)
        spec = self.catalog["instances"][layout.instance_type]
        if self.largest is None or layout.world * spec["gpu_memory_gb"] > self.largest[0].world * \
                self.catalog["instances"][self.largest[0].instance_type]["gpu_memory_gb"]:
            self.largest = (layout, smallest, found_usable(spec, self.d))
        return None

    def _fit(self, layout: Layout) -> tuple[Fit | None, MemoryEstimate]:
        """(the fit, or None and the smallest peak tried: micro_batch 1, activation checkpointing if modelled)."""
        usable = found_usable(self.catalog["instances"][layout.instance_type], self.d)
        last = None
        for ac in ((False,) if self.dims is None else (False, True)):
            for mb in divisors_desc(self.per_rank):
                last = self._memory(layout, mb, ac)
                if last.total <= usable:
                    return Fit(layout, mb, self.per_rank // mb, ac, last, usable), last
        return None, last

    def timing(self, fit: Fit) -> tuple[float, float, float]:
        """(training seconds, compute and communication seconds of one micro-batch)."""
        spec = self.catalog["instances"][fit.layout.instance_type]
        tokens_mb = fit.micro_batch * self.run.data.seq_len
        flops = flops_per_token(self.total, self.trainable, self.method, fit.activation_checkpointing) * tokens_mb
        compute = flops / (spec["bf16_tflops_per_gpu"] * 1e12 * self.util(fit.layout.instance_type))
        comm = comm_seconds(fit.layout, spec, self.d, total_params=self.total, trainable_params=self.trainable,
                            compute_bytes=self.d["compute_bytes"])
        micro_batches = self.tokens / (fit.layout.world * tokens_mb)
        return micro_batches * step_seconds(compute, comm, self.d["comm_overlap_fraction"]), compute, comm

    def eval_seconds(self, fit: Fit, train_seconds: float, validation_tokens: int | None) -> float:
        spec = self.catalog["instances"][fit.layout.instance_type]
        steps = self.tokens / (fit.layout.world * self.per_rank * self.run.data.seq_len)
        rate = fit.layout.world * spec["bf16_tflops_per_gpu"] * 1e12 * self.util(fit.layout.instance_type)
        return evaluation_seconds(self.run, parameters=self.total, validation_tokens=validation_tokens,
                                  optimizer_steps=steps, train_seconds=train_seconds, cluster_flops_per_s=rate,
                                  micro_batch=fit.micro_batch)

    def options(self, candidates: Iterable[str], counts: Iterable[int], ckpt_bytes: int,
                validation_tokens: int | None, recorded_rates: dict[str, float] | None) -> list[Option]:
        """Every layout of `candidates` x `counts` nodes that fits, timed and priced (empty: see `refusal`)."""
        out: list[Option] = []
        for itype in candidates:
            spec = self.catalog["instances"][itype]
            rate = interruption_rate(self.run, self.catalog, itype, recorded_rates)
            for count in counts:
                for layout in layouts(itype, spec, count):
                    fit = self.fit(layout)
                    if fit is not None:
                        out.append(self.option(fit, ckpt_bytes, rate, validation_tokens))
        return out

    def option(self, fit: Fit, ckpt_bytes: int, rate: float, validation_tokens: int | None) -> Option:
        """One fitting layout timed (training + evaluation) and priced at `rate` interruptions per instance-hour."""
        train_s, compute_s, comm_s = self.timing(fit)
        eval_s = self.eval_seconds(fit, train_s, validation_tokens)
        train_s += eval_s
        step_s = fit.grad_accum * step_seconds(compute_s, comm_s, self.d["comm_overlap_fraction"])
        opt = price_option(self.run, self.catalog, fit.layout.instance_type, fit.layout.nodes, train_s, ckpt_bytes,
                           rate, step_s)
        return replace(opt, fit=fit, train_seconds=train_s, compute_s=compute_s, comm_s=comm_s, eval_seconds=eval_s)

    def refusal(self) -> tuple[str, str]:
        """(why nothing fits, the run field to change)."""
        d = self.d
        if self.largest is None:
            return "no layout could be tried", "compute.instance_type"
        layout, mem, usable = self.largest
        spec = self.catalog["instances"][layout.instance_type]
        text = (f"the model fits no layout tried: the largest, {layout.describe()}, needs {mem.describe()} per GPU "
                f"at micro_batch 1{' with activation checkpointing' if self.dims else ''}, over the "
                f"{usable / 1e9:.1f} GB usable of {spec['gpu_memory_gb']} GB ({d['memory_usable_fraction']:.0%} "
                f"minus a {d['memory_allowance_gb']} GB allowance)")
        rest = mem.total - mem.state
        if rest >= usable:
            return text + "; activations, logits and one gathered unit alone exceed it: shorten data.seq_len", \
                "data.seq_len"
        state = training_state_bytes(self.total, self.trainable, self.method, self.d["compute_bytes"])
        gpus = math.ceil(state / (usable - rest))
        hint = "" if self.method == "lora" else "; or training.method=lora"
        if not spec.get("efa"):
            return (text + f"; {layout.instance_type} has no EFA, so nodes cannot share its training state: its "
                    f"{state / 1e9:,.0f} GB need {gpus} GPUs of this size in one shard group; choose an EFA "
                    f"instance type (or auto){hint}"), "compute.instance_type"
        nodes = math.ceil(gpus / spec["gpus"])
        return (text + f"; its {state / 1e9:,.0f} GB of training state would need {nodes} nodes of "
                f"{layout.instance_type} sharded (set compute.instance_count){hint}"), "compute.instance_count"



SPOT_ADVICE = "managed spot on "  # the market line's start on a spot run (the policy stage names on-demand instead
# where the chosen policy starts the run on it: spotrun/pipeline/policy_stage.py `_market_advice`)


def price_advice(run: RunSpec, best: Option) -> list[str]:
    """The chosen layout and market. The prices are the estimate's `cost_usd` (one figure per market, with each
    job's start and end): not repeated here. The warning when an on-demand fallback exceeds the cap is the spot
    policy's (spotrun/policy/choose.py `spot_policy_at_caps`: not at the cap to set, which the chosen policy's P95
    bill finishes within)."""
    layout = best.fit.layout.describe()
    if not run.compute.spot:
        return [f"on-demand on {layout} (compute.spot=false); the cost line's spot figure is what managed spot "
                "would cost"]
    return [f"{SPOT_ADVICE}{layout}, {best.interruptions:.2f} interruptions expected"]


# What a save-on-notice layout's periodic saves are (the trainer is sent the interval on every layout: its
# `checkpoint.interval_s`, spotrun/planner/outputs.py `hyperparameters`) and what the figures leave out of them
INSURANCE_WORDS = ("the trainer saves on this interval too, in the background, training paused while each save is "
                   "staged; not counted in the cost row, the cap or the spot policy's simulation, which count only "
                   "the save on the notice")


def checkpoint_advice(catalog: dict, best: Option, ckpt_bytes: int) -> list[str]:
    """Why the checkpoint policy is what it is (the notice's upload budget against the nodes' upload rate), and
    collectives that compute does not hide."""
    d, fit, advice = catalog["defaults"], best.fit, []
    step_s = fit.grad_accum * step_seconds(best.compute_s, best.comm_s, d["comm_overlap_fraction"])
    budget = notice_upload_seconds(step_s)
    one_node = catalog["instances"][best.instance_type]["s3_upload_gb_per_s"]
    if best.policy == "save_on_notice" and best.count > 1 and ckpt_bytes / 1e9 / budget > one_node:
        advice.append(f"the {ckpt_bytes / 1e9:.1f} GB checkpoint leaves within the stop notice ({budget:.0f} s for "
                      f"the upload after a {step_s:.0f} s step) only because {best.count} nodes upload their shards "
                      f"in parallel ({best.upload_available:.2f} GB/s for {ckpt_bytes / 1e9 / budget:.2f} needed); "
                      f"periodic saves every {best.interval_s / 60:.0f} min stay as insurance ({INSURANCE_WORDS})")
    if best.policy == "periodic":
        advice.append(f"a {ckpt_bytes / 1e9:.1f} GB checkpoint cannot leave within the stop notice ({budget:.0f} s "
                      f"left for the upload after a {step_s:.0f} s step) at {best.upload_available:.2f} GB/s: "
                      f"saving every {best.interval_s / 60:.0f} min instead "
                      + (f"(Young/Daly: sqrt(2 x {ckpt_bytes / (best.upload_available * 1e9):.0f} s save x "
                         f"{1 / best.rate:.1f} h between interruptions))" if best.rate else
                         "(no interruptions expected: the saves are insurance)"))
    if best.comm_s > d["comm_overlap_fraction"] * best.compute_s:
        exposed = step_seconds(best.compute_s, best.comm_s, d["comm_overlap_fraction"]) - best.compute_s
        advice.append(f"communication is not fully hidden: {best.comm_s:.2f} s of collectives per micro-batch "
                      f"against {best.compute_s:.2f} s of compute ({exposed:.2f} s exposed) on "
                      f"{fit.layout.describe()}")
    return advice


def segment_overhead_seconds(catalog: dict, itype: str, count: int, ckpt_bytes: int, parameters: int) -> float:
    """One segment restart: provisioning, image pull and data (`startup_seconds`), the trainer's start and
    checkpoint restore (catalog `trainer_restart_seconds`, benchmarks/segment_restart.py), and reading the bf16
    weights and the checkpoint from S3 (at the conservative upload rate, shared by the nodes)."""
    d, spec = catalog["defaults"], catalog["instances"][itype]
    moved = ckpt_bytes + parameters * BytesPerParameter.EXPORT_BF16
    return startup_seconds(d) + d["trainer_restart_seconds"] + moved / (spec["s3_upload_gb_per_s"] * count * 1e9)


def segment_plan(run: RunSpec, catalog: dict, best: Option, ckpt_bytes: int, parameters: int,
              longest_s: int) -> SegmentPlan:
    """The chain of jobs the cap allows (spotrun/planner/segments.py), from the chosen layout's expected figures."""
    c, d = run.compute, catalog["defaults"]
    family = best.instance_type.split(".")[1]
    discount = c.spot_discount if c.spot_discount is not None else catalog["families"][family]["spot_discount"]
    usd_per_s = catalog["instances"][best.instance_type]["on_demand_usd_per_hour"] * best.count / 3600
    return plan_segments(
        cap_usd=run.max_usd, usd_per_s=usd_per_s, spot_fraction=(1 - discount) if c.spot else 1.0,
        # A run accepted to stop at SageMaker's 28 days plans that much (compute.accept_max_runtime_stop). The
        # periodic saves are the chain's time too: its bill, its smallest cap and the refusal count them, as the
        # spot policy's simulation bills them (`periodic_saves_seconds`)
        run_seconds=min(best.wall + best.overhead + periodic_saves_seconds(catalog, best, ckpt_bytes), longest_s),
        startup_s=startup_seconds(d),
        overhead_s=segment_overhead_seconds(catalog, best.instance_type, best.count, ckpt_bytes, parameters),
        save_s=ckpt_bytes / (best.upload_available * 1e9), longest_s=longest_s,
        warm_pool_s=0 if c.spot else c.warm_pool_minutes * 60, spot=c.spot,
        step_s=best.fit.grad_accum * step_seconds(best.compute_s, best.comm_s, d["comm_overlap_fraction"]))


def periodic_saves_s(work_s: float, interval_s: float, save_s: float) -> float:
    """The seconds a run's periodic saves block its training: one every `interval_s` of `work_s` but at its end,
    `save_s` each (spotrun/policy/execution.py bills them so)."""
    return max(0, math.ceil(work_s / interval_s) - 1) * save_s if interval_s > 0 else 0.0


def periodic_saves_seconds(catalog: dict, best: Option, ckpt_bytes: int) -> float:
    """The seconds the periodic saves of a layout that saves on a schedule (checkpoint policy periodic: the stop
    notice cannot carry its checkpoint) add to one run, as the spot policy's simulation bills them
    (spotrun/policy/choose.py `plan_from_estimate`: the work with the job's end, the interval as the estimate rounds
    it, each save at the upload rate). The chain of jobs (`segment_plan`) and the cost row's other market count them
    (spotrun/planner/estimate.py `with_periodic_saves`): before, the OverBudget check, the chain's smallest cap and
    the cap to set priced the 70B LoRA of issue #26 without its 944 saves. 0 on a layout that saves on the notice."""
    if best.policy != "periodic" or not best.upload_available:
        return 0.0
    work = best.wall - startup_seconds(catalog["defaults"]) + JOB_END_S
    return periodic_saves_s(work, max(1, round(best.interval_s)), ckpt_bytes / (best.upload_available * 1e9))
