"""Issue #26, what the user is told versus what happens: an OverBudget refusal names a cap to set; where no policy
meets the run's deadline on 99% at any cap, the estimate at that cap refuses compute.deadline_hours (unless
compute.accept_missed_deadline), and the refusal said nothing of it (mistral on ml.g5.2xlarge, count auto, 30 h
without fallback at $5: the user set the named cap and was refused again, for another reason). The party checked
against is the accepted path itself: `spotrun estimate` at the cap the refusal names."""

from __future__ import annotations

import json
from pathlib import Path

from .test_new_users_trial import _cli, _with

ROOT = Path(__file__).parents[2]
SAID = "so the estimate at it refuses compute.deadline_hours unless compute.accept_missed_deadline=true"


def _mistral(**compute) -> dict:
    run = json.loads((ROOT / "examples/runs/mistral-7b-lora.json").read_text())
    return _with(run, compute={"instance_type": "ml.g5.2xlarge", "deadline_hours": 30, "on_demand_fallback": False,
                               **compute})


def test_an_over_budget_refusal_says_its_cap_to_set_is_refused_for_the_deadline_and_it_is(tmp_path, capsys):
    run = _mistral()
    code, doc = _cli(tmp_path, capsys, "estimate", _with(run, budget={"max_usd": 5}))
    assert (code, doc["error"]) == (3, "OverBudget"), doc
    to_set = doc["estimate"]["spot_policy"]["cap_to_set_usd"]
    assert to_set is not None and f"the cap to set is ${to_set:,.2f}" in doc["message"], doc["message"]
    assert SAID in doc["message"], doc["message"]
    assert doc["cap_to_set_refused_field"] == "compute.deadline_hours", doc
    # what happens at the cap it names: the estimate refuses the deadline's odds, on the field it said
    code, there = _cli(tmp_path, capsys, "estimate", _with(run, budget={"max_usd": to_set}))
    assert (there.get("error"), there.get("field")) == ("InvalidRun", "compute.deadline_hours"), there
    assert code != 0
    # accepted, the same refusal does not say it (the estimate at its cap to set starts: test_over_on_demand_names_
    # the_cap_to_sets_figures.py's m-g5-dl30-nofb-cap5 case)
    accepted = _with(run, compute={"accept_missed_deadline": True})
    code, doc = _cli(tmp_path, capsys, "estimate", _with(accepted, budget={"max_usd": 5}))
    assert (code, doc["error"]) == (3, "OverBudget"), doc
    assert SAID not in doc["message"] and doc["cap_to_set_refused_field"] is None, doc
