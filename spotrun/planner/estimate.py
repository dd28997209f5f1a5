"""The pre-launch estimate: instance type, node count, sharding, batch layout, time limits, checkpoint cadence and
cost, or a refusal.

This module owns `estimate` (count the work, choose among the options, set the limits, build the Estimate, hold
the budget) and its refusal; spotrun/planner/options.py fits, times and prices each layout; spotrun/planner/outputs.py
defines the Estimate and turns it into the trainer's hyperparameters and text; spotrun/planner/catalog.py loads
the prices.

Rules, with the choices made here:

- Layouts: every catalog instance type (or the one given) x 1..max_auto_instance_count nodes (or the count given)
  x every sharding of those nodes (spotrun/planner/topology.py: full over all GPUs, or hybrid shard groups of whole
  nodes; cross-node shard groups only on EFA nodes).
- Memory (spotrun/planner/memory.py, the same model the trainer logs beside its measured peak): per GPU, sharded
  training state + the gathered FSDP unit(s) + activations + logits must stay under gpu_memory * memory_usable_fraction
  minus memory_allowance_gb (CUDA context, NCCL buffers). For each layout the planner keeps the run's samples per
  rank and optimizer step (training.micro_batch * training.grad_accum) and picks the largest micro-batch dividing
  it that fits, first without and then with activation checkpointing; grad_accum makes up the rest (the batch
  row names the run's micro_batch x grad_accum when they changed). These, the
  sharding and activation checkpointing go to the trainer as hyperparameters. The samples per optimizer step are
  the GPUs x that: a chosen layout with more GPUs than the fewest that fit (for a deadline, a target, or the
  price) warns with both batches, both step counts, the unscaled training.lr and how to keep the run's batch.
  A run given only model.parameters has no shape: its activations are not modelled (a warning says so).
- Time (spotrun/planner/topology.py): per micro-batch, compute (6 N per token, +2 N with activation checkpointing; LoRA
  4 N + 6 N_adapter) at the data-sheet peak x utilization, and the FSDP
  collectives over the catalog's NVLink/PCIe and EFA bandwidths, hidden behind compute up to a stated fraction.
  wall = training time + startup (`startup_seconds`: the catalog's 180 s for provisioning and data download, plus
  pulling the trainer image, which every spot restart does again). Utilization: compute.utilization when
  given, else the median MFU measured by earlier completed runs of the same model shape and method on that
  instance type (recorded by spotrun/planner/measured.py), else the catalog's 0.25; the estimate says which.
- Choice: the cheapest layout that fits (spot or on-demand, as the run asks), among those meeting
  compute.target_hours when given (the fastest, with a warning, when none does). A model that fits nothing is
  refused naming the largest layout tried and what it would need. A spot run with compute.deadline_hours, given
  the policy stage's `layout_cost`, takes among its cheapest layouts (and the fastest) the one whose chosen spot
  policy is simulated to bill least (`_by_policy`): a cheaper, slower layout leaves the deadline policies less slack.
- Checkpoint bytes (spotrun/planner/memory.py): 12/param full (fp32 weights + Adam moments), 12/adapter param LoRA. The
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
  `checkpoint.interval_minutes` never rounds to 0, which the trainer reads as "off"), as
  `checkpoint.interval_s`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from ..contract.refusal import Refusal
from ..contract.spec import MAX_RUNTIME_LIMIT_S, LoraSpec, RunSpec, RunValidationError, deadline_hours_text
from ..contract.strict_json import show
from ..seams import SegmentPlan, StopNotice
from .catalog import (
    CATALOG_PATH,
    DEFAULT_PRICE_REGION,
    check_prices,
    hours_text,
    load_catalog,
    regional_catalog,
    share_done,
    usd,
)
from .memory import ModelDims, checkpoint_bytes, training_state_bytes
from .options import (
    LayoutPlanner,
    Option,
    checkpoint_advice,
    evaluation_seconds,
    interruption_rate,
    mean_wait,
    notice_upload_seconds,
    periodic_saves_seconds,
    price_advice,
    price_option,
    segment_overhead_seconds,
    segment_plan,
    startup_seconds,
)
from .outputs import Estimate, first_segment_seconds, format_text, hyperparameters, planned_steps
from .params import Shape, lora_parameters, shape_of
from .segments import JOB_END_S, job_start_s, segments_at, uncapped_cost_usd
from .ties import NOISE_SES, by_tail, unpaired_se, unresolved
from .topology import layouts, step_seconds

# The planner's names, wherever they are defined (spotrun/planner/catalog.py, options.py, outputs.py).
__all__ = [
    "CATALOG_PATH", "DEFAULT_PRICE_REGION", "Estimate", "EstimateRefused", "check_prices", "count_parameters",
    "estimate", "evaluation_seconds", "first_segment_seconds", "format_text", "load_catalog",
    "notice_upload_seconds", "regional_catalog", "segment_overhead_seconds", "startup_seconds",
]


class EstimateRefused(Refusal):
    """The planner refuses the run (spotrun.contract.refusal.Refusal). `code` is its status, the state machine's named
    failure: InvalidRun or OverBudget; `field` the run field to change."""

    def __init__(self, code: str, message: str, estimate: Estimate | None = None, field: str | None = None,
                 notes: dict | None = None):
        super().__init__(code, message, field=field, estimate=estimate)
        self.code = self.status
        # what the refusal says of the caps it names, as the accepted estimate's JSON carries it (`held_out_margin`,
        # `cap_to_set_held_out_margin`, `cap_to_set_speed_margin`, `cap_to_set_refused_field`: the field the
        # estimate at the cap to set refuses, compute.deadline_hours or null; spotrun/pipeline/policy_stage.py
        # `over_budget_with_caps`); empty where it names none
        self.notes = notes or {}


def count_parameters(run: RunSpec, model_config: dict | None) -> tuple[int, int, Shape | None]:
    """(total parameters, trainable parameters, the model's shape: None when only model.parameters is given)."""
    config = model_config or run.model.config  # the source's own config.json wins over an inline copy
    if run.model.parameters is not None:
        if run.training.method == "lora":
            raise EstimateRefused("InvalidRun", "training.method=lora needs the model's shape: give model.config or "
                                  "model.source instead of model.parameters",
                                  field="training.method")
        return run.model.parameters, run.model.parameters, None
    if config is None:
        raise EstimateRefused("InvalidRun", f"model.source={show(run.model.source)}: its config.json could not be read",
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
        return total, lora_parameters(shape, run.training.lora.rank, run.training.lora.target_modules), shape
    return total, total, shape


@dataclass(frozen=True)
class _Work:
    """What the run asks for, counted before any layout: parameters, tokens, FLOPs and bytes."""

    total: int
    trainable: int
    tokens: float
    validation_tokens: int | None
    flops: float
    state: int
    ckpt_bytes: int
    dims: ModelDims | None  # None: model.parameters only, no shape to model activations with


def estimate(run: RunSpec, *, catalog: dict | None = None, model_config: dict | None = None,
             data_tokens: int | None = None, recorded_rates: dict[str, float] | None = None,
             recorded_mfu: dict[str, tuple[float, int]] | None = None,
             recorded_waits: dict[str, tuple[float, int]] | None = None,
             validation_tokens: int | None = None, tokens_lower_bound: bool = False,
             base_name: str | None = None, layout_cost: LayoutCost | None = None) -> Estimate:
    """Estimate a validated run. `model_config`/`data_tokens` (and `validation_tokens`: data.validation's
    index.json) come from the run's sources (see sources.py); `tokens_lower_bound`: the count is the fewest raw
    text can make (spotrun/planner/stage.py `smallest_cap`), so fewer than one optimizer step is not refused;
    `recorded_rates` maps instance type to interruptions per instance-hour measured by the recorder;
    `recorded_mfu` maps instance type to (MFU, runs) measured by earlier runs of this shape and method;
    `recorded_waits` maps instance type to (mean wait for capacity after an interruption in seconds, waits);
    `base_name`: the name an exported adapter gives its base model (outputs.py `hyperparameters`);
    `layout_cost`: the spot policy's simulated bill of a layout's Estimate (spotrun/policy/choose.py
    `LayoutRanker`), by which a spot run with a deadline chooses among its cheapest layouts (`_by_policy`).

    The steps: count the work; enumerate the layouts that fit (options.LayoutPlanner); choose the cheapest
    (meeting compute.target_hours); set the time limits; write the advice; build the Estimate; hold the budget;
    with `layout_cost` and a deadline, the layout whose chosen spot policy bills least."""
    catalog = catalog or load_catalog()
    d = catalog["defaults"]
    work = _count_work(run, d, model_config, data_tokens, validation_tokens)
    utilization = _utilization(run, d, recorded_mfu)
    planner = LayoutPlanner(run, catalog, work.dims, work.total, work.trainable, work.tokens,
                            lambda itype: utilization(itype)[0])
    candidates, counts = _candidates(run, catalog)
    options = planner.options(candidates, counts, work.ckpt_bytes, work.validation_tokens, recorded_rates)
    if not options:
        where = f"compute.instance_type={run.compute.instance_type}: " if run.compute.instance_type != "auto" else ""
        message, field_name = planner.refusal()
        raise EstimateRefused("InvalidRun", where + message, field=field_name)

    job_s = functools.partial(uninterrupted_job_s, catalog, ckpt_bytes=work.ckpt_bytes, parameters=work.total)
    best, warnings, pool, pool_words = _choose(run, options, job_s)

    def build(best: Option, warnings: list[str]) -> Estimate:
        """The Estimate of the layout `best` (refused where the run cannot have it)."""
        if not tokens_lower_bound:
            _one_step(run, work.tokens, best, planner.per_rank)
        warnings += _deadline(run, options, best, job_s)
        max_runtime, runtime_warnings = _limits(run, d, best)
        warnings += _layout_warnings(run, catalog, planner, options, best, work.dims) + runtime_warnings
        warnings += _settings_without_effect(run)
        warnings += _batch_warnings(run, options, best, planner.per_rank, work.tokens)
        advice = price_advice(run, best)
        advice += checkpoint_advice(catalog, best, work.ckpt_bytes)
        util, util_source = utilization(best.instance_type)
        if util_source.startswith("measured"):
            advice.append(f"utilization {util:.2f} ({util_source}) instead of the {d['utilization']:.2f} default")
        if run.data.validation is not None and work.validation_tokens is None and not run.eval.max_batches:
            warnings.append("data.validation's size is not known here: evaluation time is not in the estimate (give "
                            "eval.max_batches, or a data.validation with a readable index.json)")
        seg = segment_plan(run, catalog, best, work.ckpt_bytes, work.total, max_runtime)
        advice.append(seg.line)
        warnings += _idle_warm_pool(run, seg)
        if run.compute.spot and best.spot >= 0.9 * best.on_demand:
            advice.append("spot saves under 10% here once interruptions are counted: on-demand (compute.spot=false) "
                          "costs about the same without the interruptions")

        # the chain's expected bill, as the cost row shows it: at this cap, or (refused) where no cap binds
        chosen_cost = seg.spot_cost_usd if seg.fits else uncapped_cost_usd(seg)
        if chosen_cost > run.max_usd and run.training.method != "lora":  # before the Estimate: not changed after
            advice.append(_lora_alternative(run, catalog, model_config, data_tokens, recorded_rates))
        # the hyperparameters checked here: invalid input wins over the budget, the run must change anyway
        est = _build(run, catalog, work, best, planner.per_rank, (util, util_source), max_runtime, seg, advice,
                     warnings, base_name)
        est = replace(est, warnings=[*est.warnings, *_cap_far_over(run, est)])
        if not run.compute.spot:  # the cost row's spot figure: the same layout as a spot run plans it
            spot_usd, spot_jobs = spot_view_cost(run, catalog, work, best, recorded_rates)
            est = replace(est, cost_usd={**est.cost_usd, "spot": spot_usd}, spot_figure_jobs=spot_jobs)
        wait_s, wait_source = mean_wait(run, best.instance_type, recorded_waits)
        if wait_s is not None:  # the spot policy's traces wait this long on average (spotrun/policy/choose.py)
            est = replace(est, mean_wait_seconds=round(wait_s, 1), mean_wait_source=wait_source)
        market = "spot" if run.compute.spot else "on-demand"
        # compared at the cents it is printed at ('estimated $0.74 exceeds budget.max_usd=$0.74' read as no reason): a
        # cost that rounds to the cap is refused below, where the chain does not fit, on the chain's words
        if round(chosen_cost, 2) > run.max_usd:  # names the cap its chain needs (more than the estimate)
            smallest = f"; the smallest cap whose chain finishes is {usd(seg.min_cap_usd)}" if \
                seg.min_cap_usd and seg.min_cap_usd > run.max_usd else ""
            raise EstimateRefused("OverBudget", f"estimated {usd(chosen_cost)} ({market}) exceeds budget.max_usd="
                                  f"{usd(run.max_usd)} ({best.fit.layout.describe()}, "
                                  f"{hours_text(best.wall + best.overhead)}){smallest}", est, field="budget.max_usd")
        if not seg.fits:
            raise EstimateRefused("OverBudget", f"budget.max_usd={usd(run.max_usd)} cannot carry the run "
                                  f"({best.fit.layout.describe()}, {hours_text(best.wall + best.overhead)}, estimated "
                                  f"{usd(chosen_cost)} {market}): {seg.line}", est, field="budget.max_usd")
        return est

    est = build(best, list(warnings))
    if layout_cost is None or not _policy_ranks_layouts(run):
        return est
    return _by_policy(run, est, best, _policy_candidates(pool, best, job_s),
                      lambda option: build(option, list(warnings)), layout_cost,
                      _candidates_why(pool, pool_words))


def _count_work(run: RunSpec, defaults: dict, model_config: dict | None, data_tokens: int | None,
                validation_tokens: int | None) -> _Work:
    """The run's size (refusing a model it cannot count, data without a token count); validation tokens from
    data.validation_fraction when the validation set's size is not given. (A spot run with a warm pool is refused
    by the contract: spotrun/contract/spec.py.)"""
    total, trainable, shape = count_parameters(run, model_config)
    tokens_per_epoch = run.data.tokens if run.data.tokens is not None else data_tokens
    if not tokens_per_epoch:
        raise EstimateRefused("InvalidRun", f"data.source={show(run.data.source)}: no token count (give data.tokens, "
                              "or point data.source at prepared shards with an index.json)",
                              field="data.source")
    tokens = tokens_per_epoch * run.training.epochs
    if validation_tokens is None and run.data.validation_fraction:
        f = run.data.validation_fraction  # the held-out share of the documents, about that share of the tokens
        validation_tokens = round(tokens_per_epoch * f / (1 - f))
    method = run.training.method
    flops = (4 * total + 6 * trainable) * tokens if method == "lora" else 6 * total * tokens
    dims = ModelDims(shape) if shape is not None else None
    return _Work(total, trainable, tokens, validation_tokens, flops,
                 state=training_state_bytes(total, trainable, method, defaults["compute_bytes"]),
                 ckpt_bytes=checkpoint_bytes(total, trainable, method), dims=dims)


def _utilization(run: RunSpec, defaults: dict,
                 recorded_mfu: dict[str, tuple[float, int]] | None) -> Callable[[str], tuple[float, str]]:
    """instance type -> (utilization, where it came from): compute.utilization, else the median MFU recorded
    for this model shape and method on that type, else the catalog default."""
    def utilization(itype: str) -> tuple[float, str]:
        if run.compute.utilization:
            return run.compute.utilization, "compute.utilization"
        mfu, runs = (recorded_mfu or {}).get(itype, (0.0, 0))
        if 0 < mfu <= 1:
            return mfu, (f"measured: the median MFU of {runs} earlier {run.training.method} run(s) of this model "
                         f"shape on {itype}")
        return defaults["utilization"], "catalog default"

    return utilization


def _candidates(run: RunSpec, catalog: dict) -> tuple[list[str], Iterable[int]]:
    """(instance types, node counts) to try: the run's, or every catalog type x 1..max_auto_instance_count."""
    c = run.compute
    if c.instance_type != "auto":
        if c.instance_type not in catalog["instances"]:
            raise EstimateRefused("InvalidRun", f"compute.instance_type={show(c.instance_type)} is not in the catalog: "
                                  f"accepted {', '.join(sorted(catalog['instances']))} or auto",
                                  field="compute.instance_type")
        candidates = [c.instance_type]
    else:
        candidates = list(catalog["instances"])
    counts = [c.instance_count] if c.instance_count is not None else \
        range(1, catalog["defaults"]["max_auto_instance_count"] + 1)
    return candidates, counts


def _choose(run: RunSpec, options: list[Option],
            job_s: Callable[[Option], float]) -> tuple[Option, list[str], list[Option], str]:
    """(the cheapest option, spot or on-demand as the run asks, among those meeting compute.target_hours, or the
    fastest when none does; the warning that says so). With compute.deadline_hours, among the layouts whose run
    meets it: with the expected interruptions where some do, else uninterrupted (`job_s`: one job as the chain
    bills it); where none does, `_deadline` refuses or warns with the fastest (a new user's `instance_type: auto`
    picked the cheapest layout whatever the deadline); then the pool it was chosen from and what the pool is, in
    words (`meeting the deadline with the expected interruptions`: the layouts compared by the policy's bill are
    of it, and the words say why they change between nearby deadlines)."""
    c, warnings = run.compute, []
    price_of = (lambda o: o.spot) if c.spot else (lambda o: o.on_demand)
    pool, words = options, "the planner has"
    if c.deadline_s is not None and not c.target_hours:
        expected = [o for o in options if job_s(o) + o.overhead <= c.deadline_s]
        plain = [o for o in options if job_s(o) <= c.deadline_s]
        pool = expected or plain or options
        words = ("meeting the deadline with the expected interruptions" if expected else
                 "meeting the deadline uninterrupted (none does with the expected interruptions)" if plain else
                 "the planner has (none meets the deadline)")
    if c.target_hours:
        pool = [o for o in options if o.wall + o.overhead <= c.target_hours * 3600]
        words = f"finishing within compute.target_hours={c.target_hours}"
        if not pool:
            fastest = min(options, key=lambda o: (o.wall + o.overhead, price_of(o)))
            pool = [fastest]
            words = f"the planner has (none finishes within compute.target_hours={c.target_hours})"
            warnings.append(f"compute.target_hours={c.target_hours}: no layout finishes in time; the fastest, "
                            f"{fastest.fit.layout.describe()}, takes {hours_text(fastest.wall + fastest.overhead)}")
    return min(pool, key=lambda o: (price_of(o), o.wall)), warnings, pool, words


@dataclass(frozen=True)
class LayoutBill:
    """What the spot policy chosen on a layout is simulated to bill (spotrun/policy/choose.py `LayoutRanker`): its
    label, mean bill and P(deadline), and whether that meets the deadline at the policy stage's confidence."""

    policy: str
    mean_usd: float
    p_deadline: float | None
    meets: bool
    p95_usd: float | None = None
    se_usd: float = 0.0  # the standard error of `mean_usd` over its traces (spotrun/planner/ties.py)


# (run, a layout's Estimate) -> its chosen policy's simulated bill, or None where the estimate's time bound leaves
# that layout out (the simulation is not made)
LayoutCost = Callable[[RunSpec, Estimate], "LayoutBill | None"]
POLICY_LAYOUTS = 3  # the cheapest layouts by spot rate (one per instance type and count) compared, plus the fastest
# The share of the planner's layout's simulated mean a layout of another GPU count (so another batch per optimizer
# step) must save to be chosen over it; one of the same GPU count is chosen on a cent. The simulated mean rests on
# the generated traces, which miss the public recordings' bills by more than this (docs/spot-policy.md,
# "Calibration at a cap that binds"): a smaller saving is the model's, not the run's, and not worth the run's
# batch (a new user: 3 x ml.g6e.xlarge, 3x the batch, for 3.7% of the mean).
LAYOUT_SWITCH_SHARE = 0.05
POLICY_MEAN_WHY = "chosen for its spot policy's simulated mean"  # the batch warning's reason when `_by_policy` chose


def _policy_ranks_layouts(run: RunSpec) -> bool:
    """Whether the spot policy stage can overturn the planner's price ranking of layouts: a spot run with a
    deadline, where a cheaper but slower layout leaves the deadline policies less slack, so they buy more on-demand
    (a new user: 10.2 h chose 1 x ml.g6e.48xlarge, whose policies meeting it all ran on-demand at $376.83, where
    10.05 h's 1 x ml.p5.48xlarge ran spot at $154.70). Without a deadline the policies choose by their mean alone
    and run spot until MaxWait: the simulated mean follows the planner's spot figure."""
    return run.compute.spot and run.compute.deadline_s is not None


def _policy_candidates(pool: list[Option], best: Option, job_s: Callable[[Option], float]) -> list[Option]:
    """The layouts the spot policy is simulated on: the cheapest of each instance type and count by spot rate,
    the POLICY_LAYOUTS cheapest of them (`best` first), and the fastest of the pool (the most slack)."""
    cheapest: dict[tuple[str, int], Option] = {(best.instance_type, best.count): best}
    for o in sorted(pool, key=lambda o: (o.spot, o.wall)):
        cheapest.setdefault((o.instance_type, o.count), o)
    out = list(cheapest.values())[:POLICY_LAYOUTS]
    fastest = min(pool, key=lambda o: (job_s(o) + o.overhead, o.spot))
    if all((o.instance_type, o.count) != (fastest.instance_type, fastest.count) for o in out):
        out.append(fastest)
    return out


def _candidates_why(pool: list[Option], pool_words: str) -> str:
    """Which layouts `_policy_candidates` takes from `pool`, and why those, in one clause of the advice line: the
    pool is what changes between nearby deadlines (a layout just fast enough joins it)."""
    layouts = len({(o.instance_type, o.count) for o in pool})
    of = f"the {layouts} layout{'s' * (layouts != 1)} (instance type and count) {pool_words}"
    if layouts <= POLICY_LAYOUTS:
        return f"{'all' if layouts > 1 else 'the one'} of {of}"
    return (f"the {POLICY_LAYOUTS} cheapest by spot rate of {of}, and the fastest of them (the most slack to the "
            "deadline)")


def _by_policy(run: RunSpec, est: Estimate, best: Option, options: list[Option],
               build: Callable[[Option], Estimate], layout_cost: LayoutCost, why_these: str = "") -> Estimate:
    """The Estimate of the layout among `options` whose chosen spot policy bills least in the simulated mean,
    among those whose policy meets the deadline on the confidence the policy stage chooses by (the same rule); the
    planner's `est` (of `best`, the cheapest spot rate) where none beats it or none meets it. Its advice says which
    layouts were compared (`why_these`: which and why those, `_candidates_why`) and, where the choice is not the
    cheapest spot rate, why (one line)."""
    bill = layout_cost(run, est)
    if len(options) < 2 or bill is None:
        return est
    compared = [(best, est, bill)]
    skipped, refused = [], []
    for option in options[1:]:
        try:
            other = build(option)
        except EstimateRefused:  # this layout is not one the run can have (its cap, its batch): not compared
            refused.append(option)
            continue
        other_bill = layout_cost(run, other)
        if other_bill is None:
            skipped.append(option)
            continue
        compared.append((option, other, other_bill))
    chosen = _policy_choice(compared)
    line = _compared_line(run, compared, chosen, skipped, why_these, refused)
    out = chosen[1]
    if chosen is not compared[0]:
        out = replace(out, warnings=[_policy_batch_reason(w, chosen, compared[0]) for w in out.warnings])
    return replace(out, advice=[*out.advice[:1], line, *out.advice[1:]])


def _policy_choice(compared: list) -> tuple:
    """Of the layouts compared (the planner's first), the one to run: where the planner's layout meets the deadline
    on the confidence, of it, the others that meet it on as many GPUs and those of another GPU count (another batch)
    that save more than LAYOUT_SWITCH_SHARE of its simulated mean, the least mean, or where others' means are within
    the simulation's noise of it, the lowest P95 of those (`_least_by_tail`); where it does not, the same of those
    meeting it, or, where none does, the one likeliest to meet it by more than a point (the planner's otherwise: a
    user who gave a deadline no layout meets on the confidence is better served by the likeliest than by the
    cheapest)."""
    first = compared[0]
    meeting = [c for c in compared if c[2].meets]
    if first[2].meets:
        def eligible(c: tuple) -> bool:
            same_batch = c[0].fit.layout.world == first[0].fit.layout.world
            return c is first or same_batch or c[2].mean_usd < first[2].mean_usd * (1 - LAYOUT_SWITCH_SHARE)
        return _least_by_tail([c for c in meeting if eligible(c)])[0]
    if meeting:
        return _least_by_tail(meeting)[0]
    odds = [c for c in compared if c[2].p_deadline is not None]
    if first[2].p_deadline is None or not odds:
        return first
    likeliest = max(odds, key=lambda c: (c[2].p_deadline, -c[2].mean_usd))
    return likeliest if likeliest[2].p_deadline > first[2].p_deadline + 0.01 else first


def _layouts_se(a: tuple, b: tuple) -> float:
    """The standard error of the difference of two layouts' means: each draws its own traces (unpaired)."""
    return unpaired_se(a[2].se_usd, b[2].se_usd)


def _least_by_tail(layouts: list) -> tuple:
    """(the layout chosen, the least mean) of `layouts` (in the order compared): the least simulated mean, where
    another's is within the simulation's noise of it (spotrun/planner/ties.py: NOISE_SES standard errors of the
    difference, or half a cent) the lowest P95 bill of those (the cap to set follows it), then the order compared
    (a new user: 1 x ml.g6e.48xlarge kept over 1 x ml.p5.48xlarge for $151.11 against $152.08, a lead the noise
    of 1,000 traces holds, at a P95 of $304.09 against $164.97)."""
    return by_tail(layouts, lambda c: c[2].mean_usd,
                   lambda c: math.inf if c[2].p95_usd is None else c[2].p95_usd, _layouts_se)


def _tail_why(chosen: tuple, least: tuple) -> str:
    """Why a layout whose mean is not the least was chosen: the lead is within the noise, its P95 lower."""
    lead, se = chosen[2].mean_usd - least[2].mean_usd, _layouts_se(chosen, least)
    within = (f"is within the simulation's noise ({NOISE_SES:g} standard errors of the difference: "
              f"{usd(NOISE_SES * se)})" if unresolved(lead, se) else "prints the same cents")  # ties.tied_with_least
    return (f"{least[0].count} x {least[0].instance_type}'s {usd(lead)} lower mean {within}, and {chosen[0].count} x "
            f"{chosen[0].instance_type}'s P95 bill is lower ({usd(chosen[2].p95_usd)} against "
            f"{usd(least[2].p95_usd)})")


def _policy_batch_reason(warning: str, chosen: tuple, first: tuple) -> str:
    """The batch warning of a layout `_by_policy` chose over the planner's: its reason is the policy's simulated
    bill, not the deadline (the planner's layout meets it too, where it does: pinning it keeps the batch at this
    deadline)."""
    deadline_why = warning.find("chosen to meet compute.deadline_hours=")
    if deadline_why < 0:
        return warning
    end = warning.index(")", deadline_why)
    if first[2].meets and chosen[2].mean_usd >= first[2].mean_usd:  # a tie the noise holds, broken by the P95
        why = (f"{POLICY_MEAN_WHY} within the simulation's noise of {first[0].count} x {first[0].instance_type}'s "
               f"({usd(chosen[2].mean_usd)} against {usd(first[2].mean_usd)}) and its lower P95 bill "
               f"({usd(chosen[2].p95_usd)} against {usd(first[2].p95_usd)}), which meets the deadline too")
    elif first[2].meets:
        why = (f"{POLICY_MEAN_WHY}, {usd(chosen[2].mean_usd)} against {usd(first[2].mean_usd)} on "
               f"{first[0].count} x {first[0].instance_type}, which meets the deadline too")
    else:
        why = (f"{POLICY_MEAN_WHY} and its odds of the deadline, where {first[0].count} x "
               f"{first[0].instance_type}'s policies do not meet it on the confidence")
    out = warning[:deadline_why] + why + warning[end:]
    return out.replace(" with a later compute.deadline_hours", "") if first[2].meets else out


def _compared_line(run: RunSpec, compared: list, chosen: tuple, skipped: list[Option], why_these: str = "",
                   refused: tuple | list = ()) -> str:
    """The advice line naming the layouts compared by their chosen spot policy's simulated mean, which ones and why
    those (`why_these`), and those left out: refused by the estimate (the run cannot have them) or past its time
    bound."""
    def row(c: tuple) -> str:
        option, _, bill = c
        odds = "" if bill.meets or bill.p_deadline is None else f", meets it on only {bill.p_deadline:.1%}"
        p95 = "" if bill.p95_usd is None else f", P95 {usd(bill.p95_usd)}"
        return f"{option.count} x {option.instance_type}: {bill.policy}, mean {usd(bill.mean_usd)}{p95}{odds}"

    deadline = deadline_hours_text(run.compute.deadline_s)
    these = f"; {why_these}" if why_these else ""
    head = (f"layouts compared by their chosen spot policy's simulated mean (meeting compute.deadline_hours="
            f"{deadline} on the policy stage's confidence{these}; a lead within the simulation's noise goes to the "
            "lower P95): ")
    rows = "; ".join(row(c) + (" (chosen)" if c is chosen else "") for c in compared)
    cheapest = compared[0]
    why = ""
    # a layout on as many GPUs with a lower mean, chosen over for its P95 (`_least_by_tail`)
    lower = [c for c in compared if c[2].meets and chosen[2].meets and c[2].mean_usd < chosen[2].mean_usd - 0.005
             and c[0].fit.layout.world == chosen[0].fit.layout.world]
    tail = _tail_why(chosen, min(lower, key=lambda c: c[2].mean_usd)) if lower else ""
    if chosen is not cheapest and tail:
        why = (f"; {chosen[0].count} x {chosen[0].instance_type} over the cheapest spot rate, {cheapest[0].count} x "
               f"{cheapest[0].instance_type} ({usd(cheapest[1].cost_usd['spot'])} planned): {tail}")
    elif tail:
        why = f"; the cheapest spot rate's layout kept: {tail}"
    elif chosen is not cheapest:
        slower = cheapest[0].wall + cheapest[0].overhead > chosen[0].wall + chosen[0].overhead
        why = (f"; {chosen[0].count} x {chosen[0].instance_type} over the cheapest spot rate, {cheapest[0].count} x "
               f"{cheapest[0].instance_type} ({usd(cheapest[1].cost_usd['spot'])} planned), whose "
               + (("policy meeting the deadline bills more in the simulated mean"
                   + (" (slower: less slack to the deadline)" if slower else ""))
                  if cheapest[2].meets else "policies do not meet the deadline on that confidence"
                  + ("" if chosen[2].meets else "; none does: the likeliest to meet it")))
    elif any(c[2].meets and c[2].mean_usd < cheapest[2].mean_usd for c in compared[1:]) and cheapest[2].meets:
        why = (f"; the cheapest spot rate's layout kept: a layout on another GPU count (another batch per optimizer "
               f"step) is chosen for more than {LAYOUT_SWITCH_SHARE:.0%} of its simulated mean (less rests on the "
               "generated traces alone)")
    left = ("; not compared within the estimate's time bound: "
            + ", ".join(f"{o.count} x {o.instance_type}" for o in skipped)) if skipped else ""
    if refused:
        left += ("; not compared, the run cannot have them (the estimate refuses them): "
                 + ", ".join(f"{o.count} x {o.instance_type}" for o in refused))
    return head + rows + why + left


def _one_step(run: RunSpec, tokens: float, best: Option, per_rank: int) -> None:
    """The run's tokens fill at least one optimizer step of the chosen layout: every GPU's micro_batch x
    grad_accum samples of seq_len tokens (fewer would train one step of repeated samples, or none)."""
    samples = best.fit.layout.world * per_rank
    if tokens >= samples * run.data.seq_len:
        return
    least = math.ceil(samples * run.data.seq_len / run.training.epochs)
    given = "data.tokens" if run.data.tokens is not None else "data.source"
    held = "" if run.data.tokens is not None else f" (its index.json counts {tokens / run.training.epochs:,.0f})"
    value = run.data.tokens if run.data.tokens is not None else repr(run.data.source)
    plural = "s" * (samples != 1)
    raise EstimateRefused("InvalidRun", f"{given}={value} is invalid: expected at least {least:,} tokens{held}: one "
                          f"optimizer step of this plan is {samples} sample{plural} of data.seq_len={run.data.seq_len} "
                          f"tokens on {best.fit.layout.describe()} ({per_rank} per GPU: training.micro_batch x "
                          f"training.grad_accum), over training.epochs={run.training.epochs:g}; give more data, a "
                          "smaller batch or fewer GPUs", field=given)


def uninterrupted_job_s(catalog: dict, option: Option, ckpt_bytes: int, parameters: int) -> float:
    """The layout's run as one uninterrupted job as the chain bills it (spotrun/planner/segments.py `job_start_s`,
    `JOB_END_S`): its start with the trainer's start and the reads (`segment_overhead_seconds`), the training with a
    periodic layout's saves (`periodic_saves_seconds`, as the chain and the simulation count them: a deadline between
    the job without them and with them was accepted and missed on every simulated trace), its billed end; more than
    the wall time row's figure, which starts at the catalog's bare startup."""
    start = segment_overhead_seconds(catalog, option.instance_type, option.count, ckpt_bytes, parameters)
    saves = periodic_saves_seconds(catalog, option, ckpt_bytes)
    return option.wall - startup_seconds(catalog["defaults"]) + start + saves + JOB_END_S


DEADLINE_MISSED = "THE DEADLINE WILL BE MISSED"  # the loud warning of a run accepted to miss its deadline
DEADLINE_MISSED_ACCEPTED = " (accepted by compute.accept_missed_deadline)"  # its end


def _deadline(run: RunSpec, options: list[Option], best: Option, job_s: Callable[[Option], float]) -> list[str]:
    """compute.deadline_hours against the run's length on on-demand instances (no interruption, no wait: the
    fastest it can be done on the chosen layout; `job_s`: a layout's uninterrupted job, as the chain and the
    simulation bill it). Shorter: refused with the numbers, or with compute.accept_missed_deadline a warning that
    it will be missed (no spot policy can meet it)."""
    c = run.compute  # the deadline in seconds; messages name the run's field, in hours
    if c.deadline_s is None or job_s(best) <= c.deadline_s:
        return []
    fastest = min(options, key=job_s)
    faster = (f"; the fastest layout, {fastest.fit.layout.describe()}, takes {hours_text(job_s(fastest))} "
              f"(compute.target_hours={deadline_hours_text(c.deadline_s)} chooses the cheapest that meets it)"
              if job_s(fastest) <= c.deadline_s else "")
    numbers = (f"the run takes {hours_text(job_s(best))} on {best.fit.layout.describe()} even on on-demand "
               f"instances from the start (one job: its start, the training and its end; no interruption){faster}")
    if not c.accept_missed_deadline:
        raise EstimateRefused("InvalidRun", f"compute.deadline_hours={deadline_hours_text(c.deadline_s)} cannot "
                              f"be met: {numbers}; give a later deadline, fewer tokens or a faster layout, or set "
                              "compute.accept_missed_deadline=true to start it anyway", field="compute.deadline_hours")
    return [f"{DEADLINE_MISSED}: compute.deadline_hours={deadline_hours_text(c.deadline_s)}, and {numbers}"
            f"{DEADLINE_MISSED_ACCEPTED}"]


def _settings_without_effect(run: RunSpec) -> list[str]:
    """Settings the run wrote that another of its settings makes do nothing (both default to false: true was
    written): said, not refused, as a new user expected them to do something."""
    c, out = run.compute, []
    if c.on_demand_fallback and not c.spot:
        out.append("compute.on_demand_fallback=true does nothing with compute.spot=false: every job is on-demand "
                   "from the start")
    if c.accept_missed_deadline and c.deadline_s is None:
        out.append("compute.accept_missed_deadline=true does nothing without compute.deadline_hours")
    return out


def _idle_warm_pool(run: RunSpec, seg) -> list[str]:
    """A warning where the run's warm pool only bills: its keep-alive bills at on-demand rates after each job, and
    the chain's last job leaves it to no job (with one job planned, all of it). The bill, the cap and the simulation
    count it (a new user's qwen2 with 30 min of warm pool was told $0.74 and would have paid $1.90)."""
    warm_s = run.compute.warm_pool_minutes * 60
    if run.compute.spot or not warm_s or not seg.chain_costs or seg.segments != 1:
        return []
    idle = warm_s * seg.chain_costs["usd_per_s"]
    return [f"compute.warm_pool_minutes={run.compute.warm_pool_minutes} keeps the instances billed for "
            f"{run.compute.warm_pool_minutes} min after the job ends ({usd(idle)} at on-demand rates, in the bill and "
            "the cap): the run is one job, so no later job takes the pool; 0 saves it (a warm pool pays where "
            "jobs follow one another: the next run started within the keep-alive)"]


def _limits(run: RunSpec, defaults: dict, best: Option) -> tuple[int, list[str]]:
    """(MaxRuntime before segmenting, the warnings about SageMaker's 28 days). Refuses a run that needs more than
    28 days unless compute.accept_max_runtime_stop, and a MaxWait below MaxRuntime."""
    c, d = run.compute, defaults
    expected_wall = best.wall + best.overhead
    if expected_wall > MAX_RUNTIME_LIMIT_S and not c.accept_max_runtime_stop:
        raise EstimateRefused("InvalidRun", f"the run needs about {expected_wall / 86400:,.1f} days on {best.count} x "
                              f"{best.instance_type}, and SageMaker stops a job after 28 days (MaxRuntime): raise "
                              "compute.instance_count or compute.target_hours, train fewer tokens, or set "
                              "compute.accept_max_runtime_stop=true to stop at 28 days with the last checkpoint",
                              field="compute.accept_max_runtime_stop")
    max_runtime = int(min(MAX_RUNTIME_LIMIT_S, max(d["min_max_runtime_seconds"],
                                                   math.ceil(d["max_runtime_factor"] * expected_wall))))
    if c.max_wait_hours is not None and c.spot and int(c.max_wait_hours * 3600) < max_runtime:
        least = math.ceil(max_runtime / 36) / 100  # hours, to the hundredth, up
        raise EstimateRefused("InvalidRun", f"compute.max_wait_hours={round(c.max_wait_hours, 12):.12g}: MaxWait "
                              f"({int(c.max_wait_hours * 3600)} s) < MaxRuntime ({max_runtime} s: "
                              f"{d['max_runtime_factor']:g}x the {hours_text(expected_wall)} the run is expected to "
                              f"take, the planner's limit for one job); SageMaker requires MaxWait >= MaxRuntime: "
                              f"give compute.max_wait_hours={least:g} or more, or leave it out",
                              field="compute.max_wait_hours")
    warnings = []
    if expected_wall > MAX_RUNTIME_LIMIT_S:
        warnings.append(f"the run needs about {expected_wall / 86400:,.1f} days: SageMaker stops it at 28 days "
                        f"(about {share_done(MAX_RUNTIME_LIMIT_S / expected_wall)} of the training; accepted by "
                        "compute.accept_max_runtime_stop)")
    elif d["max_runtime_factor"] * expected_wall > MAX_RUNTIME_LIMIT_S:
        warnings.append(f"MaxRuntime is capped at SageMaker's 28 days: {MAX_RUNTIME_LIMIT_S / expected_wall:.2f}x "
                        f"the expected {expected_wall / 86400:,.1f} days instead of {d['max_runtime_factor']}x")
    return max_runtime, warnings


def _layout_warnings(run: RunSpec, catalog: dict, planner: LayoutPlanner, options: list[Option], best: Option,
                     dims: ModelDims | None) -> list[str]:
    """What the memory check could not count, and nodes the run asked for that the model does not need."""
    c, warnings = run.compute, []
    if dims is None:
        warnings.append("model.parameters only: activations, logits and gathered units are not in the memory check "
                        "(give model.config or model.source for a plan that counts them)")
    if c.instance_count and c.instance_count > 1 and not c.target_hours:
        smaller = [o for o in options if o.count < c.instance_count]
        if not smaller and any(planner.fit(lay) for lay in layouts(best.instance_type,
                                                               catalog["instances"][best.instance_type], 1)):
            warnings.append(f"compute.instance_count={c.instance_count}: the model fits one {best.instance_type}; "
                            "the extra nodes add speed and cost, not capacity it needs")
    return warnings


def _batch_warnings(run: RunSpec, options: list[Option], best: Option, per_rank: int, tokens: float) -> list[str]:
    """A warning when the chosen layout's samples per optimizer step differ from what the run's training.micro_batch
    x training.grad_accum give on the fewest GPUs it fits (the run's own layout when it names one): every GPU adds
    its samples to the step, so more GPUs mean fewer, larger optimizer steps at the same training.lr (a new user's
    deadline of 0.5 h chose 64 GPUs: 1024 samples per step instead of 16, 64x fewer steps, without a word)."""
    c, t, seq = run.compute, run.training, run.data.seq_len
    price_of = (lambda o: o.spot) if c.spot else (lambda o: o.on_demand)
    least = min(options, key=lambda o: (o.fit.layout.world, price_of(o)))
    world, fewest = best.fit.layout.world, least.fit.layout.world
    if world == fewest:
        return []
    planned, written = world * per_rank, fewest * per_rank
    if c.deadline_s is not None and not c.target_hours:
        why, later = (f"chosen to meet compute.deadline_hours={deadline_hours_text(c.deadline_s)}",
                      " with a later compute.deadline_hours")
    elif c.target_hours:
        why, later = f"chosen for compute.target_hours={c.target_hours:g}", " without compute.target_hours"
    else:
        why, later = "the cheapest layout", ""
    keep = f"set compute.instance_type={least.instance_type} and compute.instance_count={least.count}{later}"
    if (per_rank * fewest) % world == 0:
        wanted = per_rank * fewest // world
        mb = math.gcd(wanted, t.micro_batch)
        keep += (f", or lower the samples per GPU to {wanted} on this layout (training.micro_batch={mb}, "
                 f"training.grad_accum={wanted // mb})")
    else:
        keep += f"; on {world} GPUs no whole number of samples per GPU gives {written} per step"
    gpus = "one GPU" if fewest == 1 else f"{fewest} GPUs"
    steps, steps_written = planned_steps(tokens, planned, seq), planned_steps(tokens, written, seq)
    return [f"the batch is {planned / written:g}x the run's: {planned} samples per optimizer step on {world} GPUs "
            f"({best.count} x {best.instance_type}, {why}), where the run's training.micro_batch={t.micro_batch} x "
            f"training.grad_accum={t.grad_accum} ({per_rank} per GPU) give {written} on the fewest GPUs that fit "
            f"({gpus}, {least.count} x {least.instance_type}): {steps:,} optimizer steps instead of "
            f"{steps_written:,}, and training.lr={show(t.lr)} is not scaled for it; to keep "
            f"the run's batch, {keep}"]


def _build(run: RunSpec, catalog: dict, work: _Work, best: Option, per_rank: int, utilization: tuple[float, str],
           max_runtime: int, seg: SegmentPlan, advice: list[str], warnings: list[str],
           base_name: str | None = None) -> Estimate:
    """The Estimate of the chosen option: MaxRuntime is the first segment's, MaxWait follows it unless the run
    gives one, the cost is the segment chain's when the cap carries it, the run's optimizer steps, and the
    trainer's hyperparameters (checked against CreateTrainingJob's limits)."""
    c, d, fit = run.compute, catalog["defaults"], best.fit
    # each market's figure as the chain bills a job (its start with the trainer's start and the restore, its end):
    # the other market's too (a spot run showed on-demand $0.62 where the same run with spot=false showed $0.74)
    extra_s = max(0.0, job_start_s(seg) + JOB_END_S - startup_seconds(d)) if seg.overhead_seconds else 0.0
    cost = {"on_demand": round(best.on_demand * (1 + extra_s / best.wall), 2),
            "spot": round(best.spot * (1 + extra_s / (best.wall + best.overhead)), 2)}
    # the chain's expected bill: at this cap, or (refused) with no cap binding, the figure the refusal quotes
    chain_cost = seg.spot_cost_usd if seg.fits else uncapped_cost_usd(seg)
    chained = None  # the market whose figure is the chain's (its periodic saves counted: `segment_plan`)
    if chain_cost is not None and math.isfinite(chain_cost):
        chained = "spot" if c.spot else "on_demand"
        cost[chained] = round(chain_cost, 2)
    cost = with_periodic_saves(cost, run, catalog, best, work.ckpt_bytes, chained=chained)
    max_runtime = seg.first_max_runtime_seconds or max_runtime
    # MaxWait follows the first segment's MaxRuntime; the user's stands as given
    max_wait = int(c.max_wait_hours * 3600) if c.max_wait_hours is not None else \
        max_runtime + int(c.accepted_delay_hours * 3600)
    est = Estimate(
        parameters=work.total, trainable_parameters=work.trainable, tokens=work.tokens, training_flops=work.flops,
        training_state_bytes=work.state, gpu_hours=best.train_seconds * fit.layout.world / 3600,
        instance_type=best.instance_type, instance_count=best.count, utilization=utilization[0],
        wall_seconds=best.wall, expected_interruptions=best.interruptions,
        expected_overhead_seconds=best.overhead, max_runtime_seconds=max_runtime, max_wait_seconds=max_wait,
        checkpoint_bytes=work.ckpt_bytes, notice_upload_gb_per_s=work.ckpt_bytes / StopNotice.UPLOAD_S / 1e9,
        upload_gb_per_s_available=best.upload_available, checkpoint_policy=best.policy,
        checkpoint_interval_s=max(1, round(best.interval_s)), interruptions_per_hour=best.rate,
        cost_usd=cost, spot=c.spot, sharding=fit.layout.sharding, shard_group_nodes=fit.layout.group_nodes,
        micro_batch=fit.micro_batch, grad_accum=fit.grad_accum,
        written_batch={"micro_batch": run.training.micro_batch, "grad_accum": run.training.grad_accum},
        activation_checkpointing=fit.activation_checkpointing,
        global_batch_samples=fit.layout.world * per_rank,
        planned_steps=planned_steps(work.tokens, fit.layout.world * per_rank, run.data.seq_len),
        memory_per_gpu={"state": fit.memory.state, "gathered": fit.memory.gathered,
                        "activations": fit.memory.activations, "logits": fit.memory.logits,
                        "total": fit.memory.total, "usable": int(fit.usable),
                        "allowance": int(d["memory_allowance_gb"] * 1e9)},
        seconds_per_micro_batch={"compute": best.compute_s, "communication": best.comm_s},
        advice=advice, warnings=warnings, utilization_source=utilization[1],
        evaluation_seconds=best.eval_seconds, segments=seg,
    )
    return replace(est, hyperparameters=hyperparameters(run, est, base_name))


CAP_FAR_OVER = 100  # a cap this many times the run's on-demand bill as one job is named as probably not meant


def _cap_far_over(run: RunSpec, est: Estimate) -> list[str]:
    """A warning when the cap is far above anything the run can bill (a new user's $5,000,000 for a $0.26 run was
    accepted without a word): CAP_FAR_OVER times its on-demand bill as one uninterrupted job, the figure named
    against the estimate's own."""
    on_demand = est.cost_usd["on_demand"]
    if not (on_demand > 0 and run.max_usd > CAP_FAR_OVER * on_demand):
        return []
    market = "spot" if run.compute.spot else "on_demand"
    return [f"budget.max_usd={usd(run.max_usd)} is {run.max_usd / on_demand:,.0f}x the run's on-demand bill as one "
            f"uninterrupted job ({usd(on_demand)}; estimated {usd(est.cost_usd[market])} "
            f"{market.replace('_', '-')}): a cap that far above the run bounds no mistake (a longer run than "
            "planned, a stuck job); the cap to set is the spot policy's last line"]


def _lora_alternative(run: RunSpec, catalog: dict, model_config: dict | None, data_tokens: int | None,
                      recorded_rates: dict[str, float] | None) -> str:
    """Advice for a full fine-tune over budget: what LoRA (rank 16, all linear layers) would cost."""
    generic = ("a LoRA fine-tune (training.method=lora) trains and checkpoints a small fraction of the parameters "
               "and costs less")
    if run.model.parameters is not None:
        return generic
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


def with_periodic_saves(cost: dict, run: RunSpec, catalog: dict, best: Option, ckpt_bytes: int,
                        chained: str | None = None) -> dict:
    """Both markets' figures with the periodic saves of a layout that saves on a schedule (checkpoint policy
    periodic: the stop notice cannot carry its checkpoint), as the spot policy's simulation bills them
    (spotrun/planner/options.py `periodic_saves_seconds`): the cost row said on-demand $2,967.51 where the policy
    table's on_demand row, the same run, said $2,977.32 (a new user's 70B LoRA: 944 saves of 1 s in 78.7 h).
    `chained`: the market whose figure is the chain's (`segment_plan` counts the saves in its work already). A
    layout that saves on the notice is simulated without its insurance saves, and priced so."""
    saves = periodic_saves_seconds(catalog, best, ckpt_bytes)
    if not saves:
        return cost
    c, family = run.compute, best.instance_type.split(".")[1]
    per_s = catalog["instances"][best.instance_type]["on_demand_usd_per_hour"] * best.count / 3600
    discount = c.spot_discount if c.spot_discount is not None else catalog["families"][family]["spot_discount"]
    added = {"on_demand": saves * per_s, "spot": saves * per_s * (1 - discount)}
    return {**cost, **{market: round(cost[market] + added[market], 2) for market in added if market != chained}}


def spot_view_cost(run: RunSpec, catalog: dict, work: _Work, best: Option,
                   recorded_rates: dict[str, float] | None) -> tuple[float, int]:
    """A compute.spot=false run's spot figure: its layout priced as the same run with compute.spot=true plans it (its
    interruption rate, checkpoint interval, expected interruptions, chain of jobs at the cap and periodic saves).
    The on-demand option has no interruptions: the cost row said 'spot about $145.13 (one job with the expected
    interruptions)' where the spot run on that layout said $147.13 (a new user's 8B). With the jobs of that chain,
    which the cost row names (a 70B LoRA's $1,054.43 was labelled one job, where it was the chain of 2 at its cap)."""
    spot_run = replace(run, compute=replace(run.compute, spot=True))
    d = catalog["defaults"]
    step = best.fit.grad_accum * step_seconds(best.compute_s, best.comm_s, d["comm_overlap_fraction"])
    rate = interruption_rate(spot_run, catalog, best.instance_type, recorded_rates)
    spot = replace(price_option(spot_run, catalog, best.instance_type, best.count, best.train_seconds,
                                work.ckpt_bytes, rate, step),
                   fit=best.fit, train_seconds=best.train_seconds, compute_s=best.compute_s, comm_s=best.comm_s,
                   eval_seconds=best.eval_seconds)
    try:
        max_runtime, _ = _limits(spot_run, d, spot)
    except EstimateRefused:  # a spot run would be refused (28 days): the one job with its interruptions
        return round(spot.spot, 2), 1
    seg = segment_plan(spot_run, catalog, spot, work.ckpt_bytes, work.total, max_runtime)
    chain = seg.spot_cost_usd if seg.fits else uncapped_cost_usd(seg)
    if chain is None or not math.isfinite(chain):
        return with_periodic_saves({"on_demand": 0.0, "spot": round(spot.spot, 2)}, spot_run, catalog, spot,
                                   work.ckpt_bytes)["spot"], 1
    # its periodic saves in the chain's work (`segment_plan`)
    return round(chain, 2), seg.segments if seg.fits else segments_at(seg, math.inf)
