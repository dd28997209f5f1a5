"""The estimate the planner returns (`Estimate`; spotrun/planner/estimate.py builds it) and what it becomes: the
settings the trainer is sent (`trainer_settings`, spotrun/settings/'s tree) as hyperparameters within
CreateTrainingJob's limits (`hyperparameters`, `check_hyperparameters`), the run's optimizer steps
(`planned_steps`) and the text `spotrun estimate` prints.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, is_dataclass, replace
from typing import Any

from ..contract.spec import (
    HYPERPARAMETER_KEY_MAX,
    HYPERPARAMETER_VALUE_MAX,
    HYPERPARAMETERS_MAX,
    RunSpec,
    RunValidationError,
    deadline_hours_text,
)
from ..seams import SegmentPlan, SpotPolicy, StopNotice, section_json
from ..settings.sections import EvalConfig, ExportConfig, TrackingConfig
from ..settings.tree import TrainConfig
from ..settings.wire import flatten, leaves, parse
from .catalog import hours_text, usd
from .options import periodic_saves_s
from .segments import JOB_END_S, job_start_s, segment_seconds, speed_margin

# spotrun/settings/sections.py ModelConfig.source: the base an exported adapter names
MODEL_SOURCE_PATH = "model.source"


@dataclass(frozen=True)
class Estimate:
    """The planner's answer for one run; a stage that adds to it (the spot policy) makes a new one."""

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
    checkpoint_interval_s: int
    interruptions_per_hour: float
    cost_usd: dict
    spot: bool
    sharding: str = "full"
    shard_group_nodes: int = 1
    micro_batch: int = 1
    grad_accum: int = 1
    # the run's training.micro_batch and grad_accum as written ({} when not known): the batch row names them when
    # the planner changed them (the largest micro-batch that fits, the same samples per GPU)
    written_batch: dict = field(default_factory=dict)
    activation_checkpointing: bool = False
    global_batch_samples: int = 1
    memory_per_gpu: dict = field(default_factory=dict)
    seconds_per_micro_batch: dict = field(default_factory=dict)
    advice: list[str] = field(default_factory=list)
    spot_policy: SpotPolicy | None = None  # spotrun/policy/choose.py: the policy and its odds (the policy stage)
    warnings: list[str] = field(default_factory=list)
    hyperparameters: dict[str, str] = field(default_factory=dict)
    utilization_source: str = "catalog default"
    evaluation_seconds: float = 0.0  # validation forwards over the run, inside wall_seconds (evaluation_seconds())
    segments: SegmentPlan | None = None  # how the cap holds (spotrun/planner/segments.py); estimate() sets it
    # optimizer steps of the whole run (`planned_steps`); the plan carries them, the printed estimate does not
    planned_steps: int = 1
    # the mean wait for spot capacity the policy's traces are drawn with, and where it came from (recorded, or
    # checkpoint.mean_wait_hours); None: the availability model's at the interruption rate (and not printed)
    mean_wait_seconds: float | None = None
    mean_wait_source: str = ""
    # a compute.spot=false run: the jobs of the chain its spot figure (`cost_usd.spot`) is the bill of, the same run
    # on managed spot at this cap (spotrun/planner/estimate.py `spot_view_cost`); None for a spot run
    spot_figure_jobs: int | None = None

    def to_json(self) -> dict:
        out = {**asdict(self), "spot_policy": section_json(self.spot_policy)}
        del out["planned_steps"]  # the plan's field (Plan.planned_steps), not one of the estimate's figures
        if self.mean_wait_seconds is None:  # the model's: the estimate reads as it did before waits were recorded
            del out["mean_wait_seconds"], out["mean_wait_source"]
        if not self.spot:  # an on-demand job has no MaxWait (the text says so): no figure for one
            del out["max_wait_seconds"]
        else:  # the planner's own spot figure: its chain is `segments`'
            del out["spot_figure_jobs"]
        return out


def planned_steps(tokens: float, global_batch_samples: int, seq_len: int) -> int:
    """Optimizer steps of the whole run at `seq_len` tokens a sample (data.seq_len): the plan's `planned_steps`, in
    which the guard reads committed progress (spotrun/policy/decision.py `committed_progress_s`)."""
    return max(1, math.ceil(tokens / (global_batch_samples * seq_len)))


def hyperparameters(run: RunSpec, est: Estimate, base_name: str | None = None) -> dict[str, str]:
    """What the trainer is sent (`trainer_settings`), flattened into CreateTrainingJob's HyperParameters and checked
    against its limits (`check_hyperparameters`). `base_name`: the name an exported adapter gives its base model
    (a hub model's hub name, which from_pretrained takes, rather than its copy's place), under `model.source`."""
    hyper = flatten(trainer_settings(run, est))
    if base_name:
        hyper = {**hyper, MODEL_SOURCE_PATH: base_name}
    check_hyperparameters(hyper)
    return hyper


def trainer_settings(run: RunSpec, est: Estimate) -> TrainConfig:
    """What the trainer is sent (spotrun/settings/, flattened into the plan's hyperparameters): every setting the
    run holds under the trainer's name (`training.lr`, `data.seq_len`, `checkpoint.keep`, `eval.*`, `tracking.*`),
    then the planner's choices, in seconds. The launcher adds the channels' paths and the hosts."""
    given = parse(same_named(run))
    return replace(
        given,
        model=replace(given.model, activation_checkpointing=est.activation_checkpointing,
                      # a pretrained model's config comes with its weights, in the model channel
                      config=given.model.config if run.model.init == "random" else {}),
        training=replace(given.training, micro_batch=est.micro_batch, grad_accum=est.grad_accum),
        checkpoint=replace(given.checkpoint, interval_s=est.checkpoint_interval_s),
        sharding=replace(given.sharding, mode=est.sharding, group_nodes=est.shard_group_nodes),
        # the trainer evaluates, and can export the best weights, only with validation data
        eval=given.eval if run.data.has_validation else EvalConfig(),
        export=given.export if run.data.has_validation else ExportConfig(merge_lora=given.export.merge_lora),
        tracking=_tracking(run, given.tracking), segment_seconds=first_segment_seconds(est))


def check_hyperparameters(hyper: dict[str, str]) -> None:
    """CreateTrainingJob's limits on HyperParameters (botocore's service model): count, key and value lengths. A
    key is a dotted path of the settings tree, which is the run field's where both mean the same (model.config)."""
    if len(hyper) > HYPERPARAMETERS_MAX:
        raise RunValidationError("training", len(hyper), f"at most {HYPERPARAMETERS_MAX} hyperparameters")
    for key, value in hyper.items():
        if not isinstance(value, str) or len(key) > HYPERPARAMETER_KEY_MAX or len(value) > HYPERPARAMETER_VALUE_MAX:
            raise RunValidationError(key, value, f"a hyperparameter string of at most {HYPERPARAMETER_VALUE_MAX:,} "
                                     f"characters (this one has {len(str(value)):,})")


def same_named(run: RunSpec) -> dict[str, Any]:
    """{dotted path: the run's value} of every leaf of the settings tree that the run holds at the same attribute
    path (after the contract, which converts units: `checkpoint.interval_s`), where the run gives one."""
    out = {}
    for leaf in leaves():
        value = leaf.of(run)
        if value is not None and not is_dataclass(value):
            # a list of names travels as one comma-separated string (LoraConfig.target_modules)
            out[leaf.key] = ",".join(value) if isinstance(value, tuple) else value
    return out


def _tracking(run: RunSpec, given: TrackingConfig) -> TrackingConfig:
    """The run's tracking settings (MLflow's experiment by default the run's name); none when the run names neither
    an MLflow server nor a W&B project, and then the trainer imports no tracking library and opens no socket."""
    if not given.mlflow_uri and not given.wandb_project:
        return TrackingConfig()
    experiment = run.tracking.experiment or run.name if given.mlflow_uri else TrackingConfig.experiment
    return replace(given, experiment=experiment)


def checkpoint_upload_seconds(est: Estimate) -> float:
    """The plan's `checkpoint_upload_seconds` (the save the guard's chain counts, to the tenth of a second): the
    checkpoint at the upload rate available, or the notice's upload time without one."""
    rate = est.upload_gb_per_s_available
    return round(est.checkpoint_bytes / (rate * 1e9), 1) if rate else float(StopNotice.UPLOAD_S)


def guard_seconds_per_step(est: Estimate, startup_s: float) -> float:
    """The plan's `seconds_per_step`: the planned wall time with the expected interruptions and a periodic layout's
    saves, less one startup (`startup_s`), over the planned steps (the guard's pace: its `work_left`), to six
    significant digits (a tiny model's step is well under a millisecond). The saves as the chain of jobs counts
    them (spotrun/planner/options.py `periodic_saves_seconds`): the guard's chain from a checkpoint is the
    planner's, which the refusal checked (without them it went on with a chain the saves do not fit)."""
    saves = 0.0
    if est.checkpoint_policy == "periodic" and est.upload_gb_per_s_available:
        saves = periodic_saves_s(est.wall_seconds - startup_s + JOB_END_S, est.checkpoint_interval_s,
                                 est.checkpoint_bytes / (est.upload_gb_per_s_available * 1e9))
    work = est.wall_seconds + est.expected_overhead_seconds + saves - startup_s
    return float(f"{work / est.planned_steps:.6g}")


def first_segment_seconds(est: Estimate) -> int:
    """The first job's trainer budget: save and exit before its MaxRuntime (spotrun/planner/segments.py)."""
    save_s = est.checkpoint_bytes / (est.upload_gb_per_s_available * 1e9) if est.upload_gb_per_s_available else 0
    return segment_seconds(est.max_runtime_seconds, startup_s=est.segments.overhead_seconds if est.segments else 0.0,
                           save_s=save_s)


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
        ("batch", f"micro_batch {est.micro_batch} x grad_accum {est.grad_accum} per GPU{_written_text(est)}, "
                  f"{est.global_batch_samples} sample{'' if est.global_batch_samples == 1 else 's'} per step, "
                  "activation checkpointing "
                  f"{'on' if est.activation_checkpointing else 'off'}"),
        ("memory per GPU", _memory_text(est.memory_per_gpu)),
        ("wall time", _wall_text(est)),
        ("MaxRuntime / MaxWait", f"{est.max_runtime_seconds:,} s / "
                                 + (f"{est.max_wait_seconds:,} s" if est.spot else
                                    "none (compute.spot=false: an on-demand job has no MaxWait)")),
        ("checkpoint", f"{est.checkpoint_bytes / 1e9:,.2f} GB, {est.checkpoint_policy}, every "
                       f"{est.checkpoint_interval_s / 60:.1f} min"),
        ("notice upload needed", f"{est.notice_upload_gb_per_s:.3f} GB/s (available "
                                 f"{est.upload_gb_per_s_available:.2f} GB/s)"),
        ("cost", _cost_text(est)),
        ("cap", est.segments.line if est.segments else ""),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    cap_line = est.segments.line if est.segments else None  # also the advice's (JSON): printed once
    lines += [f"advice: {a}" for a in est.advice if a != cap_line] + [f"warning: {w}" for w in est.warnings]
    return "\n".join(lines)


def _written_text(est: Estimate) -> str:
    """The batch row's note when the planner changed the run's micro_batch x grad_accum (keeping their product)."""
    w = est.written_batch
    if not w or (w["micro_batch"], w["grad_accum"]) == (est.micro_batch, est.grad_accum):
        return ""
    return f" (the run wrote {w['micro_batch']} x {w['grad_accum']}; the largest micro_batch that fits)"


def _wall_text(est: Estimate) -> str:
    """The wall time row: the layout's (the catalog's startup and the training), the expected interruptions, and
    one uninterrupted job as the chain bills it (its start with the trainer's start and the reads, its end): what
    the deadline check, the cost row and the simulation go by."""
    text = (f"{hours_text(est.wall_seconds)} (+{hours_text(est.expected_overhead_seconds)} expected from "
            f"{est.expected_interruptions:.2f} interruptions)")
    seg = est.segments
    if seg and seg.overhead_seconds:
        one_job = job_start_s(seg) + seg.work_seconds - est.expected_overhead_seconds + JOB_END_S
        text += f"; one uninterrupted job bills {hours_text(one_job)} with its start and end"
    return text


def _chosen_row(section: SpotPolicy | None) -> dict | None:
    """The chosen spot policy's simulated row (None without a policy section)."""
    return next((r for r in (section.policies if section else []) if r["label"] == section.chosen), None)


def _chosen_cost_text(section: SpotPolicy | None) -> str:
    """The chosen spot policy's simulated bill, 'mean $X, P95 $Y' and its notes: a mean above its P95, and the runs
    that do not finish ('' without a policy section)."""
    row = _chosen_row(section)
    if row is None:
        return ""
    # a mean above the P95 is real, not an error: the costliest 5% of the traces pull the mean up (a new user read
    # 'mean $0.057, P95 $0.056' as a bug)
    # a new user read 'mean $0.26, P95 $0.26 (the mean above the P95 ...)': said only where the printed cents
    # differ, and a missed deadline named only where the run has one
    missed = " or a missed deadline" if row.get("p_deadline") is not None else ""
    tail = (f" (the mean above the P95: the costliest 5% of the traces, a long wait{missed}, pull it up)"
            if usd(row["mean_usd"]) != usd(row["p95_usd"]) and row["mean_usd"] > row["p95_usd"] else "")
    fallback = bool(getattr(section, "sim_plan", {}).get("on_demand_fallback", True))
    return f"mean {usd(row['mean_usd'])}, P95 {usd(row['p95_usd'])}{tail}" + unfinished_text(
        row, fallback, getattr(section, "maxwait_fixes", None))


def maxwait_fix_text(fixes: list | None, now: float | None = None) -> str:
    """What finishes the runs that waited out MaxWait with no spot capacity (no on-demand fallback): each remedy the
    estimate simulated with its own traces and policy, with the share of runs that finish there
    (`SpotPolicy.maxwait_fixes`, spotrun/policy/choose.py `maxwait_fixes`); the one text the cost line, the warnings
    and `spotrun simulate` say. MaxWait = MaxRuntime + the accepted delay, and MaxRuntime grows with the cap up to the
    planner's limit for one job: 'a larger cap does not' was false below it (a new user's mistral-7b LoRA with 2 h of
    accepted delay finished 84.2% / 91.0% / 97.8% at $20 / $40 / $80). Without `fixes` (none simulated) the remedies
    are named without shares. `now`: the share that finishes as the run is (on the same traces), which a remedy that
    finishes no more is said against (a 28-day run with a 40-day deadline: 128 h of accepted delay finished 70.7%
    against 91.2% with its 24 h)."""
    if not fixes:
        return ("compute.on_demand_fallback=true finishes them on on-demand; a longer compute.accepted_delay_hours "
                "lets them wait longer, as does a larger cap where it lengthens the jobs' MaxRuntime (MaxWait is "
                "MaxRuntime plus the accepted delay)")
    said = []
    for fix in fixes:
        setting, value, share = fix["setting"], fix.get("value"), fix.get("p_finished")
        finishes = "" if share is None else f"finishes {share:.1%}" + (
            ", no more than as the run is" if now is not None and share <= now + 1e-9 else "")
        if setting == "compute.on_demand_fallback":
            said.append(f"compute.on_demand_fallback=true {finishes} (on on-demand after MaxWait)")
        elif setting in ("compute.accepted_delay_hours", "compute.max_wait_hours"):
            said.append(f"{setting}={value:g} (the longest wait for capacity on the traces it draws) {finishes}")
        elif setting == "budget.max_usd" and value is not None:
            said.append(f"budget.max_usd={usd(value)} {finishes} (from that cap the job's MaxRuntime, so its "
                        "MaxWait, is the planner's limit for one job: a larger cap lengthens it no more)")
        elif setting == "budget.max_usd":
            said.append(f"a larger cap does not (from {usd(fix['from_usd'])}, under this cap, the job's "
                        "MaxRuntime, so its MaxWait, is already the planner's limit for one job)")
    return "simulated as the estimate simulates the run, its trace model and chosen policy: " + "; ".join(said)


# why runs end at the longest MaxRuntime with a cap far from binding, and what to do (a new user's 70B at a $5,000
# cap: "maxwait_fallback (periodic) finishes on 99.7% (0.3% ran to the longest MaxRuntime)" and nothing else): no
# bug in the chain's MaxRuntime, the cap or SageMaker's 28 days: the one job's MaxRuntime is the planner's limit
# (spotrun/planner/estimate.py `_limits`), and the guard ends a run whose job reaches it (spotrun/pipeline/guard.py)
LONGEST_MAX_RUNTIME_WHY = ("a spot job's MaxRuntime counts every billed second, its restarts and the work its "
                           "interruptions lost, so the runs interrupted the most reach the longest, the planner's "
                           "limit for one job (set from the expected wall time, not from the cap: a larger cap does "
                           "not lift it), and the guard ends them (Failed) with their newest checkpoint")
LONGEST_MAX_RUNTIME_FIX = ("checkpoint.resume_from, naming the ended execution, continues such a run from that "
                           "checkpoint in a new execution; compute.spot=false is never interrupted")


def unfinished_text(row: dict, fallback: bool, fixes: list | None = None) -> str:
    """Why a policy's unfinished runs end, by their cause (`Summary.p_over_budget`): at the cap (OverBudget), which
    a larger cap finishes, or at MaxWait without spot capacity and no on-demand fallback, with what finishes them as
    simulated (`maxwait_fix_text`; a new user read 'the runs the cap ends' at a $50 cap for a $0.26 run whose runs
    ended at MaxWait); `fallback`: the run's compute.on_demand_fallback (or compute.spot=false); `fixes`: the
    section's `maxwait_fixes`."""
    if row["p_finished"] >= 1.0:
        return ""
    unfinished = 1.0 - row["p_finished"]
    at_cap = min(unfinished, row.get("p_over_budget", 0.0))
    causes = []
    if at_cap > 0:
        causes.append(f"{at_cap:.1%} ended at the cap (OverBudget: a larger budget.max_usd finishes them)")
    if unfinished - at_cap > 1e-9 and fallback:
        causes.append(f"{unfinished - at_cap:.1%} ran to the longest MaxRuntime unfinished ({LONGEST_MAX_RUNTIME_WHY}: "
                      f"{LONGEST_MAX_RUNTIME_FIX})")
    elif unfinished - at_cap > 1e-9:
        causes.append(f"{unfinished - at_cap:.1%} waited out MaxWait with no spot capacity "
                      f"({maxwait_fix_text(fixes, row['p_finished'])})")
    return (f"; {row['p_finished']:.1%} of the simulated runs finish: {' and '.join(causes)}; the mean and P95 "
            "count the unfinished runs at what they billed")


def _spot_figure_text(jobs: int) -> str:
    """What an on-demand run's spot figure is the bill of: one job, or the chain of jobs the same run on spot has at
    this cap (its MaxRuntime bounded at on-demand rates leaves room for less than the whole run)."""
    return ("one job with the expected interruptions" if jobs == 1 else
            f"a chain of {jobs} jobs at this cap, each one's start and end, the expected interruptions")


def _cost_text(est: Estimate) -> str:
    """The cost row. A spot run leads with the chosen spot policy's simulated mean and P95 (the bill the run gets as
    the cost guard executes that policy; a new user read the planner's 'spot $1,975.13 expected' as the bill of a
    run whose simulated mean was $2,510.54), then on-demand as one job, then the planner's expected bill (the chain
    of jobs at this cap, each job's start and end, the expected interruptions, no wait for capacity). An on-demand
    run: its bill, then what managed spot would cost on the same layout. What a cap should be is the spot policy's
    line."""
    seg = est.segments
    jobs = seg.segments if seg and seg.fits else 1
    planned = f"planned: {jobs} jobs at this cap, each one's start and end" if jobs > 1 else \
        "planned: one job, its start and end"
    if not est.spot:
        return (f"on-demand {usd(est.cost_usd['on_demand'])} ({planned}; the bill to expect, the cap to set is the "
                f"spot policy's last line) / spot about {usd(est.cost_usd['spot'])} (the same layout on managed spot: "
                f"{_spot_figure_text(est.spot_figure_jobs or 1)}, no wait for capacity)")
    on_demand = f"on-demand {usd(est.cost_usd['on_demand'])} (one uninterrupted job)"
    if _chosen_row(est.spot_policy) is None:
        return f"spot {usd(est.cost_usd['spot'])} expected ({planned}, the expected interruptions) / {on_demand}"
    expected = (f"the planner's expected spot bill {usd(est.cost_usd['spot'])} ({planned}, the expected "
                "interruptions; no wait for capacity)")
    if est.spot_policy.policy == "on_demand":  # its bill is on-demand's: 'spot as ... runs it' misnamed it (a trial)
        return (f"on-demand throughout, as the chosen spot policy runs it ({est.spot_policy.chosen}, simulated: no "
                f"spot capacity taken): {_chosen_cost_text(est.spot_policy)} / {on_demand}; {expected}, which the "
                "chosen policy does not take")
    return (f"spot as the chosen spot policy runs it ({est.spot_policy.chosen}, simulated): "
            f"{_chosen_cost_text(est.spot_policy)} / {on_demand}; {expected}")


SPEED_MARGIN_PRICED = 0.10  # the slower trainer the speed line names a cap for (no measured spread to size it by)


def speed_margin_note(est: Estimate, there: Estimate | None = None) -> dict | None:
    """Where the run's jobs bill on-demand throughout at the cap to set (compute.spot=false, or on_demand the policy
    proven at the cap to set, `cap_to_set_row`, else the chosen one): how much slower than planned the trainer may
    train before the cap to set ends the run (`speed_margin`), what the planned speed rests on, and the cap that
    carries a trainer SPEED_MARGIN_PRICED slower, and with a deadline whether that slower trainer meets it (a cap
    carries it, a deadline may not: `deadline_slower_share`). A new user's on-demand caps to set left seconds
    (mistral-7b LoRA at $31.70: MaxRuntime 48,942 s for a 13.59 h bill; a 70B LoRA under a second of 78.7 h, its
    speed the catalog's utilization 0.25). None for a spot policy (its cap to set holds the P95 of simulated
    interruptions), without a cap to set, or where the cap to set runs another layout than `est`'s and `there`, the
    estimate on that layout (`cap_to_set_layout`), is not given. The planner carries no measured spread of its speed
    (a recorded MFU is the median of earlier runs), so the cap to set adds none."""
    section = est.spot_policy
    cap = section and (section.cap_to_set_usd or section.deadline_cap_usd or section.p95_finish_cap_usd)
    if not cap or est.segments is None:
        return None
    proven = section.cap_to_set_row or next((r for r in section.policies if r["label"] == section.chosen), None)
    policy = proven["policy"] if proven else section.policy
    if est.spot and policy != "on_demand":
        return None
    if section.cap_to_set_layout:  # the cap to set's figures are that layout's
        if there is None or f"{there.instance_count} x {there.instance_type}" != section.cap_to_set_layout or \
                there.segments is None:
            return None
        est = there
    return _speed_margin_at(est, cap, proven, section.sim_plan.get("deadline_s"))


def _speed_margin_at(est: Estimate, cap: float, proven: dict | None, deadline_s: float | None) -> dict:
    """`speed_margin_note`'s figures at `cap` on `est`'s layout; `proven`: the policy row simulated at it (its wall
    time with the deadline, `deadline_s`)."""
    seg = est.segments
    share = speed_margin(seg, cap, spot=False)
    low_c = math.floor(cap * 100)  # the least cap, in cents, that carries a trainer SPEED_MARGIN_PRICED slower
    high_c = max(low_c + 1, math.ceil(cap * (1 + 2 * SPEED_MARGIN_PRICED) * 100) + 100)
    while speed_margin(seg, high_c / 100, spot=False) < SPEED_MARGIN_PRICED:
        high_c *= 2
    while high_c - low_c > 1:
        mid = (low_c + high_c) // 2
        low_c, high_c = (mid, high_c) if speed_margin(seg, mid / 100, spot=False) < SPEED_MARGIN_PRICED else \
            (low_c, mid)
    roomy = high_c / 100
    seconds = share * seg.work_seconds
    # the deadline against the run at the cap to set (its simulated wall time, on-demand: no wait, no interruption)
    # with the training longer by a share: what share it allows (a cap carried a trainer 10% slower past it)
    wall_s = proven["p95_wall_h"] * 3600 if proven and deadline_s is not None and seg.work_seconds > 0 else None
    allowed = None if wall_s is None else (deadline_s - wall_s) / seg.work_seconds
    priced = (f"a cap of {usd(roomy)} carries a trainer {SPEED_MARGIN_PRICED:.0%} slower")
    if allowed is not None and allowed < SPEED_MARGIN_PRICED:
        hours = deadline_hours_text(deadline_s)
        priced += (f", which misses the {hours} h deadline at any cap: the run takes {hours_text(wall_s)} at the "
                   "planned speed, " + (f"so the deadline allows a trainer {allowed * 100:.2g}% slower "
                                        f"({allowed * seg.work_seconds:,.0f} s)" if allowed > 0 else
                                        "past the deadline already"))
    line = (f"  speed margin: at the cap to set ({usd(cap)}) the trainer may train {share * 100:.2g}% slower than "
            f"planned ({seconds:,.0f} s over {hours_text(seg.work_seconds)} of training); slower, its job's time "
            "(MaxRuntime, what the cap allows at on-demand rates) is up first: the trainer saves and exits "
            "unfinished, no next job fits in what the cap leaves, and the guard ends the run at the cap (OverBudget), "
            "about the cap billed, with its newest checkpoint (checkpoint.resume_from continues it under a larger "
            f"cap) and no model. The planned speed rests on utilization {est.utilization:g} "
            f"({est.utilization_source}), with no measured spread to add to the cap: {priced}")
    return {"cap_usd": cap, "slower_share": share, "slower_seconds": round(seconds, 1),
            "planned_training_seconds": round(seg.work_seconds, 1), "utilization": est.utilization,
            "utilization_source": est.utilization_source, "priced_slower_share": SPEED_MARGIN_PRICED,
            "cap_for_priced_usd": roomy,
            # with a deadline: how much slower the run may train and still meet it (null: no deadline), and whether
            # the priced slower trainer meets it
            "deadline_slower_share": None if allowed is None else round(allowed, 6),
            "priced_meets_deadline": None if allowed is None else allowed >= SPEED_MARGIN_PRICED,
            "line": line.strip()}
