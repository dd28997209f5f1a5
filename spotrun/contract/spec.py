"""The run JSON contract (version 1): documented dataclasses, one reflective decoder, and the rules across fields.

A run JSON is what users write and what a Step Functions execution receives. Each field is declared once, below,
with its documentation and what it accepts (`spec(...)`, see spotrun/contract/decoder.py); the decoder, the
errors and the docs' field reference (docs/hooks.py writes it into docs/run-fields.md when the site is built;
`python -m spotrun.contract.spec` prints it) all come from that declaration. Hand-written code is left for values
no range or pattern describes (sources, tags, LoRA targets, HF configs, tracking URIs: spotrun/contract/values.py)
and for the rules across fields (each class's `_given` and `_across`).

Every error is one line that names the field (as a dotted path), the bad value (shortened) and what is accepted:
`decode_run` (bytes of a run file) and `parse_run` (a decoded value, e.g. a Lambda event) raise
`RunValidationError` for any input at all, never another exception. The limits SageMaker applies later
(CreateTrainingJob's tag pattern and count, hyperparameter value length, job names) are checked here, before
anything starts. See examples/runs/ for complete files.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from typing import Any, Literal

from ..seams import METHODS
from . import values
from .decoder import decode, markdown_table, reference, spec
from .hub_id import HubId, is_hub_id, parse_hub_id
from .strict_json import (  # noqa: F401 - re-exported: the contract's public names
    ABSENT,
    MAX_DEPTH,
    MAX_INT,
    MAX_RUN_BYTES,
    MAX_STRING,
    RunValidationError,
    check_json_tree,
    decode_run,
    join,
    show,
)
from .values import MAX_RUN_TAGS, RESERVED_TAG_KEYS  # noqa: F401 - re-exported

SCHEMA_VERSION = 1
# NOTE: every pattern is used with fullmatch: `re.match(r"...$")` accepts a trailing newline.
# SageMaker job names allow 63; prefix/suffixes are added. The lookahead bounds the whole name: `(-*x){0,47}`
# alone admits any number of hyphens (a name padded to 80+ characters).
_NAME = r"(?=[a-zA-Z0-9-]{1,48}\Z)[a-zA-Z0-9](-*[a-zA-Z0-9]){0,47}"
_REGISTRY_GROUP = r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}"  # CreateModelPackageGroup's EntityName
_EXECUTION_NAME = r"[A-Za-z0-9_-]{1,80}"  # Step Functions execution names, as the console makes them
Approval = Literal["PendingManualApproval"]  # spotrun.seams.REGISTRATION_STATUS: every model is registered for review
Method = Literal[METHODS]  # seams.METHODS: what the trainer's config accepts
Init = Literal["pretrained", "random"]
MAX_RUNTIME_LIMIT_S = 28 * 24 * 3600  # StoppingCondition.MaxRuntimeInSeconds: "The maximum value is 28 days"
HYPERPARAMETER_VALUE_MAX = 2500  # CreateTrainingJob: HyperParameters values <= 2,500 characters (botocore model)
HYPERPARAMETER_KEY_MAX = 256
HYPERPARAMETERS_MAX = 100
DAYS_28_H = 28 * 24


def deadline_hours_text(deadline_s: float) -> str:
    """compute.deadline_hours as the run gives it, for messages: the contract's seconds back in hours, to 12
    significant digits (`:g` printed 0.123456789 as 0.123457 and 1.0000001 as 1)."""
    return f"{round(deadline_s / 3600, 12):.12g}"


def _needs_validation(data: DataSpec, field_path: str, value: Any) -> None:
    """Without data.source nothing can hold a validation split: the run must name its validation set. With one,
    the sources' check (spotrun/planner/sources.py `check_validation`) decides, on the prepared data's index.json."""
    if not data.has_validation and data.source is None:
        raise RunValidationError(field_path, value, "data.validation or data.validation_fraction with it (it "
                                 "reads the validation loss)")


# ---- the sections ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """`model`: pretrained weights (`source`), a shape trained from random weights (`config` with `init`), or a
    bare count for estimates (`parameters`)."""

    source: str | None = spec("An HF model directory: the pretrained weights to fine-tune (its config.json gives "
                              "the exact parameter count), or a hub id `hf://org/name[@revision]` that the "
                              "preparation step fetches into the stage's models/ (docs/models.md).",
                              default=None, decode=values.model_source, accepted=values.MODEL_SOURCE)
    config: dict | None = spec("An inline HF config: the shape to train with init \"random\"; beside source, a copy "
                               "of its config.json used when the source cannot be read (offline estimates). Alone, "
                               "a shape for estimates only (the pipeline asks for init).",
                               default=None, decode=values.hf_config, accepted=values.HF_CONFIG)
    parameters: int | None = spec("A bare parameter count, alone in model: estimates only.", default=None,
                                  lo=1, hi=10**14)
    init: Init | None = spec("The weights to start from: an explicit choice for a shape given as config; with a "
                             "source, pretrained.",
                             default=None, accepted='"pretrained" (weights from model.source) or "random" '
                             "(weights initialised from training.seed, shape from model.config)")

    @staticmethod
    def _given(raw: dict, path: str) -> None:
        if "parameters" in raw and len(raw) > 1:
            raise RunValidationError("model", raw, "model.parameters alone (a bare count, for estimates only), or "
                                     "model.source / model.config without it")

    def _across(self, raw: dict, path: str) -> ModelSpec:
        if self.parameters is not None:
            return self
        if self.init == "random":
            if self.source is not None:
                raise RunValidationError("model.source", raw["source"], 'no model.source with model.init="random" '
                                         "(random weights take only the shape: model.config)")
            if self.config is None:
                raise RunValidationError("model.config", ABSENT, "the model's shape (an HF config) with "
                                         'model.init="random"')
            size = len(json.dumps(self.config, separators=(",", ":")))
            if size > HYPERPARAMETER_VALUE_MAX:
                raise RunValidationError("model.config", self.config, f"an inline config of at most "
                                         f"{HYPERPARAMETER_VALUE_MAX:,} characters as compact JSON (SageMaker's "
                                         f"hyperparameter value limit); this one has {size:,}: drop the fields "
                                         "that keep their defaults")
            return self
        if self.source is not None:
            # With a source, an inline config is a copy of its config.json: the estimate uses it when the source
            # cannot be read here (offline); the pipeline reads the source's own config.json.
            return replace(self, init="pretrained")
        if self.init == "pretrained":
            raise RunValidationError("model.source", ABSENT, "the model directory holding the pretrained weights "
                                     '(with model.init="pretrained")')
        if self.config is None:
            raise RunValidationError("model", raw, "model.source (pretrained weights), model.config (a shape: with "
                                     'model.init="random" to train from random weights), or model.parameters')
        return self  # a shape only: estimates; the pipeline asks for model.init

    @property
    def hub(self) -> HubId | None:
        """model.source as a hub id (`hf://org/name[@revision]`, decoded once here), None for any other source."""
        return parse_hub_id(self.source) if self.source is not None and is_hub_id(self.source) else None


@dataclass(frozen=True, kw_only=True)
class DataSpec:
    """`data`: the prepared token shards (`spotrun prepare` writes them) and how samples are cut."""

    source: str | None = spec("The prepared token shards (`spotrun prepare`; their index.json gives the token "
                              "count), or raw text under the stage's datasets/ (.txt, .jsonl, .jsonl.gz, .parquet), "
                              "which the pipeline prepares first.", default=None, decode=values.source,
                              accepted=values.SOURCE)
    tokens: int | None = spec("Training tokens per epoch (default: read from the shards' index.json).",
                              default=None, lo=1, hi=10**15)
    seq_len: int = spec("Tokens per training sample (documents are packed, separated by EOS).", lo=2, hi=1 << 20)
    validation: str | None = spec("Prepared validation shards: the training job's `validation` channel.",
                                  default=None, decode=values.source, accepted=values.SOURCE)
    validation_fraction: float | None = spec("Held-out share of the documents, split by a stable hash at prepare "
                                             "time into <prepared data>/validation (instead of validation).",
                                             default=None, lo=0, hi=0.5, lo_open=True)

    @property
    def has_validation(self) -> bool:
        return self.validation is not None or self.validation_fraction is not None

    @staticmethod
    def _given(raw: dict, path: str) -> None:
        if raw.get("source") is None and raw.get("tokens") is None:
            raise RunValidationError("data", raw, "data.tokens, or data.source whose index.json gives the count")

    def _across(self, raw: dict, path: str) -> DataSpec:
        if self.validation is not None and self.validation_fraction is not None:
            raise RunValidationError("data.validation_fraction", raw["validation_fraction"], "no fraction with "
                                     "data.validation (one validation set: a prepared source or a held-out share)")
        return self


@dataclass(frozen=True, kw_only=True)
class EvalSpec:
    """`eval`: when the trainer evaluates the validation loss (besides before the first step and at the end)."""

    every_steps: int = spec("Evaluate after every N optimizer steps (0: off).", default=0, lo=0, hi=10**9)
    every_s: float = spec("Evaluate at the first log step after this many minutes (0: off).", default=0.0,
                          lo=0, hi=28 * 24 * 60, at="every_minutes", unit=60)
    max_batches: int = spec("Evaluate the first N micro-batches of the validation set (0: all of it).", default=0,
                            lo=0, hi=10**9)
    keep_best: bool = spec("Keep the lowest-validation-loss checkpoint beside the newest checkpoint.keep (needs "
                           "every_steps or every_minutes).", default=False)

    def _across(self, raw: dict, path: str) -> EvalSpec:
        # Without a cadence the trainer evaluates only before the first step and at the end: no checkpoint is ever
        # kept as the best, and export.from=best would export the last weights.
        if self.keep_best and not (self.every_steps or self.every_s):
            raise RunValidationError(f"{path}.keep_best", self.keep_best, f"{path}.every_steps or "
                                     f"{path}.every_minutes > 0 with it (without either the run evaluates only "
                                     "before the first step and at the end, so no best checkpoint is kept), or "
                                     "false")
        return self


@dataclass(frozen=True, kw_only=True)
class ExportSpec:
    """`export`: what the run leaves as its model."""

    from_: Literal["last", "best"] = spec("Which weights are exported: the final ones, or the kept best checkpoint's "
                                          "(needs eval.keep_best).", default="last", at="from",
                                          accepted='"last" (the final weights) or "best" (the lowest validation '
                                          "loss)")
    merge_lora: bool = spec("LoRA runs: also export the base with the adapter merged in (`merged/` beside the "
                            "adapter: a standalone model, which `spotrun deploy --merged` serves).", default=False)


@dataclass(frozen=True, kw_only=True)
class GateSpec:
    """`registry.gate`: a model is registered only when its exported weights' validation loss passes every bound
    given."""

    max_val_loss: float | None = spec("The highest validation loss registered.", default=None, lo=0, hi=1e6,
                                      lo_open=True)
    min_improvement: float | None = spec("The smallest relative drop against the base model's validation loss: "
                                         "(base - final) / base.", default=None, lo=-1, hi=1)

    def _across(self, raw: dict, path: str) -> GateSpec:
        if self.max_val_loss is None and self.min_improvement is None:
            raise RunValidationError(path, raw, "max_val_loss and/or min_improvement")
        return self


@dataclass(frozen=True)
class LoraSpec:
    """`training.lora`: the adapters of a LoRA run (PEFT's LoraConfig)."""

    rank: int = spec("Adapter rank r: a targeted (in, out) linear layer gains r * (in + out) parameters.",
                     lo=1, hi=4096)
    target_modules: tuple[str, ...] | str = spec("The linear layers that get adapters: every one of the blocks, or "
                                                 "these module names.", default="all-linear",
                                                 decode=values.lora_targets, accepted=values.TARGETS)
    alpha: float = spec("Scaling numerator: the adapter's output is multiplied by alpha / rank.", default=16.0,
                        lo=0, hi=65536, lo_open=True)
    dropout: float = spec("Dropout on the adapter's input.", default=0.0, lo=0, hi=0.9)


@dataclass(frozen=True, kw_only=True)
class TrainingSpec:
    """`training`: the method and the optimisation."""

    method: Method = spec("full: every parameter trains; lora: the base is frozen and adapters train.",
                          default="full")
    lora: LoraSpec | None = spec("The adapters: required with method lora, refused otherwise.", default=None)
    epochs: float = spec("Passes over the data.", default=1.0, lo=0, hi=1000, lo_open=True)
    micro_batch: int = spec("Samples per GPU per forward/backward (the planner may choose a smaller one that fits "
                            "and more accumulation: the samples per step stay).", default=1, lo=1, hi=4096)
    grad_accum: int = spec("Micro-batches per optimizer step.", default=1, lo=1, hi=4096)
    lr: float = spec("Peak learning rate (AdamW, warmup then cosine decay).", default=2e-5, lo=0, hi=1, lo_open=True)
    seed: int = spec("Seed of the data order, the random init and dropout.", default=0, lo=0, hi=2**31 - 1)

    @staticmethod
    def _given(raw: dict, path: str) -> None:
        method = raw.get("method", "full")
        if method in METHODS and (method == "lora") != (raw.get("lora") is not None):
            raise RunValidationError("training.lora", raw.get("lora"), "an object with at least rank (training.method "
                                     "is lora)" if method == "lora" else "no lora section unless training.method is "
                                     "lora")


@dataclass(frozen=True, kw_only=True)
class ComputeSpec:
    """`compute`: the instances, spot, and how long the run may wait for capacity."""

    instance_type: str = spec('An ml.* instance type, or "auto": the cheapest that fits (and meets target_hours).',
                              default="auto", pattern=r"auto|ml\.[a-z0-9]+\.[a-z0-9]+",
                              accepted='"auto" or a SageMaker instance type such as ml.g5.12xlarge')
    instance_count: int | None = spec("Nodes (auto: the planner's choice).", default=None, auto=True, lo=1, hi=64)
    spot: bool = spec("Managed spot training (interruptions resume from the newest checkpoint).", default=True)
    max_wait_hours: float | None = spec("MaxWait: the job's limit including waits for spot capacity (default: "
                                        "MaxRuntime + accepted_delay_hours). Spot only: refused with "
                                        "compute.spot=false.", default=None, lo=0, hi=DAYS_28_H * 2,
                                        lo_open=True)
    accepted_delay_hours: float = spec("Waiting for spot capacity accepted beyond the run time. Spot only: "
                                       "refused with compute.spot=false.", default=24.0,
                                       lo=0, hi=DAYS_28_H)
    on_demand_fallback: bool = spec("After MaxWait without spot capacity, continue on on-demand instances.",
                                    default=False)
    warm_pool_minutes: int = spec("Managed warm pool keep-alive (on-demand only: refused with spot).", default=0,
                                  lo=0, hi=60)
    utilization: float | None = spec("Measured MFU of an earlier run (default: recorded runs' median, else 0.25).",
                                     default=None, lo=0, hi=1, lo_open=True)
    target_hours: float | None = spec("Wall-time goal: the cheapest layout meeting it wins (default: the cheapest).",
                                      default=None, lo=0, hi=DAYS_28_H, lo_open=True)
    spot_discount: float | None = spec("The spot discount to plan with (default: the catalog's).", default=None,
                                       lo=0, hi=0.95)
    accept_max_runtime_stop: bool = spec("A run expected to need more than 28 days may start and be stopped at 28 "
                                         "days (else it is refused).", default=False)
    deadline_s: float | None = spec("When the model is needed, in hours after the start: the estimate "
                                          "chooses the spot policy that meets it on >= 99% of simulated traces (a "
                                          "deadline shorter than the run on on-demand instances is refused).",
                                          default=None, lo=0, hi=DAYS_28_H * 2, lo_open=True, at="deadline_hours",
                                          unit=3600)
    accept_missed_deadline: bool = spec("Start a run whose deadline_hours is shorter than the run takes even on "
                                        "on-demand instances, or that no spot policy meets on 99% of the simulated "
                                        "runs (else it is refused); the estimate warns that it will be missed.",
                                        default=False)

    def _across(self, raw: dict, path: str) -> ComputeSpec:
        for name in ("max_wait_hours", "accepted_delay_hours"):  # spot-only: they size a spot job's MaxWait
            if not self.spot and raw.get(name) is not None:
                raise RunValidationError(f"{path}.{name}", raw[name], "no value with compute.spot=false (an "
                                         "on-demand job has no MaxWait: it never waits for spot capacity), or "
                                         "compute.spot=true")
        if self.target_hours is not None and self.deadline_s is not None and self.target_hours * 3600 > self.deadline_s:
            raise RunValidationError(f"{path}.target_hours", self.target_hours, "at most compute.deadline_hours="
                                     f"{deadline_hours_text(self.deadline_s)} (the wall-time goal picks the layout; "
                                     "a layout slower than the deadline cannot meet it), or a later "
                                     "compute.deadline_hours")
        if self.spot and self.warm_pool_minutes:
            raise RunValidationError(f"{path}.warm_pool_minutes", self.warm_pool_minutes, "0 with compute.spot=true "
                                     "(SageMaker managed warm pools cannot be used with spot instances), or "
                                     "compute.spot=false")
        return self


@dataclass(frozen=True, kw_only=True)
class CheckpointSpec:
    """`checkpoint`: how often the trainer saves, and what it resumes from."""

    interval_s: float | None = spec("Minutes between periodic saves (auto: Young/Daly from the save cost and "
                                          "the interruption rate; a checkpoint that leaves within the notice saves "
                                          "on it).", default=None, auto=True, lo=0, hi=24 * 60, lo_open=True,
                                          at="interval_minutes", unit=60)
    keep: int = spec("Newest verified checkpoints kept (>= 2: the one being written never replaces the only good "
                     "one).", default=2, lo=2, hi=100)
    interruptions_per_hour: float | None = spec("The interruption rate to plan with (default: recorded, else the "
                                                "catalog's).", default=None, lo=0, hi=10)
    mean_wait_hours: float | None = spec("The mean wait for spot capacity after an interruption to plan with, in "
                                         "hours (default: recorded on the instance type, else the availability "
                                         "model's at the interruption rate).", default=None, lo=0, hi=168,
                                         lo_open=True)
    resume_from: str | None = spec("An earlier, ended execution of this run: continue from its checkpoints.",
                                   default=None, pattern=_EXECUTION_NAME, accepted="the name of an earlier "
                                   "execution of this run (1-80 letters, digits, - or _)")


_WANDB_NAME = r"[A-Za-z0-9][A-Za-z0-9_\-.]{0,127}"
_WANDB_NAME_TEXT = "1-128 letters, digits, _ - or ., starting with a letter or digit"
_SECRET_ID = r"(arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:\d{12}:secret:)?[A-Za-z0-9/_+=.@-]{1,512}"


@dataclass(frozen=True, kw_only=True)
class TrackingSpec:
    """`tracking`: experiment tracking (SageMaker AI's managed MLflow, or any MLflow tracking server; and/or
    Weights & Biases)."""

    mlflow_uri: str | None = spec("The MLflow tracking server the trainer logs this run to (a SageMaker AI server "
                                  "is reached by its ARN through the sagemaker-mlflow plugin). Not given: nothing "
                                  "is tracked.", default=None, decode=values.mlflow_uri,
                                  accepted=values.MLFLOW_URI)
    experiment: str | None = spec("The MLflow experiment the run is logged in (created when missing); with a "
                                  "SageMaker AI server's ARN also CreateTrainingJob's MlflowConfig "
                                  "MlflowExperimentName. Not given: the run's name.", default=None,
                                  pattern=r"[A-Za-z0-9][A-Za-z0-9_\-. ]{0,199}",
                                  accepted="1-200 letters, digits, spaces, _ - or ., starting with a letter or digit")
    wandb_project: str | None = spec("The Weights & Biases project the trainer also logs this run to (beside or "
                                     "instead of MLflow); needs wandb_api_key_secret. Not given: no W&B.",
                                     default=None, pattern=_WANDB_NAME, accepted=_WANDB_NAME_TEXT)
    wandb_entity: str | None = spec("The W&B entity (user or team) of wandb_project. Not given: the API key's "
                                    "default entity.", default=None, pattern=_WANDB_NAME, accepted=_WANDB_NAME_TEXT)
    wandb_api_key_secret: str | None = spec("The AWS Secrets Manager secret (name or ARN) that holds the W&B API key "
                                            "(the key, or JSON with an api_key field), read by the training job "
                                            "with its role; the key is never put in the run or its hyperparameters.",
                                            default=None, pattern=_SECRET_ID, accepted="a Secrets Manager secret "
                                            "name (1-512 of letters, digits, /_+=.@-) or its ARN")

    def _across(self, raw: dict, path: str) -> TrackingSpec:
        if bool(self.wandb_project) != bool(self.wandb_api_key_secret):
            given = "wandb_project" if self.wandb_project else "wandb_api_key_secret"
            other = "wandb_api_key_secret" if self.wandb_project else "wandb_project"
            raise RunValidationError(f"{path}.{given}", raw[given], f"{path}.{other} with it (W&B needs both)")
        if self.wandb_entity and not self.wandb_project:
            raise RunValidationError(f"{path}.wandb_entity", self.wandb_entity, f"{path}.wandb_project with it")
        return self


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """A run JSON (version 1), decoded and validated."""

    version: Literal[1] = spec("The schema version.", accepted=f"the integer {SCHEMA_VERSION} (the only schema "
                               "version)")
    name: str = spec("The run's name: the prefix of its job and execution names.", pattern=_NAME,
                     accepted="1-48 letters, digits and hyphens, starting and ending with a letter or digit")
    model: ModelSpec = spec("What to train.")
    data: DataSpec = spec("What to train on.")
    training: TrainingSpec = spec("How to train.", default_factory=TrainingSpec)
    compute: ComputeSpec = spec("Where to train.", default_factory=ComputeSpec)
    checkpoint: CheckpointSpec = spec("When to save.", default_factory=CheckpointSpec)
    max_usd: float = spec("The cost cap: the plan must fit it, and every job's MaxRuntime keeps the run under it "
                          "at on-demand rates.", at="budget.max_usd", lo=0, hi=10**9, lo_open=True)
    model_package_group: str | None = spec("The Model Registry group (default: the stage's).", default=None,
                                           at="registry.model_package_group", pattern=_REGISTRY_GROUP,
                                           accepted="a model package group name (1-63 letters, digits, hyphens)")
    approval_status: Approval = spec("The registered model package's approval status.",
                                     default="PendingManualApproval", at="registry.approval_status",
                                     accepted="PendingManualApproval: the pipeline registers every model for review; "
                                     "approving it is a separate, permissioned step (`spotrun approve RUN`, or aws "
                                     "sagemaker update-model-package --model-approval-status Approved)")
    tags: dict[str, str] = spec("Tags on every training job of the run (SageMaker's tag pattern).",
                                default_factory=dict, decode=values.tags, accepted=values.TAGS)
    eval: EvalSpec = spec("When to evaluate.", default_factory=EvalSpec)
    export: ExportSpec = spec("What the run exports.", default_factory=ExportSpec)
    gate: GateSpec | None = spec("The bounds a model must pass to be registered (needs validation data).",
                                 default=None, at="registry.gate")
    tracking: TrackingSpec = spec("Experiment tracking.", default_factory=TrackingSpec)

    @property
    def validation_needed_by(self) -> str | None:
        """The field that reads a validation loss (registry.gate, then eval), or None when nothing does."""
        if self.gate is not None:
            return "registry.gate"
        return "eval" if self.eval != EvalSpec() else None

    def _across(self, raw: dict, path: str) -> RunSpec:
        _one_step_on_one_gpu(self.data, self.training)
        check_seq_len_within(self.data.seq_len, self.model.config, "model.config")
        if self.gate is not None:
            _needs_validation(self.data, "registry.gate", raw["registry"]["gate"])
        if raw.get("eval"):
            _needs_validation(self.data, "eval", raw["eval"])
        if self.export.merge_lora and self.training.method != "lora":
            raise RunValidationError("export.merge_lora", True, "false unless training.method is lora (a full run "
                                     "exports a standalone model already)")
        if self.export.from_ == "best" and not self.eval.keep_best:
            raise RunValidationError("export.from", self.export.from_, '"last", or eval.keep_best=true with "best" '
                                     "(the best checkpoint must be kept to be exported)")
        return self


# The config.json fields in which Hugging Face model types keep their longest sequence (llama/qwen2/mistral: the
# first; gpt2: the second).
POSITION_FIELDS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def check_seq_len_within(seq_len: int, config: dict | None, where: str) -> None:
    """data.seq_len within the positions a model config names (the first of POSITION_FIELDS it has; nothing to
    check without one): beyond them training fails in every worker (an IndexError of the position embedding, or
    silently wrong rotary positions). The contract checks an inline model.config (`spotrun validate` too: a
    `seq_len: 100000` on the Qwen example was caught only as out of memory); the planner the source's config.json
    (spotrun/planner/sources.py `check_seq_len`). `where`: the config's place, named in the error."""
    if not isinstance(config, dict):
        return
    for name in POSITION_FIELDS:
        limit = config.get(name)
        if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
            if seq_len > limit:
                raise RunValidationError("data.seq_len", seq_len, f"at most the model's {name}={limit} ({where})")
            return


def _one_step_on_one_gpu(data: DataSpec, training: TrainingSpec) -> None:
    """data.tokens (x epochs) fill at least one optimizer step on one GPU: micro_batch x grad_accum samples of
    seq_len tokens, the least any layout needs (the planner refuses the same for the layout it chooses)."""
    samples = training.micro_batch * training.grad_accum
    if data.tokens is not None and data.tokens * training.epochs < samples * data.seq_len:
        least = math.ceil(samples * data.seq_len / training.epochs)
        raise RunValidationError("data.tokens", data.tokens, f"at least {least:,} tokens (one optimizer step on one "
                                 f"GPU: training.micro_batch x training.grad_accum = {samples} samples of "
                                 f"data.seq_len={data.seq_len} tokens, over training.epochs={training.epochs:g}); "
                                 "give more data or a smaller batch")


def parse_run(raw: Any) -> RunSpec:
    """A validated RunSpec from a decoded run JSON, or RunValidationError naming the field."""
    if not isinstance(raw, dict):
        raise RunValidationError("run", raw, "a JSON object")
    check_json_tree(raw)
    return decode(RunSpec, raw)


# ---- the field reference (docs/hooks.py puts it into docs/run-fields.md when the site is built) ---------------

def field_reference() -> str:
    """Every field of a run as a Markdown table: its path, what it accepts, its default and what it means."""
    return markdown_table(reference(RunSpec))


if __name__ == "__main__":
    print(field_reference(), end="")
