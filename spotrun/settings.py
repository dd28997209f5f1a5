"""The settings tree (a seam, stdlib only): what reaches the trainer, one dataclass per component.

`TrainConfig` is the trainer's configuration (spotrun_trainer imports it from here) and what the planner fills
(spotrun/planner/outputs.py `trainer_settings`). It travels as SageMaker hyperparameters generically: `flatten`
writes each leaf that differs from its default under its dotted path (`checkpoint.interval_seconds`), `parse` reads
them back (every value a string). Units are seconds: the run contract converts the user's minutes and hours once.

Each section validates its own values on construction; `TrainConfig.check_job` adds what a job needs beyond the
planned settings (the paths the launcher fills, the rules across sections), and the entry points (`from_dict`,
`from_hyperparameters`: the launcher, the CLI) apply it. Only they read SageMaker files or the environment.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping, get_type_hints

from .seams import METHODS, Method, StopNotice


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the field, the value and what is accepted."""


# Integers end up in C (torch, numpy, the data loader's arithmetic): anything wider than int64 is refused here
# rather than overflowing there.
INT_LIMIT = 2**63 - 1
# numpy's and most seeding helpers' range; the per-rank seeds (seed + 1 + rank) stay far inside torch's.
SEED_LIMIT = 2**32 - 1


def _require(cond: bool, name: str, value: Any, accepted: str) -> None:
    if not cond:
        raise ConfigError(f"{name}={short_repr(value)} is invalid: expected {accepted}")


def _require_finite(obj: Any, prefix: str) -> None:
    """Every float field is a finite number: `inf` and `nan` pass comparisons like `lr > 0` (or fail them with
    a misleading message) and then train to NaN."""
    for f in fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{prefix}{f.name}={value!r} is invalid: expected a finite number")


@dataclass(frozen=True)
class ModelConfig:
    """Which causal LM to train and how to shard it."""

    path: str = ""
    """Local directory of a Hugging Face model (the `model` channel). Empty: build from `config` instead."""
    source: str = ""
    """Where the base model came from (the run's model.source, e.g. an S3 URI): recorded in the export metadata
    so an adapter names the base it needs."""
    config: dict = field(default_factory=dict)
    """Inline HF config (must contain `model_type`) used when `path` is empty; weights are initialised from `seed`."""
    param_dtype: str = "auto"
    """FSDP2 MixedPrecisionPolicy param dtype: `auto` (bfloat16 on GPU, float32 on CPU), `bfloat16` or `float32`."""
    activation_checkpointing: bool = False
    """Recompute each decoder block in backward (HF's own, RNG-preserving, so exact with dropout)."""

    def __post_init__(self) -> None:
        _require(isinstance(self.config, dict), "model.config", self.config, "a JSON object")
        bad = _non_finite_path(self.config)
        if bad is not None:
            raise ConfigError(f"model.config.{bad[0]}={bad[1]!r} is invalid: expected a finite number")
        _require(self.param_dtype in ("auto", "bfloat16", "float32"), "model.param_dtype", self.param_dtype,
                 "one of auto, bfloat16, float32")


SHARDING_MODES = ("full", "hybrid")


@dataclass(frozen=True)
class ShardingConfig:
    """How FSDP2 spreads the training state over the ranks; the planner chooses (spotrun/planner/memory.py models
    both)."""

    mode: str = "full"
    """`full`: every parameter sharded over all ranks of all nodes (1-D mesh): the least memory per GPU, but every
    all-gather and reduce-scatter spans the nodes. `hybrid`: sharded within groups of `group_nodes` nodes and
    replicated across groups (2-D mesh): the per-layer collectives stay inside a group, and one gradient
    all-reduce per micro-batch crosses groups."""
    group_nodes: int = 1
    """hybrid only: nodes per shard group (must divide `nodes`); 1 keeps the shard group on one node's links."""
    nodes: int = 1
    """Nodes in the job; the launcher fills it from resourceconfig.json's hosts."""

    def __post_init__(self) -> None:
        _require(self.mode in SHARDING_MODES, "sharding.mode", self.mode, "full or hybrid")
        _require(self.nodes >= 1, "sharding.nodes", self.nodes, "an integer >= 1")
        _require(self.group_nodes >= 1, "sharding.group_nodes", self.group_nodes, "an integer >= 1")

    def mesh_shape(self, world: int) -> tuple[int, int]:
        """(replicas, ranks per shard group) for `world` ranks; replicas is 1 for full sharding."""
        _require(world % self.nodes == 0, "sharding.nodes", self.nodes,
                 f"a divisor of the world size {world} (every node runs the same number of ranks)")
        if self.mode == "full":
            return 1, world
        shard = world // self.nodes * self.group_nodes
        return world // shard, shard


@dataclass(frozen=True)
class DataConfig:
    """Where the prepared token shards are and how they are cut into samples."""

    path: str = ""
    """Directory with `index.json` and token shards written by `prepare`."""
    seq_len: int = 512
    """Tokens per training sample (samples are packed; documents are separated by EOS)."""
    validation_path: str = ""
    """Directory of prepared validation shards (the `validation` channel, or the `validation/` directory that
    `prepare --validation-fraction` writes beside the training shards). Empty: no evaluation."""

    def __post_init__(self) -> None:
        _require(self.seq_len >= 2, "data.seq_len", self.seq_len, "an integer >= 2")


@dataclass(frozen=True)
class OptimConfig:
    """AdamW with linear warmup then cosine decay to `min_lr_ratio * lr`."""

    lr: float = 2e-5
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.95
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    """Max global gradient norm; 0 disables clipping."""

    def __post_init__(self) -> None:
        _require_finite(self, "optim.")
        _require(self.lr > 0, "optim.lr", self.lr, "a positive float")
        _require(self.weight_decay >= 0, "optim.weight_decay", self.weight_decay, "a float >= 0")
        _require(0 <= self.beta1 < 1, "optim.beta1", self.beta1, "a float in [0, 1)")
        _require(0 <= self.beta2 < 1, "optim.beta2", self.beta2, "a float in [0, 1)")
        _require(self.warmup_steps >= 0, "optim.warmup_steps", self.warmup_steps, "an integer >= 0")
        _require(0 <= self.min_lr_ratio <= 1, "optim.min_lr_ratio", self.min_lr_ratio, "a float in [0, 1]")
        _require(self.grad_clip >= 0, "optim.grad_clip", self.grad_clip, "a float >= 0")


@dataclass(frozen=True)
class CheckpointConfig:
    """Where and how often to save; see checkpoint.py for the commit protocol."""

    dir: str = ""
    """Checkpoint directory (SageMaker: /opt/ml/checkpoints, mirrored to S3). Empty disables checkpoints."""
    interval_steps: int = 0
    """Save every N steps (0: off)."""
    interval_seconds: float = 0.0
    """Save when this many seconds passed since the last save (0: off). Ranks agree on it each step."""
    keep: int = 2
    """Newest verified checkpoints to keep (>= 2: the one being written never replaces the only good one)."""
    async_save: bool = True
    """Periodic saves run in the background on a dedicated gloo group; the save on a stop signal is synchronous."""
    resume: str = "auto"
    """`auto`: load the newest verified checkpoint, start fresh if none; `never`: always start fresh."""
    notice_seconds: float = float(StopNotice.NOTICE_S)
    """The stop notice SageMaker gives (SIGTERM to SIGKILL); a warning is logged when a save cannot fit in it."""

    def __post_init__(self) -> None:
        _require_finite(self, "checkpoint.")
        _require(self.interval_steps >= 0, "checkpoint.interval_steps", self.interval_steps, "an integer >= 0")
        _require(self.interval_seconds >= 0, "checkpoint.interval_seconds", self.interval_seconds, "a float >= 0")
        _require(self.keep >= 2, "checkpoint.keep", self.keep, "an integer >= 2")
        _require(self.resume in ("auto", "never"), "checkpoint.resume", self.resume, "auto or never")
        _require(self.notice_seconds > 0, "checkpoint.notice_seconds", self.notice_seconds, "a positive float")


@dataclass(frozen=True)
class EvalConfig:
    """Validation loss (see evaluate.py): before the first step (the base model's), on this schedule, at the end.

    Used when data.validation_path is set; the value is the mean next-token loss over every trained token of the
    validation set (or its first `max_batches` micro-batches), so it is the same after any resume."""

    every_steps: int = 0
    """Evaluate after every N optimizer steps (0: off)."""
    every_minutes: float = 0.0
    """Evaluate at the first log step after this many minutes since the last evaluation (0: off). Time-based
    evaluations land on different steps in a resumed run: use every_steps where the series must repeat."""
    max_batches: int = 0
    """Evaluate on the first N micro-batches (of `micro_batch` samples) of the validation set, whatever the
    number of ranks; 0: the whole set."""
    keep_best: bool = False
    """Keep the checkpoint with the lowest validation loss beside the newest `checkpoint.keep`."""
    samples: int = 3
    """After the export, greedy generations from the first N validation samples' prefixes, base model vs the
    exported one, in samples.json beside the model (samples.py); 0: none."""
    sample_prompt_tokens: int = 16
    """The prompt: each sample's first N tokens (at most data.seq_len)."""
    sample_new_tokens: int = 24
    """Tokens generated after each prompt (greedy, always exactly N)."""

    def __post_init__(self) -> None:
        _require_finite(self, "eval.")
        _require(self.every_steps >= 0, "eval.every_steps", self.every_steps, "an integer >= 0")
        _require(self.every_minutes >= 0, "eval.every_minutes", self.every_minutes, "a float >= 0")
        _require(self.max_batches >= 0, "eval.max_batches", self.max_batches, "an integer >= 0")
        _require(self.samples >= 0, "eval.samples", self.samples, "an integer >= 0")
        _require(self.sample_prompt_tokens >= 1, "eval.sample_prompt_tokens", self.sample_prompt_tokens,
                 "an integer >= 1")
        _require(self.sample_new_tokens >= 1, "eval.sample_new_tokens", self.sample_new_tokens, "an integer >= 1")


@dataclass(frozen=True)
class TrackingConfig:
    """Experiment tracking (tracking.py): rank 0 logs the run to MLflow when `mlflow_uri` is set and to W&B when
    `wandb_project` is (wandb_tracking.py; both at once when both are); neither, nothing is imported and nothing
    reaches the network."""

    mlflow_uri: str = ""
    """An http(s) URL of an MLflow tracking server, or a SageMaker AI MLflow tracking server's ARN (the
    sagemaker-mlflow plugin signs its requests with the job's role). Empty: no tracking."""
    experiment: str = "spotrun"
    """MLflow experiment the run is logged under (created when missing); the planner sends the run's name."""
    run_name: str = ""
    """MLflow run name (empty: MLflow's generated one)."""
    instance_type: str = ""
    """Filled by the launcher (resourceconfig.json): logged as a parameter."""
    instance_count: int = 1
    """Filled by the launcher (the job's hosts): logged as a parameter."""
    params: dict = field(default_factory=dict)
    """Filled by the launcher: the job's hyperparameters as SageMaker passed them, logged as parameters."""
    timeout_seconds: float = 5.0
    """Per request to the tracking server (no retries inside a request: the tracker retries on its own thread)."""
    close_seconds: float = 10.0
    """How long the end of a job waits for queued records to reach the server; a stop signal waits at most a
    third of it (the notice belongs to the checkpoint)."""
    wandb_project: str = ""
    """The W&B project the run is logged to (empty: no W&B)."""
    wandb_entity: str = ""
    """The W&B entity (user or team) of the project (empty: the API key's default entity)."""
    wandb_api_key_secret: str = ""
    """The Secrets Manager secret (name or ARN) holding the W&B API key, read by rank 0 with the job's role at the
    start: the key itself never travels in the hyperparameters."""

    def __post_init__(self) -> None:
        _require_finite(self, "tracking.")
        uri = self.mlflow_uri
        _require(not uri or uri.startswith(("http://", "https://", "arn:")), "tracking.mlflow_uri", uri,
                 "an http(s):// URL or a SageMaker AI MLflow tracking server ARN")
        _require(bool(self.experiment), "tracking.experiment", self.experiment, "a non-empty experiment name")
        _require(self.instance_count >= 1, "tracking.instance_count", self.instance_count, "an integer >= 1")
        _require(self.timeout_seconds > 0, "tracking.timeout_seconds", self.timeout_seconds, "a positive number")
        _require(self.close_seconds >= 0, "tracking.close_seconds", self.close_seconds, "a number >= 0")
        _require(not self.wandb_project or bool(self.wandb_api_key_secret), "tracking.wandb_api_key_secret",
                 self.wandb_api_key_secret, "the Secrets Manager secret holding the W&B API key (with wandb_project)")


_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")


@dataclass(frozen=True)
class LoraConfig:
    """LoRA adapters (PEFT) on the frozen base; used when `method` is `lora` (see lora.py).

    Lives here with every other component's config so the launcher validates it without importing torch or peft.
    """

    rank: int = 16
    """Adapter rank r: a targeted linear layer of shape (in, out) gains r * (in + out) trainable parameters."""
    alpha: float = 16.0
    """Scaling numerator: the adapter's output is multiplied by alpha / rank."""
    dropout: float = 0.0
    """Dropout on the adapter's input (per-rank RNG, restored on resume)."""
    target_modules: str = "all-linear"
    """`all-linear` (every linear layer of the blocks, not the output head) or comma-separated module names
    (`q_proj,v_proj`; a name matches every module whose name ends with it, as in PEFT)."""

    def __post_init__(self) -> None:
        _require(1 <= self.rank <= 4096, "lora.rank", self.rank, "an integer in [1, 4096]")
        _require(math.isfinite(self.alpha) and self.alpha > 0, "lora.alpha", self.alpha, "a positive finite number")
        _require(0 <= self.dropout < 1, "lora.dropout", self.dropout, "a float in [0, 1)")
        names = self.targets
        _require(names == "all-linear" or (bool(names) and all(_MODULE_NAME.match(n) for n in names)),
                 "lora.target_modules", self.target_modules,
                 "all-linear or comma-separated module names such as q_proj,v_proj")

    @property
    def targets(self) -> str | tuple[str, ...]:
        """`all-linear`, or the module names as a tuple."""
        text = self.target_modules.strip()
        if text == "all-linear":
            return text
        return tuple(n.strip() for n in text.split(",") if n.strip())


@dataclass(frozen=True)
class ExportConfig:
    """What the run leaves in output_dir (see export.py)."""

    dtype: str = "bfloat16"
    """Weights of an exported full model (full runs, and the merged LoRA model): `bfloat16` (half the bytes, what
    serving uses) or `float32` (the training precision). A LoRA adapter is always written in float32: it is small
    and trained in float32."""
    merge_lora: bool = False
    """LoRA runs: also write the base with the adapter merged in (a standalone model, `merged/`)."""
    weights: str = "last"
    """`last` (the final weights) or `best` (the kept checkpoint with the lowest validation loss: needs
    eval.keep_best); the choice and both losses go into the export metadata."""

    def __post_init__(self) -> None:
        _require(self.dtype in ("bfloat16", "float32"), "export.dtype", self.dtype, "bfloat16 or float32")
        _require(self.weights in ("last", "best"), "export.weights", self.weights, "last or best")


@dataclass(frozen=True)
class PerfConfig:
    """Speed settings for GPUs. Each `auto` resolves by device: on for CUDA, off on CPU (where the plain paths
    keep CPU runs bitwise reproducible); each can be forced on or off."""

    fused_optimizer: str = "auto"
    """AdamW's fused kernel (`fused=True`, one kernel for every parameter): auto (CUDA), on, off (foreach)."""
    loss: str = "auto"
    """`hf` (the model's own: full-vocabulary fp32 logits), `chunked` (see loss.py: one chunk of logits at a
    time), or auto (chunked on CUDA, hf on CPU)."""
    loss_chunk_tokens: int = 1024
    """Tokens per chunk of the chunked loss (its peak logits memory is chunk_tokens x vocab x 4 bytes)."""
    compile: str = "off"
    """torch.compile each decoder block before sharding (torchtitan's recipe): on, off, or auto (CUDA). Off by
    default: compilation adds minutes at every start, paid again on each spot restart."""
    prefetch_blocks: int = 0
    """FSDP2 explicit prefetch: all-gather the next N blocks' parameters ahead (forward) and the previous N
    (backward); 0 leaves FSDP2's implicit one-block prefetch. More overlap for more memory."""
    reshard_after_forward: bool = True
    """Free each block's gathered parameters after its forward (ZeRO-3); false keeps them until backward
    (ZeRO-2-like: no second all-gather, more memory)."""
    reduce_dtype: str = "float32"
    """Dtype of the gradient reduce-scatter: float32 (exact sums) or bfloat16 (half the traffic, rounding)."""

    def __post_init__(self) -> None:
        for name in ("fused_optimizer", "compile"):
            _require(getattr(self, name) in ("auto", "on", "off"), f"perf.{name}", getattr(self, name),
                     "one of auto, on, off")
        _require(self.loss in ("auto", "hf", "chunked"), "perf.loss", self.loss, "one of auto, hf, chunked")
        _require(self.loss_chunk_tokens >= 1, "perf.loss_chunk_tokens", self.loss_chunk_tokens, "an integer >= 1")
        _require(self.prefetch_blocks >= 0, "perf.prefetch_blocks", self.prefetch_blocks, "an integer >= 0")
        _require(self.reduce_dtype in ("float32", "bfloat16"), "perf.reduce_dtype", self.reduce_dtype,
                 "float32 or bfloat16")

    def resolved(self, device_type: str) -> "PerfConfig":
        """This config with every `auto` replaced by the choice for `device_type` (cuda or cpu)."""
        cuda = device_type == "cuda"
        on_off = "on" if cuda else "off"
        return dataclasses.replace(
            self, fused_optimizer=on_off if self.fused_optimizer == "auto" else self.fused_optimizer,
            compile=on_off if self.compile == "auto" else self.compile,
            loss=("chunked" if cuda else "hf") if self.loss == "auto" else self.loss)


@dataclass(frozen=True)
class TrainConfig:
    """Everything one training run needs; serialised to JSON by the launcher and read by every worker."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    sharding: ShardingConfig = field(default_factory=ShardingConfig)
    method: str = Method.FULL.value
    """`full` (every parameter trains) or `lora` (the base is frozen; adapters train: see `lora`)."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    perf: PerfConfig = field(default_factory=PerfConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    output_dir: str = ""
    """Where the exported HF model and metrics.json go (SageMaker: /opt/ml/model)."""
    micro_batch: int = 1
    """Samples per rank per forward/backward."""
    grad_accum: int = 1
    """Micro-batches per optimizer step."""
    max_steps: int = 0
    """Optimizer steps to run; 0 means `epochs` passes over the data."""
    epochs: float = 1.0
    seed: int = 0
    log_every: int = 10
    segment_seconds: float = 0.0
    """Seconds after the trainer's start at which it saves and exits (0: no limit): the end of one segment of a
    run whose job MaxRuntime the cost cap sets; the next job resumes from the checkpoint
    (spotrun/planner/segments.py)."""
    num_threads: int = 0
    """torch intra-op threads on CPU (0: leave torch's default). Fixed thread counts keep CPU runs bitwise stable."""
    deterministic: bool = False
    """torch.use_deterministic_algorithms(True): required for bitwise-exact resume checks."""
    memory_probe: bool = False
    """CPU: measure the second step's peak with torch's FSDPMemTracker (slower step) and log it beside the memory
    model's prediction. GPU runs always log torch.cuda.max_memory_allocated."""
    probe_logits_path: str = ""
    """If set, rank 0 writes the final sharded model's logits on the first sample here (export checks)."""

    def __post_init__(self) -> None:
        _require_finite(self, "")
        _require(0 <= self.seed <= SEED_LIMIT, "seed", self.seed, f"an integer in [0, {SEED_LIMIT}]")
        _require(self.micro_batch >= 1, "micro_batch", self.micro_batch, "an integer >= 1")
        _require(self.grad_accum >= 1, "grad_accum", self.grad_accum, "an integer >= 1")
        _require(self.max_steps >= 0, "max_steps", self.max_steps, "an integer >= 0")
        _require(self.epochs > 0, "epochs", self.epochs, "a positive number")
        _require(self.log_every >= 1, "log_every", self.log_every, "an integer >= 1")
        _require(self.segment_seconds >= 0, "segment_seconds", self.segment_seconds, "a number of seconds >= 0")
        _require(self.num_threads >= 0, "num_threads", self.num_threads, "an integer >= 0")
        _require(self.method in METHODS, "method", self.method, " or ".join(METHODS))

    def check_job(self) -> "TrainConfig":
        """This config, when a job can run it: the paths the launcher fills, and the rules between sections (each
        names the field the user set and what it needs). The launcher builds the config before torchrun starts,
        so these end a job with exit 2 and one line, not in every worker."""
        _require(bool(self.model.path) or "model_type" in self.model.config, "model.path/model.config",
                 self.model.path or self.model.config,
                 "a model directory, or an inline HF config containing model_type")
        _require(bool(self.data.path), "data.path", self.data.path, "a directory containing index.json")
        _require(bool(self.output_dir), "output_dir", self.output_dir, "a directory path")
        nodes = self.sharding.nodes  # the launcher's, from the job's hosts
        _require(nodes % self.sharding.group_nodes == 0, "sharding.group_nodes", self.sharding.group_nodes,
                 f"a divisor of sharding.nodes={nodes} (nodes per shard group)")
        _require(self.export.weights == "last" or (self.eval.keep_best and bool(self.data.validation_path)),
                 "export.weights", self.export.weights, "last, or best with eval.keep_best=true and validation data "
                 "(data.validation_path)")
        _require(not self.eval.keep_best or bool(self.checkpoint.dir), "eval.keep_best", self.eval.keep_best,
                 "false without checkpoints: the best weights are kept as a checkpoint (checkpoint.dir, the job's "
                 "CheckpointConfig)")
        _require(not self.segment_seconds or bool(self.checkpoint.dir), "segment_seconds", self.segment_seconds,
                 "0 without checkpoints: the next segment resumes from the checkpoint (checkpoint.dir, the job's "
                 "CheckpointConfig)")
        return self

    # ---- serialisation -------------------------------------------------------------------------------------

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, raw: dict) -> "TrainConfig":
        return _build(cls, raw, "").check_job()

    @classmethod
    def from_json_file(cls, path: str | Path) -> "TrainConfig":
        return cls.from_dict(json.loads(Path(path).read_text()))

    @classmethod
    def from_hyperparameters(cls, hp: Mapping[str, str], **overrides: Any) -> "TrainConfig":
        """A job's config from SageMaker hyperparameters (`parse`) and `overrides` (already typed, e.g. channel
        paths found by the launcher), which win; checked for a job (`check_job`)."""
        return parse({**hp, **overrides}).check_job()


# ---- the wire format: dotted paths to strings and back ---------------------------------------------------------


def flatten(config: TrainConfig) -> dict[str, str]:
    """SageMaker hyperparameters (every value a string) of each leaf of `config` that differs from its default,
    keyed by its dotted path; `parse` reads them back into an equal config."""
    return _flatten(config, TrainConfig(), "")


def leaf_paths(cls: type = TrainConfig, prefix: str = "") -> tuple[str, ...]:
    """The dotted path of every leaf of the tree (`checkpoint.interval_seconds`, `seed`), in declaration order."""
    hints = get_type_hints(cls)
    return tuple(path for f in fields(cls) for path in (
        leaf_paths(hints[f.name], f"{prefix}{f.name}.") if dataclasses.is_dataclass(hints[f.name])
        else (prefix + f.name,)))


def _flatten(obj: Any, default: Any, prefix: str) -> dict[str, str]:
    out: dict[str, str] = {}
    hints = get_type_hints(type(obj))
    for f in fields(obj):
        value, was = getattr(obj, f.name), getattr(default, f.name)
        if dataclasses.is_dataclass(hints[f.name]):
            out.update(_flatten(value, was, f"{prefix}{f.name}."))
        elif value != was:
            out[prefix + f.name] = _text(hints[f.name], value)
    return out


def _text(typ: Any, value: Any) -> str:
    if typ is bool:
        return "true" if value else "false"
    if typ is float:
        return repr(float(value))  # exact: a rounded "0.00" would read as "off"
    if typ is dict:
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def parse(hp: Mapping[str, Any]) -> TrainConfig:
    """The settings `flatten` wrote (every value a string, or already typed; nested fields as `section.field`),
    each refused with a one-line ConfigError naming it; not checked for a job (`TrainConfig.check_job`)."""
    nested: dict[str, Any] = {}
    for key, value in hp.items():
        section, _, name = key.partition(".")
        if name:
            nested.setdefault(section, {})[name] = value
        else:
            nested[key] = value
    return _build(TrainConfig, nested, "")


def _parse_scalar(typ: Any, value: Any, name: str) -> Any:
    if not isinstance(value, str):
        if typ is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                return _finite(float(value), name)
            except OverflowError:  # an int too large for a float
                raise ConfigError(f"{name}={short_repr(value)} is invalid: expected a finite number") from None
        if typ is dict and isinstance(value, dict):
            return value
        if typ is int and isinstance(value, int) and not isinstance(value, bool):
            return _int_in_range(value, name)
        if isinstance(value, typ) and typ is not int:
            return value
        raise ConfigError(f"{name}={short_repr(value)} is invalid: expected {typ.__name__}")
    text = value.strip()
    try:
        if typ is bool:
            low = text.lower()
            if low in ("true", "1", "yes"):
                return True
            if low in ("false", "0", "no"):
                return False
            raise ValueError
        if typ is int:
            return _int_in_range(int(text), name)
        if typ is float:
            return _finite(float(text), name)
        if typ is dict:
            parsed = json.loads(text, parse_constant=_refuse_constant) if text else {}
            if not isinstance(parsed, dict):
                raise ValueError
            return parsed
        return text
    except ConfigError:
        raise
    except ValueError:  # also int() of more than 4300 digits and json's refusal of NaN/Infinity
        kind = {bool: "true or false", int: "an integer", float: "a number",
                dict: "a JSON object (finite numbers only)"}[typ]
        raise ConfigError(f"{name}={short_repr(value)} is invalid: expected {kind}") from None


def _non_finite_path(value: Any, path: str = "") -> tuple[str, float] | None:
    """(dotted path, value) of the first NaN/Infinity inside a parsed JSON value, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return path, value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _non_finite_path(item, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None


def _finite(value: float, name: str) -> float:
    if not math.isfinite(value):
        raise ConfigError(f"{name}={value!r} is invalid: expected a finite number")
    return value


def _int_in_range(value: int, name: str) -> int:
    if not -INT_LIMIT <= value <= INT_LIMIT:
        raise ConfigError(f"{name}={short_repr(value)} is invalid: expected an integer in [{-INT_LIMIT}, {INT_LIMIT}]")
    return value


def _refuse_constant(token: str) -> Any:
    raise ValueError(f"{token} is not a finite number")


def short_repr(value: Any, limit: int = 80) -> str:
    """repr() cut to a short line: error messages must stay readable whatever was passed (megabytes of text,
    newlines, integers too long to print)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**limit:
        return f"<an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits>"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _build(cls: type, raw: Any, prefix: str) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}={short_repr(raw)} is invalid: expected an object")
    hints = get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"unknown field {short_repr(prefix + str(unknown[0]))}: accepted fields are "
                          f"{', '.join(sorted(known))}")
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in raw:
            continue
        typ = hints[f.name]
        value = raw[f.name]
        if dataclasses.is_dataclass(typ):
            kwargs[f.name] = _build(typ, value, f"{prefix}{f.name}.")
        else:
            kwargs[f.name] = _parse_scalar(typ, value, f"{prefix}{f.name}")
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a required section is missing
        raise ConfigError(f"{prefix or 'config'}: {exc}") from None
