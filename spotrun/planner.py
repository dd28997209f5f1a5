"""The pre-launch estimate: instance, nodes, time limits, checkpoint cadence and cost, or a refusal.

Rules (../shared/KNOWLEDGE.md, "The problem domain"), with the choices made here:

- Training FLOPs: full fine-tune 6·N·T. LoRA: the frozen base still runs forward (2·N·T) and backward through
  the activations (2·N·T) but computes no weight gradients, so 4·N·T + 6·N_lora·T.
- Training state: full 16 bytes/param (bf16 weights + grads, fp32 master, Adam); LoRA 2 bytes/param for the
  frozen bf16 base + 16 per adapter parameter. The trainer shards within a node and replicates across nodes
  (hybrid sharding), so the state must fit one node: state / gpus <= gpu_memory * usable fraction (0.6; the rest
  is headroom for activations, CUDA context and fragmentation). More nodes add speed, not capacity.
- GPU-seconds = FLOPs / (peak * utilization); utilization: compute.utilization when given, else the median MFU
  measured by earlier completed runs of the same model shape and method on that instance type (recorded by
  handlers/performance.py), else the catalog's 0.25; the estimate says which. wall = GPU-seconds / (gpus *
  nodes) + startup (180 s: container pull + data download).
- Checkpoint bytes: 14/param full, 12/adapter param LoRA. The notice leaves 90 s to upload: needed rate =
  bytes / 90 s; if the nodes' S3 upload rate covers it, save on notice (and periodically as insurance), else
  save on a schedule. Save cost C = bytes / upload rate; Young/Daly interval sqrt(2·C·MTBI), clamped to
  [5 min, 6 h], MTBI from the job's interruption rate (nodes × per-instance rate; recorded or catalog).
- Spot: expected interruptions λ·wall, each costing the lost work (interval/2 on a schedule, ~0 on notice)
  plus a restart (startup + checkpoint download). Spot cost = price·(1 − discount)·nodes·(wall + overhead).
- MaxRuntime = 2 × the expected spot wall time (at least 1 h, at most 28 days); MaxWait = MaxRuntime + the
  accepted delay (or the user's, refused when below MaxRuntime).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .contract import MAX_RUNTIME_LIMIT_S, RunSpec
from .params import lora_parameters, shape_of

CATALOG_PATH = Path(__file__).with_name("catalog.json")


class EstimateRefused(Exception):
    """The run must not start. `code` is the state machine's named failure: InvalidRun or OverBudget."""

    def __init__(self, code: str, message: str, estimate: "Estimate | None" = None):
        super().__init__(message)
        self.code, self.message, self.estimate = code, message, estimate


def load_catalog(path: Path = CATALOG_PATH) -> dict:
    return json.loads(Path(path).read_text())


@dataclass
class Estimate:
    parameters: int
    trainable_parameters: int
    tokens: float
    training_flops: float
    training_state_bytes: int
    gpu_hours: float
    instance_type: str
    instance_count: int
    utilization: float
    wall_seconds: float
    expected_interruptions: float
    expected_overhead_seconds: float
    max_runtime_seconds: int
    max_wait_seconds: int
    checkpoint_bytes: int
    notice_upload_gb_per_s: float
    upload_gb_per_s_available: float
    checkpoint_policy: str
    checkpoint_interval_seconds: int
    interruptions_per_hour: float
    cost_usd: dict
    spot: bool
    advice: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    hyperparameters: dict[str, str] = field(default_factory=dict)
    utilization_source: str = "catalog default"

    def to_json(self) -> dict:
        return asdict(self)


def count_parameters(run: RunSpec, model_config: dict | None) -> tuple[int, int]:
    """(total parameters, trainable parameters)."""
    config = run.model.config or model_config
    if run.model.parameters is not None:
        if run.training.method == "lora":
            raise EstimateRefused("InvalidRun", "training.method=lora needs the model's shape: give model.config or "
                                  "model.source instead of model.parameters")
        return run.model.parameters, run.model.parameters
    if config is None:
        raise EstimateRefused("InvalidRun", f"model.source={run.model.source!r}: its config.json could not be read")
    shape = shape_of(config)
    total = shape.total
    if run.training.method == "lora":
        return total, lora_parameters(shape, run.training.lora.rank, run.training.lora.target_modules)
    return total, total


@dataclass(frozen=True)
class _Option:
    instance_type: str
    count: int
    wall: float
    overhead: float
    interruptions: float
    rate: float
    interval: float
    policy: str
    upload_available: float
    on_demand: float
    spot: float


def _interval(save_cost_s: float, rate_per_hour: float) -> float:
    if rate_per_hour <= 0:
        return 6 * 3600.0
    mtbi = 3600.0 / rate_per_hour
    return min(6 * 3600.0, max(300.0, math.sqrt(2 * save_cost_s * mtbi)))


def _option(run: RunSpec, catalog: dict, itype: str, count: int, gpu_seconds: float, ckpt_bytes: int,
            instance_rate: float) -> _Option:
    spec, d = catalog["instances"][itype], catalog["defaults"]
    family = itype.split(".")[1]
    wall = gpu_seconds / (spec["gpus"] * count) + d["startup_seconds"]
    rate = instance_rate * count
    upload = spec["s3_upload_gb_per_s"] * count
    save_cost = ckpt_bytes / (upload * 1e9)
    needed = ckpt_bytes / d["notice_upload_seconds"] / 1e9
    policy = "save_on_notice" if needed <= upload else "periodic"
    if run.checkpoint.interval_minutes is not None:
        interval = run.checkpoint.interval_minutes * 60
    else:
        interval = _interval(save_cost, rate)
    interruptions = rate * wall / 3600 if run.compute.spot else 0.0
    lost = 0.0 if policy == "save_on_notice" else interval / 2
    overhead = interruptions * (lost + d["startup_seconds"] + save_cost)
    discount = run.compute.spot_discount if run.compute.spot_discount is not None else \
        catalog["families"][family]["spot_discount"]
    price = spec["on_demand_usd_per_hour"] * count
    return _Option(itype, count, wall, overhead, interruptions, rate, interval, policy, upload,
                   on_demand=price * wall / 3600, spot=price * (1 - discount) * (wall + overhead) / 3600)


def estimate(run: RunSpec, *, catalog: dict | None = None, model_config: dict | None = None,
             data_tokens: int | None = None, recorded_rates: dict[str, float] | None = None,
             recorded_mfu: dict[str, tuple[float, int]] | None = None) -> Estimate:
    """Estimate a validated run. `model_config`/`data_tokens` come from the run's sources (see sources.py);
    `recorded_rates` maps instance type to interruptions per instance-hour measured by the recorder;
    `recorded_mfu` maps instance type to (MFU, runs) measured by earlier runs of this shape and method."""
    catalog = catalog or load_catalog()
    d = catalog["defaults"]
    c = run.compute
    if c.spot and c.warm_pool_minutes:
        raise EstimateRefused("InvalidRun", "compute.warm_pool_minutes with compute.spot=true: SageMaker managed "
                              "warm pools cannot be used with spot instances; set one of them off")
    total, trainable = count_parameters(run, model_config)
    tokens_per_epoch = run.data.tokens if run.data.tokens is not None else data_tokens
    if not tokens_per_epoch:
        raise EstimateRefused("InvalidRun", f"data.source={run.data.source!r}: no token count (give data.tokens, or "
                              "point data.source at prepared shards with an index.json)")
    tokens = tokens_per_epoch * run.training.epochs
    lora = run.training.method == "lora"
    flops = (4 * total + 6 * trainable) * tokens if lora else 6 * total * tokens
    state = 2 * total + 16 * trainable if lora else 16 * total
    ckpt_bytes = 12 * trainable if lora else 14 * total

    def utilization(itype: str) -> tuple[float, str]:
        if c.utilization:
            return c.utilization, "compute.utilization"
        mfu, runs = (recorded_mfu or {}).get(itype, (0.0, 0))
        if 0 < mfu <= 1:
            return mfu, (f"measured: the median MFU of {runs} earlier {run.training.method} run(s) of this model "
                         f"shape on {itype}")
        return d["utilization"], "catalog default"

    def fits(itype: str) -> bool:
        spec = catalog["instances"][itype]
        return state / spec["gpus"] <= spec["gpu_memory_gb"] * 1e9 * d["memory_usable_fraction"]

    if c.instance_type != "auto":
        if c.instance_type not in catalog["instances"]:
            raise EstimateRefused("InvalidRun", f"compute.instance_type={c.instance_type!r} is not in the catalog: "
                                  f"accepted {', '.join(sorted(catalog['instances']))} or auto")
        if not fits(c.instance_type):
            spec = catalog["instances"][c.instance_type]
            raise EstimateRefused("InvalidRun", f"compute.instance_type={c.instance_type}: {state / 1e9:.1f} GB of "
                                  f"training state does not fit {spec['gpus']} x {spec['gpu_memory_gb']} GB with "
                                  f"activation headroom; choose a larger instance, auto, or training.method=lora")
        candidates = [c.instance_type]
    else:
        candidates = [t for t in catalog["instances"] if fits(t)]
        if not candidates:
            biggest = max(s["gpus"] * s["gpu_memory_gb"] for s in catalog["instances"].values())
            raise EstimateRefused("InvalidRun", f"the model fits no catalog instance: {state / 1e9:.1f} GB of "
                                  f"training state, the largest node holds {biggest * d['memory_usable_fraction']:.0f}"
                                  f" GB usable; use training.method=lora")

    options = []
    for itype in candidates:
        spec = catalog["instances"][itype]
        family = itype.split(".")[1]
        gpu_seconds = flops / (spec["bf16_tflops_per_gpu"] * 1e12 * utilization(itype)[0])
        rate = (c.spot and (run.checkpoint.interruptions_per_hour if run.checkpoint.interruptions_per_hour
                            is not None else (recorded_rates or {}).get(
                                itype, catalog["families"][family]["interruptions_per_instance_hour"]))) or 0.0
        if c.instance_count is not None:
            count = c.instance_count
        elif c.target_hours:
            budget_s = max(c.target_hours * 3600 - d["startup_seconds"], 1.0)
            count = min(d["max_auto_instance_count"], max(1, math.ceil(gpu_seconds / spec["gpus"] / budget_s)))
        else:
            count = 1
        options.append(_option(run, catalog, itype, count, gpu_seconds, ckpt_bytes, rate))
    best = min(options, key=lambda o: ((o.spot if c.spot else o.on_demand), o.wall))
    spec = catalog["instances"][best.instance_type]
    util, util_source = utilization(best.instance_type)
    gpu_seconds = flops / (spec["bf16_tflops_per_gpu"] * 1e12 * util)

    expected_wall = best.wall + best.overhead
    max_runtime = int(min(MAX_RUNTIME_LIMIT_S, max(d["min_max_runtime_seconds"],
                                                   math.ceil(d["max_runtime_factor"] * expected_wall))))
    if c.max_wait_hours is not None:
        max_wait = int(c.max_wait_hours * 3600)
        if c.spot and max_wait < max_runtime:
            raise EstimateRefused("InvalidRun", f"compute.max_wait_hours={c.max_wait_hours}: MaxWait ({max_wait} s) "
                                  f"< MaxRuntime ({max_runtime} s); SageMaker requires MaxWait >= MaxRuntime")
    else:
        max_wait = max_runtime + int(c.accepted_delay_hours * 3600)

    warnings, advice = [], []
    if c.instance_count and c.instance_count > 1 and not c.target_hours:
        warnings.append(f"compute.instance_count={c.instance_count}: the model fits one {best.instance_type}; extra "
                        "nodes replicate it (hybrid sharding): they add speed, not capacity, and each is billed")
    if expected_wall > MAX_RUNTIME_LIMIT_S:
        warnings.append("the expected run exceeds SageMaker's 28-day MaxRuntime: raise instance_count or target_hours")
    cost = {"on_demand": round(best.on_demand, 2), "spot": round(best.spot, 2)}
    chosen_cost = best.spot if c.spot else best.on_demand
    if c.spot:
        advice.append(f"managed spot on {best.count} x {best.instance_type}: ${best.spot:.2f} expected "
                      f"(on-demand ${best.on_demand:.2f}), {best.interruptions:.2f} interruptions expected")
        if c.on_demand_fallback and best.on_demand > run.max_usd:
            warnings.append(f"an on-demand fallback would cost ${best.on_demand:.2f} > budget ${run.max_usd:.2f}; "
                            "the cost guard stops it at the cap")
    else:
        advice.append(f"on-demand on {best.count} x {best.instance_type}: ${best.on_demand:.2f}; managed spot would "
                      f"be about ${best.spot:.2f}")
    if best.policy == "periodic":
        advice.append(f"a {ckpt_bytes / 1e9:.1f} GB checkpoint cannot leave within the 90 s notice at "
                      f"{best.upload_available:.2f} GB/s: saving every {best.interval / 60:.0f} min instead")

    est = Estimate(
        parameters=total, trainable_parameters=trainable, tokens=tokens, training_flops=flops,
        training_state_bytes=state, gpu_hours=gpu_seconds / 3600, instance_type=best.instance_type,
        instance_count=best.count, utilization=util, wall_seconds=best.wall,
        expected_interruptions=best.interruptions, expected_overhead_seconds=best.overhead,
        max_runtime_seconds=max_runtime, max_wait_seconds=max_wait, checkpoint_bytes=ckpt_bytes,
        notice_upload_gb_per_s=ckpt_bytes / d["notice_upload_seconds"] / 1e9,
        upload_gb_per_s_available=best.upload_available, checkpoint_policy=best.policy,
        checkpoint_interval_seconds=int(round(best.interval)), interruptions_per_hour=best.rate,
        cost_usd=cost, spot=c.spot, advice=advice, warnings=warnings, utilization_source=util_source,
    )
    if util_source.startswith("measured"):
        advice.append(f"utilization {util:.2f} ({util_source}) instead of the {d['utilization']:.2f} default")
    est.hyperparameters = trainer_hyperparameters(run, est)
    if c.spot and best.spot >= 0.9 * best.on_demand:
        advice.append("spot saves under 10% here once interruptions are counted: on-demand (compute.spot=false) "
                      "costs about the same without the interruptions")
    if chosen_cost > run.max_usd:
        if not lora:
            advice.append(_lora_alternative(run, catalog, model_config, data_tokens, recorded_rates))
        raise EstimateRefused("OverBudget", f"estimated ${chosen_cost:.2f} exceeds budget.max_usd={run.max_usd:.2f} "
                              f"({best.count} x {best.instance_type}, {expected_wall / 3600:.1f} h)", est)
    return est


def _lora_alternative(run: RunSpec, catalog: dict, model_config: dict | None, data_tokens: int | None,
                      recorded_rates: dict[str, float] | None) -> str:
    """Advice for a full fine-tune over budget: what LoRA (rank 16, all linear layers) would cost."""
    generic = ("a LoRA fine-tune (training.method=lora) trains and checkpoints a small fraction of the parameters "
               "and costs less")
    if run.model.parameters is not None:
        return generic
    from dataclasses import replace

    from .contract import LoraSpec

    lora_run = replace(run, training=replace(run.training, method="lora", lora=LoraSpec(16, "all-linear")),
                       max_usd=float("inf"))
    try:
        alt = estimate(lora_run, catalog=catalog, model_config=model_config, data_tokens=data_tokens,
                       recorded_rates=recorded_rates)
    except EstimateRefused:
        return generic
    key = "spot" if run.compute.spot else "on_demand"
    return (f"LoRA (training.method=lora, rank 16, all-linear) would train {alt.trainable_parameters:,} "
            f"parameters on {alt.instance_count} x {alt.instance_type} for about ${alt.cost_usd[key]:.2f}")


def trainer_hyperparameters(run: RunSpec, est: Estimate) -> dict[str, str]:
    """The SageMaker hyperparameters (all strings) the trainer image reads (see spotrun_trainer.config)."""
    t = run.training
    return {
        "micro_batch": str(t.micro_batch), "grad_accum": str(t.grad_accum), "epochs": str(t.epochs),
        "seed": str(t.seed), "optim.lr": str(t.lr), "data.seq_len": str(run.data.seq_len),
        "checkpoint.interval_minutes": f"{est.checkpoint_interval_seconds / 60:.2f}",
        "checkpoint.keep": str(run.checkpoint.keep),
    }


def format_text(est: Estimate) -> str:
    rows = [
        ("parameters", f"{est.parameters:,}"), ("trainable parameters", f"{est.trainable_parameters:,}"),
        ("tokens", f"{est.tokens:,.0f}"), ("training FLOPs", f"{est.training_flops:.3e}"),
        ("training state", f"{est.training_state_bytes / 1e9:,.1f} GB"),
        ("GPU-hours", f"{est.gpu_hours:,.2f} at utilization {est.utilization:.2f} ({est.utilization_source})"),
        ("instances", f"{est.instance_count} x {est.instance_type}"),
        ("wall time", f"{est.wall_seconds / 3600:,.2f} h (+{est.expected_overhead_seconds / 3600:.2f} h expected "
                      f"from {est.expected_interruptions:.2f} interruptions)"),
        ("MaxRuntime / MaxWait", f"{est.max_runtime_seconds:,} s / {est.max_wait_seconds:,} s"),
        ("checkpoint", f"{est.checkpoint_bytes / 1e9:,.2f} GB, {est.checkpoint_policy}, every "
                       f"{est.checkpoint_interval_seconds / 60:.1f} min"),
        ("notice upload needed", f"{est.notice_upload_gb_per_s:.3f} GB/s (available "
                                 f"{est.upload_gb_per_s_available:.2f} GB/s)"),
        ("cost", f"spot ${est.cost_usd['spot']:,.2f} / on-demand ${est.cost_usd['on_demand']:,.2f}"),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    lines += [f"advice: {a}" for a in est.advice] + [f"warning: {w}" for w in est.warnings]
    return "\n".join(lines)
