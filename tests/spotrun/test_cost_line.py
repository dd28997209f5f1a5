"""The estimate's cost row names the chosen policy's simulated bill; a mean above its P95 (a heavy tail: a few
traces wait long or miss the deadline) is said to be one, so it does not read as an error."""

from __future__ import annotations

from types import SimpleNamespace

from spotrun.planner.outputs import _chosen_cost_text


def _section(mean: float, p95: float) -> SimpleNamespace:
    rows = [{"label": "maxwait_fallback (notice)", "mean_usd": mean, "p95_usd": p95, "p_finished": 1.0},
            {"label": "on_demand", "mean_usd": 1.0, "p95_usd": 0.5, "p_finished": 1.0}]  # not chosen: its tail is
    # not the run's (every row as the estimate carries it: `p_finished`, the share of the runs that finish)
    return SimpleNamespace(chosen="maxwait_fallback (notice)", policies=rows)


def test_a_mean_above_the_p95_is_said_to_be_the_tail():
    text = _chosen_cost_text(_section(0.0571, 0.0562))
    assert "mean $0.057, P95 $0.056 (the mean above the P95: the costliest 5% of the traces" in text, text


def test_a_mean_at_or_below_the_p95_says_nothing_more():
    for mean, p95 in ((0.05, 0.06), (0.06, 0.06)):
        text = _chosen_cost_text(_section(mean, p95))
        assert "mean above" not in text and text.endswith(f"P95 ${p95:.2f}"), text


def test_a_mean_above_the_p95_by_less_than_a_printed_cent_says_nothing_more():
    """A new user: 'mean $0.26, P95 $0.26 (the mean above the P95: ... a long wait or a missed deadline ...)' on a
    run without a deadline (0.2624 against 0.2592): the line reads as it is printed."""
    text = _chosen_cost_text(_section(0.2624, 0.2592))
    assert text.endswith("mean $0.26, P95 $0.26"), text


def test_a_missed_deadline_is_named_only_where_the_run_has_one():
    text = _chosen_cost_text(_section(0.30, 0.26))
    assert "a long wait, pull it up" in text and "deadline" not in text, text
    section = _section(0.30, 0.26)
    section.policies[0]["p_deadline"] = 0.97
    assert "a long wait or a missed deadline, pull it up" in _chosen_cost_text(section)
