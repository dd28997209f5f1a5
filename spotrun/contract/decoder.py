"""One reflective decoder for documented, frozen dataclasses, and the documentation it renders from them.

A field says everything about itself in one place, `spec(doc, ...)`: what it means, its default, where it sits in
the JSON (`at="budget.max_usd"` when that is not its own name at its class's level), and what it accepts: an integer
or number range (`lo`, `hi`, `lo_open`), a full-match `pattern`, the choices of a `Literal[...]` type, `auto` (the
string "auto" for None), or a `decode` function for the values no metadata describes (paths, maps, URLs).
`unit` converts a number in the user's unit (minutes, hours) to seconds, the only unit past the contract: the JSON
value is checked and documented as given (`at` names it: `interval_s` sits at `interval_minutes`); the field
holds value x unit.
`accepted` overrides the text that says what is accepted; the same text is used by the error and the docs.

`decode(cls, raw, path)` refuses a key no field has (naming the accepted fields) and a missing required field,
decodes each field by its type (nested dataclasses recursively; JSON null is "not given" for an Optional field),
builds the dataclass and then calls its `_across(raw, path)`: the rules across fields, the only hand-written
checks, which may return a normalised copy. A class whose object is a tagged union (which fields are given
decides what the others mean) says so in a static `_given(raw, path)`, called before any value is decoded.
Every error is a `RunValidationError` (`field=value is invalid: expected ...`). `reference(cls)` lists every leaf
field with the same texts.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
import types
import typing
from dataclasses import MISSING, dataclass, fields
from functools import cache
from typing import Any, Callable, Literal, get_args, get_origin, get_type_hints

from .strict_json import ABSENT, RunValidationError, Written, join

REQUIRED = "a value (this field is required)"


def spec(doc: str, *, default: Any = MISSING, default_factory: Any = MISSING, at: str | None = None,
         lo: float | None = None, hi: float | None = None, lo_open: bool = False, pattern: str | None = None,
         auto: bool = False, decode: Callable[[Any, str], Any] | None = None, accepted: str | None = None,
         unit: float = 1.0) -> Any:
    """A dataclass field with its documentation and what it accepts (see the module docstring)."""
    meta = {"doc": doc, "at": at, "lo": lo, "hi": hi, "lo_open": lo_open, "auto": auto, "decode": decode,
            "accepted": accepted, "pattern": re.compile(pattern) if pattern is not None else None, "unit": unit}
    return dataclasses.field(default=default, default_factory=default_factory, metadata=meta)


@dataclass(frozen=True)
class FieldRule:
    """One field as the decoder and the docs see it."""

    name: str  # the attribute
    at: tuple[str, ...]  # its JSON path below its class's object
    kind: Any  # the type without None: int, float, bool, str, a Literal, a dataclass, or another (with `decode`)
    optional: bool  # None is a value (JSON null: "not given")
    required: bool
    default: Any  # the dataclass field's (MISSING when it has none)
    factory: Any  # the dataclass field's default_factory; a nested dataclass's default is decoded from {} instead
    doc: str
    accepted: str
    meta: dict

    def check(self, value: Any, path: str) -> Any:
        """The decoded value of a given (non-null) JSON value, or RunValidationError."""
        meta, kind = self.meta, self.kind
        if meta["auto"] and value == "auto":
            return None
        if meta["decode"] is not None:
            return meta["decode"](value, path)
        if dataclasses.is_dataclass(kind):
            return decode(kind, value, path)
        if get_origin(kind) is Literal:  # strictly typed: 1.0 and True are not 1
            if not any(type(value) is type(c) and value == c for c in get_args(kind)):
                raise RunValidationError(path, value, self.accepted)
            return value
        if kind is bool:
            ok = isinstance(value, bool)
        elif kind is int:
            ok = isinstance(value, int) and not isinstance(value, bool) and meta["lo"] <= value <= meta["hi"]
        elif kind is float:
            ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                  and (value > meta["lo"] if meta["lo_open"] else value >= meta["lo"]) and value <= meta["hi"])
            value = float(value) * meta["unit"] if ok else value
        elif kind is str:
            pattern = meta["pattern"]
            ok = isinstance(value, str) and bool(value) and (pattern is None or pattern.fullmatch(value) is not None)
        else:
            raise TypeError(f"{self.name}: a field of type {kind} needs decode=")
        if not ok:  # a float where an integer goes is shown with its point (2048.0), as a run file writes it
            shown = Written(value) if kind is int and type(value) is float else value
            raise RunValidationError(path, shown, self.accepted)
        return value

    def default_value(self, path: str) -> Any:
        if dataclasses.is_dataclass(self.kind) and not self.optional:
            return decode(self.kind, {}, path)  # the section's own defaults and rules
        return self.factory() if self.factory is not MISSING else self.default


def _accepted(kind: Any, meta: dict) -> str:
    if meta["accepted"] is not None:
        text = meta["accepted"]
    elif get_origin(kind) is Literal:
        text = " or ".join(str(c) for c in get_args(kind))
    elif kind is bool:
        text = "true or false (a JSON boolean)"
    elif kind is int:
        text = f"an integer in [{meta['lo']:,}, {meta['hi']:,}]"
    elif kind is float:
        text = f"a number {'>' if meta['lo_open'] else '>='} {meta['lo']} and <= {meta['hi']:g}"
    elif dataclasses.is_dataclass(kind):
        text = "an object"
    elif kind is str and meta["pattern"] is None:
        text = "a non-empty string"
    else:
        raise TypeError(f"a field of type {kind} (or with a pattern) needs accepted=")
    return '"auto" or ' + text if meta["auto"] else text


@cache
def rules(cls: type) -> tuple[FieldRule, ...]:
    """The decoder's view of `cls`'s fields, in declaration order (each checked once, at first use)."""
    hints = get_type_hints(cls)
    out = []
    for f in fields(cls):
        kind, optional = hints[f.name], False
        if get_origin(kind) in (typing.Union, types.UnionType) and type(None) in get_args(kind):
            rest = [a for a in get_args(kind) if a is not type(None)]
            kind, optional = (rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]), True
        meta = dict(f.metadata)
        if not meta.get("doc"):
            raise TypeError(f"{cls.__name__}.{f.name} has no documentation: declare it with spec(doc, ...)")
        has_default = f.default is not MISSING or f.default_factory is not MISSING
        out.append(FieldRule(f.name, tuple((meta["at"] or f.name).split(".")), kind, optional, not has_default,
                             f.default, f.default_factory, meta["doc"], _accepted(kind, meta), meta))
    return tuple(out)


def _layout(cls: type) -> dict:
    """{json key: FieldRule or a nested {key: ...} of the fields sharing that object}."""
    tree: dict = {}
    for rule in rules(cls):
        node = tree
        for part in rule.at[:-1]:
            node = node.setdefault(part, {})
        node[rule.at[-1]] = rule
    return tree


def _required(node: FieldRule | dict) -> bool:
    return node.required if isinstance(node, FieldRule) else any(_required(n) for n in node.values())


def _check_keys(raw: Any, path: str, tree: dict) -> None:
    """The object's keys: none unknown, every required one present, nested objects (of `at`) alike."""
    if not isinstance(raw, dict):
        raise RunValidationError(path or "run", raw, "an object")
    for key in raw:
        if key not in tree:
            near = difflib.get_close_matches(str(key), list(tree), n=1, cutoff=0.8)
            meant = f" (did you mean {near[0]}?)" if near else ""  # a typo: the field meant, before the list
            raise RunValidationError(join(path, key), raw[key],
                                     f"no such field{meant}; accepted fields: {', '.join(sorted(tree))}")
    for key in sorted(k for k, node in tree.items() if _required(node)):
        if key not in raw:
            raise RunValidationError(join(path, key), ABSENT, REQUIRED)
    for key, node in tree.items():
        if isinstance(node, dict) and key in raw:
            _check_keys(raw[key], join(path, key), node)


def decode(cls: type, raw: Any, path: str = "") -> Any:
    """`raw` (a JSON object) as a `cls`, checked field by field and then across fields; or RunValidationError."""
    _check_keys(raw, path, _layout(cls))
    given = getattr(cls, "_given", None)
    if given is not None:
        given(raw, path)
    values = {}
    for rule in rules(cls):
        holder, where = raw, path
        for part in rule.at[:-1]:
            holder, where = holder.get(part, {}), join(where, part)
        where = join(where, rule.at[-1])
        value = holder.get(rule.at[-1])
        if value is None and (rule.optional or rule.at[-1] not in holder):
            values[rule.name] = None if rule.at[-1] in holder else rule.default_value(where)
        elif value is None and not rule.required:  # null is "not given" only where the default is null
            raise RunValidationError(where, None, f"{rule.accepted}; null is refused here: leave it out for its "
                                     "default")
        else:
            values[rule.name] = rule.check(value, where)
    obj = cls(**values)
    across = getattr(obj, "_across", None)
    return across(raw, path) if across is not None else obj


# ---- documentation ---------------------------------------------------------------------------------------------


def _default_text(rule: FieldRule) -> str:
    if rule.required:
        return "required"
    value = rule.factory() if rule.factory is not MISSING else rule.default
    if value is None:
        return '`"auto"`' if rule.meta["auto"] else "-"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{json.dumps(value)}`"


def reference(cls: type, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(JSON path, accepted, default, doc) of every leaf field of `cls`, nested dataclasses expanded."""
    rows = []
    for rule in rules(cls):
        path = prefix + ".".join(rule.at)
        if dataclasses.is_dataclass(rule.kind) and rule.meta["decode"] is None:
            rows.extend(reference(rule.kind, path + "."))
        else:
            rows.append((path, rule.accepted, _default_text(rule), rule.doc))
    order: dict[str, int] = {}  # the fields of one JSON object together (`at` may place them apart)
    for path, *_ in rows:
        order.setdefault(path[len(prefix):].split(".")[0], len(order))
    return sorted(rows, key=lambda row: order[row[0][len(prefix):].split(".")[0]])


def markdown_table(rows: list[tuple[str, str, str, str]]) -> str:
    def cell(text: str) -> str:
        return " ".join(text.split()).replace("|", "\\|")

    lines = ["| field | accepted | default | meaning |", "|---|---|---|---|"]
    lines += [f"| `{path}` | {cell(accepted)} | {default} | {cell(doc)} |" for path, accepted, default, doc in rows]
    return "\n".join(lines) + "\n"
