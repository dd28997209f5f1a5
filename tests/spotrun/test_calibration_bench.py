"""benchmarks/calibration_bench.py's stretch diagnostic: the work it says a periodic-only job loses when a stretch
with capacity ends is what the executed run (spotrun/policy/execution.py) loses on a trace of that one stretch."""

import math

import pytest

from benchmarks.calibration_bench import lost_at_end
from benchmarks.policy_bench import setting
from spotrun.policy.execution import execute


@pytest.mark.parametrize("trained", [-300.0, 0.0, 10.0, 900.0, 1799.0, 1830.0, 1861.0, 3000.0, 5000.0])
def test_lost_at_end_is_what_the_execution_loses_on_one_stretch(trained):
    plan = setting(48)
    up = plan.startup_s + plan.restore_s + trained
    run = execute(plan, [(0.0, up), (math.inf, math.inf)], "maxwait_fallback", "periodic", horizon_s=up + 3600)
    assert run.tally.interruptions == 1
    # the first start restores nothing (no checkpoint yet): the execution trains restore_s longer than the diagnostic
    # assumes, which the diagnostic's later stretches (with a checkpoint) do not; compare on the same training time
    assert run.tally.lost_s == pytest.approx(lost_at_end(plan, up + plan.restore_s), abs=1e-6)
