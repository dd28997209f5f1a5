"""The root of the settings tree: `TrainConfig`, the trainer's configuration and what the planner fills, and its
`training` section, the run JSON's own (`training.lr`, `training.lora.rank`: one dotted path on both sides).

`TrainConfig.check_job` adds what a job needs beyond the planned settings: the paths the launcher fills and the
rules across sections. The entry points apply it (spotrun/settings/wire.py `job_config`, `from_dict`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..seams import METHODS, Method
from .checks import SEED_LIMIT, require, require_finite
from .sections import (
    CheckpointConfig,
    DataConfig,
    EvalConfig,
    ExportConfig,
    LoraConfig,
    ModelConfig,
    OptimConfig,
    PerfConfig,
    ShardingConfig,
    TrackingConfig,
)


@dataclass(frozen=True)
class TrainingConfig:
    """The method and the optimisation: the run JSON's `training` section, as the trainer reads it."""

    method: str = Method.FULL.value
    """`full` (every parameter trains) or `lora` (the base is frozen; adapters train: see `lora`)."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    epochs: float = 1.0
    """Passes over the data, unless `max_steps` is set."""
    micro_batch: int = 1
    """Samples per rank per forward/backward."""
    grad_accum: int = 1
    """Micro-batches per optimizer step."""
    lr: float = 2e-5
    """Peak learning rate (AdamW; the schedule is `optim`'s)."""
    seed: int = 0
    """Seed of the data order, the random init and dropout."""

    def __post_init__(self) -> None:
        require_finite(self, "training.")
        require(self.method in METHODS, "training.method", self.method, " or ".join(METHODS))
        require(self.epochs > 0, "training.epochs", self.epochs, "a positive number")
        require(self.micro_batch >= 1, "training.micro_batch", self.micro_batch, "an integer >= 1")
        require(self.grad_accum >= 1, "training.grad_accum", self.grad_accum, "an integer >= 1")
        require(self.lr > 0, "training.lr", self.lr, "a positive float")
        require(0 <= self.seed <= SEED_LIMIT, "training.seed", self.seed, f"an integer in [0, {SEED_LIMIT}]")


@dataclass(frozen=True)
class TrainConfig:
    """Everything one training run needs; serialised to JSON by the launcher and read by every worker."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    sharding: ShardingConfig = field(default_factory=ShardingConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    perf: PerfConfig = field(default_factory=PerfConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    output_dir: str = ""
    """Where the exported HF model and metrics.json go (SageMaker: /opt/ml/model)."""
    max_steps: int = 0
    """Optimizer steps to run; 0 means `training.epochs` passes over the data."""
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
        require_finite(self, "")
        require(self.max_steps >= 0, "max_steps", self.max_steps, "an integer >= 0")
        require(self.log_every >= 1, "log_every", self.log_every, "an integer >= 1")
        require(self.segment_seconds >= 0, "segment_seconds", self.segment_seconds, "a number of seconds >= 0")
        require(self.num_threads >= 0, "num_threads", self.num_threads, "an integer >= 0")

    def check_job(self) -> "TrainConfig":
        """This config, when a job can run it: the paths the launcher fills, and the rules between sections (each
        names the field the user set and what it needs). The launcher builds the config before torchrun starts,
        so these end a job with exit 2 and one line, not in every worker."""
        require(bool(self.model.path) or "model_type" in self.model.config, "model.path/model.config",
                self.model.path or self.model.config,
                "a model directory, or an inline HF config containing model_type")
        require(bool(self.data.path), "data.path", self.data.path, "a directory containing index.json")
        require(bool(self.output_dir), "output_dir", self.output_dir, "a directory path")
        nodes = self.sharding.nodes  # the launcher's, from the job's hosts
        require(nodes % self.sharding.group_nodes == 0, "sharding.group_nodes", self.sharding.group_nodes,
                f"a divisor of sharding.nodes={nodes} (nodes per shard group)")
        require(self.export.from_ == "last" or (self.eval.keep_best and bool(self.data.validation_path)),
                "export.from", self.export.from_, "last, or best with eval.keep_best=true and validation data "
                "(data.validation_path)")
        require(not self.eval.keep_best or bool(self.checkpoint.dir), "eval.keep_best", self.eval.keep_best,
                "false without checkpoints: the best weights are kept as a checkpoint (checkpoint.dir, the job's "
                "CheckpointConfig)")
        require(not self.segment_seconds or bool(self.checkpoint.dir), "segment_seconds", self.segment_seconds,
                "0 without checkpoints: the next segment resumes from the checkpoint (checkpoint.dir, the job's "
                "CheckpointConfig)")
        return self
