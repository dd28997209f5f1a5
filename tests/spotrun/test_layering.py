"""The library sits apart from the Lambda entry points: nothing imports a handler module for its helpers, and the
CDK constructs import only spotrun.seams from spotrun (the names that cross into the deployed functions)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _imports(path: Path) -> list[str]:
    """Absolute names of the modules a file imports (relative imports resolved against its package)."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            out.append(module)
    return out


def test_no_module_outside_the_handlers_imports_one():
    offenders = [f"{path.relative_to(ROOT)} imports {name}"
                 for folder in ("spotrun", "training_constructs", "stacks")
                 for path in sorted((ROOT / folder).rglob("*.py")) if "handlers" not in path.parts
                 for name in _imports(path) if name == "spotrun.handlers" or name.startswith("spotrun.handlers.")]
    assert offenders == []


def test_the_constructs_import_only_the_seams_from_spotrun():
    imported = {name for path in sorted((ROOT / "training_constructs").glob("*.py")) for name in _imports(path)
                if name == "spotrun" or name.startswith("spotrun.")}
    assert imported == {"spotrun.seams"}
