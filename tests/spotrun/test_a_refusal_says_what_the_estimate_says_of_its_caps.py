"""Issue #26 (a new user's fourth trial): an OverBudget refusal names the smallest cap whose chain finishes and a cap
to set, with the odds simulated at each; it must say of them what the accepted estimate says. It lacked the held-out
margin of odds at a cap that ends runs (`HELD_OUT_OVER_AT_CAP_POINTS`) that the accepted estimate prints under its
table, the speed margin an on-demand cap to set is printed with, and their JSON (`held_out_margin`,
`cap_to_set_speed_margin`); its `cap_to_set_layout` named the refused estimate's own layout, where the field is
null (docs/cap-and-segments.md). Every expected figure is read from the accepted estimate at the cap named."""

from __future__ import annotations

import json
from pathlib import Path

from spotrun.policy.availability import HELD_OUT_OVER_AT_CAP_POINTS

from .test_new_users_trial import _cli, _with

ROOT = Path(__file__).parents[2]


def _example(name: str, **sections) -> dict:
    return _with(json.loads((ROOT / "examples/runs" / f"{name}.json").read_text()), **sections)


def _refused_a_cent_under(tmp_path, capsys, run: dict) -> tuple[dict, float]:
    """The refusal of `run` a cent under its smallest cap whose chain finishes, and that cap."""
    code, doc = _cli(tmp_path, capsys, "estimate", _with(run, budget={"max_usd": 5000}))
    assert code == 0, doc
    smallest = doc["segments"]["min_cap_usd"]
    code, doc = _cli(tmp_path, capsys, "estimate", _with(run, budget={"max_usd": round(smallest - 0.01, 2)}))
    assert (code, doc["error"]) == (3, "OverBudget"), doc
    return doc, smallest


def test_odds_quoted_at_caps_that_end_runs_come_with_the_held_out_margin(tmp_path, capsys):
    """mistral-7b-lora refused at $10 quoted 60.0% at $12.39 and 99.1% at $12.98, both caps ending some runs."""
    from spotrun.policy.choose import held_out_margin_brief  # (new with the fix)

    run = _example("mistral-7b-lora")
    refused, smallest = _refused_a_cent_under(tmp_path, capsys, run)
    section = refused["estimate"]["spot_policy"]
    to_set = section["cap_to_set_usd"]
    code, there = _cli(tmp_path, capsys, "estimate", _with(run, budget={"max_usd": to_set}))
    assert code == 0, there
    chosen = next(r for r in there["spot_policy"]["policies"] if r["label"] == there["spot_policy"]["chosen"])
    assert chosen["p_over_budget"] > 0 and there["held_out_margin"] is not None, there["spot_policy"]
    assert chosen["label"] in there["held_out_margin"]["policies"], there["held_out_margin"]
    # the refusal says the same margin of the odds it quotes at the cap to set, and of the table it carries
    margin = refused["cap_to_set_held_out_margin"]
    assert margin["policies"] == [chosen["label"]] and margin["cap_usd"] == to_set, margin
    assert (margin["mean_points"], margin["largest_points"]) == HELD_OUT_OVER_AT_CAP_POINTS, margin
    ended = [r["label"] for r in section["policies"] if r["p_over_budget"] > 0 and r["p_finished"] > 0]
    assert ended and refused["held_out_margin"]["policies"] == ended, refused["held_out_margin"]
    assert refused["held_out_margin"]["line"].startswith(f"at ${smallest:,.2f} the guard ends"), refused
    said = f"at ${smallest:,.2f} and at ${to_set:,.2f} the guard ends some of these simulated runs (OverBudget): "
    assert said + held_out_margin_brief(there["held_out_margin"]["odds"]) in refused["message"], refused["message"]


def test_an_on_demand_refusal_says_the_speed_margin_the_estimate_at_its_cap_to_set_says(tmp_path, capsys):
    """qwen2 on-demand with a 30 min warm pool refused at $1.98 named $1.99 as the cap to set, without the speed
    line the estimate at $1.99 prints (its trainer may be 0.5% slower)."""
    run = _example("qwen2-0.5b-full-small", compute={"spot": False, "warm_pool_minutes": 30})
    refused, smallest = _refused_a_cent_under(tmp_path, capsys, run)
    to_set = refused["estimate"]["spot_policy"]["cap_to_set_usd"]
    code, there = _cli(tmp_path, capsys, "estimate", _with(run, budget={"max_usd": to_set}))
    assert code == 0, there
    speed = there["cap_to_set_speed_margin"]
    assert speed is not None and refused["cap_to_set_speed_margin"] == speed, (refused, speed)
    assert speed["line"] in refused["message"], refused["message"]


def test_the_cap_to_set_layout_is_null_where_it_is_the_refused_estimates_own(tmp_path, capsys):
    """llama3-8b-full (auto layout) with a 9 h deadline refused at $100 on 1 x ml.p5.48xlarge named its cap to set on
    1 x ml.p5.48xlarge, and its JSON said `cap_to_set_layout: "1 x ml.p5.48xlarge"`, which the docs keep for
    another layout than the estimate's."""
    run = _example("llama3-8b-full", compute={"deadline_hours": 9}, budget={"max_usd": 100})
    code, refused = _cli(tmp_path, capsys, "estimate", run)
    assert (code, refused["error"]) == (3, "OverBudget"), refused
    est = refused["estimate"]
    own = f"{est['instance_count']} x {est['instance_type']}"
    named = est["spot_policy"]["cap_to_set_layout"]
    assert named != own, named
    to_set = est["spot_policy"]["cap_to_set_usd"]
    code, there = _cli(tmp_path, capsys, "estimate", _with(run, budget={"max_usd": to_set}))
    assert code == 0, there
    assert f"{there['instance_count']} x {there['instance_type']}" == (named or own), (named, own)
