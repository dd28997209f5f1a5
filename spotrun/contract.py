"""The run JSON contract (version 1): decoding and validation into typed, frozen objects.

A run JSON is what users write and what a Step Functions execution receives. Every error is one line that names
the field (as a dotted path), the bad value (shortened) and what is accepted: `decode_run` (bytes of a run file)
and `parse_run` (a decoded value, e.g. a Lambda event) raise `RunValidationError` for any input at all, never
another exception. The limits SageMaker applies later (CreateTrainingJob's tag pattern and count, hyperparameter
value length, job names) are checked here, before anything starts. See examples/runs/ for complete files.
"""

from __future__ import annotations

import json
import math
import re
import reprlib
import unicodedata
from dataclasses import dataclass, field
from typing import Any

from .refusal import Refusal
from .seams import PIPELINE_TAG_KEYS, PlanStatus

SCHEMA_VERSION = 1
# NOTE: every pattern is used with fullmatch: `re.match(r"...$")` accepts a trailing newline.
_NAME = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,47}")  # SageMaker job names allow 63; prefix/suffixes are added
_REGISTRY_GROUP = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}")  # CreateModelPackageGroup's EntityName
_S3_URI = re.compile(r"s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/[^\x00-\x1f\x7f]*)?")
APPROVAL_STATUSES = ("PendingManualApproval", "Approved", "Rejected")
METHODS = ("full", "lora")
INITS = ("pretrained", "random")
MAX_RUNTIME_LIMIT_S = 28 * 24 * 3600  # StoppingCondition.MaxRuntimeInSeconds: "The maximum value is 28 days"
_EXECUTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,80}$")  # Step Functions execution names, as the console makes them

MAX_RUN_BYTES = 256 * 1024  # a run is a Step Functions execution input: at most 256 KiB
MAX_DEPTH = 16  # HF configs nest 2-3 levels; deeper input is refused before anything recurses into it
MAX_STRING = 4096  # no field of a run needs more (S3 URIs are <= 1,024)
MAX_INT = 10**18  # integers beyond this are refused (a planner figure must stay a finite float)
HYPERPARAMETER_VALUE_MAX = 2500  # CreateTrainingJob: HyperParameters values <= 2,500 characters (botocore model)
HYPERPARAMETER_KEY_MAX = 256
HYPERPARAMETERS_MAX = 100
# Tags the pipeline sets on every training job itself; a run may not override them.
RESERVED_TAG_KEYS = PIPELINE_TAG_KEYS
MAX_TAGS = 50  # CreateTrainingJob: TagList max 50
MAX_RUN_TAGS = MAX_TAGS - len(RESERVED_TAG_KEYS)

_shorten = reprlib.Repr()
_shorten.maxstring, _shorten.maxother, _shorten.maxlong, _shorten.maxlevel = 60, 60, 40, 2
_shorten.maxdict = _shorten.maxlist = 4


def show(value: Any) -> str:
    """A short, one-line repr of any value (bounded depth, no huge-int conversion, newlines escaped)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"<an integer of about {int(value.bit_length() * 0.30103)} digits>"
    if isinstance(value, _BigNumber):
        return f"<a number of {len(value.text)} digits>"
    try:
        text = _shorten.repr(value)
    except Exception:  # noqa: BLE001 - a value whose repr fails must still give a message
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 80 else text[:77] + "..."


def _key(key: Any) -> str:
    """A key as it appears in a field path: itself when plain, else a shortened repr (one line)."""
    if isinstance(key, str) and re.fullmatch(r"[A-Za-z0-9_\-]{1,40}", key):
        return key
    return show(key)


def join(path: str, key: Any) -> str:
    return f"{path}.{_key(key)}" if path else _key(key)


class RunValidationError(Refusal, ValueError):
    """The run JSON is invalid (status InvalidRun); `.field` is the dotted path of the offending field."""

    def __init__(self, field_path: str, value: Any, accepted: str):
        field_path = field_path if len(field_path) <= 200 else field_path[:197] + "..."
        message = f"{field_path}={show(value)} is invalid: expected {accepted}"
        super().__init__(PlanStatus.INVALID_RUN.value, " ".join(message.splitlines()), field=field_path)


@dataclass(frozen=True)
class ModelSpec:
    source: str | None  # local path or s3:// URI of an HF model directory (its weights and config.json)
    config: dict | None  # inline HF config: the shape to train from random weights, or a copy of the source's
    parameters: int | None  # a plain count (estimates only)
    init: str | None = None  # pretrained: weights from source; random: from training.seed; None: a shape only


@dataclass(frozen=True)
class DataSpec:
    source: str | None  # local path or s3:// URI of prepared token shards (index.json)
    tokens: int | None
    seq_len: int
    validation: str | None = None  # prepared validation shards: the training job's `validation` channel
    # Held-out share of the documents, split by a stable hash at prepare time into <prepared data>/validation
    validation_fraction: float | None = None

    @property
    def has_validation(self) -> bool:
        return self.validation is not None or self.validation_fraction is not None


@dataclass(frozen=True)
class EvalSpec:
    """When the trainer evaluates the validation loss (besides before the first step and at the end)."""

    every_steps: int = 0
    every_minutes: float = 0.0
    max_batches: int = 0  # 0: the whole validation set
    keep_best: bool = False  # keep the lowest-validation-loss checkpoint beside the newest `checkpoint.keep`


@dataclass(frozen=True)
class GateSpec:
    """registry.gate: a model is registered only when its exported weights' validation loss passes every bound given."""

    max_val_loss: float | None = None
    min_improvement: float | None = None  # relative drop against the base model's: (base - final) / base


@dataclass(frozen=True)
class LoraSpec:
    rank: int
    target_modules: tuple[str, ...] | str  # "all-linear" or module names
    alpha: float = 16.0  # scaling = alpha / rank
    dropout: float = 0.0


@dataclass(frozen=True)
class TrainingSpec:
    method: str
    lora: LoraSpec | None
    epochs: float
    micro_batch: int
    grad_accum: int
    lr: float
    seed: int


@dataclass(frozen=True)
class ComputeSpec:
    instance_type: str  # "auto" or an ml.* type
    instance_count: int | None  # None: auto
    spot: bool
    max_wait_hours: float | None  # None: MaxRuntime + accepted_delay_hours
    accepted_delay_hours: float
    on_demand_fallback: bool
    warm_pool_minutes: int
    utilization: float | None  # measured MFU of an earlier run (None: the catalog default)
    target_hours: float | None  # wall-time goal used to pick instance_count=auto (None: 1 node)
    spot_discount: float | None  # overrides the catalog's
    accept_max_runtime_stop: bool = False  # a run needing > 28 days may start and be stopped at 28 days
    deadline_hours: float | None = None  # the model is needed this long after the start (spotrun/simulate/)


@dataclass(frozen=True)
class CheckpointSpec:
    interval_minutes: float | None  # None: auto (Young/Daly)
    keep: int
    interruptions_per_hour: float | None  # overrides the catalog / recorded rate
    resume_from: str | None = None  # an earlier execution's name: continue its checkpoints (None: start fresh)


@dataclass(frozen=True)
class RunSpec:
    version: int
    name: str
    model: ModelSpec
    data: DataSpec
    training: TrainingSpec
    compute: ComputeSpec
    checkpoint: CheckpointSpec
    max_usd: float
    model_package_group: str | None
    approval_status: str
    tags: dict[str, str] = field(default_factory=dict)
    eval: EvalSpec = field(default_factory=EvalSpec)
    export_from: str = "last"  # last | best (the kept lowest-validation-loss checkpoint)
    gate: GateSpec | None = None


# ---- decoding: bytes of a run file -> a JSON value whose oddities `parse_run` reports by field ------------------


class _BigNumber:
    """An integer literal too long to convert (Python refuses > 4,300 digits); reported by field."""

    def __init__(self, text: str):
        self.text = text


class _DuplicateKeys(dict):
    """An object in which a key appeared more than once (json keeps the last silently); reported by field."""

    duplicate: str = ""


def _pairs(pairs: list[tuple[str, Any]]) -> dict:
    out = _DuplicateKeys()
    for key, value in pairs:
        if key in out and not out.duplicate:
            out.duplicate = key
        out[key] = value
    return out if out.duplicate else dict(out)


def decode_run(data: bytes, name: str = "run") -> Any:
    """The JSON value of a run file's bytes (UTF-8, at most 256 KiB), or RunValidationError naming `run`."""
    if len(data) > MAX_RUN_BYTES:
        raise RunValidationError("run", name, f"a file of at most {MAX_RUN_BYTES:,} bytes (Step Functions' input "
                                 f"limit); this one has {len(data):,}")
    for bom, encoding in ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"),
                          (b"\xff\xfe", "UTF-16"), (b"\xfe\xff", "UTF-16")):
        if data.startswith(bom):
            raise RunValidationError("run", name, f"UTF-8 text (this file is {encoding}: save it as UTF-8)")
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RunValidationError("run", name, f"UTF-8 text (byte {exc.start} is not UTF-8)") from None
    try:
        return json.loads(text, object_pairs_hook=_pairs,
                          parse_int=lambda s: int(s) if len(s) <= 40 else _BigNumber(s))
    except json.JSONDecodeError as exc:
        raise RunValidationError("run", name, f"valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
                                 ) from None
    except RecursionError:
        raise RunValidationError("run", name, f"JSON nested at most {MAX_DEPTH} levels deep") from None


def check_json_tree(raw: Any, root: str = "") -> None:
    """Refuse, by field, what no field accepts: deep nesting, duplicate or non-string keys, non-finite or huge
    numbers, huge or non-UTF-8 strings, non-JSON values. Iterative: safe for any depth."""
    stack = [(raw, root, 0)]
    while stack:
        obj, path, depth = stack.pop()
        where = path or "run"
        if depth > MAX_DEPTH:
            raise RunValidationError(where, "...", f"JSON nested at most {MAX_DEPTH} levels deep")
        if isinstance(obj, dict):
            if isinstance(obj, _DuplicateKeys):
                raise RunValidationError(join(path, obj.duplicate), obj[obj.duplicate],
                                         "each key once in an object (this key appears more than once)")
            for key, value in obj.items():
                if not isinstance(key, str):
                    raise RunValidationError(join(path, key), value, "string keys")
                if len(key) > 256:
                    raise RunValidationError(join(path, key), value, "a field name of at most 256 characters")
                stack.append((value, join(path, key), depth + 1))
        elif isinstance(obj, list):
            if len(obj) > 1000:
                raise RunValidationError(where, obj, "a list of at most 1,000 items")
            stack.extend((value, f"{path}[{i}]", depth + 1) for i, value in enumerate(obj))
        elif isinstance(obj, float):
            if not math.isfinite(obj):
                raise RunValidationError(where, obj, "a finite number (NaN and Infinity are not JSON numbers)")
        elif isinstance(obj, _BigNumber) or (isinstance(obj, int) and not isinstance(obj, bool)
                                             and abs(obj) > MAX_INT):
            raise RunValidationError(where, obj, f"a number of at most {MAX_INT:.0e}")
        elif isinstance(obj, str):
            if len(obj) > MAX_STRING:
                raise RunValidationError(where, obj, f"a string of at most {MAX_STRING:,} characters "
                                         f"(this one has {len(obj):,})")
            try:
                obj.encode("utf-8")
            except UnicodeEncodeError:
                raise RunValidationError(where, obj, "text without lone surrogate escapes (\\ud800-\\udfff)"
                                         ) from None
        elif obj is not None and not isinstance(obj, (bool, int)):
            raise RunValidationError(where, obj, "a JSON value (object, list, string, number, true/false, null)")


# ---- small typed readers -------------------------------------------------------------------------------------


def _obj(raw: Any, path: str, allowed: set[str], required: set[str] = frozenset()) -> dict:
    if not isinstance(raw, dict):
        raise RunValidationError(path or "run", raw, "an object")
    for key in raw:
        if key not in allowed:
            raise RunValidationError(join(path, key), raw[key],
                                     f"no such field; accepted fields: {', '.join(sorted(allowed))}")
    for key in sorted(required):
        if key not in raw:
            raise RunValidationError(join(path, key), None, "a value (this field is required)")
    return raw


def _int(raw: Any, path: str, lo: int, hi: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < lo or raw > hi:
        raise RunValidationError(path, raw, f"an integer in [{lo:,}, {hi:,}]")
    return raw


def _num(raw: Any, path: str, lo: float, hi: float, *, lo_open: bool = False) -> float:
    ok = isinstance(raw, (int, float)) and not isinstance(raw, bool) and math.isfinite(raw)
    ok = ok and (raw > lo if lo_open else raw >= lo) and raw <= hi
    if not ok:
        bound = f"> {lo}" if lo_open else f">= {lo}"
        raise RunValidationError(path, raw, f"a number {bound} and <= {hi:g}")
    return float(raw)


def _bool(raw: Any, path: str) -> bool:
    if not isinstance(raw, bool):
        raise RunValidationError(path, raw, "true or false (a JSON boolean)")
    return raw


def _str(raw: Any, path: str, pattern: re.Pattern | None = None, accepted: str = "a non-empty string") -> str:
    if not isinstance(raw, str) or not raw or (pattern is not None and not pattern.fullmatch(raw)):
        raise RunValidationError(path, raw, accepted)
    return raw


def _source(raw: Any, path: str) -> str:
    value = _str(raw, path, accepted="a local path or an s3://bucket/prefix URI")
    if len(value) > 1024 or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise RunValidationError(path, raw, "a path or URI of at most 1,024 characters without control characters")
    if value.startswith("s3://") and not _S3_URI.fullmatch(value):
        raise RunValidationError(path, raw, "an s3://bucket/prefix URI with a valid bucket name")
    return value


def _tag_text(text: str) -> bool:
    """SageMaker's tag pattern `([\\p{L}\\p{Z}\\p{N}_.:/=+\\-@]*)`: letters, separators, numbers, `_.:/=+-@`."""
    return all(unicodedata.category(c)[0] in "LZN" or c in "_.:/=+-@" for c in text)


# ---- sections ------------------------------------------------------------------------------------------------


def _model(raw: Any) -> ModelSpec:
    obj = _obj(raw, "model", {"source", "config", "parameters", "init"})
    init = obj.get("init")
    if init is not None and init not in INITS:
        raise RunValidationError("model.init", init, '"pretrained" (weights from model.source) or "random" '
                                 "(weights initialised from training.seed, shape from model.config)")
    if "parameters" in obj:
        if len(obj) > 1:
            raise RunValidationError("model", raw, "model.parameters alone (a bare count, for estimates only), or "
                                     "model.source / model.config without it")
        return ModelSpec(None, None, _int(obj["parameters"], "model.parameters", 1, 10**14), None)
    config = None
    if "config" in obj:
        config = obj["config"]
        if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
            raise RunValidationError("model.config", config, "an HF config object with a string model_type")
    if init == "random":
        if "source" in obj:
            raise RunValidationError("model.source", obj["source"], 'no model.source with model.init="random" '
                                     "(random weights take only the shape: model.config)")
        if config is None:
            raise RunValidationError("model.config", None, 'the model\'s shape (an HF config) with model.init="random"')
        size = len(json.dumps(config, separators=(",", ":")))
        if size > HYPERPARAMETER_VALUE_MAX:
            raise RunValidationError("model.config", config, f"an inline config of at most "
                                     f"{HYPERPARAMETER_VALUE_MAX:,} characters as compact JSON (SageMaker's "
                                     f"hyperparameter value limit); this one has {size:,}: drop the fields that "
                                     "keep their defaults")
        return ModelSpec(None, config, None, init)
    if "source" in obj:
        # With a source, an inline config is a copy of its config.json: the estimate uses it when the source
        # cannot be read here (offline); the pipeline reads the source's own config.json.
        return ModelSpec(_source(obj["source"], "model.source"), config, None, "pretrained")
    if init == "pretrained":
        raise RunValidationError("model.source", None, 'the model directory holding the pretrained weights (with '
                                 'model.init="pretrained")')
    if config is None:
        raise RunValidationError("model", raw, "model.source (pretrained weights), model.config (a shape: with "
                                 'model.init="random" to train from random weights), or model.parameters')
    return ModelSpec(None, config, None, None)  # a shape only: estimates; the pipeline asks for model.init


def _data(raw: Any) -> DataSpec:
    obj = _obj(raw, "data", {"source", "tokens", "seq_len", "validation", "validation_fraction"}, {"seq_len"})
    if "source" not in obj and "tokens" not in obj:
        raise RunValidationError("data", raw, "data.tokens, or data.source whose index.json gives the count")
    source = _source(obj["source"], "data.source") if "source" in obj else None
    tokens = _int(obj["tokens"], "data.tokens", 1, 10**15) if "tokens" in obj else None
    validation = _source(obj["validation"], "data.validation") if "validation" in obj else None
    fraction = None
    if "validation_fraction" in obj:
        if validation is not None:
            raise RunValidationError("data.validation_fraction", obj["validation_fraction"], "no fraction with "
                                     "data.validation (one validation set: a prepared source or a held-out share)")
        fraction = _num(obj["validation_fraction"], "data.validation_fraction", 0, 0.5, lo_open=True)
    return DataSpec(source, tokens, _int(obj["seq_len"], "data.seq_len", 2, 1 << 20), validation, fraction)


def _eval(raw: Any) -> EvalSpec:
    obj = _obj(raw, "eval", {"every_steps", "every_minutes", "max_batches", "keep_best"})
    return EvalSpec(every_steps=_int(obj.get("every_steps", 0), "eval.every_steps", 0, 10**9),
                    every_minutes=_num(obj.get("every_minutes", 0), "eval.every_minutes", 0, 28 * 24 * 60),
                    max_batches=_int(obj.get("max_batches", 0), "eval.max_batches", 0, 10**9),
                    keep_best=_bool(obj.get("keep_best", False), "eval.keep_best"))


def _gate(raw: Any) -> GateSpec:
    obj = _obj(raw, "registry.gate", {"max_val_loss", "min_improvement"})
    if not obj:
        raise RunValidationError("registry.gate", raw, "max_val_loss and/or min_improvement")
    return GateSpec(
        max_val_loss=(None if "max_val_loss" not in obj
                      else _num(obj["max_val_loss"], "registry.gate.max_val_loss", 0, 1e6, lo_open=True)),
        min_improvement=(None if "min_improvement" not in obj
                         else _num(obj["min_improvement"], "registry.gate.min_improvement", -1, 1)))


def _needs_validation(data: DataSpec, field_path: str, value: Any) -> None:
    if not data.has_validation:
        raise RunValidationError(field_path, value, "data.validation or data.validation_fraction with it (it "
                                 "reads the validation loss)")


def _lora(raw: Any) -> LoraSpec:
    lo = _obj(raw, "training.lora", {"rank", "alpha", "dropout", "target_modules"}, {"rank"})
    targets = lo.get("target_modules", "all-linear")
    if targets != "all-linear":
        if (not isinstance(targets, list) or not 0 < len(targets) <= 64
                or not all(isinstance(t, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", t) for t in targets)):
            raise RunValidationError("training.lora.target_modules", targets,
                                     '"all-linear" or a list of 1-64 module names (e.g. ["q_proj"])')
        targets = tuple(targets)
    return LoraSpec(rank=_int(lo["rank"], "training.lora.rank", 1, 4096), target_modules=targets,
                    alpha=_num(lo.get("alpha", 16), "training.lora.alpha", 0, 65536, lo_open=True),
                    dropout=_num(lo.get("dropout", 0.0), "training.lora.dropout", 0, 0.9))


def _training(raw: Any) -> TrainingSpec:
    obj = _obj(raw, "training", {"method", "lora", "epochs", "micro_batch", "grad_accum", "lr", "seed"})
    method = obj.get("method", "full")
    if method not in METHODS:
        raise RunValidationError("training.method", method, " or ".join(METHODS))
    lora = None
    if method == "lora":
        lora = _lora(obj.get("lora"))
    elif "lora" in obj:
        raise RunValidationError("training.lora", obj["lora"], "no lora section unless training.method is lora")
    return TrainingSpec(
        method=method, lora=lora,
        epochs=_num(obj.get("epochs", 1), "training.epochs", 0, 1000, lo_open=True),
        micro_batch=_int(obj.get("micro_batch", 1), "training.micro_batch", 1, 4096),
        grad_accum=_int(obj.get("grad_accum", 1), "training.grad_accum", 1, 4096),
        lr=_num(obj.get("lr", 2e-5), "training.lr", 0, 1, lo_open=True),
        seed=_int(obj.get("seed", 0), "training.seed", 0, 2**31 - 1),
    )


def _compute(raw: Any) -> ComputeSpec:
    obj = _obj(raw, "compute", {"instance_type", "instance_count", "spot", "max_wait_hours",
                                "accepted_delay_hours", "on_demand_fallback", "warm_pool_minutes", "utilization",
                                "target_hours", "spot_discount", "accept_max_runtime_stop",
                                "deadline_hours"})
    itype = obj.get("instance_type", "auto")
    if itype != "auto":
        _str(itype, "compute.instance_type", re.compile(r"ml\.[a-z0-9]+\.[a-z0-9]+"),
             '"auto" or a SageMaker instance type such as ml.g5.12xlarge')
    count = obj.get("instance_count", "auto")
    count = None if count == "auto" else _int(count, "compute.instance_count", 1, 64)
    return ComputeSpec(
        instance_type=itype, instance_count=count,
        spot=_bool(obj.get("spot", True), "compute.spot"),
        max_wait_hours=(None if obj.get("max_wait_hours") is None
                        else _num(obj["max_wait_hours"], "compute.max_wait_hours", 0, 28 * 24 * 2, lo_open=True)),
        accepted_delay_hours=_num(obj.get("accepted_delay_hours", 24), "compute.accepted_delay_hours", 0, 28 * 24),
        on_demand_fallback=_bool(obj.get("on_demand_fallback", False), "compute.on_demand_fallback"),
        warm_pool_minutes=_int(obj.get("warm_pool_minutes", 0), "compute.warm_pool_minutes", 0, 60),
        utilization=(None if obj.get("utilization") is None
                     else _num(obj["utilization"], "compute.utilization", 0, 1, lo_open=True)),
        target_hours=(None if obj.get("target_hours") is None
                      else _num(obj["target_hours"], "compute.target_hours", 0, 28 * 24, lo_open=True)),
        spot_discount=(None if obj.get("spot_discount") is None
                       else _num(obj["spot_discount"], "compute.spot_discount", 0, 0.95)),
        accept_max_runtime_stop=_bool(obj.get("accept_max_runtime_stop", False), "compute.accept_max_runtime_stop"),
        deadline_hours=(None if obj.get("deadline_hours") is None
                        else _num(obj["deadline_hours"], "compute.deadline_hours", 0, 28 * 24 * 2, lo_open=True)),
    )


def _checkpoint(raw: Any) -> CheckpointSpec:
    obj = _obj(raw, "checkpoint", {"interval_minutes", "keep", "interruptions_per_hour", "resume_from"})
    interval = obj.get("interval_minutes", "auto")
    interval = None if interval == "auto" else _num(interval, "checkpoint.interval_minutes", 0, 24 * 60,
                                                    lo_open=True)
    return CheckpointSpec(
        interval_minutes=interval,
        keep=_int(obj.get("keep", 2), "checkpoint.keep", 2, 100),
        interruptions_per_hour=(None if obj.get("interruptions_per_hour") is None
                                else _num(obj["interruptions_per_hour"], "checkpoint.interruptions_per_hour", 0, 10)),
        resume_from=(None if obj.get("resume_from") is None
                     else _str(obj["resume_from"], "checkpoint.resume_from", _EXECUTION_NAME,
                               "the name of an earlier execution of this run (1-80 letters, digits, - or _)")),
    )


def _tags(raw: Any) -> dict[str, str]:
    if not isinstance(raw, dict) or len(raw) > MAX_RUN_TAGS:
        raise RunValidationError("tags", raw, f"an object of at most {MAX_RUN_TAGS} string tags (SageMaker allows "
                                 f"{MAX_TAGS}; the pipeline sets {', '.join(RESERVED_TAG_KEYS)})")
    for key, value in raw.items():
        path = join("tags", key)
        if not 1 <= len(key) <= 128 or not _tag_text(key) or key.lower().startswith("aws:"):
            raise RunValidationError(path, value, "a tag key of 1-128 letters, digits, spaces or _.:/=+-@, not "
                                     "starting with aws:")
        if key.lower() in RESERVED_TAG_KEYS:
            raise RunValidationError(path, value, f"a key other than {', '.join(RESERVED_TAG_KEYS)} (the "
                                     "pipeline sets these on every training job)")
        if not isinstance(value, str) or len(value) > 256 or not _tag_text(value):
            raise RunValidationError(path, value, "a tag value of at most 256 letters, digits, spaces or _.:/=+-@")
    return dict(raw)


def parse_run(raw: Any) -> RunSpec:
    """A validated RunSpec from a decoded run JSON, or RunValidationError naming the field."""
    if not isinstance(raw, dict):
        raise RunValidationError("run", raw, "a JSON object")
    check_json_tree(raw)
    top = _obj(raw, "", {"version", "name", "model", "data", "training", "compute", "checkpoint", "budget",
                         "registry", "tags", "eval", "export"}, {"version", "name", "model", "data", "budget"})
    if type(top["version"]) is not int or top["version"] != SCHEMA_VERSION:
        raise RunValidationError("version", top["version"], f"the integer {SCHEMA_VERSION} (the only schema version)")
    name = _str(top["name"], "name", _NAME, "1-48 letters, digits and hyphens, starting and ending with a letter "
                "or digit")
    budget = _obj(top["budget"], "budget", {"max_usd"}, {"max_usd"})
    registry = _obj(top.get("registry", {}), "registry", {"model_package_group", "approval_status", "gate"})
    group = registry.get("model_package_group")
    if group is not None:
        _str(group, "registry.model_package_group", _REGISTRY_GROUP, "a model package group name (1-63 "
             "letters, digits, hyphens)")
    approval = registry.get("approval_status", "PendingManualApproval")
    if approval not in APPROVAL_STATUSES:
        raise RunValidationError("registry.approval_status", approval, " or ".join(APPROVAL_STATUSES))
    tags = _tags(top.get("tags", {}))
    data = _data(top["data"])
    evaluation = _eval(top.get("eval", {}))
    gate = _gate(registry["gate"]) if "gate" in registry else None
    if gate is not None:
        _needs_validation(data, "registry.gate", registry["gate"])
    if top.get("eval"):
        _needs_validation(data, "eval", top["eval"])
    export = _obj(top.get("export", {}), "export", {"from"})
    export_from = export.get("from", "last")
    if export_from not in ("last", "best"):
        raise RunValidationError("export.from", export_from, '"last" (the final weights) or "best" (the lowest '
                                 "validation loss)")
    if export_from == "best" and not evaluation.keep_best:
        raise RunValidationError("export.from", export_from, '"last", or eval.keep_best=true with "best" (the '
                                 "best checkpoint must be kept to be exported)")
    return RunSpec(
        version=SCHEMA_VERSION, name=name, model=_model(top["model"]), data=data,
        training=_training(top.get("training", {})), compute=_compute(top.get("compute", {})),
        checkpoint=_checkpoint(top.get("checkpoint", {})),
        max_usd=_num(budget["max_usd"], "budget.max_usd", 0, 10**9, lo_open=True),
        model_package_group=group, approval_status=approval, tags=tags,
        eval=evaluation, export_from=export_from, gate=gate,
    )
