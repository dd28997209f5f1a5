"""The pre-launch estimate: instance type, node count, sharding, batch layout, time limits, checkpoint cadence and
cost, or a refusal.

Rules, with the choices made here:

- Layouts: every catalog instance type (or the one given) x 1..max_auto_instance_count nodes (or the count given)
  x every sharding of those nodes (spotrun/topology.py: full over all GPUs, or hybrid shard groups of whole nodes;
  cross-node shard groups only on EFA nodes).
- Memory (spotrun/memory.py, the same model the trainer logs beside its measured peak): per GPU, sharded training
  state + the gathered FSDP unit(s) + activations + logits must stay under gpu_memory * memory_usable_fraction
  minus memory_allowance_gb (CUDA context, NCCL buffers). For each layout the planner keeps the run's samples per
  rank and optimizer step (training.micro_batch * training.grad_accum) and picks the largest micro-batch dividing
  it that fits, first without and then with activation checkpointing; grad_accum makes up the rest. These, the
  sharding and activation checkpointing go to the trainer as hyperparameters. A run given only
  model.parameters has no shape: its activations are not modelled (a warning says so).
- Time (spotrun/topology.py): per micro-batch, compute (6 N per token, +2 N with activation checkpointing; LoRA
  4 N + 6 N_adapter) at the data-sheet peak x utilization, and the FSDP
  collectives over the catalog's NVLink/PCIe and EFA bandwidths, hidden behind compute up to a stated fraction.
  wall = training time + startup (`startup_seconds`: the catalog's 180 s for provisioning and data download, plus
  pulling the trainer image, which every spot restart does again). Utilization: compute.utilization when
  given, else the median MFU measured by earlier completed runs of the same model shape and method on that
  instance type (recorded by handlers/performance.py), else the catalog's 0.25; the estimate says which.
- Choice: the cheapest layout that fits (spot or on-demand, as the run asks), among those meeting
  compute.target_hours when given (the fastest, with a warning, when none does). A model that fits nothing is
  refused naming the largest layout tried and what it would need.
- Checkpoint bytes (spotrun/memory.py): 12/param full (fp32 weights + Adam moments), 12/adapter param LoRA. The
  notice leaves 90 s to upload: needed rate = bytes / 90 s; if the nodes' S3 upload rate covers it, save on notice
  (and periodically as insurance), else save on a schedule. Save cost C = bytes / upload rate; Young/Daly interval
  sqrt(2·C·MTBI), clamped to [5 min, 6 h], MTBI from the job's interruption rate (nodes × per-instance rate;
  recorded or catalog).
- Spot: expected interruptions λ·wall, each costing the lost work (interval/2 on a schedule, ~0 on notice)
  plus a restart (startup + checkpoint download). Spot cost = price·(1 − discount)·nodes·(wall + overhead).
- MaxRuntime = 2 × the expected spot wall time (at least 1 h, at most SageMaker's 28 days); a run expected to
  need more than 28 days is refused unless `compute.accept_max_runtime_stop` accepts the stop at 28 days.
  MaxWait = MaxRuntime + the accepted delay (or the user's, refused when below MaxRuntime).
- The checkpoint interval reaches the trainer as it is planned: whole seconds, at least 1 (a tiny
  `interval_minutes` never rounds to 0, which the trainer reads as "off").
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from .contract import MAX_RUNTIME_LIMIT_S, RunSpec, RunValidationError
from .memory import MemoryEstimate, ModelDims, checkpoint_bytes, peak_bytes, training_state_bytes
from .params import lora_parameters, shape_of
from .refusal import Refusal
from .seams import BytesPerParameter, Hyperparameter, StopNotice
from .segments import SegmentPlan, plan_segments, segment_seconds
from .topology import Layout, comm_seconds, divisors_desc, flops_per_token, layouts, step_seconds

CATALOG_PATH = Path(__file__).with_name("catalog.json")


class EstimateRefused(Refusal):
    """The planner refuses the run (spotrun.refusal.Refusal). `code` is its status, the state machine's named
    failure: InvalidRun or OverBudget; `field` the run field to change."""

    def __init__(self, code: str, message: str, estimate: Estimate | None = None, field: str | None = None):
        super().__init__(code, message, field=field, estimate=estimate)
        self.code = self.status


def load_catalog(path: Path = CATALOG_PATH) -> dict:
    catalog = json.loads(Path(path).read_text())
    check_prices(catalog)
    return catalog


def check_prices(catalog: dict) -> None:
    """Every price is a finite number > 0: a price of 0 would make every bound zero and disable the cap."""
    priced = {f"instances.{t}": s.get("on_demand_usd_per_hour") for t, s in catalog.get("instances", {}).items()
              if "on_demand_usd_per_hour" in s}
    for region, spec in catalog.get("regions", {}).items():
        priced.update({f"regions.{region}.{t}": p for t, p in spec.get("on_demand_usd_per_hour", {}).items()})
    for where, price in priced.items():
        if isinstance(price, bool) or not isinstance(price, (int, float)) or not math.isfinite(price) or price <= 0:
            raise ValueError(f"catalog {where}.on_demand_usd_per_hour={price!r} is invalid: expected a price in "
                             "USD per hour > 0 (a price of 0 would disable the cost cap)")


DEFAULT_PRICE_REGION = "us-east-1"  # the CLI's estimate without --region; a stage prices in its own region


def regional_catalog(catalog: dict, region: str) -> dict:
    """The catalog with the region's on-demand prices; RunValidationError for a region it has no prices for."""
    regions = catalog.get("regions", {})
    if region not in regions:
        raise RunValidationError("region", region, f"a region the catalog has prices for: {', '.join(sorted(regions))} "
                                 "(add the region's prices to spotrun/catalog.json)")
    check_prices(catalog)
    prices = regions[region]["on_demand_usd_per_hour"]
    out = copy.deepcopy(catalog)
    out["instances"] = {t: {**spec, "on_demand_usd_per_hour": prices[t]}
                        for t, spec in catalog["instances"].items() if t in prices}
    return out


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
    sharding: str = "full"
    shard_group_nodes: int = 1
    micro_batch: int = 1
    grad_accum: int = 1
    activation_checkpointing: bool = False
    global_batch_samples: int = 1
    memory_per_gpu: dict = field(default_factory=dict)
    seconds_per_micro_batch: dict = field(default_factory=dict)
    advice: list[str] = field(default_factory=list)
    spot_policy: dict = field(default_factory=dict)  # spotrun/simulate/choose.py: the policy and its odds
    warnings: list[str] = field(default_factory=list)
    hyperparameters: dict[str, str] = field(default_factory=dict)
    utilization_source: str = "catalog default"
    evaluation_seconds: float = 0.0  # validation forwards over the run, inside wall_seconds (evaluation_seconds())
    segments: dict = field(default_factory=dict)  # spotrun.segments.SegmentPlan: how the cap holds

    def to_json(self) -> dict:
        return asdict(self)


def count_parameters(run: RunSpec, model_config: dict | None) -> tuple[int, int]:
    """(total parameters, trainable parameters)."""
    config = model_config or run.model.config  # the source's own config.json wins over an inline copy
    if run.model.parameters is not None:
        if run.training.method == "lora":
            raise EstimateRefused("InvalidRun", "training.method=lora needs the model's shape: give model.config or "
                                  "model.source instead of model.parameters",
                                  field="training.method")
        return run.model.parameters, run.model.parameters
    if config is None:
        raise EstimateRefused("InvalidRun", f"model.source={run.model.source!r}: its config.json could not be read",
                              field="model.source")
    try:
        shape = shape_of(config)
    except RunValidationError as exc:
        if model_config is None:
            raise
        # The shape came from the source's config.json: the field to fix is the source, not an inline config.
        raise RunValidationError("model.source", run.model.source, f"a model whose config.json the planner can "
                                 f"count ({exc})") from None
    total = shape.total
    if run.training.method == "lora":
        return total, lora_parameters(shape, run.training.lora.rank, run.training.lora.target_modules)
    return total, total


@dataclass(frozen=True)
class _Fit:
    """A layout whose peak fits, with the batch layout chosen for it."""

    layout: Layout
    micro_batch: int
    grad_accum: int
    activation_checkpointing: bool
    memory: MemoryEstimate
    usable: float


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
    fit: _Fit | None = None
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


def _option(run: RunSpec, catalog: dict, itype: str, count: int, train_seconds: float, ckpt_bytes: int,
            instance_rate: float, step_seconds: float = 0.0) -> _Option:
    spec, d = catalog["instances"][itype], catalog["defaults"]
    family = itype.split(".")[1]
    startup = startup_seconds(d)
    wall = train_seconds + startup
    rate = instance_rate * count
    upload = spec["s3_upload_gb_per_s"] * count
    save_cost = ckpt_bytes / (upload * 1e9)
    budget = notice_upload_seconds(step_seconds)
    policy = "save_on_notice" if budget > 0 and ckpt_bytes / budget / 1e9 <= upload else "periodic"
    if run.checkpoint.interval_minutes is not None:
        interval = max(1.0, round(run.checkpoint.interval_minutes * 60))
    else:
        interval = _interval(save_cost, rate)
    interruptions = rate * wall / 3600 if run.compute.spot else 0.0
    lost = 0.0 if policy == "save_on_notice" else interval / 2
    overhead = interruptions * (lost + startup + save_cost)
    discount = run.compute.spot_discount if run.compute.spot_discount is not None else \
        catalog["families"][family]["spot_discount"]
    price = spec["on_demand_usd_per_hour"] * count
    return _Option(itype, count, wall, overhead, interruptions, rate, interval, policy, upload,
                   on_demand=price * wall / 3600, spot=price * (1 - discount) * (wall + overhead) / 3600)


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
        (train_seconds / 60 // e.every_minutes if e.every_minutes else 0)
    return evaluations * 2 * parameters * validation_tokens / cluster_flops_per_s


def found_usable(spec: dict, defaults: dict) -> float:
    """Bytes per GPU the peak may reach: the usable fraction of its memory minus the allowance."""
    return spec["gpu_memory_gb"] * 1e9 * defaults["memory_usable_fraction"] - defaults["memory_allowance_gb"] * 1e9


class _Planner:
    """Fits and times layouts for one run (the pieces of `estimate` that depend on the layout)."""

    def __init__(self, run: RunSpec, catalog: dict, dims: ModelDims | None, total: int, trainable: int,
                 tokens: float, util: Callable[[str], float]):
        self.run, self.catalog, self.d = run, catalog, catalog["defaults"]
        self.dims, self.total, self.trainable, self.tokens, self.util = dims, total, trainable, tokens, util
        self.method = run.training.method
        self.per_rank = run.training.micro_batch * run.training.grad_accum
        self.largest: tuple[Layout, MemoryEstimate, float] | None = None  # for the refusal
        self._fits: dict[tuple[str, int], _Fit | None] = {}

    def _memory(self, layout: Layout, micro_batch: int, ac: bool) -> MemoryEstimate:
        if self.dims is None:  # model.parameters only: the state is all that can be counted
            state = training_state_bytes(self.total, self.trainable, self.method, self.d["compute_bytes"])
            return MemoryEstimate(state=-(-state // layout.shard_ranks), gathered=0, activations=0, logits=0)
        return peak_bytes(self.dims, method=self.method, trainable_params=self.trainable,
                          shard_ranks=layout.shard_ranks, micro_batch=micro_batch, seq_len=self.run.data.seq_len,
                          activation_checkpointing=ac, compute_bytes=self.d["compute_bytes"], prefetch_units=1)

    def fit(self, layout: Layout) -> _Fit | None:
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

    def _fit(self, layout: Layout) -> tuple[_Fit | None, MemoryEstimate]:
        """(the fit, or None and the smallest peak tried: micro_batch 1, activation checkpointing if modelled)."""
        usable = found_usable(self.catalog["instances"][layout.instance_type], self.d)
        last = None
        for ac in ((False,) if self.dims is None else (False, True)):
            for mb in divisors_desc(self.per_rank):
                last = self._memory(layout, mb, ac)
                if last.total <= usable:
                    return _Fit(layout, mb, self.per_rank // mb, ac, last, usable), last
        return None, last

    def timing(self, fit: _Fit) -> tuple[float, float, float]:
        """(training seconds, compute and communication seconds of one micro-batch)."""
        spec = self.catalog["instances"][fit.layout.instance_type]
        tokens_mb = fit.micro_batch * self.run.data.seq_len
        flops = flops_per_token(self.total, self.trainable, self.method, fit.activation_checkpointing) * tokens_mb
        compute = flops / (spec["bf16_tflops_per_gpu"] * 1e12 * self.util(fit.layout.instance_type))
        comm = comm_seconds(fit.layout, spec, self.d, total_params=self.total, trainable_params=self.trainable,
                            compute_bytes=self.d["compute_bytes"])
        micro_batches = self.tokens / (fit.layout.world * tokens_mb)
        return micro_batches * step_seconds(compute, comm, self.d["comm_overlap_fraction"]), compute, comm

    def eval_seconds(self, fit: _Fit, train_seconds: float, validation_tokens: int | None) -> float:
        spec = self.catalog["instances"][fit.layout.instance_type]
        steps = self.tokens / (fit.layout.world * self.per_rank * self.run.data.seq_len)
        rate = fit.layout.world * spec["bf16_tflops_per_gpu"] * 1e12 * self.util(fit.layout.instance_type)
        return evaluation_seconds(self.run, parameters=self.total, validation_tokens=validation_tokens,
                                  optimizer_steps=steps, train_seconds=train_seconds, cluster_flops_per_s=rate,
                                  micro_batch=fit.micro_batch)

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


def estimate(run: RunSpec, *, catalog: dict | None = None, model_config: dict | None = None,
             data_tokens: int | None = None, recorded_rates: dict[str, float] | None = None,
             recorded_mfu: dict[str, tuple[float, int]] | None = None,
             validation_tokens: int | None = None) -> Estimate:
    """Estimate a validated run. `model_config`/`data_tokens` (and `validation_tokens`: data.validation's
    index.json) come from the run's sources (see sources.py);
    `recorded_rates` maps instance type to interruptions per instance-hour measured by the recorder;
    `recorded_mfu` maps instance type to (MFU, runs) measured by earlier runs of this shape and method."""
    catalog = catalog or load_catalog()
    d = catalog["defaults"]
    c = run.compute
    if c.spot and c.warm_pool_minutes:
        raise EstimateRefused("InvalidRun", "compute.warm_pool_minutes with compute.spot=true: SageMaker managed "
                              "warm pools cannot be used with spot instances; set one of them off",
                              field="compute.warm_pool_minutes")
    total, trainable = count_parameters(run, model_config)
    tokens_per_epoch = run.data.tokens if run.data.tokens is not None else data_tokens
    if not tokens_per_epoch:
        raise EstimateRefused("InvalidRun", f"data.source={run.data.source!r}: no token count (give data.tokens, or "
                              "point data.source at prepared shards with an index.json)",
                              field="data.source")
    tokens = tokens_per_epoch * run.training.epochs
    if validation_tokens is None and run.data.validation_fraction:
        f = run.data.validation_fraction  # the held-out share of the documents, about that share of the tokens
        validation_tokens = round(tokens_per_epoch * f / (1 - f))
    lora = run.training.method == "lora"
    flops = (4 * total + 6 * trainable) * tokens if lora else 6 * total * tokens
    state = training_state_bytes(total, trainable, run.training.method, d["compute_bytes"])
    ckpt_bytes = checkpoint_bytes(total, trainable, run.training.method)

    def utilization(itype: str) -> tuple[float, str]:
        if c.utilization:
            return c.utilization, "compute.utilization"
        mfu, runs = (recorded_mfu or {}).get(itype, (0.0, 0))
        if 0 < mfu <= 1:
            return mfu, (f"measured: the median MFU of {runs} earlier {run.training.method} run(s) of this model "
                         f"shape on {itype}")
        return d["utilization"], "catalog default"

    config = run.model.config or model_config
    dims = ModelDims.from_config(config) if config is not None and run.model.parameters is None else None
    planner = _Planner(run, catalog, dims, total, trainable, tokens, lambda itype: utilization(itype)[0])

    if c.instance_type != "auto":
        if c.instance_type not in catalog["instances"]:
            raise EstimateRefused("InvalidRun", f"compute.instance_type={c.instance_type!r} is not in the catalog: "
                                  f"accepted {', '.join(sorted(catalog['instances']))} or auto",
                                  field="compute.instance_type")
        candidates = [c.instance_type]
    else:
        candidates = list(catalog["instances"])
    counts = [c.instance_count] if c.instance_count is not None else range(1, d["max_auto_instance_count"] + 1)

    options: list[_Option] = []
    for itype in candidates:
        spec = catalog["instances"][itype]
        family = itype.split(".")[1]
        rate = (c.spot and (run.checkpoint.interruptions_per_hour if run.checkpoint.interruptions_per_hour
                            is not None else (recorded_rates or {}).get(
                                itype, catalog["families"][family]["interruptions_per_instance_hour"]))) or 0.0
        for count in counts:
            for layout in layouts(itype, spec, count):
                fit = planner.fit(layout)
                if fit is None:
                    continue
                train_s, compute_s, comm_s = planner.timing(fit)
                eval_s = planner.eval_seconds(fit, train_s, validation_tokens)
                train_s += eval_s
                step_s = fit.grad_accum * step_seconds(compute_s, comm_s, d["comm_overlap_fraction"])
                opt = _option(run, catalog, itype, count, train_s, ckpt_bytes, rate, step_s)
                options.append(replace(opt, fit=fit, train_seconds=train_s, compute_s=compute_s, comm_s=comm_s,
                                       eval_seconds=eval_s))
    if not options:
        where = f"compute.instance_type={c.instance_type}: " if c.instance_type != "auto" else ""
        message, field_name = planner.refusal()
        raise EstimateRefused("InvalidRun", where + message, field=field_name)

    warnings, advice = [], []
    price_of = (lambda o: o.spot) if c.spot else (lambda o: o.on_demand)
    pool = options
    if c.target_hours:
        pool = [o for o in options if o.wall + o.overhead <= c.target_hours * 3600]
        if not pool:
            fastest = min(options, key=lambda o: (o.wall + o.overhead, price_of(o)))
            pool = [fastest]
            warnings.append(f"compute.target_hours={c.target_hours}: no layout finishes in time; the fastest, "
                            f"{fastest.fit.layout.describe()}, takes {(fastest.wall + fastest.overhead) / 3600:.1f} h")
    best = min(pool, key=lambda o: (price_of(o), o.wall))
    fit = best.fit
    gpu_seconds = best.train_seconds * fit.layout.world
    util, util_source = utilization(best.instance_type)

    expected_wall = best.wall + best.overhead
    if expected_wall > MAX_RUNTIME_LIMIT_S and not c.accept_max_runtime_stop:
        raise EstimateRefused("InvalidRun", f"the run needs about {expected_wall / 86400:,.1f} days on {best.count} x "
                              f"{best.instance_type}, and SageMaker stops a job after 28 days (MaxRuntime): raise "
                              "compute.instance_count or compute.target_hours, train fewer tokens, or set "
                              "compute.accept_max_runtime_stop=true to stop at 28 days with the last checkpoint",
                              field="compute.accept_max_runtime_stop")
    max_runtime = int(min(MAX_RUNTIME_LIMIT_S, max(d["min_max_runtime_seconds"],
                                                   math.ceil(d["max_runtime_factor"] * expected_wall))))
    if c.max_wait_hours is not None:
        max_wait = int(c.max_wait_hours * 3600)
        if c.spot and max_wait < max_runtime:
            raise EstimateRefused("InvalidRun", f"compute.max_wait_hours={c.max_wait_hours}: MaxWait ({max_wait} s) "
                                  f"< MaxRuntime ({max_runtime} s); SageMaker requires MaxWait >= MaxRuntime",
                                  field="compute.max_wait_hours")
    else:
        max_wait = max_runtime + int(c.accepted_delay_hours * 3600)

    if dims is None:
        warnings.append("model.parameters only: activations, logits and gathered units are not in the memory check "
                        "(give model.config or model.source for a plan that counts them)")
    if c.instance_count and c.instance_count > 1 and not c.target_hours:
        smaller = [o for o in options if o.count < c.instance_count]
        if not smaller and any(planner.fit(lay) for lay in layouts(best.instance_type,
                                                               catalog["instances"][best.instance_type], 1)):
            warnings.append(f"compute.instance_count={c.instance_count}: the model fits one {best.instance_type}; "
                            "the extra nodes add speed and cost, not capacity it needs")
    if expected_wall > MAX_RUNTIME_LIMIT_S:
        warnings.append(f"the run needs about {expected_wall / 86400:,.1f} days: SageMaker stops it at 28 days "
                        f"(about {MAX_RUNTIME_LIMIT_S / expected_wall:.0%} of the training; accepted by "
                        "compute.accept_max_runtime_stop)")
    elif d["max_runtime_factor"] * expected_wall > MAX_RUNTIME_LIMIT_S:
        warnings.append(f"MaxRuntime is capped at SageMaker's 28 days: {MAX_RUNTIME_LIMIT_S / expected_wall:.2f}x "
                        f"the expected {expected_wall / 86400:,.1f} days instead of {d['max_runtime_factor']}x")
    cost = {"on_demand": round(best.on_demand, 2), "spot": round(best.spot, 2)}
    chosen_cost = best.spot if c.spot else best.on_demand
    if c.spot:
        advice.append(f"managed spot on {fit.layout.describe()}: ${best.spot:.2f} expected "
                      f"(on-demand ${best.on_demand:.2f}), {best.interruptions:.2f} interruptions expected")
        if c.on_demand_fallback and best.on_demand > run.max_usd:
            warnings.append(f"an on-demand fallback would cost ${best.on_demand:.2f} > budget ${run.max_usd:.2f}; "
                            "the cost guard stops it at the cap")
    else:
        advice.append(f"on-demand on {fit.layout.describe()}: ${best.on_demand:.2f}; managed spot would "
                      f"be about ${best.spot:.2f}")
    step_s = fit.grad_accum * step_seconds(best.compute_s, best.comm_s, d["comm_overlap_fraction"])
    budget = notice_upload_seconds(step_s)
    one_node = catalog["instances"][best.instance_type]["s3_upload_gb_per_s"]
    if best.policy == "save_on_notice" and best.count > 1 and ckpt_bytes / 1e9 / budget > one_node:
        advice.append(f"the {ckpt_bytes / 1e9:.1f} GB checkpoint leaves within the stop notice ({budget:.0f} s for "
                      f"the upload after a {step_s:.0f} s step) only because {best.count} nodes upload their shards "
                      f"in parallel ({best.upload_available:.2f} GB/s for {ckpt_bytes / 1e9 / budget:.2f} needed); "
                      f"periodic saves every {best.interval / 60:.0f} min stay as insurance")
    if best.policy == "periodic":
        advice.append(f"a {ckpt_bytes / 1e9:.1f} GB checkpoint cannot leave within the stop notice ({budget:.0f} s "
                      f"left for the upload after a {step_s:.0f} s step) at {best.upload_available:.2f} GB/s: "
                      f"saving every {best.interval / 60:.0f} min instead "
                      f"(Young/Daly: sqrt(2 x {ckpt_bytes / (best.upload_available * 1e9):.0f} s save x "
                      f"{(3600 / best.rate) / 3600 if best.rate else float('inf'):.1f} h between interruptions))")
    if best.comm_s > d["comm_overlap_fraction"] * best.compute_s:
        exposed = step_seconds(best.compute_s, best.comm_s, d["comm_overlap_fraction"]) - best.compute_s
        advice.append(f"communication is not fully hidden: {best.comm_s:.2f} s of collectives per micro-batch "
                      f"against {best.compute_s:.2f} s of compute ({exposed:.2f} s exposed) on "
                      f"{fit.layout.describe()}")

    est = Estimate(
        parameters=total, trainable_parameters=trainable, tokens=tokens, training_flops=flops,
        training_state_bytes=state, gpu_hours=gpu_seconds / 3600, instance_type=best.instance_type,
        instance_count=best.count, utilization=util, wall_seconds=best.wall,
        expected_interruptions=best.interruptions, expected_overhead_seconds=best.overhead,
        max_runtime_seconds=max_runtime, max_wait_seconds=max_wait, checkpoint_bytes=ckpt_bytes,
        notice_upload_gb_per_s=ckpt_bytes / StopNotice.UPLOAD_S / 1e9,
        upload_gb_per_s_available=best.upload_available, checkpoint_policy=best.policy,
        checkpoint_interval_seconds=max(1, round(best.interval)), interruptions_per_hour=best.rate,
        cost_usd=cost, spot=c.spot, sharding=fit.layout.sharding, shard_group_nodes=fit.layout.group_nodes,
        micro_batch=fit.micro_batch, grad_accum=fit.grad_accum, activation_checkpointing=fit.activation_checkpointing,
        global_batch_samples=fit.layout.world * planner.per_rank,
        memory_per_gpu={"state": fit.memory.state, "gathered": fit.memory.gathered,
                        "activations": fit.memory.activations, "logits": fit.memory.logits,
                        "total": fit.memory.total, "usable": int(fit.usable),
                        "allowance": int(d["memory_allowance_gb"] * 1e9)},
        seconds_per_micro_batch={"compute": best.compute_s, "communication": best.comm_s},
        advice=advice, warnings=warnings, utilization_source=util_source,
    )
    if util_source.startswith("measured"):
        advice.append(f"utilization {util:.2f} ({util_source}) instead of the {d['utilization']:.2f} default")
    est.evaluation_seconds = best.eval_seconds
    if run.data.validation is not None and validation_tokens is None and not run.eval.max_batches:
        warnings.append("data.validation's size is not known here: evaluation time is not in the estimate (give "
                        "eval.max_batches, or a data.validation with a readable index.json)")
    seg = _segments(run, catalog, best, ckpt_bytes, total, max_runtime)
    est.segments = seg.to_json()
    est.max_runtime_seconds = seg.first_max_runtime_seconds or max_runtime
    if c.max_wait_hours is None:  # MaxWait follows the first segment's MaxRuntime; the user's stands as given
        est.max_wait_seconds = est.max_runtime_seconds + int(c.accepted_delay_hours * 3600)
    if seg.fits:
        chosen_cost = seg.spot_cost_usd
        cost["spot" if c.spot else "on_demand"] = round(seg.spot_cost_usd, 2)
    advice.append(seg.line)
    est.hyperparameters = trainer_hyperparameters(run, est)
    if c.spot and best.spot >= 0.9 * best.on_demand:
        advice.append("spot saves under 10% here once interruptions are counted: on-demand (compute.spot=false) "
                      "costs about the same without the interruptions")
    if chosen_cost > run.max_usd:
        if not lora:
            advice.append(_lora_alternative(run, catalog, model_config, data_tokens, recorded_rates))
        raise EstimateRefused("OverBudget", f"estimated ${chosen_cost:.2f} exceeds budget.max_usd={run.max_usd:.2f} "
                              f"({fit.layout.describe()}, {expected_wall / 3600:.1f} h)", est,
                              field="budget.max_usd")
    if not seg.fits:
        raise EstimateRefused("OverBudget", f"budget.max_usd={run.max_usd:.2f} cannot carry the run "
                              f"({fit.layout.describe()}, {expected_wall / 3600:.1f} h, estimated "
                              f"${chosen_cost:,.2f}): {seg.line}", est, field="budget.max_usd")
    return est


def segment_overhead_seconds(catalog: dict, itype: str, count: int, ckpt_bytes: int, parameters: int) -> float:
    """One segment restart: provisioning, image pull and data (`startup_seconds`), the trainer's start and
    checkpoint restore (catalog `trainer_restart_seconds`, benchmarks/segment_restart.py), and reading the bf16
    weights and the checkpoint from S3 (at the conservative upload rate, shared by the nodes)."""
    d, spec = catalog["defaults"], catalog["instances"][itype]
    moved = ckpt_bytes + parameters * BytesPerParameter.EXPORT_BF16
    return startup_seconds(d) + d["trainer_restart_seconds"] + moved / (spec["s3_upload_gb_per_s"] * count * 1e9)


def _segments(run: RunSpec, catalog: dict, best: _Option, ckpt_bytes: int, parameters: int,
              longest_s: int) -> SegmentPlan:
    """The chain of jobs the cap allows (spotrun/segments.py), from the chosen layout's expected figures."""
    c, d = run.compute, catalog["defaults"]
    family = best.instance_type.split(".")[1]
    discount = c.spot_discount if c.spot_discount is not None else catalog["families"][family]["spot_discount"]
    usd_per_s = catalog["instances"][best.instance_type]["on_demand_usd_per_hour"] * best.count / 3600
    return plan_segments(
        cap_usd=run.max_usd, usd_per_s=usd_per_s, spot_fraction=(1 - discount) if c.spot else 1.0,
        # A run accepted to stop at SageMaker's 28 days plans that much (compute.accept_max_runtime_stop).
        run_seconds=min(best.wall + best.overhead, longest_s), startup_s=startup_seconds(d),
        overhead_s=segment_overhead_seconds(catalog, best.instance_type, best.count, ckpt_bytes, parameters),
        save_s=ckpt_bytes / (best.upload_available * 1e9), longest_s=longest_s,
        warm_pool_s=0 if c.spot else c.warm_pool_minutes * 60)


def _lora_alternative(run: RunSpec, catalog: dict, model_config: dict | None, data_tokens: int | None,
                      recorded_rates: dict[str, float] | None) -> str:
    """Advice for a full fine-tune over budget: what LoRA (rank 16, all linear layers) would cost."""
    generic = ("a LoRA fine-tune (training.method=lora) trains and checkpoints a small fraction of the parameters "
               "and costs less")
    if run.model.parameters is not None:
        return generic
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
    t, hp = run.training, Hyperparameter
    return {
        hp.MICRO_BATCH.value: str(est.micro_batch), hp.GRAD_ACCUM.value: str(est.grad_accum),
        hp.EPOCHS.value: str(t.epochs), hp.SEED.value: str(t.seed), hp.LR.value: str(t.lr),
        hp.SEQ_LEN.value: str(run.data.seq_len),
        hp.SHARDING_MODE.value: est.sharding, hp.SHARDING_GROUP_NODES.value: str(est.shard_group_nodes),
        hp.ACTIVATION_CHECKPOINTING.value: "true" if est.activation_checkpointing else "false",
        # repr: the exact planned seconds / 60 (a rounded "0.00" would read as "off" in the trainer)
        hp.CHECKPOINT_INTERVAL_MINUTES.value: repr(est.checkpoint_interval_seconds / 60),
        hp.CHECKPOINT_KEEP.value: str(run.checkpoint.keep),
        hp.SEGMENT_SECONDS.value: str(first_segment_seconds(est)),
        **_method_hyperparameters(run),
        **_eval_hyperparameters(run),
    }


def _eval_hyperparameters(run: RunSpec) -> dict[str, str]:
    """The evaluation schedule (spotrun_trainer.config.EvalConfig parses it) and which weights are exported."""
    if not run.data.has_validation:
        return {}
    e, hp = run.eval, Hyperparameter
    out = {hp.EVAL_EVERY_STEPS.value: str(e.every_steps), hp.EVAL_EVERY_MINUTES.value: repr(float(e.every_minutes)),
           hp.EVAL_MAX_BATCHES.value: str(e.max_batches), hp.EVAL_KEEP_BEST.value: "true" if e.keep_best else "false"}
    if run.export_from != "last":
        out[hp.EXPORT_WEIGHTS.value] = run.export_from
    return out


def first_segment_seconds(est: Estimate) -> int:
    """The first job's trainer budget: save and exit before its MaxRuntime (spotrun/segments.py)."""
    save_s = est.checkpoint_bytes / (est.upload_gb_per_s_available * 1e9) if est.upload_gb_per_s_available else 0
    return segment_seconds(est.max_runtime_seconds, startup_s=est.segments.get("overhead_seconds", 0.0),
                           save_s=save_s)


def _method_hyperparameters(run: RunSpec) -> dict[str, str]:
    """The training method and, for LoRA, its settings (spotrun_trainer.config.LoraConfig parses them)."""
    out = {Hyperparameter.METHOD.value: run.training.method}
    if run.model.source:
        out[Hyperparameter.MODEL_SOURCE.value] = run.model.source
    lora = run.training.lora
    if run.training.method == "lora" and lora is not None:
        targets = lora.target_modules
        out.update({
            Hyperparameter.LORA_RANK.value: str(lora.rank),
            Hyperparameter.LORA_ALPHA.value: repr(float(lora.alpha)),
            Hyperparameter.LORA_DROPOUT.value: repr(float(lora.dropout)),
            Hyperparameter.LORA_TARGET_MODULES.value: targets if isinstance(targets, str) else ",".join(targets),
        })
    return out


def _memory_text(m: dict) -> str:
    if not m:
        return "not modelled"
    gb = 1e9
    return (f"{m['total'] / gb:.1f} GB of {m['usable'] / gb:.1f} GB usable (state {m['state'] / gb:.1f}, gathered "
            f"{m['gathered'] / gb:.1f}, activations {m['activations'] / gb:.1f}, logits {m['logits'] / gb:.1f}; "
            f"+{m['allowance'] / gb:.1f} GB allowance)")


def format_text(est: Estimate) -> str:
    rows = [
        ("parameters", f"{est.parameters:,}"), ("trainable parameters", f"{est.trainable_parameters:,}"),
        ("tokens", f"{est.tokens:,.0f}"), ("training FLOPs", f"{est.training_flops:.3e}"),
        ("training state", f"{est.training_state_bytes / 1e9:,.1f} GB"),
        ("GPU-hours", f"{est.gpu_hours:,.2f} at utilization {est.utilization:.2f} ({est.utilization_source})"),
        ("instances", f"{est.instance_count} x {est.instance_type}"),
        ("sharding", f"{est.sharding}" + (f" (shard groups of {est.shard_group_nodes} node(s))"
                                          if est.sharding == "hybrid" else "")),
        ("batch", f"micro_batch {est.micro_batch} x grad_accum {est.grad_accum} per GPU, "
                  f"{est.global_batch_samples} samples per step, activation checkpointing "
                  f"{'on' if est.activation_checkpointing else 'off'}"),
        ("memory per GPU", _memory_text(est.memory_per_gpu)),
        ("wall time", f"{est.wall_seconds / 3600:,.2f} h (+{est.expected_overhead_seconds / 3600:.2f} h expected "
                      f"from {est.expected_interruptions:.2f} interruptions)"),
        ("MaxRuntime / MaxWait", f"{est.max_runtime_seconds:,} s / {est.max_wait_seconds:,} s"),
        ("checkpoint", f"{est.checkpoint_bytes / 1e9:,.2f} GB, {est.checkpoint_policy}, every "
                       f"{est.checkpoint_interval_seconds / 60:.1f} min"),
        ("notice upload needed", f"{est.notice_upload_gb_per_s:.3f} GB/s (available "
                                 f"{est.upload_gb_per_s_available:.2f} GB/s)"),
        ("cost", f"spot ${est.cost_usd['spot']:,.2f} / on-demand ${est.cost_usd['on_demand']:,.2f}"),
        ("cap", est.segments.get("line", "")),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    lines += [f"advice: {a}" for a in est.advice] + [f"warning: {w}" for w in est.warnings]
    return "\n".join(lines)
