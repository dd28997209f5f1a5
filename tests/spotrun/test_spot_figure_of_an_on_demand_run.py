"""Issue #26: a compute.spot=false run's cost row names what its spot figure is the bill of. The figure is the same
run's on managed spot at this cap, which can be a chain of jobs (each job's MaxRuntime is bounded at on-demand
rates): a new user's 70B LoRA on-demand at $2,968.92 read 'spot about $1,054.43 (... one job with the expected
interruptions ...)', the bill of a chain of 2 jobs (one job, at $4,000, is $1,052.46)."""

from __future__ import annotations

from pathlib import Path

from .test_speed_margin_at_the_cap_to_set import _estimate as _mistral


def _estimate(tmp_path: Path, capsys, *, spot: bool, cap: float, fmt: str = "json"):
    """The mistral-7b LoRA example at `cap`: its JSON, or its text's cost row."""
    out = _mistral(tmp_path, capsys, spot=spot, cap=cap, fmt=fmt)
    return out if fmt == "json" else next(x for x in out.splitlines() if x.startswith("cost "))


def test_a_spot_figure_that_is_a_chain_is_labelled_one(tmp_path, capsys):
    """mistral-7b LoRA on-demand at $31.70: the spot run at that cap is a chain of 2 jobs, the figure is its bill."""
    spot_run = _estimate(tmp_path, capsys, spot=True, cap=31.70)  # the other party: the same run on spot
    jobs = spot_run["segments"]["segments"]
    assert jobs > 1, spot_run["segments"]  # the case
    doc = _estimate(tmp_path, capsys, spot=False, cap=31.70)
    assert doc["cost_usd"]["spot"] == spot_run["cost_usd"]["spot"] and doc["spot_figure_jobs"] == jobs, doc
    line = _estimate(tmp_path, capsys, spot=False, cap=31.70, fmt="text")
    figure = f"spot about ${doc['cost_usd']['spot']:,.2f} (the same layout on managed spot: a chain of {jobs} jobs"
    assert figure in line and "one job with the expected interruptions" not in line, line


def test_a_spot_figure_of_one_job_says_one_job(tmp_path, capsys):
    doc = _estimate(tmp_path, capsys, spot=False, cap=200.0)
    assert doc["spot_figure_jobs"] == 1, doc
    line = _estimate(tmp_path, capsys, spot=False, cap=200.0, fmt="text")
    assert "(the same layout on managed spot: one job with the expected interruptions" in line, line


def test_a_spot_runs_json_has_no_spot_figure_jobs(tmp_path, capsys):
    assert "spot_figure_jobs" not in _estimate(tmp_path, capsys, spot=True, cap=200.0)
