"""The estimate's simulator against the state machine it predicts: trace windows replayed through the rendered
state machine with the real handlers (tests/infra/replay.py), window by window against the simulator's
prediction for the same window: the finish time within one poll of the guard's, the cost within 1%."""

from __future__ import annotations

import pytest

from spotrun.policy.traces import TraceSpec, generated_traces
from tests.infra.replay import Window, replay_windows

pytestmark = pytest.mark.slow

H = 3600.0
POLICIES = ("uniform_progress", "deadline_greedy", "slack_reserve_10", "maxwait_fallback")


def _windows() -> list[Window]:
    # Interruptions every ~2 h of capacity, waits of ~1 h, and droughts of 3-8 h twice a day: the policies'
    # rules all fire (a run of ~10 h with a 14 h deadline). Each window is ~1 min of moto here: 6 of them.
    spec = TraceSpec(interruptions_per_hour=0.5, horizon_s=60 * H, restart_wait_s=3600.0, burst_p=0.3,
                     droughts_per_day=2.0, drought_hours=(3.0, 8.0))
    traces = generated_traces(spec, 3, seed=7)
    return [Window(p, t, f"{p}#{k}") for k, t in enumerate(traces) for p in POLICIES[k % 2::2]]


@pytest.fixture(scope="module")
def agreements(synth):
    return replay_windows(synth, _windows())


def test_each_replayed_window_finishes_within_one_poll_and_costs_within_1pct_of_the_prediction(agreements):
    for a in agreements:
        print(a)
    bad = [a for a in agreements if not (a.status == "SUCCEEDED" and a.time_ok and a.cost_ok)]
    assert not bad, bad
    # Not only the easy windows: some runs were interrupted or changed market.
    assert any(a.jobs > 1 for a in agreements), agreements


# Spot for the first hour, then none until 19 h: with a 24 h deadline probing_sentinel waits on spot, moves to
# on-demand, keeps a sentinel after an hour there, and returns to spot at the first poll that sees it with
# instances (spotrun/policy/execution.py predicts the same run: tests/spotrun/test_sentinel.py).
SENTINEL_TRACE = [(0.0, 1 * H), (19 * H, 100 * H)]


def test_a_window_where_the_sentinel_fires_agrees_with_the_prediction(synth):
    (a,) = replay_windows(synth, [Window("probing_sentinel", SENTINEL_TRACE, "sentinel fires")], deadline_hours=24)
    print(a)
    assert a.status == "SUCCEEDED" and a.time_ok and a.cost_ok, a
    # one sentinel, created, seen with instances and stopped by the guard, as predicted; then spot to the end
    assert a.sentinels == a.predicted_sentinels == 1 and a.jobs == a.predicted_jobs == 3, a
    sentinel = [end for name, end in a.ends if "-sn" in name]
    assert sentinel == ["Stopped"], a.ends
    assert a.replay_usd <= a.cap_usd


def test_when_every_lambda_and_stop_fails_beside_a_sentinel_the_jobs_limits_hold_the_cap(synth):
    """From the poll that creates the sentinel, every Lambda and every StopTrainingJob fails: the on-demand job
    and the sentinel (which gets capacity at 19 h) run until SageMaker ends them at their MaxRuntime, and the
    run's whole bill, the sentinel's included, stays under the cap."""
    (a,) = replay_windows(synth, [Window("probing_sentinel", SENTINEL_TRACE, "all down")], deadline_hours=24,
                          gone_after_sentinel=True)
    print(a)
    assert a.status == "FAILED" and a.sentinels == 1, a
    assert dict(a.ends)[next(n for n, _ in a.ends if "-sn" in n)] == "MaxRuntimeExceeded", a.ends
    assert a.replay_usd <= a.cap_usd, a
