"""No dead names, and no module nothing uses.

vulture (pinned in requirements-dev.txt; paths, confidence and the names it cannot see used in pyproject.toml's
[tool.vulture], each with its reason) on the project's code without the tests: a name only tests use is dead. A
name that is read by its key (a string elsewhere in the code: a JSONPath of the state machine, a key of an asdict
output) counts as used. Every module is imported by another module of the project, or started by its dotted name
(a Lambda handler string, `python -m`, the Dockerfile, a script entry point)."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest
from vulture import Vulture

from tests.spotrun.layering import imports, modules

ROOT = Path(__file__).resolve().parents[2]
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["vulture"]
# Where a module can be started by name (besides Python code): the image, the CDK app, the package's scripts.
STARTERS = ("training_image/Dockerfile", "cdk.json", "pyproject.toml", "Makefile")


def _files(root: Path, paths: list[str]) -> list[Path]:
    return [f for p in paths for f in ([root / p] if p.endswith(".py") else sorted((root / p).rglob("*.py")))]


def _keys(files: list[Path]) -> set[str]:
    """Identifiers inside the string constants of `files`, docstrings left out."""
    out: set[str] = set()
    for f in files:
        tree = ast.parse(f.read_text(), str(f))
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        out.update(w for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                   and id(n) not in docs for w in re.findall(r"[A-Za-z_]\w*", n.value))
    return out


def dead_names(root: Path, paths: list[str], ignore: list[str], min_confidence: int) -> list[str]:
    """vulture's findings (`path:line: message`) less names read by key and names in `ignore`."""
    scan = Vulture()
    scan.scavenge([str(root / p) for p in paths])
    keys = _keys(_files(root, paths))
    return sorted(f"{Path(item.filename).relative_to(root)}:{item.first_lineno}: {item.message}"
                  for item in scan.get_unused_code(min_confidence=min_confidence)
                  if item.name not in keys and item.name not in ignore)


def unused_modules(root: Path, code_paths: list[str], starters: tuple[str, ...]) -> list[str]:
    """Modules no other module imports and nothing starts by its dotted name (`python -m X`, a Lambda handler
    string `X.handler`, ...) in the code, the starter files or the docs; a package is used when one of its modules
    is."""
    names = modules(root)
    imported = {e.target for e in imports(root) if e.source != e.target}
    files = [*_files(root, code_paths), *(root / s for s in starters), *sorted((root / "docs").glob("*.md"))]
    words = {f: set(re.findall(r"[A-Za-z_][\w.]*\w", f.read_text())) for f in files if f.is_file()}

    def started(name: str) -> bool:
        name = name.removesuffix(".__main__")
        return any({name, f"{name}.handler"} & w for f, w in words.items() if f != names[name])

    used = {n for n in names if n in imported or started(n)}
    used |= {n for n in names if any(u.startswith(n + ".") for u in used)}
    return sorted(set(names) - used)


@pytest.fixture(scope="module")
def unfiltered() -> list[str]:
    return dead_names(ROOT, CONFIG["paths"], [], CONFIG["min_confidence"])


def test_no_dead_names(unfiltered):
    ignored = {f"'{n}'" for n in CONFIG["ignore_names"]}
    assert [line for line in unfiltered if not any(n in line for n in ignored)] == []


def test_every_ignored_name_is_still_needed(unfiltered):
    stale = [n for n in CONFIG["ignore_names"] if not any(f"'{n}'" in line for line in unfiltered)]
    assert stale == [], "remove these from pyproject.toml's [tool.vulture] ignore_names"


def test_every_module_is_imported_or_started_by_name():
    assert unused_modules(ROOT, CONFIG["paths"], STARTERS) == []


def test_the_checks_find_a_dead_name_and_an_unused_module(tmp_path):
    (tmp_path / "spotrun").mkdir()
    (tmp_path / "spotrun" / "__init__.py").write_text("")
    (tmp_path / "spotrun" / "A.py").write_text(
        "import dataclasses\n\n\n@dataclasses.dataclass\nclass Plan:\n    read_by_key: int\n    never_read: int\n\n\n"
        "def used():\n    return Plan(1, 2)\n\n\ndef unused():\n    return used()\n\n\nPATH = '$.plan.read_by_key'\n")
    (tmp_path / "spotrun" / "B.py").write_text("from .A import PATH, used\n\nprint(PATH, used())\n")
    (tmp_path / "spotrun" / "C.py").write_text("X = 1\n")
    (tmp_path / "spotrun" / "D.py").write_text("def handler(event, context):\n    return event\n")
    (tmp_path / "app.py").write_text("print('spotrun.D.handler')\n")
    found = dead_names(tmp_path, ["spotrun", "app.py"], ["handler", "context"], 60)
    assert found == ["spotrun/A.py:14: unused function 'unused'", "spotrun/A.py:7: unused variable 'never_read'",
                     "spotrun/C.py:1: unused variable 'X'"]
    assert unused_modules(tmp_path, ["spotrun", "app.py"], ()) == ["app", "spotrun.B", "spotrun.C"]
    (tmp_path / "Makefile").write_text("run:\n\tpython -m spotrun.B\n")
    assert unused_modules(tmp_path, ["spotrun", "app.py"], ("Makefile",)) == ["app", "spotrun.C"]
