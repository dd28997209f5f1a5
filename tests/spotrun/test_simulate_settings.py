"""`spotrun simulate` says what `spotrun estimate` sets the same run up with (issue #30: the estimate printed a
`sentinel:` line and the cap to set, simulate neither): the same lines, from the same code
(spotrun/policy/choose.py `settings_lines`), and the same figures in its JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spotrun.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples" / "runs").glob("*.json"))


def _with_deadline(tmp_path: Path) -> Path:
    run = json.loads(EXAMPLES[0].read_text())
    run["compute"].update(deadline_hours=36, on_demand_fallback=True)
    path = tmp_path / "deadline.json"
    path.write_text(json.dumps(run))
    return path


@pytest.mark.parametrize("which", [*(p.name for p in EXAMPLES), "deadline"])
def test_simulate_prints_the_estimates_sentinel_and_cap_to_set(which, tmp_path, capsys):
    path = _with_deadline(tmp_path) if which == "deadline" else ROOT / "examples" / "runs" / which
    assert main(["estimate", str(path)]) == 0
    estimate_text = capsys.readouterr().out
    assert main(["estimate", str(path), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    section = doc["spot_policy"]
    wanted = [line for line in estimate_text.splitlines() if line.startswith(("  sentinel: ", "  the cap to set: "))]
    assert len(wanted) == 2, estimate_text
    assert main(["simulate", str(path), "--no-optimum", "--out", str(tmp_path / "out")]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    at = lines.index(f"as `spotrun estimate` sets the run up (its choice: {section['chosen']}, on its "
                     f"{section['traces']:,} traces):")
    assert lines[at + 1:at + 3] == wanted, text
    assert (tmp_path / "out" / "simulate.txt").read_text().splitlines()[at:at + 3] == lines[at:at + 3]
    report = json.loads((tmp_path / "out" / "simulate.json").read_text())
    assert report["estimate_policy"] == {
        "chosen": section["chosen"], "traces": section["traces"], "sentinel": section["sentinel"],
        "cap_to_set_usd": section["deadline_cap_usd"] or section["p95_finish_cap_usd"],
        "cap_to_set_speed_margin": doc["cap_to_set_speed_margin"],  # the estimate's (null: these are spot runs)
        "cap_to_set_held_out_margin": doc["cap_to_set_held_out_margin"],
        "larger_cap_bills_less": doc["larger_cap_bills_less"]}
