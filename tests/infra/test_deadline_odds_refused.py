"""The estimate Lambda's function (spotrun.pipeline.plan.plan) refuses a deadline no spot policy meets on the
promised odds as `spotrun estimate` does (tests/spotrun/test_deadline_odds.py), before anything is created or
paid: InvalidRun naming compute.deadline_hours, with the simulated fixes in its message; accepted with
compute.accept_missed_deadline."""

from __future__ import annotations

from spotrun.pipeline.plan import plan
from tests.infra.test_finish_or_refuse import SETTINGS, _example


def _mistral(**compute) -> dict:
    run = _example("mistral-7b-lora")
    run["compute"].update({"deadline_hours": 3, "on_demand_fallback": False, **compute})
    return run


def test_the_estimate_lambda_refuses_a_deadline_every_policy_misses_and_starts_the_accepted_one():
    out = plan(_mistral(), "deadline-odds", SETTINGS)
    assert out["status"] == "InvalidRun" and out.get("field") == "compute.deadline_hours", out
    assert "compute.on_demand_fallback=true:" in out["message"] and "compute.accept_missed_deadline=true" in \
        out["message"], out["message"]
    accepted = plan(_mistral(accept_missed_deadline=True), "deadline-odds-ok", SETTINGS)
    assert accepted["status"] == "ok", accepted
