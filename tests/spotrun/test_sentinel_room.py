"""A run whose chosen policy keeps sentinels gets them at the cap the estimate names: the guard's own rules
(spotrun/pipeline/guard.py) leave room for one beside every on-demand job it starts, at any spend.

The case is a new user's trial: mistral with on-demand fallback and a 15.5 h deadline chose probing_sentinel and
named a cap at which every on-demand job's MaxRuntime took all the cap left, so `sentinel_limits` found no room at
any spend from $0 to $8 and the run would have been probing_greedy without its probes (P95 $31.90, over the cap)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spotrun.pipeline import guard as guard_rules
from spotrun.policy.decision import RULES
from spotrun.seams import Guard, Plan

from .test_caps_keep_the_deadline import handler_plan
from .test_new_users_trial import BUCKET, _cli, _with

ROOT = Path(__file__).parents[2]
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z, the plan's start
OURS = {"execution": "exec-1"}


@pytest.fixture(scope="module")
def mistral_run() -> dict:
    example = json.loads((ROOT / "examples/runs/mistral-7b-lora.json").read_text())
    example["model"] = {"init": "random", "config": example["model"]["config"]}  # the Lambda reads no S3 here
    return _with(example, data={"source": f"s3://{BUCKET}/datasets/summaries/"},
                 compute={"deadline_hours": 15.5, "on_demand_fallback": True}, budget={"max_usd": 300})


def test_every_on_demand_job_at_the_named_cap_leaves_the_guard_room_for_its_sentinel(tmp_path, capsys,
                                                                                      monkeypatch, mistral_run):
    code, doc = _cli(tmp_path, capsys, "estimate", mistral_run)
    assert code == 0, doc
    named = doc["spot_policy"]["deadline_cap_usd"] or doc["spot_policy"]["p95_finish_cap_usd"]
    plan = handler_plan(monkeypatch, _with(mistral_run, budget={"max_usd": named}))
    assert plan.get("status") == "ok", plan
    section = plan["estimate"]["spot_policy"]
    assert section["policy"] == "probing_sentinel", section["chosen"]  # chosen at the cap it names, too
    p = Plan.from_json(plan)
    rate = p.usd_per_hour / 3600
    look = RULES["probing_sentinel"].sentinel_poll_s  # the recheck the policy asks for while it keeps a sentinel
    first = {"action": "wait", "job_name": plan["job_name"], "spot": True, "wait_seconds": 60, "spent_before_usd": 0,
             "interruptions_before": 0, "segment": 1, "max_runtime_seconds": plan["max_runtime_seconds"],
             "max_wait_seconds": plan["max_wait_seconds"], "hyperparameters": plan["hyperparameters"],
             "segments": [], "switch_requested": True, "switch_to_spot": False}
    tried = 0
    work_s = plan["planned_steps"] * plan["seconds_per_step"]
    for hours_on_spot in (0.5, 1, 2, 4, 6, 8, 9, 10, 11, 12):
        # the spot job stopped at the policy's request after training `hours_on_spot` (its committed share of the
        # work), billed at the spot share
        trained = hours_on_spot * 3600
        billed = trained * p.spot_fraction
        step = int(plan["planned_steps"] * min(0.95, trained / work_s))
        ended = {"TrainingJobStatus": "Stopped", "SecondaryStatus": "Stopped", "BillableTimeInSeconds": billed,
                 "TrainingTimeInSeconds": trained, "CreationTime": T0}
        nxt = guard_rules.decide(p, Guard.from_json(first), ended, now=T0 + trained + 300,
                                 checkpoint_step=step, job_tags=OURS).to_json()
        if nxt["action"] == "over_budget":
            continue  # the cap ends the run here: no on-demand job, no sentinel
        assert nxt["action"] in ("segment", "continue") and nxt["spot"] is False, nxt
        on_demand = {"TrainingJobStatus": "InProgress", "SecondaryStatus": "Training", "CreationTime": T0,
                     "TrainingStartTime": T0, "StoppingCondition": {"MaxRuntimeInSeconds": nxt["max_runtime_seconds"]}}
        limits = guard_rules.sentinel_limits(p, Guard.from_json(nxt), on_demand, look)
        assert limits is not None, (hours_on_spot, nxt["spent_before_usd"], nxt["max_runtime_seconds"])
        runtime, _ = limits
        # and both jobs, run to their MaxRuntime with their stops, stay under the cap
        worst = nxt["spent_before_usd"] + (nxt["max_runtime_seconds"] + 120) * rate + (runtime + 120) * rate
        assert worst <= p.max_usd + 1e-6, worst
        tried += 1
    assert tried >= 4, tried
