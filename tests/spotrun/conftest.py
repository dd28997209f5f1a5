"""Fixtures shared by tests/spotrun."""
import pytest

from spotrun.policy import traces


@pytest.fixture(autouse=True)
def _the_estimates_model_after_each_test(monkeypatch):
    """benchmarks/calibration_bench.py's `use_chain` swaps the model the estimate's traces are drawn from for its
    process (`spotrun.policy.traces.fitted_trace`); a test that runs the bench in pytest's process would leave every
    later test drawing from the bench's model (CI of 650cc23: test_estimate_chain drew CHAIN's traces after
    test_calibration_residuals ran the bench). Each test gets the module's own function back at its end."""
    monkeypatch.setattr(traces, "fitted_trace", traces.fitted_trace)
