"""benchmarks/calibration_bench.py's stretch diagnostic: the work it says a periodic-only job loses when a stretch
with capacity ends is what the executed run (spotrun/policy/execution.py) loses on a trace of that one stretch."""

import math
import random

import pytest

from benchmarks.calibration_bench import MODELS, lost_at_end, use_model
from benchmarks.policy_bench import setting
from spotrun.policy.availability import CHAIN, fitted_trace
from spotrun.policy.execution import execute
from spotrun.policy.traces import TraceSpec, generated_traces


@pytest.mark.parametrize("trained", [-300.0, 0.0, 10.0, 900.0, 1799.0, 1830.0, 1861.0, 3000.0, 5000.0])
def test_lost_at_end_is_what_the_execution_loses_on_one_stretch(trained):
    plan = setting(48)
    up = plan.startup_s + plan.restore_s + trained
    run = execute(plan, [(0.0, up), (math.inf, math.inf)], "maxwait_fallback", "periodic", horizon_s=up + 3600)
    assert run.tally.interruptions == 1
    # the first start restores nothing (no checkpoint yet): the execution trains restore_s longer than the diagnostic
    # assumes, which the diagnostic's later stretches (with a checkpoint) do not; compare on the same training time
    assert run.tally.lost_s == pytest.approx(lost_at_end(plan, up + plan.restore_s), abs=1e-6)


def test_window_figures_count_a_windows_interruptions_blips_waits_and_what_each_run_saw():
    """A 48 h window: 1 h with capacity, a 600 s blip, then capacity to the end; the notice-saving run meets the
    deadline having seen the two interruptions, the figures count 2 interruptions in 2 h of capacity before the
    last stretch, one stretch of two shorter than a start and a save, and waits of 1 h and 2 h."""
    from benchmarks.calibration_bench import window_figures
    plan = setting(48)
    h = 3600.0
    trace = [(0.0, h), (2 * h, 2 * h + 600), (4 * h + 600, math.inf)]
    f = window_figures(plan, trace)
    assert f["ends"] == 2 and f["stretches"] == 2 and f["short"] == 1
    assert f["waits"] == pytest.approx([h, 2 * h])
    assert f["notice"] and f["seen"] == 2
    assert f["up_h"] == pytest.approx(1 + 600 / h + 48 - 4 - 600 / h)
    # a window without enough capacity misses the deadline with both ways of saving; nothing seen is counted
    f = window_figures(plan, [(0.0, h), (40 * h, math.inf)])
    assert not f["notice"] and not f["periodic"] and f["seen"] is None


def test_recorded_waits_give_each_recordings_estimate_its_own_mean_wait_beside_its_rate():
    """`--waits recorded`: the estimate's traces for a recording wait its mean gap between windows (the waits after
    its interruptions, measured as its rate is); `--waits model`: the model's at the rate, as before."""
    from benchmarks.calibration_bench import recorded_rate, recorded_wait, trace_spec
    from spotrun.policy.traces import Recording
    h = 3600.0
    rec = Recording("r", [(0.0, 2 * h), (3 * h, 5 * h), (8 * h, 10 * h)], 10 * h)
    assert recorded_wait(rec) == pytest.approx(2 * h)  # waits of 1 h and 3 h
    plan = setting(48)
    assert trace_spec(plan, rec).mean_wait_s is None
    spec = trace_spec(plan, rec, "recorded")
    assert spec.mean_wait_s == pytest.approx(2 * h) and spec.interruptions_per_hour == recorded_rate(rec) == 0.5
    assert spec.fitted


def test_unavailable_counts_the_hours_without_capacity_and_the_longest_wait_in_the_first_d_hours():
    """Windows [1 h, 3 h) and [10 h, inf) over the first 12 h: 1 h + 7 h without capacity, the longest 7 h; a wait
    cut by the end counts up to it; a trace with no window in the first D is all waiting."""
    from benchmarks.calibration_bench import unavailable, weighted_quantile
    h = 3600.0
    assert unavailable([(h, 3 * h), (10 * h, math.inf)], 12 * h) == pytest.approx((8.0, 7.0))
    assert unavailable([(0.0, 2 * h), (20 * h, math.inf)], 12 * h) == pytest.approx((10.0, 10.0))
    assert unavailable([(30 * h, math.inf)], 12 * h) == pytest.approx((12.0, 12.0))
    # weights count as repeated values: 1 (weight 9) and 5 (weight 1): the P90 is 1, the P95 5
    assert weighted_quantile([(5.0, 1.0), (1.0, 9.0)], 0.9) == 1.0
    assert weighted_quantile([(5.0, 1.0), (1.0, 9.0)], 0.95) == 5.0


@pytest.mark.parametrize("name", ["bootstrap", "bootstrap-recorded-waits"])
def test_the_model_option_draws_the_estimates_traces_from_the_bootstrap(name):
    """`--model bootstrap` (and with recorded waits): the estimate's generated traces in this process are the
    bootstrap's own draws from the same seed, not the shipped model's; `regimes` puts the shipped model back."""
    spec = TraceSpec(0.4, horizon_s=200 * 3600.0, fitted=True)
    try:
        use_model(name)
        drawn = generated_traces(spec, 3, seed=1)
    finally:
        use_model("regimes")
    rng = random.Random(1)
    assert drawn == [fitted_trace(0.4, spec.horizon_s, rng, chain=MODELS[name]) for _ in range(3)]
    rng = random.Random(1)
    assert drawn != [fitted_trace(0.4, spec.horizon_s, rng, chain=CHAIN) for _ in range(3)]
    assert generated_traces(spec, 3, seed=1) != drawn  # the shipped model back


def _recording(name: str, rate: float, seed: int):
    """A recording of about 100 cycles drawn from `CHAIN` (the choose set's fit, without droughts or a level of waits
    per trace: three such recordings keep the power laws' fit away from 0) at `rate` (the last window closed an hour
    on)."""
    from spotrun.policy.traces import Recording
    trace = fitted_trace(rate, 100 / rate * 3600.0 * 1.5, random.Random(seed), chain=CHAIN)
    *closed, (t, _) = trace
    return Recording(name, [*closed, (t, t + 3600.0)], t + 3600.0)


def test_leave_one_out_fits_each_recordings_model_on_the_others_only(tmp_path, monkeypatch):
    """`--set loo`: recording k's estimate draws from the model fitted on every recording but k: the bootstrap's
    table holds exactly the other recordings' cycles; the fits file keeps them, so a second run refits nothing."""
    import benchmarks.calibration_bench as bench
    from benchmarks.fit_availability import spells
    recs = [_recording(f"r{k}", rate, k) for k, rate in enumerate((0.3, 0.6, 0.9))]
    paths = [tmp_path / f"z/r{k}.json" for k in range(3)]
    fits = tmp_path / "fits.pickle"
    models = bench.left_out_models(paths, recs, "bootstrap", fits)
    for k, model in enumerate(models):
        others = [spells(r) for i, r in enumerate(recs) if i != k]
        assert [(rate, tuple(flat)) for rate, flat in others] == list(model.spells)
        assert tuple(spells(recs[k])[1]) not in [flat for _, flat in model.spells]
    assert len({m.laws for m in models}) == 3  # each fold's power laws are its own fit

    def refit(*_):
        raise AssertionError("refitted: the fits file was not read")
    monkeypatch.setattr(bench, "fit_model", refit)
    assert bench.left_out_models(paths, recs, "bootstrap", fits) == models


def test_calibrate_draws_each_recordings_estimate_from_its_own_model(monkeypatch):
    """With `models`, the estimate for recording k is drawn from models[k] (the traces' generator in use when its
    estimate runs); without, from the model in use."""
    import benchmarks.calibration_bench as bench
    from spotrun.policy import traces as _traces
    recs = [_recording(f"r{k}", 0.4, 10 + k) for k in range(2)]
    used = []

    def estimated(plan, spec, n, todo, seed=0):
        used.append(_traces.fitted_trace.keywords["chain"])
        return {"on_demand": 1.0}
    monkeypatch.setattr(bench, "estimated", estimated)
    models = [MODELS["bootstrap"], MODELS["droughts"]]
    try:
        rows = bench.calibrate(recs, 48, 12, 5, ["on_demand"], models=models)
    finally:
        use_model("regimes")
    assert used == models and rows[0][0] == "on_demand"
    used.clear()
    bench.calibrate(recs, 48, 12, 5, ["on_demand"])
    assert used == [CHAIN, CHAIN]


@pytest.mark.parametrize(("argv", "said"), [
    (["--fits", "f.pickle"], "--fits keeps the left-out fits of --set loo: give --set loo, or drop --fits"),
    (["--set", "loo", "--cap-x", "1", "--bills", "10"],
     "--set loo gives the calibration's rows, --unavailable and --stretches only: drop --bills"),
])
def test_the_leave_one_out_options_refuse_what_they_do_not_do(tmp_path, monkeypatch, capsys, argv, said):
    import json
    import sys

    from benchmarks.calibration_bench import main
    trace = tmp_path / "availability/1-node/a/z.json"
    trace.parent.mkdir(parents=True)
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [1, 1, 0, 1] * 50}))
    monkeypatch.setattr(sys, "argv", ["calibration_bench.py", "--spot-traces", str(tmp_path), *argv])
    with pytest.raises(SystemExit) as stop:
        main()
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err, err
