"""A run whose chosen policy keeps sentinels gets them at the cap the estimate names: the guard's own rules
(spotrun/pipeline/guard.py) leave room for one beside every on-demand job it starts, at any spend.

The case is a new user's trial: mistral with on-demand fallback and a 15.5 h deadline chose probing_sentinel and
named a cap at which every on-demand job's MaxRuntime took all the cap left, so `sentinel_limits` found no room at
any spend from $0 to $8 and the run would have been probing_greedy without its probes (P95 $31.90, over the cap)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from spotrun.pipeline import guard as guard_rules
from spotrun.planner.segments import plan_chain, smallest_cap
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
                 compute={"deadline_hours": 15.5, "on_demand_fallback": True,
                          # the trial's layout (the cheapest spot rate), where probing_sentinel is chosen: with
                          # `auto` the estimate compares layouts by the chosen policy's bill and takes 3 nodes,
                          # deadline_greedy (tests/spotrun/test_layout_by_policy.py)
                          "instance_type": "ml.g6e.xlarge", "instance_count": 1},
                 budget={"max_usd": 300})


def test_every_on_demand_job_at_the_named_cap_leaves_the_guard_room_for_its_sentinel(tmp_path, capsys,
                                                                                      monkeypatch, mistral_run):
    code, doc = _cli(tmp_path, capsys, "estimate", mistral_run)
    assert code == 0, doc
    named = doc["spot_policy"]["deadline_cap_usd"] or doc["spot_policy"]["p95_finish_cap_usd"]
    plan = handler_plan(monkeypatch, _with(mistral_run, budget={"max_usd": named}))
    assert plan.get("status") == "ok", plan
    section = plan["estimate"]["spot_policy"]
    # At the cap it names the estimate models the cap (spotrun/policy/execution.py `Cap`): a run that moved to
    # on-demand early finds no room for its sentinel there and stays on-demand, so probing_sentinel's P95 is the
    # on-demand bill and another policy can be chosen. The guard's rules under test are the sentinel policy's: the
    # plan at that cap, executing it.
    section.update(policy="probing_sentinel", chosen=f"probing_sentinel ({section['checkpointing']})")
    p = Plan.from_json(plan)
    rate = p.usd_per_hour / 3600
    look = RULES["probing_sentinel"].sentinel_poll_s  # the recheck the policy asks for while it keeps a sentinel
    first = {"action": "wait", "job_name": plan["job_name"], "spot": True, "wait_seconds": 60, "spent_before_usd": 0,
             "interruptions_before": 0, "segment": 1, "max_runtime_seconds": plan["max_runtime_seconds"],
             "max_wait_seconds": plan["max_wait_seconds"], "hyperparameters": plan["hyperparameters"],
             "segments": [], "switch_requested": True, "switch_to_spot": False}
    tried = without_room = 0
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
        with_room = plan_chain(cap_usd=p.max_usd, spent_usd=nxt["spent_before_usd"],
                               work_s=guard_rules.work_left(p, step), costs=guard_rules.chain_costs(p), first=False,
                               spot=False)
        if not with_room.fits:  # the cap pays the finish but not the room: on-demand without a sentinel
            assert limits is None and nxt["spent_before_usd"] + (nxt["max_runtime_seconds"] + 120) * rate <= \
                p.max_usd + 1e-6, nxt
            without_room += 1
            continue
        assert limits is not None, (hours_on_spot, nxt["spent_before_usd"], nxt["max_runtime_seconds"])
        runtime, _ = limits
        # and both jobs, run to their MaxRuntime with their stops, stay under the cap
        worst = nxt["spent_before_usd"] + (nxt["max_runtime_seconds"] + 120) * rate + (runtime + 120) * rate
        assert worst <= p.max_usd + 1e-6, worst
        tried += 1
    assert tried >= 4, (tried, without_room)


def test_an_on_demand_job_the_cap_pays_for_but_not_its_sentinels_room_runs_without_a_sentinel(monkeypatch, mistral_run):
    """Where the chain from the newest checkpoint fits the cap on-demand but not with the sentinel's room beside
    each job, the guard goes on on-demand without the room (no sentinel), not to the cap with the run unfinished
    (benchmarks/replay_bench.py --cap-x 2 found a run ended at $56.18 of a $214.54 cap that finished at $207.04)."""
    plan = handler_plan(monkeypatch, _with(mistral_run, budget={"max_usd": 300}))
    assert plan["estimate"]["spot_policy"]["policy"] == "probing_sentinel", plan["estimate"]["spot_policy"]["chosen"]
    p = Plan.from_json(plan)
    rate = p.usd_per_hour / 3600
    step = plan["planned_steps"] // 2
    costs, left = guard_rules.chain_costs(p), guard_rules.work_left(p, step)
    assert costs.sentinel_room_s > 0
    need = {room: smallest_cap(spent_usd=0.0, work_s=left, costs=dataclasses.replace(costs, sentinel_room_s=room),
                               first=False, spot=False) for room in (costs.sentinel_room_s, 0.0)}
    assert need[0.0] < need[costs.sentinel_room_s], need
    spent = p.max_usd - (need[0.0] + need[costs.sentinel_room_s]) / 2  # the cap pays the finish, not the room
    assert 0 < spent < p.max_usd, (spent, need)
    first = {"action": "wait", "job_name": plan["job_name"], "spot": True, "wait_seconds": 60, "spent_before_usd": 0,
             "interruptions_before": 0, "segment": 1, "max_runtime_seconds": plan["max_runtime_seconds"],
             "max_wait_seconds": plan["max_wait_seconds"], "hyperparameters": plan["hyperparameters"],
             "segments": [], "switch_requested": True, "switch_to_spot": False}
    ended = {"TrainingJobStatus": "Stopped", "SecondaryStatus": "Stopped", "BillableTimeInSeconds": spent / rate,
             "TrainingTimeInSeconds": spent / rate / p.spot_fraction, "CreationTime": T0}
    nxt = guard_rules.decide(p, Guard.from_json(first), ended, now=T0 + 36_000, checkpoint_step=step,
                             job_tags=OURS).to_json()
    assert nxt["action"] in ("segment", "continue") and nxt["spot"] is False, nxt.get("message") or nxt
    # its MaxRuntime takes all the cap leaves, so no sentinel fits beside it, and the cap holds
    on_demand = {"TrainingJobStatus": "InProgress", "SecondaryStatus": "Training", "CreationTime": T0,
                 "TrainingStartTime": T0, "StoppingCondition": {"MaxRuntimeInSeconds": nxt["max_runtime_seconds"]}}
    assert guard_rules.sentinel_limits(p, Guard.from_json(nxt), on_demand, 600.0) is None
    assert nxt["spent_before_usd"] + (nxt["max_runtime_seconds"] + 120) * rate <= p.max_usd + 1e-6, nxt
