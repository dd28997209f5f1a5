"""The run JSON contract (version 1): parsing and validation into typed, frozen objects.

A run JSON is what users write and what a Step Functions execution receives. Every error names the field (as a
dotted path), the bad value and what is accepted; `parse_run` raises `RunValidationError` for any input at all,
never another exception. See examples/runs/ for complete files.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 1
_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,47}$")  # SageMaker job names allow 63; suffixes are added
_TAG_KEY = re.compile(r"^[\w.:/=+\-@ ]{1,128}$")
_REGISTRY_GROUP = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
APPROVAL_STATUSES = ("PendingManualApproval", "Approved", "Rejected")
METHODS = ("full", "lora")
MAX_RUNTIME_LIMIT_S = 28 * 24 * 3600
_EXECUTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,80}$")  # Step Functions execution names, as the console makes them


class RunValidationError(ValueError):
    """The run JSON is invalid; `.field` is the dotted path of the offending field."""

    def __init__(self, field_path: str, value: Any, accepted: str):
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        super().__init__(f"{field_path}={shown} is invalid: expected {accepted}")
        self.field = field_path


@dataclass(frozen=True)
class ModelSpec:
    source: str | None  # local path or s3:// URI of an HF model directory
    config: dict | None  # inline HF config
    parameters: int | None  # a plain count


@dataclass(frozen=True)
class DataSpec:
    source: str | None  # local path or s3:// URI of prepared token shards (index.json)
    tokens: int | None
    seq_len: int


@dataclass(frozen=True)
class LoraSpec:
    rank: int
    target_modules: tuple[str, ...] | str  # "all-linear" or module names


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


# ---- small typed readers -------------------------------------------------------------------------------------


def _obj(raw: Any, path: str, allowed: set[str], required: set[str] = frozenset()) -> dict:
    if not isinstance(raw, dict):
        raise RunValidationError(path, raw, "an object")
    for key in raw:
        if not isinstance(key, str) or key not in allowed:
            shown = key if isinstance(key, str) and key.strip() else repr(key)
            raise RunValidationError(f"{path}.{shown}" if path else shown, raw[key],
                                     f"no such field; accepted fields: {', '.join(sorted(allowed))}")
    for key in sorted(required):
        if key not in raw:
            raise RunValidationError(f"{path}.{key}" if path else key, None, "a value (this field is required)")
    return raw


def _int(raw: Any, path: str, lo: int, hi: int | None = None) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < lo or (hi is not None and raw > hi):
        rng = f"an integer >= {lo}" if hi is None else f"an integer in [{lo}, {hi}]"
        raise RunValidationError(path, raw, rng)
    return raw


def _num(raw: Any, path: str, lo: float, hi: float | None = None, *, lo_open: bool = False) -> float:
    ok = isinstance(raw, (int, float)) and not isinstance(raw, bool) and math.isfinite(raw)
    ok = ok and (raw > lo if lo_open else raw >= lo) and (hi is None or raw <= hi)
    if not ok:
        bound = f"> {lo}" if lo_open else f">= {lo}"
        raise RunValidationError(path, raw, f"a number {bound}" + ("" if hi is None else f" and <= {hi}"))
    return float(raw)


def _bool(raw: Any, path: str) -> bool:
    if not isinstance(raw, bool):
        raise RunValidationError(path, raw, "true or false")
    return raw


def _str(raw: Any, path: str, pattern: re.Pattern | None = None, accepted: str = "a non-empty string") -> str:
    if not isinstance(raw, str) or not raw or (pattern is not None and not pattern.match(raw)):
        raise RunValidationError(path, raw, accepted)
    return raw


def _source(raw: Any, path: str) -> str:
    value = _str(raw, path, accepted="a local path or an s3://bucket/prefix URI")
    if value.startswith("s3://") and not re.match(r"^s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/.*)?$", value):
        raise RunValidationError(path, raw, "an s3://bucket/prefix URI with a valid bucket name")
    return value


# ---- sections ------------------------------------------------------------------------------------------------


def _model(raw: Any) -> ModelSpec:
    obj = _obj(raw, "model", {"source", "config", "parameters"})
    given = [k for k in ("source", "config", "parameters") if k in obj]
    if len(given) != 1:
        raise RunValidationError("model", raw, "exactly one of model.source, model.config, model.parameters")
    if "config" in obj:
        cfg = obj["config"]
        if not isinstance(cfg, dict) or not isinstance(cfg.get("model_type"), str):
            raise RunValidationError("model.config", cfg, "an HF config object with a string model_type")
        return ModelSpec(None, cfg, None)
    if "parameters" in obj:
        return ModelSpec(None, None, _int(obj["parameters"], "model.parameters", 1))
    return ModelSpec(_source(obj["source"], "model.source"), None, None)


def _data(raw: Any) -> DataSpec:
    obj = _obj(raw, "data", {"source", "tokens", "seq_len"}, {"seq_len"})
    if "source" not in obj and "tokens" not in obj:
        raise RunValidationError("data", raw, "data.tokens, or data.source whose index.json gives the count")
    source = _source(obj["source"], "data.source") if "source" in obj else None
    tokens = _int(obj["tokens"], "data.tokens", 1) if "tokens" in obj else None
    return DataSpec(source, tokens, _int(obj["seq_len"], "data.seq_len", 2, 1 << 20))


def _training(raw: Any) -> TrainingSpec:
    obj = _obj(raw, "training", {"method", "lora", "epochs", "micro_batch", "grad_accum", "lr", "seed"})
    method = obj.get("method", "full")
    if method not in METHODS:
        raise RunValidationError("training.method", method, "full or lora")
    lora = None
    if method == "lora":
        lo = _obj(obj.get("lora"), "training.lora", {"rank", "target_modules"}, {"rank"})
        targets = lo.get("target_modules", "all-linear")
        if targets != "all-linear":
            if (not isinstance(targets, list) or not targets
                    or not all(isinstance(t, str) and re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", t) for t in targets)):
                raise RunValidationError("training.lora.target_modules", targets,
                                         '"all-linear" or a non-empty list of module names (e.g. ["q_proj"])')
            targets = tuple(targets)
        lora = LoraSpec(_int(lo["rank"], "training.lora.rank", 1, 4096), targets)
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
                                "target_hours", "spot_discount"})
    itype = obj.get("instance_type", "auto")
    if itype != "auto":
        _str(itype, "compute.instance_type", re.compile(r"^ml\.[a-z0-9]+\.[a-z0-9]+$"),
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


def parse_run(raw: Any) -> RunSpec:
    """A validated RunSpec from a decoded run JSON, or RunValidationError naming the field."""
    if not isinstance(raw, dict):
        raise RunValidationError("run", raw, "a JSON object")
    top = _obj(raw, "", {"version", "name", "model", "data", "training", "compute", "checkpoint", "budget",
                         "registry", "tags"}, {"version", "name", "model", "data", "budget"})
    if isinstance(top["version"], bool) or top["version"] != SCHEMA_VERSION:
        raise RunValidationError("version", top["version"], f"{SCHEMA_VERSION} (the only schema version)")
    name = _str(top["name"], "name", _NAME, "1-48 letters, digits and hyphens, starting with a letter or digit")
    budget = _obj(top["budget"], "budget", {"max_usd"}, {"max_usd"})
    registry = _obj(top.get("registry", {}), "registry", {"model_package_group", "approval_status"})
    group = registry.get("model_package_group")
    if group is not None:
        _str(group, "registry.model_package_group", _REGISTRY_GROUP, "a model package group name (1-63 "
             "letters, digits, hyphens)")
    approval = registry.get("approval_status", "PendingManualApproval")
    if approval not in APPROVAL_STATUSES:
        raise RunValidationError("registry.approval_status", approval, " or ".join(APPROVAL_STATUSES))
    tags = top.get("tags", {})
    if not isinstance(tags, dict) or len(tags) > 40:
        raise RunValidationError("tags", tags, "an object of at most 40 string tags")
    for key, value in tags.items():
        if not isinstance(key, str) or not _TAG_KEY.match(key) or key.lower().startswith("aws:"):
            raise RunValidationError(f"tags.{key}", value, "a tag key of 1-128 characters, not starting with aws:")
        if not isinstance(value, str) or len(value) > 256:
            raise RunValidationError(f"tags.{key}", value, "a string of at most 256 characters")
    return RunSpec(
        version=SCHEMA_VERSION, name=name, model=_model(top["model"]), data=_data(top["data"]),
        training=_training(top.get("training", {})), compute=_compute(top.get("compute", {})),
        checkpoint=_checkpoint(top.get("checkpoint", {})),
        max_usd=_num(budget["max_usd"], "budget.max_usd", 0, lo_open=True),
        model_package_group=group, approval_status=approval, tags=dict(tags),
    )
