"""The estimate the planner returns (`Estimate`; spotrun/planner/estimate.py builds it) and what it becomes: the
SageMaker hyperparameters the trainer image reads (names from spotrun.seams.Hyperparameter, parsed by
spotrun_trainer.config) and the text `spotrun estimate` prints.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..contract.spec import RunSpec
from ..pipeline.segments import segment_seconds
from ..seams import Hyperparameter
from .catalog import usd


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
    spot_policy: dict = field(default_factory=dict)  # spotrun/policy/choose.py: the policy and its odds
    warnings: list[str] = field(default_factory=list)
    hyperparameters: dict[str, str] = field(default_factory=dict)
    utilization_source: str = "catalog default"
    evaluation_seconds: float = 0.0  # validation forwards over the run, inside wall_seconds (evaluation_seconds())
    segments: dict = field(default_factory=dict)  # spotrun.pipeline.segments.SegmentPlan: how the cap holds

    def to_json(self) -> dict:
        return asdict(self)


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
        **_tracking_hyperparameters(run),
    }


def _tracking_hyperparameters(run: RunSpec) -> dict[str, str]:
    """The MLflow tracking server and experiment, and the W&B project, entity and API key secret's name
    (spotrun_trainer.config.TrackingConfig parses them); none when the run names neither, and then the trainer
    imports no tracking library and opens no socket."""
    t, out = run.tracking, {}
    if t.mlflow_uri:
        out = {Hyperparameter.TRACKING_MLFLOW_URI.value: t.mlflow_uri,
               Hyperparameter.TRACKING_EXPERIMENT.value: t.experiment or run.name}
    if t.wandb_project:
        out.update({Hyperparameter.TRACKING_WANDB_PROJECT.value: t.wandb_project,
                    Hyperparameter.TRACKING_WANDB_API_KEY_SECRET.value: t.wandb_api_key_secret,
                    **({Hyperparameter.TRACKING_WANDB_ENTITY.value: t.wandb_entity} if t.wandb_entity else {})})
    return out


def mlflow_config(run: RunSpec, execution: str) -> dict[str, str]:
    """CreateTrainingJob's MlflowConfig for a run naming a SageMaker AI MLflow tracking server by ARN: SageMaker
    then shows the job in that server's experiment (`tracking.experiment`, default the run's name) as a run named
    after the execution. {} for a plain MLflow URL or no server (only the container's logger, tracking.py)."""
    uri = run.tracking.mlflow_uri
    if not uri or not uri.startswith("arn:"):
        return {}
    return {"MlflowResourceArn": uri, "MlflowExperimentName": run.tracking.experiment or run.name,
            "MlflowRunName": execution}


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
    """The first job's trainer budget: save and exit before its MaxRuntime (spotrun/pipeline/segments.py)."""
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
        ("cost", f"spot {usd(est.cost_usd['spot'])} / on-demand {usd(est.cost_usd['on_demand'])}"),
        ("cap", est.segments.get("line", "")),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    lines += [f"advice: {a}" for a in est.advice] + [f"warning: {w}" for w in est.warnings]
    return "\n".join(lines)
