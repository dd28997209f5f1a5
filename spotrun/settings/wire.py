"""The settings tree on the wire: SageMaker hyperparameters keyed by dotted paths, and the JSON file the launcher
hands every worker. One pair of functions: `flatten` writes each leaf that differs from its default under its
dotted path (`checkpoint.interval_s`, `training.lr`), every value a string; `parse` reads them back.

A leaf's dotted path is its attribute path, with one generic rule: a field named after a Python keyword carries a
trailing underscore (PEP 8), its path does not (`ExportConfig.from_` is `export.from`, the run JSON's name).
`job_config` (the launcher, the CLI) and `from_json_file` (every worker) also check the config for a job
(`TrainConfig.check_job`); only the entry points that call them read SageMaker files or the environment.
"""

from __future__ import annotations

import json
import keyword
import math
from dataclasses import dataclass, fields, is_dataclass
from functools import cache
from pathlib import Path
from typing import Any, Mapping, get_type_hints

from .checks import INT_LIMIT, ConfigError, short_repr
from .tree import TrainConfig


@dataclass(frozen=True)
class Leaf:
    """One setting of the tree: where it sits (`attrs`), its dotted path (`key`) and its type."""

    attrs: tuple[str, ...]
    key: str
    type: type

    def of(self, config: Any) -> Any:
        """This leaf's value in `config` (a TrainConfig, or anything shaped like one: the run's decoded spec); None
        where an attribute on the way is missing."""
        for attr in self.attrs:
            config = getattr(config, attr, None)
        return config


def key_of(name: str) -> str:
    """A field's name on the wire: `from_` (a keyword, with PEP 8's trailing underscore) is `from`."""
    return name[:-1] if name.endswith("_") and keyword.iskeyword(name[:-1]) else name


@cache
def leaves(cls: type = TrainConfig, attrs: tuple[str, ...] = ()) -> tuple[Leaf, ...]:
    """Every leaf of the tree below `cls`, in declaration order."""
    hints = get_type_hints(cls)
    out: list[Leaf] = []
    for f in fields(cls):
        typ, path = hints[f.name], (*attrs, f.name)
        if is_dataclass(typ):
            out.extend(leaves(typ, path))
        else:
            out.append(Leaf(path, ".".join(key_of(a) for a in path), typ))
    return tuple(out)


def flatten(config: TrainConfig) -> dict[str, str]:
    """SageMaker hyperparameters (every value a string) of each leaf of `config` that differs from its default,
    keyed by its dotted path; `parse` reads them back into an equal config."""
    default = TrainConfig()
    return {leaf.key: _text(leaf.type, leaf.of(config)) for leaf in leaves() if leaf.of(config) != leaf.of(default)}


def parse(hp: Mapping[str, Any]) -> TrainConfig:
    """The settings `flatten` wrote (every value a string, or already typed), each refused with a one-line
    ConfigError naming its dotted path; not checked for a job (`TrainConfig.check_job`)."""
    by_key = {leaf.key: leaf for leaf in leaves()}
    nested: dict[str, Any] = {}
    for key, value in hp.items():
        leaf = by_key.get(key)
        if leaf is None:
            name = key if isinstance(key, str) and _is_name(key) else short_repr(key)  # a name, not a value
            raise ConfigError(f"unknown field {name}: accepted fields are {_accepted(key, by_key)}")
        node = nested
        for attr in leaf.attrs[:-1]:
            node = node.setdefault(attr, {})
        try:
            node[leaf.attrs[-1]] = _parse_scalar(leaf.type, value, key)
        except ConfigError as exc:  # nan read as a float: the text as written
            raise ConfigError(_as_written(str(exc), {key: value})) from None
    try:
        return _construct(TrainConfig, nested)
    except ConfigError as exc:  # a section's check names the parsed value (-1.0): the text as written (-1)
        raise ConfigError(_as_written(str(exc), hp)) from None


def _as_written(message: str, hp: Mapping[str, Any]) -> str:
    """`message` (`<key>=<value> is invalid: ...`) with the value as `hp` wrote it when it was a string."""
    for key, raw in hp.items():
        head = f"{key}="
        if isinstance(raw, str) and message.startswith(head) and " is invalid" in message:
            return head + short_repr(raw.strip()) + message[message.index(" is invalid"):]
    return message


def job_config(hp: Mapping[str, Any], **overrides: Any) -> TrainConfig:
    """A job's config from SageMaker hyperparameters and `overrides` (e.g. channel paths found by the launcher),
    which win; checked for a job."""
    return parse({**hp, **overrides}).check_job()


def to_json(config: TrainConfig) -> str:
    """Every leaf of `config`, nested by its dotted path (the file the launcher writes for the workers)."""
    out: dict[str, Any] = {}
    for leaf in leaves():
        *sections, name = leaf.key.split(".")
        node = out
        for section in sections:
            node = node.setdefault(section, {})
        node[name] = leaf.of(config)
    return json.dumps(out, indent=2, sort_keys=True)


def from_dict(raw: Mapping[str, Any]) -> TrainConfig:
    """A job's config from settings nested by their dotted paths (`{"training": {"lr": 1e-4}}`), checked."""
    return job_config(_flat(raw, ""))


def from_json_file(path: str | Path) -> TrainConfig:
    return from_dict(json.loads(Path(path).read_text()))


def _flat(raw: Any, prefix: str) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}={short_repr(raw)} is invalid: expected an object")
    keys = {leaf.key for leaf in leaves()}
    out: dict[str, Any] = {}
    for name, value in raw.items():
        key = f"{prefix}{name}"
        out.update({key: value} if key in keys or not isinstance(value, Mapping) else _flat(value, key + "."))
    return out


def _is_name(key: str) -> bool:
    """A key that reads as a dotted field name, printed as itself (any other is quoted as JSON)."""
    return bool(key) and len(key) <= 200 and all(part.isidentifier() for part in key.split("."))


def _accepted(key: str, by_key: Mapping[str, Leaf]) -> str:
    """The names one level below the nearest section of `key` that exists."""
    section = key.rpartition(".")[0]
    while True:
        prefix = f"{section}." if section else ""
        names = sorted({k[len(prefix):].split(".")[0] for k in by_key if k.startswith(prefix)})
        if names or not section:
            return ", ".join(names)
        section = section.rpartition(".")[0]


def _construct(cls: type, nested: dict[str, Any]) -> Any:
    hints = get_type_hints(cls)
    kwargs = {name: _construct(hints[name], value) if is_dataclass(hints[name]) else value
              for name, value in nested.items()}
    return cls(**kwargs)


def _text(typ: Any, value: Any) -> str:
    if typ is bool:
        return "true" if value else "false"
    if typ is float:
        return repr(float(value))  # exact: a rounded "0.00" would read as "off"
    if typ is dict:
        return json.dumps(value, separators=(",", ":"))
    return str(value)


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


def _finite(value: float, name: str) -> float:
    if not math.isfinite(value):
        raise ConfigError(f"{name}={short_repr(value)} is invalid: expected a finite number")
    return value


def _int_in_range(value: int, name: str) -> int:
    if not -INT_LIMIT <= value <= INT_LIMIT:
        raise ConfigError(f"{name}={short_repr(value)} is invalid: expected an integer in [{-INT_LIMIT}, {INT_LIMIT}]")
    return value


def _refuse_constant(token: str) -> Any:
    raise ValueError(f"{token} is not a finite number")
