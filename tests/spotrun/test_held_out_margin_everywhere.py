"""Issue #26: the held-out margin of odds at a cap that ends runs (`HELD_OUT_OVER_AT_CAP_POINTS`, the estimate's
line under its table) is also in the estimate's `--format json` and in `spotrun simulate` on generated traces: a new
user's `simulate` of qwen2 at a $0.73 cap printed 95.7% without it, and the JSON carried the odds alone."""

from __future__ import annotations

import json
from pathlib import Path

from spotrun.cli.main import main
from spotrun.policy.availability import HELD_OUT_OVER_AT_CAP_POINTS

ROOT = Path(__file__).parents[2]
MARGIN = "public recordings each left out of the availability model's fit"


def _run(tmp_path: Path, cap: float) -> Path:
    run = json.loads((ROOT / "examples/runs/qwen2-0.5b-full-small.json").read_text())
    run["budget"]["max_usd"] = cap
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    return path


def test_the_estimates_json_carries_the_margin_its_text_prints(tmp_path, capsys):
    path = _run(tmp_path, 0.73)
    assert main(["estimate", str(path)]) == 0
    # the table's line (the cap to set's line says it of the odds proven there: `cap_to_set_held_out_margin`)
    line, = [x.strip() for x in capsys.readouterr().out.splitlines() if MARGIN in x and x.startswith("  at this cap")]
    assert main(["estimate", "--format", "json", str(path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    margin = doc["held_out_margin"]
    assert margin is not None and margin["line"] == line, margin
    assert (margin["mean_points"], margin["largest_points"]) == HELD_OUT_OVER_AT_CAP_POINTS, margin
    ended = [r["label"] for r in doc["spot_policy"]["policies"] if r["p_over_budget"] > 0]
    assert ended and margin["policies"] == ended and margin["odds"] == "P(finished)", (margin, ended)


def test_no_margin_in_the_json_where_the_cap_ends_no_run(tmp_path, capsys):
    assert main(["estimate", "--format", "json", str(_run(tmp_path, 50.0))]) == 0
    assert json.loads(capsys.readouterr().out)["held_out_margin"] is None


def test_simulate_on_generated_traces_says_the_margin_at_a_cap_that_ends_runs(tmp_path, capsys):
    path = _run(tmp_path, 0.73)
    assert main(["simulate", str(path), "--n", "200", "--out", str(tmp_path / "gen")]) == 0
    text = capsys.readouterr().out
    report = json.loads((tmp_path / "gen" / "simulate.json").read_text())
    ended = [r["label"] for r in report["policies"] if r["p_over_budget"] > 0 and r["p_finished"] > 0]
    assert ended, report["policies"]  # the case: the cap ends some runs here too
    line, = [x.strip() for x in text.splitlines() if MARGIN in x and x.startswith("  at this cap")]
    assert report["held_out_margin"]["line"] == line and report["held_out_margin"]["policies"] == ended, report
    mean, largest = HELD_OUT_OVER_AT_CAP_POINTS
    assert f"read {mean:.1f} points high on average and up to {largest:.1f}" in line, line


def test_simulate_on_recordings_gives_their_own_odds_without_the_margin(tmp_path, capsys):
    traces = tmp_path / "traces"
    traces.mkdir()
    # 30 min with capacity, 20 without: interrupted often enough that the cap ends some runs
    (traces / "t.json").write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": ([1] * 3 + [0] * 2) * 400}))
    path = _run(tmp_path, 0.73)
    assert main(["simulate", str(path), "--n", "20", "--traces", str(traces), "--out", str(tmp_path / "rec")]) == 0
    # the table's odds are the recordings' own (the cap to set's line quotes the estimate's, with their margin)
    assert not [x for x in capsys.readouterr().out.splitlines() if MARGIN in x and x.startswith("  at this cap")]
    report = json.loads((tmp_path / "rec" / "simulate.json").read_text())
    assert any(r["p_over_budget"] > 0 and r["p_finished"] > 0 for r in report["policies"]), report["policies"]
    assert report["held_out_margin"] is None
