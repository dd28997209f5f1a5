"""An on-demand run's warm pool is in its bill, its cap and its MaxRuntime (issue #26, what the user is told versus
what happens). SageMaker bills a warm pool's instances at on-demand rates for the keep-alive after a job ends until
a matching job takes them (the Developer Guide's "SageMaker Managed Warm Pools"). A new user's qwen2 with
compute.spot=false and 30 min of warm pool was accepted at $0.83 with MaxRuntime 0.3 h and told "the bill to
expect" $0.74: the keep-alive alone bills $1.16, and the guard, which counts it, would have stopped the job.

The figures here are checked against the catalog's rate and the run's minutes, not against the planner's own
sums: the keep-alive's price, the guard's rule for a job's MaxRuntime (the cap less the warm pool and the 120 s a
stop bills, at on-demand rates: docs/cap-and-segments.md), the cap a refusal names accepted when set."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from spotrun.planner.estimate import load_catalog

from .test_new_users_trial import _cli

ROOT = Path(__file__).parents[2]
WARM_MIN = 30
STOP_BILL_S = 120  # SageMaker bills a stopped job's stop; the guard's MaxRuntime rule leaves it (docs)


def _run(max_usd: float, warm_min: int = WARM_MIN) -> dict:
    run = json.loads((ROOT / "examples/runs/qwen2-0.5b-full-small.json").read_text())
    run["compute"].update(spot=False, warm_pool_minutes=warm_min)
    run["compute"].pop("on_demand_fallback", None)
    run["compute"].pop("deadline_hours", None)
    run["budget"]["max_usd"] = max_usd
    return run


def _estimate(tmp_path: Path, capsys, run: dict) -> tuple[int, dict]:
    return _cli(tmp_path, capsys, "estimate", run)


@pytest.fixture(scope="module")
def rate_per_s() -> float:
    run = _run(50.0)
    spec = load_catalog()["instances"][run["compute"]["instance_type"]]
    return spec["on_demand_usd_per_hour"] * run["compute"].get("instance_count", 1) / 3600


def test_the_bill_holds_the_keep_alive(tmp_path, capsys, rate_per_s):
    """The cost row, the simulated on_demand row and the cap to set hold the keep-alive; a warning says it buys
    nothing on a one-job run (before: $0.74 with or without it, and no word)."""
    rc, cold = _estimate(tmp_path, capsys, _run(50.0, warm_min=0))
    assert rc == 0
    rc, warm = _estimate(tmp_path, capsys, _run(50.0))
    assert rc == 0
    keep_alive = WARM_MIN * 60 * rate_per_s
    assert warm["cost_usd"]["on_demand"] == pytest.approx(cold["cost_usd"]["on_demand"] + keep_alive, abs=0.011)
    row = next(r for r in warm["spot_policy"]["policies"] if r["label"] == warm["spot_policy"]["chosen"])
    assert row["mean_usd"] == pytest.approx(warm["cost_usd"]["on_demand"], abs=0.011)
    assert warm["spot_policy"]["cap_to_set_usd"] >= warm["cost_usd"]["on_demand"]
    assert any("warm_pool_minutes=30" in w and "no later job takes the pool" in w for w in warm["warnings"])
    assert not any("warm_pool" in w for w in cold["warnings"])


@pytest.mark.parametrize("cap", [0.83, 1.50])
def test_a_cap_that_cannot_hold_the_keep_alive_is_refused(tmp_path, capsys, rate_per_s, cap):
    """Under the job's bill with its keep-alive the run is refused, and the cap it names is accepted, its first
    job's MaxRuntime inside the guard's rule with the warm pool (before: accepted at $0.83, MaxRuntime 1,164 s
    where the rule leaves it none)."""
    rc, refused = _estimate(tmp_path, capsys, _run(cap))
    assert rc != 0 and refused["error"] == "OverBudget" and refused["field"] == "budget.max_usd"
    named = float(re.search(r"the smallest cap whose chain finishes is \$([\d,.]+\d)", refused["message"])[1])
    assert named > cap
    rc, accepted = _estimate(tmp_path, capsys, _run(named))
    assert rc == 0
    room = named / rate_per_s - WARM_MIN * 60 - STOP_BILL_S
    assert 0 < accepted["max_runtime_seconds"] <= room
    assert accepted["spot_policy"]["cap_to_set_usd"] == named
    row = next(r for r in accepted["spot_policy"]["policies"] if r["label"] == accepted["spot_policy"]["chosen"])
    assert row["p_finished"] == 1.0 and row["p95_usd"] <= named
