"""A deadline no spot policy meets on the odds the project promises (choose.CONFIDENCE of the simulated runs) is
refused before anything is paid, InvalidRun naming compute.deadline_hours, unless compute.accept_missed_deadline: a
new user's mistral-7b-lora with deadline_hours=3 and no on-demand fallback was told 'ok', exit 0, at 40.8%. The
refusal names the fixes, each simulated. The held-out margin says what it was measured on, and `spotrun simulate`
names capacity harsher than the estimate's."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

from spotrun.cli.main import main
from spotrun.cli.simulate import not_borne_out
from spotrun.policy import choose

ROOT = Path(__file__).parents[2]


def _mistral(tmp_path: Path, **compute) -> Path:
    run = json.loads((ROOT / "examples/runs/mistral-7b-lora.json").read_text())
    run["compute"].update({"deadline_hours": 3, "on_demand_fallback": False, **compute})
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    return path


def test_a_deadline_every_policy_misses_is_refused_naming_the_simulated_fixes(tmp_path, capsys):
    code = main(["estimate", "--format", "json", str(_mistral(tmp_path))])
    doc = json.loads(capsys.readouterr().out)
    assert code != 0 and doc["error"] == "InvalidRun" and doc["field"] == "compute.deadline_hours", doc
    odds = doc["deadline_odds"]
    assert odds["p_deadline"] < choose.CONFIDENCE, odds
    assert f"met on only {odds['p_deadline']:.1%}" in doc["message"], doc["message"]
    # each fix with its simulated odds: the fallback's and the least deadline a policy meets on the confidence
    fallback = odds["with_on_demand_fallback"]
    assert f"compute.on_demand_fallback=true: {fallback['policy']} meets it on {fallback['p_deadline']:.1%}" in \
        doc["message"], doc["message"]
    least = odds["least_deadline_hours"]
    assert least is not None and least > 3, odds
    said = re.search(rf"compute.deadline_hours={least:g}: .+? meets it on ([0-9.]+)%", doc["message"])
    assert said and float(said[1]) >= 100 * choose.CONFIDENCE, doc["message"]
    assert "compute.accept_missed_deadline=true" in doc["message"], doc["message"]


def test_the_accepted_miss_starts_with_its_odds_said(tmp_path, capsys):
    code = main(["estimate", "--format", "json", str(_mistral(tmp_path, accept_missed_deadline=True))])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0, doc
    section = doc["spot_policy"]
    row = next(r for r in section["policies"] if r["label"] == section["chosen"])
    assert row["p_deadline"] < choose.CONFIDENCE, row
    assert any(f"on {row['p_deadline']:.1%}" in w for w in doc["warnings"]), doc["warnings"]


def test_the_held_out_margin_says_what_it_was_measured_on_and_what_it_does_not_cover():
    for text in (choose.held_out_margin_text("P(deadline)"), choose.held_out_margin_brief("P(deadline)")):
        assert "17 public recordings each left out of the" in text and "fit" in text, text
        assert "harsher" in text and "capacity" in text, text


def _odds_line(here_interruptions: float, told_interruptions: float) -> str:
    chosen = "maxwait_fallback (notice)"
    row = {"label": chosen, "p_finished": 0.80, "p_deadline": 0.60, "p_over_budget": 0.0, "mean_usd": 1.0,
           "p95_usd": 1.0, "mean_interruptions": here_interruptions}
    report = {"policies": [row], "deadline_hours": 12.0, "cap_usd": 200.0, "layout": "1 x ml.p5.48xlarge"}
    section = SimpleNamespace(chosen=chosen, sim_plan={"on_demand_fallback": False}, deadline_cap_usd=None,
                              p95_finish_cap_usd=None, cap_to_set_layout=None,
                              policies=[{"label": chosen, "mean_usd": 1.0, "p95_usd": 1.0, "p_finished": 0.99,
                                         "p_deadline": 0.99, "mean_interruptions": told_interruptions}])
    line, = [x for x in not_borne_out(report, section, recorded=True) if x.startswith("  not borne out here:")]
    return line


def test_simulate_names_harsher_capacity_when_the_traces_interrupt_more_than_the_estimate():
    """llama on the public recordings: 4.56 interruptions per run against the estimate's 0.95."""
    line = _odds_line(4.56, 0.95)
    assert "harsher capacity than the estimate's: 4.56 interruptions per run here against 0.95" in line, line
    assert "harsher" not in _odds_line(0.95, 0.95)
