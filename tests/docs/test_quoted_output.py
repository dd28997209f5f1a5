"""The figures docs/spot-policy.md quotes are what their commands make today: an output block's lines (less the `...`
that marks an excerpt) among its command's output, in order; a table row against what its bench computes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.simulate_bench import DEADLINE_FACTOR, plan_run
from spotrun.planner.estimate import estimate, load_catalog
from spotrun.policy.choose import ESTIMATE_TRACES, candidates, horizon_s, plan_from_estimate
from spotrun.policy.report import study
from spotrun.policy.traces import TraceSpec, generated_traces

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


@pytest.mark.slow
def test_the_plan_tables_70b_row_at_the_catalogs_rate_is_what_the_bench_chooses_and_measures():
    """The row the tie rule moved (`python benchmarks/simulate_bench.py --only plans`): its chosen policy, P(deadline),
    mean and interruptions, as the bench makes them (chosen on seed 0, measured on seed 1), less the optimum."""
    run = plan_run("Llama 3.1 70B full")
    est = estimate(run)
    deadline = round(DEADLINE_FACTOR * est.wall_seconds / 3600, 1)
    plan = plan_from_estimate(est, load_catalog(), deadline_s=deadline * 3600)
    spec = TraceSpec(est.interruptions_per_hour, horizon_s(plan), **ESTIMATE_TRACES)
    report = study(plan, generated_traces(spec, 1000, seed=1), candidates(plan), optimum=False,
                   choose_on=generated_traces(spec, 1000, seed=0))
    label = (f"Llama 3.1 70B full ({est.instance_count} x {est.instance_type}, {plan.work_s / 3600:.1f} h, deadline "
             f"{deadline:g} h), catalog ({est.interruptions_per_hour:.2g}/h), fitted")
    rows = [line for line in SPOT_POLICY.splitlines() if line.startswith(f"| {label} |")]
    assert len(rows) == 1, label
    cells = rows[0].strip("| ").split(" | ")
    chosen = next(r for r in report["policies"] if r["label"] == report["chosen"])
    assert cells[1:4] == [report["chosen"], f"{chosen['p_deadline']:.1%}", f"${chosen['mean_usd']:,.0f}"]
    assert cells[9] == f"{chosen['mean_interruptions']:.2f}"
