"""The planner page's sample output is what `spotrun estimate` prints today (spotrun/cli/samples.py)."""

from __future__ import annotations

from pathlib import Path

from spotrun.cli.samples import BEGIN, ESTIMATE_EXAMPLE, with_sample

ROOT = Path(__file__).resolve().parents[2]


def test_the_planner_pages_estimate_sample_is_the_commands_output():
    page = (ROOT / "docs" / "planner.md").read_text(encoding="utf-8")
    assert f"`spotrun estimate {ESTIMATE_EXAMPLE}`" in page.partition(BEGIN)[0][-400:]  # the command it shows
    assert with_sample(page) == page, "regenerate it: python -m spotrun.cli.samples --page docs/planner.md"
