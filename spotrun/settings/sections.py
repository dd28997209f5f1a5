"""The sections of the settings tree (stdlib only): one frozen dataclass per component of the trainer, each field
documented under it and checked on construction (`ConfigError` naming its dotted path). spotrun/settings/tree.py
joins them into the trainer's `TrainConfig`."""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field

from ..seams import StopNotice
from .checks import ConfigError, non_finite_path, require, require_finite, short_repr


@dataclass(frozen=True)
class ModelConfig:
    """Which causal LM to train and how to shard it."""

    path: str = ""
    """Local directory of a Hugging Face model (the `model` channel). Empty: build from `config` instead."""
    source: str = ""
    """Where the base model came from (the run's model.source, e.g. an S3 URI): recorded in the export metadata
    so an adapter names the base it needs."""
    config: dict = field(default_factory=dict)
    """Inline HF config (must contain `model_type`) used when `path` is empty; weights are initialised from
    `training.seed`."""
    param_dtype: str = "auto"
    """FSDP2 MixedPrecisionPolicy param dtype: `auto` (bfloat16 on GPU, float32 on CPU), `bfloat16` or `float32`."""
    activation_checkpointing: bool = False
    """Recompute each decoder block in backward (HF's own, RNG-preserving, so exact with dropout)."""

    def __post_init__(self) -> None:
        require(isinstance(self.config, dict), "model.config", self.config, "a JSON object")
        bad = non_finite_path(self.config)
        if bad is not None:
            raise ConfigError(f"model.config.{bad[0]}={short_repr(bad[1])} is invalid: expected a finite number")
        require(self.param_dtype in ("auto", "bfloat16", "float32"), "model.param_dtype", self.param_dtype,
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
        require(self.mode in SHARDING_MODES, "sharding.mode", self.mode, "full or hybrid")
        require(self.nodes >= 1, "sharding.nodes", self.nodes, "an integer >= 1")
        require(self.group_nodes >= 1, "sharding.group_nodes", self.group_nodes, "an integer >= 1")

    def mesh_shape(self, world: int) -> tuple[int, int]:
        """(replicas, ranks per shard group) for `world` ranks; replicas is 1 for full sharding."""
        require(world % self.nodes == 0, "sharding.nodes", self.nodes,
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
        require(self.seq_len >= 2, "data.seq_len", self.seq_len, "an integer >= 2")


@dataclass(frozen=True)
class OptimConfig:
    """AdamW's shape and schedule: linear warmup to `training.lr`, then cosine decay to `min_lr_ratio` of it."""

    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.95
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    """Max global gradient norm; 0 disables clipping."""

    def __post_init__(self) -> None:
        require_finite(self, "optim.")
        require(self.weight_decay >= 0, "optim.weight_decay", self.weight_decay, "a float >= 0")
        require(0 <= self.beta1 < 1, "optim.beta1", self.beta1, "a float in [0, 1)")
        require(0 <= self.beta2 < 1, "optim.beta2", self.beta2, "a float in [0, 1)")
        require(self.warmup_steps >= 0, "optim.warmup_steps", self.warmup_steps, "an integer >= 0")
        require(0 <= self.min_lr_ratio <= 1, "optim.min_lr_ratio", self.min_lr_ratio, "a float in [0, 1]")
        require(self.grad_clip >= 0, "optim.grad_clip", self.grad_clip, "a float >= 0")


@dataclass(frozen=True)
class CheckpointConfig:
    """Where and how often to save; see checkpoint.py for the commit protocol."""

    dir: str = ""
    """Checkpoint directory (SageMaker: /opt/ml/checkpoints, mirrored to S3). Empty disables checkpoints."""
    interval_steps: int = 0
    """Save every N steps (0: off)."""
    interval_s: float = 0.0
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
        require_finite(self, "checkpoint.")
        require(self.interval_steps >= 0, "checkpoint.interval_steps", self.interval_steps, "an integer >= 0")
        require(self.interval_s >= 0, "checkpoint.interval_s", self.interval_s, "a float >= 0")
        require(self.keep >= 2, "checkpoint.keep", self.keep, "an integer >= 2")
        require(self.resume in ("auto", "never"), "checkpoint.resume", self.resume, "auto or never")
        require(self.notice_seconds > 0, "checkpoint.notice_seconds", self.notice_seconds, "a positive float")


@dataclass(frozen=True)
class EvalConfig:
    """Validation loss (see evaluate.py): before the first step (the base model's), on this schedule, at the end.

    Used when data.validation_path is set; the value is the mean next-token loss over every trained token of the
    validation set (or its first `max_batches` micro-batches), so it is the same after any resume."""

    every_steps: int = 0
    """Evaluate after every N optimizer steps (0: off)."""
    every_s: float = 0.0
    """Evaluate at the first log step after this many seconds since the last evaluation (0: off). Time-based
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
        require_finite(self, "eval.")
        require(self.every_steps >= 0, "eval.every_steps", self.every_steps, "an integer >= 0")
        require(self.every_s >= 0, "eval.every_s", self.every_s, "a float >= 0")
        require(self.max_batches >= 0, "eval.max_batches", self.max_batches, "an integer >= 0")
        require(self.samples >= 0, "eval.samples", self.samples, "an integer >= 0")
        require(self.sample_prompt_tokens >= 1, "eval.sample_prompt_tokens", self.sample_prompt_tokens,
                 "an integer >= 1")
        require(self.sample_new_tokens >= 1, "eval.sample_new_tokens", self.sample_new_tokens, "an integer >= 1")


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
        require_finite(self, "tracking.")
        uri = self.mlflow_uri
        require(not uri or uri.startswith(("http://", "https://", "arn:")), "tracking.mlflow_uri", uri,
                 "an http(s):// URL or a SageMaker AI MLflow tracking server ARN")
        require(bool(self.experiment), "tracking.experiment", self.experiment, "a non-empty experiment name")
        require(self.instance_count >= 1, "tracking.instance_count", self.instance_count, "an integer >= 1")
        require(self.timeout_seconds > 0, "tracking.timeout_seconds", self.timeout_seconds, "a positive number")
        require(self.close_seconds >= 0, "tracking.close_seconds", self.close_seconds, "a number >= 0")
        require(not self.wandb_project or bool(self.wandb_api_key_secret), "tracking.wandb_api_key_secret",
                 self.wandb_api_key_secret, "the Secrets Manager secret holding the W&B API key (with wandb_project)")


_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")


@dataclass(frozen=True)
class LoraConfig:
    """LoRA adapters (PEFT) on the frozen base (`training.lora`); used when `training.method` is `lora` (see
    lora.py).

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
        require(1 <= self.rank <= 4096, "training.lora.rank", self.rank, "an integer in [1, 4096]")
        require(math.isfinite(self.alpha) and self.alpha > 0, "training.lora.alpha", self.alpha,
                "a positive finite number")
        require(0 <= self.dropout < 1, "training.lora.dropout", self.dropout, "a float in [0, 1)")
        names = self.targets
        require(names == "all-linear" or (bool(names) and all(_MODULE_NAME.match(n) for n in names)),
                 "training.lora.target_modules", self.target_modules,
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
    from_: str = "last"
    """`export.from` (a Python keyword: the field carries a trailing underscore, its dotted path does not): `last`
    (the final weights) or `best` (the kept checkpoint with the lowest validation loss: needs eval.keep_best); the
    choice and both losses go into the export metadata."""

    def __post_init__(self) -> None:
        require(self.dtype in ("bfloat16", "float32"), "export.dtype", self.dtype, "bfloat16 or float32")
        require(self.from_ in ("last", "best"), "export.from", self.from_, "last or best")


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
            require(getattr(self, name) in ("auto", "on", "off"), f"perf.{name}", getattr(self, name),
                     "one of auto, on, off")
        require(self.loss in ("auto", "hf", "chunked"), "perf.loss", self.loss, "one of auto, hf, chunked")
        require(self.loss_chunk_tokens >= 1, "perf.loss_chunk_tokens", self.loss_chunk_tokens, "an integer >= 1")
        require(self.prefetch_blocks >= 0, "perf.prefetch_blocks", self.prefetch_blocks, "an integer >= 0")
        require(self.reduce_dtype in ("float32", "bfloat16"), "perf.reduce_dtype", self.reduce_dtype,
                 "float32 or bfloat16")

    def resolved(self, device_type: str) -> "PerfConfig":
        """This config with every `auto` replaced by the choice for `device_type` (cuda or cpu)."""
        cuda = device_type == "cuda"
        on_off = "on" if cuda else "off"
        return dataclasses.replace(
            self, fused_optimizer=on_off if self.fused_optimizer == "auto" else self.fused_optimizer,
            compile=on_off if self.compile == "auto" else self.compile,
            loss=("chunked" if cuda else "hf") if self.loss == "auto" else self.loss)
