"""Every CDK construct of training_constructs/ documents its props as aws-solutions-constructs do: one props
dataclass, a docstring under each prop, and on each prop with a default a "Default:" that states it; the page
docs/constructs.md is the one training_constructs/reference.py generates from them."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from training_constructs.reference import constructs, props_of, reference

ROOT = Path(__file__).resolve().parents[2]


def undocumented(props_class: type) -> list[str]:
    """Props without a docstring, and props with a default whose docstring does not state it after 'Default:'."""
    out = []
    for prop, field in zip(props_of(props_class), dataclasses.fields(props_class), strict=True):
        stated = prop.doc.partition("Default:")[2]
        if not prop.doc:
            out.append(f"{prop.name}: no docstring")
        elif prop.default != "required" and not stated:
            out.append(f"{prop.name}: no 'Default:' in its docstring")
        elif isinstance(field.default, (int, float)) and not isinstance(field.default, bool) and \
                field.default not in [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?", stated)]:
            out.append(f"{prop.name}: the docstring's default is not {field.default}")
        elif isinstance(field.default, (bool, str)) and str(field.default) not in stated:
            out.append(f"{prop.name}: the docstring's default is not {field.default}")
    return out


def test_every_construct_takes_one_documented_props_dataclass():
    found = constructs()
    assert len(found) >= 8
    assert [c.name for c in found if c.props_class is None] == []
    assert {c.name: undocumented(c.props_class) for c in found if undocumented(c.props_class)} == {}


def test_the_constructs_page_is_the_generated_one():
    page = (ROOT / "docs" / "constructs.md").read_text(encoding="utf-8")
    assert page == reference(), "regenerate it: python -m training_constructs.reference --page docs/constructs.md"


@dataclasses.dataclass(frozen=True)
class _Props:
    bare: str
    stated: int = 3
    """Documented. Default: 3."""
    wrong: int = 5
    """Documented. Default: 4."""
    silent: bool = False
    """Documented, with no default stated."""


def test_the_check_finds_a_prop_without_its_docstring_or_its_default():
    assert undocumented(_Props) == ["bare: no docstring", "wrong: the docstring's default is not 5",
                                    "silent: no 'Default:' in its docstring"]
