"""Issue #26, a new user's trial: mistral-7b-lora, an auto layout, a 4 h deadline, the on-demand fallback. At the
smallest cap whose chain finishes no policy met the deadline on 0.0%, and the tie went to the lowest mean: the
policy the guard stopped soonest, finishing 0.0% of its runs, over maxwait_fallback finishing on 52.1% (late). The
estimate accepted it with no may-not-finish warning, and the refusal a cent under said of that policy 'the run
does not finish even uninterrupted'. Every figure compared here is read from the estimate's own output."""

from __future__ import annotations

import json
import re
from pathlib import Path

from spotrun.policy import Summary, choose
from spotrun.policy.engine import SimPlan

from .test_new_users_trial import _cli, _with

ROOT = Path(__file__).parents[2]
H = 3600.0


def _mistral(cap: float) -> dict:
    run = json.loads((ROOT / "examples/runs/mistral-7b-lora.json").read_text())
    return _with(run, compute={"instance_type": "auto", "instance_count": "auto", "deadline_hours": 4,
                               "on_demand_fallback": True}, budget={"max_usd": cap})


def _summary(label: str, mean: float, p_deadline: float, p_finished: float) -> Summary:
    return Summary(label=label, policy=label, checkpointing="notice", mean_usd=mean, p50_usd=mean, p95_usd=mean,
                   mean_spot_usd=mean, mean_on_demand_usd=0.0, p_deadline=p_deadline, p_finished=p_finished,
                   mean_lost_h=0.0, mean_steps_redone=0.0, mean_wall_h=1.0, p95_wall_h=1.0, mean_interruptions=0.0,
                   n=1000)


def _plan() -> SimPlan:
    return SimPlan(work_s=3 * H, startup_s=600.0, restore_s=60.0, save_s=60.0, interval_s=300.0, step_s=10.0,
                   notice_ok=True, spot_usd_per_h=1.0, on_demand_usd_per_h=3.0, max_wait_s=20 * H,
                   max_runtime_s=2 * H, deadline_s=4 * H)


def test_where_no_policy_meets_the_deadline_the_choice_never_prefers_one_that_finishes_less_often():
    stopped = _summary("probing_greedy", 2.98, 0.0, 0.0)  # ended at the cap, cheapest
    late = _summary("maxwait_fallback", 9.77, 0.0, 0.521)  # finishes, late
    best, why = choose.choose(_plan(), [stopped, late])
    assert best is late and "likeliest to finish (52.1%" in why, why
    # the deadline's odds before finishing: finishing 0.1 point more often does not take 95% by the deadline to 10%
    meets_often = _summary("slack_reserve_10", 30.0, 0.95, 0.994)
    finishes_late = _summary("maxwait_fallback", 10.0, 0.10, 0.995)
    assert choose.choose(_plan(), [finishes_late, meets_often])[0] is meets_often
    # the deadline's odds still decide between policies finishing as often, then the mean
    sooner = _summary("deadline_greedy", 12.0, 0.3, 0.521)
    assert choose.choose(_plan(), [stopped, late, sooner])[0] is sooner
    cheaper = _summary("slack_reserve_5", 9.0, 0.0, 0.521)
    assert choose.choose(_plan(), [late, cheaper])[0] is cheaper
    # where some policy meets the deadline on CONFIDENCE, the cheapest of those, as before
    meets = _summary("slack_reserve_25", 20.0, 0.995, 0.995)
    meets_dearer = _summary("slack_reserve_10", 25.0, 0.999, 1.0)
    assert choose.choose(_plan(), [stopped, late, meets, meets_dearer])[0] is meets


def _refused(tmp_path, capsys, cap: float = 10.0) -> tuple[float, dict]:
    """The refusal at `cap` (the trial's $10) and the smallest cap whose chain finishes it names (the layout, so
    that cap, moves with the cap: at $5,000 the estimate takes 5 x ml.g6e.xlarge)."""
    code, doc = _cli(tmp_path, capsys, "estimate", _mistral(cap))
    assert (code, doc.get("error")) == (3, "OverBudget"), doc
    return float(re.search(r"the smallest cap whose chain finishes is \$([0-9.,]+)", doc["message"])[1]), doc


def test_a_deadline_run_with_the_fallback_whose_choice_may_not_finish_is_warned_with_the_cause_and_cap(
        tmp_path, capsys):
    smallest, _ = _refused(tmp_path, capsys)
    code, doc = _cli(tmp_path, capsys, "estimate", _mistral(smallest))
    assert code == 0, doc
    section = doc["spot_policy"]
    rows = section["policies"]
    chosen = next(r for r in rows if r["label"] == section["chosen"])
    assert chosen["p_finished"] == max(r["p_finished"] for r in rows)  # no other finishes more often
    assert chosen["p_finished"] < choose.CONFIDENCE
    warned = [w for w in doc["warnings"] if w.startswith("the run may not finish")]
    assert len(warned) == 1, doc["warnings"]
    assert f"{section['chosen']}'s runs finish on {chosen['p_finished']:.1%}" in warned[0], warned
    at_cap = min(1 - chosen["p_finished"], chosen["p_over_budget"])
    assert at_cap > 0 and f"{at_cap:.1%} end at the cap (OverBudget)" in warned[0], warned
    # the cap to set named once among the warnings (here the deadline's names it, so this one does not)
    naming = [w for w in doc["warnings"] if f"${section['cap_to_set_usd']:,.2f}" in w]
    assert len(naming) == 1, doc["warnings"]


def test_the_refusal_says_does_not_finish_uninterrupted_only_of_the_policy_that_does_not(tmp_path, capsys):
    smallest, doc = _refused(tmp_path, capsys)
    said = re.search(r"the smallest cap whose chain finishes is \$([0-9.,]+) \(the planner's chain\): simulated "
                     r"there, the run finishes uninterrupted and ([0-9.]+)% of its 1,000 simulated runs finish",
                     doc["message"])
    assert said, doc["message"]
    assert "even uninterrupted" not in doc["message"]
    code, there = _cli(tmp_path, capsys, "estimate", _mistral(smallest))
    row = next(r for r in there["spot_policy"]["policies"] if r["label"] == there["spot_policy"]["chosen"])
    assert f"{row['p_finished']:.1%}" == f"{said[2]}%"


def test_the_refusal_names_the_policy_that_does_not_finish_uninterrupted_and_the_one_that_finishes(
        tmp_path, capsys, monkeypatch):
    """Where the chosen policy is one the guard stops at the cap even uninterrupted (here the old rule's cheapest
    of the policies meeting the deadline on 0.0%, put back), the words are said of it, beside the policy whose runs
    finish there."""
    real = choose.choose

    def cheapest_of_the_missing(plan, rows, confidence=choose.CONFIDENCE, cap_usd=None, finish=None):
        best, why = real(plan, rows, confidence, cap_usd, finish)
        within = [r for r in rows if r.label not in choose.left_out_by_cap(rows, cap_usd, finish)] or rows
        if plan.deadline_s is not None and not any(r.p_deadline >= confidence for r in within):
            best = max(within, key=lambda r: (r.p_deadline, -r.mean_usd))
        return best, why

    monkeypatch.setattr(choose, "choose", cheapest_of_the_missing)
    _, doc = _refused(tmp_path, capsys)
    rows = doc["estimate"]["spot_policy"]["policies"]
    chosen = doc["estimate"]["spot_policy"]["chosen"]
    likeliest = max(rows, key=lambda r: r["p_finished"])
    assert likeliest["label"] != chosen and likeliest["p_finished"] > 0
    assert (f"the chosen {chosen}'s run does not finish even uninterrupted ({likeliest['label']}'s runs finish "
            f"there on {likeliest['p_finished']:.1%}") in doc["message"], doc["message"]
