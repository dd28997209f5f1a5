"""What every section of the settings tree refuses, and how: `ConfigError`, one line naming the field (as its dotted
path), the bad value (shortened by `short_repr`) and what is accepted."""

from __future__ import annotations

import json
import math
import re
from dataclasses import fields
from typing import Any


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the field, the value and what is accepted."""


# Integers end up in C (torch, numpy, the data loader's arithmetic): anything wider than int64 is refused here
# rather than overflowing there.
INT_LIMIT = 2**63 - 1
# numpy's and most seeding helpers' range; the per-rank seeds (seed + 1 + rank) stay far inside torch's.
SEED_LIMIT = 2**32 - 1


def require(cond: bool, name: str, value: Any, accepted: str) -> None:
    if not cond:
        raise ConfigError(f"{name}={short_repr(value)} is invalid: expected {accepted}")


def require_finite(obj: Any, prefix: str) -> None:
    """Every float field is a finite number: `inf` and `nan` pass comparisons like `lr > 0` (or fail them with
    a misleading message) and then train to NaN."""
    for f in fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{prefix}{f.name}={short_repr(value)} is invalid: expected a finite number")


def non_finite_path(value: Any, path: str = "") -> tuple[str, float] | None:
    """(dotted path, value) of the first NaN/Infinity inside a parsed JSON value, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return path, value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = non_finite_path(item, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None


def short_repr(value: Any, limit: int = 80) -> str:
    """A value as the user wrote it, in JSON's spelling as the rest of the CLI quotes values, cut to a short line:
    hyperparameters are strings, so one that is a JSON value as written (`training.lr=-1`, `model.config=[1]`,
    `eval.keep_best=true`) as itself, any other string quoted (`training.lr="fast"`, `sharding.mode="zero3"`,
    `""`), never Python's `'fast'`; every other value as JSON (`{"a": 1}`, `true`, `null`), readable whatever was
    passed (megabytes of text, newlines, integers too long to print)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**limit:
        return f"<an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits>"
    if isinstance(value, str) and value and value == value.strip() and value.isprintable() and _is_json(value):
        text = value
    else:
        try:
            text = json.dumps(value, ensure_ascii=False)
        except (TypeError, ValueError):  # not JSON: the type's own spelling
            text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_json(text: str) -> bool:
    """Whether `text` reads as one JSON value: a number (of any length), true/false/null, NaN or Infinity (as
    Python's json writes them), or an object or array json reads."""
    if _JSON_WORD.fullmatch(text):
        return True
    if not text.startswith(("[", "{")):
        return False
    try:
        json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than json reads
        return False
    return True


_JSON_WORD = re.compile(r"-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?|true|false|null|NaN|-?Infinity")
