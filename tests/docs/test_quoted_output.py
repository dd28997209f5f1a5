"""The output blocks the docs quote are what their commands print today: each test runs the command shown beside a
block and checks every line of the block (less the `...` that marks an excerpt) among the output's, in order."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPOT_POLICY = (ROOT / "docs" / "spot-policy.md").read_text(encoding="utf-8")


def quoted_after(page: str, marker: str) -> tuple[str, list[str]]:
    """The `python -c` command of the first bash block after `marker` and the lines of the next plain block."""
    tail = page[page.index(marker):]
    found = re.search(r"```bash\n(python -c '.*?')\n```\n.*?\n```\n(.*?)\n```", tail, re.S)
    assert found, f"no command and output block after {marker!r}"
    return found.group(1), found.group(2).splitlines()


def in_order(block: list[str], output: list[str]) -> list[str]:
    """The block's lines (less `  ...`) not found in `output` in the block's order."""
    missing, at = [], 0
    for line in block:
        if line.strip() == "...":
            continue
        try:
            at = output.index(line, at) + 1
        except ValueError:
            missing.append(line)
    return missing


def test_the_8b_full_36h_policy_block_is_what_its_command_prints():
    command, block = quoted_after(SPOT_POLICY, "For Llama 3.1 8B full on 1B tokens")
    code = command.removeprefix("python -c '").removesuffix("'")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert len(block) >= 10
    assert in_order(block, out.stdout.splitlines()) == []


def test_a_line_the_output_lacks_or_reorders_is_reported():
    assert in_order(["a", "  ...", "c"], ["a", "b", "c"]) == []
    assert in_order(["c", "a"], ["a", "b", "c"]) == ["a"]
    assert in_order(["x"], ["a"]) == ["x"]
