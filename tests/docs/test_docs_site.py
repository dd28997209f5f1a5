"""The README is one page and the docs site builds: strictly (a broken link or anchor, a page missing from the nav
fails), with the generated references current and the README's example a valid run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from spotrun.cli.reference import reference
from spotrun.contract.spec import parse_run

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_readme_is_a_page_with_the_two_commands():
    assert len(README.splitlines()) <= 200
    assert "make demo" in README and "make test" in README


def test_every_page_the_readme_links_exists():
    links = re.findall(r"\]\((docs/[^)#]+)", README)
    assert len(links) >= 15
    assert [link for link in links if not (ROOT / link).is_file()] == []


def test_the_readmes_run_json_is_a_valid_run():
    example = re.search(r"```json\n(.*?)```", README, re.S).group(1)
    assert parse_run(json.loads(example)).name == "support-chat"


def test_the_cli_reference_page_is_the_generated_one():
    page = (ROOT / "docs" / "cli-reference.md").read_text(encoding="utf-8")
    assert page == reference(), "regenerate it: python -m spotrun.cli.reference --page docs/cli-reference.md"


@pytest.mark.slow
def test_the_docs_site_builds_strictly(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    home = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert "support-chat" in home  # the README became the home page
    built = {p.parent.name for p in (tmp_path / "site").glob("*/index.html")}
    assert {p.stem for p in (ROOT / "docs").glob("*.md")} - {"index"} <= built
    fields = (tmp_path / "site" / "run-fields" / "index.html").read_text(encoding="utf-8")
    assert "<code>training.lr</code>" in fields and "<code>export.from</code>" in fields  # the contract's table
