"""Issue #26: the speed margin's cap for a trainer 10% slower ignored the deadline (mistral-7b LoRA on-demand with a
14 h deadline: 13.45 h of training, 10% slower is past 14 h at any cap). With a deadline the line and the JSON
(`cap_to_set_speed_margin.deadline_slower_share`, `priced_meets_deadline`) say how much slower the trainer may be
and still meet it, and that the priced slower trainer misses it. Checked against the planner: the same run with
its utilization (compute.utilization) that much lower is accepted or refused for the deadline."""

from __future__ import annotations

import json
from pathlib import Path

from spotrun.cli.main import main

ROOT = Path(__file__).parents[2]


def _estimate(tmp_path: Path, capsys, fmt: str = "json", **compute):
    run = json.loads((ROOT / "examples/runs/mistral-7b-lora.json").read_text())
    run["compute"].update(spot=False, **compute)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    code = main(["estimate", "--format", fmt, str(path)])
    out = capsys.readouterr().out
    return code, (json.loads(out) if fmt == "json" else out)


def test_the_slowdown_the_deadline_allows_is_the_planners(tmp_path, capsys):
    code, doc = _estimate(tmp_path, capsys, deadline_hours=14)
    assert code == 0, doc
    note = doc["cap_to_set_speed_margin"]
    allowed, priced = note["deadline_slower_share"], note["priced_slower_share"]
    assert 0 < allowed < priced and note["priced_meets_deadline"] is False, note
    layout = {"instance_type": doc["instance_type"], "instance_count": doc["instance_count"]}
    for share, meets in ((allowed * 0.95, True), (allowed * 1.05, False), (priced, False)):
        code, there = _estimate(tmp_path, capsys, deadline_hours=14, utilization=doc["utilization"] / (1 + share),
                                **layout)
        refused = code != 0 and there["error"] == "InvalidRun" and there["field"] == "compute.deadline_hours"
        assert refused is not meets, (share, there.get("message"))


def test_the_text_says_the_priced_slower_trainer_misses_the_deadline(tmp_path, capsys):
    _, doc = _estimate(tmp_path, capsys, deadline_hours=14)
    allowed = doc["cap_to_set_speed_margin"]["deadline_slower_share"]
    _, text = _estimate(tmp_path, capsys, "text", deadline_hours=14)
    line = next(x for x in text.splitlines() if x.startswith("  speed margin:"))
    assert line.endswith(f"carries a trainer 10% slower, which misses the 14 h deadline at any cap: the run takes "
                         f"{doc['spot_policy']['cap_to_set_row']['p95_wall_h']:,.2f} h at the planned speed, so the "
                         f"deadline allows a trainer {allowed * 100:.2g}% slower "
                         f"({allowed * doc['cap_to_set_speed_margin']['planned_training_seconds']:,.0f} s)"), line


def test_a_deadline_that_allows_it_is_said_to(tmp_path, capsys):
    code, doc = _estimate(tmp_path, capsys, deadline_hours=30)
    assert code == 0, doc
    note = doc["cap_to_set_speed_margin"]
    assert note["deadline_slower_share"] > note["priced_slower_share"] and note["priced_meets_deadline"], note
    assert "misses" not in note["line"], note["line"]
    _, doc = _estimate(tmp_path, capsys)
    note = doc["cap_to_set_speed_margin"]
    assert note["deadline_slower_share"] is None and note["priced_meets_deadline"] is None, note
