"""Comments stay true: every repository path a source file, the README or the Makefile cites (`spotrun/...`,
`tests/...`, `benchmarks/...`, ...) exists. A file that moves or is deleted fails here until its citations follow."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOP = ("spotrun", "tests", "training_image", "training_constructs", "stacks", "benchmarks", "examples")
# benchmarks/NAME.py: a pattern, not a file (an all-capitals name other than README and the like)
PLACEHOLDER = re.compile(r"(?:^|/)(?!(?:README|LICENSE|CHANGELOG|NOTICE)\b)[A-Z][A-Z_]*(?:\.\w+)?(?:/|$)")
CITED = re.compile(rf"(?<![\w./-])((?:{'|'.join(TOP)})/[\w./-]*\w\.(?:py|json|md|txt|toml|sh))\b")


def _tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return out.split()


def test_every_cited_repository_file_exists():
    tracked = _tracked()
    assert len(tracked) > 100  # the listing worked
    files = set(tracked)
    sources = [f for f in tracked if f.endswith((".py", ".md", ".toml", ".sh", "Makefile", "Dockerfile"))]
    missing = []
    for name in sources:
        text = (ROOT / name).read_text(errors="replace")
        for lineno, line in enumerate(text.splitlines(), 1):
            missing += [f"{name}:{lineno}: {path}" for path in CITED.findall(line)
                        if path not in files and not (ROOT / path).exists() and not PLACEHOLDER.search(path)]
    assert not missing, "cited but not in the repository:\n" + "\n".join(missing)
