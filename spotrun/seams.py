"""The one definition of everything that crosses between spotrun's parts (stdlib only).

The planner and the Lambda handlers (spotrun/), the CDK constructs (training_constructs/) and the trainer image
(training_image/, which installs this module) all import these names instead of spelling strings:

- `Method`: the training methods. What the planner sends the trainer is the settings tree of spotrun/settings/
  (the trainer's config, flattened to SageMaker hyperparameters under its dotted paths).
- `METRIC_FIELDS`, `format_metric_line`/`parse_metric_line`, `format_eval_line`/`parse_eval_line`,
  `run_start_total_steps`, `METRIC_DEFINITIONS`, `metric_name`: the lines the trainer prints, their one parser
  (`spotrun status`, local progress, tests), the regexes SageMaker's MetricDefinitions apply to them, and the
  names the dashboard and the guard read.
- `PlanStatus`, `GuardAction`, `Plan`, `Guard`: what the estimate and the cost guard return, and the state
  machine reads through `$.plan.<field>` / `$.guard.<field>` (`plan_path`, `guard_path` refuse unknown fields);
  the cost guard decodes them at its entry (`from_json`, a named error for a malformed one).
- `PipelineSettings`, `CostGuardEnvironment`, `CancelEnvironment`, `RecorderEnvironment`: each Lambda function's
  environment, written by the constructs (`to_env`) and read by the handlers (`from_env`); `REGISTRATION_STATUS`,
  `CANCEL_STATUSES`: what the estimate and the canceller decide that the state machine and its rules repeat.
- `StopNotice`: the stop-notice timings (SageMaker's SIGTERM-to-SIGKILL window and how it is spent).
- `BytesPerParameter`: training state and checkpoint sizes per parameter.
- `CHECKPOINT_MANIFEST`, `CHECKPOINT_STEP_DIR`, `checkpoint_step_dir`: the
  committed-checkpoint layout the trainer writes and the guard lists in S3. `EXPORT_METADATA`: the file beside an
  exported model.
- `DatasetIndex`: the prepared dataset's index.json (`prepare` writes it; the trainer and the estimate read it);
  `tokenizer_identity`: the tokenizer the shards were made with, recorded there and compared with the model's.
- `PreparationSettings`, `Preparation`, `preparation_path`, `PREPARED_PREFIX`, `PARTS_DIR`, `PREPARE_MARKER`,
  `RAW_SUFFIXES`, `WEIGHT_SUFFIXES`, `PROCESSING_*`, `FINISH_*`: the preparation of raw data, planned by the
  estimate (spotrun/pipeline/preparation.py), run by the trainer's prepare, wired by the constructs; `HUB_*`,
  `PREPARE_DATA`/`PREPARE_MODEL`: the fetch of a hub model (spotrun/pipeline/hub.py), the same step's other kind.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import os
import re
from collections.abc import Callable, Iterable, Mapping
from enum import Enum

# ---- methods and channels (planner -> trainer) -------------------------------------------------------------


class Method(str, Enum):
    """What a run trains (`training.method` of the run, the `method` hyperparameter, the trainer's config)."""

    FULL = "full"  # every parameter
    LORA = "lora"  # adapters on a frozen base (the registered artifact is the adapter)


METHODS = tuple(m.value for m in Method)

# The training job's channel of prepared validation shards (data.validation); the launcher maps it to
# data.validation_path. Without it, a train channel holding prepare's `validation/` split is used.
VALIDATION_CHANNEL = "validation"


# ---- metrics (trainer -> CloudWatch -> dashboard and guard) ----------------------------------------------------

METRIC_FIELDS = ("loss", "lr", "grad_norm", "tokens_per_s", "mfu", "mem_gb")
# The evaluation line `eval step=120 val_loss=2.41 val_ppl=11.1 val_tokens=65536 eval_s=3.2` (its own line: the
# validation set is evaluated on its own schedule). The dashboard and the gate read val_loss.
EVAL_LINE_PREFIX = "eval"
EVAL_METRIC_FIELDS = ("val_loss", "val_ppl", "val_tokens", "eval_s")
# The trainer's last line, `run_completed step=N final_loss=.. val_loss=.. base_val_loss=..`, carries the
# exported weights' validation loss (export.from: last or best) and the base model's: what the registry gate
# reads from DescribeTrainingJob's FinalMetricDataList. Metric field -> key on that line (and in the export
# metadata's `evaluation`).
COMPLETION_LINE_PREFIX = "run_completed"
COMPLETION_METRICS = {"exported_val_loss": "val_loss", "base_val_loss": "base_val_loss"}
METRIC_PREFIX = "train:"
_NUMBER = r"([0-9.eE+-]+)"
# The trainer's first line of each start, `run_start params=.. ... start_step=N total_steps=M device=..`: the run's
# length, which `spotrun status` and local progress show beside the step.
RUN_START_PREFIX = "run_start"
_METRIC_LINE = re.compile(r"^step=(?P<step>\d+)" + "".join(rf" {n}=(?P<{n}>\S+)" for n in METRIC_FIELDS) + r"$")
_EVAL_LINE = re.compile(rf"^{EVAL_LINE_PREFIX} step=(?P<step>\d+)"
                        + "".join(rf" {n}=(?P<{n}>\S+)" for n in EVAL_METRIC_FIELDS) + r"$")
_TOTAL_STEPS = re.compile(rf"^{RUN_START_PREFIX} .*\btotal_steps=(\d+)\b")


def format_metric_line(step: int, *, loss: float, lr: float, grad_norm: float, tokens_per_s: float,
                       mfu: float | None, mem_gb: float) -> str:
    """The trainer's metric line, `step=120 loss=2.3100 lr=1.900e-05 grad_norm=0.8200 tokens_per_s=3150 mfu=0.410
    mem_gb=61.20` (`mfu=na` when the device's peak is unknown)."""
    mfu_text = "na" if mfu is None else f"{mfu:.3f}"
    return (f"step={step} loss={loss:.4f} lr={lr:.3e} grad_norm={grad_norm:.4f} "
            f"tokens_per_s={tokens_per_s:.0f} mfu={mfu_text} mem_gb={mem_gb:.2f}")


def parse_metric_line(line: str) -> dict | None:
    """The fields of a metric line as numbers (`step` an int, mfu None when `na`), or None if the line is not one."""
    m = _METRIC_LINE.match(line.strip())
    if not m:
        return None
    return {"step": int(m["step"]), **{n: None if m[n] == "na" else float(m[n]) for n in METRIC_FIELDS}}


def format_eval_line(step: int, *, val_loss: float, val_ppl: float, val_tokens: int, eval_s: float) -> str:
    """The trainer's evaluation line, `eval step=120 val_loss=2.4100 val_ppl=11.13 val_tokens=65536 eval_s=3.20`."""
    return (f"{EVAL_LINE_PREFIX} step={step} val_loss={val_loss:.4f} val_ppl={val_ppl:.4g} val_tokens={val_tokens} "
            f"eval_s={eval_s:.2f}")


def parse_eval_line(line: str) -> dict | None:
    """The fields of an evaluation line as numbers, or None if the line is not one."""
    m = _EVAL_LINE.match(line.strip())
    if not m:
        return None
    return {"step": int(m["step"]), **{n: float(m[n]) for n in EVAL_METRIC_FIELDS}}


def run_start_total_steps(line: str) -> int | None:
    """The run's total_steps from the trainer's `run_start` line, or None if the line is not one."""
    m = _TOTAL_STEPS.match(line.strip())
    return int(m[1]) if m else None


def metric_name(field: str) -> str:
    """The CloudWatch metric name of one field of the trainer's metric, evaluation or completion line (`loss` ->
    `train:loss`, `val_loss` -> `train:val_loss`, `exported_val_loss` -> `train:exported_val_loss`)."""
    known = METRIC_FIELDS + EVAL_METRIC_FIELDS + tuple(COMPLETION_METRICS)
    if field not in known:
        raise ValueError(f"metric field {field!r} is unknown: expected one of {', '.join(known)}")
    return METRIC_PREFIX + field


# SageMaker MetricDefinitions: Name + Regex with one capture group, applied to the trainer's log lines
# `step=120 loss=2.3100 lr=1.9e-05 grad_norm=0.82 tokens_per_s=3150 mfu=0.41 mem_gb=61.2` (the `\b` keeps
# `loss` from matching inside `val_loss`: `_` is a word character) and the evaluation lines.
TRAIN_METRIC_DEFINITIONS: list[dict[str, str]] = [
    {"Name": metric_name(name), "Regex": rf"step=\d+ .*\b{name}={_NUMBER}"} for name in METRIC_FIELDS
]
EVAL_METRIC_DEFINITIONS: list[dict[str, str]] = [
    {"Name": metric_name(name), "Regex": rf"{EVAL_LINE_PREFIX} step=\d+ .*\b{name}={_NUMBER}"}
    for name in ("val_loss", "val_ppl")
] + [
    {"Name": metric_name(name), "Regex": rf"{COMPLETION_LINE_PREFIX} .*\b{key}={_NUMBER}"}
    for name, key in COMPLETION_METRICS.items()
]
METRIC_DEFINITIONS = TRAIN_METRIC_DEFINITIONS + EVAL_METRIC_DEFINITIONS

# Metrics the Lambdas publish (CloudWatch Embedded Metric Format), read by the dashboard and the alarm.
METRICS_NAMESPACE = "spotrun"
RUN_COST_METRIC = "RunCostUSD"
CHECKPOINT_AGE_METRIC = "CheckpointAgeSeconds"
CHECKPOINT_OVERDUE_METRIC = "CheckpointOverdue"  # age / (2 x planned interval + upload time); alarm at >= 1
INTERRUPTIONS_METRIC = "Interruptions"

# Tags the estimate sets on every training job (a run may not set them): cost allocation and identity, and the
# shape and method that match a finished job's measured MFU to later estimates (spotrun/planner/measured.py).
SHAPE_TAG, METHOD_TAG = "spotrun:shape", "spotrun:method"
EXECUTION_TAG = "execution"  # the execution's name: what makes a job this execution's (guard, canceller)
# The run's name: a tag of every job and the session tag its training job's credentials carry (the launch function,
# spotrun/pipeline/launch.py; the execution role's S3 grants name ${aws:PrincipalTag/run}).
RUN_TAG = "run"
# What an execution trained, beside its checkpoints (checkpoints/<run>/<execution>/): written by the estimate (and
# `spotrun start`), checked on resume_from (spotrun/pipeline/preflight.py).
RUN_RECORD = "spotrun-run.json"
# History events an execution may have used before its first poll (its states up to the first job, a preparation's
# polls included: MAX_PREPARATION_POLLS x 9 in spotrun/pipeline/preparation.py), generously: the construct writes it
# into the first guard, whose count decides when a chain continues in a fresh execution (pipeline/continuation.py).
FIRST_EXECUTION_EVENTS = 3_000
PIPELINE_TAG_KEYS = ("project", "stage", "cost-center", "run", EXECUTION_TAG, METHOD_TAG, SHAPE_TAG)

# ---- the deployed stack (stacks/ -> the CLI) -------------------------------------------------------------------

STACK_ID = "Spotrun"  # stacks/stage.py: one stack per stage, which CDK names <stage>-Spotrun


def stack_name(stage: str) -> str:
    """The CloudFormation name CDK gives SpotrunStack (id STACK_ID) inside SpotrunStage (id = the stage)."""
    return f"{stage}-{STACK_ID}"


# SageMaker's log group of training jobs; each job's streams are <job name>/algo-N-... (the CLI's `logs`, the people
# policies: training_constructs/people_policies.py).
TRAINING_LOG_GROUP = "/aws/sagemaker/TrainingJobs"


class StackOutput(str, Enum):
    """The stack's outputs the CLI reads (`spotrun start|status|...`, `spotrun validate --stage`)."""

    ARTIFACT_BUCKET = "ArtifactBucket"
    STATE_MACHINE_ARN = "StateMachineArn"
    FAILURES_TOPIC_ARN = "FailuresTopicArn"
    DASHBOARD_NAME = "DashboardName"
    MODEL_PACKAGE_GROUP_NAME = "ModelPackageGroupName"
    # The estimate function's environment as JSON: `spotrun start` validates with exactly the stage's settings
    # (job prefix, allowed instance types, tags) before it starts anything.
    ESTIMATE_SETTINGS = "EstimateSettings"
    # The role `spotrun deploy` gives the endpoint's model (training_constructs/serving_role.py).
    SERVING_ROLE_ARN = "ServingRoleArn"
    # The managed policies for people (training_constructs/people_policies.py): to attach, not read by the CLI.
    DEPLOYER_POLICY_ARN = "DeployerPolicyArn"
    RUN_USER_POLICY_ARN = "RunUserPolicyArn"
    APPROVER_POLICY_ARN = "ApproverPolicyArn"


# ---- stop notice (SageMaker -> launcher -> trainer) ------------------------------------------------------------


class StopNotice:
    """How the ~120 s between SIGTERM and SIGKILL (StopTrainingJob, MaxRuntime; assumed for spot) is spent."""

    NOTICE_S = 120  # SageMaker: SIGTERM, then 120 s before the container is killed
    UPLOAD_S = 90  # what a save on notice may take to leave the machine
    FINISH_S = 30  # finishing the current step and shutting down (what a save on notice must leave)
    LAUNCHER_SHUTDOWN_S = 110  # torchrun's --shutdown-timeout: > the save budget, < the notice


# ---- bytes per parameter (planner, trainer, docs) --------------------------------------------------------------


class BytesPerParameter:
    """The trainer's precision scheme: FSDP2 keeps sharded parameters in fp32 (bf16 only in the gathered copies),
    reduces and keeps gradients in fp32, AdamW adds two fp32 moments; DCP checkpoints the fp32 shards and moments."""

    TRAINING_STATE_FULL = 16  # fp32 param 4 + fp32 grad 4 + Adam moments 8
    TRAINING_STATE_FROZEN = 2  # LoRA: a frozen base parameter, kept in the compute dtype (bf16 on GPU; fp32 on CPU)
    TRAINING_STATE_ADAPTER = 16  # LoRA: an adapter parameter, as a full one
    # DCP adds a ~1.6 KB header per saved tensor chunk and its .metadata (tests/trainer/test_planned_bytes.py)
    CHECKPOINT_FULL = 12  # fp32 param 4 + Adam moments 8
    CHECKPOINT_LORA = 12  # per adapter parameter: fp32 4 + Adam moments 8
    EXPORT_BF16 = 2


# ---- checkpoint layout (trainer writes, guard lists) -----------------------------------------------------------

# The trainer's export metadata beside the exported model (spotrun_trainer/export.py writes it; the registry step
# reads it): kind full | lora_adapter, whether and which base model it needs, LoRA settings, weights dtype.
EXPORT_METADATA = "spotrun-export.json"
# Greedy sample generations from fixed validation prompts, base vs fine-tuned, beside the exported model
# (spotrun_trainer/samples.py writes it; the report and the registry's metadata point at it).
SAMPLES_FILE = "samples.json"

# Under the checkpoint directory (mirrored to one S3 prefix): `step-00000120/` per save, its `manifest.json`
# written last (spotrun_trainer/checkpoint.py: the commit protocol); the guard dates the newest manifest in S3.
CHECKPOINT_MANIFEST = "manifest.json"
CHECKPOINT_STEP_PREFIX = "step-"
CHECKPOINT_STEP_DIR = re.compile(rf"^{CHECKPOINT_STEP_PREFIX}(\d{{8}})$")  # group 1: the step


def checkpoint_step_dir(step: int) -> str:
    """The directory name of step N's checkpoint (`step-00000120`); CHECKPOINT_STEP_DIR matches it."""
    return f"{CHECKPOINT_STEP_PREFIX}{step:08d}"


# ---- prepared datasets (prepare writes; the trainer, `spotrun prepare`/`upload` and the estimate read) --------


class DatasetIndex:
    """The prepared dataset's index (spotrun_trainer/data.py writes and reads it; its docstring has the layout):
    the file name, the format version, and the keys read outside the trainer."""

    FILE = "index.json"
    FORMAT = 1
    TOTAL_TOKENS = "total_tokens"
    SHARDS = "shards"
    DOCUMENTS = "documents"
    VOCAB_SIZE = "vocab_size"  # len(tokenizer) at prepare time: every token id is below it
    VALIDATION = "validation"  # {"dir": "validation", "fraction": f, "documents": n} when prepare split the data
    # The identity of the tokenizer the shards were made with (`tokenizer_identity` of the directory given to
    # prepare); the estimate compares it with model.source's before anything is paid for.
    TOKENIZER = "tokenizer_sha256"


# What decides the token ids of a text: tokenizer.json when the directory has one (the fast tokenizer's whole
# definition), else the slow tokenizers' vocabulary files. Configuration (tokenizer_config.json, special tokens
# map, chat template) is left out: it does not change which id a piece of text gets.
TOKENIZER_DEFINITION = "tokenizer.json"
TOKENIZER_VOCABULARY_FILES = ("tokenizer.model", "spiece.model", "vocab.json", "merges.txt", "vocab.txt")


def tokenizer_identity(chunks_of: Mapping[str, Callable[[], Iterable[bytes]]]) -> str | None:
    """A tokenizer's identity: `sha256:<hex>` over the bytes of its defining files (tokenizer.json, else the
    vocabulary files present, each with its name), or None when the directory has none of them. `chunks_of`:
    the directory's file names -> a function giving that file's bytes in chunks (a local file or an S3 object:
    nothing is parsed, so a Lambda can hash a 30 MB tokenizer.json in little memory). Two directories whose
    defining files have the same bytes tokenize alike; a copy re-saved by another library version may differ in
    bytes and is then told apart (conservatively)."""
    names = [TOKENIZER_DEFINITION] if TOKENIZER_DEFINITION in chunks_of else \
        [n for n in TOKENIZER_VOCABULARY_FILES if n in chunks_of]
    if not names:
        return None
    digest = hashlib.sha256()
    for name in names:
        digest.update(f"\0{name}\0".encode())
        for chunk in chunks_of[name]():
            digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


def directory_tokenizer_identity(directory: str) -> str | None:
    """`tokenizer_identity` of a local directory (None when it is not one or holds no defining file)."""
    def chunks(path: str) -> Iterable[bytes]:
        with open(path, "rb") as fh:
            while chunk := fh.read(1 << 20):
                yield chunk

    if not os.path.isdir(directory):
        return None
    paths = {name: os.path.join(directory, name) for name in os.listdir(directory)}
    return tokenizer_identity({name: (lambda p=path: chunks(p)) for name, path in paths.items()
                               if os.path.isfile(path)})


# ---- preparation of raw data (the estimate plans it, the trainer's prepare runs it, the constructs wire it) -----

PREPARED_PREFIX = "datasets/_prepared/"  # not a dataset name (those start with a letter or digit)
PARTS_DIR = "parts"  # each processing instance writes its part under <prefix>parts/<host>/
PREPARE_MARKER = "spotrun-prepare.json"  # written last (`spotrun prepare`, the finish step): complete from then on
# What a model directory holds besides its tokenizer: never hashed into a content key, never downloaded to prepare.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".onnx", ".ckpt")
# The raw formats the trainer's prepare reads (spotrun_trainer.data imports this one definition).
RAW_SUFFIXES = (".txt", ".jsonl", ".jsonl.gz", ".parquet")
DEFAULT_SHARD_BYTES = 256 * 1024 * 1024
# SageMaker Processing's container paths: inputs under /opt/ml/processing/input/<name>, the output directory.
PROCESSING_DATA_INPUT = "data"
PROCESSING_TOKENIZER_INPUT = "tokenizer"
PROCESSING_OUTPUT = "output"
FINISH_PREPARED, FINISH_FAILED = "prepared", "failed"  # the finish step's status (the state machine branches on it)
# Hub models (model.source hf://org/name[@revision]): fetched by a preparation job of kind PREPARE_MODEL into
# HUB_MODELS_PREFIX<org>/<name>/<revision>/ with HUB_MANIFEST beside the files (spotrun/pipeline/hub.py).
PREPARE_DATA, PREPARE_MODEL = "data", "model"  # Preparation.kind: the state machine's Choice branches on it
HUB_MODELS_PREFIX = "models/_hub/"  # not a model name (`spotrun upload-model` names start with a letter or digit)
HUB_MANIFEST = "spotrun-hub.json"  # the fetched commit and each file's size and SHA-256
PROCESSING_MODEL_OUTPUT = "model"  # the fetch job's output directory under /opt/ml/processing/


@dataclasses.dataclass(frozen=True)
class PreparationSettings:
    """The stage's preparation instances (stacks/config.py); priced from the catalog's processing rates."""

    instance_type: str = "ml.m5.xlarge"
    instance_count: int = 2
    max_runtime_seconds: int = 24 * 3600
    volume_gb: int = 100
    shard_bytes: int = DEFAULT_SHARD_BYTES

    ENV = {"instance_type": "PREPARE_INSTANCE_TYPE", "instance_count": "PREPARE_INSTANCE_COUNT",
           "max_runtime_seconds": "PREPARE_MAX_RUNTIME_SECONDS"}

    def to_env(self) -> dict[str, str]:
        return {name: str(getattr(self, attr)) for attr, name in self.ENV.items()}

    @classmethod
    def from_env(cls, env: dict[str, str]) -> PreparationSettings:
        default = cls()
        return cls(instance_type=env.get(cls.ENV["instance_type"], default.instance_type),
                   instance_count=int(env.get(cls.ENV["instance_count"], default.instance_count)),
                   max_runtime_seconds=int(env.get(cls.ENV["max_runtime_seconds"], default.max_runtime_seconds)))


@dataclasses.dataclass(frozen=True)
class Preparation:
    """What the state machine's CreateProcessingJob takes from the estimate (status Prepare: `$.plan.preparation`),
    and what the finish step reads back."""

    job_name: str
    key: str
    raw_source: str
    output_uri: str
    bucket: str
    prefix: str  # datasets/_prepared/<key>/
    instance_type: str
    instance_count: int
    usd_per_hour: float  # all instances, the catalog's processing rate
    max_runtime_seconds: int
    processing_resources: dict
    processing_inputs: list
    processing_outputs: list
    entrypoint: list
    stopping_condition: dict
    tags: list
    poll_seconds: int
    files: int
    kind: str = PREPARE_DATA  # PREPARE_MODEL: a hub model fetched into prefix (raw_source is the hub id)
    # What this execution's earlier preparation billed (a hub model's fetch before its raw data's preparation): the
    # finish step adds it to the Prepared's cost_usd, so the plan after the last preparation counts every job's bill.
    earlier_usd: float = 0.0


PREPARATION_FIELDS = frozenset(f.name for f in dataclasses.fields(Preparation))


def preparation_path(field: str, *sub: str) -> str:
    """`$.plan.preparation.<field>` (the estimate's Prepare output) for the state machine; refuses unknown fields."""
    if field not in PREPARATION_FIELDS:
        raise ValueError(f"preparation field {field!r} is unknown: expected one of "
                         f"{', '.join(sorted(PREPARATION_FIELDS))}")
    return ".".join(("$.plan.preparation", field, *sub))


# ---- plan and guard (handlers -> state machine) ----------------------------------------------------------------


class PlanStatus(str, Enum):
    OK = "ok"
    INVALID_RUN = "InvalidRun"
    OVER_BUDGET = "OverBudget"
    # data.source is raw text: prepare it first (spotrun/pipeline/preparation.py: `preparation` holds the job), then
    # estimate again on the prepared shards.
    PREPARE = "Prepare"


class GuardAction(str, Enum):
    WAIT = "wait"  # the job runs and the spend stays under the cap until the next poll
    STOP = "stop"  # StopTrainingJob now (the trainer saves on the way out), then keep polling
    # The job ended with its exact bill and the run is not done: create the next segment's job (guard.job_name,
    # guard.spot, guard.max_runtime_seconds, ...) on the same checkpoints (spotrun/planner/segments.py).
    SEGMENT = "segment"
    FALLBACK = "fallback"  # spot never came within MaxWait: the next segment on-demand (a SEGMENT with spot off)
    # The next segment (as SEGMENT) in a fresh execution of the state machine, named guard.next_execution: this
    # one's history might not hold it (spotrun/pipeline/continuation.py).
    CONTINUE = "continue"
    COMPLETED = "completed"  # register the model; `report` is the cost report
    OVER_BUDGET = "over_budget"  # the job stopped at the cap
    FAILED = "failed"  # the job failed or stopped for another reason; `message` says why
    GATE_FAILED = "gate_failed"  # the job completed but its validation loss fails registry.gate: not registered


class _StateJson:
    """What the state machine carries between states as JSON, decoded at a handler's entry (`from_json`: a clear
    error for a malformed one) and encoded on the way out (`to_json`: enums as their values)."""

    def to_json(self) -> dict:
        return {f.name: _json_value(str(f.type), getattr(self, f.name))
                for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    @classmethod
    def from_json(cls, obj: object, what: str = ""):  # the subclass
        what = what or cls.__name__.lower()
        fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        if not isinstance(obj, dict):
            raise ValueError(f"{what}={_short(obj)} is invalid: expected an object with the fields of "
                             f"spotrun.seams.{cls.__name__}")
        unknown = sorted(set(obj) - set(fields))
        missing = sorted(n for n, f in fields.items() if n not in obj and f.default is dataclasses.MISSING
                         and f.default_factory is dataclasses.MISSING)
        if unknown or missing:
            raise ValueError(f"{what} is invalid: expected the fields of spotrun.seams.{cls.__name__}"
                             + (f"; missing: {', '.join(missing)}" if missing else "")
                             + (f"; unknown: {', '.join(unknown)}" if unknown else ""))
        return cls(**{n: _state_value(cls, what, n, str(fields[n].type), v) for n, v in obj.items()})


def section_json(section: _StateJson | None) -> dict:
    """A section of the estimate as JSON: an absent one (None: no spot policy chosen yet, as in a refused run's
    estimate) is `{}`, as the estimate has always written it; `from_json` reads `{}` back as None."""
    return {} if section is None else section.to_json()


def _json_value(kind: str, value: object) -> object:
    if isinstance(value, _StateJson) or (value is None and kind.removesuffix(" | None") in _sections()):
        return section_json(value)  # type: ignore[arg-type]
    return value.value if isinstance(value, Enum) else copy.deepcopy(value)


def _sections() -> dict[str, type]:
    """The nested dataclasses a state's JSON holds, by their annotation's name."""
    return {"PlanEstimate": PlanEstimate, "SpotPolicy": SpotPolicy, "SegmentPlan": SegmentPlan}


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


_JSON_KINDS = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,), "dict": (dict,),
               "list": (list,)}


def _state_value(cls: type, what: str, name: str, kind: str, value: object) -> object:
    optional = kind.endswith(" | None")
    kind = kind.removesuffix(" | None")
    nested = _sections().get(kind)
    if (value is None or (nested is not None and value == {})) and optional:
        return None
    if nested is not None:
        return nested.from_json(value, f"{what}.{name}")
    enum = {"PlanStatus": PlanStatus, "GuardAction": GuardAction}.get(kind)
    if enum is not None:
        try:
            return enum(value)
        except ValueError:
            raise ValueError(f"{what}.{name}={_short(value)} is invalid: expected one of "
                             f"{', '.join(m.value for m in enum)}") from None
    types = _JSON_KINDS.get(kind)
    if types is not None and (not isinstance(value, types) or (isinstance(value, bool) and bool not in types)):
        raise ValueError(f"{what}.{name}={_short(value)} is invalid: expected {kind}"
                         + (" or null" if optional else "") + f" (spotrun.seams.{cls.__name__})")
    return value


@dataclasses.dataclass(frozen=True)
class SegmentPlan(_StateJson):
    """The planned chain of training jobs (spotrun/planner/segments.py `plan_segments`), from expected figures (the
    guard recomputes it from the real bills at each boundary): the estimate's `segments`."""

    segments: int
    first_max_runtime_seconds: int
    longest_seconds: int  # no job runs longer (the single job's MaxRuntime)
    min_segment_seconds: int  # the shortest segment that trains: a restart, one step, a save and the margin
    overhead_seconds: float  # one segment restart (provisioning, image, data, model load, restore, final save)
    overhead_fraction: float  # the chain's restarts over the single job's time
    spot_cost_usd: float | None  # the expected bill with the restarts; null when no chain fits the cap
    # the single job's bound at on-demand rates (what one job would need: its start, the work, its save and end, a
    # stop), to the cent up: the one-job cap where SageMaker's longest job holds the run
    on_demand_bound_usd: float
    fits: bool
    line: str
    spot_fraction: float = 1.0  # the expected bill's share of on-demand (the guard's chain uses it)
    min_cap_usd: float = 0.0  # the smallest cap whose expected chain fits
    # spotrun/planner/segments.py `ChainCosts`' fields: what `finish_cap_usd` plans a bill's chain with
    chain_costs: dict = dataclasses.field(default_factory=dict)
    work_seconds: float = 0.0  # the training the chain carries (`segments_at` plans it at another cap)
    # the chain has more than one job: the smallest cap at which it is one job, and its expected bill there (null:
    # the run is one job, or no chain fits, or no one job holds it)
    one_job_cap_usd: float | None = None
    one_job_expected_usd: float | None = None


@dataclasses.dataclass(frozen=True)
class SpotPolicy(_StateJson):
    """The estimate's spot policy (spotrun/policy/choose.py `spot_policy` chooses it; `spot_policy_at_caps` adds
    the cap to set): the policy the cost guard executes and every candidate's odds."""

    chosen: str  # the chosen candidate's label
    why: str
    p95_finish_cap_usd: float | None  # the P95 finish cap (the cap to set where no deadline warning names one)
    confidence: float | None  # the P(deadline) a policy must reach (None without a deadline)
    traces: int
    seed: int
    trace_source: str
    policies: list  # every candidate's simulated row (spotrun/policy/engine.py `Summary.row`, rounded)
    left_out: list  # the labels of the candidates the cap left out
    policy: str  # the chosen rule (spotrun/policy/decision.py)
    checkpointing: str
    # spotrun/policy/engine.py `SimPlan`'s fields: the constants the rule decides with; its `deadline_s` is the
    # run's compute.deadline_hours in seconds, the plan's one copy of it
    sim_plan: dict
    p95_finish_policy: str | None = None  # the policy whose P95 bill the cap to set finishes (the run as one job)
    p95_one_job_usd: float | None = None  # that P95 bill: what to expect, the cap to set holds it and more
    # the part of that P95 bill billed at on-demand rates (all of it with compute.spot=false or on_demand chosen);
    # the cap to set takes it at on-demand rates only where the policy never bills spot (segments.py `finish_cap_usd`)
    p95_one_job_on_demand_usd: float | None = None
    # where a policy that can run spot billed its P95 (partly) on-demand: the cap that bill needs on-demand throughout
    # (what compute.spot=false is told for it); the cap to set takes it at the spot share (null otherwise)
    p95_on_demand_finish_cap_usd: float | None = None
    deadline_cap_usd: float | None = None  # the deadline warning's cap (at least the finish cap): the cap to set
    # the cap to set is raised over the P95 finish cap to the smallest whose chain is one job: a longer chain's
    # restarts lower the deadline's odds (spotrun/policy/choose.py `_deadline_odds_kept`)
    p95_finish_keeps_deadline: bool = False
    # the chosen policy's row (`policies`' shape) simulated at the cap to set, which proves it: there the estimate
    # chooses that policy and it keeps its odds (spotrun/policy/choose.py `_settled_cap`); null where none was
    cap_to_set_row: dict | None = None
    cap_to_set_least: bool = False  # that search ended to the cent (else on its budget of simulations)
    # whether the guard runs a sentinel for the chosen policy (spotrun/policy/decision.py `sentinel_settings`):
    # {"used": false}, or {"used": true, "stint_s": ..., "poll_s": ...}
    sentinel: dict = dataclasses.field(default_factory=lambda: {"used": False})
    # the cap to set splits the run into a chain of more than one job (null otherwise): that chain's jobs and
    # expected bill, and the smallest cap at which the run is one job with its expected bill there
    cap_to_set_jobs: int | None = None
    cap_to_set_expected_usd: float | None = None
    one_job_cap_usd: float | None = None
    one_job_expected_usd: float | None = None
    # the candidates of `left_out` whose P95 bill is within the cap but whose run needs more to finish (an on-demand
    # policy's jobs at on-demand rates: spotrun/policy/choose.py `finish_caps`): label -> that cap
    left_out_finish_caps: dict = dataclasses.field(default_factory=dict)
    # the cap to set, the one the text names (the spot policy's last line): `deadline_cap_usd` where the deadline
    # warning names one, else `p95_finish_cap_usd` (null: none named)
    cap_to_set_usd: float | None = None
    # the layout ("1 x ml.p5.48xlarge") the estimate at the cap to set runs, where it is not this estimate's: a spot
    # run with a deadline ranks its layouts at its cap, so the cap to set is the one at which the layouts ranked
    # take the layout it was searched on (spotrun/policy/choose.py `_settled_layout`); null: this estimate's layout
    cap_to_set_layout: str | None = None
    # where the layouts ranked at the caps to set never settle (A's cap brings B, B's brings A, or they move past
    # spotrun/policy/choose.py's LAYOUT_SETTLE_TRIES): each layout searched, {"layout", "cap_to_set_usd", "brings"},
    # this estimate's first; the cap to set is then this layout's, and `cap_to_set_layout` and `cap_to_set_row` are
    # the layout and the chosen policy's row the estimate at it takes (`_settled_layout`); null: they settled
    cap_to_set_unsettled: list | None = None
    # where some of the chosen policy's runs wait out MaxWait with no spot capacity (a spot run without on-demand
    # fallback): each remedy simulated with the estimate's traces and the chosen policy, {"setting", "value",
    # "p_finished"} (the share of runs that finish there): compute.on_demand_fallback=true, a longer
    # compute.accepted_delay_hours (compute.max_wait_hours where the run gives it), and budget.max_usd at the cap
    # from which the job's MaxRuntime is the planner's limit for one job (`value` null, `from_usd` that cap, where
    # the run's cap is at or over it: a larger cap changes nothing); spotrun/policy/choose.py `maxwait_fixes`
    maxwait_fixes: list | None = None
    # `spotrun estimate` alone (null in the estimate Lambda's plan, which never searches it): the cap to set's odds
    # on other draws of the traces and with a slower trainer, and a cap with headroom (spotrun/policy/headroom.py
    # `cap_to_set_headroom`); null also where no cap to set was proven on this estimate's layout
    cap_to_set_headroom: dict | None = None
    # the odds the cap to set holds, proven at it (`cap_to_set_row`): "P(deadline)" (with a deadline the run as one
    # job meets on some trace) and "finish share" (the share of its runs that finish), each at least the run's as
    # one job or the confidence, 99%, if less (spotrun/policy/choose.py `_needed`); null where none was proven
    cap_to_set_holds: list | None = None


@dataclasses.dataclass(frozen=True)
class PlanEstimate(_StateJson):
    """The planner's figures the plan carries (`Plan.estimate`; spotrun/planner/outputs.py `Estimate` holds them
    all): what the report, the registry's metadata and the cost guard read, and a refused run's `estimate`."""

    parameters: int
    trainable_parameters: int
    training_flops: float
    gpu_hours: float
    instance_type: str
    instance_count: int
    max_runtime_seconds: int
    max_wait_seconds: int
    checkpoint_bytes: int
    spot_policy: SpotPolicy | None  # the policy the guard executes (None, `{}` in JSON: none chosen)
    notice_upload_gb_per_s: float
    checkpoint_interval_s: int
    cost_usd: dict  # {"spot", "on_demand"}: the expected bills
    warnings: list
    utilization: float
    utilization_source: str
    segments: SegmentPlan  # how the cap holds
    wall_seconds: float
    expected_overhead_seconds: float  # the expected interruptions' cost in wall seconds (the guard's pace)
    checkpoint_policy: str
    tokens: float
    expected_interruptions: float
    evaluation_seconds: float
    # samples per optimizer step on the planned layout (its GPUs x training.micro_batch x training.grad_accum): what
    # `spotrun local` keeps on its workers (spotrun/local/batch.py); 0 in a plan of an older spotrun
    global_batch_samples: int = 0


PLAN_ESTIMATE_FIELDS = tuple(f.name for f in dataclasses.fields(PlanEstimate))


@dataclasses.dataclass(frozen=True)
class Plan(_StateJson):
    """The estimate's output when status is ok: every value the state machine puts into a request."""

    status: PlanStatus
    run_name: str
    execution: str
    execution_started: str  # ISO-8601, from $$.Execution.StartTime: a job created before it is not ours
    job_name: str
    fallback_job_name: str
    method: str  # full or lora: what the registered artifact is
    spot: bool
    on_demand_fallback: bool
    instance_type: str
    instance_count: int
    resource_config_spot: dict  # ResourceConfig as sent (VolumeKmsKeyId only without local storage)
    resource_config_on_demand: dict  # the same plus the warm pool
    checkpoint_s3_uri: str
    checkpoint_bucket: str
    checkpoint_prefix: str
    max_runtime_seconds: int
    max_wait_seconds: int
    hyperparameters: dict
    input_data_config: list
    tags: list
    poll_seconds: int
    max_poll_seconds: int
    checkpoint_upload_seconds: float  # the planned time for one checkpoint to reach S3
    max_usd: float
    max_runtime_cap_seconds: int  # no job of the run runs longer (the single job's MaxRuntime)
    max_wait_extra_seconds: int  # a spot job's MaxWait beyond its MaxRuntime (the accepted delay)
    min_segment_seconds: int  # the shortest segment that trains (a restart, a step, a save); informational
    segment_overhead_seconds: float  # one segment restart (spotrun/planner/segments.py)
    warm_pool_seconds: int  # KeepAlivePeriodInSeconds of the on-demand jobs (billed after each one ends)
    planned_steps: int  # optimizer steps of the whole run, as planned
    seconds_per_step: float  # planned training seconds per step (interruptions' expected cost included)
    region: str
    usd_per_hour: float  # on-demand list price of all instances, in `region`
    price_source: str  # prose for messages; never sent as registry metadata (its characters do not fit)
    price_as_of: str  # the catalog's date for the region's prices
    approval_status: str
    data_source: str
    estimate: PlanEstimate
    gate: dict = dataclasses.field(default_factory=dict)  # registry.gate's bounds (spotrun/pipeline/gate.py); {}: none
    # CreateTrainingJob's EnableNetworkIsolation: on, unless the run names a tracking server (one the stage lists)
    # or a W&B project, which the trainer must reach (spotrun_trainer/tracking.py, wandb_tracking.py).
    network_isolation: bool = True
    # CreateTrainingJob's MlflowConfig {MlflowResourceArn, MlflowExperimentName, MlflowRunName} for a run naming a
    # SageMaker AI MLflow tracking server by ARN (spotrun/pipeline/assembly.py mlflow_config); {}: none, the field is
    # not sent (the state machine's untracked create).
    mlflow_config: dict = dataclasses.field(default_factory=dict)
    # Raw data.source prepared by this execution's Processing job or reused (spotrun.pipeline.preparation.Prepared as a
    # dict; {}: the source was prepared already); its cost is spent before the first training job.
    preparation: dict = dataclasses.field(default_factory=dict)
    spent_before_usd: float = 0.0
    # A spot job's expected bill as a share of on-demand (1 - the spot discount): the guard plans the chain of the
    # segments still to come with it (spotrun/planner/segments.py); the cap itself is held at on-demand rates.
    spot_fraction: float = 1.0


@dataclasses.dataclass(frozen=True)
class Guard(_StateJson):
    """The cost guard's state, carried from poll to poll and read by the state machine."""

    action: GuardAction
    job_name: str
    spot: bool
    wait_seconds: int
    spent_before_usd: float
    interruptions_before: int
    cost_usd: float = 0.0
    projected_usd: float = 0.0
    interruptions: int = 0
    stop_requested: bool = False  # the cap asked for the stop: the next segment keeps the capacity it had
    # The spot policy asked for the stop (spotrun/policy/decision.py: TO_ON_DEMAND or TO_SPOT): the next
    # segment is on spot when `switch_to_spot`, else on-demand.
    switch_requested: bool = False
    switch_to_spot: bool = False
    # When the guard asks the spot policy again (decision.ask_again): the job status it last decided on
    # (decision.JobStatus) and the recheck time it asked for, in seconds since the execution started (None: never).
    policy_status: str = "none"
    policy_recheck_at: float | None = None
    checkpoint_age_seconds: float | None = None
    worst_checkpoint_gap_seconds: float = 0.0
    message: str = ""
    report: dict | None = None
    # The current job's segment (1 = the first job) and what its CreateTrainingJob sends; `segments` are the
    # finished jobs with their exact bills.
    segment: int = 1
    max_runtime_seconds: int = 0
    max_wait_seconds: int = 0
    hyperparameters: dict | None = None
    segments: list = dataclasses.field(default_factory=list)
    # History events this execution has used so far, counted by the guard (spotrun/pipeline/continuation.py), and the
    # execution that continues the run when the action is CONTINUE.
    history_events: int = 0
    next_execution: str = ""
    # A sentinel (spotrun/policy/decision.py `Decision.sentinel`): a spot job of the run's instance type and count
    # that waits for capacity beside an on-demand job and trains nothing (spotrun/pipeline/guard.py
    # `sentinel_request`). Its name while it exists ("" when none), whether the guard has stopped it, its limits,
    # how many this run has created, their exact bills once ended (also in spent_before_usd), and whether the
    # policy was last asked seeing it with instances (a change asks the policy again, as the simulator does).
    sentinel_name: str = ""
    sentinel_stopping: bool = False
    sentinel_max_runtime_seconds: int = 0
    sentinel_max_wait_seconds: int = 0
    sentinels: int = 0
    sentinel_bills: list = dataclasses.field(default_factory=list)
    policy_seen: bool = False


PLAN_FIELDS = frozenset(f.name for f in dataclasses.fields(Plan))
# What the estimate returns instead when the run must not start (status InvalidRun or OverBudget).
REFUSAL_FIELDS = frozenset({"status", "message", "field", "estimate"})
GUARD_FIELDS = frozenset(f.name for f in dataclasses.fields(Guard))
REPORT_FIELDS = frozenset({"run", "job_name", "status", "method", "instance_type", "instance_count", "spot",
                           "region", "billable_seconds", "training_seconds", "interruptions", "spot_savings_pct",
                           "cost_usd", "price_basis", "cost_basis", "price_region", "price_as_of", "cap_usd",
                           "estimated_cost_usd", "final_loss", "model_data_url", "data_source",
                           "worst_case_lost_usd", "segments", "metadata", "base_val_loss", "exported_val_loss",
                           "gate"})

# The trainer's completion line (`run_completed step=N ...`, spotrun_trainer/train.py) as a SageMaker metric: a
# Completed job whose final metrics carry it finished the run; one without it ended a segment.
COMPLETED_METRIC = "spotrun:completed_step"
COMPLETED_METRIC_DEFINITION = {"Name": COMPLETED_METRIC, "Regex": r"run_completed step=(\d+)"}


def plan_path(field: str) -> str:
    """`$.plan.<field>` for the state machine; refuses a field the estimate does not return."""
    if field not in PLAN_FIELDS | REFUSAL_FIELDS:
        raise ValueError(f"plan field {field!r} is unknown: expected one of {', '.join(sorted(PLAN_FIELDS))}")
    return f"$.plan.{field}"


def guard_path(field: str, *sub: str) -> str:
    """`$.guard.<field>[.<sub>...]`; refuses a field the cost guard does not return (report: its known keys)."""
    if field not in GUARD_FIELDS:
        raise ValueError(f"guard field {field!r} is unknown: expected one of {', '.join(sorted(GUARD_FIELDS))}")
    if field == "report" and sub and sub[0] not in REPORT_FIELDS:
        raise ValueError(f"report field {sub[0]!r} is unknown: expected one of {', '.join(sorted(REPORT_FIELDS))}")
    return ".".join(("$.guard", field, *sub))


# ---- Lambda environments (construct writes, handler reads) -----------------------------------------------------

# Every package is registered for review: approval is a separate, permissioned step (UpdateModelPackage). The
# estimate puts it in the plan; the state machine's CreateModelPackage sends it.
REGISTRATION_STATUS = "PendingManualApproval"
# The execution statuses whose training jobs the canceller stops: its EventBridge rule matches the same.
CANCEL_STATUSES = ("ABORTED", "FAILED", "TIMED_OUT")


def _env_name(f: dataclasses.Field) -> str:
    return f.metadata.get("env", f.name.upper())


def _env_value(cls: type, f: dataclasses.Field, kind: str, text: str) -> object:
    name = _env_name(f)
    try:
        if kind == "int":
            return int(text)
        if kind == "float":
            return float(text)
    except ValueError:
        raise ValueError(f"environment variable {name}={text!r} of {cls.__name__} is invalid: expected "
                         f"{'an integer' if kind == 'int' else 'a number'} ({f.name})") from None
    if kind.startswith("tuple"):
        return tuple(t for t in text.split(",") if t)
    return text


class LambdaEnvironment:
    """A function's environment as a frozen dataclass: the construct writes `to_env()`, the handler (at its entry
    point, nowhere below) reads `from_env(os.environ)`. A field's variable is its name in capitals unless its
    metadata names another (`env`); tuples are comma-separated; a field marked `runtime` is set by Lambda itself
    (AWS_REGION, a reserved variable) and never written."""

    def to_env(self) -> dict[str, str]:
        out = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            if f.metadata.get("runtime"):
                continue
            value = getattr(self, f.name)
            out[_env_name(f)] = ",".join(value) if isinstance(value, (tuple, list)) else str(value)
        return out

    @classmethod
    def from_env(cls, env: Mapping[str, str]):  # the subclass
        values = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            name = _env_name(f)
            if name in env:
                values[f.name] = _env_value(cls, f, str(f.type), env[name])
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"environment variable {name} is missing: {cls.__name__} needs it ({f.name}); "
                                 f"the construct sets it (to_env)")
        return cls(**values)


@dataclasses.dataclass(frozen=True)
class PipelineSettings(LambdaEnvironment):
    """The deployment's facts the estimate plans with (spotrun/pipeline/plan.py): the estimate function's environment,
    which the stack also outputs (StackOutput.ESTIMATE_SETTINGS) so that `spotrun start` plans with the same."""

    bucket: str = dataclasses.field(metadata={"env": "BUCKET_NAME"})  # the artifact bucket
    job_prefix: str  # every training job's name starts with it (IAM scopes the stage's jobs by it)
    model_package_group: str
    poll_seconds: int = 60  # the cost guard's shortest wait between polls
    project: str = "spotrun"  # tags of every job: project, stage, cost-center
    stage: str = ""
    cost_center: str = ""
    region: str = dataclasses.field(default="us-east-1", metadata={"env": "AWS_REGION", "runtime": True})
    max_poll_seconds: int = 4 * 3600
    volume_kms_key_arn: str = ""  # sent only for instance types without local storage
    allowed_instance_types: tuple[str, ...] = ()  # empty: every type of the catalog
    # The stage's maxima (stacks/config.py); 0: no limit.
    max_usd_per_run: float = 0.0
    max_instances_per_run: int = 0
    max_concurrent_runs: int = 0
    # The MLflow tracking servers a run's tracking.mlflow_uri may name (stacks/config.py); empty: none.
    mlflow_tracking_servers: tuple[str, ...] = ()
    # The Secrets Manager secrets (ARNs) holding W&B API keys a run's tracking.wandb_api_key_secret may name; empty:
    # no W&B (the training role may read only these).
    wandb_api_key_secrets: tuple[str, ...] = ()
    table_name: str = ""  # the interruptions table (spotrun/planner/measured.py); empty: the catalog's figures only


@dataclasses.dataclass(frozen=True)
class CostGuardEnvironment(LambdaEnvironment):
    """The cost guard function's environment: where its embedded metrics go, and the launcher role it creates a
    sentinel job with (as the launch function creates every job: the run's session tag)."""

    metrics_namespace: str = METRICS_NAMESPACE
    stage: str = ""
    launcher_role_arn: str = ""  # empty: the guard creates no sentinel (the policy runs without one)


@dataclasses.dataclass(frozen=True)
class CancelEnvironment(LambdaEnvironment):
    """The canceller function's environment: which jobs are the stage's, and whom to tell."""

    job_prefix: str
    topic_arn: str = ""  # empty: stop without notifying


@dataclasses.dataclass(frozen=True)
class LaunchEnvironment(LambdaEnvironment):
    """The launch function's environment: the role it assumes, tagged with the run, to create training jobs."""

    launcher_role_arn: str


@dataclasses.dataclass(frozen=True)
class RecorderEnvironment(LambdaEnvironment):
    """The interruption recorder function's environment (spotrun/planner/measured.py's items)."""

    table_name: str
    metrics_namespace: str = METRICS_NAMESPACE
    stage: str = ""


@dataclasses.dataclass(frozen=True)
class PrepareEnvironment(LambdaEnvironment):
    """The preparation finish function's environment: the only bucket it writes to."""

    bucket: str = dataclasses.field(metadata={"env": "BUCKET_NAME"})
