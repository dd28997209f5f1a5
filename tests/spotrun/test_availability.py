"""The estimate's availability model (spotrun/policy/availability.py) and the command that fits it
(benchmarks/fit_availability.py): the rate it is given is the rate its traces have, a job is created at a random
moment of the process (not at a return of capacity), and the fit's quantiles and power law are the textbook ones."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from benchmarks.fit_availability import power_law, quantiles, stretches
from spotrun.policy.availability import DOWN, LEVELS, UP, mean_down_s, renewal_trace
from spotrun.policy.traces import INF, Recording, TraceSpec, generated_traces

H = 3600.0


def _available_at(trace: list, t: float) -> bool:
    return any(a <= t < b for a, b in trace)


@pytest.mark.parametrize("rate", [0.1, 1.4])
def test_fitted_traces_are_interrupted_at_the_rate_asked_for_per_hour_with_capacity(rate):
    """The interruption recorder's rate is interruptions per hour a job runs: the same count over the same hours
    of generated capacity, whatever the fitted shapes."""
    traces = generated_traces(TraceSpec(rate, horizon_s=2000 * H, fitted=True), 40, seed=3)
    ends = sum(len(t) - 1 for t in traces)
    up_hours = sum(b - a for t in traces for a, b in t if b < INF) / H
    assert ends / up_hours == pytest.approx(rate, rel=0.05)


def test_a_job_is_created_at_a_random_moment_not_when_capacity_returns():
    """Stationary start: the share of traces with capacity at creation equals the share a while later, and both
    equal the long-run share mean_up / (mean_up + mean_down) measured on the draws themselves (a start at the
    beginning of a window would give 100% at creation)."""
    rng = random.Random(11)
    traces = [renewal_trace(0.6, 200 * H, rng) for _ in range(2000)]
    ups = [b - a for t in traces for a, b in t[1:-1]]
    downs = [a2 - b for t in traces for (_, b), (a2, _) in zip(t[1:-1], t[2:-1], strict=False)]
    long_run = statistics.fmean(ups) / (statistics.fmean(ups) + statistics.fmean(downs))
    at_zero = sum(_available_at(t, 0.0) for t in traces) / len(traces)
    later = sum(_available_at(t, 100 * H) for t in traces) / len(traces)
    assert at_zero == pytest.approx(later, abs=0.04)
    assert at_zero == pytest.approx(long_run, abs=0.04)
    assert 0.2 < at_zero < 0.95  # neither always on nor always off at this rate


def test_waits_for_capacity_grow_with_the_rate_and_keep_the_fitted_shape():
    rng = random.Random(5)
    for rate in (0.1, 1.0, 5.0):
        downs = [a2 - b for _ in range(300) for (_, b), (a2, _) in
                 zip(*(lambda t: (t[:-1], t[1:]))(renewal_trace(rate, 400 * H, rng)), strict=False)]
        assert statistics.fmean(downs) == pytest.approx(mean_down_s(rate), rel=0.1)
    assert mean_down_s(0.1) < mean_down_s(1.0) < mean_down_s(5.0)
    # the shapes are sample means of 1; the tables (linear between quantiles) keep that within 10%, and a trace is
    # scaled by the table's own mean
    assert UP.mean == pytest.approx(1.0, rel=0.1) and DOWN.mean == pytest.approx(1.0, rel=0.1)
    assert renewal_trace(0.0, 100 * H, rng) == [(0.0, INF)]


def test_the_fits_quantiles_and_power_law_are_the_textbook_ones():
    rng = random.Random(2)
    xs = [rng.expovariate(1.0) for _ in range(501)]
    inclusive = statistics.quantiles(xs, n=50, method="inclusive")  # the stdlib's, at 1/50 .. 49/50
    assert quantiles(xs, LEVELS)[1:50] == pytest.approx(inclusive)
    assert quantiles(xs, LEVELS)[0] == min(xs) and quantiles(xs, LEVELS)[-1] == max(xs)
    c, beta = power_law([0.1, 0.5, 2.0], [3000 * r ** 0.4 for r in (0.1, 0.5, 2.0)])
    assert (c, beta) == (pytest.approx(3000), pytest.approx(0.4))


def test_the_fit_reads_a_recordings_stretches_and_skips_a_window_open_at_its_end():
    rec = Recording("r", [(0.0, 3600.0), (5400.0, 9000.0), (12600.0, 14400.0)], 14400.0)  # ends with capacity
    rate, mean_down, ups, downs = stretches(rec)
    assert rate == pytest.approx(3 / 2.5)  # 3 windows in 2.5 h with capacity
    assert mean_down == pytest.approx(2700.0)
    assert len(ups) == 2 and ups == pytest.approx([1.2, 1.2])  # the window open at the end was not interrupted
    assert downs == pytest.approx([1800 / 2700, 3600 / 2700])
    assert math.isfinite(sum(downs))
