"""The import graph of the repository's own code, read with ast (nothing is imported), and the layering rules
checked on it: which parts may import which, what a Lambda handler's imports reach, import circles, and a reason
beside every import inside a function. tests/spotrun/test_layering.py runs each rule on the real tree and on tiny
fake trees (so each rule is seen to fail)."""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

# Where the repository's importable code lives: (folder holding the top-level package, the package or module).
SOURCES = (("", "spotrun"), ("training_image", "spotrun_trainer"), ("", "training_constructs"), ("", "stacks"),
           ("", "app.py"))
# What the Lambda Python runtime provides besides the standard library (training_constructs/lambda_code.py ships
# the `spotrun` package alone).
LAMBDA_RUNTIME = frozenset({"boto3", "botocore"})


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # an own module's name, or the top-level name of a third-party/stdlib package
    line: int
    in_function: bool
    own: bool  # target is one of the repository's modules


def modules(root: Path) -> dict[str, Path]:
    """Every own module's dotted name -> its file."""
    out = {}
    for folder, top in SOURCES:
        base = root / folder if folder else root
        path = base / top
        if path.suffix == ".py":
            if path.is_file():
                out[path.stem] = path
            continue
        for file in sorted(path.rglob("*.py")):
            parts = file.relative_to(base).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = file
    return out


def _package(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _resolve(names: dict[str, Path], source: str, node: ast.ImportFrom | ast.Import) -> list[tuple[str, bool]]:
    """The modules one import statement loads: (name, own). `from p import m` loads p.m when it is a module."""
    if isinstance(node, ast.Import):
        wanted = [alias.name for alias in node.names]
    else:
        base = ""
        if node.level:
            package = _package(source, names[source])
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
        module = ".".join(p for p in (base, node.module or "") if p)
        wanted = [f"{module}.{a.name}" if f"{module}.{a.name}" in names else module for a in node.names]
    out = []
    for name in dict.fromkeys(wanted):
        if name in names or name.split(".")[0] in {n.split(".")[0] for n in names}:
            # an own module: it and the packages above it run when it is imported (but the importer's own packages
            # are already running: a submodule importing a sibling does not import its package again)
            parts = name.split(".")
            above = [".".join(parts[:i]) for i in range(1, len(parts))]
            out += [(p, True) for p in above if p in names and not source.startswith(p + ".")]
            if name in names:
                out.append((name, True))
        else:
            out.append((name.split(".")[0], False))
    return out


def imports(root: Path) -> list[Import]:
    """Every import statement of every own module, resolved, with whether it sits inside a function."""
    names = modules(root)
    out = []
    for source, path in names.items():
        tree = ast.parse(path.read_text(), str(path))
        inside = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                  for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                out += [Import(source, target, node.lineno, id(node) in inside, own)
                        for target, own in _resolve(names, source, node) if target != source]
    return out


def forbidden(edges: list[Import], importers: tuple[str, ...], allowed: tuple[str, ...] = (),
              banned: tuple[str, ...] = ()) -> list[str]:
    """Imports from modules under `importers` of own modules that are under `banned`, or (with `allowed`) of own
    modules of the other parts not under `allowed`."""
    def under(name: str, prefixes: tuple[str, ...]) -> bool:
        return any(name == p or name.startswith(p + ".") for p in prefixes)
    out = []
    for e in edges:
        if not e.own or not under(e.source, importers) or under(e.target, importers):
            continue
        above_allowed = any(a.startswith(e.target + ".") for a in allowed)  # a package run on the way to one
        if under(e.target, banned) or (allowed and not under(e.target, allowed) and not above_allowed):
            out.append(f"{e.source}:{e.line} imports {e.target}")
    return sorted(out)


def closure_outside(edges: list[Import], start: str, allowed_external: frozenset[str], own_prefix: str) -> list[str]:
    """What `start` needs, transitively (imports inside functions included), that is not an own module under
    `own_prefix`, the standard library or `allowed_external`: one chain of imports per offending name."""
    graph: dict[str, list[Import]] = {}
    for e in edges:
        graph.setdefault(e.source, []).append(e)
    seen, queue, via = {start}, [start], {start: ""}
    found = {}
    while queue:
        here = queue.pop(0)
        for e in graph.get(here, []):
            chain = f"{via[here]} -> {e.target}" if via[here] else f"{here} -> {e.target}"
            if e.own and (e.target == own_prefix or e.target.startswith(own_prefix + ".")):
                if e.target not in seen:
                    seen.add(e.target)
                    via[e.target] = chain
                    queue.append(e.target)
            elif not e.own and (e.target in sys.stdlib_module_names or e.target in allowed_external):
                continue
            else:
                found.setdefault(e.target, f"{chain} (line {e.line} of {here})")
    return sorted(found.values())


def cycle(edges: list[Import]) -> list[str]:
    """One import circle among own modules (module names, first repeated at the end), or [] when there is none."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        if e.own:
            graph.setdefault(e.source, set()).add(e.target)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []


def unexplained_local_imports(root: Path) -> list[str]:
    """Imports inside a function without a comment on their line(s) or on the line above the run of import
    statements they belong to."""
    out = []
    for name, path in modules(root).items():
        text = path.read_text()
        comments = {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(text).readline)
                    if tok.type == tokenize.COMMENT}
        tree = ast.parse(text, str(path))
        import_lines = {line for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                        for line in range(n.lineno, n.end_lineno + 1)}
        for f in ast.walk(tree):
            if not isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(f):
                if not isinstance(node, (ast.Import, ast.ImportFrom)):
                    continue
                above = node.lineno - 1
                while above in import_lines:
                    above -= 1
                if comments.isdisjoint(range(node.lineno, node.end_lineno + 1)) and above not in comments:
                    out.append(f"{path.relative_to(root)}:{node.lineno} ({name})")
    return sorted(set(out))
