"""Bytes of a run file to a JSON value, and the one error of the run contract.

`decode_run` decodes strictly (UTF-8 with an optional BOM, at most 256 KiB) and keeps what `json` would hide for
`check_json_tree` to report by field: a key given twice, an integer too long to convert. Every error is a
`RunValidationError`: one line `field=value is invalid: expected ...` (the trainer's ConfigError format) naming the
dotted field path, the value shortened by `show`, and what is accepted; `field is missing: expected ...` for a
required field the file does not have (ABSENT).
"""

from __future__ import annotations

import json
import math
import re
import reprlib
from typing import Any

from ..seams import PlanStatus
from .json_text import NUL_TEXT, JsonSyntaxError, loads, with_excerpt
from .refusal import Refusal

MAX_RUN_BYTES = 256 * 1024  # a run is a Step Functions execution input: at most 256 KiB
MAX_DEPTH = 16  # HF configs nest 2-3 levels; deeper input is refused before anything recurses into it
MAX_STRING = 4096  # no field of a run needs more (S3 URIs are <= 1,024)
MAX_INT = 10**18  # integers beyond this are refused (a planner figure must stay a finite float)

def dumps(value: Any, **options: Any) -> str:
    """JSON text of what the CLI and the Lambdas emit: strict JSON (a non-finite float raises ValueError here
    rather than printing NaN or Infinity, which strict parsers refuse)."""
    return json.dumps(value, allow_nan=False, **options)


def strict(value: Any) -> Any:
    """`value` itself, once checked to encode as strict JSON (a Lambda's answer; the runtime encodes it)."""
    dumps(value, default=str)
    return value


class Written(float):
    """A number of the run file with its text as written (`2048.0`, `2e7`, `NaN`): what a refusal shows, so that
    `expected an integer` never quotes `2048`. It is the float itself everywhere else."""

    text: str

    def __new__(cls, value: str | float, text: str | None = None):
        out = super().__new__(cls, value)
        out.text = text if text is not None else value if isinstance(value, str) else repr(float(value))
        return out


class _AsJson(reprlib.Repr):
    """reprlib's shortening, spelled as the run file spells values (JSON): "text", true, false, null, [..], 5000
    (a user wrote JSON; Python's 'text', True, None and 5000.0 were not theirs)."""

    def repr_str(self, x: str, level: int) -> str:
        text = repr(x)  # Python's escapes (a line break stays on the line), in JSON's double quotes
        if text[0] == "'":
            text = '"' + text[1:-1].replace("\\'", "'").replace('"', '\\"') + '"'
        if len(text) <= self.maxstring:
            return text
        head = max(0, (self.maxstring - 3) // 2)
        return text[:head] + "..." + text[len(text) - max(0, self.maxstring - 3 - head):]

    def repr_bool(self, x: bool, level: int) -> str:
        return "true" if x else "false"

    def repr_NoneType(self, x: None, level: int) -> str:  # noqa: N802 - reprlib dispatches on the type's name
        return "null"

    def repr_tuple(self, x: tuple, level: int) -> str:
        return self.repr_list(list(x), level)

    def repr_Written(self, x: Written, level: int) -> str:  # noqa: N802 - reprlib dispatches on the type's name
        return x.text if len(x.text) <= self.maxother else x.text[:self.maxother - 3] + "..."

    def repr_float(self, x: float, level: int) -> str:
        if not math.isfinite(x):  # as Python's json writes them (what a run file would hold), not nan/inf
            return "NaN" if math.isnan(x) else "Infinity" if x > 0 else "-Infinity"
        return str(int(x)) if x.is_integer() and abs(x) < 1e15 else repr(x)


_shorten = _AsJson()
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


ABSENT = object()
"""The value of a required field the run file does not have (RunValidationError says `is missing`)."""


class RunValidationError(Refusal, ValueError):
    """The run JSON is invalid (a Refusal with status InvalidRun); `.field` is the dotted path of the offending
    field."""

    def __init__(self, field_path: str, value: Any, accepted: str, *, excerpt: str = ""):
        """`value` ABSENT: the field is not in the file (`field is missing: expected ...`, not `field=null`, which
        the user did not write); `excerpt`: lines shown under the message (a JSON file's line with a caret,
        spotrun.contract.json_text)."""
        field_path = field_path if len(field_path) <= 200 else field_path[:197] + "..."
        given = " is missing" if value is ABSENT else f"={show(value)} is invalid"
        message = f"{field_path}{given}: expected {accepted}"
        super().__init__(PlanStatus.INVALID_RUN.value, with_excerpt(" ".join(message.splitlines()), excerpt),
                         field=field_path)


# ---- decoding: bytes of a run file -> a JSON value whose oddities are reported by field -----------------


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
    if "\x00" in text:  # UTF-8 it is, but a JSON text holds no NUL outside a \u0000 escape
        raise RunValidationError("run", name, f"UTF-8 {NUL_TEXT}") from None
    try:
        return loads(text, object_pairs_hook=_pairs, parse_float=Written, parse_constant=Written,
                     parse_int=lambda s: int(s) if len(s) <= 40 else _BigNumber(s))
    except JsonSyntaxError as exc:
        raise RunValidationError("run", name, f"valid JSON: at {exc.at}, {exc.expected}", excerpt=exc.excerpt
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
